/*
 * test-plan-cli.c - `moe-prep plan --apply` and moe-run's use of the plan, on
 * the trained demo model quantized to q8_0 and q2_k experts and profiled, with
 * a simulated hardware table (no measuring, so the plans are deterministic):
 *   - plan --json --apply: the chosen plan's keys are in the bundle's tuning
 *     (moe_tuning_read), equal to the JSON's chosen row; without --eval-text
 *     the chosen plan is exact;
 *   - moe-run with no engine options runs the plan (the store's capacities
 *     and policy of the chosen row); an option overrides one setting and
 *     keeps the rest; --no-plan ignores it;
 *   - a plan with dynamic precision and big-little written through
 *     moe_tuning_set_plan turns both on in moe-run; --little-k 0 turns
 *     big-little off again;
 *   - bad input: no --mem, an unknown option, a table without the model's
 *     entry with --no-measure.
 * argv: moe-prep moe-run MODEL_DIR WORK_DIR.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "moe-bundle.h"
#include "moe-hw.h"
#include "moe-mmap.h"
#include "moe-quant.h"
#include "moe-test.h"
#include "moe-tuning.h"

static const char *prep, *moe_run, *model_dir, *work;
static char bundle[1200], table[1200], profile[1200];

static cJSON *read_json(const char *name) {
    char path[1300], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", work, name);
    cJSON *j = moe_read_file(path, 1 << 24, &text, &len) == MOE_OK ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static double num(const cJSON *o, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsString(x) ? x->valuestring : "";
}

/* sim_table: a hardware table for the bundle: slow storage, so the cache matters. */
static int sim_table(void) {
    struct moe_hw hw;
    memset(&hw, 0, sizeof hw);
    struct moe_hw_storage s;
    struct moe_hw_model m;
    memset(&s, 0, sizeof s);
    memset(&m, 0, sizeof m);
    if (moe_hw_storage_key(bundle, s.device, sizeof s.device) || moe_hw_model_key(bundle, m.key, sizeof m.key)) return 0;
    s.lat_s = 2e-4, s.bw = 2e8, s.bw_par = 2.4e8, s.n_par = 2, s.direct = 1;
    m.threads = 2, m.k = 2, m.step_s = 1e-3, m.fixed_s = 2e-4, m.store_step_s = 5e-6, m.n_prec = 2;
    snprintf(m.prec[0].precision, sizeof m.prec[0].precision, "q8_0");
    snprintf(m.prec[1].precision, sizeof m.prec[1].precision, "q2_k");
    m.prec[0].a_s = 6e-5, m.prec[1].a_s = 5e-5;
    m.prec[0].bytes = m.prec[1].bytes = 1;
    hw.mem_bw = 1e10;
    moe_hw_put_storage(&hw, &s);
    moe_hw_put_model(&hw, &m);
    return moe_hw_save(table, &hw) == MOE_OK;
}

/* read_plan: the bundle's plan.* keys. */
static int read_plan(struct moe_tuning_plan *out) {
    struct moe_bundle *b = NULL;
    struct moe_tuning t;
    int ok = moe_bundle_open(bundle, &b) == MOE_OK && moe_tuning_read(moe_bundle_tuning(b), 4, 8, &t) == MOE_OK &&
             t.has_plan;
    if (ok) *out = t.plan;
    moe_bundle_free(b);
    return ok;
}

static void apply_round_trip(void) {
    const long long mem = 26ll << 20;
    CHECK(moe_test_sh("'%s' plan '%s' --profile '%s' --mem %lld --hw '%s' -t 2 --no-measure --json --apply >'%s/plan.json' "
             "2>'%s/plan.err'", prep, bundle, profile, mem, table, work, work) == 0,
          "plan --apply");
    cJSON *j = read_json("plan.json");
    const int chosen = (int)num(j, "chosen", NULL);
    const cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "plans"), chosen);
    CHECK(row && chosen >= 0, "a plan was chosen (%d)", chosen);
    struct moe_tuning_plan p;
    memset(&p, 0, sizeof p);
    CHECK(read_plan(&p), "the bundle's tuning holds a plan");
    CHECK(row && p.expert_mem == (int64_t)num(row, "expert_mem", NULL) && p.mem == mem &&
              !strcmp(p.high, str(row, "high", NULL)) && !strcmp(p.policy, str(row, "policy", NULL)) &&
              p.prefetch_paths == (int)num(row, "prefetch_paths", NULL) && p.threads == 2 &&
              fabs(p.tok_s - num(row, "tok_s", NULL)) <= 1e-5 * p.tok_s,
          "the tuning's plan is the chosen row: %lld bytes, %s, %s", (long long)p.expert_mem, p.high, p.policy);
    const cJSON *exact = cJSON_GetObjectItemCaseSensitive(row, "neutral");
    CHECK(cJSON_IsTrue(exact) && p.dynamic == 0 && p.little_k == 0 && p.quality == 0,
          "without --eval-text the chosen plan is exact");
    /* moe-run starts from it */
    const char *run = "-p 'Once upon a time' -n 8 --ignore-eos -t 2";
    CHECK(moe_test_sh("'%s' -m '%s' %s --stats-json '%s/a.json' >/dev/null 2>'%s/a.err'", moe_run, bundle, run, work, work) == 0,
          "moe-run with the plan");
    cJSON *a = read_json("a.json");
    CHECK(a && row && num(a, "store", "high_cap") == num(row, "high_cap", NULL) &&
              num(a, "store", "low_cap") == num(row, "low_cap", NULL) &&
              !strcmp(str(a, "store", "policy"), str(row, "policy", NULL)),
          "moe-run ran the plan: %g high copies (%g planned), %s", num(a, "store", "high_cap"),
          num(row, "high_cap", NULL), str(a, "store", "policy"));
    const char *other = !strcmp(str(row, "policy", NULL), "lru") ? "lfu-seq" : "lru";
    CHECK(moe_test_sh("'%s' -m '%s' %s --policy %s --stats-json '%s/b.json' >/dev/null 2>&1", moe_run, bundle, run, other,
             work) == 0,
          "moe-run --policy %s", other);
    cJSON *b = read_json("b.json");
    CHECK(b && a && !strcmp(str(b, "store", "policy"), other) &&
              num(b, "store", "high_cap") == num(a, "store", "high_cap"),
          "an option overrides its setting, the others stay (%s, %g copies)", str(b, "store", "policy"),
          num(b, "store", "high_cap"));
    CHECK(moe_test_sh("'%s' -m '%s' %s --no-plan --stats-json '%s/c.json' >/dev/null 2>&1", moe_run, bundle, run, work) == 0,
          "moe-run --no-plan");
    cJSON *c = read_json("c.json");
    CHECK(c && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(c, "store")), "--no-plan: every expert resident");
    /* every expert resident on the CPU: moe-run repacks the q8_0 matrices where
     * the kernels have a layout for them (AVX-512 VNNI), and --no-repack not */
    const int packs = moe_repack_type(MOE_QTYPE_Q8_0, 256, 256) != MOE_QTYPE_Q8_0;
    CHECK(c && (packs ? num(c, "repacked_bytes", NULL) > 0 : num(c, "repacked_bytes", NULL) == 0),
          "repacked_bytes %g (a layout for q8_0 here: %d)", c ? num(c, "repacked_bytes", NULL) : -1.0, packs);
    CHECK(moe_test_sh("'%s' -m '%s' %s --no-plan --no-repack --stats-json '%s/d.json' >/dev/null 2>&1", moe_run, bundle,
                      run, work) == 0,
          "moe-run --no-repack");
    cJSON *d = read_json("d.json");
    CHECK(d && num(d, "repacked_bytes", NULL) == 0, "--no-repack: nothing repacked");
    cJSON_Delete(d);
    cJSON_Delete(a);
    cJSON_Delete(b);
    cJSON_Delete(c);
    cJSON_Delete(j);
}

/* written_plan: a plan with dynamic precision and big-little, written with
 * the library, turns both on in moe-run. */
static void written_plan(void) {
    struct moe_tuning_plan p;
    memset(&p, 0, sizeof p);
    p.mem = 32 << 20, p.expert_mem = 3 << 20;
    snprintf(p.high, sizeof p.high, "q8_0");
    snprintf(p.low, sizeof p.low, "q2_k");
    snprintf(p.policy, sizeof p.policy, "lru");
    p.dynamic = 1, p.low_share = 0.25, p.t1 = 0.5, p.t2 = 0.9, p.little_k = 1, p.gamma = 0.3, p.threads = 2;
    p.tok_s = 100, p.bytes_per_token = 1000, p.quality = NAN;
    struct moe_bundle *b = NULL;
    struct moe_bundle_kv *kv = NULL;
    int ok = moe_bundle_open(bundle, &b) == MOE_OK && moe_bundle_kv_new(&kv) == MOE_OK &&
             moe_bundle_kv_copy(kv, moe_bundle_tuning(b)) == MOE_OK;
    moe_bundle_free(b);
    ok = ok && moe_tuning_set_plan(kv, &p) == MOE_OK && moe_bundle_replace_tuning(bundle, kv) == MOE_OK;
    moe_bundle_kv_free(kv);
    CHECK(ok, "write a plan");
    struct moe_tuning_plan q;
    CHECK(read_plan(&q) && q.dynamic == 1 && !strcmp(q.low, "q2_k") && q.little_k == 1 && q.gamma == 0.3 &&
              isnan(q.quality) && q.t1 == 0.5,
          "it reads back");
    const char *run = "-p 'Once upon a time' -n 8 --ignore-eos -t 2";
    CHECK(moe_test_sh("'%s' -m '%s' %s --stats-json '%s/d.json' >/dev/null 2>&1", moe_run, bundle, run, work) == 0, "moe-run");
    cJSON *d = read_json("d.json");
    CHECK(d && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(d, "store"), "dynamic")) &&
              num(d, "store", "t1") == 0.5 && num(d, "big_little", "gamma") == 0.3 &&
              num(d, "big_little", "little_k") == 1,
          "the plan's dynamic precision and big-little are on");
    CHECK(moe_test_sh("'%s' -m '%s' %s --little-k 0 --stats-json '%s/e.json' >/dev/null 2>&1", moe_run, bundle, run, work) == 0,
          "moe-run --little-k 0");
    cJSON *e = read_json("e.json");
    CHECK(e && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "big_little")) &&
              cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "store"), "dynamic")),
          "--little-k 0 turns big-little off, the rest of the plan stays");
    cJSON_Delete(d);
    cJSON_Delete(e);
}

static void bad_input(void) {
    CHECK(moe_test_sh("'%s' plan '%s' --profile '%s' --hw '%s' >/dev/null 2>&1", prep, bundle, profile, table) == 2, "no --mem");
    CHECK(moe_test_sh("'%s' plan '%s' --profile '%s' --mem 1G --frobnicate >/dev/null 2>&1", prep, bundle, profile) == 2,
          "unknown option");
    CHECK(moe_test_sh("'%s' plan '%s' --profile '%s' --mem 1G --quality-budget 1%% >/dev/null 2>&1", prep, bundle, profile) == 2,
          "--quality-budget without --eval-text");
    CHECK(moe_test_sh("'%s' plan '%s' --profile '%s' --mem 1G --hw '%s' -t 3 --no-measure >/dev/null 2>&1", prep, bundle,
             profile, table) == 1,
          "no entry for 3 threads with --no-measure");
    CHECK(moe_test_sh("'%s' plan '%s' --profile '%s' --mem 1M --hw '%s' -t 2 --no-measure >/dev/null 2>&1", prep, bundle,
             profile, table) == 1,
          "1 MiB holds no plan");
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: test-plan-cli moe-prep moe-run MODEL_DIR WORK_DIR\n");
        return 2;
    }
    prep = argv[1], moe_run = argv[2], model_dir = argv[3], work = argv[4];
    snprintf(bundle, sizeof bundle, "%s/tiny.moeb", work);
    snprintf(table, sizeof table, "%s/hw.json", work);
    snprintf(profile, sizeof profile, "%s/p.h5", work);
    if (moe_test_sh("rm -rf '%s' && mkdir -p '%s'", work, work) != 0 ||
        moe_test_sh("'%s' quantize '%s' -o '%s' --experts q8_0,q2_k --dense q8_0 >/dev/null 2>&1", prep, model_dir, bundle) ||
        moe_test_sh("'%s' profile '%s' --dataset '%s/heldout/python_docs.txt' -o '%s' --ctx 128 --max-tokens 4096 -t 2 "
           ">/dev/null 2>&1", prep, bundle, model_dir, profile)) {
        fprintf(stderr, "test-plan-cli: cannot quantize and profile %s into %s\n", model_dir, work);
        return 1;
    }
    moe_log_set_level(MOE_LOG_ERROR);
    CHECK(sim_table(), "simulated hardware table");
    apply_round_trip();
    written_plan();
    bad_input();
    printf("test-plan-cli: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    if (!fails) moe_test_sh("rm -rf '%s'", work);
    return fails != 0;
}

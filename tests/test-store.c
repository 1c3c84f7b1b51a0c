/*
 * test-store.c - the expert store (runtime/offload/store.c) on the trained demo model
 * quantized to q8_0 and q2_k experts:
 *   - a budget that holds every expert, and a budget of a few experts with
 *     dynamic precision off, give logits bit-identical to the run without a
 *     budget (every expert resident, as mapped), under every online policy;
 *   - the same routing replayed through fit-cache's simulator
 *     (moe_cache_simulate, same capacities, policy, thresholds, prompt batch,
 *     prefetch and warm start off) gives the store's hit / miss / skip counts
 *     per precision exactly, with dynamic precision and skipping on;
 *   - a budget too small for one layer's top-k is refused, naming the minimum;
 *   - `moe-prep eval` through the engine: with dynamic precision off the
 *     engine's PPL equals the all-resident reference's (KL 0) while the store
 *     loads experts; with it on, one-token steps use low copies and the KL
 *     becomes positive; engine options on a checkpoint directory are refused;
 *   - peak memory of `moe-run --expert-mem` on an inflated model whose experts
 *     are more than 4x the budget stays within non-expert weights + budget +
 *     the store's overhead + a fixed 32 MiB (process, KV cache, scratch).
 * argv: moe-prep moe-run inflate-moe MODEL_DIR WORK_DIR.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "cache-sim.h"
#include "moe-bundle.h"
#include "moe-mmap.h"
#include "moe-options.h"
#include "moe-session.h"
#include "moe-test.h"

static const char *prep, *moe_run, *inflate, *model_dir, *work;

#define NP 12 /* prompt tokens */
#define ND 10 /* decode tokens */

/* run: two sequences (prompt batch + one-token steps) through a session with
 * store params sp (NULL: no budget); all logits into out [2 x (NP+ND) x V]. */
static int run(const char *bundle, const struct moe_store_params *sp, float *out, int record,
               struct moe_store_stats *stats, struct moe_session_trace *trace, struct moe_session **keep,
               struct moe_model **keep_m) {
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = "q8_0";
    mp.lazy_experts = sp != NULL;
    struct moe_model *m = NULL;
    struct moe_session *s = NULL;
    if (moe_model_load(bundle, &mp, &m) != MOE_OK) return 0;
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = 2;
    p.store = sp;
    p.record_trace = record;
    int ok = moe_session_create(m, &p, &s) == MOE_OK;
    const size_t V = (size_t)m->cfg.n_vocab;
    for (int q = 0; ok && q < 2; q++) {
        int32_t ids[NP + ND];
        for (int i = 0; i < NP + ND; i++) ids[i] = (int32_t)((37 * i + 101 * q + 5) % m->cfg.n_vocab);
        moe_session_reset(s);
        float *o = out + (size_t)q * (NP + ND) * V;
        ok = moe_session_forward(s, ids, NP, o, 1) == MOE_OK;
        for (int i = NP; ok && i < NP + ND; i++) ok = moe_session_forward(s, ids + i, 1, o + (size_t)i * V, 0) == MOE_OK;
    }
    if (ok && stats && moe_session_store(s)) moe_store_get_stats(moe_session_store(s), stats);
    if (ok && trace) ok = moe_session_trace(s, trace) == MOE_OK;
    if (keep && ok) {
        *keep = s, *keep_m = m;
        return 1;
    }
    moe_session_free(s);
    moe_model_free(m);
    return ok;
}

/* identical: the runs with a budget compute exactly what the run without one does. */
static void identical(const char *bundle) {
    struct moe_model *m = NULL;
    CHECK(moe_model_load(bundle, NULL, &m) == MOE_OK, "load %s", bundle);
    if (!m) return;
    const size_t V = (size_t)m->cfg.n_vocab, n = 2 * (NP + ND) * V;
    moe_model_free(m);
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    CHECK(ref && got && run(bundle, NULL, ref, 0, NULL, NULL, NULL, NULL), "reference run");
    static const char *const pols[] = {"lru", "lfu-seq", "lfu-global", "lhu", "fld", "edgemoe", "hobbit"};
    for (int i = 0; ref && got && i < (int)(sizeof pols / sizeof *pols); i++) {
        struct moe_store_params sp = moe_store_default_params();
        char err[128];
        CHECK(moe_store_parse_option(&sp, "--policy", pols[i], err, sizeof err) == MOE_OK, "%s", err);
        sp.dynamic = 0;
        sp.high_cap = i == 0 ? 32 : 5; /* everything, then a few experts */
        sp.low_cap = 0;
        struct moe_store_stats st;
        memset(&st, 0, sizeof st);
        CHECK(run(bundle, &sp, got, 0, &st, NULL, NULL, NULL), "%s: run with a budget", pols[i]);
        CHECK(!memcmp(ref, got, n * sizeof *ref), "%s, %d copies: logits differ from the run without a budget", pols[i],
              sp.high_cap);
        CHECK(st.accesses > 0 && st.hits_high + st.misses_high == st.accesses, "%s: counts %lld", pols[i],
              (long long)st.accesses);
        if (i > 0) CHECK(st.misses_high > 0 && st.peak_resident_bytes <= 5 * st.high_copy_bytes + 2 * st.high_copy_bytes,
                         "%s: a 5-copy cache misses and stays small (peak %lld)", pols[i], (long long)st.peak_resident_bytes);
    }
    free(ref);
    free(got);
}

/* same_as_simulator: the store's counts equal fit-cache's replay of its own routing. */
static void same_as_simulator(const char *bundle) {
    static const enum moe_cache_policy pols[] = {MOE_CACHE_LRU, MOE_CACHE_LFU_SEQ, MOE_CACHE_LFU_GLOBAL, MOE_CACHE_LHU,
                                                 MOE_CACHE_FLD, MOE_CACHE_HOBBIT};
    float *logits = malloc(sizeof(float) * 2 * (NP + ND) * 4096);
    for (int i = 0; logits && i < (int)(sizeof pols / sizeof *pols); i++) {
        struct moe_store_params sp = moe_store_default_params();
        sp.policy = (int)pols[i];
        sp.high_cap = 6, sp.low_cap = 4;
        sp.dynamic = 1, sp.skip = 1, sp.t1 = 0.55, sp.t2 = 0.8;
        sp.warm = 0, sp.prefetch_layers = 0, sp.prefetch_paths = 0;
        sp.low = "q2_k";
        struct moe_store_stats st;
        struct moe_session_trace tr;
        struct moe_session *s = NULL;
        struct moe_model *m = NULL;
        if (!run(bundle, &sp, logits, 1, &st, &tr, &s, &m)) {
            CHECK(0, "%s: run", moe_cache_policy_name(pols[i]));
            continue;
        }
        const size_t n = (size_t)tr.n_tokens * (size_t)tr.n_layers * (size_t)tr.k;
        int16_t *ex = malloc(sizeof *ex * n);
        int64_t ss[3] = {tr.seq_start[0], tr.seq_start[1], tr.seq_start[2]};
        for (size_t j = 0; ex && j < n; j++) ex[j] = (int16_t)tr.experts[j];
        struct moe_trace t = {tr.n_layers, m->cfg.n_expert, tr.k, tr.n_seq, ss, ex, tr.weights};
        CHECK(tr.n_seq == 2 && tr.n_tokens == 2 * (NP + ND), "trace: %d sequences, %lld tokens", tr.n_seq,
              (long long)tr.n_tokens);
        struct moe_cache_trace_params tp = moe_cache_trace_default_params();
        tp.prompt_len = NP, tp.t1 = sp.t1, tp.t2 = sp.t2;
        struct moe_cache_trace *ct = NULL;
        struct moe_cache_stats cs;
        struct moe_cache_config cc = moe_cache_default_config();
        cc.high_cap = 6, cc.low_cap = 4;
        CHECK(ex && moe_cache_trace_new(&t, NULL, 0, &tp, &ct) == MOE_OK &&
                  moe_cache_simulate(ct, pols[i], &cc, &cs) == MOE_OK,
              "%s: replay", moe_cache_policy_name(pols[i]));
        if (ct)
            CHECK(cs.accesses == st.accesses && cs.hits_high == st.hits_high && cs.hits_low == st.hits_low &&
                      cs.misses_high == st.misses_high && cs.misses_low == st.misses_low && cs.skips == st.skips,
                  "%s: simulator %lld accesses, hits %lld/%lld, misses %lld/%lld, skips %lld; store %lld, %lld/%lld, "
                  "%lld/%lld, %lld",
                  moe_cache_policy_name(pols[i]), (long long)cs.accesses, (long long)cs.hits_high,
                  (long long)cs.hits_low, (long long)cs.misses_high, (long long)cs.misses_low, (long long)cs.skips,
                  (long long)st.accesses, (long long)st.hits_high, (long long)st.hits_low, (long long)st.misses_high,
                  (long long)st.misses_low, (long long)st.skips);
        CHECK(st.misses_low > 0 && st.hits_high > 0, "%s: both precisions were loaded", moe_cache_policy_name(pols[i]));
        moe_cache_trace_free(ct);
        free(ex);
        moe_session_free(s);
        moe_model_free(m);
    }
    free(logits);
}

/* prefetching: on a profiled bundle (path dictionary and placement in the
 * tuning) both prefetchers start reads and some serve demand accesses, and
 * prefetching never changes what is computed (dynamic precision off). */
static void prefetching(const char *bundle, const char *text) {
    CHECK(moe_test_sh("'%s' profile '%s' --dataset '%s' -o '%s/p.h5' --ctx 128 --max-tokens 4096 >/dev/null 2>&1", prep, bundle,
             text, work) == 0,
          "profile the bundle (writes the tuning)");
    struct moe_model *m = NULL;
    CHECK(moe_model_load(bundle, NULL, &m) == MOE_OK, "load");
    if (!m) return;
    const size_t n = 2 * (NP + ND) * (size_t)m->cfg.n_vocab;
    moe_model_free(m);
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    CHECK(ref && got && run(bundle, NULL, ref, 0, NULL, NULL, NULL, NULL), "reference run");
    for (int mode = 0; ref && got && mode < 2; mode++) {
        struct moe_store_params sp = moe_store_default_params();
        sp.dynamic = 0, sp.high_cap = 8, sp.low_cap = 0, sp.policy = MOE_CACHE_LRU;
        sp.prefetch_layers = mode == 0 ? 1 : 0, sp.prefetch_paths = mode == 1 ? 3 : 0;
        struct moe_store_stats st;
        memset(&st, 0, sizeof st);
        CHECK(run(bundle, &sp, got, 0, &st, NULL, NULL, NULL), "%s prefetch run", mode ? "path" : "stacked-gate");
        CHECK(!memcmp(ref, got, n * sizeof *ref), "%s prefetch changed the logits", mode ? "path" : "stacked-gate");
        CHECK(st.prefetch_loads > 0 && st.prefetch_used > 0 && st.prefetch_used <= st.prefetch_loads,
              "%s prefetch: %lld loads, %lld used", mode ? "path" : "stacked-gate", (long long)st.prefetch_loads,
              (long long)st.prefetch_used);
    }
    free(ref);
    free(got);
}

/* eval_json: run `moe-prep eval` with extra options, parse its JSON. */
static cJSON *eval_json(const char *bundle, const char *text, const char *opts) {
    char out[1200];
    snprintf(out, sizeof out, "%s/eval.json", work);
    if (moe_test_sh("'%s' eval '%s' --ref '%s' --expert-precision q8_0 --dataset '%s' --ctx 64 --max-chunks 3 --json %s "
           ">'%s' 2>/dev/null", prep, bundle, bundle, text, opts, out) != 0)
        return NULL;
    char *js = NULL;
    size_t len = 0;
    if (moe_read_file(out, 1 << 24, &js, &len) != MOE_OK) return NULL;
    cJSON *j = cJSON_Parse(js);
    free(js);
    return j;
}

static double jnum(const cJSON *o, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

/* through_eval: moe-prep eval takes the engine options (item 7). */
static void through_eval(const char *bundle, const char *text) {
    cJSON *j = eval_json(bundle, text, "--expert-mem 25% --dynamic off --high q8_0 --policy lru");
    CHECK(j != NULL, "eval --expert-mem 25%% --dynamic off runs");
    if (j) {
        CHECK(jnum(j, "kld", "mean") == 0 && jnum(j, "ppl", "value") == jnum(j, "ref_ppl", "value"),
              "dynamic off through the engine equals the all-resident run (KL %g)", jnum(j, "kld", "mean"));
        CHECK(jnum(j, "engine", "loads") > 0 && jnum(j, "engine", "misses_low") == 0 &&
                  jnum(j, "engine", "hits_low") == 0,
              "the engine loaded experts, none low (%g loads)", jnum(j, "engine", "loads"));
        cJSON_Delete(j);
    }
    j = eval_json(bundle, text, "--expert-mem 25% --dynamic on --high q8_0 --low q2_k --t1 0.5 --t2 0.99 --batch 1");
    CHECK(j != NULL, "eval --dynamic on --batch 1 runs");
    if (j) {
        double low = jnum(j, "engine", "hits_low") + jnum(j, "engine", "misses_low");
        CHECK(low > 0 && jnum(j, "engine", "accesses") == jnum(j, "engine", "hits_high") +
                                                                jnum(j, "engine", "misses_high") + low +
                                                                jnum(j, "engine", "skips"),
              "dynamic precision used low copies (%g of %g uses)", low, jnum(j, "engine", "accesses"));
        CHECK(jnum(j, "kld", "mean") > 0 && jnum(j, "kld", "mean") < 0.5,
              "low copies move the distribution a little (KL %g)", jnum(j, "kld", "mean"));
        cJSON_Delete(j);
    }
    CHECK(moe_test_sh("'%s' eval '%s' --dataset '%s' --expert-mem 25%% >/dev/null 2>&1", prep, model_dir, text) == 2,
          "engine options on a checkpoint directory are a usage error");
}

/* too_small: a budget below one layer's top-k is refused with the minimum. */
static void too_small(const char *bundle) {
    struct moe_model_params mp = moe_model_default_params();
    mp.lazy_experts = 1;
    struct moe_model *m = NULL;
    struct moe_session *s = NULL;
    CHECK(moe_model_load(bundle, &mp, &m) == MOE_OK, "load");
    struct moe_store_params sp = moe_store_default_params();
    sp.expert_mem = 100000;
    struct moe_session_params p = moe_session_default_params();
    p.store = &sp;
    CHECK(m && moe_session_create(m, &p, &s) == MOE_ERR_INVALID && !s, "100 kB budget refused");
    moe_session_free(s);
    moe_model_free(m);
    CHECK(moe_test_sh("'%s' -m '%s' --expert-mem 100K -p hi -n 1 2>'%s/err.txt' >/dev/null", moe_run, bundle, work) == 1,
          "moe-run exits 1");
    char *text = NULL;
    size_t len = 0;
    char path[1200];
    snprintf(path, sizeof path, "%s/err.txt", work);
    CHECK(moe_read_file(path, 1 << 20, &text, &len) == MOE_OK && text && strstr(text, "needs at least"),
          "the message names the minimum: %s", text ? text : "");
    free(text);
}

/* peak_memory: an inflated model's experts are >= 4x the budget; moe-run's
 * peak RSS stays within non-expert weights + budget + overhead + 32 MiB. */
static void peak_memory(void) {
    char dir[1200], bundle[1300], stats[1300];
    snprintf(dir, sizeof dir, "%s/inflated", work);
    snprintf(bundle, sizeof bundle, "%s/inflated.moeb", work);
    snprintf(stats, sizeof stats, "%s/stats.json", work);
    CHECK(moe_test_sh("'%s' '%s' '%s' --ffn 4096 >/dev/null 2>&1", inflate, model_dir, dir) == 0, "inflate to 4096");
    CHECK(moe_test_sh("'%s' quantize '%s' -o '%s' --experts q8_0 --dense q8_0 >/dev/null 2>&1", prep, dir, bundle) == 0,
          "quantize the inflated model");
    struct moe_bundle *b = NULL;
    if (moe_bundle_open(bundle, &b) != MOE_OK) {
        CHECK(0, "open %s", bundle);
        return;
    }
    struct moe_bundle_info info;
    moe_bundle_get_info(b, &info);
    int64_t nonexpert = 0;
    for (size_t i = 0; i < moe_bundle_tensor_count(b); i++) nonexpert += (int64_t)moe_bundle_tensor_at(b, i)->size;
    const int64_t experts = (int64_t)info.raw_blob_bytes, budget = experts / 5;
    moe_bundle_free(b);
    CHECK(moe_test_sh("'%s' -m '%s' --expert-mem %lld -p 'Once upon a time there was' -n 32 -t 2 --stats-json '%s' "
             ">/dev/null 2>&1",
             moe_run, bundle, (long long)budget, stats) == 0,
          "moe-run with a budget of a fifth of the experts");
    char *text = NULL;
    size_t len = 0;
    cJSON *j = moe_read_file(stats, 1 << 20, &text, &len) == MOE_OK ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *rss = cJSON_GetObjectItem(j, "peak_rss_bytes"), *store = cJSON_GetObjectItem(j, "store");
    const cJSON *over = cJSON_GetObjectItem(j, "store_overhead_bytes");
    const cJSON *loads = cJSON_GetObjectItem(store, "loads");
    const double bound = (double)nonexpert + (double)budget + (over ? over->valuedouble : 0) + 32.0 * 1048576;
    CHECK(rss && store && over && loads && loads->valuedouble > 0, "stats with store counts");
    CHECK(experts >= 4 * budget, "experts %lld >= 4 x budget %lld", (long long)experts, (long long)budget);
#ifdef __SANITIZE_ADDRESS__
    /* AddressSanitizer's shadow memory and quarantine make RSS meaningless here */
    printf("test-store: peak RSS not checked under AddressSanitizer\n");
    cJSON_Delete(j);
    return;
#endif
    CHECK(rss && rss->valuedouble <= bound, "peak RSS %.1f MB within non-expert %.1f + budget %.1f + overhead + 32 MiB",
          rss ? rss->valuedouble / 1e6 : 0, (double)nonexpert / 1e6, (double)budget / 1e6);
    CHECK(rss && rss->valuedouble < (double)experts, "peak RSS %.1f MB below the experts' %.1f MB",
          rss ? rss->valuedouble / 1e6 : 0, (double)experts / 1e6);
    cJSON_Delete(j);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: test-store moe-prep moe-run inflate-moe MODEL_DIR WORK_DIR\n");
        return 2;
    }
    prep = argv[1], moe_run = argv[2], inflate = argv[3], model_dir = argv[4], work = argv[5];
    char bundle[1200];
    snprintf(bundle, sizeof bundle, "%s/tiny.moeb", work);
    if (moe_test_sh("rm -rf '%s' && mkdir -p '%s'", work, work) != 0 ||
        moe_test_sh("'%s' quantize '%s' -o '%s' --experts q8_0,q2_k --dense q8_0 >/dev/null 2>&1", prep, model_dir, bundle)) {
        fprintf(stderr, "test-store: cannot quantize %s into %s\n", model_dir, work);
        return 1;
    }
    moe_log_set_level(MOE_LOG_ERROR);
    identical(bundle);
    same_as_simulator(bundle);
    too_small(bundle);
    char text[1200];
    snprintf(text, sizeof text, "%s/heldout/c4.txt", model_dir);
    struct stat sb;
    if (stat(text, &sb) != 0) snprintf(text, sizeof text, "%s", MOE_FIXTURES "/demo/calibration.txt");
    prefetching(bundle, text);
    through_eval(bundle, text);
    peak_memory();
    printf("test-store: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    if (!fails) moe_test_sh("rm -rf '%s'", work);
    return fails != 0;
}

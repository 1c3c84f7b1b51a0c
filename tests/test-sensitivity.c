/*
 * test-sensitivity.c - the EdgeMoE sweep and the bit-width command on fixture
 * models quantized to q8_0 + q4_0 bundles:
 *   - the cached sweep (layer-l delta, upper layers from the cached residual
 *     stream, LM head on changed rows) equals the naive one (one full forward
 *     pass per expert) on mixtral-f32 and on qwen2_moe-f32 (a dense layer and
 *     a shared expert): KL sums to 2e-4 and NLL sums to 5e-3 relative (see
 *     check_library), proxy and routing counts exactly; routing counts add up to tokens x K per MoE layer;
 *   - low == base gives no loss at all (zero proxy, |KL| at rounding level);
 *   - a sweep split across calls (what a checkpoint does) equals one call bit
 *     for bit;
 *   - the CLI: --stop-after leaves FILE.partial and exit 3, --resume finishes
 *     with arrays bit-identical to an uninterrupted run, a resume under other
 *     settings is refused; CSV has one row per expert; usage errors exit 2;
 *   - bitwidth: the map lands in the bundle tuning (unless --no-tuning) and a
 *     default load binds each expert at it; --max-size picks what fits;
 *     unreachable budgets and shape mismatches exit 1;
 *   - `profile report` renders a sensitivity file with its heat maps;
 *   - the stage as a library call (moe_sensitivity_run): 3 expert shards,
 *     one of them stopped and resumed, merged by moe_sensitivity_merge, equal
 *     a whole run bit for bit (sums, routing, positions, baseline NLL,
 *     Spearman) on qwen2_moe-f32 (a dense layer); the merge refuses a
 *     missing shard and shards of another context.
 * argv[1] is the moe-prep binary.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe-bundle.h"
#include "moe-dataset.h"
#include "moe-model.h"
#include "moe-test.h"
#include "profile-h5.h"
#include "token-stream.h"
#include "sensitivity.h"

#define CTX 32
#define N_SEQ 3

static const char *moe_prep;
static char tmpdir[64] = "/tmp/test-sensitivity-XXXXXX";
static char text_path[600];

static int run(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_text(void) {
    static const char *const subj[] = {"The cat", "A ship", "My neighbour", "The old river", "Every child",
                                       "The committee", "A quiet engine", "The winter wind"};
    static const char *const verb[] = {"watches", "carries", "forgets", "follows", "paints", "answers"};
    static const char *const obj[] = {"the morning light", "seven small boxes", "a letter from home",
                                      "the distant hills", "every question", "the numbers 3, 14 and 15"};
    snprintf(text_path, sizeof text_path, "%s/text.txt", tmpdir);
    FILE *f = fopen(text_path, "w");
    for (int i = 0; i < 200; i++)
        fprintf(f, "%s %s %s.%s", subj[(i * 5) % 8], verb[(i * 3 + i / 8) % 6], obj[(i * 7 + 1) % 6],
                i % 9 == 8 ? "\n\n" : " ");
    fclose(f);
}

/* quantize: fixture `name` into <tmpdir>/<name>.moeb with q8_0 and q4_0 experts. */
static void quantize(const char *name, char *bundle, size_t size) {
    char cmd[2048];
    snprintf(bundle, size, "%s/%s.moeb", tmpdir, name);
    snprintf(cmd, sizeof cmd, "%s quantize %s/models/%s -o %s --experts q8_0,q4_0 >/dev/null 2>&1", moe_prep,
             MOE_FIXTURES, name, bundle);
    CHECK(run(cmd) == 0, "%s", cmd);
}

/* sequences: N_SEQ sequences of CTX tokens of the text, BOS first. */
static int32_t *sequences(const struct moe_model *m) {
    char *text = NULL;
    size_t len = 0, n = 0;
    int32_t *ids = NULL;
    struct moe_dataset_params dp = moe_dataset_default_params();
    if (moe_text_load(text_path, &dp, &text, &len) || moe_text_tokenize(m, NULL, text, len, &ids, &n) ||
        n < (size_t)N_SEQ * CTX) {
        free(text);
        free(ids);
        return NULL;
    }
    int32_t bos = moe_text_bos(m->tok);
    for (int q = 0; bos >= 0 && q < N_SEQ; q++) ids[q * CTX] = bos;
    free(text);
    return ids;
}

static int close_rel(double a, double b, double rel, double abs_tol) {
    return fabs(a - b) <= abs_tol + rel * fmax(fabs(a), fabs(b));
}

/* check_library: cached == naive, low == base is lossless, split == whole. */
static void check_library(const char *name) {
    char bundle[600];
    quantize(name, bundle, sizeof bundle);
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = "q8_0";
    struct moe_model *m = NULL;
    CHECK(moe_model_load(bundle, &mp, &m) == MOE_OK, "%s: load", name);
    if (!m) return;
    int32_t *seq = sequences(m);
    CHECK(seq != NULL, "%s: tokenize", name);
    uint32_t q8 = 0, q4 = 0;
    moe_bundle_find_precision(m->bundle, "q8_0", &q8);
    moe_bundle_find_precision(m->bundle, "q4_0", &q4);
    struct moe_sens_params p = moe_sens_default_params();
    p.base = (int)q8;
    p.low = (int)q4;
    p.n_threads = 2;
    struct moe_sens_state c = {0}, nv = {0}, same = {0}, split = {0};
    CHECK(moe_sens_state_init(&c, m, N_SEQ, CTX) == MOE_OK && moe_sens_state_init(&nv, m, N_SEQ, CTX) == MOE_OK &&
              moe_sens_state_init(&same, m, N_SEQ, CTX) == MOE_OK &&
              moe_sens_state_init(&split, m, N_SEQ, CTX) == MOE_OK,
          "%s: init", name);
    if (!seq || !c.kl) goto done;
    CHECK(moe_sens_run(m, seq, &p, &c, N_SEQ, NULL) == MOE_OK && c.next_seq == N_SEQ, "%s: cached sweep", name);
    p.method = MOE_SENS_NAIVE;
    CHECK(moe_sens_run(m, seq, &p, &nv, N_SEQ, NULL) == MOE_OK, "%s: naive sweep", name);
    /* The two methods differ by float rounding (cached output + delta against
     * a full recomputation), and the quantized matrices (q8_0 / q4_0) take
     * their inputs quantized to 8 bits: a rounding-level change of an input
     * moves one of its quants by a whole step (1/127 of its block's largest
     * value) whenever it sits near a rounding boundary, so the differences
     * are not at rounding level any more. Measured (scalar, AVX2 and AVX-512
     * VNNI kernels alike): KL sums up to 4.2e-5 and NLL sums up to 1.7e-3
     * relative on qwen2_moe-f32 (hidden 48: one flipped quant weighs much),
     * 4e-6 and 8e-5 on mixtral-f32; with float activations both were within
     * 1e-4. Tolerances: 2e-4 and 5e-3, about 3 to 5 times the measured. */
    const int n = c.n_moe * c.n_expert;
    int ok_kl = 1, ok_px = 1, any_kl = 0;
    for (int i = 0; i < n; i++) {
        const int kl_ok = close_rel(c.kl[i], nv.kl[i], 2e-4, 1e-6), nll_ok = close_rel(c.dnll[i], nv.dnll[i], 5e-3, 1e-5);
        ok_kl &= kl_ok && nll_ok;
        ok_px &= c.proxy[i] == nv.proxy[i] && c.routed[i] == nv.routed[i];
        any_kl |= c.kl[i] > 1e-4;
        if (!kl_ok || !nll_ok)
            fprintf(stderr, "  %s expert %d: KL cached %.9g naive %.9g, NLL cached %.9g naive %.9g\n", name, i,
                    c.kl[i], nv.kl[i], c.dnll[i], nv.dnll[i]);
    }
    CHECK(ok_kl && any_kl, "%s: cached and naive KL / NLL sums differ (or no expert matters)", name);
    CHECK(ok_px, "%s: proxy or routing counts differ between methods", name);
    for (int li = 0; li < c.n_moe; li++) {
        int64_t t = 0;
        for (int e = 0; e < c.n_expert; e++) t += c.routed[li * c.n_expert + e];
        CHECK(t == (int64_t)N_SEQ * CTX * m->cfg.n_expert_used, "%s: MoE layer %d routed %lld", name, li,
              (long long)t);
    }
    CHECK(c.n_kl == N_SEQ * CTX && c.n_nll == N_SEQ * (CTX - 1), "%s: positions %lld %lld", name, (long long)c.n_kl,
          (long long)c.n_nll);
    /* every expert back at base after the sweep */
    int at_base = 1;
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int e = 0; m->cfg.layer_moe[l] && e < m->cfg.n_expert; e++)
            at_base &= moe_model_get_expert_precision(m, l, e) == (int)q8;
    CHECK(at_base, "%s: experts not restored to base", name);

    /* low == base: nothing changes */
    p.method = MOE_SENS_CACHED;
    p.low = p.base;
    CHECK(moe_sens_run(m, seq, &p, &same, N_SEQ, NULL) == MOE_OK, "%s: low == base", name);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        CHECK(same.proxy[i] == 0, "%s: proxy %g with low == base", name, same.proxy[i]);
        worst = fmax(worst, fabs(same.kl[i]) / (double)same.n_kl);
    }
    CHECK(worst < 1e-7, "%s: mean KL up to %g with low == base", name, worst);

    /* split over three calls == one call, bit for bit */
    p.low = (int)q4;
    for (int end = 1; end <= N_SEQ; end++)
        CHECK(moe_sens_run(m, seq, &p, &split, end, NULL) == MOE_OK && split.next_seq == end, "%s: split %d", name,
              end);
    CHECK(!memcmp(split.kl, c.kl, sizeof(double) * (size_t)n) && !memcmp(split.dnll, c.dnll, sizeof(double) * (size_t)n) &&
              !memcmp(split.proxy, c.proxy, sizeof(double) * (size_t)n) && split.base_nll == c.base_nll,
          "%s: a split sweep differs from one run", name);
done:
    moe_sens_state_clear(&c);
    moe_sens_state_clear(&nv);
    moe_sens_state_clear(&same);
    moe_sens_state_clear(&split);
    free(seq);
    moe_model_free(m);
}

/* check_stage: moe_sensitivity_run whole and as 3 shards + moe_sensitivity_merge. */
static void check_stage(const char *name) {
    char bundle[600], out[4][700], merged[700];
    quantize(name, bundle, sizeof bundle);
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = "q8_0";
    struct moe_model *m = NULL;
    CHECK(moe_model_load(bundle, &mp, &m) == MOE_OK, "%s: load", name);
    int32_t *seq = m ? sequences(m) : NULL;
    if (!seq) goto done;
    struct moe_sensitivity_params p = moe_sensitivity_default_params();
    uint32_t q8 = 0, q4 = 0;
    moe_bundle_find_precision(m->bundle, "q8_0", &q8);
    moe_bundle_find_precision(m->bundle, "q4_0", &q4);
    p.sweep.base = (int)q8, p.sweep.low = (int)q4, p.sweep.n_threads = 2;
    p.model_name = bundle, p.dataset_name = text_path, p.stream_tokens = N_SEQ * CTX;
    struct moe_sensitivity_result whole, r;
    snprintf(out[3], sizeof out[3], "%s/stage-whole.h5", tmpdir);
    p.out = out[3];
    CHECK(moe_sensitivity_run(m, seq, N_SEQ, CTX, &p, &whole) == MOE_OK && whole.complete, "%s: whole", name);
    const char *paths[3] = {out[0], out[1], out[2]};
    for (int i = 0; i < 3; i++) {
        snprintf(out[i], sizeof out[i], "%s/stage-%d.h5", tmpdir, i);
        p.out = out[i], p.sweep.shard_index = i, p.sweep.shard_count = 3;
        p.stop_after = i == 1 ? 1 : 0; /* shard 1 stops after a sequence, then resumes */
        CHECK(moe_sensitivity_run(m, seq, N_SEQ, CTX, &p, &r) == MOE_OK && r.complete == (i != 1), "%s: shard %d",
              name, i);
        moe_sensitivity_result_clear(&r);
        if (i != 1) continue;
        p.resume = 1, p.stop_after = 0;
        CHECK(moe_sensitivity_run(m, seq, N_SEQ, CTX, &p, &r) == MOE_OK && r.complete && r.resumed_at == 1,
              "%s: shard 1 resumed at %d", name, r.resumed_at);
        moe_sensitivity_result_clear(&r);
        p.resume = 0;
    }
    snprintf(merged, sizeof merged, "%s/stage-merged.h5", tmpdir);
    CHECK(moe_sensitivity_merge(paths, 2, merged, &r) == MOE_ERR_INVALID, "%s: a missing shard merged", name);
    moe_sensitivity_result_clear(&r);
    CHECK(moe_sensitivity_merge(paths, 3, merged, &r) == MOE_OK && r.complete && r.n_shards_merged == 3,
          "%s: merge", name);
    const struct moe_sens_state *a = &whole.state, *b = &r.state;
    const size_t n = (size_t)a->n_moe * (size_t)a->n_expert;
    CHECK(b->kl && a->n_moe == b->n_moe && !memcmp(a->kl, b->kl, 8 * n) && !memcmp(a->dnll, b->dnll, 8 * n) &&
              !memcmp(a->proxy, b->proxy, 8 * n) && !memcmp(a->routed, b->routed, 8 * n) && a->n_kl == b->n_kl &&
              a->n_nll == b->n_nll && a->base_nll == b->base_nll && whole.spearman == r.spearman &&
              !strcmp(whole.low, r.low) && r.moe_layer[0] == whole.moe_layer[0],
          "%s: merged shards differ from the whole run", name);
    moe_sensitivity_result_clear(&r);
    /* a shard of another context does not join */
    p.out = out[2], p.sweep.shard_index = 2;
    CHECK(moe_sensitivity_run(m, seq, N_SEQ * 2, CTX / 2, &p, &r) == MOE_OK, "%s: shard at ctx/2", name);
    moe_sensitivity_result_clear(&r);
    CHECK(moe_sensitivity_merge(paths, 3, merged, &r) == MOE_ERR_INVALID, "%s: shards of two contexts merged", name);
    moe_sensitivity_result_clear(&r);
    moe_sensitivity_result_clear(&whole);
done:
    free(seq);
    moe_model_free(m);
}

/* same_array: derived f64/i32 array `name` identical in both files. */
static int same_array(const struct moe_profile *a, const struct moe_profile *b, const char *name) {
    int na, nb;
    int64_t da[MOE_PROFILE_MAX_DIMS], db[MOE_PROFILE_MAX_DIMS];
    const double *x, *y;
    const int32_t *u, *v;
    if (!moe_profile_get_f64(a, name, &na, da, &x) && !moe_profile_get_f64(b, name, &nb, db, &y))
        return na == nb && da[0] == db[0] && !memcmp(x, y, sizeof(double) * (size_t)(da[0] * (na > 1 ? da[1] : 1)));
    if (!moe_profile_get_i32(a, name, &na, da, &u) && !moe_profile_get_i32(b, name, &nb, db, &v))
        return na == nb && da[0] == db[0] && !memcmp(u, v, sizeof(int32_t) * (size_t)da[0]);
    return 0;
}

static int file_exists(const char *p) { return access(p, F_OK) == 0; }

static void check_cli(void) {
    char bundle[600], full[700], res[700], partial[720], csv[700], cmd[4096], other[600];
    quantize("mixtral-f32", bundle, sizeof bundle);
    snprintf(full, sizeof full, "%s/full.h5", tmpdir);
    snprintf(res, sizeof res, "%s/resumed.h5", tmpdir);
    snprintf(partial, sizeof partial, "%s.partial", res);
    snprintf(csv, sizeof csv, "%s/sens.csv", tmpdir);
    const char *opts = "--low q4_0 --base q8_0 --ctx 32 --max-tokens 160 -t 2";
    snprintf(cmd, sizeof cmd, "%s sensitivity %s --dataset %s -o %s %s --csv %s >/dev/null 2>&1", moe_prep, bundle,
             text_path, full, opts, csv);
    CHECK(run(cmd) == 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s sensitivity %s --dataset %s -o %s %s --stop-after 2 >/dev/null 2>&1", moe_prep,
             bundle, text_path, res, opts);
    int rc = run(cmd);
    CHECK(rc == 3 && file_exists(partial) && !file_exists(res), "stop-after: exit %d, partial %d, out %d", rc,
          file_exists(partial), file_exists(res));
    /* other settings refuse the partial file */
    snprintf(cmd, sizeof cmd, "%s sensitivity %s --dataset %s -o %s --low q4_0 --base q8_0 --ctx 16 --max-tokens 160 "
                              "--resume >/dev/null 2>&1", moe_prep, bundle, text_path, res);
    CHECK(run(cmd) == 1 && file_exists(partial), "resume under another --ctx should exit 1");
    snprintf(cmd, sizeof cmd, "%s sensitivity %s --dataset %s -o %s %s --stop-after 1 --resume >/dev/null 2>&1",
             moe_prep, bundle, text_path, res, opts);
    CHECK(run(cmd) == 3, "second partial step");
    snprintf(cmd, sizeof cmd, "%s sensitivity %s --dataset %s -o %s %s --resume >/dev/null 2>&1", moe_prep, bundle,
             text_path, res, opts);
    CHECK(run(cmd) == 0 && file_exists(res) && !file_exists(partial), "resume to the end");
    struct moe_profile *a = NULL, *b = NULL;
    CHECK(moe_profile_read(full, &a) == MOE_OK && moe_profile_read(res, &b) == MOE_OK, "read sensitivity files");
    if (a && b) {
        static const char *const names[] = {"sensitivity.kl", "sensitivity.dnll", "sensitivity.proxy",
                                            "sensitivity.score", "sensitivity.order", "sensitivity.sum_kl"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            CHECK(same_array(a, b, names[i]), "resumed %s differs from the uninterrupted run", names[i]);
        CHECK(a->n_layers == 2 && a->n_experts == 8, "shape %d x %d", a->n_layers, a->n_experts);
    }
    moe_profile_free(a);
    moe_profile_free(b);
    /* the report draws the heat maps */
    snprintf(cmd, sizeof cmd, "%s profile report %s -o %s/sens.html >/dev/null 2>&1 && grep -q 'id=\"sensitivity\"' "
                              "%s/sens.html && ! grep -q 'id=\"popularity\"' %s/sens.html", moe_prep, full, tmpdir,
             tmpdir, tmpdir);
    CHECK(run(cmd) == 0, "the report of a sensitivity file lacks its section (or shows an empty popularity map)");
    FILE *f = fopen(csv, "r");
    int lines = 0;
    for (int ch; f && (ch = fgetc(f)) != EOF;) lines += ch == '\n';
    if (f) fclose(f);
    CHECK(lines == 1 + 16, "CSV has %d lines", lines);

    /* usage and input errors */
    static const char *const bad2[] = {"--dataset X", "--dataset X -o Y --metric nope", "--dataset X -o Y --ctx 2",
                                       "--dataset X -o Y --frobnicate"};
    for (size_t i = 0; i < sizeof bad2 / sizeof bad2[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s sensitivity %s %s >/dev/null 2>&1", moe_prep, bundle, bad2[i]);
        CHECK(run(cmd) == 2, "%s should exit 2", cmd);
    }
    snprintf(cmd, sizeof cmd, "%s sensitivity %s --dataset %s -o %s/x.h5 --low q8_0 --base q8_0 >/dev/null 2>&1",
             moe_prep, bundle, text_path, tmpdir);
    CHECK(run(cmd) == 2, "low == base should exit 2");
    snprintf(cmd, sizeof cmd, "%s sensitivity %s/models/mixtral-f32 --dataset %s -o %s/x.h5 >/dev/null 2>&1", moe_prep,
             MOE_FIXTURES, text_path, tmpdir);
    CHECK(run(cmd) == 1, "a checkpoint directory should exit 1");
    snprintf(cmd, sizeof cmd, "%s sensitivity --help >/dev/null 2>&1", moe_prep);
    CHECK(run(cmd) == 0, "--help");

    /* bitwidth */
    snprintf(cmd, sizeof cmd, "%s bitwidth %s --sensitivity %s --dataset %s --ctx 32 --max-loss 1000%% --no-tuning -t 2 "
                              ">/dev/null 2>&1", moe_prep, bundle, full, text_path);
    CHECK(run(cmd) == 0, "%s", cmd);
    struct moe_bundle *bd = NULL;
    CHECK(moe_bundle_open(bundle, &bd) == MOE_OK, "open bundle");
    size_t nm = 0;
    CHECK(bd && !moe_bundle_kv_i64_array(moe_bundle_tuning(bd), MOE_TUNING_BITWIDTH_MAP, &nm),
          "--no-tuning wrote the map");
    moe_bundle_free(bd);
    /* a budget between uniform q4_0 and q8_0 is what the tiny random model
     * gives; any budget works for the checks below */
    snprintf(cmd, sizeof cmd, "%s bitwidth %s --sensitivity %s --dataset %s --ctx 32 --max-loss 0.5%% -t 2 --json "
                              "> %s/bw.json 2>/dev/null", moe_prep, bundle, full, text_path, tmpdir);
    CHECK(run(cmd) == 0, "%s", cmd);
    bd = NULL;
    const int64_t *map = NULL;
    CHECK(moe_bundle_open(bundle, &bd) == MOE_OK, "reopen bundle");
    if (bd) map = moe_bundle_kv_i64_array(moe_bundle_tuning(bd), MOE_TUNING_BITWIDTH_MAP, &nm);
    CHECK(map && nm == 16, "map of %zu entries", nm);
    struct moe_model *m = NULL;
    struct moe_model_params mp = moe_model_default_params();
    CHECK(moe_model_load(bundle, &mp, &m) == MOE_OK, "load with the map");
    if (m && map && nm == 16) {
        int agree = 1, mixed = 0;
        for (int i = 0; i < 16; i++) {
            agree &= moe_model_get_expert_precision(m, i / 8, i % 8) == map[i];
            mixed |= map[i] != map[0];
        }
        CHECK(agree, "a default load does not bind the map's precisions");
        CHECK(m->expert_precision == (mixed ? -1 : (int)map[0]), "expert_precision %d", m->expert_precision);
    }
    moe_model_free(m);
    m = NULL;
    mp.expert_precision = "q8_0";
    CHECK(moe_model_load(bundle, &mp, &m) == MOE_OK && m->expert_precision == moe_model_get_expert_precision(m, 1, 7),
          "--expert-precision overrides the map");
    moe_model_free(m);
    moe_bundle_free(bd);
    /* size budget: everything fits -> exit 0; nothing fits -> exit 1 */
    snprintf(cmd, sizeof cmd, "%s bitwidth %s --sensitivity %s --dataset %s --ctx 32 --max-size 1GiB --no-tuning -t 2 "
                              ">/dev/null 2>&1", moe_prep, bundle, full, text_path);
    CHECK(run(cmd) == 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s bitwidth %s --sensitivity %s --dataset %s --ctx 32 --max-size 100 --no-tuning -t 2 "
                              ">/dev/null 2>&1", moe_prep, bundle, full, text_path);
    CHECK(run(cmd) == 1, "an unreachable size budget should exit 1");
    snprintf(cmd, sizeof cmd, "%s bitwidth %s --sensitivity %s --dataset %s --max-loss 2%% --max-size 1GiB "
                              ">/dev/null 2>&1", moe_prep, bundle, full, text_path);
    CHECK(run(cmd) == 2, "two budgets should exit 2");
    /* a sensitivity file of another model's shape */
    quantize("qwen2_moe-f32", other, sizeof other);
    snprintf(cmd, sizeof cmd, "%s bitwidth %s --sensitivity %s --dataset %s --ctx 32 --max-loss 2%% >/dev/null 2>&1",
             moe_prep, other, full, text_path);
    CHECK(run(cmd) == 1, "a sensitivity file of another shape should exit 1");
    snprintf(cmd, sizeof cmd, "%s bitwidth %s --sensitivity %s --dataset %s --ctx 32 --max-loss 2%% >/dev/null 2>&1",
             moe_prep, bundle, text_path, text_path);
    CHECK(run(cmd) == 1, "a text file as sensitivity should exit 1");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test-sensitivity MOE_PREP\n");
        return 2;
    }
    moe_prep = argv[1];
    if (!mkdtemp(tmpdir)) return 1;
    moe_log_set_level(MOE_LOG_ERROR);
    write_text();
    check_library("mixtral-f32");
    check_library("qwen2_moe-f32");
    check_library("deepseek_v3-f32"); /* MLA cache under forward_from, sigmoid routing */
    check_library("gpt_oss-f32"); /* expert biases and the clamped SwiGLU in the sweep */
    check_stage("qwen2_moe-f32");
    check_cli();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (!fails) run(cmd);
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}

/*
 * test-profile.c - `moe-prep profile` end to end on the fixture models
 * (qwen2_moe-f32, whose layer 1 is dense, and mixtral-f32):
 *   - the profile file reads back; popularity counts total tokens x MoE layers
 *     x K; the sequences are ctx tokens each, the last cut by --max-tokens;
 *   - the trace equals what a session with an on_route observer records here,
 *     independently, on the same tokens (dataset loaded and tokenized with the
 *     eval functions, BOS over each sequence's first token, one forward call
 *     per sequence);
 *   - the HOBBIT thresholds are what routing-stats computes from the trace and
 *     give the target shares within what ties allow;
 *   - every derived array is present with its shape; stacked-gate accuracy and
 *     similarities are in range, NaN exactly where model layer l+j is dense or
 *     absent;
 *   - the big-little pass: its histogram counts every token of the sampled
 *     sequences, and big_little_summary is consistent with it;
 *   - three shards (--shard i/3), merged in any order, give the same trace,
 *     counts, sums and derived results as the single run; gaps, overlaps,
 *     text files and foreign HDF5 files are refused with exit 1;
 *   - profiling a bundle writes T1/T2, the placement order, the path
 *     dictionaries (checked against counts taken here) and gamma into its
 *     tuning section; --csv-dir writes the CSV files; `profile report` renders
 *     the merged profile;
 *   - moe_profile_record, called here on the same tokens, gives the profile the
 *     CLI wrote; `profile --json` parses with cJSON, its values the profile's;
 *   - a missing dataset or a bad model exits 1, a usage error 2, --help 0.
 * argv[1] is the moe-prep binary.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "moe-bundle.h"
#include "moe-dataset.h"
#include "moe-model.h"
#include "moe-session.h"
#include "moe-test.h"
#include "moe-test-h5.h"
#include "profile-h5.h"
#include "profile-record.h"
#include "profile-results.h"
#include "token-stream.h"
#include "routing-stats.h"

#define CTX 32
#define MAX_TOKENS 180 /* 5 whole sequences and one of 20 tokens */
#define TARGET_LOW 0.30
#define TARGET_SKIP 0.03

static const char *moe_prep;
static char text_path[64] = "/tmp/test-profile-txt-XXXXXX", out_path[64] = "/tmp/test-profile-h5-XXXXXX";

static int run(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* write_text: a few hundred words of varied sentences. */
static void write_text(void) {
    static const char *const subj[] = {"The cat", "A ship", "My neighbour", "The old river", "Every child",
                                       "The committee", "A quiet engine", "The winter wind"};
    static const char *const verb[] = {"watches", "carries", "forgets", "follows", "paints", "answers",
                                       "measures", "remembers"};
    static const char *const obj[] = {"the morning light", "seven small boxes", "a letter from home",
                                      "the distant hills", "every question", "the broken clock",
                                      "a song about rain", "the numbers 3, 14 and 15"};
    FILE *f = fopen(text_path, "w");
    for (int i = 0; i < 160; i++)
        fprintf(f, "%s %s %s.%s", subj[(i * 5) % 8], verb[(i * 3 + i / 8) % 8], obj[(i * 7 + 1) % 8],
                i % 9 == 8 ? "\n\n" : " ");
    fclose(f);
}

struct rec {
    int L, K, *moe_index;
    int16_t *experts;
    float *weights; /* [tokens x L x K], filled at offset base */
    int64_t base;
};

static void on_route(const struct moe_route_event *ev, void *user) {
    struct rec *r = user;
    int li = r->moe_index[ev->layer];
    for (int t = 0; t < ev->n_tokens; t++)
        for (int j = 0; j < ev->k; j++) {
            size_t o = ((size_t)(r->base + ev->pos0 + t) * r->L + li) * r->K + j;
            r->experts[o] = (int16_t)ev->experts[t * ev->k + j];
            r->weights[o] = ev->weights[t * ev->k + j];
        }
}

/* check_trace: the profile's trace against one recorded here. */
static void check_trace(const char *name, const char *dir, const struct moe_profile *p) {
    struct moe_model *m = NULL;
    char *text = NULL;
    size_t len = 0, n_ids = 0;
    int32_t *ids = NULL;
    struct moe_dataset_params dp = moe_dataset_default_params();
    CHECK(moe_model_load(dir, NULL, &m) == MOE_OK, "%s: load", name);
    CHECK(moe_text_load(text_path, &dp, &text, &len) == MOE_OK, "%s: text", name);
    if (!m || !text) goto done;
    CHECK(moe_text_tokenize(m, NULL, text, len, &ids, &n_ids) == MOE_OK && n_ids >= 6 * CTX,
          "%s: tokenize (%zu tokens; the text must hold 6 sequences)", name, n_ids);
    if (n_ids < 6 * CTX) goto done;
    int moe_index[64], L = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) moe_index[l] = m->cfg.layer_moe[l] ? L++ : -1;
    const int K = m->cfg.n_expert_used;
    struct rec r = {L, K, moe_index, calloc((size_t)MAX_TOKENS * L * K, 2), calloc((size_t)MAX_TOKENS * L * K, 4), 0};
    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = CTX;
    sp.n_batch = CTX;
    sp.n_threads = 2;
    sp.on_route = on_route;
    sp.route_user = &r;
    const int32_t bos = moe_text_bos(m->tok);
    for (int64_t pos = 0; pos < MAX_TOKENS; pos += CTX) {
        int32_t seq[CTX];
        int n = MAX_TOKENS - pos < CTX ? (int)(MAX_TOKENS - pos) : CTX;
        memcpy(seq, ids + pos, sizeof(int32_t) * n);
        if (bos >= 0) seq[0] = bos;
        struct moe_session *s = NULL;
        r.base = pos;
        CHECK(moe_session_create(m, &sp, &s) == MOE_OK && moe_session_forward(s, seq, n, NULL, 0) == MOE_OK,
              "%s: forward at %lld", name, (long long)pos);
        moe_session_free(s);
    }
    CHECK(p->n_layers == L && p->k == K && p->n_experts == m->cfg.n_expert, "%s: shape", name);
    if (p->n_layers == L && p->k == K && moe_profile_n_tokens(p) == MAX_TOKENS) {
        size_t n = (size_t)MAX_TOKENS * L * K, bad_e = 0, bad_w = 0;
        for (size_t i = 0; i < n; i++) {
            bad_e += p->experts[i] != r.experts[i];
            bad_w += fabsf(p->weights[i] - r.weights[i]) > 1e-6f;
        }
        CHECK(bad_e == 0 && bad_w == 0, "%s: trace differs from the session's: %zu experts, %zu weights of %zu",
              name, bad_e, bad_w, n);
        for (int li = 0; li < L; li++) {
            int l = 0;
            while (moe_index[l] != li) l++;
            CHECK(p->moe_layer_index[li] == l, "%s: moe_layer_index[%d] = %d, want %d", name, li,
                  p->moe_layer_index[li], l);
        }
    }
    free(r.experts);
    free(r.weights);
done:
    free(ids);
    free(text);
    moe_model_free(m);
}

/* check_shape: derived f64 array `nm` present with dims d0 [x d1]. */
static const double *check_shape(const char *name, const struct moe_profile *p, const char *nm, int nd, int64_t d0,
                                 int64_t d1) {
    int ndims = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    const double *x = NULL;
    enum moe_status st = moe_profile_get_f64(p, nm, &ndims, dims, &x);
    CHECK(st == MOE_OK && ndims == nd && dims[0] == d0 && (nd == 1 || dims[1] == d1),
          "%s: derived %s: status %d, ndims %d, dims %lld x %lld (want %lld x %lld)", name, nm, st, ndims,
          (long long)dims[0], nd > 1 ? (long long)dims[1] : 1LL, (long long)d0, (long long)d1);
    return st == MOE_OK ? x : NULL;
}

static void check_thresholds(const char *name, const struct moe_profile *p) {
    struct moe_trace t;
    moe_profile_trace(p, &t);
    size_t n = (size_t)moe_trace_n_tokens(&t) * t.n_layers * t.k;
    float *s = malloc(n * sizeof *s);
    moe_hobbit_scores(&t, s);
    struct moe_hobbit_split want;
    CHECK(moe_hobbit_thresholds(s, n, TARGET_LOW, TARGET_SKIP, &want) == MOE_OK, "%s: thresholds", name);
    const double *thr = check_shape(name, p, "hobbit_thresholds", 1, 5, 0);
    if (thr) {
        CHECK(thr[0] == want.t1 && thr[1] == want.t2, "%s: T1 %g T2 %g, routing-stats gives %g %g", name, thr[0],
              thr[1], want.t1, want.t2);
        struct moe_hobbit_split got = moe_hobbit_split_at(s, n, thr[0], thr[1]);
        CHECK(fabs(got.high - thr[2]) < 1e-12 && fabs(got.low - thr[3]) < 1e-12 && fabs(got.skip - thr[4]) < 1e-12,
              "%s: stored split %g %g %g, thresholds give %g %g %g", name, thr[2], thr[3], thr[4], got.high, got.low,
              got.skip);
        /* the largest group of equal non-zero scores bounds how close a split can come */
        float *sorted = malloc(n * sizeof *sorted);
        memcpy(sorted, s, n * sizeof *s);
        for (size_t i = 1; i < n; i++) /* insertion sort: n is a few thousand */
            for (size_t j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
                float x = sorted[j];
                sorted[j] = sorted[j - 1], sorted[j - 1] = x;
            }
        size_t tie = 1, run_len = 1;
        for (size_t i = 1; i < n; i++) {
            run_len = sorted[i] == sorted[i - 1] ? run_len + 1 : 1;
            if (sorted[i] > 0 && run_len > tie) tie = run_len;
        }
        double slack = (double)(tie + 1) / n;
        CHECK(fabs(thr[4] - TARGET_SKIP) <= slack && fabs(thr[3] + thr[4] - TARGET_LOW - TARGET_SKIP) <= slack,
              "%s: split low %g skip %g, targets %g %g (ties allow %g)", name, thr[3], thr[4], TARGET_LOW,
              TARGET_SKIP, slack);
        free(sorted);
    }
    free(s);
}

static void check_model(const char *name) {
    char dir[512], cmd[2048];
    snprintf(dir, sizeof dir, "%s/models/%s", MOE_FIXTURES, name);
    snprintf(cmd, sizeof cmd, "%s profile %s --dataset %s -o %s --ctx %d --max-tokens %d -t 2 --heldout 0.34 >/dev/null 2>&1",
             moe_prep, dir, text_path, out_path, CTX, MAX_TOKENS);
    int rc = run(cmd);
    CHECK(rc == 0, "%s: exit %d", cmd, rc);
    struct moe_profile *p = NULL;
    CHECK(moe_profile_read(out_path, &p) == MOE_OK, "%s: cannot read the profile", name);
    if (!p) return;
    const int L = p->n_layers, E = p->n_experts, K = p->k;
    const int64_t n_tok = moe_profile_n_tokens(p);
    CHECK(n_tok == MAX_TOKENS && p->n_seq == 6 && p->seq_start[1] == CTX && p->seq_start[5] == 5 * CTX,
          "%s: %lld tokens in %d sequences", name, (long long)n_tok, p->n_seq);
    int64_t total = 0;
    for (int i = 0; i < L * E; i++) total += p->popularity[i];
    CHECK(total == n_tok * L * K, "%s: popularity total %lld, want %lld", name, (long long)total,
          (long long)(n_tok * L * K));
    CHECK(!strcmp(p->dataset, text_path) && p->arch[0], "%s: meta (%s, %s)", name, p->arch, p->dataset);
    check_trace(name, dir, p);
    check_thresholds(name, p);

    /* derived arrays */
    int nd = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    const int32_t *order = NULL;
    CHECK(moe_profile_get_i32(p, "placement_order", &nd, dims, &order) == MOE_OK && nd == 1 && dims[0] == L * E,
          "%s: placement_order", name);
    if (order) {
        int seen[512] = {0}, ok = 1;
        for (int i = 0; i < L * E; i++) ok &= order[i] >= 0 && order[i] < L * E && !seen[order[i]]++;
        for (int i = 1; i < L * E; i++) ok &= p->popularity[order[i - 1]] >= p->popularity[order[i]];
        CHECK(ok, "%s: placement_order is not a popularity-sorted permutation", name);
    }
    const int64_t *split = NULL;
    CHECK(moe_profile_get_i64(p, "split_sequences", &nd, dims, &split) == MOE_OK && split[0] == 4 && split[1] == 2,
          "%s: split_sequences", name);
    const double *hit = check_shape(name, p, "placement_hit_rate", 2, 3, 3);
    if (hit)
        for (int i = 0; i < 3; i++)
            CHECK(hit[i * 3 + 1] >= 0 && hit[i * 3 + 1] <= 1 && fabs(hit[i * 3 + 2] - hit[i * 3]) < 0.5 / (L * E) + 1e-9,
                  "%s: placement_hit_rate row %d: %g %g %g", name, i, hit[i * 3], hit[i * 3 + 1], hit[i * 3 + 2]);
    const double *r = check_shape(name, p, "gate_output_pearson", 1, 1, 0);
    if (r) CHECK(r[0] >= -1 && r[0] <= 1, "%s: pearson %g", name, r[0]);
    const double *sim = check_shape(name, p, "layer_similarity", 2, L, 4);
    const double *top1 = check_shape(name, p, "stacked_top1", 2, L, 4);
    const double *rec = check_shape(name, p, "stacked_recall", 2, L, 4);
    if (sim && top1 && rec) {
        int n_layer = p->moe_layer_index[L - 1] + 1, is_moe[64] = {0};
        for (int li = 0; li < L; li++) is_moe[p->moe_layer_index[li]] = 1;
        for (int li = 0; li < L; li++)
            for (int j = 1; j <= 4; j++) {
                int l = p->moe_layer_index[li] + j, i = li * 4 + j - 1;
                if (l < n_layer && is_moe[l])
                    CHECK(top1[i] >= 0 && top1[i] <= 1 && rec[i] >= 0 && rec[i] <= 1 && sim[i] >= -1 - 1e-9 &&
                              sim[i] <= 1 + 1e-9,
                          "%s: stacked [%d][%d]: top1 %g recall %g cosine %g", name, li, j, top1[i], rec[i], sim[i]);
                else
                    CHECK(isnan(top1[i]) && isnan(rec[i]) && isnan(sim[i]), "%s: stacked [%d][%d] should be NaN", name,
                          li, j);
            }
        CHECK(isfinite(top1[(L - 2) * 4 + (p->moe_layer_index[L - 1] - p->moe_layer_index[L - 2]) - 1]),
              "%s: stacked accuracy towards the last MoE layer is missing", name);
    }
    check_shape(name, p, "path_accuracy_order1", 2, 2, 3);
    check_shape(name, p, "path_accuracy_order2", 2, 2, 3);
    check_shape(name, p, "path_key_coverage", 1, 2, 0);
    const double *reuse = check_shape(name, p, "reuse", 2, L, K);
    if (reuse)
        for (int i = 0; i < L * K; i++) CHECK(reuse[i] >= 0 && reuse[i] <= 1, "%s: reuse[%d] = %g", name, i, reuse[i]);
    const double *chance = check_shape(name, p, "reuse_chance", 1, 1, 0);
    if (chance) CHECK(fabs(chance[0] - (double)K / E) < 1e-12, "%s: reuse_chance %g", name, chance[0]);
    moe_profile_free(p);
}

/* same_arrays: derived array `nm` equal in a and b (f64 within rel, else exact). */
static int same_array(const struct moe_profile *a, const struct moe_profile *b, const char *nm, double rel) {
    int na = 0, nb = 0;
    int64_t da[MOE_PROFILE_MAX_DIMS], db[MOE_PROFILE_MAX_DIMS];
    const double *x = NULL, *y = NULL;
    const int64_t *u = NULL, *v = NULL;
    const int32_t *g = NULL, *h = NULL;
    int64_t n = 1;
    if (!moe_profile_get_f64(a, nm, &na, da, &x) && !moe_profile_get_f64(b, nm, &nb, db, &y)) {
        if (na != nb) return 0;
        for (int d = 0; d < na; d++) n *= da[d];
        for (int64_t i = 0; i < n; i++)
            if (!(isnan(x[i]) && isnan(y[i])) && !(fabs(x[i] - y[i]) <= rel * fmax(1, fabs(x[i])))) return 0;
        return 1;
    }
    if (!moe_profile_get_i64(a, nm, &na, da, &u) && !moe_profile_get_i64(b, nm, &nb, db, &v)) {
        for (int d = 0; d < na; d++) n *= da[d];
        return na == nb && !memcmp(u, v, (size_t)n * 8);
    }
    if (!moe_profile_get_i32(a, nm, &na, da, &g) && !moe_profile_get_i32(b, nm, &nb, db, &h)) {
        for (int d = 0; d < na; d++) n *= da[d];
        return na == nb && !memcmp(g, h, (size_t)n * 4);
    }
    return 0;
}

/* check_tuning: the bundle's tuning holds what the profile derived; the
 * order-1 dictionary's first entry per layer agrees with counts taken here. */
static void check_tuning(const char *bundle, const struct moe_profile *p) {
    struct moe_bundle *b = NULL;
    CHECK(moe_bundle_open(bundle, &b) == MOE_OK, "open %s", bundle);
    if (!b) return;
    const struct moe_bundle_kv *kv = moe_bundle_tuning(b);
    double t1 = NAN, t2 = NAN, gamma = NAN;
    const double *thr = NULL, *bl = NULL;
    const int32_t *order = NULL;
    CHECK(!moe_profile_get_f64(p, "hobbit_thresholds", NULL, NULL, &thr) &&
              !moe_profile_get_i32(p, "placement_order", NULL, NULL, &order) &&
              !moe_profile_get_f64(p, "big_little_summary", NULL, NULL, &bl),
          "tuning: the profile's results");
    CHECK(!moe_bundle_kv_f64(kv, "hobbit.t1", &t1) && !moe_bundle_kv_f64(kv, "hobbit.t2", &t2) && thr &&
              t1 == thr[0] && t2 == thr[1],
          "tuning: hobbit.t1/t2 %g %g", t1, t2);
    CHECK(!moe_bundle_kv_f64(kv, "mobile.gamma", &gamma) && bl && gamma == bl[1], "tuning: mobile.gamma %g", gamma);
    size_t n = 0;
    const int64_t *ord = moe_bundle_kv_i64_array(kv, "twiddler.placement_order", &n);
    int same = ord && order && n == (size_t)p->n_layers * p->n_experts;
    for (size_t i = 0; same && i < n; i++) same = ord[i] == order[i];
    CHECK(same, "tuning: twiddler.placement_order");
    size_t nl = 0, nk = 0, nn = 0, np = 0, nt = 0;
    const int64_t *layer = moe_bundle_kv_i64_array(kv, "edgemoe.path1.layer", &nl);
    const int64_t *keys = moe_bundle_kv_i64_array(kv, "edgemoe.path1.keys", &nk);
    const int64_t *next = moe_bundle_kv_i64_array(kv, "edgemoe.path1.next", &nn);
    const int64_t *tot = moe_bundle_kv_i64_array(kv, "edgemoe.path1.totals", &nt);
    const double *prob = moe_bundle_kv_f64_array(kv, "edgemoe.path1.prob", &np);
    int64_t top = 0, key_len = 0;
    CHECK(!moe_bundle_kv_i64(kv, "edgemoe.path1.top", &top) && !moe_bundle_kv_i64(kv, "edgemoe.path1.key_len", &key_len) &&
              key_len == p->k && top >= 1 && layer && keys && next && prob && tot && nl > 0 && nk == nl * key_len &&
              nn == nl * top && np == nn && nt == nl,
          "tuning: edgemoe.path1 arrays (%zu keys)", nl);
    if (!(layer && keys && next && prob && tot && nl && nk == nl * key_len && nn == nl * top)) goto done;
    /* the first entry: count here the tokens whose sorted layer-(l-1) set is the key */
    const int L = p->n_layers, K = p->k, E = p->n_experts;
    int l = (int)layer[0];
    int64_t count = 0, c[64] = {0};
    for (int64_t t = 0; t < moe_profile_n_tokens(p); t++) {
        int16_t prev[8];
        memcpy(prev, p->experts + ((size_t)t * L + l - 1) * K, (size_t)K * 2);
        for (int i = 1; i < K; i++) /* sort */
            for (int j = i; j > 0 && prev[j - 1] > prev[j]; j--) {
                int16_t x = prev[j];
                prev[j] = prev[j - 1], prev[j - 1] = x;
            }
        int match = 1;
        for (int j = 0; j < K; j++) match &= prev[j] == keys[j];
        if (!match) continue;
        count++;
        for (int j = 0; j < K; j++) c[p->experts[((size_t)t * L + l) * K + j]]++;
    }
    int best = 0;
    for (int e = 1; e < E; e++)
        if (c[e] > c[best]) best = e;
    CHECK(count == tot[0] && next[0] == best && fabs(prob[0] - (double)c[best] / count) < 1e-12,
          "tuning: first path entry: %lld tokens (want %lld), next %lld p %g (want %d, %g)", (long long)tot[0],
          (long long)count, (long long)next[0], prob[0], best, count ? (double)c[best] / count : 0.0);
done:
    moe_bundle_free(b);
}

/* check_shards: three shards merged equal one run; tuning, CSV, report, errors. */
static void check_shards(void) {
    char dir[512], cmd[4096], bundle[600], p1[600], s[3][600], merged[600], csv[600], html[600], tmpdir[64];
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test-profile-dir-XXXXXX");
    if (!mkdtemp(tmpdir)) return;
    snprintf(dir, sizeof dir, "%s/models/mixtral-f32", MOE_FIXTURES);
    snprintf(bundle, sizeof bundle, "%s/m.moeb", tmpdir);
    snprintf(p1, sizeof p1, "%s/single.h5", tmpdir);
    snprintf(merged, sizeof merged, "%s/merged.h5", tmpdir);
    snprintf(csv, sizeof csv, "%s/csv", tmpdir);
    snprintf(html, sizeof html, "%s/report.html", tmpdir);
    for (int i = 0; i < 3; i++) snprintf(s[i], sizeof s[i], "%s/s%d.h5", tmpdir, i + 1);
    const char *opts = "--ctx 32 --max-tokens 180 -t 2 --heldout 0.34 --big-little-every 2";
    snprintf(cmd, sizeof cmd, "%s quantize %s -o %s --experts q8_0,q4_0 >/dev/null 2>&1", moe_prep, dir, bundle);
    CHECK(run(cmd) == 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s profile %s --dataset %s -o %s %s --csv-dir %s >/dev/null 2>&1", moe_prep, bundle,
             text_path, p1, opts, csv);
    CHECK(run(cmd) == 0, "%s", cmd);
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s profile %s --dataset %s -o %s %s --shard %d/3 >/dev/null 2>&1", moe_prep, bundle,
                 text_path, s[i], opts, i + 1);
        CHECK(run(cmd) == 0, "%s", cmd);
    }
    { /* --dataset twice: the two token streams one after the other */
        char one[600], two[600];
        snprintf(one, sizeof one, "%s/one.h5", tmpdir);
        snprintf(two, sizeof two, "%s/two.h5", tmpdir);
        snprintf(cmd, sizeof cmd, "%s profile %s --dataset %s -o %s --ctx 32 -t 2 --no-tuning >/dev/null 2>&1", moe_prep,
                 bundle, text_path, one);
        CHECK(run(cmd) == 0, "%s", cmd);
        snprintf(cmd, sizeof cmd, "%s profile %s --dataset %s --dataset %s -o %s --ctx 32 -t 2 --no-tuning >/dev/null 2>&1",
                 moe_prep, bundle, text_path, text_path, two);
        CHECK(run(cmd) == 0, "%s", cmd);
        struct moe_profile *p_one = NULL, *p_two = NULL;
        if (moe_profile_read(one, &p_one) == MOE_OK && moe_profile_read(two, &p_two) == MOE_OK) {
            const int64_t n1 = moe_profile_n_tokens(p_one), n2 = moe_profile_n_tokens(p_two);
            CHECK(n1 > 0 && n2 >= 2 * n1 && n2 <= 2 * n1 + 32, "two datasets: %lld tokens, one: %lld", (long long)n2,
                  (long long)n1);
        } else {
            CHECK(0, "read the one- and two-dataset profiles");
        }
        moe_profile_free(p_one);
        moe_profile_free(p_two);
        snprintf(cmd, sizeof cmd, "%s profile %s --dataset %s --dataset %s -o %s --ctx 32 --max-tokens 64 -t 2 "
                 "--no-tuning >/dev/null 2>&1", moe_prep, bundle, text_path, text_path, two);
        CHECK(run(cmd) == 0 && moe_profile_read(two, &p_two) == MOE_OK && moe_profile_n_tokens(p_two) <= 64 + 32,
              "two datasets under --max-tokens 64");
        moe_profile_free(p_two);
    }
    snprintf(cmd, sizeof cmd, "%s profile merge %s %s %s -o %s >/dev/null 2>&1", moe_prep, s[2], s[0], s[1], merged);
    CHECK(run(cmd) == 0, "%s", cmd);
    struct moe_profile *a = NULL, *b = NULL;
    CHECK(moe_profile_read(p1, &a) == MOE_OK && moe_profile_read(merged, &b) == MOE_OK, "read single and merged");
    if (a && b) {
        const int64_t n = moe_profile_n_tokens(a), le = (int64_t)a->n_layers * a->n_experts;
        int same = a->n_seq == b->n_seq && n == moe_profile_n_tokens(b) &&
                   !memcmp(a->seq_start, b->seq_start, (size_t)(a->n_seq + 1) * 8) &&
                   !memcmp(a->experts, b->experts, (size_t)(n * a->n_layers * a->k) * 2) &&
                   !memcmp(a->weights, b->weights, (size_t)(n * a->n_layers * a->k) * 4);
        CHECK(same, "merged trace equals the single run's");
        CHECK(!memcmp(a->popularity, b->popularity, (size_t)le * 8) &&
                  !memcmp(a->seq_popularity, b->seq_popularity, (size_t)(a->n_seq * le) * 8) &&
                  !memcmp(a->hobbit_hist, b->hobbit_hist, (size_t)a->k * a->n_bins * 8),
              "merged counts (popularity, per sequence, HOBBIT scores) equal the single run's");
        static const char *const exact[] = {"sum.big_little_maxprob", "config.record", "shard", "placement_order",
                                            "placement_hit_rate", "hobbit_thresholds", "path_accuracy_order1",
                                            "path_accuracy_order2", "path_key_coverage", "reuse", "reuse_chance",
                                            "split_sequences", "big_little", "big_little_summary", "targets"};
        for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
            CHECK(same_array(a, b, exact[i], 0), "merged %s equals the single run's", exact[i]);
        /* sums of floats were added in another order */
        static const char *const near[] = {"sum.pearson", "sum.stacked", "gate_output_pearson", "layer_similarity",
                                           "stacked_top1", "stacked_recall"};
        for (size_t i = 0; i < sizeof near / sizeof *near; i++)
            CHECK(same_array(a, b, near[i], 1e-9), "merged %s equals the single run's", near[i]);
        /* the big-little histogram counts every token of sequences 0, 2, 4 */
        const int64_t *h = NULL;
        int64_t hn = 0;
        if (!moe_profile_get_i64(a, "sum.big_little_maxprob", NULL, NULL, &h))
            for (int i = 0; i < 2 * MOE_PROFILE_BL_BINS; i++) hn += h[i];
        CHECK(hn == 3 * CTX, "big-little tokens %lld, want %d", (long long)hn, 3 * CTX);
        check_tuning(bundle, a);
    }
    moe_profile_free(a);
    moe_profile_free(b);

    /* CSV */
    char path[700], line[256];
    snprintf(path, sizeof path, "%s/popularity.csv", csv);
    FILE *f = fopen(path, "r");
    int rows = 0;
    CHECK(f && fgets(line, sizeof line, f) && !strncmp(line, "layer,model_layer,expert,count", 30), "popularity.csv");
    while (f && fgets(line, sizeof line, f)) rows++;
    if (f) fclose(f);
    CHECK(rows == 2 * 8, "popularity.csv: %d rows, want 2 layers x 8 experts", rows); /* mixtral-f32 */
    static const char *const files[] = {"placement.csv", "hobbit.csv", "hobbit_hist.csv", "stacked.csv",
                                        "paths.csv",     "reuse.csv",  "big_little.csv"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", csv, files[i]);
        CHECK(access(path, R_OK) == 0, "%s written", files[i]);
    }

    /* report of the merged profile */
    snprintf(cmd, sizeof cmd, "%s profile report %s -o %s >/dev/null 2>&1 && grep -q '<svg' %s", moe_prep, merged, html,
             html);
    CHECK(run(cmd) == 0, "%s", cmd);

    /* what merge refuses */
    snprintf(cmd, sizeof cmd, "%s profile merge %s %s -o %s 2>/dev/null", moe_prep, s[0], s[2], merged);
    CHECK(run(cmd) == 1, "merge with a gap: want exit 1");
    snprintf(cmd, sizeof cmd, "%s profile merge %s %s -o %s 2>/dev/null", moe_prep, s[0], s[0], merged);
    CHECK(run(cmd) == 1, "merge of overlapping shards: want exit 1");
    snprintf(cmd, sizeof cmd, "%s profile merge %s %s -o %s 2>/dev/null", moe_prep, s[0], text_path, merged);
    CHECK(run(cmd) == 1, "merge of a text file: want exit 1");
    snprintf(path, sizeof path, "%s/foreign.h5", tmpdir);
    CHECK(moe_test_write_foreign_h5(path), "create foreign");
    snprintf(cmd, sizeof cmd, "%s profile merge %s %s -o %s 2>&1 | grep -q 'not a moe-profile'", moe_prep, s[0], path,
             merged);
    CHECK(run(cmd) == 0, "merge of a foreign HDF5 file: want a clear message");
    snprintf(cmd, sizeof cmd, "%s profile merge %s %s -o %s 2>/dev/null", moe_prep, s[0], path, merged);
    CHECK(run(cmd) == 1, "merge of a foreign HDF5 file: want exit 1");
    snprintf(cmd, sizeof cmd, "%s profile report %s -o %s 2>/dev/null", moe_prep, path, html);
    CHECK(run(cmd) == 1, "report of a foreign HDF5 file: want exit 1");
    snprintf(cmd, sizeof cmd, "%s profile report %s -o %s 2>/dev/null", moe_prep, text_path, html);
    CHECK(run(cmd) == 1, "report of a text file: want exit 1");
    snprintf(cmd, sizeof cmd, "%s profile merge -o %s 2>/dev/null", moe_prep, merged);
    CHECK(run(cmd) == 2, "merge without inputs: want exit 2");
    snprintf(cmd, sizeof cmd, "%s profile %s --dataset %s -o %s --shard 4/3 2>/dev/null", moe_prep, bundle, text_path,
             merged);
    CHECK(run(cmd) == 2, "--shard 4/3: want exit 2");
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    run(cmd);
}

/* check_library: moe_profile_record called here on the same tokens gives the
 * profile the CLI wrote (trace, counts, sums), and `profile --json` parses
 * with cJSON into keys and values that match that profile. */
static void check_library(void) {
    char dir[512], cmd[2048];
    snprintf(dir, sizeof dir, "%s/models/mixtral-f32", MOE_FIXTURES);
    snprintf(cmd, sizeof cmd, "%s profile %s --dataset %s -o %s --ctx %d --max-tokens %d -t 2 --big-little-every 2 "
             "--json >%s.json 2>/dev/null", moe_prep, dir, text_path, out_path, CTX, MAX_TOKENS, out_path);
    CHECK(run(cmd) == 0, "%s", cmd);
    struct moe_profile *cli = NULL, *lib = NULL;
    CHECK(moe_profile_read(out_path, &cli) == MOE_OK, "library: read the CLI's profile");
    struct moe_model *m = NULL;
    struct moe_model_params mp = moe_model_default_params();
    struct moe_dataset_params dp = moe_dataset_default_params();
    int32_t *ids = NULL;
    size_t n_ids = 0;
    CHECK(moe_model_load(dir, &mp, &m) == MOE_OK &&
              moe_text_load_tokens(m, NULL, text_path, &dp, MAX_TOKENS + CTX, &ids, &n_ids) == MOE_OK,
          "library: model and tokens");
    struct moe_profile_record_params rp = moe_profile_record_default_params();
    rp.n_ctx = CTX, rp.max_tokens = MAX_TOKENS, rp.n_threads = 2, rp.big_little_every = 2;
    rp.model_path = dir, rp.dataset = text_path;
    struct moe_profile_record_info info;
    CHECK(m && ids && moe_profile_record(m, ids, n_ids, &rp, &lib, &info) == MOE_OK, "moe_profile_record");
    if (cli && lib) {
        const int64_t n = moe_profile_n_tokens(lib), le = (int64_t)lib->n_layers * lib->n_experts;
        CHECK(n == MAX_TOKENS && info.tokens == n && info.seq0 == 0 && info.seq1 == 6 && info.n_seq_all == 6 &&
                  info.big_little_every == 2 && info.little_k == lib->k / 2,
              "library: info (%lld tokens, %d..%d of %d)", (long long)info.tokens, info.seq0, info.seq1,
              info.n_seq_all);
        CHECK(n == moe_profile_n_tokens(cli) && lib->n_seq == cli->n_seq &&
                  !memcmp(lib->experts, cli->experts, (size_t)(n * lib->n_layers * lib->k) * 2) &&
                  !memcmp(lib->weights, cli->weights, (size_t)(n * lib->n_layers * lib->k) * 4) &&
                  !memcmp(lib->popularity, cli->popularity, (size_t)le * 8),
              "library: the trace and counts equal the CLI's");
        static const char *const same[] = {"sum.pearson", "sum.stacked", "sum.big_little_maxprob", "config.record",
                                           "shard"};
        for (size_t i = 0; i < sizeof same / sizeof *same; i++)
            CHECK(same_array(lib, cli, same[i], 1e-12), "library: %s equals the CLI's", same[i]);
        CHECK(moe_profile_get_f64(lib, "hobbit_thresholds", NULL, NULL, NULL) != MOE_OK,
              "library: the recorder leaves the derivation to moe_profile_derive");
    }
    /* the JSON summary */
    char path[600];
    snprintf(path, sizeof path, "%s.json", out_path);
    char *text = NULL;
    size_t len = 0;
    FILE *f = fopen(path, "rb");
    if (f) {
        text = calloc(1, 1 << 20);
        len = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
        fclose(f);
    }
    cJSON *js = text && len ? cJSON_Parse(text) : NULL;
    CHECK(cJSON_IsObject(js), "profile --json parses with cJSON");
    const double *thr = NULL, *bls = NULL;
    if (js && cli && !moe_profile_get_f64(cli, "hobbit_thresholds", NULL, NULL, &thr) &&
        !moe_profile_get_f64(cli, "big_little_summary", NULL, NULL, &bls)) {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(js, "hobbit");
        const cJSON *bl = cJSON_GetObjectItemCaseSensitive(js, "big_little");
        const cJSON *shard = cJSON_GetObjectItemCaseSensitive(js, "shard");
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(js, "model")), dir) &&
                  !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(js, "arch")), cli->arch),
              "json: model and arch");
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(js, "moe_layers")) == cli->n_layers &&
                  cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(js, "experts")) == cli->n_experts &&
                  cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(js, "k")) == cli->k &&
                  cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(js, "ctx")) == CTX &&
                  cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(js, "tokens")) == MAX_TOKENS &&
                  cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(js, "sequences")) == 6,
              "json: shape and counts");
        CHECK(cJSON_GetArraySize(shard) == 3 && cJSON_GetNumberValue(cJSON_GetArrayItem(shard, 1)) == 6,
              "json: shard [0, 6, 6]");
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(h, "t1")) == thr[0] &&
                  cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(h, "t2")) == thr[1] &&
                  cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(h, "target_low")) == 0.30,
              "json: hobbit thresholds equal the profile's");
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(js, "top_experts")) == cli->n_layers &&
                  cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(js, "placement")) == 3 &&
                  cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(js, "stacked")) == 4 &&
                  cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(js, "paths")) == 2 &&
                  cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(js, "reuse")) == cli->n_layers * cli->k,
              "json: the result lists");
        CHECK(cJSON_IsObject(bl) && cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(bl, "gamma")) == bls[1] &&
                  cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(bl, "grid")) == MOE_PROFILE_BL_GAMMAS,
              "json: big_little gamma equals the profile's");
    }
    cJSON_Delete(js);
    free(text);
    unlink(path);
    moe_profile_free(cli);
    moe_profile_free(lib);
    free(ids);
    moe_model_free(m);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test-profile MOE_PREP\n");
        return 2;
    }
    moe_prep = argv[1];
    close(mkstemp(text_path));
    close(mkstemp(out_path));
    write_text();

    check_model("qwen2_moe-f32");
    check_model("mixtral-f32");
    check_model("deepseek_v3-f32"); /* groups, sigmoid + bias, a dense first layer */
    check_model("gpt_oss-f32"); /* router bias in the stacked-gate prediction */
    check_shards();
    check_library();

    /* failures and usage */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s profile %s/models/mixtral-f32 --dataset /nonexistent/text.txt -o %s 2>/dev/null",
             moe_prep, MOE_FIXTURES, out_path);
    CHECK(run(cmd) == 1, "missing dataset: want exit 1");
    snprintf(cmd, sizeof cmd, "%s profile %s/models/no-such-model --dataset %s -o %s 2>/dev/null", moe_prep,
             MOE_FIXTURES, text_path, out_path);
    CHECK(run(cmd) == 1, "bad model: want exit 1");
    snprintf(cmd, sizeof cmd, "%s profile %s --dataset %s -o %s 2>/dev/null", moe_prep, text_path, text_path, out_path);
    CHECK(run(cmd) == 1, "a text file as the model: want exit 1");
    snprintf(cmd, sizeof cmd, "%s profile %s/models/mixtral-f32 -o %s 2>/dev/null", moe_prep, MOE_FIXTURES, out_path);
    CHECK(run(cmd) == 2, "no --dataset: want exit 2");
    snprintf(cmd, sizeof cmd, "%s profile %s/models/mixtral-f32 --dataset %s -o %s --ctx x 2>/dev/null", moe_prep,
             MOE_FIXTURES, text_path, out_path);
    CHECK(run(cmd) == 2, "bad --ctx: want exit 2");
    snprintf(cmd, sizeof cmd, "%s profile --help | grep -q example", moe_prep);
    CHECK(run(cmd) == 0, "--help: want exit 0 with an example");

    unlink(text_path);
    unlink(out_path);
    if (!fails) printf("test-profile: ok (%d checks)\n", checks);
    return fails != 0;
}

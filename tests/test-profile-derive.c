/*
 * test-profile-derive.c - what a profile derives, on hand-made cases whose
 * answers are worked out in the comments:
 *   - MoBiLE: fallback ratio and agreement for gamma, the little model's
 *     agreement, and the suggested gamma for a target fallback ratio, from a
 *     hand-made histogram of the little model's top probability;
 *   - the Pearson correlation and stacked-gate accuracies from their sums, NaN
 *     where nothing was counted or a sum is absent;
 *   - the held-out split and the placement hit rate;
 *   - merging two shards (traces, counts, sum.* arrays) derives exactly what
 *     the whole run derives; shards recorded with other settings or without
 *     a sum do not merge, and the failed merge leaves the profile unchanged.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe-test.h"
#include "profile-results.h"

#define NEAR(a, b) (fabs((double)(a) - (double)(b)) < 1e-9)

/* 2 MoE layers, 4 experts, top-2; 4 sequences of 2, 1, 2, 1 tokens. */
static const int16_t EXP[6][2][2] = {
    {{0, 1}, {2, 3}}, {{0, 2}, {2, 0}}, /* sequence 0 */
    {{1, 0}, {3, 2}},                   /* sequence 1 */
    {{0, 1}, {2, 3}}, {{3, 0}, {1, 2}}, /* sequence 2 */
    {{0, 1}, {2, 1}},                   /* sequence 3 */
};
static const float W[6][2][2] = {
    {{0.75f, 0.25f}, {0.5f, 0.5f}}, {{0.5f, 0.5f}, {0.75f, 0.25f}}, {{0.875f, 0.125f}, {0.625f, 0.375f}},
    {{0.75f, 0.25f}, {0.5f, 0.5f}}, {{0.625f, 0.375f}, {0.5f, 0.5f}}, {{0.5f, 0.5f}, {0.75f, 0.25f}},
};

/* the sums one recorder would gather over sequences [s0, s1) (dyadic values, so
 * adding them in any order is exact) */
static void put_sums(struct moe_profile *p, int s0, int s1, int with_bl) {
    double pearson[6] = {0}, stacked[2 * 4 * 4] = {0};
    int64_t hist[2 * MOE_PROFILE_BL_BINS] = {0};
    for (int s = s0; s < s1; s++) {
        /* each sequence adds the points (g, y) = (s+1, 2s+1) to the Pearson sums */
        double g = s + 1, y = 2 * s + 1;
        pearson[0] += 1, pearson[1] += g, pearson[2] += y, pearson[3] += g * g, pearson[4] += y * y, pearson[5] += g * y;
        /* layer 0, distance 1: cosine 0.5, top-1 hit, recall 0.5, one token */
        stacked[0] += 0.5, stacked[1] += 1, stacked[2] += 0.5, stacked[3] += 1;
        hist[(s % 2) * MOE_PROFILE_BL_BINS + 100 * s + 50]++;
    }
    int64_t d6[1] = {6}, ds[3] = {2, 4, 4}, dh[2] = {2, MOE_PROFILE_BL_BINS}, d4[1] = {4};
    int64_t record[4] = {2, 1, 1, 4};
    CHECK(moe_profile_put_f64(p, "sum.pearson", 1, d6, pearson) == MOE_OK &&
              moe_profile_put_f64(p, "sum.stacked", 3, ds, stacked) == MOE_OK &&
              moe_profile_put_i64(p, "config.record", 1, d4, record) == MOE_OK,
          "put sums");
    if (with_bl) CHECK(moe_profile_put_i64(p, "sum.big_little_maxprob", 2, dh, hist) == MOE_OK, "put hist");
}

/* make: a profile of sequences [s0, s1) of the hand-made trace, with sums. */
static struct moe_profile *make(int s0, int s1, int with_bl) {
    static const int64_t starts[5] = {0, 2, 3, 5, 6};
    int64_t st[5];
    for (int s = s0; s <= s1; s++) st[s - s0] = starts[s] - starts[s0];
    struct moe_trace t = {2, 4, 2, s1 - s0, st, &EXP[starts[s0]][0][0], &W[starts[s0]][0][0]};
    struct moe_profile *p = NULL;
    CHECK(moe_profile_new(2, 4, 2, 0, MOE_PROFILE_LOGITS_NONE, &p) == MOE_OK, "new");
    if (!p) return NULL;
    CHECK(moe_profile_set_meta(p, "mixtral", "m", "d", "v") == MOE_OK, "meta");
    CHECK(moe_profile_add_trace(p, &t, NULL) == MOE_OK, "add trace");
    put_sums(p, s0, s1, with_bl);
    return p;
}

/* same_derived: every derived array of a equals b's bit for bit (NaN == NaN). */
static int same_derived(const struct moe_profile *a, const struct moe_profile *b) {
    if (a->n_derived != b->n_derived) return 0;
    for (int i = 0; i < a->n_derived; i++) {
        const struct moe_profile_array *x = &a->derived[i];
        const struct moe_profile_array *y = NULL;
        for (int j = 0; j < b->n_derived; j++)
            if (!strcmp(b->derived[j].name, x->name)) y = &b->derived[j];
        if (!y || x->dtype != y->dtype || x->ndims != y->ndims) return 0;
        int64_t n = 1;
        for (int d = 0; d < x->ndims; d++) {
            if (x->dims[d] != y->dims[d]) return 0;
            n *= x->dims[d];
        }
        if (memcmp(x->data, y->data, (size_t)n * (x->dtype == MOE_PROFILE_I32 ? 4 : 8))) {
            fprintf(stderr, "derived array %s differs\n", x->name);
            return 0;
        }
    }
    return 1;
}

static void test_big_little(void) {
    /* 10 tokens; the little model's top probability p and whether its top token
     * is the big model's: agree at 0.95 x4, 0.75 x2, 0.25 x1; disagree at 0.45 x2,
     * 0.65 x1. Little alone agrees on 7 of 10. */
    struct moe_profile *p = make(0, 4, 0);
    if (!p) return;
    int64_t hist[2 * MOE_PROFILE_BL_BINS] = {0}, dh[2] = {2, MOE_PROFILE_BL_BINS};
    hist[950] = 4, hist[750] = 2, hist[250] = 1;
    hist[MOE_PROFILE_BL_BINS + 450] = 2, hist[MOE_PROFILE_BL_BINS + 650] = 1;
    CHECK(moe_profile_put_i64(p, "sum.big_little_maxprob", 2, dh, hist) == MOE_OK, "hist");
    struct moe_profile_targets t = moe_profile_default_targets(); /* fallback 0.2 */
    struct moe_profile_results r;
    CHECK(moe_profile_derive(p, &t, &r) == MOE_OK, "derive");
    CHECK(r.little_k == 1 && r.bl_tokens == 10 && NEAR(r.bl_little_agree, 0.7), "little k %d, %lld tokens, agree %g",
          r.little_k, (long long)r.bl_tokens, r.bl_little_agree);
    /* gamma 0.5 (row 9): p < 0.5 for 0.45 x2 and 0.25 -> fallback 0.3; of the
     * accepted, the 0.65 one disagrees -> agreement 0.9. gamma 0.7 (row 13):
     * fallback 0.4, agreement 1. gamma 0.05 (row 0): no fallback, agreement 0.7. */
    CHECK(NEAR(r.bl[9][0], 0.5) && NEAR(r.bl[9][1], 0.3) && NEAR(r.bl[9][2], 0.9), "gamma 0.5: %g %g %g", r.bl[9][0],
          r.bl[9][1], r.bl[9][2]);
    CHECK(NEAR(r.bl[13][0], 0.7) && NEAR(r.bl[13][1], 0.4) && NEAR(r.bl[13][2], 1.0), "gamma 0.7: %g %g", r.bl[13][1],
          r.bl[13][2]);
    CHECK(NEAR(r.bl[0][0], 0.05) && NEAR(r.bl[0][1], 0) && NEAR(r.bl[0][2], 0.7), "gamma 0.05");
    /* target 0.2: fallback 0.1 (first at gamma 0.251, past the 0.25 token) and
     * 0.3 (from 0.451) are equally close; the smaller gamma wins */
    CHECK(NEAR(r.bl_gamma, 0.251) && NEAR(r.bl_fallback, 0.1) && NEAR(r.bl_agree, 0.7), "suggested %g (%g, %g)",
          r.bl_gamma, r.bl_fallback, r.bl_agree);
    const double *sum = NULL, *grid = NULL;
    int nd;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    CHECK(moe_profile_get_f64(p, "big_little_summary", &nd, dims, &sum) == MOE_OK && nd == 1 && dims[0] == 5 &&
              NEAR(sum[1], 0.251) && sum[4] == 1,
          "big_little_summary stored");
    CHECK(moe_profile_get_f64(p, "big_little", &nd, dims, &grid) == MOE_OK && nd == 2 &&
              dims[0] == MOE_PROFILE_BL_GAMMAS && dims[1] == 3 && NEAR(grid[9 * 3 + 1], 0.3),
          "big_little stored");
    moe_profile_results_free(&r);

    /* target 0.35: 0.3 and 0.4 are equally close again -> gamma 0.451 */
    t.fallback = 0.35;
    CHECK(moe_profile_derive(p, &t, &r) == MOE_OK && NEAR(r.bl_gamma, 0.451) && NEAR(r.bl_fallback, 0.3),
          "target 0.35: gamma %g", r.bl_gamma);
    moe_profile_results_free(&r);
    moe_profile_free(p);
}

static void test_sums(void) {
    struct moe_profile *p = make(0, 4, 0);
    if (!p) return;
    struct moe_profile_targets t = moe_profile_default_targets();
    struct moe_profile_results r;
    CHECK(moe_profile_derive(p, &t, &r) == MOE_OK, "derive");
    /* points (1,1) (2,3) (3,5) (4,7) lie on a line: r = 1 */
    CHECK(NEAR(r.pearson, 1.0), "pearson %g", r.pearson);
    /* layer 0 distance 1: 4 tokens, cosine 0.5 each, all top-1 hits, recall 0.5;
     * everything else was never counted -> NaN */
    CHECK(NEAR(r.sim[0], 0.5) && NEAR(r.top1[0], 1) && NEAR(r.recall[0], 0.5), "stacked %g %g %g", r.sim[0], r.top1[0],
          r.recall[0]);
    CHECK(isnan(r.sim[1]) && isnan(r.top1[4]) && isnan(r.recall[7]), "uncounted stacked entries are NaN");
    CHECK(r.little_k == 0, "no big-little histogram, no big-little results");
    /* held out: round(0.2 * 4) = 1 sequence (the last); counted on the first 3.
     * Popularity of sequences 0-2: layer 0 e0 3, e1 2, e2 1; layer 1 e2 3, e3 2,
     * e0 1: with 2 of 8 pairs resident (l0 e0, l1 e2) the held-out token
     * {0,1 | 2,1} hits 2 of 4 slots. */
    CHECK(r.n_train == 3 && r.n_held == 1, "split %d/%d", r.n_train, r.n_held);
    CHECK(NEAR(r.hit[0][1], 0.5) && NEAR(r.hit[0][2], 0.25), "hit rate at 25 %%: %g", r.hit[0][1]);
    moe_profile_results_free(&r);

    /* the same without sums: NaN, not an error */
    struct moe_profile *q = NULL;
    const int64_t starts[2] = {0, 6};
    struct moe_trace tr = {2, 4, 2, 1, starts, &EXP[0][0][0], &W[0][0][0]};
    CHECK(moe_profile_new(2, 4, 2, 0, MOE_PROFILE_LOGITS_NONE, &q) == MOE_OK && moe_profile_add_trace(q, &tr, NULL) == MOE_OK,
          "profile without sums");
    CHECK(moe_profile_derive(q, &t, &r) == MOE_OK && isnan(r.pearson) && isnan(r.top1[0]) && r.n_held == 0 &&
              isnan(r.hit[0][1]),
          "no sums, one sequence: NaN results");
    moe_profile_results_free(&r);
    /* a sum of the wrong shape is an error */
    int64_t d2[1] = {2};
    double x[2] = {0, 0};
    moe_log_set_level(MOE_LOG_ERROR + 1);
    CHECK(moe_profile_put_f64(q, "sum.pearson", 1, d2, x) == MOE_OK && moe_profile_derive(q, &t, &r) == MOE_ERR_SHAPE,
          "sum.pearson of 2 elements rejected");
    t.low = 0.9, t.skip = 0.2;
    CHECK(moe_profile_derive(p, &t, &r) == MOE_ERR_INVALID, "targets above 1 rejected");
    moe_log_set_level(MOE_LOG_INFO);
    moe_profile_free(q);
    moe_profile_free(p);
}

static void test_merge(void) {
    struct moe_profile_targets t = moe_profile_default_targets();
    struct moe_profile_results r;
    struct moe_profile *whole = make(0, 4, 1), *a = make(0, 3, 1), *b = make(3, 4, 1);
    if (!whole || !a || !b) return;
    CHECK(moe_profile_derive(a, &t, &r) == MOE_OK, "derive shard (adds derived arrays that merge must drop)");
    moe_profile_results_free(&r);
    CHECK(moe_profile_merge(a, b) == MOE_OK, "merge");
    CHECK(moe_profile_derive(a, &t, &r) == MOE_OK, "derive merged");
    moe_profile_results_free(&r);
    CHECK(moe_profile_derive(whole, &t, &r) == MOE_OK, "derive whole");
    moe_profile_results_free(&r);
    CHECK(a->n_seq == 4 && !memcmp(a->popularity, whole->popularity, 8 * sizeof(int64_t)) &&
              !memcmp(a->hobbit_hist, whole->hobbit_hist, (size_t)2 * a->n_bins * sizeof(int64_t)) &&
              !memcmp(a->experts, whole->experts, sizeof EXP),
          "merged counts and trace equal the whole run's");
    CHECK(same_derived(a, whole), "merged derived arrays (sums included) equal the whole run's");

    /* other settings: config.record differs */
    struct moe_profile *c = make(3, 4, 1);
    int64_t d4[1] = {4}, record[4] = {3, 1, 1, 4};
    CHECK(moe_profile_put_i64(c, "config.record", 1, d4, record) == MOE_OK, "config");
    struct moe_profile *d = make(0, 3, 1);
    int64_t n_seq = d->n_seq;
    moe_log_set_level(MOE_LOG_ERROR + 1);
    CHECK(moe_profile_merge(d, c) == MOE_ERR_INVALID && d->n_seq == n_seq, "other ctx: refused, unchanged");
    /* a sum missing in one shard */
    struct moe_profile *e = make(3, 4, 0);
    CHECK(moe_profile_merge(d, e) == MOE_ERR_INVALID && d->n_seq == n_seq, "missing sum: refused, unchanged");
    CHECK(moe_profile_merge(e, d) == MOE_ERR_INVALID, "missing sum, other order: refused");
    moe_log_set_level(MOE_LOG_INFO);
    moe_profile_free(c);
    moe_profile_free(d);
    moe_profile_free(e);
    moe_profile_free(whole);
    moe_profile_free(a);
    moe_profile_free(b);
}

/* write_seeds: fuzz seeds for fuzz-profile (see tests/fuzz/fuzz-profile.c). */
static int write_seeds(const char *dir) {
    char path[1024];
    struct moe_profile *p = make(0, 4, 1);
    struct moe_profile_targets t = moe_profile_default_targets();
    struct moe_profile_results r;
    if (!p || moe_profile_derive(p, &t, &r)) return 1;
    moe_profile_results_free(&r);
    snprintf(path, sizeof path, "%s/derived.h5", dir);
    if (moe_profile_write(p, path)) return 1;
    moe_profile_free(p);
    /* sums only, as a shard leaves them before derivation */
    p = make(1, 3, 1);
    snprintf(path, sizeof path, "%s/shard.h5", dir);
    if (!p || moe_profile_write(p, path)) return 1;
    moe_profile_free(p);
    /* router logits kept as f16 */
    const int64_t starts[2] = {0, 2};
    struct moe_trace tr = {2, 4, 2, 1, starts, &EXP[0][0][0], &W[0][0][0]};
    float logits[2 * 2 * 4];
    for (int i = 0; i < 16; i++) logits[i] = (float)(i % 5) - 2.0f;
    if (moe_profile_new(2, 4, 2, 16, MOE_PROFILE_LOGITS_F16, &p) || moe_profile_add_trace(p, &tr, logits)) return 1;
    snprintf(path, sizeof path, "%s/logits-f16.h5", dir);
    if (moe_profile_write(p, path)) return 1;
    moe_profile_free(p);
    printf("wrote seeds into %s\n", dir);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-seeds")) return write_seeds(argv[2]);
    test_big_little();
    test_sums();
    test_merge();
    printf("test-profile-derive: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}

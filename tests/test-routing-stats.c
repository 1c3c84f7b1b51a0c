/*
 * test-routing-stats.c - routing statistics on a hand-made trace whose answers
 * are worked out by hand in the comments: popularity and placement, HOBBIT
 * thresholds for target shares, path-dictionary probabilities, export and
 * preload accuracy, reuse, and merging dictionaries of two shards.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "moe-test.h"
#include "routing-stats.h"

/* 2 MoE layers, 4 experts, top-2; sequence 0 = tokens 0..2, sequence 1 = 3..4.
 * token: layer 0 experts (weights) | layer 1 experts (weights) */
static const int16_t EXP[5][2][2] = {
    {{0, 1}, {2, 3}}, /* t0 */
    {{0, 2}, {2, 0}}, /* t1 */
    {{1, 0}, {3, 2}}, /* t2 */
    {{0, 1}, {2, 3}}, /* t3 */
    {{3, 0}, {1, 2}}, /* t4 */
};
static const float W[5][2][2] = {
    {{0.6f, 0.4f}, {0.9f, 0.1f}}, {{0.5f, 0.5f}, {0.7f, 0.3f}}, {{0.8f, 0.2f}, {0.6f, 0.4f}},
    {{0.6f, 0.4f}, {0.9f, 0.1f}}, {{0.7f, 0.3f}, {0.5f, 0.5f}},
};

#define NEAR(a, b) (fabs((double)(a) - (double)(b)) < 1e-6)

int main(void) {
    const int64_t starts[3] = {0, 3, 5};
    struct moe_trace t = {2, 4, 2, 2, starts, &EXP[0][0][0], &W[0][0][0]};
    CHECK(moe_trace_check(&t) == MOE_OK, "valid trace");

    /* popularity: layer 0 e0 5, e1 3, e2 1, e3 1; layer 1 e2 5, e3 3, e0 1, e1 1 */
    int64_t pop[8] = {0};
    moe_popularity_count(&t, pop);
    const int64_t want_pop[8] = {5, 3, 1, 1, 1, 1, 5, 3};
    CHECK(!memcmp(pop, want_pop, sizeof pop), "popularity counts");
    int32_t order[8];
    moe_placement_order(pop, 2, 4, order);
    const int32_t want_order[8] = {0, 6, 1, 7, 2, 3, 4, 5};
    CHECK(!memcmp(order, want_order, sizeof order), "placement order (ties: lower layer, expert)");
    /* 2 resident pairs serve 10 of the 20 token-slots */
    CHECK(NEAR(moe_placement_hit_rate(&t, order, 2), 0.5), "hit rate of 2 resident");
    CHECK(NEAR(moe_placement_hit_rate(&t, order, 8), 1.0), "hit rate of all resident");

    /* HOBBIT: rank-0 scores are 0; rank-1 scores are the normalised top weight:
     * 0.6 0.9 | 0.5 0.7 | 0.8 0.6 | 0.6 0.9 | 0.7 0.5 */
    float s[20];
    moe_hobbit_scores(&t, s);
    CHECK(s[0] == 0 && NEAR(s[1], 0.6) && NEAR(s[3], 0.9) && NEAR(s[19], 0.5), "scores");
    /* skip 10 %: 2 of 20 above T2 -> T2 = 0.8; low 30 %: 8 above T1 -> T1 = 0.5 */
    struct moe_hobbit_split sp;
    CHECK(moe_hobbit_thresholds(s, 20, 0.30, 0.10, &sp) == MOE_OK, "thresholds");
    CHECK(NEAR(sp.t2, 0.8f) && NEAR(sp.t1, 0.5f), "T1 %g T2 %g, expected 0.5 0.8", sp.t1, sp.t2);
    CHECK(NEAR(sp.high, 0.6) && NEAR(sp.low, 0.3) && NEAR(sp.skip, 0.1), "split %g/%g/%g", sp.high, sp.low, sp.skip);
    moe_log_set_level(MOE_LOG_ERROR + 1); /* the errors below are expected */
    CHECK(moe_hobbit_thresholds(s, 20, 0.8, 0.3, &sp) == MOE_ERR_INVALID, "shares above 1 rejected");
    moe_log_set_level(MOE_LOG_INFO);

    /* path dictionary P(l | l-1): layer 1 keyed on the sorted layer-0 set.
     * {0,1}: t0 t2 t3 -> e2 3, e3 3; {0,2}: t1 -> e0, e2; {0,3}: t4 -> e1, e2 */
    struct moe_path_dict *d = NULL;
    CHECK(moe_path_dict_new(2, 4, 2, 1, &d) == MOE_OK && moe_path_dict_add(d, &t) == MOE_OK, "dict");
    CHECK(moe_path_dict_keys(d, 1) == 3, "3 keys at layer 1");
    CHECK(NEAR(moe_path_dict_prob(d, &t, 0, 1, 2), 1.0) && NEAR(moe_path_dict_prob(d, &t, 2, 1, 3), 1.0) &&
              NEAR(moe_path_dict_prob(d, &t, 0, 1, 0), 0.0) && NEAR(moe_path_dict_prob(d, &t, 1, 1, 0), 1.0),
          "dictionary probabilities");
    CHECK(moe_path_dict_prob(d, &t, 0, 0, 0) == -1, "layer 0 has no key");
    /* preloading m = 1, 2, 3 experts: dictionary recall 0.5, 1, 1; most popular
     * (2, 3, 0 at layer 1) 0.5, 0.8, 0.9 */
    struct moe_preload_accuracy acc;
    CHECK(moe_path_dict_accuracy(d, pop, &t, &acc) == MOE_OK, "accuracy");
    CHECK(acc.n == 5 && NEAR(acc.key_coverage, 1.0), "accuracy pairs %lld", (long long)acc.n);
    CHECK(NEAR(acc.recall[0], 0.5) && NEAR(acc.recall[1], 1.0) && NEAR(acc.recall[2], 1.0), "recall %g %g %g",
          acc.recall[0], acc.recall[1], acc.recall[2]);
    CHECK(NEAR(acc.popular[0], 0.5) && NEAR(acc.popular[1], 0.8) && NEAR(acc.popular[2], 0.9), "popular %g %g %g",
          acc.popular[0], acc.popular[1], acc.popular[2]);

    /* export, most frequent key first: {0,1} (3 tokens: e2 3/3, e3 3/3), then
     * {0,2} (e0, e2) and {0,3} (e1, e2), one token each */
    struct moe_path_export ex;
    CHECK(moe_path_dict_export(d, 1, 2, 1, 100, &ex) == MOE_OK && ex.n == 3 && ex.key_len == 2 && ex.top == 2,
          "export: %zu keys", ex.n);
    if (ex.n == 3) {
        static const int16_t want_keys[6] = {0, 1, 0, 2, 0, 3}, want_next[6] = {2, 3, 0, 2, 1, 2};
        static const int64_t want_tot[3] = {3, 1, 1};
        CHECK(!memcmp(ex.keys, want_keys, sizeof want_keys) && !memcmp(ex.totals, want_tot, sizeof want_tot) &&
                  !memcmp(ex.next, want_next, sizeof want_next),
              "export keys, totals and next experts");
        int ok = 1;
        for (int i = 0; i < 6; i++) ok &= NEAR(ex.prob[i], 1.0);
        CHECK(ok, "export probabilities");
    }
    moe_path_export_free(&ex);
    CHECK(moe_path_dict_export(d, 1, 1, 2, 100, &ex) == MOE_OK && ex.n == 1 && ex.next[0] == 2, "min_count 2");
    moe_path_export_free(&ex);
    CHECK(moe_path_dict_export(d, 1, 1, 1, 2, &ex) == MOE_OK && ex.n == 2, "max_keys 2");
    moe_path_export_free(&ex);
    CHECK(moe_path_dict_export(d, 0, 1, 1, 100, &ex) == MOE_OK && ex.n == 0, "layer 0 has no keys");
    moe_path_export_free(&ex);
    CHECK(moe_path_dict_export(d, 1, 5, 1, 100, &ex) == MOE_ERR_INVALID, "top > experts rejected");
    CHECK(moe_path_dict_export(d, 2, 1, 1, 100, &ex) == MOE_ERR_INVALID, "layer out of range rejected");

    /* shards: a dictionary of each sequence, merged, equals the whole one */
    const int64_t s0[2] = {0, 3}, s1[2] = {0, 2};
    struct moe_trace t0 = {2, 4, 2, 1, s0, &EXP[0][0][0], &W[0][0][0]};
    struct moe_trace t1 = {2, 4, 2, 1, s1, &EXP[3][0][0], &W[3][0][0]};
    struct moe_path_dict *a = NULL, *b = NULL;
    CHECK(moe_path_dict_new(2, 4, 2, 1, &a) == MOE_OK && moe_path_dict_new(2, 4, 2, 1, &b) == MOE_OK, "shards");
    CHECK(moe_path_dict_add(a, &t0) == MOE_OK && moe_path_dict_add(b, &t1) == MOE_OK, "shard add");
    CHECK(moe_path_dict_merge(a, b) == MOE_OK && moe_path_dict_keys(a, 1) == 3, "merge");
    int same = 1;
    for (int64_t i = 0; i < 5; i++)
        for (int e = 0; e < 4; e++) same &= moe_path_dict_prob(a, &t, i, 1, e) == moe_path_dict_prob(d, &t, i, 1, e);
    CHECK(same, "merged dictionary equals the single-run one");
    moe_path_dict_free(a);
    moe_path_dict_free(b);
    moe_path_dict_free(d);

    /* order 2 needs three MoE layers: none here */
    CHECK(moe_path_dict_new(2, 4, 2, 2, &d) == MOE_OK && moe_path_dict_add(d, &t) == MOE_OK, "order 2");
    CHECK(moe_path_dict_keys(d, 1) == 0, "no keys with two layers");
    moe_path_dict_free(d);

    /* reuse: within sequences, pairs (t0,t1) (t1,t2) (t3,t4); the rank-0 expert is
     * always reused, the rank-1 one never; chance K/E = 0.5 */
    double reuse[4], chance;
    moe_reuse(&t, reuse, &chance);
    CHECK(NEAR(reuse[0], 1) && NEAR(reuse[1], 0) && NEAR(reuse[2], 1) && NEAR(reuse[3], 0) && NEAR(chance, 0.5),
          "reuse %g %g %g %g", reuse[0], reuse[1], reuse[2], reuse[3]);

    /* an expert id out of range is an error, not a crash */
    int16_t bad[5][2][2];
    memcpy(bad, EXP, sizeof bad);
    bad[4][1][0] = 9;
    struct moe_trace tb = {2, 4, 2, 2, starts, &bad[0][0][0], &W[0][0][0]};
    moe_log_set_level(MOE_LOG_ERROR + 1);
    CHECK(moe_trace_check(&tb) == MOE_ERR_RANGE, "out-of-range expert");

    /* issue 17: a NaN or infinite gate weight is refused by the check, and a
     * non-finite score by the thresholds (an inf weight made a NaN score on
     * which threshold_for_share looped forever; the alarm turns a hang into a
     * failure) */
    float wbad[5][2][2];
    const float poison[3] = {NAN, INFINITY, -0.5f};
    for (int i = 0; i < 3; i++) {
        memcpy(wbad, W, sizeof wbad);
        wbad[2][1][1] = poison[i];
        struct moe_trace tw = {2, 4, 2, 2, starts, &EXP[0][0][0], &wbad[0][0][0]};
        CHECK(moe_trace_check(&tw) == MOE_ERR_RANGE, "gate weight %g refused", (double)poison[i]);
    }
    memcpy(wbad, W, sizeof wbad);
    wbad[1][0][0] = INFINITY;
    struct moe_trace ti = {2, 4, 2, 2, starts, &EXP[0][0][0], &wbad[0][0][0]};
    float si[20];
    moe_hobbit_scores(&ti, si); /* inf / inf: a NaN score */
    alarm(10);
    CHECK(moe_hobbit_thresholds(si, 20, 0.30, 0.10, &sp) == MOE_ERR_RANGE, "a NaN score is refused, not looped on");
    s[7] = INFINITY;
    CHECK(moe_hobbit_thresholds(s, 20, 0.30, 0.10, &sp) == MOE_ERR_RANGE, "an infinite score is refused");
    alarm(0);
    printf("test-routing-stats: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}

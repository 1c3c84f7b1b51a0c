/*
 * test-tuning.c - the bundle's tuning keys (runtime/offload/tuning.c, moe-tuning.h):
 *   - what the writers set, moe_tuning_read gives back (every group), an
 *     empty set gives nothing, silently, and a cache tuning written before
 *     the popularity term reads as w_pop 0 without admission;
 *   - a table of malformed keys: each is a warning naming the key and leaves
 *     its group absent, the other groups read as before, nothing crashes;
 *   - the writers refuse what the reader would refuse;
 *   - the placement order converted for the cache core's expert ids;
 *   - EdgeMoE's path table built from the keys that the profiler writes
 *     (moe_profile_tuning_paths) on a hand-made trace gives, for every token
 *     and layer, the same top-m experts as the profiler's dictionary
 *     (moe_path_dict_prob: probability > 0, most probable first, ties lower
 *     id) for keys seen at least twice, and none for keys seen once; orders
 *     1 and 2; damaged dictionaries are MOE_ERR_FORMAT, absent ones
 *     MOE_ERR_NOT_FOUND.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-test.h"
#include "moe-test-log.h"
#include "moe-tuning.h"
#include "profile-results.h"
#include "routing-stats.h"

#define L 3
#define E 4

/* full_kv: every group written through the writers, for 3 MoE layers x 4
 * experts (the bit-width map over 4 model layers, layer 1 dense). */
static struct moe_bundle_kv *full_kv(void) {
    struct moe_bundle_kv *kv = NULL;
    CHECK(moe_bundle_kv_new(&kv) == MOE_OK, "kv");
    int32_t order[L * E];
    for (int i = 0; i < L * E; i++) order[i] = (i * 5) % (L * E); /* 5 is coprime with 12: a permutation */
    int64_t map[4 * E];
    for (int l = 0; l < 4; l++)
        for (int e = 0; e < E; e++) map[l * E + e] = l == 1 ? -1 : (l + e) % 3;
    const double w[MOE_CACHE_N_WEIGHTS] = {0.5, 0.25, 0.125, 0, 0.125};
    double fh[L * E], fl[L * E];
    for (int i = 0; i < L * E; i++) fh[i] = i / 16.0, fl[i] = (L * E - i) / 32.0;
    CHECK(moe_tuning_set_profile(kv, "text:x.txt", 1234, "moe-prep 0.1") == MOE_OK &&
              moe_tuning_set_thresholds(kv, 0.25, 0.75, 0.2, 0.1) == MOE_OK &&
              moe_tuning_set_placement_order(kv, order, L * E) == MOE_OK &&
              moe_tuning_set_big_little(kv, 0.6, 0.3, 1) == MOE_OK &&
              moe_tuning_set_cache(kv, w, 1, 6, 3, "q8_0", "q2_k") == MOE_OK &&
              moe_tuning_set_cache_popularity(kv, fh, fl, L * E, 0.3) == MOE_OK &&
              moe_tuning_set_bitwidth(kv, map, 4 * E, 0.01, NAN, 0.02, 0, 999, "text:y.txt") == MOE_OK,
          "the writers");
    return kv;
}

/* all_groups: the has_* flags as a bit set. */
static int all_groups(const struct moe_tuning *t) {
    return t->has_thresholds | t->has_targets << 1 | t->has_cache_weights << 2 | t->has_cache_sizes << 3 |
           t->has_cache_precisions << 4 | t->has_placement_order << 5 | t->has_bitwidth_map << 6 |
           t->has_gamma << 7 | t->has_cache_popularity << 8;
}

/* test_round_trip: writers, then the reader. */
static void test_round_trip(void) {
    struct moe_bundle_kv *kv = full_kv();
    struct moe_tuning t;
    log_reset();
    CHECK(moe_tuning_read(kv, L, E, &t) == MOE_OK && g_n_warn == 0 && g_n_err == 0, "read (%d warnings)", g_n_warn);
    CHECK(all_groups(&t) == 0x1ff, "every group present (%#x)", all_groups(&t));
    CHECK(t.t1 == 0.25 && t.t2 == 0.75 && t.target_low == 0.2 && t.target_skip == 0.1, "thresholds");
    CHECK(t.cache_w[0] == 0.5 && t.cache_w[3] == 0 && t.cache_w[4] == 0.125 && t.cache_admit == 1 &&
              t.cache_high_experts == 6 && t.cache_low_experts == 3 &&
              !strcmp(t.cache_high_precision, "q8_0") && !strcmp(t.cache_low_precision, "q2_k"),
          "cache");
    CHECK(t.placement_order[1] == 5 && t.placement_order[11] == 7, "placement order");
    CHECK(t.cache_freq_high[3] == 3 / 16.0 && t.cache_freq_low[3] == 9 / 32.0 && t.cache_low_cost == 0.3,
          "cache popularity");
    CHECK(t.bitwidth_layers == 4 && t.bitwidth_map[E] == -1 && t.bitwidth_map[2 * E + 1] == 0, "bit-width map");
    CHECK(t.gamma == 0.6 && t.little_k == 1 && t.target_fallback == 0.3, "big-little");
    CHECK(!strcmp(moe_bundle_kv_str(kv, MOE_TUNING_PROFILE_DATASET), "text:x.txt") &&
              !strcmp(moe_bundle_kv_str(kv, MOE_TUNING_BITWIDTH_DATASET), "text:y.txt"),
          "the strings the runtime does not read are written too");
    /* the order for the cache core: MoE layers 0, 1, 2 are model layers 0, 2, 3 of 4 */
    int32_t o[4 * E];
    const int moe_layer[L] = {0, 2, 3}, bad_map[L] = {0, 3, 2};
    CHECK(moe_tuning_order_for_cache(&t, L, E, moe_layer, 4, o) == MOE_OK && o[1] == 2 * E + 1 && o[2] == 3 * E + 2 &&
              o[0] == 0 && o[L * E] == E && o[4 * E - 1] == 2 * E - 1,
          "order in model layers, the dense layer's ids last: %d %d %d", (int)o[1], (int)o[2], (int)o[L * E]);
    CHECK(moe_tuning_order_for_cache(&t, L, E, NULL, L, o) == MOE_OK && o[1] == 5, "order, same numbers");
    log_reset();
    CHECK(moe_tuning_order_for_cache(&t, L, E, bad_map, 4, o) == MOE_ERR_INVALID && g_n_err == 1 &&
              moe_tuning_order_for_cache(&t, L, E, moe_layer, 3, o) == MOE_ERR_INVALID &&
              moe_tuning_order_for_cache(&t, L, E, NULL, 4, o) == MOE_ERR_INVALID,
          "bad layer maps refused");
    double ph[4 * E], pl[4 * E];
    CHECK(moe_tuning_popularity_for_cache(&t, L, E, moe_layer, 4, ph, pl) == MOE_OK && ph[E] == 0 && pl[E + 3] == 0 &&
              ph[2 * E + 1] == (E + 1) / 16.0 && pl[3 * E] == (L * E - 2 * E) / 32.0 && ph[1] == 1 / 16.0,
          "per-need shares in model layers");
    /* removing the big-little keys */
    moe_tuning_remove_big_little(kv);
    CHECK(moe_tuning_read(kv, L, E, &t) == MOE_OK && !t.has_gamma && isnan(t.target_fallback) &&
              all_groups(&t) == 0x17f,
          "big-little removed");
    /* a bundle fitted before the popularity term: no w_pop, no admit: the four weights, w_pop 0, admission off */
    moe_bundle_kv_remove(kv, MOE_TUNING_CACHE_W_POP);
    moe_bundle_kv_remove(kv, MOE_TUNING_CACHE_ADMIT);
    moe_bundle_kv_set_f64(kv, MOE_TUNING_CACHE_W_FLD, 0.125);
    log_reset();
    CHECK(moe_tuning_read(kv, L, E, &t) == MOE_OK && t.has_cache_weights && t.cache_w[4] == 0 && t.cache_w[3] == 0.125 &&
              t.cache_admit == 0 && g_n_warn == 0,
          "four-weight tuning");
    moe_bundle_kv_free(kv);
    /* nothing: every group absent, silently */
    log_reset();
    CHECK(moe_tuning_read(NULL, L, E, &t) == MOE_OK && all_groups(&t) == 0 && g_n_warn == 0, "no tuning");
    CHECK(moe_tuning_order_for_cache(&t, L, E, NULL, L, o) == MOE_ERR_NOT_FOUND &&
              moe_tuning_popularity_for_cache(&t, L, E, NULL, L, ph, pl) == MOE_ERR_NOT_FOUND,
          "nothing to convert");
    log_reset();
    CHECK(moe_tuning_read(NULL, 0, E, &t) == MOE_ERR_INVALID && g_n_err == 1, "no layers");
    CHECK(moe_tuning_read(NULL, L, E, NULL) == MOE_ERR_INVALID, "no output");
    /* the names */
    CHECK(!strcmp(moe_tuning_cache_weight_key(2), "hobbit.cache.w_lhu") && !moe_tuning_cache_weight_key(-1) &&
              !moe_tuning_cache_weight_key(MOE_CACHE_N_WEIGHTS),
          "weight keys");
    CHECK(!strcmp(moe_tuning_path_key(2, "next"), "edgemoe.path2.next") && !moe_tuning_path_key(3, "next") &&
              !moe_tuning_path_key(1, "nope") && !strcmp(MOE_TUNING_BITWIDTH_MAP, "edgemoe.bitwidth.map"),
          "path keys");
}

/* Damage cases: what to set (after the full set), which group goes. */
enum kind { F64, I64, STR, I64A, DEL };
struct damage {
    const char *key;
    enum kind kind;
    double f;
    int64_t i;
    int a_len; /* I64A: entries, from a[] */
    int64_t a[16];
    int group; /* bit of all_groups() that must be 0 */
};

/* test_damage: each damaged key is a warning and its group absent; the
 * others stay. */
static void test_damage(void) {
    static const struct damage cases[] = {
        {MOE_TUNING_HOBBIT_T1, STR, 0, 0, 0, {0}, 1},
        {MOE_TUNING_HOBBIT_T1, F64, 0.9, 0, 0, {0}, 1},
        {MOE_TUNING_HOBBIT_T2, F64, NAN, 0, 0, {0}, 1},
        {MOE_TUNING_HOBBIT_T2, F64, 1.5, 0, 0, {0}, 1},
        {MOE_TUNING_HOBBIT_T2, DEL, 0, 0, 0, {0}, 1},
        {MOE_TUNING_HOBBIT_TARGET_LOW, F64, 0.95, 0, 0, {0}, 2},
        {MOE_TUNING_CACHE_W_LRU, F64, 0.4, 0, 0, {0}, 4},
        {MOE_TUNING_CACHE_W_FLD, F64, -0.125, 0, 0, {0}, 4},
        {MOE_TUNING_CACHE_W_LHU, DEL, 0, 0, 0, {0}, 4},
        {MOE_TUNING_CACHE_W_LFU, I64, 0, 1, 0, {0}, 4},
        {MOE_TUNING_CACHE_W_POP, F64, 0.5, 0, 0, {0}, 4},
        {MOE_TUNING_CACHE_W_POP, STR, 0, 0, 0, {0}, 4},
        {MOE_TUNING_CACHE_ADMIT, I64, 0, 2, 0, {0}, 4},
        {MOE_TUNING_CACHE_FREQ_HIGH, I64A, 0, 0, 3, {0, 0, 0}, 256},
        {MOE_TUNING_CACHE_FREQ_LOW, DEL, 0, 0, 0, {0}, 256},
        {MOE_TUNING_CACHE_LOW_COST, F64, -0.5, 0, 0, {0}, 256},
        {MOE_TUNING_CACHE_LOW_COST, F64, NAN, 0, 0, {0}, 256},
        {MOE_TUNING_CACHE_HIGH_EXPERTS, I64, 0, 13, 0, {0}, 8},
        {MOE_TUNING_CACHE_LOW_EXPERTS, I64, 0, -1, 0, {0}, 8},
        {MOE_TUNING_CACHE_LOW_EXPERTS, DEL, 0, 0, 0, {0}, 8},
        {MOE_TUNING_CACHE_HIGH_EXPERTS, F64, 6, 0, 0, {0}, 8},
        {MOE_TUNING_CACHE_LOW_PRECISION, DEL, 0, 0, 0, {0}, 16},
        {MOE_TUNING_CACHE_HIGH_PRECISION, I64, 0, 3, 0, {0}, 16},
        {MOE_TUNING_PLACEMENT_ORDER, I64A, 0, 0, 3, {0, 1, 2}, 32},
        {MOE_TUNING_PLACEMENT_ORDER, I64A, 0, 0, 12, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10}, 32},
        {MOE_TUNING_PLACEMENT_ORDER, I64A, 0, 0, 12, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12}, 32},
        {MOE_TUNING_PLACEMENT_ORDER, I64A, 0, 0, 12, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -11}, 32},
        {MOE_TUNING_PLACEMENT_ORDER, F64, 1, 0, 0, {0}, 32},
        {MOE_TUNING_BITWIDTH_MAP, I64A, 0, 0, 5, {0, 0, 0, 0, 0}, 64},
        {MOE_TUNING_BITWIDTH_MAP, I64A, 0, 0, 12, {0, 0, 0, 0, -1, -1, -1, -1, 1, 1, 1, 1}, 64},
        {MOE_TUNING_BITWIDTH_MAP, I64A, 0, 0, 12, {0, 0, 0, 0, -1, 0, -1, -1, 1, 1, 1, 1, 2, 2, 2, 2}, 64},
        {MOE_TUNING_BITWIDTH_MAP, I64A, 0, 0, 12, {0, 0, 0, 16, 1, 1, 1, 1, 2, 2, 2, 2}, 64},
        {MOE_TUNING_BITWIDTH_MAP, I64A, 0, 0, 0, {0}, 64},
        {MOE_TUNING_MOBILE_GAMMA, F64, 1.5, 0, 0, {0}, 128},
        {MOE_TUNING_MOBILE_LITTLE_K, I64, 0, 0, 0, {0}, 128},
        {MOE_TUNING_MOBILE_LITTLE_K, I64, 0, 5, 0, {0}, 128},
        {MOE_TUNING_MOBILE_LITTLE_K, DEL, 0, 0, 0, {0}, 128},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct damage *d = &cases[c];
        struct moe_bundle_kv *kv = full_kv();
        switch (d->kind) {
        case F64: moe_bundle_kv_set_f64(kv, d->key, d->f); break;
        case I64: moe_bundle_kv_set_i64(kv, d->key, d->i); break;
        case STR: moe_bundle_kv_set_str(kv, d->key, "0.5"); break;
        case I64A: moe_bundle_kv_set_i64_array(kv, d->key, d->a, (size_t)d->a_len); break;
        case DEL: moe_bundle_kv_remove(kv, d->key); break;
        }
        struct moe_tuning t;
        log_reset();
        CHECK(moe_tuning_read(kv, L, E, &t) == MOE_OK, "case %zu reads", c);
        CHECK(all_groups(&t) == (0x1ff & ~d->group), "case %zu (%s): groups %#x, want %#x", c, d->key, all_groups(&t),
              0x1ff & ~d->group);
        CHECK(g_n_warn >= 1 && g_n_err == 0, "case %zu (%s): %d warnings", c, d->key, g_n_warn);
        char key_part[64];
        snprintf(key_part, sizeof key_part, "%s", d->key);
        const char *group_word = d->group == 1     ? "threshold"
                                 : d->group == 2   ? "target"
                                 : d->group == 4   ? "weight"
                                 : d->group == 256 ? "popularity"
                                                   : "";
        CHECK(strstr(g_warn, key_part) || (group_word[0] && strstr(g_warn, group_word)) ||
                  (d->group == 8 && strstr(g_warn, "cache sizes")) || (d->group == 16 && strstr(g_warn, "precision")) ||
                  (d->group == 128 && strstr(g_warn, "MoBiLE")),
              "case %zu: the warning names %s: %s", c, d->key, g_warn);
        moe_bundle_kv_free(kv);
    }
}

/* test_shares: a per-need share outside [0, 1] is refused by the reader
 * (a warning) and by the writer. */
static void test_shares(void) {
    struct moe_bundle_kv *kv = full_kv();
    double fh[L * E], fl[L * E];
    for (int i = 0; i < L * E; i++) fh[i] = fl[i] = 0.25;
    fh[5] = 1.5;
    moe_bundle_kv_set_f64_array(kv, MOE_TUNING_CACHE_FREQ_HIGH, fh, L * E);
    struct moe_tuning t;
    log_reset();
    CHECK(moe_tuning_read(kv, L, E, &t) == MOE_OK && !t.has_cache_popularity && t.has_cache_weights && g_n_warn == 1 &&
              strstr(g_warn, "entry 5"),
          "a share of 1.5: %s", g_warn);
    log_reset();
    CHECK(moe_tuning_set_cache_popularity(kv, fh, fl, L * E, 0.3) == MOE_ERR_INVALID && g_n_err == 1,
          "the writer refuses it");
    fh[5] = 0.5;
    CHECK(moe_tuning_set_cache_popularity(kv, fh, fl, L * E, -1) == MOE_ERR_INVALID, "negative low cost");
    CHECK(moe_tuning_set_cache_popularity(kv, NULL, fl, L * E, 0.3) == MOE_ERR_INVALID, "no array");
    moe_bundle_kv_free(kv);
}

/* test_writers: what the reader refuses, the writers refuse (nothing set). */
static void test_writers(void) {
    struct moe_bundle_kv *kv = NULL;
    CHECK(moe_bundle_kv_new(&kv) == MOE_OK, "kv");
    const double bad_w[MOE_CACHE_N_WEIGHTS] = {0.5, 0.5, 0.5, 0};
    log_reset();
    CHECK(moe_tuning_set_cache(kv, bad_w, 0, 4, 2, "a", "b") == MOE_ERR_INVALID && g_n_err == 1, "weights sum 1.5");
    const double w[MOE_CACHE_N_WEIGHTS] = {1, 0, 0, 0};
    CHECK(moe_tuning_set_cache(kv, w, 0, -1, 2, "a", "b") == MOE_ERR_INVALID, "negative size");
    CHECK(moe_tuning_set_cache(kv, w, 0, 1, 2, NULL, "b") == MOE_ERR_INVALID, "no precision name");
    CHECK(moe_tuning_set_thresholds(kv, 0.8, 0.2, 0, 0) == MOE_ERR_INVALID, "T1 > T2");
    CHECK(moe_tuning_set_thresholds(kv, NAN, 0.2, 0, 0) == MOE_ERR_INVALID, "NaN T1");
    CHECK(moe_tuning_set_big_little(kv, 1.5, 0.1, 1) == MOE_ERR_INVALID, "gamma 1.5");
    CHECK(moe_tuning_set_big_little(kv, 0.5, 0.1, 0) == MOE_ERR_INVALID, "little_k 0");
    CHECK(moe_tuning_set_paths(kv, 3, 2, 3, 0, NULL, NULL, NULL, NULL, NULL) == MOE_ERR_INVALID, "order 3");
    CHECK(moe_tuning_set_paths(kv, 1, 2, 3, 1, NULL, NULL, NULL, NULL, NULL) == MOE_ERR_INVALID, "no arrays");
    CHECK(moe_tuning_set_dynamic_until(kv, 0) == MOE_ERR_INVALID && moe_tuning_set_dynamic_until(kv, 1.5) ==
              MOE_ERR_INVALID, "dynamic_until outside (0, 1]");
    CHECK(moe_bundle_kv_count(kv) == 0, "nothing set");
    /* cache.dynamic_until: written, read back, removed by NaN; a bad stored value is ignored with a warning */
    struct moe_tuning t;
    CHECK(moe_tuning_set_dynamic_until(kv, 0.7) == MOE_OK && moe_tuning_read(kv, 2, 4, &t) == MOE_OK &&
              t.dynamic_until == 0.7,
          "dynamic_until 0.7 read back (%g)", t.dynamic_until);
    CHECK(moe_tuning_set_dynamic_until(kv, NAN) == MOE_OK && moe_bundle_kv_count(kv) == 0 &&
              moe_tuning_read(kv, 2, 4, &t) == MOE_OK && isnan(t.dynamic_until),
          "NaN removes it; absent reads NaN");
    log_reset();
    CHECK(moe_bundle_kv_set_f64(kv, MOE_TUNING_DYNAMIC_UNTIL, 2.0) == MOE_OK && moe_tuning_read(kv, 2, 4, &t) == MOE_OK &&
              isnan(t.dynamic_until) && g_n_warn == 1 && strstr(g_warn, "dynamic_until"),
          "a stored 2.0 is ignored with a warning: %s", g_warn);
    moe_bundle_kv_free(kv);
}

/* ---- path tables ---- */

#define NT 40
#define LP 4
#define EP 6
#define KP 2

/* A hand-made trace: LP layers x EP experts, top-KP, NT tokens in 2
 * sequences; patterns repeat so that most keys are seen several times, a few
 * once. */
static int16_t g_ex[NT * LP * KP];
static float g_w[NT * LP * KP];

static struct moe_trace make_trace(int64_t ss[3]) {
    unsigned seed = 3;
    for (int tok = 0; tok < NT; tok++)
        for (int l = 0; l < LP; l++) {
            int16_t *x = g_ex + ((size_t)tok * LP + l) * KP;
            seed = seed * 1103515245u + 12345u;
            const int pattern = (int)((seed >> 16) % 5); /* 0..3 repeat; 4: random */
            int a, b;
            if (pattern < 4) a = (pattern + l) % EP, b = (pattern * 2 + l + 1) % EP;
            else a = (int)((seed >> 8) % EP), b = (int)((seed >> 4) % EP);
            if (b == a) b = (a + 1) % EP;
            /* rank order is not sorted order: alternate which one comes first */
            x[0] = (int16_t)(tok % 2 ? b : a), x[1] = (int16_t)(tok % 2 ? a : b);
            g_w[((size_t)tok * LP + l) * KP] = 0.6f, g_w[((size_t)tok * LP + l) * KP + 1] = 0.4f;
        }
    ss[0] = 0, ss[1] = NT / 2, ss[2] = NT;
    struct moe_trace t = {LP, EP, KP, 2, ss, g_ex, g_w};
    return t;
}

/* key_total: tokens whose sorted expert sets at layers l-order..l-1 equal token tok's. */
static int key_total(int tok, int l, int order) {
    int n = 0;
    for (int u = 0; u < NT; u++) {
        int same = 1;
        for (int o = l - order; o < l && same; o++) {
            const int16_t *x = g_ex + ((size_t)tok * LP + o) * KP, *y = g_ex + ((size_t)u * LP + o) * KP;
            same = (x[0] == y[0] && x[1] == y[1]) || (x[0] == y[1] && x[1] == y[0]);
        }
        n += same;
    }
    return n;
}

/* expected: the dictionary's m most probable experts (p > 0, ties lower id). */
static int expected(const struct moe_path_dict *d, const struct moe_trace *t, int tok, int l, int m, int32_t *out) {
    double p[EP];
    if (moe_path_dict_prob(d, t, tok, l, 0) < 0) return 0;
    for (int e = 0; e < EP; e++) p[e] = moe_path_dict_prob(d, t, tok, l, e);
    int n = 0;
    for (; n < m; n++) {
        int best = -1;
        for (int e = 0; e < EP; e++)
            if (p[e] > 0 && (best < 0 || p[e] > p[best])) best = e;
        if (best < 0) break;
        out[n] = best;
        p[best] = -1;
    }
    return n;
}

/* test_paths: the table from the profiler's keys against its dictionary. */
static void test_paths(void) {
    int64_t ss[3];
    struct moe_trace t = make_trace(ss);
    for (int order = 1; order <= 2; order++) {
        struct moe_bundle_kv *kv = NULL;
        struct moe_path_dict *d = NULL;
        struct moe_path_table *pt = NULL;
        CHECK(moe_bundle_kv_new(&kv) == MOE_OK && moe_profile_tuning_paths(kv, &t, order) == MOE_OK,
              "order %d: write the keys", order);
        CHECK(moe_path_dict_new(LP, EP, KP, order, &d) == MOE_OK && moe_path_dict_add(d, &t) == MOE_OK, "dictionary");
        log_reset();
        CHECK(moe_path_table_from_tuning(kv, order, LP, EP, KP, &pt) == MOE_OK && pt && g_n_warn == 0,
              "order %d: the table (%d warnings)", order, g_n_warn);
        const int top = 3; /* max(3, K) */
        int compared = 0, once = 0, differ = 0;
        for (int tok = 0; pt && tok < NT; tok++)
            for (int l = 0; l < LP; l++) {
                int32_t prev[2 * KP], got[EP], want[EP];
                for (int j = 0; j < order * KP && l >= order; j++)
                    prev[j] = g_ex[((size_t)tok * LP + l - order) * KP + j];
                if (l < order) {
                    prev[0] = prev[1] = prev[2] = prev[3] = 0;
                    differ += moe_path_table_lookup(pt, l, prev, 3, got) != 0;
                    continue;
                }
                const int total = key_total(tok, l, order);
                for (int m = 1; m <= top; m++) {
                    int ng = moe_path_table_lookup(pt, l, prev, m, got);
                    int nw = expected(d, &t, tok, l, m, want);
                    if (total < 2) { /* not exported: the dictionary knows it, the table does not */
                        once += nw > 0;
                        differ += ng != 0;
                        continue;
                    }
                    compared++;
                    differ += ng != nw || memcmp(got, want, sizeof *got * (size_t)ng) != 0;
                }
            }
        CHECK(differ == 0, "order %d: the table's top-m lists equal the dictionary's (%d differ)", order, differ);
        CHECK(compared > 40 && once > 0, "order %d: %d lists compared, %d keys seen once", order, compared, once);
        CHECK(moe_path_table_entries(pt) > 0, "entries");
        /* keys with an expert out of range, or a layer below the order: nothing */
        const int32_t badprev[4] = {0, EP, 1, 2};
        int32_t got[3];
        CHECK(moe_path_table_lookup(pt, LP - 1, badprev, 3, got) == 0 && moe_path_table_lookup(pt, LP, badprev, 3, got) == 0 &&
                  moe_path_table_lookup(pt, 2, NULL, 3, got) == 0 && moe_path_table_lookup(NULL, 2, badprev, 3, got) == 0,
              "bad lookups give nothing");
        moe_path_table_free(pt);
        moe_path_dict_free(d);
        moe_bundle_kv_free(kv);
    }
}

/* test_path_damage: absent, incomplete or damaged dictionaries. */
static void test_path_damage(void) {
    int64_t ss[3];
    struct moe_trace t = make_trace(ss);
    struct moe_path_table *pt = NULL;
    struct moe_bundle_kv *kv = NULL;
    CHECK(moe_bundle_kv_new(&kv) == MOE_OK, "kv");
    log_reset();
    CHECK(moe_path_table_from_tuning(kv, 1, LP, EP, KP, &pt) == MOE_ERR_NOT_FOUND && !pt && g_n_warn == 0 &&
              g_n_err == 0,
          "absent: not found, not logged");
    CHECK(moe_path_table_from_tuning(NULL, 2, LP, EP, KP, &pt) == MOE_ERR_NOT_FOUND, "no kv: not found");
    moe_bundle_kv_free(kv);
    /* damage: field, index, value (i64 arrays / scalars) */
    struct {
        const char *field;
        int index;
        int64_t v;
        const char *what;
    } cases[] = {
        {"key_len", -1, 3, "key length 3 for top-2"},
        {"top", -1, 0, "top 0"},
        {"top", -1, EP + 1, "top above the experts"},
        {"layer", 0, 0, "a layer below the order"},
        {"layer", 0, LP, "a layer past the model"},
        {"keys", 0, EP, "an expert id out of range"},
        {"keys", 1, -1, "a negative expert id"},
        {"next", 0, EP, "a next expert out of range"},
        {"totals", 0, 0, "a total of 0"},
        {"layer", -2, 0, "a shorter layer array"},
        {"prob", -3, 0, "a probability array of the wrong type"},
        {"next", -4, 0, "a missing key"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CHECK(moe_bundle_kv_new(&kv) == MOE_OK && moe_profile_tuning_paths(kv, &t, 1) == MOE_OK, "write");
        const char *key = moe_tuning_path_key(1, cases[c].field);
        size_t n = 0;
        if (cases[c].index == -1) {
            moe_bundle_kv_set_i64(kv, key, cases[c].v);
        } else if (cases[c].index == -3) {
            moe_bundle_kv_set_i64(kv, key, 1);
        } else if (cases[c].index == -4) {
            moe_bundle_kv_remove(kv, key);
        } else {
            const int64_t *a = moe_bundle_kv_i64_array(kv, key, &n);
            int64_t *copy = malloc(sizeof *copy * (n ? n : 1));
            if (a && copy && n) {
                memcpy(copy, a, sizeof *copy * n);
                if (cases[c].index >= 0) copy[cases[c].index] = cases[c].v;
                moe_bundle_kv_set_i64_array(kv, key, copy, cases[c].index == -2 ? n - 1 : n);
            }
            free(copy);
        }
        log_reset();
        pt = (struct moe_path_table *)kv;
        CHECK(moe_path_table_from_tuning(kv, 1, LP, EP, KP, &pt) == MOE_ERR_FORMAT && !pt && g_n_warn >= 1,
              "%s: refused with a warning (%d)", cases[c].what, g_n_warn);
        moe_bundle_kv_free(kv);
    }
    /* an unsorted key, a repeated entry, increasing probabilities */
    const int64_t layer[2] = {1, 1}, keys[4] = {0, 1, 0, 1}, totals[2] = {3, 2}, next[6] = {2, 3, 4, 2, 3, 4};
    const double prob[6] = {0.5, 0.25, 0.25, 0.5, 0.25, 0};
    for (int c = 0; c < 3; c++) {
        int64_t k2[4], l2[2];
        double p2[6];
        memcpy(k2, keys, sizeof k2), memcpy(l2, layer, sizeof l2), memcpy(p2, prob, sizeof p2);
        if (c == 0) k2[0] = 1, k2[1] = 0, l2[1] = 2;  /* unsorted */
        if (c == 2) l2[1] = 2, p2[1] = 0.75;          /* most probable not first */
        CHECK(moe_bundle_kv_new(&kv) == MOE_OK && moe_tuning_set_paths(kv, 1, 2, 3, 2, l2, k2, totals, next, p2) == MOE_OK,
              "write");
        log_reset();
        CHECK(moe_path_table_from_tuning(kv, 1, LP, EP, KP, &pt) == MOE_ERR_FORMAT && g_n_warn == 1,
              "hand-made case %d refused", c);
        moe_bundle_kv_free(kv);
    }
    /* the same, well formed: a lookup in any rank order */
    CHECK(moe_bundle_kv_new(&kv) == MOE_OK, "kv");
    const int64_t l3[2] = {1, 2};
    CHECK(moe_tuning_set_paths(kv, 1, 2, 3, 2, l3, keys, totals, next, prob) == MOE_OK &&
              moe_path_table_from_tuning(kv, 1, LP, EP, KP, &pt) == MOE_OK,
          "hand-made table");
    const int32_t p01[2] = {1, 0};
    int32_t got[3] = {-1, -1, -1};
    CHECK(moe_path_table_lookup(pt, 1, p01, 3, got) == 3 && got[0] == 2 && got[1] == 3 && got[2] == 4, "layer 1");
    CHECK(moe_path_table_lookup(pt, 2, p01, 3, got) == 2 && got[0] == 2 && got[1] == 3, "layer 2: p = 0 dropped");
    CHECK(moe_path_table_lookup(pt, 2, p01, 1, got) == 1 && got[0] == 2, "m = 1");
    CHECK(moe_path_table_lookup(pt, 3, p01, 3, got) == 0, "an unseen key");
    moe_path_table_free(pt);
    moe_path_table_free(NULL);
    log_reset();
    CHECK(moe_path_table_from_tuning(kv, 1, LP, EP, 7, &pt) == MOE_ERR_INVALID && g_n_err == 1, "k > experts");
    CHECK(moe_path_table_from_tuning(kv, 2, LP, EP, KP, &pt) == MOE_ERR_NOT_FOUND, "order 2 absent");
    CHECK(moe_path_table_from_tuning(kv, 1, LP, EP, 3, &pt) == MOE_ERR_FORMAT, "the model's k differs");
    moe_bundle_kv_free(kv);
}

int main(void) {
    moe_log_set(capture, NULL);
    test_round_trip();
    test_damage();
    test_shares();
    test_writers();
    test_paths();
    test_path_damage();
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}

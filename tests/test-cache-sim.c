/*
 * test-cache-sim.c - the expert-cache simulator (tools/common/cache-sim.c)
 * on hand-made traces whose outcomes are worked out in the comments: LRU,
 * LFU per sequence and global (cache contents kept, records reset at a new
 * sequence), LHU, forward layer distance, EdgeMoE's -f/d, Twiddler's static
 * placement, HOBBIT (its weight corners and its layer term), Belady with
 * bypass; HOBBIT's precision rule (high / low / skip, the top-1 always high,
 * a high copy serving a low need); the prompt batch; prefetch with
 * protection; the byte and penalty counts; and properties on random traces:
 * no policy beats Belady where Belady is optimal (one precision), HOBBIT's
 * corners equal LRU / LFU / LHU, the fit is no worse than any grid corner.
 * Bad arguments are errors, never crashes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache-sim.h"
#include "moe-test.h"
#include "moe-test-log.h"

#define MAX_TOK 64
#define MAX_SLOT (MAX_TOK * 8 * 4)

/* A hand-made trace: rows of K experts and weights per (token, layer). */
struct tt {
    int L, E, K, n_seq;
    int64_t seq_start[16];
    int16_t experts[MAX_SLOT];
    float weights[MAX_SLOT];
    int n_tok;
};

/* tt_init: an empty trace of the given shape. */
static void tt_init(struct tt *t, int L, int E, int K) {
    memset(t, 0, sizeof *t);
    t->L = L, t->E = E, t->K = K;
}

/* tt_tok: append one token: experts x[L*K] and weights w[L*K] (NULL: all 1/K,
 * so every rank has s <= (K-1)/K). */
static void tt_tok(struct tt *t, const int *x, const float *w) {
    for (int i = 0; i < t->L * t->K; i++) {
        t->experts[t->n_tok * t->L * t->K + i] = (int16_t)x[i];
        t->weights[t->n_tok * t->L * t->K + i] = w ? w[i] : 1.0f / t->K;
    }
    t->n_tok++;
}

/* tt_seq: close the current sequence. */
static void tt_seq(struct tt *t) { t->seq_start[++t->n_seq] = t->n_tok; }

/* tt_view: the struct moe_trace of t. */
static struct moe_trace tt_view(const struct tt *t) {
    struct moe_trace v = {t->L, t->E, t->K, t->n_seq, t->seq_start, t->experts, t->weights};
    return v;
}

/* prep: the prepared trace of all of t. */
static struct moe_cache_trace *prep(const struct tt *t, double t1, double t2, int prompt_len) {
    struct moe_trace v = tt_view(t);
    struct moe_cache_trace_params pp = moe_cache_trace_default_params();
    pp.t1 = t1, pp.t2 = t2, pp.prompt_len = prompt_len;
    struct moe_cache_trace *tr = NULL;
    CHECK(moe_cache_trace_new(&v, NULL, 0, &pp, &tr) == MOE_OK, "prepare");
    return tr;
}

/* sim: replay tr under p with caches hi, lo (low cost 0.25, bytes 100 / 25). */
static struct moe_cache_stats sim(const struct moe_cache_trace *tr, enum moe_cache_policy p, int hi, int lo,
                                  const double *w) {
    struct moe_cache_config c = moe_cache_default_config();
    c.high_cap = hi, c.low_cap = lo, c.low_cost = 0.25, c.high_bytes = 100, c.low_bytes = 25;
    if (w) memcpy(c.w, w, sizeof c.w);
    struct moe_cache_stats s;
    memset(&s, 0, sizeof s);
    if (tr) CHECK(moe_cache_simulate(tr, p, &c, &s) == MOE_OK, "simulate %s", moe_cache_policy_name(p));
    CHECK(s.accesses == s.hits_high + s.hits_low + s.misses_high + s.misses_low + s.skips,
          "%s: the counts add up", moe_cache_policy_name(p));
    return s;
}

/* hm: hits (both caches) and misses (both copies) are as expected. */
#define HM(s, h, m, what)                                                                              \
    CHECK((s).hits_high + (s).hits_low == (h) && (s).misses_high + (s).misses_low == (m),             \
          "%s: %lld hits, %lld misses; want %d, %d", what, (long long)((s).hits_high + (s).hits_low), \
          (long long)((s).misses_high + (s).misses_low), h, m)

/* one_layer: a 1-layer, K=1 trace of the experts x[0..n), one sequence. */
static void one_layer(struct tt *t, int E, const int *x, int n) {
    tt_init(t, 1, E, 1);
    for (int i = 0; i < n; i++) tt_tok(t, &x[i], NULL);
    tt_seq(t);
}

/* test_lru_belady: 0 1 2 0 3 0 1 through 2 slots, one precision.
 * LRU: 0m {0}, 1m {0,1}, 2m evicts 0 {1,2}, 0m evicts 1 {2,0}, 3m evicts 2
 * {0,3}, 0 hit, 1m evicts 3 {0,1}: 1 hit, 6 misses.
 * Belady with bypass: 0m, 1m {0,1}; 2 is never used again while 0 (next at
 * 3) and 1 (at 6) are: bypassed; 0 hit; 3 never again: bypassed; 0 hit,
 * 1 hit: 3 hits, 4 misses. */
static void test_lru_belady(void) {
    struct tt t;
    const int x[7] = {0, 1, 2, 0, 3, 0, 1};
    one_layer(&t, 4, x, 7);
    struct moe_cache_trace *tr = prep(&t, 1, 1, 0);
    struct moe_cache_stats s = sim(tr, MOE_CACHE_LRU, 2, 0, NULL);
    HM(s, 1, 6, "lru");
    CHECK(s.penalty == 6 && s.bytes == 600 && s.tokens == 7 && s.accesses == 7, "lru penalty %g bytes %g", s.penalty,
          s.bytes);
    s = sim(tr, MOE_CACHE_BELADY, 2, 0, NULL);
    HM(s, 3, 4, "belady");
    /* no room at all: every access misses, nothing is kept */
    s = sim(tr, MOE_CACHE_LRU, 0, 0, NULL);
    HM(s, 0, 7, "lru without a cache");
    moe_cache_trace_free(tr);
}

/* test_lfu: 0 0 0 1 2 0 through 2 slots.
 * LRU: 0m, 0h, 0h, 1m {0,1}, 2m evicts 0 (least recent) {1,2}, 0m: 2 hits,
 * 4 misses. LFU: 2 evicts 1 (1 use against 3) {0,2}, 0 hit: 3 hits, 3 misses. */
static void test_lfu(void) {
    struct tt t;
    const int x[6] = {0, 0, 0, 1, 2, 0};
    one_layer(&t, 4, x, 6);
    struct moe_cache_trace *tr = prep(&t, 1, 1, 0);
    struct moe_cache_stats s = sim(tr, MOE_CACHE_LRU, 2, 0, NULL);
    HM(s, 2, 4, "lru");
    s = sim(tr, MOE_CACHE_LFU_SEQ, 2, 0, NULL);
    HM(s, 3, 3, "lfu-seq");
    s = sim(tr, MOE_CACHE_LFU_GLOBAL, 2, 0, NULL);
    HM(s, 3, 3, "lfu-global");
    moe_cache_trace_free(tr);
}

/* test_sequences: sequence A = 0 0 0 1, sequence B = 1 2 0, 2 slots.
 * A (both LFUs): 0m 0h 0h 1m -> {0,1}; counts 0:3, 1:1.
 * B, cache contents kept: 1 hits in both.
 *   global counts (0:3, 1:2): 2m evicts 1 {0,2}; 0 hits. A 2h 2m, B 2h 1m.
 *   per-sequence counts reset (0:0, 1:1): 2m evicts 0 {1,2}; 0m evicts 1
 *   (1 use each, 1 older) {2,0}. A 2h 2m, B 1h 2m. */
static void test_sequences(void) {
    struct tt t;
    tt_init(&t, 1, 4, 1);
    const int a[4] = {0, 0, 0, 1}, b[3] = {1, 2, 0};
    for (int i = 0; i < 4; i++) tt_tok(&t, &a[i], NULL);
    tt_seq(&t);
    for (int i = 0; i < 3; i++) tt_tok(&t, &b[i], NULL);
    tt_seq(&t);
    struct moe_cache_trace *tr = prep(&t, 1, 1, 0);
    struct moe_cache_stats s = sim(tr, MOE_CACHE_LFU_GLOBAL, 2, 0, NULL);
    HM(s, 4, 3, "lfu-global over two sequences");
    s = sim(tr, MOE_CACHE_LFU_SEQ, 2, 0, NULL);
    HM(s, 3, 4, "lfu-seq over two sequences");
    /* HOBBIT with w_lfu = 1 is the per-sequence LFU: its records reset too */
    const double w[MOE_CACHE_N_WEIGHTS] = {0, 1, 0, 0};
    s = sim(tr, MOE_CACHE_HOBBIT, 2, 0, w);
    HM(s, 3, 4, "hobbit w_lfu = 1 over two sequences");
    moe_cache_trace_free(tr);
}

/* test_precision: 1 layer, 4 experts, top-2, T1 0.5, T2 0.7; weights
 * (0.6, 0.4) make rank 1 low (s = 0.6), (0.8, 0.2) skip it (s = 0.8),
 * (0.5, 0.5) keep it high. One high and one low slot, LRU:
 *   t0 (0 H, 1 L): miss high {0} | miss low [1]
 *   t1 (1 H, 0 L): 1 is low-cached but needs high: miss high {1}; 0 is not
 *                  cached: miss low [0]
 *   t2 (2 H, 1 S): miss high {2}; 1 cached nowhere: skip
 *   t3 (0 H, 2 L): low copy of 0 cannot serve high: miss high {0};
 *                  2 not cached: miss low [2]
 *   t4 (0 H, 3 S): hit high; skip
 *   t5 (1 H, 2 L): miss high {1}; hit low
 * hits high 1, low 1, misses high 5, low 3, skips 2; penalty 5 + 0.25 * 3,
 * bytes 5 * 100 + 3 * 25. */
static void test_precision(void) {
    struct tt t;
    tt_init(&t, 1, 4, 2);
    const int x[6][2] = {{0, 1}, {1, 0}, {2, 1}, {0, 2}, {0, 3}, {1, 2}};
    const float lo[2] = {0.6f, 0.4f}, sk[2] = {0.8f, 0.2f}, hh[2] = {0.5f, 0.5f};
    const float *w[6] = {lo, lo, sk, lo, sk, lo};
    for (int i = 0; i < 6; i++) tt_tok(&t, x[i], w[i]);
    tt_seq(&t);
    struct moe_cache_trace *tr = prep(&t, 0.5, 0.7, 0);
    struct moe_cache_trace_info in;
    moe_cache_trace_info(tr, &in);
    CHECK(in.need[MOE_CACHE_NEED_HIGH] == 6 && in.need[MOE_CACHE_NEED_LOW] == 4 && in.need[MOE_CACHE_NEED_SKIP] == 2,
          "needs %lld high, %lld low, %lld skip", (long long)in.need[2], (long long)in.need[1], (long long)in.need[0]);
    struct moe_cache_stats s = sim(tr, MOE_CACHE_LRU, 1, 1, NULL);
    CHECK(s.hits_high == 1 && s.hits_low == 1 && s.misses_high == 5 && s.misses_low == 3 && s.skips == 2,
          "precision rule: hits %lld/%lld misses %lld/%lld skips %lld", (long long)s.hits_high,
          (long long)s.hits_low, (long long)s.misses_high, (long long)s.misses_low, (long long)s.skips);
    CHECK(fabs(s.penalty - 5.75) < 1e-12 && fabs(s.bytes - 575) < 1e-9, "penalty %g bytes %g", s.penalty, s.bytes);
    CHECK(fabs(moe_cache_hit_ratio(&s) - 2.0 / 12) < 1e-12, "hit ratio = hits / accesses");
    moe_cache_trace_free(tr);

    /* a cached high copy serves every need: two high slots, no low slot.
     * t0 (0 H, 1 H) both miss; t1 (0 H, 1 L) both hit high; t2 (1 H, 0 S)
     * both hit high (the skip-level need is served since a copy is there). */
    tt_init(&t, 1, 4, 2);
    const int y[3][2] = {{0, 1}, {0, 1}, {1, 0}};
    const float *v[3] = {hh, lo, sk};
    for (int i = 0; i < 3; i++) tt_tok(&t, y[i], v[i]);
    tt_seq(&t);
    tr = prep(&t, 0.5, 0.7, 0);
    s = sim(tr, MOE_CACHE_LRU, 2, 0, NULL);
    CHECK(s.hits_high == 4 && s.misses_high == 2 && s.skips == 0 && s.hits_low == 0, "high serves all: %lld hits",
          (long long)s.hits_high);
    moe_cache_trace_free(tr);

    /* the top-1 is high whatever the thresholds: T1 = T2 = -0.5 */
    tr = prep(&t, -0.5, -0.5, 0);
    moe_cache_trace_info(tr, &in);
    CHECK(in.need[MOE_CACHE_NEED_HIGH] == 3 && in.need[MOE_CACHE_NEED_SKIP] == 3, "top-1 always high");
    moe_cache_trace_free(tr);
}

/* test_lhu: 1 layer, top-2, T1 0.5 (weights (0.6, 0.4): rank 1 low;
 * (0.5, 0.5): both high), two high slots, no low slot (low misses load a
 * copy that is not kept):
 *   t0 (1 H, 0 H) both miss {1,0}
 *   t1 (0 H, 1 L) both hit;  t2 (0 H, 1 L) both hit
 *   t3 (1 H, 2 L) hit; miss low
 *   uses: 0 three (3 high), 1 four (2 high); 0 last used at t2, 1 at t3
 *   t4 (3 H, 2 L): LFU evicts 0 (3 uses < 4), LHU evicts 1 (2 high < 3);
 *                  miss low
 *   t5 (1 H, 2 L): LFU hits, LHU misses; miss low
 * LFU-seq: 6 hits, 3 high misses; LHU: 5 hits, 4 high misses; 3 low misses. */
static void test_lhu(void) {
    struct tt t;
    tt_init(&t, 1, 4, 2);
    const int x[6][2] = {{1, 0}, {0, 1}, {0, 1}, {1, 2}, {3, 2}, {1, 2}};
    const float lo[2] = {0.6f, 0.4f}, hh[2] = {0.5f, 0.5f};
    const float *w[6] = {hh, lo, lo, lo, lo, lo};
    for (int i = 0; i < 6; i++) tt_tok(&t, x[i], w[i]);
    tt_seq(&t);
    struct moe_cache_trace *tr = prep(&t, 0.5, 1, 0);
    struct moe_cache_stats s = sim(tr, MOE_CACHE_LFU_SEQ, 2, 0, NULL);
    CHECK(s.hits_high == 6 && s.misses_high == 3 && s.misses_low == 3, "lfu-seq: %lld hits, %lld high misses",
          (long long)s.hits_high, (long long)s.misses_high);
    s = sim(tr, MOE_CACHE_LHU, 2, 0, NULL);
    CHECK(s.hits_high == 5 && s.misses_high == 4 && s.misses_low == 3, "lhu: %lld hits, %lld high misses",
          (long long)s.hits_high, (long long)s.misses_high);
    const double w_lhu[MOE_CACHE_N_WEIGHTS] = {0, 0, 1, 0};
    s = sim(tr, MOE_CACHE_HOBBIT, 2, 0, w_lhu);
    CHECK(s.hits_high == 5 && s.misses_high == 4, "hobbit w_lhu = 1 is LHU");
    moe_cache_trace_free(tr);
}

/* test_layers: 3 layers x 2 experts, top-1, expert 0 at every layer, two
 * tokens; ids g = 2 l: g0, g2, g4. Two slots.
 * LRU: t0 g0m g2m g4m (evicts g0); t1 g0m (evicts g2), g2m (evicts g4),
 *   g4m: 0 hits, 6 misses.
 * FLD, d = ((l_t - l - 1 + 3) mod 3) + 1: at t0 layer 2, g0 has d 1 and g2
 *   d 2: evict g2 {g0,g4}; t1 g0 hit; layer 1: g0 d 2, g4 d 1: evict g0
 *   {g4,g2}; g4 hit: 2 hits, 4 misses.
 * HOBBIT w_fld = 1 (evict the lowest 1 - ((l_t - l + 3) mod 3) / 3): at
 *   layer 2, g0 2/3, g2 1/3: evict g2; at layer 1 g0 1/3, g4 2/3: evict g0:
 *   the same 2 hits, 4 misses.
 * EdgeMoE with f = (g0 0.1, g2 1, g4 1), evict the lowest f/d: layer 2:
 *   g0 0.1/1, g2 1/2: evict g0 {g2,g4}; t1 layer 0: g2 1/1, g4 1/2: evict
 *   g4 {g2,g0}; g2 hit; layer 2: g2 1/2, g0 0.1/1: evict g0: 1 hit, 5 misses. */
static void test_layers(void) {
    struct tt t;
    tt_init(&t, 3, 2, 1);
    const int x[3] = {0, 0, 0};
    tt_tok(&t, x, NULL);
    tt_tok(&t, x, NULL);
    tt_seq(&t);
    struct moe_cache_trace *tr = prep(&t, 1, 1, 0);
    struct moe_cache_stats s = sim(tr, MOE_CACHE_LRU, 2, 0, NULL);
    HM(s, 0, 6, "lru over layers");
    s = sim(tr, MOE_CACHE_FLD, 2, 0, NULL);
    HM(s, 2, 4, "fld");
    const double w[MOE_CACHE_N_WEIGHTS] = {0, 0, 0, 1};
    s = sim(tr, MOE_CACHE_HOBBIT, 2, 0, w);
    HM(s, 2, 4, "hobbit w_fld = 1");
    struct moe_cache_config c = moe_cache_default_config();
    const double f[6] = {0.1, 0, 1, 0, 1, 0};
    c.high_cap = 2, c.freq = f;
    CHECK(moe_cache_simulate(tr, MOE_CACHE_EDGEMOE, &c, &s) == MOE_OK, "edgemoe");
    HM(s, 1, 5, "edgemoe");
    moe_cache_trace_free(tr);
}

/* test_static: Twiddler, order 2 0 1 3: one high slot pinned to 2, one low
 * slot pinned to 0's low copy; a pinned copy is loaded by the first access
 * needing its precision, other misses go through a scratch slot and are not
 * kept. T1 0.5, T2 0.7:
 *   t0 (2 H, 0 L): miss high (2 pinned now), miss low (0's low copy pinned)
 *   t1 (0 H, 2 L): miss high (scratch), hit high
 *   t2 (1 H, 3 S): miss high, skip       t3 (3 H, 0 S): miss high, hit low
 *   t4 (1 H, 3 S): miss high, skip (nothing was kept)
 *   t5 (2 H, 0 L): hit high, hit low
 * hits high 2, low 2, misses high 5, low 1, skips 2. */
static void test_static(void) {
    struct tt t;
    tt_init(&t, 1, 4, 2);
    const int x[6][2] = {{2, 0}, {0, 2}, {1, 3}, {3, 0}, {1, 3}, {2, 0}};
    const float lo[2] = {0.6f, 0.4f}, sk[2] = {0.8f, 0.2f};
    const float *w[6] = {lo, lo, sk, sk, sk, lo};
    for (int i = 0; i < 6; i++) tt_tok(&t, x[i], w[i]);
    tt_seq(&t);
    struct moe_cache_trace *tr = prep(&t, 0.5, 0.7, 0);
    struct moe_cache_config c = moe_cache_default_config();
    const int32_t order[4] = {2, 0, 1, 3};
    c.high_cap = 1, c.low_cap = 1, c.order = order;
    struct moe_cache_stats s;
    CHECK(moe_cache_simulate(tr, MOE_CACHE_STATIC, &c, &s) == MOE_OK, "static");
    CHECK(s.hits_high == 2 && s.hits_low == 2 && s.misses_high == 5 && s.misses_low == 1 && s.skips == 2,
          "static: hits %lld/%lld misses %lld/%lld skips %lld", (long long)s.hits_high, (long long)s.hits_low,
          (long long)s.misses_high, (long long)s.misses_low, (long long)s.skips);
    c.order = NULL;
    log_reset();
    CHECK(moe_cache_simulate(tr, MOE_CACHE_STATIC, &c, &s) == MOE_ERR_INVALID && g_n_err == 1,
          "static without an order is refused");
    moe_cache_trace_free(tr);
}

/* test_batch: prompt_len 3 of a 4-token sequence, 1 layer, top-2, T1 0.5,
 * T2 0.7: prompt tokens (0 H, 1 L), (1 H, 2 H), (0 H, 3 S) form one step
 * needing 0 H, 1 H (the highest of L and H), 2 H, 3 S in expert order; then
 * the token (2 H, 3 L). Two high slots, one low, LRU: 0m, 1m, 2m evicts 0,
 * 3 skipped; 2 hit, 3 low miss. */
static void test_batch(void) {
    struct tt t;
    tt_init(&t, 1, 4, 2);
    const int x[4][2] = {{0, 1}, {1, 2}, {0, 3}, {2, 3}};
    const float lo[2] = {0.6f, 0.4f}, sk[2] = {0.8f, 0.2f}, hh[2] = {0.5f, 0.5f};
    const float *w[4] = {lo, hh, sk, lo};
    for (int i = 0; i < 4; i++) tt_tok(&t, x[i], w[i]);
    tt_seq(&t);
    struct moe_cache_trace *tr = prep(&t, 0.5, 0.7, 3);
    struct moe_cache_trace_info in;
    moe_cache_trace_info(tr, &in);
    CHECK(in.steps == 2 && in.accesses == 6 && in.tokens == 4, "batch: %lld steps, %lld accesses, %lld tokens",
          (long long)in.steps, (long long)in.accesses, (long long)in.tokens);
    CHECK(in.need[2] == 4 && in.need[1] == 1 && in.need[0] == 1, "batch needs");
    struct moe_cache_stats s = sim(tr, MOE_CACHE_LRU, 2, 1, NULL);
    CHECK(s.misses_high == 3 && s.hits_high == 1 && s.skips == 1 && s.misses_low == 1, "batch replay");
    moe_cache_trace_free(tr);
    /* a prompt longer than the sequence: the whole sequence is one batch */
    tr = prep(&t, 0.5, 0.7, 100);
    moe_cache_trace_info(tr, &in);
    CHECK(in.steps == 1 && in.accesses == 4 && in.tokens == 4, "prompt longer than the sequence");
    moe_cache_trace_free(tr);
}

/* test_prefetch: 2 layers x 4 experts, top-2, one token: layer 0 (0, 1),
 * layer 1 (2, 1); ids 0, 1 and 6, 5. The order-1 dictionary of the trace
 * itself predicts for layer 1 experts 1 and 2 equally: prefetch 1 takes 1
 * (lower id) = g5. Two high slots, all high precision, LRU:
 *   layer 0: g0 miss, g1 miss {g0,g1}
 *   layer 1: prefetch g5 evicts g0 (least recent), protected; demand g6
 *     misses and must evict g1, not g5 (never used, so least recent, but
 *     protected); g5 hits (a prefetch hit).
 * 3 misses, 1 hit, 1 prefetch load, 1 prefetch hit, bytes (3 + 1) * 100.
 * Without prefetch: 4 misses. Belady ignores prefetch. */
static void test_prefetch(void) {
    struct tt t;
    tt_init(&t, 2, 4, 2);
    const int x[4] = {0, 1, 2, 1};
    tt_tok(&t, x, NULL);
    tt_seq(&t);
    struct moe_trace v = tt_view(&t);
    struct moe_path_dict *d = NULL;
    const int32_t all[1] = {0};
    CHECK(moe_cache_path_dict(&v, all, 1, 1, &d) == MOE_OK, "dictionary");
    struct moe_cache_trace_params pp = moe_cache_trace_default_params();
    pp.paths = d, pp.prefetch = 1;
    struct moe_cache_trace *tr = NULL;
    CHECK(moe_cache_trace_new(&v, NULL, 0, &pp, &tr) == MOE_OK, "prepare with prefetch");
    if (tr) {
        struct moe_cache_trace_info in;
        moe_cache_trace_info(tr, &in);
        CHECK(in.prefetch_slots == 1, "one prefetch entry (%lld)", (long long)in.prefetch_slots);
        struct moe_cache_config c = moe_cache_default_config();
        c.high_cap = 2, c.high_bytes = 100, c.prefetch = 1;
        struct moe_cache_stats s;
        CHECK(moe_cache_simulate(tr, MOE_CACHE_LRU, &c, &s) == MOE_OK, "simulate");
        CHECK(s.misses_high == 3 && s.hits_high == 1 && s.prefetch_loads == 1 && s.prefetch_hits == 1 &&
                  s.bytes == 400 && s.penalty == 3,
              "prefetch: misses %lld hits %lld loads %lld used %lld bytes %g", (long long)s.misses_high,
              (long long)s.hits_high, (long long)s.prefetch_loads, (long long)s.prefetch_hits, s.bytes);
        c.prefetch = 0;
        CHECK(moe_cache_simulate(tr, MOE_CACHE_LRU, &c, &s) == MOE_OK && s.misses_high == 4, "without prefetch");
        c.prefetch = 1;
        CHECK(moe_cache_simulate(tr, MOE_CACHE_BELADY, &c, &s) == MOE_OK && s.prefetch_loads == 0,
              "Belady does not prefetch");
    }
    moe_cache_trace_free(tr);
    moe_path_dict_free(d);
}

/* random_trace: n_seq sequences of len tokens with some reuse. */
static void random_trace(struct tt *t, int L, int E, int K, int n_seq, int len, unsigned *seed) {
    tt_init(t, L, E, K);
    for (int q = 0; q < n_seq; q++) {
        for (int i = 0; i < len && t->n_tok < MAX_TOK; i++) {
            int x[32];
            float w[32];
            for (int l = 0; l < L; l++)
                for (int j = 0; j < K; j++) {
                    int e, dup;
                    do {
                        *seed = *seed * 1103515245u + 12345u;
                        e = (int)((*seed >> 16) % (unsigned)E);
                        if (i > 0 && (*seed >> 8) % 3 == 0) e = t->experts[((t->n_tok - 1) * L + l) * K + j];
                        dup = 0;
                        for (int m = 0; m < j; m++) dup |= x[l * K + m] == e;
                        if (dup) *seed += 7;
                    } while (dup);
                    x[l * K + j] = e;
                    w[l * K + j] = (float)(K - j) + (float)((*seed >> 4) % 100) / 100.0f;
                }
            tt_tok(t, x, w);
        }
        tt_seq(t);
    }
}

/* test_properties: on random traces (with a prompt batch), Belady's misses
 * are a lower bound for every policy with one precision (T1 = 1: all high;
 * no low cache); HOBBIT's corners equal LRU, LFU-seq and LHU with mixed
 * precision too; the fit is no worse than any corner. */
static void test_properties(void) {
    unsigned seed = 7;
    int violations = 0, unequal = 0, fit_worse = 0;
    for (int round = 0; round < 60; round++) {
        struct tt t;
        const int L = 1 + round % 3, E = 4 + round % 5, K = 1 + round % 2;
        random_trace(&t, L, E, K, 1 + round % 4, 6 + round % 13, &seed);
        struct moe_trace v = tt_view(&t);
        double freq[64];
        int32_t order[64], all[16];
        for (int i = 0; i < t.n_seq; i++) all[i] = i;
        CHECK(moe_cache_popularity(&v, all, t.n_seq, freq, order) == MOE_OK, "popularity");
        const int hi = 1 + round % (L * E), prompt = round % 5;
        /* one precision */
        struct moe_cache_trace *tr = prep(&t, 1, 1, prompt);
        struct moe_cache_config c = moe_cache_default_config();
        c.high_cap = hi, c.freq = freq, c.order = order, c.w[0] = 0.4, c.w[1] = 0.3, c.w[2] = 0.2, c.w[3] = 0.1;
        struct moe_cache_stats b, s;
        CHECK(moe_cache_simulate(tr, MOE_CACHE_BELADY, &c, &b) == MOE_OK, "belady");
        for (int p = 0; p < MOE_CACHE_N_POLICIES; p++) {
            CHECK(moe_cache_simulate(tr, (enum moe_cache_policy)p, &c, &s) == MOE_OK, "policy %d", p);
            if (s.misses_high < b.misses_high) {
                violations++;
                fprintf(stderr, "round %d: %s %lld misses < Belady %lld\n", round,
                        moe_cache_policy_name((enum moe_cache_policy)p), (long long)s.misses_high,
                        (long long)b.misses_high);
            }
        }
        moe_cache_trace_free(tr);
        /* mixed precision: corners of HOBBIT */
        tr = prep(&t, 0.55, 0.8, prompt);
        c.low_cap = round % 3;
        const enum moe_cache_policy same[3] = {MOE_CACHE_LRU, MOE_CACHE_LFU_SEQ, MOE_CACHE_LHU};
        for (int i = 0; i < 3; i++) {
            struct moe_cache_stats h;
            memset(c.w, 0, sizeof c.w);
            c.w[i] = 1;
            CHECK(moe_cache_simulate(tr, same[i], &c, &s) == MOE_OK && moe_cache_simulate(tr, MOE_CACHE_HOBBIT, &c, &h) == MOE_OK,
                  "corner %d", i);
            if (memcmp(&s, &h, sizeof s) != 0) unequal++;
        }
        double w[MOE_CACHE_N_WEIGHTS];
        struct moe_cache_stats fs, cs;
        struct moe_cache_fit_params fp = moe_cache_fit_default_params();
        fp.grid = 4, fp.refine_rounds = 2;
        int admit = -1;
        CHECK(moe_cache_fit_hobbit(tr, &c, &fp, w, &admit, &fs, NULL) == MOE_OK && (admit == 0 || admit == 1), "fit");
        CHECK(w[0] >= 0 && w[1] >= 0 && w[2] >= 0 && w[3] >= 0 && w[4] >= 0 &&
                  fabs(w[0] + w[1] + w[2] + w[3] + w[4] - 1) < 1e-9,
              "fitted weights on the simplex");
        for (int i = 0; i < 2 * MOE_CACHE_N_WEIGHTS; i++) { /* every corner, without and with admission */
            memset(c.w, 0, sizeof c.w);
            c.w[i % MOE_CACHE_N_WEIGHTS] = 1, c.admit = i >= MOE_CACHE_N_WEIGHTS;
            CHECK(moe_cache_simulate(tr, MOE_CACHE_HOBBIT, &c, &cs) == MOE_OK, "corner");
            fit_worse += fs.penalty > cs.penalty + 1e-9;
        }
        memcpy(c.w, w, sizeof w);
        c.admit = admit;
        CHECK(moe_cache_simulate(tr, MOE_CACHE_HOBBIT, &c, &cs) == MOE_OK && cs.penalty == fs.penalty,
              "the fitted weights replay to the reported penalty");
        /* the paper's fit: four weights, no admission */
        fp.n_weights = 4, fp.admit = 0;
        CHECK(moe_cache_fit_hobbit(tr, &c, &fp, w, &admit, &fs, NULL) == MOE_OK && admit == 0 && w[4] == 0,
              "the paper's fit leaves w_pop at 0 and admission off");
        c.admit = 0;
        for (int i = 0; i < 4; i++) {
            memset(c.w, 0, sizeof c.w);
            c.w[i] = 1;
            CHECK(moe_cache_simulate(tr, MOE_CACHE_HOBBIT, &c, &cs) == MOE_OK, "corner");
            fit_worse += fs.penalty > cs.penalty + 1e-9;
        }
        moe_cache_trace_free(tr);
    }
    CHECK(violations == 0, "no policy beats Belady with one precision (%d violations)", violations);
    CHECK(unequal == 0, "HOBBIT corners equal LRU / LFU-seq / LHU (%d differ)", unequal);
    CHECK(fit_worse == 0, "the fit is no worse than any corner (%d worse)", fit_worse);
}

/* test_split: every k-th sequence held out, at least one each way. */
static void test_split(void) {
    unsigned char h[10];
    CHECK(moe_cache_split(10, 0.3, h) == 3 && h[3] && h[6] && h[9] && !h[0] && !h[5], "0.3 of 10: 3, 6, 9");
    CHECK(moe_cache_split(10, 0, h) == 0, "0: none");
    CHECK(moe_cache_split(2, 0.1, h) == 1 && !h[0] && h[1], "at least one held out");
    CHECK(moe_cache_split(1, 0.5, h) == 0 && !h[0], "one sequence: none held out");
    /* popularity: freq = count / tokens */
    struct tt t;
    const int x[4] = {0, 0, 1, 2};
    one_layer(&t, 4, x, 4);
    struct moe_trace v = tt_view(&t);
    double f[4];
    int32_t o[4];
    const int32_t all[1] = {0};
    CHECK(moe_cache_popularity(&v, all, 1, f, o) == MOE_OK && f[0] == 0.5 && f[1] == 0.25 && f[3] == 0 &&
              o[0] == 0 && o[1] == 1 && o[2] == 2 && o[3] == 3,
          "popularity");
}

/* test_errors: bad arguments are errors with one message. */
static void test_errors(void) {
    struct tt t;
    const int x[3] = {0, 1, 2};
    one_layer(&t, 4, x, 3);
    struct moe_trace v = tt_view(&t);
    struct moe_cache_trace_params pp = moe_cache_trace_default_params();
    struct moe_cache_trace *tr = NULL;
    pp.t1 = 0.9, pp.t2 = 0.5;
    log_reset();
    CHECK(moe_cache_trace_new(&v, NULL, 0, &pp, &tr) == MOE_ERR_INVALID && !tr && g_n_err == 1, "T1 > T2");
    pp = moe_cache_trace_default_params();
    const int32_t bad[1] = {5};
    log_reset();
    CHECK(moe_cache_trace_new(&v, bad, 1, &pp, &tr) == MOE_ERR_INVALID && g_n_err == 1, "sequence out of range");
    t.experts[1] = 9;
    log_reset();
    CHECK(moe_cache_trace_new(&v, NULL, 0, &pp, &tr) == MOE_ERR_INVALID && g_n_err == 1, "expert out of range");
    t.experts[1] = 1;
    CHECK(moe_cache_trace_new(&v, NULL, 0, &pp, &tr) == MOE_OK, "valid");
    struct moe_cache_config c = moe_cache_default_config();
    struct moe_cache_stats s;
    c.w[0] = 0.5, c.w[1] = 0.6, c.w[2] = 0, c.w[3] = 0;
    log_reset();
    CHECK(moe_cache_simulate(tr, MOE_CACHE_HOBBIT, &c, &s) == MOE_ERR_INVALID && g_n_err == 1, "weights sum 1.1");
    c.w[1] = 0.5, c.w[0] = NAN;
    CHECK(moe_cache_simulate(tr, MOE_CACHE_HOBBIT, &c, &s) == MOE_ERR_INVALID, "NaN weight");
    c = moe_cache_default_config();
    c.high_cap = -1;
    CHECK(moe_cache_simulate(tr, MOE_CACHE_LRU, &c, &s) == MOE_ERR_INVALID, "negative capacity");
    c.high_cap = 1;
    CHECK(moe_cache_simulate(tr, (enum moe_cache_policy)42, &c, &s) == MOE_ERR_INVALID, "unknown policy");
    CHECK(strcmp(moe_cache_policy_name(MOE_CACHE_BELADY), "belady") == 0 &&
              strcmp(moe_cache_policy_name((enum moe_cache_policy)42), "?") == 0,
          "policy names");
    struct moe_cache_fit_params fp = moe_cache_fit_default_params();
    double w[MOE_CACHE_N_WEIGHTS];
    fp.grid = 0;
    CHECK(moe_cache_fit_hobbit(tr, &c, &fp, w, NULL, NULL, NULL) == MOE_ERR_INVALID, "grid 0");
    moe_cache_trace_free(tr);
    moe_cache_trace_free(NULL);
}

int main(void) {
    moe_log_set(capture, NULL);
    test_lru_belady();
    test_lfu();
    test_sequences();
    test_precision();
    test_lhu();
    test_layers();
    test_static();
    test_batch();
    test_prefetch();
    test_properties();
    test_split();
    test_errors();
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}

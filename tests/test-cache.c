/*
 * test-cache.c - the online expert-cache core (runtime/offload/cache.c, moe-cache.h)
 * driven access by access as the runtime's store drives it: for every policy
 * a hand-worked stream whose outcomes, kept flags and evicted experts are
 * worked out in the comments (LRU, LFU per sequence and global with the
 * sequence reset, LHU, forward layer distance, EdgeMoE's f/d, HOBBIT's
 * weighted priority with its popularity term (per-need shares) and
 * admission control (a load that ranks below its victim is not kept; a low
 * copy whose high copy is cached goes first), Twiddler's pinned set with its
 * scratch slot (kept = 0),
 * Belady with bypass); the two precisions (low hits, a low copy never serving
 * a high need, skips changing no record); prefetch protection for a later
 * step (ahead > 0) that holds through an intermediate step's misses and runs
 * out after, the limit of high_cap - 1 protected copies; the batch entry
 * point against single calls on random streams; HOBBIT (every extension,
 * with prefetch protection) against a naive reference that scores every
 * copy from scratch; and what
 * moe_cache_check_config and moe_cache_new refuse, each with one message.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-cache.h"
#include "moe-test.h"
#include "moe-test-log.h"

#define H MOE_CACHE_NEED_HIGH
#define LO MOE_CACHE_NEED_LOW
#define S MOE_CACHE_NEED_SKIP
#define NV MOE_CACHE_NEVER

/* make: a cache of L x E experts under p with capacities hi, lo. */
static struct moe_cache *make(int L, int E, enum moe_cache_policy p, int hi, int lo, const double *w,
                              const double *freq, const int32_t *order) {
    struct moe_cache_config c = moe_cache_default_config();
    c.high_cap = hi, c.low_cap = lo, c.freq = freq, c.order = order;
    if (w) memcpy(c.w, w, sizeof c.w);
    struct moe_cache *m = NULL;
    CHECK(moe_cache_new(L, E, p, &c, &m) == MOE_OK && m, "new %s", moe_cache_policy_name(p));
    return m;
}

/* One expected access: expert, need, Belady next uses, outcome, kept, evicted. */
struct want {
    int32_t g;
    enum moe_cache_need need;
    int32_t nh, nl;
    enum moe_cache_outcome out;
    int kept;
    int32_t ev;
};

/* run: the accesses of w[0..n) in the current step; checks each result. */
static void run(struct moe_cache *m, const char *what, const struct want *w, int n) {
    for (int i = 0; m && i < n; i++) {
        struct moe_cache_result r;
        memset(&r, 0x5a, sizeof r);
        moe_cache_access(m, w[i].g, w[i].need, w[i].nh, w[i].nl, &r);
        const int is_miss = w[i].out == MOE_CACHE_MISS_HIGH || w[i].out == MOE_CACHE_MISS_LOW;
        CHECK(r.outcome == w[i].out && (!is_miss || r.kept == w[i].kept) && r.evicted == w[i].ev,
              "%s, access %d (expert %d): outcome %d kept %d evicted %d; want %d, %d, %d", what, i, (int)w[i].g,
              (int)r.outcome, r.kept, (int)r.evicted, (int)w[i].out, w[i].kept, (int)w[i].ev);
    }
}

/* one_step_each: the accesses of w as one step each, layer 0, T = 1, 2, ... */
static void one_step_each(struct moe_cache *m, const char *what, const struct want *w, int n, int32_t *T) {
    for (int i = 0; m && i < n; i++) {
        moe_cache_begin_step(m, 0, ++*T);
        run(m, what, &w[i], 1);
    }
}

#define MH(g, ev) {g, H, NV, NV, MOE_CACHE_MISS_HIGH, 1, ev}
#define HH(g) {g, H, NV, NV, MOE_CACHE_HIT_HIGH, 0, -1}

/* test_lru: 0 1 2 0 3 0 1 (all high) through 2 slots, one layer:
 * 0m, 1m, 2m evicts 0, 0m evicts 1, 3m evicts 2, 0 hit, 1m evicts 3. */
static void test_lru(void) {
    struct moe_cache *m = make(1, 4, MOE_CACHE_LRU, 2, 0, NULL, NULL, NULL);
    const struct want w[7] = {MH(0, -1), MH(1, -1), MH(2, 0), MH(0, 1), MH(3, 2), HH(0), MH(1, 3)};
    int32_t T = 0;
    moe_cache_begin_sequence(m);
    one_step_each(m, "lru", w, 7, &T);
    CHECK(moe_cache_count(m, 1) == 2 && moe_cache_count(m, 0) == 0 && moe_cache_contains(m, 0, 1) &&
              moe_cache_contains(m, 1, 1) && !moe_cache_contains(m, 3, 1) && !moe_cache_contains(m, 0, 0),
          "lru: the cache holds 0 and 1");
    moe_cache_free(m);
    /* no room at all: every miss is not kept */
    m = make(1, 4, MOE_CACHE_LRU, 0, 0, NULL, NULL, NULL);
    const struct want z[2] = {{0, H, NV, NV, MOE_CACHE_MISS_HIGH, 0, -1}, {0, H, NV, NV, MOE_CACHE_MISS_HIGH, 0, -1}};
    T = 0;
    one_step_each(m, "lru without a cache", z, 2, &T);
    moe_cache_free(m);
    moe_cache_free(NULL);
}

/* test_guard_switch: the policy guard's rule: 10 % fewer misses and beyond chance */
static void test_guard_switch(void) {
    CHECK(!moe_cache_guard_switch(21.7, 19.4), "a handful of misses early does not decide (21.7 against 19.4)");
    CHECK(!moe_cache_guard_switch(100, 89), "11 %% fewer but within chance (100 against 89)");
    CHECK(!moe_cache_guard_switch(1000, 950), "5 %% fewer is not enough however many (1000 against 950)");
    CHECK(moe_cache_guard_switch(200, 150), "25 %% fewer over 350 misses switches");
    CHECK(moe_cache_guard_switch(1000, 880), "12 %% fewer over 1880 misses switches");
    CHECK(!moe_cache_guard_switch(0, 0) && !moe_cache_guard_switch(50, 60), "none, or a worse shadow, never switches");
}

/* test_set_policy: LFU-global with 2 slots after 0 0 0 1 would evict 1 (one
 * use) for 2; switched to LRU it evicts 0 (used before 1), and then 1 for 3;
 * STATIC and BELADY cannot be switched to. */
static void test_set_policy(void) {
    struct moe_cache *m = make(1, 4, MOE_CACHE_LFU_GLOBAL, 2, 0, NULL, NULL, NULL);
    const struct want a[4] = {MH(0, -1), HH(0), HH(0), MH(1, -1)};
    int32_t T = 0;
    one_step_each(m, "before the switch", a, 4, &T);
    CHECK(moe_cache_set_policy(m, MOE_CACHE_LRU) == MOE_OK, "switch to LRU");
    const struct want b[2] = {MH(2, 0), MH(3, 1)};
    one_step_each(m, "after the switch (LRU)", b, 2, &T);
    log_reset();
    CHECK(moe_cache_set_policy(m, MOE_CACHE_BELADY) == MOE_ERR_INVALID &&
              moe_cache_set_policy(m, MOE_CACHE_STATIC) == MOE_ERR_INVALID && g_n_err == 2,
          "Belady and static placement refused");
    moe_cache_free(m);
    m = make(1, 4, MOE_CACHE_LFU_GLOBAL, 2, 0, NULL, NULL, NULL);
    one_step_each(m, "unswitched", a, 4, &T);
    const struct want c[1] = {MH(2, 1)};
    one_step_each(m, "LFU-global as it was (the comparison)", c, 1, &T);
    moe_cache_free(m);
}

/* test_lfu: sequence A = 3 3 3 (skips: no copy, nothing counted) 0 0 0 1,
 * then sequence B = 1 2 3 1 through 2 slots. After A both hold {0, 1}, uses
 * 0:3, 1:1. In B, 1 hits; then 2 misses: LFU-global (0:3, 1:2) evicts 1;
 * LFU-seq (records reset: 0:0, 1:1) evicts 0. Then 3 misses: LFU-global
 * {0 (3 uses), 2 (1)} evicts 2; LFU-seq {1, 2: one use each} evicts 1 (older).
 * Then 1 misses: LFU-global {0 (3), 3 (1: its skips did not count, else 4)}
 * evicts 3; LFU-seq {2, 3: one use each} evicts 2 (older). */
static void test_lfu(void) {
    const enum moe_cache_policy ps[2] = {MOE_CACHE_LFU_GLOBAL, MOE_CACHE_LFU_SEQ};
    for (int k = 0; k < 2; k++) {
        struct moe_cache *m = make(1, 4, ps[k], 2, 0, NULL, NULL, NULL);
        const struct want a[7] = {{3, S, NV, NV, MOE_CACHE_SKIP, 0, -1}, {3, S, NV, NV, MOE_CACHE_SKIP, 0, -1},
                                  {3, S, NV, NV, MOE_CACHE_SKIP, 0, -1}, MH(0, -1), HH(0), HH(0), MH(1, -1)};
        const struct want b[4] = {HH(1), MH(2, k == 0 ? 1 : 0), MH(3, k == 0 ? 2 : 1), MH(1, k == 0 ? 3 : 2)};
        int32_t T = 0;
        moe_cache_begin_sequence(m);
        one_step_each(m, moe_cache_policy_name(ps[k]), a, 7, &T);
        moe_cache_begin_sequence(m);
        T = 0;
        one_step_each(m, moe_cache_policy_name(ps[k]), b, 4, &T);
        moe_cache_free(m);
    }
}

/* test_lhu: one layer, two high slots: 0 H, 1 H, 0 L, 0 L, 1 H (the low
 * needs are served by the high copy: high hits that do not count as
 * high-need uses): uses 0:3 (1 high), 1:2 (2 high). Then 2 H misses: LHU
 * evicts 0 (1 high use < 2), LFU-seq evicts 1 (2 uses < 3). */
static void test_lhu(void) {
    const enum moe_cache_policy ps[2] = {MOE_CACHE_LHU, MOE_CACHE_LFU_SEQ};
    for (int k = 0; k < 2; k++) {
        struct moe_cache *m = make(1, 4, ps[k], 2, 0, NULL, NULL, NULL);
        const struct want w[6] = {MH(0, -1), MH(1, -1), {0, LO, NV, NV, MOE_CACHE_HIT_HIGH, 0, -1},
                                  {0, LO, NV, NV, MOE_CACHE_HIT_HIGH, 0, -1}, HH(1), MH(2, k == 0 ? 0 : 1)};
        int32_t T = 0;
        moe_cache_begin_sequence(m);
        one_step_each(m, moe_cache_policy_name(ps[k]), w, 6, &T);
        moe_cache_free(m);
    }
}

/* test_layers: 3 layers x 2 experts (g = 2 l + e), expert 0 at layers 0, 1,
 * 2 of one token, two slots; the miss at layer 2 decides between g0 (layer
 * 0) and g2 (layer 1):
 *  - FLD, d = ((lt - l - 1 + 3) mod 3) + 1: g0 d 1, g2 d 2: evicts g2;
 *  - HOBBIT w_fld = 1, 1 - ((lt - l + 3) mod 3) / 3: g0 2/3, g2 1/3: evicts g2;
 *  - EdgeMoE f / d with f = (g0 0.1, g2 1): g0 0.1, g2 0.5: evicts g0;
 *  - LRU: evicts g0 (least recent). */
static void test_layers(void) {
    const double f[6] = {0.1, 0, 1, 0, 1, 0}, wf[MOE_CACHE_N_WEIGHTS] = {0, 0, 0, 1};
    const struct {
        enum moe_cache_policy p;
        int32_t ev;
    } cases[4] = {{MOE_CACHE_FLD, 2}, {MOE_CACHE_HOBBIT, 2}, {MOE_CACHE_EDGEMOE, 0}, {MOE_CACHE_LRU, 0}};
    for (int k = 0; k < 4; k++) {
        struct moe_cache *m = make(3, 2, cases[k].p, 2, 0, wf, f, NULL);
        moe_cache_begin_sequence(m);
        for (int l = 0; l < 3; l++) {
            const struct want w[1] = {MH(2 * l, l == 2 ? cases[k].ev : -1)};
            moe_cache_begin_step(m, l, 1);
            run(m, moe_cache_policy_name(cases[k].p), w, 1);
        }
        moe_cache_free(m);
    }
}

/* test_hobbit: one layer, tokens 0, 0, 1, then 2 misses (2 slots). At T = 4
 * the records are 0: R 2, F 2; 1: R 3, F 1. p T = w_lru R + w_lfu F:
 * w = (0.4, 0.6): 0 -> 2.0, 1 -> 1.8: evicts 1;
 * w = (0.6, 0.4): 0 -> 2.0, 1 -> 2.2: evicts 0. */
static void test_hobbit(void) {
    const double wa[MOE_CACHE_N_WEIGHTS] = {0.4, 0.6, 0, 0}, wb[MOE_CACHE_N_WEIGHTS] = {0.6, 0.4, 0, 0};
    const double *ws[2] = {wa, wb};
    for (int k = 0; k < 2; k++) {
        struct moe_cache *m = make(1, 4, MOE_CACHE_HOBBIT, 2, 0, ws[k], NULL, NULL);
        const struct want w[4] = {MH(0, -1), HH(0), MH(1, -1), MH(2, k == 0 ? 1 : 0)};
        int32_t T = 0;
        moe_cache_begin_sequence(m);
        one_step_each(m, "hobbit", w, 4, &T);
        moe_cache_free(m);
    }
}

/* make_pop: HOBBIT with per-need popularity shares and admission. */
static struct moe_cache *make_pop(int L, int E, int hi, int lo, const double *w, int admit, const double *fh,
                                  const double *fl) {
    struct moe_cache_config c = moe_cache_default_config();
    c.high_cap = hi, c.low_cap = lo, c.admit = admit, c.freq_high = fh, c.freq_low = fl, c.low_cost = 0.25;
    memcpy(c.w, w, sizeof c.w);
    struct moe_cache *m = NULL;
    CHECK(moe_cache_new(L, E, MOE_CACHE_HOBBIT, &c, &m) == MOE_OK && m, "new hobbit");
    return m;
}

/* test_popularity: HOBBIT with only w_pop (= 1), one layer, two high slots,
 * high-need shares f_high = (0.5, 0.25, 0.125, 0.75), no low needs: the
 * priority p T is T f_high. Tokens 0, 1, 2, 3, 1:
 *   with admission: 0m, 1m; 2m: the victim would be 1 (0.25) but 2 ranks
 *     lower (0.125): not kept; 3m (0.75) evicts 1; 1m: the victim would be 0
 *     (0.5), 1 ranks lower: not kept;
 *   without: 2m evicts 1; 3m evicts 2; 1m evicts 0 (0.5 < 0.75).
 * The popularity of a copy counts its low needs at low_cost in the high
 * cache: f_low = (0, 0, 1, 0) and low_cost 0.25 make 2's high copy worth
 * 0.125 + 0.25 = 0.375 > 0.25: then 2 evicts 1 even with admission. */
static void test_popularity(void) {
    const double w[MOE_CACHE_N_WEIGHTS] = {0, 0, 0, 0, 1};
    const double fh[4] = {0.5, 0.25, 0.125, 0.75}, fl0[4] = {0, 0, 0, 0}, fl2[4] = {0, 0, 1, 0};
    for (int admit = 1; admit >= 0; admit--) {
        struct moe_cache *m = make_pop(1, 4, 2, 0, w, admit, fh, fl0);
        const struct want a[5] = {MH(0, -1), MH(1, -1), {2, H, NV, NV, MOE_CACHE_MISS_HIGH, 0, -1}, MH(3, 1),
                                  {1, H, NV, NV, MOE_CACHE_MISS_HIGH, 0, -1}};
        const struct want b[5] = {MH(0, -1), MH(1, -1), MH(2, 1), MH(3, 2), MH(1, 0)};
        int32_t T = 0;
        moe_cache_begin_sequence(m);
        one_step_each(m, admit ? "popularity with admission" : "popularity without admission", admit ? a : b, 5, &T);
        moe_cache_free(m);
    }
    struct moe_cache *m = make_pop(1, 4, 2, 0, w, 1, fh, fl2);
    const struct want c[3] = {MH(0, -1), MH(1, -1), MH(2, 1)};
    int32_t T = 0;
    one_step_each(m, "popularity counting low needs", c, 3, &T);
    moe_cache_free(m);
    /* only one of the per-need shares: refused */
    struct moe_cache_config cf = moe_cache_default_config();
    cf.freq_high = fh;
    log_reset();
    CHECK(moe_cache_check_config(MOE_CACHE_HOBBIT, &cf) == MOE_ERR_INVALID && g_n_err == 1, "freq_high alone");
    cf.freq_high = NULL, cf.admit = 2;
    CHECK(moe_cache_check_config(MOE_CACHE_HOBBIT, &cf) == MOE_ERR_INVALID, "admit 2");
}

/* test_low_copy: with admission a low copy whose high copy is cached ranks
 * below every other. HOBBIT w_lru = 1 (LRU order), one high slot, two low
 * slots: tokens 0 L, 1 L, 0 H (0's high copy: its low copy, though the more
 * recent, is now worthless), 2 L: with admission evicts 0's low copy, then
 * 1 L hits; without, 2 L evicts 1 (least recent) and 1 L misses again. */
static void test_low_copy(void) {
    const double w[MOE_CACHE_N_WEIGHTS] = {1, 0, 0, 0, 0};
    for (int admit = 1; admit >= 0; admit--) {
        struct moe_cache *m = make_pop(1, 4, 1, 2, w, admit, NULL, NULL);
        const struct want a[5] = {{0, LO, NV, NV, MOE_CACHE_MISS_LOW, 1, -1}, {1, LO, NV, NV, MOE_CACHE_MISS_LOW, 1, -1},
                                  MH(0, -1), {2, LO, NV, NV, MOE_CACHE_MISS_LOW, 1, admit ? 0 : 1},
                                  admit ? (struct want){1, LO, NV, NV, MOE_CACHE_HIT_LOW, 0, -1}
                                        : (struct want){1, LO, NV, NV, MOE_CACHE_MISS_LOW, 1, 0}};
        int32_t T = 0;
        one_step_each(m, admit ? "low copy with admission" : "low copy without admission", a, 5, &T);
        moe_cache_free(m);
    }
}

/* ---- a naive reference: every copy scored from scratch at each miss ---- */

#define RL 3
#define RE 5
#define RLE (RL * RE)

/* The reference model of one HOBBIT cache pair (docs/cache-sim.md). */
struct ref {
    double w[MOE_CACHE_N_WEIGHTS], pop[2][RLE]; /* pop[0]: high cache */
    int admit, cap[2], in[2][RLE], step, T, lc;
    int64_t clock, stamp[RLE];
    int R[RLE], F[RLE], Hn[RLE], prot[RLE], pfl[RLE];
};

/* ref_score: p T of g's copy in cache h (0 high, 1 low) at the current step. */
static double ref_score(const struct ref *r, int h, int g) {
    if (r->admit && h == 1 && r->in[0][g]) return -INFINITY;
    const double k = r->w[0] * r->R[g] + r->w[1] * r->F[g] + r->w[2] * r->Hn[g];
    const double ek = r->w[4] > 0 ? k + r->w[4] * r->T * r->pop[h][g] : k;
    const int j = (g / RE - r->lc + RL) % RL;
    return ek + r->w[3] * r->T * (1.0 - (double)j / RL);
}

/* ref_victim: the lowest (score, last use, id) unprotected copy of cache h. */
static int ref_victim(const struct ref *r, int h) {
    int v = -1;
    for (int g = 0; g < RLE; g++) {
        if (!r->in[h][g] || (h == 0 && r->prot[g] >= r->step)) continue;
        if (v < 0) {
            v = g;
            continue;
        }
        const double sg = ref_score(r, h, g), sv = ref_score(r, h, v);
        if (sg < sv || (sg == sv && (r->stamp[g] < r->stamp[v] || (r->stamp[g] == r->stamp[v] && g < v)))) v = g;
    }
    return v;
}

/* ref_count: copies in cache h. */
static int ref_count(const struct ref *r, int h) {
    int n = 0;
    for (int g = 0; g < RLE; g++) n += r->in[h][g];
    return n;
}

/* ref_put: a load of g into cache h (need: -1 for a prefetch); kept? */
static int ref_put(struct ref *r, int h, int g, int need, int *ev) {
    *ev = -1;
    if (r->cap[h] <= 0) return 0;
    if (ref_count(r, h) >= r->cap[h]) {
        const int v = ref_victim(r, h);
        if (v < 0) return 0;
        if (r->admit && need >= 0) {
            const double k = r->w[0] * r->T + r->w[1] * (r->F[g] + 1) + r->w[2] * (r->Hn[g] + (need == H)) +
                             (r->w[4] > 0 ? r->w[4] * r->T * r->pop[h][g] : 0.0);
            if (k + r->w[3] * r->T * (1.0 - (double)((g / RE - r->lc + RL) % RL) / RL) < ref_score(r, h, v)) return 0;
        }
        r->in[h][v] = 0, *ev = v;
        if (h == 0) r->prot[v] = r->pfl[v] = -1;
    }
    r->in[h][g] = 1;
    return 1;
}

/* ref_access: moe_cache_access of the reference. */
static void ref_access(struct ref *r, int g, int need, struct moe_cache_result *o) {
    o->evicted = -1, o->kept = 0, o->prefetch_hit = 0;
    if (r->in[0][g]) o->outcome = MOE_CACHE_HIT_HIGH, o->prefetch_hit = r->pfl[g] == r->step;
    else if (r->in[1][g] && need != H) o->outcome = MOE_CACHE_HIT_LOW;
    else if (need == S) {
        o->outcome = MOE_CACHE_SKIP;
        return;
    } else if (need == H) o->outcome = MOE_CACHE_MISS_HIGH, o->kept = ref_put(r, 0, g, need, &o->evicted);
    else o->outcome = MOE_CACHE_MISS_LOW, o->kept = ref_put(r, 1, g, need, &o->evicted);
    r->stamp[g] = ++r->clock, r->R[g] = r->T, r->F[g]++, r->Hn[g] += need == H;
}

/* ref_prefetch: moe_cache_prefetch of the reference. */
static int ref_prefetch(struct ref *r, int g, int ahead, struct moe_cache_result *o) {
    o->evicted = -1, o->kept = 0, o->prefetch_hit = 0;
    if (r->in[0][g] && r->prot[g] >= r->step) {
        if (r->prot[g] < r->step + ahead) r->prot[g] = r->step + ahead;
        o->outcome = MOE_CACHE_HIT_HIGH;
        return 1;
    }
    int np = 0;
    for (int x = 0; x < RLE; x++) np += r->in[0][x] && r->prot[x] >= r->step;
    if (np >= r->cap[0] - 1) return 0;
    if (!r->in[0][g]) {
        if (!ref_put(r, 0, g, -1, &o->evicted)) return 0;
        r->pfl[g] = r->step + ahead, o->outcome = MOE_CACHE_MISS_HIGH, o->kept = 1;
    } else {
        o->outcome = MOE_CACHE_HIT_HIGH;
    }
    r->prot[g] = r->step + ahead;
    return 1;
}

/* test_reference: HOBBIT in the core (layer minima, lazy popularity
 * rescans, admission, the worthless low copy, protection) against the naive
 * reference on random streams, result by result. Weights and shares are
 * multiples of 1/8, so both compute every score exactly. */
static void test_reference(void) {
    unsigned seed = 5;
    int differ = 0, misses = 0, bypasses = 0;
#define RND(n) ((seed = seed * 1103515245u + 12345u), (int)((seed >> 16) % (unsigned)(n)))
    for (int round = 0; round < 200; round++) {
        struct ref r;
        memset(&r, 0, sizeof r);
        double fh[RLE], fl[RLE];
        int left = 8;
        for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++) { /* eighths summing to 1 */
            const int x = i == MOE_CACHE_N_WEIGHTS - 1 ? left : RND(left + 1);
            r.w[i] = x / 8.0, left -= x;
        }
        for (int g = 0; g < RLE; g++) fh[g] = RND(9) / 8.0, fl[g] = RND(9) / 8.0;
        r.admit = round % 2, r.cap[0] = 1 + RND(6), r.cap[1] = RND(4);
        for (int g = 0; g < RLE; g++) {
            r.pop[0][g] = fh[g] + 0.25 * fl[g], r.pop[1][g] = fl[g];
            r.prot[g] = r.pfl[g] = -1;
        }
        struct moe_cache *m = make_pop(RL, RE, r.cap[0], r.cap[1], r.w, r.admit, fh, fl);
        if (!m) break;
        r.step = -1;
        for (int step = 0; step < 240; step++) {
            const int l = step % RL, T = 1 + (step % 60) / RL;
            if (step % 60 == 0) {
                moe_cache_begin_sequence(m);
                memset(r.R, 0, sizeof r.R), memset(r.F, 0, sizeof r.F), memset(r.Hn, 0, sizeof r.Hn);
            }
            moe_cache_begin_step(m, l, T);
            r.step++, r.T = T, r.lc = l;
            struct moe_cache_result a, b;
            if (RND(3) == 0) { /* a prefetch for this or a later step */
                const int g = RND(RLE), ahead = RND(3);
                memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
                const int ra = moe_cache_prefetch(m, g, ahead, &a), rb = ref_prefetch(&r, g, ahead, &b);
                differ += ra != rb || (ra && (a.outcome != b.outcome || a.evicted != b.evicted || a.kept != b.kept));
            }
            for (int i = 0; i < 3; i++) {
                const int g = l * RE + RND(RE), need = RND(3);
                moe_cache_access(m, g, (enum moe_cache_need)need, NV, NV, &a);
                ref_access(&r, g, need, &b);
                differ += a.outcome != b.outcome || a.evicted != b.evicted || a.prefetch_hit != b.prefetch_hit ||
                          ((a.outcome == MOE_CACHE_MISS_HIGH || a.outcome == MOE_CACHE_MISS_LOW) && a.kept != b.kept);
                misses += a.outcome == MOE_CACHE_MISS_HIGH || a.outcome == MOE_CACHE_MISS_LOW;
                bypasses += (a.outcome == MOE_CACHE_MISS_HIGH || a.outcome == MOE_CACHE_MISS_LOW) && !a.kept;
            }
            for (int g = 0; g < RLE; g++)
                differ += moe_cache_contains(m, g, 1) != r.in[0][g] || moe_cache_contains(m, g, 0) != r.in[1][g];
        }
        moe_cache_free(m);
    }
#undef RND
    CHECK(differ == 0, "the core equals the naive reference (%d differences)", differ);
    CHECK(misses > 1000 && bypasses > 100, "the streams exercise misses (%d) and refused loads (%d)", misses, bypasses);
}

/* test_precision: one layer, one high and one low slot, LRU.
 *   0 L: low miss, kept in the low cache     1 L: low miss, evicts 0's low copy
 *   1 S: low hit (a skip-need is served)     1 H: high miss (a low copy never
 *   serves a high need), kept               1 L: high hit
 *   2 S: skip (no copy)                     2 L: low miss, evicts 1's low copy */
static void test_precision(void) {
    struct moe_cache *m = make(1, 4, MOE_CACHE_LRU, 1, 1, NULL, NULL, NULL);
    const struct want w[7] = {{0, LO, NV, NV, MOE_CACHE_MISS_LOW, 1, -1}, {1, LO, NV, NV, MOE_CACHE_MISS_LOW, 1, 0},
                              {1, S, NV, NV, MOE_CACHE_HIT_LOW, 0, -1},   MH(1, -1),
                              {1, LO, NV, NV, MOE_CACHE_HIT_HIGH, 0, -1}, {2, S, NV, NV, MOE_CACHE_SKIP, 0, -1},
                              {2, LO, NV, NV, MOE_CACHE_MISS_LOW, 1, 1}};
    int32_t T = 0;
    moe_cache_begin_sequence(m);
    one_step_each(m, "precision", w, 7, &T);
    CHECK(moe_cache_contains(m, 1, 1) && moe_cache_contains(m, 2, 0) && !moe_cache_contains(m, 1, 0) &&
              moe_cache_count(m, 0) == 1,
          "precision: 1 high, 2 low");
    moe_cache_free(m);
}

/* test_static: Twiddler, order 2 0 1 3, one high and one low slot: 2's high
 * copy and 0's low copy are pinned, loaded by the first access needing their
 * precision; every other miss is a scratch load (kept = 0).
 *   1 H: miss, scratch       2 H: miss, kept (pinned)   2 H: hit
 *   0 L: miss, kept          0 L: low hit               0 H: miss, scratch
 *   3 S: skip                1 H: miss, scratch (nothing was kept)
 *   2 L: high hit */
static void test_static(void) {
    const int32_t order[4] = {2, 0, 1, 3};
    struct moe_cache *m = make(1, 4, MOE_CACHE_STATIC, 1, 1, NULL, NULL, order);
    const struct want w[9] = {{1, H, NV, NV, MOE_CACHE_MISS_HIGH, 0, -1}, MH(2, -1), HH(2),
                              {0, LO, NV, NV, MOE_CACHE_MISS_LOW, 1, -1}, {0, LO, NV, NV, MOE_CACHE_HIT_LOW, 0, -1},
                              {0, H, NV, NV, MOE_CACHE_MISS_HIGH, 0, -1}, {3, S, NV, NV, MOE_CACHE_SKIP, 0, -1},
                              {1, H, NV, NV, MOE_CACHE_MISS_HIGH, 0, -1}, {2, LO, NV, NV, MOE_CACHE_HIT_HIGH, 0, -1}};
    int32_t T = 0;
    moe_cache_begin_sequence(m);
    one_step_each(m, "static", w, 9, &T);
    CHECK(moe_cache_count(m, 1) == 1 && moe_cache_count(m, 0) == 1 && moe_cache_contains(m, 2, 1) &&
              moe_cache_contains(m, 0, 0) && !moe_cache_contains(m, 1, 1) && !moe_cache_contains(m, 0, 1),
          "static: the pinned copies only");
    struct moe_cache_result r;
    CHECK(moe_cache_prefetch(m, 1, 0, &r) == 0, "static does not prefetch");
    moe_cache_free(m);
}

/* test_belady: 2 slots; next uses are the indices in the stream.
 * Stream 0 1 2 0 3 0 1 (next: 3, 6, -, 5, -, -, -): 0m, 1m, 2m bypassed
 * (needed never, after every cached copy), 0 hit, 3m bypassed, 0 hit, 1 hit.
 * Stream 0 1 2 2 0 1 (next: 4, 5, 3, -, -, -): at 2 the cached copies are
 * next needed at 4 and 5, 2 at 3: evicts 1; then 2 hit, 0 hit, 1 missed,
 * bypassed (never needed again). */
static void test_belady(void) {
    struct moe_cache *m = make(1, 4, MOE_CACHE_BELADY, 2, 0, NULL, NULL, NULL);
    const struct want a[7] = {{0, H, 3, NV, MOE_CACHE_MISS_HIGH, 1, -1}, {1, H, 6, NV, MOE_CACHE_MISS_HIGH, 1, -1},
                              {2, H, NV, NV, MOE_CACHE_MISS_HIGH, 0, -1}, {0, H, 5, NV, MOE_CACHE_HIT_HIGH, 0, -1},
                              {3, H, NV, NV, MOE_CACHE_MISS_HIGH, 0, -1}, {0, H, NV, NV, MOE_CACHE_HIT_HIGH, 0, -1},
                              {1, H, NV, NV, MOE_CACHE_HIT_HIGH, 0, -1}};
    int32_t T = 0;
    moe_cache_begin_sequence(m);
    one_step_each(m, "belady", a, 7, &T);
    moe_cache_free(m);
    m = make(1, 4, MOE_CACHE_BELADY, 2, 0, NULL, NULL, NULL);
    const struct want b[6] = {{0, H, 4, NV, MOE_CACHE_MISS_HIGH, 1, -1}, {1, H, 5, NV, MOE_CACHE_MISS_HIGH, 1, -1},
                              {2, H, 3, NV, MOE_CACHE_MISS_HIGH, 1, 1},   {2, H, NV, NV, MOE_CACHE_HIT_HIGH, 0, -1},
                              {0, H, NV, NV, MOE_CACHE_HIT_HIGH, 0, -1},  {1, H, NV, NV, MOE_CACHE_MISS_HIGH, 0, -1}};
    T = 0;
    moe_cache_begin_sequence(m);
    one_step_each(m, "belady eviction", b, 6, &T);
    struct moe_cache_result r;
    CHECK(moe_cache_prefetch(m, 3, 0, &r) == 0, "belady does not prefetch");
    moe_cache_free(m);
}

/* test_protect_ahead: 2 layers x 4 experts (g = 4 l + e), two high slots,
 * LRU. Step 0 (layer 0) prefetches g1 for the step after (ahead 1):
 *   step 0: prefetch g1 (a load); g0 misses {g1, g0}
 *   step 1 (layer 1): g4 misses: g1 was never used (least recent) but is
 *     protected through step 1: evicts g0; g5 misses: evicts g4 {g1, g5}
 *   step 2 (layer 0): g2 misses: g1's protection has run out: evicts g1.
 * With ahead 0 the protection ends with step 0: g4's miss evicts g1. */
static void test_protect_ahead(void) {
    for (int ahead = 1; ahead >= 0; ahead--) {
        struct moe_cache *m = make(2, 4, MOE_CACHE_LRU, 2, 0, NULL, NULL, NULL);
        struct moe_cache_result r;
        moe_cache_begin_sequence(m);
        moe_cache_begin_step(m, 0, 1);
        CHECK(moe_cache_prefetch(m, 1, ahead, &r) == 1 && r.outcome == MOE_CACHE_MISS_HIGH && r.kept == 1 &&
                  r.evicted == -1,
              "ahead %d: the prefetch loads g1", ahead);
        const struct want s0[1] = {MH(0, -1)};
        run(m, "step 0", s0, 1);
        moe_cache_begin_step(m, 1, 1);
        const struct want s1a[2] = {MH(4, 0), MH(5, 4)}, s1b[2] = {MH(4, 1), MH(5, 0)};
        run(m, ahead ? "step 1, g1 protected" : "step 1, protection over", ahead ? s1a : s1b, 2);
        moe_cache_begin_step(m, 0, 2);
        const struct want s2a[1] = {MH(2, 1)}, s2b[1] = {MH(2, 4)};
        run(m, "step 2", ahead ? s2a : s2b, 1);
        moe_cache_free(m);
    }
    /* a prefetched copy used at the step it was loaded for is a prefetch
     * hit; used at another step it is a plain hit */
    struct moe_cache *m = make(2, 4, MOE_CACHE_LRU, 3, 0, NULL, NULL, NULL);
    struct moe_cache_result r;
    moe_cache_begin_step(m, 0, 1);
    CHECK(moe_cache_prefetch(m, 5, 1, &r) == 1 && r.outcome == MOE_CACHE_MISS_HIGH, "prefetch g5 for step 1");
    CHECK(moe_cache_prefetch(m, 6, 0, &r) == 1, "prefetch g6 for step 0");
    moe_cache_access(m, 6, H, NV, NV, &r);
    CHECK(r.outcome == MOE_CACHE_HIT_HIGH && r.prefetch_hit == 1, "g6 at step 0: a prefetch hit");
    moe_cache_access(m, 5, H, NV, NV, &r);
    CHECK(r.outcome == MOE_CACHE_HIT_HIGH && r.prefetch_hit == 0, "g5 at step 0: a plain hit");
    moe_cache_begin_step(m, 1, 1);
    moe_cache_access(m, 5, H, NV, NV, &r);
    CHECK(r.outcome == MOE_CACHE_HIT_HIGH && r.prefetch_hit == 1, "g5 at step 1: a prefetch hit");
    moe_cache_free(m);
}

/* test_protect_limit: three high slots, so at most two protected copies.
 *   step 0: prefetch g1, g2 (ahead 2): loaded; g3: refused (the limit);
 *     g1 again: already protected, extended (returns 1, a hit, no slot);
 *     g0 misses, kept in the third slot; g4 misses and evicts g0 (g1 and g2
 *     are protected although least recent)
 *   step 2: still protected: g3's prefetch refused; g5 misses, evicts g4
 *   step 3: protection over: g3's prefetch evicts g1 (least recent). */
static void test_protect_limit(void) {
    struct moe_cache *m = make(2, 4, MOE_CACHE_LRU, 3, 0, NULL, NULL, NULL);
    struct moe_cache_result r;
    moe_cache_begin_sequence(m);
    moe_cache_begin_step(m, 0, 1);
    CHECK(moe_cache_prefetch(m, 1, 2, &r) == 1 && r.outcome == MOE_CACHE_MISS_HIGH, "g1 loaded");
    CHECK(moe_cache_prefetch(m, 2, 2, &r) == 1 && r.outcome == MOE_CACHE_MISS_HIGH, "g2 loaded");
    CHECK(moe_cache_prefetch(m, 3, 2, &r) == 0, "g3 refused: two copies protected already");
    CHECK(moe_cache_prefetch(m, 1, 2, &r) == 1 && r.outcome == MOE_CACHE_HIT_HIGH && r.evicted == -1,
          "g1 again: already cached and protected");
    const struct want s0[2] = {MH(0, -1), MH(4, 0)};
    run(m, "limit, step 0", s0, 2);
    moe_cache_begin_step(m, 1, 1);
    moe_cache_begin_step(m, 0, 2);
    CHECK(moe_cache_prefetch(m, 3, 0, &r) == 0, "step 2: g1 and g2 still protected");
    const struct want s2[1] = {MH(5, 4)};
    run(m, "limit, step 2", s2, 1);
    moe_cache_begin_step(m, 1, 2);
    CHECK(moe_cache_prefetch(m, 3, 0, &r) == 1 && r.outcome == MOE_CACHE_MISS_HIGH && r.evicted == 1,
          "step 3: the protection ran out: g1 evicted (%d)", (int)r.evicted);
    /* a cached unprotected copy: the prefetch protects it without a load */
    CHECK(moe_cache_prefetch(m, 2, 0, &r) == 1 && r.outcome == MOE_CACHE_HIT_HIGH, "g2 protected in place");
    moe_cache_free(m);
    /* one high slot: nothing may be protected */
    m = make(2, 4, MOE_CACHE_LRU, 1, 0, NULL, NULL, NULL);
    moe_cache_begin_step(m, 0, 1);
    CHECK(moe_cache_prefetch(m, 1, 0, &r) == 0, "one slot: no prefetch");
    moe_cache_free(m);
}

/* test_batch: moe_cache_access_n counts exactly what single calls give, on
 * random streams for every policy, with prefetches between steps. */
static void test_batch(void) {
    unsigned seed = 11;
    int differ = 0;
    const int32_t order[24] = {5, 3, 0, 7, 1, 2, 4, 6, 9, 8, 10, 11, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12};
    double freq[24];
    for (int i = 0; i < 24; i++) freq[i] = (double)((i * 7) % 5) / 5;
    const double w[MOE_CACHE_N_WEIGHTS] = {0.3, 0.2, 0.2, 0.1, 0.2};
    for (int p = 0; p < MOE_CACHE_N_POLICIES; p++) {
        struct moe_cache *a = make(3, 8, (enum moe_cache_policy)p, 5, 3, w, freq, order);
        struct moe_cache *b = make(3, 8, (enum moe_cache_policy)p, 5, 3, w, freq, order);
        int64_t ca[MOE_CACHE_N_OUTCOMES] = {0}, cb[MOE_CACHE_N_OUTCOMES] = {0}, ha = 0, hb = 0;
        for (int step = 0; a && b && step < 300; step++) {
            int32_t g[4], nh[4], nl[4];
            uint8_t nd[4];
            const int l = step % 3;
            if (l == 0 && step % 30 == 0) moe_cache_begin_sequence(a), moe_cache_begin_sequence(b);
            moe_cache_begin_step(a, l, 1 + step / 3), moe_cache_begin_step(b, l, 1 + step / 3);
            for (int i = 0; i < 4; i++) {
                seed = seed * 1103515245u + 12345u;
                g[i] = l * 8 + (int32_t)((seed >> 16) % 8);
                nd[i] = (uint8_t)((seed >> 8) % 3);
                nh[i] = (int32_t)(step * 4 + i + 1 + (seed >> 4) % 40), nl[i] = nh[i] + (int32_t)((seed >> 3) % 9);
            }
            struct moe_cache_result ra, rb;
            const int32_t pf = ((l + 1) % 3) * 8 + (int32_t)(seed % 8);
            CHECK(moe_cache_prefetch(a, pf, 1, &ra) == moe_cache_prefetch(b, pf, 1, &rb), "same prefetch");
            for (int i = 0; i < 4; i++) {
                moe_cache_access(a, g[i], (enum moe_cache_need)nd[i], nh[i], nl[i], &ra);
                ca[ra.outcome]++;
                ha += ra.prefetch_hit;
            }
            moe_cache_access_n(b, 4, g, nd, nh, nl, cb, &hb);
        }
        differ += memcmp(ca, cb, sizeof ca) != 0 || ha != hb;
        for (int i = 0; a && b && i < 24; i++)
            differ += moe_cache_contains(a, i, 1) != moe_cache_contains(b, i, 1) ||
                      moe_cache_contains(a, i, 0) != moe_cache_contains(b, i, 0);
        CHECK(ca[MOE_CACHE_HIT_HIGH] + ca[MOE_CACHE_HIT_LOW] > 0 && ca[MOE_CACHE_MISS_HIGH] > 0,
              "%s: hits and misses", moe_cache_policy_name((enum moe_cache_policy)p));
        CHECK(moe_cache_count(a, 1) <= 5 && moe_cache_count(a, 0) <= 3, "capacities respected");
        moe_cache_free(a);
        moe_cache_free(b);
    }
    CHECK(differ == 0, "the batch entry point equals single accesses (%d differences)", differ);
}

/* test_errors: what moe_cache_check_config and moe_cache_new refuse, each
 * with one message; names and their parser. */
static void test_errors(void) {
    struct moe_cache_config c = moe_cache_default_config();
    const int32_t order[4] = {0, 1, 2, 3};
    CHECK(moe_cache_check_config(MOE_CACHE_HOBBIT, &c) == MOE_OK, "the default configuration is valid");
    struct {
        enum moe_cache_policy p;
        int field;
        double v;
        const char *what;
    } bad[] = {
        {(enum moe_cache_policy)42, -1, 0, "unknown policy"},
        {(enum moe_cache_policy)-1, -1, 0, "negative policy"},
        {MOE_CACHE_LRU, 0, -1, "negative high capacity"},
        {MOE_CACHE_LRU, 1, -1, "negative low capacity"},
        {MOE_CACHE_LRU, 2, -0.5, "negative low cost"},
        {MOE_CACHE_LRU, 2, NAN, "NaN low cost"},
        {MOE_CACHE_LRU, 3, -1, "negative byte size"},
        {MOE_CACHE_STATIC, 4, 0, "static without an order"},
        {MOE_CACHE_HOBBIT, 5, 0.6, "weights summing to 1.1"},
        {MOE_CACHE_HOBBIT, 6, -0.25, "a negative weight"},
        {MOE_CACHE_HOBBIT, 7, NAN, "a NaN weight"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = moe_cache_default_config();
        c.order = order;
        switch (bad[i].field) {
        case 0: c.high_cap = (int)bad[i].v; break;
        case 1: c.low_cap = (int)bad[i].v; break;
        case 2: c.low_cost = bad[i].v; break;
        case 3: c.high_bytes = bad[i].v; break;
        case 4: c.order = NULL; break;
        case 5: c.w[0] = bad[i].v, c.w[1] = 0.5, c.w[2] = c.w[3] = 0; break;
        case 6: c.w[0] = bad[i].v, c.w[1] = 1.25, c.w[2] = c.w[3] = 0; break;
        case 7: c.w[0] = bad[i].v; break;
        }
        log_reset();
        CHECK(moe_cache_check_config(bad[i].p, &c) == MOE_ERR_INVALID && g_n_err == 1, "%s refused (%d messages)",
              bad[i].what, g_n_err);
        struct moe_cache *m = (struct moe_cache *)&c;
        log_reset();
        CHECK(moe_cache_new(2, 4, bad[i].p, &c, &m) == MOE_ERR_INVALID && !m && g_n_err == 1, "new: %s", bad[i].what);
    }
    log_reset();
    CHECK(moe_cache_check_config(MOE_CACHE_LRU, NULL) == MOE_ERR_INVALID && g_n_err == 1, "no configuration");
    /* weights are checked for HOBBIT only */
    c = moe_cache_default_config();
    c.w[0] = 7;
    CHECK(moe_cache_check_config(MOE_CACHE_LRU, &c) == MOE_OK, "LRU ignores the weights");
    struct moe_cache *m = NULL;
    c = moe_cache_default_config();
    log_reset();
    CHECK(moe_cache_new(0, 4, MOE_CACHE_LRU, &c, &m) == MOE_ERR_INVALID && !m && g_n_err == 1, "no layers");
    CHECK(moe_cache_new(4, 0, MOE_CACHE_LRU, &c, &m) == MOE_ERR_INVALID && !m, "no experts");
    CHECK(moe_cache_new(1 << 16, 1 << 16, MOE_CACHE_LRU, &c, &m) == MOE_ERR_INVALID && !m, "too many experts");
    /* a damaged order and out-of-range experts never crash */
    const int32_t damaged[4] = {-3, 99, 1, 1};
    c.high_cap = 2, c.order = damaged;
    CHECK(moe_cache_new(1, 4, MOE_CACHE_STATIC, &c, &m) == MOE_OK, "static with a damaged order");
    if (m) {
        struct moe_cache_result r;
        moe_cache_begin_step(m, 0, 1);
        moe_cache_access(m, 1, H, NV, NV, &r);
        CHECK(r.outcome == MOE_CACHE_MISS_HIGH && r.kept == 1, "the valid entry is pinned");
        moe_cache_access(m, 77, H, NV, NV, &r);
        CHECK(r.outcome == MOE_CACHE_MISS_HIGH && r.kept == 0 && r.evicted == -1, "an out-of-range expert: scratch");
        CHECK(!moe_cache_contains(m, -1, 1) && !moe_cache_contains(m, 4, 1), "contains out of range");
        moe_cache_free(m);
    }
    enum moe_cache_policy p = MOE_CACHE_LRU;
    int names_ok = 1;
    for (int i = 0; i < MOE_CACHE_N_POLICIES; i++)
        names_ok &= moe_cache_policy_parse(moe_cache_policy_name((enum moe_cache_policy)i), &p) == MOE_OK && (int)p == i;
    CHECK(names_ok, "every name parses back to its policy");
    log_reset();
    CHECK(moe_cache_policy_parse("mru", &p) == MOE_ERR_INVALID && moe_cache_policy_parse(NULL, &p) == MOE_ERR_INVALID &&
              g_n_err == 0,
          "unknown names refused, not logged");
    CHECK(strcmp(moe_cache_policy_name(MOE_CACHE_STATIC), "twiddler") == 0 &&
              strcmp(moe_cache_policy_name((enum moe_cache_policy)9), "?") == 0,
          "names");
}

int main(void) {
    moe_log_set(capture, NULL);
    test_lru();
    test_set_policy();
    test_guard_switch();
    test_lfu();
    test_lhu();
    test_layers();
    test_hobbit();
    test_popularity();
    test_low_copy();
    test_reference();
    test_precision();
    test_static();
    test_belady();
    test_protect_ahead();
    test_protect_limit();
    test_batch();
    test_errors();
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}

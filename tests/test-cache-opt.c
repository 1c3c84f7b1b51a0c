/*
 * test-cache-opt.c - the offline optimum of the two-precision expert cache
 * (tools/calibrate/cache-opt.c) against an exhaustive search: on tiny random
 * traces (up to 4 experts, capacities 0-2, high, low and skip needs, several
 * low-miss costs) every cache state after every access is enumerated with the
 * store's rules, and the solver's lower bound is never above that optimum,
 * its schedule never below it, and where it says "exact" it is that optimum;
 * it also reaches it on almost every case. On larger random traces (several
 * sequences, prompt batches) no policy of the cache core that does not
 * prefetch goes below the bound, including HOBBIT with admission control and
 * Belady, which with two precisions is no bound: the exhaustive search finds
 * it above the optimum on some tiny traces (issue 31, item 8). With one
 * precision the bound is Belady's MIN and exact. Bad arguments are errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache-opt.h"
#include "moe-test.h"
#include "moe-test-log.h"

#define MAX_TOK 48
#define MAX_SLOT (MAX_TOK * 4 * 2)

/* A random routing trace of L layers x E experts, top-K, n_seq sequences. */
struct tt {
    int L, E, K, n_seq, n_tok;
    int64_t seq_start[9];
    int16_t experts[MAX_SLOT];
    float weights[MAX_SLOT];
};

static struct moe_trace tt_view(const struct tt *t) {
    struct moe_trace v = {t->L, t->E, t->K, t->n_seq, t->seq_start, t->experts, t->weights};
    return v;
}

/* random_trace: distinct experts per (token, layer), weights random so
 * that a split at T1 / T2 gives every need; repeats of the last token's
 * expert are likely (reuse, as in real routing). */
static void random_trace(struct tt *t, int L, int E, int K, int n_seq, int len) {
    memset(t, 0, sizeof *t);
    t->L = L, t->E = E, t->K = K;
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i < len && t->n_tok < MAX_TOK; i++) {
            for (int l = 0; l < L; l++) {
                const size_t row = ((size_t)t->n_tok * L + l) * K;
                for (int j = 0; j < K; j++) {
                    int e, dup;
                    do {
                        e = (int)(moe_test_rnd64() % (uint64_t)E);
                        if (t->n_tok > 0 && moe_test_rnd64() % 3 == 0) e = t->experts[row - (size_t)L * K + j];
                        dup = 0;
                        for (int m = 0; m < j; m++) dup |= t->experts[row + m] == e;
                    } while (dup);
                    t->experts[row + j] = (int16_t)e;
                    t->weights[row + j] = (float)(0.05 + moe_test_rnd_unit());
                }
            }
            t->n_tok++;
        }
        t->seq_start[++t->n_seq] = t->n_tok;
    }
}

static struct moe_cache_trace *prep(const struct tt *t, double t1, double t2, int prompt) {
    struct moe_trace v = tt_view(t);
    struct moe_cache_trace_params pp = moe_cache_trace_default_params();
    pp.t1 = t1, pp.t2 = t2, pp.prompt_len = prompt;
    struct moe_cache_trace *tr = NULL;
    CHECK(moe_cache_trace_new(&v, NULL, 0, &pp, &tr) == MOE_OK, "prepare");
    return tr;
}

/* ---- the exhaustive search: the oracle ---- */

/* popcount of a small mask */
static int bits(unsigned m) {
    int n = 0;
    for (; m; m &= m - 1) n++;
    return n;
}

/* brute: the least penalty over every schedule of the store's class: a
 * state is (high copies, low copies) as bit masks over the <= 4 experts;
 * at each access the copy a miss loads may be added, and any copies dropped,
 * as long as the capacities hold (so evictions at any time, bypass, keeping
 * a low copy under a high one are all covered). */
static double brute(const struct moe_cache_trace *tr, int LE, int H, int Lc, double c) {
    const int32_t *g;
    const uint8_t *need;
    const int64_t n = moe_cache_trace_accesses(tr, &g, &need);
    const int S = 1 << LE;
    double cur[256], nxt[256];
    for (int s = 0; s < S * S; s++) cur[s] = INFINITY;
    cur[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        const unsigned b = 1u << g[i];
        for (int s = 0; s < S * S; s++) nxt[s] = INFINITY;
        for (int s = 0; s < S * S; s++) {
            if (!(cur[s] < INFINITY)) continue;
            unsigned hi = (unsigned)s / (unsigned)S, lo = (unsigned)s % (unsigned)S;
            double cost = 0;
            if (hi & b) {
            } else if ((lo & b) && need[i] != MOE_CACHE_NEED_HIGH) {
            } else if (need[i] == MOE_CACHE_NEED_HIGH) {
                cost = 1, hi |= b; /* loaded: may be kept */
            } else if (need[i] == MOE_CACHE_NEED_LOW) {
                cost = c, lo |= b;
            }
            for (unsigned h2 = hi;; h2 = (h2 - 1) & hi) { /* every subset of what is there */
                for (unsigned l2 = lo;; l2 = (l2 - 1) & lo) {
                    if (bits(h2) <= H && bits(l2) <= Lc) {
                        double *d = &nxt[h2 * (unsigned)S + l2];
                        if (cur[s] + cost < *d) *d = cur[s] + cost;
                    }
                    if (!l2) break;
                }
                if (!h2) break;
            }
        }
        memcpy(cur, nxt, sizeof cur);
    }
    double best = INFINITY;
    for (int s = 0; s < S * S; s++) best = fmin(best, cur[s]);
    return best;
}

/* policies: every policy of the core without prefetch (and four HOBBIT
 * variants with popularity, admission and random weights) on tr; returns the
 * least penalty, sets *belady, and clears *ok when one is below `lower`. */
static double policies(const struct moe_cache_trace *tr, const struct tt *t, int H, int Lc, double cost,
                       double *belady, double *ok, double lower) {
    struct moe_trace v = tt_view(t);
    double freq[64], fh[64], fl[64];
    int32_t order[64], all[8];
    for (int i = 0; i < t->n_seq; i++) all[i] = i;
    CHECK(moe_cache_popularity(&v, all, t->n_seq, freq, order) == MOE_OK, "popularity");
    moe_cache_trace_need_freq(tr, fh, fl);
    struct moe_cache_config c = moe_cache_default_config();
    c.high_cap = H, c.low_cap = Lc, c.low_cost = cost, c.freq = freq, c.order = order;
    double best = INFINITY;
    for (int p = 0; p < MOE_CACHE_N_POLICIES + 4; p++) {
        enum moe_cache_policy pol = p < MOE_CACHE_N_POLICIES ? (enum moe_cache_policy)p : MOE_CACHE_HOBBIT;
        if (p >= MOE_CACHE_N_POLICIES) { /* HOBBIT variants: popularity and admission */
            c.freq_high = fh, c.freq_low = fl, c.admit = p % 2;
            for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++) c.w[i] = moe_test_rnd_unit() + 0.01;
            double sum = c.w[0] + c.w[1] + c.w[2] + c.w[3] + c.w[4];
            for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++) c.w[i] /= sum;
        }
        struct moe_cache_stats s;
        CHECK(moe_cache_simulate(tr, pol, &c, &s) == MOE_OK, "simulate %d", p);
        if (pol == MOE_CACHE_BELADY) *belady = s.penalty;
        if (s.penalty < lower - 1e-9) {
            *ok = 0;
            fprintf(stderr, "%s (variant %d) penalty %.6f below the bound %.6f\n", moe_cache_policy_name(pol), p,
                    s.penalty, lower);
        }
        best = fmin(best, s.penalty);
    }
    return best;
}

/* test_exhaustive: the solver against the oracle on tiny traces. */
static void test_exhaustive(void) {
    static const double costs[] = {0.25, 0.3088, 0.5, 0.8, 1.0};
    int below = 0, above = 0, wrong_exact = 0, exact = 0, cases = 0, policy_below = 0, closed_above = 0;
    int belady_above = 0;
    moe_test_rng = 31;
    for (int round = 0; round < 600; round++) {
        struct tt t;
        const int L = 1 + round % 2, E = L == 1 ? 2 + round % 3 : 2, K = 2; /* at most 4 experts */
        random_trace(&t, L, E, K, 1 + round % 3, 3 + round % 8);
        const double t1 = round % 4 == 0 ? 1.0 : 0.55 + 0.1 * (round % 3), t2 = round % 5 == 0 ? t1 : 0.85;
        struct moe_cache_trace *tr = prep(&t, t1, t2 < t1 ? t1 : t2, round % 7 == 0 ? 2 : 0);
        const int H = (round / 3) % 3, Lc = (round / 9) % 3;
        const double cost = costs[round % 5];
        const double opt = brute(tr, L * E, H, Lc, cost);
        struct moe_cache_config c = moe_cache_default_config();
        c.high_cap = H, c.low_cap = Lc, c.low_cost = cost;
        struct moe_cache_opt_result r;
        CHECK(moe_cache_opt_solve(tr, &c, NULL, &r) == MOE_OK, "solve");
        cases++;
        below += r.upper < opt - 1e-9;
        above += r.lower > opt + 1e-9;
        closed_above += r.closed_form > opt + 1e-9;
        wrong_exact += r.exact && fabs(r.upper - opt) > 1e-9;
        exact += r.exact;
        double bel = 0, ok = 1;
        const double best = policies(tr, &t, H, Lc, cost, &bel, &ok, r.lower);
        policy_below += !ok || best < opt - 1e-9;
        belady_above += bel > opt + 1e-9;
        if (r.lower > opt + 1e-9 || r.upper < opt - 1e-9 || (r.exact && fabs(r.upper - opt) > 1e-9))
            fprintf(stderr, "round %d: H %d L %d c %g: optimum %.6f, solver [%.6f, %.6f] exact %d\n", round, H, Lc, cost,
                    opt, r.lower, r.upper, r.exact);
        moe_cache_trace_free(tr);
    }
    CHECK(above == 0, "the lower bound never exceeds the optimum (%d of %d did)", above, cases);
    CHECK(closed_above == 0, "the closed-form bound never exceeds the optimum (%d of %d did)", closed_above, cases);
    CHECK(below == 0, "the schedule found is never below the optimum (%d of %d were)", below, cases);
    CHECK(wrong_exact == 0, "\"exact\" is the optimum (%d of %d were not)", wrong_exact, cases);
    CHECK(policy_below == 0, "no policy goes below the optimum or the bound (%d cases)", policy_below);
    CHECK(belady_above > 0, "with two precisions Belady's MIN is above the optimum on some traces (%d): no bound",
          belady_above);
    CHECK(exact * 100 >= cases * 95, "the optimum is reached on almost every tiny case (%d of %d)", exact, cases);
    printf("exhaustive: %d cases, %d exact; Belady above the optimum on %d\n", cases, exact, belady_above);
}

/* test_policies_above: on larger traces no demand policy goes below the
 * bound, and some policy beats Belady there (two precisions). */
static void test_policies_above(void) {
    int ok_all = 1, beats_belady = 0, upper_bad = 0;
    double max_gap = 0;
    moe_test_rng = 77;
    for (int round = 0; round < 40; round++) {
        struct tt t;
        const int L = 2 + round % 3, E = 4 + round % 5, K = 2;
        random_trace(&t, L, E, K, 2 + round % 3, 8 + round % 9);
        struct moe_cache_trace *tr = prep(&t, 0.55 + 0.05 * (round % 4), 0.85, round % 3 == 0 ? 4 : 0);
        const int H = 1 + round % (L * E / 2), Lc = round % 4;
        const double cost = round % 2 ? 0.3088 : 0.5;
        struct moe_cache_config c = moe_cache_default_config();
        c.high_cap = H, c.low_cap = Lc, c.low_cost = cost;
        struct moe_cache_opt_result r;
        CHECK(moe_cache_opt_solve(tr, &c, NULL, &r) == MOE_OK, "solve");
        double bel = 0, ok = 1;
        const double best = policies(tr, &t, H, Lc, cost, &bel, &ok, r.lower);
        ok_all &= ok > 0;
        beats_belady += best < bel - 1e-9;
        upper_bad += r.upper < r.lower - 1e-9;
        if (best > 0) max_gap = fmax(max_gap, (best - r.lower) / best);
        moe_cache_trace_free(tr);
    }
    CHECK(ok_all, "no policy without prefetch goes below the bound");
    CHECK(upper_bad == 0, "the schedule found is never below the bound");
    printf("larger traces: best policy at most %.1f %% above the bound; %d traces where Belady is beaten\n",
           100 * max_gap, beats_belady);
}

/* test_one_precision: every need high: the optimum is Belady's MIN, and the
 * solver says so exactly. */
static void test_one_precision(void) {
    int wrong = 0;
    moe_test_rng = 5;
    for (int round = 0; round < 20; round++) {
        struct tt t;
        random_trace(&t, 2 + round % 2, 5 + round % 4, 2, 2, 10 + round);
        struct moe_cache_trace *tr = prep(&t, 1, 1, round % 2 ? 3 : 0);
        struct moe_cache_config c = moe_cache_default_config();
        c.high_cap = 1 + round % 6, c.low_cap = round % 3, c.low_cost = 0.3;
        struct moe_cache_stats b;
        struct moe_cache_opt_result r;
        CHECK(moe_cache_simulate(tr, MOE_CACHE_BELADY, &c, &b) == MOE_OK, "belady");
        CHECK(moe_cache_opt_solve(tr, &c, NULL, &r) == MOE_OK, "solve");
        wrong += !r.exact || r.lower != b.penalty || r.closed_form != b.penalty;
        moe_cache_trace_free(tr);
    }
    CHECK(wrong == 0, "one precision: the bound is Belady's misses, exact (%d differ)", wrong);
}

/* test_limits: with no ascent the closed-form bound stands; too many
 * requests is said; a known schedule is taken as the upper bound. */
static void test_limits(void) {
    struct tt t;
    moe_test_rng = 9;
    random_trace(&t, 3, 6, 2, 3, 14);
    struct moe_cache_trace *tr = prep(&t, 0.6, 0.9, 0);
    struct moe_cache_config c = moe_cache_default_config();
    c.high_cap = 4, c.low_cap = 3, c.low_cost = 0.3;
    struct moe_cache_opt_params op = moe_cache_opt_default_params();
    struct moe_cache_opt_result r, full;
    CHECK(moe_cache_opt_solve(tr, &c, &op, &full) == MOE_OK && full.requests > 0, "solve");
    op.max_iters = 0;
    CHECK(moe_cache_opt_solve(tr, &c, &op, &r) == MOE_OK && r.iters == 0 && r.lower >= r.closed_form &&
              r.lower <= full.lower + 1e-9 && r.lagrangian == 0,
          "no ascent: the closed-form bound (%g <= %g)", r.lower, full.lower);
    op = moe_cache_opt_default_params();
    op.max_requests = 3;
    CHECK(moe_cache_opt_solve(tr, &c, &op, &r) == MOE_OK &&
              (r.stop == MOE_CACHE_OPT_TOO_LARGE || r.exact) && strcmp(moe_cache_opt_stop_name(r.stop), "?") != 0,
          "too many requests: closed-form bound only");
    op = moe_cache_opt_default_params();
    op.upper = full.lower; /* claim a schedule at the bound: then it is the optimum */
    CHECK(moe_cache_opt_solve(tr, &c, &op, &r) == MOE_OK && r.upper <= full.lower + 1e-12, "a known schedule");
    moe_cache_trace_free(tr);
}

static void test_errors(void) {
    struct tt t;
    random_trace(&t, 1, 3, 2, 1, 4);
    struct moe_cache_trace *tr = prep(&t, 0.6, 0.9, 0);
    struct moe_cache_config c = moe_cache_default_config();
    struct moe_cache_opt_result r;
    struct moe_cache_opt_params op = moe_cache_opt_default_params();
    log_reset();
    CHECK(moe_cache_opt_solve(NULL, &c, NULL, &r) == MOE_ERR_INVALID, "no trace");
    c.high_cap = -1;
    CHECK(moe_cache_opt_solve(tr, &c, NULL, &r) == MOE_ERR_INVALID, "negative capacity");
    c = moe_cache_default_config();
    c.low_cost = NAN;
    CHECK(moe_cache_opt_solve(tr, &c, NULL, &r) == MOE_ERR_INVALID, "NaN cost");
    c = moe_cache_default_config();
    op.max_iters = -1;
    CHECK(moe_cache_opt_solve(tr, &c, &op, &r) == MOE_ERR_INVALID, "negative iterations");
    CHECK(g_n_err == 4, "each logged (%d)", g_n_err);
    c.high_cap = c.low_cap = 0; /* no cache at all: every miss counts, exactly */
    CHECK(moe_cache_opt_solve(tr, &c, NULL, &r) == MOE_OK && r.exact, "empty caches: exact");
    moe_cache_trace_free(tr);
}

int main(void) {
    moe_log_set(capture, NULL);
    test_exhaustive();
    test_policies_above();
    test_one_precision();
    test_limits();
    test_errors();
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}

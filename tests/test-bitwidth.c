/*
 * test-bitwidth.c - the bit-width search and the ranking helpers on hand-made
 * problems whose answers are known:
 *   - 10 experts with known sensitivities and an additive loss (each expert
 *     adds its sensitivity at the low precision, a tenth of it at the middle
 *     one): the ranking from the sensitivities, the uniform bounds, the pair
 *     bracketing the budget, K = the largest prefix within budget (checked
 *     against brute force for many budgets), at most P + ceil(log2 n)
 *     evaluations, and the candidate table;
 *   - a budget the smallest precision meets gives uniform smallest; one no
 *     precision meets is MOE_ERR_RANGE;
 *   - the size budget: the smallest K whose bytes fit, the precision pair
 *     bracketing the size, and MOE_ERR_RANGE when nothing fits;
 *   - malformed problems (two budgets, an order that is not a permutation)
 *     are MOE_ERR_INVALID;
 *   - moe_sens_order and moe_spearman on hand-computed cases.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitwidth.h"
#include "moe-test.h"
#include "sensitivity.h"

#define N 10
#define P 3 /* precision 0 = "q8" (largest), 1 = "q2" (smallest), 2 = "q4": not in size order on purpose */

static const double k_sens[N] = {0.004, 0.0001, 0.02, 0.0005, 0.008, 0.0002, 0.001, 0.03, 0.0003, 0.002};
static int64_t k_bytes[N * P];
static int n_evals;

/* additive loss: low precision adds s, the middle one s / 10, the largest 0 */
static double loss_of(const int16_t *a) {
    double l = 0;
    for (int i = 0; i < N; i++) l += a[i] == 1 ? k_sens[i] : a[i] == 2 ? k_sens[i] / 10 : 0;
    return l;
}

static enum moe_status eval(const int16_t *a, double *loss, void *user) {
    (void)user;
    n_evals++;
    *loss = loss_of(a);
    return MOE_OK;
}

static void setup(int32_t *order) {
    for (int i = 0; i < N; i++) {
        k_bytes[i * P + 0] = 1000 + i;     /* q8 */
        k_bytes[i * P + 1] = 300 + i;      /* q2 */
        k_bytes[i * P + 2] = 550 + i;      /* q4 */
    }
    moe_sens_order(k_sens, N, order);
}

static void check_order(const int32_t *order) {
    static const int32_t want[N] = {1, 5, 8, 3, 6, 9, 0, 4, 2, 7};
    CHECK(!memcmp(order, want, sizeof want), "ranking %d %d %d ... want 1 5 8 ...", order[0], order[1], order[2]);
}

/* brute_k: the largest k whose prefix at `lower` (rest at `upper`) is within budget. */
static int brute_k(const int32_t *order, int lower, int upper, double budget) {
    int best = 0;
    int16_t a[N];
    for (int k = 0; k <= N; k++) {
        for (int i = 0; i < N; i++) a[order[i]] = (int16_t)(i < k ? lower : upper);
        if (loss_of(a) <= budget) best = k;
    }
    return best;
}

static void check_loss_budgets(const int32_t *order) {
    const double all_q4 = 0.0661 / 10, all_q2 = 0.0661;
    const double budgets[] = {0.0001, 0.0005, 0.003, 0.0065, 0.008, 0.01, 0.02, 0.035, 0.06};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        struct moe_bw_problem p = {N, P, k_bytes, order, budgets[b], 0, eval, NULL};
        struct moe_bw_result r;
        n_evals = 0;
        enum moe_status st = moe_bw_search(&p, &r);
        CHECK(st == MOE_OK, "budget %g: status %d", budgets[b], st);
        CHECK(fabs(r.uniform_loss[2] - all_q4) < 1e-12 && fabs(r.uniform_loss[1] - all_q2) < 1e-12 &&
                  r.uniform_loss[0] == 0,
              "budget %g: uniform losses %g %g %g", budgets[b], r.uniform_loss[0], r.uniform_loss[1], r.uniform_loss[2]);
        const int upper = budgets[b] >= all_q4 ? 2 : 0, lower = budgets[b] >= all_q4 ? 1 : 2;
        CHECK(r.upper == upper && r.lower == lower, "budget %g: pair %d/%d, want %d/%d", budgets[b], r.lower, r.upper,
              lower, upper);
        const int want = brute_k(order, lower, upper, budgets[b]);
        CHECK(r.k == want, "budget %g: K %d, brute force %d", budgets[b], r.k, want);
        CHECK(r.loss <= budgets[b] && fabs(r.loss - loss_of(r.assign)) < 1e-15, "budget %g: loss %g", budgets[b],
              r.loss);
        CHECK(n_evals <= P + 4 && r.n_cand == n_evals, "budget %g: %d evaluations, %d candidates", budgets[b], n_evals,
              r.n_cand);
        int16_t a[N];
        moe_bw_assign(&p, lower, upper, want, a);
        CHECK(!memcmp(a, r.assign, sizeof a) && r.bytes == moe_bw_bytes(&p, a), "budget %g: assignment", budgets[b]);
        moe_bw_result_clear(&r);
    }
    /* the smallest precision is within budget: uniform smallest */
    struct moe_bw_problem p = {N, P, k_bytes, order, 0.1, 0, eval, NULL};
    struct moe_bw_result r;
    CHECK(moe_bw_search(&p, &r) == MOE_OK && r.lower == 1 && r.upper == 1 && r.k == N, "generous budget: %d/%d k %d",
          r.lower, r.upper, r.k);
    moe_bw_result_clear(&r);
    /* a zero budget: only the largest precision (loss 0) meets it */
    p.max_loss = 0;
    CHECK(moe_bw_search(&p, &r) == MOE_OK && r.upper == 0 && r.k == 0, "zero budget keeps the largest");
    moe_bw_result_clear(&r);
}

static enum moe_status eval_offset(const int16_t *a, double *loss, void *user) {
    (void)user;
    *loss = loss_of(a) + 1; /* even the largest precision loses 100 % */
    return MOE_OK;
}

static void check_unreachable(const int32_t *order) {
    struct moe_bw_problem p = {N, P, k_bytes, order, 0.5, 0, eval_offset, NULL};
    struct moe_bw_result r;
    CHECK(moe_bw_search(&p, &r) == MOE_ERR_RANGE && r.upper == 0, "unreachable loss budget");
    moe_bw_result_clear(&r);
}

static void check_size_budgets(const int32_t *order) {
    int64_t all[P] = {0};
    for (int i = 0; i < N; i++)
        for (int q = 0; q < P; q++) all[q] += k_bytes[i * P + q];
    /* between uniform q4 and q8: q4/q8 pair, smallest K that fits */
    const int64_t budgets[] = {all[0] + 5, all[0] - 1, all[2] + 2000, all[2], all[1] + 100, all[1]};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        struct moe_bw_problem p = {N, P, k_bytes, order, -1, budgets[b], eval, NULL};
        struct moe_bw_result r;
        CHECK(moe_bw_search(&p, &r) == MOE_OK, "size %lld", (long long)budgets[b]);
        CHECK(r.bytes <= budgets[b], "size %lld: %lld bytes", (long long)budgets[b], (long long)r.bytes);
        if (budgets[b] >= all[0]) {
            CHECK(r.lower == 0 && r.upper == 0, "size %lld: want uniform q8", (long long)budgets[b]);
        } else {
            int lower = budgets[b] >= all[2] ? 2 : 1, upper = budgets[b] >= all[2] ? 0 : 2;
            CHECK(r.lower == lower && r.upper == upper, "size %lld: pair %d/%d", (long long)budgets[b], r.lower, r.upper);
            int16_t a[N];
            int want = N;
            for (int k = N; k >= 0; k--) {
                moe_bw_assign(&p, lower, upper, k, a);
                if (moe_bw_bytes(&p, a) <= budgets[b]) want = k;
            }
            CHECK(r.k == want, "size %lld: K %d, want %d", (long long)budgets[b], r.k, want);
            CHECK(fabs(r.loss - loss_of(r.assign)) < 1e-15, "size budget loss");
        }
        moe_bw_result_clear(&r);
    }
    struct moe_bw_problem p = {N, P, k_bytes, order, -1, all[1] - 1, eval, NULL};
    struct moe_bw_result r;
    CHECK(moe_bw_search(&p, &r) == MOE_ERR_RANGE, "nothing fits");
    moe_bw_result_clear(&r);
}

static void check_malformed(const int32_t *order) {
    struct moe_bw_result r;
    struct moe_bw_problem p = {N, P, k_bytes, order, 0.01, 5000, eval, NULL};
    CHECK(moe_bw_search(&p, &r) == MOE_ERR_INVALID, "two budgets");
    moe_bw_result_clear(&r);
    p.max_bytes = 0;
    p.max_loss = -1;
    CHECK(moe_bw_search(&p, &r) == MOE_ERR_INVALID, "no budget");
    moe_bw_result_clear(&r);
    int32_t bad[N];
    memcpy(bad, order, sizeof bad);
    bad[3] = bad[4];
    struct moe_bw_problem q = {N, P, k_bytes, bad, 0.01, 0, eval, NULL};
    CHECK(moe_bw_search(&q, &r) == MOE_ERR_INVALID, "order with a repeat");
    moe_bw_result_clear(&r);
}

static void check_spearman(void) {
    const double a[5] = {1, 2, 3, 4, 5}, b[5] = {10, 20, 30, 40, 50}, c[5] = {5, 4, 3, 2, 1};
    CHECK(fabs(moe_spearman(a, b, 5) - 1) < 1e-12, "identical ranks");
    CHECK(fabs(moe_spearman(a, c, 5) + 1) < 1e-12, "reversed ranks");
    /* ties: x ranks 1, 2.5, 2.5, 4; y ranks 1, 2, 3, 4 -> rho = 4.5 / sqrt(4.5 * 5) */
    const double x[4] = {1, 2, 2, 3}, y[4] = {1, 2, 3, 4};
    CHECK(fabs(moe_spearman(x, y, 4) - 4.5 / sqrt(4.5 * 5)) < 1e-12, "ties: %g", moe_spearman(x, y, 4));
    const double k[3] = {2, 2, 2};
    CHECK(isnan(moe_spearman(k, a, 3)) && isnan(moe_spearman(a, b, 1)), "undefined cases are NaN");
    int32_t o[4];
    const double s[4] = {0.3, 0.1, 0.3, 0.0};
    moe_sens_order(s, 4, o);
    CHECK(o[0] == 3 && o[1] == 1 && o[2] == 0 && o[3] == 2, "order with ties: %d %d %d %d", o[0], o[1], o[2], o[3]);
}

int main(void) {
    int32_t order[N];
    setup(order);
    check_order(order);
    check_loss_budgets(order);
    check_unreachable(order);
    check_size_budgets(order);
    check_malformed(order);
    check_spearman();
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}

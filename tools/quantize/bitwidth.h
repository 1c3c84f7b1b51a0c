/*
 * bitwidth.h - EdgeMoE's bit-width search (ALGORITHMS.md, EdgeMoE 3): give
 * each routed expert its own stored precision so that the model is as small
 * as possible within a loss budget (or has the smallest loss within a size).
 *
 * The search is independent of how a loss is measured: the caller supplies
 * an evaluation callback (the CLI runs moe_eval on a text; tests use a
 * hand-made loss), each expert's size at each precision and the sensitivity
 * ranking (least sensitive first). Precisions are ordered by their total
 * size, so "lower" always means fewer bytes.
 *
 * Loss budget: every uniform assignment is evaluated; the upper precision is
 * the smallest whose uniform loss is within the budget, the lower one the
 * next smaller. Then the K least sensitive experts go to the lower precision
 * and the rest stay at the upper; K is bisected between 0 (uniform upper,
 * within budget) and n (uniform lower, over budget), assuming the loss grows
 * with K, and the largest K found within the budget is kept.
 * Size budget: the pair of precisions whose uniform sizes bracket the budget,
 * and the smallest K whose assignment fits (sizes are exact, so no search);
 * its loss is evaluated once, next to the uniform pair.
 * Pure computation; not thread-safe per result.
 */
#ifndef MOE_BITWIDTH_H
#define MOE_BITWIDTH_H

#include <stdint.h>

#include "moe-status.h"

/* The loss of an assignment (assign[i] = precision of expert i). */
typedef enum moe_status (*moe_bw_eval_fn)(const int16_t *assign, double *loss, void *user);

struct moe_bw_problem {
    int n;                 /* routed experts (MoE layer * E + expert) */
    int n_prec;            /* stored precisions, 1..64 */
    const int64_t *bytes;  /* [n x n_prec] bytes of expert i at precision p */
    const int32_t *order;  /* [n] a permutation: least sensitive first */
    double max_loss;       /* loss budget; < 0 = none */
    int64_t max_bytes;     /* expert-bytes budget; <= 0 = none (exactly one of the two) */
    moe_bw_eval_fn eval;
    void *user;
};

/* One evaluated assignment. Uniform ones have lower = upper and k = n. */
struct moe_bw_candidate {
    int lower, upper, k;   /* the k least sensitive experts at lower, the rest at upper */
    int64_t bytes;
    double loss;
};

struct moe_bw_result {
    int16_t *assign;       /* [n] chosen precision per expert (owned) */
    int lower, upper, k;   /* the chosen candidate */
    int64_t bytes;
    double loss;
    int n_cand;            /* every evaluation, in the order made (owned) */
    struct moe_bw_candidate *cand;
    int n_prec;
    double *uniform_loss;  /* [n_prec] loss of each uniform assignment; NAN if not evaluated (owned) */
    int64_t *uniform_bytes; /* [n_prec] */
};

/* moe_bw_search: run the search. MOE_ERR_INVALID (logged) for a malformed
 * problem (order not a permutation, both or neither budget); MOE_ERR_RANGE
 * (logged, saying what was closest) when no assignment meets the budget: then
 * out still holds the evaluations made and the closest uniform assignment.
 * Errors of the callback are returned as they are. Free with
 * moe_bw_result_clear (also after an error). */
enum moe_status moe_bw_search(const struct moe_bw_problem *p, struct moe_bw_result *out);

void moe_bw_result_clear(struct moe_bw_result *r);

/* moe_bw_assign: the first k experts of order at `lower`, the rest at `upper`. */
void moe_bw_assign(const struct moe_bw_problem *p, int lower, int upper, int k, int16_t *assign);

/* moe_bw_bytes: total expert bytes of an assignment. */
int64_t moe_bw_bytes(const struct moe_bw_problem *p, const int16_t *assign);

#endif

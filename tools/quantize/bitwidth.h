/*
 * bitwidth.h - EdgeMoE's bit-width search (ALGORITHMS.md, EdgeMoE 3): give
 * each routed expert its own stored precision so that the model is as small
 * as possible within a loss budget (or has the smallest loss within a size).
 *
 * The search is independent of how a loss is measured: the caller supplies
 * an evaluation callback (moe_bw_run_bundle below runs moe_eval on a text;
 * tests use a hand-made loss), each expert's size at each precision and the sensitivity
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

/* ---- the search on a bundle (`moe-prep bitwidth`'s library half) ---------
 *
 * moe_bw_run_bundle does what the command does: loads the bundle, reads the
 * sensitivity ranking (`moe-prep sensitivity`'s output; its shape must match
 * the bundle's MoE layers x experts), tokenizes the dataset, and runs
 * moe_bw_search with loss = relative perplexity increase (moe_eval_run on the
 * text) against every expert at the largest stored precision; optionally
 * measures the chosen and the two uniform assignments around it on a held-out
 * text, and writes the map (over model layers, -1 for dense ones) and the
 * search's figures into the bundle's tuning (moe-tuning.h,
 * MOE_TUNING_BITWIDTH_MAP), keeping the other tuning keys.
 *
 * Not thread-safe with another call on the same bundle file (the tuning is
 * replaced in place; concurrent replacers are serialised by a lock, but the
 * later one wins). The callback runs on the calling thread. */

struct moe_bw_run_params {
    const char *sensitivity; /* the ranking file (required) */
    const char *dataset;     /* dataset spec the search evaluates on (required) */
    const char *heldout;     /* a dataset spec the search does not see, or NULL */
    double max_loss;         /* loss budget (fraction); < 0 = none */
    int64_t max_bytes;       /* expert-bytes budget; <= 0 = none (exactly one of the two) */
    int n_ctx;               /* tokens per evaluation chunk (>= 4) */
    int max_chunks;          /* chunks per text; 0 = all */
    int n_threads;           /* 0 = all online CPUs */
    int write_tuning;        /* write the map into the bundle's tuning */
    /* Optional: called after each evaluation of the search with its number
     * (from 1), the perplexity, the loss and the seconds since the start. */
    void (*on_eval)(int n, double ppl, double loss, double seconds, void *user);
    void *user;
    const char *device;         /* the backend the evaluations run on (moe_session_params.device; NULL = cpu) */
    const void *device_options; /* its options (struct moe_gpu_params *; borrowed), or NULL */
};

/* moe_bw_run_default_params: no budget yet (max_loss -1, max_bytes 0),
 * n_ctx 256, all chunks, all CPUs, the map written. */
struct moe_bw_run_params moe_bw_run_default_params(void);

/* The losses on the held-out text (relative to all experts at the largest
 * precision there). */
struct moe_bw_heldout {
    int done;              /* measured */
    double ref_ppl;        /* perplexity with every expert at the largest precision */
    double chosen, upper, lower; /* losses of the chosen map and the uniform upper / lower */
};

struct moe_bw_run {
    struct moe_bw_result result; /* the search (assign over MoE layer * E + expert) */
    int n;                       /* routed experts searched */
    int n_prec;                  /* stored precisions */
    char (*prec_names)[16];      /* [n_prec] the bundle's precision names (owned) */
    int64_t dense_bytes;         /* the bundle's non-expert bytes */
    struct moe_bw_heldout heldout;
    int search_done;             /* the search (and the held-out check) succeeded: result is the choice */
    int wrote_tuning;            /* the map is in the bundle's tuning */
};

/* moe_bw_run_bundle: the search on the bundle at `bundle` (see above).
 * Returns MOE_OK, or (logged) MOE_ERR_INVALID for missing or contradictory
 * parameters, a model that is not a bundle or has no routed experts, or a
 * ranking of another shape; the reading errors of the bundle, ranking and
 * texts; moe_bw_search's errors (MOE_ERR_RANGE: the budget cannot be met,
 * out->result then holds the evaluations made); an evaluation's error; the
 * tuning replacement's error (out->search_done then says the choice in
 * out->result is complete). Free out with moe_bw_run_clear (also after an
 * error). */
enum moe_status moe_bw_run_bundle(const char *bundle, const struct moe_bw_run_params *p, struct moe_bw_run *out);

void moe_bw_run_clear(struct moe_bw_run *r);

#endif

/*
 * sensitivity.h - EdgeMoE's per-expert sensitivity sweep (ALGORITHMS.md,
 * EdgeMoE 2): for every routed expert (l, e), the loss increase when that
 * expert alone is bound at a low stored precision and every other expert at
 * the base precision, against the all-base model.
 *
 * Sequences run one at a time. For each, one baseline pass records the
 * residual stream entering every layer, the gate inputs and routing of every
 * MoE layer, and the baseline next-token log-probabilities. Then for each
 * expert routed to in the sequence, only what the change touches is
 * recomputed: at layer l the expert's own output changes only for the tokens
 * routed to it, so layer l's output is the cached one plus
 * g * (E_low(x) - E_base(x)) on those rows (attention and the other experts
 * of layer l are not rerun); then layers l+1.. run from that residual stream
 * (moe_session_forward_from), or, after the model's last layer, only the
 * changed rows go through the LM head. An expert not routed to in a sequence
 * adds nothing and costs nothing. The naive method (one full forward pass per
 * expert) is kept as the reference the cached one is tested against.
 *
 * Metrics, all as means over the sweep's scored positions: KL(P_base ||
 * P_low) of the next-token distributions (every position), the increase of
 * the negative log-likelihood of the true next token (all but the last
 * position of each sequence), and the proxy: the squared norm of the
 * gate-weighted output error g * (E_low(x) - E_base(x)) summed over the
 * tokens routed to the expert, which needs no pass beyond the baseline.
 *
 * Sums are accumulated per sequence in a fixed order (double precision), so a
 * sweep split across runs (moe_sens_state saved and restored) gives bit for
 * bit the result of one run. Not thread-safe per model: the sweep rebinds the
 * model's experts while it runs (and restores them to base on return).
 */
#ifndef MOE_SENSITIVITY_H
#define MOE_SENSITIVITY_H

#include <stdint.h>

#include "moe-model.h"
#include "moe-status.h"

enum moe_sens_metric { MOE_SENS_KL = 0, MOE_SENS_PPL = 1, MOE_SENS_PROXY = 2 };
enum moe_sens_method { MOE_SENS_CACHED = 0, MOE_SENS_NAIVE = 1 };

struct moe_sens_params {
    int low, base;                /* stored precision indices (moe_bundle_precision_at) */
    enum moe_sens_metric metric;  /* PROXY skips the LM head and every recomputation */
    enum moe_sens_method method;
    int n_threads;                /* 0 = all online CPUs */
    /* optional progress, after each sequence: sequences done (of the whole
     * sweep), in all, seconds spent in this call */
    void (*on_seq)(int done, int total, double seconds, void *user);
    void *user;
};

struct moe_sens_params moe_sens_default_params(void);

/* The running sums of a sweep: what a checkpoint saves. Arrays are
 * [n_moe x n_expert] over MoE layers (dense layers are left out), owned. */
struct moe_sens_state {
    int n_moe, n_expert, n_seq, n_ctx;
    int next_seq;          /* sequences [0, next_seq) are in the sums */
    double *kl;            /* sum over positions of KL(P_base || P_low) */
    double *dnll;          /* sum over scored positions of NLL_low - NLL_base */
    double *proxy;         /* sum of ||g (E_low(x) - E_base(x))||^2 over routed tokens */
    int64_t *routed;       /* token-slots routed to the expert */
    int64_t n_kl, n_nll;   /* positions in the KL and NLL sums */
    double base_nll;       /* sum of the baseline NLL over the scored positions */
    double seconds;        /* time spent in the sweep */
    double base_seconds;   /* of it, in the baseline passes (forward and LM head) */
};

/* moe_sens_state_init: zero sums for a sweep of n_seq sequences of n_ctx
 * tokens over model m (a bundle). Free with moe_sens_state_clear. */
enum moe_status moe_sens_state_init(struct moe_sens_state *s, const struct moe_model *m, int n_seq, int n_ctx);
void moe_sens_state_clear(struct moe_sens_state *s);

/* moe_sens_run: add sequences [s->next_seq, seq_end) of `tokens` (n_seq
 * sequences of n_ctx ids, row-major) to the sums and advance next_seq. The
 * model must be a bundle storing both precisions; every routed expert is
 * bound at p->base on return. Stops early, with MOE_OK, when *stop becomes
 * non-zero between sequences (stop may be NULL). */
enum moe_status moe_sens_run(struct moe_model *m, const int32_t *tokens, const struct moe_sens_params *p,
                             struct moe_sens_state *s, int seq_end, const volatile int *stop);

/* moe_sens_scores: the per-expert score the metric ranks by, [n_moe x
 * n_expert]: mean KL per position, mean NLL increase per scored position, or
 * the proxy per position. */
void moe_sens_scores(const struct moe_sens_state *s, enum moe_sens_metric metric, double *out);

/* moe_sens_order: indices (MoE layer * n_expert + expert) least sensitive
 * first (ties: lower index first). */
void moe_sens_order(const double *score, int n, int32_t *order);

/* moe_spearman: Spearman rank correlation of a and b (average ranks for
 * ties); NAN when n < 2 or either is constant. */
double moe_spearman(const double *a, const double *b, int n);

#endif

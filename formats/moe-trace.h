/*
 * moe-trace.h - a routing trace: the experts each token chose, layer by
 * layer, as the session records them (moe-run --trace-out) and the profile
 * file stores them (profile-h5.h). The routing statistics of the tools
 * (tools/common/routing-stats.h) read it; it sits here, below the runtime,
 * so that the runtime's CLI can write a profile without reaching into the
 * tools. Pure computation; arrays are borrowed.
 */
#ifndef MOE_TRACE_H
#define MOE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A routing trace: for each token of each sequence, in order, and each MoE
 * layer, the K selected experts (largest gate weight first) and their gate
 * weights as the model applied them. Arrays are borrowed. */
struct moe_trace {
    int n_layers;            /* MoE layers (dense layers are not in the trace) */
    int n_experts;
    int k;                   /* experts per token */
    int n_seq;
    const int64_t *seq_start; /* [n_seq + 1] token offsets; seq_start[n_seq] = n_tokens */
    const int16_t *experts;   /* [n_tokens x n_layers x k] */
    const float *weights;     /* [n_tokens x n_layers x k] */
};

/* moe_trace_n_tokens: tokens in the trace. */
static inline int64_t moe_trace_n_tokens(const struct moe_trace *t) { return t->seq_start[t->n_seq]; }

/* moe_trace_check: every expert id in range, every gate weight a finite
 * number >= 0, and sequences in order; the error (MOE_ERR_RANGE for ids and
 * weights) names the token and layer. */
enum moe_status moe_trace_check(const struct moe_trace *t);

/* moe_hobbit_scores: s of every selected slot, in trace order
 * ([n_tokens x n_layers x k]): with the K gate weights normalised to sum 1,
 * s_0 = 0 and s_i = g_0 + ... + g_{i-1}. */
void moe_hobbit_scores(const struct moe_trace *t, float *s);

#ifdef __cplusplus
}
#endif
#endif

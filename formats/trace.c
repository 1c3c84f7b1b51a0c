/* trace.c - checks and per-slot scores of routing traces (moe-trace.h). */
#include "moe-trace.h"

#include <math.h>

/* slot: the k experts of token `tok` at MoE layer `l`. */
static const int16_t *slot(const struct moe_trace *t, int64_t tok, int l) {
    return t->experts + ((size_t)tok * (size_t)t->n_layers + (size_t)l) * (size_t)t->k;
}

enum moe_status moe_trace_check(const struct moe_trace *t) {
    if (t->n_layers < 1 || t->n_experts < 1 || t->k < 1 || t->k > t->n_experts || t->n_seq < 0) {
        MOE_LOGE("trace shape %d layers x %d experts x top-%d is invalid", t->n_layers, t->n_experts, t->k);
        return MOE_ERR_INVALID;
    }
    if (t->seq_start[0] != 0) {
        MOE_LOGE("trace: the first sequence starts at token %lld, not 0", (long long)t->seq_start[0]);
        return MOE_ERR_INVALID;
    }
    for (int s = 0; s < t->n_seq; s++)
        if (t->seq_start[s + 1] < t->seq_start[s]) {
            MOE_LOGE("trace: sequence %d ends before it starts", s);
            return MOE_ERR_INVALID;
        }
    const int64_t n = moe_trace_n_tokens(t);
    for (int64_t i = 0; i < n; i++)
        for (int l = 0; l < t->n_layers; l++)
            for (int j = 0; j < t->k; j++) {
                int e = slot(t, i, l)[j];
                if (e < 0 || e >= t->n_experts) {
                    MOE_LOGE("trace: token %lld layer %d: expert %d out of range [0, %d)", (long long)i, l, e,
                             t->n_experts);
                    return MOE_ERR_RANGE;
                }
                float w = t->weights[((size_t)i * (size_t)t->n_layers + (size_t)l) * (size_t)t->k + (size_t)j];
                if (!isfinite(w) || w < 0) { /* NaN / inf would poison every statistic derived from it */
                    MOE_LOGE("trace: token %lld layer %d: gate weight %g is not a finite number >= 0", (long long)i,
                             l, (double)w);
                    return MOE_ERR_RANGE;
                }
            }
    return MOE_OK;
}

void moe_hobbit_scores(const struct moe_trace *t, float *s) {
    const int64_t n = moe_trace_n_tokens(t);
    const int K = t->k;
    for (int64_t i = 0; i < n; i++)
        for (int l = 0; l < t->n_layers; l++) {
            size_t base = ((size_t)i * (size_t)t->n_layers + (size_t)l) * (size_t)K;
            double sum = 0, acc = 0;
            for (int j = 0; j < K; j++) sum += t->weights[base + j];
            for (int j = 0; j < K; j++) {
                s[base + j] = sum > 0 ? (float)(acc / sum) : 0.0f;
                acc += t->weights[base + j];
            }
        }
}

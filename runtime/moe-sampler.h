/*
 * moe-sampler.h - next-token selection: greedy, or seeded sampling with
 * temperature, top-k and top-p (nucleus) filtering, in that order.
 */
#ifndef MOE_SAMPLER_H
#define MOE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

struct moe_sampler_params {
    float temperature; /* 0: greedy (argmax, lowest id on ties); else > 0 and finite */
    int top_k;         /* 0: no top-k filter; else >= 1 */
    float top_p;       /* 1: no nucleus filter; else in (0, 1) */
    uint64_t seed;
};

struct moe_sampler_params moe_sampler_default_params(void);

struct moe_sampler;

/* moe_sampler_create: a sampler over n_vocab logits. MOE_ERR_INVALID (logged)
 * for a negative, NaN or infinite temperature, a negative top_k or a top_p
 * outside (0, 1]: bad values are refused, never read as "greedy". */
enum moe_status moe_sampler_create(const struct moe_sampler_params *p, int n_vocab,
                                   struct moe_sampler **out);
void moe_sampler_free(struct moe_sampler *s);

/* moe_sampler_sample: pick a token from logits[n_vocab]; logits are not modified. */
int32_t moe_sampler_sample(struct moe_sampler *s, const float *logits);

/* moe_logits_first_bad: the index of the first NaN or infinite value of
 * v[0..n), or -1 when all are finite. Callers fail loudly on a bad row (damaged
 * weights give NaN logits, which greedy decoding would quietly turn into a
 * token). */
int64_t moe_logits_first_bad(const float *v, size_t n);

/* moe_argmax: index of the largest value (lowest index on ties). */
int32_t moe_argmax(const float *v, int n);

#endif

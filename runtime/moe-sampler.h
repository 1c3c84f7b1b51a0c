/*
 * moe-sampler.h - next-token selection: greedy, or seeded sampling with
 * temperature, top-k and top-p (nucleus) filtering, in that order.
 *
 * What a draw is. The logits are divided by the temperature (in float); the
 * vocabulary is ordered by that value, descending, lower id first on ties;
 * top-k keeps the first k; top-p keeps the shortest prefix whose softmax
 * mass (exp(x - max) summed in double, in that order) reaches top_p; one
 * splitmix64 number u in [0, 1) picks the token whose slice of the prefix
 * sums holds u times their total. The cost per token is not a sort of the
 * vocabulary (runtime/sampler.c): top-k selects its k with a bounded heap and
 * sorts only those; top-p sorts only the few highest tokens that carry the
 * nucleus, falling back to the full sort only when rounding could decide
 * the nucleus's last token either way. Either way the token for a given
 * seed and logits is the one the full sort gives (tests/test-sampler.c keeps
 * the full sort as the reference).
 *
 * Plain temperature (top_k 0, top_p 1) is the exception: it sorts nothing
 * and walks the prefix sums in id order, with exp(x - max) computed in
 * float (relative error under 1e-6 a term). Its distribution is
 * softmax(logits / T), but the token a given seed picks is not the one the
 * full sort (this sampler before its fast paths) picked. A top_k at or above
 * n_vocab keeps every token in sorted order: the same distribution as
 * top_k 0, drawn as the full sort draws, at the cost of sorting the
 * vocabulary (a radix sort).
 *
 * Logits may hold -inf (masked tokens). NaN or +inf logits, or all -inf
 * (callers check with moe_logits_first_bad), give some token in range.
 *
 * A sampler at temperature > 0 holds about 34 bytes per vocabulary entry;
 * one sampler is used by one thread at a time.
 */
#ifndef MOE_SAMPLER_H
#define MOE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* moe_sampler_sample: pick a token from logits[n_vocab]; logits are not
 * modified. Each call at temperature > 0 takes one number from the
 * sampler's generator. */
int32_t moe_sampler_sample(struct moe_sampler *s, const float *logits);

/* moe_logits_first_bad: the index of the first NaN or infinite value of
 * v[0..n), or -1 when all are finite. Callers fail loudly on a bad row (damaged
 * weights give NaN logits, which greedy decoding would quietly turn into a
 * token). */
int64_t moe_logits_first_bad(const float *v, size_t n);

/* moe_argmax: index of the largest value (lowest index on ties); NaN values
 * are passed over, except a NaN at v[0], which is then the answer (the
 * scalar loop "v[i] > v[best]"). 0 when n < 1. */
int32_t moe_argmax(const float *v, int n);

#ifdef __cplusplus
}
#endif
#endif

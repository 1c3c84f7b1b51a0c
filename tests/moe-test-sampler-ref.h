/* moe-test-sampler-ref.h - the sampler as it was before the fast paths
 * (runtime/sampler.c until then), kept word for word as the reference of
 * test-sampler and bench-sampler: scale by 1/T, qsort the whole vocabulary
 * (logit descending, lower id first), top-k, top-p, one splitmix64 draw.
 * Finite logits only (its comparator is not a total order with NaN). */
#ifndef MOE_TEST_SAMPLER_REF_H
#define MOE_TEST_SAMPLER_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "moe-sampler.h"

struct ref_cand {
    float logit;
    int32_t id;
};

struct ref_sampler {
    struct moe_sampler_params p;
    int n_vocab;
    uint64_t rng;
    struct ref_cand *cands; /* [n_vocab] */
};

/* ref_init: the reference sampler with the same seed as moe_sampler_create;
 * 0 when out of memory. */
static inline int ref_init(struct ref_sampler *r, const struct moe_sampler_params *p, int n_vocab) {
    r->p = *p;
    r->n_vocab = n_vocab;
    r->rng = p->seed ^ 0x9e3779b97f4a7c15ull;
    r->cands = malloc(sizeof *r->cands * (size_t)n_vocab);
    return r->cands != NULL;
}

static inline void ref_free(struct ref_sampler *r) { free(r->cands); }

static inline double ref_next_u01(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static inline int ref_cmp_desc(const void *a, const void *b) {
    const struct ref_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* ref_sample: the old moe_sampler_sample. */
static inline int32_t ref_sample(struct ref_sampler *s, const float *logits) {
    if (s->p.temperature <= 0.0f) {
        int32_t best = 0;
        for (int i = 1; i < s->n_vocab; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    int n = s->n_vocab;
    for (int i = 0; i < n; i++) s->cands[i] = (struct ref_cand){logits[i] / s->p.temperature, i};
    qsort(s->cands, (size_t)n, sizeof *s->cands, ref_cmp_desc);
    if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
    double mx = s->cands[0].logit, sum = 0;
    for (int i = 0; i < n; i++) sum += exp(s->cands[i].logit - mx);
    if (s->p.top_p < 1.0f) {
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += exp(s->cands[i].logit - mx) / sum;
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0;
        for (int i = 0; i < n; i++) sum += exp(s->cands[i].logit - mx);
    }
    double r = ref_next_u01(&s->rng) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp(s->cands[i].logit - mx);
        if (r < acc) return s->cands[i].id;
    }
    return s->cands[n - 1].id;
}

#endif

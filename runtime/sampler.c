/* sampler.c - greedy and seeded temperature / top-k / top-p sampling. */
#include "moe-sampler.h"

#include <math.h>
#include <stdlib.h>

struct cand {
    float logit;
    int32_t id;
};

struct moe_sampler {
    struct moe_sampler_params p;
    int n_vocab;
    uint64_t rng;
    struct cand *cands; /* [n_vocab] */
};

struct moe_sampler_params moe_sampler_default_params(void) {
    struct moe_sampler_params p = {0.0f, 0, 1.0f, 0};
    return p;
}

enum moe_status moe_sampler_create(const struct moe_sampler_params *p, int n_vocab,
                                   struct moe_sampler **out) {
    *out = NULL;
    /* a negative or non-finite temperature, or top-p outside (0, 1], is a
     * mistake to report, not a request for greedy decoding */
    if (!p || !(p->temperature >= 0.0f) || isinf(p->temperature) || !(p->top_p > 0.0f && p->top_p <= 1.0f) ||
        p->top_k < 0 || n_vocab < 1) {
        MOE_LOGE("bad sampling parameters: temperature %g (must be a finite number >= 0), top-k %d (>= 0), "
                 "top-p %g (in (0, 1]), %d vocabulary entries",
                 p ? (double)p->temperature : 0.0, p ? p->top_k : 0, p ? (double)p->top_p : 0.0, n_vocab);
        return MOE_ERR_INVALID;
    }
    struct moe_sampler *s = calloc(1, sizeof *s);
    if (!s) return MOE_ERR_NOMEM;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed ^ 0x9e3779b97f4a7c15ull;
    s->cands = malloc(sizeof *s->cands * (size_t)n_vocab);
    if (!s->cands) {
        free(s);
        return MOE_ERR_NOMEM;
    }
    *out = s;
    return MOE_OK;
}

void moe_sampler_free(struct moe_sampler *s) {
    if (!s) return;
    free(s->cands);
    free(s);
}

int64_t moe_logits_first_bad(const float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return (int64_t)i;
    return -1;
}

int32_t moe_argmax(const float *v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* next_u01: splitmix64 step mapped to [0, 1). */
static double next_u01(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static int cmp_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

int32_t moe_sampler_sample(struct moe_sampler *s, const float *logits) {
    if (s->p.temperature <= 0.0f) return moe_argmax(logits, s->n_vocab);
    int n = s->n_vocab;
    for (int i = 0; i < n; i++) s->cands[i] = (struct cand){logits[i] / s->p.temperature, i};
    qsort(s->cands, (size_t)n, sizeof *s->cands, cmp_desc);
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
    double r = next_u01(&s->rng) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp(s->cands[i].logit - mx);
        if (r < acc) return s->cands[i].id;
    }
    return s->cands[n - 1].id;
}

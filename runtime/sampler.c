/* sampler.c - greedy and seeded temperature / top-k / top-p sampling.
 *
 * The specification is one slow algorithm (sample_full): scale every logit by
 * 1/T, sort the whole vocabulary (logit descending, lower id first on ties),
 * keep the first top_k, keep the nucleus (the shortest prefix whose softmax
 * mass reaches top_p), draw one uniform number and walk the prefix sums. The
 * fast paths avoid the full sort and give the same token for the same seed,
 * except plain temperature sampling, which draws in id order (moe-sampler.h):
 *
 *   0 < top_k < n_vocab  sample_top_k: a bounded heap keeps the k best while
 *                        one pass skips blocks with nothing better than its
 *                        worst; only those k are sorted; then the
 *                        specification's top-p and draw on the same list.
 *   top_k 0 (or >= n),   sample_top_p: a histogram of exp(x - max) by x finds
 *   top_p < 1            the highest bins whose mass covers top_p; only their
 *                        tokens are sorted. The nucleus is decided on that
 *                        sorted prefix, with the vocabulary's sum made of the
 *                        specification's own terms for the prefix and an
 *                        approximation with a proven error for the rest;
 *                        when top_p falls within that error of a boundary the
 *                        rest is summed with the specification's terms too,
 *                        and if still undecided, the full sort runs.
 *   top_k 0, top_p 1     sample_plain: one pass of exp(x - max) in float with
 *                        block sums, then a walk over blocks and one block.
 *   top_k >= n, top_p 1  sample_full.
 *
 * Sorting is a stable radix sort on the float's bits (sort_cands). Loops
 * that run over the vocabulary work in blocks of BLK with fixed trip counts,
 * so that GCC vectorises them at -O2 (plain C, no intrinsics). */
#include "moe-sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BLK 64
/* top-p histogram: bins of 1/16 in x = max - logit/T over [0, 40), the last
 * bin holds everything below (and NaN) */
#define HIST_PER_UNIT 16
#define HIST_N (40 * HIST_PER_UNIT + 1)
/* exp_neg_approx's relative error for an exact float input (measured over
 * every float in [-87, 0]: 2.54e-7; a margin on top) */
#define EXP_APPROX_REL 1e-6
#define U53 0x1p-53 /* unit roundoff of double */

struct cand {
    float logit;
    int32_t id;
};

struct moe_sampler {
    struct moe_sampler_params p;
    int n_vocab;
    uint64_t rng;
    struct cand *cands;  /* [n_vocab] the top-k heap, the top-p prefix or the whole vocabulary */
    struct cand *tmp;    /* [n_vocab] sort_cands' other buffer */
    double *ex;          /* [n_vocab] exp(cands[i].logit - cands[0].logit), i < n_ex (cand_exp) */
    int n_ex;
    float *scaled;       /* [n_vocab] logits / temperature */
    float *w;            /* [n_vocab] exp_neg_approx(scaled - max) */
    uint16_t *bin;       /* [n_vocab] top-p histogram bin of each token */
    double *blk;         /* [n_vocab / BLK] sums of w by block */
    double hist[HIST_N]; /* top-p: sum of w by bin */
    double part[4][HIST_N]; /* top_p_histogram's four partial histograms */
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
    *out = s;
    if (p->temperature == 0.0f) return MOE_OK; /* greedy: moe_argmax, no buffers */
    const size_t n = (size_t)n_vocab;
    s->cands = malloc(sizeof *s->cands * n);
    s->tmp = malloc(sizeof *s->tmp * n);
    s->ex = malloc(sizeof *s->ex * n);
    s->scaled = malloc(sizeof *s->scaled * n);
    s->w = malloc(sizeof *s->w * n);
    s->bin = malloc(sizeof *s->bin * n);
    s->blk = malloc(sizeof *s->blk * (n / BLK + 1));
    if (!s->cands || !s->tmp || !s->ex || !s->scaled || !s->w || !s->bin || !s->blk) {
        moe_sampler_free(s);
        *out = NULL;
        return MOE_ERR_NOMEM;
    }
    return MOE_OK;
}

void moe_sampler_free(struct moe_sampler *s) {
    if (!s) return;
    free(s->cands);
    free(s->tmp);
    free(s->ex);
    free(s->scaled);
    free(s->w);
    free(s->bin);
    free(s->blk);
    free(s);
}

/* moe_logits_first_bad: a block is tested at once (exponent bits all ones
 * means NaN or infinite, which is what isfinite tests); the first block with
 * a hit is searched one by one, so the answer is the first bad index. */
int64_t moe_logits_first_bad(const float *v, size_t n) {
    size_t i = 0;
    for (; i + BLK <= n; i += BLK) {
        int bad = 0;
        for (int j = 0; j < BLK; j++) {
            uint32_t u;
            memcpy(&u, v + i + j, sizeof u);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
        if (bad) break;
    }
    for (; i < n; i++)
        if (!isfinite(v[i])) return (int64_t)i;
    return -1;
}

/* moe_argmax: the scalar rule "v[i] > v[best] moves best" applied block by
 * block, with a block skipped when nothing in it is greater than the best so
 * far (one vectorised test). NaN is never greater, so a NaN is never picked
 * unless it is v[0], which then stays the answer, as in the scalar loop. */
int32_t moe_argmax(const float *v, int n) {
    if (n < 1) return 0;
    int32_t best = 0;
    float bv = v[0];
    int i = 1;
    for (; i + BLK <= n; i += BLK) {
        int any = 0;
        for (int j = 0; j < BLK; j++) any |= v[i + j] > bv;
        if (!any) continue;
        for (int j = i; j < i + BLK; j++)
            if (v[j] > bv) bv = v[best = j];
    }
    for (; i < n; i++)
        if (v[i] > bv) bv = v[best = i];
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

/* cmp_desc: the specification's order, logit descending, lower id first on
 * ties (so -0 and +0 tie). NaN sorts after everything, which keeps the order
 * total (qsort needs that); finite and infinite logits are ordered as before. */
static int cmp_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    const int xn = isnan(x->logit), yn = isnan(y->logit);
    if (xn != yn) return xn - yn;
    if (!xn && x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

/* order_key: a key whose ascending order is cmp_desc's order of logits:
 * descending, -0 equal to +0, NaN last. */
static inline uint32_t order_key(float x) {
    x += 0.0f; /* -0 becomes +0 */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t asc = u & 0x80000000u ? ~u : u | 0x80000000u; /* ascending with the float */
    return isnan(x) ? 0xFFFFFFFFu : ~asc;
}

/* sort_cands: cands[0..m), given in ascending id order, into cmp_desc's
 * order. A stable radix sort on order_key (4 passes of 8 bits; a pass where
 * every key has the same digit is skipped) leaves ties in id order, which is
 * what cmp_desc asks; short lists go to qsort. */
static void sort_cands(struct moe_sampler *s, int m) {
    s->n_ex = 0; /* a new order: cand_exp starts again */
    if (m <= 64) {
        qsort(s->cands, (size_t)m, sizeof *s->cands, cmp_desc);
        return;
    }
    uint32_t cnt[4][256];
    memset(cnt, 0, sizeof cnt);
    for (int i = 0; i < m; i++) {
        const uint32_t k = order_key(s->cands[i].logit);
        for (int d = 0; d < 4; d++) cnt[d][k >> (8 * d) & 255]++;
    }
    struct cand *src = s->cands, *dst = s->tmp;
    for (int d = 0; d < 4; d++) {
        uint32_t off[256], at = 0;
        if (cnt[d][order_key(src[0].logit) >> (8 * d) & 255] == (uint32_t)m) continue;
        for (int b = 0; b < 256; b++) {
            off[b] = at;
            at += cnt[d][b];
        }
        for (int i = 0; i < m; i++) dst[off[order_key(src[i].logit) >> (8 * d) & 255]++] = src[i];
        struct cand *t = src;
        src = dst;
        dst = t;
    }
    if (src != s->cands) memcpy(s->cands, src, sizeof *src * (size_t)m);
}

/* exp_neg_approx: e^x for x <= 0 in float, relative error below
 * EXP_APPROX_REL for x in (-87, 0]; 0 at -87 and below (e^-87 is 1.7e-38),
 * -inf included, so a masked token weighs nothing. The clamp and the zero
 * work on the bits (a negative float's bits grow with its magnitude), so
 * that the loops calling this vectorise without -fno-trapping-math. */
static inline float exp_neg_approx(float x) {
    uint32_t ux;
    memcpy(&ux, &x, sizeof ux);
    const uint32_t live = 0u - (uint32_t)(ux < 0xC2AE0000u); /* all ones where x > -87.0f (or a positive NaN) */
    ux = (ux & live) | (0xC2AE0000u & ~live);
    memcpy(&x, &ux, sizeof x);
    const float kf = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
    const float r = x - kf * 0.693145751953125f - kf * 1.428606765330187e-06f; /* |r| <= ln2 / 2 */
    const float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    const uint32_t sb = (uint32_t)((int32_t)kf + 127) << 23; /* 2^kf, kf in [-126, 0] */
    float sc, y;
    memcpy(&sc, &sb, sizeof sc);
    y = p * sc;
    uint32_t uy;
    memcpy(&uy, &y, sizeof uy);
    uy &= live;
    memcpy(&y, &uy, sizeof y);
    return y;
}

/* scale: scaled[i] = logits[i] / T, the specification's float division. */
static void scale(struct moe_sampler *s, const float *restrict logits) {
    const int n = s->n_vocab;
    const float t = s->p.temperature;
    float *restrict c = s->scaled;
    int i = 0;
    for (; i + BLK <= n; i += BLK)
        for (int j = 0; j < BLK; j++) c[i + j] = logits[i + j] / t;
    for (; i < n; i++) c[i] = logits[i] / t;
}

/* cand_exp: the specification's terms exp(logit - max) of the sorted
 * cands[0..n), each computed once per order (the same libm call on the same
 * numbers, so the same values as computing them again). */
static const double *cand_exp(struct moe_sampler *s, int n) {
    const double mx = s->cands[0].logit;
    for (; s->n_ex < n; s->n_ex++) s->ex[s->n_ex] = exp(s->cands[s->n_ex].logit - mx);
    return s->ex;
}

/* draw: the specification's last step on the sorted cands[0..n): one uniform
 * number against the prefix sums of exp(logit - max). */
static int32_t draw(struct moe_sampler *s, int n) {
    const double *e = cand_exp(s, n);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += e[i];
    double r = next_u01(&s->rng) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += e[i];
        if (r < acc) return s->cands[i].id;
    }
    return s->cands[n - 1].id;
}

/* nucleus: the specification's top-p on the sorted cands[0..n): the length
 * of the shortest prefix whose cumulated probability reaches top_p (n when
 * rounding keeps it below). */
static int nucleus(struct moe_sampler *s, int n) {
    const double *e = cand_exp(s, n);
    double sum = 0, cum = 0;
    for (int i = 0; i < n; i++) sum += e[i];
    for (int i = 0; i < n; i++) {
        cum += e[i] / sum;
        if (cum >= s->p.top_p) return i + 1;
    }
    return n;
}

/* finish: top-p (if any) and the draw on the sorted cands[0..n). */
static int32_t finish(struct moe_sampler *s, int n) {
    if (s->p.top_p < 1.0f) n = nucleus(s, n);
    return draw(s, n);
}

/* sample_full: the specification: sort the whole vocabulary. */
static int32_t sample_full(struct moe_sampler *s) {
    int n = s->n_vocab;
    for (int i = 0; i < n; i++) s->cands[i] = (struct cand){s->scaled[i], i};
    sort_cands(s, n);
    if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
    return finish(s, n);
}

/* sift_down: restore the heap h[0..k) below position i; the root is the
 * candidate that sorts last (cmp_desc), i.e. the first to be dropped. */
static void sift_down(struct cand *h, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, m = i;
        if (l < k && cmp_desc(&h[l], &h[m]) > 0) m = l;
        if (l + 1 < k && cmp_desc(&h[l + 1], &h[m]) > 0) m = l + 1;
        if (m == i) return;
        const struct cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* sample_top_k: the k first tokens of the specification's order without
 * sorting the vocabulary. Tokens come in id order, so a newcomer beats the
 * heap's root only with a strictly greater logit (on a tie its id is larger,
 * so it sorts after); a block with nothing above the root is skipped. A
 * large k is put back in id order (marks in bin, one pass) for sort_cands'
 * radix sort instead of qsort. (With NaN logits the heap may keep a NaN over
 * a number: a token in range all the same.) */
static int32_t sample_top_k(struct moe_sampler *s) {
    const int n = s->n_vocab, k = s->p.top_k;
    const float *c = s->scaled;
    struct cand *h = s->cands;
    for (int i = 0; i < k; i++) h[i] = (struct cand){c[i], i};
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
    int i = k;
    for (; i + BLK <= n; i += BLK) {
        const float worst = h[0].logit;
        int any = 0;
        for (int j = 0; j < BLK; j++) any |= c[i + j] > worst;
        if (!any) continue;
        for (int j = i; j < i + BLK; j++)
            if (c[j] > h[0].logit) {
                h[0] = (struct cand){c[j], j};
                sift_down(h, k, 0);
            }
    }
    for (; i < n; i++)
        if (c[i] > h[0].logit) {
            h[0] = (struct cand){c[i], i};
            sift_down(h, k, 0);
        }
    if (k <= 1024) {
        qsort(h, (size_t)k, sizeof *h, cmp_desc);
        s->n_ex = 0;
        return finish(s, k);
    }
    memset(s->bin, 0, sizeof *s->bin * (size_t)n);
    for (int j = 0; j < k; j++) s->bin[h[j].id] = 1;
    int m = 0;
    for (int j = 0; j < n; j++)
        if (s->bin[j]) h[m++] = (struct cand){c[j], j};
    sort_cands(s, m);
    return finish(s, k);
}

/* exp_block: w[j] = exp_neg_approx(c[j] - mx) for one block. */
static void exp_block(float *restrict w, const float *restrict c, float mx) {
    for (int j = 0; j < BLK; j++) w[j] = exp_neg_approx(c[j] - mx);
}

/* block_sum: the sum of one block of w in double (four partial sums: four
 * independent additions at a time). */
static double block_sum(const float *w) {
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (int j = 0; j < BLK; j += 4) {
        a0 += w[j];
        a1 += w[j + 1];
        a2 += w[j + 2];
        a3 += w[j + 3];
    }
    return (a0 + a1) + (a2 + a3);
}

/* sample_plain: temperature only, in id order (moe-sampler.h). Token i is
 * drawn when r = u * S falls in its slice of the prefix sums of w; whole
 * blocks are stepped over by their sums. Where rounding leaves r past the
 * last slice, the last token walked with a weight wins. */
static int32_t sample_plain(struct moe_sampler *s) {
    const int n = s->n_vocab, nb = n / BLK;
    const float *c = s->scaled;
    float *w = s->w;
    const int32_t mi = moe_argmax(c, n);
    const float mx = c[mi];
    if (!isfinite(mx)) return sample_full(s); /* +inf or NaN first, or all -inf */
    double sum = 0;
    for (int b = 0; b < nb; b++) {
        exp_block(w + (size_t)b * BLK, c + (size_t)b * BLK, mx);
        sum += s->blk[b] = block_sum(w + (size_t)b * BLK);
    }
    for (int i = nb * BLK; i < n; i++) sum += w[i] = exp_neg_approx(c[i] - mx);
    if (!(sum < INFINITY)) return sample_full(s); /* a NaN logit */
    const double r = next_u01(&s->rng) * sum;
    double acc = 0;
    int i = 0;
    for (int b = 0; b < nb && acc + s->blk[b] <= r; b++, i += BLK) acc += s->blk[b];
    int32_t last = mi;
    for (; i < n; i++) {
        if (w[i] > 0) last = i;
        acc += w[i];
        if (r < acc) return i;
    }
    return last;
}

/* nucleus_decided: the specification's nucleus length, decided on the sorted
 * prefix cands[0..m) with the vocabulary's sum known as sum to a relative
 * error rho; 0 when it cannot be decided. The specification's cumulated
 * probabilities differ from the ones computed here by at most delta (a sum
 * off by rho, and each side's roundings of m divisions and additions, with
 * the cumulated value at most 1.01), so "below top_p - delta" and "at or above
 * top_p + delta" are answers the specification shares. */
static int nucleus_decided(struct moe_sampler *s, int m, double sum, double rho) {
    const double tp = s->p.top_p;
    const double delta = 1.05 * (rho + 2.0 * ((double)m + 3.0) * U53);
    double cum = 0;
    for (int i = 0; i < m; i++) {
        cum += cand_exp(s, i + 1)[i] / sum;
        if (cum >= tp - delta) return cum >= tp + delta ? i + 1 : 0;
    }
    return 0;
}

/* top_p_histogram: fills w, bin and hist from the scaled logits (mx their
 * maximum). */
static void top_p_histogram(struct moe_sampler *s, float mx) {
    const int n = s->n_vocab;
    const float *c = s->scaled;
    float *w = s->w;
    uint16_t *bin = s->bin;
    /* four partial histograms (token j into part[j % 4]): a run of tokens in
     * one bin is then four independent chains of additions, not one */
    memset(s->part, 0, sizeof s->part);
    for (int i = 0; i < n; i += BLK) {
        const int e = i + BLK <= n ? i + BLK : n;
        if (e - i == BLK) {
            exp_block(w + i, c + i, mx);
            for (int j = i; j < i + BLK; j++) {
                float f = (mx - c[j]) * (float)HIST_PER_UNIT;
                f = f < (float)(HIST_N - 1) ? f : (float)(HIST_N - 1); /* NaN too */
                bin[j] = (uint16_t)(int)f;
            }
        } else {
            for (int j = i; j < e; j++) {
                w[j] = exp_neg_approx(c[j] - mx);
                float f = (mx - c[j]) * (float)HIST_PER_UNIT;
                f = f < (float)(HIST_N - 1) ? f : (float)(HIST_N - 1);
                bin[j] = (uint16_t)(int)f;
            }
        }
        for (int j = i; j < e; j++) s->part[j & 3][bin[j]] += w[j];
    }
    for (int b = 0; b < HIST_N; b++) s->hist[b] = (s->part[0][b] + s->part[1][b]) + (s->part[2][b] + s->part[3][b]);
}

/* hist_mass: the sum of w over bins [from, HIST_N); *err gets a bound on
 * how far its terms are from the specification's exp(logit - max) in double
 * (not counting the additions' rounding). Per term: the approximation's
 * relative error, plus x's rounding to float (relative 2^-24 on x, so |x| *
 * 2^-24 on e^x, with |x| bounded by the bin's upper edge, 88 for the last
 * bin), plus 1.7e-38 for a term at or below e^-87, given as 0. */
static double hist_mass(const struct moe_sampler *s, int from, double *err) {
    double sum = 0, terms = 0;
    for (int b = from; b < HIST_N; b++) {
        const double xmax = b < HIST_N - 1 ? (b + 1.0) / HIST_PER_UNIT * 1.001 : 88.0;
        sum += s->hist[b];
        terms += s->hist[b] * (EXP_APPROX_REL + 6.0e-8 * xmax);
    }
    *err = 1.01 * (terms + s->n_vocab * 1.7e-38);
    return sum;
}

/* sample_top_p: top-p without top-k (file comment). The sum that decides
 * the nucleus is the specification's own terms over the sorted bins plus the
 * approximation of the rest (at most 1 - top_p of the mass, so its error is
 * small); both sums' rounding is counted (n + HIST_N + 2 additions). */
static int32_t sample_top_p(struct moe_sampler *s) {
    const int n = s->n_vocab;
    const float *c = s->scaled;
    const float mx = c[moe_argmax(c, n)];
    if (!isfinite(mx)) return sample_full(s);
    top_p_histogram(s, mx);
    const double rounding = 2.2 * ((double)n + HIST_N + 2.0) * U53;
    double err;
    const double total = hist_mass(s, 0, &err);
    if (!(total < INFINITY)) return sample_full(s); /* a NaN logit */
    /* the highest bins whose mass covers top_p with room for the error; all
     * bins (the whole vocabulary) when that is out of reach */
    const double target = ((double)s->p.top_p + 3.0 * (err / total + rounding)) * total;
    int last = HIST_N - 1;
    double acc = 0;
    for (int b = 0; b < HIST_N - 1; b++)
        if ((acc += s->hist[b]) >= target) {
            last = b;
            break;
        }
    int m = 0;
    for (int i = 0; i < n; i += BLK) { /* blocks without a token kept are skipped */
        const int e = i + BLK <= n ? i + BLK : n;
        if (e - i == BLK) {
            int any = 0;
            for (int j = i; j < i + BLK; j++) any |= s->bin[j] <= last;
            if (!any) continue;
        }
        for (int j = i; j < e; j++) { /* without a branch: m <= j, the write stays in cands */
            s->cands[m] = (struct cand){c[j], j};
            m += s->bin[j] <= last;
        }
    }
    sort_cands(s, m);
    if (m == n) return finish(s, n); /* the whole vocabulary is sorted: the specification itself */
    const double *e = cand_exp(s, m);
    double head = 0;
    for (int i = 0; i < m; i++) head += e[i];
    const double tail = hist_mass(s, last + 1, &err), sum = head + tail;
    int keep = nucleus_decided(s, m, sum, err / sum + rounding);
    if (!keep) { /* top_p within that error of a boundary: the rest with the specification's terms too */
        double exact = 0;
        for (int i = 0; i < n; i++)
            if (s->bin[i] > last) exact += exp((double)c[i] - (double)mx);
        keep = nucleus_decided(s, m, head + exact, rounding);
    }
    if (!keep) return sample_full(s);
    return draw(s, keep);
}

int32_t moe_sampler_sample(struct moe_sampler *s, const float *logits) {
    if (s->p.temperature <= 0.0f) return moe_argmax(logits, s->n_vocab);
    scale(s, logits);
    const int n = s->n_vocab, k = s->p.top_k;
    if (k > 0 && k < n) return sample_top_k(s);
    if (s->p.top_p < 1.0f) return sample_top_p(s);
    if (k == 0) return sample_plain(s);
    return sample_full(s); /* top_k >= n_vocab: the whole sorted vocabulary (moe-sampler.h) */
}

/*
 * test-sampler.c - runtime/sampler.c: greedy at temperature 0, seeded
 * sampling reproducible, and bad parameters (negative, NaN or infinite
 * temperature, top-p outside (0, 1], negative top-k) refused at creation
 * instead of silently meaning "greedy". The fast paths against the sampler
 * they replaced (moe-test-sampler-ref.h, a full sort): with top-k, and with
 * top-p, the same token for the same seed over random logits (ties, -inf
 * masks, many k, top-p, temperatures and seeds); plain temperature sampling
 * (drawn in id order, so other tokens than before) against softmax(l / T)
 * within 5 standard deviations of the empirical frequencies; moe_argmax and
 * moe_logits_first_bad against the scalar loops, NaN and infinities included;
 * non-finite logits never give a token out of range.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe-sampler.h"
#include "moe-test-sampler-ref.h"
#include "moe-test.h"

/* quiet: drop the expected error messages. */
static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level;
    (void)msg;
    (void)user;
}

/* refused: moe_sampler_create rejects p and leaves *out NULL. */
static int refused(struct moe_sampler_params p) {
    struct moe_sampler *s = (struct moe_sampler *)&p; /* any non-NULL value: must be cleared */
    enum moe_status st = moe_sampler_create(&p, 8, &s);
    int ok = st == MOE_ERR_INVALID && s == NULL;
    moe_sampler_free(st == MOE_OK ? s : NULL);
    return ok;
}

static void test_params(void) {
    const float logits[8] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f, 0.0f, 1.5f, -3.0f};
    struct moe_sampler_params p = moe_sampler_default_params();
    struct moe_sampler *s = NULL;
    CHECK(moe_sampler_create(&p, 8, &s) == MOE_OK && s, "default params accepted");
    CHECK(s && moe_sampler_sample(s, logits) == 1, "temperature 0 is greedy, lowest id on ties");
    moe_sampler_free(s);

    /* bad values are refused (issue 17: --temp -1 ran greedy) */
    struct moe_sampler_params bad = moe_sampler_default_params();
    bad.temperature = -1.0f;
    CHECK(refused(bad), "negative temperature refused");
    bad.temperature = NAN;
    CHECK(refused(bad), "NaN temperature refused");
    bad.temperature = INFINITY;
    CHECK(refused(bad), "infinite temperature refused");
    bad = moe_sampler_default_params();
    bad.top_p = 0.0f;
    CHECK(refused(bad), "top-p 0 refused");
    bad.top_p = 1.5f;
    CHECK(refused(bad), "top-p above 1 refused");
    bad.top_p = NAN;
    CHECK(refused(bad), "NaN top-p refused");
    bad = moe_sampler_default_params();
    bad.top_k = -2;
    CHECK(refused(bad), "negative top-k refused");
}

/* test_reproducible: on every path, two samplers with the same seed give the
 * same draws, all in range, and a different seed gives other draws. */
static void test_reproducible(void) {
    enum { V = 300 };
    static float logits[V];
    moe_test_rng = 11;
    for (int i = 0; i < V; i++) logits[i] = 2.0f * moe_test_rnd_normal();
    const int ks[4] = {0, 4, 0, V + 1};
    const float ps[4] = {1.0f, 0.9f, 0.9f, 1.0f};
    for (int c = 0; c < 4; c++) {
        struct moe_sampler_params p = {0.8f, ks[c], ps[c], 7};
        struct moe_sampler *a = NULL, *b = NULL, *d = NULL;
        CHECK(moe_sampler_create(&p, V, &a) == MOE_OK && moe_sampler_create(&p, V, &b) == MOE_OK, "params");
        p.seed = 8;
        CHECK(moe_sampler_create(&p, V, &d) == MOE_OK, "params");
        int same = a && b && d, differ = 0;
        for (int i = 0; same && i < 64; i++) {
            int32_t x = moe_sampler_sample(a, logits), y = moe_sampler_sample(b, logits);
            same = x == y && x >= 0 && x < V;
            differ |= moe_sampler_sample(d, logits) != x;
        }
        CHECK(same, "top-k %d top-p %g: same seed gives the same draws, all in range", ks[c], (double)ps[c]);
        CHECK(differ, "top-k %d top-p %g: another seed gives other draws", ks[c], (double)ps[c]);
        moe_sampler_free(a);
        moe_sampler_free(b);
        moe_sampler_free(d);
    }
}

/* fill_logits: one of several shapes of finite logits (with ties, -inf
 * masks, one dominant token, all equal, a tied top) of length n. */
static void fill_logits(float *v, int n, int shape) {
    const float sd = shape % 3 == 0 ? 0.5f : shape % 3 == 1 ? 2.0f : 6.0f;
    for (int i = 0; i < n; i++) v[i] = sd * moe_test_rnd_normal();
    switch (shape / 3) {
    case 0: break;
    case 1: /* coarse values: many ties */
        for (int i = 0; i < n; i++) v[i] = roundf(v[i] * 2.0f) / 2.0f;
        break;
    case 2: /* masked tokens, never all */
        for (int i = 0; i < n; i++)
            if (moe_test_rnd_unit() < 0.3) v[i] = -INFINITY;
        v[moe_test_rnd64() % (uint64_t)n] = 1.0f;
        break;
    case 3: /* one token far ahead, a few close */
        v[moe_test_rnd64() % (uint64_t)n] = 25.0f;
        for (int j = 0; j < 3; j++) v[moe_test_rnd64() % (uint64_t)n] = 22.0f + (float)j;
        break;
    case 4: /* all equal: every cumulated probability j / n, exact boundaries */
        for (int i = 0; i < n; i++) v[i] = 1.5f;
        break;
    default: /* four tied at the top, the rest 100 below: cumulated probabilities
              * 1/4, 1/2, 3/4 exactly on a prefix shorter than the vocabulary */
        for (int i = 0; i < n; i++) v[i] = -100.0f;
        for (int j = 0; j < 4; j++) v[moe_test_rnd64() % (uint64_t)n] = 0.0f;
        break;
    }
}

#define N_SHAPES 18

/* same_as_ref: draws of the sampler and of the reference for p on the same
 * logits, `draws` times (the generator advancing); 1 when all agree. */
static int same_as_ref(const struct moe_sampler_params *p, const float *logits, int n, int draws) {
    struct moe_sampler *s = NULL;
    struct ref_sampler r;
    if (moe_sampler_create(p, n, &s) != MOE_OK || !ref_init(&r, p, n)) {
        moe_sampler_free(s);
        return 0;
    }
    int ok = 1;
    for (int d = 0; ok && d < draws; d++) {
        const int32_t x = moe_sampler_sample(s, logits), y = ref_sample(&r, logits);
        if (x != y) {
            fprintf(stderr, "n %d T %g top-k %d top-p %.9g seed %llu draw %d: token %d, reference %d\n", n,
                    (double)p->temperature, p->top_k, (double)p->top_p, (unsigned long long)p->seed, d, x, y);
            ok = 0;
        }
    }
    moe_sampler_free(s);
    ref_free(&r);
    return ok;
}

/* test_against_reference: top-k (k in 1, 2, 40, n-1, n, n+7) and top-p
 * (with and without top-k) give the reference's token for the same seed. */
static void test_against_reference(void) {
    static const int sizes[] = {1, 2, 3, 5, 17, 63, 64, 65, 130, 1000, 4099, 32000};
    static const float temps[] = {0.3f, 0.8f, 1.0f, 1.7f};
    static const float tops[] = {1.0f, 0.95f, 0.9f, 0.5f, 0.1f, 0.999f, 0.99999f, 0.25f, 0.9999999f};
    moe_test_rng = 12345;
    int cases = 0, bad = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int n = sizes[si];
        float *v = malloc(sizeof *v * (size_t)n);
        if (!v) break;
        const int big = n >= 4000;
        for (int shape = 0; shape < N_SHAPES; shape++) {
            if (big && shape % 2) continue; /* the reference sorts 32000 tokens per draw: fewer there */
            fill_logits(v, n, shape);
            const int ks[] = {0, 1, 2, 40, n - 1, n, n + 7};
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
                for (size_t pi = 0; pi < sizeof tops / sizeof *tops; pi++) {
                    if (ks[ki] == 0 && tops[pi] == 1.0f) continue; /* plain temperature: id order */
                    if (big && (pi % 2 || (ki == 4 && n > 10000))) continue;
                    const struct moe_sampler_params p = {temps[(shape + ki + pi) % 4], ks[ki], tops[pi],
                                                         moe_test_rnd64()};
                    cases++;
                    bad += !same_as_ref(&p, v, n, big ? 2 : 5);
                }
        }
        free(v);
    }
    CHECK(bad == 0, "%d of %d (logits, top-k, top-p, seed) cases differ from the full sort", bad, cases);
    CHECK(cases > 3000, "%d cases", cases);
}

/* ref_cums: the reference's cumulated probabilities of the first `m` tokens
 * of its order (full sort, sum over the vocabulary, as ref_sample). */
static void ref_cums(const float *logits, int n, float temp, double *cum, int m) {
    struct ref_cand *c = malloc(sizeof *c * (size_t)n);
    if (!c) return;
    for (int i = 0; i < n; i++) c[i] = (struct ref_cand){logits[i] / temp, i};
    qsort(c, (size_t)n, sizeof *c, ref_cmp_desc);
    const double mx = c[0].logit;
    double sum = 0, acc = 0;
    for (int i = 0; i < n; i++) sum += exp(c[i].logit - mx);
    for (int i = 0; i < m && i < n; i++) cum[i] = acc += exp(c[i].logit - mx) / sum;
    free(c);
}

/* test_boundaries: top-p set on the reference's own cumulated probabilities
 * (the float at, just below and just above one of them), where an
 * approximate sum of the vocabulary would misplace the nucleus by one token
 * unless its error is accounted for. */
static void test_boundaries(void) {
    static const int sizes[] = {100, 1000, 5000};
    moe_test_rng = 4242;
    int cases = 0, bad = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int n = sizes[si];
        float *v = malloc(sizeof *v * (size_t)n);
        double cum[40];
        if (!v) break;
        for (int it = 0; it < 12; it++) {
            const float temp = it % 2 ? 0.8f : 1.0f;
            fill_logits(v, n, (it % 4) * 3 + 1); /* sd 2: plain, ties, masks, a dominant token */
            ref_cums(v, n, temp, cum, 40);
            for (int j = 0; j < 40 && j < n; j++) {
                if (!(cum[j] < 0.9999)) break;
                const float at = (float)cum[j];
                const float tps[3] = {at, nextafterf(at, 0.0f), nextafterf(at, 1.0f)};
                for (int t = 0; t < 3; t++) {
                    if (!(tps[t] > 0.0f && tps[t] < 1.0f)) continue;
                    const int k = t == 2 ? n : 0; /* top-k at n_vocab takes the same path */
                    const struct moe_sampler_params p = {temp, k, tps[t], moe_test_rnd64()};
                    cases++;
                    bad += !same_as_ref(&p, v, n, 2);
                }
            }
        }
        free(v);
    }
    CHECK(bad == 0, "%d of %d top-p values on the reference's boundaries differ from the full sort", bad, cases);
    CHECK(cases > 1000, "%d cases", cases);
}

/* check_freq: the empirical frequencies of `cats` categories (cat[i] is
 * token i's) after `draws` draws against probabilities q; each within 5
 * standard deviations sqrt(q (1 - q) / draws). Also asserts that `alt`
 * (what a wrong temperature or an off-by-one would give) would fail the
 * same bound, so the check can tell them apart. */
static void check_freq(const char *what, struct moe_sampler *s, const float *logits, const int *cat, int cats,
                       const double *q, const double *alt, int draws) {
    long cnt[16] = {0};
    for (int d = 0; d < draws; d++) {
        const int32_t t = moe_sampler_sample(s, logits);
        cnt[cat[t]]++;
    }
    int within = 1, alt_fails = 0;
    for (int c = 0; c < cats; c++) {
        const double f = (double)cnt[c] / draws, sd = sqrt(q[c] * (1 - q[c]) / draws);
        if (fabs(f - q[c]) > 5 * sd) {
            fprintf(stderr, "%s: category %d frequency %.5f, softmax %.5f (5 sd = %.5f)\n", what, c, f, q[c], 5 * sd);
            within = 0;
        }
        alt_fails |= fabs(alt[c] - q[c]) > 10 * sd;
    }
    CHECK(within, "%s: frequencies match softmax(l / T) within 5 standard deviations", what);
    CHECK(alt_fails, "%s: the wrong distribution would be told apart", what);
}

/* softmax_cats: per category, the mass of softmax(l / t). */
static void softmax_cats(const float *l, int n, double t, const int *cat, int cats, double *q) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, l[i] / t);
    for (int c = 0; c < cats; c++) q[c] = 0;
    for (int i = 0; i < n; i++) {
        const double e = exp(l[i] / t - mx);
        q[cat[i]] += e;
        sum += e;
    }
    for (int c = 0; c < cats; c++) q[c] /= sum;
}

/* test_plain_distribution: top-k 0, top-p 1 draws from softmax(l / T). */
static void test_plain_distribution(void) {
    const int draws = 200000;
    {
        const float l[5] = {1.0f, 2.0f, 0.5f, -1.0f, 1.8f};
        const int cat[5] = {0, 1, 2, 3, 4};
        double q[5], wrong_t[5], shifted[5];
        softmax_cats(l, 5, 0.7, cat, 5, q);
        softmax_cats(l, 5, 1.0, cat, 5, wrong_t);
        for (int i = 0; i < 5; i++) shifted[i] = q[(i + 1) % 5];
        struct moe_sampler_params p = {0.7f, 0, 1.0f, 99};
        struct moe_sampler *s = NULL;
        CHECK(moe_sampler_create(&p, 5, &s) == MOE_OK, "params");
        if (s) {
            check_freq("5 tokens T 0.7 (against T 1)", s, l, cat, 5, q, wrong_t, draws);
            moe_sampler_free(s);
            p.seed = 100;
            CHECK(moe_sampler_create(&p, 5, &s) == MOE_OK, "params");
            check_freq("5 tokens T 0.7 (against ids shifted by one)", s, l, cat, 5, q, shifted, draws);
            moe_sampler_free(s);
        }
    }
    { /* 300 tokens: whole blocks stepped over by their sums, a tail after them */
        enum { V = 300 };
        static float l[V];
        static int cat[V];
        const int hot[4] = {3, 70, 150, 290};
        for (int i = 0; i < V; i++) {
            l[i] = -3.0f + 0.002f * (float)i;
            cat[i] = 4 + i / 64; /* the rest, by block: categories 4..8 */
        }
        for (int h = 0; h < 4; h++) {
            l[hot[h]] = 1.0f + 0.4f * (float)h;
            cat[hot[h]] = h;
        }
        double q[9], wrong_t[9];
        softmax_cats(l, V, 1.3, cat, 9, q);
        softmax_cats(l, V, 1.0, cat, 9, wrong_t);
        struct moe_sampler_params p = {1.3f, 0, 1.0f, 5};
        struct moe_sampler *s = NULL;
        CHECK(moe_sampler_create(&p, V, &s) == MOE_OK, "params");
        if (s) check_freq("300 tokens T 1.3", s, l, cat, 9, q, wrong_t, draws);
        moe_sampler_free(s);
    }
}

/* argmax_ref: the scalar loop moe_argmax was. */
static int32_t argmax_ref(const float *v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* first_bad_ref: the scalar loop moe_logits_first_bad was. */
static int64_t first_bad_ref(const float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return (int64_t)i;
    return -1;
}

/* test_argmax_first_bad: the blocked loops against the scalar ones, with
 * ties, rising runs, NaN (at 0 too), +-inf, every length to 300 and longer. */
static void test_argmax_first_bad(void) {
    enum { MAXN = 5000 };
    static float v[MAXN];
    moe_test_rng = 777;
    int am = 0, fb = 0, cases = 0;
    for (int iter = 0; iter < 3000; iter++) {
        const int n = iter < 301 ? iter : (int)(moe_test_rnd64() % MAXN);
        const int kind = iter % 6;
        for (int i = 0; i < n; i++) {
            v[i] = kind == 1 ? (float)i * 0.01f : roundf(4.0f * moe_test_rnd_normal()) / 4.0f; /* rising, or ties */
            if (kind == 2) v[i] = -v[i] * v[i];
        }
        const int specials = kind >= 3 ? 1 + (int)(moe_test_rnd64() % 4) : 0;
        for (int j = 0; n > 0 && j < specials; j++) {
            const int at = j == 0 && kind == 5 ? 0 : (int)(moe_test_rnd64() % (uint64_t)n);
            const int what = (int)(moe_test_rnd64() % 4);
            v[at] = what == 0 ? NAN : what == 1 ? -NAN : what == 2 ? INFINITY : -INFINITY;
        }
        cases++;
        am += moe_argmax(v, n) != argmax_ref(v, n);
        fb += moe_logits_first_bad(v, (size_t)n) != first_bad_ref(v, (size_t)n);
    }
    CHECK(am == 0, "moe_argmax differs from the scalar loop in %d of %d vectors", am, cases);
    CHECK(fb == 0, "moe_logits_first_bad differs from the scalar loop in %d of %d vectors", fb, cases);
    const float nan0[3] = {NAN, 1.0f, 2.0f}, nan1[3] = {0.0f, NAN, 2.0f};
    CHECK(moe_argmax(nan0, 3) == 0 && moe_argmax(nan1, 3) == 2, "NaN first wins, NaN later is skipped");
    static float big[1000];
    for (int i = 0; i < 1000; i++) big[i] = (float)(i % 7);
    big[0] = NAN;
    CHECK(moe_argmax(big, 1000) == 0, "NaN at 0 stays the answer over blocks");
    big[0] = 0.0f;
    CHECK(moe_argmax(big, 1000) == 6, "lowest index on ties over blocks");
    big[999] = INFINITY;
    CHECK(moe_argmax(big, 1000) == 999 && moe_logits_first_bad(big, 1000) == 999, "+inf at the end");
}

/* test_non_finite: NaN and infinite logits (callers check them with
 * moe_logits_first_bad) still give a token in range on every path. */
static void test_non_finite(void) {
    enum { V = 200 };
    static float v[V];
    const int ks[4] = {0, 3, 0, V};
    const float ps[4] = {1.0f, 0.9f, 0.5f, 1.0f};
    int ok = 1;
    for (int c = 0; c < 8; c++) {
        for (int i = 0; i < V; i++) v[i] = (float)(i % 13) * 0.1f;
        switch (c) {
        case 0: v[0] = NAN; break;
        case 1: v[77] = NAN; break;
        case 2: v[150] = INFINITY; break;
        case 3:
            for (int i = 0; i < V; i++) v[i] = -INFINITY;
            break;
        case 4: v[5] = INFINITY, v[6] = NAN; break;
        case 5:
            for (int i = 0; i < V; i++) v[i] = NAN;
            break;
        case 6: v[199] = -INFINITY, v[198] = NAN; break;
        default: v[3] = 3e38f; break; /* 3e38 / 0.1 overflows to +inf */
        }
        for (int k = 0; k < 4; k++) {
            struct moe_sampler_params p = {c == 7 ? 0.1f : 0.9f, ks[k], ps[k], (uint64_t)c};
            struct moe_sampler *s = NULL;
            if (moe_sampler_create(&p, V, &s) != MOE_OK) {
                ok = 0;
                continue;
            }
            for (int d = 0; d < 4; d++) {
                const int32_t t = moe_sampler_sample(s, v);
                ok &= t >= 0 && t < V;
            }
            moe_sampler_free(s);
        }
    }
    CHECK(ok, "non-finite logits give tokens in range");
}

int main(void) {
    moe_log_set(quiet, NULL);
    test_params();
    test_reproducible();
    test_against_reference();
    test_boundaries();
    test_plain_distribution();
    test_argmax_first_bad();
    test_non_finite();
    printf("test-sampler: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    return fails != 0;
}

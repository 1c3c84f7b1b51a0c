/*
 * bench-sampler.c - microseconds per sampled token of moe_sampler_sample
 * (new) against the sampler it replaced (old: a qsort of the whole
 * vocabulary, tests/moe-test-sampler-ref.h), side by side in one run, for
 * vocabularies of 32000 and 152064 at temperature 0.8 with top-k 0/40 and
 * top-p 1/0.95; also greedy (moe_argmax) and moe_logits_first_bad against
 * their scalar loops. Three shapes of logits, all N(0, 2^2) noise plus one
 * token at +B, 5 at +B-3 and 50 at +B-6: "peaked" (B = 18: the noise holds
 * a negligible mass and the 0.95 nucleus is a few tokens, as at a trained
 * model's usual step), "mid" (B = 12: the noise holds about half the mass,
 * the nucleus thousands of tokens) and "flat" (the noise alone).
 * Eight rows of logits are cycled. Every figure is the median over REPS
 * rounds (old and new alternate within a round) of CPU time per call.
 * "same" says whether old and new drew the same tokens (expected where the
 * paths are exact; plain temperature draws in id order, so "-").
 * Not a test: figures go to docs/benchmarks.md with the command.
 *
 *   bench-sampler [-r REPS]
 *   bench-sampler -r 5
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../moe-test-sampler-ref.h"
#include "moe-sampler.h"

enum { ROWS = 8 };

/* cpu_s: the process's CPU time in seconds. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* cmp_double: ascending doubles, for qsort. */
static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* unit, normal: a fixed xorshift64* sequence, uniform in [0, 1) and N(0, 1). */
static uint64_t rng = 0x12345678abcdefull;
static double unit(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-53;
}
static float normal(void) {
    double u = unit(), v = unit();
    if (u < 1e-300) u = 1e-300;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static const char *const shape_name[3] = {"peaked", "mid", "flat"};

/* fill: ROWS rows of n logits of the given shape (0 peaked, 1 mid, 2 flat). */
static void fill(float *v, int n, int shape) {
    const float top = shape == 0 ? 18.0f : 12.0f;
    for (int r = 0; r < ROWS; r++) {
        float *row = v + (size_t)r * n;
        for (int i = 0; i < n; i++) row[i] = 2.0f * normal();
        if (shape == 2) continue;
        for (int j = 0; j < 50; j++) row[(size_t)(unit() * n)] = top - 6.0f;
        for (int j = 0; j < 5; j++) row[(size_t)(unit() * n)] = top - 3.0f;
        row[(size_t)(unit() * n)] = top;
    }
}

/* argmax_scalar, first_bad_scalar: the loops moe_argmax and
 * moe_logits_first_bad were. */
static int32_t argmax_scalar(const float *v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static int64_t first_bad_scalar(const float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return (int64_t)i;
    return -1;
}

static volatile int64_t sink;

/* time_calls: CPU microseconds per call of `calls` calls of what (0 new
 * sampler, 1 old sampler, 2 moe_argmax, 3 scalar argmax, 4
 * moe_logits_first_bad, 5 its scalar loop); tokens drawn go to out. */
static double time_calls(int what, int calls, struct moe_sampler *s, struct ref_sampler *r, const float *v, int n,
                         int32_t *out) {
    const double t0 = cpu_s();
    for (int c = 0; c < calls; c++) {
        const float *row = v + (size_t)(c % ROWS) * n;
        switch (what) {
        case 0: out[c] = moe_sampler_sample(s, row); break;
        case 1: out[c] = ref_sample(r, row); break;
        case 2: sink += moe_argmax(row, n); break;
        case 3: sink += argmax_scalar(row, n); break;
        case 4: sink += moe_logits_first_bad(row, (size_t)n); break;
        default: sink += first_bad_scalar(row, (size_t)n); break;
        }
    }
    return (cpu_s() - t0) * 1e6 / calls;
}

/* usage: the command line, exit status 2. */
static int usage(void) {
    fprintf(stderr, "usage: bench-sampler [-r REPS]\nexample: bench-sampler -r 5\n");
    return 2;
}

int main(int argc, char **argv) {
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else return usage();
    }
    if (reps < 1 || reps > 1000) return usage();
    static const int vocabs[2] = {32000, 152064};
    static const int ks[4] = {0, 40, 0, 40};
    static const float ps[4] = {1.0f, 1.0f, 0.95f, 0.95f};
    double *tn = malloc(sizeof *tn * (size_t)reps), *to = malloc(sizeof *to * (size_t)reps);
    int32_t *on = malloc(sizeof *on * 64), *oo = malloc(sizeof *oo * 64);
    if (!tn || !to || !on || !oo) return 1;
    printf("%-7s %-6s %5s %5s %12s %12s %8s %5s\n", "vocab", "logits", "top-k", "top-p", "old us/tok", "new us/tok",
           "speed-up", "same");
    for (int vi = 0; vi < 2; vi++) {
        const int n = vocabs[vi];
        float *v = malloc(sizeof *v * (size_t)n * ROWS);
        if (!v) return 1;
        for (int shape = 0; shape < 3; shape++) {
            fill(v, n, shape);
            for (int c = 0; c < 4; c++) {
                const struct moe_sampler_params p = {0.8f, ks[c], ps[c], 1};
                struct ref_sampler r;
                if (!ref_init(&r, &p, n)) return 1;
                const int calls_new = n > 100000 ? 32 : 64, calls_old = n > 100000 ? 8 : 16;
                int same = 1;
                for (int k = 0; k < reps; k++) {
                    /* the same seed each round, so that old and new see the same numbers */
                    struct moe_sampler *sn = NULL;
                    if (moe_sampler_create(&p, n, &sn) != MOE_OK) return 1;
                    r.rng = p.seed ^ 0x9e3779b97f4a7c15ull;
                    to[k] = time_calls(1, calls_old, NULL, &r, v, n, oo);
                    tn[k] = time_calls(0, calls_new, sn, &r, v, n, on);
                    for (int j = 0; j < calls_old; j++) same &= on[j] == oo[j];
                    moe_sampler_free(sn);
                }
                qsort(tn, (size_t)reps, sizeof *tn, cmp_double);
                qsort(to, (size_t)reps, sizeof *to, cmp_double);
                printf("%-7d %-6s %5d %5.2f %12.1f %12.1f %7.0fx %5s\n", n, shape_name[shape], ks[c],
                       (double)ps[c], to[reps / 2], tn[reps / 2], to[reps / 2] / tn[reps / 2],
                       ks[c] == 0 && ps[c] == 1.0f ? "-" : same ? "yes" : "NO");
                ref_free(&r);
            }
        }
        for (int what = 2; what <= 4; what += 2) {
            for (int k = 0; k < reps; k++) {
                to[k] = time_calls(what + 1, 2000, NULL, NULL, v, n, NULL);
                tn[k] = time_calls(what, 2000, NULL, NULL, v, n, NULL);
            }
            qsort(tn, (size_t)reps, sizeof *tn, cmp_double);
            qsort(to, (size_t)reps, sizeof *to, cmp_double);
            printf("%-7d %-6s %11s %12.1f %12.1f %7.1fx\n", n, "flat", what == 2 ? "argmax" : "first_bad",
                   to[reps / 2], tn[reps / 2], to[reps / 2] / tn[reps / 2]);
        }
        free(v);
    }
    free(tn);
    free(to);
    free(on);
    free(oo);
    return 0;
}

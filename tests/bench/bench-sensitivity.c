/*
 * bench-sensitivity.c - what the cached sensitivity sweep costs against the
 * naive one (one full forward pass per expert), side by side in one process:
 * rounds alternate cached, naive; medians are printed with their ratio, and
 * the cached sweep's cost in baseline-pass equivalents.
 *
 *   bench-sensitivity MODEL.moeb TEXT [ctx=256] [seqs=8] [threads=0] [rounds=3] [low=q2_k] [base=q4_k]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe-bundle.h"
#include "moe-dataset.h"
#include "moe-model.h"
#include "token-stream.h"
#include "sensitivity.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench-sensitivity MODEL.moeb TEXT [ctx] [seqs] [threads] [rounds] [low] [base]\n");
        return 2;
    }
    const int ctx = argc > 3 ? atoi(argv[3]) : 256, n_seq = argc > 4 ? atoi(argv[4]) : 8;
    const int threads = argc > 5 ? atoi(argv[5]) : 0, rounds = argc > 6 ? atoi(argv[6]) : 3;
    const char *low = argc > 7 ? argv[7] : "q2_k", *base = argc > 8 ? argv[8] : "q4_k";
    if (ctx < 2 || n_seq < 1 || rounds < 1 || rounds > 64) return 2;
    moe_log_set_level(MOE_LOG_WARN);
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = base;
    struct moe_model *m = NULL;
    char *text = NULL;
    size_t len = 0, n = 0;
    int32_t *ids = NULL;
    struct moe_dataset_params dp = moe_dataset_default_params();
    uint32_t lo = 0, bs = 0;
    if (moe_model_load(argv[1], &mp, &m) || moe_bundle_find_precision(m->bundle, low, &lo) ||
        moe_bundle_find_precision(m->bundle, base, &bs) || moe_text_load(argv[2], &dp, &text, &len) ||
        moe_text_tokenize(m, NULL, text, len, &ids, &n) || n < (size_t)ctx * (size_t)n_seq) {
        fprintf(stderr, "bench-sensitivity: cannot load the model, its precisions %s/%s or %d x %d tokens of text\n",
                low, base, n_seq, ctx);
        return 1;
    }
    int32_t bos = moe_text_bos(m->tok);
    for (int q = 0; bos >= 0 && q < n_seq; q++) ids[(size_t)q * ctx] = bos;
    double t[2][64], eq = 0;
    for (int r = 0; r < rounds; r++)
        for (int method = 0; method < 2; method++) {
            struct moe_sens_params p = moe_sens_default_params();
            p.low = (int)lo;
            p.base = (int)bs;
            p.method = method ? MOE_SENS_NAIVE : MOE_SENS_CACHED;
            p.n_threads = threads;
            struct moe_sens_state s;
            if (moe_sens_state_init(&s, m, n_seq, ctx)) return 1;
            double t0 = now_s();
            if (moe_sens_run(m, ids, &p, &s, n_seq, NULL)) return 1;
            t[method][r] = now_s() - t0;
            if (!method) eq = s.seconds / s.base_seconds;
            fprintf(stderr, "round %d %s: %.2f s\n", r + 1, method ? "naive" : "cached", t[method][r]);
            moe_sens_state_clear(&s);
        }
    qsort(t[0], (size_t)rounds, sizeof(double), cmp_d);
    qsort(t[1], (size_t)rounds, sizeof(double), cmp_d);
    int experts = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) experts += m->cfg.layer_moe[l] ? m->cfg.n_expert : 0;
    printf("%d sequences x %d tokens, %d experts, %s in place of %s, %d rounds (medians)\n", n_seq, ctx, experts, low,
           base, rounds);
    printf("cached sweep: %.2f s (%.2f baseline-pass equivalents, last round)\n", t[0][rounds / 2], eq);
    printf("naive sweep:  %.2f s (one full forward pass per expert)\n", t[1][rounds / 2]);
    printf("cached / naive: %.3f\n", t[0][rounds / 2] / t[1][rounds / 2]);
    free(text);
    free(ids);
    moe_model_free(m);
    return 0;
}

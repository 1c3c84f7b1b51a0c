/*
 * bench-prompt.c - prompt (prefill) speed of the CPU backend, in one process:
 * a warm-up pass, then R timed passes of the same N random token ids through
 * a fresh sequence (moe_session_reset between them), as llama-bench -p N
 * times its prompts. Prints every pass and the median and best tokens/s, and
 * the process's CPU time per pass (all threads; on a shared machine the
 * least CPU time of a 1-thread run is the steadiest figure). The model is
 * repacked for the CPU's kernels first, as moe-run does (--no-repack: the
 * stored layouts).
 * Not a test: figures go to docs/benchmarks.md with the command.
 *
 *   bench-prompt MODEL [-p N] [-t THREADS] [-b BATCH] [-c CTX] [-r REPS] [--seed S] [--no-repack]
 *   bench-prompt /tmp/kb/tiny-q4_k.moeb -p 512 -t 2 -b 512 -c 1024 -r 10
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe-model.h"
#include "moe-session.h"

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int usage(void) {
    fprintf(stderr, "usage: bench-prompt MODEL [-p N] [-t THREADS] [-b BATCH] [-c CTX] [-r REPS] [--seed S] "
                    "[--no-repack]\n"
                    "example: bench-prompt /tmp/kb/tiny-q4_k.moeb -p 512 -t 2 -b 512 -c 1024 -r 10\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) return usage();
    const char *path = argv[1];
    int n = 512, threads = 1, batch = 512, ctx = 1024, reps = 5;
    unsigned seed = 1;
    int repack = 1;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--no-repack")) {
            repack = 0;
            continue;
        }
        if (i + 1 >= argc) return usage();
        const char *o = argv[i], *v = argv[++i];
        int x = atoi(v);
        if (!strcmp(o, "-p")) n = x;
        else if (!strcmp(o, "-t")) threads = x;
        else if (!strcmp(o, "-b")) batch = x;
        else if (!strcmp(o, "-c")) ctx = x;
        else if (!strcmp(o, "-r")) reps = x;
        else if (!strcmp(o, "--seed")) seed = (unsigned)x;
        else return usage();
    }
    if (n < 1 || reps < 1 || ctx < n) return usage();
    struct moe_model_params mp = moe_model_default_params();
    struct moe_model *m = NULL;
    if (moe_model_load(path, &mp, &m) != MOE_OK) {
        fprintf(stderr, "cannot load %s\n", path);
        return 1;
    }
    size_t packed = 0;
    if (repack && moe_model_repack(m, 1, &packed) != MOE_OK) {
        moe_model_free(m);
        return 1;
    }
    printf("%s: %zu bytes repacked\n", path, packed);
    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = ctx;
    sp.n_batch = batch;
    sp.n_threads = threads;
    struct moe_session *s = NULL;
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    float *logits = malloc(sizeof *logits * (size_t)m->cfg.n_vocab);
    double *tps = malloc(sizeof *tps * (size_t)reps), *cpu = malloc(sizeof *cpu * (size_t)reps);
    int rc = 1;
    if (!ids || !logits || !tps || !cpu || moe_session_create(m, &sp, &s) != MOE_OK) goto done;
    srand(seed);
    for (int i = 0; i < n; i++) ids[i] = 3 + rand() % (m->cfg.n_vocab - 3);
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        moe_session_reset(s);
        const double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        if (moe_session_forward(s, ids, n, logits, 0) != MOE_OK) goto done;
        const double dt = clock_s(CLOCK_MONOTONIC) - t0, dc = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (r >= 0) tps[r] = n / dt;
        if (r >= 0) cpu[r] = dc;
        printf("%s %d: %.1f tokens/s, %.1f ms, CPU time %.1f ms\n", r < 0 ? "warm-up" : "pass", r + 1, n / dt, 1e3 * dt,
               1e3 * dc);
    }
    qsort(tps, (size_t)reps, sizeof *tps, cmp_double);
    qsort(cpu, (size_t)reps, sizeof *cpu, cmp_double);
    printf("%s pp%d t%d: median %.1f tokens/s, best %.1f (%d passes); CPU time median %.1f ms, least %.1f\n", path,
           n, threads, tps[reps / 2], tps[reps - 1], reps, 1e3 * cpu[reps / 2], 1e3 * cpu[0]);
    rc = 0;
done:
    moe_session_free(s);
    moe_model_free(m);
    free(ids);
    free(logits);
    free(tps);
    free(cpu);
    return rc;
}

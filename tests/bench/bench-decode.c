/*
 * bench-decode.c - decode speed of the CPU backend at several thread counts,
 * side by side in one process. The model is loaded (and repacked for the
 * CPU's kernels, as moe-run does) once; one session per thread count. Each
 * round runs every session in turn: a fresh sequence, an 8-token prompt,
 * then N greedy decode steps, timed. Rounds alternate the sessions within
 * milliseconds, so a change of the machine's load hits them alike; the
 * ratio of two thread counts is taken per round, then its median.
 * Not a test: figures go to docs/benchmarks.md with the command.
 *
 *   bench-decode MODEL [-t LIST] [-n N] [-c CTX] [-r ROUNDS] [--no-repack]
 *   bench-decode /tmp/kb/tiny-q4_k.moeb -t 1,2 -n 64 -r 40
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe-model.h"
#include "moe-sampler.h"
#include "moe-session.h"

#define MAX_CFG 8

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int usage(void) {
    fprintf(stderr, "usage: bench-decode MODEL [-t LIST] [-n N] [-c CTX] [-r ROUNDS] [--no-repack]\n"
                    "  -t LIST   thread counts, comma-separated (default 1,2)\n"
                    "  -n N      decode steps per round (default 64)\n"
                    "  -c CTX    context (default 1024)\n"
                    "  -r ROUNDS rounds (default 20)\n"
                    "example: bench-decode /tmp/kb/tiny-q4_k.moeb -t 1,2 -n 64 -r 40\n");
    return 2;
}

/* decode_round: a fresh sequence, 8 prompt tokens, n greedy steps; returns
 * the decode tokens/s, or -1 on an error. */
static double decode_round(struct moe_session *s, const struct moe_model *m, int n, float *logits) {
    const int32_t prompt[8] = {10, 11, 12, 13, 14, 15, 16, 17};
    moe_session_reset(s);
    if (moe_session_forward(s, prompt, 8, logits, 0) != MOE_OK) return -1;
    const double t0 = now_s();
    for (int i = 0; i < n; i++) {
        int32_t next = moe_argmax(logits, m->cfg.n_vocab);
        if (moe_session_forward(s, &next, 1, logits, 0) != MOE_OK) return -1;
    }
    return n / (now_s() - t0);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) return usage();
    const char *path = argv[1];
    int threads[MAX_CFG] = {1, 2}, n_cfg = 2, n = 64, ctx = 1024, rounds = 20, repack = 1;
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--no-repack")) {
            repack = 0;
            continue;
        }
        if (i + 1 >= argc) return usage();
        const char *v = argv[++i];
        if (!strcmp(o, "-t")) {
            n_cfg = 0;
            for (char *p = (char *)v; *p && n_cfg < MAX_CFG;) {
                char *end;
                long t = strtol(p, &end, 10);
                if (end == p || t < 1 || t > 256) return usage();
                threads[n_cfg++] = (int)t;
                p = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') return usage();
            }
        } else if (!strcmp(o, "-n")) {
            n = atoi(v);
        } else if (!strcmp(o, "-c")) {
            ctx = atoi(v);
        } else if (!strcmp(o, "-r")) {
            rounds = atoi(v);
        } else {
            return usage();
        }
    }
    if (n < 1 || rounds < 1 || n_cfg < 1 || ctx < n + 8) return usage();
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
    struct moe_session *s[MAX_CFG] = {0};
    float *logits = malloc(sizeof *logits * (size_t)m->cfg.n_vocab);
    double *tps = malloc(sizeof *tps * (size_t)rounds * MAX_CFG), *ratio = malloc(sizeof *ratio * (size_t)rounds);
    int rc = 1;
    if (!logits || !tps || !ratio) goto done;
    for (int c = 0; c < n_cfg; c++) {
        struct moe_session_params sp = moe_session_default_params();
        sp.n_ctx = ctx;
        sp.n_threads = threads[c];
        if (moe_session_create(m, &sp, &s[c]) != MOE_OK || decode_round(s[c], m, n, logits) < 0) goto done; /* warm-up */
    }
    printf("%s: %zu bytes repacked; %d rounds of %d decode steps\n", path, packed, rounds, n);
    for (int r = 0; r < rounds; r++) {
        for (int c = 0; c < n_cfg; c++)
            if ((tps[c * rounds + r] = decode_round(s[c], m, n, logits)) < 0) goto done;
        printf("round %2d:", r + 1);
        for (int c = 0; c < n_cfg; c++) printf(" t%d %8.1f", threads[c], tps[c * rounds + r]);
        printf("\n");
    }
    for (int c = n_cfg - 1; c >= 0; c--) { /* (the first config's figures are sorted last) */
        for (int r = 0; r < rounds; r++) ratio[r] = tps[c * rounds + r] / tps[r];
        const double rm = median(ratio, rounds);
        printf("t%d: median %.1f tokens/s", threads[c], median(tps + (size_t)c * rounds, rounds));
        if (c > 0) printf(", per-round ratio to t%d: median %.3f, %.3f..%.3f", threads[0], rm, ratio[0], ratio[rounds - 1]);
        printf("\n");
    }
    rc = 0;
done:
    for (int c = 0; c < n_cfg; c++) moe_session_free(s[c]);
    moe_model_free(m);
    free(logits);
    free(tps);
    free(ratio);
    return rc;
}

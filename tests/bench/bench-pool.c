/*
 * bench-pool.c - what a parallel loop of the thread pool costs, and whether
 * this machine gives the threads a core each right now: R rounds of 50 000
 * iterations, each one moe_pool_for over 16 items of float adds (TOTAL adds
 * in all) and then GAP adds on the caller alone (the serial work between the
 * loops of a decoded token). Prints microseconds per iteration per round.
 * With 2 threads against 1: faster when each thread has a core; slower (the
 * "bad state" of docs/benchmarks.md) when the two share one.
 * Not a test: figures go to docs/benchmarks.md with the command.
 *
 *   bench-pool THREADS [GAP [TOTAL [ROUNDS]]]
 *   bench-pool 2 2000 2000        (then bench-pool 1 2000 2000)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "moe-threadpool.h"

static volatile float sink[256];
static int per_item;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* adds: k float additions, the result kept where the compiler must store it. */
static void adds(int k, int tid) {
    float x = 0;
    for (int i = 0; i < k; i++) x += (float)i * 0.5f;
    sink[tid & 255] += x;
}

static void items(void *ctx, int64_t b, int64_t e, int tid) {
    (void)ctx;
    for (int64_t i = b; i < e; i++) adds(per_item, tid);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 5) {
        fprintf(stderr, "usage: bench-pool THREADS [GAP [TOTAL [ROUNDS]]]\nexample: bench-pool 2 2000 2000\n");
        return 2;
    }
    const int threads = atoi(argv[1]), gap = argc > 2 ? atoi(argv[2]) : 2000;
    const int total = argc > 3 ? atoi(argv[3]) : 2000, rounds = argc > 4 ? atoi(argv[4]) : 5;
    if (threads < 1 || gap < 0 || total < 16 || rounds < 1) {
        fprintf(stderr, "bench-pool: THREADS >= 1, GAP >= 0, TOTAL >= 16, ROUNDS >= 1\n");
        return 2;
    }
    struct moe_pool *p = NULL;
    if (moe_pool_create(threads, &p) != MOE_OK) return 1;
    per_item = total / 16;
    for (int r = 0; r < rounds; r++) {
        const int n = 50000;
        const double t0 = now_s();
        for (int i = 0; i < n; i++) {
            moe_pool_for(p, 16, 1, items, NULL);
            adds(gap, 0);
        }
        printf("T %d gap %d total %d: %.3f us/iter\n", threads, gap, total, (now_s() - t0) / n * 1e6);
    }
    moe_pool_free(p);
    return 0;
}

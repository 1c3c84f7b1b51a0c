/*
 * test-threadpool.c - formats/threadpool.c:
 *   - every item of a loop is processed exactly once, by a thread id in
 *     range, for many sizes and minimum chunks (1, 2 and 4 threads);
 *   - 20 000 loops back to back (workers spinning between them) and loops
 *     after a pause longer than the spin (workers asleep on the futex) lose
 *     and repeat nothing;
 *   - a loop below two minimum chunks runs on the caller alone;
 *   - a worker stuck in its chunk does not hold up the others: while thread 1
 *     sleeps 100 ms in its first chunk, the caller takes every other chunk
 *     (what happens when another process holds a worker's core);
 *   - MOE_POOL_SPIN_US = 0 (sleep at once) gives the same results.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moe-test.h"
#include "moe-threadpool.h"

#define MAX_N 5000

struct count_ctx {
    _Atomic int hits[MAX_N];
    _Atomic int bad_tid;
    int n_threads;
    _Atomic int calls_by_tid[8];
};

static void count_fn(void *vctx, int64_t b, int64_t e, int tid) {
    struct count_ctx *c = vctx;
    if (tid < 0 || tid >= c->n_threads) atomic_fetch_add(&c->bad_tid, 1);
    else atomic_fetch_add(&c->calls_by_tid[tid], 1);
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
}

/* once: run one loop over n items and check each was hit exactly once. */
static int once(struct moe_pool *p, struct count_ctx *c, int64_t n, int64_t min_chunk) {
    for (int64_t i = 0; i < n; i++) atomic_store(&c->hits[i], 0);
    moe_pool_for(p, n, min_chunk, count_fn, c);
    for (int64_t i = 0; i < n; i++)
        if (atomic_load(&c->hits[i]) != 1) return 0;
    return atomic_load(&c->bad_tid) == 0;
}

static void test_exactly_once(int n_threads) {
    struct moe_pool *p = NULL;
    CHECK(moe_pool_create(n_threads, &p) == MOE_OK && p, "create %d threads", n_threads);
    if (!p) return;
    CHECK(moe_pool_n_threads(p) == n_threads, "%d threads", moe_pool_n_threads(p));
    struct count_ctx *c = calloc(1, sizeof *c);
    c->n_threads = n_threads;
    static const int64_t sizes[] = {1, 2, 3, 7, 8, 9, 31, 64, 100, 1000, 4999, MAX_N};
    static const int64_t mins[] = {0, 1, 2, 5, 64, 1000, 100000};
    int ok = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t j = 0; j < sizeof mins / sizeof mins[0]; j++) ok &= once(p, c, sizes[i], mins[j]);
    CHECK(ok, "%d threads: every item exactly once, tids in range", n_threads);

    /* many loops back to back, workers spinning between them */
    ok = 1;
    for (int r = 0; r < 20000 && ok; r++) ok &= once(p, c, 1 + r % 97, 1);
    CHECK(ok, "%d threads: 20000 small loops back to back", n_threads);

    /* after a pause longer than the spin the workers sleep; loops still work */
    ok = 1;
    for (int r = 0; r < 5; r++) {
        usleep(2000);
        ok &= once(p, c, 1000, 1);
    }
    CHECK(ok, "%d threads: loops after the workers went to sleep", n_threads);

    /* below two minimum chunks: the caller alone */
    memset(c->calls_by_tid, 0, sizeof c->calls_by_tid);
    ok = once(p, c, 9, 5);
    CHECK(ok && atomic_load(&c->calls_by_tid[0]) == 1, "%d threads: a short loop runs on the caller", n_threads);
    free(c);
    moe_pool_free(p);
}

/* A loop where thread 1's first chunk sleeps: the caller must not wait for
 * thread 1 before taking the remaining chunks. */
struct stall_ctx {
    _Atomic int hits[64];
    _Atomic int by_tid[2];
    _Atomic int stalled;
};

static void stall_fn(void *vctx, int64_t b, int64_t e, int tid) {
    struct stall_ctx *c = vctx;
    if (tid == 1 && atomic_exchange(&c->stalled, 1) == 0) usleep(100000);
    else usleep(1000); /* every chunk takes a while, so the worker gets one */
    for (int64_t i = b; i < e; i++) {
        atomic_fetch_add(&c->hits[i], 1);
        atomic_fetch_add(&c->by_tid[tid], 1);
    }
}

static void test_stalled_worker(void) {
    struct moe_pool *p = NULL;
    CHECK(moe_pool_create(2, &p) == MOE_OK, "create 2 threads");
    if (!p) return;
    struct stall_ctx *c = calloc(1, sizeof *c);
    /* wake the worker first, so that it takes a chunk of the next loop */
    int tries = 0;
    do {
        atomic_store(&c->stalled, 0);
        memset(c->hits, 0, sizeof c->hits);
        memset(c->by_tid, 0, sizeof c->by_tid);
        moe_pool_for(p, 64, 1, stall_fn, c);
    } while (atomic_load(&c->stalled) == 0 && ++tries < 100); /* the worker took no chunk: try again */
    int ok = 1;
    for (int i = 0; i < 64; i++) ok &= atomic_load(&c->hits[i]) == 1;
    CHECK(ok, "stalled worker: every item exactly once");
    /* 8 chunks of 8: the stalled thread keeps one, the caller does the other 7 */
    CHECK(tries < 100 && atomic_load(&c->by_tid[1]) == 8 && atomic_load(&c->by_tid[0]) == 56,
          "stalled worker: caller did %d items, worker %d (want 56 and 8; %d tries)", atomic_load(&c->by_tid[0]),
          atomic_load(&c->by_tid[1]), tries);
    free(c);
    moe_pool_free(p);
}

int main(void) {
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) setenv("MOE_POOL_SPIN_US", "0", 1);
        test_exactly_once(1);
        test_exactly_once(2);
        test_exactly_once(4);
        test_stalled_worker();
    }
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}

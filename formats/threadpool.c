/*
 * threadpool.c - persistent workers that claim chunks of each loop.
 *
 * A loop is published as one 64-bit claim word (generation | chunk count |
 * next chunk). Every thread, the caller included, takes chunks with a
 * compare-and-swap until none is left; the caller then waits until every
 * chunk taken is done. So a worker that the OS has not run yet (another
 * process holds its core) costs nothing: the threads that run take its
 * chunks. Between loops a worker spins for a bounded time (the many small
 * loops of one decoded token follow each other within microseconds; waking a
 * sleeping thread costs tens of microseconds in a virtual machine), then
 * sleeps on a futex. The caller waits for the last chunk the same way.
 *
 * Why the claim word is safe: a thread reads the loop's description (fn,
 * ctx, n, chunk) after seeing its generation and before its first claim; a
 * successful claim (same generation, next < count) proves the loop was not
 * finished at that moment, and the caller writes the next loop's description
 * only after every chunk is finished, so the description it read was this
 * loop's. The generation has 32 bits; a thread would have to stall for 2^32
 * loops between two reads to be fooled.
 */
#define _GNU_SOURCE
#include "moe-threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long a thread spins for the next loop (or the last chunk) before it
 * sleeps, in nanoseconds; MOE_POOL_SPIN_US overrides it (0: never spin). */
#define DEFAULT_SPIN_NS 50000

/* Chunks per thread of a loop: a few, so that threads that run take over
 * the work of one that does not; each chunk still long enough to stream. */
#define CHUNKS_PER_THREAD 4
#define MAX_CHUNKS 65535

struct moe_pool {
    int n_threads;
    pthread_t *threads;
    int64_t spin_ns;
    /* the current loop (written by the caller only between loops) */
    moe_range_fn fn;
    void *ctx;
    int64_t n, chunk;
    uint32_t gen; /* the caller's copy of the generation */
    int solo;     /* moe_pool_set_solo */
    /* shared words, each on its own cache line */
    _Alignas(64) _Atomic uint64_t claim; /* gen << 32 | count << 16 | next */
    _Alignas(64) _Atomic uint32_t done;  /* chunks finished (the caller's futex) */
    _Atomic int caller_waits;            /* the caller sleeps on `done` */
    _Alignas(64) _Atomic uint32_t wake;  /* the workers' futex word: bumped to wake them */
    _Atomic int sleepers;                /* workers asleep (or about to be) */
    _Atomic int quit;
};

struct worker_arg {
    struct moe_pool *p;
    int tid;
};

static inline uint32_t claim_gen(uint64_t c) { return (uint32_t)(c >> 32); }
static inline uint32_t claim_count(uint64_t c) { return (uint32_t)(c >> 16) & 0xffffu; }
static inline uint32_t claim_next(uint64_t c) { return (uint32_t)c & 0xffffu; }

static long futex(_Atomic uint32_t *w, int op, uint32_t val) {
    return syscall(SYS_futex, (uint32_t *)w, op | FUTEX_PRIVATE_FLAG, val, NULL, NULL, 0);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* work: take and run chunks of the loop whose claim word was c until none is
 * left (or another loop has replaced it). */
static void work(struct moe_pool *p, uint64_t c, int tid) {
    const uint32_t g = claim_gen(c);
    const moe_range_fn fn = p->fn;
    void *ctx = p->ctx;
    const int64_t n = p->n, chunk = p->chunk;
    for (;;) {
        if (claim_gen(c) != g || claim_next(c) >= claim_count(c)) return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* c now holds the current word */
        const int64_t b = (int64_t)claim_next(c) * chunk;
        const int64_t e = b + chunk < n ? b + chunk : n;
        fn(ctx, b, e, tid);
        const uint32_t count = claim_count(c);
        if (atomic_fetch_add(&p->done, 1) + 1 == count && atomic_load(&p->caller_waits))
            futex(&p->done, FUTEX_WAKE, INT_MAX);
        c = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

static void *worker_main(void *arg) {
    struct worker_arg *wa = arg;
    struct moe_pool *p = wa->p;
    const int tid = wa->tid;
    free(wa);
    uint32_t seen = 0;
    for (;;) {
        /* wait for a loop of a new generation: spin, then sleep */
        uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
        if (claim_gen(c) == seen && !atomic_load_explicit(&p->quit, memory_order_relaxed)) {
            const int64_t t0 = p->spin_ns > 0 ? now_ns() : 0;
            for (int i = 1;; i++) {
                cpu_relax();
                c = atomic_load_explicit(&p->claim, memory_order_acquire);
                if (claim_gen(c) != seen || atomic_load_explicit(&p->quit, memory_order_relaxed)) break;
                if ((i & 63) == 0 && now_ns() - t0 >= p->spin_ns) {
                    /* sleep: announce it, look once more, then wait on `wake`
                     * (the caller bumps it after publishing if anyone sleeps) */
                    const uint32_t w = atomic_load(&p->wake);
                    atomic_fetch_add(&p->sleepers, 1);
                    c = atomic_load(&p->claim);
                    if (claim_gen(c) == seen && !atomic_load(&p->quit)) futex(&p->wake, FUTEX_WAIT, w);
                    atomic_fetch_sub(&p->sleepers, 1);
                    c = atomic_load_explicit(&p->claim, memory_order_acquire);
                    if (claim_gen(c) != seen || atomic_load(&p->quit)) break;
                    i = 0;
                }
            }
        }
        if (atomic_load(&p->quit)) break;
        seen = claim_gen(c);
        work(p, c, tid);
    }
    return NULL;
}

/* wake_workers: after a store to claim or quit, wake the workers that sleep. */
static void wake_workers(struct moe_pool *p) {
    if (atomic_load(&p->sleepers) > 0) {
        atomic_fetch_add(&p->wake, 1);
        futex(&p->wake, FUTEX_WAKE, INT_MAX);
    }
}

enum moe_status moe_pool_create(int n_threads, struct moe_pool **out) {
    *out = NULL;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > 256) n_threads = 256;
    struct moe_pool *p = aligned_alloc(64, (sizeof *p + 63) & ~(size_t)63);
    if (!p) return MOE_ERR_NOMEM;
    *p = (struct moe_pool){0};
    p->n_threads = n_threads;
    p->spin_ns = DEFAULT_SPIN_NS;
    const char *env = getenv("MOE_POOL_SPIN_US");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 0 && v <= 1000000) p->spin_ns = (int64_t)v * 1000;
        else MOE_LOGW("MOE_POOL_SPIN_US=\"%s\" is not a number of microseconds in 0..1000000; ignored", env);
    }
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return MOE_ERR_NOMEM;
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (!wa || pthread_create(&p->threads[i], NULL, worker_main, (wa->p = p, wa->tid = i, wa))) {
            free(wa);
            MOE_LOGE("cannot start thread %d", i);
            p->n_threads = i; /* join only those started */
            moe_pool_free(p);
            return MOE_ERR_NOMEM;
        }
    }
    *out = p;
    return MOE_OK;
}

void moe_pool_free(struct moe_pool *p) {
    if (!p) return;
    atomic_store(&p->quit, 1);
    atomic_fetch_add(&p->wake, 1);
    futex(&p->wake, FUTEX_WAKE, INT_MAX);
    for (int i = 1; p->threads && i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p);
}

int moe_pool_n_threads(const struct moe_pool *p) { return p->n_threads; }

void moe_pool_for(struct moe_pool *p, int64_t n, int64_t min_chunk, moe_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (min_chunk < 1) min_chunk = 1;
    if (p->n_threads <= 1 || p->solo || n < 2 * min_chunk) {
        fn(ctx, 0, n, 0);
        return;
    }
    /* chunks: CHUNKS_PER_THREAD per thread, none shorter than min_chunk */
    int64_t count = (int64_t)p->n_threads * CHUNKS_PER_THREAD;
    if (count > n / min_chunk) count = n / min_chunk;
    if (count > MAX_CHUNKS) count = MAX_CHUNKS;
    int64_t chunk = (n + count - 1) / count;
    count = (n + chunk - 1) / chunk;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint64_t c = (uint64_t)++p->gen << 32 | (uint64_t)count << 16;
    atomic_store(&p->claim, c);
    wake_workers(p);
    work(p, c, 0);
    /* wait for the chunks other threads took: spin, then sleep on `done` */
    if (atomic_load_explicit(&p->done, memory_order_acquire) != (uint32_t)count) {
        const int64_t t0 = p->spin_ns > 0 ? now_ns() : 0;
        for (int i = 1; atomic_load_explicit(&p->done, memory_order_acquire) != (uint32_t)count; i++) {
            cpu_relax();
            if ((i & 63) == 0 && now_ns() - t0 >= p->spin_ns) {
                atomic_store(&p->caller_waits, 1);
                uint32_t d;
                while ((d = atomic_load(&p->done)) != (uint32_t)count) futex(&p->done, FUTEX_WAIT, d);
                atomic_store(&p->caller_waits, 0);
                break;
            }
        }
    }
}

void moe_pool_set_solo(struct moe_pool *p, int solo) { p->solo = solo != 0; }

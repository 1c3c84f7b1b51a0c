/*
 * moe-threadpool.h - a small persistent pthread pool for data-parallel loops.
 *
 * moe_pool_for() splits [0, n) into a few contiguous chunks per thread; every
 * thread (the caller too) takes chunks until none is left, and the call
 * returns when all are done. A thread the OS does not run at the moment (its
 * core is busy with another process) therefore delays a loop by at most the
 * chunk it holds. Between loops the workers spin for a bounded time (50 us,
 * MOE_POOL_SPIN_US overrides it), then sleep on a futex; the caller waits for
 * the last chunk the same way. One loop at a time per pool: a pool is not
 * re-entrant and must be driven from a single thread. fn may be called
 * several times per thread per loop, with a thread's own tid each time.
 */
#ifndef MOE_THREADPOOL_H
#define MOE_THREADPOOL_H

#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_pool;

/* fn processes items [begin, end); tid in [0, n_threads) identifies the thread
 * (for per-thread scratch buffers). */
typedef void (*moe_range_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/* moe_pool_create: n_threads <= 0 picks the number of online CPUs. */
enum moe_status moe_pool_create(int n_threads, struct moe_pool **out);

/* moe_pool_free: joins the workers; NULL is a no-op. */
void moe_pool_free(struct moe_pool *p);

/* moe_pool_n_threads: threads including the caller. */
int moe_pool_n_threads(const struct moe_pool *p);

/* moe_pool_for: run fn over [0, n); ranges shorter than min_chunk items are not
 * split further (small loops run on fewer threads). */
void moe_pool_for(struct moe_pool *p, int64_t n, int64_t min_chunk, moe_range_fn fn, void *ctx);

/* moe_pool_set_solo: solo != 0 runs every later loop on the caller alone
 * (fn(ctx, 0, n, 0)) until it is set back to 0; the workers sleep after
 * their spin. For moe-adapt.h's choice; the caller's thread only. */
void moe_pool_set_solo(struct moe_pool *p, int solo);

#ifdef __cplusplus
}
#endif
#endif

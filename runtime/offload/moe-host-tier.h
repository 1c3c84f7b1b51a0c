/*
 * moe-host-tier.h - the pinned host tier between storage and a GPU's expert
 * slots: a fixed set of equal host buffers holding verified expert copies,
 * kept least-recently-used, plus a few staging buffers for reads that do not
 * go into the tier (a budget of 0, or every tier buffer in use).
 *
 * The expert store's loaders use it through the backend's stage_begin /
 * stage_end hooks (moe-backend.h): acquire a buffer for a copy (a hit needs
 * no read), fill it from storage when it is not a hit, let the backend copy it
 * to the device, release it. The store's policy decides what the GPU keeps;
 * this tier is a second-level cache under it that remembers what the GPU
 * dropped, so a later miss is a host-to-device copy instead of a storage read.
 *
 * Plain C: the buffers come from caller-supplied allocation functions
 * (cudaHostAlloc in the CUDA backend, malloc in tests). Buffers are allocated
 * on first use, so an unused budget costs nothing. Thread safety: every
 * function may be called by several loader threads at once (one lock).
 */
#ifndef MOE_HOST_TIER_H
#define MOE_HOST_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_host_tier_ops {
    void *(*alloc)(void *user, size_t bytes); /* 4096-aligned memory, or NULL */
    void (*free)(void *user, void *p);
    void *user;
};

struct moe_host_tier_stats {
    int64_t hits;         /* acquisitions served from the tier (no read) */
    int64_t misses;       /* acquisitions the caller had to fill */
    int64_t inserts;      /* filled copies kept */
    int64_t evictions;    /* kept copies dropped for new ones */
    int64_t staging_uses; /* misses served by a staging buffer (not kept) */
    int64_t alloc_failures;
    int n_slots, n_allocated;
    size_t slot_bytes;
};

struct moe_host_tier;

/* moe_host_tier_new: n_slots tier buffers and n_staging (>= 1) staging
 * buffers, each of slot_bytes (> 0); none is allocated yet. ops is copied. */
enum moe_status moe_host_tier_new(int n_slots, size_t slot_bytes, int n_staging, const struct moe_host_tier_ops *ops,
                                  struct moe_host_tier **out);

/* moe_host_tier_free: frees every buffer (none may be acquired); NULL is a no-op. */
void moe_host_tier_free(struct moe_host_tier *t);

/* moe_host_tier_acquire: a buffer of slot_bytes for content `key`. *ready = 1
 * when it already holds that content (a hit: read it, do not write it); else
 * the caller fills it and says so in release. A key being filled by another
 * caller, or no free tier buffer, gives a staging buffer; the call waits when
 * every staging buffer is in use. MOE_ERR_RANGE (logged) when room >
 * slot_bytes; MOE_ERR_NOMEM when no buffer can be allocated. */
enum moe_status moe_host_tier_acquire(struct moe_host_tier *t, uint64_t key, size_t room, void **buf, int *ready);

/* moe_host_tier_release: the caller is done with buf; ok = 1: it holds key's
 * complete, verified content (a tier buffer then keeps it for later hits);
 * ok = 0: its content is not valid. Any copy out of buf must be finished. */
void moe_host_tier_release(struct moe_host_tier *t, void *buf, int ok);

/* moe_host_tier_contains: 1 if a verified copy of key is kept. */
int moe_host_tier_contains(struct moe_host_tier *t, uint64_t key);

/* moe_host_tier_get_stats: the counters so far. */
void moe_host_tier_get_stats(struct moe_host_tier *t, struct moe_host_tier_stats *out);

#ifdef __cplusplus
}
#endif
#endif

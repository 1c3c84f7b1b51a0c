/*
 * host-tier.c - the pinned host tier (moe-host-tier.h): fixed buffers, LRU,
 * reference counts, staging for what the tier cannot take.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "moe-host-tier.h"

struct tier_buf {
    void *p;        /* NULL until first used */
    uint64_t key;
    int has_key;    /* key names its content (valid or being filled) */
    int valid;      /* the content is complete and verified */
    int refs;       /* callers holding it */
    uint64_t tick;  /* last use, for LRU */
};

struct moe_host_tier {
    struct moe_host_tier_ops ops;
    size_t slot_bytes;
    int n_slots, n_staging;
    struct tier_buf *slots, *staging; /* staging: refs 0/1, never valid */
    uint64_t tick;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct moe_host_tier_stats stats;
};

enum moe_status moe_host_tier_new(int n_slots, size_t slot_bytes, int n_staging, const struct moe_host_tier_ops *ops,
                                  struct moe_host_tier **out) {
    *out = NULL;
    if (n_slots < 0 || n_staging < 1 || slot_bytes == 0 || !ops || !ops->alloc || !ops->free) {
        MOE_LOGE("bad host tier parameters (%d slots, %d staging, %zu bytes)", n_slots, n_staging, slot_bytes);
        return MOE_ERR_INVALID;
    }
    struct moe_host_tier *t = calloc(1, sizeof *t);
    if (!t) return MOE_ERR_NOMEM;
    t->slots = calloc((size_t)n_slots + 1, sizeof *t->slots);
    t->staging = calloc((size_t)n_staging, sizeof *t->staging);
    if (!t->slots || !t->staging) {
        free(t->slots);
        free(t->staging);
        free(t);
        return MOE_ERR_NOMEM;
    }
    t->ops = *ops;
    t->slot_bytes = slot_bytes;
    t->n_slots = n_slots;
    t->n_staging = n_staging;
    t->stats.n_slots = n_slots;
    t->stats.slot_bytes = slot_bytes;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    *out = t;
    return MOE_OK;
}

void moe_host_tier_free(struct moe_host_tier *t) {
    if (!t) return;
    for (int i = 0; i < t->n_slots; i++)
        if (t->slots[i].p) t->ops.free(t->ops.user, t->slots[i].p);
    for (int i = 0; i < t->n_staging; i++)
        if (t->staging[i].p) t->ops.free(t->ops.user, t->staging[i].p);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t->slots);
    free(t->staging);
    free(t);
}

/* ensure: b's memory, allocated on first use (lock held). */
static int ensure(struct moe_host_tier *t, struct tier_buf *b, int is_slot) {
    if (b->p) return 1;
    b->p = t->ops.alloc(t->ops.user, t->slot_bytes);
    if (!b->p) {
        t->stats.alloc_failures++;
        return 0;
    }
    if (is_slot) t->stats.n_allocated++;
    return 1;
}

/* find: the tier buffer naming key, or NULL (lock held). */
static struct tier_buf *find(struct moe_host_tier *t, uint64_t key) {
    for (int i = 0; i < t->n_slots; i++)
        if (t->slots[i].has_key && t->slots[i].key == key) return &t->slots[i];
    return NULL;
}

enum moe_status moe_host_tier_acquire(struct moe_host_tier *t, uint64_t key, size_t room, void **buf, int *ready) {
    *buf = NULL;
    *ready = 0;
    if (room > t->slot_bytes) {
        MOE_LOGE("host tier: a copy of %zu bytes does not fit its %zu-byte buffers", room, t->slot_bytes);
        return MOE_ERR_RANGE;
    }
    pthread_mutex_lock(&t->mu);
    struct tier_buf *b = find(t, key);
    if (b && b->valid) { /* a hit */
        b->refs++;
        b->tick = ++t->tick;
        t->stats.hits++;
        *buf = b->p;
        *ready = 1;
        pthread_mutex_unlock(&t->mu);
        return MOE_OK;
    }
    t->stats.misses++;
    if (!b) { /* the least recently used buffer nobody holds (empty ones first) */
        struct tier_buf *victim = NULL;
        for (int i = 0; i < t->n_slots; i++) {
            struct tier_buf *c = &t->slots[i];
            if (c->refs) continue;
            if (!victim || (!c->has_key && victim->has_key) || (c->has_key == victim->has_key && c->tick < victim->tick))
                victim = c;
        }
        if (victim && ensure(t, victim, 1)) {
            if (victim->has_key && victim->valid) t->stats.evictions++;
            victim->key = key, victim->has_key = 1, victim->valid = 0, victim->refs = 1;
            victim->tick = ++t->tick;
            *buf = victim->p;
            pthread_mutex_unlock(&t->mu);
            return MOE_OK;
        }
    }
    /* staging: the key is being filled by another caller, or no tier buffer is free */
    for (;;) {
        for (int i = 0; i < t->n_staging; i++) {
            struct tier_buf *s = &t->staging[i];
            if (s->refs) continue;
            if (!ensure(t, s, 0)) {
                pthread_mutex_unlock(&t->mu);
                MOE_LOGE("host tier: cannot allocate a %zu-byte staging buffer", t->slot_bytes);
                return MOE_ERR_NOMEM;
            }
            s->refs = 1;
            t->stats.staging_uses++;
            *buf = s->p;
            pthread_mutex_unlock(&t->mu);
            return MOE_OK;
        }
        pthread_cond_wait(&t->cv, &t->mu);
    }
}

void moe_host_tier_release(struct moe_host_tier *t, void *buf, int ok) {
    if (!buf) return;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n_slots; i++) {
        struct tier_buf *b = &t->slots[i];
        if (b->p != buf || !b->refs) continue;
        b->refs--;
        if (!b->valid) { /* it was being filled */
            if (ok) {
                b->valid = 1;
                t->stats.inserts++;
            } else {
                b->has_key = 0;
            }
        }
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        return;
    }
    for (int i = 0; i < t->n_staging; i++)
        if (t->staging[i].p == buf) t->staging[i].refs = 0;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

int moe_host_tier_contains(struct moe_host_tier *t, uint64_t key) {
    pthread_mutex_lock(&t->mu);
    const struct tier_buf *b = find(t, key);
    int r = b && b->valid;
    pthread_mutex_unlock(&t->mu);
    return r;
}

void moe_host_tier_get_stats(struct moe_host_tier *t, struct moe_host_tier_stats *out) {
    pthread_mutex_lock(&t->mu);
    *out = t->stats;
    pthread_mutex_unlock(&t->mu);
}

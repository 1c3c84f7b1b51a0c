/*
 * store.c - the expert store (moe-store.h): slots in a backend's memory, the
 * cache-policy core deciding what they hold, loader threads reading blobs.
 *
 * Slots. Each cache has a fixed set of slots sized for its largest copy
 * (rounded up to 4096 bytes for direct I/O), allocated once; two scratch
 * slots serve copies a policy does not keep. A slot's content is identified
 * by a generation number: reassigning a slot bumps it, which cancels a queued
 * read of the old content. Loader threads take reads from a FIFO queue, read
 * the stored bytes (O_DIRECT, pread or the mapping), check the XXH3 checksum
 * (or decompress, which checks), and mark the slot ready.
 *
 * Order and safety. A step (one MoE layer of one token, or of a prompt
 * chunk) first asks the policy about every expert it needs, in the
 * simulator's order (rank order for a token; ascending expert id for a
 * batch), starting reads at once; then computes the experts in that same
 * order, waiting for each read in turn, so expert k+1's read overlaps expert
 * k's computation. A copy the current step still needs is never overwritten:
 * when the policy evicts such a copy (possible only when a step uses more
 * experts than a cache holds), the incoming copy is read into scratch for
 * this use and its slot is filled at its next use (a demand access) or once
 * the step has released it.
 *
 * Prefetch. Prefetched copies never enter the policy's caches on their own:
 * they are read into dedicated prefetch slots (counted in the budget), at
 * the precision the prediction would need (high for the top-1 or s <= T1,
 * else the low copy), queued behind every demand read (loaders take demand
 * reads first, and at most n_loaders - 1 prefetch reads run at once). When a
 * demand miss finds its copy in a prefetch slot, no read is made: if the
 * policy keeps the copy, the prefetch slot becomes the cache slot and the
 * slot the policy freed becomes a prefetch slot (roles swap, no bytes move);
 * if it does not, the item computes from the prefetch slot. A misprediction
 * costs its read and nothing else: its slot is simply reused, and its read
 * is cancelled if it has not started when its layer's step is planned. The
 * policy's decisions are those of a run without prefetch.
 *
 * Failures (moe-store.h, "Failed reads"). A loader retries a failed read
 * (load_tries) and records why it failed in the slot; it never logs. The
 * acquire waiting for the copy (at most io_timeout) says it once; the slot
 * is read again at its next use. Every read goes through fault_at, the test
 * seam (moe_store_params.io_hooks).
 */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <linux/aio_abi.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "moe-bundle.h"
#include "moe-store.h"

#include "moe-base.h"
#include "moe-tuning.h"

enum slot_state { S_EMPTY, S_QUEUED, S_LOADING, S_READY, S_FAILED };

/* Why a read failed (struct rd, slot.fail): the loaders say nothing; the
 * acquire that waited for the copy says it once. */
enum rd_kind {
    RD_OK,
    RD_ERRNO,    /* the kernel's error (err) */
    RD_EOF,      /* the file ended inside the copy */
    RD_CHECKSUM, /* the bytes read do not match the blob's XXH3 */
    RD_CHANGED,  /* the bundle's file changed (moe_bundle_check_file said so, by name) */
    RD_OTHER,    /* anything else (memory, the backend, a decoder): logged where it happened */
};

/* One read of a copy as a loader makes it: what it is for, and how it
 * failed (kind, errno, the file range). */
struct rd {
    int prefetch, attempt;
    int kind, err, tries;
    uint64_t offset, bytes;
};

struct slot {
    struct moe_buffer buf;
    size_t cap;           /* bytes a read may fill */
    int kind;             /* 1 high cache, 0 low cache, 2 scratch, 3 prefetch */
    int cls;              /* high slots: the home precision it is sized for */
    int32_t g;            /* expert held (or being read), -1 none */
    int prec;             /* its stored precision */
    enum slot_state state;
    uint64_t gen;         /* bumped at every reassignment */
    int users;            /* items of the current step that compute with it */
    int reading;          /* a loader is writing the buffer now */
    int prefetch;         /* loaded by a prefetch and not used by a demand access yet */
    int pf_layer;         /* the layer the prefetch was for */
    int64_t bytes;        /* raw bytes of the content (resident accounting) */
    /* a copy placed while the current step still uses the slot: it takes
     * the slot when the step releases it */
    int32_t pend_g;       /* -1: none */
    int pend_prec, pend_prefetch, pend_layer;
    struct rd fail;       /* S_FAILED: why */
};

/* A loader's Linux AIO context and its chunk bookkeeping (direct I/O). */
struct loader_io {
    aio_context_t ctx;        /* 0: none (read a chunk at a time) */
    int max_chunks;
    struct iocb *cbs;
    struct iocb **cbp;
    int64_t *got;             /* per chunk: bytes read, or -errno; -1 while in flight */
    struct moe_store_fault *fault; /* per chunk: what the test seam made of it (io_hooks) */
};

struct req {
    int slot;
    uint64_t gen;
    uint8_t decode, prefetch; /* for the counts, made when the read starts */
};

struct moe_store {
    const struct moe_model *m;
    const struct moe_config *c;
    struct moe_backend *be;
    struct moe_store_params p;
    int L, E, K;             /* L: MoE layers (experts are g = MoE layer * E + expert, as in profiles) */
    int *layer_of;           /* [L] model layer of each MoE layer */
    int *moe_of;             /* [n_layer] MoE layer index, -1 for dense layers */
    struct moe_cache *cache;
    struct moe_cache *shadow;   /* the policy guard's other policy over the same accesses, or NULL */
    enum moe_cache_policy shadow_policy; /* the shadow's policy (LRU) */
    int64_t guard_acc;          /* decode accesses the guard has seen */
    double guard_r, guard_s;    /* their miss penalties, the policy's and the shadow's, decayed */
    struct moe_cache_config cc;
    struct moe_tuning tun;   /* the bundle's tuning (arrays borrowed from the bundle) */
    struct moe_path_table *paths; /* EdgeMoE's path dictionary (prefetch_paths > 0), or NULL */
    int32_t *prev;           /* [L x K] the current token's experts per MoE layer (rank order) */
    enum moe_cache_policy policy;
    int32_t *order;          /* [L*E] placement order (twiddler.placement_order) or NULL */
    int16_t *home;           /* [L*E] precision of each expert's high copy */
    uint8_t *lower;          /* [L*E] 1: the low copy is smaller than the home copy (else a
                              * low need is served by the home copy: no second copy of it) */
    int low;                 /* precision of low copies */
    int dynamic, skip;
    double t1, t2;
    struct slot *slots;
    size_t low_read;         /* a low slot's size */
    int n_slots, scratch0;   /* scratch slots are [scratch0, scratch0 + MOE_STORE_SCRATCH) */
    int32_t *slot_hi, *slot_lo; /* [L*E] slot holding the expert's copy, -1 */
    int32_t *free_lo;
    int n_free_lo;
    /* high slots come in classes, one per home precision: cls_n[c] experts
     * have their home copy at precision c, read in at most cls_read[c] bytes;
     * the class has min(cls_n[c], high cap) slots of that size, so any set of
     * high copies the policy keeps has slots, and a bit-width map of mostly
     * small copies holds more of them than slots of the largest copy would */
    int cls_n[MOE_BUNDLE_MAX_PRECISIONS];
    size_t cls_read[MOE_BUNDLE_MAX_PRECISIONS];
    int32_t *free_c[MOE_BUNDLE_MAX_PRECISIONS];
    int n_free_c[MOE_BUNDLE_MAX_PRECISIONS];
    int scratch_turn;
    /* I/O */
    const struct moe_bundle *bundle;
    int fd;
    enum moe_io_mode io;
    int drop_pages;          /* MOE_IO_MMAP of a file mapping: drop the pages after each copy */
    size_t staging_size;
    /* loaders */
    pthread_t *threads;
    int n_threads, started;
    void **staging;          /* [n_threads] for compressed blobs and device-only slots */
    struct loader_io *lio;   /* [n_threads] with direct I/O, else NULL */
    uint8_t pack[MOE_BUNDLE_MAX_PRECISIONS][3]; /* per precision and part (gate, up, down): the
                                                 * layout it is repacked to after each read, 0 =
                                                 * none (params.repack) */
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* any state change: queue, slot ready, users released */
    struct req *q;
    int q_head, q_len, q_cap;
    struct req *pq;          /* prefetch reads: taken only when q is empty */
    int pq_head, pq_len, pq_cap;
    int n_pf_reading;        /* prefetch reads in progress (at most n_threads - 1, or 1) */
    int32_t *pf_slot;        /* [n_pf] slot indices in the prefetch role (they move: roles swap) */
    int n_pf, pf_turn;
    int32_t *pf_of;          /* [L*E] prefetch slot holding the expert's prefetched copy, -1 */
    int n_reading;           /* loaders reading now */
    int stop;
    /* the current step */
    int step_layer, step_n;
    struct moe_store_plan plan;
    struct moe_store_item *items;
    int32_t *rows, *pslots;
    float *weights;
    uint8_t *need;           /* [B*K] */
    int32_t *item_slot;      /* [max items] slot of each item, -1 */
    uint64_t *item_gen;
    int *item_lazy;          /* item reads into scratch when it is reached */
    uint8_t *item_hit;       /* item's copy was cached (for the backend's place()) */
    int max_items;
    int64_t resident;
    struct moe_store_stats stats;
    int warned_evict;
    int in_place;            /* moe_store_new_in_place: every expert used from the model's views */
    int max_n;               /* in place: the most tokens of a step (the session's batch) */
};

/* ---- parameters ----------------------------------------------------- */

struct moe_store_params moe_store_default_params(void) {
    struct moe_store_params p;
    memset(&p, 0, sizeof p);
    p.low_share = 0.25;
    p.io = MOE_IO_DIRECT;
    p.policy = -1;
    p.dynamic = -1;
    p.t1 = p.t2 = NAN;
    p.prefetch_layers = 0; /* off by default: on small caches it evicts more than it saves */
    p.prefetch_paths = 0;
    p.path_order = 1;
    p.warm = 1;
    p.n_loaders = 2;
    p.route_margin = NAN;
    p.guard = 1;
    p.prefetch_slots = -1;
    p.io_timeout = 30;
    return p;
}

enum moe_status moe_store_parse_size(const char *s, int64_t *out) { return moe_parse_size(s, out); }

/* deadline: `seconds` from now on `clock`, as pthread's timed waits take it. */
static struct timespec deadline(clockid_t clock, double seconds) {
    struct timespec t;
    clock_gettime(clock, &t);
    const double whole = floor(seconds);
    t.tv_sec += (time_t)whole;
    t.tv_nsec += (long)((seconds - whole) * 1e9);
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    return t;
}

static size_t round4k(uint64_t n) { return (size_t)((n + 4095) & ~(uint64_t)4095); }

/* blob: where expert g's copy at precision prec is (never fails for a
 * validated bundle and in-range indices; logged otherwise). */
static enum moe_status blob(const struct moe_store *st, int32_t g, int prec, struct moe_bundle_blob *b) {
    return moe_bundle_expert(st->bundle, (uint32_t)st->layer_of[g / st->E], (uint32_t)(g % st->E), (uint32_t)prec, b);
}

/* ---- loaders -------------------------------------------------------- */

/* fault_at: what the test seam (moe_store_params.io_hooks) makes of a read
 * of bytes [from, from + len) of blob b on `path`; nothing without hooks. */
static void fault_at(const struct moe_store *st, const struct rd *rd, const struct moe_bundle_blob *b, uint64_t from,
                     uint64_t len, enum moe_store_io_path path, struct moe_store_fault *f) {
    f->err = 0, f->bytes = -1, f->corrupt = 0;
    const struct moe_store_io_hooks *h = st->p.io_hooks;
    if (!h || !h->on_read) return;
    const struct moe_store_read_info in = {(int)b->layer, (int)b->expert, b->desc ? b->desc->name : "?",
                                           b->offset + from, len, path, rd->prefetch, rd->attempt};
    h->on_read(h->user, &in, f);
    if (f->bytes < 0 || (uint64_t)f->bytes >= len) f->bytes = -1;
    else if (st->io == MOE_IO_DIRECT) f->bytes &= ~(int64_t)4095; /* direct I/O comes back in whole blocks */
}

/* after_read: the test seam's after_read (moe_store_io_hooks) for the copy (g, prec) whose
 * reads ended with rc; nothing without it. */
static void after_read(const struct moe_store *st, int32_t g, int prec, const struct rd *rd, enum moe_status rc) {
    const struct moe_store_io_hooks *h = st->p.io_hooks;
    if (!h || !h->after_read) return;
    struct moe_bundle_blob b;
    if (blob(st, g, prec, &b) != MOE_OK) return;
    const enum moe_store_io_path path = st->io == MOE_IO_MMAP     ? MOE_STORE_PATH_MMAP
                                        : st->io == MOE_IO_DIRECT ? MOE_STORE_PATH_AIO
                                                                  : MOE_STORE_PATH_PREAD;
    const struct moe_store_read_info in = {(int)b.layer, (int)b.expert, b.desc ? b.desc->name : "?", b.offset,
                                           b.stored_size, path, rd->prefetch, rd->attempt};
    h->after_read(h->user, &in, rc);
}

/* read_error: a failed read of bytes at `from` of b (err: errno, 0 = the
 * end of the file), recorded in rd; the file changed: said by
 * moe_bundle_check_file, by name. */
static enum moe_status read_error(const struct moe_store *st, const struct moe_bundle_blob *b, struct rd *rd, int err,
                                  uint64_t from) {
    rd->kind = moe_bundle_check_file(st->bundle) ? RD_CHANGED : err ? RD_ERRNO : RD_EOF;
    rd->err = err, rd->offset = b->offset + from, rd->bytes = b->stored_size - from;
    return MOE_ERR_IO;
}

/* copy_range: bytes [from, to) of blob b from the bundle's mapping to dst +
 * from. For a file mapping the pages copied would stay in the RSS: they are
 * dropped a MiB at a time (a later access, e.g. a neighbour's copy, reads
 * them in again), so a copy in progress holds at most 1 MiB + 2 pages. */
static void copy_range(const struct moe_store *st, const struct moe_bundle_blob *b, void *dst, uint64_t from,
                       uint64_t to) {
    if (!st->drop_pages) {
        memcpy((char *)dst + from, (const char *)b->stored + from, (size_t)(to - from));
        return;
    }
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), s0 = (uintptr_t)b->stored;
    const uintptr_t end = s0 + (uintptr_t)to;
    for (uintptr_t a = s0 + (uintptr_t)from; a < end;) {
        const uintptr_t e = (a & ~(pg - 1)) + ((uintptr_t)1 << 20) < end ? (a & ~(pg - 1)) + ((uintptr_t)1 << 20) : end;
        memcpy((char *)dst + (a - s0), (const void *)a, (size_t)(e - a));
        madvise((void *)(a & ~(pg - 1)), ((e + pg - 1) & ~(pg - 1)) - (a & ~(pg - 1)), MADV_DONTNEED);
        a = e;
    }
}

/* copy_mapped: copy_range through the test seam (a copy out of memory
 * cannot fail otherwise: a truncated file is caught by the check before). */
static enum moe_status copy_mapped(const struct moe_store *st, const struct moe_bundle_blob *b, void *dst,
                                   uint64_t from, uint64_t to, struct rd *rd) {
    while (from < to) {
        struct moe_store_fault f;
        fault_at(st, rd, b, from, to - from, MOE_STORE_PATH_MMAP, &f);
        const uint64_t e = f.err ? from : f.bytes >= 0 ? from + (uint64_t)f.bytes : to;
        if (e == from) return read_error(st, b, rd, f.err, from);
        copy_range(st, b, dst, from, e);
        if (f.corrupt) ((char *)dst)[from] ^= 0x5a;
        from = e;
    }
    return MOE_OK;
}

/* pread_all: bytes [from, to) of blob b into dst + from (direct I/O: from
 * and the length 4096-aligned, reading past the blob's end into the room cap
 * allows); a short read is continued where it stopped. */
static enum moe_status pread_all(const struct moe_store *st, const struct moe_bundle_blob *b, char *dst, size_t cap,
                                 uint64_t from, uint64_t to, struct rd *rd) {
    uint64_t want = to;
    if (st->io == MOE_IO_DIRECT) want = round4k(to) <= cap ? round4k(to) : to;
    while (from < to) {
        struct moe_store_fault f;
        fault_at(st, rd, b, from, want - from, MOE_STORE_PATH_PREAD, &f);
        ssize_t r = -1;
        if (f.err) errno = f.err;
        else r = pread(st->fd, dst + from, f.bytes >= 0 ? (size_t)f.bytes : (size_t)(want - from),
                       (off_t)(b->offset + from));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return read_error(st, b, rd, r < 0 ? errno : 0, from);
        if (f.corrupt) dst[from] ^= 0x5a;
        from += (uint64_t)r;
    }
    return MOE_OK;
}

/* read_stored: the stored bytes of b into dst (cap bytes of room). */
static enum moe_status read_stored(struct moe_store *st, const struct moe_bundle_blob *b, void *dst, size_t cap,
                                   struct rd *rd) {
    if (st->io == MOE_IO_MMAP) return copy_mapped(st, b, dst, 0, b->stored_size, rd);
    return pread_all(st, b, dst, cap, 0, b->stored_size, rd);
}

/* mismatch: the checksum of b's bytes failed (recorded in rd): the file
 * changed since the check before the read, or the bytes are damaged. */
static enum moe_status mismatch(const struct moe_store *st, const struct moe_bundle_blob *b, struct rd *rd) {
    rd->kind = moe_bundle_check_file(st->bundle) ? RD_CHANGED : RD_CHECKSUM;
    rd->err = 0, rd->offset = b->offset, rd->bytes = b->stored_size;
    return MOE_ERR_IO;
}

/* check_sum: the XXH3 of a stored (uncompressed) blob read into p. */
static enum moe_status check_sum(const struct moe_store *st, const struct moe_bundle_blob *b, const void *p,
                                 struct rd *rd) {
    return XXH3_64bits(p, (size_t)b->stored_size) == b->checksum ? MOE_OK : mismatch(st, b, rd);
}

/* load_staged: a buffer without a host view on a backend with staging hooks
 * (a GPU): read into the backend's host buffer (pinned; it may already hold
 * the copy: the backend's host tier), and let the backend copy it over. The
 * key names the content: g * precisions + prec. */
static enum moe_status load_staged(struct moe_store *st, struct slot *s, const struct moe_bundle_blob *b, int32_t g,
                                   int prec, void *staging, struct rd *rd) {
    const uint64_t key = (uint64_t)g * (uint64_t)st->m->n_expert_prec + (uint64_t)prec;
    const size_t room = round4k(b->raw_size > b->stored_size ? b->raw_size : b->stored_size);
    void *h = NULL;
    int ready = 0;
    enum moe_status rc = moe_backend_stage_begin(st->be, key, room, &h, &ready);
    if (rc) return rc;
    if (!ready && b->compression == MOE_BUNDLE_COMP_NONE) {
        if (!(rc = read_stored(st, b, h, room, rd))) rc = check_sum(st, b, h, rd);
    } else if (!ready) {
        if (!(rc = read_stored(st, b, staging, st->staging_size, rd)))
            rc = moe_bundle_blob_decode(st->bundle, b, staging, h, room);
    }
    enum moe_status rc2 = moe_backend_stage_end(st->be, key, h, rc == MOE_OK, &s->buf, (size_t)b->raw_size);
    return rc ? rc : rc2;
}

/* pack_copy: the parts of a copy just read into host memory that st->pack
 * names, interleaved in place a group of 16 rows at a time through the
 * loader's staging buffer (moe_repack_in_place: one pass over the copy at
 * memory speed, no second copy of it). */
static enum moe_status pack_copy(const struct moe_store *st, int prec, void *host, void *staging) {
    if (!st->pack[prec][0] && !st->pack[prec][1] && !st->pack[prec][2]) return MOE_OK;
    const struct moe_bundle_precision *d = moe_bundle_precision_at(st->bundle, (uint32_t)prec);
    for (uint32_t k = 0; k < 3 && k < d->n_parts; k++) {
        if (!st->pack[prec][k]) continue;
        const struct moe_bundle_part *q = &d->parts[k];
        enum moe_status rc = moe_repack_in_place((enum moe_qtype)q->type_id, (enum moe_qtype)st->pack[prec][k],
                                                 (int64_t)q->rows, (int64_t)q->cols, (char *)host + q->offset, staging,
                                                 st->staging_size);
        if (rc) return rc;
    }
    return MOE_OK;
}

/* An in-order pass over an uncompressed copy as it arrives in host memory:
 * the streaming XXH3 of the stored bytes, and the in-place interleave of the
 * parts st->pack names, a chunk of <= 64 KiB of rows at a time, each chunk
 * interleaved right after it is hashed, while it is in cache. The read feeds
 * it the bytes that have arrived (pass_feed), so checking and interleaving a
 * copy overlap its read and only the last chunk's work follows the read.
 * Before, the loader copied the blob to staging, hashed it and interleaved it
 * with per-field memcpy calls: three passes over memory after the read. */
struct pass {
    XXH3_state_t hs;
    uint64_t pos;   /* bytes [0, pos) hashed, and interleaved where due */
    uint32_t np, a; /* parts in file order ord[0..np); the next one ord[a] */
    uint32_t ord[4];
    int64_t r0;     /* rows of part ord[a] done */
    int pack;       /* a part to interleave */
    int seq;        /* the parts are a plain sequence (always, for a valid bundle); else the
                     * whole copy is hashed, then interleaved, at the end */
};

static void pass_begin(const struct moe_store *st, const struct moe_bundle_blob *b, int prec, struct pass *ps) {
    const struct moe_bundle_precision *d = b->desc;
    ps->pos = 0, ps->a = 0, ps->r0 = 0, ps->seq = 1;
    ps->pack = st->pack[prec][0] || st->pack[prec][1] || st->pack[prec][2];
    ps->np = d->n_parts < 4 ? d->n_parts : 4;
    for (uint32_t k = 0; k < ps->np; k++) ps->ord[k] = k;
    for (uint32_t a = 1; a < ps->np; a++) /* parts in file order */
        for (uint32_t k = a; k > 0 && d->parts[ps->ord[k]].offset < d->parts[ps->ord[k - 1]].offset; k--) {
            uint32_t t = ps->ord[k];
            ps->ord[k] = ps->ord[k - 1], ps->ord[k - 1] = t;
        }
    uint64_t end = 0;
    for (uint32_t a = 0; a < ps->np; a++) {
        const struct moe_bundle_part *q = &d->parts[ps->ord[a]];
        const size_t rb = moe_qtype_row_bytes((enum moe_qtype)q->type_id, (int64_t)q->cols);
        if (q->offset < end || q->offset + q->nbytes > b->stored_size ||
            (ps->ord[a] < 3 && st->pack[prec][ps->ord[a]] && (uint64_t)rb * q->rows != q->nbytes))
            ps->seq = 0;
        end = q->offset + q->nbytes;
    }
    XXH3_64bits_reset(&ps->hs);
}

/* pass_feed: bytes [0, avail) of the copy at host have arrived. */
static enum moe_status pass_feed(const struct moe_store *st, const struct moe_bundle_blob *b, int prec, char *host,
                                 void *staging, struct pass *ps, uint64_t avail) {
    if (!ps->seq) return MOE_OK;
    if (avail > b->stored_size) avail = b->stored_size;
    const struct moe_bundle_precision *d = b->desc;
    while (ps->pack && ps->a < ps->np) {
        const uint32_t k = ps->ord[ps->a];
        const struct moe_bundle_part *q = &d->parts[k];
        if (k >= 3 || !st->pack[prec][k]) { /* hashed with the bytes around it */
            ps->a++;
            continue;
        }
        if (ps->pos < q->offset) { /* the bytes before the part */
            const uint64_t e = avail < q->offset ? avail : q->offset;
            if (e > ps->pos) XXH3_64bits_update(&ps->hs, host + ps->pos, (size_t)(e - ps->pos));
            ps->pos = e > ps->pos ? e : ps->pos;
            if (ps->pos < q->offset) return MOE_OK;
        }
        const enum moe_qtype t = (enum moe_qtype)q->type_id;
        const size_t rb = moe_qtype_row_bytes(t, (int64_t)q->cols);
        int64_t chunk = rb ? (int64_t)(65536 / rb) / 16 * 16 : 16;
        if (chunk < 16) chunk = 16;
        while (ps->r0 < (int64_t)q->rows) {
            const int64_t n = (int64_t)q->rows - ps->r0 < chunk ? (int64_t)q->rows - ps->r0 : chunk;
            const uint64_t e = q->offset + (uint64_t)(ps->r0 + n) * rb;
            if (e > avail) return MOE_OK;
            char *p = host + q->offset + (size_t)ps->r0 * rb;
            XXH3_64bits_update(&ps->hs, p, (size_t)n * rb);
            enum moe_status rc = moe_repack_in_place(t, (enum moe_qtype)st->pack[prec][k], n, (int64_t)q->cols, p,
                                                     staging, st->staging_size);
            if (rc) return rc;
            ps->r0 += n, ps->pos = e;
        }
        ps->a++, ps->r0 = 0;
    }
    if (avail > ps->pos) XXH3_64bits_update(&ps->hs, host + ps->pos, (size_t)(avail - ps->pos));
    if (avail > ps->pos) ps->pos = avail;
    return MOE_OK;
}

/* pass_end: all stored bytes arrived (and were fed): the checksum's verdict. */
static enum moe_status pass_end(const struct moe_store *st, const struct moe_bundle_blob *b, int prec, char *host,
                                void *staging, struct pass *ps, struct rd *rd) {
    if (!ps->seq) { /* not a plain sequence of parts: hash, then interleave */
        enum moe_status rc = check_sum(st, b, host, rd);
        return rc ? rc : pack_copy(st, prec, host, staging);
    }
    if (ps->pos == b->stored_size && XXH3_64bits_digest(&ps->hs) == b->checksum) return MOE_OK;
    return mismatch(st, b, rd);
}

/* Reads are split into chunks of this many bytes (a multiple of 4096): with
 * direct I/O all of a copy's chunks are in flight at once (Linux AIO), and
 * each is checked and interleaved as soon as the bytes before it are in. */
#define CHUNK ((uint64_t)1 << 20)

/* read_aio: direct I/O with every chunk of the blob in flight at once
 * (Linux AIO on the loader's context), fed to the pass in order as they
 * complete. MOE_ERR_UNSUPPORTED (nothing read) if the kernel refuses. */
static enum moe_status read_aio(struct moe_store *st, int id, const struct moe_bundle_blob *b, int prec, char *host,
                                size_t cap, void *staging, struct pass *ps, struct rd *rd) {
    struct loader_io *io = &st->lio[id];
    const uint64_t want = round4k(b->stored_size) <= cap ? round4k(b->stored_size) : b->stored_size;
    const int n = (int)((want + CHUNK - 1) / CHUNK);
    if (n > io->max_chunks || io->ctx == 0) return MOE_ERR_UNSUPPORTED;
    for (int i = 0; i < n; i++) {
        const uint64_t from = (uint64_t)i * CHUNK, to = from + CHUNK < want ? from + CHUNK : want;
        memset(&io->cbs[i], 0, sizeof io->cbs[i]);
        io->cbs[i].aio_data = (uint64_t)i;
        io->cbs[i].aio_lio_opcode = IOCB_CMD_PREAD;
        io->cbs[i].aio_fildes = (uint32_t)st->fd;
        io->cbs[i].aio_buf = (uint64_t)(uintptr_t)(host + from);
        io->cbs[i].aio_nbytes = to - from;
        io->cbs[i].aio_offset = (int64_t)(b->offset + from);
        io->cbp[i] = &io->cbs[i];
        io->got[i] = -1;
        fault_at(st, rd, b, from, to - from, MOE_STORE_PATH_AIO, &io->fault[i]); /* applied as it completes */
    }
    int sent = 0;
    while (sent < n) {
        long r = syscall(SYS_io_submit, io->ctx, (long)(n - sent), io->cbp + sent);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        sent += (int)r;
    }
    if (sent == 0) return MOE_ERR_UNSUPPORTED;
    enum moe_status rc = MOE_OK;
    int next = 0, done = 0;
    while (done < sent) {
        struct io_event ev[64];
        long r = syscall(SYS_io_getevents, io->ctx, 1L, 64L, ev, NULL);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { /* cannot reap: destroying the context waits for the reads still in flight */
            MOE_LOGE("io_getevents: %s; reading a chunk at a time from now on", strerror(errno));
            syscall(SYS_io_destroy, io->ctx);
            io->ctx = 0;
            return MOE_ERR_IO;
        }
        for (long e = 0; e < r; e++) io->got[ev[e].data] = ev[e].res, done++;
        while (!rc && next < sent && io->got[next] != -1) { /* the chunks in order that are in */
            const uint64_t from = (uint64_t)next * CHUNK, to = from + CHUNK < want ? from + CHUNK : want;
            const struct moe_store_fault *f = &io->fault[next];
            int64_t res = f->err ? -(int64_t)f->err : io->got[next];
            if (res > 0 && f->bytes >= 0 && res > f->bytes) res = f->bytes;
            if (res > 0 && f->corrupt) host[from] ^= 0x5a;
            const uint64_t need = to < b->stored_size ? to : b->stored_size;
            if (res < 0) rc = read_error(st, b, rd, (int)-res, from);
            else if (from + (uint64_t)res < need) /* short: the rest a read at a time */
                rc = pread_all(st, b, host, cap, from + (uint64_t)res, need, rd);
            if (!rc) rc = pass_feed(st, b, prec, host, staging, ps, need);
            next++;
        }
    }
    if (!rc && sent < n) { /* the kernel took fewer: read the rest here */
        const uint64_t from = (uint64_t)sent * CHUNK;
        if (!(rc = pread_all(st, b, host, cap, from, b->stored_size, rd)))
            rc = pass_feed(st, b, prec, host, staging, ps, b->stored_size);
    }
    return rc;
}

/* read_checked: an uncompressed copy into host memory (cap bytes of room),
 * checked and interleaved as it arrives. */
static enum moe_status read_checked(struct moe_store *st, int id, const struct moe_bundle_blob *b, int prec, char *host,
                                    size_t cap, void *staging, struct rd *rd) {
    struct pass ps;
    pass_begin(st, b, prec, &ps);
    enum moe_status rc = MOE_ERR_UNSUPPORTED;
    if (st->io == MOE_IO_DIRECT && st->lio) rc = read_aio(st, id, b, prec, host, cap, staging, &ps, rd);
    if (rc == MOE_ERR_UNSUPPORTED) { /* a chunk at a time, each fed after its read */
        rc = MOE_OK;
        for (uint64_t from = 0; !rc && from < b->stored_size; from += CHUNK) {
            const uint64_t to = from + CHUNK < b->stored_size ? from + CHUNK : b->stored_size;
            if (st->io == MOE_IO_MMAP) rc = copy_mapped(st, b, host, from, to, rd);
            else rc = pread_all(st, b, host, cap, from, to, rd);
            if (!rc) rc = pass_feed(st, b, prec, host, staging, &ps, to);
        }
    }
    return rc ? rc : pass_end(st, b, prec, host, staging, &ps, rd);
}

/* load: read and check expert g at precision prec into slot s's buffer,
 * after checking that the bundle's file is still the one mapped (a miss is a
 * read: moe_bundle_check_file, two system calls, next to a read of the blob). */
static enum moe_status load(struct moe_store *st, int id, struct slot *s, int32_t g, int prec, void *staging,
                            struct rd *rd) {
    struct moe_bundle_blob b;
    enum moe_status rc = blob(st, g, prec, &b);
    if (rc) return rc;
    if ((rc = moe_bundle_check_file(st->bundle))) {
        rd->kind = RD_CHANGED, rd->offset = b.offset, rd->bytes = b.stored_size;
        return rc;
    }
    void *host = s->buf.host;
    if (!host && moe_backend_supports(st->be, MOE_BACKEND_FEAT_STAGE))
        return load_staged(st, s, &b, g, prec, staging, rd);
    const int direct_ok = host != NULL && b.compression == MOE_BUNDLE_COMP_NONE;
    if (direct_ok) return read_checked(st, id, &b, prec, host, s->cap, staging, rd);
    void *dst = staging;
    if ((rc = read_stored(st, &b, dst, st->staging_size, rd))) return rc;
    if (b.compression == MOE_BUNDLE_COMP_NONE) {
        if ((rc = check_sum(st, &b, dst, rd))) return rc;
        return moe_backend_buffer_write(st->be, &s->buf, 0, dst, (size_t)b.raw_size);
    }
    if (host) {
        if ((rc = moe_bundle_blob_decode(st->bundle, &b, staging, host, s->cap))) return rc;
        return pack_copy(st, prec, host, staging);
    }
    /* device-only slot: decode after the stored bytes in staging, then copy */
    char *raw = (char *)staging + round4k(b.stored_size);
    if ((rc = moe_bundle_blob_decode(st->bundle, &b, staging, raw, (size_t)b.raw_size))) return rc;
    return moe_backend_buffer_write(st->be, &s->buf, 0, raw, (size_t)b.raw_size);
}

/* enqueue: a read of slot i's current content (lock held); `prefetch`: a
 * prefetch's read. It is counted (stats.loads ...) only when a loader starts
 * it: a read cancelled before that never happened. */
static void enqueue(struct moe_store *st, int i, int prefetch) {
    struct slot *s = &st->slots[i];
    s->state = S_QUEUED;
    struct req **qq = prefetch ? &st->pq : &st->q;
    int *head = prefetch ? &st->pq_head : &st->q_head, *len = prefetch ? &st->pq_len : &st->q_len,
        *cap = prefetch ? &st->pq_cap : &st->q_cap;
    if (*len == *cap) { /* cannot happen: the queue holds one entry per slot and reassignment */
        int ncap = *cap * 2;
        struct req *q = malloc(sizeof *q * (size_t)ncap);
        if (!q) {
            s->state = S_FAILED;
            return;
        }
        for (int k = 0; k < *len; k++) q[k] = (*qq)[(*head + k) % *cap];
        free(*qq);
        *qq = q, *head = 0, *cap = ncap;
    }
    (*qq)[(*head + (*len)++) % *cap] = (struct req){i, s->gen, st->step_n == 1, prefetch != 0};
    const int depth = st->q_len + st->pq_len + st->n_reading;
    if (depth > st->stats.queue_depth_max) st->stats.queue_depth_max = depth;
    pthread_cond_broadcast(&st->cv);
}

/* next_req: the read a loader takes (lock held): the oldest demand read,
 * else the oldest prefetch while fewer than max(1, n_threads - 1) prefetch
 * reads run (a loader stays free for the next demand miss). 0: none. */
static int next_req(struct moe_store *st, struct req *r) {
    if (st->q_len > 0) {
        *r = st->q[st->q_head];
        st->q_head = (st->q_head + 1) % st->q_cap, st->q_len--;
        return 1;
    }
    const int max_pf = st->n_threads > 1 ? st->n_threads - 1 : 1;
    if (st->pq_len > 0 && st->n_pf_reading < max_pf) {
        *r = st->pq[st->pq_head];
        st->pq_head = (st->pq_head + 1) % st->pq_cap, st->pq_len--;
        return 1;
    }
    return 0;
}

/* count_read: a loader starts the read r of slot s (lock held). */
static void count_read(struct moe_store *st, const struct req *r, const struct slot *s) {
    struct moe_bundle_blob b;
    const int64_t bytes = blob(st, s->g, s->prec, &b) == MOE_OK ? (int64_t)b.stored_size : 0;
    st->stats.loads++;
    st->stats.load_bytes += bytes;
    if (r->decode) st->stats.loads_decode++, st->stats.load_bytes_decode += bytes;
    if (r->prefetch) st->stats.prefetch_loads++;
}

/* load_tries: load() of request r, made again while it fails in a way a
 * second read may not (the kernel's error, the end of the file, a checksum;
 * not a changed file), up to MOE_STORE_READ_TRIES reads in all, as long as
 * the slot still wants the copy and a demand waits for it: a prefetch read
 * no demand has claimed yet is tried once (dropped on failure). rd->prefetch
 * says whether the last try was still such a prefetch. */
static enum moe_status load_tries(struct moe_store *st, int id, struct slot *s, const struct req *r, int32_t g,
                                  int prec, struct rd *rd) {
    for (;;) {
        rd->kind = RD_OK;
        enum moe_status rc = load(st, id, s, g, prec, st->staging[id], rd);
        if (rc && rd->kind == RD_OK) rd->kind = RD_OTHER;
        rd->tries = rd->attempt + 1;
        const int transient = rd->kind == RD_ERRNO || rd->kind == RD_EOF || rd->kind == RD_CHECKSUM;
        if (!rc || rd->tries >= MOE_STORE_READ_TRIES || !transient) return rc;
        pthread_mutex_lock(&st->mu);
        const int waited = s->users > 0 || !r->prefetch; /* a demand use holds the slot, or a demand read */
        const int again = s->gen == r->gen && !st->stop && waited;
        st->stats.read_retries += again;
        if (again) rd->prefetch = 0;
        pthread_mutex_unlock(&st->mu);
        if (!again) return rc;
        rd->attempt++;
    }
}

struct loader_arg {
    struct moe_store *st;
    int id;
};

static void *loader_main(void *arg) {
    struct moe_store *st = ((struct loader_arg *)arg)->st;
    const int id = ((struct loader_arg *)arg)->id;
    free(arg);
    pthread_mutex_lock(&st->mu);
    for (;;) {
        struct req r;
        while (!st->stop && !next_req(st, &r)) pthread_cond_wait(&st->cv, &st->mu);
        if (st->stop) break;
        struct slot *s = &st->slots[r.slot];
        if (s->gen != r.gen || s->state != S_QUEUED) continue; /* cancelled or reassigned */
        while (s->reading && s->gen == r.gen) pthread_cond_wait(&st->cv, &st->mu); /* an older read still writes */
        if (s->gen != r.gen || s->state != S_QUEUED) continue;
        s->state = S_LOADING;
        s->reading = 1;
        count_read(st, &r, s);
        const int32_t g = s->g;
        const int prec = s->prec;
        st->n_reading++;
        st->n_pf_reading += r.prefetch;
        pthread_mutex_unlock(&st->mu);
        const double t0 = moe_now_s();
        struct rd rd = {.prefetch = r.prefetch};
        const enum moe_status rc = load_tries(st, id, s, &r, g, prec, &rd);
        after_read(st, g, prec, &rd, rc);
        const double dt = moe_now_s() - t0;
        pthread_mutex_lock(&st->mu);
        st->n_reading--;
        st->n_pf_reading -= r.prefetch;
        st->stats.read_s += dt;
        if (dt > st->stats.read_s_max) st->stats.read_s_max = dt;
        s->reading = 0;
        if (rc) st->stats.reads_failed++, st->stats.prefetch_failed += rd.prefetch;
        if (s->gen == r.gen) s->state = rc ? S_FAILED : S_READY;
        if (s->gen == r.gen && rc) s->fail = rd;
        pthread_cond_broadcast(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* ---- slots ---------------------------------------------------------- */

static void resident_add(struct moe_store *st, int64_t d) {
    st->resident += d;
    if (st->resident > st->stats.peak_resident_bytes) st->stats.peak_resident_bytes = st->resident;
}

/* assign: slot i now holds (g, prec); its old content is dropped (a queued
 * read of it is cancelled by the new generation). Lock held. */
static void assign(struct moe_store *st, int i, int32_t g, int prec) {
    struct slot *s = &st->slots[i];
    if (s->g >= 0) resident_add(st, -s->bytes);
    if (s->prefetch && s->state == S_QUEUED) st->stats.prefetch_cancelled++;
    if (s->state == S_QUEUED) st->stats.reads_cancelled++;
    s->g = g, s->prec = prec, s->gen++, s->state = S_EMPTY, s->prefetch = 0;
    struct moe_bundle_blob b;
    s->bytes = blob(st, g, prec, &b) == MOE_OK ? (int64_t)b.raw_size : 0;
    resident_add(st, s->bytes);
}

/* take_slot: the slot a kept copy of g goes to in cache `high`: the evicted
 * expert's when it has the size class of g's copy, else a free one of that
 * class (the evicted expert's slot then returns to its class's free list;
 * -1: none; the cache core never keeps more copies than there are slots, so
 * this only happens on a broken invariant). */
static int take_slot(struct moe_store *st, int high, int32_t g, int32_t evicted) {
    int32_t *map = high ? st->slot_hi : st->slot_lo;
    const int c = high ? st->home[g] : 0;
    if (evicted >= 0 && map[evicted] >= 0) {
        int i = map[evicted];
        map[evicted] = -1;
        if (!high || st->slots[i].cls == c) return i;
        struct slot *s = &st->slots[i];
        if (s->pend_g == evicted) s->pend_g = -1; /* evicted before it took the slot */
        if (s->users == 0 && s->pend_g < 0) { /* its copy is dropped now (a queued read of it cancelled) */
            if (s->g >= 0) resident_add(st, -s->bytes);
            if (s->prefetch && s->state == S_QUEUED) st->stats.prefetch_cancelled++;
            if (s->state == S_QUEUED) st->stats.reads_cancelled++;
            s->g = -1, s->bytes = 0, s->gen++, s->state = S_EMPTY, s->prefetch = 0;
        }
        st->free_c[s->cls][st->n_free_c[s->cls]++] = i;
    }
    if (high) return st->n_free_c[c] > 0 ? st->free_c[c][--st->n_free_c[c]] : -1;
    return st->n_free_lo > 0 ? st->free_lo[--st->n_free_lo] : -1;
}

/* place: expert g's copy enters cache `high` (it was kept by the policy,
 * evicting `evicted`): returns its slot with the read started, or -1 when
 * the slot is still used by the current step (the copy takes it when the
 * step releases it: a demand access then reads into scratch for this use)
 * or no slot could be found. Lock held. */
static int place(struct moe_store *st, int high, int32_t g, int prec, int32_t evicted, int prefetch, int layer) {
    int i = take_slot(st, high, g, evicted);
    if (i < 0) {
        if (!st->warned_evict) MOE_LOGW("expert store: no slot for a kept copy (policy and slots disagree)");
        st->warned_evict = 1;
        return -1;
    }
    struct slot *s = &st->slots[i];
    (high ? st->slot_hi : st->slot_lo)[g] = i;
    if (s->users > 0) {
        s->pend_g = g, s->pend_prec = prec, s->pend_prefetch = prefetch, s->pend_layer = layer;
        return -1;
    }
    assign(st, i, g, prec);
    enqueue(st, i, prefetch);
    if (prefetch) s->prefetch = 1, s->pf_layer = layer;
    return i;
}

/* ---- creation ------------------------------------------------------- */

/* cv_init: the store's condition variable, its timed waits (io_timeout) on
 * the monotonic clock: a change of the wall clock neither ends nor stretches
 * them. */
static void cv_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* setup_policy: the policy, its fitted parameters and the placement order
 * (the tuning counts MoE layers, as the store's cache does). */
static enum moe_status setup_policy(struct moe_store *st) {
    const struct moe_bundle *b = st->bundle;
    const struct moe_tuning *t = &st->tun;
    const int have_w = t->has_cache_weights;
    if (have_w) {
        memcpy(st->cc.w, t->cache_w, sizeof st->cc.w);
        st->cc.admit = t->cache_admit;
        if (t->has_cache_popularity) {
            st->cc.freq_high = t->cache_freq_high, st->cc.freq_low = t->cache_freq_low;
            st->cc.low_cost = t->cache_low_cost;
        }
    }
    st->policy = st->p.policy >= 0 ? (enum moe_cache_policy)st->p.policy : have_w ? MOE_CACHE_HOBBIT : MOE_CACHE_LRU;
    if (st->policy == MOE_CACHE_HOBBIT && !have_w)
        MOE_LOGW("%s: no fitted HOBBIT cache weights in the tuning (run moe-prep fit-cache); using the paper's "
                 "policy with equal weights", moe_bundle_path(b));
    if (st->policy == MOE_CACHE_BELADY) {
        MOE_LOGE("Belady's policy needs the future; it exists only in the simulator (moe-prep fit-cache)");
        return MOE_ERR_INVALID;
    }
    const int64_t *ord = t->has_placement_order ? t->placement_order : NULL;
    const size_t LE = (size_t)st->L * (size_t)st->E;
    if (ord) {
        if (!(st->order = malloc(sizeof *st->order * LE))) return MOE_ERR_NOMEM;
        for (size_t i = 0; i < LE; i++) st->order[i] = ord[i] >= 0 && (size_t)ord[i] < LE ? (int32_t)ord[i] : -1;
    }
    st->cc.order = st->order;
    if (st->policy == MOE_CACHE_STATIC && !st->order) {
        MOE_LOGE("%s: the twiddler policy needs the placement order of the tuning (run moe-prep profile)",
                 moe_bundle_path(b));
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* setup_precisions: each expert's high copy, the low copy, the thresholds. */
static enum moe_status setup_precisions(struct moe_store *st) {
    const struct moe_model *m = st->m;
    const struct moe_bundle *b = st->bundle;
    const size_t LE = (size_t)st->L * (size_t)st->E;
    uint32_t pi;
    if (!(st->home = malloc(sizeof *st->home * (LE + 1)))) return MOE_ERR_NOMEM;
    if (st->p.high && moe_bundle_find_precision(b, st->p.high, &pi)) {
        MOE_LOGE("%s: no stored precision \"%s\" for high copies", m->path, st->p.high);
        return MOE_ERR_NOT_FOUND;
    }
    for (size_t g = 0; g < LE; g++) {
        int l = st->layer_of[g / (size_t)st->E], e = (int)(g % (size_t)st->E);
        int h = st->p.high ? (int)pi : moe_model_get_expert_precision(m, l, e);
        st->home[g] = (int16_t)(h >= 0 ? h : 0);
    }
    if (st->p.low) {
        if (moe_bundle_find_precision(b, st->p.low, &pi)) {
            MOE_LOGE("%s: no stored precision \"%s\" for low copies", m->path, st->p.low);
            return MOE_ERR_NOT_FOUND;
        }
        st->low = (int)pi;
    } else {
        st->low = 0;
        for (int p = 1; p < m->n_expert_prec; p++)
            if (moe_bundle_precision_at(b, (uint32_t)p)->raw_size < moe_bundle_precision_at(b, (uint32_t)st->low)->raw_size)
                st->low = p;
    }
    if (!(st->lower = malloc(LE + 1))) return MOE_ERR_NOMEM;
    for (size_t g = 0; g < LE; g++) {
        struct moe_bundle_blob hb, lb;
        st->lower[g] = blob(st, (int32_t)g, st->home[g], &hb) == MOE_OK && blob(st, (int32_t)g, st->low, &lb) == MOE_OK &&
                       lb.raw_size < hb.raw_size;
    }
    /* thresholds: the caller's, else the tuning's; one given alone takes the
     * other from the tuning, else the default (T1 0.6, T2 0.9) */
    const int user = !isnan(st->p.t1) || !isnan(st->p.t2);
    const int tun = st->tun.has_thresholds;
    st->t1 = !isnan(st->p.t1) ? st->p.t1 : tun ? st->tun.t1 : user ? 0.6 : NAN;
    st->t2 = !isnan(st->p.t2) ? st->p.t2 : tun ? st->tun.t2 : user ? 0.9 : NAN;
    if (!isnan(st->t1) && !(st->t1 >= 0 && st->t1 <= st->t2 && st->t2 <= 1)) {
        if (user) { /* contradictory thresholds would turn dynamic precision off without a word */
            MOE_LOGE("HOBBIT thresholds T1 = %g (%s), T2 = %g (%s): need 0 <= T1 <= T2 <= 1", st->t1,
                     !isnan(st->p.t1) ? "given" : tun ? "the bundle's tuning" : "default", st->t2,
                     !isnan(st->p.t2) ? "given" : tun ? "the bundle's tuning" : "default");
            return MOE_ERR_INVALID;
        }
        MOE_LOGW("%s: the tuning's HOBBIT thresholds T1 = %g, T2 = %g are not 0 <= T1 <= T2 <= 1; ignored",
                 moe_bundle_path(b), st->t1, st->t2);
        st->t1 = st->t2 = NAN;
    }
    return MOE_OK;
}

/* max_copy: the largest raw and read size of expert copies at the high
 * (high != 0) or low precision. */
static void max_copy(const struct moe_store *st, int high, uint64_t *raw, size_t *read) {
    *raw = 0, *read = 0;
    for (int32_t g = 0; g < st->L * st->E; g++) {
        struct moe_bundle_blob b;
        if (blob(st, g, high ? st->home[g] : st->low, &b)) continue;
        if (b.raw_size > *raw) *raw = b.raw_size;
        size_t r = round4k(b.raw_size > b.stored_size ? b.raw_size : b.stored_size);
        if (r > *read) *read = r;
    }
}

/* all_high_bytes: raw bytes of every routed expert's high (home) copy,
 * what "--expert-mem 25%" is a share of. */
static int64_t all_high_bytes(const struct moe_store *st) {
    int64_t t = 0;
    for (int32_t g = 0; g < st->L * st->E; g++) {
        struct moe_bundle_blob b;
        if (!blob(st, g, st->home[g], &b)) t += (int64_t)b.raw_size;
    }
    return t;
}

/* high_cost: the bytes of the high slots for a cache of h copies: per size
 * class min(experts of the class, h) slots. */
static int64_t high_cost(const struct moe_store *st, int h) {
    int64_t t = 0;
    for (int c = 0; c < MOE_BUNDLE_MAX_PRECISIONS; c++)
        t += (int64_t)(st->cls_n[c] < h ? st->cls_n[c] : h) * (int64_t)st->cls_read[c];
    return t;
}

/* high_cap_for: the most high copies (<= all) whose slots fit in `bytes`. */
static int high_cap_for(const struct moe_store *st, double bytes, int all) {
    int lo = 0, hi = all; /* high_cost is non-decreasing in h */
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if ((double)high_cost(st, mid) <= bytes) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* dynamic_stops: fit-cache found that from this budget up, every byte as
 * high copies misses less than dynamic precision (tuning cache.dynamic_until,
 * a share of the bytes of every expert's high copy). */
static int dynamic_stops(const struct moe_store *st, int64_t mem, int all) {
    const double until = st->tun.dynamic_until;
    return !isnan(until) && (double)mem >= until * (double)high_cost(st, all);
}

/* budget_fits: the caches a byte budget `mem` gives (*H high and *Lc low
 * copies, *dyn: dynamic precision on), exactly as moe_store_new sizes them,
 * and whether they can serve one layer's top-k: k high copies, or with
 * dynamic precision at least one high copy and room for k low ones. */
static int budget_fits(const struct moe_store *st, int64_t mem, int k, int all, size_t hread, size_t lread,
                       int low_exists, int *H, int *Lc, int *dyn) {
    const struct moe_store_params *p = &st->p;
    *dyn = p->dynamic == 1 || (p->dynamic < 0 && low_exists && !isnan(st->t1) && high_cost(st, all) > mem &&
                               !dynamic_stops(st, mem, all));
    moe_store_capacities(mem, p->low_share, *dyn, (int64_t)hread, (int64_t)lread, all, H, Lc);
    *H = high_cap_for(st, (double)mem * (*dyn ? 1 - p->low_share : 1.0), all); /* by size class */
    const int64_t min_bytes = (int64_t)k * (int64_t)(*dyn ? lread : hread);
    return !(*H < (*dyn ? 1 : k) || high_cost(st, *H) + (int64_t)*Lc * (int64_t)lread < min_bytes);
}

/* warm: fill the high cache in Twiddler's placement order (least popular of
 * the chosen ones first, so LRU keeps the most popular longest). */
static void warm(struct moe_store *st) {
    if (!st->order || st->cc.high_cap <= 0) return;
    int n = 0;
    int32_t *pick = malloc(sizeof *pick * (size_t)st->cc.high_cap);
    if (!pick) return;
    for (int i = 0; i < st->L * st->E && n < st->cc.high_cap; i++)
        if (st->order[i] >= 0) pick[n++] = st->order[i];
    pthread_mutex_lock(&st->mu);
    for (int i = n - 1; i >= 0; i--) {
        struct moe_cache_result r;
        moe_cache_begin_step(st->cache, pick[i] / st->E, 1);
        moe_cache_access(st->cache, pick[i], MOE_CACHE_NEED_HIGH, MOE_CACHE_NEVER, MOE_CACHE_NEVER, &r);
        if (st->shadow) { /* the guard's shadow starts with the same copies */
            moe_cache_begin_step(st->shadow, pick[i] / st->E, 1);
            moe_cache_access(st->shadow, pick[i], MOE_CACHE_NEED_HIGH, MOE_CACHE_NEVER, MOE_CACHE_NEVER, &r);
        }
        if ((r.outcome == MOE_CACHE_MISS_HIGH) && r.kept) place(st, 1, pick[i], st->home[pick[i]], r.evicted, 0, -1);
    }
    pthread_mutex_unlock(&st->mu);
    free(pick);
}

/* staging_bytes: what each loader's staging buffer must hold. A compressed
 * blob is read there and decoded into its slot, and a slot without a host
 * view (device memory) is filled through it: then the stored and the raw
 * bytes of the largest copy (`copy` each, rounded). Otherwise reads land in
 * their slots and staging only holds one group of 16 rows for the in-place
 * interleave (moe_repack_in_place): the store's memory stays the budget + two
 * scratch copies + a little. */
static size_t staging_bytes(const struct moe_store *st, size_t copy) {
    int full = st->slots[0].buf.host == NULL;
    for (int32_t g = 0; g < st->L * st->E && !full; g++) {
        struct moe_bundle_blob b;
        full = (blob(st, g, st->home[g], &b) == MOE_OK && b.compression != MOE_BUNDLE_COMP_NONE) ||
               (st->low >= 0 && blob(st, g, st->low, &b) == MOE_OK && b.compression != MOE_BUNDLE_COMP_NONE);
    }
    if (full) return 2 * copy + 4096;
    size_t need = 4096;
    for (uint32_t pi = 0; pi < MOE_BUNDLE_MAX_PRECISIONS; pi++) {
        const struct moe_bundle_precision *d = moe_bundle_precision_at(st->bundle, pi);
        if (!d) break;
        for (uint32_t q = 0; q < 3 && q < d->n_parts; q++)
            if (st->pack[pi][q]) {
                const size_t grp = 16 * moe_qtype_row_bytes((enum moe_qtype)d->parts[q].type_id, (int64_t)d->parts[q].cols);
                if (grp > need) need = grp;
            }
    }
    return round4k(need);
}

enum moe_status moe_store_new(const struct moe_model *m, struct moe_backend *be, const struct moe_store_params *p,
                              int k, struct moe_store **out) {
    *out = NULL;
    if (!m->bundle) {
        MOE_LOGE("%s: an expert memory budget needs a bundle (moe-prep quantize); a checkpoint directory or GGUF file runs "
                 "with every expert mapped", m->path);
        return MOE_ERR_UNSUPPORTED;
    }
    struct moe_store *st = calloc(1, sizeof *st);
    if (!st) return MOE_ERR_NOMEM;
    st->m = m, st->c = &m->cfg, st->be = be, st->p = *p, st->bundle = m->bundle;
    st->E = m->cfg.n_expert, st->K = k;
    st->fd = -1;
    st->layer_of = malloc(sizeof(int) * (size_t)(m->cfg.n_layer + 1));
    st->moe_of = malloc(sizeof(int) * (size_t)(m->cfg.n_layer + 1));
    if (!st->layer_of || !st->moe_of) {
        free(st->layer_of);
        free(st->moe_of);
        free(st);
        return MOE_ERR_NOMEM;
    }
    for (int l = 0; l < m->cfg.n_layer; l++) {
        st->moe_of[l] = m->cfg.layer_moe[l] ? st->L : -1;
        if (m->cfg.layer_moe[l]) st->layer_of[st->L++] = l;
    }
    pthread_mutex_init(&st->mu, NULL);
    cv_init(&st->cv);
    st->cc = moe_cache_default_config();
    enum moe_status rc;
    if (p->repack && moe_backend_supports(be, MOE_BACKEND_FEAT_CPU_LAYOUTS)) /* layouts the CPU kernels read faster */
        for (uint32_t pi = 0; pi < MOE_BUNDLE_MAX_PRECISIONS; pi++) {
            const struct moe_bundle_precision *d = moe_bundle_precision_at(st->bundle, pi);
            if (!d) break;
            for (uint32_t q = 0; q < 3 && q < d->n_parts; q++) {
                const enum moe_qtype t = (enum moe_qtype)d->parts[q].type_id;
                const enum moe_qtype to = moe_repack_type(t, (int64_t)d->parts[q].rows, (int64_t)d->parts[q].cols);
                if (to != t) st->pack[pi][q] = (uint8_t)to;
            }
        }
    if ((rc = moe_tuning_read(moe_bundle_tuning(st->bundle), st->L > 0 ? st->L : 1, st->E, &st->tun)) ||
        (rc = setup_precisions(st)) || (rc = setup_policy(st)))
        goto fail;
    if (!isnan(p->route_margin) && !(p->route_margin >= 0 && p->route_margin <= 1)) {
        MOE_LOGE("cache-aware routing margin %g: want [0, 1] (0 = off)", p->route_margin);
        rc = MOE_ERR_INVALID;
        goto fail;
    }
    st->stats.route_margin = !isnan(p->route_margin) ? p->route_margin
                             : st->tun.has_route_margin ? st->tun.route_margin
                                                        : 0.0;
    if (p->prefetch_paths > 0 && st->L > p->path_order) {
        enum moe_status pr = moe_path_table_from_tuning(moe_bundle_tuning(st->bundle), p->path_order, st->L, st->E, k,
                                                        &st->paths);
        if (pr == MOE_ERR_NOMEM) {
            rc = pr;
            goto fail;
        }
        if (pr == MOE_ERR_NOT_FOUND)
            MOE_LOGI("%s: no order-%d path dictionary in the tuning (moe-prep profile writes one); path prefetch off",
                     moe_bundle_path(st->bundle), p->path_order);
        if (!(st->prev = calloc((size_t)st->L * (size_t)k + 1, sizeof *st->prev))) goto nomem;
    }
    const int all = st->L * st->E;
    uint64_t hraw, lraw;
    size_t hread, lread;
    max_copy(st, 1, &hraw, &hread);
    max_copy(st, 0, &lraw, &lread);
    for (int32_t g = 0; g < st->L * st->E; g++) { /* the high slots' size classes */
        struct moe_bundle_blob b;
        const int c = st->home[g];
        if (c < 0 || c >= MOE_BUNDLE_MAX_PRECISIONS || blob(st, g, c, &b)) continue;
        const size_t r = round4k(b.raw_size > b.stored_size ? b.raw_size : b.stored_size);
        st->cls_n[c]++;
        if (r > st->cls_read[c]) st->cls_read[c] = r;
    }
    const int low_exists = st->low >= 0 && lraw < hraw;
    int H = p->high_cap, Lc = p->low_cap;
    int64_t mem = p->expert_mem;
    if (mem <= 0 && p->expert_mem_share > 0) {
        mem = (int64_t)(p->expert_mem_share * (double)all_high_bytes(st));
        if (mem <= 0) mem = 1;
        MOE_LOGI("--expert-mem %.4g%%: %lld bytes", 100.0 * p->expert_mem_share, (long long)mem);
    }
    /* prefetch slots: out of the budget, if what is left still serves a layer */
    int P = p->prefetch_slots >= 0 ? p->prefetch_slots : (p->prefetch_layers > 0 || p->prefetch_paths > 0) ? 1 : 0;
    if (P > 64) P = 64;
    if (P > 0 && mem > 0) {
        int h2 = 0, l2 = 0, d2 = 0;
        while (P > 0 && !budget_fits(st, mem - (int64_t)P * (int64_t)hread, k, all, hread, lread, low_exists, &h2, &l2,
                                     &d2))
            P--;
        if (P < (p->prefetch_slots >= 0 ? p->prefetch_slots : 1))
            MOE_LOGW("expert memory: room for %d prefetch slot%s only (prefetched copies need their own slots)", P,
                     P == 1 ? "" : "s");
        mem -= (int64_t)P * (int64_t)hread;
    }
    st->n_pf = P;
    if (mem > 0) {
        if (!budget_fits(st, mem, k, all, hread, lread, low_exists, &H, &Lc, &st->dynamic)) {
            /* the true minimum: the smallest budget that fits (fits is monotone in mem) */
            int64_t lo = mem, hi = mem;
            int h2 = 0, l2 = 0, d2 = 0;
            while (!budget_fits(st, hi, k, all, hread, lread, low_exists, &h2, &l2, &d2) && hi < ((int64_t)1 << 61))
                lo = hi, hi *= 2;
            while (hi - lo > 1) {
                const int64_t mid = lo + (hi - lo) / 2;
                if (budget_fits(st, mid, k, all, hread, lread, low_exists, &h2, &l2, &d2)) hi = mid;
                else lo = mid;
            }
            budget_fits(st, hi, k, all, hread, lread, low_exists, &h2, &l2, &d2);
            if (d2)
                MOE_LOGE("expert memory too small: %lld bytes hold %d high and %d low copies; one layer's top-%d needs "
                         "at least %lld bytes (%.2f MiB: %d high copy of %zu bytes and %d low of %zu, dynamic "
                         "precision on)", (long long)mem, H, Lc, k, (long long)hi, (double)hi / 1048576.0, h2, hread,
                         l2, lread);
            else
                MOE_LOGE("expert memory too small: %lld bytes hold %d copies; one layer's top-%d needs at least %lld "
                         "bytes (%.2f MiB: %d copies of %zu bytes)", (long long)mem, H, k, (long long)hi,
                         (double)hi / 1048576.0, h2, hread);
            rc = MOE_ERR_INVALID;
            goto fail;
        }
    } else {
        st->dynamic = p->dynamic == 1 || (p->dynamic < 0 && low_exists && !isnan(st->t1) && H < all);
    }
    if (st->dynamic && isnan(st->t1)) {
        if (p->dynamic == 1) MOE_LOGW("no HOBBIT thresholds (run moe-prep profile or give T1/T2): T1 = 0.6, T2 = 0.9");
        st->t1 = 0.6, st->t2 = 0.9;
    }
    st->skip = p->skip && st->dynamic;
    if (mem > 0 && p->dynamic < 0 && !st->dynamic && dynamic_stops(st, mem, all)) {
        /* fit-cache's replay: at this budget every byte as high copies under LRU missed least;
         * the fitted HOBBIT weights were fitted for two caches */
        MOE_LOGI("expert memory: %.1f %% of the high copies' bytes, above the %.1f %% where fit-cache found "
                 "dynamic precision stops paying: high copies only%s", 100.0 * (double)mem / (double)high_cost(st, all),
                 100.0 * st->tun.dynamic_until, p->policy < 0 ? ", LRU" : "");
        if (p->policy < 0) st->policy = MOE_CACHE_LRU;
    }
    if (H > all) H = all;
    if (Lc > all) Lc = all;
    const int64_t min_bytes = (int64_t)k * (int64_t)(st->dynamic ? lread : hread);
    if (H < (st->dynamic ? 1 : k) || (int64_t)H * (int64_t)hread + (int64_t)Lc * (int64_t)lread < min_bytes) {
        MOE_LOGE("expert memory too small: %d high and %d low copies fit; one layer's top-%d needs at least %lld "
                 "bytes (%.1f MiB: %d x %s copies of %zu bytes)", H, Lc, k, (long long)min_bytes,
                 (double)min_bytes / 1048576.0, k, st->dynamic ? "low" : "high", st->dynamic ? lread : hread);
        rc = MOE_ERR_INVALID;
        goto fail;
    }
    st->cc.high_cap = H, st->cc.low_cap = Lc;
    st->cc.high_bytes = (double)hraw, st->cc.low_bytes = (double)lraw;
    if (!st->cc.freq_high) st->cc.low_cost = hraw > 0 ? (double)lraw / (double)hraw : 0.5;
    if ((rc = moe_cache_new(st->L, st->E, st->policy, &st->cc, &st->cache))) goto fail;
    st->stats.guard_switch_token = -1;
    if (p->guard && p->policy < 0 && st->policy == MOE_CACHE_HOBBIT &&
        (rc = moe_cache_new(st->L, st->E, MOE_CACHE_LRU, &st->cc, &st->shadow)))
        goto fail;
    st->shadow_policy = MOE_CACHE_LRU;
    /* slots: per size class min(its experts, H) high slots, then the low ones, then scratch */
    int nh = 0;
    for (int c = 0; c < MOE_BUNDLE_MAX_PRECISIONS; c++) {
        const int n = st->cls_n[c] < H ? st->cls_n[c] : H;
        nh += n;
        if (n > 0 && !(st->free_c[c] = malloc(sizeof(int32_t) * (size_t)n))) goto nomem;
    }
    st->n_slots = nh + Lc + MOE_STORE_SCRATCH + st->n_pf;
    st->low_read = lread;
    st->scratch0 = nh + Lc;
    const size_t LE = (size_t)st->L * (size_t)st->E;
    st->slots = calloc((size_t)st->n_slots, sizeof *st->slots);
    st->slot_hi = malloc(sizeof(int32_t) * LE), st->slot_lo = malloc(sizeof(int32_t) * LE);
    st->free_lo = malloc(sizeof(int32_t) * ((size_t)Lc + 1));
    st->q_cap = st->pq_cap = 4 * st->n_slots + 16;
    st->q = malloc(sizeof *st->q * (size_t)st->q_cap);
    st->pq = malloc(sizeof *st->pq * (size_t)st->pq_cap);
    st->pf_of = malloc(sizeof(int32_t) * LE);
    st->pf_slot = malloc(sizeof(int32_t) * ((size_t)st->n_pf + 1));
    if (!st->slots || !st->slot_hi || !st->slot_lo || !st->free_lo || !st->q || !st->pq || !st->pf_of || !st->pf_slot)
        goto nomem;
    for (size_t g = 0; g < LE; g++) st->slot_hi[g] = st->slot_lo[g] = st->pf_of[g] = -1;
    const size_t scratch = hread > lread ? hread : lread;
    for (int i = 0, c = 0, in_c = 0; i < st->n_slots; i++) {
        struct slot *s = &st->slots[i];
        s->kind = i < nh ? 1 : i < nh + Lc ? 0 : i < nh + Lc + MOE_STORE_SCRATCH ? 2 : 3;
        if (s->kind == 3) st->pf_slot[i - (nh + Lc + MOE_STORE_SCRATCH)] = i;
        if (s->kind == 1) {
            while (in_c >= (st->cls_n[c] < H ? st->cls_n[c] : H)) c++, in_c = 0;
            s->cls = c, in_c++;
        }
        s->cap = s->kind == 1 ? st->cls_read[s->cls] : s->kind == 0 ? lread : scratch; /* prefetch: as scratch */
        s->g = s->pend_g = -1;
        if ((rc = moe_backend_buffer_alloc(be, s->cap, &s->buf))) goto fail;
        st->stats.slot_bytes += (int64_t)s->cap;
        if (s->kind == 0) st->free_lo[st->n_free_lo++] = i;
    }
    for (int i = nh - 1; i >= 0; i--) /* taken in ascending order */
        st->free_c[st->slots[i].cls][st->n_free_c[st->slots[i].cls]++] = i;
    for (int a = 0, b = st->n_free_lo - 1; a < b; a++, b--) {
        int32_t t = st->free_lo[a];
        st->free_lo[a] = st->free_lo[b], st->free_lo[b] = t;
    }
    /* the step's plan */
    const int B = 4096;
    st->max_items = st->E > k ? st->E : k;
    st->items = calloc((size_t)st->max_items, sizeof *st->items);
    st->item_slot = calloc((size_t)st->max_items, sizeof *st->item_slot);
    st->item_gen = calloc((size_t)st->max_items, sizeof *st->item_gen);
    st->item_lazy = calloc((size_t)st->max_items, sizeof *st->item_lazy);
    st->item_hit = calloc((size_t)st->max_items, sizeof *st->item_hit);
    st->rows = malloc(sizeof(int32_t) * (size_t)B * (size_t)k);
    st->pslots = malloc(sizeof(int32_t) * (size_t)B * (size_t)k);
    st->weights = malloc(sizeof(float) * (size_t)B * (size_t)k);
    st->need = malloc((size_t)B * (size_t)k);
    if (!st->items || !st->item_slot || !st->item_gen || !st->item_lazy || !st->item_hit || !st->rows || !st->pslots || !st->weights ||
        !st->need)
        goto nomem;
    /* I/O */
    st->io = p->io;
    if ((rc = moe_bundle_check_file(st->bundle))) goto fail; /* changed since the model was loaded: say so by name */
    if (st->io == MOE_IO_MMAP) { /* a file's mapping (not a bundle in memory, whose pages must stay)? */
        int fd = -1;
        if (moe_bundle_open_fd(st->bundle, &fd) == MOE_OK) {
            close(fd);
            st->drop_pages = 1;
        }
    } else {
        /* the very file that was mapped, opened without blocking (a FIFO or
         * another file put at the path since is refused) */
        const char *path = moe_bundle_path(st->bundle);
        rc = moe_bundle_open_fd(st->bundle, &st->fd);
        if (rc == MOE_ERR_UNSUPPORTED) { /* a bundle in memory: copy from it */
            st->io = MOE_IO_MMAP;
        } else if (rc) {
            MOE_LOGE("%s: cannot open for reading experts", path);
            goto fail;
        } else if (st->io == MOE_IO_DIRECT) {
            int fl = fcntl(st->fd, F_GETFL);
            if (fl < 0 || fcntl(st->fd, F_SETFL, fl | O_DIRECT) != 0) {
                MOE_LOGW("%s: direct I/O refused (%s); reading through the page cache", path, strerror(errno));
                st->io = MOE_IO_BUFFERED;
            }
        }
        if (st->io == MOE_IO_DIRECT) { /* probe: some file systems accept O_DIRECT at open, not at read */
            struct moe_bundle_blob b0;
            for (int32_t g = 0; g < st->L * st->E; g++)
                if (blob(st, g, st->home[g], &b0) == MOE_OK) {
                    char *probe_buf = st->slots[0].buf.host;
                    void *own = NULL; /* device-only slots (a GPU): probe into an aligned page of our own */
                    if (!probe_buf && posix_memalign(&own, 4096, 4096) == 0) probe_buf = own;
                    const int refused = probe_buf && pread(st->fd, probe_buf, 4096, (off_t)b0.offset) < 0 && errno == EINVAL;
                    free(own);
                    if (refused) {
                        MOE_LOGW("%s: direct reads refused (EINVAL); reading through the page cache", path);
                        int fl = fcntl(st->fd, F_GETFL);
                        st->io = MOE_IO_BUFFERED;
                        if (fl < 0 || fcntl(st->fd, F_SETFL, fl & ~O_DIRECT) != 0) {
                            MOE_LOGE("%s: cannot leave direct I/O: %s", path, strerror(errno));
                            rc = MOE_ERR_IO;
                            goto fail;
                        }
                    }
                    break;
                }
        }
    }
    st->staging_size = staging_bytes(st, scratch);
    if (st->io == MOE_IO_DIRECT) { /* each loader's AIO context: every chunk of a copy in flight */
        if (!(st->lio = calloc((size_t)(p->n_loaders > 0 ? p->n_loaders : 1), sizeof *st->lio))) goto nomem;
        for (int i = 0; i < (p->n_loaders > 0 ? p->n_loaders : 1); i++) {
            struct loader_io *io = &st->lio[i];
            io->max_chunks = (int)((scratch + CHUNK - 1) / CHUNK) + 1;
            io->cbs = calloc((size_t)io->max_chunks, sizeof *io->cbs);
            io->cbp = calloc((size_t)io->max_chunks, sizeof *io->cbp);
            io->got = calloc((size_t)io->max_chunks, sizeof *io->got);
            io->fault = calloc((size_t)io->max_chunks, sizeof *io->fault);
            if (!io->cbs || !io->cbp || !io->got || !io->fault) goto nomem;
#ifdef MOE_STORE_NO_AIO /* a build to measure the AIO path against: a chunk at a time */
            errno = ENOSYS;
            if (1) {
#else
            if (syscall(SYS_io_setup, (long)io->max_chunks, &io->ctx) != 0) {
#endif
                io->ctx = 0; /* no AIO here: a chunk at a time */
                if (i == 0) MOE_LOGI("Linux AIO unavailable (%s): expert reads a chunk at a time", strerror(errno));
            }
        }
    }
    st->n_threads = p->n_loaders > 0 ? p->n_loaders : 1;
    st->threads = calloc((size_t)st->n_threads, sizeof *st->threads);
    st->staging = calloc((size_t)st->n_threads, sizeof *st->staging);
    if (!st->threads || !st->staging) goto nomem;
    for (int i = 0; i < st->n_threads; i++)
        if (posix_memalign(&st->staging[i], 4096, st->staging_size)) goto nomem;
    for (int i = 0; i < st->n_threads; i++) {
        struct loader_arg *a = malloc(sizeof *a);
        if (!a) goto nomem;
        a->st = st, a->id = i;
        if (pthread_create(&st->threads[i], NULL, loader_main, a)) {
            free(a);
            MOE_LOGE("cannot start the expert loader threads");
            rc = MOE_ERR_IO;
            goto fail;
        }
        st->started++;
    }
    st->stats.high_cap = H, st->stats.low_cap = Lc;
    st->stats.high_copy_bytes = (int64_t)hraw, st->stats.low_copy_bytes = (int64_t)lraw;
    st->stats.policy = st->policy, st->stats.dynamic = st->dynamic;
    st->stats.t1 = st->dynamic ? st->t1 : 1, st->stats.t2 = st->dynamic ? st->t2 : 1;
    st->stats.io = st->io;
    if (p->warm) warm(st);
    *out = st;
    return MOE_OK;
nomem:
    MOE_LOGE("out of memory setting up the expert store");
    rc = MOE_ERR_NOMEM;
fail:
    moe_store_free(st);
    return rc;
}

/* bookkeeping: the store's tables beyond slots and staging (per expert,
 * per slot, the read queue, the step's plan of up to 4096 x k rows). */
static int64_t bookkeeping(int n_experts, int n_slots, int k) {
    const int64_t slots = (int64_t)n_slots + MOE_STORE_SCRATCH;
    return (int64_t)n_experts * 17 + slots * (int64_t)sizeof(struct slot) + (4 * slots + 16) * (int64_t)sizeof(struct req) +
           (int64_t)4096 * k * 13;
}

void moe_store_free(struct moe_store *st) {
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    st->stop = 1;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    int stuck = 0;
    const struct timespec dl = deadline(CLOCK_REALTIME, st->p.io_timeout);
    for (int i = 0; i < st->started; i++) {
        if (st->p.io_timeout <= 0 || pthread_timedjoin_np(st->threads[i], NULL, &dl) == 0) {
            if (st->p.io_timeout <= 0) pthread_join(st->threads[i], NULL);
            continue;
        }
        pthread_detach(st->threads[i]);
        stuck++;
    }
    if (stuck) { /* its read may still write a slot and read the store: leave both to it */
        MOE_LOGW("expert store: %d loader thread%s still waiting for the storage after %g s (--io-timeout); left "
                 "behind with the store's memory", stuck, stuck > 1 ? "s are" : " is", st->p.io_timeout);
        return;
    }
    for (int i = 0; st->slots && i < st->n_slots; i++)
        if (st->slots[i].buf.data) moe_backend_buffer_free(st->be, &st->slots[i].buf);
    for (int i = 0; st->staging && i < st->n_threads; i++) free(st->staging[i]);
    for (int i = 0; st->lio && i < (st->p.n_loaders > 0 ? st->p.n_loaders : 1); i++) {
        if (st->lio[i].ctx) syscall(SYS_io_destroy, st->lio[i].ctx);
        free(st->lio[i].cbs);
        free(st->lio[i].cbp);
        free(st->lio[i].got);
        free(st->lio[i].fault);
    }
    free(st->lio);
    if (st->fd >= 0) close(st->fd);
    moe_cache_free(st->cache);
    moe_cache_free(st->shadow);
    moe_path_table_free(st->paths);
    free(st->prev);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    free(st->staging);
    free(st->threads);
    free(st->slots);
    free(st->slot_hi);
    free(st->slot_lo);
    for (int c = 0; c < MOE_BUNDLE_MAX_PRECISIONS; c++) free(st->free_c[c]);
    free(st->free_lo);
    free(st->q);
    free(st->pq);
    free(st->pf_of);
    free(st->pf_slot);
    free(st->items);
    free(st->item_slot);
    free(st->item_gen);
    free(st->item_lazy);
    free(st->item_hit);
    free(st->rows);
    free(st->pslots);
    free(st->weights);
    free(st->need);
    free(st->order);
    free(st->home);
    free(st->lower);
    free(st->layer_of);
    free(st->moe_of);
    free(st);
}

int64_t moe_store_overhead_bytes(const struct moe_store *st) {
    if (st->in_place) return 0;
    int64_t scratch = 0;
    for (int i = st->scratch0; i < st->scratch0 + MOE_STORE_SCRATCH; i++) scratch += (int64_t)st->slots[i].cap;
    return scratch + (int64_t)st->n_threads * (int64_t)st->staging_size + bookkeeping(st->L * st->E, st->n_slots - 2, st->K);
}

int64_t moe_store_overhead_estimate(int64_t copy_bytes, int n_loaders, int n_experts, int n_slots, int k) {
    /* uncompressed blobs into host slots: staging holds a group of 16 rows of one part, never more than
     * the copy itself (rounded to 4096) nor MOE_STORE_GROUP_MAX */
    int64_t group = (copy_bytes + 4095) / 4096 * 4096;
    if (group > MOE_STORE_GROUP_MAX) group = MOE_STORE_GROUP_MAX;
    if (group < 4096) group = 4096;
    return 2 * copy_bytes + (int64_t)n_loaders * group + bookkeeping(n_experts, n_slots, k);
}

void moe_store_capacities(int64_t mem, double low_share, int dynamic, int64_t high_bytes, int64_t low_bytes,
                          int n_experts, int *high, int *low) {
    const double hs = dynamic ? (1 - low_share) : 1.0;
    int64_t h = (int64_t)((double)mem * hs / (double)high_bytes);
    int64_t l = dynamic ? (int64_t)((double)mem * low_share / (double)low_bytes) : 0;
    *high = (int)(h > n_experts ? n_experts : h);
    *low = (int)(l > n_experts ? n_experts : l);
}

void moe_store_params_from_plan(struct moe_store_params *p, const struct moe_tuning_plan *plan) {
    enum moe_cache_policy pol;
    p->expert_mem = plan->expert_mem, p->expert_mem_share = 0, p->high_cap = p->low_cap = 0;
    p->high = plan->high[0] ? plan->high : NULL;
    p->low = plan->low[0] ? plan->low : NULL;
    p->dynamic = plan->dynamic;
    p->low_share = plan->low_share;
    p->t1 = plan->t1, p->t2 = plan->t2;
    if (moe_cache_policy_parse(plan->policy, &pol) == MOE_OK) p->policy = (int)pol;
    p->prefetch_paths = plan->prefetch_paths;
}

/* ---- steps ---------------------------------------------------------- */

void moe_store_begin_sequence(struct moe_store *st) {
    if (!st->in_place) moe_cache_begin_sequence(st->cache);
    if (st->shadow) moe_cache_begin_sequence(st->shadow);
}

int moe_store_in_place(const struct moe_store *st) { return st && st->in_place; }

enum moe_status moe_store_new_in_place(const struct moe_model *m, struct moe_backend *be, int k, int n_batch,
                                       struct moe_store **out) {
    *out = NULL;
    struct moe_store *st = calloc(1, sizeof *st);
    if (!st) return MOE_ERR_NOMEM;
    st->m = m, st->c = &m->cfg, st->be = be, st->p = moe_store_default_params(), st->bundle = m->bundle;
    st->E = m->cfg.n_expert, st->K = k, st->fd = -1, st->in_place = 1, st->max_n = n_batch;
    st->policy = MOE_CACHE_LRU, st->stats.policy = MOE_CACHE_LRU, st->low = -1;
    pthread_mutex_init(&st->mu, NULL); /* moe_store_free destroys them */
    cv_init(&st->cv);
    st->max_items = st->E > k ? st->E : k;
    const size_t rows = (size_t)n_batch * (size_t)k;
    st->layer_of = malloc(sizeof(int) * (size_t)(m->cfg.n_layer + 1));
    st->moe_of = malloc(sizeof(int) * (size_t)(m->cfg.n_layer + 1));
    st->items = calloc((size_t)st->max_items, sizeof *st->items);
    st->rows = malloc(sizeof(int32_t) * rows);
    st->pslots = malloc(sizeof(int32_t) * rows);
    st->weights = malloc(sizeof(float) * rows);
    if (n_batch < 1 || k < 1 || !st->layer_of || !st->moe_of || !st->items || !st->rows || !st->pslots ||
        !st->weights) {
        moe_store_free(st);
        return n_batch < 1 || k < 1 ? MOE_ERR_INVALID : MOE_ERR_NOMEM;
    }
    for (int l = 0; l < m->cfg.n_layer; l++) {
        st->moe_of[l] = m->cfg.layer_moe[l] ? st->L : -1;
        if (m->cfg.layer_moe[l]) st->layer_of[st->L++] = l;
    }
    *out = st;
    return MOE_OK;
}

/* token_needs: HOBBIT's need of each of a token's k experts (rank order):
 * s_0 = 0, s_i = g_0 + ... + g_{i-1} over normalised weights, computed as
 * moe_hobbit_scores and the simulator do. */
static void token_needs(const struct moe_store *st, const float *w, int k, uint8_t *out) {
    double sum = 0, acc = 0;
    for (int j = 0; j < k; j++) sum += w[j];
    for (int j = 0; j < k; j++) {
        float s = sum > 0 ? (float)(acc / sum) : 0.0f;
        acc += w[j];
        uint8_t need = j == 0 || !st->dynamic || s <= st->t1 ? MOE_CACHE_NEED_HIGH
                       : s <= st->t2                         ? MOE_CACHE_NEED_LOW
                                                             : MOE_CACHE_NEED_SKIP;
        if (need == MOE_CACHE_NEED_SKIP && !st->skip) need = MOE_CACHE_NEED_LOW;
        out[j] = need;
    }
}

/* scratch_slot: the scratch slot for item i (alternating; a slot still used
 * by an earlier item of the step is never taken: items run in order). */
static int scratch_slot(struct moe_store *st) {
    int i = st->scratch0 + st->scratch_turn;
    st->scratch_turn = (st->scratch_turn + 1) % MOE_STORE_SCRATCH;
    return i;
}

/* ---- prefetch slots ---------------------------------------------------- */

/* pf_clear: prefetch slot i forgets its copy (a queued read of it is
 * cancelled by the new generation; one in progress finishes into nothing).
 * `dropped`: the copy was a prefetch no demand access used. Lock held. */
static void pf_clear(struct moe_store *st, int i, int dropped) {
    struct slot *s = &st->slots[i];
    if (s->g >= 0 && st->pf_of[s->g] == i) st->pf_of[s->g] = -1;
    if (s->g >= 0) resident_add(st, -s->bytes);
    if (s->state == S_QUEUED) st->stats.reads_cancelled++, st->stats.prefetch_cancelled++;
    if (dropped && s->prefetch && s->state != S_QUEUED) st->stats.prefetch_dropped++; /* read, never used */
    s->g = -1, s->bytes = 0, s->gen++, s->state = S_EMPTY, s->prefetch = 0;
}

/* pf_take: a prefetch slot for a copy of `bytes` read bytes: a free one
 * first, else the oldest prediction (round robin), never one the current
 * step uses or a copy predicted for the current layer. -1: none. Lock held. */
static int pf_take(struct moe_store *st, size_t bytes) {
    int best = -1;
    for (int t = 0; t < st->n_pf; t++) {
        const int i = st->pf_slot[(st->pf_turn + t) % st->n_pf];
        const struct slot *s = &st->slots[i];
        if (s->users > 0 || s->cap < bytes || s->reading) continue;
        if (s->g < 0) return i;
        if (best < 0 && !(s->prefetch && s->pf_layer == st->step_layer && s->state != S_READY)) best = i;
    }
    if (best >= 0) st->pf_turn = (st->pf_turn + 1) % (st->n_pf > 0 ? st->n_pf : 1);
    return best;
}

/* pf_start: read expert g's copy at precision prec into a prefetch slot for
 * MoE layer `layer` (lock held). 1: a read was started. */
static int pf_start(struct moe_store *st, int32_t g, int prec, int layer) {
    if (st->n_pf <= 0 || st->pf_of[g] >= 0) return 0;
    struct moe_bundle_blob b;
    if (blob(st, g, prec, &b)) return 0;
    const size_t need = round4k(b.raw_size > b.stored_size ? b.raw_size : b.stored_size);
    const int i = pf_take(st, need);
    if (i < 0) return 0;
    pf_clear(st, i, 1);
    assign(st, i, g, prec);
    st->pf_of[g] = i;
    st->slots[i].prefetch = 1, st->slots[i].pf_layer = layer;
    enqueue(st, i, 1);
    return 1;
}

/* pf_claim: a demand access takes prefetch slot j's copy: a prefetch that
 * was read (or is being read) is used; one still queued becomes a demand
 * read, ahead of every prefetch (not counted as a prefetch at all). */
static void pf_claim(struct moe_store *st, int j) {
    struct slot *sj = &st->slots[j];
    if (sj->state == S_QUEUED) enqueue(st, j, 0);
    else if (sj->prefetch) st->stats.prefetch_used++;
    sj->prefetch = 0;
}

/* pf_role_swap: the prefetch slot j (holding g) becomes the cache slot of
 * g in cache `high` (class cls), and slot i, which the policy freed for g,
 * takes j's place among the prefetch slots (its old copy stays readable by
 * the current step's users, then is forgotten). Lock held. */
static void pf_role_swap(struct moe_store *st, int j, int i, int high, int32_t g) {
    struct slot *sj = &st->slots[j], *si = &st->slots[i];
    for (int t = 0; t < st->n_pf; t++)
        if (st->pf_slot[t] == j) st->pf_slot[t] = i;
    sj->kind = high ? 1 : 0, sj->cls = high ? st->home[g] : 0;
    st->pf_of[g] = -1;
    (high ? st->slot_hi : st->slot_lo)[g] = j;
    pf_claim(st, j);
    si->kind = 3, si->pend_g = -1;
    if (si->users == 0) pf_clear(st, i, 0);
    else si->prefetch = 0; /* dropped at release */
}

/* pf_serve: a demand miss of g at precision prec (kept by the policy or not,
 * evicting `evicted`) finds its copy in a prefetch slot: bind it without a
 * read. Returns the slot the item uses, or -1 (no prefetched copy). */
static int pf_serve(struct moe_store *st, int32_t g, int prec, int high, int kept, int32_t evicted) {
    const int j = st->pf_of[g];
    if (j < 0) return -1;
    struct slot *sj = &st->slots[j];
    if (sj->g != g) return -1;
    if (sj->state == S_FAILED) { /* its read failed: forgotten, and read as any miss */
        if (sj->users == 0 && !sj->reading) pf_clear(st, j, 0);
        return -1;
    }
    if (sj->prec != prec) { /* a high copy serves a low use not kept; any other mismatch reads */
        if (kept || high || sj->prec != st->home[g]) return -1;
    }
    if (!kept) {
        pf_claim(st, j);
        return j;
    }
    if (sj->cap < (high ? st->cls_read[st->home[g]] : st->low_read)) return -1; /* too small for the cache's
                                                                                  * other copies: read */
    const int i = take_slot(st, high, g, evicted);
    if (i < 0) return -1;
    pf_role_swap(st, j, i, high, g);
    return j;
}

/* access_item: ask the cache about item i's expert and bind a slot. Lock held. */
/* miss_cost: an outcome's miss penalty in high-copy reads. */
static double miss_cost(const struct moe_store *st, enum moe_cache_outcome o) {
    return o == MOE_CACHE_MISS_HIGH ? 1.0 : o == MOE_CACHE_MISS_LOW ? st->cc.low_cost : 0.0;
}

/* guard_access: the policy guard's shadow sees the access too (prompt
 * batches keep it in step; decode accesses are counted, their penalties
 * summed for the stats and, decayed over about 64 tokens, for decisions). */
static void guard_access(struct moe_store *st, int32_t g, uint8_t need, int decode, enum moe_cache_outcome real) {
    struct moe_cache_result r;
    moe_cache_access(st->shadow, g, (enum moe_cache_need)need, MOE_CACHE_NEVER, MOE_CACHE_NEVER, &r);
    if (!decode) return;
    const double pr = miss_cost(st, real), ps = miss_cost(st, r.outcome);
    const double keep = 1.0 - 1.0 / (64.0 * (double)st->L * (double)st->K);
    st->guard_acc++;
    st->guard_r = st->guard_r * keep + pr, st->guard_s = st->guard_s * keep + ps;
    st->stats.guard_penalty += pr;
    st->stats.guard_shadow_penalty += ps;
}

/* guard_check: after a decode step, once the shadow's decayed miss penalty
 * is at least 10 % below the policy's over 16 tokens' accesses or more, and
 * the difference is beyond chance (moe_cache_guard_switch), the cache runs LRU
 * from now on (its copies rekeyed in place) and the shadow is dropped. The
 * second test keeps a handful of misses from deciding: switching at token 16
 * on 21.7 against 19.4 cost 40 % at 50 % of the Mixtral model's experts
 * (sampled wordnet: 163-171 against 274-285 tok/s without the guard). One
 * way: switching back whenever a HOBBIT shadow (running from the state LRU
 * left) looked better for a while measured slower (wordnet at 50 % of the
 * fine-grained model's experts: 154-178 against 187-202 tok/s). */
static void guard_check(struct moe_store *st, int k) {
    if (!st->shadow || st->guard_acc < (int64_t)16 * st->L * k) return;
    if (!moe_cache_guard_switch(st->guard_r, st->guard_s)) return;
    if (moe_cache_set_policy(st->cache, st->shadow_policy) != MOE_OK) return;
    MOE_LOGI("expert cache: %s would have missed less than %s over the last decode tokens (penalty %.1f against "
             "%.1f): %s from now on", moe_cache_policy_name(st->shadow_policy), moe_cache_policy_name(st->policy),
             st->guard_s, st->guard_r, moe_cache_policy_name(st->shadow_policy));
    st->policy = st->shadow_policy, st->stats.policy = st->shadow_policy;
    st->stats.guard_switch_token = st->stats.decode_tokens;
    st->stats.guard_switches++;
    moe_cache_free(st->shadow);
    st->shadow = NULL;
}

static void access_item(struct moe_store *st, int i, int32_t g, uint8_t need, int decode) {
    struct moe_store_item *it = &st->items[i];
    struct moe_cache_result r;
    if (need == MOE_CACHE_NEED_LOW && !st->lower[g]) need = MOE_CACHE_NEED_HIGH; /* its home copy is the lowest */
    moe_cache_access(st->cache, g, (enum moe_cache_need)need, MOE_CACHE_NEVER, MOE_CACHE_NEVER, &r);
    st->stats.accesses++;
    if (st->shadow) guard_access(st, g, need, decode, r.outcome);
    st->item_slot[i] = -1;
    st->item_lazy[i] = 0;
    st->item_hit[i] = r.outcome == MOE_CACHE_HIT_HIGH || r.outcome == MOE_CACHE_HIT_LOW;
    int slot = -1;
    switch (r.outcome) {
    case MOE_CACHE_HIT_HIGH:
    case MOE_CACHE_HIT_LOW: {
        const int high = r.outcome == MOE_CACHE_HIT_HIGH;
        high ? st->stats.hits_high++ : st->stats.hits_low++;
        slot = (high ? st->slot_hi : st->slot_lo)[g];
        if (slot < 0) break;
        struct slot *s = &st->slots[slot];
        if (s->prefetch) st->stats.prefetch_used++, s->prefetch = 0;
        if (s->state == S_EMPTY || (s->state == S_FAILED && !s->reading)) /* a cancelled prefetch, placed while
                                                                            * busy, or a read that failed: read */
            enqueue(st, slot, 0);
        break;
    }
    case MOE_CACHE_MISS_HIGH:
    case MOE_CACHE_MISS_LOW: {
        const int high = r.outcome == MOE_CACHE_MISS_HIGH;
        high ? st->stats.misses_high++ : st->stats.misses_low++;
        const int prec = high ? st->home[g] : st->low;
        if (st->n_pf > 0) slot = pf_serve(st, g, prec, high, r.kept, r.evicted); /* prefetched: no read */
        if (slot >= 0) {
            it->precision = st->slots[slot].prec;
            break;
        }
        if (r.kept) slot = place(st, high, g, prec, r.evicted, 0, -1);
        if (slot < 0) { /* not kept, or its slot still busy: read into scratch when reached */
            st->item_lazy[i] = 1;
            st->stats.scratch_loads++;
        }
        it->precision = prec;
        break;
    }
    case MOE_CACHE_SKIP:
        st->stats.skips++;
        it->skipped = 1;
        break;
    }
    (void)decode;
    if (slot >= 0) {
        struct slot *s = &st->slots[slot];
        s->users++;
        st->item_slot[i] = slot;
        st->item_gen[i] = s->gen;
        it->precision = s->prec;
    }
    it->handle = st->item_slot[i];
}

/* path_prefetch: EdgeMoE: with the current token's experts of MoE layer ml
 * (and of the layers before, for order 2) known, load the most probable
 * experts of layer ml + 1, protected until that step. Lock held. */
static void path_prefetch(struct moe_store *st, int ml, const int32_t *sel) {
    const int K = st->K, order = st->p.path_order, next = ml + 1;
    memcpy(st->prev + (size_t)ml * K, sel, sizeof(int32_t) * (size_t)K);
    if (next >= st->L || next < order) return;
    int32_t out[64];
    const int m = st->p.prefetch_paths < 64 ? st->p.prefetch_paths : 64;
    const int n = moe_path_table_lookup(st->paths, next, st->prev + (size_t)(next - order) * K, m, out);
    for (int j = 0, started = 0; j < n && started < st->n_pf; j++) {
        const int32_t g = next * st->E + out[j];
        if (moe_cache_contains(st->cache, g, 1)) continue;
        started += pf_start(st, g, st->home[g], next);
    }
}

/* place_items: ask the backend where each computed item of the step runs
 * (Twiddler). An item on the host needs no slot for this use: a scratch read
 * it would have made is dropped; a copy the policy kept still loads, for
 * later steps. The policy's counts are not touched. */
static void place_items(struct moe_store *st, int layer, int ni) {
    int32_t tok[ni + 1], prec[ni + 1], idx[ni + 1];
    uint8_t res[ni + 1], host[ni + 1];
    int n = 0;
    for (int i = 0; i < ni; i++) {
        if (st->items[i].skipped) continue;
        idx[n] = i, tok[n] = st->items[i].n, prec[n] = st->items[i].precision, res[n] = st->item_hit[i], host[n] = 0;
        n++;
    }
    if (n == 0) return;
    moe_backend_place(st->be, st->layer_of[layer], n, tok, prec, res, host);
    pthread_mutex_lock(&st->mu);
    for (int j = 0; j < n; j++) {
        const int i = idx[j];
        if (!host[j] || res[j]) continue; /* resident copies always run where they are */
        st->items[i].host = 1;
        st->stats.host_runs++;
        if (st->item_lazy[i]) st->item_lazy[i] = 0, st->stats.scratch_loads--;
    }
    pthread_mutex_unlock(&st->mu);
}

/* gather: expert e's rows of a step of n tokens x top-k (sel, w), appended at
 * rows/pslots/weights[*nr]: each token's batch row, the expert's slot (its
 * rank among the token's experts by id: the reference sum order) and gate
 * weight. Returns how many; *need (when not NULL) gets the highest of
 * st->need over them. */
static int gather(struct moe_store *st, int e, int n, const int32_t *sel, const float *w, int k, int *nr,
                  uint8_t *need) {
    const int first = *nr;
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            if (sel[(size_t)t * k + j] != e) continue;
            int r = 0;
            for (int q = 0; q < k; q++) {
                const int32_t o = sel[(size_t)t * k + q];
                r += o < e || (o == e && q < j);
            }
            st->rows[*nr] = t, st->pslots[*nr] = r, st->weights[*nr] = w[(size_t)t * k + j];
            if (need && (*nr == first || st->need[(size_t)t * k + j] > *need)) *need = st->need[(size_t)t * k + j];
            (*nr)++;
        }
    return *nr - first;
}

/* plan_in_place: the plan of an in-place store: each expert once, ascending
 * id, as the budget store's batch steps, at the precision it is bound at;
 * nothing to read. */
static enum moe_status plan_in_place(struct moe_store *st, int n, const int32_t *sel, const float *w, int k,
                                     struct moe_store_plan **plan) {
    int ni = 0, nr = 0;
    for (int e = 0; e < st->E; e++) {
        const int first = nr, m = gather(st, e, n, sel, w, k, &nr, NULL);
        if (m) st->items[ni++] = (struct moe_store_item){e, m, first, 0, -1, 0, 0}; /* handle 0: never scratch */
    }
    st->plan = (struct moe_store_plan){ni, st->items, st->rows, st->pslots, st->weights};
    *plan = &st->plan;
    return MOE_OK;
}

enum moe_status moe_store_plan(struct moe_store *st, int layer, int pos0, int n, const int32_t *sel, const float *w,
                               int k, struct moe_store_plan **plan) {
    const int max_n = st->in_place ? st->max_n : 4096;
    if (k < 1 || k > st->K || n > max_n || n <= 0) {
        MOE_LOGE("expert store: a step of %d tokens x top-%d (the store was made for up to top-%d, <= %d tokens)",
                 n, k, st->K, max_n);
        return MOE_ERR_INVALID;
    }
    const int E = st->E;
    const int decode = n == 1;
    if (layer < 0 || layer >= st->c->n_layer || st->moe_of[layer] < 0) {
        MOE_LOGE("expert store: layer %d has no routed experts", layer);
        return MOE_ERR_INVALID;
    }
    if (!st->in_place) /* a step that failed (an acquire's error) may have left items held: released now */
        for (int i = 0; i < st->plan.n_items; i++)
            if (st->item_slot[i] >= 0) moe_store_release(st, i);
    layer = st->moe_of[layer];
    st->step_layer = layer, st->step_n = n;
    if (st->in_place) return plan_in_place(st, n, sel, w, k, plan);
    for (int t = 0; t < n; t++) token_needs(st, w + (size_t)t * k, k, st->need + (size_t)t * k);
    pthread_mutex_lock(&st->mu);
    moe_cache_begin_step(st->cache, layer, decode ? pos0 + 1 : pos0 + n);
    if (st->shadow) moe_cache_begin_step(st->shadow, layer, decode ? pos0 + 1 : pos0 + n);
    int ni = 0, nr = 0;
    if (decode) { /* one token: its experts in rank order */
        for (int j = 0; j < k; j++) {
            struct moe_store_item *it = &st->items[ni];
            memset(it, 0, sizeof *it);
            it->expert = sel[j], it->n = 1, it->first = nr;
            st->rows[nr] = 0;
            int r = 0;
            for (int q = 0; q < k; q++) r += sel[q] < sel[j] || (sel[q] == sel[j] && q < j);
            st->pslots[nr] = r;
            st->weights[nr] = w[j];
            nr++;
            access_item(st, ni, layer * E + sel[j], st->need[j], 1);
            ni++;
        }
    } else { /* a batch: each expert once, ascending id, with its tokens' highest need */
        for (int e = 0; e < E; e++) {
            uint8_t need = 0;
            const int first = nr, m = gather(st, e, n, sel, w, k, &nr, &need);
            if (!m) continue;
            st->items[ni] = (struct moe_store_item){e, m, first, 0, 0, 0, 0};
            access_item(st, ni, layer * E + e, need, 0);
            ni++;
        }
    }
    if (decode) guard_check(st, k);
    if (decode && st->paths && k == st->K) path_prefetch(st, layer, sel); /* keyed on top-K sets: not for
                                                                            * big-little's little passes */
    /* mispredicted prefetches for this layer: a read not started is
     * cancelled; a copy read stays in its slot until the slot is reused */
    for (int t = 0; t < st->n_pf; t++) {
        const int i = st->pf_slot[t];
        struct slot *s = &st->slots[i];
        if (s->prefetch && s->pf_layer == layer && s->users == 0 && s->state == S_QUEUED) pf_clear(st, i, 1);
    }
    pthread_mutex_unlock(&st->mu);
    if (moe_backend_supports(st->be, MOE_BACKEND_FEAT_PLACE)) place_items(st, layer, ni);
    st->plan.n_items = ni;
    st->plan.items = st->items;
    st->plan.rows = st->rows;
    st->plan.slots = st->pslots;
    st->plan.weights = st->weights;
    *plan = &st->plan;
    return MOE_OK;
}

/* view_of: the expert's matrices (and biases) in slot memory at precision prec. */
static void view_of(const struct moe_store *st, const struct slot *s, int prec, struct moe_ffn *f) {
    const struct moe_bundle_precision *d = moe_bundle_precision_at(st->bundle, (uint32_t)prec);
    struct moe_weight *w[3] = {&f->gate, &f->up, &f->down};
    for (int k = 0; k < 3; k++)
        *w[k] = (struct moe_weight){(const char *)s->buf.data + d->parts[k].offset,
                                    st->pack[prec][k] ? (enum moe_qtype)st->pack[prec][k] : (enum moe_qtype)d->parts[k].type_id,
                                    (int64_t)d->parts[k].rows, (int64_t)d->parts[k].cols};
    /* gpt-oss blobs: an f32 row of gate | up | down biases (checked by the model loader) */
    f->bias = d->n_parts > 3 ? (const float *)(const void *)((const char *)s->buf.data + d->parts[3].offset) : NULL;
}

/* why_failed: into msg, the one message of an item whose copy could not be
 * had: the read failed (slot s's fail record), the bundle changed (said by
 * name already), or the storage did not answer within io_timeout (waited >
 * 0). Lock held. */
static void why_failed(const struct moe_store *st, const struct slot *s, const struct moe_store_item *it,
                       double waited, char *msg, size_t cap) {
    const char *path = moe_bundle_path(st->bundle);
    const int layer = st->layer_of[st->step_layer];
    const struct moe_bundle_precision *d = s->prec >= 0 ? moe_bundle_precision_at(st->bundle, (uint32_t)s->prec) : NULL;
    const char *prec = d ? d->name : "?";
    const struct rd *f = &s->fail;
    const unsigned long long off = (unsigned long long)f->offset, n = (unsigned long long)f->bytes;
    const int k = snprintf(msg, cap, "%s: layer %d expert %d precision %s: ", path, layer, it->expert, prec);
    if (k < 0 || (size_t)k >= cap) return;
    msg += k, cap -= (size_t)k;
    if (waited > 0) {
        struct moe_bundle_blob b;
        const int known = s->g >= 0 && blob(st, s->g, s->prec, &b) == MOE_OK;
        snprintf(msg, cap, "the storage did not answer: the read of %llu bytes at offset %llu was not done "
                 "after %.1f s (--io-timeout %g); this forward fails", known ? (unsigned long long)b.stored_size : 0ULL,
                 known ? (unsigned long long)b.offset : 0ULL, waited, st->p.io_timeout);
    } else if (s->state != S_FAILED) {
        snprintf(msg, cap, "could not be loaded");
    } else if (f->kind == RD_CHANGED) {
        snprintf(msg, cap, "not read (the file changed, see above)");
    } else if (f->kind == RD_ERRNO || f->kind == RD_EOF) {
        snprintf(msg, cap, "reading %llu bytes at offset %llu failed (%d tries): %s", n, off, f->tries,
                 f->kind == RD_EOF ? "unexpected end of file" : strerror(f->err));
    } else if (f->kind == RD_CHECKSUM) {
        snprintf(msg, cap, "the %llu bytes at offset %llu fail their checksum (%d reads; damaged bundle or storage)", n,
                 off, f->tries);
    } else {
        snprintf(msg, cap, "could not be loaded (see above)");
    }
}

enum moe_status moe_store_acquire(struct moe_store *st, int i, struct moe_ffn *view) {
    struct moe_store_item *it = &st->items[i];
    const int32_t g = st->step_layer * st->E + it->expert;
    if (it->host || st->in_place) { /* on the host, or a store in place: the model's views (checked on first use),
                                     * nothing to wait for; a host run reads the mapping: not from a changed file */
        enum moe_status rc = it->host && !st->in_place ? moe_bundle_check_file(st->bundle) : MOE_OK;
        return rc ? rc : moe_model_expert(st->m, st->layer_of[st->step_layer], it->expert, it->precision, view);
    }
    pthread_mutex_lock(&st->mu);
    if (st->item_lazy[i]) { /* a copy not kept: read it into a scratch slot now */
        int si = scratch_slot(st);
        struct slot *s = &st->slots[si];
        assign(st, si, g, it->precision);
        enqueue(st, si, 0);
        s->users++;
        st->item_slot[i] = si;
        st->item_gen[i] = s->gen;
        st->item_lazy[i] = 0;
    }
    const int si = st->item_slot[i];
    struct slot *s = &st->slots[si];
    double t0 = 0;
    int waited = 0, timed_out = 0;
    struct timespec dl = {0, 0};
    /* a slot whose prefetch read failed (prefetches are tried less hard) is read again for this demand use:
     * pf_serve may have bound the slot while that read was still in flight */
    while (s->gen == st->item_gen[i] && (s->state == S_QUEUED || s->state == S_LOADING || s->state == S_EMPTY ||
                                          (s->state == S_FAILED && s->fail.prefetch && !s->reading))) {
        if (s->state == S_FAILED) st->stats.prefetch_reread++;
        if (s->state == S_EMPTY || s->state == S_FAILED) s->fail.prefetch = 0, enqueue(st, si, 0);
        if (!waited) t0 = moe_now_s(), waited = 1, dl = deadline(CLOCK_MONOTONIC, st->p.io_timeout);
        if (st->p.io_timeout <= 0) pthread_cond_wait(&st->cv, &st->mu);
        else if (pthread_cond_timedwait(&st->cv, &st->mu, &dl) == ETIMEDOUT) {
            timed_out = s->gen == st->item_gen[i] && (s->state == S_QUEUED || s->state == S_LOADING);
            break;
        }
    }
    enum moe_status rc = s->gen == st->item_gen[i] && s->state == S_READY ? MOE_OK : MOE_ERR_IO;
    if (waited) {
        double d = moe_now_s() - t0;
        st->stats.stall_s += d;
        if (st->step_n == 1) st->stats.stall_s_decode += d;
        if (timed_out) st->stats.read_timeouts++;
    }
    if (rc == MOE_OK) view_of(st, s, s->prec, view);
    char msg[512] = "";
    if (rc) why_failed(st, s, it, timed_out ? moe_now_s() - t0 : 0, msg, sizeof msg);
    pthread_mutex_unlock(&st->mu);
    if (rc) MOE_LOGE("%s", msg);
    return rc;
}

void moe_store_release(struct moe_store *st, int i) {
    if (st->in_place) return;
    const int si = st->item_slot[i];
    if (si < 0) return;
    pthread_mutex_lock(&st->mu);
    struct slot *s = &st->slots[si];
    if (s->users > 0) s->users--;
    if (s->users == 0 && s->pend_g >= 0) { /* a copy placed while the step used the slot */
        const int32_t g = s->pend_g;
        s->pend_g = -1;
        assign(st, si, g, s->pend_prec);
        if (s->pend_prefetch) {
            enqueue(st, si, 1);
            s->prefetch = 1, s->pf_layer = s->pend_layer;
        }
    }
    if (s->kind == 1 && s->users == 0 && s->g >= 0 && st->slot_hi[s->g] != si) { /* evicted while in use, into
                                                                                 * another class's place: dropped */
        resident_add(st, -s->bytes);
        if (s->state == S_QUEUED) st->stats.reads_cancelled++;
        s->bytes = 0, s->g = -1, s->gen++, s->state = S_EMPTY, s->prefetch = 0;
    }
    if (s->kind == 3 && s->users == 0 && s->g >= 0 && st->pf_of[s->g] != si) /* a cache slot that became a
                                                                               * prefetch slot while in use */
        pf_clear(st, si, 0);
    if (s->kind == 2 && s->users == 0) { /* scratch: the copy is dropped */
        resident_add(st, -s->bytes);
        s->bytes = 0;
        s->g = -1;
    }
    st->item_slot[i] = -1;
    pthread_mutex_unlock(&st->mu);
}

int moe_store_prefetch_hint(struct moe_store *st, int layer, const int32_t *experts, const float *weights, int n,
                            int ahead) {
    int started = 0;
    (void)ahead; /* a prefetched copy waits in its slot until used or replaced */
    if (st->in_place || st->n_pf <= 0 || layer < 0 || layer >= st->c->n_layer || st->moe_of[layer] < 0) return 0;
    layer = st->moe_of[layer];
    uint8_t needs[64];
    if (n > 64) n = 64;
    if (weights) token_needs(st, weights, n, needs);
    pthread_mutex_lock(&st->mu);
    for (int j = 0; j < n && started < st->n_pf; j++) {
        /* the copy the prediction would need: the high copy for the top-1
         * and s <= T1, the low copy for an uncertain one (T1 < s) */
        const int32_t g = layer * st->E + experts[j];
        const int low = weights && st->dynamic && needs[j] != MOE_CACHE_NEED_HIGH && st->lower[g];
        if (moe_cache_contains(st->cache, g, 1) || (low && moe_cache_contains(st->cache, g, 0))) continue;
        started += pf_start(st, g, low ? st->low : st->home[g], layer);
    }
    pthread_mutex_unlock(&st->mu);
    return started;
}

double moe_store_route_margin(const struct moe_store *st) {
    return st && !st->in_place ? st->stats.route_margin : 0.0;
}

int moe_store_serves(const struct moe_store *st, int layer, int expert, int high) {
    if (!st || st->in_place || layer < 0 || layer >= st->c->n_layer || st->moe_of[layer] < 0 || expert < 0 ||
        expert >= st->E)
        return 0;
    const int32_t g = st->moe_of[layer] * st->E + expert;
    if (moe_cache_contains(st->cache, g, 1)) return 1;
    return !high && st->dynamic && st->lower[g] && moe_cache_contains(st->cache, g, 0);
}

void moe_store_count_route(struct moe_store *st, int n, double mass) {
    if (!st || n <= 0) return;
    pthread_mutex_lock(&st->mu);
    st->stats.route_substituted += n;
    st->stats.route_mass_moved += mass;
    pthread_mutex_unlock(&st->mu);
}

void moe_store_count_tokens(struct moe_store *st, int n, int decode) {
    st->stats.tokens += n;
    if (decode) st->stats.decode_tokens += n;
}

void moe_store_get_stats(const struct moe_store *st, struct moe_store_stats *out) {
    pthread_mutex_lock((pthread_mutex_t *)&st->mu);
    *out = st->stats;
    out->reads_queued = 0;
    for (int i = 0; !st->in_place && i < st->n_slots; i++) out->reads_queued += st->slots[i].state == S_QUEUED;
    pthread_mutex_unlock((pthread_mutex_t *)&st->mu);
}

int moe_store_params_active(const struct moe_store_params *p) {
    return p && (p->expert_mem > 0 || p->expert_mem_share > 0 || p->high_cap > 0 || p->low_cap > 0);
}

/*
 * moe-store.h - the expert store: keeps at most a budget of routed-expert
 * bytes in a backend's memory and reads missed experts from the bundle.
 *
 * Tiers: the fast tier is a set of slots in the backend's memory (host RAM
 * for the CPU backend, GPU memory for the CUDA one, which the store fills
 * through the backend's stage_begin / stage_end hooks: pinned host buffers,
 * possibly the backend's host tier), split into a high-precision and a
 * low-precision cache; the slow tier is the .moeb file on storage, read with direct I/O
 * (O_DIRECT on the 4096-aligned blobs, so the page cache cannot hide a miss),
 * buffered reads or copies out of the file mapping. Which copies stay is
 * decided by the cache-policy core (moe-cache.h), the same state machine
 * `moe-prep fit-cache` replays, under HOBBIT's token-level precision rule
 * (high / low / skip from the gate weights with T1/T2 from the bundle's
 * tuning), with EdgeMoE's path-dictionary and HOBBIT's stacked-gate prefetch,
 * and loads overlapped with compute by a pool of loader threads.
 *
 * Non-expert weights are not the store's: they stay the model's (read into
 * its own memory at load when it was loaded with lazy_experts:
 * moe_model_params.copy_dense). Before every read the store checks that the
 * bundle's file is still the one mapped (moe_bundle_check_file); a truncated
 * or rewritten file fails the read with MOE_ERR_IO and a message naming it
 * ("changed while the model was running ...; restart"), and so does every
 * later read. Memory: the slots (at most the budget; high slots sized per
 * home precision) + two scratch slots of the largest copy (for copies a
 * policy does not keep) + per loader a group of rows for the in-place
 * interleave + bookkeeping (moe_store_overhead_bytes). A missed copy is read
 * in 1 MiB chunks (with direct I/O all in flight at once, Linux AIO) into its
 * slot, and checked (XXH3) and interleaved for the CPU kernels chunk by chunk
 * as the chunks arrive: no second copy and no pass after the read but the
 * last chunk's.
 *
 * Used by the session (moe-session.h): it is created by moe_session_create
 * when moe_session_params.store is set, and driven by the session's thread;
 * the loader threads only read the file and write slots. See
 * docs/architecture.md ("The expert store").
 */
#ifndef MOE_STORE_H
#define MOE_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moe-backend.h"
#include "moe-cache.h"
#include "moe-model.h"
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moe_io_mode {
    MOE_IO_DIRECT = 0,   /* O_DIRECT reads (falls back to buffered where the file system refuses it) */
    MOE_IO_BUFFERED = 1, /* pread through the page cache */
    MOE_IO_MMAP = 2,     /* copies out of the bundle's mapping; the pages copied are then dropped
                          * from the process (madvise MADV_DONTNEED), so they do not add to its RSS */
};

/* What the engine does; moe_store_default_params() gives the defaults noted. */
struct moe_store_params {
    int64_t expert_mem;     /* bytes of expert copies kept (> 0), or 0 with high_cap/low_cap */
    double expert_mem_share; /* if > 0 (and expert_mem == 0): keep this share (0, 1] of the bytes
                             * of every expert's high copy ("--expert-mem 25%") */
    int high_cap, low_cap;  /* copies kept per cache, as fit-cache's --cache-experts H,L
                             * (used when expert_mem == 0; both 0 = no budget) */
    double low_share;       /* share of expert_mem for the low cache when dynamic precision is
                             * on (0.25, as fit-cache's --low-share) */
    enum moe_io_mode io;    /* MOE_IO_DIRECT */
    int policy;             /* enum moe_cache_policy, or -1: HOBBIT with the bundle's fitted
                             * weights if it has them, else LRU (-1) */
    const char *high;       /* precision of high copies; NULL = each expert's home precision
                             * (the bit-width map, else the precision the model is bound at) */
    const char *low;        /* precision of low copies; NULL = the smallest stored */
    int dynamic;            /* HOBBIT dynamic precision: 1 on, 0 off, -1 auto = on when the
                             * budget cannot hold every high copy, a low precision exists and
                             * the tuning has T1/T2 (-1) */
    int skip;               /* 1: experts with s > T2 and no cached copy are skipped (0: loaded low) */
    double t1, t2;          /* thresholds; NaN = the bundle's hobbit.t1 / hobbit.t2 (NaN) */
    int prefetch_layers;    /* stacked-gate prefetch: layers ahead (0 = off, the default) */
    int prefetch_paths;     /* path-dictionary prefetch: experts per layer (0 = off, the default) */
    int path_order;         /* 1 or 2: the dictionary keyed on 1 or 2 previous layers (1) */
    int warm;               /* 1: fill the caches in Twiddler's placement order at start (1) */
    int n_loaders;          /* loader threads (2) */
    int repack;             /* 1: on the CPU backend, the q4_k / q8_0 matrices of each copy read
                             * are interleaved (moe_repack_type) for its faster kernels,
                             * as moe_model_repack does for resident weights, in place and in
                             * the same pass as the checksum (about 1 ms per 6.7 MB copy);
                             * 0 (default): the stored rows as read */
    int prefetch_slots;     /* slots of the largest high copy kept for prefetched copies,
                             * taken out of expert_mem (in addition with high_cap/low_cap):
                             * a prefetch never evicts a cached copy. -1 (default) = 1 when a
                             * prefetcher is on (prefetch_layers, prefetch_paths, or the
                             * session's big-little hints), else 0 */
    double route_margin;    /* cache-aware routing (decode steps): when a token's chosen expert
                             * has no cached copy that serves it and an expert the router did
                             * not choose has one, with a router probability at most this much
                             * lower (absolute, in [0, 1]), the cached one is used instead.
                             * 0 = off; NaN (default) = the bundle's tuning cache_route.margin
                             * (moe-prep fit-cache --fit-route), else off */
    int guard;              /* 1 (default): when the policy is the fitted HOBBIT one by default
                             * (policy -1), a shadow LRU cache of the same capacities sees the
                             * same accesses; once its miss penalty over the decode steps
                             * (decayed over about 64 tokens) is 10 % below the policy's, after
                             * 16 decode tokens, the store runs LRU for the rest of its life
                             * (weights fitted on calibration text that does not match the
                             * workload); 0: off (--policy-guard off) */
    double io_timeout;      /* seconds moe_store_acquire waits for one copy's read before the
                             * forward fails ("the storage did not answer"); also the most
                             * moe_store_free waits for a loader still in a read. 0 = wait
                             * forever. Default 30 (--io-timeout) */
    const struct moe_store_io_hooks *io_hooks; /* a test seam: faults injected into the reads
                             * (below); NULL (default) = none. Borrowed for the store's life */
};

/* Failed reads. A read that fails (an error from the kernel, the end of the
 * file before the copy's end, bytes whose XXH3 does not match) is retried:
 * a short read is continued where it stopped, and the whole copy is read
 * again up to MOE_STORE_READ_TRIES times in all. When the last try fails, the
 * moe_store_acquire that waits for the copy returns MOE_ERR_IO with one
 * message naming the layer, the expert, the precision, the file offset and
 * the cause; the copy is read again at its next use, so a later forward
 * succeeds if the fault has passed (nothing is sticky in the store: a bundle
 * changed on disk is, through moe_bundle_check_file). A prefetch read that
 * fails is not retried and fails nothing: it is dropped and counted
 * (stats.prefetch_failed); a read nobody waits for yet (the warm start) is
 * dropped too and read again at its first use. */
#define MOE_STORE_READ_TRIES 2

/* The I/O path a read takes (moe_store_read_info.path). */
enum moe_store_io_path {
    MOE_STORE_PATH_AIO = 0,   /* a chunk in flight through Linux AIO (--io direct) */
    MOE_STORE_PATH_PREAD = 1, /* pread (--io buffered, direct without AIO, a short read's rest) */
    MOE_STORE_PATH_MMAP = 2,  /* a copy out of the bundle's mapping (--io mmap) */
};

/* One read a loader is about to make: a chunk (at most 1 MiB) of one copy. */
struct moe_store_read_info {
    int layer, expert;          /* model layer and expert of the copy */
    const char *precision;      /* its stored precision's name (the bundle's) */
    uint64_t offset, bytes;     /* the file range asked for */
    enum moe_store_io_path path;
    int prefetch;               /* 1: a prefetch read no forward waits for (yet) */
    int attempt;                /* 0: the copy's first read; 1 .. MOE_STORE_READ_TRIES - 1: a retry */
};

/* What a hook makes of that read (moe_store_io_hooks.on_read). */
struct moe_store_fault {
    int err;        /* != 0: the read fails with this errno (e.g. EIO); nothing is read */
    int64_t bytes;  /* 0 <= bytes < info.bytes: the read returns only this many bytes (a short
                     * read, rounded down to 4096 with --io direct; 0 = end of file); -1 = all */
    int corrupt;    /* 1: one byte of what the read returned is flipped (the checksum fails) */
};

/* A test seam for the store's reads, on every I/O path: on_read is called by
 * a loader thread right before each read (concurrently from several loaders:
 * it must be thread-safe), with *f cleared (err 0, bytes -1, corrupt 0), and
 * may fill *f or sleep (a slow read). Unset, a read costs one test of
 * moe_store_params.io_hooks. after_read (NULL: none) is called by the loader
 * once a copy's reads are over (every try), with the copy's info (offset and
 * bytes: the whole stored copy; path: the --io mode's) and the outcome, before the slot's state says it: a hook that sleeps there holds the
 * copy "still loading" for a while, so a test can make a demand use meet a
 * read that is about to fail (not by a race). */
struct moe_store_io_hooks {
    void (*on_read)(void *user, const struct moe_store_read_info *info, struct moe_store_fault *f);
    void *user;
    void (*after_read)(void *user, const struct moe_store_read_info *info, enum moe_status rc);
};

struct moe_store_params moe_store_default_params(void);

/* moe_store_parse_size: moe_parse_size (moe-base.h): "512M", "1.5G", "4096",
 * "64KiB" (powers of 1024), "2GB" (powers of 1000) -> bytes. MOE_ERR_INVALID
 * (not logged) otherwise. */
enum moe_status moe_store_parse_size(const char *s, int64_t *out);

/* What a run did, counted since the session was created. */
struct moe_store_stats {
    int64_t tokens;                 /* tokens run (prompt + decode) */
    int64_t decode_tokens;
    int64_t accesses;               /* (step, expert) uses asked of the cache */
    int64_t hits_high, hits_low, misses_high, misses_low, skips;
    int64_t loads, load_bytes;      /* blobs read from storage and their stored bytes (demand + prefetch):
                                     * reads a loader started; one cancelled while queued is not counted */
    int64_t loads_decode, load_bytes_decode; /* of which started during decode steps */
    int64_t prefetch_loads;         /* of which prefetches */
    int64_t prefetch_used;          /* prefetched copies that served a demand access */
    int64_t prefetch_cancelled;     /* prefetches dropped before their read started */
    int64_t scratch_loads;          /* misses loaded into scratch (not kept by the policy) */
    double stall_s;                 /* time the compute thread waited for loads */
    double stall_s_decode;          /* of which during decode steps */
    int64_t peak_resident_bytes;    /* most bytes of expert copies held at once (slots in use) */
    int64_t slot_bytes;             /* bytes allocated for slots and scratch */
    int high_cap, low_cap;          /* the caches' capacities (copies) */
    int64_t high_copy_bytes, low_copy_bytes; /* the largest copy of each cache */
    int policy;                     /* enum moe_cache_policy used */
    int dynamic;                    /* dynamic precision on */
    double t1, t2;
    enum moe_io_mode io;            /* the mode used (after any fallback) */
    int64_t host_runs;              /* uses computed on the host by the backend's choice (Twiddler) */
    double read_s, read_s_max;      /* per read started (loads): seconds from its start to its copy
                                     * ready (I/O, checksum, interleave), summed, and the longest */
    int queue_depth_max;            /* most reads queued or in progress at once */
    int64_t reads_cancelled;        /* reads queued and dropped before a loader started them (the
                                     * copy evicted or the prefetch mispredicted; not in loads) */
    int64_t reads_queued;           /* reads queued and not started when the stats were taken;
                                     * loads + reads_cancelled + reads_queued = reads asked for */
    double route_margin;            /* cache-aware routing's margin in use (0: off) */
    int64_t guard_switch_token;     /* decode token of the policy guard's latest switch; -1: never */
    int64_t guard_switches;         /* its switches to LRU (0 or 1) */
    double guard_penalty, guard_shadow_penalty; /* decode miss penalty of the policy and of its shadow
                                     * LRU while the guard watched (high misses + low_cost x low) */
    int64_t route_substituted;      /* uses whose expert cache-aware routing replaced by a cached one */
    double route_mass_moved;        /* sum over those of the router probability given up
                                     * (p(chosen) - p(substitute)) */
    int64_t prefetch_dropped;       /* prefetched copies dropped unused (a misprediction, or their
                                     * slot taken by a newer prefetch) */
    int64_t read_retries;           /* reads of a copy made again after a failed one */
    int64_t reads_failed;           /* reads that failed for good (every try; prefetches included) */
    int64_t prefetch_failed;        /* of which prefetches (dropped, never failing a forward) */
    int64_t prefetch_reread;        /* demand uses bound to a prefetch whose read failed: read again
                                     * as demand reads */
    int64_t read_timeouts;          /* acquires that gave up waiting after io_timeout */
};

struct moe_store;

/* moe_store_new_in_place: the store of a run without a budget (every expert
 * resident): the same plan / acquire / release protocol, but each item is the
 * expert at the precision it is bound at, viewed in the model's memory
 * (moe_model_expert: the mapping, or a bit-width map's or sensitivity sweep's
 * rebinding), never read or copied; no policy, no prefetch, no counts but
 * tokens. Items come in ascending expert id for every step. Steps of up to
 * n_batch tokens x top-k. For any model (checkpoint, GGUF or bundle); the
 * session makes one when no budget is given. */
enum moe_status moe_store_new_in_place(const struct moe_model *m, struct moe_backend *be, int k, int n_batch,
                                       struct moe_store **out);

/* moe_store_in_place: 1 for a store made by moe_store_new_in_place. */
int moe_store_in_place(const struct moe_store *st);

/* moe_store_new: the store for a bundle model (loaded with lazy_experts,
 * ideally) on backend `be` (both borrowed). Checks the budget: one that
 * cannot hold one layer's top-`k` at the lowest precision is MOE_ERR_INVALID
 * with a message naming the minimum. MOE_ERR_UNSUPPORTED for a checkpoint
 * directory (a budget needs a bundle). */
enum moe_status moe_store_new(const struct moe_model *m, struct moe_backend *be, const struct moe_store_params *p,
                              int k, struct moe_store **out);

/* moe_store_free: joins the loaders, frees the slots; NULL is a no-op. A
 * loader still inside a read the storage has not answered io_timeout seconds
 * after the call (0: no limit) is left behind, detached, with the store's
 * memory (logged): the process should then exit rather than free the model. */
void moe_store_free(struct moe_store *st);

/* moe_store_overhead_bytes: the store's memory beyond the slots of the
 * budget: two scratch slots (copies a policy does not keep), each loader's
 * staging buffer and bookkeeping (for the peak-memory check). With
 * uncompressed blobs read into host slots (the CPU backend, every --io mode)
 * staging holds one group of 16 rows for the in-place interleave, so the
 * overhead is two copies of the largest high copy + n_loaders x at most
 * MOE_STORE_GROUP_MAX + about 100 kB per 1000 experts; compressed blobs and
 * device slots need staging of two copies per loader. */
int64_t moe_store_overhead_bytes(const struct moe_store *st);

/* One expert's work in a layer step, as planned by moe_store_plan. */
struct moe_store_item {
    int expert;
    int n;            /* tokens routed to it */
    int first;        /* its rows start at plan->rows[first] */
    int handle;       /* the store's slot (-1: skipped, or read into a scratch slot when acquired) */
    int precision;    /* stored precision index used */
    int skipped;      /* HOBBIT skip: not computed */
    int host;         /* the backend's place() chose the host: moe_store_acquire gives host
                       * views of the model's mapping (no slot, no wait) */
};

/* Scratch slots: copies the policy does not keep are read into these, so a
 * step may hold at most this many such copies acquired at once. */
#define MOE_STORE_SCRATCH 2

struct moe_store_plan {
    int n_items;
    struct moe_store_item *items;  /* [n_items] in the order to compute them */
    int32_t *rows, *slots;         /* [n x k] per item: batch rows and expert slots */
    float *weights;                /* [n x k] gate weights */
};

/* moe_store_begin_sequence: a new sequence starts (session reset). */
void moe_store_begin_sequence(struct moe_store *st);

/* moe_store_plan: layer `layer`'s routed work for n tokens (positions
 * pos0..pos0+n-1; n == 1 is a decode step): sel/w [n x k] the router's
 * choices in rank order, k at most the k the store was made for (fewer:
 * big-little's little pass; path prefetch then waits for a top-k step). Asks the cache for each expert, starts the loads,
 * and fills *plan (owned by the store, valid until the next call). */
enum moe_status moe_store_plan(struct moe_store *st, int layer, int pos0, int n, const int32_t *sel, const float *w,
                               int k, struct moe_store_plan **plan);

/* moe_store_acquire: the views of item i of the current plan, waiting for
 * its load; moe_store_release after computing it. MOE_ERR_IO (one message
 * naming layer, expert, precision and file offset) when the read failed
 * after its retries, when the bundle changed, or when it did not complete
 * within io_timeout seconds (the read goes on; a later use of the copy waits
 * for it again). Items of a plan left unreleased after a failure are
 * released by the next moe_store_plan. */
enum moe_status moe_store_acquire(struct moe_store *st, int i, struct moe_ffn *view);
void moe_store_release(struct moe_store *st, int i);

/* moe_store_prefetch_hint: experts[0..n) of MoE layer `layer` (in rank
 * order, gate weights `weights` or NULL) will probably be used `ahead` MoE
 * layer steps from now (stacked gating); the store loads and protects the
 * ones the policy admits; with weights and dynamic precision on, only those
 * whose predicted need is the high copy (the top-1, and s <= T1). Returns how
 * many reads it started (0: all cached already, or nothing admitted). Decode
 * steps only. */
int moe_store_prefetch_hint(struct moe_store *st, int layer, const int32_t *experts, const float *weights, int n,
                            int ahead);

/* moe_store_route_margin: the margin of cache-aware routing in use (0: off;
 * see moe_store_params.route_margin). An in-place store: 0. */
double moe_store_route_margin(const struct moe_store *st);

/* moe_store_serves: whether a copy of expert `expert` of model layer `layer`
 * is cached (or being read into its cache slot) that serves a use needing
 * the high copy (high != 0: the high copy) or any copy (high == 0; with
 * dynamic precision off only the high copy exists). 0 for an in-place store
 * or a layer without experts. Called by the session's thread only. */
int moe_store_serves(const struct moe_store *st, int layer, int expert, int high);

/* moe_store_count_route: cache-aware routing replaced n uses' experts,
 * giving up `mass` of router probability in all (the counts of the stats). */
void moe_store_count_route(struct moe_store *st, int n, double mass);

/* moe_store_count_tokens: n tokens were run (decode != 0: one-token steps). */
void moe_store_count_tokens(struct moe_store *st, int n, int decode);

/* moe_store_get_stats: the counters so far. */
void moe_store_get_stats(const struct moe_store *st, struct moe_store_stats *out);

/* moe_store_capacities: the copies a byte budget `mem` holds, as the store
 * computes them: high = mem (1 - low_share) / high_bytes, low = mem
 * low_share / low_bytes (0 without dynamic precision), each at most
 * n_experts; high_bytes / low_bytes the slot size of each cache (the largest
 * copy's bytes, rounded up to 4096). For the planner (moe-prep plan). When
 * the experts' home copies differ in size (a bit-width map), the store sizes
 * its high slots per precision and holds at least this many high copies,
 * more when most home copies are small. */
void moe_store_capacities(int64_t mem, double low_share, int dynamic, int64_t high_bytes, int64_t low_bytes,
                          int n_experts, int *high, int *low);

/* The staging a loader needs for the in-place interleave of one group of 16
 * rows (moe_repack_in_place) when the rows are at most 64 KiB: a bound for
 * moe_store_overhead_estimate; the store allocates what the bundle needs. */
#define MOE_STORE_GROUP_MAX ((int64_t)1 << 20)

/* moe_store_overhead_estimate: moe_store_overhead_bytes of a store whose
 * largest slot is copy_bytes, with n_loaders threads, n_experts routed
 * experts, n_slots cache slots and top-k, for uncompressed blobs read into
 * host memory. */
int64_t moe_store_overhead_estimate(int64_t copy_bytes, int n_loaders, int n_experts, int n_slots, int k);

struct moe_tuning_plan;
/* moe_store_params_from_plan: p's engine settings from an applied plan
 * (moe-tuning.h): budget, precisions, dynamic precision and thresholds,
 * policy, path prefetch. p->high / p->low then point into *plan, which must
 * outlive p's use. */
void moe_store_params_from_plan(struct moe_store_params *p, const struct moe_tuning_plan *plan);

/* moe_store_params_active: whether p asks for a budget at all (an
 * --expert-mem size or share, or --cache-experts); without one the session
 * runs every expert resident and needs no store. */
int moe_store_params_active(const struct moe_store_params *p);

#ifdef __cplusplus
}
#endif
#endif

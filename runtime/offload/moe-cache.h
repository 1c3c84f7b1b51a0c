/*
 * moe-cache.h - the expert-cache policy core: which expert copies a
 * high-precision and a low-precision cache keep, under one eviction policy.
 *
 * One state machine serves two drivers, so what `moe-prep fit-cache` fits is
 * what `moe-run` executes:
 *  - the runtime's expert store (moe-store.h) asks it, access by access, what
 *    to load and what to evict, and moves real bytes accordingly;
 *  - fit-cache's simulator (tools/common/cache-sim.h) replays recorded
 *    routing traces through it and only counts.
 *
 * Experts are identified by g = layer * n_experts + expert (layer: the index
 * among all layers; layers without experts are simply never accessed).
 * Capacities are in copies (experts), not bytes: the store converts a byte
 * budget into slots of the largest copy of each precision. The policies, the
 * records they keep and every tie rule are in docs/cache-sim.md; the papers'
 * formulas in ../shared/papers/ALGORITHMS.md.
 *
 * Pure computation: no I/O, nothing printed (errors are logged through
 * moe_log), nothing allocated after moe_cache_new. One object is used by one
 * thread at a time.
 */
#ifndef MOE_CACHE_H
#define MOE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The policies, in the fixed order of the rows of the cache.* profile arrays
 * and of every table (append only). */
enum moe_cache_policy {
    MOE_CACHE_LRU = 0,        /* least recently used */
    MOE_CACHE_LFU_SEQ = 1,    /* least uses in the current sequence */
    MOE_CACHE_LFU_GLOBAL = 2, /* least uses since the replay began */
    MOE_CACHE_LHU = 3,        /* least high-precision uses in the sequence */
    MOE_CACHE_FLD = 4,        /* furthest forward layer distance */
    MOE_CACHE_EDGEMOE = 5,    /* highest -f/d (EdgeMoE) */
    MOE_CACHE_STATIC = 6,     /* Twiddler: most popular experts pinned */
    MOE_CACHE_HOBBIT = 7,     /* lowest weighted priority p_t */
    MOE_CACHE_BELADY = 8,     /* next use furthest in the future (offline only) */
};
#define MOE_CACHE_N_POLICIES 9
#define MOE_CACHE_N_WEIGHTS 5 /* HOBBIT: w_lru, w_lfu, w_lhu, w_fld, w_pop */

/* What an access needs under HOBBIT's precision rule. */
enum moe_cache_need {
    MOE_CACHE_NEED_SKIP = 0, /* s > T2: used only if some copy is cached, else skipped */
    MOE_CACHE_NEED_LOW = 1,  /* T1 < s <= T2: a low or a high copy */
    MOE_CACHE_NEED_HIGH = 2, /* s <= T1, and always the top-1: the high copy */
};

/* Next use of an expert that is not used again (Belady's key; online
 * drivers pass it for every access). */
#define MOE_CACHE_NEVER INT32_MAX

/* moe_cache_policy_name: "lru", "lfu-seq", "lfu-global", "lhu", "fld",
 * "edgemoe", "twiddler", "hobbit", "belady"; "?" for an unknown value. */
const char *moe_cache_policy_name(enum moe_cache_policy p);

/* moe_cache_policy_parse: the policy named `name` (as above); MOE_ERR_INVALID
 * (not logged) for an unknown name. */
enum moe_status moe_cache_policy_parse(const char *name, enum moe_cache_policy *out);

/* One cache configuration. The arrays are borrowed: they must outlive every
 * object made with the configuration. */
struct moe_cache_config {
    int high_cap, low_cap;  /* copies the high and low caches hold (>= 0; 0 = nothing kept) */
    double low_cost;        /* penalty of a low-precision miss (B_low / B_high); a high miss costs 1 */
    double high_bytes, low_bytes; /* bytes of one copy, for the bytes moved (0: not counted) */
    double w[MOE_CACHE_N_WEIGHTS]; /* HOBBIT: w_lru, w_lfu, w_lhu, w_fld, w_pop (>= 0, summing
                             * to 1); w_pop weighs the static popularity of freq_high / freq_low
                             * (else freq); w_pop 0 and admit 0: the paper's HOBBIT */
    const double *freq;     /* [L*E] activation frequency (EdgeMoE; HOBBIT's w_pop without the
                             * two below): token slots per token in [0, 1]; NULL = all 1 */
    const double *freq_high, *freq_low; /* [L*E] HOBBIT's w_pop: token shares of the expert's
                             * high-need and low-need uses (both or neither; NULL = use freq):
                             * a high copy's popularity is freq_high + low_cost freq_low, a low
                             * copy's freq_low (docs/cache-sim.md) */
    const int32_t *order;   /* [L*E] layer*E + expert, most popular first; needed by STATIC */
    int admit;              /* HOBBIT: 1 = admission control: keep a demand-loaded copy only if
                             * its priority after the access outranks the copy it would evict
                             * (else kept = 0), and rank a low copy whose high copy is cached
                             * below every other (it serves nothing the high copy does not);
                             * 0 = the paper's HOBBIT */
    int prefetch;           /* simulator: 1 = load the trace's prefetch lists before each
                             * decode step (ignored by STATIC and BELADY) */
};

/* moe_cache_default_config: empty caches, low_cost 0.5, no byte sizes,
 * HOBBIT weights 0.25 each for w_lru, w_lfu, w_lhu, w_fld and 0 for w_pop,
 * no frequencies or order, no prefetch. */
struct moe_cache_config moe_cache_default_config(void);

/* moe_cache_check_config: what moe_cache_new refuses (logged): a bad policy,
 * negative capacities or costs, STATIC without an order, HOBBIT weights
 * negative or not summing to 1 within 1e-6, admit not 0 or 1, only one of
 * freq_high and freq_low. */
enum moe_status moe_cache_check_config(enum moe_cache_policy p, const struct moe_cache_config *c);

/* What one access or prefetch did. */
enum moe_cache_outcome {
    MOE_CACHE_HIT_HIGH = 0,  /* served by a cached high copy */
    MOE_CACHE_HIT_LOW = 1,   /* served by a cached low copy (need low or skip) */
    MOE_CACHE_MISS_HIGH = 2, /* the high copy must be loaded */
    MOE_CACHE_MISS_LOW = 3,  /* the low copy must be loaded */
    MOE_CACHE_SKIP = 4,      /* need skip and no copy cached: the expert is not computed */
};
#define MOE_CACHE_N_OUTCOMES 5

struct moe_cache_result {
    enum moe_cache_outcome outcome;
    int kept;        /* misses (and loading prefetches): 1 if the loaded copy is now cached;
                      * 0 if it is not kept (Belady's bypass, Twiddler's scratch slot,
                      * HOBBIT's admission control, or every copy protected): load it
                      * into scratch, use it, drop it */
    int32_t evicted; /* the expert whose copy left the cache that received the load
                      * (the same precision as the load), or -1 */
    int prefetch_hit;/* hits: served by a copy a prefetch loaded for this step */
};

struct moe_cache; /* opaque */

/* moe_cache_new: empty caches for n_layers x n_experts experts under policy
 * p with configuration c (copied; its arrays borrowed). Errors:
 * MOE_ERR_INVALID (see moe_cache_check_config, or bad counts),
 * MOE_ERR_NOMEM; logged. */
enum moe_status moe_cache_new(int n_layers, int n_experts, enum moe_cache_policy p,
                              const struct moe_cache_config *c, struct moe_cache **out);

/* moe_cache_free: NULL is a no-op. */
void moe_cache_free(struct moe_cache *c);

/* moe_cache_begin_sequence: a new sequence starts: the per-sequence records
 * (R, F, H) and the keys built on them reset; cached copies stay. */
void moe_cache_begin_sequence(struct moe_cache *c);

/* moe_cache_begin_step: the next step runs MoE layer `layer` for token
 * index T - 1 of the sequence (T >= 1; a prompt batch: T = its length).
 * Steps are counted from 0 at moe_cache_new. */
void moe_cache_begin_step(struct moe_cache *c, int layer, int32_t T);

/* moe_cache_access: expert g is used by the current step with `need`.
 * next_high / next_low: the index of the expert's next use with need >= LOW
 * / == LOW (Belady only; MOE_CACHE_NEVER otherwise). Updates the records of a
 * served access (not of a skip) and fills *r. */
void moe_cache_access(struct moe_cache *c, int32_t g, enum moe_cache_need need, int32_t next_high,
                      int32_t next_low, struct moe_cache_result *r);

/* moe_cache_access_n: n accesses of the current step in a row, exactly as n
 * calls of moe_cache_access (g[i], need[i] (enum moe_cache_need values),
 * next_high[i], next_low[i]; NULL arrays = MOE_CACHE_NEVER), for drivers that
 * only count: counts[outcome] and *prefetch_hits (may be NULL) are
 * incremented; evictions and kept flags are not reported. */
void moe_cache_access_n(struct moe_cache *c, int n, const int32_t *g, const uint8_t *need, const int32_t *next_high,
                        const int32_t *next_low, int64_t counts[MOE_CACHE_N_OUTCOMES], int64_t *prefetch_hits);

/* moe_cache_prefetch: load expert g's high copy ahead of its use and
 * protect it from eviction until the step `ahead` steps after the current
 * one has run (0: this step, as the simulator's path-dictionary prefetch
 * issued just before a step). At most high_cap - 1 copies are protected at
 * any time, so a demand miss always finds room. Returns 1 and fills *r
 * (outcome MISS_HIGH with kept = 1: start the load; HIT_HIGH: already
 * cached, now protected) or returns 0 (nothing done: no room that may be
 * freed, the protection limit, or a policy that does not prefetch: STATIC,
 * BELADY). A prefetch is not a use: records are not updated. */
int moe_cache_prefetch(struct moe_cache *c, int32_t g, int ahead, struct moe_cache_result *r);

/* moe_cache_set_policy: from now on, rank the cached copies under policy p
 * (not STATIC or BELADY, which need their own state; MOE_ERR_INVALID): every
 * cached copy's key is recomputed from the records the cache kept (last
 * use, uses, high-need uses), as if p had been the policy all along; the
 * cached set does not change. */
enum moe_status moe_cache_set_policy(struct moe_cache *c, enum moe_cache_policy p);

/* moe_cache_guard_switch: the expert store's policy guard (moe-store.h,
 * moe_store_params.guard) decides on its two decayed miss penalties, the
 * policy's and the shadow's: 1 when the shadow's is at least 10 % below and
 * the difference is beyond chance (at least twice the square root of the two
 * summed, as for counts of independent misses), else 0. */
int moe_cache_guard_switch(double policy_penalty, double shadow_penalty);

/* moe_cache_contains: 1 if expert g's high (high != 0) or low copy is cached. */
int moe_cache_contains(const struct moe_cache *c, int32_t g, int high);

/* moe_cache_count: copies cached in the high (high != 0) or low cache. */
int moe_cache_count(const struct moe_cache *c, int high);

/* moe_cache_route_pick: cache-aware routing of one token's top-k (the
 * rule the session applies and fit-cache's simulator replays): probs[E]
 * the router's probabilities, sel[k] its choice in rank order; served(e,
 * rank, user) says whether expert e has a cached copy for a use at that rank
 * (rank 0 needs the high copy). For each rank in order whose expert is not
 * served, the served expert outside sel with the largest probability
 * replaces it if probs[chosen] - probs[it] <= margin. Returns the number of
 * replacements; *mass (may be NULL) gets the probability given up. sel is
 * changed in place (not re-sorted; the caller recomputes the weights). */
int moe_cache_route_pick(const float *probs, int E, int32_t *sel, int k, double margin,
                         int (*served)(int expert, int rank, void *user), void *user, double *mass);

#ifdef __cplusplus
}
#endif
#endif

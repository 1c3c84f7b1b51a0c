/*
 * cache-sim.h - the expert-cache simulator of `moe-prep fit-cache`: replays
 * recorded routing traces (routing-stats.h, struct moe_trace) through a
 * high-precision and a low-precision expert cache under one eviction policy
 * and counts hits, misses, skips, the miss penalty and the bytes moved.
 * Policies: LRU, LFU (per sequence and global), LHU, forward layer distance,
 * EdgeMoE's frequency / distance score, Twiddler's static popularity
 * placement, HOBBIT's weighted priority (with a fit of its four weights) and
 * Belady's MIN. The model and every choice are in docs/cache-sim.md; the
 * papers' formulas in ../shared/papers/ALGORITHMS.md.
 *
 * The policies themselves live in the runtime's cache core (moe-cache.h,
 * runtime/offload/cache.c): moe_cache_simulate is a replay driver that feeds the
 * core the recorded accesses and only counts, so what fit-cache fits is what
 * moe-run executes. This module keeps what only an offline replay needs.
 *
 * Use: prepare the part of a trace to replay once (moe_cache_trace_new: the
 * decode order, each access's precision need under T1/T2, prefetch lists,
 * Belady's next-use indices), then run any number of policies and
 * configurations on it (moe_cache_simulate), e.g. the weight fit
 * (moe_cache_fit_hobbit).
 *
 * Pure computation: no I/O, nothing printed (errors are logged through
 * moe_log). A prepared trace is immutable: moe_cache_simulate may run on it
 * from several threads at once; everything else is not thread-safe per object.
 */
#ifndef MOE_CACHE_SIM_H
#define MOE_CACHE_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "moe-cache.h"
#include "moe-status.h"
#include "routing-stats.h"

/* ---- the prepared trace ---- */

/* How a trace is turned into a stream of accesses. */
struct moe_cache_trace_params {
    int prompt_len;  /* the first prompt_len tokens of each sequence run as one batch (< 2: none) */
    double t1, t2;   /* HOBBIT thresholds, t1 <= t2 */
    const struct moe_path_dict *paths; /* EdgeMoE activation paths for prefetch lists; NULL = none */
    int prefetch;    /* experts prefetched per layer (the m most probable); 0 = none */
    /* MoBiLE big-little decoding of the decode tokens (little_k 0: off): each
     * runs a little step per layer with its first little_k experts (needs
     * from their weights alone, no path prefetch); a `fallback` share of them,
     * chosen evenly (decode token i of the whole replay when frac((i + 1) φ)
     * < fallback, φ the golden ratio), then runs a big step per layer with
     * all k, whose prefetch list (bl_prefetch != 0) is the layer's k experts:
     * what the little pass's router told the runtime. */
    int little_k;
    double fallback;
    int bl_prefetch;
};

/* moe_cache_trace_default_params: no batch, T1 = T2 = 1 (every access high
 * precision), no prefetch. */
struct moe_cache_trace_params moe_cache_trace_default_params(void);

struct moe_cache_trace; /* opaque, immutable once made */

/* moe_cache_trace_new: prepare sequences seqs[0..n_seqs) of t (in that order;
 * seqs NULL = all of them) for replay. Each sequence becomes one batch step per
 * MoE layer for its first prompt_len tokens (the union of their experts, in
 * ascending expert order, each with the highest need among the batch's tokens)
 * and then one step per (token, layer), the experts in rank order. The trace
 * t is only read during the call (nothing is kept). With paths and prefetch >
 * 0, every decode step of a layer l >= the dictionary's order gets the
 * `prefetch` most probable experts (probability > 0; ties: lower id) given the
 * token's experts at the previous layer(s); an unseen key gives none. Errors:
 * MOE_ERR_INVALID (bad shape, sequence index, parameters), MOE_ERR_RANGE
 * (more than INT32_MAX - 1 accesses), MOE_ERR_NOMEM; logged. */
enum moe_status moe_cache_trace_new(const struct moe_trace *t, const int32_t *seqs, int n_seqs,
                                    const struct moe_cache_trace_params *pp, struct moe_cache_trace **out);

/* moe_cache_trace_free: frees tr; NULL is a no-op. */
void moe_cache_trace_free(struct moe_cache_trace *tr);

/* Facts about a prepared trace. */
struct moe_cache_trace_info {
    int n_layers, n_experts, n_seq;
    int64_t tokens, steps, accesses;
    int64_t need[3];       /* accesses by enum moe_cache_need */
    int64_t prefetch_slots; /* prefetch list entries over all steps */
};

/* moe_cache_trace_info: the counts of tr. */
void moe_cache_trace_info(const struct moe_cache_trace *tr, struct moe_cache_trace_info *out);

/* moe_cache_trace_accesses: the access stream of tr in replay order: *g
 * (layer * E + expert) and *need (enum moe_cache_need values), both borrowed
 * for the life of tr; returns the number of accesses. The offline optimum
 * (tools/calibrate/cache-opt.h) reads it. */
int64_t moe_cache_trace_accesses(const struct moe_cache_trace *tr, const int32_t **g, const uint8_t **need);

/* moe_cache_trace_need_freq: per expert, the accesses of tr with need high
 * (f_high[L*E]) and low (f_low[L*E]) divided by its tokens: the token shares
 * of moe_cache_config.freq_high / freq_low (a prompt batch step counts once
 * per expert). */
void moe_cache_trace_need_freq(const struct moe_cache_trace *tr, double *f_high, double *f_low);

/* ---- replay ---- */

/* What a replay counts. accesses = hits_high + hits_low + misses_high +
 * misses_low + skips. */
struct moe_cache_stats {
    int64_t tokens, accesses;
    int64_t hits_high, hits_low;     /* served by a cached high / low copy */
    int64_t misses_high, misses_low; /* a high / low copy loaded on demand */
    int64_t skips;                   /* s > T2 and no copy cached: not computed */
    int64_t prefetch_loads;          /* copies loaded by prefetch */
    int64_t prefetch_hits;           /* demand accesses served by a copy prefetched for that step */
    double penalty;                  /* misses_high + low_cost * misses_low */
    double bytes;                    /* (misses_high + prefetch_loads) * high_bytes + misses_low * low_bytes */
};

/* moe_cache_simulate: replay tr under policy p with configuration c (caches
 * start empty; their contents persist across sequences; per-sequence records
 * reset at each sequence) through one moe_cache object: at each decode step
 * the step's prefetch list (c->prefetch) is prefetched with ahead 0, then
 * every access is made with the trace's next-use indices. Deterministic.
 * Thread-safe for concurrent calls on the same tr. Errors: MOE_ERR_INVALID
 * (no trace, or what moe_cache_check_config refuses), MOE_ERR_NOMEM;
 * logged. */
enum moe_status moe_cache_simulate(const struct moe_cache_trace *tr, enum moe_cache_policy p,
                                   const struct moe_cache_config *c, struct moe_cache_stats *out);

/* One replayed step, for drivers that time the replay (moe-prep plan).
 * Arrays borrowed for the callback only. */
struct moe_cache_step_event {
    int seq;                 /* sequence of the prepared trace */
    int32_t T;               /* token index in the sequence + 1 (a prompt batch: its length) */
    int layer;               /* MoE layer */
    int batch;               /* 1: a prompt batch step; 0: one token */
    int pass;                /* 0 a plain step, 1 big-little's little step, 2 its big step */
    int n;                   /* accesses, in order */
    const int32_t *g;        /* [n] layer * E + expert */
    const uint8_t *need;     /* [n] enum moe_cache_need */
    const uint8_t *outcome;  /* [n] enum moe_cache_outcome */
    int n_pf;                /* prefetches that started a load (before the accesses) */
    const int32_t *pf_g;     /* [n_pf] */
};

typedef void (*moe_cache_step_fn)(const struct moe_cache_step_event *ev, void *user);

/* moe_cache_simulate_steps: moe_cache_simulate, calling fn after every
 * step with what it did (same counts in *out). */
enum moe_status moe_cache_simulate_steps(const struct moe_cache_trace *tr, enum moe_cache_policy p,
                                         const struct moe_cache_config *c, moe_cache_step_fn fn, void *user,
                                         struct moe_cache_stats *out);

/* moe_cache_hit_ratio: (hits_high + hits_low) / accesses; NaN without accesses. */
double moe_cache_hit_ratio(const struct moe_cache_stats *s);

/* ---- helpers of fit-cache ---- */

/* moe_cache_split: mark the held-out sequences of n_seq: sequence i is held
 * out when floor((i + 1) h) > floor(i h), which spreads round(n_seq h) of
 * them evenly (h = 0.3: 3, 6, 9, ...); with h > 0 and n_seq >= 2 at least one
 * sequence is held out and one is not. heldout[n_seq] receives 1 or 0;
 * returns the number held out. */
int moe_cache_split(int n_seq, double h, unsigned char *heldout);

/* moe_cache_popularity: token-slot counts of sequences seqs[0..n_seqs) of t
 * as an activation frequency freq[L*E] (count / tokens, so the K experts of a
 * token add up to K) and the placement order (moe_placement_order). Either
 * output may be NULL. MOE_ERR_NOMEM. */
enum moe_status moe_cache_popularity(const struct moe_trace *t, const int32_t *seqs, int n_seqs, double *freq,
                                     int32_t *order);

/* moe_cache_path_dict: an activation-path dictionary of the given order
 * (1 or 2) counted over sequences seqs[0..n_seqs) of t. The caller frees it
 * with moe_path_dict_free. */
enum moe_status moe_cache_path_dict(const struct moe_trace *t, const int32_t *seqs, int n_seqs, int order,
                                    struct moe_path_dict **out);

/* ---- HOBBIT's weight fit ---- */

struct moe_cache_fit_params {
    int grid;          /* simplex grid: weights are multiples of 1/grid (C(grid + n - 1, n - 1)
                        * points for n weights: 8 and 5 weights: 495; 10 and 4: 286) */
    int refine_rounds; /* halvings of the step in the local refinement after the grid (0: none) */
    int n_weights;     /* weights fitted: 5 (with w_pop), or 4 (w_pop fixed at 0: the paper's) */
    int admit;         /* moe_cache_config.admit: 0 off (the paper's), 1 on, -1 both (the grid
                        * twice; the better one is refined) */
    void (*progress)(int done, int total, void *user); /* after each replay; may be NULL */
    void *user;
};

/* moe_cache_fit_default_params: grid 8, 4 refinement rounds, 5 weights,
 * admission both ways, no progress. */
struct moe_cache_fit_params moe_cache_fit_default_params(void);

/* moe_cache_fit_hobbit: the HOBBIT weights that minimise the total miss
 * penalty of replaying tr with configuration c (its w ignored; its freq is
 * the popularity w_pop weighs): every point of the simplex grid, then from
 * the best one moves of the current step from one weight to another while
 * one lowers the penalty, the step halved each round (weights stay >= 0 and
 * sum to 1). Ties keep the earlier point (grid order: w_lru slowest, w_pop
 * fastest). The grid holds every corner, so the fit is never worse on tr
 * than HOBBIT's corners (LRU, LFU-seq, LHU; with 5 weights also the pure
 * popularity order). w receives the weights (w_pop 0 with n_weights 4),
 * *admit (may be NULL) the admission setting they go with, *best (may be
 * NULL) their statistics, *evals (may be NULL) the replays run. */
enum moe_status moe_cache_fit_hobbit(const struct moe_cache_trace *tr, const struct moe_cache_config *c,
                                     const struct moe_cache_fit_params *fp, double w[MOE_CACHE_N_WEIGHTS],
                                     int *admit, struct moe_cache_stats *best, int *evals);

#endif

/*
 * routing-stats.h - statistics of recorded routing decisions (traces), the
 * numbers the runtime techniques need (../shared/papers/ALGORITHMS.md):
 *   - popularity: token-slots per (MoE layer, expert), the placement order of
 *     Twiddler/Fiddler and its hit rate on other traces against random;
 *   - HOBBIT's unimportance score s per selected rank and the thresholds
 *     T1/T2 that give target shares of low-precision and skipped loads;
 *   - EdgeMoE's activation-path dictionary, P(experts at l | experts at l-2,
 *     l-1) and P(l | l-1), and the accuracy of preloading its 1..3 most
 *     probable experts against preloading the most popular ones;
 *   - reuse: how often an expert used by token t is used again by token t+1.
 * All of it is computed from counts, so shards can be merged by adding counts.
 * Pure computation: no I/O, no model. Not thread-safe per object.
 */
#ifndef MOE_ROUTING_STATS_H
#define MOE_ROUTING_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"
#include "moe-trace.h" /* struct moe_trace, moe_trace_check, moe_hobbit_scores */

/* ---- popularity (Twiddler) ---- */

/* moe_popularity_count: add token-slot counts into counts[n_layers x n_experts]. */
void moe_popularity_count(const struct moe_trace *t, int64_t *counts);

/* moe_placement_order: all (layer, expert) pairs as layer * n_experts + expert,
 * most used first (ties: lower layer, then lower expert). order has n_layers *
 * n_experts entries. */
void moe_placement_order(const int64_t *counts, int n_layers, int n_experts, int32_t *order);

/* moe_placement_hit_rate: share of the token-slots of trace t served by the
 * first n_resident pairs of `order`. */
double moe_placement_hit_rate(const struct moe_trace *t, const int32_t *order, int n_resident);

/* ---- HOBBIT scores ---- */

/* The three-way split of loads that thresholds give. */
struct moe_hobbit_split {
    double t1, t2;
    double high, low, skip; /* shares of all selected slots; sum to 1 */
};

/* moe_hobbit_split_at: the split that T1, T2 give on the scores s[n]
 * (s <= T1 high, T1 < s <= T2 low, s > T2 skip). */
struct moe_hobbit_split moe_hobbit_split_at(const float *s, size_t n, double t1, double t2);

/* moe_hobbit_thresholds: T1 <= T2 whose split comes closest to the target
 * shares of low-precision and skipped slots (chosen among the observed score
 * values, so ties decide the achievable shares); the top-1 slot (s = 0) is
 * always high. s is not modified. A NaN or infinite score is refused
 * (MOE_ERR_RANGE, logged): it has no place in the order. */
enum moe_status moe_hobbit_thresholds(const float *s, size_t n, double target_low, double target_skip,
                                      struct moe_hobbit_split *out);

/* ---- activation paths (EdgeMoE) ---- */

struct moe_path_dict;

/* moe_path_dict_new: `order` 2 keys layer l on the expert sets of l-2 and l-1
 * (the paper); 1 keys it on l-1 only (the public EdgeMoE code). */
enum moe_status moe_path_dict_new(int n_layers, int n_experts, int k, int order, struct moe_path_dict **out);
void moe_path_dict_free(struct moe_path_dict *d);

/* moe_path_dict_add: count every (key -> experts at l) of a trace. */
enum moe_status moe_path_dict_add(struct moe_path_dict *d, const struct moe_trace *t);

/* moe_path_dict_merge: add the counts of src into dst (same shape). */
enum moe_status moe_path_dict_merge(struct moe_path_dict *dst, const struct moe_path_dict *src);

/* moe_path_dict_prob: P(expert e at layer l | key of token `tok` in trace t),
 * from the counts; -1 when the key was never seen. */
double moe_path_dict_prob(const struct moe_path_dict *d, const struct moe_trace *t, int64_t tok, int layer, int e);

/* moe_path_dict_keys: distinct keys stored for layer l. */
size_t moe_path_dict_keys(const struct moe_path_dict *d, int layer);

/* An exported part of a dictionary (one layer): the most frequent keys, each
 * with its m most probable experts. Arrays are owned; free with
 * moe_path_export_free(). */
struct moe_path_export {
    int key_len;     /* order x k expert ids; each layer's set sorted ascending */
    int top;         /* experts kept per key */
    size_t n;        /* keys */
    int16_t *keys;   /* [n x key_len] */
    int64_t *totals; /* [n] tokens that had the key */
    int16_t *next;   /* [n x top] most probable experts at the layer, most probable first (ties: lower id) */
    double *prob;    /* [n x top] P(expert | key) = count / total */
};

/* moe_path_dict_export: the keys of `layer` seen at least min_count times,
 * most frequent first (ties: key order), at most max_keys of them, with their
 * `top` most probable experts. MOE_ERR_INVALID for a bad layer or top. */
enum moe_status moe_path_dict_export(const struct moe_path_dict *d, int layer, int top, int64_t min_count,
                                     size_t max_keys, struct moe_path_export *out);
void moe_path_export_free(struct moe_path_export *e);

/* Preload accuracy: for each token and layer that has a key (l >= order), the
 * m most probable experts are preloaded (unseen keys fall back to the most
 * popular experts of the layer); recall[m-1] is the share of the token's K
 * experts that were preloaded, for m = 1..3, and popular[m-1] the same when
 * always preloading the m most popular experts. */
struct moe_preload_accuracy {
    double recall[3], popular[3];
    double key_coverage; /* share of (token, layer) whose key was seen */
    int64_t n;           /* (token, layer) pairs evaluated */
};

enum moe_status moe_path_dict_accuracy(const struct moe_path_dict *d, const int64_t *popularity,
                                       const struct moe_trace *t, struct moe_preload_accuracy *out);

/* ---- reuse ---- */

/* moe_reuse: for each layer and rank, the share of tokens (with a next token in
 * the same sequence) whose expert at that rank is among the next token's K
 * experts: reuse[l * k + r]. chance = K / n_experts. */
void moe_reuse(const struct moe_trace *t, double *reuse, double *chance);

#endif

/*
 * moe-tuning.h - the names of every key of a bundle's tuning section, and
 * typed reading and writing of them.
 *
 * The tuning section (docs/format.md, "Tuning keys") holds what the offline
 * stages fit and the runtime uses: HOBBIT's thresholds and cache weights,
 * Twiddler's placement order, EdgeMoE's activation-path dictionaries and
 * bit-width map, MoBiLE's confidence threshold. The tools write the keys
 * through the names and writers below; the runtime reads them back with
 * moe_tuning_read, which checks every value's type, shape and range, so a
 * damaged or mismatched key is a warning and "absent", never a crash.
 *
 * Layer numbering: every key except the bit-width map counts MoE layers only
 * (MoE layer i = the i-th model layer that has routed experts), so an expert
 * is (MoE layer * n_experts + expert); the bit-width map is indexed by model
 * layer (-1 rows for layers without experts).
 *
 * Pure computation over formats/ (moe-bundle.h's KV sets): no I/O.
 * Warnings go through moe_log. Thread-safe: no global state.
 */
#ifndef MOE_TUNING_H
#define MOE_TUNING_H

#include <stddef.h>
#include <stdint.h>

#include "moe-bundle.h"
#include "moe-cache.h"
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the keys ---- */

/* moe-prep profile: where the statistics came from */
#define MOE_TUNING_PROFILE_DATASET "profile.dataset"           /* string: the calibration data spec */
#define MOE_TUNING_PROFILE_TOKENS "profile.tokens"             /* i64: tokens the results came from */
#define MOE_TUNING_PROFILE_TOOL_VERSION "profile.tool_version" /* string: the writer */

/* moe-prep profile: HOBBIT's precision thresholds on the unimportance score s
 * (s <= T1 high precision, T1 < s <= T2 low, s > T2 skip) and the target
 * shares of low and skipped slots they were chosen for */
#define MOE_TUNING_HOBBIT_T1 "hobbit.t1"                   /* f64 */
#define MOE_TUNING_HOBBIT_T2 "hobbit.t2"                   /* f64 */
#define MOE_TUNING_HOBBIT_TARGET_LOW "hobbit.target_low"   /* f64 */
#define MOE_TUNING_HOBBIT_TARGET_SKIP "hobbit.target_skip" /* f64 */

/* moe-prep profile: Twiddler's placement, (MoE layer * E + expert), most used first */
#define MOE_TUNING_PLACEMENT_ORDER "twiddler.placement_order" /* i64 [L * E] */

/* moe-prep profile: EdgeMoE's activation-path dictionaries, order 1 (keyed on
 * MoE layer l-1) and 2 (keyed on l-2 and l-1); N entries, each a (layer, key)
 * with its `top` most probable experts at the layer */
#define MOE_TUNING_PATH1_KEY_LEN "edgemoe.path1.key_len" /* i64: order * K */
#define MOE_TUNING_PATH1_TOP "edgemoe.path1.top"         /* i64: experts kept per key */
#define MOE_TUNING_PATH1_LAYER "edgemoe.path1.layer"     /* i64 [N]: MoE layer l */
#define MOE_TUNING_PATH1_KEYS "edgemoe.path1.keys"       /* i64 [N * key_len]: each layer's set ascending */
#define MOE_TUNING_PATH1_TOTALS "edgemoe.path1.totals"   /* i64 [N]: tokens that had the key */
#define MOE_TUNING_PATH1_NEXT "edgemoe.path1.next"       /* i64 [N * top]: most probable first */
#define MOE_TUNING_PATH1_PROB "edgemoe.path1.prob"       /* f64 [N * top]: P(expert at l | key) */
#define MOE_TUNING_PATH2_KEY_LEN "edgemoe.path2.key_len"
#define MOE_TUNING_PATH2_TOP "edgemoe.path2.top"
#define MOE_TUNING_PATH2_LAYER "edgemoe.path2.layer"
#define MOE_TUNING_PATH2_KEYS "edgemoe.path2.keys"
#define MOE_TUNING_PATH2_TOTALS "edgemoe.path2.totals"
#define MOE_TUNING_PATH2_NEXT "edgemoe.path2.next"
#define MOE_TUNING_PATH2_PROB "edgemoe.path2.prob"

/* moe-prep profile (with a big-little pass): MoBiLE */
#define MOE_TUNING_MOBILE_GAMMA "mobile.gamma"                     /* f64: accept the little model when p >= gamma */
#define MOE_TUNING_MOBILE_TARGET_FALLBACK "mobile.target_fallback" /* f64: the fallback ratio gamma was chosen for */
#define MOE_TUNING_MOBILE_LITTLE_K "mobile.little_k"               /* i64: experts per token of the little model */

/* moe-prep fit-cache --fit-route: cache-aware routing (moe_store_params.route_margin) */
#define MOE_TUNING_ROUTE_MARGIN "cache_route.margin"     /* f64 in [0, 1]: the margin (0 = off) */
#define MOE_TUNING_ROUTE_TARGET "cache_route.target_mass" /* f64 >= 0: router probability per use it
                                                           * was allowed to give up on calibration */

/* moe-prep fit-cache: where dynamic precision stops paying (moe_store_params.dynamic = -1) */
#define MOE_TUNING_DYNAMIC_UNTIL "cache.dynamic_until" /* f64 in (0, 1]: from this share of the bytes of
                                                        * every expert's high copy up, keeping every byte as
                                                        * high copies (LRU) missed less than dynamic precision
                                                        * with the fitted policy, in fit-cache's replay */

/* moe-prep fit-cache: HOBBIT's cache-priority weights and what they were fitted for */
#define MOE_TUNING_CACHE_W_LRU "hobbit.cache.w_lru"                   /* f64: recency R/T */
#define MOE_TUNING_CACHE_W_LFU "hobbit.cache.w_lfu"                   /* f64: uses in the sequence F/T */
#define MOE_TUNING_CACHE_W_LHU "hobbit.cache.w_lhu"                   /* f64: high-need uses H/T */
#define MOE_TUNING_CACHE_W_FLD "hobbit.cache.w_fld"                   /* f64: the layer term */
#define MOE_TUNING_CACHE_W_POP "hobbit.cache.w_pop"                   /* f64: static popularity f (absent: 0) */
#define MOE_TUNING_CACHE_ADMIT "hobbit.cache.admit"                   /* i64: admission control 0/1 (absent: 0) */
#define MOE_TUNING_CACHE_FREQ_HIGH "hobbit.cache.freq_high"           /* f64 [L * E]: high-need uses per token */
#define MOE_TUNING_CACHE_FREQ_LOW "hobbit.cache.freq_low"             /* f64 [L * E]: low-need uses per token */
#define MOE_TUNING_CACHE_LOW_COST "hobbit.cache.low_cost"             /* f64: the low-miss cost of the fit */
#define MOE_TUNING_CACHE_HIGH_EXPERTS "hobbit.cache.high_experts"     /* i64: high-cache capacity */
#define MOE_TUNING_CACHE_LOW_EXPERTS "hobbit.cache.low_experts"       /* i64: low-cache capacity */
#define MOE_TUNING_CACHE_HIGH_PRECISION "hobbit.cache.high_precision" /* string: e.g. q8_0 */
#define MOE_TUNING_CACHE_LOW_PRECISION "hobbit.cache.low_precision"   /* string: e.g. q2_k */

/* moe-prep plan --apply: the engine settings chosen for a memory size; moe-run
 * starts from them unless --no-plan (every option still overrides) */
#define MOE_TUNING_PLAN_MEM "plan.mem"                 /* i64: the memory size planned for, bytes */
#define MOE_TUNING_PLAN_EXPERT_MEM "plan.expert_mem"   /* i64: bytes of expert copies (--expert-mem) */
#define MOE_TUNING_PLAN_HIGH "plan.high"               /* string: high copies' precision; "" = each expert's
                                                        * home precision (the bit-width map) */
#define MOE_TUNING_PLAN_LOW "plan.low"                 /* string: low copies' precision ("" with dynamic 0) */
#define MOE_TUNING_PLAN_DYNAMIC "plan.dynamic"         /* i64: HOBBIT dynamic precision 0/1 */
#define MOE_TUNING_PLAN_LOW_SHARE "plan.low_share"     /* f64: share of expert_mem for low copies */
#define MOE_TUNING_PLAN_T1 "plan.t1"                   /* f64 */
#define MOE_TUNING_PLAN_T2 "plan.t2"                   /* f64 */
#define MOE_TUNING_PLAN_POLICY "plan.policy"           /* string: a cache policy name (moe-cache.h) */
#define MOE_TUNING_PLAN_PREFETCH_PATHS "plan.prefetch_paths" /* i64: EdgeMoE path prefetch, experts per layer */
#define MOE_TUNING_PLAN_LITTLE_K "plan.little_k"       /* i64: big-little's little model; 0 = off */
#define MOE_TUNING_PLAN_GAMMA "plan.gamma"             /* f64 */
#define MOE_TUNING_PLAN_THREADS "plan.threads"         /* i64: CPU threads the speed was predicted for */
#define MOE_TUNING_PLAN_TOK_S "plan.predicted_tok_s"   /* f64: predicted decode tokens/s */
#define MOE_TUNING_PLAN_BYTES "plan.predicted_bytes_per_token" /* f64: predicted bytes read per token */
#define MOE_TUNING_PLAN_QUALITY "plan.quality_cost"    /* f64: PPL / PPL(all experts, high) - 1; NaN unmeasured */

/* moe-prep bitwidth: EdgeMoE's per-expert bit-widths (model layers) and the search's figures */
/* i64 [n_layer * E]: precision index, -1 (also defined, identically, in moe-model.h for now) */
#define MOE_TUNING_BITWIDTH_MAP "edgemoe.bitwidth.map"
#define MOE_TUNING_BITWIDTH_LOSS "edgemoe.bitwidth.loss"                 /* f64 */
#define MOE_TUNING_BITWIDTH_HELDOUT_LOSS "edgemoe.bitwidth.heldout_loss" /* f64, NaN without held-out text */
#define MOE_TUNING_BITWIDTH_MAX_LOSS "edgemoe.bitwidth.max_loss"         /* f64, -1: not that kind of budget */
#define MOE_TUNING_BITWIDTH_MAX_BYTES "edgemoe.bitwidth.max_bytes"       /* i64, 0: not that kind of budget */
#define MOE_TUNING_BITWIDTH_EXPERT_BYTES "edgemoe.bitwidth.expert_bytes" /* i64 */
#define MOE_TUNING_BITWIDTH_DATASET "edgemoe.bitwidth.dataset"           /* string: the search text */

/* An applied plan (the plan.* keys). Strings are copied (fixed sizes). */
struct moe_tuning_plan {
    int64_t mem, expert_mem;
    char high[32], low[32], policy[16]; /* high "": the bit-width map */
    int dynamic;
    double low_share, t1, t2;
    int prefetch_paths;
    int little_k;                       /* 0: big-little off */
    double gamma;
    int threads;
    double tok_s, bytes_per_token, quality;
};

/* moe_tuning_cache_weight_key: the key of HOBBIT cache weight i (the order of
 * moe_cache_config.w); NULL out of range. */
const char *moe_tuning_cache_weight_key(int i);

/* moe_tuning_path_key: the key of path-dictionary field `field` ("key_len",
 * "top", "layer", "keys", "totals", "next", "prob") of order 1 or 2; NULL
 * for anything else. */
const char *moe_tuning_path_key(int order, const char *field);

/* ---- reading ---- */

/* What the runtime uses, checked. Each group has a has_* flag: 0 when its
 * keys are absent, or malformed (a warning says which key and why). Arrays
 * and strings are borrowed from the KV set passed to moe_tuning_read: valid
 * until it is freed (for a bundle's tuning: until moe_bundle_free). */
struct moe_tuning {
    int has_thresholds;              /* hobbit.t1, hobbit.t2: 0 <= t1 <= t2 <= 1 */
    double t1, t2;
    int has_targets;                 /* hobbit.target_low / target_skip: each in [0, 1], sum <= 1 */
    double target_low, target_skip;
    int has_cache_weights;           /* hobbit.cache.w_*: finite, >= 0, summing to 1 within 1e-6
                                      * (w_pop absent, as written before it existed: 0) */
    double cache_w[MOE_CACHE_N_WEIGHTS];
    int cache_admit;                 /* hobbit.cache.admit: 0 or 1 (moe_cache_config.admit) */
    int has_cache_sizes;             /* hobbit.cache.high/low_experts: 0..n_layers * n_experts */
    int cache_high_experts, cache_low_experts;
    int has_cache_popularity;        /* hobbit.cache.freq_high/freq_low [L * E] in [0, 1], low_cost >= 0:
                                      * moe_cache_config.freq_high / freq_low / low_cost */
    const double *cache_freq_high, *cache_freq_low;
    double cache_low_cost;
    int has_cache_precisions;        /* hobbit.cache.high/low_precision: non-empty names */
    const char *cache_high_precision, *cache_low_precision;
    int has_placement_order;         /* twiddler.placement_order: a permutation of [0, L * E) */
    const int64_t *placement_order;  /* [n_layers * n_experts] MoE layer * E + expert, most used first */
    int has_bitwidth_map;            /* edgemoe.bitwidth.map: rows of -1 or of 0..15, n_layers expert rows */
    const int64_t *bitwidth_map;     /* [bitwidth_layers * n_experts], by model layer */
    int bitwidth_layers;             /* model layers the map covers */
    int has_gamma;                   /* mobile.gamma in [0, 1], mobile.little_k in [1, n_experts] */
    double gamma;
    int little_k;
    double target_fallback;          /* mobile.target_fallback in [0, 1]; NaN when absent or bad */
    int has_plan;                    /* plan.*: expert_mem > 0, names that fit, shares and thresholds in
                                      * [0, 1], t1 <= t2, policy a known name, little_k in [0, E],
                                      * gamma in [0, 1], counts >= 0 */
    struct moe_tuning_plan plan;
    int has_route_margin;            /* cache_route.margin in [0, 1] */
    double route_margin;
    double route_target;             /* cache_route.target_mass >= 0; NaN when absent or bad */
    double dynamic_until;            /* cache.dynamic_until in (0, 1]; NaN when absent or bad */
};

/* moe_tuning_read: fill *out from the tuning KV set kv (NULL = empty) of a
 * model with n_layers MoE layers (layers with routed experts) of n_experts
 * each. Absent keys leave their group's has_* at 0 silently; a present but
 * malformed group (wrong type, shape, range, or an incomplete group) is
 * logged as a warning naming the key and left at 0. Returns MOE_OK,
 * MOE_ERR_INVALID (logged) for bad arguments (out NULL, counts < 1), or
 * MOE_ERR_NOMEM (logged; checking the placement order needs L * E bytes). */
enum moe_status moe_tuning_read(const struct moe_bundle_kv *kv, int n_layers, int n_experts,
                                struct moe_tuning *out);

/* The cache core numbers experts over all model layers (moe-cache.h); the
 * tuning over MoE layers. These two convert for a cache of n_model_layers x
 * n_experts: moe_layer[i] is the model layer of MoE layer i (strictly
 * increasing, < n_model_layers; NULL: the same numbers, n_model_layers ==
 * n_layers). MOE_ERR_NOT_FOUND when t lacks the group, MOE_ERR_INVALID
 * (logged) for a bad layer map. */

/* moe_tuning_order_for_cache: the placement order as moe_cache_config.order
 * (out[n_model_layers * n_experts]: the MoE experts in the tuning's order,
 * then those of layers without experts, never accessed). */
enum moe_status moe_tuning_order_for_cache(const struct moe_tuning *t, int n_layers, int n_experts,
                                           const int *moe_layer, int n_model_layers, int32_t *out);

/* moe_tuning_popularity_for_cache: the per-need shares as
 * moe_cache_config.freq_high / freq_low (each [n_model_layers * n_experts],
 * 0 for layers without experts). */
enum moe_status moe_tuning_popularity_for_cache(const struct moe_tuning *t, int n_layers, int n_experts,
                                                const int *moe_layer, int n_model_layers, double *freq_high,
                                                double *freq_low);

/* ---- writing (the tools) ---- */

/* Each writer sets its group's keys into kv (other keys stay) and returns
 * the first error of moe_bundle_kv_set_* (the set may then hold part of the
 * group), MOE_ERR_INVALID for arguments that moe_tuning_read would refuse
 * (logged; nothing set). */

/* moe_tuning_set_profile: profile.dataset, profile.tokens, profile.tool_version. */
enum moe_status moe_tuning_set_profile(struct moe_bundle_kv *kv, const char *dataset, int64_t tokens,
                                       const char *tool_version);

/* moe_tuning_set_thresholds: hobbit.t1, t2, target_low, target_skip. */
enum moe_status moe_tuning_set_thresholds(struct moe_bundle_kv *kv, double t1, double t2, double target_low,
                                          double target_skip);

/* moe_tuning_set_placement_order: twiddler.placement_order from order[n]. */
enum moe_status moe_tuning_set_placement_order(struct moe_bundle_kv *kv, const int32_t *order, size_t n);

/* moe_tuning_set_paths: the order-`order` path dictionary: n entries of
 * layer[n], keys[n * key_len], totals[n], next[n * top], prob[n * top]
 * (layout of the keys above). */
enum moe_status moe_tuning_set_paths(struct moe_bundle_kv *kv, int order, int key_len, int top, size_t n,
                                     const int64_t *layer, const int64_t *keys, const int64_t *totals,
                                     const int64_t *next, const double *prob);

/* moe_tuning_set_big_little: mobile.gamma, target_fallback, little_k. */
enum moe_status moe_tuning_set_big_little(struct moe_bundle_kv *kv, double gamma, double target_fallback,
                                          int little_k);

/* moe_tuning_set_cache_route: cache_route.margin (in [0, 1]) and the
 * probability mass per use it was fitted for (>= 0, or NaN: not written).
 * MOE_ERR_INVALID (logged) out of range. */
enum moe_status moe_tuning_set_cache_route(struct moe_bundle_kv *kv, double margin, double target_mass);

/* moe_tuning_set_dynamic_until: cache.dynamic_until (a share in (0, 1]), or
 * removes it when `share` is NaN (dynamic precision paid at every size
 * replayed). MOE_ERR_INVALID (logged) for a share out of range. */
enum moe_status moe_tuning_set_dynamic_until(struct moe_bundle_kv *kv, double share);

/* moe_tuning_remove_big_little: drops the mobile.* keys (a profile without a
 * big-little pass must not leave a stale gamma). */
void moe_tuning_remove_big_little(struct moe_bundle_kv *kv);

/* moe_tuning_set_plan: the plan.* keys from *p (what moe_tuning_read accepts). */
enum moe_status moe_tuning_set_plan(struct moe_bundle_kv *kv, const struct moe_tuning_plan *p);

/* moe_tuning_remove_plan: drops the plan.* keys. */
void moe_tuning_remove_plan(struct moe_bundle_kv *kv);

/* moe_tuning_set_cache: hobbit.cache.w_* (w in the order of
 * moe_cache_config.w), admit, high/low_experts and high/low_precision. */
enum moe_status moe_tuning_set_cache(struct moe_bundle_kv *kv, const double w[MOE_CACHE_N_WEIGHTS], int admit,
                                     int high_experts, int low_experts, const char *high_precision,
                                     const char *low_precision);

/* moe_tuning_set_cache_popularity: hobbit.cache.freq_high, freq_low (n
 * each) and low_cost: the per-need token shares and low-miss cost the
 * popularity term was fitted with. */
enum moe_status moe_tuning_set_cache_popularity(struct moe_bundle_kv *kv, const double *freq_high,
                                                const double *freq_low, size_t n, double low_cost);

/* moe_tuning_set_bitwidth: edgemoe.bitwidth.map from map[n] and the
 * search's figures. */
enum moe_status moe_tuning_set_bitwidth(struct moe_bundle_kv *kv, const int64_t *map, size_t n, double loss,
                                        double heldout_loss, double max_loss, int64_t max_bytes,
                                        int64_t expert_bytes, const char *dataset);

/* ---- EdgeMoE's path dictionary for prefetching ---- */

struct moe_path_table; /* opaque, immutable once built */

/* moe_path_table_from_tuning: the order-`order` (1 or 2) path dictionary of
 * the tuning kv for a model of n_layers MoE layers x n_experts, top-k.
 * Errors: MOE_ERR_NOT_FOUND (no edgemoe.path<order>.* keys; not logged),
 * MOE_ERR_FORMAT (keys present but malformed: wrong type, shape, an id out of
 * range, an unsorted or duplicate key; a warning says which),
 * MOE_ERR_INVALID (bad arguments), MOE_ERR_NOMEM. */
enum moe_status moe_path_table_from_tuning(const struct moe_bundle_kv *kv, int order, int n_layers, int n_experts,
                                           int k, struct moe_path_table **out);

/* moe_path_table_lookup: the experts of MoE layer `layer` most likely to be
 * chosen given prev[order * k], the experts the router chose at MoE layers
 * layer-order .. layer-1 (earlier layer first, each layer's k in any order,
 * e.g. rank order): up to m of them into out[m], most probable first (ties:
 * lower id), only those with probability > 0. Returns how many (0: the key
 * is not in the dictionary, layer < order, or bad arguments). */
int moe_path_table_lookup(const struct moe_path_table *t, int layer, const int32_t *prev, int m, int32_t *out);

/* moe_path_table_entries: entries (layer, key) the table holds. */
size_t moe_path_table_entries(const struct moe_path_table *t);

/* moe_path_table_free: NULL is a no-op. */
void moe_path_table_free(struct moe_path_table *t);

#ifdef __cplusplus
}
#endif
#endif

/*
 * profile-results.h - what `moe-prep profile` and `moe-prep profile merge`
 * derive from a routing profile, and how they show it: the summary, JSON, CSV
 * files and the bundle's tuning section.
 *
 * The derivation reads only the profile: its trace, its counts and the sums
 * the recorder stored as "sum.*" derived arrays (those merge by addition, see
 * profile-h5.h). So a profile merged from shards derives the same results as
 * one recorded in a single run. Formulas: ../shared/papers/ALGORITHMS.md.
 *
 * Derived arrays (L = MoE layers, K = experts per token, E = experts per
 * layer; "all" = every token, "held-out" = the last `heldout` share of the
 * sequences, with counts taken on the others):
 *
 *   written by the recorder (profile-record.c), read here:
 *   config.record        i64 [4]   ctx, big-little sampling period (every Nth
 *                                  sequence; 0 = off), experts per token of the
 *                                  little model, stacked-gate distances (4)
 *   sum.pearson          f64 [6]   n, sum g, sum y, sum g^2, sum y^2, sum g y
 *                                  over every routed (layer, expert, token) with
 *                                  g the gate weight and y = ||g E(x)||
 *   sum.stacked          f64 [L x 4 x 4] per MoE layer l and distance j: sum
 *                                  of the cosine of the gate inputs of l and
 *                                  l+j, tokens whose predicted top-1 was chosen,
 *                                  sum of the top-K recall, tokens counted
 *   sum.big_little_maxprob i64 [2 x 1000] the little model's largest output
 *                                  probability p, bin floor(1000 p) (clamped);
 *                                  row 0: its top token is the big model's,
 *                                  row 1: it is not
 *   shard                i64 [3]   first sequence, end sequence, sequences of
 *                                  the whole run (merge joins adjacent ranges)
 *
 *   written by moe_profile_derive:
 *   targets              f64 [4]   target low share, target skip share,
 *                                  held-out share, target fallback ratio
 *   placement_order      i32 [L*E] layer*E + expert, most used first (all)
 *   placement_hit_rate   f64 [3 x 3] rows: 25, 50, 75 % of the pairs resident;
 *                                  columns: fraction resident, hit rate on the
 *                                  held-out sequences of the order counted on
 *                                  the others, random expectation
 *   hobbit_thresholds    f64 [5]   T1, T2, high, low, skip shares (all)
 *   gate_output_pearson  f64 [1]   Pearson r of g and ||g E(x)||
 *   layer_similarity     f64 [L x 4] mean cosine of the gate inputs of MoE
 *                                  layer l and model layer l+j (column j-1);
 *                                  NaN where model layer l+j is dense or absent
 *   stacked_top1         f64 [L x 4] share of tokens whose predicted top-1 at
 *                                  l+j (top-K of the router of l+j applied to
 *                                  the gate input of l) was chosen there
 *   stacked_recall       f64 [L x 4] mean |predicted top-K & actual| / K
 *   path_accuracy_order1 f64 [2 x 3] row 0: dictionary keyed on l-1, recall
 *                                  with 1, 2, 3 experts preloaded; row 1:
 *                                  preloading the 1..3 most popular (held-out)
 *   path_accuracy_order2 f64 [2 x 3] the same keyed on (l-2, l-1)
 *   path_key_coverage    f64 [2]   share of held-out (token, layer) keys seen
 *   reuse                f64 [L x K] share of tokens whose expert at rank r
 *                                  is used again by the next token
 *   reuse_chance         f64 [1]   K / E
 *   split_sequences      i64 [2]   sequences counted, sequences held out
 *   big_little           f64 [19 x 3] gamma = 0.05 .. 0.95, fallback ratio
 *                                  (share of tokens with p < gamma), agreement
 *                                  of the combined output (little token when
 *                                  p >= gamma, else the big one) with the big
 *                                  model's top token
 *   big_little_summary   f64 [5]   agreement of the little model alone,
 *                                  suggested gamma, its fallback ratio, its
 *                                  agreement, experts per token of the little
 *                                  model
 * NaN marks a value that the data cannot give (no held-out part, no tokens).
 */
#ifndef MOE_PROFILE_RESULTS_H
#define MOE_PROFILE_RESULTS_H

#include <stdint.h>
#include <stdio.h>

#include "moe-bundle.h"
#include "moe-status.h"
#include "profile-h5.h"
#include "routing-stats.h"

#define MOE_PROFILE_MAX_DIST 4    /* stacked-gate distances j = 1..4 */
#define MOE_PROFILE_BL_BINS 1000  /* bins of sum.big_little_maxprob */
#define MOE_PROFILE_BL_GAMMAS 19  /* rows of big_little: gamma = 0.05 i */

/* The targets a derivation aims at. */
struct moe_profile_targets {
    double low, skip;  /* HOBBIT: shares of low-precision and skipped loads */
    double heldout;    /* share of the last sequences held out, in [0, 0.9] */
    double fallback;   /* MoBiLE: fallback ratio the suggested gamma gives */
};

/* moe_profile_default_targets: low 0.30, skip 0.03, heldout 0.2, fallback 0.2. */
struct moe_profile_targets moe_profile_default_targets(void);

/* Everything derived, for printing. Owns its arrays: moe_profile_results_free. */
struct moe_profile_results {
    int L, E, K;
    struct moe_profile_targets targets;
    int n_train, n_held;           /* sequences counted / held out */
    double hit[3][3];              /* as placement_hit_rate */
    struct moe_hobbit_split split;
    double pearson;
    double *sim, *top1, *recall;   /* [L x MOE_PROFILE_MAX_DIST] */
    double path[2][2][3];          /* [order-1][dict | popular][preload-1] */
    double coverage[2];
    double *reuse;                 /* [L x K] */
    double reuse_chance;
    int little_k;                  /* 0: no big-little pass in the profile */
    int64_t bl_tokens;             /* tokens of the big-little pass */
    double bl[MOE_PROFILE_BL_GAMMAS][3];
    double bl_little_agree, bl_gamma, bl_fallback, bl_agree;
    int64_t shard[3];              /* first, end, total sequences */
};

/* moe_profile_derive: compute every derived result from p (trace, counts,
 * sum.* arrays), store them in p as derived arrays (above) and fill r. The
 * sum.* arrays are optional: results that need a missing one are NaN (and
 * little_k 0). Errors: MOE_ERR_NOMEM; MOE_ERR_SHAPE if a sum.* or config.*
 * array has the wrong shape; MOE_ERR_INVALID for targets out of range. */
enum moe_status moe_profile_derive(struct moe_profile *p, const struct moe_profile_targets *t,
                                   struct moe_profile_results *r);

/* moe_profile_results_free: frees r's arrays (r itself is the caller's). */
void moe_profile_results_free(struct moe_profile_results *r);

/* moe_profile_results_mean_col: mean over the layers of column j of a [L x w]
 * array, skipping NaN; NaN if none. */
double moe_profile_results_mean_col(const double *x, int L, int w, int j);

/* What the printers name. */
struct moe_profile_labels {
    const char *model, *dataset, *out; /* as the user gave them */
    int n_ctx;                         /* 0 = unknown */
    double seconds;                    /* < 0 = unknown */
};

/* moe_profile_print_summary: the human-readable summary. */
void moe_profile_print_summary(FILE *f, const struct moe_profile *p, const struct moe_profile_results *r,
                               const struct moe_profile_labels *lb);

/* moe_profile_results_json: the summary as a cJSON tree (caller frees with
 * cJSON_Delete; NULL when out of memory): model, dataset, out, arch, the
 * shape and sequence counts, shard, seconds, hobbit {t1, t2, high, low, skip,
 * target_low, target_skip}, gate_output_pearson, top_experts, placement,
 * stacked, paths, reuse, reuse_chance and big_little (null without the
 * pass); values that are not finite are null. docs/cli.md lists the keys. */
struct cJSON *moe_profile_results_json(const struct moe_profile *p, const struct moe_profile_results *r,
                                       const struct moe_profile_labels *lb);

/* moe_profile_print_json: that tree printed to f, and a newline.
 * MOE_ERR_NOMEM when it cannot be built. */
enum moe_status moe_profile_print_json(FILE *f, const struct moe_profile *p, const struct moe_profile_results *r,
                                       const struct moe_profile_labels *lb);

/* moe_profile_write_csv: summaries as CSV files in dir (created if missing):
 * popularity.csv, placement.csv, hobbit.csv, hobbit_hist.csv, stacked.csv,
 * paths.csv, reuse.csv, big_little.csv. Each is written to a temporary file
 * and renamed. MOE_ERR_IO (logged) on failure. */
enum moe_status moe_profile_write_csv(const char *dir, const struct moe_profile *p,
                                      const struct moe_profile_results *r);

/* moe_profile_tuning_paths: EdgeMoE's order-`order` (1 or 2) activation-path
 * dictionary counted over trace t, as the edgemoe.path<order>.* tuning keys
 * (moe-tuning.h) set into kv: per MoE layer the keys seen at least twice (at
 * most 4096 per layer, most frequent first) with their max(3, K) most
 * probable experts (capped at E). What moe_profile_write_tuning writes;
 * moe_path_table_from_tuning reads it back. */
enum moe_status moe_profile_tuning_paths(struct moe_bundle_kv *kv, const struct moe_trace *t, int order);

/* moe_profile_write_tuning: write the runtime-relevant results into the
 * tuning section of the bundle at `bundle` (moe_bundle_replace_tuning:
 * crash-safe, expert data untouched), keeping the keys other stages wrote.
 * Keys (docs/format.md, "Tuning keys"): profile.*, hobbit.t1/t2,
 * twiddler.placement_order, edgemoe.path1.* and edgemoe.path2.*, mobile.*.
 * The bundle must describe the same model shape (MOE_ERR_INVALID otherwise).
 * *n_keys (may be NULL) receives the number of keys written. */
enum moe_status moe_profile_write_tuning(const char *bundle, const struct moe_profile *p,
                                         const struct moe_profile_results *r, int *n_keys);

/* What moe_profile_finish writes besides the profile. */
struct moe_profile_outputs {
    const char *out;           /* the profile file (replaced atomically) */
    const char *csv_dir;       /* CSV summaries (moe_profile_write_csv), NULL = none */
    const char *tuning_bundle; /* bundle whose tuning gets the results, NULL = none */
    int json;                  /* summary as JSON (else the text summary) */
};

/* moe_profile_finish: what `moe-prep profile` and `profile merge` do once
 * they hold a profile: derive the results (moe_profile_derive with t), write
 * the profile, the CSV files and the tuning, and print the summary to stdout
 * and what was written to stderr. cmd names the command in messages
 * ("profile", "profile merge"). Returns the exit status: 0 ok, 1 failure
 * (explained on stderr). */
int moe_profile_finish(struct moe_profile *p, const struct moe_profile_targets *t, const struct moe_profile_outputs *o,
                       const struct moe_profile_labels *lb, const char *cmd);

#endif

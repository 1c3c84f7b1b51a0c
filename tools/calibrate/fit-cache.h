/*
 * fit-cache.h - fit-cache as library calls: from a bundle and its profile,
 * the cache sizes to study, HOBBIT's priority fitted on the fit part of the
 * sequences (cache-sim.h) and every policy replayed on the held-out part at
 * each size against the offline optimum there (cache-opt.h), then the
 * results written where moe-run and the report read them. docs/cache-sim.md describes the model, the policies and the outputs.
 *
 *     struct moe_fit_cache_params fp = moe_fit_cache_default_params();
 *     fp.cache_high = 8, fp.cache_low = 4;
 *     struct moe_fit_cache_model m;
 *     struct moe_fit_cache_result *r = NULL;
 *     if (!moe_fit_cache_model_init(b, "m.moeb", p, "p.h5", &fp, &m) &&
 *         !moe_fit_cache_result_new(&m, &r) && !moe_fit_cache_plan(&fp, &m, r) &&
 *         !moe_fit_cache_sweep(&fp, p, &m, r))
 *         ... r->sizes[s].st[policy] ...
 *     moe_fit_cache_result_free(r);
 *
 * Errors are logged through moe_log (naming the parameter as the CLI option
 * that sets it, e.g. "--sizes"). MOE_ERR_INVALID always means parameters
 * that do not fit this bundle or profile (the CLI's usage error); any other
 * code is a failure of the data or the system.
 *
 * Threads: a result belongs to one thread; the calls keep no global state
 * (the files are read and written by the caller's thread).
 */
#ifndef MOE_FIT_CACHE_H
#define MOE_FIT_CACHE_H

#include <stdint.h>

#include "cache-opt.h"
#include "cache-sim.h"
#include "moe-bundle.h"
#include "moe-status.h"
#include "profile-h5.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_FIT_CACHE_MAX_SIZES 64 /* cache sizes of one sweep (the given ones, at most 60, plus planned) */

/* What the sweep reports on its way (the fit takes long on a big model). */
enum moe_fit_cache_stage {
    MOE_FIT_CACHE_FIT_START, /* the fit at the primary size begins: n_fit, accesses, hi, lo */
    MOE_FIT_CACHE_FIT_SIZE,  /* a fit at another size begins: hi, lo */
    MOE_FIT_CACHE_FIT_STEP,  /* done of total grid points (done > total: refining), seconds */
    MOE_FIT_CACHE_OPT,       /* the offline optimum at a size begins: hi, lo, accesses */
};

struct moe_fit_cache_event {
    enum moe_fit_cache_stage stage;
    int n_fit, hi, lo, done, total;
    int64_t accesses;
    double seconds; /* since the primary fit began */
};

struct moe_fit_cache_params {
    const char *high, *low;       /* precision names; NULL = most / fewest bytes per expert */
    double fast_mem;              /* bytes of fast memory split by low_share; < 0: use cache_high/low */
    long long cache_high, cache_low; /* the capacities directly (experts) when fast_mem < 0 */
    double low_share;             /* share of fast_mem for the low cache (default 0.25) */
    double heldout;               /* share of sequences held out, every k-th (default 0.3) */
    double t1, t2;                /* HOBBIT thresholds; < 0: the profile's, else the bundle's, else 1 */
    double low_cost;              /* penalty of a low miss; < 0: low / high blob bytes */
    long long sizes[MOE_FIT_CACHE_MAX_SIZES - 4]; /* high capacities of the table; n_sizes 0: 25/50/75 % */
    int n_sizes;
    int prompt_len;               /* tokens of each sequence replayed as one batch */
    int prefetch, path_order;     /* EdgeMoE path prefetch of the M most probable, keyed on 1 or 2 layers */
    int fit_per_size;             /* fit again at each size (default 1) */
    int paper;                    /* the paper's four weights, no admission control */
    int opt_iters;                /* offline optimum: subgradient iterations per size (0: the
                                   * closed-form bound only; cache-opt.h) */
    double opt_seconds;           /* and its time limit per size (<= 0: none) */
    void (*progress)(const struct moe_fit_cache_event *ev, void *user); /* may be NULL */
    void *user;
};

/* moe_fit_cache_default_params: nothing sized yet (fast_mem and cache_high
 * < 0: set one), low share 0.25, held-out 0.3, t1/t2/low_cost from the files,
 * path order 2, a fit per size, the offline optimum's defaults (5000
 * iterations, 20 s per size). */
struct moe_fit_cache_params moe_fit_cache_default_params(void);

/* What the sweep works with, from the bundle and the profile. */
struct moe_fit_cache_model {
    int L, E, K, LE;
    uint32_t hi_prec, lo_prec;
    char hi_name[MOE_BUNDLE_MAX_PRECISION_NAME + 1], lo_name[MOE_BUNDLE_MAX_PRECISION_NAME + 1];
    double hi_bytes, lo_bytes;   /* raw blob bytes of one expert */
    double hi_stored, lo_stored; /* stored (on-disk) bytes, mean over the experts */
    double low_cost;
    double t1, t2;
    const char *t_source;        /* "option", "profile", "bundle" or "default" (static strings) */
};

/* moe_fit_cache_model_init: check that bundle b (named bundle_name in
 * messages) holds the profile's MoE layers and experts (MOE_ERR_SHAPE, saying
 * what to do, otherwise), pick the two precisions (MOE_ERR_INVALID for an
 * unknown name; MOE_ERR_FORMAT when an expert cannot be located) and the
 * thresholds (MOE_ERR_INVALID when T1 exceeds T2). Both are only read. */
enum moe_status moe_fit_cache_model_init(const struct moe_bundle *b, const char *bundle_name,
                                         const struct moe_profile *p, const char *profile_name,
                                         const struct moe_fit_cache_params *fp, struct moe_fit_cache_model *m);

/* One cache size of the table and its results per policy. */
struct moe_fit_cache_size {
    int hi, lo, primary;
    double w[MOE_CACHE_N_WEIGHTS]; /* HOBBIT weights used at this size */
    int admit;                     /* and its admission control */
    struct moe_cache_stats st[MOE_CACHE_N_POLICIES];
    struct moe_cache_opt_result opt; /* the offline optimum of the held-out part (penalties, not per token) */
};

/* Dynamic precision against every byte as high copies, at one budget (the
 * held-out part): the fitted HOBBIT policy with the budget split by
 * low_share into high and low caches, against LRU with every byte as high
 * copies and every access needing one (dynamic precision off). */
#define MOE_FIT_CACHE_DYN_POINTS 20
struct moe_fit_cache_dyn {
    double share;            /* the budget: this share of the bytes of every expert's high copy */
    int hi_on, lo_on, hi_off; /* the caches each way */
    double pen_on, pen_off;  /* miss penalty per token (high-copy reads) */
};

/* What a sweep computed. */
struct moe_fit_cache_result {
    int H, Lc;                    /* the primary (fitted) size: high and low experts */
    int n_seq, n_fit, n_held, in_sample; /* in_sample: nothing held out, the table is on the fit part */
    int64_t fit_tokens, held_tokens;
    double w[MOE_CACHE_N_WEIGHTS];
    int admit;
    double *freq_high, *freq_low; /* [L*E] need shares of the fit part (HOBBIT's w_pop) */
    struct moe_cache_stats fit_best, fit_single[MOE_CACHE_N_POLICIES];
    int evals;
    double fit_seconds;
    int n_sizes;
    struct moe_fit_cache_size sizes[MOE_FIT_CACHE_MAX_SIZES]; /* by high capacity */
    int n_dyn;                    /* budgets 5 %, 10 %, ... 100 % of the high bytes where both caches serve a layer */
    struct moe_fit_cache_dyn dyn[MOE_FIT_CACHE_DYN_POINTS];
    double dynamic_until;         /* the smallest share from which LRU on high copies misses less at every
                                   * budget replayed (tuning cache.dynamic_until); NaN: dynamic precision
                                   * paid up to the last one */
};

/* moe_fit_cache_result_new / _free: an empty result for model m (the caller
 * frees it; free(NULL) is a no-op). MOE_ERR_NOMEM. */
enum moe_status moe_fit_cache_result_new(const struct moe_fit_cache_model *m, struct moe_fit_cache_result **out);
void moe_fit_cache_result_free(struct moe_fit_cache_result *r);

/* moe_fit_cache_plan: the primary size (fast_mem split by low_share with the
 * real blob sizes, or cache_high/low) and the sizes of the table (the given
 * ones, the low cache scaled by the primary ratio, else 25, 50, 75 % of all
 * experts) into r, sorted by high capacity. Every error is MOE_ERR_INVALID: a
 * budget that holds no high-precision expert, capacities or sizes above the
 * model's experts, a prefetch wider than a layer. */
enum moe_status moe_fit_cache_plan(const struct moe_fit_cache_params *fp, const struct moe_fit_cache_model *m,
                                   struct moe_fit_cache_result *r);

/* moe_fit_cache_sweep: split the sequences (every k-th held out), fit
 * HOBBIT's weights on the fit part at the primary size (and at every size
 * with fit_per_size), replay every policy on the fit part at the primary size
 * and on the held-out part at each size of r, and bound the offline optimum
 * of the held-out part at each size (moe_cache_opt_solve, given the best
 * replayed policy that does not prefetch as a known schedule). p is only read. Errors:
 * MOE_ERR_NOT_FOUND when the profile holds no tokens to replay, the
 * simulator's errors (bad traces), MOE_ERR_NOMEM. */
enum moe_status moe_fit_cache_sweep(const struct moe_fit_cache_params *fp, const struct moe_profile *p,
                                    const struct moe_fit_cache_model *m, struct moe_fit_cache_result *r);

/* moe_fit_cache_update_profile: the cache.* arrays (docs/cache-sim.md) into
 * p, then p written atomically to path (unchanged on failure). */
enum moe_status moe_fit_cache_update_profile(struct moe_profile *p, const char *path,
                                             const struct moe_fit_cache_params *fp,
                                             const struct moe_fit_cache_model *m,
                                             const struct moe_fit_cache_result *r);

/* moe_fit_cache_write_tuning: the primary size's weights, the sizes and the
 * popularity term's shares (hobbit.cache.*) into the tuning section of the
 * bundle at path, keeping its other keys (moe_bundle_replace_tuning: crash
 * safe). The bundle must not be open for writing elsewhere. *n_keys: the
 * keys the section holds afterwards. */
enum moe_status moe_fit_cache_write_tuning(const char *path, const struct moe_fit_cache_model *m,
                                           const struct moe_fit_cache_result *r, int *n_keys);

/* moe_fit_cache_per_token: x / the tokens of s; NaN without tokens. */
double moe_fit_cache_per_token(double x, const struct moe_cache_stats *s);

/* moe_fit_cache_gap: policy q's penalty above the offline optimum's lower
 * bound at size z (z->opt.lower), in percent; NaN when the bound is 0. A
 * policy that does not prefetch is never below it (>= 0 up to rounding). */
double moe_fit_cache_gap(const struct moe_fit_cache_size *z, int q);

/* moe_fit_cache_gap_belady: policy q's penalty above Belady's at size z, in
 * percent; NaN when Belady's is 0. With two precisions Belady is a heuristic,
 * not a bound: this gap can be negative. */
double moe_fit_cache_gap_belady(const struct moe_fit_cache_size *z, int q);

/* moe_fit_cache_best_single: the online policy (not HOBBIT, not Belady)
 * with the lowest penalty in st[MOE_CACHE_N_POLICIES]. */
int moe_fit_cache_best_single(const struct moe_cache_stats *st);

#ifdef __cplusplus
}
#endif

#endif

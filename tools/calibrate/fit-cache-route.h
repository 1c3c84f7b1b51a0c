/*
 * fit-cache-route.h - `moe-prep fit-cache --fit-route`: the margin of
 * cache-aware routing (moe_store_params.route_margin, moe_cache_route_pick)
 * fitted on calibration data: the profile's sequences (with their router
 * logits: `moe-prep profile --router-logits f16`) are decoded one token at a
 * time through the cache core at the fitted size and policy, with the
 * substitution rule applied at each margin of a grid; the fitted margin is
 * the largest whose router probability given up per expert use stays within
 * a target. Measured in docs/benchmarks.md, "Issue 31, items 3-4".
 */
#ifndef MOE_FIT_CACHE_ROUTE_H
#define MOE_FIT_CACHE_ROUTE_H

#include "fit-cache.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_FIT_ROUTE_MAX_POINTS 16
#define MOE_FIT_ROUTE_DEFAULT_TARGET 0.001 /* probability per expert use (see docs/benchmarks.md) */

/* One margin replayed. */
struct moe_fit_route_point {
    double margin;
    double loads_per_token;   /* high + low misses per token */
    double bytes_per_token;   /* stored bytes read per token */
    double subst_share;       /* share of expert uses replaced */
    double mass_per_use;      /* router probability given up per expert use */
};

struct moe_fit_route_result {
    int n_points;
    struct moe_fit_route_point pts[MOE_FIT_ROUTE_MAX_POINTS]; /* pts[0]: margin 0 (off) */
    double target;            /* the mass per use allowed */
    double margin;            /* the fitted margin (0: none within the target) */
    int64_t tokens;           /* tokens replayed */
};

/* moe_fit_cache_route: replay p's sequences (every token a decode step)
 * through the cache core at r's primary size (r->H, r->Lc) with HOBBIT's
 * fitted weights (r->w, r->admit, r->freq_high/low) and m's thresholds, for
 * each margin of the grid (0 .. 0.2), and choose the largest margin whose
 * mass per use is <= target. MOE_ERR_NOT_FOUND (logged) when the profile
 * keeps no router logits; MOE_ERR_INVALID (logged) for a target < 0. */
enum moe_status moe_fit_cache_route(const struct moe_profile *p, const struct moe_fit_cache_model *m,
                                    const struct moe_fit_cache_result *r, double target,
                                    struct moe_fit_route_result *out);

/* moe_fit_cache_route_write: the fitted margin (and its target) into the
 * bundle's tuning at path (moe_tuning_set_cache_route, crash-safe). */
enum moe_status moe_fit_cache_route_write(const char *path, const struct moe_fit_route_result *res);

#ifdef __cplusplus
}
#endif
#endif

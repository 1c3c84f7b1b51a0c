/*
 * cache-opt.h - the offline optimum of the two-precision expert cache: the
 * least miss penalty any demand policy can reach on a prepared trace
 * (cache-sim.h), as a proven lower bound, the best schedule found, and
 * whether the two meet (then the schedule is optimal).
 *
 * The problem is the store's (docs/cache-sim.md, "The offline optimum"): a
 * high cache of high_cap copies and a low cache of low_cap copies, empty at
 * the start; an access is served by a cached high copy (any need), else by
 * a cached low copy (need low or skip), else a skip costs nothing, a high
 * need misses (penalty 1) and may keep the loaded high copy, a low need
 * misses (penalty low_cost) and may keep the loaded low copy; any copy may
 * be evicted at any time. Every policy of the cache core that does not
 * prefetch (LRU, the LFUs, LHU, FLD, EdgeMoE, Twiddler, HOBBIT with or
 * without admission control, Belady) is such a policy, so none of them can
 * go below `lower`. Prefetching policies are outside the class (a prefetched
 * hit costs bytes, not penalty) and can.
 *
 * Method: the exact integer program (per expert, which copies it holds
 * between two of its accesses; per access, at most high_cap / low_cap copies
 * held) has its two capacity constraints relaxed with a price per access and
 * cache (Lagrangian relaxation). For any prices the relaxed problem splits
 * into one 4-state shortest path per expert, and its value minus the prices
 * times the capacities is a lower bound (weak duality; the proof is in
 * cache-opt.c). Subgradient ascent raises the bound; the per-expert paths,
 * repaired into a feasible schedule, give upper bounds. A closed-form bound
 * from two runs of Belady's MIN is the floor. Because every penalty is
 * a + b * low_cost with integers a, b, a bound is raised to the least such
 * value above it, which makes lower == upper reachable: then `exact`.
 *
 * Pure computation: nothing printed, errors logged through moe_log. Thread-
 * safe for concurrent calls on the same (immutable) trace.
 */
#ifndef MOE_CACHE_OPT_H
#define MOE_CACHE_OPT_H

#include <stdint.h>

#include "cache-sim.h"
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_cache_opt_params {
    int max_iters;        /* subgradient iterations (0: the closed-form bound and one schedule only) */
    double max_seconds;   /* wall-clock limit of the ascent (<= 0: none) */
    double upper;         /* penalty of a known demand schedule (e.g. the best policy's replay); < 0: none */
    int64_t max_requests; /* traces with more non-skip accesses get the closed-form bound only */
};

/* moe_cache_opt_default_params: 5000 iterations, 20 seconds, no known
 * schedule, 10 M requests (the ascent holds about 100 bytes per request). */
struct moe_cache_opt_params moe_cache_opt_default_params(void);

/* Why the ascent stopped. */
enum moe_cache_opt_stop {
    MOE_CACHE_OPT_EXACT = 0,      /* lower reached upper: the optimum is known */
    MOE_CACHE_OPT_CONVERGED = 1,  /* the step became too small to raise the bound */
    MOE_CACHE_OPT_ITERATIONS = 2, /* max_iters */
    MOE_CACHE_OPT_TIME = 3,       /* max_seconds */
    MOE_CACHE_OPT_TOO_LARGE = 4,  /* more than max_requests: closed-form bound only */
};

struct moe_cache_opt_result {
    double lower;       /* proven: no demand policy's penalty on the trace is below it */
    double upper;       /* penalty of the best demand schedule known (found, or params.upper) */
    int exact;          /* 1: lower == upper, the optimum */
    double lagrangian;  /* the best Lagrangian bound (before rounding; 0 without the ascent) */
    double closed_form; /* (1 - c) A + c max(A, B) for c = low_cost <= 1 (max(A, B) above 1): A = MIN's
                         * misses of the high-need accesses with high_cap, B = MIN's misses of every
                         * non-skip access with high_cap + low_cap */
    int64_t requests;   /* non-skip accesses */
    int iters;
    double seconds;
    enum moe_cache_opt_stop stop;
};

/* moe_cache_opt_solve: the offline optimum of trace tr with the capacities
 * and low-miss cost of c (c->high_cap, c->low_cap, c->low_cost; nothing
 * else of c is read). Deterministic for a given trace, configuration and
 * limits (except where max_seconds cuts the ascent). Errors:
 * MOE_ERR_INVALID (no trace, negative capacities or cost, a bad limit),
 * MOE_ERR_NOMEM; logged. */
enum moe_status moe_cache_opt_solve(const struct moe_cache_trace *tr, const struct moe_cache_config *c,
                                    const struct moe_cache_opt_params *op, struct moe_cache_opt_result *out);

/* moe_cache_opt_stop_name: "exact", "converged", "iterations", "time",
 * "too large"; "?" otherwise. */
const char *moe_cache_opt_stop_name(enum moe_cache_opt_stop s);

#ifdef __cplusplus
}
#endif

#endif

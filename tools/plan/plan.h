/*
 * plan.h - `moe-prep plan`'s search: for a memory size, which engine
 * settings make an offloaded model decode fastest within a quality budget,
 * and how fast it will run.
 *
 * The choices are the ones the toolchain already has: each expert's home
 * precision (one stored precision for all, or the bit-width map), HOBBIT's
 * dynamic precision with a low precision and its share of the budget
 * (thresholds from the profile), the cache policy (LRU, or HOBBIT with the
 * fitted weights), EdgeMoE's path prefetch, and MoBiLE's big-little
 * threshold gamma. For each candidate the budget left for expert copies
 * becomes the store's capacities (moe_store_capacities, the store's own
 * arithmetic), the profile's held-out routing is replayed through the
 * runtime's cache core (the simulator of tools/calibrate, with big-little
 * passes and their prefetch), and every replayed step is timed with the
 * measured hardware table (moe-hw.h) under the store's pipeline: reads start
 * when a step is planned and are served in order by the loader threads
 * (a read of b bytes: latency + b / bandwidth, the bandwidth shared while two
 * reads overlap), the experts compute in order, each waiting for its read; a
 * prefetch read starts the steps ahead it was hinted; per layer step add the
 * model's time outside the routed experts and the store's bookkeeping.
 * Quality comes from a callback (an eval through the engine in the CLI); a
 * plan that computes exactly what the reference computes (the largest stored
 * precision, no dynamic precision, no big-little) costs nothing by
 * construction, so without a quality measurement only such plans are chosen.
 *
 * Pure computation over the simulator and the table: nothing printed
 * (errors logged). Not thread-safe per result.
 */
#ifndef MOE_PLAN_H
#define MOE_PLAN_H

#include <stdint.h>

#include "cache-sim.h"
#include "moe-cache.h"
#include "moe-hw.h"
#include "moe-status.h"
#include "routing-stats.h"

#define MOE_PLAN_MAX_PREC 16
#define MOE_PLAN_MAX_GAMMA 8

/* What the planner knows about the bundle (arrays borrowed for the call). */
struct moe_plan_model {
    int L, E, K;                  /* MoE layers, experts per layer, top-k */
    int n_prec;
    char prec_name[MOE_PLAN_MAX_PREC][24];
    const int64_t *raw;           /* [n_prec x L x E] bytes of each copy in memory */
    const int64_t *stored;        /* [n_prec x L x E] bytes read from storage */
    const int16_t *map;           /* [L x E] home precision of each expert (bit-width map), or NULL */
    int ref_prec;                 /* the reference precision (largest copies): plans at it with
                                   * neither dynamic precision nor big-little cost nothing */
    int64_t fixed_bytes;          /* memory outside the store: non-expert weights, KV cache,
                                   * scratch and a process allowance */
    int n_loaders;                /* the store's loader threads (2) */
    /* from the bundle's tuning */
    int has_hobbit;               /* fitted HOBBIT weights: the hobbit policy is searched */
    double w[MOE_CACHE_N_WEIGHTS];
    int admit;
    const double *freq_high, *freq_low; /* [L x E] or NULL */
    const int32_t *order;         /* [L x E] placement order or NULL */
    double t1, t2;                /* HOBBIT thresholds; NaN: dynamic precision not searched */
};

struct moe_plan;

/* One quality measurement of a plan. */
struct moe_plan_quality {
    double ppl_ratio;             /* PPL(plan) / PPL(reference) */
    double kld;                   /* mean KL(reference || plan), nats */
    double same_top;              /* top-token agreement with the reference */
};

/* quality callback: measure plan *p; MOE_OK with *q filled, or an error (the
 * search stops and returns it). */
typedef enum moe_status (*moe_plan_quality_fn)(const struct moe_plan *p, void *user, struct moe_plan_quality *q);

struct moe_plan_params {
    int64_t mem;                  /* the memory size, bytes */
    int prompt_len;               /* tokens of each held-out sequence run as a prompt batch (64) */
    double heldout;               /* share of the profile's sequences held out (0.3, as fit-cache) */
    int little_k;                 /* big-little's little model (0: big-little not searched) */
    int n_gamma;                  /* candidate thresholds and the fallback ratio of each */
    double gamma[MOE_PLAN_MAX_GAMMA], fallback[MOE_PLAN_MAX_GAMMA];
    int bl_prefetch;              /* big passes prefetch from the little pass (2 layers ahead; 0 off) */
    const struct moe_path_dict *paths; /* EdgeMoE's dictionary for path prefetch (NULL: not searched) */
    int path_prefetch;            /* experts prefetched per layer when searched (2) */
    double low_share;             /* share of the budget for low copies (0.25) */
    double quality_budget;        /* largest PPL ratio - 1 allowed (NaN: none) */
    int max_evals;                /* quality measurements at most (8) */
    int want;                     /* stop measuring once this many plans are known to be within
                                   * the budget, the exact ones included (4) */
    moe_plan_quality_fn quality;  /* NULL: no measurement */
    void *user;
};

/* moe_plan_default_params: the defaults noted above, mem 0. */
struct moe_plan_params moe_plan_default_params(void);

/* One plan: the choices, the sizes they give and what is predicted. */
struct moe_plan {
    int high;                     /* precision index of every high copy; -1: the bit-width map */
    int low;                      /* precision index of low copies; -1: dynamic precision off */
    double low_share, t1, t2;
    enum moe_cache_policy policy;
    int prefetch_paths;           /* EdgeMoE path prefetch per layer (0: off) */
    int little_k;                 /* 0: big-little off */
    double gamma, fallback;       /* threshold and the fallback ratio it gives on the profile */
    int bl_prefetch;
    int64_t expert_mem;           /* bytes of expert copies (the store's budget) */
    int64_t overhead;             /* the store's scratch and bookkeeping */
    int high_cap, low_cap;
    int64_t high_slot, low_slot;  /* slot bytes of each cache */
    double s_per_token;           /* predicted seconds per decode token */
    double tok_s;                 /* predicted decode tokens per second */
    double bytes_per_token;       /* predicted bytes read per decode token */
    double hit_ratio;             /* of the replay */
    double stall_share;           /* share of the predicted time spent waiting for reads */
    int neutral;                  /* computes what the reference computes: quality cost 0 */
    int has_quality;
    struct moe_plan_quality q;
    int eligible;                 /* known to be within the quality budget: exact, or measured */
};

struct moe_plan_result {
    int n;                        /* plans, fastest first */
    struct moe_plan *plans;
    int chosen;                   /* the fastest plan known to be within the quality budget
                                   * (neutral, or measured); -1 when none */
    int n_evals;                  /* quality measurements made */
    int n_infeasible;             /* candidates whose budget held no layer's top-k */
    int64_t heldout_tokens;       /* tokens replayed per candidate */
};

/* moe_plan_predict: fill the sizes and predictions of *p (its choices set)
 * for memory size pp->mem by replaying the held-out sequences of trace t.
 * MOE_ERR_RANGE (not logged) when the budget is too small for the store;
 * MOE_ERR_INVALID / MOE_ERR_NOMEM (logged). hm / hs: the hardware table's
 * entries for this model and its storage; their precision lines are found
 * by name (a missing one is MOE_ERR_NOT_FOUND, logged). */
enum moe_status moe_plan_predict(const struct moe_trace *t, const struct moe_plan_model *m,
                                 const struct moe_hw_model *hm, const struct moe_hw_storage *hs,
                                 const struct moe_plan_params *pp, struct moe_plan *p);

/* moe_plan_search: every candidate predicted, sorted fastest first,
 * qualities measured in that order (plans that are not neutral, at most
 * max_evals measurements, until `want` plans are eligible), eligibility and
 * the chosen plan (the fastest eligible one) marked. Free with moe_plan_result_free. Errors as moe_plan_predict, or
 * the quality callback's; MOE_ERR_RANGE (logged) when no candidate fits the
 * memory size. */
enum moe_status moe_plan_search(const struct moe_trace *t, const struct moe_plan_model *m,
                                const struct moe_hw_model *hm, const struct moe_hw_storage *hs,
                                const struct moe_plan_params *pp, struct moe_plan_result *out);

/* moe_plan_result_free: frees the plans; NULL-safe. */
void moe_plan_result_free(struct moe_plan_result *r);

/* moe_plan_same: plans a and b are predicted alike and compute the same
 * (e.g. two policies when every copy fits): a table shows one of them. */
int moe_plan_same(const struct moe_plan *a, const struct moe_plan *b);

/* moe_plan_options: the moe-run options that run plan p, as one line
 * ("--expert-mem 12345 --high q8_0 --dynamic off ..."), into buf[n]. */
void moe_plan_options(const struct moe_plan *p, const struct moe_plan_model *m, char *buf, size_t n);

#endif

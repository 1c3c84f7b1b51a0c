/*
 * plan-bundle.h - `moe-prep plan` as one library call: from a bundle, its
 * profile and this machine's hardware table to the ranked plans
 * (moe_plan_bundle), and the chosen plan written into the bundle's tuning
 * (moe_plan_apply). The search itself is plan.h's moe_plan_search; this file
 * gathers what it needs:
 *
 *   - the bundle's facts (moe_plan_model): every expert copy's size at every
 *     stored precision, the bit-width map, HOBBIT's fitted cache weights, the
 *     placement order, the memory outside the store (non-expert weights, the
 *     KV cache for `ctx` tokens, 16 MiB for the process);
 *   - the profile's routing trace (its held-out sequences are replayed) and
 *     big-little's thresholds for fallback ratios of 10, 20, 30 and 50 % from
 *     the histogram of the little model's top probability;
 *   - EdgeMoE's order-1 path dictionary from the sequences not held out;
 *   - the hardware table's entries for the bundle and -t threads, measured
 *     (moe_hw_measure_bundle) and saved when missing unless no_measure;
 *   - with eval_text, the quality callback: an eval through the engine
 *     (moe_eval_run, one token per step) of the plan against the bundle at its
 *     largest precision, all resident.
 *
 * Errors are logged (moe_log); progress lines (measuring, each quality
 * measured) go to the request's note callback. Not thread-safe with respect
 * to the hardware table file (it may be rewritten).
 */
#ifndef MOE_PLAN_BUNDLE_H
#define MOE_PLAN_BUNDLE_H

#include <stdint.h>

#include "moe-model.h"
#include "moe-status.h"
#include "moe-tuning.h"
#include "plan.h"

struct moe_plan_request {
    const char *bundle;           /* MODEL.moeb */
    const char *profile;          /* its profile (moe-prep profile) */
    const char *hw_table;         /* the hardware table; NULL = moe_hw_default_path() */
    const char *eval_text;        /* dataset spec for quality; NULL = only exact plans are eligible */
    int64_t mem;                  /* memory for the whole run, bytes (> 0) */
    double quality_budget;        /* largest PPL rise allowed, a fraction (used with eval_text) */
    int threads;                  /* CPU threads moe-run will use (> 0) */
    int ctx;                      /* context the run needs (KV cache), at most the model's */
    int prompt_len;               /* prompt tokens of each replayed sequence */
    int want;                     /* stop measuring quality once this many plans are eligible */
    int eval_ctx, eval_chunks;    /* tokens per eval chunk, chunks per eval */
    int max_evals;                /* quality measurements at most */
    int no_measure;               /* 1: fail instead of measuring a missing hardware entry */
    int no_big_little;            /* 1: big-little thresholds are not searched */
    /* progress for a person ("measuring ...", "quality of ...: PPL ..."); NULL = none */
    void (*note)(const char *line, void *user);
    void *note_user;
    const char *device;           /* the backend moe-run will use (moe_session_params.device; NULL = cpu):
                                   * its hardware entry and the quality evals run there */
    const void *device_options;   /* its options (struct moe_gpu_params *; borrowed), or NULL */
};

/* moe_plan_request_defaults: ctx 2048, prompt_len 64, want 4, eval_ctx 128,
 * eval_chunks 2, max_evals 8, quality_budget 0.02, threads = online CPUs;
 * bundle, profile and mem unset. */
struct moe_plan_request moe_plan_request_defaults(void);

/* What moe_plan_bundle found. pm describes the bundle (prec_name names the
 * precisions the plans index); res holds the plans, fastest first, and the
 * chosen one. Free with moe_plan_outcome_free. */
struct moe_plan_outcome {
    struct moe_plan_model pm;
    struct moe_plan_result res;
    /* owned, private: what pm points into */
    struct moe_model *model;
    struct moe_tuning tun;
    int64_t *raw, *stored;
    int16_t *map;
    int32_t *order;
};

/* moe_plan_bundle: the ranked plans for rq. MOE_ERR_INVALID (logged) for a
 * request that cannot work as given (the profile was recorded on another
 * model shape, the eval text is too short for eval_ctx, a missing field),
 * other errors (logged) for files that cannot be read and failed searches.
 * On error *out is freed and zeroed. */
enum moe_status moe_plan_bundle(const struct moe_plan_request *rq, struct moe_plan_outcome *out);

/* moe_plan_outcome_free: frees what moe_plan_bundle filled; NULL-safe,
 * idempotent. */
void moe_plan_outcome_free(struct moe_plan_outcome *o);

/* moe_plan_apply: plan p (of outcome o, for request rq) into the bundle's
 * tuning as the plan.* keys (other keys kept; the tuning slot is replaced
 * crash-safely). Logged on failure. */
enum moe_status moe_plan_apply(const struct moe_plan_request *rq, const struct moe_plan_outcome *o,
                               const struct moe_plan *p);

#endif

/*
 * profile-record.h - the profile recorder: a model run over a token stream,
 * its routing observed through the session's on_route / on_expert callbacks
 * (never through runtime internals), stored as a profile (profile-h5.h).
 *
 *     struct moe_profile_record_params rp = moe_profile_record_default_params();
 *     rp.n_ctx = 256;
 *     struct moe_profile *p = NULL;
 *     struct moe_profile_record_info info;
 *     if (moe_profile_record(model, ids, n_ids, &rp, &p, &info) == MOE_OK) {
 *         moe_profile_derive(p, &targets, &results);   (profile-results.h)
 *         moe_profile_write(p, "p.h5");
 *     }
 *     moe_profile_free(p);
 *
 * The recorder cuts the stream into sequences of n_ctx tokens (the first of
 * each replaced by the tokenizer's BOS when it has one), runs each through a
 * fresh session in one batch, and keeps per token and MoE layer the chosen
 * experts and gate weights (the trace; router logits too when asked), the
 * counts profile-h5 keeps, and the sums only the run itself can gather:
 * sum.pearson, sum.stacked and, on the big-little sample (every Nth sequence
 * also run with K/2 experts, MoBiLE), sum.big_little_maxprob; plus
 * config.record and shard (profile-results.h lists them). Derived results are
 * not computed here: moe_profile_derive does that from the profile alone, so
 * shards recorded apart and joined (profile-merge.h) give what one run gives.
 *
 * Threads: one call at a time per model (the sessions use the model's
 * weights read-only, with params.n_threads worker threads of their own).
 */
#ifndef MOE_PROFILE_RECORD_H
#define MOE_PROFILE_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "moe-model.h"
#include "moe-status.h"
#include "profile-h5.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Called after every recorded sequence: done of total sequences of this
 * shard, tokens so far, seconds since the first forward pass. */
typedef void (*moe_profile_progress_fn)(int done, int total, int64_t tokens, double seconds, void *user);

struct moe_profile_record_params {
    int n_ctx;                      /* tokens per sequence, one forward pass each (>= 2, <= the model's context) */
    int64_t max_tokens;             /* stop after this many tokens; 0 = every whole sequence */
    int big_little_every;           /* run the K/2 little model on every Nth sequence (by global index, so
                                     * shards agree); 0 = never; -1 = auto: 16, or n_seq/2 when fewer, >= 1 */
    int shard_i, shard_n;           /* record the shard_i-th (1-based) of shard_n slices of the sequences */
    enum moe_profile_logits logits; /* also keep every router logit (f16 or f32) */
    int n_threads;                  /* 0 = all online CPUs */
    const char *model_path, *dataset; /* stored in the profile's metadata (copied; may be NULL) */
    moe_profile_progress_fn progress; /* may be NULL */
    void *progress_user;
    const char *device;             /* the backend to run on (moe_session_params.device; NULL = cpu) */
    const void *device_options;     /* its options (struct moe_gpu_params *; borrowed), or NULL */
};

/* moe_profile_record_default_params: n_ctx 256, every token, big-little
 * auto, shard 1/1, no logits, all CPUs, no progress. */
struct moe_profile_record_params moe_profile_record_default_params(void);

/* What a recording did, for its summary. */
struct moe_profile_record_info {
    int seq0, seq1, n_seq_all;  /* recorded sequences [seq0, seq1) of the run's n_seq_all */
    int big_little_every;       /* as used (auto resolved; 0 when the model routes to 1 expert) */
    int little_k;               /* experts per token of the little model (0 without big-little) */
    int64_t tokens;             /* tokens recorded */
    double seconds;             /* time of the forward passes and observers */
};

/* moe_profile_record: record `model` over tokens[0..n_tokens) (the stream of
 * moe_text_load_tokens) with params p and return the new profile in *out
 * (caller frees with moe_profile_free) and, when info is not NULL, what was
 * done. The tokens and model are only read, and the caller keeps them.
 *
 * Errors (each logged once; *out is NULL): MOE_ERR_INVALID for parameters
 * out of range, a stream shorter than one sequence, a shard count above the
 * number of sequences, n_ctx above the model's context, a model with no MoE
 * layers; MOE_ERR_FORMAT when the router weights cannot be read or the
 * router events do not cover every token and MoE layer; a forward pass's own
 * error; MOE_ERR_NOMEM. */
enum moe_status moe_profile_record(const struct moe_model *model, const int32_t *tokens, size_t n_tokens,
                                   const struct moe_profile_record_params *p, struct moe_profile **out,
                                   struct moe_profile_record_info *info);

#ifdef __cplusplus
}
#endif

#endif

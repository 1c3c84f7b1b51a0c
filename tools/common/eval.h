/*
 * eval.h - perplexity and KL divergence of a model on a text, measured the way
 * llama.cpp's llama-perplexity measures them, so the figures are comparable.
 *
 * The token stream is the text tokenized once without special tokens, after
 * a BOS if the tokenizer's post-processor adds one (llama-perplexity tokenizes
 * with BOS, so its stream starts the same way). It is cut into consecutive,
 * non-overlapping chunks of n_ctx tokens; a trailing partial chunk is dropped.
 * The BOS also replaces the first token of every chunk (as llama-perplexity
 * does: one token of the text is lost per chunk, none is shifted). Each chunk
 * runs through a fresh session; only its second half is scored: the logits at
 * positions n_ctx/2 .. n_ctx-2 predict the tokens at n_ctx/2+1 .. n_ctx-1, so
 * every scored token has at least n_ctx/2 tokens of context. With a reference
 * model the same chunks run through it too, and each scored position also
 * gives KL(P_ref || P_model) over the whole vocabulary (in double), the change
 * in the probability of the true token, and whether the two top-1 tokens agree.
 *
 * Memory: logits are held for at most 128 positions per model at a time, plus
 * 4 doubles per scored position (for medians and percentiles); nothing grows
 * with the vocabulary times the dataset.
 *
 * Used by `moe-prep eval`; sensitivity and bit-width searches can call it with
 * their own models. Models are only read, and each call makes its own sessions,
 * so calls on shared models may run concurrently.
 */
#ifndef MOE_EVAL_H
#define MOE_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "moe-model.h"
#include "moe-session.h"
#include "moe-status.h"
#include "moe-store.h"

/* Percentiles reported for KL and delta-p, in this order (0 = minimum, 0.5 =
 * median, 1 = maximum): 0, .001, .01, .05, .10, .5, .90, .95, .99, .999, 1. */
#define MOE_EVAL_N_PCT 11
extern const double moe_eval_pct[MOE_EVAL_N_PCT];

struct moe_eval_params {
    int n_ctx;      /* tokens per chunk (>= 4); default 512 */
    int max_chunks; /* 0 = every whole chunk of the stream */
    int n_threads;  /* threads of each session; 0 = all online CPUs */
    int32_t bos;    /* written over the first token of each chunk; -1 (default) = none */
    /* Optional progress callback, called after each chunk from the calling
     * thread: chunks done, chunks in all, seconds since the first chunk began. */
    void (*on_chunk)(int done, int total, double seconds, void *user);
    void *user;
    int unigram; /* also compute the unigram baseline */
    int routing; /* also count the model's expert load per layer */
    /* Engine options for the model side (NULL, or inactive: every expert
     * resident). With a budget the model's session runs through the expert
     * store (moe-store.h): dynamic precision, skipping, the cache policy and
     * prefetching as `moe-run` would run them, one store over all chunks. The
     * reference always runs all resident: the all-high run to compare with.
     * The model should be loaded with moe_model_params.lazy_experts. */
    const struct moe_store_params *store;
    /* Tokens per forward pass of the model side (0: the session's default,
     * 256). 1 runs every position as a decode step, so the engine decides
     * precision per token, as it does when generating. */
    int n_batch;
    /* MoBiLE big-little decoding on the model side (moe-session.h): every
     * position runs as a one-token step with little_k experts and falls back
     * to all K when its top probability is below gamma; the distribution
     * scored is the one big-little decoding uses. 0 = off (default); needs
     * n_batch 0 or 1 (it is then 1). */
    int little_k;
    double gamma;
    /* The backend both sides run on (moe_session_params.device / device_options:
     * "cpu" (NULL), "cuda", "cuda:1", "auto"; options borrowed for the call). */
    const char *device;
    const void *device_options;
};

struct moe_eval_params moe_eval_default_params(void);

/* An estimate and its standard error. For a mean: sqrt(var / (n - 1)) with
 * var the population variance, as llama-perplexity computes it (0 if n < 2). */
struct moe_eval_figure {
    double val, err;
};

struct moe_eval_result {
    int n_ctx;
    int32_t bos;               /* as in the params */
    int64_t n_tokens;          /* tokens in the stream (with the BOS) */
    int n_chunks;              /* chunks evaluated */
    int64_t n_scored;          /* positions scored: n_chunks * (n_ctx - 1 - n_ctx/2) */
    double seconds;            /* wall time of the forward passes and scoring */

    struct moe_eval_figure nll; /* model: mean negative log-likelihood, nats/token */
    struct moe_eval_figure ppl; /* exp(nll.val), error ppl * nll.err */

    /* Only with a reference model (has_ref != 0); as llama-perplexity's
     * --kl-divergence mode, with "Q" = model and "base" = ref. */
    int has_ref;
    struct moe_eval_figure ref_nll, ref_ppl;
    double nll_cor;                    /* Pearson correlation of per-token NLLs; NAN if undefined */
    struct moe_eval_figure ln_ppl_ratio; /* ln(PPL / PPL_ref), covariance-aware error */
    struct moe_eval_figure ppl_ratio;    /* PPL / PPL_ref */
    struct moe_eval_figure ppl_diff;     /* PPL - PPL_ref */
    struct moe_eval_figure kld;          /* mean KL(P_ref || P_model), nats */
    double kld_pct[MOE_EVAL_N_PCT];      /* at moe_eval_pct */
    struct moe_eval_figure dp;           /* mean p_model(true token) - p_ref(true token) */
    double dp_pct[MOE_EVAL_N_PCT];
    struct moe_eval_figure dp_rms;       /* sqrt(mean dp^2) */
    struct moe_eval_figure same_top;     /* share of positions whose argmax agrees (lowest id on ties) */

    /* Unigram baseline (params.unigram): token frequencies counted over the
     * whole evaluated stream, add-one smoothed, scored on the same positions.
     * Fitted on the text itself, it is a harder baseline than one fitted on
     * training data. */
    int has_unigram;
    double unigram_ppl;

    /* Routing of the model over every token it processed (context and scored
     * halves): token-slots per (MoE layer, expert), row-major [n_layer x
     * n_expert]; NULL unless params.routing. Free with moe_eval_result_clear(). */
    int64_t *expert_load;
    int n_layer, n_expert;

    /* The model's expert store over the whole evaluation (params.store
     * active): hit ratios, loads, low-precision and skipped experts. */
    int has_store;
    struct moe_store_stats store;

    /* Big-little decoding of the model (params.little_k > 0): positions
     * decided (context and scored halves) and how many fell back to K. */
    int has_big_little;
    struct moe_big_little_stats big_little;
};

/* moe_eval_result_clear: free what a result owns (expert_load). */
void moe_eval_result_clear(struct moe_eval_result *r);

/* moe_eval_load_entropy: entropy of layer l's expert load divided by
 * log(n_expert) (1 = uniform, 0 = one expert takes all); -1 for a layer
 * without routed tokens. *top receives the most-used expert. */
double moe_eval_load_entropy(const struct moe_eval_result *r, int layer, int *top);

struct moe_dataset_params;

/* moe_eval_run: score the stream `ids` with `model` and, if ref != NULL,
 * against `ref`. Fails (logged) with MOE_ERR_INVALID if the stream holds fewer
 * than 2 * n_ctx tokens (llama-perplexity's rule) or the vocabulary sizes
 * differ, with MOE_ERR_RANGE if n_ctx exceeds either model's
 * max_position_embeddings, and with the session's error if a forward pass
 * fails (e.g. an id outside the vocabulary). Models are borrowed, only read. */
enum moe_status moe_eval_run(const struct moe_model *model, const struct moe_model *ref,
                             const int32_t *ids, size_t n_ids, const struct moe_eval_params *params,
                             struct moe_eval_result *out);

#endif

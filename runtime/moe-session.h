/*
 * moe-session.h - run state of a model and the forward pass (batched prefill
 * and one-token decode) on a backend (moe-backend.h; the CPU reference by
 * default), with every routed expert resident or, given a memory budget, in
 * the expert store (moe-store.h).
 *
 * The CPU forward pass is the specification every faster path is checked
 * against: float32 accumulation, weights read in their stored dtype, the
 * arithmetic of transformers' eager implementation. A session is used by one
 * thread at a time.
 *
 * A session may hold several sequences (n_seq), each with its own KV cache
 * and position, sharing the weights, the expert store and the scratch: a
 * server's concurrent requests. Prefill each with moe_session_forward_seq,
 * then decode them together with moe_session_decode_batch: one forward step
 * for one token of each, in which every layer but the attention (norms,
 * router, routed and shared experts, LM head) runs all their rows as one
 * batch, so an expert loaded (or read through the cache) for one sequence
 * serves every sequence routed to it in that step.
 */
#ifndef MOE_SESSION_H
#define MOE_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "moe-backend.h"
#include "moe-model.h"
#include "moe-store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the router decided for a batch of tokens at one MoE layer. All arrays
 * are borrowed for the duration of the callback only. */
struct moe_route_event {
    int layer;
    int pos0;                   /* position of the first token of the batch */
    int n_tokens;
    int n_expert;
    int k;                      /* experts selected per token */
    const float *gate_input;    /* [n_tokens x n_embd]: normed hidden state fed to the router */
    const float *router_logits; /* [n_tokens x n_expert] */
    const int32_t *experts;     /* [n_tokens x k], by gate weight, largest first */
    const float *weights;       /* [n_tokens x k] gate weights applied to expert outputs */
};

typedef void (*moe_route_fn)(const struct moe_route_event *ev, void *user);

/* One routed expert's work in a batch: its (unweighted) outputs E(x) for the
 * tokens routed to it. Borrowed for the duration of the callback only. */
struct moe_expert_event {
    int layer, expert;
    int pos0;               /* position of the first token of the batch */
    int n;                  /* tokens routed to this expert */
    const int32_t *tokens;  /* [n] indices into the batch */
    const float *weights;   /* [n] gate weights applied to the outputs */
    const float *outputs;   /* [n x n_embd] E(x), before the gate weight */
};

typedef void (*moe_expert_fn)(const struct moe_expert_event *ev, void *user);

/* The residual stream entering a layer, for a batch of tokens: layer
 * n_layer means after the last layer, before the output norm. Borrowed for
 * the duration of the callback only. */
struct moe_layer_event {
    int layer;
    int pos0;        /* position of the first token of the batch */
    int n_tokens;
    const float *x;  /* [n_tokens x n_embd] */
};

typedef void (*moe_layer_fn)(const struct moe_layer_event *ev, void *user);

struct moe_session_params {
    int n_ctx;          /* KV cache length in tokens (0 = min(max_position_embeddings, 4096)) */
    int n_batch;        /* tokens per forward chunk (0 = 256) */
    int n_threads;      /* 0 = all online CPUs */
    moe_route_fn on_route; /* optional observer (profiling); NULL = none */
    void *route_user;
    moe_expert_fn on_expert; /* optional observer of expert outputs; NULL = none */
    void *expert_user;
    moe_layer_fn on_layer; /* optional observer of each layer's input; NULL = none */
    void *layer_user;
    int n_expert_used;  /* experts per token; 0 = the model's top-k. MoBiLE's
                         * "little" model runs with k/2 (sparsemixer: 1 or 2) */
    const struct moe_store_params *store; /* a memory budget for the routed experts
                         * (bundles; the model ideally loaded with lazy_experts);
                         * NULL = every expert resident, as mapped (borrowed for
                         * the call) */
    int record_trace;   /* 1: keep the routing of every token run (moe_session_trace) */
    moe_backend_new_fn backend_new; /* a backend made by the caller (tests, a backend outside
                         * the registry); NULL = the registry's, by `device` */
    void *backend_user; /* passed to backend_new (borrowed for the call) */
    /* MoBiLE big-little decoding (off when little_k is 0): every one-token
     * step (a decode step, or any chunk of one token) runs first with
     * little_k experts per token (the "little" model); when the largest
     * probability of its next-token distribution is below gamma the token is
     * run again with all n_expert_used experts (the "big" model), at the same
     * position, so the KV cache holds the accepted pass's keys and values.
     * The caller gets the accepted pass's logits. Chunks of several tokens
     * (a prompt) run big. With a store, the big pass's experts come from the
     * little pass's router logits (their top n_expert_used per MoE layer) as
     * prefetch hints bl_prefetch_layers MoE layers ahead. */
    int little_k;       /* 1 .. n_expert_used - 1 (sparsemixer: 1); 0 = off */
    double gamma;       /* [0, 1]: accept the little token when its top probability
                         * >= gamma; 0 = never fall back; 1 = always */
    int bl_prefetch_layers; /* hint the big pass's experts this many MoE layers ahead
                         * (0 = no hints; default 2) */
    const char *device; /* the backend to run on, a registered name and device
                         * (moe-backend.h): "cpu" (NULL), "cuda", "cuda:1", "auto" */
    const void *device_options; /* that backend's own options (struct moe_gpu_params *
                         * for "cuda", borrowed for the call); NULL = its defaults */
    int n_seq;          /* sequences with their own KV cache, each n_ctx long (0 or 1 =
                         * one; sequence 0 is what moe_session_forward uses), at most
                         * MOE_SESSION_MAX_SEQ. The KV cache is n_seq times as large
                         * (moe_session_kv_bytes). More than one needs a backend with
                         * kv_seq (the CPU's; the CUDA backend has none yet:
                         * MOE_ERR_UNSUPPORTED at create) and refuses record_trace and
                         * the observers on_route, on_expert and on_layer
                         * (MOE_ERR_INVALID at create): their events describe one
                         * sequence's contiguous positions. */
    int no_graphs;      /* 1: never run a decode step as one device graph; 0 (default): a
                         * forward of one token runs as one (the backend's decode_step,
                         * moe-graph.h) where the backend has it and moe_graph_decide
                         * allows: every expert resident, no observer, no big-little. The
                         * routing then runs on the device (logits equal up to its
                         * rounding); the trace is kept. */
};

/* The most sequences a session holds. */
#define MOE_SESSION_MAX_SEQ 4096

struct moe_session_params moe_session_default_params(void);

struct moe_session;

/* moe_session_create: allocate KV cache and buffers for `model` (borrowed; it
 * must outlive the session). */
enum moe_status moe_session_create(const struct moe_model *model,
                                   const struct moe_session_params *params,
                                   struct moe_session **out);

/* moe_session_free: NULL is a no-op. */
void moe_session_free(struct moe_session *s);

/* moe_session_reset: forget every cached sequence (position 0). */
void moe_session_reset(struct moe_session *s);

/* moe_session_pos: number of tokens in the cache of sequence 0. */
int moe_session_pos(const struct moe_session *s);

/* moe_session_n_seq: the sequences the session holds (>= 1). */
int moe_session_n_seq(const struct moe_session *s);

/* moe_session_seq_reset: forget sequence seq's cache (position 0); other
 * sequences untouched. An out-of-range seq is logged and ignored. With an
 * expert store, the store's per-sequence records (moe_store_begin_sequence)
 * restart when a step begins with every sequence empty. */
void moe_session_seq_reset(struct moe_session *s, int seq);

/* moe_session_seq_truncate: keep only the first pos tokens of sequence seq's
 * cache (0 <= pos <= its length), so the next forward continues at pos: a
 * conversation whose new rendering shares only a prefix with what the cache
 * holds reruns from there, not from the start. MOE_ERR_INVALID for a bad seq
 * or pos; MOE_ERR_UNSUPPORTED (the session unchanged; reset and run the whole
 * sequence instead) with record_trace, and for Phi-MoE's longrope when the
 * sequence has outgrown original_max_position_embeddings and pos would fall
 * back within it (its cached keys were rotated with the long scale). */
enum moe_status moe_session_seq_truncate(struct moe_session *s, int seq, int pos);

/* moe_session_seq_pos: number of tokens in sequence seq's cache; -1 for an
 * out-of-range seq. */
int moe_session_seq_pos(const struct moe_session *s, int seq);

/* How the session's one-token forwards ran (moe-graph.h). */
struct moe_session_graph_stats {
    int64_t steps_graph;  /* one-token forwards run as one device graph */
    int64_t steps_plain;  /* one-token forwards run op by op */
    int last_why;         /* enum moe_graph_why of the latest one-token forward (0: it was a graph) */
    int graph_ops;        /* operations in the graph (moe_graph_plan of the model) */
};

/* moe_session_graph_stats: the counts above since the session was created. */
void moe_session_graph_stats(const struct moe_session *s, struct moe_session_graph_stats *out);

/* moe_session_n_ctx: capacity of the cache. */
int moe_session_n_ctx(const struct moe_session *s);

/* Every session checks the file its model was loaded from (bundles:
 * moe_model_check_file) when its first forward starts and after every
 * forward that brings the tokens run since the last check to this many; the
 * expert store checks it before every read too. A bundle truncated or
 * rewritten under a running model makes the forward (this one or one within
 * this many tokens) return MOE_ERR_IO, with one message naming the file
 * ("changed while the model was running (size X -> Y bytes; ...); restart"),
 * and every later forward return it too: the logits of such a call are not
 * to be used. A tuning replacement is not a change. What this cannot catch:
 * with every expert resident the weights are read from the mapping, and a
 * read past a truncated end raises SIGBUS before a check can see it. With a
 * budget the non-expert weights are the model's own copy and the experts are
 * read by the store, so a truncation is an error, not a signal, except in
 * the moment between a check and a read of the mapping right after it: a
 * copy out of the mapping (MOE_IO_MMAP), or an expert a GPU backend runs on
 * the host (its place() hook), which reads the mapping while it computes. */
#define MOE_SESSION_CHECK_TOKENS 64

/* moe_session_forward: append n tokens at the current position and compute
 * logits. With all_logits != 0, `logits` receives [n x n_vocab] (one row per
 * token); otherwise [n_vocab] for the last token only; NULL skips the LM head.
 * Phi-MoE with longrope: when the sequence first grows past
 * original_max_position_embeddings, the whole cached sequence is recomputed, as
 * transformers' generate() does (its cos/sin scale depends on the length). Fails with MOE_ERR_RANGE
 * if the cache would overflow and MOE_ERR_INVALID for out-of-vocabulary ids
 * (the session is unchanged in both cases); MOE_ERR_IO when the model's file
 * changed (MOE_SESSION_CHECK_TOKENS). */
enum moe_status moe_session_forward(struct moe_session *s, const int32_t *tokens, int n,
                                    float *logits, int all_logits);

/* moe_session_forward_seq: as moe_session_forward, for sequence seq
 * (prefill a prompt or a single decode step of one sequence); the other
 * sequences are untouched. MOE_ERR_INVALID (logged) for an out-of-range seq.
 * moe_session_forward is this with seq 0, and gives the same logits,
 * bit for bit, as a session of one sequence. */
enum moe_status moe_session_forward_seq(struct moe_session *s, int seq, const int32_t *tokens, int n, float *logits,
                                        int all_logits);

/* moe_session_decode_batch: one decode step for n distinct sequences at
 * once: token i is appended to sequence seqs[i] at its own current position;
 * logits receives [n x n_vocab] (row i for seqs[i]; NULL skips the LM head).
 * The attention of each token sees only its own sequence's cache; every
 * other layer (norms, router, experts, LM head) runs the n tokens as one
 * batch: with an expert store each layer's experts are planned, loaded and
 * acquired once for the step (moe_store_plan of n tokens), whatever number
 * of sequences use them. Each row's logits are those of a single
 * moe_session_forward_seq step of its sequence (the same bits on the CPU
 * backend: its products and attention compute each row alike whatever the
 * batch; test-multiseq checks this), and the greedy tokens the same.
 * Errors: MOE_ERR_INVALID (logged) for n outside 1 .. n_seq, a repeated or
 * out-of-range seq or an out-of-vocabulary token; MOE_ERR_RANGE if any
 * sequence would overflow its n_ctx; the session is unchanged in both cases.
 * MOE_ERR_IO as moe_session_forward (the sequences' state is then not to be
 * used either).
 * What runs one sequence at a time instead (same results, experts not
 * shared): n == 1; every row when big-little decoding is on (little_k: its
 * decision and re-run are per token); a Phi-MoE (longrope) sequence whose
 * step crosses original_max_position_embeddings (its whole sequence is
 * recomputed, as moe_session_forward does); on a backend without
 * attention_multi, the attention of each row (through kv_seq and the host).
 * Stacked-gate prefetch (moe_store_params.prefetch_layers) and path
 * prefetch run for one-token steps only, so not in a batch of several. The
 * rows of more than n_batch sequences run as several batches. */
enum moe_status moe_session_decode_batch(struct moe_session *s, const int *seqs, const int32_t *tokens, int n,
                                         float *logits);

/* moe_session_forward_from: as moe_session_forward, but start at layer
 * `layer` (0 <= layer < n_layer) from x [n x n_embd], the residual stream
 * entering that layer for the n tokens at the current position (what the
 * on_layer observer saw). Layers below `layer` are not run: their KV cache
 * is not written for these positions, so the session only serves further
 * calls of this function from the same layer or above (or a reset). Used to
 * recompute the upper layers after a change that leaves the lower ones
 * alone (the sensitivity sweep). Sequence 0 only. `tokens` [n] are the ids, kept for the
 * history; MOE_ERR_UNSUPPORTED where moe_session_forward would have to
 * recompute the whole sequence (Phi-MoE past its original context). */
enum moe_status moe_session_forward_from(struct moe_session *s, int layer, const int32_t *tokens,
                                         const float *x, int n, float *logits, int all_logits);

/* moe_session_lm_head: logits [n x n_vocab] of n final residual-stream rows x
 * [n x n_embd] (output norm, then the LM head); the cache is not touched. */
enum moe_status moe_session_lm_head(struct moe_session *s, const float *x, int n, float *logits);

/* moe_session_ffn: y [n x n_embd] = the SwiGLU feed-forward f (e.g. one of the
 * model's experts, at whatever precision it is bound) applied to the rows
 * x [n x n_embd], on the session's threads. */
enum moe_status moe_session_ffn(struct moe_session *s, const struct moe_ffn *f, const float *x, float *y, int n);

/* moe_session_set_experts: the following passes that are not big-little
 * steps route each token to its top k experts (1 <= k <= n_expert_used;
 * MOE_ERR_INVALID otherwise, logged). A check of big-little decoding
 * replays its decisions with it. */
enum moe_status moe_session_set_experts(struct moe_session *s, int k);

/* What big-little decoding did since the session was created (all 0 when
 * it is off). tokens = one-token steps decided; fallbacks = of which the big
 * pass ran again; little_s / big_s: wall time of the little passes and of the
 * big passes (the decision and the LM head included). */
struct moe_big_little_stats {
    int64_t tokens, fallbacks;
    double little_s, big_s;
};

/* moe_session_big_little_stats: the counts so far. */
void moe_session_big_little_stats(const struct moe_session *s, struct moe_big_little_stats *out);

/* moe_route: the router's choice for one token at MoE layer `layer` from its
 * router logits [n_expert], exactly as a session routes: k experts (k <= the
 * model's top-k; sparsemixer: 1 or 2) by gate weight, largest first, and
 * their gate weights (routed_scaling_factor included). For tools that
 * recompute routing offline (the profiler's stacked-gate prediction). */
void moe_route(const struct moe_model *m, int layer, int k, const float *logits, int32_t *experts, float *weights);

/* moe_session_kv_bytes: the bytes the session's KV caches hold (allocated for
 * n_ctx tokens of each of n_seq sequences): full keys and values per layer for grouped-query attention,
 * the compressed latent and the shared rope key for multi-head latent
 * attention. 0 when the backend does not report it. */
size_t moe_session_kv_bytes(const struct moe_session *s);

/* moe_session_store: the session's expert store, or NULL (no budget); for
 * moe_store_get_stats. Borrowed: valid until moe_session_free. */
const struct moe_store *moe_session_store(const struct moe_session *s);

/* moe_session_backend: the backend the session runs on (for its own stats,
 * e.g. moe_backend_cuda_stats). Borrowed: valid until moe_session_free. */
const struct moe_backend *moe_session_backend(const struct moe_session *s);

/* The routing the session ran (record_trace): sequence i (a reset starts
 * one) is tokens [seq_start[i], seq_start[i+1]); per token and MoE layer
 * (dense layers are left out) the k experts in rank order and their gate
 * weights. The layout of the profile's trace (tools/profile/routing-stats.h).
 * With big-little decoding, a token is recorded as the pass that was
 * accepted: a little token has -1 (weight 0) in ranks little_k .. k-1. */
struct moe_session_trace {
    int n_layers, k, n_seq;      /* n_layers: MoE layers */
    int64_t n_tokens;
    const int32_t *seq_start;  /* [n_seq + 1] */
    const int32_t *experts;    /* [n_tokens x n_layers x k] */
    const float *weights;      /* [n_tokens x n_layers x k] */
};

/* moe_session_trace: the recorded routing (arrays borrowed until the next
 * forward or moe_session_free). MOE_ERR_INVALID without record_trace. */
enum moe_status moe_session_trace(const struct moe_session *s, struct moe_session_trace *out);

#ifdef __cplusplus
}
#endif
#endif

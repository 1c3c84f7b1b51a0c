/*
 * moe-backend.h - the seam between the forward logic and the hardware.
 *
 * A session (moe-session.h) decides *what* runs: the layer order, the router's
 * choices, which expert copy each token uses and where the expert store keeps
 * it. A backend decides *how*: it owns the run state in its own memory (the
 * residual stream, the KV cache, scratch) and runs the pieces of a layer on
 * it. The CPU backend (runtime/cpu/backend-cpu.c) is the reference every
 * other backend is checked against; the CUDA backend (runtime/cuda/,
 * moe-cuda.h; checked on an H200) implements the same table but for the
 * version-5 members (one KV cache: a session on it holds one sequence), and
 * adds the version-6 decode_step (a whole one-token step as one device graph).
 *
 * The table is versioned as ggml's backends and SQLite's VFS are: a backend
 * sets iface->version to the MOE_BACKEND_VERSION it was written for, the
 * session refuses a backend whose version is newer than it knows, and calls
 * a member only when the backend's version has it. Members are only ever
 * appended. Version 2 added kv_cache_bytes; version 3 expert_batch, place,
 * stage_begin and stage_end; version 4 supports and stats_json; version 5
 * kv_seq and attention_multi (several sequences' KV caches; each may be
 * NULL); version 6 decode_step (may be NULL). Callers never test the version or a NULL slot themselves: they call
 * the wrappers below (moe_backend_attention(), ...), one per member, which do
 * (as SQLite's os.c does for its VFS).
 *
 * The registry (backend.c, the runtime's only CUDA #ifdef) lists the
 * backends compiled into this build; programs pick one by name
 * (moe_backend_init_by_name: "cpu", "cuda", "cuda:1") or the best present
 * (moe_backend_init_best) and never know which were built. Adding a backend
 * is a folder under runtime/ (its iface and constructor) and one row there.
 *
 * Attention kinds: `attention` runs the layer's attention whatever its kind
 * (moe_config.attn): grouped-query attention with K and V in the cache, or
 * DeepSeek's multi-head latent attention, whose cache holds per token the
 * normed KV latent [kv_lora_rank] and the rotated shared rope key
 * [qk_rope_dim] only (the CPU backend absorbs kv_b_proj into the query and
 * the output, so full keys and values never exist). A backend that does not
 * implement a kind must refuse the model when it is created
 * (MOE_ERR_UNSUPPORTED), never compute it wrongly.
 *
 * Data that crosses the seam: token ids, router logits and gate weights
 * (small, always host memory), host copies of the residual stream for the
 * observers and the tools (get_x / set_x), and the weights. Non-expert
 * weights are the model's views (the backend uploads them once if it needs
 * to); expert weights are `struct moe_ffn` views into memory of the backend's
 * own kind (the model's mapping for the CPU backend without a budget, the
 * expert store's slots otherwise), at any stored type (moe-quant.h).
 *
 * Threads: a backend context belongs to one session and is driven by one
 * thread at a time; buffer_write may be called from the expert store's loader
 * threads concurrently with compute on other buffers.
 */
#ifndef MOE_BACKEND_H
#define MOE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "moe-model.h"
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_BACKEND_VERSION 6

/* Memory owned by a backend. */
struct moe_buffer {
    void *data;   /* the backend's address of the bytes (device pointer on a GPU) */
    void *host;   /* a host address of the same bytes, or NULL (device-only memory):
                   * the expert store reads blobs straight into it when not NULL */
    size_t size;
    void *priv;   /* the backend's own bookkeeping */
};

struct moe_backend;
struct cJSON;

/* What a caller may ask a backend about (supports). */
enum moe_backend_feature {
    MOE_BACKEND_FEAT_CPU_LAYOUTS = 0,  /* reads the CPU's interleaved weight layouts (q4_k_r16, q8_0_r16:
                                        * moe_model_repack, and the store's repack of expert copies) */
    MOE_BACKEND_FEAT_HOST_MEMORY = 1,  /* its buffers are host memory: the model's mapping is used in place */
    MOE_BACKEND_FEAT_EXPERT_BATCH = 2, /* expert_batch (a layer step's experts in one call) */
    MOE_BACKEND_FEAT_PLACE = 3,        /* place: experts may run on the host beside it (Twiddler) */
    MOE_BACKEND_FEAT_STAGE = 4,        /* stage_begin / stage_end: device memory fed through host staging */
    MOE_BACKEND_FEAT_KV_SEQ = 5,       /* kv_seq: n_seq KV caches, attention() on the one selected */
    MOE_BACKEND_FEAT_ATTENTION_MULTI = 6, /* attention_multi: one call for rows of several sequences */
    MOE_BACKEND_FEAT_GRAPH = 7,        /* decode_step: a whole one-token step on the device (moe-graph.h) */
};

/* What decode_step runs (moe-graph.h): every MoE layer's experts as the
 * session would use them with no budget, routed on the device. */
struct moe_step_desc {
    int k;                          /* experts per token */
    const struct moe_ffn *experts;  /* [n_layer x n_expert] views of the experts (rows of dense layers unused) */
    uint64_t generation;            /* changes whenever k or the table's content changes */
};

/* One routed expert's work in a layer step (expert_batch). */
struct moe_expert_work {
    struct moe_ffn f;       /* views in this backend's memory, or in host memory when host != 0 */
    const int32_t *rows;    /* [n_rows] batch rows */
    const int32_t *slots;   /* [n_rows] expert slots of those rows */
    const float *w;         /* [n_rows] gate weights */
    int n_rows;
    int host;               /* 1: compute it on the host over host-memory views (Twiddler's CPU side) */
    float *out;             /* [n_rows x n_embd] unweighted outputs (host), or NULL */
};

struct moe_backend_iface {
    uint32_t version; /* MOE_BACKEND_VERSION the backend implements */
    const char *name; /* "cpu", "cuda" */
    void (*free)(struct moe_backend *be);

    /* -- memory -- */
    /* buffer_alloc: size bytes, 4096-aligned (direct I/O can target the host view). */
    enum moe_status (*buffer_alloc)(struct moe_backend *be, size_t size, struct moe_buffer *out);
    void (*buffer_free)(struct moe_backend *be, struct moe_buffer *buf);
    /* buffer_write: copy n host bytes to dst at off (a no-op copy when dst->host == src + ...). */
    enum moe_status (*buffer_write)(struct moe_backend *be, struct moe_buffer *dst, size_t off,
                                    const void *src, size_t n);

    /* -- the residual stream x [n x n_embd] of the current chunk -- */
    enum moe_status (*embed)(struct moe_backend *be, const int32_t *tokens, int n);
    enum moe_status (*set_x)(struct moe_backend *be, const float *x, int n); /* host -> x */
    enum moe_status (*get_x)(struct moe_backend *be, float *x, int n);       /* x -> host */
    /* get_xn: the normed stream after ffn_norm (the router's input) -> host */
    enum moe_status (*get_xn)(struct moe_backend *be, float *xn, int n);

    /* -- one layer, for the n tokens at positions pos0.. -- */
    /* attention: x += o_proj(attention(attn_norm(x))), writing the layer's KV
     * cache at pos0..pos0+n-1 (GQA or MLA, see above). seq_len: the largest position of this forward
     * call + 1 (Phi-MoE's longrope scale depends on it). */
    enum moe_status (*attention)(struct moe_backend *be, int layer, int pos0, int n, int seq_len);
    /* ffn_norm: xn = ffn_norm(x); the layer's feed-forward accumulator and
     * its expert slots = 0. */
    enum moe_status (*ffn_norm)(struct moe_backend *be, int layer, int n);
    /* router: logits [n x n_expert] (host) = layer `layer`'s router applied to
     * xn. A layer above the current one is HOBBIT's stacked gating. */
    enum moe_status (*router)(struct moe_backend *be, int layer, int n, float *logits);
    /* expert: part[rows[i]][slots[i]] = w[i] * f(xn[rows[i]]) for i < n_rows,
     * f a SwiGLU FFN whose views live in this backend's memory; out (host,
     * may be NULL) receives the unweighted outputs f(xn[rows[i]])
     * [n_rows x n_embd]. A token's slots are summed in slot order by
     * residual(), so the result does not depend on the order experts run in
     * (the session gives each token's experts slots in ascending expert id,
     * the reference order). Slots not written this layer count as zero. */
    enum moe_status (*expert)(struct moe_backend *be, const struct moe_ffn *f, const int32_t *rows,
                              const int32_t *slots, const float *w, int n_rows, float *out);
    /* dense: acc += the layer's dense MLP (a dense layer) or its shared
     * expert (an MoE layer that has one), times sigmoid(shared gate) when
     * moe_config.shared_gated (Qwen2-MoE; DeepSeek adds it as it is). */
    enum moe_status (*dense)(struct moe_backend *be, int layer, int n);
    /* residual: acc += the expert slots (in slot order), then x += acc. */
    enum moe_status (*residual)(struct moe_backend *be, int n);
    /* lm_head: logits [n x n_vocab] (host) of rows row0..row0+n-1 of x
     * (output norm, LM head, bias). */
    enum moe_status (*lm_head)(struct moe_backend *be, int row0, int n, float *logits);

    /* -- host-row helpers for the tools (sensitivity sweep) -- */
    /* ffn_rows: y = f(x) for n host rows (n <= n_batch). */
    enum moe_status (*ffn_rows)(struct moe_backend *be, const struct moe_ffn *f, const float *x, float *y, int n);
    /* lm_head_rows: logits of n host rows of final residual stream (n <= n_batch). */
    enum moe_status (*lm_head_rows)(struct moe_backend *be, const float *x, int n, float *logits);

    /* -- version 2 -- */
    /* kv_cache_bytes: the bytes of the KV cache the backend allocated for
     * n_ctx tokens of every layer (what the attention kind keeps per token). */
    size_t (*kv_cache_bytes)(struct moe_backend *be);

    /* -- version 3 -- */
    /* expert_batch: expert() for n works of one layer step in one call (a GPU
     * launches its device works together); works with host != 0 have views in
     * host memory and run on the host, overlapped with the device's work.
     * The result is what expert() per work would give. The session uses it
     * when present; a backend with place must have it. */
    enum moe_status (*expert_batch)(struct moe_backend *be, const struct moe_expert_work *works, int n);
    /* place: where n experts of layer `layer` run this step (Twiddler): given
     * each one's routed rows tokens[i], stored precision prec[i] and
     * resident[i] (1: its copy is in this backend's memory or loading there
     * for this use), set host[i] = 1 to compute it on the host over its host
     * copy instead. Called by the expert store on the session's thread; NULL:
     * everything runs on the backend. */
    void (*place)(struct moe_backend *be, int layer, int n, const int32_t *tokens, const int32_t *prec,
                  const uint8_t *resident, uint8_t *host);
    /* stage_begin / stage_end: how the expert store fills a buffer without a
     * host view (host == NULL). stage_begin gives a host buffer of at least
     * `room` bytes for content `key` (pinned memory on a GPU, so reads can be
     * direct and the copy asynchronous) and *ready = 1 when it already holds
     * that content (the backend's host tier: no read needed). stage_end: the
     * caller is done with it; ok: it holds key's verified `n` raw bytes, to be
     * copied to dst (the backend orders its later reads of dst after the
     * copy). Called by the store's loader threads, concurrently. NULL: the
     * store reads into its own staging and calls buffer_write. */
    enum moe_status (*stage_begin)(struct moe_backend *be, uint64_t key, size_t room, void **host, int *ready);
    enum moe_status (*stage_end)(struct moe_backend *be, uint64_t key, void *host, int ok, struct moe_buffer *dst,
                                 size_t n);

    /* -- version 4 -- */
    /* supports: 1 if the backend has feature f (a member-based feature is
     * also answered from the members; NULL: only those). */
    int (*supports)(const struct moe_backend *be, enum moe_backend_feature f);
    /* stats_json: the backend's own counters since creation as one cJSON
     * object the caller owns (moe-run's --stats-json "backend"), or NULL. */
    struct cJSON *(*stats_json)(const struct moe_backend *be);

    /* -- version 5: several sequences, each with its own KV cache -- */
    /* kv_seq: attention() reads and writes sequence seq's KV cache from now
     * on (0 <= seq < moe_backend_params.n_seq; sequence 0 at creation). A
     * backend that has it allocates n_seq caches of n_ctx tokens each, and
     * kv_cache_bytes counts them all; one without it keeps one cache and
     * ignores n_seq. Selecting a cache neither clears nor moves anything. */
    enum moe_status (*kv_seq)(struct moe_backend *be, int seq);
    /* attention_multi: attention() for n rows of the stream that belong to
     * different sequences (a batched decode step): row i is sequence seq[i]'s
     * token at position pos[i]; its keys and values go to that sequence's
     * cache at pos[i] and it attends to that cache's positions 0 .. pos[i]
     * (its seq_len is pos[i] + 1). The seq[i] are distinct. Each row's result
     * is what attention() on that row alone, with its sequence selected,
     * gives. Requires kv_seq. NULL: the caller runs the rows one at a time
     * through kv_seq and attention(). */
    enum moe_status (*attention_multi)(struct moe_backend *be, int layer, const int *seq, const int *pos, int n);

    /* -- version 6: a whole decode step at once -- */
    /* decode_step: what embed(&token, 1), then for every layer attention(l,
     * pos, 1, pos + 1), ffn_norm, router, the session's routing (moe_route),
     * expert_batch of the chosen experts' views from d->experts, dense and
     * residual, then lm_head(0, 1, logits) give, without returning to the
     * host between them (a GPU captures it once as a graph and replays it;
     * its routing, on the device, may round the gate weights differently from
     * moe_route in the last bit). sel / w (may be NULL) get each MoE layer's choices and weights, [number
     * of MoE layers x d->k] in layer order. MOE_ERR_UNSUPPORTED (logged once
     * by the backend): this step cannot run so on this backend; nothing has
     * changed and the caller runs it op by op. NULL: never. */
    enum moe_status (*decode_step)(struct moe_backend *be, const struct moe_step_desc *d, int32_t token, int pos,
                                   float *logits, int32_t *sel, float *w);
};

struct moe_backend {
    const struct moe_backend_iface *iface;
    void *ctx; /* the backend's own state */
};

/* What a backend is created for. */
struct moe_backend_params {
    int n_ctx;     /* KV cache length in tokens (> 0) */
    int n_batch;   /* tokens per chunk (> 0) */
    int n_threads; /* CPU threads (<= 0: all online CPUs) */
    int n_slots;   /* expert slots per token (the most experts a token uses, >= 1) */
    int n_seq;     /* KV caches, one per sequence (<= 1: one); honoured by backends with kv_seq */
};

/* A backend constructor, for moe_session_params.backend_new (NULL there: the
 * registry's choice, moe_session_params.device). `user` is
 * moe_session_params.backend_user. */
typedef enum moe_status (*moe_backend_new_fn)(const struct moe_model *model, const struct moe_backend_params *p,
                                              void *user, struct moe_backend **out);

/* ---- the registry ---------------------------------------------------------- */

/* One backend compiled into this build. */
struct moe_backend_reg {
    const char *name;        /* "cpu", "cuda" */
    const char *description; /* one line for help and listings */
    /* device_count: devices of this kind usable now (0: compiled in, none present) */
    int (*device_count)(void);
    /* describe: "name, N MiB, ..." of device `index` into buf; 0 on success */
    int (*describe)(int index, char *buf, size_t size);
    /* init: a backend on device `index` for `model` (borrowed: it must outlive
     * the backend); `options` are the kind's own (struct moe_gpu_params * for
     * "cuda"; NULL: its defaults). */
    enum moe_status (*init)(const struct moe_model *model, const struct moe_backend_params *p, int index,
                            const void *options, struct moe_backend **out);
};

/* moe_backend_reg_count / moe_backend_reg_get: the registered backends, the
 * CPU one first; get returns NULL outside [0, count). */
int moe_backend_reg_count(void);
const struct moe_backend_reg *moe_backend_reg_get(int i);

/* moe_backend_reg_by_name: the registered backend `name` ("cpu", "cuda"), or NULL. */
const struct moe_backend_reg *moe_backend_reg_by_name(const char *name);

/* moe_backend_kind_known: 1 if `name` is a backend this project has, whether
 * or not this build includes it ("cuda" in a build without -DMOE_CUDA=ON). */
int moe_backend_kind_known(const char *name);

/* moe_backend_parse_device: split a device spec "name[:N]" ("cpu", "cuda",
 * "cuda:1", "auto") into its name (into name[name_size]) and index (0 when
 * absent). MOE_ERR_INVALID (message in err) for an unknown kind, a bad index
 * or a name too long; a known kind this build lacks is accepted here and
 * refused by moe_backend_init_by_name. Nothing is logged. */
enum moe_status moe_backend_parse_device(const char *spec, char *name, size_t name_size, int *index, char *err,
                                         size_t err_size);

/* moe_backend_init_by_name: a backend of kind `name` on device `index`
 * ("auto": moe_backend_init_best). Errors, each logged once with what to do:
 * MOE_ERR_UNSUPPORTED (a kind this build lacks, e.g. "cuda" without
 * -DMOE_CUDA=ON), MOE_ERR_INVALID (an unknown name), MOE_ERR_BACKEND (no such
 * device), and whatever the backend's init returns (MOE_ERR_NOMEM,
 * MOE_ERR_UNSUPPORTED for a model it cannot run, MOE_ERR_BACKEND). The
 * result's interface version is checked (1..MOE_BACKEND_VERSION). */
enum moe_status moe_backend_init_by_name(const char *name, int index, const struct moe_model *model,
                                         const struct moe_backend_params *p, const void *options,
                                         struct moe_backend **out);

/* moe_backend_init_best: the first registered backend other than the CPU's
 * that has a device, on its device 0; the CPU backend when none has. */
enum moe_status moe_backend_init_best(const struct moe_model *model, const struct moe_backend_params *p,
                                      const void *options, struct moe_backend **out);

/* moe_backend_check: the backend's interface version is one this runtime
 * knows (1..MOE_BACKEND_VERSION) and its required members are set;
 * MOE_ERR_UNSUPPORTED (logged) otherwise. Used for backends made by a
 * moe_backend_new_fn outside the registry. */
enum moe_status moe_backend_check(const struct moe_backend *be);

/* moe_backend_name: the backend's name ("cpu", "cuda"); "?" for NULL. */
const char *moe_backend_name(const struct moe_backend *be);

/* moe_backend_supports: 1 if be has feature f (see enum moe_backend_feature). */
int moe_backend_supports(const struct moe_backend *be, enum moe_backend_feature f);

/* ---- one wrapper per member ------------------------------------------------
 * Each checks the backend's version and the member's slot and calls it; a
 * member the backend lacks returns MOE_ERR_UNSUPPORTED (logged with the
 * backend's name) or, where stated, a neutral value. Arguments as in struct
 * moe_backend_iface above. */
enum moe_status moe_backend_buffer_alloc(struct moe_backend *be, size_t size, struct moe_buffer *out);
void moe_backend_buffer_free(struct moe_backend *be, struct moe_buffer *buf);
enum moe_status moe_backend_buffer_write(struct moe_backend *be, struct moe_buffer *dst, size_t off, const void *src,
                                         size_t n);
enum moe_status moe_backend_embed(struct moe_backend *be, const int32_t *tokens, int n);
enum moe_status moe_backend_set_x(struct moe_backend *be, const float *x, int n);
enum moe_status moe_backend_get_x(struct moe_backend *be, float *x, int n);
enum moe_status moe_backend_get_xn(struct moe_backend *be, float *xn, int n);
enum moe_status moe_backend_attention(struct moe_backend *be, int layer, int pos0, int n, int seq_len);
enum moe_status moe_backend_ffn_norm(struct moe_backend *be, int layer, int n);
enum moe_status moe_backend_router(struct moe_backend *be, int layer, int n, float *logits);
enum moe_status moe_backend_expert(struct moe_backend *be, const struct moe_ffn *f, const int32_t *rows,
                                   const int32_t *slots, const float *w, int n_rows, float *out);
enum moe_status moe_backend_dense(struct moe_backend *be, int layer, int n);
enum moe_status moe_backend_residual(struct moe_backend *be, int n);
enum moe_status moe_backend_lm_head(struct moe_backend *be, int row0, int n, float *logits);
enum moe_status moe_backend_ffn_rows(struct moe_backend *be, const struct moe_ffn *f, const float *x, float *y, int n);
enum moe_status moe_backend_lm_head_rows(struct moe_backend *be, const float *x, int n, float *logits);
/* moe_backend_kv_cache_bytes: 0 when the backend does not say. */
size_t moe_backend_kv_cache_bytes(struct moe_backend *be);
/* moe_backend_expert_batch: expert_batch where the backend has it, else
 * expert() per work (MOE_ERR_UNSUPPORTED for a host work then). */
enum moe_status moe_backend_expert_batch(struct moe_backend *be, const struct moe_expert_work *works, int n);
/* moe_backend_place: place() where the backend has it; else every host[i] = 0. */
void moe_backend_place(struct moe_backend *be, int layer, int n, const int32_t *tokens, const int32_t *prec,
                       const uint8_t *resident, uint8_t *host);
enum moe_status moe_backend_stage_begin(struct moe_backend *be, uint64_t key, size_t room, void **host, int *ready);
enum moe_status moe_backend_stage_end(struct moe_backend *be, uint64_t key, void *host, int ok,
                                      struct moe_buffer *dst, size_t n);
/* moe_backend_kv_seq: kv_seq where the backend has it; selecting sequence 0
 * of a backend without it is a no-op (MOE_OK), any other MOE_ERR_UNSUPPORTED. */
enum moe_status moe_backend_kv_seq(struct moe_backend *be, int seq);
/* moe_backend_attention_multi: attention_multi where the backend has it
 * (MOE_ERR_UNSUPPORTED otherwise; the session then runs the rows one at a
 * time, see moe_session_decode_batch). */
enum moe_status moe_backend_attention_multi(struct moe_backend *be, int layer, const int *seq, const int *pos, int n);
/* moe_backend_decode_step: decode_step where the backend has it
 * (MOE_ERR_UNSUPPORTED, not logged, otherwise: the caller runs op by op). */
enum moe_status moe_backend_decode_step(struct moe_backend *be, const struct moe_step_desc *d, int32_t token, int pos,
                                        float *logits, int32_t *sel, float *w);
/* moe_backend_stats_json: the backend's counters (caller owns), or NULL. */
struct cJSON *moe_backend_stats_json(const struct moe_backend *be);

/* moe_backend_free: be->iface->free(be); NULL is a no-op. */
void moe_backend_free(struct moe_backend *be);

/* ---- the backends of this build (registry rows) ---------------------------- */

/* moe_backend_cpu_new: the CPU reference backend for `model` (borrowed: it
 * must outlive the backend): KV cache and scratch in host memory, a thread
 * pool splitting matmuls by output rows and attention by (token, head).
 * Errors: MOE_ERR_NOMEM (logged with the KV cache size). */
enum moe_status moe_backend_cpu_new(const struct moe_model *model, const struct moe_backend_params *p,
                                    struct moe_backend **out);

/* moe_backend_cpu_threads: the threads of a CPU backend (caller included); 0 for another backend. */
int moe_backend_cpu_threads(const struct moe_backend *be);

/* moe_backend_cpu_adapt: a CPU backend's decode-mode chooser (runtime/cpu/
 * adapt-impl.h: every thread or the caller alone), for -v output and tests;
 * NULL for another backend. */
struct moe_adapt;
const struct moe_adapt *moe_backend_cpu_adapt(const struct moe_backend *be);

/* The registry's rows: defined by each backend's folder (runtime/cpu/,
 * runtime/cuda/), listed by backend.c. */
extern const struct moe_backend_reg moe_backend_reg_cpu;
extern const struct moe_backend_reg moe_backend_reg_cuda; /* only in builds with -DMOE_CUDA=ON */

#ifdef __cplusplus
}
#endif
#endif

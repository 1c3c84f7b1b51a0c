/*
 * moe-model.h - model description (from config.json) and weights (views into
 * mmapped checkpoint files) for the supported MoE architectures.
 *
 * Grouped by lifetime, as in llama2.c: struct moe_config is the hyper-parameters,
 * struct moe_model the weights (typed views into a mapped file; a bundle run
 * with an expert store reads its non-expert weights into memory the model owns
 * instead: moe_model_params.copy_dense), and struct moe_session
 * (moe-session.h) the run state.
 */
#ifndef MOE_MODEL_H
#define MOE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "moe-dtype.h"
#include "moe-quant.h"
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moe_arch {
    MOE_ARCH_MIXTRAL = 0,
    MOE_ARCH_QWEN2_MOE = 1,
    MOE_ARCH_QWEN3_MOE = 2,
    MOE_ARCH_OLMOE = 3,
    MOE_ARCH_PHIMOE = 4,
    MOE_ARCH_DEEPSEEK_V2 = 5,
    MOE_ARCH_DEEPSEEK_V3 = 6,
    MOE_ARCH_GPT_OSS = 7,
    MOE_ARCH_COUNT /* the number of architectures, not one (runtime/model/arch-impl.h: adding one) */
};

enum moe_ffn_act {
    MOE_ACT_SWIGLU = 0,     /* down(silu(gate x) * up x) */
    MOE_ACT_SWIGLU_OAI = 1, /* gpt-oss: g = min(gate x, limit), u = clamp(up x, +-limit),
                             * down(g * sigmoid(alpha g) * (u + 1)) */
};

enum moe_attn_kind {
    MOE_ATTN_GQA = 0, /* q/k/v projections, grouped-query attention, the cache holds K and V */
    MOE_ATTN_MLA = 1, /* DeepSeek's multi-head latent attention: the cache holds the normed
                       * compressed KV latent and the rotated shared rope key per token */
};

enum moe_norm_kind { MOE_NORM_RMS = 0, MOE_NORM_LAYER = 1 /* LayerNorm with bias */ };

enum moe_qk_norm {
    MOE_QK_NORM_NONE = 0,
    MOE_QK_NORM_HEAD = 1, /* RMSNorm over head_dim, per head (Qwen3-MoE) */
    MOE_QK_NORM_FULL = 2, /* RMSNorm over the whole q / k projection (OLMoE) */
};

enum moe_router_kind {
    MOE_ROUTER_SOFTMAX_TOPK = 0, /* softmax, top-k, optional renormalisation */
    MOE_ROUTER_SPARSEMIXER = 1,  /* Phi-MoE's sparsemixer, inference form, top-2 */
    MOE_ROUTER_SOFTMAX_GROUP = 2, /* DeepSeek-V2 group_limited_greedy: softmax, keep the topk_group
                                   * groups with the largest maximum, top-k within them */
    MOE_ROUTER_SIGMOID_GROUP = 3, /* DeepSeek-V3 noaux_tc: sigmoid scores + correction bias choose
                                   * (groups by the sum of their two best, then top-k); the weights
                                   * are the sigmoid scores, optionally renormalised */
};

enum moe_rope_kind {
    MOE_ROPE_DEFAULT = 0,
    MOE_ROPE_LINEAR = 1,
    MOE_ROPE_LONGROPE = 2,
    MOE_ROPE_LLAMA3 = 3,
    MOE_ROPE_YARN = 4,
};

#define MOE_MAX_EOS 8

struct moe_rope {
    enum moe_rope_kind kind;
    float theta;
    int n_rot;                 /* rotated dims per head (head_dim * partial_rotary_factor) */
    float factor;              /* linear / llama3 factor */
    /* longrope */
    float *short_factor;       /* [n_rot/2], owned */
    float *long_factor;        /* [n_rot/2], owned */
    float short_mscale, long_mscale;
    int has_mscale;            /* Phi-MoE: cos/sin scaled by short/long mscale */
    float attention_factor;    /* longrope without mscale fields */
    int original_max_pos;
    /* llama3 */
    float low_freq_factor, high_freq_factor;
    /* yarn (attention_factor scales cos/sin; factor and original_max_pos as above) */
    float beta_fast, beta_slow;
    int truncate;              /* round the correction range outwards (transformers' default) */
    int interleave;            /* rotate adjacent pairs (x0, x1), (x2, x3)... (DeepSeek) instead of
                                * the halves (x_i, x_{i+n_rot/2}) */
};

struct moe_config {
    enum moe_arch arch;
    char arch_name[64];        /* "MixtralForCausalLM", ... */
    int n_vocab;
    int n_embd;                /* hidden_size */
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;              /* query/key head size (MLA: qk_nope_dim + qk_rope_dim) */
    enum moe_attn_kind attn;
    /* MLA only (DeepSeek-V2/V3) */
    int q_lora_rank;           /* 0 = q_proj straight from the hidden state */
    int kv_lora_rank;          /* the compressed KV latent's size */
    int qk_nope_dim;           /* per-head query/key part without RoPE */
    int qk_rope_dim;           /* per-head query part with RoPE; one rope key shared by all heads */
    int v_head_dim;
    float attn_scale;          /* softmax scale of q.k (1/sqrt(head_dim), times YaRN's mscale^2) */
    int n_expert;              /* routed experts per MoE layer */
    int n_expert_used;         /* top-k */
    int n_ff_expert;           /* intermediate size of one routed expert */
    int n_ff_dense;            /* intermediate size of dense-MLP layers (0 if none) */
    int n_ff_shared;           /* shared expert intermediate size (0 = none) */
    int shared_gated;          /* the shared expert is scaled by sigmoid(shared_expert_gate x) (Qwen2) */
    enum moe_ffn_act expert_act; /* the routed experts' activation */
    float swiglu_alpha, swiglu_limit; /* MOE_ACT_SWIGLU_OAI */
    int expert_bias;           /* routed experts have gate/up/down biases (gpt-oss) */
    int router_bias;           /* the router has a bias (gpt-oss) */
    int attn_sinks;            /* a learned per-head sink logit joins each softmax (gpt-oss) */
    int norm_topk_prob;        /* renormalise the top-k weights to sum to 1 */
    enum moe_router_kind router;
    float router_jitter;       /* sparsemixer's jitter_eps */
    int n_group, topk_group;   /* group-limited routers: experts in n_group equal groups, the
                                * topk_group best groups searched (1, 1 otherwise) */
    float routed_scale;        /* routed_scaling_factor: multiplies the gate weights (1 otherwise) */
    enum moe_norm_kind norm;
    float norm_eps;
    int attn_qkv_bias;
    int attn_o_bias;
    enum moe_qk_norm qk_norm;
    float clip_qkv;            /* 0 = no clamping */
    int lm_head_bias;
    int tie_embeddings;
    int max_pos;               /* max_position_embeddings */
    struct moe_rope rope;
    int sliding_window;        /* 0 = none */
    uint8_t *layer_moe;        /* [n_layer] 1 = MoE block, 0 = dense MLP; owned */
    uint8_t *layer_sliding;    /* [n_layer] 1 = sliding-window attention; owned */
    int fp8_block[2];          /* block-scaled FP8 checkpoint (quantization_config quant_method fp8):
                                * weight_block_size rows x cols of one weight_scale_inv; 0, 0 = none */
    int bos_id;                /* -1 if unknown */
    int eos_ids[MOE_MAX_EOS];
    int n_eos;
};

/* moe_config_parse: parse config.json text into a description. Unknown
 * architectures, missing required fields and inconsistent values are logged
 * (naming the field) and returned as errors. `label` names the file in messages.
 * On success free with moe_config_clear(). */
enum moe_status moe_config_parse(const char *json, size_t len, const char *label,
                                 struct moe_config *out);

/* moe_config_load: read <dir>/config.json (and generation_config.json for EOS ids). */
enum moe_status moe_config_load(const char *dir, struct moe_config *out);

/* moe_config_add_generation: merge the EOS ids of a generation_config.json text
 * (malformed text is ignored: the file is optional). */
void moe_config_add_generation(struct moe_config *c, const char *json, size_t len);

/* moe_rope_inv_freq: the n_rot/2 inverse frequencies of c's RoPE into
 * inv_freq, in float32 as transformers computes them (default, linear,
 * longrope's short factors, llama3, YaRN's ramp). Every backend builds its
 * cos/sin tables from these, so they agree bit for bit. */
void moe_rope_inv_freq(const struct moe_config *c, float *inv_freq);

/* moe_config_kv_cache_bytes: the bytes of the KV cache the CPU backend
 * allocates for n_ctx positions (f32 rows): per layer and position, keys and
 * values of the KV heads (n_head_kv x head_dim each) or, with multi-head
 * latent attention (DeepSeek), the compressed latent and the shared RoPE key
 * (kv_lora_rank + qk_rope_dim) only. What moe_session_kv_bytes reports for a
 * CPU session; the planner counts it before any session exists. */
size_t moe_config_kv_cache_bytes(const struct moe_config *c, int n_ctx);

/* moe_config_clear: free owned arrays; the struct may be reused. */
void moe_config_clear(struct moe_config *c);

/* moe_arch_name: "mixtral", "qwen2_moe", ... */
const char *moe_arch_name(enum moe_arch a);

/* A weight matrix [n_out x n_in], row-major, rows stored in `type` (a float
 * type or a ggml-compatible quantized block type). Borrowed view. */
struct moe_weight {
    const void *data;
    enum moe_qtype type;
    int64_t n_out;
    int64_t n_in;
};

/* What a non-expert tensor is, for tools that rewrite a model (quantize). */
enum moe_tensor_role {
    MOE_ROLE_MATRIX = 0, /* a weight matrix: quantized to the dense type */
    MOE_ROLE_VECTOR = 1, /* norm weight or bias: kept as float32 */
    MOE_ROLE_ROUTER = 2, /* router / shared-expert gate: kept as float32 */
    MOE_ROLE_EXPERT = 3, /* part of a routed expert (not in refs: stored per expert) */
};

/* One non-expert tensor as the loader bound it (on-disk name, role, view). */
struct moe_tensor_ref {
    char name[256];
    enum moe_tensor_role role;
    int n_dims;             /* 1 (vectors: view of the float32 copy) or 2 */
    struct moe_weight w;    /* vectors: n_out = 1, n_in = length */
};

/* One SwiGLU feed-forward: down(silu(gate x) * up x), or for routed experts
 * the model's expert_act, with biases when `bias` is set. */
struct moe_ffn {
    struct moe_weight gate; /* [n_ff x n_embd] */
    struct moe_weight up;   /* [n_ff x n_embd] */
    struct moe_weight down; /* [n_embd x n_ff] */
    const float *bias;      /* [2*n_ff + n_embd]: gate, up and down biases, or NULL */
};

struct moe_layer {
    float *attn_norm, *attn_norm_b;  /* [n_embd]; _b only for LayerNorm */
    float *ffn_norm, *ffn_norm_b;    /* [n_embd] */
    struct moe_weight wq;            /* [n_head*head_dim x n_embd] (MLA: without q LoRA) */
    struct moe_weight wk;            /* [n_head_kv*head_dim x n_embd] (GQA) */
    struct moe_weight wv;            /* [n_head_kv*head_dim x n_embd] (GQA) */
    struct moe_weight wo;            /* [n_embd x n_head*head_dim] (MLA: n_head*v_head_dim) */
    float *bq, *bk, *bv, *bo;        /* biases or NULL */
    float *q_norm, *k_norm;          /* [head_dim] or [proj] per qk_norm, or NULL */
    float *sinks;                    /* [n_head] attention sink logits (attn_sinks), or NULL */
    /* MLA (cfg.attn == MOE_ATTN_MLA) */
    struct moe_weight wq_a;          /* [q_lora_rank x n_embd] (q_lora_rank > 0) */
    float *q_a_norm, *bq_a;          /* [q_lora_rank]; bias if attention_bias */
    struct moe_weight wq_b;          /* [n_head*head_dim x q_lora_rank] */
    struct moe_weight wkv_a;         /* [kv_lora_rank + qk_rope_dim x n_embd] */
    float *kv_a_norm, *bkv_a;        /* [kv_lora_rank]; [kv_lora_rank + qk_rope_dim] if attention_bias */
    struct moe_weight wkv_b;         /* [n_head*(qk_nope_dim + v_head_dim) x kv_lora_rank]: per head,
                                      * qk_nope_dim key rows then v_head_dim value rows */
    /* MoE block (layer_moe[l]); the routed experts are private to the model:
     * ask for them with moe_model_expert() */
    struct moe_weight router;        /* [n_expert x n_embd] */
    float *router_bias;              /* [n_expert] DeepSeek-V3's e_score_correction_bias, or NULL */
    float *router_b;                 /* [n_expert] the router's own bias (gpt-oss), or NULL */
    struct moe_ffn shared;           /* n_ff_shared > 0 */
    struct moe_weight shared_gate;   /* [1 x n_embd] */
    /* dense MLP (!layer_moe[l]) */
    struct moe_ffn dense;
};

struct moe_safetensors;
struct moe_bundle;
struct moe_gguf;
struct moe_gguf_model;
struct moe_tokenizer;
struct moe_model_impl; /* private: the routed experts and their stored precisions */

struct moe_model {
    struct moe_config cfg;
    struct moe_weight tok_embd;      /* [n_vocab x n_embd] */
    float *out_norm, *out_norm_b;    /* [n_embd] */
    struct moe_weight lm_head;       /* [n_vocab x n_embd] (tok_embd if tied) */
    float *lm_head_b;                /* [n_vocab] or NULL */
    struct moe_layer *layers;        /* [n_layer] */
    struct moe_tensor_ref *refs;     /* [n_refs] every non-expert tensor bound, in load order */
    int n_refs;
    struct moe_safetensors *st;      /* owns the mapped weights of a checkpoint directory */
    struct moe_bundle *bundle;       /* owns the mapped weights of a bundle */
    struct moe_gguf *gguf;           /* owns the mapped weights of a GGUF file */
    struct moe_gguf_model *gguf_view; /* the GGUF seen as a Hugging Face checkpoint: its config.json
                                      * and tokenizer texts, rebuilt q/k/kv_b buffers (moe-gguf-model.h) */
    int expert_precision;            /* bundles: index of the stored precision every expert uses,
                                      * -1 when they differ (a bit-width map) */
    int n_expert_prec;               /* bundles: stored precisions (0 for checkpoints) */
    struct moe_model_impl *impl;     /* private (model.c) */
    struct moe_tokenizer *tok;       /* NULL if the model has no tokenizer */
    char *path;
};

struct moe_model_params {
    /* Bundles only: which stored expert precision every expert uses, by type
     * name ("q8_0", "q4_k", ...). NULL = the bundle's default: the per-expert
     * bit-widths of its tuning key MOE_TUNING_BITWIDTH_MAP if present (written
     * by `moe-prep bitwidth`), else the first stored precision. */
    const char *expert_precision;
    /* Bundles only: 1 = do not bind (and check) the routed experts at load;
     * each blob is checked when moe_model_expert first asks for it. For the
     * offloading store, which reads blobs itself and must not touch every
     * expert's pages at start-up. 0 (default) = bind and check all at load. */
    int lazy_experts;
    /* Bundles only: where the non-expert weights (attention, norms, router,
     * shared and dense FFNs, embeddings, LM head) are read from while the
     * model runs. 1 = read them once at load, through the file (pread, not
     * the mapping), into one buffer the model owns, each tensor checked
     * against its checksum: a bundle truncated or rewritten later cannot
     * raise SIGBUS in, or change, these weights (the same bytes, so the
     * logits are bit-identical). -1 = views into the mapping (llama2.c
     * style: no copy, pages shared with the page cache). 0 (default) =
     * decided by lazy_experts: copied when it is set, i.e. whenever the
     * model runs with an expert store (a budget), where the non-expert
     * weights are small next to the experts and the mapping would otherwise
     * be the only thing a running model reads from the file unchecked. */
    int copy_dense;
};

/* The bundle tuning key of EdgeMoE's per-expert bit-width map: i64
 * [n_layer x n_expert], each routed expert's home precision as an index into
 * the bundle's precision table, -1 for layers without routed experts. */
#define MOE_TUNING_BITWIDTH_MAP "edgemoe.bitwidth.map"

struct moe_model_params moe_model_default_params(void);

/* moe_model_load: load a model from `path`: a Hugging Face checkpoint
 * directory, a llama.cpp GGUF file (a file starting with the GGUF magic or
 * named *.gguf), or a .moeb bundle file written by `moe-prep quantize`. */
enum moe_status moe_model_load(const char *path, const struct moe_model_params *params,
                               struct moe_model **out);

/* moe_model_load_bundle_memory: moe_model_load of a bundle image in memory
 * (buf[0..len) is borrowed and must outlive the model; label names it in
 * messages). For tests and the fuzz target that goes from bundle bytes to a
 * bound model. */
enum moe_status moe_model_load_bundle_memory(const void *buf, size_t len, const char *label,
                                             const struct moe_model_params *params, struct moe_model **out);

/* moe_model_load_hf: load a Hugging Face checkpoint directory (config.json,
 * *.safetensors, optional tokenizer.json). Checks every tensor's presence and
 * shape; errors name the tensor. */
enum moe_status moe_model_load_hf(const char *dir, struct moe_model **out);

/* moe_model_load_gguf: load a llama.cpp GGUF file (moe-gguf-model.h says
 * what is read and how): the config from its metadata, every tensor's
 * presence and shape checked, routed experts as views into the merged expert
 * tensors in their stored types, the tokenizer from tokenizer.ggml.* when
 * present. */
enum moe_status moe_model_load_gguf(const char *path, struct moe_model **out);

/* moe_model_load_source: a source checkpoint for the offline tools: a
 * directory (moe_model_load_hf) or a GGUF file (moe_model_load_gguf). Other
 * paths are refused with a message naming both. */
enum moe_status moe_model_load_source(const char *path, struct moe_model **out);

/* moe_model_expert: views of routed expert (layer, expert)'s three
 * matrices at stored precision `precision` (bundles: an index into the
 * precision table, see moe_bundle_precision_at; -1 = the precision the
 * expert is bound at; checkpoints: -1 only). The first use of a bundle blob
 * checks it (checksum, or decompression into a buffer the model owns); the
 * views stay valid until moe_model_free. Thread-safe (a lock guards the
 * first check). MOE_ERR_INVALID (logged) for indices out of range, a layer
 * without experts or a precision a checkpoint does not have; MOE_ERR_FORMAT
 * for a damaged blob. */
enum moe_status moe_model_expert(const struct moe_model *m, int layer, int expert, int precision,
                                 struct moe_ffn *out);

/* moe_model_repack: give the model's matrices the layout the CPU's integer
 * kernels read fastest (moe_repack_type / moe_repack, moe-quant.h: today
 * q4_k matrices of whole 16-row groups under AVX2 or AVX-512, and q8_0 ones
 * under AVX-512 VNNI): the attention
 * and dense/shared FFN weights and the LM head, and with `experts` set the
 * routed experts bound now (all of them unless loaded with lazy_experts).
 * The copies live in one buffer the model owns (the mapped file's pages are
 * then no longer read); views handed out before the call keep pointing at
 * the stored rows, which stay valid. MLA's kv_b (read a row at a time) and
 * the token embedding (a row lookup) are left alone. For the CPU backend
 * only: other backends do not read the layouts. *bytes (if not NULL): the
 * bytes rewritten (0 when nothing qualifies, e.g. without VNNI). Must not run
 * while a session of this model computes. MOE_ERR_NOMEM (logged, the model
 * unchanged) if the buffer cannot be had; MOE_ERR_IO (logged) when the
 * bundle's file changed since load (moe_model_check_file), before any
 * mapped weight is read. */
enum moe_status moe_model_repack(struct moe_model *m, int experts, size_t *bytes);

/* moe_model_set_expert_precision: rebind routed expert (layer, expert) of a
 * bundle to stored precision index `precision` (see moe_bundle_precision_at).
 * The first use of a blob checks it (checksum, or decompression); later
 * switches only move pointers. MOE_ERR_UNSUPPORTED for a checkpoint
 * directory, MOE_ERR_INVALID for an index out of range or a layer without
 * experts. Must not run while a session of this model computes. */
enum moe_status moe_model_set_expert_precision(struct moe_model *m, int layer, int expert, int precision);

/* moe_model_get_expert_precision: the stored precision index expert (layer,
 * expert) is bound at; -1 for a checkpoint directory or indices out of range. */
int moe_model_get_expert_precision(const struct moe_model *m, int layer, int expert);

/* moe_model_precision_summary: what precision the routed experts run at, as
 * text for messages: "q4_k", "per-expert map: 4 x q4_k 28 x q2_k", or "as
 * stored in the checkpoint". Always NUL-terminated (size > 0). */
void moe_model_precision_summary(const struct moe_model *m, char *buf, size_t size);

/* moe_model_check_file: whether the file a bundle model was loaded from
 * still holds the bytes it mapped (moe_bundle_check_file: size, modification
 * time and the header page of the mapped file; a tuning replacement is
 * accepted). MOE_ERR_IO, logged once naming the file ("changed while the
 * model was running (size X -> Y bytes; ...); restart") and sticky, when not.
 * MOE_OK for checkpoints and GGUF files (not watched) and bundles in memory.
 * The session calls it every MOE_SESSION_CHECK_TOKENS tokens and the expert
 * store before every read. Thread-safe; about two system calls. */
enum moe_status moe_model_check_file(const struct moe_model *m);

/* moe_model_free: NULL is a no-op. */
void moe_model_free(struct moe_model *m);

/* moe_model_check_output: MOE_ERR_INVALID (logged, naming both) if `output`
 * is the same file (device and inode) as one m was read from: the bundle, or
 * a checkpoint's shards, index, config.json, generation_config.json,
 * tokenizer.json or tokenizer_config.json. A tool calls it before writing so
 * an output path never overwrites the model it reads. */
enum moe_status moe_model_check_output(const struct moe_model *m, const char *output);

/* moe_model_n_params: total parameters of all weights (for reporting). */
int64_t moe_model_n_params(const struct moe_model *m);

#ifdef __cplusplus
}
#endif
#endif

/*
 * arch-impl.h - private to runtime/model: the architecture table (arch.c),
 * the family files (arch-*.c) that hold what one family of architectures
 * does differently, and what those files use from the config parser
 * (config.c), the GGUF translation (gguf-model.c) and the tensor binder
 * (model.c). Not installed; moe-model.h and moe-gguf-model.h are the API.
 *
 * One row per architecture (struct arch_row, arch.c's table, indexed by
 * enum moe_arch) names it (moe_arch_name, the transformers class, the GGUF
 * general.architecture), says by data what differs in config.json defaults
 * and tensor names, and points at hooks for what takes code. A NULL hook is
 * the generic path: grouped-query attention with head_dim, experts sized by
 * intermediate_size, no family fields. The hooks live in one file per family:
 *
 *   arch-mixtral.c    Mixtral (GGUF "llama" with experts)
 *   arch-qwen-moe.c   Qwen2-MoE and Qwen3-MoE
 *   arch-olmoe.c      OLMoE
 *   arch-phimoe.c     Phi-MoE
 *   arch-deepseek.c   DeepSeek-V2 and -V3 (multi-head latent attention,
 *                     group-limited routing, shared experts)
 *   arch-gpt-oss.c    gpt-oss (clamped SwiGLU, sinks, MXFP4 experts)
 *
 * What stays shared is what a row switches on rather than what one family
 * reads: the field readers (cfg_int, ...), RoPE kinds and YaRN, layer kinds
 * and sliding windows, quantization_config and FP8 checkpoints (config.c);
 * the GGUF key readers (gm_*), Llama's q/k rope-order undo and MLA's kv_b
 * rebuild (gguf-model.c); GQA and MLA attention binding, per-expert and
 * fused v5 experts, FP8 dequantization and bundles (model.c). The family
 * hooks are called at fixed points, in the order the row lists them, so a
 * family sees what the shared code parsed before it.
 *
 * Adding an architecture now takes:
 *   1. moe-model.h: an enum moe_arch value, before MOE_ARCH_COUNT (append:
 *      the values are compared, never stored in files; profiles and bundles
 *      keep names).
 *   2. arch.c: its row, at [MOE_ARCH_<NEW>] in k_rows: moe_arch_name, the
 *      transformers class (config.json "architectures"), the GGUF
 *      general.architecture if llama.cpp has one, the defaults of its config
 *      class (rms_norm_eps, rope_theta, norm_topk_prob, attention bias, ...),
 *      its MoE block and expert tensor names, and its hooks.
 *   3. arch-<family>.c: the hooks (config fields of its own, GGUF key
 *      translation, a different expert layout); a new family is a new file,
 *      listed in CMakeLists.txt's moe_runtime sources, its hooks declared
 *      below. A family that only differs by data needs no file.
 *   4. If it brings something the forward pass does not know (an attention,
 *      norm, router, activation or RoPE kind): the enum and its fields in
 *      moe-model.h's struct moe_config, the CPU reference in
 *      runtime/cpu/backend-cpu.c (a router in runtime/session.c), and the
 *      CUDA backend: runtime/cuda/backend.cu's supported() accepts
 *      architectures by enum range (today Mixtral to Phi-MoE) and refuses
 *      kinds it has no kernel for (runtime/cuda/kernels.cu). The bundle
 *      writer needs nothing (it stores the config.json text).
 *   5. Tests: test-config's table check covers the row; a config case in
 *      tests/test-config.c; a tiny checkpoint and its transformers oracle
 *      (tests/oracle/make_model_fixtures.py -> tests/fixtures/models) for
 *      test-forward and test-model-quality; a GGUF fixture
 *      (tests/oracle/make_gguf_fixtures.py -> tests/fixtures/gguf) for
 *      test-gguf-model when llama.cpp converts it; a test-stages-<arch>
 *      line in tests/CMakeLists.txt if it needs its own pass through the
 *      stages.
 *   6. docs/architecture.md "Architectures" (its column), docs/format.md
 *      "GGUF input" (its keys).
 */
#ifndef MOE_ARCH_IMPL_H
#define MOE_ARCH_IMPL_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "moe-gguf-model.h"
#include "moe-model.h"

struct arch_row;

/* ------------------------------------------------------------------------- */
/* config.json (config.c)                                                     */

/* Parsing context: the JSON root, the label used in messages and the row of
 * the architecture named by "architectures". */
struct cfg_ctx {
    const cJSON *root;
    const char *label;
    const struct arch_row *row;
};

/* cfg_field: a top-level field, NULL when absent or null. */
const cJSON *cfg_field(const struct cfg_ctx *c, const char *name);
/* cfg_int: read an integer field in [lo, hi]; required fields report their
 * absence, optional ones take def. */
enum moe_status cfg_int(const struct cfg_ctx *c, const char *name, int required, int def, int lo, int hi, int *out);
/* cfg_float: a number member of obj within float range, def when absent or null. */
enum moe_status cfg_float(const struct cfg_ctx *c, const cJSON *obj, const char *name, double def, float *out);
/* cfg_bool: a top-level true / false, def when absent or null. */
enum moe_status cfg_bool(const struct cfg_ctx *c, const char *name, int def, int *out);
/* cfg_yarn_mscale: YaRN's attention temperature 0.1 * m * ln(scale) + 1 (1 for scale <= 1). */
double cfg_yarn_mscale(double scale, double m);

/* ------------------------------------------------------------------------- */
/* GGUF (gguf-model.c)                                                        */

/* The GGUF seen as a checkpoint (moe-gguf-model.h); its row may be refined
 * by the row's gguf_check (deepseek2 is V2 or V3). */
struct moe_gguf_model {
    const struct moe_gguf *g;
    const char *path;
    const struct arch_row *row;
    char arch[32];        /* general.architecture: the prefix of the keys */
    int n_layer;
    char *config_json, *tok_json, *tok_cfg_json;
    struct moe_gguf_hf_tensor *t; /* sorted by name */
    size_t n_t, cap_t;
    char **names;         /* owned name strings of t[] */
    void **owned;         /* rebuilt buffers and expert biases */
    size_t n_owned;
};

/* Number-valued config fields collected from the metadata: the first error
 * sticks in *st and stops later reads from adding anything. */
struct cfgb {
    const struct moe_gguf_model *v;
    cJSON *root;
    enum moe_status st;
};

/* gm_akv: the value of "{arch}.suffix", or NULL. */
const struct moe_gguf_kv *gm_akv(const struct moe_gguf_model *v, const char *suffix);
/* gm_kv_int: a scalar integer item; 0 = absent (*out unchanged), 1 = read,
 * -1 = present with the wrong type (logged). */
int gm_kv_int(const struct moe_gguf_model *v, const struct moe_gguf_kv *kv, int64_t *out);
/* gm_fail: record the first error of a config build. */
void gm_fail(struct cfgb *b, enum moe_status st);
/* gm_put_int_key: config field `field` (NULL: none) from key {arch}.suffix,
 * in [lo, hi]; required keys report their absence. Returns 1 when read. */
int gm_put_int_key(struct cfgb *b, const char *field, const char *suffix, int required, int64_t lo, int64_t hi,
                   int64_t *out);
/* gm_get_float_key, gm_get_bool_key: a float / bool key; 1 when present and valid. */
int gm_get_float_key(struct cfgb *b, const char *suffix, double *out);
int gm_get_bool_key(struct cfgb *b, const char *suffix, int *out);
/* gm_has: 1 if the file holds a tensor of this name (printf-style). */
int gm_has(const struct moe_gguf_model *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* gm_put_ff: an intermediate size from a key, else from a tensor's row count
 * (tensor_fmt takes the layer). */
void gm_put_ff(struct cfgb *b, const char *field, const char *suffix, const char *tensor_fmt);
/* gm_put_topk_norm: norm_topk_prob from expert_weights_norm, else llama.cpp's
 * fixed choice for the architecture. */
void gm_put_topk_norm(struct cfgb *b, int dflt);

/* ------------------------------------------------------------------------- */
/* tensor binding (model.c)                                                   */

/* A tensor as a source (checkpoint or bundle) describes it. */
struct src_tensor {
    const void *data;
    uint64_t size;   /* bytes the source stores for it (views are checked against it) */
    size_t index;    /* position in the source's tensor table (see bind.used) */
    enum moe_qtype type;
    int n_dims;
    int64_t shape[8];
    int raw_u8;   /* raw bytes (safetensors U8: packed MXFP4 blocks or scales), not a weight */
};

/* Binding context: where tensors come from, and the path for messages.
 * find() returns 1 and fills *t if the source has `name`. */
struct bind {
    int (*find)(const struct bind *b, const char *name, struct src_tensor *t);
    const void *src;       /* the moe_safetensors or moe_bundle */
    const char *path;
    struct moe_model *m;   /* refs of non-expert tensors are recorded here */
    /* bundles bind routed experts from blobs; NULL = by tensor name */
    enum moe_status (*bind_expert)(const struct bind *b, int layer, int expert, struct moe_ffn *out);
    unsigned char *used;   /* [source tensor count]: set when a tensor is bound */
    float *const *deq;     /* safetensors: [source tensor count] float32 copies of block-scaled FP8
                            * weights (NULL entries for other tensors); NULL = none */
};

/* bind_has_tensor: 1 if the source has `name`. */
int bind_has_tensor(const struct bind *b, const char *name);
/* bind_find_tensor: look up `name` and check its dims, its kind (raw bytes,
 * U8, or a weight type) and that the view lies inside what the source
 * stores; errors are logged and name the tensor. */
enum moe_status bind_find_tensor(const struct bind *b, const char *name, int n_dims, const int64_t *dims, int raw_u8,
                                 struct src_tensor *t);
/* bind_find_shape: a weight tensor of exactly the given shape. */
enum moe_status bind_find_shape(const struct bind *b, const char *name, int n_dims, const int64_t *dims,
                                struct src_tensor *t);
/* bind_own: keep a malloc'd buffer alive as long as the model (MOE_ERR_NOMEM:
 * p is freed). */
enum moe_status bind_own(struct moe_model_impl *mi, void *p);

/* ------------------------------------------------------------------------- */
/* the table (arch.c)                                                         */

struct arch_row {
    enum moe_arch arch;
    const char *name;          /* moe_arch_name: "mixtral" */
    const char *hf_class;      /* config.json "architectures"[0]: "MixtralForCausalLM" */
    const char *gguf_name;     /* general.architecture, or NULL (DeepSeek-V3 shares V2's deepseek2) */

    /* config.json: the defaults of transformers' config class, and which keys are read */
    const char *n_expert_key;  /* the expert count's name when neither num_local_experts nor
                                * num_experts is present (NULL: num_experts) */
    int moe_intermediate;      /* experts sized by moe_intermediate_size; intermediate_size is the
                                * dense MLP's (0: intermediate_size sizes the experts) */
    enum moe_router_kind router;
    int norm_topk_prob;        /* renormalise the top-k weights by default */
    int norm_topk_key;         /* config.json's norm_topk_prob is read (else the default is fixed) */
    enum moe_norm_kind norm;
    double norm_eps;           /* rms_norm_eps default */
    const char *attn_bias_key; /* the attention-bias switch: "attention_bias", "qkv_bias"; NULL: none */
    int attn_bias_default;
    int attn_bias_o;           /* the switch covers o_proj too */
    enum moe_qk_norm qk_norm;
    double rope_theta;         /* rope_theta default */
    const char *native_quant;  /* a quantization_config quant_method the checkpoint's own tensors
                                * carry and the binder reads as they are ("mxfp4"), or NULL */
    const char *first_dense_key; /* the field counting leading dense layers, or NULL */
    int first_dense_default;
    int sparse_step;           /* decoder_sparse_step picks the MoE layers */
    int sliding_switch;        /* sliding_window applies only with use_sliding_window (default false) */

    /* config.json hooks, in the order the parser calls them */
    enum moe_status (*parse_attention)(const struct cfg_ctx *c, struct moe_config *cfg); /* instead of
                                * GQA's head_dim: the attention's own shapes */
    enum moe_status (*parse_ffn)(const struct cfg_ctx *c, struct moe_config *cfg); /* shared experts */
    enum moe_status (*parse_routing)(const struct cfg_ctx *c, struct moe_config *cfg);
    enum moe_status (*parse_fields)(const struct cfg_ctx *c, struct moe_config *cfg); /* the family's
                                * own fields, after tie_word_embeddings */
    enum moe_status (*parse_longrope)(const struct cfg_ctx *c, struct moe_config *cfg, const cJSON *p);
    enum moe_status (*finish_rope)(const struct cfg_ctx *c, struct moe_config *cfg); /* after the
                                * RoPE and the default softmax scale */
    enum moe_status (*sliding_layers)(const struct cfg_ctx *c, struct moe_config *cfg); /* which
                                * layers slide when layer_types is absent (NULL: all) */

    /* GGUF: data and hooks, in the order gguf-model.c calls them */
    int gguf_qk_permuted;      /* q/k rows are in llama.cpp's rope order (its llama converter) */
    enum moe_status (*gguf_check)(struct moe_gguf_model *v); /* after block_count: refuse, or refine
                                * v->row */
    void (*gguf_shapes)(struct cfgb *b, int64_t n_head); /* instead of the GQA keys (head_count_kv,
                                * key_length, expert_count); implies rope dims of its own */
    void (*gguf_config)(struct cfgb *b); /* the family's keys, after the shapes */
    int (*gguf_rope)(struct cfgb *b, cJSON *rp, int64_t n_rot, int64_t max_pos); /* 1: wrote (or
                                * failed) rope_parameters itself */
    void (*gguf_yarn)(struct cfgb *b, cJSON *rp, int have_attn_factor); /* YaRN extras */

    /* tensor names (model.c; the GGUF table too) */
    const char *moe_block;     /* "mlp", or "block_sparse_moe" (Mixtral's names; v5 checkpoints
                                * that spell it mlp are read too) */
    const char *router_name;   /* the router in the block: "gate", "router" */
    const char *expert_ffn[3]; /* experts.E.<gate>, <up>, <down> */
    const char *shared_block;  /* the shared expert(s): "mlp.shared_expert", "mlp.shared_experts" */
    enum moe_status (*bind_experts)(const struct bind *b, struct moe_ffn *experts, const struct moe_config *c,
                                    const char *prefix); /* one layer's experts from a checkpoint,
                                * instead of per-expert or fused tensors */
};

/* arch_row: the row of a valid enum value (MOE_ASSERT). */
const struct arch_row *arch_row(enum moe_arch a);
/* arch_count / arch_at: the rows in enum order. */
size_t arch_count(void);
const struct arch_row *arch_at(size_t i);
/* arch_by_hf, arch_by_name: the row of a transformers class / moe_arch_name; NULL if none. */
const struct arch_row *arch_by_hf(const char *hf_class);
const struct arch_row *arch_by_name(const char *name);
/* arch_by_gguf: the row of a general.architecture (n bytes at p); NULL if none. */
const struct arch_row *arch_by_gguf(const char *p, size_t n);
/* arch_list: the transformers classes (gguf = 0) or GGUF names (gguf = 1),
 * ", "-separated, for messages; always NUL-terminated (size > 0). */
void arch_list(int gguf, char *buf, size_t size);

/* ------------------------------------------------------------------------- */
/* the family files' hooks                                                    */

/* arch-mixtral.c */
enum moe_status moe_mixtral_gguf_check(struct moe_gguf_model *v);
void moe_mixtral_gguf_config(struct cfgb *b);

/* arch-qwen-moe.c */
enum moe_status moe_qwen2_moe_parse_ffn(const struct cfg_ctx *c, struct moe_config *cfg);
enum moe_status moe_qwen2_moe_sliding_layers(const struct cfg_ctx *c, struct moe_config *cfg);
void moe_qwen2_moe_gguf_config(struct cfgb *b);
void moe_qwen3_moe_gguf_config(struct cfgb *b);

/* arch-olmoe.c */
enum moe_status moe_olmoe_parse_fields(const struct cfg_ctx *c, struct moe_config *cfg);
void moe_olmoe_gguf_config(struct cfgb *b);

/* arch-phimoe.c */
enum moe_status moe_phimoe_parse_routing(const struct cfg_ctx *c, struct moe_config *cfg);
enum moe_status moe_phimoe_parse_fields(const struct cfg_ctx *c, struct moe_config *cfg);
enum moe_status moe_phimoe_parse_longrope(const struct cfg_ctx *c, struct moe_config *cfg, const cJSON *p);
void moe_phimoe_gguf_config(struct cfgb *b);
int moe_phimoe_gguf_rope(struct cfgb *b, cJSON *rp, int64_t n_rot, int64_t max_pos);

/* arch-deepseek.c */
enum moe_status moe_deepseek_parse_mla(const struct cfg_ctx *c, struct moe_config *cfg);
enum moe_status moe_deepseek_parse_ffn(const struct cfg_ctx *c, struct moe_config *cfg);
enum moe_status moe_deepseek_parse_routing(const struct cfg_ctx *c, struct moe_config *cfg);
enum moe_status moe_deepseek_mla_rope(const struct cfg_ctx *c, struct moe_config *cfg);
enum moe_status moe_deepseek_gguf_check(struct moe_gguf_model *v);
void moe_deepseek_gguf_shapes(struct cfgb *b, int64_t n_head);
void moe_deepseek_gguf_yarn(struct cfgb *b, cJSON *rp, int have_attn_factor);

/* arch-gpt-oss.c */
enum moe_status moe_gpt_oss_parse_fields(const struct cfg_ctx *c, struct moe_config *cfg);
enum moe_status moe_gpt_oss_sliding_layers(const struct cfg_ctx *c, struct moe_config *cfg);
void moe_gpt_oss_gguf_config(struct cfgb *b);
void moe_gpt_oss_gguf_yarn(struct cfgb *b, cJSON *rp, int have_attn_factor);
enum moe_status moe_gpt_oss_bind_experts(const struct bind *b, struct moe_ffn *experts, const struct moe_config *c,
                                         const char *prefix);

#endif

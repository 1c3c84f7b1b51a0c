/*
 * model.c - bind a checkpoint's tensors (on-disk Hugging Face names) to the
 * model description, checking presence, dtype and shape of each.
 *
 * Matrices stay in the mapped files (zero-copy views in their stored dtype);
 * only small vectors (norm weights, biases) are converted to float32 copies,
 * and block-scaled FP8 weights (F8_E4M3 with a `_scale_inv` per
 * weight_block_size block, DeepSeek-V3's release format) are dequantized into
 * float32 copies the model owns (4 bytes per weight), so every later stage sees
 * an ordinary f32 checkpoint. moe_model_repack copies q4_k matrices into the
 * CPU kernels' interleaved layout on request.
 *
 * The names that differ by architecture (the MoE block, the router, the
 * experts' and the shared expert's) come from its row of the architecture
 * table (arch.c); a family with its own expert layout binds it in its file
 * (arch-gpt-oss.c: merged, MXFP4).
 */
#define _GNU_SOURCE /* madvise(MADV_HUGEPAGE) */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arch-impl.h"
#include "moe-bundle.h"
#include "moe-file.h"
#include "moe-gguf-model.h"
#include "moe-mmap.h"
#include "moe-model.h"
#include "moe-safetensors.h"
#include "moe-tokenizer.h"

/* The model's private part: the routed experts, asked for by (layer, expert,
 * precision) through moe_model_expert(), never handed out as an array. */
struct moe_model_impl {
    struct moe_ffn *experts;   /* [n_layer x n_expert] views at the bound precision (zeroed for
                                * dense layers, and for bundles loaded with lazy_experts until used) */
    int16_t *expert_prec;      /* bundles: [n_layer x n_expert] stored precision each expert is bound
                                * at (0 for layers without experts); NULL for checkpoints */
    const void **expert_base;  /* bundles: [n_layer x n_expert x n_expert_prec] raw blob bytes once
                                * checked (in the map, or decompressed into `owned`); NULL = not yet */
    void **owned;              /* [n_owned] buffers owned by the model (decompressed blobs) */
    int n_owned;
    int lazy;                  /* experts not bound at load (moe_model_params.lazy_experts) */
    const void **dense_copy;   /* bundles loaded with copy_dense: [bundle tensor count] each non-expert
                                * tensor's bytes in `owned` memory, bound instead of the mapping */
    pthread_mutex_t lock;      /* guards expert_base / owned for moe_model_expert */
};

/* bind_has_tensor: 1 if the source has `name`. */
int bind_has_tensor(const struct bind *b, const char *name) {
    struct src_tensor t;
    return b->find(b, name, &t);
}

/* record: remember a bound non-expert tensor (for quantize). */
static enum moe_status record(const struct bind *b, const char *name, enum moe_tensor_role role, int n_dims,
                              struct moe_weight w) {
    struct moe_model *m = b->m;
    if (m->n_refs == 0 || (m->n_refs >= 16 && (m->n_refs & (m->n_refs - 1)) == 0)) { /* 16, 32, 64, ... */
        struct moe_tensor_ref *r = realloc(m->refs, sizeof *r * (size_t)(m->n_refs ? 2 * m->n_refs : 16));
        if (!r) return MOE_ERR_NOMEM;
        m->refs = r;
    }
    struct moe_tensor_ref *r = &m->refs[m->n_refs++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->role = role;
    r->n_dims = n_dims;
    r->w = w;
    return MOE_OK;
}

/* bind_find_tensor: look up `name` and check its dims, its kind (raw bytes,
 * U8, or a weight type) and that the view lies inside what the source stores
 * (a directory entry may keep a tensor's shape while its stored bytes are fewer). */
enum moe_status bind_find_tensor(const struct bind *b, const char *name, int n_dims, const int64_t *dims, int raw_u8,
                                 struct src_tensor *t) {
    if (!b->find(b, name, t)) {
        MOE_LOGE("%s: missing tensor \"%s\"", b->path, name);
        return MOE_ERR_NOT_FOUND;
    }
    if (t->raw_u8 != raw_u8) {
        MOE_LOGE("%s: tensor \"%s\" %s", b->path, name,
                 raw_u8 ? "must hold raw bytes (U8)" : "holds raw bytes (U8), not weights");
        return MOE_ERR_FORMAT;
    }
    int ok = t->n_dims == n_dims;
    for (int i = 0; ok && i < n_dims; i++) ok = t->shape[i] == dims[i];
    if (!ok) {
        char want[128] = "", got[128] = "";
        for (int i = 0; i < n_dims; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "",
                     (long long)dims[i]);
        for (int i = 0; i < t->n_dims; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                     (long long)t->shape[i]);
        MOE_LOGE("%s: tensor \"%s\" has shape [%s], expected [%s]", b->path, name, got, want);
        return MOE_ERR_SHAPE;
    }
    /* a U8 row is one byte per element; the repacking reads all of them */
    uint64_t need = raw_u8 ? (uint64_t)t->shape[n_dims - 1] : moe_qtype_row_bytes(t->type, t->shape[n_dims - 1]);
    if (need == 0) {
        MOE_LOGE("%s: tensor \"%s\": rows of %lld elements cannot be stored as %s", b->path, name,
                 (long long)t->shape[n_dims - 1], raw_u8 ? "U8" : moe_qtype_name(t->type));
        return MOE_ERR_SHAPE;
    }
    int over = 0;
    for (int i = 0; i < n_dims - 1; i++) over |= __builtin_mul_overflow(need, (uint64_t)t->shape[i], &need);
    if (over || need != t->size) {
        MOE_LOGE("%s: tensor \"%s\" stores %llu bytes; its shape and type (%s) need %s%llu", b->path, name,
                 (unsigned long long)t->size, raw_u8 ? "U8" : moe_qtype_name(t->type), over ? "more than " : "",
                 (unsigned long long)(over ? UINT64_MAX : need));
        return MOE_ERR_SHAPE;
    }
    if (b->used) b->used[t->index] = 1;
    return MOE_OK;
}

/* bind_find_shape: a weight tensor of exactly the given shape. */
enum moe_status bind_find_shape(const struct bind *b, const char *name, int n_dims, const int64_t *dims,
                                struct src_tensor *t) {
    return bind_find_tensor(b, name, n_dims, dims, 0, t);
}

/* bind_weight: a [n_out x n_in] weight view of tensor `name`. */
static enum moe_status bind_weight(const struct bind *b, struct moe_weight *w, int64_t n_out, int64_t n_in,
                                   const char *name, enum moe_tensor_role role) {
    struct src_tensor t;
    int64_t dims[2] = {n_out, n_in};
    enum moe_status st = bind_find_shape(b, name, 2, dims, &t);
    if (st) return st;
    *w = (struct moe_weight){t.data, t.type, n_out, n_in};
    return role == MOE_ROLE_EXPERT ? MOE_OK : record(b, name, role, 2, *w);
}

/* bind_named: a weight matrix named by a format string, recorded with `role`
 * (MATRIX: quantized to the dense type; ROUTER: kept at float32). */
static enum moe_status bind_named(const struct bind *b, struct moe_weight *w, int64_t n_out, int64_t n_in,
                                  enum moe_tensor_role role, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static enum moe_status bind_named(const struct bind *b, struct moe_weight *w, int64_t n_out, int64_t n_in,
                                  enum moe_tensor_role role, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return bind_weight(b, w, n_out, n_in, name, role);
}

/* bind_vector: a float32 copy of a 1-D tensor of n elements. Optional vectors
 * that are absent leave *out NULL. */
static enum moe_status bind_vector(const struct bind *b, float **out, int64_t n, int optional,
                                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum moe_status bind_vector(const struct bind *b, float **out, int64_t n, int optional,
                                   const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    *out = NULL;
    if (optional && !bind_has_tensor(b, name)) return MOE_OK;
    struct src_tensor t;
    enum moe_status st = bind_find_shape(b, name, 1, &n, &t);
    if (st) return st;
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!v) return MOE_ERR_NOMEM;
    if ((st = moe_dequantize_row(t.type, t.data, v, n))) {
        free(v);
        return st;
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) { /* a NaN norm weight or bias makes every logit NaN */
            MOE_LOGE("%s: tensor \"%s\" holds a non-finite value (%g) at element %lld", b->path, name, (double)v[i],
                     (long long)i);
            free(v);
            return MOE_ERR_RANGE;
        }
    *out = v;
    return record(b, name, MOE_ROLE_VECTOR, 1, (struct moe_weight){v, MOE_QTYPE_F32, 1, n});
}

/* bind_ffn: a SwiGLU FFN from three tensors named prefix + gate/up/down
 * suffixes. Routed experts are not recorded (tools reach them per expert). */
static enum moe_status bind_ffn(const struct bind *b, struct moe_ffn *f, int64_t n_embd, int64_t n_ff,
                                const char *prefix, const char *g, const char *u, const char *d, int expert) {
    enum moe_status st;
    enum moe_tensor_role role = expert ? MOE_ROLE_EXPERT : MOE_ROLE_MATRIX;
    char name[256];
    snprintf(name, sizeof name, "%s%s.weight", prefix, g);
    if ((st = bind_weight(b, &f->gate, n_ff, n_embd, name, role))) return st;
    snprintf(name, sizeof name, "%s%s.weight", prefix, u);
    if ((st = bind_weight(b, &f->up, n_ff, n_embd, name, role))) return st;
    snprintf(name, sizeof name, "%s%s.weight", prefix, d);
    return bind_weight(b, &f->down, n_embd, n_ff, name, role);
}

/* bind_fused_experts: transformers-v5 fused layout, experts.gate_up_proj
 * [E, 2*n_ff, n_embd] and experts.down_proj [E, n_embd, n_ff]; views per expert. */
static enum moe_status bind_fused_experts(const struct bind *b, struct moe_ffn *experts,
                                          const struct moe_config *c, const char *prefix) {
    char name[256];
    struct src_tensor gu, dn;
    enum moe_status st;
    int64_t E = c->n_expert, F = c->n_ff_expert, H = c->n_embd;
    int64_t d1[3] = {E, 2 * F, H}, d2[3] = {E, H, F};
    snprintf(name, sizeof name, "%sexperts.gate_up_proj", prefix);
    if ((st = bind_find_shape(b, name, 3, d1, &gu))) return st;
    snprintf(name, sizeof name, "%sexperts.down_proj", prefix);
    if ((st = bind_find_shape(b, name, 3, d2, &dn))) return st;
    size_t gu_row = moe_qtype_row_bytes(gu.type, H), dn_row = moe_qtype_row_bytes(dn.type, F);
    for (int64_t e = 0; e < E; e++) {
        const char *base = (const char *)gu.data + (size_t)(e * 2 * F) * gu_row;
        experts[e].gate = (struct moe_weight){base, gu.type, F, H};
        experts[e].up = (struct moe_weight){base + (size_t)F * gu_row, gu.type, F, H};
        experts[e].down = (struct moe_weight){(const char *)dn.data + (size_t)(e * H) * dn_row, dn.type, H, F};
    }
    return MOE_OK;
}

/* bind_moe: router, experts and shared expert of one MoE layer. */
static enum moe_status bind_moe(const struct bind *b, struct moe_layer *L,
                                const struct moe_config *c, int l) {
    enum moe_status st;
    const struct arch_row *row = arch_row(c->arch);
    char prefix[128];
    snprintf(prefix, sizeof prefix, "model.layers.%d.%s.", l, row->moe_block);
    char probe[256];
    snprintf(probe, sizeof probe, "%s%s.weight", prefix, row->router_name);
    if (strcmp(row->moe_block, "mlp") && !bind_has_tensor(b, probe)) /* v5-native spelling */
        snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.", l);
    const char *router = row->router_name;
    if ((st = bind_named(b, &L->router, c->n_expert, c->n_embd, MOE_ROLE_ROUTER, "%s%s.weight", prefix, router)))
        return st;
    if (c->router_bias && (st = bind_vector(b, &L->router_b, c->n_expert, 0, "%s%s.bias", prefix, router))) return st;
    struct moe_ffn *experts = b->m->impl->experts + (size_t)l * (size_t)c->n_expert;
    snprintf(probe, sizeof probe, "%sexperts.gate_up_proj", prefix);
    if (b->bind_expert) { /* bundle: one blob per expert */
        for (int e = 0; e < c->n_expert && !b->m->impl->lazy; e++)
            if ((st = b->bind_expert(b, l, e, &experts[e]))) return st;
    } else if (row->bind_experts) { /* the family's own layout */
        if ((st = row->bind_experts(b, experts, c, prefix))) return st;
    } else if (bind_has_tensor(b, probe)) {
        if ((st = bind_fused_experts(b, experts, c, prefix))) return st;
    } else {
        for (int e = 0; e < c->n_expert; e++) {
            char ep[160];
            snprintf(ep, sizeof ep, "%sexperts.%d.", prefix, e);
            if ((st = bind_ffn(b, &experts[e], c->n_embd, c->n_ff_expert, ep, row->expert_ffn[0], row->expert_ffn[1],
                               row->expert_ffn[2], 1)))
                return st;
        }
    }
    if (c->router == MOE_ROUTER_SIGMOID_GROUP &&
        (st = bind_vector(b, &L->router_bias, c->n_expert, 0, "%sgate.e_score_correction_bias", prefix)))
        return st;
    if (c->n_ff_shared > 0) {
        char sp[160];
        snprintf(sp, sizeof sp, "model.layers.%d.%s.", l, row->shared_block ? row->shared_block : "mlp.shared_expert");
        if ((st = bind_ffn(b, &L->shared, c->n_embd, c->n_ff_shared, sp, "gate_proj", "up_proj",
                           "down_proj", 0)))
            return st;
        if (c->shared_gated &&
            (st = bind_named(b, &L->shared_gate, 1, c->n_embd, MOE_ROLE_ROUTER, "%sshared_expert_gate.weight", prefix)))
            return st;
    }
    return MOE_OK;
}

static enum moe_status bind_gqa(const struct bind *b, struct moe_layer *L, const struct moe_config *c, int l);
static enum moe_status bind_mla(const struct bind *b, struct moe_layer *L, const struct moe_config *c, int l);

/* bind_layer: norms, attention and feed-forward of layer l. */
static enum moe_status bind_layer(const struct bind *b, struct moe_layer *L,
                                  const struct moe_config *c, int l) {
    enum moe_status st;
    const int64_t H = c->n_embd;
    const int ln = c->norm == MOE_NORM_LAYER;
    const char *p = "model.layers";
    if ((st = bind_vector(b, &L->attn_norm, H, 0, "%s.%d.input_layernorm.weight", p, l))) return st;
    if ((st = bind_vector(b, &L->ffn_norm, H, 0, "%s.%d.post_attention_layernorm.weight", p, l))) return st;
    if (ln) {
        if ((st = bind_vector(b, &L->attn_norm_b, H, 0, "%s.%d.input_layernorm.bias", p, l))) return st;
        if ((st = bind_vector(b, &L->ffn_norm_b, H, 0, "%s.%d.post_attention_layernorm.bias", p, l)))
            return st;
    }
    if (c->attn == MOE_ATTN_MLA) {
        if ((st = bind_mla(b, L, c, l))) return st;
    } else if ((st = bind_gqa(b, L, c, l))) {
        return st;
    }
    if (c->layer_moe[l]) return bind_moe(b, L, c, l);
    char dp[96];
    snprintf(dp, sizeof dp, "%s.%d.mlp.", p, l);
    return bind_ffn(b, &L->dense, H, c->n_ff_dense, dp, "gate_proj", "up_proj", "down_proj", 0);
}

/* bind_gqa: q/k/v/o projections, their biases and q/k norms of layer l. */
static enum moe_status bind_gqa(const struct bind *b, struct moe_layer *L, const struct moe_config *c, int l) {
    enum moe_status st;
    const int64_t H = c->n_embd, q = (int64_t)c->n_head * c->head_dim, kv = (int64_t)c->n_head_kv * c->head_dim;
    const char *p = "model.layers";
    if ((st = bind_named(b, &L->wq, q, H, MOE_ROLE_MATRIX, "%s.%d.self_attn.q_proj.weight", p, l))) return st;
    if ((st = bind_named(b, &L->wk, kv, H, MOE_ROLE_MATRIX, "%s.%d.self_attn.k_proj.weight", p, l))) return st;
    if ((st = bind_named(b, &L->wv, kv, H, MOE_ROLE_MATRIX, "%s.%d.self_attn.v_proj.weight", p, l))) return st;
    if ((st = bind_named(b, &L->wo, H, q, MOE_ROLE_MATRIX, "%s.%d.self_attn.o_proj.weight", p, l))) return st;
    if (c->attn_qkv_bias) {
        if ((st = bind_vector(b, &L->bq, q, 0, "%s.%d.self_attn.q_proj.bias", p, l))) return st;
        if ((st = bind_vector(b, &L->bk, kv, 0, "%s.%d.self_attn.k_proj.bias", p, l))) return st;
        if ((st = bind_vector(b, &L->bv, kv, 0, "%s.%d.self_attn.v_proj.bias", p, l))) return st;
    }
    if (c->attn_o_bias && (st = bind_vector(b, &L->bo, H, 0, "%s.%d.self_attn.o_proj.bias", p, l)))
        return st;
    if (c->attn_sinks && (st = bind_vector(b, &L->sinks, c->n_head, 0, "%s.%d.self_attn.sinks", p, l))) return st;
    if (c->qk_norm != MOE_QK_NORM_NONE) {
        int full = c->qk_norm == MOE_QK_NORM_FULL;
        if ((st = bind_vector(b, &L->q_norm, full ? q : c->head_dim, 0, "%s.%d.self_attn.q_norm.weight", p, l)))
            return st;
        if ((st = bind_vector(b, &L->k_norm, full ? kv : c->head_dim, 0, "%s.%d.self_attn.k_norm.weight", p, l)))
            return st;
    }
    return MOE_OK;
}

/* bind_mla: DeepSeek's latent attention of layer l: the query (straight, or
 * through its LoRA pair and norm), the KV down-projection with the shared
 * rope key, the latent norm, the per-head up-projection and o_proj. */
static enum moe_status bind_mla(const struct bind *b, struct moe_layer *L, const struct moe_config *c, int l) {
    enum moe_status st;
    const int64_t H = c->n_embd, nh = c->n_head, q = nh * c->head_dim, r = c->kv_lora_rank,
                  kva = r + c->qk_rope_dim, kvb = nh * (c->qk_nope_dim + c->v_head_dim), o = nh * c->v_head_dim;
    const char *p = "model.layers";
    const int bias = c->attn_qkv_bias;
    if (c->q_lora_rank > 0) {
        const int64_t qr = c->q_lora_rank;
        if ((st = bind_named(b, &L->wq_a, qr, H, MOE_ROLE_MATRIX, "%s.%d.self_attn.q_a_proj.weight", p, l))) return st;
        if (bias && (st = bind_vector(b, &L->bq_a, qr, 0, "%s.%d.self_attn.q_a_proj.bias", p, l))) return st;
        if ((st = bind_vector(b, &L->q_a_norm, qr, 0, "%s.%d.self_attn.q_a_layernorm.weight", p, l))) return st;
        if ((st = bind_named(b, &L->wq_b, q, qr, MOE_ROLE_MATRIX, "%s.%d.self_attn.q_b_proj.weight", p, l))) return st;
    } else if ((st = bind_named(b, &L->wq, q, H, MOE_ROLE_MATRIX, "%s.%d.self_attn.q_proj.weight", p, l))) {
        return st;
    }
    if ((st = bind_named(b, &L->wkv_a, kva, H, MOE_ROLE_MATRIX, "%s.%d.self_attn.kv_a_proj_with_mqa.weight", p, l)))
        return st;
    if (bias && (st = bind_vector(b, &L->bkv_a, kva, 0, "%s.%d.self_attn.kv_a_proj_with_mqa.bias", p, l))) return st;
    if ((st = bind_vector(b, &L->kv_a_norm, r, 0, "%s.%d.self_attn.kv_a_layernorm.weight", p, l))) return st;
    if ((st = bind_named(b, &L->wkv_b, kvb, r, MOE_ROLE_MATRIX, "%s.%d.self_attn.kv_b_proj.weight", p, l))) return st;
    if ((st = bind_named(b, &L->wo, H, o, MOE_ROLE_MATRIX, "%s.%d.self_attn.o_proj.weight", p, l))) return st;
    if (c->attn_o_bias && (st = bind_vector(b, &L->bo, H, 0, "%s.%d.self_attn.o_proj.bias", p, l))) return st;
    return MOE_OK;
}

/* bind_all: every tensor of the model. */
static enum moe_status bind_all(const struct bind *b, struct moe_model *m) {
    const struct moe_config *c = &m->cfg;
    enum moe_status st;
    if ((st = bind_named(b, &m->tok_embd, c->n_vocab, c->n_embd, MOE_ROLE_MATRIX, "model.embed_tokens.weight"))) return st;
    if ((st = bind_vector(b, &m->out_norm, c->n_embd, 0, "model.norm.weight"))) return st;
    if (c->norm == MOE_NORM_LAYER && (st = bind_vector(b, &m->out_norm_b, c->n_embd, 0, "model.norm.bias")))
        return st;
    if (c->tie_embeddings && !bind_has_tensor(b, "lm_head.weight")) {
        m->lm_head = m->tok_embd;
    } else if ((st = bind_named(b, &m->lm_head, c->n_vocab, c->n_embd, MOE_ROLE_MATRIX, "lm_head.weight"))) {
        return st;
    }
    if (c->lm_head_bias && (st = bind_vector(b, &m->lm_head_b, c->n_vocab, 0, "lm_head.bias"))) return st;
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    m->impl->experts = calloc((size_t)c->n_layer * (size_t)c->n_expert + 1, sizeof *m->impl->experts);
    if (!m->layers || !m->impl->experts) return MOE_ERR_NOMEM;
    for (int l = 0; l < c->n_layer; l++)
        if ((st = bind_layer(b, &m->layers[l], c, l))) return st;
    return MOE_OK;
}

/* st_find: tensor lookup in a safetensors checkpoint. */
static int st_find(const struct bind *b, const char *name, struct src_tensor *t) {
    const struct moe_st_tensor *x = moe_safetensors_find(b->src, name);
    if (!x) return 0;
    static const enum moe_qtype map[MOE_DTYPE_COUNT] = {MOE_QTYPE_F32, MOE_QTYPE_F16, MOE_QTYPE_BF16, MOE_QTYPE_F32,
                                                        MOE_QTYPE_F32};
    t->data = x->data;
    t->size = x->nbytes;
    t->index = (size_t)(x - moe_safetensors_at(b->src, 0));
    t->type = map[x->dtype];
    t->raw_u8 = x->dtype == MOE_DTYPE_U8;
    if (x->dtype == MOE_DTYPE_F8_E4M3) { /* its float32 copy (fp8_dequantize_all made one for every FP8 tensor) */
        t->data = b->deq ? b->deq[t->index] : NULL;
        t->size = t->data ? (uint64_t)x->n_elements * sizeof(float) : 0; /* bind_find_shape rejects a size of 0 */
    }
    t->n_dims = x->n_dims;
    for (int i = 0; i < x->n_dims; i++) t->shape[i] = x->shape[i];
    return 1;
}

/* fp8_scale_name: "<weight name>_scale_inv" into buf; 0 if it does not fit. */
static int fp8_scale_name(const char *name, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s_scale_inv", name);
    return n > 0 && (size_t)n < cap;
}

/* fp8_dequantize_one: weight x (F8_E4M3, [R x C]) times its block scales s
 * ([ceil(R/b0) x ceil(C/b1)], the last blocks of a row or column may be
 * partial) into a new float32 [R x C]: w[r][c] = e4m3(q[r][c]) * s[r/b0][c/b1],
 * one float rounding, as transformers' dequantizer computes it. */
static enum moe_status fp8_dequantize_one(const char *path, const struct moe_st_tensor *x,
                                          const struct moe_st_tensor *s, const int *blk, float **out) {
    const int64_t R = x->shape[0], C = x->shape[1], gr = (R + blk[0] - 1) / blk[0], gc = (C + blk[1] - 1) / blk[1];
    *out = NULL;
    if (s->n_dims != 2 || s->shape[0] != gr || s->shape[1] != gc) {
        char got[96] = "";
        for (int i = 0; i < s->n_dims; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)s->shape[i]);
        MOE_LOGE("%s: tensor \"%s_scale_inv\" has shape [%s]; weight \"%s\" [%lld, %lld] in %d x %d blocks needs "
                 "[%lld, %lld]", path, x->name, got, x->name, (long long)R, (long long)C, blk[0], blk[1],
                 (long long)gr, (long long)gc);
        return MOE_ERR_SHAPE;
    }
    if (s->dtype != MOE_DTYPE_F32 && s->dtype != MOE_DTYPE_BF16 && s->dtype != MOE_DTYPE_F16) {
        MOE_LOGE("%s: tensor \"%s_scale_inv\" is %s; block scales must be F32, BF16 or F16", path, x->name,
                 moe_dtype_name(s->dtype));
        return MOE_ERR_FORMAT;
    }
    const size_t n_sc = (size_t)(gr * gc > 0 ? gr * gc : 1), n_w = (size_t)(R * C > 0 ? R * C : 1);
    float *sc = malloc(sizeof(float) * n_sc), *w = malloc(sizeof(float) * n_w);
    enum moe_status st = sc && w ? MOE_OK : MOE_ERR_NOMEM;
    if (!st) moe_convert_row_f32(s->dtype, s->data, sc, (size_t)(gr * gc));
    for (int64_t i = 0; !st && i < gr * gc; i++)
        if (!(isfinite(sc[i]) && sc[i] > 0)) { /* a zero, negative or NaN scale is a damaged file */
            MOE_LOGE("%s: tensor \"%s_scale_inv\" holds %g at block [%lld, %lld]; scales must be finite and positive",
                     path, x->name, (double)sc[i], (long long)(i / gc), (long long)(i % gc));
            st = MOE_ERR_RANGE;
        }
    float lut[256];
    for (int k = 0; k < 256; k++) lut[k] = moe_f8_e4m3_to_f32((uint8_t)k);
    const uint8_t *q = x->data;
    for (int64_t r = 0; !st && r < R; r++) {
        const float *srow = sc + (size_t)(r / blk[0]) * (size_t)gc;
        for (int64_t c = 0; c < C; c++) {
            const uint8_t code = q[(size_t)(r * C + c)];
            if ((code & 0x7f) == 0x7f) { /* e4m3fn's NaN */
                MOE_LOGE("%s: tensor \"%s\" holds a NaN code (0x%02x) at [%lld, %lld]", path, x->name, code,
                         (long long)r, (long long)c);
                st = MOE_ERR_RANGE;
                break;
            }
            w[(size_t)(r * C + c)] = lut[code] * srow[c / blk[1]];
        }
    }
    free(sc);
    if (st) {
        free(w);
        return st;
    }
    *out = w;
    return MOE_OK;
}

/* fp8_dequantize_all: float32 copies (owned by the model) of every F8_E4M3
 * weight of a block-scaled FP8 checkpoint, with their `_scale_inv` tensors
 * marked used; deq[i] is tensor i's copy. FP8 tensors without the config's
 * weight_block_size, without a scale or not 2-D, and scales without an FP8
 * weight, are refused. */
static enum moe_status fp8_dequantize_all(const char *path, const struct moe_safetensors *src,
                                          const struct moe_config *c, struct moe_model_impl *mi, unsigned char *used,
                                          float **deq) {
    const size_t n = moe_safetensors_count(src);
    static const char k_suffix[] = "_scale_inv";
    for (size_t i = 0; i < n; i++) {
        const struct moe_st_tensor *x = moe_safetensors_at(src, i);
        size_t len = strlen(x->name), ks = sizeof k_suffix - 1;
        if (len > ks && !strcmp(x->name + len - ks, k_suffix)) {
            char base[256];
            const struct moe_st_tensor *w = NULL;
            if (len - ks < sizeof base) {
                memcpy(base, x->name, len - ks);
                base[len - ks] = 0;
                w = moe_safetensors_find(src, base);
            }
            if (!w || w->dtype != MOE_DTYPE_F8_E4M3) {
                MOE_LOGE("%s: tensor \"%s\" is a block scale, but its weight is %s", path, x->name,
                         w ? "not F8_E4M3" : "missing");
                return MOE_ERR_FORMAT;
            }
        }
        if (x->dtype != MOE_DTYPE_F8_E4M3) continue;
        if (!c->fp8_block[0]) {
            MOE_LOGE("%s: tensor \"%s\" is F8_E4M3, but config.json has no quantization_config with quant_method "
                     "\"fp8\" and a weight_block_size", path, x->name);
            return MOE_ERR_FORMAT;
        }
        if (x->n_dims != 2) {
            MOE_LOGE("%s: F8_E4M3 tensor \"%s\" has %d dims; only 2-D block-scaled weights are read", path, x->name,
                     x->n_dims);
            return MOE_ERR_UNSUPPORTED;
        }
        char sname[288];
        const struct moe_st_tensor *s = fp8_scale_name(x->name, sname, sizeof sname) ? moe_safetensors_find(src, sname)
                                                                                      : NULL;
        if (!s) {
            MOE_LOGE("%s: F8_E4M3 weight \"%s\" has no block scales \"%s_scale_inv\"", path, x->name, x->name);
            return MOE_ERR_NOT_FOUND;
        }
        enum moe_status st = fp8_dequantize_one(path, x, s, c->fp8_block, &deq[i]);
        if (!st) st = bind_own(mi, deq[i]);
        if (st) {
            deq[i] = NULL;
            return st;
        }
        used[(size_t)(s - moe_safetensors_at(src, 0))] = 1;
    }
    return MOE_OK;
}

/* ignorable: tensors a checkpoint may hold that the model deliberately does
 * not bind (they are recomputed from the config). */
static int ignorable(const char *name) {
    static const char *const k_suffix[] = {".rotary_emb.inv_freq"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof k_suffix / sizeof k_suffix[0]; i++) {
        size_t k = strlen(k_suffix[i]);
        if (n >= k && !strcmp(name + n - k, k_suffix[i])) return 1;
    }
    return 0;
}

/* check_all_bound: every tensor of the source was bound (or is ignorable): a
 * config with fewer layers than its checkpoint, or tensors of an architecture
 * feature the config does not declare, must not be silently ignored. */
static enum moe_status check_all_bound(const char *path, const unsigned char *used, size_t n,
                                       const char *(*name_at)(const void *src, size_t i), const void *src) {
    size_t n_bad = 0;
    const char *first = NULL;
    for (size_t i = 0; i < n; i++)
        if (!used[i] && !ignorable(name_at(src, i))) {
            if (!first) first = name_at(src, i);
            n_bad++;
        }
    if (!n_bad) return MOE_OK;
    MOE_LOGE("%s: %zu tensor%s the config does not account for, e.g. \"%s\" (does config.json list fewer layers or "
             "experts than the checkpoint holds, or omit a feature such as biases or a shared expert?)",
             path, n_bad, n_bad == 1 ? "" : "s", first);
    return MOE_ERR_SHAPE;
}

static const char *st_name_at(const void *src, size_t i) { return moe_safetensors_at(src, i)->name; }
static const char *bundle_name_at(const void *src, size_t i) { return moe_bundle_tensor_at(src, i)->name; }

/* model_new: an empty model with its private part. */
static struct moe_model *model_new(const char *path) {
    struct moe_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    if (!(m->impl = calloc(1, sizeof *m->impl))) {
        free(m);
        return NULL;
    }
    pthread_mutex_init(&m->impl->lock, NULL);
    m->path = strdup(path);
    return m;
}

enum moe_status moe_model_load_hf(const char *dir, struct moe_model **out) {
    *out = NULL;
    if (!moe_is_dir(dir)) {
        MOE_LOGE("%s: not a directory (expected a Hugging Face checkpoint directory with "
                 "config.json and *.safetensors)", dir);
        return MOE_ERR_NOT_FOUND;
    }
    struct moe_model *m = model_new(dir);
    if (!m) return MOE_ERR_NOMEM;
    enum moe_status st;
    if ((st = moe_config_load(dir, &m->cfg))) goto fail;
    if ((st = moe_safetensors_open(dir, &m->st))) goto fail;
    size_t n_src = moe_safetensors_count(m->st);
    unsigned char *used = calloc(n_src + 1, 1);
    if (!used) {
        st = MOE_ERR_NOMEM;
        goto fail;
    }
    float **deq = calloc(n_src + 1, sizeof *deq); /* FP8 weights' float32 copies, owned by the model */
    if (!deq) {
        free(used);
        st = MOE_ERR_NOMEM;
        goto fail;
    }
    struct bind b = {st_find, m->st, dir, m, NULL, used, deq};
    if (!(st = fp8_dequantize_all(dir, m->st, &m->cfg, m->impl, used, deq)) && !(st = bind_all(&b, m)))
        st = check_all_bound(dir, used, n_src, st_name_at, m->st);
    free(deq);
    free(used);
    if (st) goto fail;
    char *tj = moe_path_join(dir, "tokenizer.json");
    if (tj && access(tj, F_OK) == 0) { /* present: the loader refuses what is not a regular file */
        st = moe_tokenizer_load(dir, &m->tok);
        if (st) {
            free(tj);
            goto fail;
        }
    }
    free(tj);
    *out = m;
    return MOE_OK;
fail:
    moe_model_free(m);
    return st;
}

/* ---- GGUF files ------------------------------------------------------- */

/* gguf_find: tensor lookup by transformers name in a GGUF file's view. */
static int gguf_find(const struct bind *b, const char *name, struct src_tensor *t) {
    const struct moe_gguf_hf_tensor *x = moe_gguf_model_find(b->src, name);
    if (!x) return 0;
    t->data = x->data;
    t->size = x->nbytes;
    t->index = 0;
    t->type = x->type;
    t->raw_u8 = 0;
    t->n_dims = x->n_dims;
    for (int i = 0; i < x->n_dims; i++) t->shape[i] = x->shape[i];
    return 1;
}

/* gguf_expert: one routed expert sliced from the merged expert tensors. */
static enum moe_status gguf_expert(const struct bind *b, int layer, int expert, struct moe_ffn *out) {
    return moe_gguf_model_expert((struct moe_gguf_model *)(uintptr_t)b->src, &b->m->cfg, layer, expert, out);
}

enum moe_status moe_model_load_gguf(const char *path, struct moe_model **out) {
    *out = NULL;
    struct moe_model *m = model_new(path);
    if (!m) return MOE_ERR_NOMEM;
    enum moe_status st;
    char label[512];
    if ((st = moe_gguf_open(path, &m->gguf))) goto fail;
    if ((st = moe_gguf_model_open(m->gguf, &m->gguf_view))) goto fail;
    const char *cj = moe_gguf_model_config_json(m->gguf_view);
    snprintf(label, sizeof label, "%s: the config made from its metadata", path);
    if ((st = moe_config_parse(cj, strlen(cj), label, &m->cfg))) goto fail;
    /* no check that every tensor is bound: llama.cpp writes tensors the
     * model does not read (rope_freqs, token_types), and merged expert
     * tensors are bound through gguf_expert, not by name */
    struct bind b = {gguf_find, m->gguf_view, path, m, gguf_expert, NULL, NULL};
    if ((st = bind_all(&b, m))) goto fail;
    const char *tj = moe_gguf_model_tokenizer_json(m->gguf_view), *tc = moe_gguf_model_tokenizer_config_json(m->gguf_view);
    if (tj) {
        snprintf(label, sizeof label, "%s: the tokenizer made from its metadata", path);
        if ((st = moe_tokenizer_load_texts(tj, strlen(tj), tc, tc ? strlen(tc) : 0, label, &m->tok))) goto fail;
    }
    *out = m;
    return MOE_OK;
fail:
    moe_model_free(m);
    return st;
}

/* is_gguf_path: a GGUF file by its magic, or by its name (so that a damaged
 * *.gguf gets the GGUF reader's message rather than the bundle reader's). */
static int is_gguf_path(const char *path) {
    size_t n = strlen(path);
    return moe_gguf_is_gguf_file(path) || (n > 5 && !strcmp(path + n - 5, ".gguf"));
}

enum moe_status moe_model_load_source(const char *path, struct moe_model **out) {
    *out = NULL;
    if (moe_is_dir(path)) return moe_model_load_hf(path, out);
    if (is_gguf_path(path)) return moe_model_load_gguf(path, out);
    MOE_LOGE("%s: not a Hugging Face checkpoint directory (config.json, *.safetensors) or a GGUF file", path);
    return MOE_ERR_NOT_FOUND;
}

struct moe_model_params moe_model_default_params(void) {
    struct moe_model_params p = {0};
    return p;
}

/* ---- bundles ------------------------------------------------------------ */

/* bundle_find: tensor lookup in a bundle (the same names as the checkpoint). */
static int bundle_find(const struct bind *b, const char *name, struct src_tensor *t) {
    const struct moe_bundle_tensor *x = moe_bundle_find_tensor(b->src, name);
    if (!x) return 0;
    t->index = (size_t)(x - moe_bundle_tensor_at(b->src, 0));
    const void *const *copy = b->m->impl->dense_copy;
    t->data = copy ? copy[t->index] : x->data; /* copy_dense: the model's copy, not the mapping */
    t->size = x->size;
    t->type = (enum moe_qtype)x->type_id;
    t->raw_u8 = 0;
    t->n_dims = (int)x->n_dims;
    for (uint32_t i = 0; i < x->n_dims; i++) t->shape[i] = (int64_t)x->shape[i];
    if (!moe_qtype_valid(t->type)) t->n_dims = -1; /* bind_find_shape reports it */
    return 1;
}

/* bind_own: keep a buffer alive as long as the model. */
enum moe_status bind_own(struct moe_model_impl *mi, void *p) {
    void **o = realloc(mi->owned, sizeof *o * (size_t)(mi->n_owned + 1));
    if (!o) {
        free(p);
        return MOE_ERR_NOMEM;
    }
    mi->owned = o;
    mi->owned[mi->n_owned++] = p;
    return MOE_OK;
}

/* precision_fits: a stored precision's blobs hold exactly gate and up
 * [n_ff_expert x n_embd] and down [n_embd x n_ff_expert] of known types (and,
 * for gpt-oss, one f32 row of the gate | up | down biases), each part's bytes
 * what its shape and type need: every expert view bound from it (by the model,
 * lazily, or in the expert store's slots) then lies inside the blob. */
static enum moe_status precision_fits(const char *path, const struct moe_config *c,
                                      const struct moe_bundle_precision *d) {
    const int64_t H = c->n_embd, F = c->n_ff_expert;
    const uint32_t np = c->expert_bias ? 4 : 3; /* gpt-oss: + one f32 row of gate | up | down biases */
    int ok = d->n_parts == np && d->parts[0].rows == (uint64_t)F && d->parts[0].cols == (uint64_t)H &&
             d->parts[1].rows == (uint64_t)F && d->parts[1].cols == (uint64_t)H && d->parts[2].rows == (uint64_t)H &&
             d->parts[2].cols == (uint64_t)F;
    if (ok && np == 4)
        ok = d->parts[3].type_id == MOE_QTYPE_F32 && d->parts[3].rows == 1 && d->parts[3].cols == (uint64_t)(2 * F + H);
    for (int k = 0; ok && k < (int)np; k++)
        ok = moe_qtype_valid((enum moe_qtype)d->parts[k].type_id) &&
             d->parts[k].nbytes == moe_qtype_row_bytes((enum moe_qtype)d->parts[k].type_id, (int64_t)d->parts[k].cols) *
                                       d->parts[k].rows;
    if (!ok) {
        MOE_LOGE("%s: precision %s: expert blobs do not hold gate/up [%lld x %lld] and down [%lld x %lld] of known types%s",
                 path, d->name, (long long)F, (long long)H, (long long)H, (long long)F,
                 np == 4 ? " and an f32 row of their biases" : "");
        return MOE_ERR_SHAPE;
    }
    return MOE_OK;
}

static enum moe_status expert_base(const struct moe_model *m, int layer, int expert, int prec,
                                   const struct moe_bundle_precision **desc, const char **out) {
    struct moe_model_impl *mi = m->impl;
    const struct moe_config *c = &m->cfg;
    const char *path = m->path;
    struct moe_bundle_blob blob;
    enum moe_status st = moe_bundle_expert(m->bundle, (uint32_t)layer, (uint32_t)expert, (uint32_t)prec, &blob);
    if (st) return st;
    const struct moe_bundle_precision *d = blob.desc;
    *desc = d;
    const size_t slot = ((size_t)layer * (size_t)c->n_expert + (size_t)expert) * (size_t)m->n_expert_prec + (size_t)prec;
    if (mi->expert_base[slot]) {
        *out = mi->expert_base[slot];
        return MOE_OK;
    }
    if ((st = precision_fits(path, c, d))) return st;
    const char *base;
    if (blob.compression == MOE_BUNDLE_COMP_NONE) {
        if ((st = moe_bundle_expert_verify(m->bundle, (uint32_t)layer, (uint32_t)expert, (uint32_t)prec))) return st;
        base = blob.stored;
    } else {
        void *buf = malloc(blob.raw_size ? blob.raw_size : 1);
        if (!buf) return MOE_ERR_NOMEM;
        if ((st = moe_bundle_expert_load(m->bundle, (uint32_t)layer, (uint32_t)expert, (uint32_t)prec, buf,
                                         blob.raw_size))) {
            free(buf);
            return st;
        }
        if ((st = bind_own(mi, buf))) return st;
        base = buf;
    }
    mi->expert_base[slot] = base;
    *out = base;
    return MOE_OK;
}

/* bind_blob: point an expert's three matrices (and biases) into its raw blob. */
static void bind_blob(const struct moe_bundle_precision *d, const char *base, struct moe_ffn *out) {
    struct moe_weight *w[3] = {&out->gate, &out->up, &out->down};
    for (int k = 0; k < 3; k++)
        *w[k] = (struct moe_weight){base + d->parts[k].offset, (enum moe_qtype)d->parts[k].type_id,
                                    (int64_t)d->parts[k].rows, (int64_t)d->parts[k].cols};
    out->bias = d->n_parts > 3 ? (const float *)(const void *)(base + d->parts[3].offset) : NULL;
}

/* bundle_expert: bind one expert at the precision m->expert_prec gives it. */
static enum moe_status bundle_expert(const struct bind *b, int layer, int expert, struct moe_ffn *out) {
    struct moe_model *m = b->m;
    int prec = m->impl->expert_prec[(size_t)layer * (size_t)m->cfg.n_expert + (size_t)expert];
    const struct moe_bundle_precision *d;
    const char *base;
    enum moe_status st = expert_base(m, layer, expert, prec, &d, &base);
    if (st) return st;
    bind_blob(d, base, out);
    return MOE_OK;
}

/* uniform_precision: the precision every routed expert is bound at, or -1. */
static int uniform_precision(const struct moe_model *m) {
    const struct moe_config *c = &m->cfg;
    int u = -2;
    for (int l = 0; l < c->n_layer; l++)
        for (int e = 0; c->layer_moe[l] && e < c->n_expert; e++) {
            int p = m->impl->expert_prec[(size_t)l * (size_t)c->n_expert + (size_t)e];
            if (u == -2) u = p;
            else if (u != p) return -1;
        }
    return u < 0 ? 0 : u;
}

enum moe_status moe_model_set_expert_precision(struct moe_model *m, int layer, int expert, int precision) {
    const struct moe_config *c = &m->cfg;
    if (!m->bundle) {
        MOE_LOGE("%s: a checkpoint directory stores one precision; only bundles switch expert precisions", m->path);
        return MOE_ERR_UNSUPPORTED;
    }
    if (layer < 0 || layer >= c->n_layer || !c->layer_moe[layer] || expert < 0 || expert >= c->n_expert ||
        precision < 0 || precision >= m->n_expert_prec) {
        MOE_LOGE("%s: no routed expert %d of layer %d at stored precision %d (%d layers, %d experts, %d precisions)",
                 m->path, expert, layer, precision, c->n_layer, c->n_expert, m->n_expert_prec);
        return MOE_ERR_INVALID;
    }
    const size_t i = (size_t)layer * (size_t)c->n_expert + (size_t)expert;
    struct moe_model_impl *mi = m->impl;
    if (mi->expert_prec[i] == precision && (mi->experts[i].gate.data || mi->lazy)) return MOE_OK;
    const struct moe_bundle_precision *d;
    const char *base;
    pthread_mutex_lock(&mi->lock);
    enum moe_status st = expert_base(m, layer, expert, precision, &d, &base);
    pthread_mutex_unlock(&mi->lock);
    if (st) return st;
    bind_blob(d, base, &mi->experts[i]);
    mi->expert_prec[i] = (int16_t)precision;
    m->expert_precision = uniform_precision(m);
    return MOE_OK;
}

enum moe_status moe_model_expert(const struct moe_model *m, int layer, int expert, int precision,
                                 struct moe_ffn *out) {
    const struct moe_config *c = &m->cfg;
    struct moe_model_impl *mi = m->impl;
    memset(out, 0, sizeof *out);
    if (layer < 0 || layer >= c->n_layer || !c->layer_moe[layer] || expert < 0 || expert >= c->n_expert ||
        precision < -1 || precision >= (m->bundle ? m->n_expert_prec : 0)) {
        MOE_LOGE("%s: no routed expert %d of layer %d at precision %d (%d layers, %d experts, %d stored precisions)",
                 m->path, expert, layer, precision, c->n_layer, c->n_expert, m->bundle ? m->n_expert_prec : 1);
        return MOE_ERR_INVALID;
    }
    const size_t i = (size_t)layer * (size_t)c->n_expert + (size_t)expert;
    if (!m->bundle || (precision < 0 && mi->experts[i].gate.data)) {
        *out = mi->experts[i];
        return MOE_OK;
    }
    const int prec = precision < 0 ? mi->expert_prec[i] : precision;
    const struct moe_bundle_precision *d;
    const char *base;
    pthread_mutex_lock(&mi->lock);
    enum moe_status st = expert_base(m, layer, expert, prec, &d, &base);
    pthread_mutex_unlock(&mi->lock);
    if (st) return st;
    bind_blob(d, base, out);
    return MOE_OK;
}

int moe_model_get_expert_precision(const struct moe_model *m, int layer, int expert) {
    const struct moe_config *c = &m->cfg;
    if (!m->impl->expert_prec || layer < 0 || layer >= c->n_layer || expert < 0 || expert >= c->n_expert) return -1;
    return m->impl->expert_prec[(size_t)layer * (size_t)c->n_expert + (size_t)expert];
}

void moe_model_precision_summary(const struct moe_model *m, char *buf, size_t size) {
    const struct moe_config *c = &m->cfg;
    if (!size) return;
    buf[0] = 0;
    if (!m->bundle || !m->impl->expert_prec) {
        snprintf(buf, size, "as stored in the %s", m->gguf ? "GGUF file" : "checkpoint");
        return;
    }
    if (m->expert_precision >= 0) {
        snprintf(buf, size, "%s", moe_bundle_precision_at(m->bundle, (uint32_t)m->expert_precision)->name);
        return;
    }
    size_t used = (size_t)snprintf(buf, size, "per-expert map:");
    for (int p = 0; p < m->n_expert_prec && used < size; p++) {
        int n = 0;
        for (int l = 0; l < c->n_layer; l++)
            for (int e = 0; c->layer_moe[l] && e < c->n_expert; e++) n += m->impl->expert_prec[(size_t)l * c->n_expert + e] == p;
        if (n)
            used += (size_t)snprintf(buf + used, size - used, " %d x %s", n,
                                     moe_bundle_precision_at(m->bundle, (uint32_t)p)->name);
    }
}

/* bitwidth_map: the per-expert precisions of the tuning key
 * MOE_TUNING_BITWIDTH_MAP into m->expert_prec; 0 (with a warning saying what
 * to do) when the key is absent or does not fit this bundle, 1 when used. */
static int bitwidth_map(struct moe_model *m) {
    const struct moe_config *c = &m->cfg;
    size_t n = 0;
    const int64_t *map = moe_bundle_kv_i64_array(moe_bundle_tuning(m->bundle), MOE_TUNING_BITWIDTH_MAP, &n);
    if (!map) return 0;
    const size_t le = (size_t)c->n_layer * (size_t)c->n_expert;
    int ok = n == le;
    for (size_t i = 0; ok && i < le; i++) {
        int moe = c->layer_moe[i / (size_t)c->n_expert] != 0;
        ok = moe ? map[i] >= 0 && map[i] < m->n_expert_prec : map[i] == -1;
    }
    if (!ok) {
        MOE_LOGW("%s: tuning key %s does not fit this bundle (%zu entries for %d layers x %d experts, or a precision "
                 "out of range); using one precision for every expert. Run moe-prep bitwidth again to fix it.",
                 m->path, MOE_TUNING_BITWIDTH_MAP, n, c->n_layer, c->n_expert);
        return 0;
    }
    for (size_t i = 0; i < le; i++) m->impl->expert_prec[i] = (int16_t)(map[i] < 0 ? 0 : map[i]);
    return 1;
}

/* read_dense_copy: read every non-expert tensor of the bundle into one buffer the
 * model owns (each at a 4096-byte boundary, as in the file), through the file
 * rather than the mapping, each checked against its checksum; bundle_find
 * then binds the copies (moe_model_params.copy_dense). */
static enum moe_status read_dense_copy(struct moe_model *m) {
    struct moe_model_impl *mi = m->impl;
    const size_t n = moe_bundle_tensor_count(m->bundle), align = 4096;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t sz = moe_bundle_tensor_at(m->bundle, i)->size;
        if (sz > SIZE_MAX - total - align) return MOE_ERR_NOMEM;
        total += ((size_t)sz + align - 1) & ~(align - 1);
    }
    void *buf = NULL;
    if (!(mi->dense_copy = calloc(n + 1, sizeof *mi->dense_copy)) || posix_memalign(&buf, align, total ? total : align)) {
        MOE_LOGE("%s: cannot allocate %.1f MB for the non-expert weights", m->path, (double)total / 1e6);
        return MOE_ERR_NOMEM;
    }
    enum moe_status st = bind_own(mi, buf);
    if (st) return st;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const struct moe_bundle_tensor *t = moe_bundle_tensor_at(m->bundle, i);
        if ((st = moe_bundle_tensor_load(m->bundle, t, (char *)buf + at, (size_t)t->size))) return st;
        mi->dense_copy[i] = (char *)buf + at;
        at += ((size_t)t->size + align - 1) & ~(align - 1);
    }
    return MOE_OK;
}

/* meta_text: a required text item of the bundle's metadata. */
static const char *meta_text(const struct moe_bundle *bd, const char *path, const char *key) {
    const char *v = moe_bundle_meta_str(bd, key);
    if (!v) MOE_LOGE("%s: bundle metadata lacks \"%s\"", path, key);
    return v;
}

/* moe_model_load_bundle: a model from a .moeb bundle (see docs/format.md). */
static enum moe_status load_from_bundle(struct moe_model *m, const char *path, const struct moe_model_params *params,
                                        struct moe_model **out);

/* bundle_model: an empty model named `label` that will bind a bundle; NULL
 * when out of memory. */
static struct moe_model *bundle_model(const char *label, const struct moe_model_params *params) {
    struct moe_model *m = model_new(label);
    if (m && !m->path) {
        moe_model_free(m);
        return NULL;
    }
    if (m) m->impl->lazy = params && params->lazy_experts;
    return m;
}

static enum moe_status moe_model_load_bundle(const char *path, const struct moe_model_params *params,
                                             struct moe_model **out) {
    struct moe_model *m = bundle_model(path, params);
    if (!m) return MOE_ERR_NOMEM;
    enum moe_status st = moe_bundle_open(path, &m->bundle);
    if (st) {
        moe_model_free(m);
        return st;
    }
    return load_from_bundle(m, path, params, out);
}

enum moe_status moe_model_load_bundle_memory(const void *buf, size_t len, const char *label,
                                             const struct moe_model_params *params, struct moe_model **out) {
    *out = NULL;
    if (!label) label = "<memory>";
    struct moe_model *m = bundle_model(label, params);
    if (!m) return MOE_ERR_NOMEM;
    enum moe_status st = moe_bundle_open_memory(buf, len, label, &m->bundle);
    if (st) {
        moe_model_free(m);
        return st;
    }
    return load_from_bundle(m, label, params, out);
}

/* load_from_bundle: bind model m from its open bundle (m->bundle, m->path set);
 * frees m on error. */
static enum moe_status load_from_bundle(struct moe_model *m, const char *path, const struct moe_model_params *params,
                                        struct moe_model **out) {
    enum moe_status st;
    const char *cfg_text = meta_text(m->bundle, path, "hf.config.json");
    if (!cfg_text) {
        st = MOE_ERR_FORMAT;
        goto fail;
    }
    char label[512];
    snprintf(label, sizeof label, "%s: hf.config.json", path);
    if ((st = moe_config_parse(cfg_text, strlen(cfg_text), label, &m->cfg))) goto fail;
    uint32_t nl = 0, ne = 0, np = 0;
    moe_bundle_expert_layout(m->bundle, &nl, &ne, &np);
    if (nl != (uint32_t)m->cfg.n_layer || ne != (uint32_t)m->cfg.n_expert || np == 0) {
        MOE_LOGE("%s: expert table is %u layers x %u experts x %u precisions; the config says %d x %d", path, nl,
                 ne, np, m->cfg.n_layer, m->cfg.n_expert);
        st = MOE_ERR_FORMAT;
        goto fail;
    }
    for (int l = 0; l < m->cfg.n_layer; l++) {
        if (moe_bundle_layer_has_experts(m->bundle, (uint32_t)l) != (m->cfg.layer_moe[l] != 0)) {
            MOE_LOGE("%s: layer %d: expert table and config disagree on whether it has experts", path, l);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
    }
    uint32_t pi = 0;
    if (params && params->expert_precision &&
        moe_bundle_find_precision(m->bundle, params->expert_precision, &pi) != MOE_OK) {
        char avail[512] = "";
        for (uint32_t i = 0; i < np; i++)
            snprintf(avail + strlen(avail), sizeof avail - strlen(avail), "%s%s", i ? ", " : "",
                     moe_bundle_precision_at(m->bundle, i)->name);
        MOE_LOGE("%s: no expert precision \"%s\" stored (available: %s)", path, params->expert_precision, avail);
        st = MOE_ERR_NOT_FOUND;
        goto fail;
    }
    m->n_expert_prec = (int)np;
    int any_moe = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) any_moe |= m->cfg.layer_moe[l] != 0;
    for (uint32_t p = 0; any_moe && p < np; p++) /* once for all experts, whether bound now, lazily or by a store */
        if ((st = precision_fits(path, &m->cfg, moe_bundle_precision_at(m->bundle, p)))) goto fail;
    const size_t le = (size_t)m->cfg.n_layer * (size_t)m->cfg.n_expert;
    struct moe_model_impl *mi = m->impl;
    if (!(mi->expert_prec = malloc(le * sizeof *mi->expert_prec + 1)) ||
        !(mi->expert_base = calloc(le * np + 1, sizeof *mi->expert_base))) {
        st = MOE_ERR_NOMEM;
        goto fail;
    }
    for (size_t i = 0; i < le; i++) mi->expert_prec[i] = (int16_t)pi;
    m->expert_precision = (int)pi;
    if (!(params && params->expert_precision) && bitwidth_map(m)) m->expert_precision = uniform_precision(m);
    size_t n_src = moe_bundle_tensor_count(m->bundle);
    unsigned char *used = calloc(n_src + 1, 1);
    if (!used) {
        st = MOE_ERR_NOMEM;
        goto fail;
    }
    const int copy = params && (params->copy_dense > 0 || (params->copy_dense == 0 && params->lazy_experts));
    if (copy && (st = read_dense_copy(m))) { /* checked as they are read */
        free(used);
        goto fail;
    }
    struct bind b = {bundle_find, m->bundle, path, m, bundle_expert, used, NULL};
    if (!(st = bind_all(&b, m))) st = check_all_bound(path, used, n_src, bundle_name_at, m->bundle);
    free(used);
    if (st) goto fail;
    for (int i = 0; !copy && i < m->n_refs; i++) { /* non-expert tensors are small next to experts: check them all */
        const struct moe_bundle_tensor *t = moe_bundle_find_tensor(m->bundle, m->refs[i].name);
        if (t && (st = moe_bundle_tensor_verify(m->bundle, t))) goto fail;
    }
    const char *tj = moe_bundle_meta_str(m->bundle, "hf.tokenizer.json");
    if (tj) {
        const char *tc = moe_bundle_meta_str(m->bundle, "hf.tokenizer_config.json");
        snprintf(label, sizeof label, "%s: hf.tokenizer.json", path);
        if ((st = moe_tokenizer_load_texts(tj, strlen(tj), tc, tc ? strlen(tc) : 0, label, &m->tok))) goto fail;
    }
    const char *gc = moe_bundle_meta_str(m->bundle, "hf.generation_config.json");
    if (gc) moe_config_add_generation(&m->cfg, gc, strlen(gc));
    *out = m;
    return MOE_OK;
fail:
    moe_model_free(m);
    return st;
}

enum moe_status moe_model_load(const char *path, const struct moe_model_params *params,
                               struct moe_model **out) {
    *out = NULL;
    if (moe_is_dir(path)) {
        if (params && params->expert_precision)
            MOE_LOGW("%s: a checkpoint directory has one precision; --expert-precision is ignored", path);
        return moe_model_load_hf(path, out);
    }
    if (is_gguf_path(path)) {
        if (params && params->expert_precision)
            MOE_LOGW("%s: a GGUF file has one precision per tensor; --expert-precision is ignored", path);
        return moe_model_load_gguf(path, out);
    }
    return moe_model_load_bundle(path, params, out);
}

enum moe_status moe_model_check_output(const struct moe_model *m, const char *output) {
    if (!output) return MOE_OK;
    if (m->gguf) { /* a GGUF file: its path is the input */
        const char *in = m->path;
        return moe_file_check_output(output, &in, 1);
    }
    if (m->bundle) {
        const char *in = m->path;
        return moe_file_check_output(output, &in, 1);
    }
    static const char *const k_side[] = {"config.json", "generation_config.json", "tokenizer.json",
                                         "tokenizer_config.json", "model.safetensors.index.json"};
    enum moe_status st = MOE_OK;
    for (size_t i = 0; !st && i < sizeof k_side / sizeof k_side[0]; i++) {
        char *p = moe_path_join(m->path, k_side[i]);
        const char *in = p;
        st = p ? moe_file_check_output(output, &in, 1) : MOE_ERR_NOMEM;
        free(p);
    }
    for (int i = 0; !st && i < moe_safetensors_n_files(m->st); i++) {
        const char *in = moe_safetensors_file_path(m->st, i);
        st = moe_file_check_output(output, &in, 1);
    }
    return st;
}

static int64_t weight_params(const struct moe_weight *w) { return w->data ? w->n_out * w->n_in : 0; }

static int64_t ffn_params(const struct moe_ffn *f) {
    return weight_params(&f->gate) + weight_params(&f->up) + weight_params(&f->down);
}

int64_t moe_model_n_params(const struct moe_model *m) {
    const struct moe_config *c = &m->cfg;
    int64_t n = weight_params(&m->tok_embd);
    if (m->lm_head.data != m->tok_embd.data) n += weight_params(&m->lm_head);
    for (int l = 0; l < c->n_layer; l++) {
        const struct moe_layer *L = &m->layers[l];
        n += weight_params(&L->wq) + weight_params(&L->wk) + weight_params(&L->wv) + weight_params(&L->wo);
        n += weight_params(&L->wq_a) + weight_params(&L->wq_b) + weight_params(&L->wkv_a) + weight_params(&L->wkv_b);
        n += weight_params(&L->router) + ffn_params(&L->shared) + weight_params(&L->shared_gate);
        n += ffn_params(&L->dense);
        for (int e = 0; c->layer_moe[l] && e < c->n_expert; e++) {
            struct moe_ffn f;
            if (moe_model_expert(m, l, e, -1, &f) == MOE_OK) n += ffn_params(&f);
        }
    }
    return n;
}

enum moe_status moe_model_check_file(const struct moe_model *m) {
    return m && m->bundle ? moe_bundle_check_file(m->bundle) : MOE_OK;
}

void moe_model_free(struct moe_model *m) {
    if (!m) return;
    for (int l = 0; m->layers && l < m->cfg.n_layer; l++) {
        struct moe_layer *L = &m->layers[l];
        free(L->attn_norm);
        free(L->attn_norm_b);
        free(L->ffn_norm);
        free(L->ffn_norm_b);
        free(L->bq);
        free(L->bk);
        free(L->bv);
        free(L->bo);
        free(L->q_norm);
        free(L->k_norm);
        free(L->q_a_norm);
        free(L->bq_a);
        free(L->kv_a_norm);
        free(L->bkv_a);
        free(L->router_bias);
        free(L->router_b);
        free(L->sinks);
    }
    free(m->layers);
    free(m->out_norm);
    free(m->out_norm_b);
    free(m->lm_head_b);
    free(m->refs);
    if (m->impl) {
        struct moe_model_impl *mi = m->impl;
        for (int i = 0; i < mi->n_owned; i++) free(mi->owned[i]);
        free(mi->owned);
        free(mi->expert_prec);
        free(mi->expert_base);
        free(mi->dense_copy);
        free(mi->experts);
        pthread_mutex_destroy(&mi->lock);
        free(mi);
    }
    moe_config_clear(&m->cfg);
    moe_safetensors_free(m->st);
    moe_bundle_free(m->bundle);
    moe_gguf_model_free(m->gguf_view);
    moe_gguf_free(m->gguf);
    moe_tokenizer_free(m->tok);
    free(m->path);
    free(m);
}

/* repack_list: the matrices moe_model_repack may rewrite (see moe-model.h):
 * fills w[] (when not NULL) and returns how many there are. */
static int64_t repack_list(struct moe_model *m, int experts, struct moe_weight **w) {
    int64_t n = 0;
#define ADD(x) (w ? (void)(w[n] = &(x)) : (void)0, n++)
    ADD(m->lm_head);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        struct moe_layer *L = &m->layers[l];
        ADD(L->wq), ADD(L->wk), ADD(L->wv), ADD(L->wo), ADD(L->wq_a), ADD(L->wq_b), ADD(L->wkv_a);
        ADD(L->shared.gate), ADD(L->shared.up), ADD(L->shared.down);
        ADD(L->dense.gate), ADD(L->dense.up), ADD(L->dense.down);
    }
    if (experts && m->impl && m->impl->experts)
        for (int64_t i = 0; i < (int64_t)m->cfg.n_layer * m->cfg.n_expert; i++) {
            struct moe_ffn *f = &m->impl->experts[i];
            ADD(f->gate), ADD(f->up), ADD(f->down);
        }
#undef ADD
    return n;
}

/* A share of moe_model_repack's copies for one thread: weights i = t, t + n, ... */
struct repack_job {
    struct moe_weight **w;
    uint8_t **dst;        /* [n_w] where each goes, NULL = stays */
    enum moe_qtype *to;   /* [n_w] its layout */
    int64_t n_w;
    int t, n;
    enum moe_status st;
};

static void *repack_thread(void *arg) {
    struct repack_job *j = arg;
    for (int64_t i = j->t; i < j->n_w && !j->st; i += j->n)
        if (j->dst[i]) j->st = moe_repack(j->w[i]->type, j->to[i], j->w[i]->n_out, j->w[i]->n_in, j->w[i]->data, j->dst[i]);
    return NULL;
}

enum moe_status moe_model_repack(struct moe_model *m, int experts, size_t *bytes) {
    if (bytes) *bytes = 0;
    if (!m) {
        MOE_LOGE("NULL model");
        return MOE_ERR_INVALID;
    }
    if (moe_model_check_file(m)) return MOE_ERR_IO; /* it reads every mapped weight: not from a changed file */
    const int64_t n = repack_list(m, experts, NULL);
    struct moe_weight **w = malloc(sizeof *w * (size_t)(n + 1));
    uint8_t **dst = calloc((size_t)n + 1, sizeof *dst);
    enum moe_qtype *to = malloc(sizeof *to * (size_t)(n + 1));
    if (!w || !dst || !to) {
        free(w), free(dst), free(to);
        return MOE_ERR_NOMEM;
    }
    repack_list(m, experts, w);
    size_t total = 0; /* each copy 64-byte aligned in one buffer; dst holds offsets + 1 first */
    for (int64_t i = 0; i < n; i++) {
        to[i] = w[i]->data ? moe_repack_type(w[i]->type, w[i]->n_out, w[i]->n_in) : w[i]->type;
        if (to[i] != w[i]->type) {
            dst[i] = (uint8_t *)(uintptr_t)(total + 1);
            total += ((size_t)w[i]->n_out * moe_qtype_row_bytes(w[i]->type, w[i]->n_in) + 63) & ~(size_t)63;
        }
    }
    void *buf = NULL;
    enum moe_status st = MOE_OK;
    const size_t huge = (size_t)2 << 20;
    if (total > 0 && posix_memalign(&buf, huge, total)) {
        MOE_LOGE("%s: cannot allocate %.1f MB for the repacked weights", m->path, (double)total / 1e6);
        st = MOE_ERR_NOMEM;
    } else if (total > 0) {
#ifdef MADV_HUGEPAGE
        /* transparent huge pages where the system allows them on request: a
         * 512th of the page faults at load and of the TLB misses while the
         * kernels stream the weights (advice only: failure changes nothing) */
        if (total >= huge) (void)madvise(buf, total & ~(huge - 1), MADV_HUGEPAGE);
#endif
        st = bind_own(m->impl, buf);
    }
    if (total == 0 || st) {
        free(w), free(dst), free(to);
        return st;
    }
    for (int64_t i = 0; i < n; i++)
        if (dst[i]) dst[i] = (uint8_t *)buf + ((uintptr_t)dst[i] - 1);
    /* the copies are memory-bound work on pages the map may still have to
     * fault in: one thread per online CPU (up to 8), interleaved by matrix */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const int nt = ncpu < 1 ? 1 : ncpu > 8 ? 8 : (int)ncpu;
    struct repack_job jobs[8];
    pthread_t th[8];
    int started = 0;
    for (int t = 0; t < nt; t++) {
        jobs[t] = (struct repack_job){w, dst, to, n, t, nt, MOE_OK};
        if (t > 0 && pthread_create(&th[t], NULL, repack_thread, &jobs[t]) != 0) break; /* fewer threads then */
        started = t + 1;
    }
    repack_thread(&jobs[0]);
    for (int t = 1; t < started; t++) pthread_join(th[t], NULL);
    for (int t = started; t < nt; t++) repack_thread(&jobs[t]); /* shares of threads that did not start */
    for (int t = 0; t < nt; t++)
        if (jobs[t].st) st = jobs[t].st;
    if (!st) /* only now: the views change type and place together */
        for (int64_t i = 0; i < n; i++)
            if (dst[i]) {
                w[i]->type = to[i];
                w[i]->data = dst[i];
            }
    free(w), free(dst), free(to);
    if (bytes && !st) *bytes = total;
    return st;
}

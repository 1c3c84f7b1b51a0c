/*
 * model.c - bind a checkpoint's tensors (on-disk Hugging Face names) to the
 * model description, checking presence, dtype and shape of each.
 *
 * Matrices stay in the mapped files (zero-copy views in their stored dtype);
 * only small vectors (norm weights, biases) are converted to float32 copies.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-mmap.h"
#include "moe-model.h"
#include "moe-safetensors.h"
#include "moe-tokenizer.h"

/* Binding context: the checkpoint, and the path for messages. */
struct bind {
    const struct moe_safetensors *st;
    const char *path;
};

/* find_shape: look up `name`; if dims are given (-1 terminated count n), check them. */
static enum moe_status find_shape(const struct bind *b, const char *name, int n_dims,
                                  const int64_t *dims, const struct moe_st_tensor **out) {
    const struct moe_st_tensor *t = moe_safetensors_find(b->st, name);
    *out = NULL;
    if (!t) {
        MOE_LOGE("%s: missing tensor \"%s\"", b->path, name);
        return MOE_ERR_NOT_FOUND;
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
    *out = t;
    return MOE_OK;
}

/* bind_matrix: a [n_out x n_in] weight view. */
static enum moe_status bind_matrix(const struct bind *b, struct moe_weight *w, int64_t n_out,
                                   int64_t n_in, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const struct moe_st_tensor *t;
    int64_t dims[2] = {n_out, n_in};
    enum moe_status st = find_shape(b, name, 2, dims, &t);
    if (st) return st;
    w->data = t->data;
    w->type = t->dtype;
    w->n_out = n_out;
    w->n_in = n_in;
    return MOE_OK;
}

/* bind_vector: a float32 copy of a 1-D tensor of n elements. Optional vectors
 * that are absent leave *out NULL. */
static enum moe_status bind_vector(const struct bind *b, float **out, int64_t n, int optional,
                                   const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    *out = NULL;
    if (optional && !moe_safetensors_find(b->st, name)) return MOE_OK;
    const struct moe_st_tensor *t;
    enum moe_status st = find_shape(b, name, 1, &n, &t);
    if (st) return st;
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!v) return MOE_ERR_NOMEM;
    moe_convert_row_f32(t->dtype, t->data, v, (size_t)n);
    *out = v;
    return MOE_OK;
}

/* bind_ffn: a SwiGLU FFN from three tensors named prefix + gate/up/down suffixes. */
static enum moe_status bind_ffn(const struct bind *b, struct moe_ffn *f, int64_t n_embd,
                                int64_t n_ff, const char *prefix, const char *g, const char *u,
                                const char *d) {
    enum moe_status st;
    if ((st = bind_matrix(b, &f->gate, n_ff, n_embd, "%s%s.weight", prefix, g))) return st;
    if ((st = bind_matrix(b, &f->up, n_ff, n_embd, "%s%s.weight", prefix, u))) return st;
    return bind_matrix(b, &f->down, n_embd, n_ff, "%s%s.weight", prefix, d);
}

/* bind_fused_experts: transformers-v5 fused layout, experts.gate_up_proj
 * [E, 2*n_ff, n_embd] and experts.down_proj [E, n_embd, n_ff]; views per expert. */
static enum moe_status bind_fused_experts(const struct bind *b, struct moe_layer *L,
                                          const struct moe_config *c, const char *prefix) {
    char name[256];
    const struct moe_st_tensor *gu, *dn;
    enum moe_status st;
    int64_t E = c->n_expert, F = c->n_ff_expert, H = c->n_embd;
    int64_t d1[3] = {E, 2 * F, H}, d2[3] = {E, H, F};
    snprintf(name, sizeof name, "%sexperts.gate_up_proj", prefix);
    if ((st = find_shape(b, name, 3, d1, &gu))) return st;
    snprintf(name, sizeof name, "%sexperts.down_proj", prefix);
    if ((st = find_shape(b, name, 3, d2, &dn))) return st;
    size_t es = moe_dtype_size(gu->dtype), ds = moe_dtype_size(dn->dtype);
    for (int64_t e = 0; e < E; e++) {
        const char *base = (const char *)gu->data + (size_t)(e * 2 * F * H) * es;
        L->experts[e].gate = (struct moe_weight){base, gu->dtype, F, H};
        L->experts[e].up = (struct moe_weight){base + (size_t)(F * H) * es, gu->dtype, F, H};
        L->experts[e].down =
            (struct moe_weight){(const char *)dn->data + (size_t)(e * H * F) * ds, dn->dtype, H, F};
    }
    return MOE_OK;
}

/* bind_moe: router, experts and shared expert of one MoE layer. */
static enum moe_status bind_moe(const struct bind *b, struct moe_layer *L,
                                const struct moe_config *c, int l) {
    enum moe_status st;
    char prefix[128];
    const int mixtral_names = c->arch == MOE_ARCH_MIXTRAL || c->arch == MOE_ARCH_PHIMOE;
    snprintf(prefix, sizeof prefix, "model.layers.%d.%s", l, mixtral_names ? "block_sparse_moe." : "mlp.");
    char probe[256];
    snprintf(probe, sizeof probe, "%sgate.weight", prefix);
    if (mixtral_names && !moe_safetensors_find(b->st, probe)) /* v5-native spelling */
        snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.", l);
    if ((st = bind_matrix(b, &L->router, c->n_expert, c->n_embd, "%sgate.weight", prefix))) return st;
    L->experts = calloc((size_t)c->n_expert, sizeof *L->experts);
    if (!L->experts) return MOE_ERR_NOMEM;
    snprintf(probe, sizeof probe, "%sexperts.gate_up_proj", prefix);
    if (moe_safetensors_find(b->st, probe)) {
        if ((st = bind_fused_experts(b, L, c, prefix))) return st;
    } else {
        for (int e = 0; e < c->n_expert; e++) {
            char ep[160];
            snprintf(ep, sizeof ep, "%sexperts.%d.", prefix, e);
            st = mixtral_names ? bind_ffn(b, &L->experts[e], c->n_embd, c->n_ff_expert, ep, "w1", "w3", "w2")
                               : bind_ffn(b, &L->experts[e], c->n_embd, c->n_ff_expert, ep,
                                          "gate_proj", "up_proj", "down_proj");
            if (st) return st;
        }
    }
    if (c->n_ff_shared > 0) {
        char sp[160];
        snprintf(sp, sizeof sp, "%sshared_expert.", prefix);
        if ((st = bind_ffn(b, &L->shared, c->n_embd, c->n_ff_shared, sp, "gate_proj", "up_proj",
                           "down_proj")))
            return st;
        if ((st = bind_matrix(b, &L->shared_gate, 1, c->n_embd, "%sshared_expert_gate.weight", prefix)))
            return st;
    }
    return MOE_OK;
}

/* bind_layer: attention, norms and feed-forward of layer l. */
static enum moe_status bind_layer(const struct bind *b, struct moe_layer *L,
                                  const struct moe_config *c, int l) {
    enum moe_status st;
    const int64_t H = c->n_embd, q = (int64_t)c->n_head * c->head_dim,
                  kv = (int64_t)c->n_head_kv * c->head_dim;
    const int ln = c->norm == MOE_NORM_LAYER;
    const char *p = "model.layers";
    if ((st = bind_vector(b, &L->attn_norm, H, 0, "%s.%d.input_layernorm.weight", p, l))) return st;
    if ((st = bind_vector(b, &L->ffn_norm, H, 0, "%s.%d.post_attention_layernorm.weight", p, l))) return st;
    if (ln) {
        if ((st = bind_vector(b, &L->attn_norm_b, H, 0, "%s.%d.input_layernorm.bias", p, l))) return st;
        if ((st = bind_vector(b, &L->ffn_norm_b, H, 0, "%s.%d.post_attention_layernorm.bias", p, l)))
            return st;
    }
    if ((st = bind_matrix(b, &L->wq, q, H, "%s.%d.self_attn.q_proj.weight", p, l))) return st;
    if ((st = bind_matrix(b, &L->wk, kv, H, "%s.%d.self_attn.k_proj.weight", p, l))) return st;
    if ((st = bind_matrix(b, &L->wv, kv, H, "%s.%d.self_attn.v_proj.weight", p, l))) return st;
    if ((st = bind_matrix(b, &L->wo, H, q, "%s.%d.self_attn.o_proj.weight", p, l))) return st;
    if (c->attn_qkv_bias) {
        if ((st = bind_vector(b, &L->bq, q, 0, "%s.%d.self_attn.q_proj.bias", p, l))) return st;
        if ((st = bind_vector(b, &L->bk, kv, 0, "%s.%d.self_attn.k_proj.bias", p, l))) return st;
        if ((st = bind_vector(b, &L->bv, kv, 0, "%s.%d.self_attn.v_proj.bias", p, l))) return st;
    }
    if (c->attn_o_bias && (st = bind_vector(b, &L->bo, H, 0, "%s.%d.self_attn.o_proj.bias", p, l)))
        return st;
    if (c->qk_norm != MOE_QK_NORM_NONE) {
        int full = c->qk_norm == MOE_QK_NORM_FULL;
        if ((st = bind_vector(b, &L->q_norm, full ? q : c->head_dim, 0, "%s.%d.self_attn.q_norm.weight", p, l)))
            return st;
        if ((st = bind_vector(b, &L->k_norm, full ? kv : c->head_dim, 0, "%s.%d.self_attn.k_norm.weight", p, l)))
            return st;
    }
    if (c->layer_moe[l]) return bind_moe(b, L, c, l);
    char dp[96];
    snprintf(dp, sizeof dp, "%s.%d.mlp.", p, l);
    return bind_ffn(b, &L->dense, H, c->n_ff_dense, dp, "gate_proj", "up_proj", "down_proj");
}

/* bind_all: every tensor of the model. */
static enum moe_status bind_all(const struct bind *b, struct moe_model *m) {
    const struct moe_config *c = &m->cfg;
    enum moe_status st;
    if ((st = bind_matrix(b, &m->tok_embd, c->n_vocab, c->n_embd, "model.embed_tokens.weight"))) return st;
    if ((st = bind_vector(b, &m->out_norm, c->n_embd, 0, "model.norm.weight"))) return st;
    if (c->norm == MOE_NORM_LAYER && (st = bind_vector(b, &m->out_norm_b, c->n_embd, 0, "model.norm.bias")))
        return st;
    if (c->tie_embeddings && !moe_safetensors_find(b->st, "lm_head.weight")) {
        m->lm_head = m->tok_embd;
    } else if ((st = bind_matrix(b, &m->lm_head, c->n_vocab, c->n_embd, "lm_head.weight"))) {
        return st;
    }
    if (c->lm_head_bias && (st = bind_vector(b, &m->lm_head_b, c->n_vocab, 0, "lm_head.bias"))) return st;
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) return MOE_ERR_NOMEM;
    for (int l = 0; l < c->n_layer; l++)
        if ((st = bind_layer(b, &m->layers[l], c, l))) return st;
    return MOE_OK;
}

enum moe_status moe_model_load_hf(const char *dir, struct moe_model **out) {
    *out = NULL;
    if (!moe_is_dir(dir)) {
        MOE_LOGE("%s: not a directory (expected a Hugging Face checkpoint directory with "
                 "config.json and *.safetensors)", dir);
        return MOE_ERR_NOT_FOUND;
    }
    struct moe_model *m = calloc(1, sizeof *m);
    if (!m) return MOE_ERR_NOMEM;
    enum moe_status st;
    m->path = strdup(dir);
    if ((st = moe_config_load(dir, &m->cfg))) goto fail;
    if ((st = moe_safetensors_open(dir, &m->st))) goto fail;
    struct bind b = {m->st, dir};
    if ((st = bind_all(&b, m))) goto fail;
    char *tj = moe_path_join(dir, "tokenizer.json");
    FILE *f = tj ? fopen(tj, "rb") : NULL;
    if (f) {
        fclose(f);
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

struct moe_model_params moe_model_default_params(void) {
    struct moe_model_params p = {0};
    return p;
}

enum moe_status moe_model_load(const char *path, const struct moe_model_params *params,
                               struct moe_model **out) {
    (void)params;
    *out = NULL;
    if (moe_is_dir(path)) return moe_model_load_hf(path, out);
    MOE_LOGE("%s: not a model directory (bundles are not supported yet)", path);
    return MOE_ERR_UNSUPPORTED;
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
        n += weight_params(&L->router) + ffn_params(&L->shared) + weight_params(&L->shared_gate);
        n += ffn_params(&L->dense);
        for (int e = 0; L->experts && e < c->n_expert; e++) n += ffn_params(&L->experts[e]);
    }
    return n;
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
        free(L->experts);
    }
    free(m->layers);
    free(m->out_norm);
    free(m->out_norm_b);
    free(m->lm_head_b);
    moe_config_clear(&m->cfg);
    moe_safetensors_free(m->st);
    moe_tokenizer_free(m->tok);
    free(m->path);
    free(m);
}

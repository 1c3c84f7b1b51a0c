/*
 * gguf-model.c - a GGUF file as a Hugging Face checkpoint: config.json text
 * from llama.cpp's metadata keys, transformers tensor names for llama.cpp's,
 * routed experts sliced out of the merged expert tensors (moe-gguf-model.h).
 *
 * Where a key is absent, the value is the one llama.cpp itself uses for that
 * architecture (norm_topk_prob: true for llama and qwen3moe, false for
 * qwen2moe and olmoe; gpt-oss's SwiGLU limit 7.0 and its even sliding
 * layers), so a file means here what it means to llama.cpp. Two exceptions
 * follow transformers because llama.cpp approximates the model: Phi-MoE routes
 * with sparsemixer (llama.cpp: softmax top-2), and gpt-oss's YaRN does not
 * round the correction range (llama.cpp's ggml rounds it).
 *
 * general.architecture picks a row of the architecture table (arch.c); the
 * keys only one family has are translated in its file (arch-*.c: Qwen's dense
 * layers, DeepSeek's MLA and routing, gpt-oss's SwiGLU limit and sliding
 * layers, Phi-MoE's longrope tensors), called from build_config.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch-impl.h"
#include "moe-gguf-model.h"

/* ------------------------------------------------------------------------- */
/* metadata access                                                            */

/* gm_akv: the value of "{arch}.suffix", or NULL. */
const struct moe_gguf_kv *gm_akv(const struct moe_gguf_model *v, const char *suffix) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", v->arch, suffix);
    return moe_gguf_find_kv(v->g, key);
}

/* gm_kv_int: a scalar integer item; 0 = absent (*out unchanged), 1 =
 * read, -1 = present with the wrong type (logged). */
int gm_kv_int(const struct moe_gguf_model *v, const struct moe_gguf_kv *kv, int64_t *out) {
    if (!kv) return 0;
    if (kv->type != MOE_GGUF_ARRAY && kv->type != MOE_GGUF_BOOL && moe_gguf_kv_int(kv, 0, out)) return 1;
    MOE_LOGE("%s: %s must be an integer (it is %s%s%s)", v->path, kv->key, moe_gguf_type_name(kv->type),
             kv->type == MOE_GGUF_ARRAY ? " of " : "", kv->type == MOE_GGUF_ARRAY ? moe_gguf_type_name(kv->elem) : "");
    return -1;
}

/* kv_scalar_float: as gm_kv_int for a number (float or integer). */
static int kv_scalar_float(const struct moe_gguf_model *v, const struct moe_gguf_kv *kv, double *out) {
    if (!kv) return 0;
    if (kv->type != MOE_GGUF_ARRAY && moe_gguf_kv_float(kv, 0, out) && isfinite(*out)) return 1;
    MOE_LOGE("%s: %s must be a finite number (it is %s)", v->path, kv->key, moe_gguf_type_name(kv->type));
    return -1;
}

/* kv_scalar_bool: as gm_kv_int for a bool. */
static int kv_scalar_bool(const struct moe_gguf_model *v, const struct moe_gguf_kv *kv, int *out) {
    int64_t x;
    if (!kv) return 0;
    if (kv->type == MOE_GGUF_BOOL && moe_gguf_kv_int(kv, 0, &x)) {
        *out = (int)x;
        return 1;
    }
    MOE_LOGE("%s: %s must be a bool (it is %s)", v->path, kv->key, moe_gguf_type_name(kv->type));
    return -1;
}

/* gm_fail: record the first error of a config build. */
void gm_fail(struct cfgb *b, enum moe_status st) {
    if (!b->st) b->st = st;
}

/* gm_put_int_key: config field `field` from key {arch}.suffix; required keys
 * report their absence. Returns 1 when set. */
int gm_put_int_key(struct cfgb *b, const char *field, const char *suffix, int required, int64_t lo, int64_t hi,
                   int64_t *out) {
    int64_t x = 0;
    int r = gm_kv_int(b->v, gm_akv(b->v, suffix), &x);
    if (r < 0) gm_fail(b, MOE_ERR_FORMAT);
    if (r == 0 && required) {
        MOE_LOGE("%s: missing required key %s.%s", b->v->path, b->v->arch, suffix);
        gm_fail(b, MOE_ERR_NOT_FOUND);
    }
    if (r <= 0 || b->st) return 0;
    if (x < lo || x > hi) {
        MOE_LOGE("%s: %s.%s = %lld is out of range [%lld, %lld]", b->v->path, b->v->arch, suffix, (long long)x,
                 (long long)lo, (long long)hi);
        gm_fail(b, MOE_ERR_FORMAT);
        return 0;
    }
    if (field) cJSON_AddNumberToObject(b->root, field, (double)x);
    if (out) *out = x;
    return 1;
}

/* gm_get_float_key: a float key; 1 when present and valid. */
int gm_get_float_key(struct cfgb *b, const char *suffix, double *out) {
    int r = kv_scalar_float(b->v, gm_akv(b->v, suffix), out);
    if (r < 0) gm_fail(b, MOE_ERR_FORMAT);
    return r > 0 && !b->st;
}

/* gm_get_bool_key: a bool key; 1 when present and valid. */
int gm_get_bool_key(struct cfgb *b, const char *suffix, int *out) {
    int r = kv_scalar_bool(b->v, gm_akv(b->v, suffix), out);
    if (r < 0) gm_fail(b, MOE_ERR_FORMAT);
    return r > 0 && !b->st;
}

/* gm_has: 1 if the file holds a tensor of this name (printf-style). */
int gm_has(const struct moe_gguf_model *v, const char *fmt, ...) {
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return moe_gguf_find_tensor(v->g, name) != NULL;
}

/* tensor_dim: ne[d] of a named tensor, or -1 if absent. */
static int64_t tensor_dim(const struct moe_gguf_model *v, const char *name, int d) {
    const struct moe_gguf_tensor *t = moe_gguf_find_tensor(v->g, name);
    return t ? t->ne[d] : -1;
}

/* ------------------------------------------------------------------------- */
/* config.json                                                                */

/* gm_put_ff: an intermediate size from a key, else from a tensor's row count. */
void gm_put_ff(struct cfgb *b, const char *field, const char *suffix, const char *tensor_fmt) {
    if (gm_put_int_key(b, field, suffix, 0, 1, 1 << 24, NULL) || b->st) return;
    char name[128];
    int64_t n = -1;
    for (int l = 0; l < b->v->n_layer && n < 0; l++) {
        snprintf(name, sizeof name, tensor_fmt, l);
        n = tensor_dim(b->v, name, 1);
    }
    if (n > 0) cJSON_AddNumberToObject(b->root, field, (double)n);
}

/* rope_yarn: the YaRN parameters llama.cpp records, then the family's
 * (DeepSeek's yarn_log_multiplier, gpt-oss's truncate). */
static void rope_yarn(struct cfgb *b, cJSON *rp, double factor) {
    const struct moe_gguf_model *v = b->v;
    int64_t omp = 0;
    double x;
    cJSON_AddStringToObject(rp, "rope_type", "yarn");
    cJSON_AddNumberToObject(rp, "factor", factor);
    if (!gm_put_int_key(b, NULL, "rope.scaling.original_context_length", 1, 1, 1 << 30, &omp)) return;
    cJSON_AddNumberToObject(rp, "original_max_position_embeddings", (double)omp);
    if (gm_get_float_key(b, "rope.scaling.yarn_beta_fast", &x)) cJSON_AddNumberToObject(rp, "beta_fast", x);
    if (gm_get_float_key(b, "rope.scaling.yarn_beta_slow", &x)) cJSON_AddNumberToObject(rp, "beta_slow", x);
    int have_af = gm_get_float_key(b, "rope.scaling.yarn_attn_factor", &x);
    if (have_af) cJSON_AddNumberToObject(rp, "attention_factor", x);
    if (v->row->gguf_yarn) v->row->gguf_yarn(b, rp, have_af);
}

/* put_rope: rope_parameters from rope.freq_base and rope.scaling.*, unless
 * the family writes them (Phi-MoE's longrope). own_dims: the attention's
 * rope dims are its own (MLA's qk_rope_head_dim), not a part of head_dim. */
static void put_rope(struct cfgb *b, int64_t head_dim, int64_t max_pos, int own_dims) {
    const struct moe_gguf_model *v = b->v;
    cJSON *rp = cJSON_AddObjectToObject(b->root, "rope_parameters");
    double theta = 10000.0, factor = 1.0;
    gm_get_float_key(b, "rope.freq_base", &theta);
    cJSON_AddNumberToObject(rp, "rope_theta", theta);
    const int64_t rot = head_dim;
    int64_t n_rot = rot;
    if (gm_put_int_key(b, NULL, "rope.dimension_count", 0, 2, 1 << 20, &n_rot) && !own_dims && n_rot != rot)
        cJSON_AddNumberToObject(rp, "partial_rotary_factor", (double)n_rot / (double)rot);
    const struct moe_gguf_kv *tk = gm_akv(v, "rope.scaling.type");
    struct moe_gguf_str ts = {"none", 4};
    if (tk && !moe_gguf_kv_str(tk, 0, &ts)) {
        MOE_LOGE("%s: %s must be a string", v->path, tk->key);
        gm_fail(b, MOE_ERR_FORMAT);
        return;
    }
    gm_get_float_key(b, "rope.scaling.factor", &factor);
    if (v->row->gguf_rope && v->row->gguf_rope(b, rp, n_rot, max_pos)) return;
    if ((ts.n == 4 && !memcmp(ts.p, "none", 4)) || (ts.n == 0)) {
        cJSON_AddStringToObject(rp, "rope_type", "default");
    } else if (ts.n == 6 && !memcmp(ts.p, "linear", 6)) {
        cJSON_AddStringToObject(rp, "rope_type", "linear");
        cJSON_AddNumberToObject(rp, "factor", factor);
    } else if (ts.n == 4 && !memcmp(ts.p, "yarn", 4)) {
        rope_yarn(b, rp, factor);
    } else {
        MOE_LOGE("%s: rope scaling type \"%.*s\" is not supported (none, linear, yarn)", v->path,
                 (int)(ts.n > 32 ? 32 : ts.n), ts.p);
        gm_fail(b, MOE_ERR_UNSUPPORTED);
    }
    if (gm_has(v, "rope_freqs.weight")) {
        MOE_LOGE("%s: rope_freqs (Llama-3-style frequency factors) are not supported", v->path);
        gm_fail(b, MOE_ERR_UNSUPPORTED);
    }
}

/* gm_put_topk_norm: norm_topk_prob from expert_weights_norm, else llama.cpp's
 * fixed choice for the architecture. */
void gm_put_topk_norm(struct cfgb *b, int dflt) {
    int x = dflt;
    gm_get_bool_key(b, "expert_weights_norm", &x);
    cJSON_AddBoolToObject(b->root, "norm_topk_prob", x);
}

/* token_id: tokenizer.ggml.<name>_token_id: 1 = read (an id in [0, 2^31)),
 * 0 = absent, -1 = malformed (logged, recorded in b). */
static int token_id(struct cfgb *b, const char *name, int64_t *out) {
    char key[64];
    snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", name);
    int r = gm_kv_int(b->v, moe_gguf_find_kv(b->v->g, key), out);
    if (r == 1 && (*out < 0 || *out > INT32_MAX)) {
        MOE_LOGE("%s: %s = %lld is not a token id", b->v->path, key, (long long)*out);
        r = -1;
    }
    if (r < 0) gm_fail(b, MOE_ERR_FORMAT);
    return r;
}

/* put_tokens: bos / eos ids (EOS and, when different, EOT end generation). */
static void put_tokens(struct cfgb *b) {
    int64_t x = -1, eot;
    if (token_id(b, "bos", &x) == 1) cJSON_AddNumberToObject(b->root, "bos_token_id", (double)x);
    cJSON *eos = cJSON_AddArrayToObject(b->root, "eos_token_id");
    x = -1;
    if (token_id(b, "eos", &x) == 1) cJSON_AddItemToArray(eos, cJSON_CreateNumber((double)x));
    if (token_id(b, "eot", &eot) == 1 && eot != x) cJSON_AddItemToArray(eos, cJSON_CreateNumber((double)eot));
}

/* build_config: the config.json text of the file's model. */
static enum moe_status build_config(struct moe_gguf_model *v) {
    struct cfgb b = {v, cJSON_CreateObject(), MOE_OK};
    if (!b.root) return MOE_ERR_NOMEM;
    cJSON *r = b.root;
    const struct arch_row *row = v->row;
    cJSON *archs = cJSON_AddArrayToObject(r, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(row->hf_class));
    int64_t n_embd = 0, n_head = 0, head_dim = 0, max_pos = 4096, kl = 0, vl = 0;
    cJSON_AddNumberToObject(r, "num_hidden_layers", v->n_layer);
    gm_put_int_key(&b, "hidden_size", "embedding_length", 1, 1, 1 << 24, &n_embd);
    gm_put_int_key(&b, "num_attention_heads", "attention.head_count", 1, 1, 100000, &n_head);
    if (b.st) goto done;
    int64_t vocab = tensor_dim(v, "token_embd.weight", 1);
    const struct moe_gguf_kv *toks = moe_gguf_find_kv(v->g, "tokenizer.ggml.tokens");
    if (vocab < 0 && toks && toks->type == MOE_GGUF_ARRAY) vocab = (int64_t)toks->n;
    if (!gm_put_int_key(&b, "vocab_size", "vocab_size", 0, 1, 1 << 30, NULL) && vocab > 0)
        cJSON_AddNumberToObject(r, "vocab_size", (double)vocab);
    gm_put_int_key(&b, "max_position_embeddings", "context_length", 0, 1, 1 << 30, &max_pos);
    double eps;
    if (gm_get_float_key(&b, "attention.layer_norm_rms_epsilon", &eps) ||
        gm_get_float_key(&b, "attention.layer_norm_epsilon", &eps))
        cJSON_AddNumberToObject(r, "rms_norm_eps", eps);
    head_dim = n_embd / n_head;
    if (!row->gguf_shapes) {
        gm_put_int_key(&b, "num_key_value_heads", "attention.head_count_kv", 0, 1, 100000, NULL);
        if (gm_put_int_key(&b, NULL, "attention.key_length", 0, 1, 1 << 20, &kl)) {
            vl = kl;
            gm_put_int_key(&b, NULL, "attention.value_length", 0, 1, 1 << 20, &vl);
            if (vl != kl) {
                MOE_LOGE("%s: key length %lld differs from value length %lld; only MLA models may do that", v->path,
                         (long long)kl, (long long)vl);
                gm_fail(&b, MOE_ERR_UNSUPPORTED);
            }
            head_dim = kl;
        }
        cJSON_AddNumberToObject(r, "head_dim", (double)head_dim);
        gm_put_int_key(&b, "num_local_experts", "expert_count", 1, 1, 1 << 16, NULL);
    } else {
        row->gguf_shapes(&b, n_head);
    }
    gm_put_int_key(&b, "num_experts_per_tok", "expert_used_count", 1, 1, 1 << 16, NULL);
    if (b.st) goto done;
    cJSON_AddBoolToObject(r, "tie_word_embeddings", !gm_has(v, "output.weight"));
    if (row->gguf_config) row->gguf_config(&b);
    if (b.st) goto done;
    const int mla = row->gguf_shapes != NULL; /* DeepSeek: its own head and rope dims */
    put_rope(&b, mla ? 0 : head_dim, max_pos, mla);
    put_tokens(&b);
    if (b.st) goto done;
    if (!(v->config_json = cJSON_PrintUnformatted(r))) b.st = MOE_ERR_NOMEM;
done:
    cJSON_Delete(r);
    return b.st;
}

/* ------------------------------------------------------------------------- */
/* tensors                                                                    */

/* keep: remember a buffer the view owns (freed with it). NULL -> NOMEM. */
static enum moe_status keep(struct moe_gguf_model *v, void *p) {
    if (!p) return MOE_ERR_NOMEM;
    void **o = realloc(v->owned, sizeof *o * (v->n_owned + 1));
    if (!o) {
        free(p);
        return MOE_ERR_NOMEM;
    }
    v->owned = o;
    v->owned[v->n_owned++] = p;
    return MOE_OK;
}

/* add: one table entry, the transformers shape being the reverse of ne. */
static enum moe_status add(struct moe_gguf_model *v, const char *hf, const struct moe_gguf_tensor *t, const void *data,
                           enum moe_qtype type, int n_dims, const int64_t *ne) {
    if (v->n_t == v->cap_t) {
        size_t cap = v->cap_t ? 2 * v->cap_t : 64;
        struct moe_gguf_hf_tensor *nt = realloc(v->t, sizeof *nt * cap);
        char **nn = nt ? realloc(v->names, sizeof *nn * cap) : NULL;
        if (nt) v->t = nt;
        if (!nn) return MOE_ERR_NOMEM;
        v->names = nn;
        v->cap_t = cap;
    }
    size_t n = strlen(hf) + 1;
    char *name = malloc(n);
    if (!name) return MOE_ERR_NOMEM;
    memcpy(name, hf, n);
    v->names[v->n_t] = name;
    struct moe_gguf_hf_tensor *e = &v->t[v->n_t++];
    memset(e, 0, sizeof *e);
    e->name = name;
    e->gguf_name = t->name;
    e->data = data;
    e->type = type;
    e->n_dims = n_dims;
    uint64_t rows = 1;
    for (int d = 0; d < n_dims; d++) {
        e->shape[d] = ne[n_dims - 1 - d];
        if (d) rows *= (uint64_t)ne[d];
    }
    e->nbytes = rows * (uint64_t)moe_qtype_row_bytes(type, ne[0]);
    return MOE_OK;
}

/* add_plain: a tensor as stored (dims as the file gives them). */
static enum moe_status add_plain(struct moe_gguf_model *v, const char *hf, const struct moe_gguf_tensor *t) {
    return add(v, hf, t, t->data, t->type, t->n_dims, t->ne);
}

/* add_unpermuted: a Llama q/k projection (weight rows, or bias elements) put
 * back from llama.cpp's rope order: convert_hf_to_gguf stores row
 * h*hd + 2i + j of head h where transformers has h*hd + j*hd/2 + i. */
static enum moe_status add_unpermuted(struct moe_gguf_model *v, const char *hf, const struct moe_gguf_tensor *t,
                                      int64_t heads) {
    const int vec = t->n_dims == 1;
    const int64_t rows = vec ? t->ne[0] : t->ne[1];
    if (t->n_dims > 2 || heads <= 0 || rows % (2 * heads) || (vec && t->type != MOE_QTYPE_F32)) {
        MOE_LOGE("%s: %s: cannot undo the rope permutation ([%lld x %lld] over %lld heads)", v->path, t->name,
                 (long long)(vec ? 1 : t->ne[1]), (long long)t->ne[0], (long long)heads);
        return MOE_ERR_SHAPE;
    }
    const size_t rb = vec ? 4 : moe_qtype_row_bytes(t->type, t->ne[0]);
    const int64_t hd = rows / heads, half = hd / 2;
    char *dst = malloc(rb * (size_t)rows + 1);
    enum moe_status st = keep(v, dst);
    if (st) return st;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int64_t j = 0; j < 2; j++)
                memcpy(dst + (size_t)(h * hd + j * half + i) * rb, (const char *)t->data + (size_t)(h * hd + 2 * i + j) * rb, rb);
    return add(v, hf, t, dst, t->type, t->n_dims, t->ne);
}

/* add_kv_b: DeepSeek's kv_b_proj [n_head*(nope+v), rank] rebuilt from
 * attn_k_b (torch [n_head, rank, nope]: the key half, transposed) and
 * attn_v_b ([n_head, v, rank]). Float types of one kind are copied as they
 * are; anything else is dequantized to f32. */
static enum moe_status add_kv_b(struct moe_gguf_model *v, const char *hf, const struct moe_gguf_tensor *k,
                                const struct moe_gguf_tensor *vb) {
    const int64_t nope = k->ne[0], rank = k->ne[1], nh = k->ne[2], vd = vb->ne[1];
    if (k->n_dims != 3 || vb->n_dims != 3 || vb->ne[0] != rank || vb->ne[2] != nh) {
        MOE_LOGE("%s: %s [%lld, %lld, %lld] and %s [%lld, %lld, %lld] do not split one kv_b_proj", v->path, k->name,
                 (long long)k->ne[2], (long long)k->ne[1], (long long)k->ne[0], vb->name, (long long)vb->ne[2],
                 (long long)vb->ne[1], (long long)vb->ne[0]);
        return MOE_ERR_SHAPE;
    }
    const int same = k->type == vb->type && moe_qtype_block_size(k->type) == 1;
    const enum moe_qtype ot = same ? k->type : MOE_QTYPE_F32;
    const size_t es = moe_qtype_row_bytes(ot, 1);
    const int64_t rows = nh * (nope + vd);
    char *dst = malloc((size_t)(rows * rank) * es + 1);
    float *kr = malloc(sizeof(float) * (size_t)(nope > rank ? nope : rank));
    enum moe_status st = keep(v, dst);
    if (st || !kr) {
        free(kr);
        return st ? st : MOE_ERR_NOMEM;
    }
    const size_t krb = moe_qtype_row_bytes(k->type, nope), vrb = moe_qtype_row_bytes(vb->type, rank);
    for (int64_t h = 0; h < nh && !st; h++) {
        char *hb = dst + (size_t)(h * (nope + vd) * rank) * es;
        for (int64_t c = 0; c < rank && !st; c++) { /* k_b row (h, c) holds column c of the nope key rows */
            const char *src = (const char *)k->data + (size_t)(h * rank + c) * krb;
            if (same) {
                for (int64_t r = 0; r < nope; r++) memcpy(hb + (size_t)(r * rank + c) * es, src + (size_t)r * es, es);
            } else if (!(st = moe_dequantize_row(k->type, src, kr, nope))) {
                for (int64_t r = 0; r < nope; r++) memcpy(hb + (size_t)(r * rank + c) * 4, &kr[r], 4);
            }
        }
        for (int64_t r = 0; r < vd && !st; r++) {
            const char *src = (const char *)vb->data + (size_t)(h * vd + r) * vrb;
            char *row = hb + (size_t)((nope + r) * rank) * es;
            if (same)
                memcpy(row, src, (size_t)rank * es);
            else
                st = moe_dequantize_row(vb->type, src, (float *)(void *)row, rank);
        }
    }
    free(kr);
    if (st) return st;
    const int64_t ne[2] = {rank, rows};
    return add(v, hf, k, dst, ot, 2, ne);
}

/* layer_name: the transformers name of a per-layer tensor base ("attn_q")
 * for this architecture into out; 0 for tensors that are not bound by name
 * (experts) or unknown. */
static int layer_name(const struct moe_gguf_model *v, const char *base, char *out, size_t size) {
    static const struct {
        const char *gguf, *hf;
    } common[] = {
        {"attn_norm", "input_layernorm"},        {"ffn_norm", "post_attention_layernorm"},
        {"post_attention_norm", "post_attention_layernorm"},
        {"attn_q", "self_attn.q_proj"},          {"attn_k", "self_attn.k_proj"},
        {"attn_v", "self_attn.v_proj"},          {"attn_output", "self_attn.o_proj"},
        {"attn_q_norm", "self_attn.q_norm"},     {"attn_k_norm", "self_attn.k_norm"},
        {"attn_q_a", "self_attn.q_a_proj"},      {"attn_q_a_norm", "self_attn.q_a_layernorm"},
        {"attn_q_b", "self_attn.q_b_proj"},      {"attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"},
        {"attn_kv_a_norm", "self_attn.kv_a_layernorm"}, {"attn_kv_b", "self_attn.kv_b_proj"},
        {"ffn_gate", "mlp.gate_proj"},           {"ffn_up", "mlp.up_proj"},
        {"ffn_down", "mlp.down_proj"},           {"ffn_gate_inp_shexp", "mlp.shared_expert_gate"},
    };
    static const struct {
        const char *gguf, *hf;
    } shared[] = {{"ffn_gate_shexp", "gate_proj"}, {"ffn_up_shexp", "up_proj"}, {"ffn_down_shexp", "down_proj"}};
    const struct arch_row *row = v->row;
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++)
        if (!strcmp(base, common[i].gguf)) return snprintf(out, size, "%s", common[i].hf) > 0;
    if (!strcmp(base, "ffn_gate_inp")) return snprintf(out, size, "%s.%s", row->moe_block, row->router_name) > 0;
    for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++)
        if (!strcmp(base, shared[i].gguf))
            return snprintf(out, size, "%s.%s", row->shared_block ? row->shared_block : "mlp.shared_expert",
                            shared[i].hf) > 0;
    return 0;
}

/* is_expert_part: merged expert tensors and older per-expert ones, bound by
 * moe_gguf_model_expert rather than by name. */
static int is_expert_part(const char *base) {
    static const char *const parts[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(base, parts[i])) return 1;
    const char *dot = strchr(base, '.');
    if (!dot) return 0;
    size_t n = (size_t)(dot - base);
    if (!((n == 8 && !strncmp(base, "ffn_gate", 8)) || (n == 6 && !strncmp(base, "ffn_up", 6)) ||
          (n == 8 && !strncmp(base, "ffn_down", 8))))
        return 0;
    for (const char *p = dot + 1; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return dot[1] != 0;
}

/* map_tensor: the table entry (or entries) of one GGUF tensor; *used = 0 for
 * a tensor that nothing binds. */
static enum moe_status map_tensor(struct moe_gguf_model *v, const struct moe_gguf_tensor *t, int64_t n_head,
                                  int64_t n_head_kv, int *used) {
    char hf[160];
    const char *n = t->name;
    *used = 1;
    if (!strcmp(n, "token_embd.weight")) return add_plain(v, "model.embed_tokens.weight", t);
    if (!strcmp(n, "output_norm.weight")) return add_plain(v, "model.norm.weight", t);
    if (!strcmp(n, "output_norm.bias")) return add_plain(v, "model.norm.bias", t);
    if (!strcmp(n, "output.weight")) return add_plain(v, "lm_head.weight", t);
    if (!strcmp(n, "output.bias")) return add_plain(v, "lm_head.bias", t);
    if (!strcmp(n, "rope_factors_long.weight") || !strcmp(n, "rope_factors_short.weight")) return MOE_OK; /* config */
    int layer = 0, pos = 4; /* "blk.<digits>." (parsed by hand: sscanf's %d has no overflow check) */
    if (strncmp(n, "blk.", 4) || n[4] < '0' || n[4] > '9') {
        *used = 0;
        return MOE_OK;
    }
    for (; n[pos] >= '0' && n[pos] <= '9'; pos++) {
        if (layer > 1000000) { /* far beyond block_count: ignored below */
            *used = 0;
            return MOE_OK;
        }
        layer = layer * 10 + (n[pos] - '0');
    }
    if (n[pos++] != '.') {
        *used = 0;
        return MOE_OK;
    }
    if (layer >= v->n_layer) return MOE_OK; /* DeepSeek's multi-token-prediction layers: ignored, as transformers does */
    char base[64];
    const char *rest = n + pos, *suffix = strrchr(rest, '.');
    if (!suffix || (size_t)(suffix - rest) >= sizeof base || (strcmp(suffix, ".weight") && strcmp(suffix, ".bias"))) {
        *used = 0;
        return MOE_OK;
    }
    memcpy(base, rest, (size_t)(suffix - rest));
    base[suffix - rest] = 0;
    if (is_expert_part(base)) return MOE_OK;
    const char *p = "model.layers";
    if (!strcmp(base, "attn_sinks")) {
        snprintf(hf, sizeof hf, "%s.%d.self_attn.sinks", p, layer);
        return add_plain(v, hf, t);
    }
    if (!strcmp(base, "exp_probs_b")) {
        snprintf(hf, sizeof hf, "%s.%d.mlp.gate.e_score_correction_bias", p, layer);
        return add_plain(v, hf, t);
    }
    if (!strcmp(base, "attn_v_b")) return MOE_OK; /* rebuilt with attn_k_b */
    if (!strcmp(base, "attn_k_b")) {
        char vn[96];
        snprintf(vn, sizeof vn, "blk.%d.attn_v_b.weight", layer);
        const struct moe_gguf_tensor *vb = moe_gguf_find_tensor(v->g, vn);
        if (!vb) {
            MOE_LOGE("%s: %s has no %s to rebuild kv_b_proj with", v->path, n, vn);
            return MOE_ERR_NOT_FOUND;
        }
        snprintf(hf, sizeof hf, "%s.%d.self_attn.kv_b_proj.weight", p, layer);
        return add_kv_b(v, hf, t, vb);
    }
    char name[96];
    if (!layer_name(v, base, name, sizeof name)) {
        *used = 0;
        return MOE_OK;
    }
    snprintf(hf, sizeof hf, "%s.%d.%s%s", p, layer, name, suffix);
    if (!strcmp(base, "ffn_gate_inp_shexp")) { /* transformers: [1, hidden] */
        const int64_t ne[2] = {t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3], 1};
        return add(v, hf, t, t->data, t->type, 2, ne);
    }
    if (v->row->gguf_qk_permuted && !strcmp(base, "attn_q")) return add_unpermuted(v, hf, t, n_head);
    if (v->row->gguf_qk_permuted && !strcmp(base, "attn_k")) return add_unpermuted(v, hf, t, n_head_kv);
    return add_plain(v, hf, t);
}

/* Orders table entries by transformers name (qsort / bsearch). */
static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const struct moe_gguf_hf_tensor *)a)->name, ((const struct moe_gguf_hf_tensor *)b)->name);
}

/* build_table: every bound tensor under its transformers name. */
static enum moe_status build_table(struct moe_gguf_model *v) {
    int64_t n_head = 0, n_head_kv = 0;
    gm_kv_int(v, gm_akv(v, "attention.head_count"), &n_head);
    n_head_kv = n_head;
    gm_kv_int(v, gm_akv(v, "attention.head_count_kv"), &n_head_kv);
    size_t unused = 0;
    const char *first = NULL;
    for (size_t i = 0; i < moe_gguf_n_tensors(v->g); i++) {
        const struct moe_gguf_tensor *t = moe_gguf_tensor_at(v->g, i);
        int used;
        enum moe_status st = map_tensor(v, t, n_head, n_head_kv, &used);
        if (st) return st;
        if (!used && unused++ == 0) first = t->name;
    }
    if (unused)
        MOE_LOGW("%s: %zu tensor(s) are not used (first: %s)", v->path, unused, first);
    if (v->n_t) qsort(v->t, v->n_t, sizeof *v->t, cmp_entry);
    for (size_t i = 1; i < v->n_t; i++)
        if (!strcmp(v->t[i - 1].name, v->t[i].name)) {
            MOE_LOGE("%s: tensors %s and %s both map to %s", v->path, v->t[i - 1].gguf_name, v->t[i].gguf_name,
                     v->t[i].name);
            return MOE_ERR_FORMAT;
        }
    return MOE_OK;
}

/* ------------------------------------------------------------------------- */
/* open / experts                                                             */

/* pick_arch: general.architecture's row, refined or refused by the family
 * (deepseek2: V2 or V3; llama: only with experts). */
static enum moe_status pick_arch(struct moe_gguf_model *v) {
    const struct moe_gguf_kv *kv = moe_gguf_find_kv(v->g, "general.architecture");
    struct moe_gguf_str s;
    if (!kv || kv->type != MOE_GGUF_STRING || !moe_gguf_kv_str(kv, 0, &s)) {
        MOE_LOGE("%s: general.architecture is missing or not a string", v->path);
        return MOE_ERR_FORMAT;
    }
    if (!(v->row = arch_by_gguf(s.p, s.n))) {
        char list[256];
        arch_list(1, list, sizeof list);
        MOE_LOGE("%s: GGUF architecture \"%.*s\" is not supported (supported: %s; llama only with experts, as "
                 "Mixtral)",
                 v->path, (int)(s.n > 40 ? 40 : s.n), s.p, list);
        return MOE_ERR_UNSUPPORTED;
    }
    snprintf(v->arch, sizeof v->arch, "%s", v->row->gguf_name);
    int64_t x = 0;
    if (gm_kv_int(v, moe_gguf_find_kv(v->g, "split.count"), &x) == 1 && x > 1) {
        MOE_LOGE("%s: this is part of a GGUF split into %lld files, which is not read; merge the parts first "
                 "(llama.cpp: llama-gguf-split --merge FIRST-PART OUT.gguf)",
                 v->path, (long long)x);
        return MOE_ERR_UNSUPPORTED;
    }
    if (gm_kv_int(v, gm_akv(v, "block_count"), &x) != 1 || x < 1 || x > 100000) {
        MOE_LOGE("%s: %s.block_count is missing or out of range", v->path, v->arch);
        return MOE_ERR_FORMAT;
    }
    v->n_layer = (int)x;
    if (v->row->gguf_check) return v->row->gguf_check(v);
    return MOE_OK;
}

/* Picks the architecture, then builds the config text, the tensor table and the tokenizer texts. */
enum moe_status moe_gguf_model_open(const struct moe_gguf *g, struct moe_gguf_model **out) {
    *out = NULL;
    struct moe_gguf_model *v = calloc(1, sizeof *v);
    if (!v) return MOE_ERR_NOMEM;
    v->g = g;
    v->path = moe_gguf_path(g);
    enum moe_status st;
    if ((st = pick_arch(v)) || (st = build_config(v)) || (st = build_table(v))) goto fail;
    st = moe_gguf_vocab_texts(g, &v->tok_json, &v->tok_cfg_json);
    if (st == MOE_ERR_NOT_FOUND)
        st = MOE_OK;
    else if (st)
        goto fail;
    *out = v;
    return MOE_OK;
fail:
    moe_gguf_model_free(v);
    return st;
}

/* Frees the names, the rebuilt buffers and the texts. */
void moe_gguf_model_free(struct moe_gguf_model *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n_t; i++) free(v->names[i]);
    for (size_t i = 0; i < v->n_owned; i++) free(v->owned[i]);
    free(v->names);
    free(v->t);
    free(v->owned);
    free(v->config_json);
    free(v->tok_json);
    free(v->tok_cfg_json);
    free(v);
}

/* Accessors of the translated texts and the table. */
const char *moe_gguf_model_config_json(const struct moe_gguf_model *v) { return v->config_json; }
const char *moe_gguf_model_tokenizer_json(const struct moe_gguf_model *v) { return v->tok_json; }
const char *moe_gguf_model_tokenizer_config_json(const struct moe_gguf_model *v) { return v->tok_cfg_json; }
size_t moe_gguf_model_count(const struct moe_gguf_model *v) { return v->n_t; }

/* The i-th table entry (sorted by name), or NULL. */
const struct moe_gguf_hf_tensor *moe_gguf_model_at(const struct moe_gguf_model *v, size_t i) {
    return i < v->n_t ? &v->t[i] : NULL;
}

/* Binary search of the name-sorted table. */
const struct moe_gguf_hf_tensor *moe_gguf_model_find(const struct moe_gguf_model *v, const char *hf_name) {
    if (!v->n_t) return NULL;
    struct moe_gguf_hf_tensor key = {.name = hf_name};
    return bsearch(&key, v->t, v->n_t, sizeof *v->t, cmp_entry);
}

/* expert_matrix: expert e's [rows x cols] slice of a merged tensor
 * `blk.L.<base>.weight` (ne {cols, rows, E}), or the per-expert tensor
 * `blk.L.<single>.E.weight` of older files. */
static enum moe_status expert_matrix(const struct moe_gguf_model *v, int l, int e, int n_expert, const char *base,
                                     const char *single, int64_t rows, int64_t cols, struct moe_weight *w) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, base);
    const struct moe_gguf_tensor *t = moe_gguf_find_tensor(v->g, name);
    if (t) {
        if (t->n_dims != 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n_expert) {
            MOE_LOGE("%s: %s has shape [%lld, %lld, %lld], expected [%d, %lld, %lld]", v->path, name, (long long)t->ne[2],
                     (long long)t->ne[1], (long long)t->ne[0], n_expert, (long long)rows, (long long)cols);
            return MOE_ERR_SHAPE;
        }
        const size_t bytes = moe_qtype_row_bytes(t->type, cols) * (size_t)rows;
        *w = (struct moe_weight){(const char *)t->data + (size_t)e * bytes, t->type, rows, cols};
        return MOE_OK;
    }
    snprintf(name, sizeof name, "blk.%d.%s.%d.weight", l, single, e);
    if (!(t = moe_gguf_find_tensor(v->g, name))) {
        MOE_LOGE("%s: layer %d has neither blk.%d.%s.weight nor %s", v->path, l, l, base, name);
        return MOE_ERR_NOT_FOUND;
    }
    if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows) {
        MOE_LOGE("%s: %s has shape [%lld, %lld], expected [%lld, %lld]", v->path, name, (long long)t->ne[1],
                 (long long)t->ne[0], (long long)rows, (long long)cols);
        return MOE_ERR_SHAPE;
    }
    *w = (struct moe_weight){t->data, t->type, rows, cols};
    return MOE_OK;
}

/* expert_bias_row: expert e's row of blk.L.<base>.bias (ne {n, E}) as floats. */
static enum moe_status expert_bias_row(const struct moe_gguf_model *v, int l, int e, int n_expert, const char *base,
                                       int64_t n, float *out) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.bias", l, base);
    const struct moe_gguf_tensor *t = moe_gguf_find_tensor(v->g, name);
    if (!t || t->n_dims != 2 || t->ne[0] != n || t->ne[1] != n_expert) {
        MOE_LOGE("%s: %s %s (expected [%d, %lld])", v->path, name, t ? "has the wrong shape" : "is missing", n_expert,
                 (long long)n);
        return t ? MOE_ERR_SHAPE : MOE_ERR_NOT_FOUND;
    }
    const size_t rb = moe_qtype_row_bytes(t->type, n);
    return moe_dequantize_row(t->type, (const char *)t->data + (size_t)e * rb, out, n);
}

/* Views of one expert's matrices; gpt-oss's biases copied into a block the view owns. */
enum moe_status moe_gguf_model_expert(struct moe_gguf_model *v, const struct moe_config *c, int layer, int expert,
                                      struct moe_ffn *out) {
    const int64_t H = c->n_embd, F = c->n_ff_expert;
    const int E = c->n_expert;
    enum moe_status st;
    memset(out, 0, sizeof *out);
    if ((st = expert_matrix(v, layer, expert, E, "ffn_gate_exps", "ffn_gate", F, H, &out->gate)) ||
        (st = expert_matrix(v, layer, expert, E, "ffn_up_exps", "ffn_up", F, H, &out->up)) ||
        (st = expert_matrix(v, layer, expert, E, "ffn_down_exps", "ffn_down", H, F, &out->down)))
        return st;
    if (!c->expert_bias) return MOE_OK;
    float *bias = malloc(sizeof(float) * (size_t)(2 * F + H));
    if ((st = keep(v, bias))) return st;
    if ((st = expert_bias_row(v, layer, expert, E, "ffn_gate_exps", F, bias)) ||
        (st = expert_bias_row(v, layer, expert, E, "ffn_up_exps", F, bias + F)) ||
        (st = expert_bias_row(v, layer, expert, E, "ffn_down_exps", H, bias + 2 * F)))
        return st;
    out->bias = bias;
    return MOE_OK;
}

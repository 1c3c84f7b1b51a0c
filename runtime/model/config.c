/*
 * config.c - config.json -> struct moe_config for the supported architectures.
 *
 * Field names follow transformers; both the v4 spellings (rope_theta,
 * rope_scaling, num_experts) and the v5 ones (rope_parameters,
 * num_local_experts, qkv_bias) are accepted. Where transformers' config class
 * has a default, an absent field takes that default; shape-defining fields are
 * required and their absence is an error naming the field.
 *
 * What differs by architecture is its row of the table (arch.c: class name,
 * defaults) and its family's hooks (arch-*.c); this file holds what every
 * architecture shares and calls them at fixed points (arch-impl.h).
 */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arch-impl.h"
#include "moe-mmap.h"
#include "moe-model.h"

/* cfg_field: a top-level field, NULL when absent or null. */
const cJSON *cfg_field(const struct cfg_ctx *c, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, name);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

/* cfg_int: read an integer field; required fields report their absence. */
enum moe_status cfg_int(const struct cfg_ctx *c, const char *name, int required, int def, int lo, int hi, int *out) {
    const cJSON *v = cfg_field(c, name);
    if (!v) {
        if (required) {
            MOE_LOGE("%s: missing required field \"%s\"", c->label, name);
            return MOE_ERR_NOT_FOUND;
        }
        *out = def;
        return MOE_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi) {
        MOE_LOGE("%s: field \"%s\" must be an integer in [%d, %d]", c->label, name, lo, hi);
        return MOE_ERR_INVALID;
    }
    *out = (int)v->valuedouble;
    return MOE_OK;
}

/* cfg_float: a number member of obj within float range; def when absent or null. */
enum moe_status cfg_float(const struct cfg_ctx *c, const cJSON *obj, const char *name, double def, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!v || cJSON_IsNull(v)) {
        *out = (float)def;
        return MOE_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || !isfinite((float)v->valuedouble)) {
        MOE_LOGE("%s: field \"%s\" must be a number within float range", c->label, name);
        return MOE_ERR_INVALID;
    }
    *out = (float)v->valuedouble;
    return MOE_OK;
}

/* cfg_bool: a top-level true / false; def when absent or null. */
enum moe_status cfg_bool(const struct cfg_ctx *c, const char *name, int def, int *out) {
    const cJSON *v = cfg_field(c, name);
    if (!v) {
        *out = def;
        return MOE_OK;
    }
    if (!cJSON_IsBool(v)) {
        MOE_LOGE("%s: field \"%s\" must be true or false", c->label, name);
        return MOE_ERR_INVALID;
    }
    *out = cJSON_IsTrue(v);
    return MOE_OK;
}

/* read_factor_list: a longrope factor array of exactly n numbers. */
static enum moe_status read_factor_list(const struct cfg_ctx *c, const cJSON *rp, const char *name,
                                        int n, float **out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(rp, name);
    if (!cJSON_IsArray(a)) {
        MOE_LOGE("%s: longrope needs \"%s\" (a list of %d numbers)", c->label, name, n);
        return MOE_ERR_NOT_FOUND;
    }
    if (cJSON_GetArraySize(a) != n) {
        MOE_LOGE("%s: \"%s\" has %d values, expected %d (rotary dims / 2)", c->label, name,
                 cJSON_GetArraySize(a), n);
        return MOE_ERR_INVALID;
    }
    float *f = malloc(sizeof(float) * (size_t)n);
    if (!f) return MOE_ERR_NOMEM;
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e) || !((float)e->valuedouble > 0) || !isfinite((float)e->valuedouble)) {
            MOE_LOGE("%s: \"%s\"[%d] must be a positive number within float range", c->label, name, i);
            free(f);
            return MOE_ERR_INVALID;
        }
        f[i++] = (float)e->valuedouble;
    }
    *out = f;
    return MOE_OK;
}

/* cfg_yarn_mscale: YaRN's attention temperature 0.1 * m * ln(scale) + 1 (1 for scale <= 1). */
double cfg_yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

/* parse_yarn: YaRN's parameters as transformers' _compute_yarn_parameters reads
 * them; for MLA also the softmax scale's mscale_all_dim correction. */
static enum moe_status parse_yarn(const struct cfg_ctx *c, struct moe_config *cfg, const cJSON *p) {
    struct moe_rope *r = &cfg->rope;
    enum moe_status st;
    r->kind = MOE_ROPE_YARN;
    float omp;
    const cJSON *top_omp = cfg_field(c, "original_max_position_embeddings");
    double omp_def = cJSON_IsNumber(top_omp) ? top_omp->valuedouble : cfg->max_pos;
    if ((st = cfg_float(c, p, "original_max_position_embeddings", omp_def, &omp))) return st;
    if (!(omp >= 1 && omp <= (float)(1 << 30))) { /* also keeps the int cast below defined */
        MOE_LOGE("%s: yarn original_max_position_embeddings must be in [1, 2^30]", c->label);
        return MOE_ERR_INVALID;
    }
    r->original_max_pos = (int)omp;
    /* no factor: the ratio of the extended to the original context (DeepSeek-V3's note) */
    if ((st = cfg_float(c, p, "factor", (double)cfg->max_pos / omp, &r->factor))) return st;
    if (!(r->factor > 0)) {
        MOE_LOGE("%s: yarn factor must be positive", c->label);
        return MOE_ERR_INVALID;
    }
    float mscale, mscale_all, af;
    if ((st = cfg_float(c, p, "mscale", 0.0, &mscale)) || (st = cfg_float(c, p, "mscale_all_dim", 0.0, &mscale_all)) ||
        (st = cfg_float(c, p, "attention_factor", -1.0, &af)))
        return st;
    if (af >= 0)
        r->attention_factor = af;
    else if (mscale != 0 && mscale_all != 0)
        r->attention_factor = (float)(cfg_yarn_mscale(r->factor, mscale) / cfg_yarn_mscale(r->factor, mscale_all));
    else
        r->attention_factor = (float)cfg_yarn_mscale(r->factor, 1.0);
    if (!(isfinite(r->attention_factor) && r->attention_factor > 0)) { /* mscale / mscale_all_dim of 0 or inf */
        MOE_LOGE("%s: yarn attention_factor (from attention_factor, mscale and mscale_all_dim) must be a positive "
                 "number (got %g)", c->label, (double)r->attention_factor);
        return MOE_ERR_INVALID;
    }
    /* transformers: `get("beta_fast") or 32`, so 0 also means the default */
    if ((st = cfg_float(c, p, "beta_fast", 32.0, &r->beta_fast)) ||
        (st = cfg_float(c, p, "beta_slow", 1.0, &r->beta_slow)))
        return st;
    if (r->beta_fast == 0) r->beta_fast = 32;
    if (r->beta_slow == 0) r->beta_slow = 1;
    if (!(r->beta_fast > 0 && r->beta_slow > 0)) {
        MOE_LOGE("%s: yarn beta_fast and beta_slow must be positive", c->label);
        return MOE_ERR_INVALID;
    }
    r->truncate = 1;
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(p, "truncate");
    if (tr && !cJSON_IsNull(tr)) {
        if (!cJSON_IsBool(tr)) {
            MOE_LOGE("%s: yarn \"truncate\" must be true or false", c->label);
            return MOE_ERR_INVALID;
        }
        r->truncate = cJSON_IsTrue(tr);
    }
    return MOE_OK;
}

/* parse_rope: rope_parameters (v5) or rope_theta + rope_scaling (v4). */
static enum moe_status parse_rope(const struct cfg_ctx *c, struct moe_config *cfg, double def_theta) {
    struct moe_rope *r = &cfg->rope;
    const cJSON *rp = cfg_field(c, "rope_parameters");
    const cJSON *rs = cfg_field(c, "rope_scaling");
    if (rp && !cJSON_IsObject(rp)) {
        MOE_LOGE("%s: \"rope_parameters\" must be an object", c->label);
        return MOE_ERR_INVALID;
    }
    if (rs && !cJSON_IsObject(rs)) {
        MOE_LOGE("%s: \"rope_scaling\" must be an object", c->label);
        return MOE_ERR_INVALID;
    }
    const cJSON *p = rp ? rp : rs; /* where the scaling parameters live */
    enum moe_status st;
    /* theta: rope_parameters.rope_theta, else top-level rope_theta, else the class default */
    float theta;
    if ((st = cfg_float(c, c->root, "rope_theta", def_theta, &theta))) return st;
    if (rp && (st = cfg_float(c, rp, "rope_theta", theta, &theta))) return st;
    if (!(theta > 0)) { /* a RoPE base <= 0 gives NaN frequencies */
        MOE_LOGE("%s: rope_theta must be a positive number (got %g)", c->label, (double)theta);
        return MOE_ERR_INVALID;
    }
    r->theta = theta;
    float prf = 1.0f;
    if ((st = cfg_float(c, c->root, "partial_rotary_factor", 1.0, &prf))) return st;
    if (p && (st = cfg_float(c, p, "partial_rotary_factor", prf, &prf))) return st;
    if (!(prf > 0 && prf <= 1)) {
        MOE_LOGE("%s: partial_rotary_factor must be in (0, 1]", c->label);
        return MOE_ERR_INVALID;
    }
    const int rope_head = cfg->attn == MOE_ATTN_MLA ? cfg->qk_rope_dim : cfg->head_dim;
    r->n_rot = (int)(rope_head * prf);
    r->n_rot -= r->n_rot % 2;
    r->kind = MOE_ROPE_DEFAULT;
    r->factor = 1.0f;
    r->attention_factor = 1.0f;
    if (!p) return MOE_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "rope_type");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "default";
    if (!strcmp(type, "default")) return MOE_OK;
    if ((st = cfg_float(c, p, "factor", 1.0, &r->factor))) return st;
    if (!(r->factor > 0)) {
        MOE_LOGE("%s: RoPE scaling factor must be a positive number (got %g)", c->label, (double)r->factor);
        return MOE_ERR_INVALID;
    }
    if (!strcmp(type, "linear")) {
        r->kind = MOE_ROPE_LINEAR;
        return MOE_OK;
    }
    if (!strcmp(type, "llama3")) {
        r->kind = MOE_ROPE_LLAMA3;
        float omp;
        if ((st = cfg_float(c, p, "low_freq_factor", 1.0, &r->low_freq_factor))) return st;
        if ((st = cfg_float(c, p, "high_freq_factor", 4.0, &r->high_freq_factor))) return st;
        if ((st = cfg_float(c, p, "original_max_position_embeddings", 8192, &omp))) return st;
        if (!(r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor && omp >= 1 && omp <= (1 << 30))) {
            MOE_LOGE("%s: llama3 RoPE needs 0 < low_freq_factor < high_freq_factor and "
                     "original_max_position_embeddings >= 1 (got %g, %g, %g)",
                     c->label, (double)r->low_freq_factor, (double)r->high_freq_factor, (double)omp);
            return MOE_ERR_INVALID;
        }
        r->original_max_pos = (int)omp;
        return MOE_OK;
    }
    if (!strcmp(type, "longrope") || !strcmp(type, "su")) {
        r->kind = MOE_ROPE_LONGROPE;
        float omp;
        const cJSON *top_omp = cfg_field(c, "original_max_position_embeddings");
        double omp_def = cJSON_IsNumber(top_omp) ? top_omp->valuedouble : cfg->max_pos;
        if ((st = cfg_float(c, p, "original_max_position_embeddings", omp_def, &omp))) return st;
        if (cJSON_IsNumber(top_omp)) omp = (float)top_omp->valuedouble; /* transformers prefers it */
        if (!(omp >= 1 && omp <= (1 << 30))) {
            MOE_LOGE("%s: longrope original_max_position_embeddings must be >= 1", c->label);
            return MOE_ERR_INVALID;
        }
        r->original_max_pos = (int)omp;
        int n = r->n_rot / 2;
        if ((st = read_factor_list(c, p, "short_factor", n, &r->short_factor))) return st;
        if ((st = read_factor_list(c, p, "long_factor", n, &r->long_factor))) return st;
        if (c->row->parse_longrope && (st = c->row->parse_longrope(c, cfg, p))) return st;
        /* attention factor as transformers' _compute_longrope_parameters sets it */
        float factor_def = (float)cfg->max_pos / (float)r->original_max_pos;
        const cJSON *fj = cJSON_GetObjectItemCaseSensitive(p, "factor");
        float factor = cJSON_IsNumber(fj) ? (float)fj->valuedouble : factor_def;
        const cJSON *af = cJSON_GetObjectItemCaseSensitive(p, "attention_factor");
        if (cJSON_IsNumber(af))
            r->attention_factor = (float)af->valuedouble;
        else
            r->attention_factor =
                factor <= 1.0f ? 1.0f
                               : (float)sqrt(1.0 + log(factor) / log((double)r->original_max_pos));
        if (!(isfinite(r->attention_factor) && r->attention_factor > 0)) {
            MOE_LOGE("%s: longrope attention_factor must be a positive number (got %g)", c->label,
                     (double)r->attention_factor);
            return MOE_ERR_INVALID;
        }
        return MOE_OK;
    }
    if (!strcmp(type, "yarn")) return parse_yarn(c, cfg, p);
    MOE_LOGE("%s: RoPE scaling type \"%s\" is not supported (supported: default, linear, llama3, "
             "longrope, yarn)",
             c->label, type);
    return MOE_ERR_UNSUPPORTED;
}

/* parse_layer_kinds: which layers are MoE and which use sliding-window attention. */
static enum moe_status parse_layer_kinds(const struct cfg_ctx *c, struct moe_config *cfg) {
    enum moe_status st;
    int L = cfg->n_layer;
    cfg->layer_moe = calloc((size_t)L, 1);
    cfg->layer_sliding = calloc((size_t)L, 1);
    if (!cfg->layer_moe || !cfg->layer_sliding) return MOE_ERR_NOMEM;
    int step = 1;
    if ((st = cfg_int(c, "decoder_sparse_step", 0, 1, 1, 1 << 20, &step))) return st;
    const cJSON *mlp_only = cfg_field(c, "mlp_only_layers");
    if (mlp_only && !cJSON_IsArray(mlp_only)) {
        MOE_LOGE("%s: \"mlp_only_layers\" must be a list", c->label);
        return MOE_ERR_INVALID;
    }
    const struct arch_row *row = c->row;
    int first_moe = 0; /* DeepSeek: the first first_k_dense_replace layers are dense */
    if (row->first_dense_key &&
        (st = cfg_int(c, row->first_dense_key, 0, row->first_dense_default, 0, 1 << 20, &first_moe)))
        return st;
    int has_dense = 0;
    for (int l = 0; l < L; l++) {
        int moe = l >= first_moe;
        if (row->sparse_step) moe = ((l + 1) % step) == 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, mlp_only) {
            if (cJSON_IsNumber(e) && e->valuedouble == (double)l) moe = 0; /* no cast of a huge value */
        }
        cfg->layer_moe[l] = (uint8_t)moe;
        has_dense |= !moe;
    }
    if (has_dense && cfg->n_ff_dense <= 0) {
        MOE_LOGE("%s: dense MLP layers need \"intermediate_size\"", c->label);
        return MOE_ERR_NOT_FOUND;
    }
    /* sliding window: v5 layer_types wins; else per-architecture rules */
    int window = 0;
    if ((st = cfg_int(c, "sliding_window", 0, 0, 0, 1 << 30, &window))) return st;
    int use = 1;
    if (row->sliding_switch && (st = cfg_bool(c, "use_sliding_window", 0, &use))) return st;
    if (!use) window = 0; /* transformers ignores the window unless use_sliding_window */
    const cJSON *types = cfg_field(c, "layer_types");
    if (types) {
        if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != L) {
            MOE_LOGE("%s: \"layer_types\" must list %d layer kinds", c->label, L);
            return MOE_ERR_INVALID;
        }
        int l = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, types) {
            cfg->layer_sliding[l++] = cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention");
        }
    } else if (row->sliding_layers) { /* the family's default layer_types */
        if ((st = row->sliding_layers(c, cfg))) return st;
    } else { /* Mixtral, Phi-MoE, OLMoE, Qwen3-MoE: one window for every layer */
        for (int l = 0; l < L; l++) cfg->layer_sliding[l] = 1;
    }
    int any = 0;
    for (int l = 0; l < L; l++) {
        if (window <= 0) cfg->layer_sliding[l] = 0; /* no window: full attention everywhere */
        any |= cfg->layer_sliding[l];
    }
    cfg->sliding_window = any ? window : 0;
    return MOE_OK;
}

/* check_token_ids: field `name`, if present, is a token id or a list of token
 * ids, each an integer in [0, n_vocab). */
static enum moe_status check_token_ids(const struct cfg_ctx *c, const char *name, int n_vocab) {
    const cJSON *v = cfg_field(c, name), *e;
    int ok = !v || cJSON_IsNumber(v) || cJSON_IsArray(v);
    if (v && cJSON_IsNumber(v)) ok = v->valuedouble == floor(v->valuedouble) && v->valuedouble >= 0 &&
                                     v->valuedouble < n_vocab;
    if (v && cJSON_IsArray(v))
        cJSON_ArrayForEach(e, v) ok &= cJSON_IsNumber(e) && e->valuedouble == floor(e->valuedouble) &&
                                      e->valuedouble >= 0 && e->valuedouble < n_vocab;
    if (!ok) {
        MOE_LOGE("%s: field \"%s\" must be a token id (or a list of them) in [0, %d)", c->label, name, n_vocab);
        return MOE_ERR_RANGE;
    }
    return MOE_OK;
}

/* token_id_ok: v is an integer an int can hold (a cast of anything else is undefined). */
static int token_id_ok(const cJSON *v) {
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && v->valuedouble >= INT_MIN &&
           v->valuedouble <= INT_MAX;
}

/* parse_token_ids: an int or a list of ints (eos_token_id may be either);
 * values that are not ints are left out (the callers range-check the rest). */
static void parse_token_ids(const cJSON *v, int *ids, int *n, int max) {
    if (cJSON_IsNumber(v)) {
        if (*n < max && token_id_ok(v)) ids[(*n)++] = (int)v->valuedouble;
    } else if (cJSON_IsArray(v)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (*n < max && token_id_ok(e)) ids[(*n)++] = (int)e->valuedouble;
        }
    }
}

/* q_string: a string member of quantization_config, or `def` when absent or
 * null; NULL when present but not a string. */
static const char *q_string(const cJSON *q, const char *name, const char *def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(q, name);
    if (!v || cJSON_IsNull(v)) return def;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* parse_fp8: block-scaled FP8 (DeepSeek-V3's release format, transformers'
 * FineGrainedFP8Config): e4m3 weights, each with a float weight_scale_inv per
 * weight_block_size block, which the model binder dequantizes at load. What it
 * cannot honour (other formats, static activation scales, per-tensor or
 * power-of-two scales, FP4 experts) is refused by name. */
static enum moe_status parse_fp8(const struct cfg_ctx *c, const cJSON *q, struct moe_config *cfg) {
    static const struct {
        const char *key, *want, *why;
    } k_only[] = {
        {"fmt", "e4m3", "only e4m3 (float8_e4m3fn) weights are read"},
        {"activation_scheme", "dynamic", "static activation scales are not applied; only \"dynamic\" is read"},
        {"scale_fmt", "float", "only float weight_scale_inv tensors are read (not ue8m0 exponents)"},
        {"expert_dtype", "fp8", "FP4-packed experts are not read"},
    };
    for (size_t i = 0; i < sizeof k_only / sizeof k_only[0]; i++) {
        const char *v = q_string(q, k_only[i].key, k_only[i].want);
        if (!v || strcmp(v, k_only[i].want) != 0) {
            MOE_LOGE("%s: quantization_config (fp8): %s \"%s\" is not supported (%s)", c->label, k_only[i].key,
                     v ? v : "(not a string)", k_only[i].why);
            return MOE_ERR_UNSUPPORTED;
        }
    }
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    int ok = cJSON_IsArray(b) && cJSON_GetArraySize(b) == 2;
    for (int i = 0; ok && i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(b, i);
        ok = cJSON_IsNumber(x) && x->valuedouble == floor(x->valuedouble) && x->valuedouble >= 1 &&
             x->valuedouble <= 1 << 20;
        if (ok) cfg->fp8_block[i] = (int)x->valuedouble;
    }
    if (!ok) {
        cfg->fp8_block[0] = cfg->fp8_block[1] = 0;
        MOE_LOGE("%s: quantization_config (fp8): weight_block_size must be two integers in [1, %d] (rows, "
                 "columns of one scale block; per-tensor FP8 scales are not supported)",
                 c->label, 1 << 20);
        return b && !cJSON_IsNull(b) ? MOE_ERR_INVALID : MOE_ERR_UNSUPPORTED; /* absent or null: per-tensor */
    }
    return MOE_OK;
}

/* parse_quantization: a pre-quantized checkpoint's quantization_config. gpt-oss's
 * MXFP4 experts are read as they are, block-scaled FP8 weights are dequantized at
 * load (parse_fp8); other methods (GPTQ, AWQ, ...) are refused by name rather
 * than misread. */
static enum moe_status parse_quantization(const struct cfg_ctx *c, struct moe_config *cfg) {
    const cJSON *q = cfg_field(c, "quantization_config");
    if (!q) return MOE_OK;
    const cJSON *m = cJSON_IsObject(q) ? cJSON_GetObjectItemCaseSensitive(q, "quant_method") : NULL;
    const char *method = cJSON_IsString(m) ? m->valuestring : "?";
    if (c->row->native_quant && !strcmp(method, c->row->native_quant)) return MOE_OK;
    if (!strcmp(method, "fp8")) return parse_fp8(c, q, cfg);
    MOE_LOGE("%s: quantization_config with quant_method \"%s\" is not supported (only gpt-oss's mxfp4 experts "
             "and block-scaled fp8 weights are read)", c->label, method);
    return MOE_ERR_UNSUPPORTED;
}

enum moe_status moe_config_parse(const char *json, size_t len, const char *label,
                                 struct moe_config *out) {
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        MOE_LOGE("%s: not a JSON object", label);
        cJSON_Delete(root);
        return MOE_ERR_FORMAT;
    }
    struct cfg_ctx ctx = {root, label, NULL}, *c = &ctx;
    enum moe_status st = MOE_OK;
    struct moe_config *cfg = out;

    const cJSON *archs = cfg_field(c, "architectures");
    const char *name = NULL;
    if (cJSON_IsArray(archs) && cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
        name = cJSON_GetArrayItem(archs, 0)->valuestring;
    if (!name) {
        MOE_LOGE("%s: missing required field \"architectures\"", label);
        st = MOE_ERR_NOT_FOUND;
        goto fail;
    }
    const struct arch_row *row = c->row = arch_by_hf(name);
    if (!row) {
        char list[512];
        arch_list(0, list, sizeof list);
        MOE_LOGE("%s: unknown architecture \"%s\" (supported: %s)", label, name, list);
        st = MOE_ERR_UNSUPPORTED;
        goto fail;
    }
    cfg->arch = row->arch;
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", name);
    const int BIG = 1 << 24;
    if ((st = cfg_int(c, "vocab_size", 1, 0, 1, 1 << 30, &cfg->n_vocab))) goto fail;
    if ((st = cfg_int(c, "hidden_size", 1, 0, 1, BIG, &cfg->n_embd))) goto fail;
    if ((st = cfg_int(c, "num_hidden_layers", 1, 0, 1, 100000, &cfg->n_layer))) goto fail;
    if ((st = cfg_int(c, "num_attention_heads", 1, 0, 1, 100000, &cfg->n_head))) goto fail;
    if ((st = cfg_int(c, "num_key_value_heads", 0, cfg->n_head, 1, 100000, &cfg->n_head_kv))) goto fail;
    if (cfg->n_head % cfg->n_head_kv) {
        MOE_LOGE("%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)",
                 label, cfg->n_head, cfg->n_head_kv);
        st = MOE_ERR_INVALID;
        goto fail;
    }
    if (row->parse_attention) {
        if ((st = row->parse_attention(c, cfg))) goto fail;
    } else {
        if ((st = cfg_int(c, "head_dim", 0, cfg->n_embd / cfg->n_head, 1, BIG, &cfg->head_dim))) goto fail;
        if (cfg->head_dim < 1) { /* the default, hidden_size / num_attention_heads, rounded down to 0 */
            MOE_LOGE("%s: hidden_size (%d) is smaller than num_attention_heads (%d) and no head_dim is given", label,
                     cfg->n_embd, cfg->n_head);
            st = MOE_ERR_INVALID;
            goto fail;
        }
        if (cfg->head_dim % 2) {
            MOE_LOGE("%s: head_dim %d must be even for RoPE", label, cfg->head_dim);
            st = MOE_ERR_INVALID;
            goto fail;
        }
    }
    if ((st = cfg_int(c, "max_position_embeddings", 0, 4096, 1, 1 << 30, &cfg->max_pos))) goto fail;

    /* experts: v5 spells num_local_experts for several architectures */
    const char *ne_name = cfg_field(c, "num_local_experts") ? "num_local_experts"
                          : cfg_field(c, "num_experts")     ? "num_experts"
                          : row->n_expert_key               ? row->n_expert_key
                                                            : "num_experts";
    if ((st = cfg_int(c, ne_name, 1, 0, 1, 1 << 16, &cfg->n_expert))) goto fail;
    if ((st = cfg_int(c, "num_experts_per_tok", 1, 0, 1, 1 << 16, &cfg->n_expert_used))) goto fail;
    if (cfg->n_expert_used > cfg->n_expert) {
        MOE_LOGE("%s: num_experts_per_tok (%d) exceeds the number of experts (%d)", label,
                 cfg->n_expert_used, cfg->n_expert);
        st = MOE_ERR_INVALID;
        goto fail;
    }
    int inter = 0;
    if ((st = cfg_int(c, "intermediate_size", 0, 0, 0, BIG, &inter))) goto fail;
    if (row->moe_intermediate) {
        if ((st = cfg_int(c, "moe_intermediate_size", 1, 0, 1, BIG, &cfg->n_ff_expert))) goto fail;
        cfg->n_ff_dense = inter;
    } else {
        if ((st = cfg_int(c, "intermediate_size", 1, 0, 1, BIG, &cfg->n_ff_expert))) goto fail;
    }
    if (row->parse_ffn && (st = row->parse_ffn(c, cfg))) goto fail;

    /* routing */
    cfg->router = row->router;
    cfg->norm_topk_prob = row->norm_topk_prob;
    cfg->n_group = cfg->topk_group = 1;
    cfg->routed_scale = 1.0f;
    if (row->norm_topk_key && (st = cfg_bool(c, "norm_topk_prob", row->norm_topk_prob, &cfg->norm_topk_prob)))
        goto fail;
    if (row->parse_routing && (st = row->parse_routing(c, cfg))) goto fail;

    /* norms and attention */
    cfg->norm = row->norm;
    if ((st = cfg_float(c, root, "rms_norm_eps", row->norm_eps, &cfg->norm_eps))) goto fail;
    if (!(cfg->norm_eps > 0)) { /* <= 0 divides by zero (or takes a root of a negative) on a flat row */
        MOE_LOGE("%s: rms_norm_eps must be a positive number (got %g)", label, (double)cfg->norm_eps);
        st = MOE_ERR_INVALID;
        goto fail;
    }
    if (row->attn_bias_key) { /* Mixtral has no switch: no biases */
        int ab = 0;
        if ((st = cfg_bool(c, row->attn_bias_key, row->attn_bias_default, &ab))) goto fail;
        cfg->attn_qkv_bias = ab;
        if (row->attn_bias_o) cfg->attn_o_bias = ab;
    }
    cfg->qk_norm = row->qk_norm;
    if ((st = cfg_bool(c, "tie_word_embeddings", 0, &cfg->tie_embeddings))) goto fail;
    if (row->parse_fields && (st = row->parse_fields(c, cfg))) goto fail;

    if ((st = parse_quantization(c, cfg))) goto fail;
    if ((st = parse_rope(c, cfg, row->rope_theta))) goto fail;
    cfg->attn_scale = 1.0f / sqrtf((float)cfg->head_dim);
    if (row->finish_rope && (st = row->finish_rope(c, cfg))) goto fail;
    if ((st = parse_layer_kinds(c, cfg))) goto fail;

    cfg->bos_id = -1;
    if ((st = cfg_int(c, "bos_token_id", 0, -1, 0, cfg->n_vocab - 1, &cfg->bos_id))) goto fail;
    if ((st = check_token_ids(c, "eos_token_id", cfg->n_vocab))) goto fail;
    parse_token_ids(cfg_field(c, "eos_token_id"), cfg->eos_ids, &cfg->n_eos, MOE_MAX_EOS);
    cJSON_Delete(root);
    return MOE_OK;
fail:
    cJSON_Delete(root);
    moe_config_clear(out);
    return st;
}

enum moe_status moe_config_load(const char *dir, struct moe_config *out) {
    char *path = moe_path_join(dir, "config.json");
    char *text = NULL;
    size_t len = 0;
    enum moe_status st = path ? moe_read_file(path, 16u << 20, &text, &len) : MOE_ERR_NOMEM;
    if (st == MOE_OK) st = moe_config_parse(text, len, path, out);
    free(text);
    free(path);
    if (st) return st;
    /* generation_config.json may list more EOS ids (e.g. chat end tokens) */
    char *gpath = moe_path_join(dir, "generation_config.json");
    char *gtext = NULL;
    if (gpath && access(gpath, F_OK) == 0) { /* present: it must be a readable regular file */
        if ((st = moe_read_file(gpath, 1u << 20, &gtext, &len)) == MOE_OK)
            moe_config_add_generation(out, gtext, len);
        else
            moe_config_clear(out);
    }
    free(gtext);
    free(gpath);
    return st;
}

void moe_config_add_generation(struct moe_config *c, const char *json, size_t len) {
    cJSON *g = cJSON_ParseWithLength(json, len);
    const cJSON *e = g ? cJSON_GetObjectItemCaseSensitive(g, "eos_token_id") : NULL;
    if (e) {
        int ids[MOE_MAX_EOS], n = 0;
        parse_token_ids(e, ids, &n, MOE_MAX_EOS);
        for (int i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= c->n_vocab) { /* checked like config.json's, but only advisory here */
                MOE_LOGW("generation config: eos_token_id %d is outside the vocabulary [0, %d); ignored", ids[i],
                         c->n_vocab);
                continue;
            }
            int dup = 0;
            for (int j = 0; j < c->n_eos; j++) dup |= c->eos_ids[j] == ids[i];
            if (!dup && c->n_eos < MOE_MAX_EOS) c->eos_ids[c->n_eos++] = ids[i];
        }
    }
    cJSON_Delete(g);
}

void moe_config_clear(struct moe_config *c) {
    free(c->rope.short_factor);
    free(c->rope.long_factor);
    free(c->layer_moe);
    free(c->layer_sliding);
    c->rope.short_factor = c->rope.long_factor = NULL;
    c->layer_moe = c->layer_sliding = NULL;
}

size_t moe_config_kv_cache_bytes(const struct moe_config *c, int n_ctx) {
    const int mla = c->attn == MOE_ATTN_MLA;
    const size_t kv_dim = mla ? 0 : (size_t)c->n_head_kv * (size_t)c->head_dim;
    const size_t key_row = mla ? (size_t)c->kv_lora_rank + (size_t)c->qk_rope_dim : kv_dim;
    return (size_t)c->n_layer * (size_t)(n_ctx > 0 ? n_ctx : 0) * (key_row + kv_dim) * sizeof(float);
}

/* ---- RoPE: inverse frequencies (moe-model.h), shared by every backend ---- */

/* yarn_dim: the dimension (of n_rot) whose wavelength turns n_rot times in
 * the original context (YaRN's find_correction_dim). */
static double yarn_dim(double rotations, const struct moe_rope *r) {
    return (r->n_rot * log((double)r->original_max_pos / (rotations * 2 * 3.14159265358979323846))) /
           (2 * log((double)r->theta));
}

/* yarn_inv_freq: YaRN's blend of extrapolated (theta^-2i/d) and interpolated
 * (the same / factor) frequencies along a linear ramp between the correction
 * dimensions of beta_fast and beta_slow, as transformers' _compute_yarn_parameters. */
static void yarn_inv_freq(const struct moe_rope *r, float *inv_freq) {
    double lo = yarn_dim(r->beta_fast, r), hi = yarn_dim(r->beta_slow, r);
    if (r->truncate) lo = floor(lo), hi = ceil(hi);
    if (lo < 0) lo = 0;
    if (hi > r->n_rot - 1) hi = r->n_rot - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < r->n_rot / 2; i++) {
        float pos = (float)pow((double)r->theta, (double)((float)(2 * i) / (float)r->n_rot));
        float extra = 1.0f / pos, inter = 1.0f / (r->factor * pos);
        float ramp = ((float)i - (float)lo) / (float)(hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float ef = 1.0f - ramp; /* the share of extrapolation */
        inv_freq[i] = inter * (1.0f - ef) + extra * ef;
    }
}

void moe_rope_inv_freq(const struct moe_config *c, float *inv_freq) {
    const struct moe_rope *r = &c->rope;
    int half = r->n_rot / 2;
    for (int i = 0; i < half; i++) {
        float ex = (float)(2 * i) / (float)r->n_rot;
        float base_pow = (float)pow((double)r->theta, (double)ex);
        float f = 1.0f / base_pow;
        switch (r->kind) {
        case MOE_ROPE_DEFAULT: break;
        case MOE_ROPE_YARN: break; /* yarn_inv_freq below */
        case MOE_ROPE_LINEAR: f = f / r->factor; break;
        case MOE_ROPE_LONGROPE: f = 1.0f / (r->short_factor[i] * base_pow); break;
        case MOE_ROPE_LLAMA3: {
            float low_wl = (float)r->original_max_pos / r->low_freq_factor;
            float high_wl = (float)r->original_max_pos / r->high_freq_factor;
            float wl = 2.0f * 3.14159265358979323846f / f;
            float scaled = wl > low_wl ? f / r->factor : f;
            if (!(wl < high_wl) && !(wl > low_wl)) {
                float smooth = ((float)r->original_max_pos / wl - r->low_freq_factor) /
                               (r->high_freq_factor - r->low_freq_factor);
                scaled = (1.0f - smooth) * scaled / r->factor + smooth * scaled;
            }
            f = scaled;
            break;
        }
        }
        inv_freq[i] = f;
    }
    if (r->kind == MOE_ROPE_YARN) yarn_inv_freq(r, inv_freq);
}

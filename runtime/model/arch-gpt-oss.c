/*
 * arch-gpt-oss.c - gpt-oss (GptOssForCausalLM, GGUF gpt-oss): experts with a
 * clamped SwiGLU and gate/up/down biases, a router with a bias, a learned
 * sink logit per head in every softmax, even layers sliding by default,
 * YaRN without rounding the correction range, and the released checkpoints'
 * MXFP4 experts (quantization_config quant_method mxfp4, row data), read as
 * they are: merged per layer, repacked here into ggml's mxfp4 blocks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch-impl.h"

/* ---- config.json ---- */

/* moe_gpt_oss_parse_fields: the clamped SwiGLU of the experts, their
 * biases, the router's bias and the attention sinks. */
enum moe_status moe_gpt_oss_parse_fields(const struct cfg_ctx *c, struct moe_config *cfg) {
    enum moe_status st;
    cfg->expert_act = MOE_ACT_SWIGLU_OAI;
    cfg->expert_bias = cfg->router_bias = cfg->attn_sinks = 1;
    if ((st = cfg_float(c, c->root, "swiglu_alpha", 1.702, &cfg->swiglu_alpha)) ||
        (st = cfg_float(c, c->root, "swiglu_limit", 7.0, &cfg->swiglu_limit)))
        return st;
    if (!(cfg->swiglu_limit > 0)) {
        MOE_LOGE("%s: swiglu_limit must be positive", c->label);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* moe_gpt_oss_sliding_layers: GptOssConfig's default: even layers slide. */
enum moe_status moe_gpt_oss_sliding_layers(const struct cfg_ctx *c, struct moe_config *cfg) {
    (void)c;
    for (int l = 0; l < cfg->n_layer; l++) cfg->layer_sliding[l] = l % 2 == 0;
    return MOE_OK;
}

/* ---- GGUF ---- */

/* put_gpt_oss: the clamped SwiGLU's limit (swiglu_clamp_exp, one value or
 * one per layer, all equal; llama.cpp's fixed 7.0 otherwise) and the sliding
 * layers (sliding_window_pattern, else llama.cpp's even layers). */
static void put_gpt_oss(struct cfgb *b) {
    const struct moe_gguf_model *v = b->v;
    cJSON *r = b->root;
    double limit = 7.0;
    const struct moe_gguf_kv *kv = gm_akv(v, "swiglu_clamp_exp");
    if (kv) {
        double x = 0;
        int ok = kv->n > 0 && moe_gguf_kv_float(kv, 0, &x);
        for (uint64_t i = 1; ok && i < kv->n; i++) {
            double y;
            ok = moe_gguf_kv_float(kv, i, &y) && y == x;
        }
        if (!ok || !(x > 0)) {
            MOE_LOGE("%s: %s must be one positive limit (per-layer limits must all be equal)", v->path, kv->key);
            gm_fail(b, MOE_ERR_UNSUPPORTED);
            return;
        }
        limit = x;
    }
    cJSON_AddNumberToObject(r, "swiglu_limit", limit);
    cJSON_AddNumberToObject(r, "swiglu_alpha", 1.702);
    cJSON_AddBoolToObject(r, "attention_bias", 1);
    gm_put_int_key(b, "sliding_window", "attention.sliding_window", 0, 0, 1 << 30, NULL);
    const struct moe_gguf_kv *pat = gm_akv(v, "attention.sliding_window_pattern");
    cJSON *lt = cJSON_AddArrayToObject(r, "layer_types");
    for (int l = 0; l < v->n_layer; l++) {
        int64_t s = l % 2 == 0;
        if (pat && (pat->type != MOE_GGUF_ARRAY || pat->n != (uint64_t)v->n_layer || !moe_gguf_kv_int(pat, (uint64_t)l, &s))) {
            MOE_LOGE("%s: %s must be one bool per layer", v->path, pat->key);
            gm_fail(b, MOE_ERR_FORMAT);
            return;
        }
        cJSON_AddItemToArray(lt, cJSON_CreateString(s ? "sliding_attention" : "full_attention"));
    }
}

/* moe_gpt_oss_gguf_config: the experts' size, then put_gpt_oss. */
void moe_gpt_oss_gguf_config(struct cfgb *b) {
    gm_put_ff(b, "intermediate_size", "expert_feed_forward_length", "blk.%d.ffn_gate_exps.weight");
    put_gpt_oss(b);
}

/* moe_gpt_oss_gguf_yarn: transformers does not round gpt-oss's YaRN
 * correction range (llama.cpp's ggml does). */
void moe_gpt_oss_gguf_yarn(struct cfgb *b, cJSON *rp, int have_attn_factor) {
    (void)b;
    (void)have_attn_factor;
    cJSON_AddBoolToObject(rp, "truncate", 0);
}

/* ---- tensors ---- */

/* gpt_oss_bias: expert e's biases as gate | up | down floats (gate_up_proj_bias
 * [E, 2F] alternates gate and up; down_proj_bias [E, H]); row: 2F floats of scratch. */
static enum moe_status gpt_oss_bias(const struct src_tensor *gub, const struct src_tensor *dnb, int64_t e, int64_t F,
                                    int64_t H, float *row, float *bias) {
    const size_t gbs = moe_qtype_row_bytes(gub->type, 2 * F), dbs = moe_qtype_row_bytes(dnb->type, H);
    enum moe_status st = moe_dequantize_row(gub->type, (const char *)gub->data + (size_t)e * gbs, row, 2 * F);
    if (!st) st = moe_dequantize_row(dnb->type, (const char *)dnb->data + (size_t)e * dbs, bias + 2 * F, H);
    for (int64_t f = 0; !st && f < F; f++) bias[f] = row[2 * f], bias[F + f] = row[2 * f + 1];
    return st;
}

/* mxfp4_repack_row: one weight row of n_in values from OpenAI's MXFP4 layout
 * (n_in/32 blocks of 16 bytes, byte j = element 2j low nibble, 2j+1 high;
 * a separate e8m0 scale per block) into ggml's (moe_block_mxfp4: the scale,
 * then byte j = element j low, j+16 high). The codes and scales are kept:
 * the same values bit for bit, no requantization. */
static void mxfp4_repack_row(const uint8_t *blocks, const uint8_t *scales, int64_t n_in, uint8_t *out) {
    for (int64_t g = 0; g < n_in / 32; g++, blocks += 16, out += sizeof(moe_block_mxfp4)) {
        uint8_t q[32];
        for (int j = 0; j < 16; j++) q[2 * j] = blocks[j] & 15, q[2 * j + 1] = blocks[j] >> 4;
        out[0] = scales[g];
        for (int j = 0; j < 16; j++) out[1 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
    }
}

/* split_gpt_oss: expert e's gate, up and down of gpt-oss's merged layout
 * (gate_up [E, H, 2F] with gate and up in alternate columns, down [E, F, H],
 * both x @ W) as row-major [F x H], [F x H], [H x F] copies in the stored
 * element type; biases (gate_up [E, 2F] alternating, down [E, H]) as one
 * float block gate | up | down. */
static enum moe_status split_gpt_oss(const struct bind *b, const struct src_tensor *gu, const struct src_tensor *dn,
                                     const struct src_tensor *gub, const struct src_tensor *dnb, int64_t e, int64_t F,
                                     int64_t H, struct moe_ffn *out) {
    struct moe_model_impl *mi = b->m->impl;
    const size_t es = moe_qtype_row_bytes(gu->type, 1), ed = moe_qtype_row_bytes(dn->type, 1);
    char *g = malloc((size_t)(F * H) * es), *u = malloc((size_t)(F * H) * es), *d = malloc((size_t)(H * F) * ed);
    float *bias = malloc(sizeof(float) * (size_t)(2 * F + H)), *row = malloc(sizeof(float) * (size_t)(2 * F + H));
    enum moe_status st = g && u && d && bias && row ? MOE_OK : MOE_ERR_NOMEM;
    const char *src = (const char *)gu->data + (size_t)(e * H * 2 * F) * es;
    for (int64_t i = 0; !st && i < H; i++) /* column 2f of row i is gate[f][i], 2f+1 up[f][i] */
        for (int64_t f = 0; f < F; f++) {
            memcpy(g + (size_t)(f * H + i) * es, src + (size_t)(i * 2 * F + 2 * f) * es, es);
            memcpy(u + (size_t)(f * H + i) * es, src + (size_t)(i * 2 * F + 2 * f + 1) * es, es);
        }
    src = (const char *)dn->data + (size_t)(e * F * H) * ed;
    for (int64_t f = 0; !st && f < F; f++)
        for (int64_t i = 0; i < H; i++) memcpy(d + (size_t)(i * F + f) * ed, src + (size_t)(f * H + i) * ed, ed);
    if (!st) st = gpt_oss_bias(gub, dnb, e, F, H, row, bias);
    free(row);
    if (st) {
        free(g), free(u), free(d), free(bias);
        return st;
    }
    void *bufs[4] = {g, u, d, bias};
    for (int k = 0; k < 4; k++)
        if ((st = bind_own(mi, bufs[k]))) { /* bind_own() freed bufs[k]; the rest are not kept either */
            for (int r = k + 1; r < 4; r++) free(bufs[r]);
            return st;
        }
    out->gate = (struct moe_weight){g, gu->type, F, H};
    out->up = (struct moe_weight){u, gu->type, F, H};
    out->down = (struct moe_weight){d, dn->type, H, F};
    out->bias = bias;
    return MOE_OK;
}

/* bind_gpt_oss_mxfp4: the experts of one layer of a released gpt-oss
 * checkpoint (MXFP4 `_blocks` and `_scales`, rows = output features, gate and
 * up rows alternating), repacked into mxfp4 weights the model owns. */
static enum moe_status bind_gpt_oss_mxfp4(const struct bind *b, struct moe_ffn *experts, const struct moe_config *c,
                                          const char *prefix) {
    const int64_t E = c->n_expert, F = c->n_ff_expert, H = c->n_embd;
    if (H % 32 || F % 32) {
        MOE_LOGE("%s: MXFP4 experts need hidden_size (%lld) and intermediate_size (%lld) divisible by 32", b->path,
                 (long long)H, (long long)F);
        return MOE_ERR_SHAPE;
    }
    char name[256];
    struct src_tensor gb, gs, db, ds, gub, dnb;
    enum moe_status st;
    const int64_t d_gb[4] = {E, 2 * F, H / 32, 16}, d_gs[3] = {E, 2 * F, H / 32}, d_db[4] = {E, H, F / 32, 16},
                  d_ds[3] = {E, H, F / 32}, b1[2] = {E, 2 * F}, b2[2] = {E, H};
    snprintf(name, sizeof name, "%sexperts.gate_up_proj_blocks", prefix);
    if ((st = bind_find_tensor(b, name, 4, d_gb, 1, &gb))) return st;
    snprintf(name, sizeof name, "%sexperts.gate_up_proj_scales", prefix);
    if ((st = bind_find_tensor(b, name, 3, d_gs, 1, &gs))) return st;
    snprintf(name, sizeof name, "%sexperts.down_proj_blocks", prefix);
    if ((st = bind_find_tensor(b, name, 4, d_db, 1, &db))) return st;
    snprintf(name, sizeof name, "%sexperts.down_proj_scales", prefix);
    if ((st = bind_find_tensor(b, name, 3, d_ds, 1, &ds))) return st;
    snprintf(name, sizeof name, "%sexperts.gate_up_proj_bias", prefix);
    if ((st = bind_find_shape(b, name, 2, b1, &gub))) return st;
    snprintf(name, sizeof name, "%sexperts.down_proj_bias", prefix);
    if ((st = bind_find_shape(b, name, 2, b2, &dnb))) return st;
    const size_t rh = moe_qtype_row_bytes(MOE_QTYPE_MXFP4, H), rf = moe_qtype_row_bytes(MOE_QTYPE_MXFP4, F);
    float *row = malloc(sizeof(float) * (size_t)(2 * F));
    if (!row) return MOE_ERR_NOMEM;
    for (int64_t e = 0; e < E && !st; e++) {
        uint8_t *g = malloc(rh * (size_t)F), *u = malloc(rh * (size_t)F), *d = malloc(rf * (size_t)H);
        float *bias = malloc(sizeof(float) * (size_t)(2 * F + H));
        st = g && u && d && bias ? MOE_OK : MOE_ERR_NOMEM;
        const uint8_t *blk = (const uint8_t *)gb.data + (size_t)(e * 2 * F) * (size_t)(H / 2),
                      *sc = (const uint8_t *)gs.data + (size_t)(e * 2 * F) * (size_t)(H / 32);
        for (int64_t f = 0; !st && f < F; f++) {
            mxfp4_repack_row(blk + (size_t)(2 * f) * (size_t)(H / 2), sc + (size_t)(2 * f) * (size_t)(H / 32), H,
                             g + (size_t)f * rh);
            mxfp4_repack_row(blk + (size_t)(2 * f + 1) * (size_t)(H / 2), sc + (size_t)(2 * f + 1) * (size_t)(H / 32),
                             H, u + (size_t)f * rh);
        }
        blk = (const uint8_t *)db.data + (size_t)(e * H) * (size_t)(F / 2);
        sc = (const uint8_t *)ds.data + (size_t)(e * H) * (size_t)(F / 32);
        for (int64_t i = 0; !st && i < H; i++)
            mxfp4_repack_row(blk + (size_t)i * (size_t)(F / 2), sc + (size_t)i * (size_t)(F / 32), F, d + (size_t)i * rf);
        if (!st) st = gpt_oss_bias(&gub, &dnb, e, F, H, row, bias);
        void *bufs[4] = {g, u, d, bias};
        if (st) {
            for (int k = 0; k < 4; k++) free(bufs[k]);
            break;
        }
        for (int k = 0; k < 4 && !st; k++)
            if ((st = bind_own(b->m->impl, bufs[k])))
                for (int r = k + 1; r < 4; r++) free(bufs[r]);
        if (st) break;
        experts[e].gate = (struct moe_weight){g, MOE_QTYPE_MXFP4, F, H};
        experts[e].up = (struct moe_weight){u, MOE_QTYPE_MXFP4, F, H};
        experts[e].down = (struct moe_weight){d, MOE_QTYPE_MXFP4, H, F};
        experts[e].bias = bias;
    }
    free(row);
    return st;
}

/* moe_gpt_oss_bind_experts: every expert of one gpt-oss MoE layer, split
 * from the merged tensors (float, or MXFP4 blocks) into copies the model owns. */
enum moe_status moe_gpt_oss_bind_experts(const struct bind *b, struct moe_ffn *experts, const struct moe_config *c,
                                         const char *prefix) {
    char name[256];
    struct src_tensor gu, dn, gub, dnb;
    enum moe_status st;
    const int64_t E = c->n_expert, F = c->n_ff_expert, H = c->n_embd;
    const int64_t d1[3] = {E, H, 2 * F}, d2[3] = {E, F, H}, b1[2] = {E, 2 * F}, b2[2] = {E, H};
    snprintf(name, sizeof name, "%sexperts.gate_up_proj_blocks", prefix);
    if (bind_has_tensor(b, name)) return bind_gpt_oss_mxfp4(b, experts, c, prefix);
    snprintf(name, sizeof name, "%sexperts.gate_up_proj", prefix);
    if ((st = bind_find_shape(b, name, 3, d1, &gu))) return st;
    snprintf(name, sizeof name, "%sexperts.down_proj", prefix);
    if ((st = bind_find_shape(b, name, 3, d2, &dn))) return st;
    snprintf(name, sizeof name, "%sexperts.gate_up_proj_bias", prefix);
    if ((st = bind_find_shape(b, name, 2, b1, &gub))) return st;
    snprintf(name, sizeof name, "%sexperts.down_proj_bias", prefix);
    if ((st = bind_find_shape(b, name, 2, b2, &dnb))) return st;
    if (moe_qtype_block_size(gu.type) != 1 || moe_qtype_block_size(dn.type) != 1) {
        MOE_LOGE("%s: %sexperts: merged expert tensors must be f32, f16 or bf16", b->path, prefix);
        return MOE_ERR_UNSUPPORTED;
    }
    for (int64_t e = 0; e < E; e++)
        if ((st = split_gpt_oss(b, &gu, &dn, &gub, &dnb, e, F, H, &experts[e]))) return st;
    return MOE_OK;
}

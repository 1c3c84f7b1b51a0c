/*
 * arch-phimoe.c - Phi-MoE (PhimoeForCausalLM, GGUF phimoe): LayerNorm with
 * bias, attention biases that cover o_proj too, an optional lm_head bias,
 * sparsemixer routing (top-2, inference form) and longrope with separate
 * short / long mscale factors.
 */
#include <math.h>
#include <string.h>

#include "arch-impl.h"

/* moe_phimoe_parse_routing: sparsemixer's jitter and its top-2. */
enum moe_status moe_phimoe_parse_routing(const struct cfg_ctx *c, struct moe_config *cfg) {
    enum moe_status st;
    if ((st = cfg_float(c, c->root, "router_jitter_noise", 0.01, &cfg->router_jitter))) return st;
    if (cfg->router_jitter < 0) {
        MOE_LOGE("%s: router_jitter_noise must be >= 0", c->label);
        return MOE_ERR_INVALID;
    }
    if (cfg->n_expert_used != 2) {
        MOE_LOGE("%s: Phi-MoE sparsemixer routing supports num_experts_per_tok = 2 only (got %d)", c->label,
                 cfg->n_expert_used);
        return MOE_ERR_UNSUPPORTED;
    }
    return MOE_OK;
}

/* moe_phimoe_parse_fields: lm_head_bias. */
enum moe_status moe_phimoe_parse_fields(const struct cfg_ctx *c, struct moe_config *cfg) {
    return cfg_bool(c, "lm_head_bias", 0, &cfg->lm_head_bias);
}

/* moe_phimoe_parse_longrope: the short / long mscale factors that scale
 * cos and sin (p: the rope parameters). */
enum moe_status moe_phimoe_parse_longrope(const struct cfg_ctx *c, struct moe_config *cfg, const cJSON *p) {
    struct moe_rope *r = &cfg->rope;
    const cJSON *sm = cJSON_GetObjectItemCaseSensitive(p, "short_mscale");
    const cJSON *lm = cJSON_GetObjectItemCaseSensitive(p, "long_mscale");
    if (!cJSON_IsNumber(sm) || !cJSON_IsNumber(lm)) {
        MOE_LOGE("%s: Phi-MoE longrope needs numeric short_mscale and long_mscale", c->label);
        return MOE_ERR_NOT_FOUND;
    }
    r->has_mscale = 1;
    r->short_mscale = (float)sm->valuedouble;
    r->long_mscale = (float)lm->valuedouble;
    if (!(isfinite(r->short_mscale) && r->short_mscale > 0 && isfinite(r->long_mscale) && r->long_mscale > 0)) {
        MOE_LOGE("%s: short_mscale and long_mscale must be positive numbers", c->label);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* moe_phimoe_gguf_config: the experts' size, attention and lm_head biases
 * from the tensors, the sliding window. */
void moe_phimoe_gguf_config(struct cfgb *b) {
    const struct moe_gguf_model *v = b->v;
    cJSON *r = b->root;
    gm_put_ff(b, "intermediate_size", "feed_forward_length", "blk.%d.ffn_gate_exps.weight");
    cJSON_AddBoolToObject(r, "attention_bias", gm_has(v, "blk.0.attn_q.bias"));
    cJSON_AddBoolToObject(r, "lm_head_bias", gm_has(v, "output.bias"));
    gm_put_int_key(b, "sliding_window", "attention.sliding_window", 0, 0, 1 << 30, NULL);
}

/* read_factors: a longrope factor tensor (f32, n values) as a JSON array. */
static cJSON *read_factors(struct cfgb *b, const char *name, int64_t n) {
    const struct moe_gguf_tensor *t = moe_gguf_find_tensor(b->v->g, name);
    if (!t || t->type != MOE_QTYPE_F32 || t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1) {
        MOE_LOGE("%s: %s must be an f32 vector of %lld rope factors (rotary dims / 2)", b->v->path, name, (long long)n);
        gm_fail(b, MOE_ERR_FORMAT);
        return NULL;
    }
    cJSON *a = cJSON_CreateArray();
    for (int64_t i = 0; a && i < n; i++) {
        float f;
        memcpy(&f, (const char *)t->data + 4 * i, 4);
        cJSON_AddItemToArray(a, cJSON_CreateNumber(f));
    }
    return a;
}

/* moe_phimoe_gguf_rope: Phi-MoE's longrope factors come from the
 * rope_factors_{short,long} tensors and its one attention factor (GGUF keeps
 * no separate short/long mscale) serves both. 0 (nothing written) for a file
 * without them. */
int moe_phimoe_gguf_rope(struct cfgb *b, cJSON *rp, int64_t n_rot, int64_t max_pos) {
    const struct moe_gguf_model *v = b->v;
    if (!gm_has(v, "rope_factors_long.weight")) return 0;
    int64_t omp = 0;
    if (!gm_put_int_key(b, "original_max_position_embeddings", "rope.scaling.original_context_length", 1, 1, 1 << 30,
                        &omp))
        return 1;
    double s = (double)max_pos / (double)omp, af = s > 1 ? sqrt(1 + log(s) / log((double)omp)) : 1.0;
    gm_get_float_key(b, "rope.scaling.attn_factor", &af);
    cJSON_AddStringToObject(rp, "rope_type", "longrope");
    cJSON *sf = read_factors(b, "rope_factors_short.weight", n_rot / 2);
    cJSON *lf = sf ? read_factors(b, "rope_factors_long.weight", n_rot / 2) : NULL;
    if (sf) cJSON_AddItemToObject(rp, "short_factor", sf);
    if (lf) cJSON_AddItemToObject(rp, "long_factor", lf);
    cJSON_AddNumberToObject(rp, "short_mscale", af);
    cJSON_AddNumberToObject(rp, "long_mscale", af);
    cJSON_AddNumberToObject(rp, "original_max_position_embeddings", (double)omp);
    return 1;
}

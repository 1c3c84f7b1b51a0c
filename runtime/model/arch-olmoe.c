/*
 * arch-olmoe.c - OLMoE (OlmoeForCausalLM, GGUF olmoe): RMSNorm over the
 * whole q and k projections (row data) and clip_qkv, which clamps q, k and
 * v to +-clip_qkv.
 */
#include "arch-impl.h"

/* moe_olmoe_parse_fields: clip_qkv (0: no clamping). */
enum moe_status moe_olmoe_parse_fields(const struct cfg_ctx *c, struct moe_config *cfg) {
    enum moe_status st;
    if ((st = cfg_float(c, c->root, "clip_qkv", 0.0, &cfg->clip_qkv))) return st;
    if (cfg->clip_qkv < 0) {
        MOE_LOGE("%s: clip_qkv must be positive", c->label);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* moe_olmoe_gguf_config: the experts' size (expert_feed_forward_length, else
 * feed_forward_length), attention biases from the tensors, clamp_kqv and
 * llama.cpp's norm_topk_prob (false). */
void moe_olmoe_gguf_config(struct cfgb *b) {
    const struct moe_gguf_model *v = b->v;
    cJSON *r = b->root;
    double clip;
    gm_put_ff(b, "intermediate_size", "expert_feed_forward_length", "blk.%d.ffn_gate_exps.weight");
    if (!cJSON_GetObjectItem(r, "intermediate_size"))
        gm_put_ff(b, "intermediate_size", "feed_forward_length", "blk.%d.ffn_gate_exps.weight");
    cJSON_AddBoolToObject(r, "attention_bias", gm_has(v, "blk.0.attn_q.bias"));
    if (gm_get_float_key(b, "attention.clamp_kqv", &clip)) cJSON_AddNumberToObject(r, "clip_qkv", clip);
    gm_put_topk_norm(b, 0);
}

/*
 * arch-qwen-moe.c - Qwen2-MoE (Qwen2MoeForCausalLM, GGUF qwen2moe) and
 * Qwen3-MoE (Qwen3MoeForCausalLM, GGUF qwen3moe).
 *
 * Both size experts by moe_intermediate_size, read norm_topk_prob, pick MoE
 * layers by decoder_sparse_step and mlp_only_layers and apply the sliding
 * window only with use_sliding_window (their rows in arch.c). Qwen2-MoE
 * adds a shared expert scaled by sigmoid(shared_expert_gate x), q/k/v biases
 * behind qkv_bias, and sliding layers derived from max_window_layers;
 * Qwen3-MoE adds per-head q/k RMSNorm (row data).
 */
#include "arch-impl.h"

/* moe_qwen2_moe_parse_ffn: the shared expert, gated. */
enum moe_status moe_qwen2_moe_parse_ffn(const struct cfg_ctx *c, struct moe_config *cfg) {
    const int BIG = 1 << 24;
    enum moe_status st;
    if ((st = cfg_int(c, "shared_expert_intermediate_size", 1, 0, 0, BIG, &cfg->n_ff_shared))) return st;
    cfg->shared_gated = 1;
    return MOE_OK;
}

/* moe_qwen2_moe_sliding_layers: transformers 5.x derives Qwen2-MoE's
 * layer_types this way when absent. */
enum moe_status moe_qwen2_moe_sliding_layers(const struct cfg_ctx *c, struct moe_config *cfg) {
    enum moe_status st;
    const int L = cfg->n_layer;
    int max_window_layers = L;
    if ((st = cfg_int(c, "max_window_layers", 0, L, 0, 1 << 20, &max_window_layers))) return st;
    for (int l = 0; l < L; l++) cfg->layer_sliding[l] = l % 2 == 0 && l < max_window_layers;
    return MOE_OK;
}

/* put_dense_layers: for Qwen-MoE, the layers without a router are dense MLPs. */
static void put_dense_layers(struct cfgb *b) {
    cJSON *a = cJSON_AddArrayToObject(b->root, "mlp_only_layers");
    for (int l = 0; l < b->v->n_layer; l++)
        if (!gm_has(b->v, "blk.%d.ffn_gate_inp.weight", l)) cJSON_AddItemToArray(a, cJSON_CreateNumber(l));
    cJSON_AddNumberToObject(b->root, "decoder_sparse_step", 1);
}

/* moe_qwen2_moe_gguf_config: expert, dense and shared sizes (0 when the
 * file has none), qkv_bias from the tensors, no sliding window, llama.cpp's
 * norm_topk_prob (false) and the dense layers. */
void moe_qwen2_moe_gguf_config(struct cfgb *b) {
    const struct moe_gguf_model *v = b->v;
    cJSON *r = b->root;
    gm_put_ff(b, "moe_intermediate_size", "expert_feed_forward_length", "blk.%d.ffn_gate_exps.weight");
    gm_put_ff(b, "intermediate_size", "feed_forward_length", "blk.%d.ffn_gate.weight");
    if (!cJSON_GetObjectItem(r, "intermediate_size")) cJSON_AddNumberToObject(r, "intermediate_size", 0);
    gm_put_ff(b, "shared_expert_intermediate_size", "expert_shared_feed_forward_length", "blk.%d.ffn_up_shexp.weight");
    if (!cJSON_GetObjectItem(r, "shared_expert_intermediate_size"))
        cJSON_AddNumberToObject(r, "shared_expert_intermediate_size", 0);
    cJSON_AddBoolToObject(r, "qkv_bias", gm_has(v, "blk.0.attn_q.bias"));
    cJSON_AddBoolToObject(r, "use_sliding_window", 0);
    gm_put_topk_norm(b, 0);
    put_dense_layers(b);
}

/* moe_qwen3_moe_gguf_config: as Qwen2-MoE without a shared expert; llama.cpp
 * renormalises by default. */
void moe_qwen3_moe_gguf_config(struct cfgb *b) {
    const struct moe_gguf_model *v = b->v;
    cJSON *r = b->root;
    gm_put_ff(b, "moe_intermediate_size", "expert_feed_forward_length", "blk.%d.ffn_gate_exps.weight");
    gm_put_ff(b, "intermediate_size", "feed_forward_length", "blk.%d.ffn_gate.weight");
    cJSON_AddBoolToObject(r, "attention_bias", gm_has(v, "blk.0.attn_q.bias"));
    cJSON_AddBoolToObject(r, "use_sliding_window", 0);
    gm_put_topk_norm(b, 1);
    put_dense_layers(b);
}

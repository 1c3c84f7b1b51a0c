/*
 * arch-deepseek.c - DeepSeek-V2 (DeepseekV2ForCausalLM) and DeepSeek-V3
 * (DeepseekV3ForCausalLM); one GGUF architecture, deepseek2, for both.
 *
 * Multi-head latent attention (the shapes here; the attention kind itself,
 * MOE_ATTN_MLA, is the backends' and the binder's), shared experts added
 * ungated, leading dense layers (first_k_dense_replace, row data), and the
 * routing: V2's softmax with greedy or group_limited_greedy top-k, V3's
 * sigmoid scores with a correction bias and groups, both scaled by
 * routed_scaling_factor. RoPE rotates adjacent pairs (V3: if
 * rope_interleave), and a scaled RoPE grows the softmax scale by
 * mscale_all_dim. Block-scaled FP8 checkpoints (V3's release format) are
 * not DeepSeek's alone and stay in config.c / model.c.
 */
#include <math.h>
#include <string.h>

#include "arch-impl.h"

/* ---- config.json ---- */

/* moe_deepseek_parse_mla: DeepSeek's multi-head latent attention shapes.
 * q_lora_rank may be null (queries straight from the hidden state) but must
 * be present: the class default would silently pick a shape. */
enum moe_status moe_deepseek_parse_mla(const struct cfg_ctx *c, struct moe_config *cfg) {
    enum moe_status st;
    const int BIG = 1 << 24;
    cfg->attn = MOE_ATTN_MLA;
    if (cfg->n_head_kv != cfg->n_head) {
        MOE_LOGE("%s: multi-head latent attention expands the latent to every head: num_key_value_heads (%d) must "
                 "equal num_attention_heads (%d)",
                 c->label, cfg->n_head_kv, cfg->n_head);
        return MOE_ERR_INVALID;
    }
    if (!cJSON_GetObjectItemCaseSensitive(c->root, "q_lora_rank")) {
        MOE_LOGE("%s: missing required field \"q_lora_rank\" (null for no query compression)", c->label);
        return MOE_ERR_NOT_FOUND;
    }
    if ((st = cfg_int(c, "q_lora_rank", 0, 0, 1, BIG, &cfg->q_lora_rank))) return st;
    if ((st = cfg_int(c, "kv_lora_rank", 1, 0, 1, BIG, &cfg->kv_lora_rank))) return st;
    if ((st = cfg_int(c, "qk_nope_head_dim", 1, 0, 1, BIG, &cfg->qk_nope_dim))) return st;
    if ((st = cfg_int(c, "qk_rope_head_dim", 1, 0, 2, BIG, &cfg->qk_rope_dim))) return st;
    if ((st = cfg_int(c, "v_head_dim", 1, 0, 1, BIG, &cfg->v_head_dim))) return st;
    if (cfg->qk_rope_dim % 2) {
        MOE_LOGE("%s: qk_rope_head_dim %d must be even for RoPE", c->label, cfg->qk_rope_dim);
        return MOE_ERR_INVALID;
    }
    cfg->head_dim = cfg->qk_nope_dim + cfg->qk_rope_dim;
    return MOE_OK;
}

/* moe_deepseek_parse_ffn: n_shared_experts experts of moe_intermediate_size
 * act as one ungated MLP; feed-forward biases are refused. */
enum moe_status moe_deepseek_parse_ffn(const struct cfg_ctx *c, struct moe_config *cfg) {
    enum moe_status st;
    const int BIG = 1 << 24;
    int n_shared = 0;
    if ((st = cfg_int(c, "n_shared_experts", 0, cfg->arch == MOE_ARCH_DEEPSEEK_V2 ? 2 : 1, 0, 1 << 16, &n_shared)))
        return st;
    if ((int64_t)n_shared * cfg->n_ff_expert > BIG) {
        MOE_LOGE("%s: n_shared_experts x moe_intermediate_size is too large", c->label);
        return MOE_ERR_INVALID;
    }
    cfg->n_ff_shared = n_shared * cfg->n_ff_expert;
    int mlp_bias = 0;
    if ((st = cfg_bool(c, "mlp_bias", 0, &mlp_bias))) return st;
    if (mlp_bias) {
        MOE_LOGE("%s: \"mlp_bias\": true is not supported (feed-forward layers without biases only)", c->label);
        return MOE_ERR_UNSUPPORTED;
    }
    return MOE_OK;
}

/* moe_deepseek_parse_routing: V2's topk_method (greedy or group_limited_greedy,
 * softmax scores, never renormalised: transformers ignores norm_topk_prob
 * there) and V3's sigmoid scores with groups; both scale the weights by
 * routed_scaling_factor. */
enum moe_status moe_deepseek_parse_routing(const struct cfg_ctx *c, struct moe_config *cfg) {
    enum moe_status st;
    const int v3 = cfg->arch == MOE_ARCH_DEEPSEEK_V3;
    if ((st = cfg_float(c, c->root, "routed_scaling_factor", v3 ? 2.5 : 1.0, &cfg->routed_scale))) return st;
    if (!(cfg->routed_scale > 0)) {
        MOE_LOGE("%s: routed_scaling_factor must be a positive number (got %g)", c->label, (double)cfg->routed_scale);
        return MOE_ERR_INVALID;
    }
    int grouped = v3;
    if (!v3) {
        const cJSON *m = cfg_field(c, "topk_method");
        const char *method = cJSON_IsString(m) ? m->valuestring : m ? "?" : "greedy";
        if (!strcmp(method, "group_limited_greedy")) {
            grouped = 1;
        } else if (strcmp(method, "greedy")) {
            MOE_LOGE("%s: topk_method \"%s\" is not supported by DeepseekV2 (greedy, group_limited_greedy)",
                     c->label, method);
            return MOE_ERR_UNSUPPORTED;
        }
        cfg->norm_topk_prob = 0;
    }
    if (!grouped) return MOE_OK;
    cfg->router = v3 ? MOE_ROUTER_SIGMOID_GROUP : MOE_ROUTER_SOFTMAX_GROUP;
    if ((st = cfg_int(c, "n_group", !v3, 8, 1, 1 << 16, &cfg->n_group)) ||
        (st = cfg_int(c, "topk_group", !v3, 4, 1, 1 << 16, &cfg->topk_group)))
        return st;
    const int gsize = cfg->n_expert / cfg->n_group;
    if (cfg->n_expert % cfg->n_group || cfg->topk_group > cfg->n_group || (v3 && gsize < 2)) {
        MOE_LOGE("%s: %d experts cannot form n_group = %d equal groups%s with topk_group = %d", c->label,
                 cfg->n_expert, cfg->n_group, v3 ? " of at least 2" : "", cfg->topk_group);
        return MOE_ERR_INVALID;
    }
    if (cfg->n_expert_used > cfg->topk_group * gsize) {
        MOE_LOGE("%s: num_experts_per_tok (%d) exceeds the %d experts of the topk_group = %d groups", c->label,
                 cfg->n_expert_used, cfg->topk_group * gsize, cfg->topk_group);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* moe_deepseek_mla_rope: DeepSeek's RoPE details: V2 rotates adjacent pairs (complex
 * multiplication), V3 does when rope_interleave (its default); with a scaled
 * RoPE the softmax scale grows by cfg_yarn_mscale(factor, mscale_all_dim)^2. */
enum moe_status moe_deepseek_mla_rope(const struct cfg_ctx *c, struct moe_config *cfg) {
    enum moe_status st;
    int inter = 1;
    if (cfg->arch == MOE_ARCH_DEEPSEEK_V3 && (st = cfg_bool(c, "rope_interleave", 1, &inter))) return st;
    cfg->rope.interleave = inter;
    const cJSON *p = cfg_field(c, "rope_parameters");
    if (!p) p = cfg_field(c, "rope_scaling");
    if (!p || cfg->rope.kind == MOE_ROPE_DEFAULT) return MOE_OK;
    float all_dim;
    if ((st = cfg_float(c, p, "mscale_all_dim", 0.0, &all_dim))) return st;
    if (all_dim != 0) {
        double m = cfg_yarn_mscale(cfg->rope.factor, all_dim);
        cfg->attn_scale = (float)(pow((double)cfg->head_dim, -0.5) * m * m);
        if (!(isfinite(cfg->attn_scale) && cfg->attn_scale > 0)) {
            MOE_LOGE("%s: mscale_all_dim %g gives a softmax scale of %g; it must be a positive number", c->label,
                     (double)all_dim, (double)cfg->attn_scale);
            return MOE_ERR_INVALID;
        }
    }
    return MOE_OK;
}

/* ---- GGUF ---- */

/* moe_deepseek_gguf_check: deepseek2 is V2 (softmax gating) or V3 (sigmoid
 * gating): expert_gating_func, else V3's exp_probs_b correction bias. */
enum moe_status moe_deepseek_gguf_check(struct moe_gguf_model *v) {
    int64_t gating = 0;
    int r = gm_kv_int(v, gm_akv(v, "expert_gating_func"), &gating);
    if (r < 0) return MOE_ERR_FORMAT;
    if (r == 0) gating = gm_has(v, "blk.%d.exp_probs_b.bias", v->n_layer - 1) ? 2 : 1;
    if (gating != 1 && gating != 2) {
        MOE_LOGE("%s: deepseek2.expert_gating_func %lld is not supported (1 softmax: V2, 2 sigmoid: V3)", v->path,
                 (long long)gating);
        return MOE_ERR_UNSUPPORTED;
    }
    v->row = arch_row(gating == 2 ? MOE_ARCH_DEEPSEEK_V3 : MOE_ARCH_DEEPSEEK_V2);
    return MOE_OK;
}

/* moe_deepseek_gguf_shapes: multi-head latent attention and DeepSeek
 * routing, instead of the GQA keys. New files (llama.cpp 2025-) keep
 * key_length / value_length for the absorbed MQA form and the real head
 * sizes in key_length_mla / value_length_mla. */
void moe_deepseek_gguf_shapes(struct cfgb *b, int64_t n_head) {
    const struct moe_gguf_model *v = b->v;
    cJSON *r = b->root;
    int64_t rope = 0, kl = 0, vl = 0, kv_rank = 0;
    cJSON_AddNumberToObject(r, "num_key_value_heads", (double)n_head);
    gm_put_int_key(b, "kv_lora_rank", "attention.kv_lora_rank", 1, 1, 1 << 20, &kv_rank);
    if (!gm_put_int_key(b, "q_lora_rank", "attention.q_lora_rank", 0, 1, 1 << 20, NULL) && !b->st)
        cJSON_AddNullToObject(r, "q_lora_rank"); /* queries straight from the hidden state */
    gm_put_int_key(b, "qk_rope_head_dim", "rope.dimension_count", 1, 2, 1 << 20, &rope);
    if (gm_put_int_key(b, NULL, "attention.key_length_mla", 0, 1, 1 << 20, &kl)) {
        gm_put_int_key(b, NULL, "attention.value_length_mla", 1, 1, 1 << 20, &vl);
    } else {
        gm_put_int_key(b, NULL, "attention.key_length", 1, 1, 1 << 20, &kl);
        gm_put_int_key(b, NULL, "attention.value_length", 1, 1, 1 << 20, &vl);
    }
    if (b->st) return;
    if (kl <= rope) {
        MOE_LOGE("%s: key length %lld leaves no room beside the %lld rope dims", v->path, (long long)kl, (long long)rope);
        gm_fail(b, MOE_ERR_FORMAT);
        return;
    }
    cJSON_AddNumberToObject(r, "qk_nope_head_dim", (double)(kl - rope));
    cJSON_AddNumberToObject(r, "v_head_dim", (double)vl);
    int64_t n_dense = 0, n_shared = 0, groups = 1, groups_used = 1;
    gm_put_int_key(b, NULL, "leading_dense_block_count", 0, 0, v->n_layer, &n_dense);
    cJSON_AddNumberToObject(r, "first_k_dense_replace", (double)n_dense);
    gm_put_int_key(b, NULL, "expert_shared_count", 0, 0, 1 << 16, &n_shared);
    cJSON_AddNumberToObject(r, "n_shared_experts", (double)n_shared);
    gm_put_int_key(b, "n_routed_experts", "expert_count", 1, 1, 1 << 16, NULL);
    gm_put_ff(b, "moe_intermediate_size", "expert_feed_forward_length", "blk.%d.ffn_gate_exps.weight");
    gm_put_ff(b, "intermediate_size", "feed_forward_length", "blk.%d.ffn_gate.weight");
    double scale = 1.0;
    gm_get_float_key(b, "expert_weights_scale", &scale);
    cJSON_AddNumberToObject(r, "routed_scaling_factor", scale);
    gm_put_topk_norm(b, 0);
    gm_put_int_key(b, NULL, "expert_group_count", 0, 1, 1 << 16, &groups);
    gm_put_int_key(b, NULL, "expert_group_used_count", 0, 1, 1 << 16, &groups_used);
    cJSON_AddNumberToObject(r, "n_group", (double)groups);
    cJSON_AddNumberToObject(r, "topk_group", (double)groups_used);
    if (v->row->arch == MOE_ARCH_DEEPSEEK_V3)
        cJSON_AddBoolToObject(r, "rope_interleave", 1);
    else
        cJSON_AddStringToObject(r, "topk_method", groups > 1 ? "group_limited_greedy" : "greedy");
    cJSON_AddBoolToObject(r, "attention_bias", gm_has(v, "blk.0.attn_kv_a_mqa.bias"));
}

/* moe_deepseek_gguf_yarn: DeepSeek's yarn_log_multiplier is 0.1 *
 * mscale_all_dim (llama.cpp assumes mscale == mscale_all_dim: the cos/sin
 * factor is then 1). */
void moe_deepseek_gguf_yarn(struct cfgb *b, cJSON *rp, int have_attn_factor) {
    double lm = 0;
    if (gm_get_float_key(b, "rope.scaling.yarn_log_multiplier", &lm) && lm != 0) {
        cJSON_AddNumberToObject(rp, "mscale", lm / 0.1);
        cJSON_AddNumberToObject(rp, "mscale_all_dim", lm / 0.1);
    } else if (!have_attn_factor) {
        cJSON_AddNumberToObject(rp, "attention_factor", 1.0);
    }
}

/*
 * arch.c - the architecture table: one row per enum moe_arch value, in enum
 * order, with its names, the defaults of its transformers config class, its
 * tensor names and its family's hooks (arch-impl.h says what each field
 * means and what adding an architecture takes).
 */
#include <stdio.h>
#include <string.h>

#include "arch-impl.h"

/* The shared expert-name spellings. */
#define FFN_PROJ {"gate_proj", "up_proj", "down_proj"}
#define FFN_W {"w1", "w3", "w2"} /* Mixtral's gate, up, down */

static const struct arch_row k_rows[] = {
    [MOE_ARCH_MIXTRAL] = {
        .arch = MOE_ARCH_MIXTRAL, .name = "mixtral", .hf_class = "MixtralForCausalLM", .gguf_name = "llama",
        .router = MOE_ROUTER_SOFTMAX_TOPK, .norm_topk_prob = 1, /* Mixtral always renormalises */
        .norm = MOE_NORM_RMS, .norm_eps = 1e-5, .rope_theta = 1e6,
        .gguf_qk_permuted = 1, .gguf_check = moe_mixtral_gguf_check, .gguf_config = moe_mixtral_gguf_config,
        .moe_block = "block_sparse_moe", .router_name = "gate", .expert_ffn = FFN_W,
    },
    [MOE_ARCH_QWEN2_MOE] = {
        .arch = MOE_ARCH_QWEN2_MOE, .name = "qwen2_moe", .hf_class = "Qwen2MoeForCausalLM", .gguf_name = "qwen2moe",
        .moe_intermediate = 1, .router = MOE_ROUTER_SOFTMAX_TOPK, .norm_topk_key = 1,
        .norm = MOE_NORM_RMS, .norm_eps = 1e-6, .attn_bias_key = "qkv_bias", .attn_bias_default = 1,
        .rope_theta = 10000.0, .sparse_step = 1, .sliding_switch = 1,
        .parse_ffn = moe_qwen2_moe_parse_ffn, .sliding_layers = moe_qwen2_moe_sliding_layers,
        .gguf_config = moe_qwen2_moe_gguf_config,
        .moe_block = "mlp", .router_name = "gate", .expert_ffn = FFN_PROJ, .shared_block = "mlp.shared_expert",
    },
    [MOE_ARCH_QWEN3_MOE] = {
        .arch = MOE_ARCH_QWEN3_MOE, .name = "qwen3_moe", .hf_class = "Qwen3MoeForCausalLM", .gguf_name = "qwen3moe",
        .moe_intermediate = 1, .router = MOE_ROUTER_SOFTMAX_TOPK, .norm_topk_key = 1,
        .norm = MOE_NORM_RMS, .norm_eps = 1e-6, .attn_bias_key = "attention_bias", .attn_bias_o = 1,
        .qk_norm = MOE_QK_NORM_HEAD, .rope_theta = 10000.0, .sparse_step = 1, .sliding_switch = 1,
        .gguf_config = moe_qwen3_moe_gguf_config,
        .moe_block = "mlp", .router_name = "gate", .expert_ffn = FFN_PROJ,
    },
    [MOE_ARCH_OLMOE] = {
        .arch = MOE_ARCH_OLMOE, .name = "olmoe", .hf_class = "OlmoeForCausalLM", .gguf_name = "olmoe",
        .router = MOE_ROUTER_SOFTMAX_TOPK, .norm_topk_key = 1,
        .norm = MOE_NORM_RMS, .norm_eps = 1e-5, .attn_bias_key = "attention_bias", .attn_bias_o = 1,
        .qk_norm = MOE_QK_NORM_FULL, .rope_theta = 10000.0,
        .parse_fields = moe_olmoe_parse_fields, .gguf_config = moe_olmoe_gguf_config,
        .moe_block = "mlp", .router_name = "gate", .expert_ffn = FFN_PROJ,
    },
    [MOE_ARCH_PHIMOE] = {
        .arch = MOE_ARCH_PHIMOE, .name = "phimoe", .hf_class = "PhimoeForCausalLM", .gguf_name = "phimoe",
        .router = MOE_ROUTER_SPARSEMIXER,
        .norm = MOE_NORM_LAYER, .norm_eps = 1e-5, .attn_bias_key = "attention_bias", .attn_bias_o = 1,
        .rope_theta = 1e6,
        .parse_routing = moe_phimoe_parse_routing, .parse_fields = moe_phimoe_parse_fields,
        .parse_longrope = moe_phimoe_parse_longrope, .gguf_config = moe_phimoe_gguf_config,
        .gguf_rope = moe_phimoe_gguf_rope,
        .moe_block = "block_sparse_moe", .router_name = "gate", .expert_ffn = FFN_W,
    },
    [MOE_ARCH_DEEPSEEK_V2] = {
        .arch = MOE_ARCH_DEEPSEEK_V2, .name = "deepseek_v2", .hf_class = "DeepseekV2ForCausalLM",
        .gguf_name = "deepseek2", /* V3 too: moe_deepseek_gguf_check tells them apart */
        .n_expert_key = "n_routed_experts", .moe_intermediate = 1, .router = MOE_ROUTER_SOFTMAX_TOPK,
        .norm = MOE_NORM_RMS, .norm_eps = 1e-6, .attn_bias_key = "attention_bias", .attn_bias_o = 1,
        .rope_theta = 10000.0, .first_dense_key = "first_k_dense_replace",
        .parse_attention = moe_deepseek_parse_mla, .parse_ffn = moe_deepseek_parse_ffn,
        .parse_routing = moe_deepseek_parse_routing, .finish_rope = moe_deepseek_mla_rope,
        .gguf_check = moe_deepseek_gguf_check, .gguf_shapes = moe_deepseek_gguf_shapes,
        .gguf_yarn = moe_deepseek_gguf_yarn,
        .moe_block = "mlp", .router_name = "gate", .expert_ffn = FFN_PROJ, .shared_block = "mlp.shared_experts",
    },
    [MOE_ARCH_DEEPSEEK_V3] = {
        .arch = MOE_ARCH_DEEPSEEK_V3, .name = "deepseek_v3", .hf_class = "DeepseekV3ForCausalLM",
        .n_expert_key = "n_routed_experts", .moe_intermediate = 1, .router = MOE_ROUTER_SOFTMAX_TOPK,
        .norm_topk_prob = 1, .norm_topk_key = 1,
        .norm = MOE_NORM_RMS, .norm_eps = 1e-6, .attn_bias_key = "attention_bias", .attn_bias_o = 1,
        .rope_theta = 10000.0, .first_dense_key = "first_k_dense_replace", .first_dense_default = 3,
        .parse_attention = moe_deepseek_parse_mla, .parse_ffn = moe_deepseek_parse_ffn,
        .parse_routing = moe_deepseek_parse_routing, .finish_rope = moe_deepseek_mla_rope,
        .gguf_check = moe_deepseek_gguf_check, .gguf_shapes = moe_deepseek_gguf_shapes,
        .gguf_yarn = moe_deepseek_gguf_yarn,
        .moe_block = "mlp", .router_name = "gate", .expert_ffn = FFN_PROJ, .shared_block = "mlp.shared_experts",
    },
    [MOE_ARCH_GPT_OSS] = {
        .arch = MOE_ARCH_GPT_OSS, .name = "gpt_oss", .hf_class = "GptOssForCausalLM", .gguf_name = "gpt-oss",
        .router = MOE_ROUTER_SOFTMAX_TOPK, .norm_topk_prob = 1, /* softmax over the k largest logits */
        .norm = MOE_NORM_RMS, .norm_eps = 1e-5, .attn_bias_key = "attention_bias", .attn_bias_default = 1,
        .attn_bias_o = 1, .rope_theta = 150000.0, .native_quant = "mxfp4",
        .parse_fields = moe_gpt_oss_parse_fields, .sliding_layers = moe_gpt_oss_sliding_layers,
        .gguf_config = moe_gpt_oss_gguf_config, .gguf_yarn = moe_gpt_oss_gguf_yarn,
        .moe_block = "mlp", .router_name = "router", .expert_ffn = FFN_PROJ,
        .bind_experts = moe_gpt_oss_bind_experts,
    },
};

_Static_assert(sizeof k_rows / sizeof k_rows[0] == MOE_ARCH_COUNT, "one row per enum moe_arch value");

const char *moe_arch_name(enum moe_arch a) {
    return (int)a >= 0 && (int)a < MOE_ARCH_COUNT && k_rows[a].name ? k_rows[a].name : "?";
}

const struct arch_row *arch_row(enum moe_arch a) {
    MOE_ASSERT((int)a >= 0 && (int)a < MOE_ARCH_COUNT && k_rows[a].arch == a);
    return &k_rows[a];
}

size_t arch_count(void) { return sizeof k_rows / sizeof k_rows[0]; }

const struct arch_row *arch_at(size_t i) { return i < arch_count() ? &k_rows[i] : NULL; }

const struct arch_row *arch_by_hf(const char *hf_class) {
    for (size_t i = 0; i < arch_count(); i++)
        if (k_rows[i].hf_class && !strcmp(hf_class, k_rows[i].hf_class)) return &k_rows[i];
    return NULL;
}

const struct arch_row *arch_by_name(const char *name) {
    for (size_t i = 0; i < arch_count(); i++)
        if (k_rows[i].name && !strcmp(name, k_rows[i].name)) return &k_rows[i];
    return NULL;
}

const struct arch_row *arch_by_gguf(const char *p, size_t n) {
    for (size_t i = 0; i < arch_count(); i++)
        if (k_rows[i].gguf_name && strlen(k_rows[i].gguf_name) == n && !memcmp(k_rows[i].gguf_name, p, n))
            return &k_rows[i];
    return NULL;
}

/* Joins the rows' class or GGUF names, as far as buf holds them. */
void arch_list(int gguf, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < arch_count(); i++) {
        const char *s = gguf ? k_rows[i].gguf_name : k_rows[i].hf_class;
        if (!s) continue;
        int n = snprintf(buf + used, size - used, "%s%s", used ? ", " : "", s);
        if (n < 0 || (size_t)n >= size - used) return;
        used += (size_t)n;
    }
}

/*
 * test-config.c - the architecture table (one row per enum value, names that
 * map back to their row, defaults the parser applies); config.json parsing
 * for each architecture and the errors for
 * unknown architectures, missing fields, bad values; tensor binding errors
 * (missing tensor, wrong shape) name the tensor; block-scaled FP8 configs and
 * weights (dequantized at load, partial edge blocks, must-reject rows).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arch-impl.h"
#include "moe-model.h"
#include "moe-test.h"
#include "moe-test-model.h"

static char last_log[4096];

static void capture(enum moe_log_level level, const char *msg, void *user) {
    if (level >= MOE_LOG_ERROR) snprintf(last_log, sizeof last_log, "%s", msg);
}


static enum moe_status parse(const char *json, struct moe_config *c) {
    last_log[0] = 0;
    return moe_config_parse(json, strlen(json), "config.json", c);
}

/* test_arch_table: every enum moe_arch value has exactly one row, at its
 * index; moe_arch_name, the transformers class and the GGUF name each map
 * back to that row; the unknown-architecture message lists every class; and a
 * config.json that names the class (and holds every shape field some family
 * requires) gets the row's defaults. */
static void test_arch_table(void) {
    CHECK(arch_count() == MOE_ARCH_COUNT, "%zu rows for %d architectures", arch_count(), (int)MOE_ARCH_COUNT);
    CHECK(!strcmp(moe_arch_name(MOE_ARCH_COUNT), "?"), "moe_arch_name past the table");
    CHECK(!arch_by_hf("LlamaForCausalLM") && !arch_by_name("llama") && !arch_by_gguf("bert", 4) &&
              !arch_by_gguf("llam", 4),
          "unknown names map to no row");
    char list[512], unknown[sizeof last_log];
    struct moe_config c;
    arch_list(0, list, sizeof list);
    CHECK(parse("{\"architectures\":[\"FooForCausalLM\"]}", &c) == MOE_ERR_UNSUPPORTED, "unknown class");
    snprintf(unknown, sizeof unknown, "%s", last_log);
    for (int a = 0; a < MOE_ARCH_COUNT; a++) {
        int n = 0;
        for (size_t i = 0; i < arch_count(); i++) n += arch_at(i)->arch == (enum moe_arch)a;
        CHECK(n == 1, "enum value %d has %d rows", a, n);
        const struct arch_row *r = arch_row((enum moe_arch)a);
        CHECK(r == arch_at((size_t)a) && r->arch == (enum moe_arch)a, "row %d is not at its enum's index", a);
        CHECK(r->name && r->hf_class && r->moe_block && r->router_name && r->expert_ffn[0] && r->expert_ffn[1] &&
                  r->expert_ffn[2] && r->norm_eps > 0 && r->rope_theta > 0,
              "row %d lacks a name, a tensor name or a default", a);
        if (!r->name || !r->hf_class) continue;
        CHECK(!strcmp(moe_arch_name((enum moe_arch)a), r->name) && arch_by_name(r->name) == r,
              "moe_arch_name(%d) = %s does not map back", a, moe_arch_name((enum moe_arch)a));
        CHECK(arch_by_hf(r->hf_class) == r, "%s maps to another row", r->hf_class);
        CHECK(!r->gguf_name || arch_by_gguf(r->gguf_name, strlen(r->gguf_name)) == r, "GGUF %s maps to another row",
              r->gguf_name);
        CHECK(strstr(unknown, r->hf_class) && strstr(list, r->hf_class), "%s missing from the supported list: %s",
              r->hf_class, unknown);
        /* a V3 GGUF is a deepseek2 file refined by the family's check */
        CHECK(r->gguf_name || (r->gguf_check && arch_by_gguf("deepseek2", 9) &&
                               arch_by_gguf("deepseek2", 9)->gguf_check == r->gguf_check),
              "%s has neither a GGUF name nor a family check that reaches it", r->name);

        char json[1024];
        snprintf(json, sizeof json,
                 "{\"architectures\":[\"%s\"],\"vocab_size\":32,\"hidden_size\":8,\"num_hidden_layers\":2,"
                 "\"num_attention_heads\":2,\"intermediate_size\":6,\"moe_intermediate_size\":4,"
                 "\"shared_expert_intermediate_size\":4,\"num_experts\":16,\"num_experts_per_tok\":2,"
                 "\"q_lora_rank\":null,\"kv_lora_rank\":4,\"qk_nope_head_dim\":2,\"qk_rope_head_dim\":2,"
                 "\"v_head_dim\":2}",
                 r->hf_class);
        const enum moe_status st = parse(json, &c);
        CHECK(st == MOE_OK, "%s: minimal config: %s", r->name, last_log);
        if (st) continue;
        const int bias = r->attn_bias_key ? r->attn_bias_default : 0;
        CHECK(c.arch == r->arch && !strcmp(c.arch_name, r->hf_class) && c.norm == r->norm &&
                  c.norm_eps == (float)r->norm_eps && c.rope.theta == (float)r->rope_theta && c.qk_norm == r->qk_norm &&
                  c.norm_topk_prob == r->norm_topk_prob && (r->parse_routing || c.router == r->router) &&
                  c.attn_qkv_bias == bias && c.attn_o_bias == (r->attn_bias_o ? bias : 0) &&
                  c.n_ff_expert == (r->moe_intermediate ? 4 : 6) && c.layer_moe[0] == !(r->first_dense_default > 0) &&
                  (c.attn == MOE_ATTN_MLA) == (r->parse_attention != NULL),
              "%s: the parsed config does not carry the row's defaults", r->name);
        moe_config_clear(&c);
    }
}

#define MIXTRAL_BASE                                                                        \
    "\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"       \
    "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,"          \
    "\"intermediate_size\":6,\"num_local_experts\":3,\"num_experts_per_tok\":2"

static void test_arches(void) {
    struct moe_config c;
    CHECK(parse("{" MIXTRAL_BASE ",\"rope_theta\":5000.0}", &c) == MOE_OK, "mixtral v4");
    CHECK(c.arch == MOE_ARCH_MIXTRAL && c.head_dim == 4 && c.n_expert == 3 && c.norm_topk_prob == 1,
          "mixtral fields");
    CHECK(c.rope.theta == 5000.0f && c.rope.n_rot == 4, "v4 rope_theta");
    CHECK(c.layer_moe[0] && c.layer_moe[1] && !c.layer_sliding[0], "mixtral layers");
    moe_config_clear(&c);

    CHECK(parse("{" MIXTRAL_BASE ",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":7.0}}", &c) == MOE_OK,
          "mixtral v5");
    CHECK(c.rope.theta == 7.0f, "v5 rope_parameters theta: %g", c.rope.theta);
    moe_config_clear(&c);

    const char *qwen2 =
        "{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
        "\"num_hidden_layers\":4,\"num_attention_heads\":2,\"intermediate_size\":10,"
        "\"moe_intermediate_size\":6,\"shared_expert_intermediate_size\":12,\"num_experts\":4,"
        "\"num_experts_per_tok\":2,\"norm_topk_prob\":true,\"decoder_sparse_step\":2,"
        "\"mlp_only_layers\":[3],\"eos_token_id\":[5,7]}";
    CHECK(parse(qwen2, &c) == MOE_OK, "qwen2 parse: %s", last_log);
    CHECK(c.arch == MOE_ARCH_QWEN2_MOE && c.n_ff_expert == 6 && c.n_ff_shared == 12 && c.n_ff_dense == 10,
          "qwen2 sizes");
    CHECK(c.attn_qkv_bias == 1 && c.attn_o_bias == 0, "qwen2 qkv bias default");
    CHECK(!c.layer_moe[0] && c.layer_moe[1] && !c.layer_moe[2] && !c.layer_moe[3],
          "decoder_sparse_step / mlp_only_layers");
    CHECK(c.n_eos == 2 && c.eos_ids[1] == 7, "eos list");
    CHECK(c.norm_eps == 1e-6f, "qwen eps default");
    moe_config_clear(&c);

    CHECK(parse("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
                "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"head_dim\":6,"
                "\"moe_intermediate_size\":6,\"num_local_experts\":4,\"num_experts_per_tok\":2}", &c) == MOE_OK,
          "qwen3: %s", last_log);
    CHECK(c.head_dim == 6 && c.qk_norm == MOE_QK_NORM_HEAD && c.n_expert == 4 && !c.attn_qkv_bias,
          "qwen3 fields");
    moe_config_clear(&c);

    /* sliding windows: Qwen2-MoE derives per-layer kinds as transformers 5.x does
     * (even layers below max_window_layers); Qwen3-MoE ignores the window unless
     * use_sliding_window; Mixtral applies it to every layer; layer_types wins */
    CHECK(parse("{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
                "\"num_hidden_layers\":4,\"num_attention_heads\":2,\"moe_intermediate_size\":6,"
                "\"shared_expert_intermediate_size\":0,\"num_experts\":4,\"num_experts_per_tok\":2,"
                "\"use_sliding_window\":true,\"sliding_window\":6,\"max_window_layers\":3}", &c) == MOE_OK,
          "qwen2 swa: %s", last_log);
    CHECK(c.sliding_window == 6 && c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[2] &&
              !c.layer_sliding[3],
          "qwen2 derived sliding layers");
    moe_config_clear(&c);
    CHECK(parse("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
                "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"moe_intermediate_size\":6,"
                "\"num_experts\":4,\"num_experts_per_tok\":2,\"sliding_window\":4096}", &c) == MOE_OK &&
              c.sliding_window == 0 && !c.layer_sliding[0],
          "qwen3 window ignored without use_sliding_window");
    moe_config_clear(&c);
    CHECK(parse("{" MIXTRAL_BASE ",\"sliding_window\":5}", &c) == MOE_OK && c.sliding_window == 5 &&
              c.layer_sliding[0] && c.layer_sliding[1],
          "mixtral window on every layer");
    moe_config_clear(&c);
    CHECK(parse("{" MIXTRAL_BASE ",\"sliding_window\":5,\"layer_types\":[\"full_attention\",\"sliding_attention\"]}",
                &c) == MOE_OK && !c.layer_sliding[0] && c.layer_sliding[1],
          "layer_types wins");
    moe_config_clear(&c);

    CHECK(parse("{\"architectures\":[\"OlmoeForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
                "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"intermediate_size\":6,"
                "\"num_experts\":4,\"num_experts_per_tok\":2,\"clip_qkv\":3.5}", &c) == MOE_OK,
          "olmoe");
    CHECK(c.qk_norm == MOE_QK_NORM_FULL && c.clip_qkv == 3.5f && !c.norm_topk_prob, "olmoe fields");
    moe_config_clear(&c);

    const char *phi =
        "{\"architectures\":[\"PhimoeForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"intermediate_size\":6,"
        "\"num_local_experts\":4,\"num_experts_per_tok\":2,\"attention_bias\":true,"
        "\"lm_head_bias\":true,\"max_position_embeddings\":64,"
        "\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1.5],\"long_factor\":[2,3],"
        "\"short_mscale\":1.1,\"long_mscale\":1.3,\"original_max_position_embeddings\":16}}";
    CHECK(parse(phi, &c) == MOE_OK, "phimoe: %s", last_log);
    CHECK(c.norm == MOE_NORM_LAYER && c.router == MOE_ROUTER_SPARSEMIXER && c.attn_o_bias && c.lm_head_bias,
          "phimoe fields");
    CHECK(c.rope.kind == MOE_ROPE_LONGROPE && c.rope.has_mscale && c.rope.long_factor[1] == 3.0f &&
              c.rope.original_max_pos == 16 && c.router_jitter == 0.01f,
          "phimoe rope");
    moe_config_clear(&c);
}

static void test_errors(void) {
    struct moe_config c;
    CHECK(parse("{\"architectures\":[\"LlamaForCausalLM\"]}", &c) == MOE_ERR_UNSUPPORTED &&
              strstr(last_log, "LlamaForCausalLM"),
          "unknown arch: %s", last_log);
    CHECK(parse("{\"vocab_size\":3}", &c) == MOE_ERR_NOT_FOUND && strstr(last_log, "architectures"),
          "missing architectures");
    CHECK(parse("{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
                "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"intermediate_size\":6,"
                "\"num_experts_per_tok\":2}", &c) == MOE_ERR_NOT_FOUND &&
              strstr(last_log, "num_experts"),
          "missing expert count: %s", last_log);
    CHECK(parse("{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":32,\"hidden_size\":\"big\","
                "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"intermediate_size\":6,"
                "\"num_local_experts\":3,\"num_experts_per_tok\":2}", &c) == MOE_ERR_INVALID &&
              strstr(last_log, "hidden_size"),
          "string where int: %s", last_log);
    CHECK(parse("not json", &c) == MOE_ERR_FORMAT, "not json");
    CHECK(parse("[1,2]", &c) == MOE_ERR_FORMAT, "not an object");
    CHECK(parse("{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
                "\"num_hidden_layers\":2,\"num_attention_heads\":3,\"num_key_value_heads\":2,"
                "\"intermediate_size\":6,\"num_local_experts\":3,\"num_experts_per_tok\":2}", &c) ==
              MOE_ERR_INVALID && strstr(last_log, "num_key_value_heads"),
          "heads not multiple of kv heads: %s", last_log);
    CHECK(parse("{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
                "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"intermediate_size\":6,"
                "\"num_local_experts\":3,\"num_experts_per_tok\":4}", &c) == MOE_ERR_INVALID,
          "top-k > experts");
    CHECK(parse("{" MIXTRAL_BASE ",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":4}}", &c) ==
              MOE_ERR_UNSUPPORTED && strstr(last_log, "dynamic"),
          "unsupported rope: %s", last_log);
    CHECK(parse("{" MIXTRAL_BASE ",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":-4}}", &c) == MOE_ERR_INVALID &&
              strstr(last_log, "factor"),
          "negative yarn factor: %s", last_log);
    CHECK(parse("{" MIXTRAL_BASE ",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1],"
                "\"long_factor\":[1,2]}}", &c) != MOE_OK && strstr(last_log, "short_factor"),
          "longrope wrong length: %s", last_log);
    CHECK(parse("{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
                "\"num_hidden_layers\":-1,\"num_attention_heads\":2,\"intermediate_size\":6,"
                "\"num_local_experts\":3,\"num_experts_per_tok\":2}", &c) == MOE_ERR_INVALID &&
              strstr(last_log, "num_hidden_layers"),
          "negative layers");

    /* issue 17: constants and ids out of range are refused on load (they gave
     * all-NaN logits or silently wrong ids) */
    static const struct {
        const char *extra, *field;
    } k_bad[] = {
        {"\"rms_norm_eps\":-1e-5", "rms_norm_eps"},
        {"\"rms_norm_eps\":0", "rms_norm_eps"},
        {"\"rms_norm_eps\":7e206", "rms_norm_eps"}, /* fuzz-config: finite as a double, inf as a float */
        {"\"rms_norm_eps\":1e-60", "rms_norm_eps"}, /* 0 as a float */
        {"\"mlp_only_layers\":[1e300]", NULL},      /* no undefined cast: simply no such layer */
        {"\"rope_theta\":0", "rope_theta"},
        {"\"rope_theta\":-10000", "rope_theta"},
        {"\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":-1}", "rope_theta"},
        {"\"rope_scaling\":{\"type\":\"linear\",\"factor\":0}", "factor"},
        {"\"rope_scaling\":{\"type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4,\"high_freq_factor\":4}",
         "low_freq_factor"},
        {"\"bos_token_id\":32", "bos_token_id"},
        {"\"bos_token_id\":-3", "bos_token_id"},
        {"\"bos_token_id\":1.5", "bos_token_id"},
        {"\"eos_token_id\":99", "eos_token_id"},
        {"\"eos_token_id\":[2,-1]", "eos_token_id"},
        {"\"eos_token_id\":\"2\"", "eos_token_id"},
    };
    /* found by fuzz-config: hidden_size < heads made the default head_dim 0 */
    CHECK(parse("{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":32,\"hidden_size\":2,"
                "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":6,"
                "\"num_local_experts\":3,\"num_experts_per_tok\":2}", &c) == MOE_ERR_INVALID &&
              strstr(last_log, "no head_dim is given"),
          "head_dim 0 by default: %s", last_log);
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{" MIXTRAL_BASE ",%s}", k_bad[i].extra);
        enum moe_status st = parse(json, &c);
        if (!k_bad[i].field) {
            CHECK(st == MOE_OK, "accepted: %s (%s: %s)", k_bad[i].extra, moe_status_str(st), last_log);
        } else {
            CHECK(st != MOE_OK && strstr(last_log, k_bad[i].field), "refused: %s (%s: %s)", k_bad[i].extra,
                  moe_status_str(st), last_log);
        }
        if (st == MOE_OK) moe_config_clear(&c);
    }
    CHECK(parse("{" MIXTRAL_BASE ",\"bos_token_id\":31,\"eos_token_id\":[0,31],\"rms_norm_eps\":1e-6}", &c) ==
              MOE_OK && c.bos_id == 31 && c.n_eos == 2,
          "ids at the ends of the vocabulary are fine: %s", last_log);
    moe_config_clear(&c);
}


#define DSV3_BASE                                                                                  \
    "\"architectures\":[\"DeepseekV3ForCausalLM\"],\"vocab_size\":32,\"hidden_size\":16,"          \
    "\"num_hidden_layers\":4,\"num_attention_heads\":2,\"num_key_value_heads\":2,"                 \
    "\"intermediate_size\":20,\"moe_intermediate_size\":6,\"n_routed_experts\":16,"                \
    "\"num_experts_per_tok\":2,\"kv_lora_rank\":4,\"qk_nope_head_dim\":6,\"qk_rope_head_dim\":4,"  \
    "\"v_head_dim\":5,\"head_dim\":4,\"max_position_embeddings\":1024"

/* test_deepseek: MLA shapes, routing kinds and their defaults, YaRN, and the
 * errors of DeepSeek configs (cJSON takes the first of duplicate keys, so
 * overrides go before the base fields). */
static void test_deepseek(void) {
    struct moe_config c;
    CHECK(parse("{" DSV3_BASE ",\"q_lora_rank\":null}", &c) == MOE_OK, "v3 parse: %s", last_log);
    CHECK(c.arch == MOE_ARCH_DEEPSEEK_V3 && c.attn == MOE_ATTN_MLA && c.head_dim == 10 && c.q_lora_rank == 0 &&
              c.kv_lora_rank == 4 && c.v_head_dim == 5 && c.rope.n_rot == 4,
          "v3 MLA shapes (head_dim from nope + rope, not the saved head_dim)");
    CHECK(c.router == MOE_ROUTER_SIGMOID_GROUP && c.n_group == 8 && c.topk_group == 4 && c.routed_scale == 2.5f &&
              c.norm_topk_prob == 1,
          "v3 routing defaults");
    CHECK(c.n_ff_expert == 6 && c.n_ff_shared == 6 && !c.shared_gated && c.n_ff_dense == 20, "v3 ffn sizes");
    CHECK(!c.layer_moe[0] && !c.layer_moe[1] && !c.layer_moe[2] && c.layer_moe[3], "first_k_dense_replace default 3");
    CHECK(c.rope.interleave == 1 && c.norm_eps == 1e-6f && fabsf(c.attn_scale - 1.0f / sqrtf(10.0f)) < 1e-7f,
          "v3 rope interleave, eps, scale");
    moe_config_clear(&c);

    CHECK(parse("{" DSV3_BASE ",\"q_lora_rank\":12,\"rope_interleave\":false,\"first_k_dense_replace\":1,"
                "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,\"original_max_position_embeddings\":64,"
                "\"mscale\":1.0,\"mscale_all_dim\":0.5,\"beta_fast\":0}}", &c) == MOE_OK,
          "v3 yarn: %s", last_log);
    double m1 = 0.1 * log(40.0) + 1, m5 = 0.05 * log(40.0) + 1;
    CHECK(c.rope.kind == MOE_ROPE_YARN && c.rope.factor == 40.0f && c.rope.original_max_pos == 64 &&
              c.rope.beta_fast == 32.0f && c.rope.beta_slow == 1.0f && c.rope.truncate == 1 &&
              fabs(c.rope.attention_factor - m1 / m5) < 1e-6,
          "yarn parameters (beta_fast 0 = default 32): af %g", c.rope.attention_factor);
    CHECK(fabs(c.attn_scale - m5 * m5 / sqrt(10.0)) < 1e-6 && c.rope.interleave == 0 && c.q_lora_rank == 12 &&
              c.layer_moe[1],
          "mscale_all_dim scales the softmax: %g", c.attn_scale);
    moe_config_clear(&c);

    const char *v2 = "{\"architectures\":[\"DeepseekV2ForCausalLM\"],\"vocab_size\":32,\"hidden_size\":16,"
                     "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"intermediate_size\":20,"
                     "\"moe_intermediate_size\":6,\"n_routed_experts\":6,\"num_experts_per_tok\":2,"
                     "\"kv_lora_rank\":4,\"qk_nope_head_dim\":6,\"qk_rope_head_dim\":4,\"v_head_dim\":5,"
                     "\"q_lora_rank\":8,\"norm_topk_prob\":true%s}";
    char buf[1024];
    snprintf(buf, sizeof buf, v2, "");
    CHECK(parse(buf, &c) == MOE_OK, "v2 parse: %s", last_log);
    CHECK(c.router == MOE_ROUTER_SOFTMAX_TOPK && c.routed_scale == 1.0f && !c.norm_topk_prob && c.n_ff_shared == 12 &&
              c.layer_moe[0] && c.rope.interleave == 1 && c.n_head_kv == 2,
          "v2 defaults: greedy, scale 1, norm_topk_prob ignored, 2 shared experts, no dense layer");
    moe_config_clear(&c);
    snprintf(buf, sizeof buf, v2, ",\"topk_method\":\"group_limited_greedy\",\"n_group\":3,\"topk_group\":2");
    CHECK(parse(buf, &c) == MOE_OK && c.router == MOE_ROUTER_SOFTMAX_GROUP && c.n_group == 3 && c.topk_group == 2,
          "v2 group_limited_greedy: %s", last_log);
    moe_config_clear(&c);

    /* errors */
    snprintf(buf, sizeof buf, v2, ",\"topk_method\":\"group_limited_greedy\",\"n_group\":4,\"topk_group\":2");
    CHECK(parse(buf, &c) == MOE_ERR_INVALID && strstr(last_log, "n_group"), "6 experts in 4 groups: %s", last_log);
    snprintf(buf, sizeof buf, v2, ",\"topk_method\":\"group_limited_greedy\",\"n_group\":3");
    CHECK(parse(buf, &c) == MOE_ERR_NOT_FOUND && strstr(last_log, "topk_group"), "v2 groups need topk_group: %s",
          last_log);
    snprintf(buf, sizeof buf, v2, ",\"topk_method\":\"noaux_tc\"");
    CHECK(parse(buf, &c) == MOE_ERR_UNSUPPORTED && strstr(last_log, "noaux_tc"), "v2 unknown method: %s", last_log);
    snprintf(buf, sizeof buf, v2, ",\"mlp_bias\":true");
    CHECK(parse(buf, &c) == MOE_ERR_UNSUPPORTED && strstr(last_log, "mlp_bias"), "mlp_bias: %s", last_log);
    snprintf(buf, sizeof buf, v2, ",\"num_key_value_heads\":1");
    CHECK(parse(buf, &c) == MOE_ERR_INVALID && strstr(last_log, "num_key_value_heads"), "MLA kv heads: %s", last_log);
    CHECK(parse("{" DSV3_BASE "}", &c) == MOE_ERR_NOT_FOUND && strstr(last_log, "q_lora_rank"),
          "q_lora_rank must be present: %s", last_log);
    CHECK(parse("{" DSV3_BASE ",\"q_lora_rank\":null,\"n_group\":16}", &c) == MOE_ERR_INVALID &&
              strstr(last_log, "at least 2"),
          "v3 groups of one expert: %s", last_log);
    CHECK(parse("{\"q_lora_rank\":null,\"topk_group\":1,\"num_experts_per_tok\":3," DSV3_BASE "}", &c) ==
              MOE_ERR_INVALID && strstr(last_log, "num_experts_per_tok"),
          "top-k beyond the kept groups: %s", last_log);
    CHECK(parse("{\"q_lora_rank\":null,\"qk_rope_head_dim\":3," DSV3_BASE "}", &c) != MOE_OK &&
              strstr(last_log, "qk_rope_head_dim"),
          "odd rope dim: %s", last_log);
    CHECK(parse("{" DSV3_BASE ",\"q_lora_rank\":null,\"rope_interleave\":1}", &c) == MOE_ERR_INVALID &&
              strstr(last_log, "rope_interleave"),
          "rope_interleave must be a bool: %s", last_log);

    /* issue 17 on the DeepSeek constants: what would give NaN, zero or infinite
     * scales, or an undefined cast, is refused on load */
    static const struct {
        const char *extra, *field;
    } k_bad[] = {
        {"\"routed_scaling_factor\":0", "routed_scaling_factor"},
        {"\"routed_scaling_factor\":-2.5", "routed_scaling_factor"},
        /* yarn_mscale(1e5, -2) < 0: a negative attention factor */
        {"\"rope_scaling\":{\"type\":\"yarn\",\"factor\":100000,\"original_max_position_embeddings\":64,"
         "\"mscale\":1,\"mscale_all_dim\":-2}", "attention_factor"},
        {"\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":64,"
         "\"attention_factor\":0}", "attention_factor"},
        /* yarn_mscale(40, 1e38)^2 overflows: an infinite softmax scale */
        {"\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,\"original_max_position_embeddings\":64,"
         "\"attention_factor\":1,\"mscale_all_dim\":1e38}", NULL},
        {"\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":3e38}",
         "original_max_position_embeddings"},
    };
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{\"q_lora_rank\":null,%s," DSV3_BASE "}", k_bad[i].extra);
        enum moe_status st = parse(json, &c);
        const char *want = k_bad[i].field ? k_bad[i].field : "mscale_all_dim";
        CHECK(st != MOE_OK && strstr(last_log, want), "refused: %s (%s: %s)", k_bad[i].extra, moe_status_str(st),
              last_log);
        if (st == MOE_OK) moe_config_clear(&c);
    }
}

/* test_gpt_oss: gpt-oss defaults (biases, sinks, clamped SwiGLU, the
 * alternating window) and pre-quantized checkpoints: mxfp4 for gpt-oss,
 * everything else refused by name. */
/* test_fp8_config: block-scaled FP8 (DeepSeek-V3's release) is accepted with
 * e4m3 weights, dynamic activations and a valid weight_block_size; what the
 * loader cannot honour is refused by name; other methods stay refused. */
static void test_fp8_config(void) {
    struct moe_config c;
    char buf[2048];
#define FP8_CFG(q) "{" DSV3_BASE ",\"q_lora_rank\":null,\"quantization_config\":{\"quant_method\":\"fp8\"" q "}}"
    CHECK(parse(FP8_CFG(",\"fmt\":\"e4m3\",\"activation_scheme\":\"dynamic\",\"weight_block_size\":[128,64]"), &c) ==
                  MOE_OK &&
              c.fp8_block[0] == 128 && c.fp8_block[1] == 64,
          "DeepSeek-V3's FP8 config accepted: %s", last_log);
    moe_config_clear(&c);
    CHECK(parse(FP8_CFG(",\"weight_block_size\":[1,3]"), &c) == MOE_OK && c.fp8_block[0] == 1 && c.fp8_block[1] == 3,
          "fmt and activation_scheme default to e4m3 / dynamic: %s", last_log);
    moe_config_clear(&c);
    CHECK(parse("{" DSV3_BASE ",\"q_lora_rank\":null}", &c) == MOE_OK && c.fp8_block[0] == 0 && c.fp8_block[1] == 0,
          "no quantization_config: no FP8 blocks");
    moe_config_clear(&c);
    static const struct {
        const char *q, *want;
        enum moe_status st;
    } k_bad[] = {
        {",\"fmt\":\"e5m2\",\"weight_block_size\":[128,128]", "e5m2", MOE_ERR_UNSUPPORTED},
        {",\"fmt\":7,\"weight_block_size\":[128,128]", "fmt", MOE_ERR_UNSUPPORTED},
        {",\"activation_scheme\":\"static\",\"weight_block_size\":[128,128]", "static", MOE_ERR_UNSUPPORTED},
        {",\"scale_fmt\":\"ue8m0\",\"weight_block_size\":[128,128]", "ue8m0", MOE_ERR_UNSUPPORTED},
        {",\"expert_dtype\":\"fp4\",\"weight_block_size\":[128,128]", "fp4", MOE_ERR_UNSUPPORTED},
        {"", "weight_block_size", MOE_ERR_UNSUPPORTED},
        {",\"weight_block_size\":null", "weight_block_size", MOE_ERR_UNSUPPORTED},
        {",\"weight_block_size\":[128]", "weight_block_size", MOE_ERR_INVALID},
        {",\"weight_block_size\":[128,128,1]", "weight_block_size", MOE_ERR_INVALID},
        {",\"weight_block_size\":[0,128]", "weight_block_size", MOE_ERR_INVALID},
        {",\"weight_block_size\":[128,-1]", "weight_block_size", MOE_ERR_INVALID},
        {",\"weight_block_size\":[128.5,128]", "weight_block_size", MOE_ERR_INVALID},
        {",\"weight_block_size\":[128,1e12]", "weight_block_size", MOE_ERR_INVALID},
        {",\"weight_block_size\":[\"128\",128]", "weight_block_size", MOE_ERR_INVALID},
        {",\"weight_block_size\":128", "weight_block_size", MOE_ERR_INVALID},
    };
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        snprintf(buf, sizeof buf,
                 "{" DSV3_BASE ",\"q_lora_rank\":null,\"quantization_config\":{\"quant_method\":\"fp8\"%s}}",
                 k_bad[i].q);
        enum moe_status st = parse(buf, &c);
        CHECK(st == k_bad[i].st && strstr(last_log, k_bad[i].want) && strstr(last_log, "fp8"),
              "fp8 config %s: status %d, log: %s", k_bad[i].q, (int)st, last_log);
        if (st == MOE_OK) moe_config_clear(&c);
    }
    static const char *const k_other[] = {"gptq", "awq", "bitsandbytes", "compressed-tensors"};
    for (size_t i = 0; i < sizeof k_other / sizeof k_other[0]; i++) {
        snprintf(buf, sizeof buf,
                 "{" DSV3_BASE ",\"q_lora_rank\":null,\"quantization_config\":{\"quant_method\":\"%s\"}}", k_other[i]);
        CHECK(parse(buf, &c) == MOE_ERR_UNSUPPORTED && strstr(last_log, k_other[i]), "%s refused by name: %s",
              k_other[i], last_log);
    }
#undef FP8_CFG
}

static void test_gpt_oss(void) {
    struct moe_config c;
    const char *base = "\"architectures\":[\"GptOssForCausalLM\"],\"vocab_size\":32,\"hidden_size\":16,"
                       "\"num_hidden_layers\":3,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
                       "\"head_dim\":8,\"intermediate_size\":6,\"num_local_experts\":4,"
                       "\"num_experts_per_tok\":2,\"sliding_window\":5";
    char buf[2048];
    snprintf(buf, sizeof buf, "{%s}", base);
    CHECK(parse(buf, &c) == MOE_OK, "gpt-oss: %s", last_log);
    CHECK(c.arch == MOE_ARCH_GPT_OSS && c.attn_sinks && c.expert_bias && c.router_bias && c.attn_qkv_bias &&
              c.attn_o_bias && c.expert_act == MOE_ACT_SWIGLU_OAI && c.swiglu_alpha == 1.702f &&
              c.swiglu_limit == 7.0f && c.norm_topk_prob == 1 && c.rope.theta == 150000.0f,
          "gpt-oss defaults");
    CHECK(c.sliding_window == 5 && c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[2],
          "gpt-oss: even layers slide without layer_types");
    moe_config_clear(&c);
    snprintf(buf, sizeof buf,
             "{%s,\"swiglu_limit\":3,\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":32.0,"
             "\"original_max_position_embeddings\":4096,\"truncate\":false},"
             "\"quantization_config\":{\"quant_method\":\"mxfp4\"}}",
             base);
    CHECK(parse(buf, &c) == MOE_OK && c.swiglu_limit == 3.0f && c.rope.kind == MOE_ROPE_YARN && !c.rope.truncate &&
              fabsf(c.rope.attention_factor - (float)(0.1 * log(32.0) + 1)) < 1e-6f,
          "gpt-oss yarn without truncation, mxfp4 accepted: %s", last_log);
    moe_config_clear(&c);
    snprintf(buf, sizeof buf, "{%s,\"swiglu_limit\":0}", base);
    CHECK(parse(buf, &c) == MOE_ERR_INVALID && strstr(last_log, "swiglu_limit"), "limit 0: %s", last_log);
    test_fp8_config();
    CHECK(parse("{" MIXTRAL_BASE ",\"quantization_config\":{\"quant_method\":\"mxfp4\"}}", &c) ==
              MOE_ERR_UNSUPPORTED && strstr(last_log, "mxfp4"),
          "mxfp4 only for gpt-oss: %s", last_log);
}

/* --- model binding on a synthetic checkpoint ------------------------------ */

/* write_checkpoint_cfg: config.json (the given text) and an all-zero F32
 * model.safetensors in dir. */
static void write_checkpoint_cfg(const char *dir, const char *config, const struct tensor_spec *ts, int n) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(config, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(moe_test_write_safetensors(path, ts, n, 0) == 0, "write %s", path);
}

/* write_checkpoint: config.json and an all-zero F32 model.safetensors in dir. */
static void write_checkpoint(const char *dir, const struct tensor_spec *ts, int n) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{" MIXTRAL_BASE "}");
    fclose(f);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(moe_test_write_safetensors(path, ts, n, 0) == 0, "write %s", path);
}

static void test_binding(void) {
    char dir[] = "/tmp/moe-test-config-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    struct tensor_spec ts[128];
    int n = moe_test_mixtral_specs(ts, 2, 3, 8, 6, 32, 2, 1);
    struct moe_model *m = NULL;

    write_checkpoint(dir, ts, n);
    CHECK(moe_model_load_hf(dir, &m) == MOE_OK, "valid synthetic checkpoint: %s", last_log);
    if (m) {
        CHECK(moe_model_n_params(m) == 32 * 8 * 2 + 2 * (8 * 8 * 2 + 4 * 8 * 2 + 3 * 8 + 3 * 3 * 6 * 8),
              "param count %lld", (long long)moe_model_n_params(m));
        struct moe_ffn f;
        CHECK(moe_model_expert(m, 1, 2, -1, &f) == MOE_OK && f.down.n_out == 8 && f.down.n_in == 6, "expert view");
        CHECK(moe_model_expert(m, 1, 2, 0, &f) == MOE_ERR_INVALID, "a checkpoint has no stored precision 0");
    }
    moe_model_free(m);
    m = NULL;

    /* wrong shape: the message names the tensor and both shapes */
    struct tensor_spec bad[128];
    memcpy(bad, ts, sizeof bad);
    for (int i = 0; i < n; i++)
        if (!strcmp(bad[i].name, "model.layers.1.block_sparse_moe.experts.2.w2.weight")) bad[i].d[1] = 5;
    write_checkpoint(dir, bad, n);
    last_log[0] = 0;
    CHECK(moe_model_load_hf(dir, &m) == MOE_ERR_SHAPE &&
              strstr(last_log, "model.layers.1.block_sparse_moe.experts.2.w2.weight") &&
              strstr(last_log, "[8, 5]") && strstr(last_log, "[8, 6]"),
          "wrong shape message: %s", last_log);
    CHECK(m == NULL, "no model on error");

    /* missing tensor */
    write_checkpoint(dir, ts, n - 1); /* drops the last expert's w3 of layer 1 */
    last_log[0] = 0;
    CHECK(moe_model_load_hf(dir, &m) == MOE_ERR_NOT_FOUND && strstr(last_log, ts[n - 1].name),
          "missing tensor message: %s", last_log);

    /* issue 17: every tensor of the checkpoint is bound. A config with fewer
     * layers than the checkpoint, or an unknown tensor, is refused naming one
     * of them; a rotary inv_freq cache is deliberately ignored. */
    write_checkpoint_cfg(dir,
                         "{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
                         "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
                         "\"intermediate_size\":6,\"num_local_experts\":3,\"num_experts_per_tok\":2}",
                         ts, n);
    last_log[0] = 0;
    CHECK(moe_model_load_hf(dir, &m) == MOE_ERR_SHAPE && strstr(last_log, "model.layers.1.") &&
              strstr(last_log, "does not account for"),
          "config with fewer layers than the checkpoint: %s", last_log);
    CHECK(m == NULL, "no model on error");
    memcpy(bad, ts, sizeof bad);
    snprintf(bad[n].name, sizeof bad[n].name, "model.layers.0.mlp.extra.weight");
    bad[n].n_dims = 1, bad[n].d[0] = 8;
    write_checkpoint(dir, bad, n + 1);
    last_log[0] = 0;
    CHECK(moe_model_load_hf(dir, &m) == MOE_ERR_SHAPE && strstr(last_log, "model.layers.0.mlp.extra.weight"),
          "an unknown tensor is refused: %s", last_log);
    snprintf(bad[n].name, sizeof bad[n].name, "model.layers.0.self_attn.rotary_emb.inv_freq");
    bad[n].d[0] = 2;
    write_checkpoint(dir, bad, n + 1);
    CHECK(moe_model_load_hf(dir, &m) == MOE_OK, "a rotary inv_freq cache is ignored: %s", last_log);
    moe_model_free(m);
    m = NULL;

    /* not a directory */
    CHECK(moe_model_load_hf("/nonexistent/model", &m) != MOE_OK, "missing dir");

    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

/* --- block-scaled FP8 weights bound on a synthetic checkpoint ------------- */

/* One tensor of a hand-made safetensors file: dtype, shape and its bytes. */
struct st_entry {
    char name[128];
    const char *dtype; /* "F32", "F8_E4M3", ... */
    int n_dims;
    long long d[2];
    unsigned char *data; /* owned; NULL = zeros */
    size_t nbytes;
};

/* write_entries: a safetensors file of the entries, in order. 0 on success. */
static int write_entries(const char *path, const struct st_entry *t, int n) {
    size_t cap = 256 + (size_t)n * 200, len = 0, off = 0;
    char *hdr = malloc(cap);
    FILE *f = hdr ? fopen(path, "wb") : NULL;
    if (!f) {
        free(hdr);
        return -1;
    }
    len += (size_t)snprintf(hdr, cap, "{");
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
                                t[i].name, t[i].dtype);
        for (int k = 0; k < t[i].n_dims; k++)
            len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", k ? "," : "", t[i].d[k]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
        off += t[i].nbytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    unsigned char n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((unsigned long long)len >> (8 * i));
    fwrite(n8, 1, 8, f);
    fwrite(hdr, 1, len, f);
    for (int i = 0; i < n; i++) {
        if (t[i].data) {
            fwrite(t[i].data, 1, t[i].nbytes, f);
        } else {
            for (size_t k = 0; k < t[i].nbytes; k++) fputc(0, f);
        }
    }
    int bad = ferror(f);
    bad |= fclose(f);
    free(hdr);
    return bad ? -1 : 0;
}

/* e4m3_value: an e4m3fn code's value from the format's definition (ldexp). */
static float e4m3_value(unsigned c) {
    const int e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return (float)(c & 0x80 ? -v : v);
}

#define FP8_B0 4 /* the block: 4 rows x 3 columns, so 6 x 8 and 8 x 6 weights end in partial blocks */
#define FP8_B1 3
#define FP8_MIXTRAL_CFG(q)                                                                  \
    "{" MIXTRAL_BASE ",\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\","    \
    "\"activation_scheme\":\"dynamic\",\"weight_block_size\":" q "}}"

/* fp8_entries: the tensors of a two-layer Mixtral whose projections and
 * experts are F8_E4M3 (seeded codes, never NaN) with an F32 _scale_inv each
 * (block k of a weight gets 0.25 + 0.125 k); embeddings, norms, router and
 * lm_head F32 zeros. Returns the count; free the data with free_entries. */
static int fp8_entries(struct st_entry *t) {
    struct tensor_spec ts[64];
    const int n_spec = moe_test_mixtral_specs(ts, 2, 3, 8, 6, 32, 2, 1);
    int n = 0;
    uint32_t s = 12345;
    for (int i = 0; i < n_spec; i++) {
        const int fp8 = ts[i].n_dims == 2 && (strstr(ts[i].name, "self_attn") || strstr(ts[i].name, "experts"));
        struct st_entry *e = &t[n++];
        snprintf(e->name, sizeof e->name, "%.95s", ts[i].name);
        e->n_dims = ts[i].n_dims;
        e->d[0] = ts[i].d[0], e->d[1] = ts[i].n_dims == 2 ? ts[i].d[1] : 1;
        const size_t elems = (size_t)(e->d[0] * e->d[1]);
        e->dtype = fp8 ? "F8_E4M3" : "F32";
        e->nbytes = elems * (fp8 ? 1 : 4);
        e->data = NULL;
        if (!fp8) continue;
        e->data = malloc(elems);
        for (size_t k = 0; k < elems; k++) {
            s = s * 1103515245u + 12345u;
            unsigned c = (s >> 16) & 0xff;
            e->data[k] = (unsigned char)((c & 0x7f) == 0x7f ? c - 1 : c);
        }
        struct st_entry *sc = &t[n++];
        snprintf(sc->name, sizeof sc->name, "%.95s_scale_inv", ts[i].name);
        sc->dtype = "F32", sc->n_dims = 2;
        sc->d[0] = (e->d[0] + FP8_B0 - 1) / FP8_B0, sc->d[1] = (e->d[1] + FP8_B1 - 1) / FP8_B1;
        sc->nbytes = (size_t)(sc->d[0] * sc->d[1]) * 4;
        sc->data = malloc(sc->nbytes);
        for (long long k = 0; k < sc->d[0] * sc->d[1]; k++) {
            float v = 0.25f + 0.125f * (float)k;
            memcpy(sc->data + 4 * k, &v, 4);
        }
    }
    return n;
}

static void free_entries(struct st_entry *t, int n) {
    for (int i = 0; i < n; i++) free(t[i].data);
}

/* find_entry: the entry named `name`. */
static struct st_entry *find_entry(struct st_entry *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

/* weight_matches: a bound weight equals e4m3(code) x its block's scale at
 * every element (computed here from the definition). */
static int weight_matches(const struct moe_weight *w, const struct st_entry *q, const struct st_entry *sc) {
    if (!w->data || w->type != MOE_QTYPE_F32 || w->n_out != q->d[0] || w->n_in != q->d[1]) return 0;
    const float *f = w->data;
    for (long long r = 0; r < q->d[0]; r++)
        for (long long c = 0; c < q->d[1]; c++) {
            float s;
            memcpy(&s, sc->data + 4 * ((r / FP8_B0) * sc->d[1] + c / FP8_B1), 4);
            if (f[r * q->d[1] + c] != e4m3_value(q->data[r * q->d[1] + c]) * s) return 0;
        }
    return 1;
}

/* write_fp8: config.json (text) and model.safetensors (entries) in dir. */
static void write_fp8(const char *dir, const char *config, const struct st_entry *t, int n) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(config, f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(write_entries(path, t, n) == 0, "write %s", path);
}

/* expect_fp8_refused: loading dir fails with st and a message holding want. */
static void expect_fp8_refused(const char *dir, const char *what, enum moe_status want_st, const char *want) {
    struct moe_model *m = NULL;
    last_log[0] = 0;
    enum moe_status st = moe_model_load_hf(dir, &m);
    CHECK(st == want_st && m == NULL && strstr(last_log, want), "%s: status %d, log: %s", what, (int)st, last_log);
    moe_model_free(m);
}

static void test_fp8_binding(void) {
    char dir[] = "/tmp/moe-test-fp8-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    struct st_entry t[128];
    int n = fp8_entries(t);
    const char *cfg = FP8_MIXTRAL_CFG("[4,3]");
    write_fp8(dir, cfg, t, n);
    struct moe_model *m = NULL;
    CHECK(moe_model_load_hf(dir, &m) == MOE_OK, "FP8 checkpoint loads: %s", last_log);
    if (m) {
        const char *q = "model.layers.0.self_attn.q_proj.weight",
                   *qs = "model.layers.0.self_attn.q_proj.weight_scale_inv";
        CHECK(weight_matches(&m->layers[0].wq, find_entry(t, n, q), find_entry(t, n, qs)),
              "q_proj [8 x 8] dequantized block by block (partial last column block)");
        struct moe_ffn f;
        CHECK(moe_model_expert(m, 0, 2, -1, &f) == MOE_OK, "expert view");
        CHECK(weight_matches(&f.gate, find_entry(t, n, "model.layers.0.block_sparse_moe.experts.2.w1.weight"),
                             find_entry(t, n, "model.layers.0.block_sparse_moe.experts.2.w1.weight_scale_inv")) &&
                  weight_matches(&f.down, find_entry(t, n, "model.layers.0.block_sparse_moe.experts.2.w2.weight"),
                                 find_entry(t, n, "model.layers.0.block_sparse_moe.experts.2.w2.weight_scale_inv")),
              "expert 2's w1 [6 x 8] and w2 [8 x 6] dequantized (partial row and column blocks)");
        CHECK(m->layers[0].router.type == MOE_QTYPE_F32, "the router stays as stored");
    }
    moe_model_free(m);

    /* must-reject rows: each damages one thing of the valid checkpoint */
    struct st_entry *w1 = find_entry(t, n, "model.layers.0.block_sparse_moe.experts.1.w1.weight");
    struct st_entry *s1 = find_entry(t, n, "model.layers.0.block_sparse_moe.experts.1.w1.weight_scale_inv");
    write_fp8(dir, FP8_MIXTRAL_CFG("[4,4]"), t, n); /* [6 x 8] in 4 x 4 blocks needs [2, 2] scales, not [2, 3] */
    expect_fp8_refused(dir, "scales of another block size", MOE_ERR_SHAPE, "needs [2, 2]");
    write_fp8(dir, FP8_MIXTRAL_CFG("[0,3]"), t, n);
    expect_fp8_refused(dir, "block size 0", MOE_ERR_INVALID, "weight_block_size");
    write_fp8(dir, "{" MIXTRAL_BASE "}", t, n);
    expect_fp8_refused(dir, "F8 tensors without an fp8 quantization_config", MOE_ERR_FORMAT, "quant_method");

    long long d1 = s1->d[1];
    s1->d[1] = 2, s1->nbytes = (size_t)(s1->d[0] * 2) * 4;
    write_fp8(dir, cfg, t, n);
    expect_fp8_refused(dir, "scale shape [2, 2] for [6 x 8] in 4 x 3", MOE_ERR_SHAPE, "experts.1.w1.weight_scale_inv");
    s1->d[1] = d1, s1->nbytes = (size_t)(s1->d[0] * d1) * 4;

    s1->dtype = "U8", s1->nbytes /= 4;
    write_fp8(dir, cfg, t, n);
    expect_fp8_refused(dir, "U8 scales", MOE_ERR_FORMAT, "must be F32, BF16 or F16");
    s1->dtype = "F32", s1->nbytes *= 4;

    static const float k_bad_scale[] = {0.0f, -0.5f, NAN, INFINITY};
    float keep;
    memcpy(&keep, s1->data + 4 * 3, 4);
    for (size_t i = 0; i < sizeof k_bad_scale / sizeof k_bad_scale[0]; i++) {
        memcpy(s1->data + 4 * 3, &k_bad_scale[i], 4);
        write_fp8(dir, cfg, t, n);
        expect_fp8_refused(dir, "a scale that is not finite and positive", MOE_ERR_RANGE, "finite and positive");
    }
    memcpy(s1->data + 4 * 3, &keep, 4);

    unsigned char code = w1->data[5];
    for (unsigned nan = 0x7f; nan <= 0xff; nan += 0x80) {
        w1->data[5] = (unsigned char)nan;
        write_fp8(dir, cfg, t, n);
        expect_fp8_refused(dir, "a NaN code", MOE_ERR_RANGE, "NaN code");
    }
    w1->data[5] = code;

    /* the weight without its scale: drop the scale entry */
    struct st_entry u[128];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (&t[i] != s1) u[k++] = t[i];
    write_fp8(dir, cfg, u, k);
    expect_fp8_refused(dir, "FP8 weight without its scale", MOE_ERR_NOT_FOUND, "has no block scales");

    /* a scale beside a weight that is not F8_E4M3 */
    k = 0;
    for (int i = 0; i < n; i++) u[k++] = t[i];
    struct st_entry *router = find_entry(u, k, "model.layers.0.block_sparse_moe.gate.weight");
    u[k] = *s1;
    snprintf(u[k].name, sizeof u[k].name, "%.95s_scale_inv", router->name);
    k++;
    write_fp8(dir, cfg, u, k);
    expect_fp8_refused(dir, "a scale for an F32 weight", MOE_ERR_FORMAT, "not F8_E4M3");

    /* a 1-D F8 tensor (a norm) is not a block-scaled weight */
    k = 0;
    for (int i = 0; i < n; i++) u[k++] = t[i];
    struct st_entry *norm = find_entry(u, k, "model.norm.weight");
    norm->dtype = "F8_E4M3", norm->nbytes /= 4;
    write_fp8(dir, cfg, u, k);
    expect_fp8_refused(dir, "a 1-D F8 tensor", MOE_ERR_UNSUPPORTED, "only 2-D");

    free_entries(t, n);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    moe_log_set(capture, NULL);
    test_arch_table();
    test_arches();
    test_errors();
    test_deepseek();
    test_gpt_oss();
    test_binding();
    test_fp8_binding();
    printf("test-config: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}

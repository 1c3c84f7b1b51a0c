/*
 * fuzz-config-gen.h - config.json texts built from fuzz-input choices, for
 * fuzz-model.c (the config of a recipe's bundle) and fuzz-config.c (its
 * structure-aware mutator): one of the eight families with small shapes, the
 * family's options (shared experts, dense layers, biases, sliding windows,
 * group routing, MLA ranks, ...), one of six RoPE forms, then edits that set a
 * key the parser reads to a boundary value or remove it. Every default choice
 * gives a config that parses (docs/fuzzing.md, "Reaching the readers from
 * nothing").
 */
#ifndef MOE_FUZZ_CONFIG_GEN_H
#define MOE_FUZZ_CONFIG_GEN_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fuzz-src.h"
#include "moe-model.h"

/* A config.json as an ordered list of keys and JSON value texts. */
#define CFG_MAX 48
struct jcfg {
    int n;
    const char *key[CFG_MAX];
    char val[CFG_MAX][768];
};

static inline void jset(struct jcfg *j, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void jset(struct jcfg *j, const char *key, const char *fmt, ...) {
    int i = 0;
    while (i < j->n && strcmp(j->key[i], key)) i++;
    if (i == CFG_MAX) return;
    if (i == j->n) j->key[j->n++] = key;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->val[i], sizeof j->val[i], fmt, ap);
    va_end(ap);
}

static inline void jdel(struct jcfg *j, const char *key) {
    for (int i = 0; i < j->n; i++)
        if (!strcmp(j->key[i], key)) {
            for (int k = i + 1; k < j->n; k++) {
                j->key[k - 1] = j->key[k];
                memcpy(j->val[k - 1], j->val[k], sizeof j->val[k]);
            }
            j->n--;
            return;
        }
}

/* jtext_size: the bytes jtext writes, its NUL included. */
static inline size_t jtext_size(const struct jcfg *j) {
    size_t n = 3;
    for (int i = 0; i < j->n; i++) n += strlen(j->key[i]) + strlen(j->val[i]) + 4;
    return n;
}

/* jtext: the config as JSON text {"key":value,...} into t (jtext_size bytes). */
static inline void jtext(const struct jcfg *j, char *t) {
    char *p = t;
    *p++ = '{';
    for (int i = 0; i < j->n; i++) p += sprintf(p, "%s\"%s\":%s", i ? "," : "", j->key[i], j->val[i]);
    *p++ = '}';
    *p = 0;
}

/* Every config.json key the parser reads (runtime/model/config.c, arch-*.c). */
static const char *const k_cfg_keys[] = {
    "architectures", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "num_local_experts",
    "num_experts", "n_routed_experts", "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace",
    "decoder_sparse_step", "mlp_only_layers", "max_window_layers", "layer_types", "sliding_window",
    "use_sliding_window", "max_position_embeddings", "original_max_position_embeddings", "rms_norm_eps",
    "rope_theta", "rope_parameters", "rope_scaling", "partial_rotary_factor", "rope_interleave",
    "tie_word_embeddings", "bos_token_id", "eos_token_id", "norm_topk_prob", "attention_bias", "qkv_bias",
    "lm_head_bias", "mlp_bias", "clip_qkv", "router_jitter_noise", "kv_lora_rank", "q_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "topk_method", "n_group", "topk_group",
    "routed_scaling_factor", "swiglu_alpha", "swiglu_limit", "quantization_config",
};

/* Boundary values for those keys; the last entry removes the key. */
static const char *const k_cfg_vals[] = {
    "0", "1", "2", "3", "4", "5", "7", "8", "16", "31", "33", "64", "-1", "65536", "2147483647", "2147483648",
    "1e30", "1e-30", "0.5", "-0.5", "1.5", "null", "true", "false", "\"x\"", "[]", "{}", "[0]", "[1,2]", "[0,1,2,3]",
    "[\"sliding_attention\",\"full_attention\"]", "\"greedy\"", "\"group_limited_greedy\"",
    "{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":8}",
    "{\"rope_type\":\"longrope\",\"short_factor\":[1],\"long_factor\":[2]}", "{\"rope_type\":\"linear\",\"factor\":0}",
    "{\"rope_type\":\"dynamic\"}",
    "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4,\"high_freq_factor\":1}",
    "{\"quant_method\":\"fp8\",\"weight_block_size\":[32,32]}", "{\"quant_method\":\"mxfp4\"}",
    "[\"MixtralForCausalLM\"]", "[\"DeepseekV3ForCausalLM\"]", "[\"NoSuchForCausalLM\"]", "[1]", NULL,
};

static const char *const k_class[MOE_ARCH_COUNT] = {
    "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM",
    "PhimoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "GptOssForCausalLM",
};

/* config_json: a config.json for one of the families from the recipe's
 * choices; returns the family. Every default choice gives a valid config. */
static inline int config_json(struct fz_src *s, struct jcfg *j) {
    static const int k_hf[5][2] = {{32, 32}, {64, 32}, {32, 64}, {64, 64}, {256, 256}};
    const int arch = (int)fz_pick(s, MOE_ARCH_COUNT, 0), hf = (int)fz_pick(s, 5, 0);
    const int H = k_hf[hf][0], F = k_hf[hf][1], V = (int[]){32, 16, 64}[fz_pick(s, 3, 0)];
    int L = 1 + (int)fz_pick(s, 3, 1), E = (int[]){4, 2, 8}[fz_pick(s, 3, 0)];
    if (hf == 4) L = 1, E = 2; /* the k-quant shapes: keep the image small */
    int K = 1 + (int)fz_pick(s, (unsigned)E, 1);
    const int nh = (int[]){2, 4, 1}[fz_pick(s, 3, 0)], div = (int[]){1, 2, 4}[fz_pick(s, 3, 0)];
    int nkv = nh % div == 0 ? nh / div : nh;
    const int hd = (int[]){0, 8, 16}[fz_pick(s, 3, 0)];
    const int D = (int[]){64, 32}[fz_pick(s, 2, 0)], S = (int[]){32, 64}[fz_pick(s, 2, 0)];
    const int kvr = (int[]){32, 16}[fz_pick(s, 2, 0)], qr = (int[]){32, 16, 0}[fz_pick(s, 3, 0)];
    const int nope = (int[]){8, 4}[fz_pick(s, 2, 0)], rope = (int[]){4, 8, 2}[fz_pick(s, 3, 0)];
    const int vd = (int[]){8, 4}[fz_pick(s, 2, 0)];
    const unsigned flags = fz_byte(s), rope_kind = fz_pick(s, 6, 0);
    const int mla = arch == MOE_ARCH_DEEPSEEK_V2 || arch == MOE_ARCH_DEEPSEEK_V3;
    if (arch == MOE_ARCH_PHIMOE) K = 2;
    if (mla) nkv = nh;
    j->n = 0;
    jset(j, "architectures", "[\"%s\"]", k_class[arch]);
    jset(j, "vocab_size", "%d", V);
    jset(j, "hidden_size", "%d", H);
    jset(j, "num_hidden_layers", "%d", L);
    jset(j, "num_attention_heads", "%d", nh);
    jset(j, "num_key_value_heads", "%d", nkv);
    jset(j, "max_position_embeddings", "64");
    jset(j, "rms_norm_eps", "1e-05");
    jset(j, "bos_token_id", "1");
    jset(j, "eos_token_id", flags & 128 ? "[2,3]" : "2");
    jset(j, "tie_word_embeddings", flags & 1 ? "true" : "false");
    if (hd && !mla) jset(j, "head_dim", "%d", hd);
    const char *experts_key = arch == MOE_ARCH_QWEN2_MOE || arch == MOE_ARCH_QWEN3_MOE || arch == MOE_ARCH_OLMOE
                                  ? "num_experts"
                                  : mla ? "n_routed_experts" : "num_local_experts";
    jset(j, experts_key, "%d", E);
    jset(j, "num_experts_per_tok", "%d", K);
    const int moe_ff = arch == MOE_ARCH_QWEN2_MOE || arch == MOE_ARCH_QWEN3_MOE || mla;
    jset(j, "intermediate_size", "%d", moe_ff ? D : F);
    if (moe_ff) jset(j, "moe_intermediate_size", "%d", F);
    switch (arch) {
    case MOE_ARCH_QWEN2_MOE:
        jset(j, "shared_expert_intermediate_size", "%d", flags & 2 ? 0 : S);
        jset(j, "qkv_bias", flags & 2 ? "false" : "true");
        /* fall through */
    case MOE_ARCH_QWEN3_MOE:
        if (arch == MOE_ARCH_QWEN3_MOE) jset(j, "attention_bias", flags & 2 ? "true" : "false");
        jset(j, "norm_topk_prob", flags & 8 ? "true" : "false");
        jset(j, "decoder_sparse_step", "1");
        jset(j, "mlp_only_layers", flags & 4 && L > 1 ? "[1]" : "[]");
        if (flags & 16) {
            jset(j, "use_sliding_window", "true");
            jset(j, "sliding_window", "4");
            jset(j, "max_window_layers", "%d", L);
        }
        break;
    case MOE_ARCH_OLMOE:
        jset(j, "attention_bias", flags & 2 ? "true" : "false");
        if (flags & 64) jset(j, "clip_qkv", "1.5");
        break;
    case MOE_ARCH_PHIMOE:
        jset(j, "attention_bias", flags & 2 ? "false" : "true");
        jset(j, "lm_head_bias", flags & 32 ? "false" : "true");
        jset(j, "router_jitter_noise", "0.01");
        if (flags & 16) jset(j, "sliding_window", "4");
        break;
    case MOE_ARCH_DEEPSEEK_V2:
    case MOE_ARCH_DEEPSEEK_V3: {
        const int v3 = arch == MOE_ARCH_DEEPSEEK_V3, groups = E >= 4 ? 2 : 1;
        jset(j, "n_shared_experts", "%d", flags & 2 ? 0 : 1);
        jset(j, "first_k_dense_replace", "%d", flags & 4 ? 1 : 0);
        jset(j, "kv_lora_rank", "%d", kvr);
        if (qr) jset(j, "q_lora_rank", "%d", qr);
        else jset(j, "q_lora_rank", "null");
        jset(j, "qk_nope_head_dim", "%d", nope);
        jset(j, "qk_rope_head_dim", "%d", rope);
        jset(j, "v_head_dim", "%d", vd);
        if (!v3) jset(j, "topk_method", flags & 32 ? "\"group_limited_greedy\"" : "\"greedy\"");
        if (v3 || flags & 32) {
            jset(j, "n_group", "%d", groups);
            jset(j, "topk_group", "%d", groups);
        }
        jset(j, "routed_scaling_factor", v3 ? "2.5" : "1.0");
        if (v3) jset(j, "norm_topk_prob", flags & 8 ? "false" : "true");
        if (v3) jset(j, "rope_interleave", flags & 64 ? "false" : "true");
        break;
    }
    case MOE_ARCH_GPT_OSS: {
        char lt[512] = "[";
        for (int l = 0; l < L; l++)
            snprintf(lt + strlen(lt), sizeof lt - strlen(lt), "%s\"%s\"", l ? "," : "",
                     !(flags & 16) && l % 2 == 0 ? "sliding_attention" : "full_attention");
        jset(j, "layer_types", "%s]", lt);
        jset(j, "sliding_window", "4");
        jset(j, "swiglu_limit", "7.0");
        break;
    }
    default: break;
    }
    /* RoPE: none, default, linear, yarn, llama3 or longrope */
    const int rope_head = mla ? rope : hd ? hd : H / nh;
    switch (rope_kind) {
    case 0: jset(j, "rope_theta", "10000.0"); break;
    case 1: jset(j, "rope_parameters", "{\"rope_theta\":10000.0,\"rope_type\":\"default\"}"); break;
    case 2: jset(j, "rope_parameters", "{\"rope_theta\":10000.0,\"rope_type\":\"linear\",\"factor\":2.0}"); break;
    case 3:
        jset(j, "rope_parameters",
             "{\"rope_theta\":10000.0,\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":16,"
             "\"beta_fast\":32,\"beta_slow\":1%s}",
             mla ? ",\"mscale\":1.0,\"mscale_all_dim\":0.8" : arch == MOE_ARCH_GPT_OSS ? ",\"truncate\":false" : "");
        break;
    case 4:
        jset(j, "rope_parameters", "{\"rope_theta\":10000.0,\"rope_type\":\"llama3\",\"factor\":8.0,"
                                   "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                                   "\"original_max_position_embeddings\":16}");
        break;
    default: {
        char sf[320] = "", lf[320] = "";
        for (int i = 0; i < rope_head / 2 && i < 40; i++) {
            snprintf(sf + strlen(sf), sizeof sf - strlen(sf), "%s%g", i ? "," : "", 1.0 + 0.1 * i);
            snprintf(lf + strlen(lf), sizeof lf - strlen(lf), "%s%g", i ? "," : "", 1.5 + 0.5 * i);
        }
        jset(j, "original_max_position_embeddings", "16");
        jset(j, "rope_parameters",
             "{\"rope_theta\":10000.0,\"rope_type\":\"longrope\",\"short_factor\":[%s],\"long_factor\":[%s],"
             "\"short_mscale\":1.1,\"long_mscale\":1.25}",
             sf, lf);
    }
    }
    /* edits: a key from the parser's list set to a boundary value, or removed */
    const unsigned n_keys = sizeof k_cfg_keys / sizeof k_cfg_keys[0], n_vals = sizeof k_cfg_vals / sizeof k_cfg_vals[0];
    for (unsigned n = fz_pick(s, 4, 0), i = 0; i < n; i++) {
        const char *key = k_cfg_keys[fz_byte(s) % n_keys], *v = k_cfg_vals[fz_byte(s) % n_vals];
        if (v) jset(j, key, "%s", v);
        else jdel(j, key);
    }
    return arch;
}

#endif

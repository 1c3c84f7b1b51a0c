/*
 * fuzz-config.c - libFuzzer target for config.json (moe_config_parse) and
 * generation_config.json (moe_config_add_generation), runtime/model/config.c.
 *
 * Byte 0 even: the rest is a config.json. On success every promise of the
 * description is checked, and any broken one aborts (the fuzzer reports it):
 * shapes positive, heads divisible, top-k within the experts, every constant
 * finite and in range (norm epsilon and RoPE theta > 0, factors > 0, mscales
 * > 0), the per-layer arrays present, the RoPE dims even and within head_dim,
 * BOS and EOS ids inside the vocabulary, the longrope factor lists of n_rot/2
 * positive numbers. Byte 0 odd: the rest is a generation_config.json applied
 * to a fixed valid config; every EOS id kept must be in the vocabulary and
 * distinct.
 *
 * From an empty corpus random JSON rarely names the fields the parser needs,
 * so the libFuzzer build adds a structure-aware mutator
 * (LLVMFuzzerCustomMutator): now and then it writes a whole config of one of
 * the eight families (fuzz-config-gen.h, the generator fuzz-model's recipes
 * use; its choices from the mutator's seed) or a generation_config, or puts a
 * key the parser reads, with a boundary value, first in the object; otherwise
 * libFuzzer's own mutations, with fuzz-config.dict (every key the parser
 * reads, the values it compares with) when given -dict. The input format is
 * unchanged, so the replay test needs none of this.
 *
 * Build with -DMOE_BUILD_FUZZ=ON (clang; docs/fuzzing.md), then
 *   build-fuzz/tests/fuzz-config -max_total_time=600 -jobs=1 -dict=tests/fuzz/fuzz-config.dict \
 *       /tmp/config-corpus tests/fuzz/corpus/config
 * The seeds in tests/fuzz/corpus/config are the fixture models' config.json
 * files (prefixed with byte 0), a few variants, and fuzz-* inputs found by
 * runs from an empty corpus; ctest replays them (fuzz-config-replay).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-config-gen.h"
#include "moe-model.h"

static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

#define REQUIRE(x)              \
    do {                        \
        if (!(x)) abort();      \
    } while (0)

/* check: the promises of a parsed description. */
static void check(const struct moe_config *c) {
    REQUIRE(c->n_vocab >= 1 && c->n_embd >= 1 && c->n_layer >= 1 && c->n_head >= 1 && c->n_head_kv >= 1);
    REQUIRE(c->n_head % c->n_head_kv == 0 && c->head_dim >= 1);
    if (c->attn == MOE_ATTN_MLA) /* RoPE on the rope part only: the no-RoPE part may be odd */
        REQUIRE(c->n_head_kv == c->n_head && c->kv_lora_rank >= 1 && c->q_lora_rank >= 0 && c->qk_nope_dim >= 1 &&
                c->qk_rope_dim >= 2 && c->qk_rope_dim % 2 == 0 && c->v_head_dim >= 1 &&
                c->head_dim == c->qk_nope_dim + c->qk_rope_dim);
    else
        REQUIRE(c->head_dim % 2 == 0);
    REQUIRE(isfinite(c->attn_scale) && c->attn_scale > 0);
    REQUIRE(isfinite(c->routed_scale) && c->routed_scale > 0);
    REQUIRE(c->n_group >= 1 && c->topk_group >= 1 && c->topk_group <= c->n_group && c->n_expert % c->n_group == 0);
    if (c->expert_act == MOE_ACT_SWIGLU_OAI)
        REQUIRE(isfinite(c->swiglu_alpha) && isfinite(c->swiglu_limit) && c->swiglu_limit > 0);
    REQUIRE(c->n_expert >= 1 && c->n_expert_used >= 1 && c->n_expert_used <= c->n_expert);
    REQUIRE(c->n_ff_expert >= 1 && c->n_ff_dense >= 0 && c->n_ff_shared >= 0 && c->max_pos >= 1);
    REQUIRE(isfinite(c->norm_eps) && c->norm_eps > 0);
    REQUIRE(isfinite(c->clip_qkv) && c->clip_qkv >= 0 && isfinite(c->router_jitter) && c->router_jitter >= 0);
    const struct moe_rope *r = &c->rope;
    REQUIRE(isfinite(r->theta) && r->theta > 0 && r->n_rot >= 0 && r->n_rot % 2 == 0 && r->n_rot <= c->head_dim);
    REQUIRE(isfinite(r->factor) && r->factor > 0 && isfinite(r->attention_factor) && r->attention_factor > 0);
    if (r->kind == MOE_ROPE_YARN)
        REQUIRE(r->original_max_pos >= 1 && isfinite(r->beta_fast) && r->beta_fast > 0 && isfinite(r->beta_slow) &&
                r->beta_slow > 0);
    if (r->kind == MOE_ROPE_LLAMA3)
        REQUIRE(r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor && r->original_max_pos >= 1);
    if (r->kind == MOE_ROPE_LONGROPE) {
        REQUIRE(r->short_factor && r->long_factor && r->original_max_pos >= 1);
        for (int i = 0; i < r->n_rot / 2; i++)
            REQUIRE(r->short_factor[i] > 0 && isfinite(r->short_factor[i]) && r->long_factor[i] > 0 &&
                    isfinite(r->long_factor[i]));
        if (r->has_mscale)
            REQUIRE(isfinite(r->short_mscale) && r->short_mscale > 0 && isfinite(r->long_mscale) &&
                    r->long_mscale > 0);
    }
    REQUIRE(c->layer_moe && c->layer_sliding);
    int any_dense = 0, any_sliding = 0;
    for (int l = 0; l < c->n_layer; l++) {
        REQUIRE(c->layer_moe[l] <= 1 && c->layer_sliding[l] <= 1);
        any_dense |= !c->layer_moe[l];
        any_sliding |= c->layer_sliding[l];
    }
    REQUIRE(!any_dense || c->n_ff_dense >= 1);
    REQUIRE(c->sliding_window >= 0 && (any_sliding ? c->sliding_window > 0 : c->sliding_window == 0));
    REQUIRE(c->bos_id == -1 || (c->bos_id >= 0 && c->bos_id < c->n_vocab));
    REQUIRE(c->n_eos >= 0 && c->n_eos <= MOE_MAX_EOS);
    for (int i = 0; i < c->n_eos; i++) REQUIRE(c->eos_ids[i] >= 0 && c->eos_ids[i] < c->n_vocab);
}

static const char k_valid[] =
    "{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":64,\"hidden_size\":16,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":32,\"num_local_experts\":4,"
    "\"num_experts_per_tok\":2,\"bos_token_id\":1,\"eos_token_id\":2}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        moe_log_set(quiet, NULL);
        init = 1;
    }
    if (size < 1) return 0;
    struct moe_config c;
    if (data[0] % 2 == 0) {
        if (moe_config_parse((const char *)data + 1, size - 1, "fuzz", &c) == MOE_OK) {
            check(&c);
            moe_config_clear(&c);
        }
        return 0;
    }
    if (moe_config_parse(k_valid, sizeof k_valid - 1, "valid", &c) != MOE_OK) abort();
    moe_config_add_generation(&c, (const char *)data + 1, size - 1);
    check(&c);
    for (int i = 0; i < c.n_eos; i++)
        for (int j = 0; j < i; j++) REQUIRE(c.eos_ids[i] != c.eos_ids[j]);
    moe_config_clear(&c);
    return 0;
}

#ifdef MOE_LIBFUZZER
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

static uint64_t next(uint64_t *r) {
    *r ^= *r << 13;
    *r ^= *r >> 7;
    *r ^= *r << 17;
    return *r;
}

/* whole: a config.json (byte 0 even) from the generator, its choices drawn
 * from r (each zero half the time: the family's defaults), or a
 * generation_config (byte 0 odd); 0 if it does not fit. */
static size_t whole(uint8_t *data, size_t max_size, uint64_t *r) {
    static struct jcfg j;
    uint8_t choice[40];
    for (size_t i = 0; i < sizeof choice; i++) choice[i] = next(r) % 2 ? 0 : (uint8_t)next(r);
    if (next(r) % 4 == 0) { /* generation_config.json */
        static const char *const k_gen[] = {"{\"eos_token_id\":[2,3]}", "{\"eos_token_id\":2,\"bos_token_id\":1}",
                                            "{\"eos_token_id\":[63,63,0,-1,64,1e9]}", "{\"eos_token_id\":null}"};
        const char *g = k_gen[next(r) % 4];
        size_t n = strlen(g);
        if (n + 1 > max_size) return 0;
        data[0] = 1;
        memcpy(data + 1, g, n);
        return n + 1;
    }
    struct fz_src s = {choice, sizeof choice - (size_t)(next(r) % 8) * 4, 0};
    config_json(&s, &j);
    size_t n = jtext_size(&j);
    static char text[CFG_MAX * 800];
    if (n > sizeof text || n > max_size) return 0;
    jtext(&j, text);
    data[0] = 0;
    memcpy(data + 1, text, n - 1);
    return n; /* byte 0 and the text without its NUL */
}

/* LLVMFuzzerCustomMutator: 1 in 8 a whole config (always for an input too
 * short to hold one), 1 in 8 a key the parser reads put first in the object
 * with a boundary value, else libFuzzer's mutations. */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    uint64_t r = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    unsigned roll = (unsigned)(next(&r) % 8);
    if (roll == 0 || size < 3) {
        size_t n = whole(data, max_size, &r);
        if (n) return n;
    } else if (roll == 1 && size >= 2 && data[0] % 2 == 0 && data[1] == '{') {
        const unsigned nk = sizeof k_cfg_keys / sizeof k_cfg_keys[0], nv = sizeof k_cfg_vals / sizeof k_cfg_vals[0];
        const char *v = k_cfg_vals[next(&r) % (nv - 1)]; /* the last entry is NULL (remove) */
        char pair[900];
        int n = snprintf(pair, sizeof pair, "\"%s\":%s%s", k_cfg_keys[next(&r) % nk], v, size > 3 ? "," : "");
        if (n > 0 && size + (size_t)n <= max_size) {
            memmove(data + 2 + n, data + 2, size - 2);
            memcpy(data + 2, pair, (size_t)n);
            return size + (size_t)n;
        }
    }
    return LLVMFuzzerMutate(data, size, max_size);
}
#endif

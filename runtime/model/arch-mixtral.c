/*
 * arch-mixtral.c - Mixtral (MixtralForCausalLM; GGUF "llama" with experts).
 *
 * Its config.json needs no code of its own: every expert renormalises its
 * top-k weights, there is no attention-bias switch, and the names
 * (block_sparse_moe.experts.E.w1/w2/w3) are its row's data (arch.c). What
 * is here is the GGUF side: llama.cpp writes Mixtral under the dense Llama
 * architecture, so a file is one only when it has experts.
 */
#include "arch-impl.h"

/* moe_mixtral_gguf_check: a llama GGUF without experts is a dense model. */
enum moe_status moe_mixtral_gguf_check(struct moe_gguf_model *v) {
    int64_t x = 0;
    if (gm_kv_int(v, gm_akv(v, "expert_count"), &x) != 1 || x < 1) {
        MOE_LOGE("%s: a llama GGUF without %s.expert_count is a dense model, not a mixture of experts", v->path, v->arch);
        return MOE_ERR_UNSUPPORTED;
    }
    return MOE_OK;
}

/* moe_mixtral_gguf_config: the experts' size and the sliding window. */
void moe_mixtral_gguf_config(struct cfgb *b) {
    gm_put_ff(b, "intermediate_size", "feed_forward_length", "blk.%d.ffn_gate_exps.weight");
    gm_put_int_key(b, "sliding_window", "attention.sliding_window", 0, 0, 1 << 30, NULL);
}

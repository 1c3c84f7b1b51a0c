/*
 * check.h - load a Hugging Face MoE checkpoint or a GGUF file exactly as the
 * runtime would (config, every tensor's name and shape, tokenizer) and
 * summarise it: the library half of `moe-prep check` (the command is
 * check-cmd.c). A quick way to learn whether a download is usable.
 *
 * Thread safety: calls with different result structs may run concurrently
 * (the model is loaded and freed inside the call).
 */
#ifndef MOE_CHECK_H
#define MOE_CHECK_H

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a usable model holds. Strings are copies or static: no ownership. */
struct moe_check_info {
    char architecture[64];  /* the config's class name, e.g. "MixtralForCausalLM" */
    const char *arch;       /* the family, e.g. "mixtral" (static) */
    int vocab, hidden, layers, moe_layers, heads, kv_heads, head_dim;
    int experts, experts_per_token, expert_ffn, shared_expert_ffn; /* shared_expert_ffn 0 = none */
    long long params;        /* all weights */
    long long expert_params; /* the routed experts' (the part offloading moves) */
    const char *format;      /* "safetensors" or "gguf" (static) */
    int files;               /* safetensors shards, or 1 for a GGUF */
    int tokenizer;           /* a tokenizer was loaded */
};

/* moe_check_model: load the model at `path` (a checkpoint directory or a
 * .gguf file) as the runtime would and fill *out. Returns MOE_OK or the
 * load's error (logged, naming what is wrong); *out is zeroed on failure. */
enum moe_status moe_check_model(const char *path, struct moe_check_info *out);

/* moe_check_to_json: `info` as the object `moe-prep check --json` prints:
 * path, architecture, arch, vocab, hidden, layers, moe_layers, heads,
 * kv_heads, head_dim, experts, experts_per_token, expert_ffn,
 * shared_expert_ffn, params, expert_params, format, files, tokenizer. The
 * caller owns the tree (cJSON_Delete); NULL when out of memory. */
struct cJSON *moe_check_to_json(const char *path, const struct moe_check_info *info);

#ifdef __cplusplus
}
#endif

#endif

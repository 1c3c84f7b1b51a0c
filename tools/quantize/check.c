/*
 * check.c - a checkpoint or GGUF file loaded as the runtime would and
 * summarised: the library half of `moe-prep check` (check.h; the command is
 * check-cmd.c).
 */
#include "check.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "moe-model.h"
#include "moe-safetensors.h"

/* expert_params: parameters of all routed experts (the part offloading moves). */
static long long expert_params(const struct moe_model *m) {
    long long n = 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        if (m->cfg.layer_moe[l]) n += (long long)m->cfg.n_expert * 3 * m->cfg.n_embd * m->cfg.n_ff_expert;
    return n;
}

enum moe_status moe_check_model(const char *path, struct moe_check_info *out) {
    memset(out, 0, sizeof *out);
    struct moe_model *m = NULL;
    enum moe_status st = moe_model_load_source(path, &m);
    if (st) return st;
    const struct moe_config *c = &m->cfg;
    snprintf(out->architecture, sizeof out->architecture, "%s", c->arch_name);
    out->arch = moe_arch_name(c->arch);
    out->vocab = c->n_vocab;
    out->hidden = c->n_embd;
    out->layers = c->n_layer;
    for (int l = 0; l < c->n_layer; l++) out->moe_layers += c->layer_moe[l];
    out->heads = c->n_head;
    out->kv_heads = c->n_head_kv;
    out->head_dim = c->head_dim;
    out->experts = c->n_expert;
    out->experts_per_token = c->n_expert_used;
    out->expert_ffn = c->n_ff_expert;
    out->shared_expert_ffn = c->n_ff_shared;
    out->params = (long long)moe_model_n_params(m);
    out->expert_params = expert_params(m);
    out->format = m->gguf ? "gguf" : "safetensors";
    out->files = m->gguf ? 1 : moe_safetensors_n_files(m->st);
    out->tokenizer = m->tok != NULL;
    moe_model_free(m);
    return MOE_OK;
}

cJSON *moe_check_to_json(const char *path, const struct moe_check_info *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "path", path);
    cJSON_AddStringToObject(o, "architecture", c->architecture);
    cJSON_AddStringToObject(o, "arch", c->arch ? c->arch : "");
    const char *keys[] = {"vocab", "hidden", "layers", "moe_layers", "heads", "kv_heads", "head_dim",
                          "experts", "experts_per_token", "expert_ffn", "shared_expert_ffn"};
    const int vals[] = {c->vocab, c->hidden, c->layers, c->moe_layers, c->heads, c->kv_heads, c->head_dim,
                        c->experts, c->experts_per_token, c->expert_ffn, c->shared_expert_ffn};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) cJSON_AddNumberToObject(o, keys[i], vals[i]);
    cJSON_AddNumberToObject(o, "params", (double)c->params);
    cJSON_AddNumberToObject(o, "expert_params", (double)c->expert_params);
    cJSON_AddStringToObject(o, "format", c->format ? c->format : "");
    cJSON_AddNumberToObject(o, "files", c->files);
    cJSON_AddBoolToObject(o, "tokenizer", c->tokenizer);
    return o;
}

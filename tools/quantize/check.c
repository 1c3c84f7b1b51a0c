/*
 * check.c - `moe-prep check`: load a Hugging Face MoE checkpoint exactly as the
 * runtime would (config, every tensor's name and shape, tokenizer) and print a
 * summary, as text or JSON. A quick way to learn whether a download is usable.
 */
#include <stdio.h>
#include <string.h>

#include "moe-model.h"
#include "moe-prep.h"
#include "moe-safetensors.h"
#include "moe-tokenizer.h"
#include "tool-util.h"

static void check_usage(FILE *f) {
    fprintf(f, "usage: moe-prep check MODEL [--json]\n\n"
               "Validate a Hugging Face MoE checkpoint directory (config.json,\n"
               "*.safetensors, tokenizer.json) or a llama.cpp GGUF file and print\n"
               "what it holds.\n\n"
               "  --json    machine-readable output\n\n"
               "examples:\n  moe-prep check ./OLMoE-1B-7B-0924 --json\n"
               "  moe-prep check olmoe-1b-7b-q4_k_m.gguf\n");
}

/* expert_params: parameters of all routed experts (the part offloading moves). */
static long long expert_params(const struct moe_model *m) {
    long long n = 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        if (m->cfg.layer_moe[l])
            n += (long long)m->cfg.n_expert * 3 * m->cfg.n_embd * m->cfg.n_ff_expert;
    return n;
}

int moe_prep_check(int argc, char **argv) {
    const char *dir = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            check_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "moe-prep check: unknown option \"%s\"\n", argv[i]);
            return 2;
        } else if (!dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "moe-prep check: one model directory only\n");
            return 2;
        }
    }
    if (!dir) {
        check_usage(stderr);
        return 2;
    }
    struct moe_model *m = NULL;
    if (moe_model_load_source(dir, &m) != MOE_OK) {
        fprintf(stderr, "moe-prep check: %s is not a usable checkpoint (see the message above)\n", dir);
        return 1;
    }
    const struct moe_config *c = &m->cfg;
    int n_moe = 0;
    for (int l = 0; l < c->n_layer; l++) n_moe += c->layer_moe[l];
    long long np = (long long)moe_model_n_params(m), ne = expert_params(m);
    const int nf = m->gguf ? 1 : moe_safetensors_n_files(m->st);
    if (json) {
        printf("{\"path\": ");
        moe_tool_json_string(stdout, dir);
        printf(", \"architecture\": \"%s\", \"arch\": \"%s\", \"vocab\": %d, "
               "\"hidden\": %d, \"layers\": %d, \"moe_layers\": %d, \"heads\": %d, \"kv_heads\": %d, "
               "\"head_dim\": %d, \"experts\": %d, \"experts_per_token\": %d, \"expert_ffn\": %d, "
               "\"shared_expert_ffn\": %d, \"params\": %lld, \"expert_params\": %lld, "
               "\"format\": \"%s\", \"files\": %d, \"tokenizer\": %s}\n",
               c->arch_name, moe_arch_name(c->arch), c->n_vocab, c->n_embd, c->n_layer, n_moe,
               c->n_head, c->n_head_kv, c->head_dim, c->n_expert, c->n_expert_used, c->n_ff_expert,
               c->n_ff_shared, np, ne, m->gguf ? "gguf" : "safetensors", nf, m->tok ? "true" : "false");
    } else {
        printf("%s: %s (%s)\n", dir, c->arch_name, moe_arch_name(c->arch));
        printf("  layers %d (%d MoE), hidden %d, heads %d/%d kv, head_dim %d, vocab %d\n", c->n_layer,
               n_moe, c->n_embd, c->n_head, c->n_head_kv, c->head_dim, c->n_vocab);
        printf("  experts %d, top-%d, expert ffn %d", c->n_expert, c->n_expert_used, c->n_ff_expert);
        if (c->n_ff_shared) printf(", shared expert ffn %d", c->n_ff_shared);
        printf("\n  parameters %.3f M (experts %.1f %%), %d %s file(s), tokenizer: %s\n",
               (double)np / 1e6, np ? 100.0 * (double)ne / (double)np : 0.0, nf, m->gguf ? "GGUF" : "safetensors",
               m->tok ? "yes" : "no");
    }
    moe_model_free(m);
    return 0;
}

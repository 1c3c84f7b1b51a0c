/*
 * check-cmd.c - `moe-prep check`: parses the options, calls moe_check_model
 * (check.h) and prints the summary as text or JSON.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "moe-opt.h"
#include "moe-prep.h"

#define PROG "moe-prep check"

static const struct moe_opt k_opts[] = {
    {"json", 0, MOE_OPT_NONE, NULL, "machine-readable output"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this help"},
    {NULL, 0, 0, NULL, NULL},
};

static void usage(FILE *f) {
    fprintf(f, "usage: moe-prep check MODEL [--json]\n\n"
               "Validate a Hugging Face MoE checkpoint directory (config.json,\n"
               "*.safetensors, tokenizer.json) or a llama.cpp GGUF file and print\n"
               "what it holds.\n\n");
    moe_opt_help(f, k_opts);
    fprintf(f, "\nexamples:\n  moe-prep check ./OLMoE-1B-7B-0924 --json\n"
               "  moe-prep check olmoe-1b-7b-q4_k_m.gguf\n");
}

static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    if (o->key == 'h') {
        usage(stdout);
        return 1;
    }
    *(int *)ctx = 1; /* --json */
    return 0;
}

/* print_text: the summary in three lines. */
static void print_text(const char *path, const struct moe_check_info *c) {
    printf("%s: %s (%s)\n", path, c->architecture, c->arch);
    printf("  layers %d (%d MoE), hidden %d, heads %d/%d kv, head_dim %d, vocab %d\n", c->layers, c->moe_layers,
           c->hidden, c->heads, c->kv_heads, c->head_dim, c->vocab);
    printf("  experts %d, top-%d, expert ffn %d", c->experts, c->experts_per_token, c->expert_ffn);
    if (c->shared_expert_ffn) printf(", shared expert ffn %d", c->shared_expert_ffn);
    printf("\n  parameters %.3f M (experts %.1f %%), %d %s file(s), tokenizer: %s\n", (double)c->params / 1e6,
           c->params ? 100.0 * (double)c->expert_params / (double)c->params : 0.0, c->files,
           !strcmp(c->format, "gguf") ? "GGUF" : "safetensors", c->tokenizer ? "yes" : "no");
}

int moe_prep_check(int argc, char **argv) {
    int json = 0;
    const struct moe_opt *tables[] = {k_opts};
    int first = 0, rc = moe_opt_parse(PROG, argc, argv, 1, tables, 1, on_option, &json, &first);
    if (rc) return rc == 1 ? 0 : 2;
    if (first < argc - 1) {
        fprintf(stderr, PROG ": one model directory only\n");
        return 2;
    }
    if (first >= argc) {
        usage(stderr);
        return 2;
    }
    const char *path = argv[first];
    struct moe_check_info info;
    if (moe_check_model(path, &info) != MOE_OK) {
        fprintf(stderr, PROG ": %s is not a usable checkpoint (see the message above)\n", path);
        return 1;
    }
    if (!json) {
        print_text(path, &info);
        return 0;
    }
    cJSON *o = moe_check_to_json(path, &info);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    if (s) printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
    return s ? 0 : 1;
}

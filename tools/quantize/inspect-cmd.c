/*
 * inspect-cmd.c - `moe-prep inspect`: parses the options, calls
 * moe_inspect_bundle (inspect.h) and prints the result as text or JSON.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "inspect.h"
#include "moe-opt.h"
#include "moe-prep.h"
#include "moe-quant.h"

#define PROG "moe-prep inspect"

static const struct moe_opt k_opts[] = {
    {"json", 0, MOE_OPT_NONE, NULL, "machine-readable output"},
    {"verify", 0, MOE_OPT_NONE, NULL, "check every checksum (header, directory, tensors, every expert\n"
                                      "blob, tuning slots), then that the bundle binds as a model\n"
                                      "(shapes, stored sizes, constants); each damaged item is named;\n"
                                      "exit 1 if any"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this help"},
    {NULL, 0, 0, NULL, NULL},
};

static void usage(FILE *f) {
    fprintf(f, "usage: moe-prep inspect BUNDLE.moeb [--json] [--verify]\n\n"
               "Show a bundle's architecture, layers, experts, stored precisions with\n"
               "their sizes and bits per weight, the non-expert weights, whether a tuning\n"
               "section is present, and where it came from.\n\n");
    moe_opt_help(f, k_opts);
    fprintf(f, "\nexamples:\n  moe-prep inspect mixtral.moeb\n  moe-prep inspect mixtral.moeb --verify --json\n");
}

struct iargs {
    int json, verify;
};

static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    struct iargs *a = ctx;
    if (o->key == 'h') {
        usage(stdout);
        return 1;
    }
    if (!strcmp(o->name, "json")) a->json = 1;
    else a->verify = 1;
    return 0;
}

/* print_precisions: one line per stored expert precision. */
static void print_precisions(const struct moe_inspect *r) {
    printf("  experts     %u precision(s):\n", r->n_precisions);
    for (uint32_t p = 0; p < r->n_precisions; p++) {
        const struct moe_bundle_precision *d = moe_bundle_precision_at(r->bundle, p);
        char types[96] = "";
        for (uint32_t k = 0; k < d->n_parts; k++)
            snprintf(types + strlen(types), sizeof types - strlen(types), "%s%s", k ? "/" : "",
                     moe_qtype_name((enum moe_qtype)d->parts[k].type_id));
        printf("    %-6s %6.3f bits/weight  blob %8.1f KB  all experts %9.2f MB  (gate/up/down: %s)\n", d->name,
               moe_inspect_bits_per_weight(d), (double)d->raw_size / 1e3,
               (double)d->raw_size * r->n_experts * r->n_moe_layers / 1e6, types);
    }
}

/* print_text: the summary as a few aligned lines, then the verification. */
static void print_text(const struct moe_inspect *r) {
    const struct moe_config *c = &r->cfg;
    printf("%s: bundle v%u.%u, %.2f MB\n", r->path, r->info.version_major, r->info.version_minor,
           (double)r->info.file_size / 1e6);
    if (r->have_config)
        printf("  model       %s: %d layers (%d MoE), hidden %d, vocab %d, %u experts, top-%d\n", c->arch_name,
               c->n_layer, (int)r->n_moe_layers, c->n_embd, c->n_vocab, r->n_experts, c->n_expert_used);
    print_precisions(r);
    printf("  non-expert  %zu tensors, %.2f MB (matrices at %s; norms, biases, routers f32)\n", r->n_tensors,
           (double)r->dense_bytes / 1e6, r->dense_type ? r->dense_type : "?");
    printf("  tuning      %s", r->n_tuning_keys ? "present:" : "none\n");
    for (size_t i = 0; i < r->n_tuning_keys; i++) {
        struct moe_bundle_kv_item it;
        if (moe_bundle_kv_at(r->tuning, i, &it) == MOE_OK) printf(" %s", it.key);
    }
    if (r->n_tuning_keys) printf("\n");
    if (r->source)
        printf("  source      %s (%s, %s)\n", r->source, r->tool ? r->tool : "?", r->created ? r->created : "?");
    if (r->info.reclaimable_bytes)
        printf("  reclaimable %.1f KB (stale tuning)\n", (double)r->info.reclaimable_bytes / 1e3);
    if (!r->verified) return;
    printf("verify:\n");
    for (int i = 0; i < r->n_damaged; i++) printf("  DAMAGED  %s: %s\n", r->damaged[i].item, r->damaged[i].problem);
    printf("  %s\n", r->n_damaged ? "FAILED: the items above are damaged" : "all checksums match");
}

/* print_json: the result as one JSON object; 0 when out of memory. */
static int print_json(const struct moe_inspect *r) {
    cJSON *root = moe_inspect_to_json(r);
    char *s = root ? cJSON_Print(root) : NULL;
    if (s) printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(root);
    return s != NULL;
}

int moe_prep_inspect(int argc, char **argv) {
    struct iargs a = {0, 0};
    const struct moe_opt *tables[] = {k_opts};
    int first = 0, rc = moe_opt_parse(PROG, argc, argv, 1, tables, 1, on_option, &a, &first);
    if (rc) return rc == 1 ? 0 : 2;
    if (first < argc - 1) {
        fprintf(stderr, PROG ": unexpected argument \"%s\" (see --help)\n", argv[first + 1]);
        return 2;
    }
    if (first >= argc) {
        usage(stderr);
        return 2;
    }
    struct moe_inspect r;
    enum moe_status st = moe_inspect_bundle(argv[first], a.verify, &r);
    if (st != MOE_OK || !r.bundle) {
        fprintf(stderr, PROG ": %s is not a readable bundle (see the message above)\n", argv[first]);
        moe_inspect_clear(&r);
        return 1;
    }
    int ok = 1;
    if (a.json) ok = print_json(&r);
    else print_text(&r);
    int status = !ok || r.n_damaged ? 1 : 0;
    moe_inspect_clear(&r);
    return status;
}

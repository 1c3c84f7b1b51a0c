/*
 * inspect.c - `moe-prep inspect`: what a bundle holds, at a glance (or as JSON),
 * and with --verify every checksum checked, each damaged item named.
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "moe-bundle.h"
#include "moe-model.h"
#include "moe-prep.h"
#include "moe-quant.h"

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: moe-prep inspect BUNDLE.moeb [--json] [--verify]\n\n"
               "Show a bundle's architecture, layers, experts, stored precisions with\n"
               "their sizes and bits per weight, the non-expert weights, whether a tuning\n"
               "section is present, and where it came from.\n\n"
               "  --json     machine-readable output\n"
               "  --verify   check every checksum (header, directory, tensors, every expert\n"
               "             blob, tuning slots), then that the bundle binds as a model\n"
               "             (shapes, stored sizes, constants); each damaged item is named;\n"
               "             exit 1 if any\n\n"
               "examples:\n  moe-prep inspect mixtral.moeb\n  moe-prep inspect mixtral.moeb --verify --json\n");
}

struct verify_state {
    int n_bad;
    cJSON *list; /* JSON mode */
};

static void on_failure(const char *item, const char *problem, void *user) {
    struct verify_state *v = user;
    v->n_bad++;
    if (v->list) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "item", item);
        cJSON_AddStringToObject(o, "problem", problem);
        cJSON_AddItemToArray(v->list, o);
    } else {
        printf("  DAMAGED  %s: %s\n", item, problem);
    }
}

/* last_error: a log sink keeping the last error message (binding check). */
static void last_error(enum moe_log_level level, const char *msg, void *user) {
    if (level >= MOE_LOG_ERROR) snprintf(user, 1024, "%s", msg);
}

/* verify_binding: the checks a checksum cannot make: the bundle binds as a
 * model (every view inside its stored bytes, shapes and types as the config
 * implies, every tensor accounted for, constants in range). Reported as the
 * item "model". */
static void verify_binding(const char *path, struct verify_state *v) {
    char why[1024] = "";
    struct moe_model *m = NULL;
    moe_log_set(last_error, why);
    enum moe_status st = moe_model_load(path, NULL, &m);
    moe_log_set(NULL, NULL);
    moe_model_free(m);
    if (st) on_failure("model", why[0] ? why : moe_status_str(st), v);
}

/* part_bits: bits per weight of a precision's blob (parts' bytes over weights). */
static double blob_bits(const struct moe_bundle_precision *p) {
    double bytes = 0, weights = 0;
    for (uint32_t k = 0; k < p->n_parts; k++) {
        bytes += (double)p->parts[k].nbytes;
        weights += (double)p->parts[k].rows * (double)p->parts[k].cols;
    }
    return weights > 0 ? 8.0 * bytes / weights : 0;
}

int moe_prep_inspect(int argc, char **argv) {
    const char *path = NULL;
    int json = 0, verify = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            inspect_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--verify")) {
            verify = 1;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "moe-prep inspect: unexpected argument \"%s\" (see --help)\n", argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        inspect_usage(stderr);
        return 2;
    }
    struct moe_bundle *b = NULL;
    if (moe_bundle_open(path, &b) != MOE_OK) {
        fprintf(stderr, "moe-prep inspect: %s is not a readable bundle (see the message above)\n", path);
        return 1;
    }
    struct moe_bundle_info info;
    moe_bundle_get_info(b, &info);
    struct moe_config cfg;
    memset(&cfg, 0, sizeof cfg);
    const char *cfg_text = moe_bundle_meta_str(b, "hf.config.json");
    int have_cfg = cfg_text && moe_config_parse(cfg_text, strlen(cfg_text), "hf.config.json", &cfg) == MOE_OK;
    uint32_t nl, ne, np;
    moe_bundle_expert_layout(b, &nl, &ne, &np);
    int n_moe = 0;
    for (uint32_t l = 0; l < nl; l++) n_moe += moe_bundle_layer_has_experts(b, l);
    uint64_t dense_bytes = 0;
    size_t nt = moe_bundle_tensor_count(b);
    for (size_t i = 0; i < nt; i++) dense_bytes += moe_bundle_tensor_at(b, i)->size;
    const struct moe_bundle_kv *tuning = moe_bundle_tuning(b);
    size_t n_tuning = tuning ? moe_bundle_kv_count(tuning) : 0;

    cJSON *root = json ? cJSON_CreateObject() : NULL;
    if (json) {
        cJSON_AddStringToObject(root, "path", path);
        char ver[32];
        snprintf(ver, sizeof ver, "%u.%u", info.version_major, info.version_minor);
        cJSON_AddStringToObject(root, "format_version", ver);
        cJSON_AddNumberToObject(root, "file_bytes", (double)info.file_size);
        if (have_cfg) {
            cJSON_AddStringToObject(root, "architecture", cfg.arch_name);
            cJSON_AddNumberToObject(root, "hidden", cfg.n_embd);
            cJSON_AddNumberToObject(root, "vocab", cfg.n_vocab);
            cJSON_AddNumberToObject(root, "experts_per_token", cfg.n_expert_used);
        }
        cJSON_AddNumberToObject(root, "layers", nl);
        cJSON_AddNumberToObject(root, "moe_layers", n_moe);
        cJSON_AddNumberToObject(root, "experts", ne);
        cJSON *precs = cJSON_AddArrayToObject(root, "precisions");
        for (uint32_t p = 0; p < np; p++) {
            const struct moe_bundle_precision *d = moe_bundle_precision_at(b, p);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", d->name);
            cJSON *types = cJSON_AddArrayToObject(o, "part_types");
            for (uint32_t k = 0; k < d->n_parts; k++)
                cJSON_AddItemToArray(types, cJSON_CreateString(moe_qtype_name((enum moe_qtype)d->parts[k].type_id)));
            cJSON_AddNumberToObject(o, "blob_bytes", (double)d->raw_size);
            cJSON_AddNumberToObject(o, "total_bytes", (double)d->raw_size * ne * (double)n_moe);
            cJSON_AddNumberToObject(o, "bits_per_weight", blob_bits(d));
            cJSON_AddItemToArray(precs, o);
        }
        cJSON_AddNumberToObject(root, "dense_tensors", (double)nt);
        cJSON_AddNumberToObject(root, "dense_bytes", (double)dense_bytes);
        const char *dense = moe_bundle_meta_str(b, "quant.dense");
        if (dense) cJSON_AddStringToObject(root, "dense_type", dense);
        cJSON_AddBoolToObject(root, "tuning", n_tuning > 0);
        cJSON *tk = cJSON_AddArrayToObject(root, "tuning_keys");
        for (size_t i = 0; i < n_tuning; i++) {
            struct moe_bundle_kv_item it;
            if (moe_bundle_kv_at(tuning, i, &it) == MOE_OK) cJSON_AddItemToArray(tk, cJSON_CreateString(it.key));
        }
        cJSON_AddNumberToObject(root, "reclaimable_bytes", (double)info.reclaimable_bytes);
        const char *keys[] = {"provenance.source", "provenance.tool", "provenance.created", "provenance.command_line"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            const char *v = moe_bundle_meta_str(b, keys[i]);
            if (v) cJSON_AddStringToObject(root, keys[i] + strlen("provenance."), v);
        }
    } else {
        printf("%s: bundle v%u.%u, %.2f MB\n", path, info.version_major, info.version_minor, (double)info.file_size / 1e6);
        if (have_cfg)
            printf("  model       %s: %d layers (%d MoE), hidden %d, vocab %d, %u experts, top-%d\n", cfg.arch_name,
                   cfg.n_layer, n_moe, cfg.n_embd, cfg.n_vocab, ne, cfg.n_expert_used);
        printf("  experts     %u precision(s):\n", np);
        for (uint32_t p = 0; p < np; p++) {
            const struct moe_bundle_precision *d = moe_bundle_precision_at(b, p);
            char types[96] = "";
            for (uint32_t k = 0; k < d->n_parts; k++)
                snprintf(types + strlen(types), sizeof types - strlen(types), "%s%s", k ? "/" : "",
                         moe_qtype_name((enum moe_qtype)d->parts[k].type_id));
            printf("    %-6s %6.3f bits/weight  blob %8.1f KB  all experts %9.2f MB  (gate/up/down: %s)\n", d->name,
                   blob_bits(d), (double)d->raw_size / 1e3, (double)d->raw_size * ne * n_moe / 1e6, types);
        }
        const char *dense = moe_bundle_meta_str(b, "quant.dense");
        printf("  non-expert  %zu tensors, %.2f MB (matrices at %s; norms, biases, routers f32)\n", nt,
               (double)dense_bytes / 1e6, dense ? dense : "?");
        printf("  tuning      %s", n_tuning ? "present:" : "none\n");
        for (size_t i = 0; i < n_tuning; i++) {
            struct moe_bundle_kv_item it;
            if (moe_bundle_kv_at(tuning, i, &it) == MOE_OK) printf(" %s", it.key);
        }
        if (n_tuning) printf("\n");
        const char *src = moe_bundle_meta_str(b, "provenance.source"), *when = moe_bundle_meta_str(b, "provenance.created");
        const char *tool = moe_bundle_meta_str(b, "provenance.tool");
        if (src) printf("  source      %s (%s, %s)\n", src, tool ? tool : "?", when ? when : "?");
        if (info.reclaimable_bytes) printf("  reclaimable %.1f KB (stale tuning)\n", (double)info.reclaimable_bytes / 1e3);
    }
    int status = 0;
    if (verify) {
        struct verify_state v = {0, json ? cJSON_CreateArray() : NULL};
        if (!json) printf("verify:\n");
        moe_bundle_verify_all(b, on_failure, &v);
        if (!v.n_bad) verify_binding(path, &v); /* a sound container can still hold an unusable model */
        if (json) {
            cJSON_AddBoolToObject(root, "verified", v.n_bad == 0);
            cJSON_AddItemToObject(root, "damaged", v.list);
        } else {
            printf("  %s\n", v.n_bad ? "FAILED: the items above are damaged" : "all checksums match");
        }
        status = v.n_bad ? 1 : 0;
    }
    if (json) {
        char *s = cJSON_Print(root);
        if (s) printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(root);
    }
    if (have_cfg) moe_config_clear(&cfg);
    moe_bundle_free(b);
    return status;
}

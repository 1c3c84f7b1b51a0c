/*
 * inspect.c - what a bundle holds, and with verification every checksum
 * checked and each damaged item named: the library half of `moe-prep
 * inspect` (inspect.h; the command is inspect-cmd.c).
 */
#include "inspect.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-quant.h"

/* add_damage: one damaged item into r (copies both strings); 0 when out of memory. */
static int add_damage(struct moe_inspect *r, const char *item, const char *problem) {
    struct moe_inspect_damage *d = realloc(r->damaged, sizeof *d * (size_t)(r->n_damaged + 1));
    if (!d) return 0;
    r->damaged = d;
    d[r->n_damaged].item = strdup(item);
    d[r->n_damaged].problem = strdup(problem);
    if (!d[r->n_damaged].item || !d[r->n_damaged].problem) {
        free(d[r->n_damaged].item);
        free(d[r->n_damaged].problem);
        return 0;
    }
    r->n_damaged++;
    return 1;
}

/* Verification's state: the result being filled, and whether memory ran out. */
struct verify_state {
    struct moe_inspect *r;
    int nomem;
};

static void on_failure(const char *item, const char *problem, void *user) {
    struct verify_state *v = user;
    if (!add_damage(v->r, item, problem)) v->nomem = 1;
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

double moe_inspect_bits_per_weight(const struct moe_bundle_precision *p) {
    double bytes = 0, weights = 0;
    for (uint32_t k = 0; k < p->n_parts; k++) {
        bytes += (double)p->parts[k].nbytes;
        weights += (double)p->parts[k].rows * (double)p->parts[k].cols;
    }
    return weights > 0 ? 8.0 * bytes / weights : 0;
}

/* summarize: the figures of an open bundle. */
static void summarize(struct moe_inspect *r) {
    struct moe_bundle *b = r->bundle;
    moe_bundle_get_info(b, &r->info);
    const char *cfg_text = moe_bundle_meta_str(b, "hf.config.json");
    r->have_config = cfg_text && moe_config_parse(cfg_text, strlen(cfg_text), "hf.config.json", &r->cfg) == MOE_OK;
    moe_bundle_expert_layout(b, &r->n_layers, &r->n_experts, &r->n_precisions);
    for (uint32_t l = 0; l < r->n_layers; l++) r->n_moe_layers += moe_bundle_layer_has_experts(b, l);
    r->n_tensors = moe_bundle_tensor_count(b);
    for (size_t i = 0; i < r->n_tensors; i++) r->dense_bytes += moe_bundle_tensor_at(b, i)->size;
    r->dense_type = moe_bundle_meta_str(b, "quant.dense");
    r->tuning = moe_bundle_tuning(b);
    r->n_tuning_keys = r->tuning ? moe_bundle_kv_count(r->tuning) : 0;
    r->source = moe_bundle_meta_str(b, "provenance.source");
    r->tool = moe_bundle_meta_str(b, "provenance.tool");
    r->created = moe_bundle_meta_str(b, "provenance.created");
    r->command_line = moe_bundle_meta_str(b, "provenance.command_line");
}

enum moe_status moe_inspect_bundle(const char *path, int verify, struct moe_inspect *out) {
    memset(out, 0, sizeof *out);
    if (!(out->path = strdup(path))) return MOE_ERR_NOMEM;
    enum moe_status st = moe_bundle_open(path, &out->bundle);
    if (st) return st;
    summarize(out);
    if (!verify) return MOE_OK;
    struct verify_state v = {out, 0};
    out->verified = 1;
    moe_bundle_verify_all(out->bundle, on_failure, &v);
    if (!out->n_damaged && !v.nomem) verify_binding(path, &v); /* a sound container can still hold an unusable model */
    return v.nomem ? MOE_ERR_NOMEM : MOE_OK;
}

void moe_inspect_clear(struct moe_inspect *r) {
    for (int i = 0; i < r->n_damaged; i++) {
        free(r->damaged[i].item);
        free(r->damaged[i].problem);
    }
    free(r->damaged);
    if (r->have_config) moe_config_clear(&r->cfg);
    moe_bundle_free(r->bundle);
    free(r->path);
    memset(r, 0, sizeof *r);
}

/* precision_json: one stored precision: its name, part types, sizes and bits. */
static cJSON *precision_json(const struct moe_inspect *r, const struct moe_bundle_precision *d) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", d->name);
    cJSON *types = cJSON_AddArrayToObject(o, "part_types");
    for (uint32_t k = 0; k < d->n_parts; k++)
        cJSON_AddItemToArray(types, cJSON_CreateString(moe_qtype_name((enum moe_qtype)d->parts[k].type_id)));
    cJSON_AddNumberToObject(o, "blob_bytes", (double)d->raw_size);
    cJSON_AddNumberToObject(o, "total_bytes", (double)d->raw_size * r->n_experts * (double)r->n_moe_layers);
    cJSON_AddNumberToObject(o, "bits_per_weight", moe_inspect_bits_per_weight(d));
    return o;
}

/* add_tail_json: tuning, reclaimable bytes, provenance and verification. */
static void add_tail_json(cJSON *root, const struct moe_inspect *r) {
    cJSON_AddBoolToObject(root, "tuning", r->n_tuning_keys > 0);
    cJSON *tk = cJSON_AddArrayToObject(root, "tuning_keys");
    for (size_t i = 0; i < r->n_tuning_keys; i++) {
        struct moe_bundle_kv_item it;
        if (moe_bundle_kv_at(r->tuning, i, &it) == MOE_OK) cJSON_AddItemToArray(tk, cJSON_CreateString(it.key));
    }
    cJSON_AddNumberToObject(root, "reclaimable_bytes", (double)r->info.reclaimable_bytes);
    const char *keys[] = {"source", "tool", "created", "command_line"};
    const char *vals[] = {r->source, r->tool, r->created, r->command_line};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (vals[i]) cJSON_AddStringToObject(root, keys[i], vals[i]);
    if (!r->verified) return;
    cJSON_AddBoolToObject(root, "verified", r->n_damaged == 0);
    cJSON *list = cJSON_AddArrayToObject(root, "damaged");
    for (int i = 0; i < r->n_damaged; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "item", r->damaged[i].item);
        cJSON_AddStringToObject(o, "problem", r->damaged[i].problem);
        cJSON_AddItemToArray(list, o);
    }
}

cJSON *moe_inspect_to_json(const struct moe_inspect *r) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "path", r->path);
    char ver[32];
    snprintf(ver, sizeof ver, "%u.%u", r->info.version_major, r->info.version_minor);
    cJSON_AddStringToObject(root, "format_version", ver);
    cJSON_AddNumberToObject(root, "file_bytes", (double)r->info.file_size);
    if (r->have_config) {
        cJSON_AddStringToObject(root, "architecture", r->cfg.arch_name);
        cJSON_AddNumberToObject(root, "hidden", r->cfg.n_embd);
        cJSON_AddNumberToObject(root, "vocab", r->cfg.n_vocab);
        cJSON_AddNumberToObject(root, "experts_per_token", r->cfg.n_expert_used);
    }
    cJSON_AddNumberToObject(root, "layers", r->n_layers);
    cJSON_AddNumberToObject(root, "moe_layers", r->n_moe_layers);
    cJSON_AddNumberToObject(root, "experts", r->n_experts);
    cJSON *precs = cJSON_AddArrayToObject(root, "precisions");
    for (uint32_t p = 0; p < r->n_precisions; p++)
        cJSON_AddItemToArray(precs, precision_json(r, moe_bundle_precision_at(r->bundle, p)));
    cJSON_AddNumberToObject(root, "dense_tensors", (double)r->n_tensors);
    cJSON_AddNumberToObject(root, "dense_bytes", (double)r->dense_bytes);
    if (r->dense_type) cJSON_AddStringToObject(root, "dense_type", r->dense_type);
    add_tail_json(root, r);
    return root;
}

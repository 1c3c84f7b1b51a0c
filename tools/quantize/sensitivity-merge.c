/*
 * sensitivity-merge.c - moe_sensitivity_merge (sensitivity.h): shard files
 * of one sweep, each covering the experts i mod N, joined into the file one
 * run over every expert writes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-status.h"
#include "sensitivity-impl.h"

/* One shard file, read. */
struct shard_file {
    const char *path;
    struct moe_profile *p;
    struct moe_sens_state s;
    double cfg[SENS_CFG_N];
    int index, count;
};

/* same_str: equal strings (NULL as ""). */
static int same_str(const char *a, const char *b) { return !strcmp(a ? a : "", b ? b : ""); }

/* read_shard: file f->path into f: a finished shard of a sweep. */
static enum moe_status read_shard(struct shard_file *f) {
    enum moe_status st = moe_profile_read(f->path, &f->p);
    if (st) {
        MOE_LOGE("sensitivity merge: cannot read %s", f->path);
        return st;
    }
    int nd;
    int64_t d[MOE_PROFILE_MAX_DIMS];
    const double *c;
    if (moe_profile_get_f64(f->p, "config.sensitivity", &nd, d, &c) || nd != 1 || d[0] != SENS_CFG_N ||
        !(c[SENS_CFG_NSEQ] >= 1 && c[SENS_CFG_NSEQ] <= 1e9 && c[SENS_CFG_CTX] >= 2 && c[SENS_CFG_CTX] <= 1e9)) {
        MOE_LOGE("sensitivity merge: %s is not a sensitivity file (no usable config.sensitivity)", f->path);
        return MOE_ERR_FORMAT;
    }
    if ((st = sens_state_alloc(&f->s, f->p->n_layers, f->p->n_experts, (int)c[SENS_CFG_NSEQ], (int)c[SENS_CFG_CTX])))
        return st;
    int shard[2];
    if ((st = sens_state_get(f->p, f->path, &f->s, f->cfg, shard))) return st;
    f->index = shard[0], f->count = shard[1];
    if (f->count < 2) {
        MOE_LOGE("sensitivity merge: %s is not a shard file (it was written without --shard, or is a merge's "
                 "result)", f->path);
        return MOE_ERR_INVALID;
    }
    if (f->s.next_seq != f->s.n_seq) {
        MOE_LOGE("sensitivity merge: %s is an unfinished shard (%d of %d sequences); finish it with --resume",
                 f->path, f->s.next_seq, f->s.n_seq);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* compatible: b comes from the same sweep as a (model, data, settings, shape, count). */
static int compatible(const struct shard_file *a, const struct shard_file *b) {
    const struct moe_profile *x = a->p, *y = b->p;
    const char *why = NULL;
    if (memcmp(a->cfg, b->cfg, sizeof a->cfg)) why = "other settings (context, precisions, metric, method, "
                                                     "sequences or token count)";
    else if (!same_str(x->arch, y->arch) || !same_str(x->model_path, y->model_path) || x->n_layers != y->n_layers ||
             x->n_experts != y->n_experts || x->k != y->k ||
             memcmp(x->moe_layer_index, y->moe_layer_index, sizeof(int32_t) * (size_t)x->n_layers))
        why = "another model";
    else if (!same_str(x->dataset, y->dataset)) why = "another dataset";
    else if (!same_str(x->tool_version, y->tool_version)) why = "other precisions or metric";
    else if (a->count != b->count) why = "another shard count";
    else if (a->s.n_kl != b->s.n_kl || a->s.n_nll != b->s.n_nll ||
             fabs(a->s.base_nll - b->s.base_nll) > 1e-9 * fmax(fabs(a->s.base_nll), fabs(b->s.base_nll)))
        why = "a different baseline (positions or baseline NLL)";
    if (!why) return 1;
    MOE_LOGE("sensitivity merge: %s and %s come from different sweeps: %s", a->path, b->path, why);
    return 0;
}

/* check_cover: every index 0..N-1 exactly once. */
static int check_cover(const struct shard_file *f, int n) {
    const int count = f[0].count;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (f[i].index == f[j].index) {
                MOE_LOGE("sensitivity merge: shard %d/%d is given twice (%s and %s)", f[i].index + 1, count,
                         f[j].path, f[i].path);
                return 0;
            }
    if (n != count) {
        for (int want = 0; want < count; want++) {
            int seen = 0;
            for (int i = 0; i < n; i++) seen |= f[i].index == want;
            if (!seen) {
                MOE_LOGE("sensitivity merge: shard %d/%d is missing (%d of %d shard files given)", want + 1, count,
                         n, count);
                break;
            }
        }
        return 0;
    }
    return 1;
}

/* join: each expert's sums from the shard that swept it; times summed
 * (baseline: the shards' mean). */
static void join(const struct shard_file *f, int n, struct moe_sens_state *out) {
    const int ne = out->n_moe * out->n_expert, count = f[0].count;
    for (int i = 0; i < n; i++) {
        for (int ex = f[i].index; ex < ne; ex += count) {
            out->kl[ex] = f[i].s.kl[ex];
            out->dnll[ex] = f[i].s.dnll[ex];
            out->proxy[ex] = f[i].s.proxy[ex];
            out->routed[ex] = f[i].s.routed[ex];
        }
        out->seconds += f[i].s.seconds;
        out->base_seconds += f[i].s.base_seconds / n;
    }
    out->next_seq = f[0].s.n_seq;
    out->n_kl = f[0].s.n_kl;
    out->n_nll = f[0].s.n_nll;
    out->base_nll = f[0].s.base_nll;
}

/* fill_result: r's names and layers from the first file. */
static enum moe_status fill_result(const struct shard_file *f, struct moe_sensitivity_result *r) {
    const struct moe_profile *p = f->p;
    if (!sens_result_names(r, p->tool_version, f->cfg)) {
        MOE_LOGE("sensitivity merge: %s: the tool version \"%s\" does not name the precisions", f->path,
                 p->tool_version);
        return MOE_ERR_FORMAT;
    }
    r->model = strdup(p->model_path);
    r->dataset = strdup(p->dataset);
    r->moe_layer = malloc(sizeof(int32_t) * (size_t)p->n_layers);
    if (!r->model || !r->dataset || !r->moe_layer) return MOE_ERR_NOMEM;
    memcpy(r->moe_layer, p->moe_layer_index, sizeof(int32_t) * (size_t)p->n_layers);
    r->shard_count = 1;
    return sens_state_alloc(&r->state, f->s.n_moe, f->s.n_expert, f->s.n_seq, f->s.n_ctx);
}

enum moe_status moe_sensitivity_merge(const char *const *paths, int n, const char *out,
                                      struct moe_sensitivity_result *r) {
    memset(r, 0, sizeof *r);
    r->resumed_at = -1;
    r->spearman = NAN;
    if (n < 1 || !paths || !out) {
        MOE_LOGE("sensitivity merge: needs shard files and an output");
        return MOE_ERR_INVALID;
    }
    struct shard_file *f = calloc((size_t)n, sizeof *f);
    if (!f) return MOE_ERR_NOMEM;
    enum moe_status st = MOE_OK;
    for (int i = 0; i < n && !st; i++) {
        f[i].path = paths[i];
        st = read_shard(&f[i]);
    }
    for (int i = 1; i < n && !st; i++)
        if (!compatible(&f[0], &f[i])) st = MOE_ERR_INVALID;
    if (!st && !check_cover(f, n)) st = MOE_ERR_INVALID;
    if (!st) st = fill_result(&f[0], r);
    if (st) goto done;
    join(f, n, &r->state);
    const struct moe_profile *p = f[0].p;
    const struct sens_meta meta = {p->n_layers, p->n_experts, p->k, p->moe_layer_index, p->arch, p->model_path,
                                   p->dataset, p->tool_version, r->metric};
    if ((st = sens_save(&meta, &r->state, f[0].cfg, 0, 1, out, 1, &r->spearman))) {
        MOE_LOGE("sensitivity merge: cannot write %s", out);
        goto done;
    }
    r->complete = 1;
    r->n_shards_merged = n;
done:
    for (int i = 0; i < n; i++) {
        moe_sens_state_clear(&f[i].s);
        moe_profile_free(f[i].p);
    }
    free(f);
    return st;
}

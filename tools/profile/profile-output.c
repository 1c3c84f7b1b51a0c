/* profile-output.c - the derived results of a profile as a summary, JSON, CSV
 * files and bundle tuning keys (see profile-results.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "moe-base.h"
#include "moe-bundle.h"
#include "moe-file.h"
#include "moe-tuning.h"
#include "profile-results.h"

#define MEAN_COL moe_profile_results_mean_col

/* top3: the up to 3 most used experts of a layer's counts (ties: lower id). */
static int top3(const int64_t *c, int E, int *top) {
    int m = E < 3 ? E : 3;
    for (int j = 0; j < m; j++) {
        top[j] = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= top[q] == e;
            if (!taken && (top[j] < 0 || c[e] > c[top[j]])) top[j] = e;
        }
    }
    return m;
}

/* ---- summary ---- */

static void pct(FILE *f, double x) {
    if (isfinite(x))
        fprintf(f, " %6.1f%%", 100 * x);
    else
        fprintf(f, " %7s", "-");
}

void moe_profile_print_summary(FILE *f, const struct moe_profile *p, const struct moe_profile_results *r,
                               const struct moe_profile_labels *lb) {
    const int L = r->L, E = r->E, K = r->K, D = MOE_PROFILE_MAX_DIST;
    fprintf(f, "profile of %s (%s) on %s -> %s\n", lb->model, p->arch, lb->dataset, lb->out);
    fprintf(f, "  %d MoE layers x %d experts, top-%d; %d sequences", L, E, K, p->n_seq);
    if (lb->n_ctx > 0) fprintf(f, " of <= %d tokens", lb->n_ctx);
    fprintf(f, ", %lld tokens (%d counted, %d held out)", (long long)moe_profile_n_tokens(p), r->n_train, r->n_held);
    if (r->shard[0] != 0 || r->shard[1] != r->shard[2])
        fprintf(f, "; sequences %lld..%lld of %lld", (long long)r->shard[0], (long long)r->shard[1] - 1,
                (long long)r->shard[2]);
    if (lb->seconds >= 0) fprintf(f, "; %.2f s", lb->seconds);
    fprintf(f, "\n\n");
    fprintf(f, "HOBBIT thresholds (targets low %.0f %%, skip %.0f %%): T1 %.4f  T2 %.4f -> high %.1f %%, low %.1f %%, "
               "skip %.1f %%\n",
            100 * r->targets.low, 100 * r->targets.skip, r->split.t1, r->split.t2, 100 * r->split.high,
            100 * r->split.low, 100 * r->split.skip);
    fprintf(f, "gate weight vs ||g E(x)||: Pearson r = %.4f\n\n", r->pearson);

    fprintf(f, "most used experts per layer (share of the layer's token-slots):\n");
    for (int l = 0; l < L; l++) {
        const int64_t *c = p->popularity + (size_t)l * E;
        int64_t tot = 0;
        for (int e = 0; e < E; e++) tot += c[e];
        fprintf(f, "  layer %3d (model %3d):", l, p->moe_layer_index[l]);
        int top[3], m = top3(c, E, top);
        for (int j = 0; j < m; j++) fprintf(f, "  e%-3d %5.1f %%", top[j], tot ? 100.0 * c[top[j]] / tot : 0.0);
        fputc('\n', f);
    }

    fprintf(f, "\nplacement by popularity, hit rate on the held-out sequences:\n  resident ");
    for (int i = 0; i < 3; i++) fprintf(f, "   %4.0f %%", 100 * r->hit[i][0]);
    fprintf(f, "\n  hit rate ");
    for (int i = 0; i < 3; i++) pct(f, r->hit[i][1]);
    fprintf(f, "\n  random   ");
    for (int i = 0; i < 3; i++) pct(f, r->hit[i][2]);

    fprintf(f, "\n\nstacked-gate prefetch (router of l+j on the gate input of l), mean over layers:\n"
               "  distance   cosine    top-1  top-%d recall\n", K);
    for (int j = 0; j < D; j++) {
        fprintf(f, "  %8d  ", j + 1);
        double c = MEAN_COL(r->sim, L, D, j);
        if (isfinite(c))
            fprintf(f, "%7.4f", c);
        else
            fprintf(f, "%7s", "-");
        pct(f, MEAN_COL(r->top1, L, D, j));
        pct(f, MEAN_COL(r->recall, L, D, j));
        fputc('\n', f);
    }

    fprintf(f, "\nactivation-path dictionaries, recall of the preloaded experts (held out):\n"
               "  key          preload 1  preload 2  preload 3   keys seen\n");
    for (int o = 0; o < 2; o++) {
        fprintf(f, "  %-12s", o ? "l-2, l-1" : "l-1");
        for (int m = 0; m < 3; m++) fprintf(f, "   "), pct(f, r->path[o][0][m]);
        fprintf(f, "   "), pct(f, r->coverage[o]);
        fprintf(f, "\n  %-12s", "  popular");
        for (int m = 0; m < 3; m++) fprintf(f, "   "), pct(f, r->path[o][1][m]);
        fputc('\n', f);
    }

    fprintf(f, "\nreuse by the next token, per rank (chance %.1f %%):\n", 100 * r->reuse_chance);
    for (int l = 0; l < L; l++) {
        fprintf(f, "  layer %3d:", l);
        for (int q = 0; q < K; q++) pct(f, r->reuse[l * K + q]);
        fputc('\n', f);
    }

    if (!r->little_k) {
        fprintf(f, "\nbig-little (MoBiLE): not recorded\n");
        return;
    }
    fprintf(f, "\nbig-little (MoBiLE): little model top-%d vs big top-%d on %lld tokens; same top token %.1f %%\n"
               "  gamma  fallback  agreement\n",
            r->little_k, K, (long long)r->bl_tokens, 100 * r->bl_little_agree);
    for (int i = 1; i < MOE_PROFILE_BL_GAMMAS; i += 2) {
        fprintf(f, "  %5.2f ", r->bl[i][0]);
        pct(f, r->bl[i][1]);
        fprintf(f, "  ");
        pct(f, r->bl[i][2]);
        fputc('\n', f);
    }
    fprintf(f, "  suggested gamma %.3f for a fallback ratio of %.0f %%: fallback %.1f %%, agreement %.1f %%\n",
            r->bl_gamma, 100 * r->targets.fallback, 100 * r->bl_fallback, 100 * r->bl_agree);
}

/* ---- JSON ---- */

/* jnum: x as a JSON number, null when not finite. */
static cJSON *jnum(double x) { return isfinite(x) ? cJSON_CreateNumber(x) : cJSON_CreateNull(); }

/* jstr: s as a JSON string, null for NULL. */
static cJSON *jstr(const char *s) { return s ? cJSON_CreateString(s) : cJSON_CreateNull(); }

/* jarray: x[0..n) as a JSON array of numbers. */
static cJSON *jarray(const double *x, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, jnum(x[i]));
    return a;
}

/* json_sections: the result lists of the summary (placement, stacked, paths). */
static void json_sections(cJSON *o, const struct moe_profile *p, const struct moe_profile_results *r) {
    const int L = r->L, E = r->E, D = MOE_PROFILE_MAX_DIST;
    cJSON *top = cJSON_AddArrayToObject(o, "top_experts");
    for (int l = 0; l < L; l++) {
        int t[3], m = top3(p->popularity + (size_t)l * E, E, t);
        cJSON_AddItemToArray(top, cJSON_CreateIntArray(t, m));
    }
    cJSON *pl = cJSON_AddArrayToObject(o, "placement");
    for (int i = 0; i < 3; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddItemToObject(x, "resident", jnum(r->hit[i][0]));
        cJSON_AddItemToObject(x, "hit_rate", jnum(r->hit[i][1]));
        cJSON_AddItemToObject(x, "random", jnum(r->hit[i][2]));
        cJSON_AddItemToArray(pl, x);
    }
    cJSON *st = cJSON_AddArrayToObject(o, "stacked");
    for (int j = 0; j < D; j++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "distance", j + 1);
        cJSON_AddItemToObject(x, "similarity", jnum(MEAN_COL(r->sim, L, D, j)));
        cJSON_AddItemToObject(x, "top1", jnum(MEAN_COL(r->top1, L, D, j)));
        cJSON_AddItemToObject(x, "recall", jnum(MEAN_COL(r->recall, L, D, j)));
        cJSON_AddItemToArray(st, x);
    }
    cJSON *pa = cJSON_AddArrayToObject(o, "paths");
    for (int k = 0; k < 2; k++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "order", k + 1);
        cJSON_AddItemToObject(x, "dict", jarray(r->path[k][0], 3));
        cJSON_AddItemToObject(x, "popular", jarray(r->path[k][1], 3));
        cJSON_AddItemToObject(x, "key_coverage", jnum(r->coverage[k]));
        cJSON_AddItemToArray(pa, x);
    }
}

/* json_big_little: the big-little object, or null without the pass. */
static cJSON *json_big_little(const struct moe_profile_results *r) {
    if (!r->little_k) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "little_k", r->little_k);
    cJSON_AddNumberToObject(o, "tokens", (double)r->bl_tokens);
    cJSON_AddItemToObject(o, "little_agreement", jnum(r->bl_little_agree));
    cJSON_AddItemToObject(o, "target_fallback", jnum(r->targets.fallback));
    cJSON_AddItemToObject(o, "gamma", jnum(r->bl_gamma));
    cJSON_AddItemToObject(o, "fallback", jnum(r->bl_fallback));
    cJSON_AddItemToObject(o, "agreement", jnum(r->bl_agree));
    cJSON *g = cJSON_AddArrayToObject(o, "grid");
    for (int i = 0; i < MOE_PROFILE_BL_GAMMAS; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddItemToObject(x, "gamma", jnum(r->bl[i][0]));
        cJSON_AddItemToObject(x, "fallback", jnum(r->bl[i][1]));
        cJSON_AddItemToObject(x, "agreement", jnum(r->bl[i][2]));
        cJSON_AddItemToArray(g, x);
    }
    return o;
}

cJSON *moe_profile_results_json(const struct moe_profile *p, const struct moe_profile_results *r,
                                const struct moe_profile_labels *lb) {
    const int L = r->L, K = r->K;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddItemToObject(o, "model", jstr(lb->model));
    cJSON_AddItemToObject(o, "dataset", jstr(lb->dataset));
    cJSON_AddItemToObject(o, "out", jstr(lb->out));
    cJSON_AddItemToObject(o, "arch", jstr(p->arch));
    cJSON_AddNumberToObject(o, "moe_layers", L);
    cJSON_AddNumberToObject(o, "experts", r->E);
    cJSON_AddNumberToObject(o, "k", K);
    cJSON_AddNumberToObject(o, "ctx", lb->n_ctx);
    cJSON_AddNumberToObject(o, "sequences", p->n_seq);
    cJSON_AddNumberToObject(o, "tokens", (double)moe_profile_n_tokens(p));
    cJSON_AddNumberToObject(o, "train_sequences", r->n_train);
    cJSON_AddNumberToObject(o, "heldout_sequences", r->n_held);
    double shard[3] = {(double)r->shard[0], (double)r->shard[1], (double)r->shard[2]};
    cJSON_AddItemToObject(o, "shard", cJSON_CreateDoubleArray(shard, 3));
    cJSON_AddItemToObject(o, "seconds", jnum(lb->seconds >= 0 ? lb->seconds : NAN));
    cJSON *h = cJSON_AddObjectToObject(o, "hobbit");
    cJSON_AddItemToObject(h, "t1", jnum(r->split.t1));
    cJSON_AddItemToObject(h, "t2", jnum(r->split.t2));
    cJSON_AddItemToObject(h, "high", jnum(r->split.high));
    cJSON_AddItemToObject(h, "low", jnum(r->split.low));
    cJSON_AddItemToObject(h, "skip", jnum(r->split.skip));
    cJSON_AddItemToObject(h, "target_low", jnum(r->targets.low));
    cJSON_AddItemToObject(h, "target_skip", jnum(r->targets.skip));
    cJSON_AddItemToObject(o, "gate_output_pearson", jnum(r->pearson));
    json_sections(o, p, r);
    cJSON_AddItemToObject(o, "reuse", jarray(r->reuse, L * K));
    cJSON_AddItemToObject(o, "reuse_chance", jnum(r->reuse_chance));
    cJSON_AddItemToObject(o, "big_little", json_big_little(r));
    return o;
}

enum moe_status moe_profile_print_json(FILE *f, const struct moe_profile *p, const struct moe_profile_results *r,
                                       const struct moe_profile_labels *lb) {
    cJSON *o = moe_profile_results_json(p, r, lb);
    char *s = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!s) return MOE_ERR_NOMEM;
    fprintf(f, "%s\n", s);
    cJSON_free(s);
    return MOE_OK;
}

/* ---- CSV ---- */

/* A CSV file being written: to a new temporary file beside it (moe_tmp_create:
 * exclusive, never through a symlink), renamed by csv_close. */
struct csv_out {
    FILE *f;
    struct moe_tmp_file t;
};

static int csv_open(struct csv_out *c, const char *dir, const char *name, const char *header) {
    c->f = NULL;
    char *path = moe_path_join(dir, name); /* target owns a copy */
    enum moe_status st = path ? moe_tmp_create(path, &c->t) : MOE_ERR_NOMEM;
    free(path);
    if (st) return 0; /* logged */
    if (!(c->f = moe_tmp_stream(&c->t))) {
        moe_tmp_discard(&c->t);
        return 0;
    }
    fprintf(c->f, "%s\n", header);
    return 1;
}

/* csv_close: flush, check and rename into place; on failure remove the temp file. */
static int csv_close(struct csv_out *c) {
    c->f = NULL;
    return moe_tmp_commit(&c->t) == MOE_OK; /* logged on failure */
}

/* csv_num: a number, empty when not finite (what CSV readers take as missing). */
static void csv_num(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.9g", x);
}

enum moe_status moe_profile_write_csv(const char *dir, const struct moe_profile *p,
                                      const struct moe_profile_results *r) {
    const int L = r->L, E = r->E, K = r->K, D = MOE_PROFILE_MAX_DIST;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        MOE_LOGE("cannot create the directory %s: %s", dir, strerror(errno));
        return MOE_ERR_IO;
    }
    struct csv_out c = {0};
    if (!csv_open(&c, dir, "popularity.csv", "layer,model_layer,expert,count,share,rank")) return MOE_ERR_IO;
    for (int l = 0; l < L; l++) {
        const int64_t *cnt = p->popularity + (size_t)l * E;
        int64_t tot = 0;
        for (int e = 0; e < E; e++) tot += cnt[e];
        for (int e = 0; e < E; e++) {
            int rank = 1; /* 1 = most used of the layer; ties share the better rank's order by id */
            for (int q = 0; q < E; q++) rank += cnt[q] > cnt[e] || (cnt[q] == cnt[e] && q < e);
            fprintf(c.f, "%d,%d,%d,%lld,", l, p->moe_layer_index[l], e, (long long)cnt[e]);
            csv_num(c.f, tot ? (double)cnt[e] / tot : NAN);
            fprintf(c.f, ",%d\n", rank);
        }
    }
    if (!csv_close(&c)) return MOE_ERR_IO;

    if (!csv_open(&c, dir, "placement.csv", "resident_fraction,hit_rate,random")) return MOE_ERR_IO;
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) {
            if (j) fputc(',', c.f);
            csv_num(c.f, r->hit[i][j]);
        }
        fputc('\n', c.f);
    }
    if (!csv_close(&c)) return MOE_ERR_IO;

    if (!csv_open(&c, dir, "hobbit.csv", "t1,t2,high,low,skip,target_low,target_skip,gate_output_pearson"))
        return MOE_ERR_IO;
    double h[8] = {r->split.t1, r->split.t2, r->split.high, r->split.low, r->split.skip, r->targets.low,
                   r->targets.skip, r->pearson};
    for (int i = 0; i < 8; i++) {
        if (i) fputc(',', c.f);
        csv_num(c.f, h[i]);
    }
    fputc('\n', c.f);
    if (!csv_close(&c)) return MOE_ERR_IO;

    if (!csv_open(&c, dir, "hobbit_hist.csv", "rank,score_lo,score_hi,count")) return MOE_ERR_IO;
    for (int q = 0; q < K; q++)
        for (int b = 0; b < p->n_bins; b++)
            if (p->hobbit_hist[(size_t)q * p->n_bins + b])
                fprintf(c.f, "%d,%.9g,%.9g,%lld\n", q, (double)b / p->n_bins, (double)(b + 1) / p->n_bins,
                        (long long)p->hobbit_hist[(size_t)q * p->n_bins + b]);
    if (!csv_close(&c)) return MOE_ERR_IO;

    if (!csv_open(&c, dir, "stacked.csv", "layer,distance,similarity,top1,recall")) return MOE_ERR_IO;
    for (int l = 0; l < L; l++)
        for (int j = 0; j < D; j++) {
            fprintf(c.f, "%d,%d,", l, j + 1);
            csv_num(c.f, r->sim[l * D + j]);
            fputc(',', c.f);
            csv_num(c.f, r->top1[l * D + j]);
            fputc(',', c.f);
            csv_num(c.f, r->recall[l * D + j]);
            fputc('\n', c.f);
        }
    if (!csv_close(&c)) return MOE_ERR_IO;

    if (!csv_open(&c, dir, "paths.csv", "order,preload,dictionary_recall,popular_recall,key_coverage"))
        return MOE_ERR_IO;
    for (int o = 0; o < 2; o++)
        for (int m = 0; m < 3; m++) {
            fprintf(c.f, "%d,%d,", o + 1, m + 1);
            csv_num(c.f, r->path[o][0][m]);
            fputc(',', c.f);
            csv_num(c.f, r->path[o][1][m]);
            fputc(',', c.f);
            csv_num(c.f, r->coverage[o]);
            fputc('\n', c.f);
        }
    if (!csv_close(&c)) return MOE_ERR_IO;

    if (!csv_open(&c, dir, "reuse.csv", "layer,rank,reuse,chance")) return MOE_ERR_IO;
    for (int l = 0; l < L; l++)
        for (int q = 0; q < K; q++) {
            fprintf(c.f, "%d,%d,", l, q);
            csv_num(c.f, r->reuse[l * K + q]);
            fputc(',', c.f);
            csv_num(c.f, r->reuse_chance);
            fputc('\n', c.f);
        }
    if (!csv_close(&c)) return MOE_ERR_IO;

    if (!csv_open(&c, dir, "big_little.csv", "gamma,fallback,agreement,little_k,suggested")) return MOE_ERR_IO;
    if (r->little_k) {
        for (int i = 0; i < MOE_PROFILE_BL_GAMMAS; i++) {
            for (int j = 0; j < 3; j++) csv_num(c.f, r->bl[i][j]), fputc(',', c.f);
            fprintf(c.f, "%d,0\n", r->little_k);
        }
        csv_num(c.f, r->bl_gamma), fputc(',', c.f);
        csv_num(c.f, r->bl_fallback), fputc(',', c.f);
        csv_num(c.f, r->bl_agree);
        fprintf(c.f, ",%d,1\n", r->little_k);
    }
    if (!csv_close(&c)) return MOE_ERR_IO;
    return MOE_OK;
}

/* ---- bundle tuning ---- */

/* check_shape: the bundle's expert layout is the profile's model. */
static int check_shape(const struct moe_bundle *b, const struct moe_profile *p) {
    uint32_t nl = 0, ne = 0, np = 0;
    moe_bundle_expert_layout(b, &nl, &ne, &np);
    if ((int)ne != p->n_experts) return 0;
    int moe_layers = 0;
    for (uint32_t l = 0; l < nl; l++) moe_layers += moe_bundle_layer_has_experts(b, l);
    if (moe_layers != p->n_layers) return 0;
    for (int l = 0; l < p->n_layers; l++)
        if (p->moe_layer_index[l] < 0 || !moe_bundle_layer_has_experts(b, (uint32_t)p->moe_layer_index[l])) return 0;
    return 1;
}

enum moe_status moe_profile_tuning_paths(struct moe_bundle_kv *kv, const struct moe_trace *tr, int o) {
    const int L = tr->n_layers, E = tr->n_experts, K = tr->k, top = K > 3 ? (K < E ? K : E) : (E < 3 ? E : 3);
    const struct moe_trace t = *tr;
    struct moe_path_dict *pd = NULL;
    int64_t *layer = NULL, *keys = NULL, *totals = NULL, *next = NULL;
    double *prob = NULL;
    size_t n = 0, cap = 0;
    enum moe_status st = MOE_OK;
    if (L > o) {
        if ((st = moe_path_dict_new(L, E, K, o, &pd)) || (st = moe_path_dict_add(pd, &t))) goto done;
        for (int l = o; l < L; l++) {
            struct moe_path_export ex;
            if ((st = moe_path_dict_export(pd, l, top, 2, 4096, &ex))) goto done;
            if (n + ex.n > cap) {
                size_t c = (n + ex.n) * 2;
                int64_t *a = realloc(layer, c * sizeof *a), *b = realloc(keys, c * o * K * sizeof *b),
                        *d = realloc(totals, c * sizeof *d), *e = realloc(next, c * top * sizeof *e);
                double *f = realloc(prob, c * top * sizeof *f);
                layer = a ? a : layer, keys = b ? b : keys, totals = d ? d : totals, next = e ? e : next;
                prob = f ? f : prob;
                if (!a || !b || !d || !e || !f) {
                    moe_path_export_free(&ex);
                    st = MOE_ERR_NOMEM;
                    goto done;
                }
                cap = c;
            }
            for (size_t i = 0; i < ex.n; i++, n++) {
                layer[n] = l;
                totals[n] = ex.totals[i];
                for (int j = 0; j < o * K; j++) keys[n * o * K + j] = ex.keys[i * ex.key_len + j];
                for (int j = 0; j < top; j++) {
                    next[n * top + j] = ex.next[i * top + j];
                    prob[n * top + j] = ex.prob[i * top + j];
                }
            }
            moe_path_export_free(&ex);
        }
    }
    st = moe_tuning_set_paths(kv, o, o * K, top, n, layer, keys, totals, next, prob);
done:
    moe_path_dict_free(pd);
    free(layer);
    free(keys);
    free(totals);
    free(next);
    free(prob);
    return st;
}

enum moe_status moe_profile_write_tuning(const char *bundle, const struct moe_profile *p,
                                         const struct moe_profile_results *r, int *n_keys) {
    struct moe_bundle *b = NULL;
    struct moe_bundle_kv *kv = NULL;
    const int32_t *ord32 = NULL;
    enum moe_status st;
    if (n_keys) *n_keys = 0;
    if ((st = moe_bundle_open(bundle, &b))) return st;
    if (!check_shape(b, p)) {
        MOE_LOGE("%s: the bundle's experts (layers, experts per layer) are not the profile's model", bundle);
        st = MOE_ERR_INVALID;
        goto done;
    }
    if ((st = moe_bundle_kv_new(&kv)) || (st = moe_bundle_kv_copy(kv, moe_bundle_tuning(b)))) goto done;
    moe_bundle_free(b); /* replace_tuning opens the file itself */
    b = NULL;
    const size_t le = (size_t)p->n_layers * p->n_experts;
    if ((st = moe_profile_get_i32(p, "placement_order", NULL, NULL, &ord32))) goto done;
    struct moe_trace t;
    moe_profile_trace(p, &t);
    if ((st = moe_tuning_set_profile(kv, p->dataset, moe_profile_n_tokens(p), p->tool_version)) ||
        (st = moe_tuning_set_thresholds(kv, r->split.t1, r->split.t2, r->targets.low, r->targets.skip)) ||
        (st = moe_tuning_set_placement_order(kv, ord32, le)) || (st = moe_profile_tuning_paths(kv, &t, 1)) ||
        (st = moe_profile_tuning_paths(kv, &t, 2)))
        goto done;
    if (r->little_k && isfinite(r->bl_gamma)) {
        if ((st = moe_tuning_set_big_little(kv, r->bl_gamma, r->targets.fallback, r->little_k))) goto done;
    } else {
        /* no big-little pass this time (or no token in it): a gamma from an
         * older profile would not match */
        moe_tuning_remove_big_little(kv);
    }
    if ((st = moe_bundle_replace_tuning(bundle, kv))) goto done;
    if (n_keys) *n_keys = (int)moe_bundle_kv_count(kv);
done:
    moe_bundle_free(b);
    moe_bundle_kv_free(kv);
    return st;
}

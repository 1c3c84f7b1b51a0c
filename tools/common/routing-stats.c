/* routing-stats.c - popularity, HOBBIT thresholds, path dictionaries and reuse
 * from routing traces (see routing-stats.h). */
#include "routing-stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* slot: the k experts of token `tok` at MoE layer `l`. */
static const int16_t *slot(const struct moe_trace *t, int64_t tok, int l) {
    return t->experts + ((size_t)tok * (size_t)t->n_layers + (size_t)l) * (size_t)t->k;
}

/* ---- popularity ---- */

void moe_popularity_count(const struct moe_trace *t, int64_t *counts) {
    const int64_t n = moe_trace_n_tokens(t);
    for (int64_t i = 0; i < n; i++)
        for (int l = 0; l < t->n_layers; l++)
            for (int j = 0; j < t->k; j++) counts[(size_t)l * t->n_experts + slot(t, i, l)[j]]++;
}

static const int64_t *g_sort_counts;

static int by_count_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_sort_counts[x] != g_sort_counts[y]) return g_sort_counts[x] < g_sort_counts[y] ? 1 : -1;
    return x < y ? -1 : x > y;
}

void moe_placement_order(const int64_t *counts, int n_layers, int n_experts, int32_t *order) {
    const int n = n_layers * n_experts;
    for (int i = 0; i < n; i++) order[i] = i;
    g_sort_counts = counts;
    qsort(order, (size_t)n, sizeof *order, by_count_desc);
    g_sort_counts = NULL;
}

double moe_placement_hit_rate(const struct moe_trace *t, const int32_t *order, int n_resident) {
    const int n_pairs = t->n_layers * t->n_experts;
    char *resident = calloc((size_t)n_pairs, 1);
    if (!resident) return NAN;
    for (int i = 0; i < n_resident && i < n_pairs; i++) resident[order[i]] = 1;
    const int64_t n = moe_trace_n_tokens(t);
    int64_t hits = 0, total = 0;
    for (int64_t i = 0; i < n; i++)
        for (int l = 0; l < t->n_layers; l++)
            for (int j = 0; j < t->k; j++, total++) hits += resident[l * t->n_experts + slot(t, i, l)[j]];
    free(resident);
    return total ? (double)hits / (double)total : NAN;
}

/* ---- HOBBIT ---- */

struct moe_hobbit_split moe_hobbit_split_at(const float *s, size_t n, double t1, double t2) {
    struct moe_hobbit_split r = {t1, t2, 0, 0, 0};
    size_t hi = 0, lo = 0, sk = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] <= t1)
            hi++;
        else if (s[i] <= t2)
            lo++;
        else
            sk++;
    }
    if (n) {
        r.high = (double)hi / (double)n;
        r.low = (double)lo / (double)n;
        r.skip = (double)sk / (double)n;
    }
    return r;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* threshold_for_share: the observed value v for which the share of scores
 * above v is closest to `share` (v = the largest score gives share 0). */
static double threshold_for_share(const float *sorted, size_t n, double share) {
    double best_v = sorted[n - 1], best_err = share; /* above the largest: 0 */
    for (size_t i = 0; i < n;) {
        size_t j = i + 1; /* always advances, whatever the values compare like */
        while (j < n && sorted[j] == sorted[i]) j++; /* scores <= sorted[i] are [0, j) */
        double above = (double)(n - j) / (double)n;
        if (fabs(above - share) < best_err) {
            best_err = fabs(above - share);
            best_v = sorted[i];
        }
        i = j;
    }
    return best_v;
}

enum moe_status moe_hobbit_thresholds(const float *s, size_t n, double target_low, double target_skip,
                                      struct moe_hobbit_split *out) {
    if (n == 0 || target_low < 0 || target_skip < 0 || target_low + target_skip > 1) {
        MOE_LOGE("HOBBIT thresholds need scores and target shares with low + skip <= 1 (got %g + %g)", target_low,
                 target_skip);
        return MOE_ERR_INVALID;
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(s[i])) {
            MOE_LOGE("HOBBIT thresholds: score %zu is %g, not a finite number", i, (double)s[i]);
            return MOE_ERR_RANGE;
        }
    float *sorted = malloc(sizeof(float) * n);
    if (!sorted) return MOE_ERR_NOMEM;
    memcpy(sorted, s, sizeof(float) * n);
    qsort(sorted, n, sizeof(float), cmp_float);
    double t2 = threshold_for_share(sorted, n, target_skip);
    double t1 = threshold_for_share(sorted, n, target_skip + target_low);
    if (t1 > t2) t1 = t2;
    free(sorted);
    *out = moe_hobbit_split_at(s, n, t1, t2);
    return MOE_OK;
}

/* ---- path dictionaries ---- */

/* An open-addressing table per layer: key = the sorted expert sets of the
 * `order` previous layers; value = counts per expert at this layer. */
struct path_table {
    size_t cap, n;
    int16_t *keys;    /* [cap x key_len] */
    uint8_t *used;    /* [cap] */
    int64_t *counts;  /* [cap x n_experts] */
    int64_t *totals;  /* [cap] tokens with this key */
};

struct moe_path_dict {
    int n_layers, n_experts, k, order, key_len;
    struct path_table *tables; /* [n_layers] (the first `order` stay empty) */
};

enum moe_status moe_path_dict_new(int n_layers, int n_experts, int k, int order, struct moe_path_dict **out) {
    *out = NULL;
    if (order < 1 || order > 2 || n_layers < 1 || k < 1 || n_experts < k) return MOE_ERR_INVALID;
    struct moe_path_dict *d = calloc(1, sizeof *d);
    if (!d) return MOE_ERR_NOMEM;
    *d = (struct moe_path_dict){n_layers, n_experts, k, order, order * k, calloc((size_t)n_layers, sizeof(struct path_table))};
    if (!d->tables) {
        free(d);
        return MOE_ERR_NOMEM;
    }
    *out = d;
    return MOE_OK;
}

void moe_path_dict_free(struct moe_path_dict *d) {
    if (!d) return;
    for (int l = 0; l < d->n_layers; l++) {
        free(d->tables[l].keys);
        free(d->tables[l].used);
        free(d->tables[l].counts);
        free(d->tables[l].totals);
    }
    free(d->tables);
    free(d);
}

static uint64_t hash_key(const int16_t *key, int len) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < len; i++) {
        h ^= (uint16_t)key[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* find_slot: the slot of `key` in table tb, or the empty slot where it would go. */
static size_t find_slot(const struct path_table *tb, const int16_t *key, int len) {
    size_t i = hash_key(key, len) & (tb->cap - 1);
    while (tb->used[i] && memcmp(tb->keys + i * (size_t)len, key, sizeof(int16_t) * (size_t)len))
        i = (i + 1) & (tb->cap - 1);
    return i;
}

/* grow: double the table (or create it). */
static enum moe_status grow(struct path_table *tb, int len, int E) {
    struct path_table nt = {tb->cap ? 2 * tb->cap : 64, 0, NULL, NULL, NULL, NULL};
    nt.keys = malloc(sizeof(int16_t) * nt.cap * (size_t)len);
    nt.used = calloc(nt.cap, 1);
    nt.counts = calloc(nt.cap * (size_t)E, sizeof(int64_t));
    nt.totals = calloc(nt.cap, sizeof(int64_t));
    if (!nt.keys || !nt.used || !nt.counts || !nt.totals) {
        free(nt.keys);
        free(nt.used);
        free(nt.counts);
        free(nt.totals);
        return MOE_ERR_NOMEM;
    }
    for (size_t i = 0; i < tb->cap; i++) {
        if (!tb->used[i]) continue;
        size_t j = find_slot(&nt, tb->keys + i * (size_t)len, len);
        nt.used[j] = 1;
        memcpy(nt.keys + j * (size_t)len, tb->keys + i * (size_t)len, sizeof(int16_t) * (size_t)len);
        memcpy(nt.counts + j * (size_t)E, tb->counts + i * (size_t)E, sizeof(int64_t) * (size_t)E);
        nt.totals[j] = tb->totals[i];
        nt.n++;
    }
    free(tb->keys);
    free(tb->used);
    free(tb->counts);
    free(tb->totals);
    *tb = nt;
    return MOE_OK;
}

static int cmp_i16(const void *a, const void *b) { return *(const int16_t *)a - *(const int16_t *)b; }

/* make_key: the sorted expert sets of layers l-order .. l-1 of token tok. */
static void make_key(const struct moe_path_dict *d, const struct moe_trace *t, int64_t tok, int l, int16_t *key) {
    for (int o = 0; o < d->order; o++) {
        int16_t *part = key + o * d->k;
        memcpy(part, slot(t, tok, l - d->order + o), sizeof(int16_t) * (size_t)d->k);
        qsort(part, (size_t)d->k, sizeof(int16_t), cmp_i16);
    }
}

/* add_counts: counts[e] += c[e] for key in layer l's table. */
static enum moe_status add_counts(struct moe_path_dict *d, int l, const int16_t *key, const int64_t *c,
                                  const int16_t *experts, int64_t total) {
    struct path_table *tb = &d->tables[l];
    enum moe_status st;
    if ((tb->n + 1) * 2 > tb->cap && (st = grow(tb, d->key_len, d->n_experts))) return st;
    size_t i = find_slot(tb, key, d->key_len);
    if (!tb->used[i]) {
        tb->used[i] = 1;
        memcpy(tb->keys + i * (size_t)d->key_len, key, sizeof(int16_t) * (size_t)d->key_len);
        tb->n++;
    }
    int64_t *row = tb->counts + i * (size_t)d->n_experts;
    if (c)
        for (int e = 0; e < d->n_experts; e++) row[e] += c[e];
    else
        for (int j = 0; j < d->k; j++) row[experts[j]]++;
    tb->totals[i] += total;
    return MOE_OK;
}

enum moe_status moe_path_dict_add(struct moe_path_dict *d, const struct moe_trace *t) {
    if (t->n_layers != d->n_layers || t->n_experts != d->n_experts || t->k != d->k) return MOE_ERR_INVALID;
    int16_t key[64];
    if (d->key_len > 64) return MOE_ERR_UNSUPPORTED;
    const int64_t n = moe_trace_n_tokens(t);
    enum moe_status st;
    for (int64_t i = 0; i < n; i++)
        for (int l = d->order; l < d->n_layers; l++) {
            make_key(d, t, i, l, key);
            if ((st = add_counts(d, l, key, NULL, slot(t, i, l), 1))) return st;
        }
    return MOE_OK;
}

enum moe_status moe_path_dict_merge(struct moe_path_dict *dst, const struct moe_path_dict *src) {
    if (dst->n_layers != src->n_layers || dst->n_experts != src->n_experts || dst->k != src->k ||
        dst->order != src->order)
        return MOE_ERR_INVALID;
    enum moe_status st;
    for (int l = 0; l < src->n_layers; l++) {
        const struct path_table *tb = &src->tables[l];
        for (size_t i = 0; i < tb->cap; i++)
            if (tb->used[i] && (st = add_counts(dst, l, tb->keys + i * (size_t)src->key_len,
                                                tb->counts + i * (size_t)src->n_experts, NULL, tb->totals[i])))
                return st;
    }
    return MOE_OK;
}

/* lookup: the count row and total of token tok's key at layer l; NULL if unseen. */
static const int64_t *lookup(const struct moe_path_dict *d, const struct moe_trace *t, int64_t tok, int l,
                             int64_t *total) {
    const struct path_table *tb = &d->tables[l];
    if (l < d->order || tb->n == 0) return NULL;
    int16_t key[64];
    make_key(d, t, tok, l, key);
    size_t i = find_slot(tb, key, d->key_len);
    if (!tb->used[i]) return NULL;
    *total = tb->totals[i];
    return tb->counts + i * (size_t)d->n_experts;
}

double moe_path_dict_prob(const struct moe_path_dict *d, const struct moe_trace *t, int64_t tok, int layer, int e) {
    int64_t total = 0;
    const int64_t *row = lookup(d, t, tok, layer, &total);
    return row && total ? (double)row[e] / (double)total : -1;
}

size_t moe_path_dict_keys(const struct moe_path_dict *d, int layer) { return d->tables[layer].n; }

/* top_m: indices of the m largest counts (ties: lower index). */
static void top_m(const int64_t *counts, int E, int m, int *out) {
    for (int j = 0; j < m; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= out[i] == e;
            if (!taken && (best < 0 || counts[e] > counts[best])) best = e;
        }
        out[j] = best;
    }
}

/* Entry order for export: more tokens first, then the keys in numeric order. */
struct export_ref {
    const struct path_table *tb;
    size_t slot;
    int key_len;
};

static int cmp_export(const void *a, const void *b) {
    const struct export_ref *x = a, *y = b;
    int64_t tx = x->tb->totals[x->slot], ty = y->tb->totals[y->slot];
    if (tx != ty) return tx > ty ? -1 : 1;
    const int16_t *kx = x->tb->keys + x->slot * (size_t)x->key_len, *ky = y->tb->keys + y->slot * (size_t)y->key_len;
    for (int i = 0; i < x->key_len; i++)
        if (kx[i] != ky[i]) return kx[i] < ky[i] ? -1 : 1;
    return 0;
}

enum moe_status moe_path_dict_export(const struct moe_path_dict *d, int layer, int top, int64_t min_count,
                                     size_t max_keys, struct moe_path_export *out) {
    memset(out, 0, sizeof *out);
    if (layer < 0 || layer >= d->n_layers || top < 1 || top > d->n_experts) return MOE_ERR_INVALID;
    const struct path_table *tb = &d->tables[layer];
    struct export_ref *refs = malloc((tb->n ? tb->n : 1) * sizeof *refs);
    if (!refs) return MOE_ERR_NOMEM;
    size_t n = 0;
    for (size_t i = 0; i < tb->cap; i++)
        if (tb->used[i] && tb->totals[i] >= min_count) refs[n++] = (struct export_ref){tb, i, d->key_len};
    qsort(refs, n, sizeof *refs, cmp_export);
    if (n > max_keys) n = max_keys;
    out->key_len = d->key_len;
    out->top = top;
    out->n = n;
    out->keys = malloc((n ? n : 1) * (size_t)d->key_len * sizeof *out->keys);
    out->totals = malloc((n ? n : 1) * sizeof *out->totals);
    out->next = malloc((n ? n : 1) * (size_t)top * sizeof *out->next);
    out->prob = malloc((n ? n : 1) * (size_t)top * sizeof *out->prob);
    int *pred = malloc((size_t)top * sizeof *pred);
    if (!out->keys || !out->totals || !out->next || !out->prob || !pred) {
        free(pred);
        free(refs);
        moe_path_export_free(out);
        return MOE_ERR_NOMEM;
    }
    for (size_t q = 0; q < n; q++) {
        size_t i = refs[q].slot;
        const int64_t *row = tb->counts + i * (size_t)d->n_experts;
        memcpy(out->keys + q * (size_t)d->key_len, tb->keys + i * (size_t)d->key_len,
               sizeof(int16_t) * (size_t)d->key_len);
        out->totals[q] = tb->totals[i];
        top_m(row, d->n_experts, top, pred);
        for (int j = 0; j < top; j++) {
            out->next[q * (size_t)top + j] = (int16_t)pred[j];
            out->prob[q * (size_t)top + j] = tb->totals[i] ? (double)row[pred[j]] / (double)tb->totals[i] : 0;
        }
    }
    free(pred);
    free(refs);
    return MOE_OK;
}

void moe_path_export_free(struct moe_path_export *e) {
    free(e->keys);
    free(e->totals);
    free(e->next);
    free(e->prob);
    memset(e, 0, sizeof *e);
}

enum moe_status moe_path_dict_accuracy(const struct moe_path_dict *d, const int64_t *popularity,
                                       const struct moe_trace *t, struct moe_preload_accuracy *out) {
    memset(out, 0, sizeof *out);
    if (t->n_layers != d->n_layers || t->n_experts != d->n_experts || t->k != d->k) return MOE_ERR_INVALID;
    const int E = d->n_experts, K = d->k, M = E < 3 ? E : 3;
    const int64_t n = moe_trace_n_tokens(t);
    double hit[3] = {0}, pop_hit[3] = {0};
    int64_t seen = 0, pairs = 0;
    for (int l = d->order; l < d->n_layers; l++) {
        int pop_top[3];
        top_m(popularity + (size_t)l * E, E, M, pop_top);
        for (int64_t i = 0; i < n; i++, pairs++) {
            int64_t total = 0;
            const int64_t *row = lookup(d, t, i, l, &total);
            int pred[3];
            if (row) {
                seen++;
                top_m(row, E, M, pred);
            } else {
                memcpy(pred, pop_top, sizeof pred);
            }
            const int16_t *actual = slot(t, i, l);
            for (int m = 1; m <= M; m++) {
                int h = 0, hp = 0;
                for (int j = 0; j < K; j++)
                    for (int q = 0; q < m; q++) {
                        h += actual[j] == pred[q];
                        hp += actual[j] == pop_top[q];
                    }
                hit[m - 1] += (double)h / K;
                pop_hit[m - 1] += (double)hp / K;
            }
        }
    }
    out->n = pairs;
    for (int m = 0; m < M && pairs; m++) {
        out->recall[m] = hit[m] / (double)pairs;
        out->popular[m] = pop_hit[m] / (double)pairs;
    }
    out->key_coverage = pairs ? (double)seen / (double)pairs : 0;
    return MOE_OK;
}

/* ---- reuse ---- */

void moe_reuse(const struct moe_trace *t, double *reuse, double *chance) {
    const int L = t->n_layers, K = t->k;
    int64_t *hits = calloc((size_t)L * K, sizeof *hits);
    int64_t pairs = 0;
    *chance = (double)K / (double)t->n_experts;
    if (!hits) {
        for (int i = 0; i < L * K; i++) reuse[i] = NAN;
        return;
    }
    for (int s = 0; s < t->n_seq; s++)
        for (int64_t i = t->seq_start[s]; i + 1 < t->seq_start[s + 1]; i++, pairs++)
            for (int l = 0; l < L; l++) {
                const int16_t *a = slot(t, i, l), *b = slot(t, i + 1, l);
                for (int r = 0; r < K; r++)
                    for (int j = 0; j < K; j++)
                        if (a[r] == b[j]) {
                            hits[l * K + r]++;
                            break;
                        }
            }
    for (int i = 0; i < L * K; i++) reuse[i] = pairs ? (double)hits[i] / (double)pairs : NAN;
    free(hits);
}

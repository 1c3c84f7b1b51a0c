/* profile-derive.c - every derived result of a routing profile, computed from
 * the profile alone (see profile-results.h for the arrays). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "profile-results.h"

static const double k_resident[3] = {0.25, 0.50, 0.75};

struct moe_profile_targets moe_profile_default_targets(void) {
    return (struct moe_profile_targets){.low = 0.30, .skip = 0.03, .heldout = 0.2, .fallback = 0.2};
}

void moe_profile_results_free(struct moe_profile_results *r) {
    free(r->sim);
    free(r->top1);
    free(r->recall);
    free(r->reuse);
    r->sim = r->top1 = r->recall = r->reuse = NULL;
}

double moe_profile_results_mean_col(const double *x, int L, int w, int j) {
    double s = 0;
    int n = 0;
    for (int l = 0; l < L; l++)
        if (isfinite(x[l * w + j])) s += x[l * w + j], n++;
    return n ? s / n : NAN;
}

static double div_or_nan(double a, double n) { return n > 0 ? a / n : NAN; }

/* get_shaped: derived array `name` of type f64 or i64 with exactly the given
 * dims; MOE_ERR_NOT_FOUND if absent, MOE_ERR_SHAPE (logged) if different. */
static enum moe_status get_shaped(const struct moe_profile *p, const char *name, int i64, int ndims,
                                  const int64_t *want, const void **data) {
    int nd = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    enum moe_status st = i64 ? moe_profile_get_i64(p, name, &nd, dims, (const int64_t **)data)
                             : moe_profile_get_f64(p, name, &nd, dims, (const double **)data);
    if (st == MOE_ERR_NOT_FOUND) return st;
    int ok = !st && nd == ndims;
    for (int d = 0; ok && d < ndims; d++) ok = dims[d] == want[d];
    if (!ok) {
        MOE_LOGE("derived array \"%s\" has the wrong type or shape", name);
        return MOE_ERR_SHAPE;
    }
    return MOE_OK;
}

/* split_trace: the first n_train sequences of `all` and the rest, as views;
 * held_start (caller frees) backs the held-out view's offsets. */
static enum moe_status split_trace(const struct moe_trace *all, int n_train, struct moe_trace *train,
                                   struct moe_trace *held, int64_t **held_start) {
    const int n_held = all->n_seq - n_train, row = all->n_layers * all->k;
    *train = *all;
    train->n_seq = n_train;
    *held = *all;
    held->n_seq = n_held;
    if (!(*held_start = malloc((size_t)(n_held + 1) * sizeof **held_start))) return MOE_ERR_NOMEM;
    const int64_t off = all->seq_start[n_train];
    for (int i = 0; i <= n_held; i++) (*held_start)[i] = all->seq_start[n_train + i] - off;
    held->seq_start = *held_start;
    held->experts = all->experts + (size_t)off * row;
    held->weights = all->weights + (size_t)off * row;
    return MOE_OK;
}

/* derive_paths: EdgeMoE dictionaries counted on train, measured on held. */
static void derive_paths(struct moe_profile_results *r, const struct moe_trace *train, const struct moe_trace *held,
                         const int64_t *pop_train) {
    for (int o = 1; o <= 2; o++) {
        struct moe_preload_accuracy acc = {0};
        struct moe_path_dict *pd = NULL;
        int ok = r->n_held && r->L > o && !moe_path_dict_new(r->L, r->E, r->K, o, &pd) &&
                 !moe_path_dict_add(pd, train) && !moe_path_dict_accuracy(pd, pop_train, held, &acc) && acc.n > 0;
        moe_path_dict_free(pd);
        for (int m = 0; m < 3; m++) {
            r->path[o - 1][0][m] = ok && m < r->E ? acc.recall[m] : NAN;
            r->path[o - 1][1][m] = ok && m < r->E ? acc.popular[m] : NAN;
        }
        r->coverage[o - 1] = ok ? acc.key_coverage : NAN;
    }
}

/* hist_ok: counts non-negative and their total representable (the file is
 * untrusted; a damaged histogram is reported, not summed into overflow). */
static int hist_ok(const int64_t *h, int64_t n) {
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++)
        if (h[i] < 0 || __builtin_add_overflow(total, h[i], &total)) return 0;
    return 1;
}

/* derive_big_little: MoBiLE's fallback ratio and agreement for each gamma
 * from the histogram of the little model's top probability; the suggested
 * gamma is the bin edge whose fallback ratio is closest to the target (the
 * smaller gamma on a tie). */
static void derive_big_little(struct moe_profile_results *r, const int64_t *hist) {
    const int B = MOE_PROFILE_BL_BINS;
    int64_t n = 0, agree = 0;
    for (int b = 0; b < B; b++) n += hist[b] + hist[B + b], agree += hist[b]; /* checked by hist_ok */
    r->bl_tokens = n;
    r->bl_little_agree = div_or_nan((double)agree, (double)n);
    /* below[b] = tokens with bin < b; dis_above[b] = disagreeing tokens with bin >= b */
    int64_t below = 0, dis_above = n - agree;
    double best = INFINITY;
    r->bl_gamma = r->bl_fallback = r->bl_agree = NAN;
    for (int b = 0; b <= B; b++) {
        double gamma = (double)b / B, fb = div_or_nan((double)below, (double)n);
        double ag = div_or_nan((double)(n - dis_above), (double)n);
        if (b % (B / 20) == 0 && b > 0 && b < B) {
            int i = b / (B / 20) - 1;
            r->bl[i][0] = gamma, r->bl[i][1] = fb, r->bl[i][2] = ag;
        }
        /* compared in tokens, where equal distances are exactly equal */
        double dist = fabs((double)below - r->targets.fallback * (double)n);
        if (n && dist < best - 1e-9) {
            best = dist;
            r->bl_gamma = gamma, r->bl_fallback = fb, r->bl_agree = ag;
        }
        if (b < B) below += hist[b] + hist[B + b], dis_above -= hist[B + b];
    }
}

/* store: every result of r into p's derived arrays. */
static enum moe_status store(struct moe_profile *p, const struct moe_profile_results *r, const int32_t *order,
                             const double *pearson) {
    const int L = r->L, E = r->E, K = r->K, D = MOE_PROFILE_MAX_DIST;
    enum moe_status st;
    double thr[5] = {r->split.t1, r->split.t2, r->split.high, r->split.low, r->split.skip};
    double tg[4] = {r->targets.low, r->targets.skip, r->targets.heldout, r->targets.fallback};
    int64_t split_seq[2] = {r->n_train, r->n_held};
    int64_t d1[1], d2[2];
#define PUT1(fn, name, n, x) (d1[0] = (n), (st = fn(p, name, 1, d1, x)))
#define PUT2(fn, name, a, b, x) (d2[0] = (a), d2[1] = (b), (st = fn(p, name, 2, d2, x)))
    if (PUT1(moe_profile_put_f64, "targets", 4, tg) || PUT1(moe_profile_put_i32, "placement_order", L * E, order) ||
        PUT2(moe_profile_put_f64, "placement_hit_rate", 3, 3, &r->hit[0][0]) ||
        PUT1(moe_profile_put_f64, "hobbit_thresholds", 5, thr) ||
        PUT1(moe_profile_put_f64, "gate_output_pearson", 1, pearson) ||
        PUT2(moe_profile_put_f64, "layer_similarity", L, D, r->sim) ||
        PUT2(moe_profile_put_f64, "stacked_top1", L, D, r->top1) ||
        PUT2(moe_profile_put_f64, "stacked_recall", L, D, r->recall) ||
        PUT2(moe_profile_put_f64, "path_accuracy_order1", 2, 3, &r->path[0][0][0]) ||
        PUT2(moe_profile_put_f64, "path_accuracy_order2", 2, 3, &r->path[1][0][0]) ||
        PUT1(moe_profile_put_f64, "path_key_coverage", 2, r->coverage) ||
        PUT2(moe_profile_put_f64, "reuse", L, K, r->reuse) ||
        PUT1(moe_profile_put_f64, "reuse_chance", 1, &r->reuse_chance) ||
        PUT1(moe_profile_put_i64, "split_sequences", 2, split_seq))
        return st;
    if (r->little_k) {
        double sum[5] = {r->bl_little_agree, r->bl_gamma, r->bl_fallback, r->bl_agree, r->little_k};
        if (PUT2(moe_profile_put_f64, "big_little", MOE_PROFILE_BL_GAMMAS, 3, &r->bl[0][0]) ||
            PUT1(moe_profile_put_f64, "big_little_summary", 5, sum))
            return st;
    }
#undef PUT1
#undef PUT2
    return MOE_OK;
}

enum moe_status moe_profile_derive(struct moe_profile *p, const struct moe_profile_targets *t,
                                   struct moe_profile_results *r) {
    const int L = p->n_layers, E = p->n_experts, K = p->k, D = MOE_PROFILE_MAX_DIST;
    memset(r, 0, sizeof *r);
    if (!(t->low >= 0 && t->skip >= 0 && t->low + t->skip <= 1 && t->heldout >= 0 && t->heldout <= 0.9 &&
          t->fallback >= 0 && t->fallback <= 1)) {
        MOE_LOGE("targets out of range (low %g, skip %g, heldout %g, fallback %g)", t->low, t->skip, t->heldout,
                 t->fallback);
        return MOE_ERR_INVALID;
    }
    r->L = L, r->E = E, r->K = K, r->targets = *t;
    enum moe_status st = MOE_ERR_NOMEM;
    struct moe_trace all, train, held;
    moe_profile_trace(p, &all);
    const int64_t n_tok = moe_trace_n_tokens(&all);
    int32_t *order = malloc((size_t)L * E * sizeof *order), *order_train = malloc((size_t)L * E * sizeof *order);
    int64_t *pop_train = calloc((size_t)L * E, sizeof *pop_train), *held_start = NULL;
    float *s = malloc((size_t)(n_tok ? n_tok : 1) * L * K * sizeof *s);
    r->sim = malloc((size_t)L * D * sizeof(double));
    r->top1 = malloc((size_t)L * D * sizeof(double));
    r->recall = malloc((size_t)L * D * sizeof(double));
    r->reuse = malloc((size_t)L * K * sizeof(double));
    if (!order || !order_train || !pop_train || !s || !r->sim || !r->top1 || !r->recall || !r->reuse) goto done;

    /* the recorder's sums (optional) and settings */
    const double *pearson_sums = NULL, *stacked = NULL;
    const int64_t *bl_hist = NULL, *record = NULL, *shard = NULL;
    int64_t d6[1] = {6}, dst[3] = {L, D, 4}, dbl[2] = {2, MOE_PROFILE_BL_BINS}, d4[1] = {4}, d3[1] = {3};
    if (((st = get_shaped(p, MOE_PROFILE_SUM_PREFIX "pearson", 0, 1, d6, (const void **)&pearson_sums)) &&
         st != MOE_ERR_NOT_FOUND) ||
        ((st = get_shaped(p, MOE_PROFILE_SUM_PREFIX "stacked", 0, 3, dst, (const void **)&stacked)) &&
         st != MOE_ERR_NOT_FOUND) ||
        ((st = get_shaped(p, MOE_PROFILE_SUM_PREFIX "big_little_maxprob", 1, 2, dbl, (const void **)&bl_hist)) &&
         st != MOE_ERR_NOT_FOUND) ||
        ((st = get_shaped(p, MOE_PROFILE_CONFIG_PREFIX "record", 1, 1, d4, (const void **)&record)) &&
         st != MOE_ERR_NOT_FOUND) ||
        ((st = get_shaped(p, "shard", 1, 1, d3, (const void **)&shard)) && st != MOE_ERR_NOT_FOUND))
        goto done;
    if (bl_hist && !hist_ok(bl_hist, 2 * MOE_PROFILE_BL_BINS)) {
        MOE_LOGE("sum.big_little_maxprob has negative or too large counts");
        st = MOE_ERR_RANGE;
        goto done;
    }
    st = MOE_ERR_NOMEM;
    if (shard)
        memcpy(r->shard, shard, sizeof r->shard);
    else
        r->shard[0] = 0, r->shard[1] = r->shard[2] = p->n_seq;

    /* the split: the last `heldout` share of the sequences, if both parts are non-empty */
    int n_held = (int)floor(t->heldout * p->n_seq + 0.5);
    if (t->heldout > 0 && n_held < 1) n_held = 1;
    if (n_held >= p->n_seq) n_held = p->n_seq - 1;
    if (t->heldout <= 0 || p->n_seq < 2) n_held = 0;
    r->n_held = n_held, r->n_train = p->n_seq - n_held;
    if ((st = split_trace(&all, r->n_train, &train, &held, &held_start))) goto done;
    st = MOE_ERR_NOMEM;

    /* popularity and placement (Twiddler) */
    moe_placement_order(p->popularity, L, E, order);
    moe_popularity_count(&train, pop_train);
    moe_placement_order(pop_train, L, E, order_train);
    for (int i = 0; i < 3; i++) {
        int n_res = (int)floor(k_resident[i] * L * E + 0.5);
        r->hit[i][0] = k_resident[i];
        r->hit[i][1] = n_held ? moe_placement_hit_rate(&held, order_train, n_res) : NAN;
        r->hit[i][2] = (double)n_res / (L * E);
    }

    /* HOBBIT: thresholds and the gate/output correlation */
    if (n_tok) {
        moe_hobbit_scores(&all, s);
        if ((st = moe_hobbit_thresholds(s, (size_t)n_tok * L * K, t->low, t->skip, &r->split))) goto done;
        st = MOE_ERR_NOMEM;
    } else {
        r->split = (struct moe_hobbit_split){NAN, NAN, NAN, NAN, NAN};
    }
    r->pearson = NAN;
    if (pearson_sums) {
        const double *q = pearson_sums;
        double vg = q[0] * q[3] - q[1] * q[1], vy = q[0] * q[4] - q[2] * q[2];
        if (vg > 0 && vy > 0) r->pearson = (q[0] * q[5] - q[1] * q[2]) / sqrt(vg * vy);
    }

    /* stacked gating */
    for (int l = 0; l < L; l++)
        for (int j = 0; j < D; j++) {
            const double *q = stacked ? stacked + ((size_t)l * D + j) * 4 : NULL;
            r->sim[l * D + j] = q ? div_or_nan(q[0], q[3]) : NAN;
            r->top1[l * D + j] = q ? div_or_nan(q[1], q[3]) : NAN;
            r->recall[l * D + j] = q ? div_or_nan(q[2], q[3]) : NAN;
        }

    derive_paths(r, &train, &held, pop_train);
    moe_reuse(&all, r->reuse, &r->reuse_chance);

    /* big-little (MoBiLE) */
    if (bl_hist && record && record[1] > 0 && record[2] > 0) {
        r->little_k = (int)record[2];
        derive_big_little(r, bl_hist);
    }
    double pearson = r->pearson;
    st = store(p, r, order, &pearson);
done:
    free(order);
    free(order_train);
    free(pop_train);
    free(held_start);
    free(s);
    if (st) moe_profile_results_free(r);
    return st;
}

/*
 * fit-cache.c - fit-cache's library half (fit-cache.h): the bundle and
 * profile checked and measured, the cache sizes planned, HOBBIT's priority
 * fitted and every policy replayed (cache-sim.h), and the results written
 * into the profile (cache.* arrays) and the bundle's tuning.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fit-cache.h"
#include "moe-base.h"
#include "moe-store.h"
#include "moe-tuning.h"
#include "routing-stats.h"

#define P MOE_CACHE_N_POLICIES
#define MAX_SIZES MOE_FIT_CACHE_MAX_SIZES

struct moe_fit_cache_params moe_fit_cache_default_params(void) {
    struct moe_fit_cache_params fp;
    memset(&fp, 0, sizeof fp);
    fp.fast_mem = -1, fp.cache_high = fp.cache_low = -1;
    fp.low_share = 0.25, fp.heldout = 0.3, fp.t1 = fp.t2 = fp.low_cost = -1;
    fp.path_order = 2, fp.fit_per_size = 1;
    const struct moe_cache_opt_params op = moe_cache_opt_default_params();
    fp.opt_iters = op.max_iters, fp.opt_seconds = op.max_seconds;
    return fp;
}

/* ------------------------------------------------------------ the model */

/* check_shape: the bundle has the profile's MoE layers and experts; on a
 * mismatch says what to do. */
static int check_shape(const struct moe_bundle *b, const char *bname, const struct moe_profile *p, const char *pname) {
    uint32_t nl = 0, ne = 0, np = 0;
    moe_bundle_expert_layout(b, &nl, &ne, &np);
    int moe_layers = 0, ok = (int)ne == p->n_experts && np > 0;
    for (uint32_t l = 0; l < nl; l++) moe_layers += moe_bundle_layer_has_experts(b, l);
    ok &= moe_layers == p->n_layers;
    for (int l = 0; ok && l < p->n_layers; l++)
        ok &= p->moe_layer_index[l] >= 0 && moe_bundle_layer_has_experts(b, (uint32_t)p->moe_layer_index[l]);
    if (!ok)
        MOE_LOGE("%s was recorded on a model with %d MoE layers x %d experts, but %s has %d MoE layers x %u experts "
                 "(or other layer numbers): profile this bundle first (moe-prep profile %s --dataset TEXT -o "
                 "PROFILE.h5) or give the bundle the profile was recorded with",
                 pname, p->n_layers, p->n_experts, bname, moe_layers, ne, bname);
    return ok;
}

/* find_precisions: high = most raw bytes per expert, low = fewest, unless named. */
static enum moe_status find_precisions(const struct moe_bundle *b, const char *bname,
                                       const struct moe_fit_cache_params *fp, struct moe_fit_cache_model *m) {
    uint32_t nl, ne, np;
    moe_bundle_expert_layout(b, &nl, &ne, &np);
    m->hi_prec = m->lo_prec = 0;
    for (uint32_t i = 1; i < np; i++) {
        if (moe_bundle_precision_at(b, i)->raw_size > moe_bundle_precision_at(b, m->hi_prec)->raw_size) m->hi_prec = i;
        if (moe_bundle_precision_at(b, i)->raw_size < moe_bundle_precision_at(b, m->lo_prec)->raw_size) m->lo_prec = i;
    }
    const char *names[2] = {fp->high, fp->low};
    uint32_t *idx[2] = {&m->hi_prec, &m->lo_prec};
    for (int k = 0; k < 2; k++)
        if (names[k] && moe_bundle_find_precision(b, names[k], idx[k]) != MOE_OK) {
            struct moe_buf list = {0};
            for (uint32_t i = 0; i < np; i++) moe_buf_printf(&list, " %s", moe_bundle_precision_at(b, i)->name);
            MOE_LOGE("--%s: %s has no precision \"%s\"; it stores:%s", k ? "low" : "high", bname, names[k],
                     list.data ? list.data : "");
            moe_buf_free(&list);
            return MOE_ERR_INVALID;
        }
    snprintf(m->hi_name, sizeof m->hi_name, "%s", moe_bundle_precision_at(b, m->hi_prec)->name);
    snprintf(m->lo_name, sizeof m->lo_name, "%s", moe_bundle_precision_at(b, m->lo_prec)->name);
    return MOE_OK;
}

/* measure_blobs: the real blob sizes (raw in memory, stored on disk) at both precisions. */
static enum moe_status measure_blobs(const struct moe_bundle *b, const char *bname, const struct moe_profile *p,
                                     struct moe_fit_cache_model *m) {
    const uint32_t prec[2] = {m->hi_prec, m->lo_prec};
    m->hi_stored = m->lo_stored = 0;
    for (int l = 0; l < p->n_layers; l++)
        for (int e = 0; e < p->n_experts; e++)
            for (int k = 0; k < 2; k++) {
                struct moe_bundle_blob blob;
                if (moe_bundle_expert(b, (uint32_t)p->moe_layer_index[l], (uint32_t)e, prec[k], &blob) != MOE_OK) {
                    MOE_LOGE("%s: cannot locate expert %d of layer %d (see above)", bname, e, p->moe_layer_index[l]);
                    return MOE_ERR_FORMAT;
                }
                if (k) m->lo_bytes = (double)blob.raw_size, m->lo_stored += (double)blob.stored_size;
                else m->hi_bytes = (double)blob.raw_size, m->hi_stored += (double)blob.stored_size;
            }
    m->hi_stored /= (double)m->LE, m->lo_stored /= (double)m->LE;
    return MOE_OK;
}

/* pick_thresholds: t1/t2 given, else the profile's hobbit_thresholds, else the
 * bundle's hobbit.t1/t2, else 1 (every load high precision). */
static void pick_thresholds(const struct moe_bundle *b, const struct moe_profile *p,
                            const struct moe_fit_cache_params *fp, struct moe_fit_cache_model *m) {
    const double *thr = NULL;
    int nd = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    struct moe_tuning bt;
    if (moe_profile_get_f64(p, "hobbit_thresholds", &nd, dims, &thr) == MOE_OK && nd == 1 && dims[0] >= 2 &&
        thr[0] >= 0 && thr[0] <= thr[1] && thr[1] <= 1)
        m->t1 = thr[0], m->t2 = thr[1], m->t_source = "profile";
    else if (moe_tuning_read(moe_bundle_tuning(b), p->n_layers, p->n_experts, &bt) == MOE_OK && bt.has_thresholds)
        m->t1 = bt.t1, m->t2 = bt.t2, m->t_source = "bundle";
    else {
        m->t1 = m->t2 = 1, m->t_source = "default";
        if (fp->t1 < 0 || fp->t2 < 0)
            MOE_LOGW("note: no HOBBIT thresholds in the profile or the bundle; T1 = T2 = 1 (every load high "
                     "precision) unless --t1/--t2 are given");
    }
    if (fp->t1 >= 0) m->t1 = fp->t1, m->t_source = "option";
    if (fp->t2 >= 0) m->t2 = fp->t2, m->t_source = "option";
}

enum moe_status moe_fit_cache_model_init(const struct moe_bundle *b, const char *bundle_name,
                                         const struct moe_profile *p, const char *profile_name,
                                         const struct moe_fit_cache_params *fp, struct moe_fit_cache_model *m) {
    enum moe_status st;
    memset(m, 0, sizeof *m);
    if (!check_shape(b, bundle_name, p, profile_name)) return MOE_ERR_SHAPE;
    m->L = p->n_layers, m->E = p->n_experts, m->K = p->k, m->LE = m->L * m->E;
    if ((st = find_precisions(b, bundle_name, fp, m)) || (st = measure_blobs(b, bundle_name, p, m))) return st;
    m->low_cost = fp->low_cost >= 0 ? fp->low_cost : m->lo_bytes / m->hi_bytes;
    uint32_t nl, ne, np;
    moe_bundle_expert_layout(b, &nl, &ne, &np);
    if (np < 2 || m->hi_prec == m->lo_prec)
        MOE_LOGW("note: one precision (%s) for both caches; a low miss costs %.3g", m->hi_name, m->low_cost);
    pick_thresholds(b, p, fp, m);
    if (m->t1 > m->t2) {
        MOE_LOGE("T1 %.4f exceeds T2 %.4f: give both --t1 and --t2", m->t1, m->t2);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

enum moe_status moe_fit_cache_result_new(const struct moe_fit_cache_model *m, struct moe_fit_cache_result **out) {
    struct moe_fit_cache_result *r = calloc(1, sizeof *r);
    if (r && !(r->freq_high = calloc((size_t)2 * m->LE, sizeof(double)))) {
        free(r);
        r = NULL;
    }
    *out = r;
    if (!r) return MOE_ERR_NOMEM;
    r->freq_low = r->freq_high + m->LE;
    return MOE_OK;
}

void moe_fit_cache_result_free(struct moe_fit_cache_result *r) {
    if (r) free(r->freq_high);
    free(r);
}

/* ------------------------------------------------------------ the sizes */

/* add_size: append (hi, lo) unless that high capacity is already listed. */
static void add_size(struct moe_fit_cache_result *r, int hi, int lo, int primary) {
    for (int i = 0; i < r->n_sizes; i++)
        if (r->sizes[i].hi == hi) {
            if (primary) r->sizes[i].lo = lo, r->sizes[i].primary = 1;
            return;
        }
    if (r->n_sizes >= MAX_SIZES) return;
    struct moe_fit_cache_size *s = &r->sizes[r->n_sizes++];
    memset(s, 0, sizeof *s);
    s->hi = hi, s->lo = lo, s->primary = primary;
}

static int by_high(const void *a, const void *b) {
    const struct moe_fit_cache_size *x = a, *y = b;
    return (x->hi > y->hi) - (x->hi < y->hi);
}

/* primary_size: the capacities from fast_mem or cache_high/low. */
static enum moe_status primary_size(const struct moe_fit_cache_params *fp, const struct moe_fit_cache_model *m,
                                    int *H, int *Lc) {
    if (fp->fast_mem >= 0) {
        double h = floor((1 - fp->low_share) * fp->fast_mem / m->hi_bytes);
        double l = floor(fp->low_share * fp->fast_mem / m->lo_bytes);
        *H = (int)fmin(h, m->LE), *Lc = (int)fmin(l, m->LE);
        if (*H < 1) {
            MOE_LOGE("--fast-mem %.0f bytes hold no high-precision expert (%.0f bytes each at %s, %.0f %% of the "
                     "budget with --low-share %g)", fp->fast_mem, m->hi_bytes, m->hi_name, 100 * (1 - fp->low_share),
                     fp->low_share);
            return MOE_ERR_INVALID;
        }
    } else {
        if (fp->cache_high < 1 || fp->cache_high > m->LE || fp->cache_low > m->LE) {
            MOE_LOGE("--cache-experts %lld,%lld: the model has %d experts in all; want 1..%d high and 0..%d low",
                     fp->cache_high, fp->cache_low, m->LE, m->LE, m->LE);
            return MOE_ERR_INVALID;
        }
        *H = (int)fp->cache_high, *Lc = (int)fp->cache_low;
    }
    return MOE_OK;
}

enum moe_status moe_fit_cache_plan(const struct moe_fit_cache_params *fp, const struct moe_fit_cache_model *m,
                                   struct moe_fit_cache_result *r) {
    enum moe_status st = primary_size(fp, m, &r->H, &r->Lc);
    if (st) return st;
    if (fp->prefetch > m->E) {
        MOE_LOGE("--prefetch %d exceeds the %d experts of a layer", fp->prefetch, m->E);
        return MOE_ERR_INVALID;
    }
    const double ratio = (double)r->Lc / r->H;
    r->n_sizes = 0;
    add_size(r, r->H, r->Lc, 1);
    if (fp->n_sizes) {
        for (int i = 0; i < fp->n_sizes; i++) {
            if (fp->sizes[i] > m->LE) {
                MOE_LOGE("--sizes: %lld experts exceed the model's %d", fp->sizes[i], m->LE);
                return MOE_ERR_INVALID;
            }
            add_size(r, (int)fp->sizes[i], (int)fmin(m->LE, lround((double)fp->sizes[i] * ratio)), 0);
        }
    } else {
        for (int q = 1; q <= 3; q++) {
            int h = (int)lround(m->LE * 0.25 * q);
            h = h < 1 ? 1 : h;
            add_size(r, h, (int)fmin(m->LE, lround(h * ratio)), 0);
        }
    }
    qsort(r->sizes, (size_t)r->n_sizes, sizeof r->sizes[0], by_high);
    return MOE_OK;
}

/* ------------------------------------------------------------ the sweep */

/* The sweep's working state. */
struct sweep {
    const struct moe_fit_cache_params *fp;
    struct moe_trace t;
    unsigned char *held;
    int32_t *fit, *hs, *order;
    double *freq;
    struct moe_path_dict *dict;
    struct moe_cache_trace *tf, *th;
    double t0;
};

static void sweep_free(struct sweep *w) {
    moe_cache_trace_free(w->tf);
    moe_cache_trace_free(w->th);
    moe_path_dict_free(w->dict);
    free(w->held);
    free(w->fit);
    free(w->hs);
    free(w->freq);
    free(w->order);
}

/* emit: an event to the caller's progress function. */
static void emit(const struct sweep *w, enum moe_fit_cache_stage stage, int n_fit, int64_t acc, int hi, int lo,
                 int done, int total) {
    if (!w->fp->progress) return;
    struct moe_fit_cache_event ev = {stage, n_fit, hi, lo, done, total, acc, moe_now_s() - w->t0};
    w->fp->progress(&ev, w->fp->user);
}

static void on_fit_step(int done, int total, void *user) {
    emit(user, MOE_FIT_CACHE_FIT_STEP, 0, 0, 0, 0, done, total);
}

/* split: every k-th sequence held out; nothing held out reports on the fit part. */
static void split(struct sweep *w, int n, struct moe_fit_cache_result *r) {
    r->n_seq = n, r->n_fit = r->n_held = r->in_sample = 0;
    moe_cache_split(n, w->fp->heldout, w->held);
    for (int i = 0; i < n; i++) {
        if (w->held[i]) w->hs[r->n_held++] = i;
        else w->fit[r->n_fit++] = i;
    }
    if (r->n_held == 0) {
        r->in_sample = 1;
        memcpy(w->hs, w->fit, sizeof(int32_t) * (size_t)r->n_fit);
        r->n_held = r->n_fit;
        if (w->fp->heldout > 0)
            MOE_LOGW("note: %d sequence(s): nothing to hold out; the table is on the fit part", n);
    }
}

/* prepare: popularity, path dictionary and the two replay traces. */
static enum moe_status prepare(struct sweep *w, const struct moe_fit_cache_model *m, struct moe_fit_cache_result *r) {
    enum moe_status st;
    if ((st = moe_cache_popularity(&w->t, w->fit, r->n_fit, w->freq, w->order))) return st;
    struct moe_cache_trace_params pp = moe_cache_trace_default_params();
    pp.t1 = m->t1, pp.t2 = m->t2, pp.prompt_len = w->fp->prompt_len;
    if (w->fp->prefetch > 0) {
        if ((st = moe_cache_path_dict(&w->t, w->fit, r->n_fit, w->fp->path_order, &w->dict))) return st;
        pp.paths = w->dict, pp.prefetch = w->fp->prefetch;
    }
    if ((st = moe_cache_trace_new(&w->t, w->fit, r->n_fit, &pp, &w->tf)) ||
        (st = moe_cache_trace_new(&w->t, w->hs, r->n_held, &pp, &w->th)))
        return st;
    return MOE_OK;
}

/* fit_primary: HOBBIT's weights at the primary size and every policy on the fit part. */
static enum moe_status fit_primary(struct sweep *w, struct moe_cache_config *c, struct moe_cache_fit_params *cfp,
                                   struct moe_fit_cache_result *r) {
    enum moe_status st;
    if ((st = moe_cache_fit_hobbit(w->tf, c, cfp, r->w, &r->admit, &r->fit_best, &r->evals))) return st;
    r->fit_seconds = moe_now_s() - w->t0;
    for (int q = 0; q < P; q++)
        if (q != MOE_CACHE_HOBBIT && (st = moe_cache_simulate(w->tf, (enum moe_cache_policy)q, c, &r->fit_single[q])))
            return st;
    r->fit_single[MOE_CACHE_HOBBIT] = r->fit_best;
    return MOE_OK;
}

/* bound_size: the offline optimum of the held-out part at size z, with the
 * best replayed policy that does not prefetch as the known schedule. */
static enum moe_status bound_size(struct sweep *w, const struct moe_cache_config *c, struct moe_fit_cache_size *z) {
    struct moe_cache_opt_params op = moe_cache_opt_default_params();
    struct moe_cache_trace_info hi;
    moe_cache_trace_info(w->th, &hi);
    op.max_iters = w->fp->opt_iters, op.max_seconds = w->fp->opt_seconds, op.upper = -1;
    for (int q = 0; q < P; q++) /* with --prefetch only Twiddler and Belady do not prefetch */
        if ((!c->prefetch || q == MOE_CACHE_STATIC || q == MOE_CACHE_BELADY) &&
            (op.upper < 0 || z->st[q].penalty < op.upper))
            op.upper = z->st[q].penalty;
    emit(w, MOE_FIT_CACHE_OPT, 0, hi.accesses, z->hi, z->lo, 0, 0);
    return moe_cache_opt_solve(w->th, c, &op, &z->opt);
}

/* replay_sizes: every policy on the held-out part at each size (fitted again per size if asked), and its bound. */
static enum moe_status replay_sizes(struct sweep *w, struct moe_cache_config *c, struct moe_cache_fit_params *cfp,
                                    struct moe_fit_cache_result *r) {
    enum moe_status st;
    for (int s = 0; s < r->n_sizes; s++) {
        struct moe_fit_cache_size *z = &r->sizes[s];
        c->high_cap = z->hi, c->low_cap = z->lo;
        memcpy(z->w, r->w, sizeof z->w);
        z->admit = r->admit;
        if (w->fp->fit_per_size && !z->primary) {
            emit(w, MOE_FIT_CACHE_FIT_SIZE, 0, 0, z->hi, z->lo, 0, 0);
            if ((st = moe_cache_fit_hobbit(w->tf, c, cfp, z->w, &z->admit, NULL, NULL))) return st;
        }
        memcpy(c->w, z->w, sizeof c->w);
        c->admit = z->admit;
        for (int q = 0; q < P; q++)
            if ((st = moe_cache_simulate(w->th, (enum moe_cache_policy)q, c, &z->st[q]))) return st;
        if ((st = bound_size(w, c, z))) return st;
    }
    return MOE_OK;
}

/* dynamic_grid: r->dyn at budgets of 5 %, 10 %, ... 100 % of every high
 * copy's bytes: the fitted HOBBIT policy with dynamic precision (the caches
 * split by low_share, as the store splits them) on the held-out trace, and
 * LRU with every byte as high copies on the same tokens with every access
 * needing a high copy; then r->dynamic_until. */
static enum moe_status dynamic_grid(struct sweep *w, const struct moe_fit_cache_model *m, struct moe_cache_config c,
                                    struct moe_fit_cache_result *r) {
    struct moe_cache_trace_params pp = moe_cache_trace_default_params(); /* T1 = T2 = 1: every access high */
    pp.prompt_len = w->fp->prompt_len;
    struct moe_cache_trace *all_high = NULL;
    enum moe_status st = moe_cache_trace_new(&w->t, w->hs, r->n_held, &pp, &all_high);
    r->n_dyn = 0, r->dynamic_until = NAN;
    if (st) return st;
    memcpy(c.w, r->w, sizeof c.w);
    c.admit = r->admit;
    for (int i = 1; i <= MOE_FIT_CACHE_DYN_POINTS && !st; i++) {
        const double share = (double)i / MOE_FIT_CACHE_DYN_POINTS, mem = share * (double)m->LE * m->hi_bytes;
        struct moe_fit_cache_dyn d = {share, 0, 0, 0, 0, 0};
        int unused;
        moe_store_capacities((int64_t)mem, w->fp->low_share, 1, (int64_t)m->hi_bytes, (int64_t)m->lo_bytes, m->LE,
                             &d.hi_on, &d.lo_on); /* the store's own split */
        moe_store_capacities((int64_t)mem, w->fp->low_share, 0, (int64_t)m->hi_bytes, (int64_t)m->lo_bytes, m->LE,
                             &d.hi_off, &unused);
        if (d.hi_on < 1 || d.hi_off < m->K || d.lo_on < m->K) continue; /* the store would refuse either */
        struct moe_cache_stats s_on, s_off;
        c.high_cap = d.hi_on, c.low_cap = d.lo_on, c.prefetch = 0;
        if ((st = moe_cache_simulate(w->th, MOE_CACHE_HOBBIT, &c, &s_on))) break;
        c.high_cap = d.hi_off, c.low_cap = 0;
        if ((st = moe_cache_simulate(all_high, MOE_CACHE_LRU, &c, &s_off))) break;
        d.pen_on = moe_fit_cache_per_token(s_on.penalty, &s_on);
        d.pen_off = moe_fit_cache_per_token(s_off.penalty, &s_off);
        r->dyn[r->n_dyn++] = d;
    }
    moe_cache_trace_free(all_high);
    if (st) return st;
    for (int i = r->n_dyn - 1; i >= 0 && r->dyn[i].pen_off <= r->dyn[i].pen_on; i--) r->dynamic_until = r->dyn[i].share;
    return MOE_OK;
}

enum moe_status moe_fit_cache_sweep(const struct moe_fit_cache_params *fp, const struct moe_profile *p,
                                    const struct moe_fit_cache_model *m, struct moe_fit_cache_result *r) {
    struct sweep w = {.fp = fp};
    moe_profile_trace(p, &w.t);
    const int n = p->n_seq;
    enum moe_status st = MOE_ERR_NOMEM;
    w.held = calloc((size_t)n + 1, 1);
    w.fit = malloc(sizeof(int32_t) * ((size_t)n + 1));
    w.hs = malloc(sizeof(int32_t) * ((size_t)n + 1));
    w.freq = malloc(sizeof(double) * (size_t)m->LE);
    w.order = malloc(sizeof(int32_t) * (size_t)m->LE);
    if (!w.held || !w.fit || !w.hs || !w.freq || !w.order) goto done;
    split(&w, n, r);
    if ((st = prepare(&w, m, r))) goto done;
    struct moe_cache_trace_info fi, hi;
    moe_cache_trace_info(w.tf, &fi);
    moe_cache_trace_info(w.th, &hi);
    r->fit_tokens = fi.tokens, r->held_tokens = hi.tokens;
    if (fi.accesses == 0 || hi.accesses == 0) {
        MOE_LOGE("the profile holds no tokens to replay");
        st = MOE_ERR_NOT_FOUND;
        goto done;
    }
    struct moe_cache_config c = moe_cache_default_config();
    c.high_cap = r->H, c.low_cap = r->Lc, c.low_cost = m->low_cost, c.high_bytes = m->hi_bytes;
    c.low_bytes = m->lo_bytes, c.freq = w.freq, c.order = w.order, c.prefetch = fp->prefetch > 0;
    moe_cache_trace_need_freq(w.tf, r->freq_high, r->freq_low); /* HOBBIT's popularity term, from the fit part */
    if (!fp->paper) c.freq_high = r->freq_high, c.freq_low = r->freq_low;
    w.t0 = moe_now_s();
    emit(&w, MOE_FIT_CACHE_FIT_START, r->n_fit, fi.accesses, r->H, r->Lc, 0, 0);
    struct moe_cache_fit_params cfp = moe_cache_fit_default_params();
    cfp.progress = on_fit_step, cfp.user = &w;
    if (fp->paper) cfp.n_weights = 4, cfp.grid = 10, cfp.admit = 0; /* as in the paper: 286 grid points */
    if (!(st = fit_primary(&w, &c, &cfp, r)) && !(st = replay_sizes(&w, &c, &cfp, r))) st = dynamic_grid(&w, m, c, r);
done:
    if (st == MOE_ERR_NOMEM) MOE_LOGE("out of memory");
    else if (st && st != MOE_ERR_NOT_FOUND) MOE_LOGE("the replay failed (see the message above)");
    sweep_free(&w);
    return st;
}

/* ------------------------------------------------------------ outputs */

double moe_fit_cache_per_token(double x, const struct moe_cache_stats *s) {
    return s->tokens > 0 ? x / (double)s->tokens : NAN;
}

double moe_fit_cache_gap(const struct moe_fit_cache_size *z, int q) {
    double b = z->opt.lower;
    return b > 0 ? 100.0 * (z->st[q].penalty - b) / b : NAN;
}

double moe_fit_cache_gap_belady(const struct moe_fit_cache_size *z, int q) {
    double b = z->st[MOE_CACHE_BELADY].penalty;
    return b > 0 ? 100.0 * (z->st[q].penalty - b) / b : NAN;
}

int moe_fit_cache_best_single(const struct moe_cache_stats *st) {
    int b = -1;
    for (int q = 0; q < P; q++)
        if (q != MOE_CACHE_HOBBIT && q != MOE_CACHE_BELADY && (b < 0 || st[q].penalty < st[b].penalty)) b = q;
    return b;
}

enum moe_status moe_fit_cache_update_profile(struct moe_profile *p, const char *path,
                                             const struct moe_fit_cache_params *fp,
                                             const struct moe_fit_cache_model *m,
                                             const struct moe_fit_cache_result *r) {
    const int S = r->n_sizes;
    enum { W = MOE_CACHE_N_WEIGHTS + 1 }; /* the weights and the admission flag */
    int64_t hs[MAX_SIZES], ls[MAX_SIZES], d1[1] = {S}, d2[2] = {P, S}, dw[1] = {W}, dset[1] = {8};
    double pen[P * MAX_SIZES], hit[P * MAX_SIZES], byt[P * MAX_SIZES], sw[MAX_SIZES * W], fw[W];
    int64_t dsw[2] = {S, W};
    memcpy(fw, r->w, sizeof r->w);
    fw[W - 1] = r->admit;
    for (int s = 0; s < S; s++) {
        hs[s] = r->sizes[s].hi, ls[s] = r->sizes[s].lo;
        memcpy(sw + W * s, r->sizes[s].w, sizeof r->sizes[s].w);
        sw[W * s + W - 1] = r->sizes[s].admit;
        for (int q = 0; q < P; q++) {
            const struct moe_cache_stats *st = &r->sizes[s].st[q];
            pen[q * S + s] = moe_fit_cache_per_token(st->penalty, st);
            hit[q * S + s] = moe_cache_hit_ratio(st);
            byt[q * S + s] = moe_fit_cache_per_token(st->bytes, st);
        }
    }
    const double set[8] = {m->t1, m->t2, m->low_cost, r->in_sample ? 0 : fp->heldout, fp->prompt_len, fp->prefetch,
                           r->H, r->Lc};
    enum moe_status st;
    if ((st = moe_profile_put_i64(p, "cache.sizes", 1, d1, hs)) ||
        (st = moe_profile_put_i64(p, "cache.low_sizes", 1, d1, ls)) ||
        (st = moe_profile_put_f64(p, "cache.penalty", 2, d2, pen)) ||
        (st = moe_profile_put_f64(p, "cache.hit_ratio", 2, d2, hit)) ||
        (st = moe_profile_put_f64(p, "cache.bytes", 2, d2, byt)) ||
        (st = moe_profile_put_f64(p, "cache.weights", 1, dw, fw)) ||
        (st = moe_profile_put_f64(p, "cache.size_weights", 2, dsw, sw)) ||
        (st = moe_profile_put_f64(p, "cache.settings", 1, dset, set)) || (st = moe_profile_write(p, path)))
        return st;
    return MOE_OK;
}

enum moe_status moe_fit_cache_write_tuning(const char *path, const struct moe_fit_cache_model *m,
                                           const struct moe_fit_cache_result *r, int *n_keys) {
    struct moe_bundle *b = NULL;
    struct moe_bundle_kv *kv = NULL;
    enum moe_status st;
    if ((st = moe_bundle_open(path, &b)) || (st = moe_bundle_kv_new(&kv))) goto done;
    if ((st = moe_bundle_kv_copy(kv, moe_bundle_tuning(b)))) goto done;
    moe_bundle_free(b); /* replace_tuning opens the file itself */
    b = NULL;
    if ((st = moe_tuning_set_cache(kv, r->w, r->admit, r->H, r->Lc, m->hi_name, m->lo_name)) ||
        (st = moe_tuning_set_dynamic_until(kv, r->dynamic_until)) ||
        (st = moe_tuning_set_cache_popularity(kv, r->freq_high, r->freq_low, (size_t)m->LE, m->low_cost)) ||
        (st = moe_bundle_replace_tuning(path, kv)))
        goto done;
    *n_keys = (int)moe_bundle_kv_count(kv);
done:
    moe_bundle_free(b);
    moe_bundle_kv_free(kv);
    return st;
}

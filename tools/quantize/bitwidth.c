/*
 * bitwidth.c - EdgeMoE's bit-width search and its evaluation on a bundle
 * (see bitwidth.h): the library half of `moe-prep bitwidth` (the command is
 * bitwidth-cmd.c).
 */
#include "bitwidth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "moe-base.h"
#include "moe-bundle.h"
#include "moe-dataset.h"
#include "moe-model.h"
#include "moe-tuning.h"
#include "profile-h5.h"
#include "token-stream.h"

/* ---- the search -------------------------------------------------------- */

void moe_bw_assign(const struct moe_bw_problem *p, int lower, int upper, int k, int16_t *assign) {
    for (int i = 0; i < p->n; i++) assign[p->order[i]] = (int16_t)(i < k ? lower : upper);
}

int64_t moe_bw_bytes(const struct moe_bw_problem *p, const int16_t *assign) {
    int64_t b = 0;
    for (int i = 0; i < p->n; i++) b += p->bytes[(size_t)i * p->n_prec + assign[i]];
    return b;
}

void moe_bw_result_clear(struct moe_bw_result *r) {
    free(r->assign);
    free(r->cand);
    free(r->uniform_loss);
    free(r->uniform_bytes);
    memset(r, 0, sizeof *r);
}

/* evaluate: the loss of (lower, upper, k), recorded as a candidate. */
static enum moe_status evaluate(const struct moe_bw_problem *p, struct moe_bw_result *r, int lower, int upper, int k,
                                double *loss) {
    moe_bw_assign(p, lower, upper, k, r->assign);
    enum moe_status st = p->eval(r->assign, loss, p->user);
    if (st) return st;
    struct moe_bw_candidate *c = realloc(r->cand, sizeof *c * (size_t)(r->n_cand + 1));
    if (!c) return MOE_ERR_NOMEM;
    r->cand = c;
    c[r->n_cand++] = (struct moe_bw_candidate){lower, upper, k, moe_bw_bytes(p, r->assign), *loss};
    return MOE_OK;
}

/* check: a well-formed problem (order a permutation, one budget). */
static int check(const struct moe_bw_problem *p) {
    if (p->n < 1 || p->n_prec < 1 || p->n_prec > 64 || !p->bytes || !p->order || !p->eval ||
        (p->max_loss >= 0) == (p->max_bytes > 0)) {
        MOE_LOGE("bitwidth: needs experts, 1..64 precisions, sizes, a ranking, a loss callback and exactly one "
                 "budget (loss or size)");
        return 0;
    }
    char *seen = calloc((size_t)p->n, 1);
    int ok = seen != NULL;
    for (int i = 0; ok && i < p->n; i++) {
        ok = p->order[i] >= 0 && p->order[i] < p->n && !seen[p->order[i]];
        if (ok) seen[p->order[i]] = 1;
    }
    free(seen);
    if (!ok) MOE_LOGE("bitwidth: the ranking is not a permutation of the %d experts", p->n);
    return ok;
}

/* by_size: precisions sorted by total bytes, smallest first (ties: index). */
static void by_size(const struct moe_bw_result *r, int n_prec, int *sorted) {
    for (int i = 0; i < n_prec; i++) sorted[i] = i;
    for (int i = 1; i < n_prec; i++)
        for (int j = i; j > 0 && r->uniform_bytes[sorted[j]] < r->uniform_bytes[sorted[j - 1]]; j--) {
            int t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
}

/* choose: make (lower, upper, k) the result. */
static void choose(const struct moe_bw_problem *p, struct moe_bw_result *r, int lower, int upper, int k, double loss) {
    moe_bw_assign(p, lower, upper, k, r->assign);
    r->lower = lower;
    r->upper = upper;
    r->k = k;
    r->bytes = moe_bw_bytes(p, r->assign);
    r->loss = loss;
}

static enum moe_status search_loss(const struct moe_bw_problem *p, struct moe_bw_result *r, const int *sorted) {
    enum moe_status st;
    const int P = p->n_prec;
    for (int j = P - 1; j >= 0; j--) /* largest first: a reference loss is usually measured against it */
        if ((st = evaluate(p, r, sorted[j], sorted[j], p->n, &r->uniform_loss[sorted[j]]))) return st;
    int up = -1; /* position in sorted of the smallest uniform within budget */
    for (int j = 0; j < P && up < 0; j++)
        if (r->uniform_loss[sorted[j]] <= p->max_loss) up = j;
    if (up < 0) {
        int best = sorted[0];
        for (int j = 1; j < P; j++)
            if (r->uniform_loss[sorted[j]] < r->uniform_loss[best]) best = sorted[j];
        choose(p, r, best, best, p->n, r->uniform_loss[best]);
        MOE_LOGE("bitwidth: no uniform assignment is within the loss budget %.4g; the smallest loss is %.4g", p->max_loss,
                 r->uniform_loss[best]);
        return MOE_ERR_RANGE;
    }
    const int upper = sorted[up];
    if (up == 0) { /* even the smallest precision is within budget */
        choose(p, r, upper, upper, p->n, r->uniform_loss[upper]);
        return MOE_OK;
    }
    const int lower = sorted[up - 1];
    int lo = 0, hi = p->n; /* loss(lo) within budget, loss(hi) over it */
    double lo_loss = r->uniform_loss[upper];
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        double loss;
        if ((st = evaluate(p, r, lower, upper, mid, &loss))) return st;
        if (loss <= p->max_loss) {
            lo = mid;
            lo_loss = loss;
        } else {
            hi = mid;
        }
    }
    choose(p, r, lower, upper, lo, lo_loss);
    return MOE_OK;
}

static enum moe_status search_size(const struct moe_bw_problem *p, struct moe_bw_result *r, const int *sorted) {
    enum moe_status st;
    const int P = p->n_prec;
    int fit = -1; /* position in sorted of the largest uniform that fits */
    for (int j = 0; j < P; j++)
        if (r->uniform_bytes[sorted[j]] <= p->max_bytes) fit = j;
    if (fit < 0) {
        MOE_LOGE("bitwidth: the smallest assignment (all %lld expert bytes at the smallest precision) exceeds the size "
                 "budget of %lld bytes", (long long)r->uniform_bytes[sorted[0]], (long long)p->max_bytes);
        choose(p, r, sorted[0], sorted[0], p->n, NAN);
        return MOE_ERR_RANGE;
    }
    const int lower = sorted[fit];
    if (fit == P - 1) { /* the largest fits: nothing to lower */
        if ((st = evaluate(p, r, lower, lower, p->n, &r->uniform_loss[lower]))) return st;
        choose(p, r, lower, lower, p->n, r->uniform_loss[lower]);
        return MOE_OK;
    }
    const int upper = sorted[fit + 1];
    int lo = 0, hi = p->n; /* bytes fall as k grows: the smallest k that fits */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        moe_bw_assign(p, lower, upper, mid, r->assign);
        if (moe_bw_bytes(p, r->assign) <= p->max_bytes) hi = mid;
        else lo = mid + 1;
    }
    if ((st = evaluate(p, r, upper, upper, p->n, &r->uniform_loss[upper])) ||
        (st = evaluate(p, r, lower, lower, p->n, &r->uniform_loss[lower])))
        return st;
    double loss = lo == p->n ? r->uniform_loss[lower] : 0;
    if (lo < p->n && (st = evaluate(p, r, lower, upper, lo, &loss))) return st;
    choose(p, r, lower, upper, lo, loss);
    return MOE_OK;
}

enum moe_status moe_bw_search(const struct moe_bw_problem *p, struct moe_bw_result *out) {
    memset(out, 0, sizeof *out);
    if (!check(p)) return MOE_ERR_INVALID;
    const int P = p->n_prec;
    out->n_prec = P;
    out->assign = malloc(sizeof *out->assign * (size_t)p->n);
    out->uniform_loss = malloc(sizeof *out->uniform_loss * (size_t)P);
    out->uniform_bytes = malloc(sizeof *out->uniform_bytes * (size_t)P);
    if (!out->assign || !out->uniform_loss || !out->uniform_bytes) return MOE_ERR_NOMEM;
    for (int q = 0; q < P; q++) {
        out->uniform_loss[q] = NAN;
        moe_bw_assign(p, q, q, p->n, out->assign);
        out->uniform_bytes[q] = moe_bw_bytes(p, out->assign);
    }
    int sorted[64];
    by_size(out, P, sorted);
    return p->max_loss >= 0 ? search_loss(p, out, sorted) : search_size(p, out, sorted);
}

/* ---- the search on a bundle -------------------------------------------- */

struct moe_bw_run_params moe_bw_run_default_params(void) {
    struct moe_bw_run_params p;
    memset(&p, 0, sizeof p);
    p.max_loss = -1;
    p.n_ctx = 256;
    p.write_tuning = 1;
    return p;
}

void moe_bw_run_clear(struct moe_bw_run *r) {
    moe_bw_result_clear(&r->result);
    free(r->prec_names);
    memset(r, 0, sizeof *r);
}

/* What the loss callback needs: the model rebinds per assignment. */
struct bw_eval {
    struct moe_model *m;
    const int *layer_of; /* [n_moe] MoE layer -> model layer */
    int n_moe, E, ref;   /* ref: the largest precision */
    const int32_t *ids;
    size_t n_ids;
    struct moe_eval_params ep;
    double ref_ppl;      /* perplexity with every expert at ref (0 = not yet) */
    int n_evals;
    double t0;
    const struct moe_bw_run_params *p;
};

static enum moe_status bind_assign(struct bw_eval *b, const int16_t *assign) {
    enum moe_status st;
    for (int li = 0; li < b->n_moe; li++)
        for (int e = 0; e < b->E; e++)
            if ((st = moe_model_set_expert_precision(b->m, b->layer_of[li], e, assign[li * b->E + e]))) return st;
    return MOE_OK;
}

/* ppl_of: perplexity of the text with the experts as assigned. */
static enum moe_status ppl_of(struct bw_eval *b, const int16_t *assign, double *ppl) {
    enum moe_status st = bind_assign(b, assign);
    if (st) return st;
    struct moe_eval_result r;
    if ((st = moe_eval_run(b->m, NULL, b->ids, b->n_ids, &b->ep, &r))) return st;
    *ppl = r.ppl.val;
    moe_eval_result_clear(&r);
    return MOE_OK;
}

/* loss_cb: the search's loss (moe_bw_eval_fn): relative perplexity increase
 * against every expert at the largest precision. */
static enum moe_status loss_cb(const int16_t *assign, double *loss, void *user) {
    struct bw_eval *b = user;
    const int n = b->n_moe * b->E;
    int uniform_ref = 1;
    for (int i = 0; i < n; i++) uniform_ref &= assign[i] == b->ref;
    double ppl;
    enum moe_status st = ppl_of(b, assign, &ppl);
    if (st) return st;
    if (uniform_ref || b->ref_ppl <= 0) {
        if (!uniform_ref) { /* the search starts with the largest; be safe if it did not */
            int16_t *r = malloc(sizeof *r * (size_t)n);
            if (!r) return MOE_ERR_NOMEM;
            for (int i = 0; i < n; i++) r[i] = (int16_t)b->ref;
            st = ppl_of(b, r, &b->ref_ppl);
            free(r);
            if (st) return st;
        } else {
            b->ref_ppl = ppl;
        }
    }
    *loss = ppl / b->ref_ppl - 1;
    b->n_evals++;
    if (b->p->on_eval) b->p->on_eval(b->n_evals, ppl, *loss, moe_now_s() - b->t0, b->p->user);
    return MOE_OK;
}

/* load_ids: the token stream of a dataset spec, read only as far as `need`
 * tokens require (0 = all). */
static enum moe_status load_ids(const struct moe_model *m, const char *spec, size_t need, int32_t **ids, size_t *n) {
    struct moe_dataset_params dp = moe_dataset_default_params();
    enum moe_status st = moe_text_load_tokens(m, NULL, spec, &dp, need, ids, n);
    if (st) MOE_LOGE("bitwidth: cannot read or tokenize %s (see the message above)", spec);
    return st;
}

/* read_ranking: the order (least sensitive first) from a sensitivity file,
 * checked against the bundle's shape. */
static enum moe_status read_ranking(const char *path, const struct moe_model *m, int n_moe, int32_t **order) {
    struct moe_profile *p = NULL;
    enum moe_status st = moe_profile_read(path, &p);
    if (st) {
        MOE_LOGE("bitwidth: cannot read %s (see the message above)", path);
        return st;
    }
    const int n = n_moe * m->cfg.n_expert;
    int nd;
    int64_t d[MOE_PROFILE_MAX_DIMS];
    const int32_t *o;
    st = MOE_ERR_INVALID;
    if (p->n_layers != n_moe || p->n_experts != m->cfg.n_expert) {
        MOE_LOGE("bitwidth: %s is for %d MoE layers x %d experts; %s has %d x %d", path, p->n_layers, p->n_experts,
                 m->path, n_moe, m->cfg.n_expert);
    } else if (moe_profile_get_i32(p, "sensitivity.order", &nd, d, &o) || nd != 1 || d[0] != n) {
        MOE_LOGE("bitwidth: %s holds no finished sensitivity ranking (sensitivity.order); run moe-prep "
                 "sensitivity to the end first", path);
    } else if (!(*order = malloc(sizeof **order * (size_t)n))) {
        st = MOE_ERR_NOMEM;
    } else {
        memcpy(*order, o, sizeof **order * (size_t)n);
        st = MOE_OK;
    }
    moe_profile_free(p);
    return st;
}

/* write_tuning: the map (over model layers, -1 for dense ones) and the
 * search's figures into the bundle's tuning, keeping the other keys. */
static enum moe_status write_tuning(const char *path, const struct moe_bw_run_params *a, const struct moe_model *m,
                                    const struct moe_bw_result *r, const int *moe_of, double heldout_loss) {
    const struct moe_config *c = &m->cfg;
    struct moe_bundle *b = NULL;
    struct moe_bundle_kv *kv = NULL;
    const size_t le = (size_t)c->n_layer * (size_t)c->n_expert;
    int64_t *map = malloc(sizeof *map * le);
    enum moe_status st = map ? MOE_OK : MOE_ERR_NOMEM;
    if (st || (st = moe_bundle_open(path, &b)) || (st = moe_bundle_kv_new(&kv)) ||
        (st = moe_bundle_kv_copy(kv, moe_bundle_tuning(b))))
        goto done;
    moe_bundle_free(b);
    b = NULL;
    for (int l = 0; l < c->n_layer; l++)
        for (int e = 0; e < c->n_expert; e++)
            map[(size_t)l * c->n_expert + e] = moe_of[l] < 0 ? -1 : r->assign[moe_of[l] * c->n_expert + e];
    if (!(st = moe_tuning_set_bitwidth(kv, map, le, r->loss, heldout_loss, a->max_loss, a->max_bytes, r->bytes,
                                       a->dataset)))
        st = moe_bundle_replace_tuning(path, kv);
done:
    if (st) MOE_LOGE("bitwidth: cannot write the bit-width map into %s's tuning", path);
    moe_bundle_free(b);
    moe_bundle_kv_free(kv);
    free(map);
    return st;
}

/* run_heldout: the loss of the chosen and of the two uniform assignments
 * around it on a text the search did not see. */
static enum moe_status run_heldout(struct bw_eval *b, const struct moe_bw_problem *p, const struct moe_bw_result *r,
                                   const char *spec, struct moe_bw_heldout *h) {
    int32_t *ids = NULL;
    size_t n = 0;
    enum moe_status st =
        load_ids(b->m, spec, b->ep.max_chunks > 0 ? (size_t)b->ep.max_chunks * (size_t)b->ep.n_ctx : 0, &ids, &n);
    if (st) return st;
    const int32_t *keep_ids = b->ids;
    size_t keep_n = b->n_ids;
    b->ids = ids;
    b->n_ids = n;
    int16_t *as = malloc(sizeof *as * (size_t)p->n);
    double ppl;
    st = as ? MOE_OK : MOE_ERR_NOMEM;
    if (!st) {
        moe_bw_assign(p, b->ref, b->ref, p->n, as);
        st = ppl_of(b, as, &h->ref_ppl);
    }
    if (!st && !(st = ppl_of(b, r->assign, &ppl))) h->chosen = ppl / h->ref_ppl - 1;
    if (!st) {
        moe_bw_assign(p, r->upper, r->upper, p->n, as);
        if (!(st = ppl_of(b, as, &ppl))) h->upper = ppl / h->ref_ppl - 1;
    }
    if (!st) {
        moe_bw_assign(p, r->lower, r->lower, p->n, as);
        if (!(st = ppl_of(b, as, &ppl))) h->lower = ppl / h->ref_ppl - 1;
    }
    b->ids = keep_ids;
    b->n_ids = keep_n;
    free(as);
    free(ids);
    h->done = !st;
    if (st) MOE_LOGE("bitwidth: the held-out evaluation of %s failed (see above)", spec);
    return st;
}

/* The bundle's side of a run: the model, its MoE layers, expert sizes, ranking, text. */
struct bw_inputs {
    struct moe_model *m;
    int *moe_of, *layer_of; /* [n_layer] model layer -> MoE layer (-1: dense); [n_moe] the reverse */
    int n_moe;
    int64_t *bytes;         /* [n x P] */
    int32_t *order, *ids;
    size_t n_ids;
};

static void inputs_free(struct bw_inputs *in) {
    moe_model_free(in->m);
    free(in->moe_of);
    free(in->layer_of);
    free(in->bytes);
    free(in->order);
    free(in->ids);
}

/* expert_sizes: each routed expert's stored bytes at each precision, and the
 * bundle's precision names and non-expert bytes into out. */
static enum moe_status expert_sizes(struct bw_inputs *in, int n, int P, struct moe_bw_run *out) {
    const struct moe_model *m = in->m;
    if (!(in->bytes = malloc(sizeof *in->bytes * (size_t)n * (size_t)P)) ||
        !(out->prec_names = calloc((size_t)P, sizeof *out->prec_names)))
        return MOE_ERR_NOMEM;
    for (int q = 0; q < P; q++)
        snprintf(out->prec_names[q], sizeof out->prec_names[q], "%s", moe_bundle_precision_at(m->bundle, (uint32_t)q)->name);
    for (int i = 0; i < n; i++)
        for (int q = 0; q < P; q++) {
            struct moe_bundle_blob blob;
            enum moe_status st = moe_bundle_expert(m->bundle, (uint32_t)in->layer_of[i / m->cfg.n_expert],
                                                   (uint32_t)(i % m->cfg.n_expert), (uint32_t)q, &blob);
            if (st) return st;
            in->bytes[(size_t)i * P + q] = (int64_t)blob.raw_size;
        }
    for (size_t i = 0; i < moe_bundle_tensor_count(m->bundle); i++)
        out->dense_bytes += (int64_t)moe_bundle_tensor_at(m->bundle, i)->size;
    return MOE_OK;
}

/* load_inputs: the bundle, its layer maps, sizes, the ranking and the text. */
static enum moe_status load_inputs(const char *path, const struct moe_bw_run_params *p, struct bw_inputs *in,
                                   struct moe_bw_run *out) {
    struct moe_model_params mp = moe_model_default_params();
    enum moe_status st = moe_model_load(path, &mp, &in->m);
    if (st) {
        MOE_LOGE("bitwidth: cannot load %s (see the message above)", path);
        return st;
    }
    const struct moe_config *c = &in->m->cfg;
    if (!in->m->bundle) {
        MOE_LOGE("bitwidth: %s is not a bundle; make one with moe-prep quantize", path);
        return MOE_ERR_INVALID;
    }
    if (!(in->moe_of = malloc(sizeof *in->moe_of * (size_t)c->n_layer)) ||
        !(in->layer_of = malloc(sizeof *in->layer_of * (size_t)c->n_layer)))
        return MOE_ERR_NOMEM;
    for (int l = 0; l < c->n_layer; l++) {
        in->moe_of[l] = c->layer_moe[l] ? in->n_moe : -1;
        if (c->layer_moe[l]) in->layer_of[in->n_moe++] = l;
    }
    out->n = in->n_moe * c->n_expert;
    out->n_prec = in->m->n_expert_prec;
    if (out->n == 0 || out->n_prec > 64) {
        MOE_LOGE("bitwidth: %s has no routed experts or more than 64 precisions", path);
        return MOE_ERR_INVALID;
    }
    if ((st = read_ranking(p->sensitivity, in->m, in->n_moe, &in->order)) ||
        (st = expert_sizes(in, out->n, out->n_prec, out)))
        return st;
    size_t need = p->max_chunks > 0 ? (size_t)p->max_chunks * (size_t)p->n_ctx : 0;
    return load_ids(in->m, p->dataset, need, &in->ids, &in->n_ids);
}

enum moe_status moe_bw_run_bundle(const char *bundle, const struct moe_bw_run_params *p, struct moe_bw_run *out) {
    memset(out, 0, sizeof *out);
    if (!bundle || !p->sensitivity || !p->dataset || p->n_ctx < 4 || (p->max_loss >= 0) == (p->max_bytes > 0)) {
        MOE_LOGE("bitwidth: needs a bundle, a sensitivity file, a dataset, a context of at least 4 and exactly one "
                 "budget (loss or size)");
        return MOE_ERR_INVALID;
    }
    struct bw_inputs in;
    memset(&in, 0, sizeof in);
    enum moe_status st = load_inputs(bundle, p, &in, out);
    if (st) goto done;
    struct bw_eval be = {in.m, in.layer_of, in.n_moe, in.m->cfg.n_expert, 0, in.ids, in.n_ids,
                         moe_eval_default_params(), 0, 0, moe_now_s(), p};
    be.ep.n_ctx = p->n_ctx;
    be.ep.max_chunks = p->max_chunks;
    be.ep.n_threads = p->n_threads;
    be.ep.device = p->device, be.ep.device_options = p->device_options;
    be.ep.bos = moe_text_bos(in.m->tok);
    for (int q = 1; q < out->n_prec; q++) /* the reference: the largest precision */
        if (in.bytes[q] > in.bytes[be.ref]) be.ref = q;
    struct moe_bw_problem prob = {out->n, out->n_prec, in.bytes, in.order, p->max_loss, p->max_bytes, loss_cb, &be};
    if ((st = moe_bw_search(&prob, &out->result))) {
        MOE_LOGE("bitwidth: the search failed (see the message above)%s", st == MOE_ERR_RANGE ? "; raise the budget" : "");
        goto done;
    }
    if (p->heldout && (st = run_heldout(&be, &prob, &out->result, p->heldout, &out->heldout))) goto done;
    out->search_done = 1;
    if (p->write_tuning) {
        st = write_tuning(bundle, p, in.m, &out->result, in.moe_of, out->heldout.done ? out->heldout.chosen : NAN);
        out->wrote_tuning = !st;
    }
done:
    inputs_free(&in);
    return st;
}

/* plan-bundle.c - moe-prep plan's work as a library call (plan-bundle.h). */
#include "plan-bundle.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval.h"
#include "moe-bundle.h"
#include "moe-hw.h"
#include "moe-store.h"
#include "profile-h5.h"
#include "token-stream.h"

struct moe_plan_request moe_plan_request_defaults(void) {
    struct moe_plan_request r;
    memset(&r, 0, sizeof r);
    r.quality_budget = 0.02;
    r.ctx = 2048, r.prompt_len = 64, r.want = 4, r.eval_ctx = 128, r.eval_chunks = 2, r.max_evals = 8;
    r.threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return r;
}

/* note: a progress line to the request's callback. */
static void note(const struct moe_plan_request *rq, const char *fmt, ...) {
    if (!rq->note) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    rq->note(line, rq->note_user);
}

/* What the search's quality callback needs. */
struct quality_ctx {
    const struct moe_plan_request *rq;
    const struct moe_plan_model *pm;
    struct moe_model *model, *ref; /* the bundle (lazy) and the reference (resident, largest precision) */
    int32_t *ids;
    size_t n_ids;
    struct moe_eval_params ep;
};

/* quality: an eval through the engine with the plan's options (plan.h's callback). */
static enum moe_status quality(const struct moe_plan *p, void *user, struct moe_plan_quality *q) {
    struct quality_ctx *x = user;
    struct moe_store_params sp = moe_store_default_params();
    sp.expert_mem = p->expert_mem;
    sp.high = p->high >= 0 ? x->pm->prec_name[p->high] : NULL;
    sp.low = p->low >= 0 ? x->pm->prec_name[p->low] : NULL;
    sp.dynamic = p->low >= 0;
    sp.low_share = p->low >= 0 ? p->low_share : 0.25;
    sp.t1 = p->t1, sp.t2 = p->t2;
    sp.policy = (int)p->policy;
    sp.prefetch_paths = p->prefetch_paths;
    struct moe_eval_params ep = x->ep;
    ep.store = &sp;
    ep.n_batch = 1;
    ep.little_k = p->little_k, ep.gamma = p->gamma;
    struct moe_eval_result r;
    char opts[512];
    moe_plan_options(p, x->pm, opts, sizeof opts);
    enum moe_status st = moe_eval_run(x->model, x->ref, x->ids, x->n_ids, &ep, &r);
    if (st) return st;
    q->ppl_ratio = r.ppl_ratio.val, q->kld = r.kld.val, q->same_top = r.same_top.val;
    note(x->rq, "quality of %s: PPL %+.2f %%, KL %.4f, top agreement %.1f %%", opts, 100 * (q->ppl_ratio - 1), q->kld,
         100 * q->same_top);
    moe_eval_result_clear(&r);
    return MOE_OK;
}

/* expert_sizes: every expert copy's bytes in memory and in storage, per
 * precision, and the reference (largest) precision. */
static enum moe_status expert_sizes(const char *path, const struct moe_model *m, const int *layer_of,
                                    struct moe_plan_outcome *o) {
    struct moe_plan_model *pm = &o->pm;
    const size_t LE = (size_t)pm->L * (size_t)pm->E;
    o->raw = malloc(sizeof *o->raw * LE * (size_t)pm->n_prec);
    o->stored = malloc(sizeof *o->stored * LE * (size_t)pm->n_prec);
    if (!o->raw || !o->stored) return MOE_ERR_NOMEM;
    int64_t biggest = -1;
    for (int p = 0; p < pm->n_prec; p++) {
        const struct moe_bundle_precision *d = moe_bundle_precision_at(m->bundle, (uint32_t)p);
        snprintf(pm->prec_name[p], sizeof pm->prec_name[p], "%s", d->name);
        if ((int64_t)d->raw_size > biggest) biggest = (int64_t)d->raw_size, pm->ref_prec = p;
        for (int l = 0; l < pm->L; l++)
            for (int e = 0; e < pm->E; e++) {
                struct moe_bundle_blob bl;
                if (moe_bundle_expert(m->bundle, (uint32_t)layer_of[l], (uint32_t)e, (uint32_t)p, &bl)) {
                    MOE_LOGE("%s: cannot locate expert %d of layer %d", path, e, layer_of[l]);
                    return MOE_ERR_INVALID;
                }
                o->raw[(size_t)p * LE + (size_t)l * pm->E + e] = (int64_t)bl.raw_size;
                o->stored[(size_t)p * LE + (size_t)l * pm->E + e] = (int64_t)bl.stored_size;
            }
    }
    pm->raw = o->raw, pm->stored = o->stored;
    return MOE_OK;
}

/* model_facts: the bundle's expert sizes, map, tuning and memory outside the store. */
static enum moe_status model_facts(const struct moe_plan_request *rq, struct moe_plan_outcome *o) {
    const struct moe_model *m = o->model;
    const struct moe_config *c = &m->cfg;
    const struct moe_tuning *tun = &o->tun;
    struct moe_plan_model *pm = &o->pm;
    int layer_of[1024], L = 0;
    for (int l = 0; l < c->n_layer && L < 1024; l++)
        if (c->layer_moe[l]) layer_of[L++] = l;
    memset(pm, 0, sizeof *pm);
    pm->L = L, pm->E = c->n_expert, pm->K = c->n_expert_used, pm->n_prec = m->n_expert_prec;
    if (pm->n_prec > MOE_PLAN_MAX_PREC) pm->n_prec = MOE_PLAN_MAX_PREC;
    const size_t LE = (size_t)L * (size_t)pm->E;
    enum moe_status st = expert_sizes(rq->bundle, m, layer_of, o);
    if (st) return st;
    if (tun->has_bitwidth_map) { /* the precisions the model was bound at: the map */
        if (!(o->map = malloc(sizeof *o->map * LE))) return MOE_ERR_NOMEM;
        for (int l = 0; l < L; l++)
            for (int e = 0; e < pm->E; e++) {
                int p = moe_model_get_expert_precision(m, layer_of[l], e);
                o->map[(size_t)l * pm->E + e] = (int16_t)(p >= 0 && p < pm->n_prec ? p : 0);
            }
        pm->map = o->map;
    }
    int64_t nonexpert = 0;
    for (size_t i = 0; i < moe_bundle_tensor_count(m->bundle); i++)
        nonexpert += (int64_t)moe_bundle_tensor_at(m->bundle, i)->size;
    const int ctx = rq->ctx < c->max_pos ? rq->ctx : c->max_pos;
    const int64_t kv = (int64_t)moe_config_kv_cache_bytes(c, ctx); /* the latent only, for MLA */
    pm->fixed_bytes = nonexpert + kv + ((int64_t)16 << 20);
    pm->n_loaders = 2;
    pm->t1 = tun->has_thresholds ? tun->t1 : NAN, pm->t2 = tun->has_thresholds ? tun->t2 : NAN;
    if (tun->has_cache_weights) {
        pm->has_hobbit = 1;
        memcpy(pm->w, tun->cache_w, sizeof pm->w);
        pm->admit = tun->cache_admit;
        if (tun->has_cache_popularity) pm->freq_high = tun->cache_freq_high, pm->freq_low = tun->cache_freq_low;
    }
    if (tun->has_placement_order) {
        if (!(o->order = malloc(sizeof *o->order * LE))) return MOE_ERR_NOMEM;
        for (size_t i = 0; i < LE; i++) o->order[i] = (int32_t)tun->placement_order[i];
        pm->order = o->order;
    }
    return MOE_OK;
}

/* gammas: thresholds for fallback ratios of 10, 20, 30, 50 % from the
 * profile's histogram of the little model's top probability. */
static void gammas(const struct moe_profile *p, struct moe_plan_params *pp) {
    const int64_t *h;
    int nd;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    if (moe_profile_get_i64(p, "sum.big_little_maxprob", &nd, dims, &h) != MOE_OK || nd != 2 || dims[0] != 2 ||
        dims[1] < 2)
        return;
    const int64_t B = dims[1];
    int64_t n = 0;
    for (int64_t b = 0; b < 2 * B; b++) n += h[b] > 0 ? h[b] : 0;
    if (n == 0) return;
    static const double targets[] = {0.1, 0.2, 0.3, 0.5};
    for (int i = 0; i < 4; i++) {
        int64_t below = 0, best_b = 0;
        double best = INFINITY, best_fb = 0;
        for (int64_t b = 0; b <= B; b++) {
            double d = fabs((double)below - targets[i] * (double)n);
            if (d < best - 1e-9) best = d, best_b = b, best_fb = (double)below / (double)n;
            if (b < B) below += (h[b] > 0 ? h[b] : 0) + (h[B + b] > 0 ? h[B + b] : 0);
        }
        const double g = (double)best_b / (double)B;
        if (pp->n_gamma > 0 && pp->gamma[pp->n_gamma - 1] == g) continue;
        pp->gamma[pp->n_gamma] = g, pp->fallback[pp->n_gamma] = best_fb;
        pp->n_gamma++;
    }
}

/* hardware: the table's entries for the bundle, measured when missing. */
static enum moe_status hardware(const struct moe_plan_request *rq, struct moe_hw *hw, const struct moe_hw_model **hm,
                                const struct moe_hw_storage **hs) {
    char path[1024], key[256], dev[32];
    const char *table = rq->hw_table;
    if (!table) {
        if (moe_hw_default_path(path, sizeof path)) {
            MOE_LOGE("neither XDG_CACHE_HOME nor HOME is set; give the hardware table's path (--hw FILE)");
            return MOE_ERR_INVALID;
        }
        table = path;
    }
    enum moe_status st = moe_hw_load(table, hw);
    if (st && st != MOE_ERR_NOT_FOUND) memset(hw, 0, sizeof *hw);
    if ((st = moe_hw_model_key(rq->bundle, key, sizeof key)) || (st = moe_hw_storage_key(rq->bundle, dev, sizeof dev)))
        return st;
    moe_hw_device_key(key, sizeof key, rq->device);
    *hm = moe_hw_find_model(hw, key, rq->threads);
    *hs = moe_hw_find_storage(hw, dev);
    if (*hm && *hs) return MOE_OK;
    if (rq->no_measure) {
        MOE_LOGE("%s has no numbers for %s on %d threads (run moe-prep hw %s -t %d)", table, key, rq->threads,
                 rq->bundle, rq->threads);
        return MOE_ERR_NOT_FOUND;
    }
    note(rq, "no hardware numbers for %s on %d threads in %s: measuring (moe-prep hw)", key, rq->threads, table);
    if ((st = moe_hw_measure_bundle(rq->bundle, rq->threads, rq->device, rq->device_options, hw)) ||
        (st = moe_hw_save(table, hw)))
        return st;
    *hm = moe_hw_find_model(hw, key, rq->threads);
    *hs = moe_hw_find_storage(hw, dev);
    return *hm && *hs ? MOE_OK : MOE_ERR_NOT_FOUND;
}

/* path_prefetch: EdgeMoE's order-1 path dictionary (the runtime's default
 * order) from the sequences not held out; held[] marks the held-out ones. */
static enum moe_status path_prefetch(const struct moe_trace *t, const struct moe_plan_model *pm,
                                     struct moe_plan_params *pp, unsigned char *held, struct moe_path_dict **dict) {
    int32_t *fit = malloc(sizeof *fit * ((size_t)t->n_seq + 1));
    if (!fit) return MOE_ERR_NOMEM;
    int n_fit = 0;
    moe_cache_split(t->n_seq, pp->heldout, held);
    for (int i = 0; i < t->n_seq; i++)
        if (!held[i]) fit[n_fit++] = i;
    if (n_fit > 0 && pm->L > 1 && moe_cache_path_dict(t, fit, n_fit, 1, dict) == MOE_OK) pp->paths = *dict;
    free(fit);
    return MOE_OK;
}

/* quality_setup: the eval text, the reference model and the callback. */
static enum moe_status quality_setup(const struct moe_plan_request *rq, struct quality_ctx *x,
                                     struct moe_plan_params *pp) {
    char *text = NULL;
    size_t len = 0;
    struct moe_model_params rp = moe_model_default_params();
    rp.expert_precision = x->pm->prec_name[x->pm->ref_prec];
    enum moe_status st;
    if ((st = moe_text_load(rq->eval_text, NULL, &text, &len)) || (st = moe_model_load(rq->bundle, &rp, &x->ref)) ||
        (st = moe_text_tokenize(x->model, x->ref, text, len, &x->ids, &x->n_ids))) {
        MOE_LOGE("cannot prepare the eval on %s", rq->eval_text);
        free(text);
        return st;
    }
    free(text);
    x->ep = moe_eval_default_params();
    x->ep.n_ctx = rq->eval_ctx, x->ep.max_chunks = rq->eval_chunks, x->ep.n_threads = rq->threads;
    x->ep.device = rq->device, x->ep.device_options = rq->device_options;
    x->ep.bos = moe_text_bos(x->model->tok);
    if (x->n_ids < 2 * (size_t)rq->eval_ctx) {
        MOE_LOGE("%s has %zu tokens; an eval context of %d needs %d", rq->eval_text, x->n_ids, rq->eval_ctx,
                 2 * rq->eval_ctx);
        return MOE_ERR_INVALID;
    }
    pp->quality = quality, pp->user = x;
    pp->quality_budget = rq->quality_budget;
    pp->max_evals = rq->max_evals;
    pp->want = rq->want;
    return MOE_OK;
}

/* load_inputs: the bundle (experts lazily), its tuning and the profile. */
static enum moe_status load_inputs(const struct moe_plan_request *rq, struct moe_plan_outcome *o,
                                   struct moe_profile **prof) {
    struct moe_model_params mp = moe_model_default_params();
    mp.lazy_experts = 1;
    enum moe_status st;
    if ((st = moe_model_load(rq->bundle, &mp, &o->model)) || !o->model->bundle) {
        MOE_LOGE("%s is not a bundle this tool can load", rq->bundle);
        return st ? st : MOE_ERR_INVALID;
    }
    if ((st = moe_profile_read(rq->profile, prof))) {
        MOE_LOGE("cannot read the profile %s", rq->profile);
        return st;
    }
    int L = 0;
    for (int l = 0; l < o->model->cfg.n_layer; l++) L += o->model->cfg.layer_moe[l] != 0;
    if (L < 1) return MOE_ERR_INVALID;
    if ((st = moe_tuning_read(moe_bundle_tuning(o->model->bundle), L, o->model->cfg.n_expert, &o->tun))) return st;
    return model_facts(rq, o);
}

enum moe_status moe_plan_bundle(const struct moe_plan_request *rq, struct moe_plan_outcome *out) {
    memset(out, 0, sizeof *out);
    if (!rq->bundle || !rq->profile || rq->mem <= 0 || rq->threads <= 0) {
        MOE_LOGE("a plan needs a bundle, its profile, a memory size and a thread count");
        return MOE_ERR_INVALID;
    }
    struct moe_profile *prof = NULL;
    struct moe_hw *hw = calloc(1, sizeof *hw);
    struct quality_ctx x = {rq, &out->pm, NULL, NULL, NULL, 0, {0}};
    struct moe_path_dict *dict = NULL;
    unsigned char *held = NULL;
    struct moe_trace t;
    enum moe_status st = hw ? load_inputs(rq, out, &prof) : MOE_ERR_NOMEM;
    if (st) goto done;
    x.model = out->model;
    moe_profile_trace(prof, &t);
    const struct moe_plan_model *pm = &out->pm;
    if (t.n_layers != pm->L || t.n_experts != pm->E || t.k != pm->K) {
        MOE_LOGE("%s was recorded on %d MoE layers x %d experts, top-%d; %s has %d x %d, top-%d: profile this bundle "
                 "(moe-prep profile)", rq->profile, t.n_layers, t.n_experts, t.k, rq->bundle, pm->L, pm->E, pm->K);
        st = MOE_ERR_INVALID;
        goto done;
    }
    const struct moe_hw_model *hm = NULL;
    const struct moe_hw_storage *hs = NULL;
    if ((st = hardware(rq, hw, &hm, &hs))) goto done;
    struct moe_plan_params pp = moe_plan_default_params();
    pp.mem = rq->mem;
    pp.prompt_len = rq->prompt_len;
    if (!rq->no_big_little && pm->K >= 2) {
        pp.little_k = pm->K / 2;
        gammas(prof, &pp);
        if (pp.n_gamma == 0) pp.little_k = 0;
    }
    if (!(held = calloc((size_t)t.n_seq + 1, 1))) st = MOE_ERR_NOMEM;
    if (st || (st = path_prefetch(&t, pm, &pp, held, &dict))) goto done;
    if (rq->eval_text && (st = quality_setup(rq, &x, &pp))) goto done;
    if ((st = moe_plan_search(&t, pm, hm, hs, &pp, &out->res))) goto done;
    for (int i = 0; i < t.n_seq; i++)
        if (held[i]) out->res.heldout_tokens += t.seq_start[i + 1] - t.seq_start[i];
done:
    moe_path_dict_free(dict);
    free(held);
    free(x.ids);
    free(hw);
    moe_profile_free(prof);
    moe_model_free(x.ref);
    if (st) moe_plan_outcome_free(out);
    return st;
}

void moe_plan_outcome_free(struct moe_plan_outcome *o) {
    if (!o) return;
    moe_plan_result_free(&o->res);
    free(o->raw);
    free(o->stored);
    free(o->map);
    free(o->order);
    moe_model_free(o->model);
    memset(o, 0, sizeof *o);
}

enum moe_status moe_plan_apply(const struct moe_plan_request *rq, const struct moe_plan_outcome *o,
                               const struct moe_plan *p) {
    const struct moe_plan_model *pm = &o->pm;
    struct moe_tuning_plan t;
    memset(&t, 0, sizeof t);
    t.mem = rq->mem, t.expert_mem = p->expert_mem;
    snprintf(t.high, sizeof t.high, "%s", p->high >= 0 ? pm->prec_name[p->high] : "");
    snprintf(t.low, sizeof t.low, "%s", p->low >= 0 ? pm->prec_name[p->low] : "");
    snprintf(t.policy, sizeof t.policy, "%s", moe_cache_policy_name(p->policy));
    t.dynamic = p->low >= 0, t.low_share = p->low >= 0 ? p->low_share : 0.25, t.t1 = p->t1, t.t2 = p->t2;
    t.prefetch_paths = p->prefetch_paths, t.little_k = p->little_k, t.gamma = p->little_k ? p->gamma : 0;
    t.threads = rq->threads, t.tok_s = p->tok_s, t.bytes_per_token = p->bytes_per_token;
    t.quality = p->neutral ? 0 : p->has_quality ? p->q.ppl_ratio - 1 : NAN;
    struct moe_bundle *b = NULL;
    struct moe_bundle_kv *kv = NULL;
    enum moe_status st;
    if ((st = moe_bundle_open(rq->bundle, &b)) || (st = moe_bundle_kv_new(&kv)) ||
        (st = moe_bundle_kv_copy(kv, moe_bundle_tuning(b))))
        goto done;
    moe_bundle_free(b);
    b = NULL;
    st = moe_tuning_set_plan(kv, &t);
    if (!st) st = moe_bundle_replace_tuning(rq->bundle, kv);
done:
    if (st) MOE_LOGE("cannot write the plan into %s: %s", rq->bundle, moe_status_str(st));
    moe_bundle_free(b);
    moe_bundle_kv_free(kv);
    return st;
}

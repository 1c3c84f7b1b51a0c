/*
 * fit-cache-route.c - the margin of cache-aware routing fitted on the
 * profile's sequences (fit-cache-route.h): the same substitution rule the
 * session applies (moe_cache_route_pick), replayed through the runtime's
 * cache core at the fitted size and policy.
 */
#include "fit-cache-route.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe-base.h"
#include "moe-bundle.h"
#include "moe-cache.h"
#include "moe-dtype.h"
#include "moe-tuning.h"

static const double k_grid[] = {0, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2};
#define N_GRID ((int)(sizeof k_grid / sizeof k_grid[0]))

struct served_ctx {
    const struct moe_cache *c;
    int32_t base; /* layer * E */
    int dynamic;
};

static int served(int e, int rank, void *user) {
    const struct served_ctx *s = user;
    const int32_t g = s->base + e;
    return moe_cache_contains(s->c, g, 1) || (rank > 0 && s->dynamic && moe_cache_contains(s->c, g, 0));
}

/* logit: router logit of expert e at token t, layer l. */
static float logit(const struct moe_profile *p, int64_t t, int l, int e) {
    const size_t i = ((size_t)t * (size_t)p->n_layers + (size_t)l) * (size_t)p->n_experts + (size_t)e;
    return p->logits == MOE_PROFILE_LOGITS_F16 ? moe_f16_to_f32(((const uint16_t *)p->router_logits)[i])
                                               : ((const float *)p->router_logits)[i];
}

/* replay: every sequence of p decoded at margin `margin`; fills *pt. */
static enum moe_status replay(const struct moe_profile *p, const struct moe_fit_cache_model *m,
                              const struct moe_cache_config *cc, double margin, struct moe_fit_route_point *pt,
                              int64_t *tokens) {
    const int L = p->n_layers, E = p->n_experts, K = p->k;
    struct moe_cache *c;
    enum moe_status st = moe_cache_new(L, E, MOE_CACHE_HOBBIT, cc, &c);
    if (st) return st;
    float probs[E];
    int32_t sel[K];
    float w[K];
    int64_t n_tok = 0, uses = 0, subs = 0, miss_hi = 0, miss_lo = 0;
    double mass = 0;
    struct served_ctx sc = {c, 0, cc->low_cap > 0};
    for (int q = 0; q < p->n_seq; q++) {
        moe_cache_begin_sequence(c);
        for (int64_t t = p->seq_start[q]; t < p->seq_start[q + 1]; t++) {
            n_tok++;
            for (int l = 0; l < L; l++) {
                moe_cache_begin_step(c, l, (int32_t)(t - p->seq_start[q] + 1));
                float mx = -INFINITY, sum = 0;
                for (int e = 0; e < E; e++) mx = fmaxf(mx, logit(p, t, l, e));
                for (int e = 0; e < E; e++) sum += (probs[e] = expf(logit(p, t, l, e) - mx));
                for (int e = 0; e < E; e++) probs[e] /= sum;
                int ok = 1;
                for (int j = 0; j < K; j++) {
                    sel[j] = p->experts[((size_t)t * (size_t)L + (size_t)l) * (size_t)K + (size_t)j];
                    ok &= sel[j] >= 0 && sel[j] < E;
                }
                if (!ok) continue; /* a row the profile did not fill */
                double moved = 0;
                sc.base = l * E;
                subs += moe_cache_route_pick(probs, E, sel, K, margin, served, &sc, &moved);
                mass += moved;
                for (int j = 0; j < K; j++) w[j] = probs[sel[j]];
                for (int i = 1; i < K; i++) /* largest first, as the session orders them */
                    for (int j = i; j > 0 && w[j] > w[j - 1]; j--) {
                        const float tw = w[j];
                        const int32_t te = sel[j];
                        w[j] = w[j - 1], sel[j] = sel[j - 1], w[j - 1] = tw, sel[j - 1] = te;
                    }
                double ws = 0, acc = 0;
                for (int j = 0; j < K; j++) ws += w[j];
                for (int j = 0; j < K; j++) { /* HOBBIT's need, as the store's token_needs (no skipping) */
                    const double s = ws > 0 ? acc / ws : 0;
                    acc += w[j];
                    const enum moe_cache_need need = j == 0 || !sc.dynamic || s <= m->t1 ? MOE_CACHE_NEED_HIGH
                                                                                         : MOE_CACHE_NEED_LOW;
                    struct moe_cache_result res;
                    moe_cache_access(c, l * E + sel[j], need, MOE_CACHE_NEVER, MOE_CACHE_NEVER, &res);
                    miss_hi += res.outcome == MOE_CACHE_MISS_HIGH;
                    miss_lo += res.outcome == MOE_CACHE_MISS_LOW;
                    uses++;
                }
            }
        }
    }
    moe_cache_free(c);
    const double nt = n_tok > 0 ? (double)n_tok : NAN, nu = uses > 0 ? (double)uses : NAN;
    *pt = (struct moe_fit_route_point){margin, (double)(miss_hi + miss_lo) / nt,
                                       ((double)miss_hi * m->hi_stored + (double)miss_lo * m->lo_stored) / nt,
                                       (double)subs / nu, mass / nu};
    *tokens = n_tok;
    return MOE_OK;
}

enum moe_status moe_fit_cache_route(const struct moe_profile *p, const struct moe_fit_cache_model *m,
                                    const struct moe_fit_cache_result *r, double target,
                                    struct moe_fit_route_result *out) {
    memset(out, 0, sizeof *out);
    if (!(target >= 0) || !isfinite(target)) {
        MOE_LOGE("cache-aware routing: target %g must be a probability mass >= 0", target);
        return MOE_ERR_INVALID;
    }
    if (p->logits == MOE_PROFILE_LOGITS_NONE || !p->router_logits) {
        MOE_LOGE("cache-aware routing: the profile keeps no router logits (record it with moe-prep profile "
                 "--router-logits f16)");
        return MOE_ERR_NOT_FOUND;
    }
    struct moe_cache_config cc = moe_cache_default_config();
    cc.high_cap = r->H, cc.low_cap = r->Lc, cc.low_cost = m->low_cost, cc.high_bytes = m->hi_bytes;
    cc.low_bytes = m->lo_bytes;
    memcpy(cc.w, r->w, sizeof cc.w);
    cc.admit = r->admit;
    if (r->freq_high && r->freq_low && r->w[4] > 0) cc.freq_high = r->freq_high, cc.freq_low = r->freq_low;
    out->target = target;
    for (int i = 0; i < N_GRID && i < MOE_FIT_ROUTE_MAX_POINTS; i++) {
        enum moe_status st = replay(p, m, &cc, k_grid[i], &out->pts[i], &out->tokens);
        if (st) return st;
        out->n_points = i + 1;
        if (out->pts[i].mass_per_use <= target) out->margin = k_grid[i];
    }
    return MOE_OK;
}

enum moe_status moe_fit_cache_route_write(const char *path, const struct moe_fit_route_result *res) {
    struct moe_bundle *b = NULL;
    struct moe_bundle_kv *kv = NULL;
    enum moe_status st;
    if ((st = moe_bundle_open(path, &b)) || (st = moe_bundle_kv_new(&kv))) goto done;
    if ((st = moe_bundle_kv_copy(kv, moe_bundle_tuning(b)))) goto done;
    moe_bundle_free(b); /* replace_tuning opens the file itself */
    b = NULL;
    if ((st = moe_tuning_set_cache_route(kv, res->margin, res->target)) || (st = moe_bundle_replace_tuning(path, kv)))
        goto done;
done:
    moe_bundle_free(b);
    moe_bundle_kv_free(kv);
    return st;
}

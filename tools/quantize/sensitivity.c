/*
 * sensitivity.c - EdgeMoE's per-expert sensitivity sweep and the stage
 * around it: checkpoints, resume, shards and the results file (see
 * sensitivity.h). The command is sensitivity-cmd.c; the merge of shard files
 * sensitivity-merge.c.
 */
#include "sensitivity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe-base.h"
#include "moe-bundle.h"
#include "moe-session.h"
#include "profile-h5.h"
#include "sensitivity-impl.h"

struct moe_sens_params moe_sens_default_params(void) {
    struct moe_sens_params p = {0};
    p.low = -1;
    p.base = -1;
    return p;
}

/* ---- state ------------------------------------------------------------ */

static int n_moe_layers(const struct moe_config *c) {
    int n = 0;
    for (int l = 0; l < c->n_layer; l++) n += c->layer_moe[l] != 0;
    return n;
}

enum moe_status moe_sens_state_init(struct moe_sens_state *s, const struct moe_model *m, int n_seq, int n_ctx) {
    return sens_state_alloc(s, n_moe_layers(&m->cfg), m->cfg.n_expert, n_seq, n_ctx);
}

enum moe_status sens_state_alloc(struct moe_sens_state *s, int n_moe, int n_expert, int n_seq, int n_ctx) {
    memset(s, 0, sizeof *s);
    s->n_moe = n_moe;
    s->n_expert = n_expert;
    s->n_seq = n_seq;
    s->n_ctx = n_ctx;
    const size_t n = (size_t)s->n_moe * (size_t)s->n_expert + 1;
    s->kl = calloc(n, sizeof *s->kl);
    s->dnll = calloc(n, sizeof *s->dnll);
    s->proxy = calloc(n, sizeof *s->proxy);
    s->routed = calloc(n, sizeof *s->routed);
    if (!s->kl || !s->dnll || !s->proxy || !s->routed) {
        moe_sens_state_clear(s);
        return MOE_ERR_NOMEM;
    }
    return MOE_OK;
}

void moe_sens_state_clear(struct moe_sens_state *s) {
    free(s->kl);
    free(s->dnll);
    free(s->proxy);
    free(s->routed);
    memset(s, 0, sizeof *s);
}

/* ---- one sweep -------------------------------------------------------- */

/* What the baseline pass of one sequence leaves behind. */
struct capture {
    int on;                 /* observers copy only during the baseline pass */
    int n_layer, n_ctx, H, K;
    const int *moe_of;      /* [n_layer] model layer -> MoE layer or -1 */
    float *x;               /* [(n_layer + 1) x n_ctx x H] residual stream entering each layer */
    float *gin;             /* [n_moe x n_ctx x H] gate inputs */
    int32_t *sel;           /* [n_moe x n_ctx x K] */
    float *selw;            /* [n_moe x n_ctx x K] */
};

static void on_layer(const struct moe_layer_event *ev, void *user) {
    struct capture *c = user;
    if (!c->on || ev->layer < 0 || ev->layer > c->n_layer || ev->pos0 + ev->n_tokens > c->n_ctx) return;
    memcpy(c->x + ((size_t)ev->layer * c->n_ctx + (size_t)ev->pos0) * c->H, ev->x,
           sizeof(float) * (size_t)ev->n_tokens * (size_t)c->H);
}

static void on_route(const struct moe_route_event *ev, void *user) {
    struct capture *c = user;
    if (!c->on || ev->layer < 0 || ev->layer >= c->n_layer || ev->k != c->K || ev->pos0 + ev->n_tokens > c->n_ctx)
        return;
    int li = c->moe_of[ev->layer];
    if (li < 0) return;
    const size_t row = (size_t)li * c->n_ctx + (size_t)ev->pos0;
    memcpy(c->gin + row * c->H, ev->gate_input, sizeof(float) * (size_t)ev->n_tokens * (size_t)c->H);
    memcpy(c->sel + row * c->K, ev->experts, sizeof(int32_t) * (size_t)ev->n_tokens * (size_t)c->K);
    memcpy(c->selw + row * c->K, ev->weights, sizeof(float) * (size_t)ev->n_tokens * (size_t)c->K);
}

/* row_lse: log-sum-exp of one row of logits (float exponentials, double sum). */
static double row_lse(const float *z, int V) {
    float mx = z[0];
    for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += expf(z[v] - mx);
    return (double)mx + log(sum);
}

/* base_rows: per baseline row, its log-sum-exp and the probabilities. */
static void base_rows(const float *zb, int n, int V, double *lse, float *pb) {
    for (int i = 0; i < n; i++) {
        const float *z = zb + (size_t)i * V;
        lse[i] = row_lse(z, V);
        for (int v = 0; v < V; v++) pb[(size_t)i * V + v] = (float)exp((double)z[v] - lse[i]);
    }
}

/* row_kl: KL(P_base || P_new) of one position from the baseline logits zb,
 * probabilities pb and log-sum-exp lse_b and the new logits z, written as
 * sum_v pb_v (zb_v - z_v) + lse_new - lse_b so that small changes are not
 * lost to rounding; *dnll gets the NLL change of token `next` (if >= 0). */
static double row_kl(const float *zb, const float *pb, double lse_b, const float *z, int V, int next,
                     double *dnll) {
    const double lse = row_lse(z, V);
    double dot = 0;
    for (int v = 0; v < V; v++) dot += (double)(pb[v] * (zb[v] - z[v]));
    if (next >= 0) *dnll = ((double)zb[next] - lse_b) - ((double)z[next] - lse);
    return dot + lse - lse_b;
}

struct sweep {
    struct moe_model *m;
    const struct moe_sens_params *p;
    struct moe_sens_state *st;
    struct moe_session *sess;
    struct capture cap;
    int L, E, K, H, V, n, n_moe;
    int *moe_of, *layer_of;
    struct moe_ffn *ffn_low, *ffn_base; /* [n_moe x E] */
    float *zb;       /* [n x V] baseline logits */
    float *pb;       /* [n x V] baseline probabilities */
    double *lse;     /* [n] baseline log-sum-exp per row */
    float *z;        /* [n x V] logits after the change */
    float *xp;       /* [n x H] changed residual stream */
    float *xe, *yl, *yb; /* [n x H] gathered gate inputs, low and base outputs */
    int32_t *idx;    /* [n] rows routed to the expert */
    float *g;        /* [n] their gate weights */
};

/* score_rows: add the KL and NLL change of n_rows rows of new logits z
 * (row i is position rows[i]; rows NULL = position i) for expert slot ex. */
static void score_rows(struct sweep *w, const int32_t *seq, const float *z, const int32_t *rows, int n_rows,
                       int ex) {
    double kl = 0, dnll = 0;
    for (int i = 0; i < n_rows; i++) {
        int pos = rows ? rows[i] : i;
        int next = pos + 1 < w->n ? seq[pos + 1] : -1;
        double d = 0;
        const size_t r = (size_t)pos * w->V;
        kl += row_kl(w->zb + r, w->pb + r, w->lse[pos], z + (size_t)i * w->V, w->V, next, &d);
        dnll += d;
    }
    w->st->kl[ex] += kl;
    w->st->dnll[ex] += dnll;
}

/* expert_delta: for MoE layer li (model layer l), expert e: gather the rows
 * routed to it, their outputs at low and base precision, the proxy term and
 * xp = residual stream after layer l with the change. Returns the rows. */
static enum moe_status expert_delta(struct sweep *w, int l, int li, int e, int *n_rows) {
    const size_t H = (size_t)w->H;
    int n = 0;
    const int32_t *sel = w->cap.sel + (size_t)li * w->n * w->K;
    const float *selw = w->cap.selw + (size_t)li * w->n * w->K;
    for (int t = 0; t < w->n; t++)
        for (int k = 0; k < w->K; k++)
            if (sel[(size_t)t * w->K + k] == e) {
                w->idx[n] = t;
                w->g[n] = selw[(size_t)t * w->K + k];
                memcpy(w->xe + (size_t)n * H, w->cap.gin + ((size_t)li * w->n + (size_t)t) * H, sizeof(float) * H);
                n++;
            }
    *n_rows = n;
    if (n == 0) return MOE_OK;
    const int ex = li * w->E + e;
    enum moe_status st;
    if ((st = moe_session_ffn(w->sess, &w->ffn_low[ex], w->xe, w->yl, n)) ||
        (st = moe_session_ffn(w->sess, &w->ffn_base[ex], w->xe, w->yb, n)))
        return st;
    double proxy = 0;
    for (int i = 0; i < n; i++)
        for (size_t d = 0; d < H; d++) {
            float dv = w->g[i] * (w->yl[(size_t)i * H + d] - w->yb[(size_t)i * H + d]);
            w->yl[(size_t)i * H + d] = dv; /* yl now holds the change */
            proxy += (double)dv * dv;
        }
    w->st->proxy[ex] += proxy;
    w->st->routed[ex] += n;
    if (w->p->metric == MOE_SENS_PROXY) return MOE_OK;
    memcpy(w->xp, w->cap.x + (size_t)(l + 1) * w->n * H, sizeof(float) * (size_t)w->n * H);
    for (int i = 0; i < n; i++) {
        float *dst = w->xp + (size_t)w->idx[i] * H;
        for (size_t d = 0; d < H; d++) dst[d] += w->yl[(size_t)i * H + d];
    }
    return MOE_OK;
}

/* expert_cached: the loss change of expert e of MoE layer li by recomputing
 * only what it touches. */
static enum moe_status expert_cached(struct sweep *w, const int32_t *seq, int l, int li, int e) {
    int n;
    enum moe_status st = expert_delta(w, l, li, e, &n);
    if (st || n == 0 || w->p->metric == MOE_SENS_PROXY) return st;
    const int ex = li * w->E + e;
    const size_t H = (size_t)w->H;
    if (l + 1 == w->L) { /* the last layer: only the changed rows reach the LM head */
        for (int i = 0; i < n; i++)
            memmove(w->xp + (size_t)i * H, w->xp + (size_t)w->idx[i] * H, sizeof(float) * H);
        if ((st = moe_session_lm_head(w->sess, w->xp, n, w->z))) return st;
        score_rows(w, seq, w->z, w->idx, n, ex);
        return MOE_OK;
    }
    moe_session_reset(w->sess);
    if ((st = moe_session_forward_from(w->sess, l + 1, seq, w->xp, w->n, w->z, 1))) return st;
    /* rows before the first routed one are unchanged (causal attention) */
    const int p0 = w->idx[0];
    int32_t *rows = w->idx; /* reused as the positions p0 .. n-1 */
    for (int i = 0; i < w->n - p0; i++) rows[i] = p0 + i;
    score_rows(w, seq, w->z + (size_t)p0 * w->V, rows, w->n - p0, ex);
    return MOE_OK;
}

/* expert_naive: the same change by a full forward pass with the expert
 * rebound to the low precision. */
static enum moe_status expert_naive(struct sweep *w, const int32_t *seq, int l, int li, int e) {
    int n;
    enum moe_status st = expert_delta(w, l, li, e, &n); /* routing counts and proxy, as cached */
    if (st || n == 0 || w->p->metric == MOE_SENS_PROXY) return st;
    if ((st = moe_model_set_expert_precision(w->m, l, e, w->p->low))) return st;
    moe_session_reset(w->sess);
    st = moe_session_forward(w->sess, seq, w->n, w->z, 1);
    enum moe_status st2 = moe_model_set_expert_precision(w->m, l, e, w->p->base);
    if (st || (st = st2)) return st;
    score_rows(w, seq, w->z, NULL, w->n, li * w->E + e);
    return MOE_OK;
}

/* sweep_seq: baseline pass of one sequence, then every expert. */
static enum moe_status sweep_seq(struct sweep *w, const int32_t *seq) {
    double t0 = moe_now_s();
    const int proxy_only = w->p->metric == MOE_SENS_PROXY;
    moe_session_reset(w->sess);
    w->cap.on = 1;
    enum moe_status st = moe_session_forward(w->sess, seq, w->n, proxy_only ? NULL : w->zb, 1);
    w->cap.on = 0;
    if (st) return st;
    if (!proxy_only) {
        base_rows(w->zb, w->n, w->V, w->lse, w->pb);
        for (int i = 0; i + 1 < w->n; i++) w->st->base_nll += w->lse[i] - w->zb[(size_t)i * w->V + seq[i + 1]];
    }
    w->st->n_kl += w->n;
    w->st->n_nll += w->n - 1;
    w->st->base_seconds += moe_now_s() - t0;
    const int every = w->p->shard_count > 1 ? w->p->shard_count : 1;
    for (int li = 0; li < w->n_moe; li++)
        for (int e = 0; e < w->E; e++) {
            if ((li * w->E + e) % every != (every > 1 ? w->p->shard_index : 0)) continue; /* another shard's */
            st = w->p->method == MOE_SENS_NAIVE ? expert_naive(w, seq, w->layer_of[li], li, e)
                                                : expert_cached(w, seq, w->layer_of[li], li, e);
            if (st) return st;
        }
    return MOE_OK;
}

static void sweep_free(struct sweep *w) {
    moe_session_free(w->sess);
    free(w->moe_of);
    free(w->layer_of);
    free(w->ffn_low);
    free(w->ffn_base);
    free(w->zb);
    free(w->pb);
    free(w->lse);
    free(w->z);
    free(w->xp);
    free(w->xe);
    free(w->yl);
    free(w->yb);
    free(w->idx);
    free(w->g);
    free(w->cap.x);
    free(w->cap.gin);
    free(w->cap.sel);
    free(w->cap.selw);
}

/* bind_all: every routed expert at precision p. */
static enum moe_status bind_all(struct moe_model *m, const int *layer_of, int n_moe, int p) {
    enum moe_status st;
    for (int li = 0; li < n_moe; li++)
        for (int e = 0; e < m->cfg.n_expert; e++)
            if ((st = moe_model_set_expert_precision(m, layer_of[li], e, p))) return st;
    return MOE_OK;
}

/* sweep_init: buffers, the low and base bindings of every expert, a session. */
static enum moe_status sweep_init(struct sweep *w, struct moe_model *m, const struct moe_sens_params *p,
                                  struct moe_sens_state *s) {
    const struct moe_config *c = &m->cfg;
    memset(w, 0, sizeof *w);
    w->m = m;
    w->p = p;
    w->st = s;
    w->L = c->n_layer;
    w->E = c->n_expert;
    w->K = c->n_expert_used;
    w->H = c->n_embd;
    w->V = c->n_vocab;
    w->n = s->n_ctx;
    w->n_moe = s->n_moe;
    const size_t n = (size_t)w->n, H = (size_t)w->H, V = (size_t)w->V, LE = (size_t)w->n_moe * (size_t)w->E;
    w->moe_of = malloc(sizeof(int) * (size_t)w->L);
    w->layer_of = malloc(sizeof(int) * (size_t)(w->n_moe + 1));
    w->ffn_low = malloc(sizeof *w->ffn_low * (LE + 1));
    w->ffn_base = malloc(sizeof *w->ffn_base * (LE + 1));
    const int logits = p->metric != MOE_SENS_PROXY;
    w->zb = logits ? malloc(sizeof(float) * n * V) : NULL;
    w->pb = logits ? malloc(sizeof(float) * n * V) : NULL;
    w->lse = logits ? malloc(sizeof(double) * n) : NULL;
    w->z = logits ? malloc(sizeof(float) * n * V) : NULL;
    w->xp = malloc(sizeof(float) * n * H);
    w->xe = malloc(sizeof(float) * n * H);
    w->yl = malloc(sizeof(float) * n * H);
    w->yb = malloc(sizeof(float) * n * H);
    w->idx = malloc(sizeof(int32_t) * n);
    w->g = malloc(sizeof(float) * n);
    w->cap.x = logits ? malloc(sizeof(float) * (size_t)(w->L + 1) * n * H) : NULL;
    w->cap.gin = malloc(sizeof(float) * (size_t)w->n_moe * n * H);
    w->cap.sel = malloc(sizeof(int32_t) * (size_t)w->n_moe * n * (size_t)w->K);
    w->cap.selw = malloc(sizeof(float) * (size_t)w->n_moe * n * (size_t)w->K);
    if (!w->moe_of || !w->layer_of || !w->ffn_low || !w->ffn_base || (logits && (!w->zb || !w->pb || !w->lse || !w->z || !w->cap.x)) ||
        !w->xp || !w->xe || !w->yl || !w->yb || !w->idx || !w->g || !w->cap.gin || !w->cap.sel || !w->cap.selw) {
        MOE_LOGE("sensitivity: cannot allocate the buffers of a sequence of %d tokens", w->n);
        return MOE_ERR_NOMEM;
    }
    for (int l = 0, li = 0; l < w->L; l++) {
        w->moe_of[l] = c->layer_moe[l] ? li : -1;
        if (c->layer_moe[l]) w->layer_of[li++] = l;
    }
    w->cap = (struct capture){0, w->L, w->n, w->H, w->K, w->moe_of, w->cap.x, w->cap.gin, w->cap.sel, w->cap.selw};
    enum moe_status st;
    if ((st = bind_all(m, w->layer_of, w->n_moe, p->low))) return st;
    for (int li = 0; li < w->n_moe; li++)
        for (int e = 0; e < w->E; e++)
            if ((st = moe_model_expert(m, w->layer_of[li], e, -1, &w->ffn_low[li * w->E + e]))) return st;
    if ((st = bind_all(m, w->layer_of, w->n_moe, p->base))) return st;
    for (int li = 0; li < w->n_moe; li++)
        for (int e = 0; e < w->E; e++)
            if ((st = moe_model_expert(m, w->layer_of[li], e, -1, &w->ffn_base[li * w->E + e]))) return st;
    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = w->n;
    sp.n_batch = w->n;
    sp.n_threads = p->n_threads;
    sp.device = p->device;
    sp.device_options = p->device_options;
    sp.on_layer = logits ? on_layer : NULL;
    sp.layer_user = &w->cap;
    sp.on_route = on_route;
    sp.route_user = &w->cap;
    return moe_session_create(m, &sp, &w->sess);
}

enum moe_status moe_sens_run(struct moe_model *m, const int32_t *tokens, const struct moe_sens_params *p,
                             struct moe_sens_state *s, int seq_end, const volatile int *stop) {
    if (!m->bundle || p->low < 0 || p->base < 0 || p->low >= m->n_expert_prec || p->base >= m->n_expert_prec ||
        s->n_expert != m->cfg.n_expert || s->n_moe != n_moe_layers(&m->cfg) || s->n_moe == 0 || s->n_ctx < 2 ||
        seq_end > s->n_seq || p->shard_count < 0 || p->shard_index < 0 ||
        p->shard_index >= (p->shard_count > 1 ? p->shard_count : 1)) {
        MOE_LOGE("sensitivity: needs a bundle with MoE layers, low and base precisions among its %d, sequences of at "
                 "least 2 tokens, a shard index below the count and a sweep state of this model", m->n_expert_prec);
        return MOE_ERR_INVALID;
    }
    struct sweep w;
    double t0 = moe_now_s();
    enum moe_status st = sweep_init(&w, m, p, s);
    for (int q = s->next_seq; !st && q < seq_end && !(stop && *stop); q++) {
        double tq = moe_now_s();
        st = sweep_seq(&w, tokens + (size_t)q * (size_t)s->n_ctx);
        if (st) break;
        s->next_seq = q + 1;
        s->seconds += moe_now_s() - tq;
        if (p->on_seq) p->on_seq(s->next_seq, s->n_seq, moe_now_s() - t0, p->user);
    }
    if (w.layer_of) {
        enum moe_status st2 = bind_all(m, w.layer_of, w.n_moe, p->base);
        if (!st) st = st2;
    }
    sweep_free(&w);
    return st;
}

void moe_sens_scores(const struct moe_sens_state *s, enum moe_sens_metric metric, double *out) {
    const int n = s->n_moe * s->n_expert;
    for (int i = 0; i < n; i++) {
        double v = metric == MOE_SENS_KL ? s->kl[i] : metric == MOE_SENS_PPL ? s->dnll[i] : s->proxy[i];
        int64_t d = metric == MOE_SENS_PPL ? s->n_nll : s->n_kl;
        out[i] = d > 0 ? v / (double)d : 0;
    }
}

static const double *g_sort_key;
static int cmp_asc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    double x = g_sort_key[i], y = g_sort_key[j];
    if (x < y) return -1;
    if (x > y) return 1;
    return (i > j) - (i < j);
}

void moe_sens_order(const double *score, int n, int32_t *order) {
    for (int i = 0; i < n; i++) order[i] = i;
    g_sort_key = score;
    qsort(order, (size_t)n, sizeof *order, cmp_asc);
    g_sort_key = NULL;
}

/* ranks: average 1-based ranks of v (ties share their mean rank). */
static int ranks(const double *v, int n, double *r) {
    int32_t *o = malloc(sizeof *o * (size_t)n);
    if (!o) return 0;
    moe_sens_order(v, n, o);
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && v[o[j + 1]] == v[o[i]]) j++;
        for (int k = i; k <= j; k++) r[o[k]] = 0.5 * (i + j) + 1;
        i = j + 1;
    }
    free(o);
    return 1;
}

double moe_spearman(const double *a, const double *b, int n) {
    if (n < 2) return NAN;
    double *ra = malloc(sizeof *ra * (size_t)n), *rb = malloc(sizeof *rb * (size_t)n);
    double out = NAN;
    if (ra && rb && ranks(a, n, ra) && ranks(b, n, rb)) {
        double ma = 0, mb = 0;
        for (int i = 0; i < n; i++) {
            ma += ra[i];
            mb += rb[i];
        }
        ma /= n;
        mb /= n;
        double sab = 0, saa = 0, sbb = 0;
        for (int i = 0; i < n; i++) {
            sab += (ra[i] - ma) * (rb[i] - mb);
            saa += (ra[i] - ma) * (ra[i] - ma);
            sbb += (rb[i] - mb) * (rb[i] - mb);
        }
        if (saa > 0 && sbb > 0) out = sab / sqrt(saa * sbb);
    }
    free(ra);
    free(rb);
    return out;
}

void moe_sens_default_pair(const struct moe_model *m, int *low, int *base) {
    int np = m->n_expert_prec, l0 = 0;
    while (l0 < m->cfg.n_layer && !m->cfg.layer_moe[l0]) l0++;
    uint64_t sz[64];
    for (int p = 0; p < np && p < 64; p++) {
        struct moe_bundle_blob b;
        sz[p] = moe_bundle_expert(m->bundle, (uint32_t)l0, 0, (uint32_t)p, &b) ? 0 : b.raw_size;
    }
    int lo = 0;
    for (int p = 1; p < np && p < 64; p++)
        if (sz[p] < sz[lo]) lo = p;
    int bs = -1;
    for (int p = 0; p < np && p < 64; p++)
        if (p != lo && sz[p] >= sz[lo] && (bs < 0 || sz[p] < sz[bs])) bs = p;
    *low = lo;
    *base = bs;
}

static const char *const k_metric_names[] = {"kl", "ppl", "proxy"};

const char *moe_sens_metric_name(enum moe_sens_metric metric) {
    return metric >= MOE_SENS_KL && metric <= MOE_SENS_PROXY ? k_metric_names[metric] : "?";
}

const char *moe_sens_method_name(enum moe_sens_method method) {
    return method == MOE_SENS_NAIVE ? "naive" : "cached";
}

/* ---- the sensitivity file (sensitivity-impl.h) ------------------------ */

/* state_put: the sums and progress of s as derived arrays of profile p. */
static enum moe_status state_put(struct moe_profile *p, const struct moe_sens_state *s, const double *cfg,
                                 int shard_index, int shard_count) {
    const int64_t le[2] = {s->n_moe, s->n_expert}, one = SENS_CFG_N, four = 4, three = 3, two = 2;
    const int64_t prog[4] = {s->next_seq, s->n_seq, s->n_kl, s->n_nll}, shard[2] = {shard_index, shard_count};
    const double times[3] = {s->seconds, s->base_seconds, s->base_nll};
    enum moe_status st;
    if ((st = moe_profile_put_f64(p, "config.sensitivity", 1, &one, cfg)) ||
        (st = moe_profile_put_i64(p, "sensitivity.progress", 1, &four, prog)) ||
        (st = moe_profile_put_f64(p, "sensitivity.times", 1, &three, times)) ||
        (st = moe_profile_put_f64(p, "sensitivity.sum_kl", 2, le, s->kl)) ||
        (st = moe_profile_put_f64(p, "sensitivity.sum_dnll", 2, le, s->dnll)) ||
        (st = moe_profile_put_f64(p, "sensitivity.sum_proxy", 2, le, s->proxy)) ||
        (st = moe_profile_put_i64(p, "sensitivity.routed", 2, le, s->routed)) ||
        (shard_count > 1 && (st = moe_profile_put_i64(p, "sensitivity.shard", 1, &two, shard))))
        return st;
    return MOE_OK;
}

/* get_f64n: a derived f64 array of exactly n elements, or NULL (logged). */
static const double *get_f64n(const struct moe_profile *p, const char *path, const char *name, int64_t n) {
    int nd;
    int64_t d[MOE_PROFILE_MAX_DIMS];
    const double *v;
    if (moe_profile_get_f64(p, name, &nd, d, &v)) goto bad;
    int64_t cnt = 1;
    for (int i = 0; i < nd; i++) cnt *= d[i];
    if (cnt != n) goto bad;
    return v;
bad:
    MOE_LOGE("%s: %s is missing or not %lld float64 values", path, name, (long long)n);
    return NULL;
}

/* get_shard: sensitivity.shard of p, {0, 1} when absent; 0 when malformed (logged). */
static int get_shard(const struct moe_profile *p, const char *path, int *shard) {
    int nd;
    int64_t d[MOE_PROFILE_MAX_DIMS];
    const int64_t *v;
    shard[0] = 0, shard[1] = 1;
    if (moe_profile_get_i64(p, "sensitivity.shard", &nd, d, &v)) return 1;
    if (nd != 1 || d[0] != 2 || v[1] < 2 || v[1] > 1000000 || v[0] < 0 || v[0] >= v[1]) {
        MOE_LOGE("%s: sensitivity.shard is not {index, count} with 0 <= index < count", path);
        return 0;
    }
    shard[0] = (int)v[0], shard[1] = (int)v[1];
    return 1;
}

enum moe_status sens_state_get(const struct moe_profile *p, const char *path, struct moe_sens_state *s,
                               double *cfg_out, int *shard) {
    const int64_t le = (int64_t)s->n_moe * s->n_expert;
    const double *c = get_f64n(p, path, "config.sensitivity", SENS_CFG_N);
    if (!c || !get_shard(p, path, shard)) return MOE_ERR_FORMAT;
    memcpy(cfg_out, c, sizeof(double) * SENS_CFG_N);
    int nd;
    int64_t d[MOE_PROFILE_MAX_DIMS];
    const int64_t *prog, *routed;
    const double *t = get_f64n(p, path, "sensitivity.times", 3);
    const double *kl = get_f64n(p, path, "sensitivity.sum_kl", le);
    const double *dn = get_f64n(p, path, "sensitivity.sum_dnll", le);
    const double *px = get_f64n(p, path, "sensitivity.sum_proxy", le);
    if (!t || !kl || !dn || !px) return MOE_ERR_FORMAT;
    if (moe_profile_get_i64(p, "sensitivity.progress", &nd, d, &prog) || nd != 1 || d[0] != 4 ||
        moe_profile_get_i64(p, "sensitivity.routed", &nd, d, &routed) || nd != 2 || d[0] * d[1] != le ||
        prog[0] < 0 || prog[0] > s->n_seq || prog[1] != s->n_seq || prog[2] < 0 || prog[3] < 0) {
        MOE_LOGE("%s: progress or routing counts are missing or out of range", path);
        return MOE_ERR_FORMAT;
    }
    s->next_seq = (int)prog[0];
    s->n_kl = prog[2];
    s->n_nll = prog[3];
    s->seconds = t[0];
    s->base_seconds = t[1];
    s->base_nll = t[2];
    memcpy(s->kl, kl, sizeof(double) * (size_t)le);
    memcpy(s->dnll, dn, sizeof(double) * (size_t)le);
    memcpy(s->proxy, px, sizeof(double) * (size_t)le);
    memcpy(s->routed, routed, sizeof(int64_t) * (size_t)le);
    return MOE_OK;
}

/* new_profile: an empty profile (no trace) with the file's shape and names. */
static enum moe_status new_profile(const struct sens_meta *meta, struct moe_profile **out) {
    struct moe_profile *p = NULL;
    enum moe_status st = moe_profile_new(meta->n_moe, meta->n_expert, meta->top_k, 0, MOE_PROFILE_LOGITS_NONE, &p);
    if (st) return st;
    memcpy(p->moe_layer_index, meta->moe_layer, sizeof(int32_t) * (size_t)meta->n_moe);
    if ((st = moe_profile_set_meta(p, meta->arch, meta->model ? meta->model : "",
                                   meta->dataset ? meta->dataset : "", meta->version))) {
        moe_profile_free(p);
        return st;
    }
    *out = p;
    return MOE_OK;
}

/* put_results: the finished sweep's scores, ranking, agreement and cost. */
static enum moe_status put_results(struct moe_profile *p, const struct sens_meta *meta,
                                   const struct moe_sens_state *s, const char *path, double *rho_out) {
    const int n = s->n_moe * s->n_expert;
    const int64_t le[2] = {s->n_moe, s->n_expert}, nn = n, one = 1, four = 4;
    double *kl = malloc(sizeof(double) * (size_t)n * 4);
    int32_t *order = malloc(sizeof(int32_t) * (size_t)n);
    enum moe_status st = MOE_OK;
    if (!kl || !order) {
        st = MOE_ERR_NOMEM;
        goto done;
    }
    double *dn = kl + n, *px = kl + 2 * n, *score = kl + 3 * n;
    moe_sens_scores(s, MOE_SENS_KL, kl);
    moe_sens_scores(s, MOE_SENS_PPL, dn);
    moe_sens_scores(s, MOE_SENS_PROXY, px);
    moe_sens_scores(s, meta->metric, score);
    for (int i = 0; i < 4 * n; i++)
        if (!isfinite(kl[i])) { /* NaN logits (damaged weights) must not become a ranking */
            MOE_LOGE("%s: expert %d of MoE layer %d has a non-finite %s; the model produces NaN or infinite "
                     "outputs (damaged weights?)", path, i % n % s->n_expert, i % n / s->n_expert,
                     i < n ? "KL" : i < 2 * n ? "NLL increase" : i < 3 * n ? "proxy" : "score");
            st = MOE_ERR_RANGE;
            goto done;
        }
    moe_sens_order(score, n, order);
    double rho = meta->metric == MOE_SENS_PROXY ? NAN : moe_spearman(px, score, n);
    if (rho_out) *rho_out = rho;
    const double cost[4] = {s->seconds, s->base_seconds, s->base_seconds > 0 ? s->seconds / s->base_seconds : NAN,
                            (double)n + 1};
    (void)((st = moe_profile_put_f64(p, "sensitivity.kl", 2, le, kl)) ||
           (st = moe_profile_put_f64(p, "sensitivity.dnll", 2, le, dn)) ||
           (st = moe_profile_put_f64(p, "sensitivity.proxy", 2, le, px)) ||
           (st = moe_profile_put_f64(p, "sensitivity.score", 2, le, score)) ||
           (st = moe_profile_put_i32(p, "sensitivity.order", 1, &nn, order)) ||
           (st = moe_profile_put_f64(p, "sensitivity.spearman_proxy", 1, &one, &rho)) ||
           (st = moe_profile_put_f64(p, "sensitivity.cost", 1, &four, cost)));
done:
    free(kl);
    free(order);
    return st;
}

enum moe_status sens_save(const struct sens_meta *meta, const struct moe_sens_state *s, const double *cfg,
                          int shard_index, int shard_count, const char *path, int final, double *rho) {
    struct moe_profile *p = NULL;
    enum moe_status st = new_profile(meta, &p);
    if (!st && !(st = state_put(p, s, cfg, shard_index, shard_count)) && final)
        st = put_results(p, meta, s, path, rho);
    if (!st) st = moe_profile_write(p, path);
    moe_profile_free(p);
    return st;
}

int sens_result_names(struct moe_sensitivity_result *r, const char *version, const double *cfg) {
    char metric[16];
    if (!version || sscanf(version, "moe-prep sensitivity (%15s low %31s base %31[^)])", metric, r->low, r->base) != 3)
        return 0;
    r->metric = (enum moe_sens_metric)(int)cfg[SENS_CFG_METRIC];
    r->method = (enum moe_sens_method)(int)cfg[SENS_CFG_METHOD];
    return strcmp(metric, moe_sens_metric_name(r->metric)) == 0 && (r->method == MOE_SENS_CACHED ||
                                                                    r->method == MOE_SENS_NAIVE);
}

/* ---- the stage (moe_sensitivity_run) ---------------------------------- */

struct moe_sensitivity_params moe_sensitivity_default_params(void) {
    struct moe_sensitivity_params p = {0};
    p.sweep = moe_sens_default_params();
    p.checkpoint_every = 30;
    return p;
}

void moe_sensitivity_result_clear(struct moe_sensitivity_result *r) {
    moe_sens_state_clear(&r->state);
    free(r->moe_layer);
    free(r->model);
    free(r->dataset);
    memset(r, 0, sizeof *r);
}

/* What one moe_sensitivity_run holds. */
struct stage {
    const struct moe_sensitivity_params *p;
    struct moe_sens_params sp;  /* p->sweep with the progress hook */
    struct sens_meta meta;
    double cfg[SENS_CFG_N];
    char version[128];
    char *checkpoint;
    volatile int halt;          /* stop moe_sens_run: a save is due or cancel is set */
    double last_save, t0;
};

/* stage_on_seq: forwards progress and asks for a save when one is due. */
static void stage_on_seq(int done, int total, double seconds, void *user) {
    struct stage *g = user;
    (void)seconds;
    if (g->p->progress) g->p->progress(done, total, moe_now_s() - g->t0, g->p->user);
    if (moe_now_s() - g->last_save >= g->p->checkpoint_every || (g->p->cancel && *g->p->cancel)) g->halt = 1;
}

/* stage_init: names, settings, the checkpoint path and the result's fields. */
static enum moe_status stage_init(struct stage *g, struct moe_model *m, int n_seq, int n_ctx,
                                  const struct moe_sensitivity_params *p, struct moe_sensitivity_result *r) {
    const struct moe_sens_params *w = &p->sweep;
    if (!m->bundle || !p->out || w->low < 0 || w->base < 0 || w->low >= m->n_expert_prec ||
        w->base >= m->n_expert_prec || n_seq < 1) {
        MOE_LOGE("sensitivity: needs a bundle, stored low and base precisions, an output path and a sequence");
        return MOE_ERR_INVALID;
    }
    enum moe_status st = moe_sens_state_init(&r->state, m, n_seq, n_ctx);
    if (st) return st;
    const struct moe_config *c = &m->cfg;
    if (!(r->moe_layer = malloc(sizeof(int32_t) * (size_t)(r->state.n_moe + 1)))) return MOE_ERR_NOMEM;
    for (int l = 0, li = 0; l < c->n_layer; l++)
        if (c->layer_moe[l]) r->moe_layer[li++] = l;
    snprintf(r->low, sizeof r->low, "%s", moe_bundle_precision_at(m->bundle, (uint32_t)w->low)->name);
    snprintf(r->base, sizeof r->base, "%s", moe_bundle_precision_at(m->bundle, (uint32_t)w->base)->name);
    r->metric = w->metric;
    r->method = w->method;
    r->shard_index = w->shard_count > 1 ? w->shard_index : 0;
    r->shard_count = w->shard_count > 1 ? w->shard_count : 1;
    r->model = strdup(p->model_name ? p->model_name : "");
    r->dataset = strdup(p->dataset_name ? p->dataset_name : "");
    struct moe_buf b = {0};
    if (p->checkpoint) moe_buf_printf(&b, "%s", p->checkpoint);
    else moe_buf_printf(&b, "%s.partial", p->out);
    if (!r->model || !r->dataset || !(g->checkpoint = moe_buf_take(&b))) return MOE_ERR_NOMEM;
    snprintf(g->version, sizeof g->version, "moe-prep sensitivity (%s low %s base %s)", k_metric_names[w->metric],
             r->low, r->base);
    g->meta = (struct sens_meta){r->state.n_moe, r->state.n_expert, c->n_expert_used, r->moe_layer,
                                 moe_arch_name(c->arch), r->model, r->dataset, g->version, w->metric};
    const double cfg[SENS_CFG_N] = {n_ctx, w->low, w->base, w->metric, w->method, n_seq, (double)p->stream_tokens};
    memcpy(g->cfg, cfg, sizeof cfg);
    g->p = p;
    g->sp = *w;
    g->sp.on_seq = stage_on_seq;
    g->sp.user = g;
    return MOE_OK;
}

/* stage_resume: the checkpoint's sums into r->state (settings and shard must match). */
static enum moe_status stage_resume(struct stage *g, struct moe_sensitivity_result *r) {
    struct moe_profile *pp = NULL;
    double cfg[SENS_CFG_N];
    int shard[2];
    enum moe_status st = moe_profile_read(g->checkpoint, &pp);
    if (!st) st = sens_state_get(pp, g->checkpoint, &r->state, cfg, shard);
    moe_profile_free(pp);
    if (st) {
        MOE_LOGE("sensitivity: cannot resume from %s", g->checkpoint);
        return st;
    }
    if (memcmp(cfg, g->cfg, sizeof cfg) || shard[0] != r->shard_index || shard[1] != r->shard_count) {
        MOE_LOGE("%s was saved with other settings (context, precisions, metric, method, dataset or shard); run "
                 "without --resume to start over", g->checkpoint);
        return MOE_ERR_INVALID;
    }
    r->resumed_at = r->state.next_seq;
    return MOE_OK;
}

/* stage_loop: sweep until done, stop_after or cancel, saving progress. */
static enum moe_status stage_loop(struct stage *g, struct moe_model *m, const int32_t *tokens,
                                  struct moe_sensitivity_result *r) {
    struct moe_sens_state *s = &r->state;
    const int n_seq = s->n_seq, stop_after = g->p->stop_after;
    const int limit = stop_after > 0 && s->next_seq + stop_after < n_seq ? s->next_seq + stop_after : n_seq;
    enum moe_status st;
    g->last_save = g->t0 = moe_now_s();
    if (g->p->progress) g->p->progress(s->next_seq, n_seq, 0, g->p->user);
    while (s->next_seq < limit) {
        g->halt = g->p->cancel && *g->p->cancel;
        if ((st = moe_sens_run(m, tokens, &g->sp, s, limit, &g->halt))) {
            MOE_LOGE("sensitivity: the sweep failed at sequence %d", s->next_seq);
            return st;
        }
        if (s->next_seq < n_seq) {
            if ((st = sens_save(&g->meta, s, g->cfg, r->shard_index, r->shard_count, g->checkpoint, 0, NULL))) {
                MOE_LOGE("sensitivity: cannot save progress to %s", g->checkpoint);
                return st;
            }
            g->last_save = moe_now_s();
        }
        if (g->p->cancel && *g->p->cancel) break;
    }
    return MOE_OK;
}

enum moe_status moe_sensitivity_run(struct moe_model *m, const int32_t *tokens, int n_seq, int n_ctx,
                                    const struct moe_sensitivity_params *p, struct moe_sensitivity_result *r) {
    memset(r, 0, sizeof *r);
    r->resumed_at = -1;
    r->spearman = NAN;
    struct stage g;
    memset(&g, 0, sizeof g);
    enum moe_status st = stage_init(&g, m, n_seq, n_ctx, p, r);
    if (!st && p->resume && access(g.checkpoint, F_OK) == 0) st = stage_resume(&g, r);
    if (!st) st = stage_loop(&g, m, tokens, r);
    if (st || r->state.next_seq < n_seq) goto done;
    const int final = r->shard_count <= 1; /* a shard's file holds sums only: merge makes the results */
    if ((st = sens_save(&g.meta, &r->state, g.cfg, r->shard_index, r->shard_count, p->out, final, &r->spearman))) {
        MOE_LOGE("sensitivity: cannot write %s", p->out);
        goto done;
    }
    remove(g.checkpoint);
    r->complete = 1;
done:
    free(g.checkpoint);
    return st;
}

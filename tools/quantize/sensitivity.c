/*
 * sensitivity.c - EdgeMoE's per-expert sensitivity sweep (see sensitivity.h)
 * and the `moe-prep sensitivity` command.
 */
#include "sensitivity.h"

#include "moe-file.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "token-stream.h"
#include "moe-bundle.h"
#include "moe-dataset.h"
#include "moe-prep.h"
#include "moe-session.h"
#include "profile-h5.h"
#include "tool-util.h"

struct moe_sens_params moe_sens_default_params(void) {
    struct moe_sens_params p = {0};
    p.low = -1;
    p.base = -1;
    return p;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- state ------------------------------------------------------------ */

static int n_moe_layers(const struct moe_config *c) {
    int n = 0;
    for (int l = 0; l < c->n_layer; l++) n += c->layer_moe[l] != 0;
    return n;
}

enum moe_status moe_sens_state_init(struct moe_sens_state *s, const struct moe_model *m, int n_seq, int n_ctx) {
    memset(s, 0, sizeof *s);
    s->n_moe = n_moe_layers(&m->cfg);
    s->n_expert = m->cfg.n_expert;
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
    double t0 = now_s();
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
    w->st->base_seconds += now_s() - t0;
    for (int li = 0; li < w->n_moe; li++)
        for (int e = 0; e < w->E; e++) {
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
        seq_end > s->n_seq) {
        MOE_LOGE("sensitivity: needs a bundle with MoE layers, low and base precisions among its %d, sequences of at "
                 "least 2 tokens and a sweep state of this model", m->n_expert_prec);
        return MOE_ERR_INVALID;
    }
    struct sweep w;
    double t0 = now_s();
    enum moe_status st = sweep_init(&w, m, p, s);
    for (int q = s->next_seq; !st && q < seq_end && !(stop && *stop); q++) {
        double tq = now_s();
        st = sweep_seq(&w, tokens + (size_t)q * (size_t)s->n_ctx);
        if (st) break;
        s->next_seq = q + 1;
        s->seconds += now_s() - tq;
        if (p->on_seq) p->on_seq(s->next_seq, s->n_seq, now_s() - t0, p->user);
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

/* ---- the command ------------------------------------------------------ */

static const char *const k_metric_names[] = {"kl", "ppl", "proxy"};

struct sens_args {
    const char *model, *dataset, *out, *csv, *low, *base;
    int n_ctx, n_threads, resume, json, stop_after;
    long long max_tokens;
    double checkpoint_every;
    enum moe_sens_metric metric;
    enum moe_sens_method method;
};

static void sens_usage(FILE *f) {
    fprintf(f,
            "usage: moe-prep sensitivity MODEL.moeb --dataset SPEC -o SENS.h5 [options]\n"
            "\n"
            "EdgeMoE's sweep: for every routed expert, the loss increase when that expert\n"
            "alone uses the --low precision and every other expert the --base precision,\n"
            "against the all-base model. Only what a change touches is recomputed (the\n"
            "expert's tokens in its layer, then the layers above it); the cost is printed in\n"
            "baseline-pass equivalents next to a naive sweep's. The result (L x E matrix and\n"
            "ranking) is a profile-format HDF5 file: `moe-prep profile report` draws its heat\n"
            "maps and `moe-prep bitwidth` searches with its ranking.\n"
            "\n"
            "options:\n"
            "  --dataset SPEC          calibration text (a file or dataset card; see docs/cli.md)\n"
            "  -o, --out FILE          output (.h5); progress is kept in FILE.partial\n"
            "  --low NAME              the low precision (default: the smallest stored)\n"
            "  --base NAME             the base precision (default: the next larger stored)\n"
            "  --metric kl|ppl|proxy   what ranks the experts (default kl): mean KL divergence of\n"
            "                          the next-token distributions, mean NLL increase (perplexity),\n"
            "                          or the gate-weighted output error of the expert on its own\n"
            "                          tokens (no recomputation; cheapest). kl and ppl also give\n"
            "                          the proxy and its Spearman rank agreement with them.\n"
            "  --ctx N                 tokens per sequence (default 256)\n"
            "  --max-tokens N          use at most N tokens of the text (whole sequences)\n"
            "  --csv FILE              also write one row per expert\n"
            "  --json                  machine-readable summary on stdout\n"
            "  --resume                continue from FILE.partial (same settings) after an interruption\n"
            "  --checkpoint-every S    save progress at most every S seconds (default 30)\n"
            "  --stop-after N          save and stop after N sequences in this run (exit 3; --resume goes on)\n"
            "  --method cached|naive   naive = one full forward pass per expert (for comparison)\n"
            "  -t, --threads N         CPU threads (default: all)\n"
            "\n"
            "Interrupting (Ctrl-C) saves progress after the current sequence; --resume then\n"
            "gives the same result as an uninterrupted run.\n"
            "\n"
            "example:\n"
            "  moe-prep sensitivity tiny.moeb --dataset wiki.txt --low q2_k --base q4_k -o sens.h5 --csv sens.csv\n");
}

static int sens_parse(int argc, char **argv, struct sens_args *a) {
    memset(a, 0, sizeof *a);
    a->n_ctx = 256;
    a->checkpoint_every = 30;
    const char *cmd = "sensitivity";
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            sens_usage(stdout);
            return 1;
        }
        int takes = strcmp(o, "--resume") && strcmp(o, "--json");
        if (o[0] == '-' && takes && !v) {
            fprintf(stderr, "moe-prep sensitivity: %s needs a value\n", o);
            return 2;
        }
        if (!strcmp(o, "--dataset")) a->dataset = v;
        else if (!strcmp(o, "-o") || !strcmp(o, "--out")) a->out = v;
        else if (!strcmp(o, "--csv")) a->csv = v;
        else if (!strcmp(o, "--low")) a->low = v;
        else if (!strcmp(o, "--base")) a->base = v;
        else if (!strcmp(o, "--resume")) a->resume = 1;
        else if (!strcmp(o, "--json")) a->json = 1;
        else if (!strcmp(o, "--metric")) {
            int k = -1;
            for (int j = 0; j < 3; j++)
                if (!strcmp(v, k_metric_names[j])) k = j;
            if (k < 0) {
                fprintf(stderr, "moe-prep sensitivity: --metric wants kl, ppl or proxy, not \"%s\"\n", v);
                return 2;
            }
            a->metric = (enum moe_sens_metric)k;
        } else if (!strcmp(o, "--method")) {
            if (!strcmp(v, "cached")) a->method = MOE_SENS_CACHED;
            else if (!strcmp(v, "naive")) a->method = MOE_SENS_NAIVE;
            else {
                fprintf(stderr, "moe-prep sensitivity: --method wants cached or naive, not \"%s\"\n", v);
                return 2;
            }
        } else if (!strcmp(o, "--ctx")) {
            if (!moe_tool_parse_ll(cmd, o, v, 4, 1 << 20, &n)) return 2;
            a->n_ctx = (int)n;
        } else if (!strcmp(o, "--max-tokens")) {
            if (!moe_tool_parse_ll(cmd, o, v, 1, (long long)1 << 40, &a->max_tokens)) return 2;
        } else if (!strcmp(o, "--stop-after")) {
            if (!moe_tool_parse_ll(cmd, o, v, 1, 1 << 30, &n)) return 2;
            a->stop_after = (int)n;
        } else if (!strcmp(o, "--checkpoint-every")) {
            if (!moe_tool_parse_double(cmd, o, v, 0, 1e9, &a->checkpoint_every)) return 2;
        } else if (!strcmp(o, "-t") || !strcmp(o, "--threads")) {
            if (!moe_tool_parse_ll(cmd, o, v, 0, 4096, &n)) return 2;
            a->n_threads = (int)n;
        } else if (o[0] == '-') {
            fprintf(stderr, "moe-prep sensitivity: unknown option %s (see --help)\n", o);
            return 2;
        } else if (!a->model) {
            a->model = o;
            continue;
        } else {
            fprintf(stderr, "moe-prep sensitivity: unexpected argument %s\n", o);
            return 2;
        }
        if (takes) i++;
    }
    if (!a->model || !a->dataset || !a->out) {
        fprintf(stderr, "moe-prep sensitivity: needs MODEL.moeb, --dataset and -o (see --help)\n");
        return 2;
    }
    return 0;
}

/* The sweep's settings, stored as config.sensitivity; a partial file resumes
 * only under equal settings. */
enum { CFG_CTX, CFG_LOW, CFG_BASE, CFG_METRIC, CFG_METHOD, CFG_NSEQ, CFG_STREAM, CFG_N };

static volatile sig_atomic_t g_signal;
static volatile int g_halt;
static void on_signal(int sig) {
    g_signal = sig;
    g_halt = 1;
}

struct progress {
    double last_save, every, t0;
    int seq0; /* sequences already done when this run began */
};

static void on_seq(int done, int total, double seconds, void *user) {
    struct progress *pr = user;
    (void)seconds;
    double t = now_s() - pr->t0;
    fprintf(stderr, "\rsensitivity: %d/%d sequences, %.0f s", done, total, t);
    if (done < total && done > pr->seq0) fprintf(stderr, ", about %.0f s left  ", t / (done - pr->seq0) * (total - done));
    fflush(stderr);
    if (now_s() - pr->last_save >= pr->every) g_halt = 1;
}

/* state_put: the sums and progress of s as derived arrays of profile p. */
static enum moe_status state_put(struct moe_profile *p, const struct moe_sens_state *s, const double *cfg) {
    const int64_t le[2] = {s->n_moe, s->n_expert}, one = CFG_N, four = 4, three = 3;
    const int64_t prog[4] = {s->next_seq, s->n_seq, s->n_kl, s->n_nll};
    const double times[3] = {s->seconds, s->base_seconds, s->base_nll};
    enum moe_status st;
    if ((st = moe_profile_put_f64(p, "config.sensitivity", 1, &one, cfg)) ||
        (st = moe_profile_put_i64(p, "sensitivity.progress", 1, &four, prog)) ||
        (st = moe_profile_put_f64(p, "sensitivity.times", 1, &three, times)) ||
        (st = moe_profile_put_f64(p, "sensitivity.sum_kl", 2, le, s->kl)) ||
        (st = moe_profile_put_f64(p, "sensitivity.sum_dnll", 2, le, s->dnll)) ||
        (st = moe_profile_put_f64(p, "sensitivity.sum_proxy", 2, le, s->proxy)) ||
        (st = moe_profile_put_i64(p, "sensitivity.routed", 2, le, s->routed)))
        return st;
    return MOE_OK;
}

/* get_shaped: a derived f64 array of exactly n elements, or NULL (logged). */
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

/* state_get: restore s (already initialised to this model and run) from a
 * partial file; settings must equal cfg. */
static enum moe_status state_get(const struct moe_profile *p, const char *path, struct moe_sens_state *s,
                                 const double *cfg) {
    const int64_t le = (int64_t)s->n_moe * s->n_expert;
    const double *c = get_f64n(p, path, "config.sensitivity", CFG_N);
    if (!c) return MOE_ERR_FORMAT;
    for (int i = 0; i < CFG_N; i++)
        if (c[i] != cfg[i]) {
            MOE_LOGE("%s was saved with other settings (context, precisions, metric, method or dataset); run without "
                     "--resume to start over", path);
            return MOE_ERR_INVALID;
        }
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

/* new_profile: an empty profile (no trace) with the model's shape and names. */
static enum moe_status new_profile(const struct moe_model *m, const struct sens_args *a, struct moe_profile **out) {
    const struct moe_config *c = &m->cfg;
    struct moe_profile *p = NULL;
    enum moe_status st = moe_profile_new(n_moe_layers(c), c->n_expert, c->n_expert_used, 0, MOE_PROFILE_LOGITS_NONE, &p);
    if (st) return st;
    for (int l = 0, li = 0; l < c->n_layer; l++)
        if (c->layer_moe[l]) p->moe_layer_index[li++] = l;
    char ver[96];
    snprintf(ver, sizeof ver, "moe-prep sensitivity (%s low %s base %s)", k_metric_names[a->metric], a->low, a->base);
    if ((st = moe_profile_set_meta(p, moe_arch_name(c->arch), a->model, a->dataset, ver))) {
        moe_profile_free(p);
        return st;
    }
    *out = p;
    return MOE_OK;
}

/* save: write the state (and, when final, the results) to path atomically. */
static enum moe_status save(const struct moe_model *m, const struct sens_args *a, const struct moe_sens_state *s,
                            const double *cfg, const char *path, int final, double *spearman_out) {
    struct moe_profile *p = NULL;
    enum moe_status st = new_profile(m, a, &p);
    if (st || (st = state_put(p, s, cfg))) goto done;
    if (final) {
        const int n = s->n_moe * s->n_expert;
        const int64_t le[2] = {s->n_moe, s->n_expert}, nn = n, one = 1, four = 4;
        double *kl = malloc(sizeof(double) * (size_t)n * 4);
        int32_t *order = malloc(sizeof(int32_t) * (size_t)n);
        if (!kl || !order) {
            free(kl);
            free(order);
            st = MOE_ERR_NOMEM;
            goto done;
        }
        double *dn = kl + n, *px = kl + 2 * n, *score = kl + 3 * n;
        moe_sens_scores(s, MOE_SENS_KL, kl);
        moe_sens_scores(s, MOE_SENS_PPL, dn);
        moe_sens_scores(s, MOE_SENS_PROXY, px);
        moe_sens_scores(s, a->metric, score);
        for (int i = 0; i < 4 * n; i++)
            if (!isfinite(kl[i])) { /* NaN logits (damaged weights) must not become a ranking */
                MOE_LOGE("%s: expert %d of MoE layer %d has a non-finite %s; the model produces NaN or infinite "
                         "outputs (damaged weights?)", path, i % n % s->n_expert, i % n / s->n_expert,
                         i < n ? "KL" : i < 2 * n ? "NLL increase" : i < 3 * n ? "proxy" : "score");
                free(kl);
                free(order);
                st = MOE_ERR_RANGE;
                goto done;
            }
        moe_sens_order(score, n, order);
        double rho = a->metric == MOE_SENS_PROXY ? NAN : moe_spearman(px, score, n);
        if (spearman_out) *spearman_out = rho;
        const double naive_eq = (double)n + 1;
        const double cost[4] = {s->seconds, s->base_seconds, s->base_seconds > 0 ? s->seconds / s->base_seconds : NAN,
                                naive_eq};
        (void)((st = moe_profile_put_f64(p, "sensitivity.kl", 2, le, kl)) ||
               (st = moe_profile_put_f64(p, "sensitivity.dnll", 2, le, dn)) ||
               (st = moe_profile_put_f64(p, "sensitivity.proxy", 2, le, px)) ||
               (st = moe_profile_put_f64(p, "sensitivity.score", 2, le, score)) ||
               (st = moe_profile_put_i32(p, "sensitivity.order", 1, &nn, order)) ||
               (st = moe_profile_put_f64(p, "sensitivity.spearman_proxy", 1, &one, &rho)) ||
               (st = moe_profile_put_f64(p, "sensitivity.cost", 1, &four, cost)));
        free(kl);
        free(order);
        if (st) goto done;
    }
    st = moe_profile_write(p, path);
done:
    moe_profile_free(p);
    return st;
}

static int write_csv(const struct moe_model *m, const struct moe_sens_state *s, enum moe_sens_metric metric,
                     const char *path) {
    const int n = s->n_moe * s->n_expert;
    double *v = malloc(sizeof(double) * (size_t)n * 4);
    int32_t *order = malloc(sizeof(int32_t) * (size_t)n), *rank = malloc(sizeof(int32_t) * (size_t)n);
    struct moe_tmp_file t = {NULL, NULL, -1, NULL}; /* exclusive, beside path: never through a planted link */
    FILE *f = v && order && rank && !moe_tmp_create(path, &t) ? moe_tmp_stream(&t) : NULL;
    int ok = 0;
    if (f) {
        moe_sens_scores(s, MOE_SENS_KL, v);
        moe_sens_scores(s, MOE_SENS_PPL, v + n);
        moe_sens_scores(s, MOE_SENS_PROXY, v + 2 * n);
        moe_sens_scores(s, metric, v + 3 * n);
        moe_sens_order(v + 3 * n, n, order);
        for (int i = 0; i < n; i++) rank[order[i]] = n - i; /* 1 = most sensitive */
        fprintf(f, "layer,moe_layer,expert,routed,kl,dnll,proxy,score,rank\n");
        for (int li = 0, l = 0; l < m->cfg.n_layer; l++) {
            if (!m->cfg.layer_moe[l]) continue;
            for (int e = 0; e < s->n_expert; e++) {
                int i = li * s->n_expert + e;
                fprintf(f, "%d,%d,%d,%lld,%.9g,%.9g,%.9g,%.9g,%d\n", l, li, e, (long long)s->routed[i], v[i],
                        v[n + i], v[2 * n + i], v[3 * n + i], rank[i]);
            }
            li++;
        }
        ok = moe_tmp_commit(&t) == MOE_OK; /* flush, fsync, rename; removed on failure */
    }
    moe_tmp_discard(&t);
    if (!ok) fprintf(stderr, "moe-prep sensitivity: cannot write %s (see the message above)\n", path);
    free(v);
    free(order);
    free(rank);
    return ok;
}

/* print_summary: the matrix (MoE layers x experts) and the ranking ends. */
static void print_summary(const struct moe_model *m, const struct sens_args *a, const struct moe_sens_state *s,
                          double rho, double seconds) {
    const int n = s->n_moe * s->n_expert;
    double *score = malloc(sizeof(double) * (size_t)n);
    int32_t *order = malloc(sizeof(int32_t) * (size_t)n);
    if (!score || !order) goto done;
    moe_sens_scores(s, a->metric, score);
    moe_sens_order(score, n, order);
    const double eq = s->base_seconds > 0 ? s->seconds / s->base_seconds : NAN;
    if (a->json) {
        double *kl = malloc(sizeof(double) * (size_t)n * 3);
        if (!kl) goto done;
        moe_sens_scores(s, MOE_SENS_KL, kl);
        moe_sens_scores(s, MOE_SENS_PPL, kl + n);
        moe_sens_scores(s, MOE_SENS_PROXY, kl + 2 * n);
        printf("{\"model\": ");
        moe_tool_json_string(stdout, a->model);
        printf(", \"dataset\": ");
        moe_tool_json_string(stdout, a->dataset);
        printf(", \"out\": ");
        moe_tool_json_string(stdout, a->out);
        printf(", \"low\": \"%s\", \"base\": \"%s\", \"metric\": \"%s\", \"method\": \"%s\", \"ctx\": %d, "
               "\"sequences\": %d, \"positions\": %lld, \"seconds\": %.3f, \"baseline_seconds\": %.3f, "
               "\"forward_equivalents\": %.3f, \"naive_forward_equivalents\": %d, \"base_nll\": %.6f, "
               "\"spearman_proxy\": ",
               a->low, a->base, k_metric_names[a->metric], a->method == MOE_SENS_NAIVE ? "naive" : "cached", s->n_ctx,
               s->n_seq, (long long)s->n_kl, s->seconds, s->base_seconds, isfinite(eq) ? eq : -1, n + 1,
               s->n_nll ? s->base_nll / (double)s->n_nll : 0.0);
        if (isfinite(rho)) printf("%.6f", rho); else printf("null");
        printf(", \"experts\": [");
        for (int i = 0; i < n; i++) {
            int li = i / s->n_expert, rank = 0;
            for (int j = 0; j < n; j++)
                if (order[j] == i) rank = n - j;
            int l = 0;
            for (int q = 0, c = 0; q < m->cfg.n_layer; q++)
                if (m->cfg.layer_moe[q] && c++ == li) l = q;
            printf("%s{\"layer\": %d, \"moe_layer\": %d, \"expert\": %d, \"routed\": %lld, \"kl\": %.9g, "
                   "\"dnll\": %.9g, \"proxy\": %.9g, \"score\": %.9g, \"rank\": %d}",
                   i ? ", " : "", l, li, i % s->n_expert, (long long)s->routed[i], kl[i], kl[n + i], kl[2 * n + i],
                   score[i], rank);
        }
        printf("]}\n");
        free(kl);
        goto done;
    }
    const char *unit = a->metric == MOE_SENS_KL ? "mean KL, 1e-3 nats" : a->metric == MOE_SENS_PPL
                                                                          ? "mean NLL increase, 1e-3 nats"
                                                                          : "proxy per token, 1e-3";
    printf("sensitivity of %d experts: %s in place of %s, ranked by %s, %d sequences x %d tokens\n", n, a->low,
           a->base, k_metric_names[a->metric], s->n_seq, s->n_ctx);
    printf("cost: %.1f s in this sweep = %.2f baseline passes over the data (a naive sweep: %d), this run %.1f s\n",
           s->seconds, eq, n + 1, seconds);
    if (isfinite(rho)) printf("proxy vs %s rank agreement (Spearman): %.3f\n", k_metric_names[a->metric], rho);
    printf("\n%s per MoE layer (rows) and expert (columns):\n      ", unit);
    for (int e = 0; e < s->n_expert && e < 64; e++) printf(" %7d", e);
    printf("\n");
    for (int li = 0; li < s->n_moe; li++) {
        printf("  %3d ", li);
        for (int e = 0; e < s->n_expert && e < 64; e++) printf(" %7.3f", 1e3 * score[li * s->n_expert + e]);
        printf("\n");
    }
    int show = n < 8 ? n : 8;
    printf("\nmost sensitive:");
    for (int i = 0; i < show; i++) printf(" L%dE%d", order[n - 1 - i] / s->n_expert, order[n - 1 - i] % s->n_expert);
    printf("\nleast sensitive:");
    for (int i = 0; i < show; i++) printf(" L%dE%d", order[i] / s->n_expert, order[i] % s->n_expert);
    printf("\nwrote %s\n", a->out);
done:
    free(score);
    free(order);
}

/* default_pair: the smallest stored precision and the next larger, by bytes per expert. */
static void default_pair(const struct moe_model *m, int *low, int *base) {
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

int moe_prep_sensitivity(int argc, char **argv) {
    struct sens_args a;
    int rc = sens_parse(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    moe_log_set_level(MOE_LOG_WARN);
    struct moe_model *m = NULL;
    char *partial = NULL;
    int32_t *ids = NULL, *seqs = NULL;
    size_t n_ids = 0;
    struct moe_sens_state s = {0};
    int exit_code = 1;
    double t_start = now_s();

    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = a.base;
    if (moe_model_load(a.model, &mp, &m)) {
        fprintf(stderr, "moe-prep sensitivity: cannot load %s (see the message above)\n", a.model);
        goto done;
    }
    if (!m->bundle || m->n_expert_prec < 2) {
        fprintf(stderr, "moe-prep sensitivity: %s must be a bundle with at least two expert precisions; make one with "
                        "moe-prep quantize --experts q8_0,q4_k,q2_k\n", a.model);
        goto done;
    }
    int low = -1, base = -1;
    default_pair(m, &low, &base);
    uint32_t pi;
    if (a.low) {
        if (moe_bundle_find_precision(m->bundle, a.low, &pi)) {
            fprintf(stderr, "moe-prep sensitivity: --low %s is not stored in %s (see moe-prep inspect)\n", a.low, a.model);
            goto done;
        }
        low = (int)pi;
    }
    if (a.base) {
        if (moe_bundle_find_precision(m->bundle, a.base, &pi)) {
            fprintf(stderr, "moe-prep sensitivity: --base %s is not stored in %s (see moe-prep inspect)\n", a.base,
                    a.model);
            goto done;
        }
        base = (int)pi;
    }
    if (low < 0 || base < 0 || low == base) {
        fprintf(stderr, "moe-prep sensitivity: --low and --base must name two different stored precisions\n");
        exit_code = 2;
        goto done;
    }
    a.low = moe_bundle_precision_at(m->bundle, (uint32_t)low)->name;
    a.base = moe_bundle_precision_at(m->bundle, (uint32_t)base)->name;
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int e = 0; m->cfg.layer_moe[l] && e < m->cfg.n_expert; e++)
            if (moe_model_set_expert_precision(m, l, e, base)) goto done;
    if (a.n_ctx > m->cfg.max_pos) {
        fprintf(stderr, "moe-prep sensitivity: --ctx %d exceeds the model's context (%d)\n", a.n_ctx, m->cfg.max_pos);
        exit_code = 2;
        goto done;
    }
    struct moe_dataset_params dp = moe_dataset_default_params(); /* --max-tokens: read only what it needs */
    if (moe_text_load_tokens(m, NULL, a.dataset, &dp, a.max_tokens ? (size_t)a.max_tokens : 0, &ids, &n_ids)) {
        fprintf(stderr, "moe-prep sensitivity: cannot read or tokenize the dataset %s (see the message above)\n",
                a.dataset);
        goto done;
    }
    if (!moe_tool_output_ok("sensitivity", a.out, m, &a.dataset, 1, NULL, 0) ||
        !moe_tool_output_ok("sensitivity", a.csv, m, &a.dataset, 1, &a.out, 1)) {
        exit_code = 2; /* -o or --csv naming the bundle, the text, or each other */
        goto done;
    }
    size_t usable = n_ids;
    if (a.max_tokens && (size_t)a.max_tokens < usable) usable = (size_t)a.max_tokens;
    const int n_seq = (int)(usable / (size_t)a.n_ctx);
    if (n_seq < 1) {
        fprintf(stderr, "moe-prep sensitivity: %s gives %zu tokens, fewer than one sequence of --ctx %d; use a longer "
                        "text or a smaller --ctx\n", a.dataset, usable, a.n_ctx);
        goto done;
    }
    if (!(seqs = malloc(sizeof(int32_t) * (size_t)n_seq * (size_t)a.n_ctx))) goto done;
    memcpy(seqs, ids, sizeof(int32_t) * (size_t)n_seq * (size_t)a.n_ctx);
    const int32_t bos = moe_text_bos(m->tok);
    for (int q = 0; bos >= 0 && q < n_seq; q++) seqs[(size_t)q * (size_t)a.n_ctx] = bos;
    if (moe_sens_state_init(&s, m, n_seq, a.n_ctx)) goto done;
    const double cfg[CFG_N] = {a.n_ctx, low, base, a.metric, a.method, n_seq, (double)n_ids};
    size_t plen = strlen(a.out) + 16;
    if (!(partial = malloc(plen))) goto done;
    snprintf(partial, plen, "%s.partial", a.out);
    if (a.resume) {
        struct moe_profile *pp = NULL;
        if (access(partial, F_OK) != 0) {
            fprintf(stderr, "moe-prep sensitivity: --resume: no %s; starting from the beginning\n", partial);
        } else if (moe_profile_read(partial, &pp) || state_get(pp, partial, &s, cfg)) {
            moe_profile_free(pp);
            fprintf(stderr, "moe-prep sensitivity: cannot resume from %s (see the message above)\n", partial);
            goto done;
        } else {
            fprintf(stderr, "sensitivity: resuming at sequence %d of %d\n", s.next_seq, n_seq);
            moe_profile_free(pp);
        }
    } else if (access(partial, F_OK) == 0) {
        fprintf(stderr, "moe-prep sensitivity: note: %s exists from an interrupted run; starting over (use --resume "
                        "to continue it)\n", partial);
    }
    struct moe_sens_params sp = moe_sens_default_params();
    sp.low = low;
    sp.base = base;
    sp.metric = a.metric;
    sp.method = a.method;
    sp.n_threads = a.n_threads;
    struct progress pr = {now_s(), a.checkpoint_every, now_s(), s.next_seq};
    sp.on_seq = on_seq;
    sp.user = &pr;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    const int limit = a.stop_after ? (s.next_seq + a.stop_after < n_seq ? s.next_seq + a.stop_after : n_seq) : n_seq;
    while (s.next_seq < limit) {
        g_halt = g_signal != 0;
        if (moe_sens_run(m, seqs, &sp, &s, limit, &g_halt)) {
            fprintf(stderr, "\nmoe-prep sensitivity: the sweep failed (see the message above)\n");
            goto done;
        }
        if (s.next_seq < n_seq) {
            if (save(m, &a, &s, cfg, partial, 0, NULL)) {
                fprintf(stderr, "\nmoe-prep sensitivity: cannot save progress to %s\n", partial);
                goto done;
            }
            pr.last_save = now_s();
        }
        if (g_signal) break;
    }
    fprintf(stderr, "\n");
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (s.next_seq < n_seq) {
        fprintf(stderr, "moe-prep sensitivity: stopped after %d of %d sequences; progress is in %s, continue with "
                        "--resume\n", s.next_seq, n_seq, partial);
        exit_code = g_signal ? 130 : 3;
        goto done;
    }
    double rho = NAN;
    if (save(m, &a, &s, cfg, a.out, 1, &rho)) {
        fprintf(stderr, "moe-prep sensitivity: cannot write %s\n", a.out);
        goto done;
    }
    remove(partial);
    if (a.csv && !write_csv(m, &s, a.metric, a.csv)) goto done;
    print_summary(m, &a, &s, rho, now_s() - t_start);
    exit_code = 0;
done:
    moe_sens_state_clear(&s);
    moe_model_free(m);
    free(ids);
    free(seqs);
    free(partial);
    return exit_code;
}

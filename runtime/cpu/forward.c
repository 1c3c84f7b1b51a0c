/*
 * forward.c - CPU reference forward pass.
 *
 * Clear, not clever: every step mirrors transformers' eager implementation of
 * the five supported architectures, in float32, with weights converted row by
 * row from their stored dtype. Work is split across a thread pool by output
 * rows (matmuls) and by (token, head) pairs (attention).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe-session.h"
#include "moe-threadpool.h"

struct moe_session {
    const struct moe_model *m;
    struct moe_session_params p;
    struct moe_pool *pool;
    int pos;
    int32_t *history;           /* [n_ctx] ids in the cache (for Phi-MoE's recompute) */
    int64_t q_dim, kv_dim, max_in, max_ff;
    float *k_cache, *v_cache;   /* [n_layer][n_ctx][kv_dim] */
    /* scratch for one chunk of up to n_batch tokens */
    float *x, *xn, *q, *k, *v;  /* [B x n_embd], [B x q_dim], [B x kv_dim] */
    float *att, *tmp, *moe_out; /* [B x q_dim], [B x n_embd], [B x n_embd] */
    float *router_logits;       /* [B x n_expert] */
    int32_t *sel;               /* [B x k] */
    float *sel_w;               /* [B x k] */
    float *xe, *ge, *ue, *ye;   /* gathered tokens for one expert: [B x n_embd], [B x n_ff] */
    int32_t *tok_idx;           /* [B] */
    float *tok_w;               /* [B] */
    float *sg;                  /* [B] shared-expert gate */
    float *row_buf;             /* [n_threads x max_in] weight row conversion */
    float *att_buf;             /* [n_threads x n_ctx] attention scores */
    float *inv_freq;            /* [n_rot/2] */
    float *rope_cos, *rope_sin; /* [B x n_rot/2] */
};

struct moe_session_params moe_session_default_params(void) {
    struct moe_session_params p = {0};
    return p;
}

/* ---- small kernels ---------------------------------------------------- */

/* dot: float32 dot product with eight independent partial sums. */
static float dot(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    for (; i < n; i++) s[0] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* weight_row: row o of w as float32; `buf` holds n_in floats of scratch.
 * Rows of aligned F32 tensors are used in place. */
static const float *weight_row(const struct moe_weight *w, int64_t o, float *buf) {
    const char *src = (const char *)w->data + (size_t)o * moe_qtype_row_bytes(w->type, w->n_in);
    if (w->type == MOE_QTYPE_F32 && ((uintptr_t)src & 3u) == 0) return (const float *)(const void *)src;
    moe_dequantize_row(w->type, src, buf, w->n_in);
    return buf;
}

struct mm_ctx {
    const struct moe_weight *w;
    const float *x; /* [n_tok x ldx] */
    float *y;       /* [n_tok x ldy] */
    const float *bias;
    int n_tok;
    int64_t ldx, ldy;
    float *row_buf;
    int64_t row_stride;
};

static void mm_range(void *vctx, int64_t b, int64_t e, int tid) {
    struct mm_ctx *c = vctx;
    float *buf = c->row_buf + (size_t)tid * (size_t)c->row_stride;
    const enum moe_qtype wt = c->w->type;
    if (c->n_tok == 1 && wt != MOE_QTYPE_F32) {
        /* one token: dot products straight from the stored rows (SIMD kernels) */
        const size_t rb = moe_qtype_row_bytes(wt, c->w->n_in);
        for (int64_t o = b; o < e; o++)
            c->y[o] = moe_vec_dot(wt, (const char *)c->w->data + (size_t)o * rb, c->x, c->w->n_in) +
                      (c->bias ? c->bias[o] : 0.0f);
        return;
    }
    for (int64_t o = b; o < e; o++) {
        const float *row = weight_row(c->w, o, buf);
        float bo = c->bias ? c->bias[o] : 0.0f;
        for (int t = 0; t < c->n_tok; t++)
            c->y[(size_t)t * (size_t)c->ldy + (size_t)o] =
                dot(row, c->x + (size_t)t * (size_t)c->ldx, c->w->n_in) + bo;
    }
}

/* matmul: y[t] = W x[t] (+ bias) for n_tok rows; x rows have w->n_in floats. */
static void matmul(struct moe_session *s, const struct moe_weight *w, const float *bias,
                   const float *x, int64_t ldx, float *y, int64_t ldy, int n_tok) {
    struct mm_ctx c = {w, x, y, bias, n_tok, ldx, ldy, s->row_buf, s->max_in};
    int64_t work = w->n_in * (int64_t)n_tok;
    int64_t min_chunk = work > 0 ? (32768 + work - 1) / work : 1;
    moe_pool_for(s->pool, w->n_out, min_chunk, mm_range, &c);
}

/* rms_norm: y = x / sqrt(mean(x^2) + eps) * w, as transformers' RMSNorm. */
static void rms_norm(float *y, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

/* layer_norm: y = (x - mean) / sqrt(var + eps) * w + b (biased variance). */
static void layer_norm(float *y, const float *x, const float *w, const float *b, int64_t n, float eps) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
    var /= (double)n;
    float r = 1.0f / sqrtf((float)var + eps);
    for (int64_t i = 0; i < n; i++) y[i] = ((x[i] - (float)mean) * r) * w[i] + (b ? b[i] : 0.0f);
}

/* norm_rows: the model's normalisation applied to n_tok rows. */
static void norm_rows(const struct moe_config *c, float *y, const float *x, const float *w,
                      const float *b, int n_tok) {
    for (int t = 0; t < n_tok; t++) {
        const float *xr = x + (size_t)t * (size_t)c->n_embd;
        float *yr = y + (size_t)t * (size_t)c->n_embd;
        if (c->norm == MOE_NORM_LAYER)
            layer_norm(yr, xr, w, b, c->n_embd, c->norm_eps);
        else
            rms_norm(yr, xr, w, c->n_embd, c->norm_eps);
    }
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* ---- RoPE ------------------------------------------------------------- */

/* rope_init: inverse frequencies as transformers computes them (float32). */
static void rope_init(const struct moe_config *c, float *inv_freq) {
    const struct moe_rope *r = &c->rope;
    int half = r->n_rot / 2;
    for (int i = 0; i < half; i++) {
        float ex = (float)(2 * i) / (float)r->n_rot;
        float base_pow = (float)pow((double)r->theta, (double)ex);
        float f = 1.0f / base_pow;
        switch (r->kind) {
        case MOE_ROPE_DEFAULT: break;
        case MOE_ROPE_LINEAR: f = f / r->factor; break;
        case MOE_ROPE_LONGROPE: f = 1.0f / (r->short_factor[i] * base_pow); break;
        case MOE_ROPE_LLAMA3: {
            float low_wl = (float)r->original_max_pos / r->low_freq_factor;
            float high_wl = (float)r->original_max_pos / r->high_freq_factor;
            float wl = 2.0f * 3.14159265358979323846f / f;
            float scaled = wl > low_wl ? f / r->factor : f;
            if (!(wl < high_wl) && !(wl > low_wl)) {
                float smooth = ((float)r->original_max_pos / wl - r->low_freq_factor) /
                               (r->high_freq_factor - r->low_freq_factor);
                scaled = (1.0f - smooth) * scaled / r->factor + smooth * scaled;
            }
            f = scaled;
            break;
        }
        }
        inv_freq[i] = f;
    }
}

/* rope_tables: cos/sin for n_tok positions starting at pos0. `seq_len` is the
 * largest position of this forward call + 1 (Phi-MoE picks its mscale by it). */
static void rope_tables(struct moe_session *s, int pos0, int n_tok, int seq_len) {
    const struct moe_rope *r = &s->m->cfg.rope;
    int half = r->n_rot / 2;
    float scale = 1.0f;
    if (r->kind == MOE_ROPE_LONGROPE)
        scale = r->has_mscale ? (seq_len > r->original_max_pos ? r->long_mscale : r->short_mscale)
                              : r->attention_factor;
    for (int t = 0; t < n_tok; t++) {
        float p = (float)(pos0 + t);
        for (int i = 0; i < half; i++) {
            float f = p * s->inv_freq[i];
            s->rope_cos[(size_t)t * half + i] = (float)cos((double)f) * scale;
            s->rope_sin[(size_t)t * half + i] = (float)sin((double)f) * scale;
        }
    }
}

/* rope_apply: rotate n_heads heads of one token in the HF (rotate_half) layout. */
static void rope_apply(float *v, int n_heads, int head_dim, int n_rot, const float *cs, const float *sn) {
    int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * cs[i] - x2 * sn[i];
            x[i + half] = x2 * cs[i] + x1 * sn[i];
        }
    }
}

/* ---- attention -------------------------------------------------------- */

struct att_ctx {
    struct moe_session *s;
    int layer, pos0, n_tok;
};

static void att_range(void *vctx, int64_t b, int64_t e, int tid) {
    struct att_ctx *a = vctx;
    struct moe_session *s = a->s;
    const struct moe_config *c = &s->m->cfg;
    const int hd = c->head_dim, group = c->n_head / c->n_head_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    float *sc = s->att_buf + (size_t)tid * (size_t)s->p.n_ctx;
    const float *kc = s->k_cache + (size_t)a->layer * s->p.n_ctx * s->kv_dim;
    const float *vc = s->v_cache + (size_t)a->layer * s->p.n_ctx * s->kv_dim;
    for (int64_t it = b; it < e; it++) {
        int t = (int)(it / c->n_head), h = (int)(it % c->n_head), kvh = h / group;
        int p = a->pos0 + t;
        int lo = 0;
        if (c->layer_sliding[a->layer] && p - c->sliding_window + 1 > 0) lo = p - c->sliding_window + 1;
        const float *qv = s->q + (size_t)t * s->q_dim + (size_t)h * hd;
        float mx = -INFINITY;
        for (int j = lo; j <= p; j++) {
            sc[j] = dot(qv, kc + (size_t)j * s->kv_dim + (size_t)kvh * hd, hd) * scale;
            if (sc[j] > mx) mx = sc[j];
        }
        float sum = 0;
        for (int j = lo; j <= p; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float *out = s->att + (size_t)t * s->q_dim + (size_t)h * hd;
        memset(out, 0, sizeof(float) * (size_t)hd);
        for (int j = lo; j <= p; j++) {
            float w = sc[j] / sum;
            const float *vv = vc + (size_t)j * s->kv_dim + (size_t)kvh * hd;
            for (int d = 0; d < hd; d++) out[d] += w * vv[d];
        }
    }
}

/* attention: self-attention block of layer l for a chunk of n_tok tokens. */
static void attention(struct moe_session *s, int l, int pos0, int n_tok) {
    const struct moe_config *c = &s->m->cfg;
    const struct moe_layer *L = &s->m->layers[l];
    const int hd = c->head_dim;
    matmul(s, &L->wq, L->bq, s->xn, c->n_embd, s->q, s->q_dim, n_tok);
    matmul(s, &L->wk, L->bk, s->xn, c->n_embd, s->k, s->kv_dim, n_tok);
    matmul(s, &L->wv, L->bv, s->xn, c->n_embd, s->v, s->kv_dim, n_tok);
    for (int t = 0; t < n_tok; t++) {
        float *q = s->q + (size_t)t * s->q_dim, *k = s->k + (size_t)t * s->kv_dim;
        float *v = s->v + (size_t)t * s->kv_dim;
        if (c->qk_norm == MOE_QK_NORM_FULL) {
            rms_norm(q, q, L->q_norm, s->q_dim, c->norm_eps);
            rms_norm(k, k, L->k_norm, s->kv_dim, c->norm_eps);
        }
        if (c->clip_qkv > 0) {
            float cl = c->clip_qkv;
            for (int64_t i = 0; i < s->q_dim; i++) q[i] = fminf(fmaxf(q[i], -cl), cl);
            for (int64_t i = 0; i < s->kv_dim; i++) {
                k[i] = fminf(fmaxf(k[i], -cl), cl);
                v[i] = fminf(fmaxf(v[i], -cl), cl);
            }
        }
        if (c->qk_norm == MOE_QK_NORM_HEAD) {
            for (int h = 0; h < c->n_head; h++) rms_norm(q + h * hd, q + h * hd, L->q_norm, hd, c->norm_eps);
            for (int h = 0; h < c->n_head_kv; h++) rms_norm(k + h * hd, k + h * hd, L->k_norm, hd, c->norm_eps);
        }
        const float *cs = s->rope_cos + (size_t)t * (c->rope.n_rot / 2);
        const float *sn = s->rope_sin + (size_t)t * (c->rope.n_rot / 2);
        rope_apply(q, c->n_head, hd, c->rope.n_rot, cs, sn);
        rope_apply(k, c->n_head_kv, hd, c->rope.n_rot, cs, sn);
        size_t off = ((size_t)l * s->p.n_ctx + (size_t)(pos0 + t)) * s->kv_dim;
        memcpy(s->k_cache + off, k, sizeof(float) * s->kv_dim);
        memcpy(s->v_cache + off, v, sizeof(float) * s->kv_dim);
    }
    struct att_ctx a = {s, l, pos0, n_tok};
    moe_pool_for(s->pool, (int64_t)n_tok * c->n_head, 1, att_range, &a);
    matmul(s, &L->wo, L->bo, s->att, s->q_dim, s->tmp, c->n_embd, n_tok);
}

/* ---- feed-forward and MoE --------------------------------------------- */

/* ffn: y = down(silu(gate x) * up x) for n rows of x (ld n_embd). */
static void ffn(struct moe_session *s, const struct moe_ffn *f, const float *x, float *y, int n) {
    int64_t F = f->gate.n_out, H = s->m->cfg.n_embd;
    matmul(s, &f->gate, NULL, x, H, s->ge, F, n);
    matmul(s, &f->up, NULL, x, H, s->ue, F, n);
    for (int64_t i = 0; i < (int64_t)n * F; i++) s->ge[i] = silu(s->ge[i]) * s->ue[i];
    matmul(s, &f->down, NULL, s->ge, F, y, H, n);
}

/* route_softmax_topk: softmax over experts, top-k (ties to the lower index),
 * optional renormalisation — Mixtral, Qwen2/3-MoE, OLMoE. */
static void route_softmax_topk(const struct moe_config *c, int K, const float *logits, int32_t *sel, float *w) {
    int E = c->n_expert;
    float mx = -INFINITY, sum = 0;
    float probs[E];
    for (int e = 0; e < E; e++) mx = fmaxf(mx, logits[e]);
    for (int e = 0; e < E; e++) sum += (probs[e] = expf(logits[e] - mx));
    for (int e = 0; e < E; e++) probs[e] /= sum;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= sel[j] == e;
            if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
        }
        sel[k] = best;
        w[k] = probs[best];
    }
    if (c->norm_topk_prob) {
        float ws = 0;
        for (int k = 0; k < K; k++) ws += w[k];
        for (int k = 0; k < K; k++) w[k] /= ws;
    }
}

/* sparsemixer_pick: one step of Phi-MoE's inference-time sparsemixer. Among
 * scores not excluded, take the maximum; mask entries whose relative gap to it
 * exceeds 2*eps; the weight is the softmax of the unmasked entries at the max. */
static void sparsemixer_pick(const float *scores, const float *masked, int E, float eps, int32_t *sel,
                             float *w) {
    int ind = 0;
    for (int e = 1; e < E; e++)
        if (masked[e] > masked[ind]) ind = e;
    float thr = masked[ind];
    float gates[E];
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) {
        float factor = fmaxf(fabsf(scores[e]), thr);
        int drop = ((thr - scores[e]) / factor) > 2.0f * eps;
        gates[e] = drop ? -INFINITY : masked[e];
        mx = fmaxf(mx, gates[e]);
    }
    float sum = 0;
    for (int e = 0; e < E; e++) sum += (gates[e] = gates[e] == -INFINITY ? 0.0f : expf(gates[e] - mx));
    *sel = ind;
    *w = gates[ind] / sum;
}

/* route_sparsemixer: Phi-MoE top-2 routing (weights are not renormalised);
 * K = 1 keeps the first pick only. */
static void route_sparsemixer(const struct moe_config *c, int K, const float *logits, int32_t *sel, float *w) {
    int E = c->n_expert;
    float masked[E];
    memcpy(masked, logits, sizeof masked);
    sparsemixer_pick(logits, masked, E, c->router_jitter, &sel[0], &w[0]);
    if (K < 2) return;
    masked[sel[0]] = -INFINITY;
    sparsemixer_pick(logits, masked, E, c->router_jitter, &sel[1], &w[1]);
}

/* moe_block: routed experts (+ shared expert) for n_tok rows of s->xn -> s->tmp. */
static void moe_block(struct moe_session *s, int l, int pos0, int n_tok) {
    const struct moe_config *c = &s->m->cfg;
    const struct moe_layer *L = &s->m->layers[l];
    const int E = c->n_expert, K = s->p.n_expert_used;
    const int64_t H = c->n_embd;
    matmul(s, &L->router, NULL, s->xn, H, s->router_logits, E, n_tok);
    for (int t = 0; t < n_tok; t++) {
        const float *lg = s->router_logits + (size_t)t * E;
        if (c->router == MOE_ROUTER_SPARSEMIXER)
            route_sparsemixer(c, K, lg, s->sel + (size_t)t * K, s->sel_w + (size_t)t * K);
        else
            route_softmax_topk(c, K, lg, s->sel + (size_t)t * K, s->sel_w + (size_t)t * K);
    }
    if (s->p.on_route) {
        struct moe_route_event ev = {l, pos0, n_tok, E, K, s->xn, s->router_logits, s->sel, s->sel_w};
        s->p.on_route(&ev, s->p.route_user);
    }
    memset(s->tmp, 0, sizeof(float) * (size_t)n_tok * (size_t)H);
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < n_tok; t++)
            for (int k = 0; k < K; k++)
                if (s->sel[(size_t)t * K + k] == e) {
                    s->tok_idx[n] = t;
                    s->tok_w[n] = s->sel_w[(size_t)t * K + k];
                    memcpy(s->xe + (size_t)n * H, s->xn + (size_t)t * H, sizeof(float) * (size_t)H);
                    n++;
                }
        if (n == 0) continue;
        ffn(s, &L->experts[e], s->xe, s->ye, n);
        if (s->p.on_expert) {
            struct moe_expert_event ev = {l, e, pos0, n, s->tok_idx, s->tok_w, s->ye};
            s->p.on_expert(&ev, s->p.expert_user);
        }
        for (int i = 0; i < n; i++) {
            float *dst = s->tmp + (size_t)s->tok_idx[i] * H;
            const float *src = s->ye + (size_t)i * H;
            for (int64_t d = 0; d < H; d++) dst[d] += src[d] * s->tok_w[i];
        }
    }
    if (c->n_ff_shared > 0) {
        matmul(s, &L->shared_gate, NULL, s->xn, H, s->sg, 1, n_tok);
        ffn(s, &L->shared, s->xn, s->ye, n_tok);
        for (int t = 0; t < n_tok; t++) {
            float g = 1.0f / (1.0f + expf(-s->sg[t]));
            for (int64_t d = 0; d < H; d++) s->tmp[(size_t)t * H + d] += g * s->ye[(size_t)t * H + d];
        }
    }
}

/* ---- session ---------------------------------------------------------- */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* zalloc: zeroed array of n items (at least one, so a zero count is not a failure). */
static void *zalloc(size_t n, size_t size) { return calloc(n ? n : 1, size); }

enum moe_status moe_session_create(const struct moe_model *model, const struct moe_session_params *params,
                                   struct moe_session **out) {
    *out = NULL;
    const struct moe_config *c = &model->cfg;
    struct moe_session *s = calloc(1, sizeof *s);
    if (!s) return MOE_ERR_NOMEM;
    s->m = model;
    s->p = params ? *params : moe_session_default_params();
    if (s->p.n_ctx <= 0) s->p.n_ctx = c->max_pos < 4096 ? c->max_pos : 4096;
    if (s->p.n_batch <= 0) s->p.n_batch = 256;
    if (s->p.n_expert_used <= 0) s->p.n_expert_used = c->n_expert_used;
    if (s->p.n_expert_used > c->n_expert ||
        (c->router == MOE_ROUTER_SPARSEMIXER && s->p.n_expert_used > 2)) {
        MOE_LOGE("%d experts per token requested; the model routes to at most %d", s->p.n_expert_used,
                 c->router == MOE_ROUTER_SPARSEMIXER ? 2 : c->n_expert);
        free(s);
        return MOE_ERR_INVALID;
    }
    enum moe_status st = moe_pool_create(s->p.n_threads, &s->pool);
    if (st) {
        free(s);
        return st;
    }
    s->p.n_threads = moe_pool_n_threads(s->pool);
    const int64_t B = s->p.n_batch, H = c->n_embd, T = s->p.n_threads;
    s->q_dim = (int64_t)c->n_head * c->head_dim;
    s->kv_dim = (int64_t)c->n_head_kv * c->head_dim;
    s->max_ff = max64(max64(c->n_ff_expert, c->n_ff_dense), c->n_ff_shared);
    s->max_in = max64(max64(H, s->q_dim), s->max_ff);
    size_t kv = (size_t)c->n_layer * (size_t)s->p.n_ctx * (size_t)s->kv_dim;
    int ok = 1;
#define ALLOC(ptr, count) ok &= ((ptr) = zalloc((size_t)(count), sizeof *(ptr))) != NULL
    ALLOC(s->history, s->p.n_ctx);
    ALLOC(s->k_cache, kv);
    ALLOC(s->v_cache, kv);
    ALLOC(s->x, B * H);
    ALLOC(s->xn, B * H);
    ALLOC(s->q, B * s->q_dim);
    ALLOC(s->k, B * s->kv_dim);
    ALLOC(s->v, B * s->kv_dim);
    ALLOC(s->att, B * s->q_dim);
    ALLOC(s->tmp, B * H);
    ALLOC(s->moe_out, B * H);
    ALLOC(s->router_logits, B * c->n_expert);
    ALLOC(s->sel, B * s->p.n_expert_used);
    ALLOC(s->sel_w, B * s->p.n_expert_used);
    ALLOC(s->xe, B * H);
    ALLOC(s->ge, B * s->max_ff);
    ALLOC(s->ue, B * s->max_ff);
    ALLOC(s->ye, B * H);
    ALLOC(s->tok_idx, B);
    ALLOC(s->tok_w, B);
    ALLOC(s->sg, B);
    ALLOC(s->row_buf, T * s->max_in);
    ALLOC(s->att_buf, T * s->p.n_ctx);
    ALLOC(s->inv_freq, c->rope.n_rot / 2);
    ALLOC(s->rope_cos, B * (c->rope.n_rot / 2));
    ALLOC(s->rope_sin, B * (c->rope.n_rot / 2));
#undef ALLOC
    if (!ok) {
        MOE_LOGE("cannot allocate the session (KV cache %zu MiB); try a smaller context",
                 (kv * 8) >> 20);
        moe_session_free(s);
        return MOE_ERR_NOMEM;
    }
    rope_init(c, s->inv_freq);
    *out = s;
    return MOE_OK;
}

void moe_session_free(struct moe_session *s) {
    if (!s) return;
    moe_pool_free(s->pool);
    float *bufs[] = {s->k_cache, s->v_cache, s->x, s->xn, s->q, s->k, s->v, s->att, s->tmp,
                     s->moe_out, s->router_logits, s->sel_w, s->xe, s->ge, s->ue, s->ye,
                     s->tok_w, s->sg, s->row_buf, s->att_buf, s->inv_freq, s->rope_cos, s->rope_sin};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(s->sel);
    free(s->tok_idx);
    free(s->history);
    free(s);
}

void moe_session_reset(struct moe_session *s) { s->pos = 0; }
int moe_session_pos(const struct moe_session *s) { return s->pos; }
int moe_session_n_ctx(const struct moe_session *s) { return s->p.n_ctx; }

static void layers_chunk(struct moe_session *s, int l0, const int32_t *tokens, int n_tok, int seq_len,
                         float *logits, int row_from);

/* forward_chunk: n_tok (<= n_batch) tokens at s->pos; writes logits for chunk
 * rows [row_from, n_tok) into `logits` (row_from >= n_tok: none). */
static void forward_chunk(struct moe_session *s, const int32_t *tokens, int n_tok, int seq_len,
                          float *logits, int row_from) {
    const struct moe_model *m = s->m;
    const struct moe_config *c = &m->cfg;
    const int64_t H = c->n_embd;
    for (int t = 0; t < n_tok; t++) {
        const float *row = weight_row(&m->tok_embd, tokens[t], s->row_buf);
        memcpy(s->x + (size_t)t * H, row, sizeof(float) * (size_t)H);
    }
    layers_chunk(s, 0, tokens, n_tok, seq_len, logits, row_from);
}

/* layers_chunk: layers [l0, n_layer) and the LM head for the n_tok rows of
 * s->x at s->pos (see forward_chunk). */
static void layers_chunk(struct moe_session *s, int l0, const int32_t *tokens, int n_tok, int seq_len,
                         float *logits, int row_from) {
    const struct moe_model *m = s->m;
    const struct moe_config *c = &m->cfg;
    const int64_t H = c->n_embd;
    const int pos0 = s->pos;
    for (int t = 0; t < n_tok; t++) s->history[pos0 + t] = tokens[t];
    rope_tables(s, pos0, n_tok, seq_len);
    for (int l = l0; l < c->n_layer; l++) {
        const struct moe_layer *L = &m->layers[l];
        if (s->p.on_layer) {
            struct moe_layer_event ev = {l, pos0, n_tok, s->x};
            s->p.on_layer(&ev, s->p.layer_user);
        }
        norm_rows(c, s->xn, s->x, L->attn_norm, L->attn_norm_b, n_tok);
        attention(s, l, pos0, n_tok);
        for (int64_t i = 0; i < n_tok * H; i++) s->x[i] += s->tmp[i];
        norm_rows(c, s->xn, s->x, L->ffn_norm, L->ffn_norm_b, n_tok);
        if (c->layer_moe[l])
            moe_block(s, l, pos0, n_tok);
        else
            ffn(s, &L->dense, s->xn, s->tmp, n_tok);
        for (int64_t i = 0; i < n_tok * H; i++) s->x[i] += s->tmp[i];
    }
    if (s->p.on_layer) {
        struct moe_layer_event ev = {c->n_layer, pos0, n_tok, s->x};
        s->p.on_layer(&ev, s->p.layer_user);
    }
    s->pos += n_tok;
    if (row_from >= n_tok) return;
    norm_rows(c, s->xn, s->x + (size_t)row_from * H, m->out_norm, m->out_norm_b, n_tok - row_from);
    matmul(s, &m->lm_head, m->lm_head_b, s->xn, H, logits, c->n_vocab, n_tok - row_from);
}

/* run_tokens: process n tokens at s->pos in chunks; logits rows [row_from, n)
 * go to `logits` (row row_from first). */
static void run_tokens(struct moe_session *s, const int32_t *tokens, int n, float *logits, int row_from) {
    const size_t V = (size_t)s->m->cfg.n_vocab;
    const int seq_len = s->pos + n;
    for (int done = 0; done < n;) {
        int chunk = n - done < s->p.n_batch ? n - done : s->p.n_batch;
        int from = row_from > done ? row_from - done : 0; /* first row wanted in this chunk */
        float *dst = from < chunk ? logits + (size_t)(done + from - row_from) * V : NULL;
        forward_chunk(s, tokens + done, chunk, seq_len, dst, from);
        done += chunk;
    }
}

enum moe_status moe_session_forward(struct moe_session *s, const int32_t *tokens, int n, float *logits,
                                    int all_logits) {
    const struct moe_config *c = &s->m->cfg;
    if (n <= 0) {
        MOE_LOGE("no tokens to process");
        return MOE_ERR_INVALID;
    }
    if (n > s->p.n_ctx - s->pos) {
        MOE_LOGE("context full: %d cached + %d new tokens exceed the context of %d", s->pos, n,
                 s->p.n_ctx);
        return MOE_ERR_RANGE;
    }
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab) {
            MOE_LOGE("token id %d at index %d is outside the vocabulary [0, %d)", tokens[i], i, c->n_vocab);
            return MOE_ERR_INVALID;
        }
    }
    const struct moe_rope *r = &c->rope;
    if (r->has_mscale && s->pos > 0 && s->pos <= r->original_max_pos && s->pos + n > r->original_max_pos) {
        /* Phi-MoE: the cached keys were rotated with short_mscale; once the
         * sequence outgrows original_max_position_embeddings, transformers'
         * generate() drops the cache and recomputes the whole sequence with
         * long_mscale. Do the same so logits match it. */
        int old = s->pos, total = old + n;
        int32_t *all = malloc(sizeof(int32_t) * (size_t)total);
        if (!all) return MOE_ERR_NOMEM;
        memcpy(all, s->history, sizeof(int32_t) * (size_t)old);
        memcpy(all + old, tokens, sizeof(int32_t) * (size_t)n);
        s->pos = 0;
        run_tokens(s, all, total, logits, !logits ? total : all_logits ? old : total - 1);
        free(all);
        return MOE_OK;
    }
    run_tokens(s, tokens, n, logits, !logits ? n : all_logits ? 0 : n - 1);
    return MOE_OK;
}

enum moe_status moe_session_forward_from(struct moe_session *s, int layer, const int32_t *tokens,
                                         const float *x, int n, float *logits, int all_logits) {
    const struct moe_config *c = &s->m->cfg;
    if (layer < 0 || layer >= c->n_layer || n <= 0) {
        MOE_LOGE("cannot start at layer %d of %d with %d tokens", layer, c->n_layer, n);
        return MOE_ERR_INVALID;
    }
    if (n > s->p.n_ctx - s->pos) {
        MOE_LOGE("context full: %d cached + %d new tokens exceed the context of %d", s->pos, n, s->p.n_ctx);
        return MOE_ERR_RANGE;
    }
    const struct moe_rope *r = &c->rope;
    if (r->has_mscale && s->pos + n > r->original_max_pos) {
        MOE_LOGE("starting at layer %d past %d positions would need the whole sequence recomputed (longrope)", layer,
                 r->original_max_pos);
        return MOE_ERR_UNSUPPORTED;
    }
    const size_t V = (size_t)c->n_vocab, H = (size_t)c->n_embd;
    const int row_from = !logits ? n : all_logits ? 0 : n - 1;
    const int seq_len = s->pos + n;
    for (int done = 0; done < n;) {
        int chunk = n - done < s->p.n_batch ? n - done : s->p.n_batch;
        int from = row_from > done ? row_from - done : 0;
        float *dst = from < chunk ? logits + (size_t)(done + from - row_from) * V : NULL;
        memcpy(s->x, x + (size_t)done * H, sizeof(float) * (size_t)chunk * H);
        layers_chunk(s, layer, tokens + done, chunk, seq_len, dst, from);
        done += chunk;
    }
    return MOE_OK;
}

enum moe_status moe_session_lm_head(struct moe_session *s, const float *x, int n, float *logits) {
    const struct moe_model *m = s->m;
    const struct moe_config *c = &m->cfg;
    const size_t H = (size_t)c->n_embd, V = (size_t)c->n_vocab;
    for (int done = 0; done < n;) {
        int chunk = n - done < s->p.n_batch ? n - done : s->p.n_batch;
        norm_rows(c, s->xn, x + (size_t)done * H, m->out_norm, m->out_norm_b, chunk);
        matmul(s, &m->lm_head, m->lm_head_b, s->xn, (int64_t)H, logits + (size_t)done * V, c->n_vocab, chunk);
        done += chunk;
    }
    return MOE_OK;
}

enum moe_status moe_session_ffn(struct moe_session *s, const struct moe_ffn *f, const float *x, float *y, int n) {
    const size_t H = (size_t)s->m->cfg.n_embd;
    if (f->gate.n_in != (int64_t)H || f->down.n_out != (int64_t)H || f->gate.n_out > s->max_ff) {
        MOE_LOGE("feed-forward of [%lld x %lld] does not fit this model's hidden size %zu",
                 (long long)f->gate.n_out, (long long)f->gate.n_in, H);
        return MOE_ERR_SHAPE;
    }
    for (int done = 0; done < n;) {
        int chunk = n - done < s->p.n_batch ? n - done : s->p.n_batch;
        ffn(s, f, x + (size_t)done * H, y + (size_t)done * H, chunk);
        done += chunk;
    }
    return MOE_OK;
}

/*
 * profile-record.c - the profile recorder (profile-record.h): sequences of
 * the token stream through fresh sessions, observed by on_route / on_expert;
 * the stacked-gate and big-little sums gathered per sequence.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe-base.h"
#include "moe-quant.h"
#include "moe-session.h"
#include "profile-record.h"
#include "profile-results.h"
#include "token-stream.h"

#define MAX_DIST MOE_PROFILE_MAX_DIST

/* What the observers record. Per sequence: the trace rows, gate inputs and
 * router logits; over the run: the Pearson sums. */
struct recorder {
    int L, E, K, n_embd, n_layer;
    const int *moe_index;   /* [n_layer] model layer -> MoE layer, -1 if dense */
    const int32_t *layer_of; /* [L] MoE layer -> model layer */
    int n_ctx;
    int16_t *experts;       /* [n_ctx x L x K] current sequence */
    float *weights;         /* [n_ctx x L x K] */
    float *gate_in;         /* [L x n_ctx x n_embd] */
    float *logits;          /* [n_ctx x L x E] router logits, or NULL when not kept */
    unsigned char *seen;    /* [L x n_ctx] a route event covered this row */
    int bad;                /* an event did not fit (logged once) */
    double pearson[6];      /* n, sum g, sum y, sum g^2, sum y^2, sum g y */
};

/* ---- observers ---- */

static void on_route(const struct moe_route_event *ev, void *user) {
    struct recorder *r = user;
    int li = ev->layer >= 0 && ev->layer < r->n_layer ? r->moe_index[ev->layer] : -1;
    if (li < 0 || ev->k != r->K || ev->n_expert != r->E || ev->pos0 < 0 || ev->pos0 + ev->n_tokens > r->n_ctx) {
        if (!r->bad)
            MOE_LOGE("unexpected route event (layer %d, k %d, %d experts, pos %d+%d)", ev->layer, ev->k, ev->n_expert,
                     ev->pos0, ev->n_tokens);
        r->bad = 1;
        return;
    }
    const int L = r->L, K = r->K;
    for (int t = 0; t < ev->n_tokens; t++) {
        int pos = ev->pos0 + t;
        size_t o = ((size_t)pos * L + li) * K;
        for (int j = 0; j < K; j++) {
            r->experts[o + j] = (int16_t)ev->experts[(size_t)t * K + j];
            r->weights[o + j] = ev->weights[(size_t)t * K + j];
        }
        memcpy(r->gate_in + ((size_t)li * r->n_ctx + pos) * r->n_embd, ev->gate_input + (size_t)t * r->n_embd,
               (size_t)r->n_embd * sizeof(float));
        if (r->logits)
            memcpy(r->logits + ((size_t)pos * L + li) * r->E, ev->router_logits + (size_t)t * r->E,
                   (size_t)r->E * sizeof(float));
        r->seen[(size_t)li * r->n_ctx + pos] = 1;
    }
}

static void on_expert(const struct moe_expert_event *ev, void *user) {
    struct recorder *r = user;
    for (int i = 0; i < ev->n; i++) {
        const float *y = ev->outputs + (size_t)i * r->n_embd;
        double ss = 0;
        for (int d = 0; d < r->n_embd; d++) ss += (double)y[d] * y[d];
        double g = ev->weights[i], m = fabs(g) * sqrt(ss); /* ||g E(x)|| */
        double *q = r->pearson;
        q[0] += 1, q[1] += g, q[2] += m, q[3] += g * g, q[4] += m * m, q[5] += g * m;
    }
}

/* ---- stacked gating ---- */

/* stacked_add: after a sequence of n tokens, add for every MoE layer l and
 * distance j the cosine of the gate inputs (l, l+j) and whether the router of
 * l+j applied to x_l predicts the experts actually chosen at l+j. The
 * prediction routes those logits as the runtime does (moe_route: softmax
 * top-K, sparsemixer, DeepSeek's groups, V3's sigmoid with its correction
 * bias), so its top-1 is the expert with the largest gate weight. routers:
 * [L x E x n_embd] dequantized; sums as sum.stacked [L x MAX_DIST x 4]:
 * cosine, top-1 hits, top-K recall, tokens. */
static void stacked_add(const struct recorder *r, const struct moe_model *m, const float *routers, int n,
                        double *sums, float *logits, int32_t *pred) {
    float pw[64];
    const int L = r->L, E = r->E, K = r->K, D = r->n_embd;
    for (int li = 0; li < L; li++)
        for (int j = 1; j <= MAX_DIST; j++) {
            int lj = r->layer_of[li] + j;
            if (lj >= r->n_layer || r->moe_index[lj] < 0) continue;
            int mj = r->moe_index[lj];
            double *q = sums + ((size_t)li * MAX_DIST + (j - 1)) * 4;
            for (int t = 0; t < n; t++) {
                const float *x = r->gate_in + ((size_t)li * r->n_ctx + t) * D;
                const float *y = r->gate_in + ((size_t)mj * r->n_ctx + t) * D;
                double xy = 0, xx = 0, yy = 0;
                for (int d = 0; d < D; d++) {
                    xy += (double)x[d] * y[d];
                    xx += (double)x[d] * x[d];
                    yy += (double)y[d] * y[d];
                }
                q[0] += xx > 0 && yy > 0 ? xy / sqrt(xx * yy) : 0;
                const float *w = routers + (size_t)mj * E * D;
                const float *rb = m->layers[lj].router_b; /* gpt-oss's router bias */
                for (int e = 0; e < E; e++) {
                    double acc = rb ? rb[e] : 0.0;
                    for (int d = 0; d < D; d++) acc += (double)w[(size_t)e * D + d] * x[d];
                    logits[e] = (float)acc;
                }
                moe_route(m, lj, K, logits, pred, pw);
                const int16_t *act = r->experts + ((size_t)t * L + mj) * K;
                int hit1 = 0, hits = 0;
                for (int a = 0; a < K; a++) {
                    hit1 |= act[a] == pred[0];
                    for (int b = 0; b < K; b++) hits += act[a] == pred[b];
                }
                q[1] += hit1;
                q[2] += (double)hits / K;
                q[3] += 1;
            }
        }
}

/* load_routers: every MoE layer's router as floats [L x E x n_embd]. */
static float *load_routers(const struct moe_model *m, const int32_t *layer_of, int L) {
    const int E = m->cfg.n_expert, D = m->cfg.n_embd;
    float *w = malloc((size_t)L * E * D * sizeof *w);
    if (!w) return NULL;
    for (int li = 0; li < L; li++) {
        const struct moe_weight *r = &m->layers[layer_of[li]].router;
        if (r->n_out != E || r->n_in != D) goto fail;
        size_t row = moe_qtype_row_bytes(r->type, D);
        for (int e = 0; e < E; e++)
            if (moe_dequantize_row(r->type, (const char *)r->data + (size_t)e * row, w + ((size_t)li * E + e) * D, D))
                goto fail;
    }
    return w;
fail:
    MOE_LOGE("cannot read the router weights");
    free(w);
    return NULL;
}

/* ---- big-little (MoBiLE) ---- */

/* argmax_row: index of the largest of x[n] (lower index on ties). */
static int argmax_row(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* big_little_add: for each of n positions, the little model's largest output
 * probability (softmax of its logits) into the histogram sum.big_little_maxprob
 * [2 x BINS], row 0 if its top token is the big model's, row 1 if not. */
static void big_little_add(const float *big, const float *little, int n, int V, int64_t *hist) {
    const int B = MOE_PROFILE_BL_BINS;
    for (int t = 0; t < n; t++) {
        const float *x = little + (size_t)t * V;
        int a = argmax_row(x, V), b = argmax_row(big + (size_t)t * V, V);
        float z = 0; /* single precision: a bin is 1/1000 wide, and exp over the vocabulary is most of the cost */
        for (int v = 0; v < V; v++) z += expf(x[v] - x[a]);
        double pmax = 1.0 / z;
        int bin = (int)(pmax * B);
        if (bin >= B) bin = B - 1;
        if (bin < 0) bin = 0;
        hist[(a == b ? 0 : B) + bin]++;
    }
}

/* ---- the recording ---- */

/* run_forward: one sequence through a fresh session; logits NULL skips the LM head. */
static enum moe_status run_forward(const struct moe_model *model, const struct moe_session_params *sp,
                                   const int32_t *seq, int n, float *logits) {
    struct moe_session *s = NULL;
    enum moe_status st = moe_session_create(model, sp, &s);
    if (!st) st = moe_session_forward(s, seq, n, logits, 1);
    moe_session_free(s);
    return st;
}

/* Everything one recording holds besides the profile. */
struct run {
    const struct moe_model *model;
    const struct moe_profile_record_params *p;
    int L, E, K, D, V, little_k, bl_every;
    int64_t n_total;        /* tokens of the run (all shards) */
    int n_seq_all, seq0, seq1;
    int *moe_index;         /* [n_layer] */
    int32_t *layer_of;      /* [L] */
    float *routers;         /* [L x E x D] */
    struct recorder rec;
    double *sums;           /* sum.stacked [L x MAX_DIST x 4] */
    int64_t *bl_hist;       /* sum.big_little_maxprob [2 x BINS] */
    int32_t *seq, *pred;    /* [n_ctx], [K] */
    float *logits, *big, *little; /* [E], [n_ctx x V] x 2 (big-little only) */
};

static void run_free(struct run *r) {
    free(r->rec.experts);
    free(r->rec.weights);
    free(r->rec.gate_in);
    free(r->rec.logits);
    free(r->rec.seen);
    free(r->sums);
    free(r->bl_hist);
    free(r->seq);
    free(r->pred);
    free(r->logits);
    free(r->big);
    free(r->little);
    free(r->routers);
    free(r->layer_of);
    free(r->moe_index);
}

/* plan_run: the sequences of the run and of this shard, the big-little
 * period, and the layer maps. */
static enum moe_status plan_run(struct run *r, size_t n_tokens) {
    const struct moe_profile_record_params *p = r->p;
    const struct moe_config *c = &r->model->cfg;
    if (p->n_ctx < 2 || p->max_tokens < 0 || p->shard_n < 1 || p->shard_i < 1 || p->shard_i > p->shard_n ||
        p->big_little_every < -1 || p->n_threads < 0) {
        MOE_LOGE("parameters out of range (n_ctx %d, shard %d/%d, big_little_every %d)", p->n_ctx, p->shard_i,
                 p->shard_n, p->big_little_every);
        return MOE_ERR_INVALID;
    }
    if (p->n_ctx > c->max_pos) {
        MOE_LOGE("a context of %d tokens exceeds the model's (max_position_embeddings %d)", p->n_ctx, c->max_pos);
        return MOE_ERR_INVALID;
    }
    r->n_total = (int64_t)(n_tokens / (size_t)p->n_ctx) * p->n_ctx;
    if (p->max_tokens && p->max_tokens < r->n_total) r->n_total = p->max_tokens;
    if (r->n_total < 1) {
        MOE_LOGE("the text tokenizes to %zu tokens, fewer than one sequence of %d; use a longer text or a smaller "
                 "context", n_tokens, p->n_ctx);
        return MOE_ERR_INVALID;
    }
    r->n_seq_all = (int)((r->n_total + p->n_ctx - 1) / p->n_ctx);
    if (p->shard_n > r->n_seq_all) {
        MOE_LOGE("shard %d/%d: the text has only %d sequences of %d tokens", p->shard_i, p->shard_n, r->n_seq_all,
                 p->n_ctx);
        return MOE_ERR_INVALID;
    }
    /* the big-little sample: every 16th sequence by default (a ~10 % cost), at
     * least 2 sequences; from the whole run's count, so shards agree */
    r->bl_every = p->big_little_every;
    if (r->bl_every < 0) {
        r->bl_every = r->n_seq_all / 2 < 16 ? r->n_seq_all / 2 : 16;
        if (r->bl_every < 1) r->bl_every = 1;
    }
    r->seq0 = (int)((int64_t)(p->shard_i - 1) * r->n_seq_all / p->shard_n);
    r->seq1 = (int)((int64_t)p->shard_i * r->n_seq_all / p->shard_n);
    /* model layer <-> MoE layer */
    if (!(r->moe_index = malloc((size_t)c->n_layer * sizeof *r->moe_index))) return MOE_ERR_NOMEM;
    r->L = 0;
    for (int l = 0; l < c->n_layer; l++) r->moe_index[l] = c->layer_moe[l] ? r->L++ : -1;
    if (r->L == 0 || c->n_expert < 1 || c->n_expert > INT16_MAX) {
        MOE_LOGE("the model has no MoE layers to profile");
        return MOE_ERR_INVALID;
    }
    if (!(r->layer_of = malloc((size_t)r->L * sizeof *r->layer_of))) return MOE_ERR_NOMEM;
    for (int l = 0; l < c->n_layer; l++)
        if (r->moe_index[l] >= 0) r->layer_of[r->moe_index[l]] = l;
    r->E = c->n_expert, r->K = c->n_expert_used, r->D = c->n_embd, r->V = c->n_vocab;
    r->little_k = r->K / 2;
    if (r->bl_every > 0 && r->little_k < 1) {
        MOE_LOGW("the model routes each token to 1 expert; no K/2 little model, skipping the big-little pass");
        r->bl_every = 0;
    }
    return MOE_OK;
}

/* alloc_run: the recorder's buffers and the sums. */
static enum moe_status alloc_run(struct run *r) {
    const int L = r->L, E = r->E, K = r->K, D = r->D, n_ctx = r->p->n_ctx;
    if (!(r->routers = load_routers(r->model, r->layer_of, L))) return MOE_ERR_FORMAT;
    r->rec = (struct recorder){.L = L, .E = E, .K = K, .n_embd = D, .n_layer = r->model->cfg.n_layer,
                               .moe_index = r->moe_index, .layer_of = r->layer_of, .n_ctx = n_ctx};
    r->rec.experts = malloc((size_t)n_ctx * L * K * sizeof *r->rec.experts);
    r->rec.weights = malloc((size_t)n_ctx * L * K * sizeof *r->rec.weights);
    r->rec.gate_in = malloc((size_t)L * n_ctx * D * sizeof *r->rec.gate_in);
    r->rec.seen = malloc((size_t)L * n_ctx);
    if (r->p->logits && !(r->rec.logits = malloc((size_t)n_ctx * L * E * sizeof *r->rec.logits))) return MOE_ERR_NOMEM;
    r->sums = calloc((size_t)L * MAX_DIST * 4, sizeof *r->sums);
    r->bl_hist = calloc((size_t)2 * MOE_PROFILE_BL_BINS, sizeof *r->bl_hist);
    r->seq = malloc((size_t)n_ctx * sizeof *r->seq);
    r->logits = malloc((size_t)E * sizeof *r->logits);
    r->pred = malloc((size_t)K * sizeof *r->pred);
    if (!r->rec.experts || !r->rec.weights || !r->rec.gate_in || !r->rec.seen || !r->sums || !r->bl_hist || !r->seq ||
        !r->logits || !r->pred)
        return MOE_ERR_NOMEM;
    if (r->bl_every > 0 && (!(r->big = malloc((size_t)n_ctx * r->V * sizeof *r->big)) ||
                            !(r->little = malloc((size_t)n_ctx * r->V * sizeof *r->little))))
        return MOE_ERR_NOMEM;
    return MOE_OK;
}

/* record_sequence: sequence si (n tokens at the stream's si-th slot) through
 * the big model (and the little one on the big-little sample), its trace into
 * p and its sums added. */
static enum moe_status record_sequence(struct run *r, const int32_t *tokens, int si, int n, int32_t bos,
                                       const struct moe_session_params *sp, const struct moe_session_params *sp_little,
                                       struct moe_profile *p) {
    const int L = r->L, n_ctx = r->p->n_ctx;
    enum moe_status st;
    memcpy(r->seq, tokens + (size_t)si * n_ctx, (size_t)n * sizeof *r->seq);
    if (bos >= 0) r->seq[0] = bos;
    memset(r->rec.seen, 0, (size_t)L * n_ctx);
    /* the big-little sample is chosen by the global sequence index, so shards agree with one run */
    int bl = r->bl_every > 0 && si % r->bl_every == 0;
    if ((st = run_forward(r->model, sp, r->seq, n, bl ? r->big : NULL)) ||
        (bl && (st = run_forward(r->model, sp_little, r->seq, n, r->little)))) {
        MOE_LOGE("forward pass of sequence %d failed: %s", si, moe_status_str(st));
        return st;
    }
    for (size_t i = 0; i < (size_t)L * n; i++)
        if (!r->rec.seen[(i % L) * n_ctx + i / L]) r->rec.bad = 1;
    if (r->rec.bad) {
        MOE_LOGE("the router events of sequence %d do not cover every token and MoE layer", si);
        return MOE_ERR_FORMAT;
    }
    if (bl) big_little_add(r->big, r->little, n, r->V, r->bl_hist);
    stacked_add(&r->rec, r->model, r->routers, n, r->sums, r->logits, r->pred);
    int64_t seq_start[2] = {0, n};
    struct moe_trace t = {.n_layers = L, .n_experts = r->E, .k = r->K, .n_seq = 1, .seq_start = seq_start,
                          .experts = r->rec.experts, .weights = r->rec.weights};
    if ((st = moe_profile_add_trace(p, &t, r->rec.logits))) MOE_LOGE("the trace of sequence %d is invalid: %s", si,
                                                                      moe_status_str(st));
    return st;
}

/* store_sums: the sums only this run could gather, and its settings (merge checks them). */
static enum moe_status store_sums(const struct run *r, struct moe_profile *p) {
    int64_t d1[1], d3[3] = {r->L, MAX_DIST, 4}, d2[2] = {2, MOE_PROFILE_BL_BINS};
    int64_t record[4] = {r->p->n_ctx, r->bl_every, r->bl_every ? r->little_k : 0, MAX_DIST};
    int64_t shard[3] = {r->seq0, r->seq1, r->n_seq_all};
    enum moe_status st;
    if ((d1[0] = 6, st = moe_profile_put_f64(p, MOE_PROFILE_SUM_PREFIX "pearson", 1, d1, r->rec.pearson)) ||
        (st = moe_profile_put_f64(p, MOE_PROFILE_SUM_PREFIX "stacked", 3, d3, r->sums)) ||
        (r->bl_every && (st = moe_profile_put_i64(p, MOE_PROFILE_SUM_PREFIX "big_little_maxprob", 2, d2, r->bl_hist))) ||
        (d1[0] = 4, st = moe_profile_put_i64(p, MOE_PROFILE_CONFIG_PREFIX "record", 1, d1, record)) ||
        (d1[0] = 3, st = moe_profile_put_i64(p, "shard", 1, d1, shard)))
        MOE_LOGE("cannot store the sums: %s", moe_status_str(st));
    return st;
}

/* session_params: the big model's (observed) and the little model's sessions. */
static void session_params(struct run *r, struct moe_session_params *sp, struct moe_session_params *sp_little) {
    *sp = moe_session_default_params();
    sp->n_ctx = r->p->n_ctx;
    sp->n_batch = r->p->n_ctx; /* the whole sequence in one batch */
    sp->n_threads = r->p->n_threads;
    sp->device = r->p->device;
    sp->device_options = r->p->device_options;
    sp->on_route = on_route;
    sp->route_user = &r->rec;
    sp->on_expert = on_expert;
    sp->expert_user = &r->rec;
    *sp_little = moe_session_default_params();
    sp_little->n_ctx = r->p->n_ctx;
    sp_little->n_batch = r->p->n_ctx;
    sp_little->n_threads = r->p->n_threads;
    sp_little->device = r->p->device;
    sp_little->device_options = r->p->device_options;
    sp_little->n_expert_used = r->little_k;
}

struct moe_profile_record_params moe_profile_record_default_params(void) {
    struct moe_profile_record_params p;
    memset(&p, 0, sizeof p);
    p.n_ctx = 256;
    p.big_little_every = -1;
    p.shard_i = p.shard_n = 1;
    return p;
}

enum moe_status moe_profile_record(const struct moe_model *model, const int32_t *tokens, size_t n_tokens,
                                   const struct moe_profile_record_params *params, struct moe_profile **out,
                                   struct moe_profile_record_info *info) {
    struct run r;
    memset(&r, 0, sizeof r);
    r.model = model, r.p = params;
    struct moe_profile *p = NULL;
    *out = NULL;
    enum moe_status st;
    if ((st = plan_run(&r, n_tokens)) || (st = alloc_run(&r))) goto done;
    if ((st = moe_profile_new(r.L, r.E, r.K, 0, params->logits, &p)) ||
        (st = moe_profile_set_meta(p, moe_arch_name(model->cfg.arch), params->model_path,
                                   params->dataset, MOE_VERSION))) {
        MOE_LOGE("cannot make the profile: %s", moe_status_str(st));
        goto done;
    }
    memcpy(p->moe_layer_index, r.layer_of, (size_t)r.L * sizeof *r.layer_of);
    struct moe_session_params sp, sp_little;
    session_params(&r, &sp, &sp_little);
    const int32_t bos = moe_text_bos(model->tok);
    const double t0 = moe_now_s();
    int64_t n_done = 0;
    for (int si = r.seq0; si < r.seq1; si++) {
        int64_t left = r.n_total - (int64_t)si * params->n_ctx;
        int n = (int)(left < params->n_ctx ? left : params->n_ctx);
        if ((st = record_sequence(&r, tokens, si, n, bos, &sp, &sp_little, p))) goto done;
        n_done += n;
        if (params->progress)
            params->progress(si - r.seq0 + 1, r.seq1 - r.seq0, n_done, moe_now_s() - t0, params->progress_user);
    }
    const double seconds = moe_now_s() - t0;
    if ((st = store_sums(&r, p))) goto done;
    if (info)
        *info = (struct moe_profile_record_info){r.seq0, r.seq1, r.n_seq_all, r.bl_every,
                                                 r.bl_every ? r.little_k : 0, n_done, seconds};
    *out = p;
    p = NULL;
done:
    if (st == MOE_ERR_NOMEM) MOE_LOGE("out of memory");
    moe_profile_free(p);
    run_free(&r);
    return st;
}

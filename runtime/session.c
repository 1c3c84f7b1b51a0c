/*
 * session.c - the run state of a model and the forward logic, on a backend.
 *
 * The session owns what does not depend on the hardware: the token history,
 * the router's decisions (softmax top-k, sparsemixer or DeepSeek's group-limited
 * softmax / sigmoid routing, computed on the host
 * from the backend's router logits), the order of layers and chunks, the
 * observers, and which copy of each routed expert a token uses (the resident
 * views of the model, or the expert store's slots when a memory budget is
 * set). The arithmetic runs on a backend (moe-backend.h); the CPU backend is
 * the reference.
 *
 * Sequences (n_seq > 1): each has its position and token history here and
 * its KV cache in the backend (kv_seq selects the one attention() uses). The
 * forward paths run on the current sequence `cur` (s->pos, s->history);
 * moe_session_decode_batch runs one token of each of several sequences as
 * one batch: per layer the attention of every row in its own cache
 * (attention_multi, or row by row), then the norms, router, store plan,
 * experts and LM head over all rows at once.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe-backend.h"
#include "moe-base.h"
#include "moe-graph.h"
#include "moe-session.h"
#include "moe-store.h"

struct moe_session_params moe_session_default_params(void) {
    struct moe_session_params p = {0};
    p.bl_prefetch_layers = 2;
    return p;
}

struct moe_session {
    const struct moe_model *m;
    struct moe_session_params p; /* p.store is NULL after create (it was borrowed for that call) */
    int budget;                 /* a budget's store (p.store was given) */
    int prefetch_layers;        /* its stacked-gating prefetch distance (moe_store_params) */
    struct moe_backend *be;
    struct moe_store *store;    /* the expert store: a budget's, or in place (every expert resident) */
    int pos;                    /* tokens in the current sequence's cache */
    int32_t *history;           /* [n_ctx] ids in that cache (for Phi-MoE's recompute) */
    /* sequences: between calls seq_pos[cur] == pos and history is cur's */
    int n_seq, cur;
    int be_seq;                 /* the KV cache the backend has selected */
    int *seq_pos;               /* [n_seq] tokens in each sequence's cache */
    int32_t *hist_all;          /* [n_seq x n_ctx] every sequence's history */
    int *b_seq, *b_pos, *b_idx; /* [n_seq] a decode batch's rows: sequence, position, index in the call */
    int32_t *b_tok;             /* [n_seq] their tokens */
    uint8_t *b_mark;            /* [n_seq] sequences named by the call being checked */
    float *router_logits;       /* [B x n_expert] */
    float *pred_logits;         /* [n_expert] stacked-gate prediction */
    int32_t *sel;               /* [B x k] */
    float *sel_w;               /* [B x k] */
    float *xh;                  /* [B x n_embd] host copy for the observers */
    float *eout;                /* [B x n_embd] unweighted expert outputs (on_expert) */
    struct moe_expert_work *works; /* [n_expert] one layer step's works (expert_batch) */
    int *moe_of, n_moe;         /* [n_layer] MoE layer index (-1: dense); MoE layers */
    /* the routing of the run (record_trace): MoE layers only, as profiles */
    int32_t *tr_experts;
    float *tr_weights;
    int64_t tr_tokens, tr_cap;
    int32_t *tr_seq_start;
    int tr_nseq, tr_seqcap;
    /* big-little decoding (p.little_k > 0) */
    int k_cur;                  /* experts per token of the pass running now */
    int k_plain;                /* of plain passes (moe_session_set_experts; n_expert_used) */
    int bl_phase;               /* 0: a plain pass, 1: little, 2: big (a fallback) */
    int redo;                   /* the big pass re-runs the token the little pass ran */
    float *bl_logits;           /* [n_vocab] the little pass's logits when the caller wants none */
    int32_t *bl_pred;           /* [n_layer x K] top-K of the little pass's router, per MoE layer */
    float *bl_pred_w;           /* [n_layer x K] their gate weights */
    struct moe_big_little_stats bl;
    /* the model's file (moe_model_check_file): checked before the first
     * forward, then after every MOE_SESSION_CHECK_TOKENS tokens */
    int watched;                /* the first check was made */
    int since_check;            /* tokens run since the last check */
    enum moe_status file_st;    /* MOE_OK, or the failed check's status (sticky) */
    /* decode steps as one device graph (moe-graph.h; backend decode_step) */
    struct moe_ffn *g_table;    /* [n_layer x n_expert] the experts' views as the in-place store binds them */
    int g_table_k;              /* the k the table's generation was made for */
    uint64_t g_gen;             /* its generation (decode_step recaptures when it changes) */
    int g_failed;               /* the backend could not run one: op by op from then on */
    int32_t *g_sel;             /* [n_moe x K] a graph step's choices, for the trace */
    float *g_w, *g_logits;      /* [n_moe x K] their weights; [n_vocab] logits nobody asked for */
    struct moe_session_graph_stats gs;
};

/* ---- routing ---------------------------------------------------------- */

/* route_softmax_topk: softmax over experts, top-k (ties to the lower index),
 * optional renormalisation — Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2's greedy. */
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
    for (int k = 0; k < K; k++) w[k] *= c->routed_scale; /* 1 but for DeepSeek */
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

/* top_by: the k indices of the largest of score[n] not masked (mask NULL or
 * mask[i] != 0), largest first, ties to the lower index (as torch.topk). */
static void top_by(const float *score, const uint8_t *mask, int n, int k, int32_t *out) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            if (mask && !mask[e]) continue;
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= out[q] == e;
            if (!taken && (best < 0 || score[e] > score[best])) best = e;
        }
        out[j] = best;
    }
}

/* group_mask: the topk_group groups (of n_group equal groups of experts)
 * with the largest group score, as a per-expert mask. */
static void group_mask(const struct moe_config *c, const float *group_score, uint8_t *mask) {
    const int G = c->n_group, gs = c->n_expert / c->n_group;
    int32_t pick[G];
    top_by(group_score, NULL, G, c->topk_group, pick);
    memset(mask, 0, (size_t)c->n_expert);
    for (int j = 0; j < c->topk_group; j++) memset(mask + (size_t)pick[j] * gs, 1, (size_t)gs);
}

/* route_softmax_group: DeepSeek-V2's group_limited_greedy: softmax, keep the
 * topk_group groups whose best probability is largest, top-k among their
 * experts; weights are the probabilities (never renormalised) x scale. */
static void route_softmax_group(const struct moe_config *c, int K, const float *logits, int32_t *sel, float *w) {
    const int E = c->n_expert, G = c->n_group, gs = E / G;
    float probs[E], gscore[G], mx = -INFINITY, sum = 0;
    uint8_t mask[E];
    for (int e = 0; e < E; e++) mx = fmaxf(mx, logits[e]);
    for (int e = 0; e < E; e++) sum += (probs[e] = expf(logits[e] - mx));
    for (int e = 0; e < E; e++) probs[e] /= sum;
    for (int g = 0; g < G; g++) {
        gscore[g] = probs[g * gs];
        for (int i = 1; i < gs; i++) gscore[g] = fmaxf(gscore[g], probs[g * gs + i]);
    }
    group_mask(c, gscore, mask);
    top_by(probs, mask, E, K, sel);
    for (int k = 0; k < K; k++) w[k] = probs[sel[k]] * c->routed_scale;
}

/* route_sigmoid_group: DeepSeek-V3's noaux_tc: scores s = sigmoid(logit);
 * the choice uses s + e_score_correction_bias: the topk_group groups whose
 * two best choice scores sum highest, then top-k within them. The weights are
 * s (renormalised when norm_topk_prob, +1e-20 as transformers) x scale, and
 * the experts are listed by weight, largest first. */
static void route_sigmoid_group(const struct moe_config *c, const float *bias, int K, const float *logits,
                                int32_t *sel, float *w) {
    const int E = c->n_expert, G = c->n_group, gs = E / G;
    float sc[E], choice[E], gscore[G];
    uint8_t mask[E];
    for (int e = 0; e < E; e++) {
        sc[e] = 1.0f / (1.0f + expf(-logits[e]));
        choice[e] = sc[e] + (bias ? bias[e] : 0.0f);
    }
    for (int g = 0; g < G; g++) {
        int32_t two[2];
        top_by(choice + (size_t)g * gs, NULL, gs, 2, two);
        gscore[g] = choice[g * gs + two[0]] + choice[g * gs + two[1]];
    }
    group_mask(c, gscore, mask);
    top_by(choice, mask, E, K, sel);
    float ws = 0;
    for (int k = 0; k < K; k++) ws += (w[k] = sc[sel[k]]);
    for (int k = 0; k < K; k++) {
        if (c->norm_topk_prob) w[k] /= ws + 1e-20f;
        w[k] *= c->routed_scale;
    }
    for (int i = 1; i < K; i++) /* by weight, largest first (stable) */
        for (int j = i; j > 0 && w[j] > w[j - 1]; j--) {
            float tw = w[j];
            int32_t te = sel[j];
            w[j] = w[j - 1], sel[j] = sel[j - 1];
            w[j - 1] = tw, sel[j - 1] = te;
        }
}

void moe_route(const struct moe_model *m, int layer, int k, const float *logits, int32_t *experts, float *weights) {
    const struct moe_config *c = &m->cfg;
    switch (c->router) {
    case MOE_ROUTER_SPARSEMIXER: route_sparsemixer(c, k, logits, experts, weights); break;
    case MOE_ROUTER_SOFTMAX_GROUP: route_softmax_group(c, k, logits, experts, weights); break;
    case MOE_ROUTER_SIGMOID_GROUP:
        route_sigmoid_group(c, m->layers[layer].router_bias, k, logits, experts, weights);
        break;
    default: route_softmax_topk(c, k, logits, experts, weights); break;
    }
}

/* route: the router's top-K choices for n tokens of layer l from their logits. */
static void route(const struct moe_session *s, int l, int K, const float *logits, int n, int32_t *sel, float *w) {
    const int E = s->m->cfg.n_expert;
    for (int t = 0; t < n; t++) moe_route(s->m, l, K, logits + (size_t)t * E, sel + (size_t)t * K, w + (size_t)t * K);
}

/* ---- cache-aware routing ------------------------------------------------ */

struct route_ctx {
    const struct moe_store *st;
    int layer;
};

static int route_served(int e, int rank, void *user) {
    const struct route_ctx *r = user;
    return moe_store_serves(r->st, r->layer, e, rank == 0);
}

/* cache_route: a decode step's top-K of layer l (sel/w from route()) with
 * cache-aware routing: each chosen expert that no cached copy serves is
 * replaced by the most probable cached expert not chosen, if its router
 * probability is within the store's margin (moe_cache_route_pick); the
 * weights are then the router's for the new set (softmax top-k:
 * renormalised when the model does, x routed_scale), largest first. Only
 * the softmax top-k router (Mixtral, Qwen-MoE, OLMoE); a no-op otherwise. */
static void cache_route(struct moe_session *s, int l, int K, const float *logits, int32_t *sel, float *w) {
    const struct moe_config *c = &s->m->cfg;
    const double margin = moe_store_route_margin(s->store);
    if (!(margin > 0) || c->router != MOE_ROUTER_SOFTMAX_TOPK) return;
    const int E = c->n_expert;
    float probs[E], mx = -INFINITY, sum = 0;
    for (int e = 0; e < E; e++) mx = fmaxf(mx, logits[e]);
    for (int e = 0; e < E; e++) sum += (probs[e] = expf(logits[e] - mx));
    for (int e = 0; e < E; e++) probs[e] /= sum;
    struct route_ctx rc = {s->store, l};
    double mass = 0;
    const int n = moe_cache_route_pick(probs, E, sel, K, margin, route_served, &rc, &mass);
    if (!n) return;
    moe_store_count_route(s->store, n, mass);
    float ws = 0;
    for (int k = 0; k < K; k++) ws += (w[k] = probs[sel[k]]);
    for (int k = 0; k < K; k++) {
        if (c->norm_topk_prob) w[k] /= ws;
        w[k] *= c->routed_scale;
    }
    for (int i = 1; i < K; i++) /* by weight, largest first (stable) */
        for (int j = i; j > 0 && w[j] > w[j - 1]; j--) {
            const float tw = w[j];
            const int32_t te = sel[j];
            w[j] = w[j - 1], sel[j] = sel[j - 1];
            w[j - 1] = tw, sel[j - 1] = te;
        }
}

/* ---- session ---------------------------------------------------------- */


/* trace_grow: room for n more tokens' routing of every MoE layer (filled later per layer). */
static enum moe_status trace_grow(struct moe_session *s, int n) {
    const struct moe_config *c = &s->m->cfg;
    const int64_t row = (int64_t)s->n_moe * s->p.n_expert_used;
    (void)c;
    if (s->tr_tokens + n > s->tr_cap) {
        int64_t cap = s->tr_cap ? s->tr_cap : 256;
        while (cap < s->tr_tokens + n) cap *= 2;
        int32_t *e = realloc(s->tr_experts, sizeof *e * (size_t)(cap * row));
        if (!e) return MOE_ERR_NOMEM;
        s->tr_experts = e;
        float *w = realloc(s->tr_weights, sizeof *w * (size_t)(cap * row));
        if (!w) return MOE_ERR_NOMEM;
        s->tr_weights = w;
        s->tr_cap = cap;
    }
    for (int64_t i = s->tr_tokens * row; i < (s->tr_tokens + n) * row; i++) s->tr_experts[i] = -1, s->tr_weights[i] = 0;
    return MOE_OK;
}

/* trace_put: token `tok`'s choices (and weights) of K experts at MoE layer
 * ml into the trace (rows of n_expert_used: a pass with fewer leaves -1). */
static void trace_put(struct moe_session *s, int64_t tok, int ml, const int32_t *sel, const float *w, int K) {
    const int Kmax = s->p.n_expert_used;
    const int64_t at = tok * (int64_t)s->n_moe * Kmax + (int64_t)ml * Kmax;
    memcpy(s->tr_experts + at, sel, sizeof(int32_t) * (size_t)K);
    memcpy(s->tr_weights + at, w, sizeof(float) * (size_t)K);
}

/* has_batch: the backend takes a layer step's experts in one call, and no
 * observer needs their outputs one by one. */
static int has_batch(const struct moe_session *s) {
    return moe_backend_supports(s->be, MOE_BACKEND_FEAT_EXPERT_BATCH) && !s->p.on_expert;
}

/* store_step_batched: a decode step's experts from the store in as few
 * backend calls as the store allows: acquire items (waiting for their
 * loads), run them together, release them. A group holds at most
 * MOE_STORE_SCRATCH items that read into scratch (handle < 0): the store has
 * that many scratch slots, and a held one cannot be reused. */
static enum moe_status store_step_batched(struct moe_session *s, const struct moe_store_plan *plan) {
    enum moe_status st = MOE_OK;
    int first = 0, n = 0, n_scratch = 0, i = 0;
    for (; i <= plan->n_items; i++) {
        const struct moe_store_item *it = i < plan->n_items ? &plan->items[i] : NULL;
        if (it && it->skipped) continue;
        const int scratch = it && it->handle < 0 && !it->host;
        if (!it || (scratch && n_scratch == MOE_STORE_SCRATCH)) { /* run and release the group */
            st = moe_backend_expert_batch(s->be, s->works, n);
            for (int j = first; j < i; j++)
                if (!plan->items[j].skipped) moe_store_release(s->store, j);
            if (st || !it) return st;
            first = i, n = 0, n_scratch = 0;
        }
        struct moe_expert_work *wk = &s->works[n];
        if ((st = moe_store_acquire(s->store, i, &wk->f))) break;
        *wk = (struct moe_expert_work){wk->f, plan->rows + it->first, plan->slots + it->first, plan->weights + it->first,
                                       it->n, it->host, NULL};
        n++, n_scratch += scratch;
    }
    for (int j = first; j < i; j++) /* an acquire failed: release the group's held items */
        if (!plan->items[j].skipped) moe_store_release(s->store, j);
    return st;
}

/* bl_hint: big-little's prefetch for the big pass: the top-K experts the
 * little pass's router chose at MoE layer ml, `ahead` store steps from now. */
static void bl_hint(struct moe_session *s, int ml, int ahead) {
    const struct moe_config *c = &s->m->cfg;
    const int K = s->p.n_expert_used;
    for (int l = 0; l < c->n_layer; l++)
        if (s->moe_of[l] == ml) {
            moe_store_prefetch_hint(s->store, l, s->bl_pred + (size_t)ml * K, s->bl_pred_w + (size_t)ml * K, K, ahead);
            return;
        }
}

/* moe_layer: the routed experts (+ shared expert) of MoE layer l for the
 * n_tok rows at pos0: router, observers, the store's plan, the experts. One
 * path for every run: without a budget the store is in place (the model's
 * views; moe_store_new_in_place), so which copy and precision each expert
 * runs at is the store's plan's decision, and the session only acquires,
 * computes and releases. */
static enum moe_status moe_layer(struct moe_session *s, int l, int pos0, int n_tok) {
    const struct moe_config *c = &s->m->cfg;
    const int E = c->n_expert, K = s->k_cur, Kmax = s->p.n_expert_used;
    enum moe_status st;
    if ((st = moe_backend_router(s->be, l, n_tok, s->router_logits))) return st;
    route(s, l, K, s->router_logits, n_tok, s->sel, s->sel_w);
    if (s->bl_phase == 1) /* the big pass's experts, should it run: the same logits' top Kmax */
        route(s, l, Kmax, s->router_logits, 1, s->bl_pred + (size_t)s->moe_of[l] * Kmax,
              s->bl_pred_w + (size_t)s->moe_of[l] * Kmax);
    if (s->p.on_route) {
        if ((st = moe_backend_get_xn(s->be, s->xh, n_tok))) return st;
        struct moe_route_event ev = {l, pos0, n_tok, E, K, s->xh, s->router_logits, s->sel, s->sel_w};
        s->p.on_route(&ev, s->p.route_user);
    }
    if (s->p.record_trace) /* rows of Kmax; a little pass fills its K and leaves -1 */
        for (int t = 0; t < n_tok; t++)
            trace_put(s, s->tr_tokens - n_tok + t, s->moe_of[l], s->sel + (size_t)t * K, s->sel_w + (size_t)t * K, K);
    /* cache-aware routing changes what runs, after the observers and the
     * trace have seen the router's own choice (what fit-cache fits on) */
    if (n_tok == 1) cache_route(s, l, K, s->router_logits, s->sel, s->sel_w);
    struct moe_store_plan *plan;
    if ((st = moe_store_plan(s->store, l, pos0, n_tok, s->sel, s->sel_w, K, &plan))) return st;
    if (n_tok == 1 && s->budget && s->prefetch_layers > 0) { /* HOBBIT's stacked gating */
        for (int j = l + 1, ahead = 1; j < c->n_layer && ahead <= s->prefetch_layers; j++) {
            if (!c->layer_moe[j]) continue;
            int32_t psel[64];
            float pw[64];
            if ((st = moe_backend_router(s->be, j, 1, s->pred_logits))) return st;
            route(s, j, K, s->pred_logits, 1, psel, pw);
            if (moe_store_prefetch_hint(s->store, j, psel, pw, K, ahead) > 0) break; /* HOBBIT: go further
                                                               * only while the predictions are cached */
            ahead++;
        }
    }
    if (s->bl_phase == 2 && s->p.bl_prefetch_layers > 0 && s->moe_of[l] + s->p.bl_prefetch_layers < s->n_moe)
        bl_hint(s, s->moe_of[l] + s->p.bl_prefetch_layers, s->p.bl_prefetch_layers); /* MoBiLE, D layers ahead */
    /* together where the backend takes a step's experts in one call: a decode
     * step, or any step in place (nothing to wait for); a prompt batch with a
     * budget computes each expert as its read lands, overlapping the next read */
    if (has_batch(s) && (n_tok == 1 || moe_store_in_place(s->store))) {
        if ((st = store_step_batched(s, plan))) return st;
        return moe_backend_dense(s->be, l, n_tok);
    }
    for (int i = 0; i < plan->n_items; i++) {
        const struct moe_store_item *it = &plan->items[i];
        if (it->skipped) continue;
        struct moe_expert_work *wk = &s->works[0];
        if ((st = moe_store_acquire(s->store, i, &wk->f))) return st;
        *wk = (struct moe_expert_work){wk->f, plan->rows + it->first, plan->slots + it->first,
                                       plan->weights + it->first, it->n, it->host, s->p.on_expert ? s->eout : NULL};
        st = moe_backend_expert_batch(s->be, wk, 1);
        moe_store_release(s->store, i);
        if (st) return st;
        if (s->p.on_expert) {
            struct moe_expert_event ev = {l, it->expert, pos0, it->n, plan->rows + it->first,
                                          plan->weights + it->first, s->eout};
            s->p.on_expert(&ev, s->p.expert_user);
        }
    }
    return moe_backend_dense(s->be, l, n_tok);
}

static void session_free_parts(struct moe_session *s) {
    moe_store_free(s->store);
    moe_backend_free(s->be);
    free(s->hist_all);
    free(s->seq_pos);
    free(s->b_seq);
    free(s->b_pos);
    free(s->b_idx);
    free(s->b_tok);
    free(s->b_mark);
    free(s->router_logits);
    free(s->pred_logits);
    free(s->sel);
    free(s->sel_w);
    free(s->xh);
    free(s->eout);
    free(s->works);
    free(s->moe_of);
    free(s->tr_experts);
    free(s->tr_weights);
    free(s->tr_seq_start);
    free(s->bl_logits);
    free(s->bl_pred);
    free(s->bl_pred_w);
    free(s->g_table);
    free(s->g_sel);
    free(s->g_w);
    free(s->g_logits);
}

/* zalloc: zeroed array of n items (at least one, so a zero count is not a failure). */
static void *zalloc(size_t n, size_t size) { return calloc(n ? n : 1, size); }

/* make_backend: s->be from backend_new when the caller gives one, else from
 * the registry by the device spec (NULL: the CPU backend). */
static enum moe_status make_backend(struct moe_session *s, const struct moe_model *model,
                                    const struct moe_backend_params *bp) {
    if (s->p.backend_new) {
        enum moe_status st = s->p.backend_new(model, bp, s->p.backend_user, &s->be);
        if (!st && (st = moe_backend_check(s->be))) {
            moe_backend_free(s->be);
            s->be = NULL;
        }
        return st;
    }
    char name[32], err[200];
    int index = 0;
    if (moe_backend_parse_device(s->p.device ? s->p.device : "cpu", name, sizeof name, &index, err, sizeof err)) {
        MOE_LOGE("%s", err);
        return MOE_ERR_INVALID;
    }
    return moe_backend_init_by_name(name, index, model, bp, s->p.device_options, &s->be);
}

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
    if (s->p.n_expert_used > c->n_expert || s->p.n_expert_used > 64 ||
        (c->router == MOE_ROUTER_SPARSEMIXER && s->p.n_expert_used > 2)) {
        MOE_LOGE("%d experts per token requested; the model routes to at most %d", s->p.n_expert_used,
                 c->router == MOE_ROUTER_SPARSEMIXER ? 2 : c->n_expert < 64 ? c->n_expert : 64);
        free(s);
        return MOE_ERR_INVALID;
    }
    if (s->p.little_k < 0 || (s->p.little_k > 0 && s->p.little_k >= s->p.n_expert_used) ||
        !(s->p.gamma >= 0 && s->p.gamma <= 1) || s->p.bl_prefetch_layers < 0) {
        MOE_LOGE("big-little: the little model's experts per token must be in [1, %d) (got %d), gamma in [0, 1] "
                 "(got %g), prefetch layers >= 0 (got %d)", s->p.n_expert_used, s->p.little_k, s->p.gamma,
                 s->p.bl_prefetch_layers);
        free(s);
        return MOE_ERR_INVALID;
    }
    if (s->p.n_seq < 0 || s->p.n_seq > MOE_SESSION_MAX_SEQ) {
        MOE_LOGE("%d sequences requested; a session holds 1 .. %d", s->p.n_seq, MOE_SESSION_MAX_SEQ);
        free(s);
        return MOE_ERR_INVALID;
    }
    s->n_seq = s->p.n_seq > 1 ? s->p.n_seq : 1;
    if (s->n_seq > 1 && (s->p.record_trace || s->p.on_route || s->p.on_expert || s->p.on_layer)) {
        /* their events describe one sequence's contiguous positions */
        MOE_LOGE("%d sequences: record_trace and the observers (on_route, on_expert, on_layer) need one sequence",
                 s->n_seq);
        free(s);
        return MOE_ERR_INVALID;
    }
    s->k_cur = s->k_plain = s->p.n_expert_used;
    const int64_t B = s->p.n_batch, H = c->n_embd, K = s->p.n_expert_used;
    struct moe_backend_params bp = {s->p.n_ctx, s->p.n_batch, s->p.n_threads, (int)K, s->n_seq};
    enum moe_status st = make_backend(s, model, &bp);
    if (st) {
        free(s);
        return st;
    }
    if (s->n_seq > 1 && !moe_backend_supports(s->be, MOE_BACKEND_FEAT_KV_SEQ)) {
        MOE_LOGE("backend \"%s\" keeps one KV cache (no kv_seq): a session on it holds one sequence, not %d",
                 moe_backend_name(s->be), s->n_seq);
        moe_backend_free(s->be);
        free(s);
        return MOE_ERR_UNSUPPORTED;
    }
    if (moe_backend_cpu_threads(s->be) > 0) s->p.n_threads = moe_backend_cpu_threads(s->be);
    int ok = 1;
#define ALLOC(ptr, count) ok &= ((ptr) = zalloc((size_t)(count), sizeof *(ptr))) != NULL
    ALLOC(s->hist_all, (int64_t)s->n_seq * s->p.n_ctx);
    ALLOC(s->seq_pos, s->n_seq);
    ALLOC(s->b_seq, s->n_seq);
    ALLOC(s->b_pos, s->n_seq);
    ALLOC(s->b_idx, s->n_seq);
    ALLOC(s->b_tok, s->n_seq);
    ALLOC(s->b_mark, s->n_seq);
    ALLOC(s->router_logits, B * c->n_expert);
    ALLOC(s->pred_logits, c->n_expert);
    ALLOC(s->sel, B * K);
    ALLOC(s->sel_w, B * K);
    ALLOC(s->xh, B * H);
    ALLOC(s->eout, B * H);
    ALLOC(s->works, c->n_expert > K ? c->n_expert : K);
    ALLOC(s->moe_of, c->n_layer);
    if (s->p.little_k > 0) {
        ALLOC(s->bl_logits, c->n_vocab);
        ALLOC(s->bl_pred, (int64_t)c->n_layer * K);
        ALLOC(s->bl_pred_w, (int64_t)c->n_layer * K);
    }
#undef ALLOC
    if (!ok) {
        session_free_parts(s);
        free(s);
        return MOE_ERR_NOMEM;
    }
    s->history = s->hist_all;
    for (int l = 0; l < c->n_layer; l++) s->moe_of[l] = c->layer_moe[l] ? s->n_moe++ : -1;
    { /* with a budget the store reads copies into it; without one it works in place */
        struct moe_store_params sp = s->p.store ? *s->p.store : moe_store_default_params();
        if (sp.prefetch_slots < 0 && s->p.little_k > 0 && s->p.bl_prefetch_layers > 0)
            sp.prefetch_slots = 1; /* big-little's hints need a prefetch slot */
        if ((st = s->p.store ? moe_store_new(model, s->be, &sp, (int)K, &s->store)
                             : moe_store_new_in_place(model, s->be, (int)K, (int)B, &s->store))) {
            session_free_parts(s);
            free(s);
            return st;
        }
        s->budget = s->p.store != NULL, s->prefetch_layers = sp.prefetch_layers;
        s->p.store = NULL; /* borrowed for this call only */
    }
    *out = s;
    return MOE_OK;
}

void moe_session_free(struct moe_session *s) {
    if (!s) return;
    session_free_parts(s);
    free(s);
}

void moe_session_reset(struct moe_session *s) {
    memset(s->seq_pos, 0, sizeof(int) * (size_t)s->n_seq);
    s->pos = 0;
}
int moe_session_pos(const struct moe_session *s) { return s->cur == 0 ? s->pos : s->seq_pos[0]; }
int moe_session_n_ctx(const struct moe_session *s) { return s->p.n_ctx; }
int moe_session_n_seq(const struct moe_session *s) { return s->n_seq; }

int moe_session_seq_pos(const struct moe_session *s, int seq) {
    if (seq < 0 || seq >= s->n_seq) return -1;
    return seq == s->cur ? s->pos : s->seq_pos[seq];
}

void moe_session_seq_reset(struct moe_session *s, int seq) {
    if (seq < 0 || seq >= s->n_seq) {
        MOE_LOGE("sequence %d to reset; the session holds 0 .. %d", seq, s->n_seq - 1);
        return;
    }
    s->seq_pos[seq] = 0;
    if (seq == s->cur) s->pos = 0;
}

enum moe_status moe_session_seq_truncate(struct moe_session *s, int seq, int pos) {
    const int len = moe_session_seq_pos(s, seq);
    if (len < 0 || pos < 0 || pos > len) {
        MOE_LOGE("truncating sequence %d to %d tokens: the session holds sequences 0 .. %d%s", seq, pos,
                 s->n_seq - 1, len >= 0 ? " and that one is shorter" : "");
        return MOE_ERR_INVALID;
    }
    if (pos == len) return MOE_OK;
    const struct moe_rope *r = &s->m->cfg.rope;
    if (s->p.record_trace || (r->has_mscale && len > r->original_max_pos && pos <= r->original_max_pos))
        return MOE_ERR_UNSUPPORTED;
    if (seq == s->cur)
        s->pos = pos;
    else
        s->seq_pos[seq] = pos;
    return MOE_OK;
}

/* select_seq: make seq the current sequence (s->pos, s->history) and its KV
 * cache the backend's. */
static enum moe_status select_seq(struct moe_session *s, int seq) {
    if (seq != s->cur) {
        s->seq_pos[s->cur] = s->pos;
        s->cur = seq;
        s->pos = s->seq_pos[seq];
        s->history = s->hist_all + (size_t)seq * (size_t)s->p.n_ctx;
    }
    if (seq == s->be_seq) return MOE_OK;
    enum moe_status st = moe_backend_kv_seq(s->be, seq);
    if (!st) s->be_seq = seq;
    return st;
}

/* all_empty: no sequence but perhaps the current one holds tokens, and it
 * none: a new run starts for the store's per-sequence records. */
static int all_empty(const struct moe_session *s) {
    for (int i = 0; i < s->n_seq; i++)
        if (i != s->cur && s->seq_pos[i] > 0) return 0;
    return s->pos == 0;
}

/* begin_chunk: bookkeeping before n tokens at s->pos run: a new sequence for
 * the store and the trace when the cache is empty, trace rows. */
static enum moe_status begin_chunk(struct moe_session *s, int n) {
    if (s->redo) { /* big-little's big pass: the same token again, its trace row rewritten */
        if (s->p.record_trace) s->tr_tokens -= n;
        goto rows;
    }
    if (s->pos == 0 && s->store && all_empty(s)) moe_store_begin_sequence(s->store);
    if (s->store) moe_store_count_tokens(s->store, n, n == 1);
    if (!s->p.record_trace) return MOE_OK;
    if (s->pos == 0) {
        if (s->tr_nseq + 2 > s->tr_seqcap) {
            int cap = s->tr_seqcap ? 2 * s->tr_seqcap : 16;
            int32_t *q = realloc(s->tr_seq_start, sizeof *q * (size_t)cap);
            if (!q) return MOE_ERR_NOMEM;
            s->tr_seq_start = q;
            s->tr_seqcap = cap;
        }
        if (s->tr_nseq == 0) s->tr_seq_start[0] = 0;
        else if (s->tr_seq_start[s->tr_nseq - 1] == (int32_t)s->tr_tokens) s->tr_nseq--; /* drop an empty one */
        s->tr_nseq++;
    }
rows:
    if (!s->p.record_trace) return MOE_OK;
    enum moe_status st = trace_grow(s, n);
    if (st) return st;
    s->tr_tokens += n;
    s->tr_seq_start[s->tr_nseq] = (int32_t)s->tr_tokens;
    return MOE_OK;
}

/* layers_chunk: layers [l0, n_layer) and the LM head for the n_tok rows of
 * the backend's residual stream at s->pos; logits for chunk rows
 * [row_from, n_tok) go to `logits` (row_from >= n_tok: none). */
static enum moe_status layers_chunk(struct moe_session *s, int l0, const int32_t *tokens, int n_tok, int seq_len,
                                    float *logits, int row_from) {
    const struct moe_config *c = &s->m->cfg;
    const int pos0 = s->pos;
    enum moe_status st;
    if ((st = begin_chunk(s, n_tok))) return st;
    for (int t = 0; t < n_tok; t++) s->history[pos0 + t] = tokens[t];
    for (int l = l0; l < c->n_layer; l++) {
        if (s->p.on_layer) {
            if ((st = moe_backend_get_x(s->be, s->xh, n_tok))) return st;
            struct moe_layer_event ev = {l, pos0, n_tok, s->xh};
            s->p.on_layer(&ev, s->p.layer_user);
        }
        if ((st = moe_backend_attention(s->be, l, pos0, n_tok, seq_len))) return st;
        if ((st = moe_backend_ffn_norm(s->be, l, n_tok))) return st;
        if (c->layer_moe[l]) st = moe_layer(s, l, pos0, n_tok);
        else st = moe_backend_dense(s->be, l, n_tok);
        if (st || (st = moe_backend_residual(s->be, n_tok))) return st;
    }
    if (s->p.on_layer) {
        if ((st = moe_backend_get_x(s->be, s->xh, n_tok))) return st;
        struct moe_layer_event ev = {c->n_layer, pos0, n_tok, s->xh};
        s->p.on_layer(&ev, s->p.layer_user);
    }
    s->pos += n_tok;
    if (row_from >= n_tok) return MOE_OK;
    return moe_backend_lm_head(s->be, row_from, n_tok - row_from, logits);
}

/* top_prob: the largest probability of softmax(logits), in double. */
static double top_prob(const float *l, int V) {
    float mx = l[0];
    for (int i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)l[i] - mx);
    return 1.0 / sum;
}

/* big_little: MoBiLE's step for one token at s->pos (embedding not yet
 * done): the little pass; if its top probability is below gamma, the big
 * pass at the same position (its keys and values overwrite the little
 * pass's), prefetching from the little pass's router. The accepted pass's
 * logits go to dst (NULL: not wanted). */
static enum moe_status big_little(struct moe_session *s, const int32_t *tok, int seq_len, float *dst) {
    float *lg = dst ? dst : s->bl_logits;
    enum moe_status st;
    double t0 = moe_now_s();
    s->k_cur = s->p.little_k, s->bl_phase = 1;
    st = moe_backend_embed(s->be, tok, 1);
    if (!st) st = layers_chunk(s, 0, tok, 1, seq_len, lg, 0);
    s->k_cur = s->k_plain, s->bl_phase = 0;
    if (st) return st;
    s->bl.tokens++;
    const int fall = s->p.gamma >= 1 || top_prob(lg, s->m->cfg.n_vocab) < s->p.gamma;
    double t1 = moe_now_s();
    s->bl.little_s += t1 - t0;
    if (!fall) return MOE_OK;
    s->bl.fallbacks++;
    s->pos--;
    if (s->budget) /* the first MoE layers' experts, before the big pass starts */
        for (int ml = 0; ml < s->n_moe && ml < s->p.bl_prefetch_layers; ml++) bl_hint(s, ml, ml + 1);
    s->bl_phase = 2, s->redo = 1, s->k_cur = s->p.n_expert_used;
    st = moe_backend_embed(s->be, tok, 1);
    if (!st) st = layers_chunk(s, 0, tok, 1, seq_len, lg, 0);
    s->bl_phase = 0, s->redo = 0, s->k_cur = s->k_plain;
    s->bl.big_s += moe_now_s() - t1;
    return st;
}

/* graph_table: the experts' views for decode_step, as the in-place store
 * binds them (moe_model_expert at the bound precision), made once. */
static enum moe_status graph_table(struct moe_session *s) {
    const struct moe_config *c = &s->m->cfg;
    const int K = s->p.n_expert_used;
    if (!s->g_table) {
        s->g_table = calloc((size_t)c->n_layer * (size_t)c->n_expert, sizeof *s->g_table);
        s->g_sel = calloc((size_t)(s->n_moe ? s->n_moe : 1) * (size_t)K, sizeof *s->g_sel);
        s->g_w = calloc((size_t)(s->n_moe ? s->n_moe : 1) * (size_t)K, sizeof *s->g_w);
        s->g_logits = malloc(sizeof *s->g_logits * (size_t)c->n_vocab);
        if (!s->g_table || !s->g_sel || !s->g_w || !s->g_logits) return MOE_ERR_NOMEM;
        for (int l = 0; l < c->n_layer; l++)
            for (int e = 0; c->layer_moe[l] && e < c->n_expert; e++) {
                enum moe_status st = moe_model_expert(s->m, l, e, -1, &s->g_table[(size_t)l * c->n_expert + e]);
                if (st) return st;
            }
        s->g_gen++;
    }
    if (s->g_table_k != s->k_cur) s->g_table_k = s->k_cur, s->g_gen++;
    return MOE_OK;
}

/* graph_step: a forward of one token as the backend's decode_step when
 * moe_graph_decide allows; *ran = 0 leaves it to the op-by-op path (the
 * session untouched). The trace gets the device's choices. */
static enum moe_status graph_step(struct moe_session *s, const int32_t *tok, int n_forward, float *dst, int *ran) {
    const struct moe_config *c = &s->m->cfg;
    *ran = 0;
    struct moe_graph_inputs in = {c,
                                  !s->p.no_graphs,
                                  moe_backend_supports(s->be, MOE_BACKEND_FEAT_GRAPH),
                                  n_forward,
                                  s->k_cur,
                                  s->budget,
                                  s->p.on_layer || s->p.on_route || s->p.on_expert,
                                  s->p.little_k,
                                  1,
                                  s->g_failed};
    enum moe_graph_why why = moe_graph_decide(&in);
    s->gs.last_why = (int)why;
    if (why != MOE_GRAPH_OK) return MOE_OK;
    enum moe_status st = graph_table(s);
    if (st) return st;
    const struct moe_step_desc d = {s->k_cur, s->g_table, s->g_gen};
    st = moe_backend_decode_step(s->be, &d, tok[0], s->pos, dst ? dst : s->g_logits, s->g_sel, s->g_w);
    if (st == MOE_ERR_UNSUPPORTED) { /* logged by the backend: op by op from now on */
        s->g_failed = 1;
        s->gs.last_why = MOE_GRAPH_FAILED;
        return MOE_OK;
    }
    if (st) return st;
    if ((st = begin_chunk(s, 1))) return st;
    s->history[s->pos] = tok[0];
    for (int ml = 0; s->p.record_trace && ml < s->n_moe; ml++)
        trace_put(s, s->tr_tokens - 1, ml, s->g_sel + (size_t)ml * s->k_cur, s->g_w + (size_t)ml * s->k_cur, s->k_cur);
    s->pos++;
    s->gs.steps_graph++;
    *ran = 1;
    return MOE_OK;
}

void moe_session_graph_stats(const struct moe_session *s, struct moe_session_graph_stats *out) {
    *out = s->gs;
    out->graph_ops = moe_graph_plan(&s->m->cfg, NULL, 0);
}

/* run_tokens: process n tokens at s->pos in chunks; logits rows [row_from, n)
 * go to `logits` (row row_from first). With big-little on, a chunk of one
 * token is a big-little step. */
static enum moe_status run_tokens(struct moe_session *s, const int32_t *tokens, int n, float *logits, int row_from) {
    const size_t V = (size_t)s->m->cfg.n_vocab;
    const int seq_len = s->pos + n;
    enum moe_status st;
    for (int done = 0; done < n;) {
        int chunk = n - done < s->p.n_batch ? n - done : s->p.n_batch;
        int from = row_from > done ? row_from - done : 0; /* first row wanted in this chunk */
        float *dst = from < chunk ? logits + (size_t)(done + from - row_from) * V : NULL;
        int ran = 0;
        if (chunk == 1 && (st = graph_step(s, tokens + done, n, dst, &ran))) return st;
        if (chunk == 1 && !ran) s->gs.steps_plain++;
        if (ran) {
        } else if (chunk == 1 && s->p.little_k > 0) {
            if ((st = big_little(s, tokens + done, seq_len, dst))) return st;
        } else {
            if ((st = moe_backend_embed(s->be, tokens + done, chunk))) return st;
            if ((st = layers_chunk(s, 0, tokens + done, chunk, seq_len, dst, from))) return st;
        }
        done += chunk;
    }
    return MOE_OK;
}

/* watch: count n tokens run and check the model's file when the session's
 * first forward starts and once MOE_SESSION_CHECK_TOKENS tokens have run
 * since the last check (one fstat and one stat: about a microsecond every 64
 * tokens). A failed check is sticky: every later forward returns it. */
static enum moe_status watch(struct moe_session *s, int n) {
    if (s->file_st) return s->file_st;
    s->since_check += n;
    if (s->watched && s->since_check < MOE_SESSION_CHECK_TOKENS) return MOE_OK;
    s->watched = 1, s->since_check = 0;
    return s->file_st = moe_model_check_file(s->m);
}

/* watched_run: the status of a forward's work, then the check after it
 * (watch), so logits computed from a file that changed meanwhile are not
 * handed out as good. */
static enum moe_status watched_run(struct moe_session *s, int n, enum moe_status st) {
    if (st && !s->file_st) s->file_st = moe_model_check_file(s->m); /* a read failed: was it the file? (sticky) */
    return st ? st : watch(s, n);
}

/* forward_cur: moe_session_forward on the current sequence. */
static enum moe_status forward_cur(struct moe_session *s, const int32_t *tokens, int n, float *logits,
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
    enum moe_status wst = watch(s, 0);
    if (wst) return wst;
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
        enum moe_status st = run_tokens(s, all, total, logits, !logits ? total : all_logits ? old : total - 1);
        free(all);
        return watched_run(s, total, st);
    }
    return watched_run(s, n, run_tokens(s, tokens, n, logits, !logits ? n : all_logits ? 0 : n - 1));
}

enum moe_status moe_session_forward_seq(struct moe_session *s, int seq, const int32_t *tokens, int n, float *logits,
                                        int all_logits) {
    if (seq < 0 || seq >= s->n_seq) {
        MOE_LOGE("sequence %d; the session holds 0 .. %d", seq, s->n_seq - 1);
        return MOE_ERR_INVALID;
    }
    enum moe_status st = select_seq(s, seq);
    if (!st) st = forward_cur(s, tokens, n, logits, all_logits);
    s->seq_pos[seq] = s->pos;
    return st;
}

enum moe_status moe_session_forward(struct moe_session *s, const int32_t *tokens, int n, float *logits,
                                    int all_logits) {
    return moe_session_forward_seq(s, 0, tokens, n, logits, all_logits);
}

/* attend_rows: layer l's attention for the m rows of a decode batch (b_seq,
 * b_pos), each in its own sequence's cache: in one backend call where it
 * has attention_multi, else row by row through the host (kv_seq, set_x of
 * the row, attention, get_x), which gives each row what attention() on it
 * alone gives. */
static enum moe_status attend_rows(struct moe_session *s, int l, int m) {
    if (moe_backend_supports(s->be, MOE_BACKEND_FEAT_ATTENTION_MULTI))
        return moe_backend_attention_multi(s->be, l, s->b_seq, s->b_pos, m);
    const size_t H = (size_t)s->m->cfg.n_embd;
    enum moe_status st = moe_backend_get_x(s->be, s->xh, m);
    for (int j = 0; !st && j < m; j++) {
        if ((st = moe_backend_kv_seq(s->be, s->b_seq[j]))) break;
        s->be_seq = s->b_seq[j];
        if (!(st = moe_backend_set_x(s->be, s->xh + j * H, 1)) &&
            !(st = moe_backend_attention(s->be, l, s->b_pos[j], 1, s->b_pos[j] + 1)))
            st = moe_backend_get_x(s->be, s->xh + j * H, 1);
    }
    return st ? st : moe_backend_set_x(s->be, s->xh, m);
}

/* batch_step: one decode step of the m (2 .. n_batch) rows idx[0..m) of a
 * decode_batch call (ascending): row j is sequence seqs[idx[j]]'s token
 * tokens[idx[j]] at that sequence's position. Every layer but the attention
 * runs the m rows as one batch: the store plans each layer's experts once
 * for all of them. Logits rows go to logits + idx[j] x n_vocab (NULL: none). */
static enum moe_status batch_step(struct moe_session *s, const int *idx, int m, const int *seqs,
                                  const int32_t *tokens, float *logits) {
    const struct moe_config *c = &s->m->cfg;
    const size_t V = (size_t)c->n_vocab;
    enum moe_status st;
    s->seq_pos[s->cur] = s->pos;
    int top = 0, empty = 1;
    for (int i = 0; i < s->n_seq; i++) empty &= s->seq_pos[i] == 0;
    for (int j = 0; j < m; j++) {
        s->b_seq[j] = seqs[idx[j]], s->b_tok[j] = tokens[idx[j]], s->b_pos[j] = s->seq_pos[s->b_seq[j]];
        s->hist_all[(size_t)s->b_seq[j] * (size_t)s->p.n_ctx + (size_t)s->b_pos[j]] = s->b_tok[j];
        top = s->b_pos[j] > top ? s->b_pos[j] : top;
    }
    if (s->store && empty) moe_store_begin_sequence(s->store);
    if (s->store) moe_store_count_tokens(s->store, m, 1);
    /* the store's step index: as a batch of m tokens ending at the longest sequence's */
    const int pos0 = top + 1 - m > 0 ? top + 1 - m : 0;
    if ((st = moe_backend_embed(s->be, s->b_tok, m))) return st;
    for (int l = 0; l < c->n_layer; l++) {
        if ((st = attend_rows(s, l, m))) return st;
        if ((st = moe_backend_ffn_norm(s->be, l, m))) return st;
        if (c->layer_moe[l]) st = moe_layer(s, l, pos0, m);
        else st = moe_backend_dense(s->be, l, m);
        if (st || (st = moe_backend_residual(s->be, m))) return st;
    }
    for (int j = 0; j < m; j++) s->seq_pos[s->b_seq[j]]++;
    s->pos = s->seq_pos[s->cur];
    for (int j = 0; logits && j < m;) { /* the LM head over runs of rows whose logits are adjacent */
        int e = j + 1;
        while (e < m && idx[e] == idx[e - 1] + 1) e++;
        if ((st = moe_backend_lm_head(s->be, j, e - j, logits + (size_t)idx[j] * V))) return st;
        j = e;
    }
    return MOE_OK;
}

enum moe_status moe_session_decode_batch(struct moe_session *s, const int *seqs, const int32_t *tokens, int n,
                                         float *logits) {
    const struct moe_config *c = &s->m->cfg;
    const size_t V = (size_t)c->n_vocab;
    if (n < 1 || n > s->n_seq) {
        MOE_LOGE("a decode batch of %d sequences; the session holds %d", n, s->n_seq);
        return MOE_ERR_INVALID;
    }
    memset(s->b_mark, 0, (size_t)s->n_seq);
    for (int i = 0; i < n; i++) {
        if (seqs[i] < 0 || seqs[i] >= s->n_seq || s->b_mark[seqs[i]]) {
            MOE_LOGE("decode batch row %d: sequence %d is %s", i, seqs[i],
                     seqs[i] < 0 || seqs[i] >= s->n_seq ? "out of range" : "named twice");
            return MOE_ERR_INVALID;
        }
        s->b_mark[seqs[i]] = 1;
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab) {
            MOE_LOGE("token id %d at index %d is outside the vocabulary [0, %d)", tokens[i], i, c->n_vocab);
            return MOE_ERR_INVALID;
        }
    }
    for (int i = 0; i < n; i++)
        if (moe_session_seq_pos(s, seqs[i]) >= s->p.n_ctx) {
            MOE_LOGE("context full: sequence %d holds %d tokens, the context %d", seqs[i],
                     moe_session_seq_pos(s, seqs[i]), s->p.n_ctx);
            return MOE_ERR_RANGE;
        }
    if (n == 1) return moe_session_forward_seq(s, seqs[0], tokens, 1, logits, 0);
    enum moe_status st = watch(s, 0);
    if (st) return st;
    /* rows that run alone: big-little decides (and may re-run) each token by
     * itself; Phi-MoE's longrope recomputes a sequence reaching its original
     * context (moe_session_forward) */
    const struct moe_rope *r = &c->rope;
    int nb = 0;
    for (int i = 0; i < n; i++) {
        const int p = moe_session_seq_pos(s, seqs[i]);
        if (s->p.little_k > 0 || (r->has_mscale && p > 0 && p == r->original_max_pos)) {
            if ((st = moe_session_forward_seq(s, seqs[i], tokens + i, 1, logits ? logits + (size_t)i * V : NULL, 0)))
                return st;
        } else {
            s->b_idx[nb++] = i;
        }
    }
    if (nb == 1)
        return moe_session_forward_seq(s, seqs[s->b_idx[0]], tokens + s->b_idx[0], 1,
                                       logits ? logits + (size_t)s->b_idx[0] * V : NULL, 0);
    for (int done = 0; !st && done < nb; done += s->p.n_batch) {
        const int m = nb - done < s->p.n_batch ? nb - done : s->p.n_batch;
        if (m == 1) /* the last of more rows than n_batch */
            st = moe_session_forward_seq(s, seqs[s->b_idx[done]], tokens + s->b_idx[done], 1,
                                         logits ? logits + (size_t)s->b_idx[done] * V : NULL, 0);
        else
            st = watched_run(s, m, batch_step(s, s->b_idx + done, m, seqs, tokens, logits));
    }
    return st;
}

/* forward_from_cur: moe_session_forward_from on the current sequence. */
static enum moe_status forward_from_cur(struct moe_session *s, int layer, const int32_t *tokens, const float *x, int n,
                                        float *logits, int all_logits) {
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
    enum moe_status st = watch(s, 0);
    if (st) return st;
    for (int done = 0; done < n;) {
        int chunk = n - done < s->p.n_batch ? n - done : s->p.n_batch;
        int from = row_from > done ? row_from - done : 0;
        float *dst = from < chunk ? logits + (size_t)(done + from - row_from) * V : NULL;
        if ((st = moe_backend_set_x(s->be, x + (size_t)done * H, chunk))) return st;
        if ((st = layers_chunk(s, layer, tokens + done, chunk, seq_len, dst, from))) return watched_run(s, n, st);
        done += chunk;
    }
    return watch(s, n);
}

enum moe_status moe_session_forward_from(struct moe_session *s, int layer, const int32_t *tokens,
                                         const float *x, int n, float *logits, int all_logits) {
    enum moe_status st = select_seq(s, 0);
    if (!st) st = forward_from_cur(s, layer, tokens, x, n, logits, all_logits);
    s->seq_pos[0] = s->pos;
    return st;
}

enum moe_status moe_session_lm_head(struct moe_session *s, const float *x, int n, float *logits) {
    const struct moe_config *c = &s->m->cfg;
    const size_t H = (size_t)c->n_embd, V = (size_t)c->n_vocab;
    enum moe_status st;
    for (int done = 0; done < n;) {
        int chunk = n - done < s->p.n_batch ? n - done : s->p.n_batch;
        if ((st = moe_backend_lm_head_rows(s->be, x + (size_t)done * H, chunk, logits + (size_t)done * V)))
            return st;
        done += chunk;
    }
    return MOE_OK;
}

enum moe_status moe_session_ffn(struct moe_session *s, const struct moe_ffn *f, const float *x, float *y, int n) {
    const struct moe_config *c = &s->m->cfg;
    const size_t H = (size_t)c->n_embd;
    int64_t max_ff = c->n_ff_expert > c->n_ff_dense ? c->n_ff_expert : c->n_ff_dense; /* as the backend's scratch */
    if (c->n_ff_shared > max_ff) max_ff = c->n_ff_shared;
    if (f->gate.n_in != (int64_t)H || f->down.n_out != (int64_t)H || f->gate.n_out > max_ff) {
        MOE_LOGE("feed-forward of [%lld x %lld] does not fit this model's hidden size %zu",
                 (long long)f->gate.n_out, (long long)f->gate.n_in, H);
        return MOE_ERR_SHAPE;
    }
    enum moe_status st;
    for (int done = 0; done < n;) {
        int chunk = n - done < s->p.n_batch ? n - done : s->p.n_batch;
        if ((st = moe_backend_ffn_rows(s->be, f, x + (size_t)done * H, y + (size_t)done * H, chunk))) return st;
        done += chunk;
    }
    return MOE_OK;
}

const struct moe_store *moe_session_store(const struct moe_session *s) {
    return moe_store_in_place(s->store) ? NULL : s->store; /* NULL: every expert resident */
}
const struct moe_backend *moe_session_backend(const struct moe_session *s) { return s->be; }

enum moe_status moe_session_set_experts(struct moe_session *s, int k) {
    if (k < 1 || k > s->p.n_expert_used) {
        MOE_LOGE("%d experts per token: the session was made for 1 .. %d", k, s->p.n_expert_used);
        return MOE_ERR_INVALID;
    }
    s->k_plain = s->k_cur = k;
    return MOE_OK;
}

void moe_session_big_little_stats(const struct moe_session *s, struct moe_big_little_stats *out) { *out = s->bl; }

size_t moe_session_kv_bytes(const struct moe_session *s) {
    return moe_backend_kv_cache_bytes(s->be);
}

enum moe_status moe_session_trace(const struct moe_session *s, struct moe_session_trace *out) {
    memset(out, 0, sizeof *out);
    if (!s->p.record_trace) return MOE_ERR_INVALID;
    out->n_layers = s->n_moe;
    out->k = s->p.n_expert_used;
    out->n_tokens = s->tr_tokens;
    out->n_seq = s->tr_nseq;
    out->seq_start = s->tr_seq_start;
    out->experts = s->tr_experts;
    out->weights = s->tr_weights;
    return MOE_OK;
}

/*
 * test-graph-plan.c - decode steps as one device graph, host side (moe-graph.h;
 * the session's graph path; backend member decode_step), on a machine without
 * a GPU:
 *   - moe_graph_decide: each reason in its order (off, no backend member,
 *     prompt, budget, observer, big-little, router kind, shape, batch,
 *     failed), and OK when nothing stands in the way;
 *   - moe_graph_plan: the graph's operations per layer kind (MoE, MoE with a
 *     gated shared expert, dense), counted and written alike, truncation at
 *     cap, names;
 *   - the session with a test backend whose decode_step runs the step op by
 *     op on the CPU reference backend, routing with moe_route as a device
 *     routing kernel must: on OLMoE, Qwen2-MoE (gated shared expert), a
 *     Qwen3-MoE with dense layers and Phi-MoE (sparsemixer), one-token
 *     forwards go through decode_step and give the plain CPU run's logits bit
 *     for bit, the same trace and the same position; prompts, a budget-free
 *     run with an observer, big-little and no_graphs stay op by op with their
 *     reason counted; a decode_step that answers MOE_ERR_UNSUPPORTED is not
 *     asked again and the run stays correct; a changed top-k makes a new
 *     table generation; DeepSeek-V2's group router is refused by reason.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-backend.h"
#include "moe-graph.h"
#include "moe-model.h"
#include "moe-session.h"
#include "moe-test-log.h"
#include "moe-test.h"

/* ---- the decision ---------------------------------------------------------- */

static void decide(void) {
    struct moe_config c;
    memset(&c, 0, sizeof c);
    c.n_expert = 64, c.n_expert_used = 8, c.router = MOE_ROUTER_SOFTMAX_TOPK;
    struct moe_graph_inputs ok = {&c, 1, 1, 1, 8, 0, 0, 0, 1, 0};
    CHECK(moe_graph_decide(&ok) == MOE_GRAPH_OK, "a resident one-token step with nothing watching: a graph");
    struct moe_graph_inputs in = ok;
    in.enabled = 0, in.backend_can = 0, in.n_tok = 5;
    CHECK(moe_graph_decide(&in) == MOE_GRAPH_OFF, "off is named first");
    in.enabled = 1;
    CHECK(moe_graph_decide(&in) == MOE_GRAPH_BACKEND, "then the backend");
    in.backend_can = 1;
    CHECK(moe_graph_decide(&in) == MOE_GRAPH_PROMPT, "then a prompt chunk");
    in = ok, in.budget = 1, in.observers = 1;
    CHECK(moe_graph_decide(&in) == MOE_GRAPH_BUDGET, "a budget");
    in.budget = 0;
    CHECK(moe_graph_decide(&in) == MOE_GRAPH_OBSERVER, "an observer");
    in = ok, in.little_k = 4;
    CHECK(moe_graph_decide(&in) == MOE_GRAPH_BIG_LITTLE, "big-little");
    in = ok, in.n_rows_batch = 3;
    CHECK(moe_graph_decide(&in) == MOE_GRAPH_BATCH, "a multi-sequence batch");
    in = ok, in.failed = 1;
    CHECK(moe_graph_decide(&in) == MOE_GRAPH_FAILED, "a failed capture");
    c.router = MOE_ROUTER_SIGMOID_GROUP;
    CHECK(moe_graph_decide(&ok) == MOE_GRAPH_ROUTER, "DeepSeek-V3's router");
    c.router = MOE_ROUTER_SOFTMAX_GROUP;
    CHECK(moe_graph_decide(&ok) == MOE_GRAPH_ROUTER, "DeepSeek-V2's router");
    c.router = MOE_ROUTER_SPARSEMIXER;
    in = ok, in.k = 2;
    CHECK(moe_graph_decide(&in) == MOE_GRAPH_OK, "sparsemixer top-2");
    in.k = 3;
    CHECK(moe_graph_decide(&in) == MOE_GRAPH_SHAPE, "sparsemixer takes at most two");
    c.router = MOE_ROUTER_SOFTMAX_TOPK, c.n_expert = 257;
    CHECK(moe_graph_decide(&ok) == MOE_GRAPH_SHAPE, "more experts than the routing kernel holds");
    c.n_expert = 256;
    CHECK(moe_graph_decide(&ok) == MOE_GRAPH_OK, "256 experts (DeepSeek-V3's count) fit");
    in = ok, in.k = 0;
    CHECK(moe_graph_decide(&in) == MOE_GRAPH_SHAPE, "top-0");
    CHECK(!strcmp(moe_graph_why_str(MOE_GRAPH_BUDGET), "expert budget") &&
              !strcmp(moe_graph_why_str(MOE_GRAPH_OK), "ok") && !strcmp(moe_graph_why_str((enum moe_graph_why)99), "?"),
          "reason names");
}

/* ---- the plan --------------------------------------------------------------- */

static int count_kind(const struct moe_graph_op *ops, int n, int kind, int layer) {
    int k = 0;
    for (int i = 0; i < n; i++) k += ops[i].kind == kind && (layer < -1 || ops[i].layer == layer);
    return k;
}

static void plan(void) {
    struct moe_config c;
    memset(&c, 0, sizeof c);
    uint8_t moe[4] = {0, 1, 1, 1};
    c.n_layer = 4, c.layer_moe = moe, c.n_expert = 8, c.n_expert_used = 2;
    const int n = moe_graph_plan(&c, NULL, 0);
    /* 2 (inputs, embed) + dense 9+2+1 + 3 MoE x (9+5+1) + 4 (norm, head, logits, routes) */
    CHECK(n == 2 + 12 + 3 * 15 + 4, "op count %d", n);
    struct moe_graph_op ops[128];
    CHECK(moe_graph_plan(&c, ops, 128) == n, "written and counted alike");
    CHECK(ops[0].kind == MOE_GOP_STEP_IN && ops[1].kind == MOE_GOP_EMBED && ops[n - 1].kind == MOE_GOP_ROUTES_OUT &&
              ops[n - 2].kind == MOE_GOP_LOGITS_OUT && ops[n - 3].kind == MOE_GOP_LM_HEAD,
          "inputs first, the outputs last");
    CHECK(count_kind(ops, n, MOE_GOP_DENSE_GATE_UP, 0) == 1 && count_kind(ops, n, MOE_GOP_ROUTER, 0) == 0,
          "layer 0 is dense");
    CHECK(count_kind(ops, n, MOE_GOP_ROUTE, -2) == 3 && count_kind(ops, n, MOE_GOP_EXPERT_JOBS, -2) == 3 &&
              count_kind(ops, n, MOE_GOP_RESIDUAL, -2) == 4 && count_kind(ops, n, MOE_GOP_SHARED_GATE_UP, -2) == 0,
          "three MoE layers, four residuals, no shared expert");
    int order_ok = 1;
    for (int i = 0; i + 1 < n; i++) /* the layers in order */
        if (ops[i].layer >= 0 && ops[i + 1].layer >= 0 && ops[i + 1].layer < ops[i].layer) order_ok = 0;
    CHECK(order_ok, "layers in order");
    for (int l = 1; l < 4; l++) { /* route before jobs before the gate/up before down before the residual */
        int r = -1, j = -1, g = -1, d = -1, res = -1;
        for (int i = 0; i < n; i++) {
            if (ops[i].layer != l) continue;
            if (ops[i].kind == MOE_GOP_ROUTE) r = i;
            if (ops[i].kind == MOE_GOP_EXPERT_JOBS) j = i;
            if (ops[i].kind == MOE_GOP_EXPERT_GATE_UP) g = i;
            if (ops[i].kind == MOE_GOP_EXPERT_DOWN) d = i;
            if (ops[i].kind == MOE_GOP_RESIDUAL) res = i;
        }
        CHECK(r >= 0 && r < j && j < g && g < d && d < res, "layer %d: route < jobs < gate/up < down < residual", l);
    }
    c.n_ff_shared = 16, c.shared_gated = 1;
    const int n2 = moe_graph_plan(&c, ops, 128);
    CHECK(n2 == n + 3 * 3 && count_kind(ops, n2, MOE_GOP_SHARED_GATE, -2) == 3, "a gated shared expert: 3 ops a layer");
    c.shared_gated = 0;
    CHECK(moe_graph_plan(&c, NULL, 0) == n + 3 * 2, "an ungated shared expert: 2");
    struct moe_graph_op few[5];
    memset(few, 0xff, sizeof few);
    CHECK(moe_graph_plan(&c, few, 3) == n + 6 && few[3].kind == 0xff && few[2].kind == MOE_GOP_ATTN_NORM,
          "truncated at cap, counted in full");
    uint8_t dense[2] = {0, 0};
    c.n_layer = 2, c.layer_moe = dense;
    CHECK(moe_graph_plan(&c, ops, 128) == 2 + 2 * 12 + 3 && ops[2 + 2 * 12 + 2].kind == MOE_GOP_LOGITS_OUT,
          "no MoE layer: no routes to copy out");
    CHECK(!strcmp(moe_graph_op_name(MOE_GOP_QKV), "qkv") && !strcmp(moe_graph_op_name(MOE_GOP_ROUTES_OUT), "routes_out") &&
              !strcmp(moe_graph_op_name(-1), "?") && !strcmp(moe_graph_op_name(MOE_GOP_COUNT_), "?"),
          "op names");
}

/* ---- a backend whose decode_step runs on the CPU reference ---------------------- */

struct gwrap {
    struct moe_backend *cpu;
    const struct moe_model *m;
    struct moe_backend_iface iface;
    int refuse;              /* decode_step answers MOE_ERR_UNSUPPORTED */
    int calls, refusals;
    uint64_t gen;
    int gens;                /* generations seen */
    float *logits_rl;        /* [n_expert] */
};

static struct gwrap *GW(struct moe_backend *be) { return be->ctx; }
static struct moe_backend *GC(struct moe_backend *be) { return GW(be)->cpu; }

#define FWD(name, sig, args) \
    static enum moe_status g_##name sig { return GC(be)->iface->name args; }
FWD(buffer_alloc, (struct moe_backend * be, size_t size, struct moe_buffer *out), (GC(be), size, out))
FWD(buffer_write, (struct moe_backend * be, struct moe_buffer *dst, size_t off, const void *src, size_t n),
    (GC(be), dst, off, src, n))
FWD(embed, (struct moe_backend * be, const int32_t *t, int n), (GC(be), t, n))
FWD(set_x, (struct moe_backend * be, const float *x, int n), (GC(be), x, n))
FWD(get_x, (struct moe_backend * be, float *x, int n), (GC(be), x, n))
FWD(get_xn, (struct moe_backend * be, float *x, int n), (GC(be), x, n))
FWD(attention, (struct moe_backend * be, int l, int p, int n, int len), (GC(be), l, p, n, len))
FWD(ffn_norm, (struct moe_backend * be, int l, int n), (GC(be), l, n))
FWD(router, (struct moe_backend * be, int l, int n, float *lg), (GC(be), l, n, lg))
FWD(expert,
    (struct moe_backend * be, const struct moe_ffn *f, const int32_t *rows, const int32_t *slots, const float *w,
     int n, float *out),
    (GC(be), f, rows, slots, w, n, out))
FWD(dense, (struct moe_backend * be, int l, int n), (GC(be), l, n))
FWD(residual, (struct moe_backend * be, int n), (GC(be), n))
FWD(lm_head, (struct moe_backend * be, int r, int n, float *lg), (GC(be), r, n, lg))
FWD(ffn_rows, (struct moe_backend * be, const struct moe_ffn *f, const float *x, float *y, int n), (GC(be), f, x, y, n))
FWD(lm_head_rows, (struct moe_backend * be, const float *x, int n, float *lg), (GC(be), x, n, lg))
FWD(expert_batch, (struct moe_backend * be, const struct moe_expert_work *w, int n), (GC(be), w, n))
static void g_buffer_free(struct moe_backend *be, struct moe_buffer *b) { GC(be)->iface->buffer_free(GC(be), b); }
static size_t g_kv_cache_bytes(struct moe_backend *be) { return GC(be)->iface->kv_cache_bytes(GC(be)); }

/* g_decode_step: the contract of decode_step, op by op on the reference: the
 * router's logits routed by moe_route, each chosen expert in its slot (its
 * rank by id among the token's choices), the views from the table. */
static enum moe_status g_decode_step(struct moe_backend *be, const struct moe_step_desc *d, int32_t token, int pos,
                                     float *logits, int32_t *sel, float *w) {
    struct gwrap *g = GW(be);
    struct moe_backend *c = g->cpu;
    const struct moe_config *cfg = &g->m->cfg;
    g->calls++;
    if (g->refuse) {
        g->refusals++;
        return MOE_ERR_UNSUPPORTED;
    }
    if (d->generation != g->gen) g->gen = d->generation, g->gens++;
    const int K = d->k, E = cfg->n_expert;
    enum moe_status st = c->iface->embed(c, &token, 1);
    int ml = 0;
    for (int l = 0; !st && l < cfg->n_layer; l++) {
        if ((st = c->iface->attention(c, l, pos, 1, pos + 1)) || (st = c->iface->ffn_norm(c, l, 1))) break;
        if (cfg->layer_moe[l]) {
            int32_t s[64], rows[64] = {0}, slots[64];
            float wt[64];
            struct moe_expert_work wk[64];
            if ((st = c->iface->router(c, l, 1, g->logits_rl))) break;
            moe_route(g->m, l, K, g->logits_rl, s, wt);
            for (int i = 0; i < K; i++) {
                int r = 0;
                for (int q = 0; q < K; q++) r += s[q] < s[i] || (s[q] == s[i] && q < i);
                slots[i] = r;
                wk[i] = (struct moe_expert_work){d->experts[(size_t)l * E + s[i]], rows + i, slots + i, wt + i, 1, 0, NULL};
            }
            if ((st = c->iface->expert_batch(c, wk, K))) break;
            if (sel) memcpy(sel + (size_t)ml * K, s, sizeof(int32_t) * (size_t)K);
            if (w) memcpy(w + (size_t)ml * K, wt, sizeof(float) * (size_t)K);
            ml++;
        }
        if ((st = c->iface->dense(c, l, 1)) || (st = c->iface->residual(c, 1))) break;
    }
    return st ? st : c->iface->lm_head(c, 0, 1, logits);
}

static struct gwrap *g_last;
static int g_refuse;

static void g_free(struct moe_backend *be) {
    if (!be) return;
    struct gwrap *g = GW(be);
    moe_backend_free(g->cpu);
    free(g->logits_rl);
    if (g_last == g) g_last = NULL;
    free(g);
    free(be);
}

static enum moe_status gwrap_new(const struct moe_model *m, const struct moe_backend_params *p, void *user,
                                 struct moe_backend **out) {
    (void)user;
    struct gwrap *g = calloc(1, sizeof *g);
    struct moe_backend *be = calloc(1, sizeof *be);
    if (!g || !be || !(g->logits_rl = calloc((size_t)m->cfg.n_expert, sizeof(float)))) {
        if (g) free(g->logits_rl);
        free(g);
        free(be);
        return MOE_ERR_NOMEM;
    }
    enum moe_status st = moe_backend_cpu_new(m, p, &g->cpu);
    if (st) {
        free(g->logits_rl);
        free(g);
        free(be);
        return st;
    }
    g->m = m, g->refuse = g_refuse;
    const struct moe_backend_iface *ci = g->cpu->iface;
    g->iface = *ci;
    g->iface.version = MOE_BACKEND_VERSION;
    g->iface.name = "graph-test";
    g->iface.free = g_free;
    g->iface.buffer_alloc = g_buffer_alloc, g->iface.buffer_free = g_buffer_free, g->iface.buffer_write = g_buffer_write;
    g->iface.embed = g_embed, g->iface.set_x = g_set_x, g->iface.get_x = g_get_x, g->iface.get_xn = g_get_xn;
    g->iface.attention = g_attention, g->iface.ffn_norm = g_ffn_norm, g->iface.router = g_router;
    g->iface.expert = g_expert, g->iface.dense = g_dense, g->iface.residual = g_residual, g->iface.lm_head = g_lm_head;
    g->iface.ffn_rows = g_ffn_rows, g->iface.lm_head_rows = g_lm_head_rows, g->iface.kv_cache_bytes = g_kv_cache_bytes;
    g->iface.expert_batch = g_expert_batch;
    g->iface.kv_seq = NULL, g->iface.attention_multi = NULL, g->iface.supports = NULL, g->iface.stats_json = NULL;
    g->iface.place = NULL, g->iface.stage_begin = NULL, g->iface.stage_end = NULL;
    g->iface.decode_step = g_decode_step;
    be->iface = &g->iface, be->ctx = g;
    g_last = g;
    *out = be;
    return MOE_OK;
}

/* ---- runs ---------------------------------------------------------------------- */

#define NP 6
#define ND 8

struct run_out {
    float *logits;  /* [(NP + ND) x V] */
    int32_t *trace; /* the session's trace experts */
    int64_t trace_n;
    struct moe_session_graph_stats gs;
    int calls, refusals, gens, pos;
};

static void noop_route(const struct moe_route_event *ev, void *user) {
    (void)ev;
    (*(int *)user)++;
}

/* run: a prompt of NP tokens then ND one-token forwards; wrapped: the test
 * backend; k: experts per token (0: the model's); knob: 0 none, 1 no_graphs,
 * 2 a route observer, 3 big-little, 4 change k to k-1 halfway */
static int run(struct moe_model *m, int wrapped, int knob, struct run_out *r) {
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = 2, p.n_ctx = 64, p.record_trace = 1;
    int seen = 0;
    if (wrapped) p.backend_new = gwrap_new;
    if (knob == 1) p.no_graphs = 1;
    if (knob == 2) p.on_route = noop_route, p.route_user = &seen;
    if (knob == 3) p.little_k = 1, p.gamma = 0.5;
    struct moe_session *s = NULL;
    if (moe_session_create(m, &p, &s) != MOE_OK) return 0;
    const size_t V = (size_t)m->cfg.n_vocab;
    int32_t ids[NP + ND];
    for (int i = 0; i < NP + ND; i++) ids[i] = (int32_t)((29 * i + 7) % m->cfg.n_vocab);
    int ok = moe_session_forward(s, ids, NP, r->logits, 1) == MOE_OK;
    for (int i = NP; ok && i < NP + ND; i++) {
        if (knob == 4 && i == NP + ND / 2) ok = moe_session_set_experts(s, m->cfg.n_expert_used - 1) == MOE_OK;
        ok = ok && moe_session_forward(s, ids + i, 1, r->logits + (size_t)i * V, 0) == MOE_OK;
    }
    struct moe_session_trace t;
    if (ok && moe_session_trace(s, &t) == MOE_OK) {
        const int64_t row = (int64_t)t.n_layers * t.k;
        r->trace_n = t.n_tokens * row;
        r->trace = malloc(sizeof(int32_t) * (size_t)(r->trace_n ? r->trace_n : 1));
        if (r->trace) memcpy(r->trace, t.experts, sizeof(int32_t) * (size_t)r->trace_n);
    }
    moe_session_graph_stats(s, &r->gs);
    r->pos = moe_session_pos(s);
    if (g_last) r->calls = g_last->calls, r->refusals = g_last->refusals, r->gens = g_last->gens;
    else r->calls = r->refusals = r->gens = -1;
    moe_session_free(s);
    return ok;
}

static int same(const struct run_out *a, const struct run_out *b, size_t V) {
    return !memcmp(a->logits, b->logits, sizeof(float) * (NP + ND) * V) && a->trace_n == b->trace_n && a->trace &&
           b->trace && !memcmp(a->trace, b->trace, sizeof(int32_t) * (size_t)a->trace_n) && a->pos == b->pos;
}

static void session_model(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/models/%s", MOE_FIXTURES, name);
    struct moe_model_params mp = moe_model_default_params();
    struct moe_model *m = NULL;
    if (moe_model_load(path, &mp, &m) != MOE_OK) {
        CHECK(0, "%s loads", name);
        return;
    }
    const size_t V = (size_t)m->cfg.n_vocab;
    struct run_out ref = {0}, gr = {0}, off = {0}, obs = {0}, bl = {0}, bl_ref = {0}, ref_ref = {0}, kchg = {0},
                   kchg_ref = {0};
    struct run_out *all[] = {&ref, &gr, &off, &obs, &bl, &bl_ref, &ref_ref, &kchg, &kchg_ref};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) all[i]->logits = calloc((NP + ND) * V, sizeof(float));
    g_refuse = 0;
    int ok = run(m, 0, 0, &ref) && run(m, 1, 0, &gr);
    CHECK(ok, "%s: both runs", name);
    if (ok) {
        CHECK(same(&ref, &gr, V), "%s: graph steps give the plain run's logits bit for bit, its trace and position",
              name);
        CHECK(gr.gs.steps_graph == ND && gr.gs.steps_plain == 0 && gr.calls == ND && gr.gens == 1 &&
                  gr.gs.last_why == MOE_GRAPH_OK,
              "%s: every decode step was a graph (%lld graph, %lld plain, %d calls, %d generations)", name,
              (long long)gr.gs.steps_graph, (long long)gr.gs.steps_plain, gr.calls, gr.gens);
        CHECK(ref.gs.steps_graph == 0 && ref.gs.steps_plain == ND && ref.gs.last_why == MOE_GRAPH_BACKEND,
              "%s: the CPU backend: op by op, reason 'backend'", name);
        CHECK(gr.gs.graph_ops == moe_graph_plan(&m->cfg, NULL, 0) && gr.gs.graph_ops > 10, "%s: the plan's size", name);
    }
    CHECK(run(m, 1, 1, &off) && same(&ref, &off, V) && off.calls == 0 && off.gs.steps_plain == ND &&
              off.gs.last_why == MOE_GRAPH_OFF,
          "%s: no_graphs: decode_step never called", name);
    CHECK(run(m, 1, 2, &obs) && same(&ref, &obs, V) && obs.calls == 0 && obs.gs.last_why == MOE_GRAPH_OBSERVER,
          "%s: an observer keeps the op-by-op path", name);
    if (m->cfg.n_expert_used > 1) {
        CHECK(run(m, 0, 3, &bl_ref) && run(m, 1, 3, &bl) && same(&bl_ref, &bl, V) && bl.calls == 0 &&
                  bl.gs.last_why == MOE_GRAPH_BIG_LITTLE,
              "%s: big-little keeps the op-by-op path", name);
        CHECK(run(m, 0, 4, &kchg_ref) && run(m, 1, 4, &kchg) && same(&kchg_ref, &kchg, V) && kchg.gens == 2 &&
                  kchg.gs.steps_graph == ND,
              "%s: a new top-k is a new generation (%d), still bit-identical", name, kchg.gens);
    }
    g_refuse = 1;
    CHECK(run(m, 1, 0, &ref_ref) && same(&ref, &ref_ref, V) && ref_ref.calls == 1 && ref_ref.refusals == 1 &&
              ref_ref.gs.steps_plain == ND && ref_ref.gs.last_why == MOE_GRAPH_FAILED,
          "%s: a refused decode_step is asked once, then op by op, same logits", name);
    g_refuse = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]->logits), free(all[i]->trace);
    moe_model_free(m);
}

static void router_refused(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/models/deepseek_v2-f32", MOE_FIXTURES);
    struct moe_model_params mp = moe_model_default_params();
    struct moe_model *m = NULL;
    if (moe_model_load(path, &mp, &m) != MOE_OK) {
        CHECK(0, "deepseek_v2 loads");
        return;
    }
    struct run_out r = {0};
    r.logits = calloc((NP + ND) * (size_t)m->cfg.n_vocab, sizeof(float));
    const int expect = m->cfg.router == MOE_ROUTER_SOFTMAX_TOPK ? MOE_GRAPH_OK : MOE_GRAPH_ROUTER;
    CHECK(run(m, 1, 0, &r) && r.gs.last_why == expect && (expect != MOE_GRAPH_ROUTER || r.calls == 0),
          "DeepSeek-V2 (router %d): reason %s", (int)m->cfg.router, moe_graph_why_str((enum moe_graph_why)r.gs.last_why));
    free(r.logits);
    free(r.trace);
    moe_model_free(m);
}

int main(void) {
    moe_log_set(capture, NULL);
    log_reset();
    decide();
    plan();
    session_model("olmoe-f32");
    session_model("qwen2_moe-f32");
    session_model("qwen3_moe-dense-f32");
    session_model("phimoe-f32");
    router_refused();
    printf("test-graph-plan: %d checks, %d failed\n", checks, fails);
    return fails != 0;
}

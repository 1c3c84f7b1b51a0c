/*
 * graph-plan.c - the decision to run a decode step as one device graph, and
 * the graph's operations (moe-graph.h).
 */
#include "moe-graph.h"

#include <stddef.h>

enum moe_graph_why moe_graph_decide(const struct moe_graph_inputs *in) {
    const struct moe_config *c = in->cfg;
    if (!in->enabled) return MOE_GRAPH_OFF;
    if (!in->backend_can) return MOE_GRAPH_BACKEND;
    if (in->n_tok != 1) return MOE_GRAPH_PROMPT;
    if (in->budget) return MOE_GRAPH_BUDGET;
    if (in->observers) return MOE_GRAPH_OBSERVER;
    if (in->little_k > 0) return MOE_GRAPH_BIG_LITTLE;
    if (c->router != MOE_ROUTER_SOFTMAX_TOPK && c->router != MOE_ROUTER_SPARSEMIXER) return MOE_GRAPH_ROUTER;
    if (c->n_expert > MOE_GRAPH_MAX_EXPERTS || in->k < 1 || in->k > MOE_GRAPH_MAX_K || in->k > c->n_expert ||
        (c->router == MOE_ROUTER_SPARSEMIXER && in->k > 2))
        return MOE_GRAPH_SHAPE;
    if (in->n_rows_batch > 1) return MOE_GRAPH_BATCH;
    if (in->failed) return MOE_GRAPH_FAILED;
    return MOE_GRAPH_OK;
}

const char *moe_graph_why_str(enum moe_graph_why why) {
    switch (why) {
    case MOE_GRAPH_OK: return "ok";
    case MOE_GRAPH_OFF: return "turned off";
    case MOE_GRAPH_BACKEND: return "backend has no graph step";
    case MOE_GRAPH_PROMPT: return "prompt chunk";
    case MOE_GRAPH_BUDGET: return "expert budget";
    case MOE_GRAPH_OBSERVER: return "observer";
    case MOE_GRAPH_BIG_LITTLE: return "big-little";
    case MOE_GRAPH_ROUTER: return "router kind";
    case MOE_GRAPH_SHAPE: return "expert count or top-k";
    case MOE_GRAPH_BATCH: return "multi-sequence batch";
    case MOE_GRAPH_FAILED: return "capture failed";
    }
    return "?";
}

static const char *const k_op_names[MOE_GOP_COUNT_] = {
    "step_in", "embed", "attn_norm", "qkv", "qkv_post", "attn", "attn_combine", "o_proj", "ffn_norm",
    "clear_acc", "clear_used", "router", "route", "expert_jobs", "expert_gate_up", "expert_down", "shared_gate",
    "shared_gate_up", "shared_down", "dense_gate_up", "dense_down", "residual", "out_norm", "lm_head",
    "logits_out", "routes_out",
};

const char *moe_graph_op_name(int kind) { return kind >= 0 && kind < MOE_GOP_COUNT_ ? k_op_names[kind] : "?"; }

/* push: one operation at ops[n] when it fits; the count grows either way */
static int push(struct moe_graph_op *ops, int cap, int n, int kind, int layer) {
    if (ops && n < cap) ops[n] = (struct moe_graph_op){(uint8_t)kind, (int16_t)layer};
    return n + 1;
}

int moe_graph_plan(const struct moe_config *c, struct moe_graph_op *ops, int cap) {
    int n = 0, any_moe = 0;
    n = push(ops, cap, n, MOE_GOP_STEP_IN, -1);
    n = push(ops, cap, n, MOE_GOP_EMBED, -1);
    for (int l = 0; l < c->n_layer; l++) {
        static const int attn[] = {MOE_GOP_ATTN_NORM, MOE_GOP_QKV,          MOE_GOP_QKV_POST, MOE_GOP_ATTN,
                                   MOE_GOP_ATTN_COMBINE, MOE_GOP_O_PROJ,    MOE_GOP_FFN_NORM, MOE_GOP_CLEAR_ACC,
                                   MOE_GOP_CLEAR_USED};
        for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++) n = push(ops, cap, n, attn[i], l);
        if (c->layer_moe[l]) {
            any_moe = 1;
            static const int moe[] = {MOE_GOP_ROUTER, MOE_GOP_ROUTE, MOE_GOP_EXPERT_JOBS, MOE_GOP_EXPERT_GATE_UP,
                                      MOE_GOP_EXPERT_DOWN};
            for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) n = push(ops, cap, n, moe[i], l);
            if (c->n_ff_shared > 0) {
                if (c->shared_gated) n = push(ops, cap, n, MOE_GOP_SHARED_GATE, l);
                n = push(ops, cap, n, MOE_GOP_SHARED_GATE_UP, l);
                n = push(ops, cap, n, MOE_GOP_SHARED_DOWN, l);
            }
        } else {
            n = push(ops, cap, n, MOE_GOP_DENSE_GATE_UP, l);
            n = push(ops, cap, n, MOE_GOP_DENSE_DOWN, l);
        }
        n = push(ops, cap, n, MOE_GOP_RESIDUAL, l);
    }
    n = push(ops, cap, n, MOE_GOP_OUT_NORM, -1);
    n = push(ops, cap, n, MOE_GOP_LM_HEAD, -1);
    n = push(ops, cap, n, MOE_GOP_LOGITS_OUT, -1);
    if (any_moe) n = push(ops, cap, n, MOE_GOP_ROUTES_OUT, -1);
    return n;
}

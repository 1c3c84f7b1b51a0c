/*
 * moe-graph.h - whether a decode step runs as one captured device graph, and
 * what that graph holds (the launch plan). Pure C: the session decides with
 * it, the CUDA backend captures from it, and the tests check both on a
 * machine without a GPU (test-graph-plan).
 *
 * A one-token step whose every expert is resident (no expert budget) and
 * whose routing nobody watches from the host can run end to end on the
 * device: the router's logits are routed there (the routing kernel mirrors
 * moe_route), each routed expert's job is filled from a per-layer table of
 * the experts' device views, and the position and RoPE tables are read from
 * device memory written by the step's first copy. Nothing in the graph then
 * depends on the token, the position or the routing, so one capture serves
 * every step until the expert table or the top-k changes: the host issues one
 * graph launch per token instead of 18 operations per MoE layer (+ 8 per step) and waits once,
 * for the logits. Everything else falls back to the op-by-op path, for the
 * reason moe_graph_decide names.
 */
#ifndef MOE_GRAPH_H
#define MOE_GRAPH_H

#include <stdint.h>

#include "moe-model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Why a step runs op by op (MOE_GRAPH_OK: it may run as a graph). */
enum moe_graph_why {
    MOE_GRAPH_OK = 0,
    MOE_GRAPH_OFF,          /* turned off (moe-run --graphs off; moe_session_params.graphs = 0) */
    MOE_GRAPH_BACKEND,      /* the backend has no decode_step (the CPU backend) */
    MOE_GRAPH_PROMPT,       /* more than one token in the step (a prompt chunk) */
    MOE_GRAPH_BUDGET,       /* an expert budget: the host store decides each step's copies */
    MOE_GRAPH_OBSERVER,     /* a layer, route or expert observer reads host state mid-step */
    MOE_GRAPH_BIG_LITTLE,   /* MoBiLE: the host checks the little pass before the big one */
    MOE_GRAPH_ROUTER,       /* a router the device routing kernel does not mirror (group-limited) */
    MOE_GRAPH_SHAPE,        /* more experts or a larger top-k than the routing kernel takes */
    MOE_GRAPH_BATCH,        /* several sequences decoded together (moe_session_decode_batch) */
    MOE_GRAPH_FAILED,       /* capture or instantiation failed once on this backend (logged) */
};

/* What moe_graph_decide looks at. */
struct moe_graph_inputs {
    const struct moe_config *cfg;
    int enabled;          /* 0: MOE_GRAPH_OFF */
    int backend_can;      /* the backend has decode_step (moe_backend_supports MOE_BACKEND_FEAT_GRAPH) */
    int n_tok;            /* tokens of the step */
    int k;                /* experts per token of the step */
    int budget;           /* the session has an expert budget */
    int observers;        /* any of on_layer / on_route / on_expert is set */
    int little_k;         /* big-little's little k (> 0: on) */
    int n_rows_batch;     /* rows of a multi-sequence decode step (<= 1: none) */
    int failed;           /* an earlier capture failed */
};

/* The device routing kernel's limits (runtime/cuda/kernels.cu, route_kernel). */
#define MOE_GRAPH_MAX_EXPERTS 256
#define MOE_GRAPH_MAX_K 64

/* moe_graph_decide: the first reason, in the order of the enum, that the
 * step must run op by op; MOE_GRAPH_OK when it may run as a graph. */
enum moe_graph_why moe_graph_decide(const struct moe_graph_inputs *in);

/* moe_graph_why_str: a short phrase for a reason ("ok", "expert budget", ...). */
const char *moe_graph_why_str(enum moe_graph_why why);

/* One operation of a captured decode step. */
enum moe_graph_op_kind {
    MOE_GOP_STEP_IN = 0,  /* copy of the step's inputs (token, position, RoPE row) to the device */
    MOE_GOP_EMBED,
    MOE_GOP_ATTN_NORM,
    MOE_GOP_QKV,          /* q, k, v products: one GEMV launch of three jobs */
    MOE_GOP_QKV_POST,     /* q/k norms, clipping, RoPE, KV-cache write at the device position */
    MOE_GOP_ATTN,         /* split-KV attention (partials) */
    MOE_GOP_ATTN_COMBINE,
    MOE_GOP_O_PROJ,
    MOE_GOP_FFN_NORM,
    MOE_GOP_CLEAR_ACC,    /* memset of the layer's accumulator */
    MOE_GOP_CLEAR_USED,   /* memset of the slot-used flags */
    MOE_GOP_ROUTER,       /* router logits (GEMV) */
    MOE_GOP_ROUTE,        /* device routing: top-k and weights */
    MOE_GOP_EXPERT_JOBS,  /* the routed experts' GEMV jobs from the layer's expert table */
    MOE_GOP_EXPERT_GATE_UP,
    MOE_GOP_EXPERT_DOWN,
    MOE_GOP_SHARED_GATE,  /* the shared expert's scalar gate (Qwen2-MoE) */
    MOE_GOP_SHARED_GATE_UP,
    MOE_GOP_SHARED_DOWN,
    MOE_GOP_DENSE_GATE_UP, /* a dense layer's MLP */
    MOE_GOP_DENSE_DOWN,
    MOE_GOP_RESIDUAL,
    MOE_GOP_OUT_NORM,
    MOE_GOP_LM_HEAD,
    MOE_GOP_LOGITS_OUT,   /* copy of the logits to pinned host memory */
    MOE_GOP_ROUTES_OUT,   /* copy of every MoE layer's choices and weights to pinned host memory */
    MOE_GOP_COUNT_
};

struct moe_graph_op {
    uint8_t kind;  /* enum moe_graph_op_kind */
    int16_t layer; /* -1 outside the layers */
};

/* moe_graph_plan: the operations of one captured decode step of `cfg`, in
 * stream order, into ops[cap]; returns how many there are (ops may be NULL
 * to count; more than cap are counted but not written). Each operation is
 * one node of the graph; the attention kinds and architectures the CUDA
 * backend runs (GQA) only. */
int moe_graph_plan(const struct moe_config *cfg, struct moe_graph_op *ops, int cap);

/* moe_graph_op_name: "qkv", "route", ... for logs and tests. */
const char *moe_graph_op_name(int kind);

#ifdef __cplusplus
}
#endif
#endif

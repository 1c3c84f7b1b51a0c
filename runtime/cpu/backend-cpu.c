/*
 * backend-cpu.c - the CPU reference backend (moe-backend.h).
 *
 * Every step mirrors transformers' eager implementation of the supported
 * architectures, in float32, except the matrix products with quantized
 * weights: for a weight type that has integer kernels (q8_0, q4_0, q2_k ..
 * q6_k; moe-quant.h) the input rows are quantized once per matrix (q8_0 or
 * q8_k blocks, as ggml does) and every weight row is dotted with them in
 * integer arithmetic; several input rows share each decoded weight block
 * (moe_mat_dot_act's tiles). Experts run gate and up in one pass with SiLU
 * (moe_gate_up_act). Weights of other types (f32, f16, bf16) keep the float
 * path: one-token products use the SIMD dot kernels of moe-quant.h straight
 * from the stored rows, several tokens convert each row once to float32.
 * MOE_CPU_INT=0 in the environment (read when a backend is created) makes
 * every type take the float path: for measuring what the 8-bit activations
 * change (test-backend-cpu). A small model's decode steps run on every
 * thread or on the caller alone, whichever measures faster (moe-adapt.h;
 * MOE_CPU_ADAPT=0: always every thread).
 * Work is split across a thread pool by output rows (matmuls, every expert's
 * rows across all threads; the small products of a decoded token share
 * loops: q, k and v one, a layer's routed experts one for gate/up and one for
 * down, expert_batch), by tokens for steps with small weights and many
 * tokens (see "token splits"), and by tiles of (token, head) pairs that share
 * a KV head (attention: scores against keys stored transposed in blocks, a
 * vectorised softmax, then the values). No memory is allocated after
 * moe_backend_cpu_new; scratch pages are touched there. With n_seq > 1 it
 * keeps one KV cache per sequence: attention() runs on the one kv_seq
 * selected, attention_multi on rows of several (a batched decode step: the
 * projections over all rows at once, each row's keys and values and scores
 * in its own sequence's cache, with the same arithmetic as attention()).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "moe-backend.h"
#include "adapt-impl.h"
#include "moe-threadpool.h"

/* The backend's state: one session's KV cache and scratch. */
struct cpu {
    const struct moe_model *m;
    struct moe_backend_params p;
    struct moe_pool *pool;
    int64_t q_dim, kv_dim, max_in, max_ff;
    int64_t kv_row;             /* floats per token and layer in k_cache: kv_dim (GQA), or
                                 * kv_lora_rank + qk_rope_dim (MLA: latent, then rope key) */
    float *k_cache, *v_cache;   /* the selected sequence's caches (kv_seq): GQA: [n_layer][n_head_kv]
                                 * key blocks (ATT_KB), v_cache [n_layer][n_ctx][kv_dim]; MLA:
                                 * k_cache [n_layer][n_ctx][kv_row] */
    float *k_all, *v_all;       /* [n_seq] such caches, one after another */
    size_t seq_floats;          /* floats of one sequence's k_cache (and of its v_cache) */
    int n_seq;                  /* sequences (>= 1) */
    size_t kv_bytes;            /* every cache's bytes */
    /* MLA scratch: q LoRA rank output, the latent + rope key of the chunk, the
     * absorbed queries and the attention's latent outputs */
    float *qa, *ckv;            /* [B x q_lora_rank], [B x kv_row] */
    float *qlat, *olat;         /* [B x n_head x kv_lora_rank] */
    /* scratch for one chunk of up to n_batch tokens */
    float *x, *xn, *q, *k, *v;  /* [B x n_embd], [B x q_dim], [B x kv_dim] */
    float *att, *tmp;           /* [B x q_dim], [B x n_embd] attention / FFN output */
    float *acc;                 /* [B x n_embd] the layer's feed-forward sum */
    float *part;                /* [B x n_slots x n_embd] weighted routed-expert outputs */
    unsigned char *part_used;   /* [B x n_slots] */
    float *xe, *ge, *ue, *ye;   /* gathered tokens for one expert: [B x n_embd], [B x n_ff] */
    float *sg;                  /* [B] shared-expert gate */
    uint8_t *aq;                /* [B x aq_cap] quantized activation rows (integer products) */
    size_t aq_cap;              /* bytes per row of aq */
    float *row_buf;             /* [n_threads x max_in] weight row conversion */
    float *att_buf;             /* [n_threads x att_stride] attention scores */
    float *inv_freq;            /* [n_rot/2] */
    float *rope_cos, *rope_sin; /* [B x n_rot/2] */
    int rope_pos0, rope_n, rope_len; /* what the rope tables hold (-1: nothing) */
    int *rope_at;               /* [B] ... or, with rope_multi set, the positions of attention_multi's rows */
    int rope_multi;
    int shared_pending;         /* the shared expert's output waits in tmp (sg: its gate) */
    int avx2;                   /* the CPU has AVX2 and FMA (attention's wide copy) */
    int avx512;                 /* ... and AVX-512 F and VL (attention's wider tiles) */
    int use_int;                /* integer products for the types that have them (MOE_CPU_INT) */
    struct moe_adapt adapt;     /* one-token steps: every thread or the caller alone (MOE_CPU_ADAPT) */
    struct timespec step_t0;    /* the start of a measured step */
};

/* ---- small kernels ---------------------------------------------------- */

/* Eight floats as one vector (GCC/Clang vector extension: one AVX register
 * in the AVX2 copies of the functions that inline these helpers, two SSE
 * registers otherwise). */
typedef float v8f __attribute__((vector_size(32)));
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi" /* the helpers are always inlined: no call ABI involved */
#endif
static inline __attribute__((always_inline)) v8f ld8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline __attribute__((always_inline)) float sum8(v8f s) {
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* dot: float32 dot product with eight independent partial sums. */
static inline __attribute__((always_inline)) float dot(const float *a, const float *b, int64_t n) {
    v8f s = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) s += ld8(a + i) * ld8(b + i);
    for (; i < n; i++) s[0] += a[i] * b[i];
    return sum8(s);
}

/* dot4: dot(a, b + k * ldb, n) for k < 4 into out[k], each exactly as dot()
 * computes it, in four independent chains (one pass over a). */
static inline __attribute__((always_inline)) void dot4(const float *a, const float *b, size_t ldb, int64_t n,
                                                       float *out) {
    v8f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    const float *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const v8f x = ld8(a + i);
        s0 += x * ld8(b0 + i);
        s1 += x * ld8(b1 + i);
        s2 += x * ld8(b2 + i);
        s3 += x * ld8(b3 + i);
    }
    for (; i < n; i++) {
        s0[0] += a[i] * b0[i];
        s1[0] += a[i] * b1[i];
        s2[0] += a[i] * b2[i];
        s3[0] += a[i] * b3[i];
    }
    out[0] = sum8(s0), out[1] = sum8(s1), out[2] = sum8(s2), out[3] = sum8(s3);
}

/* weight_row: row o of w (any type or layout) as float32; `buf` holds n_in
 * floats of scratch. Rows of aligned F32 tensors are used in place. */
static const float *weight_row(const struct moe_weight *w, int64_t o, float *buf) {
    const char *src = (const char *)w->data + (size_t)o * moe_qtype_row_bytes(w->type, w->n_in);
    if (w->type == MOE_QTYPE_F32 && ((uintptr_t)src & 3u) == 0) return (const float *)(const void *)src;
    moe_dequantize_row_of(w->type, w->n_in, w->data, o, buf);
    return buf;
}

/* ---- token splits --------------------------------------------------------
 *
 * With small matrices and many tokens, a step splits the tokens between the
 * threads instead of the output rows: each thread quantizes its own input
 * rows and writes whole output rows, several matrices in a row (q, k, v; gate,
 * up, down) in one loop over the tokens. A row split would make every output
 * row cross between cores when the next step reads it, and take a loop (and
 * its hand-offs) per matrix; it pays off for weights too large for each
 * thread to read all of them from its cache. Results are the same either way
 * (every output of moe_mat_dot_act is computed alike whatever the tile). */

/* Tokens per chunk of a token-split loop at least, and per pass inside a
 * chunk (a pass's quantized and intermediate rows stay in L1/L2). */
#define TOK_MIN 8
#define TOK_SUB 32
/* The most weight bytes of a token-split step: every thread reads all of
 * them, so they must stay in a core's L2. */
#define TOKEN_SPLIT_BYTES ((size_t)512 * 1024)

/* weight_bytes: the stored bytes of w. */
static size_t weight_bytes(const struct moe_weight *w) {
    return moe_qtype_row_bytes(w->type, w->n_in) * (size_t)w->n_out;
}

/* token_split: 1 if a step over n_tok tokens with weights of `bytes` in all
 * splits the tokens (at least TOK_MIN per thread), 0 for a row split. */
static int token_split(const struct cpu *s, size_t bytes, int n_tok) {
    return bytes <= TOKEN_SPLIT_BYTES && n_tok >= TOK_MIN * s->p.n_threads;
}

/* mat_rows: y[t] = W xq[t] (+ bias) for nt quantized activation rows (stride
 * xs), every output row. */
static void mat_rows(const struct moe_weight *w, const float *bias, const uint8_t *xq, size_t xs, int nt, float *y,
                     int64_t ldy) {
    moe_mat_dot_act(w->type, w->n_in, w->data, moe_qtype_row_bytes(w->type, w->n_in), w->n_out, xq, xs, nt, y, 1,
                    (size_t)ldy);
    if (bias)
        for (int t = 0; t < nt; t++)
            for (int64_t o = 0; o < w->n_out; o++) y[(size_t)t * (size_t)ldy + (size_t)o] += bias[o];
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
    int avx2; /* mmt_range: take the AVX2 copy */
};

static void mm_range(void *vctx, int64_t b, int64_t e, int tid) {
    struct mm_ctx *c = vctx;
    float *buf = c->row_buf + (size_t)tid * (size_t)c->row_stride;
    const enum moe_qtype wt = c->w->type;
    if (c->n_tok == 1 && wt != MOE_QTYPE_F32 && moe_qtype_group_rows(wt) == 1) {
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

/* mmt_body: tokens [b, e) of a product with aligned F32 weights (the
 * router), every row: each input row is read once for four weight rows
 * (dot4 computes each as dot does, so results match mm_range's). Inlined
 * into a generic and an AVX2 copy (the same lane operations, wider). */
static inline __attribute__((always_inline)) void mmt_body(const struct mm_ctx *c, int64_t b, int64_t e) {
    const int64_t n_in = c->w->n_in, n_out = c->w->n_out;
    const float *w = c->w->data;
    for (int64_t t = b; t < e; t++) {
        const float *x = c->x + t * c->ldx;
        float *y = c->y + t * c->ldy, r[4];
        int64_t o = 0;
        for (; o + 4 <= n_out; o += 4) {
            dot4(x, w + o * n_in, (size_t)n_in, n_in, r);
            for (int u = 0; u < 4; u++) y[o + u] = r[u] + (c->bias ? c->bias[o + u] : 0.0f);
        }
        for (; o < n_out; o++) y[o] = dot(w + o * n_in, x, n_in) + (c->bias ? c->bias[o] : 0.0f);
    }
}

static void mmt_generic(const struct mm_ctx *c, int64_t b, int64_t e) { mmt_body(c, b, e); }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma"))) static void mmt_avx2(const struct mm_ctx *c, int64_t b, int64_t e) {
    mmt_body(c, b, e);
}
#endif

static void mmt_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct mm_ctx *c = vctx;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (c->avx2) {
        mmt_avx2(c, b, e);
        return;
    }
#endif
    mmt_generic(c, b, e);
}

/* matmul_float: y[t] = W x[t] (+ bias) through the float path: split by
 * tokens for small aligned F32 weights (token_split), else by rows. */
static void matmul_float(struct cpu *s, const struct moe_weight *w, const float *bias, const float *x, int64_t ldx,
                         float *y, int64_t ldy, int n_tok) {
    struct mm_ctx c = {w, x, y, bias, n_tok, ldx, ldy, s->row_buf, s->max_in, s->avx2};
    if (w->type == MOE_QTYPE_F32 && ((uintptr_t)w->data & 3u) == 0 && n_tok > 1 &&
        token_split(s, weight_bytes(w), n_tok)) {
        moe_pool_for(s->pool, n_tok, TOK_MIN, mmt_range, &c);
        return;
    }
    int64_t work = w->n_in * (int64_t)n_tok;
    int64_t min_chunk = work > 0 ? (32768 + work - 1) / work : 1;
    moe_pool_for(s->pool, w->n_out, min_chunk, mm_range, &c);
}

/* ---- integer products against quantized activations ------------------- */

/* int_path: 1 if products with weights of type t take the integer path (the
 * type has integer dot kernels, moe-quant.h, and MOE_CPU_INT is not 0). */
static int int_path(const struct cpu *s, enum moe_qtype t) { return s->use_int && moe_act_type(t) != MOE_QTYPE_F32; }

/* The smallest number of weights x tokens worth a chunk of a parallel loop
 * (a few microseconds of integer work). */
#define INT_MIN_WORK 65536

struct qa_ctx {
    enum moe_qtype wt;
    const float *x;
    int64_t ldx, n;
    uint8_t *out;
    size_t stride;
};

static void qa_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    struct qa_ctx *c = vctx;
    for (int64_t t = b; t < e; t++)
        moe_quantize_act(c->wt, c->x + (size_t)t * (size_t)c->ldx, c->out + (size_t)t * c->stride, c->n);
}

/* act_quantize: quantize n_tok rows of x (n floats each, ld ldx) for weights
 * of type wt into s->aq; returns the byte stride of its rows. */
static size_t act_quantize(struct cpu *s, enum moe_qtype wt, const float *x, int64_t ldx, int64_t n, int n_tok) {
    const size_t stride = (moe_act_row_bytes(wt, n) + 63) & ~(size_t)63;
    struct qa_ctx c = {wt, x, ldx, n, s->aq, stride};
    moe_pool_for(s->pool, n_tok, n > 0 ? (16384 + n - 1) / n : 1, qa_range, &c);
    return stride;
}

struct mq_ctx {
    const struct moe_weight *w;
    const uint8_t *xq;
    size_t xs;
    const float *bias;
    float *y;
    int64_t ldy;
    int n_tok;
    int64_t unit; /* rows per item of the loop: moe_qtype_group_rows (whole groups per thread) */
};

static void mq_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    struct mq_ctx *c = vctx;
    const struct moe_weight *w = c->w;
    b *= c->unit, e *= c->unit;
    const size_t rb = moe_qtype_row_bytes(w->type, w->n_in);
    moe_mat_dot_act(w->type, w->n_in, (const uint8_t *)w->data + (size_t)b * rb, rb, e - b, c->xq, c->xs, c->n_tok,
                    c->y + b, 1, (size_t)c->ldy);
    if (c->bias)
        for (int t = 0; t < c->n_tok; t++)
            for (int64_t o = b; o < e; o++) c->y[(size_t)t * (size_t)c->ldy + (size_t)o] += c->bias[o];
}

/* min_rows: the fewest rows of n_in weights worth a chunk for n_tok tokens. */
static int64_t min_rows(int64_t n_in, int n_tok) {
    const int64_t work = n_in * (int64_t)n_tok;
    return work > 0 ? (INT_MIN_WORK + work - 1) / work : 1;
}

/* matmul_xq: y[t] = W xq[t] (+ bias) for n_tok activation rows quantized for
 * w's type by act_quantize (row stride xs). */
static void matmul_xq(struct cpu *s, const struct moe_weight *w, const float *bias, const uint8_t *xq, size_t xs,
                      float *y, int64_t ldy, int n_tok) {
    const int64_t u = moe_qtype_group_rows(w->type);
    struct mq_ctx c = {w, xq, xs, bias, y, ldy, n_tok, u};
    moe_pool_for(s->pool, w->n_out / u, (min_rows(w->n_in, n_tok) + u - 1) / u, mq_range, &c);
}

/* matmul: y[t] = W x[t] (+ bias) for n_tok rows; x rows have w->n_in floats.
 * Integer path for types that have one, float path otherwise. */
static void matmul(struct cpu *s, const struct moe_weight *w, const float *bias,
                   const float *x, int64_t ldx, float *y, int64_t ldy, int n_tok) {
    if (!int_path(s, w->type)) {
        matmul_float(s, w, bias, x, ldx, y, ldy, n_tok);
        return;
    }
    const size_t xs = act_quantize(s, w->type, x, ldx, w->n_in, n_tok);
    matmul_xq(s, w, bias, s->aq, xs, y, ldy, n_tok);
}

struct gu_ctx {
    const struct moe_ffn *f;
    const uint8_t *xq;
    size_t xs;
    int n_tok;
    float *h;
    int64_t unit; /* rows per item of the loop (as mq_ctx) */
};

static void gu_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    struct gu_ctx *c = vctx;
    b *= c->unit, e *= c->unit;
    const struct moe_weight *g = &c->f->gate, *u = &c->f->up;
    const size_t rb = moe_qtype_row_bytes(g->type, g->n_in);
    moe_gate_up_act(g->type, g->n_in, (const uint8_t *)g->data + (size_t)b * rb, (const uint8_t *)u->data + (size_t)b * rb,
                    e - b, c->xq, c->xs, c->n_tok, c->h + b, (size_t)g->n_out);
}

/* ---- several matrices in one parallel loop -------------------------------
 *
 * A decoded token's small products (q, k and v; the routed experts of a
 * layer) each cost a few microseconds. One loop over the rows of all of them
 * keeps every thread busy across matrix boundaries and pays one hand-off
 * instead of one per matrix. Each matrix computes its rows with the same
 * kernel calls as matmul_xq / gu_range, so the results are the same bits. */

/* One matrix of a multi-matrix loop: y[t] = W xq[t] (+ bias), or with up set
 * the SwiGLU input silu(gate xq[t]) * (up xq[t]) into y (moe_gate_up_act). */
struct mat_job {
    const struct moe_weight *w, *up;
    const float *bias;
    const uint8_t *xq;
    size_t xs;
    int n_tok;
    float *y;
    int64_t ldy;
    int64_t unit;  /* rows per loop item: moe_qtype_group_rows */
    int64_t first; /* this matrix's first item in the loop */
};

struct multi_ctx {
    const struct mat_job *jobs;
    int n;
};

/* job_rows: rows [b, e) of job j (whole groups). */
static void job_rows(const struct mat_job *j, int64_t b, int64_t e) {
    const struct moe_weight *w = j->w;
    const size_t rb = moe_qtype_row_bytes(w->type, w->n_in);
    if (j->up) {
        moe_gate_up_act(w->type, w->n_in, (const uint8_t *)w->data + (size_t)b * rb,
                        (const uint8_t *)j->up->data + (size_t)b * rb, e - b, j->xq, j->xs, j->n_tok, j->y + b,
                        (size_t)j->ldy);
        return;
    }
    moe_mat_dot_act(w->type, w->n_in, (const uint8_t *)w->data + (size_t)b * rb, rb, e - b, j->xq, j->xs, j->n_tok,
                    j->y + b, 1, (size_t)j->ldy);
    if (j->bias)
        for (int t = 0; t < j->n_tok; t++)
            for (int64_t o = b; o < e; o++) j->y[(size_t)t * (size_t)j->ldy + (size_t)o] += j->bias[o];
}

/* multi_range: items [b, e) of the jobs' concatenated row groups. */
static void multi_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct multi_ctx *c = vctx;
    int j = 0;
    while (j + 1 < c->n && c->jobs[j + 1].first <= b) j++;
    for (; b < e && j < c->n; j++) {
        const struct mat_job *m = &c->jobs[j];
        const int64_t end = j + 1 < c->n ? c->jobs[j + 1].first : e;
        const int64_t ee = e < end ? e : end;
        if (ee > b) job_rows(m, (b - m->first) * m->unit, (ee - m->first) * m->unit);
        b = ee;
    }
}

/* run_jobs: the n jobs in one parallel loop; sets each job's unit and first. */
static void run_jobs(struct cpu *s, struct mat_job *jobs, int n) {
    int64_t items = 0, work = 0;
    for (int i = 0; i < n; i++) {
        struct mat_job *j = &jobs[i];
        j->unit = moe_qtype_group_rows(j->w->type);
        j->first = items;
        items += j->w->n_out / j->unit;
        work += j->w->n_out * j->w->n_in * (int64_t)j->n_tok * (j->up ? 2 : 1);
    }
    if (items == 0) return;
    const int64_t per_item = work / items > 0 ? work / items : 1;
    struct multi_ctx c = {jobs, n};
    moe_pool_for(s->pool, items, (INT_MIN_WORK + per_item - 1) / per_item, multi_range, &c);
}

/* rms_norm: y = x / sqrt(mean(x^2) + eps) * w, as transformers' RMSNorm.
 * The squares (exact in double) are summed in four chains, element i into
 * chain i % 4. */
static void rms_norm(float *y, const float *x, const float *w, int64_t n, float eps) {
    double s4[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int u = 0; u < 4; u++) s4[u] += (double)x[i + u] * x[i + u];
    for (; i < n; i++) s4[i % 4] += (double)x[i] * x[i];
    const double ss = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    float r = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
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

/* rope_row / rope_tables: cos/sin of row t at position pos / of n_tok rows
 * at positions from pos0. `seq_len` is the largest position of the forward
 * call + 1 (Phi-MoE picks its mscale by it). */
static void rope_row(struct cpu *s, int t, int pos, int seq_len) {
    const struct moe_rope *r = &s->m->cfg.rope;
    int half = r->n_rot / 2;
    float scale = 1.0f;
    if (r->kind == MOE_ROPE_LONGROPE)
        scale = r->has_mscale ? (seq_len > r->original_max_pos ? r->long_mscale : r->short_mscale)
                              : r->attention_factor;
    else if (r->kind == MOE_ROPE_YARN)
        scale = r->attention_factor;
    float p = (float)pos;
    for (int i = 0; i < half; i++) {
        float f = p * s->inv_freq[i];
        s->rope_cos[(size_t)t * half + i] = (float)cos((double)f) * scale;
        s->rope_sin[(size_t)t * half + i] = (float)sin((double)f) * scale;
    }
}

static void rope_tables(struct cpu *s, int pos0, int n_tok, int seq_len) {
    for (int t = 0; t < n_tok; t++) rope_row(s, t, pos0 + t, seq_len);
}

/* rope_apply: rotate the first n_rot values of n_heads heads (head_dim
 * apart) of one token: pairs (x_i, x_{i+n_rot/2}) in the HF (rotate_half)
 * layout, or adjacent pairs (x_2i, x_2i+1) when interleaved (DeepSeek); pair
 * i turns by position x inv_freq[i]. */
static void rope_apply(float *v, int n_heads, int head_dim, int n_rot, int interleave, const float *cs, const float *sn) {
    int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        if (interleave) {
            for (int i = 0; i < half; i++) {
                float x1 = x[2 * i], x2 = x[2 * i + 1];
                x[2 * i] = x1 * cs[i] - x2 * sn[i];
                x[2 * i + 1] = x2 * cs[i] + x1 * sn[i];
            }
            continue;
        }
        for (int i = 0; i < half; i++) {
            float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * cs[i] - x2 * sn[i];
            x[i + half] = x2 * cs[i] + x1 * sn[i];
        }
    }
}

/* ---- attention -------------------------------------------------------- */

/* Grouped-query attention keeps its keys transposed in blocks of ATT_KB
 * positions: for layer l and KV head h, the n_ctx positions' keys are one
 * region of n_ctx x head_dim floats, and block b (positions ATT_KB b ..
 * ATT_KB b + w - 1, w = min(ATT_KB, n_ctx - ATT_KB b)) holds head_dim rows of
 * w floats, dimension d of those positions side by side. A query's scores
 * against a block are then one vector sum over d of q[d] times a row of the
 * block: no horizontal sums, and the same operations for one query (decoding)
 * as for a tile of several (prompts), so results do not depend on how tokens
 * are chunked or split between threads. Values stay one row of kv_dim floats
 * per position. */
#define ATT_KB 8

typedef int32_t v8i __attribute__((vector_size(32)));

/* splat8: f in every lane; for constants (a variable times a vector is the
 * form that compiles to one broadcast). */
static inline __attribute__((always_inline)) v8f splat8(float f) { return (v8f){f, f, f, f, f, f, f, f}; }
static inline __attribute__((always_inline)) void st8(float *p, v8f v) { memcpy(p, &v, sizeof v); }
/* sel8: a where the mask m (a comparison's result) is set, else b. */
static inline __attribute__((always_inline)) v8f sel8(v8i m, v8f a, v8f b) {
    return (v8f)(((v8i)a & m) | ((v8i)b & ~m));
}

/* mac8: acc + a b lane by lane; with fused set (the copies compiled for
 * FMA), one rounding (fused multiply-add), else two. The generic copy and the
 * AVX ones then differ by rounding, as the quantized kernels' SIMD copies do;
 * every copy computes each output alike whatever the tile or chunk. (GCC
 * inlines the FMA helper only into FMA targets, and drops it unused from the
 * others; clang builds use the plain form.) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target("fma"))) static inline v8f fma8(v8f acc, v8f a, v8f b) {
    return __builtin_ia32_vfmaddps256(a, b, acc);
}
#define MAC8(acc, a, b, fused) ((fused) ? fma8((acc), (a), (b)) : (acc) + (a) * (b))
#else
#define MAC8(acc, a, b, fused) ((acc) + (a) * (b))
#endif

/* vexp: e^x lane by lane for the softmax (x <= 0 there): Cephes' expf, x = n
 * ln2 + r with |r| <= ln2/2, a polynomial for e^r times 2^n built in the
 * exponent bits. About 1 ulp; 0 below -87 and for -inf (masked scores); NaN
 * stays NaN. */
static inline __attribute__((always_inline)) v8f vexp(v8f x) {
    const v8f magic = splat8(12582912.0f); /* 1.5 x 2^23: adding it rounds to an integer */
    const v8i under = x < splat8(-87.0f);
    x = sel8(under, splat8(-87.0f), x);
    const v8f t = x * splat8(1.44269504088896341f) + magic;
    const v8f n = t - magic;
    v8f r = x - n * splat8(0.693359375f);
    r = r - n * splat8(-2.12194440e-4f);
    v8f p = splat8(1.9875691500e-4f);
    p = p * r + splat8(1.3981999507e-3f);
    p = p * r + splat8(8.3334519073e-3f);
    p = p * r + splat8(4.1665795894e-2f);
    p = p * r + splat8(1.6666665459e-1f);
    p = p * r + splat8(5.0000001201e-1f);
    const v8f y = p * (r * r) + r + splat8(1.0f);
    const v8i e = ((v8i)t - (v8i)magic + 127) << 23;
    return (v8f)((v8i)(y * (v8f)e) & ~under);
}

/* Where the rows of a chunk live: the selected sequence's cache, row t at
 * position pos0 + t (seq == NULL); or, for attention_multi, row t in
 * sequence seq[t]'s cache at position pos[t]. */
struct at_rows {
    const int *seq, *pos;
    int pos0;
};

static inline int row_pos(const struct at_rows *r, int t) { return r->seq ? r->pos[t] : r->pos0 + t; }

/* row_kc / row_vc: the key / value cache row t's sequence uses. */
static inline float *row_kc(const struct cpu *s, const struct at_rows *r, int t) {
    return r->seq ? s->k_all + (size_t)r->seq[t] * s->seq_floats : s->k_cache;
}
static inline float *row_vc(const struct cpu *s, const struct at_rows *r, int t) {
    return r->seq ? s->v_all + (size_t)r->seq[t] * s->seq_floats : s->v_cache;
}

/* key_block: block b of KV head h of layer l in key cache kc as
 * [head_dim][ATT_KB]; a last block narrower than ATT_KB (n_ctx not a
 * multiple of it) is copied into `pad` with zeros after its positions. */
static const float *key_block(const struct cpu *s, const float *kc, int l, int h, int b, float *pad) {
    const int hd = s->m->cfg.head_dim, w = s->p.n_ctx - b * ATT_KB < ATT_KB ? s->p.n_ctx - b * ATT_KB : ATT_KB;
    const float *base = kc + ((size_t)l * (size_t)s->kv_dim + (size_t)h * hd) * (size_t)s->p.n_ctx +
                        (size_t)b * ATT_KB * hd;
    if (w == ATT_KB) return base;
    for (int d = 0; d < hd; d++)
        for (int i = 0; i < ATT_KB; i++) pad[d * ATT_KB + i] = i < w ? base[d * w + i] : 0.0f;
    return pad;
}

/* key_store: position p's keys (kv_dim floats, every KV head) into layer l's
 * key blocks of key cache kc. */
static void key_store(struct cpu *s, float *kc, int l, int p, const float *k) {
    const int hd = s->m->cfg.head_dim, b = p / ATT_KB;
    const int w = s->p.n_ctx - b * ATT_KB < ATT_KB ? s->p.n_ctx - b * ATT_KB : ATT_KB;
    for (int h = 0; h < s->m->cfg.n_head_kv; h++) {
        float *dst = kc + ((size_t)l * (size_t)s->kv_dim + (size_t)h * hd) * (size_t)s->p.n_ctx +
                     (size_t)b * ATT_KB * hd + p % ATT_KB;
        for (int d = 0; d < hd; d++) dst[(size_t)d * w] = k[h * hd + d];
    }
}

struct att_ctx {
    struct cpu *s;
    int layer, n_tok;
    const struct at_rows *r;
    int qt;          /* queries per tile: 1, 2 or 4 */
    int64_t n_pairs; /* (token, head) pairs per KV head: n_tok x group */
    int64_t n_tiles; /* tiles per KV head */
    int tpt;         /* tiles per token when a tile must not span tokens (rows of
                      * several sequences); 0: tiles run across tokens */
};

/* The per-thread scratch of attention: qt score rows of up to n_ctx +
 * ATT_KB positions, then one padded key block. */
static size_t att_stride(const struct cpu *s) {
    return ((size_t)4 * (size_t)(s->p.n_ctx + ATT_KB) + (size_t)s->m->cfg.head_dim * ATT_KB + 15) & ~(size_t)15;
}

/* att_scores: scores of the QT queries q[] against NB key blocks from b
 * (relative block rb in the rows of sc, ns floats apart): per position, the
 * sum over d in order of q[d] k[d], times scale. */
static inline __attribute__((always_inline)) void att_scores(const struct att_ctx *a, const float *kc, int kvh, int b,
                                                             int rb, const float *const *q, float *sc, int ns,
                                                             float *pad, const int QT, const int NB, const int FU) {
    const struct cpu *s = a->s;
    const int hd = s->m->cfg.head_dim;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *kb[4];
    for (int u = 0; u < NB; u++) kb[u] = key_block(s, kc, a->layer, kvh, b + u, pad);
    v8f acc[4][4];
    for (int r = 0; r < QT; r++)
        for (int u = 0; u < NB; u++) acc[r][u] = splat8(0.0f);
    for (int d = 0; d < hd; d++) {
        v8f kv[4];
        for (int u = 0; u < NB; u++) kv[u] = ld8(kb[u] + (size_t)d * ATT_KB);
        for (int r = 0; r < QT; r++) {
            /* scalar x vector: one broadcast (GCC makes a lane-by-lane
             * insert of a {x, x, ..} constructor) */
            const v8f qd = q[r][d] * splat8(1.0f);
            for (int u = 0; u < NB; u++) acc[r][u] = MAC8(acc[r][u], qd, kv[u], FU);
        }
    }
    for (int r = 0; r < QT; r++)
        for (int u = 0; u < NB; u++) st8(sc + (size_t)r * ns + (size_t)(rb + u) * ATT_KB, acc[r][u] * scale);
}

/* att_values: out[r][d0 .. d0 + 8 NV) = sum over positions j0 .. j1 in
 * order of e_r[j] v_j, divided by sum[r]; rows r < n are written. */
static inline __attribute__((always_inline)) void att_values(const float *vc, size_t ldv, int j0, int j1,
                                                             const float *sc, int ns, const float *sum,
                                                             float *const *out, int n, int d0, const int QT,
                                                             const int NV, const int FU) {
    v8f acc[4][4];
    for (int r = 0; r < QT; r++)
        for (int u = 0; u < NV; u++) acc[r][u] = splat8(0.0f);
    for (int j = j0; j <= j1; j++) {
        const float *vr = vc + (size_t)j * ldv + d0;
        v8f vv[4];
        for (int u = 0; u < NV; u++) vv[u] = ld8(vr + 8 * u);
        for (int r = 0; r < QT; r++) {
            const v8f e = sc[(size_t)r * ns + (size_t)(j - j0)] * splat8(1.0f);
            for (int u = 0; u < NV; u++) acc[r][u] = MAC8(acc[r][u], e, vv[u], FU);
        }
    }
    for (int r = 0; r < n; r++)
        for (int u = 0; u < NV; u++) st8(out[r] + d0 + 8 * u, acc[r][u] / sum[r]);
}

/* att_tile: attention of the (token, head) pairs pair0 .. pair0 + n - 1 (n <=
 * QT; pairs t x group + g, token-major) of KV head kvh, which share its keys
 * and values (all in one sequence's cache: the tiles of rows of several
 * sequences hold one token's pairs). Rows past n repeat the last pair and
 * are not written. Scores in
 * blocks of NKB keys, values NV vectors of 8 columns at a time; every output
 * is computed with the same operations in the same order whatever QT, NKB,
 * NV, the tile or the chunk. */
static inline __attribute__((always_inline)) void att_tile(const struct att_ctx *a, int kvh, int64_t pair0, int n,
                                                           float *sc, float *pad, const int QT, const int NKB,
                                                           const int NV, const int FU) {
    const struct cpu *s = a->s;
    const struct moe_config *c = &s->m->cfg;
    const int hd = c->head_dim, group = c->n_head / c->n_head_kv, l = a->layer;
    const float *sink = s->m->layers[l].sinks; /* gpt-oss: a logit with no value */
    const float *q[4];
    float *out[4] = {NULL}, sum[4] = {0};
    int p[4], lo[4], h[4], klo = INT32_MAX, khi = 0;
    for (int r = 0; r < QT; r++) {
        const int64_t pr = pair0 + (r < n ? r : n - 1);
        const int t = (int)(pr / group);
        h[r] = kvh * group + (int)(pr % group);
        p[r] = row_pos(a->r, t);
        lo[r] = c->layer_sliding[l] && p[r] - c->sliding_window + 1 > 0 ? p[r] - c->sliding_window + 1 : 0;
        q[r] = s->q + (size_t)t * s->q_dim + (size_t)h[r] * hd;
        out[r] = s->att + (size_t)t * s->q_dim + (size_t)h[r] * hd;
        if (lo[r] < klo) klo = lo[r];
        if (p[r] > khi) khi = p[r];
    }
    /* scores of positions j0 .. j0 + ns - 1 (whole key blocks) */
    const int b0 = klo / ATT_KB, b1 = khi / ATT_KB, ns = (b1 - b0 + 1) * ATT_KB, j0 = b0 * ATT_KB;
    const int t0 = (int)(pair0 / group);
    const float *kc = row_kc(s, a->r, t0);
    int b = b0;
    for (; b + NKB - 1 <= b1; b += NKB) att_scores(a, kc, kvh, b, b - b0, q, sc, ns, pad, QT, NKB, FU);
    for (; b <= b1; b++) att_scores(a, kc, kvh, b, b - b0, q, sc, ns, pad, QT, 1, FU);
    /* softmax numerators in place (masked positions: 0) and their sums, in
     * 8 lanes by position mod 8, then sum8 */
    for (int r = 0; r < QT; r++) {
        float *row = sc + (size_t)r * ns;
        for (int j = j0; j < lo[r]; j++) row[j - j0] = -INFINITY;
        for (int j = p[r] + 1; j < j0 + ns; j++) row[j - j0] = -INFINITY;
        v8f mv = splat8(-INFINITY);
        for (int i = 0; i < ns; i += 8) {
            const v8f x = ld8(row + i);
            mv = sel8(x > mv, x, mv);
        }
        float mx = mv[0];
        for (int i = 1; i < 8; i++) mx = mv[i] > mx ? mv[i] : mx;
        if (sink && sink[h[r]] > mx) mx = sink[h[r]];
        v8f sv = splat8(0.0f);
        for (int i = 0; i < ns; i += 8) {
            const v8f e = vexp(ld8(row + i) - mx);
            st8(row + i, e);
            sv += e;
        }
        sum[r] = sum8(sv) + (sink ? vexp(splat8(0.0f) + (sink[h[r]] - mx))[0] : 0.0f);
    }
    /* out = sum_j e_j v_j / sum over positions j0 .. khi (exact zeros past a
     * row's own position) */
    const float *vc = row_vc(s, a->r, t0) + (size_t)l * s->p.n_ctx * s->kv_dim + (size_t)kvh * hd;
    int d = 0;
    for (; d + 8 * NV <= hd; d += 8 * NV)
        att_values(vc, (size_t)s->kv_dim, j0, khi, sc, ns, sum, out, n, d, QT, NV, FU);
    for (; d + 8 <= hd; d += 8) att_values(vc, (size_t)s->kv_dim, j0, khi, sc, ns, sum, out, n, d, QT, 1, FU);
    for (; d < hd; d++)
        for (int r = 0; r < n; r++) {
            float o = 0;
            for (int j = j0; j <= khi; j++) o += sc[(size_t)r * ns + (size_t)(j - j0)] * vc[(size_t)j * s->kv_dim + d];
            out[r][d] = o / sum[r];
        }
}

/* att_items: work items [b, e) of the attention loop: item i is KV head i %
 * n_kv of tile n_tiles - 1 - i / n_kv (the latest tokens, with the most
 * positions to attend to, first: the threads finish together). With tpt set,
 * tile T is part T % tpt of token T / tpt's pairs. */
static inline __attribute__((always_inline)) void att_items(const struct att_ctx *a, int64_t b, int64_t e, int tid,
                                                            const int NKB, const int NV, const int FU) {
    const struct cpu *s = a->s;
    const int nkv = s->m->cfg.n_head_kv;
    float *sc = s->att_buf + (size_t)tid * att_stride(s);
    float *pad = sc + (size_t)4 * (size_t)(s->p.n_ctx + ATT_KB);
    for (int64_t it = b; it < e; it++) {
        const int kvh = (int)(it % nkv);
        const int64_t tile = a->n_tiles - 1 - it / nkv;
        int64_t pair0 = tile * a->qt, end = a->n_pairs;
        if (a->tpt) { /* within one token's group of pairs */
            const int64_t group = a->n_pairs / a->n_tok, t = tile / a->tpt;
            pair0 = t * group + (tile % a->tpt) * a->qt, end = (t + 1) * group;
        }
        const int n = (int)(end - pair0 < a->qt ? end - pair0 : a->qt);
        if (a->qt == 4)
            att_tile(a, kvh, pair0, n, sc, pad, 4, NKB, NV, FU);
        else if (a->qt == 2)
            att_tile(a, kvh, pair0, n, sc, pad, 2, NKB, NV, FU);
        else
            att_tile(a, kvh, pair0, n, sc, pad, 1, NKB, NV, FU);
    }
}

static void att_generic(struct att_ctx *a, int64_t b, int64_t e, int tid) { att_items(a, b, e, tid, 2, 2, 0); }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma"))) static void att_avx2(struct att_ctx *a, int64_t b, int64_t e, int tid) {
    att_items(a, b, e, tid, 2, 2, 1);
}
/* AVX-512VL: the same 8-lane operations with 32 registers, so wider tiles */
__attribute__((target("avx512f,avx512vl,avx2,fma"))) static void att_avx512(struct att_ctx *a, int64_t b, int64_t e,
                                                                            int tid) {
    att_items(a, b, e, tid, 4, 4, 1);
}
#endif

static void att_range(void *vctx, int64_t b, int64_t e, int tid) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    struct att_ctx *a = vctx;
    if (a->s->avx512) {
        att_avx512(a, b, e, tid);
        return;
    }
    if (a->s->avx2) {
        att_avx2(a, b, e, tid);
        return;
    }
#endif
    att_generic(vctx, b, e, tid);
}

/* qkv_post: token t's q, k and v after the projections: QK norms, clipping,
 * RoPE, then its keys and values into layer l of its sequence's cache at its
 * position. */
static void qkv_post(struct cpu *s, int l, const struct at_rows *r, int t) {
    const struct moe_config *c = &s->m->cfg;
    const struct moe_layer *L = &s->m->layers[l];
    const int hd = c->head_dim;
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
    rope_apply(q, c->n_head, hd, c->rope.n_rot, c->rope.interleave, cs, sn);
    rope_apply(k, c->n_head_kv, hd, c->rope.n_rot, c->rope.interleave, cs, sn);
    const int p = row_pos(r, t);
    key_store(s, row_kc(s, r, t), l, p, k);
    memcpy(row_vc(s, r, t) + ((size_t)l * s->p.n_ctx + (size_t)p) * s->kv_dim, v, sizeof(float) * s->kv_dim);
}

struct qkv_ctx {
    struct cpu *s;
    int layer;
    const struct at_rows *r;
};

/* qkv_range: the attention block's first step for tokens [b, e), whole rows
 * per thread (token_split): norm, one quantization of each input row, q, k
 * and v, qkv_post. */
static void qkv_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct qkv_ctx *a = vctx;
    struct cpu *s = a->s;
    const struct moe_config *c = &s->m->cfg;
    const struct moe_layer *L = &s->m->layers[a->layer];
    const int64_t H = c->n_embd;
    const size_t xs = s->aq_cap;
    for (int64_t t0 = b; t0 < e; t0 += TOK_SUB) {
        const int nt = (int)(e - t0 < TOK_SUB ? e - t0 : TOK_SUB);
        uint8_t *xq = s->aq + (size_t)t0 * xs;
        norm_rows(c, s->xn + t0 * H, s->x + t0 * H, L->attn_norm, L->attn_norm_b, nt);
        for (int i = 0; i < nt; i++) moe_quantize_act(L->wq.type, s->xn + (t0 + i) * H, xq + (size_t)i * xs, H);
        mat_rows(&L->wq, L->bq, xq, xs, nt, s->q + t0 * s->q_dim, s->q_dim);
        mat_rows(&L->wk, L->bk, xq, xs, nt, s->k + t0 * s->kv_dim, s->kv_dim);
        mat_rows(&L->wv, L->bv, xq, xs, nt, s->v + t0 * s->kv_dim, s->kv_dim);
        for (int i = 0; i < nt; i++) qkv_post(s, a->layer, a->r, (int)t0 + i);
    }
}

/* wo_range: the attention block's output for tokens [b, e), whole rows per
 * thread (token_split): quantize the heads' outputs, wo, and the residual
 * x += wo att. */
static void wo_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct qkv_ctx *a = vctx;
    struct cpu *s = a->s;
    const int64_t H = s->m->cfg.n_embd;
    const struct moe_weight *wo = &s->m->layers[a->layer].wo;
    const size_t xs = s->aq_cap;
    for (int64_t t0 = b; t0 < e; t0 += TOK_SUB) {
        const int nt = (int)(e - t0 < TOK_SUB ? e - t0 : TOK_SUB);
        uint8_t *xq = s->aq + (size_t)t0 * xs;
        for (int i = 0; i < nt; i++)
            moe_quantize_act(wo->type, s->att + (t0 + i) * s->q_dim, xq + (size_t)i * xs, s->q_dim);
        mat_rows(wo, s->m->layers[a->layer].bo, xq, xs, nt, s->tmp + t0 * H, H);
        for (int64_t i = t0 * H; i < (t0 + nt) * H; i++) s->x[i] += s->tmp[i];
    }
}

/* attention: self-attention block of layer l for a chunk of n_tok tokens
 * (rows where r says), from the attention norm to the residual x += wo att. */
static void attention(struct cpu *s, int l, const struct at_rows *r, int n_tok) {
    const struct moe_config *c = &s->m->cfg;
    const struct moe_layer *L = &s->m->layers[l];
    const int hd = c->head_dim;
    const enum moe_qtype at = moe_act_type(L->wq.type);
    const int shared_xq = int_path(s, L->wq.type) && moe_act_type(L->wk.type) == at && moe_act_type(L->wv.type) == at;
    struct qkv_ctx qc = {s, l, r};
    if (shared_xq && token_split(s, weight_bytes(&L->wq) + weight_bytes(&L->wk) + weight_bytes(&L->wv), n_tok)) {
        moe_pool_for(s->pool, n_tok, TOK_MIN, qkv_range, &qc);
    } else {
        norm_rows(c, s->xn, s->x, L->attn_norm, L->attn_norm_b, n_tok);
        if (shared_xq) { /* q, k and v share one quantization of the input */
            const size_t xs = act_quantize(s, L->wq.type, s->xn, c->n_embd, c->n_embd, n_tok);
            struct mat_job jobs[3] = {
                {.w = &L->wq, .bias = L->bq, .xq = s->aq, .xs = xs, .n_tok = n_tok, .y = s->q, .ldy = s->q_dim},
                {.w = &L->wk, .bias = L->bk, .xq = s->aq, .xs = xs, .n_tok = n_tok, .y = s->k, .ldy = s->kv_dim},
                {.w = &L->wv, .bias = L->bv, .xq = s->aq, .xs = xs, .n_tok = n_tok, .y = s->v, .ldy = s->kv_dim}};
            run_jobs(s, jobs, 3); /* one loop over the rows of all three */
        } else {
            matmul(s, &L->wq, L->bq, s->xn, c->n_embd, s->q, s->q_dim, n_tok);
            matmul(s, &L->wk, L->bk, s->xn, c->n_embd, s->k, s->kv_dim, n_tok);
            matmul(s, &L->wv, L->bv, s->xn, c->n_embd, s->v, s->kv_dim, n_tok);
        }
        for (int t = 0; t < n_tok; t++) qkv_post(s, l, r, t);
    }
    /* tiles of up to 4 (token, head) pairs of one KV head; a chunk of the
     * loop gets at least ~32K multiply-adds (scores and values over up to
     * pos0 + n_tok positions), or short contexts would cost more in
     * hand-offs than they gain */
    const int group = c->n_head / c->n_head_kv;
    const int64_t n_pairs = (int64_t)n_tok * group;
    int top = row_pos(r, n_tok - 1); /* the most positions a row attends to, - 1 */
    for (int t = 0; r->seq && t < n_tok; t++) top = r->pos[t] > top ? r->pos[t] : top;
    int qt = n_pairs >= 4 ? 4 : n_pairs >= 2 ? 2 : 1;
    if (r->seq && n_tok > 1 && qt > group) qt = group >= 2 ? 2 : 1; /* a tile holds one token's pairs */
    const int tpt = r->seq && n_tok > 1 ? (group + qt - 1) / qt : 0;
    struct att_ctx a = {s, l, n_tok, r, qt, n_pairs, tpt ? (int64_t)tpt * n_tok : (n_pairs + qt - 1) / qt, tpt};
    const int64_t per_item = (int64_t)2 * hd * qt * (top + 1);
    moe_pool_for(s->pool, a.n_tiles * c->n_head_kv, (32768 + per_item - 1) / per_item, att_range, &a);
    if (int_path(s, L->wo.type) && token_split(s, weight_bytes(&L->wo), n_tok)) {
        moe_pool_for(s->pool, n_tok, TOK_MIN, wo_range, &qc);
        return;
    }
    matmul(s, &L->wo, L->bo, s->att, s->q_dim, s->tmp, c->n_embd, n_tok);
    for (int64_t i = 0; i < (int64_t)n_tok * c->n_embd; i++) s->x[i] += s->tmp[i];
}

/* ---- multi-head latent attention (DeepSeek-V2/V3) ------------------------
 *
 * transformers expands every cached latent c_j through kv_b_proj into each
 * head's key k_j = W_UK c_j and value v_j = W_UV c_j. Here the cache keeps
 * c_j (normed latent) and the rotated rope key only, and kv_b_proj is
 * absorbed: q.k_j = (W_UK^T q_nope).c_j + q_rope.k_rope_j, and
 * sum_j p_j v_j = W_UV (sum_j p_j c_j). Same arithmetic up to rounding, and the
 * cache is kv_lora_rank + qk_rope_dim floats per token instead of
 * n_head x (head_dim + v_head_dim). */

/* The latent-space eps of q_a_layernorm and kv_a_layernorm: transformers
 * builds them with its RMSNorm default, not rms_norm_eps. */
#define MLA_LATENT_EPS 1e-6f

struct mla_ctx {
    struct cpu *s;
    const struct moe_layer *L;
    int layer, n_tok;
    const struct at_rows *r;
};

/* mla_absorb_range: qlat[t][h] = W_UK[h]^T q_nope[t][h] for heads [b, e). */
static void mla_absorb_range(void *vctx, int64_t b, int64_t e, int tid) {
    struct mla_ctx *a = vctx;
    struct cpu *s = a->s;
    const struct moe_config *c = &s->m->cfg;
    const int nope = c->qk_nope_dim, r = c->kv_lora_rank, nh = c->n_head, per = nope + c->v_head_dim;
    float *buf = s->row_buf + (size_t)tid * (size_t)s->max_in;
    for (int64_t h = b; h < e; h++) {
        for (int t = 0; t < a->n_tok; t++) memset(s->qlat + ((size_t)t * nh + h) * r, 0, sizeof(float) * (size_t)r);
        for (int d = 0; d < nope; d++) {
            const float *row = weight_row(&a->L->wkv_b, h * per + d, buf);
            for (int t = 0; t < a->n_tok; t++) {
                const float qd = s->q[(size_t)t * s->q_dim + (size_t)h * c->head_dim + d];
                float *ql = s->qlat + ((size_t)t * nh + h) * r;
                for (int i = 0; i < r; i++) ql[i] += qd * row[i];
            }
        }
    }
}

/* mla_score_range: for (token, head) pairs [b, e): softmax over the cached
 * positions of (qlat.c_j + q_rope.k_rope_j) * scale, and olat = sum_j p_j c_j. */
static void mla_score_range(void *vctx, int64_t b, int64_t e, int tid) {
    struct mla_ctx *a = vctx;
    struct cpu *s = a->s;
    const struct moe_config *c = &s->m->cfg;
    const int nh = c->n_head, r = c->kv_lora_rank, rd = c->qk_rope_dim;
    float *sc = s->att_buf + (size_t)tid * att_stride(s);
    for (int64_t it = b; it < e; it++) {
        const int t = (int)(it / nh), h = (int)(it % nh), p = row_pos(a->r, t);
        const float *kc = row_kc(s, a->r, t) + (size_t)a->layer * s->p.n_ctx * s->kv_row;
        const float *ql = s->qlat + ((size_t)t * nh + h) * r;
        const float *qr = s->q + (size_t)t * s->q_dim + (size_t)h * c->head_dim + c->qk_nope_dim;
        float mx = -INFINITY;
        for (int j = 0; j <= p; j++) {
            const float *row = kc + (size_t)j * s->kv_row;
            sc[j] = (dot(ql, row, r) + dot(qr, row + r, rd)) * c->attn_scale;
            if (sc[j] > mx) mx = sc[j];
        }
        float sum = 0;
        for (int j = 0; j <= p; j++) sum += (sc[j] = expf(sc[j] - mx));
        float *ol = s->olat + ((size_t)t * nh + h) * r;
        memset(ol, 0, sizeof(float) * (size_t)r);
        for (int j = 0; j <= p; j++) {
            const float w = sc[j] / sum, *row = kc + (size_t)j * s->kv_row;
            for (int i = 0; i < r; i++) ol[i] += w * row[i];
        }
    }
}

/* mla_value_range: att[t][h] = W_UV[h] olat[t][h] for heads [b, e). */
static void mla_value_range(void *vctx, int64_t b, int64_t e, int tid) {
    struct mla_ctx *a = vctx;
    struct cpu *s = a->s;
    const struct moe_config *c = &s->m->cfg;
    const int nope = c->qk_nope_dim, vd = c->v_head_dim, r = c->kv_lora_rank, nh = c->n_head;
    float *buf = s->row_buf + (size_t)tid * (size_t)s->max_in;
    for (int64_t h = b; h < e; h++)
        for (int d = 0; d < vd; d++) {
            const float *row = weight_row(&a->L->wkv_b, h * (nope + vd) + nope + d, buf);
            for (int t = 0; t < a->n_tok; t++)
                s->att[(size_t)t * nh * vd + (size_t)h * vd + d] = dot(row, s->olat + ((size_t)t * nh + h) * r, r);
        }
}

/* attention_mla: the latent attention block of layer l for n_tok tokens
 * (rows where r says). */
static void attention_mla(struct cpu *s, int l, const struct at_rows *rw, int n_tok) {
    const struct moe_config *c = &s->m->cfg;
    const struct moe_layer *L = &s->m->layers[l];
    const int64_t H = c->n_embd, r = c->kv_lora_rank, qr = c->q_lora_rank;
    if (qr > 0) {
        matmul(s, &L->wq_a, L->bq_a, s->xn, H, s->qa, qr, n_tok);
        for (int t = 0; t < n_tok; t++) rms_norm(s->qa + t * qr, s->qa + t * qr, L->q_a_norm, qr, MLA_LATENT_EPS);
        matmul(s, &L->wq_b, NULL, s->qa, qr, s->q, s->q_dim, n_tok);
    } else {
        matmul(s, &L->wq, NULL, s->xn, H, s->q, s->q_dim, n_tok);
    }
    matmul(s, &L->wkv_a, L->bkv_a, s->xn, H, s->ckv, s->kv_row, n_tok);
    const int half = c->rope.n_rot / 2;
    for (int t = 0; t < n_tok; t++) {
        float *kv = s->ckv + (size_t)t * s->kv_row;
        const float *cs = s->rope_cos + (size_t)t * half, *sn = s->rope_sin + (size_t)t * half;
        rms_norm(kv, kv, L->kv_a_norm, r, MLA_LATENT_EPS);
        rope_apply(kv + r, 1, c->qk_rope_dim, c->rope.n_rot, c->rope.interleave, cs, sn);
        rope_apply(s->q + (size_t)t * s->q_dim + c->qk_nope_dim, c->n_head, c->head_dim, c->rope.n_rot,
                   c->rope.interleave, cs, sn);
        memcpy(row_kc(s, rw, t) + ((size_t)l * s->p.n_ctx + (size_t)row_pos(rw, t)) * s->kv_row, kv,
               sizeof(float) * (size_t)s->kv_row);
    }
    struct mla_ctx a = {s, L, l, n_tok, rw};
    moe_pool_for(s->pool, c->n_head, 1, mla_absorb_range, &a);
    moe_pool_for(s->pool, (int64_t)n_tok * c->n_head, 1, mla_score_range, &a);
    moe_pool_for(s->pool, c->n_head, 1, mla_value_range, &a);
    matmul(s, &L->wo, L->bo, s->att, (int64_t)c->n_head * c->v_head_dim, s->tmp, H, n_tok);
}

/* expert_out: a routed expert's output row y for token t in slot k, weighted
 * by wi. With at most two slots it is added to acc[t] at once: acc starts at
 * 0 and a sum of two terms does not depend on their order, so the experts may
 * come in any order (and the row need not go through memory again). With more
 * slots it waits in part[t][k], and cpu_residual adds the slots in order. */
static void expert_out(struct cpu *s, int64_t t, int64_t k, const float *y, float wi) {
    const int64_t H = s->m->cfg.n_embd, S = s->p.n_slots;
    if (S <= 2) {
        float *a = s->acc + t * H;
        for (int64_t d = 0; d < H; d++) a[d] += y[d] * wi;
        return;
    }
    float *dst = s->part + (t * S + k) * H;
    for (int64_t d = 0; d < H; d++) dst[d] = y[d] * wi;
    s->part_used[t * S + k] = 1;
}

struct ffn_ctx {
    struct cpu *s;
    const struct moe_ffn *f;
    const float *x;       /* input rows, n_embd floats apart */
    const int32_t *rows;  /* row i is x row rows[i] (NULL: row i) */
    const int32_t *slots; /* routed expert: part[rows[i]][slots[i]] = w[i] y[i] (NULL: none) */
    const float *w;
    float *y; /* [n x n_embd] */
};

/* ffn_range: the SwiGLU FFN of rows [b, e) with integer kernels, whole rows
 * per thread (token_split): quantize the input rows (gathered through
 * rows[]), gate and up with SiLU, quantize, down; a routed expert's rows
 * weighted into their slots of part. */
static void ffn_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct ffn_ctx *a = vctx;
    struct cpu *s = a->s;
    const struct moe_weight *g = &a->f->gate, *u = &a->f->up, *d = &a->f->down;
    const int64_t H = s->m->cfg.n_embd, F = g->n_out;
    const size_t xs = s->aq_cap;
    for (int64_t i0 = b; i0 < e; i0 += TOK_SUB) {
        const int nt = (int)(e - i0 < TOK_SUB ? e - i0 : TOK_SUB);
        uint8_t *xq = s->aq + (size_t)i0 * xs;
        for (int i = 0; i < nt; i++) {
            const int64_t r = a->rows ? a->rows[i0 + i] : i0 + i;
            moe_quantize_act(g->type, a->x + r * H, xq + (size_t)i * xs, H);
        }
        moe_gate_up_act(g->type, H, g->data, u->data, F, xq, xs, nt, s->ge + i0 * F, (size_t)F);
        for (int i = 0; i < nt; i++) moe_quantize_act(d->type, s->ge + (i0 + i) * F, xq + (size_t)i * xs, F);
        mat_rows(d, NULL, xq, xs, nt, a->y + i0 * H, H);
        for (int i = 0; a->slots && i < nt; i++)
            expert_out(s, a->rows[i0 + i], a->slots[i0 + i], a->y + (i0 + i) * H, a->w[i0 + i]);
    }
}

/* ffn_fused: 1 if f runs as SiLU(gate) x up with no biases and integer
 * kernels for gate, up (one type) and down. */
static int ffn_fused(const struct cpu *s, const struct moe_ffn *f, int expert) {
    return !f->bias && !(expert && s->m->cfg.expert_act == MOE_ACT_SWIGLU_OAI) && f->gate.type == f->up.type &&
           int_path(s, f->gate.type) && int_path(s, f->down.type);
}

/* ffn_token_split: 1 if f over n rows takes ffn_range. */
static int ffn_token_split(const struct cpu *s, const struct moe_ffn *f, int n, int expert) {
    return ffn_fused(s, f, expert) &&
           token_split(s, weight_bytes(&f->gate) + weight_bytes(&f->up) + weight_bytes(&f->down), n);
}

/* ffn: y = down(act(gate x, up x)) for n rows of x (ld n_embd), with the
 * biases of f->bias if set. act: silu(g) * u, or for a routed expert of a
 * MOE_ACT_SWIGLU_OAI model gpt-oss's clamped form
 * min(g, L) * sigmoid(alpha min(g, L)) * (clamp(u, -L, L) + 1). With SiLU,
 * no biases and integer kernels for gate and up (same type), both run in one
 * pass with SiLU fused (moe_gate_up_act). */
static void ffn(struct cpu *s, const struct moe_ffn *f, const float *x, float *y, int n, int expert) {
    const struct moe_config *c = &s->m->cfg;
    int64_t F = f->gate.n_out, H = c->n_embd;
    const float *b = f->bias;
    const int oai = expert && c->expert_act == MOE_ACT_SWIGLU_OAI;
    if (ffn_token_split(s, f, n, expert)) {
        struct ffn_ctx fc = {s, f, x, NULL, NULL, NULL, y};
        moe_pool_for(s->pool, n, TOK_MIN, ffn_range, &fc);
        return;
    }
    if (!b && !oai && f->gate.type == f->up.type && int_path(s, f->gate.type)) {
        /* integer kernels: gate and up in one pass over their rows with SiLU
         * fused, split by rows across the threads */
        const size_t xs = act_quantize(s, f->gate.type, x, H, H, n);
        const int64_t u = moe_qtype_group_rows(f->gate.type);
        struct gu_ctx gc = {f, s->aq, xs, n, s->ge, u};
        /* gate and up: twice the work of one matrix per row */
        moe_pool_for(s->pool, F / u, ((min_rows(H, n) + 1) / 2 + u - 1) / u, gu_range, &gc);
        matmul(s, &f->down, NULL, s->ge, F, y, H, n);
        return;
    }
    matmul(s, &f->gate, b, x, H, s->ge, F, n);
    matmul(s, &f->up, b ? b + F : NULL, x, H, s->ue, F, n);
    if (oai) {
        const float lim = c->swiglu_limit, alpha = c->swiglu_alpha;
        for (int64_t i = 0; i < (int64_t)n * F; i++) {
            float g = fminf(s->ge[i], lim), u = fminf(fmaxf(s->ue[i], -lim), lim);
            s->ge[i] = (g * (1.0f / (1.0f + expf(-(g * alpha))))) * (u + 1.0f);
        }
    } else {
        for (int64_t i = 0; i < (int64_t)n * F; i++) s->ge[i] = silu(s->ge[i]) * s->ue[i];
    }
    matmul(s, &f->down, b ? b + 2 * F : NULL, s->ge, F, y, H, n);
}

/* ---- the interface ---------------------------------------------------- */

static struct cpu *ctx(struct moe_backend *be) { return be->ctx; }

static enum moe_status cpu_buffer_alloc(struct moe_backend *be, size_t size, struct moe_buffer *out) {
    (void)be;
    memset(out, 0, sizeof *out);
    void *p = NULL;
    size_t n = (size + 4095) & ~(size_t)4095;
    if (posix_memalign(&p, 4096, n ? n : 4096)) {
        MOE_LOGE("cannot allocate %zu bytes", size);
        return MOE_ERR_NOMEM;
    }
    out->data = out->host = p;
    out->size = size;
    return MOE_OK;
}

static void cpu_buffer_free(struct moe_backend *be, struct moe_buffer *buf) {
    (void)be;
    if (!buf) return;
    free(buf->data);
    memset(buf, 0, sizeof *buf);
}

static enum moe_status cpu_buffer_write(struct moe_backend *be, struct moe_buffer *dst, size_t off, const void *src,
                                        size_t n) {
    (void)be;
    if (off > dst->size || n > dst->size - off) return MOE_ERR_RANGE;
    if ((const char *)dst->host + off != src) memcpy((char *)dst->host + off, src, n);
    return MOE_OK;
}

/* elapsed_ns: nanoseconds since t0 (monotonic clock). */
static int64_t elapsed_ns(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)(t.tv_sec - t0->tv_sec) * 1000000000 + (t.tv_nsec - t0->tv_nsec);
}

static enum moe_status cpu_embed(struct moe_backend *be, const int32_t *tokens, int n) {
    struct cpu *s = ctx(be);
    /* a step starts: every thread, or (a small model's decode step, where one
     * thread measured faster) the caller alone; moe-adapt.h */
    moe_pool_set_solo(s->pool, moe_adapt_begin(&s->adapt, n));
    if (s->adapt.measured) clock_gettime(CLOCK_MONOTONIC, &s->step_t0);
    const int64_t H = s->m->cfg.n_embd;
    for (int t = 0; t < n; t++) {
        const float *row = weight_row(&s->m->tok_embd, tokens[t], s->row_buf);
        memcpy(s->x + (size_t)t * H, row, sizeof(float) * (size_t)H);
    }
    return MOE_OK;
}

static enum moe_status cpu_set_x(struct moe_backend *be, const float *x, int n) {
    struct cpu *s = ctx(be);
    moe_pool_set_solo(s->pool, moe_adapt_begin(&s->adapt, 0)); /* a step from a given stream: parallel, unmeasured */
    memcpy(s->x, x, sizeof(float) * (size_t)n * (size_t)s->m->cfg.n_embd);
    return MOE_OK;
}

static enum moe_status cpu_get_x(struct moe_backend *be, float *x, int n) {
    struct cpu *s = ctx(be);
    memcpy(x, s->x, sizeof(float) * (size_t)n * (size_t)s->m->cfg.n_embd);
    return MOE_OK;
}

static enum moe_status cpu_get_xn(struct moe_backend *be, float *xn, int n) {
    struct cpu *s = ctx(be);
    memcpy(xn, s->xn, sizeof(float) * (size_t)n * (size_t)s->m->cfg.n_embd);
    return MOE_OK;
}

/* attention_rows: the attention block of layer l for n rows (where r says),
 * the rope tables already made. */
static void attention_rows(struct cpu *s, int layer, const struct at_rows *r, int n) {
    const struct moe_config *c = &s->m->cfg;
    const struct moe_layer *L = &s->m->layers[layer];
    if (c->attn != MOE_ATTN_MLA) {
        attention(s, layer, r, n); /* norm to residual */
        return;
    }
    norm_rows(c, s->xn, s->x, L->attn_norm, L->attn_norm_b, n);
    attention_mla(s, layer, r, n);
    for (int64_t i = 0; i < (int64_t)n * c->n_embd; i++) s->x[i] += s->tmp[i];
}

static enum moe_status cpu_attention(struct moe_backend *be, int layer, int pos0, int n, int seq_len) {
    struct cpu *s = ctx(be);
    if (s->rope_multi || s->rope_pos0 != pos0 || s->rope_n != n || s->rope_len != seq_len) {
        rope_tables(s, pos0, n, seq_len);
        s->rope_pos0 = pos0, s->rope_n = n, s->rope_len = seq_len, s->rope_multi = 0;
    }
    const struct at_rows r = {NULL, NULL, pos0};
    attention_rows(s, layer, &r, n);
    return MOE_OK;
}

static enum moe_status cpu_kv_seq(struct moe_backend *be, int seq) {
    struct cpu *s = ctx(be);
    if (seq < 0 || seq >= s->n_seq) {
        MOE_LOGE("KV cache of sequence %d asked; the backend holds %d", seq, s->n_seq);
        return MOE_ERR_INVALID;
    }
    s->k_cache = s->k_all + (size_t)seq * s->seq_floats;
    if (s->v_all) s->v_cache = s->v_all + (size_t)seq * s->seq_floats;
    return MOE_OK;
}

/* cpu_attention_multi: each row's rope table at its own position (its
 * seq_len pos + 1, as a one-token forward call has), then the block with
 * every row in its own sequence's cache. */
static enum moe_status cpu_attention_multi(struct moe_backend *be, int layer, const int *seq, const int *pos, int n) {
    struct cpu *s = ctx(be);
    if (n < 1 || n > s->p.n_batch) {
        MOE_LOGE("attention over %d rows; the backend takes 1 .. %d", n, s->p.n_batch);
        return MOE_ERR_INVALID;
    }
    for (int i = 0; i < n; i++)
        if (seq[i] < 0 || seq[i] >= s->n_seq || pos[i] < 0 || pos[i] >= s->p.n_ctx) {
            MOE_LOGE("row %d: sequence %d at position %d (the backend holds %d sequences of %d)", i, seq[i], pos[i],
                     s->n_seq, s->p.n_ctx);
            return MOE_ERR_INVALID;
        }
    int same = s->rope_multi && s->rope_n == n;
    for (int i = 0; same && i < n; i++) same = s->rope_at[i] == pos[i];
    if (!same) { /* once per step: every layer's rows are at the same positions */
        for (int i = 0; i < n; i++) rope_row(s, i, pos[i], pos[i] + 1);
        memcpy(s->rope_at, pos, sizeof(int) * (size_t)n);
        s->rope_multi = 1, s->rope_n = n;
    }
    const struct at_rows r = {seq, pos, 0};
    attention_rows(s, layer, &r, n);
    return MOE_OK;
}

struct rows_ctx {
    struct cpu *s;
    const struct moe_layer *L;
};

/* The fewest tokens per chunk of the per-token loops below (norms, sums):
 * each token is a few hundred nanoseconds of work. */
#define ROWS_MIN 32

/* ffn_norm_range: tokens [b, e) of cpu_ffn_norm. */
static void ffn_norm_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct rows_ctx *a = vctx;
    struct cpu *s = a->s;
    const struct moe_config *c = &s->m->cfg;
    const int64_t H = c->n_embd;
    norm_rows(c, s->xn + b * H, s->x + b * H, a->L->ffn_norm, a->L->ffn_norm_b, (int)(e - b));
    memset(s->acc + b * H, 0, sizeof(float) * (size_t)((e - b) * H));
    memset(s->part_used + b * s->p.n_slots, 0, (size_t)((e - b) * s->p.n_slots));
}

static enum moe_status cpu_ffn_norm(struct moe_backend *be, int layer, int n) {
    struct cpu *s = ctx(be);
    struct rows_ctx a = {s, &s->m->layers[layer]};
    moe_pool_for(s->pool, n, ROWS_MIN, ffn_norm_range, &a);
    s->shared_pending = 0;
    return MOE_OK;
}

static enum moe_status cpu_router(struct moe_backend *be, int layer, int n, float *logits) {
    struct cpu *s = ctx(be);
    const struct moe_config *c = &s->m->cfg;
    const struct moe_layer *L = &s->m->layers[layer];
    matmul(s, &L->router, L->router_b, s->xn, c->n_embd, logits, c->n_expert, n);
    return MOE_OK;
}

static enum moe_status cpu_expert(struct moe_backend *be, const struct moe_ffn *f, const int32_t *rows,
                                  const int32_t *slots, const float *w, int n_rows, float *out) {
    struct cpu *s = ctx(be);
    const int64_t H = s->m->cfg.n_embd;
    for (int done = 0; done < n_rows;) {
        int n = n_rows - done < s->p.n_batch ? n_rows - done : s->p.n_batch;
        if (ffn_token_split(s, f, n, 1)) { /* gathered, computed and weighted (expert_out) in one loop */
            struct ffn_ctx fc = {s, f, s->xn, rows + done, slots + done, w + done, s->ye};
            moe_pool_for(s->pool, n, TOK_MIN, ffn_range, &fc);
            if (out) memcpy(out + (size_t)done * H, s->ye, sizeof(float) * (size_t)n * (size_t)H);
            done += n;
            continue;
        }
        for (int i = 0; i < n; i++)
            memcpy(s->xe + (size_t)i * H, s->xn + (size_t)rows[done + i] * H, sizeof(float) * (size_t)H);
        ffn(s, f, s->xe, s->ye, n, 1);
        for (int i = 0; i < n; i++) expert_out(s, rows[done + i], slots[done + i], s->ye + (size_t)i * H, w[done + i]);
        if (out) memcpy(out + (size_t)done * H, s->ye, sizeof(float) * (size_t)n * (size_t)H);
        done += n;
    }
    return MOE_OK;
}

/* The most works cpu_expert_batch runs in one loop (a layer's routed
 * experts; more run in several loops). */
#define BATCH_MAX_WORKS 64

struct eq_ctx {
    struct cpu *s;
    const struct moe_expert_work *works;
    const int64_t *row0; /* [n + 1] each work's first gathered row */
    int n;
    int down; /* 0: gather and quantize xn rows for gate/up; 1: quantize ge rows for down */
};

/* eq_range: gathered rows [b, e) of a batch: quantize each for its work's weights
 * into aq (row r at r * aq_cap). */
static void eq_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct eq_ctx *c = vctx;
    struct cpu *s = c->s;
    const int64_t H = s->m->cfg.n_embd;
    int w = 0;
    for (int64_t r = b; r < e; r++) {
        while (c->row0[w + 1] <= r) w++;
        const struct moe_expert_work *wk = &c->works[w];
        const int64_t i = r - c->row0[w];
        uint8_t *dst = s->aq + (size_t)r * s->aq_cap;
        if (!c->down) {
            moe_quantize_act(wk->f.gate.type, s->xn + (size_t)wk->rows[i] * (size_t)H, dst, H);
        } else {
            const int64_t F = wk->f.gate.n_out;
            moe_quantize_act(wk->f.down.type, s->ge + (size_t)c->row0[w] * (size_t)s->max_ff + (size_t)(i * F), dst, F);
        }
    }
}

/* expert_group: works [0, n) of a layer step, all fused (ffn_fused) and with
 * no token split, their rows together at most n_batch: gathered and quantized
 * in one loop, every gate/up pair in one loop, the SwiGLU outputs quantized in
 * one loop, every down in one loop. Each row goes through the same kernel
 * calls as cpu_expert's row path, so the outputs are the same bits. */
static void expert_group(struct cpu *s, const struct moe_expert_work *works, int n) {
    const int64_t H = s->m->cfg.n_embd;
    int64_t row0[BATCH_MAX_WORKS + 1];
    struct mat_job jobs[BATCH_MAX_WORKS];
    row0[0] = 0;
    for (int i = 0; i < n; i++) row0[i + 1] = row0[i] + works[i].n_rows;
    const int64_t rows = row0[n];
    struct eq_ctx q = {s, works, row0, n, 0};
    const int64_t qmin = (16384 + H - 1) / H;
    moe_pool_for(s->pool, rows, qmin, eq_range, &q);
    /* h of work i: rows row0[i].. of ge, n_ff floats each (ge holds n_batch rows of max_ff) */
    for (int i = 0; i < n; i++)
        jobs[i] = (struct mat_job){.w = &works[i].f.gate, .up = &works[i].f.up, .xq = s->aq + (size_t)row0[i] * s->aq_cap,
                                   .xs = s->aq_cap, .n_tok = works[i].n_rows,
                                   .y = s->ge + (size_t)row0[i] * (size_t)s->max_ff, .ldy = works[i].f.gate.n_out};
    run_jobs(s, jobs, n);
    q.down = 1;
    moe_pool_for(s->pool, rows, (16384 + s->max_ff - 1) / s->max_ff, eq_range, &q);
    for (int i = 0; i < n; i++)
        jobs[i] = (struct mat_job){.w = &works[i].f.down, .xq = s->aq + (size_t)row0[i] * s->aq_cap, .xs = s->aq_cap,
                                   .n_tok = works[i].n_rows, .y = s->ye + (size_t)row0[i] * (size_t)H, .ldy = H};
    run_jobs(s, jobs, n);
    for (int i = 0; i < n; i++) {
        const struct moe_expert_work *wk = &works[i];
        const float *y = s->ye + (size_t)row0[i] * (size_t)H;
        for (int r = 0; r < wk->n_rows; r++) expert_out(s, wk->rows[r], wk->slots[r], y + (size_t)r * (size_t)H, wk->w[r]);
        if (wk->out) memcpy(wk->out, y, sizeof(float) * (size_t)wk->n_rows * (size_t)H);
    }
}

/* groupable: 1 if work w can join expert_group. */
static int groupable(const struct cpu *s, const struct moe_expert_work *w) {
    return w->n_rows > 0 && w->n_rows <= s->p.n_batch && ffn_fused(s, &w->f, 1) && !ffn_token_split(s, &w->f, w->n_rows, 1);
}

/* cpu_expert_batch: the works of a layer step (the CPU computes host works
 * the same way: all its memory is host memory). Runs of groupable works
 * whose rows fit n_batch go through expert_group; the others through
 * cpu_expert. */
static enum moe_status cpu_expert_batch(struct moe_backend *be, const struct moe_expert_work *works, int n) {
    struct cpu *s = ctx(be);
    for (int i = 0; i < n;) {
        if (!groupable(s, &works[i])) {
            const struct moe_expert_work *w = &works[i++];
            enum moe_status st = cpu_expert(be, &w->f, w->rows, w->slots, w->w, w->n_rows, w->out);
            if (st) return st;
            continue;
        }
        int j = i;
        int64_t rows = 0;
        while (j < n && j - i < BATCH_MAX_WORKS && groupable(s, &works[j]) && rows + works[j].n_rows <= s->p.n_batch)
            rows += works[j++].n_rows;
        expert_group(s, works + i, j - i);
        i = j;
    }
    return MOE_OK;
}

static enum moe_status cpu_dense(struct moe_backend *be, int layer, int n) {
    struct cpu *s = ctx(be);
    const struct moe_config *c = &s->m->cfg;
    const struct moe_layer *L = &s->m->layers[layer];
    const int64_t H = c->n_embd;
    if (!c->layer_moe[layer]) {
        ffn(s, &L->dense, s->xn, s->acc, n, 0);
        return MOE_OK;
    }
    if (c->n_ff_shared <= 0) return MOE_OK;
    if (c->shared_gated) matmul(s, &L->shared_gate, NULL, s->xn, H, s->sg, 1, n);
    ffn(s, &L->shared, s->xn, s->tmp, n, 0);
    s->shared_pending = 1;
    return MOE_OK;
}

/* residual_range: tokens [b, e) of cpu_residual: acc += the routed experts'
 * weighted outputs in slot order, then [sigmoid(shared gate) *] the shared
 * expert (after the routed ones, as transformers adds it), then x += acc. */
static void residual_range(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct rows_ctx *r = vctx;
    struct cpu *s = r->s;
    const int64_t H = s->m->cfg.n_embd;
    const int S = s->p.n_slots;
    for (int64_t t = b; t < e; t++) {
        float *a = s->acc + t * H, *x = s->x + t * H;
        for (int k = 0; S > 2 && k < S; k++) { /* (two slots: already in acc, expert_out) */
            if (!s->part_used[(size_t)t * S + (size_t)k]) continue;
            const float *src = s->part + ((size_t)t * S + (size_t)k) * H;
            for (int64_t d = 0; d < H; d++) a[d] += src[d];
        }
        if (s->shared_pending) {
            const float *sh = s->tmp + t * H;
            if (!s->m->cfg.shared_gated) {
                for (int64_t d = 0; d < H; d++) a[d] += sh[d];
            } else {
                const float g = 1.0f / (1.0f + expf(-s->sg[t]));
                for (int64_t d = 0; d < H; d++) a[d] += g * sh[d];
            }
        }
        for (int64_t d = 0; d < H; d++) x[d] += a[d];
    }
}

static enum moe_status cpu_residual(struct moe_backend *be, int n) {
    struct cpu *s = ctx(be);
    struct rows_ctx a = {s, NULL};
    moe_pool_for(s->pool, n, ROWS_MIN, residual_range, &a);
    s->shared_pending = 0;
    return MOE_OK;
}

static enum moe_status cpu_lm_head_rows(struct moe_backend *be, const float *x, int n, float *logits) {
    struct cpu *s = ctx(be);
    const struct moe_model *m = s->m;
    const struct moe_config *c = &m->cfg;
    norm_rows(c, s->xn, x, m->out_norm, m->out_norm_b, n);
    matmul(s, &m->lm_head, m->lm_head_b, s->xn, c->n_embd, logits, c->n_vocab, n);
    return MOE_OK;
}

static enum moe_status cpu_lm_head(struct moe_backend *be, int row0, int n, float *logits) {
    struct cpu *s = ctx(be);
    enum moe_status st = cpu_lm_head_rows(be, s->x + (size_t)row0 * (size_t)s->m->cfg.n_embd, n, logits);
    if (s->adapt.measured && n == 1) moe_adapt_end(&s->adapt, elapsed_ns(&s->step_t0)); /* the step's end */
    return st;
}

static enum moe_status cpu_ffn_rows(struct moe_backend *be, const struct moe_ffn *f, const float *x, float *y, int n) {
    ffn(ctx(be), f, x, y, n, 1);
    return MOE_OK;
}

static size_t cpu_kv_cache_bytes(struct moe_backend *be) { return ctx(be)->kv_bytes; }

static void cpu_free(struct moe_backend *be);

/* cpu_supports: the CPU backend reads the interleaved layouts and works in
 * host memory; expert_batch it has (the session reads it from the member). */
static int cpu_supports(const struct moe_backend *be, enum moe_backend_feature f) {
    return f == MOE_BACKEND_FEAT_CPU_LAYOUTS || f == MOE_BACKEND_FEAT_HOST_MEMORY ||
           f == MOE_BACKEND_FEAT_EXPERT_BATCH;
}

static const struct moe_backend_iface k_cpu_iface = {
    .version = MOE_BACKEND_VERSION,
    .name = "cpu",
    .free = cpu_free,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_write = cpu_buffer_write,
    .embed = cpu_embed,
    .set_x = cpu_set_x,
    .get_x = cpu_get_x,
    .get_xn = cpu_get_xn,
    .attention = cpu_attention,
    .ffn_norm = cpu_ffn_norm,
    .router = cpu_router,
    .expert = cpu_expert,
    .dense = cpu_dense,
    .residual = cpu_residual,
    .lm_head = cpu_lm_head,
    .ffn_rows = cpu_ffn_rows,
    .lm_head_rows = cpu_lm_head_rows,
    .kv_cache_bytes = cpu_kv_cache_bytes,
    .expert_batch = cpu_expert_batch,
    .supports = cpu_supports,
    .kv_seq = cpu_kv_seq,
    .attention_multi = cpu_attention_multi,
};

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* zalloc: zeroed array of n items (at least one, so a zero count is not a failure). */
static void *zalloc(size_t n, size_t size) { return calloc(n ? n : 1, size); }

/* touch: write every page of [p, p + bytes) once, so that the first forward
 * pass does not take their page faults (large callocs are mapped lazily).
 * Volatile: a memset of zeros after calloc is dropped by the compiler. */
static void touch(void *p, size_t bytes) {
    for (size_t i = 0; p && i < bytes; i += 4096) ((volatile char *)p)[i] = 0;
}

/* zalloc_touched: zalloc, every page touched. */
static void *zalloc_touched(size_t n, size_t size) {
    void *p = zalloc(n, size);
    touch(p, (n ? n : 1) * size);
    return p;
}

/* touch_kv: touch the KV cache of the first n_batch positions (what a first
 * prompt chunk writes); later positions fault in as the sequence grows, so
 * a long context costs memory only once it is used. */
static void touch_kv(struct cpu *s) {
    const struct moe_config *c = &s->m->cfg;
    const size_t n = (size_t)(s->p.n_batch < s->p.n_ctx ? s->p.n_batch : s->p.n_ctx), ctx = (size_t)s->p.n_ctx;
    for (int l = 0; l < c->n_layer; l++) {
        if (c->attn == MOE_ATTN_MLA) {
            touch(s->k_cache + (size_t)l * ctx * (size_t)s->kv_row, sizeof(float) * n * (size_t)s->kv_row);
            continue;
        }
        for (int h = 0; h < c->n_head_kv; h++) /* key blocks: [layer][KV head][position][head_dim] */
            touch(s->k_cache + ((size_t)l * (size_t)s->kv_dim + (size_t)h * c->head_dim) * ctx,
                  sizeof(float) * n * (size_t)c->head_dim);
        touch(s->v_cache + (size_t)l * ctx * (size_t)s->kv_dim, sizeof(float) * n * (size_t)s->kv_dim);
    }
}

static void cpu_free(struct moe_backend *be) {
    if (!be) return;
    struct cpu *s = be->ctx;
    if (s && s->adapt.choice >= 0)
        MOE_LOGD("decode steps: %s at the last measurement, %llu changes of mode",
                 s->adapt.choice ? "the caller alone" : "every thread", (unsigned long long)s->adapt.switches);
    if (s) {
        moe_pool_free(s->pool);
        float *bufs[] = {s->k_all, s->v_all, s->x, s->xn, s->q, s->k, s->v, s->att, s->tmp, s->acc, s->part,
                         s->xe, s->ge, s->ue, s->ye, s->sg, s->row_buf, s->att_buf, s->inv_freq, s->rope_cos,
                         s->rope_sin, s->qa, s->ckv, s->qlat, s->olat};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
        free(s->part_used);
        free(s->aq);
        free(s->rope_at);
        free(s);
    }
    free(be);
}

enum moe_status moe_backend_cpu_new(const struct moe_model *model, const struct moe_backend_params *p,
                                    struct moe_backend **out) {
    *out = NULL;
    const struct moe_config *c = &model->cfg;
    struct moe_backend *be = calloc(1, sizeof *be);
    struct cpu *s = calloc(1, sizeof *s);
    if (!be || !s) {
        free(be);
        free(s);
        return MOE_ERR_NOMEM;
    }
    be->iface = &k_cpu_iface;
    be->ctx = s;
    s->m = model;
    s->p = *p;
    if (s->p.n_slots < 1) s->p.n_slots = 1;
    s->rope_pos0 = s->rope_n = s->rope_len = -1;
    enum moe_status st = moe_pool_create(s->p.n_threads, &s->pool);
    if (st) {
        cpu_free(be);
        return st;
    }
    s->p.n_threads = moe_pool_n_threads(s->pool);
    const int64_t B = s->p.n_batch, H = c->n_embd, T = s->p.n_threads, S = s->p.n_slots;
    const int mla = c->attn == MOE_ATTN_MLA;
    s->q_dim = (int64_t)c->n_head * c->head_dim;
    s->kv_dim = mla ? 0 : (int64_t)c->n_head_kv * c->head_dim;
    s->kv_row = mla ? (int64_t)c->kv_lora_rank + c->qk_rope_dim : s->kv_dim;
    const int64_t att_dim = mla ? (int64_t)c->n_head * c->v_head_dim : s->q_dim;
    s->max_ff = max64(max64(c->n_ff_expert, c->n_ff_dense), c->n_ff_shared);
    s->max_in = max64(max64(max64(H, s->q_dim), s->max_ff), max64(att_dim, max64(c->kv_lora_rank, c->q_lora_rank)));
    s->n_seq = s->p.n_seq > 1 ? s->p.n_seq : 1;
    /* k_cache: kv_row, v_cache: kv_dim per position, per sequence */
    s->kv_bytes = moe_config_kv_cache_bytes(c, s->p.n_ctx) * (size_t)s->n_seq;
    s->seq_floats = (size_t)c->n_layer * (size_t)s->p.n_ctx * (size_t)s->kv_row;
    int ok = 1;
    ok &= (s->k_all = zalloc(s->seq_floats * (size_t)s->n_seq, sizeof *s->k_all)) != NULL;
    if (!mla) ok &= (s->v_all = zalloc(s->seq_floats * (size_t)s->n_seq, sizeof *s->v_all)) != NULL;
    s->k_cache = s->k_all, s->v_cache = s->v_all;
    ok &= (s->rope_at = zalloc((size_t)B, sizeof *s->rope_at)) != NULL;
#define ALLOC(ptr, count) ok &= ((ptr) = zalloc_touched((size_t)(count), sizeof *(ptr))) != NULL
    ALLOC(s->x, B * H);
    ALLOC(s->xn, B * H);
    ALLOC(s->q, B * s->q_dim);
    ALLOC(s->k, B * s->kv_dim);
    ALLOC(s->v, B * s->kv_dim);
    ALLOC(s->att, B * att_dim);
    if (mla) {
        ALLOC(s->qa, B * c->q_lora_rank);
        ALLOC(s->ckv, B * s->kv_row);
        ALLOC(s->qlat, B * c->n_head * c->kv_lora_rank);
        ALLOC(s->olat, B * c->n_head * c->kv_lora_rank);
    }
    ALLOC(s->tmp, B * H);
    ALLOC(s->acc, B * H);
    ALLOC(s->part, B * S * H);
    ALLOC(s->part_used, B * S);
    ALLOC(s->xe, B * H);
    ALLOC(s->ge, B * s->max_ff);
    ALLOC(s->ue, B * s->max_ff);
    ALLOC(s->ye, B * H);
    ALLOC(s->sg, B);
    /* quantized activations: the largest row (q8_0 or q8_k blocks) of any matrix input */
    const int64_t in_k = (s->max_in + MOE_QK_K - 1) / MOE_QK_K * MOE_QK_K;
    s->aq_cap = (max64((int64_t)moe_qtype_row_bytes(MOE_QTYPE_Q8_0, in_k), (int64_t)moe_qtype_row_bytes(MOE_QTYPE_Q8_K, in_k)) +
                 63) & ~(size_t)63;
    ALLOC(s->aq, B * (int64_t)s->aq_cap);
    ALLOC(s->row_buf, T * s->max_in);
    ALLOC(s->att_buf, T * (int64_t)att_stride(s));
    ALLOC(s->inv_freq, c->rope.n_rot / 2);
    ALLOC(s->rope_cos, B * (c->rope.n_rot / 2));
    ALLOC(s->rope_sin, B * (c->rope.n_rot / 2));
#undef ALLOC
    if (!ok) {
        MOE_LOGE("cannot allocate the session (KV cache %zu MiB); try a smaller context", s->kv_bytes >> 20);
        cpu_free(be);
        return MOE_ERR_NOMEM;
    }
    touch_kv(s);
    moe_rope_inv_freq(c, s->inv_freq);
    const char *ie = getenv("MOE_CPU_INT");
    s->use_int = !(ie && strcmp(ie, "0") == 0);
    const char *ae = getenv("MOE_CPU_ADAPT");
    moe_adapt_init(&s->adapt, s->p.n_threads > 1 && !(ae && strcmp(ae, "0") == 0));
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    s->avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    s->avx512 = s->avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
#endif
    *out = be;
    return MOE_OK;
}

const struct moe_adapt *moe_backend_cpu_adapt(const struct moe_backend *be) {
    return be && be->iface == &k_cpu_iface ? &((const struct cpu *)be->ctx)->adapt : NULL;
}

int moe_backend_cpu_threads(const struct moe_backend *be) {
    return be && be->iface == &k_cpu_iface ? ((const struct cpu *)be->ctx)->p.n_threads : 0;
}

/* The registry's row (backend.c): one device, the host. */
static int cpu_device_count(void) { return 1; }

static int cpu_describe(int index, char *buf, size_t size) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return index == 0 && snprintf(buf, size, "host CPU, %ld threads, %s kernels", n, moe_quant_isa_name()) > 0 ? 0 : -1;
}

static enum moe_status cpu_init(const struct moe_model *model, const struct moe_backend_params *p, int index,
                                const void *options, struct moe_backend **out) {
    (void)options;
    if (index != 0) {
        MOE_LOGE("the CPU backend has one device, cpu:0 (asked for cpu:%d)", index);
        return MOE_ERR_BACKEND;
    }
    return moe_backend_cpu_new(model, p, out);
}

const struct moe_backend_reg moe_backend_reg_cpu = {
    "cpu", "the reference backend: host memory, a thread pool, AVX2 / AVX-512 kernels", cpu_device_count,
    cpu_describe, cpu_init,
};

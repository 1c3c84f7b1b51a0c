/*
 * cuda-impl.h - private to runtime/cuda/: the kernels' job descriptions and
 * their launchers (kernels.cu), shared by the backend (backend.cu) and the
 * one-kernel test entry points (kernel-test.cu). CUDA C++.
 *
 * Each kernel is checked against the CPU reference by tests/test-cuda.c (run on
 * an H200, 2026-11-28; see moe-cuda.h).
 */
#ifndef MOE_CUDA_IMPL_H
#define MOE_CUDA_IMPL_H

#include <cstddef>
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "moe-quant.h"
#include "moe-status.h"

/* CU: a CUDA call that must succeed; logs the call and the error and returns MOE_ERR_BACKEND. */
#define CU(call)                                                                                     \
    do {                                                                                             \
        cudaError_t cu_err_ = (call);                                                                \
        if (cu_err_ != cudaSuccess) {                                                                \
            MOE_LOGE("%s: %s (%s:%d)", #call, cudaGetErrorString(cu_err_), __FILE__, __LINE__);      \
            return MOE_ERR_BACKEND;                                                                       \
        }                                                                                            \
    } while (0)

#define CUBLAS(call)                                                                                 \
    do {                                                                                             \
        cublasStatus_t cb_err_ = (call);                                                             \
        if (cb_err_ != CUBLAS_STATUS_SUCCESS) {                                                      \
            MOE_LOGE("%s: cuBLAS status %d (%s:%d)", #call, (int)cb_err_, __FILE__, __LINE__);       \
            return MOE_ERR_BACKEND;                                                                       \
        }                                                                                            \
    } while (0)

/* LAUNCHED: count and check a kernel launch (configuration errors show at once). */
void launch_note(void);
#define LAUNCHED()                     \
    do {                               \
        launch_note();                 \
        CU(cudaGetLastError());        \
    } while (0)

/* cuBLAS through dlopen (blas.cu): CUBLAS_STATUS_NOT_INITIALIZED (logged
 * once) when the library cannot be loaded. */
cublasStatus_t moe_blas_create(cublasHandle_t *h);
cublasStatus_t moe_blas_destroy(cublasHandle_t h);
cublasStatus_t moe_blas_set_stream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t moe_blas_gemm_ex(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                                cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                                cublasComputeType_t compute, cublasGemmAlgo_t algo);

enum { Y_STORE = 0, Y_ADD = 1, Y_SWIGLU = 2 };

/* The most tokens one pass of the GEMV kernel dots a dequantized row with;
 * more tokens take more passes over the row (from L2). Works with at least
 * MOE_CUDA_GEMM_MIN_TOK rows go to cuBLAS instead. */
#define MOE_CUDA_GEMV_TOK 8
#define MOE_CUDA_GEMM_MIN_TOK 32

/*
 * One matrix product y = W x for n_tok token rows, with its epilogue:
 *   Y_STORE   y[row] = W x + bias
 *   Y_ADD     y[row] += W x + bias
 *   Y_SWIGLU  y[row] = silu(W x) * (W2 x)      (the gate/up pair of an FFN)
 * Input row of token t: x + (xrow ? xrow[t] : t) * ldx. Output row: t, or
 * yrow[t] * n_slots + yslot[t] when yrow is set (the routed-expert slots),
 * the value times yw[t] when set, used[row] = 1 when set, and the value
 * before yw into y2 + t * ldy2 when y2 is set. All pointers are device
 * pointers; W and W2 are rows of `type` as stored (moe-quant.h).
 */
struct gemv_job {
    const uint8_t *w, *w2;
    int type;
    int n_out, n_in;
    size_t row_bytes;
    const float *x;
    int64_t ldx;
    const int32_t *xrow;
    int n_tok;
    float *y;
    int64_t ldy;
    const int32_t *yrow, *yslot;
    int n_slots;
    const float *yw;
    uint8_t *used;
    float *y2;
    int64_t ldy2;
    const float *bias;
    int mode;
};

/* The GEMM path's buffers (device), owned by the caller. */
struct gemm_ctx {
    cublasHandle_t blas;
    int f32;             /* 1: float32 GEMMs; 0: f16 (bf16 for bf16 weights) */
    void *wbuf;          /* dequantized weight slab */
    size_t wbuf_bytes;
    void *xbuf;          /* gathered, converted inputs */
    size_t xbuf_bytes;
    float *gbuf, *ubuf;  /* [tokens x n_out] float32 products (W x, W2 x) */
    size_t obuf_elems;
};

/* launch_gemv: jobs (device array of n_jobs) on `stream`; max_out: the
 * largest n_out, max_tok: the largest n_tok (1: the one-token kernel). */
enum moe_status launch_gemv(const gemv_job *jobs_dev, int n_jobs, int max_out, int max_tok, cudaStream_t stream);

/* run_gemm: one job through cuBLAS (its fields as for the GEMV kernel; the
 * job itself is on the host here, its pointers on the device). */
enum moe_status run_gemm(const gemv_job *job, const gemm_ctx *g, cudaStream_t stream);

/* launch_dequant: rows [0, n_out) of W (type) to float32 y [n_out x n_in]. */
enum moe_status launch_dequant(const uint8_t *w, int type, int n_out, int n_in, float *y, cudaStream_t stream);

/* launch_embed: x[t] = row tokens[t] of the embedding (type) as float32. */
enum moe_status launch_embed(const uint8_t *w, int type, int n_in, const int32_t *tokens, int n, float *x,
                             cudaStream_t stream);

/* launch_norm: y = RMSNorm (layer 0) or LayerNorm (layer 1; b may be NULL) of n_rows rows of n. */
enum moe_status launch_norm(int layer, const float *x, const float *w, const float *b, int n_rows, int n, float eps,
                            float *y, cudaStream_t stream);

/* After the q/k/v products of n_tok tokens: q/k norms, clipping, RoPE (cs,
 * sn: [n_tok x n_rot/2]) and the KV cache rows at positions pos0.. . */
struct qkv_post_args {
    float *q, *k, *v;      /* [n_tok x q_dim], [n_tok x kv_dim] */
    float *k_cache, *v_cache; /* this layer's [n_ctx x kv_dim] */
    const float *q_norm, *k_norm;
    int qk_norm;           /* enum moe_qk_norm */
    float norm_eps, clip;
    const float *cs, *sn;
    int n_tok, pos0, n_head, n_head_kv, head_dim, n_rot;
    const int32_t *pos_dev; /* not NULL: the position is read here, not from pos0 (a captured step) */
};
enum moe_status launch_qkv_post(const qkv_post_args *a, cudaStream_t stream);

/* launch_rope: rotate v [n_tok x n_heads x head_dim] in place. */
enum moe_status launch_rope(float *v, int n_tok, int n_heads, int head_dim, int n_rot, const float *cs, const float *sn,
                            cudaStream_t stream);

/* Attention of n_tok queries at positions pos0.. over this layer's cache. */
struct attn_args {
    const float *q;        /* [n_tok x n_head x hd] */
    const float *k_cache, *v_cache; /* [n_ctx x n_head_kv x hd] */
    float *out;            /* [n_tok x n_head x hd] */
    float *pm, *pl, *pacc; /* split partials: [n_tok*n_head x n_split] (+ x hd) */
    int n_tok, pos0, n_head, n_head_kv, hd, window, n_split;
    const int32_t *pos_dev; /* not NULL: pos0 is read here, and n_split is the most splits: the
                             * kernels use attn_splits(pos0 + n_tok, n_split) of them (a captured step) */
};
enum moe_status launch_attention(const attn_args *a, cudaStream_t stream);

/* attn_splits: the splits of the keys for `len` keys, at most `cap` (256 keys
 * a split): the backend's choice for few queries, on the host and the device. */
__host__ __device__ inline int attn_splits(int len, int cap) {
    const int s = (len + 255) / 256, r = s > cap ? cap : s;
    return r < 1 ? 1 : r;
}

/* The routed experts' jobs of a captured decode step (launch_expert_jobs):
 * for choice i of sel [k], the layer's gate/up template of expert sel[i]
 * (all of it but y) and its down template (all of it but x, yslot, yw), with
 * y / x = h + i * ldh, yslot = slots + i (written: the choice's rank by id
 * among the k, the reference sum order), yw = w + i. */
struct expert_jobs_args {
    const gemv_job *tmpl_gu, *tmpl_dn; /* [n_expert] */
    const int32_t *sel;
    const float *w;
    int32_t *slots;                    /* [k] */
    gemv_job *gu, *dn;                 /* [k] out */
    float *h;
    int64_t ldh;
    int k;
};
enum moe_status launch_expert_jobs(const expert_jobs_args *a, cudaStream_t stream);

/* launch_count: kernel launches issued by this thread through the launchers
 * above (the backend's launches-per-token statistics). */
int64_t launch_count(void);

/* launch_residual: x[t] += acc[t] + the used slots in slot order (+ sh[t],
 * times sigmoid(sg[t]) when sg is set: a gated shared expert). */
enum moe_status launch_residual(float *x, const float *acc, const float *part, const uint8_t *used, const float *sg,
                                const float *sh, int n_tok, int n_slots, int n_embd, cudaStream_t stream);

/* launch_scatter_slots: part[row[i] * n_slots + slot[i]] = src[i] (n_embd floats), used[...] = 1,
 * for the host works' weighted outputs. */
enum moe_status launch_scatter_slots(float *part, uint8_t *used, const float *src, const int32_t *row,
                                     const int32_t *slot, int n, int n_slots, int n_embd, cudaStream_t stream);

/* launch_route: device routing of n rows of E logits (softmax top-k, its
 * weights times scale = routed_scale, or sparsemixer), as moe_route. */
enum moe_status launch_route(const float *logits, int n, int E, int k, int sparsemixer, int norm_topk, float eps,
                             float scale, int32_t *sel, float *w, cudaStream_t stream);


#endif

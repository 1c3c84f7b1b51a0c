/*
 * moe-cuda.h - the CUDA backend (built with -DMOE_CUDA=ON; docs/architecture.md,
 * "The CUDA backend").
 *
 * STATUS: compiled in CI (where tests/test-cuda.c, label gpu, skips); run on
 * an H200 on 2026-11-28: every test-cuda check and scripts/gpu-check.sh's
 * parity steps pass (logits within 2e-5 of the CPU's float path). Not run:
 * other GPUs, a Jetson. Slow where docs/benchmarks.md ("The CUDA backend on
 * an H200") says: the GEMV kernel (12-22 % of the device's copy bandwidth),
 * expert copies during decode (55-67 % of the pinned peak, none hidden).
 *
 * The backend implements moe-backend.h (version 6, without the version-5
 * members) on one device: the run
 * state (residual stream, KV cache in float32, scratch) in device memory,
 * non-expert weights uploaded once in their stored types, experts read by
 * dequantizing kernels straight from the bundle's blocks (q8_0, q4_0, q2_k,
 * q3_k, q4_k, q5_k, q6_k, f16, bf16, f32), cuBLAS GEMMs for prompt chunks
 * after dequantizing to f16 / bf16 (or f32 with --gemm f32). With an expert
 * budget (the expert store), its slots are device memory fed by a copy
 * stream from pinned host buffers (moe-host-tier.h), or mapped host memory
 * in unified-memory mode; experts that are not on the device may run on the
 * CPU over the bundle's mapping (Twiddler, moe-twiddler.h).
 *
 * Threads: a backend belongs to one session's thread; stage_begin /
 * stage_end are called by the expert store's loader threads concurrently.
 */
#ifndef MOE_CUDA_H
#define MOE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "moe-backend.h"
#include "moe-gpu.h"
#include "moe-host-tier.h"
#include "moe-quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* moe_cuda_device_count: number of usable CUDA devices (0 if none or no driver). */
int moe_cuda_device_count(void);

/* moe_cuda_describe: write "name, N MiB, sm_XY" of device `dev` into buf. Returns 0 on success. */
int moe_cuda_describe(int dev, char *buf, unsigned long size);

/* moe_backend_cuda_new: the CUDA backend for `model` (borrowed) on device
 * g->device (>= 0), with the options of moe-gpu.h (copied). Uploads the
 * non-expert weights; experts given to it as host views (no expert budget)
 * are uploaded on first use and kept. Errors: MOE_ERR_UNSUPPORTED (no
 * device, or an architecture or feature this backend does not run, logged
 * by name), MOE_ERR_NOMEM (logged with what did not fit). */
enum moe_status moe_backend_cuda_new(const struct moe_model *model, const struct moe_backend_params *p,
                                     const struct moe_gpu_params *g, struct moe_backend **out);

/* moe_backend_cuda_new_fn: moe_backend_cuda_new as a moe_session_params
 * backend_new (user: const struct moe_gpu_params *). */
enum moe_status moe_backend_cuda_new_fn(const struct moe_model *model, const struct moe_backend_params *p, void *user,
                                        struct moe_backend **out);

/* What a CUDA backend did, since it was created. */
struct moe_cuda_stats {
    int uma;                        /* unified-memory mode */
    int64_t device_bytes, pinned_bytes, peak_device_bytes, peak_pinned_bytes;
    int64_t uploads, upload_bytes;  /* host views uploaded on first use (resident experts) */
    int64_t h2d_copies, h2d_bytes;  /* expert copies into device slots (stage_end / buffer_write) */
    double h2d_s;                   /* time the loaders waited for those copies */
    int64_t batch_calls, device_works, host_works; /* expert_batch */
    double host_s;                  /* CPU time of host works (Twiddler's CPU side) */
    double host_wait_s;             /* time the GPU side waited for the CPU side at residual() */
    int64_t placed, placed_host;    /* experts place() decided on, and sent to the host */
    double model_layer_s;           /* sum of the modelled layer times of those decisions */
    int lat_measured;               /* 1 measured at start, 0 read from the cache file, -1 none */
    /* launches per token (one-token steps): what the host enqueued on the compute stream (kernel
     * launches, copies, memsets; a graph launch is one) over decode_steps */
    int64_t decode_steps, decode_ops;
    int64_t graph_steps;            /* one-token steps run as one captured graph (decode_step) */
    int64_t graph_captures;         /* captures made (a new expert table or top-k recaptures) */
    int64_t graph_nodes;            /* nodes of the latest graph (cudaGraphGetNodes) */
    int64_t graph_emitted;          /* operations its capture enqueued (moe_graph_plan's count + the
                                     * attention's second kernel) */
    int graph_failed;               /* a capture failed: op by op since (logged) */
    struct moe_host_tier_stats tier;
};

/* moe_backend_cuda_stats: the counters of a CUDA backend; MOE_ERR_INVALID if be is not one. */
enum moe_status moe_backend_cuda_stats(const struct moe_backend *be, struct moe_cuda_stats *out);

/* moe_cuda_stats_to_json: s as one cJSON object (moe-run's --stats-json
 * "gpu"); the caller owns it (cJSON_Delete); NULL when out of memory. */
struct cJSON;
struct cJSON *moe_cuda_stats_to_json(const struct moe_cuda_stats *s);

/* ---- kernels one by one, for the parity tests and the benchmarks ------------
 * Each runs one kernel on device `dev` with host inputs and outputs (copied
 * in and out; not fast). Return MOE_OK, MOE_ERR_UNSUPPORTED (no device or an
 * unsupported type), MOE_ERR_NOMEM or MOE_ERR_BACKEND (a CUDA error, logged). */

/* moe_cuda_test_dequant: y [n_out x n_in] = the rows of w as float32. */
enum moe_status moe_cuda_test_dequant(int dev, enum moe_qtype t, const void *w, int64_t n_out, int64_t n_in, float *y);

/* moe_cuda_test_matmul: y [n_tok x n_out] = W x[t] (+ bias) with path 0: the
 * dequantizing GEMV kernel, 1: dequantize to f16/bf16 + cuBLAS, 2: f32 + cuBLAS. */
enum moe_status moe_cuda_test_matmul(int dev, enum moe_qtype t, const void *w, int64_t n_out, int64_t n_in,
                                     const float *bias, const float *x, int n_tok, int path, float *y);

/* moe_cuda_test_ffn: y [n x n_embd] = down(silu(gate x) * up x) for host views f
 * (the fused gate/up kernel and the down kernel; path as above). */
enum moe_status moe_cuda_test_ffn(int dev, const struct moe_ffn *f, const float *x, int n, int path, float *y);

/* moe_cuda_test_experts: the batched expert kernel: n_work experts (host
 * views), each over rows/slots/w of an [n_tok x n_embd] input xn, into
 * part [n_tok x n_slots x n_embd] (weighted) and used [n_tok x n_slots]. */
enum moe_status moe_cuda_test_experts(int dev, const struct moe_expert_work *works, int n_work, const float *xn,
                                      int n_tok, int64_t n_embd, int n_slots, float *part, uint8_t *used);

/* moe_cuda_test_norm: y = RMSNorm (b == NULL and !layer) or LayerNorm of
 * n_rows rows of n floats. */
enum moe_status moe_cuda_test_norm(int dev, int layer, const float *x, const float *w, const float *b, int n_rows,
                                   int64_t n, float eps, float *y);

/* moe_cuda_test_rope: rotate v [n_tok x n_heads x head_dim] in place (the
 * halves layout, n_rot dims) with per-token tables cs, sn [n_tok x n_rot/2]. */
enum moe_status moe_cuda_test_rope(int dev, float *v, int n_tok, int n_heads, int head_dim, int n_rot, const float *cs,
                                   const float *sn);

/* moe_cuda_test_attention: out [n_tok x n_head x hd] for queries q at
 * positions pos0.., keys/values kc, vc [n_ctx x n_head_kv x hd] (positions
 * 0..pos0+n_tok-1 filled), causal, sliding window `window` (0: none),
 * n_split > 1 splits the keys (decode). */
enum moe_status moe_cuda_test_attention(int dev, const float *q, const float *kc, const float *vc, int n_tok, int pos0,
                                        int n_head, int n_head_kv, int hd, int window, int n_split, float *out);

/* moe_cuda_test_route: softmax top-k (sparsemixer 0; weights not scaled) or
 * Phi-MoE's sparsemixer (1, with eps) of n rows of E logits on the device:
 * sel, w [n x k]. */
enum moe_status moe_cuda_test_route(int dev, const float *logits, int n, int E, int k, int sparsemixer, int norm_topk,
                                    float eps, int32_t *sel, float *w);

/* moe_cuda_test_residual: x[t] += acc[t] + sum of used slots in slot order
 * (+ sh[t] when sh != NULL, times sigmoid(sg[t]) when sg != NULL). */
enum moe_status moe_cuda_test_residual(int dev, float *x, const float *acc, const float *part, const uint8_t *used,
                                       const float *sg, const float *sh, int n_tok, int n_slots, int64_t n_embd);

/* moe_cuda_bench_copy: GB/s of host->device copies of `bytes` from pinned
 * memory (pinned = 1) or pageable memory (0), and of device->device copies
 * (d2d, may be NULL), best of `reps`. */
enum moe_status moe_cuda_bench_copy(int dev, size_t bytes, int reps, double *h2d_pinned, double *h2d_pageable,
                                    double *d2d);

/* moe_cuda_bench_gemv: GB/s of weight bytes read by the GEMV kernel for a
 * matrix of type t [n_out x n_in] and one token, best of `reps`. */
enum moe_status moe_cuda_bench_gemv(int dev, enum moe_qtype t, int64_t n_out, int64_t n_in, int reps, double *gbps);

#ifdef __cplusplus
}
#endif
#endif

/*
 * moe-gpu.h - the GPU engine's options and its memory bookkeeping, in plain C
 * (they compile and are tested without CUDA; runtime/cuda/ uses them).
 *
 * Tiers on a GPU machine (docs/architecture.md, "The CUDA backend"):
 *   1. device memory: non-expert weights, the KV cache and scratch, and the
 *      expert store's slots (the --expert-mem budget);
 *   2. pinned host memory: the host tier (--host-mem), a cache of verified
 *      expert copies the GPU copies from at full bus speed, and the staging
 *      buffers loaders read into;
 *   3. the bundle on storage, read with direct I/O into pinned memory.
 * With unified memory (a Jetson, or --uma to exercise the mode on a discrete
 * GPU) the expert slots are mapped pinned host memory that kernels read in
 * place: loaders read blobs straight into them and nothing is copied; the host
 * tier is off (it would be a second copy in the same memory).
 *
 * struct moe_gpu_ledger is the bookkeeping of that: which kind of allocation
 * lives where, and the limits it must fit in (one shared pool on an integrated
 * GPU, whose "device" memory is the host's). Thread safety: none; the backend
 * serialises its calls.
 */
#ifndef MOE_GPU_H
#define MOE_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"
#include "moe-twiddler.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_gpu_params {
    int device;             /* -1: the CPU backend (default); >= 0: the device index (--device cuda[:N]) */
    char device_spec[48];   /* --device as given: a registered backend and device, "cpu" (default), "cuda",
                             * "cuda:1", "auto" (moe_session_params.device) */
    int uma;                /* -1: auto (on for integrated GPUs); 1: forced (--uma) */
    int64_t host_mem;       /* bytes of pinned host tier (--host-mem; 0 = none) */
    enum moe_cpu_experts cpu_experts; /* --cpu-experts (auto) */
    int gemm_f32;           /* 1: prefill GEMMs in float32 (--gemm f32); 0: f16 / bf16 (default) */
    int recalibrate;        /* 1: measure the latency table even when a cached one exists */
    int no_graphs;          /* 1: decode steps op by op (--graphs off; moe_session_params.no_graphs) */
};

/* moe_gpu_default_params: CPU backend, auto UMA, no host tier, auto CPU experts, f16 GEMMs. */
struct moe_gpu_params moe_gpu_default_params(void);

/* ---- memory bookkeeping ------------------------------------------------ */

enum moe_gpu_mem_kind {
    MOE_GPU_MEM_WEIGHTS = 0,   /* non-expert weights (and all experts when no budget is set) */
    MOE_GPU_MEM_STATE = 1,     /* KV cache, activations, scratch */
    MOE_GPU_MEM_SLOTS = 2,     /* the expert store's slots */
    MOE_GPU_MEM_HOST_TIER = 3, /* pinned host tier */
    MOE_GPU_MEM_STAGING = 4,   /* pinned staging for loaders and uploads */
    MOE_GPU_MEM_KINDS = 5,
};

enum moe_gpu_mem_where {
    MOE_GPU_WHERE_DEVICE = 0, /* cudaMalloc */
    MOE_GPU_WHERE_PINNED = 1, /* cudaHostAlloc: page-locked host memory */
    MOE_GPU_WHERE_MAPPED = 2, /* cudaHostAlloc mapped: host memory kernels read in place */
};

/* What the device reports (cudaGetDeviceProperties / cudaMemGetInfo) and the host's RAM. */
struct moe_gpu_mem_info {
    int integrated;     /* the GPU shares the host's memory (Jetson) */
    int64_t dev_total, dev_free;
    int64_t host_total; /* physical RAM */
};

struct moe_gpu_ledger {
    int uma;                 /* expert slots are mapped host memory */
    int shared_pool;         /* device and pinned memory are one pool (integrated GPU) */
    int64_t reserve;         /* device bytes kept free (CUDA context, cuBLAS workspace) */
    int64_t device_limit;    /* bytes the device allocations may total */
    int64_t pinned_limit;    /* bytes the pinned (and mapped) allocations may total */
    int64_t used[MOE_GPU_MEM_KINDS];
    int64_t device_used, pinned_used, peak_device, peak_pinned;
};

/* moe_gpu_ledger_init: decide the mode and the limits. UMA when uma_request
 * is 1, or -1 on an integrated GPU. Limits: discrete: device = free device
 * memory - reserve, pinned = half the host's RAM; integrated: one pool of the
 * free memory - reserve shared by both; forced UMA on a discrete GPU: the
 * discrete limits, slots counted as pinned. The host tier request
 * *host_mem is set to 0 in UMA mode (with a note in msg, else msg is "").
 * MOE_ERR_INVALID (message in msg) when the pinned host tier alone exceeds
 * the pinned limit. */
enum moe_status moe_gpu_ledger_init(struct moe_gpu_ledger *l, const struct moe_gpu_mem_info *info, int uma_request,
                                    int64_t *host_mem, char *msg, size_t msg_size);

/* moe_gpu_ledger_where: where allocations of `kind` go in this mode. */
enum moe_gpu_mem_where moe_gpu_ledger_where(const struct moe_gpu_ledger *l, enum moe_gpu_mem_kind kind);

/* moe_gpu_ledger_take: account `bytes` of `kind`. MOE_ERR_NOMEM (message in
 * msg naming the kind, the request, what is used and the limit) when they do
 * not fit; nothing is accounted then. */
enum moe_status moe_gpu_ledger_take(struct moe_gpu_ledger *l, enum moe_gpu_mem_kind kind, int64_t bytes, char *msg,
                                    size_t msg_size);

/* moe_gpu_ledger_give: return `bytes` of `kind` taken before. */
void moe_gpu_ledger_give(struct moe_gpu_ledger *l, enum moe_gpu_mem_kind kind, int64_t bytes);

/* moe_gpu_mem_kind_name: "weights", "state", "expert slots", "host tier", "staging". */
const char *moe_gpu_mem_kind_name(enum moe_gpu_mem_kind kind);

#ifdef __cplusplus
}
#endif
#endif

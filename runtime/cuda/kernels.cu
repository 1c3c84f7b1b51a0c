// kernels.cu - the CUDA backend's kernels (cuda-impl.h).
//
// The parity tests in tests/test-cuda.c (label gpu) check each against the CPU
// reference; they pass on an H200 (2026-11-28, docs/benchmarks.md).
//
// Dequantization mirrors formats/quant.c's scalar reference operation by
// operation with explicitly rounded intrinsics (__fmul_rn, __fsub_rn: no
// fused multiply-add), so a dequantized weight is bit-identical to
// moe_dequantize_row's; test-cuda checks that exactly. Products then
// accumulate in float32 in a different order than the CPU's, so matrix
// products agree to rounding, not bit for bit.
#include <cstdlib>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda-impl.h"

namespace {

// ---- element access (blocks are read byte-wise: they are not aligned) ------

__device__ __forceinline__ uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
__device__ __forceinline__ float f16f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// deq<T>::run(row, i0, v): elements i0 .. i0+7 of a row of type T (i0 a
// multiple of 8; every type keeps 8 consecutive elements in one sub-block).
// deq<T>::one(row, i): element i.
template <int T> struct deq;

template <> struct deq<MOE_QTYPE_F32> {
    __device__ static void run(const uint8_t *row, int i0, float *v) {
        const float *p = (const float *)row + i0;
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = p[k];
    }
    __device__ static float one(const uint8_t *row, int i) { return ((const float *)row)[i]; }
};

template <> struct deq<MOE_QTYPE_F16> {
    __device__ static void run(const uint8_t *row, int i0, float *v) {
        const uint16_t *p = (const uint16_t *)row + i0;
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = f16f(p[k]);
    }
    __device__ static float one(const uint8_t *row, int i) { return f16f(((const uint16_t *)row)[i]); }
};

template <> struct deq<MOE_QTYPE_BF16> {
    __device__ static void run(const uint8_t *row, int i0, float *v) {
        const uint16_t *p = (const uint16_t *)row + i0;
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = bf16f(p[k]);
    }
    __device__ static float one(const uint8_t *row, int i) { return bf16f(((const uint16_t *)row)[i]); }
};

// quantized types: one() through run() (their rows are whole blocks of >= 32)
template <int T> __device__ float one_via_run(const uint8_t *row, int i) {
    float v[8];
    deq<T>::run(row, i & ~7, v);
    float r = v[0];
#pragma unroll
    for (int k = 1; k < 8; k++) r = (i & 7) == k ? v[k] : r; // constant indices: v stays in registers
    return r;
}

template <> struct deq<MOE_QTYPE_Q8_0> {
    __device__ static void run(const uint8_t *row, int i0, float *v) {
        const uint8_t *b = row + (size_t)(i0 >> 5) * 34;
        const float d = f16f(ld16(b));
        const uint8_t *q = b + 2 + (i0 & 31);
        int8_t qv[8];
        if (((uintptr_t)q & 1) == 0) { // 4 two-byte loads instead of 8 (rows at even addresses)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint16_t h = ((const uint16_t *)q)[k];
                qv[2 * k] = (int8_t)(h & 255), qv[2 * k + 1] = (int8_t)(h >> 8);
            }
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) qv[k] = (int8_t)q[k];
        }
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = __fmul_rn((float)qv[k], d);
    }
    __device__ static float one(const uint8_t *row, int i) { return one_via_run<MOE_QTYPE_Q8_0>(row, i); }
};

template <> struct deq<MOE_QTYPE_Q4_0> {
    __device__ static void run(const uint8_t *row, int i0, float *v) {
        const uint8_t *b = row + (size_t)(i0 >> 5) * 18;
        const float d = f16f(ld16(b));
        const int j0 = i0 & 31;
        const uint8_t *qs = b + 2 + (j0 & 15);
        const int shift = j0 < 16 ? 0 : 4;
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = __fmul_rn(d, (float)(((qs[k] >> shift) & 15) - 8));
    }
    __device__ static float one(const uint8_t *row, int i) { return one_via_run<MOE_QTYPE_Q4_0>(row, i); }
};

template <> struct deq<MOE_QTYPE_Q2_K> { // scales[16] qs[64] d dmin
    __device__ static void run(const uint8_t *row, int i0, float *v) {
        const uint8_t *b = row + (size_t)(i0 >> 8) * 84;
        const int w = i0 & 255, s = w >> 4, l = w & 15;
        const float d = f16f(ld16(b + 80)), dmin = f16f(ld16(b + 82));
        const float dl = __fmul_rn(d, (float)(b[s] & 15)), ml = __fmul_rn(dmin, (float)(b[s] >> 4));
        const int h = s >> 3, j = (s & 7) >> 1, l0 = 16 * (s & 1);
        const uint8_t *q = b + 16 + 32 * h + l0 + l;
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = __fsub_rn(__fmul_rn(dl, (float)((q[k] >> (2 * j)) & 3)), ml);
    }
    __device__ static float one(const uint8_t *row, int i) { return one_via_run<MOE_QTYPE_Q2_K>(row, i); }
};

template <> struct deq<MOE_QTYPE_Q3_K> { // hmask[32] qs[64] scales[12] d
    __device__ static void run(const uint8_t *row, int i0, float *v) {
        const uint8_t *b = row + (size_t)(i0 >> 8) * 110;
        const int w = i0 & 255, s = w >> 4, l = w & 15;
        const float d = f16f(ld16(b + 108));
        const float dl = __fmul_rn(d, (float)moe_q3k_scale(s, b + 96));
        const int h = s >> 3, j = (s & 7) >> 1, l0 = 16 * (s & 1), hbit = s >> 1;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int lo = (b[32 + 32 * h + l0 + l + k] >> (2 * j)) & 3;
            const int hi = (b[l0 + l + k] >> hbit) & 1;
            v[k] = __fmul_rn(dl, (float)(lo - (hi ? 0 : 4)));
        }
    }
    __device__ static float one(const uint8_t *row, int i) { return one_via_run<MOE_QTYPE_Q3_K>(row, i); }
};

// q4_k and q5_k: d dmin scales[12] (qh[32]) qs[128]
template <int QH> __device__ void deq_k_asym(const uint8_t *row, int i0, float *v, size_t block_bytes) {
    const uint8_t *b = row + (size_t)(i0 >> 8) * block_bytes;
    const int w = i0 & 255, j = w >> 5, l = w & 31;
    const float d = f16f(ld16(b)), dmin = f16f(ld16(b + 2));
    uint8_t sc, m;
    moe_q4k_scale_min(j, b + 4, &sc, &m);
    const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)m);
    const int c = j >> 1, shift = 4 * (j & 1);
    const uint8_t *qs = b + (QH ? 48 : 16) + 32 * c + l;
    uint8_t qb[8];
    if (((uintptr_t)qs & 7) == 0) { // one 8-byte load (q4_k rows at 16-byte addresses)
        const uint2 w = *(const uint2 *)qs;
#pragma unroll
        for (int k = 0; k < 4; k++) qb[k] = (uint8_t)(w.x >> (8 * k)), qb[4 + k] = (uint8_t)(w.y >> (8 * k));
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) qb[k] = qs[k];
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        int q = (qb[k] >> shift) & 15;
        if (QH) q |= ((b[16 + l + k] >> j) & 1) << 4;
        v[k] = __fsub_rn(__fmul_rn(dl, (float)q), ml);
    }
}

template <> struct deq<MOE_QTYPE_Q4_K> {
    __device__ static void run(const uint8_t *row, int i0, float *v) { deq_k_asym<0>(row, i0, v, 144); }
    __device__ static float one(const uint8_t *row, int i) { return one_via_run<MOE_QTYPE_Q4_K>(row, i); }
};

template <> struct deq<MOE_QTYPE_Q5_K> {
    __device__ static void run(const uint8_t *row, int i0, float *v) { deq_k_asym<1>(row, i0, v, 176); }
    __device__ static float one(const uint8_t *row, int i) { return one_via_run<MOE_QTYPE_Q5_K>(row, i); }
};

template <> struct deq<MOE_QTYPE_Q6_K> { // ql[128] qh[64] scales[16] d
    __device__ static void run(const uint8_t *row, int i0, float *v) {
        const uint8_t *b = row + (size_t)(i0 >> 8) * 210;
        const int w = i0 & 255, s = w >> 4, l = w & 15;
        const float d = f16f(ld16(b + 208));
        const float dl = __fmul_rn(d, (float)(int8_t)b[192 + s]);
        const int h = s >> 3, g = (s & 7) >> 1, l0 = 16 * (s & 1);
        const uint8_t *lq = b + 64 * h + 32 * (g & 1) + l0 + l, *hq = b + 128 + 32 * h + l0 + l;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int lo = (lq[k] >> (4 * (g >> 1))) & 15, hi = (hq[k] >> (2 * g)) & 3;
            v[k] = __fmul_rn(dl, (float)((lo | (hi << 4)) - 32));
        }
    }
    __device__ static float one(const uint8_t *row, int i) { return one_via_run<MOE_QTYPE_Q6_K>(row, i); }
};

// DISPATCH: call F<T> for the run-time type t (a uniform branch in a kernel).
#define DISPATCH(t, F, ...)                                                       \
    switch (t) {                                                                  \
    case MOE_QTYPE_F32: F<MOE_QTYPE_F32>(__VA_ARGS__); break;                     \
    case MOE_QTYPE_F16: F<MOE_QTYPE_F16>(__VA_ARGS__); break;                     \
    case MOE_QTYPE_BF16: F<MOE_QTYPE_BF16>(__VA_ARGS__); break;                   \
    case MOE_QTYPE_Q8_0: F<MOE_QTYPE_Q8_0>(__VA_ARGS__); break;                   \
    case MOE_QTYPE_Q4_0: F<MOE_QTYPE_Q4_0>(__VA_ARGS__); break;                   \
    case MOE_QTYPE_Q2_K: F<MOE_QTYPE_Q2_K>(__VA_ARGS__); break;                   \
    case MOE_QTYPE_Q3_K: F<MOE_QTYPE_Q3_K>(__VA_ARGS__); break;                   \
    case MOE_QTYPE_Q4_K: F<MOE_QTYPE_Q4_K>(__VA_ARGS__); break;                   \
    case MOE_QTYPE_Q5_K: F<MOE_QTYPE_Q5_K>(__VA_ARGS__); break;                   \
    case MOE_QTYPE_Q6_K: F<MOE_QTYPE_Q6_K>(__VA_ARGS__); break;                   \
    default: break;                                                               \
    }

__host__ __device__ inline bool type_ok(int t) {
    return t == MOE_QTYPE_F32 || t == MOE_QTYPE_F16 || t == MOE_QTYPE_BF16 || t == MOE_QTYPE_Q8_0 ||
           t == MOE_QTYPE_Q4_0 || t == MOE_QTYPE_Q2_K || t == MOE_QTYPE_Q3_K || t == MOE_QTYPE_Q4_K ||
           t == MOE_QTYPE_Q5_K || t == MOE_QTYPE_Q6_K;
}

// a row of n elements, from element 0: to float32 (dst) in groups of 8, by
// the threads [tid, tid + nth, ...) of a block or grid
template <int T> __device__ void row_to_f32(const uint8_t *row, int n, float *dst, int tid, int nth) {
    const int ng = n >> 3;
    for (int g = tid; g < ng; g += nth) {
        float v[8];
        deq<T>::run(row, g * 8, v);
#pragma unroll
        for (int k = 0; k < 8; k++) dst[g * 8 + k] = v[k];
    }
    for (int i = ng * 8 + tid; i < n; i += nth) dst[i] = deq<T>::one(row, i);
}

// ---- matrix products --------------------------------------------------------

__device__ __forceinline__ float silu_mul(float g, float u) { return (g / (1.0f + expf(-g))) * u; }

// epilogue: token t, output o of job J with products a (W x) and b (W2 x)
__device__ void epilogue(const gemv_job &J, int t, int o, float a, float b) {
    float r = J.mode == Y_SWIGLU ? silu_mul(a, b) : a + (J.bias ? J.bias[o] : 0.0f);
    if (J.y2) J.y2[(int64_t)t * J.ldy2 + o] = r;
    const int64_t yi = J.yrow ? (int64_t)J.yrow[t] * J.n_slots + J.yslot[t] : (int64_t)t;
    if (J.yw) r = __fmul_rn(r, J.yw[t]);
    float *dst = J.y + yi * J.ldy + o;
    *dst = J.mode == Y_ADD ? __fadd_rn(*dst, r) : r;
    if (J.used && o == 0) J.used[yi] = 1;
}

// ld8: x[0..7], as two float4 loads when x is 16-byte aligned
__device__ __forceinline__ void ld8(const float *x, bool aligned, float *o) {
    if (aligned) {
        const float4 p = ((const float4 *)x)[0], q = ((const float4 *)x)[1];
        o[0] = p.x, o[1] = p.y, o[2] = p.z, o[3] = p.w, o[4] = q.x, o[5] = q.y, o[6] = q.z, o[7] = q.w;
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = x[k];
    }
}

// gemv_group: one group of 8 dequantized weights (v; u: the second matrix's when TWO) at
// column i0 against each token's x: a[t] += v . x, b[t] += u . x
template <int GT, bool TWO>
__device__ __forceinline__ void gemv_group(const float *v, const float *u, const float *const *xp, bool xa, int i0,
                                           int nt, float *a, float *b) {
#pragma unroll
    for (int t = 0; t < GT; t++) {
        if (t >= nt) break;
        float xx[8];
        ld8(xp[t] + i0, xa, xx);
        float s = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) s += v[k] * xx[k];
        if (TWO) {
#pragma unroll
            for (int k = 0; k < 8; k++) s2 += u[k] * xx[k];
        }
        a[t] += s;
        b[t] += s2;
    }
}

// gemv_warp: one warp computes output row o of J for every token, GT tokens
// per pass over the row (GT = 1: a decode step, fewer registers)
template <int T, int GT> __device__ void gemv_warp(const gemv_job &J, int o, int lane) {
    const uint8_t *row = J.w + (size_t)o * J.row_bytes;
    const uint8_t *row2 = J.mode == Y_SWIGLU ? J.w2 + (size_t)o * J.row_bytes : nullptr;
    const int ng = J.n_in >> 3;
    for (int t0 = 0; t0 < J.n_tok; t0 += GT) {
        const int nt = min(GT, J.n_tok - t0);
        const float *xp[GT];
        float a[GT], b[GT];
        const bool xa = (((uintptr_t)J.x | (uintptr_t)(J.ldx * 4)) & 15) == 0; // float4 loads of x
#pragma unroll
        for (int t = 0; t < GT; t++) {
            xp[t] = t < nt ? J.x + (int64_t)(J.xrow ? J.xrow[t0 + t] : t0 + t) * J.ldx : J.x;
            a[t] = b[t] = 0.0f;
        }
        // (unrolling by 2, 4 or 8 groups per lane, loads first, measured no faster on an H200)
        if (row2) {
            for (int g = lane; g < ng; g += 32) {
                float v[8], u[8];
                deq<T>::run(row, g * 8, v);
                deq<T>::run(row2, g * 8, u);
                gemv_group<GT, true>(v, u, xp, xa, g * 8, nt, a, b);
            }
        } else {
            for (int g = lane; g < ng; g += 32) {
                float v[8];
                deq<T>::run(row, g * 8, v);
                gemv_group<GT, false>(v, v, xp, xa, g * 8, nt, a, b);
            }
        }
        for (int i = ng * 8 + lane; i < J.n_in; i += 32) { // float types with n_in % 8 != 0
            const float v = deq<T>::one(row, i), u = row2 ? deq<T>::one(row2, i) : 0.0f;
#pragma unroll
            for (int t = 0; t < GT; t++) { // constant indices keep a[] and b[] in registers
                if (t >= nt) break;
                a[t] += v * xp[t][i];
                b[t] += u * xp[t][i];
            }
        }
#pragma unroll
        for (int t = 0; t < GT; t++) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                a[t] += __shfl_xor_sync(0xffffffffu, a[t], off);
                b[t] += __shfl_xor_sync(0xffffffffu, b[t], off);
            }
        }
#pragma unroll
        for (int t = 0; t < GT; t++)
            if (t < nt && lane == t) epilogue(J, t0 + t, o, a[t], b[t]);
    }
}

template <int T> __device__ void gemv_warp1(const gemv_job &J, int o, int lane) { gemv_warp<T, 1>(J, o, lane); }
template <int T> __device__ void gemv_warpn(const gemv_job &J, int o, int lane) {
    gemv_warp<T, MOE_CUDA_GEMV_TOK>(J, o, lane);
}

constexpr int GEMV_WARPS = 4;

// gemv_kernel<MULTI>: MULTI = 0 when every job has one token (a decode step:
// a separate kernel so its register count is the one-token path's)
template <int MULTI> __global__ void __launch_bounds__(32 * GEMV_WARPS) gemv_kernel(const gemv_job *jobs) {
    __shared__ gemv_job J;
    if (threadIdx.x == 0) J = jobs[blockIdx.y];
    __syncthreads();
    const int o = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (o >= J.n_out) return;
    if (MULTI) {
        DISPATCH(J.type, gemv_warpn, J, o, threadIdx.x & 31);
    } else {
        DISPATCH(J.type, gemv_warp1, J, o, threadIdx.x & 31);
    }
}

// ---- one-token GEMV with x in shared memory (MOE_CUDA_GEMV=tiled; NOT YET RUN) ----
//
// Why: on the H200 the kernel above moves about the same number of weights per
// second for q4_k and q8_0 (750-820 G elements/s) although their bytes differ
// 2x, which points at the per-row re-read of x (4 bytes per weight, from L2 once
// the streamed weights have evicted it from L1) rather than at the weights. Here a
// block of GEMV_T_WARPS warps, GEMV_T_ROWS rows each, stages x in shared memory one
// tile of GEMV_TILE elements at a time and every row of the block reads it from
// there. A lane sums the same groups in the same order as gemv_warp<T, 1> (the tile
// is a whole number of 32-group passes), so the products agree with it to the
// compiler's contraction choices. Written and compiled without a GPU: opt-in until
// test-cuda and bench-cuda have run it (scripts/gpu-check.sh step gemv-tiled).

constexpr int GEMV_T_WARPS = 8, GEMV_T_ROWS = 2, GEMV_TILE = 4096; // 16 KiB of x per block

template <int T>
__device__ void gemv_tiled_rows(const gemv_job &J, const float *xg, float *xs, int warp, int lane) {
    const int o0 = (blockIdx.x * GEMV_T_WARPS + warp) * GEMV_T_ROWS;
    const bool two = J.mode == Y_SWIGLU;
    float a[GEMV_T_ROWS], b[GEMV_T_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_T_ROWS; r++) a[r] = b[r] = 0.0f;
    const int ng = J.n_in >> 3;
    for (int c0 = 0; c0 < J.n_in; c0 += GEMV_TILE) {
        const int len = min(GEMV_TILE, J.n_in - c0);
        __syncthreads(); // the last tile's readers are done
        for (int i = threadIdx.x; i < len; i += blockDim.x) xs[i] = xg[c0 + i];
        __syncthreads();
        const int g0 = c0 >> 3, g1 = min(ng, (c0 + len) >> 3);
#pragma unroll
        for (int r = 0; r < GEMV_T_ROWS; r++) {
            const int o = o0 + r;
            if (o >= J.n_out) break;
            const uint8_t *row = J.w + (size_t)o * J.row_bytes;
            const uint8_t *row2 = two ? J.w2 + (size_t)o * J.row_bytes : nullptr;
            for (int g = g0 + lane; g < g1; g += 32) {
                float v[8], u[8], xx[8];
                deq<T>::run(row, g * 8, v);
                if (two) deq<T>::run(row2, g * 8, u);
                const float *xp = xs + (g * 8 - c0);
#pragma unroll
                for (int k = 0; k < 8; k++) xx[k] = xp[k];
                float s = 0.0f, s2 = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) s += v[k] * xx[k];
                if (two) {
#pragma unroll
                    for (int k = 0; k < 8; k++) s2 += u[k] * xx[k];
                }
                a[r] += s;
                b[r] += s2;
            }
            if (c0 + len == J.n_in) // float types with n_in % 8 != 0: the tail, in the last tile
                for (int i = ng * 8 + lane; i < J.n_in; i += 32) {
                    const float xi = xs[i - c0];
                    a[r] += deq<T>::one(row, i) * xi;
                    if (two) b[r] += deq<T>::one(row2, i) * xi;
                }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_T_ROWS; r++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            a[r] += __shfl_xor_sync(0xffffffffu, a[r], off);
            b[r] += __shfl_xor_sync(0xffffffffu, b[r], off);
        }
        if (lane == 0 && o0 + r < J.n_out) epilogue(J, 0, o0 + r, a[r], b[r]);
    }
}

__global__ void __launch_bounds__(32 * GEMV_T_WARPS) gemv_tiled_kernel(const gemv_job *jobs) {
    __shared__ gemv_job J;
    __shared__ float xs[GEMV_TILE];
    if (threadIdx.x == 0) J = jobs[blockIdx.y];
    __syncthreads();
    // every warp stays for the block's barriers, rows past n_out or not
    const float *xg = J.x + (int64_t)(J.xrow ? J.xrow[0] : 0) * J.ldx;
    DISPATCH(J.type, gemv_tiled_rows, J, xg, xs, (int)(threadIdx.x >> 5), (int)(threadIdx.x & 31));
}

// ---- the cuBLAS path: dequantize / gather + convert, then the epilogue ------

enum { OUT_F32 = 0, OUT_F16 = 1, OUT_BF16 = 2 };

__device__ __forceinline__ void put(void *out, int out_type, int64_t i, float v) {
    if (out_type == OUT_F32) ((float *)out)[i] = v;
    else if (out_type == OUT_F16) ((__half *)out)[i] = __float2half_rn(v);
    else ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn(v);
}

template <int T>
__device__ void dequant_rows(const uint8_t *w, size_t row_bytes, int o0, int rows, int n_in, void *out, int out_type) {
    const int ng = (n_in + 7) >> 3;
    const int64_t total = (int64_t)rows * ng;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
        const int r = (int)(idx / ng), g = (int)(idx % ng);
        const uint8_t *row = w + (size_t)(o0 + r) * row_bytes;
        const int64_t base = (int64_t)r * n_in + g * 8;
        if (g * 8 + 8 <= n_in) {
            float v[8];
            deq<T>::run(row, g * 8, v);
#pragma unroll
            for (int k = 0; k < 8; k++) put(out, out_type, base + k, v[k]);
        } else {
            for (int i = g * 8; i < n_in; i++) put(out, out_type, (int64_t)r * n_in + i, deq<T>::one(row, i));
        }
    }
}

__global__ void dequant_kernel(const uint8_t *w, int type, size_t row_bytes, int o0, int rows, int n_in, void *out,
                               int out_type) {
    DISPATCH(type, dequant_rows, w, row_bytes, o0, rows, n_in, out, out_type);
}

__global__ void gather_kernel(const float *x, int64_t ldx, const int32_t *xrow, int t0, int nt, int n_in, void *out,
                              int out_type) {
    const int64_t total = (int64_t)nt * n_in;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
        const int t = (int)(idx / n_in), i = (int)(idx % n_in);
        const int src = xrow ? xrow[t0 + t] : t0 + t;
        put(out, out_type, idx, x[(int64_t)src * ldx + i]);
    }
}

__global__ void epilogue_kernel(gemv_job J, int t0, int nt, const float *g, const float *u, int ldg) {
    const int64_t total = (int64_t)nt * J.n_out;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
        const int t = (int)(idx / J.n_out), o = (int)(idx % J.n_out);
        epilogue(J, t0 + t, o, g[(int64_t)t * ldg + o], u ? u[(int64_t)t * ldg + o] : 0.0f);
    }
}

// ---- embeddings, norms ------------------------------------------------------

template <int T> __device__ void embed_row(const uint8_t *w, size_t row_bytes, int n_in, int tok, float *x) {
    row_to_f32<T>(w + (size_t)tok * row_bytes, n_in, x, threadIdx.x, blockDim.x);
}

__global__ void embed_kernel(const uint8_t *w, int type, size_t row_bytes, int n_in, const int32_t *tokens, float *x) {
    DISPATCH(type, embed_row, w, row_bytes, n_in, tokens[blockIdx.x], x + (int64_t)blockIdx.x * n_in);
}

template <int T> __device__ void dequant_row_block(const uint8_t *w, size_t row_bytes, int n_in, float *y) {
    row_to_f32<T>(w + (size_t)blockIdx.x * row_bytes, n_in, y + (int64_t)blockIdx.x * n_in, threadIdx.x, blockDim.x);
}

__global__ void dequant_f32_kernel(const uint8_t *w, int type, size_t row_bytes, int n_in, float *y) {
    DISPATCH(type, dequant_row_block, w, row_bytes, n_in, y);
}

// block_sum: the sum of v over the block (any size up to 1024), in double, returned to every thread
__device__ double block_sum(double v) {
    __shared__ double part[32];
    __shared__ double total;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    __syncthreads(); // part / total may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0;
        for (int i = 0; i < nw; i++) s += part[i];
        total = s;
    }
    __syncthreads();
    return total;
}

// rms_inplace / rms: y = w * (x * r), r = 1 / sqrt(mean(x^2) + eps), as the CPU's rms_norm
__device__ void rms_block(float *y, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)x[i] * x[i];
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = __fmul_rn(w[i], __fmul_rn(x[i], r));
    __syncthreads();
}

__global__ void norm_kernel(int layer, const float *x, const float *w, const float *b, int n, float eps, float *y) {
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *yr = y + (int64_t)blockIdx.x * n;
    if (!layer) {
        rms_block(yr, xr, w, n, eps);
        return;
    }
    double s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    const double mean = block_sum(s) / (double)n;
    double v = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    const double var = block_sum(v) / (double)n;
    const float r = 1.0f / sqrtf((float)var + eps), mf = (float)mean;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xr[i], mf), r), w[i]), b ? b[i] : 0.0f);
}

// ---- q/k post-processing, RoPE, KV cache ------------------------------------

// rope_heads: rotate n_heads heads (the halves layout) with this token's tables
__device__ void rope_heads(float *v, int n_heads, int hd, int n_rot, const float *cs, const float *sn, int tid, int nth) {
    const int half = n_rot / 2;
    for (int idx = tid; idx < n_heads * half; idx += nth) {
        const int h = idx / half, i = idx % half;
        float *x = v + (int64_t)h * hd;
        const float x1 = x[i], x2 = x[i + half];
        x[i] = __fsub_rn(__fmul_rn(x1, cs[i]), __fmul_rn(x2, sn[i]));
        x[i + half] = __fadd_rn(__fmul_rn(x2, cs[i]), __fmul_rn(x1, sn[i]));
    }
}

__global__ void qkv_post_kernel(qkv_post_args a) {
    const int t = blockIdx.x, hd = a.head_dim;
    const int q_dim = a.n_head * hd, kv_dim = a.n_head_kv * hd;
    float *q = a.q + (int64_t)t * q_dim, *k = a.k + (int64_t)t * kv_dim, *v = a.v + (int64_t)t * kv_dim;
    if (a.qk_norm == 2) { // whole projection (OLMoE)
        rms_block(q, q, a.q_norm, q_dim, a.norm_eps);
        rms_block(k, k, a.k_norm, kv_dim, a.norm_eps);
    }
    if (a.clip > 0) {
        const float cl = a.clip;
        for (int i = threadIdx.x; i < q_dim; i += blockDim.x) q[i] = fminf(fmaxf(q[i], -cl), cl);
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
            k[i] = fminf(fmaxf(k[i], -cl), cl);
            v[i] = fminf(fmaxf(v[i], -cl), cl);
        }
        __syncthreads();
    }
    if (a.qk_norm == 1) { // per head (Qwen3-MoE): one warp per head
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int h = warp; h < a.n_head + a.n_head_kv; h += nw) {
            float *x = h < a.n_head ? q + (int64_t)h * hd : k + (int64_t)(h - a.n_head) * hd;
            const float *w = h < a.n_head ? a.q_norm : a.k_norm;
            double ss = 0;
            for (int i = lane; i < hd; i += 32) ss += (double)x[i] * x[i];
            for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
            const float r = 1.0f / sqrtf((float)(ss / (double)hd) + a.norm_eps);
            for (int i = lane; i < hd; i += 32) x[i] = __fmul_rn(w[i], __fmul_rn(x[i], r));
        }
        __syncthreads();
    }
    const int half = a.n_rot / 2;
    rope_heads(q, a.n_head, hd, a.n_rot, a.cs + (int64_t)t * half, a.sn + (int64_t)t * half, threadIdx.x, blockDim.x);
    rope_heads(k, a.n_head_kv, hd, a.n_rot, a.cs + (int64_t)t * half, a.sn + (int64_t)t * half, threadIdx.x, blockDim.x);
    __syncthreads();
    const int pos0 = a.pos_dev ? *a.pos_dev : a.pos0;
    float *kc = a.k_cache + (int64_t)(pos0 + t) * kv_dim, *vc = a.v_cache + (int64_t)(pos0 + t) * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kc[i] = k[i];
        vc[i] = v[i];
    }
}

__global__ void rope_kernel(float *v, int n_heads, int hd, int n_rot, const float *cs, const float *sn) {
    const int t = blockIdx.x, half = n_rot / 2;
    rope_heads(v + (int64_t)t * n_heads * hd, n_heads, hd, n_rot, cs + (int64_t)t * half, sn + (int64_t)t * half,
               threadIdx.x, blockDim.x);
}

// ---- attention: split over the keys, online softmax, then the combine ----------

constexpr int ATT_WARPS = 4, ATT_MAX_HD = 256;

__global__ void __launch_bounds__(32 * ATT_WARPS) attn_partial_kernel(attn_args a) {
    const int bh = blockIdx.x, split = blockIdx.y;
    const int pos0 = a.pos_dev ? *a.pos_dev : a.pos0;
    const int n_split = a.pos_dev ? attn_splits(pos0 + a.n_tok, a.n_split) : a.n_split;
    if (split >= n_split) return; // a captured step's grid holds the most splits
    const int t = bh / a.n_head, h = bh % a.n_head, kvh = h / (a.n_head / a.n_head_kv);
    const int hd = a.hd, kv_dim = a.n_head_kv * hd;
    const int p = pos0 + t;
    const int lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    const int len = p - lo + 1, chunk = (len + n_split - 1) / n_split;
    const int j0 = lo + split * chunk, j1 = min(p + 1, j0 + chunk);
    __shared__ float qs[ATT_MAX_HD];
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], sacc[ATT_WARPS][ATT_MAX_HD];
    const float *q = a.q + (int64_t)t * a.n_head * hd + (int64_t)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[d];
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nr = (hd + 31) / 32;
    const float scale = 1.0f / sqrtf((float)hd);
    float m = -INFINITY, l = 0.0f, acc[ATT_MAX_HD / 32];
#pragma unroll
    for (int r = 0; r < ATT_MAX_HD / 32; r++) acc[r] = 0.0f;
    for (int j = j0 + warp; j < j1; j += ATT_WARPS) {
        const float *kp = a.k_cache + (int64_t)j * kv_dim + (int64_t)kvh * hd;
        const float *vp = a.v_cache + (int64_t)j * kv_dim + (int64_t)kvh * hd;
        float s = 0.0f;
        for (int d = lane; d < hd; d += 32) s += qs[d] * kp[d];
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        s *= scale;
        const float mn = fmaxf(m, s), c = expf(m - mn), e = expf(s - mn);
        l = l * c + e;
#pragma unroll
        for (int r = 0; r < ATT_MAX_HD / 32; r++)
            if (r < nr && lane + 32 * r < hd) acc[r] = acc[r] * c + e * vp[lane + 32 * r];
        m = mn;
    }
    if (lane == 0) sm[warp] = m, sl[warp] = l;
#pragma unroll
    for (int r = 0; r < ATT_MAX_HD / 32; r++)
        if (r < nr && lane + 32 * r < hd) sacc[warp][lane + 32 * r] = acc[r];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    const int64_t pi = (int64_t)bh * n_split + split;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm[w] != -INFINITY) s += sacc[w][d] * expf(sm[w] - M);
        a.pacc[pi * hd + d] = s;
    }
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm[w] != -INFINITY) L += sl[w] * expf(sm[w] - M);
        a.pm[pi] = M;
        a.pl[pi] = L;
    }
}

__global__ void attn_combine_kernel(attn_args a) {
    const int bh = blockIdx.x, hd = a.hd;
    const int n_split = a.pos_dev ? attn_splits(*a.pos_dev + a.n_tok, a.n_split) : a.n_split;
    const float *pm = a.pm + (int64_t)bh * n_split, *pl = a.pl + (int64_t)bh * n_split;
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, pm[s]);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++)
        if (pm[s] != -INFINITY) L += pl[s] * expf(pm[s] - M);
    float *out = a.out + (int64_t)bh * hd; // [t][h][d] = bh * hd + d
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float s = 0.0f;
        for (int sp = 0; sp < n_split; sp++)
            if (pm[sp] != -INFINITY) s += a.pacc[((int64_t)bh * n_split + sp) * hd + d] * expf(pm[sp] - M);
        out[d] = s / L;
    }
}

// ---- residual, slots, routing ---------------------------------------------------

__global__ void residual_kernel(float *x, const float *acc, const float *part, const uint8_t *used, const float *sg,
                                const float *sh, int n_tok, int n_slots, int n_embd) {
    const int64_t total = (int64_t)n_tok * n_embd;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
        const int t = (int)(idx / n_embd), d = (int)(idx % n_embd);
        float a = acc[idx];
        for (int k = 0; k < n_slots; k++)
            if (used[(int64_t)t * n_slots + k]) a = __fadd_rn(a, part[((int64_t)t * n_slots + k) * n_embd + d]);
        if (sh) a = __fadd_rn(a, sg ? __fmul_rn(1.0f / (1.0f + expf(-sg[t])), sh[idx]) : sh[idx]);
        x[idx] = __fadd_rn(x[idx], a);
    }
}

__global__ void scatter_kernel(float *part, uint8_t *used, const float *src, const int32_t *row, const int32_t *slot,
                               int n_slots, int n_embd) {
    const int i = blockIdx.x;
    const int64_t dst = (int64_t)row[i] * n_slots + slot[i];
    for (int d = threadIdx.x; d < n_embd; d += blockDim.x) part[dst * n_embd + d] = src[(int64_t)i * n_embd + d];
    if (threadIdx.x == 0) used[dst] = 1;
}

constexpr int ROUTE_MAX_E = 256;

// route_kernel: one thread per token, the session's routing (session.c) in the same float operations
__global__ void route_kernel(const float *logits, int n, int E, int K, int sparsemixer, int norm_topk, float eps,
                             float scale, int32_t *sel, float *w) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const float *lg = logits + (int64_t)t * E;
    int32_t *s = sel + (int64_t)t * K;
    float *wt = w + (int64_t)t * K;
    float p[ROUTE_MAX_E];
    if (!sparsemixer) {
        float mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmaxf(mx, lg[e]);
        for (int e = 0; e < E; e++) sum += (p[e] = expf(lg[e] - mx));
        for (int e = 0; e < E; e++) p[e] /= sum;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= s[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            s[k] = best;
            wt[k] = p[best];
        }
        if (norm_topk) {
            float ws = 0;
            for (int k = 0; k < K; k++) ws += wt[k];
            for (int k = 0; k < K; k++) wt[k] /= ws;
        }
        for (int k = 0; k < K; k++) wt[k] *= scale;
        return;
    }
    for (int e = 0; e < E; e++) p[e] = lg[e]; // masked scores
    for (int pick = 0; pick < K && pick < 2; pick++) {
        int ind = 0;
        for (int e = 1; e < E; e++)
            if (p[e] > p[ind]) ind = e;
        const float thr = p[ind];
        float mx = -INFINITY, sum = 0, gi = 0;
        for (int e = 0; e < E; e++) {
            const float factor = fmaxf(fabsf(lg[e]), thr);
            const bool drop = ((thr - lg[e]) / factor) > 2.0f * eps;
            if (!drop) mx = fmaxf(mx, p[e]);
        }
        for (int e = 0; e < E; e++) {
            const float factor = fmaxf(fabsf(lg[e]), thr);
            const bool drop = ((thr - lg[e]) / factor) > 2.0f * eps;
            const float g = drop || p[e] == -INFINITY ? 0.0f : expf(p[e] - mx);
            sum += g;
            if (e == ind) gi = g;
        }
        s[pick] = ind;
        wt[pick] = gi / sum;
        p[ind] = -INFINITY;
    }
}

// expert_jobs_kernel: a captured step's routed-expert jobs from the layer's templates (launch_expert_jobs)
__global__ void expert_jobs_kernel(expert_jobs_args a) {
    const int i = threadIdx.x;
    if (i >= a.k) return;
    const int32_t e = a.sel[i];
    int r = 0;
    for (int q = 0; q < a.k; q++) r += a.sel[q] < e || (a.sel[q] == e && q < i);
    a.slots[i] = r;
    gemv_job gu = a.tmpl_gu[e], dn = a.tmpl_dn[e];
    gu.y = a.h + (int64_t)i * a.ldh;
    dn.x = a.h + (int64_t)i * a.ldh;
    dn.yslot = a.slots + i;
    dn.yw = a.w + i;
    a.gu[i] = gu;
    a.dn[i] = dn;
}

int grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (int)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

} // namespace

// ---- launchers ---------------------------------------------------------------------

namespace {
thread_local int64_t g_launches; // this thread's launches (launch_count)
}

void launch_note(void) { g_launches++; }
int64_t launch_count(void) { return g_launches; }

enum moe_status launch_gemv(const gemv_job *jobs_dev, int n_jobs, int max_out, int max_tok, cudaStream_t stream) {
    if (n_jobs <= 0) return MOE_OK;
    dim3 grid((unsigned)((max_out + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)n_jobs);
    static const bool tiled = [] { // the opt-in one-token kernel above (not yet run on a GPU)
        const char *e = getenv("MOE_CUDA_GEMV");
        return e && strcmp(e, "tiled") == 0;
    }();
    if (max_tok > 1) {
        gemv_kernel<1><<<grid, 32 * GEMV_WARPS, 0, stream>>>(jobs_dev);
    } else if (tiled) {
        const int rows = GEMV_T_WARPS * GEMV_T_ROWS;
        gemv_tiled_kernel<<<dim3((unsigned)((max_out + rows - 1) / rows), (unsigned)n_jobs), 32 * GEMV_T_WARPS, 0,
                            stream>>>(jobs_dev);
    } else {
        gemv_kernel<0><<<grid, 32 * GEMV_WARPS, 0, stream>>>(jobs_dev);
    }
    LAUNCHED();
    return MOE_OK;
}

enum moe_status run_gemm(const gemv_job *job, const gemm_ctx *g, cudaStream_t stream) {
    const gemv_job &J = *job;
    if (!type_ok(J.type)) {
        MOE_LOGE("CUDA backend: weights of type %s are not supported", moe_qtype_name((enum moe_qtype)J.type));
        return MOE_ERR_UNSUPPORTED;
    }
    const int out_type = g->f32 ? OUT_F32 : J.type == MOE_QTYPE_BF16 ? OUT_BF16 : OUT_F16;
    const cudaDataType ct = out_type == OUT_F32 ? CUDA_R_32F : out_type == OUT_F16 ? CUDA_R_16F : CUDA_R_16BF;
    const size_t es = out_type == OUT_F32 ? 4 : 2;
    int64_t ntc = (int64_t)(g->obuf_elems / (size_t)J.n_out);
    if ((int64_t)(g->xbuf_bytes / ((size_t)J.n_in * es)) < ntc) ntc = (int64_t)(g->xbuf_bytes / ((size_t)J.n_in * es));
    if (ntc > J.n_tok) ntc = J.n_tok;
    int64_t R = (int64_t)(g->wbuf_bytes / ((size_t)J.n_in * es));
    if (R > J.n_out) R = J.n_out;
    if (ntc < 1 || R < 1) {
        MOE_LOGE("CUDA backend: GEMM buffers too small for a [%d x %d] matrix", J.n_out, J.n_in);
        return MOE_ERR_NOMEM;
    }
    CUBLAS(moe_blas_set_stream(g->blas, stream));
    const float one = 1.0f, zero = 0.0f;
    for (int t0 = 0; t0 < J.n_tok; t0 += (int)ntc) {
        const int nt = (int)(J.n_tok - t0 < ntc ? J.n_tok - t0 : ntc);
        gather_kernel<<<grid_for((int64_t)nt * J.n_in, 256), 256, 0, stream>>>(J.x, J.ldx, J.xrow, t0, nt, J.n_in,
                                                                                g->xbuf, out_type);
        LAUNCHED();
        for (int pass = 0; pass < (J.mode == Y_SWIGLU ? 2 : 1); pass++) {
            const uint8_t *w = pass ? J.w2 : J.w;
            float *dst = pass ? g->ubuf : g->gbuf;
            for (int64_t o0 = 0; o0 < J.n_out; o0 += R) {
                const int r = (int)(J.n_out - o0 < R ? J.n_out - o0 : R);
                dequant_kernel<<<grid_for((int64_t)r * ((J.n_in + 7) / 8), 256), 256, 0, stream>>>(
                    w, J.type, J.row_bytes, (int)o0, r, J.n_in, g->wbuf, out_type);
                LAUNCHED();
                // column-major: C[o, t] (ldc n_out) = W_slab^T (k = n_in) x X^T
                CUBLAS(moe_blas_gemm_ex(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, r, nt, J.n_in, &one, g->wbuf, ct, J.n_in,
                                    g->xbuf, ct, J.n_in, &zero, dst + o0, CUDA_R_32F, J.n_out, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
                launch_note();
            }
        }
        epilogue_kernel<<<grid_for((int64_t)nt * J.n_out, 256), 256, 0, stream>>>(
            J, t0, nt, g->gbuf, J.mode == Y_SWIGLU ? g->ubuf : nullptr, J.n_out);
        LAUNCHED();
    }
    return MOE_OK;
}

enum moe_status launch_dequant(const uint8_t *w, int type, int n_out, int n_in, float *y, cudaStream_t stream) {
    if (!type_ok(type)) return MOE_ERR_UNSUPPORTED;
    if (n_out <= 0) return MOE_OK;
    dequant_f32_kernel<<<n_out, 128, 0, stream>>>(w, type, moe_qtype_row_bytes((enum moe_qtype)type, n_in), n_in, y);
    LAUNCHED();
    return MOE_OK;
}

enum moe_status launch_embed(const uint8_t *w, int type, int n_in, const int32_t *tokens, int n, float *x,
                             cudaStream_t stream) {
    if (!type_ok(type)) return MOE_ERR_UNSUPPORTED;
    if (n <= 0) return MOE_OK;
    embed_kernel<<<n, 128, 0, stream>>>(w, type, moe_qtype_row_bytes((enum moe_qtype)type, n_in), n_in, tokens, x);
    LAUNCHED();
    return MOE_OK;
}

enum moe_status launch_norm(int layer, const float *x, const float *w, const float *b, int n_rows, int n, float eps,
                            float *y, cudaStream_t stream) {
    if (n_rows <= 0) return MOE_OK;
    norm_kernel<<<n_rows, 256, 0, stream>>>(layer, x, w, b, n, eps, y);
    LAUNCHED();
    return MOE_OK;
}

enum moe_status launch_qkv_post(const qkv_post_args *a, cudaStream_t stream) {
    if (a->n_tok <= 0) return MOE_OK;
    qkv_post_kernel<<<a->n_tok, 256, 0, stream>>>(*a);
    LAUNCHED();
    return MOE_OK;
}

enum moe_status launch_rope(float *v, int n_tok, int n_heads, int head_dim, int n_rot, const float *cs, const float *sn,
                            cudaStream_t stream) {
    if (n_tok <= 0) return MOE_OK;
    rope_kernel<<<n_tok, 128, 0, stream>>>(v, n_heads, head_dim, n_rot, cs, sn);
    LAUNCHED();
    return MOE_OK;
}

enum moe_status launch_attention(const attn_args *a, cudaStream_t stream) {
    if (a->hd > ATT_MAX_HD || a->n_split < 1 || a->n_head % a->n_head_kv) {
        MOE_LOGE("CUDA attention: head size %d (at most %d), %d splits, %d / %d heads", a->hd, ATT_MAX_HD, a->n_split,
                 a->n_head, a->n_head_kv);
        return MOE_ERR_UNSUPPORTED;
    }
    if (a->n_tok <= 0) return MOE_OK;
    dim3 grid((unsigned)(a->n_tok * a->n_head), (unsigned)a->n_split);
    attn_partial_kernel<<<grid, 32 * ATT_WARPS, 0, stream>>>(*a);
    LAUNCHED();
    attn_combine_kernel<<<a->n_tok * a->n_head, 128, 0, stream>>>(*a);
    LAUNCHED();
    return MOE_OK;
}

enum moe_status launch_residual(float *x, const float *acc, const float *part, const uint8_t *used, const float *sg,
                                const float *sh, int n_tok, int n_slots, int n_embd, cudaStream_t stream) {
    if (n_tok <= 0) return MOE_OK;
    residual_kernel<<<grid_for((int64_t)n_tok * n_embd, 256), 256, 0, stream>>>(x, acc, part, used, sg, sh, n_tok,
                                                                                  n_slots, n_embd);
    LAUNCHED();
    return MOE_OK;
}

enum moe_status launch_scatter_slots(float *part, uint8_t *used, const float *src, const int32_t *row,
                                     const int32_t *slot, int n, int n_slots, int n_embd, cudaStream_t stream) {
    if (n <= 0) return MOE_OK;
    scatter_kernel<<<n, 256, 0, stream>>>(part, used, src, row, slot, n_slots, n_embd);
    LAUNCHED();
    return MOE_OK;
}

enum moe_status launch_expert_jobs(const expert_jobs_args *a, cudaStream_t stream) {
    if (a->k < 1 || a->k > 1024) {
        MOE_LOGE("CUDA expert jobs: top-%d", a->k);
        return MOE_ERR_UNSUPPORTED;
    }
    expert_jobs_kernel<<<1, (a->k + 31) / 32 * 32, 0, stream>>>(*a);
    LAUNCHED();
    return MOE_OK;
}

enum moe_status launch_route(const float *logits, int n, int E, int k, int sparsemixer, int norm_topk, float eps,
                             float scale, int32_t *sel, float *w, cudaStream_t stream) {
    if (E > ROUTE_MAX_E || k > E || k < 1) {
        MOE_LOGE("CUDA routing: %d experts (at most %d), top-%d", E, ROUTE_MAX_E, k);
        return MOE_ERR_UNSUPPORTED;
    }
    if (n <= 0) return MOE_OK;
    route_kernel<<<(n + 63) / 64, 64, 0, stream>>>(logits, n, E, k, sparsemixer, norm_topk, eps, scale, sel, w);
    LAUNCHED();
    return MOE_OK;
}

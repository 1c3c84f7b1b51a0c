/*
 * quant.c - the type table, the reference (scalar) quantizers, dequantizers and
 * dot products, and run-time selection of the SIMD kernels.
 *
 * Everything here is the specification the SIMD kernels (quant-avx2.c,
 * quant-avx512.c) are tested against. Float arithmetic is written operation by
 * operation in the order that makes the results bit-identical to gguf's numpy
 * code and ggml's reference C code; the target is built with -ffp-contract=off
 * so that no multiply-add is fused behind our back (and ISO C mode, which the
 * project uses, does not contract either).
 *
 * Blocks are read and written byte-wise (memcpy for 16/32-bit fields), so rows
 * need no alignment.
 */
#define MOE_QUANT_INTERNAL 1
#include "moe-quant.h"

/* Never fuse a*b+c: the results must match the reference rounding step by step
 * (the build passes -ffp-contract=off; GCC in ISO C mode does not contract
 * anyway, and clang honours the standard pragma). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "moe-dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* ---- small helpers ------------------------------------------------------ */

/* Read/write little-endian fields of a block at any alignment. */
static inline uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline float rdf32(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* IEEE half to float, exact, inline and branch-light: the same results as
 * moe_f16_to_f32 (test-quant checks all 65536 inputs), but without a call, which
 * would make the scalar dot products keep their running sum in memory. */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13); /* inf / NaN (payload kept) */
    } else if (e != 0) {
        u = sign | ((e + 112) << 23) | (m << 13);
    } else if (m == 0) {
        u = sign;
    } else { /* subnormal: m * 2^-24 with top bit p: exponent p - 24 */
        const int p = 31 - __builtin_clz(m);
        u = sign | ((uint32_t)(p + 103) << 23) | ((m << (23 - p)) & 0x7fffffu);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float f16v(const uint8_t *p) { return half_to_float(rd16(p)); }

/*
 * Round to the nearest integer, ties to even, for |v| < 2^22: adding 1.5*2^23
 * pushes the fraction out of the mantissa, whose low 23 bits then hold the
 * integer offset by 2^22. This is the rounding ggml's k-quant code uses, and we
 * keep its behaviour outside that range too (a deterministic, meaningless value;
 * every caller clamps the result), so that pathological blocks still match.
 */
static inline int round_nearest(float v) {
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/*
 * Float to int32 as the x86 truncating conversion (cvttss2si) does it: toward
 * zero, and INT32_MIN for NaN and out-of-range values. numpy's float->int8/uint8
 * casts (and ggml's C casts, on x86) go through this conversion and then keep the
 * low 8 bits; reproducing it makes degenerate blocks (e.g. 1/d overflowing to
 * inf) match gguf bit for bit, without undefined behaviour in C.
 */
static inline int32_t cvt_trunc_i32(float v) {
    if (!(v > -2147483904.0f && v < 2147483648.0f)) return INT32_MIN;
    return (int32_t)v;
}

/* ==== reference quantizers ============================================== */

/*
 * q8_0 (as gguf's numpy code and ggml's quantize_row_q8_0_ref): d = amax/127,
 * q = round-half-away(x/d) computed as x * (1/d).
 */
static void quantize_q8_0(const float *x, void *dst, int64_t nb) {
    uint8_t *y = dst;
    for (int64_t i = 0; i < nb; i++, x += MOE_QK8_0, y += sizeof(moe_block_q8_0)) {
        float amax = 0.0f;
        for (int j = 0; j < MOE_QK8_0; j++) {
            float a = fabsf(x[j]);
            amax = amax > a ? amax : a;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr16(y + offsetof(moe_block_q8_0, d), moe_f32_to_f16(d));
        for (int j = 0; j < MOE_QK8_0; j++) {
            const float v = x[j] * id;
            y[offsetof(moe_block_q8_0, qs) + j] = (uint8_t)cvt_trunc_i32(roundf(v));
        }
    }
}

/*
 * q4_0 (as gguf): max = the first element of largest magnitude (sign kept),
 * d = max/-8, q = min(15, trunc(x*(1/d) + 8.5)). d carries the sign so that max
 * itself lands on level -8 (q = 0); the opposite extreme, +8, is clamped to 7.
 * (ggml's C differs from gguf in one corner: for an all-zero block starting with
 * -0.0, gguf stores d = +0 and ggml d = -0; we follow gguf.)
 */
/* The e2m1 values of mxfp4, doubled (ggml's kvalues_mxfp4). */
static const int8_t k_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* mxfp4_index: the code whose value (times d) is nearest to x, the lowest on ties. */
static int mxfp4_index(float x, float d) {
    int best = 0;
    float best_err = fabsf((float)k_mxfp4[0] * d - x);
    for (int i = 1; i < 16; i++) {
        float err = fabsf((float)k_mxfp4[i] * d - x);
        if (err < best_err) best = i, best_err = err;
    }
    return best;
}

/* ggml's quantize_row_mxfp4_ref: e = floor(log2(amax)) - 2 + 127, so the
 * block's largest magnitude lands in kv's top octave; each value to its
 * nearest code. The exponent is converted through int and wrapped to 8 bits
 * as ggml's cast does on the machines it runs on (only blocks below 2^-125
 * or above 2^130 reach that). */
static void quantize_mxfp4(const float *x, void *dst, int64_t nb) {
    uint8_t *y = dst;
    for (int64_t i = 0; i < nb; i++, x += MOE_QK_MXFP4, y += sizeof(moe_block_mxfp4)) {
        float amax = 0.0f;
        for (int j = 0; j < MOE_QK_MXFP4; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        const uint8_t e = amax > 0.0f ? (uint8_t)(int)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = moe_e8m0_to_f32_half(e);
        y[0] = e;
        for (int j = 0; j < MOE_QK_MXFP4 / 2; j++)
            y[1 + j] = (uint8_t)(mxfp4_index(x[j], d) | mxfp4_index(x[j + MOE_QK_MXFP4 / 2], d) << 4);
    }
}

static void quantize_q4_0(const float *x, void *dst, int64_t nb) {
    uint8_t *y = dst;
    for (int64_t i = 0; i < nb; i++, x += MOE_QK4_0, y += sizeof(moe_block_q4_0)) {
        int imax = 0;
        float amax = fabsf(x[0]);
        for (int j = 1; j < MOE_QK4_0; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                imax = j;
            }
        }
        const float d = x[imax] / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr16(y + offsetof(moe_block_q4_0, d), moe_f32_to_f16(d));
        uint8_t q[MOE_QK4_0];
        for (int j = 0; j < MOE_QK4_0; j++) {
            float v = x[j] * id;
            v = v + 8.5f;
            uint8_t b = (uint8_t)cvt_trunc_i32(v);
            q[j] = b > 15 ? 15 : b;
        }
        for (int j = 0; j < MOE_QK4_0 / 2; j++)
            y[offsetof(moe_block_q4_0, qs) + j] = (uint8_t)(q[j] | (q[j + MOE_QK4_0 / 2] << 4));
    }
}

/*
 * Asymmetric fit used by q2_k, q4_k and q5_k (ggml's make_qkx2_quants): find
 * scale s >= 0 and offset m <= 0 so that x[i] ~ s*L[i] + m with integer levels
 * L[i] in 0..nmax, minimising sum w[i]*|err| (use_mad) or sum w[i]*err^2.
 *
 * Start from the min/max grid (m = min(x, 0), s = (max-m)/nmax). Then for
 * nstep+1 trial grids with nmax + rmin + rdelta*k steps over the range, round x
 * to levels and solve the 2x2 weighted least-squares problem for (s, m) given
 * those levels (if m comes out positive, pin it to 0 and refit s alone). Keep the
 * trial with the smallest weighted error. Returns s and stores -m in *neg_min;
 * the levels of the winner are in L. Operation order matches ggml exactly.
 */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *neg_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                           int use_mad) {
    float lo = x[0], hi = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *neg_min = -lo;
        return 0.0f;
    }
    float iscale = (float)nmax / (hi - lo);
    float scale = 1.0f / iscale;
    float min = lo;
    float best_err = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = round_nearest(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_err += w[i] * diff;
    }
    if (nstep < 1) {
        *neg_min = -min;
        return scale;
    }
    /* NB: min moves to the best fit so far, and later trial grids start from it */
    for (int k = 0; k <= nstep; k++) {
        iscale = (rmin + rdelta * (float)k + (float)nmax) / (hi - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = round_nearest(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            Laux[i] = (uint8_t)l;
            const float wl = w[i] * (float)l;
            sum_l += wl;
            sum_l2 += wl * (float)l;
            sum_xl += wl * x[i];
        }
        const float det = sum_w * sum_l2 - sum_l * sum_l;
        if (!(det > 0)) continue;
        float s = (sum_w * sum_xl - sum_x * sum_l) / det;
        float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if (m > 0) {
            m = 0;
            s = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = s * (float)Laux[i] + m - x[i];
            diff = use_mad ? fabsf(diff) : diff * diff;
            err += w[i] * diff;
        }
        if (err < best_err) {
            memcpy(L, Laux, (size_t)n);
            best_err = err;
            scale = s;
            min = m;
        }
    }
    *neg_min = -min;
    return scale;
}

/* Groups whose largest magnitude is below this are treated as all zero (ggml). */
#define GROUP_EPS 1e-15f

/* Index and value of the first element of largest magnitude (ggml's scan: strict
 * '>' starting from 0, so an all-zero group gives max = 0). */
static float signed_absmax(int n, const float *x, float *amax_out) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            max = x[i];
        }
    }
    *amax_out = amax;
    return max;
}

/*
 * Symmetric fit for q3_k (ggml's make_q3_quants with its rmse option): levels
 * l in -nmax..nmax-1 and a scale s minimising sum x^2 * (x - s*l)^2. Start from
 * l = round(-nmax*x/max); then up to 5 sweeps of coordinate descent, where each
 * level is moved to the value best for the scale fitted to the other levels and
 * kept only if the overall fit sumlx^2/suml2 improves. Returns the scale;
 * L gets l + nmax.
 */
static float fit_q3(int n, int nmax, const float *x, int8_t *L) {
    float amax;
    const float max = signed_absmax(n, x, &amax);
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = (float)-nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = round_nearest(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int sweep = 0; sweep < 5; sweep++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            int nl = round_nearest(x[i] * sl2 / slx);
            nl = nl < -nmax ? -nmax : nl > nmax - 1 ? nmax - 1 : nl;
            if (nl == L[i]) continue;
            slx += w * x[i] * (float)nl;
            sl2 += w * (float)nl * (float)nl;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)nl;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/*
 * Symmetric fit for q6_k (ggml's make_qx_quants, rmse_type 1, no importance
 * weights): levels l in -nmax..nmax-1 from 19 candidate scales -(nmax + k/10)/max
 * (k = 0, then -9..9 without 0); for each, the least-squares scale under weights
 * x^2 is sumlx/suml2, and the candidate with the largest sumlx^2/suml2 (= the
 * smallest weighted error) wins. Returns the scale; L gets l + nmax.
 */
static float fit_qx(int n, int nmax, const float *x, int8_t *L) {
    float amax;
    const float max = signed_absmax(n, x, &amax);
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = round_nearest(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int k = -9; k <= 9; k++) {
        if (k == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)k) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = round_nearest(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            const float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = round_nearest(iscale * x[i]);
                l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
                L[i] = (int8_t)(l + nmax);
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Pack 256 2-bit levels: byte 32h + l holds weights 128h + 32j + l at bits 2j. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *l = L + 128 * h;
        for (int i = 0; i < 32; i++)
            qs[32 * h + i] =
                (uint8_t)(l[i] | (l[i + 32] << 2) | (l[i + 64] << 4) | (l[i + 96] << 6));
    }
}

/*
 * q2_k: each sub-block of 16 gets an asymmetric 2-bit fit (weights |x|, mean
 * absolute error, 16 trial grids); the 16 scales and 16 mins are then quantized
 * to 4 bits against their maxima (d = max_scale/15, dmin = max_min/15), and the
 * levels are recomputed with the quantized scales.
 */
static void quantize_q2_K(const float *x, void *dst, int64_t nb) {
    uint8_t *y = dst;
    uint8_t L[MOE_QK_K], Laux[16];
    float w[16], mins[16], scales[16];
    for (int64_t i = 0; i < nb; i++, x += MOE_QK_K, y += sizeof(moe_block_q2_K)) {
        uint8_t *sc = y + offsetof(moe_block_q2_K, scales);
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            scales[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f,
                                      0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = 15.0f / max_scale;
            for (int j = 0; j < 16; j++) sc[j] = (uint8_t)round_nearest(iscale * scales[j]);
            wr16(y + offsetof(moe_block_q2_K, d), moe_f32_to_f16(max_scale / 15.0f));
        } else {
            memset(sc, 0, 16);
            wr16(y + offsetof(moe_block_q2_K, d), moe_f32_to_f16(0.0f));
        }
        if (max_min > 0) {
            const float iscale = 15.0f / max_min;
            for (int j = 0; j < 16; j++)
                sc[j] = (uint8_t)(sc[j] | ((unsigned)round_nearest(iscale * mins[j]) << 4));
            wr16(y + offsetof(moe_block_q2_K, dmin), moe_f32_to_f16(max_min / 15.0f));
        } else {
            wr16(y + offsetof(moe_block_q2_K, dmin), moe_f32_to_f16(0.0f));
        }
        const float d = f16v(y + offsetof(moe_block_q2_K, d));
        const float dmin = f16v(y + offsetof(moe_block_q2_K, dmin));
        for (int j = 0; j < 16; j++) {
            const float dl = d * (float)(sc[j] & 15);
            if (dl == 0) continue;
            const float ml = dmin * (float)(sc[j] >> 4);
            for (int l = 0; l < 16; l++) {
                int q = round_nearest((x[16 * j + l] + ml) / dl);
                L[16 * j + l] = (uint8_t)(q < 0 ? 0 : q > 3 ? 3 : q);
            }
        }
        pack_2bit(L, y + offsetof(moe_block_q2_K, qs));
    }
}

/*
 * q3_k: each sub-block of 16 gets a symmetric 3-bit fit (fit_q3); the 16 signed
 * scales are quantized to 6 bits against the one of largest magnitude
 * (d = -max_scale/32), and the levels recomputed with the quantized scales.
 */
static void quantize_q3_K(const float *x, void *dst, int64_t nb) {
    uint8_t *y = dst;
    int8_t L[MOE_QK_K];
    float scales[16];
    for (int64_t i = 0; i < nb; i++, x += MOE_QK_K, y += sizeof(moe_block_q3_K)) {
        uint8_t *sc = y + offsetof(moe_block_q3_K, scales);
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
            const float a = fabsf(scales[j]);
            if (a > amax) {
                amax = a;
                max_scale = scales[j];
            }
        }
        memset(sc, 0, 12);
        if (max_scale != 0) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < 16; j++) {
                int l = (int8_t)round_nearest(iscale * scales[j]);
                l = (l < -32 ? -32 : l > 31 ? 31 : l) + 32; /* 0..63 */
                if (j < 8)
                    sc[j] = (uint8_t)(l & 15);
                else
                    sc[j - 8] = (uint8_t)(sc[j - 8] | ((l & 15) << 4));
                sc[8 + j % 4] = (uint8_t)(sc[8 + j % 4] | ((l >> 4) << (2 * (j / 4))));
            }
            wr16(y + offsetof(moe_block_q3_K, d), moe_f32_to_f16(1.0f / iscale));
        } else {
            wr16(y + offsetof(moe_block_q3_K, d), moe_f32_to_f16(0.0f));
        }
        const float d = f16v(y + offsetof(moe_block_q3_K, d));
        for (int j = 0; j < 16; j++) {
            const float dl = d * (float)moe_q3k_scale(j, sc);
            if (dl == 0) continue;
            for (int l = 0; l < 16; l++) {
                int q = round_nearest(x[16 * j + l] / dl);
                L[16 * j + l] = (int8_t)((q < -4 ? -4 : q > 3 ? 3 : q) + 4);
            }
        }
        /* high bit of weight w goes to hmask[w % 32] bit w/32; low 2 bits to qs */
        uint8_t *hm = y + offsetof(moe_block_q3_K, hmask);
        uint8_t lo[MOE_QK_K];
        memset(hm, 0, 32);
        for (int j = 0; j < MOE_QK_K; j++) {
            if (L[j] > 3) hm[j % 32] = (uint8_t)(hm[j % 32] | (1u << (j / 32)));
            lo[j] = (uint8_t)(L[j] & 3);
        }
        pack_2bit(lo, y + offsetof(moe_block_q3_K, qs));
    }
}

/* Store the 6-bit scale ls and min lm of sub-block j (0..7) into the 12 packed
 * bytes of q4_k/q5_k (the inverse of moe_q4k_scale_min; s must start zeroed for
 * j >= 4 to find the j-4 and j bytes already written). */
static void put_scale_min(int j, uint8_t ls, uint8_t lm, uint8_t *s) {
    if (j < 4) {
        s[j] = ls;
        s[j + 4] = lm;
    } else {
        s[j + 4] = (uint8_t)((ls & 15) | ((lm & 15) << 4));
        s[j - 4] = (uint8_t)(s[j - 4] | ((ls >> 4) << 6));
        s[j] = (uint8_t)(s[j] | ((lm >> 4) << 6));
    }
}

/*
 * Shared front half of q4_k and q5_k: per sub-block of 32, an asymmetric fit with
 * weights rms(x) + |x| and squared error; 6-bit scales and mins against their
 * maxima (d = max_scale/63, dmin = max_min/63); then the levels (0..nmax)
 * recomputed with the quantized values. hdr points at the block's d field (d,
 * dmin, scales[12] follow, as in both layouts).
 */
/* moe_k_asym_header (moe-quant.h): d, dmin and the packed 6-bit scales and
 * mins of a q4_k/q5_k block from its 8 fits, against their maxima. */
void moe_k_asym_header(const float *scales, const float *mins, uint8_t *hdr) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    uint8_t *s = hdr + 4;
    memset(s, 0, MOE_K_SCALE_SIZE);
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t)round_nearest(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)round_nearest(inv_min * mins[j]);
        put_scale_min(j, ls > 63 ? 63 : ls, lm > 63 ? 63 : lm, s);
    }
    wr16(hdr, moe_f32_to_f16(max_scale / 63.0f));
    wr16(hdr + 2, moe_f32_to_f16(max_min / 63.0f));
}

static void quantize_k_asym(const float *x, uint8_t *hdr, uint8_t *L, int nmax, float rmin,
                            int nstep) {
    uint8_t Laux[32];
    float w[32], mins[8], scales[8];
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        const float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        scales[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, 0);
    }
    moe_k_asym_header(scales, mins, hdr);
    const uint8_t *s = hdr + 4;
    const float d = f16v(hdr), dmin = f16v(hdr + 2);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        moe_q4k_scale_min(j, s, &sc, &m);
        const float dl = d * (float)sc;
        if (dl == 0) continue;
        const float ml = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            int q = round_nearest((x[32 * j + l] + ml) / dl);
            L[32 * j + l] = (uint8_t)(q < 0 ? 0 : q > nmax ? nmax : q);
        }
    }
}

/* q4_k: quantize_k_asym with 4-bit levels and 21 trial grids; nibble packing. */
static void quantize_q4_K(const float *x, void *dst, int64_t nb) {
    uint8_t *y = dst;
    uint8_t L[MOE_QK_K];
    for (int64_t i = 0; i < nb; i++, x += MOE_QK_K, y += sizeof(moe_block_q4_K)) {
        quantize_k_asym(x, y, L, 15, -1.0f, 20);
        uint8_t *q = y + offsetof(moe_block_q4_K, qs);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                q[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

/* q5_k: quantize_k_asym with 5-bit levels and 16 trial grids; bit 4 to qh. */
static void quantize_q5_K(const float *x, void *dst, int64_t nb) {
    uint8_t *y = dst;
    uint8_t L[MOE_QK_K];
    for (int64_t i = 0; i < nb; i++, x += MOE_QK_K, y += sizeof(moe_block_q5_K)) {
        quantize_k_asym(x, y, L, 31, -0.5f, 15);
        uint8_t *qh = y + offsetof(moe_block_q5_K, qh);
        uint8_t *q = y + offsetof(moe_block_q5_K, qs);
        memset(qh, 0, 32);
        for (int w = 0; w < MOE_QK_K; w++)
            if (L[w] > 15) qh[w % 32] = (uint8_t)(qh[w % 32] | (1u << (w / 32)));
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                q[32 * c + l] = (uint8_t)((L[64 * c + l] & 15) | ((L[64 * c + 32 + l] & 15) << 4));
    }
}

/*
 * q6_k: each sub-block of 16 gets a symmetric 6-bit fit (fit_qx); the signed
 * scales are quantized to int8 against the one of largest magnitude
 * (d = -max_scale/128), and the levels recomputed. A block whose scales are all
 * below GROUP_EPS is stored as all zero bytes.
 */
static void quantize_q6_K(const float *x, void *dst, int64_t nb) {
    uint8_t *y = dst;
    int8_t L[MOE_QK_K];
    float scales[16];
    for (int64_t i = 0; i < nb; i++, x += MOE_QK_K, y += sizeof(moe_block_q6_K)) {
        float max_scale = 0, max_abs = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_qx(16, 32, x + 16 * j, L + 16 * j);
            const float a = fabsf(scales[j]);
            if (a > max_abs) {
                max_abs = a;
                max_scale = scales[j];
            }
        }
        if (max_abs < GROUP_EPS) {
            memset(y, 0, sizeof(moe_block_q6_K));
            continue;
        }
        int8_t *sc = (int8_t *)(y + offsetof(moe_block_q6_K, scales));
        const float iscale = -128.0f / max_scale;
        wr16(y + offsetof(moe_block_q6_K, d), moe_f32_to_f16(1.0f / iscale));
        for (int j = 0; j < 16; j++) {
            int v = round_nearest(iscale * scales[j]);
            sc[j] = (int8_t)(v > 127 ? 127 : v);
        }
        const float d = f16v(y + offsetof(moe_block_q6_K, d));
        for (int j = 0; j < 16; j++) {
            const float dl = d * (float)sc[j];
            if (dl == 0) continue;
            for (int l = 0; l < 16; l++) {
                int q = round_nearest(x[16 * j + l] / dl);
                L[16 * j + l] = (int8_t)((q < -32 ? -32 : q > 31 ? 31 : q) + 32);
            }
        }
        uint8_t *ql = y + offsetof(moe_block_q6_K, ql);
        uint8_t *qh = y + offsetof(moe_block_q6_K, qh);
        for (int h = 0; h < 2; h++) {
            const uint8_t *l6 = (const uint8_t *)L + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[64 * h + l] = (uint8_t)((l6[l] & 15) | ((l6[l + 64] & 15) << 4));
                ql[64 * h + 32 + l] = (uint8_t)((l6[l + 32] & 15) | ((l6[l + 96] & 15) << 4));
                qh[32 * h + l] = (uint8_t)((l6[l] >> 4) | ((l6[l + 32] >> 4) << 2) |
                                           ((l6[l + 64] >> 4) << 4) | ((l6[l + 96] >> 4) << 6));
            }
        }
    }
}

/* q8_k: d = max/-127 (float32, sign of the largest-magnitude element), q =
 * round(x/d) as x * (-127/max), plus the sums of each 16 quants. */
static void quantize_q8_K(const float *x, void *dst, int64_t nb) {
    uint8_t *y = dst;
    for (int64_t i = 0; i < nb; i++, x += MOE_QK_K, y += sizeof(moe_block_q8_K)) {
        float amax;
        const float max = signed_absmax(MOE_QK_K, x, &amax);
        int8_t q[MOE_QK_K];
        int16_t bsums[16];
        float d = 0.0f;
        if (amax == 0) {
            memset(q, 0, sizeof q);
        } else {
            const float iscale = -127.0f / max;
            for (int j = 0; j < MOE_QK_K; j++) {
                int v = round_nearest(iscale * x[j]);
                q[j] = (int8_t)(v > 127 ? 127 : v);
            }
            d = 1.0f / iscale;
        }
        for (int s = 0; s < 16; s++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += q[16 * s + l];
            bsums[s] = (int16_t)sum;
        }
        memcpy(y + offsetof(moe_block_q8_K, d), &d, 4);
        memcpy(y + offsetof(moe_block_q8_K, qs), q, sizeof q);
        memcpy(y + offsetof(moe_block_q8_K, bsums), bsums, sizeof bsums);
    }
}

/* f32, f16, bf16 (blocks of one element): a copy, or each value rounded to
 * nearest even (moe-dtype.h's conversions). */
static void quantize_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * 4); }

static void quantize_f16(const float *x, void *dst, int64_t n) {
    uint8_t *y = dst;
    for (int64_t i = 0; i < n; i++) wr16(y + 2 * i, moe_f32_to_f16(x[i]));
}

static void quantize_bf16(const float *x, void *dst, int64_t n) {
    uint8_t *y = dst;
    for (int64_t i = 0; i < n; i++) wr16(y + 2 * i, moe_f32_to_bf16(x[i]));
}

/* ==== reference dequantizers (nb blocks; the specification) ============= */

static void deq_f32(const void *w, float *y, int64_t n) { memcpy(y, w, (size_t)n * 4); }

static void deq_f16(const void *w, float *y, int64_t n) {
    const uint8_t *p = w;
    for (int64_t i = 0; i < n; i++) y[i] = f16v(p + 2 * i);
}

static void deq_bf16(const void *w, float *y, int64_t n) {
    const uint8_t *p = w;
    for (int64_t i = 0; i < n; i++) y[i] = moe_bf16_to_f32(rd16(p + 2 * i));
}

static void deq_q4_0(const void *w, float *y, int64_t nb) {
    const uint8_t *b = w;
    for (int64_t i = 0; i < nb; i++, b += sizeof(moe_block_q4_0), y += 32) {
        const float d = f16v(b);
        const uint8_t *qs = b + offsetof(moe_block_q4_0, qs);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((qs[j] & 15) - 8);
            y[j + 16] = d * (float)((qs[j] >> 4) - 8);
        }
    }
}

static void deq_mxfp4(const void *w, float *y, int64_t nb) {
    const uint8_t *b = w;
    for (int64_t i = 0; i < nb; i++, b += sizeof(moe_block_mxfp4), y += MOE_QK_MXFP4) {
        const float d = moe_e8m0_to_f32_half(b[0]);
        for (int j = 0; j < MOE_QK_MXFP4 / 2; j++) {
            y[j] = (float)k_mxfp4[b[1 + j] & 15] * d;
            y[j + MOE_QK_MXFP4 / 2] = (float)k_mxfp4[b[1 + j] >> 4] * d;
        }
    }
}

static void deq_q8_0(const void *w, float *y, int64_t nb) {
    const uint8_t *b = w;
    for (int64_t i = 0; i < nb; i++, b += sizeof(moe_block_q8_0), y += 32) {
        const float d = f16v(b);
        const int8_t *qs = (const int8_t *)(b + offsetof(moe_block_q8_0, qs));
        for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
    }
}

/* q2_k, q3_k and q6_k dequantize per sub-block s of 16 weights (k = 16s + l):
 * s = 8h + 2j + (l0 / 16) with half h, 2-bit field (or q6_k group) j, and
 * l0 + l the byte index within the half, as in the layouts in moe-quant.h. */
static void deq_q2_K(const void *w, float *y, int64_t nb) {
    const uint8_t *b = w;
    for (int64_t i = 0; i < nb; i++, b += sizeof(moe_block_q2_K), y += MOE_QK_K) {
        const float d = f16v(b + offsetof(moe_block_q2_K, d));
        const float dmin = f16v(b + offsetof(moe_block_q2_K, dmin));
        const uint8_t *sc = b + offsetof(moe_block_q2_K, scales);
        const uint8_t *qs = b + offsetof(moe_block_q2_K, qs);
        for (int s = 0; s < 16; s++) {
            const float dl = d * (float)(sc[s] & 15), ml = dmin * (float)(sc[s] >> 4);
            const int h = s / 8, j = (s % 8) / 2, l0 = 16 * (s % 2);
            const uint8_t *q = qs + 32 * h + l0;
            for (int l = 0; l < 16; l++) y[16 * s + l] = dl * (float)((q[l] >> (2 * j)) & 3) - ml;
        }
    }
}

static void deq_q3_K(const void *w, float *y, int64_t nb) {
    const uint8_t *b = w;
    for (int64_t i = 0; i < nb; i++, b += sizeof(moe_block_q3_K), y += MOE_QK_K) {
        const float d = f16v(b + offsetof(moe_block_q3_K, d));
        const uint8_t *sc = b + offsetof(moe_block_q3_K, scales);
        const uint8_t *hm = b + offsetof(moe_block_q3_K, hmask);
        const uint8_t *qs = b + offsetof(moe_block_q3_K, qs);
        for (int s = 0; s < 16; s++) {
            const float dl = d * (float)moe_q3k_scale(s, sc);
            const int h = s / 8, j = (s % 8) / 2, l0 = 16 * (s % 2), hbit = s / 2; /* = k / 32 */
            for (int l = 0; l < 16; l++) {
                const int lo = (qs[32 * h + l0 + l] >> (2 * j)) & 3;
                const int hi = (hm[l0 + l] >> hbit) & 1;
                y[16 * s + l] = dl * (float)(lo - (hi ? 0 : 4));
            }
        }
    }
}

/* q4_k and q5_k share the scale layout; qh = NULL for q4_k. */
static void deq_k_asym(const uint8_t *b, const uint8_t *qs, const uint8_t *qh, float *y) {
    const float d = f16v(b), dmin = f16v(b + 2);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        moe_q4k_scale_min(j, b + 4, &sc, &m);
        const float dl = d * (float)sc, ml = dmin * (float)m;
        const int c = j / 2, shift = 4 * (j & 1);
        for (int l = 0; l < 32; l++) {
            int q = (qs[32 * c + l] >> shift) & 15;
            if (qh) q |= ((qh[l] >> j) & 1) << 4;
            y[32 * j + l] = dl * (float)q - ml;
        }
    }
}

static void deq_q4_K(const void *w, float *y, int64_t nb) {
    const uint8_t *b = w;
    for (int64_t i = 0; i < nb; i++, b += sizeof(moe_block_q4_K), y += MOE_QK_K)
        deq_k_asym(b, b + offsetof(moe_block_q4_K, qs), NULL, y);
}

static void deq_q5_K(const void *w, float *y, int64_t nb) {
    const uint8_t *b = w;
    for (int64_t i = 0; i < nb; i++, b += sizeof(moe_block_q5_K), y += MOE_QK_K)
        deq_k_asym(b, b + offsetof(moe_block_q5_K, qs), b + offsetof(moe_block_q5_K, qh), y);
}

static void deq_q6_K(const void *w, float *y, int64_t nb) {
    const uint8_t *b = w;
    for (int64_t i = 0; i < nb; i++, b += sizeof(moe_block_q6_K), y += MOE_QK_K) {
        const float d = f16v(b + offsetof(moe_block_q6_K, d));
        const uint8_t *ql = b + offsetof(moe_block_q6_K, ql);
        const uint8_t *qh = b + offsetof(moe_block_q6_K, qh);
        const int8_t *sc = (const int8_t *)(b + offsetof(moe_block_q6_K, scales));
        for (int s = 0; s < 16; s++) {
            const float dl = d * (float)sc[s];
            const int h = s / 8, g = (s % 8) / 2, l0 = 16 * (s % 2);
            const uint8_t *lq = ql + 64 * h + 32 * (g & 1) + l0, *hq = qh + 32 * h + l0;
            for (int l = 0; l < 16; l++) {
                const int lo = (lq[l] >> (4 * (g >> 1))) & 15;
                const int hi = (hq[l] >> (2 * g)) & 3;
                y[16 * s + l] = dl * (float)((lo | (hi << 4)) - 32);
            }
        }
    }
}

static void deq_q8_K(const void *w, float *y, int64_t nb) {
    const uint8_t *b = w;
    for (int64_t i = 0; i < nb; i++, b += sizeof(moe_block_q8_K), y += MOE_QK_K) {
        const float d = rdf32(b);
        const int8_t *qs = (const int8_t *)(b + offsetof(moe_block_q8_K, qs));
        for (int j = 0; j < MOE_QK_K; j++) y[j] = d * (float)qs[j];
    }
}

/* ==== reference dot products ============================================ */

/* Dequantize one block (or 256 elements of a plain row) at a time with the
 * reference dequantizer, then accumulate exact double products in index order.
 * (The running sum is copied into a local for the inner loop so that it stays in
 * a register; the sequence of additions is the same.) */
static float dot_blocks(moe_dequant_fn deq, size_t bytes, int bs, const void *w, const float *x,
                        int64_t nb) {
    const uint8_t *b = w;
    float v[MOE_QK_K];
    double acc = 0.0;
    for (int64_t i = 0; i < nb; i++, b += bytes, x += bs) {
        deq(b, v, 1);
        double a = acc;
        for (int j = 0; j < bs; j++) a += (double)v[j] * (double)x[j];
        acc = a;
    }
    return (float)acc;
}

#define DOT_REF(T, BLOCK, BS)                                                  \
    static float dot_ref_##T(const void *w, const float *x, int64_t nb) {      \
        return dot_blocks(deq_##T, sizeof(BLOCK), BS, w, x, nb);               \
    }
DOT_REF(q4_0, moe_block_q4_0, 32)
DOT_REF(q8_0, moe_block_q8_0, 32)
DOT_REF(q2_K, moe_block_q2_K, MOE_QK_K)
DOT_REF(q3_K, moe_block_q3_K, MOE_QK_K)
DOT_REF(q4_K, moe_block_q4_K, MOE_QK_K)
DOT_REF(q5_K, moe_block_q5_K, MOE_QK_K)
DOT_REF(q6_K, moe_block_q6_K, MOE_QK_K)
DOT_REF(q8_K, moe_block_q8_K, MOE_QK_K)
DOT_REF(mxfp4, moe_block_mxfp4, MOE_QK_MXFP4)

/* Plain rows: chunks of 256 elements through dot_blocks, then the rest. */
static float dot_plain(moe_dequant_fn deq, size_t es, const void *w, const float *x, int64_t n) {
    const int64_t nc = n / MOE_QK_K, rest = n % MOE_QK_K;
    double acc = 0.0;
    const uint8_t *p = w;
    float v[MOE_QK_K];
    for (int64_t c = 0; c <= nc; c++, p += es * MOE_QK_K, x += MOE_QK_K) {
        const int len = c < nc ? MOE_QK_K : (int)rest;
        if (len == 0) break;
        deq(p, v, len);
        double a = acc;
        for (int j = 0; j < len; j++) a += (double)v[j] * (double)x[j];
        acc = a;
    }
    return (float)acc;
}

static float dot_ref_f32(const void *w, const float *x, int64_t n) { return dot_plain(deq_f32, 4, w, x, n); }
static float dot_ref_f16(const void *w, const float *x, int64_t n) { return dot_plain(deq_f16, 2, w, x, n); }
static float dot_ref_bf16(const void *w, const float *x, int64_t n) { return dot_plain(deq_bf16, 2, w, x, n); }

/* ==== the type table ==================================================== */

/*
 * One row per type (struct moe_type_traits in moe-quant.h); an id without a row
 * (name NULL) is not a supported type. Every reader of a type's traits goes
 * through this table: the moe_qtype_* functions below, moe_act_type
 * (quant-int.c), the layout decisions of quant-pack.c, and fill_scalar.
 */
static const struct moe_type_traits g_traits[MOE_QTYPE_LIMIT] = {
    [MOE_QTYPE_F32] = {.name = "f32", .block_size = 1, .block_bytes = sizeof(float), .file_type = 1,
                       .act_type = MOE_QTYPE_F32, .group_rows = 1, .stored = MOE_QTYPE_F32,
                       .repack = MOE_QTYPE_F32, .dequantize = deq_f32, .quantize = quantize_f32,
                       .dot = dot_ref_f32},
    [MOE_QTYPE_F16] = {.name = "f16", .block_size = 1, .block_bytes = sizeof(moe_f16_bits), .file_type = 1,
                       .act_type = MOE_QTYPE_F32, .group_rows = 1, .stored = MOE_QTYPE_F16,
                       .repack = MOE_QTYPE_F16, .dequantize = deq_f16, .quantize = quantize_f16,
                       .dot = dot_ref_f16},
    [MOE_QTYPE_Q4_0] = {.name = "q4_0", .block_size = MOE_QK4_0, .block_bytes = sizeof(moe_block_q4_0),
                        .file_type = 1, .act_type = MOE_QTYPE_Q8_0, .group_rows = 1, .stored = MOE_QTYPE_Q4_0,
                        .repack = MOE_QTYPE_Q4_0, .dequantize = deq_q4_0, .quantize = quantize_q4_0,
                        .dot = dot_ref_q4_0},
    [MOE_QTYPE_Q8_0] = {.name = "q8_0", .block_size = MOE_QK8_0, .block_bytes = sizeof(moe_block_q8_0),
                        .file_type = 1, .act_type = MOE_QTYPE_Q8_0, .group_rows = 1, .stored = MOE_QTYPE_Q8_0,
                        .repack = MOE_QTYPE_Q8_0_R16, .dequantize = deq_q8_0, .quantize = quantize_q8_0,
                        .dot = dot_ref_q8_0},
    [MOE_QTYPE_Q2_K] = {.name = "q2_k", .block_size = MOE_QK_K, .block_bytes = sizeof(moe_block_q2_K),
                        .file_type = 1, .act_type = MOE_QTYPE_Q8_K, .group_rows = 1, .stored = MOE_QTYPE_Q2_K,
                        .repack = MOE_QTYPE_Q2_K, .dequantize = deq_q2_K, .quantize = quantize_q2_K,
                        .dot = dot_ref_q2_K},
    [MOE_QTYPE_Q3_K] = {.name = "q3_k", .block_size = MOE_QK_K, .block_bytes = sizeof(moe_block_q3_K),
                        .file_type = 1, .act_type = MOE_QTYPE_Q8_K, .group_rows = 1, .stored = MOE_QTYPE_Q3_K,
                        .repack = MOE_QTYPE_Q3_K, .dequantize = deq_q3_K, .quantize = quantize_q3_K,
                        .dot = dot_ref_q3_K},
    [MOE_QTYPE_Q4_K] = {.name = "q4_k", .block_size = MOE_QK_K, .block_bytes = sizeof(moe_block_q4_K),
                        .file_type = 1, .act_type = MOE_QTYPE_Q8_K, .group_rows = 1, .stored = MOE_QTYPE_Q4_K,
                        .repack = MOE_QTYPE_Q4_K_R16, .dequantize = deq_q4_K, .quantize = quantize_q4_K,
                        .dot = dot_ref_q4_K},
    [MOE_QTYPE_Q5_K] = {.name = "q5_k", .block_size = MOE_QK_K, .block_bytes = sizeof(moe_block_q5_K),
                        .file_type = 1, .act_type = MOE_QTYPE_Q8_K, .group_rows = 1, .stored = MOE_QTYPE_Q5_K,
                        .repack = MOE_QTYPE_Q5_K, .dequantize = deq_q5_K, .quantize = quantize_q5_K,
                        .dot = dot_ref_q5_K},
    [MOE_QTYPE_Q6_K] = {.name = "q6_k", .block_size = MOE_QK_K, .block_bytes = sizeof(moe_block_q6_K),
                        .file_type = 1, .act_type = MOE_QTYPE_Q8_K, .group_rows = 1, .stored = MOE_QTYPE_Q6_K,
                        .repack = MOE_QTYPE_Q6_K, .dequantize = deq_q6_K, .quantize = quantize_q6_K,
                        .dot = dot_ref_q6_K},
    /* q8_k is an activation type: its weights, if any, take the float dot */
    [MOE_QTYPE_Q8_K] = {.name = "q8_k", .block_size = MOE_QK_K, .block_bytes = sizeof(moe_block_q8_K),
                        .file_type = 1, .act_type = MOE_QTYPE_F32, .group_rows = 1, .stored = MOE_QTYPE_Q8_K,
                        .repack = MOE_QTYPE_Q8_K, .dequantize = deq_q8_K, .quantize = quantize_q8_K,
                        .dot = dot_ref_q8_K},
    [MOE_QTYPE_BF16] = {.name = "bf16", .block_size = 1, .block_bytes = sizeof(uint16_t), .file_type = 1,
                        .act_type = MOE_QTYPE_F32, .group_rows = 1, .stored = MOE_QTYPE_BF16,
                        .repack = MOE_QTYPE_BF16, .dequantize = deq_bf16, .quantize = quantize_bf16,
                        .dot = dot_ref_bf16},
    [MOE_QTYPE_MXFP4] = {.name = "mxfp4", .block_size = MOE_QK_MXFP4, .block_bytes = sizeof(moe_block_mxfp4),
                         .file_type = 1, .act_type = MOE_QTYPE_F32, .group_rows = 1, .stored = MOE_QTYPE_MXFP4,
                         .repack = MOE_QTYPE_MXFP4, .dequantize = deq_mxfp4, .quantize = quantize_mxfp4,
                         .dot = dot_ref_mxfp4},
    /* runtime layouts (moe_repack): their stored type's blocks, 16 rows interleaved;
     * no reference kernels of their own (moe_unpack_row gives the stored rows) */
    [MOE_QTYPE_Q4_K_R16] = {.name = "q4_k_r16", .block_size = MOE_QK_K, .block_bytes = sizeof(moe_block_q4_K),
                            .file_type = 0, .act_type = MOE_QTYPE_Q8_K, .group_rows = 16,
                            .stored = MOE_QTYPE_Q4_K, .repack = MOE_QTYPE_Q4_K_R16},
    [MOE_QTYPE_Q8_0_R16] = {.name = "q8_0_r16", .block_size = MOE_QK8_0, .block_bytes = sizeof(moe_block_q8_0),
                            .file_type = 0, .act_type = MOE_QTYPE_Q8_0, .group_rows = 16,
                            .stored = MOE_QTYPE_Q8_0, .repack = MOE_QTYPE_Q8_0_R16},
};

const struct moe_type_traits *moe_type_traits(enum moe_qtype t) {
    if ((int)t < 0 || (int)t >= MOE_QTYPE_LIMIT || g_traits[t].name == NULL) return NULL;
    return &g_traits[t];
}

int moe_qtype_valid(enum moe_qtype t) {
    const struct moe_type_traits *tr = moe_type_traits(t);
    return tr != NULL && tr->file_type;
}

const char *moe_qtype_name(enum moe_qtype t) {
    const struct moe_type_traits *tr = moe_type_traits(t);
    return tr ? tr->name : "?";
}

enum moe_status moe_qtype_from_name(const char *name, enum moe_qtype *out) {
    if (!name || !out) {
        MOE_LOGE("NULL argument");
        return MOE_ERR_INVALID;
    }
    for (int t = 0; t < MOE_QTYPE_LIMIT; t++) {
        if (moe_qtype_valid((enum moe_qtype)t) && strcasecmp(name, g_traits[t].name) == 0) {
            *out = (enum moe_qtype)t;
            return MOE_OK;
        }
    }
    /* llama.cpp's file types name a k-quant with its mix: Q4_K_M, Q3_K_S, ...;
     * here a tensor class gets one type, so the mix is the k-quant itself */
    const size_t n = strlen(name);
    if (n >= 4 && name[n - 2] == '_' && strchr("SMLsml", name[n - 1]) && (name[n - 3] == 'k' || name[n - 3] == 'K')) {
        char base[16];
        if (n - 2 < sizeof base) {
            memcpy(base, name, n - 2);
            base[n - 2] = 0;
            for (int t = 0; t < MOE_QTYPE_LIMIT; t++)
                if (moe_qtype_valid((enum moe_qtype)t) && strcasecmp(base, g_traits[t].name) == 0) {
                    MOE_LOGI("'%s' is llama.cpp's %s mix; every tensor of the class gets %s", name, g_traits[t].name,
                             g_traits[t].name);
                    *out = (enum moe_qtype)t;
                    return MOE_OK;
                }
        }
    }
    char list[256];
    size_t used = 0;
    list[0] = 0;
    for (int t = 0; t < MOE_QTYPE_LIMIT && used < sizeof list; t++)
        if (moe_qtype_valid((enum moe_qtype)t))
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? " " : "", g_traits[t].name);
    MOE_LOGE("unknown quantization type '%.64s' (types: %s; llama.cpp's names such as Q4_K_M are read as q4_k)", name,
             list);
    return MOE_ERR_INVALID;
}

int moe_qtype_block_size(enum moe_qtype t) {
    const struct moe_type_traits *tr = moe_type_traits(t);
    return tr ? tr->block_size : 0;
}

size_t moe_qtype_block_bytes(enum moe_qtype t) {
    const struct moe_type_traits *tr = moe_type_traits(t);
    return tr ? tr->block_bytes : 0;
}

size_t moe_qtype_row_bytes(enum moe_qtype t, int64_t n) {
    const struct moe_type_traits *tr = moe_type_traits(t);
    if (!tr || n < 0 || n % tr->block_size != 0) return 0;
    uint64_t nb = (uint64_t)(n / tr->block_size);
    if (nb > SIZE_MAX / tr->block_bytes) return 0;
    return (size_t)nb * tr->block_bytes;
}

double moe_qtype_bits_per_weight(enum moe_qtype t) {
    const struct moe_type_traits *tr = moe_type_traits(t);
    return tr ? 8.0 * (double)tr->block_bytes / tr->block_size : 0.0;
}

/* The reference quantizer of a block type, nb blocks (moe-quant.h: the SIMD
 * kernels' way back for blocks whose bytes the reference's compiled code alone
 * defines, e.g. NaN payloads in k-quant levels). */
void moe_quant_ref_blocks(enum moe_qtype t, const float *x, void *y, int64_t nb) {
    const struct moe_type_traits *tr = moe_type_traits(t);
    MOE_ASSERT(tr && tr->quantize && "moe_quant_ref_blocks: a type without a reference quantizer");
    tr->quantize(x, y, nb);
}

/* Validates the common arguments of the row functions; logs under the caller's
 * name. Returns the number of blocks through *nb. */
static enum moe_status check_row(const char *fn, enum moe_qtype t, const void *a, const void *b,
                                 int64_t n, int64_t *nb) {
    const struct moe_type_traits *tr = moe_type_traits(t);
    if (!tr || !tr->file_type) { /* a runtime layout (q4_k_r16) has no rows of its own */
        moe_log_func(MOE_LOG_ERROR, fn, "invalid quantization type %d (%s)", (int)t, tr ? tr->name : "?");
        return MOE_ERR_INVALID;
    }
    if (n < 0 || n % tr->block_size != 0) {
        moe_log_func(MOE_LOG_ERROR, fn, "%s: row length %lld is not a non-negative multiple of %d",
                     tr->name, (long long)n, tr->block_size);
        return MOE_ERR_INVALID;
    }
    if ((!a || !b) && n > 0) {
        moe_log_func(MOE_LOG_ERROR, fn, "NULL row pointer");
        return MOE_ERR_INVALID;
    }
    *nb = n / tr->block_size;
    return MOE_OK;
}

/* ==== kernel tables and ISA selection =================================== */

static struct moe_quant_kernels g_kernels[3]; /* indexed by enum moe_quant_isa */
static int g_supported[3];
static int g_isa; /* current enum moe_quant_isa; read/written atomically */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Fill a table with the scalar reference kernels: the rows' own (dot,
 * dequantize), the quantizers of the activation types some weight type's
 * integer dot uses, and the integer kernels of quant-int.c. */
static void fill_scalar(struct moe_quant_kernels *k) {
    for (int t = 0; t < MOE_QTYPE_LIMIT; t++) {
        const struct moe_type_traits *tr = moe_type_traits((enum moe_qtype)t);
        if (!tr) continue;
        k->dot[t] = tr->dot;
        k->dequant[t] = tr->dequantize;
        if (tr->act_type != MOE_QTYPE_F32) k->quant_act[tr->act_type] = g_traits[tr->act_type].quantize;
    }
    moe_quant_int_kernels_scalar(k);
}

/* Probe the CPU once, build the three tables (SIMD tables start as copies of
 * the scalar one, so a type without a SIMD kernel falls back to scalar), and pick
 * the initial ISA: MOE_QUANT_ISA from the environment if valid and supported,
 * else the best supported. */
static void init_once(void) {
    fill_scalar(&g_kernels[MOE_QUANT_ISA_SCALAR]);
    g_kernels[MOE_QUANT_ISA_AVX2] = g_kernels[MOE_QUANT_ISA_SCALAR];
    g_kernels[MOE_QUANT_ISA_AVX512] = g_kernels[MOE_QUANT_ISA_SCALAR];
    g_supported[MOE_QUANT_ISA_SCALAR] = 1;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    /* F16C via cpuid: not every compiler's __builtin_cpu_supports knows "f16c" */
    unsigned a = 0, b = 0, c = 0, d = 0;
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    g_supported[MOE_QUANT_ISA_AVX2] = __builtin_cpu_supports("avx2") &&
                                      __builtin_cpu_supports("fma") && f16c;
    g_supported[MOE_QUANT_ISA_AVX512] = g_supported[MOE_QUANT_ISA_AVX2] &&
                                        __builtin_cpu_supports("avx512f") &&
                                        __builtin_cpu_supports("avx512bw") &&
                                        __builtin_cpu_supports("avx512vl");
    moe_quant_kernels_avx2(&g_kernels[MOE_QUANT_ISA_AVX2]);
    moe_quant_int_kernels_avx2(&g_kernels[MOE_QUANT_ISA_AVX2]);
    moe_quant_kernels_avx512(&g_kernels[MOE_QUANT_ISA_AVX512]);
    /* integer dots: VNNI where the CPU has it, else the AVX2 ones (AVX-512 CPUs
     * without VNNI, e.g. Skylake-X, run AVX2 code fine) */
    moe_quant_int_kernels_avx2(&g_kernels[MOE_QUANT_ISA_AVX512]);
    if (g_supported[MOE_QUANT_ISA_AVX512] && __builtin_cpu_supports("avx512vnni"))
        moe_quant_int_kernels_avx512vnni(&g_kernels[MOE_QUANT_ISA_AVX512]);
#endif
    /* q8_0 activations are q8_0 rows (moe_quantize_act's bytes are
     * moe_quantize_row's): one SIMD quantizer serves both */
    for (int i = 0; i < 3; i++)
        if (g_kernels[i].quant_row[MOE_QTYPE_Q8_0]) g_kernels[i].quant_act[MOE_QTYPE_Q8_0] = g_kernels[i].quant_row[MOE_QTYPE_Q8_0];
    int isa = g_supported[MOE_QUANT_ISA_AVX512] ? MOE_QUANT_ISA_AVX512
              : g_supported[MOE_QUANT_ISA_AVX2] ? MOE_QUANT_ISA_AVX2
                                                : MOE_QUANT_ISA_SCALAR;
    const char *env = getenv("MOE_QUANT_ISA");
    if (env && *env) {
        int want = -1;
        for (int i = 0; i < 3; i++)
            if (strcasecmp(env, moe_quant_isa_str((enum moe_quant_isa)i)) == 0) want = i;
        if (want >= 0 && g_supported[want])
            isa = want;
        else
            MOE_LOGW("MOE_QUANT_ISA=%.32s is not a supported ISA here; using %s", env,
                     moe_quant_isa_str((enum moe_quant_isa)isa));
    }
    __atomic_store_n(&g_isa, isa, __ATOMIC_RELEASE);
}

/* The kernel table in use now. */
static const struct moe_quant_kernels *kernels(void) {
    pthread_once(&g_once, init_once);
    return &g_kernels[__atomic_load_n(&g_isa, __ATOMIC_ACQUIRE)];
}

const struct moe_quant_kernels *moe_quant_kernels_now(void) { return kernels(); }

int moe_quant_isa_supported(enum moe_quant_isa isa) {
    pthread_once(&g_once, init_once);
    if ((int)isa < 0 || (int)isa > MOE_QUANT_ISA_AVX512) return 0;
    return g_supported[isa];
}

enum moe_status moe_quant_set_isa(enum moe_quant_isa isa) {
    pthread_once(&g_once, init_once);
    if (isa == MOE_QUANT_ISA_AUTO) {
        isa = g_supported[MOE_QUANT_ISA_AVX512] ? MOE_QUANT_ISA_AVX512
              : g_supported[MOE_QUANT_ISA_AVX2] ? MOE_QUANT_ISA_AVX2
                                                : MOE_QUANT_ISA_SCALAR;
    }
    if (!moe_quant_isa_supported(isa)) {
        MOE_LOGE("ISA %s is not supported by this CPU or build", moe_quant_isa_str(isa));
        return MOE_ERR_UNSUPPORTED;
    }
    __atomic_store_n(&g_isa, (int)isa, __ATOMIC_RELEASE);
    return MOE_OK;
}

enum moe_quant_isa moe_quant_get_isa(void) {
    pthread_once(&g_once, init_once);
    return (enum moe_quant_isa)__atomic_load_n(&g_isa, __ATOMIC_ACQUIRE);
}

const char *moe_quant_isa_str(enum moe_quant_isa isa) {
    switch (isa) {
    case MOE_QUANT_ISA_SCALAR: return "scalar";
    case MOE_QUANT_ISA_AVX2: return "avx2";
    case MOE_QUANT_ISA_AVX512: return "avx512";
    case MOE_QUANT_ISA_AUTO: return "auto";
    }
    return "?";
}

const char *moe_quant_isa_name(void) { return moe_quant_isa_str(moe_quant_get_isa()); }

/* ==== public row functions ============================================== */

enum moe_status moe_quantize_row(enum moe_qtype t, const float *src, void *dst, int64_t n) {
    int64_t nb;
    enum moe_status st = check_row(__func__, t, src, dst, n, &nb);
    if (st != MOE_OK) return st;
    const moe_quant_act_fn fast = kernels()->quant_row[t]; /* SIMD, the same bytes (test-quant-rows) */
    if (fast) {
        fast(src, dst, nb);
        return MOE_OK;
    }
    if (nb > 0) g_traits[t].quantize(src, dst, nb);
    return MOE_OK;
}

enum moe_status moe_dequantize_row(enum moe_qtype t, const void *src, float *dst, int64_t n) {
    int64_t nb;
    enum moe_status st = check_row(__func__, t, src, dst, n, &nb);
    if (st != MOE_OK) return st;
    if (nb > 0) kernels()->dequant[t](src, dst, nb);
    return MOE_OK;
}

float moe_vec_dot(enum moe_qtype t, const void *w, const float *x, int64_t n) {
    int64_t nb;
    if (check_row(__func__, t, w, x, n, &nb) != MOE_OK) return NAN;
    if (nb == 0) return 0.0f;
    return kernels()->dot[t](w, x, nb);
}

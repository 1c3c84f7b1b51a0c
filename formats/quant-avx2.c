/*
 * quant-avx2.c - AVX2 + FMA + F16C kernels: dot products and dequantization.
 *
 * Compiled with per-function target attributes (no -march flag needed); only
 * called after quant.c has checked __builtin_cpu_supports for avx2, fma and f16c.
 *
 * Every kernel dequantizes a block in registers to exactly the floats of the
 * scalar reference (same multiplies and subtractions, never fused), then either
 * stores them (dequantize: bit-identical to scalar) or accumulates w*x with FMA
 * into four 8-lane accumulators (dot: each lane adds at most ceil(n/32) products,
 * followed by 5 levels of reduction; see the tolerance in moe-quant.h).
 */
#define MOE_QUANT_INTERNAL 1
#include "moe-dtype.h"
#include "moe-quant.h"

/* Never fuse a*b+c: the results must match the reference rounding step by step
 * (the build passes -ffp-contract=off; GCC in ISO C mode does not contract
 * anyway, and clang honours the standard pragma). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT

/* f16 field at p to float (exact; hardware conversion). */
INL float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 8 bytes at p, zero- or sign-extended to 8 int32 lanes. */
INL __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
INL __m256i i8x8(const uint8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* Logical right shift of each lane by a run-time count. */
INL __m256i srl(__m256i v, int n) { return _mm256_srl_epi32(v, _mm_cvtsi32_si128(n)); }

/* Hand 8 dequantized weights on: store them at y, or accumulate w*x into *acc.
 * `store` is a constant after inlining, so the branch disappears. */
INL void emit(int store, __m256 w, const float *x, float *y, __m256 *acc) {
    if (store)
        _mm256_storeu_ps(y, w);
    else
        *acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x), *acc);
}

/* w = dl*q - ml on 8 lanes, as two separately rounded operations. */
INL __m256 affine(__m256i q, float dl, float ml) {
    return _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(dl), _mm256_cvtepi32_ps(q)), _mm256_set1_ps(ml));
}
INL __m256 scaled(__m256i q, float dl) { return _mm256_mul_ps(_mm256_set1_ps(dl), _mm256_cvtepi32_ps(q)); }

/* Block functions get valid x, y and acc in both modes (the unused ones are
 * dummies), so that all pointer arithmetic is defined. */
#define XO(k) (x + (k))
#define YO(k) (y + (k))
#define ACC(k) (&acc[(k) & 3])

/* Sum of the four accumulators' 32 lanes. */
INL float hsum(const __m256 *acc) {
    __m256 s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    return _mm_cvtss_f32(t);
}

/* ---- one block of each type (x/y/acc: see emit) ------------------------- */

INL void blk_q4_0(const uint8_t *b, const float *x, float *y, __m256 *acc, int store) {
    const float d = h2f(b);
    const __m128i v = _mm_loadu_si128((const __m128i *)(b + 2));
    const __m128i m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    const __m256i eight = _mm256_set1_epi32(8);
    emit(store, scaled(_mm256_sub_epi32(_mm256_cvtepu8_epi32(lo), eight), d), XO(0), YO(0), ACC(0));
    emit(store, scaled(_mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), eight), d), XO(8), YO(8), ACC(1));
    emit(store, scaled(_mm256_sub_epi32(_mm256_cvtepu8_epi32(hi), eight), d), XO(16), YO(16), ACC(2));
    emit(store, scaled(_mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), eight), d), XO(24), YO(24), ACC(3));
}

INL void blk_q8_0(const uint8_t *b, const float *x, float *y, __m256 *acc, int store) {
    const float d = h2f(b);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) emit(store, scaled(i8x8(b + 2 + 8 * k), d), XO(8 * k), YO(8 * k), ACC(k));
}

INL void blk_q2_K(const uint8_t *b, const float *x, float *y, __m256 *acc, int store) {
    const float d = h2f(b + offsetof(moe_block_q2_K, d));
    const float dmin = h2f(b + offsetof(moe_block_q2_K, dmin));
    const uint8_t *sc = b + offsetof(moe_block_q2_K, scales);
    const uint8_t *qs = b + offsetof(moe_block_q2_K, qs);
    const __m256i three = _mm256_set1_epi32(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
#pragma GCC unroll 2
        for (int part = 0; part < 2; part++) {
            const __m256i u0 = u8x8(qs + 32 * h + 16 * part);
            const __m256i u1 = u8x8(qs + 32 * h + 16 * part + 8);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const int s = 8 * h + 2 * j + part, o = 128 * h + 32 * j + 16 * part;
                const float dl = d * (float)(sc[s] & 15), ml = dmin * (float)(sc[s] >> 4);
                emit(store, affine(_mm256_and_si256(srl(u0, 2 * j), three), dl, ml), XO(o), YO(o), ACC(2 * j));
                emit(store, affine(_mm256_and_si256(srl(u1, 2 * j), three), dl, ml), XO(o + 8), YO(o + 8), ACC(2 * j + 1));
            }
        }
    }
}

INL void blk_q3_K(const uint8_t *b, const float *x, float *y, __m256 *acc, int store) {
    const float d = h2f(b + offsetof(moe_block_q3_K, d));
    const uint8_t *hm = b + offsetof(moe_block_q3_K, hmask);
    const uint8_t *qs = b + offsetof(moe_block_q3_K, qs);
    const uint8_t *sc = b + offsetof(moe_block_q3_K, scales);
    const __m256i three = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1), four = _mm256_set1_epi32(4);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
#pragma GCC unroll 4
        for (int part8 = 0; part8 < 4; part8++) { /* l = 8*part8 .. +7 */
            const __m256i u = u8x8(qs + 32 * h + 8 * part8);
            const __m256i hb = u8x8(hm + 8 * part8);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const int o = 128 * h + 32 * j + 8 * part8;
                const float dl = d * (float)moe_q3k_scale(o / 16, sc);
                const __m256i lo = _mm256_and_si256(srl(u, 2 * j), three);
                const __m256i hi = _mm256_and_si256(srl(hb, 4 * h + j), one);
                const __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 2)), four);
                emit(store, scaled(q, dl), XO(o), YO(o), ACC(j));
            }
        }
    }
}

/* q4_k (qh == NULL) and q5_k. */
INL void blk_k_asym(const uint8_t *b, const uint8_t *qs, const uint8_t *qh, const float *x, float *y,
                    __m256 *acc, int store) {
    const float d = h2f(b), dmin = h2f(b + 2);
    const __m128i m = _mm_set1_epi8(15);
    const __m256i one = _mm256_set1_epi32(1);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        uint8_t sc0, m0, sc1, m1;
        moe_q4k_scale_min(2 * c, b + 4, &sc0, &m0);
        moe_q4k_scale_min(2 * c + 1, b + 4, &sc1, &m1);
        const float dl0 = d * (float)sc0, ml0 = dmin * (float)m0;
        const float dl1 = d * (float)sc1, ml1 = dmin * (float)m1;
#pragma GCC unroll 2
        for (int part = 0; part < 2; part++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(qs + 32 * c + 16 * part));
            const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
#pragma GCC unroll 2
            for (int k = 0; k < 2; k++) {
                __m256i ql = _mm256_cvtepu8_epi32(k ? _mm_srli_si128(lo, 8) : lo);
                __m256i qh8 = _mm256_cvtepu8_epi32(k ? _mm_srli_si128(hi, 8) : hi);
                if (qh) {
                    const __m256i hb = u8x8(qh + 16 * part + 8 * k);
                    ql = _mm256_or_si256(ql, _mm256_slli_epi32(_mm256_and_si256(srl(hb, 2 * c), one), 4));
                    qh8 = _mm256_or_si256(qh8, _mm256_slli_epi32(_mm256_and_si256(srl(hb, 2 * c + 1), one), 4));
                }
                const int o = 64 * c + 16 * part + 8 * k;
                emit(store, affine(ql, dl0, ml0), XO(o), YO(o), ACC(2 * part + k));
                emit(store, affine(qh8, dl1, ml1), XO(o + 32), YO(o + 32), ACC(2 * part + k + 2));
            }
        }
    }
}

INL void blk_q4_K(const uint8_t *b, const float *x, float *y, __m256 *acc, int store) {
    blk_k_asym(b, b + offsetof(moe_block_q4_K, qs), NULL, x, y, acc, store);
}
INL void blk_q5_K(const uint8_t *b, const float *x, float *y, __m256 *acc, int store) {
    blk_k_asym(b, b + offsetof(moe_block_q5_K, qs), b + offsetof(moe_block_q5_K, qh), x, y, acc, store);
}

INL void blk_q6_K(const uint8_t *b, const float *x, float *y, __m256 *acc, int store) {
    const float d = h2f(b + offsetof(moe_block_q6_K, d));
    const int8_t *sc = (const int8_t *)(b + offsetof(moe_block_q6_K, scales));
    const __m256i mask4 = _mm256_set1_epi32(15), three = _mm256_set1_epi32(3);
    const __m256i k32 = _mm256_set1_epi32(32);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + offsetof(moe_block_q6_K, ql) + 64 * h;
        const uint8_t *qh = b + offsetof(moe_block_q6_K, qh) + 32 * h;
#pragma GCC unroll 2
        for (int gl = 0; gl < 2; gl++) {
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) { /* l = 8p .. 8p+7 */
                const __m256i u = u8x8(ql + 32 * gl + 8 * p);
                const __m256i hq = u8x8(qh + 8 * p);
#pragma GCC unroll 2
                for (int g = gl; g < 4; g += 2) {
                    const __m256i lo = g < 2 ? _mm256_and_si256(u, mask4) : srl(u, 4);
                    const __m256i hi = _mm256_and_si256(srl(hq, 2 * g), three);
                    const __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), k32);
                    const int o = 128 * h + 32 * g + 8 * p;
                    emit(store, scaled(q, d * (float)sc[o / 16]), XO(o), YO(o), ACC(p));
                }
            }
        }
    }
}

INL void blk_q8_K(const uint8_t *b, const float *x, float *y, __m256 *acc, int store) {
    float d;
    memcpy(&d, b, 4);
    const uint8_t *qs = b + offsetof(moe_block_q8_K, qs);
#pragma GCC unroll 32
    for (int k = 0; k < 32; k++) emit(store, scaled(i8x8(qs + 8 * k), d), XO(8 * k), YO(8 * k), ACC(k));
}

/* ---- row kernels for the block types ------------------------------------ */

/* dot: y is a dummy (never written); dequantize: x and acc are dummies. */
#define BLOCK_KERNELS(T, BYTES, BS)                                                     \
    static TGT float dot_##T(const void *w, const float *x, int64_t nb) {              \
        const uint8_t *b = w;                                                           \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), \
                         _mm256_setzero_ps()};                                          \
        for (int64_t i = 0; i < nb; i++) {                                              \
            const float *xi = x + (BS) * i;                                             \
            blk_##T(b + (BYTES) * i, xi, (float *)xi, acc, 0);                          \
        }                                                                               \
        return hsum(acc);                                                               \
    }                                                                                   \
    static TGT void deq_##T(const void *w, float *y, int64_t nb) {                     \
        const uint8_t *b = w;                                                           \
        __m256 dummy[4];                                                                \
        for (int64_t i = 0; i < nb; i++) {                                              \
            float *yi = y + (BS) * i;                                                   \
            blk_##T(b + (BYTES) * i, yi, yi, dummy, 1);                                 \
        }                                                                               \
    }

BLOCK_KERNELS(q4_0, sizeof(moe_block_q4_0), MOE_QK4_0)
BLOCK_KERNELS(q8_0, sizeof(moe_block_q8_0), MOE_QK8_0)
BLOCK_KERNELS(q2_K, sizeof(moe_block_q2_K), MOE_QK_K)
BLOCK_KERNELS(q3_K, sizeof(moe_block_q3_K), MOE_QK_K)
BLOCK_KERNELS(q4_K, sizeof(moe_block_q4_K), MOE_QK_K)
BLOCK_KERNELS(q5_K, sizeof(moe_block_q5_K), MOE_QK_K)
BLOCK_KERNELS(q6_K, sizeof(moe_block_q6_K), MOE_QK_K)
BLOCK_KERNELS(q8_K, sizeof(moe_block_q8_K), MOE_QK_K)

/* ---- f32 / f16 / bf16 rows (any n) -------------------------------------- */

/* 8 weights from element i of a row of type t (0 = f32, 1 = f16, 2 = bf16). */
INL __m256 load8(int t, const uint8_t *p) {
    if (t == 0) return _mm256_loadu_ps((const float *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (t == 1) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Dot of a plain row: 32 elements per step into four accumulators, then up to
 * three single vectors (into acc 0..2) and a zero-padded tail (into acc 3), so no
 * lane adds more than ceil(n/32) products. */
INL float dot_plain(int t, const uint8_t *p, const float *x, int64_t n) {
    const int es = t == 0 ? 4 : 2;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(load8(t, p + es * (i + 8 * k)), _mm256_loadu_ps(x + i + 8 * k), acc[k]);
    }
    /* written out so that acc[] is only ever indexed by constants (kept in registers) */
    if (i + 8 <= n) {
        acc[0] = _mm256_fmadd_ps(load8(t, p + es * i), _mm256_loadu_ps(x + i), acc[0]);
        i += 8;
        if (i + 8 <= n) {
            acc[1] = _mm256_fmadd_ps(load8(t, p + es * i), _mm256_loadu_ps(x + i), acc[1]);
            i += 8;
            if (i + 8 <= n) {
                acc[2] = _mm256_fmadd_ps(load8(t, p + es * i), _mm256_loadu_ps(x + i), acc[2]);
                i += 8;
            }
        }
    }
    if (i < n) {
        uint8_t wt[32] = {0};
        float xt[8] = {0};
        memcpy(wt, p + es * i, (size_t)(n - i) * es);
        memcpy(xt, x + i, (size_t)(n - i) * 4);
        acc[3] = _mm256_fmadd_ps(load8(t, wt), _mm256_loadu_ps(xt), acc[3]);
    }
    return hsum(acc);
}

INL void deq_plain(int t, const uint8_t *p, float *y, int64_t n) {
    const int es = t == 0 ? 4 : 2;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load8(t, p + es * i));
    if (i < n) {
        uint8_t wt[32] = {0};
        float yt[8];
        memcpy(wt, p + es * i, (size_t)(n - i) * es);
        _mm256_storeu_ps(yt, load8(t, wt));
        memcpy(y + i, yt, (size_t)(n - i) * 4);
    }
}

static TGT float dot_f32(const void *w, const float *x, int64_t n) { return dot_plain(0, w, x, n); }
static TGT float dot_f16(const void *w, const float *x, int64_t n) { return dot_plain(1, w, x, n); }
static TGT float dot_bf16(const void *w, const float *x, int64_t n) { return dot_plain(2, w, x, n); }
static TGT void deq_f16(const void *w, float *y, int64_t n) { deq_plain(1, w, y, n); }
static TGT void deq_bf16(const void *w, float *y, int64_t n) { deq_plain(2, w, y, n); }

/* ---- weight quantizers (bytes identical to quant.c's reference) --------- */

INL __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)), v); }

/* roundf (half away from zero), exactly: t = trunc(v), plus sign(v) where
 * |v - t| >= 0.5 (v - t is exact). NaN and infinity pass through, so that the
 * truncating conversion gives INT32_MIN for them, as the reference's does. */
INL __m256 round_half_away(__m256 v) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 up = _mm256_cmp_ps(abs8(_mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

/* The low byte of each int32 lane of a, b, c, d, in order (32 bytes). */
INL __m256i low_bytes32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i m = _mm256_set1_epi32(0xff);
    const __m256i ab = _mm256_packus_epi32(_mm256_and_si256(a, m), _mm256_and_si256(b, m));
    const __m256i cd = _mm256_packus_epi32(_mm256_and_si256(c, m), _mm256_and_si256(d, m));
    return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The reference's running maximum of |x|, amax = amax > a ? amax : a, which a
 * NaN resets: only for blocks with a NaN (rare), so it is done as written. */
static float q8_0_amax_nan(const float *x) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float a = __builtin_fabsf(x[j]);
        amax = amax > a ? amax : a;
    }
    return amax;
}

/* q8_0 as quantize_q8_0 in quant.c: d = amax/127 as f16 (a NaN d as 0x7e00,
 * as moe_f32_to_f16 stores it), q = low byte of trunc-convert(roundf(x * (1/d))). */
static TGT void quant_q8_0(const float *x, void *y, int64_t nb) {
    uint8_t *o = y;
    for (int64_t i = 0; i < nb; i++, x += 32, o += sizeof(moe_block_q8_0)) {
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
        const __m256 un = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(v[0], v[0], _CMP_UNORD_Q), _mm256_cmp_ps(v[1], v[1], _CMP_UNORD_Q)),
                                       _mm256_or_ps(_mm256_cmp_ps(v[2], v[2], _CMP_UNORD_Q), _mm256_cmp_ps(v[3], v[3], _CMP_UNORD_Q)));
        float amax;
        if (_mm256_movemask_ps(un)) {
            amax = q8_0_amax_nan(x);
        } else {
            const __m256 m = _mm256_max_ps(_mm256_max_ps(abs8(v[0]), abs8(v[1])), _mm256_max_ps(abs8(v[2]), abs8(v[3])));
            __m128 t = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            t = _mm_max_ps(t, _mm_movehl_ps(t, t));
            t = _mm_max_ss(t, _mm_shuffle_ps(t, t, 1));
            amax = _mm_cvtss_f32(t);
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t h = d != d ? (uint16_t)0x7e00u : (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(o, &h, 2);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++) q[k] = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[k], vid)));
        _mm256_storeu_si256((__m256i *)(o + 2), low_bytes32(q[0], q[1], q[2], q[3]));
    }
}

/* q4_k and q5_k: quant-kasym-simd.h with 8 lanes (one block of 256 at a time);
 * a mask is a vector of all-ones or all-zeros lanes. */
#define KQ_NL 8
#define KQ_TGT TGT
typedef __m256 kq_vf;
typedef __m256i kq_vi;
typedef __m256 kq_vm;
INL kq_vf kq_load(const float *p) { return _mm256_loadu_ps(p); }
INL kq_vf kq_set1(float f) { return _mm256_set1_ps(f); }
INL kq_vf kq_add(kq_vf a, kq_vf b) { return _mm256_add_ps(a, b); }
INL kq_vf kq_sub(kq_vf a, kq_vf b) { return _mm256_sub_ps(a, b); }
INL kq_vf kq_mul(kq_vf a, kq_vf b) { return _mm256_mul_ps(a, b); }
INL kq_vf kq_div(kq_vf a, kq_vf b) { return _mm256_div_ps(a, b); }
INL kq_vf kq_sqrt(kq_vf a) { return _mm256_sqrt_ps(a); }
INL kq_vf kq_abs(kq_vf a) { return abs8(a); }
INL kq_vf kq_neg(kq_vf a) { return _mm256_xor_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u))); }
INL kq_vf kq_min_lt(kq_vf a, kq_vf b) { return _mm256_min_ps(a, b); } /* vminps: a < b ? a : b */
INL kq_vf kq_max_gt(kq_vf a, kq_vf b) { return _mm256_max_ps(a, b); } /* vmaxps: a > b ? a : b */
INL kq_vm kq_gt(kq_vf a, kq_vf b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
INL kq_vm kq_lt(kq_vf a, kq_vf b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
INL kq_vm kq_eq(kq_vf a, kq_vf b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
INL kq_vm kq_and(kq_vm a, kq_vm b) { return _mm256_and_ps(a, b); }
INL int kq_any(kq_vm m) { return _mm256_movemask_ps(m) != 0; }
INL kq_vf kq_sel(kq_vm m, kq_vf a, kq_vf b) { return _mm256_blendv_ps(b, a, m); }
INL kq_vi kq_seli(kq_vm m, kq_vi a, kq_vi b) {
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(b), _mm256_castsi256_ps(a), m));
}
INL kq_vi kq_izero(void) { return _mm256_setzero_si256(); }
INL kq_vi kq_round(kq_vf v) {
    const __m256i t = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.0f)));
    return _mm256_sub_epi32(_mm256_and_si256(t, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x00400000));
}
INL kq_vi kq_clamp(kq_vi l, int nmax) {
    return _mm256_min_epi32(_mm256_max_epi32(l, _mm256_setzero_si256()), _mm256_set1_epi32(nmax));
}
INL kq_vf kq_cvt(kq_vi l) { return _mm256_cvtepi32_ps(l); }
INL void kq_store(float *p, kq_vf v) { _mm256_storeu_ps(p, v); }
INL void kq_storei(int32_t *p, kq_vi v) { _mm256_storeu_si256((__m256i *)p, v); }
INL int kq_has_nan(const float *x) {
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < MOE_QK_K; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        m = _mm256_or_ps(m, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    return _mm256_movemask_ps(m) != 0;
}
#include "quant-kasym-simd.h"

#define SET(T, N)                                                              \
    do {                                                                       \
        k->dot[MOE_QTYPE_##T] = dot_##N;                                       \
        k->dequant[MOE_QTYPE_##T] = deq_##N;                                   \
    } while (0)

void moe_quant_kernels_avx2(struct moe_quant_kernels *k) {
    k->dot[MOE_QTYPE_F32] = dot_f32; /* f32 dequantize stays a memcpy */
    SET(F16, f16);
    SET(BF16, bf16);
    SET(Q4_0, q4_0);
    SET(Q8_0, q8_0);
    SET(Q2_K, q2_K);
    SET(Q3_K, q3_K);
    SET(Q4_K, q4_K);
    SET(Q5_K, q5_K);
    SET(Q6_K, q6_K);
    SET(Q8_K, q8_K);
    k->quant_row[MOE_QTYPE_Q8_0] = quant_q8_0;
    k->quant_row[MOE_QTYPE_Q4_K] = quant_q4_K;
    k->quant_row[MOE_QTYPE_Q5_K] = quant_q5_K;
}

#else /* not x86: no AVX2 kernels; quant.c never reports the ISA as supported */
void moe_quant_kernels_avx2(struct moe_quant_kernels *k) { (void)k; }
#endif

/*
 * quant-avx512.c - AVX-512 (F, BW, VL) kernels: dot products and dequantization.
 *
 * Same structure and guarantees as quant-avx2.c with 16-lane vectors: blocks are
 * dequantized in registers to exactly the scalar reference's floats (for q2_k,
 * q3_k, q4_0, q4_k and q5_k by table lookup, see table()); dot
 * products accumulate with FMA into four 16-lane accumulators (each lane adds at
 * most ceil(n/64) products, then 6 levels of reduction). BW and VL are needed for
 * the masked 16-bit loads of f16/bf16 row tails. Compiled with per-function target
 * attributes; only called after quant.c has checked __builtin_cpu_supports.
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

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT

/* f16 field at p to float (exact; hardware conversion). */
INL float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

INL __m128i ld16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
/* 16 bytes at p, zero-extended to 16 int32 lanes. */
INL __m512i u8x16(const uint8_t *p) { return _mm512_cvtepu8_epi32(ld16(p)); }

/* Logical shifts of each lane by a run-time count; shl_to moves bit `from` of
 * each lane to bit `to` (other bits move along and are ignored by the callers). */
INL __m512i srl(__m512i v, int n) { return _mm512_srl_epi32(v, _mm_cvtsi32_si128(n)); }
INL __m512i sll(__m512i v, int n) { return _mm512_sll_epi32(v, _mm_cvtsi32_si128(n)); }
INL __m512i shl_to(__m512i v, int from, int to) { return from >= to ? srl(v, from - to) : sll(v, to - from); }

/* Bitwise select: bits of a where mask c is 1, bits of b elsewhere. */
INL __m512i bitsel(__m512i a, __m512i b, __m512i c) { return _mm512_ternarylogic_epi32(a, b, c, 0xE4); }

/*
 * Table lookup instead of convert-multiply-subtract: for a (sub-)block with
 * scale dl and offset ml, the 16 or 32 possible weights fl(fl(dl*q) - ml) are
 * computed once, exactly as the reference computes each weight, and then every
 * weight is one vpermps (vpermt2ps for 32 entries) with its quant as the index.
 * vpermps reads only the low 4 bits of an index (vpermt2ps: 5), so neighbouring
 * bits need no masking when the table repeats with that period.
 */
INL __m512 iota(int k) { /* lane i = value table k holds at index i */
    static const float t[5][16] = {
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
        {16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31},
        {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7},  /* q4_0: q - 8 */
        {-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3},  /* q3_k: (i & 7) - 4 */
        {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3},          /* q2_k: i & 3 */
    };
    return _mm512_loadu_ps(t[k]);
}
/* Tables: t[i] = fl(fl(dl * q[i]) - ml), or fl(dl * q[i]) without offset. */
INL __m512 vtable(__m512 dl, __m512 ml, __m512 q) { return _mm512_sub_ps(_mm512_mul_ps(dl, q), ml); }
INL __m512 table0(float dl, __m512 q) { return _mm512_mul_ps(_mm512_set1_ps(dl), q); }

/* Lane k of v in all lanes (k is a constant after unrolling). */
INL __m512 lane(__m512 v, int k) { return _mm512_permutexvar_ps(_mm512_set1_epi32(k), v); }

/* Hand 16 dequantized weights on: store them at y, or accumulate w*x into *acc.
 * `store` is a constant after inlining, so the branch disappears. */
INL void emit(int store, __m512 w, const float *x, float *y, __m512 *acc) {
    if (store)
        _mm512_storeu_ps(y, w);
    else
        *acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x), *acc);
}

/* w = dl*q on 16 lanes. */
INL __m512 scaled(__m512i q, float dl) { return _mm512_mul_ps(_mm512_set1_ps(dl), _mm512_cvtepi32_ps(q)); }

/* Block functions get valid x, y and acc in both modes (the unused ones are
 * dummies), so that all pointer arithmetic is defined. */
#define XO(k) (x + (k))
#define YO(k) (y + (k))
#define ACC(k) (&acc[(k) & 3])

/* Sum of the four accumulators' 64 lanes. */
INL float hsum(const __m512 *acc) {
    const __m512 s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    return _mm512_reduce_add_ps(s);
}

/* ---- one block of each type (x/y/acc: see emit) ------------------------- */

/* Blocks of 32 use acc[0] and acc[1]; the row loop passes acc or acc + 2. */
INL void blk_q4_0(const uint8_t *b, const float *x, float *y, __m512 *acc, int store) {
    const __m512 t = table0(h2f(b), iota(2));
    const __m512i u = u8x16(b + 2); /* low nibble: weight j, high nibble: weight j + 16 */
    emit(store, _mm512_permutexvar_ps(u, t), XO(0), YO(0), ACC(0));
    emit(store, _mm512_permutexvar_ps(_mm512_srli_epi32(u, 4), t), XO(16), YO(16), ACC(1));
}

INL void blk_q8_0(const uint8_t *b, const float *x, float *y, __m512 *acc, int store) {
    const float d = h2f(b);
    emit(store, scaled(_mm512_cvtepi8_epi32(ld16(b + 2)), d), XO(0), YO(0), ACC(0));
    emit(store, scaled(_mm512_cvtepi8_epi32(ld16(b + 18)), d), XO(16), YO(16), ACC(1));
}

INL void blk_q2_K(const uint8_t *b, const float *x, float *y, __m512 *acc, int store) {
    const float d = h2f(b + offsetof(moe_block_q2_K, d));
    const float dmin = h2f(b + offsetof(moe_block_q2_K, dmin));
    const uint8_t *sc = b + offsetof(moe_block_q2_K, scales);
    const uint8_t *qs = b + offsetof(moe_block_q2_K, qs);
    const __m512 q4 = iota(4);
    /* lane s: d*(sc[s] & 15) and dmin*(sc[s] >> 4), as the reference computes them */
    const __m512i sv = u8x16(sc);
    const __m512 dlv = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_and_si512(sv, _mm512_set1_epi32(15))));
    const __m512 mlv = _mm512_mul_ps(_mm512_set1_ps(dmin), _mm512_cvtepi32_ps(_mm512_srli_epi32(sv, 4)));
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
#pragma GCC unroll 2
        for (int part = 0; part < 2; part++) {
            const __m512i u = u8x16(qs + 32 * h + 16 * part);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const int s = 8 * h + 2 * j + part, o = 16 * s;
                const __m512 t = vtable(lane(dlv, s), lane(mlv, s), q4);
                emit(store, _mm512_permutexvar_ps(srl(u, 2 * j), t), XO(o), YO(o), ACC(j));
            }
        }
    }
}

INL void blk_q3_K(const uint8_t *b, const float *x, float *y, __m512 *acc, int store) {
    const float d = h2f(b + offsetof(moe_block_q3_K, d));
    const uint8_t *hm = b + offsetof(moe_block_q3_K, hmask);
    const uint8_t *qs = b + offsetof(moe_block_q3_K, qs);
    const uint8_t *sc = b + offsetof(moe_block_q3_K, scales);
    const __m512 q3 = iota(3);
    const __m512i low2 = _mm512_set1_epi32(3);
    /* lane s: d * scale_s (moe_q3k_scale): low nibble from byte s % 8 (>> 4 for
     * s >= 8), high 2 bits from byte 8 + s % 4 at bit 2*(s/4) */
    uint64_t lo8;
    uint32_t hi4;
    memcpy(&lo8, sc, 8);
    memcpy(&hi4, sc + 8, 4);
    const __m512i lob = _mm512_cvtepu8_epi32(_mm_set_epi64x((long long)((lo8 >> 4) & 0x0f0f0f0f0f0f0f0full),
                                                            (long long)(lo8 & 0x0f0f0f0f0f0f0f0full)));
    const __m512i hsh = _mm512_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30);
    const __m512i hib = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)hi4), hsh), low2);
    const __m512i s6 = _mm512_sub_epi32(_mm512_or_si512(lob, _mm512_slli_epi32(hib, 4)), _mm512_set1_epi32(32));
    const __m512 dlv = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(s6));
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
#pragma GCC unroll 2
        for (int part = 0; part < 2; part++) {
            const __m512i u = u8x16(qs + 32 * h + 16 * part);
            const __m512i hb = u8x16(hm + 16 * part);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const int s = 8 * h + 2 * j + part, o = 16 * s;
                const __m512 t = _mm512_mul_ps(lane(dlv, s), q3);
                /* index bits 0-1: the low 2 bits; bit 2: the high bit (hmask bit 4h + j) */
                const __m512i idx = bitsel(srl(u, 2 * j), shl_to(hb, 4 * h + j, 2), low2);
                emit(store, _mm512_permutexvar_ps(idx, t), XO(o), YO(o), ACC(j));
            }
        }
    }
}

/* q4_k (qh == NULL) and q5_k. */
INL void blk_k_asym(const uint8_t *b, const uint8_t *qs, const uint8_t *qh, const float *x, float *y,
                    __m512 *acc, int store) {
    const float d = h2f(b), dmin = h2f(b + 2);
    const __m512 lo16 = iota(0), hi16 = iota(1);
    const __m512i low4 = _mm512_set1_epi32(15);
    /* the 8 scales and 8 mins (moe_q4k_scale_min) with 32-bit word operations:
     * lanes 0-7 = d*sc[j], lanes 8-15 = dmin*m[j] */
    uint32_t w[3];
    memcpy(w, b + 4, 12);
    const uint32_t sc03 = w[0] & 0x3f3f3f3fu, m03 = w[1] & 0x3f3f3f3fu;
    const uint32_t sc47 = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
    const uint32_t m47 = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
    const __m512i smv = _mm512_cvtepu8_epi32(_mm_setr_epi32((int)sc03, (int)sc47, (int)m03, (int)m47));
    const __m512 dd = _mm512_mask_blend_ps((__mmask16)0xff00, _mm512_set1_ps(d), _mm512_set1_ps(dmin));
    const __m512 sm = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(smv));
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512 dl0 = lane(sm, 2 * c), ml0 = lane(sm, 8 + 2 * c);
        const __m512 dl1 = lane(sm, 2 * c + 1), ml1 = lane(sm, 9 + 2 * c);
        const __m512 t0 = vtable(dl0, ml0, lo16), t1 = vtable(dl1, ml1, lo16);
        __m512 t0h = t0, t1h = t1;
        if (qh) t0h = vtable(dl0, ml0, hi16), t1h = vtable(dl1, ml1, hi16);
#pragma GCC unroll 2
        for (int part = 0; part < 2; part++) {
            const __m512i u = u8x16(qs + 32 * c + 16 * part);
            const __m512i un = _mm512_srli_epi32(u, 4);
            const int o = 64 * c + 16 * part;
            if (qh) { /* index bit 4 = the high bit: qh bit 2c (low nibble) or 2c+1 (high) */
                const __m512i hb = u8x16(qh + 16 * part);
                const __m512i i0 = bitsel(u, shl_to(hb, 2 * c, 4), low4);
                const __m512i i1 = bitsel(un, shl_to(hb, 2 * c + 1, 4), low4);
                emit(store, _mm512_permutex2var_ps(t0, i0, t0h), XO(o), YO(o), ACC(part));
                emit(store, _mm512_permutex2var_ps(t1, i1, t1h), XO(o + 32), YO(o + 32), ACC(part + 2));
            } else {
                emit(store, _mm512_permutexvar_ps(u, t0), XO(o), YO(o), ACC(part));
                emit(store, _mm512_permutexvar_ps(un, t1), XO(o + 32), YO(o + 32), ACC(part + 2));
            }
        }
    }
}

INL void blk_q4_K(const uint8_t *b, const float *x, float *y, __m512 *acc, int store) {
    blk_k_asym(b, b + offsetof(moe_block_q4_K, qs), NULL, x, y, acc, store);
}
INL void blk_q5_K(const uint8_t *b, const float *x, float *y, __m512 *acc, int store) {
    blk_k_asym(b, b + offsetof(moe_block_q5_K, qs), b + offsetof(moe_block_q5_K, qh), x, y, acc, store);
}

INL void blk_q6_K(const uint8_t *b, const float *x, float *y, __m512 *acc, int store) {
    const float d = h2f(b + offsetof(moe_block_q6_K, d));
    const int8_t *sc = (const int8_t *)(b + offsetof(moe_block_q6_K, scales));
    const __m512i mask4 = _mm512_set1_epi32(15), three = _mm512_set1_epi32(3);
    const __m512i k32 = _mm512_set1_epi32(32);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + offsetof(moe_block_q6_K, ql) + 64 * h;
        const uint8_t *qh = b + offsetof(moe_block_q6_K, qh) + 32 * h;
#pragma GCC unroll 2
        for (int gl = 0; gl < 2; gl++) {
#pragma GCC unroll 2
            for (int part = 0; part < 2; part++) {
                const __m512i u = u8x16(ql + 32 * gl + 16 * part);
                const __m512i hq = u8x16(qh + 16 * part);
#pragma GCC unroll 2
                for (int g = gl; g < 4; g += 2) {
                    const __m512i lo = g < 2 ? _mm512_and_si512(u, mask4) : srl(u, 4);
                    const __m512i hi = _mm512_and_si512(srl(hq, 2 * g), three);
                    const __m512i q = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), k32);
                    const int o = 128 * h + 32 * g + 16 * part;
                    emit(store, scaled(q, d * (float)sc[o / 16]), XO(o), YO(o), ACC(2 * (g >> 1) + part));
                }
            }
        }
    }
}

INL void blk_q8_K(const uint8_t *b, const float *x, float *y, __m512 *acc, int store) {
    float d;
    memcpy(&d, b, 4);
    const uint8_t *qs = b + offsetof(moe_block_q8_K, qs);
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++)
        emit(store, scaled(_mm512_cvtepi8_epi32(ld16(qs + 16 * k)), d), XO(16 * k), YO(16 * k), ACC(k));
}

/* ---- row kernels for the block types ------------------------------------ */

#define ZERO4 {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()}

/* 256-element blocks: 16 vectors per block, spread over the four accumulators.
 * dot: y is a dummy (never written); dequantize: x and acc are dummies. */
#define K_KERNELS(T, BYTES)                                                             \
    static TGT float dot_##T(const void *w, const float *x, int64_t nb) {              \
        const uint8_t *b = w;                                                           \
        __m512 acc[4] = ZERO4;                                                          \
        for (int64_t i = 0; i < nb; i++) {                                              \
            const float *xi = x + MOE_QK_K * i;                                         \
            blk_##T(b + (BYTES) * i, xi, (float *)xi, acc, 0);                          \
        }                                                                               \
        return hsum(acc);                                                               \
    }                                                                                   \
    DEQ_KERNEL(T, BYTES, MOE_QK_K)

#define DEQ_KERNEL(T, BYTES, BS)                                                        \
    static TGT void deq_##T(const void *w, float *y, int64_t nb) {                     \
        const uint8_t *b = w;                                                           \
        __m512 dummy[4];                                                                \
        for (int64_t i = 0; i < nb; i++) {                                              \
            float *yi = y + (BS) * i;                                                   \
            blk_##T(b + (BYTES) * i, yi, yi, dummy, 1);                                 \
        }                                                                               \
    }

/* 32-element blocks: two vectors per block; pairs of blocks use acc 0-1 and 2-3. */
#define B32_KERNELS(T, BYTES)                                                           \
    static TGT float dot_##T(const void *w, const float *x, int64_t nb) {              \
        const uint8_t *b = w;                                                           \
        __m512 acc[4] = ZERO4;                                                          \
        int64_t i = 0;                                                                  \
        for (; i + 2 <= nb; i += 2) {                                                   \
            const float *x0 = x + 32 * i, *x1 = x0 + 32;                                \
            blk_##T(b + (BYTES) * i, x0, (float *)x0, acc, 0);                          \
            blk_##T(b + (BYTES) * (i + 1), x1, (float *)x1, acc + 2, 0);                \
        }                                                                               \
        if (i < nb) blk_##T(b + (BYTES) * i, x + 32 * i, (float *)(x + 32 * i), acc, 0); \
        return hsum(acc);                                                               \
    }                                                                                   \
    DEQ_KERNEL(T, BYTES, 32)

B32_KERNELS(q4_0, sizeof(moe_block_q4_0))
B32_KERNELS(q8_0, sizeof(moe_block_q8_0))
K_KERNELS(q2_K, sizeof(moe_block_q2_K))
K_KERNELS(q3_K, sizeof(moe_block_q3_K))
K_KERNELS(q4_K, sizeof(moe_block_q4_K))
K_KERNELS(q5_K, sizeof(moe_block_q5_K))
K_KERNELS(q6_K, sizeof(moe_block_q6_K))
K_KERNELS(q8_K, sizeof(moe_block_q8_K))

/* ---- f32 / f16 / bf16 rows (any n) -------------------------------------- */

/* The first `cnt` (0..16) weights from p of type t (0 = f32, 1 = f16, 2 = bf16);
 * lanes past cnt are zero and their memory is not touched. */
INL __m512 load16(int t, const uint8_t *p, int cnt) {
    const __mmask16 k = cnt >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cnt) - 1);
    if (t == 0) return _mm512_maskz_loadu_ps(k, p);
    const __m256i h = _mm256_maskz_loadu_epi16(k, p);
    if (t == 1) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INL __m512 loadx(const float *x, int cnt) {
    const __mmask16 k = cnt >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cnt) - 1);
    return _mm512_maskz_loadu_ps(k, x);
}

/* Dot of a plain row: 64 elements per step into four accumulators, then up to
 * three more vectors and a masked tail, each into a different accumulator. */
INL float dot_plain(int t, const uint8_t *p, const float *x, int64_t n) {
    const int es = t == 0 ? 4 : 2;
    __m512 acc[4] = ZERO4;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            acc[k] = _mm512_fmadd_ps(load16(t, p + es * (i + 16 * k), 16), _mm512_loadu_ps(x + i + 16 * k), acc[k]);
    }
    /* n - i < 64 here: at most four (partial) vectors, one per accumulator */
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const int64_t left = n - i;
        if (left <= 0) break;
        const int cnt = left >= 16 ? 16 : (int)left;
        acc[k] = _mm512_fmadd_ps(load16(t, p + es * i, cnt), loadx(x + i, cnt), acc[k]);
        i += cnt;
    }
    return hsum(acc);
}

INL void deq_plain(int t, const uint8_t *p, float *y, int64_t n) {
    const int es = t == 0 ? 4 : 2;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, load16(t, p + es * i, 16));
    if (i < n) {
        const int cnt = (int)(n - i);
        _mm512_mask_storeu_ps(y + i, (__mmask16)((1u << cnt) - 1), load16(t, p + es * i, cnt));
    }
}

static TGT float dot_f32(const void *w, const float *x, int64_t n) { return dot_plain(0, w, x, n); }
static TGT float dot_f16(const void *w, const float *x, int64_t n) { return dot_plain(1, w, x, n); }
static TGT float dot_bf16(const void *w, const float *x, int64_t n) { return dot_plain(2, w, x, n); }
static TGT void deq_f16(const void *w, float *y, int64_t n) { deq_plain(1, w, y, n); }
static TGT void deq_bf16(const void *w, float *y, int64_t n) { deq_plain(2, w, y, n); }

/* ---- weight quantizers (bytes identical to quant.c's reference) --------- */

/* roundf (half away from zero), exactly: t = trunc(v), plus sign(v) where
 * |v - t| >= 0.5 (v - t is exact). NaN and infinity pass through, so that the
 * truncating conversion gives INT32_MIN for them, as the reference's does. */
INL __m512 round_half_away(__m512 v) {
    const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_abs_ps(_mm512_sub_ps(v, t));
    const __mmask16 up = _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 one = _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u)),
        _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    return _mm512_mask_add_ps(t, up, t, one);
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

/* One q8_0 block as quantize_q8_0 in quant.c from two vectors of 16: d =
 * amax/127 as f16 (a NaN d as 0x7e00, as moe_f32_to_f16 stores it), q =
 * low byte of trunc-convert(roundf(x * (1/d))). */
INL void q8_0_block(__m512 x0, __m512 x1, const float *xs, uint8_t *o) {
    const __mmask16 nan = _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q);
    const float amax = nan ? q8_0_amax_nan(xs)
                           : _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = d != d ? (uint16_t)0x7e00u : (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    memcpy(o, &h, 2);
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(x0, vid)));
    const __m512i q1 = _mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(x1, vid)));
    _mm_storeu_si128((__m128i *)(o + 2), _mm512_cvtepi32_epi8(q0)); /* low bytes (vpmovdb truncates) */
    _mm_storeu_si128((__m128i *)(o + 18), _mm512_cvtepi32_epi8(q1));
}

static TGT void quant_q8_0(const float *x, void *y, int64_t nb) {
    uint8_t *o = y;
    for (int64_t i = 0; i < nb; i++, x += 32, o += sizeof(moe_block_q8_0))
        q8_0_block(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16), x, o);
}

/* q4_k and q5_k: quant-kasym-simd.h with 16 lanes (two blocks of 256 at a time). */
#define KQ_NL 16
#define KQ_TGT TGT
typedef __m512 kq_vf;
typedef __m512i kq_vi;
typedef __mmask16 kq_vm;
INL kq_vf kq_load(const float *p) { return _mm512_loadu_ps(p); }
INL kq_vf kq_set1(float f) { return _mm512_set1_ps(f); }
INL kq_vf kq_add(kq_vf a, kq_vf b) { return _mm512_add_ps(a, b); }
INL kq_vf kq_sub(kq_vf a, kq_vf b) { return _mm512_sub_ps(a, b); }
INL kq_vf kq_mul(kq_vf a, kq_vf b) { return _mm512_mul_ps(a, b); }
INL kq_vf kq_div(kq_vf a, kq_vf b) { return _mm512_div_ps(a, b); }
INL kq_vf kq_sqrt(kq_vf a) { return _mm512_sqrt_ps(a); }
INL kq_vf kq_abs(kq_vf a) { return _mm512_abs_ps(a); }
INL kq_vf kq_neg(kq_vf a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32((int)0x80000000u)));
}
INL kq_vf kq_min_lt(kq_vf a, kq_vf b) { return _mm512_min_ps(a, b); } /* vminps: a < b ? a : b */
INL kq_vf kq_max_gt(kq_vf a, kq_vf b) { return _mm512_max_ps(a, b); } /* vmaxps: a > b ? a : b */
INL kq_vm kq_gt(kq_vf a, kq_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
INL kq_vm kq_lt(kq_vf a, kq_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
INL kq_vm kq_eq(kq_vf a, kq_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
INL kq_vm kq_and(kq_vm a, kq_vm b) { return (kq_vm)(a & b); }
INL int kq_any(kq_vm m) { return m != 0; }
INL kq_vf kq_sel(kq_vm m, kq_vf a, kq_vf b) { return _mm512_mask_blend_ps(m, b, a); }
INL kq_vi kq_seli(kq_vm m, kq_vi a, kq_vi b) { return _mm512_mask_blend_epi32(m, b, a); }
INL kq_vi kq_izero(void) { return _mm512_setzero_si512(); }
INL kq_vi kq_round(kq_vf v) {
    const __m512i t = _mm512_castps_si512(_mm512_add_ps(v, _mm512_set1_ps(12582912.0f)));
    return _mm512_sub_epi32(_mm512_and_si512(t, _mm512_set1_epi32(0x007fffff)), _mm512_set1_epi32(0x00400000));
}
INL kq_vi kq_clamp(kq_vi l, int nmax) {
    return _mm512_min_epi32(_mm512_max_epi32(l, _mm512_setzero_si512()), _mm512_set1_epi32(nmax));
}
INL kq_vf kq_cvt(kq_vi l) { return _mm512_cvtepi32_ps(l); }
INL void kq_store(float *p, kq_vf v) { _mm512_storeu_ps(p, v); }
INL void kq_storei(int32_t *p, kq_vi v) { _mm512_storeu_si512(p, v); }
INL int kq_has_nan(const float *x) {
    __mmask16 m = 0;
    for (int i = 0; i < MOE_QK_K; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        m |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    return m != 0;
}
#include "quant-kasym-simd.h"

#define SET(T, N)                                                              \
    do {                                                                       \
        k->dot[MOE_QTYPE_##T] = dot_##N;                                       \
        k->dequant[MOE_QTYPE_##T] = deq_##N;                                   \
    } while (0)

void moe_quant_kernels_avx512(struct moe_quant_kernels *k) {
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

#else /* not x86: no AVX-512 kernels; quant.c never reports the ISA as supported */
void moe_quant_kernels_avx512(struct moe_quant_kernels *k) { (void)k; }
#endif

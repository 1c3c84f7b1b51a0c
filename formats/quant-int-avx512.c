/*
 * quant-int-avx512.c - AVX-512 VNNI integer dot products (vpdpbusd, vpdpwssd)
 * of quantized weight rows with quantized activation rows, and the activation
 * quantizers.
 *
 * The integer sums are exact and equal the scalar reference's (quant-int.c):
 *   - vpdpbusd multiplies unsigned weight bytes by signed activation bytes and
 *     adds groups of 4 into int32 lanes. Signed weights (q8_0, q4_0, q3_k, q6_k)
 *     go in as |q| with the activation negated where q < 0 (ggml's sign trick),
 *     so every lane holds a partial sum of the true products q * x.
 *   - a lane of 4 products is below 2^15 in magnitude (4 * 32 * 127 for q6_k,
 *     4 * 31 * 128 for q5_k), so vpdpwssd can multiply it by its sub-block's
 *     scale as an int16 pair (value, sign) x (scale, 0) and accumulate.
 * The float part: per block (q8_0, q4_0) or super-block (k-quants), the int32
 * lanes are converted and accumulated with FMA by d_w * d_x (and the mins'
 * term by dmin * d_x); see the tolerance in moe-quant.h. Activation quants must
 * be in -127..127 (moe_quantize_act guarantees it) so that negating never
 * overflows.
 *
 * Every tile shape (enum moe_tile) computes each of its outputs with the same
 * operations in the same order as the 1x1 kernel, so results do not depend on
 * the shape. Compiled with per-function target attributes; quant.c installs
 * these kernels only after checking the CPU for AVX-512 F/BW/VL and VNNI.
 */
#define MOE_QUANT_INTERNAL 1
#include "moe-quant.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT

#define QK8 ((int64_t)sizeof(moe_block_q8_K)) /* activation super-block bytes */
#define Q80 ((int64_t)sizeof(moe_block_q8_0)) /* activation block bytes */

/* f16 / f32 fields at any alignment. */
INL float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
INL float f32at(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}
INL __m512i ld64(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
INL __m256i ld32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
INL __m128i ld16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
/* 32 bytes at p in both halves of a zmm. */
INL __m512i bcast32(const uint8_t *p) { return _mm512_broadcast_i64x4(ld32(p)); }

/* Per-16-bit-lane shift counts: a in the low 256 bits, b in the high 256. */
INL __m512i cnt2(int a, int b) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
}
/* Bytes: a in the low 256 bits, b in the high 256. */
INL __m512i byte2(int a, int b) {
    return _mm512_inserti64x4(_mm512_set1_epi8((char)a), _mm256_set1_epi8((char)b), 1);
}

/* Scales: after kprep, sc holds sub-block s's scale as an int16 pair (scale, 0)
 * in int32 lane s. One vpermd per super-block arranges them so that chunk k's
 * scales are dword k of each 128-bit lane, and vpshufd (in-lane, cheap) then
 * broadcasts them. Chunk k of 32-weight sub-blocks (q4_k, q5_k) has sub-block
 * 2k in 128-bit lanes 0-1 and 2k+1 in lanes 2-3; of 16-weight ones (q2_k,
 * q3_k, q6_k), sub-block 4k + L in lane L. */
INL __m512i spread32(__m512i sc) {
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7), sc);
}
INL __m512i spread16(__m512i sc) {
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), sc);
}
INL __m512i chunk_scales(__m512i spread, int k) {
    switch (k) {
    case 0: return _mm512_shuffle_epi32(spread, _MM_PERM_AAAA);
    case 1: return _mm512_shuffle_epi32(spread, _MM_PERM_BBBB);
    case 2: return _mm512_shuffle_epi32(spread, _MM_PERM_CCCC);
    default: return _mm512_shuffle_epi32(spread, _MM_PERM_DDDD);
    }
}

INL float hsum256(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    return _mm_cvtss_f32(t);
}

/* ==== 32-element blocks: q8_0 and q4_0 against q8_0 ===================== */

/* The 32 signed weights of a block. */
INL __m256i wq_q8_0(const uint8_t *b) { return ld32(b + 2); }
INL __m256i wq_q4_0(const uint8_t *b) {
    const __m256i v = _mm256_broadcastsi128_si256(ld16(b + 2)); /* low nibbles: 0-15, high: 16-31 */
    const __m256i sh = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi16(v, sh), _mm256_set1_epi8(15));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
}

/* One block of R rows x C activations: acc[r*C + c] += d_w d_x * isum lanes. */
#define B32_STEP(T, WB)                                                                         \
    INL void T##_step(const int R, const int C, const uint8_t *const *w, const uint8_t *const *x, \
                      int64_t i, __m256 *acc) {                                                 \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                   \
            const uint8_t *b = w[r] + (WB) * i;                                                 \
            const __m256i q = wq_##T(b), aq = _mm256_abs_epi8(q);                               \
            const float dw = h2f(b);                                                            \
            _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {                               \
                const uint8_t *xb = x[c] + Q80 * i;                                             \
                const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aq,               \
                                                      _mm256_sign_epi8(ld32(xb + 2), q));       \
                acc[r * C + c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * h2f(xb)),                  \
                                                 _mm256_cvtepi32_ps(p), acc[r * C + c]);        \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
    /* Even blocks into acc0, odd into acc1 (two chains), summed at the end. */                 \
    INL void T##_tile(const int R, const int C, const uint8_t *const *w, const uint8_t *const *x, \
                      int64_t nb, float *out) {                                                 \
        __m256 acc0[4], acc1[4];                                                                \
        for (int k = 0; k < 4; k++) acc0[k] = acc1[k] = _mm256_setzero_ps();                    \
        int64_t i = 0;                                                                          \
        for (; i + 2 <= nb; i += 2) {                                                           \
            T##_step(R, C, w, x, i, acc0);                                                      \
            T##_step(R, C, w, x, i + 1, acc1);                                                  \
        }                                                                                       \
        if (i < nb) T##_step(R, C, w, x, i, acc0);                                              \
        for (int k = 0; k < R * C; k++) out[k] = hsum256(_mm256_add_ps(acc0[k], acc1[k]));      \
    }

B32_STEP(q8_0, Q80)
B32_STEP(q4_0, (int64_t)sizeof(moe_block_q4_0))

/* ==== k-quants against q8_k ============================================= */

/* A weight super-block prepared for the dots: sc holds, per int32 lane s, the
 * scale of sub-block s as an int16 pair (scale, 0); m16 the mins as 16 int16
 * matching the activation's 16 bsums (min types only). */
struct kq {
    __m512i sc;
    __m256i m16;
    __m512i aux; /* type-specific: q5_k's qh, q3_k's hmask (both halves) */
    float d, dmin;
};

/* q4_k / q5_k: 8 scales and 8 mins of 6 bits in 12 bytes (moe_q4k_scale_min),
 * unpacked with 32-bit word operations. */
INL void kprep_asym(const uint8_t *b, struct kq *p) {
    const __m128i v = ld16(b); /* d, dmin, scales[12] as 32-bit lanes: dd S0 S1 S2 */
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(3, 2, 3, 1)); /* S0 S2 S1 S2 */
    const __m128i c = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 1, 1)); /* S0 S0 S1 S1 */
    /* lanes: sc0-3 = S0 & 63, sc4-7 = (S2 & 15) | (S0 >> 6) << 4, m0-3 = S1 & 63,
     * m4-7 = (S2 >> 4) | (S1 >> 6) << 4 (bytewise) */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(c, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    const __m128i sm = _mm_or_si128(lo, hi); /* sc0..sc7 m0..m7 */
    p->sc = _mm512_cvtepu8_epi32(sm);                               /* lanes 8-15 (mins) unused */
    p->m16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));      /* m0 m0 m1 m1 ... m7 m7 */
    const __m128 dd = _mm_cvtph_ps(v);
    p->d = _mm_cvtss_f32(dd);
    p->dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
}
INL void kprep_q4_K(const uint8_t *b, struct kq *p) { kprep_asym(b, p); }
INL void kprep_q5_K(const uint8_t *b, struct kq *p) {
    kprep_asym(b, p);
    p->aux = bcast32(b + offsetof(moe_block_q5_K, qh));
}
/* Chunk k: weights 64k..64k+63 = low nibbles of qs[32k..] (sub-block 2k), then
 * the high nibbles (2k+1); q5_k adds 16 where qh bit 2k (2k+1) is set. */
INL __m512i kw_q4_K(const uint8_t *b, const struct kq *p, int k, __mmask64 *neg) {
    (void)p, (void)neg;
    const __m512i v = bcast32(b + offsetof(moe_block_q4_K, qs) + 32 * k);
    return _mm512_and_si512(_mm512_mask_srli_epi16(v, (__mmask32)0xffff0000u, v, 4), _mm512_set1_epi8(15));
}
INL __m512i kw_q5_K(const uint8_t *b, const struct kq *p, int k, __mmask64 *neg) {
    (void)neg;
    const __m512i v = bcast32(b + offsetof(moe_block_q5_K, qs) + 32 * k);
    const __m512i q = _mm512_and_si512(_mm512_srlv_epi16(v, cnt2(0, 4)), _mm512_set1_epi8(15));
    const __mmask64 hi = _mm512_test_epi8_mask(p->aux, byte2(1 << (2 * k), 1 << (2 * k + 1)));
    return _mm512_mask_add_epi8(q, hi, q, _mm512_set1_epi8(16));
}

/* q2_k: 16 scale/min bytes (scale low nibble, min high nibble). */
INL void kprep_q2_K(const uint8_t *b, struct kq *p) {
    const __m128i v = ld16(b + offsetof(moe_block_q2_K, scales));
    const __m128i m15 = _mm_set1_epi8(15);
    p->sc = _mm512_cvtepu8_epi32(_mm_and_si128(v, m15));
    p->m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m15));
    p->d = h2f(b + offsetof(moe_block_q2_K, d));
    p->dmin = h2f(b + offsetof(moe_block_q2_K, dmin));
}
/* Chunk k = 2h + jp/2 covers weights 128h + 32jp .. +63: 2-bit fields jp and
 * jp+1 of qs[32h .. 32h+31]. */
INL __m512i kw_q2_K(const uint8_t *b, const struct kq *p, int k, __mmask64 *neg) {
    (void)p, (void)neg;
    const int h = k / 2, jp = 2 * (k % 2);
    const __m512i v = bcast32(b + offsetof(moe_block_q2_K, qs) + 32 * h);
    return _mm512_and_si512(_mm512_srlv_epi16(v, cnt2(2 * jp, 2 * jp + 2)), _mm512_set1_epi8(3));
}

/* q3_k: the 16 signed 6-bit scales (moe_q3k_scale) in int32 lanes. */
INL void kprep_q3_K(const uint8_t *b, struct kq *p) {
    const uint8_t *sc = b + offsetof(moe_block_q3_K, scales);
    uint64_t lo8;
    uint32_t hi4;
    memcpy(&lo8, sc, 8);
    memcpy(&hi4, sc + 8, 4);
    const __m512i lob = _mm512_cvtepu8_epi32(_mm_set_epi64x((long long)((lo8 >> 4) & 0x0f0f0f0f0f0f0f0full),
                                                            (long long)(lo8 & 0x0f0f0f0f0f0f0f0full)));
    const __m512i hsh = _mm512_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30);
    const __m512i hib = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)hi4), hsh), _mm512_set1_epi32(3));
    const __m512i s6 = _mm512_sub_epi32(_mm512_or_si512(lob, _mm512_slli_epi32(hib, 4)), _mm512_set1_epi32(32));
    p->sc = _mm512_and_si512(s6, _mm512_set1_epi32(0xffff));
    p->aux = bcast32(b + offsetof(moe_block_q3_K, hmask));
    p->d = h2f(b + offsetof(moe_block_q3_K, d));
    p->dmin = 0.0f;
}
/* Chunk k as q2_k; q = low - 4 where the hmask bit (4h + j) is clear: then
 * |q| = 4 - low and the activation is negated. */
INL __m512i kw_q3_K(const uint8_t *b, const struct kq *p, int k, __mmask64 *neg) {
    const int h = k / 2, jp = 2 * (k % 2);
    const __m512i v = bcast32(b + offsetof(moe_block_q3_K, qs) + 32 * h);
    const __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(v, cnt2(2 * jp, 2 * jp + 2)), _mm512_set1_epi8(3));
    *neg = _mm512_testn_epi8_mask(p->aux, byte2(1 << (4 * h + jp), 1 << (4 * h + jp + 1)));
    return _mm512_mask_sub_epi8(lo, *neg, _mm512_set1_epi8(4), lo);
}

/* q6_k: int8 scales per 16. */
INL void kprep_q6_K(const uint8_t *b, struct kq *p) {
    const __m512i s = _mm512_cvtepi8_epi32(ld16(b + offsetof(moe_block_q6_K, scales)));
    p->sc = _mm512_and_si512(s, _mm512_set1_epi32(0xffff));
    p->d = h2f(b + offsetof(moe_block_q6_K, d));
    p->dmin = 0.0f;
}
/* Chunk k = 2h + gp/2 covers weights 128h + 32gp .. +63 (groups gp, gp+1): low
 * nibbles of ql[64h .. 64h+63] (gp = 0) or their high nibbles (gp = 2); the 2
 * high bits of group g are bits 2g, 2g+1 of qh[32h + l], moved to bits 4-5. */
INL __m512i kw_q6_K(const uint8_t *b, const struct kq *p, int k, __mmask64 *neg) {
    (void)p;
    const int h = k / 2, gp = 2 * (k % 2);
    __m512i l = ld64(b + offsetof(moe_block_q6_K, ql) + 64 * h);
    if (gp) l = _mm512_srli_epi16(l, 4);
    const __m512i qh = bcast32(b + offsetof(moe_block_q6_K, qh) + 32 * h);
    /* bits 2g, 2g+1 -> 4, 5: left by 4 - 2g (g = 0, 1) or right by 2g - 4 (g = 2, 3) */
    const __m512i hs = gp ? _mm512_srlv_epi16(qh, cnt2(0, 2)) : _mm512_sllv_epi16(qh, cnt2(4, 2));
    const __m512i u = _mm512_ternarylogic_epi32(l, _mm512_and_si512(hs, _mm512_set1_epi8(0x30)),
                                                _mm512_set1_epi8(15), 0xEC); /* (l & 15) | hs */
    const __m512i q = _mm512_sub_epi8(u, _mm512_set1_epi8(32));
    *neg = _mm512_movepi8_mask(q);
    return _mm512_abs_epi8(q);
}

/*
 * One tile of a k-quant: for every super-block and weight row, prepare the
 * scales, then per chunk of 64 weights unpack them once and run vpdpbusd +
 * vpdpwssd against each activation; then scale the super-block's int32 lanes
 * in float. IDX maps lanes to sub-blocks; MIN and SIGNED are constants.
 */
#define K_TILE(T, WB, SPREAD, MIN, SIGNED)                                                       \
    INL void T##_tile(const int R, const int C, const uint8_t *const *w, const uint8_t *const *x, \
                      int64_t nb, float *out) {                                                  \
        __m512 acc[4];                                                                           \
        __m256 accm[4];                                                                          \
        for (int k = 0; k < 4; k++) acc[k] = _mm512_setzero_ps(), accm[k] = _mm256_setzero_ps(); \
        for (int64_t i = 0; i < nb; i++) {                                                       \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                \
                const uint8_t *b = w[r] + (int64_t)(WB) * i;                                     \
                struct kq p;                                                                     \
                kprep_##T(b, &p);                                                                \
                const __m512i sp = SPREAD(p.sc);                                                 \
                __m512i isum[4];                                                                 \
                for (int c = 0; c < 4; c++) isum[c] = _mm512_setzero_si512();                    \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {                            \
                    __mmask64 neg = 0;                                                           \
                    const __m512i wk = kw_##T(b, &p, k, &neg);                                   \
                    const __m512i sk = chunk_scales(sp, k);                                      \
                    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {                        \
                        __m512i xv = ld64(x[c] + QK8 * i + 4 + 64 * k);                          \
                        if (SIGNED) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv); \
                        isum[c] = _mm512_dpwssd_epi32(                                           \
                            isum[c], _mm512_dpbusd_epi32(_mm512_setzero_si512(), wk, xv), sk);   \
                    }                                                                            \
                }                                                                                \
                _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {                            \
                    const uint8_t *xb = x[c] + QK8 * i;                                          \
                    const float dx = f32at(xb);                                                  \
                    acc[r * C + c] = _mm512_fmadd_ps(_mm512_set1_ps(p.d * dx), _mm512_cvtepi32_ps(isum[c]), \
                                                     acc[r * C + c]);                            \
                    if (MIN) {                                                                   \
                        const __m256i mi = _mm256_madd_epi16(ld32(xb + 260), p.m16);             \
                        accm[r * C + c] = _mm256_fnmadd_ps(_mm256_set1_ps(p.dmin * dx),          \
                                                           _mm256_cvtepi32_ps(mi), accm[r * C + c]); \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < R * C; k++)                                                          \
            out[k] = MIN ? _mm512_reduce_add_ps(acc[k]) + hsum256(accm[k]) : _mm512_reduce_add_ps(acc[k]); \
    }

K_TILE(q2_K, sizeof(moe_block_q2_K), spread16, 1, 0)
K_TILE(q3_K, sizeof(moe_block_q3_K), spread16, 0, 1)
K_TILE(q4_K, sizeof(moe_block_q4_K), spread32, 1, 0)
K_TILE(q5_K, sizeof(moe_block_q5_K), spread32, 1, 0)
K_TILE(q6_K, sizeof(moe_block_q6_K), spread16, 0, 1)

/* The tile shapes of the table. */
#define SHAPES(T)                                                                                 \
    static TGT void v_##T##_1x1(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        T##_tile(1, 1, w, x, nb, o);                                                              \
    }                                                                                             \
    static TGT void v_##T##_1x2(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        T##_tile(1, 2, w, x, nb, o);                                                              \
    }                                                                                             \
    static TGT void v_##T##_1x4(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        T##_tile(1, 4, w, x, nb, o);                                                              \
    }                                                                                             \
    static TGT void v_##T##_4x1(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        T##_tile(4, 1, w, x, nb, o);                                                              \
    }
SHAPES(q8_0)
SHAPES(q4_0)
SHAPES(q2_K)
SHAPES(q3_K)
SHAPES(q4_K)
SHAPES(q5_K)
SHAPES(q6_K)

/* ==== q4_k_r16: 16 interleaved q4_k rows against q8_k ==================== */

/* Shuffle controls picking byte j of every dword into its low byte (the rest
 * zero): scale j of each row as an int16 pair (scale, 0). */
INL __m512i pick_byte(int j) {
    const __m512i base = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
    return _mm512_or_si512(_mm512_add_epi32(base, _mm512_set1_epi32(j)), _mm512_set1_epi32((int)0x80808000u));
}
/* ... and bytes 2t, 2t+1 of every dword as two int16 (a pair of mins). */
INL __m512i pick_pair(int t) {
    const __m512i base = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
    const __m512i b = _mm512_add_epi32(base, _mm512_set1_epi32(2 * t));
    return _mm512_or_si512(_mm512_or_si512(b, _mm512_slli_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(1)), 16)),
                           _mm512_set1_epi32((int)0x80008000u));
}
INL int32_t i32at(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* A group tile's outputs: lane r of f[c] to out[r * C + c]. */
INL void out16(const int C, const __m512 *f, float *out) {
    if (C == 1) {
        _mm512_storeu_ps(out, f[0]);
        return;
    }
    float t[16];
    for (int c = 0; c < C; c++) {
        _mm512_storeu_ps(t, f[c]);
        for (int r = 0; r < 16; r++) out[r * C + c] = t[r];
    }
}
/* The tile shapes of a group kernel FN(C, w, x, nb, out): 16 rows x 1, 2, 4. */
#define GROUP_SHAPES(T, FN)                                                                          \
    static TGT void v_##T##_1x1(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        FN(1, w[0], x, nb, o);                                                                        \
    }                                                                                                 \
    static TGT void v_##T##_1x2(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        FN(2, w[0], x, nb, o);                                                                        \
    }                                                                                                 \
    static TGT void v_##T##_1x4(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        FN(4, w[0], x, nb, o);                                                                        \
    }

/*
 * One group of 16 rows (layout in moe-quant.h) against C activations: out[r *
 * C + c]. Per super-block: the scales and mins of the 16 rows are unpacked
 * together (row r in dword lane r); column c of qs (4 bytes of every row)
 * gives its low nibbles to sub-block 2(c/8), weights 64(c/8) + 4(c%8) ..,
 * and its high nibbles to sub-block 2(c/8)+1, 32 weights further, each
 * through one vpdpbusd against 4 activation bytes broadcast. After 4 columns
 * a lane holds 16 products (|sum| <= 16 * 15 * 127 < 2^15), so vpdpwssd can
 * apply the sub-block's scale, as in K_TILE. The 16 outputs of a row stay in
 * their lanes: no horizontal sums.
 */
INL void r16_tile(const int C, const uint8_t *w, const uint8_t *const *x, int64_t nb, float *out) {
    __m512 f[4];
    for (int c = 0; c < 4; c++) f[c] = _mm512_setzero_ps();
    const __m512i m0f = _mm512_set1_epi8(0x0f), m3f = _mm512_set1_epi8(0x3f), m30 = _mm512_set1_epi8(0x30);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *g = w + i * 16 * (int64_t)sizeof(moe_block_q4_K);
        const __m512i S0 = ld64(g + 64), S2 = ld64(g + 192);
        const __m512i sc03 = _mm512_and_si512(S0, m3f);
        const __m512i sc47 = _mm512_ternarylogic_epi32(_mm512_and_si512(S2, m0f), _mm512_srli_epi16(S0, 2), m30, 0xF8);
        __m512i isum[4];
        for (int c = 0; c < 4; c++) isum[c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            const __m512i src = k < 2 ? sc03 : sc47;
            const __m512i sA = _mm512_shuffle_epi8(src, pick_byte((2 * k) % 4));
            const __m512i sB = _mm512_shuffle_epi8(src, pick_byte((2 * k + 1) % 4));
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                __m512i aL[4], aH[4];
                for (int c = 0; c < 4; c++) aL[c] = aH[c] = _mm512_setzero_si512();
                _Pragma("GCC unroll 4") for (int jj = 0; jj < 4; jj++) {
                    const int j = 4 * h + jj;
                    const __m512i v = ld64(g + 256 + 64 * (8 * k + j));
                    const __m512i lo = _mm512_and_si512(v, m0f);
                    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f);
                    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
                        const uint8_t *xo = x[c] + QK8 * i + 4 + 64 * k + 4 * j;
                        aL[c] = _mm512_dpbusd_epi32(aL[c], lo, _mm512_set1_epi32(i32at(xo)));
                        aH[c] = _mm512_dpbusd_epi32(aH[c], hi, _mm512_set1_epi32(i32at(xo + 32)));
                    }
                }
                _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
                    isum[c] = _mm512_dpwssd_epi32(isum[c], aL[c], sA);
                    isum[c] = _mm512_dpwssd_epi32(isum[c], aH[c], sB);
                }
            }
        }
        /* mins: m[r][s] against the activation's sums of 32 (pairs of bsums) */
        const __m512i S1 = ld64(g + 128);
        const __m512i mn03 = _mm512_and_si512(S1, m3f);
        const __m512i mn47 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(S2, 4), m0f),
                                                       _mm512_srli_epi16(S1, 2), m30, 0xF8);
        const __m512 d = _mm512_cvtph_ps(ld32(g)), dm = _mm512_cvtph_ps(ld32(g + 32));
        _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
            const uint8_t *xb = x[c] + QK8 * i;
            /* int16 pairs (b32[2t], b32[2t+1]) in dwords 0, 1 (t = 0, 1) and 4, 5 (t = 2, 3) */
            const __m256i b32 = _mm256_madd_epi16(ld32(xb + 260), _mm256_set1_epi16(1));
            int32_t bp[8];
            _mm256_storeu_si256((__m256i *)bp, _mm256_packs_epi32(b32, b32));
            __m512i ms = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_shuffle_epi8(mn03, pick_pair(0)),
                                             _mm512_set1_epi32(bp[0]));
            ms = _mm512_dpwssd_epi32(ms, _mm512_shuffle_epi8(mn03, pick_pair(1)), _mm512_set1_epi32(bp[1]));
            ms = _mm512_dpwssd_epi32(ms, _mm512_shuffle_epi8(mn47, pick_pair(0)), _mm512_set1_epi32(bp[4]));
            ms = _mm512_dpwssd_epi32(ms, _mm512_shuffle_epi8(mn47, pick_pair(1)), _mm512_set1_epi32(bp[5]));
            const __m512 dx = _mm512_set1_ps(f32at(xb));
            f[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(isum[c]), f[c]);
            f[c] = _mm512_fnmadd_ps(_mm512_mul_ps(dm, dx), _mm512_cvtepi32_ps(ms), f[c]);
        }
    }
    out16(C, f, out);
}
GROUP_SHAPES(q4_K_r16, r16_tile)

/* ==== q8_0_r16: 16 interleaved q8_0 rows against q8_0 ==================== */

/*
 * One group of 16 rows (layout in moe-quant.h) against C activations: out[r *
 * C + c]. The weights are stored as q + 128 (unsigned), so column c (4 bytes
 * of every row) goes through one vpdpbusd against the 4 activation bytes
 * broadcast, giving sum (q + 128) x; a second vpdpbusd of 128 against the same
 * bytes gives 128 sum x, taken off at the end of the block (exact: |sums| <
 * 2^23). Per block the 16 rows' d come in one vcvtph2ps and the float part is
 * one FMA per activation for all 16 rows.
 */
INL void q8r16_tile(const int C, const uint8_t *w, const uint8_t *const *x, int64_t nb, float *out) {
    __m512 f[4];
    for (int c = 0; c < 4; c++) f[c] = _mm512_setzero_ps();
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *g = w + i * 16 * Q80;
        __m512i acc[4], bias[4];
        for (int c = 0; c < 4; c++) acc[c] = bias[c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 8") for (int col = 0; col < 8; col++) {
            const __m512i v = ld64(g + 32 + 64 * col);
            _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
                const __m512i xb = _mm512_set1_epi32(i32at(x[c] + Q80 * i + 2 + 4 * col));
                acc[c] = _mm512_dpbusd_epi32(acc[c], v, xb);
                bias[c] = _mm512_dpbusd_epi32(bias[c], k80, xb);
            }
        }
        const __m512 d = _mm512_cvtph_ps(ld32(g));
        _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
            const __m512 dx = _mm512_set1_ps(h2f(x[c] + Q80 * i));
            f[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[c], bias[c])), f[c]);
        }
    }
    out16(C, f, out);
}
GROUP_SHAPES(q8_0_r16, q8r16_tile)

/* ==== activation quantizers ============================================= */
/* (q8_k here; q8_0 activations use the q8_0 weight quantizer of quant-avx*.c,
 * whose bytes they are: see init_once in quant.c) */

/* q8_k as quantize_q8_K in quant.c: max = the first element of largest
 * magnitude, q = round-to-nearest-even(x * (-127/max)) capped at 127, d = 1/iscale,
 * bsums of each 16. */
static TGT void act_q8_K(const float *x, void *y, int64_t nb) {
    uint8_t *o = y;
    for (int64_t i = 0; i < nb; i++, x += MOE_QK_K, o += QK8) {
        __m512 m = _mm512_setzero_ps();
        for (int k = 0; k < 16; k++) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * k)));
        const float amax = _mm512_reduce_max_ps(m);
        float d = 0.0f;
        int16_t bsums[16];
        if (!(amax > 0.0f)) { /* all zero (or NaN: unspecified, but well-formed) */
            memset(o + offsetof(moe_block_q8_K, qs), 0, MOE_QK_K);
            memset(bsums, 0, sizeof bsums);
        } else {
            float max = amax;
            for (int k = 0; k < 16; k++) {
                const __mmask16 eq =
                    _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + 16 * k)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
                if (eq) {
                    max = x[16 * k + __builtin_ctz(eq)];
                    break;
                }
            }
            const float iscale = -127.0f / max;
            const __m512 vs = _mm512_set1_ps(iscale);
            for (int k = 0; k < 16; k++) {
                __m512i q = _mm512_cvt_roundps_epi32(_mm512_mul_ps(vs, _mm512_loadu_ps(x + 16 * k)),
                                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                /* a non-finite product (1/max overflowed for a subnormal max)
                 * converts to INT32_MIN; the reference's rounding trick gives a
                 * value whose low byte is 0 there, so store 0; then cap at 127 */
                const __m512i bad = _mm512_set1_epi32((int)0x80000000u);
                q = _mm512_mask_mov_epi32(q, _mm512_cmpeq_epi32_mask(q, bad), _mm512_setzero_si512());
                q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
                _mm_storeu_si128((__m128i *)(o + offsetof(moe_block_q8_K, qs) + 16 * k), _mm512_cvtepi32_epi8(q));
                bsums[k] = (int16_t)_mm512_reduce_add_epi32(q);
            }
            d = 1.0f / iscale;
        }
        memcpy(o + offsetof(moe_block_q8_K, d), &d, 4);
        memcpy(o + offsetof(moe_block_q8_K, bsums), bsums, sizeof bsums);
    }
}

#define SET_SHAPES(k, TYPE, T)                                                    \
    do {                                                                         \
        (k)->dotq[MOE_QTYPE_##TYPE][MOE_TILE_1X1] = v_##T##_1x1;                 \
        (k)->dotq[MOE_QTYPE_##TYPE][MOE_TILE_1X2] = v_##T##_1x2;                 \
        (k)->dotq[MOE_QTYPE_##TYPE][MOE_TILE_1X4] = v_##T##_1x4;                 \
        (k)->dotq[MOE_QTYPE_##TYPE][MOE_TILE_4X1] = v_##T##_4x1;                 \
    } while (0)

void moe_quant_int_kernels_avx512vnni(struct moe_quant_kernels *k) {
    SET_SHAPES(k, Q8_0, q8_0);
    SET_SHAPES(k, Q4_0, q4_0);
    SET_SHAPES(k, Q2_K, q2_K);
    SET_SHAPES(k, Q3_K, q3_K);
    SET_SHAPES(k, Q4_K, q4_K);
    SET_SHAPES(k, Q5_K, q5_K);
    SET_SHAPES(k, Q6_K, q6_K);
    k->dotq[MOE_QTYPE_Q4_K_R16][MOE_TILE_1X1] = v_q4_K_r16_1x1;
    k->dotq[MOE_QTYPE_Q4_K_R16][MOE_TILE_1X2] = v_q4_K_r16_1x2;
    k->dotq[MOE_QTYPE_Q4_K_R16][MOE_TILE_1X4] = v_q4_K_r16_1x4;
    k->fast_layout[MOE_QTYPE_Q4_K_R16] = 1;
    k->dotq[MOE_QTYPE_Q8_0_R16][MOE_TILE_1X1] = v_q8_0_r16_1x1;
    k->dotq[MOE_QTYPE_Q8_0_R16][MOE_TILE_1X2] = v_q8_0_r16_1x2;
    k->dotq[MOE_QTYPE_Q8_0_R16][MOE_TILE_1X4] = v_q8_0_r16_1x4;
    k->fast_layout[MOE_QTYPE_Q8_0_R16] = 1;
    k->quant_act[MOE_QTYPE_Q8_K] = act_q8_K;
    k->int_name = "avx512vnni";
}

#else /* not x86 */
void moe_quant_int_kernels_avx512vnni(struct moe_quant_kernels *k) { (void)k; }
#endif

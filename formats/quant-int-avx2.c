/*
 * quant-int-avx2.c - AVX2 integer dot products (vpmaddubsw, vpmaddwd) of
 * quantized weight rows with quantized activation rows, and the activation
 * quantizers.
 *
 * The integer sums are exact and equal the scalar reference's (quant-int.c):
 *   - vpmaddubsw multiplies unsigned weight bytes by signed activation bytes and
 *     adds pairs into int16 without saturating: a pair is at most 2 * 128 * 127
 *     (q8_0 through the sign trick) < 2^15. Signed weights (q8_0, q4_0, q3_k,
 *     q6_k) go in as |q| with the activation negated where q < 0 (vpsignb), so
 *     every lane holds a partial sum of the true products q * x.
 *   - vpmaddwd then multiplies the pairs by their sub-block's scale (or by 1)
 *     and adds pairs of those into int32 lanes.
 * The float part is as in quant-int-avx512.c: per (super-)block, the int32
 * lanes are converted and accumulated with FMA by d_w * d_x (and the mins'
 * term by dmin * d_x). Activation quants must be in -127..127
 * (moe_quantize_act guarantees it). Every tile shape computes each output with
 * the operations of the 1x1 kernel, in the same order.
 *
 * Compiled with per-function target attributes; quant.c installs these only
 * after checking the CPU for AVX2, FMA and F16C.
 */
#define MOE_QUANT_INTERNAL 1
#include "moe-quant.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT

#define QK8 ((int64_t)sizeof(moe_block_q8_K))
#define Q80 ((int64_t)sizeof(moe_block_q8_0))

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
INL __m256i ld32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
INL __m128i ld16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
/* Logical right shift of 16-bit lanes by a count known after inlining. */
INL __m256i srl16(__m256i v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }

INL float hsum256(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    return _mm_cvtss_f32(t);
}

/* Signed bytes q times signed bytes x, pairs summed into 16 int16 lanes. */
INL __m256i mul_sign(__m256i aq, __m256i q, __m256i x) { return _mm256_maddubs_epi16(aq, _mm256_sign_epi8(x, q)); }

/* ==== 32-element blocks: q8_0 and q4_0 against q8_0 ===================== */

INL __m256i wq_q8_0(const uint8_t *b) { return ld32(b + 2); }
INL __m256i wq_q4_0(const uint8_t *b) {
    const __m128i v = ld16(b + 2), m = _mm_set1_epi8(15);
    const __m256i q = _mm256_setr_m128i(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
}

#define B32_STEP(T, WB)                                                                         \
    INL void T##_step(const int R, const int C, const uint8_t *const *w, const uint8_t *const *x, \
                      int64_t i, __m256 *acc) {                                                 \
        const __m256i ones = _mm256_set1_epi16(1);                                              \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                   \
            const uint8_t *b = w[r] + (WB) * i;                                                 \
            const __m256i q = wq_##T(b), aq = _mm256_abs_epi8(q);                               \
            const float dw = h2f(b);                                                            \
            _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {                               \
                const uint8_t *xb = x[c] + Q80 * i;                                             \
                const __m256i p = _mm256_madd_epi16(mul_sign(aq, q, ld32(xb + 2)), ones);        \
                acc[r * C + c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * h2f(xb)),                  \
                                                 _mm256_cvtepi32_ps(p), acc[r * C + c]);        \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
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

/* A weight super-block prepared for the dots: ss = the scales as int16 (for
 * 32-weight sub-blocks: the 8 scales in both 128-bit halves; for 16-weight
 * ones: all 16), m16 = the mins matching the 16 bsums (min types). */
struct kq {
    __m256i ss, m16, aux;
    float d, dmin;
};

/* int16 scale of 32-weight sub-block t in all 16 lanes (ss: 8 scales, twice). */
INL __m256i scale32(const struct kq *p, int t) { return _mm256_shuffle_epi8(p->ss, _mm256_set1_epi16((short)(2 * t | (2 * t + 1) << 8))); }
/* Scales of 16-weight sub-blocks 2t (low 8 lanes) and 2t+1 (high 8 lanes). */
INL __m256i scale16(const struct kq *p, int t) {
    const int h = t / 4, j = t % 4;
    const __m256i half = h ? _mm256_permute2x128_si256(p->ss, p->ss, 0x11) : _mm256_permute2x128_si256(p->ss, p->ss, 0x00);
    const __m256i pat = _mm256_setr_m128i(_mm_set1_epi16((short)(4 * j | (4 * j + 1) << 8)),
                                          _mm_set1_epi16((short)((4 * j + 2) | (4 * j + 3) << 8)));
    return _mm256_shuffle_epi8(half, pat);
}

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
    p->ss = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm)); /* sc0..sc7 as int16, twice */
    p->m16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));   /* m0 m0 m1 m1 ... m7 m7 */
    const __m128 dd = _mm_cvtph_ps(v);
    p->d = _mm_cvtss_f32(dd);
    p->dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
}
INL void kprep_q4_K(const uint8_t *b, struct kq *p) { kprep_asym(b, p); }
INL void kprep_q5_K(const uint8_t *b, struct kq *p) {
    kprep_asym(b, p);
    p->aux = ld32(b + offsetof(moe_block_q5_K, qh));
}
/* Chunk t (weights 32t..32t+31, sub-block t): nibble t%2 of qs[32(t/2) ..]. */
INL __m256i kw_q4_K(const uint8_t *b, const struct kq *p, int t) {
    (void)p;
    const __m256i v = ld32(b + offsetof(moe_block_q4_K, qs) + 32 * (t / 2));
    return _mm256_and_si256(srl16(v, 4 * (t % 2)), _mm256_set1_epi8(15));
}
INL __m256i kw_q5_K(const uint8_t *b, const struct kq *p, int t) {
    const __m256i v = ld32(b + offsetof(moe_block_q5_K, qs) + 32 * (t / 2));
    const __m256i q = _mm256_and_si256(srl16(v, 4 * (t % 2)), _mm256_set1_epi8(15));
    const __m256i hb = _mm256_and_si256(srl16(p->aux, t), _mm256_set1_epi8(1)); /* qh bit t */
    return _mm256_or_si256(q, _mm256_slli_epi16(hb, 4));
}

INL void kprep_q2_K(const uint8_t *b, struct kq *p) {
    const __m128i v = ld16(b + offsetof(moe_block_q2_K, scales)), m15 = _mm_set1_epi8(15);
    p->ss = _mm256_cvtepu8_epi16(_mm_and_si128(v, m15));
    p->m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m15));
    p->d = h2f(b + offsetof(moe_block_q2_K, d));
    p->dmin = h2f(b + offsetof(moe_block_q2_K, dmin));
}
/* Chunk t = 4h + j: 2-bit field j of qs[32h .. 32h+31] (sub-blocks 2t, 2t+1). */
INL __m256i kw_q2_K(const uint8_t *b, const struct kq *p, int t) {
    (void)p;
    const __m256i v = ld32(b + offsetof(moe_block_q2_K, qs) + 32 * (t / 4));
    return _mm256_and_si256(srl16(v, 2 * (t % 4)), _mm256_set1_epi8(3));
}

/* The 16 signed 6-bit scales (moe_q3k_scale) as int16: low nibbles from bytes
 * s % 8 (>> 4 for s >= 8), high 2 bits of scale s = 4j + i from byte 8 + i at
 * bit 2j, which is byte s of the dwords hi4 >> 2j. */
INL void kprep_q3_K(const uint8_t *b, struct kq *p) {
    const uint8_t *sc = b + offsetof(moe_block_q3_K, scales);
    uint32_t hi4;
    memcpy(&hi4, sc + 8, 4);
    const __m128i m15 = _mm_set1_epi8(15), v = _mm_loadl_epi64((const __m128i *)sc);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(v, m15), _mm_and_si128(_mm_srli_epi16(v, 4), m15));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)hi4), _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(3));
    const __m128i s6 = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    p->ss = _mm256_cvtepi8_epi16(s6);
    p->aux = ld32(b + offsetof(moe_block_q3_K, hmask));
    p->d = h2f(b + offsetof(moe_block_q3_K, d));
    p->dmin = 0.0f;
}
/* Signed q of chunk t = 4h + j: low 2 bits as q2_k, minus 4 where hmask bit t
 * is clear. */
INL __m256i kw_q3_K(const uint8_t *b, const struct kq *p, int t) {
    const __m256i v = ld32(b + offsetof(moe_block_q3_K, qs) + 32 * (t / 4));
    const __m256i lo = _mm256_and_si256(srl16(v, 2 * (t % 4)), _mm256_set1_epi8(3));
    const __m256i bit = _mm256_set1_epi8((char)(1 << t));
    const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(p->aux, bit), _mm256_setzero_si256());
    return _mm256_sub_epi8(lo, _mm256_and_si256(clear, _mm256_set1_epi8(4)));
}

INL void kprep_q6_K(const uint8_t *b, struct kq *p) {
    p->ss = _mm256_cvtepi8_epi16(ld16(b + offsetof(moe_block_q6_K, scales)));
    p->d = h2f(b + offsetof(moe_block_q6_K, d));
    p->dmin = 0.0f;
}
/* Signed q of chunk t = 4h + g: nibble (g >= 2) of ql[64h + 32(g&1) ..] and
 * bits 2g, 2g+1 of qh[32h ..], minus 32. */
INL __m256i kw_q6_K(const uint8_t *b, const struct kq *p, int t) {
    (void)p;
    const int h = t / 4, g = t % 4;
    const __m256i l = ld32(b + offsetof(moe_block_q6_K, ql) + 64 * h + 32 * (g & 1));
    const __m256i lo = _mm256_and_si256(srl16(l, 4 * (g >> 1)), _mm256_set1_epi8(15));
    const __m256i qh = ld32(b + offsetof(moe_block_q6_K, qh) + 32 * h);
    const __m256i hi = _mm256_and_si256(srl16(qh, 2 * g), _mm256_set1_epi8(3));
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
}

/*
 * One tile of a k-quant: per super-block and weight row, prepare the scales,
 * then per chunk of 32 weights unpack them once and run maddubs + madd (by the
 * chunk's scales, SCALE) against each activation; then scale the super-block's
 * int32 lanes in float. MIN and SIGNED are constants.
 */
#define K_TILE(T, WB, SCALE, MIN, SIGNED)                                                        \
    INL void T##_tile(const int R, const int C, const uint8_t *const *w, const uint8_t *const *x, \
                      int64_t nb, float *out) {                                                  \
        __m256 acc[4];                                                                           \
        for (int k = 0; k < 4; k++) acc[k] = _mm256_setzero_ps();                                \
        for (int64_t i = 0; i < nb; i++) {                                                       \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                \
                const uint8_t *b = w[r] + (int64_t)(WB) * i;                                     \
                struct kq p;                                                                     \
                kprep_##T(b, &p);                                                                \
                __m256i isum[4];                                                                 \
                for (int c = 0; c < 4; c++) isum[c] = _mm256_setzero_si256();                    \
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {                            \
                    const __m256i q = kw_##T(b, &p, t);                                          \
                    const __m256i aq = SIGNED ? _mm256_abs_epi8(q) : q;                          \
                    const __m256i st = SCALE(&p, t);                                             \
                    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {                        \
                        __m256i xv = ld32(x[c] + QK8 * i + 4 + 32 * t);                          \
                        if (SIGNED) xv = _mm256_sign_epi8(xv, q);                                \
                        isum[c] = _mm256_add_epi32(isum[c],                                      \
                                                   _mm256_madd_epi16(_mm256_maddubs_epi16(aq, xv), st)); \
                    }                                                                            \
                }                                                                                \
                _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {                            \
                    const uint8_t *xb = x[c] + QK8 * i;                                          \
                    const float dx = f32at(xb);                                                  \
                    __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(p.d * dx), _mm256_cvtepi32_ps(isum[c]), \
                                               acc[r * C + c]);                                  \
                    if (MIN) {                                                                   \
                        const __m256i mi = _mm256_madd_epi16(ld32(xb + 260), p.m16);             \
                        a = _mm256_fnmadd_ps(_mm256_set1_ps(p.dmin * dx), _mm256_cvtepi32_ps(mi), a); \
                    }                                                                            \
                    acc[r * C + c] = a;                                                          \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < R * C; k++) out[k] = hsum256(acc[k]);                                \
    }

K_TILE(q2_K, sizeof(moe_block_q2_K), scale16, 1, 0)
K_TILE(q3_K, sizeof(moe_block_q3_K), scale16, 0, 1)
K_TILE(q4_K, sizeof(moe_block_q4_K), scale32, 1, 0)
K_TILE(q5_K, sizeof(moe_block_q5_K), scale32, 1, 0)
K_TILE(q6_K, sizeof(moe_block_q6_K), scale16, 0, 1)

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

/* ==== activation quantizers ============================================= */
/* (q8_k here; q8_0 activations use the q8_0 weight quantizer of quant-avx*.c,
 * whose bytes they are: see init_once in quant.c) */

/* The low bytes of 32 int32 lanes (four vectors), in order. */
INL __m256i low_bytes(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i m = _mm256_set1_epi32(0xff);
    const __m256i ab = _mm256_packus_epi32(_mm256_and_si256(a, m), _mm256_and_si256(b, m));
    const __m256i cd = _mm256_packus_epi32(_mm256_and_si256(c, m), _mm256_and_si256(d, m));
    return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

INL float hmax256(__m256 v) {
    __m128 t = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_max_ps(t, _mm_movehl_ps(t, t));
    t = _mm_max_ss(t, _mm_shuffle_ps(t, t, 1));
    return _mm_cvtss_f32(t);
}

INL __m256 absv(__m256 v) { return _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)), v); }

static TGT void act_q8_K(const float *x, void *y, int64_t nb) {
    uint8_t *o = y;
    for (int64_t i = 0; i < nb; i++, x += MOE_QK_K, o += QK8) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 32; k++) m = _mm256_max_ps(m, absv(_mm256_loadu_ps(x + 8 * k)));
        const float amax = hmax256(m);
        float d = 0.0f;
        int16_t bsums[16];
        if (!(amax > 0.0f)) {
            memset(o + offsetof(moe_block_q8_K, qs), 0, MOE_QK_K);
            memset(bsums, 0, sizeof bsums);
        } else {
            float max = amax;
            for (int k = 0; k < 32; k++) {
                const int eq = _mm256_movemask_ps(
                    _mm256_cmp_ps(absv(_mm256_loadu_ps(x + 8 * k)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
                if (eq) {
                    max = x[8 * k + __builtin_ctz((unsigned)eq)];
                    break;
                }
            }
            const float iscale = -127.0f / max;
            const __m256 vs = _mm256_set1_ps(iscale);
            const __m256i cap = _mm256_set1_epi32(127), bad = _mm256_set1_epi32((int)0x80000000u);
            for (int k = 0; k < 8; k++) { /* 32 quants: two bsums */
                __m256i q[4];
                for (int u = 0; u < 4; u++)
                    q[u] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + 32 * k + 8 * u)),
                                                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)),
                                            cap);
                /* non-finite products: 0, as the reference (see quant-int-avx512.c) */
                for (int u = 0; u < 4; u++) q[u] = _mm256_andnot_si256(_mm256_cmpeq_epi32(q[u], bad), q[u]);
                _mm256_storeu_si256((__m256i *)(o + offsetof(moe_block_q8_K, qs) + 32 * k),
                                    low_bytes(q[0], q[1], q[2], q[3]));
                for (int s = 0; s < 2; s++) {
                    const __m256i t = _mm256_add_epi32(q[2 * s], q[2 * s + 1]);
                    __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
                    u = _mm_add_epi32(u, _mm_unpackhi_epi64(u, u));
                    u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 1));
                    bsums[2 * k + s] = (int16_t)_mm_cvtsi128_si32(u);
                }
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

/* ==== q4_k_r16: 16 interleaved q4_k rows (moe-quant.h) against q8_k ====== */

/* Shuffle control: byte j of every dword twice, as the int16 pair (v, v). */
INL __m256i pick_byte2(int j) {
    const __m256i base = _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12);
    const __m256i b = _mm256_add_epi32(base, _mm256_set1_epi32(j));
    return _mm256_or_si256(_mm256_or_si256(b, _mm256_slli_epi32(b, 16)), _mm256_set1_epi32((int)0x80008000u));
}
/* ... bytes 2t and 2t+1 of every dword as the int16 pair (lo, hi). */
INL __m256i pick_pair2(int t) {
    const __m256i base = _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12);
    const __m256i b = _mm256_add_epi32(base, _mm256_set1_epi32(2 * t));
    return _mm256_or_si256(_mm256_or_si256(b, _mm256_slli_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(1)), 16)),
                           _mm256_set1_epi32((int)0x80008000u));
}
INL int32_t i32at(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/*
 * NH halves of a group from half h0 (rows 8h .. 8h+7 are the 32-byte half h
 * of each 64-byte column) over all nb super-blocks against C activations,
 * NH * C <= 2 (the 16 ymm registers): out[(8h + r) * C + c]. As the AVX-512
 * kernel, with vpmaddubsw for vpdpbusd: a column gives every row two int16
 * sums of 2 products; 4 columns added in int16 stay below 2^15 (4 * 2 * 15 *
 * 127), then vpmaddwd applies the sub-block scale as the pair (s, s). With
 * one activation both halves go together (one pass over the weights); with
 * two, one half at a time (the group's bytes are in cache for the second).
 */
INL void r16_part(const int C, const int NH, const uint8_t *w, int h0, const uint8_t *const *x, int64_t nb,
                  float *out) {
    __m256 f[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256i m0f = _mm256_set1_epi8(0x0f), m3f = _mm256_set1_epi8(0x3f), m30 = _mm256_set1_epi8(0x30);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *g = w + i * 16 * (int64_t)sizeof(moe_block_q4_K);
        __m256i sc03[2], sc47[2], isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int e = 0; e < NH; e++) {
            const __m256i S0 = ld32(g + 64 + 32 * (h0 + e)), S2 = ld32(g + 192 + 32 * (h0 + e));
            sc03[e] = _mm256_and_si256(S0, m3f);
            sc47[e] = _mm256_or_si256(_mm256_and_si256(S2, m0f), _mm256_and_si256(_mm256_srli_epi16(S0, 2), m30));
        }
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            _Pragma("GCC unroll 2") for (int hh = 0; hh < 2; hh++) {
                __m256i aL[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, aH[2] = {aL[0], aL[1]};
                _Pragma("GCC unroll 4") for (int jj = 0; jj < 4; jj++) {
                    const int j = 4 * hh + jj;
                    _Pragma("GCC unroll 2") for (int e = 0; e < NH; e++) {
                        const __m256i v = ld32(g + 256 + 64 * (8 * k + j) + 32 * (h0 + e));
                        const __m256i lo = _mm256_and_si256(v, m0f);
                        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
                        _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) {
                            const uint8_t *xo = x[c] + QK8 * i + 4 + 64 * k + 4 * j;
                            const int q = e * C + c;
                            aL[q] = _mm256_add_epi16(aL[q], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(i32at(xo))));
                            aH[q] = _mm256_add_epi16(aH[q], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(i32at(xo + 32))));
                        }
                    }
                }
                _Pragma("GCC unroll 2") for (int e = 0; e < NH; e++) {
                    const __m256i src = k < 2 ? sc03[e] : sc47[e];
                    const __m256i sA = _mm256_shuffle_epi8(src, pick_byte2((2 * k) % 4));
                    const __m256i sB = _mm256_shuffle_epi8(src, pick_byte2((2 * k + 1) % 4));
                    _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) {
                        const int q = e * C + c;
                        isum[q] = _mm256_add_epi32(isum[q], _mm256_madd_epi16(aL[q], sA));
                        isum[q] = _mm256_add_epi32(isum[q], _mm256_madd_epi16(aH[q], sB));
                    }
                }
            }
        }
        _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) {
            const uint8_t *xb = x[c] + QK8 * i;
            const __m256i b32 = _mm256_madd_epi16(ld32(xb + 260), _mm256_set1_epi16(1));
            int32_t bp[8];
            _mm256_storeu_si256((__m256i *)bp, _mm256_packs_epi32(b32, b32));
            const __m256 dx = _mm256_set1_ps(f32at(xb));
            _Pragma("GCC unroll 2") for (int e = 0; e < NH; e++) {
                const int h = h0 + e, q = e * C + c;
                const __m256i S1 = ld32(g + 128 + 32 * h), S2 = ld32(g + 192 + 32 * h);
                const __m256i mn03 = _mm256_and_si256(S1, m3f);
                const __m256i mn47 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(S2, 4), m0f),
                                                     _mm256_and_si256(_mm256_srli_epi16(S1, 2), m30));
                __m256i ms = _mm256_madd_epi16(_mm256_shuffle_epi8(mn03, pick_pair2(0)), _mm256_set1_epi32(bp[0]));
                ms = _mm256_add_epi32(ms, _mm256_madd_epi16(_mm256_shuffle_epi8(mn03, pick_pair2(1)), _mm256_set1_epi32(bp[1])));
                ms = _mm256_add_epi32(ms, _mm256_madd_epi16(_mm256_shuffle_epi8(mn47, pick_pair2(0)), _mm256_set1_epi32(bp[4])));
                ms = _mm256_add_epi32(ms, _mm256_madd_epi16(_mm256_shuffle_epi8(mn47, pick_pair2(1)), _mm256_set1_epi32(bp[5])));
                const __m256 d = _mm256_cvtph_ps(ld16(g + 16 * h)), dm = _mm256_cvtph_ps(ld16(g + 32 + 16 * h));
                f[q] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum[q]), f[q]);
                f[q] = _mm256_fnmadd_ps(_mm256_mul_ps(dm, dx), _mm256_cvtepi32_ps(ms), f[q]);
            }
        }
    }
    float t[8];
    for (int e = 0; e < NH; e++)
        for (int c = 0; c < C; c++) {
            _mm256_storeu_ps(t, f[e * C + c]);
            for (int r = 0; r < 8; r++) out[(8 * (h0 + e) + r) * C + c] = t[r];
        }
}
/* Tiles of 16 rows x 1, 2 activations; 4 as two pairs (out[r * 4 + c]). */
static TGT void a_q4_K_r16_1x1(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) {
    r16_part(1, 2, w[0], 0, x, nb, o);
}
static TGT void a_q4_K_r16_1x2(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) {
    r16_part(2, 1, w[0], 0, x, nb, o);
    r16_part(2, 1, w[0], 1, x, nb, o);
}
static TGT void a_q4_K_r16_1x4(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) {
    float a[32], b[32];
    for (int h = 0; h < 2; h++) {
        r16_part(2, 1, w[0], h, x, nb, a);
        r16_part(2, 1, w[0], h, x + 2, nb, b);
    }
    for (int r = 0; r < 16; r++) {
        o[4 * r] = a[2 * r], o[4 * r + 1] = a[2 * r + 1];
        o[4 * r + 2] = b[2 * r], o[4 * r + 3] = b[2 * r + 1];
    }
}

void moe_quant_int_kernels_avx2(struct moe_quant_kernels *k) {
    SET_SHAPES(k, Q8_0, q8_0);
    SET_SHAPES(k, Q4_0, q4_0);
    SET_SHAPES(k, Q2_K, q2_K);
    SET_SHAPES(k, Q3_K, q3_K);
    SET_SHAPES(k, Q4_K, q4_K);
    SET_SHAPES(k, Q5_K, q5_K);
    SET_SHAPES(k, Q6_K, q6_K);
    k->dotq[MOE_QTYPE_Q4_K_R16][MOE_TILE_1X1] = a_q4_K_r16_1x1;
    k->dotq[MOE_QTYPE_Q4_K_R16][MOE_TILE_1X2] = a_q4_K_r16_1x2;
    k->dotq[MOE_QTYPE_Q4_K_R16][MOE_TILE_1X4] = a_q4_K_r16_1x4;
    k->fast_layout[MOE_QTYPE_Q4_K_R16] = 1;
    k->quant_act[MOE_QTYPE_Q8_K] = act_q8_K;
    k->int_name = "avx2";
}

#else /* not x86 */
void moe_quant_int_kernels_avx2(struct moe_quant_kernels *k) { (void)k; }
#endif

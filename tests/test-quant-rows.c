/*
 * test-quant-rows.c - moe_quantize_row's SIMD kernels (formats/quant-avx2.c and
 * quant-avx512.c: q8_0; q4_k and q5_k from quant-kasym-simd.h) against the
 * scalar reference quantizers (quant.c).
 *
 *   1. Every type, every ISA this CPU runs: moe_quantize_row's bytes equal the
 *      scalar ISA's (the reference, which test-quant checks against gguf and
 *      ggml) on N(0,1) rows at scales 1e-30..1e30 and row lengths of 1..67
 *      blocks, from unaligned source and destination pointers.
 *   2. Corner blocks for q8_0, q4_k and q5_k, same comparison: zeros, -0.0,
 *      subnormals, scales at the f16 subnormal, rounding and overflow edges,
 *      +-3.4e38, infinities, a NaN at every position (and several, and NaN
 *      payloads of both signs, signalling ones too), exact halves, random bit
 *      patterns (any float); for the k-quants also constant sub-blocks (the
 *      fit's early return) next to ordinary ones, sub-blocks of one sign, of
 *      two values, with one outlier, and rows of 1..9 blocks (the AVX-512
 *      kernel's two-block steps and its single last block).
 *   3. The reference's NaN rule, pinned by hand (what the SIMD kernels mirror):
 *      the running maximum restarts after a NaN, so with the last NaN at k the
 *      scale comes from |x| after k alone; a NaN scale is stored as f16 0x7e00
 *      and a NaN (or inf * 0) quantizes to 0.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-dtype.h"
#include "moe-quant.h"
#include "moe-test.h"

static const enum moe_quant_isa ISAS[] = {MOE_QUANT_ISA_SCALAR, MOE_QUANT_ISA_AVX2, MOE_QUANT_ISA_AVX512};
static const enum moe_qtype ALL[] = {MOE_QTYPE_F32,  MOE_QTYPE_F16,  MOE_QTYPE_BF16, MOE_QTYPE_Q8_0,
                                     MOE_QTYPE_Q4_0, MOE_QTYPE_Q2_K, MOE_QTYPE_Q3_K, MOE_QTYPE_Q4_K,
                                     MOE_QTYPE_Q5_K, MOE_QTYPE_Q6_K, MOE_QTYPE_Q8_K, MOE_QTYPE_MXFP4};
#define NTYPES (int)(sizeof ALL / sizeof ALL[0])

/* ---- deterministic random numbers ---------------------------------------- */

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- the comparison ------------------------------------------------------- */

static int g_rows, g_isa_rows;

/*
 * Quantizes x (n elements) as type t on the scalar ISA and on every other
 * supported one, the source copied one float and the destination one byte
 * past an aligned start, and checks the bytes are the same. Returns 0 if they
 * are (or the row does not fit t's blocks).
 */
static int same_on_every_isa(enum moe_qtype t, const float *x, int64_t n, const char *what) {
    const size_t rb = moe_qtype_row_bytes(t, n);
    if (!rb) return 0;
    float *xs = malloc(((size_t)n + 1) * 4);
    uint8_t *ref = malloc(rb), *got = malloc(rb + 1);
    memcpy(xs + 1, x, (size_t)n * 4);
    moe_quant_set_isa(MOE_QUANT_ISA_SCALAR);
    CHECK(moe_quantize_row(t, xs + 1, ref, n) == MOE_OK, "%s: scalar quantize", what);
    int bad = 0;
    for (int k = 1; k < 3; k++) {
        if (!moe_quant_isa_supported(ISAS[k])) continue;
        moe_quant_set_isa(ISAS[k]);
        memset(got, 0xa5, rb + 1);
        CHECK(moe_quantize_row(t, xs + 1, got + 1, n) == MOE_OK, "%s: quantize", what);
        int64_t first = -1;
        for (size_t i = 0; i < rb && first < 0; i++)
            if (got[1 + i] != ref[i]) first = (int64_t)i;
        CHECK(first < 0, "%s %s [%s], n %lld: byte %lld is %02x, the reference's %02x", moe_qtype_name(t), what,
              moe_quant_isa_str(ISAS[k]), (long long)n, (long long)first, first >= 0 ? got[1 + first] : 0,
              first >= 0 ? ref[first] : 0);
        CHECK(got[0] == 0xa5, "%s %s [%s]: wrote before its destination", moe_qtype_name(t), what,
              moe_quant_isa_str(ISAS[k]));
        bad |= first >= 0;
        g_isa_rows++;
    }
    g_rows++;
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
    free(xs);
    free(ref);
    free(got);
    return bad;
}

/* ---- 1. random rows, every type ------------------------------------------- */

static void test_random_rows(void) {
    static const float scales[] = {1e-30f, 1e-3f, 1.0f, 1e3f, 1e30f};
    float *x = malloc(sizeof(float) * 67 * 256);
    for (int ti = 0; ti < NTYPES; ti++) {
        const enum moe_qtype t = ALL[ti];
        const int bs = moe_qtype_block_size(t);
        for (int s = 0; s < 5; s++)
            for (int nb = 1; nb <= 67; nb += (t == MOE_QTYPE_Q8_0 ? 1 : 11)) {
                const int64_t n = (int64_t)nb * bs;
                for (int64_t i = 0; i < n; i++) x[i] = moe_test_rnd_normal() * scales[s];
                char what[64];
                snprintf(what, sizeof what, "N(0,1) x %g", (double)scales[s]);
                same_on_every_isa(t, x, n, what);
            }
    }
    free(x);
}

/* ---- 2. q8_0 corner blocks -------------------------------------------------- */

/* A row of `nb` q8_0 blocks, each from fill(block index, element index). */
typedef float (*fill_fn)(int b, int j);

static float f_zero(int b, int j) { return (b + j) % 3 ? 0.0f : -0.0f; }
static float f_subnormal(int b, int j) { return from_bits((uint32_t)(1 + b * 7919 + j * 104729) & 0x807fffffu); }
static float f_tiny(int b, int j) { /* amax / 127 near the smallest f16 subnormal, 2^-24 */
    return (j == b % 32 ? 1.0f : 0.3f) * 127.0f * ldexpf(1.0f, -26 + b % 5) * (j % 2 ? -1.0f : 1.0f);
}
static float f_f16_edge(int b, int j) { /* amax / 127 around 65504 (f16 max) and 65520 (rounds to inf) */
    static const float amax[] = {65504.0f * 127.0f, 65519.0f * 127.0f, 65520.0f * 127.0f, 65535.0f * 127.0f,
                                 2048.5f * 127.0f, 0.000061035156f * 127.0f};
    return j == 31 - b % 32 ? amax[b % 6] * (b % 2 ? -1.0f : 1.0f) : (float)(j - 16) * 1234.5f;
}
static float f_huge(int b, int j) { return j == b % 32 ? (b % 2 ? -3.4e38f : 3.4e38f) : moe_test_rnd_normal() * 1e37f; }
static float f_inf(int b, int j) {
    if (j == b % 32) return b % 2 ? -INFINITY : INFINITY;
    return j == (b * 7) % 32 && b % 3 == 0 ? -INFINITY : moe_test_rnd_normal();
}
static float f_nan_each(int b, int j) { return j == b % 32 ? NAN : moe_test_rnd_normal() * (float)(j + 1); }
static float f_nan_many(int b, int j) {
    static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7fc12345u, 0xff800001u, 0x7f800001u, 0x7fffffffu};
    if ((j * 5 + b) % 11 == 0) return from_bits(nans[(b + j) % 6]);
    if (b % 4 == 0 && j == 31) return from_bits(nans[b % 6]); /* NaN last: the scale is NaN */
    return moe_test_rnd_normal() * 100.0f;
}
static float f_nan_inf(int b, int j) { return j == b % 32 ? NAN : j == (b + 5) % 32 ? INFINITY : moe_test_rnd_normal(); }
static float f_ties(int b, int j) { /* d = amax/127 a power of two: x/d lands on exact halves */
    const float d = ldexpf(1.0f, b % 9 - 4);
    if (j == 0) return 127.0f * d * (b % 2 ? -1.0f : 1.0f);
    return ((float)((j * 37 + b) % 253 - 126) + 0.5f) * d;
}
static float f_bits(int b, int j) {
    (void)b, (void)j;
    return from_bits((uint32_t)moe_test_rnd64());
}
static float f_bits_finite(int b, int j) { /* random bits, exponents kept below 255 (no NaN or inf) */
    (void)b, (void)j;
    uint32_t u = (uint32_t)moe_test_rnd64();
    if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu;
    return from_bits(u);
}
/* k-quant sub-block shapes (b counts sub-blocks of 32) */
static float f_flat(int b, int j) { /* constant sub-blocks (hi == lo) between ordinary ones */
    static const float c[] = {0.0f, -0.0f, 1.5f, -2.25f, 1e-20f, -7e3f};
    return b % 3 == 1 ? moe_test_rnd_normal() : c[b % 6];
}
static float f_one_sign(int b, int j) { /* all positive (lo clamps to 0) or all negative */
    const float v = fabsf(moe_test_rnd_normal()) + (float)(j % 3);
    return b % 2 ? v : -v;
}
static float f_two_values(int b, int j) { return (j + b) % 2 ? 1.0f + (float)(b % 4) : -0.5f * (float)(b % 3); }
static float f_outlier(int b, int j) { return j == (b * 11) % 32 ? 1000.0f * (b % 2 ? -1.0f : 1.0f) : moe_test_rnd_normal() * 0.01f; }
static float f_tiny_k(int b, int j) { return moe_test_rnd_normal() * ldexpf(1.0f, -120 - b % 20); }

static void test_corners(void) {
    static const struct {
        const char *name;
        fill_fn fill;
        int nb; /* blocks of 32 */
        int k_only;
    } cases[] = {
        {"zeros and -0", f_zero, 9, 0},
        {"subnormals", f_subnormal, 33, 0},
        {"tiny scales", f_tiny, 40, 0},
        {"f16 scale edges", f_f16_edge, 36, 0},
        {"+-3.4e38", f_huge, 33, 0},
        {"infinities", f_inf, 64, 0},
        {"a NaN at each position", f_nan_each, 64, 0},
        {"NaN payloads", f_nan_many, 96, 0},
        {"NaN and inf", f_nan_inf, 64, 0},
        {"exact halves", f_ties, 72, 0},
        {"random bits", f_bits, 512, 0},
        {"random finite bits", f_bits_finite, 512, 0},
        {"constant sub-blocks", f_flat, 72, 1},
        {"one-sign sub-blocks", f_one_sign, 72, 1},
        {"two-valued sub-blocks", f_two_values, 72, 1},
        {"outliers", f_outlier, 72, 1},
        {"tiny values", f_tiny_k, 160, 1},
    };
    static const enum moe_qtype types[] = {MOE_QTYPE_Q8_0, MOE_QTYPE_Q4_K, MOE_QTYPE_Q5_K};
    for (int ti = 0; ti < 3; ti++) {
        const enum moe_qtype t = types[ti];
        const int per = moe_qtype_block_size(t) / 32; /* blocks of 32 per block of t */
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            if (cases[c].k_only && t == MOE_QTYPE_Q8_0) continue;
            const int nb = (cases[c].nb + per - 1) / per * per;
            float *x = malloc(sizeof(float) * 32 * (size_t)nb);
            for (int b = 0; b < nb; b++)
                for (int j = 0; j < 32; j++) x[32 * b + j] = cases[c].fill(b, j);
            same_on_every_isa(t, x, 32 * (int64_t)nb, cases[c].name);
            /* and rows of 1..9 blocks of t from every start (a kernel's first, only and last blocks) */
            const int bs = 32 * per;
            for (int b = 0; b + 1 <= nb / per && b < 40; b++)
                same_on_every_isa(t, x + (size_t)bs * b, (int64_t)bs * (1 + b % 9 < nb / per - b ? 1 + b % 9 : 1),
                                  cases[c].name);
            free(x);
        }
    }
}

/* ---- 3. the reference's NaN rule, by hand ----------------------------------- */

/* q8_0 block fields: the f16 scale bits and quant j. */
static uint16_t q8_d(const uint8_t *blk) { return (uint16_t)(blk[0] | blk[1] << 8); }
static int q8_q(const uint8_t *blk, int j) { return (int8_t)blk[2 + j]; }

static void test_nan_rule(void) {
    float x[32];
    uint8_t q[34];
    for (int k = 0; k < 3; k++) {
        if (!moe_quant_isa_supported(ISAS[k])) continue;
        moe_quant_set_isa(ISAS[k]);
        const char *isa = moe_quant_isa_str(ISAS[k]);
        /* the last NaN at 3: elements 0..2 (1000) do not count, amax = |x[31]| = 31 */
        for (int j = 0; j < 32; j++) x[j] = j < 3 ? 1000.0f : (float)j;
        x[3] = NAN;
        CHECK(moe_quantize_row(MOE_QTYPE_Q8_0, x, q, 32) == MOE_OK, "quantize");
        CHECK(q8_d(q) == moe_f32_to_f16(31.0f / 127.0f) && q8_q(q, 31) == 127 && q8_q(q, 3) == 0 &&
                  q8_q(q, 0) == 1 /* roundf(1000 * 127/31) = 4097: low byte 1 */,
              "[%s] NaN at 3: d %04x, q31 %d, q3 %d, q0 %d", isa, q8_d(q), q8_q(q, 31), q8_q(q, 3), q8_q(q, 0));
        /* a NaN last: d is NaN (stored 0x7e00), every quant 0 */
        for (int j = 0; j < 32; j++) x[j] = (float)(j + 1);
        x[31] = from_bits(0xffc01234u);
        CHECK(moe_quantize_row(MOE_QTYPE_Q8_0, x, q, 32) == MOE_OK, "quantize");
        int nz = 0;
        for (int j = 0; j < 32; j++) nz += q8_q(q, j) != 0;
        CHECK(q8_d(q) == 0x7e00 && nz == 0, "[%s] NaN last: d %04x, %d quants not 0", isa, q8_d(q), nz);
        /* an infinity: d = inf, 1/d = 0, inf * 0 = NaN -> 0, the rest 0 */
        for (int j = 0; j < 32; j++) x[j] = (float)(j + 1);
        x[7] = -INFINITY;
        CHECK(moe_quantize_row(MOE_QTYPE_Q8_0, x, q, 32) == MOE_OK, "quantize");
        nz = 0;
        for (int j = 0; j < 32; j++) nz += q8_q(q, j) != 0;
        CHECK(q8_d(q) == 0x7c00 && nz == 0, "[%s] inf: d %04x, %d quants not 0", isa, q8_d(q), nz);
        /* ties round away from zero: amax 127 -> d 1, x = 2.5 -> 3, -2.5 -> -3, 0.5 -> 1 */
        for (int j = 0; j < 32; j++) x[j] = 0.0f;
        x[0] = 127.0f, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.5f, x[4] = -0.49999997f;
        CHECK(moe_quantize_row(MOE_QTYPE_Q8_0, x, q, 32) == MOE_OK, "quantize");
        CHECK(q8_d(q) == 0x3c00 && q8_q(q, 0) == 127 && q8_q(q, 1) == 3 && q8_q(q, 2) == -3 && q8_q(q, 3) == 1 &&
                  q8_q(q, 4) == 0,
              "[%s] ties: d %04x q %d %d %d %d %d", isa, q8_d(q), q8_q(q, 0), q8_q(q, 1), q8_q(q, 2), q8_q(q, 3),
              q8_q(q, 4));
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
}

int main(void) {
    moe_test_rng = 0x243f6a8885a308d3ull; /* this test's sequence */
    printf("ISAs here:");
    for (int k = 0; k < 3; k++)
        if (moe_quant_isa_supported(ISAS[k])) printf(" %s", moe_quant_isa_str(ISAS[k]));
    printf("\n");
    test_random_rows();
    test_corners();
    test_nan_rule();
    printf("test-quant-rows: %d rows, %d SIMD comparisons; %s (%d failure%s)\n", g_rows, g_isa_rows,
           fails ? "FAILED" : "ok", fails, fails == 1 ? "" : "s");
    return fails != 0;
}

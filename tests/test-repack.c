/*
 * test-repack.c - the row-interleaved runtime layouts q4_k_r16 and q8_0_r16
 * (moe_repack, formats/quant-pack.c) and their integer kernels (quant-int*.c),
 * each of the following for both.
 *
 *   1. Layout: moe_repack then moe_unpack_row gives every stored row back byte
 *      for byte (and moe_dequantize_row_of its floats); repacking to the type itself is a copy; the size functions
 *      answer as for q4_k while moe_qtype_valid, moe_qtype_from_name and the
 *      row functions refuse the layout.
 *   2. moe_repack_type picks q4_k_r16 exactly for q4_k matrices of whole
 *      16-row groups, and only under a kernel table with a vector kernel
 *      (AVX2, AVX-512 VNNI; not the scalar table).
 *   3. moe_mat_dot_act on the repacked matrix, every ISA this CPU runs, 1..9
 *      activations (every tile shape and leftovers), both output layouts, rows
 *      of 1, 2 and 8 super-blocks, and matrices large enough for several row
 *      chunks: the scalar table gives exactly the bits of moe_vec_dot_act on
 *      the stored rows; vector kernels are within the tolerance of
 *      moe-quant.h ((n/32 + 10) 2^-24 M) of them. A slice of groups gives the
 *      bits of the same rows of the whole product (threads split by groups).
 *   4. moe_gate_up_act on repacked gate/up: exactly silu(g) * u of
 *      moe_mat_dot_act's g and u on the same layout.
 *   5. Bad arguments: row counts or strides that are not whole groups, a row
 *      dot on the layout, impossible layouts, NULL pointers: errors, logged.
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
/* The stored type and its layout under test (q4_k / q4_k_r16, then q8_0 / q8_0_r16). */
static enum moe_qtype ST, LY;


static int g_logs;
static void count_log(enum moe_log_level level, const char *msg, void *user) {
    (void)msg, (void)user;
    if (level == MOE_LOG_ERROR) g_logs++;
}

/* A q4_k matrix of nw rows of n: quantized N(0,1) rows, with every 7th row
 * random bytes (sane f16 scales) so that all scale and min bits occur. */
static uint8_t *make_matrix(int64_t nw, int64_t n) {
    const size_t rb = moe_qtype_row_bytes(ST, n);
    uint8_t *w = malloc((size_t)nw * rb);
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t r = 0; r < nw; r++) {
        uint8_t *row = w + (size_t)r * rb;
        if (r % 7 == 3) {
            for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)moe_test_rnd64();
            for (size_t o = 0; o < rb; o += moe_qtype_block_bytes(ST)) { /* d (and q4_k's dmin) first */
                const uint16_t d = moe_f32_to_f16(moe_test_rnd_normal() * 0.01f), m = moe_f32_to_f16(moe_test_rnd_normal() * 0.01f);
                memcpy(row + o, &d, 2);
                if (ST == MOE_QTYPE_Q4_K) memcpy(row + o + 2, &m, 2);
            }
            continue;
        }
        for (int64_t i = 0; i < n; i++) x[i] = moe_test_rnd_normal();
        CHECK(moe_quantize_row(ST, x, row, n) == MOE_OK, "quantize row");
    }
    free(x);
    return w;
}

/* M = sum |d sc q| |xd| + |dmin m| |xd| over a stored row: the magnitude the
 * SIMD tolerance is relative to (moe-quant.h). */
static double magnitude(const uint8_t *row, const uint8_t *xq, int64_t n) {
    double m = 0;
    if (ST == MOE_QTYPE_Q8_0) {
        for (int64_t i = 0; i < n / 32; i++) {
            const uint8_t *b = row + i * sizeof(moe_block_q8_0), *xb = xq + i * sizeof(moe_block_q8_0);
            uint16_t hd, hx;
            memcpy(&hd, b, 2);
            memcpy(&hx, xb, 2);
            for (int j = 0; j < 32; j++)
                m += fabs((double)moe_f16_to_f32(hd) * ((const int8_t *)(b + 2))[j]) *
                     fabs((double)moe_f16_to_f32(hx) * ((const int8_t *)(xb + 2))[j]);
        }
        return m;
    }
    for (int64_t i = 0; i < n / 256; i++) {
        const uint8_t *b = row + i * sizeof(moe_block_q4_K), *xb = xq + i * sizeof(moe_block_q8_K);
        uint16_t hd, hm;
        float dx;
        memcpy(&hd, b, 2);
        memcpy(&hm, b + 2, 2);
        memcpy(&dx, xb, 4);
        const double d = moe_f16_to_f32(hd), dmin = moe_f16_to_f32(hm);
        for (int j = 0; j < 256; j++) {
            uint8_t sc, mn;
            moe_q4k_scale_min(j / 32, b + 4, &sc, &mn);
            const int q = (b[16 + 32 * (j / 64) + j % 32] >> (4 * ((j / 32) % 2))) & 15;
            const double xd = fabs((double)dx * ((const int8_t *)(xb + 4))[j]);
            m += (fabs(d * sc * q) + fabs(dmin * mn)) * xd;
        }
    }
    return m;
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_layout(void) {
    static const int64_t shapes[][2] = {{16, 256}, {32, 512}, {48, 2048}};
    for (int s = 0; s < 3; s++) {
        const int64_t nw = shapes[s][0], n = shapes[s][1];
        const size_t rb = moe_qtype_row_bytes(ST, n);
        uint8_t *w = make_matrix(nw, n), *p = malloc((size_t)nw * rb), *c = malloc((size_t)nw * rb);
        uint8_t *row = malloc(rb);
        float *f1 = malloc((size_t)n * 4), *f2 = malloc((size_t)n * 4);
        CHECK(moe_repack(ST, LY, nw, n, w, p) == MOE_OK, "repack %lld x %lld", (long long)nw, (long long)n);
        CHECK(memcmp(w, p, (size_t)nw * rb) != 0, "the layout differs from the rows");
        for (int64_t r = 0; r < nw; r++) {
            CHECK(moe_unpack_row(LY, n, p, r, row) == MOE_OK && memcmp(row, w + (size_t)r * rb, rb) == 0,
                  "row %lld of %lld x %lld comes back", (long long)r, (long long)nw, (long long)n);
            CHECK(moe_unpack_row(ST, n, w, r, row) == MOE_OK && memcmp(row, w + (size_t)r * rb, rb) == 0,
                  "stored row %lld", (long long)r);
            CHECK(moe_dequantize_row_of(LY, n, p, r, f1) == MOE_OK &&
                      moe_dequantize_row(ST, w + (size_t)r * rb, f2, n) == MOE_OK && memcmp(f1, f2, (size_t)n * 4) == 0,
                  "row %lld of the layout dequantizes as the stored row", (long long)r);
        }
        CHECK(moe_repack(ST, ST, nw, n, w, c) == MOE_OK && memcmp(w, c, (size_t)nw * rb) == 0, "same type: a copy");
        /* in place through a scratch of one group: moe_repack's bytes */
        uint8_t *tmp = malloc(16 * rb);
        memcpy(c, w, (size_t)nw * rb);
        CHECK(moe_repack_in_place(ST, LY, nw, n, c, tmp, 16 * rb) == MOE_OK && memcmp(c, p, (size_t)nw * rb) == 0,
              "in place %lld x %lld: the bytes of moe_repack", (long long)nw, (long long)n);
        memcpy(c, w, (size_t)nw * rb);
        CHECK(moe_repack_in_place(ST, LY, nw, n, c, tmp, 16 * rb - 1) == MOE_ERR_INVALID && memcmp(c, w, (size_t)nw * rb) == 0,
              "in place: a scratch under one group is refused, the matrix untouched");
        CHECK(moe_repack_in_place(ST, ST, nw, n, c, tmp, 0) == MOE_OK && memcmp(c, w, (size_t)nw * rb) == 0,
              "in place to the same type: nothing to do");
        free(tmp);
        free(w), free(p), free(c), free(row), free(f1), free(f2);
    }
    CHECK(moe_qtype_row_bytes(LY, 512) == moe_qtype_row_bytes(ST, 512) && moe_qtype_block_size(LY) == moe_qtype_block_size(ST) &&
              moe_qtype_block_bytes(LY) == moe_qtype_block_bytes(ST) && moe_act_row_bytes(LY, 512) == moe_act_row_bytes(ST, 512),
          "%s: sizes as %s", moe_qtype_name(LY), moe_qtype_name(ST));
    CHECK(moe_qtype_group_rows(LY) == 16 && moe_qtype_group_rows(ST) == 1 && moe_qtype_group_rows((enum moe_qtype)3) == 0,
          "group rows");
    CHECK(moe_stored_type(LY) == ST && moe_stored_type(MOE_QTYPE_Q6_K) == MOE_QTYPE_Q6_K, "stored type");
    CHECK(!moe_qtype_valid(LY), "not a file type");
    char name[32];
    snprintf(name, sizeof name, "%s_r16", moe_qtype_name(ST));
    CHECK(strcmp(moe_qtype_name(LY), name) == 0, "name %s", moe_qtype_name(LY));
}

static void test_repack_type(void) {
    for (int a = 0; a < 3; a++) {
        if (!moe_quant_isa_supported(ISAS[a])) continue;
        moe_quant_set_isa(ISAS[a]);
        /* q4_k_r16 on AVX2 and AVX-512; q8_0_r16 needs VNNI (vpdpbusd: the
         * unsigned x signed products of q + 128 do not fit vpmaddubsw's int16) */
        const char *isa = moe_quant_int_isa_name();
        const int vec = ST == MOE_QTYPE_Q4_K ? strcmp(isa, "scalar") != 0 : strcmp(isa, "avx512vnni") == 0;
        CHECK(moe_repack_type(ST, 64, 512) == (vec ? LY : ST), "[%s] %s 64 x 512", isa, moe_qtype_name(ST));
        CHECK(moe_repack_type(ST, 40, 512) == ST, "[%s] 40 rows stay", isa);
        CHECK(moe_repack_type(MOE_QTYPE_Q6_K, 64, 512) == MOE_QTYPE_Q6_K, "q6_k stays");
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
}

/* Products of a repacked matrix against nx activations on every ISA. */
static void check_products(int64_t nw, int64_t n, int nx, double *worst) {
    const size_t rb = moe_qtype_row_bytes(ST, n), ab = moe_act_row_bytes(ST, n);
    uint8_t *w = make_matrix(nw, n), *p = malloc((size_t)nw * rb), *xq = malloc((size_t)nx * ab);
    float *x = malloc((size_t)n * sizeof *x), *ref = malloc((size_t)nw * nx * sizeof *ref);
    float *out = malloc((size_t)nw * nx * sizeof *out), *out2 = malloc((size_t)nw * nx * sizeof *out2);
    double *mag = malloc((size_t)nw * nx * sizeof *mag);
    CHECK(moe_repack(ST, LY, nw, n, w, p) == MOE_OK, "repack");
    moe_quant_set_isa(MOE_QUANT_ISA_SCALAR);
    for (int c = 0; c < nx; c++) {
        for (int64_t i = 0; i < n; i++) x[i] = moe_test_rnd_normal() * (i % 61 == 0 ? 20.0f : 1.0f);
        CHECK(moe_quantize_act(ST, x, xq + (size_t)c * ab, n) == MOE_OK, "quantize act");
    }
    for (int64_t r = 0; r < nw; r++)
        for (int c = 0; c < nx; c++) {
            ref[r * nx + c] = moe_vec_dot_act(ST, w + (size_t)r * rb, xq + (size_t)c * ab, n);
            mag[r * nx + c] = magnitude(w + (size_t)r * rb, xq + (size_t)c * ab, n);
        }
    for (int a = 0; a < 3; a++) {
        if (!moe_quant_isa_supported(ISAS[a])) continue;
        moe_quant_set_isa(ISAS[a]);
        const char *isa = moe_quant_int_isa_name();
        for (int layout = 0; layout < 2; layout++) { /* out[r * nx + c] or out[c * nw + r] */
            const size_t osw = layout ? 1 : (size_t)nx, osx = layout ? (size_t)nw : 1;
            CHECK(moe_mat_dot_act(LY, n, p, rb, nw, xq, ab, nx, out, osw, osx) == MOE_OK, "mat_dot r16");
            int bad = 0;
            for (int64_t r = 0; r < nw && !bad; r++)
                for (int c = 0; c < nx && !bad; c++) {
                    const float got = out[r * (int64_t)osw + c * (int64_t)osx], want = ref[r * nx + c];
                    const double tol = ((double)n / 32 + 10) * 0x1p-24 * mag[r * nx + c];
                    if (a == 0) {
                        bad = !same_bits(got, want);
                        CHECK(!bad, "[%s] %lld x %lld, %d acts: row %lld act %d: %.9g, stored rows give %.9g", isa,
                              (long long)nw, (long long)n, nx, (long long)r, c, got, want);
                    } else {
                        const double e = fabs((double)got - want);
                        bad = !(e <= tol);
                        CHECK(!bad, "[%s] %lld x %lld, %d acts: row %lld act %d: %.9g vs %.9g (tol %.3g)", isa,
                              (long long)nw, (long long)n, nx, (long long)r, c, got, want, tol);
                        if (mag[r * nx + c] > 0 && e / mag[r * nx + c] > worst[a]) worst[a] = e / mag[r * nx + c];
                    }
                }
        }
        /* a slice of groups, as a thread gets it, gives the same bits */
        if (nw >= 32) {
            CHECK(moe_mat_dot_act(LY, n, p, rb, nw, xq, ab, nx, out, (size_t)nx, 1) == MOE_OK, "whole");
            CHECK(moe_mat_dot_act(LY, n, p + 16 * rb, rb, nw - 16, xq, ab, nx, out2, (size_t)nx, 1) == MOE_OK, "slice");
            CHECK(memcmp(out + 16 * nx, out2, (size_t)(nw - 16) * nx * sizeof *out) == 0,
                  "[%s] rows 16.. alone give the bits of the whole product", isa);
        }
        /* gate/up: silu(g) * u of the same layout's products, bit for bit */
        if (nw <= 512) {
            uint8_t *u = make_matrix(nw, n), *pu = malloc((size_t)nw * rb);
            float *h = malloc((size_t)nw * nx * sizeof *h), *uo = malloc((size_t)nw * nx * sizeof *uo);
            CHECK(moe_repack(ST, LY, nw, n, u, pu) == MOE_OK, "repack up");
            CHECK(moe_gate_up_act(LY, n, p, pu, nw, xq, ab, nx, h, (size_t)nw) == MOE_OK, "gate_up r16");
            CHECK(moe_mat_dot_act(LY, n, p, rb, nw, xq, ab, nx, out, 1, (size_t)nw) == MOE_OK, "g");
            CHECK(moe_mat_dot_act(LY, n, pu, rb, nw, xq, ab, nx, uo, 1, (size_t)nw) == MOE_OK, "u");
            int bad = 0;
            for (int64_t i = 0; i < nw * nx && !bad; i++) {
                const float g = out[i], want = g / (1.0f + expf(-g)) * uo[i];
                bad = !same_bits(h[i], want);
                CHECK(!bad, "[%s] gate_up %lld: %.9g vs silu(g) u %.9g", isa, (long long)i, h[i], want);
            }
            free(u), free(pu), free(h), free(uo);
        }
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
    free(w), free(p), free(xq), free(x), free(ref), free(out), free(out2), free(mag);
}

static void test_products(void) {
    double worst[3] = {0};
    static const int64_t shapes[][2] = {{16, 256}, {48, 512}, {64, 2048}, {4096, 512}};
    for (int s = 0; s < 4; s++)
        for (int nx = 1; nx <= 9; nx += (s == 3 ? 4 : 1)) check_products(shapes[s][0], shapes[s][1], nx, worst);
    for (int a = 1; a < 3; a++)
        if (moe_quant_isa_supported(ISAS[a])) {
            moe_quant_set_isa(ISAS[a]);
            printf("  %s [%s]: worst |diff| / M against the stored rows %.2e (tolerance (n/32 + 10) 2^-24)\n",
                   moe_qtype_name(LY), moe_quant_int_isa_name(), worst[a]);
        }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
}

static void test_errors(void) {
    moe_log_set(count_log, NULL);
    g_logs = 0;
    int expected = 0;
    const int64_t n = 512;
    const size_t rb = moe_qtype_row_bytes(ST, n);
    uint8_t *w = make_matrix(32, n), *p = malloc(32 * rb), *xq = calloc(1, moe_act_row_bytes(ST, n));
    float out[64], x[512] = {0}, y[512];
    CHECK(moe_repack(ST, LY, 32, n, w, p) == MOE_OK, "repack");
    CHECK(moe_mat_dot_act(LY, n, p, rb, 24, xq, 0, 1, out, 1, 1) == MOE_ERR_INVALID, "24 rows");
    expected++;
    CHECK(moe_mat_dot_act(LY, n, p, rb + 1, 16, xq, 0, 1, out, 1, 1) == MOE_ERR_INVALID, "stride");
    expected++;
    CHECK(moe_gate_up_act(LY, n, p, p, 8, xq, 0, 1, out, 8) == MOE_ERR_INVALID, "gate_up 8 rows");
    expected++;
    CHECK(isnan(moe_vec_dot_act(LY, p, xq, n)), "row dot on the layout");
    expected++;
    CHECK(moe_repack(ST, LY, 24, n, w, p) == MOE_ERR_INVALID, "24 rows repack");
    expected++;
    CHECK(moe_repack(MOE_QTYPE_Q6_K, LY, 32, n, w, p) == MOE_ERR_INVALID, "q6_k to the layout");
    expected++;
    CHECK(moe_repack(LY, ST, 32, n, p, w) == MOE_ERR_INVALID, "from the layout");
    expected++;
    CHECK(moe_repack(ST, LY, 32, n, NULL, p) == MOE_ERR_INVALID, "NULL src");
    expected++;
    CHECK(moe_unpack_row(LY, n, p, -1, y) == MOE_ERR_INVALID, "row -1");
    expected++;
    CHECK(moe_unpack_row((enum moe_qtype)3, n, p, 0, y) == MOE_ERR_INVALID, "bad type");
    expected++;
    CHECK(moe_dequantize_row(LY, p, y, n) == MOE_ERR_INVALID, "dequantize the layout");
    expected++;
    CHECK(moe_quantize_row(LY, x, p, n) == MOE_ERR_INVALID, "quantize to the layout");
    expected++;
    enum moe_qtype t = ST;
    CHECK(moe_qtype_from_name(moe_qtype_name(LY), &t) == MOE_ERR_INVALID && t == ST, "not a name to ask for");
    expected++;
    CHECK(g_logs == expected, "every error logged (%d logs, %d errors)", g_logs, expected);
    moe_log_set(NULL, NULL);
    free(w), free(p), free(xq);
}

int main(void) {
    moe_test_rng = 0x243f6a8885a308d3ull; /* this test's sequence */
    printf("ISAs: avx2 %s, avx512 %s; integer kernels in use: %s\n",
           moe_quant_isa_supported(MOE_QUANT_ISA_AVX2) ? "yes" : "no (untested)",
           moe_quant_isa_supported(MOE_QUANT_ISA_AVX512) ? "yes" : "no (untested)", moe_quant_int_isa_name());
    static const enum moe_qtype pairs[][2] = {{MOE_QTYPE_Q4_K, MOE_QTYPE_Q4_K_R16}, {MOE_QTYPE_Q8_0, MOE_QTYPE_Q8_0_R16}};
    for (int k = 0; k < 2; k++) {
        ST = pairs[k][0], LY = pairs[k][1];
        test_layout();
        test_repack_type();
        test_products();
        test_errors();
    }
    printf("test-repack: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}

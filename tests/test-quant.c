/*
 * test-quant.c - quantization formats (formats/quant*.c).
 *
 *   1. Type table: names, ids, block sizes, bits per weight, row sizes. The
 *      rows of struct moe_type_traits (test_traits): every id's row against an
 *      expected table written here (block bytes = sizeof of the block structs),
 *      against the functions that read it, and against its invariants (layouts
 *      map both ways, file types = the names moe_qtype_from_name accepts); each
 *      reference kernel round-trips a random row within the type's error
 *      bound, and every single-field mutation of a row is caught.
 *   2. Oracle fixtures (tests/fixtures/quant, made by
 *      tests/oracle/make_quant_fixtures.py): moe_quantize_row must give exactly
 *      gguf's bytes (f16, bf16, q8_0, q4_0) or ggml's reference bytes (k-quants),
 *      and moe_dequantize_row exactly gguf's floats, on every ISA this CPU runs.
 *      The scalar moe_vec_dot must equal its definition, (float) of the double
 *      sum of v[i]*x[i] over the oracle's floats v, bit for bit.
 *      Bulk: 64 rows x 4096 per type, generated identically here and in the
 *      generator, checked against hashes of the oracle's bytes and floats.
 *   3. SIMD vs scalar on random rows of many lengths: dequantize bit-identical,
 *      dot within (n/32 + 10) * 2^-24 * sum|v x| (see moe-quant.h).
 *   4. Error bounds: relative RMSE of dequantize(quantize(x)) on N(0,1) rows and
 *      on real weights stays below the bounds in ERR_BOUND.
 *   5. Malformed input: bad lengths, types, NULL pointers, non-finite values and
 *      garbage blocks return errors or well-defined results, never crash.
 *   6. Activation quantizers (moe_quantize_act): bit-identical to gguf's q8_0 and
 *      ggml's q8_k on the act.bin fixture (tests/oracle/make_act_fixtures.py) and
 *      to the scalar quantizers on many rows, on every ISA; quants never -128.
 *   7. Integer dots (moe_vec_dot_act): the scalar path equals its definition (the
 *      real dot of the weights with the dequantized activation) within 4 * 2^-24 * M;
 *      SIMD within (n/32 + 10) * 2^-24 * M of scalar (moe-quant.h); ggml's generic
 *      dots (act.bin) within twice that; the float dot with unquantized
 *      activations within the activation-quantization bound. moe_mat_dot_act
 *      (every tile shape) and moe_gate_up_act give exactly the single dots' bits.
 *   8. Malformed arguments of the activation functions.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-dtype.h"
#include "moe-quant.h"

#ifndef MOE_FIXTURES
#define MOE_FIXTURES "tests/fixtures"
#endif

#include "moe-test.h"

/* CHECK from moe-test.h, also counting the checks made for the summary line. */
static int checks;
#define QCHECK(...)         \
    do {                    \
        checks++;           \
        CHECK(__VA_ARGS__); \
    } while (0)

static const enum moe_qtype ALL[] = {MOE_QTYPE_F32,  MOE_QTYPE_F16,  MOE_QTYPE_BF16, MOE_QTYPE_Q8_0,
                                     MOE_QTYPE_Q4_0, MOE_QTYPE_Q2_K, MOE_QTYPE_Q3_K, MOE_QTYPE_Q4_K,
                                     MOE_QTYPE_Q5_K, MOE_QTYPE_Q6_K, MOE_QTYPE_Q8_K, MOE_QTYPE_MXFP4};
#define NTYPES (int)(sizeof ALL / sizeof ALL[0])

/*
 * Relative RMSE bounds of dequantize(quantize(x)), rms(err)/rms(x), checked on
 * N(0,1) rows and on the real-weight rows of the fixture (stories260K). Measured
 * (identical for ggml's reference quantizers, which give the same bytes; the
 * real-row figures are in tests/fixtures/quant/stats.txt):
 *   type   N(0,1), 64 x 4096   real rows, 4 x 512   bound
 *   q8_0   0.0054              0.0053-0.0056        0.0060
 *   q4_0   0.086               0.084-0.091          0.095
 *   q2_k   0.296               0.306-0.357          0.37
 *   q3_k   0.151               0.151-0.190          0.20
 *   q4_k   0.071               0.070-0.086          0.090
 *   q5_k   0.036               0.037-0.044          0.046
 *   q6_k   0.018               0.017-0.022          0.024
 *   q8_k   0.0070              0.0061-0.0090        0.0095
 *   f16    0.00021             -                    0.00025
 *   bf16   0.0017              -                    0.0020
 *   mxfp4  0.115               0.104-0.122          0.14
 */
static double err_bound(enum moe_qtype t) {
    switch (t) {
    case MOE_QTYPE_F32: return 0.0;
    case MOE_QTYPE_F16: return 2.5e-4;
    case MOE_QTYPE_BF16: return 2.0e-3;
    case MOE_QTYPE_Q8_0: return 0.0060;
    case MOE_QTYPE_Q4_0: return 0.095;
    case MOE_QTYPE_Q2_K: return 0.37;
    case MOE_QTYPE_Q3_K: return 0.20;
    case MOE_QTYPE_Q4_K: return 0.090;
    case MOE_QTYPE_Q5_K: return 0.046;
    case MOE_QTYPE_Q6_K: return 0.024;
    case MOE_QTYPE_Q8_K: return 0.0095;
    case MOE_QTYPE_MXFP4: return 0.14;
    case MOE_QTYPE_Q4_K_R16:
    case MOE_QTYPE_Q8_0_R16: return 0.0; /* layouts, not quantized on their own (test-repack) */
    }
    return 0.0;
}

/* ---- deterministic random numbers --------------------------------------- */

static void fill_normal(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = moe_test_rnd_normal() * scale;
}

/* ---- helpers ------------------------------------------------------------ */

static const enum moe_quant_isa ISAS[] = {MOE_QUANT_ISA_SCALAR, MOE_QUANT_ISA_AVX2, MOE_QUANT_ISA_AVX512};

/* Bitwise float comparison; NaNs compare equal to NaNs (payloads may differ). */
static int64_t count_bit_diffs(const float *a, const float *b, int64_t n, int64_t *first) {
    int64_t d = 0;
    *first = -1;
    if (n <= 0) return 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t ua, ub;
        memcpy(&ua, a + i, 4);
        memcpy(&ub, b + i, 4);
        if (ua == ub || (isnan(a[i]) && isnan(b[i]))) continue;
        if (*first < 0) *first = i;
        d++;
    }
    return d;
}

/* The definition of moe_vec_dot applied to already dequantized floats v. */
static float dot_definition(const float *v, const float *x, int64_t n, double *sum_abs) {
    double acc = 0.0, sa = 0.0;
    for (int64_t i = 0; i < n; i++) {
        acc += (double)v[i] * (double)x[i];
        sa += fabs((double)v[i] * (double)x[i]);
    }
    if (sum_abs) *sum_abs = sa;
    return (float)acc;
}

static double dot_tolerance(int64_t n, double sum_abs) {
    return ((double)n / 32.0 + 10.0) * 0x1p-24 * sum_abs;
}

static double rel_rmse(const float *x, const float *y, int64_t n) {
    double se = 0, sx = 0;
    for (int64_t i = 0; i < n; i++) {
        se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        sx += (double)x[i] * x[i];
    }
    return sx > 0 ? sqrt(se / sx) : sqrt(se / (double)(n ? n : 1));
}

static int g_logs;
static void count_log(enum moe_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
    g_logs++;
}

/* ---- 1. type table ------------------------------------------------------- */

static void test_table(void) {
    static const struct {
        enum moe_qtype t;
        int id;
        const char *name;
        int block;
        size_t bytes;
        double bpw;
    } want[] = {
        {MOE_QTYPE_F32, 0, "f32", 1, 4, 32},        {MOE_QTYPE_F16, 1, "f16", 1, 2, 16},
        {MOE_QTYPE_Q4_0, 2, "q4_0", 32, 18, 4.5},   {MOE_QTYPE_Q8_0, 8, "q8_0", 32, 34, 8.5},
        {MOE_QTYPE_Q2_K, 10, "q2_k", 256, 84, 2.625}, {MOE_QTYPE_Q3_K, 11, "q3_k", 256, 110, 3.4375},
        {MOE_QTYPE_Q4_K, 12, "q4_k", 256, 144, 4.5}, {MOE_QTYPE_Q5_K, 13, "q5_k", 256, 176, 5.5},
        {MOE_QTYPE_Q6_K, 14, "q6_k", 256, 210, 6.5625}, {MOE_QTYPE_Q8_K, 15, "q8_k", 256, 292, 9.125},
        {MOE_QTYPE_BF16, 30, "bf16", 1, 2, 16},     {MOE_QTYPE_MXFP4, 39, "mxfp4", 32, 17, 4.25},
    };
    int nvalid = 0;
    for (int t = -3; t < MOE_QTYPE_LIMIT + 3; t++) nvalid += moe_qtype_valid((enum moe_qtype)t);
    QCHECK(nvalid == (int)(sizeof want / sizeof want[0]), "%d valid types", nvalid);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        enum moe_qtype t = want[i].t, back;
        QCHECK((int)t == want[i].id, "%s has id %d", want[i].name, (int)t);
        QCHECK(strcmp(moe_qtype_name(t), want[i].name) == 0, "name of %d", want[i].id);
        QCHECK(moe_qtype_from_name(want[i].name, &back) == MOE_OK && back == t, "parse %s", want[i].name);
        char upper[16];
        for (int k = 0; k < 16; k++) {
            char c = want[i].name[k];
            upper[k] = (char)(c >= 'a' && c <= 'z' ? c - 32 : c);
            if (!c) break;
        }
        QCHECK(moe_qtype_from_name(upper, &back) == MOE_OK && back == t, "parse %s", upper);
        QCHECK(moe_qtype_block_size(t) == want[i].block, "%s block", want[i].name);
        QCHECK(moe_qtype_block_bytes(t) == want[i].bytes, "%s bytes", want[i].name);
        QCHECK(moe_qtype_bits_per_weight(t) == want[i].bpw, "%s bpw %g", want[i].name,
              moe_qtype_bits_per_weight(t));
        QCHECK(moe_qtype_row_bytes(t, 4096) == 4096 / want[i].block * want[i].bytes, "%s row", want[i].name);
        QCHECK(moe_qtype_row_bytes(t, 0) == 0, "%s empty row", want[i].name);
        QCHECK(moe_qtype_row_bytes(t, -want[i].block) == 0, "%s negative row", want[i].name);
        if (want[i].block > 1)
            QCHECK(moe_qtype_row_bytes(t, want[i].block + 1) == 0, "%s ragged row", want[i].name);
    }
    QCHECK(moe_qtype_row_bytes(MOE_QTYPE_Q4_K, INT64_MAX - INT64_MAX % 256) != 0 ||
              sizeof(size_t) < 8,
          "huge row fits");
    QCHECK(moe_qtype_row_bytes(MOE_QTYPE_F32, INT64_MAX) == 0, "overflowing row");
    for (int bad = -1; bad < 40; bad++) {
        if (moe_qtype_valid((enum moe_qtype)bad) || moe_qtype_group_rows((enum moe_qtype)bad) > 1) continue; /* layouts: test-repack */
        QCHECK(moe_qtype_block_size((enum moe_qtype)bad) == 0 && moe_qtype_block_bytes((enum moe_qtype)bad) == 0 &&
                  moe_qtype_row_bytes((enum moe_qtype)bad, 256) == 0 &&
                  moe_qtype_bits_per_weight((enum moe_qtype)bad) == 0 &&
                  strcmp(moe_qtype_name((enum moe_qtype)bad), "?") == 0,
              "invalid type %d", bad);
    }
    enum moe_qtype out = MOE_QTYPE_F32;
    moe_log_set(count_log, NULL);
    g_logs = 0;
    QCHECK(moe_qtype_from_name("q4_1", &out) == MOE_ERR_INVALID && out == MOE_QTYPE_F32, "q4_1 unknown");
    QCHECK(moe_qtype_from_name("", &out) == MOE_ERR_INVALID, "empty name");
    QCHECK(moe_qtype_from_name(NULL, &out) == MOE_ERR_INVALID, "NULL name");
    QCHECK(moe_qtype_from_name("q8_0", NULL) == MOE_ERR_INVALID, "NULL out");
    QCHECK(g_logs == 4, "each error logged once (%d)", g_logs);
    moe_log_set(NULL, NULL);
}

/* ---- 1b. the type table's rows (struct moe_type_traits) ------------------ */

/* What each row must say, written out here independently of formats/quant.c:
 * ggml's ids and names, block bytes as the sizeof of the block structs in
 * moe-quant.h, the activation type of each integer dot (moe-quant.h's table),
 * and the two runtime layouts. */
static const struct traits_want {
    enum moe_qtype t;
    const char *name;
    int block;
    size_t bytes;
    int file;
    enum moe_qtype act, stored, repack;
    int group;
} TRAITS_WANT[] = {
    {MOE_QTYPE_F32, "f32", 1, sizeof(float), 1, MOE_QTYPE_F32, MOE_QTYPE_F32, MOE_QTYPE_F32, 1},
    {MOE_QTYPE_F16, "f16", 1, sizeof(moe_f16_bits), 1, MOE_QTYPE_F32, MOE_QTYPE_F16, MOE_QTYPE_F16, 1},
    {MOE_QTYPE_BF16, "bf16", 1, sizeof(uint16_t), 1, MOE_QTYPE_F32, MOE_QTYPE_BF16, MOE_QTYPE_BF16, 1},
    {MOE_QTYPE_Q4_0, "q4_0", MOE_QK4_0, sizeof(moe_block_q4_0), 1, MOE_QTYPE_Q8_0, MOE_QTYPE_Q4_0, MOE_QTYPE_Q4_0, 1},
    {MOE_QTYPE_Q8_0, "q8_0", MOE_QK8_0, sizeof(moe_block_q8_0), 1, MOE_QTYPE_Q8_0, MOE_QTYPE_Q8_0,
     MOE_QTYPE_Q8_0_R16, 1},
    {MOE_QTYPE_Q2_K, "q2_k", MOE_QK_K, sizeof(moe_block_q2_K), 1, MOE_QTYPE_Q8_K, MOE_QTYPE_Q2_K, MOE_QTYPE_Q2_K, 1},
    {MOE_QTYPE_Q3_K, "q3_k", MOE_QK_K, sizeof(moe_block_q3_K), 1, MOE_QTYPE_Q8_K, MOE_QTYPE_Q3_K, MOE_QTYPE_Q3_K, 1},
    {MOE_QTYPE_Q4_K, "q4_k", MOE_QK_K, sizeof(moe_block_q4_K), 1, MOE_QTYPE_Q8_K, MOE_QTYPE_Q4_K,
     MOE_QTYPE_Q4_K_R16, 1},
    {MOE_QTYPE_Q5_K, "q5_k", MOE_QK_K, sizeof(moe_block_q5_K), 1, MOE_QTYPE_Q8_K, MOE_QTYPE_Q5_K, MOE_QTYPE_Q5_K, 1},
    {MOE_QTYPE_Q6_K, "q6_k", MOE_QK_K, sizeof(moe_block_q6_K), 1, MOE_QTYPE_Q8_K, MOE_QTYPE_Q6_K, MOE_QTYPE_Q6_K, 1},
    {MOE_QTYPE_Q8_K, "q8_k", MOE_QK_K, sizeof(moe_block_q8_K), 1, MOE_QTYPE_F32, MOE_QTYPE_Q8_K, MOE_QTYPE_Q8_K, 1},
    {MOE_QTYPE_MXFP4, "mxfp4", MOE_QK_MXFP4, sizeof(moe_block_mxfp4), 1, MOE_QTYPE_F32, MOE_QTYPE_MXFP4,
     MOE_QTYPE_MXFP4, 1},
    {MOE_QTYPE_Q4_K_R16, "q4_k_r16", MOE_QK_K, sizeof(moe_block_q4_K), 0, MOE_QTYPE_Q8_K, MOE_QTYPE_Q4_K,
     MOE_QTYPE_Q4_K_R16, 16},
    {MOE_QTYPE_Q8_0_R16, "q8_0_r16", MOE_QK8_0, sizeof(moe_block_q8_0), 0, MOE_QTYPE_Q8_0, MOE_QTYPE_Q8_0,
     MOE_QTYPE_Q8_0_R16, 16},
};
#define NWANT (int)(sizeof TRAITS_WANT / sizeof TRAITS_WANT[0])

static const struct traits_want *want_of(int t) {
    for (int i = 0; i < NWANT; i++)
        if ((int)TRAITS_WANT[i].t == t) return &TRAITS_WANT[i];
    return NULL;
}

/* Row length of the kernel round trip: whole blocks of every type. */
#define TRAITS_N 1024

/* One disagreement of a row (counted; printed when loud). */
#define TRAITS_BAD(cond, ...)                                                   \
    do {                                                                        \
        if (!(cond)) {                                                          \
            bad++;                                                              \
            if (loud) {                                                         \
                fprintf(stderr, "FAIL traits of %s: (%s) ", w->name, #cond);    \
                fprintf(stderr, __VA_ARGS__);                                   \
                fputc('\n', stderr);                                            \
            }                                                                   \
        }                                                                       \
    } while (0)

/* The reference kernels of row tr (type w->t, a file type) on one random row x:
 * quantize gives moe_quantize_row's bytes, dequantize moe_dequantize_row's
 * floats within err_bound of x, dot the definition of moe_vec_dot on those
 * floats, all bit for bit (the scalar ISA must be in use). Buffers are sized
 * for 32 bits a weight, so a row with another type's kernels of the same
 * block size stays inside them. Returns the number of disagreements. */
static int traits_kernels(const struct traits_want *w, const struct moe_type_traits *tr, int loud) {
    static float x[TRAITS_N], x2[TRAITS_N], y[TRAITS_N], y2[TRAITS_N];
    static uint8_t q[TRAITS_N * 4], q2[TRAITS_N * 4];
    int bad = 0;
    const int64_t nb = TRAITS_N / w->block;
    const size_t rb = (size_t)nb * w->bytes;
    moe_test_rng = 0x7a3b1e5d00000000ull + (uint64_t)w->t; /* the same row for a row and its mutations */
    fill_normal(x, TRAITS_N, 1.0f);
    fill_normal(x2, TRAITS_N, 1.0f);
    memset(q, 0, sizeof q);
    memset(q2, 0, sizeof q2);
    tr->quantize(x, q, nb);
    TRAITS_BAD(moe_quantize_row(w->t, x, q2, TRAITS_N) == MOE_OK && memcmp(q, q2, sizeof q) == 0,
               "quantize gives moe_quantize_row's %zu bytes", rb);
    tr->dequantize(q2, y, nb);
    TRAITS_BAD(moe_dequantize_row(w->t, q2, y2, TRAITS_N) == MOE_OK, "moe_dequantize_row");
    int64_t first;
    const int64_t nd = count_bit_diffs(y, y2, TRAITS_N, &first);
    TRAITS_BAD(nd == 0, "dequantize gives moe_dequantize_row's floats (%lld differ)", (long long)nd);
    const double e = rel_rmse(x, y, TRAITS_N);
    TRAITS_BAD(e <= err_bound(w->t), "round trip error %.4g <= %.4g", e, err_bound(w->t));
    const float d = tr->dot(q2, x2, nb), want_d = dot_definition(y2, x2, TRAITS_N, NULL);
    TRAITS_BAD(memcmp(&d, &want_d, sizeof d) == 0, "dot %.9g = its definition %.9g", d, want_d);
    const float dv = moe_vec_dot(w->t, q2, x2, TRAITS_N);
    TRAITS_BAD(memcmp(&d, &dv, sizeof d) == 0, "dot %.9g = moe_vec_dot %.9g", d, dv);
    return bad;
}

/* Everything that row tr, claimed to be type t's, must satisfy: the expected
 * values above, the answers of the functions that read the table, the
 * invariants between rows, and (for a file type, when all that holds) its
 * kernels. Returns the number of disagreements; loud prints each. */
static int traits_problems(int t, const struct moe_type_traits *tr, int loud) {
    const struct traits_want *w = want_of(t);
    const enum moe_qtype q = (enum moe_qtype)t;
    if (!w) return tr != NULL;
    if (!tr) return 1;
    int bad = 0;
    /* the expected values */
    TRAITS_BAD(tr->name && strcmp(tr->name, w->name) == 0, "name %s", tr->name ? tr->name : "NULL");
    TRAITS_BAD(tr->block_size == w->block, "block size %d, want %d", tr->block_size, w->block);
    TRAITS_BAD(tr->block_bytes == w->bytes, "block bytes %zu, want sizeof = %zu", tr->block_bytes, w->bytes);
    TRAITS_BAD(tr->file_type == w->file, "file type %d", tr->file_type);
    TRAITS_BAD(tr->act_type == w->act, "activation type %d, want %d", (int)tr->act_type, (int)w->act);
    TRAITS_BAD(tr->group_rows == w->group, "group rows %d, want %d", tr->group_rows, w->group);
    TRAITS_BAD(tr->stored == w->stored, "stored type %d, want %d", (int)tr->stored, (int)w->stored);
    TRAITS_BAD(tr->repack == w->repack, "layout %d, want %d", (int)tr->repack, (int)w->repack);
    /* the functions that read the table */
    TRAITS_BAD(strcmp(moe_qtype_name(q), tr->name ? tr->name : "") == 0, "moe_qtype_name %s", moe_qtype_name(q));
    TRAITS_BAD(moe_qtype_block_size(q) == tr->block_size, "moe_qtype_block_size %d", moe_qtype_block_size(q));
    TRAITS_BAD(moe_qtype_block_bytes(q) == tr->block_bytes, "moe_qtype_block_bytes %zu", moe_qtype_block_bytes(q));
    TRAITS_BAD(moe_qtype_row_bytes(q, 4 * (int64_t)w->block) == 4 * tr->block_bytes, "moe_qtype_row_bytes");
    TRAITS_BAD(moe_qtype_bits_per_weight(q) == 8.0 * (double)tr->block_bytes / tr->block_size,
               "moe_qtype_bits_per_weight %g", moe_qtype_bits_per_weight(q));
    TRAITS_BAD(moe_qtype_valid(q) == tr->file_type, "moe_qtype_valid %d", moe_qtype_valid(q));
    TRAITS_BAD(moe_act_type(q) == tr->act_type, "moe_act_type %d", (int)moe_act_type(q));
    TRAITS_BAD(moe_qtype_group_rows(q) == tr->group_rows, "moe_qtype_group_rows %d", moe_qtype_group_rows(q));
    TRAITS_BAD(moe_stored_type(q) == tr->stored, "moe_stored_type %d", (int)moe_stored_type(q));
    enum moe_qtype back = MOE_QTYPE_LIMIT;
    const int parsed = tr->name && moe_qtype_from_name(tr->name, &back) == MOE_OK && back == q;
    TRAITS_BAD(parsed == tr->file_type, "moe_qtype_from_name(%s) accepts it: %d", tr->name ? tr->name : "NULL",
               parsed);
    /* invariants between rows */
    const struct moe_type_traits *st = moe_type_traits(tr->stored), *lt = moe_type_traits(tr->repack);
    const int kernels = tr->dequantize != NULL && tr->quantize != NULL && tr->dot != NULL;
    TRAITS_BAD((tr->group_rows == 1) == (tr->file_type == 1), "group rows 1 exactly for the file types");
    if (tr->file_type) {
        TRAITS_BAD(tr->stored == q, "a file type is its own stored type");
        TRAITS_BAD(tr->repack == q || (lt && !lt->file_type && lt->stored == q),
                   "its layout %d is a layout of it", (int)tr->repack);
        TRAITS_BAD(kernels, "a file type has its reference kernels");
    } else {
        TRAITS_BAD(st && st->file_type && st->repack == q, "its stored type %d maps back to it", (int)tr->stored);
        TRAITS_BAD(st && st->block_size == tr->block_size && st->block_bytes == tr->block_bytes &&
                       st->act_type == tr->act_type,
                   "a layout has its stored type's blocks and activations");
        TRAITS_BAD(tr->repack == q, "a layout is not repacked further");
        TRAITS_BAD(!tr->dequantize && !tr->quantize && !tr->dot, "a layout has no kernels of its own");
    }
    if (tr->act_type != MOE_QTYPE_F32) {
        const struct moe_type_traits *at = moe_type_traits(tr->act_type);
        TRAITS_BAD(at && at->file_type && at->block_size == tr->block_size && at->quantize,
                   "activation type %d has its block size and a quantizer", (int)tr->act_type);
    }
    if (bad == 0 && tr->file_type && kernels) bad += traits_kernels(w, tr, loud);
    return bad;
}

/* A file type with w's block size but other kernels (for the mutations). */
static const struct moe_type_traits *kernel_partner(const struct traits_want *w) {
    for (int i = 0; i < NWANT; i++)
        if (TRAITS_WANT[i].file && TRAITS_WANT[i].block == w->block && TRAITS_WANT[i].t != w->t)
            return moe_type_traits(TRAITS_WANT[i].t);
    return NULL;
}

static void test_traits(void) {
    moe_log_set(count_log, NULL); /* moe_qtype_from_name logs the names it refuses */
    moe_quant_set_isa(MOE_QUANT_ISA_SCALAR);
    int rows = 0;
    for (int t = -3; t < MOE_QTYPE_LIMIT + 3; t++) {
        const struct moe_type_traits *tr = moe_type_traits((enum moe_qtype)t);
        rows += tr != NULL;
        QCHECK((tr != NULL) == (want_of(t) != NULL), "type id %d has a row: %d", t, tr != NULL);
        if (tr || want_of(t)) QCHECK(traits_problems(t, tr, 1) == 0, "row of type %d", t);
    }
    QCHECK(rows == NWANT, "%d rows", rows);
    /* every single-field mutation of every row is caught */
    int mutations = 0;
    for (int i = 0; i < NWANT; i++) {
        const struct traits_want *w = &TRAITS_WANT[i];
        const struct moe_type_traits *tr = moe_type_traits(w->t), *p = kernel_partner(w);
        const struct moe_type_traits *sp = moe_type_traits(w->stored);
        if (!tr || !sp) continue; /* reported above */
        for (int m = 0; m < 11; m++) {
            struct moe_type_traits x = *tr;
            const char *what = "";
            switch (m) {
            case 0: x.name = "q4_1", what = "name"; break;
            case 1: x.block_size *= 2, what = "block size"; break;
            case 2: x.block_bytes += 1, what = "block bytes"; break;
            case 3: x.file_type = !x.file_type, what = "file type"; break;
            case 4: x.act_type = x.act_type == MOE_QTYPE_Q8_0 ? MOE_QTYPE_Q8_K : MOE_QTYPE_Q8_0, what = "act"; break;
            case 5: x.group_rows = x.group_rows == 1 ? 16 : 1, what = "group rows"; break;
            case 6: x.stored = x.stored == MOE_QTYPE_Q4_0 ? MOE_QTYPE_Q8_0 : MOE_QTYPE_Q4_0, what = "stored"; break;
            case 7: x.repack = x.repack == MOE_QTYPE_Q4_K_R16 ? MOE_QTYPE_Q8_0_R16 : MOE_QTYPE_Q4_K_R16, what = "layout";
                break;
            case 8: x.dequantize = w->file ? p->dequantize : sp->dequantize, what = "dequantize"; break;
            case 9: x.quantize = w->file ? p->quantize : sp->quantize, what = "quantize"; break;
            case 10: x.dot = w->file ? p->dot : sp->dot, what = "dot"; break;
            }
            mutations++;
            QCHECK(traits_problems(w->t, &x, 0) > 0, "a wrong %s in the row of %s is caught", what, w->name);
        }
    }
    QCHECK(mutations == 11 * NWANT, "%d mutations", mutations);
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
    moe_log_set(NULL, NULL);
}

/* ---- 2. oracle fixtures ------------------------------------------------- */

struct blob {
    uint8_t *p;
    size_t n, off;
    int bad;
};

static int read_file(const char *path, struct blob *b) {
    memset(b, 0, sizeof *b);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    b->p = malloc(sz > 0 ? (size_t)sz : 1);
    b->n = b->p && sz > 0 && fread(b->p, 1, (size_t)sz, f) == (size_t)sz ? (size_t)sz : 0;
    fclose(f);
    return b->n ? 0 : -1;
}

/* Next k bytes of the blob, or NULL (and b->bad) if it is too short. */
static const uint8_t *take(struct blob *b, size_t k) {
    if (b->bad || k > b->n - b->off) {
        b->bad = 1;
        return NULL;
    }
    const uint8_t *p = b->p + b->off;
    b->off += k;
    return p;
}
static uint32_t take_u32(struct blob *b) {
    const uint8_t *p = take(b, 4);
    uint32_t v = 0;
    if (p) memcpy(&v, p, 4);
    return v;
}

#define MAX_INPUTS 64
static struct {
    char name[33];
    int64_t n;
    const float *x; /* points into g_inputs.p (may be unaligned: copied before use) */
} g_in[MAX_INPUTS];
static int g_nin;
static struct blob g_inputs;

static int load_inputs(void) {
    if (read_file(MOE_FIXTURES "/quant/inputs.bin", &g_inputs) != 0) return -1;
    const uint8_t *magic = take(&g_inputs, 8);
    uint32_t n = take_u32(&g_inputs);
    if (!magic || memcmp(magic, "MOEQIN01", 8) != 0 || n > MAX_INPUTS) return -1;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *name = take(&g_inputs, 32);
        uint32_t len = take_u32(&g_inputs);
        const uint8_t *x = take(&g_inputs, (size_t)len * 4);
        if (!name || !x) return -1;
        memcpy(g_in[i].name, name, 32);
        g_in[i].name[32] = 0;
        g_in[i].n = len;
        g_in[i].x = (const float *)x;
    }
    g_nin = (int)n;
    return g_inputs.off == g_inputs.n ? 0 : -1;
}

struct fixture_stats {
    int cases, quant_rows, deq_rows;
    int64_t quant_bytes, deq_values;
};

/* One case: quantize (if an oracle made the bytes), dequantize and dot on every
 * supported ISA, error bound on the normal and real rows. */
static void check_case(enum moe_qtype t, const char *name, int row, int64_t n, uint32_t qorigin,
                       const uint8_t *qref, const float *yref_u, struct fixture_stats *st) {
    const size_t qb = moe_qtype_row_bytes(t, n);
    float *yref = malloc((size_t)n * 4), *y = malloc((size_t)n * 4), *x = malloc((size_t)n * 4);
    float *in = malloc((size_t)n * 4);
    uint8_t *q = malloc(qb + 1);
    memcpy(yref, yref_u, (size_t)n * 4);
    st->cases++;
    if (row >= 0) memcpy(in, g_in[row].x, (size_t)n * 4);
    if (row >= 0 && qorigin != 0) { /* 1 = gguf, 2 = ggml reference */
        QCHECK(moe_quantize_row(t, in, q, n) == MOE_OK, "quantize %s", name);
        int64_t diff = 0, first = -1;
        for (size_t i = 0; i < qb; i++)
            if (q[i] != qref[i]) {
                if (first < 0) first = (int64_t)i;
                diff++;
            }
        QCHECK(diff == 0, "%s %s: quantized bytes differ from %s at %lld bytes (first at %lld: %02x vs %02x)",
              moe_qtype_name(t), name, qorigin == 1 ? "gguf" : "ggml", (long long)diff, (long long)first,
              first >= 0 ? q[first] : 0, first >= 0 ? qref[first] : 0);
        st->quant_rows++;
        st->quant_bytes += (int64_t)qb;
    }
    fill_normal(x, n, 1.0f);
    double sum_abs;
    const float def = dot_definition(yref, x, n, &sum_abs);
    for (int k = 0; k < 3; k++) {
        if (!moe_quant_isa_supported(ISAS[k])) continue;
        moe_quant_set_isa(ISAS[k]);
        QCHECK(moe_dequantize_row(t, qref, y, n) == MOE_OK, "dequantize");
        int64_t first = -1;
        int64_t d = count_bit_diffs(y, yref, n, &first);
        QCHECK(d == 0, "%s %s [%s]: %lld dequantized values differ from gguf (first at %lld: %.9g vs %.9g)",
              moe_qtype_name(t), name, moe_quant_isa_name(), (long long)d, (long long)first,
              first >= 0 ? y[first] : 0.0, first >= 0 ? yref[first] : 0.0);
        st->deq_rows++;
        st->deq_values += n;
        const float got = moe_vec_dot(t, qref, x, n);
        if (ISAS[k] == MOE_QUANT_ISA_SCALAR) {
            QCHECK(memcmp(&got, &def, 4) == 0 || (isnan(got) && isnan(def)),
                  "%s %s: scalar dot %.9g != definition %.9g", moe_qtype_name(t), name, got, def);
        } else if (isfinite(def) && isfinite(sum_abs)) {
            QCHECK(fabs((double)got - def) <= dot_tolerance(n, sum_abs), "%s %s [%s]: dot %.9g vs %.9g",
                  moe_qtype_name(t), name, moe_quant_isa_name(), got, def);
        }
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
    if (row >= 0 && (strcmp(name, "normal") == 0 || strncmp(name, "real:", 5) == 0)) {
        const double e = rel_rmse(in, yref, n);
        QCHECK(e <= err_bound(t), "%s %s: relative RMSE %.5f > bound %.5f", moe_qtype_name(t), name, e,
              err_bound(t));
    }
    free(yref), free(y), free(x), free(in), free(q);
}

static void test_fixture_type(enum moe_qtype t, struct fixture_stats *st) {
    char path[512];
    snprintf(path, sizeof path, MOE_FIXTURES "/quant/%s.bin", moe_qtype_name(t));
    struct blob b;
    if (read_file(path, &b) != 0) {
        QCHECK(0, "cannot read %s", path);
        return;
    }
    const uint8_t *magic = take(&b, 8);
    uint32_t type = take_u32(&b), ncases = take_u32(&b);
    QCHECK(magic && memcmp(magic, "MOEQFX01", 8) == 0 && type == (uint32_t)t, "%s header", path);
    for (uint32_t c = 0; c < ncases && !b.bad; c++) {
        const uint8_t *name = take(&b, 32);
        int32_t row = (int32_t)take_u32(&b);
        uint32_t n = take_u32(&b), qorigin = take_u32(&b), dorigin = take_u32(&b);
        (void)dorigin;
        const size_t qb = moe_qtype_row_bytes(t, n);
        const uint8_t *q = take(&b, qb);
        const uint8_t *yref = take(&b, (size_t)n * 4);
        if (!name || !q || !yref || qb == 0 || row >= g_nin || (row >= 0 && n > g_in[row].n)) {
            QCHECK(0, "%s: case %u is malformed", path, c);
            break;
        }
        char nm[33];
        memcpy(nm, name, 32);
        nm[32] = 0;
        check_case(t, nm, row, n, qorigin, q, (const float *)yref, st);
    }
    QCHECK(!b.bad && b.off == b.n, "%s: trailing or missing bytes", path);
    free(b.p);
}

static void test_fixtures(void) {
    if (load_inputs() != 0) {
        QCHECK(0, "cannot read " MOE_FIXTURES "/quant/inputs.bin");
        return;
    }
    printf("fixture cases (quantize: bytes identical to the oracle; dequantize: values identical to gguf, per ISA)\n");
    for (int i = 0; i < NTYPES; i++) {
        enum moe_qtype t = ALL[i];
        if (t == MOE_QTYPE_F32) continue;
        struct fixture_stats st = {0};
        const int f0 = fails;
        test_fixture_type(t, &st);
        printf("  %-5s %2d cases  quantize %2d rows / %6lld bytes  dequantize %3d rows / %6lld values  %s\n",
               moe_qtype_name(t), st.cases, st.quant_rows, (long long)st.quant_bytes, st.deq_rows,
               (long long)st.deq_values, fails == f0 ? "ok" : "FAILED");
    }
    /* f16 and bf16: every bit pattern dequantizes like moe_f16_to_f32 / moe_bf16_to_f32 */
    {
        static uint16_t h[65536];
        static float y[65536], want[65536];
        for (int k = 0; k < 2; k++) {
            const enum moe_qtype t = k ? MOE_QTYPE_BF16 : MOE_QTYPE_F16;
            for (uint32_t i = 0; i < 65536; i++) {
                h[i] = (uint16_t)i;
                want[i] = k ? moe_bf16_to_f32((uint16_t)i) : moe_f16_to_f32((uint16_t)i);
            }
            for (int a = 0; a < 3; a++) {
                if (!moe_quant_isa_supported(ISAS[a])) continue;
                moe_quant_set_isa(ISAS[a]);
                int64_t first = -1;
                QCHECK(moe_dequantize_row(t, h, y, 65536) == MOE_OK && count_bit_diffs(y, want, 65536, &first) == 0,
                      "%s [%s]: all 65536 patterns: first difference at 0x%04llx", moe_qtype_name(t),
                      moe_quant_isa_name(), (long long)first);
            }
            moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
        }
    }
    /* f32 is the identity both ways */
    for (int r = 0; r < g_nin; r++) {
        const int64_t n = g_in[r].n;
        float *in = malloc((size_t)n * 4), *q = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
        memcpy(in, g_in[r].x, (size_t)n * 4);
        QCHECK(moe_quantize_row(MOE_QTYPE_F32, in, q, n) == MOE_OK && memcmp(q, in, (size_t)n * 4) == 0, "f32 q");
        QCHECK(moe_dequantize_row(MOE_QTYPE_F32, q, y, n) == MOE_OK && memcmp(y, in, (size_t)n * 4) == 0, "f32 dq");
        free(in), free(q), free(y);
    }
    free(g_inputs.p);
}

/* Bulk check (fixture bulk.txt): 64 rows x 4096 generated identically here and
 * in the generator; only 64-bit hashes of the oracle's bytes and floats are
 * committed. See tests/fixtures/quant/README.md. */
#define GOLDEN 0x9E3779B97F4A7C15ull
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float bulk_value(uint64_t seed, uint64_t idx, int64_t n) {
    float u[4];
    for (int k = 0; k < 4; k++) u[k] = (float)(mix64(seed + (4 * idx + (uint64_t)k) * GOLDEN) >> 40) * 0x1p-24f;
    float v = ((u[0] + u[1]) + u[2]) + u[3] - 2.0f;
    v = v * ldexpf(1.0f, (int)((int64_t)(idx / (uint64_t)n) % 16) - 8);
    if (idx % 61 == 0) v = v * 8.0f;
    return v;
}

static uint64_t bulk_hash(const void *p, size_t len) {
    const uint8_t *b = p;
    uint64_t h = 0;
    for (size_t i = 0; i < len; i += 8) {
        uint64_t w = 0;
        memcpy(&w, b + i, len - i < 8 ? len - i : 8);
        h += mix64(w + (uint64_t)(i / 8) * GOLDEN);
    }
    return h;
}

static void test_bulk(void) {
    FILE *f = fopen(MOE_FIXTURES "/quant/bulk.txt", "r");
    QCHECK(f != NULL, "cannot read bulk.txt");
    if (!f) return;
    char line[256];
    int lines = 0;
    printf("bulk rows (hashes of the oracle's output):");
    while (fgets(line, sizeof line, f)) {
        char tn[16];
        long long rows, n, seed;
        unsigned long long hq, hd;
        if (line[0] == '#') continue;
        if (sscanf(line, "%15s %lld %lld %lld %llx %llx", tn, &rows, &n, &seed, &hq, &hd) != 6) {
            QCHECK(0, "bulk.txt: bad line '%s'", line);
            continue;
        }
        enum moe_qtype t;
        if (moe_qtype_from_name(tn, &t) != MOE_OK || rows <= 0 || rows > 1024 || n <= 0 || n > 65536) {
            QCHECK(0, "bulk.txt: bad type or size in '%s'", line);
            continue;
        }
        const int64_t total = rows * n;
        const size_t qb = moe_qtype_row_bytes(t, total);
        float *x = malloc((size_t)total * 4), *y = malloc((size_t)total * 4);
        uint8_t *q = malloc(qb);
        for (int64_t i = 0; i < total; i++) x[i] = bulk_value((uint64_t)seed, (uint64_t)i, n);
        for (int64_t r = 0; r < rows; r++)
            moe_quantize_row(t, x + r * n, q + r * moe_qtype_row_bytes(t, n), n);
        QCHECK(bulk_hash(q, qb) == hq, "%s bulk: quantized bytes differ from the oracle", tn);
        for (int k = 0; k < 3; k++) {
            if (!moe_quant_isa_supported(ISAS[k])) continue;
            moe_quant_set_isa(ISAS[k]);
            moe_dequantize_row(t, q, y, total);
            QCHECK(bulk_hash(y, (size_t)total * 4) == hd, "%s bulk [%s]: dequantized floats differ from gguf", tn,
                  moe_quant_isa_name());
        }
        moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
        printf(" %s", tn);
        lines++;
        free(x), free(y), free(q);
    }
    fclose(f);
    printf(": %d types x %d rows x %d\n", lines, 64, 4096);
    QCHECK(lines == NTYPES - 1, "bulk.txt covers every type but f32 (%d)", lines);
}

/* ---- 3. SIMD vs scalar -------------------------------------------------- */

/* A quantized row of type t and length n from N(0, scale) data (with a few
 * outliers), so that every code path sees realistic blocks. */
static void make_row(enum moe_qtype t, int64_t n, uint8_t *q, float *tmp) {
    fill_normal(tmp, n, 0.05f);
    for (int64_t i = 0; i < n; i += 97) tmp[i] *= 20.0f;
    MOE_ASSERT(moe_quantize_row(t, tmp, q, n) == MOE_OK);
}

static void test_simd(void) {
    static const int64_t lens_block[] = {1, 2, 3, 5, 8, 16};               /* in blocks */
    static const int64_t lens_plain[] = {1, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 255, 1000, 4095, 4096};
    double worst[NTYPES][3] = {{0}};
    int64_t compared = 0;
    for (int ti = 0; ti < NTYPES; ti++) {
        const enum moe_qtype t = ALL[ti];
        const int bs = moe_qtype_block_size(t);
        const int nl = bs == 1 ? 16 : 6;
        for (int li = 0; li < nl; li++) {
            const int64_t n = bs == 1 ? lens_plain[li] : lens_block[li] * bs;
            for (int rep = 0; rep < 3; rep++) {
                /* rep 2 of the 32-blocks: longer rows (up to 4096) */
                const int64_t nn = rep == 2 && bs == 32 ? 8 * n : n;
                const size_t qb = moe_qtype_row_bytes(t, nn);
                uint8_t *q = malloc(qb + 1), *qu = malloc(qb + 1);
                float *x = malloc((size_t)nn * 4 + 4), *ref = malloc((size_t)nn * 4), *y = malloc((size_t)nn * 4);
                make_row(t, nn, q, y);
                memcpy(qu + 1, q, qb); /* an unaligned copy of the row */
                fill_normal(x + 1, nn, 1.0f);
                if (rep == 1)
                    for (int64_t i = 0; i < nn; i++) x[1 + i] = fabsf(x[1 + i]); /* no cancellation */
                moe_quant_set_isa(MOE_QUANT_ISA_SCALAR);
                moe_dequantize_row(t, q, ref, nn);
                double sum_abs;
                const float def = dot_definition(ref, x + 1, nn, &sum_abs);
                const float sdot = moe_vec_dot(t, q, x + 1, nn);
                QCHECK(memcmp(&sdot, &def, 4) == 0, "%s n=%lld: scalar dot %.9g != definition %.9g",
                      moe_qtype_name(t), (long long)nn, sdot, def);
                for (int k = 1; k < 3; k++) {
                    if (!moe_quant_isa_supported(ISAS[k])) continue;
                    moe_quant_set_isa(ISAS[k]);
                    int64_t first = -1;
                    QCHECK(moe_dequantize_row(t, qu + 1, y, nn) == MOE_OK &&
                              count_bit_diffs(y, ref, nn, &first) == 0,
                          "%s n=%lld [%s]: dequantize differs from scalar at %lld", moe_qtype_name(t),
                          (long long)nn, moe_quant_isa_name(), (long long)first);
                    const float d1 = moe_vec_dot(t, q, x + 1, nn);
                    const float d2 = moe_vec_dot(t, qu + 1, x + 1, nn); /* unaligned w and x */
                    const double err = fabs((double)d1 - def);
                    QCHECK(err <= dot_tolerance(nn, sum_abs), "%s n=%lld [%s]: dot %.9g vs scalar %.9g (tol %.3g)",
                          moe_qtype_name(t), (long long)nn, moe_quant_isa_name(), d1, def,
                          dot_tolerance(nn, sum_abs));
                    QCHECK(memcmp(&d1, &d2, 4) == 0, "%s: alignment changes the result", moe_qtype_name(t));
                    if (sum_abs > 0 && err / sum_abs > worst[ti][k]) worst[ti][k] = err / sum_abs;
                    compared++;
                }
                free(q), free(qu), free(x), free(ref), free(y);
            }
        }
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
    printf("SIMD vs scalar: %lld dot/dequantize comparisons; dequantize bit-identical; worst |dot - scalar| / sum|v x|:\n",
           (long long)compared);
    for (int k = 1; k < 3; k++) {
        if (!moe_quant_isa_supported(ISAS[k])) {
            printf("  %-6s not run: this CPU lacks it (code compiled, UNTESTED here)\n", moe_quant_isa_str(ISAS[k]));
            continue;
        }
        printf("  %-6s", moe_quant_isa_str(ISAS[k]));
        for (int ti = 0; ti < NTYPES; ti++) printf(" %s %.1e", moe_qtype_name(ALL[ti]), worst[ti][k]);
        printf("\n");
    }
}

/* ---- 4. error bounds on N(0,1) data ------------------------------------- */

static void test_error_bounds(void) {
    const int64_t rows = 64, n = 4096;
    float *x = malloc((size_t)(rows * n) * 4), *y = malloc((size_t)n * 4);
    uint8_t *q = malloc(moe_qtype_row_bytes(MOE_QTYPE_F32, n));
    fill_normal(x, rows * n, 1.0f);
    printf("relative RMSE of dequantize(quantize(x)), x ~ N(0,1), %lld x %lld:\n ", (long long)rows, (long long)n);
    for (int ti = 0; ti < NTYPES; ti++) {
        const enum moe_qtype t = ALL[ti];
        double se = 0, sx = 0;
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * n;
            moe_quantize_row(t, xr, q, n);
            moe_dequantize_row(t, q, y, n);
            for (int64_t i = 0; i < n; i++) {
                se += ((double)y[i] - xr[i]) * ((double)y[i] - xr[i]);
                sx += (double)xr[i] * xr[i];
            }
        }
        const double e = sqrt(se / sx);
        printf(" %s %.5f", moe_qtype_name(t), e);
        QCHECK(e <= err_bound(t), "%s: relative RMSE %.5f > bound %.5f", moe_qtype_name(t), e, err_bound(t));
        if (t == MOE_QTYPE_F32) QCHECK(e == 0, "f32 is exact");
    }
    printf("\n");
    free(x), free(y), free(q);
}

/* ---- 5. malformed input -------------------------------------------------- */

static void test_malformed(void) {
    float x[1024], y[1024];
    uint8_t q[2048];
    fill_normal(x, 1024, 1.0f);
    moe_log_set(count_log, NULL);
    g_logs = 0;
    int expected_logs = 0;
    for (int ti = 0; ti < NTYPES; ti++) {
        const enum moe_qtype t = ALL[ti];
        const int bs = moe_qtype_block_size(t);
        if (bs > 1) {
            memset(q, 0xAB, sizeof q);
            QCHECK(moe_quantize_row(t, x, q, bs + 1) == MOE_ERR_INVALID, "%s ragged quantize", moe_qtype_name(t));
            QCHECK(q[0] == 0xAB && q[sizeof q - 1] == 0xAB, "%s: dst untouched on error", moe_qtype_name(t));
            QCHECK(moe_dequantize_row(t, q, y, bs - 1) == MOE_ERR_INVALID, "%s ragged dequantize", moe_qtype_name(t));
            QCHECK(isnan(moe_vec_dot(t, q, x, bs + 16)), "%s ragged dot", moe_qtype_name(t));
            expected_logs += 3;
        }
        QCHECK(moe_quantize_row(t, x, q, -bs) == MOE_ERR_INVALID, "%s negative n", moe_qtype_name(t));
        QCHECK(moe_quantize_row(t, NULL, q, bs) == MOE_ERR_INVALID, "%s NULL src", moe_qtype_name(t));
        QCHECK(moe_quantize_row(t, x, NULL, bs) == MOE_ERR_INVALID, "%s NULL dst", moe_qtype_name(t));
        QCHECK(moe_dequantize_row(t, NULL, y, bs) == MOE_ERR_INVALID, "%s NULL src", moe_qtype_name(t));
        QCHECK(isnan(moe_vec_dot(t, NULL, x, bs)), "%s NULL w", moe_qtype_name(t));
        QCHECK(isnan(moe_vec_dot(t, q, NULL, bs)), "%s NULL x", moe_qtype_name(t));
        QCHECK(isnan(moe_vec_dot(t, q, x, -1)), "%s negative n", moe_qtype_name(t));
        expected_logs += 7;
        /* n = 0 is a valid, empty row */
        QCHECK(moe_quantize_row(t, x, q, 0) == MOE_OK && moe_dequantize_row(t, q, y, 0) == MOE_OK &&
                  moe_vec_dot(t, q, x, 0) == 0.0f,
              "%s empty row", moe_qtype_name(t));
    }
    static const int bad_types[] = {-1, 3, 4, 5, 6, 7, 9, 16, 29, 31, 1000};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        const enum moe_qtype t = (enum moe_qtype)bad_types[i];
        QCHECK(moe_quantize_row(t, x, q, 256) == MOE_ERR_INVALID, "type %d quantize", bad_types[i]);
        QCHECK(moe_dequantize_row(t, q, y, 256) == MOE_ERR_INVALID, "type %d dequantize", bad_types[i]);
        QCHECK(isnan(moe_vec_dot(t, q, x, 256)), "type %d dot", bad_types[i]);
        expected_logs += 3;
    }
    QCHECK(moe_quant_set_isa((enum moe_quant_isa)7) == MOE_ERR_UNSUPPORTED, "bad ISA");
    QCHECK(moe_quant_set_isa((enum moe_quant_isa)-1) == MOE_ERR_UNSUPPORTED, "bad ISA");
    expected_logs += 2;
    QCHECK(g_logs == expected_logs, "every error logged once (%d logs, %d errors)", g_logs, expected_logs);
    moe_log_set(NULL, NULL);
    QCHECK(moe_quant_set_isa(MOE_QUANT_ISA_AUTO) == MOE_OK, "auto ISA");
    QCHECK(strcmp(moe_quant_isa_str((enum moe_quant_isa)9), "?") == 0, "ISA name of a bad value");

    /* non-finite and extreme inputs: well-formed output, no crash, on every path */
    static const float specials[] = {NAN, INFINITY, -INFINITY, 3.4e38f, -3.4e38f, 1e-45f, -0.0f, 65520.0f};
    for (int s = 0; s < 8; s++) {
        for (int i = 0; i < 1024; i++) x[i] = (i % 7 == s % 7) ? specials[s] : moe_test_rnd_normal();
        if (s == 7) fill_normal(x, 1024, 1e30f); /* every scale overflows f16 */
        for (int ti = 0; ti < NTYPES; ti++) {
            const enum moe_qtype t = ALL[ti];
            const int64_t n = moe_qtype_row_bytes(t, 512) <= sizeof q ? 512 : 256;
            QCHECK(moe_quantize_row(t, x, q, n) == MOE_OK, "%s special %d", moe_qtype_name(t), s);
            float ref[512];
            moe_quant_set_isa(MOE_QUANT_ISA_SCALAR);
            moe_dequantize_row(t, q, ref, n);
            (void)moe_vec_dot(t, q, x, n);
            for (int k = 1; k < 3; k++) {
                if (!moe_quant_isa_supported(ISAS[k])) continue;
                moe_quant_set_isa(ISAS[k]);
                int64_t first = -1;
                moe_dequantize_row(t, q, y, n);
                QCHECK(count_bit_diffs(y, ref, n, &first) == 0, "%s special %d [%s] differs at %lld",
                      moe_qtype_name(t), s, moe_quant_isa_name(), (long long)first);
                (void)moe_vec_dot(t, q, x, n);
            }
        }
    }
    /* garbage blocks (any bytes, NaN/inf scales included): same floats on every ISA */
    for (int rep = 0; rep < 50; rep++) {
        for (size_t i = 0; i < sizeof q; i++) q[i] = (uint8_t)moe_test_rnd64();
        for (int ti = 0; ti < NTYPES; ti++) {
            const enum moe_qtype t = ALL[ti];
            const int64_t n = moe_qtype_row_bytes(t, 512) <= sizeof q ? 512 : 256;
            float ref[512];
            moe_quant_set_isa(MOE_QUANT_ISA_SCALAR);
            moe_dequantize_row(t, q, ref, n);
            for (int k = 1; k < 3; k++) {
                if (!moe_quant_isa_supported(ISAS[k])) continue;
                moe_quant_set_isa(ISAS[k]);
                int64_t first = -1;
                moe_dequantize_row(t, q, y, n);
                QCHECK(count_bit_diffs(y, ref, n, &first) == 0, "%s garbage [%s] differs at %lld",
                      moe_qtype_name(t), moe_quant_isa_name(), (long long)first);
                (void)moe_vec_dot(t, q, x, n);
            }
        }
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
}

/* ==== integer dot products against quantized activations ================= */

static const enum moe_qtype INT_TYPES[] = {MOE_QTYPE_Q8_0, MOE_QTYPE_Q4_0, MOE_QTYPE_Q2_K, MOE_QTYPE_Q3_K,
                                           MOE_QTYPE_Q4_K, MOE_QTYPE_Q5_K, MOE_QTYPE_Q6_K};
#define NINT (int)(sizeof INT_TYPES / sizeof INT_TYPES[0])

/* The dequantized activation, exactly, in double: d * q per element. */
static void act_values(enum moe_qtype wt, const uint8_t *xq, int64_t n, double *xd) {
    if (moe_act_type(wt) == MOE_QTYPE_Q8_0) {
        for (int64_t b = 0; b < n / 32; b++, xq += sizeof(moe_block_q8_0)) {
            uint16_t h;
            memcpy(&h, xq, 2);
            const double d = moe_f16_to_f32(h);
            for (int j = 0; j < 32; j++) xd[32 * b + j] = d * (int8_t)xq[2 + j];
        }
    } else {
        for (int64_t b = 0; b < n / 256; b++, xq += sizeof(moe_block_q8_K)) {
            float d;
            memcpy(&d, xq, 4);
            for (int j = 0; j < 256; j++) xd[256 * b + j] = (double)d * (int8_t)xq[4 + j];
        }
    }
}

/* Byte offsets of a block's f16 scale (first) and min scale (second, or -1). */
static void scale_fields(enum moe_qtype t, int *d_off, int *dmin_off) {
    *dmin_off = -1;
    switch (t) {
    case MOE_QTYPE_Q2_K: *d_off = offsetof(moe_block_q2_K, d), *dmin_off = offsetof(moe_block_q2_K, dmin); break;
    case MOE_QTYPE_Q3_K: *d_off = offsetof(moe_block_q3_K, d); break;
    case MOE_QTYPE_Q4_K: *d_off = 0, *dmin_off = 2; break;
    case MOE_QTYPE_Q5_K: *d_off = 0, *dmin_off = 2; break;
    case MOE_QTYPE_Q6_K: *d_off = offsetof(moe_block_q6_K, d); break;
    default: *d_off = 0; break; /* q8_0, q4_0 */
    }
}

/* The weights split into their scale part a (d * scale * q) and min part b
 * (dmin * min), w = a - b, by dequantizing copies with dmin or d set to 0. */
static void weight_parts(enum moe_qtype t, const uint8_t *w, int64_t n, float *a, float *b) {
    int doff, moff;
    scale_fields(t, &doff, &moff);
    const size_t rb = moe_qtype_row_bytes(t, n), bb = moe_qtype_block_bytes(t);
    uint8_t *c = malloc(rb);
    memcpy(c, w, rb);
    if (moff >= 0)
        for (size_t o = 0; o < rb; o += bb) memset(c + o + moff, 0, 2);
    moe_quant_set_isa(MOE_QUANT_ISA_SCALAR);
    moe_dequantize_row(t, c, a, n);
    if (moff >= 0) {
        memcpy(c, w, rb);
        for (size_t o = 0; o < rb; o += bb) memset(c + o + doff, 0, 2);
        moe_dequantize_row(t, c, b, n);
        for (int64_t i = 0; i < n; i++) b[i] = -b[i];
    } else {
        for (int64_t i = 0; i < n; i++) b[i] = 0.0f;
    }
    free(c);
}

/* M = sum (|a| + |b|) |xd|: the magnitude the SIMD tolerance is relative to. */
static double int_magnitude(enum moe_qtype t, const uint8_t *w, const double *xd, int64_t n) {
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    weight_parts(t, w, n, a, b);
    double m = 0;
    for (int64_t i = 0; i < n; i++) m += (fabs((double)a[i]) + fabs((double)b[i])) * fabs(xd[i]);
    free(a), free(b);
    return m;
}

static double int_tolerance(int64_t n, double m) { return ((double)n / 32.0 + 10.0) * 0x1p-24 * m; }

/* A row of random bytes with sane f16 scales (N(0, 0.01^2)). */
static void garbage_row(enum moe_qtype t, int64_t n, uint8_t *q) {
    const size_t rb = moe_qtype_row_bytes(t, n), bb = moe_qtype_block_bytes(t);
    for (size_t i = 0; i < rb; i++) q[i] = (uint8_t)moe_test_rnd64();
    int doff, moff;
    scale_fields(t, &doff, &moff);
    for (size_t o = 0; o < rb; o += bb) {
        uint16_t h = moe_f32_to_f16(moe_test_rnd_normal() * 0.01f);
        memcpy(q + o + doff, &h, 2);
        if (moff >= 0) {
            h = moe_f32_to_f16(moe_test_rnd_normal() * 0.01f);
            memcpy(q + o + moff, &h, 2);
        }
    }
}

/* Activation-like floats: N(0,1) with a few large channels and, by kind, whole
 * zero blocks (kind 1) or tiny values (kind 2). */
static void act_row(float *x, int64_t n, int kind) {
    fill_normal(x, n, kind == 2 ? 1e-6f : 1.0f);
    for (int64_t i = 0; i < n; i += 53) x[i] *= 25.0f;
    if (kind == 1)
        for (int64_t i = 0; i < n; i++)
            if ((i / 32) % 3 == 1) x[i] = 0.0f;
}

/* ---- 6. activation quantizers -------------------------------------------- */

/* Activation bytes on every ISA against the scalar quantizer (moe_quantize_row
 * of the activation type) and the range -127..127. */
static void check_act_row(const float *x, int64_t n, const char *what) {
    static const enum moe_qtype wts[] = {MOE_QTYPE_Q8_0, MOE_QTYPE_Q4_K};
    for (int k = 0; k < 2; k++) {
        const enum moe_qtype wt = wts[k], at = moe_act_type(wt);
        if (n % moe_qtype_block_size(wt)) continue;
        const size_t rb = moe_act_row_bytes(wt, n);
        uint8_t *ref = malloc(rb), *got = malloc(rb + 1);
        moe_quant_set_isa(MOE_QUANT_ISA_SCALAR);
        QCHECK(moe_quantize_row(at, x, ref, n) == MOE_OK, "quantize");
        for (int a = 0; a < 3; a++) {
            if (!moe_quant_isa_supported(ISAS[a])) continue;
            moe_quant_set_isa(ISAS[a]);
            QCHECK(moe_quantize_act(wt, x, got + 1, n) == MOE_OK, "quantize_act");
            int64_t first = -1;
            for (size_t i = 0; i < rb && first < 0; i++)
                if (got[1 + i] != ref[i]) first = (int64_t)i;
            QCHECK(first < 0, "%s activation of %s [%s]: byte %lld differs from moe_quantize_row", moe_qtype_name(at),
                   what, moe_quant_isa_name(), (long long)first);
            const size_t bb = moe_qtype_block_bytes(at), qoff = at == MOE_QTYPE_Q8_0 ? 2 : 4;
            const int bs = moe_qtype_block_size(at);
            int bad = 0;
            for (size_t o = 0; o < rb; o += bb)
                for (int j = 0; j < bs; j++) bad += (int8_t)got[1 + o + qoff + j] == -128;
            QCHECK(bad == 0, "%s activation of %s: %d quants are -128", moe_qtype_name(at), what, bad);
        }
        free(ref), free(got);
    }
}

/* act.bin (tests/oracle/make_act_fixtures.py): activation bytes from gguf (q8_0)
 * and ggml (q8_k); ggml's integer dots. */
static void test_act_fixture(void) {
    struct blob b;
    if (read_file(MOE_FIXTURES "/quant/act.bin", &b) != 0) {
        QCHECK(0, "cannot read act.bin");
        return;
    }
    const uint8_t *magic = take(&b, 8);
    const uint32_t n = take_u32(&b), nact = take_u32(&b);
    if (!magic || memcmp(magic, "MOEQAC01", 8) != 0 || n == 0 || n % 256 || n > 65536 || nact > 64) {
        QCHECK(0, "act.bin header");
        free(b.p);
        return;
    }
    const size_t b80 = moe_act_row_bytes(MOE_QTYPE_Q8_0, n), b8k = moe_act_row_bytes(MOE_QTYPE_Q4_K, n);
    float *x = malloc((size_t)n * 4);
    const uint8_t *q80[64], *q8k[64];
    char names[64][33];
    int act_ok = 0;
    for (uint32_t r = 0; r < nact; r++) {
        const uint8_t *name = take(&b, 32), *xs = take(&b, (size_t)n * 4);
        q80[r] = take(&b, b80), q8k[r] = take(&b, b8k);
        if (!name || !xs || !q80[r] || !q8k[r]) break;
        memcpy(names[r], name, 32);
        names[r][32] = 0;
        memcpy(x, xs, (size_t)n * 4);
        uint8_t *got = malloc(b8k > b80 ? b8k : b80);
        for (int a = 0; a < 3; a++) {
            if (!moe_quant_isa_supported(ISAS[a])) continue;
            moe_quant_set_isa(ISAS[a]);
            QCHECK(moe_quantize_act(MOE_QTYPE_Q4_0, x, got, n) == MOE_OK && memcmp(got, q80[r], b80) == 0,
                   "q8_0 activation of '%s' [%s] differs from gguf", names[r], moe_quant_isa_name());
            QCHECK(moe_quantize_act(MOE_QTYPE_Q6_K, x, got, n) == MOE_OK && memcmp(got, q8k[r], b8k) == 0,
                   "q8_k activation of '%s' [%s] differs from ggml", names[r], moe_quant_isa_name());
            act_ok++;
        }
        free(got);
    }
    const uint32_t nw = take_u32(&b);
    double *xd = malloc((size_t)n * 8);
    double worst = 0;
    int dots = 0;
    for (uint32_t k = 0; k < nw && !b.bad; k++) {
        const enum moe_qtype wt = (enum moe_qtype)take_u32(&b);
        const uint8_t *name = take(&b, 32);
        const size_t rb = moe_qtype_row_bytes(wt, n);
        const uint8_t *w = rb ? take(&b, rb) : NULL;
        const uint8_t *dots_ref = take(&b, (size_t)nact * 4);
        if (!name || !w || !dots_ref || moe_act_type(wt) == MOE_QTYPE_F32) {
            QCHECK(0, "act.bin: weight row %u malformed", k);
            break;
        }
        for (uint32_t r = 0; r < nact; r++) {
            const uint8_t *xq = moe_act_type(wt) == MOE_QTYPE_Q8_0 ? q80[r] : q8k[r];
            float want;
            memcpy(&want, dots_ref + 4 * r, 4);
            act_values(wt, xq, n, xd);
            const double m = int_magnitude(wt, w, xd, n);
            for (int a = 0; a < 3; a++) {
                if (!moe_quant_isa_supported(ISAS[a])) continue;
                moe_quant_set_isa(ISAS[a]);
                const float got = moe_vec_dot_act(wt, w, xq, n);
                const double err = fabs((double)got - want);
                QCHECK(err <= 2 * int_tolerance(n, m), "%s %.32s x '%s' [%s]: %.9g vs ggml %.9g (tol %.3g)",
                       moe_qtype_name(wt), name, names[r], moe_quant_int_isa_name(), got, want,
                       2 * int_tolerance(n, m));
                if (m > 0 && err / m > worst) worst = err / m;
                dots++;
            }
        }
    }
    QCHECK(!b.bad && b.off == b.n, "act.bin: trailing or missing bytes");
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
    printf("act.bin: %u activation rows x %d ISAs bit-identical to gguf (q8_0) and ggml (q8_k); "
           "%d dots against ggml's generic C, worst |diff| / M %.1e\n", nact, nact ? act_ok / (int)nact : 0, dots,
           worst);
    free(x), free(xd), free(b.p);
}

static void test_act_quant(void) {
    test_act_fixture();
    /* the quantize fixture's inputs (ties, f32 subnormals whose 1/d overflows,
     * f16 overflow, ...) and rows at many scales */
    QCHECK(load_inputs() == 0, "cannot read inputs.bin"); /* test_fixtures freed them */
    for (int r = 0; r < g_nin; r++) {
        float *x = malloc((size_t)g_in[r].n * 4);
        memcpy(x, g_in[r].x, (size_t)g_in[r].n * 4);
        check_act_row(x, g_in[r].n, g_in[r].name);
        free(x);
    }
    const int64_t n = 4096;
    float *x = malloc((size_t)n * 4);
    for (int rep = 0; rep < 24; rep++) {
        act_row(x, n, rep % 3);
        const float s = ldexpf(1.0f, rep - 12);
        for (int64_t i = 0; i < n; i++) x[i] *= s;
        if (rep == 5) /* largest magnitude twice per block, opposite signs */
            for (int64_t i = 0; i < n; i += 32) x[i + 3] = -100.0f, x[i + 20] = 100.0f;
        if (rep == 6) /* exact ties of both roundings (q8_0: d = 1, q8_k: iscale = -1) */
            for (int64_t i = 0; i < n; i++) x[i] = i % 32 == 0 ? 127.0f : (float)((int)(i % 200) - 100) + 0.5f;
        char what[32];
        snprintf(what, sizeof what, "random row %d", rep);
        check_act_row(x, n, what);
    }
    free(x);
    free(g_inputs.p);
    printf("activation quantizers: every ISA bit-identical to the scalar q8_0 / q8_k quantizers on %d rows\n",
           g_nin + 24);
}

/* ---- 7. integer dots: scalar definition, SIMD, tiles, float dot ----------- */

static void test_int_dot(void) {
    static const int64_t lens[] = {1, 2, 3, 5, 8, 16}; /* in blocks */
    double worst_simd[NINT][3] = {{0}}, worst_def = 0, worst_act = 0, worst_act_rel = 0;
    int64_t compared = 0;
    for (int ti = 0; ti < NINT; ti++) {
        const enum moe_qtype t = INT_TYPES[ti];
        const int bs = moe_qtype_block_size(t);
        for (int li = 0; li < 6; li++) {
            for (int rep = 0; rep < 4; rep++) {
                const int64_t n = lens[li] * bs * (bs == 32 && rep >= 2 ? 8 : 1);
                const size_t qb = moe_qtype_row_bytes(t, n), ab = moe_act_row_bytes(t, n);
                uint8_t *w = malloc(qb + 1), *xq = malloc(ab + 1);
                float *x = malloc((size_t)n * 4), *v = malloc((size_t)n * 4);
                double *xd = malloc((size_t)n * 8);
                if (rep == 3) garbage_row(t, n, w + 1);
                else make_row(t, n, w + 1, v);
                act_row(x, n, rep % 3);
                moe_quant_set_isa(MOE_QUANT_ISA_SCALAR);
                QCHECK(moe_quantize_act(t, x, xq + 1, n) == MOE_OK, "quantize_act");
                moe_dequantize_row(t, w + 1, v, n);
                act_values(t, xq + 1, n, xd);
                const double m = int_magnitude(t, w + 1, xd, n);
                /* scalar = the real dot of the weights and the dequantized activation */
                double def = 0, sum_vx = 0, bound = 0;
                for (int64_t i = 0; i < n; i++) {
                    def += (double)v[i] * xd[i];
                    sum_vx += fabs((double)v[i] * x[i]);
                }
                moe_quant_set_isa(MOE_QUANT_ISA_SCALAR);
                const float s = moe_vec_dot_act(t, w + 1, xq + 1, n);
                QCHECK(fabs((double)s - def) <= 4 * 0x1p-24 * m, "%s n=%lld: scalar int dot %.9g vs definition %.9g",
                       moe_qtype_name(t), (long long)n, s, def);
                if (m > 0 && fabs((double)s - def) / m > worst_def) worst_def = fabs((double)s - def) / m;
                /* against the float dot with the unquantized activation: the error of the
                 * activation quantization, bounded per element (see moe-quant.h) */
                const int q80 = moe_act_type(t) == MOE_QTYPE_Q8_0;
                for (int64_t i = 0; i < n; i++) {
                    double dx;
                    if (q80) {
                        uint16_t h;
                        memcpy(&h, xq + 1 + (i / 32) * sizeof(moe_block_q8_0), 2);
                        dx = moe_f16_to_f32(h);
                        bound += fabs((double)v[i]) * (0.5 * dx + fabs((double)x[i]) * 0x1p-10 + 128 * 0x1p-25);
                    } else {
                        float d;
                        memcpy(&d, xq + 1 + (i / 256) * sizeof(moe_block_q8_K), 4);
                        bound += fabs((double)v[i]) * (0.5 * fabs((double)d) + fabs((double)x[i]) * 0x1p-21);
                    }
                }
                bound += int_tolerance(n, m + sum_vx);
                for (int a = 0; a < 3; a++) {
                    if (!moe_quant_isa_supported(ISAS[a])) continue;
                    moe_quant_set_isa(ISAS[a]);
                    const float got = moe_vec_dot_act(t, w + 1, xq + 1, n);
                    const float fd = moe_vec_dot(t, w + 1, x, n);
                    const double e = fabs((double)got - fd);
                    QCHECK(e <= bound, "%s n=%lld [%s]: int dot %.9g vs float dot %.9g: %.3g > bound %.3g",
                           moe_qtype_name(t), (long long)n, moe_quant_int_isa_name(), got, fd, e, bound);
                    if (bound > 0 && e / bound > worst_act) worst_act = e / bound;
                    if (rep == 0 && sum_vx > 0 && e / sum_vx > worst_act_rel) worst_act_rel = e / sum_vx;
                    if (a == 0) continue;
                    /* SIMD against scalar; unaligned rows give the same bits */
                    uint8_t *w2 = malloc(qb + 3), *x2 = malloc(ab + 5);
                    memcpy(w2 + 3, w + 1, qb);
                    memcpy(x2 + 5, xq + 1, ab);
                    const float got2 = moe_vec_dot_act(t, w2 + 3, x2 + 5, n);
                    free(w2), free(x2);
                    const double err = fabs((double)got - s);
                    QCHECK(err <= int_tolerance(n, m), "%s n=%lld rep %d [%s]: %.9g vs scalar %.9g (tol %.3g)",
                           moe_qtype_name(t), (long long)n, rep, moe_quant_int_isa_name(), got, s,
                           int_tolerance(n, m));
                    QCHECK(memcmp(&got, &got2, 4) == 0, "%s [%s]: alignment changes the result", moe_qtype_name(t),
                           moe_quant_int_isa_name());
                    if (m > 0 && err / m > worst_simd[ti][a]) worst_simd[ti][a] = err / m;
                    compared++;
                }
                free(w), free(xq), free(x), free(v), free(xd);
            }
        }
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
    printf("integer dots: scalar vs definition worst %.1e of M; vs float dot worst %.2f of the activation-"
           "quantization bound (%.1e of sum|w x| on N(0,1) activations)\n", worst_def, worst_act, worst_act_rel);
    printf("  SIMD vs scalar, %lld comparisons, worst |diff| / M (tolerance (n/32 + 10) 2^-24):\n", (long long)compared);
    for (int a = 1; a < 3; a++) {
        if (!moe_quant_isa_supported(ISAS[a])) {
            printf("  %-6s not run: this CPU lacks it (code compiled, UNTESTED here)\n", moe_quant_isa_str(ISAS[a]));
            continue;
        }
        moe_quant_set_isa(ISAS[a]);
        printf("  %-10s", moe_quant_int_isa_name());
        for (int ti = 0; ti < NINT; ti++) printf(" %s %.1e", moe_qtype_name(INT_TYPES[ti]), worst_simd[ti][a]);
        printf("\n");
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
}

/* moe_mat_dot_act (every tile shape, both output layouts) and moe_gate_up_act
 * give exactly the bits of moe_vec_dot_act / silu(g) * u. */
static void test_tiles(void) {
    enum { NW = 11, NX = 7 };
    int checked = 0;
    for (int ti = 0; ti < NINT + 1; ti++) {
        const enum moe_qtype t = ti < NINT ? INT_TYPES[ti] : MOE_QTYPE_F16; /* f16: the float fallback */
        const int64_t n = 2 * (moe_qtype_block_size(t) > 32 ? 256 : 128);
        const size_t rb = moe_qtype_row_bytes(t, n), ab = moe_act_row_bytes(t, n);
        uint8_t *w = malloc(rb * NW), *up = malloc(rb * NW), *xq = malloc(ab * NX);
        float *x = malloc((size_t)n * 4), *tmp = malloc((size_t)n * 4);
        float want[NW][NX], wup[NW][NX], out[NW * NX], h[NX * NW];
        for (int r = 0; r < NW; r++) {
            make_row(t, n, w + r * rb, tmp);
            make_row(t, n, up + r * rb, tmp);
        }
        for (int a = 0; a < 3; a++) {
            if (!moe_quant_isa_supported(ISAS[a])) continue;
            moe_quant_set_isa(ISAS[a]);
            for (int c = 0; c < NX; c++) {
                act_row(x, n, c % 2);
                QCHECK(moe_quantize_act(t, x, xq + c * ab, n) == MOE_OK, "quantize_act");
            }
            for (int r = 0; r < NW; r++)
                for (int c = 0; c < NX; c++) {
                    want[r][c] = moe_vec_dot_act(t, w + r * rb, xq + c * ab, n);
                    wup[r][c] = moe_vec_dot_act(t, up + r * rb, xq + c * ab, n);
                }
            for (int nw = 0; nw <= NW; nw++)
                for (int nx = 0; nx <= NX; nx++) {
                    for (int layout = 0; layout < 2; layout++) {
                        const size_t osw = layout ? 1 : NX, osx = layout ? NW : 1;
                        for (int i = 0; i < NW * NX; i++) out[i] = -1.0f;
                        QCHECK(moe_mat_dot_act(t, n, w, rb, nw, xq, ab, nx, out, osw, osx) == MOE_OK, "mat_dot");
                        int bad = 0, untouched = 0;
                        for (int r = 0; r < NW; r++)
                            for (int c = 0; c < NX; c++) {
                                const float o = out[r * osw + c * osx];
                                if (r < nw && c < nx) bad += memcmp(&o, &want[r][c], 4) != 0;
                                else untouched += o != -1.0f;
                            }
                        QCHECK(bad == 0 && untouched == 0, "%s [%s] %d x %d tile (layout %d): %d differ, %d stray",
                               moe_qtype_name(t), moe_quant_int_isa_name(), nw, nx, layout, bad, untouched);
                        checked++;
                    }
                    QCHECK(moe_gate_up_act(t, n, w, up, nw, xq, ab, nx, h, NW) == MOE_OK, "gate_up");
                    int bad = 0;
                    for (int r = 0; r < nw; r++)
                        for (int c = 0; c < nx; c++) {
                            const float g = want[r][c], e = g / (1.0f + expf(-g)) * wup[r][c];
                            bad += memcmp(&h[c * NW + r], &e, 4) != 0;
                        }
                    QCHECK(bad == 0, "%s [%s] gate/up %d x %d: %d differ", moe_qtype_name(t),
                           moe_quant_int_isa_name(), nw, nx, bad);
                }
            if (t == MOE_QTYPE_F16) { /* plain types: activations copied, moe_vec_dot */
                act_row(x, n, 0);
                QCHECK(moe_quantize_act(t, x, xq, n) == MOE_OK && memcmp(xq, x, (size_t)n * 4) == 0, "f16 act copy");
                const float a1 = moe_vec_dot_act(t, w, xq, n), a2 = moe_vec_dot(t, w, x, n);
                QCHECK(memcmp(&a1, &a2, 4) == 0, "f16 act dot = moe_vec_dot");
            }
        }
        free(w), free(up), free(xq), free(x), free(tmp);
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
    printf("tiles: moe_mat_dot_act and moe_gate_up_act bit-identical to single dots (%d tiles, all shapes)\n", checked);
}

/* The same on matrices of 2100 rows: several of moe_mat_dot_act's row chunks
 * (64 KB) and of moe_gate_up_act's (1024 rows with one activation). */
static void test_tiles_large(void) {
    static const enum moe_qtype types[] = {MOE_QTYPE_Q8_0, MOE_QTYPE_Q4_K};
    enum { ROWS = 2100, NX = 6 };
    for (int ti = 0; ti < 2; ti++) {
        const enum moe_qtype t = types[ti];
        const int64_t n = moe_qtype_block_size(t) == 32 ? 64 : 256;
        const size_t rb = moe_qtype_row_bytes(t, n), ab = moe_act_row_bytes(t, n);
        uint8_t *g = malloc(rb * ROWS), *u = malloc(rb * ROWS), *xq = malloc(ab * NX);
        float *x = malloc((size_t)n * 4), *want = malloc(sizeof(float) * ROWS * NX * 2);
        float *out = malloc(sizeof(float) * ROWS * NX);
        for (int r = 0; r < ROWS; r++) {
            make_row(t, n, g + r * rb, x);
            make_row(t, n, u + r * rb, x);
        }
        for (int c = 0; c < NX; c++) {
            act_row(x, n, 0);
            moe_quantize_act(t, x, xq + c * ab, n);
        }
        for (int a = 0; a < 3; a++) {
            if (!moe_quant_isa_supported(ISAS[a])) continue;
            moe_quant_set_isa(ISAS[a]);
            for (int r = 0; r < ROWS; r++)
                for (int c = 0; c < NX; c++) {
                    want[2 * (r * NX + c)] = moe_vec_dot_act(t, g + r * rb, xq + c * ab, n);
                    want[2 * (r * NX + c) + 1] = moe_vec_dot_act(t, u + r * rb, xq + c * ab, n);
                }
            static const int nxs[] = {1, 3, 6};
            for (int k = 0; k < 3; k++) {
                const int nx = nxs[k];
                int bad = 0;
                QCHECK(moe_mat_dot_act(t, n, g, rb, ROWS, xq, ab, nx, out, 1, ROWS) == MOE_OK, "mat_dot");
                for (int r = 0; r < ROWS; r++)
                    for (int c = 0; c < nx; c++) bad += memcmp(&out[c * ROWS + r], &want[2 * (r * NX + c)], 4) != 0;
                QCHECK(bad == 0, "%s [%s] %d x %d matrix: %d dots differ", moe_qtype_name(t), moe_quant_int_isa_name(),
                       ROWS, nx, bad);
                QCHECK(moe_gate_up_act(t, n, g, u, ROWS, xq, ab, nx, out, ROWS) == MOE_OK, "gate_up");
                bad = 0;
                for (int r = 0; r < ROWS; r++)
                    for (int c = 0; c < nx; c++) {
                        const float gv = want[2 * (r * NX + c)], e = gv / (1.0f + expf(-gv)) * want[2 * (r * NX + c) + 1];
                        bad += memcmp(&out[c * ROWS + r], &e, 4) != 0;
                    }
                QCHECK(bad == 0, "%s [%s] gate/up %d x %d: %d differ", moe_qtype_name(t), moe_quant_int_isa_name(), ROWS,
                       nx, bad);
            }
        }
        free(g), free(u), free(xq), free(x), free(want), free(out);
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
}

/* ---- 8. malformed arguments of the activation functions ----------------- */

static void test_act_malformed(void) {
    float x[512], out[4];
    uint8_t q[2048], w[2048];
    fill_normal(x, 512, 1.0f);
    moe_log_set(count_log, NULL);
    g_logs = 0;
    int expected = 0;
    QCHECK(moe_act_type(MOE_QTYPE_Q4_0) == MOE_QTYPE_Q8_0 && moe_act_type(MOE_QTYPE_Q8_0) == MOE_QTYPE_Q8_0 &&
               moe_act_type(MOE_QTYPE_Q2_K) == MOE_QTYPE_Q8_K && moe_act_type(MOE_QTYPE_Q6_K) == MOE_QTYPE_Q8_K &&
               moe_act_type(MOE_QTYPE_BF16) == MOE_QTYPE_F32 && moe_act_type(MOE_QTYPE_Q8_K) == MOE_QTYPE_F32,
           "activation types");
    QCHECK(moe_act_row_bytes(MOE_QTYPE_Q4_K, 512) == 2 * sizeof(moe_block_q8_K) &&
               moe_act_row_bytes(MOE_QTYPE_Q4_0, 64) == 2 * sizeof(moe_block_q8_0) &&
               moe_act_row_bytes(MOE_QTYPE_F16, 3) == 12 && moe_act_row_bytes(MOE_QTYPE_Q4_K, 32) == 0 &&
               moe_act_row_bytes((enum moe_qtype)5, 256) == 0 && moe_act_row_bytes(MOE_QTYPE_Q8_0, -32) == 0,
           "activation row bytes");
    for (int ti = 0; ti < NINT; ti++) {
        const enum moe_qtype t = INT_TYPES[ti];
        const int bs = moe_qtype_block_size(t);
        memset(q, 0xAB, sizeof q);
        QCHECK(moe_quantize_act(t, x, q, bs + 16) == MOE_ERR_INVALID && q[0] == 0xAB, "%s ragged", moe_qtype_name(t));
        QCHECK(moe_quantize_act(t, NULL, q, bs) == MOE_ERR_INVALID, "NULL x");
        QCHECK(moe_quantize_act(t, x, NULL, bs) == MOE_ERR_INVALID, "NULL xq");
        QCHECK(moe_quantize_act(t, x, q, -bs) == MOE_ERR_INVALID, "negative n");
        QCHECK(isnan(moe_vec_dot_act(t, w, q, bs + 16)), "ragged dot");
        QCHECK(isnan(moe_vec_dot_act(t, NULL, q, bs)), "NULL w");
        QCHECK(isnan(moe_vec_dot_act(t, w, NULL, bs)), "NULL xq");
        out[0] = 7.0f;
        QCHECK(moe_mat_dot_act(t, bs, w, 0, -1, q, 0, 1, out, 1, 1) == MOE_ERR_INVALID && out[0] == 7.0f, "nw < 0");
        QCHECK(moe_mat_dot_act(t, bs, w, 0, 1, q, 0, -1, out, 1, 1) == MOE_ERR_INVALID, "nx < 0");
        QCHECK(moe_mat_dot_act(t, bs, NULL, 0, 1, q, 0, 1, out, 1, 1) == MOE_ERR_INVALID, "NULL w");
        QCHECK(moe_mat_dot_act(t, bs, w, 0, 1, q, 0, 1, NULL, 1, 1) == MOE_ERR_INVALID, "NULL out");
        QCHECK(moe_mat_dot_act(t, bs + 1, w, 0, 1, q, 0, 1, out, 1, 1) == MOE_ERR_INVALID, "ragged mat");
        QCHECK(moe_gate_up_act(t, bs, w, NULL, 1, q, 0, 1, out, 1) == MOE_ERR_INVALID, "NULL up");
        QCHECK(moe_gate_up_act(t, bs, w, w, -2, q, 0, 1, out, 1) == MOE_ERR_INVALID, "negative rows");
        expected += 14;
        QCHECK(moe_quantize_act(t, x, q, 0) == MOE_OK && moe_vec_dot_act(t, w, q, 0) == 0.0f, "empty");
        QCHECK(moe_mat_dot_act(t, bs, NULL, 0, 0, NULL, 0, 3, NULL, 1, 1) == MOE_OK, "no rows");
        out[0] = 7.0f;
        QCHECK(moe_mat_dot_act(t, 0, w, 0, 1, q, 0, 1, out, 1, 1) == MOE_OK && out[0] == 0.0f, "n = 0 gives 0");
        /* garbage weights with NaN/inf scales and garbage activations: no crash on any path */
        for (size_t i = 0; i < sizeof w; i++) w[i] = (uint8_t)moe_test_rnd64(), q[i] = (uint8_t)moe_test_rnd64();
        for (int a = 0; a < 3; a++) {
            if (!moe_quant_isa_supported(ISAS[a])) continue;
            moe_quant_set_isa(ISAS[a]);
            const int64_t n = bs == 32 ? 1024 : 1536;
            (void)moe_vec_dot_act(t, w, q, n);
            QCHECK(moe_mat_dot_act(t, n, w, 0, 4, q, 0, 3, out, 0, 1) == MOE_OK, "garbage tile");
        }
        moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
    }
    static const int bad_types[] = {-1, 3, 9, 16, 31, 1000};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        const enum moe_qtype t = (enum moe_qtype)bad_types[i];
        QCHECK(moe_quantize_act(t, x, q, 256) == MOE_ERR_INVALID, "type %d quantize_act", bad_types[i]);
        QCHECK(isnan(moe_vec_dot_act(t, w, q, 256)), "type %d dot_act", bad_types[i]);
        QCHECK(moe_mat_dot_act(t, 256, w, 0, 1, q, 0, 1, out, 1, 1) == MOE_ERR_INVALID, "type %d mat", bad_types[i]);
        expected += 3;
    }
    /* non-finite activations: well-formed blocks (quants in range), no crash */
    static const float specials[] = {NAN, INFINITY, -INFINITY, 3.4e38f};
    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < 512; i++) x[i] = i % 5 == s ? specials[s] : moe_test_rnd_normal();
        for (int a = 0; a < 3; a++) {
            if (!moe_quant_isa_supported(ISAS[a])) continue;
            moe_quant_set_isa(ISAS[a]);
            QCHECK(moe_quantize_act(MOE_QTYPE_Q4_K, x, q, 512) == MOE_OK, "special q8_k");
            QCHECK(moe_quantize_act(MOE_QTYPE_Q8_0, x, q + 1024, 512) == MOE_OK, "special q8_0");
        }
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
    QCHECK(g_logs == expected, "every error logged once (%d logs, %d errors)", g_logs, expected);
    moe_log_set(NULL, NULL);
}

/* test_llama_names: llama.cpp's file-type names (issue 26) read as the k-quant
 * of their mix; anything else is refused with the list of types. */
static void test_llama_names(void) {
    static const struct {
        const char *name;
        int want; /* enum moe_qtype, -1 refused */
    } t[] = {{"Q4_K_M", MOE_QTYPE_Q4_K}, {"q3_k_s", MOE_QTYPE_Q3_K}, {"Q5_K_L", MOE_QTYPE_Q5_K},
             {"Q6_K", MOE_QTYPE_Q6_K},   {"Q8_0", MOE_QTYPE_Q8_0},   {"Q8_0_M", -1},
             {"Q4_K_X", -1},             {"Q9_K_M", -1},             {"_M", -1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        enum moe_qtype got = MOE_QTYPE_F32;
        const enum moe_status st = moe_qtype_from_name(t[i].name, &got);
        if (t[i].want < 0)
            QCHECK(st == MOE_ERR_INVALID, "%s refused", t[i].name);
        else
            QCHECK(st == MOE_OK && (int)got == t[i].want, "%s = %s", t[i].name, moe_qtype_name((enum moe_qtype)t[i].want));
    }
}

int main(void) {
    test_llama_names();
    printf("ISAs: scalar yes, avx2 %s, avx512 %s; in use: %s\n",
           moe_quant_isa_supported(MOE_QUANT_ISA_AVX2) ? "yes" : "no (untested)",
           moe_quant_isa_supported(MOE_QUANT_ISA_AVX512) ? "yes" : "no (untested)", moe_quant_isa_name());
    test_table();
    test_traits();
    test_fixtures();
    test_bulk();
    test_simd();
    test_error_bounds();
    test_malformed();
    test_act_quant();
    test_int_dot();
    test_tiles();
    test_tiles_large();
    test_act_malformed();
    printf("test-quant: %d passed, %d failed\n", checks - fails, fails);
    return fails != 0;
}

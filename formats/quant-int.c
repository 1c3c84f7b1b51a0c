/*
 * quant-int.c - integer dot products of quantized weight rows with quantized
 * activation rows: the scalar reference kernels (the specification) and the
 * public functions (moe_quantize_act, moe_vec_dot_act, moe_mat_dot_act,
 * moe_gate_up_act), which pick the ISA's kernels from quant.c's table.
 *
 * The scalar kernels compute the integer sums exactly (int32 cannot overflow:
 * the largest, q6_k's isc, is below 16 * 128 * 16 * 32 * 128 = 2^27) and apply
 * the scales in double, rounding once to float at the end; see moe_vec_dot_act
 * in moe-quant.h for the definition. Blocks are read byte-wise (memcpy for the
 * 16/32-bit fields), so rows need no alignment.
 */
#define MOE_QUANT_INTERNAL 1
#include "moe-quant.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#include <math.h>
#include <string.h>

#include "moe-dtype.h"

/* ---- small helpers ------------------------------------------------------ */

static inline float rd_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return moe_f16_to_f32(h);
}
static inline float rd_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* The pieces of a q8_k activation block. */
struct act_k {
    double d;
    const int8_t *q;
    int16_t bsums[16];
};
static inline void act_k_read(const uint8_t *x, struct act_k *a) {
    a->d = (double)rd_f32(x + offsetof(moe_block_q8_K, d));
    a->q = (const int8_t *)(x + offsetof(moe_block_q8_K, qs));
    memcpy(a->bsums, x + offsetof(moe_block_q8_K, bsums), sizeof a->bsums);
}

/* ---- scalar reference kernels (one weight row, one activation row) ------- */

/* q8_0 x q8_0: isum of each block of 32, scaled by d_w * d_x (exact in float). */
static float ref_q8_0(const uint8_t *w, const uint8_t *x, int64_t nb) {
    double acc = 0.0;
    for (int64_t i = 0; i < nb; i++, w += sizeof(moe_block_q8_0), x += sizeof(moe_block_q8_0)) {
        const int8_t *qw = (const int8_t *)(w + 2), *qx = (const int8_t *)(x + 2);
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += qw[j] * qx[j];
        const float d = rd_f16(w) * rd_f16(x);
        acc += (double)d * (double)isum;
    }
    return (float)acc;
}

/* q4_0 x q8_0: weight j is nibble - 8 (low nibbles: j < 16, high: j >= 16). */
static float ref_q4_0(const uint8_t *w, const uint8_t *x, int64_t nb) {
    double acc = 0.0;
    for (int64_t i = 0; i < nb; i++, w += sizeof(moe_block_q4_0), x += sizeof(moe_block_q8_0)) {
        const uint8_t *qs = w + 2;
        const int8_t *qx = (const int8_t *)(x + 2);
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) isum += ((qs[j] & 15) - 8) * qx[j] + ((qs[j] >> 4) - 8) * qx[j + 16];
        const float d = rd_f16(w) * rd_f16(x);
        acc += (double)d * (double)isum;
    }
    return (float)acc;
}

/* q2_k x q8_k: sub-block s (16 weights) has scale sc[s] & 15 and min sc[s] >> 4;
 * weight 16s + l is (qs[32h + l0 + l] >> 2j) & 3 with s = 8h + 2j + l0/16. */
static float ref_q2_K(const uint8_t *w, const uint8_t *x, int64_t nb) {
    double acc = 0.0;
    for (int64_t i = 0; i < nb; i++, w += sizeof(moe_block_q2_K), x += sizeof(moe_block_q8_K)) {
        struct act_k a;
        act_k_read(x, &a);
        const uint8_t *sc = w + offsetof(moe_block_q2_K, scales), *qs = w + offsetof(moe_block_q2_K, qs);
        int32_t isc = 0, imin = 0;
        for (int s = 0; s < 16; s++) {
            const int h = s / 8, j = (s % 8) / 2, l0 = 16 * (s % 2);
            int32_t sum = 0;
            for (int l = 0; l < 16; l++) sum += ((qs[32 * h + l0 + l] >> (2 * j)) & 3) * a.q[16 * s + l];
            isc += (sc[s] & 15) * sum;
            imin += (sc[s] >> 4) * a.bsums[s];
        }
        const double d = rd_f16(w + offsetof(moe_block_q2_K, d)), dmin = rd_f16(w + offsetof(moe_block_q2_K, dmin));
        acc += a.d * (d * (double)isc - dmin * (double)imin);
    }
    return (float)acc;
}

/* q3_k x q8_k: q = low 2 bits - (hmask bit ? 0 : 4), signed 6-bit scales. */
static float ref_q3_K(const uint8_t *w, const uint8_t *x, int64_t nb) {
    double acc = 0.0;
    for (int64_t i = 0; i < nb; i++, w += sizeof(moe_block_q3_K), x += sizeof(moe_block_q8_K)) {
        struct act_k a;
        act_k_read(x, &a);
        const uint8_t *hm = w + offsetof(moe_block_q3_K, hmask), *qs = w + offsetof(moe_block_q3_K, qs);
        const uint8_t *sc = w + offsetof(moe_block_q3_K, scales);
        int32_t isc = 0;
        for (int s = 0; s < 16; s++) {
            const int h = s / 8, j = (s % 8) / 2, l0 = 16 * (s % 2), hbit = s / 2;
            int32_t sum = 0;
            for (int l = 0; l < 16; l++) {
                const int lo = (qs[32 * h + l0 + l] >> (2 * j)) & 3, hi = (hm[l0 + l] >> hbit) & 1;
                sum += (lo - (hi ? 0 : 4)) * a.q[16 * s + l];
            }
            isc += moe_q3k_scale(s, sc) * sum;
        }
        acc += a.d * ((double)rd_f16(w + offsetof(moe_block_q3_K, d)) * (double)isc);
    }
    return (float)acc;
}

/* q4_k (qh == NULL) and q5_k x q8_k: 8 sub-blocks of 32 with 6-bit scale and
 * min; the min of sub-block j meets the sum of bsums 2j and 2j+1. */
static double ref_k_asym_block(const uint8_t *w, const uint8_t *qs, const uint8_t *qh, const uint8_t *x) {
    struct act_k a;
    act_k_read(x, &a);
    int32_t isc = 0, imin = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        moe_q4k_scale_min(j, w + 4, &sc, &m);
        const int c = j / 2, shift = 4 * (j & 1);
        int32_t sum = 0;
        for (int l = 0; l < 32; l++) {
            int q = (qs[32 * c + l] >> shift) & 15;
            if (qh) q |= ((qh[l] >> j) & 1) << 4;
            sum += q * a.q[32 * j + l];
        }
        isc += sc * sum;
        imin += m * (a.bsums[2 * j] + a.bsums[2 * j + 1]);
    }
    return a.d * ((double)rd_f16(w) * (double)isc - (double)rd_f16(w + 2) * (double)imin);
}

static float ref_q4_K(const uint8_t *w, const uint8_t *x, int64_t nb) {
    double acc = 0.0;
    for (int64_t i = 0; i < nb; i++, w += sizeof(moe_block_q4_K), x += sizeof(moe_block_q8_K))
        acc += ref_k_asym_block(w, w + offsetof(moe_block_q4_K, qs), NULL, x);
    return (float)acc;
}

static float ref_q5_K(const uint8_t *w, const uint8_t *x, int64_t nb) {
    double acc = 0.0;
    for (int64_t i = 0; i < nb; i++, w += sizeof(moe_block_q5_K), x += sizeof(moe_block_q8_K))
        acc += ref_k_asym_block(w, w + offsetof(moe_block_q5_K, qs), w + offsetof(moe_block_q5_K, qh), x);
    return (float)acc;
}

/* q6_k x q8_k: q = 6-bit - 32, int8 scales per 16 (layout in moe-quant.h). */
static float ref_q6_K(const uint8_t *w, const uint8_t *x, int64_t nb) {
    double acc = 0.0;
    for (int64_t i = 0; i < nb; i++, w += sizeof(moe_block_q6_K), x += sizeof(moe_block_q8_K)) {
        struct act_k a;
        act_k_read(x, &a);
        const uint8_t *ql = w + offsetof(moe_block_q6_K, ql), *qh = w + offsetof(moe_block_q6_K, qh);
        const int8_t *sc = (const int8_t *)(w + offsetof(moe_block_q6_K, scales));
        int32_t isc = 0;
        for (int s = 0; s < 16; s++) {
            const int h = s / 8, g = (s % 8) / 2, l0 = 16 * (s % 2);
            const uint8_t *lq = ql + 64 * h + 32 * (g & 1) + l0, *hq = qh + 32 * h + l0;
            int32_t sum = 0;
            for (int l = 0; l < 16; l++) {
                const int q = (((lq[l] >> (4 * (g >> 1))) & 15) | (((hq[l] >> (2 * g)) & 3) << 4)) - 32;
                sum += q * a.q[16 * s + l];
            }
            isc += sc[s] * sum;
        }
        acc += a.d * ((double)rd_f16(w + offsetof(moe_block_q6_K, d)) * (double)isc);
    }
    return (float)acc;
}

/* Every tile shape of the scalar table is the 1x1 kernel in a loop. */
#define REF_TILES(T)                                                                         \
    static void ref_##T##_tile(int R, int C, const uint8_t *const *w, const uint8_t *const *x, \
                               int64_t nb, float *out) {                                     \
        for (int r = 0; r < R; r++)                                                          \
            for (int c = 0; c < C; c++) out[r * C + c] = ref_##T(w[r], x[c], nb);            \
    }                                                                                        \
    static void ref_##T##_1x1(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        ref_##T##_tile(1, 1, w, x, nb, o);                                                   \
    }                                                                                        \
    static void ref_##T##_1x2(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        ref_##T##_tile(1, 2, w, x, nb, o);                                                   \
    }                                                                                        \
    static void ref_##T##_1x4(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        ref_##T##_tile(1, 4, w, x, nb, o);                                                   \
    }                                                                                        \
    static void ref_##T##_4x1(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        ref_##T##_tile(4, 1, w, x, nb, o);                                                   \
    }

REF_TILES(q8_0)
REF_TILES(q4_0)
REF_TILES(q2_K)
REF_TILES(q3_K)
REF_TILES(q4_K)
REF_TILES(q5_K)
REF_TILES(q6_K)

/* The _r16 layouts (moe-quant.h): one group of 16 rows against C activations;
 * each row's block is read back into a stored block and goes through the
 * stored type's reference, so the results are ref_q4_K's / ref_q8_0's on the
 * unpacked rows, bit for bit. */
static void ref_r16_tile(enum moe_qtype layout, int C, const uint8_t *const *w, const uint8_t *const *x, int64_t nb,
                         float *out) {
    const int q8 = layout == MOE_QTYPE_Q8_0_R16;
    const size_t bb = q8 ? sizeof(moe_block_q8_0) : sizeof(moe_block_q4_K);
    const size_t ab = q8 ? sizeof(moe_block_q8_0) : sizeof(moe_block_q8_K);
    double acc[16 * 4] = {0};
    uint8_t blk[sizeof(moe_block_q4_K)];
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *g = w[0] + (size_t)i * 16 * bb;
        for (int r = 0; r < 16; r++) {
            moe_r16_unpack_block(layout, g, r, blk);
            for (int c = 0; c < C; c++) {
                const uint8_t *xb = x[c] + (size_t)i * ab;
                if (q8) {
                    const int8_t *qw = (const int8_t *)(blk + 2), *qx = (const int8_t *)(xb + 2);
                    int32_t isum = 0;
                    for (int j = 0; j < 32; j++) isum += qw[j] * qx[j];
                    acc[r * C + c] += (double)(rd_f16(blk) * rd_f16(xb)) * (double)isum;
                } else {
                    acc[r * C + c] += ref_k_asym_block(blk, blk + offsetof(moe_block_q4_K, qs), NULL, xb);
                }
            }
        }
    }
    for (int k = 0; k < 16 * C; k++) out[k] = (float)acc[k];
}
#define REF_R16(T, L)                                                                                    \
    static void ref_##T##_r16_1x1(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        ref_r16_tile(L, 1, w, x, nb, o);                                                                  \
    }                                                                                                     \
    static void ref_##T##_r16_1x2(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        ref_r16_tile(L, 2, w, x, nb, o);                                                                  \
    }                                                                                                     \
    static void ref_##T##_r16_1x4(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *o) { \
        ref_r16_tile(L, 4, w, x, nb, o);                                                                  \
    }
REF_R16(q4_K, MOE_QTYPE_Q4_K_R16)
REF_R16(q8_0, MOE_QTYPE_Q8_0_R16)

#define SET_TILES(k, TYPE, P, T)                                                  \
    do {                                                                         \
        (k)->dotq[MOE_QTYPE_##TYPE][MOE_TILE_1X1] = P##_##T##_1x1;               \
        (k)->dotq[MOE_QTYPE_##TYPE][MOE_TILE_1X2] = P##_##T##_1x2;               \
        (k)->dotq[MOE_QTYPE_##TYPE][MOE_TILE_1X4] = P##_##T##_1x4;               \
        (k)->dotq[MOE_QTYPE_##TYPE][MOE_TILE_4X1] = P##_##T##_4x1;               \
    } while (0)

void moe_quant_int_kernels_scalar(struct moe_quant_kernels *k) {
    SET_TILES(k, Q8_0, ref, q8_0);
    SET_TILES(k, Q4_0, ref, q4_0);
    SET_TILES(k, Q2_K, ref, q2_K);
    SET_TILES(k, Q3_K, ref, q3_K);
    SET_TILES(k, Q4_K, ref, q4_K);
    SET_TILES(k, Q5_K, ref, q5_K);
    SET_TILES(k, Q6_K, ref, q6_K);
    /* the _r16 layouts: the tiles are 16 rows (a group) x 1, 2, 4 activations */
    k->dotq[MOE_QTYPE_Q4_K_R16][MOE_TILE_1X1] = ref_q4_K_r16_1x1;
    k->dotq[MOE_QTYPE_Q4_K_R16][MOE_TILE_1X2] = ref_q4_K_r16_1x2;
    k->dotq[MOE_QTYPE_Q4_K_R16][MOE_TILE_1X4] = ref_q4_K_r16_1x4;
    k->dotq[MOE_QTYPE_Q8_0_R16][MOE_TILE_1X1] = ref_q8_0_r16_1x1;
    k->dotq[MOE_QTYPE_Q8_0_R16][MOE_TILE_1X2] = ref_q8_0_r16_1x2;
    k->dotq[MOE_QTYPE_Q8_0_R16][MOE_TILE_1X4] = ref_q8_0_r16_1x4;
    memset(k->fast_layout, 0, sizeof k->fast_layout);
    k->int_name = "scalar";
}

/* ==== public functions =================================================== */

enum moe_qtype moe_act_type(enum moe_qtype wt) {
    const struct moe_type_traits *tr = moe_type_traits(wt); /* the type table (quant.c) */
    return tr ? tr->act_type : MOE_QTYPE_F32;
}

size_t moe_act_row_bytes(enum moe_qtype wt, int64_t n) {
    if (moe_qtype_group_rows(wt) == 0 || n < 0 || n % moe_qtype_block_size(wt) != 0) return 0;
    return moe_qtype_row_bytes(moe_act_type(wt), n);
}

/* Validates a weight type and row length; logs under the caller's name.
 * Returns the number of weight blocks (elements for plain types) in *nb. */
static enum moe_status check_act(const char *fn, enum moe_qtype wt, int64_t n, int64_t *nb) {
    if (moe_qtype_group_rows(wt) == 0) {
        moe_log_func(MOE_LOG_ERROR, fn, "invalid quantization type %d", (int)wt);
        return MOE_ERR_INVALID;
    }
    const int bs = moe_qtype_block_size(wt);
    if (n < 0 || n % bs != 0) {
        moe_log_func(MOE_LOG_ERROR, fn, "%s: row length %lld is not a non-negative multiple of %d",
                     moe_qtype_name(wt), (long long)n, bs);
        return MOE_ERR_INVALID;
    }
    *nb = n / bs;
    return MOE_OK;
}

enum moe_status moe_quantize_act(enum moe_qtype wt, const float *x, void *xq, int64_t n) {
    int64_t nb;
    enum moe_status st = check_act(__func__, wt, n, &nb);
    if (st != MOE_OK) return st;
    if ((!x || !xq) && n > 0) {
        MOE_LOGE("NULL row pointer");
        return MOE_ERR_INVALID;
    }
    if (n == 0) return MOE_OK;
    const enum moe_qtype at = moe_act_type(wt);
    if (at == MOE_QTYPE_F32) {
        memcpy(xq, x, (size_t)n * sizeof(float));
        return MOE_OK;
    }
    moe_quant_kernels_now()->quant_act[at](x, xq, n / moe_qtype_block_size(at));
    return MOE_OK;
}

float moe_vec_dot_act(enum moe_qtype wt, const void *w, const void *xq, int64_t n) {
    int64_t nb;
    if (check_act(__func__, wt, n, &nb) != MOE_OK) return NAN;
    if (moe_qtype_group_rows(wt) != 1) {
        MOE_LOGE("%s: a row of an interleaved layout is not contiguous; use moe_mat_dot_act", moe_qtype_name(wt));
        return NAN;
    }
    if ((!w || !xq) && n > 0) {
        MOE_LOGE("NULL row pointer");
        return NAN;
    }
    if (n == 0) return 0.0f;
    const struct moe_quant_kernels *k = moe_quant_kernels_now();
    const moe_dotq_fn f = k->dotq[wt][MOE_TILE_1X1];
    if (!f) return k->dot[wt](w, (const float *)xq, nb);
    const uint8_t *wp = w, *xp = xq;
    float out;
    f(&wp, &xp, nb, &out);
    return out;
}

/* Weight bytes per row chunk when several activations pass over the same rows:
 * small enough for the chunk to stay in L2 while 4 activation rows sit in L1. */
#define CHUNK_BYTES (64 * 1024)

/* The chunked tile loop: units of R weight rows (R = 1, or 16 for the
 * interleaved groups of q4_k_r16: unit u starts at w0 + u R ws), `chunk`
 * units at a time against every activation, 4 activations per call where
 * there are 4; a call's outputs come as o[r * C + c] (r < R). */
static void chunk_loop(const moe_dotq_fn *f, int R, int64_t chunk, int64_t nb, const uint8_t *w0, size_t ws,
                       int64_t nw, const uint8_t *x0, size_t xs, int64_t nx, float *out, size_t osw, size_t osx) {
    float o[16 * 4];
    const int64_t nu = nw / R;
    for (int64_t u0 = 0; u0 < nu; u0 += chunk) {
        const int64_t u1 = u0 + chunk < nu ? u0 + chunk : nu;
        for (int64_t c = 0; c < nx;) {
            const int64_t left = nx - c;
            const enum moe_tile s = left >= 4 ? MOE_TILE_1X4 : left >= 2 ? MOE_TILE_1X2 : MOE_TILE_1X1;
            const int C = moe_tile_cols(s);
            const uint8_t *x[4] = {x0 + c * xs, x0 + (c + 1) * xs, x0 + (c + 2) * xs, x0 + (c + 3) * xs};
            for (int64_t u = u0; u < u1; u++) {
                const uint8_t *w = w0 + (size_t)(u * R) * ws;
                f[s](&w, x, nb, o);
                for (int r = 0; r < R; r++)
                    for (int i = 0; i < C; i++) out[(u * R + r) * (int64_t)osw + (c + i) * (int64_t)osx] = o[r * C + i];
            }
            c += C;
        }
    }
}

/* The tile loops shared by moe_mat_dot_act and moe_gate_up_act: weight rows
 * w0 + r * ws (r < nw) against activation rows x0 + c * xs (c < nx), results
 * at out[r * osw + c * osx]. */
static void tile_loop(const struct moe_quant_kernels *k, enum moe_qtype wt, int64_t nb, const uint8_t *w0,
                      size_t ws, int64_t nw, const uint8_t *x0, size_t xs, int64_t nx, float *out, size_t osw,
                      size_t osx) {
    const moe_dotq_fn *f = k->dotq[wt];
    float o[4];
    const int R = moe_qtype_group_rows(wt);
    const size_t ub = (size_t)R * ws; /* bytes of a unit (a row, or a group of 16 interleaved rows) */
    if (R > 1) {
        /* groups: one sequential stream over the matrix for one activation;
         * chunks of about CHUNK_BYTES for several */
        chunk_loop(f, R, nx == 1 ? nw / R : ub >= CHUNK_BYTES ? 1 : (int64_t)(CHUNK_BYTES / ub), nb, w0, ws, nw, x0, xs,
                   nx, out, osw, osx);
        return;
    }
    if (!f[MOE_TILE_1X1]) { /* plain types: float activations, moe_vec_dot's kernel */
        for (int64_t r = 0; r < nw; r++)
            for (int64_t c = 0; c < nx; c++)
                out[r * osw + c * osx] = k->dot[wt](w0 + r * ws, (const float *)(const void *)(x0 + c * xs), nb);
        return;
    }
    if (nx == 1) {
        /* 4 rows a quarter of the matrix apart: four long sequential streams,
         * which hardware prefetchers follow (4 adjacent rows per call would
         * start 4 short cold streams every call and run at a fraction of the
         * bandwidth); then the last nw % 4 rows one by one */
        const int64_t q = nw / 4;
        for (int64_t r = 0; r < q; r++) {
            const uint8_t *w[4] = {w0 + r * ws, w0 + (q + r) * ws, w0 + (2 * q + r) * ws, w0 + (3 * q + r) * ws};
            f[MOE_TILE_4X1](w, &x0, nb, o);
            for (int i = 0; i < 4; i++) out[(i * q + r) * osw] = o[i];
        }
        for (int64_t r = 4 * q; r < nw; r++) {
            const uint8_t *w = w0 + r * ws;
            f[MOE_TILE_1X1](&w, &x0, nb, o);
            out[r * osw] = o[0];
        }
        return;
    }
    const size_t rb = moe_qtype_row_bytes(wt, nb * moe_qtype_block_size(wt));
    chunk_loop(f, 1, rb >= CHUNK_BYTES ? 1 : (int64_t)(CHUNK_BYTES / rb), nb, w0, ws, nw, x0, xs, nx, out, osw, osx);
}

/* Common argument checks of the matrix functions; logs under fn. */
static enum moe_status check_mat(const char *fn, enum moe_qtype wt, int64_t n, int64_t nw, int64_t nx,
                                 const void *w, const void *w2, size_t w_stride, const void *xq, const float *out,
                                 int64_t *nb) {
    enum moe_status st = check_act(fn, wt, n, nb);
    if (st != MOE_OK) return st;
    if (nw < 0 || nx < 0) {
        moe_log_func(MOE_LOG_ERROR, fn, "negative row count (%lld weight rows, %lld activations)", (long long)nw,
                     (long long)nx);
        return MOE_ERR_INVALID;
    }
    const int gr = moe_qtype_group_rows(wt);
    if (gr > 1 && (nw % gr != 0 || (w_stride != moe_qtype_row_bytes(wt, n) && nw > 0))) {
        moe_log_func(MOE_LOG_ERROR, fn, "%s: %lld rows with a stride of %zu bytes are not whole groups of %d rows",
                     moe_qtype_name(wt), (long long)nw, w_stride, gr);
        return MOE_ERR_INVALID;
    }
    if (nw > 0 && nx > 0 && (!out || (n > 0 && (!w || !w2 || !xq)))) {
        moe_log_func(MOE_LOG_ERROR, fn, "NULL pointer");
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

enum moe_status moe_mat_dot_act(enum moe_qtype wt, int64_t n, const void *w, size_t w_stride, int64_t nw,
                                const void *xq, size_t x_stride, int64_t nx, float *out, size_t out_sw,
                                size_t out_sx) {
    int64_t nb;
    enum moe_status st = check_mat(__func__, wt, n, nw, nx, w, w, w_stride, xq, out, &nb);
    if (st != MOE_OK) return st;
    if (nw == 0 || nx == 0) return MOE_OK;
    if (n == 0) {
        for (int64_t r = 0; r < nw; r++)
            for (int64_t c = 0; c < nx; c++) out[r * out_sw + c * out_sx] = 0.0f;
        return MOE_OK;
    }
    tile_loop(moe_quant_kernels_now(), wt, nb, w, w_stride, nw, xq, x_stride, nx, out, out_sw, out_sx);
    return MOE_OK;
}

/* The runtime's SiLU (runtime/cpu/forward.c), so that results match it. */
static inline float silu(float g) { return g / (1.0f + expf(-g)); }

enum moe_status moe_gate_up_act(enum moe_qtype wt, int64_t n, const void *gate, const void *up, int64_t rows,
                                const void *xq, size_t x_stride, int64_t nx, float *h, size_t ldh) {
    int64_t nb;
    enum moe_status st = check_mat(__func__, wt, n, rows, nx, gate, up, moe_qtype_row_bytes(wt, n), xq, h, &nb);
    if (st != MOE_OK) return st;
    if (rows == 0 || nx == 0) return MOE_OK;
    if (n == 0) { /* silu(0) * 0 */
        for (int64_t c = 0; c < nx; c++)
            for (int64_t r = 0; r < rows; r++) h[c * ldh + r] = 0.0f;
        return MOE_OK;
    }
    const struct moe_quant_kernels *k = moe_quant_kernels_now();
    const size_t rb = moe_qtype_row_bytes(wt, n);
    const uint8_t *g0 = gate, *u0 = up, *x0 = xq;
    /* Row chunks: the gate rows of a chunk against every activation into h,
     * then the up rows of the chunk, 4 activations at a time into u, combined
     * in place. With one activation the chunks are long (4 sequential streams
     * each, see tile_loop); with several they are CHUNK_BYTES, so that a
     * chunk stays in cache while all activations pass over it. (Reading gate
     * and up rows in the same kernel call was measured 5-15 % slower for one
     * activation: the extra streams from a second matrix cost more than the
     * shared activation loads save.) */
    enum { UCHUNK = 1024 };
    float u[UCHUNK * 4];
    int64_t chunk = UCHUNK;
    if (nx > 1) chunk = rb >= CHUNK_BYTES ? 1 : (int64_t)(CHUNK_BYTES / rb) < UCHUNK ? (int64_t)(CHUNK_BYTES / rb) : UCHUNK;
    const int gr = moe_qtype_group_rows(wt); /* chunks of whole groups (UCHUNK is a multiple of 16) */
    if (gr > 1) chunk = chunk < gr ? gr : chunk / gr * gr;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t rn = rows - r0 < chunk ? rows - r0 : chunk;
        tile_loop(k, wt, nb, g0 + r0 * rb, rb, rn, x0, x_stride, nx, h + r0, 1, ldh);
        for (int64_t c0 = 0; c0 < nx; c0 += 4) {
            const int64_t cn = nx - c0 < 4 ? nx - c0 : 4;
            tile_loop(k, wt, nb, u0 + r0 * rb, rb, rn, x0 + c0 * x_stride, x_stride, cn, u, 1, UCHUNK);
            for (int64_t c = 0; c < cn; c++)
                for (int64_t r = 0; r < rn; r++) {
                    float *hp = h + (c0 + c) * ldh + r0 + r;
                    *hp = silu(*hp) * u[c * UCHUNK + r];
                }
        }
    }
    return MOE_OK;
}

const char *moe_quant_int_isa_name(void) { return moe_quant_kernels_now()->int_name; }

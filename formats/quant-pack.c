/*
 * quant-pack.c - row-interleaved runtime layouts (moe_repack): the q4_k_r16
 * layout described in moe-quant.h, written from and read back into stored
 * q4_k rows. Plain byte moves; the kernels that read the layout live with the
 * other integer kernels (quant-int*.c).
 */
#define MOE_QUANT_INTERNAL 1
#include "moe-quant.h"

#include <string.h>

/* Bytes of one group super-block and the offsets of its parts (moe-quant.h). */
enum {
    R16_ROWS = 16,
    R16_SB = R16_ROWS * (int)sizeof(moe_block_q4_K), /* 2304 */
    R16_D = 0,
    R16_DMIN = 32,
    R16_S = 64, /* S0, S1, S2: 64 bytes each */
    R16_QS = 256,
};

int moe_qtype_group_rows(enum moe_qtype t) {
    if (t == MOE_QTYPE_Q4_K_R16) return R16_ROWS;
    return moe_qtype_valid(t) ? 1 : 0;
}

enum moe_qtype moe_stored_type(enum moe_qtype t) { return t == MOE_QTYPE_Q4_K_R16 ? MOE_QTYPE_Q4_K : t; }

enum moe_qtype moe_repack_type(enum moe_qtype t, int64_t n_out, int64_t n_in) {
    if (t == MOE_QTYPE_Q4_K && n_out > 0 && n_out % R16_ROWS == 0 && n_in > 0 && n_in % MOE_QK_K == 0 &&
        moe_quant_kernels_now()->fast_r16)
        return MOE_QTYPE_Q4_K_R16;
    return t;
}

/* One super-block of 16 stored q4_k rows (row r's block at rows[r]) into the
 * group layout at g. */
static void pack_sb(const uint8_t *const *rows, uint8_t *g) {
    for (int r = 0; r < R16_ROWS; r++) {
        const uint8_t *b = rows[r];
        memcpy(g + R16_D + 2 * r, b + offsetof(moe_block_q4_K, d), 2);
        memcpy(g + R16_DMIN + 2 * r, b + offsetof(moe_block_q4_K, dmin), 2);
        for (int k = 0; k < 3; k++) memcpy(g + R16_S + 64 * k + 4 * r, b + offsetof(moe_block_q4_K, scales) + 4 * k, 4);
        for (int c = 0; c < 32; c++) memcpy(g + R16_QS + 64 * c + 4 * r, b + offsetof(moe_block_q4_K, qs) + 4 * c, 4);
    }
}

/* The inverse for one row: row r of the group super-block g into block b. */
void moe_r16_unpack_block(const uint8_t *g, int r, uint8_t *b) {
    memcpy(b + offsetof(moe_block_q4_K, d), g + R16_D + 2 * r, 2);
    memcpy(b + offsetof(moe_block_q4_K, dmin), g + R16_DMIN + 2 * r, 2);
    for (int k = 0; k < 3; k++) memcpy(b + offsetof(moe_block_q4_K, scales) + 4 * k, g + R16_S + 64 * k + 4 * r, 4);
    for (int c = 0; c < 32; c++) memcpy(b + offsetof(moe_block_q4_K, qs) + 4 * c, g + R16_QS + 64 * c + 4 * r, 4);
}

enum moe_status moe_repack(enum moe_qtype t, enum moe_qtype to, int64_t n_out, int64_t n_in, const void *src,
                           void *dst) {
    const size_t rb = moe_qtype_row_bytes(t, n_in);
    if (!moe_qtype_valid(t) || n_out < 0 || n_in < 0 || (rb == 0 && n_in > 0)) {
        MOE_LOGE("invalid matrix: type %s, %lld x %lld", moe_qtype_name(t), (long long)n_out, (long long)n_in);
        return MOE_ERR_INVALID;
    }
    if (to != t && !(t == MOE_QTYPE_Q4_K && to == MOE_QTYPE_Q4_K_R16 && n_out % R16_ROWS == 0)) {
        MOE_LOGE("a %s matrix of %lld rows cannot take the layout %s", moe_qtype_name(t), (long long)n_out,
                 moe_qtype_name(to));
        return MOE_ERR_INVALID;
    }
    if ((!src || !dst) && n_out > 0 && n_in > 0) {
        MOE_LOGE("NULL matrix pointer");
        return MOE_ERR_INVALID;
    }
    if (n_out == 0 || n_in == 0) return MOE_OK;
    if (to == t) {
        memcpy(dst, src, (size_t)n_out * rb);
        return MOE_OK;
    }
    const int64_t nb = n_in / MOE_QK_K;
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (int64_t g = 0; g < n_out / R16_ROWS; g++) {
        const uint8_t *rows[R16_ROWS];
        for (int r = 0; r < R16_ROWS; r++) rows[r] = s + (size_t)(g * R16_ROWS + r) * rb;
        for (int64_t i = 0; i < nb; i++) {
            pack_sb(rows, d + (size_t)(g * nb + i) * R16_SB);
            for (int r = 0; r < R16_ROWS; r++) rows[r] += sizeof(moe_block_q4_K);
        }
    }
    return MOE_OK;
}

/* The checks of the row functions below; logs under the caller's name. */
static enum moe_status check_row_of(const char *fn, enum moe_qtype t, int64_t n_in, const void *data, int64_t row,
                                    const void *dst) {
    const size_t rb = moe_qtype_row_bytes(t, n_in);
    if (moe_qtype_group_rows(t) == 0 || row < 0 || (rb == 0 && n_in > 0) || ((!data || !dst) && n_in > 0)) {
        moe_log_func(MOE_LOG_ERROR, fn, "invalid row %lld of a %s matrix with rows of %lld", (long long)row,
                     moe_qtype_name(t), (long long)n_in);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

enum moe_status moe_unpack_row(enum moe_qtype t, int64_t n_in, const void *data, int64_t row, void *dst) {
    const size_t rb = moe_qtype_row_bytes(t, n_in);
    enum moe_status st = check_row_of(__func__, t, n_in, data, row, dst);
    if (st || n_in == 0) return st;
    if (t != MOE_QTYPE_Q4_K_R16) {
        memcpy(dst, (const uint8_t *)data + (size_t)row * rb, rb);
        return MOE_OK;
    }
    const int64_t nb = n_in / MOE_QK_K, g = row / R16_ROWS;
    const uint8_t *src = (const uint8_t *)data + (size_t)(g * nb) * R16_SB;
    uint8_t *d = dst;
    for (int64_t i = 0; i < nb; i++) moe_r16_unpack_block(src + (size_t)i * R16_SB, (int)(row % R16_ROWS), d + i * sizeof(moe_block_q4_K));
    return MOE_OK;
}

enum moe_status moe_dequantize_row_of(enum moe_qtype t, int64_t n_in, const void *data, int64_t row, float *dst) {
    const size_t rb = moe_qtype_row_bytes(t, n_in);
    enum moe_status st = check_row_of(__func__, t, n_in, data, row, dst);
    if (st) return st;
    if (t != MOE_QTYPE_Q4_K_R16) return moe_dequantize_row(t, (const uint8_t *)data + (size_t)row * rb, dst, n_in);
    /* a super-block at a time through a stored block on the stack */
    const int64_t nb = n_in / MOE_QK_K, g = row / R16_ROWS;
    const uint8_t *src = (const uint8_t *)data + (size_t)(g * nb) * R16_SB;
    uint8_t blk[sizeof(moe_block_q4_K)];
    for (int64_t i = 0; i < nb; i++) {
        moe_r16_unpack_block(src + (size_t)i * R16_SB, (int)(row % R16_ROWS), blk);
        moe_dequantize_row(MOE_QTYPE_Q4_K, blk, dst + i * MOE_QK_K, MOE_QK_K);
    }
    return MOE_OK;
}

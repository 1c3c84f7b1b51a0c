/*
 * quant-pack.c - row-interleaved runtime layouts (moe_repack): q4_k_r16 and
 * q8_0_r16, described in moe-quant.h, written from and read back into stored
 * rows. Plain byte moves; the kernels that read the layouts live with the
 * other integer kernels (quant-int*.c).
 */
#define MOE_QUANT_INTERNAL 1
#include "moe-quant.h"

#include <string.h>

/* Rows of a group in the byte layouts below (both _r16 layouts; their table
 * rows say group_rows = 16, which test-quant checks). Which type takes which
 * layout, and a layout's group size, are read from the type table. */
enum { R16_ROWS = 16 };

/* The layout moe_repack may give a stored type t (the table's `repack`), or t
 * itself when it has none (also for a layout or an unsupported id). */
static enum moe_qtype layout_of(enum moe_qtype t) {
    const struct moe_type_traits *tr = moe_type_traits(t);
    return tr && tr->file_type ? tr->repack : t;
}

int moe_qtype_group_rows(enum moe_qtype t) {
    const struct moe_type_traits *tr = moe_type_traits(t);
    return tr ? tr->group_rows : 0;
}

enum moe_qtype moe_stored_type(enum moe_qtype t) {
    const struct moe_type_traits *tr = moe_type_traits(t);
    return tr ? tr->stored : t;
}

enum moe_qtype moe_repack_type(enum moe_qtype t, int64_t n_out, int64_t n_in) {
    const enum moe_qtype l = layout_of(t);
    if (l != t && n_out > 0 && n_out % moe_qtype_group_rows(l) == 0 && n_in > 0 &&
        n_in % moe_qtype_block_size(t) == 0 && moe_quant_kernels_now()->fast_layout[l])
        return l;
    return t;
}

/* Where the parts of one stored block go in a group block of 16 (layouts in
 * moe-quant.h): `n` runs of `len` bytes, run k from src offset so + k * len
 * to group offset go + k * 64 + len * r (4-byte columns and the f16 fields). */
struct run {
    int so, go, len, n;
};
static int runs_of(enum moe_qtype layout, struct run *r) {
    if (layout == MOE_QTYPE_Q4_K_R16) {
        r[0] = (struct run){offsetof(moe_block_q4_K, d), 0, 2, 1};
        r[1] = (struct run){offsetof(moe_block_q4_K, dmin), 32, 2, 1};
        r[2] = (struct run){offsetof(moe_block_q4_K, scales), 64, 4, 3};
        r[3] = (struct run){offsetof(moe_block_q4_K, qs), 256, 4, 32};
        return 4;
    }
    r[0] = (struct run){offsetof(moe_block_q8_0, d), 0, 2, 1};
    r[1] = (struct run){offsetof(moe_block_q8_0, qs), 32, 4, 8};
    return 2;
}

/* The bytes of a layout's quants are stored XOR this (q8_0_r16: q + 128). */
static uint8_t flip_of(enum moe_qtype layout) { return layout == MOE_QTYPE_Q8_0_R16 ? 0x80 : 0; }

/* One stored block of row r between b and the group block g: into the group
 * (pack) or out of it; the quants XOR the layout's flip either way. */
static void move_block(enum moe_qtype layout, const uint8_t *from, uint8_t *to, int r, int pack) {
    struct run rs[4];
    const int n = runs_of(layout, rs);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < rs[i].n; k++) {
            const size_t go = (size_t)(rs[i].go + (rs[i].len == 2 ? 2 * r : 64 * k + 4 * r));
            const size_t bo = (size_t)(rs[i].so + rs[i].len * k);
            uint8_t *d = to + (pack ? go : bo);
            memcpy(d, from + (pack ? bo : go), (size_t)rs[i].len);
            if (i == n - 1) /* the last run holds the quants */
                for (int j = 0; j < rs[i].len; j++) d[j] ^= flip_of(layout);
        }
}

void moe_r16_unpack_block(enum moe_qtype t, const uint8_t *g, int r, uint8_t *block) { move_block(t, g, block, r, 0); }

static inline uint32_t ld_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline void st_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* pack_group: 16 stored rows (rb bytes each, nb blocks) at src into one group
 * of layout `to` at dst (not overlapping). The same byte moves as move_block,
 * written out per layout with fixed offsets so that they compile to plain
 * 32-bit loads and stores: a miss's copy is repacked at memory speed. */
static void pack_group(enum moe_qtype to, const uint8_t *src, size_t rb, int64_t nb, uint8_t *dst) {
    if (to == MOE_QTYPE_Q8_0_R16) {
        const size_t bb = sizeof(moe_block_q8_0);
        for (int64_t i = 0; i < nb; i++) {
            uint8_t *g = dst + (size_t)i * R16_ROWS * bb;
            for (int r = 0; r < R16_ROWS; r++) {
                const uint8_t *b = src + (size_t)r * rb + (size_t)i * bb;
                memcpy(g + 2 * r, b + offsetof(moe_block_q8_0, d), 2);
                const uint8_t *q = b + offsetof(moe_block_q8_0, qs);
                for (int c = 0; c < 8; c++) st_u32(g + 32 + 64 * c + 4 * r, ld_u32(q + 4 * c) ^ 0x80808080u);
            }
        }
        return;
    }
    /* q4_k_r16 */
    const size_t bb = sizeof(moe_block_q4_K);
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *g = dst + (size_t)i * R16_ROWS * bb;
        for (int r = 0; r < R16_ROWS; r++) {
            const uint8_t *b = src + (size_t)r * rb + (size_t)i * bb;
            memcpy(g + 2 * r, b + offsetof(moe_block_q4_K, d), 2);
            memcpy(g + 32 + 2 * r, b + offsetof(moe_block_q4_K, dmin), 2);
            for (int k = 0; k < 3; k++) st_u32(g + 64 + 64 * k + 4 * r, ld_u32(b + offsetof(moe_block_q4_K, scales) + 4 * k));
            const uint8_t *q = b + offsetof(moe_block_q4_K, qs);
            for (int c = 0; c < 32; c++) st_u32(g + 256 + 64 * c + 4 * r, ld_u32(q + 4 * c));
        }
    }
}

enum moe_status moe_repack(enum moe_qtype t, enum moe_qtype to, int64_t n_out, int64_t n_in, const void *src,
                           void *dst) {
    const size_t rb = moe_qtype_row_bytes(t, n_in);
    if (!moe_qtype_valid(t) || n_out < 0 || n_in < 0 || (rb == 0 && n_in > 0)) {
        MOE_LOGE("invalid matrix: type %s, %lld x %lld", moe_qtype_name(t), (long long)n_out, (long long)n_in);
        return MOE_ERR_INVALID;
    }
    if (to != t && !(to == layout_of(t) && n_out % moe_qtype_group_rows(to) == 0)) {
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
    const int64_t nb = n_in / moe_qtype_block_size(t);
    const size_t gbytes = R16_ROWS * rb; /* a group's bytes, the same in both layouts */
    for (int64_t g = 0; g < n_out / R16_ROWS; g++)
        pack_group(to, (const uint8_t *)src + (size_t)g * gbytes, rb, nb, (uint8_t *)dst + (size_t)g * gbytes);
    return MOE_OK;
}

enum moe_status moe_repack_in_place(enum moe_qtype t, enum moe_qtype to, int64_t n_out, int64_t n_in, void *data,
                                    void *tmp, size_t tmp_size) {
    const size_t rb = moe_qtype_row_bytes(t, n_in);
    if (!moe_qtype_valid(t) || n_out < 0 || n_in < 0 || (rb == 0 && n_in > 0) ||
        (to != t && !(to == layout_of(t) && n_out % moe_qtype_group_rows(to) == 0))) {
        MOE_LOGE("invalid matrix or layout: type %s, %lld x %lld, to %s", moe_qtype_name(t), (long long)n_out,
                 (long long)n_in, moe_qtype_name(to));
        return MOE_ERR_INVALID;
    }
    if (to == t || n_out == 0 || n_in == 0) return MOE_OK;
    const size_t gbytes = R16_ROWS * rb;
    if (!data || !tmp || tmp_size < gbytes) {
        MOE_LOGE("NULL matrix pointer or a scratch buffer under one group (%zu bytes)", gbytes);
        return MOE_ERR_INVALID;
    }
    const int64_t nb = n_in / moe_qtype_block_size(t);
    for (int64_t g = 0; g < n_out / R16_ROWS; g++) {
        uint8_t *p = (uint8_t *)data + (size_t)g * gbytes;
        memcpy(tmp, p, gbytes); /* 16 rows: small enough to stay in cache while they are scattered back */
        pack_group(to, tmp, rb, nb, p);
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
    if (moe_qtype_group_rows(t) == 1) {
        memcpy(dst, (const uint8_t *)data + (size_t)row * rb, rb);
        return MOE_OK;
    }
    const size_t bb = moe_qtype_block_bytes(t), gb = R16_ROWS * bb;
    const int64_t nb = n_in / moe_qtype_block_size(t), g = row / R16_ROWS;
    const uint8_t *src = (const uint8_t *)data + (size_t)(g * nb) * gb;
    uint8_t *d = dst;
    for (int64_t i = 0; i < nb; i++) moe_r16_unpack_block(t, src + (size_t)i * gb, (int)(row % R16_ROWS), d + i * bb);
    return MOE_OK;
}

enum moe_status moe_dequantize_row_of(enum moe_qtype t, int64_t n_in, const void *data, int64_t row, float *dst) {
    const size_t rb = moe_qtype_row_bytes(t, n_in);
    enum moe_status st = check_row_of(__func__, t, n_in, data, row, dst);
    if (st) return st;
    if (moe_qtype_group_rows(t) == 1) return moe_dequantize_row(t, (const uint8_t *)data + (size_t)row * rb, dst, n_in);
    /* a block at a time through a stored block on the stack */
    const enum moe_qtype s = moe_stored_type(t);
    const size_t bb = moe_qtype_block_bytes(t), gb = R16_ROWS * bb;
    const int bs = moe_qtype_block_size(t);
    const int64_t nb = n_in / bs, g = row / R16_ROWS;
    const uint8_t *src = (const uint8_t *)data + (size_t)(g * nb) * gb;
    uint8_t blk[sizeof(moe_block_q4_K)];
    for (int64_t i = 0; i < nb; i++) {
        moe_r16_unpack_block(t, src + (size_t)i * gb, (int)(row % R16_ROWS), blk);
        moe_dequantize_row(s, blk, dst + i * bs, bs);
    }
    return MOE_OK;
}

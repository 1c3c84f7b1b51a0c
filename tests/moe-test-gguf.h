/* moe-test-gguf.h - a small in-memory GGUF writer for tests: metadata of any
 * type, tensor infos with automatic or forced offsets, and the data section;
 * the counts in the header are patched when the file is finished. */
#ifndef MOE_TEST_GGUF_H
#define MOE_TEST_GGUF_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tg {
    uint8_t *p;
    size_t n, cap;
    uint64_t n_kv, n_tensors;
    uint32_t align;
    /* tensors, written after the metadata by tg_finish */
    struct {
        char name[96];
        int n_dims;
        int64_t ne[4];
        uint32_t type;
        int64_t offset; /* -1: next aligned offset */
        size_t nbytes;
        uint8_t fill;
        const void *data; /* copied at finish when set */
        size_t off_pos;   /* where finish wrote the offset field */
    } t[64];
    int nt;
};

static void tg_put(struct tg *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void tg_u8(struct tg *b, uint8_t v) { tg_put(b, &v, 1); }
static void tg_u32(struct tg *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    tg_put(b, x, 4);
}
static void tg_u64(struct tg *b, uint64_t v) {
    tg_u32(b, (uint32_t)v);
    tg_u32(b, (uint32_t)(v >> 32));
}
static void tg_strn(struct tg *b, const char *s, size_t n) {
    tg_u64(b, n);
    tg_put(b, s, n);
}
static void tg_str(struct tg *b, const char *s) { tg_strn(b, s, strlen(s)); }

/* tg_begin: magic, version and placeholder counts. */
static void tg_begin(struct tg *b, uint32_t version) {
    memset(b, 0, sizeof *b);
    b->align = 32;
    tg_put(b, "GGUF", 4);
    tg_u32(b, version);
    tg_u64(b, 0);
    tg_u64(b, 0);
}

/* key + type header of one metadata item */
static void tg_key(struct tg *b, const char *key, uint32_t type) {
    tg_str(b, key);
    tg_u32(b, type);
    b->n_kv++;
}
static void tg_kv_u32(struct tg *b, const char *k, uint32_t v) { tg_key(b, k, 4), tg_u32(b, v); }
static void tg_kv_i32(struct tg *b, const char *k, int32_t v) { tg_key(b, k, 5), tg_u32(b, (uint32_t)v); }
static void tg_kv_u64(struct tg *b, const char *k, uint64_t v) { tg_key(b, k, 10), tg_u64(b, v); }
static void tg_kv_bool(struct tg *b, const char *k, int v) { tg_key(b, k, 7), tg_u8(b, (uint8_t)v); }
static void tg_kv_str(struct tg *b, const char *k, const char *v) { tg_key(b, k, 8), tg_str(b, v); }
static void tg_kv_f32(struct tg *b, const char *k, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    tg_key(b, k, 6), tg_u32(b, u);
}
static void tg_kv_f64(struct tg *b, const char *k, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    tg_key(b, k, 12), tg_u64(b, u);
}
/* arrays: header, then the caller writes n elements */
static void tg_kv_arr(struct tg *b, const char *k, uint32_t elem, uint64_t n) {
    tg_key(b, k, 9);
    tg_u32(b, elem);
    tg_u64(b, n);
}
static void tg_kv_strs(struct tg *b, const char *k, const char *const *v, size_t n) {
    tg_kv_arr(b, k, 8, n);
    for (size_t i = 0; i < n; i++) tg_str(b, v[i]);
}
static void tg_kv_i32s(struct tg *b, const char *k, const int32_t *v, size_t n) {
    tg_kv_arr(b, k, 5, n);
    for (size_t i = 0; i < n; i++) tg_u32(b, (uint32_t)v[i]);
}
static void tg_kv_f32s(struct tg *b, const char *k, const float *v, size_t n) {
    tg_kv_arr(b, k, 6, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        tg_u32(b, u);
    }
}

/* tg_tensor: declare a tensor of nbytes bytes (filled with `fill`). */
static void tg_tensor(struct tg *b, const char *name, int n_dims, const int64_t *ne, uint32_t type, size_t nbytes,
                      int64_t offset, uint8_t fill) {
    int i = b->nt++;
    snprintf(b->t[i].name, sizeof b->t[i].name, "%s", name);
    b->t[i].n_dims = n_dims;
    for (int d = 0; d < 4; d++) b->t[i].ne[d] = d < n_dims ? ne[d] : 1;
    b->t[i].type = type;
    b->t[i].nbytes = nbytes;
    b->t[i].offset = offset;
    b->t[i].fill = fill;
    b->t[i].data = NULL;
}

/* tg_tensor_data: a tensor whose bytes are copied from data at finish. */
static void tg_tensor_data(struct tg *b, const char *name, int n_dims, const int64_t *ne, uint32_t type,
                           const void *data, size_t nbytes) {
    tg_tensor(b, name, n_dims, ne, type, nbytes, -1, 0);
    b->t[b->nt - 1].data = data;
}

/* tg_f32_tensor: an f32 tensor whose data are the given floats (copied at finish). */
static void tg_f32(struct tg *b, const char *name, int n_dims, const int64_t *ne) {
    size_t n = 1;
    for (int d = 0; d < n_dims; d++) n *= (size_t)ne[d];
    tg_tensor(b, name, n_dims, ne, 0, n * 4, -1, 0);
}

/* tg_finish: tensor infos, padding, data; patches the counts. Returns the size.
 * Data bytes of tensor i are all `fill` (f32 tensors: the float 0.5 * (i + 1)). */
static size_t tg_finish(struct tg *b) {
    uint64_t off = 0;
    for (int i = 0; i < b->nt; i++) {
        if (b->t[i].offset < 0) {
            off = (off + b->align - 1) / b->align * b->align;
            b->t[i].offset = (int64_t)off;
        }
        off = (uint64_t)b->t[i].offset + b->t[i].nbytes;
        b->n_tensors++;
        tg_str(b, b->t[i].name);
        tg_u32(b, (uint32_t)b->t[i].n_dims);
        for (int d = 0; d < b->t[i].n_dims; d++) tg_u64(b, (uint64_t)b->t[i].ne[d]);
        tg_u32(b, b->t[i].type);
        b->t[i].off_pos = b->n;
        tg_u64(b, (uint64_t)b->t[i].offset);
    }
    while (b->n % b->align) tg_u8(b, 0);
    size_t base = b->n, end = base;
    for (int i = 0; i < b->nt; i++)
        if (base + (size_t)b->t[i].offset + b->t[i].nbytes > end) end = base + (size_t)b->t[i].offset + b->t[i].nbytes;
    while (b->n < end) tg_u8(b, 0);
    for (int i = 0; i < b->nt; i++) {
        uint8_t *d = b->p + base + b->t[i].offset;
        if (b->t[i].data) {
            memcpy(d, b->t[i].data, b->t[i].nbytes);
        } else if (b->t[i].type == 0) {
            float v = 0.5f * (float)(i + 1);
            for (size_t k = 0; k + 4 <= b->t[i].nbytes; k += 4) memcpy(d + k, &v, 4);
        } else {
            memset(d, b->t[i].fill, b->t[i].nbytes);
        }
    }
    for (int k = 0; k < 8; k++) b->p[8 + k] = (uint8_t)(b->n_tensors >> (8 * k));
    for (int k = 0; k < 8; k++) b->p[16 + k] = (uint8_t)(b->n_kv >> (8 * k));
    return b->n;
}

#endif

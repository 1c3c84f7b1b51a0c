/*
 * fuzz-bundle-gen.h - .moeb images built in memory from fuzzer bytes, for
 * fuzz-bundle.c and fuzz-model.c (docs/fuzzing.md, "Reaching the readers from
 * nothing").
 *
 * The bundle reader refuses anything under 4096 bytes and any header whose
 * XXH3 does not match, so from an empty corpus libFuzzer's byte mutations
 * never got past the header (issue 30: 32 edges in 3 minutes). A target that
 * includes this file reads an input that does not start with the bundle magic
 * as a *recipe*: choices (counts, names, types, shapes, compression, tuning
 * slots) that describe a well-formed bundle, then a list of edits to the bytes
 * of the laid-out image, after which the checksums are recomputed or, if the
 * recipe says so, left stale. Every byte string is a recipe and the empty one
 * is a valid bundle, so the first input of a run already reaches the
 * directory, KV, tensor and expert checks, and most mutations stay past the
 * header. fz_serialize lays a description out exactly as docs/format.md says
 * (header page, tensors and blobs at multiples of 4096, directory, tuning
 * payloads); fz_reseal recomputes every checksum over the bytes its record
 * names (header, directory, tensor records, blob entries, tuning slots and
 * payloads), bounds-checked, so it can run on any bytes.
 *
 * For the libFuzzer builds only (MOE_LIBFUZZER, set by the MOE_BUILD_FUZZ
 * block of tests/CMakeLists.txt; the *-replay tests compile without it),
 * fz_mutate is the body of LLVMFuzzerCustomMutator: on a whole image it sets
 * one field of the header, a tuning slot or a directory record to a boundary
 * value (or mutates the directory bytes in place), which random byte flips of
 * a 60 KB image rarely do; on a recipe it appends an edit, or lays the recipe
 * out as an image (so whole images enter the corpus), or falls back to
 * libFuzzer's own mutations.
 *
 * Everything is deterministic from the input bytes (and the mutator's seed).
 * Nothing is global: a target keeps one struct fz_arena per input and frees it.
 */
#ifndef MOE_FUZZ_BUNDLE_GEN_H
#define MOE_FUZZ_BUNDLE_GEN_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "fuzz-src.h"

/* ---- little-endian fields ---- */

static uint64_t fz_rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t fz_rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void fz_wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void fz_wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- memory: an arena freed once per input, and a growable buffer ---- */

struct fz_arena {
    void **p;
    size_t n, cap;
};

/* fz_alloc: n zeroed bytes that live until fz_arena_free; NULL when out of memory. */
static void *fz_alloc(struct fz_arena *a, size_t n) {
    if (a->n == a->cap) {
        size_t c = a->cap ? 2 * a->cap : 64;
        void **q = realloc(a->p, c * sizeof *q);
        if (!q) return NULL;
        a->p = q;
        a->cap = c;
    }
    void *x = calloc(1, n ? n : 1);
    if (x) a->p[a->n++] = x;
    return x;
}

static void fz_arena_free(struct fz_arena *a) {
    for (size_t i = 0; i < a->n; i++) free(a->p[i]);
    free(a->p);
    memset(a, 0, sizeof *a);
}

struct fz_buf {
    uint8_t *p;
    size_t n, cap;
    int oom;
};

static void fz_put(struct fz_buf *b, const void *d, size_t n) {
    if (b->oom || !n) return;
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        uint8_t *q = realloc(b->p, c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    if (d) memcpy(b->p + b->n, d, n);
    else memset(b->p + b->n, 0, n);
    b->n += n;
}

static void fz_put64(struct fz_buf *b, uint64_t v) {
    uint8_t x[8];
    fz_wr64(x, v);
    fz_put(b, x, 8);
}

static void fz_put32(struct fz_buf *b, uint32_t v) {
    uint8_t x[4];
    fz_wr32(x, v);
    fz_put(b, x, 4);
}

/* ---- a bundle described in memory ---- */

#define FZ_MAX_KV 16
#define FZ_MAX_TENSORS 192
#define FZ_MAX_PREC 4
#define FZ_MAX_BLOBS 256

struct fz_kv {
    const char *key;
    uint32_t klen, type;
    const uint8_t *val;
    uint64_t vlen;
};

struct fz_kvset {
    int n;
    int keep_order; /* 1: encode in insertion order with duplicates (the reader must refuse it) */
    struct fz_kv kv[FZ_MAX_KV];
};

struct fz_tensor {
    const char *name;
    uint32_t nlen, type, ndims, reserved;
    uint64_t dims[4];
    const uint8_t *data; /* size bytes, NULL = zeros */
    uint64_t size;
};

struct fz_part {
    uint32_t type, reserved;
    uint64_t rows, cols, nbytes;
};

struct fz_prec {
    const char *name;
    uint32_t nlen, nparts;
    struct fz_part part[4];
};

struct fz_blob {
    const uint8_t *raw; /* NULL: absent entry */
    uint64_t raw_size;
    int zstd;           /* stored as a hand-made zstd frame (fz_zstd) */
    unsigned zvariant;
};

struct fz_slot {
    int state; /* 0 empty (64 zero bytes), 1 valid with a payload, 2 valid without one */
    uint64_t seq;
    struct fz_kvset kv;
};

struct fz_bundle {
    struct fz_kvset meta;
    int n_tensors;
    struct fz_tensor t[FZ_MAX_TENSORS];
    uint32_t L, E, P;
    struct fz_prec prec[FZ_MAX_PREC];
    struct fz_blob *blob; /* [L * E * P], arena-owned; entry (l, e, p) at (l * E + e) * P + p */
    struct fz_slot slot[2];
};

/* Regions of a laid-out image that edits aim at. */
enum {
    FZ_R_HEADER, FZ_R_SLOT_A, FZ_R_SLOT_B, FZ_R_DIR, FZ_R_META, FZ_R_TENSORS, FZ_R_EXPERTS,
    FZ_R_PAYLOAD, FZ_R_DATA, FZ_R_FILE, FZ_R_COUNT
};

struct fz_layout {
    uint64_t off[FZ_R_COUNT], len[FZ_R_COUNT];
};

/* fz_kv_set: add (or replace) key = value of the given type; the bytes are
 * borrowed (arena or static). */
static void fz_kv_set(struct fz_kvset *s, const char *key, uint32_t klen, uint32_t type, const void *val,
                      uint64_t vlen) {
    for (int i = 0; i < s->n && !s->keep_order; i++)
        if (s->kv[i].klen == klen && !memcmp(s->kv[i].key, key, klen)) {
            s->kv[i].type = type, s->kv[i].val = val, s->kv[i].vlen = vlen;
            return;
        }
    if (s->n == FZ_MAX_KV) return;
    s->kv[s->n++] = (struct fz_kv){key, klen, type, val, vlen};
}

static inline void fz_kv_str(struct fz_kvset *s, const char *key, const char *val) {
    fz_kv_set(s, key, (uint32_t)strlen(key), 1, val, strlen(val));
}

/* fz_kv_less: the block's key order (memcmp, a proper prefix first). */
static int fz_kv_less(const struct fz_kv *a, const struct fz_kv *b) {
    uint32_t m = a->klen < b->klen ? a->klen : b->klen;
    int c = memcmp(a->key, b->key, m);
    return c < 0 || (c == 0 && a->klen < b->klen);
}

/* fz_kv_encode: a KV block (docs/format.md), sorted and without duplicates
 * unless the set keeps its order. */
static void fz_kv_encode(const struct fz_kvset *s, struct fz_buf *o) {
    int idx[FZ_MAX_KV], n = 0;
    for (int i = 0; i < s->n; i++) {
        int j = n;
        if (!s->keep_order) {
            int dup = 0;
            for (int k = 0; k < n; k++) {
                const struct fz_kv *x = &s->kv[idx[k]], *y = &s->kv[i];
                dup |= x->klen == y->klen && !memcmp(x->key, y->key, x->klen);
            }
            if (dup) continue;
            while (j > 0 && fz_kv_less(&s->kv[i], &s->kv[idx[j - 1]])) {
                idx[j] = idx[j - 1];
                j--;
            }
        }
        idx[j] = i;
        n++;
    }
    fz_put64(o, (uint64_t)n);
    for (int k = 0; k < n; k++) {
        const struct fz_kv *x = &s->kv[idx[k]];
        fz_put32(o, x->klen);
        fz_put32(o, x->type);
        fz_put64(o, x->vlen);
        fz_put(o, x->key, x->klen);
        fz_put(o, x->val, (size_t)x->vlen);
    }
}

/* fz_uniform: 1 if the n bytes at p are all equal (an RLE block). */
static int fz_uniform(const uint8_t *p, size_t n) {
    for (size_t i = 1; i < n; i++)
        if (p[i] != p[0]) return 0;
    return n > 0;
}

/* fz_zstd: one zstd frame (RFC 8878) of raw and RLE blocks whose content is
 * raw[0..n). variant bits 0-1 pick the frame header (single segment with a
 * 4- or 8-byte content size, a window descriptor with a 4-byte size, or the
 * 2-byte size form where it fits), bit 2 a content checksum, bits 3-4 the
 * block size (whole, 64, 512, 4096 bytes), bit 5 RLE blocks for uniform runs. */
static void fz_zstd(struct fz_buf *o, const uint8_t *raw, uint64_t n, unsigned variant) {
    static const uint8_t magic[4] = {0x28, 0xB5, 0x2F, 0xFD};
    fz_put(o, magic, 4);
    unsigned form = variant & 3, cks = (variant >> 2) & 1;
    if (form == 3 && !(n >= 256 && n < 65536 + 256)) form = 0;
    if (form == 0) {
        uint8_t d = (uint8_t)(2u << 6 | 1u << 5 | cks << 2);
        fz_put(o, &d, 1);
        fz_put32(o, (uint32_t)n);
    } else if (form == 1) {
        uint8_t d = (uint8_t)(3u << 6 | 1u << 5 | cks << 2);
        fz_put(o, &d, 1);
        fz_put64(o, n);
    } else if (form == 2) {
        unsigned e = 0;
        while (e < 20 && ((uint64_t)1 << (10 + e)) < n) e++;
        uint8_t d[2] = {(uint8_t)(2u << 6 | cks << 2), (uint8_t)(e << 3)};
        fz_put(o, d, 2);
        fz_put32(o, (uint32_t)n);
    } else {
        uint8_t d[3] = {(uint8_t)(1u << 6 | 1u << 5 | cks << 2), (uint8_t)(n - 256), (uint8_t)((n - 256) >> 8)};
        fz_put(o, d, 3);
    }
    static const uint64_t k_block[4] = {1u << 17, 64, 512, 4096};
    uint64_t bs = k_block[(variant >> 3) & 3], pos = 0;
    do {
        uint64_t k = n - pos < bs ? n - pos : bs;
        int last = pos + k == n, rle = (variant >> 5 & 1) && fz_uniform(raw + pos, (size_t)k);
        uint32_t h = (uint32_t)(last | (rle ? 1u : 0u) << 1 | (uint32_t)k << 3);
        uint8_t hb[3] = {(uint8_t)h, (uint8_t)(h >> 8), (uint8_t)(h >> 16)};
        fz_put(o, hb, 3);
        fz_put(o, raw + pos, rle ? 1 : (size_t)k);
        pos += k;
    } while (pos < n);
    if (cks) fz_put32(o, (uint32_t)XXH64(raw, (size_t)n, 0));
}

/* fz_layout_size: the laid-out raw size of a precision's parts (64-byte
 * aligned offsets), saturating instead of wrapping. */
static uint64_t fz_layout_size(const struct fz_prec *p) {
    uint64_t off = 0;
    for (uint32_t i = 0; i < p->nparts && i < 4; i++) {
        if (i) off = (off + 63) & ~(uint64_t)63;
        if (p->part[i].nbytes > UINT64_MAX / 4 - off) return UINT64_MAX / 4;
        off += p->part[i].nbytes;
    }
    return off;
}

static uint64_t fz_up4k(uint64_t x) { return (x + 4095) & ~(uint64_t)4095; }

/* fz_serialize: lay b out as docs/format.md specifies, with every checksum
 * right. Returns a malloc'd image of *len bytes (NULL when out of memory or
 * larger than 64 MiB) and fills lay with where each region went. */
static uint8_t *fz_serialize(const struct fz_bundle *b, struct fz_arena *a, size_t *len, struct fz_layout *lay) {
    const size_t n_blob = (size_t)b->L * b->E * b->P;
    uint64_t *t_off = fz_alloc(a, sizeof(uint64_t) * (size_t)(b->n_tensors + 1));
    uint64_t *b_off = fz_alloc(a, sizeof(uint64_t) * (n_blob + 1));
    struct fz_buf *stored = fz_alloc(a, sizeof(struct fz_buf) * (n_blob + 1)), dir = {0}, pay[2] = {{0}, {0}};
    uint8_t *img = NULL;
    memset(lay, 0, sizeof *lay);
    if (!t_off || !b_off || !stored) return NULL;
    uint64_t pos = 4096;
    for (int i = 0; i < b->n_tensors; i++) {
        t_off[i] = pos;
        pos = fz_up4k(pos + (b->t[i].size ? b->t[i].size : 1));
    }
    for (size_t i = 0; i < n_blob; i++) {
        const struct fz_blob *x = &b->blob[i];
        if (!x->raw) continue;
        if (x->zstd) fz_zstd(&stored[i], x->raw, x->raw_size, x->zvariant);
        else fz_put(&stored[i], x->raw, (size_t)x->raw_size);
        b_off[i] = pos;
        pos = fz_up4k(pos + (stored[i].n ? stored[i].n : 1));
    }
    const uint64_t dir_off = pos;
    fz_put(&dir, "MOEBDIR", 8);
    fz_put(&dir, NULL, 24);
    size_t m0 = dir.n;
    fz_kv_encode(&b->meta, &dir);
    size_t t0 = dir.n;
    fz_put64(&dir, (uint64_t)b->n_tensors);
    for (int i = 0; i < b->n_tensors; i++) {
        const struct fz_tensor *t = &b->t[i];
        fz_put32(&dir, t->nlen);
        fz_put32(&dir, t->type);
        fz_put32(&dir, t->ndims);
        fz_put32(&dir, t->reserved);
        for (int k = 0; k < 4; k++) fz_put64(&dir, t->dims[k]);
        fz_put64(&dir, t_off[i]);
        fz_put64(&dir, t->size);
        fz_put64(&dir, 0); /* checksum: once the bytes are in place */
        fz_put(&dir, t->name, t->nlen);
    }
    size_t x0 = dir.n;
    fz_put32(&dir, b->L);
    fz_put32(&dir, b->E);
    fz_put32(&dir, b->P);
    fz_put32(&dir, 0);
    for (uint32_t p = 0; p < b->P && b->L && b->E; p++) {
        const struct fz_prec *d = &b->prec[p];
        fz_put32(&dir, d->nlen);
        fz_put32(&dir, d->nparts);
        for (uint32_t k = 0; k < d->nparts && k < 4; k++) {
            fz_put32(&dir, d->part[k].type);
            fz_put32(&dir, d->part[k].reserved);
            fz_put64(&dir, d->part[k].rows);
            fz_put64(&dir, d->part[k].cols);
            fz_put64(&dir, d->part[k].nbytes);
        }
        fz_put(&dir, d->name, d->nlen);
    }
    for (size_t i = 0; i < n_blob; i++) {
        const struct fz_blob *x = &b->blob[i];
        if (!x->raw) {
            fz_put(&dir, NULL, 48);
            continue;
        }
        uint64_t raw_ck = XXH3_64bits(x->raw, (size_t)x->raw_size);
        fz_put64(&dir, b_off[i]);
        fz_put64(&dir, stored[i].n);
        fz_put64(&dir, x->raw_size);
        fz_put64(&dir, raw_ck);
        fz_put64(&dir, x->zstd ? XXH3_64bits(stored[i].p, stored[i].n) : raw_ck);
        fz_put32(&dir, x->zstd ? 1 : 0);
        fz_put32(&dir, 1);
    }
    if (dir.oom) goto done;
    fz_wr64(dir.p + 8, t0 - m0);
    fz_wr64(dir.p + 16, x0 - t0);
    fz_wr64(dir.p + 24, dir.n - x0);
    uint64_t end = dir_off + dir.n, pay_off[2] = {0, 0};
    for (int s = 0; s < 2; s++) {
        if (b->slot[s].state != 1) continue;
        fz_kv_encode(&b->slot[s].kv, &pay[s]);
        pay_off[s] = fz_up4k(end);
        end = pay_off[s] + pay[s].n;
    }
    if (pay[0].oom || pay[1].oom || end > (64u << 20)) goto done;
    img = calloc(1, (size_t)end);
    if (!img) goto done;
    for (int i = 0; i < b->n_tensors; i++)
        if (b->t[i].data) memcpy(img + t_off[i], b->t[i].data, (size_t)b->t[i].size);
    for (size_t i = 0; i < n_blob; i++)
        if (b->blob[i].raw && stored[i].n) memcpy(img + b_off[i], stored[i].p, stored[i].n);
    memcpy(img + dir_off, dir.p, dir.n);
    uint8_t *rec = img + dir_off + t0 + 8;
    for (int i = 0; i < b->n_tensors; i++) { /* tensor checksums over the bytes now in place */
        fz_wr64(rec + 64, XXH3_64bits(img + t_off[i], (size_t)b->t[i].size));
        rec += 72 + b->t[i].nlen;
    }
    for (int s = 0; s < 2; s++) {
        uint8_t *sl = img + (s ? 1024 : 512);
        if (!b->slot[s].state) continue;
        memcpy(sl, "MOEBTUNE", 8);
        fz_wr64(sl + 8, b->slot[s].seq);
        if (b->slot[s].state == 1) {
            memcpy(img + pay_off[s], pay[s].p, pay[s].n);
            fz_wr64(sl + 16, pay_off[s]);
            fz_wr64(sl + 24, pay[s].n);
            fz_wr64(sl + 32, XXH3_64bits(img + pay_off[s], pay[s].n));
        } else {
            fz_wr64(sl + 32, XXH3_64bits(NULL, 0));
        }
        fz_wr64(sl + 56, XXH3_64bits(sl, 56));
    }
    memcpy(img, "MOEBUNDL", 8);
    img[8] = 1; /* version 1.0, flags 0 */
    fz_wr64(img + 16, 4096);
    fz_wr64(img + 24, 4096);
    fz_wr64(img + 32, dir_off);
    fz_wr64(img + 40, dir.n);
    fz_wr64(img + 48, XXH3_64bits(img + dir_off, dir.n));
    fz_wr64(img + 120, XXH3_64bits(img, 120));
    *len = (size_t)end;
    const uint64_t r[FZ_R_COUNT][2] = {
        [FZ_R_HEADER] = {0, 128}, [FZ_R_SLOT_A] = {512, 64}, [FZ_R_SLOT_B] = {1024, 64},
        [FZ_R_DIR] = {dir_off, 32}, [FZ_R_META] = {dir_off + m0, t0 - m0}, [FZ_R_TENSORS] = {dir_off + t0, x0 - t0},
        [FZ_R_EXPERTS] = {dir_off + x0, dir.n - x0},
        [FZ_R_PAYLOAD] = {pay_off[0] ? pay_off[0] : pay_off[1], pay[0].n ? pay[0].n : pay[1].n},
        [FZ_R_DATA] = {4096, dir_off - 4096}, [FZ_R_FILE] = {0, end},
    };
    for (int i = 0; i < FZ_R_COUNT; i++) lay->off[i] = r[i][0], lay->len[i] = r[i][1];
done:
    for (size_t i = 0; i < n_blob; i++) free(stored[i].p);
    free(dir.p);
    free(pay[0].p);
    free(pay[1].p);
    return img;
}

/* ---- checksums ---- */

/* fz_reseal_dir: the tensor and blob checksums of directory d[0..n) over the
 * bytes their records name, where those lie inside img. */
static void fz_reseal_dir(uint8_t *img, size_t size, uint8_t *d, uint64_t n) {
    if (n < 32) return;
    uint64_t m = fz_rd64(d + 8), t = fz_rd64(d + 16);
    if (m > n - 32 || t > n - 32 - m) return;
    uint8_t *rec = d + 32 + m, *end = rec + t;
    if (t >= 8) {
        uint64_t count = fz_rd64(rec);
        rec += 8;
        for (uint64_t i = 0; i < count && end - rec >= 72; i++) {
            uint32_t len = fz_rd32(rec);
            if ((uint64_t)(end - rec) - 72 < len) break;
            uint64_t off = fz_rd64(rec + 48), sz = fz_rd64(rec + 56);
            if (off <= size && sz <= size - off) fz_wr64(rec + 64, XXH3_64bits(img + off, (size_t)sz));
            rec += 72 + len;
        }
    }
    uint64_t pos = 32 + m + t;
    if (n - pos < 16) return;
    uint64_t cnt = (uint64_t)fz_rd32(d + pos) * fz_rd32(d + pos + 4), np = fz_rd32(d + pos + 8);
    if (np > 16) return;
    cnt *= np;
    pos += 16;
    for (uint64_t i = 0; i < np; i++) {
        if (n - pos < 8) return;
        uint64_t parts = fz_rd32(d + pos + 4);
        if (parts > 16) return;
        uint64_t skip = 8 + 32 * parts + fz_rd32(d + pos);
        if (skip > n - pos) return;
        pos += skip;
    }
    for (uint64_t i = 0; i < cnt && n - pos >= 48; i++, pos += 48) {
        uint8_t *e = d + pos;
        uint64_t off = fz_rd64(e), stored = fz_rd64(e + 8);
        if (!(fz_rd32(e + 44) & 1) || off > size || stored > size - off) continue;
        uint64_t ck = XXH3_64bits(img + off, (size_t)stored);
        fz_wr64(e + 32, ck);
        if (fz_rd32(e + 40) == 0) fz_wr64(e + 24, ck); /* raw: the raw checksum is the same */
    }
}

/* fz_reseal: recompute the checksums a mutation cannot plausibly get right:
 * tensors, blobs, the directory, the header, and each tuning slot that has
 * its magic (an empty slot stays empty) with its payload. */
static void fz_reseal(uint8_t *img, size_t n) {
    if (n < 4096) return;
    uint64_t off = fz_rd64(img + 32), size = fz_rd64(img + 40);
    if (off <= n && size <= n - off) {
        fz_reseal_dir(img, n, img + off, size);
        fz_wr64(img + 48, XXH3_64bits(img + off, (size_t)size));
    }
    fz_wr64(img + 120, XXH3_64bits(img, 120));
    for (int i = 0; i < 2; i++) {
        uint8_t *s = img + (i ? 1024 : 512);
        if (memcmp(s, "MOEBTUNE", 8)) continue;
        uint64_t po = fz_rd64(s + 16), ps = fz_rd64(s + 24);
        if (po <= n && ps <= n - po) fz_wr64(s + 32, XXH3_64bits(img + po, (size_t)ps));
        fz_wr64(s + 56, XXH3_64bits(s, 56));
    }
}

/* ---- edits to a laid-out image ---- */

/* fz_boundary: boundary values for a field of an image of n bytes. */
static uint64_t fz_boundary(unsigned k, uint64_t old, uint64_t n) {
    static const uint64_t v[] = {0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 63, 64, 255, 256, 1023, 1024, 1025, 4095, 4096,
                                 4097, 8192, 65535, 65536, 1u << 20, (1u << 20) + 1, 1u << 28, (1u << 28) + 1,
                                 1u << 30, (1u << 30) + 1, 0x7fffffff, 0x80000000u, 0xffffffffu,
                                 (uint64_t)1 << 32, (uint64_t)1 << 60, (uint64_t)1 << 62, INT64_MAX,
                                 (uint64_t)1 << 63, UINT64_MAX};
    const unsigned nv = sizeof v / sizeof v[0];
    k %= nv + 8;
    if (k < nv) return v[k];
    switch (k - nv) {
    case 0: return n;
    case 1: return n - 1;
    case 2: return n + 1;
    case 3: return n - 4096;
    case 4: return old + 1;
    case 5: return old - 1;
    case 6: return old * 2;
    default: return old + 4096;
    }
}

/* fz_edit: apply the recipe's remaining bytes to the image as edits, each
 * aimed at one region of the layout: set or flip a byte, set a 32- or 64-bit
 * field to a boundary value, add a small delta, fill 8 bytes with 0xff,
 * truncate the image inside the region, or append zero bytes. *img may be
 * reallocated; returns its new length. */
static size_t fz_edit(struct fz_src *s, uint8_t **img, size_t n, const struct fz_layout *lay, int max_edits) {
    for (int k = 0; k < max_edits && fz_left(s) && n; k++) {
        unsigned op = fz_byte(s), kind = op & 7, r = (op >> 3) % FZ_R_COUNT;
        uint64_t at = fz_byte(s) | (uint64_t)fz_byte(s) << 8, arg = fz_byte(s);
        uint64_t lo = lay->off[r], rl = lay->len[r];
        if (rl == 0 || lo >= n) continue;
        if (rl > n - lo) rl = n - lo;
        uint64_t o = lo + at % rl;
        uint8_t *p = *img;
        switch (kind) {
        case 0: p[o] = (uint8_t)arg; break;
        case 1: p[o] ^= (uint8_t)(1u << (arg & 7)); break;
        case 2:
            if (n - o >= 8) fz_wr64(p + o, fz_boundary((unsigned)arg, fz_rd64(p + o), n));
            break;
        case 3:
            if (n - o >= 4) fz_wr32(p + o, (uint32_t)fz_boundary((unsigned)arg, fz_rd32(p + o), n));
            break;
        case 4:
            if (n - o >= 8) fz_wr64(p + o, fz_rd64(p + o) + (uint64_t)(int64_t)(int8_t)arg);
            break;
        case 5:
            if (n - o >= 8) memset(p + o, 0xff, 8);
            break;
        case 6: n = (size_t)o; break; /* truncate */
        default: {
            size_t grow = (size_t)(arg + 1) * 64;
            uint8_t *q = realloc(p, n + grow);
            if (!q) break;
            memset(q + n, 0, grow);
            *img = q;
            n += grow;
        }
        }
    }
    return n;
}

/* A target's recipe builder: the bundle a recipe describes (0 when the recipe
 * makes nothing). */
typedef int (*fz_build_fn)(struct fz_src *s, struct fz_arena *a, struct fz_bundle *b);

/* fz_expand: a recipe laid out as an image by `build` (malloc'd; NULL on
 * failure), up to max_edits byte edits applied and, unless the recipe's reseal
 * choice is 3, resealed. */
static uint8_t *fz_expand(fz_build_fn build, int max_edits, const uint8_t *data, size_t size, size_t *len) {
    static struct fz_bundle b;
    struct fz_src s = {data, size, 0};
    struct fz_arena a = {0};
    struct fz_layout lay;
    uint8_t *img = NULL;
    if (build(&s, &a, &b) && (img = fz_serialize(&b, &a, len, &lay))) {
        int reseal = fz_pick(&s, 4, 0) != 3;
        *len = fz_edit(&s, &img, *len, &lay, max_edits);
        if (reseal) fz_reseal(img, *len);
    }
    fz_arena_free(&a);
    return img;
}

/* ---- the structure-aware mutator (libFuzzer builds only) ---- */
#ifdef MOE_LIBFUZZER
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

static uint64_t fz_rng(uint64_t *r) {
    *r ^= *r << 13;
    *r ^= *r >> 7;
    *r ^= *r << 17;
    return *r;
}

struct fz_field {
    uint32_t off;
    uint8_t width;
};

/* fz_fields: the header, slot and directory fields of an image (offset and
 * width), walking the directory with bounds checks; returns the count. */
static size_t fz_fields(const uint8_t *img, size_t n, struct fz_field *f, size_t cap) {
    size_t k = 0;
#define FZ_F(o, w)                                                      \
    do {                                                                \
        if (k < cap && (uint64_t)(o) + (w) <= n)                        \
            f[k++] = (struct fz_field){(uint32_t)(o), (uint8_t)(w)};    \
    } while (0)
    if (n < 4096) return 0;
    for (int o = 8; o < 56; o += 8) FZ_F(o, o == 8 ? 2 : 8);
    FZ_F(10, 2);
    FZ_F(12, 4);
    for (int s = 512; s <= 1024; s += 512)
        for (int o = 8; o < 40; o += 8) FZ_F(s + o, 8);
    uint64_t off = fz_rd64(img + 32), size = fz_rd64(img + 40);
    if (off > n || size > n - off || size < 32 || off + size > UINT32_MAX) return k;
    const uint8_t *d = img + off;
    for (int o = 8; o < 32; o += 8) FZ_F(off + o, 8);
    uint64_t m = fz_rd64(d + 8), t = fz_rd64(d + 16);
    if (m > size - 32 || t > size - 32 - m) return k;
    uint64_t pos = 32;
    if (m >= 8) { /* KV entries: key_len, type, value_len, first value bytes */
        uint64_t cnt = fz_rd64(d + pos), end = 32 + m;
        FZ_F(off + pos, 8);
        pos += 8;
        for (uint64_t i = 0; i < cnt && end - pos >= 16; i++) {
            uint64_t kl = fz_rd32(d + pos), vl = fz_rd64(d + pos + 8);
            FZ_F(off + pos, 4);
            FZ_F(off + pos + 4, 4);
            FZ_F(off + pos + 8, 8);
            if (kl > end - pos - 16 || vl > end - pos - 16 - kl) break;
            if (vl >= 8) FZ_F(off + pos + 16 + kl, 8);
            pos += 16 + kl + vl;
        }
    }
    pos = 32 + m;
    if (t >= 8) { /* tensor records */
        uint64_t cnt = fz_rd64(d + pos), end = 32 + m + t;
        FZ_F(off + pos, 8);
        pos += 8;
        for (uint64_t i = 0; i < cnt && end - pos >= 72; i++) {
            for (int o = 0; o < 16; o += 4) FZ_F(off + pos + o, 4);
            for (int o = 16; o < 64; o += 8) FZ_F(off + pos + o, 8);
            uint64_t nl = fz_rd32(d + pos);
            if (nl > end - pos - 72) break;
            pos += 72 + nl;
        }
    }
    pos = 32 + m + t;
    if (size - pos < 16) return k;
    for (int o = 0; o < 16; o += 4) FZ_F(off + pos + o, 4);
    uint64_t np = fz_rd32(d + pos + 8), cnt = (uint64_t)fz_rd32(d + pos) * fz_rd32(d + pos + 4);
    pos += 16;
    for (uint64_t i = 0; i < np && i < 16; i++) { /* precision descriptors */
        if (size - pos < 8) return k;
        uint64_t parts = fz_rd32(d + pos + 4), skip = 8 + 32 * (parts > 16 ? 16 : parts) + fz_rd32(d + pos);
        FZ_F(off + pos, 4);
        FZ_F(off + pos + 4, 4);
        for (uint64_t j = 0; j < parts && j < 4; j++) {
            FZ_F(off + pos + 8 + 32 * j, 4);
            FZ_F(off + pos + 12 + 32 * j, 4);
            for (int o = 16; o < 40; o += 8) FZ_F(off + pos + 8 + 32 * j + o, 8);
        }
        if (skip > size - pos) return k;
        pos += skip;
    }
    for (uint64_t i = 0; i < cnt * (np ? np : 1) && size - pos >= 48 && i < 512; i++, pos += 48) {
        for (int o = 0; o < 24; o += 8) FZ_F(off + pos + o, 8);
        FZ_F(off + pos + 40, 4);
        FZ_F(off + pos + 44, 4);
    }
#undef FZ_F
    return k;
}

/* fz_mutate_image: one structure-aware change to a whole image: a field set
 * to a boundary value or moved by a small delta, or the directory's bytes
 * mutated in place by libFuzzer. The size stays; returns 0 when the image has
 * no fields to aim at. The target reseals a copy of every input itself. */
static size_t fz_mutate_image(uint8_t *data, size_t size, uint64_t *r) {
    static struct fz_field f[4096];
    size_t nf = fz_fields(data, size, f, sizeof f / sizeof f[0]);
    if (!nf) return 0;
    if (fz_rng(r) % 4 == 0) { /* the directory's bytes, in place */
        uint64_t off = fz_rd64(data + 32), len = fz_rd64(data + 40);
        if (off <= size && len <= size - off && len > 32) {
            uint8_t *tmp = malloc((size_t)len);
            if (tmp) {
                memcpy(tmp, data + off, (size_t)len);
                if (LLVMFuzzerMutate(tmp + 32, (size_t)len - 32, (size_t)len - 32) == (size_t)len - 32)
                    memcpy(data + off, tmp, (size_t)len);
                free(tmp);
                return size;
            }
        }
    }
    const struct fz_field *x = &f[fz_rng(r) % nf];
    uint8_t *p = data + x->off;
    uint64_t old = 0;
    for (int i = x->width - 1; i >= 0; i--) old = old << 8 | p[i];
    uint64_t v = fz_rng(r) % 3 ? fz_boundary((unsigned)fz_rng(r), old, size)
                               : old + (uint64_t)(int64_t)((int)(fz_rng(r) % 17) - 8);
    for (int i = 0; i < x->width; i++) p[i] = (uint8_t)(v >> (8 * i));
    return size;
}

/* fz_mutate: the body of LLVMFuzzerCustomMutator for a target whose inputs are
 * images or recipes; expand lays a recipe out (a malloc'd image). */
static size_t fz_mutate(uint8_t *data, size_t size, size_t max_size, unsigned seed,
                        uint8_t *(*expand)(const uint8_t *, size_t, size_t *)) {
    uint64_t r = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    unsigned roll = (unsigned)(fz_rng(&r) % 32);
    if (size >= 8 && !memcmp(data, "MOEBUNDL", 8)) {
        if (roll < 20) {
            size_t n = fz_mutate_image(data, size, &r);
            if (n) return n;
        }
        return LLVMFuzzerMutate(data, size, max_size);
    }
    if (roll == 0) { /* lay the recipe out: whole images join the corpus */
        size_t n = 0;
        uint8_t *img = expand(data, size, &n);
        if (img && n <= max_size) {
            memcpy(data, img, n);
            free(img);
            return n;
        }
        free(img);
    } else if (roll < 5 && size + 4 <= max_size) { /* one more edit: op, offset, argument */
        for (int i = 0; i < 4; i++) data[size + i] = (uint8_t)fz_rng(&r);
        return size + 4;
    }
    return LLVMFuzzerMutate(data, size, max_size);
}
#endif /* MOE_LIBFUZZER */

#endif

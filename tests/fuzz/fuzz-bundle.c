/*
 * fuzz-bundle.c - libFuzzer target for the bundle reader (moe_bundle_open_memory).
 *
 * An input that starts with the bundle magic (MOEBUNDL) is an image. It is
 * opened twice: as given (which mostly exercises the header and checksum
 * checks, since random bytes rarely match an XXH3), and as a copy whose
 * header, directory, tensor, blob, slot and tuning-payload checksums are
 * recomputed first (fz_reseal), so that mutations reach the directory, KV,
 * expert-table and tuning decoders and the zstd frame checks.
 *
 * Any other input is a recipe (fuzz-bundle-gen.h): read as it is (the short
 * and foreign inputs the reader refuses first), then built into a bundle:
 * metadata entries of every KV type, tensors, precisions with 1 to 4 parts,
 * raw and hand-made zstd blobs, both tuning slots, then the recipe's edits to
 * the laid-out bytes, resealed unless the recipe says not to. The empty input
 * is already a valid bundle, so a run from an empty corpus starts at the
 * directory checks (issue 30; docs/fuzzing.md has the counts). In the
 * libFuzzer build a structure-aware mutator (LLVMFuzzerCustomMutator) sets
 * header, slot and directory fields of images to boundary values and lays
 * recipes out as images now and then.
 *
 * On success the target walks everything the API exposes (metadata and tuning
 * items, every tensor byte, every blob: describe, verify, load) and runs
 * verify_all; any inconsistency between accessors aborts, which the fuzzer
 * reports as a crash. Blobs whose declared raw size is above 16 MiB are not
 * decompressed (a tiny zstd frame of RLE blocks can legally claim gigabytes).
 *
 * Run the fuzzer: build with -DMOE_BUILD_FUZZ=ON (clang, libFuzzer;
 * docs/fuzzing.md), then
 *
 *   build-fuzz/tests/fuzz-bundle -jobs=1 -max_total_time=600 -max_len=65536 -timeout=10 \
 *       /tmp/bundle-corpus tests/fuzz/corpus/bundle
 *
 * The seeds in tests/fuzz/corpus/bundle are regenerated with
 * `test-bundle --write-seeds tests/fuzz/corpus/bundle` (the images) or found by
 * runs from nothing (the recipe-* inputs); ctest replays them (and any crash-*
 * file kept after fixing its bug) through replay-main.c as the test
 * fuzz-bundle-replay, without libFuzzer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-bundle-gen.h"
#include "moe-bundle.h"

#define MAX_DECODE (16u << 20)

/* Log sink that drops messages: the fuzzer produces millions of errors. */
static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level;
    (void)msg;
    (void)user;
}

/* verify_all callback: failures must name an item and a problem. */
static void on_failure(const char *item, const char *problem, void *user) {
    if (!item || !problem || !item[0] || !problem[0]) abort();
    (*(int *)user)++;
}

/* Touches every item of a KV set. */
static unsigned walk_kv(const struct moe_bundle_kv *kv) {
    unsigned sum = 0;
    struct moe_bundle_kv_item it, again;
    for (size_t i = 0; i < moe_bundle_kv_count(kv); i++) {
        if (moe_bundle_kv_at(kv, i, &it) != MOE_OK) abort();
        if (moe_bundle_kv_find(kv, it.key, &again) != MOE_OK || again.type != it.type) abort();
        switch (it.type) {
        case MOE_KV_STRING:
            if (strlen(it.str) != it.count) abort();
            break;
        case MOE_KV_BYTES:
            for (size_t k = 0; k < it.count; k++) sum += ((const uint8_t *)it.bytes)[k];
            break;
        case MOE_KV_I64_ARRAY:
            for (size_t k = 0; k < it.count; k++) sum += (unsigned)it.i64s[k];
            break;
        case MOE_KV_F64_ARRAY:
            for (size_t k = 0; k < it.count; k++) sum += it.f64s[k] > 0;
            break;
        case MOE_KV_STR_ARRAY:
            for (size_t k = 0; k < it.count; k++) sum += (unsigned)strlen(it.strs[k]);
            break;
        default: break;
        }
    }
    return sum;
}

/* Opens one image and exercises every accessor. */
static void run(const uint8_t *data, size_t size) {
    struct moe_bundle *b = NULL;
    if (moe_bundle_open_memory(data, size, "fuzz", &b) != MOE_OK) {
        if (b) abort(); /* the handle must be cleared on error */
        return;
    }
    unsigned sum = walk_kv(moe_bundle_meta(b)) + walk_kv(moe_bundle_tuning(b));
    struct moe_bundle_info info;
    moe_bundle_get_info(b, &info);
    for (size_t i = 0; i < moe_bundle_tensor_count(b); i++) {
        const struct moe_bundle_tensor *t = moe_bundle_tensor_at(b, i);
        const uint8_t *p = t->data;
        if (p < data || t->size > size || p + t->size > data + size || t->offset % 4096) abort();
        for (uint64_t k = 0; k < t->size; k++) sum += p[k];
        if (moe_bundle_find_tensor(b, t->name) != t) abort();
        moe_bundle_tensor_verify(b, t);
    }
    uint32_t L, E, P;
    moe_bundle_expert_layout(b, &L, &E, &P);
    uint64_t decoded = 0;
    for (uint32_t l = 0; l < L; l++) {
        for (uint32_t e = 0; e < E; e++) {
            for (uint32_t p = 0; p < P; p++) {
                struct moe_bundle_blob x;
                enum moe_status rc = moe_bundle_expert(b, l, e, p, &x);
                if (rc != (moe_bundle_layer_has_experts(b, l) ? MOE_OK : MOE_ERR_NOT_FOUND)) abort();
                if (rc != MOE_OK) continue;
                const uint8_t *s = x.stored;
                if (s < data || x.stored_size > size || s + x.stored_size > data + size) abort();
                if (x.raw_size != x.desc->raw_size) abort();
                if (x.raw_size > MAX_DECODE || decoded > 4 * MAX_DECODE) continue;
                decoded += x.raw_size;
                moe_bundle_expert_verify(b, l, e, p);
                void *dst = malloc((size_t)x.raw_size);
                if (dst) moe_bundle_expert_load(b, l, e, p, dst, (size_t)x.raw_size);
                free(dst);
            }
        }
        if (l > 64) break; /* the counts can be large; a few layers cover the code */
    }
    for (uint32_t p = 0; p < P; p++) {
        const struct moe_bundle_precision *d = moe_bundle_precision_at(b, p);
        uint32_t idx;
        if (!d || moe_bundle_find_precision(b, d->name, &idx) != MOE_OK || idx != p) abort();
    }
    if (info.raw_blob_bytes <= 4 * MAX_DECODE) {
        int n_bad = 0;
        moe_bundle_verify_all(b, on_failure, &n_bad);
    }
    moe_bundle_free(b);
    (void)sum;
}

/* ---- recipes (fuzz-bundle-gen.h): a bundle of every kind of item ---- */

/* text: n bytes of mostly printable text; high input bytes give UTF-8 lead
 * and continuation bytes, NUL, DEL and other bytes the reader must refuse. */
static uint8_t *text(struct fz_src *s, struct fz_arena *a, size_t n) {
    static const uint8_t odd[16] = {0x00, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F,
                                    0xFF, 0xC0, 0x80, 0xED, 0xA0, 0x7F, 0x1F, 0xF4};
    uint8_t *t = fz_alloc(a, n + 1);
    for (size_t i = 0; t && i < n; i++) {
        unsigned b = fz_byte(s);
        t[i] = (uint8_t)(b < 0xF0 ? 0x20 + b % 95 : odd[b & 15]);
    }
    return t;
}

/* value: the encoding of a KV value of the given type (docs/format.md), with
 * now and then a length one byte off. */
static const uint8_t *value(struct fz_src *s, struct fz_arena *a, uint32_t type, uint64_t *vlen) {
    struct fz_buf o = {0};
    switch (type) {
    case 1: {
        size_t n = fz_pick(s, 24, 5);
        fz_put(&o, text(s, a, n), n);
        break;
    }
    case 2:
    case 3:
        for (int i = 0; i < 8; i++) fz_put(&o, (uint8_t[]){(uint8_t)fz_byte(s)}, 1);
        break;
    case 4: fz_put(&o, (uint8_t[]){(uint8_t)fz_pick(s, 3, 1)}, 1); break;
    case 6:
    case 7: {
        unsigned n = fz_pick(s, 5, 2);
        for (unsigned i = 0; i < 8 * n; i++) fz_put(&o, (uint8_t[]){(uint8_t)fz_byte(s)}, 1);
        break;
    }
    case 8: {
        unsigned n = fz_pick(s, 4, 2);
        fz_put64(&o, n);
        for (unsigned i = 0; i < n; i++) {
            size_t k = fz_pick(s, 8, 3);
            fz_put64(&o, k);
            fz_put(&o, text(s, a, k), k);
        }
        break;
    }
    default: { /* bytes, and the unknown types 0 and 9 */
        size_t n = fz_pick(s, 24, 4);
        for (size_t i = 0; i < n; i++) fz_put(&o, (uint8_t[]){(uint8_t)fz_byte(s)}, 1);
    }
    }
    unsigned skew = fz_pick(s, 16, 0);
    if (skew == 15) fz_put(&o, (uint8_t[]){1}, 1);
    if (skew == 14 && o.n) o.n--;
    uint8_t *v = fz_alloc(a, o.n);
    if (v && o.n) memcpy(v, o.p, o.n);
    *vlen = v ? o.n : 0;
    free(o.p);
    return v;
}

/* kv_entries: n entries of a KV set, keys from a table (with their usual
 * type) or from the input. */
static void kv_entries(struct fz_src *s, struct fz_arena *a, struct fz_kvset *kv, int tuning) {
    static const char *const k_meta[] = {"general.architecture", "hf.config.json", "quant.dense", "quant.experts",
                                         "provenance.files", "quant.zstd_level", "a", "a.b"};
    static const uint32_t k_meta_type[] = {1, 1, 1, 8, 8, 2, 5, 4};
    static const char *const k_tune[] = {"edgemoe.bitwidth.map", "hobbit.t1", "profile.tokens", "plan.policy",
                                         "edgemoe.path1.prob", "mobile.gamma", "plan.dynamic", "z"};
    static const uint32_t k_tune_type[] = {6, 3, 2, 1, 7, 3, 2, 4};
    const char *const *keys = tuning ? k_tune : k_meta;
    const uint32_t *types = tuning ? k_tune_type : k_meta_type;
    kv->keep_order = fz_pick(s, 16, 0) == 15;
    unsigned n = fz_pick(s, 7, tuning ? 1 : 3);
    for (unsigned i = 0; i < n; i++) {
        unsigned k = fz_pick(s, 9, i);
        const char *key;
        uint32_t klen, dflt;
        if (k < 8) {
            key = keys[k], klen = (uint32_t)strlen(key), dflt = types[k];
        } else { /* a key from the input: any length up to 300 (the limit is 256), any bytes */
            klen = fz_pick(s, 16, 3);
            if (klen == 15) klen = 257 + fz_pick(s, 44, 0);
            if (klen == 14) klen = 0;
            key = (const char *)text(s, a, klen), dflt = 5;
        }
        if (!key) return;
        unsigned t = fz_pick(s, 10, dflt - 1); /* 0..7: types 1..8; 8, 9: the unknown 0 and 9 */
        uint32_t type = t < 8 ? t + 1 : (t == 8 ? 0 : 9);
        uint64_t vlen;
        const uint8_t *v = value(s, a, type, &vlen);
        fz_kv_set(kv, key, klen, type, v, vlen);
    }
}

/* build: a bundle from the recipe's choices; every default is valid. */
static int build(struct fz_src *s, struct fz_arena *a, struct fz_bundle *b) {
    memset(b, 0, sizeof *b);
    kv_entries(s, a, &b->meta, 0);
    static const char *const k_names[] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                                          "t", "a.b", "x\x7f"};
    static const uint32_t k_types[] = {0, 1, 8, 30, 2, 0xffffffffu};
    b->n_tensors = (int)fz_pick(s, 6, 2);
    for (int i = 0; i < b->n_tensors; i++) {
        struct fz_tensor *t = &b->t[i];
        unsigned k = fz_pick(s, 8, (unsigned)i);
        if (k < 6) {
            t->name = k_names[k];
        } else if (k == 6) { /* a name from the input (empty, long or with control bytes: refused) */
            uint32_t n = fz_pick(s, 16, 4);
            if (n == 15) n = 1025;
            t->name = (const char *)text(s, a, n);
            t->nlen = n;
        } else {
            char *nm = fz_alloc(a, 16);
            if (nm) snprintf(nm, 16, "t%d", i);
            t->name = nm;
        }
        if (!t->name) return 0;
        if (k != 6) t->nlen = (uint32_t)strlen(t->name);
        t->type = k_types[fz_pick(s, 6, 0)];
        t->ndims = fz_pick(s, 6, 2); /* 5: more than 4 dims */
        uint64_t elems = 1;
        for (uint32_t d = 0; d < t->ndims && d < 4; d++) elems *= t->dims[d] = 1 + fz_pick(s, 8, 3);
        t->reserved = fz_pick(s, 16, 0) == 15;
        static const uint64_t k_size[] = {0, 0, 1, 64, 4096, 4097, 8192, 0};
        unsigned z = fz_pick(s, 8, 0);
        t->size = z == 0 ? 4 * elems : z == 7 ? elems : k_size[z];
        uint8_t *d = fz_alloc(a, (size_t)t->size);
        if (!d) return 0;
        for (uint64_t j = 0; j < t->size; j++) d[j] = (uint8_t)(j * 131 + (uint64_t)i);
        t->data = d;
    }
    static const uint32_t k_shape[5][3] = {{0, 0, 0}, {1, 2, 1}, {2, 2, 2}, {1, 1, 1}, {0, 0, 0}};
    unsigned shape = fz_pick(s, 5, 1);
    b->L = k_shape[shape][0], b->E = k_shape[shape][1], b->P = k_shape[shape][2];
    if (shape == 4) b->L = 1 + fz_pick(s, 3, 0), b->E = 1 + fz_pick(s, 4, 1), b->P = 1 + fz_pick(s, 4, 0);
    static const char *const k_prec[] = {"f32", "q8_0", "q4_0", "x", "a-b.c+1", "bad name", ""};
    static const uint32_t k_ptype[] = {0, 8, 2, 30};
    static const uint64_t k_nbytes[] = {0, 0, 1, 63, 64, 65, 4096, 0};
    for (uint32_t p = 0; p < b->P; p++) {
        struct fz_prec *d = &b->prec[p];
        d->name = k_prec[fz_pick(s, 7, p)];
        d->nlen = (uint32_t)strlen(d->name);
        d->nparts = 1 + fz_pick(s, 5, 2); /* 5: more than 4 parts */
        for (uint32_t k = 0; k < d->nparts && k < 4; k++) {
            struct fz_part *q = &d->part[k];
            q->type = k_ptype[fz_pick(s, 4, 0)];
            q->reserved = fz_pick(s, 16, 0) == 15;
            q->rows = 1 + fz_pick(s, 8, 3);
            q->cols = 32u << fz_pick(s, 2, 0);
            unsigned z = fz_pick(s, 8, 0);
            q->nbytes = z == 0 ? q->rows * q->cols : z == 7 ? 4 * q->rows * q->cols : k_nbytes[z];
        }
    }
    const size_t n_blob = (size_t)b->L * b->E * b->P;
    b->blob = fz_alloc(a, sizeof *b->blob * (n_blob + 1));
    if (!b->blob) return 0;
    const unsigned mask = fz_pick(s, 1u << b->L, (1u << b->L) - 1); /* layers with experts */
    for (uint32_t p = 0; p < b->P; p++) {
        uint64_t raw_size = fz_layout_size(&b->prec[p]);
        if (raw_size > (1u << 18)) raw_size = 1u << 18; /* the reader refuses the mismatch */
        uint8_t *raw = fz_alloc(a, (size_t)raw_size);
        if (!raw) return 0;
        unsigned kind = fz_pick(s, 3, 0);
        uint64_t r = 0x9E3779B97F4A7C15ull * (p + 1);
        for (uint64_t j = 0; j < raw_size; j++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            raw[j] = kind == 0 ? (uint8_t)(j % 64 == 0 ? j >> 6 : 0) : kind == 1 ? 0 : (uint8_t)r;
        }
        for (uint32_t l = 0; l < b->L; l++)
            for (uint32_t e = 0; e < b->E && (mask >> l & 1); e++) {
                struct fz_blob *x = &b->blob[((size_t)l * b->E + e) * b->P + p];
                unsigned c = fz_byte(s);
                if (c == 6) continue; /* an absent entry in a layer with experts */
                *x = (struct fz_blob){raw, raw_size, c % 8 == 7, c >> 3};
            }
    }
    b->slot[0].state = (int)fz_pick(s, 3, 1);
    b->slot[1].state = (int)fz_pick(s, 3, 0);
    b->slot[0].seq = fz_pick(s, 4, 1);
    b->slot[1].seq = fz_pick(s, 4, 2);
    for (int i = 0; i < 2; i++)
        if (b->slot[i].state == 1) kv_entries(s, a, &b->slot[i].kv, 1);
    return 1;
}

/* expand: the recipe as an image (fz_expand with this target's builder). */
static uint8_t *expand(const uint8_t *data, size_t size, size_t *len) { return fz_expand(build, 16, data, size, len); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        moe_log_set(quiet, NULL);
        init = 1;
    }
    run(data, size);
    uint8_t *copy = NULL;
    size_t n = size;
    if (size >= 8 && !memcmp(data, "MOEBUNDL", 8)) { /* an image: also resealed */
        if (!(copy = malloc(size ? size : 1))) return 0;
        memcpy(copy, data, size);
        fz_reseal(copy, size);
    } else { /* a recipe: the bundle it describes, in a buffer of exactly its size */
        uint8_t *img = expand(data, size, &n);
        if (!img) return 0;
        copy = malloc(n ? n : 1);
        if (copy) memcpy(copy, img, n);
        free(img);
        if (!copy) return 0;
    }
    run(copy, n);
    free(copy);
    return 0;
}

#ifdef MOE_LIBFUZZER
/* The structure-aware mutator (fuzz-bundle-gen.h, fz_mutate). */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    return fz_mutate(data, size, max_size, seed, expand);
}
#endif

/*
 * fuzz-bundle.c - libFuzzer target for the bundle reader (moe_bundle_open_memory).
 *
 * Each input is opened twice: as given (which mostly exercises the header and
 * checksum checks, since random bytes rarely match an XXH3), and as a copy whose
 * header, directory, slot, tuning-payload and stored-blob checksums are
 * recomputed first, so that mutations reach the directory, KV, expert-table and
 * tuning decoders and the zstd frame checks. On
 * success the target walks everything the API exposes (metadata and tuning
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
 * `test-bundle --write-seeds tests/fuzz/corpus/bundle`; ctest replays them (and
 * any crash-* file kept after fixing its bug) through replay-main.c as the
 * test fuzz-bundle-replay, without libFuzzer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "moe-bundle.h"

#define MAX_DECODE (16u << 20)

/* Log sink that drops messages: the fuzzer produces millions of errors. */
static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level;
    (void)msg;
    (void)user;
}

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t rd32(const uint8_t *p) { return (uint32_t)(rd64((const uint8_t[8]){p[0], p[1], p[2], p[3]})); }

/* Recomputes the stored-bytes checksum of every present blob whose bytes lie in
 * the input, so that fuzzed zstd frames reach the decoder. Walks the expert
 * section of the directory d[0..n) (docs/format.md) with bounds checks. */
static void reseal_blobs(uint8_t *img, size_t size, uint8_t *d, uint64_t n) {
    if (n < 32) return;
    uint64_t m = rd64(d + 8), t = rd64(d + 16);
    if (m > n - 32 || t > n - 32 - m) return;
    uint64_t pos = 32 + m + t;
    if (n - pos < 16) return;
    uint64_t cnt = (uint64_t)rd32(d + pos) * rd32(d + pos + 4), np = rd32(d + pos + 8);
    if (np > 16) return;
    cnt *= np;
    pos += 16;
    for (uint64_t i = 0; i < np; i++) {
        if (n - pos < 8) return;
        uint64_t skip = 8 + 32 * (uint64_t)(rd32(d + pos + 4) & 7) + rd32(d + pos);
        if (skip > n - pos) return;
        pos += skip;
    }
    for (uint64_t i = 0; i < cnt && n - pos >= 48; i++, pos += 48) {
        uint8_t *e = d + pos;
        uint64_t off = rd64(e), stored = rd64(e + 8);
        if ((rd32(e + 44) & 1) && off <= size && stored <= size - off)
            wr64(e + 32, XXH3_64bits(img + off, (size_t)stored));
    }
}

/* Recomputes the checksums an input cannot plausibly get right by mutation. */
static void reseal(uint8_t *img, size_t n) {
    if (n < 4096) return;
    uint64_t off = rd64(img + 32), size = rd64(img + 40);
    if (off <= n && size <= n - off) {
        reseal_blobs(img, n, img + off, size);
        wr64(img + 48, XXH3_64bits(img + off, (size_t)size));
    }
    wr64(img + 120, XXH3_64bits(img, 120));
    for (int i = 0; i < 2; i++) {
        uint8_t *s = img + (i ? 1024 : 512);
        uint64_t po = rd64(s + 16), ps = rd64(s + 24);
        if (po <= n && ps <= n - po) wr64(s + 32, XXH3_64bits(img + po, (size_t)ps));
        wr64(s + 56, XXH3_64bits(s, 56));
    }
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        moe_log_set(quiet, NULL);
        init = 1;
    }
    run(data, size);
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    reseal(copy, size);
    run(copy, size);
    free(copy);
    return 0;
}

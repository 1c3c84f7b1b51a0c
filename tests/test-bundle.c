/*
 * test-bundle.c - tests of formats/bundle-*.c (the .moeb container).
 *
 *  1. Round trip: a bundle with metadata of every type, tensors (2-D, 1-D,
 *     scalar, empty), 3 layers (layer 1 dense) x 4 experts x 2 precisions of
 *     random blobs (compressible ones zstd-compressed, random ones kept raw by
 *     the 3% rule), added in shuffled order, with an initial tuning payload;
 *     reopened from the file and from memory and checked bit-exactly. The same
 *     inputs written twice give byte-identical files.
 *  2. Damage: one flipped byte in any blob (first, middle and last byte of each)
 *     is found by verify_all, named "layer L expert E precision P", and refused
 *     by expert_load; a flipped tensor byte is named; every byte of the
 *     directory and of the header fails open; truncation at every 4096 boundary
 *     and odd lengths fails open with a message.
 *  3. Tuning: three replacements; simulated crashes (payload appended but slot
 *     not written; slot torn; everything written); a damaged newer payload
 *     falls back with a warning; both slots bad fails.
 *  4. Writer: nothing at the final path before finish or after abort/free;
 *     finish with a missing expert fails and the writer stays usable; argument
 *     errors; concurrent add_expert from 4 threads.
 *  5. A table of malformed headers and directories (checksums recomputed so the
 *     targeted check fires), each failing with its own message.
 *  6. Reopening for direct reads (moe_bundle_open_fd): the mapped file opens;
 *     a FIFO, another file or a directory put at its path since is refused
 *     without blocking; a bundle from memory has no file.
 *  7. Large writes (the writer's O_DIRECT path, where the file system has it):
 *     blobs and a tensor of sizes that are not multiples of 4096, from
 *     page-aligned, unaligned and compressed buffers, one larger than the
 *     4 MiB bounce buffer, added from two threads; read back exactly, zeros
 *     from each item's end to the next page; added in a fixed order, the same
 *     bytes as with MOE_BUNDLE_DIRECT=0 (every write buffered).
 *
 * `test-bundle --write-seeds DIR` writes the small fuzz seeds of
 * tests/fuzz/corpus/bundle instead of testing.
 */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw */
#include <ftw.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "moe-bundle.h"
#include "moe-test.h"
#include "moe-test-log.h"


/* ------------------------------------------------------------------------- */
/* helpers                                                                    */

static char g_dir[256];

/* xorshift64*: deterministic test bytes. */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* Fills n random bytes. */
static void fill_random(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rng_next(&s) >> 56);
}

/* Fills n compressible bytes (a short repeating pattern with rare noise). */
static void fill_compressible(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t s = seed + 7;
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 7 + seed) % 13);
    for (size_t i = 0; i < n / 50; i++) p[rng_next(&s) % n] = (uint8_t)rng_next(&s);
}

/* Path of a file in the test directory (static buffer rotation). */
static const char *tpath(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* Reads a whole file; caller frees. */
static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(len > 0 ? (size_t)len : 1);
    if (p && len > 0 && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return p;
}

/* Writes a whole file. */
static bool spit(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* True if path exists. */
static bool exists(const char *path) { return access(path, F_OK) == 0; }

static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint32_t get32(const uint8_t *p) { return (uint32_t)get64((const uint8_t[8]){p[0], p[1], p[2], p[3]}); }
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Recomputes the directory checksum (when the directory is in bounds) and the
 * header checksum, so that a deliberate mutation reaches its own check. */
static void reseal(uint8_t *img, size_t len) {
    uint64_t off = get64(img + 32), size = get64(img + 40);
    if (off <= len && size <= len - off) put64(img + 48, XXH3_64bits(img + off, (size_t)size));
    put64(img + 120, XXH3_64bits(img, 120));
}

/* Recomputes the checksum of tuning slot i (0 = A at 512, 1 = B at 1024). */
static void reseal_slot(uint8_t *img, int i) {
    uint8_t *s = img + (i ? 1024 : 512);
    put64(s + 56, XXH3_64bits(s, 56));
}

/* ------------------------------------------------------------------------- */
/* the reference bundle                                                       */

#define NL 3
#define NE 4
#define NP 2
#define DENSE_LAYER 1

static struct moe_bundle_precision g_prec[NP];

/* Fills the two precision descriptors (part sizes that need 64-byte padding). */
static void init_precisions(void) {
    memset(g_prec, 0, sizeof g_prec);
    g_prec[0].name = "q4_k";
    g_prec[0].n_parts = 3;
    g_prec[0].parts[0] = (struct moe_bundle_part){12, 8, 256, 1000, 0};
    g_prec[0].parts[1] = (struct moe_bundle_part){12, 8, 256, 1001, 0};
    g_prec[0].parts[2] = (struct moe_bundle_part){14, 256, 8, 999, 0};
    g_prec[1].name = "q8_0";
    g_prec[1].n_parts = 2;
    g_prec[1].parts[0] = (struct moe_bundle_part){8, 16, 300, 5000, 0};
    g_prec[1].parts[1] = (struct moe_bundle_part){8, 300, 16, 3333, 0};
    moe_bundle_precision_layout(&g_prec[0]);
    moe_bundle_precision_layout(&g_prec[1]);
}

/* Even experts are compressible, odd ones random (kept raw by the 3% rule). */
static bool blob_compressible(uint32_t e) { return e % 2 == 0; }

/* The raw bytes of blob (l, e, p): caller frees. */
static uint8_t *make_blob(uint32_t l, uint32_t e, uint32_t p, size_t *n) {
    *n = (size_t)g_prec[p].raw_size;
    uint8_t *b = malloc(*n);
    uint64_t seed = 1000 + l * 100 + e * 10 + p;
    if (blob_compressible(e))
        fill_compressible(b, *n, seed);
    else
        fill_random(b, *n, seed);
    return b;
}

static const char *const g_strs[] = {"", "alpha", "βeta ✓", "line\nbreak"};
static const int64_t g_i64s[] = {0, -1, INT64_MIN, INT64_MAX, 42};
static double g_f64s[4];
static const char g_config[] = "{\"architectures\": [\"Qwen3MoeForCausalLM\"],\n \"hidden_size\": 64}";
static const uint8_t g_bytes[] = {0, 1, 2, 0, 255, 0};

#define N_TENSORS 4
static const char *const g_tnames[N_TENSORS] = {"model.embed_tokens.weight", "model.norm.weight",
                                                "scale.scalar", "empty.tensor"};
static const uint64_t g_tsizes[N_TENSORS] = {10000, 256, 4, 0};

/* Random bytes of tensor i: caller frees. */
static uint8_t *make_tensor(int i) {
    uint8_t *p = malloc(g_tsizes[i] ? g_tsizes[i] : 1);
    fill_random(p, g_tsizes[i], 77 + (uint64_t)i);
    return p;
}

/* Builds a tuning set whose "version" key is v. */
static struct moe_bundle_kv *make_tuning(int v) {
    struct moe_bundle_kv *kv = NULL;
    moe_bundle_kv_new(&kv);
    moe_bundle_kv_set_i64(kv, "version", v);
    moe_bundle_kv_set_f64_array(kv, "cache.weights", (const double[]){0.5, 0.25 * v}, 2);
    int64_t order[NE] = {3, 1, 0, 2};
    moe_bundle_kv_set_i64_array(kv, "popularity", order, NE);
    moe_bundle_kv_set_str(kv, "note", v % 2 ? "odd" : "even");
    return kv;
}

/* Writes the reference bundle to path; returns the writer status. Blobs are
 * added in a shuffled (but fixed) order. */
static enum moe_status write_reference(const char *path) {
    struct moe_bundle_writer *w = NULL;
    enum moe_status rc = moe_bundle_writer_open(path, &w);
    if (rc != MOE_OK) return rc;
    g_f64s[0] = 3.141592653589793;
    g_f64s[1] = -0.0;
    g_f64s[2] = 1e-300;
    uint64_t nan_bits = 0x7ff8000000abcdefull;
    memcpy(&g_f64s[3], &nan_bits, 8);
    rc |= moe_bundle_writer_set_meta_str(w, "general.name", "tiny qwen3 moe");
    rc |= moe_bundle_writer_set_meta_str(w, "config.json", g_config);
    rc |= moe_bundle_writer_set_meta_str(w, "empty.string", "");
    rc |= moe_bundle_writer_set_meta_i64(w, "quant.min_i64", INT64_MIN);
    rc |= moe_bundle_writer_set_meta_f64(w, "quant.pi", g_f64s[0]);
    rc |= moe_bundle_writer_set_meta_bool(w, "quant.tied", true);
    rc |= moe_bundle_writer_set_meta_bool(w, "quant.untied", false);
    rc |= moe_bundle_writer_set_meta_bytes(w, "provenance.sha256", g_bytes, sizeof g_bytes);
    rc |= moe_bundle_writer_set_meta_bytes(w, "empty.bytes", NULL, 0);
    rc |= moe_bundle_writer_set_meta_i64_array(w, "ints", g_i64s, 5);
    rc |= moe_bundle_writer_set_meta_i64_array(w, "empty.ints", NULL, 0);
    rc |= moe_bundle_writer_set_meta_f64_array(w, "floats", g_f64s, 4);
    rc |= moe_bundle_writer_set_meta_str_array(w, "provenance.argv", g_strs, 4);
    rc |= moe_bundle_writer_set_meta_str(w, "overwritten", "first");
    rc |= moe_bundle_writer_set_meta_i64(w, "overwritten", 7); /* replaces, changes type */
    uint64_t shapes[N_TENSORS][4] = {{50, 200}, {64}, {0}, {0}};
    uint32_t dims[N_TENSORS] = {2, 1, 0, 1};
    for (int i = 0; i < N_TENSORS; i++) {
        uint8_t *t = make_tensor(i);
        rc |= moe_bundle_writer_add_tensor(w, g_tnames[i], (uint32_t)(30 + i), dims[i], shapes[i],
                                           t, g_tsizes[i]);
        free(t);
    }
    rc |= moe_bundle_writer_set_expert_layout(w, NL, NE, NP, g_prec);
    rc |= moe_bundle_writer_set_layer_has_experts(w, DENSE_LAYER, false);
    int order[NL * NE * NP];
    for (int i = 0; i < NL * NE * NP; i++) order[i] = (i * 7 + 3) % (NL * NE * NP);
    for (int k = 0; k < NL * NE * NP; k++) {
        uint32_t i = (uint32_t)order[k], l = i / (NE * NP), e = i / NP % NE, p = i % NP;
        if (l == DENSE_LAYER) continue;
        size_t n;
        uint8_t *b = make_blob(l, e, p, &n);
        rc |= moe_bundle_writer_add_expert(w, l, e, p, b, n, 3);
        free(b);
    }
    struct moe_bundle_kv *tun = make_tuning(1);
    rc |= moe_bundle_writer_set_tuning(w, tun);
    moe_bundle_kv_free(tun);
    if (rc == MOE_OK) rc = moe_bundle_writer_finish(w);
    moe_bundle_writer_free(w);
    return rc;
}

/* Checks that b holds the tuning written by make_tuning(v). */
static void check_tuning(const struct moe_bundle *b, int v, const char *ctx) {
    int64_t got = -1;
    const struct moe_bundle_kv *t = moe_bundle_tuning(b);
    CHECK(t != NULL, "%s: tuning is NULL", ctx);
    CHECK(moe_bundle_kv_i64(t, "version", &got) == MOE_OK && got == v,
          "%s: tuning version %lld, expected %d", ctx, (long long)got, v);
    size_t n = 0;
    const double *w = moe_bundle_kv_f64_array(t, "cache.weights", &n);
    CHECK(w && n == 2 && w[1] == 0.25 * v, "%s: cache.weights", ctx);
    const char *note = moe_bundle_kv_str(t, "note");
    CHECK(note && strcmp(note, v % 2 ? "odd" : "even") == 0, "%s: note", ctx);
}

/* Checks every item of the reference bundle bit-exactly. */
static void check_reference(const struct moe_bundle *b, const char *ctx) {
    size_t n = 0;
    int64_t i64 = 0;
    double f64 = 0;
    bool bo = false;
    const char *s = moe_bundle_meta_str(b, "general.name");
    CHECK(s && strcmp(s, "tiny qwen3 moe") == 0, "%s: general.name", ctx);
    s = moe_bundle_meta_str(b, "config.json");
    CHECK(s && strcmp(s, g_config) == 0, "%s: config.json", ctx);
    s = moe_bundle_meta_str(b, "empty.string");
    CHECK(s && s[0] == 0, "%s: empty string", ctx);
    CHECK(moe_bundle_meta_i64(b, "quant.min_i64", &i64) == MOE_OK && i64 == INT64_MIN, "%s: i64", ctx);
    CHECK(moe_bundle_meta_f64(b, "quant.pi", &f64) == MOE_OK && f64 == g_f64s[0], "%s: f64", ctx);
    CHECK(moe_bundle_meta_bool(b, "quant.tied", &bo) == MOE_OK && bo, "%s: bool true", ctx);
    CHECK(moe_bundle_meta_bool(b, "quant.untied", &bo) == MOE_OK && !bo, "%s: bool false", ctx);
    const uint8_t *by = moe_bundle_meta_bytes(b, "provenance.sha256", &n);
    CHECK(by && n == sizeof g_bytes && memcmp(by, g_bytes, n) == 0, "%s: bytes", ctx);
    by = moe_bundle_meta_bytes(b, "empty.bytes", &n);
    CHECK(by && n == 0, "%s: empty bytes", ctx);
    const int64_t *ia = moe_bundle_meta_i64_array(b, "ints", &n);
    CHECK(ia && n == 5 && memcmp(ia, g_i64s, sizeof g_i64s) == 0, "%s: i64 array", ctx);
    ia = moe_bundle_meta_i64_array(b, "empty.ints", &n);
    CHECK(ia && n == 0, "%s: empty i64 array", ctx);
    const double *fa = moe_bundle_meta_f64_array(b, "floats", &n);
    CHECK(fa && n == 4 && memcmp(fa, g_f64s, sizeof g_f64s) == 0, "%s: f64 array bit-exact", ctx);
    const char *const *sa = moe_bundle_meta_str_array(b, "provenance.argv", &n);
    CHECK(sa && n == 4, "%s: str array", ctx);
    for (size_t i = 0; sa && i < n && i < 4; i++)
        CHECK(strcmp(sa[i], g_strs[i]) == 0, "%s: str array [%zu]", ctx, i);
    CHECK(moe_bundle_meta_i64(b, "overwritten", &i64) == MOE_OK && i64 == 7, "%s: overwritten", ctx);
    /* absent and wrong type */
    CHECK(moe_bundle_meta_str(b, "no.such.key") == NULL, "%s: absent str", ctx);
    CHECK(moe_bundle_meta_i64(b, "no.such.key", &i64) == MOE_ERR_NOT_FOUND, "%s: absent i64", ctx);
    CHECK(moe_bundle_meta_i64(b, "quant.pi", &i64) == MOE_ERR_SHAPE, "%s: wrong type", ctx);
    CHECK(moe_bundle_meta_str(b, "quant.pi") == NULL, "%s: wrong type str", ctx);
    CHECK(moe_bundle_meta_f64_array(b, "ints", &n) == NULL && n == 0, "%s: wrong type array", ctx);
    /* iteration: sorted, all 14 keys */
    const struct moe_bundle_kv *meta = moe_bundle_meta(b);
    CHECK(moe_bundle_kv_count(meta) == 14, "%s: %zu metadata keys", ctx, moe_bundle_kv_count(meta));
    struct moe_bundle_kv_item it, prev = {0};
    for (size_t i = 0; i < moe_bundle_kv_count(meta); i++) {
        CHECK(moe_bundle_kv_at(meta, i, &it) == MOE_OK, "%s: kv_at", ctx);
        if (i) CHECK(strcmp(prev.key, it.key) < 0, "%s: keys out of order", ctx);
        prev = it;
    }
    CHECK(moe_bundle_kv_at(meta, 99, &it) == MOE_ERR_RANGE, "%s: kv_at past end", ctx);
    CHECK(moe_bundle_kv_find(meta, "floats", &it) == MOE_OK && it.type == MOE_KV_F64_ARRAY &&
              it.count == 4,
          "%s: kv_find", ctx);

    /* tensors */
    CHECK(moe_bundle_tensor_count(b) == N_TENSORS, "%s: tensor count", ctx);
    for (int i = 0; i < N_TENSORS; i++) {
        const struct moe_bundle_tensor *t = moe_bundle_find_tensor(b, g_tnames[i]);
        CHECK(t && t == moe_bundle_tensor_at(b, (size_t)i), "%s: tensor %s", ctx, g_tnames[i]);
        if (!t) continue;
        uint8_t *want = make_tensor(i);
        CHECK(t->size == g_tsizes[i] && memcmp(t->data, want, g_tsizes[i]) == 0,
              "%s: tensor %s bytes", ctx, g_tnames[i]);
        CHECK(t->type_id == (uint32_t)(30 + i) && t->offset % 4096 == 0, "%s: tensor %s fields",
              ctx, g_tnames[i]);
        CHECK(moe_bundle_tensor_verify(b, t) == MOE_OK, "%s: tensor verify", ctx);
        free(want);
    }
    const struct moe_bundle_tensor *t0 = moe_bundle_find_tensor(b, g_tnames[0]);
    CHECK(t0 && t0->n_dims == 2 && t0->shape[0] == 50 && t0->shape[1] == 200 && t0->shape[2] == 0,
          "%s: shape", ctx);
    CHECK(moe_bundle_find_tensor(b, "model.missing") == NULL, "%s: absent tensor", ctx);
    CHECK(moe_bundle_tensor_at(b, N_TENSORS) == NULL, "%s: tensor_at past end", ctx);

    /* experts */
    uint32_t L, E, P;
    moe_bundle_expert_layout(b, &L, &E, &P);
    CHECK(L == NL && E == NE && P == NP, "%s: layout %u %u %u", ctx, L, E, P);
    uint32_t idx = 9;
    CHECK(moe_bundle_find_precision(b, "q8_0", &idx) == MOE_OK && idx == 1, "%s: find precision", ctx);
    CHECK(moe_bundle_find_precision(b, "q2_k", &idx) == MOE_ERR_NOT_FOUND, "%s: absent precision", ctx);
    for (uint32_t p = 0; p < NP; p++) {
        const struct moe_bundle_precision *d = moe_bundle_precision_at(b, p);
        CHECK(d && strcmp(d->name, g_prec[p].name) == 0 && d->n_parts == g_prec[p].n_parts &&
                  d->raw_size == g_prec[p].raw_size,
              "%s: precision %u", ctx, p);
        for (uint32_t k = 0; d && k < d->n_parts; k++)
            CHECK(memcmp(&d->parts[k], &g_prec[p].parts[k], sizeof d->parts[k]) == 0 &&
                      d->parts[k].offset % 64 == 0,
                  "%s: precision %u part %u", ctx, p, k);
    }
    CHECK(g_prec[0].parts[1].offset == 1024 && g_prec[0].parts[2].offset == 2048 &&
              g_prec[0].raw_size == 3047,
          "%s: q4_k part layout", ctx);
    CHECK(moe_bundle_precision_at(b, NP) == NULL, "%s: precision past end", ctx);
    for (uint32_t l = 0; l < NL; l++) {
        CHECK(moe_bundle_layer_has_experts(b, l) == (l != DENSE_LAYER), "%s: layer %u has", ctx, l);
        for (uint32_t e = 0; e < NE; e++) {
            for (uint32_t p = 0; p < NP; p++) {
                struct moe_bundle_blob x;
                enum moe_status rc = moe_bundle_expert(b, l, e, p, &x);
                if (l == DENSE_LAYER) {
                    CHECK(rc == MOE_ERR_NOT_FOUND, "%s: dense layer blob", ctx);
                    continue;
                }
                size_t n_raw;
                uint8_t *want = make_blob(l, e, p, &n_raw);
                CHECK(rc == MOE_OK && x.raw_size == n_raw && x.offset % 4096 == 0 &&
                          x.desc == moe_bundle_precision_at(b, p),
                      "%s: blob %u %u %u", ctx, l, e, p);
                CHECK(x.compression == (blob_compressible(e) ? MOE_BUNDLE_COMP_ZSTD
                                                             : MOE_BUNDLE_COMP_NONE),
                      "%s: blob %u %u %u compression %u", ctx, l, e, p, x.compression);
                if (x.compression == MOE_BUNDLE_COMP_ZSTD)
                    CHECK(x.stored_size * 100 <= x.raw_size * 97, "%s: zstd saves >= 3%%", ctx);
                uint8_t *got = malloc(n_raw + 1);
                CHECK(moe_bundle_expert_load(b, l, e, p, got, n_raw + 1) == MOE_OK &&
                          memcmp(got, want, n_raw) == 0,
                      "%s: load blob %u %u %u", ctx, l, e, p);
                CHECK(moe_bundle_expert_verify(b, l, e, p) == MOE_OK, "%s: verify blob", ctx);
                /* the O_DIRECT path: the caller's own aligned copy of the stored bytes */
                void *staged = NULL;
                if (posix_memalign(&staged, 4096, x.stored_size ? x.stored_size : 1) == 0) {
                    memcpy(staged, x.stored, x.stored_size);
                    memset(got, 0, n_raw);
                    CHECK(moe_bundle_blob_decode(b, &x, staged, got, n_raw) == MOE_OK &&
                              memcmp(got, want, n_raw) == 0,
                          "%s: decode staged blob", ctx);
                    free(staged);
                }
                log_reset();
                CHECK(moe_bundle_expert_load(b, l, e, p, got, n_raw - 1) == MOE_ERR_RANGE &&
                          strstr(g_err, "smaller"),
                      "%s: small destination", ctx);
                free(got);
                free(want);
            }
        }
    }
    struct moe_bundle_blob x;
    CHECK(moe_bundle_expert(b, NL, 0, 0, &x) == MOE_ERR_RANGE, "%s: layer out of range", ctx);
    CHECK(moe_bundle_expert(b, 0, NE, 0, &x) == MOE_ERR_RANGE, "%s: expert out of range", ctx);
    CHECK(moe_bundle_expert(b, 0, 0, NP, &x) == MOE_ERR_RANGE, "%s: precision out of range", ctx);
    CHECK(!moe_bundle_layer_has_experts(b, NL), "%s: has_experts out of range", ctx);
}

/* ------------------------------------------------------------------------- */
/* verify_all collection                                                      */

struct failures {
    int n;
    char items[8][200];
    char problems[8][200];
};

/* verify_all callback: records up to 8 failures. */
static void on_failure(const char *item, const char *problem, void *user) {
    struct failures *f = user;
    if (f->n < 8) {
        snprintf(f->items[f->n], sizeof f->items[0], "%s", item);
        snprintf(f->problems[f->n], sizeof f->problems[0], "%s", problem);
    }
    f->n++;
}

/* ------------------------------------------------------------------------- */
/* 1. round trip                                                              */

static void test_round_trip(void) {
    const char *path = tpath("ref.moeb");
    CHECK(write_reference(path) == MOE_OK, "write reference: %s", g_err);
    CHECK(!exists(tpath("ref.moeb.tmp")), "no temp file left");
    struct moe_bundle *b = NULL;
    CHECK(moe_bundle_open(path, &b) == MOE_OK, "open reference: %s", g_err);
    if (!b) return;
    check_reference(b, "file");
    check_tuning(b, 1, "file");
    struct moe_bundle_info info;
    moe_bundle_get_info(b, &info);
    CHECK(info.version_major == 1 && info.version_minor == 0 && info.tuning_slot == 'A' &&
              info.tuning_sequence == 1 && info.reclaimable_bytes == 0 &&
              info.tuning_offset % 4096 == 0 && info.tuning_offset >= info.dir_offset + info.dir_size,
          "info");
    CHECK(info.file_size == info.tuning_offset + info.tuning_size, "file ends with the payload");
    /* page-aligned data pointers in the mapping (O_DIRECT / pinned staging) */
    struct moe_bundle_blob x;
    moe_bundle_expert(b, 2, 3, 1, &x);
    CHECK(((uintptr_t)x.stored & 4095) == 0, "blob pointer page-aligned");
    struct failures f = {0};
    CHECK(moe_bundle_verify_all(b, on_failure, &f) == MOE_OK && f.n == 0, "verify_all clean: %d",
          f.n);
    CHECK(strcmp(moe_bundle_path(b), path) == 0, "path");
    moe_bundle_free(b);

    /* from memory */
    size_t n;
    uint8_t *img = slurp(path, &n);
    CHECK(moe_bundle_open_memory(img, n, "mem", &b) == MOE_OK, "open_memory: %s", g_err);
    if (b) check_reference(b, "memory");
    moe_bundle_free(b);

    /* determinism: same inputs, same bytes */
    const char *path2 = tpath("ref2.moeb");
    CHECK(write_reference(path2) == MOE_OK, "write reference again");
    size_t n2;
    uint8_t *img2 = slurp(path2, &n2);
    CHECK(img2 && n2 == n && memcmp(img, img2, n) == 0, "two writes are byte-identical");
    free(img);
    free(img2);
    moe_bundle_free(NULL);
    moe_bundle_writer_free(NULL);
    moe_bundle_kv_free(NULL);
}

/* moe_bundle_open_fd: the expert store's second descriptor is the very file
 * that was mapped; whatever replaced it at the path is refused, never waited
 * on (a FIFO without a writer would block an ordinary open forever). */
static void test_open_fd(void) {
    const char *path = tpath("fd.moeb"), *moved = tpath("fd-moved.moeb");
    CHECK(write_reference(path) == MOE_OK, "write reference: %s", g_err);
    struct moe_bundle *b = NULL;
    CHECK(moe_bundle_open(path, &b) == MOE_OK, "open: %s", g_err);
    if (!b) return;
    int fd = -1;
    CHECK(moe_bundle_open_fd(b, &fd) == MOE_OK && fd >= 0, "the mapped file reopens: %s", g_err);
    if (fd >= 0) close(fd);
    CHECK(rename(path, moved) == 0 && mkfifo(path, 0600) == 0, "a FIFO in its place");
    log_reset();
    alarm(20); /* a blocking open would hang the test: fail it instead */
    CHECK(moe_bundle_open_fd(b, &fd) == MOE_ERR_IO && fd == -1 && strstr(g_err, "is a FIFO"),
          "a FIFO at the path is refused: %s", g_err);
    alarm(0);
    CHECK(unlink(path) == 0 && write_reference(path) == MOE_OK, "another file in its place");
    log_reset();
    CHECK(moe_bundle_open_fd(b, &fd) == MOE_ERR_IO && fd == -1 && strstr(g_err, "no longer the file"),
          "another file (same contents) is refused: %s", g_err);
    CHECK(unlink(path) == 0 && mkdir(path, 0700) == 0, "a directory in its place");
    log_reset();
    CHECK(moe_bundle_open_fd(b, &fd) == MOE_ERR_IO && fd == -1 && strstr(g_err, "is a directory"),
          "a directory is refused: %s", g_err);
    CHECK(rmdir(path) == 0 && rename(moved, path) == 0, "the original back");
    CHECK(moe_bundle_open_fd(b, &fd) == MOE_OK && fd >= 0, "and it reopens");
    if (fd >= 0) close(fd);
    moe_bundle_free(b);
    size_t n;
    uint8_t *img = slurp(path, &n);
    b = NULL;
    CHECK(img && moe_bundle_open_memory(img, n, "mem", &b) == MOE_OK, "open_memory");
    CHECK(b && moe_bundle_open_fd(b, &fd) == MOE_ERR_UNSUPPORTED && fd == -1, "a bundle in memory has no file");
    moe_bundle_free(b);
    free(img);
}

/* A bundle with no experts and no tensors is valid (a dense model's tables). */
static void test_minimal(void) {
    struct moe_bundle_writer *w = NULL;
    const char *path = tpath("min.moeb");
    CHECK(moe_bundle_writer_open(path, &w) == MOE_OK, "open minimal");
    CHECK(moe_bundle_writer_finish(w) == MOE_OK, "finish minimal: %s", g_err);
    moe_bundle_writer_free(w);
    struct moe_bundle *b = NULL;
    CHECK(moe_bundle_open(path, &b) == MOE_OK, "open minimal: %s", g_err);
    uint32_t L = 9;
    moe_bundle_expert_layout(b, &L, NULL, NULL);
    CHECK(b && L == 0 && moe_bundle_tensor_count(b) == 0 &&
              moe_bundle_kv_count(moe_bundle_tuning(b)) == 0 &&
              moe_bundle_kv_count(moe_bundle_meta(b)) == 0,
          "minimal contents");
    struct moe_bundle_info info;
    moe_bundle_get_info(b, &info);
    CHECK(info.dir_offset == 4096 && info.tuning_size == 0 && info.file_size == 4096 + info.dir_size,
          "minimal layout");
    CHECK(moe_bundle_verify_all(b, NULL, NULL) == MOE_OK, "minimal verify");
    moe_bundle_free(b);
}

/* ------------------------------------------------------------------------- */
/* 2. damage                                                                  */

static void test_flipped_blobs(void) {
    size_t n;
    uint8_t *img = slurp(tpath("ref.moeb"), &n);
    struct moe_bundle *b = NULL;
    if (!img || moe_bundle_open_memory(img, n, "ref", &b) != MOE_OK) {
        CHECK(0, "cannot load the reference");
        free(img);
        return;
    }
    uint8_t *copy = malloc(n);
    int cases = 0;
    for (uint32_t l = 0; l < NL; l++) {
        if (l == DENSE_LAYER) continue;
        for (uint32_t e = 0; e < NE; e++) {
            for (uint32_t p = 0; p < NP; p++) {
                struct moe_bundle_blob x;
                moe_bundle_expert(b, l, e, p, &x);
                uint64_t where[3] = {0, x.stored_size / 2, x.stored_size - 1};
                char name[96];
                snprintf(name, sizeof name, "layer %u expert %u precision %s", l, e, g_prec[p].name);
                for (int k = 0; k < 3; k++) {
                    memcpy(copy, img, n);
                    copy[x.offset + where[k]] ^= 0x10;
                    struct moe_bundle *d = NULL;
                    log_reset();
                    CHECK(moe_bundle_open_memory(copy, n, "damaged", &d) == MOE_OK,
                          "open does not checksum blobs");
                    if (!d) continue;
                    struct failures f = {0};
                    CHECK(moe_bundle_verify_all(d, on_failure, &f) == MOE_ERR_FORMAT && f.n == 1 &&
                              strcmp(f.items[0], name) == 0,
                          "flip in %s byte %llu: %d failures, first '%s: %s'", name,
                          (unsigned long long)where[k], f.n, f.items[0], f.problems[0]);
                    size_t raw = (size_t)x.raw_size;
                    uint8_t *dst = malloc(raw);
                    log_reset();
                    CHECK(moe_bundle_expert_load(d, l, e, p, dst, raw) == MOE_ERR_FORMAT &&
                              strstr(g_err, name) && strstr(g_err, "damaged"),
                          "load of damaged %s: %s", name, g_err);
                    log_reset();
                    CHECK(moe_bundle_expert_verify(d, l, e, p) == MOE_ERR_FORMAT && strstr(g_err, name),
                          "verify of damaged %s", name);
                    /* the other blobs still load */
                    uint32_t oe = (e + 1) % NE;
                    struct moe_bundle_blob y;
                    moe_bundle_expert(d, l, oe, p, &y);
                    uint8_t *dst2 = malloc((size_t)y.raw_size);
                    CHECK(moe_bundle_expert_load(d, l, oe, p, dst2, (size_t)y.raw_size) == MOE_OK,
                          "neighbour of damaged %s loads", name);
                    free(dst2);
                    free(dst);
                    moe_bundle_free(d);
                    cases++;
                }
            }
        }
    }
    CHECK(cases == 2 * NE * NP * 3, "flip cases run: %d", cases);
    /* every bit of one zstd blob: about 1% of such flips decode to the very same
     * output, which only the checksum of the stored bytes catches */
    struct moe_bundle_blob z;
    moe_bundle_expert(b, 2, 2, 0, &z);
    CHECK(z.compression == MOE_BUNDLE_COMP_ZSTD, "blob 2 2 0 is compressed");
    int caught = 0, tried = 0;
    for (uint64_t i = 0; i < z.stored_size; i++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(copy, img, n);
            copy[z.offset + i] ^= (uint8_t)(1u << bit);
            struct moe_bundle *d = NULL;
            if (moe_bundle_open_memory(copy, n, "bits", &d) != MOE_OK) continue;
            tried++;
            caught += moe_bundle_expert_verify(d, 2, 2, 0) == MOE_ERR_FORMAT;
            moe_bundle_free(d);
        }
    }
    CHECK(tried == (int)z.stored_size * 8 && caught == tried, "zstd bit flips caught: %d of %d",
          caught, tried);
    /* a compressed blob's message says checksum mismatch or names the zstd problem;
     * an uncompressed one always says checksum mismatch */
    struct moe_bundle_blob x;
    moe_bundle_expert(b, 2, 1, 0, &x);
    memcpy(copy, img, n);
    copy[x.offset + 5] ^= 1;
    struct moe_bundle *d = NULL;
    moe_bundle_open_memory(copy, n, "damaged", &d);
    log_reset();
    uint8_t *dst = malloc((size_t)x.raw_size);
    CHECK(d && moe_bundle_expert_load(d, 2, 1, 0, dst, (size_t)x.raw_size) == MOE_ERR_FORMAT &&
              strstr(g_err, "damaged: layer 2 expert 1 precision q4_k: checksum mismatch"),
          "exact message: %s", g_err);
    free(dst);
    moe_bundle_free(d);

    /* a flipped tensor byte */
    const struct moe_bundle_tensor *t = moe_bundle_find_tensor(b, "model.norm.weight");
    memcpy(copy, img, n);
    copy[t->offset + 100] ^= 0x80;
    d = NULL;
    moe_bundle_open_memory(copy, n, "damaged", &d);
    struct failures f = {0};
    CHECK(d && moe_bundle_verify_all(d, on_failure, &f) == MOE_ERR_FORMAT && f.n == 1 &&
              strcmp(f.items[0], "tensor model.norm.weight") == 0,
          "tensor flip: %d '%s'", f.n, f.items[0]);
    log_reset();
    CHECK(d && moe_bundle_tensor_verify(d, moe_bundle_find_tensor(d, "model.norm.weight")) ==
                   MOE_ERR_FORMAT &&
              strstr(g_err, "tensor model.norm.weight: checksum mismatch"),
          "tensor_verify message: %s", g_err);
    moe_bundle_free(d);

    /* every byte of the directory: open fails on the checksum */
    struct moe_bundle_info info;
    moe_bundle_get_info(b, &info);
    int dir_ok = 0;
    for (uint64_t i = 0; i < info.dir_size; i++) {
        memcpy(copy, img, n);
        copy[info.dir_offset + i] ^= 0x01;
        d = NULL;
        log_reset();
        if (moe_bundle_open_memory(copy, n, "dirflip", &d) != MOE_OK && d == NULL &&
            strstr(g_err, "dirflip: directory checksum mismatch"))
            dir_ok++;
        moe_bundle_free(d);
    }
    CHECK(dir_ok == (int)info.dir_size, "directory flips rejected: %d of %llu", dir_ok,
          (unsigned long long)info.dir_size);

    /* every byte of the checksummed header: open fails with a message */
    int hdr_ok = 0;
    for (int i = 0; i < 128; i++) {
        for (int bit = 0; bit < 8; bit += 7) {
            memcpy(copy, img, n);
            copy[i] ^= (uint8_t)(1u << bit);
            d = NULL;
            log_reset();
            enum moe_status rc = moe_bundle_open_memory(copy, n, "hdrflip", &d);
            if ((rc == MOE_ERR_FORMAT || rc == MOE_ERR_UNSUPPORTED) && !d && g_n_err == 1 &&
                strstr(g_err, "hdrflip: "))
                hdr_ok++;
            else
                fprintf(stderr, "  header byte %d bit %d: rc %d, %s\n", i, bit, rc, g_err);
            moe_bundle_free(d);
        }
    }
    CHECK(hdr_ok == 256, "header flips rejected: %d of 256", hdr_ok);
    /* reserved bytes of the header page outside the header and slots are ignored */
    memcpy(copy, img, n);
    copy[300] = 0xAA;
    copy[2000] = 0x55;
    d = NULL;
    CHECK(moe_bundle_open_memory(copy, n, "reserved", &d) == MOE_OK, "reserved page bytes ignored");
    moe_bundle_free(d);
    free(copy);
    moe_bundle_free(b);
    free(img);
}

static void test_truncation(void) {
    size_t n;
    uint8_t *img = slurp(tpath("ref.moeb"), &n);
    if (!img) {
        CHECK(0, "no reference");
        return;
    }
    size_t lens[512];
    int k = 0;
    size_t odd[] = {0, 1, 7, 8, 127, 128, 511, 600, 1087, 4095, n - 1, n - 4096 + 1, n - 8};
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) lens[k++] = odd[i];
    for (size_t len = 4096; len < n && k < 500; len += 4096) {
        lens[k++] = len;
        lens[k++] = len + 1;
    }
    int ok = 0;
    for (int i = 0; i < k; i++) {
        uint8_t *cut = malloc(lens[i] ? lens[i] : 1);
        memcpy(cut, img, lens[i]);
        struct moe_bundle *b = NULL;
        log_reset();
        enum moe_status rc = moe_bundle_open_memory(lens[i] ? cut : NULL, lens[i], "cut", &b);
        if (rc == MOE_ERR_FORMAT && !b && g_n_err >= 1 && strstr(g_err, "cut: "))
            ok++;
        else
            fprintf(stderr, "  truncated to %zu: rc %d: %s\n", lens[i], rc, g_err);
        moe_bundle_free(b);
        free(cut);
    }
    CHECK(ok == k, "truncations rejected: %d of %d", ok, k);
    /* on disk, through the mapping */
    const char *p = tpath("cut.moeb");
    size_t file_lens[] = {0, 100, 4096, n / 2, n - 1};
    for (size_t i = 0; i < sizeof file_lens / sizeof *file_lens; i++) {
        spit(p, img, file_lens[i]);
        struct moe_bundle *b = NULL;
        log_reset();
        CHECK(moe_bundle_open(p, &b) != MOE_OK && !b && strstr(g_err, p),
              "file truncated to %zu: %s", file_lens[i], g_err);
    }
    log_reset();
    CHECK(moe_bundle_open(tpath("does-not-exist.moeb"), &(struct moe_bundle *){NULL}) == MOE_ERR_IO &&
              strstr(g_err, "does-not-exist"),
          "missing file");
    free(img);
}

/* ------------------------------------------------------------------------- */
/* 3. tuning                                                                  */

/* Opens path and checks its tuning version and slot; returns the bundle info. */
static struct moe_bundle_info open_check_tuning(const char *path, int v, char slot, const char *ctx) {
    struct moe_bundle *b = NULL;
    struct moe_bundle_info info = {0};
    CHECK(moe_bundle_open(path, &b) == MOE_OK, "%s: open: %s", ctx, g_err);
    if (!b) return info;
    check_tuning(b, v, ctx);
    moe_bundle_get_info(b, &info);
    CHECK(info.tuning_slot == slot, "%s: slot %c, expected %c", ctx, info.tuning_slot, slot);
    moe_bundle_free(b);
    return info;
}

/* Copies a file. */
static void copy_file(const char *from, const char *to) {
    size_t n;
    uint8_t *p = slurp(from, &n);
    spit(to, p, n);
    free(p);
}

static void test_tuning(void) {
    const char *path = tpath("tune.moeb");
    copy_file(tpath("ref.moeb"), path);
    size_t n0;
    uint8_t *orig = slurp(path, &n0);
    struct moe_bundle_info prev = open_check_tuning(path, 1, 'A', "initial");
    /* three replacements: slots alternate, sequence grows, old payloads stay */
    for (int v = 2; v <= 4; v++) {
        struct moe_bundle_kv *kv = make_tuning(v);
        log_reset();
        CHECK(moe_bundle_replace_tuning(path, kv) == MOE_OK, "replace %d: %s", v, g_err);
        moe_bundle_kv_free(kv);
        char ctx[32];
        snprintf(ctx, sizeof ctx, "replace %d", v);
        struct moe_bundle_info info = open_check_tuning(path, v, v % 2 ? 'A' : 'B', ctx);
        CHECK(info.tuning_sequence == (uint64_t)v, "%s: sequence %llu", ctx,
              (unsigned long long)info.tuning_sequence);
        CHECK(info.tuning_offset > prev.tuning_offset && info.tuning_offset % 4096 == 0 &&
                  info.reclaimable_bytes > prev.reclaimable_bytes,
              "%s: appended, reclaimable %llu", ctx, (unsigned long long)info.reclaimable_bytes);
        prev = info;
    }
    /* expert data untouched */
    size_t n;
    uint8_t *now = slurp(path, &n);
    CHECK(n > n0 && memcmp(now + 4096, orig + 4096, n0 - 4096) == 0,
          "replacement leaves everything after the header page alone");
    free(now);
    struct moe_bundle *b = NULL;
    CHECK(moe_bundle_open(path, &b) == MOE_OK && moe_bundle_verify_all(b, NULL, NULL) == MOE_OK,
          "verify_all after replacements");
    moe_bundle_free(b);

    /* crash simulations, starting from a file whose active slot is B (v4) */
    size_t n_before;
    uint8_t *before = slurp(path, &n_before);
    struct moe_bundle_kv *kv5 = make_tuning(5);
    CHECK(moe_bundle_replace_tuning(path, kv5) == MOE_OK, "replace 5");
    size_t n_after;
    uint8_t *after = slurp(path, &n_after); /* (c): everything written; slot A now holds v5 */
    CHECK(n_after > n_before, "payload appended");
    const char *crash = tpath("crash.moeb");

    /* (a) new payload appended (and fsynced) but the slot never written */
    uint8_t *img = malloc(n_after);
    memcpy(img, after, n_after);
    memcpy(img + 512, before + 512, 64);
    spit(crash, img, n_after);
    log_reset();
    open_check_tuning(crash, 4, 'B', "crash (a)");
    CHECK(g_n_warn == 0, "crash (a) is silent: %s", g_warn);
    b = NULL;
    moe_bundle_open(crash, &b);
    struct moe_bundle_info info;
    moe_bundle_get_info(b, &info);
    CHECK(info.reclaimable_bytes >= n_after - n_before, "orphan counted as reclaimable");
    moe_bundle_free(b);
    /* the next replacement drops the orphan and uses the next sequence */
    struct moe_bundle_kv *kv6 = make_tuning(6);
    CHECK(moe_bundle_replace_tuning(crash, kv6) == MOE_OK, "replace after crash (a)");
    info = open_check_tuning(crash, 6, 'A', "after crash (a)");
    CHECK(info.tuning_sequence == 5, "sequence after crash (a): %llu",
          (unsigned long long)info.tuning_sequence);
    CHECK(info.tuning_offset == get64(after + 512 + 16) &&
              info.file_size == info.tuning_offset + info.tuning_size,
          "orphan dropped, the new payload took its place: offset %llu, size %llu",
          (unsigned long long)info.tuning_offset, (unsigned long long)info.file_size);

    /* (b) slot torn: garbage, or half new half old */
    memcpy(img, after, n_after);
    for (int i = 0; i < 64; i++) img[512 + i] = (uint8_t)(i * 37 + 11);
    spit(crash, img, n_after);
    log_reset();
    open_check_tuning(crash, 4, 'B', "crash (b) garbage");
    CHECK(strstr(g_warn, "tuning slot A is damaged (slot record checksum mismatch") &&
              strstr(g_warn, "using slot B (sequence 4, 4 tuning keys) instead"),
          "torn slot warned, naming the slot used instead: %s", g_warn);
    /* issue 17: a damaged slot record is damage: verify_all reports it */
    b = NULL;
    moe_bundle_open(crash, &b);
    struct failures ft = {0};
    CHECK(b && moe_bundle_verify_all(b, on_failure, &ft) == MOE_ERR_FORMAT && ft.n == 1 &&
              strcmp(ft.items[0], "tuning slot A") == 0,
          "verify_all names the torn slot: %d '%s'", ft.n, ft.n ? ft.items[0] : "");
    moe_bundle_free(b);
    memcpy(img, after, n_after);
    memcpy(img + 512 + 32, before + 512 + 32, 32);
    spit(crash, img, n_after);
    open_check_tuning(crash, 4, 'B', "crash (b) half");
    /* a replacement after a torn slot overwrites the torn slot */
    CHECK(moe_bundle_replace_tuning(crash, kv6) == MOE_OK, "replace after crash (b)");
    open_check_tuning(crash, 6, 'A', "after crash (b)");

    /* (c) complete */
    spit(crash, after, n_after);
    open_check_tuning(crash, 5, 'A', "crash (c)");

    /* a newer slot whose payload is damaged: fall back, warn, verify_all reports it */
    memcpy(img, after, n_after);
    img[n_after - 3] ^= 0xFF; /* the v5 payload is the tail */
    spit(crash, img, n_after);
    log_reset();
    open_check_tuning(crash, 4, 'B', "damaged newer payload");
    CHECK(strstr(g_warn, "tuning slot A is damaged (sequence 5: payload checksum mismatch); using slot B"),
          "fallback warned: %s", g_warn);
    b = NULL;
    moe_bundle_open(crash, &b);
    struct failures f = {0};
    CHECK(b && moe_bundle_verify_all(b, on_failure, &f) == MOE_ERR_FORMAT && f.n == 1 &&
              strcmp(f.items[0], "tuning slot A") == 0,
          "verify_all names the skipped slot: %d '%s'", f.n, f.items[0]);
    moe_bundle_free(b);

    /* both slots unusable */
    memcpy(img, after, n_after);
    memset(img + 512, 0x5A, 64);
    memset(img + 1024, 0xA5, 64);
    b = NULL;
    log_reset();
    CHECK(moe_bundle_open_memory(img, n_after, "noslot", &b) == MOE_ERR_FORMAT && !b &&
              strstr(g_err, "noslot: no usable tuning slot"),
          "both slots bad: %s", g_err);
    /* replace repairs it */
    spit(crash, img, n_after);
    CHECK(moe_bundle_replace_tuning(crash, kv6) == MOE_OK, "replace repairs both-bad slots");
    open_check_tuning(crash, 6, 'A', "repaired");

    /* clearing the tuning */
    CHECK(moe_bundle_replace_tuning(path, NULL) == MOE_OK, "clear tuning");
    b = NULL;
    CHECK(moe_bundle_open(path, &b) == MOE_OK && moe_bundle_kv_count(moe_bundle_tuning(b)) == 0,
          "cleared tuning is empty");
    moe_bundle_free(b);
    log_reset();
    CHECK(moe_bundle_replace_tuning(tpath("nope.moeb"), kv6) == MOE_ERR_NOT_FOUND, "replace missing");
    spit(crash, "garbage", 7);
    CHECK(moe_bundle_replace_tuning(crash, kv6) == MOE_ERR_FORMAT, "replace on garbage");

    moe_bundle_kv_free(kv5);
    moe_bundle_kv_free(kv6);
    free(img);
    free(after);
    free(before);
    free(orig);
}

/* ------------------------------------------------------------------------- */
/* 4. writer                                                                  */

/* Returns a writer with the small layout used by the writer tests. */
static struct moe_bundle_writer *small_writer(const char *path) {
    struct moe_bundle_writer *w = NULL;
    if (moe_bundle_writer_open(path, &w) != MOE_OK) return NULL;
    moe_bundle_writer_set_expert_layout(w, 2, 2, 1, g_prec);
    return w;
}

static void test_writer(void) {
    const char *path = tpath("w.moeb");
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    size_t n;
    uint8_t *blob = make_blob(0, 0, 0, &n);

    /* abort: nothing at the final path, temp file gone */
    struct moe_bundle_writer *w = small_writer(path);
    CHECK(w && exists(tmp) && !exists(path), "temp file exists, final does not");
    moe_bundle_writer_add_expert(w, 0, 0, 0, blob, n, 0);
    CHECK(!exists(path), "nothing at the final path before finish");
    moe_bundle_writer_abort(w);
    CHECK(!exists(tmp) && !exists(path), "abort removes the temp file");

    /* free without finish = abort */
    w = small_writer(path);
    moe_bundle_writer_free(w);
    CHECK(!exists(tmp) && !exists(path), "free without finish removes the temp file");

    /* a second writer of the same path in this process fails cleanly */
    w = small_writer(path);
    struct moe_bundle_writer *w2 = NULL;
    log_reset();
    CHECK(moe_bundle_writer_open(path, &w2) == MOE_ERR_IO && !w2 && strstr(g_err, "temp file"),
          "second writer: %s", g_err);

    /* argument errors leave the writer usable */
    log_reset();
    CHECK(moe_bundle_writer_add_expert(w, 0, 0, 0, blob, n - 1, 0) == MOE_ERR_INVALID &&
              strstr(g_err, "lay out"),
          "wrong raw size: %s", g_err);
    CHECK(moe_bundle_writer_add_expert(w, 2, 0, 0, blob, n, 0) == MOE_ERR_RANGE, "layer range");
    CHECK(moe_bundle_writer_add_expert(w, 0, 0, 0, blob, n, 99) == MOE_ERR_INVALID, "zstd level");
    CHECK(moe_bundle_writer_add_expert(w, 0, 0, 0, blob, n, 0) == MOE_OK, "add");
    log_reset();
    CHECK(moe_bundle_writer_add_expert(w, 0, 0, 0, blob, n, 0) == MOE_ERR_INVALID &&
              strstr(g_err, "already added"),
          "duplicate blob");
    CHECK(moe_bundle_writer_set_layer_has_experts(w, 0, false) == MOE_ERR_INVALID,
          "dense after blobs");
    CHECK(moe_bundle_writer_set_expert_layout(w, 2, 2, 1, g_prec) == MOE_ERR_INVALID, "layout twice");
    uint64_t shape[1] = {4};
    CHECK(moe_bundle_writer_add_tensor(w, "t", 0, 1, shape, "abcd", 4) == MOE_OK, "tensor");
    CHECK(moe_bundle_writer_add_tensor(w, "t", 0, 1, shape, "abcd", 4) == MOE_ERR_INVALID,
          "duplicate tensor");
    CHECK(moe_bundle_writer_add_tensor(w, "", 0, 1, shape, "abcd", 4) == MOE_ERR_INVALID, "empty name");
    CHECK(moe_bundle_writer_add_tensor(w, "bad\x01", 0, 1, shape, "abcd", 4) == MOE_ERR_INVALID,
          "control char name");
    CHECK(moe_bundle_writer_add_tensor(w, "bad\xff", 0, 1, shape, "abcd", 4) == MOE_ERR_INVALID,
          "non-UTF-8 name");
    CHECK(moe_bundle_writer_add_tensor(w, "d5", 0, 5, (uint64_t[5]){1, 1, 1, 1, 1}, "a", 1) ==
              MOE_ERR_INVALID,
          "5 dims");
    CHECK(moe_bundle_writer_add_tensor(w, "ovf", 0, 2, (uint64_t[2]){1ull << 40, 1ull << 40}, "a",
                                       1) == MOE_ERR_INVALID,
          "shape overflow");
    CHECK(moe_bundle_writer_set_meta_str(w, "k", "\xc0\xaf") == MOE_ERR_INVALID, "overlong UTF-8");
    CHECK(moe_bundle_writer_set_meta_i64(w, "", 1) == MOE_ERR_INVALID, "empty key");
    char longkey[300];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    CHECK(moe_bundle_writer_set_meta_i64(w, longkey, 1) == MOE_ERR_INVALID, "long key");
    const char *bad_arr[] = {"ok", NULL};
    CHECK(moe_bundle_writer_set_meta_str_array(w, "a", bad_arr, 2) == MOE_ERR_INVALID, "NULL element");

    /* finish with a missing expert fails; the writer stays usable */
    log_reset();
    CHECK(moe_bundle_writer_finish(w) == MOE_ERR_INVALID &&
              strstr(g_err, "layer 0 expert 1 precision q4_k was never added (3 blobs missing)"),
          "missing expert: %s", g_err);
    CHECK(!exists(path) && exists(tmp), "no final file after a failed finish");
    moe_bundle_writer_set_layer_has_experts(w, 1, false);
    uint8_t *b01 = make_blob(0, 1, 0, &n);
    CHECK(moe_bundle_writer_add_expert(w, 0, 1, 0, b01, n, 1) == MOE_OK, "add the missing blob");
    free(b01);
    CHECK(moe_bundle_writer_add_expert(w, 1, 0, 0, blob, n, 0) == MOE_ERR_INVALID, "dense layer add");
    CHECK(moe_bundle_writer_finish(w) == MOE_OK, "finish after fixing: %s", g_err);
    CHECK(exists(path) && !exists(tmp), "final file present, temp gone");
    CHECK(moe_bundle_writer_finish(w) == MOE_ERR_INVALID, "finish twice");
    CHECK(moe_bundle_writer_add_tensor(w, "late", 0, 0, NULL, NULL, 0) == MOE_ERR_INVALID,
          "add after finish");
    moe_bundle_writer_free(w);
    CHECK(exists(path), "free after finish keeps the file");
    struct moe_bundle *b = NULL;
    CHECK(moe_bundle_open(path, &b) == MOE_OK && moe_bundle_layer_has_experts(b, 0) &&
              !moe_bundle_layer_has_experts(b, 1) && moe_bundle_verify_all(b, NULL, NULL) == MOE_OK,
          "small bundle reads back");
    moe_bundle_free(b);

    /* a writer in a directory that does not exist */
    log_reset();
    CHECK(moe_bundle_writer_open(tpath("no/such/dir/x.moeb"), &w2) == MOE_ERR_INVALID && !w2,
          "a directory that does not exist is refused before anything is created");
    free(blob);

    /* precision descriptor errors */
    struct moe_bundle_precision bad[2];
    memcpy(bad, g_prec, sizeof bad);
    w = NULL;
    moe_bundle_writer_open(path, &w);
    bad[1].name = "q4_k";
    CHECK(moe_bundle_writer_set_expert_layout(w, 1, 1, 2, bad) == MOE_ERR_INVALID, "dup precision");
    bad[1].name = "has space";
    CHECK(moe_bundle_writer_set_expert_layout(w, 1, 1, 2, bad) == MOE_ERR_INVALID, "bad name");
    bad[1].name = "ok";
    bad[1].parts[0].nbytes = 0;
    CHECK(moe_bundle_writer_set_expert_layout(w, 1, 1, 2, bad) == MOE_ERR_INVALID, "zero part");
    bad[1].parts[0].nbytes = 1;
    bad[1].n_parts = 5;
    CHECK(moe_bundle_writer_set_expert_layout(w, 1, 1, 2, bad) == MOE_ERR_INVALID, "5 parts");
    CHECK(moe_bundle_writer_set_expert_layout(w, 0, 1, 1, g_prec) == MOE_ERR_INVALID, "0 layers");
    CHECK(moe_bundle_writer_set_expert_layout(w, 1, 1, 17, g_prec) == MOE_ERR_INVALID, "17 precisions");
    moe_bundle_writer_abort(w);
}

struct par_arg {
    struct moe_bundle_writer *w;
    int tid;
    enum moe_status rc;
};

/* Worker: adds the blobs whose index is tid mod 4. */
static void *par_worker(void *arg) {
    struct par_arg *a = arg;
    for (uint32_t i = (uint32_t)a->tid; i < NL * NE * NP; i += 4) {
        uint32_t l = i / (NE * NP), e = i / NP % NE, p = i % NP;
        size_t n;
        uint8_t *b = make_blob(l, e, p, &n);
        enum moe_status rc = moe_bundle_writer_add_expert(a->w, l, e, p, b, n, 1);
        if (rc != MOE_OK) a->rc = rc;
        free(b);
    }
    return NULL;
}

static void test_parallel_writer(void) {
    const char *path = tpath("par.moeb");
    struct moe_bundle_writer *w = NULL;
    CHECK(moe_bundle_writer_open(path, &w) == MOE_OK, "open");
    moe_bundle_writer_set_expert_layout(w, NL, NE, NP, g_prec);
    pthread_t th[4];
    struct par_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct par_arg){w, i, MOE_OK};
        pthread_create(&th[i], NULL, par_worker, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].rc == MOE_OK, "worker %d", i);
    }
    CHECK(moe_bundle_writer_finish(w) == MOE_OK, "finish parallel: %s", g_err);
    moe_bundle_writer_free(w);
    struct moe_bundle *b = NULL;
    CHECK(moe_bundle_open(path, &b) == MOE_OK && moe_bundle_verify_all(b, NULL, NULL) == MOE_OK,
          "parallel bundle verifies");
    for (uint32_t i = 0; b && i < NL * NE * NP; i++) {
        uint32_t l = i / (NE * NP), e = i / NP % NE, p = i % NP;
        size_t n;
        uint8_t *want = make_blob(l, e, p, &n), *got = malloc(n);
        CHECK(moe_bundle_expert_load(b, l, e, p, got, n) == MOE_OK && memcmp(got, want, n) == 0,
              "parallel blob %u", i);
        free(want);
        free(got);
    }
    moe_bundle_free(b);
}

/* ---- 7. large writes ---------------------------------------------------- */

#define LARGE_NE 2
#define LARGE_NP 2
static struct moe_bundle_precision g_large[LARGE_NP];

/* Blob (e, p) of the large bundle: expert 0 compressible (stored zstd), 1 random. */
static void fill_large(uint8_t *b, uint32_t e, uint32_t p) {
    const size_t n = (size_t)g_large[p].raw_size;
    if (e == 0)
        fill_compressible(b, n, 500 + p);
    else
        fill_random(b, n, 600 + p);
}

struct large_arg {
    struct moe_bundle_writer *w;
    uint32_t e;
    enum moe_status rc;
};

/* Adds expert e at both precisions: precision 0 from a page-aligned buffer,
 * precision 1 from an unaligned one. */
static void *large_worker(void *arg) {
    struct large_arg *a = arg;
    for (uint32_t p = 0; p < LARGE_NP; p++) {
        const size_t n = (size_t)g_large[p].raw_size;
        uint8_t *mem = NULL;
        if (posix_memalign((void **)&mem, 4096, n + 4096) != 0) {
            a->rc = MOE_ERR_NOMEM;
            return NULL;
        }
        uint8_t *b = mem + (p == 0 ? 0 : 1);
        fill_large(b, a->e, p);
        enum moe_status rc = moe_bundle_writer_add_expert(a->w, 0, a->e, p, b, n, a->e == 0 ? 1 : 0);
        if (rc != MOE_OK) a->rc = rc;
        free(mem);
    }
    return NULL;
}

/* Writes the large bundle at path, experts from two threads or in order;
 * MOE_OK or the first error. */
static enum moe_status write_large(const char *path, bool threads) {
    struct moe_bundle_writer *w = NULL;
    enum moe_status rc = moe_bundle_writer_open(path, &w);
    if (rc != MOE_OK) return rc;
    moe_bundle_writer_set_meta_str(w, "k", "v");
    moe_bundle_writer_set_expert_layout(w, 1, LARGE_NE, LARGE_NP, g_large);
    const size_t tn = (2u << 20) + 5;
    uint8_t *t = malloc(tn + 1);
    fill_random(t + 1, tn, 99);
    uint64_t shape[1] = {tn};
    rc = moe_bundle_writer_add_tensor(w, "big.tensor", 0, 1, shape, t + 1, tn);
    free(t);
    pthread_t th[LARGE_NE];
    struct large_arg args[LARGE_NE];
    for (uint32_t e = 0; e < LARGE_NE; e++) {
        args[e] = (struct large_arg){w, e, MOE_OK};
        if (threads)
            pthread_create(&th[e], NULL, large_worker, &args[e]);
        else
            large_worker(&args[e]);
    }
    for (uint32_t e = 0; e < LARGE_NE; e++) {
        if (threads) pthread_join(th[e], NULL);
        if (rc == MOE_OK) rc = args[e].rc;
    }
    if (rc == MOE_OK) rc = moe_bundle_writer_finish(w);
    moe_bundle_writer_free(w);
    return rc;
}

/* Zeros in img from end to the next multiple of 4096. */
static bool zero_to_page(const uint8_t *img, size_t n, uint64_t end) {
    const uint64_t stop = (end + 4095) & ~(uint64_t)4095;
    for (uint64_t i = end; i < stop && i < n; i++)
        if (img[i]) return false;
    return stop <= n;
}

static void test_large_writes(void) {
    memset(g_large, 0, sizeof g_large);
    g_large[0].name = "small";
    g_large[0].n_parts = 3;
    g_large[0].parts[0] = (struct moe_bundle_part){8, 1, 100000, 100000, 0};
    g_large[0].parts[1] = (struct moe_bundle_part){8, 1, 150001, 150001, 0};
    g_large[0].parts[2] = (struct moe_bundle_part){8, 1, 50000, 50000, 0};
    g_large[1].name = "big";
    g_large[1].n_parts = 3;
    g_large[1].parts[0] = (struct moe_bundle_part){8, 1, (3u << 20) + 1, (3u << 20) + 1, 0};
    g_large[1].parts[1] = (struct moe_bundle_part){8, 1, (3u << 20) + 7, (3u << 20) + 7, 0};
    g_large[1].parts[2] = (struct moe_bundle_part){8, 1, (3u << 20) + 11, (3u << 20) + 11, 0};
    moe_bundle_precision_layout(&g_large[0]);
    moe_bundle_precision_layout(&g_large[1]);
    CHECK(g_large[0].raw_size > (256u << 10) && g_large[0].raw_size % 4096 &&
              g_large[1].raw_size > (8u << 20) && g_large[1].raw_size % 4096,
          "large sizes: %llu %llu", (unsigned long long)g_large[0].raw_size,
          (unsigned long long)g_large[1].raw_size);

    const char *path = tpath("large.moeb");
    CHECK(write_large(path, true) == MOE_OK, "write the large bundle: %s", g_err);
    struct moe_bundle *b = NULL;
    size_t n = 0;
    uint8_t *img = slurp(path, &n);
    CHECK(img && moe_bundle_open(path, &b) == MOE_OK && moe_bundle_verify_all(b, NULL, NULL) == MOE_OK,
          "large bundle opens and verifies: %s", g_err);
    for (uint32_t e = 0; b && img && e < LARGE_NE; e++)
        for (uint32_t p = 0; p < LARGE_NP; p++) {
            const size_t rn = (size_t)g_large[p].raw_size;
            uint8_t *want = malloc(rn), *got = malloc(rn);
            fill_large(want, e, p);
            struct moe_bundle_blob bl;
            CHECK(moe_bundle_expert_load(b, 0, e, p, got, rn) == MOE_OK && memcmp(got, want, rn) == 0,
                  "large blob %u/%u reads back", e, p);
            CHECK(moe_bundle_expert(b, 0, e, p, &bl) == MOE_OK &&
                      (e == 0) == (bl.compression == MOE_BUNDLE_COMP_ZSTD) &&
                      zero_to_page(img, n, bl.offset + bl.stored_size),
                  "large blob %u/%u: stored as planned, zeros to the next page", e, p);
            free(want);
            free(got);
        }
    const struct moe_bundle_tensor *t = b ? moe_bundle_find_tensor(b, "big.tensor") : NULL;
    CHECK(t && img && t->size == (2u << 20) + 5 && zero_to_page(img, n, t->offset + t->size), "big tensor");
    moe_bundle_free(b);

    /* in a fixed order: the same bytes with every write buffered */
    const char *serial = tpath("large-serial.moeb"), *buffered = tpath("large-buffered.moeb");
    CHECK(write_large(serial, false) == MOE_OK, "large bundle in order: %s", g_err);
    setenv("MOE_BUNDLE_DIRECT", "0", 1);
    CHECK(write_large(buffered, false) == MOE_OK, "large bundle buffered: %s", g_err);
    unsetenv("MOE_BUNDLE_DIRECT");
    size_t n1 = 0, n2 = 0;
    uint8_t *img1 = slurp(serial, &n1), *img2 = slurp(buffered, &n2);
    CHECK(img1 && img2 && n1 == n2 && memcmp(img1, img2, n1) == 0, "large bundle: same bytes buffered");
    free(img1);
    free(img2);
    free(img);
}

/* KV sets on their own. */
static void test_kv(void) {
    struct moe_bundle_kv *kv = NULL;
    CHECK(moe_bundle_kv_new(&kv) == MOE_OK, "kv_new");
    CHECK(moe_bundle_kv_set_str(kv, "b", "x") == MOE_OK && moe_bundle_kv_set_i64(kv, "a", 1) == MOE_OK &&
              moe_bundle_kv_set_bool(kv, "c", true) == MOE_OK,
          "kv sets");
    struct moe_bundle_kv_item it;
    CHECK(moe_bundle_kv_count(kv) == 3 && moe_bundle_kv_at(kv, 0, &it) == MOE_OK &&
              strcmp(it.key, "a") == 0,
          "kv sorted");
    CHECK(moe_bundle_kv_remove(kv, "b") == MOE_OK && moe_bundle_kv_remove(kv, "b") == MOE_ERR_NOT_FOUND &&
              moe_bundle_kv_count(kv) == 2,
          "kv remove");
    CHECK(moe_bundle_kv_set_str(kv, "a", "now a string") == MOE_OK &&
              strcmp(moe_bundle_kv_str(kv, "a"), "now a string") == 0,
          "kv replace changes type");
    CHECK(moe_bundle_kv_set_str(kv, NULL, "x") == MOE_ERR_INVALID, "NULL key");
    CHECK(moe_bundle_kv_count(NULL) == 0 && moe_bundle_kv_str(NULL, "a") == NULL, "NULL kv");
    moe_bundle_kv_free(kv);
}

/* ------------------------------------------------------------------------- */
/* 5. malformed headers and directories                                       */

/* File offsets of the parts of the small image, found by walking the spec. */
struct dmap {
    size_t dir, dir_size, meta, tens, exp, prec[2], entries;
    size_t meta_entry[8], tensor[4];
    int n_meta, n_tensors;
    uint32_t E, P;
};

/* Walks the directory of img (docs/format.md) and records where things are. */
static void map_directory(const uint8_t *img, struct dmap *m) {
    memset(m, 0, sizeof *m);
    m->dir = (size_t)get64(img + 32);
    m->dir_size = (size_t)get64(img + 40);
    const uint8_t *d = img + m->dir;
    uint64_t ms = get64(d + 8), ts = get64(d + 16);
    m->meta = m->dir + 32;
    m->tens = m->meta + (size_t)ms;
    m->exp = m->tens + (size_t)ts;
    size_t at = m->meta + 8;
    m->n_meta = (int)get64(img + m->meta);
    for (int i = 0; i < m->n_meta && i < 8; i++) {
        m->meta_entry[i] = at;
        at += 16 + get32(img + at) + (size_t)get64(img + at + 8);
    }
    at = m->tens + 8;
    m->n_tensors = (int)get64(img + m->tens);
    for (int i = 0; i < m->n_tensors && i < 4; i++) {
        m->tensor[i] = at;
        at += 72 + get32(img + at);
    }
    m->E = get32(img + m->exp + 4);
    m->P = get32(img + m->exp + 8);
    at = m->exp + 16;
    for (uint32_t i = 0; i < m->P && i < 2; i++) {
        m->prec[i] = at;
        at += 8 + 32 * (size_t)get32(img + at + 4) + get32(img + at);
    }
    m->entries = at;
}

/* Offset of the expert entry (l, e, p). */
static size_t entry_at(const struct dmap *m, uint32_t l, uint32_t e, uint32_t p) {
    return m->entries + (((size_t)l * m->E + e) * m->P + p) * 48;
}

/* Writes the small bundle used by the malformed table and the fuzz seeds. */
static enum moe_status write_small(const char *path, bool with_experts, bool with_tensors,
                                   int zstd_level) {
    struct moe_bundle_writer *w = NULL;
    enum moe_status rc = moe_bundle_writer_open(path, &w);
    if (rc != MOE_OK) return rc;
    const char *arr[] = {"x", "yz"};
    rc |= moe_bundle_writer_set_meta_str(w, "a.str", "hello");
    rc |= moe_bundle_writer_set_meta_i64(w, "b.i64", 42);
    rc |= moe_bundle_writer_set_meta_bool(w, "c.bool", true);
    rc |= moe_bundle_writer_set_meta_str_array(w, "d.strs", arr, 2);
    rc |= moe_bundle_writer_set_meta_f64(w, "e.f64", 0.5);
    if (with_tensors) {
        uint8_t d0[32], d1[24];
        fill_random(d0, sizeof d0, 1);
        fill_random(d1, sizeof d1, 2);
        rc |= moe_bundle_writer_add_tensor(w, "t0", 0, 1, (uint64_t[]){8}, d0, sizeof d0);
        rc |= moe_bundle_writer_add_tensor(w, "t1", 1, 2, (uint64_t[]){2, 3}, d1, sizeof d1);
    }
    if (with_experts) {
        struct moe_bundle_precision p[2];
        memset(p, 0, sizeof p);
        p[0].name = "p0";
        p[0].n_parts = 1;
        p[0].parts[0].nbytes = 100;
        p[1].name = "p1";
        p[1].n_parts = 2;
        p[1].parts[0].nbytes = 10;
        p[1].parts[1].nbytes = 20;
        rc |= moe_bundle_writer_set_expert_layout(w, 2, 2, 2, p);
        rc |= moe_bundle_writer_set_layer_has_experts(w, 1, false);
        uint8_t raw[100];
        for (uint32_t e = 0; e < 2; e++) {
            fill_compressible(raw, sizeof raw, e);
            rc |= moe_bundle_writer_add_expert(w, 0, e, 0, raw, 100, zstd_level);
            rc |= moe_bundle_writer_add_expert(w, 0, e, 1, raw, 84, zstd_level);
        }
    }
    struct moe_bundle_kv *t = NULL;
    moe_bundle_kv_new(&t);
    moe_bundle_kv_set_i64(t, "x", 1);
    rc |= moe_bundle_writer_set_tuning(w, t);
    moe_bundle_kv_free(t);
    if (rc == MOE_OK) rc = moe_bundle_writer_finish(w);
    moe_bundle_writer_free(w);
    return rc;
}

typedef void (*mutate_fn)(uint8_t *img, size_t *len, const struct dmap *m);

/* header */
static void m_magic(uint8_t *img, size_t *len, const struct dmap *m) { img[0] = 'X'; }
static void m_blank(uint8_t *img, size_t *len, const struct dmap *m) { memset(img, 0, 4096); }
static void m_future(uint8_t *img, size_t *len, const struct dmap *m) { img[8] = 2; }
static void m_version0(uint8_t *img, size_t *len, const struct dmap *m) { img[8] = 0; }
static void m_flags(uint8_t *img, size_t *len, const struct dmap *m) { put32(img + 12, 4); }
static void m_align(uint8_t *img, size_t *len, const struct dmap *m) { put64(img + 16, 8192); }
static void m_data_off(uint8_t *img, size_t *len, const struct dmap *m) { put64(img + 24, 0); }
static void m_dir_past(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + 32, ((*len >> 12) + 1) << 12);
}
static void m_dir_huge(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + 32, UINT64_MAX - 4095);
}
static void m_dir_misaligned(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + 32, m->dir + 8);
}
static void m_dir_zero(uint8_t *img, size_t *len, const struct dmap *m) { put64(img + 32, 0); }
static void m_dir_size_big(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + 40, UINT64_MAX);
}
static void m_dir_size_small(uint8_t *img, size_t *len, const struct dmap *m) { put64(img + 40, 31); }
static void m_dir_size_past(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + 40, *len - m->dir + 1u);
}
static void m_dir_checksum(uint8_t *img, size_t *len, const struct dmap *m) {
    img[m->dir + m->dir_size - 1] ^= 1;
}
/* directory */
static void m_dir_magic(uint8_t *img, size_t *len, const struct dmap *m) { img[m->dir] = 'x'; }
static void m_sections(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->dir + 8, get64(img + m->dir + 8) + 1);
}
static void m_sections_ovf(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->dir + 16, UINT64_MAX - 10);
}
static void m_meta_count(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->meta, 1ull << 60);
}
static void m_meta_type(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->meta_entry[0] + 4, 9);
}
static void m_meta_keylen0(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->meta_entry[0], 0);
}
static void m_meta_keylen_big(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->meta_entry[0], 300);
}
static void m_meta_vlen(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->meta_entry[0] + 8, UINT64_MAX - 3);
}
static void m_meta_order(uint8_t *img, size_t *len, const struct dmap *m) {
    img[m->meta_entry[1] + 16] = 'a'; /* "b.i64" -> "a.i64" sorts before "a.str" */
}
static void m_meta_dup(uint8_t *img, size_t *len, const struct dmap *m) {
    /* "b.i64" -> "a.str" would change the length; make entry 2 "c.bool" -> "b.bool"? no: keep
     * length 5 by turning "b.i64" into "a.str" */
    memcpy(img + m->meta_entry[1] + 16, "a.str", 5);
}
static void m_meta_bool(uint8_t *img, size_t *len, const struct dmap *m) {
    img[m->meta_entry[2] + 16 + 6] = 2; /* "c.bool" value */
}
static void m_meta_nul(uint8_t *img, size_t *len, const struct dmap *m) {
    img[m->meta_entry[0] + 16 + 5 + 2] = 0; /* "hello" -> "he\0lo" */
}
static void m_meta_utf8(uint8_t *img, size_t *len, const struct dmap *m) {
    img[m->meta_entry[0] + 16 + 5 + 1] = 0xC0;
}
static void m_meta_key_ctrl(uint8_t *img, size_t *len, const struct dmap *m) {
    img[m->meta_entry[0] + 16 + 1] = '\n';
}
static void m_meta_strs_count(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->meta_entry[3] + 16 + 6, 1ull << 61); /* "d.strs" count */
}
static void m_meta_i64_len(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->meta_entry[1] + 8, 4); /* then trailing bytes break the next entry */
}
static void m_tensor_count(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->tens, 1ull << 59);
}
static void m_tensor_misaligned(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->tensor[0] + 48, get64(img + m->tensor[0] + 48) + 64);
}
static void m_tensor_past(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->tensor[0] + 48, m->dir);
}
static void m_tensor_size_ovf(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->tensor[0] + 56, UINT64_MAX - 100);
}
static void m_tensor_before_data(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->tensor[0] + 48, 0);
}
static void m_tensor_ndims(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->tensor[0] + 8, 5);
}
static void m_tensor_dim_ovf(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->tensor[1] + 16, 1ull << 40);
    put64(img + m->tensor[1] + 24, 1ull << 40);
}
static void m_tensor_unused_dim(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->tensor[0] + 40, 7);
}
static void m_tensor_reserved(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->tensor[0] + 12, 1);
}
static void m_tensor_name_nul(uint8_t *img, size_t *len, const struct dmap *m) {
    img[m->tensor[0] + 72 + 1] = 0;
}
static void m_tensor_name_len(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->tensor[0], 2000);
}
static void m_tensor_dup(uint8_t *img, size_t *len, const struct dmap *m) {
    img[m->tensor[1] + 72 + 1] = '0'; /* "t1" -> "t0" */
}
static void m_tensor_overlap(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->tensor[1] + 48, get64(img + m->tensor[0] + 48));
}
static void m_blob_overlap(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + entry_at(m, 0, 1, 0), get64(img + m->tensor[1] + 48));
}
static void m_exp_counts(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->exp, 1u << 31);
}
static void m_exp_mixed_zero(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->exp + 4, 0);
}
static void m_exp_product(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->exp, 1u << 20);
    put32(img + m->exp + 4, 1u << 20);
}
static void m_exp_precisions(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->exp + 8, 17);
}
static void m_prec_name(uint8_t *img, size_t *len, const struct dmap *m) {
    img[m->prec[0] + 8 + 32] = ' ';
}
static void m_prec_dup(uint8_t *img, size_t *len, const struct dmap *m) {
    img[m->prec[1] + 8 + 64 + 1] = '0'; /* "p1" -> "p0" */
}
static void m_prec_parts0(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->prec[0] + 4, 0);
}
static void m_prec_parts5(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + m->prec[0] + 4, 5);
}
static void m_prec_nbytes0(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->prec[0] + 8 + 24, 0);
}
static void m_prec_nbytes_ovf(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->prec[1] + 8 + 24, 1ull << 63);
    put64(img + m->prec[1] + 8 + 32 + 24, 1ull << 63);
}
static void m_entry_absent(uint8_t *img, size_t *len, const struct dmap *m) {
    memset(img + entry_at(m, 0, 1, 1), 0, 48);
}
static void m_entry_absent_dirty(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + entry_at(m, 1, 0, 0) + 24, 5);
}
static void m_entry_compression(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + entry_at(m, 0, 0, 0) + 40, 7);
}
static void m_entry_flags(uint8_t *img, size_t *len, const struct dmap *m) {
    put32(img + entry_at(m, 0, 0, 0) + 44, 3);
}
static void m_entry_raw(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + entry_at(m, 0, 0, 0) + 16, 99);
}
static void m_entry_stored(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + entry_at(m, 0, 0, 0) + 8, 50); /* uncompressed: must equal raw */
}
static void m_entry_stored_checksum(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + entry_at(m, 0, 0, 0) + 32, get64(img + entry_at(m, 0, 0, 0) + 32) + 1);
}
static void m_entry_misaligned(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + entry_at(m, 0, 0, 0), get64(img + entry_at(m, 0, 0, 0)) + 512);
}
static void m_entry_past(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + entry_at(m, 0, 0, 0), 1ull << 40);
}
static void m_entry_trailing(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + m->dir + 24, get64(img + m->dir + 24) - 48); /* sections no longer add up */
}
static void m_slots_past(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + 512 + 16, 1ull << 40);
    reseal_slot(img, 0);
}
static void m_slot_misaligned(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + 512 + 16, get64(img + 512 + 16) + 8);
    reseal_slot(img, 0);
}
static void m_slot_inside_dir(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + 512 + 16, m->dir);
    reseal_slot(img, 0);
}
static void m_slot_empty_offset(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + 512 + 24, 0);
    reseal_slot(img, 0);
}
static void m_slot_huge(uint8_t *img, size_t *len, const struct dmap *m) {
    put64(img + 512 + 24, 1ull << 40);
    reseal_slot(img, 0);
}
static void m_slot_payload_garbage(uint8_t *img, size_t *len, const struct dmap *m) {
    uint64_t off = get64(img + 512 + 16), n = get64(img + 512 + 24);
    put64(img + off, 1000); /* entry count */
    put64(img + 512 + 32, XXH3_64bits(img + off, (size_t)n));
    reseal_slot(img, 0);
}
static void m_minor(uint8_t *img, size_t *len, const struct dmap *m) { img[10] = 7; }
static void m_reserved_hdr(uint8_t *img, size_t *len, const struct dmap *m) { img[60] = 1; }

struct bad_case {
    const char *name;
    mutate_fn fn;
    bool reseal;
    enum moe_status rc;
    const char *msg; /* substring of the error */
};

static const struct bad_case g_bad[] = {
    {"bad magic", m_magic, false, MOE_ERR_FORMAT, "not a bundle (bad magic"},
    {"blank header page", m_blank, false, MOE_ERR_FORMAT, "header page is blank"},
    {"future major version", m_future, false, MOE_ERR_UNSUPPORTED, "written by a newer version of the bundle format (v2.0)"},
    {"version 0", m_version0, false, MOE_ERR_FORMAT, "is not a bundle version"},
    {"header checksum", m_align, false, MOE_ERR_FORMAT, "header checksum mismatch"},
    {"unknown flags", m_flags, true, MOE_ERR_UNSUPPORTED, "flags 0x4"},
    {"alignment", m_align, true, MOE_ERR_FORMAT, "both must be 4096"},
    {"data offset", m_data_off, true, MOE_ERR_FORMAT, "both must be 4096"},
    {"directory past EOF", m_dir_past, true, MOE_ERR_FORMAT, "runs past the end of the file"},
    {"directory offset overflow", m_dir_huge, true, MOE_ERR_FORMAT, "runs past the end of the file"},
    {"directory misaligned", m_dir_misaligned, true, MOE_ERR_FORMAT, "is not a multiple of 4096"},
    {"directory in header page", m_dir_zero, true, MOE_ERR_FORMAT, "is not a multiple of 4096"},
    {"directory size huge", m_dir_size_big, true, MOE_ERR_FORMAT, "directory size"},
    {"directory size tiny", m_dir_size_small, true, MOE_ERR_FORMAT, "directory size 31"},
    {"directory size past EOF", m_dir_size_past, true, MOE_ERR_FORMAT, "runs past the end"},
    {"directory checksum", m_dir_checksum, false, MOE_ERR_FORMAT, "directory checksum mismatch"},
    {"directory magic", m_dir_magic, true, MOE_ERR_FORMAT, "bad magic"},
    {"section sizes", m_sections, true, MOE_ERR_FORMAT, "do not add up"},
    {"section size overflow", m_sections_ovf, true, MOE_ERR_FORMAT, "do not add up"},
    {"metadata count huge", m_meta_count, true, MOE_ERR_FORMAT, "metadata: entry count 1152921504606846976 cannot fit"},
    {"metadata unknown type", m_meta_type, true, MOE_ERR_FORMAT, "unknown value type 9"},
    {"metadata key length 0", m_meta_keylen0, true, MOE_ERR_FORMAT, "key length 0"},
    {"metadata key length 300", m_meta_keylen_big, true, MOE_ERR_FORMAT, "key length 300"},
    {"metadata value length huge", m_meta_vlen, true, MOE_ERR_FORMAT, "value of 18446744073709551612 bytes runs past the section"},
    {"metadata keys out of order", m_meta_order, true, MOE_ERR_FORMAT, "is not after key"},
    {"metadata duplicate key", m_meta_dup, true, MOE_ERR_FORMAT, "is a duplicate of key a.str"},
    {"metadata bool 2", m_meta_bool, true, MOE_ERR_FORMAT, "bool value"},
    {"metadata NUL in string", m_meta_nul, true, MOE_ERR_FORMAT, "contains a NUL"},
    {"metadata bad UTF-8", m_meta_utf8, true, MOE_ERR_FORMAT, "not UTF-8"},
    {"metadata control char in key", m_meta_key_ctrl, true, MOE_ERR_FORMAT, "key is not UTF-8 without control"},
    {"metadata string array count huge", m_meta_strs_count, true, MOE_ERR_FORMAT, "count does not fit"},
    {"metadata i64 length 4", m_meta_i64_len, true, MOE_ERR_FORMAT, "metadata"},
    {"tensor count huge", m_tensor_count, true, MOE_ERR_FORMAT, "tensor count 576460752303423488 cannot fit"},
    {"tensor misaligned", m_tensor_misaligned, true, MOE_ERR_FORMAT, "tensor t0: data"},
    {"tensor past data region", m_tensor_past, true, MOE_ERR_FORMAT, "4096-aligned range inside the data region"},
    {"tensor size overflow", m_tensor_size_ovf, true, MOE_ERR_FORMAT, "tensor t0: data"},
    {"tensor in header page", m_tensor_before_data, true, MOE_ERR_FORMAT, "tensor t0: data"},
    {"tensor 5 dims", m_tensor_ndims, true, MOE_ERR_FORMAT, "n_dims is larger than 4"},
    {"tensor dims overflow", m_tensor_dim_ovf, true, MOE_ERR_FORMAT, "overflows"},
    {"tensor unused dim", m_tensor_unused_dim, true, MOE_ERR_FORMAT, "beyond n_dims"},
    {"tensor reserved", m_tensor_reserved, true, MOE_ERR_FORMAT, "reserved field"},
    {"tensor name NUL", m_tensor_name_nul, true, MOE_ERR_FORMAT, "name is not UTF-8 without NUL"},
    {"tensor name length", m_tensor_name_len, true, MOE_ERR_FORMAT, "name length 2000"},
    {"tensor duplicate", m_tensor_dup, true, MOE_ERR_FORMAT, "duplicate tensor name t0"},
    {"tensors overlap", m_tensor_overlap, true, MOE_ERR_FORMAT, "overlaps tensor"},
    {"blob overlaps tensor", m_blob_overlap, true, MOE_ERR_FORMAT, "overlaps"},
    {"expert counts huge", m_exp_counts, true, MOE_ERR_FORMAT, "2147483648 layers"},
    {"expert counts mixed zero", m_exp_mixed_zero, true, MOE_ERR_FORMAT, "all zero or all non-zero"},
    {"expert product too big", m_exp_product, true, MOE_ERR_FORMAT, "entries need"},
    {"17 precisions", m_exp_precisions, true, MOE_ERR_FORMAT, "17 precisions"},
    {"precision name", m_prec_name, true, MOE_ERR_FORMAT, "name is not 1..63 bytes"},
    {"precision duplicate", m_prec_dup, true, MOE_ERR_FORMAT, "duplicate precision name p0"},
    {"precision 0 parts", m_prec_parts0, true, MOE_ERR_FORMAT, "part count 0"},
    {"precision 5 parts", m_prec_parts5, true, MOE_ERR_FORMAT, "part count 5"},
    {"precision zero-byte part", m_prec_nbytes0, true, MOE_ERR_FORMAT, "a part has 0 bytes"},
    {"precision size overflow", m_prec_nbytes_ovf, true, MOE_ERR_FORMAT, "part sizes overflow"},
    {"expert missing in MoE layer", m_entry_absent, true, MOE_ERR_FORMAT, "layer 0 expert 1 precision p1 is absent but layer 0 has 3 of 4 blobs"},
    {"absent entry not zero", m_entry_absent_dirty, true, MOE_ERR_FORMAT, "layer 1 expert 0 precision p0"},
    {"unknown compression", m_entry_compression, true, MOE_ERR_FORMAT, "unknown compression"},
    {"unknown entry flags", m_entry_flags, true, MOE_ERR_FORMAT, "unknown entry flags"},
    {"raw size", m_entry_raw, true, MOE_ERR_FORMAT, "raw size differs"},
    {"stored size", m_entry_stored, true, MOE_ERR_FORMAT, "stored size differs"},
    {"uncompressed stored checksum", m_entry_stored_checksum, true, MOE_ERR_FORMAT, "stored checksum differs from raw checksum"},
    {"blob misaligned", m_entry_misaligned, true, MOE_ERR_FORMAT, "layer 0 expert 0 precision p0"},
    {"blob past data region", m_entry_past, true, MOE_ERR_FORMAT, "inside the data region"},
    {"expert table short", m_entry_trailing, true, MOE_ERR_FORMAT, "do not add up"},
    {"tuning payload past EOF", m_slots_past, false, MOE_ERR_FORMAT, "no usable tuning slot (slot A: payload runs past the end of the file; slot B: empty)"},
    {"tuning payload misaligned", m_slot_misaligned, false, MOE_ERR_FORMAT, "not a 4096 boundary"},
    {"tuning payload inside directory", m_slot_inside_dir, false, MOE_ERR_FORMAT, "not a 4096 boundary after the directory"},
    {"tuning empty with offset", m_slot_empty_offset, false, MOE_ERR_FORMAT, "must have offset 0"},
    {"tuning payload huge", m_slot_huge, false, MOE_ERR_FORMAT, "larger than 256 MiB"},
    {"tuning payload undecodable", m_slot_payload_garbage, false, MOE_ERR_FORMAT, "tuning payload (slot A): entry count 1000"},
};

static void test_malformed(void) {
    const char *path = tpath("small.moeb");
    CHECK(write_small(path, true, true, 0) == MOE_OK, "write small: %s", g_err);
    size_t n;
    uint8_t *img = slurp(path, &n);
    if (!img) return;
    struct dmap m;
    map_directory(img, &m);
    CHECK(m.n_meta == 5 && m.n_tensors == 2 && m.E == 2 && m.P == 2, "small map");
    /* sanity: the image opens, and so do the accepted variations */
    struct moe_bundle *b = NULL;
    CHECK(moe_bundle_open_memory(img, n, "small", &b) == MOE_OK, "small opens: %s", g_err);
    moe_bundle_free(b);
    mutate_fn accepted[] = {m_minor, m_reserved_hdr};
    for (int i = 0; i < 2; i++) {
        uint8_t *c = malloc(n);
        memcpy(c, img, n);
        size_t len = n;
        accepted[i](c, &len, &m);
        reseal(c, len);
        b = NULL;
        CHECK(moe_bundle_open_memory(c, len, "ok", &b) == MOE_OK, "accepted variation %d: %s", i, g_err);
        moe_bundle_free(b);
        free(c);
    }
    for (size_t i = 0; i < sizeof g_bad / sizeof *g_bad; i++) {
        const struct bad_case *t = &g_bad[i];
        uint8_t *c = malloc(n);
        memcpy(c, img, n);
        size_t len = n;
        t->fn(c, &len, &m);
        if (t->reseal) reseal(c, len);
        b = NULL;
        log_reset();
        enum moe_status rc = moe_bundle_open_memory(c, len, "bad", &b);
        CHECK(rc == t->rc && !b && g_n_err >= 1 && strstr(g_err, "bad: ") && strstr(g_err, t->msg),
              "%s: rc %d (want %d), message: %s", t->name, rc, t->rc, g_err);
        moe_bundle_free(b);
        free(c);
    }
    free(img);
}

/* ------------------------------------------------------------------------- */

/* Removes one entry of the test directory (nftw callback). */
static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

/* Writes the fuzz seeds into dir. */
static int write_seeds(const char *dir) {
    char p[600];
    struct {
        const char *name;
        bool experts, tensors;
        int level;
    } s[] = {{"meta-only.moeb", false, false, 0},
             {"tensors.moeb", false, true, 0},
             {"experts-raw.moeb", true, false, 0},
             {"experts-zstd.moeb", true, false, 19}};
    for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, s[i].name);
        if (write_small(p, s[i].experts, s[i].tensors, s[i].level) != MOE_OK) return 1;
    }
    /* one with both tuning slots in use */
    snprintf(p, sizeof p, "%s/two-slots.moeb", dir);
    if (write_small(p, false, false, 0) != MOE_OK) return 1;
    struct moe_bundle_kv *kv = make_tuning(2);
    enum moe_status rc = moe_bundle_replace_tuning(p, kv);
    moe_bundle_kv_free(kv);
    return rc != MOE_OK;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return write_seeds(argv[2]);
    moe_log_set(capture, NULL);
    moe_log_set_level(MOE_LOG_DEBUG);
    snprintf(g_dir, sizeof g_dir, "%s/test-bundle-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    init_precisions();
    test_kv();
    test_round_trip();
    test_minimal();
    test_flipped_blobs();
    test_truncation();
    test_tuning();
    test_writer();
    test_parallel_writer();
    test_malformed();
    test_open_fd();
    test_large_writes();
    nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    moe_log_set(NULL, NULL);
    printf("test-bundle: %s (%d failure%s)\n", fails ? "FAILED" : "ok", fails, fails == 1 ? "" : "s");
    return fails != 0;
}

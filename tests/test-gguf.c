/*
 * test-gguf.c - the GGUF reader (formats/gguf.c) and the GGUF -> model
 * translation (runtime/model/gguf-model.c, gguf-vocab.c) on files built in memory:
 *   - a valid v3 file with metadata of every type, custom alignment and gaps
 *     between tensors reads back exactly (accessors, dims, offsets, alignment);
 *     v2 and tensor-less files are accepted, and so is the same file on disk;
 *   - every truncation of a valid file, and a table of malformed files (huge
 *     counts and lengths, bad strings, unknown and nested types, bad
 *     alignment, bad dims and types, misaligned, out-of-range, overflowing,
 *     overlapping and duplicate tensors), is refused with the right status;
 *   - a synthetic Mixtral GGUF loads; its q/k rows come back in transformers'
 *     order; metadata errors (architecture, missing keys, wrong types) are
 *     refused; Phi-MoE's longrope factors and DeepSeek's YaRN keys become
 *     the config transformers would read;
 *   - a SentencePiece vocabulary merges equal scores leftmost first, as
 *     llama.cpp does; bad vocabularies are refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe-gguf-model.h"
#include "moe-gguf.h"
#include "moe-model.h"
#include "moe-test-gguf.h"
#include "moe-test.h"
#include "moe-tokenizer.h"

static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

/* ---- a valid file ------------------------------------------------------ */

/* valid_file: metadata of every type, three tensors (f32, q8_0, q4_k) at
 * alignment 64 with a gap, in non-offset order. */
static size_t valid_file(struct tg *b, uint32_t version) {
    tg_begin(b, version);
    b->align = 64;
    tg_kv_u32(b, "general.alignment", 64);
    tg_kv_str(b, "general.architecture", "test");
    tg_key(b, "k.u8", 0), tg_u8(b, 200);
    tg_key(b, "k.i8", 1), tg_u8(b, 0xFE); /* -2 */
    tg_key(b, "k.u16", 2), tg_u8(b, 0x34), tg_u8(b, 0x12);
    tg_key(b, "k.i16", 3), tg_u8(b, 0xFF), tg_u8(b, 0xFF); /* -1 */
    tg_kv_i32(b, "k.i32", -123456);
    tg_kv_f32(b, "k.f32", 0.25f);
    tg_kv_bool(b, "k.bool", 1);
    tg_kv_u64(b, "k.u64big", 0xF000000000000000ull);
    tg_key(b, "k.i64", 11), tg_u64(b, (uint64_t)-5);
    tg_kv_f64(b, "k.f64", -1.5);
    tg_kv_str(b, "k.utf8", "h\xc3\xa9llo"); /* values need not be ASCII */
    const char *strs[3] = {"a", "", "b c"};
    tg_kv_strs(b, "k.strs", strs, 3);
    const int32_t ints[4] = {1, -2, 3, -4};
    tg_kv_i32s(b, "k.ints", ints, 4);
    tg_kv_arr(b, "k.empty", 6, 0);
    const int64_t n1[1] = {8}, n2[2] = {64, 2}, n3[2] = {256, 3};
    tg_tensor(b, "q4k", 2, n3, MOE_QTYPE_Q4_K, 3 * 144, 256, 0x11); /* placed after the others */
    tg_tensor(b, "vec", 1, n1, 0, 32, 0, 0);                          /* offset 0: floats 1.0 */
    tg_tensor(b, "q8", 2, n2, MOE_QTYPE_Q8_0, 2 * 2 * 34, 64, 0x22); /* a gap of 32 before it */
    return tg_finish(b);
}

static void test_valid(void) {
    struct tg b;
    size_t n = valid_file(&b, 3);
    struct moe_gguf *g = NULL;
    CHECK(moe_gguf_open_memory(b.p, n, "valid", &g) == MOE_OK, "valid file refused");
    if (!g) {
        free(b.p);
        return;
    }
    CHECK(moe_gguf_version(g) == 3 && moe_gguf_alignment(g) == 64, "version %u alignment %u", moe_gguf_version(g),
          moe_gguf_alignment(g));
    CHECK(moe_gguf_n_kv(g) == 16 && moe_gguf_n_tensors(g) == 3, "counts %zu %zu", moe_gguf_n_kv(g), moe_gguf_n_tensors(g));
    CHECK(moe_gguf_data_offset(g) % 64 == 0, "data offset %llu not aligned", (unsigned long long)moe_gguf_data_offset(g));
    int64_t x;
    double f;
    struct moe_gguf_str s;
    const struct moe_gguf_kv *kv;
    CHECK(moe_gguf_kv_int(moe_gguf_find_kv(g, "k.u8"), 0, &x) && x == 200, "u8");
    CHECK(moe_gguf_kv_int(moe_gguf_find_kv(g, "k.i8"), 0, &x) && x == -2, "i8");
    CHECK(moe_gguf_kv_int(moe_gguf_find_kv(g, "k.u16"), 0, &x) && x == 0x1234, "u16");
    CHECK(moe_gguf_kv_int(moe_gguf_find_kv(g, "k.i16"), 0, &x) && x == -1, "i16");
    CHECK(moe_gguf_kv_int(moe_gguf_find_kv(g, "k.i32"), 0, &x) && x == -123456, "i32");
    CHECK(moe_gguf_kv_int(moe_gguf_find_kv(g, "k.i64"), 0, &x) && x == -5, "i64");
    CHECK(!moe_gguf_kv_int(moe_gguf_find_kv(g, "k.u64big"), 0, &x), "u64 above INT64_MAX read as an int64");
    CHECK(moe_gguf_kv_float(moe_gguf_find_kv(g, "k.f32"), 0, &f) && f == 0.25, "f32");
    CHECK(moe_gguf_kv_float(moe_gguf_find_kv(g, "k.f64"), 0, &f) && f == -1.5, "f64");
    CHECK(moe_gguf_kv_float(moe_gguf_find_kv(g, "k.i32"), 0, &f) && f == -123456, "int as float");
    CHECK(moe_gguf_kv_int(moe_gguf_find_kv(g, "k.bool"), 0, &x) && x == 1, "bool");
    CHECK(!moe_gguf_kv_float(moe_gguf_find_kv(g, "k.bool"), 0, &f), "bool read as a float");
    CHECK(!moe_gguf_kv_str(moe_gguf_find_kv(g, "k.i32"), 0, &s), "int read as a string");
    CHECK(moe_gguf_kv_str(moe_gguf_find_kv(g, "k.utf8"), 0, &s) && s.n == 6 && !memcmp(s.p, "h\xc3\xa9llo", 6), "str");
    kv = moe_gguf_find_kv(g, "k.strs");
    CHECK(kv && kv->type == MOE_GGUF_ARRAY && kv->elem == MOE_GGUF_STRING && kv->n == 3, "string array");
    CHECK(kv && moe_gguf_kv_str(kv, 1, &s) && s.n == 0 && moe_gguf_kv_str(kv, 2, &s) && s.n == 3 &&
              !memcmp(s.p, "b c", 3) && !moe_gguf_kv_str(kv, 3, &s),
          "string array elements");
    kv = moe_gguf_find_kv(g, "k.ints");
    CHECK(kv && kv->n == 4 && moe_gguf_kv_int(kv, 3, &x) && x == -4 && !moe_gguf_kv_int(kv, 4, &x), "int array");
    kv = moe_gguf_find_kv(g, "k.empty");
    CHECK(kv && kv->type == MOE_GGUF_ARRAY && kv->n == 0 && !moe_gguf_kv_float(kv, 0, &f), "empty array");
    CHECK(!moe_gguf_find_kv(g, "k.none") && !moe_gguf_find_tensor(g, "none"), "absent items found");
    CHECK(!strcmp(moe_gguf_kv_at(g, 1)->key, "general.architecture"), "file order of keys");
    const struct moe_gguf_tensor *t = moe_gguf_find_tensor(g, "q8");
    const uint8_t *data0 = b.p + moe_gguf_data_offset(g);
    CHECK(t && t->type == MOE_QTYPE_Q8_0 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 2 && t->ne[2] == 1 &&
              t->nbytes == 136 && t->offset == 64 && (const uint8_t *)t->data == data0 + 64 &&
              ((const uint8_t *)t->data)[0] == 0x22,
          "q8 tensor");
    t = moe_gguf_find_tensor(g, "q4k");
    CHECK(t && t->type == MOE_QTYPE_Q4_K && t->nbytes == 432 && (const uint8_t *)t->data == data0 + 256, "q4k tensor");
    t = moe_gguf_tensor_at(g, 1);
    float v;
    memcpy(&v, t->data, 4);
    CHECK(!strcmp(t->name, "vec") && t->ne[0] == 8 && v == 1.0f, "vec tensor (file order, data)");
    CHECK(!moe_gguf_tensor_at(g, 3) && !moe_gguf_kv_at(g, 16), "out-of-range index");
    moe_gguf_free(g);

    /* the same file from disk, and the magic sniffer */
    char path[] = "/tmp/test-gguf-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, b.p, n) == (ssize_t)n, "temp file");
    close(fd);
    CHECK(moe_gguf_is_gguf_file(path) && !moe_gguf_is_gguf_file("/tmp") && !moe_gguf_is_gguf_file("/nonexistent"),
          "is_gguf_file");
    CHECK(moe_gguf_open(path, &g) == MOE_OK && moe_gguf_n_tensors(g) == 3 && !strcmp(moe_gguf_path(g), path),
          "open from disk");
    moe_gguf_free(g);
    unlink(path);
    moe_log_set(quiet, NULL);
    CHECK(moe_gguf_open("/nonexistent/x.gguf", &g) != MOE_OK && !g, "missing file");
    moe_log_set(NULL, NULL);
    free(b.p);

    n = valid_file(&b, 2);
    CHECK(moe_gguf_open_memory(b.p, n, "v2", &g) == MOE_OK && moe_gguf_version(g) == 2, "v2 refused");
    moe_gguf_free(g);
    free(b.p);
    tg_begin(&b, 3);
    tg_kv_str(&b, "general.architecture", "x");
    n = tg_finish(&b);
    CHECK(moe_gguf_open_memory(b.p, n, "no tensors", &g) == MOE_OK && moe_gguf_n_tensors(g) == 0, "no tensors");
    moe_gguf_free(g);
    free(b.p);
    printf("  valid files: every value type, alignment 64 with gaps, v2, no tensors, from disk\n");
}

/* Every prefix of a valid file is refused (the builder leaves no trailing
 * padding, so the last tensor ends at the end of the file). */
static void test_truncations(void) {
    struct tg b;
    size_t n = valid_file(&b, 3), bad = 0;
    moe_log_set(quiet, NULL);
    for (size_t k = 0; k < n; k++) {
        struct moe_gguf *g = NULL;
        uint8_t *copy = malloc(k ? k : 1); /* a buffer of exactly k bytes, so ASan sees overreads */
        memcpy(copy, b.p, k);
        enum moe_status st = moe_gguf_open_memory(copy, k, "cut", &g);
        bad += st != MOE_ERR_FORMAT || g != NULL;
        moe_gguf_free(g);
        free(copy);
    }
    moe_log_set(NULL, NULL);
    CHECK(bad == 0, "%zu truncations were not refused as MOE_ERR_FORMAT", bad);
    printf("  %zu truncations refused\n", n);
    free(b.p);
}

/* ---- the must-reject table -------------------------------------------- */

static void one_tensor(struct tg *b, uint32_t type, int64_t ne0) {
    tg_begin(b, 3);
    const int64_t ne[1] = {ne0};
    tg_tensor(b, "t", 1, ne, type, 64, -1, 0);
}

/* Each case builds a file; want is the status it must be refused with. */
static size_t bad_case(int i, struct tg *b, enum moe_status *want, const char **what) {
    const int64_t ne1[1] = {16};
    *want = MOE_ERR_FORMAT;
    switch (i) {
    case 0: *what = "empty file"; tg_begin(b, 3); b->n = 0; return 0;
    case 1: *what = "bad magic"; tg_begin(b, 3); tg_finish(b); b->p[0] = 'X'; return b->n;
    case 2: *what = "version 1"; *want = MOE_ERR_UNSUPPORTED; tg_begin(b, 1); return tg_finish(b);
    case 3: *what = "version 4"; tg_begin(b, 4); return tg_finish(b);
    case 4: *what = "big-endian"; *want = MOE_ERR_UNSUPPORTED; tg_begin(b, 0x03000000u); return tg_finish(b);
    case 5: *what = "huge tensor count"; tg_begin(b, 3); tg_finish(b); b->p[15] = 0x10; return b->n;
    case 6: *what = "huge key count"; tg_begin(b, 3); tg_finish(b); b->p[23] = 0x10; return b->n;
    case 7: *what = "key length past the end"; tg_begin(b, 3); tg_u64(b, 1ull << 62); b->n_kv = 1; return tg_finish(b);
    case 8: *what = "empty key"; tg_begin(b, 3); tg_kv_u32(b, "", 1); return tg_finish(b);
    case 9: *what = "key not UTF-8"; tg_begin(b, 3); tg_kv_u32(b, "a\xc0\xaf" "b", 1); return tg_finish(b);
    case 10: *what = "key with a control byte"; tg_begin(b, 3); tg_kv_u32(b, "a\nb", 1); return tg_finish(b);
    case 11: *what = "duplicate key"; tg_begin(b, 3); tg_kv_u32(b, "a", 1); tg_kv_u32(b, "a", 2); return tg_finish(b);
    case 12: *what = "unknown value type"; tg_begin(b, 3); tg_key(b, "a", 13); tg_u32(b, 0); return tg_finish(b);
    case 13: *what = "array of arrays"; tg_begin(b, 3); tg_kv_arr(b, "a", 9, 1); return tg_finish(b);
    case 14: *what = "array count past the end"; tg_begin(b, 3); tg_kv_arr(b, "a", 4, 1ull << 40); return tg_finish(b);
    case 15: *what = "string array count past the end"; tg_begin(b, 3); tg_kv_arr(b, "a", 8, 1ull << 40); return tg_finish(b);
    case 16: *what = "string value past the end"; tg_begin(b, 3); tg_key(b, "a", 8); tg_u64(b, 1000); return tg_finish(b);
    case 17: *what = "bool 2"; tg_begin(b, 3); tg_kv_bool(b, "a", 2); return tg_finish(b);
    case 18: *what = "alignment 48"; tg_begin(b, 3); tg_kv_u32(b, "general.alignment", 48); return tg_finish(b);
    case 19: *what = "alignment 0"; tg_begin(b, 3); tg_kv_u32(b, "general.alignment", 0); return tg_finish(b);
    case 20: *what = "alignment as u64"; tg_begin(b, 3); tg_kv_u64(b, "general.alignment", 32); return tg_finish(b);
    case 21: *what = "0 dims"; tg_begin(b, 3); tg_tensor(b, "t", 0, ne1, 0, 0, 0, 0); return tg_finish(b);
    case 22: *what = "5 dims"; {
        const int64_t ne5[5] = {1, 1, 1, 1, 1};
        tg_begin(b, 3);
        tg_str(b, "t"), tg_u32(b, 5);
        for (int d = 0; d < 5; d++) tg_u64(b, (uint64_t)ne5[d]);
        tg_u32(b, 0), tg_u64(b, 0);
        tg_finish(b);
        b->p[8] = 1; /* one tensor */
        return b->n;
    }
    case 23: *what = "huge dim"; {
        const int64_t ne[1] = {1ll << 62};
        tg_begin(b, 3);
        tg_tensor(b, "t", 1, ne, 0, 0, 0, 0);
        return tg_finish(b);
    }
    case 24: *what = "element count overflow"; {
        const int64_t ne[3] = {1ll << 30, 1ll << 30, 1ll << 30};
        tg_begin(b, 3);
        tg_tensor(b, "t", 3, ne, 0, 0, 0, 0);
        return tg_finish(b);
    }
    case 25: *what = "byte size overflow"; {
        const int64_t ne[2] = {1ll << 40, 1ll << 22};
        tg_begin(b, 3);
        tg_tensor(b, "t", 2, ne, 0, 0, 0, 0);
        return tg_finish(b);
    }
    case 26: *what = "unsupported type q5_0"; *want = MOE_ERR_UNSUPPORTED; one_tensor(b, 6, 32); return tg_finish(b);
    case 27: *what = "unsupported type iq2_xs"; *want = MOE_ERR_UNSUPPORTED; one_tensor(b, 17, 256); return tg_finish(b);
    case 28: *what = "unknown type 99"; one_tensor(b, 99, 32); return tg_finish(b);
    case 29: *what = "row not a whole number of blocks"; one_tensor(b, MOE_QTYPE_Q8_0, 33); return tg_finish(b);
    case 30: *what = "misaligned offset"; tg_begin(b, 3); tg_tensor(b, "t", 1, ne1, 0, 64, 4, 0); return tg_finish(b);
    case 31: *what = "offset past the data"; tg_begin(b, 3); tg_tensor(b, "t", 1, ne1, 0, 64, 4096, 0); tg_finish(b);
        b->n = b->n - 64; /* the file ends before the tensor */
        return b->n;
    case 32: *what = "offset + size overflow"; /* offset 2^64 - 32: aligned, but offset + size wraps */
        tg_begin(b, 3);
        tg_tensor(b, "t", 1, ne1, 0, 64, 0, 0);
        tg_finish(b);
        for (int k = 0; k < 8; k++) b->p[b->t[0].off_pos + k] = k == 0 ? 0xE0 : 0xFF;
        return b->n;
    case 33: *what = "overlapping tensors"; tg_begin(b, 3);
        tg_tensor(b, "a", 1, ne1, 0, 64, 0, 0);
        tg_tensor(b, "b", 1, ne1, 0, 64, 32, 0);
        return tg_finish(b);
    case 34: *what = "duplicate tensor name"; tg_begin(b, 3);
        tg_tensor(b, "a", 1, ne1, 0, 64, -1, 0);
        tg_tensor(b, "a", 1, ne1, 0, 64, -1, 0);
        return tg_finish(b);
    case 35: *what = "tensor name of 64 bytes"; {
        char name[65];
        memset(name, 'n', 64), name[64] = 0;
        tg_begin(b, 3);
        tg_tensor(b, name, 1, ne1, 0, 64, -1, 0);
        return tg_finish(b);
    }
    case 36: *what = "empty tensor name"; tg_begin(b, 3); tg_tensor(b, "", 1, ne1, 0, 64, -1, 0); return tg_finish(b);
    case 37: *what = "tensor size past the end"; {
        const int64_t ne[1] = {1 << 20};
        tg_begin(b, 3);
        tg_tensor(b, "t", 1, ne, 0, 64, 0, 0);
        return tg_finish(b);
    }
    case 38: *what = "overlap hidden behind an empty tensor"; {
        const int64_t ne0[1] = {0};
        tg_begin(b, 3);
        tg_tensor(b, "a", 1, ne1, 0, 64, 0, 0);
        tg_tensor(b, "z", 1, ne0, 0, 0, 32, 0);
        tg_tensor(b, "b", 1, ne1, 0, 64, 32, 0);
        return tg_finish(b);
    }
    default: return (size_t)-1;
    }
}

static void test_reject_table(void) {
    int n_cases = 0;
    moe_log_set(quiet, NULL);
    for (int i = 0;; i++) {
        struct tg b = {0};
        enum moe_status want;
        const char *what = "?";
        size_t n = bad_case(i, &b, &want, &what);
        if (n == (size_t)-1) {
            free(b.p);
            break;
        }
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, b.p, n);
        struct moe_gguf *g = NULL;
        enum moe_status st = moe_gguf_open_memory(copy, n, what, &g);
        CHECK(st == want && !g, "case %d (%s): status %s, expected %s", i, what, moe_status_str(st), moe_status_str(want));
        moe_gguf_free(g);
        free(copy);
        free(b.p);
        n_cases++;
    }
    moe_log_set(NULL, NULL);
    printf("  %d malformed files refused\n", n_cases);
}

/* ---- translation to a model ------------------------------------------- */

enum { H = 32, NH = 2, NKV = 1, HD = 16, E = 2, F = 32, V = 6 };

static float q_rows[NH * HD * H], k_rows[NKV * HD * H], ffn[E * F * H], small[64];

/* mixtral_file: a one-layer llama-architecture MoE with a 6-token SPM
 * vocabulary; `omit` leaves out one key by name ("" = none). */
static size_t mixtral_file(struct tg *b, const char *omit, const char *arch) {
    tg_begin(b, 3);
    tg_kv_str(b, "general.architecture", arch);
#define KU(k, v) \
    if (strcmp(omit, k)) tg_kv_u32(b, "llama." k, v)
    KU("block_count", 1);
    KU("embedding_length", H);
    KU("attention.head_count", NH);
    KU("attention.head_count_kv", NKV);
    KU("feed_forward_length", F);
    KU("expert_count", E);
    KU("expert_used_count", 1);
    KU("context_length", 64);
#undef KU
    tg_kv_f32(b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    tg_kv_str(b, "tokenizer.ggml.model", "llama");
    const char *toks[V] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "\xe2\x96\x81" "a"};
    const float scores[V] = {0, 0, 0, -10, -11, -1};
    const int32_t types[V] = {2, 3, 3, 1, 1, 1};
    tg_kv_strs(b, "tokenizer.ggml.tokens", toks, V);
    tg_kv_f32s(b, "tokenizer.ggml.scores", scores, V);
    tg_kv_i32s(b, "tokenizer.ggml.token_type", types, V);
    tg_kv_u32(b, "tokenizer.ggml.bos_token_id", 1);
    tg_kv_u32(b, "tokenizer.ggml.eos_token_id", 2);
    for (int i = 0; i < NH * HD * H; i++) q_rows[i] = (float)(i / H); /* row index as the value */
    for (int i = 0; i < NKV * HD * H; i++) k_rows[i] = (float)(1000 + i / H);
    for (int i = 0; i < E * F * H; i++) ffn[i] = (float)i;
    const int64_t emb[2] = {H, V}, vec[1] = {H}, q[2] = {H, NH * HD}, kv[2] = {H, NKV * HD}, o[2] = {NH * HD, H},
                  r[2] = {H, E}, gu[3] = {H, F, E}, dn[3] = {F, H, E};
    tg_f32(b, "token_embd.weight", 2, emb);
    tg_f32(b, "output_norm.weight", 1, vec);
    tg_f32(b, "output.weight", 2, emb);
    tg_f32(b, "blk.0.attn_norm.weight", 1, vec);
    tg_f32(b, "blk.0.ffn_norm.weight", 1, vec);
    tg_tensor_data(b, "blk.0.attn_q.weight", 2, q, 0, q_rows, sizeof q_rows);
    tg_tensor_data(b, "blk.0.attn_k.weight", 2, kv, 0, k_rows, sizeof k_rows);
    tg_f32(b, "blk.0.attn_v.weight", 2, kv);
    tg_f32(b, "blk.0.attn_output.weight", 2, o);
    tg_f32(b, "blk.0.ffn_gate_inp.weight", 2, r);
    tg_tensor_data(b, "blk.0.ffn_gate_exps.weight", 3, gu, 0, ffn, sizeof ffn);
    tg_tensor_data(b, "blk.0.ffn_up_exps.weight", 3, gu, 0, ffn, sizeof ffn);
    tg_tensor_data(b, "blk.0.ffn_down_exps.weight", 3, dn, 0, ffn, sizeof ffn);
    return tg_finish(b);
}

/* load_image: write an image to a temporary .gguf and load it as a model. */
static enum moe_status load_image(const struct tg *b, size_t n, struct moe_model **m) {
    char path[] = "/tmp/test-gguf-model-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, b->p, n) != (ssize_t)n) return MOE_ERR_IO;
    close(fd);
    enum moe_status st = moe_model_load_gguf(path, m);
    unlink(path);
    return st;
}

static void test_mixtral(void) {
    struct tg b;
    size_t n = mixtral_file(&b, "", "llama");
    struct moe_model *m = NULL;
    CHECK(load_image(&b, n, &m) == MOE_OK, "synthetic Mixtral GGUF refused");
    if (m) {
        const struct moe_config *c = &m->cfg;
        CHECK(c->arch == MOE_ARCH_MIXTRAL && c->n_embd == H && c->n_head == NH && c->n_head_kv == NKV &&
                  c->head_dim == HD && c->n_expert == E && c->n_ff_expert == F && c->n_vocab == V &&
                  c->norm_topk_prob == 1 && c->bos_id == 1 && c->n_eos == 1 && c->eos_ids[0] == 2,
              "config of the synthetic Mixtral");
        /* llama.cpp row h*HD + 2i + j is transformers row h*HD + j*HD/2 + i */
        const float *wq = m->layers[0].wq.data;
        int ok = 1;
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD / 2; i++)
                for (int j = 0; j < 2; j++) ok &= wq[(h * HD + j * HD / 2 + i) * H] == (float)(h * HD + 2 * i + j);
        const float *wk = m->layers[0].wk.data;
        for (int i = 0; i < HD / 2; i++)
            for (int j = 0; j < 2; j++) ok &= wk[(j * HD / 2 + i) * H + 3] == (float)(1000 + 2 * i + j);
        CHECK(ok, "q/k rows are not back in transformers' order");
        struct moe_ffn f;
        CHECK(moe_model_expert(m, 0, 1, -1, &f) == MOE_OK && f.gate.type == MOE_QTYPE_F32 &&
                  ((const float *)f.gate.data)[0] == (float)(F * H) && f.down.n_out == H && f.down.n_in == F,
              "expert 1 is not the second slice of the merged tensors");
        int32_t *ids = NULL;
        size_t nid = 0;
        CHECK(m->tok && moe_tokenizer_encode(m->tok, "a a", 3, 1, &ids, &nid) == MOE_OK && nid == 3 && ids[0] == 1 &&
                  ids[1] == 5 && ids[2] == 5,
              "SPM tokenizer: \"a a\" -> %zu ids", nid);
        free(ids);
    }
    moe_model_free(m);
    free(b.p);

    static const struct {
        const char *omit, *arch;
        enum moe_status want;
        const char *what;
    } bad[] = {
        {"", "bert", MOE_ERR_UNSUPPORTED, "unknown architecture"},
        {"expert_count", "llama", MOE_ERR_UNSUPPORTED, "llama without experts"},
        {"embedding_length", "llama", MOE_ERR_NOT_FOUND, "missing embedding_length"},
        {"block_count", "llama", MOE_ERR_FORMAT, "missing block_count"},
        {"expert_used_count", "llama", MOE_ERR_NOT_FOUND, "missing expert_used_count"},
    };
    moe_log_set(quiet, NULL);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        n = mixtral_file(&b, bad[i].omit, bad[i].arch);
        m = NULL;
        enum moe_status st = load_image(&b, n, &m);
        CHECK(st == bad[i].want && !m, "%s: %s, expected %s", bad[i].what, moe_status_str(st), moe_status_str(bad[i].want));
        free(b.p);
    }
    { /* a key of the wrong type: head_count as a per-layer array */
        tg_begin(&b, 3);
        tg_kv_str(&b, "general.architecture", "llama");
        tg_kv_u32(&b, "llama.block_count", 1);
        tg_kv_u32(&b, "llama.embedding_length", H);
        const int32_t hc[1] = {NH};
        tg_kv_i32s(&b, "llama.attention.head_count", hc, 1);
        tg_kv_u32(&b, "llama.expert_count", E);
        tg_kv_u32(&b, "llama.expert_used_count", 1);
        n = tg_finish(&b);
        CHECK(load_image(&b, n, &m) == MOE_ERR_FORMAT, "per-layer head_count array accepted");
        free(b.p);
    }
    moe_log_set(NULL, NULL);
    printf("  synthetic Mixtral: config, q/k rows unpermuted, expert slices, tokenizer; %zu metadata errors refused\n",
           sizeof bad / sizeof bad[0] + 1);
}

/* config_of: the config a metadata-only GGUF translates to (tensors as given). */
static enum moe_status config_of(struct tg *b, struct moe_config *cfg, char **json) {
    size_t n = tg_finish(b);
    struct moe_gguf *g = NULL;
    struct moe_gguf_model *v = NULL;
    enum moe_status st = moe_gguf_open_memory(b->p, n, "cfg", &g);
    if (!st) st = moe_gguf_model_open(g, &v);
    if (!st) {
        const char *j = moe_gguf_model_config_json(v);
        if (json) *json = strdup(j);
        st = moe_config_parse(j, strlen(j), "cfg", cfg);
    }
    moe_gguf_model_free(v);
    moe_gguf_free(g);
    return st;
}

static void test_configs(void) {
    struct tg b;
    struct moe_config cfg;
    /* Phi-MoE with longrope: factors from the rope_factors tensors, one attn_factor */
    tg_begin(&b, 3);
    tg_kv_str(&b, "general.architecture", "phimoe");
    tg_kv_u32(&b, "phimoe.block_count", 1);
    tg_kv_u32(&b, "phimoe.embedding_length", 32);
    tg_kv_u32(&b, "phimoe.vocab_size", 16);
    tg_kv_u32(&b, "phimoe.attention.head_count", 2);
    tg_kv_u32(&b, "phimoe.expert_count", 4);
    tg_kv_u32(&b, "phimoe.expert_used_count", 2);
    tg_kv_u32(&b, "phimoe.feed_forward_length", 64);
    tg_kv_u32(&b, "phimoe.context_length", 128);
    tg_kv_u32(&b, "phimoe.rope.dimension_count", 16);
    tg_kv_u32(&b, "phimoe.rope.scaling.original_context_length", 16);
    tg_kv_f32(&b, "phimoe.rope.scaling.attn_factor", 1.25f);
    for (int i = 0; i < 8; i++) small[i] = 1.0f + 0.5f * (float)i;
    const int64_t n8[1] = {8};
    tg_tensor_data(&b, "rope_factors_long.weight", 1, n8, 0, small, 32);
    tg_tensor_data(&b, "rope_factors_short.weight", 1, n8, 0, small, 32);
    enum moe_status st = config_of(&b, &cfg, NULL);
    CHECK(st == MOE_OK && cfg.arch == MOE_ARCH_PHIMOE && cfg.rope.kind == MOE_ROPE_LONGROPE &&
              cfg.rope.original_max_pos == 16 && cfg.rope.short_mscale == 1.25f && cfg.rope.long_mscale == 1.25f &&
              cfg.rope.long_factor && cfg.rope.long_factor[7] == 4.5f && cfg.router == MOE_ROUTER_SPARSEMIXER,
          "Phi-MoE longrope config (%s)", moe_status_str(st));
    if (!st) moe_config_clear(&cfg);
    free(b.p);

    /* DeepSeek-V3: sigmoid gating, groups, YaRN with yarn_log_multiplier, no q LoRA */
    tg_begin(&b, 3);
    tg_kv_str(&b, "general.architecture", "deepseek2");
    tg_kv_u32(&b, "deepseek2.block_count", 2);
    tg_kv_u32(&b, "deepseek2.embedding_length", 64);
    tg_kv_u32(&b, "deepseek2.vocab_size", 16);
    tg_kv_u32(&b, "deepseek2.attention.head_count", 4);
    tg_kv_u32(&b, "deepseek2.attention.head_count_kv", 1);
    tg_kv_u32(&b, "deepseek2.attention.kv_lora_rank", 16);
    tg_kv_u32(&b, "deepseek2.attention.key_length", 24);
    tg_kv_u32(&b, "deepseek2.attention.value_length", 16);
    tg_kv_u32(&b, "deepseek2.attention.key_length_mla", 20);
    tg_kv_u32(&b, "deepseek2.attention.value_length_mla", 12);
    tg_kv_u32(&b, "deepseek2.rope.dimension_count", 8);
    tg_kv_u32(&b, "deepseek2.expert_count", 8);
    tg_kv_u32(&b, "deepseek2.expert_used_count", 2);
    tg_kv_u32(&b, "deepseek2.expert_shared_count", 1);
    tg_kv_u32(&b, "deepseek2.expert_feed_forward_length", 24);
    tg_kv_u32(&b, "deepseek2.feed_forward_length", 80);
    tg_kv_u32(&b, "deepseek2.leading_dense_block_count", 1);
    tg_kv_u32(&b, "deepseek2.expert_group_count", 4);
    tg_kv_u32(&b, "deepseek2.expert_group_used_count", 2);
    tg_kv_u32(&b, "deepseek2.expert_gating_func", 2);
    tg_kv_f32(&b, "deepseek2.expert_weights_scale", 2.5f);
    tg_kv_bool(&b, "deepseek2.expert_weights_norm", 1);
    tg_kv_u32(&b, "deepseek2.context_length", 256);
    tg_kv_str(&b, "deepseek2.rope.scaling.type", "yarn");
    tg_kv_f32(&b, "deepseek2.rope.scaling.factor", 4.0f);
    tg_kv_u32(&b, "deepseek2.rope.scaling.original_context_length", 64);
    tg_kv_f32(&b, "deepseek2.rope.scaling.yarn_log_multiplier", 0.1f);
    char *json = NULL;
    st = config_of(&b, &cfg, &json);
    const double m = 0.1 * 1.0 * log(4.0) + 1.0, want_scale = pow(20.0, -0.5) * m * m;
    CHECK(st == MOE_OK && cfg.arch == MOE_ARCH_DEEPSEEK_V3 && cfg.attn == MOE_ATTN_MLA && cfg.q_lora_rank == 0 &&
              cfg.kv_lora_rank == 16 && cfg.qk_nope_dim == 12 && cfg.qk_rope_dim == 8 && cfg.v_head_dim == 12 &&
              cfg.n_head_kv == 4 && cfg.router == MOE_ROUTER_SIGMOID_GROUP && cfg.n_group == 4 && cfg.topk_group == 2 &&
              cfg.routed_scale == 2.5f && cfg.norm_topk_prob == 1 && cfg.layer_moe[0] == 0 && cfg.layer_moe[1] == 1 &&
              cfg.n_ff_shared == 24 && cfg.rope.kind == MOE_ROPE_YARN && cfg.rope.interleave == 1 &&
              fabs(cfg.rope.attention_factor - 1.0) < 1e-6 && fabs(cfg.attn_scale - want_scale) < 1e-6,
          "DeepSeek-V3 config (%s): %s", moe_status_str(st), json ? json : "");
    free(json);
    if (!st) moe_config_clear(&cfg);
    free(b.p);

    /* refusals: deepseek2 gating 3, a rope scaling type we do not read */
    tg_begin(&b, 3);
    tg_kv_str(&b, "general.architecture", "deepseek2");
    tg_kv_u32(&b, "deepseek2.block_count", 1);
    tg_kv_u32(&b, "deepseek2.expert_gating_func", 3);
    moe_log_set(quiet, NULL);
    st = config_of(&b, &cfg, NULL);
    CHECK(st == MOE_ERR_UNSUPPORTED, "deepseek2 gating 3: %s", moe_status_str(st));
    free(b.p);
    tg_begin(&b, 3);
    tg_kv_str(&b, "general.architecture", "qwen3moe");
    tg_kv_u32(&b, "qwen3moe.block_count", 1);
    tg_kv_u32(&b, "qwen3moe.embedding_length", 32);
    tg_kv_u32(&b, "qwen3moe.attention.head_count", 2);
    tg_kv_u32(&b, "qwen3moe.expert_count", 2);
    tg_kv_u32(&b, "qwen3moe.expert_used_count", 1);
    tg_kv_u32(&b, "qwen3moe.expert_feed_forward_length", 8);
    tg_kv_str(&b, "qwen3moe.rope.scaling.type", "longrope");
    st = config_of(&b, &cfg, NULL);
    CHECK(st == MOE_ERR_UNSUPPORTED, "qwen3moe longrope: %s", moe_status_str(st));
    moe_log_set(NULL, NULL);
    free(b.p);
    printf("  configs: Phi-MoE longrope, DeepSeek-V3 groups + YaRN; unsupported gating and rope refused\n");
}

/* vocab_file: metadata-only file with a tokenizer. */
static size_t vocab_file(struct tg *b, const char *model, const char *pre, const char *const *toks, const float *scores,
                         const int32_t *types, int n) {
    tg_begin(b, 3);
    tg_kv_str(b, "tokenizer.ggml.model", model);
    if (pre) tg_kv_str(b, "tokenizer.ggml.pre", pre);
    tg_kv_strs(b, "tokenizer.ggml.tokens", toks, (size_t)n);
    if (scores) tg_kv_f32s(b, "tokenizer.ggml.scores", scores, (size_t)n);
    if (types) tg_kv_i32s(b, "tokenizer.ggml.token_type", types, (size_t)n);
    return tg_finish(b);
}

static enum moe_status vocab_tok(struct tg *b, size_t n, struct moe_tokenizer **tok) {
    struct moe_gguf *g = NULL;
    char *tj = NULL, *tc = NULL;
    *tok = NULL;
    enum moe_status st = moe_gguf_open_memory(b->p, n, "vocab", &g);
    if (!st) st = moe_gguf_vocab_texts(g, &tj, &tc);
    if (!st) st = moe_tokenizer_load_texts(tj, strlen(tj), tc, strlen(tc), "vocab", tok);
    free(tj);
    free(tc);
    moe_gguf_free(g);
    return st;
}

static void test_vocab(void) {
    /* "bc" (id 4) and "ab" (id 5) score the same: llama.cpp merges the leftmost
     * pair first, so "abc" is [ab, c], not [a, bc] as merge order by id would give */
    const char *toks[7] = {"\xe2\x96\x81", "a", "b", "c", "bc", "ab", "<0x41>"};
    const float sc[7] = {0, 0, 0, 0, -1, -1, 0};
    const int32_t ty[7] = {1, 1, 1, 1, 1, 1, 6};
    struct tg b;
    size_t n = vocab_file(&b, "llama", NULL, toks, sc, ty, 7);
    struct moe_tokenizer *tok = NULL;
    CHECK(vocab_tok(&b, n, &tok) == MOE_OK, "SPM vocabulary refused");
    int32_t *ids = NULL;
    size_t nid = 0;
    if (tok) {
        CHECK(moe_tokenizer_encode(tok, "abc", 3, 0, &ids, &nid) == MOE_OK && nid == 3 && ids[0] == 0 && ids[1] == 5 &&
                  ids[2] == 3,
              "equal scores: \"abc\" gave %zu ids (%d %d %d)", nid, nid > 0 ? ids[0] : -1, nid > 1 ? ids[1] : -1,
              nid > 2 ? ids[2] : -1);
        free(ids);
        ids = NULL;
        CHECK(moe_tokenizer_encode(tok, "A", 1, 0, &ids, &nid) == MOE_OK && nid == 2 && ids[1] == 6,
              "byte fallback for a character without a token");
        free(ids);
    }
    moe_tokenizer_free(tok);
    free(b.p);

    struct {
        const char *model, *pre;
        int n;
        const char *t[3];
        enum moe_status want;
        const char *what;
    } bad[] = {
        {"bert", NULL, 2, {"a", "b"}, MOE_ERR_UNSUPPORTED, "tokenizer model bert"},
        {"gpt2", "no-such-pre", 2, {"a", "b"}, MOE_ERR_UNSUPPORTED, "unknown pre-tokenizer"},
        {"gpt2", "qwen2", 2, {"a", "b"}, MOE_ERR_FORMAT, "gpt2 without merges"},
        {"llama", NULL, 2, {"a", "a"}, MOE_ERR_FORMAT, "duplicate tokens"},
        {"llama", NULL, 2, {"a", "\xff"}, MOE_ERR_FORMAT, "token not UTF-8"},
    };
    moe_log_set(quiet, NULL);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        n = vocab_file(&b, bad[i].model, bad[i].pre, bad[i].t, NULL, NULL, bad[i].n);
        enum moe_status st = vocab_tok(&b, n, &tok);
        CHECK(st == bad[i].want && !tok, "%s: %s, expected %s", bad[i].what, moe_status_str(st), moe_status_str(bad[i].want));
        moe_tokenizer_free(tok);
        free(b.p);
    }
    /* scores shorter than the token list */
    tg_begin(&b, 3);
    tg_kv_str(&b, "tokenizer.ggml.model", "llama");
    tg_kv_strs(&b, "tokenizer.ggml.tokens", toks, 7);
    tg_kv_f32s(&b, "tokenizer.ggml.scores", sc, 3);
    n = tg_finish(&b);
    CHECK(vocab_tok(&b, n, &tok) == MOE_ERR_FORMAT, "short score array accepted");
    free(b.p);
    moe_log_set(NULL, NULL);
    printf("  vocabularies: equal SPM scores merge leftmost first, byte fallback; %zu bad vocabularies refused\n",
           sizeof bad / sizeof bad[0] + 1);
}

int main(void) {
    test_valid();
    test_truncations();
    test_reject_table();
    test_mixtral();
    test_configs();
    test_vocab();
    printf("test-gguf: %d checks, %d failed\n", checks, fails);
    return fails != 0;
}

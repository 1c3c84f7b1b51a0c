/*
 * test-safetensors.c - tests of formats/safetensors.c.
 *
 * 1. A table of malformed headers, each built in memory as "u64 length + header
 *    JSON + data bytes" and fed to moe_safetensors_open_memory: each must fail,
 *    and the logged error must name the label and the problem.
 * 2. Valid in-memory images: padding, scalars, zero-element tensors, header order
 *    different from offset order, metadata, unaligned data, 10^4 tensors.
 * 3. Files in a mkdtemp() directory: single-file round trip of F32/F16/BF16,
 *    model directories (single and sharded with an index) and the index
 *    failures (missing shard, "..", absolute path, symlink escaping the
 *    directory, bad JSON, no weight_map), truncated and empty files.
 * 4. The committed stories260K model, when present (skipped with a note if not).
 *
 * Prints one summary line; exits non-zero on any failure.
 */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw, symlink */
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe-safetensors.h"
#include "moe-test.h"
#include "moe-test-log.h"



/* ------------------------------------------------------------------------- */
/* building images                                                            */

/* Returns a malloc'd image: u64 LE hlen_field, header_len header bytes, then
 * data_len bytes of data (copied from data, or the pattern i & 0xff). */
static uint8_t *build(const char *header, size_t header_len, uint64_t hlen_field, const void *data,
                      size_t data_len, size_t *out_len) {
    size_t n = 8 + header_len + data_len;
    uint8_t *p = malloc(n ? n : 1);
    if (!p) abort();
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(hlen_field >> (8 * i));
    memcpy(p + 8, header, header_len);
    for (size_t i = 0; i < data_len; i++)
        p[8 + header_len + i] = data ? ((const uint8_t *)data)[i] : (uint8_t)i;
    *out_len = n;
    return p;
}

/* build() with the header's own length in the prefix. */
static uint8_t *build_simple(const char *header, size_t data_len, size_t *out_len) {
    size_t h = strlen(header);
    return build(header, h, h, NULL, data_len, out_len);
}

/* ------------------------------------------------------------------------- */
/* 1. malformed in-memory headers                                             */

/* A tensor entry: TE("a", "F32", "[1]", "0", "4"). */
#define TE(name, dt, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" b "," e "]}"

enum { HDR_STRLEN = 0, HDR_RAW = 1, HDR_LEN_FIELD = 2 };

struct bad_row {
    const char *label;
    int mode;          /* HDR_STRLEN: prefix = strlen(header); HDR_RAW: the image is just
                          the header bytes (no prefix); HDR_LEN_FIELD: prefix = hlen */
    const char *header;
    size_t header_len; /* 0 = strlen(header) */
    uint64_t hlen;     /* HDR_LEN_FIELD only */
    size_t data_len;
    const char *expect; /* substring of the logged error */
};

static const struct bad_row bad_rows[] = {
    /* size and header length */
    {"short-5", HDR_RAW, "abcde", 0, 0, 0, "too short"},
    {"empty", HDR_RAW, "", 0, 0, 0, "too short"},
    {"short-7", HDR_RAW, "\x02\0\0\0\0\0\0", 7, 0, 0, "too short"},
    {"hlen-past-end", HDR_LEN_FIELD, "{}", 0, 1000, 10, "past the end of the file"},
    {"hlen-one-past", HDR_LEN_FIELD, "{}", 0, 3, 0, "past the end of the file"},
    {"hlen-over-limit", HDR_LEN_FIELD, "{}", 0, 100000001u, 0, "100 MB"},
    {"hlen-u64-max", HDR_LEN_FIELD, "{}", 0, UINT64_MAX, 0, "limit"},
    {"hlen-2^63", HDR_LEN_FIELD, "{}", 0, 1ull << 63, 0, "limit"},
    {"hlen-zero", HDR_STRLEN, "", 0, 0, 0, "not valid JSON"},
    /* UTF-8 */
    {"utf8-overlong-2", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"\xC0\xAF\"}}", 0, 0, 0, "UTF-8"},
    {"utf8-overlong-3", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"\xE0\x80\xAF\"}}", 0, 0, 0, "UTF-8"},
    {"utf8-overlong-4", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"\xF0\x80\x80\xAF\"}}", 0, 0, 0,
     "UTF-8"},
    {"utf8-surrogate", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"\xED\xA0\x80\"}}", 0, 0, 0, "UTF-8"},
    {"utf8-low-surrogate", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"\xED\xBF\xBF\"}}", 0, 0, 0,
     "UTF-8"},
    {"utf8-above-10ffff", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"\xF4\x90\x80\x80\"}}", 0, 0, 0,
     "UTF-8"},
    {"utf8-f5", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"\xF5\x80\x80\x80\"}}", 0, 0, 0, "UTF-8"},
    {"utf8-ff", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"\xFF\"}}", 0, 0, 0, "UTF-8"},
    {"utf8-lone-continuation", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"\x80\"}}", 0, 0, 0, "UTF-8"},
    {"utf8-truncated-seq", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"\xE2\x82" "\"}}", 0, 0, 0,
     "UTF-8"},
    {"utf8-truncated-at-end", HDR_STRLEN, "{}\xE2\x82", 0, 0, 0, "UTF-8"},
    {"utf8-in-name", HDR_STRLEN, "{\"a\xC1\xBF\":{}}", 0, 0, 0, "UTF-8"},
    /* JSON syntax */
    {"json-unterminated", HDR_STRLEN, "{\"a\":", 0, 0, 0, "not valid JSON"},
    {"json-garbage-after", HDR_STRLEN, "{} x", 0, 0, 0, "not valid JSON"},
    {"json-two-objects", HDR_STRLEN, "{}{}", 0, 0, 0, "not valid JSON"},
    {"json-spaces-only", HDR_STRLEN, "        ", 0, 0, 0, "not valid JSON"},
    {"json-single-quotes", HDR_STRLEN, "{'a':1}", 0, 0, 0, "not valid JSON"},
    {"json-trailing-comma", HDR_STRLEN, "{\"__metadata__\":{},}", 0, 0, 0, "not valid JSON"},
    {"json-nul-byte", HDR_STRLEN, "{}\0   ", 6, 0, 0, "0x00"},
    {"json-control-in-string", HDR_STRLEN, "{\"a\x01\":{}}", 0, 0, 0, "control character"},
    {"json-tab-in-string", HDR_STRLEN, "{\"a\t\":{}}", 0, 0, 0, "control character"},
    {"json-bom", HDR_STRLEN, "\xEF\xBB\xBF{}", 0, 0, 0, "outside a string"},
    {"json-nul-escape", HDR_STRLEN, "{\"a\\u0000b\":{}}", 0, 0, 0, "\\u0000"},
    {"json-nul-escape-in-value", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"\\u0000\"}}", 0, 0, 0, "\\u0000"},
    {"json-short-u-escape", HDR_STRLEN, "{\"a\\u}000\":{}}", 0, 0, 0, "invalid escape"},
    {"json-u-escape-at-end", HDR_STRLEN, "{\"a\\u00", 0, 0, 0, "invalid escape"},
    {"json-unknown-escape", HDR_STRLEN, "{\"a\\x41\":{}}", 0, 0, 0, "invalid escape"},
    {"json-backslash-at-end", HDR_STRLEN, "{\"a\\", 0, 0, 0, "invalid escape"},
    {"json-bad-escape", HDR_STRLEN, "{\"a\\ud800\":{}}", 0, 0, 0, "not valid JSON"},
    {"not-object-array", HDR_STRLEN, "[1,2]", 0, 0, 0, "not a JSON object"},
    {"not-object-string", HDR_STRLEN, "\"abc\"", 0, 0, 0, "not a JSON object"},
    {"not-object-number", HDR_STRLEN, "7", 0, 0, 0, "not a JSON object"},
    {"not-object-null", HDR_STRLEN, "null", 0, 0, 0, "not a JSON object"},
    /* numbers */
    {"num-fraction", HDR_STRLEN, "{" TE("a", "F32", "[1.0]", "0", "4") "}", 0, 0, 4, "plain integer"},
    {"num-half", HDR_STRLEN, "{" TE("a", "F32", "[1]", "0", "4.5") "}", 0, 0, 4, "plain integer"},
    {"num-exponent", HDR_STRLEN, "{" TE("a", "F32", "[1e0]", "0", "4") "}", 0, 0, 4, "plain integer"},
    {"num-exponent-plus", HDR_STRLEN, "{" TE("a", "F32", "[1]", "0", "4E+0") "}", 0, 0, 4,
     "plain integer"},
    {"num-huge-exponent", HDR_STRLEN, "{" TE("a", "F32", "[1]", "0", "1e400") "}", 0, 0, 4,
     "plain integer"},
    {"num-leading-zero", HDR_STRLEN, "{" TE("a", "F32", "[01]", "0", "4") "}", 0, 0, 4,
     "plain integer"},
    {"num-minus-alone", HDR_STRLEN, "{" TE("a", "F32", "[-]", "0", "4") "}", 0, 0, 4, "plain integer"},
    {"num-neg-fraction", HDR_STRLEN, "{" TE("a", "F32", "[-1.5]", "0", "4") "}", 0, 0, 4,
     "plain integer"},
    {"neg-dim", HDR_STRLEN, "{" TE("a", "F32", "[-1]", "0", "4") "}", 0, 0, 4, "shape[0] = -1 is negative"},
    {"neg-zero-dim", HDR_STRLEN, "{" TE("a", "F32", "[1,-0]", "0", "0") "}", 0, 0, 0, "negative"},
    {"neg-offset", HDR_STRLEN, "{" TE("a", "F32", "[1]", "-4", "0") "}", 0, 0, 4,
     "data_offsets[0] = -4 is negative"},
    {"big-offset-2^53+1", HDR_STRLEN, "{" TE("a", "F32", "[1]", "0", "9007199254740993") "}", 0, 0,
     4, "too large"},
    {"big-offset-2^64", HDR_STRLEN, "{" TE("a", "F32", "[1]", "0", "18446744073709551616") "}", 0,
     0, 4, "too large"},
    {"big-dim-2^53", HDR_STRLEN, "{" TE("a", "F32", "[9007199254740992]", "0", "4") "}", 0, 0, 4,
     "too large"},
    {"big-dim-100-digits", HDR_STRLEN,
     "{" TE("a", "F32",
            "[1000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
            "000000000000000]",
            "0", "4") "}",
     0, 0, 4, "too large"},
    /* entry structure */
    {"entry-number", HDR_STRLEN, "{\"a\":5}", 0, 0, 0, "tensor a: entry is not an object"},
    {"entry-array", HDR_STRLEN, "{\"a\":[1]}", 0, 0, 0, "not an object"},
    {"entry-string", HDR_STRLEN, "{\"a\":\"F32\"}", 0, 0, 0, "not an object"},
    {"no-dtype", HDR_STRLEN, "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 0, 4,
     "missing \"dtype\""},
    {"no-shape", HDR_STRLEN, "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 0, 0, 4,
     "missing \"shape\""},
    {"no-offsets", HDR_STRLEN, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 0, 0, 4,
     "missing \"data_offsets\""},
    {"empty-entry", HDR_STRLEN, "{\"a\":{}}", 0, 0, 0, "missing"},
    {"dtype-number", HDR_STRLEN, "{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 0, 4,
     "\"dtype\" is not a string"},
    {"dtype-null", HDR_STRLEN, "{\"a\":{\"dtype\":null,\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 0,
     4, "\"dtype\" is not a string"},
    {"shape-string", HDR_STRLEN, "{\"a\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}",
     0, 0, 4, "\"shape\" is not an array"},
    {"shape-object", HDR_STRLEN, "{\"a\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]}}", 0,
     0, 4, "\"shape\" is not an array"},
    {"shape-elem-string", HDR_STRLEN, "{" TE("a", "F32", "[\"1\"]", "0", "4") "}", 0, 0, 4,
     "shape[0] is not a number"},
    {"shape-elem-null", HDR_STRLEN, "{" TE("a", "F32", "[1,null]", "0", "4") "}", 0, 0, 4,
     "shape[1] is not a number"},
    {"shape-elem-bool", HDR_STRLEN, "{" TE("a", "F32", "[true]", "0", "4") "}", 0, 0, 4,
     "is not a number"},
    {"shape-elem-array", HDR_STRLEN, "{" TE("a", "F32", "[[1]]", "0", "4") "}", 0, 0, 4,
     "is not a number"},
    {"offsets-one", HDR_STRLEN, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 0, 0,
     4, "\"data_offsets\" is not an array of two"},
    {"offsets-three", HDR_STRLEN,
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 0, 0, 4, "data_offsets"},
    {"offsets-object", HDR_STRLEN,
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{\"0\":0,\"1\":4}}}", 0, 0, 4,
     "data_offsets"},
    {"offsets-string", HDR_STRLEN, "{" TE("a", "F32", "[1]", "\"0\"", "4") "}", 0, 0, 4,
     "data_offsets[0] is not a number"},
    {"dup-key-in-entry", HDR_STRLEN,
     "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 0, 4,
     "duplicate key \"dtype\""},
    /* names */
    {"dup-name", HDR_STRLEN, "{" TE("a", "F32", "[1]", "0", "4") "," TE("a", "F32", "[1]", "4", "8") "}",
     0, 0, 8, "duplicate tensor name a"},
    {"dup-name-same-offsets", HDR_STRLEN,
     "{" TE("w", "F32", "[0]", "0", "0") "," TE("w", "F32", "[0]", "0", "0") "}", 0, 0, 0,
     "duplicate tensor name"},
    {"dup-name-escaped", HDR_STRLEN,
     "{" TE("ab", "F32", "[1]", "0", "4") "," TE("a\\u0062", "F32", "[1]", "4", "8") "}", 0, 0, 8,
     "duplicate tensor name ab"},
    /* dtype */
    {"dtype-unknown", HDR_STRLEN, "{" TE("a", "Q7", "[1]", "0", "4") "}", 0, 0, 4,
     "unknown dtype \"Q7\" for tensor a"},
    {"dtype-lowercase", HDR_STRLEN, "{" TE("a", "f32", "[1]", "0", "4") "}", 0, 0, 4, "unknown dtype"},
    {"dtype-empty", HDR_STRLEN, "{" TE("a", "", "[1]", "0", "4") "}", 0, 0, 4, "unknown dtype"},
    {"dtype-I64", HDR_STRLEN, "{" TE("a", "I64", "[1]", "0", "8") "}", 0, 0, 8,
     "unsupported dtype I64 for tensor a"},
    {"dtype-F64", HDR_STRLEN, "{" TE("w", "F64", "[1]", "0", "8") "}", 0, 0, 8,
     "unsupported dtype F64 for tensor w"},
    {"dtype-I8", HDR_STRLEN, "{" TE("a", "I8", "[1]", "0", "1") "}", 0, 0, 1, "unsupported dtype I8"},
    {"dtype-BOOL", HDR_STRLEN, "{" TE("a", "BOOL", "[1]", "0", "1") "}", 0, 0, 1,
     "unsupported dtype BOOL"},
    {"dtype-F8-E5M2", HDR_STRLEN, "{" TE("a", "F8_E5M2", "[1]", "0", "1") "}", 0, 0, 1,
     "unsupported dtype F8_E5M2"},
    {"dtype-F8-E4M3-size", HDR_STRLEN, "{" TE("a", "F8_E4M3", "[2]", "0", "1") "}", 0, 0, 1,
     "shape needs 2 bytes"},
    /* shape */
    {"too-many-dims", HDR_STRLEN, "{" TE("a", "F32", "[1,1,1,1,1,1,1,1,1]", "0", "4") "}", 0, 0, 4,
     "9 dims"},
    {"shape-overflow", HDR_STRLEN, "{" TE("a", "F32", "[4294967296,4294967296]", "0", "4") "}", 0, 0,
     4, "shape overflow"},
    {"shape-overflow-bytes", HDR_STRLEN,
     "{" TE("a", "F32", "[4611686018427387904]", "0", "4") "}", 0, 0, 4, "too large"},
    {"shape-overflow-bytes-only", HDR_STRLEN,
     "{" TE("a", "F32", "[4503599627370495,4096]", "0", "4") "}", 0, 0, 4, "shape overflow"},
    {"shape-exceeds-file", HDR_STRLEN, "{" TE("a", "F32", "[1000]", "0", "4000") "}", 0, 0, 4,
     "exceeds the file"},
    {"size-mismatch", HDR_STRLEN, "{" TE("a", "F32", "[1]", "0", "8") "}", 0, 0, 8,
     "span 8 bytes but shape x dtype size is 4"},
    {"size-mismatch-bf16", HDR_STRLEN, "{" TE("a", "BF16", "[3]", "0", "4") "}", 0, 0, 8, "span"},
    {"zero-elem-nonzero-span", HDR_STRLEN, "{" TE("a", "F32", "[0,5]", "0", "4") "}", 0, 0, 4,
     "span 4 bytes"},
    /* offsets and coverage */
    {"begin-after-end", HDR_STRLEN, "{" TE("a", "F32", "[1]", "8", "4") "}", 0, 0, 8,
     "begin 8 > end 4"},
    {"past-end", HDR_STRLEN, "{" TE("a", "F32", "[1]", "0", "4") "," TE("b", "F32", "[1]", "4", "8") "}",
     0, 0, 4, "tensor b: data_offsets end 8 is past the end"},
    {"overlap", HDR_STRLEN,
     "{" TE("a", "F32", "[2]", "0", "8") "," TE("b", "F32", "[2]", "4", "12") "}", 0, 0, 12,
     "overlaps tensor a"},
    {"same-range", HDR_STRLEN, "{" TE("a", "F32", "[1]", "0", "4") "," TE("b", "F32", "[1]", "0", "4") "}",
     0, 0, 4, "overlaps"},
    {"zero-size-inside", HDR_STRLEN,
     "{" TE("a", "F32", "[2]", "0", "8") "," TE("z", "F32", "[0]", "4", "4") "}", 0, 0, 8,
     "tensor z (data_offsets begin 4) overlaps"},
    {"gap", HDR_STRLEN, "{" TE("a", "F32", "[1]", "0", "4") "," TE("b", "F32", "[1]", "8", "12") "}", 0,
     0, 12, "gap of 4 unused bytes in the data region before tensor b"},
    {"first-not-at-0", HDR_STRLEN, "{" TE("a", "F32", "[1]", "4", "8") "}", 0, 0, 8, "gap of 4"},
    {"trailing", HDR_STRLEN, "{" TE("a", "F32", "[1]", "0", "4") "}", 0, 0, 8, "4 trailing bytes"},
    {"no-tensors-with-data", HDR_STRLEN, "{}", 0, 0, 4, "4 trailing bytes"},
    /* metadata */
    {"meta-number", HDR_STRLEN, "{\"__metadata__\":5}", 0, 0, 0, "\"__metadata__\" is not an object"},
    {"meta-array", HDR_STRLEN, "{\"__metadata__\":[]}", 0, 0, 0, "\"__metadata__\" is not an object"},
    {"meta-value-number", HDR_STRLEN, "{\"__metadata__\":{\"k\":1}}", 0, 0, 0,
     "value of key k is not a string"},
    {"meta-value-object", HDR_STRLEN, "{\"__metadata__\":{\"k\":{}}}", 0, 0, 0, "is not a string"},
    {"meta-value-null", HDR_STRLEN, "{\"__metadata__\":{\"k\":null}}", 0, 0, 0, "is not a string"},
    {"meta-dup", HDR_STRLEN, "{\"__metadata__\":{},\"__metadata__\":{}}", 0, 0, 0,
     "duplicate \"__metadata__\""},
    {"meta-dup-key", HDR_STRLEN, "{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"}}", 0, 0, 0,
     "duplicate key k"},
};

/* Opens one malformed image and checks: error status, no handle, and one logged
 * error naming the label and containing `expect`. */
static void expect_bad(const char *label, const uint8_t *p, size_t n, const char *expect) {
    struct moe_safetensors *st = (struct moe_safetensors *)1;
    log_reset();
    enum moe_status rc = moe_safetensors_open_memory(p, n, label, &st);
    CHECK(rc != MOE_OK, "[%s] accepted", label);
    CHECK(st == NULL, "[%s] handle not cleared on error", label);
    CHECK(strstr(g_err, label) != NULL, "[%s] message does not name the label: %s", label, g_err);
    CHECK(strstr(g_err, expect) != NULL, "[%s] expected \"%s\" in: %s", label, expect, g_err);
    CHECK(g_n_err == 1, "[%s] %d errors logged (want exactly one): %s", label, g_n_err, g_err);
    if (rc == MOE_OK) moe_safetensors_free(st);
}

/* Runs the table of malformed headers, plus a few rows built by code. */
static void test_bad_table(void) {
    for (size_t i = 0; i < sizeof bad_rows / sizeof bad_rows[0]; i++) {
        const struct bad_row *r = &bad_rows[i];
        size_t hl = r->header_len ? r->header_len : strlen(r->header), n;
        uint8_t *p;
        if (r->mode == HDR_RAW) {
            n = hl;
            p = malloc(n ? n : 1);
            memcpy(p, r->header, n);
        } else {
            p = build(r->header, hl, r->mode == HDR_LEN_FIELD ? r->hlen : hl, NULL, r->data_len, &n);
        }
        expect_bad(r->label, p, n, r->expect);
        free(p);
    }

    /* deep nesting: cJSON stops at its nesting limit instead of overflowing the stack */
    size_t depth = 5000, n;
    char *deep = malloc(2 * depth + 1);
    memset(deep, '[', depth);
    memset(deep + depth, ']', depth);
    deep[2 * depth] = 0;
    uint8_t *p = build_simple(deep, 0, &n);
    expect_bad("deep-nesting", p, n, "not valid JSON");
    free(p);
    deep[0] = '{';
    deep[1] = 0;
    free(deep);

    /* every unsupported safetensors dtype is named as unsupported */
    static const char *const other[] = {"I8", "I16", "U16", "I32", "U32", "U64", "F8_E5M2", "C64"};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        char hdr[256], label[64], expect[64];
        snprintf(hdr, sizeof hdr, "{" TE("t", "%s", "[0]", "0", "0") "}", other[i]);
        snprintf(label, sizeof label, "dtype-%s", other[i]);
        snprintf(expect, sizeof expect, "unsupported dtype %s for tensor t", other[i]);
        p = build_simple(hdr, 0, &n);
        expect_bad(label, p, n, expect);
        free(p);
    }

    /* a truncated copy of a valid image fails at every length */
    const char *hdr = "{" TE("a", "F32", "[2]", "0", "8") "," TE("b", "F16", "[2]", "8", "12") "}";
    p = build_simple(hdr, 12, &n);
    int all_bad = 1;
    for (size_t cut = 0; cut < n; cut++) {
        struct moe_safetensors *st = NULL;
        log_reset();
        uint8_t *q = malloc(cut ? cut : 1);
        memcpy(q, p, cut);
        if (moe_safetensors_open_memory(q, cut, "cut", &st) == MOE_OK || g_n_err != 1) all_bad = 0;
        moe_safetensors_free(st);
        free(q);
    }
    CHECK(all_bad, "some truncation of a valid image was accepted");
    free(p);

    /* bad arguments */
    struct moe_safetensors *st = NULL;
    log_reset();
    CHECK(moe_safetensors_open_memory(NULL, 8, "null-buf", &st) == MOE_ERR_INVALID, "NULL buffer");
    CHECK(moe_safetensors_open_memory("", 0, "x", NULL) == MOE_ERR_INVALID, "NULL out");
    CHECK(moe_safetensors_open(NULL, &st) == MOE_ERR_INVALID, "NULL path");
}

/* ------------------------------------------------------------------------- */
/* 2. valid in-memory images                                                  */

/* Opens an image that must be valid; returns the handle or NULL (check logged). */
static struct moe_safetensors *open_good(const char *label, const char *hdr, size_t data_len,
                                         uint8_t **keep) {
    size_t n;
    struct moe_safetensors *st = NULL;
    *keep = build_simple(hdr, data_len, &n);
    log_reset();
    enum moe_status rc = moe_safetensors_open_memory(*keep, n, label, &st);
    CHECK(rc == MOE_OK && st, "[%s] rejected: %s", label, g_err);
    return st;
}

/* Valid corner cases the reader must accept, and what it reports for them. */
static void test_good_memory(void) {
    uint8_t *p;
    struct moe_safetensors *st;

    st = open_good("empty-header", "{}", 0, &p);
    CHECK(moe_safetensors_count(st) == 0, "count");
    CHECK(moe_safetensors_at(st, 0) == NULL, "at(0) of empty");
    CHECK(moe_safetensors_find(st, "a") == NULL, "find in empty");
    CHECK(moe_safetensors_metadata(st, "format") == NULL, "no metadata");
    CHECK(moe_safetensors_n_files(st) == 1, "n_files");
    CHECK(st && strcmp(moe_safetensors_file_path(st, 0), "empty-header") == 0, "file path = label");
    CHECK(moe_safetensors_file_path(st, 1) == NULL, "file path out of range");
    moe_safetensors_free(st);
    free(p);

    st = open_good("space-padded", "{}      ", 0, &p); /* the spec's 0x20 padding */
    moe_safetensors_free(st);
    free(p);
    st = open_good("whitespace", " \t\r\n{ }\n  ", 0, &p);
    moe_safetensors_free(st);
    free(p);

    /* U8: raw bytes (gpt-oss's MXFP4 blocks), one byte per element, any offset */
    st = open_good("u8", "{" TE("blk", "U8", "[2,3]", "1", "7") "," TE("pad", "U8", "[1]", "0", "1") "}", 7, &p);
    if (st) {
        const struct moe_st_tensor *t = moe_safetensors_find(st, "blk");
        CHECK(t && t->dtype == MOE_DTYPE_U8 && t->n_dims == 2 && t->n_elements == 6 && t->nbytes == 6,
              "U8 tensor shape and size");
        float f[6];
        if (t) moe_convert_row_f32(MOE_DTYPE_U8, t->data, f, 6);
        CHECK(t && f[0] == (float)((const uint8_t *)t->data)[0], "U8 converts to its value");
    }
    moe_safetensors_free(st);
    free(p);

    /* F8_E4M3: float8 e4m3fn weights (DeepSeek-V3's FP8 release), one byte per element, any offset */
    st = open_good("f8", "{" TE("w", "F8_E4M3", "[2,2]", "1", "5") "," TE("pad", "U8", "[1]", "0", "1") "}", 5, &p);
    if (st) {
        const struct moe_st_tensor *t = moe_safetensors_find(st, "w");
        CHECK(t && t->dtype == MOE_DTYPE_F8_E4M3 && t->n_dims == 2 && t->n_elements == 4 && t->nbytes == 4,
              "F8_E4M3 tensor shape and size");
        const uint8_t codes[4] = {0x38, 0xc0, 0x7e, 0x01}; /* 1, -2, 448, 2^-9 */
        float f[4] = {0};
        if (t) { /* the image is ours: put the codes where the reader says the tensor lies */
            memcpy((void *)(uintptr_t)t->data, codes, 4);
            moe_convert_row_f32(t->dtype, t->data, f, 4);
        }
        CHECK(f[0] == 1.0f && f[1] == -2.0f && f[2] == 448.0f && f[3] == ldexpf(1.0f, -9), "F8_E4M3 converts");
    }
    moe_safetensors_free(st);
    free(p);

    /* scalar, zero-element tensors (also at the start and end), extra keys ignored,
     * header order differs from offset order, metadata, unaligned F32 */
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"caf\\u00e9 \xE2\x9C\x93\"},"
                      TE("s", "F32", "[]", "6", "10") ","
                      "\"h\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2],\"extra\":[\"x\",1]},"
                      TE("z0", "BF16", "[0]", "0", "0") ","
                      TE("zend", "F32", "[3,0,2]", "14", "14") ","
                      TE("b", "BF16", "[1,2]", "10", "14") ","
                      TE("u", "F32", "[1]", "2", "6") "}";
    st = open_good("mixed", hdr, 14, &p);
    if (st) {
        static const char *const order[] = {"z0", "h", "u", "s", "b", "zend"};
        static const size_t offs[] = {0, 0, 2, 6, 10, 14};
        CHECK(moe_safetensors_count(st) == 6, "count %zu", moe_safetensors_count(st));
        const uint8_t *dbase = p + 8 + strlen(hdr);
        for (size_t i = 0; i < 6; i++) {
            const struct moe_st_tensor *t = moe_safetensors_at(st, i);
            CHECK(t && strcmp(t->name, order[i]) == 0, "at(%zu) = %s, want %s", i, t ? t->name : "-",
                  order[i]);
            CHECK(t && (const uint8_t *)t->data == dbase + offs[i], "at(%zu) data pointer", i);
            CHECK(t && moe_safetensors_find(st, order[i]) == t, "find(%s)", order[i]);
            CHECK(t && t->file_index == 0, "file_index");
        }
        const struct moe_st_tensor *s = moe_safetensors_find(st, "s");
        CHECK(s && s->n_dims == 0 && s->n_elements == 1 && s->nbytes == 4, "scalar");
        const struct moe_st_tensor *z = moe_safetensors_find(st, "zend");
        CHECK(z && z->n_dims == 3 && z->shape[0] == 3 && z->shape[1] == 0 && z->shape[2] == 2 &&
                  z->n_elements == 0 && z->nbytes == 0,
              "zero-element tensor");
        const struct moe_st_tensor *b = moe_safetensors_find(st, "b");
        CHECK(b && b->dtype == MOE_DTYPE_BF16 && b->n_dims == 2 && b->shape[0] == 1 &&
                  b->shape[1] == 2 && b->n_elements == 2 && b->nbytes == 4,
              "bf16 shape");
        const struct moe_st_tensor *u = moe_safetensors_find(st, "u"); /* F32 at offset 2 */
        float uv = 0;
        if (u) memcpy(&uv, u->data, 4); /* unaligned data: read through memcpy */
        CHECK(u && u->dtype == MOE_DTYPE_F32 && u->nbytes == 4 && memcmp(&uv, dbase + 2, 4) == 0,
              "unaligned F32 tensor");
        CHECK(moe_safetensors_find(st, "extra") == NULL && moe_safetensors_find(st, "") == NULL &&
                  moe_safetensors_find(st, "__metadata__") == NULL && moe_safetensors_find(st, NULL) == NULL,
              "find of absent names");
        CHECK(moe_safetensors_at(st, 6) == NULL, "at(count)");
        const char *fmt = moe_safetensors_metadata(st, "format");
        const char *note = moe_safetensors_metadata(st, "note");
        CHECK(fmt && strcmp(fmt, "pt") == 0, "metadata format");
        CHECK(note && strcmp(note, "caf\xC3\xA9 \xE2\x9C\x93") == 0, "metadata note (escapes, UTF-8)");
        CHECK(moe_safetensors_metadata(st, "missing") == NULL, "metadata missing key");
    }
    moe_safetensors_free(st);
    free(p);

    /* the largest exact offset and MOE_ST_MAX_DIMS dims are accepted */
    st = open_good("max-dims", "{" TE("a", "F16", "[1,1,1,1,1,1,1,2]", "0", "4") "}", 4, &p);
    CHECK(st && moe_safetensors_at(st, 0)->n_dims == 8, "8 dims");
    moe_safetensors_free(st);
    free(p);

    /* names with escapes and non-ASCII, including a surrogate pair */
    st = open_good("escaped-names",
                   "{" TE("a\\u00E9\\ud83d\\uDE00", "F32", "[1]", "0", "4") ","
                   TE("q\\\"\\\\/", "F32", "[1]", "4", "8") "}",
                   8, &p);
    CHECK(moe_safetensors_find(st, "a\xC3\xA9\xF0\x9F\x98\x80") != NULL, "find decoded name");
    CHECK(moe_safetensors_find(st, "q\"\\/") != NULL, "find escaped name");
    moe_safetensors_free(st);
    free(p);

    /* 10^4 tensors listed in reverse offset order: at() sorts, find() finds all */
    enum { N = 10000 };
    size_t cap = (size_t)N * 96 + 16, len = 0;
    char *big = malloc(cap);
    len += (size_t)snprintf(big + len, cap - len, "{");
    for (int i = N - 1; i >= 0; i--)
        len += (size_t)snprintf(big + len, cap - len,
                                "%s\"layers.%d.w\":{\"dtype\":\"F16\",\"shape\":[2],"
                                "\"data_offsets\":[%d,%d]}",
                                i == N - 1 ? "" : ",", i, 4 * i, 4 * i + 4);
    snprintf(big + len, cap - len, "}");
    st = open_good("many", big, 4 * N, &p);
    if (st) {
        int ok = moe_safetensors_count(st) == N;
        for (int i = 0; i < N && ok; i++) {
            char name[32];
            snprintf(name, sizeof name, "layers.%d.w", i);
            const struct moe_st_tensor *t = moe_safetensors_find(st, name);
            ok = t && t == moe_safetensors_at(st, (size_t)i) && strcmp(t->name, name) == 0 &&
                 t->nbytes == 4;
        }
        CHECK(ok, "10^4 tensors: count, order and lookup");
    }
    moe_safetensors_free(st);
    free(p);
    free(big);

    CHECK(moe_safetensors_count(NULL) == 0 && moe_safetensors_at(NULL, 0) == NULL &&
              moe_safetensors_find(NULL, "a") == NULL && moe_safetensors_metadata(NULL, "a") == NULL &&
              moe_safetensors_n_files(NULL) == 0 && moe_safetensors_file_path(NULL, 0) == NULL,
          "NULL handle accessors");
    moe_safetensors_free(NULL);
}

/* ------------------------------------------------------------------------- */
/* 3. files and directories                                                   */

/* Writes len bytes to dir/name (or to name if dir is NULL). */
static void write_file(const char *dir, const char *name, const void *p, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s%s%s", dir ? dir : "", dir ? "/" : "", name);
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(p, 1, len, f) != len)) {
        fprintf(stderr, "cannot write %s\n", path);
        abort();
    }
    fclose(f);
}

/* Writes a string to dir/name. */
static void write_text(const char *dir, const char *name, const char *s) {
    write_file(dir, name, s, strlen(s));
}

/* Makes dir/name a directory. */
static void make_dir(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (mkdir(path, 0755) != 0) {
        fprintf(stderr, "cannot create %s\n", path);
        abort();
    }
}

/* nftw callback that removes one entry of the temp tree. */
static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Valid image of named F32 tensors of n floats each, in the given order. */
static uint8_t *f32_image(const char *const *names, const int *counts, int n_tensors, size_t *len) {
    char hdr[4096];
    size_t h = 0, off = 0;
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n_tensors; i++) {
        h += (size_t)snprintf(hdr + h, sizeof hdr - h,
                              ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                              names[i], counts[i], off, off + 4 * (size_t)counts[i]);
        off += 4 * (size_t)counts[i];
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    while (h % 8) hdr[h++] = ' ';
    hdr[h] = 0;
    float *data = malloc(off ? off : 1);
    for (size_t i = 0; i < off / 4; i++) data[i] = (float)i + 0.5f;
    uint8_t *p = build(hdr, h, h, data, off, len);
    free(data);
    return p;
}

/* Opens path, which must fail with want (or any error if want == MOE_OK), logging
 * an error that contains both `names` and `expect`. */
static void expect_open_fail(const char *what, const char *path, enum moe_status want,
                             const char *names, const char *expect) {
    struct moe_safetensors *st = (struct moe_safetensors *)1;
    log_reset();
    enum moe_status rc = moe_safetensors_open(path, &st);
    CHECK(rc != MOE_OK && (want == MOE_OK || rc == want), "[%s] status %d (%s), want %d", what, rc,
          moe_status_str(rc), want);
    CHECK(st == NULL, "[%s] handle not cleared", what);
    CHECK(strstr(g_err, names) != NULL, "[%s] message does not name %s: %s", what, names, g_err);
    CHECK(strstr(g_err, expect) != NULL, "[%s] expected \"%s\" in: %s", what, expect, g_err);
    if (rc == MOE_OK) moe_safetensors_free(st);
}

/* Writes dir/model.safetensors.index.json with the given weight_map body. */
static void write_index(const char *dir, const char *weight_map_body) {
    char buf[8192];
    snprintf(buf, sizeof buf, "{\"metadata\":{\"total_size\":36},\"weight_map\":{%s}}",
             weight_map_body);
    write_text(dir, "model.safetensors.index.json", buf);
}

/* Creates root/name holding the two standard shards (a, b | c). */
static char *make_sharded(const char *root, const char *name, const uint8_t *s1, size_t n1,
                          const uint8_t *s2, size_t n2) {
    static char path[4096];
    make_dir(root, name);
    snprintf(path, sizeof path, "%s/%s", root, name);
    write_file(path, "shard-1.safetensors", s1, n1);
    write_file(path, "shard-2.safetensors", s2, n2);
    return path;
}

/* Single file with F32, F16 and BF16 tensors: values, shapes and bytes survive. */
static void test_single_file(const char *root) {
    const float f32[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, -7.0f};
    const float f16v[4] = {1.0f, -2.0f, 0.5f, 65504.0f};
    const float bf16v[4] = {1.0f, -3.0f, 0.25f, 1e10f};
    uint8_t data[40];
    memcpy(data, f32, 24);
    for (int i = 0; i < 4; i++) {
        uint16_t h = moe_f32_to_f16(f16v[i]), b = moe_f32_to_bf16(bf16v[i]);
        memcpy(data + 24 + 2 * i, &h, 2);
        memcpy(data + 32 + 2 * i, &b, 2);
    }
    char hdr[512] = "{\"__metadata__\":{\"format\":\"pt\"},"
                    TE("w32", "F32", "[2,3]", "0", "24") "," TE("w16", "F16", "[4]", "24", "32") ","
                    TE("wbf", "BF16", "[2,2]", "32", "40") "}";
    size_t h = strlen(hdr), n;
    while (h % 8) hdr[h++] = ' ';
    hdr[h] = 0;
    uint8_t *img = build(hdr, h, h, data, sizeof data, &n);
    char path[4096];
    snprintf(path, sizeof path, "%s/single.safetensors", root);
    write_file(NULL, path, img, n);

    struct moe_safetensors *st = NULL;
    log_reset();
    enum moe_status rc = moe_safetensors_open(path, &st);
    CHECK(rc == MOE_OK, "open %s: %s", path, g_err);
    if (rc == MOE_OK) {
        const struct moe_st_tensor *a = moe_safetensors_find(st, "w32");
        const struct moe_st_tensor *b = moe_safetensors_find(st, "w16");
        const struct moe_st_tensor *c = moe_safetensors_find(st, "wbf");
        CHECK(moe_safetensors_count(st) == 3 && moe_safetensors_n_files(st) == 1, "count/files");
        CHECK(strcmp(moe_safetensors_file_path(st, 0), path) == 0, "file path");
        CHECK(a && a->dtype == MOE_DTYPE_F32 && a->n_dims == 2 && a->shape[0] == 2 &&
                  a->shape[1] == 3 && a->n_elements == 6 && a->nbytes == 24 &&
                  memcmp(a->data, f32, 24) == 0,
              "F32 round trip");
        CHECK(b && b->dtype == MOE_DTYPE_F16 && b->n_dims == 1 && b->shape[0] == 4 &&
                  b->nbytes == 8 && memcmp(b->data, data + 24, 8) == 0,
              "F16 bytes");
        CHECK(c && c->dtype == MOE_DTYPE_BF16 && c->n_dims == 2 && c->shape[0] == 2 &&
                  c->shape[1] == 2 && c->n_elements == 4 && memcmp(c->data, data + 32, 8) == 0,
              "BF16 bytes");
        if (b && c) {
            float fb[4], fc[4];
            moe_convert_row_f32(MOE_DTYPE_F16, b->data, fb, 4);
            moe_convert_row_f32(MOE_DTYPE_BF16, c->data, fc, 4);
            CHECK(memcmp(fb, f16v, sizeof fb) == 0, "F16 values");
            CHECK(fc[0] == 1.0f && fc[1] == -3.0f && fc[2] == 0.25f && fc[3] > 9.9e9f && fc[3] < 1.01e10f,
                  "BF16 values");
        }
        CHECK(moe_safetensors_at(st, 0) == a && moe_safetensors_at(st, 2) == c, "offset order");
        const char *fmt = moe_safetensors_metadata(st, "format");
        CHECK(fmt && strcmp(fmt, "pt") == 0, "metadata");
    }
    moe_safetensors_free(st);

    /* a model directory holding model.safetensors */
    make_dir(root, "m-single");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/m-single", root);
    write_file(dir, "model.safetensors", img, n);
    log_reset();
    rc = moe_safetensors_open(dir, &st);
    CHECK(rc == MOE_OK && moe_safetensors_count(st) == 3 &&
              strstr(moe_safetensors_file_path(st, 0), "model.safetensors") != NULL,
          "directory with model.safetensors: %s", g_err);
    moe_safetensors_free(st);

    /* truncated and empty files, missing path, empty directory */
    char p2[4096];
    snprintf(p2, sizeof p2, "%s/trunc.safetensors", root);
    write_file(NULL, p2, img, n / 2);
    expect_open_fail("truncated", p2, MOE_ERR_FORMAT, p2, "past the end");
    snprintf(p2, sizeof p2, "%s/trunc8.safetensors", root);
    write_file(NULL, p2, img, 8 + h);
    expect_open_fail("data missing", p2, MOE_ERR_FORMAT, p2, "exceeds the file");
    snprintf(p2, sizeof p2, "%s/empty.safetensors", root);
    write_file(NULL, p2, "", 0);
    expect_open_fail("empty file", p2, MOE_ERR_FORMAT, p2, "too short");
    snprintf(p2, sizeof p2, "%s/nonexistent.safetensors", root);
    expect_open_fail("missing path", p2, MOE_ERR_NOT_FOUND, p2, "No such file");
    make_dir(root, "m-empty");
    snprintf(p2, sizeof p2, "%s/m-empty", root);
    write_text(p2, "config.json", "{}");
    expect_open_fail("empty dir", p2, MOE_ERR_NOT_FOUND, p2, "no safetensors found");
    free(img);
}

/* Sharded model directories with model.safetensors.index.json. */
static void test_sharded(const char *root) {
    static const char *const n1[] = {"a", "b"}, *const n2[] = {"c"}, *const n3[] = {"a"};
    static const int c1[] = {3, 2}, c2[] = {4}, c3[] = {1};
    size_t l1, l2, l3;
    uint8_t *s1 = f32_image(n1, c1, 2, &l1), *s2 = f32_image(n2, c2, 1, &l2);
    uint8_t *s3 = f32_image(n3, c3, 1, &l3);
    const char *ok_map = "\"a\":\"shard-1.safetensors\",\"c\":\"shard-2.safetensors\","
                         "\"b\":\"shard-1.safetensors\"";
    struct moe_safetensors *st = NULL;
    char *dir, ipath[4096];

    dir = make_sharded(root, "m-shard", s1, l1, s2, l2);
    write_index(dir, ok_map);
    write_file(dir, "model.safetensors", "junk", 4); /* the index wins */
    log_reset();
    enum moe_status rc = moe_safetensors_open(dir, &st);
    CHECK(rc == MOE_OK, "sharded open: %s", g_err);
    if (rc == MOE_OK) {
        const struct moe_st_tensor *a = moe_safetensors_find(st, "a"), *b = moe_safetensors_find(st, "b"),
                                   *c = moe_safetensors_find(st, "c");
        CHECK(moe_safetensors_count(st) == 3 && moe_safetensors_n_files(st) == 2, "sharded counts");
        CHECK(a && b && c && a->file_index == 0 && b->file_index == 0 && c->file_index == 1,
              "file_index");
        CHECK(moe_safetensors_at(st, 0) == a && moe_safetensors_at(st, 1) == b &&
                  moe_safetensors_at(st, 2) == c,
              "(file, offset) order");
        CHECK(c && c->shape[0] == 4 && ((const float *)c->data)[3] == 3.5f, "shard 2 data");
        CHECK(strstr(moe_safetensors_file_path(st, 1), "shard-2.safetensors") != NULL, "shard path");
        CHECK(g_n_warn == 0, "no warnings: %s", g_warn);
    }
    moe_safetensors_free(st);

    /* the index file itself may be given instead of the directory */
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    log_reset();
    rc = moe_safetensors_open(ipath, &st);
    CHECK(rc == MOE_OK && moe_safetensors_count(st) == 3 && moe_safetensors_n_files(st) == 2,
          "open via the index path: %s", g_err);
    moe_safetensors_free(st);

    /* a tensor in a shard but not in the weight_map is only a warning */
    dir = make_sharded(root, "m-unmapped", s1, l1, s2, l2);
    write_index(dir, "\"a\":\"shard-1.safetensors\",\"c\":\"shard-2.safetensors\"");
    log_reset();
    rc = moe_safetensors_open(dir, &st);
    CHECK(rc == MOE_OK && moe_safetensors_count(st) == 3, "unmapped tensor accepted: %s", g_err);
    CHECK(g_n_warn == 1 && strstr(g_warn, "not in weight_map") && strstr(g_warn, "first: b"),
          "unmapped tensor warning: %s", g_warn);
    moe_safetensors_free(st);

    /* two spellings of one shard open it once */
    dir = make_sharded(root, "m-alias", s1, l1, s2, l2);
    write_index(dir, "\"a\":\"shard-1.safetensors\",\"b\":\"./shard-1.safetensors\","
                     "\"c\":\"sub//../shard-2.safetensors\"");
    expect_open_fail("dotdot after dir", dir, MOE_ERR_FORMAT, "sub//../shard-2", "\"..\"");
    write_index(dir, "\"a\":\"shard-1.safetensors\",\"b\":\"./shard-1.safetensors\","
                     "\"c\":\"shard-2.safetensors\"");
    log_reset();
    rc = moe_safetensors_open(dir, &st);
    CHECK(rc == MOE_OK && moe_safetensors_n_files(st) == 2, "aliased shard opened once: %s", g_err);
    moe_safetensors_free(st);

    /* a symlink that stays inside the directory is fine */
    dir = make_sharded(root, "m-link-in", s1, l1, s2, l2);
    make_dir(dir, "blobs");
    char target[4096], link[4096];
    snprintf(target, sizeof target, "%s/blobs/x", dir);
    write_file(NULL, target, s2, l2);
    snprintf(link, sizeof link, "%s/link.safetensors", dir);
    CHECK(symlink("blobs/x", link) == 0, "symlink");
    write_index(dir, "\"a\":\"shard-1.safetensors\",\"b\":\"shard-1.safetensors\","
                     "\"c\":\"link.safetensors\"");
    log_reset();
    rc = moe_safetensors_open(dir, &st);
    CHECK(rc == MOE_OK, "symlink inside the directory: %s", g_err);
    moe_safetensors_free(st);

    /* failures */
    char evil[4096];
    snprintf(evil, sizeof evil, "%s/evil.safetensors", root);
    write_file(NULL, evil, s2, l2); /* a valid file, so only the path check can stop it */

    dir = make_sharded(root, "m-missing", s1, l1, s2, l2);
    write_index(dir, "\"a\":\"shard-1.safetensors\",\"b\":\"shard-1.safetensors\","
                     "\"c\":\"shard-9.safetensors\"");
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    expect_open_fail("missing shard", dir, MOE_ERR_NOT_FOUND, "shard-9.safetensors", "does not exist");
    expect_open_fail("missing shard (index named)", dir, MOE_ERR_NOT_FOUND, ipath, "weight_map");

    dir = make_sharded(root, "m-dotdot", s1, l1, s2, l2);
    write_index(dir, "\"a\":\"shard-1.safetensors\",\"b\":\"shard-1.safetensors\","
                     "\"c\":\"../evil.safetensors\"");
    expect_open_fail("../ shard", dir, MOE_ERR_FORMAT, "../evil.safetensors", "\"..\" component");

    dir = make_sharded(root, "m-abs", s1, l1, s2, l2);
    char body[8192];
    snprintf(body, sizeof body,
             "\"a\":\"shard-1.safetensors\",\"b\":\"shard-1.safetensors\",\"c\":\"%s\"", evil);
    write_index(dir, body);
    expect_open_fail("absolute shard", dir, MOE_ERR_FORMAT, evil, "absolute path");

    dir = make_sharded(root, "m-link-out", s1, l1, s2, l2);
    snprintf(link, sizeof link, "%s/out.safetensors", dir);
    CHECK(symlink("../evil.safetensors", link) == 0, "symlink");
    write_index(dir, "\"a\":\"shard-1.safetensors\",\"b\":\"shard-1.safetensors\","
                     "\"c\":\"out.safetensors\"");
    {   /* accepted: the Hugging Face hub cache links snapshot shards into ../../blobs */
        struct moe_safetensors *hub = NULL;
        CHECK(moe_safetensors_open(dir, &hub) == MOE_OK, "symlinked shard outside the directory: %s", g_err);
        CHECK(hub && moe_safetensors_find(hub, "c") != NULL, "tensor from the symlinked shard");
        moe_safetensors_free(hub);
    }

    dir = make_sharded(root, "m-badjson", s1, l1, s2, l2);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": ");
    expect_open_fail("index not JSON", dir, MOE_ERR_FORMAT, "index.json", "not valid JSON");
    write_text(dir, "model.safetensors.index.json", "{\"metadata\":{}}");
    expect_open_fail("index without weight_map", dir, MOE_ERR_FORMAT, "index.json", "weight_map");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{}}");
    expect_open_fail("empty weight_map", dir, MOE_ERR_FORMAT, "index.json", "non-empty \"weight_map\"");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":[\"shard-1.safetensors\"]}");
    expect_open_fail("weight_map array", dir, MOE_ERR_FORMAT, "index.json", "weight_map");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"a\":1}}");
    expect_open_fail("weight_map value", dir, MOE_ERR_FORMAT, "index.json", "entry a is not a string");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"\"}}");
    expect_open_fail("empty shard name", dir, MOE_ERR_FORMAT, "index.json", "empty shard");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"\xC0\xAF\"}}");
    expect_open_fail("index not UTF-8", dir, MOE_ERR_FORMAT, "index.json", "UTF-8");

    dir = make_sharded(root, "m-wrong-shard", s1, l1, s2, l2);
    write_index(dir, "\"a\":\"shard-2.safetensors\",\"b\":\"shard-1.safetensors\","
                     "\"c\":\"shard-2.safetensors\"");
    expect_open_fail("tensor in another shard", dir, MOE_ERR_FORMAT, "shard-1.safetensors",
                     "maps tensor a to shard shard-2.safetensors, which does not contain it");
    write_index(dir, "\"a\":\"shard-1.safetensors\",\"zzz\":\"shard-2.safetensors\"");
    expect_open_fail("mapped tensor absent", dir, MOE_ERR_FORMAT, "index.json",
                     "maps tensor zzz to shard shard-2.safetensors, which does not contain it");

    dir = make_sharded(root, "m-dup", s1, l1, s3, l3);
    write_index(dir, "\"a\":\"shard-1.safetensors\",\"b\":\"shard-1.safetensors\","
                     "\"c\":\"shard-2.safetensors\"");
    expect_open_fail("tensor in two shards", dir, MOE_ERR_FORMAT, "shard-2.safetensors",
                     "duplicate tensor name a: in both");

    dir = make_sharded(root, "m-bad-shard", s1, l1, s2, l2 - 4);
    write_index(dir, ok_map);
    expect_open_fail("truncated shard", dir, MOE_ERR_FORMAT, "shard-2.safetensors", "exceeds the file");

    dir = make_sharded(root, "m-dir-shard", s1, l1, s2, l2);
    make_dir(dir, "d.safetensors");
    write_index(dir, "\"a\":\"shard-1.safetensors\",\"b\":\"shard-1.safetensors\","
                     "\"c\":\"d.safetensors\"");
    expect_open_fail("shard is a directory", dir, MOE_ERR_IO, "d.safetensors", "not a regular file");

    free(s1);
    free(s2);
    free(s3);
}

/* Files and directories under a fresh mkdtemp() directory, removed afterwards. */
static void test_files(void) {
    char tmpl[] = "/tmp/test-safetensors-XXXXXX";
    char *root = mkdtemp(tmpl);
    CHECK(root != NULL, "mkdtemp");
    if (!root) return;
    test_single_file(root);
    test_sharded(root);
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ------------------------------------------------------------------------- */
/* 4. the committed stories260K model                                         */

/* Opens ../shared/models/stories260K (relative to the repository root) if it
 * is there and checks the llama2.c shapes. Returns 0 if skipped. */
static int test_stories260k(void) {
    char path[4096];
    const char *env = getenv("MOE_STORIES260K");
    const char *fx = MOE_FIXTURES; /* <repo>/tests/fixtures, which may not exist */
    const char *tail = strstr(fx, "/tests/fixtures");
    if (env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        int repo_len = tail ? (int)(tail - fx) : (int)strlen(fx);
        snprintf(path, sizeof path, "%.*s/../shared/models/stories260K/stories260K.safetensors",
                 repo_len, fx);
    }
    if (access(path, R_OK) != 0) {
        printf("test-safetensors: note: %s not found, stories260K check skipped\n", path);
        return 0;
    }
    struct moe_safetensors *st = NULL;
    log_reset();
    enum moe_status rc = moe_safetensors_open(path, &st);
    CHECK(rc == MOE_OK, "open %s: %s", path, g_err);
    if (rc != MOE_OK) return 1;
    static const struct {
        const char *name;
        int n_dims;
        int64_t d0, d1;
    } want[] = {
        {"tok_embeddings.weight", 2, 512, 64},
        {"norm.weight", 1, 64, 0},
        {"layers.0.attention.wq.weight", 2, 64, 64},
        {"layers.0.attention.wk.weight", 2, 32, 64},
        {"layers.4.feed_forward.w1.weight", 2, 172, 64},
        {"layers.4.feed_forward.w2.weight", 2, 64, 172},
        {"layers.2.ffn_norm.weight", 1, 64, 0},
    };
    CHECK(moe_safetensors_count(st) == 47, "stories260K has %zu tensors, want 47",
          moe_safetensors_count(st));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct moe_st_tensor *t = moe_safetensors_find(st, want[i].name);
        CHECK(t && t->dtype == MOE_DTYPE_F32 && t->n_dims == want[i].n_dims &&
                  t->shape[0] == want[i].d0 && (want[i].n_dims == 1 || t->shape[1] == want[i].d1),
              "stories260K %s", want[i].name);
    }
    const struct moe_st_tensor *t = moe_safetensors_find(st, "norm.weight");
    if (t) {
        float w[64];
        memcpy(w, t->data, sizeof w);
        int finite = 1;
        for (int i = 0; i < 64; i++) finite &= w[i] == w[i] && w[i] > -100 && w[i] < 100;
        CHECK(finite, "norm.weight values plausible");
    }
    const char *fmt = moe_safetensors_metadata(st, "format");
    CHECK(fmt && strcmp(fmt, "pt") == 0, "stories260K metadata format");
    /* the tensors cover the data region exactly: file size - 8 - header length */
    uint8_t len8[8] = {0};
    long fsize = -1;
    FILE *f = fopen(path, "rb");
    if (f && fread(len8, 1, 8, f) == 8 && fseek(f, 0, SEEK_END) == 0) fsize = ftell(f);
    if (f) fclose(f);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | len8[i];
    size_t total = 0;
    for (size_t i = 0; i < moe_safetensors_count(st); i++) total += moe_safetensors_at(st, i)->nbytes;
    CHECK(fsize > 0 && (uint64_t)total == (uint64_t)fsize - 8 - hlen,
          "stories260K data region covered: %zu of %ld - 8 - %llu", total, fsize,
          (unsigned long long)hlen);
    moe_safetensors_free(st);
    return 1;
}

int main(void) {
    moe_log_set(capture, NULL);
    moe_log_set_level(MOE_LOG_DEBUG);
    test_bad_table();
    test_good_memory();
    test_files();
    int stories = test_stories260k();
    moe_log_set(NULL, NULL);
    printf("test-safetensors: %d checks, %d failed (%zu malformed rows%s)\n", checks, fails,
           sizeof bad_rows / sizeof bad_rows[0], stories ? ", stories260K checked" : ", stories260K skipped");
    return fails ? 1 : 0;
}

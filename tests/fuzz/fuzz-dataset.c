/*
 * fuzz-dataset.c - libFuzzer target for the dataset readers (datasets/):
 * the text, JSONL, JSON-array and CSV/TSV readers, gzip detection and inflate,
 * and the spec grammar.
 *
 * Input layout: byte 0 picks the reader and its field selection (table below),
 * byte 1 the options (bit 0 skip_bad, bit 1 replace invalid UTF-8, bits 2-7 the
 * read buffer size 1..64, so records straddle reads), the rest is the data
 * (gzip-compressed or not; the magic bytes decide). Byte 0 = 0xff instead
 * parses the rest as a dataset spec string (cards are read if named).
 *
 * Every record handed out is checked: NUL-terminated at len, no NUL inside,
 * valid UTF-8, at most max_record_bytes; counts agree. Any violation aborts.
 *
 * Run the fuzzer: build with -DMOE_BUILD_FUZZ=ON (clang, libFuzzer;
 * docs/fuzzing.md), then
 *
 *   build-fuzz/tests/fuzz-dataset -jobs=1 -max_total_time=600 -max_len=4096 /tmp/ds-corpus tests/fuzz/corpus/dataset
 *
 * New inputs go to /tmp/ds-corpus (the first directory); copy small interesting
 * ones (and any crash-* file, after fixing the bug) into tests/fuzz/corpus/dataset,
 * which ctest replays through replay-main.c (fuzz-dataset-replay) without libFuzzer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe-dataset.h"

/* Log sink that drops messages: the fuzzer produces millions of errors. */
static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level;
    (void)msg;
    (void)user;
}

/* The readers byte 0 chooses from (modulo the table size). */
static const char *const g_formats[] = {
    "text",                                /* chunks */
    "text:para",
    "text:line",
    "jsonl",                               /* field "text" */
    "jsonl:question,answer?",
    "jsonl:conversations,n?",
    "json:instruction,input?,output",
    "json:conversations",
    "csv:Question,Best Answer?",
    "csv:a,b",
    "tsv:a,b?",
    "json:text,x?",
};

/* 1 if s[0..n) is valid UTF-8 without NUL (the reader's promise). */
static int utf8_ok(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], k;
        if (c == 0) return 0;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) k = 1;
        else if (c >= 0xe0 && c <= 0xef) k = 2;
        else if (c >= 0xf0 && c <= 0xf4) k = 3;
        else return 0;
        if (i + k >= n) return 0; /* runs past the end */
        for (unsigned j = 1; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return 0;
        unsigned cp = k == 1 ? (c & 0x1f) << 6 | (s[i + 1] & 0x3f)
                    : k == 2 ? (c & 0x0f) << 12 | (s[i + 1] & 0x3fu) << 6 | (s[i + 2] & 0x3f)
                             : (c & 0x07) << 18 | (s[i + 1] & 0x3fu) << 12 | (s[i + 2] & 0x3fu) << 6 |
                                   (s[i + 3] & 0x3f);
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}

/* One fuzz input: a reader run over the data, or a spec parse; aborts on a broken promise. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        moe_log_set(quiet, NULL);
        init = 1;
    }
    if (size < 2) return 0;
    if (data[0] == 0xff) { /* the spec grammar */
        char *spec = malloc(size);
        if (!spec) return 0;
        memcpy(spec, data + 1, size - 1);
        spec[size - 1] = 0;
        struct moe_dataset_spec *s = NULL;
        if (moe_dataset_spec_parse(spec, &s) == MOE_OK) {
            if (!s || !s->path || (s->format != MOE_DATASET_TEXT && s->n_fields < 1)) abort();
            for (int i = 0; i < s->n_fields; i++)
                if (!s->fields[i] || !s->fields[i][0]) abort();
        } else if (s) {
            abort();
        }
        moe_dataset_spec_free(s);
        free(spec);
        return 0;
    }
    const char *format = g_formats[data[0] % (sizeof g_formats / sizeof *g_formats)];
    struct moe_dataset_params p = moe_dataset_default_params();
    p.skip_bad = data[1] & 1;
    p.replace_invalid_utf8 = (data[1] >> 1) & 1;
    p.buffer_bytes = (size_t)(data[1] >> 2) + 1;
    p.max_record_bytes = 1024;
    p.text_chunk_bytes = 64;
    struct moe_dataset *d = NULL;
    if (moe_dataset_open_memory(format, data + 2, size - 2, "fuzz", &p, &d) != MOE_OK) {
        if (d) abort(); /* the handle must be cleared on error */
        return 0;
    }
    const char *t;
    size_t n;
    int64_t count = 0;
    enum moe_status st;
    while ((st = moe_dataset_next(d, &t, &n)) == MOE_OK && t) {
        if (n == 0 || n > p.max_record_bytes || t[n] != 0 || strlen(t) != n) abort();
        if (!utf8_ok((const unsigned char *)t, n)) abort();
        count++;
    }
    if (st == MOE_OK && t) abort();
    if (moe_dataset_records(d) != count) abort();
    if (moe_dataset_skipped(d) && !p.skip_bad) abort();
    if (st != MOE_OK && moe_dataset_next(d, &t, &n) != st) abort(); /* errors are sticky */
    moe_dataset_free(d);
    return 0;
}

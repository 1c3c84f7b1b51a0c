/*
 * fuzz-tokenizer.c - libFuzzer target for runtime/tokenizer/tokenizer-*.c.
 *
 * The first byte picks what the rest of the input is:
 *   0..199    text, encoded by one of the fixture tokenizers (first byte % count) with and
 *             without special tokens, then decoded with and without skipping them. Every id
 *             must be in range, and for the byte-level fixtures decoding must give back the
 *             NFC form of the (U+FFFD-repaired) text exactly;
 *   200..239  little-endian int32 ids of any value, decoded by a fixture tokenizer;
 *   240..255  a tokenizer.json; if it loads, a fixed sample is encoded and decoded with it.
 *
 * The fixtures are found through $MOE_TOKENIZER_FIXTURES or next to this source file
 * (tests/fixtures/tokenizers). Build with clang -fsanitize=fuzzer,address, or link with
 * replay-main.c to run the corpus in tests/fuzz/corpus/tokenizer as an ordinary test.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "moe-tokenizer.h"

#define MAX_TOKS 8

static struct moe_tokenizer *g_tok[MAX_TOKS];
static int g_bytelevel[MAX_TOKS]; /* decode(encode(x)) == NFC(x) must hold */
static int g_n_tok = -1;

/* silent: the fuzzer feeds broken JSON on purpose; keep the log quiet. */
static void silent(enum moe_log_level level, const char *msg, void *user) {
    (void)level;
    (void)msg;
    (void)user;
}

/* fixtures_dir: $MOE_TOKENIZER_FIXTURES, else tests/fixtures/tokenizers beside this file. */
static void fixtures_dir(char *out, size_t cap) {
    const char *env = getenv("MOE_TOKENIZER_FIXTURES");
    if (env) {
        snprintf(out, cap, "%s", env);
        return;
    }
    const char *me = __FILE__, *cut = strstr(me, "fuzz/fuzz-tokenizer.c");
    int keep = cut ? (int)(cut - me) : 0;
    snprintf(out, cap, "%.*sfixtures/tokenizers", keep, me);
}

/* load_fixtures: load the fixture tokenizers once per process. */
static void load_fixtures(void) {
    static const struct {
        const char *name;
        int bytelevel;
    } variants[] = {{"qwen-bytelevel", 1}, {"neox-bytelevel", 1}, {"llama-spbpe", 0},
                    {"phi-spbpe", 0},      {"misc-bpe", 0},       {"split-bpe", 0}};
    char dir[4096], path[4352];
    g_n_tok = 0;
    moe_log_set(silent, NULL);
    fixtures_dir(dir, sizeof dir);
    for (size_t i = 0; i < sizeof variants / sizeof variants[0] && g_n_tok < MAX_TOKS; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, variants[i].name);
        if (moe_tokenizer_load(path, &g_tok[g_n_tok]) == MOE_OK) g_bytelevel[g_n_tok++] = variants[i].bytelevel;
    }
    if (g_n_tok == 0) fprintf(stderr, "fuzz-tokenizer: no fixture tokenizers under %s; only JSON mode runs\n", dir);
}

/* check_ids: every id a tokenizer returns exists in its vocabulary. */
static void check_ids(const struct moe_tokenizer *tok, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= moe_tokenizer_n_vocab(tok)) abort();
}

/* repaired_nfc: what a byte-level tokenizer must decode back to: the input with invalid
 * UTF-8 replaced by U+FFFD (as the encoder does), then NFC-normalized. malloc'd. */
static char *repaired_nfc(const uint8_t *s, size_t n, size_t *out_len) {
    uint8_t *fixed = malloc(n * 3 + 1), *nfc = NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t used = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (used > 0) {
            memcpy(fixed + k, s + i, (size_t)used);
            k += (size_t)used;
            i += (size_t)used;
            continue;
        }
        /* one U+FFFD per maximal invalid prefix, as from_utf8_lossy */
        size_t bad = 1;
        uint8_t c = s[i];
        size_t need = c >= 0xF0 && c <= 0xF4 ? 3 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xC2 && c <= 0xDF ? 1 : 0;
        uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        while (bad <= need && i + bad < n && s[i + bad] >= lo && s[i + bad] <= hi) {
            bad++;
            lo = 0x80;
            hi = 0xBF;
        }
        memcpy(fixed + k, "\xEF\xBF\xBD", 3);
        k += 3;
        i += bad;
    }
    utf8proc_ssize_t m = utf8proc_map(fixed, (utf8proc_ssize_t)k, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    free(fixed);
    if (m < 0) abort();
    *out_len = (size_t)m;
    return (char *)nfc;
}

/* fuzz_text: encode and decode with one fixture tokenizer. */
static void fuzz_text(int which, const uint8_t *data, size_t size) {
    const struct moe_tokenizer *tok = g_tok[which];
    for (int add = 0; add <= 1; add++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (moe_tokenizer_encode(tok, (const char *)data, size, add, &ids, &n) != MOE_OK) abort();
        check_ids(tok, ids, n);
        for (int skip = 0; skip <= 1; skip++) {
            char *text = NULL;
            size_t len = 0;
            if (moe_tokenizer_decode(tok, ids, n, skip, &text, &len) != MOE_OK) abort();
            if (g_bytelevel[which] && !add && !skip) {
                size_t want_len;
                char *want = repaired_nfc(data, size, &want_len);
                if (want_len != len || memcmp(want, text, len) != 0) abort();
                free(want);
            }
            free(text);
        }
        free(ids);
    }
}

/* fuzz_ids: decode arbitrary int32 values. */
static void fuzz_ids(int which, const uint8_t *data, size_t size) {
    size_t n = size / 4;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)data[4 * i] | (uint32_t)data[4 * i + 1] << 8 | (uint32_t)data[4 * i + 2] << 16 |
                     (uint32_t)data[4 * i + 3] << 24;
        /* mostly small ids, so that real tokens come up */
        ids[i] = (data[4 * i + 3] & 0x80) ? (int32_t)v : (int32_t)(v % 1100);
    }
    for (int skip = 0; skip <= 1; skip++) {
        char *text = NULL;
        if (moe_tokenizer_decode(g_tok[which], ids, n, skip, &text, NULL) != MOE_OK) abort();
        free(text);
    }
    free(ids);
}

/* fuzz_json: the input as a tokenizer.json. */
static void fuzz_json(const uint8_t *data, size_t size) {
    struct moe_tokenizer *tok = NULL;
    if (moe_tokenizer_load_json((const char *)data, size, "fuzz", &tok) != MOE_OK) {
        if (tok) abort();
        return;
    }
    static const char sample[] = "Hello  world!\n\tcode(x) 3.14 \xe4\xb8\xad\xe6\x96\x87 <s></s><|endoftext|> \xff end";
    int32_t *ids = NULL;
    size_t n = 0;
    if (moe_tokenizer_encode(tok, sample, sizeof sample - 1, 1, &ids, &n) == MOE_OK) {
        check_ids(tok, ids, n);
        char *text = NULL;
        if (moe_tokenizer_decode(tok, ids, n, 0, &text, NULL) != MOE_OK) abort();
        free(text);
        free(ids);
    }
    (void)moe_tokenizer_bos(tok);
    (void)moe_tokenizer_eos(tok);
    for (int32_t id = -1; id <= moe_tokenizer_n_vocab(tok) && id < 64; id++) {
        const char *s = moe_tokenizer_token(tok, id);
        if (s && moe_tokenizer_find(tok, s) < 0) abort();
        (void)moe_tokenizer_is_special(tok, id);
    }
    moe_tokenizer_free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (g_n_tok < 0) load_fixtures();
    if (size < 1) return 0;
    uint8_t mode = data[0];
    if (mode >= 240) fuzz_json(data + 1, size - 1);
    else if (g_n_tok == 0) return 0;
    else if (mode >= 200) fuzz_ids(mode % g_n_tok, data + 1, size - 1);
    else fuzz_text(mode % g_n_tok, data + 1, size - 1);
    return 0;
}

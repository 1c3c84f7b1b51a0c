/*
 * test-tokenizer.c - runtime/tokenizer/tokenizer-*.c against the Hugging Face tokenizers library.
 *
 * Every directory under fixtures/tokenizers/ holds a tokenizer.json (+ tokenizer_config.json)
 * and cases.json, written by tests/oracle/make_tokenizer_fixtures.py with the ids and decoded
 * strings that the tokenizers library produces. We must reproduce all of them exactly. Then:
 * malformed tokenizer.json files fail with a clear error and no crash, invalid UTF-8 input is
 * encoded as from_utf8_lossy would see it, a 100 KB word without pre-tokenization does not take
 * quadratic time, and encoding from several threads at once gives the same ids.
 */
#include "moe-tokenizer.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe-mmap.h"

static int g_failures;

#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            g_failures++;                                                                   \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fputc('\n', stderr);                                                            \
        }                                                                                   \
    } while (0)

/* Log capture: the last error message the library logged. */
static char g_last_log[2048];

/* capture_log: keep error messages for the malformed-input checks; drop the rest. */
static void capture_log(enum moe_log_level level, const char *msg, void *user) {
    (void)user;
    if (level >= MOE_LOG_ERROR) snprintf(g_last_log, sizeof g_last_log, "%s", msg);
}

/* read_json_file: parse a whole JSON file; NULL (with a message) on failure. */
static cJSON *read_json_file(const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (moe_read_file(path, 64u << 20, &text, &len) != MOE_OK) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) fprintf(stderr, "cannot parse %s\n", path);
    return j;
}

/* ids_equal: compare our ids with a JSON array of ids. */
static int ids_equal(const int32_t *ids, size_t n, const cJSON *want) {
    if (!cJSON_IsArray(want) || (size_t)cJSON_GetArraySize(want) != n) return 0;
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, want) {
        if (!cJSON_IsNumber(e) || (int32_t)e->valuedouble != ids[i]) return 0;
        i++;
    }
    return 1;
}

/* print_ids: show both id lists of a mismatch. */
static void print_ids(const char *what, const int32_t *ids, size_t n, const cJSON *want) {
    char *w = cJSON_PrintUnformatted(want);
    fprintf(stderr, "  %s want %s\n  %s got  [", what, w ? w : "?", what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? "," : "", ids[i]);
    fprintf(stderr, "]\n");
    free(w);
}

/* check_decode: decode ids and compare with the expected string. */
static int check_decode(const struct moe_tokenizer *tok, const int32_t *ids, size_t n, int skip,
                        const char *want) {
    char *text = NULL;
    size_t len = 0;
    enum moe_status st = moe_tokenizer_decode(tok, ids, n, skip, &text, &len);
    int ok = st == MOE_OK && want && strlen(want) == len && memcmp(text, want, len) == 0;
    if (!ok && want) fprintf(stderr, "  decode(skip=%d) want \"%s\"\n  got \"%s\"\n", skip, want, text ? text : "(null)");
    free(text);
    return ok;
}

/* run_case: one fixture case: encode with and without special tokens, decode both ways. */
static int run_case(const struct moe_tokenizer *tok, const char *variant, const cJSON *c) {
    const cJSON *jt = cJSON_GetObjectItem(c, "text");
    const char *text = cJSON_GetStringValue(jt);
    if (!text) return 0;
    size_t len = strlen(text); /* no fixture text holds a NUL before its end */
    int ok = 1;
    for (int add = 1; add >= 0; add--) {
        int32_t *ids = NULL;
        size_t n = 0;
        const cJSON *want = cJSON_GetObjectItem(c, add ? "ids" : "ids_no_special");
        enum moe_status st = moe_tokenizer_encode(tok, text, len, add, &ids, &n);
        if (st != MOE_OK || !ids_equal(ids, n, want)) {
            fprintf(stderr, "%s: encode(add_special=%d) mismatch for \"%.80s\"\n", variant, add, text);
            print_ids("ids", ids, n, want);
            ok = 0;
        }
        if (add && st == MOE_OK) {
            if (!check_decode(tok, ids, n, 1, cJSON_GetStringValue(cJSON_GetObjectItem(c, "decoded")))) ok = 0;
            if (!check_decode(tok, ids, n, 0, cJSON_GetStringValue(cJSON_GetObjectItem(c, "decoded_with_special"))))
                ok = 0;
        }
        free(ids);
    }
    return ok;
}

/* check_meta: vocabulary size, BOS/EOS and special flags against meta.json (from transformers). */
static void check_meta(const struct moe_tokenizer *tok, const char *dir, const char *variant) {
    char *path = moe_path_join(dir, "meta.json");
    cJSON *m = path ? read_json_file(path) : NULL;
    free(path);
    CHECK(m != NULL, "%s: meta.json missing", variant);
    if (!m) return;
    int vs = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(m, "vocab_size"));
    int bos = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(m, "bos_id"));
    int eos = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(m, "eos_id"));
    CHECK(moe_tokenizer_n_vocab(tok) == vs, "%s: n_vocab %d, want %d", variant, moe_tokenizer_n_vocab(tok), vs);
    CHECK(vs <= 1000, "%s: fixture vocab %d exceeds the tiny models' 1000 ids", variant, vs);
    CHECK(moe_tokenizer_bos(tok) == bos, "%s: bos %d, want %d", variant, moe_tokenizer_bos(tok), bos);
    CHECK(moe_tokenizer_eos(tok) == eos, "%s: eos %d, want %d", variant, moe_tokenizer_eos(tok), eos);
    int n_special = 0;
    for (int32_t id = 0; id < moe_tokenizer_n_vocab(tok); id++) n_special += moe_tokenizer_is_special(tok, id);
    const cJSON *sp = cJSON_GetObjectItem(m, "special_ids"), *e;
    CHECK(n_special == cJSON_GetArraySize(sp), "%s: %d special ids, want %d", variant, n_special,
          cJSON_GetArraySize(sp));
    cJSON_ArrayForEach(e, sp) {
        int32_t id = (int32_t)e->valuedouble;
        CHECK(moe_tokenizer_is_special(tok, id), "%s: id %d should be special", variant, id);
        const char *s = moe_tokenizer_token(tok, id);
        CHECK(s && moe_tokenizer_find(tok, s) == id, "%s: token/find round trip for id %d", variant, id);
    }
    cJSON_Delete(m);
}

/* run_variant: all cases of one fixture directory; returns the number of failing cases. */
static int run_variant(const char *dir, const char *variant) {
    struct moe_tokenizer *tok = NULL;
    enum moe_status st = moe_tokenizer_load(dir, &tok);
    CHECK(st == MOE_OK, "%s: load failed: %s", variant, moe_status_str(st));
    if (st != MOE_OK) return 1;
    check_meta(tok, dir, variant);

    /* loading the file path, or the JSON from memory, gives the same tokenizer */
    char *json_path = moe_path_join(dir, "tokenizer.json");
    char *json = NULL;
    size_t json_len = 0;
    struct moe_tokenizer *by_file = NULL, *by_mem = NULL;
    CHECK(moe_tokenizer_load(json_path, &by_file) == MOE_OK, "%s: load by file path", variant);
    CHECK(moe_read_file(json_path, 64u << 20, &json, &json_len) == MOE_OK, "%s: read", variant);
    CHECK(moe_tokenizer_load_json(json, json_len, variant, &by_mem) == MOE_OK, "%s: load from memory", variant);
    if (by_file) CHECK(moe_tokenizer_bos(by_file) == moe_tokenizer_bos(tok), "%s: bos by file path", variant);
    if (by_mem) CHECK(moe_tokenizer_n_vocab(by_mem) == moe_tokenizer_n_vocab(tok), "%s: n_vocab from memory", variant);
    moe_tokenizer_free(by_file);
    moe_tokenizer_free(by_mem);
    free(json);
    free(json_path);

    char *cases_path = moe_path_join(dir, "cases.json");
    cJSON *cases = cases_path ? read_json_file(cases_path) : NULL;
    free(cases_path);
    CHECK(cJSON_IsArray(cases), "%s: cases.json missing", variant);
    int n = 0, good = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        n++;
        good += run_case(tok, variant, c);
    }
    CHECK(n >= 15, "%s: only %d cases", variant, n);
    printf("%-16s %d/%d cases match\n", variant, good, n);
    cJSON_Delete(cases);
    moe_tokenizer_free(tok);
    return n - good;
}

/* name_cmp: sort directory names. */
static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* test_fixtures: every fixture variant; at least the four required ones must exist. */
static void test_fixtures(void) {
    const char *root = MOE_FIXTURES "/tokenizers";
    DIR *d = opendir(root);
    CHECK(d != NULL, "cannot open %s", root);
    if (!d) return;
    char *names[64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        char *path = moe_path_join(root, e->d_name);
        if (e->d_name[0] != '.' && path && moe_is_dir(path)) names[n++] = strdup(e->d_name);
        free(path);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, name_cmp);
    int bad = 0, required = 0;
    for (int i = 0; i < n; i++) {
        char *dir = moe_path_join(root, names[i]);
        bad += run_variant(dir, names[i]);
        required += !strcmp(names[i], "qwen-bytelevel") || !strcmp(names[i], "neox-bytelevel") ||
                    !strcmp(names[i], "llama-spbpe") || !strcmp(names[i], "phi-spbpe");
        free(dir);
        free(names[i]);
    }
    CHECK(required == 4, "expected the four required fixture variants, found %d", required);
    CHECK(bad == 0, "%d fixture cases differ from the tokenizers library", bad);
}

/* A malformed or unsupported tokenizer.json, the status it must fail with, and a word the
 * error message must contain. */
struct bad_case {
    const char *name;
    const char *json;
    enum moe_status want;
    const char *msg_has;
};

#define BPE_HEAD "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}"

static const struct bad_case BAD[] = {
    {"not json", "this is not json", MOE_ERR_FORMAT, "JSON"},
    {"empty", "", MOE_ERR_FORMAT, "JSON"},
    {"top-level array", "[1,2,3]", MOE_ERR_FORMAT, "object"},
    {"truncated", BPE_HEAD ",\"merges\":[\"a b\"", MOE_ERR_FORMAT, "JSON"},
    {"missing model", "{\"normalizer\":null}", MOE_ERR_FORMAT, "model"},
    {"model not object", "{\"model\":3}", MOE_ERR_FORMAT, "model"},
    {"no vocab", "{\"model\":{\"type\":\"BPE\",\"merges\":[]}}", MOE_ERR_FORMAT, "vocab"},
    {"merge unknown token", BPE_HEAD ",\"merges\":[\"a c\"]}}", MOE_ERR_FORMAT, "not in the vocab"},
    {"merge unknown pair token", BPE_HEAD ",\"merges\":[[\"x\",\"b\"]]}}", MOE_ERR_FORMAT, "not in the vocab"},
    {"merge result missing", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}",
     MOE_ERR_FORMAT, "not in the vocab"},
    {"merge with two spaces", BPE_HEAD ",\"merges\":[\"a b c\"]}}", MOE_ERR_FORMAT, "merge 1"},
    {"merge not a string", BPE_HEAD ",\"merges\":[7]}}", MOE_ERR_FORMAT, "merge 1"},
    {"merges not array", BPE_HEAD ",\"merges\":{}}}", MOE_ERR_FORMAT, "merges"},
    {"negative id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", MOE_ERR_FORMAT, "id"},
    {"huge id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":4000000000},\"merges\":[]}}", MOE_ERR_FORMAT, "id"},
    {"sparse ids", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":9000000},\"merges\":[]}}", MOE_ERR_FORMAT, "ids"},
    {"fractional id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1.5},\"merges\":[]}}", MOE_ERR_FORMAT, "id"},
    {"WordPiece", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}", MOE_ERR_UNSUPPORTED, "WordPiece"},
    {"Unigram", "{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}", MOE_ERR_UNSUPPORTED, "Unigram"},
    {"WordLevel", "{\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"a\":0}}}", MOE_ERR_UNSUPPORTED, "WordLevel"},
    {"untyped model", "{\"model\":{\"vocab\":{\"a\":0}}}", MOE_ERR_UNSUPPORTED, "type"},
    {"normalizer Precompiled", BPE_HEAD ",\"merges\":[\"a b\"]},\"normalizer\":{\"type\":\"Precompiled\"}}",
     MOE_ERR_UNSUPPORTED, "Precompiled"},
    {"normalizer without type", BPE_HEAD ",\"merges\":[\"a b\"]},\"normalizer\":{}}", MOE_ERR_FORMAT, "type"},
    {"pre_tokenizer UnicodeScripts",
     BPE_HEAD ",\"merges\":[\"a b\"]},\"pre_tokenizer\":{\"type\":\"UnicodeScripts\"}}", MOE_ERR_UNSUPPORTED,
     "UnicodeScripts"},
    {"decoder CTC", BPE_HEAD ",\"merges\":[\"a b\"]},\"decoder\":{\"type\":\"CTC\"}}", MOE_ERR_UNSUPPORTED, "CTC"},
    {"post_processor unknown", BPE_HEAD ",\"merges\":[\"a b\"]},\"post_processor\":{\"type\":\"Magic\"}}",
     MOE_ERR_UNSUPPORTED, "Magic"},
    {"bad regex",
     BPE_HEAD ",\"merges\":[\"a b\"]},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
              "\"behavior\":\"Isolated\",\"invert\":false}}",
     MOE_ERR_FORMAT, "regex"},
    {"bad split behavior",
     BPE_HEAD ",\"merges\":[\"a b\"]},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},"
              "\"behavior\":\"Sideways\",\"invert\":false}}",
     MOE_ERR_FORMAT, "behavior"},
    {"pattern neither String nor Regex",
     BPE_HEAD ",\"merges\":[\"a b\"]},\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Glob\":\"*\"},"
              "\"content\":\"x\"}}",
     MOE_ERR_FORMAT, "pattern"},
    {"metaspace two chars",
     BPE_HEAD ",\"merges\":[\"a b\"]},\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"}}",
     MOE_ERR_FORMAT, "one character"},
    {"template undefined special",
     BPE_HEAD ",\"merges\":[\"a b\"]},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":["
              "{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
              "\"special_tokens\":{}}}",
     MOE_ERR_FORMAT, "<s>"},
    {"template id out of range",
     BPE_HEAD ",\"merges\":[\"a b\"]},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":["
              "{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
              "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[99],\"tokens\":[\"<s>\"]}}}}",
     MOE_ERR_FORMAT, "99"},
    {"roberta without sep", BPE_HEAD ",\"merges\":[\"a b\"]},\"post_processor\":{\"type\":\"RobertaProcessing\","
                            "\"cls\":[\"a\",0]}}",
     MOE_ERR_FORMAT, "sep"},
    {"added token without content", BPE_HEAD ",\"merges\":[\"a b\"]},\"added_tokens\":[{\"id\":3}]}",
     MOE_ERR_FORMAT, "content"},
    {"sequence without list", BPE_HEAD ",\"merges\":[\"a b\"]},\"decoder\":{\"type\":\"Sequence\"}}",
     MOE_ERR_FORMAT, "decoders"},
    {"invalid UTF-8", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\xff\":0},\"merges\":[]}}", MOE_ERR_FORMAT,
     "UTF-8"},
};

/* test_malformed: every BAD entry fails with its status and a message naming the problem;
 * then a vocabulary of more than 256 entries without merges is rejected. */
static void test_malformed(void) {
    moe_log_set(capture_log, NULL);
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        struct moe_tokenizer *tok = (struct moe_tokenizer *)1;
        g_last_log[0] = 0;
        enum moe_status st = moe_tokenizer_load_json(BAD[i].json, strlen(BAD[i].json), BAD[i].name, &tok);
        CHECK(st == BAD[i].want, "%s: status %s, want %s", BAD[i].name, moe_status_str(st), moe_status_str(BAD[i].want));
        CHECK(tok == NULL, "%s: *out not cleared", BAD[i].name);
        CHECK(strstr(g_last_log, BAD[i].msg_has) != NULL, "%s: message \"%s\" does not mention \"%s\"", BAD[i].name,
              g_last_log, BAD[i].msg_has);
        if (tok != (struct moe_tokenizer *)1) moe_tokenizer_free(tok);
    }

    /* 300 vocab entries and no merges: a truncated or misread file, not a tokenizer */
    char *json = malloc(300 * 24 + 100);
    size_t n = (size_t)sprintf(json, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int i = 0; i < 300; i++) n += (size_t)sprintf(json + n, "%s\"t%d\":%d", i ? "," : "", i, i);
    n += (size_t)sprintf(json + n, "},\"merges\":[]}}");
    struct moe_tokenizer *tok = NULL;
    g_last_log[0] = 0;
    CHECK(moe_tokenizer_load_json(json, n, "no merges", &tok) == MOE_ERR_FORMAT, "vocab without merges accepted");
    CHECK(strstr(g_last_log, "no merges") != NULL, "message \"%s\"", g_last_log);
    moe_tokenizer_free(tok);
    free(json);

    CHECK(moe_tokenizer_load(MOE_FIXTURES "/tokenizers/no-such-variant", &tok) != MOE_OK, "missing dir loads");
    CHECK(moe_tokenizer_load_json(NULL, 5, "x", &tok) == MOE_ERR_INVALID, "NULL json");
    moe_log_set(NULL, NULL);
    moe_tokenizer_free(NULL);
}

/* load_variant: load one fixture tokenizer by name. */
static struct moe_tokenizer *load_variant(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizers/%s", MOE_FIXTURES, name);
    struct moe_tokenizer *tok = NULL;
    CHECK(moe_tokenizer_load(path, &tok) == MOE_OK, "load %s", name);
    return tok;
}

/* encode_same: whether two inputs encode to the same ids. */
static int encode_same(const struct moe_tokenizer *tok, const char *a, size_t na, const char *b, size_t nb) {
    int32_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int ok = moe_tokenizer_encode(tok, a, na, 1, &x, &nx) == MOE_OK &&
             moe_tokenizer_encode(tok, b, nb, 1, &y, &ny) == MOE_OK && nx == ny &&
             (nx == 0 || memcmp(x, y, nx * sizeof *x) == 0);
    free(x);
    free(y);
    return ok;
}

/* test_invalid_utf8: invalid bytes encode as U+FFFD, one per maximal invalid subsequence. */
static void test_invalid_utf8(void) {
    static const char *variants[] = {"qwen-bytelevel", "llama-spbpe", "phi-spbpe"};
    static const struct { const char *bad, *good; } pairs[] = {
        {"abc\xff\xfe" "def", "abc\xEF\xBF\xBD\xEF\xBF\xBD" "def"},
        {"x\xe4\xb8y", "x\xEF\xBF\xBDy"},              /* truncated 3-byte sequence: one U+FFFD */
        {"\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate: three */
        {"\xf0\x9f\x98", "\xEF\xBF\xBD"},             /* truncated emoji at the end */
        {"\xc0\xaf ok", "\xEF\xBF\xBD\xEF\xBF\xBD ok"}, /* overlong */
    };
    for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
        struct moe_tokenizer *tok = load_variant(variants[v]);
        if (!tok) continue;
        for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
            CHECK(encode_same(tok, pairs[i].bad, strlen(pairs[i].bad), pairs[i].good, strlen(pairs[i].good)),
                  "%s: invalid UTF-8 case %zu", variants[v], i);
        /* embedded NUL is a character like any other */
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(moe_tokenizer_encode(tok, "a\0b", 3, 0, &ids, &n) == MOE_OK && n >= 2, "%s: NUL", variants[v]);
        free(ids);
        /* empty input, and decoding ids that do not exist */
        CHECK(moe_tokenizer_encode(tok, NULL, 0, 0, &ids, &n) == MOE_OK && n == 0, "%s: empty", variants[v]);
        free(ids);
        int32_t junk[] = {-5, 1 << 30, moe_tokenizer_n_vocab(tok), 3};
        char *text = NULL;
        CHECK(moe_tokenizer_decode(tok, junk, 4, 0, &text, NULL) == MOE_OK && text, "%s: junk ids", variants[v]);
        free(text);
        moe_tokenizer_free(tok);
    }
}

/* now_s: monotonic seconds. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* test_long_word: SP-BPE without a pre-tokenizer sees 100 KB of text as one word; the
 * merge loop must stay O(n log n) (a quadratic one needs minutes here) and round-trip. */
static void test_long_word(void) {
    struct moe_tokenizer *tok = load_variant("phi-spbpe");
    if (!tok) return;
    size_t n = 100000;
    char *text = malloc(n + 1);
    static const char words[] = "the quick brown fox jumps over a lazy dog while experts route tokens ";
    for (size_t i = 0; i < n; i++) text[i] = words[(i * 7 + i / 13) % (sizeof words - 1)];
    text[0] = 'T';
    text[n] = 0;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    double t0 = now_s();
    CHECK(moe_tokenizer_encode(tok, text, n, 0, &ids, &n_ids) == MOE_OK, "long word encode");
    double dt = now_s() - t0;
    CHECK(dt < 5.0, "100 KB word took %.2f s", dt);
    CHECK(n_ids > 0 && n_ids < n, "%zu ids for %zu bytes", n_ids, n);
    char *back = NULL;
    size_t back_len = 0;
    CHECK(moe_tokenizer_decode(tok, ids, n_ids, 1, &back, &back_len) == MOE_OK, "long word decode");
    CHECK(back && back_len == n && memcmp(back, text, n) == 0, "long word does not round-trip");
    free(back);
    free(ids);
    free(text);
    moe_tokenizer_free(tok);
}

/* test_partial_utf8: a token holding part of a character decodes to those raw bytes (not
 * U+FFFD), so decoding a byte-level stream id by id and joining gives the whole text. */
static void test_partial_utf8(void) {
    struct moe_tokenizer *tok = load_variant("qwen-bytelevel");
    if (tok) {
        const char *text = "\xf0\xa0\x80\x80 \xe9\xbe\x98 emoji \xf0\x9f\xa4\x97!";
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(moe_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n) == MOE_OK, "encode");
        char joined[256] = "";
        size_t used = 0;
        for (size_t i = 0; i < n; i++) {
            char *piece = NULL;
            size_t len = 0;
            CHECK(moe_tokenizer_decode(tok, &ids[i], 1, 0, &piece, &len) == MOE_OK, "decode id %zu", i);
            if (piece && used + len < sizeof joined) {
                memcpy(joined + used, piece, len);
                used += len;
            }
            free(piece);
        }
        CHECK(used == strlen(text) && memcmp(joined, text, used) == 0, "piecewise decode differs");
        free(ids);
        moe_tokenizer_free(tok);
    }
    tok = load_variant("llama-spbpe");
    if (tok) {
        int32_t e4 = moe_tokenizer_find(tok, "<0xE4>");
        char *piece = NULL;
        size_t len = 0;
        CHECK(e4 >= 0 && moe_tokenizer_decode(tok, &e4, 1, 0, &piece, &len) == MOE_OK, "decode <0xE4>");
        CHECK(piece && len == 1 && (unsigned char)piece[0] == 0xE4, "<0xE4> alone should decode to byte 0xE4");
        free(piece);
        moe_tokenizer_free(tok);
    }
}

struct thread_arg {
    const struct moe_tokenizer *tok;
    const char *text;
    const int32_t *want;
    size_t n_want;
    int ok;
};

/* encode_loop: encode the same text repeatedly and compare with the single-thread ids. */
static void *encode_loop(void *p) {
    struct thread_arg *a = p;
    a->ok = 1;
    for (int r = 0; r < 20; r++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (moe_tokenizer_encode(a->tok, a->text, strlen(a->text), 1, &ids, &n) != MOE_OK || n != a->n_want ||
            memcmp(ids, a->want, n * sizeof *ids) != 0)
            a->ok = 0;
        free(ids);
    }
    return NULL;
}

/* test_threads: a loaded tokenizer is shared read-only by concurrent encoders. */
static void test_threads(void) {
    struct moe_tokenizer *tok = load_variant("qwen-bytelevel");
    if (!tok) return;
    const char *text = "<|im_start|>user\nMixture-of-experts models route tokens: 3.14, \xe4\xb8\xad\xe6\x96\x87!<|im_end|>";
    int32_t *want = NULL;
    size_t n_want = 0;
    CHECK(moe_tokenizer_encode(tok, text, strlen(text), 1, &want, &n_want) == MOE_OK, "encode");
    pthread_t th[4];
    struct thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){tok, text, want, n_want, 0};
        pthread_create(&th[i], NULL, encode_loop, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].ok, "thread %d got different ids", i);
    }
    free(want);
    moe_tokenizer_free(tok);
}

int main(void) {
    test_fixtures();
    test_malformed();
    test_invalid_utf8();
    test_long_word();
    test_partial_utf8();
    test_threads();
    if (g_failures) {
        fprintf(stderr, "test-tokenizer: %d check(s) failed\n", g_failures);
        return 1;
    }
    printf("test-tokenizer: all checks passed\n");
    return 0;
}

/*
 * test-dataset.c - tests of the dataset readers (the sources in datasets/).
 *
 * 1. SHA-256: the FIPS 180-4 vectors, any split of the input into updates, and
 *    agreement with sha256sum on the fixtures (skipped if sha256sum is absent).
 * 2. The spec grammar: a table of spec strings -> format, text mode, path and
 *    fields, or the error; card lookup by name ($MOE_DATASET_CARDS), by path,
 *    and "file:" that never reads a card.
 * 3. Every format on the committed fixtures (tests/fixtures/datasets): exact
 *    records and their lines; then the same with read buffers of 1..7 bytes, so
 *    lines, JSON array elements, CSV rows and gzip blocks straddle reads.
 * 4. Malformed input, as files and as in-memory tables: each fails with the
 *    file, line and record in the message, or with skip_bad is counted and
 *    skipped; structural damage (corrupt gzip, broken array) fails either way.
 * 5. Options: max_records, max_bytes (cut at a UTF-8 boundary), the record cap,
 *    UTF-8 repair, read_text joining, sticky errors.
 * 6. Cards: a good card, a card whose sha256 does not match (the error names
 *    the card and both hashes), malformed cards, MOE_DATA_DIR resolution.
 * 7. The committed cards against the real data in ../shared/datasets (or
 *    $MOE_DATA_DIR): each verifies and yields its known record count; skipped
 *    with a message when the data is not there.
 *
 * Prints one summary line; exits non-zero on any failure.
 */
#define _XOPEN_SOURCE 700 /* mkdtemp, setenv, popen, realpath */
#include <dirent.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe-dataset.h"
#include "moe-mmap.h"
#include "moe-test.h"
#include "moe-test-log.h"

#define FIX MOE_FIXTURES "/datasets/"
#define REPO_CARDS MOE_FIXTURES "/../../datasets/cards"



/* ------------------------------------------------------------------------- */
/* reading helpers                                                           */

#define MAX_RECS 512

/* Everything one pass over a dataset produced. */
struct run {
    enum moe_status open_st, st; /* open's status, then the final next() status */
    int n;
    char *rec[MAX_RECS];
    size_t len[MAX_RECS];
    int64_t line[MAX_RECS];
    int64_t skipped, records;
};

/* Free a run's records. */
static void run_free(struct run *r) {
    for (int i = 0; i < r->n; i++) free(r->rec[i]);
    r->n = 0;
}

/* Read every record of an open dataset into r (and free it). */
static void drain(struct moe_dataset *d, struct run *r) {
    const char *t;
    size_t n;
    while ((r->st = moe_dataset_next(d, &t, &n)) == MOE_OK && t) {
        if (r->n < MAX_RECS) {
            r->rec[r->n] = malloc(n + 1);
            memcpy(r->rec[r->n], t, n + 1);
            r->len[r->n] = n;
            r->line[r->n] = moe_dataset_line(d);
            r->n++;
        }
    }
    r->skipped = moe_dataset_skipped(d);
    r->records = moe_dataset_records(d);
    moe_dataset_free(d);
}

/* Open `spec` with params p (NULL = defaults) and read it all. */
static void read_spec(const char *spec, const struct moe_dataset_params *p, struct run *r) {
    memset(r, 0, sizeof *r);
    struct moe_dataset *d = NULL;
    r->open_st = r->st = moe_dataset_open(spec, p, &d);
    if (r->open_st == MOE_OK) drain(d, r);
    else if (d) CHECK(0, "%s: handle set on a failed open", spec);
}

/* The same over memory. */
static void read_mem(const char *format, const void *data, size_t len, const struct moe_dataset_params *p,
                     struct run *r) {
    memset(r, 0, sizeof *r);
    struct moe_dataset *d = NULL;
    r->open_st = r->st = moe_dataset_open_memory(format, data, len, "mem", p, &d);
    if (r->open_st == MOE_OK) drain(d, r);
}

/* Params with skip_bad and a read buffer size. */
static struct moe_dataset_params params(int skip, size_t buffer) {
    struct moe_dataset_params p = moe_dataset_default_params();
    p.skip_bad = skip;
    p.buffer_bytes = buffer;
    return p;
}

/* Read a whole fixture file (for byte comparisons). */
static char *slurp(const char *path, size_t *len) {
    char *t = NULL;
    if (moe_read_file(path, 64u << 20, &t, len) != MOE_OK) return NULL;
    return t;
}

/* ------------------------------------------------------------------------- */
/* 1. SHA-256                                                                */

/* Hex digest of a buffer. */
static void sha_hex(const void *p, size_t n, char hex[65]) {
    struct moe_sha256 s;
    uint8_t d[32];
    moe_sha256_init(&s);
    moe_sha256_update(&s, p, n);
    moe_sha256_final(&s, d);
    moe_sha256_hex(d, hex);
}

/* FIPS vectors, split updates, and agreement with sha256sum. */
static void test_sha256(void) {
    static const struct {
        const char *msg;
        const char *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrs"
         "tnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char hex[65];
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        sha_hex(v[i].msg, strlen(v[i].msg), hex);
        CHECK(!strcmp(hex, v[i].hex), "sha256(\"%s\") = %s, want %s", v[i].msg, hex, v[i].hex);
    }
    /* one million 'a', fed in uneven pieces */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    struct moe_sha256 s;
    uint8_t dg[32];
    moe_sha256_init(&s);
    for (size_t off = 0, step = 1; off < 1000000; off += step, step = step * 3 % 997 + 1)
        moe_sha256_update(&s, a + off, off + step > 1000000 ? 1000000 - off : step);
    moe_sha256_final(&s, dg);
    moe_sha256_hex(dg, hex);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "million a: %s", hex);
    free(a);
    /* every length 0..200 around the padding boundaries, split at every point */
    unsigned char buf[200];
    for (int i = 0; i < 200; i++) buf[i] = (unsigned char)(i * 7 + 3);
    int mismatches = 0;
    for (size_t n = 0; n <= 200; n++) {
        char whole[65], parts[65];
        sha_hex(buf, n, whole);
        for (size_t cut = 0; cut <= n; cut += (n > 70 ? 13 : 1)) {
            moe_sha256_init(&s);
            moe_sha256_update(&s, buf, cut);
            moe_sha256_update(&s, buf + cut, n - cut);
            moe_sha256_final(&s, dg);
            moe_sha256_hex(dg, parts);
            mismatches += strcmp(whole, parts) != 0;
        }
    }
    CHECK(mismatches == 0, "%d split digests differ from the one-shot digest", mismatches);
    /* against sha256sum, on the fixtures (text and gzip) */
    static const char *const files[] = {"qa.jsonl", "qa.jsonl.gz", "quoted.csv", "text.txt", "truncated.jsonl.gz"};
    int compared = 0;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[PATH_MAX], cmd[PATH_MAX + 64], line[256] = "";
        snprintf(path, sizeof path, FIX "%s", files[i]);
        snprintf(cmd, sizeof cmd, "sha256sum '%s' 2>/dev/null", path);
        FILE *p = popen(cmd, "r");
        if (!p) continue;
        int got = fgets(line, sizeof line, p) != NULL;
        if (pclose(p) != 0 || !got) continue;
        uint64_t size = 0;
        CHECK(moe_sha256_file(path, hex, &size) == MOE_OK, "%s", path);
        CHECK(!strncmp(line, hex, 64), "%s: sha256sum says %.64s, moe_sha256_file %s", files[i], line, hex);
        compared++;
    }
    if (!compared) printf("test-dataset: sha256sum not found; compared with the FIPS vectors only\n");
    log_reset();
    CHECK(moe_sha256_file(FIX "no-such-file", hex, NULL) == MOE_ERR_IO && strstr(g_err, "no-such-file"),
          "missing file: %s", g_err);
}

/* ------------------------------------------------------------------------- */
/* 2. the spec grammar                                                       */

/* "name|name?|..." for a spec's fields ('?' = optional; "" for text). */
static void fields_str(const struct moe_dataset_spec *s, char *out, size_t cap) {
    out[0] = 0;
    for (int i = 0; i < s->n_fields; i++) {
        size_t n = strlen(out);
        snprintf(out + n, cap - n, "%s%s%s", i ? "|" : "", s->fields[i], s->optional[i] ? "[opt]" : "");
    }
}

/* The spec table: each string parses to its format, path and fields, or fails as stated. */
static void test_grammar(void) {
    char qa_real[PATH_MAX];
    CHECK(realpath(FIX "qa.jsonl", qa_real) != NULL, "realpath of the fixture");
    static const int T = MOE_DATASET_TEXT, L = MOE_DATASET_JSONL, J = MOE_DATASET_JSON, C = MOE_DATASET_CSV,
                     V = MOE_DATASET_TSV;
    static const int CH = MOE_TEXT_CHUNK, PA = MOE_TEXT_PARA, LI = MOE_TEXT_LINE;
    struct {
        const char *spec;
        enum moe_status st;
        int format, mode;
        const char *path;   /* NULL: the fixture qa.jsonl (cards) */
        const char *fields; /* fields_str form */
        const char *card;   /* card name, or NULL for file specs */
    } t[] = {
        {"jsonl:data/test.jsonl:question,answer", MOE_OK, L, 0, "data/test.jsonl", "question|answer", NULL},
        {"csv:TruthfulQA.csv:Question,Best Answer", MOE_OK, C, 0, "TruthfulQA.csv", "Question|Best Answer", NULL},
        {"json:alpaca.json:instruction,input?,output", MOE_OK, J, 0, "alpaca.json", "instruction|input[opt]|output",
         NULL},
        {"json:a.json: instruction , input ? ,output ", MOE_OK, J, 0, "a.json", "instruction|input[opt]|output", NULL},
        {"tsv:a.tsv:a,b", MOE_OK, V, 0, "a.tsv", "a|b", NULL},
        {"jsonl:x.jsonl", MOE_OK, L, 0, "x.jsonl", "text", NULL},
        {"jsonl:x.jsonl:", MOE_OK, L, 0, "x.jsonl", "text", NULL},
        {"jsonl:dir:with:colons/x.jsonl:", MOE_OK, L, 0, "dir:with:colons/x.jsonl", "text", NULL},
        {"jsonl:dir:with:colons/x.jsonl:q,a", MOE_OK, L, 0, "dir:with:colons/x.jsonl", "q|a", NULL},
        {"jsonl:a:b", MOE_OK, L, 0, "a", "b", NULL}, /* the last ':' starts the fields */
        {"csv:a.csv:x\\,y,z\\?,w\\\\", MOE_OK, C, 0, "a.csv", "x,y|z?|w\\", NULL},
        {"text:notes.txt", MOE_OK, T, CH, "notes.txt", "", NULL},
        {"text:notes.txt:chunk", MOE_OK, T, CH, "notes.txt", "", NULL},
        {"text:notes.txt:para", MOE_OK, T, PA, "notes.txt", "", NULL},
        {"text:notes.txt:line", MOE_OK, T, LI, "notes.txt", "", NULL},
        {"text:a:b.txt:", MOE_OK, T, CH, "a:b.txt", "", NULL},
        {"file:weird:name.jsonl", MOE_OK, L, 0, "weird:name.jsonl", "text", NULL},
        {"file:csv:foo.csv", MOE_OK, C, 0, "csv:foo.csv", "text", NULL},
        {"data/train.jsonl", MOE_OK, L, 0, "data/train.jsonl", "text", NULL},
        {"data/train.jsonl.gz", MOE_OK, L, 0, "data/train.jsonl.gz", "text", NULL},
        {"wiki.test.raw", MOE_OK, T, CH, "wiki.test.raw", "", NULL},
        {"notes.md", MOE_OK, T, CH, "notes.md", "", NULL},
        {"wiki.test.tokens", MOE_OK, T, CH, "wiki.test.tokens", "", NULL},
        {"x.ndjson", MOE_OK, L, 0, "x.ndjson", "text", NULL},
        {"X.CSV", MOE_OK, C, 0, "X.CSV", "text", NULL},
        {"x.tsv.gz", MOE_OK, V, 0, "x.tsv.gz", "text", NULL},
        {"missing-array.json", MOE_OK, J, 0, "missing-array.json", "text", NULL},
        {"data:v2.jsonl", MOE_OK, L, 0, "data:v2.jsonl", "text", NULL}, /* "data" is no format */
        {"tiny-qa", MOE_OK, L, 0, NULL, "question|answer", "tiny-qa"},
        {"card:tiny-qa", MOE_OK, L, 0, NULL, "question|answer", "tiny-qa"},
        {"card:" FIX "cards/tiny-qa.json", MOE_OK, L, 0, NULL, "question|answer", "tiny-qa"},
        {FIX "cards/tiny-qa.json", MOE_OK, L, 0, NULL, "question|answer", "tiny-qa"},
        {"file:" FIX "cards/tiny-qa.json", MOE_OK, J, 0, FIX "cards/tiny-qa.json", "text", NULL},
        {"json:" FIX "cards/tiny-qa.json", MOE_OK, J, 0, FIX "cards/tiny-qa.json", "text", NULL},
        {"", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"unknown.xyz", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"no-such-card", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"card:no-such-card", MOE_ERR_NOT_FOUND, 0, 0, "", "", NULL},
        {"card:", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"card:" FIX "cards/absent.json", MOE_ERR_IO, 0, 0, "", "", NULL},
        {"file:", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"file:noext", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"jsonl:", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"jsonl::q", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"jsonl:x.jsonl:a,,b", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"jsonl:x.jsonl:a,", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"jsonl:x.jsonl:?", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"text:a:b.txt", MOE_ERR_INVALID, 0, 0, "", "", NULL}, /* "b.txt" is no text mode */
        {"text:notes.txt:question", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"xml:foo.xml", MOE_ERR_INVALID, 0, 0, "", "", NULL},
        {"data.csv:a,b", MOE_ERR_INVALID, 0, 0, "", "", NULL}, /* hint: csv:data.csv:a,b */
    };
    setenv("MOE_DATASET_CARDS", "/nonexistent-dir:" FIX "cards", 1);
    unsetenv("MOE_DATA_DIR");
    char got[512];
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        struct moe_dataset_spec *s = NULL;
        log_reset();
        enum moe_status st = moe_dataset_spec_parse(t[i].spec, &s);
        CHECK(st == t[i].st, "'%s': status %s, want %s (%s)", t[i].spec, moe_status_str(st), moe_status_str(t[i].st),
              g_err);
        if (st != MOE_OK) {
            CHECK(s == NULL && g_n_err >= 1, "'%s': failed parse must clear *out and log", t[i].spec);
            continue;
        }
        if (!s) continue;
        fields_str(s, got, sizeof got);
        const char *want_path = t[i].path ? t[i].path : qa_real;
        CHECK((int)s->format == t[i].format, "'%s': format %s", t[i].spec, moe_dataset_format_name(s->format));
        if (s->format == MOE_DATASET_TEXT)
            CHECK((int)s->text_mode == t[i].mode, "'%s': text mode %d", t[i].spec, (int)s->text_mode);
        CHECK(!strcmp(s->path, want_path), "'%s': path '%s', want '%s'", t[i].spec, s->path, want_path);
        CHECK(!strcmp(got, t[i].fields), "'%s': fields '%s', want '%s'", t[i].spec, got, t[i].fields);
        CHECK((t[i].card == NULL) == (s->name == NULL) && (!t[i].card || !strcmp(s->name, t[i].card)),
              "'%s': card name %s", t[i].spec, s->name ? s->name : "(none)");
        moe_dataset_spec_free(s);
    }
    /* messages that help */
    struct moe_dataset_spec *s = NULL;
    log_reset();
    moe_dataset_spec_parse("data.csv:a,b", &s);
    CHECK(strstr(g_err, "did you mean csv:data.csv:a,b"), "hint: %s", g_err);
    log_reset();
    moe_dataset_spec_parse("text:a:b.txt", &s);
    CHECK(strstr(g_err, "unknown text mode 'b.txt'") && strstr(g_err, "final ':'"), "text mode: %s", g_err);
    log_reset();
    moe_dataset_spec_parse("no-such-card", &s);
    CHECK(strstr(g_err, "no card named 'no-such-card'"), "card hint: %s", g_err);
    /* too many fields */
    char many[1024] = "jsonl:x.jsonl:";
    for (int i = 0; i <= MOE_DATASET_MAX_FIELDS; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "f%d,", i);
    many[strlen(many) - 1] = 0;
    CHECK(moe_dataset_spec_parse(many, &s) == MOE_ERR_INVALID && !s, "more than %d fields", MOE_DATASET_MAX_FIELDS);
    /* defaults, help, names */
    CHECK(moe_dataset_spec_parse("jsonl:x.jsonl", &s) == MOE_OK && s->fields_defaulted == 1, "defaulted");
    moe_dataset_spec_free(s);
    CHECK(moe_dataset_spec_parse("jsonl:x.jsonl:text", &s) == MOE_OK && s->fields_defaulted == 0, "written");
    moe_dataset_spec_free(s);
    moe_dataset_spec_free(NULL);
    const char *help = moe_dataset_spec_help();
    CHECK(help && strstr(help, "FORMAT:PATH[:SELECT]") && strstr(help, "card:") && strstr(help, "file:"), "help");
    CHECK(!strcmp(moe_dataset_format_name(MOE_DATASET_TSV), "tsv") && !strcmp(moe_dataset_format_name(99), "?"),
          "format names");
}

/* ------------------------------------------------------------------------- */
/* 3. formats on the fixtures                                                */

struct expect {
    const char *spec;
    int n;
    const char *rec[8];
    int64_t line[8];
};

static const struct expect g_valid[] = {
    {"text:" FIX "text.txt:para", 3,
     {"The first paragraph\nhas two lines.", "Second paragraph: caf\xc3\xa9 \xe2\x80\x94 na\xc3\xafve \xf0\x9f\x98\x80.",
      "Third, last line without newline"},
     {1, 5, 9}},
    {"text:" FIX "text.txt:line", 4,
     {"The first paragraph", "has two lines.", "Second paragraph: caf\xc3\xa9 \xe2\x80\x94 na\xc3\xafve \xf0\x9f\x98\x80.",
      "Third, last line without newline"},
     {1, 2, 5, 9}},
    {"jsonl:" FIX "qa.jsonl:question,answer", 4,
     {"What is 2+2?\n4", "Pi to 3 digits?\n3.14", "Escapes: \"q\" \xc3\xa9 \xf0\x9f\x98\x80\n12345678901",
      "Reordered keys?\nno question here"},
     {1, 2, 4, 5}},
    {"jsonl:" FIX "qa.jsonl:answer,flag?,extra?", 4,
     {"4", "3.14", "12345678901\n1\n2", "no question here\ntrue"},
     {1, 2, 4, 5}},
    {"json:" FIX "alpaca.json:instruction,input?,output", 3,
     {"Give three tips for staying healthy.\nEat, move, sleep.", "Translate to French.\nGood morning\nBonjour",
      "No input key at all.\nFine: input is optional."},
     {2, 7, 12}},
    {"json:" FIX "sharegpt.json:conversations", 3,
     {"Hello, [brackets] and {braces} in \"strings\"\nHi!\nHow can I help?", "OpenAI-style content key\ntext key",
      "a plain string turn\n7\nfalse"},
     {1, 1, 1}},
    {"json:" FIX "sharegpt.json:id,conversations", 3,
     {"a1\nHello, [brackets] and {braces} in \"strings\"\nHi!\nHow can I help?", "b2\nOpenAI-style content key\ntext key",
      "c3\na plain string turn\n7\nfalse"},
     {1, 1, 1}},
    {"json:" FIX "empty-array.json", 0, {NULL}, {0}},
    {"csv:" FIX "quoted.csv:Question,Best Answer", 4,
     {"Where, exactly?\nHere, there", "Line one\nline two\nHe said \"hi\"", "Plain question",
      "Multi\n\nparagraph\nans\r\nwith CRLF inside"},
     {2, 3, 6, 7}},
    {"csv:" FIX "quoted.csv:Source,Nope?,Type", 4, {"http://a\nA", "http://b\nB", "http://c\nC", "http://d\nD"}, {2, 3, 6, 7}},
    {"tsv:" FIX "small.tsv:b,c", 2, {"quoted\ttab\ny1", "y2"}, {2, 3}},
    {"jsonl:" FIX "qa.jsonl.gz:question,answer", 4,
     {"What is 2+2?\n4", "Pi to 3 digits?\n3.14", "Escapes: \"q\" \xc3\xa9 \xf0\x9f\x98\x80\n12345678901",
      "Reordered keys?\nno question here"},
     {1, 2, 4, 5}},
    {"jsonl:" FIX "gzip-no-suffix.jsonl:question", 4,
     {"What is 2+2?", "Pi to 3 digits?", "Escapes: \"q\" \xc3\xa9 \xf0\x9f\x98\x80", "Reordered keys?"},
     {1, 2, 4, 5}},
    {"text:" FIX "two-members.txt.gz:para", 2, {"first member", "second member"}, {1, 3}},
    {FIX "two-members.txt.gz", 1, {"first member\n\nsecond member\n"}, {1}},
};

/* Compare a run with an expectation; `what` says which variant ran. */
static void check_run(const struct expect *e, const struct run *r, const char *what) {
    CHECK(r->open_st == MOE_OK && r->st == MOE_OK, "%s [%s]: %s (%s)", e->spec, what, moe_status_str(r->st), g_err);
    CHECK(r->n == e->n && r->records == e->n && r->skipped == 0, "%s [%s]: %d records (%lld counted, %lld skipped), want %d",
          e->spec, what, r->n, (long long)r->records, (long long)r->skipped, e->n);
    for (int i = 0; i < r->n && i < e->n; i++) {
        CHECK(!strcmp(r->rec[i], e->rec[i]) && r->len[i] == strlen(e->rec[i]), "%s [%s]: record %d is '%s', want '%s'",
              e->spec, what, i + 1, r->rec[i], e->rec[i]);
        CHECK(r->line[i] == e->line[i], "%s [%s]: record %d at line %lld, want %lld", e->spec, what, i + 1,
              (long long)r->line[i], (long long)e->line[i]);
    }
}

/* Every format on the valid fixtures, with default and tiny read buffers. */
static void test_formats(void) {
    for (size_t i = 0; i < sizeof g_valid / sizeof *g_valid; i++) {
        struct run r;
        log_reset();
        read_spec(g_valid[i].spec, NULL, &r);
        check_run(&g_valid[i], &r, "default buffer");
        run_free(&r);
        /* tiny read buffers: every record straddles reads (a JSON element, a CSV row,
         * a quoted field, a gzip member boundary) */
        static const size_t sizes[] = {1, 2, 3, 5, 7, 64};
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            struct moe_dataset_params p = params(0, sizes[k]);
            char what[32];
            snprintf(what, sizeof what, "buffer %zu", sizes[k]);
            read_spec(g_valid[i].spec, &p, &r);
            check_run(&g_valid[i], &r, what);
            run_free(&r);
        }
    }
    /* text chunks: pieces end after a newline and concatenate to the file (minus its BOM) */
    size_t flen = 0;
    char *file = slurp(FIX "text.txt", &flen);
    CHECK(file && flen > 3 && !memcmp(file, "\xef\xbb\xbf", 3), "text.txt starts with a BOM");
    for (size_t chunk = 4; chunk <= 128; chunk *= 2) {
        struct moe_dataset_params p = params(0, 3);
        p.text_chunk_bytes = chunk;
        struct run r;
        read_spec("text:" FIX "text.txt", &p, &r);
        size_t total = 0;
        int ok = r.st == MOE_OK;
        for (int i = 0; i < r.n; i++) {
            ok &= r.len[i] <= chunk && total + r.len[i] <= flen - 3 && !memcmp(file + 3 + total, r.rec[i], r.len[i]);
            total += r.len[i];
        }
        CHECK(ok && total == flen - 3, "chunk %zu: %d pieces, %zu of %zu bytes", chunk, r.n, total, flen - 3);
        run_free(&r);
    }
    free(file);
    /* a bare path guesses the format; the default field of JSONL is "text" */
    const char lines[] = "{\"text\": \"one\"}\n{\"text\": \"two\", \"x\": 1}\n";
    struct run r;
    read_mem("jsonl", lines, sizeof lines - 1, NULL, &r);
    CHECK(r.st == MOE_OK && r.n == 2 && !strcmp(r.rec[1], "two"), "jsonl default field");
    run_free(&r);
    /* numbers and booleans become text */
    const char nums[] = "{\"text\": 0.1}\n{\"text\": -5}\n{\"text\": 1e20}\n{\"text\": 2.5e-7}\n{\"text\": false}\n"
                        "{\"text\": [\"a\", 1, null, {\"value\": \"v\"}]}\n";
    const char *want[] = {"0.1", "-5", "1e+20", "2.5e-07", "false", "a\n1\nv"};
    read_mem("jsonl", nums, sizeof nums - 1, NULL, &r);
    CHECK(r.st == MOE_OK && r.n == 6, "numbers: %d records", r.n);
    for (int i = 0; i < r.n && i < 6; i++) CHECK(!strcmp(r.rec[i], want[i]), "number %d: '%s', want '%s'", i, r.rec[i], want[i]);
    run_free(&r);
    /* JSON scalars in the array's structure: strings with brackets and escapes */
    const char tricky[] = " \n[ {\"text\":\"a \\\"]}\\\" b\"} ,\n{\"text\":\"\\\\\"}\n ,{\"text\":\"[[{\"}] \n";
    for (size_t b = 1; b <= 9; b += 4) {
        struct moe_dataset_params p = params(0, b);
        read_mem("json", tricky, sizeof tricky - 1, &p, &r);
        CHECK(r.st == MOE_OK && r.n == 3 && !strcmp(r.rec[0], "a \"]}\" b") && !strcmp(r.rec[1], "\\") &&
                  !strcmp(r.rec[2], "[[{") && r.line[2] == 4,
              "tricky array (buffer %zu): %d records", b, r.n);
        run_free(&r);
    }
    /* empty inputs: no records, no error (except CSV/JSON, which need a header / '[') */
    read_mem("jsonl", "", 0, NULL, &r);
    CHECK(r.st == MOE_OK && r.n == 0, "empty jsonl");
    read_mem("text", "\n\n  \n", 4, NULL, &r);
    CHECK(r.st == MOE_OK && r.n == 1, "blank text is one chunk");
    run_free(&r);
    read_mem("text:para", "\n\n  \n", 4, NULL, &r);
    CHECK(r.st == MOE_OK && r.n == 0, "blank text has no paragraphs");
    log_reset();
    read_mem("csv:a", "", 0, NULL, &r);
    CHECK(r.open_st == MOE_ERR_FORMAT && strstr(g_err, "no header row"), "empty csv: %s", g_err);
    log_reset();
    read_mem("json", " \n", 2, NULL, &r);
    CHECK(r.open_st == MOE_ERR_FORMAT && strstr(g_err, "expected a JSON array"), "empty json: %s", g_err);
    /* a UTF-8 BOM is dropped in every format */
    const char bom[] = "\xef\xbb\xbf" "a,b\n1,2\n";
    for (size_t b = 1; b <= 4; b++) {
        struct moe_dataset_params p = params(0, b);
        read_mem("csv:a,b", bom, sizeof bom - 1, &p, &r);
        CHECK(r.st == MOE_OK && r.n == 1 && !strcmp(r.rec[0], "1\n2"), "BOM before a CSV header (buffer %zu)", b);
        run_free(&r);
    }
}

/* ------------------------------------------------------------------------- */
/* 4. malformed input                                                        */

struct bad_case {
    const char *spec;
    enum moe_status st;       /* without skip_bad */
    const char *msg;          /* in the error */
    int before;               /* records handed out before the error */
    enum moe_status skip_st;  /* with skip_bad */
    int skip_n, skip_skipped; /* records and skipped with skip_bad */
};

static const struct bad_case g_bad_files[] = {
    {"jsonl:" FIX "bad.jsonl:question,answer", MOE_ERR_FORMAT, "bad.jsonl:2: record 2: invalid JSON at column", 1,
     MOE_OK, 2, 6},
    {"json:" FIX "bad-elements.json:instruction,output", MOE_ERR_FORMAT,
     "bad-elements.json:3: record 2: array element 2 is a JSON scalar, not an object", 1, MOE_OK, 2, 5},
    {"json:" FIX "cut.json:instruction,output", MOE_ERR_FORMAT, "cut.json:2: record 2: cut off", 1, MOE_OK, 1, 1},
    {"json:" FIX "not-array.json", MOE_ERR_FORMAT, "not-array.json:1: expected a JSON array ('['), found '{'", 0,
     MOE_ERR_FORMAT, 0, 0},
    {"json:" FIX "trailing-comma.json:instruction", MOE_ERR_FORMAT, "trailing-comma.json:1: trailing comma", 1,
     MOE_ERR_FORMAT, 1, 0},
    {"csv:" FIX "bad-rows.csv:a,c", MOE_ERR_FORMAT, "bad-rows.csv:3: record 2: the row has 2 columns, the header has 3", 1,
     MOE_OK, 2, 4},
    {"csv:" FIX "quoted.csv:Question,Nope", MOE_ERR_NOT_FOUND,
     "no column named \"Nope\" in the header (columns: Type, Question, Best Answer, Source)", 0, MOE_ERR_NOT_FOUND, 0, 0},
    {"text:" FIX "text-badutf8.txt:para", MOE_ERR_FORMAT, "text-badutf8.txt:3: record 2: invalid UTF-8 at byte 4", 1,
     MOE_OK, 2, 2},
    {FIX "truncated.jsonl.gz", MOE_ERR_FORMAT, "the gzip stream is truncated", 0, MOE_OK, 84, 1},
    {"jsonl:" FIX "corrupt.jsonl.gz:question", MOE_ERR_FORMAT, "corrupt gzip data at compressed byte 182 (after 260 uncompressed bytes): incorrect data check", 4,
     MOE_ERR_FORMAT, 4, 0}, /* CRC trailer damaged: every record inflates, then the check fails */
    {"jsonl:" FIX "no-such-file.jsonl", MOE_ERR_NOT_FOUND, "no-such-file.jsonl: cannot open", 0, MOE_ERR_NOT_FOUND, 0, 0},
};

/* Check one malformed case both ways (the records are read with buffer `buf`). */
static void check_bad(const struct bad_case *c, const struct run *r, const struct run *rs, const char *err,
                      const char *what) {
    CHECK(r->st == c->st, "%s [%s]: %s, want %s", c->spec, what, moe_status_str(r->st), moe_status_str(c->st));
    CHECK(strstr(err, c->msg) != NULL, "%s [%s]: error '%s' lacks '%s'", c->spec, what, err, c->msg);
    if (c->before >= 0 && !strstr(c->spec, "truncated"))
        CHECK(r->n == c->before, "%s [%s]: %d records before the error, want %d", c->spec, what, r->n, c->before);
    CHECK(rs->st == c->skip_st && (c->skip_n < 0 || rs->n == c->skip_n) && rs->skipped == c->skip_skipped,
          "%s [%s] skip_bad: %s, %d records, %lld skipped; want %s, %d, %d", c->spec, what, moe_status_str(rs->st), rs->n,
          (long long)rs->skipped, moe_status_str(c->skip_st), c->skip_n, c->skip_skipped);
}

/* The malformed fixtures, with and without skip_bad, at several buffer sizes. */
static void test_malformed_files(void) {
    for (size_t i = 0; i < sizeof g_bad_files / sizeof *g_bad_files; i++) {
        static const size_t sizes[] = {0, 1, 3, 7};
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            struct run r, rs;
            struct moe_dataset_params p = params(0, sizes[k]), ps = params(1, sizes[k]);
            char what[32], err[sizeof g_err];
            snprintf(what, sizeof what, "buffer %zu", sizes[k]);
            log_reset();
            read_spec(g_bad_files[i].spec, &p, &r);
            snprintf(err, sizeof err, "%s", g_err);
            CHECK(g_n_err >= 1, "%s: the error must be logged", g_bad_files[i].spec);
            read_spec(g_bad_files[i].spec, &ps, &rs);
            check_bad(&g_bad_files[i], &r, &rs, err, what);
            run_free(&r);
            run_free(&rs);
        }
    }
    /* each skipped record is reported (the first five), then counted silently */
    struct run r;
    struct moe_dataset_params p = params(1, 0);
    log_reset();
    read_spec("jsonl:" FIX "bad.jsonl:question,answer", &p, &r);
    static const char *const warned[] = {
        "bad.jsonl:2: record 2: invalid JSON at column 33",
        "bad.jsonl:3: record 3: the line holds a JSON array, not an object",
        "bad.jsonl:4: record 4: missing field \"answer\" (the object has: question)",
        "bad.jsonl:5: record 5: invalid UTF-8 at byte 9 of the record (0xff)",
        "bad.jsonl:6: record 6: unexpected text after the JSON value at column 41",
        "further malformed records are skipped silently",
        "skipped 6 malformed records; read 2",
    };
    for (size_t i = 0; i < sizeof warned / sizeof *warned; i++)
        CHECK(strstr(g_warn, warned[i]), "warning '%s' missing in:\n%s", warned[i], g_warn);
    CHECK(!strstr(g_warn, "record 7"), "record 7 should be counted silently");
    CHECK(r.n == 2 && !strcmp(r.rec[0], "ok 1\na1") && !strcmp(r.rec[1], "ok 2\na2") && r.line[1] == 8, "kept records");
    run_free(&r);
    /* a truncated gzip hands out what it holds before the error */
    read_spec(FIX "truncated.jsonl.gz", NULL, &r);
    CHECK(r.st == MOE_ERR_FORMAT && r.n >= 1 && r.n <= 84, "truncated: %d records before the error", r.n);
    run_free(&r);
}

struct mem_case {
    const char *format;
    const char *data;
    size_t max_record;       /* 0 = default */
    enum moe_status st;      /* without skip_bad */
    const char *msg;
    enum moe_status skip_st; /* with skip_bad */
    int skip_n, skip_skipped;
};

static const struct mem_case g_bad_mem[] = {
    {"jsonl", "{\"text\":\"short\"}\n{\"text\":\"this line is far too long\"}\n{\"text\":\"ok\"}\n", 16, MOE_ERR_FORMAT,
     "mem:2: record 2: line longer than 16 bytes", MOE_OK, 2, 1},
    {"text:para", "short\n\na paragraph\nthat is too long\n\nok\n", 16, MOE_ERR_FORMAT,
     "mem:3: record 2: paragraph longer than 16 bytes", MOE_OK, 2, 1},
    {"text:line", "short\na line that is too long\nok", 16, MOE_ERR_FORMAT, "mem:2: record 2: line longer than 16",
     MOE_OK, 2, 1},
    {"json", "[{\"text\":\"a\"},\n{\"text\":\"an element that is far too long\"},{\"text\":\"b\"}]", 24, MOE_ERR_FORMAT,
     "mem:2: record 2: array element longer than 24 bytes", MOE_OK, 2, 1},
    {"json", "[{\"text\":\"a\"}, {\"text\": \"b\\u00e9\"}, {\"text\": \"cc\"}]", 2, MOE_ERR_FORMAT,
     "record 1: array element longer than 2 bytes", MOE_OK, 0, 3},
    {"jsonl", "{\"text\":[\"x\", \"yyyyyyyyyyyyyyyyyyyy\"]}\n", 16, MOE_ERR_FORMAT, "mem:1: record 1: line longer",
     MOE_OK, 0, 1},
    {"csv:a,b", "a,b\n1,2\n\"unterminated,x\nmore\nand more text\n3,4\n", 20, MOE_ERR_FORMAT,
     "mem:3: record 2: row longer than 20 bytes (an unterminated quote?)", MOE_OK, 2, 1},
    {"csv:a,b", "a,b\n1,2\n\"q\"x,3\n4,5\n", 0, MOE_ERR_FORMAT, "mem:3: record 2: malformed CSV quoting on line 3",
     MOE_OK, 2, 1},
    {"csv:a,b", "a,b\n1,2\n3\n4,5,6\n7,8", 0, MOE_ERR_FORMAT, "mem:3: record 2: the row has 1 column, the header has 2",
     MOE_OK, 2, 2},
    {"csv:a,b", "a,\"b\nc\n", 0, MOE_ERR_FORMAT, "bad header row: the file ends inside a quoted field", MOE_ERR_FORMAT, 0,
     0},
    {"csv:a,zz", "a,b\n1,2\n", 0, MOE_ERR_NOT_FOUND, "no column named \"zz\" in the header (columns: a, b)",
     MOE_ERR_NOT_FOUND, 0, 0},
    {"jsonl", "{\"text\":\"nul\"}\n{\"text\":\"a\"}\n\x00\n", 0, MOE_ERR_FORMAT, "mem:3: record 3: invalid JSON", MOE_OK,
     2, 1},
    {"text:line", "ok\nnul \x01 here\n", 0, MOE_OK, "", MOE_OK, 2, 0},
    {"jsonl", "{\"text\":[[1]]}\n", 0, MOE_ERR_FORMAT, "arrays inside arrays are not supported", MOE_OK, 0, 1},
    {"jsonl", "{\"text\":{\"from\":\"human\"}}\n", 0, MOE_ERR_FORMAT,
     "field \"text\": an object without a \"value\", \"content\" or \"text\" string", MOE_OK, 0, 1},
    {"jsonl", "{\"text\":\"x\"}\n{\"text\":\"\\ud800\"}\n", 0, MOE_ERR_FORMAT, "mem:2: record 2: invalid JSON", MOE_OK,
     1, 1},
    {"jsonl", "{\"text\":\"\xed\xa0\x80 surrogate\"}\n{\"text\":\"\xf4\x90\x80\x80 too big\"}\n{\"text\":\"\xe2\x82\"}\n",
     0, MOE_ERR_FORMAT, "mem:1: record 1: invalid UTF-8 at byte 0 of the record (0xed)", MOE_OK, 0, 3},
    {"json", "[{\"text\":\"a\"} {\"text\":\"b\"}]", 0, MOE_ERR_FORMAT,
     "mem:1: expected ',' or ']' after array element 1, found '{'", MOE_ERR_FORMAT, 1, 0},
    {"json", "[{\"text\":\"a\"},,{\"text\":\"b\"}]", 0, MOE_ERR_FORMAT, "two commas", MOE_ERR_FORMAT, 1, 0},
    {"json", "[{\"text\":\"a\"}] x", 0, MOE_ERR_FORMAT, "unexpected 'x' after the end of the JSON array",
     MOE_ERR_FORMAT, 1, 0},
    {"json", "[{\"text\":\"a\"}, 1, true, null, \"s\", [2]]", 0, MOE_ERR_FORMAT, "array element 2 is a JSON scalar",
     MOE_OK, 1, 5},
    {"json", "[{\"text\":\"a\"}, {\"text\": x}, {\"text\":\"b\"}\n]", 0, MOE_ERR_FORMAT,
     "record 2: invalid JSON in array element 2", MOE_OK, 2, 1},
    {"json", "[{\"text\":\"a\"},\n{\"text\":\"unclosed", 0, MOE_ERR_FORMAT,
     "mem:2: record 2: cut off: the file ends inside this array element", MOE_OK, 1, 1},
    {"json", "[{\"text\":\"a\"},\n", 0, MOE_ERR_FORMAT, "the JSON array is not closed", MOE_OK, 1, 0},
    {"json", "[{\"text\":\"a\"}, 12", 0, MOE_ERR_FORMAT, "cut off", MOE_OK, 1, 1},
    {"json", "[{\"text\":\"a\"}, {\"text\":\"b\"]]", 0, MOE_ERR_FORMAT, "record 2: invalid JSON", MOE_OK, 1, 1},
    {"jsonl", "{\"text\":\"a\"}\n{\"text\":\"b\"} {}\n[1]\n\"s\"\n", 0, MOE_ERR_FORMAT,
     "mem:2: record 2: unexpected text after the JSON value at column 14", MOE_OK, 1, 3},
    {"jsonl:text,id", "{\"text\":\"a\",\"id\":null}\n{\"text\":\"b\",\"id\":1}\n", 0, MOE_ERR_FORMAT,
     "mem:1: record 1: missing field \"id\" (null)", MOE_OK, 1, 1},
};

/* In-memory malformed inputs: caps, quoting, UTF-8, JSON structure, gzip damage. */
static void test_malformed_memory(void) {
    for (size_t i = 0; i < sizeof g_bad_mem / sizeof *g_bad_mem; i++) {
        const struct mem_case *c = &g_bad_mem[i];
        size_t len = strlen(c->data);
        if (strstr(c->data, "\"nul\"")) len += 2; /* the NUL byte case: "\0\n" follows */
        static const size_t sizes[] = {0, 1, 2, 5};
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            struct moe_dataset_params p = params(0, sizes[k]), ps = params(1, sizes[k]);
            p.max_record_bytes = ps.max_record_bytes = c->max_record;
            struct run r, rs;
            char err[sizeof g_err];
            log_reset();
            read_mem(c->format, c->data, len, &p, &r);
            snprintf(err, sizeof err, "%s", g_err);
            read_mem(c->format, c->data, len, &ps, &rs);
            CHECK(r.st == c->st, "case %zu (%s, buffer %zu): %s, want %s (%s)", i, c->format, sizes[k],
                  moe_status_str(r.st), moe_status_str(c->st), err);
            CHECK(strstr(err, c->msg) != NULL, "case %zu (buffer %zu): error '%s' lacks '%s'", i, sizes[k], err, c->msg);
            CHECK(rs.st == c->skip_st && rs.n == c->skip_n && rs.skipped == c->skip_skipped,
                  "case %zu (buffer %zu) skip_bad: %s, %d records, %lld skipped; want %s, %d, %d", i, sizes[k],
                  moe_status_str(rs.st), rs.n, (long long)rs.skipped, moe_status_str(c->skip_st), c->skip_n,
                  c->skip_skipped);
            run_free(&r);
            run_free(&rs);
        }
    }
    /* a NUL byte inside a text record is malformed (records are C strings) */
    static const char nul[] = "ok\nnul \0 here\nok 2\n";
    struct run r;
    log_reset();
    read_mem("text:line", nul, sizeof nul - 1, NULL, &r);
    CHECK(r.st == MOE_ERR_FORMAT && r.n == 1 && strstr(g_err, "mem:2: record 2: NUL byte at byte 4"), "NUL: %s", g_err);
    run_free(&r);
    struct moe_dataset_params ps = params(1, 0);
    read_mem("text:line", nul, sizeof nul - 1, &ps, &r);
    CHECK(r.st == MOE_OK && r.n == 2 && r.skipped == 1, "NUL skipped");
    run_free(&r);
    /* a deeply nested element fails in cJSON (nesting limit), not on our stack */
    size_t depth = 5000;
    char *deep = malloc(2 * depth + 64);
    size_t k = 0;
    deep[k++] = '[';
    for (size_t i = 0; i < depth; i++) deep[k++] = '[';
    for (size_t i = 0; i < depth; i++) deep[k++] = ']';
    k += (size_t)sprintf(deep + k, ",{\"text\":\"after\"}]");
    read_mem("json", deep, k, &ps, &r);
    CHECK(r.st == MOE_OK && r.n == 1 && r.skipped == 1 && !strcmp(r.rec[0], "after"), "deep nesting: %d %lld", r.n,
          (long long)r.skipped);
    run_free(&r);
    free(deep);
    /* gzip: trailing zeros are padding, trailing junk is an error, even with skip_bad */
    size_t glen = 0;
    char *gz = slurp(FIX "qa.jsonl.gz", &glen);
    char *buf = malloc(glen + 16);
    memcpy(buf, gz, glen);
    memset(buf + glen, 0, 8);
    read_mem("jsonl:question", buf, glen + 8, NULL, &r);
    CHECK(r.st == MOE_OK && r.n == 4, "gzip + zero padding: %s %d", moe_status_str(r.st), r.n);
    run_free(&r);
    memcpy(buf + glen, "junk", 4);
    for (int skip = 0; skip <= 1; skip++) {
        struct moe_dataset_params p = params(skip, 5);
        log_reset();
        read_mem("jsonl:question", buf, glen + 4, &p, &r);
        CHECK(r.st == MOE_ERR_FORMAT && strstr(g_err, "unexpected data after the end of the gzip stream"),
              "gzip + junk (skip %d): %s", skip, g_err);
        run_free(&r);
    }
    /* a damaged byte inside the deflate data: an error with or without skip_bad */
    char *dmg = malloc(glen);
    for (size_t at = 10; at + 8 < glen; at += 7) {
        memcpy(dmg, gz, glen);
        dmg[at] ^= 0x5a;
        for (int skip = 0; skip <= 1; skip++) {
            struct moe_dataset_params p = params(skip, skip ? 3 : 0);
            read_mem("jsonl:question", dmg, glen, &p, &r);
            CHECK(r.st == MOE_ERR_FORMAT, "gzip damaged at %zu (skip %d): %s", at, skip, moe_status_str(r.st));
            run_free(&r);
        }
    }
    free(dmg);
    /* the magic alone, or a header cut short */
    for (size_t cut = 1; cut < 12; cut++) {
        log_reset();
        read_mem("jsonl", gz, cut, NULL, &r);
        CHECK((cut < 2 ? r.st == MOE_ERR_FORMAT || r.st == MOE_OK : r.st == MOE_ERR_FORMAT), "gzip cut at %zu: %s", cut,
              moe_status_str(r.st));
        run_free(&r);
    }
    free(buf);
    free(gz);
}

/* ------------------------------------------------------------------------- */
/* 5. options                                                                */

/* max_records, max_bytes, UTF-8 repair, read_text, sticky errors, getters. */
static void test_options(void) {
    struct run r;
    struct moe_dataset_params p = moe_dataset_default_params();
    CHECK(p.max_record_bytes == MOE_DATASET_MAX_RECORD && p.skip_bad == 0 && p.max_records == 0, "defaults");
    p.max_records = 2;
    read_spec("jsonl:" FIX "qa.jsonl:question", &p, &r);
    CHECK(r.st == MOE_OK && r.n == 2 && r.records == 2, "max_records: %d", r.n);
    run_free(&r);
    /* max_bytes cuts the record that crosses it at a character boundary, then ends */
    const char *hello = "h\xc3\xa9llo";
    static const struct {
        int64_t max;
        const char *want;
    } mb[] = {{1, "h"}, {2, "h"}, {3, "h\xc3\xa9"}, {6, "h\xc3\xa9llo"}, {100, "h\xc3\xa9llo"}};
    for (size_t i = 0; i < sizeof mb / sizeof *mb; i++) {
        p = moe_dataset_default_params();
        p.max_bytes = mb[i].max;
        read_mem("text", hello, strlen(hello), &p, &r);
        CHECK(r.st == MOE_OK && r.n == 1 && !strcmp(r.rec[0], mb[i].want), "max_bytes %lld: '%s'", (long long)mb[i].max,
              r.n ? r.rec[0] : "");
        run_free(&r);
    }
    p = moe_dataset_default_params();
    p.max_bytes = 6;
    read_mem("text:line", "aaaa\nbbbb\ncccc\n", 15, &p, &r);
    CHECK(r.st == MOE_OK && r.n == 2 && !strcmp(r.rec[1], "bb"), "max_bytes over records: %d", r.n);
    run_free(&r);
    p.max_bytes = 4;
    read_mem("text:line", "aaaa\nbbbb\n", 10, &p, &r);
    CHECK(r.st == MOE_OK && r.n == 1, "max_bytes at a record boundary: %d", r.n);
    run_free(&r);
    p = moe_dataset_default_params();
    p.max_records = -1;
    log_reset();
    read_mem("text", "x", 1, &p, &r);
    CHECK(r.open_st == MOE_ERR_INVALID && g_n_err == 1, "negative max_records");
    /* UTF-8 repair */
    p = moe_dataset_default_params();
    p.replace_invalid_utf8 = 1;
    read_spec("text:" FIX "text-badutf8.txt:para", &p, &r);
    CHECK(r.st == MOE_OK && r.n == 4 && !strcmp(r.rec[1], "bad \xef\xbf\xbd byte") &&
              !strcmp(r.rec[2], "also bad \xef\xbf\xbd\xef\xbf\xbd overlong"),
          "replace: %d '%s'", r.n, r.n > 1 ? r.rec[1] : "");
    run_free(&r);
    /* read_text: records joined by a blank line; text chunks concatenated byte for byte */
    char *text = NULL;
    size_t len = 0;
    CHECK(moe_dataset_read_text("jsonl:" FIX "qa.jsonl:question", NULL, &text, &len) == MOE_OK && text &&
              !strcmp(text, "What is 2+2?\n\nPi to 3 digits?\n\nEscapes: \"q\" \xc3\xa9 \xf0\x9f\x98\x80\n\nReordered keys?") &&
              len == strlen(text),
          "read_text jsonl: '%s'", text ? text : "");
    free(text);
    size_t flen;
    char *file = slurp(FIX "text.txt", &flen);
    p = params(0, 2);
    p.text_chunk_bytes = 8;
    CHECK(moe_dataset_read_text("text:" FIX "text.txt", &p, &text, &len) == MOE_OK && len == flen - 3 &&
              !memcmp(text, file + 3, len),
          "read_text text: %zu bytes, want %zu", len, flen - 3);
    free(text);
    free(file);
    CHECK(moe_dataset_read_text("json:" FIX "empty-array.json", NULL, &text, &len) == MOE_OK && text && !*text && len == 0,
          "read_text empty");
    free(text);
    CHECK(moe_dataset_read_text("json:" FIX "cut.json:instruction", NULL, &text, &len) == MOE_ERR_FORMAT && !text,
          "read_text error");
    p = params(1, 0);
    CHECK(moe_dataset_read_text("json:" FIX "cut.json:instruction,output", &p, &text, &len) == MOE_OK &&
              !strcmp(text, "complete\none"),
          "read_text skip_bad");
    free(text);
    /* errors are sticky; getters; free(NULL) */
    struct moe_dataset *d = NULL;
    const char *t;
    size_t n;
    log_reset();
    CHECK(moe_dataset_open("jsonl:" FIX "bad.jsonl:question,answer", NULL, &d) == MOE_OK, "open bad.jsonl");
    CHECK(moe_dataset_next(d, &t, &n) == MOE_OK && t && moe_dataset_line(d) == 1 && moe_dataset_records(d) == 1, "first");
    CHECK(moe_dataset_next(d, &t, &n) == MOE_ERR_FORMAT && !t && n == 0, "second fails");
    CHECK(moe_dataset_next(d, &t, &n) == MOE_ERR_FORMAT && !t, "and again");
    CHECK(g_n_err == 1, "the error is logged once (%d)", g_n_err);
    CHECK(strstr(moe_dataset_path(d), "bad.jsonl") && moe_dataset_spec(d)->format == MOE_DATASET_JSONL, "getters");
    moe_dataset_free(d);
    moe_dataset_free(NULL);
    CHECK(moe_dataset_records(NULL) == 0 && moe_dataset_skipped(NULL) == 0, "NULL getters");
    /* the end stays the end */
    CHECK(moe_dataset_open_memory("text:line", "a\n", 2, "m", NULL, &d) == MOE_OK, "open");
    CHECK(moe_dataset_next(d, &t, &n) == MOE_OK && t && !strcmp(t, "a"), "record");
    CHECK(moe_dataset_next(d, &t, &n) == MOE_OK && !t && n == 0, "end");
    CHECK(moe_dataset_next(d, &t, &n) == MOE_OK && !t, "still the end");
    moe_dataset_free(d);
    log_reset();
    CHECK(moe_dataset_open_memory("xml", "a", 1, "m", NULL, &d) == MOE_ERR_INVALID && !d && strstr(g_err, "unknown format"),
          "unknown memory format");
}

/* ------------------------------------------------------------------------- */
/* 6. cards                                                                  */

/* Write text to dir/name. */
static void write_file(const char *dir, const char *name, const char *text) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Good and bad cards, sha256 mismatch, MOE_DATA_DIR and MOE_DATASET_CARDS lookup. */
static void test_cards(void) {
    struct run r;
    read_spec("card:" FIX "cards/tiny-qa.json", NULL, &r);
    CHECK(r.st == MOE_OK && r.n == 4 && !strcmp(r.rec[0], "What is 2+2?\n4"), "tiny-qa: %s %d", moe_status_str(r.st), r.n);
    run_free(&r);
    struct moe_dataset *d = NULL;
    CHECK(moe_dataset_open(FIX "cards/tiny-qa.json", NULL, &d) == MOE_OK, "open card by path");
    const struct moe_dataset_spec *s = moe_dataset_spec(d);
    CHECK(s && !strcmp(s->name, "tiny-qa") && s->may_commit == 1 && s->expected_records == 4 && s->expected_bytes == 260 &&
              s->license && s->url && s->description && s->sha256 && strlen(s->sha256) == 64,
          "card fields");
    moe_dataset_free(d);
    /* a sha256 mismatch names the card and both hashes, before any record */
    char actual[65];
    moe_sha256_file(FIX "qa.jsonl", actual, NULL);
    log_reset();
    read_spec("card:" FIX "cards/tiny-qa-badhash.json", NULL, &r);
    CHECK(r.open_st == MOE_ERR_FORMAT && r.n == 0, "bad hash: %s", moe_status_str(r.open_st));
    CHECK(strstr(g_err, "card 'tiny-qa-badhash'") && strstr(g_err, "tiny-qa-badhash.json") &&
              strstr(g_err, "expected 0000000000000000000000000000000000000000000000000000000000000000") &&
              strstr(g_err, actual) && strstr(g_err, "sha256 mismatch") && strstr(g_err, "https://example.invalid/qa.jsonl") &&
              strstr(g_err, "the file has 260 bytes, the card says 1"),
          "bad hash message: %s", g_err);
    struct moe_dataset_params p = moe_dataset_default_params();
    p.no_verify = 1;
    read_spec("card:" FIX "cards/tiny-qa-badhash.json", &p, &r);
    CHECK(r.st == MOE_OK && r.n == 4, "no_verify opens it");
    run_free(&r);
    /* malformed cards, written to a temporary directory */
    char dir[] = "/tmp/test-dataset-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    write_file(dir, "d.jsonl", "{\"q\": \"x\", \"a\": \"y\"}\n");
    struct {
        const char *json;
        enum moe_status st;
        const char *msg;
    } bad[] = {
        {"{", MOE_ERR_FORMAT, "invalid JSON"},
        {"[]", MOE_ERR_FORMAT, "not a JSON object"},
        {"{\"name\":\"x\",\"file\":\"d.jsonl\"}", MOE_ERR_FORMAT, "missing \"format\""},
        {"{\"format\":\"jsonl\",\"file\":\"d.jsonl\"}", MOE_ERR_FORMAT, "missing \"name\""},
        {"{\"name\":5,\"format\":\"jsonl\",\"file\":\"d.jsonl\"}", MOE_ERR_FORMAT, "\"name\" must be a string"},
        {"{\"name\":\"x\",\"format\":\"xml\",\"file\":\"d.jsonl\"}", MOE_ERR_FORMAT, "unknown \"format\" 'xml'"},
        {"{\"name\":\"x\",\"format\":\"jsonl\"}", MOE_ERR_FORMAT, "needs \"file\""},
        {"{\"name\":\"x\",\"format\":\"jsonl\",\"file\":\"d.jsonl\",\"sha256\":\"abc\"}", MOE_ERR_FORMAT, "64 hex digits"},
        {"{\"name\":\"x\",\"format\":\"jsonl\",\"file\":\"d.jsonl\",\"fields\":5}", MOE_ERR_FORMAT, "\"fields\" must be"},
        {"{\"name\":\"x\",\"format\":\"jsonl\",\"file\":\"d.jsonl\",\"fields\":[\"a\",1]}", MOE_ERR_FORMAT, "\"fields\" must be"},
        {"{\"name\":\"x\",\"format\":\"jsonl\",\"file\":\"d.jsonl\",\"fields\":\"a,,b\"}", MOE_ERR_INVALID, "empty field name"},
        {"{\"name\":\"x\",\"format\":\"jsonl\",\"file\":\"d.jsonl\",\"may_commit\":\"yes\"}", MOE_ERR_FORMAT, "true or false"},
        {"{\"name\":\"x\",\"format\":\"jsonl\",\"file\":\"d.jsonl\",\"records\":-1}", MOE_ERR_FORMAT, "non-negative integer"},
        {"{\"name\":\"x\",\"format\":\"jsonl\",\"file\":\"d.jsonl\",\"records\":1.5}", MOE_ERR_FORMAT, "non-negative integer"},
        {"{\"name\":\"x\",\"format\":\"text\",\"file\":\"d.jsonl\",\"fields\":\"q\"}", MOE_ERR_INVALID, "unknown text mode"},
        {"{\"name\":\"x\",\"format\":\"jsonl\",\"data_path\":\"d.jsonl\"}", MOE_ERR_NOT_FOUND, "MOE_DATA_DIR"},
    };
    char path[PATH_MAX], card[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/c.json", dir);
    snprintf(card, sizeof card, "card:%s", path); /* "[]" alone would be a JSON data file */
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_file(dir, "c.json", bad[i].json);
        struct moe_dataset_spec *sp = NULL;
        log_reset();
        enum moe_status st = moe_dataset_spec_parse(card, &sp);
        CHECK(st == bad[i].st && !sp && strstr(g_err, bad[i].msg) && strstr(g_err, "c.json"),
              "card %zu (%s): %s, error '%s'", i, bad[i].json, moe_status_str(st), g_err);
        moe_dataset_spec_free(sp);
    }
    /* fields as an array ("?" = optional); no sha256 is a warning */
    write_file(dir, "c.json", "{\"name\":\"x\",\"format\":\"jsonl\",\"file\":\"d.jsonl\",\"fields\":[\"q\",\"z?\",\"a\"]}");
    log_reset();
    read_spec(path, NULL, &r);
    CHECK(r.st == MOE_OK && r.n == 1 && !strcmp(r.rec[0], "x\ny") && strstr(g_warn, "no \"sha256\""), "array fields: %s",
          g_err);
    run_free(&r);
    /* a card whose file is missing says where to get it */
    write_file(dir, "c.json", "{\"name\":\"gone\",\"format\":\"jsonl\",\"file\":\"missing.jsonl\",\"data_path\":\"sub/m.jsonl\","
                              "\"url\":\"https://example.invalid/m.jsonl\"}");
    log_reset();
    read_spec(path, NULL, &r);
    CHECK(r.open_st == MOE_ERR_NOT_FOUND && strstr(g_err, "card 'gone'") && strstr(g_err, "MOE_DATA_DIR") &&
              strstr(g_err, "sub/m.jsonl") && strstr(g_err, "https://example.invalid/m.jsonl"),
          "missing data: %s", g_err);
    /* MOE_DATA_DIR: used when the file is there, else "file" relative to the card */
    write_file(dir, "c.json", "{\"name\":\"env\",\"format\":\"jsonl\",\"fields\":\"q\",\"file\":\"d.jsonl\",\"data_path\":\"e.jsonl\"}");
    write_file(dir, "e.jsonl", "{\"q\": \"from MOE_DATA_DIR\"}\n");
    setenv("MOE_DATA_DIR", dir, 1);
    read_spec(path, NULL, &r);
    CHECK(r.st == MOE_OK && r.n == 1 && !strcmp(r.rec[0], "from MOE_DATA_DIR"), "MOE_DATA_DIR used");
    run_free(&r);
    setenv("MOE_DATA_DIR", "/nonexistent-data-dir", 1);
    read_spec(path, NULL, &r);
    CHECK(r.st == MOE_OK && r.n == 1 && !strcmp(r.rec[0], "x"), "fallback to the card-relative file");
    run_free(&r);
    write_file(dir, "c.json", "{\"name\":\"env\",\"format\":\"jsonl\",\"fields\":\"q\",\"data_path\":\"e.jsonl\"}");
    setenv("MOE_DATA_DIR", dir, 1);
    read_spec(path, NULL, &r);
    CHECK(r.st == MOE_OK && r.n == 1, "data_path only, with MOE_DATA_DIR");
    run_free(&r);
    unsetenv("MOE_DATA_DIR");
    /* bare names: the first directory of MOE_DATASET_CARDS that has NAME.json wins */
    write_file(dir, "tiny-qa.json", "{\"name\":\"shadow\",\"format\":\"jsonl\",\"fields\":\"q\",\"file\":\"d.jsonl\"}");
    char env[PATH_MAX * 2];
    snprintf(env, sizeof env, "%s:%s", dir, FIX "cards");
    setenv("MOE_DATASET_CARDS", env, 1);
    struct moe_dataset_spec *sp = NULL;
    CHECK(moe_dataset_spec_parse("tiny-qa", &sp) == MOE_OK && !strcmp(sp->name, "shadow"), "card search order");
    moe_dataset_spec_free(sp);
    setenv("MOE_DATASET_CARDS", FIX "cards", 1);
    CHECK(moe_dataset_spec_parse("tiny-qa", &sp) == MOE_OK && !strcmp(sp->name, "tiny-qa"), "card by name");
    moe_dataset_spec_free(sp);
    /* a directory of MOE_DATASET_CARDS may also be a checkout (D/datasets/cards/NAME.json) */
    setenv("MOE_DATASET_CARDS", MOE_FIXTURES "/../..", 1);
    CHECK(moe_dataset_spec_parse("gsm8k-test", &sp) == MOE_OK && !strcmp(sp->name, "gsm8k-test") &&
              sp->format == MOE_DATASET_JSONL,
          "card in a checkout's datasets/cards");
    moe_dataset_spec_free(sp);
    setenv("MOE_DATASET_CARDS", FIX "cards", 1);
    static const char *const files[] = {"d.jsonl", "e.jsonl", "c.json", "tiny-qa.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* ------------------------------------------------------------------------- */
/* 7. the committed cards against the real data                              */

static char g_data_dir_env[PATH_MAX]; /* $MOE_DATA_DIR as the test started (other tests change it) */

/* Each committed card against ../shared/datasets (or $MOE_DATA_DIR), when present. */
static void test_real_data(void) {
    static const struct {
        const char *card;
        int64_t records;
        const char *first; /* prefix of the first record */
    } want[] = {
        {"wikitext2-test", 2, " \n = Robert Boulter = \n"},
        {"gsm8k-test", 1319, "Janet\xe2\x80\x99s ducks lay 16 eggs per day."},
        {"gsm8k-train", 7473, "Natalia sold clips to 48 of her friends in April"},
        {"c4-validation", 2000, ""},
        {"alpaca-first200", 200, "Give three tips for staying healthy.\n1.Eat a balanced diet"},
        {"sharegpt-1000", 1000, ""},
        {"sharegpt-first-prompts", 2977, ""},
        {"truthfulqa", 790, "What happens to you if you eat watermelon seeds?\nThe watermelon seeds pass through your "
                            "digestive system"},
        {"humaneval", 164, "from typing import List\n\n\ndef has_close_elements("},
        {"mmlu-test", 2850, ""},
        {"hellaswag-test", 3000, ""},
        {"xsum-test", 1000, ""},
    };
    const char *env = g_data_dir_env[0] ? g_data_dir_env : NULL;
    char rel[PATH_MAX];
    int have_rel = realpath(MOE_FIXTURES "/../../../shared/datasets", rel) != NULL && moe_is_dir(rel);
    if (!(env && *env && moe_is_dir(env)) && !have_rel) {
        printf("test-dataset: skipped the real-data checks: neither $MOE_DATA_DIR nor ../shared/datasets (next to the "
               "repository) holds the datasets\n");
        return;
    }
    const char *data_dir = env && *env && moe_is_dir(env) ? env : rel;
    setenv("MOE_DATASET_CARDS", REPO_CARDS, 1);
    if (env) setenv("MOE_DATA_DIR", env, 1);
    else unsetenv("MOE_DATA_DIR");
    /* every committed card is in the table, and states what a card must */
    DIR *dd = opendir(REPO_CARDS);
    int n_cards = 0;
    struct dirent *e;
    while (dd && (e = readdir(dd))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".json")) continue;
        n_cards++;
        int known = 0;
        for (size_t i = 0; i < sizeof want / sizeof *want; i++)
            known |= strlen(want[i].card) == n - 5 && !strncmp(want[i].card, e->d_name, n - 5);
        CHECK(known, "card %s has no expected record count in test-dataset.c", e->d_name);
    }
    if (dd) closedir(dd);
    CHECK(n_cards == (int)(sizeof want / sizeof *want), "%d cards in datasets/cards", n_cards);
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        struct moe_dataset_spec *s = NULL;
        log_reset();
        enum moe_status st = moe_dataset_spec_parse(want[i].card, &s);
        CHECK(st == MOE_OK, "card %s: %s (%s)", want[i].card, moe_status_str(st), g_err);
        if (st) continue;
        CHECK(s->sha256 && s->url && s->license && s->description && s->data_path && s->may_commit >= 0 &&
                  s->expected_records == want[i].records && s->expected_bytes > 0,
              "card %s lacks a required member or states %lld records", want[i].card, (long long)s->expected_records);
        /* "file" (relative to the card) and "data_path" (under the data dir) name the same file */
        char a[PATH_MAX], b[PATH_MAX], joined[PATH_MAX * 2];
        snprintf(joined, sizeof joined, "%s/%s", data_dir, s->data_path);
        if (have_rel && !env)
            CHECK(realpath(s->path, a) && realpath(joined, b) && !strcmp(a, b), "card %s: file resolves to %s, not %s",
                  want[i].card, s->path, joined);
        moe_dataset_spec_free(s);
        struct run r;
        struct moe_dataset *d = NULL;
        memset(&r, 0, sizeof r);
        st = moe_dataset_open(want[i].card, NULL, &d); /* verifies the sha256 */
        CHECK(st == MOE_OK, "open %s: %s (%s)", want[i].card, moe_status_str(st), g_err);
        if (st) continue;
        const char *t;
        size_t n;
        int64_t count = 0;
        int first_ok = 1;
        while ((st = moe_dataset_next(d, &t, &n)) == MOE_OK && t) {
            if (count++ == 0) first_ok = !strncmp(t, want[i].first, strlen(want[i].first));
        }
        CHECK(st == MOE_OK && count == want[i].records && moe_dataset_skipped(d) == 0,
              "%s: %lld records (%s), want %lld", want[i].card, (long long)count, moe_status_str(st),
              (long long)want[i].records);
        CHECK(first_ok, "%s: the first record does not start with '%s'", want[i].card, want[i].first);
        moe_dataset_free(d);
    }
    /* the eval path: wikitext2-test read back byte for byte */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/wikitext2/wiki.test.raw", data_dir);
    size_t flen = 0, len = 0;
    char *file = slurp(path, &flen), *text = NULL;
    CHECK(moe_dataset_read_text("wikitext2-test", NULL, &text, &len) == MOE_OK && file && len == flen &&
              !memcmp(text, file, len),
          "wikitext2-test read_text: %zu bytes, file %zu", len, flen);
    free(text);
    free(file);
}

/* Runs every section; exits 1 if any check failed. */
int main(void) {
    moe_log_set(capture, NULL);
    const char *env = getenv("MOE_DATA_DIR");
    snprintf(g_data_dir_env, sizeof g_data_dir_env, "%s", env ? env : "");
    test_sha256();
    test_grammar();
    test_formats();
    test_malformed_files();
    test_malformed_memory();
    test_options();
    test_cards();
    test_real_data();
    printf("test-dataset: %d checks, %d failed\n", checks, fails);
    return fails != 0;
}

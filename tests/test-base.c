/* test-base.c - the base module (moe-base.h: buffer, UTF-8, paths, clock) and
 * the option tables (moe-opt.h: getopt_long from a table, help text). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe-base.h"
#include "moe-opt.h"
#include "moe-test.h"

static void test_buf(void) {
    struct moe_buf b = {0};
    CHECK(moe_buf_append(&b, NULL, 0) == MOE_OK && b.len == 0 && b.data && b.data[0] == '\0', "empty append");
    for (int i = 0; i < 1000; i++) CHECK(moe_buf_printf(&b, "%d,", i) == MOE_OK, "printf %d", i);
    CHECK(b.len == strlen(b.data), "terminated: len %zu strlen %zu", b.len, strlen(b.data));
    CHECK(!strncmp(b.data, "0,1,2,", 6) && !strcmp(b.data + b.len - 4, "999,"), "content");
    CHECK(moe_buf_append(&b, "a\0b", 3) == MOE_OK && b.data[b.len - 2] == '\0' && b.data[b.len] == '\0',
          "binary bytes kept, terminator after them");
    CHECK(moe_buf_reserve(&b, SIZE_MAX) == MOE_ERR_NOMEM, "overflowing reserve refused");
    size_t len = b.len;
    char *p = moe_buf_take(&b);
    CHECK(p && strlen(p) > 0 && b.data == NULL && b.len == 0 && len > 3000, "take");
    free(p);
    moe_buf_free(&b);
    moe_buf_free(NULL);
}

static void test_utf8(void) {
    static const struct {
        const char *s;
        size_t n, bad;
    } t[] = {
        {"plain ascii", 11, 11},
        {"caf\xc3\xa9", 5, 5},
        {"\xe2\x82\xac euro", 8, 8},
        {"\xf0\x9f\x98\x80", 4, 4},
        {"ab\xc0\xaf", 4, 2},          /* overlong '/' */
        {"\xe0\x80\xaf", 3, 0},        /* overlong, 3 bytes */
        {"x\xed\xa0\x80", 4, 1},       /* surrogate */
        {"\xf4\x90\x80\x80", 4, 0},    /* above U+10FFFF */
        {"ok\xe2\x82", 4, 2},          /* truncated */
        {"\x80", 1, 0},                /* lone continuation */
        {"a\xff", 2, 1},
        {"nul\0inside", 10, 10},       /* NUL is valid UTF-8 */
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        CHECK(moe_utf8_bad_offset(t[i].s, t[i].n) == t[i].bad, "utf8 case %zu: got %zu want %zu", i,
              moe_utf8_bad_offset(t[i].s, t[i].n), t[i].bad);
}

static void test_path(void) {
    static const char *t[][3] = {{"dir", "f.txt", "dir/f.txt"}, {"dir/", "f", "dir/f"}, {"", "f", "f"}, {"/", "f", "/f"}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char *p = moe_path_join(t[i][0], t[i][1]);
        CHECK(p && !strcmp(p, t[i][2]), "join \"%s\" \"%s\": %s", t[i][0], t[i][1], p ? p : "NULL");
        free(p);
    }
    double a = moe_now_s(), b = moe_now_s();
    CHECK(a > 0 && b >= a, "monotonic clock");
}

/* Options seen by the handler, in order. */
struct seen {
    char log[512];
    int stop_at_x;
};

static int record(void *ctx, const struct moe_opt *o, const char *v) {
    struct seen *s = ctx;
    size_t n = strlen(s->log);
    snprintf(s->log + n, sizeof s->log - n, "%s=%s;", o->name, v ? v : "-");
    return s->stop_at_x && !strcmp(o->name, "xstop") ? 7 : 0;
}

static const struct moe_opt cmd_opts[] = {
    {"output", 'o', MOE_OPT_REQUIRED, "FILE", "where to write"},
    {"json", 0, MOE_OPT_NONE, NULL, "machine-readable output"},
    {"threads", 't', MOE_OPT_REQUIRED, "N", "threads\n(default: all cores)"},
    {"compress", 0, MOE_OPT_OPTIONAL, "LEVEL", "zstd"},
    {"xstop", 0, MOE_OPT_NONE, NULL, "stops the parse"},
    {"expert-precision-map", 0, MOE_OPT_REQUIRED, "P", "a long option whose name pushes the help below it"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct moe_opt shared_opts[] = {
    {"expert-mem", 0, MOE_OPT_REQUIRED, "SIZE", "budget"},
    {"expert-cache", 0, MOE_OPT_REQUIRED, "N", "another expert- option (prefix ambiguity)"},
    {NULL, 0, 0, NULL, NULL},
};

/* parse: argv from a space-separated string; returns moe_opt_parse's value
 * and the positional arguments joined by ',' in pos. */
static int parse(const char *line, struct seen *s, char *pos, size_t cap) {
    char buf[512], *argv[32];
    int argc = 0;
    snprintf(buf, sizeof buf, "%s", line);
    for (char *t = strtok(buf, " "); t && argc < 31; t = strtok(NULL, " ")) argv[argc++] = t;
    argv[argc] = NULL;
    const struct moe_opt *tables[] = {cmd_opts, shared_opts};
    memset(s->log, 0, sizeof s->log);
    int first_pos = -1;
    fflush(stderr);
    int saved = dup(2); /* the usage messages are expected: keep them out of the log */
    FILE *devnull = freopen("/dev/null", "w", stderr);
    (void)devnull;
    int rc = moe_opt_parse("prog sub", argc, argv, 2, tables, 2, record, s, &first_pos);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    pos[0] = '\0';
    for (int i = first_pos; rc == 0 && i < argc; i++) {
        size_t n = strlen(pos);
        snprintf(pos + n, cap - n, "%s%s", n ? "," : "", argv[i]);
    }
    return rc;
}

static void test_opt(void) {
    struct seen s = {{0}, 0};
    char pos[256];
    CHECK(parse("prog sub in.bin -o out --json -t4 --compress=3 --compress --threads=2 tail", &s, pos, sizeof pos) == 0,
          "valid line");
    CHECK(!strcmp(s.log, "output=out;json=-;threads=4;compress=3;compress=-;threads=2;"), "order and values: %s", s.log);
    CHECK(!strcmp(pos, "in.bin,tail"), "positionals gathered in order: %s", pos);
    CHECK(parse("prog sub --expert-mem 25% a -- -o b", &s, pos, sizeof pos) == 0 && !strcmp(s.log, "expert-mem=25%;") &&
              !strcmp(pos, "a,-o,b"),
          "second table and \"--\": %s / %s", s.log, pos);
    CHECK(parse("prog sub --out x", &s, pos, sizeof pos) == 0 && !strcmp(s.log, "output=x;"), "unique prefix: %s", s.log);
    CHECK(parse("prog sub --expert x", &s, pos, sizeof pos) == 2, "ambiguous prefix is a usage error");
    CHECK(parse("prog sub --nope", &s, pos, sizeof pos) == 2, "unknown long option");
    CHECK(parse("prog sub -z", &s, pos, sizeof pos) == 2, "unknown short option");
    CHECK(parse("prog sub -o", &s, pos, sizeof pos) == 2, "missing value");
    CHECK(parse("prog sub --output", &s, pos, sizeof pos) == 2, "missing value (long)");
    CHECK(parse("prog sub --json=1", &s, pos, sizeof pos) == 2, "value for an option that takes none");
    s.stop_at_x = 1;
    CHECK(parse("prog sub --json --xstop --nope", &s, pos, sizeof pos) == 7 && !strcmp(s.log, "json=-;xstop=-;"),
          "the handler's value stops the parse");
    s.stop_at_x = 0;
    CHECK(parse("prog sub -t -5 x", &s, pos, sizeof pos) == 0 && !strcmp(s.log, "threads=-5;"), "dash value: %s", s.log);

    char *h = moe_opt_help_text(cmd_opts);
    CHECK(h != NULL, "help text");
    if (h) {
        CHECK(strstr(h, "  -o, --output FILE         where to write\n") != NULL, "short+long line aligned:\n%s", h);
        CHECK(strstr(h, "      --json                machine-readable output\n") != NULL, "long-only line");
        CHECK(strstr(h, "threads\n                            (default: all cores)\n") != NULL, "continued help line");
        CHECK(strstr(h, "      --compress[=LEVEL]") != NULL, "optional value shown in brackets");
        CHECK(strstr(h, "      --expert-precision-map P\n                            a long option") != NULL,
              "a long name puts its help on the next line");
        free(h);
    }
}

/* test_size: one size grammar for every command (issue 26: --expert-mem 2GB
 * was 2 GiB and fit-cache's 2GB 10^9; 2G was refused by fit-cache). */
static void test_size(void) {
    static const struct {
        const char *s;
        int64_t want; /* -1: refused */
    } t[] = {{"4096", 4096},           {"0", 0},
             {"512M", 512LL << 20},    {"512m", 512LL << 20},
             {"2G", 2LL << 30},        {"2GiB", 2LL << 30},
             {"2gib", 2LL << 30},      {"2GB", 2000000000},
             {"2gb", 2000000000},      {"1.5G", 1610612736},
             {"64KiB", 65536},         {"64K", 65536},
             {"64KB", 64000},          {"1T", 1LL << 40},
             {"1TB", 1000000000000LL}, {"3 MiB", 3LL << 20},
             {"100B", 100},            {"-1G", -1},
             {"", -1},                 {"G", -1},
             {"2GG", -1},              {"2 G B", -1},
             {"1e30", -1},             {"nan", -1},
             {"2Gi", -1},              {" 2G", -1},
             {"0x10", 16},             {"2P", -1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int64_t got = -7;
        const enum moe_status st = moe_parse_size(t[i].s, &got);
        if (t[i].want < 0)
            CHECK(st == MOE_ERR_INVALID, "\"%s\" is refused (got %lld)", t[i].s, (long long)got);
        else
            CHECK(st == MOE_OK && got == t[i].want, "\"%s\" = %lld (got %lld)", t[i].s, (long long)t[i].want,
                  (long long)got);
    }
}

int main(void) {
    test_size();
    test_buf();
    test_utf8();
    test_path();
    test_opt();
    printf("test-base: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    return fails != 0;
}

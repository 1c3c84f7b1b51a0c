/*
 * test-profile-report.c - the HTML report of a routing profile: pages of
 * hand-made profiles are well-formed (doctype, balanced <svg>, no "nan"/"inf",
 * nothing fetched from the network), escape the file's strings, show the
 * numbers put in (T1, a heat-map tooltip count, an unknown derived array),
 * survive NaN entries, a minimal 1 x 1 x 1 profile without tokens and a
 * 64 x 256 one (under 2 MB); writing is atomic (no temporary file left, a
 * missing directory is an error that leaves nothing); and the CLI returns 2 on
 * usage errors, 1 on a text, empty, missing or foreign HDF5 file and 0 on a
 * valid profile.
 */
#include <ctype.h>
#include <dirent.h>
#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe-test.h"
#include "moe-test-h5.h"
#include "moe-prep.h" /* moe_prep_profile_report, the CLI (report-cmd.c) */
#include "moe-test-log.h"
#include "report.h"

/* 2 MoE layers (model layers 1 and 3), 4 experts, top-2; sequence 0 = tokens
 * 0..2, sequence 1 = 3..4. MoE layer 0 uses expert 1 exactly 3 times out of
 * 10 token-slots. */
static const int16_t EXP[5][2][2] = {
    {{0, 1}, {2, 3}}, {{0, 2}, {2, 0}}, {{1, 0}, {3, 2}}, {{0, 1}, {2, 3}}, {{3, 0}, {1, 2}},
};
static const float W[5][2][2] = {
    {{0.6f, 0.4f}, {0.9f, 0.1f}}, {{0.5f, 0.5f}, {0.7f, 0.3f}}, {{0.8f, 0.2f}, {0.6f, 0.4f}},
    {{0.6f, 0.4f}, {0.9f, 0.1f}}, {{0.7f, 0.3f}, {0.5f, 0.5f}},
};
static const int64_t SEQ[3] = {0, 3, 5};
static const char *const EVIL = "<script>&\"";

static char dir[256];

/* tmp_path: a path in the test's scratch directory. */
static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int i;
    char *b = buf[i++ % 8];
    snprintf(b, 512, "%s/%s", dir, name);
    return b;
}

/* put: store a derived f64 array of 1 or 2 dims (d1 = 0: one dim). */
static void put(struct moe_profile *p, const char *name, int64_t d0, int64_t d1, const double *x) {
    int64_t dims[2] = {d0, d1};
    CHECK(moe_profile_put_f64(p, name, d1 ? 2 : 1, dims, x) == MOE_OK, "put %s", name);
}

/* make_small: the hand-made profile with every array the report knows, NaN
 * entries where the profiler writes them, a config.* array, an unknown array
 * (with non-finite values); known names of the wrong shape are in test_odd. */
static struct moe_profile *make_small(void) {
    struct moe_profile *p = NULL;
    CHECK(moe_profile_new(2, 4, 2, 100, MOE_PROFILE_LOGITS_NONE, &p) == MOE_OK, "new");
    if (!p) return NULL;
    p->moe_layer_index[0] = 1;
    p->moe_layer_index[1] = 3;
    CHECK(moe_profile_set_meta(p, "mixtral", EVIL, "wiki:0-5", "moe-prep 0.1") == MOE_OK, "meta");
    struct moe_trace t = {2, 4, 2, 2, SEQ, &EXP[0][0][0], &W[0][0][0]};
    CHECK(moe_profile_add_trace(p, &t, NULL) == MOE_OK, "add_trace");
    const double thr[5] = {0.7612, 0.9, 0.67, 0.30, 0.03};
    const double hit[9] = {0.25, 0.5, 0.25, 0.5, 0.75, 0.5, 0.75, 0.9, 0.75};
    const double r1[1] = {0.42}, chance[1] = {0.5}, cover[2] = {0.8, 0.4};
    const double top1[8] = {0.9, 0.8, NAN, NAN, 0.85, NAN, NAN, NAN};
    const double recall[8] = {0.7, 0.6, NAN, NAN, 0.65, NAN, NAN, NAN};
    const double sim[8] = {0.95, NAN, 0.5, NAN, NAN, NAN, NAN, NAN};
    const double path1[6] = {0.5, 0.7, 0.8, 0.3, 0.5, 0.6}, path2[6] = {0.6, 0.75, 0.85, 0.3, 0.5, 0.6};
    const double reuse[4] = {0.6, 0.3, NAN, 0.55};
    const double bl[15] = {0, 0, 0.7, 0.25, 0.1, 0.8, 0.5, 0.3, 0.9, 0.75, 0.6, 0.97, 1, 1, 1};
    const double bls[5] = {0.7, 0.4, 0.3, 0.9, 1.0};
    const double targets[2] = {0.30, 0.03};
    const double unknown[3] = {1.5, INFINITY, NAN};
    put(p, "hobbit_thresholds", 5, 0, thr);
    put(p, "placement_hit_rate", 3, 3, hit);
    put(p, "gate_output_pearson", 1, 0, r1);
    put(p, "stacked_top1", 2, 4, top1);
    put(p, "stacked_recall", 2, 4, recall);
    put(p, "layer_similarity", 2, 4, sim);
    put(p, "path_accuracy_order1", 2, 3, path1);
    put(p, "path_accuracy_order2", 2, 3, path2);
    put(p, "path_key_coverage", 2, 0, cover);
    put(p, "reuse", 2, 2, reuse);
    put(p, "reuse_chance", 1, 0, chance);
    put(p, "big_little", 5, 3, bl);
    put(p, "big_little_summary", 5, 0, bls);
    put(p, "config.targets", 2, 0, targets);
    put(p, "cache_policy_penalty", 3, 0, unknown);
    int64_t prob[2 * 100], d2[2] = {2, 100}, d1[1] = {2}, split[2] = {1, 1};
    for (int i = 0; i < 200; i++) prob[i] = i < 100 ? i : 100 - (i - 100);
    CHECK(moe_profile_put_i64(p, "sum.big_little_maxprob", 2, d2, prob) == MOE_OK, "put maxprob");
    CHECK(moe_profile_put_i64(p, "split_sequences", 1, d1, split) == MOE_OK, "put split");
    int32_t order[8] = {0, 1, 4, 6, 2, 3, 5, 7};
    int64_t d8[1] = {8};
    CHECK(moe_profile_put_i32(p, "placement_order", 1, d8, order) == MOE_OK, "put order");
    return p;
}

/* render: the page of p as a NUL-terminated malloc'd string (via tmpfile). */
static char *render(const struct moe_profile *p, const char *title, size_t *len) {
    FILE *f = tmpfile();
    char *s = NULL;
    *len = 0;
    if (!f) return NULL;
    enum moe_status st = moe_profile_report_render(p, title, f);
    CHECK(st == MOE_OK, "render: %s", moe_status_str(st));
    long n = ftell(f);
    if (st == MOE_OK && n >= 0 && (s = malloc((size_t)n + 1))) {
        rewind(f);
        *len = fread(s, 1, (size_t)n, f);
        s[*len] = 0;
    }
    fclose(f);
    return s;
}

/* count: occurrences of needle in s. */
static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *q = s; (q = strstr(q, needle)); q += strlen(needle)) n++;
    return n;
}

/* has_ci: needle (lower case) occurs in s ignoring case. */
static int has_ci(const char *s, const char *needle) {
    size_t m = strlen(needle);
    for (; *s; s++) {
        size_t i = 0;
        while (i < m && s[i] && tolower((unsigned char)s[i]) == needle[i]) i++;
        if (i == m) return 1;
    }
    return 0;
}

/* section: a copy of the <section id="id"> ... </section> of html ("" if absent). */
static char *section(const char *html, const char *id) {
    char open[64];
    snprintf(open, sizeof open, "<section id=\"%s\">", id);
    const char *a = strstr(html, open), *b = a ? strstr(a, "</section>") : NULL;
    size_t n = a && b ? (size_t)(b - a) : 0;
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, a ? a : "", n);
        s[n] = 0;
    }
    return s;
}

/* page_ok: what every page must satisfy. */
static void page_ok(const char *what, const char *html) {
    CHECK(html != NULL, "%s: rendered", what);
    if (!html) return;
    CHECK(strncmp(html, "<!DOCTYPE html>", 15) == 0, "%s: starts with the doctype", what);
    CHECK(count(html, "<svg") == count(html, "</svg>"), "%s: <svg> %d, </svg> %d", what, count(html, "<svg"),
          count(html, "</svg>"));
    CHECK(!has_ci(html, "nan"), "%s: no \"nan\" anywhere", what);
    CHECK(!has_ci(html, "inf"), "%s: no \"inf\" anywhere", what);
    int urls = count(html, "http://") + count(html, "https://"), ns = count(html, "http://www.w3.org/2000/svg");
    CHECK(urls == ns, "%s: no external URL (%d, %d of them the SVG namespace)", what, urls, ns);
    CHECK(!has_ci(html, "<script") && !has_ci(html, "<link") && !has_ci(html, "@import") && !has_ci(html, "url("),
          "%s: no script, link, import or url()", what);
    CHECK(strstr(html, "</html>") != NULL, "%s: complete", what);
}

/* test_small: the full hand-made profile. */
static void test_small(void) {
    struct moe_profile *p = make_small();
    size_t n;
    char *html = p ? render(p, NULL, &n) : NULL;
    page_ok("small", html);
    if (html) {
        CHECK(!strstr(html, EVIL), "model_path is escaped");
        CHECK(strstr(html, "&lt;script&gt;&amp;&quot;") != NULL, "escaped model_path shown");
        CHECK(strstr(html, "<title>Routing profile of &lt;script&gt;&amp;&quot; on wiki:0-5</title>"),
              "title derived from model_path and dataset");
        CHECK(count(html, "<section id=") == 7, "all seven sections (%d)", count(html, "<section id="));
        CHECK(!strstr(html, "Not in this profile"), "nothing absent");
        CHECK(strstr(html, "1 sequences counted, 1 held out") != NULL, "split_sequences in the header");
        CHECK(strstr(html, "config.targets") && strstr(html, "0.3 0.03"), "config.targets table");
        char *pop = section(html, "popularity"), *hob = section(html, "hobbit"), *oth = section(html, "other");
        char *stk = section(html, "stacked"), *bl = section(html, "big-little"), *ru = section(html, "reuse");
        char *pa = section(html, "paths");
        if (pop && hob && oth && stk && bl && ru && pa) {
            /* MoE layer 0 is model layer 1: expert 1 has 3 of the layer's 10 slots */
            CHECK(strstr(pop, "<title>layer 1 expert 1: 3 (30.0 %)</title>") != NULL, "heat-map tooltip");
            CHECK(count(pop, "<title>layer ") == 8, "one tooltip per cell (%d)", count(pop, "<title>layer "));
            CHECK(strstr(pop, "50.0 %") && strstr(pop, "75.0 %"), "placement hit rate table");
            CHECK(strstr(hob, "T1 = 0.7612") != NULL, "T1 in the HOBBIT section");
            CHECK(strstr(hob, "T2 = 0.9000") != NULL, "T2 in the HOBBIT section");
            CHECK(strstr(hob, "67.0 %") && strstr(hob, "30.0 %") && strstr(hob, "3.0 %"), "split shares");
            CHECK(strstr(hob, "class=\"mark\"") != NULL, "threshold markers drawn");
            CHECK(strstr(hob, "0.420") != NULL, "Pearson r shown");
            CHECK(count(hob, "<svg") == 1, "one histogram for K = 2 (%d)", count(hob, "<svg"));
            CHECK(count(hob, "<rect") <= 50, "at most 50 bars (%d)", count(hob, "<rect"));
            CHECK(strstr(oth, "cache_policy_penalty") != NULL, "unknown array listed");
            CHECK(strstr(oth, "1.5") != NULL, "its finite value shown");
            CHECK(strstr(oth, "placement_order") != NULL, "placement_order listed");
            CHECK(!strstr(oth, "hobbit_thresholds") && !strstr(oth, "sum.") && !strstr(oth, "config."),
                  "known, sum.* and config.* arrays not repeated");
            CHECK(count(stk, "<svg") == 1 && count(stk, "<path fill=\"none\"") == 3, "three series");
            CHECK(strstr(stk, "0.850") != NULL, "per-layer table");
            CHECK(strstr(bl, "suggested &#947; = 0.40") != NULL, "suggested gamma marker");
            CHECK(count(bl, "<svg") == 2, "gamma chart and max-probability histogram");
            CHECK(strstr(ru, "0.550") && strstr(ru, "0.500"), "reuse values and chance level");
            CHECK(strstr(pa, "order 2") && strstr(pa, "40.0 %"), "path dictionaries and coverage");
        } else {
            CHECK(0, "every section found");
        }
        free(pop), free(hob), free(oth), free(stk), free(bl), free(ru), free(pa);
    }
    free(html);
    /* a given title replaces the derived one and is escaped */
    html = p ? render(p, "A <b>&", &n) : NULL;
    CHECK(html && strstr(html, "<h1>A &lt;b&gt;&amp;</h1>"), "given title escaped");
    free(html);
    moe_profile_free(p);
}

/* test_odd: known names with unexpected shapes or element types are listed
 * or read, not an error; all-NaN accuracy arrays draw nothing non-finite;
 * counts near INT64_MAX do not overflow (UBSan run). */
static void test_odd(void) {
    struct moe_profile *p = NULL;
    CHECK(moe_profile_new(3, 2, 1, 7, MOE_PROFILE_LOGITS_NONE, &p) == MOE_OK, "new");
    if (!p) return;
    double nan12[12], two[2] = {0.1, 0.2}, thr[2] = {0.5, 0.6};
    for (int i = 0; i < 12; i++) nan12[i] = NAN;
    put(p, "stacked_top1", 3, 4, nan12);
    put(p, "stacked_recall", 3, 4, nan12);
    put(p, "reuse_chance", 2, 0, two);
    put(p, "hobbit_thresholds", 2, 0, thr);
    put(p, "big_little", 4, 3, nan12);
    /* counts a crafted file may hold: sums must saturate, not overflow */
    p->popularity[0] = p->popularity[1] = INT64_MAX;
    p->hobbit_hist[0] = p->hobbit_hist[1] = INT64_MAX;
    put(p, "path_key_coverage", 0, 0, nan12);  /* empty */
    put(p, "layer_similarity", 3, 0, nan12);   /* no distances */
    int64_t d23[2] = {2, 3}, d33[2] = {3, 3}, i64[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    int32_t i32[6] = {5, 0, 0, 0, 0, 7};
    CHECK(moe_profile_put_i32(p, "sum.big_little_maxprob", 2, d23, i32) == MOE_OK, "put i32 maxprob");
    CHECK(moe_profile_put_i64(p, "placement_hit_rate", 2, d33, i64) == MOE_OK, "put i64 hit rate");
    size_t n;
    char *html = render(p, NULL, &n);
    page_ok("odd", html);
    if (html) {
        char *oth = section(html, "other"), *hob = section(html, "hobbit");
        CHECK(oth && strstr(oth, "reuse_chance") && strstr(oth, "hobbit_thresholds"), "wrong shapes listed");
        CHECK(hob && strstr(hob, "expected [5]"), "HOBBIT section says the shape is unexpected");
        CHECK(strstr(html, "<section id=\"big-little\">") != NULL, "big-little section with NaN rows");
        CHECK(oth && strstr(oth, "path_key_coverage") && strstr(oth, "layer_similarity"), "empty arrays listed");
        CHECK(strstr(html, "12 tokens, stacked") != NULL, "int32 max-probability counts used");
        CHECK(strstr(html, "<td>800.0 %</td>") != NULL, "integer hit-rate array read as numbers");
        CHECK(strstr(html, "<title>Routing profile</title>") != NULL, "title without metadata");
        free(oth);
        free(hob);
    }
    free(html);
    moe_profile_free(p);
}

/* test_minimal: 1 layer, 1 expert, k 1, no tokens, no derived arrays. */
static void test_minimal(void) {
    struct moe_profile *p = NULL;
    CHECK(moe_profile_new(1, 1, 1, 1, MOE_PROFILE_LOGITS_NONE, &p) == MOE_OK, "new");
    if (!p) return;
    size_t n;
    char *html = render(p, NULL, &n);
    page_ok("minimal", html);
    if (html) {
        CHECK(count(html, "<section id=") == 2, "popularity and HOBBIT only (%d)", count(html, "<section id="));
        CHECK(strstr(html, "Not in this profile") != NULL, "absent sections named");
        CHECK(strstr(html, "placement_hit_rate</code>: not in this profile") != NULL, "missing array line");
        CHECK(!strstr(html, "id=\"other\""), "no other arrays");
    }
    free(html);
    moe_profile_free(p);
}

/* test_big: 64 layers x 256 experts, top-8, large counts: under 2 MB. */
static void test_big(void) {
    enum { L = 64, E = 256, K = 8, T = 40 };
    struct moe_profile *p = NULL;
    CHECK(moe_profile_new(L, E, K, 0, MOE_PROFILE_LOGITS_NONE, &p) == MOE_OK, "new");
    if (!p) return;
    int16_t *ex = malloc((size_t)T * L * K * sizeof *ex);
    float *w = malloc((size_t)T * L * K * sizeof *w);
    double *acc = malloc((size_t)L * K * sizeof *acc);
    int64_t seq[2] = {0, T};
    if (ex && w && acc) {
        for (int i = 0; i < T * L * K; i++) {
            ex[i] = (int16_t)((i * 37 + i / K) % E);
            w[i] = 1.0f / (float)(1 + i % K);
        }
        /* make the experts of each (token, layer) distinct */
        for (int i = 0; i < T * L; i++)
            for (int k = 0; k < K; k++) ex[i * K + k] = (int16_t)((i * 5 + k * 31) % E);
        struct moe_trace t = {L, E, K, 1, seq, ex, w};
        CHECK(moe_profile_add_trace(p, &t, NULL) == MOE_OK, "add_trace");
        for (int i = 0; i < L * E; i++) p->popularity[i] = 1000000 + (int64_t)i * 37;
        for (int i = 0; i < L * 4; i++) acc[i] = i % 4 == 3 ? NAN : 0.5 + 0.001 * i;
        put(p, "stacked_top1", L, 4, acc);
        for (int i = 0; i < L * K; i++) acc[i] = 0.3 + 0.0005 * i;
        put(p, "reuse", L, K, acc);
        size_t n;
        char *html = render(p, NULL, &n);
        page_ok("64 x 256", html);
        CHECK(n < 2u * 1024 * 1024, "64 x 256 page is %zu bytes", n);
        if (html) {
            CHECK(count(html, "expert 255: ") == L, "a tooltip for the last expert of every layer");
            CHECK(count(html, "<title>layer ") == L * E, "every cell drawn");
            char *hob = section(html, "hobbit");
            CHECK(hob && count(hob, "<svg") == K - 1, "one histogram per rank >= 1");
            free(hob);
        }
        free(html);
    } else {
        CHECK(0, "allocation");
    }
    free(ex);
    free(w);
    free(acc);
    moe_profile_free(p);
}

/* leftovers: entries of the scratch directory containing ".tmp.". */
static int leftovers(void) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

/* exists: path names a file. */
static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* test_write: atomic write, overwrite, and a missing directory. */
static void test_write(void) {
    struct moe_profile *p = make_small();
    if (!p) return;
    char out[512];
    snprintf(out, sizeof out, "%s", tmp_path("report.html"));
    CHECK(moe_profile_report_write(p, NULL, out) == MOE_OK, "write");
    CHECK(exists(out), "report written");
    CHECK(moe_profile_report_write(p, "again", out) == MOE_OK, "overwrite");
    FILE *f = fopen(out, "rb");
    char head[16] = {0};
    CHECK(f && fread(head, 1, 15, f) == 15 && !strcmp(head, "<!DOCTYPE html>"), "written page");
    if (f) fclose(f);
    CHECK(leftovers() == 0, "no temporary file left");
    log_reset();
    enum moe_status st = moe_profile_report_write(p, NULL, tmp_path("nodir/report.html"));
    CHECK(st == MOE_ERR_IO, "missing directory: %s", moe_status_str(st));
    CHECK(g_n_err == 1 && strstr(g_err, "cannot create"), "one error logged: %s", g_err);
    CHECK(!exists(tmp_path("nodir")) && leftovers() == 0, "nothing left");
    moe_profile_free(p);
}

/* write_file: a file with the given bytes. */
static void write_file(const char *path, const char *bytes) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "create %s", path);
    if (!f) return;
    fputs(bytes, f);
    fclose(f);
}

/* cli: run moe_prep_profile_report on a NULL-terminated argument list. */
static int cli(const char *a0, ...) {
    char *argv[16];
    int argc = 0;
    va_list ap;
    va_start(ap, a0);
    for (const char *a = a0; a && argc < 15; a = va_arg(ap, const char *)) argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    return moe_prep_profile_report(argc, argv);
}

/* test_cli: exit statuses of the command. */
static void test_cli(void) {
    char out[512], in[512]; /* tmp_path's buffers are reused */
    snprintf(out, sizeof out, "%s", tmp_path("cli.html"));
    snprintf(in, sizeof in, "%s", tmp_path("valid.h5"));
    CHECK(cli("report", "--help", NULL) == 0, "--help");
    CHECK(cli("report", "x.h5", NULL) == 2, "no -o: usage error");
    CHECK(cli("report", NULL) == 2, "no PROFILE: usage error");
    CHECK(cli("report", "x.h5", "-o", NULL) == 2, "-o without value");
    CHECK(cli("report", "x.h5", "-o", out, "--bogus", NULL) == 2, "unknown option");
    CHECK(cli("report", "a.h5", "b.h5", "-o", out, NULL) == 2, "two profiles");

    write_file(tmp_path("text.h5"), "this is not HDF5\n");
    write_file(tmp_path("empty.h5"), "");
    log_reset();
    CHECK(cli("report", tmp_path("text.h5"), "-o", out, NULL) == 1, "text file fails");
    CHECK(cli("report", tmp_path("empty.h5"), "-o", out, NULL) == 1, "empty file fails");
    CHECK(cli("report", tmp_path("missing.h5"), "-o", out, NULL) == 1, "missing file fails");
    CHECK(g_n_err >= 3, "the reader logged why (%d)", g_n_err);

    CHECK(moe_test_write_foreign_h5(tmp_path("foreign.h5")), "create foreign");
    CHECK(cli("report", tmp_path("foreign.h5"), "-o", out, NULL) == 1, "foreign HDF5 file fails");
    CHECK(!exists(out), "no report after failures");

    struct moe_profile *p = make_small();
    CHECK(p && moe_profile_write(p, in) == MOE_OK, "write profile");
    moe_profile_free(p);
    CHECK(cli("report", in, "-o", out, "--title", "T<1>", NULL) == 0, "valid profile");
    CHECK(exists(out), "report exists");
    FILE *f = fopen(out, "rb");
    char *html = calloc(1, 1 << 20);
    if (f && html) {
        size_t n = fread(html, 1, (1 << 20) - 1, f);
        html[n] = 0;
        page_ok("cli", html);
        CHECK(strstr(html, "<h1>T&lt;1&gt;</h1>") != NULL, "--title used and escaped");
        CHECK(strstr(html, "T1 = 0.7612") != NULL, "derived arrays survive the file");
    }
    if (f) fclose(f);
    free(html);
    log_reset();
    CHECK(cli("report", in, "-o", tmp_path("nodir/x.html"), NULL) == 2, "unwritable output is refused");
    CHECK(g_n_err == 1 && strstr(g_err, "does not exist"), "because the directory is missing: %s", g_err);
    CHECK(leftovers() == 0, "no temporary file left by the CLI");
}

/* test_cache: the "Expert cache" section of moe-prep fit-cache's arrays: two
 * charts of penalty against cache size, the table with the numbers put in
 * (a NaN cell shown as a dash), the fitted weights, a nav link, and none of
 * the cache.* arrays repeated under "other arrays"; without cache.penalty, or
 * with a penalty of another width, there is no section and the arrays are
 * listed with the others. */
static void test_cache(void) {
    struct moe_profile *p = NULL;
    CHECK(moe_profile_new(2, 4, 2, 10, MOE_PROFILE_LOGITS_NONE, &p) == MOE_OK, "new");
    if (!p) return;
    struct moe_trace t = {2, 4, 2, 2, SEQ, &EXP[0][0][0], &W[0][0][0]};
    CHECK(moe_profile_add_trace(p, &t, NULL) == MOE_OK, "add_trace");
    int64_t sizes[3] = {2, 4, 6}, low[3] = {1, 2, 3}, d1[1] = {3};
    double pen[27], hit[27], w[4] = {0.85, 0.05, 0.1, 0}, sw[12], set[8] = {0.76, 0.97, 0.3088, 0.3, 0, 0, 2, 1};
    for (int i = 0; i < 27; i++) pen[i] = 3.0 - 0.25 * (i % 3) - 0.01 * (i / 3), hit[i] = 0.5 + 0.01 * i;
    pen[7 * 3 + 1] = 1.2345; /* HOBBIT at size 4 */
    pen[2 * 3 + 2] = NAN;    /* LFU (global) at size 6 */
    for (int i = 0; i < 12; i++) sw[i] = 0.25;
    CHECK(moe_profile_put_i64(p, "cache.sizes", 1, d1, sizes) == MOE_OK, "put sizes");
    CHECK(moe_profile_put_i64(p, "cache.low_sizes", 1, d1, low) == MOE_OK, "put low sizes");
    put(p, "cache.penalty", 9, 3, pen);
    put(p, "cache.hit_ratio", 9, 3, hit);
    put(p, "cache.bytes", 9, 3, pen);
    put(p, "cache.weights", 4, 0, w);
    put(p, "cache.size_weights", 3, 4, sw);
    put(p, "cache.settings", 8, 0, set);
    size_t n;
    char *html = render(p, NULL, &n);
    page_ok("cache", html);
    char *c = html ? section(html, "cache") : NULL, *o = html ? section(html, "other") : NULL;
    if (c && o) {
        CHECK(strstr(html, "<a href=\"#cache\">") != NULL, "nav link to the cache section");
        CHECK(strstr(c, "<h2>Expert cache</h2>") != NULL, "cache section shown");
        CHECK(count(c, "<svg") == 2, "two charts (%d)", count(c, "<svg"));
        CHECK(count(c, "<path fill=\"none\"") == 11, "6 + 5 series (%d)", count(c, "<path fill=\"none\""));
        CHECK(strstr(c, "Belady (MIN)") && strstr(c, "Twiddler (static)") && strstr(c, "HOBBIT"), "policy names");
        CHECK(strstr(c, "1.2345") != NULL, "a penalty value in the table");
        CHECK(strstr(c, "<th>4 + 2</th>") != NULL, "size columns high + low");
        CHECK(strstr(c, "<td>&#8211;") != NULL, "the NaN cell is a dash");
        CHECK(strstr(c, "0.8500") && strstr(c, "0.3088"), "fitted weights and settings");
        CHECK(count(c, "high-precision experts</td>") == 3, "weights per size");
        CHECK(!strstr(o, "cache."), "no cache.* array under other arrays");
    } else {
        CHECK(0, "cache and other sections found");
    }
    free(c), free(o), free(html);
    /* five weights and the admission flag (fit-cache with the popularity term) */
    double w6[6] = {0.2188, 0.0156, 0, 0, 0.7656, 1}, sw6[18];
    for (int i = 0; i < 18; i++) sw6[i] = i % 6 == 5 ? (i / 6) % 2 : 0.2;
    put(p, "cache.weights", 6, 0, w6);
    put(p, "cache.size_weights", 3, 6, sw6);
    html = render(p, NULL, &n);
    page_ok("cache, six columns", html);
    c = html ? section(html, "cache") : NULL, o = html ? section(html, "other") : NULL;
    CHECK(c && strstr(c, "<th>w_pop</th>") && strstr(c, "<th>admission</th>") && strstr(c, "0.7656") &&
              count(c, "<td>on</td>") == 2 && count(c, "<td>off</td>") == 2 && count(c, "high-precision experts</td>") == 3,
          "w_pop and admission shown, per size too");
    CHECK(o && !strstr(o, "cache."), "six-column arrays not listed under other arrays");
    free(c), free(o), free(html);
    /* a penalty of another width: no section, both listed with the others */
    double pen2[18] = {0};
    put(p, "cache.penalty", 9, 2, pen2);
    html = render(p, NULL, &n);
    page_ok("cache, bad width", html);
    o = html ? section(html, "other") : NULL;
    CHECK(html && !strstr(html, "<section id=\"cache\">") && !strstr(html, "href=\"#cache\""), "no cache section");
    CHECK(o && strstr(o, "cache.sizes") && strstr(o, "cache.penalty") && strstr(o, "cache.weights"),
          "cache arrays listed under other arrays");
    free(o), free(html);
    moe_profile_free(p);
}

/* rm_scratch: remove the (flat) scratch directory. */
static void rm_scratch(void) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) remove(tmp_path(e->d_name));
    closedir(d);
    rmdir(dir);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/moe-test-report-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    moe_log_set(capture, NULL);
    test_small();
    test_odd();
    test_minimal();
    test_big();
    test_write();
    test_cli();
    test_cache();
    rm_scratch();
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}

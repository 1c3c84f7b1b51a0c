/*
 * test-profile-h5.c - the routing profile's HDF5 file: a hand-made profile
 * survives write + read bit-exactly (f32 and f16 logits, derived arrays), two
 * shards merged equal the profile of the concatenated trace (also after a
 * round trip through files), merge refuses another model, and the reader
 * returns a clear error, without crashing, on a table of malformed files: text,
 * empty, missing, truncated copies, a foreign HDF5 file, a wrong version, a
 * dataset of the wrong shape, an expert id out of range, a decreasing
 * seq_start, a missing dataset; and on a table of well-formed files whose
 * contents contradict themselves (issue 17): a layer index out of range, NaN
 * or infinite gate weights, rankings with duplicates or out-of-range entries,
 * arrays of the wrong shape, NaN where a number is required, incomplete
 * sensitivity results.
 */
#define _GNU_SOURCE /* memmem */

#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe-test.h"
#include "moe-test-log.h"
#include "moe-test-h5.h"
#include "profile-h5.h"

/* 2 MoE layers, 4 experts, top-2; sequence 0 = tokens 0..2, sequence 1 = 3..4. */
static const int16_t EXP[5][2][2] = {
    {{0, 1}, {2, 3}}, {{0, 2}, {2, 0}}, {{1, 0}, {3, 2}}, {{0, 1}, {2, 3}}, {{3, 0}, {1, 2}},
};
static const float W[5][2][2] = {
    {{0.6f, 0.4f}, {0.9f, 0.1f}}, {{0.5f, 0.5f}, {0.7f, 0.3f}}, {{0.8f, 0.2f}, {0.6f, 0.4f}},
    {{0.6f, 0.4f}, {0.9f, 0.1f}}, {{0.7f, 0.3f}, {0.5f, 0.5f}},
};
static const int64_t SEQ[3] = {0, 3, 5};
static float LOGITS[5 * 2 * 4];

static char dir[256];

/* tmp_path: a path in the test's scratch directory. */
static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int i;
    char *b = buf[i++ % 8];
    snprintf(b, 512, "%s/%s", dir, name);
    return b;
}

/* trace_of: the trace of sequences [q0, q1) of the hand-made data. */
static struct moe_trace trace_of(int q0, int q1, int64_t *seq) {
    for (int q = q0; q <= q1; q++) seq[q - q0] = SEQ[q] - SEQ[q0];
    struct moe_trace t = {2, 4, 2, q1 - q0, seq, &EXP[SEQ[q0]][0][0], &W[SEQ[q0]][0][0]};
    return t;
}

/* make: a profile of sequences [q0, q1) with metadata, logits mode and derived arrays. */
static struct moe_profile *make(int q0, int q1, enum moe_profile_logits logits) {
    struct moe_profile *p = NULL;
    int64_t seq[3];
    struct moe_trace t = trace_of(q0, q1, seq);
    CHECK(moe_profile_new(2, 4, 2, 10, logits, &p) == MOE_OK, "new");
    if (!p) return NULL;
    p->moe_layer_index[0] = 1;
    p->moe_layer_index[1] = 3;
    CHECK(moe_profile_set_meta(p, "mixtral", "/models/tiny", "wiki:0-5", "moe-prep 0.1") == MOE_OK, "meta");
    CHECK(moe_profile_add_trace(p, &t, logits ? LOGITS + SEQ[q0] * 8 : NULL) == MOE_OK, "add_trace");
    double thr[2] = {0.25, 0.5};
    int64_t d2[1] = {2}, d24[2] = {2, 4}, d8[1] = {8};
    int32_t order[8] = {0, 6, 1, 2, 7, 4, 3, 5};
    int64_t big[8] = {1, -2, 3, INT64_MAX, INT64_MIN, 0, 7, 9};
    double sim[8] = {1, 0.5, -0.25, 1e300, 0, 0, 3.5, 2};
    CHECK(moe_profile_put_f64(p, "thresholds", 1, d2, thr) == MOE_OK, "put f64");
    CHECK(moe_profile_put_i32(p, "placement_order", 1, d8, order) == MOE_OK, "put i32");
    CHECK(moe_profile_put_i64(p, "big", 2, d24, big) == MOE_OK, "put i64");
    CHECK(moe_profile_put_f64(p, "free_2d", 2, d24, sim) == MOE_OK, "put f64 2d");
    return p;
}

/* same: every field of a and b equal, bit for bit. */
static int same(const struct moe_profile *a, const struct moe_profile *b, int with_derived) {
    if (a->n_layers != b->n_layers || a->n_experts != b->n_experts || a->k != b->k || a->n_seq != b->n_seq ||
        a->n_bins != b->n_bins || a->logits != b->logits || strcmp(a->arch, b->arch) ||
        strcmp(a->model_path, b->model_path) || strcmp(a->dataset, b->dataset) ||
        strcmp(a->tool_version, b->tool_version))
        return 0;
    int64_t n = moe_profile_n_tokens(a), L = a->n_layers, E = a->n_experts, K = a->k;
    size_t ls = a->logits == MOE_PROFILE_LOGITS_F16 ? 2 : 4;
    if (memcmp(a->moe_layer_index, b->moe_layer_index, L * 4) || memcmp(a->seq_start, b->seq_start, (a->n_seq + 1) * 8) ||
        memcmp(a->experts, b->experts, n * L * K * 2) || memcmp(a->weights, b->weights, n * L * K * 4) ||
        memcmp(a->popularity, b->popularity, L * E * 8) || memcmp(a->seq_popularity, b->seq_popularity, a->n_seq * L * E * 8) ||
        memcmp(a->hobbit_hist, b->hobbit_hist, K * a->n_bins * 8) ||
        (a->logits && memcmp(a->router_logits, b->router_logits, n * L * E * ls)))
        return 0;
    if (!with_derived) return 1;
    if (a->n_derived != b->n_derived) return 0;
    for (int i = 0; i < a->n_derived; i++) {
        const struct moe_profile_array *x = &a->derived[i];
        int j = 0;
        while (j < b->n_derived && strcmp(b->derived[j].name, x->name)) j++;
        if (j == b->n_derived) return 0;
        const struct moe_profile_array *y = &b->derived[j];
        if (x->dtype != y->dtype || x->ndims != y->ndims || memcmp(x->dims, y->dims, sizeof x->dims)) return 0;
        int64_t m = 1;
        for (int d = 0; d < x->ndims; d++) m *= x->dims[d];
        if (memcmp(x->data, y->data, m * (x->dtype == MOE_PROFILE_I32 ? 4 : 8))) return 0;
    }
    return 1;
}

/* test_round_trip: write + read gives back the same profile, and no temp file remains. */
static void test_round_trip(enum moe_profile_logits logits) {
    struct moe_profile *p = make(0, 2, logits), *r = NULL;
    const char *path = tmp_path("rt.h5");
    CHECK(moe_profile_write(p, path) == MOE_OK, "write");
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0, "temp file left behind");
    CHECK(moe_profile_read(path, &r) == MOE_OK, "read back (logits %d)", (int)logits);
    CHECK(r && same(p, r, 1), "round trip not bit-exact (logits %d)", (int)logits);
    const double *thr = NULL;
    int nd = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    CHECK(r && moe_profile_get_f64(r, "thresholds", &nd, dims, &thr) == MOE_OK && nd == 1 && dims[0] == 2 &&
              thr[1] == 0.5,
          "get thresholds");
    const int64_t *bad = NULL;
    CHECK(r && moe_profile_get_i64(r, "thresholds", NULL, NULL, &bad) == MOE_ERR_SHAPE, "dtype mismatch");
    CHECK(r && moe_profile_get_i64(r, "nope", NULL, NULL, &bad) == MOE_ERR_NOT_FOUND, "missing derived");
    /* counts worked out by hand: layer 0 expert 0 is used by every token */
    CHECK(p->popularity[0] == 5 && p->popularity[1] == 3 && p->popularity[4 + 2] == 5, "popularity");
    /* rank 0 always has s = 0 (bin 0); rank 1 has s = g0 in [0.5, 0.9]: bins 5..9, two of them 0.5 */
    int64_t low = 0, high = 0;
    for (int b = 0; b < 5; b++) low += p->hobbit_hist[10 + b];
    for (int b = 5; b < 10; b++) high += p->hobbit_hist[10 + b];
    CHECK(p->hobbit_hist[0] == 10 && low == 0 && high == 10 && p->hobbit_hist[10 + 5] == 2, "hobbit hist");
    /* writing into a missing directory fails cleanly */
    CHECK(moe_profile_write(p, tmp_path("no/such/dir.h5")) == MOE_ERR_IO, "write into a missing dir");
    moe_profile_free(p);
    moe_profile_free(r);
}

/* test_merge: shard 0 + shard 1 == the whole trace, in memory and through files. */
static void test_merge(void) {
    struct moe_profile *a = make(0, 1, MOE_PROFILE_LOGITS_F16), *b = make(1, 2, MOE_PROFILE_LOGITS_F16);
    struct moe_profile *all = make(0, 2, MOE_PROFILE_LOGITS_F16), *ra = NULL, *rb = NULL;
    CHECK(moe_profile_write(a, tmp_path("a.h5")) == MOE_OK && moe_profile_write(b, tmp_path("b.h5")) == MOE_OK,
          "write shards");
    CHECK(moe_profile_merge(a, b) == MOE_OK, "merge");
    CHECK(a->n_derived == 0, "merge clears derived");
    CHECK(same(a, all, 0), "merged shards differ from the whole");
    CHECK(moe_profile_read(tmp_path("a.h5"), &ra) == MOE_OK && moe_profile_read(tmp_path("b.h5"), &rb) == MOE_OK,
          "read shards");
    CHECK(ra && rb && moe_profile_merge(ra, rb) == MOE_OK && same(ra, all, 0), "merge of files");
    /* another model is refused and leaves dst unchanged */
    CHECK(moe_profile_set_meta(b, "qwen", NULL, NULL, NULL) == MOE_OK, "meta");
    int64_t before = moe_profile_n_tokens(a);
    CHECK(moe_profile_merge(a, b) == MOE_ERR_INVALID && moe_profile_n_tokens(a) == before, "merge of another model");
    struct moe_profile *other = NULL;
    CHECK(moe_profile_new(2, 8, 2, 10, MOE_PROFILE_LOGITS_F16, &other) == MOE_OK, "new");
    CHECK(moe_profile_merge(a, other) == MOE_ERR_INVALID, "merge of another shape");
    moe_profile_free(other);
    moe_profile_free(a);
    moe_profile_free(b);
    moe_profile_free(all);
    moe_profile_free(ra);
    moe_profile_free(rb);
}

/* write_bytes: a file with n bytes of data. */
static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* expect_fail: reading path fails with status want (0 = any error) and no profile. */
static void expect_fail(const char *what, const char *path, enum moe_status want) {
    struct moe_profile *p = (struct moe_profile *)1;
    enum moe_status st = moe_profile_read(path, &p);
    CHECK(st != MOE_OK && (want == 0 || st == want) && p == NULL, "%s: got %s", what, moe_status_str(st));
    if (st == MOE_OK) moe_profile_free(p);
}

/* patch: copy the valid file to name and apply an edit with the HDF5 API. */
static const char *patch(const char *name, const char *valid, int edit) {
    const char *path = tmp_path(name);
    FILE *in = fopen(valid, "rb"), *out = fopen(path, "wb");
    char buf[4096];
    size_t n;
    while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    if (in) fclose(in);
    if (out) fclose(out);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    CHECK(f >= 0, "reopen %s", name);
    if (f < 0) return path;
    hid_t s = H5Screate(H5S_SCALAR);
    if (edit == 0) { /* version 2 */
        int64_t v = 2;
        hid_t a = H5Aopen(f, "version", H5P_DEFAULT);
        H5Awrite(a, H5T_NATIVE_INT64, &v);
        H5Aclose(a);
    } else if (edit == 1) { /* popularity [2 x 5] instead of [2 x 4] */
        H5Ldelete(f, "counts/popularity", H5P_DEFAULT);
        hsize_t d[2] = {2, 5};
        int64_t z[10] = {0};
        hid_t sp = H5Screate_simple(2, d, NULL);
        hid_t ds = H5Dcreate2(f, "counts/popularity", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, z);
        H5Dclose(ds);
        H5Sclose(sp);
    } else if (edit == 2 || edit == 3) { /* experts[3][1][1] = 9, or seq_start[1] = 7 */
        hid_t ds = H5Dopen2(f, edit == 2 ? "trace/experts" : "trace/seq_start", H5P_DEFAULT);
        hid_t sp = H5Dget_space(ds);
        hsize_t c3[3] = {3, 1, 1}, c1[1] = {1}, one = 1;
        H5Sselect_elements(sp, H5S_SELECT_SET, 1, edit == 2 ? c3 : c1);
        hid_t ms = H5Screate_simple(1, &one, NULL);
        int64_t v = edit == 2 ? 9 : 7;
        H5Dwrite(ds, H5T_NATIVE_INT64, ms, sp, H5P_DEFAULT, &v);
        H5Sclose(ms);
        H5Sclose(sp);
        H5Dclose(ds);
    } else if (edit == 4) { /* no weights */
        H5Ldelete(f, "trace/weights", H5P_DEFAULT);
    } else if (edit == 5) { /* n_experts = 3 < the dataset shapes */
        int64_t v = 3;
        hid_t a = H5Aopen(f, "n_experts", H5P_DEFAULT);
        H5Awrite(a, H5T_NATIVE_INT64, &v);
        H5Aclose(a);
    } else if (edit == 6) { /* arch as a fixed-length ASCII string, as other writers make it */
        H5Adelete(f, "arch");
        hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, 8);
        hid_t a = H5Acreate2(f, "arch", t, s, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, t, "mixtral");
        H5Aclose(a);
        H5Tclose(t);
    }
    H5Sclose(s);
    H5Fclose(f);
    return path;
}

/* test_malformed: each malformed input gives a clear error. */
static void test_malformed(void) {
    struct moe_profile *p = make(0, 2, MOE_PROFILE_LOGITS_F32);
    char valid[512];
    snprintf(valid, sizeof valid, "%s", tmp_path("valid.h5"));
    CHECK(moe_profile_write(p, valid) == MOE_OK, "write valid");
    moe_profile_free(p);

    const char *text = "this is not an HDF5 file\n";
    write_bytes(tmp_path("text.h5"), text, strlen(text));
    expect_fail("text file", tmp_path("text.h5"), MOE_ERR_FORMAT);
    write_bytes(tmp_path("empty.h5"), "", 0);
    expect_fail("empty file", tmp_path("empty.h5"), MOE_ERR_FORMAT);
    expect_fail("missing file", tmp_path("missing.h5"), MOE_ERR_IO);

    /* truncated copies */
    FILE *f = fopen(valid, "rb");
    CHECK(f != NULL, "open valid");
    if (f) {
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *buf = malloc((size_t)size);
        CHECK(buf && fread(buf, 1, (size_t)size, f) == (size_t)size, "read valid");
        fclose(f);
        long lens[] = {1, 8, 100, 512, 800, 1024, 2048, 4096, size / 2, size - 100, size - 1};
        for (size_t i = 0; buf && i < sizeof lens / sizeof lens[0]; i++) {
            if (lens[i] <= 0 || lens[i] >= size) continue;
            write_bytes(tmp_path("trunc.h5"), buf, (size_t)lens[i]);
            char what[64];
            snprintf(what, sizeof what, "truncated to %ld of %ld bytes", lens[i], size);
            expect_fail(what, tmp_path("trunc.h5"), 0);
        }
        free(buf);
    }

    /* a valid HDF5 file without the format attribute */
    CHECK(moe_test_write_foreign_h5(tmp_path("foreign.h5")), "create foreign");
    expect_fail("foreign HDF5", tmp_path("foreign.h5"), MOE_ERR_FORMAT);

    expect_fail("version 2", patch("v2.h5", valid, 0), MOE_ERR_UNSUPPORTED);
    expect_fail("popularity of the wrong shape", patch("shape.h5", valid, 1), MOE_ERR_SHAPE);
    expect_fail("expert id out of range", patch("range.h5", valid, 2), MOE_ERR_RANGE);
    expect_fail("seq_start decreasing", patch("seq.h5", valid, 3), MOE_ERR_RANGE);
    expect_fail("weights missing", patch("noweights.h5", valid, 4), MOE_ERR_NOT_FOUND);
    expect_fail("n_experts smaller than k or shapes", patch("nexp.h5", valid, 5), 0);

    /* the unpatched valid file still reads, and so does a fixed-length string attribute */
    struct moe_profile *r = NULL;
    CHECK(moe_profile_read(valid, &r) == MOE_OK, "valid file reads");
    moe_profile_free(r);
    r = NULL;
    CHECK(moe_profile_read(patch("fixedstr.h5", valid, 6), &r) == MOE_OK && r && strcmp(r->arch, "mixtral") == 0,
          "fixed-length string attribute");
    moe_profile_free(r);
}

/* An edit of a valid in-memory profile that the writer keeps but the reader
 * must refuse (issue 17 item 4): the file is well-formed HDF5 whose contents
 * contradict themselves. */
struct incons {
    const char *what, *msg; /* the case, and what the error must say */
    void (*edit)(struct moe_profile *p);
};

static void put_sens(struct moe_profile *p, int with_order) {
    int64_t d2[2] = {p->n_layers, p->n_experts}, n = (int64_t)p->n_layers * p->n_experts;
    double v[8] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
    int64_t routed[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t order[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    moe_profile_put_f64(p, "sensitivity.kl", 2, d2, v);
    moe_profile_put_f64(p, "sensitivity.dnll", 2, d2, v);
    moe_profile_put_f64(p, "sensitivity.proxy", 2, d2, v);
    moe_profile_put_f64(p, "sensitivity.score", 2, d2, v);
    moe_profile_put_i64(p, "sensitivity.routed", 2, d2, routed);
    if (with_order) moe_profile_put_i32(p, "sensitivity.order", 1, &n, order);
}
static void e_layer_neg(struct moe_profile *p) { p->moe_layer_index[0] = -1; }
static void e_layer_order(struct moe_profile *p) { p->moe_layer_index[1] = p->moe_layer_index[0]; }
static void e_weight_nan(struct moe_profile *p) { p->weights[5] = NAN; }
static void e_weight_inf(struct moe_profile *p) { p->weights[2] = INFINITY; }
static void e_placement_dup(struct moe_profile *p) {
    int32_t order[8] = {0, 6, 1, 2, 7, 4, 3, 3};
    int64_t d8[1] = {8};
    moe_profile_put_i32(p, "placement_order", 1, d8, order);
}
static void e_sens_dup(struct moe_profile *p) {
    put_sens(p, 0);
    int32_t order[8] = {0, 1, 2, 3, 4, 5, 5, 7};
    int64_t n = 8;
    moe_profile_put_i32(p, "sensitivity.order", 1, &n, order);
}
static void e_sens_range(struct moe_profile *p) {
    put_sens(p, 0);
    int32_t order[8] = {0, 1, 2, 3, 4, 5, 6, 8};
    int64_t n = 8;
    moe_profile_put_i32(p, "sensitivity.order", 1, &n, order);
}
static void e_sens_shape(struct moe_profile *p) {
    put_sens(p, 1);
    double v[10] = {0};
    int64_t d[2] = {2, 5};
    moe_profile_put_f64(p, "sensitivity.score", 2, d, v);
}
static void e_sens_nan(struct moe_profile *p) {
    put_sens(p, 1);
    double v[8] = {0.1, NAN, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
    int64_t d[2] = {2, 4};
    moe_profile_put_f64(p, "sensitivity.kl", 2, d, v);
}
static void e_sens_no_order(struct moe_profile *p) { put_sens(p, 0); }
static void e_sens_empty(struct moe_profile *p) {
    double cfg[7] = {32, 0, 1, 0, 0, 4, 1000};
    int64_t n = 7;
    moe_profile_put_f64(p, "config.sensitivity", 1, &n, cfg);
}
static void e_targets(struct moe_profile *p) {
    double tg[4] = {0.3, 0.03, 1.5, 0.2};
    int64_t n = 4;
    moe_profile_put_f64(p, "targets", 1, &n, tg);
}
static void e_hit_inf(struct moe_profile *p) {
    double h[9] = {0.25, 0.5, 0.25, 0.5, INFINITY, 0.5, 0.75, 0.9, 0.75};
    int64_t d[2] = {3, 3};
    moe_profile_put_f64(p, "placement_hit_rate", 2, d, h);
}
static void e_shard(struct moe_profile *p) {
    int64_t r[3] = {0, 5, 9}, n = 3;
    moe_profile_put_i64(p, "shard", 1, &n, r);
}

static const struct incons k_incons[] = {
    {"layer index negative", "moe_layer_index[0] = -1", e_layer_neg},
    {"layer index not increasing", "moe_layer_index[1]", e_layer_order},
    {"NaN gate weight", "gate weight nan", e_weight_nan},
    {"infinite gate weight", "gate weight inf", e_weight_inf},
    {"placement order with a duplicate", "placement_order is not a permutation", e_placement_dup},
    {"sensitivity ranking with a duplicate", "sensitivity.order is not a permutation", e_sens_dup},
    {"sensitivity ranking out of range", "sensitivity.order is not a permutation", e_sens_range},
    {"sensitivity score of the wrong shape", "sensitivity.score has the wrong type or shape", e_sens_shape},
    {"NaN KL", "sensitivity.kl element 1 is nan", e_sens_nan},
    {"sensitivity scores without a ranking", "without the ranking", e_sens_no_order},
    {"sensitivity file without data", "no usable sensitivity data", e_sens_empty},
    {"targets out of range", "targets element 2 is 1.5", e_targets},
    {"infinite hit rate", "placement_hit_rate element 4 is inf", e_hit_inf},
    {"shard range of the wrong length", "does not match the 2 sequences", e_shard},
};

/* test_inconsistent: each edited profile writes (the writer keeps what it is
 * given) and the reader refuses it with an error naming the array; the
 * unedited profile, with NaN in the arrays where it means "not measured",
 * reads. */
static void test_inconsistent(void) {
    moe_log_set(capture, NULL);
    for (size_t i = 0; i < sizeof k_incons / sizeof k_incons[0]; i++) {
        struct moe_profile *p = make(0, 2, MOE_PROFILE_LOGITS_NONE);
        if (!p) continue;
        k_incons[i].edit(p);
        const char *path = tmp_path("incons.h5");
        CHECK(moe_profile_write(p, path) == MOE_OK, "%s: write", k_incons[i].what);
        log_reset();
        expect_fail(k_incons[i].what, path, 0);
        CHECK(strstr(g_err, k_incons[i].msg) != NULL, "%s: the error says \"%s\": %s", k_incons[i].what,
              k_incons[i].msg, g_err);
        moe_profile_free(p);
    }
    struct moe_profile *p = make(0, 2, MOE_PROFILE_LOGITS_NONE), *r = NULL;
    double h[9] = {0.25, NAN, 0.25, 0.5, NAN, 0.5, 0.75, NAN, 0.75};
    int64_t d[2] = {3, 3};
    if (p) {
        put_sens(p, 1);
        moe_profile_put_f64(p, "placement_hit_rate", 2, d, h);
    }
    const char *path = tmp_path("consistent.h5");
    CHECK(p && moe_profile_write(p, path) == MOE_OK && moe_profile_read(path, &r) == MOE_OK,
          "a consistent profile with 'not measured' NaNs and sensitivity results reads: %s", g_err);
    moe_profile_free(p);
    moe_profile_free(r);
    moe_log_set(NULL, NULL);
}

/* test_stream: the containment stream round-trips a profile bit for bit,
 * and a truncated or altered stream is refused, never trusted. */
static void test_stream(void) {
    struct moe_profile *p = make(0, 2, MOE_PROFILE_LOGITS_F16), *r = NULL;
    const char *path = tmp_path("stream.bin");
    FILE *f = fopen(path, "w+b");
    CHECK(p && f && moe_profile_encode(fileno(f), p) == MOE_OK, "encode");
    long n = f ? ftell(f) : 0;
    if (f) rewind(f);
    CHECK(f && moe_profile_decode(fileno(f), "stream", &r) == MOE_OK && r && same(p, r, 1), "round trip");
    moe_profile_free(r);
    r = NULL;
    char *img = malloc((size_t)(n > 0 ? n : 1));
    if (f) rewind(f);
    CHECK(f && img && fread(img, 1, (size_t)n, f) == (size_t)n, "read back");
    if (f) fclose(f);
    moe_log_set(capture, NULL);
    for (long cut = 0; img && cut < n; cut += n / 7 + 1) { /* truncated */
        FILE *g = fopen(path, "w+b");
        fwrite(img, 1, (size_t)cut, g);
        rewind(g);
        CHECK(moe_profile_decode(fileno(g), "stream", &r) != MOE_OK && !r, "a stream cut at %ld of %ld is refused", cut,
              n);
        fclose(g);
    }
    if (img && n > 200) { /* a weight turned NaN: decoded, then refused by validation */
        float w = p->weights[3], nan = NAN;
        char *hit = memmem(img, (size_t)n, &w, sizeof w);
        if (hit) memcpy(hit, &nan, sizeof nan);
        FILE *g = fopen(path, "w+b");
        fwrite(img, 1, (size_t)n, g);
        rewind(g);
        log_reset();
        CHECK(hit && moe_profile_decode(fileno(g), "stream", &r) == MOE_ERR_RANGE && !r && strstr(g_err, "gate weight"),
              "a NaN weight in the stream is refused: %s", g_err);
        fclose(g);
    }
    moe_log_set(NULL, NULL);
    free(img);
    moe_profile_free(p);
}

/* test_bad_args: API misuse by callers is an error, not a crash. */
static void test_bad_args(void) {
    struct moe_profile *p = NULL;
    CHECK(moe_profile_new(0, 4, 2, 10, MOE_PROFILE_LOGITS_NONE, &p) == MOE_ERR_INVALID && !p, "0 layers");
    CHECK(moe_profile_new(2, 4, 5, 10, MOE_PROFILE_LOGITS_NONE, &p) == MOE_ERR_INVALID && !p, "k > n_experts");
    CHECK(moe_profile_new(2, 4, 2, 0, MOE_PROFILE_LOGITS_NONE, &p) == MOE_OK && p->n_bins == MOE_PROFILE_DEFAULT_BINS,
          "default bins");
    int64_t d[1] = {1};
    double x = 1;
    CHECK(moe_profile_put_f64(p, "a/b", 1, d, &x) == MOE_ERR_INVALID, "name with a slash");
    CHECK(moe_profile_put_f64(p, "a", 0, d, &x) == MOE_ERR_INVALID, "0 dims");
    int64_t seq[3];
    struct moe_trace t = trace_of(0, 2, seq);
    CHECK(moe_profile_add_trace(p, &t, LOGITS) == MOE_ERR_INVALID, "logits to a profile without them");
    t.n_experts = 3;
    CHECK(moe_profile_add_trace(p, &t, NULL) == MOE_ERR_SHAPE, "trace of another shape");
    moe_profile_free(p);
    moe_profile_free(NULL);
}

int main(void) {
    for (int i = 0; i < 40; i++) LOGITS[i] = (float)(i % 7) * 0.375f - 1.0f + (float)i * 1e-3f;
    snprintf(dir, sizeof dir, "/tmp/test-profile-h5.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip(MOE_PROFILE_LOGITS_NONE);
    test_round_trip(MOE_PROFILE_LOGITS_F32);
    test_round_trip(MOE_PROFILE_LOGITS_F16);
    test_merge();
    test_malformed();
    test_inconsistent();
    test_stream();
    test_bad_args();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    H5close(); /* frees HDF5's global state, which LeakSanitizer would report */
    if (fails) fprintf(stderr, "%d checks failed\n", fails);
    return fails != 0;
}

/*
 * fuzz-profile.c - libFuzzer target for the profile reader (moe_profile_read)
 * and what consumes a profile read from an untrusted file: the derivation
 * (moe_profile_derive, which trusts no sum.* or config.* array), the HTML
 * report, and merging (the input read twice, the second merged into the
 * first, then derived again).
 *
 * HDF5 opens files by name, so each input is written to a temporary file
 * first. libhdf5 1.10 itself is not safe on hostile files: a 4-minute run of
 * this target with the reader in-process stopped on 74 inputs, every one
 * inside libhdf5 (heap overflows and a use-after-free in H5O__msg_iterate_real
 * and H5VM_memcpyvv, SEGVs, allocation requests of up to 2^62 bytes from
 * H5C_protect and H5MM_realloc, an overflow in strdup of an unterminated
 * attribute name, internal leaks, "infinite loop closing library"); none in
 * the project's code. moe_profile_read therefore parses the file in a child
 * process and the parent decodes and validates what the child streams back
 * (profile-h5.c, "containment"): whatever libhdf5 does to the child is a
 * "damaged file" error in the parent. One input of each kind is in the corpus
 * (hdf5-*); MOE_PROFILE_READ_INPROCESS=1 reads in-process again, to fuzz or
 * debug libhdf5 itself. docs/fuzzing.md has the runs and counts.
 *
 * An input whose first byte is 0 is a recipe (docs/fuzzing.md, "Reaching the
 * readers from nothing"): the shape (MoE layers, experts, k, bins, router
 * logits), sequences and trace, derived arrays from the reader's table (each
 * of its type, shape and value range, or one of them wrong), or a whole
 * sensitivity or fit-cache result set, written by the project's writer
 * (moe_profile_write); then edits of the profile before it is written
 * (expert ids, gate weights, counts, layer index, logits out of range) and of
 * the file after it (a dataset or group removed, a dataset replaced by one of
 * another type or shape, an attribute set to another value or type, bytes
 * flipped), so that from an empty corpus inputs reach the reader's checks
 * beyond "is it HDF5" (a random HDF5 image is out of reach of byte
 * mutations). In the libFuzzer build a custom mutator
 * (LLVMFuzzerCustomMutator) turns inputs that are none of the three kinds
 * into recipes and keeps the marker byte of recipes while mutating the rest;
 * fuzz-profile.dict holds the HDF5 signature, the stream magic and the names
 * the reader asks for.
 *
 * Build with -DMOE_BUILD_FUZZ=ON (clang; docs/fuzzing.md), then
 *   build-fuzz/tests/fuzz-profile -max_total_time=600 -jobs=1 -timeout=30 \
 *       -max_len=200000 -dict=tests/fuzz/fuzz-profile.dict /tmp/profile-corpus tests/fuzz/corpus/profile
 *
 * The seeds in tests/fuzz/corpus/profile are written by
 * `test-profile-derive --write-seeds tests/fuzz/corpus/profile`, plus the
 * hdf5-* inputs above, and stream-* inputs: an input that starts with the
 * containment stream's magic ("MOEPRPIP") goes to
 * moe_profile_decode instead, the parent's side of the containment; and
 * recipe-* inputs found by runs from an empty corpus. ctest replays them
 * through replay-main.c as fuzz-profile-replay (under MOE_SANITIZE, the
 * hdf5-* ones fail without the containment).
 */
#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz-src.h"
#include "profile-h5.h"
#include "profile-results.h"
#include "report.h"

static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

/* exercise: derive and render a profile that read back successfully. */
static void exercise(struct moe_profile *p) {
    struct moe_profile_targets t = moe_profile_default_targets();
    struct moe_profile_results r;
    if (moe_profile_derive(p, &t, &r) == MOE_OK) moe_profile_results_free(&r);
    FILE *f = fopen("/dev/null", "w");
    if (f) {
        moe_profile_report_render(p, NULL, f);
        fclose(f);
    }
}

/* decode_stream: an input that starts with the stream magic is fed to
 * moe_profile_decode, the parent side of the containment (the trust boundary
 * once libhdf5 runs in a child), through a temporary file. */
static void decode_stream(const uint8_t *data, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz-profile-%ld.bin", (long)getpid());
    FILE *f = fopen(path, "w+b");
    if (!f) return;
    if (size) fwrite(data, 1, size, f);
    fflush(f);
    rewind(f);
    struct moe_profile *p = NULL;
    if (moe_profile_decode(fileno(f), "fuzz", &p) == MOE_OK) exercise(p);
    else if (p) abort(); /* no profile on error */
    moe_profile_free(p);
    fclose(f);
    unlink(path);
}

/* ---- recipes: a profile written by the project's writer, then edited ---- */

/* Derived arrays the reader knows (formats/profile-h5.c, k_rules): name, type,
 * dims (L, E, K, LE: the profile's; ANY: the recipe's) and the values allowed. */
enum { D_ANY = -1, D_L = -2, D_E = -3, D_K = -4, D_LE = -5 };
enum { R_FIN, R_NONNEG, R_UNIT, R_UNIT_NAN, R_CORR_NAN, R_NONNEG_NAN, R_NOT_INF, R_PERM, R_SHARD, R_SPLIT };
static const struct rule {
    const char *name;
    enum moe_profile_dtype dtype;
    int ndims;
    int64_t dims[3];
    int values;
} k_rules[] = {
    {"targets", MOE_PROFILE_F64, 1, {4}, R_UNIT},
    {"placement_order", MOE_PROFILE_I32, 1, {D_LE}, R_PERM},
    {"placement_hit_rate", MOE_PROFILE_F64, 2, {3, 3}, R_UNIT_NAN},
    {"hobbit_thresholds", MOE_PROFILE_F64, 1, {5}, R_UNIT_NAN},
    {"gate_output_pearson", MOE_PROFILE_F64, 1, {1}, R_CORR_NAN},
    {"layer_similarity", MOE_PROFILE_F64, 2, {D_L, D_ANY}, R_CORR_NAN},
    {"stacked_top1", MOE_PROFILE_F64, 2, {D_L, D_ANY}, R_UNIT_NAN},
    {"stacked_recall", MOE_PROFILE_F64, 2, {D_L, D_ANY}, R_UNIT_NAN},
    {"path_accuracy_order1", MOE_PROFILE_F64, 2, {2, 3}, R_UNIT_NAN},
    {"path_accuracy_order2", MOE_PROFILE_F64, 2, {2, 3}, R_UNIT_NAN},
    {"path_key_coverage", MOE_PROFILE_F64, 1, {2}, R_UNIT_NAN},
    {"reuse", MOE_PROFILE_F64, 2, {D_L, D_K}, R_UNIT_NAN},
    {"reuse_chance", MOE_PROFILE_F64, 1, {1}, R_UNIT_NAN},
    {"split_sequences", MOE_PROFILE_I64, 1, {2}, R_SPLIT},
    {"big_little", MOE_PROFILE_F64, 2, {D_ANY, 3}, R_UNIT_NAN},
    {"big_little_summary", MOE_PROFILE_F64, 1, {5}, R_NONNEG_NAN},
    {"sum.pearson", MOE_PROFILE_F64, 1, {6}, R_FIN},
    {"sum.stacked", MOE_PROFILE_F64, 3, {D_L, D_ANY, 4}, R_FIN},
    {"sum.big_little_maxprob", MOE_PROFILE_I64, 2, {2, D_ANY}, R_NONNEG},
    {"config.record", MOE_PROFILE_I64, 1, {4}, R_NONNEG},
    {"shard", MOE_PROFILE_I64, 1, {3}, R_SHARD},
    {"config.sensitivity", MOE_PROFILE_F64, 1, {7}, R_FIN},
    {"sensitivity.progress", MOE_PROFILE_I64, 1, {4}, R_NONNEG},
    {"sensitivity.times", MOE_PROFILE_F64, 1, {3}, R_NONNEG},
    {"sensitivity.sum_kl", MOE_PROFILE_F64, 2, {D_L, D_E}, R_FIN},
    {"sensitivity.sum_dnll", MOE_PROFILE_F64, 2, {D_L, D_E}, R_FIN},
    {"sensitivity.sum_proxy", MOE_PROFILE_F64, 2, {D_L, D_E}, R_NONNEG},
    {"sensitivity.routed", MOE_PROFILE_I64, 2, {D_L, D_E}, R_NONNEG},
    {"sensitivity.kl", MOE_PROFILE_F64, 2, {D_L, D_E}, R_FIN},
    {"sensitivity.dnll", MOE_PROFILE_F64, 2, {D_L, D_E}, R_FIN},
    {"sensitivity.proxy", MOE_PROFILE_F64, 2, {D_L, D_E}, R_NONNEG},
    {"sensitivity.score", MOE_PROFILE_F64, 2, {D_L, D_E}, R_FIN},
    {"sensitivity.order", MOE_PROFILE_I32, 1, {D_LE}, R_PERM},
    {"sensitivity.spearman_proxy", MOE_PROFILE_F64, 1, {1}, R_CORR_NAN},
    {"sensitivity.cost", MOE_PROFILE_F64, 1, {4}, R_NONNEG_NAN},
    {"cache.sizes", MOE_PROFILE_I64, 1, {D_ANY}, R_NONNEG},
    {"cache.low_sizes", MOE_PROFILE_I64, 1, {D_ANY}, R_NONNEG},
    {"cache.penalty", MOE_PROFILE_F64, 2, {D_ANY, D_ANY}, R_NONNEG_NAN},
    {"cache.hit_ratio", MOE_PROFILE_F64, 2, {D_ANY, D_ANY}, R_UNIT_NAN},
    {"cache.bytes", MOE_PROFILE_F64, 2, {D_ANY, D_ANY}, R_NONNEG_NAN},
    {"cache.weights", MOE_PROFILE_F64, 1, {6}, R_FIN},
    {"cache.size_weights", MOE_PROFILE_F64, 2, {D_ANY, 6}, R_FIN},
    {"cache.settings", MOE_PROFILE_F64, 1, {8}, R_NOT_INF},
    {"sum.free_form", MOE_PROFILE_F64, 2, {D_L, D_E}, R_FIN}, /* names the table does not know */
    {"config.free_form", MOE_PROFILE_I64, 1, {D_ANY}, R_NONNEG},
    {"free.form", MOE_PROFILE_I32, 3, {D_ANY, D_ANY, D_ANY}, R_FIN},
};
#define N_RULES (sizeof k_rules / sizeof k_rules[0])
#define FIRST_SENS 21 /* config.sensitivity .. sensitivity.cost: a sensitivity file's set */
#define N_SENS 14
#define FIRST_CACHE 35 /* cache.*: fit-cache's set */
#define N_CACHE 8

static double rng_unit(uint64_t *r) {
    *r ^= *r << 13, *r ^= *r >> 7, *r ^= *r << 17;
    return (double)(*r >> 11) / 9007199254740992.0;
}

/* put_rule: derived array k_rules[i] for profile p, each value within its
 * rule unless bad (1: one value out of range, 2: the wrong element type,
 * 3: a dimension one too long). */
static void put_rule(struct fz_src *s, struct moe_profile *p, size_t i, int bad, uint64_t *r) {
    const struct rule *u = &k_rules[i];
    int64_t dims[3], n = 1;
    for (int d = 0; d < u->ndims; d++) {
        int64_t x = u->dims[d];
        x = x == D_L ? p->n_layers : x == D_E ? p->n_experts : x == D_K ? p->k
            : x == D_LE ? (int64_t)p->n_layers * p->n_experts : x == D_ANY ? 1 + fz_pick(s, 4, 1) : x;
        dims[d] = x + (bad == 3 && d == 0);
        n *= dims[d];
    }
    double *v = malloc(sizeof(double) * (size_t)n);
    if (!v) return;
    for (int64_t k = 0; k < n; k++) {
        double x = rng_unit(r);
        switch (u->values) {
        case R_FIN: x = 4 * x - 2; break;
        case R_NONNEG: x = (double)(int64_t)(100 * x); break;
        case R_CORR_NAN: x = k == 1 ? NAN : 2 * x - 1; break;
        case R_UNIT_NAN:
        case R_NONNEG_NAN: x = k == 1 ? NAN : x; break;
        case R_NOT_INF: x = k == 2 ? NAN : 10 * x; break;
        case R_PERM: x = (double)((k * 7 + 3) % n); break; /* a permutation when gcd(7, n) = 1, else not */
        case R_SHARD: x = k == 0 ? 0 : p->n_seq; break;
        case R_SPLIT: x = k == 0 ? p->n_seq / 2 : p->n_seq - p->n_seq / 2; break;
        default: break;
        }
        v[k] = x;
    }
    if (bad == 1 && n) { /* one value the rule refuses */
        static const double k_bad[] = {NAN, INFINITY, -INFINITY, -1.0, 1.5, 1e300, -0.5};
        v[fz_byte(s) % n] = k_bad[fz_byte(s) % 7];
    }
    enum moe_profile_dtype t = bad == 2 ? (enum moe_profile_dtype)((u->dtype + 1) % 3) : u->dtype;
    if (t == MOE_PROFILE_F64) {
        moe_profile_put_f64(p, u->name, u->ndims, dims, v);
    } else if (t == MOE_PROFILE_I64) {
        int64_t *w = malloc(sizeof(int64_t) * (size_t)n);
        for (int64_t k = 0; w && k < n; k++) w[k] = fabs(v[k]) < 9e18 ? (int64_t)v[k] : -1; /* NaN compares false */
        if (w) moe_profile_put_i64(p, u->name, u->ndims, dims, w);
        free(w);
    } else {
        int32_t *w = malloc(sizeof(int32_t) * (size_t)n);
        for (int64_t k = 0; w && k < n; k++) w[k] = fabs(v[k]) < 2e9 ? (int32_t)v[k] : -1;
        if (w) moe_profile_put_i32(p, u->name, u->ndims, dims, w);
        free(w);
    }
    free(v);
}

/* profile: the profile a recipe describes, with its trace; NULL on failure. */
static struct moe_profile *profile(struct fz_src *s) {
    const int L = 1 + (int)fz_pick(s, 3, 1), E = (int[]){4, 2, 8}[fz_pick(s, 3, 0)];
    const int K = 1 + (int)fz_pick(s, (unsigned)E, 1), bins = (int[]){16, 1, 1000}[fz_pick(s, 3, 0)];
    const enum moe_profile_logits logits = (enum moe_profile_logits)fz_pick(s, 3, 0);
    const int kind = (int)fz_pick(s, 3, 0); /* 0 a recorded profile, 1 sensitivity results, 2 fit-cache results */
    struct moe_profile *p = NULL;
    if (moe_profile_new(L, E, K, bins, logits, &p) != MOE_OK) return NULL;
    static const char *const k_arch[] = {"mixtral", "", "qwen2_moe"};
    moe_profile_set_meta(p, k_arch[fz_pick(s, 3, 0)], "model", "text:fixture",
                         kind == 1 ? "moe-prep sensitivity kl q4_0/q8_0" : "moe-prep 0.1.0");
    uint64_t r = 0x9E3779B97F4A7C15ull ^ fz_byte(s);
    const int n_seq = kind == 1 ? 0 : (int)fz_pick(s, 4, 2);
    int64_t seq[5] = {0};
    for (int i = 0; i < n_seq; i++) seq[i + 1] = seq[i] + 1 + fz_pick(s, 6, 3);
    const int64_t T = seq[n_seq];
    int16_t *ex = malloc(sizeof(int16_t) * (size_t)(T * L * K + 1));
    float *w = malloc(sizeof(float) * (size_t)(T * L * K + 1)), *lg = malloc(sizeof(float) * (size_t)(T * L * E + 1));
    if (ex && w && lg) {
        for (int64_t t = 0; t < T; t++)
            for (int l = 0; l < L; l++) {
                int base = (int)(rng_unit(&r) * E);
                for (int k = 0; k < K; k++) { /* k distinct experts, weights summing to about 1 */
                    ex[(t * L + l) * K + k] = (int16_t)((base + k) % E);
                    w[(t * L + l) * K + k] = (float)(1.0 / K * (0.5 + rng_unit(&r)));
                }
                for (int e = 0; e < E; e++) lg[(t * L + l) * E + e] = (float)(4 * rng_unit(&r) - 2);
            }
        struct moe_trace tr = {L, E, K, n_seq, seq, ex, w};
        if (n_seq) moe_profile_add_trace(p, &tr, logits ? lg : NULL);
    }
    free(ex);
    free(w);
    free(lg);
    if (kind == 1 || kind == 2) { /* a whole result set, one array of it perhaps wrong or missing */
        const size_t first = kind == 1 ? FIRST_SENS : FIRST_CACHE, n = kind == 1 ? N_SENS : N_CACHE;
        const size_t odd = fz_pick(s, (unsigned)(2 * n + 1), (unsigned)(2 * n)); /* < n: wrong; < 2n: missing */
        for (size_t i = 0; i < n; i++)
            if (odd < n || odd >= 2 * n || i != odd - n)
                put_rule(s, p, first + i, i == odd ? 1 + (int)fz_pick(s, 3, 0) : 0, &r);
    }
    for (unsigned n = fz_pick(s, 5, kind ? 0 : 2), i = 0; i < n; i++) {
        size_t rule = fz_byte(s) % N_RULES;
        unsigned bad = fz_pick(s, 8, 0);
        put_rule(s, p, rule, bad < 4 ? (int)bad : 0, &r);
    }
    /* edits of the profile before it is written: the writer writes what it is given */
    const int64_t slots = moe_profile_n_tokens(p) * L * K;
    for (unsigned n = fz_pick(s, 4, 0), i = 0; i < n; i++) {
        unsigned kind_e = fz_pick(s, 8, 0), at = fz_byte(s);
        switch (kind_e) {
        case 0:
            if (slots) p->experts[at % slots] = (int16_t)(at & 1 ? E : -1);
            break;
        case 1:
            if (slots) p->weights[at % slots] = (float[]){NAN, -1.0f, INFINITY, 0.0f}[at % 4];
            break;
        case 2:
            if (p->n_seq) p->seq_start[at % 2 ? 0 : p->n_seq] = at % 2 ? 1 : 0;
            break;
        case 3: p->moe_layer_index[at % L] = at & 1 ? -1 : 1 << 20; break;
        case 4: p->popularity[at % (L * E)] = -1; break;
        case 5: p->hobbit_hist[at % ((int64_t)K * bins)] = -1; break;
        case 6: { /* a NaN router logit */
            const int64_t nl = moe_profile_n_tokens(p) * L * E;
            if (p->logits == MOE_PROFILE_LOGITS_F32 && nl) ((float *)p->router_logits)[at % nl] = NAN;
            if (p->logits == MOE_PROFILE_LOGITS_F16 && nl) ((uint16_t *)p->router_logits)[at % nl] = 0x7e00;
            break;
        }
        default:
            if (L > 1) p->moe_layer_index[1] = p->moe_layer_index[0];
            break;
        }
    }
    return p;
}

/* h5_edits: the recipe's edits of the written file, through libhdf5 (on a
 * file it wrote itself, so in-process): remove a dataset or group, replace a
 * dataset by one of another type and shape, or set an attribute to another
 * value or type. */
static void h5_edits(struct fz_src *s, const char *path) {
    static const char *const k_paths[] = {"moe_layer_index", "trace/seq_start", "trace/experts", "trace/weights",
                                          "trace/router_logits", "counts/popularity", "counts/seq_popularity",
                                          "counts/hobbit_hist", "derived/targets", "derived", "trace", "counts"};
    static const char *const k_attrs[] = {"format", "version", "arch", "model_path", "dataset",
                                          "tool_version", "n_layers", "n_experts", "k", "n_bins"};
    static const int64_t k_ints[] = {0, 1, 2, -1, 3, 1 << 16, 1 << 24, (int64_t)1 << 40, INT64_MAX, 1000};
    unsigned n = fz_pick(s, 3, 0);
    if (!n) return;
    H5E_auto2_t fn;
    void *data;
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    for (unsigned i = 0; f >= 0 && i < n; i++) {
        unsigned kind = fz_pick(s, 4, 0);
        if (kind == 3) { /* an attribute: another integer, or a string where a number belongs (and back) */
            const char *a = k_attrs[fz_byte(s) % (sizeof k_attrs / sizeof k_attrs[0])];
            unsigned v = fz_byte(s);
            H5Adelete(f, a);
            hid_t sp = H5Screate(H5S_SCALAR), at = -1, st = -1;
            if (v % 3 == 0) {
                static const char *const k_str[] = {"moe-profile", "", "other", "moe-profile-2"};
                const char *x = k_str[(v / 3) % 4];
                st = H5Tcopy(H5T_C_S1);
                H5Tset_size(st, strlen(x) + 1);
                if ((at = H5Acreate2(f, a, st, sp, H5P_DEFAULT, H5P_DEFAULT)) >= 0) H5Awrite(at, st, x);
            } else if ((at = H5Acreate2(f, a, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT)) >= 0) {
                int64_t x = k_ints[(v / 3) % 10];
                H5Awrite(at, H5T_NATIVE_INT64, &x);
            }
            if (at >= 0) H5Aclose(at);
            if (st >= 0) H5Tclose(st);
            H5Sclose(sp);
            continue;
        }
        const char *ds = k_paths[fz_byte(s) % (sizeof k_paths / sizeof k_paths[0])];
        H5Ldelete(f, ds, H5P_DEFAULT);
        if (kind == 0) continue; /* removed */
        /* replaced: an array of another type and shape (kind 2: a string) */
        static const hid_t *const k_types[] = {&H5T_NATIVE_INT16_g, &H5T_NATIVE_INT32_g, &H5T_NATIVE_INT64_g,
                                               &H5T_NATIVE_FLOAT_g, &H5T_NATIVE_DOUBLE_g, &H5T_NATIVE_UINT8_g};
        hsize_t dims[4];
        int nd = 1 + (int)fz_pick(s, 4, 0);
        for (int d = 0; d < nd; d++) dims[d] = fz_pick(s, 5, 2);
        hid_t t = kind == 2 ? H5Tcopy(H5T_C_S1) : H5Tcopy(*k_types[fz_byte(s) % 6]);
        if (kind == 2) H5Tset_size(t, 8);
        hid_t sp = H5Screate_simple(nd, dims, NULL);
        hid_t d = H5Dcreate2(f, ds, t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (d >= 0) {
            size_t bytes = H5Tget_size(t);
            for (int k = 0; k < nd; k++) bytes *= dims[k];
            uint8_t *buf = calloc(1, bytes + 1);
            if (buf) H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
            free(buf);
            H5Dclose(d);
        }
        H5Sclose(sp);
        H5Tclose(t);
    }
    if (f >= 0) H5Fclose(f);
    H5Eset_auto2(H5E_DEFAULT, fn, data);
}

/* recipe: write the profile a recipe describes to path, edit it, and flip
 * bytes of the file if the recipe says so; 0 if nothing was written. */
static int recipe(const uint8_t *data, size_t size, const char *path) {
    struct fz_src s = {data, size, 1}; /* byte 0 is the marker */
    struct moe_profile *p = profile(&s);
    if (!p) return 0;
    int ok = moe_profile_write(p, path) == MOE_OK;
    moe_profile_free(p);
    if (!ok) return 0;
    h5_edits(&s, path);
    unsigned flips = fz_pick(&s, 8, 0) == 7 ? 1 + fz_pick(&s, 4, 0) : 0;
    if (flips) { /* bytes of the file: libhdf5's parser, contained in the reader's child */
        FILE *f = fopen(path, "r+b");
        if (!f) return 1;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        for (unsigned i = 0; i < flips && n > 0; i++) {
            long at = (long)((fz_byte(&s) | fz_byte(&s) << 8 | (unsigned)fz_byte(&s) << 16) % (unsigned long)n);
            fseek(f, at, SEEK_SET);
            fputc((int)fz_byte(&s), f);
        }
        fclose(f);
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moe_log_set(quiet, NULL);
    if (size >= 8 && !memcmp(data, "MOEPRPIP", 8)) {
        decode_stream(data, size);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz-profile-%ld.h5", (long)getpid());
    if (size >= 1 && data[0] == 0) {
        if (!recipe(data, size, path)) return 0;
    } else {
        FILE *f = fopen(path, "wb");
        if (!f) return 0;
        if (size) fwrite(data, 1, size, f);
        fclose(f);
    }
    struct moe_profile *a = NULL, *b = NULL;
    if (moe_profile_read(path, &a) == MOE_OK) {
        exercise(a);
        if (moe_profile_read(path, &b) == MOE_OK) {
            moe_profile_clear_derived(a); /* derive added arrays; b still has the file's */
            if (moe_profile_merge(a, b) == MOE_OK) exercise(a);
        }
    }
    moe_profile_free(a);
    moe_profile_free(b);
    unlink(path);
    return 0;
}

#ifdef MOE_LIBFUZZER
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

/* LLVMFuzzerCustomMutator: an input that is neither an HDF5 file, a stream
 * nor a recipe becomes a recipe 3 times in 4 (marker byte 0, then libFuzzer's
 * mutation of the rest); a recipe keeps its marker. */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    static const uint8_t k_hdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    const int hdf5 = size >= 8 && !memcmp(data, k_hdf5, 8), stream = size >= 8 && !memcmp(data, "MOEPRPIP", 8);
    const int recipe_in = size >= 1 && data[0] == 0;
    if (!max_size) return 0;
    if (!hdf5 && !stream && (recipe_in || seed % 4)) {
        if (!recipe_in) { /* the rest of the input becomes the recipe's choices */
            if (size == max_size) size--;
            memmove(data + 1, data, size);
            data[0] = 0;
            size++;
        }
        if (max_size == 1) return 1;
        return 1 + LLVMFuzzerMutate(data + 1, size - 1, max_size - 1);
    }
    return LLVMFuzzerMutate(data, size, max_size);
}
#endif

/*
 * test-inflate.c - tests/bench/inflate-moe widens experts with zeros and the
 * model computes exactly what it computed before:
 *   - the trained demo model (BF16, F = 256) inflated to F = 1024: config.json
 *     differs only in intermediate_size, the side files are byte copies, every
 *     non-expert tensor is unchanged, every expert is the original plus zero
 *     rows (w1, w3) or zero columns (w2), and no temporary file is left;
 *   - moe-run gives bit-identical logits and identical greedy tokens on the
 *     original and the inflated checkpoint (also for an F32 Mixtral fixture
 *     and a Qwen3-MoE one, whose experts are named mlp.experts.E.*_proj and
 *     whose width is moe_intermediate_size);
 *   - quantized with --experts q8_0,q4_k,q2_k --dense q8_0, both bundles give
 *     bit-identical logits at every expert precision, while the inflated
 *     bundle's expert blobs are N/F = 4 times larger. This holds because F and
 *     N are multiples of every block size (32 for q8_0, 256 for the k-quants):
 *     the same block type is chosen for both, gate/up rows (length H) are
 *     unchanged and the extra rows are all zero, and each padded down row is
 *     the original blocks followed by all-zero blocks (scale 0), whose dot
 *     products add exactly 0 in the same order. When F is not a multiple of a
 *     type's block (e.g. the 32- and 48-wide fixtures with k-quants), the
 *     original's down rows fall back to another type (q4_0, f16) and the
 *     inflated ones do not, so quantized logits differ; the test does not
 *     claim it there;
 *   - refusals: --ffn below F, the fused gate_up_proj layout, OUT_DIR = IN_DIR
 *     (exit 1); a bad --ffn or missing arguments (exit 2).
 * argv: inflate-moe moe-run moe-prep MODEL_DIR WORK_DIR.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe-mmap.h"
#include "moe-safetensors.h"
#include "moe-test.h"

static const char *inflate, *moe_run, *prep;

/* read_all: a whole file (NULL if unreadable). */
static char *read_all(const char *path, size_t *len) {
    char *x = NULL;
    if (moe_read_file(path, 1u << 30, &x, len) != MOE_OK) return NULL;
    return x;
}

/* same_file: both files readable and byte-identical. */
static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = read_all(a, &na), *y = read_all(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* all_zero: n bytes of zeros. */
static int all_zero(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

/* check_config: the inflated config equals the original with the experts'
 * width = N (moe_intermediate_size where the original has it, else
 * intermediate_size). */
static void check_config(const char *in, const char *out, int N) {
    char a[2100], b[2100];
    snprintf(a, sizeof a, "%s/config.json", in);
    snprintf(b, sizeof b, "%s/config.json", out);
    size_t na, nb;
    char *x = read_all(a, &na), *y = read_all(b, &nb);
    cJSON *ja = x ? cJSON_Parse(x) : NULL, *jb = y ? cJSON_Parse(y) : NULL;
    CHECK(ja && jb, "config.json of %s / %s parses", in, out);
    if (ja && jb) {
        const char *key =
            cJSON_GetObjectItemCaseSensitive(ja, "moe_intermediate_size") ? "moe_intermediate_size" : "intermediate_size";
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(jb, key);
        CHECK(cJSON_IsNumber(f) && f->valueint == N, "inflated %s is %d", key, N);
        cJSON_ReplaceItemInObjectCaseSensitive(ja, key, cJSON_CreateNumber(N));
        CHECK(cJSON_Compare(ja, jb, 1), "config.json differs only in %s", key);
    }
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    free(x);
    free(y);
}

/* check_tensors: same tensors in the same order and dtypes; experts padded with
 * zeros to N, everything else byte-identical. Returns the number of experts. */
static int check_tensors(const char *in, const char *out, int N) {
    struct moe_safetensors *a = NULL, *b = NULL;
    int n_exp = 0, bad = 0;
    if (moe_safetensors_open(in, &a) || moe_safetensors_open(out, &b)) {
        CHECK(0, "open %s and %s", in, out);
        goto done;
    }
    CHECK(moe_safetensors_count(a) == moe_safetensors_count(b), "tensor counts %zu vs %zu", moe_safetensors_count(a),
          moe_safetensors_count(b));
    for (size_t i = 0; i < moe_safetensors_count(a) && i < moe_safetensors_count(b); i++) {
        const struct moe_st_tensor *s = moe_safetensors_at(a, i), *t = moe_safetensors_at(b, i);
        if (strcmp(s->name, t->name) || s->dtype != t->dtype || s->n_dims != t->n_dims) {
            CHECK(0, "tensor %zu: %s vs %s (name, dtype, rank)", i, s->name, t->name);
            bad = 1;
            break;
        }
        const char *w = strstr(s->name, ".experts.");
        const size_t es = moe_dtype_size(s->dtype);
        if (!w) {
            bad |= s->nbytes != t->nbytes || memcmp(s->data, t->data, s->nbytes) != 0 ||
                   memcmp(s->shape, t->shape, sizeof s->shape) != 0;
        } else if (strstr(w, ".w2.") || strstr(w, ".down_proj.")) { /* [H x F] -> [H x N]: each row, then zeros */
            const int64_t H = s->shape[0], F = s->shape[1];
            bad |= t->shape[0] != H || t->shape[1] != N;
            for (int64_t r = 0; !bad && r < H; r++) {
                const char *src = (const char *)s->data + (size_t)(r * F) * es;
                const char *dst = (const char *)t->data + (size_t)(r * N) * es;
                bad |= memcmp(src, dst, (size_t)F * es) != 0 || !all_zero(dst + F * es, (size_t)(N - F) * es);
            }
            n_exp++;
        } else { /* w1, w3: [F x H] -> [N x H]: the data, then zero rows */
            bad |= t->shape[0] != N || t->shape[1] != s->shape[1] || memcmp(s->data, t->data, s->nbytes) != 0 ||
                   !all_zero((const char *)t->data + s->nbytes, t->nbytes - s->nbytes);
        }
        if (bad) {
            CHECK(0, "tensor %s is not the original %s", s->name, w ? "padded with zeros" : "byte for byte");
            break;
        }
    }
done:
    moe_safetensors_free(a);
    moe_safetensors_free(b);
    return n_exp;
}

/* no_temp_files: nothing named *.tmp.* is left in dir. */
static int no_temp_files(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int clean = d != NULL;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp")) clean = 0;
    if (d) closedir(d);
    return clean;
}

/* run_logits: moe-run on MODEL (with extra options), greedy ids into ids and
 * logits into path; returns the exit status. */
static int run_logits(const char *model, const char *extra, const char *tokens, const char *path, char *ids,
                      size_t cap) {
    int rc = moe_test_sh_out(ids, cap, "%s -m %s %s --tokens %s -n 8 --ignore-eos --ids --logits-out %s -t 2 2>/dev/null",
                moe_run, model, extra, tokens, path);
    char *nl = strchr(ids, '\n');
    if (nl) *nl = 0;
    return rc;
}

/* max_abs_diff: the largest |a - b| over two float32 files of one size (INFINITY
 * when they cannot be read or differ in size). */
static double max_abs_diff(const char *pa, const char *pb) {
    size_t na = 0, nb = 0;
    char *a = read_all(pa, &na), *b = read_all(pb, &nb);
    double m = a && b && na == nb ? 0 : INFINITY;
    for (size_t i = 0; isfinite(m) && i + 4 <= na; i += 4) {
        float x, y;
        memcpy(&x, a + i, 4);
        memcpy(&y, b + i, 4);
        const double d = fabs((double)x - (double)y); /* NaN in either: d is NaN */
        m = isnan(d) ? INFINITY : d > m ? d : m;
    }
    free(a);
    free(b);
    return m;
}

/* compare_runs: the two models give the same ids and logits of the expected
 * size: bit-identical when tol is 0, else within tol. */
static void compare_runs(const char *label, const char *m0, const char *m1, const char *extra, const char *tokens,
                         int n_prompt, int vocab, const char *work, double tol) {
    char p0[1100], p1[1100], id0[4096], id1[4096];
    snprintf(p0, sizeof p0, "%s/logits-orig.f32", work);
    snprintf(p1, sizeof p1, "%s/logits-inflated.f32", work);
    CHECK(run_logits(m0, extra, tokens, p0, id0, sizeof id0) == 0, "%s: moe-run on %s", label, m0);
    CHECK(run_logits(m1, extra, tokens, p1, id1, sizeof id1) == 0, "%s: moe-run on %s", label, m1);
    struct stat sb;
    const long long want = (long long)(n_prompt + 7) * vocab * 4;
    CHECK(stat(p0, &sb) == 0 && sb.st_size == want, "%s: logits file has %lld bytes", label, want);
    CHECK(id0[0] && !strcmp(id0, id1), "%s: greedy ids %s vs %s", label, id0, id1);
    int same = same_file(p0, p1);
    const double diff = same ? 0 : max_abs_diff(p0, p1);
    CHECK(same || (tol > 0 && diff <= tol), "%s: logits of the inflated model are not %s (max |diff| %g)", label,
          tol > 0 ? "within the tolerance" : "bit-identical", diff);
    printf("  %-28s ids %s, logits %s (max |diff| %g)\n", label, !strcmp(id0, id1) ? "identical" : "DIFFER",
           same ? "bit-identical" : "differ", diff);
    unlink(p0);
    unlink(p1);
}

/* blob_bytes: an expert precision's blob size from `moe-prep inspect --json`. */
static long long blob_bytes(const char *bundle, const char *prec) {
    static char out[1 << 16];
    long long v = -1;
    if (moe_test_sh_out(out, sizeof out, "%s inspect %s --json", prep, bundle) != 0) return -1;
    cJSON *j = cJSON_Parse(out), *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(j, "precisions")) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(p, "name");
        const cJSON *bb = cJSON_GetObjectItemCaseSensitive(p, "blob_bytes");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, prec) && cJSON_IsNumber(bb))
            v = (long long)bb->valuedouble;
    }
    cJSON_Delete(j);
    return v;
}

/* check_model: inflate, compare the files, the logits unquantized and at each
 * quantized precision. */
static void check_model(const char *label, const char *model, const char *work, int N, int quantized, double tol) {
    char out[1100], cfg[1200], text[65536];
    snprintf(out, sizeof out, "%s/%s-ffn%d", work, label, N);
    CHECK(moe_test_sh_out(text, sizeof text, "%s %s %s --ffn %d", inflate, model, out, N) == 0, "%s: inflate-moe --ffn %d", label,
          N);
    printf("  %s", text);
    check_config(model, out, N);
    static const char *const side[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    for (int i = 0; i < 3; i++) {
        char a[1200], b[1200];
        snprintf(a, sizeof a, "%s/%s", model, side[i]);
        snprintf(b, sizeof b, "%s/%s", out, side[i]);
        CHECK(access(a, F_OK) != 0 || same_file(a, b), "%s: %s copied byte for byte", label, side[i]);
    }
    int n_exp = check_tensors(model, out, N);
    CHECK(n_exp > 0, "%s: experts found and padded", label);
    CHECK(no_temp_files(out), "%s: no temporary files left in %s", label, out);

    /* the prompt: held-out text through the model's tokenizer, else fixed ids */
    char tokens[4096] = "1,2,3,4,5,6,7,8,9";
    snprintf(cfg, sizeof cfg, "%s/tokenizer.json", model);
    if (access(cfg, F_OK) == 0)
        CHECK(moe_test_sh_out(tokens, sizeof tokens, "%s -m %s --tokenize -p 'The river rose through the night, and by morning'",
                 moe_run, model) == 0,
              "%s: --tokenize", label);
    char *nl = strchr(tokens, '\n');
    if (nl) *nl = 0;
    int n_prompt = 1;
    for (const char *c = tokens; *c; c++) n_prompt += *c == ',';
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    size_t len;
    char *ctext = read_all(cfg, &len);
    cJSON *cj = ctext ? cJSON_Parse(ctext) : NULL;
    const cJSON *vs = cJSON_GetObjectItemCaseSensitive(cj, "vocab_size");
    const cJSON *is = cJSON_GetObjectItemCaseSensitive(cj, "intermediate_size");
    int vocab = cJSON_IsNumber(vs) ? vs->valueint : 0, F = cJSON_IsNumber(is) ? is->valueint : 0;
    cJSON_Delete(cj);
    free(ctext);

    compare_runs(label, model, out, "", tokens, n_prompt, vocab, work, tol);
    if (!quantized) return;
    char b0[1200], b1[1200];
    snprintf(b0, sizeof b0, "%s/%s-orig.moeb", work, label);
    snprintf(b1, sizeof b1, "%s/%s-ffn%d.moeb", work, label, N);
    CHECK(moe_test_sh_out(NULL, 0, "%s quantize %s -o %s --experts q8_0,q4_k,q2_k --dense q8_0 -t 2 2>&1", prep, model, b0) == 0,
          "%s: quantize the original", label);
    CHECK(moe_test_sh_out(NULL, 0, "%s quantize %s -o %s --experts q8_0,q4_k,q2_k --dense q8_0 -t 2 2>&1", prep, out, b1) == 0,
          "%s: quantize the inflated model", label);
    static const char *const precs[] = {"q8_0", "q4_k", "q2_k"};
    for (int i = 0; i < 3; i++) {
        char opt[64], name[96];
        snprintf(opt, sizeof opt, "--expert-precision %s", precs[i]);
        snprintf(name, sizeof name, "%s bundle %s", label, precs[i]);
        compare_runs(name, b0, b1, opt, tokens, n_prompt, vocab, work, 0);
        long long s0 = blob_bytes(b0, precs[i]), s1 = blob_bytes(b1, precs[i]);
        const double ratio = s0 > 0 ? (double)s1 / (double)s0 : 0;
        const double want = F > 0 ? (double)N / F : 0;
        CHECK(ratio > want * 0.99 && ratio < want * 1.01, "%s: expert blob %lld -> %lld bytes (x%.3f, want x%.1f)",
              name, s0, s1, ratio, want);
        printf("  %-28s expert blob %lld -> %lld bytes (x%.2f)\n", name, s0, s1, ratio);
    }
}

/* check_refusals: the error exits. */
static void check_refusals(const char *model, const char *work) {
    char out[65536], dst[1100];
    snprintf(dst, sizeof dst, "%s/refused", work);
    CHECK(moe_test_sh_out(out, sizeof out, "%s --help", inflate) == 0 && strstr(out, "Mixtral") && strstr(out, "example"),
          "--help exits 0, names the supported layout and has an example");
    CHECK(moe_test_sh_out(out, sizeof out, "%s %s %s --ffn 128 2>&1", inflate, model, dst) == 1 && strstr(out, "smaller"),
          "--ffn below F exits 1 with a reason: %s", out);
    snprintf(out, sizeof out, "%s/model.safetensors", dst);
    CHECK(access(out, F_OK) != 0, "nothing written when refused");
    CHECK(moe_test_sh_out(out, sizeof out, "%s %s/models/gpt_oss-f32 %s --ffn 256 2>&1", inflate, MOE_FIXTURES, dst) == 1 &&
              strstr(out, "per-expert"),
          "the fused gate_up_proj layout is refused and the message says why: %s", out);
    CHECK(moe_test_sh_out(out, sizeof out, "%s %s %s --ffn 1024 2>&1", inflate, model, model) == 1, "OUT_DIR = IN_DIR exits 1");
    CHECK(moe_test_sh_out(out, sizeof out, "%s %s %s --ffn 12x 2>&1", inflate, model, dst) == 2, "bad --ffn exits 2");
    CHECK(moe_test_sh_out(out, sizeof out, "%s %s 2>&1", inflate, model) == 2, "missing OUT_DIR exits 2");
    CHECK(moe_test_sh_out(out, sizeof out, "%s %s/no-such-model %s --ffn 512 2>&1", inflate, work, dst) == 1,
          "missing model exits 1");
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: test-inflate INFLATE-MOE MOE-RUN MOE-PREP MODEL_DIR WORK_DIR\n");
        return 2;
    }
    inflate = argv[1], moe_run = argv[2], prep = argv[3];
    const char *model = argv[4], *work = argv[5];
    char fixture[1100];
    if (moe_test_sh_out(NULL, 0, "rm -rf '%s' && mkdir -p '%s'", work, work) != 0) {
        fprintf(stderr, "test-inflate: cannot create %s\n", work);
        return 1;
    }
    check_model("tiny-moe-mixtral", model, work, 1024, 1, 0);
    snprintf(fixture, sizeof fixture, "%s/models/mixtral-f32", MOE_FIXTURES);
    check_model("mixtral-f32", fixture, work, 256, 0, 0);
    snprintf(fixture, sizeof fixture, "%s/models/qwen3_moe-f32", MOE_FIXTURES);
    /* F = 36 is not a multiple of the SIMD width: the down matrix's dot products
     * sum in another order once widened, so the logits agree to rounding only */
    check_model("qwen3_moe-f32", fixture, work, 144, 0, 1e-4);
    check_refusals(model, work);
    printf("test-inflate: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    if (!fails) moe_test_sh_out(NULL, 0, "rm -rf '%s'", work);
    return fails != 0;
}

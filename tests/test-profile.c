/*
 * test-profile.c - `moe-prep profile` end to end on the fixture models
 * (qwen2_moe-f32, whose layer 1 is dense, and mixtral-f32):
 *   - the profile file reads back; popularity counts total tokens x MoE layers
 *     x K; the sequences are ctx tokens each, the last cut by --max-tokens;
 *   - the trace equals what a session with an on_route observer records here,
 *     independently, on the same tokens (dataset loaded and tokenized with the
 *     eval functions, BOS over each sequence's first token, one forward call
 *     per sequence);
 *   - the HOBBIT thresholds are what routing-stats computes from the trace and
 *     give the target shares within what ties allow;
 *   - every derived array is present with its shape; stacked-gate accuracy and
 *     similarities are in range, NaN exactly where model layer l+j is dense or
 *     absent;
 *   - a missing dataset or a bad model exits 1, a usage error 2, --help 0.
 * argv[1] is the moe-prep binary.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe-dataset.h"
#include "moe-model.h"
#include "moe-session.h"
#include "moe-test.h"
#include "profile-h5.h"
#include "quantize/eval.h"
#include "routing-stats.h"

#define CTX 32
#define MAX_TOKENS 180 /* 5 whole sequences and one of 20 tokens */
#define TARGET_LOW 0.30
#define TARGET_SKIP 0.03

static const char *moe_prep;
static char text_path[64] = "/tmp/test-profile-txt-XXXXXX", out_path[64] = "/tmp/test-profile-h5-XXXXXX";

static int run(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* write_text: a few hundred words of varied sentences. */
static void write_text(void) {
    static const char *const subj[] = {"The cat", "A ship", "My neighbour", "The old river", "Every child",
                                       "The committee", "A quiet engine", "The winter wind"};
    static const char *const verb[] = {"watches", "carries", "forgets", "follows", "paints", "answers",
                                       "measures", "remembers"};
    static const char *const obj[] = {"the morning light", "seven small boxes", "a letter from home",
                                      "the distant hills", "every question", "the broken clock",
                                      "a song about rain", "the numbers 3, 14 and 15"};
    FILE *f = fopen(text_path, "w");
    for (int i = 0; i < 160; i++)
        fprintf(f, "%s %s %s.%s", subj[(i * 5) % 8], verb[(i * 3 + i / 8) % 8], obj[(i * 7 + 1) % 8],
                i % 9 == 8 ? "\n\n" : " ");
    fclose(f);
}

struct rec {
    int L, K, *moe_index;
    int16_t *experts;
    float *weights; /* [tokens x L x K], filled at offset base */
    int64_t base;
};

static void on_route(const struct moe_route_event *ev, void *user) {
    struct rec *r = user;
    int li = r->moe_index[ev->layer];
    for (int t = 0; t < ev->n_tokens; t++)
        for (int j = 0; j < ev->k; j++) {
            size_t o = ((size_t)(r->base + ev->pos0 + t) * r->L + li) * r->K + j;
            r->experts[o] = (int16_t)ev->experts[t * ev->k + j];
            r->weights[o] = ev->weights[t * ev->k + j];
        }
}

/* check_trace: the profile's trace against one recorded here. */
static void check_trace(const char *name, const char *dir, const struct moe_profile *p) {
    struct moe_model *m = NULL;
    char *text = NULL;
    size_t len = 0, n_ids = 0;
    int32_t *ids = NULL;
    struct moe_dataset_params dp = moe_dataset_default_params();
    CHECK(moe_model_load(dir, NULL, &m) == MOE_OK, "%s: load", name);
    CHECK(moe_eval_text_load(text_path, &dp, &text, &len) == MOE_OK, "%s: text", name);
    if (!m || !text) goto done;
    CHECK(moe_eval_tokenize(m, NULL, text, len, &ids, &n_ids) == MOE_OK && n_ids >= 6 * CTX,
          "%s: tokenize (%zu tokens; the text must hold 6 sequences)", name, n_ids);
    if (n_ids < 6 * CTX) goto done;
    int moe_index[64], L = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) moe_index[l] = m->cfg.layer_moe[l] ? L++ : -1;
    const int K = m->cfg.n_expert_used;
    struct rec r = {L, K, moe_index, calloc((size_t)MAX_TOKENS * L * K, 2), calloc((size_t)MAX_TOKENS * L * K, 4), 0};
    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = CTX;
    sp.n_batch = CTX;
    sp.n_threads = 2;
    sp.on_route = on_route;
    sp.route_user = &r;
    const int32_t bos = moe_eval_bos(m->tok);
    for (int64_t pos = 0; pos < MAX_TOKENS; pos += CTX) {
        int32_t seq[CTX];
        int n = MAX_TOKENS - pos < CTX ? (int)(MAX_TOKENS - pos) : CTX;
        memcpy(seq, ids + pos, sizeof(int32_t) * n);
        if (bos >= 0) seq[0] = bos;
        struct moe_session *s = NULL;
        r.base = pos;
        CHECK(moe_session_create(m, &sp, &s) == MOE_OK && moe_session_forward(s, seq, n, NULL, 0) == MOE_OK,
              "%s: forward at %lld", name, (long long)pos);
        moe_session_free(s);
    }
    CHECK(p->n_layers == L && p->k == K && p->n_experts == m->cfg.n_expert, "%s: shape", name);
    if (p->n_layers == L && p->k == K && moe_profile_n_tokens(p) == MAX_TOKENS) {
        size_t n = (size_t)MAX_TOKENS * L * K, bad_e = 0, bad_w = 0;
        for (size_t i = 0; i < n; i++) {
            bad_e += p->experts[i] != r.experts[i];
            bad_w += fabsf(p->weights[i] - r.weights[i]) > 1e-6f;
        }
        CHECK(bad_e == 0 && bad_w == 0, "%s: trace differs from the session's: %zu experts, %zu weights of %zu",
              name, bad_e, bad_w, n);
        for (int li = 0; li < L; li++) {
            int l = 0;
            while (moe_index[l] != li) l++;
            CHECK(p->moe_layer_index[li] == l, "%s: moe_layer_index[%d] = %d, want %d", name, li,
                  p->moe_layer_index[li], l);
        }
    }
    free(r.experts);
    free(r.weights);
done:
    free(ids);
    free(text);
    moe_model_free(m);
}

/* check_shape: derived f64 array `nm` present with dims d0 [x d1]. */
static const double *check_shape(const char *name, const struct moe_profile *p, const char *nm, int nd, int64_t d0,
                                 int64_t d1) {
    int ndims = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    const double *x = NULL;
    enum moe_status st = moe_profile_get_f64(p, nm, &ndims, dims, &x);
    CHECK(st == MOE_OK && ndims == nd && dims[0] == d0 && (nd == 1 || dims[1] == d1),
          "%s: derived %s: status %d, ndims %d, dims %lld x %lld (want %lld x %lld)", name, nm, st, ndims,
          (long long)dims[0], nd > 1 ? (long long)dims[1] : 1LL, (long long)d0, (long long)d1);
    return st == MOE_OK ? x : NULL;
}

static void check_thresholds(const char *name, const struct moe_profile *p) {
    struct moe_trace t;
    moe_profile_trace(p, &t);
    size_t n = (size_t)moe_trace_n_tokens(&t) * t.n_layers * t.k;
    float *s = malloc(n * sizeof *s);
    moe_hobbit_scores(&t, s);
    struct moe_hobbit_split want;
    CHECK(moe_hobbit_thresholds(s, n, TARGET_LOW, TARGET_SKIP, &want) == MOE_OK, "%s: thresholds", name);
    const double *thr = check_shape(name, p, "hobbit_thresholds", 1, 5, 0);
    if (thr) {
        CHECK(thr[0] == want.t1 && thr[1] == want.t2, "%s: T1 %g T2 %g, routing-stats gives %g %g", name, thr[0],
              thr[1], want.t1, want.t2);
        struct moe_hobbit_split got = moe_hobbit_split_at(s, n, thr[0], thr[1]);
        CHECK(fabs(got.high - thr[2]) < 1e-12 && fabs(got.low - thr[3]) < 1e-12 && fabs(got.skip - thr[4]) < 1e-12,
              "%s: stored split %g %g %g, thresholds give %g %g %g", name, thr[2], thr[3], thr[4], got.high, got.low,
              got.skip);
        /* the largest group of equal non-zero scores bounds how close a split can come */
        float *sorted = malloc(n * sizeof *sorted);
        memcpy(sorted, s, n * sizeof *s);
        for (size_t i = 1; i < n; i++) /* insertion sort: n is a few thousand */
            for (size_t j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
                float x = sorted[j];
                sorted[j] = sorted[j - 1], sorted[j - 1] = x;
            }
        size_t tie = 1, run_len = 1;
        for (size_t i = 1; i < n; i++) {
            run_len = sorted[i] == sorted[i - 1] ? run_len + 1 : 1;
            if (sorted[i] > 0 && run_len > tie) tie = run_len;
        }
        double slack = (double)(tie + 1) / n;
        CHECK(fabs(thr[4] - TARGET_SKIP) <= slack && fabs(thr[3] + thr[4] - TARGET_LOW - TARGET_SKIP) <= slack,
              "%s: split low %g skip %g, targets %g %g (ties allow %g)", name, thr[3], thr[4], TARGET_LOW,
              TARGET_SKIP, slack);
        free(sorted);
    }
    free(s);
}

static void check_model(const char *name) {
    char dir[512], cmd[2048];
    snprintf(dir, sizeof dir, "%s/models/%s", MOE_FIXTURES, name);
    snprintf(cmd, sizeof cmd, "%s profile %s --dataset %s -o %s --ctx %d --max-tokens %d -t 2 --heldout 0.34 >/dev/null 2>&1",
             moe_prep, dir, text_path, out_path, CTX, MAX_TOKENS);
    int rc = run(cmd);
    CHECK(rc == 0, "%s: exit %d", cmd, rc);
    struct moe_profile *p = NULL;
    CHECK(moe_profile_read(out_path, &p) == MOE_OK, "%s: cannot read the profile", name);
    if (!p) return;
    const int L = p->n_layers, E = p->n_experts, K = p->k;
    const int64_t n_tok = moe_profile_n_tokens(p);
    CHECK(n_tok == MAX_TOKENS && p->n_seq == 6 && p->seq_start[1] == CTX && p->seq_start[5] == 5 * CTX,
          "%s: %lld tokens in %d sequences", name, (long long)n_tok, p->n_seq);
    int64_t total = 0;
    for (int i = 0; i < L * E; i++) total += p->popularity[i];
    CHECK(total == n_tok * L * K, "%s: popularity total %lld, want %lld", name, (long long)total,
          (long long)(n_tok * L * K));
    CHECK(!strcmp(p->dataset, text_path) && p->arch[0], "%s: meta (%s, %s)", name, p->arch, p->dataset);
    check_trace(name, dir, p);
    check_thresholds(name, p);

    /* derived arrays */
    int nd = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    const int32_t *order = NULL;
    CHECK(moe_profile_get_i32(p, "placement_order", &nd, dims, &order) == MOE_OK && nd == 1 && dims[0] == L * E,
          "%s: placement_order", name);
    if (order) {
        int seen[512] = {0}, ok = 1;
        for (int i = 0; i < L * E; i++) ok &= order[i] >= 0 && order[i] < L * E && !seen[order[i]]++;
        for (int i = 1; i < L * E; i++) ok &= p->popularity[order[i - 1]] >= p->popularity[order[i]];
        CHECK(ok, "%s: placement_order is not a popularity-sorted permutation", name);
    }
    const int64_t *split = NULL;
    CHECK(moe_profile_get_i64(p, "split_sequences", &nd, dims, &split) == MOE_OK && split[0] == 4 && split[1] == 2,
          "%s: split_sequences", name);
    const double *hit = check_shape(name, p, "placement_hit_rate", 2, 3, 3);
    if (hit)
        for (int i = 0; i < 3; i++)
            CHECK(hit[i * 3 + 1] >= 0 && hit[i * 3 + 1] <= 1 && fabs(hit[i * 3 + 2] - hit[i * 3]) < 0.5 / (L * E) + 1e-9,
                  "%s: placement_hit_rate row %d: %g %g %g", name, i, hit[i * 3], hit[i * 3 + 1], hit[i * 3 + 2]);
    const double *r = check_shape(name, p, "gate_output_pearson", 1, 1, 0);
    if (r) CHECK(r[0] >= -1 && r[0] <= 1, "%s: pearson %g", name, r[0]);
    const double *sim = check_shape(name, p, "layer_similarity", 2, L, 4);
    const double *top1 = check_shape(name, p, "stacked_top1", 2, L, 4);
    const double *rec = check_shape(name, p, "stacked_recall", 2, L, 4);
    if (sim && top1 && rec) {
        int n_layer = p->moe_layer_index[L - 1] + 1, is_moe[64] = {0};
        for (int li = 0; li < L; li++) is_moe[p->moe_layer_index[li]] = 1;
        for (int li = 0; li < L; li++)
            for (int j = 1; j <= 4; j++) {
                int l = p->moe_layer_index[li] + j, i = li * 4 + j - 1;
                if (l < n_layer && is_moe[l])
                    CHECK(top1[i] >= 0 && top1[i] <= 1 && rec[i] >= 0 && rec[i] <= 1 && sim[i] >= -1 - 1e-9 &&
                              sim[i] <= 1 + 1e-9,
                          "%s: stacked [%d][%d]: top1 %g recall %g cosine %g", name, li, j, top1[i], rec[i], sim[i]);
                else
                    CHECK(isnan(top1[i]) && isnan(rec[i]) && isnan(sim[i]), "%s: stacked [%d][%d] should be NaN", name,
                          li, j);
            }
        CHECK(isfinite(top1[(L - 2) * 4 + (p->moe_layer_index[L - 1] - p->moe_layer_index[L - 2]) - 1]),
              "%s: stacked accuracy towards the last MoE layer is missing", name);
    }
    check_shape(name, p, "path_accuracy_order1", 2, 2, 3);
    check_shape(name, p, "path_accuracy_order2", 2, 2, 3);
    check_shape(name, p, "path_key_coverage", 1, 2, 0);
    const double *reuse = check_shape(name, p, "reuse", 2, L, K);
    if (reuse)
        for (int i = 0; i < L * K; i++) CHECK(reuse[i] >= 0 && reuse[i] <= 1, "%s: reuse[%d] = %g", name, i, reuse[i]);
    const double *chance = check_shape(name, p, "reuse_chance", 1, 1, 0);
    if (chance) CHECK(fabs(chance[0] - (double)K / E) < 1e-12, "%s: reuse_chance %g", name, chance[0]);
    moe_profile_free(p);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test-profile MOE_PREP\n");
        return 2;
    }
    moe_prep = argv[1];
    close(mkstemp(text_path));
    close(mkstemp(out_path));
    write_text();

    check_model("qwen2_moe-f32");
    check_model("mixtral-f32");

    /* failures and usage */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s profile %s/models/mixtral-f32 --dataset /nonexistent/text.txt -o %s 2>/dev/null",
             moe_prep, MOE_FIXTURES, out_path);
    CHECK(run(cmd) == 1, "missing dataset: want exit 1");
    snprintf(cmd, sizeof cmd, "%s profile %s/models/no-such-model --dataset %s -o %s 2>/dev/null", moe_prep,
             MOE_FIXTURES, text_path, out_path);
    CHECK(run(cmd) == 1, "bad model: want exit 1");
    snprintf(cmd, sizeof cmd, "%s profile %s --dataset %s -o %s 2>/dev/null", moe_prep, text_path, text_path, out_path);
    CHECK(run(cmd) == 1, "a text file as the model: want exit 1");
    snprintf(cmd, sizeof cmd, "%s profile %s/models/mixtral-f32 -o %s 2>/dev/null", moe_prep, MOE_FIXTURES, out_path);
    CHECK(run(cmd) == 2, "no --dataset: want exit 2");
    snprintf(cmd, sizeof cmd, "%s profile %s/models/mixtral-f32 --dataset %s -o %s --ctx x 2>/dev/null", moe_prep,
             MOE_FIXTURES, text_path, out_path);
    CHECK(run(cmd) == 2, "bad --ctx: want exit 2");
    snprintf(cmd, sizeof cmd, "%s profile --help | grep -q example", moe_prep);
    CHECK(run(cmd) == 0, "--help: want exit 0 with an example");

    unlink(text_path);
    unlink(out_path);
    if (!fails) printf("test-profile: ok\n");
    return fails != 0;
}

/*
 * profile.c - `moe-prep profile`: record the routing of a model over a text
 * (runtime observed only through the session's on_route / on_expert
 * callbacks), optionally run MoBiLE's little model beside it, and store the
 * trace, counts and sums in a profile (profile-h5); the results are derived
 * from the profile alone (profile-derive.c), so `profile merge` of shards gives
 * what one run gives. Also dispatches `profile merge` and `profile report`.
 * The derived arrays are listed in profile-results.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "token-stream.h"
#include "moe-dataset.h"
#include "moe-mmap.h"
#include "moe-prep.h"
#include "moe-quant.h"
#include "moe-session.h"
#include "profile-cli.h"
#include "profile-h5.h"
#include "shard.h"
#include "profile-results.h"
#include "report.h"
#include "routing-stats.h"
#include "tool-util.h"

#define MAX_DIST MOE_PROFILE_MAX_DIST

struct profile_args {
    const char *model, *dataset, *out, *csv_dir;
    int n_ctx;
    long long max_tokens; /* 0 = all */
    struct moe_profile_targets targets;
    int n_threads, json, no_tuning;
    int big_little_every; /* run the little model on every Nth sequence; 0 = never, -1 = auto */
    int shard_i, shard_n; /* this run is shard shard_i (1-based) of shard_n */
    enum moe_profile_logits logits;
};

/* What the observers record. Per sequence: the trace rows, gate inputs and
 * router logits; over the run: the Pearson sums. */
struct recorder {
    int L, E, K, n_embd, n_layer;
    const int *moe_index;   /* [n_layer] model layer -> MoE layer, -1 if dense */
    const int32_t *layer_of; /* [L] MoE layer -> model layer */
    int n_ctx;
    int16_t *experts;       /* [n_ctx x L x K] current sequence */
    float *weights;         /* [n_ctx x L x K] */
    float *gate_in;         /* [L x n_ctx x n_embd] */
    float *logits;          /* [n_ctx x L x E] router logits, or NULL when not kept */
    unsigned char *seen;    /* [L x n_ctx] a route event covered this row */
    int bad;                /* an event did not fit (logged once) */
    double pearson[6];      /* n, sum g, sum y, sum g^2, sum y^2, sum g y */
};

static void profile_usage(FILE *f) {
    fprintf(f,
            "usage: moe-prep profile MODEL --dataset SPEC -o PROFILE.h5 [options]\n"
            "       moe-prep profile merge SHARD.h5... -o PROFILE.h5 [options]\n"
            "       moe-prep profile report PROFILE.h5 -o REPORT.html\n"
            "\n"
            "Runs MODEL (checkpoint directory or .moeb bundle) over a text in batched\n"
            "prefill, records the routing of every token at every MoE layer and writes it,\n"
            "with what follows from it, to an HDF5 profile: placement order and hit rate\n"
            "(Twiddler), HOBBIT thresholds T1/T2 and stacked-gate prefetch accuracy,\n"
            "activation-path dictionaries (EdgeMoE), expert reuse, and MoBiLE's\n"
            "big-little fallback ratio against gamma. When MODEL is a bundle, T1/T2, the\n"
            "popularity order, the path dictionaries and gamma are also written into its\n"
            "tuning section for moe-run. Prints a summary.\n"
            "\n"
            "options:\n"
            "  --dataset SPEC        text to profile on (dataset card or file; see docs/cli.md)\n"
            "  -o, --out FILE        profile file to write (HDF5; replaced atomically)\n"
            "  --ctx N               tokens per sequence, one forward pass each (default 256)\n"
            "  --max-tokens N        stop after N tokens (default: every whole sequence)\n"
            "  --target-low X        HOBBIT: share of loads at low precision (default 0.30)\n"
            "  --target-skip X       HOBBIT: share of loads skipped (default 0.03)\n"
            "  --target-fallback X   MoBiLE: fallback ratio the suggested gamma gives (default 0.2)\n"
            "  --big-little-every N  run the little model (K/2 experts) on every Nth sequence\n"
            "                        (1 = all; 0 = never; default 16, or fewer so that at\n"
            "                        least 2 sequences are sampled); each sampled sequence\n"
            "                        costs about 1.7 plain forward passes more\n"
            "  --heldout X           share of the last sequences held out for hit rates and\n"
            "                        path-dictionary accuracy (default 0.2; 0 = none)\n"
            "  --router-logits TYPE  also keep every router logit in the trace: f16 or f32\n"
            "  --shard I/N           profile only the I-th of N slices of the sequences (I from\n"
            "                        1); combine the shards with `moe-prep profile merge`;\n"
            "                        auto (or auto/N) takes I and N from a Slurm or Kubernetes\n"
            "                        job array (docs/distributed.md)\n"
            "  --csv-dir DIR         also write the summaries as CSV files into DIR\n"
            "  --no-tuning           do not write the results into the bundle's tuning section\n"
            "  -t, --threads N       CPU threads (default: all online CPUs)\n"
            "  --json                summary as JSON on stdout\n"
            "  -h, --help            this text\n"
            "\n"
            "examples:\n"
            "  moe-prep profile model.moeb --dataset wikitext.txt -o p.h5\n"
            "  moe-prep profile model.moeb --dataset c4.txt -o p.h5 --ctx 128 --max-tokens 20000 --json\n"
            "  moe-prep profile model.moeb --dataset c4.txt -o s1.h5 --shard 1/2   # on one machine\n"
            "  moe-prep profile model.moeb --dataset c4.txt -o s2.h5 --shard 2/2   # on another\n"
            "  moe-prep profile merge s1.h5 s2.h5 -o p.h5 --bundle model.moeb\n"
            "  moe-prep profile report p.h5 -o p.html\n");
}

static int parse_num(const char *o, const char *v, double lo, double hi, double *out) {
    return moe_tool_parse_double("profile", o, v, lo, hi, out);
}

static int parse_ll(const char *o, const char *v, long long lo, long long hi, long long *out) {
    return moe_tool_parse_ll("profile", o, v, lo, hi, out);
}

/* parse_shard: "I/N" with 1 <= I <= N, or auto / auto/N from a Slurm or
 * Kubernetes job array (tools/common/shard.h). */
static int parse_shard(const char *v, int *i, int *n) {
    char why[256];
    if (!moe_shard_parse(v, 0, i, n, why, sizeof why)) {
        fprintf(stderr, "moe-prep profile: --shard: %s\n", why);
        return 0;
    }
    *i += 1; /* this file counts shards from 1 */
    return 1;
}

/* parse_args: 0 ok, 1 help printed, 2 usage error (reported). */
static int parse_args(int argc, char **argv, struct profile_args *a) {
    memset(a, 0, sizeof *a);
    a->n_ctx = 256;
    a->targets = moe_profile_default_targets();
    a->big_little_every = -1;
    a->shard_i = a->shard_n = 1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
        long long n;
#define NEXT() (i + 1 < argc ? argv[++i] : (fprintf(stderr, "moe-prep profile: %s needs a value\n", o), (char *)NULL))
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            profile_usage(stdout);
            return 1;
        } else if (!strcmp(o, "--dataset")) {
            if (!(a->dataset = NEXT())) return 2;
        } else if (!strcmp(o, "-o") || !strcmp(o, "--out")) {
            if (!(a->out = NEXT())) return 2;
        } else if (!strcmp(o, "--csv-dir")) {
            if (!(a->csv_dir = NEXT())) return 2;
        } else if (!strcmp(o, "--ctx")) {
            if (!(v = NEXT()) || !parse_ll(o, v, 2, 1 << 20, &n)) return 2;
            a->n_ctx = (int)n;
        } else if (!strcmp(o, "--max-tokens")) {
            if (!(v = NEXT()) || !parse_ll(o, v, 1, (long long)1 << 40, &a->max_tokens)) return 2;
        } else if (!strcmp(o, "--target-low")) {
            if (!(v = NEXT()) || !parse_num(o, v, 0, 1, &a->targets.low)) return 2;
        } else if (!strcmp(o, "--target-skip")) {
            if (!(v = NEXT()) || !parse_num(o, v, 0, 1, &a->targets.skip)) return 2;
        } else if (!strcmp(o, "--target-fallback")) {
            if (!(v = NEXT()) || !parse_num(o, v, 0, 1, &a->targets.fallback)) return 2;
        } else if (!strcmp(o, "--heldout")) {
            if (!(v = NEXT()) || !parse_num(o, v, 0, 0.9, &a->targets.heldout)) return 2;
        } else if (!strcmp(o, "--big-little-every")) {
            if (!(v = NEXT()) || !parse_ll(o, v, 0, 1 << 30, &n)) return 2;
            a->big_little_every = (int)n;
        } else if (!strcmp(o, "--router-logits")) {
            if (!(v = NEXT())) return 2;
            if (!strcmp(v, "f16"))
                a->logits = MOE_PROFILE_LOGITS_F16;
            else if (!strcmp(v, "f32"))
                a->logits = MOE_PROFILE_LOGITS_F32;
            else {
                fprintf(stderr, "moe-prep profile: --router-logits wants f16 or f32, not \"%s\"\n", v);
                return 2;
            }
        } else if (!strcmp(o, "--shard")) {
            if (!(v = NEXT()) || !parse_shard(v, &a->shard_i, &a->shard_n)) return 2;
        } else if (!strcmp(o, "--no-tuning")) {
            a->no_tuning = 1;
        } else if (!strcmp(o, "-t") || !strcmp(o, "--threads")) {
            if (!(v = NEXT()) || !parse_ll(o, v, 1, 256, &n)) return 2;
            a->n_threads = (int)n;
        } else if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (o[0] == '-') {
            fprintf(stderr, "moe-prep profile: unknown option \"%s\" (see moe-prep profile --help)\n", o);
            return 2;
        } else if (!a->model) {
            a->model = o;
        } else {
            fprintf(stderr, "moe-prep profile: one MODEL only (\"%s\" and \"%s\")\n", a->model, o);
            return 2;
        }
#undef NEXT
    }
    if (!a->model || !a->dataset || !a->out) {
        fprintf(stderr, "moe-prep profile: %s (see moe-prep profile --help)\n",
                !a->model ? "no MODEL given" : !a->dataset ? "no --dataset SPEC given" : "no -o FILE given");
        return 2;
    }
    if (a->targets.low + a->targets.skip > 1) {
        fprintf(stderr, "moe-prep profile: --target-low + --target-skip exceed 1\n");
        return 2;
    }
    return 0;
}

/* ---- observers ---- */

static void on_route(const struct moe_route_event *ev, void *user) {
    struct recorder *r = user;
    int li = ev->layer >= 0 && ev->layer < r->n_layer ? r->moe_index[ev->layer] : -1;
    if (li < 0 || ev->k != r->K || ev->n_expert != r->E || ev->pos0 < 0 || ev->pos0 + ev->n_tokens > r->n_ctx) {
        if (!r->bad)
            fprintf(stderr, "moe-prep profile: unexpected route event (layer %d, k %d, %d experts, pos %d+%d)\n",
                    ev->layer, ev->k, ev->n_expert, ev->pos0, ev->n_tokens);
        r->bad = 1;
        return;
    }
    const int L = r->L, K = r->K;
    for (int t = 0; t < ev->n_tokens; t++) {
        int pos = ev->pos0 + t;
        size_t o = ((size_t)pos * L + li) * K;
        for (int j = 0; j < K; j++) {
            r->experts[o + j] = (int16_t)ev->experts[(size_t)t * K + j];
            r->weights[o + j] = ev->weights[(size_t)t * K + j];
        }
        memcpy(r->gate_in + ((size_t)li * r->n_ctx + pos) * r->n_embd, ev->gate_input + (size_t)t * r->n_embd,
               (size_t)r->n_embd * sizeof(float));
        if (r->logits)
            memcpy(r->logits + ((size_t)pos * L + li) * r->E, ev->router_logits + (size_t)t * r->E,
                   (size_t)r->E * sizeof(float));
        r->seen[(size_t)li * r->n_ctx + pos] = 1;
    }
}

static void on_expert(const struct moe_expert_event *ev, void *user) {
    struct recorder *r = user;
    for (int i = 0; i < ev->n; i++) {
        const float *y = ev->outputs + (size_t)i * r->n_embd;
        double ss = 0;
        for (int d = 0; d < r->n_embd; d++) ss += (double)y[d] * y[d];
        double g = ev->weights[i], m = fabs(g) * sqrt(ss); /* ||g E(x)|| */
        double *q = r->pearson;
        q[0] += 1, q[1] += g, q[2] += m, q[3] += g * g, q[4] += m * m, q[5] += g * m;
    }
}

/* ---- stacked gating ---- */

/* stacked_add: after a sequence of n tokens, add for every MoE layer l and
 * distance j the cosine of the gate inputs (l, l+j) and whether the router of
 * l+j applied to x_l predicts the experts actually chosen at l+j. The
 * prediction routes those logits as the runtime does (moe_route: softmax
 * top-K, sparsemixer, DeepSeek's groups, V3's sigmoid with its correction
 * bias), so its top-1 is the expert with the largest gate weight. routers:
 * [L x E x n_embd] dequantized; sums as sum.stacked [L x MAX_DIST x 4]:
 * cosine, top-1 hits, top-K recall, tokens. */
static void stacked_add(const struct recorder *r, const struct moe_model *m, const float *routers, int n,
                        double *sums, float *logits, int32_t *pred) {
    float pw[64];
    const int L = r->L, E = r->E, K = r->K, D = r->n_embd;
    for (int li = 0; li < L; li++)
        for (int j = 1; j <= MAX_DIST; j++) {
            int lj = r->layer_of[li] + j;
            if (lj >= r->n_layer || r->moe_index[lj] < 0) continue;
            int mj = r->moe_index[lj];
            double *q = sums + ((size_t)li * MAX_DIST + (j - 1)) * 4;
            for (int t = 0; t < n; t++) {
                const float *x = r->gate_in + ((size_t)li * r->n_ctx + t) * D;
                const float *y = r->gate_in + ((size_t)mj * r->n_ctx + t) * D;
                double xy = 0, xx = 0, yy = 0;
                for (int d = 0; d < D; d++) {
                    xy += (double)x[d] * y[d];
                    xx += (double)x[d] * x[d];
                    yy += (double)y[d] * y[d];
                }
                q[0] += xx > 0 && yy > 0 ? xy / sqrt(xx * yy) : 0;
                const float *w = routers + (size_t)mj * E * D;
                const float *rb = m->layers[lj].router_b; /* gpt-oss's router bias */
                for (int e = 0; e < E; e++) {
                    double acc = rb ? rb[e] : 0.0;
                    for (int d = 0; d < D; d++) acc += (double)w[(size_t)e * D + d] * x[d];
                    logits[e] = (float)acc;
                }
                moe_route(m, lj, K, logits, pred, pw);
                const int16_t *act = r->experts + ((size_t)t * L + mj) * K;
                int hit1 = 0, hits = 0;
                for (int a = 0; a < K; a++) {
                    hit1 |= act[a] == pred[0];
                    for (int b = 0; b < K; b++) hits += act[a] == pred[b];
                }
                q[1] += hit1;
                q[2] += (double)hits / K;
                q[3] += 1;
            }
        }
}

/* load_routers: every MoE layer's router as floats [L x E x n_embd]. */
static float *load_routers(const struct moe_model *m, const int32_t *layer_of, int L) {
    const int E = m->cfg.n_expert, D = m->cfg.n_embd;
    float *w = malloc((size_t)L * E * D * sizeof *w);
    if (!w) return NULL;
    for (int li = 0; li < L; li++) {
        const struct moe_weight *r = &m->layers[layer_of[li]].router;
        if (r->n_out != E || r->n_in != D) goto fail;
        size_t row = moe_qtype_row_bytes(r->type, D);
        for (int e = 0; e < E; e++)
            if (moe_dequantize_row(r->type, (const char *)r->data + (size_t)e * row, w + ((size_t)li * E + e) * D, D))
                goto fail;
    }
    return w;
fail:
    fprintf(stderr, "moe-prep profile: cannot read the router weights\n");
    free(w);
    return NULL;
}

/* ---- big-little (MoBiLE) ---- */

/* argmax_row: index of the largest of x[n] (lower index on ties). */
static int argmax_row(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* big_little_add: for each of n positions, the little model's largest output
 * probability (softmax of its logits) into the histogram sum.big_little_maxprob
 * [2 x BINS], row 0 if its top token is the big model's, row 1 if not. */
static void big_little_add(const float *big, const float *little, int n, int V, int64_t *hist) {
    const int B = MOE_PROFILE_BL_BINS;
    for (int t = 0; t < n; t++) {
        const float *x = little + (size_t)t * V;
        int a = argmax_row(x, V), b = argmax_row(big + (size_t)t * V, V);
        float z = 0; /* single precision: a bin is 1/1000 wide, and exp over the vocabulary is most of the cost */
        for (int v = 0; v < V; v++) z += expf(x[v] - x[a]);
        double pmax = 1.0 / z;
        int bin = (int)(pmax * B);
        if (bin >= B) bin = B - 1;
        if (bin < 0) bin = 0;
        hist[(a == b ? 0 : B) + bin]++;
    }
}

/* ---- the command ---- */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* run_forward: one sequence through a fresh session; logits NULL skips the LM head. */
static enum moe_status run_forward(const struct moe_model *model, const struct moe_session_params *sp,
                                   const int32_t *seq, int n, float *logits) {
    struct moe_session *s = NULL;
    enum moe_status st = moe_session_create(model, sp, &s);
    if (!st) st = moe_session_forward(s, seq, n, logits, 1);
    moe_session_free(s);
    return st;
}

/* finish: derive the results from p, write the profile, the CSV files and
 * the bundle's tuning, and print the summary. Shared by record and merge.
 * tuning_bundle NULL = no tuning. Returns the exit status. */
int moe_profile_finish(struct moe_profile *p, const struct moe_profile_targets *t, const char *out,
                       const char *csv_dir, const char *tuning_bundle, int json,
                       const struct moe_profile_labels *lb, const char *cmd) {
    struct moe_profile_results r;
    enum moe_status st;
    int n_keys = 0;
    if ((st = moe_profile_derive(p, t, &r))) {
        fprintf(stderr, "moe-prep %s: cannot compute the derived results: %s\n", cmd, moe_status_str(st));
        return 1;
    }
    int status = 1;
    if ((st = moe_profile_write(p, out))) {
        fprintf(stderr, "moe-prep %s: cannot write %s: %s\n", cmd, out, moe_status_str(st));
        goto done;
    }
    if (csv_dir && (st = moe_profile_write_csv(csv_dir, p, &r))) {
        fprintf(stderr, "moe-prep %s: cannot write the CSV files into %s: %s\n", cmd, csv_dir, moe_status_str(st));
        goto done;
    }
    if (tuning_bundle && (st = moe_profile_write_tuning(tuning_bundle, p, &r, &n_keys))) {
        fprintf(stderr, "moe-prep %s: cannot write the tuning section of %s: %s\n", cmd, tuning_bundle,
                moe_status_str(st));
        goto done;
    }
    if (json)
        moe_profile_print_json(stdout, p, &r, lb);
    else
        moe_profile_print_summary(stdout, p, &r, lb);
    fflush(stdout);
    if (tuning_bundle)
        fprintf(stderr, "moe-prep %s: wrote T1/T2, the placement order, the path dictionaries%s into the tuning "
                        "section of %s (%d keys)\n", cmd, r.little_k ? " and gamma" : "", tuning_bundle, n_keys);
    if (csv_dir) fprintf(stderr, "moe-prep %s: wrote CSV summaries into %s\n", cmd, csv_dir);
    status = 0;
done:
    moe_profile_results_free(&r);
    return status;
}

int moe_prep_profile(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "merge")) return moe_prep_profile_merge(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "report")) return moe_prep_profile_report(argc - 1, argv + 1);
    struct profile_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    int status = 1;
    struct moe_model *model = NULL;
    struct moe_profile *p = NULL;
    size_t n_ids = 0;
    int32_t *ids = NULL, *seq = NULL, *layer_of = NULL;
    int *moe_index = NULL;
    float *routers = NULL, *logits = NULL, *big = NULL, *little = NULL;
    int32_t *pred = NULL;
    struct recorder rec = {0};
    double *sums = NULL;
    int64_t *bl_hist = NULL;
    enum moe_status st;

    struct moe_dataset_params dp = moe_dataset_default_params();
    struct moe_model_params mp = moe_model_default_params();
    if (moe_model_load(a.model, &mp, &model)) {
        fprintf(stderr, "moe-prep profile: cannot load the model from %s (see the message above)\n", a.model);
        goto done;
    }
    const struct moe_config *c = &model->cfg;
    if (!moe_tool_output_ok("profile", a.out, model, &a.dataset, 1, NULL, 0)) { /* -o naming the model or text */
        status = 2;
        goto done;
    }
    if (a.n_ctx > c->max_pos) {
        fprintf(stderr, "moe-prep profile: --ctx %d exceeds the context of %s (max_position_embeddings %d)\n",
                a.n_ctx, a.model, c->max_pos);
        goto done;
    }
    /* with --max-tokens, read only the text those tokens (and one sequence more) need */
    if (moe_text_load_tokens(model, NULL, a.dataset, &dp, a.max_tokens ? (size_t)a.max_tokens + (size_t)a.n_ctx : 0,
                             &ids, &n_ids)) {
        fprintf(stderr, "moe-prep profile: cannot read or tokenize %s (see the message above)\n", a.dataset);
        goto done;
    }
    const int32_t bos = moe_text_bos(model->tok);
    int64_t n_total = (int64_t)(n_ids / (size_t)a.n_ctx) * a.n_ctx;
    if (a.max_tokens && a.max_tokens < n_total) n_total = a.max_tokens;
    if (n_total < 1) {
        fprintf(stderr, "moe-prep profile: %s tokenizes to %zu tokens, fewer than one sequence of --ctx %d; use a "
                        "longer text or a smaller --ctx\n", a.dataset, n_ids, a.n_ctx);
        goto done;
    }
    const int n_seq_all = (int)((n_total + a.n_ctx - 1) / a.n_ctx);
    if (a.shard_n > n_seq_all) {
        fprintf(stderr, "moe-prep profile: --shard %d/%d: the text has only %d sequences of --ctx %d\n", a.shard_i,
                a.shard_n, n_seq_all, a.n_ctx);
        goto done;
    }
    /* the big-little sample: every 16th sequence by default (a ~10 % cost), at
     * least 2 sequences; from the whole run's count, so shards agree */
    if (a.big_little_every < 0) {
        a.big_little_every = n_seq_all / 2 < 16 ? n_seq_all / 2 : 16;
        if (a.big_little_every < 1) a.big_little_every = 1;
    }
    /* this shard's sequences [seq0, seq1) */
    const int seq0 = (int)((int64_t)(a.shard_i - 1) * n_seq_all / a.shard_n);
    const int seq1 = (int)((int64_t)a.shard_i * n_seq_all / a.shard_n);

    /* model layer <-> MoE layer */
    int L = 0;
    if (!(moe_index = malloc((size_t)c->n_layer * sizeof *moe_index))) goto nomem;
    for (int l = 0; l < c->n_layer; l++) moe_index[l] = c->layer_moe[l] ? L++ : -1;
    if (L == 0 || c->n_expert < 1 || c->n_expert > INT16_MAX) {
        fprintf(stderr, "moe-prep profile: %s has no MoE layers to profile\n", a.model);
        goto done;
    }
    if (!(layer_of = malloc((size_t)L * sizeof *layer_of))) goto nomem;
    for (int l = 0; l < c->n_layer; l++)
        if (moe_index[l] >= 0) layer_of[moe_index[l]] = l;
    const int E = c->n_expert, K = c->n_expert_used, D = c->n_embd, V = c->n_vocab;
    const int little_k = K / 2;
    if (a.big_little_every > 0 && little_k < 1) {
        fprintf(stderr, "moe-prep profile: the model routes each token to 1 expert; no K/2 little model, "
                        "skipping the big-little pass\n");
        a.big_little_every = 0;
    }
    if (!(routers = load_routers(model, layer_of, L))) goto done;

    rec = (struct recorder){.L = L, .E = E, .K = K, .n_embd = D, .n_layer = c->n_layer, .moe_index = moe_index,
                            .layer_of = layer_of, .n_ctx = a.n_ctx};
    rec.experts = malloc((size_t)a.n_ctx * L * K * sizeof *rec.experts);
    rec.weights = malloc((size_t)a.n_ctx * L * K * sizeof *rec.weights);
    rec.gate_in = malloc((size_t)L * a.n_ctx * D * sizeof *rec.gate_in);
    rec.seen = malloc((size_t)L * a.n_ctx);
    if (a.logits && !(rec.logits = malloc((size_t)a.n_ctx * L * E * sizeof *rec.logits))) goto nomem;
    sums = calloc((size_t)L * MAX_DIST * 4, sizeof *sums);
    bl_hist = calloc((size_t)2 * MOE_PROFILE_BL_BINS, sizeof *bl_hist);
    seq = malloc((size_t)a.n_ctx * sizeof *seq);
    logits = malloc((size_t)E * sizeof *logits);
    pred = malloc((size_t)K * sizeof *pred);
    if (!rec.experts || !rec.weights || !rec.gate_in || !rec.seen || !sums || !bl_hist || !seq || !logits || !pred)
        goto nomem;
    if (a.big_little_every > 0 && (!(big = malloc((size_t)a.n_ctx * V * sizeof *big)) ||
                                   !(little = malloc((size_t)a.n_ctx * V * sizeof *little))))
        goto nomem;

    if ((st = moe_profile_new(L, E, K, 0, a.logits, &p)) ||
        (st = moe_profile_set_meta(p, moe_arch_name(c->arch), a.model, a.dataset, MOE_VERSION))) {
        fprintf(stderr, "moe-prep profile: cannot make the profile: %s\n", moe_status_str(st));
        goto done;
    }
    memcpy(p->moe_layer_index, layer_of, (size_t)L * sizeof *layer_of);

    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = a.n_ctx;
    sp.n_batch = a.n_ctx; /* the whole sequence in one batch */
    sp.n_threads = a.n_threads;
    sp.on_route = on_route;
    sp.route_user = &rec;
    sp.on_expert = on_expert;
    sp.expert_user = &rec;
    struct moe_session_params sp_little = moe_session_default_params();
    sp_little.n_ctx = a.n_ctx;
    sp_little.n_batch = a.n_ctx;
    sp_little.n_threads = a.n_threads;
    sp_little.n_expert_used = little_k;
    const int tty = isatty(STDERR_FILENO);
    double t0 = now();
    int64_t n_done = 0, seq_start[2] = {0, 0};
    for (int si = seq0; si < seq1; si++) {
        int n = (int)(n_total - (int64_t)si * a.n_ctx < a.n_ctx ? n_total - (int64_t)si * a.n_ctx : a.n_ctx);
        memcpy(seq, ids + (size_t)si * a.n_ctx, (size_t)n * sizeof *seq);
        if (bos >= 0) seq[0] = bos;
        memset(rec.seen, 0, (size_t)L * a.n_ctx);
        /* the big-little sample is chosen by the global sequence index, so shards agree with one run */
        int bl = a.big_little_every > 0 && si % a.big_little_every == 0;
        if ((st = run_forward(model, &sp, seq, n, bl ? big : NULL)) ||
            (bl && (st = run_forward(model, &sp_little, seq, n, little)))) {
            fprintf(stderr, "moe-prep profile: forward pass of sequence %d failed: %s\n", si, moe_status_str(st));
            goto done;
        }
        for (size_t i = 0; i < (size_t)L * n; i++)
            if (!rec.seen[(i % L) * a.n_ctx + i / L]) rec.bad = 1;
        if (rec.bad) {
            fprintf(stderr, "moe-prep profile: the router events of sequence %d do not cover every token and "
                            "MoE layer\n", si);
            goto done;
        }
        if (bl) big_little_add(big, little, n, V, bl_hist);
        stacked_add(&rec, model, routers, n, sums, logits, pred);
        seq_start[1] = n;
        struct moe_trace t = {.n_layers = L, .n_experts = E, .k = K, .n_seq = 1, .seq_start = seq_start,
                              .experts = rec.experts, .weights = rec.weights};
        if ((st = moe_profile_add_trace(p, &t, rec.logits))) {
            fprintf(stderr, "moe-prep profile: the trace of sequence %d is invalid: %s\n", si, moe_status_str(st));
            goto done;
        }
        n_done += n;
        if (tty) {
            double el = now() - t0;
            int done_seq = si - seq0 + 1, all_seq = seq1 - seq0;
            fprintf(stderr, "\rmoe-prep profile: sequence %d/%d, %.1f tok/s, ETA %.0f s   ", done_seq, all_seq,
                    el > 0 ? n_done / el : 0.0, el / done_seq * (all_seq - done_seq));
            if (done_seq == all_seq) fputc('\n', stderr);
        }
    }
    double seconds = now() - t0;

    /* the sums only this run could gather, and its settings (merge checks them) */
    int64_t d1[1], d3[3] = {L, MAX_DIST, 4}, d2[2] = {2, MOE_PROFILE_BL_BINS};
    int64_t record[4] = {a.n_ctx, a.big_little_every, a.big_little_every ? little_k : 0, MAX_DIST};
    int64_t shard[3] = {seq0, seq1, n_seq_all};
    if ((d1[0] = 6, st = moe_profile_put_f64(p, MOE_PROFILE_SUM_PREFIX "pearson", 1, d1, rec.pearson)) ||
        (st = moe_profile_put_f64(p, MOE_PROFILE_SUM_PREFIX "stacked", 3, d3, sums)) ||
        (a.big_little_every &&
         (st = moe_profile_put_i64(p, MOE_PROFILE_SUM_PREFIX "big_little_maxprob", 2, d2, bl_hist))) ||
        (d1[0] = 4, st = moe_profile_put_i64(p, MOE_PROFILE_CONFIG_PREFIX "record", 1, d1, record)) ||
        (d1[0] = 3, st = moe_profile_put_i64(p, "shard", 1, d1, shard))) {
        fprintf(stderr, "moe-prep profile: cannot store the sums: %s\n", moe_status_str(st));
        goto done;
    }
    const int whole = seq0 == 0 && seq1 == n_seq_all;
    const char *tuning = !a.no_tuning && whole && !moe_is_dir(a.model) ? a.model : NULL;
    struct moe_profile_labels lb = {a.model, a.dataset, a.out, a.n_ctx, seconds};
    status = moe_profile_finish(p, &a.targets, a.out, a.csv_dir, tuning, a.json, &lb, "profile");
    fprintf(stderr, "moe-prep profile: %d sequences, %lld tokens in %.2f s (%.1f tok/s)%s; %s %s\n", seq1 - seq0,
            (long long)n_done, seconds, seconds > 0 ? n_done / seconds : 0.0,
            a.big_little_every ? " with the big-little pass" : "", status ? "nothing written to" : "wrote", a.out);
    if (!whole && !status)
        fprintf(stderr, "moe-prep profile: this is shard %d/%d (sequences %d..%d of %d); the bundle's tuning is "
                        "written when the shards are merged (moe-prep profile merge ... --bundle MODEL)\n",
                a.shard_i, a.shard_n, seq0, seq1 - 1, n_seq_all);
    goto done;
nomem:
    fprintf(stderr, "moe-prep profile: out of memory\n");
done:
    moe_profile_free(p);
    free(rec.experts);
    free(rec.weights);
    free(rec.gate_in);
    free(rec.logits);
    free(rec.seen);
    free(sums);
    free(bl_hist);
    free(seq);
    free(logits);
    free(big);
    free(little);
    free(pred);
    free(routers);
    free(layer_of);
    free(moe_index);
    free(ids);
    moe_model_free(model);
    return status;
}

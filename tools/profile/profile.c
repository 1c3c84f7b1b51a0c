/*
 * profile.c - `moe-prep profile`: record the routing of a model over a text
 * and derive what the runtime techniques need (../shared/papers/ALGORITHMS.md):
 * Twiddler's placement order and its hit rate, HOBBIT's thresholds, gate/output
 * correlation and stacked-gate prefetch accuracy, EdgeMoE's path dictionaries,
 * and expert reuse between consecutive tokens.
 *
 * The runtime is observed only through the session's callbacks (on_route,
 * on_expert); the statistics are routing-stats, the file is profile-h5.
 *
 * Derived arrays written under /derived (L = MoE layers, K = experts per token,
 * E = experts per layer; "all" = every recorded token, "held-out" = the last
 * --heldout share of the sequences, with counts taken on the others):
 *   placement_order      i32 [L*E]  (layer*E + expert), most used first, all
 *   placement_hit_rate   f64 [3 x 3] rows: 25 %, 50 %, 75 % of the pairs
 *                        resident; columns: fraction resident, hit rate on the
 *                        held-out sequences of the popularity order counted on
 *                        the others, random expectation (= that fraction)
 *   hobbit_thresholds    f64 [5]   T1, T2, high, low, skip shares (all)
 *   gate_output_pearson  f64 [1]   Pearson r of g and ||g E(x)|| over every
 *                        routed (layer, expert, token), g as the model applied it
 *   layer_similarity     f64 [L x 4] mean cosine of the gate inputs of MoE
 *                        layer l and model layer l+j, j = 1..4 (column j-1);
 *                        NaN where model layer l+j is dense or absent
 *   stacked_top1         f64 [L x 4] share of tokens whose predicted top-1 at
 *                        l+j (top-K of softmax(W_router[l+j] x_l)) is among
 *                        the experts actually chosen there; NaN as above
 *   stacked_recall       f64 [L x 4] mean |predicted top-K & actual| / K
 *   path_accuracy_order1 f64 [2 x 3] row 0: dictionary keyed on l-1, recall
 *                        with 1, 2, 3 experts preloaded; row 1: preloading
 *                        the 1..3 most popular; held-out (NaN without one)
 *   path_accuracy_order2 f64 [2 x 3] the same keyed on (l-2, l-1)
 *   path_key_coverage    f64 [2]   share of held-out (token, layer) keys seen, order 1, 2
 *   reuse                f64 [L x K] share of tokens whose expert at rank r
 *                        is used again by the next token (all)
 *   reuse_chance         f64 [1]   K / E
 *   split_sequences      i64 [2]   sequences counted, sequences held out
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "quantize/eval.h"
#include "moe-dataset.h"
#include "moe-prep.h"
#include "moe-quant.h"
#include "moe-session.h"
#include "profile-h5.h"
#include "routing-stats.h"
#include "tool-util.h"

#define MAX_DIST 4 /* stacked-gate distances j = 1..MAX_DIST */

static const double k_resident[3] = {0.25, 0.50, 0.75};

struct profile_args {
    const char *model, *dataset, *out;
    int n_ctx;
    long long max_tokens; /* 0 = all */
    double target_low, target_skip, heldout;
    int n_threads, json;
};

/* What the observers record. Per sequence: the trace rows and gate inputs;
 * over the run: the Pearson sums and the stacked-gate sums. */
struct recorder {
    int L, E, K, n_embd, n_layer;
    const int *moe_index;   /* [n_layer] model layer -> MoE layer, -1 if dense */
    const int32_t *layer_of; /* [L] MoE layer -> model layer */
    int n_ctx;
    int16_t *experts;       /* [n_ctx x L x K] current sequence */
    float *weights;         /* [n_ctx x L x K] */
    float *gate_in;         /* [L x n_ctx x n_embd] */
    unsigned char *seen;    /* [L x n_ctx] a route event covered this row */
    int bad;                /* an event did not fit (logged once) */
    double pn, sg, sy, sgg, syy, sgy; /* Pearson sums */
};

static void profile_usage(FILE *f) {
    fprintf(f,
            "usage: moe-prep profile MODEL --dataset SPEC -o PROFILE.h5 [options]\n"
            "\n"
            "Runs MODEL (checkpoint directory or .moeb bundle) over a text, records the\n"
            "routing of every token at every MoE layer and writes it with derived results\n"
            "(placement order and hit rate, HOBBIT thresholds, stacked-gate prefetch\n"
            "accuracy, path dictionaries, reuse) to an HDF5 profile; prints a summary.\n"
            "\n"
            "options:\n"
            "  --dataset SPEC      text to profile on (dataset card or file; see docs/cli.md)\n"
            "  -o, --out FILE      profile file to write (HDF5)\n"
            "  --ctx N             tokens per sequence, one forward pass each (default 256)\n"
            "  --max-tokens N      stop after N tokens (default: every whole sequence)\n"
            "  --target-low X      HOBBIT: share of loads at low precision (default 0.30)\n"
            "  --target-skip X     HOBBIT: share of loads skipped (default 0.03)\n"
            "  --heldout X         share of the last sequences held out for hit rates and\n"
            "                      path-dictionary accuracy (default 0.2; 0 = none)\n"
            "  -t, --threads N     CPU threads (default: all online CPUs)\n"
            "  --json              summary as JSON on stdout\n"
            "  -h, --help          this text\n"
            "\n"
            "examples:\n"
            "  moe-prep profile ./Mixtral-8x7B-v0.1 --dataset wikitext.txt -o mixtral.h5\n"
            "  moe-prep profile model.moeb --dataset c4.txt -o p.h5 --ctx 128 --max-tokens 20000 --json\n");
}

static int parse_num(const char *o, const char *v, double lo, double hi, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "moe-prep profile: %s wants a number in [%g, %g], not \"%s\"\n", o, lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

static int parse_ll(const char *o, const char *v, long long lo, long long hi, long long *out) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "moe-prep profile: %s wants an integer in [%lld, %lld], not \"%s\"\n", o, lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

/* parse_args: 0 ok, 1 help printed, 2 usage error (reported). */
static int parse_args(int argc, char **argv, struct profile_args *a) {
    memset(a, 0, sizeof *a);
    a->n_ctx = 256;
    a->target_low = 0.30;
    a->target_skip = 0.03;
    a->heldout = 0.2;
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
        } else if (!strcmp(o, "--ctx")) {
            if (!(v = NEXT()) || !parse_ll(o, v, 2, 1 << 20, &n)) return 2;
            a->n_ctx = (int)n;
        } else if (!strcmp(o, "--max-tokens")) {
            if (!(v = NEXT()) || !parse_ll(o, v, 1, (long long)1 << 40, &a->max_tokens)) return 2;
        } else if (!strcmp(o, "--target-low")) {
            if (!(v = NEXT()) || !parse_num(o, v, 0, 1, &a->target_low)) return 2;
        } else if (!strcmp(o, "--target-skip")) {
            if (!(v = NEXT()) || !parse_num(o, v, 0, 1, &a->target_skip)) return 2;
        } else if (!strcmp(o, "--heldout")) {
            if (!(v = NEXT()) || !parse_num(o, v, 0, 0.9, &a->heldout)) return 2;
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
    if (a->target_low + a->target_skip > 1) {
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
        r->pn += 1;
        r->sg += g;
        r->sy += m;
        r->sgg += g * g;
        r->syy += m * m;
        r->sgy += g * m;
    }
}

/* ---- stacked gating ---- */

struct stacked_sums {
    double sim[MAX_DIST], top1[MAX_DIST], recall[MAX_DIST];
    int64_t n[MAX_DIST];
};

/* top_k: indices of the k largest of x[n], largest first, lower index on ties. */
static void top_k(const float *x, int n, int k, int *out) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= out[q] == e;
            if (!taken && (best < 0 || x[e] > x[best])) best = e;
        }
        out[j] = best;
    }
}

/* stacked_add: after a sequence of n tokens, add for every MoE layer l and
 * distance j the cosine of the gate inputs (l, l+j) and whether the router of
 * l+j applied to x_l predicts the experts actually chosen at l+j. Top-K of the
 * logits is top-K of their softmax. routers: [L x E x n_embd] dequantized. */
static void stacked_add(const struct recorder *r, const float *routers, int n, struct stacked_sums *sums,
                        float *logits, int *pred) {
    const int L = r->L, E = r->E, K = r->K, D = r->n_embd;
    for (int li = 0; li < L; li++)
        for (int j = 1; j <= MAX_DIST; j++) {
            int lj = r->layer_of[li] + j;
            if (lj >= r->n_layer || r->moe_index[lj] < 0) continue;
            int mj = r->moe_index[lj];
            struct stacked_sums *s = &sums[li];
            for (int t = 0; t < n; t++) {
                const float *x = r->gate_in + ((size_t)li * r->n_ctx + t) * D;
                const float *y = r->gate_in + ((size_t)mj * r->n_ctx + t) * D;
                double xy = 0, xx = 0, yy = 0;
                for (int d = 0; d < D; d++) {
                    xy += (double)x[d] * y[d];
                    xx += (double)x[d] * x[d];
                    yy += (double)y[d] * y[d];
                }
                s->sim[j - 1] += xx > 0 && yy > 0 ? xy / sqrt(xx * yy) : 0;
                const float *w = routers + (size_t)mj * E * D;
                for (int e = 0; e < E; e++) {
                    double acc = 0;
                    for (int d = 0; d < D; d++) acc += (double)w[(size_t)e * D + d] * x[d];
                    logits[e] = (float)acc;
                }
                top_k(logits, E, K, pred);
                const int16_t *act = r->experts + ((size_t)t * L + mj) * K;
                int hit1 = 0, hits = 0;
                for (int a = 0; a < K; a++) {
                    hit1 |= act[a] == pred[0];
                    for (int b = 0; b < K; b++) hits += act[a] == pred[b];
                }
                s->top1[j - 1] += hit1;
                s->recall[j - 1] += (double)hits / K;
                s->n[j - 1]++;
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

/* ---- derived results ---- */

struct derived {
    int L, E, K;
    int n_train, n_held;
    double hit[3][3];
    struct moe_hobbit_split split;
    double pearson;
    double *sim, *top1, *recall; /* [L x MAX_DIST] */
    double path[2][2][3];        /* order-1: [dict|popular][m] */
    double coverage[2];
    double *reuse;               /* [L x K] */
    double reuse_chance;
};

static double div_or_nan(double a, int64_t n) { return n ? a / (double)n : NAN; }

/* derive: every derived result from the profile's trace (and the sums the
 * observers gathered), stored into p and kept in d for printing. */
static enum moe_status derive(struct moe_profile *p, const struct profile_args *a, const struct recorder *rec,
                              const struct stacked_sums *sums, struct derived *d) {
    const int L = p->n_layers, E = p->n_experts, K = p->k;
    enum moe_status st = MOE_ERR_NOMEM;
    struct moe_trace all, train, held;
    moe_profile_trace(p, &all);
    const int64_t n_tok = moe_trace_n_tokens(&all);
    int32_t *order = malloc((size_t)L * E * sizeof *order), *order_train = malloc((size_t)L * E * sizeof *order);
    int64_t *pop_train = calloc((size_t)L * E, sizeof *pop_train), *held_start = NULL;
    float *s = malloc((size_t)(n_tok ? n_tok : 1) * L * K * sizeof *s);
    struct moe_path_dict *pd = NULL;
    d->sim = malloc((size_t)L * MAX_DIST * sizeof(double));
    d->top1 = malloc((size_t)L * MAX_DIST * sizeof(double));
    d->recall = malloc((size_t)L * MAX_DIST * sizeof(double));
    d->reuse = malloc((size_t)L * K * sizeof(double));
    if (!order || !order_train || !pop_train || !s || !d->sim || !d->top1 || !d->recall || !d->reuse) goto done;
    d->L = L, d->E = E, d->K = K;

    /* the split: the last --heldout share of the sequences, if both parts are non-empty */
    int n_held = (int)floor(a->heldout * p->n_seq + 0.5);
    if (a->heldout > 0 && n_held < 1) n_held = 1;
    if (n_held >= p->n_seq) n_held = p->n_seq - 1;
    if (a->heldout <= 0 || p->n_seq < 2) n_held = 0;
    d->n_held = n_held, d->n_train = p->n_seq - n_held;
    train = all;
    train.n_seq = d->n_train;
    held = all;
    held.n_seq = n_held;
    if (!(held_start = malloc((size_t)(n_held + 1) * sizeof *held_start))) goto done;
    const int64_t off = all.seq_start[d->n_train];
    for (int i = 0; i <= n_held; i++) held_start[i] = all.seq_start[d->n_train + i] - off;
    held.seq_start = held_start;
    held.experts = all.experts + (size_t)off * L * K;
    held.weights = all.weights + (size_t)off * L * K;

    /* popularity and placement (Twiddler) */
    moe_placement_order(p->popularity, L, E, order);
    moe_popularity_count(&train, pop_train);
    moe_placement_order(pop_train, L, E, order_train);
    for (int i = 0; i < 3; i++) {
        int n_res = (int)floor(k_resident[i] * L * E + 0.5);
        d->hit[i][0] = k_resident[i];
        d->hit[i][1] = n_held ? moe_placement_hit_rate(&held, order_train, n_res) : NAN;
        d->hit[i][2] = (double)n_res / (L * E);
    }

    /* HOBBIT: thresholds, gate/output correlation, stacked gating */
    moe_hobbit_scores(&all, s);
    if ((st = moe_hobbit_thresholds(s, (size_t)n_tok * L * K, a->target_low, a->target_skip, &d->split))) goto done;
    st = MOE_ERR_NOMEM;
    double vg = rec->pn * rec->sgg - rec->sg * rec->sg, vy = rec->pn * rec->syy - rec->sy * rec->sy;
    d->pearson = vg > 0 && vy > 0 ? (rec->pn * rec->sgy - rec->sg * rec->sy) / sqrt(vg * vy) : NAN;
    for (int l = 0; l < L; l++)
        for (int j = 0; j < MAX_DIST; j++) {
            const struct stacked_sums *q = &sums[l];
            d->sim[l * MAX_DIST + j] = div_or_nan(q->sim[j], q->n[j]);
            d->top1[l * MAX_DIST + j] = div_or_nan(q->top1[j], q->n[j]);
            d->recall[l * MAX_DIST + j] = div_or_nan(q->recall[j], q->n[j]);
        }

    /* activation paths (EdgeMoE), counted on the training part, measured on the held-out one */
    for (int o = 1; o <= 2; o++) {
        struct moe_preload_accuracy acc = {0};
        int ok = n_held && L > o && E >= K && !moe_path_dict_new(L, E, K, o, &pd) && !moe_path_dict_add(pd, &train) &&
                 !moe_path_dict_accuracy(pd, pop_train, &held, &acc) && acc.n > 0;
        moe_path_dict_free(pd);
        pd = NULL;
        for (int m = 0; m < 3; m++) {
            d->path[o - 1][0][m] = ok && m < E ? acc.recall[m] : NAN;
            d->path[o - 1][1][m] = ok && m < E ? acc.popular[m] : NAN;
        }
        d->coverage[o - 1] = ok ? acc.key_coverage : NAN;
    }

    /* reuse */
    moe_reuse(&all, d->reuse, &d->reuse_chance);

    /* store */
    int64_t dims[2];
    double thr[5] = {d->split.t1, d->split.t2, d->split.high, d->split.low, d->split.skip};
    int64_t split_seq[2] = {d->n_train, d->n_held};
    dims[0] = (int64_t)L * E;
    if ((st = moe_profile_put_i32(p, "placement_order", 1, dims, order))) goto done;
    dims[0] = 3, dims[1] = 3;
    if ((st = moe_profile_put_f64(p, "placement_hit_rate", 2, dims, &d->hit[0][0]))) goto done;
    dims[0] = 5;
    if ((st = moe_profile_put_f64(p, "hobbit_thresholds", 1, dims, thr))) goto done;
    dims[0] = 1;
    if ((st = moe_profile_put_f64(p, "gate_output_pearson", 1, dims, &d->pearson))) goto done;
    if ((st = moe_profile_put_f64(p, "reuse_chance", 1, dims, &d->reuse_chance))) goto done;
    dims[0] = L, dims[1] = MAX_DIST;
    if ((st = moe_profile_put_f64(p, "layer_similarity", 2, dims, d->sim))) goto done;
    if ((st = moe_profile_put_f64(p, "stacked_top1", 2, dims, d->top1))) goto done;
    if ((st = moe_profile_put_f64(p, "stacked_recall", 2, dims, d->recall))) goto done;
    dims[0] = 2, dims[1] = 3;
    if ((st = moe_profile_put_f64(p, "path_accuracy_order1", 2, dims, &d->path[0][0][0]))) goto done;
    if ((st = moe_profile_put_f64(p, "path_accuracy_order2", 2, dims, &d->path[1][0][0]))) goto done;
    dims[0] = 2;
    if ((st = moe_profile_put_f64(p, "path_key_coverage", 1, dims, d->coverage))) goto done;
    if ((st = moe_profile_put_i64(p, "split_sequences", 1, dims, split_seq))) goto done;
    dims[0] = L, dims[1] = K;
    if ((st = moe_profile_put_f64(p, "reuse", 2, dims, d->reuse))) goto done;
    st = MOE_OK;
done:
    free(order);
    free(order_train);
    free(pop_train);
    free(held_start);
    free(s);
    return st;
}

static void derived_clear(struct derived *d) {
    free(d->sim);
    free(d->top1);
    free(d->recall);
    free(d->reuse);
}

/* ---- output ---- */

static void json_num(double x) {
    if (isfinite(x))
        printf("%.17g", x);
    else
        fputs("null", stdout);
}

static void json_array(const char *key, const double *x, int n) {
    printf(", \"%s\": [", key);
    for (int i = 0; i < n; i++) {
        if (i) putchar(',');
        json_num(x[i]);
    }
    putchar(']');
}

/* mean_col: mean over the layers of column j of a [L x w] array, skipping NaN. */
static double mean_col(const double *x, int L, int w, int j) {
    double s = 0;
    int n = 0;
    for (int l = 0; l < L; l++)
        if (isfinite(x[l * w + j])) s += x[l * w + j], n++;
    return n ? s / n : NAN;
}

static void print_json(const struct profile_args *a, const struct moe_profile *p, const struct derived *d,
                       double seconds) {
    const int L = d->L, K = d->K;
    printf("{\"model\": ");
    moe_tool_json_string(stdout, a->model);
    printf(", \"dataset\": ");
    moe_tool_json_string(stdout, a->dataset);
    printf(", \"out\": ");
    moe_tool_json_string(stdout, a->out);
    printf(", \"arch\": ");
    moe_tool_json_string(stdout, p->arch);
    printf(", \"moe_layers\": %d, \"experts\": %d, \"k\": %d, \"ctx\": %d, \"sequences\": %d, \"tokens\": %lld"
           ", \"train_sequences\": %d, \"heldout_sequences\": %d, \"seconds\": %.3f",
           L, d->E, K, a->n_ctx, p->n_seq, (long long)moe_profile_n_tokens(p), d->n_train, d->n_held, seconds);
    printf(", \"hobbit\": {\"t1\": ");
    json_num(d->split.t1);
    printf(", \"t2\": ");
    json_num(d->split.t2);
    printf(", \"high\": ");
    json_num(d->split.high);
    printf(", \"low\": ");
    json_num(d->split.low);
    printf(", \"skip\": ");
    json_num(d->split.skip);
    printf("}, \"gate_output_pearson\": ");
    json_num(d->pearson);
    printf(", \"placement\": [");
    for (int i = 0; i < 3; i++) {
        printf("%s{\"resident\": ", i ? ", " : "");
        json_num(d->hit[i][0]);
        printf(", \"hit_rate\": ");
        json_num(d->hit[i][1]);
        printf(", \"random\": ");
        json_num(d->hit[i][2]);
        putchar('}');
    }
    printf("], \"stacked\": [");
    for (int j = 0; j < MAX_DIST; j++) {
        printf("%s{\"distance\": %d, \"similarity\": ", j ? ", " : "", j + 1);
        json_num(mean_col(d->sim, L, MAX_DIST, j));
        printf(", \"top1\": ");
        json_num(mean_col(d->top1, L, MAX_DIST, j));
        printf(", \"recall\": ");
        json_num(mean_col(d->recall, L, MAX_DIST, j));
        putchar('}');
    }
    printf("], \"paths\": [");
    for (int o = 0; o < 2; o++) {
        printf("%s{\"order\": %d", o ? ", " : "", o + 1);
        json_array("dict", d->path[o][0], 3);
        json_array("popular", d->path[o][1], 3);
        printf(", \"key_coverage\": ");
        json_num(d->coverage[o]);
        putchar('}');
    }
    printf("]");
    json_array("reuse", d->reuse, L * K);
    printf(", \"reuse_chance\": ");
    json_num(d->reuse_chance);
    printf("}\n");
}

static void pct(double x) {
    if (isfinite(x))
        printf(" %6.1f%%", 100 * x);
    else
        printf(" %7s", "-");
}

static void print_summary(const struct profile_args *a, const struct moe_profile *p, const struct derived *d,
                          double seconds) {
    const int L = d->L, E = d->E, K = d->K;
    printf("profile of %s (%s) on %s -> %s\n", a->model, p->arch, a->dataset, a->out);
    printf("  %d MoE layers x %d experts, top-%d; %d sequences of <= %d tokens, %lld tokens (%d counted, %d "
           "held out); %.2f s\n\n",
           L, E, K, p->n_seq, a->n_ctx, (long long)moe_profile_n_tokens(p), d->n_train, d->n_held, seconds);
    printf("HOBBIT thresholds (targets low %.0f %%, skip %.0f %%): T1 %.4f  T2 %.4f -> high %.1f %%, low %.1f %%, "
           "skip %.1f %%\n",
           100 * a->target_low, 100 * a->target_skip, d->split.t1, d->split.t2, 100 * d->split.high,
           100 * d->split.low, 100 * d->split.skip);
    printf("gate weight vs ||g E(x)||: Pearson r = %.4f\n\n", d->pearson);

    printf("most used experts per layer (share of the layer's token-slots):\n");
    for (int l = 0; l < L; l++) {
        const int64_t *c = p->popularity + (size_t)l * E;
        int64_t tot = 0;
        for (int e = 0; e < E; e++) tot += c[e];
        printf("  layer %3d (model %3d):", l, p->moe_layer_index[l]);
        int top[3] = {-1, -1, -1}, m = E < 3 ? E : 3;
        for (int j = 0; j < m; j++) {
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < j; q++) taken |= top[q] == e;
                if (!taken && (top[j] < 0 || c[e] > c[top[j]])) top[j] = e;
            }
            printf("  e%-3d %5.1f %%", top[j], tot ? 100.0 * c[top[j]] / tot : 0.0);
        }
        putchar('\n');
    }

    printf("\nplacement by popularity, hit rate on the held-out sequences:\n  resident ");
    for (int i = 0; i < 3; i++) printf("   %4.0f %%", 100 * d->hit[i][0]);
    printf("\n  hit rate ");
    for (int i = 0; i < 3; i++) pct(d->hit[i][1]);
    printf("\n  random   ");
    for (int i = 0; i < 3; i++) pct(d->hit[i][2]);

    printf("\n\nstacked-gate prefetch (router of l+j on the gate input of l), mean over layers:\n"
           "  distance   cosine    top-1  top-%d recall\n", K);
    for (int j = 0; j < MAX_DIST; j++) {
        printf("  %8d  ", j + 1);
        double c = mean_col(d->sim, L, MAX_DIST, j);
        if (isfinite(c))
            printf("%7.4f", c);
        else
            printf("%7s", "-");
        pct(mean_col(d->top1, L, MAX_DIST, j));
        pct(mean_col(d->recall, L, MAX_DIST, j));
        putchar('\n');
    }

    printf("\nactivation-path dictionaries, recall of the preloaded experts (held out):\n"
           "  key          preload 1  preload 2  preload 3   keys seen\n");
    for (int o = 0; o < 2; o++) {
        printf("  %-12s", o ? "l-2, l-1" : "l-1");
        for (int m = 0; m < 3; m++) printf("   "), pct(d->path[o][0][m]);
        printf("   "), pct(d->coverage[o]);
        printf("\n  %-12s", "  popular");
        for (int m = 0; m < 3; m++) printf("   "), pct(d->path[o][1][m]);
        putchar('\n');
    }

    printf("\nreuse by the next token, per rank (chance %.1f %%):\n", 100 * d->reuse_chance);
    for (int l = 0; l < L; l++) {
        printf("  layer %3d:", l);
        for (int r = 0; r < K; r++) pct(d->reuse[l * K + r]);
        putchar('\n');
    }
}

/* ---- the command ---- */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* grow: make room for n more elements of size sz in *buf (capacity *cap). */
static int grow(void **buf, size_t *cap, size_t used, size_t n, size_t sz) {
    if (used + n <= *cap) return 1;
    size_t c = *cap ? *cap : 1024;
    while (c < used + n) c *= 2;
    void *b = realloc(*buf, c * sz);
    if (!b) return 0;
    *buf = b, *cap = c;
    return 1;
}

int moe_prep_profile(int argc, char **argv) {
    struct profile_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    int status = 1;
    struct moe_model *model = NULL;
    struct moe_profile *p = NULL;
    char *text = NULL;
    size_t len = 0, n_ids = 0;
    int32_t *ids = NULL, *seq = NULL, *layer_of = NULL;
    int *moe_index = NULL;
    float *routers = NULL, *logits = NULL;
    int *pred = NULL;
    struct recorder rec = {0};
    struct stacked_sums *sums = NULL;
    struct derived d = {0};
    int16_t *all_e = NULL;
    float *all_w = NULL;
    int64_t *seq_start = NULL;
    size_t cap_e = 0, cap_w = 0, cap_s = 0;

    struct moe_dataset_params dp = moe_dataset_default_params();
    if (moe_eval_text_load(a.dataset, &dp, &text, &len)) {
        fprintf(stderr, "moe-prep profile: cannot read the dataset %s\n", a.dataset);
        goto done;
    }
    struct moe_model_params mp = moe_model_default_params();
    if (moe_model_load(a.model, &mp, &model)) {
        fprintf(stderr, "moe-prep profile: cannot load the model from %s (see the message above)\n", a.model);
        goto done;
    }
    const struct moe_config *c = &model->cfg;
    if (a.n_ctx > c->max_pos) {
        fprintf(stderr, "moe-prep profile: --ctx %d exceeds the context of %s (max_position_embeddings %d)\n",
                a.n_ctx, a.model, c->max_pos);
        goto done;
    }
    if (moe_eval_tokenize(model, NULL, text, len, &ids, &n_ids)) {
        fprintf(stderr, "moe-prep profile: cannot tokenize %s (see the message above)\n", a.dataset);
        goto done;
    }
    const int32_t bos = moe_eval_bos(model->tok);
    int64_t n_total = (int64_t)(n_ids / (size_t)a.n_ctx) * a.n_ctx;
    if (a.max_tokens && a.max_tokens < n_total) n_total = a.max_tokens;
    if (n_total < 1) {
        fprintf(stderr, "moe-prep profile: %s tokenizes to %zu tokens, fewer than one sequence of --ctx %d; use a "
                        "longer text or a smaller --ctx\n", a.dataset, n_ids, a.n_ctx);
        goto done;
    }

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
    const int E = c->n_expert, K = c->n_expert_used, D = c->n_embd;
    if (!(routers = load_routers(model, layer_of, L))) goto done;

    rec = (struct recorder){.L = L, .E = E, .K = K, .n_embd = D, .n_layer = c->n_layer, .moe_index = moe_index,
                            .layer_of = layer_of, .n_ctx = a.n_ctx};
    rec.experts = malloc((size_t)a.n_ctx * L * K * sizeof *rec.experts);
    rec.weights = malloc((size_t)a.n_ctx * L * K * sizeof *rec.weights);
    rec.gate_in = malloc((size_t)L * a.n_ctx * D * sizeof *rec.gate_in);
    rec.seen = malloc((size_t)L * a.n_ctx);
    sums = calloc((size_t)L, sizeof *sums);
    seq = malloc((size_t)a.n_ctx * sizeof *seq);
    logits = malloc((size_t)E * sizeof *logits);
    pred = malloc((size_t)K * sizeof *pred);
    if (!rec.experts || !rec.weights || !rec.gate_in || !rec.seen || !sums || !seq || !logits || !pred) goto nomem;

    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = a.n_ctx;
    sp.n_batch = a.n_ctx; /* the whole sequence in one batch */
    sp.n_threads = a.n_threads;
    sp.on_route = on_route;
    sp.route_user = &rec;
    sp.on_expert = on_expert;
    sp.expert_user = &rec;
    const int n_seq = (int)((n_total + a.n_ctx - 1) / a.n_ctx);
    const int tty = isatty(STDERR_FILENO);
    double t0 = now();
    int64_t n_done = 0;
    if (!grow((void **)&seq_start, &cap_s, 0, 1, sizeof *seq_start)) goto nomem;
    seq_start[0] = 0;
    for (int si = 0; si < n_seq; si++) {
        int n = (int)(n_total - n_done < a.n_ctx ? n_total - n_done : a.n_ctx);
        memcpy(seq, ids + (size_t)si * a.n_ctx, (size_t)n * sizeof *seq);
        if (bos >= 0) seq[0] = bos;
        memset(rec.seen, 0, (size_t)L * a.n_ctx);
        struct moe_session *s = NULL;
        enum moe_status st = moe_session_create(model, &sp, &s);
        if (!st) st = moe_session_forward(s, seq, n, NULL, 0);
        moe_session_free(s);
        if (st) {
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
        stacked_add(&rec, routers, n, sums, logits, pred);
        size_t slots = (size_t)n * L * K, used = (size_t)n_done * L * K;
        if (!grow((void **)&all_e, &cap_e, used, slots, sizeof *all_e) ||
            !grow((void **)&all_w, &cap_w, used, slots, sizeof *all_w) ||
            !grow((void **)&seq_start, &cap_s, (size_t)si + 1, 1, sizeof *seq_start))
            goto nomem;
        memcpy(all_e + used, rec.experts, slots * sizeof *all_e);
        memcpy(all_w + used, rec.weights, slots * sizeof *all_w);
        n_done += n;
        seq_start[si + 1] = n_done;
        if (tty) {
            double el = now() - t0;
            fprintf(stderr, "\rmoe-prep profile: sequence %d/%d, %.1f tok/s, ETA %.0f s   ", si + 1, n_seq,
                    el > 0 ? n_done / el : 0.0, el / (si + 1) * (n_seq - si - 1));
            if (si + 1 == n_seq) fputc('\n', stderr);
        }
    }
    double seconds = now() - t0;

    struct moe_trace t = {.n_layers = L, .n_experts = E, .k = K, .n_seq = n_seq, .seq_start = seq_start,
                          .experts = all_e, .weights = all_w};
    enum moe_status st;
    if ((st = moe_profile_new(L, E, K, 0, MOE_PROFILE_LOGITS_NONE, &p)) ||
        (st = moe_profile_set_meta(p, moe_arch_name(c->arch), a.model, a.dataset, MOE_VERSION))) {
        fprintf(stderr, "moe-prep profile: cannot make the profile: %s\n", moe_status_str(st));
        goto done;
    }
    memcpy(p->moe_layer_index, layer_of, (size_t)L * sizeof *layer_of);
    if ((st = moe_profile_add_trace(p, &t, NULL))) {
        fprintf(stderr, "moe-prep profile: the recorded trace is invalid: %s\n", moe_status_str(st));
        goto done;
    }
    if ((st = derive(p, &a, &rec, sums, &d))) {
        fprintf(stderr, "moe-prep profile: cannot compute the derived results: %s\n", moe_status_str(st));
        goto done;
    }
    if ((st = moe_profile_write(p, a.out))) {
        fprintf(stderr, "moe-prep profile: cannot write %s: %s\n", a.out, moe_status_str(st));
        goto done;
    }
    if (a.json)
        print_json(&a, p, &d, seconds);
    else
        print_summary(&a, p, &d, seconds);
    fflush(stdout);
    fprintf(stderr, "moe-prep profile: %d sequences, %lld tokens in %.2f s (%.1f tok/s); wrote %s\n", n_seq,
            (long long)n_done, seconds, seconds > 0 ? n_done / seconds : 0.0, a.out);
    status = 0;
    goto done;
nomem:
    fprintf(stderr, "moe-prep profile: out of memory\n");
done:
    derived_clear(&d);
    moe_profile_free(p);
    free(all_e);
    free(all_w);
    free(seq_start);
    free(rec.experts);
    free(rec.weights);
    free(rec.gate_in);
    free(rec.seen);
    free(sums);
    free(seq);
    free(logits);
    free(pred);
    free(routers);
    free(layer_of);
    free(moe_index);
    free(ids);
    free(text);
    moe_model_free(model);
    return status;
}

/*
 * bitwidth.c - EdgeMoE's bit-width search (see bitwidth.h) and the
 * `moe-prep bitwidth` command.
 */
#include "bitwidth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eval.h"
#include "token-stream.h"
#include "moe-bundle.h"
#include "moe-dataset.h"
#include "moe-model.h"
#include "moe-prep.h"
#include "moe-tuning.h"
#include "profile-h5.h"
#include "tool-util.h"

/* ---- the search -------------------------------------------------------- */

void moe_bw_assign(const struct moe_bw_problem *p, int lower, int upper, int k, int16_t *assign) {
    for (int i = 0; i < p->n; i++) assign[p->order[i]] = (int16_t)(i < k ? lower : upper);
}

int64_t moe_bw_bytes(const struct moe_bw_problem *p, const int16_t *assign) {
    int64_t b = 0;
    for (int i = 0; i < p->n; i++) b += p->bytes[(size_t)i * p->n_prec + assign[i]];
    return b;
}

void moe_bw_result_clear(struct moe_bw_result *r) {
    free(r->assign);
    free(r->cand);
    free(r->uniform_loss);
    free(r->uniform_bytes);
    memset(r, 0, sizeof *r);
}

/* evaluate: the loss of (lower, upper, k), recorded as a candidate. */
static enum moe_status evaluate(const struct moe_bw_problem *p, struct moe_bw_result *r, int lower, int upper, int k,
                                double *loss) {
    moe_bw_assign(p, lower, upper, k, r->assign);
    enum moe_status st = p->eval(r->assign, loss, p->user);
    if (st) return st;
    struct moe_bw_candidate *c = realloc(r->cand, sizeof *c * (size_t)(r->n_cand + 1));
    if (!c) return MOE_ERR_NOMEM;
    r->cand = c;
    c[r->n_cand++] = (struct moe_bw_candidate){lower, upper, k, moe_bw_bytes(p, r->assign), *loss};
    return MOE_OK;
}

/* check: a well-formed problem (order a permutation, one budget). */
static int check(const struct moe_bw_problem *p) {
    if (p->n < 1 || p->n_prec < 1 || p->n_prec > 64 || !p->bytes || !p->order || !p->eval ||
        (p->max_loss >= 0) == (p->max_bytes > 0)) {
        MOE_LOGE("bitwidth: needs experts, 1..64 precisions, sizes, a ranking, a loss callback and exactly one "
                 "budget (loss or size)");
        return 0;
    }
    char *seen = calloc((size_t)p->n, 1);
    int ok = seen != NULL;
    for (int i = 0; ok && i < p->n; i++) {
        ok = p->order[i] >= 0 && p->order[i] < p->n && !seen[p->order[i]];
        if (ok) seen[p->order[i]] = 1;
    }
    free(seen);
    if (!ok) MOE_LOGE("bitwidth: the ranking is not a permutation of the %d experts", p->n);
    return ok;
}

/* by_size: precisions sorted by total bytes, smallest first (ties: index). */
static void by_size(const struct moe_bw_result *r, int n_prec, int *sorted) {
    for (int i = 0; i < n_prec; i++) sorted[i] = i;
    for (int i = 1; i < n_prec; i++)
        for (int j = i; j > 0 && r->uniform_bytes[sorted[j]] < r->uniform_bytes[sorted[j - 1]]; j--) {
            int t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
}

/* choose: make (lower, upper, k) the result. */
static void choose(const struct moe_bw_problem *p, struct moe_bw_result *r, int lower, int upper, int k, double loss) {
    moe_bw_assign(p, lower, upper, k, r->assign);
    r->lower = lower;
    r->upper = upper;
    r->k = k;
    r->bytes = moe_bw_bytes(p, r->assign);
    r->loss = loss;
}

static enum moe_status search_loss(const struct moe_bw_problem *p, struct moe_bw_result *r, const int *sorted) {
    enum moe_status st;
    const int P = p->n_prec;
    for (int j = P - 1; j >= 0; j--) /* largest first: a reference loss is usually measured against it */
        if ((st = evaluate(p, r, sorted[j], sorted[j], p->n, &r->uniform_loss[sorted[j]]))) return st;
    int up = -1; /* position in sorted of the smallest uniform within budget */
    for (int j = 0; j < P && up < 0; j++)
        if (r->uniform_loss[sorted[j]] <= p->max_loss) up = j;
    if (up < 0) {
        int best = sorted[0];
        for (int j = 1; j < P; j++)
            if (r->uniform_loss[sorted[j]] < r->uniform_loss[best]) best = sorted[j];
        choose(p, r, best, best, p->n, r->uniform_loss[best]);
        MOE_LOGE("bitwidth: no uniform assignment is within the loss budget %.4g; the smallest loss is %.4g", p->max_loss,
                 r->uniform_loss[best]);
        return MOE_ERR_RANGE;
    }
    const int upper = sorted[up];
    if (up == 0) { /* even the smallest precision is within budget */
        choose(p, r, upper, upper, p->n, r->uniform_loss[upper]);
        return MOE_OK;
    }
    const int lower = sorted[up - 1];
    int lo = 0, hi = p->n; /* loss(lo) within budget, loss(hi) over it */
    double lo_loss = r->uniform_loss[upper];
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        double loss;
        if ((st = evaluate(p, r, lower, upper, mid, &loss))) return st;
        if (loss <= p->max_loss) {
            lo = mid;
            lo_loss = loss;
        } else {
            hi = mid;
        }
    }
    choose(p, r, lower, upper, lo, lo_loss);
    return MOE_OK;
}

static enum moe_status search_size(const struct moe_bw_problem *p, struct moe_bw_result *r, const int *sorted) {
    enum moe_status st;
    const int P = p->n_prec;
    int fit = -1; /* position in sorted of the largest uniform that fits */
    for (int j = 0; j < P; j++)
        if (r->uniform_bytes[sorted[j]] <= p->max_bytes) fit = j;
    if (fit < 0) {
        MOE_LOGE("bitwidth: the smallest assignment (all %lld expert bytes at the smallest precision) exceeds the size "
                 "budget of %lld bytes", (long long)r->uniform_bytes[sorted[0]], (long long)p->max_bytes);
        choose(p, r, sorted[0], sorted[0], p->n, NAN);
        return MOE_ERR_RANGE;
    }
    const int lower = sorted[fit];
    if (fit == P - 1) { /* the largest fits: nothing to lower */
        if ((st = evaluate(p, r, lower, lower, p->n, &r->uniform_loss[lower]))) return st;
        choose(p, r, lower, lower, p->n, r->uniform_loss[lower]);
        return MOE_OK;
    }
    const int upper = sorted[fit + 1];
    int lo = 0, hi = p->n; /* bytes fall as k grows: the smallest k that fits */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        moe_bw_assign(p, lower, upper, mid, r->assign);
        if (moe_bw_bytes(p, r->assign) <= p->max_bytes) hi = mid;
        else lo = mid + 1;
    }
    if ((st = evaluate(p, r, upper, upper, p->n, &r->uniform_loss[upper])) ||
        (st = evaluate(p, r, lower, lower, p->n, &r->uniform_loss[lower])))
        return st;
    double loss = lo == p->n ? r->uniform_loss[lower] : 0;
    if (lo < p->n && (st = evaluate(p, r, lower, upper, lo, &loss))) return st;
    choose(p, r, lower, upper, lo, loss);
    return MOE_OK;
}

enum moe_status moe_bw_search(const struct moe_bw_problem *p, struct moe_bw_result *out) {
    memset(out, 0, sizeof *out);
    if (!check(p)) return MOE_ERR_INVALID;
    const int P = p->n_prec;
    out->n_prec = P;
    out->assign = malloc(sizeof *out->assign * (size_t)p->n);
    out->uniform_loss = malloc(sizeof *out->uniform_loss * (size_t)P);
    out->uniform_bytes = malloc(sizeof *out->uniform_bytes * (size_t)P);
    if (!out->assign || !out->uniform_loss || !out->uniform_bytes) return MOE_ERR_NOMEM;
    for (int q = 0; q < P; q++) {
        out->uniform_loss[q] = NAN;
        moe_bw_assign(p, q, q, p->n, out->assign);
        out->uniform_bytes[q] = moe_bw_bytes(p, out->assign);
    }
    int sorted[64];
    by_size(out, P, sorted);
    return p->max_loss >= 0 ? search_loss(p, out, sorted) : search_size(p, out, sorted);
}

/* ---- the command ------------------------------------------------------- */

struct bw_args {
    const char *model, *sens, *dataset, *heldout;
    double max_loss;      /* fraction; < 0 unset */
    long long max_bytes;  /* <= 0 unset */
    int n_ctx, max_chunks, n_threads, json, no_tuning;
};

static void bw_usage(FILE *f) {
    fprintf(f,
            "usage: moe-prep bitwidth MODEL.moeb --sensitivity SENS.h5 --dataset SPEC\n"
            "                         (--max-loss 2%% | --max-size SIZE) [options]\n"
            "\n"
            "EdgeMoE's bit-width search: each routed expert gets its own stored precision so\n"
            "the experts are as small as possible within the budget. Loss = relative\n"
            "perplexity increase on --dataset against all experts at the largest stored\n"
            "precision. Uniform assignments give the bounds; then the K least sensitive\n"
            "experts (ranking from `moe-prep sensitivity`) drop to the lower precision, K\n"
            "bisected until the loss is just within the budget. The map is written into the\n"
            "bundle's tuning section; moe-run and eval then load each expert at its own\n"
            "precision by default (--expert-precision still forces one for all).\n"
            "\n"
            "options:\n"
            "  --sensitivity FILE   output of moe-prep sensitivity for this bundle\n"
            "  --dataset SPEC       text the search evaluates on (file or dataset card)\n"
            "  --max-loss P         loss budget: 2%% or 0.02 (relative perplexity increase)\n"
            "  --max-size SIZE      instead: expert bytes budget (e.g. 12MiB, 3.5GB, 1048576);\n"
            "                       the smallest loss that fits\n"
            "  --heldout SPEC       also measure the chosen and the uniform assignments on a\n"
            "                       text the search did not see\n"
            "  --ctx N              tokens per evaluation chunk (default 256)\n"
            "  --max-chunks N       evaluate at most N chunks per text (default all)\n"
            "  --no-tuning          do not write the map into the bundle\n"
            "  --json               machine-readable result on stdout\n"
            "  -t, --threads N      CPU threads (default: all)\n"
            "\n"
            "example:\n"
            "  moe-prep bitwidth tiny.moeb --sensitivity sens.h5 --dataset wiki.txt --max-loss 2%% "
            "--heldout c4.txt\n");
}

static int bw_parse(int argc, char **argv, struct bw_args *a) {
    memset(a, 0, sizeof *a);
    a->max_loss = -1;
    a->n_ctx = 256;
    const char *cmd = "bitwidth";
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            bw_usage(stdout);
            return 1;
        }
        int takes = strcmp(o, "--json") && strcmp(o, "--no-tuning");
        if (o[0] == '-' && takes && !v) {
            fprintf(stderr, "moe-prep bitwidth: %s needs a value\n", o);
            return 2;
        }
        if (!strcmp(o, "--sensitivity")) a->sens = v;
        else if (!strcmp(o, "--dataset")) a->dataset = v;
        else if (!strcmp(o, "--heldout")) a->heldout = v;
        else if (!strcmp(o, "--json")) a->json = 1;
        else if (!strcmp(o, "--no-tuning")) a->no_tuning = 1;
        else if (!strcmp(o, "--max-loss")) {
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            size_t l = strlen(buf);
            int pct = l > 0 && buf[l - 1] == '%';
            if (pct) buf[l - 1] = 0;
            if (!moe_tool_parse_double(cmd, o, buf, 0, pct ? 1e4 : 100, &a->max_loss)) return 2;
            if (pct) a->max_loss /= 100;
        } else if (!strcmp(o, "--max-size")) {
            if (!moe_tool_parse_size(cmd, o, v, &a->max_bytes)) return 2;
        } else if (!strcmp(o, "--ctx")) {
            if (!moe_tool_parse_ll(cmd, o, v, 4, 1 << 20, &n)) return 2;
            a->n_ctx = (int)n;
        } else if (!strcmp(o, "--max-chunks")) {
            if (!moe_tool_parse_ll(cmd, o, v, 1, 1 << 30, &n)) return 2;
            a->max_chunks = (int)n;
        } else if (!strcmp(o, "-t") || !strcmp(o, "--threads")) {
            if (!moe_tool_parse_ll(cmd, o, v, 0, 4096, &n)) return 2;
            a->n_threads = (int)n;
        } else if (o[0] == '-') {
            fprintf(stderr, "moe-prep bitwidth: unknown option %s (see --help)\n", o);
            return 2;
        } else if (!a->model) {
            a->model = o;
            continue;
        } else {
            fprintf(stderr, "moe-prep bitwidth: unexpected argument %s\n", o);
            return 2;
        }
        if (takes) i++;
    }
    if (!a->model || !a->sens || !a->dataset) {
        fprintf(stderr, "moe-prep bitwidth: needs MODEL.moeb, --sensitivity and --dataset (see --help)\n");
        return 2;
    }
    if ((a->max_loss >= 0) == (a->max_bytes > 0)) {
        fprintf(stderr, "moe-prep bitwidth: give exactly one of --max-loss and --max-size\n");
        return 2;
    }
    return 0;
}

/* What the loss callback needs: the model rebinds per assignment. */
struct bw_eval {
    struct moe_model *m;
    const int *layer_of; /* [n_moe] MoE layer -> model layer */
    int n_moe, E, ref;   /* ref: the largest precision */
    const int32_t *ids;
    size_t n_ids;
    struct moe_eval_params ep;
    double ref_ppl;      /* perplexity with every expert at ref (0 = not yet) */
    int n_evals;
    double t0;
};

static enum moe_status bind_assign(struct bw_eval *b, const int16_t *assign) {
    enum moe_status st;
    for (int li = 0; li < b->n_moe; li++)
        for (int e = 0; e < b->E; e++)
            if ((st = moe_model_set_expert_precision(b->m, b->layer_of[li], e, assign[li * b->E + e]))) return st;
    return MOE_OK;
}

/* ppl_of: perplexity of the text with the experts as assigned. */
static enum moe_status ppl_of(struct bw_eval *b, const int16_t *assign, double *ppl) {
    enum moe_status st = bind_assign(b, assign);
    if (st) return st;
    struct moe_eval_result r;
    if ((st = moe_eval_run(b->m, NULL, b->ids, b->n_ids, &b->ep, &r))) return st;
    *ppl = r.ppl.val;
    moe_eval_result_clear(&r);
    return MOE_OK;
}

static enum moe_status loss_cb(const int16_t *assign, double *loss, void *user) {
    struct bw_eval *b = user;
    const int n = b->n_moe * b->E;
    int uniform_ref = 1;
    for (int i = 0; i < n; i++) uniform_ref &= assign[i] == b->ref;
    double ppl;
    enum moe_status st = ppl_of(b, assign, &ppl);
    if (st) return st;
    if (uniform_ref || b->ref_ppl <= 0) {
        if (!uniform_ref) { /* the search starts with the largest; be safe if it did not */
            int16_t *r = malloc(sizeof *r * (size_t)n);
            if (!r) return MOE_ERR_NOMEM;
            for (int i = 0; i < n; i++) r[i] = (int16_t)b->ref;
            st = ppl_of(b, r, &b->ref_ppl);
            free(r);
            if (st) return st;
        } else {
            b->ref_ppl = ppl;
        }
    }
    *loss = ppl / b->ref_ppl - 1;
    b->n_evals++;
    fprintf(stderr, "bitwidth: evaluation %d: PPL %.4f, loss %+.3f %% (%.0f s)\n", b->n_evals, ppl, 100 * *loss,
            (double)time(NULL) - b->t0);
    return MOE_OK;
}

/* load_ids: the token stream of a dataset spec, read only as far as `need`
 * tokens require (0 = all). */
static int load_ids(const struct moe_model *m, const char *spec, size_t need, int32_t **ids, size_t *n) {
    struct moe_dataset_params dp = moe_dataset_default_params();
    int ok = !moe_text_load_tokens(m, NULL, spec, &dp, need, ids, n);
    if (!ok) fprintf(stderr, "moe-prep bitwidth: cannot read or tokenize %s (see the message above)\n", spec);
    return ok;
}

/* read_ranking: the order (least sensitive first) from a sensitivity file,
 * checked against the bundle's shape. */
static int read_ranking(const char *path, const struct moe_model *m, int n_moe, int32_t **order) {
    struct moe_profile *p = NULL;
    int ok = 0;
    if (moe_profile_read(path, &p)) {
        fprintf(stderr, "moe-prep bitwidth: cannot read %s (see the message above)\n", path);
        return 0;
    }
    const int n = n_moe * m->cfg.n_expert;
    int nd;
    int64_t d[MOE_PROFILE_MAX_DIMS];
    const int32_t *o;
    if (p->n_layers != n_moe || p->n_experts != m->cfg.n_expert) {
        fprintf(stderr, "moe-prep bitwidth: %s is for %d MoE layers x %d experts; %s has %d x %d\n", path,
                p->n_layers, p->n_experts, m->path, n_moe, m->cfg.n_expert);
    } else if (moe_profile_get_i32(p, "sensitivity.order", &nd, d, &o) || nd != 1 || d[0] != n) {
        fprintf(stderr, "moe-prep bitwidth: %s holds no finished sensitivity ranking (sensitivity.order); run "
                        "moe-prep sensitivity to the end first\n", path);
    } else if ((*order = malloc(sizeof **order * (size_t)n))) {
        memcpy(*order, o, sizeof **order * (size_t)n);
        ok = 1;
    }
    moe_profile_free(p);
    return ok;
}

/* write_tuning: the map (over model layers, -1 for dense ones) and the
 * search's figures into the bundle's tuning, keeping the other keys. */
static int write_tuning(const struct bw_args *a, const struct moe_model *m, const struct moe_bw_result *r,
                        const int *moe_of, double heldout_loss) {
    const struct moe_config *c = &m->cfg;
    struct moe_bundle *b = NULL;
    struct moe_bundle_kv *kv = NULL;
    const size_t le = (size_t)c->n_layer * (size_t)c->n_expert;
    int64_t *map = malloc(sizeof *map * le);
    int ok = 0;
    if (!map || moe_bundle_open(a->model, &b) || moe_bundle_kv_new(&kv)) goto done;
    if (moe_bundle_kv_copy(kv, moe_bundle_tuning(b))) goto done;
    moe_bundle_free(b);
    b = NULL;
    for (int l = 0; l < c->n_layer; l++)
        for (int e = 0; e < c->n_expert; e++)
            map[(size_t)l * c->n_expert + e] = moe_of[l] < 0 ? -1 : r->assign[moe_of[l] * c->n_expert + e];
    if (moe_tuning_set_bitwidth(kv, map, le, r->loss, heldout_loss, a->max_loss, a->max_bytes, r->bytes,
                                a->dataset) ||
        moe_bundle_replace_tuning(a->model, kv))
        goto done;
    ok = 1;
done:
    if (!ok) fprintf(stderr, "moe-prep bitwidth: cannot write the bit-width map into %s's tuning\n", a->model);
    moe_bundle_free(b);
    moe_bundle_kv_free(kv);
    free(map);
    return ok;
}

/* The check on held-out text: loss of the chosen and of the two uniform
 * assignments around it. */
struct heldout {
    int done;
    double ref_ppl, chosen, upper, lower; /* losses */
};

static int run_heldout(struct bw_eval *b, const struct moe_bw_problem *p, const struct moe_bw_result *r,
                       const char *spec, struct heldout *h) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (!load_ids(b->m, spec, b->ep.max_chunks > 0 ? (size_t)b->ep.max_chunks * (size_t)b->ep.n_ctx : 0, &ids, &n))
        return 0;
    const int32_t *keep_ids = b->ids;
    size_t keep_n = b->n_ids;
    b->ids = ids;
    b->n_ids = n;
    int16_t *as = malloc(sizeof *as * (size_t)p->n);
    double ppl;
    int ok = as != NULL;
    if (ok) {
        moe_bw_assign(p, b->ref, b->ref, p->n, as);
        ok = !ppl_of(b, as, &h->ref_ppl);
    }
    if (ok) ok = !ppl_of(b, r->assign, &ppl);
    if (ok) h->chosen = ppl / h->ref_ppl - 1;
    if (ok) {
        moe_bw_assign(p, r->upper, r->upper, p->n, as);
        ok = !ppl_of(b, as, &ppl);
        h->upper = ppl / h->ref_ppl - 1;
    }
    if (ok) {
        moe_bw_assign(p, r->lower, r->lower, p->n, as);
        ok = !ppl_of(b, as, &ppl);
        h->lower = ppl / h->ref_ppl - 1;
    }
    b->ids = keep_ids;
    b->n_ids = keep_n;
    free(as);
    free(ids);
    h->done = ok;
    if (!ok) fprintf(stderr, "moe-prep bitwidth: the held-out evaluation of %s failed (see above)\n", spec);
    return ok;
}

static const char *pname(const struct moe_model *m, int p) { return moe_bundle_precision_at(m->bundle, (uint32_t)p)->name; }

static void print_result(const struct bw_args *a, const struct moe_model *m, const struct moe_bw_problem *p,
                         const struct moe_bw_result *r, int64_t dense, const struct heldout *h) {
    const double MiB = 1048576.0;
    int64_t up_bytes = r->uniform_bytes[r->upper], lo_bytes = r->uniform_bytes[r->lower];
    int count[64] = {0};
    for (int i = 0; i < p->n; i++) count[r->assign[i]]++;
    if (a->json) {
        printf("{\"model\": ");
        moe_tool_json_string(stdout, a->model);
        printf(", \"dataset\": ");
        moe_tool_json_string(stdout, a->dataset);
        printf(", \"budget\": {\"max_loss\": ");
        if (a->max_loss >= 0) printf("%.6g", a->max_loss); else printf("null");
        printf(", \"max_expert_bytes\": ");
        if (a->max_bytes > 0) printf("%lld", a->max_bytes); else printf("null");
        printf("}, \"dense_bytes\": %lld, \"uniform\": [", (long long)dense);
        for (int q = 0; q < r->n_prec; q++) {
            printf("%s{\"precision\": \"%s\", \"expert_bytes\": %lld, \"loss\": ", q ? ", " : "", pname(m, q),
                   (long long)r->uniform_bytes[q]);
            if (isfinite(r->uniform_loss[q])) printf("%.6g}", r->uniform_loss[q]); else printf("null}");
        }
        printf("], \"candidates\": [");
        for (int i = 0; i < r->n_cand; i++)
            printf("%s{\"lower\": \"%s\", \"upper\": \"%s\", \"k\": %d, \"expert_bytes\": %lld, \"loss\": %.6g}",
                   i ? ", " : "", pname(m, r->cand[i].lower), pname(m, r->cand[i].upper), r->cand[i].k,
                   (long long)r->cand[i].bytes, r->cand[i].loss);
        printf("], \"chosen\": {\"lower\": \"%s\", \"upper\": \"%s\", \"k\": %d, \"expert_bytes\": %lld, "
               "\"model_bytes\": %lld, \"loss\": ",
               pname(m, r->lower), pname(m, r->upper), r->k, (long long)r->bytes, (long long)(r->bytes + dense));
        if (isfinite(r->loss)) printf("%.6g", r->loss); else printf("null");
        printf(", \"heldout_loss\": ");
        if (h->done) printf("%.6g", h->chosen); else printf("null");
        printf(", \"map\": [");
        for (int i = 0; i < p->n; i++) printf("%s\"%s\"", i ? ", " : "", pname(m, r->assign[i]));
        printf("]}");
        if (h->done)
            printf(", \"heldout\": {\"dataset\": \"%s\", \"ref_ppl\": %.6f, \"chosen\": %.6g, \"uniform_upper\": %.6g, "
                   "\"uniform_lower\": %.6g}",
                   a->heldout, h->ref_ppl, h->chosen, h->upper, h->lower);
        printf("}\n");
        return;
    }
    printf("candidates tried (loss = relative perplexity increase on %s against all experts at %s):\n", a->dataset,
           pname(m, r->cand[0].upper));
    printf("  %-22s %5s %12s %12s %9s\n", "assignment", "K", "expert MiB", "model MiB", "loss");
    for (int i = 0; i < r->n_cand; i++) {
        const struct moe_bw_candidate *c = &r->cand[i];
        char what[64];
        if (c->lower == c->upper) snprintf(what, sizeof what, "uniform %s", pname(m, c->lower));
        else snprintf(what, sizeof what, "%s / %s", pname(m, c->lower), pname(m, c->upper));
        printf("  %-22s %5d %12.3f %12.3f %8.3f%%\n", what, c->k, c->bytes / MiB, (c->bytes + dense) / MiB,
               100 * c->loss);
    }
    printf("\nchosen: %d of %d experts at %s, the rest at %s:", r->k, p->n, pname(m, r->lower), pname(m, r->upper));
    for (int q = 0; q < r->n_prec; q++)
        if (count[q]) printf(" %d x %s", count[q], pname(m, q));
    printf("\n  experts %.3f MiB (model %.3f MiB), loss %.3f %%", r->bytes / MiB, (r->bytes + dense) / MiB,
           100 * r->loss);
    if (a->max_loss >= 0) printf(" (budget %.3f %%)", 100 * a->max_loss);
    else printf(" (budget %.3f MiB of experts)", a->max_bytes / MiB);
    printf("\n");
    if (r->lower != r->upper) {
        printf("  uniform %s: %.3f MiB, loss %.3f %%; uniform %s: %.3f MiB, loss %.3f %%\n", pname(m, r->upper),
               up_bytes / MiB, 100 * r->uniform_loss[r->upper], pname(m, r->lower), lo_bytes / MiB,
               100 * r->uniform_loss[r->lower]);
        if (a->max_loss >= 0) {
            if (r->k > 0)
                printf("  the mixed map is %.1f %% smaller than uniform %s, the smallest uniform within the budget\n",
                       100.0 * (double)(up_bytes - r->bytes) / (double)up_bytes, pname(m, r->upper));
            else
                printf("  no expert could drop to %s within the budget: the map is uniform %s (the loss of the first "
                       "candidate already exceeded it)\n", pname(m, r->lower), pname(m, r->upper));
        }
    }
    if (h->done) {
        printf("held-out (%s): loss %.3f %%", a->heldout, 100 * h->chosen);
        if (a->max_loss >= 0) printf(" (budget %.3f %%)", 100 * a->max_loss);
        printf("; uniform %s %.3f %%, uniform %s %.3f %%\n", pname(m, r->upper), 100 * h->upper, pname(m, r->lower),
               100 * h->lower);
    }
}

int moe_prep_bitwidth(int argc, char **argv) {
    struct bw_args a;
    int rc = bw_parse(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    moe_log_set_level(MOE_LOG_WARN);
    struct moe_model *m = NULL;
    int32_t *order = NULL, *ids = NULL;
    int *moe_of = NULL, *layer_of = NULL;
    int64_t *bytes = NULL;
    size_t n_ids = 0;
    struct moe_bw_result r = {0};
    struct heldout h = {0};
    int exit_code = 1;

    struct moe_model_params mp = moe_model_default_params();
    if (moe_model_load(a.model, &mp, &m)) {
        fprintf(stderr, "moe-prep bitwidth: cannot load %s (see the message above)\n", a.model);
        goto done;
    }
    const struct moe_config *c = &m->cfg;
    if (!m->bundle) {
        fprintf(stderr, "moe-prep bitwidth: %s is not a bundle; make one with moe-prep quantize\n", a.model);
        goto done;
    }
    int n_moe = 0;
    if (!(moe_of = malloc(sizeof *moe_of * (size_t)c->n_layer)) ||
        !(layer_of = malloc(sizeof *layer_of * (size_t)c->n_layer)))
        goto done;
    for (int l = 0; l < c->n_layer; l++) {
        moe_of[l] = c->layer_moe[l] ? n_moe : -1;
        if (c->layer_moe[l]) layer_of[n_moe++] = l;
    }
    const int n = n_moe * c->n_expert, P = m->n_expert_prec;
    if (n == 0 || P > 64) {
        fprintf(stderr, "moe-prep bitwidth: %s has no routed experts or more than 64 precisions\n", a.model);
        goto done;
    }
    if (!read_ranking(a.sens, m, n_moe, &order)) goto done;
    if (!(bytes = malloc(sizeof *bytes * (size_t)n * (size_t)P))) goto done;
    for (int i = 0; i < n; i++)
        for (int q = 0; q < P; q++) {
            struct moe_bundle_blob blob;
            if (moe_bundle_expert(m->bundle, (uint32_t)layer_of[i / c->n_expert], (uint32_t)(i % c->n_expert),
                                  (uint32_t)q, &blob))
                goto done;
            bytes[(size_t)i * P + q] = (int64_t)blob.raw_size;
        }
    int64_t dense = 0;
    for (size_t i = 0; i < moe_bundle_tensor_count(m->bundle); i++) dense += (int64_t)moe_bundle_tensor_at(m->bundle, i)->size;
    if (!load_ids(m, a.dataset, a.max_chunks > 0 ? (size_t)a.max_chunks * (size_t)a.n_ctx : 0, &ids, &n_ids)) goto done;
    struct bw_eval be = {m, layer_of, n_moe, c->n_expert, 0, ids, n_ids, moe_eval_default_params(), 0, 0,
                         (double)time(NULL)};
    be.ep.n_ctx = a.n_ctx;
    be.ep.max_chunks = a.max_chunks;
    be.ep.n_threads = a.n_threads;
    be.ep.bos = moe_text_bos(m->tok);
    for (int q = 1; q < P; q++) /* the reference: the largest precision */
        if (bytes[q] > bytes[be.ref]) be.ref = q;
    struct moe_bw_problem p = {n, P, bytes, order, a.max_loss, a.max_bytes, loss_cb, &be};
    enum moe_status st = moe_bw_search(&p, &r);
    if (st) {
        fprintf(stderr, "moe-prep bitwidth: the search failed (see the message above)%s\n",
                st == MOE_ERR_RANGE ? "; raise the budget" : "");
        goto done;
    }
    if (a.heldout && !run_heldout(&be, &p, &r, a.heldout, &h)) goto done;
    print_result(&a, m, &p, &r, dense, &h);
    if (!a.no_tuning) {
        if (!write_tuning(&a, m, &r, moe_of, h.done ? h.chosen : NAN)) goto done;
        fprintf(stderr, "bitwidth: wrote the map (%s) into %s's tuning\n", MOE_TUNING_BITWIDTH_MAP, a.model);
    }
    exit_code = 0;
done:
    moe_bw_result_clear(&r);
    moe_model_free(m);
    free(order);
    free(ids);
    free(moe_of);
    free(layer_of);
    free(bytes);
    return exit_code;
}

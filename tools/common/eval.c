/*
 * eval.c - perplexity of a model on a text and, against a reference model, the
 * KL divergence of their next-token distributions: the figures llama.cpp's
 * llama-perplexity prints (plain and --kl-divergence modes), computed the same
 * way so they can be compared. The library half of `moe-prep eval` (eval.h;
 * the command is eval-cmd.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "moe-base.h"
#include "moe-session.h"

/* Logit rows computed per forward call in the scored half of a chunk: bounds
 * memory (rows x n_vocab floats per model) whatever --ctx is. */
#define EVAL_ROWS 128

const double moe_eval_pct[MOE_EVAL_N_PCT] = {0, .001, .01, .05, .10, .5, .90, .95, .99, .999, 1};

struct moe_eval_params moe_eval_default_params(void) {
    struct moe_eval_params p = {0};
    p.n_ctx = 512;
    p.bos = -1;
    return p;
}

/* ---- scoring ---- */

/* One model's part of the run: its session and a buffer of EVAL_ROWS logit rows. */
struct eval_side {
    const struct moe_model *m;
    struct moe_session *s;
    float *logits; /* [EVAL_ROWS x n_vocab] */
};

/* Per-position results, one entry per scored position (4 doubles at most). */
struct eval_acc {
    double *nll, *ref_nll, *kld, *dp; /* [n_scored]; the last three only with a reference */
    int64_t n, n_same_top;
};

/* log_sum_exp: log(sum exp(l)) of one logit row in double, and its argmax
 * (lowest id on ties, as the greedy sampler). */
static double log_sum_exp(const float *l, int V, int *top) {
    float mx = l[0];
    int arg = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > mx) {
            mx = l[i];
            arg = i;
        }
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)l[i] - mx);
    *top = arg;
    return mx + log(s);
}

/* kl_row: KL(P_ref || P_model) = sum p_ref (log p_ref - log p_model), over the
 * whole vocabulary (llama-perplexity skips p_ref < e^-16, a rounding it needs
 * for its 16-bit stored log-probs; we have the exact rows). Bit-identical rows
 * give exactly 0. */
static double kl_row(const float *lr, double lse_r, const float *lm, double lse_m, int V) {
    double kl = 0;
    for (int i = 0; i < V; i++) {
        double a = (double)lr[i] - lse_r, b = (double)lm[i] - lse_m;
        kl += exp(a) * (a - b);
    }
    return kl;
}

/* score_row: one scored position: logits of model (and ref) and the true next token. */
static void score_row(struct eval_acc *acc, const float *lm, const float *lr, int V, int32_t next) {
    int top_m, top_r;
    double lse_m = log_sum_exp(lm, V, &top_m), nll = lse_m - (double)lm[next];
    int64_t k = acc->n++;
    acc->nll[k] = nll;
    if (!lr) return;
    double lse_r = log_sum_exp(lr, V, &top_r), ref_nll = lse_r - (double)lr[next];
    acc->ref_nll[k] = ref_nll;
    acc->kld[k] = kl_row(lr, lse_r, lm, lse_m, V);
    acc->dp[k] = exp(-nll) - exp(-ref_nll);
    acc->n_same_top += top_m == top_r;
}

/* eval_chunk: one chunk of n_ctx tokens through fresh sessions of the model and
 * the reference. The first half is context only (no LM head); logits of the
 * scored half come EVAL_ROWS rows at a time, the model's and the reference's
 * for the same positions side by side. The last token is only a target. */
static enum moe_status eval_chunk(struct eval_side *side, int n_side, const int32_t *chunk, int n_ctx,
                                  struct eval_acc *acc) {
    const int first = n_ctx / 2, V = side[0].m->cfg.n_vocab;
    enum moe_status st;
    for (int k = 0; k < n_side; k++) {
        moe_session_reset(side[k].s);
        if ((st = moe_session_forward(side[k].s, chunk, first, NULL, 0))) return st;
    }
    for (int p = first; p < n_ctx - 1; p += EVAL_ROWS) {
        int n = n_ctx - 1 - p < EVAL_ROWS ? n_ctx - 1 - p : EVAL_ROWS;
        for (int k = 0; k < n_side; k++)
            if ((st = moe_session_forward(side[k].s, chunk + p, n, side[k].logits, 1))) return st;
        for (int r = 0; r < n; r++)
            score_row(acc, side[0].logits + (size_t)r * V,
                      n_side > 1 ? side[1].logits + (size_t)r * V : NULL, V, chunk[p + r + 1]);
    }
    return MOE_OK;
}

/* count_route: router observer adding each token's selected experts to the load table. */
static void count_route(const struct moe_route_event *ev, void *user) {
    struct moe_eval_result *r = user;
    int64_t *row = r->expert_load + (size_t)ev->layer * (size_t)r->n_expert;
    for (int i = 0; i < ev->n_tokens * ev->k; i++) row[ev->experts[i]]++;
}

/* unigram_ppl: add-one smoothed unigram model counted over the stream, scored
 * on the positions the models score (targets ctx/2+1 .. ctx-1 of each chunk). */
static double unigram_ppl(const int32_t *ids, size_t n_ids, int n_chunks, int n_ctx, int V) {
    int64_t *count = calloc((size_t)V, sizeof *count);
    if (!count) return NAN;
    for (size_t i = 0; i < n_ids; i++) count[ids[i]]++;
    double nll = 0, denom = (double)n_ids + V;
    int64_t n = 0;
    for (int c = 0; c < n_chunks; c++)
        for (int p = n_ctx / 2; p < n_ctx - 1; p++, n++)
            nll -= log((double)(count[ids[(size_t)c * n_ctx + p + 1]] + 1) / denom);
    free(count);
    return n ? exp(nll / (double)n) : NAN;
}

void moe_eval_result_clear(struct moe_eval_result *r) {
    free(r->expert_load);
    r->expert_load = NULL;
}

double moe_eval_load_entropy(const struct moe_eval_result *r, int layer, int *top) {
    const int64_t *row = r->expert_load + (size_t)layer * (size_t)r->n_expert;
    int64_t total = 0;
    *top = 0;
    for (int e = 0; e < r->n_expert; e++) {
        total += row[e];
        if (row[e] > row[*top]) *top = e;
    }
    if (total == 0 || r->n_expert < 2) return -1;
    double h = 0;
    for (int e = 0; e < r->n_expert; e++)
        if (row[e]) h -= (double)row[e] / (double)total * log((double)row[e] / (double)total);
    return h / log((double)r->n_expert);
}

/* ---- statistics, as llama-perplexity computes them ---- */

/* mean_err: mean and its standard error sqrt(var / (n - 1)), var the
 * population variance (two-pass). */
static struct moe_eval_figure mean_err(const double *x, int64_t n) {
    struct moe_eval_figure f = {0, 0};
    if (n < 1) return f;
    for (int64_t i = 0; i < n; i++) f.val += x[i];
    f.val /= (double)n;
    if (n < 2) return f;
    double v = 0;
    for (int64_t i = 0; i < n; i++) v += (x[i] - f.val) * (x[i] - f.val);
    f.err = sqrt(v / (double)n / (double)(n - 1));
    return f;
}

/* cov_of_means: covariance of the two sample means, cov(x, y) / (n - 1). */
static double cov_of_means(const double *x, double mx, const double *y, double my, int64_t n) {
    if (n < 2) return 0;
    double c = 0;
    for (int64_t i = 0; i < n; i++) c += (x[i] - mx) * (y[i] - my);
    return c / (double)n / (double)(n - 1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* percentiles: sort a copy of x into tmp; llama-perplexity's definition
 * (linear interpolation between order statistics; 0.5 = the median). */
static void percentiles(const double *x, int64_t n, double *tmp, double out[MOE_EVAL_N_PCT]) {
    memcpy(tmp, x, sizeof(double) * (size_t)n);
    qsort(tmp, (size_t)n, sizeof(double), cmp_double);
    for (int i = 0; i < MOE_EVAL_N_PCT; i++) {
        double p = moe_eval_pct[i] * (double)(n - 1);
        int64_t ip = (int64_t)p;
        if (ip >= n - 1) {
            out[i] = tmp[n - 1];
            continue;
        }
        p -= (double)ip;
        out[i] = (1 - p) * tmp[ip] + p * tmp[ip + 1];
    }
}

/* finish_ref: the reference-model figures of r from the per-position values. */
static enum moe_status finish_ref(const struct eval_acc *a, struct moe_eval_result *r) {
    const int64_t n = a->n;
    double *tmp = malloc(sizeof(double) * (size_t)n);
    if (!tmp) return MOE_ERR_NOMEM;
    r->ref_nll = mean_err(a->ref_nll, n);
    r->ref_ppl = (struct moe_eval_figure){exp(r->ref_nll.val), exp(r->ref_nll.val) * r->ref_nll.err};
    double cov = cov_of_means(a->nll, r->nll.val, a->ref_nll, r->ref_nll.val, n);
    double den = r->nll.err * r->ref_nll.err;
    r->nll_cor = den > 0 ? cov / den : NAN;
    /* llama-perplexity's errors sqrt(se_a^2 + se_b^2 - 2 cov) are the standard
     * errors of per-position differences; taking those directly avoids the
     * cancellation (a model against itself gives exactly 0). */
    for (int64_t i = 0; i < n; i++) tmp[i] = a->nll[i] - a->ref_nll[i];
    double ln_err = mean_err(tmp, n).err;
    r->ln_ppl_ratio = (struct moe_eval_figure){r->nll.val - r->ref_nll.val, ln_err};
    double ratio = exp(r->ln_ppl_ratio.val);
    r->ppl_ratio = (struct moe_eval_figure){ratio, ratio * ln_err};
    for (int64_t i = 0; i < n; i++) tmp[i] = r->ppl.val * a->nll[i] - r->ref_ppl.val * a->ref_nll[i];
    r->ppl_diff = (struct moe_eval_figure){r->ppl.val - r->ref_ppl.val, mean_err(tmp, n).err};
    r->kld = mean_err(a->kld, n);
    percentiles(a->kld, n, tmp, r->kld_pct);
    r->dp = mean_err(a->dp, n);
    percentiles(a->dp, n, tmp, r->dp_pct);
    for (int64_t i = 0; i < n; i++) tmp[i] = a->dp[i] * a->dp[i];
    struct moe_eval_figure ms = mean_err(tmp, n);
    double rms = sqrt(ms.val);
    r->dp_rms = (struct moe_eval_figure){rms, rms > 0 ? 0.5 / rms * ms.err : 0};
    double same = (double)a->n_same_top / (double)n;
    r->same_top = (struct moe_eval_figure){same, n > 1 ? sqrt(same * (1 - same) / (double)(n - 1)) : 0};
    free(tmp);
    return MOE_OK;
}

/* check_run: the run's preconditions, each failure logged once. */
static enum moe_status check_run(const struct moe_model *model, const struct moe_model *ref,
                                 const int32_t *ids, size_t n_ids, const struct moe_eval_params *p) {
    if (p->n_ctx < 4 || p->max_chunks < 0 || p->bos >= model->cfg.n_vocab) {
        MOE_LOGE("bad parameters: chunk length %d (at least 4), max_chunks %d, BOS id %d", p->n_ctx,
                 p->max_chunks, p->bos);
        return MOE_ERR_INVALID;
    }
    if (p->little_k > 0 && p->n_batch > 1) {
        MOE_LOGE("big-little decoding decides one token at a time: a batch of %d is not possible", p->n_batch);
        return MOE_ERR_INVALID;
    }
    for (int k = 0; k < 1 + (ref != NULL); k++) {
        const struct moe_model *m = k ? ref : model;
        if (p->n_ctx > m->cfg.max_pos) {
            MOE_LOGE("a context of %d exceeds the %d positions of %s (max_position_embeddings)",
                     p->n_ctx, m->cfg.max_pos, m->path);
            return MOE_ERR_RANGE;
        }
    }
    if (ref && ref->cfg.n_vocab != model->cfg.n_vocab) {
        MOE_LOGE("vocabulary sizes differ: %d (%s) vs %d (reference %s)", model->cfg.n_vocab,
                 model->path, ref->cfg.n_vocab, ref->path);
        return MOE_ERR_INVALID;
    }
    for (size_t i = 0; i < n_ids; i++) /* targets are never fed, so the session cannot check them */
        if (ids[i] < 0 || ids[i] >= model->cfg.n_vocab) {
            MOE_LOGE("token %zu has id %d, outside the vocabulary [0, %d) of %s", i, ids[i],
                     model->cfg.n_vocab, model->path);
            return MOE_ERR_INVALID;
        }
    if (n_ids < 2 * (size_t)p->n_ctx) {
        MOE_LOGE("the text has %zu tokens; a context of %d needs at least %zu (2 x ctx)", n_ids,
                 p->n_ctx, 2 * (size_t)p->n_ctx);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* moe_eval_run: see eval.h. */
enum moe_status moe_eval_run(const struct moe_model *model, const struct moe_model *ref,
                             const int32_t *ids, size_t n_ids, const struct moe_eval_params *params,
                             struct moe_eval_result *out) {
    struct moe_eval_params p = params ? *params : moe_eval_default_params();
    memset(out, 0, sizeof *out);
    enum moe_status st = check_run(model, ref, ids, n_ids, &p);
    if (st) return st;
    const int n_ctx = p.n_ctx, n_side = ref ? 2 : 1;
    int n_chunks = (int)(n_ids / (size_t)n_ctx);
    if (p.max_chunks > 0 && p.max_chunks < n_chunks) n_chunks = p.max_chunks;
    const int64_t n_scored = (int64_t)n_chunks * (n_ctx - 1 - n_ctx / 2);
    const size_t V = (size_t)model->cfg.n_vocab;

    struct eval_side side[2] = {{model, NULL, NULL}, {ref, NULL, NULL}};
    struct eval_acc acc = {0};
    int32_t *chunk = malloc(sizeof(int32_t) * (size_t)n_ctx);
    acc.nll = malloc(sizeof(double) * (size_t)n_scored);
    if (ref) {
        acc.ref_nll = malloc(sizeof(double) * (size_t)n_scored);
        acc.kld = malloc(sizeof(double) * (size_t)n_scored);
        acc.dp = malloc(sizeof(double) * (size_t)n_scored);
    }
    st = MOE_ERR_NOMEM;
    if (!chunk || !acc.nll || (ref && (!acc.ref_nll || !acc.kld || !acc.dp))) goto done;
    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_threads = p.n_threads;
    sp.device = p.device;
    sp.device_options = p.device_options;
    if (p.routing) {
        out->n_layer = model->cfg.n_layer;
        out->n_expert = model->cfg.n_expert;
        if (!(out->expert_load = calloc((size_t)out->n_layer * (size_t)out->n_expert, sizeof(int64_t)))) goto done;
    }
    for (int k = 0; k < n_side; k++) {
        struct moe_session_params spk = sp;
        if (k == 0 && p.routing) {
            spk.on_route = count_route;
            spk.route_user = out;
        }
        if (k == 0 && moe_store_params_active(p.store)) spk.store = p.store;
        if (k == 0 && p.n_batch > 0) spk.n_batch = p.n_batch;
        if (k == 0 && p.little_k > 0) spk.little_k = p.little_k, spk.gamma = p.gamma, spk.n_batch = 1;
        if ((st = moe_session_create(side[k].m, &spk, &side[k].s))) goto done;
        st = MOE_ERR_NOMEM;
        if (!(side[k].logits = malloc(sizeof(float) * V * EVAL_ROWS))) goto done;
    }
    out->bos = p.bos;
    double t0 = moe_now_s();
    for (int c = 0; c < n_chunks; c++) {
        memcpy(chunk, ids + (size_t)c * (size_t)n_ctx, sizeof(int32_t) * (size_t)n_ctx);
        if (p.bos >= 0) chunk[0] = p.bos; /* replaces a token, as llama-perplexity does */
        int64_t first = acc.n;
        if ((st = eval_chunk(side, n_side, chunk, n_ctx, &acc))) goto done;
        for (int64_t i = first; i < acc.n; i++) /* NaN logits must not become "PPL nan" */
            if (!isfinite(acc.nll[i]) || (ref && !isfinite(acc.ref_nll[i]))) {
                MOE_LOGE("chunk %d: %s produced non-finite logits (NaN or infinity): its weights or config are "
                         "damaged", c, !isfinite(acc.nll[i]) ? "the model" : "the reference");
                st = MOE_ERR_RANGE;
                goto done;
            }
        if (p.on_chunk) p.on_chunk(c + 1, n_chunks, moe_now_s() - t0, p.user);
    }
    out->seconds = moe_now_s() - t0;
    MOE_ASSERT(acc.n == n_scored);
    out->n_ctx = n_ctx;
    out->n_tokens = (int64_t)n_ids;
    out->n_chunks = n_chunks;
    out->n_scored = n_scored;
    out->nll = mean_err(acc.nll, n_scored);
    out->ppl = (struct moe_eval_figure){exp(out->nll.val), exp(out->nll.val) * out->nll.err};
    out->has_ref = ref != NULL;
    if (p.unigram) {
        out->has_unigram = 1;
        out->unigram_ppl = unigram_ppl(ids, n_ids, n_chunks, n_ctx, (int)V);
    }
    if (moe_session_store(side[0].s)) {
        out->has_store = 1;
        moe_store_get_stats(moe_session_store(side[0].s), &out->store);
    }
    if (p.little_k > 0) {
        out->has_big_little = 1;
        moe_session_big_little_stats(side[0].s, &out->big_little);
    }
    st = ref ? finish_ref(&acc, out) : MOE_OK;
done:
    if (st) moe_eval_result_clear(out);
    for (int k = 0; k < n_side; k++) {
        moe_session_free(side[k].s);
        free(side[k].logits);
    }
    free(chunk);
    free(acc.nll);
    free(acc.ref_nll);
    free(acc.kld);
    free(acc.dp);
    return st;
}

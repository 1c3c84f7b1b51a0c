/*
 * eval.c - `moe-prep eval`: perplexity of a model on a text and, against a
 * reference model, the KL divergence of their next-token distributions: the
 * figures llama.cpp's llama-perplexity prints (plain and --kl-divergence
 * modes), computed the same way so they can be compared.
 *
 * The first half of the file is the measurement (declared in eval.h, usable by
 * other tools); the second half is the command: argument parsing and printing.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "eval.h"
#include "token-stream.h"
#include "moe-dataset.h"
#include "tool-util.h"
#include "moe-mmap.h"
#include "moe-prep.h"
#include "moe-session.h"
#include "moe-tokenizer.h"
#include "moe-tuning.h"

/* Logit rows computed per forward call in the scored half of a chunk: bounds
 * memory (rows x n_vocab floats per model) whatever --ctx is. */
#define EVAL_ROWS 128

/* Largest dataset file read (the text is held in memory with its ids). */

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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
    double t0 = now_s();
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
        if (p.on_chunk) p.on_chunk(c + 1, n_chunks, now_s() - t0, p.user);
    }
    out->seconds = now_s() - t0;
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

/* ==== the command ==== */

static void eval_usage(FILE *f) {
    fprintf(f,
"usage: moe-prep eval MODEL --dataset SPEC [--ref REF] [options]\n"
"\n"
"Perplexity of MODEL on a text and, with --ref, the KL divergence of its\n"
"next-token distributions from REF's: the figures of llama.cpp's\n"
"llama-perplexity (and its --kl-divergence mode), measured the same way.\n"
"MODEL and REF are Hugging Face checkpoint directories or .moeb bundles.\n"
"\n"
"The text is tokenized once (no special tokens, after a BOS if the tokenizer\n"
"adds one) and cut into consecutive chunks of --ctx tokens; the BOS also\n"
"replaces the first token of each chunk. Only the second half of each chunk\n"
"is scored (positions ctx/2 .. ctx-2 predicting the next token), so the text\n"
"must hold at least 2 * ctx tokens.\n"
"\n"
"  --dataset SPEC            the text to score (required): a dataset card or a\n"
"                            file with a format and fields (see below)\n"
"  --skip-bad                skip malformed records (counted) instead of failing\n"
"  --ref REF                 reference model (same vocabulary and tokenizer):\n"
"                            adds KL(P_ref || P_model), top-1 agreement, delta-p\n"
"                            and PPL ratio / difference\n"
"  --ctx N                   tokens per chunk (default 512, at most the models'\n"
"                            max_position_embeddings)\n"
"  --max-chunks N            score at most N chunks (default: all)\n"
"  --expert-precision P      bundles: stored expert precision of MODEL to use\n"
"                            (e.g. q4_k); REF always loads with its defaults\n"
"  --unigram                 also the perplexity of an add-one unigram model\n"
"                            counted on the same text (a baseline) and the ratio\n"
"  --routing                 also the model's expert load per MoE layer: its\n"
"                            entropy / log(experts) and the most-used expert\n"
"  -t, --threads N           CPU threads per model (default: all)\n"
"  -b, --batch N             MODEL's tokens per forward pass (default 256); 1 runs\n"
"                            each position as a decode step, so the engine picks\n"
"                            precisions per token as when generating\n"
"  --little-k K2, --gamma G  MODEL decodes big-little (MoBiLE, as moe-run): every\n"
"                            position runs with K2 experts and again with all K when\n"
"                            its top probability is below G; the distribution scored\n"
"                            is the one big-little uses (implies --batch 1; defaults\n"
"                            as moe-run: K2 = K/2, G = the bundle's mobile.gamma).\n"
"                            --gamma 0 scores the K2 model alone\n"
"  --json                    one JSON object on stdout instead of the table\n"
"  -h, --help                this help\n"
"\n"
"Progress goes to stderr when it is a terminal; a summary line always does.\n"
"\n"
"MODEL through the engine: with --expert-mem or --cache-experts, MODEL runs\n"
"as moe-run would run it with the same options (a bounded expert cache,\n"
"HOBBIT dynamic precision and skipping, the cache policy, prefetching); REF\n"
"always runs with every expert resident, so `eval B.moeb --ref B.moeb\n"
"--expert-mem 25%% --dynamic on` measures what the engine's choices cost.\n"
"The store's counts (hit ratios, low-precision loads, skips) are reported.\n"
"\n"
"%s"
"\n"
"%s"
"\n"
"examples:\n"
"  moe-prep eval ./Mixtral-8x7B-v0.1 --dataset wiki.test.raw\n"
"  moe-prep eval mixtral-q4.moeb --ref ./Mixtral-8x7B-v0.1 --dataset wiki.test.raw \\\n"
"      --ctx 512 --max-chunks 40 --json\n"
"  moe-prep eval tests/fixtures/models/mixtral-bf16 --ref tests/fixtures/models/mixtral-f32 \\\n"
"      --dataset notes.txt --ctx 32\n"
"  moe-prep eval model.moeb --dataset jsonl:gsm8k/test.jsonl:question,answer --ctx 256\n"
"  moe-prep eval model.moeb --dataset wikitext2-test --unigram --routing\n"
"  moe-prep eval model.moeb --ref model.moeb --dataset wikitext2-test --expert-mem 25%% \\\n"
"      --dynamic on --high q8_0 --low q2_k --batch 1\n"
"  moe-prep eval model.moeb --ref model.moeb --dataset c4.txt --little-k 1 --gamma 0.3\n",
            moe_store_options_help(), moe_dataset_spec_help());
}

struct eval_args {
    const char *model, *ref, *dataset, *precision;
    int n_ctx, max_chunks, n_threads, json, unigram, routing, skip_bad, n_batch;
    int little_k;  /* -1: not given */
    double gamma;  /* NaN: not given */
    struct moe_store_params store; /* engine options for MODEL (moe-run's) */
};

/* parse_int: strict decimal integer in [lo, hi]. */
static int parse_int(const char *opt, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "moe-prep eval: %s expects an integer in [%ld, %ld], got \"%s\"\n", opt, lo, hi, s);
        return 0;
    }
    *out = (int)v;
    return 1;
}

/* parse_args: 0 ok, 1 help printed, 2 usage error (reported). */
static int parse_args(int argc, char **argv, struct eval_args *a) {
    memset(a, 0, sizeof *a);
    a->n_ctx = 512;
    a->store = moe_store_default_params();
    a->little_k = -1, a->gamma = NAN;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
#define NEXT() (i + 1 < argc ? argv[++i] : (fprintf(stderr, "moe-prep eval: %s needs a value\n", o), (char *)NULL))
        const int engine = moe_store_option_takes_value(o);
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            eval_usage(stdout);
            return 1;
        } else if (!strcmp(o, "--dataset")) {
            if (!(a->dataset = NEXT())) return 2;
        } else if (!strcmp(o, "--ref")) {
            if (!(a->ref = NEXT())) return 2;
        } else if (!strcmp(o, "--expert-precision")) {
            if (!(a->precision = NEXT())) return 2;
        } else if (!strcmp(o, "--ctx")) {
            if (!(v = NEXT()) || !parse_int(o, v, 4, 1 << 24, &a->n_ctx)) return 2;
        } else if (!strcmp(o, "-b") || !strcmp(o, "--batch")) {
            if (!(v = NEXT()) || !parse_int(o, v, 1, 1 << 16, &a->n_batch)) return 2;
        } else if (!strcmp(o, "--max-chunks")) {
            if (!(v = NEXT()) || !parse_int(o, v, 1, 1 << 30, &a->max_chunks)) return 2;
        } else if (!strcmp(o, "-t") || !strcmp(o, "--threads")) {
            if (!(v = NEXT()) || !parse_int(o, v, 1, 256, &a->n_threads)) return 2;
        } else if (!strcmp(o, "--little-k")) {
            if (!(v = NEXT()) || !parse_int(o, v, 0, 64, &a->little_k)) return 2;
        } else if (!strcmp(o, "--gamma")) {
            if (!(v = NEXT()) || !moe_tool_parse_double("eval", o, v, 0, 1, &a->gamma)) return 2;
        } else if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (!strcmp(o, "--skip-bad")) {
            a->skip_bad = 1;
        } else if (!strcmp(o, "--unigram")) {
            a->unigram = 1;
        } else if (!strcmp(o, "--routing")) {
            a->routing = 1;
        } else if (engine >= 0) {
            char err[256];
            if (engine && !(v = NEXT())) return 2;
            if (moe_store_parse_option(&a->store, o, engine ? v : NULL, err, sizeof err) != MOE_OK) {
                fprintf(stderr, "moe-prep eval: %s\n", err);
                return 2;
            }
        } else if (o[0] == '-') {
            fprintf(stderr, "moe-prep eval: unknown option \"%s\" (see moe-prep eval --help)\n", o);
            return 2;
        } else if (!a->model) {
            a->model = o;
        } else {
            fprintf(stderr, "moe-prep eval: one MODEL only (\"%s\" and \"%s\"); the reference goes "
                            "after --ref\n", a->model, o);
            return 2;
        }
#undef NEXT
    }
    if (!a->model || !a->dataset) {
        fprintf(stderr, "moe-prep eval: %s (see moe-prep eval --help)\n",
                !a->model ? "no MODEL given" : "no --dataset FILE given");
        return 2;
    }
    if ((a->little_k > 0 || (!isnan(a->gamma) && a->little_k != 0)) && a->n_batch > 1) {
        fprintf(stderr, "moe-prep eval: big-little decoding (--little-k / --gamma) runs one token at a time; "
                        "drop --batch %d\n", a->n_batch);
        return 2;
    }
    if (moe_store_params_active(&a->store) && moe_is_dir(a->model)) {
        fprintf(stderr, "moe-prep eval: engine options (--expert-mem, --cache-experts) need a .moeb bundle; "
                        "%s is a checkpoint directory (run moe-prep quantize first)\n", a->model);
        return 2;
    }
    return 0;
}

/* progress: chunk i/N, speed and ETA, rewritten in place (stderr is a terminal). */
static void progress(int done, int total, double seconds, void *user) {
    const struct eval_args *a = user;
    double rate = seconds > 0 ? (double)done * a->n_ctx / seconds : 0;
    double eta = done > 0 ? seconds / done * (total - done) : 0;
    fprintf(stderr, "\rmoe-prep eval: chunk %d/%d, %.1f tok/s, ETA %dm%02ds   ", done, total, rate,
            (int)(eta / 60), (int)fmod(eta, 60));
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}


/* json_num: a number with round-trip precision; null if not finite. */
static void json_num(double x) {
    if (isfinite(x))
        printf("%.17g", x);
    else
        fputs("null", stdout);
}

static void json_figure(const char *key, struct moe_eval_figure f, const char *val, const char *err) {
    printf(", \"%s\": {\"%s\": ", key, val);
    json_num(f.val);
    printf(", \"%s\": ", err);
    json_num(f.err);
    putchar('}');
}

/* json_dist: mean, error and percentiles of a per-position distribution. */
static void json_dist(const char *key, struct moe_eval_figure f, const double pct[MOE_EVAL_N_PCT]) {
    static const char *const names[MOE_EVAL_N_PCT] = {"min", "p0.1", "p1", "p5", "p10", "median",
                                                      "p90", "p95", "p99", "p99.9", "max"};
    printf(", \"%s\": {\"mean\": ", key);
    json_num(f.val);
    printf(", \"stderr\": ");
    json_num(f.err);
    for (int i = 0; i < MOE_EVAL_N_PCT; i++) {
        printf(", \"%s\": ", names[i]);
        json_num(pct[i]);
    }
    putchar('}');
}

static void print_json(const struct eval_args *a, int n_threads, const struct moe_eval_result *r) {
    printf("{\"model\": ");
    moe_tool_json_string(stdout, a->model);
    printf(", \"ref\": ");
    moe_tool_json_string(stdout, a->ref);
    printf(", \"dataset\": ");
    moe_tool_json_string(stdout, a->dataset);
    printf(", \"ctx\": %d, \"max_chunks\": ", r->n_ctx);
    if (a->max_chunks) printf("%d", a->max_chunks); else fputs("null", stdout);
    printf(", \"expert_precision\": ");
    moe_tool_json_string(stdout, a->precision);
    printf(", \"threads\": %d, \"bos\": ", n_threads);
    if (r->bos >= 0) printf("%d", r->bos); else fputs("null", stdout);
    printf(", \"dataset_tokens\": %lld, \"chunks\": %d, \"tokens_scored\": %lld, \"seconds\": ",
           (long long)r->n_tokens, r->n_chunks, (long long)r->n_scored);
    json_num(r->seconds);
    json_figure("ppl", r->ppl, "value", "stderr");
    json_figure("nll", r->nll, "mean", "stderr");
    if (r->has_ref) {
        json_figure("ref_ppl", r->ref_ppl, "value", "stderr");
        json_figure("ref_nll", r->ref_nll, "mean", "stderr");
        printf(", \"nll_correlation\": ");
        json_num(r->nll_cor);
        json_figure("ln_ppl_ratio", r->ln_ppl_ratio, "value", "stderr");
        json_figure("ppl_ratio", r->ppl_ratio, "value", "stderr");
        json_figure("ppl_diff", r->ppl_diff, "value", "stderr");
        json_dist("kld", r->kld, r->kld_pct);
        json_dist("delta_p", r->dp, r->dp_pct);
        json_figure("delta_p_rms", r->dp_rms, "value", "stderr");
        json_figure("same_top", r->same_top, "value", "stderr");
    }
    if (r->has_unigram) {
        printf(", \"unigram_ppl\": ");
        json_num(r->unigram_ppl);
        printf(", \"ppl_over_unigram\": ");
        json_num(r->ppl.val / r->unigram_ppl);
    }
    if (r->has_store) {
        printf(", \"engine\": ");
        moe_store_stats_json(&r->store, stdout);
    }
    if (r->has_big_little) {
        const struct moe_big_little_stats *b = &r->big_little;
        printf(", \"big_little\": {\"little_k\": %d, \"gamma\": ", a->little_k);
        json_num(a->gamma);
        printf(", \"tokens\": %lld, \"fallbacks\": %lld, \"fallback_ratio\": ", (long long)b->tokens,
               (long long)b->fallbacks);
        json_num(b->tokens > 0 ? (double)b->fallbacks / (double)b->tokens : NAN);
        putchar('}');
    }
    if (r->expert_load) {
        printf(", \"routing\": [");
        int first = 1;
        for (int l = 0; l < r->n_layer; l++) {
            int top;
            double h = moe_eval_load_entropy(r, l, &top);
            if (h < 0) continue; /* dense layer */
            const int64_t *row = r->expert_load + (size_t)l * (size_t)r->n_expert;
            printf("%s{\"layer\": %d, \"load_entropy_ratio\": ", first ? "" : ", ", l);
            json_num(h);
            printf(", \"top_expert\": %d, \"load\": [", top);
            for (int e = 0; e < r->n_expert; e++) printf("%s%lld", e ? ", " : "", (long long)row[e]);
            printf("]}");
            first = 0;
        }
        printf("]");
    }
    printf("}\n");
}

/* print_pct_rows: llama-perplexity's percentile block (maximum down to minimum). */
static void print_pct_rows(const char *what, const double pct[MOE_EVAL_N_PCT], double scale, const char *unit) {
    static const char *const names[MOE_EVAL_N_PCT] = {"Minimum", " 0.1%  ", " 1.0%  ", " 5.0%  ",
                                                      "10.0%  ", "Median ", "90.0%  ", "95.0%  ",
                                                      "99.0%  ", "99.9%  ", "Maximum"};
    for (int i = MOE_EVAL_N_PCT - 1; i >= 0; i--)
        printf("%s %s: %10.6f%s\n", names[i], what, scale * pct[i], unit);
}

/* print_extras: the engine's counts, the unigram baseline and the routing
 * table, when asked for. */
static void print_extras(const struct eval_args *a, const struct moe_eval_result *r) {
    if (r->has_store) {
        const struct moe_store_stats *s = &r->store;
        const double acc = s->accesses > 0 ? (double)s->accesses : 1;
        printf("\nengine   %s, dynamic precision %s (T1 %.3g, T2 %.3g), caches %d high + %d low\n",
               moe_cache_policy_name((enum moe_cache_policy)s->policy), s->dynamic ? "on" : "off", s->t1, s->t2,
               s->high_cap, s->low_cap);
        printf("         expert uses %lld: high %.2f %% (hits %lld), low %.2f %% (hits %lld), skipped %.2f %%; "
               "%.3f loads / token\n", (long long)s->accesses,
               100.0 * (double)(s->hits_high + s->misses_high) / acc, (long long)s->hits_high,
               100.0 * (double)(s->hits_low + s->misses_low) / acc, (long long)s->hits_low,
               100.0 * (double)s->skips / acc, s->tokens > 0 ? (double)s->loads / (double)s->tokens : 0.0);
    }
    if (r->has_big_little)
        printf("\nbig-little  top-%d little model, gamma %.4g: %lld of %lld positions fell back (%.2f %%)\n",
               a->little_k, a->gamma, (long long)r->big_little.fallbacks, (long long)r->big_little.tokens,
               r->big_little.tokens ? 100.0 * (double)r->big_little.fallbacks / (double)r->big_little.tokens : 0.0);
    if (r->has_unigram)
        printf("unigram PPL (add-one, counted on this text) = %.4f; PPL / unigram PPL = %.4f\n", r->unigram_ppl,
               r->ppl.val / r->unigram_ppl);
    if (!r->expert_load) return;
    printf("\nexpert load per MoE layer (token-slots over all processed tokens)\n");
    printf("layer  entropy/log(E)  top expert (share)\n");
    for (int l = 0; l < r->n_layer; l++) {
        int top;
        double h = moe_eval_load_entropy(r, l, &top);
        if (h < 0) continue;
        const int64_t *row = r->expert_load + (size_t)l * (size_t)r->n_expert;
        int64_t total = 0;
        for (int e = 0; e < r->n_expert; e++) total += row[e];
        printf("%5d  %14.3f  %3d (%.1f %%)\n", l, h, top, 100.0 * (double)row[top] / (double)total);
    }
}

static void print_table(const struct eval_args *a, const struct moe_eval_result *r) {
    printf("model    %s\n", a->model);
    if (a->ref) printf("ref      %s\n", a->ref);
    printf("dataset  %s: %lld tokens; %d chunks of %d", a->dataset, (long long)r->n_tokens, r->n_chunks,
           r->n_ctx);
    if (r->bos >= 0) printf(" (each starting with BOS %d)", r->bos);
    printf(", %lld positions scored (second half of each chunk)\n\n", (long long)r->n_scored);
    if (!r->has_ref) {
        printf("PPL = %.4f ± %.5f   (mean NLL %.6f ± %.6f nats/token)\n", r->ppl.val, r->ppl.err,
               r->nll.val, r->nll.err);
        print_extras(a, r);
        return;
    }
    printf("====== Perplexity statistics ======\n");
    printf("Mean PPL(model)                 : %10.6f ± %10.6f\n", r->ppl.val, r->ppl.err);
    printf("Mean PPL(ref)                   : %10.6f ± %10.6f\n", r->ref_ppl.val, r->ref_ppl.err);
    if (isfinite(r->nll_cor))
        printf("Cor(ln(PPL(model)), ln(PPL(ref))): %6.2f%%\n", 100.0 * r->nll_cor);
    else
        printf("Cor(ln(PPL(model)), ln(PPL(ref))):    n/a\n");
    printf("Mean ln(PPL(model)/PPL(ref))    : %10.6f ± %10.6f\n", r->ln_ppl_ratio.val, r->ln_ppl_ratio.err);
    printf("Mean PPL(model)/PPL(ref)        : %10.6f ± %10.6f\n", r->ppl_ratio.val, r->ppl_ratio.err);
    printf("Mean PPL(model)-PPL(ref)        : %10.6f ± %10.6f\n\n", r->ppl_diff.val, r->ppl_diff.err);
    printf("====== KL divergence statistics: KL(ref || model), nats ======\n");
    printf("Mean    KLD: %10.6f ± %10.6f\n", r->kld.val, r->kld.err);
    print_pct_rows("KLD", r->kld_pct, 1.0, "");
    printf("\n====== Token probability statistics: Δp = p_model - p_ref of the next token ======\n");
    printf("Mean    Δp: %6.3f ± %5.3f %%\n", 100.0 * r->dp.val, 100.0 * r->dp.err);
    print_pct_rows("Δp", r->dp_pct, 100.0, " %");
    printf("RMS Δp    : %6.3f ± %5.3f %%\n", 100.0 * r->dp_rms.val, 100.0 * r->dp_rms.err);
    printf("Same top p: %6.3f ± %5.3f %%\n", 100.0 * r->same_top.val, 100.0 * r->same_top.err);
    print_extras(a, r);
}

/* load: one model; reports a failure naming the role. */
static int load(const char *path, const char *precision, const char *role, int lazy, struct moe_model **out) {
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = precision;
    mp.lazy_experts = lazy; /* the engine's store loads experts itself */
    if (moe_model_load(path, &mp, out) == MOE_OK) {
        char what[256];
        moe_model_precision_summary(*out, what, sizeof what);
        fprintf(stderr, "moe-prep eval: %s experts: %s\n", role, what);
        return 1;
    }
    fprintf(stderr, "moe-prep eval: cannot load the %s from %s (see the message above)\n", role, path);
    return 0;
}

/* big_little_defaults: as moe-run: with --gamma or --little-k, K2 = K/2 and
 * gamma = the bundle's mobile.gamma (else 0.7) unless given; a->little_k
 * ends 0 when off. 0 after a message. */
static int big_little_defaults(struct eval_args *a, const struct moe_model *m) {
    const struct moe_config *c = &m->cfg;
    if (a->little_k == 0 || (a->little_k < 0 && isnan(a->gamma))) {
        a->little_k = 0;
        return 1;
    }
    const int K = c->n_expert_used;
    if (a->little_k < 0) a->little_k = K / 2;
    if (a->little_k < 1 || a->little_k >= K) {
        fprintf(stderr, "moe-prep eval: big-little needs a little model with 1 .. %d experts per token (the model "
                        "routes to %d); got %d\n", K - 1, K, a->little_k);
        return 0;
    }
    if (isnan(a->gamma)) {
        struct moe_tuning t;
        int L = 0;
        for (int l = 0; l < c->n_layer; l++) L += c->layer_moe[l] != 0;
        a->gamma = 0.7;
        if (m->bundle && L > 0 && moe_tuning_read(moe_bundle_tuning(m->bundle), L, c->n_expert, &t) == MOE_OK &&
            t.has_gamma)
            a->gamma = t.gamma;
        else
            fprintf(stderr, "moe-prep eval: no mobile.gamma in the model's tuning; gamma 0.7\n");
    }
    return 1;
}

/* check_ctx: --ctx against a model's positions, with the flag's name in the message. */
static int check_ctx(const struct eval_args *a, const struct moe_model *m, const char *path) {
    if (a->n_ctx <= m->cfg.max_pos) return 1;
    fprintf(stderr, "moe-prep eval: --ctx %d exceeds the context of %s (max_position_embeddings %d); "
                    "use --ctx %d or less\n", a->n_ctx, path, m->cfg.max_pos, m->cfg.max_pos);
    return 0;
}

int moe_prep_eval(int argc, char **argv) {
    struct eval_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    struct moe_model *model = NULL, *ref = NULL;
    size_t n_ids = 0;
    int32_t *ids = NULL;
    int status = 1;

    struct moe_dataset_params dp = moe_dataset_default_params();
    dp.skip_bad = a.skip_bad;
    if (a.precision && moe_is_dir(a.model))
        fprintf(stderr, "moe-prep eval: --expert-precision applies to bundles; %s is a checkpoint "
                        "directory, so it is ignored\n", a.model);
    const int engine = moe_store_params_active(&a.store);
    if (!load(a.model, a.precision, "model", engine, &model) || !check_ctx(&a, model, a.model)) goto done;
    if (a.ref && (!load(a.ref, NULL, "reference", 0, &ref) || !check_ctx(&a, ref, a.ref))) goto done;
    /* with --max-chunks, read only the text those chunks need (memory bounded by the request);
     * --unigram counts over the whole text, so it reads it all */
    size_t need = a.max_chunks > 0 && !a.unigram ? (size_t)a.max_chunks * (size_t)a.n_ctx : 0;
    if (moe_text_load_tokens(model, ref, a.dataset, &dp, need, &ids, &n_ids)) {
        fprintf(stderr, "moe-prep eval: cannot read the dataset %s or tokenize it for this evaluation (see the "
                        "message above)\n", a.dataset);
        goto done;
    }
    if (n_ids < 2 * (size_t)a.n_ctx) {
        fprintf(stderr, "moe-prep eval: %s tokenizes to %zu tokens%s, but --ctx %d needs at least %zu "
                        "(2 x ctx); use a longer text or a smaller --ctx\n", a.dataset, n_ids,
                moe_text_bos(model->tok) >= 0 ? " (with BOS)" : "", a.n_ctx, 2 * (size_t)a.n_ctx);
        goto done;
    }
    struct moe_eval_params ep = moe_eval_default_params();
    ep.n_ctx = a.n_ctx;
    ep.max_chunks = a.max_chunks;
    ep.n_threads = a.n_threads;
    ep.bos = moe_text_bos(model->tok);
    ep.unigram = a.unigram;
    ep.routing = a.routing;
    ep.store = engine ? &a.store : NULL;
    ep.n_batch = a.n_batch;
    if (!big_little_defaults(&a, model)) goto done;
    ep.little_k = a.little_k > 0 ? a.little_k : 0;
    ep.gamma = a.gamma;
    if (isatty(STDERR_FILENO)) {
        ep.on_chunk = progress;
        ep.user = &a;
    }
    struct moe_eval_result r;
    if (moe_eval_run(model, ref, ids, n_ids, &ep, &r)) {
        fprintf(stderr, "moe-prep eval: evaluation failed (see the message above)\n");
        goto done;
    }
    int n_threads = a.n_threads;
    if (!n_threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n < 1 ? 1 : n > 256 ? 256 : (int)n;
    }
    if (a.json)
        print_json(&a, n_threads, &r);
    else
        print_table(&a, &r);
    fflush(stdout);
    fprintf(stderr, "moe-prep eval: %d chunks of %d tokens, %lld scored, in %.2f s (%.1f tok/s%s); PPL %.4f",
            r.n_chunks, r.n_ctx, (long long)r.n_scored, r.seconds,
            r.seconds > 0 ? (double)r.n_chunks * r.n_ctx / r.seconds : 0.0, ref ? ", model + ref" : "",
            r.ppl.val);
    if (ref) fprintf(stderr, ", mean KLD %.6f, same top %.2f %%", r.kld.val, 100.0 * r.same_top.val);
    if (r.has_unigram) fprintf(stderr, ", unigram PPL %.4f (ratio %.3f)", r.unigram_ppl, r.ppl.val / r.unigram_ppl);
    if (r.has_big_little)
        fprintf(stderr, ", big-little fallback %.1f %%",
                r.big_little.tokens ? 100.0 * (double)r.big_little.fallbacks / (double)r.big_little.tokens : 0.0);
    if (r.has_store && r.store.accesses > 0)
        fprintf(stderr, ", engine: %.1f %% low, %.1f %% skipped, hit ratio %.3f",
                100.0 * (double)(r.store.hits_low + r.store.misses_low) / (double)r.store.accesses,
                100.0 * (double)r.store.skips / (double)r.store.accesses,
                (double)(r.store.hits_high + r.store.hits_low) / (double)(r.store.accesses - r.store.skips > 0 ? r.store.accesses - r.store.skips : 1));
    fputc('\n', stderr);
    moe_eval_result_clear(&r);
    status = 0;
done:
    free(ids);
    moe_model_free(ref);
    moe_model_free(model);
    return status;
}

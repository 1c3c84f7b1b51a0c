/*
 * eval-cmd.c - `moe-prep eval`: parses the options (its own and the expert
 * store's), loads the model, the reference and the text's tokens, calls
 * moe_eval_run (eval.h) and prints the figures as llama-perplexity's table or
 * as one JSON object.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval.h"
#include "moe-dataset.h"
#include "moe-mmap.h"
#include "moe-options.h"
#include "moe-opt.h"
#include "moe-prep.h"
#include "moe-session.h"
#include "moe-tuning.h"
#include "token-stream.h"
#include "tool-util.h"

#define PROG "moe-prep eval"

static const struct moe_opt k_opts[] = {
    {"dataset", 0, MOE_OPT_REQUIRED, "SPEC", "the text to score (required): a dataset card or a\n"
                                             "file with a format and fields (see below)"},
    {"skip-bad", 0, MOE_OPT_NONE, NULL, "skip malformed records (counted) instead of failing"},
    {"ref", 0, MOE_OPT_REQUIRED, "REF", "reference model (same vocabulary and tokenizer):\n"
                                        "adds KL(P_ref || P_model), top-1 agreement, delta-p\n"
                                        "and PPL ratio / difference"},
    {"ctx", 0, MOE_OPT_REQUIRED, "N", "tokens per chunk (default 512, at most the models'\n"
                                      "max_position_embeddings)"},
    {"max-chunks", 0, MOE_OPT_REQUIRED, "N", "score at most N chunks (default: all)"},
    {"expert-precision", 0, MOE_OPT_REQUIRED, "P", "bundles: stored expert precision of MODEL to use\n"
                                                   "(e.g. q4_k); REF always loads with its defaults"},
    {"unigram", 0, MOE_OPT_NONE, NULL, "also the perplexity of an add-one unigram model\n"
                                       "counted on the same text (a baseline) and the ratio"},
    {"routing", 0, MOE_OPT_NONE, NULL, "also the model's expert load per MoE layer: its\n"
                                       "entropy / log(experts) and the most-used expert"},
    {"threads", 't', MOE_OPT_REQUIRED, "N", "CPU threads per model (default: all)"},
    {"batch", 'b', MOE_OPT_REQUIRED, "N", "MODEL's tokens per forward pass (default 256); 1 runs\n"
                                          "each position as a decode step, so the engine picks\n"
                                          "precisions per token as when generating"},
    {"little-k", 0, MOE_OPT_REQUIRED, "K2", "MODEL decodes big-little (MoBiLE, as moe-run): every\n"
                                            "position runs with K2 experts and again with all K when\n"
                                            "its top probability is below G (--gamma); the distribution\n"
                                            "scored is the one big-little uses (implies --batch 1;\n"
                                            "defaults as moe-run: K2 = K/2, G = the bundle's\n"
                                            "mobile.gamma)"},
    {"gamma", 0, MOE_OPT_REQUIRED, "G", "big-little's threshold (see --little-k); --gamma 0\n"
                                        "scores the K2 model alone"},
    {"json", 0, MOE_OPT_NONE, NULL, "one JSON object on stdout instead of the table"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this help"},
    {NULL, 0, 0, NULL, NULL},
};

static void eval_usage(FILE *f) {
    fputs("usage: moe-prep eval MODEL --dataset SPEC [--ref REF] [options]\n"
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
          "\n", f);
    moe_opt_help(f, k_opts);
    fputs("\n"
          "Progress goes to stderr when it is a terminal; a summary line always does.\n"
          "\n"
          "MODEL through the engine: with --expert-mem or --cache-experts, MODEL runs\n"
          "as moe-run would run it with the same options (a bounded expert cache,\n"
          "HOBBIT dynamic precision and skipping, the cache policy, prefetching); REF\n"
          "always runs with every expert resident, so `eval B.moeb --ref B.moeb\n"
          "--expert-mem 25% --dynamic on` measures what the engine's choices cost.\n"
          "The store's counts (hit ratios, low-precision loads, skips) are reported.\n"
          "\n", f);
    fprintf(f, "%s\n%s\n%s\n", moe_store_options_help(), moe_gpu_options_help(), moe_dataset_spec_help());
    fputs("examples:\n"
          "  moe-prep eval ./Mixtral-8x7B-v0.1 --dataset wiki.test.raw\n"
          "  moe-prep eval mixtral-q4.moeb --ref ./Mixtral-8x7B-v0.1 --dataset wiki.test.raw \\\n"
          "      --ctx 512 --max-chunks 40 --json\n"
          "  moe-prep eval tests/fixtures/models/mixtral-bf16 --ref tests/fixtures/models/mixtral-f32 \\\n"
          "      --dataset notes.txt --ctx 32\n"
          "  moe-prep eval model.moeb --dataset jsonl:gsm8k/test.jsonl:question,answer --ctx 256\n"
          "  moe-prep eval model.moeb --dataset wikitext2-test --unigram --routing\n"
          "  moe-prep eval model.moeb --ref model.moeb --dataset wikitext2-test --expert-mem 25% \\\n"
          "      --dynamic on --high q8_0 --low q2_k --batch 1\n"
          "  moe-prep eval model.moeb --ref model.moeb --dataset c4.txt --little-k 1 --gamma 0.3\n", f);
}

struct eval_args {
    const char *model, *ref, *dataset, *precision;
    int n_ctx, max_chunks, n_threads, json, unigram, routing, skip_bad, n_batch;
    int little_k;  /* -1: not given */
    double gamma;  /* NaN: not given */
    struct moe_store_params store; /* engine options for MODEL (moe-run's) */
    struct moe_gpu_params gpu;     /* --device and the GPU backend's options */
};

/* parse_int: strict decimal integer in [lo, hi] for option --NAME. */
static int parse_int(const char *name, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, PROG ": --%s expects an integer in [%ld, %ld], got \"%s\"\n", name, lo, hi, s);
        return 0;
    }
    *out = (int)v;
    return 1;
}

/* store_option: an engine option (moe_store_option_table) into a->store, or
 * a device option into a->gpu. */
static int store_option(struct eval_args *a, const struct moe_opt *o, const char *v) {
    char err[256];
    const int d = moe_device_option(PROG, &a->gpu, o->name, v);
    if (d >= 0) return d;
    if (moe_store_parse_option(&a->store, o->name, v, err, sizeof err) == MOE_OK) return 0;
    fprintf(stderr, PROG ": %s\n", err);
    return 2;
}

/* on_option: one option (moe_opt_fn): 0 go on, 1 help shown, 2 usage error. */
static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    struct eval_args *a = ctx;
    const char *n = o->name;
    if (o < k_opts || o >= k_opts + sizeof k_opts / sizeof k_opts[0]) return store_option(a, o, v);
    if (o->key == 'h') {
        eval_usage(stdout);
        return 1;
    }
    if (!strcmp(n, "dataset")) a->dataset = v;
    else if (!strcmp(n, "ref")) a->ref = v;
    else if (!strcmp(n, "expert-precision")) a->precision = v;
    else if (!strcmp(n, "ctx")) return parse_int(n, v, 4, 1 << 24, &a->n_ctx) ? 0 : 2;
    else if (!strcmp(n, "batch")) return parse_int(n, v, 1, 1 << 16, &a->n_batch) ? 0 : 2;
    else if (!strcmp(n, "max-chunks")) return parse_int(n, v, 1, 1 << 30, &a->max_chunks) ? 0 : 2;
    else if (!strcmp(n, "threads")) return parse_int(n, v, 1, 256, &a->n_threads) ? 0 : 2;
    else if (!strcmp(n, "little-k")) return parse_int(n, v, 0, 64, &a->little_k) ? 0 : 2;
    else if (!strcmp(n, "gamma")) return moe_tool_parse_double("eval", "--gamma", v, 0, 1, &a->gamma) ? 0 : 2;
    else if (!strcmp(n, "json")) a->json = 1;
    else if (!strcmp(n, "skip-bad")) a->skip_bad = 1;
    else if (!strcmp(n, "unigram")) a->unigram = 1;
    else if (!strcmp(n, "routing")) a->routing = 1;
    return 0;
}

/* check_args: what the options allow together; 0 ok, 2 usage error (reported). */
static int check_args(const struct eval_args *a) {
    if (!a->model || !a->dataset) {
        fprintf(stderr, PROG ": %s (see moe-prep eval --help)\n", !a->model ? "no MODEL given" : "no --dataset FILE given");
        return 2;
    }
    if ((a->little_k > 0 || (!isnan(a->gamma) && a->little_k != 0)) && a->n_batch > 1) {
        fprintf(stderr, PROG ": big-little decoding (--little-k / --gamma) runs one token at a time; "
                        "drop --batch %d\n", a->n_batch);
        return 2;
    }
    if (moe_store_params_active(&a->store) && moe_is_dir(a->model)) {
        fprintf(stderr, PROG ": engine options (--expert-mem, --cache-experts) need a .moeb bundle; "
                        "%s is a checkpoint directory (run moe-prep quantize first)\n", a->model);
        return 2;
    }
    return 0;
}

/* parse_args: 0 ok, 1 help printed, 2 usage error (reported). */
static int parse_args(int argc, char **argv, struct eval_args *a) {
    memset(a, 0, sizeof *a);
    a->n_ctx = 512;
    a->store = moe_store_default_params();
    a->gpu = moe_gpu_default_params();
    a->little_k = -1, a->gamma = NAN;
    const struct moe_opt *tables[] = {k_opts, moe_store_option_table(), moe_gpu_option_table()};
    int first = 0, rc = moe_opt_parse(PROG, argc, argv, 1, tables, 3, on_option, a, &first);
    if (rc) return rc == 1 ? 1 : 2;
    if (!moe_device_built(PROG, a->gpu.device_spec)) return 2;
    if (first < argc) a->model = argv[first];
    if (first + 1 < argc) {
        fprintf(stderr, PROG ": one MODEL only (\"%s\" and \"%s\"); the reference goes after --ref\n", a->model,
                argv[first + 1]);
        return 2;
    }
    return check_args(a);
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

/* ---- JSON ---- */

/* add_figure: {"VAL": value, "ERR": its error}. */
static void add_figure(cJSON *o, const char *key, struct moe_eval_figure f, const char *val, const char *err) {
    cJSON *x = cJSON_AddObjectToObject(o, key);
    moe_tool_json_num(x, val, f.val);
    moe_tool_json_num(x, err, f.err);
}

/* add_dist: mean, error and percentiles of a per-position distribution. */
static void add_dist(cJSON *o, const char *key, struct moe_eval_figure f, const double pct[MOE_EVAL_N_PCT]) {
    static const char *const names[MOE_EVAL_N_PCT] = {"min", "p0.1", "p1", "p5", "p10", "median",
                                                      "p90", "p95", "p99", "p99.9", "max"};
    cJSON *x = cJSON_AddObjectToObject(o, key);
    moe_tool_json_num(x, "mean", f.val);
    moe_tool_json_num(x, "stderr", f.err);
    for (int i = 0; i < MOE_EVAL_N_PCT; i++) moe_tool_json_num(x, names[i], pct[i]);
}

/* add_ref_json: the comparison with the reference model. */
static void add_ref_json(cJSON *o, const struct moe_eval_result *r) {
    add_figure(o, "ref_ppl", r->ref_ppl, "value", "stderr");
    add_figure(o, "ref_nll", r->ref_nll, "mean", "stderr");
    moe_tool_json_num(o, "nll_correlation", r->nll_cor);
    add_figure(o, "ln_ppl_ratio", r->ln_ppl_ratio, "value", "stderr");
    add_figure(o, "ppl_ratio", r->ppl_ratio, "value", "stderr");
    add_figure(o, "ppl_diff", r->ppl_diff, "value", "stderr");
    add_dist(o, "kld", r->kld, r->kld_pct);
    add_dist(o, "delta_p", r->dp, r->dp_pct);
    add_figure(o, "delta_p_rms", r->dp_rms, "value", "stderr");
    add_figure(o, "same_top", r->same_top, "value", "stderr");
}

/* add_routing_json: per MoE layer its load entropy ratio, top expert and loads. */
static void add_routing_json(cJSON *o, const struct moe_eval_result *r) {
    cJSON *list = cJSON_AddArrayToObject(o, "routing");
    for (int l = 0; l < r->n_layer; l++) {
        int top;
        double h = moe_eval_load_entropy(r, l, &top);
        if (h < 0) continue; /* dense layer */
        const int64_t *row = r->expert_load + (size_t)l * (size_t)r->n_expert;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "layer", l);
        moe_tool_json_num(x, "load_entropy_ratio", h);
        cJSON_AddNumberToObject(x, "top_expert", top);
        cJSON *load = cJSON_AddArrayToObject(x, "load");
        for (int e = 0; e < r->n_expert; e++) cJSON_AddItemToArray(load, cJSON_CreateNumber((double)row[e]));
        cJSON_AddItemToArray(list, x);
    }
}

/* add_extras_json: the unigram baseline, the engine, big-little and routing. */
static void add_extras_json(cJSON *o, const struct eval_args *a, const struct moe_eval_result *r) {
    if (r->has_unigram) {
        moe_tool_json_num(o, "unigram_ppl", r->unigram_ppl);
        moe_tool_json_num(o, "ppl_over_unigram", r->ppl.val / r->unigram_ppl);
    }
    if (r->has_store) cJSON_AddItemToObject(o, "engine", moe_store_stats_to_json(&r->store));
    if (r->has_big_little) {
        const struct moe_big_little_stats *b = &r->big_little;
        cJSON *x = cJSON_AddObjectToObject(o, "big_little");
        cJSON_AddNumberToObject(x, "little_k", a->little_k);
        moe_tool_json_num(x, "gamma", a->gamma);
        cJSON_AddNumberToObject(x, "tokens", (double)b->tokens);
        cJSON_AddNumberToObject(x, "fallbacks", (double)b->fallbacks);
        moe_tool_json_num(x, "fallback_ratio", b->tokens > 0 ? (double)b->fallbacks / (double)b->tokens : NAN);
    }
    if (r->expert_load) add_routing_json(o, r);
}

/* print_json: the run's settings and figures as one JSON object on a line. */
static void print_json(const struct eval_args *a, int n_threads, const struct moe_eval_result *r) {
    cJSON *o = cJSON_CreateObject();
    moe_tool_json_str(o, "model", a->model);
    moe_tool_json_str(o, "ref", a->ref);
    moe_tool_json_str(o, "dataset", a->dataset);
    cJSON_AddNumberToObject(o, "ctx", r->n_ctx);
    if (a->max_chunks) cJSON_AddNumberToObject(o, "max_chunks", a->max_chunks);
    else cJSON_AddNullToObject(o, "max_chunks");
    moe_tool_json_str(o, "expert_precision", a->precision);
    cJSON_AddNumberToObject(o, "threads", n_threads);
    if (r->bos >= 0) cJSON_AddNumberToObject(o, "bos", r->bos);
    else cJSON_AddNullToObject(o, "bos");
    cJSON_AddNumberToObject(o, "dataset_tokens", (double)r->n_tokens);
    cJSON_AddNumberToObject(o, "chunks", r->n_chunks);
    cJSON_AddNumberToObject(o, "tokens_scored", (double)r->n_scored);
    moe_tool_json_num(o, "seconds", r->seconds);
    add_figure(o, "ppl", r->ppl, "value", "stderr");
    add_figure(o, "nll", r->nll, "mean", "stderr");
    if (r->has_ref) add_ref_json(o, r);
    add_extras_json(o, a, r);
    char *s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
}

/* ---- the table ---- */

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

/* print_summary_line: the one line on stderr every run ends with. */
static void print_summary_line(const struct moe_eval_result *r, int with_ref) {
    fprintf(stderr, "moe-prep eval: %d chunks of %d tokens, %lld scored, in %.2f s (%.1f tok/s%s); PPL %.4f",
            r->n_chunks, r->n_ctx, (long long)r->n_scored, r->seconds,
            r->seconds > 0 ? (double)r->n_chunks * r->n_ctx / r->seconds : 0.0, with_ref ? ", model + ref" : "",
            r->ppl.val);
    if (with_ref) fprintf(stderr, ", mean KLD %.6f, same top %.2f %%", r->kld.val, 100.0 * r->same_top.val);
    if (r->has_unigram) fprintf(stderr, ", unigram PPL %.4f (ratio %.3f)", r->unigram_ppl, r->ppl.val / r->unigram_ppl);
    if (r->has_big_little)
        fprintf(stderr, ", big-little fallback %.1f %%",
                r->big_little.tokens ? 100.0 * (double)r->big_little.fallbacks / (double)r->big_little.tokens : 0.0);
    const struct moe_store_stats *s = &r->store;
    if (r->has_store && s->accesses > 0)
        fprintf(stderr, ", engine: %.1f %% low, %.1f %% skipped, hit ratio %.3f",
                100.0 * (double)(s->hits_low + s->misses_low) / (double)s->accesses,
                100.0 * (double)s->skips / (double)s->accesses,
                (double)(s->hits_high + s->hits_low) / (double)(s->accesses - s->skips > 0 ? s->accesses - s->skips : 1));
    fputc('\n', stderr);
}

/* The loaded inputs of a run. */
struct eval_inputs {
    struct moe_model *model, *ref;
    int32_t *ids;
    size_t n_ids;
};

/* load_inputs: the model, the reference and the text's tokens; 0 after a message. */
static int load_inputs(struct eval_args *a, struct eval_inputs *in) {
    struct moe_dataset_params dp = moe_dataset_default_params();
    dp.skip_bad = a->skip_bad;
    if (a->precision && moe_is_dir(a->model))
        fprintf(stderr, PROG ": --expert-precision applies to bundles; %s is a checkpoint "
                        "directory, so it is ignored\n", a->model);
    const int engine = moe_store_params_active(&a->store);
    if (!load(a->model, a->precision, "model", engine, &in->model) || !check_ctx(a, in->model, a->model)) return 0;
    if (a->ref && (!load(a->ref, NULL, "reference", 0, &in->ref) || !check_ctx(a, in->ref, a->ref))) return 0;
    /* with --max-chunks, read only the text those chunks need (memory bounded by the request);
     * --unigram counts over the whole text, so it reads it all */
    size_t need = a->max_chunks > 0 && !a->unigram ? (size_t)a->max_chunks * (size_t)a->n_ctx : 0;
    if (moe_text_load_tokens(in->model, in->ref, a->dataset, &dp, need, &in->ids, &in->n_ids)) {
        fprintf(stderr, PROG ": cannot read the dataset %s or tokenize it for this evaluation (see the "
                        "message above)\n", a->dataset);
        return 0;
    }
    if (in->n_ids < 2 * (size_t)a->n_ctx) {
        fprintf(stderr, PROG ": %s tokenizes to %zu tokens%s, but --ctx %d needs at least %zu "
                        "(2 x ctx); use a longer text or a smaller --ctx\n", a->dataset, in->n_ids,
                moe_text_bos(in->model->tok) >= 0 ? " (with BOS)" : "", a->n_ctx, 2 * (size_t)a->n_ctx);
        return 0;
    }
    return big_little_defaults(a, in->model);
}

/* eval_params: the library's parameters from the options. */
static struct moe_eval_params eval_params(struct eval_args *a, const struct moe_model *model) {
    struct moe_eval_params ep = moe_eval_default_params();
    ep.n_ctx = a->n_ctx;
    ep.max_chunks = a->max_chunks;
    ep.n_threads = a->n_threads;
    ep.bos = moe_text_bos(model->tok);
    ep.unigram = a->unigram;
    ep.routing = a->routing;
    ep.store = moe_store_params_active(&a->store) ? &a->store : NULL;
    ep.device = a->gpu.device_spec;
    ep.device_options = &a->gpu;
    ep.n_batch = a->n_batch;
    ep.little_k = a->little_k > 0 ? a->little_k : 0;
    ep.gamma = a->gamma;
    if (isatty(STDERR_FILENO)) {
        ep.on_chunk = progress;
        ep.user = a;
    }
    return ep;
}

int moe_prep_eval(int argc, char **argv) {
    struct eval_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    struct eval_inputs in = {NULL, NULL, NULL, 0};
    int status = 1;
    if (!load_inputs(&a, &in)) goto done;
    struct moe_eval_params ep = eval_params(&a, in.model);
    struct moe_eval_result r;
    if (moe_eval_run(in.model, in.ref, in.ids, in.n_ids, &ep, &r)) {
        fprintf(stderr, PROG ": evaluation failed (see the message above)\n");
        goto done;
    }
    int n_threads = a.n_threads;
    if (!n_threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n < 1 ? 1 : n > 256 ? 256 : (int)n;
    }
    if (a.json) print_json(&a, n_threads, &r);
    else print_table(&a, &r);
    fflush(stdout);
    print_summary_line(&r, in.ref != NULL);
    moe_eval_result_clear(&r);
    status = 0;
done:
    free(in.ids);
    moe_model_free(in.ref);
    moe_model_free(in.model);
    return status;
}

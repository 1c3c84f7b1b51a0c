/*
 * sensitivity-cmd.c - `moe-prep sensitivity` and `moe-prep sensitivity
 * merge`: parse the options (one moe_opt table each), load the model and the
 * text, call moe_sensitivity_run / moe_sensitivity_merge (sensitivity.h) and
 * print the summary, JSON and CSV.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe-base.h"
#include "moe-bundle.h"
#include "moe-dataset.h"
#include "moe-file.h"
#include "moe-opt.h"
#include "moe-options.h"
#include "moe-prep.h"
#include "sensitivity.h"
#include "shard.h"
#include "token-stream.h"
#include "tool-util.h"

#define CMD "sensitivity"


struct sens_args {
    const char *model, *dataset, *out, *csv, *low, *base, *shard;
    int n_ctx, n_threads, resume, json, stop_after, shard_count;
    long long max_tokens;
    double checkpoint_every;
    enum moe_sens_metric metric;
    enum moe_sens_method method;
    struct moe_gpu_params gpu; /* --device and the GPU backend's options */
};

static const struct moe_opt k_opts[] = {
    {"dataset", 0, MOE_OPT_REQUIRED, "SPEC", "calibration text (a file or dataset card; see docs/cli.md)"},
    {"output", 'o', MOE_OPT_REQUIRED, "FILE", "output (.h5); progress is kept in FILE.partial"},
    {"low", 0, MOE_OPT_REQUIRED, "NAME", "the low precision (default: the smallest stored)"},
    {"base", 0, MOE_OPT_REQUIRED, "NAME", "the base precision (default: the next larger stored)"},
    {"metric", 0, MOE_OPT_REQUIRED, "kl|ppl|proxy",
     "what ranks the experts (default kl): mean KL divergence of\nthe next-token distributions, mean NLL increase "
     "(perplexity),\nor the gate-weighted output error of the expert on its own\ntokens (no recomputation; "
     "cheapest). kl and ppl also give\nthe proxy and its Spearman rank agreement with them."},
    {"ctx", 0, MOE_OPT_REQUIRED, "N", "tokens per sequence (default 256)"},
    {"max-tokens", 0, MOE_OPT_REQUIRED, "N", "use at most N tokens of the text (whole sequences)"},
    {"csv", 0, MOE_OPT_REQUIRED, "FILE", "also write one row per expert"},
    {"json", 0, MOE_OPT_NONE, NULL, "machine-readable summary on stdout"},
    {"resume", 0, MOE_OPT_NONE, NULL, "continue from FILE.partial (same settings) after an interruption"},
    {"checkpoint-every", 0, MOE_OPT_REQUIRED, "S", "save progress at most every S seconds (default 30)"},
    {"stop-after", 0, MOE_OPT_REQUIRED, "N", "save and stop after N sequences in this run (exit 3; --resume goes on)"},
    {"shard", 0, MOE_OPT_REQUIRED, "I/N",
     "sweep only the I-th of N slices of the experts (I from 1;\nexperts whose index is I-1 mod N) and write a shard "
     "file;\njoin the N files with `moe-prep sensitivity merge`. auto\ntakes I and N from a Slurm job array or a "
     "Kubernetes\nIndexed Job (see --shard-count; docs/distributed.md)"},
    {"shard-count", 0, MOE_OPT_REQUIRED, "N", "the number of shards, for --shard auto under Kubernetes\n"
                                              "(its Indexed Jobs give no count variable)"},
    {"method", 0, MOE_OPT_REQUIRED, "cached|naive", "naive = one full forward pass per expert (for comparison)"},
    {"threads", 't', MOE_OPT_REQUIRED, "N", "CPU threads (default: all)"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this text"},
    {NULL, 0, 0, NULL, NULL},
};

static void sens_usage(FILE *f) {
    fprintf(f, "usage: moe-prep sensitivity MODEL.moeb --dataset SPEC -o SENS.h5 [options]\n"
               "       moe-prep sensitivity merge SHARD.h5... -o SENS.h5 [--csv FILE] [--json]\n"
               "\n"
               "EdgeMoE's sweep: for every routed expert, the loss increase when that expert\n"
               "alone uses the --low precision and every other expert the --base precision,\n"
               "against the all-base model. Only what a change touches is recomputed (the\n"
               "expert's tokens in its layer, then the layers above it); the cost is printed in\n"
               "baseline-pass equivalents next to a naive sweep's. The result (L x E matrix and\n"
               "ranking) is a profile-format HDF5 file: `moe-prep profile report` draws its heat\n"
               "maps and `moe-prep bitwidth` searches with its ranking.\n"
               "\noptions:\n");
    moe_opt_help(f, k_opts);
    fprintf(f, "\n%s", moe_gpu_options_help());
    fprintf(f, "\n"
               "Interrupting (Ctrl-C) saves progress after the current sequence; --resume then\n"
               "gives the same result as an uninterrupted run. Each shard keeps its own\n"
               "FILE.partial and resumes on its own; merged shards equal one whole run.\n"
               "\n"
               "examples:\n"
               "  moe-prep sensitivity tiny.moeb --dataset wiki.txt --low q2_k --base q4_k -o sens.h5 --csv sens.csv\n"
               "  moe-prep sensitivity tiny.moeb --dataset wiki.txt --shard 2/4 -o sens-2.h5   # one of 4 machines\n"
               "  moe-prep sensitivity merge sens-1.h5 sens-2.h5 sens-3.h5 sens-4.h5 -o sens.h5\n");
}

/* choice: index of v in names[0..n), or -1 after a usage message. */
static int choice(const char *opt, const char *v, const char *const *names, int n, const char *want) {
    for (int j = 0; j < n; j++)
        if (!strcmp(v, names[j])) return j;
    fprintf(stderr, "moe-prep " CMD ": --%s wants %s, not \"%s\"\n", opt, want, v);
    return -1;
}

/* on_opt: one option into the arguments (moe_opt handler). */
static int on_opt(void *ctx, const struct moe_opt *o, const char *v) {
    struct sens_args *a = ctx;
    if (o < k_opts || o >= k_opts + sizeof k_opts / sizeof k_opts[0]) /* the device table */
        return moe_device_option("moe-prep " CMD, &a->gpu, o->name, v) ? 2 : 0;
    const char *n = o->name, *opt = o->key == 't' ? "-t" : NULL;
    char dashed[40];
    snprintf(dashed, sizeof dashed, "--%s", n);
    if (!opt) opt = dashed;
    long long x;
    static const char *const metrics[] = {"kl", "ppl", "proxy"}, *const methods[] = {"cached", "naive"};
    int k;
    if (!strcmp(n, "help")) return sens_usage(stdout), 1;
    if (!strcmp(n, "dataset")) a->dataset = v;
    else if (!strcmp(n, "output")) a->out = v;
    else if (!strcmp(n, "csv")) a->csv = v;
    else if (!strcmp(n, "low")) a->low = v;
    else if (!strcmp(n, "base")) a->base = v;
    else if (!strcmp(n, "shard")) a->shard = v;
    else if (!strcmp(n, "resume")) a->resume = 1;
    else if (!strcmp(n, "json")) a->json = 1;
    else if (!strcmp(n, "metric")) {
        if ((k = choice(n, v, metrics, 3, "kl, ppl or proxy")) < 0) return 2;
        a->metric = (enum moe_sens_metric)k;
    } else if (!strcmp(n, "method")) {
        if ((k = choice(n, v, methods, 2, "cached or naive")) < 0) return 2;
        a->method = (enum moe_sens_method)k;
    } else if (!strcmp(n, "checkpoint-every")) {
        if (!moe_tool_parse_double(CMD, opt, v, 0, 1e9, &a->checkpoint_every)) return 2;
    } else if (!strcmp(n, "max-tokens")) {
        if (!moe_tool_parse_ll(CMD, opt, v, 1, (long long)1 << 40, &a->max_tokens)) return 2;
    } else {
        const int is_ctx = !strcmp(n, "ctx"), is_stop = !strcmp(n, "stop-after"), is_count = !strcmp(n, "shard-count");
        const long long lo = is_ctx ? 4 : is_stop || is_count ? 1 : 0;
        const long long hi = is_ctx ? 1 << 20 : is_stop ? 1 << 30 : is_count ? 1000000 : 4096;
        if (!moe_tool_parse_ll(CMD, opt, v, lo, hi, &x)) return 2;
        *(is_ctx ? &a->n_ctx : is_stop ? &a->stop_after : is_count ? &a->shard_count : &a->n_threads) = (int)x;
    }
    return 0;
}

/* sens_parse: 0 ok, 1 help printed, 2 usage error (reported). */
static int sens_parse(int argc, char **argv, struct sens_args *a) {
    memset(a, 0, sizeof *a);
    a->n_ctx = 256;
    a->checkpoint_every = 30;
    a->gpu = moe_gpu_default_params();
    const struct moe_opt *tables[] = {k_opts, moe_gpu_option_table()};
    int pos = argc;
    int rc = moe_opt_parse("moe-prep " CMD, argc, argv, 1, tables, 2, on_opt, a, &pos);
    if (rc) return rc;
    if (!moe_device_built("moe-prep " CMD, a->gpu.device_spec)) return 2;
    if (argc - pos > 1) {
        fprintf(stderr, "moe-prep " CMD ": unexpected argument %s\n", argv[pos + 1]);
        return 2;
    }
    a->model = pos < argc ? argv[pos] : NULL;
    if (!a->model || !a->dataset || !a->out) {
        fprintf(stderr, "moe-prep " CMD ": needs MODEL.moeb, --dataset and -o (see --help)\n");
        return 2;
    }
    if (a->shard_count && !a->shard) {
        fprintf(stderr, "moe-prep " CMD ": --shard-count goes with --shard auto\n");
        return 2;
    }
    if (a->shard && a->csv) {
        fprintf(stderr, "moe-prep " CMD ": --csv needs every expert: give it to `moe-prep sensitivity merge`\n");
        return 2;
    }
    return 0;
}

/* pick_precision: *idx = the stored precision `name` (when given); 0 or exit status 1. */
static int pick_precision(const struct moe_model *m, const char *model, const char *opt, const char *name, int *idx) {
    uint32_t pi;
    if (!name) return 0;
    if (moe_bundle_find_precision(m->bundle, name, &pi)) {
        fprintf(stderr, "moe-prep " CMD ": --%s %s is not stored in %s (see moe-prep inspect)\n", opt, name, model);
        return 1;
    }
    *idx = (int)pi;
    return 0;
}

/* load_model: the bundle at the base precision and the precision pair; 0 or an exit status. */
static int load_model(const struct sens_args *a, struct moe_model **m, int *low, int *base) {
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = a->base;
    if (moe_model_load(a->model, &mp, m)) {
        fprintf(stderr, "moe-prep " CMD ": cannot load %s (see the message above)\n", a->model);
        return 1;
    }
    if (!(*m)->bundle || (*m)->n_expert_prec < 2) {
        fprintf(stderr, "moe-prep " CMD ": %s must be a bundle with at least two expert precisions; make one with "
                        "moe-prep quantize --experts q8_0,q4_k,q2_k\n", a->model);
        return 1;
    }
    moe_sens_default_pair(*m, low, base);
    if (pick_precision(*m, a->model, "low", a->low, low) || pick_precision(*m, a->model, "base", a->base, base))
        return 1;
    if (*low < 0 || *base < 0 || *low == *base) {
        fprintf(stderr, "moe-prep " CMD ": --low and --base must name two different stored precisions\n");
        return 2;
    }
    if (a->n_ctx > (*m)->cfg.max_pos) {
        fprintf(stderr, "moe-prep " CMD ": --ctx %d exceeds the model's context (%d)\n", a->n_ctx, (*m)->cfg.max_pos);
        return 2;
    }
    return 0;
}

/* load_sequences: the text as whole sequences of --ctx tokens, BOS first; 0 or an exit status. */
static int load_sequences(const struct sens_args *a, const struct moe_model *m, int32_t **seqs, int *n_seq,
                          size_t *n_ids) {
    int32_t *ids = NULL;
    struct moe_dataset_params dp = moe_dataset_default_params(); /* --max-tokens: read only what it needs */
    if (moe_text_load_tokens(m, NULL, a->dataset, &dp, a->max_tokens ? (size_t)a->max_tokens : 0, &ids, n_ids)) {
        fprintf(stderr, "moe-prep " CMD ": cannot read or tokenize the dataset %s (see the message above)\n",
                a->dataset);
        return 1;
    }
    if (!moe_tool_output_ok(CMD, a->out, m, &a->dataset, 1, NULL, 0) ||
        !moe_tool_output_ok(CMD, a->csv, m, &a->dataset, 1, &a->out, 1)) {
        free(ids);
        return 2; /* -o or --csv naming the bundle, the text, or each other */
    }
    size_t usable = *n_ids;
    if (a->max_tokens && (size_t)a->max_tokens < usable) usable = (size_t)a->max_tokens;
    *n_seq = (int)(usable / (size_t)a->n_ctx);
    if (*n_seq < 1) {
        fprintf(stderr, "moe-prep " CMD ": %s gives %zu tokens, fewer than one sequence of --ctx %d; use a longer "
                        "text or a smaller --ctx\n", a->dataset, usable, a->n_ctx);
        free(ids);
        return 1;
    }
    const int32_t bos = moe_text_bos(m->tok);
    for (int q = 0; bos >= 0 && q < *n_seq; q++) ids[(size_t)q * (size_t)a->n_ctx] = bos;
    *seqs = ids; /* the first n_seq x ctx ids are the sequences */
    return 0;
}

/* resolve_shard: --shard (and --shard-count) into index and count; 0 or exit status 2. */
static int resolve_shard(const struct sens_args *a, int n_experts, int *index, int *count) {
    char why[256];
    *index = 0, *count = 1;
    if (!a->shard) return 0;
    if (!moe_shard_parse(a->shard, a->shard_count, index, count, why, sizeof why)) {
        fprintf(stderr, "moe-prep " CMD ": --shard: %s\n", why);
        return 2;
    }
    if (*count > n_experts) {
        fprintf(stderr, "moe-prep " CMD ": --shard %s: %d shards for only %d experts\n", a->shard, *count, n_experts);
        return 2;
    }
    return 0;
}

/* n_routed: the routed experts of the model (MoE layers x experts). */
static int n_routed(const struct moe_model *m) {
    int n = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) n += m->cfg.layer_moe[l] ? m->cfg.n_expert : 0;
    return n;
}

static volatile sig_atomic_t g_signal;
static volatile int g_cancel;
static void on_signal(int sig) {
    g_signal = sig;
    g_cancel = 1;
}

/* on_progress: a progress line on stderr (and the resume point first). */
static void on_progress(int done, int total, double seconds, void *user) {
    int *seq0 = user;
    if (*seq0 < 0) { /* the first call: where this run starts */
        *seq0 = done;
        if (done > 0) fprintf(stderr, "sensitivity: resuming at sequence %d of %d\n", done, total);
        return;
    }
    fprintf(stderr, "\rsensitivity: %d/%d sequences, %.0f s", done, total, seconds);
    if (done < total && done > *seq0)
        fprintf(stderr, ", about %.0f s left  ", seconds / (done - *seq0) * (total - done));
    fflush(stderr);
}

/* The scores a summary prints: [4 x n] kl, dnll, proxy, score; order; 1-based rank (1 = most sensitive). */
struct scores {
    int n;
    double *v;
    int32_t *order, *rank;
};

static void scores_free(struct scores *c) {
    free(c->v);
    free(c->order);
    free(c->rank);
}

static int scores_make(const struct moe_sensitivity_result *r, struct scores *c) {
    const struct moe_sens_state *s = &r->state;
    c->n = s->n_moe * s->n_expert;
    c->v = malloc(sizeof(double) * (size_t)c->n * 4);
    c->order = malloc(sizeof(int32_t) * (size_t)c->n);
    c->rank = malloc(sizeof(int32_t) * (size_t)c->n);
    if (!c->v || !c->order || !c->rank) return 0;
    moe_sens_scores(s, MOE_SENS_KL, c->v);
    moe_sens_scores(s, MOE_SENS_PPL, c->v + c->n);
    moe_sens_scores(s, MOE_SENS_PROXY, c->v + 2 * c->n);
    moe_sens_scores(s, r->metric, c->v + 3 * c->n);
    moe_sens_order(c->v + 3 * c->n, c->n, c->order);
    for (int i = 0; i < c->n; i++) c->rank[c->order[i]] = c->n - i;
    return 1;
}

/* write_csv: one row per expert. */
static int write_csv(const struct moe_sensitivity_result *r, const char *path) {
    const struct moe_sens_state *s = &r->state;
    struct scores c = {0};
    struct moe_tmp_file t = {NULL, NULL, -1, NULL, 0}; /* exclusive, beside path: never through a planted link */
    FILE *f = scores_make(r, &c) && !moe_tmp_create(path, &t) ? moe_tmp_stream(&t) : NULL;
    int ok = 0;
    if (f) {
        const int n = c.n;
        fprintf(f, "layer,moe_layer,expert,routed,kl,dnll,proxy,score,rank\n");
        for (int i = 0; i < n; i++)
            fprintf(f, "%d,%d,%d,%lld,%.9g,%.9g,%.9g,%.9g,%d\n", r->moe_layer[i / s->n_expert], i / s->n_expert,
                    i % s->n_expert, (long long)s->routed[i], c.v[i], c.v[n + i], c.v[2 * n + i], c.v[3 * n + i],
                    c.rank[i]);
        ok = moe_tmp_commit(&t) == MOE_OK; /* flush, fsync, rename; removed on failure */
    }
    moe_tmp_discard(&t);
    if (!ok) fprintf(stderr, "moe-prep " CMD ": cannot write %s (see the message above)\n", path);
    scores_free(&c);
    return ok;
}

/* json_expert: one expert's entry. */
static cJSON *json_expert(const struct moe_sensitivity_result *r, const struct scores *c, int i) {
    const int E = r->state.n_expert, n = c->n;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "layer", r->moe_layer[i / E]);
    cJSON_AddNumberToObject(o, "moe_layer", i / E);
    cJSON_AddNumberToObject(o, "expert", i % E);
    cJSON_AddNumberToObject(o, "routed", (double)r->state.routed[i]);
    cJSON_AddNumberToObject(o, "kl", c->v[i]);
    cJSON_AddNumberToObject(o, "dnll", c->v[n + i]);
    cJSON_AddNumberToObject(o, "proxy", c->v[2 * n + i]);
    cJSON_AddNumberToObject(o, "score", c->v[3 * n + i]);
    cJSON_AddNumberToObject(o, "rank", c->rank[i]);
    return o;
}

/* print_json: the summary as one JSON object on stdout. */
static void print_json(const struct moe_sensitivity_result *r, const char *out, const struct scores *c) {
    const struct moe_sens_state *s = &r->state;
    const double eq = s->base_seconds > 0 ? s->seconds / s->base_seconds : NAN;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON_AddStringToObject(o, "dataset", r->dataset);
    cJSON_AddStringToObject(o, "out", out);
    cJSON_AddStringToObject(o, "low", r->low);
    cJSON_AddStringToObject(o, "base", r->base);
    cJSON_AddStringToObject(o, "metric", moe_sens_metric_name(r->metric));
    cJSON_AddStringToObject(o, "method", moe_sens_method_name(r->method));
    cJSON_AddNumberToObject(o, "ctx", s->n_ctx);
    cJSON_AddNumberToObject(o, "sequences", s->n_seq);
    cJSON_AddNumberToObject(o, "positions", (double)s->n_kl);
    cJSON_AddNumberToObject(o, "seconds", s->seconds);
    cJSON_AddNumberToObject(o, "baseline_seconds", s->base_seconds);
    if (r->shard_count > 1) { /* a shard: its place, no ranking (that needs every expert) */
        cJSON_AddNumberToObject(o, "shard", r->shard_index + 1);
        cJSON_AddNumberToObject(o, "shards", r->shard_count);
    } else {
        cJSON_AddNumberToObject(o, "forward_equivalents", isfinite(eq) ? eq : -1);
        cJSON_AddNumberToObject(o, "naive_forward_equivalents", c->n + 1);
        cJSON_AddNumberToObject(o, "base_nll", s->n_nll ? s->base_nll / (double)s->n_nll : 0.0);
        if (isfinite(r->spearman)) cJSON_AddNumberToObject(o, "spearman_proxy", r->spearman);
        else cJSON_AddNullToObject(o, "spearman_proxy");
        if (r->n_shards_merged) cJSON_AddNumberToObject(o, "shards_merged", r->n_shards_merged);
        cJSON *list = cJSON_AddArrayToObject(o, "experts");
        for (int i = 0; i < c->n; i++) cJSON_AddItemToArray(list, json_expert(r, c, i));
    }
    char *text = cJSON_PrintUnformatted(o);
    if (text) printf("%s\n", text);
    free(text);
    cJSON_Delete(o);
}

/* print_text: the matrix (MoE layers x experts) and the ranking ends. */
static void print_text(const struct moe_sensitivity_result *r, const char *out, const struct scores *c,
                       double seconds) {
    const struct moe_sens_state *s = &r->state;
    const int n = c->n, E = s->n_expert;
    const double eq = s->base_seconds > 0 ? s->seconds / s->base_seconds : NAN;
    const char *metric = moe_sens_metric_name(r->metric);
    const char *unit = r->metric == MOE_SENS_KL ? "mean KL, 1e-3 nats" : r->metric == MOE_SENS_PPL
                                                                          ? "mean NLL increase, 1e-3 nats"
                                                                          : "proxy per token, 1e-3";
    printf("sensitivity of %d experts: %s in place of %s, ranked by %s, %d sequences x %d tokens\n", n, r->low,
           r->base, metric, s->n_seq, s->n_ctx);
    if (r->n_shards_merged)
        printf("merged from %d shards (each swept every sequence for its share of the experts)\n", r->n_shards_merged);
    printf("cost: %.1f s in this sweep = %.2f baseline passes over the data (a naive sweep: %d), this run %.1f s\n",
           s->seconds, eq, n + 1, seconds);
    if (isfinite(r->spearman)) printf("proxy vs %s rank agreement (Spearman): %.3f\n", metric, r->spearman);
    printf("\n%s per MoE layer (rows) and expert (columns):\n      ", unit);
    for (int e = 0; e < E && e < 64; e++) printf(" %7d", e);
    printf("\n");
    for (int li = 0; li < s->n_moe; li++) {
        printf("  %3d ", li);
        for (int e = 0; e < E && e < 64; e++) printf(" %7.3f", 1e3 * c->v[3 * n + li * E + e]);
        printf("\n");
    }
    int show = n < 8 ? n : 8;
    printf("\nmost sensitive:");
    for (int i = 0; i < show; i++) printf(" L%dE%d", c->order[n - 1 - i] / E, c->order[n - 1 - i] % E);
    printf("\nleast sensitive:");
    for (int i = 0; i < show; i++) printf(" L%dE%d", c->order[i] / E, c->order[i] % E);
    printf("\nwrote %s\n", out);
}

/* print_summary: JSON, the shard line or the full text summary. */
static void print_summary(const struct moe_sensitivity_result *r, const char *out, int json, double seconds) {
    struct scores c = {0};
    if (!scores_make(r, &c)) goto done;
    if (json) print_json(r, out, &c);
    else if (r->shard_count > 1)
        printf("sensitivity shard %d/%d: %d of %d experts, %s in place of %s, %d sequences x %d tokens, %.1f s\n"
               "wrote %s; join the %d shard files with moe-prep sensitivity merge\n",
               r->shard_index + 1, r->shard_count, (c.n - r->shard_index + r->shard_count - 1) / r->shard_count, c.n,
               r->low, r->base, r->state.n_seq, r->state.n_ctx, r->state.seconds, out, r->shard_count);
    else print_text(r, out, &c, seconds);
done:
    scores_free(&c);
}

/* checkpoint_notes: what the CLI says about OUT.partial before the sweep. */
static void checkpoint_notes(const struct sens_args *a) {
    char *partial = NULL;
    struct moe_buf b = {0};
    if (moe_buf_printf(&b, "%s.partial", a->out) || !(partial = moe_buf_take(&b))) return;
    int exists = access(partial, F_OK) == 0;
    if (a->resume && !exists)
        fprintf(stderr, "moe-prep " CMD ": --resume: no %s; starting from the beginning\n", partial);
    else if (!a->resume && exists)
        fprintf(stderr, "moe-prep " CMD ": note: %s exists from an interrupted run; starting over (use --resume "
                        "to continue it)\n", partial);
    free(partial);
}

/* sweep: run the stage with Ctrl-C saving progress; the exit status. */
static int sweep(const struct sens_args *a, struct moe_model *m, const int32_t *seqs, int n_seq, size_t n_ids,
                 const struct moe_sens_params *sp, struct moe_sensitivity_result *r) {
    struct moe_sensitivity_params p = moe_sensitivity_default_params();
    int seq0 = -1;
    p.sweep = *sp;
    p.out = a->out;
    p.resume = a->resume;
    p.checkpoint_every = a->checkpoint_every;
    p.stop_after = a->stop_after;
    p.model_name = a->model;
    p.dataset_name = a->dataset;
    p.stream_tokens = (int64_t)n_ids;
    p.progress = on_progress;
    p.user = &seq0;
    p.cancel = &g_cancel;
    checkpoint_notes(a);
    double t0 = moe_now_s();
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    enum moe_status st = moe_sensitivity_run(m, seqs, n_seq, a->n_ctx, &p, r);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    fprintf(stderr, "\n");
    if (st) {
        fprintf(stderr, "moe-prep " CMD ": the sweep failed (see the message above)\n");
        return 1;
    }
    if (!r->complete) {
        fprintf(stderr, "moe-prep " CMD ": stopped after %d of %d sequences; progress is in %s.partial, continue "
                        "with --resume\n", r->state.next_seq, n_seq, a->out);
        return g_signal ? 130 : 3;
    }
    if (a->csv && !write_csv(r, a->csv)) return 1;
    print_summary(r, a->out, a->json, moe_now_s() - t0);
    return 0;
}

int moe_prep_sensitivity(int argc, char **argv) {
    struct sens_args a;
    int rc = sens_parse(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    moe_log_set_level(MOE_LOG_WARN);
    struct moe_model *m = NULL;
    int32_t *seqs = NULL;
    size_t n_ids = 0;
    int low = -1, base = -1, n_seq = 0, index = 0, count = 1;
    struct moe_sensitivity_result r = {0};
    if (!(rc = load_model(&a, &m, &low, &base)) &&
        !(rc = resolve_shard(&a, n_routed(m), &index, &count)))
        rc = load_sequences(&a, m, &seqs, &n_seq, &n_ids);
    if (!rc) {
        struct moe_sens_params sp = moe_sens_default_params();
        sp.low = low;
        sp.base = base;
        sp.metric = a.metric;
        sp.method = a.method;
        sp.n_threads = a.n_threads;
        sp.device = a.gpu.device_spec, sp.device_options = &a.gpu;
        sp.shard_index = index;
        sp.shard_count = count;
        rc = sweep(&a, m, seqs, n_seq, n_ids, &sp, &r);
    }
    moe_sensitivity_result_clear(&r);
    moe_model_free(m);
    free(seqs);
    return rc;
}

/* ---- moe-prep sensitivity merge --------------------------------------- */

struct merge_args {
    const char *out, *csv;
    int json;
};

static const struct moe_opt k_merge_opts[] = {
    {"output", 'o', MOE_OPT_REQUIRED, "FILE", "the merged sensitivity file (.h5), as one whole run writes"},
    {"csv", 0, MOE_OPT_REQUIRED, "FILE", "also write one row per expert"},
    {"json", 0, MOE_OPT_NONE, NULL, "machine-readable summary on stdout"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this text"},
    {NULL, 0, 0, NULL, NULL},
};

static void merge_usage(FILE *f) {
    fprintf(f, "usage: moe-prep sensitivity merge SHARD.h5... -o SENS.h5 [--csv FILE] [--json]\n"
               "\n"
               "Joins the shard files of `moe-prep sensitivity --shard I/N` (all N of them,\n"
               "any order) into the file one run over every expert writes: the same sums,\n"
               "matrices, ranking and Spearman agreement (bit for bit on the same build, CPU\n"
               "kind and thread count). Refuses shards of another model, dataset or settings,\n"
               "unfinished shards, a shard given twice and missing shards (exit 1).\n"
               "\noptions:\n");
    moe_opt_help(f, k_merge_opts);
    fprintf(f, "\nexample:\n  moe-prep sensitivity merge sens-1.h5 sens-2.h5 sens-3.h5 -o sens.h5 --csv sens.csv\n");
}

static int on_merge_opt(void *ctx, const struct moe_opt *o, const char *v) {
    struct merge_args *a = ctx;
    if (o->key == 'h') return merge_usage(stdout), 1;
    if (o->key == 'o') a->out = v;
    else if (!strcmp(o->name, "csv")) a->csv = v;
    else a->json = 1;
    return 0;
}

/* moe_prep_sensitivity_merge: `moe-prep sensitivity merge` (moe-prep.h). */
int moe_prep_sensitivity_merge(int argc, char **argv) {
    struct merge_args a = {0};
    const struct moe_opt *tables[] = {k_merge_opts};
    int pos = argc;
    int rc = moe_opt_parse("moe-prep " CMD " merge", argc, argv, 1, tables, 1, on_merge_opt, &a, &pos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!a.out || pos >= argc) {
        fprintf(stderr, "moe-prep " CMD " merge: needs SHARD.h5 files and -o (see --help)\n");
        return 2;
    }
    for (int i = pos; i < argc; i++)
        if (!strcmp(argv[i], a.out) || (a.csv && (!strcmp(argv[i], a.csv) || !strcmp(a.csv, a.out)))) {
            fprintf(stderr, "moe-prep " CMD " merge: -o and --csv must not name an input or each other\n");
            return 2;
        }
    moe_log_set_level(MOE_LOG_WARN);
    struct moe_sensitivity_result r;
    double t0 = moe_now_s();
    rc = 1;
    if (moe_sensitivity_merge((const char *const *)argv + pos, argc - pos, a.out, &r))
        fprintf(stderr, "moe-prep " CMD " merge: nothing written (see the message above)\n");
    else if (!a.csv || write_csv(&r, a.csv)) {
        print_summary(&r, a.out, a.json, moe_now_s() - t0);
        rc = 0;
    }
    moe_sensitivity_result_clear(&r);
    return rc;
}

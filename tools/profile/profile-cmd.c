/*
 * profile-cmd.c - `moe-prep profile MODEL --dataset SPEC -o PROFILE.h5`: the
 * CLI of the profile recorder (profile-record.h). Parses the options, loads
 * the model and the token stream, calls moe_profile_record, then
 * moe_profile_finish (derive, write, print). `profile merge` and `profile
 * report` are commands of their own (profile-merge-cmd.c, report-cmd.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe-dataset.h"
#include "moe-mmap.h"
#include "moe-opt.h"
#include "moe-options.h"
#include "moe-prep.h"
#include "moe-session.h"
#include "profile-record.h"
#include "profile-results.h"
#include "shard.h"
#include "token-stream.h"
#include "tool-util.h"

#define CMD "profile"
#define HELP_PRINTED 1 /* the handler's value after --help: exit 0 */

#define MAX_DATASETS 16

struct profile_args {
    const char *model, *dataset, *out, *csv_dir, *shard;
    const char *datasets[MAX_DATASETS]; /* every --dataset, in order; dataset: their names joined */
    int n_datasets;
    char dataset_label[2048];
    int shard_count; /* --shard-count (for --shard auto under Kubernetes); 0 = none */
    struct moe_profile_record_params rp;
    struct moe_profile_targets targets;
    struct moe_gpu_params gpu; /* --device and the GPU backend's options */
    int json, no_tuning;
};

enum {
    O_DATASET = 256, O_CTX, O_MAX_TOKENS, O_TARGET_LOW, O_TARGET_SKIP, O_TARGET_FALLBACK, O_BIG_LITTLE, O_HELDOUT,
    O_LOGITS, O_SHARD, O_SHARD_COUNT, O_CSV_DIR, O_NO_TUNING, O_JSON
};

static const struct moe_opt k_opts[] = {
    {"dataset", O_DATASET, MOE_OPT_REQUIRED, "SPEC",
     "text to profile on (dataset card or file; see docs/cli.md);\nrepeat it to profile on several, one after the other\n"
     "(calibrate on text like the workload)"},
    {"output", 'o', MOE_OPT_REQUIRED, "FILE", "profile file to write (HDF5; replaced atomically)"},
    {"ctx", O_CTX, MOE_OPT_REQUIRED, "N", "tokens per sequence, one forward pass each (default 256)"},
    {"max-tokens", O_MAX_TOKENS, MOE_OPT_REQUIRED, "N", "stop after N tokens (default: every whole sequence)"},
    {"target-low", O_TARGET_LOW, MOE_OPT_REQUIRED, "X", "HOBBIT: share of loads at low precision (default 0.30)"},
    {"target-skip", O_TARGET_SKIP, MOE_OPT_REQUIRED, "X", "HOBBIT: share of loads skipped (default 0.03)"},
    {"target-fallback", O_TARGET_FALLBACK, MOE_OPT_REQUIRED, "X",
     "MoBiLE: fallback ratio the suggested gamma gives (default 0.2)"},
    {"big-little-every", O_BIG_LITTLE, MOE_OPT_REQUIRED, "N",
     "run the little model (K/2 experts) on every Nth sequence\n(1 = all; 0 = never; default 16, or fewer so that at\n"
     "least 2 sequences are sampled); each sampled sequence\ncosts about 1.7 plain forward passes more"},
    {"heldout", O_HELDOUT, MOE_OPT_REQUIRED, "X",
     "share of the last sequences held out for hit rates and\npath-dictionary accuracy (default 0.2; 0 = none)"},
    {"router-logits", O_LOGITS, MOE_OPT_REQUIRED, "TYPE", "also keep every router logit in the trace: f16 or f32"},
    {"shard", O_SHARD, MOE_OPT_REQUIRED, "I/N",
     "profile only the I-th of N slices of the sequences (I from\n1); combine the shards with `moe-prep profile merge`;\nauto (or auto/N) takes I and N from a Slurm or Kubernetes\njob array (docs/distributed.md)"},
    {"shard-count", O_SHARD_COUNT, MOE_OPT_REQUIRED, "N",
     "the number of shards, for --shard auto under a Kubernetes\nIndexed Job (which gives the index only)"},
    {"csv-dir", O_CSV_DIR, MOE_OPT_REQUIRED, "DIR", "also write the summaries as CSV files into DIR"},
    {"no-tuning", O_NO_TUNING, MOE_OPT_NONE, NULL, "do not write the results into the bundle's tuning section"},
    {"threads", 't', MOE_OPT_REQUIRED, "N", "CPU threads (default: all online CPUs)"},
    {"json", O_JSON, MOE_OPT_NONE, NULL, "summary as JSON on stdout"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this text"},
    {NULL, 0, 0, NULL, NULL},
};

static void profile_usage(FILE *f) {
    fprintf(f, "usage: moe-prep profile MODEL --dataset SPEC -o PROFILE.h5 [options]\n"
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
               "\noptions:\n");
    moe_opt_help(f, k_opts);
    fprintf(f, "\n%s", moe_gpu_options_help());
    fprintf(f, "\nexamples:\n"
               "  moe-prep profile model.moeb --dataset wikitext.txt -o p.h5\n"
               "  moe-prep profile model.moeb --dataset c4.txt -o p.h5 --ctx 128 --max-tokens 20000 --json\n"
               "  moe-prep profile model.moeb --dataset code.txt --dataset chat.jsonl -o p.h5   # a mix\n"
               "  moe-prep profile model.moeb --dataset c4.txt -o s1.h5 --shard 1/2   # on one machine\n"
               "  moe-prep profile model.moeb --dataset c4.txt -o s2.h5 --shard 2/2   # on another\n"
               "  moe-prep profile merge s1.h5 s2.h5 -o p.h5 --bundle model.moeb\n"
               "  moe-prep profile report p.h5 -o p.html\n");
}

/* parse_shard: "I/N" with 1 <= I <= N, or auto / auto/N from a Slurm or
 * Kubernetes job array (tools/common/shard.h); count: --shard-count or 0. */
static int parse_shard(const char *v, int count, int *i, int *n) {
    char why[256];
    if (!moe_shard_parse(v, count, i, n, why, sizeof why)) {
        fprintf(stderr, "moe-prep profile: --shard: %s\n", why);
        return 0;
    }
    *i += 1; /* the recorder counts shards from 1 */
    return 1;
}

/* parse_int: an integer option value in [lo, hi]; 0 after a usage message. */
static int parse_int(const struct moe_opt *o, const char *v, long long lo, long long hi, long long *out) {
    char name[64];
    snprintf(name, sizeof name, "--%s", o->name);
    return moe_tool_parse_ll(CMD, name, v, lo, hi, out);
}

/* parse_num: a number option value in [lo, hi]; 0 after a usage message. */
static int parse_num(const struct moe_opt *o, const char *v, double lo, double hi, double *out) {
    char name[64];
    snprintf(name, sizeof name, "--%s", o->name);
    return moe_tool_parse_double(CMD, name, v, lo, hi, out);
}

/* on_option: one option into a; 2 after a usage message. */
static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    struct profile_args *a = ctx;
    long long n = 0;
    if (o < k_opts || o >= k_opts + sizeof k_opts / sizeof k_opts[0]) /* the device table */
        return moe_device_option("moe-prep " CMD, &a->gpu, o->name, v) ? 2 : 0;
    switch (o->key) {
    case 'h': profile_usage(stdout); return HELP_PRINTED;
    case O_DATASET:
        if (a->n_datasets == MAX_DATASETS) {
            fprintf(stderr, "moe-prep profile: at most %d --dataset options\n", MAX_DATASETS);
            return 2;
        }
        a->datasets[a->n_datasets++] = v;
        return 0;
    case 'o': a->out = v; return 0;
    case O_CSV_DIR: a->csv_dir = v; return 0;
    case O_NO_TUNING: a->no_tuning = 1; return 0;
    case O_JSON: a->json = 1; return 0;
    case O_CTX: if (!parse_int(o, v, 2, 1 << 20, &n)) return 2; a->rp.n_ctx = (int)n; return 0;
    case O_MAX_TOKENS: return parse_int(o, v, 1, (long long)1 << 40, &n) ? (a->rp.max_tokens = n, 0) : 2;
    case O_TARGET_LOW: return parse_num(o, v, 0, 1, &a->targets.low) ? 0 : 2;
    case O_TARGET_SKIP: return parse_num(o, v, 0, 1, &a->targets.skip) ? 0 : 2;
    case O_TARGET_FALLBACK: return parse_num(o, v, 0, 1, &a->targets.fallback) ? 0 : 2;
    case O_HELDOUT: return parse_num(o, v, 0, 0.9, &a->targets.heldout) ? 0 : 2;
    case O_BIG_LITTLE: return parse_int(o, v, 0, 1 << 30, &n) ? (a->rp.big_little_every = (int)n, 0) : 2;
    case 't': return parse_int(o, v, 1, 256, &n) ? (a->rp.n_threads = (int)n, 0) : 2;
    case O_SHARD: a->shard = v; return 0; /* parsed once --shard-count is known */
    case O_SHARD_COUNT: return parse_int(o, v, 1, 1000000, &n) ? (a->shard_count = (int)n, 0) : 2;
    case O_LOGITS:
        if (!strcmp(v, "f16") || !strcmp(v, "f32")) {
            a->rp.logits = v[1] == '1' ? MOE_PROFILE_LOGITS_F16 : MOE_PROFILE_LOGITS_F32;
            return 0;
        }
        fprintf(stderr, "moe-prep profile: --router-logits wants f16 or f32, not \"%s\"\n", v);
        return 2;
    }
    return 2;
}

/* parse_args: 0 ok, 1 help printed, 2 usage error (reported). */
static int parse_args(int argc, char **argv, struct profile_args *a) {
    memset(a, 0, sizeof *a);
    a->rp = moe_profile_record_default_params();
    a->targets = moe_profile_default_targets();
    a->gpu = moe_gpu_default_params();
    const struct moe_opt *tables[] = {k_opts, moe_gpu_option_table()};
    int first = argc;
    int rc = moe_opt_parse("moe-prep " CMD, argc, argv, 1, tables, 2, on_option, a, &first);
    if (rc) return rc;
    if (!moe_device_built("moe-prep " CMD, a->gpu.device_spec)) return 2;
    a->rp.device = a->gpu.device_spec, a->rp.device_options = &a->gpu;
    if (first < argc) a->model = argv[first];
    for (int i = 0; i < a->n_datasets; i++) { /* the label the profile records: the names joined by " + " */
        const size_t used = strlen(a->dataset_label);
        snprintf(a->dataset_label + used, sizeof a->dataset_label - used, "%s%s", i ? " + " : "", a->datasets[i]);
    }
    if (a->n_datasets) a->dataset = a->n_datasets == 1 ? a->datasets[0] : a->dataset_label;
    if (argc - first > 1) {
        fprintf(stderr, "moe-prep profile: one MODEL only (\"%s\" and \"%s\")\n", a->model, argv[first + 1]);
        return 2;
    }
    if (!a->model || !a->dataset || !a->out) {
        fprintf(stderr, "moe-prep profile: %s (see moe-prep profile --help)\n",
                !a->model ? "no MODEL given" : !a->dataset ? "no --dataset SPEC given" : "no -o FILE given");
        return 2;
    }
    if (a->shard_count && !a->shard) {
        fprintf(stderr, "moe-prep profile: --shard-count goes with --shard auto\n");
        return 2;
    }
    if (a->shard && !parse_shard(a->shard, a->shard_count, &a->rp.shard_i, &a->rp.shard_n)) return 2;
    if (a->targets.low + a->targets.skip > 1) {
        fprintf(stderr, "moe-prep profile: --target-low + --target-skip exceed 1\n");
        return 2;
    }
    a->rp.model_path = a->model, a->rp.dataset = a->dataset;
    return 0;
}

/* on_progress: the sequence count, speed and ETA on a terminal. */
static void on_progress(int done, int total, int64_t tokens, double seconds, void *user) {
    (void)user;
    fprintf(stderr, "\rmoe-prep profile: sequence %d/%d, %.1f tok/s, ETA %.0f s   ", done, total,
            seconds > 0 ? tokens / seconds : 0.0, seconds / done * (total - done));
    if (done == total) fputc('\n', stderr);
}

/* load_tokens: the model's token stream of the datasets, one after the
 * other (each as moe_text_load_tokens gives it); with --max-tokens only the
 * text those tokens (and one sequence more) need, shared evenly between the
 * datasets. 0 ok, else the exit status. */
static int load_tokens(const struct profile_args *a, const struct moe_model *model, int32_t **ids, size_t *n_ids) {
    if (a->rp.n_ctx > model->cfg.max_pos) {
        fprintf(stderr, "moe-prep profile: --ctx %d exceeds the context of %s (max_position_embeddings %d)\n",
                a->rp.n_ctx, a->model, model->cfg.max_pos);
        return 1;
    }
    struct moe_dataset_params dp = moe_dataset_default_params();
    const int n = a->n_datasets;
    size_t limit = a->rp.max_tokens ? ((size_t)a->rp.max_tokens + (size_t)n - 1) / (size_t)n + (size_t)a->rp.n_ctx : 0;
    *ids = NULL, *n_ids = 0;
    for (int i = 0; i < n; i++) {
        int32_t *part = NULL;
        size_t m = 0;
        if (moe_text_load_tokens(model, NULL, a->datasets[i], &dp, limit, &part, &m)) {
            fprintf(stderr, "moe-prep profile: cannot read or tokenize %s (see the message above)\n", a->datasets[i]);
            free(*ids);
            *ids = NULL;
            return 1;
        }
        if (n > 1 && limit && m > limit) m = limit; /* each dataset its share */
        int32_t *all = n == 1 ? part : realloc(*ids, sizeof(int32_t) * (*n_ids + m));
        if (!all) {
            fprintf(stderr, "moe-prep profile: out of memory for %zu tokens\n", *n_ids + m);
            free(part);
            free(*ids);
            *ids = NULL;
            return 1;
        }
        if (n > 1) {
            memcpy(all + *n_ids, part, sizeof(int32_t) * m);
            free(part);
        }
        *ids = all, *n_ids += m;
    }
    return 0;
}

/* report_run: the closing lines on stderr. */
static void report_run(const struct profile_args *a, const struct moe_profile_record_info *in, int status) {
    fprintf(stderr, "moe-prep profile: %d sequences, %lld tokens in %.2f s (%.1f tok/s)%s; %s %s\n", in->seq1 - in->seq0,
            (long long)in->tokens, in->seconds, in->seconds > 0 ? in->tokens / in->seconds : 0.0,
            in->big_little_every ? " with the big-little pass" : "", status ? "did not finish" : "wrote", a->out);
    if (!status && (in->seq0 != 0 || in->seq1 != in->n_seq_all))
        fprintf(stderr, "moe-prep profile: this is shard %d/%d (sequences %d..%d of %d); the bundle's tuning is "
                        "written when the shards are merged (moe-prep profile merge ... --bundle MODEL)\n",
                a->rp.shard_i, a->rp.shard_n, in->seq0, in->seq1 - 1, in->n_seq_all);
}

int moe_prep_profile(int argc, char **argv) {
    struct profile_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == HELP_PRINTED ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    struct moe_model *model = NULL;
    struct moe_profile *p = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int status = 1;
    struct moe_model_params mp = moe_model_default_params();
    if (moe_model_load(a.model, &mp, &model)) {
        fprintf(stderr, "moe-prep profile: cannot load the model from %s (see the message above)\n", a.model);
        goto done;
    }
    if (!moe_tool_output_ok(CMD, a.out, model, a.datasets, a.n_datasets, NULL, 0)) { /* -o naming the model or text */
        status = 2;
        goto done;
    }
    if (load_tokens(&a, model, &ids, &n_ids)) goto done;
    if (isatty(STDERR_FILENO)) a.rp.progress = on_progress;
    struct moe_profile_record_info info;
    enum moe_status st = moe_profile_record(model, ids, n_ids, &a.rp, &p, &info);
    if (st) {
        fprintf(stderr, "moe-prep profile: cannot record the profile: %s (see the message above)\n",
                moe_status_str(st));
        goto done;
    }
    const int whole = info.seq0 == 0 && info.seq1 == info.n_seq_all;
    if (!a.no_tuning && whole && !model->bundle && !moe_is_dir(a.model))
        fprintf(stderr, "moe-prep profile: %s is not a bundle, so it has no tuning section: the results (T1/T2, the "
                        "placement order, the path dictionaries, gamma) are in %s only; to run with them, quantize "
                        "the model (moe-prep quantize %s -o MODEL.moeb) and profile the bundle\n",
                a.model, a.out, a.model);
    struct moe_profile_outputs o = {a.out, a.csv_dir, !a.no_tuning && whole && model->bundle ? a.model : NULL,
                                    a.json};
    struct moe_profile_labels lb = {a.model, a.dataset, a.out, a.rp.n_ctx, info.seconds};
    status = moe_profile_finish(p, &a.targets, &o, &lb, CMD);
    report_run(&a, &info, status);
done:
    moe_profile_free(p);
    free(ids);
    moe_model_free(model);
    return status;
}

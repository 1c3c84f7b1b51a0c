/* profile-merge-cmd.c - `moe-prep profile merge SHARD.h5... -o PROFILE.h5`:
 * the CLI of moe_profile_merge_files (profile-merge.h) followed by
 * moe_profile_finish (derive, write, print), as one run would end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-opt.h"
#include "moe-prep.h"
#include "profile-merge.h"
#include "profile-results.h"
#include "tool-util.h"

#define CMD "profile merge"
#define HELP_PRINTED 1

struct merge_args {
    const char *const *in;
    int n_in;
    const char *out, *csv_dir, *bundle;
    struct moe_profile_targets targets;
    int set_low, set_skip, set_heldout, set_fallback; /* given on the command line */
    int json;
};

enum { O_BUNDLE = 256, O_TARGET_LOW, O_TARGET_SKIP, O_TARGET_FALLBACK, O_HELDOUT, O_CSV_DIR, O_JSON };

static const struct moe_opt k_opts[] = {
    {"output", 'o', MOE_OPT_REQUIRED, "FILE", "the merged profile (HDF5; replaced atomically)"},
    {"bundle", O_BUNDLE, MOE_OPT_REQUIRED, "FILE.moeb",
     "write T1/T2, popularity order, path dictionaries and gamma\ninto this bundle's tuning section"},
    {"target-low", O_TARGET_LOW, MOE_OPT_REQUIRED, "X", "as for `moe-prep profile` (default: the first shard's)"},
    {"target-skip", O_TARGET_SKIP, MOE_OPT_REQUIRED, "X", "as for `moe-prep profile` (default: the first shard's)"},
    {"target-fallback", O_TARGET_FALLBACK, MOE_OPT_REQUIRED, "X",
     "as for `moe-prep profile` (default: the first shard's)"},
    {"heldout", O_HELDOUT, MOE_OPT_REQUIRED, "X", "as for `moe-prep profile` (default: the first shard's)"},
    {"csv-dir", O_CSV_DIR, MOE_OPT_REQUIRED, "DIR", "also write the summaries as CSV files into DIR"},
    {"json", O_JSON, MOE_OPT_NONE, NULL, "summary as JSON on stdout"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this text"},
    {NULL, 0, 0, NULL, NULL},
};

static void merge_usage(FILE *f) {
    fprintf(f, "usage: moe-prep profile merge SHARD.h5... -o PROFILE.h5 [options]\n"
               "\n"
               "Combines the shards written by `moe-prep profile --shard I/N` into one profile,\n"
               "the same as a single run over all the sequences gives: the traces are joined in\n"
               "sequence order, counts and sums added, and every result derived again. The\n"
               "shards must come from the same model, data and settings and cover adjacent\n"
               "ranges of sequences (merging some shards first is fine).\n"
               "\noptions:\n");
    moe_opt_help(f, k_opts);
    fprintf(f, "\nexample:\n"
               "  moe-prep profile merge s1.h5 s2.h5 s3.h5 -o all.h5 --bundle model.moeb\n");
}

/* target: a target option's value into *dst, noting that it was given. */
static int target(const struct moe_opt *o, const char *v, double hi, double *dst, int *set) {
    char name[64];
    snprintf(name, sizeof name, "--%s", o->name);
    *set = 1;
    return moe_tool_parse_double(CMD, name, v, 0, hi, dst) ? 0 : 2;
}

/* on_option: one option into a; 2 after a usage message. */
static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    struct merge_args *a = ctx;
    switch (o->key) {
    case 'h': merge_usage(stdout); return HELP_PRINTED;
    case 'o': a->out = v; return 0;
    case O_BUNDLE: a->bundle = v; return 0;
    case O_CSV_DIR: a->csv_dir = v; return 0;
    case O_JSON: a->json = 1; return 0;
    case O_TARGET_LOW: return target(o, v, 1, &a->targets.low, &a->set_low);
    case O_TARGET_SKIP: return target(o, v, 1, &a->targets.skip, &a->set_skip);
    case O_TARGET_FALLBACK: return target(o, v, 1, &a->targets.fallback, &a->set_fallback);
    case O_HELDOUT: return target(o, v, 0.9, &a->targets.heldout, &a->set_heldout);
    }
    return 2;
}

/* parse_args: 0 ok, 1 help printed, 2 usage error (reported). a->in points into argv. */
static int parse_args(int argc, char **argv, struct merge_args *a) {
    memset(a, 0, sizeof *a);
    const struct moe_opt *tables[] = {k_opts};
    int first = argc;
    int rc = moe_opt_parse("moe-prep " CMD, argc, argv, 1, tables, 1, on_option, a, &first);
    if (rc) return rc;
    a->in = (const char *const *)argv + first, a->n_in = argc - first;
    if (!a->n_in || !a->out) {
        fprintf(stderr, "moe-prep profile merge: %s (see moe-prep profile merge --help)\n",
                !a->n_in ? "no shard files given" : "no -o FILE given");
        return 2;
    }
    return 0;
}

/* pick_targets: the first shard's targets, overridden by the options; 0 when
 * they do not fit together (reported). */
static int pick_targets(const struct merge_args *a, struct moe_profile_targets *t) {
    if (a->set_low) t->low = a->targets.low;
    if (a->set_skip) t->skip = a->targets.skip;
    if (a->set_heldout) t->heldout = a->targets.heldout;
    if (a->set_fallback) t->fallback = a->targets.fallback;
    if (t->low + t->skip > 1) {
        fprintf(stderr, "moe-prep profile merge: --target-low + --target-skip exceed 1\n");
        return 0;
    }
    return 1;
}

int moe_prep_profile_merge(int argc, char **argv) {
    struct merge_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == HELP_PRINTED ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    if (!moe_tool_output_ok(CMD, a.out, NULL, NULL, 0, a.in, (size_t)a.n_in) ||
        !moe_tool_output_ok(CMD, a.out, NULL, NULL, 0, &a.bundle, 1))
        return 2; /* -o naming a shard or the bundle would replace it */
    struct moe_profile *m = NULL;
    struct moe_profile_targets t;
    enum moe_status st = moe_profile_merge_files(a.in, a.n_in, &m, &t);
    if (st) {
        fprintf(stderr, "moe-prep profile merge: cannot merge the shards: %s (see the message above)\n",
                moe_status_str(st));
        return 1;
    }
    int status = 1;
    if (!pick_targets(&a, &t)) goto done;
    const int64_t *range = NULL, *record = NULL;
    int nd = 0, n_ctx = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    if (!moe_profile_get_i64(m, "shard", NULL, NULL, &range) && (range[0] != 0 || range[1] != range[2]))
        fprintf(stderr, "moe-prep profile merge: the shards cover sequences %lld..%lld of %lld; merge the rest "
                        "too for the whole run\n", (long long)range[0], (long long)range[1] - 1, (long long)range[2]);
    if (!moe_profile_get_i64(m, MOE_PROFILE_CONFIG_PREFIX "record", &nd, dims, &record) && nd == 1 && dims[0] >= 1)
        n_ctx = (int)record[0];
    struct moe_profile_outputs o = {a.out, a.csv_dir, a.bundle, a.json};
    struct moe_profile_labels lb = {m->model_path, m->dataset, a.out, n_ctx, -1};
    status = moe_profile_finish(m, &t, &o, &lb, CMD);
    if (!status)
        fprintf(stderr, "moe-prep profile merge: %d shards, %d sequences, %lld tokens; wrote %s\n", a.n_in, m->n_seq,
                (long long)moe_profile_n_tokens(m), a.out);
done:
    moe_profile_free(m);
    return status;
}

/* profile-merge.c - `moe-prep profile merge`: combine the shards of one
 * profiling run (`moe-prep profile --shard I/N`) into the profile a single run
 * gives: shards are put in sequence order by their `shard` ranges, which must
 * join without gaps or overlaps, then merged (moe_profile_merge adds the counts
 * and sums) and the results derived again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-prep.h"
#include "profile-cli.h"
#include "tool-util.h"

struct merge_args {
    const char **in;
    int n_in;
    const char *out, *csv_dir, *bundle;
    struct moe_profile_targets targets;
    int set_low, set_skip, set_heldout, set_fallback; /* given on the command line */
    int json;
};

static void merge_usage(FILE *f) {
    fprintf(f,
            "usage: moe-prep profile merge SHARD.h5... -o PROFILE.h5 [options]\n"
            "\n"
            "Combines the shards written by `moe-prep profile --shard I/N` into one profile,\n"
            "the same as a single run over all the sequences gives: the traces are joined in\n"
            "sequence order, counts and sums added, and every result derived again. The\n"
            "shards must come from the same model, data and settings and cover adjacent\n"
            "ranges of sequences (merging some shards first is fine).\n"
            "\n"
            "options:\n"
            "  -o, --out FILE        the merged profile (HDF5; replaced atomically)\n"
            "  --bundle FILE.moeb    write T1/T2, popularity order, path dictionaries and gamma\n"
            "                        into this bundle's tuning section\n"
            "  --target-low X, --target-skip X, --target-fallback X, --heldout X\n"
            "                        as for `moe-prep profile` (default: the first shard's)\n"
            "  --csv-dir DIR         also write the summaries as CSV files into DIR\n"
            "  --json                summary as JSON on stdout\n"
            "  -h, --help            this text\n"
            "\n"
            "example:\n"
            "  moe-prep profile merge s1.h5 s2.h5 s3.h5 -o all.h5 --bundle model.moeb\n");
}

static int parse_num(const char *o, const char *v, double lo, double hi, double *out) {
    return moe_tool_parse_double("profile merge", o, v, lo, hi, out);
}

/* parse_args: 0 ok, 1 help printed, 2 usage error (reported). a->in is allocated. */
static int parse_args(int argc, char **argv, struct merge_args *a) {
    memset(a, 0, sizeof *a);
    if (!(a->in = calloc((size_t)argc, sizeof *a->in))) {
        fprintf(stderr, "moe-prep profile merge: out of memory\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
#define NEXT() \
    (i + 1 < argc ? argv[++i] : (fprintf(stderr, "moe-prep profile merge: %s needs a value\n", o), (char *)NULL))
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            merge_usage(stdout);
            return 1;
        } else if (!strcmp(o, "-o") || !strcmp(o, "--out")) {
            if (!(a->out = NEXT())) return 2;
        } else if (!strcmp(o, "--bundle")) {
            if (!(a->bundle = NEXT())) return 2;
        } else if (!strcmp(o, "--csv-dir")) {
            if (!(a->csv_dir = NEXT())) return 2;
        } else if (!strcmp(o, "--target-low")) {
            if (!(v = NEXT()) || !parse_num(o, v, 0, 1, &a->targets.low)) return 2;
            a->set_low = 1;
        } else if (!strcmp(o, "--target-skip")) {
            if (!(v = NEXT()) || !parse_num(o, v, 0, 1, &a->targets.skip)) return 2;
            a->set_skip = 1;
        } else if (!strcmp(o, "--target-fallback")) {
            if (!(v = NEXT()) || !parse_num(o, v, 0, 1, &a->targets.fallback)) return 2;
            a->set_fallback = 1;
        } else if (!strcmp(o, "--heldout")) {
            if (!(v = NEXT()) || !parse_num(o, v, 0, 0.9, &a->targets.heldout)) return 2;
            a->set_heldout = 1;
        } else if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (o[0] == '-') {
            fprintf(stderr, "moe-prep profile merge: unknown option \"%s\" (see moe-prep profile merge --help)\n", o);
            return 2;
        } else {
            a->in[a->n_in++] = o;
        }
#undef NEXT
    }
    if (!a->n_in || !a->out) {
        fprintf(stderr, "moe-prep profile merge: %s (see moe-prep profile merge --help)\n",
                !a->n_in ? "no shard files given" : "no -o FILE given");
        return 2;
    }
    return 0;
}

/* A shard read from disk with its sequence range. */
struct shard {
    const char *path;
    struct moe_profile *p;
    int64_t range[3]; /* first, end, total sequences */
};

static int cmp_shard(const void *x, const void *y) {
    const struct shard *a = x, *b = y;
    return a->range[0] < b->range[0] ? -1 : a->range[0] > b->range[0];
}

/* shard_range: the `shard` array of p, checked; 0 (reported) if absent or bad. */
static int shard_range(const char *path, const struct moe_profile *p, int64_t *range) {
    int nd = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    const int64_t *r = NULL;
    if (moe_profile_get_i64(p, "shard", &nd, dims, &r) || nd != 1 || dims[0] != 3) {
        fprintf(stderr, "moe-prep profile merge: %s has no sequence range (/derived/shard); it was not written by "
                        "`moe-prep profile`\n", path);
        return 0;
    }
    if (r[0] < 0 || r[1] < r[0] || r[2] < r[1] || r[1] - r[0] != p->n_seq) {
        fprintf(stderr, "moe-prep profile merge: %s: its sequence range %lld..%lld of %lld does not match its %d "
                        "sequences\n", path, (long long)r[0], (long long)r[1], (long long)r[2], p->n_seq);
        return 0;
    }
    memcpy(range, r, 3 * sizeof *range);
    return 1;
}

int moe_prep_profile_merge(int argc, char **argv) {
    struct merge_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        free(a.in);
        return rc == 1 ? 0 : 2;
    }
    moe_log_set_level(MOE_LOG_WARN);
    int status = 1;
    enum moe_status st;
    if (!moe_tool_output_ok("profile merge", a.out, NULL, NULL, 0, a.in, (size_t)a.n_in) ||
        !moe_tool_output_ok("profile merge", a.out, NULL, NULL, 0, &a.bundle, 1)) {
        free(a.in); /* -o naming a shard or the bundle would replace it */
        return 2;
    }
    struct shard *sh = calloc((size_t)a.n_in, sizeof *sh);
    if (!sh) {
        fprintf(stderr, "moe-prep profile merge: out of memory\n");
        goto done;
    }
    for (int i = 0; i < a.n_in; i++) {
        sh[i].path = a.in[i];
        if ((st = moe_profile_read(a.in[i], &sh[i].p))) {
            fprintf(stderr, "moe-prep profile merge: cannot read %s: %s (see the message above)\n", a.in[i],
                    moe_status_str(st));
            goto done;
        }
        if (!shard_range(a.in[i], sh[i].p, sh[i].range)) goto done;
    }
    qsort(sh, (size_t)a.n_in, sizeof *sh, cmp_shard);
    for (int i = 1; i < a.n_in; i++) {
        const struct shard *x = &sh[i - 1], *y = &sh[i];
        if (y->range[2] != x->range[2] || y->range[0] != x->range[1]) {
            fprintf(stderr, "moe-prep profile merge: %s (sequences %lld..%lld of %lld) and %s (%lld..%lld of %lld) "
                            "%s\n", x->path, (long long)x->range[0], (long long)x->range[1] - 1,
                    (long long)x->range[2], y->path, (long long)y->range[0], (long long)y->range[1] - 1,
                    (long long)y->range[2],
                    y->range[2] != x->range[2] ? "come from runs of different length"
                    : y->range[0] < x->range[1] ? "overlap"
                                                : "leave a gap: a shard is missing");
            goto done;
        }
    }

    /* targets: the first shard's, then the options */
    struct moe_profile_targets t = moe_profile_default_targets();
    const double *tg = NULL;
    int nd = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    if (!moe_profile_get_f64(sh[0].p, "targets", &nd, dims, &tg) && nd == 1 && dims[0] == 4)
        t = (struct moe_profile_targets){tg[0], tg[1], tg[2], tg[3]};
    if (a.set_low) t.low = a.targets.low;
    if (a.set_skip) t.skip = a.targets.skip;
    if (a.set_heldout) t.heldout = a.targets.heldout;
    if (a.set_fallback) t.fallback = a.targets.fallback;
    if (t.low + t.skip > 1) {
        fprintf(stderr, "moe-prep profile merge: --target-low + --target-skip exceed 1\n");
        goto done;
    }

    struct moe_profile *m = sh[0].p;
    for (int i = 1; i < a.n_in; i++)
        if ((st = moe_profile_merge(m, sh[i].p))) {
            fprintf(stderr, "moe-prep profile merge: cannot merge %s into %s: %s (see the message above)\n",
                    sh[i].path, sh[0].path, moe_status_str(st));
            goto done;
        }
    int64_t range[3] = {sh[0].range[0], sh[a.n_in - 1].range[1], sh[0].range[2]}, d1[1] = {3};
    if ((st = moe_profile_put_i64(m, "shard", 1, d1, range))) {
        fprintf(stderr, "moe-prep profile merge: %s\n", moe_status_str(st));
        goto done;
    }
    if (range[0] != 0 || range[1] != range[2])
        fprintf(stderr, "moe-prep profile merge: the shards cover sequences %lld..%lld of %lld; merge the rest "
                        "too for the whole run\n", (long long)range[0], (long long)range[1] - 1, (long long)range[2]);
    const int64_t *record = NULL;
    int n_ctx = 0;
    if (!moe_profile_get_i64(m, MOE_PROFILE_CONFIG_PREFIX "record", &nd, dims, &record) && nd == 1 && dims[0] >= 1)
        n_ctx = (int)record[0];
    struct moe_profile_labels lb = {m->model_path, m->dataset, a.out, n_ctx, -1};
    status = moe_profile_finish(m, &t, a.out, a.csv_dir, a.bundle, a.json, &lb, "profile merge");
    if (!status)
        fprintf(stderr, "moe-prep profile merge: %d shards, %d sequences, %lld tokens; wrote %s\n", a.n_in, m->n_seq,
                (long long)moe_profile_n_tokens(m), a.out);
done:
    for (int i = 0; sh && i < a.n_in; i++) moe_profile_free(sh[i].p);
    free(sh);
    free(a.in);
    return status;
}

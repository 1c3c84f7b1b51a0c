/* profile-merge.c - the shards of one profiling run joined (profile-merge.h):
 * read, ordered by their `shard` ranges, checked to join without gaps or
 * overlaps, then merged by moe_profile_merge (counts and sums added). */
#include <stdlib.h>
#include <string.h>

#include "profile-merge.h"

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

/* shard_range: the `shard` array of p, checked; MOE_ERR_FORMAT (logged) if absent or bad. */
static enum moe_status shard_range(const char *path, const struct moe_profile *p, int64_t *range) {
    int nd = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    const int64_t *r = NULL;
    if (moe_profile_get_i64(p, "shard", &nd, dims, &r) || nd != 1 || dims[0] != 3) {
        MOE_LOGE("%s has no sequence range (/derived/shard); it was not written by `moe-prep profile`", path);
        return MOE_ERR_FORMAT;
    }
    if (r[0] < 0 || r[1] < r[0] || r[2] < r[1] || r[1] - r[0] != p->n_seq) {
        MOE_LOGE("%s: its sequence range %lld..%lld of %lld does not match its %d sequences", path, (long long)r[0],
                 (long long)r[1], (long long)r[2], p->n_seq);
        return MOE_ERR_FORMAT;
    }
    memcpy(range, r, 3 * sizeof *range);
    return MOE_OK;
}

/* check_joins: sorted shards cover adjacent ranges of one run. */
static enum moe_status check_joins(const struct shard *sh, int n) {
    for (int i = 1; i < n; i++) {
        const struct shard *x = &sh[i - 1], *y = &sh[i];
        if (y->range[2] != x->range[2] || y->range[0] != x->range[1]) {
            MOE_LOGE("%s (sequences %lld..%lld of %lld) and %s (%lld..%lld of %lld) %s", x->path,
                     (long long)x->range[0], (long long)x->range[1] - 1, (long long)x->range[2], y->path,
                     (long long)y->range[0], (long long)y->range[1] - 1, (long long)y->range[2],
                     y->range[2] != x->range[2] ? "come from runs of different length"
                     : y->range[0] < x->range[1] ? "overlap"
                                                 : "leave a gap: a shard is missing");
            return MOE_ERR_FORMAT;
        }
    }
    return MOE_OK;
}

/* first_shard_targets: the targets array of p, or the defaults. */
static struct moe_profile_targets first_shard_targets(const struct moe_profile *p) {
    const double *tg = NULL;
    int nd = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    if (!moe_profile_get_f64(p, "targets", &nd, dims, &tg) && nd == 1 && dims[0] == 4)
        return (struct moe_profile_targets){tg[0], tg[1], tg[2], tg[3]};
    return moe_profile_default_targets();
}

enum moe_status moe_profile_merge_files(const char *const *paths, int n, struct moe_profile **out,
                                        struct moe_profile_targets *first_targets) {
    *out = NULL;
    if (n < 1) {
        MOE_LOGE("no shard files given");
        return MOE_ERR_INVALID;
    }
    enum moe_status st = MOE_OK;
    struct shard *sh = calloc((size_t)n, sizeof *sh);
    if (!sh) return MOE_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        sh[i].path = paths[i];
        if ((st = moe_profile_read(paths[i], &sh[i].p))) {
            MOE_LOGE("cannot read %s: %s (see the message above)", paths[i], moe_status_str(st));
            goto done;
        }
        if ((st = shard_range(paths[i], sh[i].p, sh[i].range))) goto done;
    }
    qsort(sh, (size_t)n, sizeof *sh, cmp_shard);
    if ((st = check_joins(sh, n))) goto done;
    if (first_targets) *first_targets = first_shard_targets(sh[0].p);
    struct moe_profile *m = sh[0].p;
    for (int i = 1; i < n; i++)
        if ((st = moe_profile_merge(m, sh[i].p))) {
            MOE_LOGE("cannot merge %s into %s: %s (see the message above)", sh[i].path, sh[0].path,
                     moe_status_str(st));
            goto done;
        }
    int64_t range[3] = {sh[0].range[0], sh[n - 1].range[1], sh[0].range[2]}, d1[1] = {3};
    if ((st = moe_profile_put_i64(m, "shard", 1, d1, range))) goto done;
    *out = m;
    sh[0].p = NULL;
done:
    for (int i = 0; i < n; i++) moe_profile_free(sh[i].p);
    free(sh);
    return st;
}

/*
 * shard.c - --shard values: "I/N" and "auto" from the Slurm or Kubernetes
 * job-array environment (see shard.h).
 */
#include "shard.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* fail: write the reason to err and return 0. */
static int fail(char *err, size_t errsz, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errsz, const char *fmt, ...) {
    if (err && errsz) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errsz, fmt, ap);
        va_end(ap);
    }
    return 0;
}

/* whole: s[0..len) as a non-negative int (decimal digits only). */
static int whole(const char *s, size_t len, long *out) {
    if (!len || len > 9) return 0;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 1;
}

/* env_int: environment variable `name` as a non-negative int: 1 when set and
 * valid, 0 when unset (or empty), -1 when set to something else. */
static int env_int(const char *name, long *out) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    return whole(v, strlen(v), out) ? 1 : -1;
}

/* from_slurm: index and count from the Slurm job-array variables. */
static int from_slurm(long id, int count_opt, int *index, int *count, char *err, size_t errsz) {
    long mn = 0, mx = 0, cnt = 0;
    int has_min = env_int("SLURM_ARRAY_TASK_MIN", &mn), has_max = env_int("SLURM_ARRAY_TASK_MAX", &mx);
    int has_cnt = env_int("SLURM_ARRAY_TASK_COUNT", &cnt);
    if (has_min < 0 || has_max < 0 || has_cnt < 0)
        return fail(err, errsz, "SLURM_ARRAY_TASK_MIN, _MAX or _COUNT is not a whole number");
    if (has_min && has_max && mx < mn)
        return fail(err, errsz, "SLURM_ARRAY_TASK_MAX (%ld) is below SLURM_ARRAY_TASK_MIN (%ld)", mx, mn);
    if (!has_cnt) {
        if (!has_min || !has_max)
            return fail(err, errsz, "SLURM_ARRAY_TASK_ID is set but neither SLURM_ARRAY_TASK_COUNT nor "
                                    "SLURM_ARRAY_TASK_MIN and _MAX are");
        cnt = mx - mn + 1;
    } else if (has_min && has_max && cnt != mx - mn + 1) {
        return fail(err, errsz, "the Slurm array %ld-%ld has %ld tasks, not one per index: submit it as "
                                "--array=0-%ld (no step, no list)", mn, mx, cnt, cnt - 1);
    }
    if (cnt < 1) return fail(err, errsz, "SLURM_ARRAY_TASK_COUNT is 0");
    if (count_opt > 0 && count_opt != cnt)
        return fail(err, errsz, "--shard-count %d disagrees with the Slurm array's %ld tasks", count_opt, cnt);
    long idx = id - (has_min ? mn : 0);
    if (idx < 0 || idx >= cnt)
        return fail(err, errsz, "SLURM_ARRAY_TASK_ID %ld is outside the array (%ld tasks from %ld)", id, cnt,
                    has_min ? mn : 0);
    *index = (int)idx;
    *count = (int)cnt;
    return 1;
}

/* from_env: "auto": Slurm or Kubernetes, exactly one of them. */
static int from_env(int count_opt, int *index, int *count, char *err, size_t errsz) {
    long id = 0, k8s = 0;
    int slurm = env_int("SLURM_ARRAY_TASK_ID", &id), kube = env_int("JOB_COMPLETION_INDEX", &k8s);
    if (slurm < 0) return fail(err, errsz, "SLURM_ARRAY_TASK_ID is not a whole number");
    if (kube < 0) return fail(err, errsz, "JOB_COMPLETION_INDEX is not a whole number");
    if (slurm && kube)
        return fail(err, errsz, "both SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX are set; give --shard I/N");
    if (!slurm && !kube)
        return fail(err, errsz, "auto needs a Slurm job array (SLURM_ARRAY_TASK_ID) or a Kubernetes Indexed Job "
                                "(JOB_COMPLETION_INDEX); neither is set");
    if (slurm) return from_slurm(id, count_opt, index, count, err, errsz);
    if (count_opt < 1)
        return fail(err, errsz, "JOB_COMPLETION_INDEX is set but Kubernetes gives no count: add --shard-count N "
                                "(the job's completions) or write --shard auto/N");
    if (k8s >= count_opt)
        return fail(err, errsz, "JOB_COMPLETION_INDEX %ld is not below the count %d", k8s, count_opt);
    *index = (int)k8s;
    *count = count_opt;
    return 1;
}

int moe_shard_parse(const char *spec, int count_opt, int *index, int *count, char *err, size_t errsz) {
    if (err && errsz) err[0] = '\0';
    if (!spec) return fail(err, errsz, "no value");
    if (count_opt < 0) return fail(err, errsz, "the shard count must be positive");
    const char *slash = strchr(spec, '/');
    long i = 0, n = 0;
    if (!strcmp(spec, "auto")) return from_env(count_opt, index, count, err, errsz);
    if (slash && (size_t)(slash - spec) == 4 && !strncmp(spec, "auto", 4)) {
        if (!whole(slash + 1, strlen(slash + 1), &n) || n < 1)
            return fail(err, errsz, "auto/N wants a whole number N >= 1, not \"%s\"", spec);
        if (count_opt && count_opt != n)
            return fail(err, errsz, "auto/%ld disagrees with --shard-count %d", n, count_opt);
        return from_env((int)n, index, count, err, errsz);
    }
    if (!slash || !whole(spec, (size_t)(slash - spec), &i) || !whole(slash + 1, strlen(slash + 1), &n) || i < 1 ||
        i > n)
        return fail(err, errsz, "wants I/N with 1 <= I <= N (e.g. 2/4) or auto, not \"%s\"", spec);
    if (count_opt && count_opt != n) return fail(err, errsz, "%s disagrees with --shard-count %d", spec, count_opt);
    *index = (int)i - 1;
    *count = (int)n;
    return 1;
}

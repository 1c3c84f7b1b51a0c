/*
 * test-shard.c - moe_shard_parse (tools/common/shard.h): "I/N" by hand, and
 * "auto" from a Slurm job array (SLURM_ARRAY_TASK_ID with _COUNT, or with
 * _MIN/_MAX only; 0- and 1-based arrays) or a Kubernetes Indexed Job
 * (JOB_COMPLETION_INDEX with --shard-count or auto/N); refusals: neither or
 * both environments, no count, stepped arrays, an index outside the count,
 * counts that disagree, malformed values.
 */
#include <stdlib.h>
#include <string.h>

#include "moe-test.h"
#include "shard.h"

static const char *const k_vars[] = {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
                                     "SLURM_ARRAY_TASK_MAX", "JOB_COMPLETION_INDEX"};

/* env: set the five variables (NULL = unset). */
static void env(const char *id, const char *count, const char *mn, const char *mx, const char *k8s) {
    const char *v[] = {id, count, mn, mx, k8s};
    for (int i = 0; i < 5; i++) {
        if (v[i]) setenv(k_vars[i], v[i], 1);
        else unsetenv(k_vars[i]);
    }
}

/* ok: spec parses to index/count. */
static void ok(const char *spec, int count_opt, int want_i, int want_n) {
    int i = -1, n = -1;
    char err[256] = "";
    int r = moe_shard_parse(spec, count_opt, &i, &n, err, sizeof err);
    CHECK(r == 1 && i == want_i && n == want_n, "%s (count %d): got %d, %d/%d, want %d/%d (%s)", spec, count_opt, r,
          i, n, want_i, want_n, err);
}

/* bad: spec is refused with a message containing `why`. */
static void bad(const char *spec, int count_opt, const char *why) {
    int i = -7, n = -7;
    char err[256] = "";
    int r = moe_shard_parse(spec, count_opt, &i, &n, err, sizeof err);
    CHECK(r == 0 && strstr(err, why) && i == -7 && n == -7, "%s (count %d) should fail with \"%s\": got %d, \"%s\"",
          spec, count_opt, why, r, err);
}

int main(void) {
    env(NULL, NULL, NULL, NULL, NULL);
    ok("1/1", 0, 0, 1);
    ok("2/4", 0, 1, 4);
    ok("4/4", 4, 3, 4);
    bad("0/4", 0, "1 <= I <= N");
    bad("5/4", 0, "1 <= I <= N");
    bad("2/", 0, "I/N");
    bad("a/b", 0, "I/N");
    bad("-1/3", 0, "I/N");
    bad("2/4x", 0, "I/N");
    bad("", 0, "I/N");
    bad("2/4", 3, "disagrees");
    bad("auto", 0, "neither is set");
    bad("auto/4", 0, "neither is set");

    /* Slurm, --array=0-3 */
    env("2", "4", "0", "3", NULL);
    ok("auto", 0, 2, 4);
    ok("auto", 4, 2, 4);
    bad("auto", 5, "disagrees");
    /* --array=1-4: the index counts from the minimum */
    env("1", "4", "1", "4", NULL);
    ok("auto", 0, 0, 4);
    env("4", "4", "1", "4", NULL);
    ok("auto", 0, 3, 4);
    /* no COUNT: MAX - MIN + 1 */
    env("7", NULL, "5", "8", NULL);
    ok("auto", 0, 2, 4);
    /* COUNT without MIN: the ID is the index */
    env("3", "4", NULL, NULL, NULL);
    ok("auto", 0, 3, 4);
    env("4", "4", NULL, NULL, NULL);
    bad("auto", 0, "outside the array");
    /* a stepped array (--array=0-15:4): 4 tasks over 16 ids */
    env("8", "4", "0", "15", NULL);
    bad("auto", 0, "no step");
    env("2", NULL, NULL, NULL, NULL);
    bad("auto", 0, "neither SLURM_ARRAY_TASK_COUNT");
    env("2", NULL, "0", NULL, NULL);
    bad("auto", 0, "neither SLURM_ARRAY_TASK_COUNT");
    env("x2", "4", NULL, NULL, NULL);
    bad("auto", 0, "not a whole number");
    env("2", "4", "0", "3", "1");
    bad("auto", 0, "both");
    env("2", "4", "3", "1", NULL);
    bad("auto", 0, "below");

    /* Kubernetes Indexed Job */
    env(NULL, NULL, NULL, NULL, "0");
    ok("auto", 3, 0, 3);
    ok("auto/3", 0, 0, 3);
    ok("auto/3", 3, 0, 3);
    bad("auto", 0, "--shard-count");
    bad("auto/3", 2, "disagrees");
    bad("auto/0", 0, "auto/N");
    bad("auto/x", 0, "auto/N");
    env(NULL, NULL, NULL, NULL, "3");
    bad("auto", 3, "not below");
    ok("auto", 4, 3, 4);
    env(NULL, NULL, NULL, NULL, "-1");
    bad("auto", 4, "not a whole number");
    bad(NULL, 0, "no value");
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}

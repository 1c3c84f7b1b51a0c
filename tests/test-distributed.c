/*
 * test-distributed.c - docs/distributed.md runs as written: every line of it
 * that starts with "moe-prep" (the Slurm array scripts' and the Kubernetes
 * Indexed Jobs' commands, then the merge steps) is run on a fixture bundle
 * (mixtral-f32 as q8_0 + q4_0: model.moeb) and text (calib.txt), with
 * "--ctx 256" replaced by "--ctx 32 --max-tokens 320 -t 2": the task lines
 * once per task 0..3 with SLURM_ARRAY_TASK_ID/_MIN/_MAX/_COUNT or
 * JOB_COMPLETION_INDEX set, as the job array would. Checks:
 *   - the merged sensitivity file equals one unsharded run's, array for array
 *     and bit for bit (sums, scores, ranking, Spearman agreement, settings);
 *   - the merged profile holds all 10 sequences;
 *   - `sensitivity merge --json` equals the single run's --json in every key
 *     but the output name and the timings (parsed with cJSON);
 *   - a shard stopped with --stop-after and continued with --resume equals an
 *     uninterrupted shard;
 *   - merge refusals (exit 1): a missing shard, a shard given twice, a shard
 *     of other settings, an unfinished shard, a whole run's file.
 * argv[1] = moe-prep, argv[2] = docs/distributed.md.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe-test.h"
#include "profile-h5.h"

#define TASKS 4
#define SMALL "--ctx 32 --max-tokens 320 -t 2"

static char dir[64] = "/tmp/test-distributed-XXXXXX";
static const char *prep;

/* sh: run a shell command in dir with moe-prep on the PATH; its exit status. */
static int sh(const char *env, const char *cmd) {
    char line[8192];
    snprintf(line, sizeof line, "cd '%s' && PATH='%s/bin':\"$PATH\" %s sh -c '%s' >>log.txt 2>&1", dir, dir,
             env ? env : "", cmd);
    int st = system(line);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* setup: the bin directory, the text and the bundle. */
static int setup(void) {
    char cmd[4096];
    static const char *const w[] = {"the", "river", "carries", "seven", "small", "boats", "past", "a", "quiet",
                                    "town", "where", "children", "count", "numbers", "and", "letters"};
    snprintf(cmd, sizeof cmd, "%s/calib.txt", dir);
    FILE *f = fopen(cmd, "w");
    if (!f) return 0;
    for (int i = 0; i < 1500; i++) fprintf(f, "%s%s", w[(i * 7 + i / 5) % 16], i % 11 == 10 ? ".\n" : " ");
    fclose(f);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/bin' && ln -s '%s' '%s/bin/moe-prep' && cd '%s' && '%s' quantize "
             "'%s/models/mixtral-f32' -o model.moeb --experts q8_0,q4_0 >/dev/null 2>&1", dir, prep, dir, dir, prep,
             MOE_FIXTURES);
    return system(cmd) == 0;
}

/* The doc's command lines. */
struct lines {
    char *v[32];
    int n;
};

/* add: a trimmed doc line (leading "- " of YAML dropped) with --ctx 256 replaced; duplicates once. */
static void add(struct lines *L, const char *s) {
    char buf[2048];
    const char *ctx = strstr(s, "--ctx 256");
    if (ctx) snprintf(buf, sizeof buf, "%.*s" SMALL "%s", (int)(ctx - s), s, ctx + 9);
    else snprintf(buf, sizeof buf, "%s", s);
    for (int i = 0; i < L->n; i++)
        if (!strcmp(L->v[i], buf)) return;
    if (L->n < 32) L->v[L->n++] = strdup(buf);
}

static void read_doc(const char *path, struct lines *L) {
    FILE *f = fopen(path, "r");
    char line[2048];
    CHECK(f != NULL, "cannot open %s", path);
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        const char *s = line + strspn(line, " ");
        if (!strncmp(s, "- ", 2)) s += 2;
        if (!strncmp(s, "moe-prep ", 9)) add(L, s);
    }
    if (f) fclose(f);
}

/* same_array: derived array `name` identical in both files (f64, i64 or i32). */
static int same_array(const struct moe_profile *a, const struct moe_profile *b, const char *name) {
    int na, nb;
    int64_t da[MOE_PROFILE_MAX_DIMS], db[MOE_PROFILE_MAX_DIMS];
    const void *x, *y;
    size_t el = 8;
    if (moe_profile_get_f64(a, name, &na, da, (const double **)&x) || moe_profile_get_f64(b, name, &nb, db, (const double **)&y)) {
        if (moe_profile_get_i64(a, name, &na, da, (const int64_t **)&x) || moe_profile_get_i64(b, name, &nb, db, (const int64_t **)&y)) {
            el = 4;
            if (moe_profile_get_i32(a, name, &na, da, (const int32_t **)&x) || moe_profile_get_i32(b, name, &nb, db, (const int32_t **)&y))
                return 0;
        }
    }
    if (na != nb) return 0;
    size_t n = 1;
    for (int i = 0; i < na; i++) {
        if (da[i] != db[i]) return 0;
        n *= (size_t)da[i];
    }
    return !memcmp(x, y, n * el);
}

/* same_sweep: the results arrays of two sensitivity files are identical. */
static void same_sweep(const char *fa, const char *fb, int final) {
    static const char *const names[] = {"config.sensitivity", "sensitivity.sum_kl", "sensitivity.sum_dnll",
                                        "sensitivity.sum_proxy", "sensitivity.routed", "sensitivity.kl",
                                        "sensitivity.dnll", "sensitivity.proxy", "sensitivity.score",
                                        "sensitivity.order", "sensitivity.spearman_proxy"};
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s", dir, fa);
    snprintf(pb, sizeof pb, "%s/%s", dir, fb);
    struct moe_profile *a = NULL, *b = NULL;
    CHECK(moe_profile_read(pa, &a) == MOE_OK && moe_profile_read(pb, &b) == MOE_OK, "read %s and %s", fa, fb);
    for (size_t i = 0; a && b && i < (final ? 11u : 5u); i++)
        CHECK(same_array(a, b, names[i]), "%s: %s differs from %s", fa, names[i], fb);
    moe_profile_free(a);
    moe_profile_free(b);
}

/* run_tasks: the doc's task lines of one scheduler for every task, then every merge line. */
static void run_tasks(const struct lines *L, const char *var, int slurm) {
    int n_task = 0, n_merge = 0;
    sh(NULL, "rm -f sens-*.h5 prof-*.h5 sens.h5 profile.h5");
    for (int k = 0; k < L->n; k++) {
        if (!strstr(L->v[k], var)) continue;
        n_task++;
        for (int i = 0; i < TASKS; i++) {
            char env[256];
            if (slurm)
                snprintf(env, sizeof env, "SLURM_ARRAY_TASK_ID=%d SLURM_ARRAY_TASK_MIN=0 SLURM_ARRAY_TASK_MAX=%d "
                                          "SLURM_ARRAY_TASK_COUNT=%d", i, TASKS - 1, TASKS);
            else snprintf(env, sizeof env, "JOB_COMPLETION_INDEX=%d", i);
            CHECK(sh(env, L->v[k]) == 0, "task %d of: %s", i, L->v[k]);
        }
    }
    for (int k = 0; k < L->n; k++)
        if (strstr(L->v[k], " merge ")) {
            n_merge++;
            CHECK(sh(NULL, L->v[k]) == 0, "%s", L->v[k]);
        }
    CHECK(n_task == 2 && n_merge == 2, "%s: %d task lines and %d merge lines in the doc (want 2 and 2)", var, n_task,
          n_merge);
    same_sweep("sens.h5", "whole.h5", 1);
    char path[600];
    snprintf(path, sizeof path, "%s/profile.h5", dir);
    struct moe_profile *p = NULL;
    CHECK(moe_profile_read(path, &p) == MOE_OK && p->n_seq == 10, "%s: merged profile (%d sequences)", var,
          p ? p->n_seq : -1);
    moe_profile_free(p);
}

/* load_json: a file of dir parsed (NULL if not JSON). */
static cJSON *load_json(const char *name) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    cJSON *j = n ? cJSON_Parse(buf) : NULL;
    free(buf);
    return j;
}

/* check_json: merge --json against the whole run's --json. */
static void check_json(void) {
    CHECK(sh(NULL, "moe-prep sensitivity merge sens-0.h5 sens-1.h5 sens-2.h5 sens-3.h5 -o m.h5 --json > m.json") == 0,
          "merge --json");
    cJSON *w = load_json("whole.json"), *m = load_json("m.json");
    CHECK(w && m, "the JSON outputs parse");
    static const char *const same[] = {"model", "dataset", "low", "base", "metric", "method", "ctx", "sequences",
                                       "positions", "naive_forward_equivalents", "base_nll", "spearman_proxy",
                                       "experts"};
    for (size_t i = 0; w && m && i < sizeof same / sizeof same[0]; i++)
        CHECK(cJSON_Compare(cJSON_GetObjectItem(w, same[i]), cJSON_GetObjectItem(m, same[i]), 1), "JSON %s differs",
              same[i]);
    const cJSON *ex = w ? cJSON_GetObjectItem(w, "experts") : NULL, *e0 = cJSON_GetArrayItem(ex, 0);
    CHECK(cJSON_GetArraySize(ex) == 16 && cJSON_IsNumber(cJSON_GetObjectItem(e0, "rank")) &&
              cJSON_IsNumber(cJSON_GetObjectItem(e0, "kl")) && cJSON_IsNumber(cJSON_GetObjectItem(e0, "routed")),
          "experts: 16 entries with rank, kl, routed");
    CHECK(w && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(w, "low")), "q4_0") &&
              !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(w, "metric")), "kl") &&
              cJSON_GetNumberValue(cJSON_GetObjectItem(w, "sequences")) == 10 &&
              cJSON_IsNumber(cJSON_GetObjectItem(w, "spearman_proxy")),
          "whole-run JSON: low q4_0 (default pair), metric kl, 10 sequences, a Spearman value");
    CHECK(m && cJSON_GetNumberValue(cJSON_GetObjectItem(m, "shards_merged")) == 4 &&
              !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(m, "out")), "m.h5"),
          "merge JSON: shards_merged 4, out m.h5");
    cJSON_Delete(w);
    cJSON_Delete(m);
}

/* check_refusals: merges that must fail, and a resumed shard. */
static void check_refusals(void) {
    const char *s = "moe-prep sensitivity model.moeb --dataset calib.txt " SMALL;
    char cmd[1024];
    CHECK(sh(NULL, "moe-prep sensitivity merge sens-0.h5 sens-1.h5 sens-3.h5 -o x.h5") == 1, "a missing shard");
    CHECK(sh(NULL, "moe-prep sensitivity merge sens-0.h5 sens-1.h5 sens-1.h5 sens-3.h5 -o x.h5") == 1, "a duplicate");
    CHECK(sh(NULL, "moe-prep sensitivity merge sens-0.h5 sens-1.h5 sens-2.h5 whole.h5 -o x.h5") == 1, "a whole run");
    snprintf(cmd, sizeof cmd, "moe-prep sensitivity model.moeb --dataset calib.txt --ctx 16 --max-tokens 320 -t 2 "
                              "--shard 3/4 -o other.h5");
    CHECK(sh(NULL, cmd) == 0, "%s", cmd);
    CHECK(sh(NULL, "moe-prep sensitivity merge sens-0.h5 sens-1.h5 other.h5 sens-3.h5 -o x.h5") == 1,
          "a shard of another --ctx");
    snprintf(cmd, sizeof cmd, "%s --shard 3/4 -o part.h5 --stop-after 2", s);
    CHECK(sh(NULL, cmd) == 3, "--stop-after on a shard exits 3");
    CHECK(sh(NULL, "moe-prep sensitivity merge sens-0.h5 sens-1.h5 part.h5.partial sens-3.h5 -o x.h5") == 1,
          "an unfinished shard");
    snprintf(cmd, sizeof cmd, "%s --shard 4/4 -o part.h5 --resume", s);
    CHECK(sh(NULL, cmd) == 1, "resuming another shard's progress is refused");
    snprintf(cmd, sizeof cmd, "%s --shard 3/4 -o part.h5 --resume", s);
    CHECK(sh(NULL, cmd) == 0, "--resume finishes the shard");
    same_sweep("part.h5", "sens-2.h5", 0);
    CHECK(sh(NULL, "test ! -e x.h5") == 0, "a refused merge wrote its output");
    snprintf(cmd, sizeof cmd, "%s --shard 2/4 -o y.h5 --csv y.csv", s);
    CHECK(sh(NULL, cmd) == 2, "--csv with --shard is a usage error");
    snprintf(cmd, sizeof cmd, "JOB_COMPLETION_INDEX=1 %s --shard auto -o y.h5", s);
    CHECK(sh(NULL, cmd) == 2, "--shard auto under Kubernetes without a count");
    snprintf(cmd, sizeof cmd, "%s --shard 17/17 -o y.h5", s);
    CHECK(sh(NULL, cmd) == 2, "more shards than experts");
    /* profile takes the Kubernetes count as --shard-count too: the same shard as auto/4 and 2/4 */
    const char *p = "moe-prep profile model.moeb --dataset calib.txt " SMALL " --no-tuning";
    snprintf(cmd, sizeof cmd, "JOB_COMPLETION_INDEX=1 %s --shard auto --shard-count 4 -o pk.h5", p);
    CHECK(sh(NULL, cmd) == 0, "profile --shard auto --shard-count 4 under Kubernetes");
    snprintf(cmd, sizeof cmd, "%s --shard 2/4 -o p2.h5", p);
    CHECK(sh(NULL, cmd) == 0, "profile --shard 2/4");
    struct moe_profile *x = NULL, *y = NULL;
    char px[256], py[256];
    snprintf(px, sizeof px, "%s/pk.h5", dir), snprintf(py, sizeof py, "%s/p2.h5", dir);
    const int ok = moe_profile_read(px, &x) == MOE_OK && moe_profile_read(py, &y) == MOE_OK && x->n_seq == y->n_seq &&
                   x->n_seq > 0 && x->seq_start[x->n_seq] == y->seq_start[y->n_seq];
    CHECK(ok && !memcmp(x->experts, y->experts,
                        sizeof *x->experts * (size_t)x->seq_start[x->n_seq] * (size_t)x->n_layers * (size_t)x->k),
          "--shard-count 4 with index 1 profiles the sequences of --shard 2/4");
    moe_profile_free(x);
    moe_profile_free(y);
    CHECK(sh(NULL, "moe-prep profile model.moeb --dataset calib.txt -o z.h5 --shard-count 4") == 2,
          "--shard-count without --shard");
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test-distributed MOE_PREP DOCS/DISTRIBUTED.MD\n");
        return 2;
    }
    static char abs_prep[4096], cwd[2048]; /* the link in dir/bin needs an absolute target */
    if (argv[1][0] == '/') snprintf(abs_prep, sizeof abs_prep, "%s", argv[1]);
    else if (getcwd(cwd, sizeof cwd)) snprintf(abs_prep, sizeof abs_prep, "%s/%s", cwd, argv[1]);
    if (!abs_prep[0] || !mkdtemp(dir)) return 1;
    prep = abs_prep;
    CHECK(setup(), "setup (bundle, text)");
    struct lines L = {{0}, 0};
    read_doc(argv[2], &L);
    CHECK(sh(NULL, "moe-prep sensitivity model.moeb --dataset calib.txt " SMALL " -o whole.h5 --json > whole.json") == 0,
          "the whole sweep");
    run_tasks(&L, "$SLURM_ARRAY_TASK_ID", 1);
    run_tasks(&L, "$JOB_COMPLETION_INDEX", 0);
    check_json();
    check_refusals();
    for (int i = 0; i < L.n; i++) free(L.v[i]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (!fails) (void)system(cmd);
    else fprintf(stderr, "kept %s (log.txt)\n", dir);
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}

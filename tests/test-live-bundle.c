/*
 * test-live-bundle.c - a bundle that changes under a running model (issue 30,
 * item 4), on the trained demo model quantized to q8_0 and q2_k experts:
 *   - unchanged: the non-expert weights read into the model's own memory
 *     (moe_model_params.copy_dense; the default with lazy_experts) give
 *     logits bit-identical to the views into the mapping, resident and with
 *     a budget, and the bound weights really are the copy;
 *   - truncated to 1 MiB mid-run with a budget (a few copies: the next read
 *     finds it; every copy cached: the per-64-token check finds it; --io
 *     mmap too): the forward returns MOE_ERR_IO within
 *     MOE_SESSION_CHECK_TOKENS tokens, one message names the file ("changed
 *     while the model was running (size X -> 1048576 bytes; ...); restart"),
 *     every later forward fails too, and no signal kills the process (each
 *     run is a child process, so a SIGBUS is reported, not fatal);
 *   - bytes overwritten in place (size kept, modification time moved), every
 *     expert resident and with a budget: detected within
 *     MOE_SESSION_CHECK_TOKENS tokens;
 *   - not changes: a tuning replacement (moe_bundle_replace_tuning) and a new
 *     file renamed over the path mid-run: no error over more than
 *     MOE_SESSION_CHECK_TOKENS tokens, logits equal to the undisturbed run's;
 *   - moe-run with the bundle truncated between load and generation
 *     (--expert-mem 25%, --io mmap, every expert resident): exit 1 and the
 *     message, no signal. The test holds moe-run right after its load by
 *     giving it a full pipe as stderr: its first message ("moe-run: experts:")
 *     blocks until the test, having truncated the file, drains the pipe.
 * argv: moe-prep moe-run MODEL_DIR WORK_DIR.
 */
#define _GNU_SOURCE /* F_SETPIPE_SZ */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moe-bundle.h"
#include "moe-session.h"
#include "moe-test.h"

static const char *prep, *moe_run, *model_dir, *work;
static char bundle[1200], pristine[1200];

#define NP 8                                   /* prompt tokens */
#define ND (MOE_SESSION_CHECK_TOKENS + 24)     /* one-token steps */
#define AT 5                                   /* the file is disturbed after this many steps */

/* ---- the log ------------------------------------------------------------- */

static char g_log[16384];
static int g_n_err, g_n_warn;

static void on_log(enum moe_log_level level, const char *msg, void *user) {
    (void)user;
    if (level >= MOE_LOG_INFO) {
        const size_t n = strlen(g_log);
        snprintf(g_log + n, sizeof g_log - n, "%s\n", msg);
    }
    g_n_err += level >= MOE_LOG_ERROR;
    g_n_warn += level == MOE_LOG_WARN;
}

static void log_clear(void) { g_log[0] = 0, g_n_err = g_n_warn = 0; }

/* count_of: occurrences of needle in hay. */
static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

/* ---- runs ---------------------------------------------------------------- */

/* fresh: the bundle restored from the pristine copy, as a new file (inode). */
static int fresh(void) {
    return moe_test_sh("rm -f '%s' && cp '%s' '%s'", bundle, pristine, bundle) == 0;
}

enum budget { NONE, FEW, ALL };

/* load: the bundle with lazy experts when a budget is used, copy_dense as given. */
static struct moe_model *load(enum budget b, int copy_dense) {
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = "q8_0";
    mp.lazy_experts = b != NONE;
    mp.copy_dense = copy_dense;
    struct moe_model *m = NULL;
    return moe_model_load(bundle, &mp, &m) == MOE_OK ? m : NULL;
}

/* store_params: a budget of a few copies (reads at nearly every token) or of
 * every copy (no read once all are cached), dynamic precision off. */
static struct moe_store_params store_params(enum budget b, enum moe_io_mode io) {
    struct moe_store_params sp = moe_store_default_params();
    sp.dynamic = 0, sp.low_cap = 0, sp.io = io;
    sp.high_cap = b == FEW ? 5 : 32;
    return sp;
}

/* The token fed at step i (prompt: i < NP). */
static int32_t tok(int i, int V) { return (int32_t)((37 * i + 11) % V); }

/* run: the prompt and up to ND one-token steps; after step AT (when disturb
 * is set) disturb() changes the file. Logits rows [NP + ND x V] into out.
 * Returns the step whose forward failed (status in *fail_st), or -1 when all
 * ran; -2 when loading or the session failed. */
static int run(enum budget b, enum moe_io_mode io, int copy_dense, void (*disturb)(void), float *out,
               enum moe_status *fail_st) {
    struct moe_model *m = load(b, copy_dense);
    if (!m) return -2;
    const int V = m->cfg.n_vocab;
    struct moe_store_params sp = store_params(b, io);
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = 2;
    p.store = b == NONE ? NULL : &sp;
    struct moe_session *s = NULL;
    if (moe_session_create(m, &p, &s) != MOE_OK) {
        moe_model_free(m);
        return -2;
    }
    int32_t ids[NP + ND];
    for (int i = 0; i < NP + ND; i++) ids[i] = tok(i, V);
    int failed = -1;
    enum moe_status st = moe_session_forward(s, ids, NP, out, 1);
    if (st) failed = 0;
    for (int i = 0; failed < 0 && i < ND; i++) {
        if (disturb && i == AT) disturb();
        if ((st = moe_session_forward(s, ids + NP + i, 1, out + (size_t)(NP + i) * V, 0)) != MOE_OK) failed = i;
    }
    if (failed >= 0 && fail_st) {
        *fail_st = st;
        int32_t again = ids[0]; /* sticky: the next forward fails at once */
        if (moe_session_forward(s, &again, 1, NULL, 0) != st) *fail_st = MOE_OK;
    }
    moe_session_free(s);
    moe_model_free(m);
    return failed;
}

/* in_child: run fn in a child process; a signal or a failed check there is a
 * failure here, named by `what`. */
static void in_child(const char *what, void (*fn)(void)) {
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        fails = 0;
        fn();
        fflush(stderr);
        _exit(fails ? 1 : 0);
    }
    int ws = 0;
    CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid, "%s: fork", what);
    CHECK(!WIFSIGNALED(ws), "%s: killed by signal %d (%s)", what, WTERMSIG(ws), strsignal(WTERMSIG(ws)));
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "%s: its checks failed (above)", what);
}

/* ---- disturbances -------------------------------------------------------- */

static void truncate_1m(void) {
    if (truncate(bundle, 1 << 20) != 0) fprintf(stderr, "truncate %s: %s\n", bundle, strerror(errno));
}

/* overwrite: zeros over 256 KiB of the token embedding (a non-expert tensor
 * every token reads) and over an expert blob, size kept, and the
 * modification time moved on by 2 s (what a writer's clock would do; set
 * explicitly so a coarse timestamp cannot hide it). */
static void overwrite(void) {
    struct moe_bundle *b = NULL;
    uint64_t off[2] = {0, 0};
    if (moe_bundle_open(pristine, &b) == MOE_OK) {
        const struct moe_bundle_tensor *t = moe_bundle_find_tensor(b, "model.embed_tokens.weight");
        struct moe_bundle_blob x;
        if (t) off[0] = t->offset;
        if (moe_bundle_expert(b, 1, 3, 0, &x) == MOE_OK) off[1] = x.offset;
    }
    moe_bundle_free(b);
    int fd = open(bundle, O_WRONLY);
    struct stat st;
    static char zeros[256 << 10];
    if (fd < 0 || fstat(fd, &st) != 0 || !off[0] || !off[1] ||
        pwrite(fd, zeros, sizeof zeros, (off_t)off[0]) != (ssize_t)sizeof zeros ||
        pwrite(fd, zeros, 4096, (off_t)off[1]) != 4096) {
        fprintf(stderr, "overwrite %s: %s\n", bundle, strerror(errno));
    } else {
        struct timespec ts[2] = {st.st_atim, st.st_mtim};
        ts[1].tv_sec += 2;
        futimens(fd, ts);
    }
    if (fd >= 0) close(fd);
}

static void replace_tuning(void) {
    struct moe_bundle_kv *kv = NULL;
    if (moe_bundle_kv_new(&kv) != MOE_OK || moe_bundle_kv_set_i64(kv, "test.live", 1) != MOE_OK ||
        moe_bundle_replace_tuning(bundle, kv) != MOE_OK)
        fprintf(stderr, "replace the tuning of %s failed\n", bundle);
    moe_bundle_kv_free(kv);
}

static void rename_over(void) {
    char tmp[1300];
    snprintf(tmp, sizeof tmp, "%s.new", bundle);
    if (moe_test_sh("cp '%s' '%s'", pristine, tmp) != 0 || rename(tmp, bundle) != 0)
        fprintf(stderr, "rename over %s failed\n", bundle);
}

/* ---- the checks ---------------------------------------------------------- */

static float *g_ref;   /* the undisturbed run: every expert resident, views into the mapping */
static size_t g_rows;  /* floats of one run's logits */

/* unchanged: copy_dense gives the same logits as the mapping, and binds the copy. */
static void unchanged(void) {
    float *got = malloc(g_rows * sizeof *got);
    CHECK(fresh() && got, "bundle");
    struct { enum budget b; int copy; const char *what; } cases[] = {
        {NONE, 1, "every expert resident, copy_dense 1"},
        {FEW, 0, "a budget of 5 copies, copy_dense by lazy_experts"},
        {FEW, -1, "a budget of 5 copies, copy_dense -1 (the mapping)"},
        {ALL, 0, "a budget of every copy"},
    };
    for (size_t i = 0; got && i < sizeof cases / sizeof *cases; i++) {
        memset(got, 0, g_rows * sizeof *got);
        CHECK(run(cases[i].b, MOE_IO_DIRECT, cases[i].copy, NULL, got, NULL) == -1, "%s: runs", cases[i].what);
        CHECK(!memcmp(g_ref, got, g_rows * sizeof *got), "%s: logits bit-identical to the mapped weights'",
              cases[i].what);
    }
    static const int copies[][2] = {{NONE, -1}, {NONE, 0}, {NONE, 1}, {FEW, 0}, {FEW, -1}}; /* {budget, copy_dense} */
    for (size_t i = 0; i < sizeof copies / sizeof *copies; i++) {
        struct moe_model *m = load((enum budget)copies[i][0], copies[i][1]);
        const int want_copy = copies[i][1] > 0 || (copies[i][1] == 0 && copies[i][0] != NONE);
        const struct moe_bundle_tensor *t = m ? moe_bundle_find_tensor(m->bundle, "model.embed_tokens.weight") : NULL;
        const struct moe_bundle_tensor *w = m ? moe_bundle_find_tensor(m->bundle, "model.layers.1.self_attn.q_proj.weight")
                                              : NULL;
        CHECK(t && w, "tensors of the bundle");
        if (t && w)
            CHECK((m->tok_embd.data != t->data) == want_copy && (m->layers[1].wq.data != w->data) == want_copy &&
                      !memcmp(m->tok_embd.data, t->data, (size_t)t->size),
                  "lazy %d copy_dense %d: the weights are %s, with the same bytes", copies[i][0] != NONE,
                  copies[i][1], want_copy ? "the model's copy" : "views into the mapping");
        moe_model_free(m);
    }
    free(got);
}

/* A disturbed run and what it must give. */
struct disturbed {
    const char *what;
    enum budget b;
    enum moe_io_mode io;
    void (*disturb)(void);
    int must_fail;   /* 1: MOE_ERR_IO within MOE_SESSION_CHECK_TOKENS steps of AT; 0: no error, same logits */
    int max_steps;   /* must_fail: at most this many steps after AT (the check's period, or 1: the next read) */
};

static const struct disturbed *g_case;

/* one_disturbed: (in a child) the run of g_case and its checks. */
static void one_disturbed(void) {
    const struct disturbed *c = g_case;
    float *got = calloc(g_rows, sizeof *got);
    CHECK(got && fresh(), "%s: bundle", c->what);
    if (!got) return;
    log_clear();
    enum moe_status st = MOE_OK;
    const int failed = run(c->b, c->io, 0, c->disturb, got, &st);
    if (c->must_fail) {
        CHECK(failed >= AT && failed - AT < c->max_steps, "%s: the forward failed at step %d (the file changed "
              "before step %d; at most %d steps later)", c->what, failed, AT, c->max_steps);
        CHECK(st == MOE_ERR_IO, "%s: MOE_ERR_IO, and again at the next forward (got %s)", c->what, moe_status_str(st));
        CHECK(count_of(g_log, "changed while the model was running") == 1 && strstr(g_log, bundle) &&
                  strstr(g_log, "restart"),
              "%s: one message naming the file:\n%s", c->what, g_log);
        char size[96];
        snprintf(size, sizeof size, "-> %d bytes", 1 << 20);
        if (c->disturb == truncate_1m) CHECK(strstr(g_log, size) != NULL, "%s: the new size in the message", c->what);
    } else {
        CHECK(failed == -1 && g_n_err == 0, "%s: no error (failed at step %d):\n%s", c->what, failed, g_log);
        CHECK(!memcmp(g_ref, got, g_rows * sizeof *got), "%s: logits equal to the undisturbed run's", c->what);
        if (c->disturb == rename_over)
            CHECK(count_of(g_log, "no longer names the file") == 1, "%s: one warning:\n%s", c->what, g_log);
        struct stat a, b;
        if (c->disturb == replace_tuning)
            CHECK(stat(bundle, &a) == 0 && stat(pristine, &b) == 0 && a.st_size > b.st_size &&
                      count_of(g_log, "its tuning was replaced") == 1,
                  "%s: the file grew, and the change was seen and accepted once:\n%s", c->what, g_log);
    }
    free(got);
}

static void disturbed_runs(void) {
    static const struct disturbed cases[] = {
        {"truncated, a budget of 5 copies", FEW, MOE_IO_DIRECT, truncate_1m, 1, 2},
        {"truncated, a budget of 5 copies, --io mmap", FEW, MOE_IO_MMAP, truncate_1m, 1, 2},
        {"truncated, a budget of every copy", ALL, MOE_IO_BUFFERED, truncate_1m, 1,
         MOE_SESSION_CHECK_TOKENS},
        {"overwritten in place, every expert resident", NONE, MOE_IO_DIRECT, overwrite, 1, MOE_SESSION_CHECK_TOKENS},
        {"overwritten in place, a budget of 5 copies", FEW, MOE_IO_DIRECT, overwrite, 1, MOE_SESSION_CHECK_TOKENS},
        {"tuning replaced, a budget of 5 copies", FEW, MOE_IO_DIRECT, replace_tuning, 0, 0},
        {"tuning replaced, every expert resident", NONE, MOE_IO_DIRECT, replace_tuning, 0, 0},
        {"renamed over, every expert resident", NONE, MOE_IO_DIRECT, rename_over, 0, 0},
        {"renamed over, a budget of 5 copies", FEW, MOE_IO_DIRECT, rename_over, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        g_case = &cases[i];
        in_child(cases[i].what, one_disturbed);
    }
}

/* ---- moe-run ------------------------------------------------------------- */

/* blocked_on_stderr: whether process pid's main thread waits in write(2, ...). */
static int blocked_on_stderr(pid_t pid, int *readable) {
    char path[64], buf[128] = "";
    snprintf(path, sizeof path, "/proc/%d/syscall", (int)pid);
    FILE *f = fopen(path, "r");
    *readable = f != NULL;
    if (!f) return 0;
    const int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    *readable = ok; /* "running" when not in a system call: look again */
    char want[32];
    snprintf(want, sizeof want, "%d 0x2 ", (int)SYS_write); /* write(2, ...) */
    return ok && strncmp(buf, want, strlen(want)) == 0;
}

/* cli_truncated_after_load: moe-run ARGS on the bundle, held at its first
 * stderr message (right after the load) by a full pipe while the test
 * truncates the bundle, then let go. 1 if checked, 0 if it could not be held
 * (no /proc/PID/syscall: skipped). */
static int cli_truncated_after_load(const char *what, const char *args) {
    CHECK(fresh(), "%s: bundle", what);
    int pfd[2];
    if (pipe(pfd) != 0) return 0;
    (void)fcntl(pfd[1], F_SETPIPE_SZ, 4096);
    int fl = fcntl(pfd[1], F_GETFL);
    fcntl(pfd[1], F_SETFL, fl | O_NONBLOCK); /* fill it: the child's first message then blocks */
    size_t filler = 0;
    static char junk[4096];
    for (size_t chunk = sizeof junk; chunk > 0; chunk /= 2)
        for (ssize_t w; (w = write(pfd[1], junk, chunk)) > 0;) filler += (size_t)w;
    fcntl(pfd[1], F_SETFL, fl); /* the child's stderr blocks (the same open file) */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec '%s' -m '%s' %s -p 'Once upon a time' -n 200 --ignore-eos >/dev/null", moe_run, bundle,
             args);
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 2);
        close(pfd[0]), close(pfd[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    int readable = 1, held = 0;
    for (int i = 0; pid > 0 && i < 60000 && readable && !(held = blocked_on_stderr(pid, &readable)); i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        if (waitpid(pid, NULL, WNOHANG) == pid) break; /* it ended without writing: checked below */
    }
    if (held) truncate_1m();
    char *err = calloc(1, 1 << 20);
    size_t n = 0, skip = filler;
    for (ssize_t r; err && (r = read(pfd[0], err + n, (1 << 20) - 1 - n)) > 0;) {
        if (skip) { /* the filler comes out first */
            size_t k = (size_t)r < skip ? (size_t)r : skip;
            memmove(err + n, err + n + k, (size_t)r - k);
            r -= (ssize_t)k, skip -= k;
        }
        n += (size_t)r;
    }
    close(pfd[0]);
    int ws = 0;
    waitpid(pid, &ws, 0);
    if (!held) {
        if (!readable) printf("test-live-bundle: %s: skipped (cannot see the process's system call)\n", what);
        else CHECK(0, "%s: moe-run was not held at its first message:\n%s", what, err ? err : "");
        free(err);
        return 0;
    }
    CHECK(!WIFSIGNALED(ws), "%s: moe-run killed by signal %d (%s)", what, WTERMSIG(ws), strsignal(WTERMSIG(ws)));
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 1, "%s: moe-run exits 1 (status %d)", what,
          WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    CHECK(err && strncmp(err, "moe-run: experts:", 17) == 0, "%s: held right after the load:\n%s", what, err ? err : "");
    CHECK(err && strstr(err, "changed while the model was running") && strstr(err, bundle) && strstr(err, "restart"),
          "%s: the message names the file:\n%s", what, err ? err : "");
    free(err);
    return 1;
}

static void cli(void) {
    cli_truncated_after_load("moe-run --expert-mem 25%", "--expert-mem 25%");
    cli_truncated_after_load("moe-run --expert-mem 25% --io mmap", "--expert-mem 25% --io mmap");
    cli_truncated_after_load("moe-run, every expert resident", "");
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: test-live-bundle moe-prep moe-run MODEL_DIR WORK_DIR\n");
        return 2;
    }
    prep = argv[1], moe_run = argv[2], model_dir = argv[3], work = argv[4];
    snprintf(pristine, sizeof pristine, "%s/pristine.moeb", work);
    snprintf(bundle, sizeof bundle, "%s/live.moeb", work);
    if (moe_test_sh("rm -rf '%s' && mkdir -p '%s'", work, work) != 0 ||
        moe_test_sh("'%s' quantize '%s' -o '%s' --experts q8_0,q2_k --dense q8_0 >/dev/null 2>&1", prep, model_dir,
                    pristine) != 0 ||
        !fresh()) {
        fprintf(stderr, "test-live-bundle: cannot quantize %s into %s\n", model_dir, work);
        return 1;
    }
    moe_log_set(on_log, NULL);
    moe_log_set_level(MOE_LOG_INFO);
    struct moe_model *m = load(NONE, -1);
    if (!m) return 1;
    g_rows = (size_t)(NP + ND) * (size_t)m->cfg.n_vocab;
    moe_model_free(m);
    g_ref = calloc(g_rows, sizeof *g_ref);
    CHECK(g_ref && run(NONE, MOE_IO_DIRECT, -1, NULL, g_ref, NULL) == -1, "the reference run");
    if (g_ref) {
        unchanged();
        disturbed_runs();
    }
    moe_log_set(NULL, NULL);
    cli();
    free(g_ref);
    printf("test-live-bundle: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    if (!fails) moe_test_sh("rm -rf '%s'", work);
    return fails != 0;
}

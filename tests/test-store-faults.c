/*
 * test-store-faults.c - the expert store when the storage misbehaves (issue
 * 31, item 6), on the trained demo model quantized to q8_0 and q2_k experts,
 * with faults injected through the store's test seam
 * (moe_store_params.io_hooks) on every --io mode: direct (Linux AIO where the
 * kernel has it, else pread), buffered (pread) and mmap (copies out of the
 * mapping). A budget of a few copies makes a read at nearly every step; the
 * fault is armed after a few one-token steps and strikes every read of the
 * first copy read after that (its target), once or for good:
 *   - demand reads: EIO, a short read, the end of the file, damaged bytes, a
 *     slow read. Once: a short read is continued (no retry), EIO and damaged
 *     bytes are read again; the run goes on, logits bit-identical to the run
 *     without a budget, no error. For good: the forward returns MOE_ERR_IO
 *     with one message naming the target's layer, expert, precision and
 *     offset and the cause; the logits before it are unaffected; with the
 *     fault gone the same forward run again succeeds and every later logit
 *     equals the reference (nothing sticky). A slow read under --io-timeout
 *     is waited for (also with 0 = forever); past it the forward fails after
 *     about the timeout with "the storage did not answer", and once the read
 *     is done the forward run again succeeds;
 *   - prefetch reads (stacked-gate prefetch) failing, damaged or slow: no
 *     forward fails, nothing is logged, the logits are the reference's, the
 *     failures are counted (prefetch_failed);
 *   - teardown: the session (and its loaders) is freed right after a
 *     timed-out read, waiting for it at most --io-timeout; every case runs
 *     under an alarm() watchdog, so a hang fails the test, and under
 *     MOE_SANITIZE a leak or a race on teardown does.
 * argv: moe-prep MODEL_DIR WORK_DIR. MOE_TEST_VERBOSE=1 prints each case's outcome.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moe-backend.h"
#include "moe-model.h"
#include "moe-quant.h"
#include "moe-session.h"
#include "moe-store.h"
#include "moe-test.h"

static const char *prep, *model_dir, *work;
static char bundle[1200];

#define NP 8  /* prompt tokens */
#define ND 14 /* one-token steps */
#define AT 4  /* the fault is armed before this step */
#define ROWS (NP + ND)

static float *g_ref; /* [ROWS x V] the run without a budget */
static int g_V;

/* ---- the log ------------------------------------------------------------- */

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_log[16384];
static int g_n_err;

static void on_log(enum moe_log_level level, const char *msg, void *user) {
    (void)user;
    pthread_mutex_lock(&g_log_mu);
    if (level >= MOE_LOG_WARN) {
        const size_t n = strlen(g_log);
        snprintf(g_log + n, sizeof g_log - n, "%s\n", msg);
    }
    g_n_err += level >= MOE_LOG_ERROR;
    pthread_mutex_unlock(&g_log_mu);
}

static void log_clear(void) {
    pthread_mutex_lock(&g_log_mu);
    g_log[0] = 0, g_n_err = 0;
    pthread_mutex_unlock(&g_log_mu);
}

/* ---- the injector (moe_store_io_hooks) ------------------------------------ */

enum fault { F_EIO, F_SHORT, F_EOF, F_CORRUPT, F_SLOW, F_SLOW_EOF };
static const char *const k_fault_name[] = {"EIO",       "short read", "end of file", "damaged bytes",
                                           "slow read", "slow read, then end of file"};

struct inject {
    pthread_mutex_t mu;
    int armed;
    enum fault kind;
    int shots;        /* faults left; -1: every read of the target */
    int prefetch;     /* 1: strike prefetch reads (any copy) instead of the target's */
    int delay_ms;     /* F_SLOW, F_SLOW_EOF */
    int has_target, layer, expert;
    char prec[32];
    unsigned long long offset; /* the target's first read: its blob's offset */
    int injected, target_reads;
    int holding;      /* F_SLOW_EOF: failed prefetch copies held back (after_read) */
    int paths[3];     /* reads seen per enum moe_store_io_path (armed or not) */
};

static struct inject g_in = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

static void on_read(void *user, const struct moe_store_read_info *r, struct moe_store_fault *f) {
    struct inject *in = user;
    pthread_mutex_lock(&in->mu);
    if (r->path >= 0 && r->path < 3) in->paths[r->path]++;
    int hit = 0;
    if (in->armed && in->prefetch) {
        hit = r->prefetch;
    } else if (in->armed && !r->prefetch) {
        if (!in->has_target) {
            in->has_target = 1, in->layer = r->layer, in->expert = r->expert, in->offset = r->offset;
            snprintf(in->prec, sizeof in->prec, "%s", r->precision);
        }
        hit = r->layer == in->layer && r->expert == in->expert && !strcmp(r->precision, in->prec);
        in->target_reads += hit;
    }
    hit = hit && in->shots != 0;
    if (hit && in->shots > 0) in->shots--;
    in->injected += hit;
    const enum fault kind = in->kind;
    const int delay = in->delay_ms;
    pthread_mutex_unlock(&in->mu);
    if (!hit) return;
    switch (kind) {
    case F_EIO: f->err = EIO; break;
    case F_SHORT: f->bytes = (int64_t)(r->bytes / 2); break;
    case F_EOF: f->bytes = 0; break;
    case F_CORRUPT: f->corrupt = 1; break;
    case F_SLOW: sleep_ms(delay); break;
    case F_SLOW_EOF: f->bytes = 0; break; /* after_read then holds the failure back */
    }
}

/* after_read: F_SLOW_EOF holds a failed prefetch's copy "loading" for delay_ms before the
 * store marks it failed, so a demand use of it meets the failure in flight */
static void after_read(void *user, const struct moe_store_read_info *r, enum moe_status rc) {
    struct inject *in = user;
    pthread_mutex_lock(&in->mu);
    const int hold = in->armed && in->kind == F_SLOW_EOF && r->prefetch && rc != MOE_OK;
    const int delay = in->delay_ms;
    in->holding += hold;
    pthread_mutex_unlock(&in->mu);
    if (hold) sleep_ms(delay);
}

static const struct moe_store_io_hooks g_hooks = {on_read, &g_in, after_read};

static void inject_reset(enum fault kind, int shots, int prefetch, int delay_ms) {
    pthread_mutex_lock(&g_in.mu);
    g_in.armed = 0, g_in.kind = kind, g_in.shots = shots, g_in.prefetch = prefetch, g_in.delay_ms = delay_ms;
    g_in.has_target = 0, g_in.injected = 0, g_in.target_reads = 0, g_in.holding = 0;
    memset(g_in.paths, 0, sizeof g_in.paths);
    pthread_mutex_unlock(&g_in.mu);
}

static void inject_set(int armed, int shots) {
    pthread_mutex_lock(&g_in.mu);
    g_in.armed = armed;
    if (shots != -2) g_in.shots = shots;
    pthread_mutex_unlock(&g_in.mu);
}

/* ---- the watchdog ---------------------------------------------------------- */

static char g_case[256];

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test-store-faults: a case hung (the watchdog fired): ";
    if (write(2, msg, sizeof msg - 1) < 0 || write(2, g_case, strlen(g_case)) < 0 || write(2, "\n", 1) < 0) {}
    _exit(1);
}

/* ---- runs ------------------------------------------------------------------ */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int32_t tok(int i) { return (int32_t)((37 * i + 11) % g_V); }

static struct moe_model *load(int lazy) {
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = "q8_0";
    mp.lazy_experts = lazy;
    struct moe_model *m = NULL;
    return moe_model_load(bundle, &mp, &m) == MOE_OK ? m : NULL;
}

/* reference: every logit of the run without a budget. */
static int reference(void) {
    struct moe_model *m = load(0);
    if (!m) return 0;
    g_V = m->cfg.n_vocab;
    g_ref = calloc((size_t)ROWS * (size_t)g_V, sizeof *g_ref);
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = 2;
    struct moe_session *s = NULL;
    int32_t ids[ROWS];
    for (int i = 0; i < ROWS; i++) ids[i] = tok(i);
    int ok = g_ref && moe_session_create(m, &p, &s) == MOE_OK && moe_session_forward(s, ids, NP, g_ref, 1) == MOE_OK;
    for (int i = NP; ok && i < ROWS; i++) ok = moe_session_forward(s, ids + i, 1, g_ref + (size_t)i * g_V, 0) == MOE_OK;
    moe_session_free(s);
    moe_model_free(m);
    return ok;
}

struct fcase {
    enum fault kind;
    int shots;        /* -1: for good */
    int prefetch;     /* strike prefetch reads */
    int delay_ms;
    double timeout;   /* --io-timeout */
    int must_fail;    /* the forward that needs the target fails with MOE_ERR_IO */
    const char *cause; /* must_fail: in the message */
    int free_at_once; /* after the failure: free the session at once (no retry) */
};

/* The outcome of one disturbed run. */
struct result {
    int failed;           /* the step whose forward failed first (-1: none) */
    enum moe_status st;
    double fail_s;        /* how long that forward took */
    int retry_ok;         /* the same forward, run again without the fault, succeeded */
    int same_before;      /* rows before the failed step equal the reference */
    int same_all;         /* every row equals the reference (after the retry) */
    double free_s;        /* moe_session_free's time */
    struct moe_store_stats stats;
};

static int rows_equal(const float *got, int from, int to) {
    return !memcmp(g_ref + (size_t)from * g_V, got + (size_t)from * g_V, sizeof(float) * (size_t)(to - from) * g_V);
}

static int disturbed(const struct fcase *c, enum moe_io_mode io, struct result *r) {
    memset(r, 0, sizeof *r);
    r->failed = -1;
    struct moe_model *m = load(1);
    if (!m) return 0;
    struct moe_store_params sp = moe_store_default_params();
    sp.dynamic = 0, sp.low_cap = 0, sp.policy = MOE_CACHE_LRU, sp.warm = 0, sp.io = io;
    sp.high_cap = c->prefetch ? 8 : 5;
    sp.prefetch_layers = c->prefetch ? 1 : 0;
    sp.io_timeout = c->timeout;
    sp.io_hooks = &g_hooks;
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = 2;
    p.store = &sp;
    struct moe_session *s = NULL;
    float *got = calloc((size_t)ROWS * (size_t)g_V, sizeof *got);
    if (!got || moe_session_create(m, &p, &s) != MOE_OK) {
        free(got);
        moe_model_free(m);
        return 0;
    }
    int32_t ids[ROWS];
    for (int i = 0; i < ROWS; i++) ids[i] = tok(i);
    int ok = moe_session_forward(s, ids, NP, got, 1) == MOE_OK;
    for (int i = 0; ok && i < ND; i++) {
        if (i == AT) inject_set(1, -2);
        float *row = got + (size_t)(NP + i) * g_V;
        const double t0 = now_s();
        enum moe_status st = moe_session_forward(s, ids + NP + i, 1, row, 0);
        if (st == MOE_OK) continue;
        if (r->failed >= 0) { /* failed again after the retry */
            ok = 0;
            break;
        }
        r->failed = i, r->st = st, r->fail_s = now_s() - t0;
        r->same_before = rows_equal(got, 0, NP + i);
        if (c->free_at_once) break;
        inject_set(0, 0); /* the fault is gone */
        if (c->kind == F_SLOW) { /* the slow read finishes meanwhile */
            struct timespec t = {0, 0};
            const double left = c->delay_ms / 1000.0 - r->fail_s + 0.2;
            if (left > 0) t.tv_sec = (time_t)left, t.tv_nsec = (long)((left - (double)(time_t)left) * 1e9);
            nanosleep(&t, NULL);
        }
        r->retry_ok = moe_session_forward(s, ids + NP + i, 1, row, 0) == MOE_OK;
        ok = r->retry_ok;
    }
    if (moe_session_store(s)) moe_store_get_stats(moe_session_store(s), &r->stats);
    if (r->failed < 0) r->same_before = rows_equal(got, 0, ROWS);
    r->same_all = ok && r->failed < 0 ? r->same_before : ok && rows_equal(got, 0, ROWS);
    const double t0 = now_s();
    moe_session_free(s);
    r->free_s = now_s() - t0;
    moe_model_free(m);
    free(got);
    return ok || r->failed >= 0;
}

static const char *const k_io_name[] = {"direct", "buffered", "mmap"};

static size_t wbytes(const struct moe_weight *w) {
    return (size_t)w->n_out * moe_qtype_row_bytes(w->type, w->n_in);
}

/* prefetch_fails_in_flight: the store driven directly. A prefetch of an expert not cached
 * fails (end of file; a prefetch no demand claimed is tried once) and after_read holds the
 * copy "loading" 300 ms before the store marks it failed; meanwhile a decode step routes
 * that expert: the plan binds the item to the prefetch (no read of its own), and the
 * acquire must then read the copy again as a demand read, not fail the step. Not a race:
 * the plan is made while the hook holds. */
static void prefetch_fails_in_flight(enum moe_io_mode io) {
    snprintf(g_case, sizeof g_case, "--io %s, a demand bound to a prefetch whose read fails in flight", k_io_name[io]);
    alarm(60);
    inject_reset(F_SLOW_EOF, -1, 1, 300);
    struct moe_model *m = load(1);
    struct moe_backend *be = NULL;
    struct moe_store *st = NULL;
    const int K = m ? m->cfg.n_expert_used : 0;
    struct moe_backend_params bp = {16, 8, 2, K, 1};
    struct moe_store_params sp = moe_store_default_params();
    sp.dynamic = 0, sp.low_cap = 0, sp.policy = MOE_CACHE_LRU, sp.warm = 0, sp.io = io, sp.io_hooks = &g_hooks;
    sp.high_cap = 4, sp.prefetch_layers = 1;
    int ok = m && moe_backend_cpu_new(m, &bp, &be) == MOE_OK && moe_store_new(m, be, &sp, K, &st) == MOE_OK;
    CHECK(ok, "%s: store made", g_case);
    if (ok) {
        const int E = m->cfg.n_expert;
        int32_t sel[8];
        float w[8];
        for (int j = 0; j < K; j++) sel[j] = j, w[j] = 1.0f / (float)K;
        struct moe_store_plan *plan = NULL;
        struct moe_ffn view;
        /* a decode step of layer 0 (prefetch hints follow decode steps) */
        ok = moe_store_plan(st, 0, 0, 1, sel, w, K, &plan) == MOE_OK;
        for (int i = 0; ok && i < plan->n_items; i++) {
            ok = moe_store_acquire(st, i, &view) == MOE_OK;
            moe_store_release(st, i);
        }
        /* layer 1's last expert, not cached: prefetched, the read fails and is held */
        const int32_t e = (int32_t)(E - 1);
        inject_set(1, -2);
        const int started = ok ? moe_store_prefetch_hint(st, 1, &e, NULL, 1, 1) : 0;
        int held = 0;
        for (int t = 0; started == 1 && !held && t < 2000; t++) {
            pthread_mutex_lock(&g_in.mu);
            held = g_in.holding;
            pthread_mutex_unlock(&g_in.mu);
            if (!held) sleep_ms(1);
        }
        CHECK(ok && started == 1 && held == 1, "%s: a prefetch started (%d) and its failed read is held (%d)", g_case,
              started, held);
        /* layer 1's step routes e: bound to the prefetch while its read is held, then read again */
        sel[0] = e;
        for (int j = 1; j < K; j++) sel[j] = j - 1;
        if (ok && held && moe_store_plan(st, 1, 1, 1, sel, w, K, &plan) == MOE_OK) {
            int found = 0, got_ok = 1;
            for (int i = 0; i < plan->n_items; i++) {
                const enum moe_status rc = moe_store_acquire(st, i, &view);
                got_ok &= rc == MOE_OK;
                if (rc == MOE_OK && plan->items[i].expert == e) {
                    struct moe_ffn ref;
                    found = moe_model_expert(m, 1, e, plan->items[i].precision, &ref) == MOE_OK &&
                            ref.gate.type == view.gate.type && ref.down.type == view.down.type &&
                            !memcmp(ref.gate.data, view.gate.data, wbytes(&ref.gate)) &&
                            !memcmp(ref.down.data, view.down.data, wbytes(&ref.down));
                }
                moe_store_release(st, i);
            }
            struct moe_store_stats ss;
            moe_store_get_stats(st, &ss);
            CHECK(got_ok && found, "%s: the step's experts load, the expert's copy is the bundle's (%d, %d)", g_case,
                  got_ok, found);
            CHECK(ss.prefetch_failed == 1 && ss.prefetch_reread == 1,
                  "%s: the prefetch failed (%lld) and the demand read it again (%lld)", g_case,
                  (long long)ss.prefetch_failed, (long long)ss.prefetch_reread);
        } else {
            CHECK(0, "%s: layer 1's plan", g_case);
        }
    }
    inject_set(0, 0);
    moe_store_free(st);
    moe_backend_free(be);
    moe_model_free(m);
    alarm(0);
}

static void one_case(const struct fcase *c, enum moe_io_mode io) {
    snprintf(g_case, sizeof g_case, "--io %s, %s %s of %s reads (delay %d ms, --io-timeout %g)", k_io_name[io],
             k_fault_name[c->kind], c->shots < 0 ? "for good" : "once", c->prefetch ? "prefetch" : "demand", c->delay_ms,
             c->timeout);
    alarm(120);
    inject_reset(c->kind, c->shots, c->prefetch, c->delay_ms);
    log_clear();
    struct result r;
    const int ran = disturbed(c, io, &r);
    alarm(0);
    CHECK(ran, "%s: runs", g_case);
    if (!ran) return;
    pthread_mutex_lock(&g_in.mu);
    const struct inject in = g_in;
    pthread_mutex_unlock(&g_in.mu);
    pthread_mutex_lock(&g_log_mu);
    /* the path each mode reads through */
    if (io == MOE_IO_MMAP)
        CHECK(in.paths[MOE_STORE_PATH_MMAP] > 0 && !in.paths[MOE_STORE_PATH_AIO] && !in.paths[MOE_STORE_PATH_PREAD],
              "%s: copies out of the mapping only (%d / %d / %d)", g_case, in.paths[0], in.paths[1], in.paths[2]);
    else if (io == MOE_IO_BUFFERED)
        CHECK(in.paths[MOE_STORE_PATH_PREAD] > 0 && !in.paths[MOE_STORE_PATH_AIO] && !in.paths[MOE_STORE_PATH_MMAP],
              "%s: pread only (%d / %d / %d)", g_case, in.paths[0], in.paths[1], in.paths[2]);
    else
        CHECK(in.paths[MOE_STORE_PATH_AIO] + in.paths[MOE_STORE_PATH_PREAD] > 0 && !in.paths[MOE_STORE_PATH_MMAP],
              "%s: AIO or pread (%d / %d / %d)", g_case, in.paths[0], in.paths[1], in.paths[2]);
    if (getenv("MOE_TEST_VERBOSE"))
        printf("%s: failed at step %d (%s) after %.3f s, retry %d, same %d/%d, free %.3f s, %d faults, %d target reads, "
               "paths %d/%d/%d, %lld loads, %lld retries, %lld failed (%lld prefetch of %lld), %lld timeouts\n%s",
               g_case, r.failed, moe_status_str(r.st), r.fail_s, r.retry_ok, r.same_before, r.same_all, r.free_s,
               in.injected, in.target_reads, in.paths[0], in.paths[1], in.paths[2], (long long)r.stats.loads,
               (long long)r.stats.read_retries, (long long)r.stats.reads_failed, (long long)r.stats.prefetch_failed,
               (long long)r.stats.prefetch_loads, (long long)r.stats.read_timeouts, g_log);
    CHECK(in.injected > 0, "%s: a fault was injected", g_case);
    CHECK(r.free_s < 5, "%s: the session freed in %.2f s", g_case, r.free_s);
    if (c->must_fail) {
        char who[160], off[64];
        snprintf(who, sizeof who, "layer %d expert %d precision %s", in.layer, in.expert, in.prec);
        snprintf(off, sizeof off, "offset %llu", in.offset);
        CHECK(r.failed >= AT && r.st == MOE_ERR_IO, "%s: the forward fails with MOE_ERR_IO after the fault (step %d: %s)",
              g_case, r.failed, moe_status_str(r.st));
        CHECK(r.same_before, "%s: the logits before the failure are the reference's", g_case);
        CHECK(g_n_err == 1 && strstr(g_log, who) && strstr(g_log, off) && strstr(g_log, c->cause) &&
                  strstr(g_log, bundle),
              "%s: one message naming the file, %s, %s and \"%s\":\n%s", g_case, who, off, c->cause, g_log);
        if (c->kind == F_SLOW)
            CHECK(r.fail_s >= c->timeout * 0.9 && r.fail_s < c->delay_ms / 1000.0,
                  "%s: the forward gave up after %.2f s (timeout %g s, the read takes %d ms)", g_case, r.fail_s,
                  c->timeout, c->delay_ms);
        if (c->kind == F_SLOW) CHECK(r.stats.read_timeouts >= 1, "%s: a timeout counted", g_case);
        else CHECK(r.stats.reads_failed >= 1 && r.stats.read_retries >= 1 && in.target_reads >= MOE_STORE_READ_TRIES,
                   "%s: the read tried %d times (%lld failed, %lld retries)", g_case, in.target_reads,
                   (long long)r.stats.reads_failed, (long long)r.stats.read_retries);
        if (!c->free_at_once)
            CHECK(r.retry_ok && r.same_all, "%s: without the fault the same forward succeeds and every logit is the "
                  "reference's (retry %d, same %d)", g_case, r.retry_ok, r.same_all);
    } else {
        CHECK(r.failed < 0 && g_n_err == 0, "%s: no forward fails (step %d), no error:\n%s", g_case, r.failed, g_log);
        CHECK(r.same_all, "%s: logits bit-identical to the run without a budget", g_case);
        CHECK(r.stats.reads_failed == r.stats.prefetch_failed, "%s: only prefetch reads failed (%lld, %lld)", g_case,
              (long long)r.stats.reads_failed, (long long)r.stats.prefetch_failed);
        if (c->prefetch && c->kind != F_SLOW)
            CHECK(r.stats.prefetch_failed >= 1 && r.stats.prefetch_loads >= 1, "%s: %lld prefetch reads failed of %lld",
                  g_case, (long long)r.stats.prefetch_failed, (long long)r.stats.prefetch_loads);
        if (!c->prefetch && (c->kind == F_EIO || c->kind == F_CORRUPT))
            CHECK(r.stats.read_retries >= 1 && in.target_reads >= 2, "%s: read again (%lld retries, %d reads)", g_case,
                  (long long)r.stats.read_retries, in.target_reads);
        if (!c->prefetch && c->kind == F_SHORT)
            CHECK(r.stats.read_retries == 0 && in.target_reads >= 2, "%s: continued, not retried (%lld retries, %d reads)",
                  g_case, (long long)r.stats.read_retries, in.target_reads);
    }
    pthread_mutex_unlock(&g_log_mu);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: test-store-faults moe-prep MODEL_DIR WORK_DIR\n");
        return 2;
    }
    prep = argv[1], model_dir = argv[2], work = argv[3];
    signal(SIGALRM, on_alarm);
    snprintf(bundle, sizeof bundle, "%s/tiny.moeb", work);
    if (moe_test_sh("rm -rf '%s' && mkdir -p '%s'", work, work) != 0 ||
        moe_test_sh("'%s' quantize '%s' -o '%s' --experts q8_0,q2_k --dense q8_0 >/dev/null 2>&1", prep, model_dir,
                    bundle)) {
        fprintf(stderr, "test-store-faults: cannot quantize %s into %s\n", model_dir, work);
        return 1;
    }
    moe_log_set(on_log, NULL);
    moe_log_set_level(MOE_LOG_WARN);
    snprintf(g_case, sizeof g_case, "the reference run");
    alarm(120);
    if (!reference()) {
        fprintf(stderr, "test-store-faults: the reference run failed\n");
        return 1;
    }
    alarm(0);
    static const struct fcase cases[] = {
        /* demand reads */
        {F_EIO, 1, 0, 0, 30, 0, NULL, 0},
        {F_EIO, -1, 0, 0, 30, 1, "Input/output error", 0},
        {F_SHORT, 1, 0, 0, 30, 0, NULL, 0},
        {F_EOF, -1, 0, 0, 30, 1, "unexpected end of file", 0},
        {F_CORRUPT, 1, 0, 0, 30, 0, NULL, 0},
        {F_CORRUPT, -1, 0, 0, 30, 1, "fail their checksum", 0},
        {F_SLOW, 1, 0, 300, 5, 0, NULL, 0},
        {F_SLOW, 1, 0, 300, 0, 0, NULL, 0}, /* 0: wait forever */
        {F_SLOW, 1, 0, 1600, 0.5, 1, "the storage did not answer", 0},
        /* prefetch reads */
        {F_EIO, -1, 1, 0, 30, 0, NULL, 0},
        {F_EOF, -1, 1, 0, 30, 0, NULL, 0},
        {F_CORRUPT, -1, 1, 0, 30, 0, NULL, 0},
        {F_SLOW, -1, 1, 50, 30, 0, NULL, 0},
    };
    for (int io = 0; io < 3; io++) {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) one_case(&cases[i], (enum moe_io_mode)io);
        prefetch_fails_in_flight((enum moe_io_mode)io);
    }
    /* teardown right after a timed-out read: the free waits for it (within --io-timeout) and joins */
    static const struct fcase at_once = {F_SLOW, 1, 0, 1500, 1, 1, "the storage did not answer", 1};
    one_case(&at_once, MOE_IO_DIRECT);
    moe_log_set(NULL, NULL);
    free(g_ref);
    printf("test-store-faults: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    if (!fails) moe_test_sh("rm -rf '%s'", work);
    return fails != 0;
}

/*
 * test-backend-seam.c - the backend interface's version-3 hooks, host-side,
 * with a test backend that wraps the CPU reference backend (so every number
 * is the reference's) but behaves towards the session and the expert store
 * as a GPU backend does:
 *   - a layer's experts arrive in one expert_batch call (the session's batched
 *     path): logits bit-identical to the plain CPU backend, expert() unused;
 *   - its buffers have no host view (device-only): the store fills them
 *     through stage_begin / stage_end from a pinned-style host tier (the real
 *     moe_host_tier, on malloc); place() sends some non-resident experts to
 *     the host (Twiddler): logits bit-identical to the reference, the store's
 *     hit / miss / skip counts equal to the same budget on the CPU backend
 *     (the policy is unchanged), host runs and host-tier hits happen;
 *   - decode steps of six experts under Twiddler's static placement: more
 *     scratch copies than scratch slots per step, so the session must run
 *     them in groups; logits and counts equal the CPU backend's;
 *   - a backend of interface version 1 is driven without the version-3
 *     members, one of an unknown version is refused.
 * argv: moe-prep MODEL_DIR WORK_DIR.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "moe-backend.h"
#include "moe-cache.h"
#include "moe-host-tier.h"
#include "moe-session.h"
#include "moe-test.h"

/* ---- the wrapping backend ----------------------------------------------- */

struct wrap {
    struct moe_backend *cpu;
    struct moe_backend_iface iface;
    int device_only;         /* buffers without a host view, filled through stage hooks */
    int place_mode;          /* 0: no place(); 1: every other non-resident expert on the host */
    struct moe_host_tier *tier;
    /* counts */
    int n_expert_calls, n_batch_calls, n_works, n_host_works, n_place_host;
    int n_stage, n_bad_v3_call;
};

static struct wrap *W(struct moe_backend *be) { return be->ctx; }
static struct moe_backend *C(struct moe_backend *be) { return W(be)->cpu; }

static enum moe_status w_buffer_alloc(struct moe_backend *be, size_t size, struct moe_buffer *out) {
    if (!W(be)->device_only) return C(be)->iface->buffer_alloc(C(be), size, out);
    memset(out, 0, sizeof *out);
    void *p = NULL;
    if (posix_memalign(&p, 4096, size ? size : 4096)) return MOE_ERR_NOMEM;
    out->data = p, out->host = NULL, out->size = size, out->priv = p;
    return MOE_OK;
}
static void w_buffer_free(struct moe_backend *be, struct moe_buffer *b) {
    if (!W(be)->device_only) {
        C(be)->iface->buffer_free(C(be), b);
        return;
    }
    free(b->priv);
    memset(b, 0, sizeof *b);
}
static enum moe_status w_buffer_write(struct moe_backend *be, struct moe_buffer *dst, size_t off, const void *src, size_t n) {
    if (!W(be)->device_only) return C(be)->iface->buffer_write(C(be), dst, off, src, n);
    if (off > dst->size || n > dst->size - off) return MOE_ERR_RANGE;
    memcpy((char *)dst->data + off, src, n);
    return MOE_OK;
}
static enum moe_status w_embed(struct moe_backend *be, const int32_t *t, int n) { return C(be)->iface->embed(C(be), t, n); }
static enum moe_status w_set_x(struct moe_backend *be, const float *x, int n) { return C(be)->iface->set_x(C(be), x, n); }
static enum moe_status w_get_x(struct moe_backend *be, float *x, int n) { return C(be)->iface->get_x(C(be), x, n); }
static enum moe_status w_get_xn(struct moe_backend *be, float *x, int n) { return C(be)->iface->get_xn(C(be), x, n); }
static enum moe_status w_attention(struct moe_backend *be, int l, int p, int n, int len) {
    return C(be)->iface->attention(C(be), l, p, n, len);
}
static enum moe_status w_ffn_norm(struct moe_backend *be, int l, int n) { return C(be)->iface->ffn_norm(C(be), l, n); }
static enum moe_status w_router(struct moe_backend *be, int l, int n, float *lg) { return C(be)->iface->router(C(be), l, n, lg); }
static enum moe_status w_expert(struct moe_backend *be, const struct moe_ffn *f, const int32_t *rows, const int32_t *slots,
                                const float *w, int n, float *out) {
    W(be)->n_expert_calls++;
    return C(be)->iface->expert(C(be), f, rows, slots, w, n, out);
}
static enum moe_status w_dense(struct moe_backend *be, int l, int n) { return C(be)->iface->dense(C(be), l, n); }
static enum moe_status w_residual(struct moe_backend *be, int n) { return C(be)->iface->residual(C(be), n); }
static enum moe_status w_lm_head(struct moe_backend *be, int r, int n, float *lg) { return C(be)->iface->lm_head(C(be), r, n, lg); }
static enum moe_status w_ffn_rows(struct moe_backend *be, const struct moe_ffn *f, const float *x, float *y, int n) {
    return C(be)->iface->ffn_rows(C(be), f, x, y, n);
}
static enum moe_status w_lm_head_rows(struct moe_backend *be, const float *x, int n, float *lg) {
    return C(be)->iface->lm_head_rows(C(be), x, n, lg);
}
static size_t w_kv_cache_bytes(struct moe_backend *be) { return C(be)->iface->kv_cache_bytes(C(be)); }

/* w_expert_batch: the works in order through the CPU backend (host works too:
 * their views are host memory, which is the CPU backend's). */
static enum moe_status w_expert_batch(struct moe_backend *be, const struct moe_expert_work *wk, int n) {
    struct wrap *s = W(be);
    if (s->iface.version < 3) s->n_bad_v3_call++;
    s->n_batch_calls++;
    for (int i = 0; i < n; i++) {
        s->n_works++;
        s->n_host_works += wk[i].host != 0;
        enum moe_status st = C(be)->iface->expert(C(be), &wk[i].f, wk[i].rows, wk[i].slots, wk[i].w, wk[i].n_rows, wk[i].out);
        if (st) return st;
    }
    return MOE_OK;
}

static void w_place(struct moe_backend *be, int layer, int n, const int32_t *tokens, const int32_t *prec,
                    const uint8_t *resident, uint8_t *host) {
    struct wrap *s = W(be);
    if (s->iface.version < 3) s->n_bad_v3_call++;
    for (int i = 0; i < n; i++) {
        host[i] = s->place_mode == 1 && !resident[i] && (i % 2 == 0) && tokens[i] > 0 && prec[i] >= 0;
        s->n_place_host += host[i];
    }
    (void)layer;
}

static enum moe_status w_stage_begin(struct moe_backend *be, uint64_t key, size_t room, void **host, int *ready) {
    struct wrap *s = W(be);
    __atomic_fetch_add(&s->n_stage, 1, __ATOMIC_RELAXED);
    return moe_host_tier_acquire(s->tier, key, room, host, ready);
}

static enum moe_status w_stage_end(struct moe_backend *be, uint64_t key, void *host, int ok, struct moe_buffer *dst,
                                   size_t n) {
    (void)key;
    enum moe_status st = ok ? w_buffer_write(be, dst, 0, host, n) : MOE_OK;
    moe_host_tier_release(W(be)->tier, host, ok && st == MOE_OK);
    return st;
}

/* The counts of the last backend freed (its session is gone by the time a test looks). */
static struct wrap g_final;
static struct moe_host_tier_stats g_final_tier;
static int g_made;

static void w_free(struct moe_backend *be) {
    struct wrap *s = W(be);
    memset(&g_final_tier, 0, sizeof g_final_tier);
    if (s->tier) moe_host_tier_get_stats(s->tier, &g_final_tier);
    g_final = *s;
    g_final.tier = NULL, g_final.cpu = NULL;
    moe_backend_free(s->cpu);
    moe_host_tier_free(s->tier);
    free(s);
    free(be);
}

static void *t_alloc(void *u, size_t n) {
    (void)u;
    void *p = NULL;
    return posix_memalign(&p, 4096, n) ? NULL : p;
}
static void t_free(void *u, void *p) {
    (void)u;
    free(p);
}

/* What the next wrap_new makes. */
static struct wrap g_cfg;

static enum moe_status wrap_new(const struct moe_model *m, const struct moe_backend_params *p, void *user,
                                struct moe_backend **out) {
    (void)user;
    struct moe_backend *be = calloc(1, sizeof *be);
    struct wrap *s = calloc(1, sizeof *s);
    if (!be || !s) return MOE_ERR_NOMEM;
    *s = g_cfg;
    enum moe_status st = moe_backend_cpu_new(m, p, &s->cpu);
    struct moe_host_tier_ops ops = {t_alloc, t_free, NULL};
    if (!st) st = moe_host_tier_new(20, (size_t)1 << 20, 2, &ops, &s->tier);
    if (st) {
        moe_backend_free(s->cpu);
        free(s);
        free(be);
        return st;
    }
    struct moe_backend_iface *i = &s->iface;
    const int version = g_cfg.iface.version ? (int)g_cfg.iface.version : MOE_BACKEND_VERSION;
    *i = (struct moe_backend_iface){(uint32_t)version, "seam-test", w_free, w_buffer_alloc, w_buffer_free,
                                    w_buffer_write, w_embed, w_set_x, w_get_x, w_get_xn, w_attention, w_ffn_norm,
                                    w_router, w_expert, w_dense, w_residual, w_lm_head, w_ffn_rows, w_lm_head_rows,
                                    w_kv_cache_bytes, w_expert_batch, s->place_mode ? w_place : NULL,
                                    s->device_only ? w_stage_begin : NULL, s->device_only ? w_stage_end : NULL,
                                    NULL, NULL, NULL, NULL, NULL};
    be->iface = i;
    be->ctx = s;
    g_made = 1;
    *out = be;
    return MOE_OK;
}

/* ---- runs ----------------------------------------------------------------- */

static const char *prep, *model_dir, *work;

#define NP 12
#define ND 10

/* run: two sequences (prompt + decode steps) on the CPU backend (wrapped =
 * 0) or the wrapping one; all logits into out [2 x (NP+ND) x V]. */
static int run(const char *path, int wrapped, int k, const struct moe_store_params *sp, float *out,
               struct moe_store_stats *stats) {
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = sp ? "q8_0" : NULL;
    mp.lazy_experts = sp != NULL;
    struct moe_model *m = NULL;
    struct moe_session *s = NULL;
    if (moe_model_load(path, &mp, &m) != MOE_OK) return 0;
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = 2;
    p.store = sp;
    p.n_expert_used = k;
    if (wrapped) p.backend_new = wrap_new;
    int ok = moe_session_create(m, &p, &s) == MOE_OK;
    const size_t V = (size_t)m->cfg.n_vocab;
    for (int q = 0; ok && q < 2; q++) {
        int32_t ids[NP + ND];
        for (int i = 0; i < NP + ND; i++) ids[i] = (int32_t)((37 * i + 101 * q + 5) % m->cfg.n_vocab);
        moe_session_reset(s);
        float *o = out + (size_t)q * (NP + ND) * V;
        ok = moe_session_forward(s, ids, NP, o, 1) == MOE_OK;
        for (int i = NP; ok && i < NP + ND; i++) ok = moe_session_forward(s, ids + i, 1, o + (size_t)i * V, 0) == MOE_OK;
    }
    if (ok && stats) {
        memset(stats, 0, sizeof *stats);
        if (moe_session_store(s)) moe_store_get_stats(moe_session_store(s), stats);
    }
    moe_session_free(s);
    moe_model_free(m);
    return ok;
}

static int same_counts(const struct moe_store_stats *a, const struct moe_store_stats *b) {
    return a->accesses == b->accesses && a->hits_high == b->hits_high && a->hits_low == b->hits_low &&
           a->misses_high == b->misses_high && a->misses_low == b->misses_low && a->skips == b->skips;
}

static void resident_batched(size_t n) {
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    memset(&g_cfg, 0, sizeof g_cfg), g_made = 0;
    CHECK(ref && got && run(model_dir, 0, 0, NULL, ref, NULL) && run(model_dir, 1, 0, NULL, got, NULL), "resident runs");
    CHECK(ref && got && !memcmp(ref, got, n * sizeof *ref), "batched experts: logits bit-identical to the CPU backend");
    CHECK(g_made && g_final.n_batch_calls > 0 && g_final.n_expert_calls == 0 && g_final.n_works > g_final.n_batch_calls,
          "one expert_batch call per MoE layer step (%d calls, %d works, %d expert())", g_made ? g_final.n_batch_calls : 0,
          g_made ? g_final.n_works : 0, g_made ? g_final.n_expert_calls : 0);
    free(ref);
    free(got);
}

static void device_only_store(const char *bundle, size_t n) {
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    struct moe_store_params sp = moe_store_default_params();
    sp.policy = 0; /* lru */
    sp.dynamic = 0, sp.high_cap = 5, sp.low_cap = 0;
    struct moe_store_stats cpu_st, wrap_st;
    CHECK(ref && got && run(bundle, 0, 0, NULL, ref, NULL), "reference run");
    CHECK(run(bundle, 0, 0, &sp, got, &cpu_st) && !memcmp(ref, got, n * sizeof *ref), "the CPU backend with the budget");
    memset(&g_cfg, 0, sizeof g_cfg), g_made = 0;
    g_cfg.device_only = 1, g_cfg.place_mode = 1;
    CHECK(run(bundle, 1, 0, &sp, got, &wrap_st), "device-only slots, staged loads, place()");
    CHECK(!memcmp(ref, got, n * sizeof *ref), "staged loads and host experts: logits bit-identical to the reference");
    CHECK(same_counts(&cpu_st, &wrap_st), "the policy's counts are unchanged: accesses %lld/%lld, misses %lld/%lld",
          (long long)cpu_st.accesses, (long long)wrap_st.accesses, (long long)cpu_st.misses_high,
          (long long)wrap_st.misses_high);
    const struct moe_host_tier_stats ts = g_final_tier;
    CHECK(g_made && wrap_st.host_runs > 0 && wrap_st.host_runs == g_final.n_place_host &&
              g_final.n_host_works == wrap_st.host_runs,
          "host runs: store %lld, place %d, works %d", (long long)wrap_st.host_runs, g_made ? g_final.n_place_host : -1,
          g_made ? g_final.n_host_works : -1);
    CHECK(g_made && g_final.n_stage > 0 && ts.hits > 0 && ts.misses > 0 && ts.hits + ts.misses == g_final.n_stage,
          "every load went through the stage hooks (%d), the host tier served some (%lld hits, %lld misses)",
          g_made ? g_final.n_stage : 0, (long long)ts.hits, (long long)ts.misses);
    /* reads asked for (loads counts only the reads that started; a kept copy of a host expert may be
     * evicted before its read starts) */
    CHECK(wrap_st.loads + wrap_st.reads_cancelled + wrap_st.reads_queued ==
              cpu_st.loads + cpu_st.reads_cancelled + cpu_st.reads_queued - (cpu_st.scratch_loads - wrap_st.scratch_loads),
          "reads asked for: the CPU run's minus the scratch reads host experts did not need (%lld, %lld)",
          (long long)(wrap_st.loads + wrap_st.reads_cancelled + wrap_st.reads_queued),
          (long long)(cpu_st.loads + cpu_st.reads_cancelled + cpu_st.reads_queued));
    free(ref);
    free(got);
}

static void scratch_groups(const char *bundle, size_t n) {
    /* Twiddler's static placement (from the profile's tuning) keeps 6 of 32
     * experts and never admits a miss: with six experts per token, most of a
     * decode step's experts are read into scratch */
    char text[1200];
    snprintf(text, sizeof text, "%s/heldout/c4.txt", model_dir);
    FILE *f = fopen(text, "r");
    if (f) fclose(f);
    else snprintf(text, sizeof text, "%s", MOE_FIXTURES "/demo/calibration.txt");
    CHECK(moe_test_sh("'%s' profile '%s' --dataset '%s' -o '%s/p.h5' --ctx 128 --max-tokens 1024 >/dev/null 2>&1", prep, bundle,
             text, work) == 0,
          "profile the bundle (placement order in its tuning)");
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    struct moe_store_params sp = moe_store_default_params();
    sp.policy = MOE_CACHE_STATIC;
    sp.dynamic = 0, sp.high_cap = 6, sp.low_cap = 0;
    struct moe_store_stats cpu_st, wrap_st;
    CHECK(ref && got && run(bundle, 0, 6, &sp, ref, &cpu_st), "CPU backend, six experts per token, static placement");
    memset(&g_cfg, 0, sizeof g_cfg), g_made = 0;
    g_cfg.device_only = 1;
    CHECK(run(bundle, 1, 6, &sp, got, &wrap_st), "wrapped backend, same");
    CHECK(!memcmp(ref, got, n * sizeof *ref), "grouped batches: logits bit-identical to the CPU backend's per-expert run");
    CHECK(same_counts(&cpu_st, &wrap_st) && wrap_st.scratch_loads == cpu_st.scratch_loads,
          "same counts (scratch loads %lld / %lld)", (long long)cpu_st.scratch_loads, (long long)wrap_st.scratch_loads);
    CHECK(cpu_st.scratch_loads > 2LL * 2 * ND * 4, "more scratch copies than scratch slots per decode step (%lld)",
          (long long)cpu_st.scratch_loads);
    CHECK(g_made && g_final.n_batch_calls > 2 * ND * 4, "decode steps ran in several groups (%d calls)",
          g_made ? g_final.n_batch_calls : 0);
    free(ref);
    free(got);
}

static void versions(size_t n) {
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    memset(&g_cfg, 0, sizeof g_cfg), g_made = 0;
    g_cfg.iface.version = 1;
    CHECK(ref && got && run(model_dir, 0, 0, NULL, ref, NULL) && run(model_dir, 1, 0, NULL, got, NULL),
          "a version-1 backend runs");
    CHECK(ref && got && !memcmp(ref, got, n * sizeof *ref) && g_made && g_final.n_bad_v3_call == 0 &&
              g_final.n_expert_calls > 0,
          "without its version-3 members (expert() %d calls)", g_made ? g_final.n_expert_calls : 0);
    g_cfg.iface.version = 99;
    struct moe_model *m = NULL;
    struct moe_session *s = NULL;
    struct moe_session_params p = moe_session_default_params();
    p.backend_new = wrap_new;
    CHECK(moe_model_load(model_dir, NULL, &m) == MOE_OK && moe_session_create(m, &p, &s) == MOE_ERR_UNSUPPORTED && !s,
          "an unknown version is refused");
    moe_model_free(m);
    free(ref);
    free(got);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: test-backend-seam moe-prep MODEL_DIR WORK_DIR\n");
        return 2;
    }
    prep = argv[1], model_dir = argv[2], work = argv[3];
    char bundle[1200];
    snprintf(bundle, sizeof bundle, "%s/tiny.moeb", work);
    if (moe_test_sh("rm -rf '%s' && mkdir -p '%s'", work, work) != 0 ||
        moe_test_sh("'%s' quantize '%s' -o '%s' --experts q8_0,q2_k --dense q8_0 >/dev/null 2>&1", prep, model_dir, bundle)) {
        fprintf(stderr, "test-backend-seam: cannot quantize %s into %s\n", model_dir, work);
        return 1;
    }
    moe_log_set_level(MOE_LOG_ERROR);
    struct moe_model *m = NULL;
    if (moe_model_load(model_dir, NULL, &m) != MOE_OK) return 1;
    const size_t n = 2 * (NP + ND) * (size_t)m->cfg.n_vocab;
    moe_model_free(m);
    resident_batched(n);
    device_only_store(bundle, n);
    scratch_groups(bundle, n);
    versions(n);
    printf("test-backend-seam: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    if (!fails) moe_test_sh("rm -rf '%s'", work);
    return fails != 0;
}

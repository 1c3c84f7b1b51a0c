/*
 * test-backend-reg.c - the backend registry and the member wrappers
 * (runtime/backend/backend.c):
 *   - the registry lists the CPU backend first and, in a CUDA build, "cuda";
 *     names, device specs ("cpu", "cuda:3", "auto") parse or are refused with
 *     a message naming what this build has;
 *   - init_by_name / init_best make a CPU backend, refuse an unknown name
 *     (MOE_ERR_INVALID), a kind this build lacks (MOE_ERR_UNSUPPORTED), a
 *     device that is not there (MOE_ERR_BACKEND); a session made by device
 *     name runs and gives the same logits as one made by the CPU constructor;
 *   - supports() answers from the CPU backend's member and from the members;
 *   - each wrapper gates on the backend's version and NULL slots: a
 *     version-2 backend's expert_batch slot is not called (expert() per work
 *     is), place() on a backend without it sends nothing to the host, an
 *     absent stage_begin is MOE_ERR_UNSUPPORTED, and moe_backend_check refuses
 *     a newer version or a missing required member.
 */
#include <string.h>

#include "moe-backend.h"
#include "moe-model.h"
#include "moe-session.h"
#include "moe-test-log.h"
#include "moe-test.h"

#define MODEL MOE_FIXTURES "/models/olmoe-f32"

static void names(void) {
    CHECK(moe_backend_reg_count() >= 1 && moe_backend_reg_get(0) == &moe_backend_reg_cpu, "the CPU backend is first");
    CHECK(moe_backend_reg_get(-1) == NULL && moe_backend_reg_get(moe_backend_reg_count()) == NULL, "out of range");
    CHECK(moe_backend_reg_by_name("cpu") == &moe_backend_reg_cpu && !moe_backend_reg_by_name("tpu") &&
              !moe_backend_reg_by_name(NULL),
          "by name");
    CHECK(moe_backend_kind_known("cpu") && moe_backend_kind_known("cuda") && !moe_backend_kind_known("tpu"),
          "known kinds");
#ifdef MOE_HAVE_CUDA
    CHECK(moe_backend_reg_by_name("cuda") != NULL && moe_backend_reg_count() == 2, "a CUDA build registers cuda");
#else
    CHECK(moe_backend_reg_by_name("cuda") == NULL && moe_backend_reg_count() == 1, "a CPU build has only cpu");
#endif
    for (int i = 0; i < moe_backend_reg_count(); i++) {
        const struct moe_backend_reg *r = moe_backend_reg_get(i);
        CHECK(r->name && r->description && r->device_count && r->describe && r->init, "row %d is complete", i);
    }
    char buf[128];
    CHECK(moe_backend_reg_cpu.device_count() == 1 && moe_backend_reg_cpu.describe(0, buf, sizeof buf) == 0 &&
              strstr(buf, "CPU"),
          "the CPU device describes itself: %s", buf);

    char name[32], err[256];
    int index = -1;
    CHECK(moe_backend_parse_device("cpu", name, sizeof name, &index, err, sizeof err) == MOE_OK &&
              !strcmp(name, "cpu") && index == 0,
          "cpu");
    CHECK(moe_backend_parse_device("cuda:3", name, sizeof name, &index, err, sizeof err) == MOE_OK &&
              !strcmp(name, "cuda") && index == 3,
          "cuda:3 parses in every build (init says whether it is built)");
    CHECK(moe_backend_parse_device("auto", name, sizeof name, &index, err, sizeof err) == MOE_OK &&
              !strcmp(name, "auto") && index == 0,
          "auto");
    static const char *const bad[] = {"", "tpu", "cuda:", "cuda:x", "cuda:64", "cuda:-1", "auto:1", ":1",
                                      "averyveryveryveryveryverylongname"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK(moe_backend_parse_device(bad[i], name, sizeof name, &index, err, sizeof err) == MOE_ERR_INVALID &&
                  strstr(err, "--device"),
              "\"%s\" is refused with a message (%s)", bad[i], err);
    }
    CHECK(moe_backend_parse_device("tpu", name, sizeof name, &index, err, sizeof err) == MOE_ERR_INVALID &&
              strstr(err, "cpu"),
          "the message lists what this build has: %s", err);
}

static void init(const struct moe_model *m) {
    const struct moe_backend_params bp = {64, 16, 1, m->cfg.n_expert_used, 1};
    struct moe_backend *be = NULL;
    CHECK(moe_backend_init_by_name("cpu", 0, m, &bp, NULL, &be) == MOE_OK && be &&
              !strcmp(moe_backend_name(be), "cpu") && moe_backend_check(be) == MOE_OK,
          "cpu by name");
    CHECK(moe_backend_supports(be, MOE_BACKEND_FEAT_CPU_LAYOUTS) && moe_backend_supports(be, MOE_BACKEND_FEAT_HOST_MEMORY) &&
              moe_backend_supports(be, MOE_BACKEND_FEAT_EXPERT_BATCH) && !moe_backend_supports(be, MOE_BACKEND_FEAT_PLACE) &&
              !moe_backend_supports(be, MOE_BACKEND_FEAT_STAGE),
          "what the CPU backend supports");
    CHECK(moe_backend_stats_json(be) == NULL, "the CPU backend has no counters of its own");
    moe_backend_free(be);
    be = NULL;
    CHECK(moe_backend_init_by_name(NULL, 0, m, &bp, NULL, &be) == MOE_OK && be && !strcmp(moe_backend_name(be), "cpu"),
          "no name: the CPU backend");
    moe_backend_free(be);

    log_reset();
    be = (struct moe_backend *)1;
    CHECK(moe_backend_init_by_name("cpu", 1, m, &bp, NULL, &be) == MOE_ERR_BACKEND && !be && strstr(g_err, "cpu:1"),
          "cpu:1 is not a device: %s", g_err);
    log_reset();
    CHECK(moe_backend_init_by_name("tpu", 0, m, &bp, NULL, &be) == MOE_ERR_INVALID && !be && strstr(g_err, "tpu"),
          "an unknown name: %s", g_err);
    log_reset();
    const enum moe_status cuda = moe_backend_init_by_name("cuda", 0, m, &bp, NULL, &be);
    const struct moe_backend_reg *cr = moe_backend_reg_by_name("cuda");
    if (!cr)
        CHECK(cuda == MOE_ERR_UNSUPPORTED && !be && strstr(g_err, "MOE_CUDA"), "cuda in a CPU build: %s", g_err);
    else if (cr->device_count() == 0)
        CHECK(cuda == MOE_ERR_BACKEND && !be && strstr(g_err, "no device"), "cuda without a GPU: %s", g_err);
    else
        CHECK(cuda == MOE_OK && be && !strcmp(moe_backend_name(be), "cuda"), "cuda on a GPU");
    moe_backend_free(be);
    be = NULL;
    const struct moe_backend_reg *best = NULL;
    for (int i = 1; i < moe_backend_reg_count() && !best; i++)
        if (moe_backend_reg_get(i)->device_count() > 0) best = moe_backend_reg_get(i);
    CHECK(moe_backend_init_best(m, &bp, NULL, &be) == MOE_OK && be &&
              !strcmp(moe_backend_name(be), best ? best->name : "cpu"),
          "init_best picks %s", best ? best->name : "cpu");
    moe_backend_free(be);
    moe_backend_free(NULL);
}

/* A session made by device name computes what one made by the CPU constructor does. */
static enum moe_status cpu_ctor(const struct moe_model *m, const struct moe_backend_params *p, void *user,
                                struct moe_backend **out) {
    (void)user;
    return moe_backend_cpu_new(m, p, out);
}

static int logits_of(const struct moe_model *m, const char *device, moe_backend_new_fn ctor, float *out) {
    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = 32, sp.n_threads = 1, sp.device = device, sp.backend_new = ctor;
    struct moe_session *s = NULL;
    const int32_t ids[5] = {1, 7, 3, 9, 4};
    const int ok = moe_session_create(m, &sp, &s) == MOE_OK && moe_session_forward(s, ids, 5, out, 0) == MOE_OK;
    moe_session_free(s);
    return ok;
}

static void sessions(const struct moe_model *m) {
    const size_t V = (size_t)m->cfg.n_vocab;
    float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
    CHECK(a && b && logits_of(m, "cpu", NULL, a) && logits_of(m, NULL, cpu_ctor, b) && !memcmp(a, b, V * sizeof *a),
          "a session by device name gives the CPU constructor's logits");
    CHECK(logits_of(m, "auto", NULL, b) && (moe_backend_reg_count() > 1 || !memcmp(a, b, V * sizeof *a)),
          "auto runs (the CPU's logits in a CPU build)");
    struct moe_session_params sp = moe_session_default_params();
    sp.device = "tpu:0";
    struct moe_session *s = (struct moe_session *)1;
    log_reset();
    CHECK(moe_session_create(m, &sp, &s) == MOE_ERR_INVALID && !s && strstr(g_err, "tpu"), "a bad device: %s", g_err);
    free(a);
    free(b);
}

/* ---- the wrappers, on a hand-made backend ---------------------------------------- */

static int g_expert_calls, g_batch_calls, g_place_calls, g_kv_calls;

static enum moe_status f_expert(struct moe_backend *be, const struct moe_ffn *f, const int32_t *rows,
                                const int32_t *slots, const float *w, int n_rows, float *out) {
    g_expert_calls++;
    return MOE_OK;
}
static enum moe_status f_batch(struct moe_backend *be, const struct moe_expert_work *w, int n) {
    g_batch_calls++;
    return MOE_OK;
}
static void f_place(struct moe_backend *be, int layer, int n, const int32_t *t, const int32_t *p, const uint8_t *r,
                    uint8_t *host) {
    g_place_calls++;
    memset(host, 1, (size_t)n);
}
static size_t f_kv(struct moe_backend *be) {
    g_kv_calls++;
    return 123;
}
static void f_free(struct moe_backend *be) {}
static enum moe_status f_any(void) { return MOE_OK; }

static void wrappers(void) {
    struct moe_backend_iface fi;
    memset(&fi, 0, sizeof fi);
    fi.version = 2, fi.name = "fake", fi.free = f_free, fi.expert = f_expert, fi.expert_batch = f_batch;
    fi.place = f_place, fi.kv_cache_bytes = f_kv;
    struct moe_backend be = {&fi, NULL};
    struct moe_expert_work w[3];
    memset(w, 0, sizeof w);
    g_expert_calls = g_batch_calls = 0;
    CHECK(moe_backend_expert_batch(&be, w, 3) == MOE_OK && g_batch_calls == 0 && g_expert_calls == 3,
          "a version-2 backend's expert_batch slot is not called (expert() x3: %d, batch %d)", g_expert_calls,
          g_batch_calls);
    CHECK(!moe_backend_supports(&be, MOE_BACKEND_FEAT_EXPERT_BATCH) && !moe_backend_supports(&be, MOE_BACKEND_FEAT_PLACE),
          "version 2 has no version-3 features");
    w[1].host = 1;
    log_reset();
    CHECK(moe_backend_expert_batch(&be, w, 3) == MOE_ERR_UNSUPPORTED && strstr(g_err, "fake"),
          "a host work without expert_batch is refused: %s", g_err);
    uint8_t host[4] = {7, 7, 7, 7};
    g_place_calls = 0;
    moe_backend_place(&be, 0, 4, NULL, NULL, NULL, host);
    CHECK(g_place_calls == 0 && !host[0] && !host[3], "no place before version 3: nothing runs on the host");
    g_kv_calls = 0;
    CHECK(moe_backend_kv_cache_bytes(&be) == 123 && g_kv_calls == 1, "kv_cache_bytes is a version-2 member");
    fi.version = 1;
    CHECK(moe_backend_kv_cache_bytes(&be) == 0 && g_kv_calls == 1, "not called on a version-1 backend");
    fi.version = 3;
    g_expert_calls = g_batch_calls = 0;
    CHECK(moe_backend_expert_batch(&be, w, 3) == MOE_OK && g_batch_calls == 1 && g_expert_calls == 0,
          "version 3: one expert_batch call");
    moe_backend_place(&be, 0, 4, NULL, NULL, NULL, host);
    CHECK(g_place_calls == 1 && host[0] == 1 && moe_backend_supports(&be, MOE_BACKEND_FEAT_PLACE), "version 3: place");
    void *h = NULL;
    int ready = 0;
    log_reset();
    CHECK(moe_backend_stage_begin(&be, 1, 64, &h, &ready) == MOE_ERR_UNSUPPORTED && strstr(g_err, "stage_begin") &&
              !moe_backend_supports(&be, MOE_BACKEND_FEAT_STAGE),
          "an absent stage_begin: %s", g_err);
    log_reset();
    CHECK(moe_backend_attention(&be, 0, 0, 1, 1) == MOE_ERR_UNSUPPORTED && strstr(g_err, "attention"),
          "a NULL required slot is refused, not called");
    CHECK(moe_backend_supports(&be, MOE_BACKEND_FEAT_CPU_LAYOUTS) == 0, "no supports member: no other features");
    log_reset();
    CHECK(moe_backend_check(&be) == MOE_ERR_UNSUPPORTED && strstr(g_err, "lacks the required member"),
          "check: missing members: %s", g_err);
    /* every required member set: check passes; a newer version does not */
    enum moe_status (*any)(void) = f_any;
    void **slots = (void **)&fi.buffer_alloc; /* buffer_alloc .. lm_head are the required function slots */
    for (void **p = slots; p <= (void **)&fi.lm_head; p++)
        if (!*p) memcpy(p, &any, sizeof any);
    CHECK(moe_backend_check(&be) == MOE_OK, "a complete version-3 table passes");
    fi.version = MOE_BACKEND_VERSION + 1;
    log_reset();
    CHECK(moe_backend_check(&be) == MOE_ERR_UNSUPPORTED && strstr(g_err, "interface version"),
          "a newer version is refused: %s", g_err);
    fi.version = 0;
    CHECK(moe_backend_check(&be) == MOE_ERR_UNSUPPORTED, "version 0 is refused");
    CHECK(moe_backend_check(NULL) == MOE_ERR_INVALID, "no backend");
}

int main(void) {
    moe_log_set(capture, NULL);
    names();
    struct moe_model *m = NULL;
    if (moe_model_load(MODEL, NULL, &m) != MOE_OK) {
        fprintf(stderr, "cannot load %s\n", MODEL);
        return 1;
    }
    init(m);
    sessions(m);
    moe_model_free(m);
    wrappers();
    printf("test-backend-reg: %d checks, %d failed\n", checks, fails);
    return fails != 0;
}

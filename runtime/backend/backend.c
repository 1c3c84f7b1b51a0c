/*
 * backend.c - the backend registry and one wrapper per interface member
 * (moe-backend.h).
 *
 * The registry is the one place that knows which backends this build has:
 * the only `#ifdef MOE_HAVE_CUDA` of the runtime is the table below. The
 * wrappers are the one place that knows the interface's versions: each
 * checks the backend's version and the member's slot before calling it, so
 * the session, the expert store and the tools call a member without testing
 * anything themselves (SQLite's os.c does the same for its VFS).
 */
#include "moe-backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the registry ------------------------------------------------------------ */

static const struct moe_backend_reg *const k_regs[] = {
    &moe_backend_reg_cpu,
#ifdef MOE_HAVE_CUDA
    &moe_backend_reg_cuda,
#endif
};

/* Every kind this project has, built here or not (for messages that say how
 * to get one). */
static const char *const k_known[] = {"cpu", "cuda"};

int moe_backend_reg_count(void) { return (int)(sizeof k_regs / sizeof k_regs[0]); }

const struct moe_backend_reg *moe_backend_reg_get(int i) {
    return i >= 0 && i < moe_backend_reg_count() ? k_regs[i] : NULL;
}

const struct moe_backend_reg *moe_backend_reg_by_name(const char *name) {
    for (int i = 0; name && i < moe_backend_reg_count(); i++)
        if (strcmp(k_regs[i]->name, name) == 0) return k_regs[i];
    return NULL;
}

int moe_backend_kind_known(const char *name) {
    for (size_t i = 0; name && i < sizeof k_known / sizeof k_known[0]; i++)
        if (strcmp(k_known[i], name) == 0) return 1;
    return 0;
}

/* names: the registered names, "cpu, cuda", into buf. */
static const char *names(char *buf, size_t size) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < moe_backend_reg_count() && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? ", " : "", k_regs[i]->name);
    return buf;
}

enum moe_status moe_backend_parse_device(const char *spec, char *name, size_t name_size, int *index, char *err,
                                         size_t err_size) {
    if (err_size) err[0] = 0;
    const char *colon = spec ? strchr(spec, ':') : NULL;
    const size_t len = !spec ? 0 : colon ? (size_t)(colon - spec) : strlen(spec);
    if (!spec || len == 0 || len >= name_size) {
        snprintf(err, err_size, "--device expects cpu, cuda, cuda:N or auto (got \"%.40s\")", spec ? spec : "");
        return MOE_ERR_INVALID;
    }
    memcpy(name, spec, len);
    name[len] = 0;
    *index = 0;
    if (colon) {
        char *end = NULL;
        errno = 0;
        const long v = strtol(colon + 1, &end, 10);
        if (errno || end == colon + 1 || *end || v < 0 || v > 63 || strcmp(name, "auto") == 0) {
            snprintf(err, err_size, "--device %.40s: the device index must be 0..63 (e.g. cuda:1)", spec);
            return MOE_ERR_INVALID;
        }
        *index = (int)v;
    }
    if (strcmp(name, "auto") != 0 && !moe_backend_kind_known(name)) {
        char b[128];
        snprintf(err, err_size, "--device %.40s: unknown backend; this build has %s (and auto: the best present)",
                 spec, names(b, sizeof b));
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* member_missing: a required member's slot is NULL. */
static const char *member_missing(const struct moe_backend_iface *bi) {
#define REQ(m)                                                                                                         \
    if (!bi->m) return #m
    REQ(free);
    REQ(buffer_alloc);
    REQ(buffer_free);
    REQ(buffer_write);
    REQ(embed);
    REQ(set_x);
    REQ(get_x);
    REQ(get_xn);
    REQ(attention);
    REQ(ffn_norm);
    REQ(router);
    REQ(expert);
    REQ(dense);
    REQ(residual);
    REQ(lm_head);
#undef REQ
    return NULL;
}

enum moe_status moe_backend_check(const struct moe_backend *be) {
    if (!be || !be->iface) {
        MOE_LOGE("no backend");
        return MOE_ERR_INVALID;
    }
    const struct moe_backend_iface *bi = be->iface;
    if (bi->version < 1 || bi->version > MOE_BACKEND_VERSION) {
        MOE_LOGE("backend \"%s\" implements interface version %u; this runtime knows 1 to %d",
                 bi->name ? bi->name : "?", bi->version, MOE_BACKEND_VERSION);
        return MOE_ERR_UNSUPPORTED;
    }
    const char *miss = member_missing(bi);
    if (miss) {
        MOE_LOGE("backend \"%s\" lacks the required member %s", bi->name ? bi->name : "?", miss);
        return MOE_ERR_UNSUPPORTED;
    }
    return MOE_OK;
}

/* checked: *out made by init, then refused (and freed) if its table is not one
 * this runtime can drive. */
static enum moe_status checked(enum moe_status st, struct moe_backend **out) {
    if (st) return st;
    if ((st = moe_backend_check(*out))) {
        if (*out && (*out)->iface && (*out)->iface->free) (*out)->iface->free(*out);
        *out = NULL;
    }
    return st;
}

enum moe_status moe_backend_init_by_name(const char *name, int index, const struct moe_model *model,
                                         const struct moe_backend_params *p, const void *options,
                                         struct moe_backend **out) {
    *out = NULL;
    if (!name || !*name) name = "cpu";
    if (strcmp(name, "auto") == 0) return moe_backend_init_best(model, p, options, out);
    const struct moe_backend_reg *r = moe_backend_reg_by_name(name);
    char b[128];
    if (!r) {
        if (moe_backend_kind_known(name)) {
            MOE_LOGE("backend \"%s\" is not in this build (it has %s); rebuild with -D%s=ON", name, names(b, sizeof b),
                     strcmp(name, "cuda") == 0 ? "MOE_CUDA" : "MOE_<BACKEND>");
            return MOE_ERR_UNSUPPORTED;
        }
        MOE_LOGE("unknown backend \"%s\"; this build has %s", name, names(b, sizeof b));
        return MOE_ERR_INVALID;
    }
    const int n = r->device_count ? r->device_count() : 0;
    if (index < 0 || index >= n) {
        if (n == 0)
            MOE_LOGE("backend \"%s\" finds no device here (driver missing or no %s device); use --device cpu", name,
                     name);
        else
            MOE_LOGE("backend \"%s\" has %d device(s), 0..%d; there is no %s:%d", name, n, n - 1, name, index);
        return MOE_ERR_BACKEND;
    }
    return checked(r->init(model, p, index, options, out), out);
}

enum moe_status moe_backend_init_best(const struct moe_model *model, const struct moe_backend_params *p,
                                      const void *options, struct moe_backend **out) {
    *out = NULL;
    for (int i = 0; i < moe_backend_reg_count(); i++) {
        const struct moe_backend_reg *r = k_regs[i];
        if (r == &moe_backend_reg_cpu || !r->device_count || r->device_count() <= 0) continue;
        return checked(r->init(model, p, 0, options, out), out);
    }
    return checked(moe_backend_reg_cpu.init(model, p, 0, NULL, out), out);
}

const char *moe_backend_name(const struct moe_backend *be) {
    return be && be->iface && be->iface->name ? be->iface->name : "?";
}

/* ---- one wrapper per member ---------------------------------------------------- */

/* HAS: the backend's version has member m (added in version v) and sets it. */
#define HAS(be, m, v) ((be)->iface->version >= (v) && (be)->iface->m != NULL)

/* lacks: log that be has no member m; MOE_ERR_UNSUPPORTED. */
static enum moe_status lacks(const struct moe_backend *be, const char *m) {
    MOE_LOGE("backend \"%s\" (interface version %u) has no %s", moe_backend_name(be), be->iface->version, m);
    return MOE_ERR_UNSUPPORTED;
}

/* CALL: return the member's result, or MOE_ERR_UNSUPPORTED when it has none. */
#define CALL(be, m, v, ...) return HAS(be, m, v) ? (be)->iface->m(__VA_ARGS__) : lacks(be, #m)

int moe_backend_supports(const struct moe_backend *be, enum moe_backend_feature f) {
    if (!be || !be->iface) return 0;
    switch (f) { /* member-based features: the member is the answer */
    case MOE_BACKEND_FEAT_EXPERT_BATCH: return HAS(be, expert_batch, 3);
    case MOE_BACKEND_FEAT_PLACE: return HAS(be, place, 3);
    case MOE_BACKEND_FEAT_STAGE: return HAS(be, stage_begin, 3) && HAS(be, stage_end, 3);
    case MOE_BACKEND_FEAT_KV_SEQ: return HAS(be, kv_seq, 5);
    case MOE_BACKEND_FEAT_ATTENTION_MULTI: return HAS(be, kv_seq, 5) && HAS(be, attention_multi, 5);
    case MOE_BACKEND_FEAT_GRAPH: return HAS(be, decode_step, 6);
    default: return HAS(be, supports, 4) && be->iface->supports(be, f);
    }
}

enum moe_status moe_backend_buffer_alloc(struct moe_backend *be, size_t size, struct moe_buffer *out) {
    CALL(be, buffer_alloc, 1, be, size, out);
}

void moe_backend_buffer_free(struct moe_backend *be, struct moe_buffer *buf) {
    if (HAS(be, buffer_free, 1)) be->iface->buffer_free(be, buf);
}

enum moe_status moe_backend_buffer_write(struct moe_backend *be, struct moe_buffer *dst, size_t off, const void *src,
                                         size_t n) {
    CALL(be, buffer_write, 1, be, dst, off, src, n);
}

enum moe_status moe_backend_embed(struct moe_backend *be, const int32_t *tokens, int n) {
    CALL(be, embed, 1, be, tokens, n);
}

enum moe_status moe_backend_set_x(struct moe_backend *be, const float *x, int n) { CALL(be, set_x, 1, be, x, n); }

enum moe_status moe_backend_get_x(struct moe_backend *be, float *x, int n) { CALL(be, get_x, 1, be, x, n); }

enum moe_status moe_backend_get_xn(struct moe_backend *be, float *xn, int n) { CALL(be, get_xn, 1, be, xn, n); }

enum moe_status moe_backend_attention(struct moe_backend *be, int layer, int pos0, int n, int seq_len) {
    CALL(be, attention, 1, be, layer, pos0, n, seq_len);
}

enum moe_status moe_backend_ffn_norm(struct moe_backend *be, int layer, int n) {
    CALL(be, ffn_norm, 1, be, layer, n);
}

enum moe_status moe_backend_router(struct moe_backend *be, int layer, int n, float *logits) {
    CALL(be, router, 1, be, layer, n, logits);
}

enum moe_status moe_backend_expert(struct moe_backend *be, const struct moe_ffn *f, const int32_t *rows,
                                   const int32_t *slots, const float *w, int n_rows, float *out) {
    CALL(be, expert, 1, be, f, rows, slots, w, n_rows, out);
}

enum moe_status moe_backend_dense(struct moe_backend *be, int layer, int n) { CALL(be, dense, 1, be, layer, n); }

enum moe_status moe_backend_residual(struct moe_backend *be, int n) { CALL(be, residual, 1, be, n); }

enum moe_status moe_backend_lm_head(struct moe_backend *be, int row0, int n, float *logits) {
    CALL(be, lm_head, 1, be, row0, n, logits);
}

enum moe_status moe_backend_ffn_rows(struct moe_backend *be, const struct moe_ffn *f, const float *x, float *y, int n) {
    CALL(be, ffn_rows, 1, be, f, x, y, n);
}

enum moe_status moe_backend_lm_head_rows(struct moe_backend *be, const float *x, int n, float *logits) {
    CALL(be, lm_head_rows, 1, be, x, n, logits);
}

size_t moe_backend_kv_cache_bytes(struct moe_backend *be) {
    return HAS(be, kv_cache_bytes, 2) ? be->iface->kv_cache_bytes(be) : 0;
}

enum moe_status moe_backend_expert_batch(struct moe_backend *be, const struct moe_expert_work *w, int n) {
    if (HAS(be, expert_batch, 3)) return be->iface->expert_batch(be, w, n);
    for (int i = 0; i < n; i++) {
        if (w[i].host) {
            MOE_LOGE("backend \"%s\" cannot run experts on the host", moe_backend_name(be));
            return MOE_ERR_UNSUPPORTED;
        }
        enum moe_status st = moe_backend_expert(be, &w[i].f, w[i].rows, w[i].slots, w[i].w, w[i].n_rows, w[i].out);
        if (st) return st;
    }
    return MOE_OK;
}

void moe_backend_place(struct moe_backend *be, int layer, int n, const int32_t *tokens, const int32_t *prec,
                       const uint8_t *resident, uint8_t *host) {
    if (HAS(be, place, 3))
        be->iface->place(be, layer, n, tokens, prec, resident, host);
    else
        memset(host, 0, (size_t)(n > 0 ? n : 0));
}

enum moe_status moe_backend_stage_begin(struct moe_backend *be, uint64_t key, size_t room, void **host, int *ready) {
    CALL(be, stage_begin, 3, be, key, room, host, ready);
}

enum moe_status moe_backend_stage_end(struct moe_backend *be, uint64_t key, void *host, int ok,
                                      struct moe_buffer *dst, size_t n) {
    CALL(be, stage_end, 3, be, key, host, ok, dst, n);
}

enum moe_status moe_backend_kv_seq(struct moe_backend *be, int seq) {
    if (!HAS(be, kv_seq, 5) && seq == 0) return MOE_OK; /* the one cache there is */
    CALL(be, kv_seq, 5, be, seq);
}

enum moe_status moe_backend_attention_multi(struct moe_backend *be, int layer, const int *seq, const int *pos, int n) {
    CALL(be, attention_multi, 5, be, layer, seq, pos, n);
}

enum moe_status moe_backend_decode_step(struct moe_backend *be, const struct moe_step_desc *d, int32_t token, int pos,
                                        float *logits, int32_t *sel, float *w) {
    if (!HAS(be, decode_step, 6)) return MOE_ERR_UNSUPPORTED; /* the caller's op-by-op path: not an error */
    return be->iface->decode_step(be, d, token, pos, logits, sel, w);
}

struct cJSON *moe_backend_stats_json(const struct moe_backend *be) {
    return be && be->iface && HAS(be, stats_json, 4) ? be->iface->stats_json(be) : NULL;
}

void moe_backend_free(struct moe_backend *be) {
    if (be && be->iface && be->iface->free) be->iface->free(be);
}

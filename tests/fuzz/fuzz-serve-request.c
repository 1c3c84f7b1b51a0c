/*
 * fuzz-serve-request.c - libFuzzer target for moe-serve's request parser
 * (moe_serve_request_parse, runtime/server/serve-request.c): the body of a
 * POST /v1/chat/completions or /v1/completions, bytes from any client.
 *
 * Byte 0 picks the endpoint (even: chat, odd: completion); the rest is the
 * body. Beyond "no crash, no leak" it checks, aborting on any broken promise:
 *   - on success every field in range: a chat request has 1 to
 *     MOE_SERVE_MAX_MESSAGES messages with a known role, a completion a
 *     prompt; every string valid UTF-8; max_tokens -1 or in [1, 2^24],
 *     temperature in [0, 2], top_p in (0, 1], at most MOE_SERVE_MAX_STOP
 *     non-empty stop strings; include_usage only with stream;
 *   - the parsed request, written back as JSON, parses to the same request
 *     (nothing the parser kept depends on how the client spelt it);
 *   - on failure the request is cleared, the status is 400 or 500, the
 *     message is non-empty, and moe_serve_error_json gives a JSON object
 *     whose error.message is that message.
 *
 * Build with -DMOE_BUILD_FUZZ=ON (clang; docs/fuzzing.md), then
 *   build-fuzz/tests/fuzz-serve-request -jobs=1 -max_total_time=600 -max_len=4096 \
 *       /tmp/serve-request-corpus tests/fuzz/corpus/serve-request
 * The seeds in tests/fuzz/corpus/serve-request are requests the OpenAI
 * clients send and malformed variants; ctest replays them
 * (fuzz-serve-request-replay) through replay-main.c without libFuzzer.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "moe-base.h"
#include "serve-request.h"

#define REQUIRE(x)         \
    do {                   \
        if (!(x)) abort(); \
    } while (0)

static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

static int utf8_ok(const char *s) {
    return s && moe_utf8_bad_offset(s, strlen(s)) == strlen(s);
}

static int str_eq(const char *a, const char *b) {
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* check: the promises of a parsed request. */
static void check(const struct moe_serve_request *r, enum moe_serve_kind kind) {
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};
    REQUIRE(r->kind == kind);
    REQUIRE(!r->model || utf8_ok(r->model));
    if (kind == MOE_SERVE_CHAT) {
        REQUIRE(r->n_messages >= 1 && r->n_messages <= MOE_SERVE_MAX_MESSAGES && !r->prompt);
        for (size_t i = 0; i < r->n_messages; i++) {
            int known = 0;
            for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) known |= str_eq(r->roles[i], roles[k]);
            REQUIRE(known && utf8_ok(r->contents[i]));
        }
    } else {
        REQUIRE(r->n_messages == 0 && utf8_ok(r->prompt));
    }
    REQUIRE(r->max_tokens == -1 || (r->max_tokens >= 1 && r->max_tokens <= (1 << 24)));
    REQUIRE(isfinite(r->temperature) && r->temperature >= 0 && r->temperature <= 2);
    REQUIRE(isfinite(r->top_p) && r->top_p > 0 && r->top_p <= 1);
    REQUIRE(r->n_stop >= 0 && r->n_stop <= MOE_SERVE_MAX_STOP);
    for (int i = 0; i < r->n_stop; i++) REQUIRE(utf8_ok(r->stop[i]) && r->stop[i][0]);
    REQUIRE(r->stream == 0 || r->stream == 1);
    REQUIRE(r->ignore_eos == 0 || r->ignore_eos == 1);
    REQUIRE(!r->include_usage || r->stream);
}

/* add_raw: a number written exactly (cJSON prints doubles with 15
 * significant digits when they read back "close enough"). */
static void add_raw(cJSON *o, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_raw(cJSON *o, const char *key, const char *fmt, ...) {
    char t[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    cJSON_AddRawToObject(o, key, t);
}

/* rewrite: r as a request body in the parser's own spelling (NULL when out
 * of memory). A seed from a negative number is written negative again, so
 * it reads back to the same 64 bits. */
static char *rewrite(const struct moe_serve_request *r) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (r->model) cJSON_AddStringToObject(o, "model", r->model);
    if (r->kind == MOE_SERVE_CHAT) {
        cJSON *msgs = cJSON_AddArrayToObject(o, "messages");
        for (size_t i = 0; msgs && i < r->n_messages; i++) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", r->roles[i]);
            cJSON_AddStringToObject(m, "content", r->contents[i]);
            cJSON_AddItemToArray(msgs, m);
        }
    } else {
        cJSON_AddStringToObject(o, "prompt", r->prompt);
    }
    if (r->max_tokens >= 0) cJSON_AddNumberToObject(o, "max_tokens", r->max_tokens);
    add_raw(o, "temperature", "%.17g", r->temperature);
    add_raw(o, "top_p", "%.17g", r->top_p);
    if (r->has_seed && r->seed >= (UINT64_C(1) << 63)) add_raw(o, "seed", "%" PRId64, (int64_t)r->seed);
    else if (r->has_seed) add_raw(o, "seed", "%" PRIu64, r->seed);
    if (r->n_stop) {
        cJSON *st = cJSON_AddArrayToObject(o, "stop");
        for (int i = 0; st && i < r->n_stop; i++) cJSON_AddItemToArray(st, cJSON_CreateString(r->stop[i]));
    }
    cJSON_AddBoolToObject(o, "stream", r->stream);
    if (r->ignore_eos) cJSON_AddBoolToObject(o, "ignore_eos", 1);
    if (r->include_usage) {
        cJSON *so = cJSON_AddObjectToObject(o, "stream_options");
        if (so) cJSON_AddBoolToObject(so, "include_usage", 1);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void same(const struct moe_serve_request *a, const struct moe_serve_request *b) {
    REQUIRE(a->kind == b->kind && str_eq(a->model, b->model) && a->n_messages == b->n_messages);
    for (size_t i = 0; i < a->n_messages; i++)
        REQUIRE(str_eq(a->roles[i], b->roles[i]) && str_eq(a->contents[i], b->contents[i]));
    REQUIRE(str_eq(a->prompt, b->prompt) && a->max_tokens == b->max_tokens);
    REQUIRE(a->temperature == b->temperature && a->top_p == b->top_p);
    REQUIRE(a->has_seed == b->has_seed && (!a->has_seed || a->seed == b->seed));
    REQUIRE(a->n_stop == b->n_stop);
    for (int i = 0; i < a->n_stop; i++) REQUIRE(str_eq(a->stop[i], b->stop[i]));
    REQUIRE(a->stream == b->stream && a->include_usage == b->include_usage && a->ignore_eos == b->ignore_eos);
}

static void check_error(const struct moe_serve_request *r, const struct moe_serve_error *e) {
    REQUIRE(!r->model && !r->roles && !r->contents && !r->prompt && r->n_messages == 0 && r->n_stop == 0);
    REQUIRE(e->http == 400 || e->http == 500);
    REQUIRE(memchr(e->message, 0, sizeof e->message) && e->message[0]);
    REQUIRE(memchr(e->param, 0, sizeof e->param) && memchr(e->code, 0, sizeof e->code));
    char *js = moe_serve_error_json(e);
    if (!js) return; /* out of memory */
    cJSON *root = cJSON_Parse(js);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    REQUIRE(cJSON_IsString(msg) && strcmp(msg->valuestring, e->message) == 0);
    const cJSON *param = cJSON_GetObjectItemCaseSensitive(err, "param");
    REQUIRE(e->param[0] ? cJSON_IsString(param) && strcmp(param->valuestring, e->param) == 0 : cJSON_IsNull(param));
    cJSON_Delete(root);
    free(js);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        moe_log_set(quiet, NULL);
        init = 1;
    }
    if (size < 1) return 0;
    const enum moe_serve_kind kind = data[0] & 1 ? MOE_SERVE_COMPLETION : MOE_SERVE_CHAT;
    /* a copy of exactly the body's bytes, so ASan sees any read past its end */
    const size_t n = size - 1;
    char *body = malloc(n ? n : 1);
    if (!body) return 0;
    memcpy(body, data + 1, n);
    struct moe_serve_request r;
    struct moe_serve_error e;
    memset(&e, 0, sizeof e);
    if (moe_serve_request_parse(kind, body, n, &r, &e) != MOE_OK) {
        check_error(&r, &e);
        free(body);
        return 0;
    }
    free(body);
    check(&r, kind);
    char *again = rewrite(&r);
    if (again) {
        struct moe_serve_request r2;
        REQUIRE(moe_serve_request_parse(kind, again, strlen(again), &r2, &e) == MOE_OK);
        same(&r, &r2);
        moe_serve_request_clear(&r2);
        free(again);
    }
    moe_serve_request_clear(&r);
    return 0;
}

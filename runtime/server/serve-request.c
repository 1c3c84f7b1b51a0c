/*
 * serve-request.c - OpenAI request bodies parsed and checked (serve-request.h).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "moe-base.h"
#include "serve-request.h"

void moe_serve_error_set(struct moe_serve_error *e, int http, const char *param, const char *code, const char *fmt,
                         ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    e->http = http;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
}

char *moe_serve_error_json(const struct moe_serve_error *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_CreateObject();
    char *s = NULL;
    if (root && o && cJSON_AddItemToObject(root, "error", o)) {
        o = cJSON_GetObjectItem(root, "error");
        cJSON_AddStringToObject(o, "message", e->message);
        cJSON_AddStringToObject(o, "type", e->http >= 500 ? "server_error" : "invalid_request_error");
        if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
        else cJSON_AddNullToObject(o, "param");
        if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code);
        else cJSON_AddNullToObject(o, "code");
        s = cJSON_PrintUnformatted(root);
    } else {
        cJSON_Delete(o);
    }
    cJSON_Delete(root);
    return s;
}

void moe_serve_request_clear(struct moe_serve_request *r) {
    free(r->model);
    for (size_t i = 0; i < r->n_messages; i++) free(r->roles[i]), free(r->contents[i]);
    free(r->roles);
    free(r->contents);
    free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

/* utf8_dup: a copy of a JSON string that must be valid UTF-8 (cJSON passes
 * raw bytes through); NULL after setting *e. */
static char *utf8_dup(const char *s, const char *param, struct moe_serve_error *e) {
    const size_t n = strlen(s);
    if (moe_utf8_bad_offset(s, n) != n) {
        moe_serve_error_set(e, 400, param, "invalid_value", "'%s' is not valid UTF-8", param);
        return NULL;
    }
    char *d = malloc(n + 1);
    if (!d) moe_serve_error_set(e, 500, NULL, NULL, "out of memory");
    else memcpy(d, s, n + 1);
    return d;
}

/* get_number: field `key` as a number in [lo, hi] (integral when `integer`);
 * 1 found, 0 absent (or null), -1 wrong (with *e). */
static int get_number(const cJSON *root, const char *key, double lo, double hi, int integer, double *out,
                      struct moe_serve_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        moe_serve_error_set(e, 400, key, "invalid_type", "'%s' must be a number", key);
        return -1;
    }
    const double d = v->valuedouble;
    if (integer && d != floor(d)) {
        moe_serve_error_set(e, 400, key, "invalid_type", "'%s' must be an integer, got %g", key, d);
        return -1;
    }
    if (!(d >= lo && d <= hi)) {
        moe_serve_error_set(e, 400, key, "invalid_value", "'%s' must be in [%g, %g], got %g", key, lo, hi, d);
        return -1;
    }
    *out = d;
    return 1;
}

/* get_bool: 1 found, 0 absent, -1 wrong. */
static int get_bool(const cJSON *root, const char *key, int *out, struct moe_serve_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) {
        moe_serve_error_set(e, 400, key, "invalid_type", "'%s' must be true or false", key);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 1;
}

/* content_text: a message's content (a string, null, or an array of
 * {"type":"text","text":...} parts, joined) as a malloc'd string. */
static char *content_text(const cJSON *c, struct moe_serve_error *e) {
    static const char *const param = "messages.content";
    if (!c || cJSON_IsNull(c)) return utf8_dup("", param, e);
    if (cJSON_IsString(c)) return utf8_dup(c->valuestring, param, e);
    if (!cJSON_IsArray(c)) {
        moe_serve_error_set(e, 400, param, "invalid_type", "a message's content must be a string or an array of parts");
        return NULL;
    }
    struct moe_buf b = {0};
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            moe_serve_error_set(e, 400, param, "invalid_type",
                                "a content part must be {\"type\": \"text\", \"text\": \"...\"} (only text is supported)");
            moe_buf_free(&b);
            return NULL;
        }
        if (moe_buf_append(&b, text->valuestring, strlen(text->valuestring)) != MOE_OK) {
            moe_serve_error_set(e, 500, NULL, NULL, "out of memory");
            moe_buf_free(&b);
            return NULL;
        }
    }
    char *joined = moe_buf_take(&b);
    char *d = utf8_dup(joined ? joined : "", param, e);
    free(joined);
    return d;
}

/* parse_messages: "messages", a non-empty array of {role, content}. 0 ok. */
static int parse_messages(const cJSON *root, struct moe_serve_request *r, struct moe_serve_error *e) {
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!m) {
        moe_serve_error_set(e, 400, "messages", "missing_required_parameter", "'messages' is required");
        return -1;
    }
    const int n = cJSON_IsArray(m) ? cJSON_GetArraySize(m) : -1;
    if (n < 1 || n > MOE_SERVE_MAX_MESSAGES) {
        moe_serve_error_set(e, 400, "messages", n < 0 ? "invalid_type" : "invalid_value",
                            "'messages' must be an array of 1 to %d messages", MOE_SERVE_MAX_MESSAGES);
        return -1;
    }
    r->roles = calloc((size_t)n, sizeof *r->roles);
    r->contents = calloc((size_t)n, sizeof *r->contents);
    if (!r->roles || !r->contents) {
        moe_serve_error_set(e, 500, NULL, NULL, "out of memory");
        return -1;
    }
    const cJSON *msg;
    cJSON_ArrayForEach(msg, m) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role)) {
            moe_serve_error_set(e, 400, "messages.role", "invalid_type",
                                "message %zu must be an object with a string 'role'", r->n_messages);
            return -1;
        }
        int known = 0;
        for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) known |= strcmp(role->valuestring, roles[i]) == 0;
        if (!known) {
            moe_serve_error_set(e, 400, "messages.role", "invalid_value",
                                "message %zu: unknown role (system, user, assistant, tool or developer)", r->n_messages);
            return -1;
        }
        char *content = content_text(cJSON_GetObjectItemCaseSensitive(msg, "content"), e);
        char *rl = content ? utf8_dup(role->valuestring, "messages.role", e) : NULL;
        if (!rl) {
            free(content);
            return -1;
        }
        r->roles[r->n_messages] = rl, r->contents[r->n_messages++] = content;
    }
    return 0;
}

/* parse_prompt: "prompt", a string or an array of exactly one string. 0 ok. */
static int parse_prompt(const cJSON *root, struct moe_serve_request *r, struct moe_serve_error *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) {
        moe_serve_error_set(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
        return -1;
    }
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (!cJSON_IsString(p)) {
        moe_serve_error_set(e, 400, "prompt", "invalid_type", "'prompt' must be a string (or an array of one string)");
        return -1;
    }
    return (r->prompt = utf8_dup(p->valuestring, "prompt", e)) ? 0 : -1;
}

/* parse_stop: "stop", a string or an array of strings. 0 ok. */
static int parse_stop(const cJSON *root, struct moe_serve_request *r, struct moe_serve_error *e) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!s || cJSON_IsNull(s)) return 0;
    const cJSON *one = cJSON_IsString(s) ? s : NULL, *it;
    if (!one && (!cJSON_IsArray(s) || cJSON_GetArraySize(s) > MOE_SERVE_MAX_STOP)) {
        moe_serve_error_set(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of at most %d strings",
                            MOE_SERVE_MAX_STOP);
        return -1;
    }
    for (it = one ? one : s->child; it; it = one ? NULL : it->next) {
        if (!cJSON_IsString(it) || !it->valuestring[0]) {
            moe_serve_error_set(e, 400, "stop", "invalid_value", "each stop sequence must be a non-empty string");
            return -1;
        }
        if (!(r->stop[r->n_stop] = utf8_dup(it->valuestring, "stop", e))) return -1;
        r->n_stop++;
    }
    return 0;
}

/* parse_sampling: max_tokens, temperature, top_p, seed, n, stream, ignore_eos. 0 ok. */
static int parse_sampling(const cJSON *root, struct moe_serve_request *r, struct moe_serve_error *e) {
    double d;
    int rc, b = 0;
    r->max_tokens = -1, r->temperature = 1.0, r->top_p = 1.0;
    const char *mt = r->kind == MOE_SERVE_CHAT && cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")
                         ? "max_completion_tokens" : "max_tokens";
    if ((rc = get_number(root, mt, 1, 1 << 24, 1, &d, e)) < 0) return -1;
    if (rc) r->max_tokens = (int)d;
    if ((rc = get_number(root, "temperature", 0, 2, 0, &d, e)) < 0) return -1;
    if (rc) r->temperature = d;
    if ((rc = get_number(root, "top_p", 0, 1, 0, &d, e)) < 0) return -1;
    if (rc && d <= 0) {
        moe_serve_error_set(e, 400, "top_p", "invalid_value", "'top_p' must be in (0, 1]");
        return -1;
    }
    if (rc) r->top_p = d;
    if ((rc = get_number(root, "seed", -9223372036854775808.0, 18446744073709551615.0, 1, &d, e)) < 0) return -1;
    if (rc) r->has_seed = 1, r->seed = d < 0 ? (uint64_t)(int64_t)d : d >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)d;
    if ((rc = get_number(root, "n", 1, 1, 1, &d, e)) < 0) return -1;
    if ((rc = get_bool(root, "stream", &b, e)) < 0) return -1;
    if (rc) r->stream = b;
    b = 0;
    if (get_bool(root, "ignore_eos", &b, e) < 0) return -1;
    r->ignore_eos = b;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) {
            moe_serve_error_set(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object");
            return -1;
        }
        b = 0;
        if (get_bool(so, "include_usage", &b, e) < 0) return -1;
        r->include_usage = b == 1 && r->stream;
    }
    return 0;
}

enum moe_status moe_serve_request_parse(enum moe_serve_kind kind, const char *body, size_t len,
                                        struct moe_serve_request *out, struct moe_serve_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    while (root && end && end < body + len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')) end++;
    if (!root || (end && end != body + len)) {
        const size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        moe_serve_error_set(err, 400, NULL, "invalid_json",
                            "the request body is not valid JSON%s (near byte %zu)", root ? " (text after the value)" : "",
                            at);
        cJSON_Delete(root);
        return MOE_ERR_INVALID;
    }
    int bad = 0;
    if (!cJSON_IsObject(root)) {
        moe_serve_error_set(err, 400, NULL, "invalid_json", "the request body must be a JSON object");
        bad = 1;
    }
    const cJSON *model = bad ? NULL : cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!bad && model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) {
            moe_serve_error_set(err, 400, "model", "invalid_type", "'model' must be a string");
            bad = 1;
        } else if (!(out->model = utf8_dup(model->valuestring, "model", err))) {
            bad = 1;
        }
    }
    if (!bad) bad = (kind == MOE_SERVE_CHAT ? parse_messages(root, out, err) : parse_prompt(root, out, err)) != 0;
    if (!bad) bad = parse_sampling(root, out, err) != 0 || parse_stop(root, out, err) != 0;
    cJSON_Delete(root);
    if (bad) {
        moe_serve_request_clear(out);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

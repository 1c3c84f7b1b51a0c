/*
 * serve-request.h - an OpenAI request body (POST /v1/chat/completions or
 * /v1/completions) parsed and checked into a struct, and the OpenAI-style
 * error it gives when it is wrong. Untrusted bytes: every field's type and
 * range is checked, nothing is asserted, and the error names the field
 * (OpenAI's "param"). Unknown fields are ignored, as OpenAI clients send
 * many the server has no use for (user, logit_bias at its default, ...).
 * Pure functions: thread-safe.
 */
#ifndef MOE_SERVE_REQUEST_H
#define MOE_SERVE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moe_serve_kind { MOE_SERVE_CHAT = 0, MOE_SERVE_COMPLETION = 1 };

#define MOE_SERVE_MAX_STOP 16      /* stop strings a request may give */
#define MOE_SERVE_MAX_MESSAGES 4096

struct moe_serve_request {
    enum moe_serve_kind kind;
    char *model;              /* NULL when not given */
    /* chat: messages (role and content strings, content parts joined) */
    size_t n_messages;
    char **roles, **contents;
    /* completion: the prompt text (a string or an array of one string) */
    char *prompt;
    int max_tokens;           /* -1: not given */
    double temperature;       /* default 1 (OpenAI's) */
    double top_p;             /* default 1 */
    int has_seed;
    uint64_t seed;
    int n_stop;
    char *stop[MOE_SERVE_MAX_STOP];
    int stream;
    int include_usage;        /* stream_options.include_usage */
    int ignore_eos;           /* "ignore_eos": true (an extension llama.cpp's server and vLLM
                               * take too): end-of-sequence tokens do not end the request */
};

/* What was wrong with a request: OpenAI's error object fields. */
struct moe_serve_error {
    int http;                 /* 400 */
    char message[256];
    char param[48];           /* "" for none */
    char code[48];            /* "" for none */
};

/* moe_serve_request_parse: body[0..len) (not NUL-terminated) as a request of
 * kind `kind`. MOE_OK with *out filled (free with moe_serve_request_clear);
 * MOE_ERR_INVALID with *err filled and *out cleared: malformed JSON, not an
 * object, a missing field (messages, prompt), a wrong type, a value out of
 * range (max_tokens < 1, temperature outside [0, 2], top_p outside (0, 1],
 * more than MOE_SERVE_MAX_STOP stop strings, an empty stop string, n != 1),
 * a role other than system / user / assistant / tool / developer, or text
 * that is not UTF-8. Nothing is logged. */
enum moe_status moe_serve_request_parse(enum moe_serve_kind kind, const char *body, size_t len,
                                        struct moe_serve_request *out, struct moe_serve_error *err);

/* moe_serve_request_clear: free what parse allocated and zero *r. */
void moe_serve_request_clear(struct moe_serve_request *r);

/* moe_serve_error_json: {"error":{"message","type","param","code"}} as a
 * malloc'd string (caller frees; NULL when out of memory). type is
 * "invalid_request_error" below 500, else "server_error"; an empty param or
 * code is null. */
char *moe_serve_error_json(const struct moe_serve_error *e);

/* moe_serve_error_set: fill *e (printf-style message). */
void moe_serve_error_set(struct moe_serve_error *e, int http, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#ifdef __cplusplus
}
#endif
#endif

/*
 * moe-server.h - an OpenAI-compatible HTTP server over a scheduler
 * (moe-sched.h), on libmicrohttpd:
 *
 *   POST /v1/chat/completions   messages rendered with the chat template
 *   POST /v1/completions        a raw prompt
 *        both: max_tokens, temperature, top_p, seed, stop, stream (SSE:
 *        "data: {chunk}" events, then "data: [DONE]"), and ignore_eos (as
 *        llama.cpp's server and vLLM: end-of-sequence tokens do not stop)
 *   GET  /v1/models             the one model, under its name
 *   GET  /health                {"status":"ok"} (no API key needed)
 *   GET  /metrics               Prometheus text: requests, tokens, tokens/s,
 *                               queue depth, active sequences, expert hit
 *                               ratio (and the counts it comes from), bytes
 *                               read and stall per token, big-little's
 *                               tokens and fallbacks, RSS
 *
 * (the same paths without "/v1" are accepted too). Bad requests get OpenAI's
 * error object ({"error":{"message","type","param","code"}}): 400 for
 * malformed JSON, wrong types or values, an unknown model name or a prompt
 * that does not fit the context; 401 for a missing or wrong API key; 404 /
 * 405 for an unknown path or method; 413 for a body over max_body; 429 when
 * the queue is full; 503 while shutting down.
 *
 * Threads: libmicrohttpd runs one thread per connection (at most
 * max_connections): a handler waits for its request's tokens on a condition
 * variable, never on the engine, and looks at its socket between waits, so a
 * client that goes away has its request cancelled (its sequence freed before
 * the next step) within a quarter of a second. A connection that has not
 * delivered a whole request (headers and body) read_timeout_s seconds after
 * it started one is shut down, however slowly it trickles bytes; an idle
 * connection is closed after idle_timeout_s.
 */
#ifndef MOE_SERVER_H
#define MOE_SERVER_H

#include <stddef.h>

#include "moe-model.h"
#include "moe-sched.h"
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_chat_template;

struct moe_server_params {
    const char *host;         /* address to listen on (numeric IPv4 / IPv6 or a name); default 127.0.0.1 */
    int port;                 /* 0: any free port (moe_server_port tells which) */
    const char *api_key;      /* NULL: none; else "Authorization: Bearer KEY" on every path but /health */
    size_t max_body;          /* bytes of a request body (default 1 MiB) */
    const char *model_name;   /* the name /v1/models lists and requests may give */
    const struct moe_chat_template *chat; /* NULL: chat requests are refused (borrowed) */
    int idle_timeout_s;       /* close a connection idle this long (default 60) */
    int read_timeout_s;       /* a request's headers and body must arrive within this (default 30) */
    int max_connections;      /* default 64 */
};

struct moe_server_params moe_server_default_params(void);

struct moe_server;

/* moe_server_start: listen and serve. sched and model are borrowed and must
 * outlive the server. MOE_ERR_IO (logged) when the address cannot be bound;
 * MOE_ERR_INVALID for a bad host or parameters. */
enum moe_status moe_server_start(struct moe_sched *sched, const struct moe_model *model,
                                 const struct moe_server_params *p, struct moe_server **out);

/* moe_server_port: the port the server listens on. */
int moe_server_port(const struct moe_server *srv);

/* moe_server_stop: stop: the scheduler is shut down (every request ends, its
 * client gets what it has), the connections are closed and their threads
 * joined; then the server is freed. The scheduler itself is the caller's to
 * free afterwards. NULL is a no-op. */
void moe_server_stop(struct moe_server *srv);

#ifdef __cplusplus
}
#endif
#endif

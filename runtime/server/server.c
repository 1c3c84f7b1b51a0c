/*
 * server.c - the OpenAI-compatible HTTP server (moe-server.h) on
 * libmicrohttpd: routing, authentication, request bodies, the answers as
 * JSON or as server-sent events, metrics, and the watch over slow clients.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "moe-base.h"
#include "moe-chat.h"
#include "moe-server.h"
#include "moe-tokenizer.h"
#include "serve-request.h"

#define WAIT_S 0.25        /* a waiting handler looks at its socket this often */
#define KEEPALIVE_S 15.0   /* an SSE comment after this long without an event */

/* One TCP connection, for the watch over slow clients (the socket context). */
struct sock {
    struct sock *prev, *next;
    int fd;
    double since;  /* when the request now being received began */
    int reading;   /* 1: a request is being received or awaited */
};

enum route { R_NONE, R_CHAT, R_COMPLETIONS, R_MODELS, R_HEALTH, R_METRICS };

/* HTTP status codes counted for /metrics. */
static const int k_codes[] = {200, 400, 401, 404, 405, 408, 413, 429, 500, 503};
#define N_CODES (int)(sizeof k_codes / sizeof k_codes[0])

struct moe_server {
    struct moe_server_params p;
    struct moe_sched *sched;
    const struct moe_model *m;
    struct MHD_Daemon *d;
    int port;
    const char *const *chat_stops;   /* the template's end-of-turn strings */
    int n_chat_stops;
    int32_t chat_stop_ids[16];       /* those that are one token */
    int n_chat_stop_ids;
    pthread_mutex_t mu;              /* socks, counts */
    struct sock *socks;
    pthread_t watch;
    int have_watch, stopping;
    pthread_cond_t watch_cv;
    int64_t codes[N_CODES], timeouts;
    uint64_t next_id;
    double t_start;
    long long started;              /* wall clock at start (/v1/models' created) */
};

/* Per request (the connection's con_cls). */
struct req {
    enum route route;
    struct moe_buf body;
    int too_big;
    struct sock *sock;
};

/* One streamed answer, owned by its MHD response (freed by stream_free). */
struct stream {
    struct moe_server *srv;
    struct moe_sched_req *req;
    enum moe_serve_kind kind;
    int fd, include_usage, phase;    /* phase: 0 role chunk (chat), 1 text, 2 finish chunk, 3 usage, 4 [DONE], 5 end */
    size_t sent;                     /* text bytes sent */
    struct moe_buf out;              /* bytes formatted, not yet handed to MHD */
    size_t out_off;
    char id[48];
    long long created;
    double last_event;
};

static void count_code(struct moe_server *srv, int code) {
    pthread_mutex_lock(&srv->mu);
    for (int i = 0; i < N_CODES; i++)
        if (k_codes[i] == code) srv->codes[i]++;
    pthread_mutex_unlock(&srv->mu);
}

/* ---- answers -------------------------------------------------------------- */

/* reply: queue `text` (copied) with `code` and a content type. */
static enum MHD_Result reply(struct moe_server *srv, struct MHD_Connection *c, int code, const char *type,
                             const char *text) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    const enum MHD_Result ok = MHD_queue_response(c, (unsigned)code, r);
    MHD_destroy_response(r);
    count_code(srv, code);
    return ok;
}

static enum MHD_Result reply_json(struct moe_server *srv, struct MHD_Connection *c, int code, cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    const enum MHD_Result ok = reply(srv, c, s ? code : 500, "application/json", s ? s : "{}");
    cJSON_free(s);
    return ok;
}

static enum MHD_Result reply_error(struct moe_server *srv, struct MHD_Connection *c, const struct moe_serve_error *e) {
    char *s = moe_serve_error_json(e);
    const enum MHD_Result ok = reply(srv, c, e->http, "application/json", s ? s : "{}");
    free(s);
    return ok;
}

static enum MHD_Result fail(struct moe_server *srv, struct MHD_Connection *c, int http, const char *param,
                            const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result fail(struct moe_server *srv, struct MHD_Connection *c, int http, const char *param,
                            const char *code, const char *fmt, ...) {
    struct moe_serve_error e;
    va_list ap;
    va_start(ap, fmt);
    char msg[256];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    moe_serve_error_set(&e, http, param, code, "%s", msg);
    return reply_error(srv, c, &e);
}

/* add_text: a string member from bytes that may not be valid UTF-8 (a model
 * can end on half a character): each bad byte becomes U+FFFD. */
static void add_text(cJSON *o, const char *key, const char *t, size_t n) {
    struct moe_buf b = {0};
    for (size_t i = 0; i < n;) {
        const size_t ok = moe_utf8_bad_offset(t + i, n - i);
        moe_buf_append(&b, t + i, ok);
        i += ok;
        if (i < n) moe_buf_append(&b, "\xEF\xBF\xBD", 3), i++;
    }
    cJSON_AddStringToObject(o, key, b.data ? b.data : "");
    moe_buf_free(&b);
}

static const char *finish_name(enum moe_finish f) { return f == MOE_FINISH_LENGTH ? "length" : "stop"; }

static cJSON *usage_json(int n_prompt, int n_gen) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", n_prompt + n_gen);
    return u;
}

/* envelope: {id, object, created, model} of an answer or a chunk. */
static cJSON *envelope(const struct moe_server *srv, const char *id, const char *object, long long created) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", srv->p.model_name);
    return o;
}

/* choice: one choice of an answer (delta: a stream chunk). text NULL: no text member. */
static cJSON *choice(enum moe_serve_kind kind, int delta, const char *role, const char *text, size_t n,
                     const char *finish) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (kind == MOE_SERVE_CHAT) {
        cJSON *msg = cJSON_CreateObject();
        if (role) cJSON_AddStringToObject(msg, "role", role);
        if (text) add_text(msg, "content", text, n);
        cJSON_AddItemToObject(c, delta ? "delta" : "message", msg);
    } else {
        add_text(c, "text", text ? text : "", text ? n : 0);
        cJSON_AddNullToObject(c, "logprobs");
    }
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

/* ---- the socket: has the client gone? ---------------------------------- */

/* peer_gone: 1 if the client closed or reset the connection (a read would
 * see the end or an error); bytes it sent ahead are left unread. */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, 0) <= 0) return 0;
    if (pf.revents & (POLLERR | POLLHUP | POLLNVAL)) return 1;
    char b;
    const ssize_t n = recv(fd, &b, 1, MSG_PEEK);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* ---- generation requests -------------------------------------------------- */

/* prompt_of: the prompt as token ids: the chat rendered with the template, or
 * the raw text (with the tokenizer's special tokens, as moe-run adds them).
 * 0 ok, else an error in *e. */
static int prompt_of(struct moe_server *srv, const struct moe_serve_request *q, int32_t **ids, size_t *n,
                     struct moe_serve_error *e) {
    const struct moe_tokenizer *tok = srv->m->tok;
    char *text = NULL;
    if (q->kind == MOE_SERVE_CHAT) {
        if (!srv->p.chat) {
            moe_serve_error_set(e, 400, "messages", "no_chat_template",
                                "this model has no chat template (start moe-serve with --chat-template NAME|FILE)");
            return -1;
        }
        struct moe_chat_message *msgs = calloc(q->n_messages, sizeof *msgs);
        if (!msgs) {
            moe_serve_error_set(e, 500, NULL, NULL, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < q->n_messages; i++) msgs[i].role = q->roles[i], msgs[i].content = q->contents[i];
        const enum moe_status st = moe_chat_render(srv->p.chat, msgs, q->n_messages, 1, &text);
        free(msgs);
        if (st != MOE_OK) {
            moe_serve_error_set(e, 400, "messages", "template_error", "the chat template refused these messages: %s",
                                moe_status_str(st));
            return -1;
        }
    }
    const char *t = q->kind == MOE_SERVE_CHAT ? text : q->prompt;
    const enum moe_status st = moe_tokenizer_encode(tok, t, strlen(t), q->kind != MOE_SERVE_CHAT, ids, n);
    free(text);
    if (st != MOE_OK) {
        moe_serve_error_set(e, 500, NULL, NULL, "tokenization failed: %s", moe_status_str(st));
        return -1;
    }
    if (*n == 0) {
        moe_serve_error_set(e, 400, q->kind == MOE_SERVE_CHAT ? "messages" : "prompt", "invalid_value",
                            "the prompt is empty");
        return -1;
    }
    return 0;
}

/* submit: check, tokenize and queue request q. NULL after an answer was queued. */
static struct moe_sched_req *submit(struct moe_server *srv, struct MHD_Connection *c, const struct moe_serve_request *q,
                                    int *n_prompt, enum MHD_Result *res) {
    struct moe_serve_error e;
    if (q->model && strcmp(q->model, srv->p.model_name) != 0) {
        *res = fail(srv, c, 400, "model", "model_not_found", "the model '%.64s' does not exist; this server has '%.64s'",
                    q->model, srv->p.model_name);
        return NULL;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (prompt_of(srv, q, &ids, &n, &e) != 0) {
        free(ids);
        *res = reply_error(srv, c, &e);
        return NULL;
    }
    const int n_ctx = moe_sched_n_ctx(srv->sched);
    const int max_tokens = q->max_tokens > 0 ? q->max_tokens : q->kind == MOE_SERVE_COMPLETION ? 16 : INT32_MAX;
    if ((long long)n >= n_ctx || (q->max_tokens > 0 && (long long)n + q->max_tokens > n_ctx)) {
        *res = fail(srv, c, 400, q->max_tokens > 0 && (long long)n < n_ctx ? "max_tokens" : "messages",
                    "context_length_exceeded",
                    "this model's context is %d tokens; the request asks for %zu in the prompt and %d to generate", n_ctx,
                    n, q->max_tokens > 0 ? q->max_tokens : 0);
        free(ids);
        return NULL;
    }
    const char *stops[MOE_SERVE_MAX_STOP + 16];
    int n_stop = 0;
    for (int i = 0; i < q->n_stop; i++) stops[n_stop++] = q->stop[i];
    const int chat = q->kind == MOE_SERVE_CHAT;
    for (int i = 0; chat && i < srv->n_chat_stops && n_stop < (int)(sizeof stops / sizeof stops[0]); i++)
        stops[n_stop++] = srv->chat_stops[i];
    uint64_t seed;
    if (q->has_seed) {
        seed = q->seed;
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)(uintptr_t)c << 17);
    }
    struct moe_gen_params g = {max_tokens, (float)q->temperature, (float)q->top_p, seed, stops, n_stop,
                               chat ? srv->chat_stop_ids : NULL, chat ? srv->n_chat_stop_ids : 0, q->ignore_eos};
    struct moe_sched_req *r = NULL;
    const enum moe_status st = moe_sched_submit(srv->sched, ids, (int)n, &g, &r);
    free(ids);
    if (st == MOE_ERR_RANGE) *res = fail(srv, c, 429, NULL, "queue_full", "the server is busy: its queue is full; retry later");
    else if (st == MOE_ERR_CANCELLED) *res = fail(srv, c, 503, NULL, "shutting_down", "the server is shutting down");
    else if (st != MOE_OK) *res = fail(srv, c, 500, NULL, NULL, "cannot queue the request: %s", moe_status_str(st));
    *n_prompt = (int)n;
    return st == MOE_OK ? r : NULL;
}

static void make_id(struct moe_server *srv, enum moe_serve_kind kind, char *id, size_t cap) {
    pthread_mutex_lock(&srv->mu);
    const uint64_t k = srv->next_id++;
    pthread_mutex_unlock(&srv->mu);
    snprintf(id, cap, "%s-%" PRIx64 "%06" PRIx64, kind == MOE_SERVE_CHAT ? "chatcmpl" : "cmpl",
             (uint64_t)time(NULL), k & 0xffffff);
}

/* answer_whole: wait for the request to finish and answer with one JSON object. */
static enum MHD_Result answer_whole(struct moe_server *srv, struct MHD_Connection *c, enum moe_serve_kind kind,
                                    struct moe_sched_req *r) {
    const int fd = conn_fd(c);
    struct moe_sched_progress p;
    while (!moe_sched_wait(r, SIZE_MAX, WAIT_S, &p))
        if (peer_gone(fd)) { /* nobody to answer: free the sequence now */
            moe_sched_release(r);
            return MHD_NO;
        }
    enum MHD_Result res;
    if (p.finish == MOE_FINISH_CANCELLED) {
        res = fail(srv, c, 503, NULL, "shutting_down", "the request was cancelled: the server is shutting down");
    } else if (p.finish == MOE_FINISH_ERROR) {
        res = fail(srv, c, 500, NULL, NULL, "the model failed: %s", moe_status_str(p.error));
    } else {
        char *text = malloc(p.text_len + 1), id[48];
        make_id(srv, kind, id, sizeof id);
        if (text) moe_sched_text(r, 0, p.text_len, text);
        cJSON *o = envelope(srv, id, kind == MOE_SERVE_CHAT ? "chat.completion" : "text_completion", (long long)time(NULL));
        cJSON *choices = cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToArray(choices, choice(kind, 0, "assistant", text ? text : "", text ? p.text_len : 0,
                                             finish_name(p.finish)));
        cJSON_AddItemToObject(o, "usage", usage_json(p.n_prompt, p.n_gen));
        free(text);
        res = reply_json(srv, c, 200, o);
    }
    moe_sched_release(r);
    return res;
}

/* ---- streaming (server-sent events) ------------------------------------- */

static void sse_event(struct stream *s, cJSON *o) {
    char *t = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (t) moe_buf_printf(&s->out, "data: %s\n\n", t);
    cJSON_free(t);
    s->last_event = moe_now_s();
}

static cJSON *chunk(const struct stream *s, cJSON *choice_obj) {
    cJSON *o = envelope(s->srv, s->id, s->kind == MOE_SERVE_CHAT ? "chat.completion.chunk" : "text_completion",
                        s->created);
    cJSON *a = cJSON_AddArrayToObject(o, "choices");
    if (choice_obj) cJSON_AddItemToArray(a, choice_obj);
    return o;
}

/* stream_fill: format the next events into s->out (waiting for text when
 * there is none). 0 ok, -1 the client went away. */
static int stream_fill(struct stream *s) {
    if (s->phase == 0) { /* chat: the assistant's role first */
        sse_event(s, chunk(s, choice(s->kind, 1, "assistant", "", 0, NULL)));
        s->phase = 1;
        return 0;
    }
    if (s->phase == 1) {
        struct moe_sched_progress p;
        while (!moe_sched_wait(s->req, s->sent, WAIT_S, &p)) {
            if (peer_gone(s->fd)) return -1;
            if (moe_now_s() - s->last_event > KEEPALIVE_S) { /* a comment keeps proxies (and us) sure it lives */
                moe_buf_printf(&s->out, ": keep-alive\n\n");
                s->last_event = moe_now_s();
                return 0;
            }
        }
        if (p.text_len > s->sent) {
            char *t = malloc(p.text_len - s->sent);
            if (!t) return -1;
            moe_sched_text(s->req, s->sent, p.text_len, t);
            sse_event(s, chunk(s, choice(s->kind, 1, NULL, t, p.text_len - s->sent, NULL)));
            free(t);
            s->sent = p.text_len;
        }
        if (p.finish == MOE_FINISH_NONE) return 0;
        if (p.finish == MOE_FINISH_CANCELLED || p.finish == MOE_FINISH_ERROR) {
            struct moe_serve_error e;
            moe_serve_error_set(&e, p.finish == MOE_FINISH_ERROR ? 500 : 503, NULL,
                                p.finish == MOE_FINISH_ERROR ? NULL : "shutting_down", "%s",
                                p.finish == MOE_FINISH_ERROR ? moe_status_str(p.error) : "the server is shutting down");
            char *t = moe_serve_error_json(&e);
            if (t) moe_buf_printf(&s->out, "data: %s\n\n", t);
            free(t);
            s->phase = 4;
            return 0;
        }
        cJSON *c = choice(s->kind, 1, NULL, NULL, 0, finish_name(p.finish));
        if (s->kind == MOE_SERVE_COMPLETION) cJSON_ReplaceItemInObject(c, "text", cJSON_CreateString(""));
        sse_event(s, chunk(s, c));
        if (s->include_usage) {
            cJSON *u = chunk(s, NULL);
            cJSON_AddItemToObject(u, "usage", usage_json(p.n_prompt, p.n_gen));
            sse_event(s, u);
        }
        s->phase = 4;
        return 0;
    }
    moe_buf_printf(&s->out, "data: [DONE]\n\n");
    s->phase = 5;
    return 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    struct stream *s = cls;
    (void)pos;
    while (s->out_off == s->out.len) {
        if (s->phase == 5) return MHD_CONTENT_READER_END_OF_STREAM;
        s->out.len = s->out_off = 0;
        if (stream_fill(s) != 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    const size_t n = s->out.len - s->out_off < max ? s->out.len - s->out_off : max;
    memcpy(buf, s->out.data + s->out_off, n);
    s->out_off += n;
    return (ssize_t)n;
}

/* stream_free: the response is done with (sent, or the client went away):
 * the request is released, which frees its sequence if it still runs. */
static void stream_free(void *cls) {
    struct stream *s = cls;
    moe_sched_release(s->req);
    moe_buf_free(&s->out);
    free(s);
}

static enum MHD_Result answer_stream(struct moe_server *srv, struct MHD_Connection *c, const struct moe_serve_request *q,
                                     struct moe_sched_req *r) {
    struct stream *s = calloc(1, sizeof *s);
    if (!s) {
        moe_sched_release(r);
        return MHD_NO;
    }
    s->srv = srv, s->req = r, s->kind = q->kind, s->fd = conn_fd(c), s->include_usage = q->include_usage;
    s->phase = q->kind == MOE_SERVE_CHAT ? 0 : 1;
    s->created = (long long)time(NULL);
    s->last_event = moe_now_s();
    make_id(srv, q->kind, s->id, sizeof s->id);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
    if (!resp) {
        stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    const enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp); /* stream_free runs when the connection lets it go */
    count_code(srv, 200);
    return ok;
}

static enum MHD_Result generate(struct moe_server *srv, struct MHD_Connection *c, struct req *k) {
    const enum moe_serve_kind kind = k->route == R_CHAT ? MOE_SERVE_CHAT : MOE_SERVE_COMPLETION;
    struct moe_serve_request q;
    struct moe_serve_error e;
    if (moe_serve_request_parse(kind, k->body.data ? k->body.data : "", k->body.len, &q, &e) != MOE_OK)
        return reply_error(srv, c, &e);
    enum MHD_Result res = MHD_NO;
    int n_prompt = 0;
    struct moe_sched_req *r = submit(srv, c, &q, &n_prompt, &res);
    if (r) res = q.stream ? answer_stream(srv, c, &q, r) : answer_whole(srv, c, kind, r);
    moe_serve_request_clear(&q);
    return res;
}

/* ---- GET endpoints ------------------------------------------------------- */

static enum MHD_Result models(struct moe_server *srv, struct MHD_Connection *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv->p.model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)srv->started);
    cJSON_AddStringToObject(m, "owned_by", "moe-serve");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
    return reply_json(srv, c, 200, o);
}

static double rss_bytes(void) {
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return NAN;
    const int ok = fscanf(f, "%ld %ld", &pages, &rss) == 2;
    fclose(f);
    return ok ? (double)rss * (double)sysconf(_SC_PAGESIZE) : NAN;
}

static void metric(struct moe_buf *b, const char *name, const char *type, const char *help, double v) {
    moe_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static enum MHD_Result metrics(struct moe_server *srv, struct MHD_Connection *c) {
    struct moe_sched_stats s;
    moe_sched_get_stats(srv->sched, &s);
    struct moe_buf b = {0};
    moe_buf_printf(&b, "# HELP moe_requests_total Generation requests by how they ended.\n"
                       "# TYPE moe_requests_total counter\n");
    const struct {
        const char *k;
        int64_t v;
    } ends[] = {{"stop", s.finished_stop}, {"length", s.finished_length}, {"cancelled", s.cancelled},
                {"error", s.failed}, {"rejected_queue_full", s.rejected_full}};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
        moe_buf_printf(&b, "moe_requests_total{result=\"%s\"} %" PRId64 "\n", ends[i].k, ends[i].v);
    moe_buf_printf(&b, "# HELP moe_http_responses_total HTTP responses by status code.\n"
                       "# TYPE moe_http_responses_total counter\n");
    pthread_mutex_lock(&srv->mu);
    for (int i = 0; i < N_CODES; i++)
        moe_buf_printf(&b, "moe_http_responses_total{code=\"%d\"} %" PRId64 "\n", k_codes[i], srv->codes[i]);
    const int64_t timeouts = srv->timeouts;
    pthread_mutex_unlock(&srv->mu);
    metric(&b, "moe_slow_clients_cut_total", "counter", "Connections shut down for not sending a request in time.",
           (double)timeouts);
    metric(&b, "moe_prompt_tokens_total", "counter", "Prompt tokens prefilled.", (double)s.prompt_tokens);
    metric(&b, "moe_generated_tokens_total", "counter", "Tokens sampled.", (double)s.gen_tokens);
    metric(&b, "moe_prompt_seconds_total", "counter", "Engine time spent prefilling.", s.prefill_s);
    metric(&b, "moe_decode_seconds_total", "counter", "Engine time spent in decode steps.", s.decode_s);
    metric(&b, "moe_tokens_per_second", "gauge", "Decoded tokens per second of decode time, all sequences together.",
           s.decode_s > 0 ? (double)s.step_tokens / s.decode_s : 0);
    metric(&b, "moe_prompt_tokens_per_second", "gauge", "Prompt tokens per second of prefill time.",
           s.prefill_s > 0 ? (double)s.prompt_tokens / s.prefill_s : 0);
    metric(&b, "moe_decode_steps_total", "counter", "Decode steps (each runs one token of every active sequence).",
           (double)s.steps);
    metric(&b, "moe_decode_step_tokens_total", "counter", "Tokens run by decode steps (over steps: the mean batch).",
           (double)s.step_tokens);
    metric(&b, "moe_queue_depth", "gauge", "Requests waiting for a sequence.", s.queue_depth);
    metric(&b, "moe_queue_capacity", "gauge", "Requests the queue holds (--queue).", s.queue_cap);
    metric(&b, "moe_active_sequences", "gauge", "Sequences generating now.", s.active);
    metric(&b, "moe_parallel_sequences", "gauge", "Sequences decoded together at most (--parallel).", s.n_parallel);
    metric(&b, "moe_batched_decode", "gauge", "1: one batched step for all sequences; 0: one after another.", s.batched);
    const struct moe_store_stats *x = &s.store;
    const double tok = x->tokens > 0 ? (double)x->tokens : NAN, served = (double)(x->accesses - x->skips);
    metric(&b, "moe_expert_store_active", "gauge", "1: experts in a memory budget (--expert-mem); 0: all resident.",
           s.have_store);
    metric(&b, "moe_expert_hit_ratio", "gauge", "Expert uses served from memory (1 when every expert is resident).",
           !s.have_store ? 1.0 : served > 0 ? (double)(x->hits_high + x->hits_low) / served : NAN);
    metric(&b, "moe_expert_uses_total", "counter", "Expert uses by tokens (prompt and decode), skipped ones excluded.",
           s.have_store ? served : 0.0);
    metric(&b, "moe_expert_hits_total", "counter", "Of which served from memory.",
           s.have_store ? (double)(x->hits_high + x->hits_low) : 0.0);
    metric(&b, "moe_expert_loads_total", "counter", "Expert copies read from storage.", (double)x->loads);
    metric(&b, "moe_expert_bytes_read_total", "counter", "Bytes of experts read from storage.", (double)x->load_bytes);
    metric(&b, "moe_expert_bytes_read_per_token", "gauge", "Expert bytes read per token run.",
           !s.have_store ? 0.0 : (double)x->load_bytes / tok);
    metric(&b, "moe_expert_stall_seconds_total", "counter", "Time the engine waited for expert reads.", x->stall_s);
    metric(&b, "moe_expert_stall_seconds_per_token", "gauge", "Stall per token run.",
           !s.have_store ? 0.0 : x->stall_s / tok);
    metric(&b, "moe_big_little_tokens_total", "counter",
           "Tokens big-little decoding decided (--little-k; 0 when it is off).", (double)s.big_little.tokens);
    metric(&b, "moe_big_little_fallbacks_total", "counter", "Of which the big model ran again (below --gamma).",
           (double)s.big_little.fallbacks);
    metric(&b, "process_resident_memory_bytes", "gauge", "Resident memory of the server.", rss_bytes());
    metric(&b, "moe_uptime_seconds", "counter", "Seconds since the server started.", moe_now_s() - srv->t_start);
    const enum MHD_Result ok = reply(srv, c, 200, "text/plain; version=0.0.4", b.data ? b.data : "");
    moe_buf_free(&b);
    return ok;
}

/* ---- routing ----------------------------------------------------------- */

static enum route route_of(const char *url) {
    if (strncmp(url, "/v1/", 4) == 0) url += 3;
    if (!strcmp(url, "/chat/completions")) return R_CHAT;
    if (!strcmp(url, "/completions")) return R_COMPLETIONS;
    if (!strcmp(url, "/models")) return R_MODELS;
    if (!strcmp(url, "/health")) return R_HEALTH;
    if (!strcmp(url, "/metrics")) return R_METRICS;
    return R_NONE;
}

/* authorized: "Authorization: Bearer KEY" matches (compared in constant time). */
static int authorized(const struct moe_server *srv, struct MHD_Connection *c) {
    if (!srv->p.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    const size_t n = strlen(h), m = strlen(srv->p.api_key);
    unsigned diff = (unsigned)(n != m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)h[i] ^ (unsigned char)srv->p.api_key[i < m ? i : 0];
    return diff == 0;
}

static struct sock *sock_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* first_call: a new request: route, method, key and size are checked before
 * the body is read. 1: answered (or refused); 0: go on. */
static int first_call(struct moe_server *srv, struct MHD_Connection *c, struct req *k, const char *method,
                      enum MHD_Result *res) {
    const int post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    const int gen = k->route == R_CHAT || k->route == R_COMPLETIONS;
    if (k->route == R_NONE) return *res = fail(srv, c, 404, NULL, "not_found", "no such path"), 1;
    if ((gen && !post) || (!gen && !get)) {
        *res = fail(srv, c, 405, NULL, "method_not_allowed", "use %s for this path", gen ? "POST" : "GET");
        return 1;
    }
    if (k->route != R_HEALTH && !authorized(srv, c))
        return *res = fail(srv, c, 401, NULL, "invalid_api_key", "a missing or wrong API key (Authorization: Bearer KEY)"), 1;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (gen && cl && strtoull(cl, NULL, 10) > srv->p.max_body) {
        *res = fail(srv, c, 413, NULL, "request_too_large", "the request body is over the limit of %zu bytes",
                    srv->p.max_body);
        return 1;
    }
    return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    struct moe_server *srv = cls;
    struct req *k = *con_cls;
    (void)version;
    if (!k) {
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        *con_cls = k;
        k->route = route_of(url);
        k->sock = sock_of(c);
        enum MHD_Result res;
        if (first_call(srv, c, k, method, &res)) return res;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->too_big && k->body.len + *upload_size > srv->p.max_body) k->too_big = 1;
        if (!k->too_big && moe_buf_append(&k->body, upload, *upload_size) != MOE_OK) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->sock) {
        pthread_mutex_lock(&srv->mu);
        k->sock->reading = 0; /* the whole request is here */
        pthread_mutex_unlock(&srv->mu);
    }
    if (k->too_big)
        return fail(srv, c, 413, NULL, "request_too_large", "the request body is over the limit of %zu bytes",
                    srv->p.max_body);
    switch (k->route) {
    case R_CHAT: case R_COMPLETIONS: return generate(srv, c, k);
    case R_MODELS: return models(srv, c);
    case R_METRICS: return metrics(srv, c);
    default: return reply(srv, c, 200, "application/json", "{\"status\":\"ok\"}");
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    struct moe_server *srv = cls;
    struct req *k = *con_cls;
    (void)toe;
    struct sock *so = k ? k->sock : sock_of(c);
    if (so) { /* the connection now waits for its next request */
        pthread_mutex_lock(&srv->mu);
        so->reading = 1, so->since = moe_now_s();
        pthread_mutex_unlock(&srv->mu);
    }
    if (k) moe_buf_free(&k->body);
    free(k);
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode what) {
    struct moe_server *srv = cls;
    if (what == MHD_CONNECTION_NOTIFY_STARTED) {
        struct sock *so = calloc(1, sizeof *so);
        if (!so) return;
        so->fd = conn_fd(c), so->since = moe_now_s(), so->reading = 1;
        pthread_mutex_lock(&srv->mu);
        so->next = srv->socks;
        if (srv->socks) srv->socks->prev = so;
        srv->socks = so;
        pthread_mutex_unlock(&srv->mu);
        *socket_context = so;
    } else if (*socket_context) {
        struct sock *so = *socket_context;
        pthread_mutex_lock(&srv->mu);
        if (so->prev) so->prev->next = so->next;
        else srv->socks = so->next;
        if (so->next) so->next->prev = so->prev;
        pthread_mutex_unlock(&srv->mu);
        free(so);
        *socket_context = NULL;
    }
}

/* watch_main: shut down the sockets of connections that have not delivered
 * a whole request within read_timeout_s (a client trickling its headers or
 * body a byte at a time); MHD then sees the end and closes them. */
static void *watch_main(void *arg) {
    struct moe_server *srv = arg;
    pthread_mutex_lock(&srv->mu);
    while (!srv->stopping) {
        const double now = moe_now_s();
        for (struct sock *so = srv->socks; so; so = so->next)
            if (so->reading && now - so->since > srv->p.read_timeout_s) {
                shutdown(so->fd, SHUT_RDWR);
                so->reading = 0;
                srv->timeouts++;
            }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250000000;
        if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&srv->watch_cv, &srv->mu, &until);
    }
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* ---- start and stop ---------------------------------------------------- */

struct moe_server_params moe_server_default_params(void) {
    struct moe_server_params p = {0};
    p.host = "127.0.0.1";
    p.port = 8080;
    p.max_body = 1u << 20;
    p.model_name = "moe";
    p.idle_timeout_s = 60;
    p.read_timeout_s = 30;
    p.max_connections = 64;
    return p;
}

/* chat_stops: the template's end-of-turn strings, and the ids of those that
 * are one token of the vocabulary. */
static void chat_stops(struct moe_server *srv) {
    if (!srv->p.chat) return;
    srv->chat_stops = moe_chat_template_stops(srv->p.chat);
    for (int i = 0; srv->chat_stops && srv->chat_stops[i] && i < 16; i++) {
        srv->n_chat_stops++;
        const int32_t id = srv->m->tok ? moe_tokenizer_find(srv->m->tok, srv->chat_stops[i]) : -1;
        if (id >= 0 && srv->n_chat_stop_ids < 16) srv->chat_stop_ids[srv->n_chat_stop_ids++] = id;
    }
}

/* resolve: host and port as a socket address (numeric or a name). */
static int resolve(const char *host, int port, struct sockaddr_storage *sa, socklen_t *len) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC, hints.ai_socktype = SOCK_STREAM, hints.ai_flags = AI_PASSIVE;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    const int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc != 0 || !ai) {
        MOE_LOGE("cannot resolve the address %s: %s", host, gai_strerror(rc));
        return 0;
    }
    memcpy(sa, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 1;
}

enum moe_status moe_server_start(struct moe_sched *sched, const struct moe_model *model,
                                 const struct moe_server_params *p, struct moe_server **out) {
    *out = NULL;
    if (!model->tok || p->port < 0 || p->port > 65535 || !p->model_name || p->max_connections < 1 ||
        p->read_timeout_s < 1 || p->idle_timeout_s < 1) {
        MOE_LOGE(model->tok ? "bad server parameters" : "the model has no tokenizer: it cannot be served");
        return MOE_ERR_INVALID;
    }
    struct moe_server *srv = calloc(1, sizeof *srv);
    if (!srv) return MOE_ERR_NOMEM;
    srv->p = *p, srv->sched = sched, srv->m = model, srv->t_start = moe_now_s(), srv->started = (long long)time(NULL);
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->watch_cv, NULL);
    chat_stops(srv);
    struct sockaddr_storage sa;
    socklen_t sa_len = 0;
    if (!resolve(p->host ? p->host : "127.0.0.1", p->port, &sa, &sa_len)) {
        moe_server_stop(srv);
        return MOE_ERR_INVALID;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (sa.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    srv->d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, srv,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_connections,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p->idle_timeout_s,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
                              MHD_OPTION_END);
    if (!srv->d) {
        MOE_LOGE("cannot listen on %s port %d: %s", p->host ? p->host : "127.0.0.1", p->port,
                 errno ? strerror(errno) : "libmicrohttpd refused");
        moe_server_stop(srv);
        return MOE_ERR_IO;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->d, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : p->port;
    if (pthread_create(&srv->watch, NULL, watch_main, srv) == 0) srv->have_watch = 1;
    *out = srv;
    return MOE_OK;
}

int moe_server_port(const struct moe_server *srv) { return srv->port; }

void moe_server_stop(struct moe_server *srv) {
    if (!srv) return;
    if (srv->d) {
        moe_sched_shutdown(srv->sched); /* every waiting handler wakes and answers */
        MHD_stop_daemon(srv->d);
    }
    pthread_mutex_lock(&srv->mu);
    srv->stopping = 1;
    pthread_cond_signal(&srv->watch_cv);
    pthread_mutex_unlock(&srv->mu);
    if (srv->have_watch) pthread_join(srv->watch, NULL);
    pthread_cond_destroy(&srv->watch_cv);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
}

/*
 * moe-serve - an OpenAI-compatible HTTP server for a Mixture-of-Experts
 * model: requests decoded together over one expert cache.
 *
 * The CLI only parses arguments, loads, starts and waits for a signal; the
 * work is in the server library (moe-server.h, moe-sched.h).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-backend.h"
#include "moe-base.h"
#include "moe-chat.h"
#include "moe-mmap.h"
#include "moe-opt.h"
#include "moe-options.h"
#include "moe-sched.h"
#include "moe-server.h"

enum { O_HOST = 256, O_PORT, O_PARALLEL, O_QUEUE, O_API_KEY, O_MAX_BODY, O_CHAT_TEMPLATE, O_MODEL_NAME, O_TIMEOUT,
       O_READ_TIMEOUT, O_MAX_CONN, O_SEQUENTIAL, O_VERSION };

static const struct moe_opt k_server[] = {
    {"host", O_HOST, MOE_OPT_REQUIRED, "ADDR", "address to listen on (default 127.0.0.1; 0.0.0.0 = every\ninterface)"},
    {"port", O_PORT, MOE_OPT_REQUIRED, "N", "port (default 8080; 0 = a free port, printed at start)"},
    {"parallel", O_PARALLEL, MOE_OPT_REQUIRED, "N",
     "sequences decoded together, each with its own KV cache of\n--ctx tokens (default 4)"},
    {"queue", O_QUEUE, MOE_OPT_REQUIRED, "N", "requests that may wait for a sequence (default 64); more\nare answered 429"},
    {"api-key", O_API_KEY, MOE_OPT_REQUIRED, "KEY",
     "require \"Authorization: Bearer KEY\" (all paths but /health;\ndefault: $MOE_API_KEY, else none)"},
    {"max-body", O_MAX_BODY, MOE_OPT_REQUIRED, "SIZE", "largest request body (default 1M); larger ones get 413"},
    {"chat-template", O_CHAT_TEMPLATE, MOE_OPT_REQUIRED, "NAME|FILE",
     "the chat template: a built-in name (chatml, llama3, ...) or a\nJinja file (default: the model's own)"},
    {"model-name", O_MODEL_NAME, MOE_OPT_REQUIRED, "NAME", "the model's name in the API (default: the model file's name)"},
    {"timeout", O_TIMEOUT, MOE_OPT_REQUIRED, "S", "close a connection idle S seconds (default 60)"},
    {"read-timeout", O_READ_TIMEOUT, MOE_OPT_REQUIRED, "S",
     "a request's headers and body must arrive within S seconds,\nhowever slowly they trickle (default 30)"},
    {"max-connections", O_MAX_CONN, MOE_OPT_REQUIRED, "N", "open connections at most (default 64)"},
    {"sequential", O_SEQUENTIAL, MOE_OPT_NONE, NULL,
     "one session per sequence, stepped one after another, instead\nof one batched step (for comparisons)"},
    {"verbose", 'v', MOE_OPT_NONE, NULL, "more log output"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this help"},
    {"version", O_VERSION, MOE_OPT_NONE, NULL, "print the version and exit"},
    {NULL, 0, 0, NULL, NULL},
};

static void usage(FILE *f) {
    fprintf(f,
"usage: moe-serve -m MODEL [options]\n"
"\n"
"Serve a Mixture-of-Experts model over HTTP with OpenAI's API:\n"
"POST /v1/chat/completions and /v1/completions (JSON, or server-sent events\n"
"with \"stream\": true), GET /v1/models, /health and /metrics (Prometheus).\n"
"Concurrent requests are decoded together in one batched step, so an expert\n"
"loaded for one serves every request routed to it. SIGINT or SIGTERM stops\n"
"it cleanly.\n"
"\n"
"server:\n");
    moe_opt_help(f, k_server);
    fprintf(f, "\n%s\n%s\n%s\n%s\n", moe_engine_options_help(), moe_big_little_options_help(), moe_store_options_help(),
            moe_gpu_options_help());
    fprintf(f,
"examples:\n"
"  moe-serve -m mixtral.moeb --expert-mem 25%% --parallel 8\n"
"  moe-serve -m olmoe.moeb --expert-mem 2G --little-k 4 --gamma 0.7\n"
"  moe-serve -m ./Qwen3-30B-A3B --port 9000 --api-key secret\n"
"  moe-serve -m datasets/models/tiny-moe-mixtral --chat-template chatml --port 0\n"
"  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
"       -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":32}'\n");
}

struct args {
    struct moe_engine_args eng;
    struct moe_server_params srv;
    int parallel, queue, sequential, verbose;
    const char *chat_template;
};

static int int_opt(const char *name, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    const long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "moe-serve: --%s expects an integer in [%ld, %ld], got \"%s\"\n", name, lo, hi, v);
        return 2;
    }
    *out = (int)x;
    return 0;
}

static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    struct args *a = ctx;
    switch (o->key) {
    case 'h': usage(stdout); return 1;
    case O_VERSION: printf("moe-serve %s\n", MOE_VERSION); return 1;
    case 'v': a->verbose = 1; return 0;
    case O_HOST: a->srv.host = v; return 0;
    case O_PORT: return int_opt(o->name, v, 0, 65535, &a->srv.port);
    case O_PARALLEL: return int_opt(o->name, v, 1, 1024, &a->parallel);
    case O_QUEUE: return int_opt(o->name, v, 0, 1 << 20, &a->queue);
    case O_API_KEY: a->srv.api_key = v; return 0;
    case O_CHAT_TEMPLATE: a->chat_template = v; return 0;
    case O_MODEL_NAME: a->srv.model_name = v; return 0;
    case O_TIMEOUT: return int_opt(o->name, v, 1, 86400, &a->srv.idle_timeout_s);
    case O_READ_TIMEOUT: return int_opt(o->name, v, 1, 86400, &a->srv.read_timeout_s);
    case O_MAX_CONN: return int_opt(o->name, v, 1, 100000, &a->srv.max_connections);
    case O_SEQUENTIAL: a->sequential = 1; return 0;
    case O_MAX_BODY: {
        int64_t b;
        if (moe_parse_size(v, &b) != MOE_OK || b < 1) {
            fprintf(stderr, "moe-serve: --max-body expects a size such as 1M or 65536, got \"%s\"\n", v);
            return 2;
        }
        a->srv.max_body = (size_t)b;
        return 0;
    }
    default: {
        const int rc = moe_engine_option("moe-serve", &a->eng, o, v);
        if (rc < 0) fprintf(stderr, "moe-serve: unhandled option --%s\n", o->name);
        return rc < 0 ? 2 : rc;
    }
    }
}

/* parse_args: 0 ok, 1 help printed, 2 usage error. */
static int parse_args(int argc, char **argv, struct args *a) {
    memset(a, 0, sizeof *a);
    moe_engine_args_init(&a->eng);
    a->srv = moe_server_default_params();
    a->srv.model_name = NULL;
    a->srv.api_key = getenv("MOE_API_KEY");
    if (a->srv.api_key && !a->srv.api_key[0]) a->srv.api_key = NULL;
    a->parallel = 4, a->queue = 64;
    const struct moe_opt *tables[] = {k_server, moe_engine_option_table(), moe_big_little_option_table(),
                                      moe_store_option_table(), moe_gpu_option_table()};
    int first_pos = argc;
    const int rc = moe_opt_parse("moe-serve", argc, argv, 1, tables, 5, on_option, a, &first_pos);
    if (rc) return rc;
    if (first_pos < argc) {
        fprintf(stderr, "moe-serve: unexpected argument \"%s\" (see moe-serve --help)\n", argv[first_pos]);
        return 2;
    }
    if (!a->eng.model) {
        fprintf(stderr, "moe-serve: no model given; use -m MODEL (see moe-serve --help)\n");
        return 2;
    }
    if (!a->srv.model_name) { /* the last path component, without a trailing slash */
        static char name[256];
        const char *m = a->eng.model;
        size_t n = strlen(m);
        while (n > 1 && m[n - 1] == '/') n--;
        size_t s = n;
        while (s > 0 && m[s - 1] != '/') s--;
        snprintf(name, sizeof name, "%.*s", (int)(n - s), m + s);
        a->srv.model_name = name;
    }
    return 0;
}

int main(int argc, char **argv) {
    struct args a;
    const int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    if (!a.verbose) moe_log_set_level(MOE_LOG_WARN);
    /* every thread started from here on leaves SIGINT / SIGTERM / SIGHUP to
     * main's sigwait; a write to a closed socket is an error, not a signal */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT), sigaddset(&sigs, SIGTERM), sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct moe_model *model = NULL;
    struct moe_session_params sp;
    int status = moe_engine_load("moe-serve", &a.eng, &model, &sp);
    struct moe_chat_template *chat = NULL;
    if (!status) {
        const enum moe_status st = moe_chat_template_load(a.eng.model, a.chat_template, &chat);
        if (st == MOE_ERR_NOT_FOUND && !a.chat_template)
            fprintf(stderr, "moe-serve: %s has no chat template: /v1/chat/completions answers 400 (give "
                            "--chat-template NAME|FILE); /v1/completions works\n", a.eng.model);
        else if (st != MOE_OK)
            fprintf(stderr, "moe-serve: cannot use the chat template %s (see the message above)\n",
                    a.chat_template ? a.chat_template : "of the model"), status = 1;
    }
    struct moe_sched *sched = NULL;
    struct moe_server *srv = NULL;
    if (!status) {
        struct moe_sched_params pp = {a.parallel, a.queue, &sp, a.sequential};
        if (moe_sched_create(model, &pp, &sched) != MOE_OK) {
            fprintf(stderr, "moe-serve: cannot create %d sequences of the model (see the message above)\n", a.parallel);
            status = 1;
        } else if (!moe_engine_repack("moe-serve", &a.eng, model, moe_sched_backend(sched))) {
            status = 1;
        }
    }
    if (!status) {
        a.srv.chat = chat;
        if (moe_server_start(sched, model, &a.srv, &srv) != MOE_OK) {
            fprintf(stderr, "moe-serve: cannot start the server (see the message above)\n");
            status = 1;
        }
    }
    if (!status) {
        struct moe_sched_stats st;
        moe_sched_get_stats(sched, &st);
        fprintf(stderr, "moe-serve: model %s as \"%s\": %d sequences of %d tokens, %s; queue %d%s%s\n", a.eng.model,
                a.srv.model_name, a.parallel, moe_sched_n_ctx(sched),
                st.batched ? "decoded in one batched step" : a.parallel > 1 ? "decoded one after another" : "one sequence", a.queue,
                chat ? "" : "; no chat template", a.srv.api_key ? "; API key required" : "");
        const char *h = a.srv.host ? a.srv.host : "127.0.0.1";
        const int v6 = strchr(h, ':') != NULL;
        printf("moe-serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", h, v6 ? "]" : "", moe_server_port(srv));
        fflush(stdout);
        int sig = 0;
        sigwait(&sigs, &sig);
        fprintf(stderr, "moe-serve: %s: stopping\n", strsignal(sig));
    }
    moe_server_stop(srv);
    moe_sched_free(sched);
    moe_chat_template_free(chat);
    moe_model_free(model);
    return status;
}

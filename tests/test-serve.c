/*
 * test-serve.c - moe-serve end to end, driven with curl (and raw sockets for
 * the clients curl cannot imitate), on the trained demo model:
 *
 *   basic: /health, /v1/models, /metrics; /v1/completions and
 *   /v1/chat/completions whole and streamed (SSE: every event JSON, the
 *   pieces joined equal the whole answer, [DONE] last, usage on request);
 *   greedy answers equal moe-run's greedy text for the same prompt and
 *   length; each of 4 concurrent requests equals its answer served alone;
 *   stop strings (string and array) cut the text; a seed repeats a sample;
 *   the OpenAI error object for malformed JSON, wrong types, bad values, an
 *   unknown model, a missing field, a prompt over the context (400), a body
 *   over --max-body (413), unknown paths (404) and methods (405), a full
 *   queue (429), a missing or wrong API key (401); a client that disconnects
 *   mid-stream or while waiting has its sequence freed at once; a client
 *   trickling its headers or body a byte a second is cut after
 *   --read-timeout while others are served; SIGTERM stops it with status 0.
 *
 *   load: 1,000 requests from 8 concurrent curl clients, every one answered
 *   200, and the server's resident memory after all of them within a stated
 *   tolerance of what it was after the first 100.
 *
 * argv: MODE (basic | load) MOE_SERVE MOE_RUN MODEL_DIR WORK_DIR
 */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moe-base.h"
#include "moe-mmap.h"

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}
#include "moe-test.h"

static const char *g_serve, *g_run, *g_model, *g_work;

struct server {
    pid_t pid;
    int port;
};

/* ---- the server process ------------------------------------------------- */

/* start: moe-serve on a free port with extra options; its port read from the
 * line it prints. 1 ok. */
static int start(struct server *s, const char *opts) {
    int pfd[2];
    if (pipe(pfd) != 0) return 0;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s -m %s --port 0 -t 2 --model-name tiny %s 2>>%s/server.log", g_serve, g_model,
             opts, g_work);
    s->pid = fork();
    if (s->pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[256];
    size_t n = 0;
    const double t0 = moe_now_s();
    while (n < sizeof line - 1 && moe_now_s() - t0 < 120) {
        struct pollfd pf = {pfd[0], POLLIN, 0};
        if (poll(&pf, 1, 500) <= 0) continue;
        if (read(pfd[0], line + n, 1) != 1) break;
        if (line[n++] == '\n') break;
    }
    line[n] = 0;
    close(pfd[0]);
    const char *colon = strrchr(line, ':');
    s->port = colon ? atoi(colon + 1) : 0;
    CHECK(s->port > 0, "moe-serve %s did not print its port (got \"%s\"; see %s/server.log)", opts, line, g_work);
    return s->port > 0;
}

/* stop: SIGTERM, then the exit status (-1 if it did not exit within 30 s). */
static int stop(struct server *s) {
    kill(s->pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 300; i++) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        sleep_s(0.1);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    return -1;
}

/* ---- requests ----------------------------------------------------------- */

static char *slurp(const char *path) {
    char *t = NULL;
    size_t n;
    if (moe_read_file(path, 1 << 26, &t, &n) != MOE_OK) return NULL;
    return t;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

/* http: one request with curl; returns the status code (0: no answer) and the
 * body in *resp (malloc'd, may be NULL). body NULL: no body; extra: more curl
 * arguments (shell words). */
static int http(const struct server *s, const char *method, const char *path, const char *body, const char *extra,
                char **resp) {
    char bodyf[1024], respf[1024], out[64];
    snprintf(bodyf, sizeof bodyf, "%s/req.json", g_work);
    snprintf(respf, sizeof respf, "%s/resp.out", g_work);
    unlink(respf);
    if (body) put(bodyf, body);
    moe_test_sh_out(out, sizeof out,
                    "curl -s -N -o %s -w '%%{http_code}' -X %s %s%s%s %s 'http://127.0.0.1:%d%s'", respf, method,
                    body ? "-H 'Content-Type: application/json' --data-binary @" : "", body ? bodyf : "",
                    "", extra ? extra : "", s->port, path);
    if (resp) *resp = slurp(respf);
    return atoi(out);
}

/* post: POST a JSON body to path; the parsed answer in *j (NULL if not JSON). */
static int post(const struct server *s, const char *path, const char *body, cJSON **j) {
    char *r = NULL;
    const int code = http(s, "POST", path, body, NULL, &r);
    *j = r ? cJSON_Parse(r) : NULL;
    free(r);
    return code;
}

static const char *jstr(const cJSON *o, const char *path) {
    /* a dotted path with numeric indices: "choices.0.message.content" */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *x = o;
    for (char *save = NULL, *p = strtok_r(buf, ".", &save); x && p; p = strtok_r(NULL, ".", &save))
        x = cJSON_IsArray(x) ? cJSON_GetArrayItem(x, atoi(p)) : cJSON_GetObjectItemCaseSensitive(x, p);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static double jnum(const cJSON *o, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *x = o;
    for (char *save = NULL, *p = strtok_r(buf, ".", &save); x && p; p = strtok_r(NULL, ".", &save))
        x = cJSON_IsArray(x) ? cJSON_GetArrayItem(x, atoi(p)) : cJSON_GetObjectItemCaseSensitive(x, p);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

/* metric: a value from /metrics ("name" or "name{labels}"); -1 when absent. */
static double metric(const struct server *s, const char *name) {
    char *r = NULL;
    http(s, "GET", "/metrics", NULL, NULL, &r);
    double v = -1;
    const size_t n = strlen(name);
    for (const char *p = r; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, name, n) == 0 && p[n] == ' ') {
            v = atof(p + n + 1);
            break;
        }
    free(r);
    return v;
}

/* wait_metric: poll until metric == want (up to timeout_s); the last value. */
static double wait_metric(const struct server *s, const char *name, double want, double timeout_s) {
    const double t0 = moe_now_s();
    double v;
    while ((v = metric(s, name)) != want && moe_now_s() - t0 < timeout_s) sleep_s(0.02);
    return v;
}

/* moe_run_text: moe-run's greedy continuation of prompt (its stdout less the
 * echoed prompt and the final newline); malloc'd. */
static char *moe_run_text(const char *prompt, int n, const char *extra) {
    char out[65536];
    const int rc = moe_test_sh_out(out, sizeof out, "%s -m %s -p '%s' -n %d -t 2 %s 2>/dev/null", g_run, g_model, prompt,
                                   n, extra ? extra : "");
    CHECK(rc == 0, "moe-run exited %d", rc);
    const size_t lp = strlen(prompt), lo = strlen(out);
    CHECK(lo > lp && strncmp(out, prompt, lp) == 0 && out[lo - 1] == '\n', "moe-run did not echo the prompt: %s", out);
    if (lo <= lp) return strdup("");
    out[lo - 1] = 0;
    return strdup(out + lp);
}

/* sse: an event stream's joined text, its finish reason, whether every event
 * was JSON and [DONE] came last, the role of the first chat chunk and usage. */
struct sse {
    struct moe_buf text;
    char finish[16], role[16];
    int events, ok, done_last, completion_tokens;
};

static void parse_sse(const char *r, int chat, struct sse *o) {
    memset(o, 0, sizeof *o);
    o->ok = 1, o->completion_tokens = -1;
    for (const char *p = r; p && *p;) {
        const char *end = strstr(p, "\n\n");
        if (!end) {
            o->ok = 0; /* an unterminated event */
            break;
        }
        const size_t n = (size_t)(end - p);
        o->events++;
        o->done_last = 0;
        if (n >= 6 && strncmp(p, "data: ", 6) == 0) {
            char *data = strndup(p + 6, n - 6);
            if (strcmp(data, "[DONE]") == 0) {
                o->done_last = 1;
            } else {
                cJSON *j = cJSON_Parse(data);
                if (!j) o->ok = 0;
                const char *t = jstr(j, chat ? "choices.0.delta.content" : "choices.0.text");
                if (t) moe_buf_append(&o->text, t, strlen(t));
                const char *f = jstr(j, "choices.0.finish_reason");
                if (f) snprintf(o->finish, sizeof o->finish, "%s", f);
                const char *role = jstr(j, "choices.0.delta.role");
                if (role && !o->role[0]) snprintf(o->role, sizeof o->role, "%s", role);
                if (jnum(j, "usage.completion_tokens") >= 0) o->completion_tokens = (int)jnum(j, "usage.completion_tokens");
                const char *obj = jstr(j, "object");
                if (!obj || strcmp(obj, chat ? "chat.completion.chunk" : "text_completion") != 0) o->ok = 0;
                cJSON_Delete(j);
            }
            free(data);
        } else if (!(n >= 1 && p[0] == ':')) { /* comments are allowed */
            o->ok = 0;
        }
        p = end + 2;
    }
}

/* check_error: an OpenAI error object with the status and param (NULL: any). */
static void check_error(const char *what, int code, int want, cJSON *j, const char *param) {
    CHECK(code == want, "%s: status %d, want %d", what, code, want);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    CHECK(cJSON_IsObject(e) && cJSON_IsString(cJSON_GetObjectItem(e, "message")) &&
              cJSON_IsString(cJSON_GetObjectItem(e, "type")) && cJSON_GetObjectItem(e, "param") &&
              cJSON_GetObjectItem(e, "code"),
          "%s: not an OpenAI error object", what);
    if (param) CHECK(jstr(j, "error.param") && !strcmp(jstr(j, "error.param"), param), "%s: param %s, want %s", what,
                     jstr(j, "error.param") ? jstr(j, "error.param") : "null", param);
    cJSON_Delete(j);
}

/* ---- the basic suite ---------------------------------------------------- */

static const char *const k_prompts[] = {"Once upon a time", "The little dog", "She went to the", "Tom and his friend"};
#define N_PROMPTS 4
#define N_GEN 24

static void endpoints(const struct server *s) {
    char *r = NULL;
    CHECK(http(s, "GET", "/health", NULL, NULL, &r) == 200 && r && strstr(r, "\"ok\""), "/health: %s", r ? r : "");
    free(r);
    cJSON *j = NULL;
    CHECK(http(s, "GET", "/v1/models", NULL, NULL, &r) == 200, "/v1/models");
    j = r ? cJSON_Parse(r) : NULL;
    CHECK(jstr(j, "data.0.id") && !strcmp(jstr(j, "data.0.id"), "tiny") && !strcmp(jstr(j, "object"), "list"),
          "/v1/models lists the model: %s", r ? r : "");
    cJSON_Delete(j);
    free(r);
    CHECK(http(s, "GET", "/metrics", NULL, NULL, &r) == 200, "/metrics");
    static const char *const names[] = {"moe_tokens_per_second ", "moe_queue_depth ", "moe_active_sequences ",
                                        "moe_expert_hit_ratio ", "moe_expert_bytes_read_per_token ",
                                        "moe_expert_stall_seconds_total ", "process_resident_memory_bytes ",
                                        "moe_requests_total{result=\"stop\"} "};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECK(r && strstr(r, names[i]), "/metrics has %s", names[i]);
    free(r);
}

/* completions: greedy answers against moe-run, streamed against whole; the
 * greedy texts are returned for the concurrency check. */
static void completions(const struct server *s, char *texts[N_PROMPTS]) {
    char body[512];
    for (int i = 0; i < N_PROMPTS; i++) {
        snprintf(body, sizeof body, "{\"model\":\"tiny\",\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}",
                 k_prompts[i], N_GEN);
        cJSON *j;
        CHECK(post(s, "/v1/completions", body, &j) == 200, "completion %d", i);
        const char *t = jstr(j, "choices.0.text"), *f = jstr(j, "choices.0.finish_reason");
        char *ref = moe_run_text(k_prompts[i], N_GEN, NULL);
        texts[i] = strdup(t ? t : "");
        CHECK(t && !strcmp(t, ref), "'%s': the server's greedy text \"%s\" != moe-run's \"%s\"", k_prompts[i],
              t ? t : "(none)", ref);
        CHECK(f && (!strcmp(f, "length") || !strcmp(f, "stop")) && jstr(j, "id") &&
                  !strcmp(jstr(j, "object"), "text_completion") && jnum(j, "created") > 1.6e9,
              "completion fields");
        const double pt = jnum(j, "usage.prompt_tokens"), ct = jnum(j, "usage.completion_tokens");
        CHECK(pt > 0 && ct > 0 && ct <= N_GEN && jnum(j, "usage.total_tokens") == pt + ct, "usage %g + %g", pt, ct);
        CHECK(!strcmp(f ? f : "", "stop") || ct == N_GEN, "finish_reason length after %g tokens", ct);
        free(ref);
        cJSON_Delete(j);
        /* the same request streamed */
        snprintf(body, sizeof body,
                 "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true}}", k_prompts[i], N_GEN);
        char *r = NULL;
        CHECK(http(s, "POST", "/v1/completions", body, NULL, &r) == 200, "streamed completion");
        struct sse e;
        parse_sse(r ? r : "", 0, &e);
        CHECK(e.ok && e.done_last && e.events >= 3, "stream %d: well-formed events (%d), [DONE] last", i, e.events);
        CHECK(!strcmp(e.text.data ? e.text.data : "", texts[i]), "stream %d: joined \"%s\" != whole \"%s\"", i,
              e.text.data ? e.text.data : "", texts[i]);
        CHECK(e.finish[0] && e.completion_tokens == (int)ct, "stream %d: finish %s, usage %d", i, e.finish,
              e.completion_tokens);
        moe_buf_free(&e.text);
        free(r);
    }
}

/* concurrent: the four prompts at once; each answer equals its answer alone. */
static void concurrent(const struct server *s, char *texts[N_PROMPTS]) {
    char cmd[8192] = "", part[2600], path[1024];
    for (int i = 0; i < N_PROMPTS; i++) {
        snprintf(path, sizeof path, "%s/c%d.json", g_work, i);
        char body[512];
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}", k_prompts[i], N_GEN);
        put(path, body);
        snprintf(part, sizeof part, "curl -s -o %s/c%d.out --data-binary @%s http://127.0.0.1:%d/v1/completions & ",
                 g_work, i, path, s->port);
        strcat(cmd, part);
    }
    strcat(cmd, "wait");
    const double steps0 = metric(s, "moe_decode_steps_total"), tok0 = metric(s, "moe_decode_step_tokens_total");
    moe_test_sh_out(NULL, 0, "%s", cmd);
    for (int i = 0; i < N_PROMPTS; i++) {
        snprintf(path, sizeof path, "%s/c%d.out", g_work, i);
        char *r = slurp(path);
        cJSON *j = r ? cJSON_Parse(r) : NULL;
        const char *t = jstr(j, "choices.0.text");
        CHECK(t && !strcmp(t, texts[i]), "concurrent '%s': \"%s\" != alone \"%s\"", k_prompts[i], t ? t : "(none)",
              texts[i]);
        cJSON_Delete(j);
        free(r);
    }
    const double steps = metric(s, "moe_decode_steps_total") - steps0;
    const double toks = metric(s, "moe_decode_step_tokens_total") - tok0;
    fprintf(stderr, "4 concurrent requests: %.0f decode steps ran %.0f tokens (%.2f a step)\n", steps, toks,
            steps > 0 ? toks / steps : 0);
}

static void stops_and_seed(const struct server *s, char *texts[N_PROMPTS]) {
    /* a stop string taken from the greedy answer: the text ends right before it */
    const char *t = texts[0];
    const size_t n = strlen(t);
    if (n < 8) {
        CHECK(0, "the greedy answer is too short for the stop test: \"%s\"", t);
        return;
    }
    char stop[8] = {0}, body[512];
    memcpy(stop, t + n / 2, 3);
    const char *first = strstr(t, stop);
    for (int form = 0; form < 2; form++) {
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stop\":%s\"%s\"%s}",
                 k_prompts[0], N_GEN, form ? "[\"zzzz\"," : "", stop, form ? "]" : "");
        cJSON *j;
        CHECK(post(s, "/v1/completions", body, &j) == 200, "stop request");
        const char *got = jstr(j, "choices.0.text"), *f = jstr(j, "choices.0.finish_reason");
        CHECK(got && strlen(got) == (size_t)(first - t) && !strncmp(got, t, strlen(got)) && f && !strcmp(f, "stop"),
              "stop \"%s\": \"%s\" (%s), want \"%.*s\"", stop, got ? got : "", f ? f : "", (int)(first - t), t);
        cJSON_Delete(j);
    }
    /* streamed with a stop string: the same cut, nothing of the stop string sent */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stop\":\"%s\",\"stream\":true}",
             k_prompts[0], N_GEN, stop);
    char *r = NULL;
    http(s, "POST", "/v1/completions", body, NULL, &r);
    struct sse e;
    parse_sse(r ? r : "", 0, &e);
    CHECK(e.ok && e.text.len == (size_t)(first - t) && !strcmp(e.finish, "stop"), "streamed stop: \"%s\"",
          e.text.data ? e.text.data : "");
    moe_buf_free(&e.text);
    free(r);
    /* a seed repeats a sample at temperature 1 */
    char *a = NULL, *b = NULL;
    for (int k = 0; k < 2; k++) {
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":16,\"temperature\":1.0,\"top_p\":0.9,\"seed\":7}",
                 k_prompts[1]);
        cJSON *j;
        post(s, "/v1/completions", body, &j);
        const char *x = jstr(j, "choices.0.text");
        *(k ? &b : &a) = strdup(x ? x : "(none)");
        cJSON_Delete(j);
    }
    CHECK(!strcmp(a, b), "seed 7 twice: \"%s\" != \"%s\"", a, b);
    free(a);
    free(b);
    /* ignore_eos: exactly max_tokens tokens, the greedy text continued past
     * any end-of-sequence token */
    for (int i = 0; i < N_PROMPTS; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true}",
                 k_prompts[i], N_GEN + 8);
        cJSON *j;
        CHECK(post(s, "/v1/completions", body, &j) == 200, "ignore_eos request");
        const char *x = jstr(j, "choices.0.text"), *f = jstr(j, "choices.0.finish_reason");
        CHECK(x && !strncmp(x, texts[i], strlen(texts[i])) && f && !strcmp(f, "length") &&
                  jnum(j, "usage.completion_tokens") == N_GEN + 8,
              "ignore_eos '%s': \"%s\" (%s, %g tokens) does not continue \"%s\" to %d tokens", k_prompts[i],
              x ? x : "(none)", f ? f : "", jnum(j, "usage.completion_tokens"), texts[i], N_GEN + 8);
        cJSON_Delete(j);
    }
}

static void chat(const struct server *s) {
    const char *user = "Tell me about the little dog";
    char body[512], rendered[512];
    snprintf(body, sizeof body,
             "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,"
             "\"temperature\":0}", user, N_GEN);
    cJSON *j;
    CHECK(post(s, "/v1/chat/completions", body, &j) == 200, "chat");
    const char *t = jstr(j, "choices.0.message.content"), *f = jstr(j, "choices.0.finish_reason");
    CHECK(t && jstr(j, "choices.0.message.role") && !strcmp(jstr(j, "choices.0.message.role"), "assistant") &&
              !strcmp(jstr(j, "object"), "chat.completion"),
          "chat answer fields");
    /* the ChatML rendering of one user message, run raw by moe-run (no BOS: the
     * template's text is the whole prompt): the server's answer is its start,
     * all of it unless the server stopped at an end-of-turn string */
    snprintf(rendered, sizeof rendered, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", user);
    char *ref = moe_run_text(rendered, N_GEN, "--no-special");
    CHECK(t && !strncmp(ref, t, strlen(t)) && (strlen(t) == strlen(ref) || (f && !strcmp(f, "stop"))),
          "chat greedy \"%s\" (%s) vs moe-run on the rendered prompt \"%s\"", t ? t : "", f ? f : "", ref);
    /* streamed: a role chunk first, the deltas join to the same content */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,\"temperature\":0,"
             "\"stream\":true}", user, N_GEN);
    char *r = NULL;
    CHECK(http(s, "POST", "/v1/chat/completions", body, NULL, &r) == 200, "streamed chat");
    struct sse e;
    parse_sse(r ? r : "", 1, &e);
    CHECK(e.ok && e.done_last && !strcmp(e.role, "assistant") && t &&
              !strcmp(e.text.data ? e.text.data : "", t) && f && !strcmp(e.finish, f),
          "streamed chat: \"%s\" (%s) vs \"%s\"", e.text.data ? e.text.data : "", e.finish, t ? t : "");
    moe_buf_free(&e.text);
    free(r);
    free(ref);
    cJSON_Delete(j);
}

static void bad_requests(const struct server *s) {
    cJSON *j;
    int code;
    code = post(s, "/v1/completions", "{\"prompt\": \"hi\", ", &j);
    check_error("malformed JSON", code, 400, j, NULL);
    code = post(s, "/v1/completions", "[1,2]", &j);
    check_error("not an object", code, 400, j, NULL);
    code = post(s, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":\"ten\"}", &j);
    check_error("max_tokens a string", code, 400, j, "max_tokens");
    code = post(s, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2.5}", &j);
    check_error("max_tokens not an integer", code, 400, j, "max_tokens");
    code = post(s, "/v1/completions", "{\"prompt\":\"hi\",\"temperature\":5}", &j);
    check_error("temperature 5", code, 400, j, "temperature");
    code = post(s, "/v1/completions", "{\"prompt\":\"hi\",\"stream\":\"yes\"}", &j);
    check_error("stream a string", code, 400, j, "stream");
    code = post(s, "/v1/completions", "{\"prompt\":\"hi\",\"stop\":[1]}", &j);
    check_error("stop not strings", code, 400, j, "stop");
    code = post(s, "/v1/completions", "{\"prompt\":\"hi\",\"ignore_eos\":1}", &j);
    check_error("ignore_eos a number", code, 400, j, "ignore_eos");
    code = post(s, "/v1/completions", "{\"prompt\":42}", &j);
    check_error("prompt a number", code, 400, j, "prompt");
    code = post(s, "/v1/completions", "{\"max_tokens\":4}", &j);
    check_error("no prompt", code, 400, j, "prompt");
    code = post(s, "/v1/chat/completions", "{\"messages\":\"hi\"}", &j);
    check_error("messages a string", code, 400, j, "messages");
    code = post(s, "/v1/chat/completions", "{\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}", &j);
    check_error("unknown role", code, 400, j, "messages.role");
    code = post(s, "/v1/completions", "{\"model\":\"gpt-4\",\"prompt\":\"hi\"}", &j);
    check_error("unknown model", code, 400, j, "model");
    /* a prompt longer than the context (the server runs --ctx 64) */
    struct moe_buf b = {0};
    moe_buf_printf(&b, "{\"prompt\":\"");
    for (int i = 0; i < 100; i++) moe_buf_printf(&b, "the dog ran ");
    moe_buf_printf(&b, "\"}");
    code = post(s, "/v1/completions", b.data, &j);
    check_error("prompt over the context", code, 400, j, NULL);
    code = post(s, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":200}", &j);
    check_error("prompt + max_tokens over the context", code, 400, j, "max_tokens");
    moe_buf_free(&b);
    /* a body over --max-body 4096 */
    moe_buf_printf(&b, "{\"prompt\":\"");
    for (int i = 0; i < 1000; i++) moe_buf_printf(&b, "xxxxxxxx");
    moe_buf_printf(&b, "\"}");
    code = post(s, "/v1/completions", b.data, &j);
    check_error("body over --max-body", code, 413, j, NULL);
    moe_buf_free(&b);
    char *r = NULL;
    code = http(s, "GET", "/v1/nothing", NULL, NULL, &r);
    check_error("unknown path", code, 404, r ? cJSON_Parse(r) : NULL, NULL);
    free(r), r = NULL;
    code = http(s, "GET", "/v1/completions", NULL, NULL, &r);
    check_error("GET on a POST path", code, 405, r ? cJSON_Parse(r) : NULL, NULL);
    free(r);
    /* the server still answers */
    code = post(s, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", &j);
    CHECK(code == 200, "a good request after the bad ones: %d", code);
    cJSON_Delete(j);
}

static void api_key(void) {
    struct server s;
    if (!start(&s, "--api-key sekret --ctx 128")) return;
    cJSON *j;
    char *r = NULL;
    int code = http(&s, "POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", NULL, &r);
    check_error("no API key", code, 401, r ? cJSON_Parse(r) : NULL, NULL);
    free(r), r = NULL;
    code = http(&s, "POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", "-H 'Authorization: Bearer wrong'",
                &r);
    check_error("wrong API key", code, 401, r ? cJSON_Parse(r) : NULL, NULL);
    free(r), r = NULL;
    code = http(&s, "GET", "/v1/models", NULL, "-H 'Authorization: Bearer sekre'", &r);
    check_error("a prefix of the key", code, 401, r ? cJSON_Parse(r) : NULL, NULL);
    free(r), r = NULL;
    code = http(&s, "POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", "-H 'Authorization: Bearer sekret'",
                &r);
    j = r ? cJSON_Parse(r) : NULL;
    CHECK(code == 200 && jstr(j, "choices.0.text"), "the right API key: %d", code);
    cJSON_Delete(j);
    free(r);
    CHECK(http(&s, "GET", "/health", NULL, NULL, NULL) == 200, "/health needs no key");
    CHECK(stop(&s) == 0, "exit status after SIGTERM");
}

/* long_request: a background curl of a long streamed generation that gives up
 * after `secs` (--max-time): it disconnects mid-stream. */
static void long_request(const struct server *s, double secs, int stream, const char *tag) {
    char body[256], path[1024];
    snprintf(path, sizeof path, "%s/long-%s.json", g_work, tag);
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":30000,\"temperature\":0,\"stream\":%s}",
             stream ? "true" : "false");
    put(path, body);
    moe_test_sh_out(NULL, 0, "curl -s -N --max-time %.1f -o /dev/null --data-binary @%s http://127.0.0.1:%d/v1/completions "
                             ">/dev/null 2>&1 &", secs, path, s->port);
}

/* disconnects and the queue: one sequence, a queue of one, a long context so
 * that a request runs for seconds. */
static void disconnects_and_queue(void) {
    struct server s;
    if (!start(&s, "--parallel 1 --queue 1 --ctx 32768")) return;
    for (int stream = 1; stream >= 0; stream--) {
        const double c0 = metric(&s, "moe_requests_total{result=\"cancelled\"}");
        long_request(&s, 1.0, stream, "a");
        CHECK(wait_metric(&s, "moe_active_sequences", 1, 10) == 1, "the long request runs");
        const double t0 = moe_now_s();
        const double active = wait_metric(&s, "moe_active_sequences", 0, 5);
        const double dt = moe_now_s() - t0;
        CHECK(active == 0 && dt < 2.0, "%s client gone: sequence freed after %.2f s (active %g)",
              stream ? "streaming" : "waiting", dt, active);
        CHECK(metric(&s, "moe_requests_total{result=\"cancelled\"}") == c0 + 1, "counted as cancelled");
        CHECK(metric(&s, "moe_generated_tokens_total") < 30000, "stopped long before max_tokens");
    }
    /* queue: one running, one waiting, the third refused with 429 */
    long_request(&s, 4.0, 1, "a");
    CHECK(wait_metric(&s, "moe_active_sequences", 1, 10) == 1, "first request runs");
    long_request(&s, 4.0, 1, "b");
    CHECK(wait_metric(&s, "moe_queue_depth", 1, 10) == 1, "second request waits");
    cJSON *j;
    const int code = post(&s, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", &j);
    check_error("queue full", code, 429, j, NULL);
    CHECK(wait_metric(&s, "moe_active_sequences", 0, 10) == 0 && metric(&s, "moe_queue_depth") == 0,
          "both freed when their clients leave");
    CHECK(post(&s, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", &j) == 200, "served again");
    cJSON_Delete(j);
    CHECK(stop(&s) == 0, "exit status after SIGTERM");
}

/* slow_client: connect and send `head` then `body` one byte a second; returns
 * the seconds until the server closed the connection (-1: it did not within
 * `limit`). Meanwhile another client is served. */
static double slow_client(const struct server *s, const char *head, const char *body, double limit, int *served) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET, a.sin_port = htons((uint16_t)s->port), a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) return -2;
    const double t0 = moe_now_s();
    const char *parts[2] = {head, body};
    *served = 0;
    for (int k = 0; k < 2; k++)
        for (const char *p = parts[k]; *p; p++) {
            if (send(fd, p, 1, MSG_NOSIGNAL) != 1) goto closed;
            struct pollfd pf = {fd, POLLIN, 0};
            if (poll(&pf, 1, 1000) > 0) {
                char b[256];
                if (recv(fd, b, sizeof b, 0) <= 0) goto closed;
            }
            if (!*served && moe_now_s() - t0 > 1.5) { /* another client is served meanwhile */
                cJSON *j;
                *served = post(s, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", &j) == 200;
                cJSON_Delete(j);
            }
            if (moe_now_s() - t0 > limit) {
                close(fd);
                return -1;
            }
        }
closed:
    close(fd);
    return moe_now_s() - t0;
}

static void slow_clients(void) {
    struct server s;
    if (!start(&s, "--read-timeout 3 --ctx 128")) return;
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: 60\r\n\r\n";
    char quick_head[256];
    snprintf(quick_head, sizeof quick_head, "%s", head);
    int served = 0;
    /* the headers a byte a second */
    const double t = slow_client(&s, "", "POST /v1/completions HTTP/1.1\r\nHost: x\r\n", 12, &served);
    CHECK(t > 0 && t < 6, "headers a byte a second: cut after %.1f s (want about 3)", t);
    CHECK(served, "another client was served meanwhile");
    /* the head in one piece, then the body a byte a second */
    {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET, a.sin_port = htons((uint16_t)s.port), a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect");
        send(fd, quick_head, strlen(quick_head), MSG_NOSIGNAL);
        const double t0 = moe_now_s();
        double cut = -1;
        for (int i = 0; i < 12 && cut < 0; i++) {
            if (send(fd, "x", 1, MSG_NOSIGNAL) != 1) cut = moe_now_s() - t0;
            struct pollfd pf = {fd, POLLIN, 0};
            if (cut < 0 && poll(&pf, 1, 1000) > 0) {
                char b[256];
                if (recv(fd, b, sizeof b, 0) <= 0) cut = moe_now_s() - t0;
            }
        }
        close(fd);
        CHECK(cut > 0 && cut < 6, "body a byte a second: cut after %.1f s (want about 3)", cut);
    }
    CHECK(metric(&s, "moe_slow_clients_cut_total") >= 2, "slow clients counted");
    CHECK(stop(&s) == 0, "exit status after SIGTERM");
}

static void basic(void) {
    struct server s;
    char chatml[1024];
    snprintf(chatml, sizeof chatml, "--chat-template %s/serve/chatml.jinja --parallel 4 --ctx 256", MOE_FIXTURES);
    if (!start(&s, chatml)) return;
    char *texts[N_PROMPTS] = {0};
    endpoints(&s);
    completions(&s, texts);
    concurrent(&s, texts);
    stops_and_seed(&s, texts);
    chat(&s);
    CHECK(stop(&s) == 0, "exit status after SIGTERM");
    /* the fallback of backends without per-sequence caches: one session per
     * sequence, stepped one after another; the same answers */
    snprintf(chatml, sizeof chatml, "--sequential --parallel 4 --ctx 256");
    if (start(&s, chatml)) {
        concurrent(&s, texts);
        CHECK(metric(&s, "moe_batched_decode") == 0, "--sequential is not batched");
        CHECK(stop(&s) == 0, "exit status after SIGTERM");
    }
    /* big-little decoding (MoBiLE) with several sequences (the session
     * decides each row on its own): the answers are moe-run's with the same
     * options, four at once */
    if (start(&s, "--little-k 1 --gamma 0.5 --parallel 4 --ctx 256")) {
        for (int i = 0; i < N_PROMPTS; i++) free(texts[i]), texts[i] = moe_run_text(k_prompts[i], N_GEN, "--little-k 1 --gamma 0.5");
        concurrent(&s, texts);
        const double bl = metric(&s, "moe_big_little_tokens_total"), fb = metric(&s, "moe_big_little_fallbacks_total");
        CHECK(bl > 0 && fb > 0 && fb < bl, "big-little decided %g tokens, %g fell back", bl, fb);
        CHECK(stop(&s) == 0, "exit status after SIGTERM");
    }
    for (int i = 0; i < N_PROMPTS; i++) free(texts[i]);
    if (!start(&s, "--ctx 64 --max-body 4096")) return;
    bad_requests(&s);
    CHECK(stop(&s) == 0, "exit status after SIGTERM");
    api_key();
    disconnects_and_queue();
    slow_clients();
}

/* ---- the load test ------------------------------------------------------ */

static long rss_kib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &v) == 1) break;
    if (f) fclose(f);
    return v;
}

/* load_round: n requests from 8 concurrent curl clients; how many got 200. */
static int load_round(const struct server *s, int n, int first) {
    char out[1 << 16], body[1024];
    snprintf(body, sizeof body, "%s/load.json", g_work);
    put(body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0.8,\"seed\":1}");
    moe_test_sh_out(out, sizeof out,
                    "seq %d %d | xargs -P8 -I{} curl -s -o /dev/null -w '%%{http_code}\\n' --max-time 60 "
                    "--data-binary @%s 'http://127.0.0.1:%d/v1/completions?n={}' | grep -c '^200$'",
                    first, first + n - 1, body, s->port);
    return atoi(out);
}

static void load(void) {
    struct server s;
    /* under AddressSanitizer freed blocks wait in a quarantine of up to 256 MiB,
     * which would read as growth: the server runs with none (no effect on other builds) */
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[1024];
    snprintf(opts, sizeof opts, "%s%squarantine_size_mb=0", asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    if (!start(&s, "--parallel 8 --queue 64 --ctx 128")) return;
    const double t0 = moe_now_s();
    const int ok1 = load_round(&s, 100, 1);
    const long rss1 = rss_kib(s.pid);
    const int ok2 = load_round(&s, 900, 101);
    const long rss2 = rss_kib(s.pid);
    const double dt = moe_now_s() - t0;
    fprintf(stderr, "load: %d + %d of 100 + 900 requests answered 200 in %.1f s (%.0f requests/s); RSS %ld KiB after "
                    "100, %ld KiB after 1000\n", ok1, ok2, dt, 1000 / dt, rss1, rss2);
    CHECK(ok1 == 100 && ok2 == 900, "every request answered 200 (%d + %d of 1000)", ok1, ok2);
    /* memory flat: at most 4 MiB or 5 % more after 900 more requests */
    const long tol = rss1 / 20 > 4096 ? rss1 / 20 : 4096;
    CHECK(rss1 > 0 && rss2 - rss1 <= tol, "RSS grew %ld KiB (tolerance %ld KiB)", rss2 - rss1, tol);
    CHECK(metric(&s, "moe_requests_total{result=\"error\"}") == 0, "no engine errors");
    CHECK(stop(&s) == 0, "exit status after SIGTERM");
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: test-serve basic|load MOE_SERVE MOE_RUN MODEL_DIR WORK_DIR\n");
        return 2;
    }
    g_serve = argv[2], g_run = argv[3], g_model = argv[4], g_work = argv[5];
    signal(SIGPIPE, SIG_IGN);
    if (system("curl --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "test-serve: curl is not installed (scripts/install-deps.sh installs it)\n");
        return 77;
    }
    mkdir(g_work, 0755);
    char log[1024];
    snprintf(log, sizeof log, "%s/server.log", g_work);
    unlink(log);
    if (!strcmp(argv[1], "load")) load();
    else basic();
    printf("test-serve %s: %d checks, %d failed\n", argv[1], checks, fails);
    return fails != 0;
}

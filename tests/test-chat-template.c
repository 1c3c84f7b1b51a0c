/*
 * test-chat-template.c - the chat-template interpreter (moe-chat.h) against
 * transformers' apply_chat_template.
 *
 * 1. Every case of tests/fixtures/chat/expected/<template>.json (written by
 *    tests/oracle/gen_chat_fixtures.py with transformers' own rendering) is
 *    rendered from tests/fixtures/chat/templates/<template> and compared byte
 *    for byte; a case the template refuses (raise_exception) must fail here
 *    too, with the template's message. features.json: small templates of the
 *    generator's own for the semantics (whitespace, scoping, filters, tests,
 *    methods, tojson), each with its source. argv[1] may name another
 *    directory of templates/ and expected/ (e.g. all of llama.cpp's).
 * 2. Constructs the interpreter does not run, and malformed or hostile
 *    templates (unterminated tags and strings, deep nesting, huge or endless
 *    loops, recursion), end in an error that names the construct and its
 *    line:col, never a crash or a hang.
 * 3. Loading: a checkpoint directory's tokenizer_config.json (string and
 *    named-list forms) and chat_template.jinja, a GGUF's
 *    tokenizer.chat_template, built-in names, an override file, the error
 *    for a model without a template; stops; renders from several threads at
 *    once give the same bytes. (Bundles: test-moe-run.)
 */
#include "moe-chat.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "moe-mmap.h"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" /* the writer has more than this test uses */
#include "moe-test-gguf.h"
#pragma GCC diagnostic pop
#include "moe-test-log.h"
#include "moe-test.h"

static const char *CHAT_DIR = MOE_FIXTURES "/chat"; /* argv[1] may name another (a dir with templates/ and expected/) */

static int n_cases, n_equal, n_refused;

/* first_diff: where two strings first differ (for the failure message). */
static size_t first_diff(const char *a, const char *b) {
    size_t i = 0;
    while (a[i] && a[i] == b[i]) i++;
    return i;
}

static void run_fixture(const char *json_path) {
    char *text = NULL, *tsrc = NULL;
    size_t len;
    if (moe_read_file(json_path, 16u << 20, &text, &len) != MOE_OK) {
        CHECK(0, "cannot read %s", json_path);
        return;
    }
    cJSON *doc = cJSON_Parse(text);
    free(text);
    CHECK(doc != NULL, "%s is not JSON", json_path);
    if (!doc) return;
    /* a template file for all cases, or (features.json) a source in each case */
    const cJSON *tfile = cJSON_GetObjectItem(doc, "template");
    const char *tname = cJSON_IsString(tfile) ? tfile->valuestring : "features";
    const cJSON *bos = cJSON_GetObjectItem(doc, "bos_token"), *eos = cJSON_GetObjectItem(doc, "eos_token");
    const int64_t now = (int64_t)cJSON_GetObjectItem(doc, "now")->valuedouble;
    char path[1024];
    struct moe_chat_template *t = NULL;
    enum moe_status st = MOE_OK;
    if (cJSON_IsString(tfile)) {
        snprintf(path, sizeof path, "%s/templates/%s", CHAT_DIR, tname);
        CHECK(moe_read_file(path, 16u << 20, &tsrc, &len) == MOE_OK, "cannot read %s", path);
        log_reset();
        st = tsrc ? moe_chat_template_parse(tsrc, cJSON_IsString(bos) ? bos->valuestring : NULL,
                                            cJSON_IsString(eos) ? eos->valuestring : NULL, &t)
                  : MOE_ERR_IO;
        CHECK(st == MOE_OK, "%s does not parse: %s", tname, g_err);
    }
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const cJSON *own = cJSON_GetObjectItem(c, "source");
        if (cJSON_IsString(own)) {
            moe_chat_template_free(t);
            t = NULL;
            log_reset();
            st = moe_chat_template_parse(own->valuestring, cJSON_IsString(bos) ? bos->valuestring : NULL,
                                         cJSON_IsString(eos) ? eos->valuestring : NULL, &t);
            CHECK(st == MOE_OK, "%s / %s does not parse: %s", tname, name, g_err);
        }
        if (!t) {
            if (cJSON_IsString(own)) continue;
            break;
        }
        char *msgs = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "messages"));
        const cJSON *extra = cJSON_GetObjectItem(c, "extra"), *exp = cJSON_GetObjectItem(c, "expected"),
                    *err = cJSON_GetObjectItem(c, "error");
        char *extra_s = extra ? cJSON_PrintUnformatted(extra) : NULL;
        char ebuf[1024] = "";
        struct moe_chat_render_params p = moe_chat_render_default_params();
        p.add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        p.now = now, p.extra_json = extra_s, p.err = ebuf, p.err_size = sizeof ebuf;
        char *out = NULL;
        st = moe_chat_render_json(t, msgs, &p, &out);
        n_cases++;
        if (exp) {
            const int same = st == MOE_OK && strcmp(out, exp->valuestring) == 0;
            n_equal += same;
            if (st != MOE_OK) CHECK(0, "%s / %s: render failed: %s", tname, name, ebuf);
            else if (!same) {
                size_t d = first_diff(out, exp->valuestring);
                CHECK(0, "%s / %s: differs at byte %zu:\n  got      \"%.60s\"\n  expected \"%.60s\"", tname, name, d,
                      out + (d > 20 ? d - 20 : 0), exp->valuestring + (d > 20 ? d - 20 : 0));
            }
        } else {
            /* refused by the template: an error here too, with the template's own message */
            const char *want = err->valuestring;
            const int is_raise = strncmp(want, "TypeError", 9) && strncmp(want, "ValueError", 10) && !strstr(want, "undefined");
            const int ok = st != MOE_OK && (!is_raise || strstr(ebuf, want));
            n_refused += ok;
            CHECK(ok, "%s / %s: expected the error \"%s\", got status %d \"%s\"", tname, name, want, (int)st, ebuf);
        }
        free(out);
        free(msgs);
        free(extra_s);
    }
    moe_chat_template_free(t);
    free(tsrc);
    cJSON_Delete(doc);
}

static void fixtures(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/expected", CHAT_DIR);
    struct dirent **names;
    int n = scandir(dir, &names, NULL, alphasort);
    CHECK(n > 2, "no fixtures in %s", dir);
    int files = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = names[i]->d_name;
        size_t l = strlen(nm);
        if (l > 5 && !strcmp(nm + l - 5, ".json")) {
            char path[1400];
            snprintf(path, sizeof path, "%s/%s", dir, nm);
            run_fixture(path);
            files++;
        }
        free(names[i]);
    }
    if (n > 0) free(names);
    printf("chat templates: %d templates, %d cases: %d byte-equal to transformers, %d refused as transformers refuses\n",
           files, n_cases, n_equal, n_refused);
    CHECK(files >= 13, "expected the fixtures of at least 12 templates and the features, found %d files", files);
}

/* ---- errors: named constructs, malformed and hostile templates ---------- */

/* render_src: parse and render `src` for one user message; the status, with
 * the message (parse errors from the log, render errors from the buffer). */
static enum moe_status render_src(const char *src, char *msg, size_t msg_size, char **out) {
    struct moe_chat_template *t = NULL;
    log_reset();
    msg[0] = 0;
    *out = NULL;
    enum moe_status st = moe_chat_template_parse(src, "<s>", "</s>", &t);
    if (st) {
        snprintf(msg, msg_size, "%s", g_err);
        return st;
    }
    struct moe_chat_render_params p = moe_chat_render_default_params();
    p.err = msg, p.err_size = msg_size, p.add_generation_prompt = 1;
    st = moe_chat_render_json(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", &p, out);
    moe_chat_template_free(t);
    return st;
}

static char *repeat(const char *s, int n, const char *tail) {
    size_t l = strlen(s), tl = strlen(tail);
    char *b = malloc(l * (size_t)n + tl + 1);
    for (int i = 0; i < n; i++) memcpy(b + l * (size_t)i, s, l);
    memcpy(b + l * (size_t)n, tail, tl + 1);
    return b;
}

static void errors(void) {
    static const struct {
        const char *src;
        enum moe_status st;
        const char *msg; /* a substring of the message */
    } rows[] = {
        /* constructs the interpreter does not run: named, with line:col */
        {"hello\n  {% include 'other.jinja' %}", MOE_ERR_UNSUPPORTED, "line 2:6: unsupported tag 'include'"},
        {"{% extends 'base' %}", MOE_ERR_UNSUPPORTED, "unsupported tag 'extends'"},
        {"{% call m() %}x{% endcall %}", MOE_ERR_UNSUPPORTED, "unsupported tag 'call'"},
        {"{{ messages | nosuchfilter }}", MOE_ERR_UNSUPPORTED, "line 1:15: unknown filter 'nosuchfilter'"},
        {"{% if messages is nosuchtest %}{% endif %}", MOE_ERR_UNSUPPORTED, "unknown test 'nosuchtest'"},
        {"{{ 'some text' | wordwrap(5) }}", MOE_ERR_UNSUPPORTED, "unsupported filter 'wordwrap'"},
        {"{{ 'abc'.zfill(5) }}", MOE_ERR_UNSUPPORTED, "line 1:9: unsupported method: str.zfill"},
        {"{% for m in messages recursive %}{% endfor %}", MOE_ERR_UNSUPPORTED, "recursive for loops"},
        {"{% frobnicate %}", MOE_ERR_FORMAT, "unknown tag 'frobnicate'"},
        /* malformed */
        {"{% for m in messages %}{{ m }}", MOE_ERR_FORMAT, "line 1:4: unterminated 'for' block"},
        {"{% if x %}a{% else %}b", MOE_ERR_FORMAT, "unterminated 'if' block"},
        {"{{ messages ", MOE_ERR_FORMAT, "unterminated '{{' expression"},
        {"{% if x ", MOE_ERR_FORMAT, "unterminated '{%' tag"},
        {"{{ 'abc }}", MOE_ERR_FORMAT, "unterminated string literal"},
        {"{# a comment", MOE_ERR_FORMAT, "unterminated comment"},
        {"{% raw %}abc", MOE_ERR_FORMAT, "unterminated raw block"},
        {"{% endif %}", MOE_ERR_FORMAT, "unexpected 'endif'"},
        {"{% if %}{% endif %}", MOE_ERR_FORMAT, "expected an expression"},
        {"{{ (1, 2 }}", MOE_ERR_FORMAT, "line 1:10: unexpected '}', expected ')'"},
        {"{{ [1, 2) }}", MOE_ERR_FORMAT, "unexpected ')', expected ']'"},
        {"{{ a.1.2.b( }}", MOE_ERR_FORMAT, ""},
        {"{{ '\\x4' }}", MOE_ERR_FORMAT, "truncated \\x escape"},
        {"{{ 99999999999999999999 }}", MOE_ERR_RANGE, "too large"},
        {"{% set = 1 %}", MOE_ERR_FORMAT, "can't assign"},
        {"{% break %}", MOE_ERR_FORMAT, "'break' outside a for loop"},
        /* raise_exception: the template's own message */
        {"{{ raise_exception('Conversation roles must alternate user/assistant') }}", MOE_ERR_INVALID,
         "line 1:4: raise_exception: Conversation roles must alternate user/assistant"},
        /* type errors and undefined values, as Jinja reports them */
        {"{{ nosuch.attr }}", MOE_ERR_INVALID, "'nosuch' is undefined"},
        {"{{ messages[0].nokey.x }}", MOE_ERR_INVALID, "'dict object' has no attribute 'nokey'"},
        {"{{ 'a' + 1 }}", MOE_ERR_INVALID, "can only concatenate str (not \"int\") to str"},
        {"{{ 1 // 0 }}", MOE_ERR_INVALID, "division by zero"},
        {"{{ messages | tojson | length + none }}", MOE_ERR_INVALID, "unsupported operand"},
        {"{{ messages.append(1) }}", MOE_ERR_INVALID, "access to attribute 'append' of 'list' object is unsafe"},
        {"{% set ns = namespace(_x=1) %}", MOE_ERR_INVALID, "underscore-prefixed"},
        /* hostile: bounded, never a crash or a hang */
        {"{{ range(1000000000) | length }}", MOE_ERR_RANGE, "range too big"},
        {"{% set r = range(20000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}", MOE_ERR_RANGE,
         "more than 50000000 steps"},
        {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", MOE_ERR_RANGE,
         "more than 256 MiB of memory"},
        {"{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", MOE_ERR_RANGE, "the output is over 64 MiB"},
        {"{{ 'x' * 1000000000000 }}", MOE_ERR_RANGE, "over 64 MiB"},
        {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", MOE_ERR_RANGE, "nested more than 256 deep"},
        {"{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
         MOE_ERR_RANGE, "more than 256 MiB of memory"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char msg[1024], *out;
        const double t0 = (double)clock() / CLOCKS_PER_SEC;
        enum moe_status st = render_src(rows[i].src, msg, sizeof msg, &out);
        const double dt = (double)clock() / CLOCKS_PER_SEC - t0;
        CHECK(st == rows[i].st, "row %zu \"%s\": status %d, expected %d (%s)", i, rows[i].src, (int)st, (int)rows[i].st, msg);
        CHECK(strstr(msg, rows[i].msg) != NULL, "row %zu \"%s\": message \"%s\" lacks \"%s\"", i, rows[i].src, msg, rows[i].msg);
        CHECK(dt < 60, "row %zu took %.1f s of CPU", i, dt);
        free(out);
    }
    /* nesting past the limit: blocks, brackets, unary operators, filters */
    const struct {
        const char *unit, *tail;
    } deep[] = {{"{% if true %}", ""}, {"{{ (", ""}, {"{{ [", ""}, {"{{ {", ""}, {"{{ -", ""}, {"{{ not ", ""},
                {"{% for x in y %}", ""}, {"{% macro m() %}", ""}, {"{{ x | default(", ""}};
    for (size_t i = 0; i < sizeof deep / sizeof deep[0]; i++) {
        char *src = repeat(deep[i].unit + (deep[i].unit[1] == '{' ? 3 : 0), 100000, deep[i].tail), msg[1024], *out;
        if (deep[i].unit[1] == '{') memcpy(src, "{{ ", 3); /* one opening tag, then the repeated operator */
        enum moe_status st = render_src(src, msg, sizeof msg, &out);
        CHECK(st != MOE_OK, "100000 x \"%s\" was accepted", deep[i].unit);
        free(out);
        free(src);
    }
    char *src = repeat("{% if true %}", 300, ""), msg[1024], *out;
    CHECK(render_src(src, msg, sizeof msg, &out) == MOE_ERR_RANGE && strstr(msg, "nested more than 256 deep"),
          "300 nested ifs: %s", msg);
    free(src);
    src = repeat("{{ -", 300, "1 }}");
    CHECK(render_src(src, msg, sizeof msg, &out) == MOE_ERR_RANGE, "300 unary minus: %s", msg);
    free(src);
    /* a template over the size limit */
    src = repeat("x", 5 << 20, "");
    CHECK(render_src(src, msg, sizeof msg, &out) == MOE_ERR_RANGE && strstr(msg, "over the limit"), "5 MiB template: %s", msg);
    free(src);
    /* malformed messages and extra variables */
    struct moe_chat_template *t = NULL;
    CHECK(moe_chat_template_load(NULL, "chatml", &t) == MOE_OK, "chatml does not load");
    static const char *const bad_msgs[] = {"", "{", "[1, 2]", "{\"role\": \"user\"}", "[{\"role\": \"user\", \"content\": \"x\"",
                                           "[{\"role\": \"user\", \"content\": \"\\u12\"}]", "[] trailing"};
    for (size_t i = 0; t && i < sizeof bad_msgs / sizeof bad_msgs[0]; i++) {
        struct moe_chat_render_params p = moe_chat_render_default_params();
        p.err = msg, p.err_size = sizeof msg;
        out = NULL;
        CHECK(moe_chat_render_json(t, bad_msgs[i], &p, &out) == MOE_ERR_FORMAT && msg[0], "messages \"%s\" accepted", bad_msgs[i]);
        free(out);
    }
    if (t) {
        struct moe_chat_render_params p = moe_chat_render_default_params();
        p.err = msg, p.err_size = sizeof msg, p.extra_json = "[1]";
        out = NULL;
        CHECK(moe_chat_render_json(t, "[]", &p, &out) == MOE_ERR_FORMAT, "extra variables that are not an object accepted");
        free(out);
    }
    moe_chat_template_free(t);
}

/* truncations: every prefix of every fixture template parses or fails
 * cleanly, and what parses renders or fails cleanly (ASan watches). */
static void truncations(void) {
    static const char *const names[] = {"gpt-oss.jinja", "qwen3.jinja", "deepseek-v3.1.jinja", "mistral-nemo-instruct-2407.jinja"};
    int parsed = 0, tried = 0;
    moe_log_set_level(MOE_LOG_ERROR + 1); /* quiet */
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char path[1024], *src = NULL;
        size_t len;
        snprintf(path, sizeof path, "%s/templates/%s", CHAT_DIR, names[k]);
        if (moe_read_file(path, 1 << 20, &src, &len) != MOE_OK) continue;
        for (size_t cut = 0; cut < len; cut += 1 + len / 400) {
            char keep = src[cut], msg[512], *out;
            src[cut] = 0;
            enum moe_status st = render_src(src, msg, sizeof msg, &out);
            parsed += st == MOE_OK;
            tried++;
            CHECK(st == MOE_OK || msg[0] || g_err[0] || st == MOE_ERR_FORMAT, "prefix %zu of %s failed without a message", cut, names[k]);
            free(out);
            src[cut] = keep;
        }
        free(src);
    }
    moe_log_set_level(MOE_LOG_INFO);
    CHECK(tried > 1000, "only %d prefixes tried", tried);
    printf("truncated templates: %d prefixes, %d rendered, the rest refused with a message\n", tried, parsed);
}

/* ---- loading ------------------------------------------------------------ */

static void write_file(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (f) fputs(text, f), fclose(f);
}

static char *load_render(const char *model, const char *override, enum moe_status *st) {
    struct moe_chat_template *t = NULL;
    char *out = NULL;
    log_reset();
    *st = moe_chat_template_load(model, override, &t);
    if (*st == MOE_OK) {
        struct moe_chat_message m[2] = {{"system", "S"}, {"user", "U"}};
        *st = moe_chat_render(t, m, 2, 1, &out);
    }
    moe_chat_template_free(t);
    return out;
}

static void loading(void) {
    char dir[] = "/tmp/moe-chat-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    enum moe_status st;
    char *out = load_render(dir, NULL, &st);
    CHECK(st == MOE_ERR_NOT_FOUND && strstr(g_err, "--chat-template"), "no template: status %d, \"%s\"", (int)st, g_err);
    free(out);
    /* a string chat_template; special tokens as strings or {"content": ...} */
    write_file(dir, "tokenizer_config.json",
               "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\", \"chat_template\": "
               "\"{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{{ eos_token }}\"}");
    out = load_render(dir, NULL, &st);
    CHECK(st == MOE_OK && out && !strcmp(out, "<s>[system:S][user:U]</s>"), "tokenizer_config.json: %s", out ? out : g_err);
    free(out);
    /* a list of named templates: "default" */
    write_file(dir, "tokenizer_config.json",
               "{\"eos_token\": null, \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
               "{\"name\": \"default\", \"template\": \"D{{ eos_token is defined }}\"}]}");
    out = load_render(dir, NULL, &st);
    CHECK(st == MOE_OK && out && !strcmp(out, "DFalse"), "named templates: %s", out ? out : g_err);
    free(out);
    /* chat_template.jinja wins over tokenizer_config.json */
    write_file(dir, "chat_template.jinja", "J{{ messages | length }}\n");
    out = load_render(dir, NULL, &st);
    CHECK(st == MOE_OK && out && !strcmp(out, "J2"), "chat_template.jinja: %s", out ? out : g_err);
    free(out);
    /* an override: a built-in name, a file, a JSON config file, a missing name */
    out = load_render(dir, "chatml", &st);
    CHECK(st == MOE_OK && out && !strcmp(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"),
          "chatml: %s", out ? out : g_err);
    free(out);
    char path[1100];
    snprintf(path, sizeof path, "%s/mine.jinja", dir);
    write_file(dir, "mine.jinja", "M{{ bos_token }}");
    out = load_render(dir, path, &st);
    CHECK(st == MOE_OK && out && !strcmp(out, "M"), "override file (bos null in the model): %s", out ? out : g_err);
    free(out);
    snprintf(path, sizeof path, "%s/cfg.json", dir);
    write_file(dir, "cfg.json", "{\"chat_template\": \"C{{ messages[1].content }}\"}");
    out = load_render(NULL, path, &st);
    CHECK(st == MOE_OK && out && !strcmp(out, "CU"), "override JSON file: %s", out ? out : g_err);
    free(out);
    out = load_render(dir, "no-such-template-or-file", &st);
    CHECK(st == MOE_ERR_NOT_FOUND && strstr(g_err, "chatml"), "a missing override: %d \"%s\"", (int)st, g_err);
    free(out);
    write_file(dir, "chat_template.jinja", "{% for %}");
    out = load_render(dir, NULL, &st);
    CHECK(st == MOE_ERR_FORMAT && strstr(g_err, "chat_template.jinja"), "a malformed model template names its file: \"%s\"", g_err);
    free(out);
    /* a GGUF: tokenizer.chat_template, BOS / EOS strings from the token ids */
    struct tg g;
    tg_begin(&g, 3);
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "hello"};
    tg_kv_str(&g, "general.architecture", "llama");
    tg_kv_str(&g, "tokenizer.chat_template", "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}");
    tg_kv_strs(&g, "tokenizer.ggml.tokens", toks, 4);
    tg_kv_u32(&g, "tokenizer.ggml.bos_token_id", 1);
    tg_kv_u32(&g, "tokenizer.ggml.eos_token_id", 2);
    const size_t glen = tg_finish(&g);
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    FILE *gf = fopen(path, "wb");
    CHECK(gf && fwrite(g.p, 1, glen, gf) == glen, "write %s", path);
    if (gf) fclose(gf);
    free(g.p);
    out = load_render(path, NULL, &st);
    CHECK(st == MOE_OK && out && !strcmp(out, "<s>SU</s>"), "GGUF tokenizer.chat_template: %s", out ? out : g_err);
    free(out);
    /* every built-in parses and renders a conversation */
    for (const char *const *b = moe_chat_builtin_names(); *b; b++) {
        out = load_render(NULL, *b, &st);
        CHECK(st == MOE_OK && out && strstr(out, "U"), "built-in %s: %s", *b, out ? out : g_err);
        free(out);
    }
    moe_test_sh("rm -rf %s", dir);
}

static void stops(void) {
    static const struct {
        const char *tmpl, *eos, *has, *lacks;
    } rows[] = {{"qwen3.jinja", "<|im_end|>", "<|im_end|>", "<|end|>"},
                {"phi-3.5-instruct.jinja", "<|endoftext|>", "<|end|>", "<|im_end|>"},
                {"gpt-oss.jinja", "<|return|>", "<|call|>", "<|end|>"},
                {"mistral-v1.jinja", "</s>", "</s>", "<|im_end|>"},
                {"deepseek-v3.1.jinja", "<｜end▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|end|>"}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char path[1024], *src = NULL;
        size_t len;
        snprintf(path, sizeof path, "%s/templates/%s", CHAT_DIR, rows[i].tmpl);
        struct moe_chat_template *t = NULL;
        if (moe_read_file(path, 1 << 20, &src, &len) || moe_chat_template_parse(src, NULL, rows[i].eos, &t)) {
            CHECK(0, "cannot load %s", rows[i].tmpl);
            free(src);
            continue;
        }
        int has = 0, lacks = 1, eos = 0;
        for (const char *const *s = moe_chat_template_stops(t); *s; s++) {
            has |= !strcmp(*s, rows[i].has);
            lacks &= strcmp(*s, rows[i].lacks) != 0;
            eos |= !strcmp(*s, rows[i].eos);
        }
        CHECK(has && lacks && eos, "%s: stops should hold %s and %s, not %s", rows[i].tmpl, rows[i].eos, rows[i].has, rows[i].lacks);
        moe_chat_template_free(t);
        free(src);
    }
}

/* threads: one parsed template rendered from 4 threads gives the same bytes. */
struct thr {
    const struct moe_chat_template *t;
    const char *expect;
    int bad;
};
static void *thr_main(void *arg) {
    struct thr *x = arg;
    for (int i = 0; i < 40; i++) {
        struct moe_chat_render_params p = moe_chat_render_default_params();
        p.now = 1741964966, p.add_generation_prompt = 1, p.extra_json = "{\"reasoning_effort\": \"low\"}";
        char *out = NULL;
        if (moe_chat_render_json(x->t, "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"}]", &p, &out) ||
            strcmp(out, x->expect))
            x->bad++;
        free(out);
    }
    return NULL;
}

static void threads(void) {
    char path[1024], *src = NULL, *expect = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/templates/gpt-oss.jinja", CHAT_DIR);
    struct moe_chat_template *t = NULL;
    if (moe_read_file(path, 1 << 20, &src, &len) || moe_chat_template_parse(src, "<|startoftext|>", "<|return|>", &t)) {
        CHECK(0, "cannot load gpt-oss.jinja");
        free(src);
        return;
    }
    struct moe_chat_render_params p = moe_chat_render_default_params();
    p.now = 1741964966, p.add_generation_prompt = 1, p.extra_json = "{\"reasoning_effort\": \"low\"}";
    CHECK(moe_chat_render_json(t, "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"}]", &p, &expect) == MOE_OK &&
              strstr(expect, "Reasoning: low") && strstr(expect, "Current date: 2025-03-14"),
          "gpt-oss render: %s", expect ? expect : "(none)");
    struct thr x[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) x[i] = (struct thr){t, expect ? expect : "", 0}, pthread_create(&th[i], NULL, thr_main, &x[i]);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(x[i].bad == 0, "thread %d: %d renders differed", i, x[i].bad);
    }
    free(expect);
    moe_chat_template_free(t);
    free(src);
}

int main(int argc, char **argv) {
    if (argc > 1) CHAT_DIR = argv[1];
    setenv("TZ", "UTC", 1);
    tzset();
    moe_log_set(capture, NULL);
    fixtures();
    if (argc <= 1) {
        errors();
        truncations();
        loading();
        stops();
        threads();
    }
    printf("test-chat-template: %d checks, %d failures\n", checks, fails);
    return fails != 0;
}

/*
 * test-moe-run.c - the moe-run CLI end to end: --tokens / --ids / --logits-out
 * reproduce transformers' logits and greedy tokens on the fixture models;
 * --tokenize prints ids; usage errors exit 2, failures exit 1, --help exits 0;
 * --device names a registered backend in moe-run and in every moe-prep command
 * that runs a model (an unknown one exits 2, one this build lacks exits 2 and
 * says how to build it, one without a device exits 1 naming --device cpu).
 * --chat / -cnv keeps the KV cache across turns read from a pipe and
 * --render-chat prints transformers' bytes (chat()).
 * argv[1] is the moe-run binary, argv[2] (optional) moe-prep.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe-mmap.h"
#include "moe-test.h"

static const char *moe_run;

/* run: execute a shell command, capture stdout into out (NUL-terminated); returns exit code. */
static int run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void check_fixture(const char *name) {
    char dir[1024], path[1100], *text = NULL;
    size_t len;
    snprintf(dir, sizeof dir, "%s/models/%s", MOE_FIXTURES, name);
    snprintf(path, sizeof path, "%s/oracle/oracle.json", dir);
    if (moe_read_file(path, 1 << 20, &text, &len) != MOE_OK) {
        CHECK(0, "%s: no oracle", name);
        return;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    int V = cJSON_GetObjectItem(j, "vocab_size")->valueint;
    const cJSON *prompt = cJSON_GetObjectItem(j, "prompt_ids"), *greedy = cJSON_GetObjectItem(j, "greedy_ids");
    int n_prompt = cJSON_GetArraySize(prompt), n_gen = cJSON_GetArraySize(greedy);
    char tokens[16384] = "", expect_ids[16384] = "";
    const cJSON *e;
    cJSON_ArrayForEach(e, prompt) snprintf(tokens + strlen(tokens), sizeof tokens - strlen(tokens), "%s%d",
                                           tokens[0] ? "," : "", e->valueint);
    cJSON_ArrayForEach(e, greedy) snprintf(expect_ids + strlen(expect_ids), sizeof expect_ids - strlen(expect_ids),
                                           "%s%d", expect_ids[0] ? "," : "", e->valueint);
    char logits_path[] = "/tmp/moe-test-logits-XXXXXX";
    int fd = mkstemp(logits_path);
    close(fd);
    char cmd[40000], out[65536];
    snprintf(cmd, sizeof cmd, "%s -m %s --tokens %s -n %d --ignore-eos --ids --logits-out %s -t 2", moe_run,
             dir, tokens, n_gen, logits_path);
    int rc = run(cmd, out, sizeof out);
    CHECK(rc == 0, "%s: moe-run exited %d", name, rc);
    char *nl = strchr(out, '\n');
    if (nl) *nl = 0;
    CHECK(!strcmp(out, expect_ids), "%s: greedy ids\n  got    %s\n  expect %s", name, out, expect_ids);

    /* logits file = prefill rows then decode rows */
    char *got = NULL, *pre = NULL, *dec = NULL;
    size_t lg = 0, lp = 0, ld = 0;
    snprintf(path, sizeof path, "%s/oracle/prefill_logits.f32", dir);
    moe_read_file(path, 1u << 30, &pre, &lp);
    snprintf(path, sizeof path, "%s/oracle/decode_logits.f32", dir);
    moe_read_file(path, 1u << 30, &dec, &ld);
    moe_read_file(logits_path, 1u << 30, &got, &lg);
    size_t rows = (size_t)n_prompt + (size_t)n_gen - 1;
    CHECK(lg == rows * (size_t)V * 4, "%s: logits file has %zu bytes, expected %zu", name, lg, rows * V * 4);
    if (got && pre && dec && lg == lp + ld) {
        float mx = 0;
        for (size_t i = 0; i < lg / 4; i++) {
            float a, b;
            memcpy(&a, got + 4 * i, 4);
            memcpy(&b, i < lp / 4 ? pre + 4 * i : dec + 4 * i - lp, 4);
            if (!(fabsf(a - b) <= mx)) mx = fabsf(a - b);
        }
        CHECK(mx <= 1e-4f, "%s: --logits-out max abs error %g", name, mx);
        printf("  %-16s greedy ids identical: %s, logits max abs error %.2e\n", name,
               strcmp(out, expect_ids) ? "no" : "yes", mx);
    }
    free(got);
    free(pre);
    free(dec);
    unlink(logits_path);

    /* text in: the tokenizer reproduces the oracle's prompt ids, and generating
     * from the text gives transformers' greedy tokens */
    const cJSON *ptext = cJSON_GetObjectItem(j, "prompt_text");
    if (cJSON_IsString(ptext)) {
        snprintf(cmd, sizeof cmd, "%s -m %s --tokenize -p '%s'", moe_run, dir, ptext->valuestring);
        CHECK(run(cmd, out, sizeof out) == 0, "%s: --tokenize", name);
        if ((nl = strchr(out, '\n'))) *nl = 0;
        CHECK(!strcmp(out, tokens), "%s: --tokenize ids\n  got    %s\n  expect %s", name, out, tokens);
        snprintf(cmd, sizeof cmd, "%s -m %s -p '%s' -n %d --ignore-eos --ids 2>/dev/null", moe_run, dir,
                 ptext->valuestring, n_gen);
        CHECK(run(cmd, out, sizeof out) == 0, "%s: text prompt", name);
        if ((nl = strchr(out, '\n'))) *nl = 0;
        CHECK(!strcmp(out, expect_ids), "%s: greedy ids from text prompt differ", name);
        /* and as text: exit 0 and the echoed prompt comes first */
        snprintf(cmd, sizeof cmd, "%s -m %s -p '%s' -n 4 2>/dev/null", moe_run, dir, ptext->valuestring);
        CHECK(run(cmd, out, sizeof out) == 0 && !strncmp(out, ptext->valuestring, strlen(ptext->valuestring)),
              "%s: text generation echoes the prompt: %s", name, out);
    }
    cJSON_Delete(j);
}

/* devices: --device through the registry, in moe-run and moe-prep's model commands. */
static void devices(const char *prep) {
    char cmd[4096], out[65536];
    const char *m = MOE_FIXTURES "/models/mixtral-f32";
    snprintf(cmd, sizeof cmd, "%s -m %s --tokens 1,2 -n 1 --device tpu 2>&1", moe_run, m);
    CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "unknown backend") && strstr(out, "cpu"),
          "an unknown device exits 2 and lists the backends: %s", out);
    snprintf(cmd, sizeof cmd, "%s -m %s --tokens 1,2 -n 1 --device cuda:1x 2>&1", moe_run, m);
    CHECK(run(cmd, out, sizeof out) == 2, "a bad device index exits 2: %s", out);
    snprintf(cmd, sizeof cmd, "%s -m %s --tokens 1,2 -n 1 --device cuda 2>&1", moe_run, m);
    const int rc = run(cmd, out, sizeof out);
    CHECK((rc == 2 && strstr(out, "MOE_CUDA=ON")) || (rc == 1 && strstr(out, "--device cpu")) || rc == 0,
          "--device cuda: not built (2), no device (1) or a GPU (0): rc %d %s", rc, out);
    char json[1200];
    snprintf(json, sizeof json, "/tmp/test-moe-run-stats.%d.json", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s -m %s --tokens 1,2 -n 2 --device auto --stats-json %s 2>&1", moe_run, m, json);
    CHECK(run(cmd, out, sizeof out) == 0, "--device auto runs: %s", out);
    char *text = NULL;
    size_t len = 0;
    cJSON *j = moe_read_file(json, 1 << 20, &text, &len) == MOE_OK ? cJSON_ParseWithLength(text, len) : NULL;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "backend");
    CHECK(cJSON_IsString(b) && (!strcmp(b->valuestring, "cpu") || !strcmp(b->valuestring, "cuda")),
          "--stats-json names the backend");
    cJSON_Delete(j);
    free(text);
    remove(json);
    if (!prep) return;
    static const char *const cmds[] = {"eval %s --dataset x.txt", "profile %s --dataset x.txt -o x.h5",
                                       "sensitivity %s --dataset x.txt -o x.h5", "bitwidth %s --sensitivity s.h5 "
                                       "--dataset x.txt --max-loss 2%%", "plan %s --profile p.h5 --mem 1G",
                                       "hw %s"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char sub[512];
        snprintf(sub, sizeof sub, cmds[i], m);
        snprintf(cmd, sizeof cmd, "%s %s --device tpu 2>&1", prep, sub);
        CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "--device tpu"), "moe-prep %s --device tpu exits 2: %s",
              sub, out);
        snprintf(cmd, sizeof cmd, "%s %.*s --help", prep, (int)strcspn(sub, " "), sub);
        CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "--device"), "moe-prep %.*s --help shows --device",
              (int)strcspn(sub, " "), sub);
    }
}

/* chat: --chat / -cnv through a pipe on the tiny trained model (not
 * instruction-tuned, so with a committed template): two turns answered, the
 * second running only its new tokens (the KV cache kept), end of input exits
 * 0; --render-chat prints what transformers renders; errors are clear. */
static void chat(const char *prep) {
    char model[1024], cmd[8192], out[65536], stats[] = "/tmp/moe-test-chat-XXXXXX";
    snprintf(model, sizeof model, "%s/../../datasets/models/tiny-moe-mixtral", MOE_FIXTURES);
    int fd = mkstemp(stats);
    close(fd);
    snprintf(cmd, sizeof cmd, "printf 'Hello there\\nWhat is two plus two?\\n' | %s -m %s -cnv --chat-template chatml "
             "-sys 'You are helpful.' -n 12 -t 2 --stats-json %s 2>/dev/null", moe_run, model, stats);
    CHECK(run(cmd, out, sizeof out) == 0, "-cnv with two piped turns exits 0");
    char *text = NULL;
    size_t len;
    cJSON *j = moe_read_file(stats, 1 << 20, &text, &len) == MOE_OK ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *c = j ? cJSON_GetObjectItem(j, "chat") : NULL, *turns = c ? cJSON_GetObjectItem(c, "turn") : NULL;
    CHECK(c && cJSON_GetObjectItem(c, "turns")->valueint == 2 && cJSON_GetArraySize(turns) == 2, "two turns in --stats-json");
    if (turns && cJSON_GetArraySize(turns) == 2) {
        const cJSON *t0 = cJSON_GetArrayItem(turns, 0), *t1 = cJSON_GetArrayItem(turns, 1);
        const int p0 = cJSON_GetObjectItem(t0, "prompt_tokens")->valueint, g0 = cJSON_GetObjectItem(t0, "generated_tokens")->valueint;
        const int p1 = cJSON_GetObjectItem(t1, "prompt_tokens")->valueint, r1 = cJSON_GetObjectItem(t1, "reused_tokens")->valueint;
        const int f1 = cJSON_GetObjectItem(t1, "prefilled_tokens")->valueint;
        CHECK(cJSON_GetObjectItem(t0, "reused_tokens")->valueint == 0 && cJSON_GetObjectItem(t0, "prefilled_tokens")->valueint == p0,
              "the first turn runs its whole prompt");
        /* the cache held the first prompt and every generated token run back (all but a last one not fed) */
        CHECK(r1 >= p0 + g0 - 1 && r1 <= p0 + g0 && f1 == p1 - r1 && f1 > 0 && f1 < p1 - p0,
              "the second turn reuses the cache: prompt %d, reused %d, ran %d (first turn: prompt %d, generated %d)", p1, r1,
              f1, p0, g0);
        CHECK(cJSON_GetObjectItem(c, "reprefills")->valueint == 0, "no re-run of the conversation");
    }
    cJSON_Delete(j);
    /* end of input at once: no turn, exit 0; -cnv is not read as -c nv */
    snprintf(cmd, sizeof cmd, "%s -m %s -cnv --chat-template chatml -n 4 < /dev/null 2>&1", moe_run, model);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "0 turns"), "-cnv at end of input exits 0: %s", out);
    /* no template in the model and no override: a clear error */
    snprintf(cmd, sizeof cmd, "echo hi | %s -m %s --chat -n 4 2>&1", moe_run, model);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "--chat-template"), "a model without a template: %s", out);
    /* --render-chat: transformers' bytes (the fixture of the Qwen3 template), no weights needed */
    char fx[1024];
    snprintf(fx, sizeof fx, "%s/chat/expected/qwen3.json", MOE_FIXTURES);
    j = moe_read_file(fx, 1 << 20, &text, &len) == MOE_OK ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *e, *want = NULL, *msgs = NULL, *cases = j ? cJSON_GetObjectItem(j, "cases") : NULL;
    cJSON_ArrayForEach(e, cases)
        if (!strcmp(cJSON_GetObjectItem(e, "name")->valuestring, "non_ascii+gen"))
            want = cJSON_GetObjectItem(e, "expected"), msgs = cJSON_GetObjectItem(e, "messages");
    CHECK(want && msgs, "the qwen3 fixture has the non_ascii+gen case");
    if (want && msgs) {
        char mpath[] = "/tmp/moe-test-msgs-XXXXXX";
        fd = mkstemp(mpath);
        char *m = cJSON_Print(msgs);
        CHECK(write(fd, m, strlen(m)) == (ssize_t)strlen(m), "write the messages");
        close(fd);
        cJSON_free(m);
        snprintf(cmd, sizeof cmd, "%s --render-chat %s --chat-template %s/chat/templates/qwen3.jinja 2>&1", moe_run, mpath,
                 MOE_FIXTURES);
        CHECK(run(cmd, out, sizeof out) == 0 && !strcmp(out, want->valuestring), "--render-chat prints transformers' bytes: %s", out);
        snprintf(cmd, sizeof cmd, "printf '[{\"role\": \"user\"' | %s --render-chat - --chat-template chatml 2>&1", moe_run);
        CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "not valid JSON"), "--render-chat of malformed JSON: %s", out);
        snprintf(cmd, sizeof cmd, "%s --render-chat %s --chat-template %s/chat/templates/mistral-v0.jinja 2>&1", moe_run, mpath,
                 MOE_FIXTURES);
        CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "Conversation roles must alternate"),
              "--render-chat shows the template's exception: %s", out);
        unlink(mpath);
    }
    cJSON_Delete(j);
    /* usage errors */
    snprintf(cmd, sizeof cmd, "%s -m %s --chat --tokens 1,2 2>/dev/null", moe_run, model);
    CHECK(run(cmd, out, sizeof out) == 2, "--chat with --tokens exits 2");
    snprintf(cmd, sizeof cmd, "%s -m %s -p hi -sys x 2>/dev/null", moe_run, model);
    CHECK(run(cmd, out, sizeof out) == 2, "-sys without --chat exits 2");
    /* outputs are checked before the run: a missing directory fails at once */
    snprintf(cmd, sizeof cmd, "echo hi | %s -m %s -cnv --chat-template chatml --stats-json /nonexistent-dir/s.json 2>&1",
             moe_run, model);
    CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "does not exist") && !strstr(out, "turns"),
          "--stats-json into a missing directory fails before the chat: %s", out);
    unlink(stats);
    /* bundles carry the template (hf.chat_template.jinja, quantize) and a bundle without one asks for --chat-template */
    char work[] = "/tmp/moe-test-chatb-XXXXXX";
    if (prep && mkdtemp(work)) {
        snprintf(cmd, sizeof cmd, "cp -r %s/models/mixtral-f32 %s/m && cp %s/chat/templates/mistral-v1.jinja "
                 "%s/m/chat_template.jinja && %s quantize %s/m -o %s/t.moeb --experts q8_0 >/dev/null 2>&1 && "
                 "%s quantize %s/models/mixtral-f32 -o %s/n.moeb --experts q8_0 >/dev/null 2>&1 && "
                 "echo '[{\"role\": \"user\", \"content\": \"hi\"}]' > %s/m.json",
                 MOE_FIXTURES, work, MOE_FIXTURES, work, prep, work, work, prep, MOE_FIXTURES, work, work);
        CHECK(run(cmd, out, sizeof out) == 0, "quantize two bundles");
        snprintf(cmd, sizeof cmd, "%s -m %s/t.moeb --render-chat %s/m.json 2>&1", moe_run, work, work);
        CHECK(run(cmd, out, sizeof out) == 0 && !strcmp(out, "<s> [INST] hi [/INST]"),
              "a bundle's own template, with its BOS: \"%s\"", out);
        snprintf(cmd, sizeof cmd, "%s -m %s/n.moeb --render-chat %s/m.json 2>&1", moe_run, work, work);
        CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "--chat-template"), "a bundle without a template: %s", out);
        snprintf(cmd, sizeof cmd, "rm -rf %s", work);
        CHECK(run(cmd, out, sizeof out) == 0, "rm");
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test-moe-run PATH/TO/moe-run\n");
        return 2;
    }
    moe_run = argv[1];
    check_fixture("mixtral-f32");
    check_fixture("qwen2_moe-f32");
    check_fixture("phimoe-f32");
    check_fixture("olmoe-f32");
    check_fixture("qwen3_moe-bf16");
    check_fixture("deepseek_v3-f32");
    check_fixture("deepseek_v2-bf16");
    check_fixture("gpt_oss-f32");

    char cmd[4096], out[65536];
    snprintf(cmd, sizeof cmd, "%s --help", moe_run);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "examples:"), "--help");
    snprintf(cmd, sizeof cmd, "%s --version", moe_run);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "moe-run ") && strstr(out, "backends: cpu"),
          "--version names the backends: %s", out);
    char out2[65536];
    snprintf(cmd, sizeof cmd, "printf 'hello world' | %s -m %s/models/mixtral-f32 -f - -n 4 --ids 2>/dev/null", moe_run,
             MOE_FIXTURES);
    const int rc_stdin = run(cmd, out, sizeof out);
    snprintf(cmd, sizeof cmd, "%s -m %s/models/mixtral-f32 -p 'hello world' -n 4 --ids 2>/dev/null", moe_run,
             MOE_FIXTURES);
    CHECK(rc_stdin == 0 && run(cmd, out2, sizeof out2) == 0 && out[0] && !strcmp(out, out2),
          "-f - reads the prompt from standard input, as -p gives it: %s / %s", out, out2);
    snprintf(cmd, sizeof cmd, "%s -m x --bogus 2>/dev/null", moe_run);
    CHECK(run(cmd, out, sizeof out) == 2, "unknown option exits 2");
    snprintf(cmd, sizeof cmd, "%s -p hi 2>/dev/null", moe_run);
    CHECK(run(cmd, out, sizeof out) == 2, "missing -m exits 2");
    snprintf(cmd, sizeof cmd, "%s -m %s/models/mixtral-f32 --tokens 1,x 2>/dev/null", moe_run, MOE_FIXTURES);
    CHECK(run(cmd, out, sizeof out) == 2, "bad --tokens exits 2");
    snprintf(cmd, sizeof cmd, "%s -m /nonexistent -p hi 2>&1", moe_run);
    CHECK(run(cmd, out, sizeof out) == 1, "missing model exits 1");
    CHECK(strstr(out, "/nonexistent") && !strstr(strstr(out, "/nonexistent") + 1, "/nonexistent: "),
          "a missing model is reported once: %s", out);
    snprintf(cmd, sizeof cmd, "%s -m %s/gguf/mixtral-f32.gguf --tokens 1,2 -n 1 2>&1", moe_run, MOE_FIXTURES);
    CHECK(run(cmd, out, sizeof out) == 0 && !strstr(out, "error"), "a GGUF run prints no error: %s", out);
    snprintf(cmd, sizeof cmd, "%s -m %s/models/mixtral-f32 --tokens 99999 -n 1 2>/dev/null", moe_run, MOE_FIXTURES);
    CHECK(run(cmd, out, sizeof out) == 1, "out-of-vocabulary id exits 1");
    devices(argc > 2 ? argv[2] : NULL);
    chat(argc > 2 ? argv[2] : NULL);
    printf("test-moe-run: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}

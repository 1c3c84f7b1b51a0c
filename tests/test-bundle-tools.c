/*
 * test-bundle-tools.c - the bundle end to end through the CLIs:
 *   - an F32 bundle gives exactly the logits of the checkpoint path (several
 *     architectures, one of them sharded);
 *   - `moe-prep eval` reports a small KL divergence for q8_0 and q4 experts
 *     against the F32 checkpoint, smaller for q8_0 than for q4;
 *   - `inspect --verify` finds a single flipped byte in every expert blob and
 *     names the expert; truncated files and damaged headers are clear errors;
 *   - killing `quantize` half way leaves nothing at the output path.
 * argv[1] = moe-prep, argv[2] = moe-run.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe-bundle.h"
#include "moe-mmap.h"
#include "moe-test.h"
#include "moe-test-model.h"
#include "moe-test-bundle-patch.h"

static const char *prep, *run;
static char tmp[256];

static int same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int same = moe_read_file(a, 1u << 30, &x, &nx) == MOE_OK && moe_read_file(b, 1u << 30, &y, &ny) == MOE_OK &&
               nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

/* prompt_ids: the oracle prompt of a fixture as "1,2,3". */
static void prompt_ids(const char *name, char *out, size_t cap) {
    char path[1024], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/models/%s/oracle/oracle.json", MOE_FIXTURES, name);
    out[0] = 0;
    if (moe_read_file(path, 1 << 20, &text, &len) != MOE_OK) return;
    const char *p = strstr(text, "\"prompt_ids\"");
    p = p ? strchr(p, '[') : NULL;
    for (p = p ? p + 1 : NULL; p && *p && *p != ']'; p++)
        if ((*p >= '0' && *p <= '9') || *p == ',') snprintf(out + strlen(out), cap - strlen(out), "%c", *p);
    free(text);
}

static void test_f32_exact(const char *name) {
    char ids[4096], out[4096];
    prompt_ids(name, ids, sizeof ids);
    CHECK(ids[0], "%s: no prompt", name);
    CHECK(moe_test_sh_out(NULL, 0, "%s quantize %s/models/%s -o %s/f32.moeb --experts f32,q8_0 --dense f32 2>&1", prep,
             MOE_FIXTURES, name, tmp) == 0, "%s: quantize f32", name);
    CHECK(moe_test_sh_out(out, sizeof out, "%s -m %s/models/%s --tokens %s -n 4 --ids --ignore-eos --logits-out %s/a.f32 2>/dev/null",
             run, MOE_FIXTURES, name, ids, tmp) == 0, "%s: run checkpoint", name);
    char out2[4096];
    CHECK(moe_test_sh_out(out2, sizeof out2, "%s -m %s/f32.moeb --expert-precision f32 --tokens %s -n 4 --ids --ignore-eos "
             "--logits-out %s/b.f32 2>/dev/null", run, tmp, ids, tmp) == 0, "%s: run bundle", name);
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/a.f32", tmp);
    snprintf(b, sizeof b, "%s/b.f32", tmp);
    CHECK(same_file(a, b), "%s: F32 bundle logits differ from the checkpoint's", name);
    CHECK(!strcmp(out, out2), "%s: generated ids differ: %s vs %s", name, out, out2);
    printf("  %-16s F32 bundle: logits bit-identical to the checkpoint path\n", name);
}

/* json_number: the number after "key": in a JSON text (first occurrence). */
static double json_number(const char *json, const char *key) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    return p ? strtod(p + strlen(pat), NULL) : -1;
}

static void test_kl(void) {
    /* a deterministic English text of a few thousand tokens */
    char path[300];
    snprintf(path, sizeof path, "%s/text.txt", tmp);
    FILE *f = fopen(path, "w");
    static const char *const words[] = {"the", "model", "runs", "quickly", "over", "small", "machines", "while",
                                        "experts", "wait", "in", "memory", "and", "tokens", "flow", "through"};
    unsigned s = 7;
    for (int i = 0; i < 3000; i++) {
        s = s * 1103515245u + 12345u;
        fprintf(f, "%s%s", words[(s >> 16) % 16], (i % 13 == 12) ? ".\n" : " ");
    }
    fclose(f);
    const char *name = "qwen3_moe-f32";
    CHECK(moe_test_sh_out(NULL, 0, "%s quantize %s/models/%s -o %s/q.moeb --experts q8_0,q4_0 --dense f32 2>&1", prep,
             MOE_FIXTURES, name, tmp) == 0, "quantize q8_0,q4_0");
    double kl[2] = {-1, -1}, top[2] = {0, 0};
    const char *precs[2] = {"q8_0", "q4_0"};
    for (int i = 0; i < 2; i++) {
        char out[16384];
        int rc = moe_test_sh_out(out, sizeof out, "%s eval %s/q.moeb --expert-precision %s --ref %s/models/%s --dataset %s --ctx 64 "
                    "--json 2>/dev/null", prep, tmp, precs[i], MOE_FIXTURES, name, path);
        CHECK(rc == 0, "eval %s exited %d", precs[i], rc);
        const char *k = strstr(out, "\"kld\"");
        kl[i] = k ? json_number(k, "mean") : -1;
        const char *t = strstr(out, "\"same_top\"");
        top[i] = t ? json_number(t, "value") : -1;
        printf("  %-16s experts %s vs F32: mean KL %.2e, same top token %.1f %%\n", name, precs[i], kl[i], 100 * top[i]);
    }
    CHECK(kl[0] >= 0 && kl[0] < 0.005, "q8_0 KL %g not small", kl[0]);
    CHECK(kl[1] >= 0 && kl[1] < 0.1, "q4_0 KL %g not small", kl[1]);
    CHECK(kl[0] < kl[1], "q8_0 KL %g should be below q4_0's %g", kl[0], kl[1]);
    CHECK(top[0] > 0.95, "q8_0 top-1 agreement %g", top[0]);
}

/* flip: copy src to dst with one byte inverted at offset off. */
static void flip(const char *src, const char *dst, uint64_t off) {
    char *x = NULL;
    size_t n = 0;
    if (moe_read_file(src, 1u << 30, &x, &n) != MOE_OK) return;
    if (off < n) x[off] ^= 0x5a;
    FILE *f = fopen(dst, "wb");
    fwrite(x, 1, n, f);
    fclose(f);
    free(x);
}

static void test_verify(void) {
    char bundle[300], bad[300], out[65536];
    snprintf(bundle, sizeof bundle, "%s/q.moeb", tmp);
    snprintf(bad, sizeof bad, "%s/bad.moeb", tmp);
    CHECK(moe_test_sh_out(out, sizeof out, "%s inspect %s --verify", prep, bundle) == 0 && strstr(out, "all checksums match"),
          "clean bundle verifies: %s", out);
    struct moe_bundle *b = NULL;
    if (moe_bundle_open(bundle, &b) != MOE_OK) {
        CHECK(0, "open %s", bundle);
        return;
    }
    uint32_t nl, ne, np;
    moe_bundle_expert_layout(b, &nl, &ne, &np);
    int n_blobs = 0, n_found = 0;
    for (uint32_t l = 0; l < nl; l++)
        for (uint32_t e = 0; moe_bundle_layer_has_experts(b, l) && e < ne; e++)
            for (uint32_t p = 0; p < np; p++) {
                struct moe_bundle_blob blob;
                if (moe_bundle_expert(b, l, e, p, &blob) != MOE_OK) continue;
                flip(bundle, bad, blob.offset + blob.stored_size / 2);
                char want[64];
                snprintf(want, sizeof want, "layer %u expert %u", l, e);
                n_blobs++;
                int rc = moe_test_sh_out(out, sizeof out, "%s inspect %s --verify 2>&1", prep, bad);
                int named = rc == 1 && strstr(out, want) && strstr(out, blob.desc->name);
                n_found += named;
                CHECK(named, "flipped byte in %s (%s) not reported: rc %d\n%s", want, blob.desc->name, rc, out);
            }
    moe_bundle_free(b);
    printf("  inspect --verify named the damaged expert for %d of %d flipped blobs\n", n_found, n_blobs);
    CHECK(n_blobs > 0, "no blobs");

    /* a damaged header and a truncated file: clear errors, exit 1 */
    flip(bundle, bad, 9);
    CHECK(moe_test_sh_out(out, sizeof out, "%s inspect %s 2>&1", prep, bad) == 1 && strstr(out, bad), "damaged header: %s", out);
    struct stat sb;
    stat(bundle, &sb);
    flip(bundle, bad, UINT64_MAX); /* a plain copy */
    CHECK(truncate(bad, sb.st_size / 2) == 0, "truncate");
    CHECK(moe_test_sh_out(out, sizeof out, "%s inspect %s 2>&1", prep, bad) == 1 && strstr(out, bad), "truncated: %s", out);
    CHECK(moe_test_sh_out(out, sizeof out, "%s -m %s -p hi -n 1 2>&1", run, bad) == 1, "moe-run on a truncated bundle");
}

/* test_short_tensor: issue 17 item 1. lm_head.weight keeps its shape but its
 * directory record says 64 bytes (checksums resealed, so no checksum can see
 * it): the binder must compare the view with the stored size. Before the fix
 * moe-run read ~59 KB past the end of the mapping. */
static void test_short_tensor(void) {
    char good[300], bad[300], out[65536];
    snprintf(good, sizeof good, "%s/short-src.moeb", tmp);
    snprintf(bad, sizeof bad, "%s/short.moeb", tmp);
    CHECK(moe_test_sh_out(NULL, 0, "%s quantize %s/models/mixtral-f32 -o %s --experts f32 --dense f32 2>&1", prep, MOE_FIXTURES,
             good) == 0, "quantize");
    char *img = NULL;
    size_t n = 0;
    if (moe_read_file(good, 1u << 30, &img, &n) != MOE_OK) {
        CHECK(0, "read %s", good);
        return;
    }
    CHECK(moe_test_bundle_set_tensor_size((uint8_t *)img, n, "lm_head.weight", 64) == 0, "patch lm_head");
    FILE *f = fopen(bad, "wb");
    CHECK(f && fwrite(img, 1, n, f) == n && fclose(f) == 0, "write %s", bad);
    free(img);
    struct moe_bundle *b = NULL;
    CHECK(moe_bundle_open(bad, &b) == MOE_OK && moe_bundle_verify_all(b, NULL, NULL) == MOE_OK,
          "the container itself is consistent (every checksum matches)");
    moe_bundle_free(b);
    int rc = moe_test_sh_out(out, sizeof out, "%s -m %s --tokens 1,2,3 -n 2 --ids 2>&1", run, bad);
    CHECK(rc == 1 && strstr(out, "lm_head.weight") && strstr(out, "stores 64 bytes"),
          "moe-run refuses a tensor smaller than its shape (rc %d): %s", rc, out);
    rc = moe_test_sh_out(out, sizeof out, "%s inspect %s --verify 2>&1", prep, bad);
    CHECK(rc == 1 && strstr(out, "DAMAGED  model") && strstr(out, "lm_head.weight"),
          "inspect --verify reports it (rc %d): %s", rc, out);
    CHECK(moe_test_sh_out(out, sizeof out, "%s inspect %s --verify 2>&1", prep, good) == 0, "the original verifies: %s", out);
}

/* test_damaged_slot: issue 17 item 11. The active tuning slot (holding the
 * bit-width map) gets a flipped byte in its record: inspect --verify must
 * report it, and moe-run must say it falls back to the other slot. */
static void test_damaged_slot(void) {
    char path[300], bad[300], out[65536];
    snprintf(path, sizeof path, "%s/slots.moeb", tmp);
    snprintf(bad, sizeof bad, "%s/slots-bad.moeb", tmp);
    CHECK(moe_test_sh_out(NULL, 0, "%s quantize %s/models/mixtral-f32 -o %s --experts f32,q8_0 --dense f32 2>&1", prep,
             MOE_FIXTURES, path) == 0, "quantize");
    struct moe_bundle *b = NULL;
    uint32_t nl = 0, ne = 0, np = 0;
    if (moe_bundle_open(path, &b) == MOE_OK) moe_bundle_expert_layout(b, &nl, &ne, &np);
    moe_bundle_free(b);
    int64_t map[64];
    for (uint32_t i = 0; i < nl * ne && i < 64; i++) map[i] = i % 2;
    struct moe_bundle_kv *kv = NULL;
    CHECK(nl * ne <= 64 && moe_bundle_kv_new(&kv) == MOE_OK && moe_bundle_kv_set_str(kv, "note", "first") == MOE_OK &&
              moe_bundle_replace_tuning(path, kv) == MOE_OK &&
              moe_bundle_kv_set_i64_array(kv, "edgemoe.bitwidth.map", map, nl * ne) == MOE_OK &&
              moe_bundle_replace_tuning(path, kv) == MOE_OK,
          "two tuning updates");
    moe_bundle_kv_free(kv);
    struct moe_bundle_info info = {0};
    b = NULL;
    if (moe_bundle_open(path, &b) == MOE_OK) moe_bundle_get_info(b, &info);
    moe_bundle_free(b);
    CHECK(moe_test_sh_out(out, sizeof out, "%s -m %s --tokens 1,2,3 -n 1 --ids 2>&1", run, path) == 0 &&
              strstr(out, "per-expert map"),
          "the map is used: %s", out);
    flip(path, bad, info.tuning_slot == 'B' ? 1024 + 12 : 512 + 12); /* the active slot's sequence */
    int rc = moe_test_sh_out(out, sizeof out, "%s inspect %s --verify 2>&1", prep, bad);
    char want[32];
    snprintf(want, sizeof want, "tuning slot %c", info.tuning_slot);
    CHECK(rc == 1 && strstr(out, "DAMAGED") && strstr(out, want), "inspect --verify reports the slot (rc %d): %s",
          rc, out);
    rc = moe_test_sh_out(out, sizeof out, "%s -m %s --tokens 1,2,3 -n 1 --ids 2>&1", run, bad);
    CHECK(rc == 0 && strstr(out, "is damaged") && strstr(out, "instead") && !strstr(out, "per-expert map"),
          "moe-run says it falls back (rc %d): %s", rc, out);
}

/* test_kill: quantize a synthetic model big enough to take a while, kill it
 * mid-way (SIGKILL, then SIGTERM), and check that nothing is at the output. */
static void test_kill(void) {
    char dir[300], path[400], out_path[300];
    snprintf(dir, sizeof dir, "%s/synth", tmp);
    mkdir(dir, 0755);
    struct tensor_spec *ts = calloc(512, sizeof *ts);
    int n = moe_test_mixtral_specs(ts, 4, 8, 256, 512, 512, 4, 2);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(moe_test_write_safetensors(path, ts, n, 42) == 0, "synthetic checkpoint");
    free(ts);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":512,\"hidden_size\":256,"
               "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
               "\"intermediate_size\":512,\"num_local_experts\":8,\"num_experts_per_tok\":2}");
    fclose(f);
    snprintf(out_path, sizeof out_path, "%s/killed.moeb", tmp);
    const int sigs[2] = {SIGKILL, SIGTERM};
    for (int i = 0; i < 2; i++) {
        int fd[2];
        CHECK(pipe(fd) == 0, "pipe");
        pid_t pid = fork();
        if (pid == 0) { /* the child: quantize with its progress lines on the pipe */
            dup2(fd[1], 2);
            close(fd[0]);
            execl(prep, prep, "quantize", dir, "-o", out_path, "--experts", "q4_k,q2_k,q3_k", "-t", "1", (char *)NULL);
            _exit(127);
        }
        close(fd[1]);
        FILE *p = fdopen(fd[0], "r");
        char line[512];
        int saw_progress = 0, killed = 0;
        while (p && fgets(line, sizeof line, p)) {
            if (strstr(line, "quantize:") && strstr(line, "%")) { /* first progress line: about 10 % done */
                saw_progress = 1;
                killed = kill(pid, sigs[i]) == 0;
                break;
            }
        }
        if (p) fclose(p);
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(saw_progress && killed && WIFSIGNALED(status), "quantize was not killed half way (signal %d)", sigs[i]);
        struct stat sb;
        CHECK(stat(out_path, &sb) != 0, "signal %d: something was left at the output path", sigs[i]);
        printf("  quantize killed with signal %d half way: nothing at the output path\n", sigs[i]);
    }
    char out[4096];
    moe_test_sh_out(out, sizeof out, "ls %s | grep -c 'killed.moeb.tmp' || true", tmp);
    CHECK(atoi(out) <= 1, "SIGTERM left its temporary file behind (%s)", out); /* SIGKILL cannot clean up */
    /* and completing the same job writes a bundle that verifies */
    CHECK(moe_test_sh_out(NULL, 0, "%s quantize %s -o %s --experts q4_k,q2_k -t 2 2>&1", prep, dir, out_path) == 0, "quantize");
    CHECK(moe_test_sh_out(out, sizeof out, "%s inspect %s --verify", prep, out_path) == 0, "completed bundle verifies");
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test-bundle-tools MOE-PREP MOE-RUN\n");
        return 2;
    }
    prep = argv[1];
    run = argv[2];
    snprintf(tmp, sizeof tmp, "/tmp/moe-bundle-tools-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    test_f32_exact("qwen3_moe-f32");
    test_f32_exact("qwen2_moe-f32");
    test_f32_exact("phimoe-f32");
    test_f32_exact("olmoe-tied-f32");
    test_f32_exact("deepseek_v3-f32"); /* MLA tensors, the correction bias */
    test_f32_exact("deepseek_v2-f32"); /* q_proj without LoRA, group-limited softmax */
    test_f32_exact("gpt_oss-f32"); /* merged experts split, expert biases in the blobs, sinks */
    test_kl();
    test_verify();
    test_short_tensor();
    test_damaged_slot();
    test_kill();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (!fails && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    printf("test-bundle-tools: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}

/*
 * test-hostile-inputs.c - the table of hostile inputs of issue 17, run through
 * the real commands: files that are not regular files (FIFOs, directories,
 * devices) named as datasets, configs, shards, bundles, profiles or prompts;
 * outputs that are the same file as an input; symlinks planted at temporary
 * names; results files and configs that contradict themselves; values out of
 * range; chat templates that are malformed, hostile or not files (issue 26).
 * Each row sets up a scratch directory with shell commands, runs one
 * command under a time limit (a hang is a failure, not a stuck test), and
 * checks its exit status, that its stderr names the problem, and optionally a
 * shell condition afterwards (e.g. the input is intact).
 *
 * argv[1] = moe-prep, argv[2] = moe-run, argv[3] = a directory for scratch
 * files (optional; default /tmp). MOE_TEST_VERBOSE=1 prints every command.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "moe-bundle.h"
#include "moe-test.h"
#include "moe-test-model.h"
#include "moe-test-bundle-patch.h"
#include "profile-h5.h"

/* far above any row's run time: only a hang reaches it (MOE_TEST_TIME_LIMIT overrides) */
static int g_limit = 60;

static const char *g_prep, *g_run;
static char g_root[512];

/* One case: setup (shell, in a fresh directory), the command (shell), the
 * expected exit status (-1 = any failure), a substring its stderr must hold
 * (NULL = no check) and a shell condition that must hold afterwards (NULL =
 * none). Commands see $PREP, $RUN, $FIX (tests/fixtures) and $MODELS. */
struct row {
    const char *name, *setup, *cmd;
    int want_rc;
    const char *want_err, *after;
    int (*hook)(const char *dir); /* after setup: a change shell cannot make easily; 0 = ok */
    int max_rss_mb;               /* the command's peak resident memory must stay below (0 = any) */
};
/* most rows have no hook and leave it out (NULL) */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

/* poison_f32: write a NaN over the first element of F32 tensor `tensor` of the
 * safetensors file dir/file (offsets from its JSON header). 0 on success. */
static int poison_f32(const char *dir, const char *file, const char *tensor) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r+b");
    unsigned char len8[8];
    if (!f || fread(len8, 1, 8, f) != 8) {
        if (f) fclose(f);
        return -1;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    char *hdr = n < ((uint64_t)1 << 24) ? malloc((size_t)n + 1) : NULL;
    int rc = -1;
    if (hdr && fread(hdr, 1, (size_t)n, f) == (size_t)n) {
        hdr[n] = 0;
        cJSON *j = cJSON_Parse(hdr);
        const cJSON *t = cJSON_GetObjectItem(j, tensor), *off = cJSON_GetObjectItem(t, "data_offsets");
        const cJSON *dt = cJSON_GetObjectItem(t, "dtype");
        if (cJSON_IsArray(off) && cJSON_IsString(dt) && !strcmp(dt->valuestring, "F32")) {
            const unsigned char nan_le[4] = {0x00, 0x00, 0xc0, 0x7f};
            long at = (long)(8 + n + (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble);
            rc = fseek(f, at, SEEK_SET) == 0 && fwrite(nan_le, 1, 4, f) == 4 ? 0 : -1;
        }
        cJSON_Delete(j);
    }
    free(hdr);
    return fclose(f) == 0 ? rc : -1;
}

/* edit_profile: read dir/name, apply fn, write it back (the writer keeps what
 * the reader must refuse). 0 on success. */
static int edit_profile(const char *dir, const char *name, void (*fn)(struct moe_profile *p)) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct moe_profile *p = NULL;
    if (moe_profile_read(path, &p) != MOE_OK) return -1;
    fn(p);
    int rc = moe_profile_write(p, path) == MOE_OK ? 0 : -1;
    moe_profile_free(p);
    return rc;
}

static void inf_weight(struct moe_profile *p) { p->weights[0] = INFINITY; } /* rank 0: a NaN score */
static void nan_weight(struct moe_profile *p) { p->weights[3] = NAN; }
static void layer_out_of_range(struct moe_profile *p) { p->moe_layer_index[p->n_layers - 1] = 1 << 24; }
static void dup_ranking(struct moe_profile *p) {
    int32_t *o = NULL;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    if (moe_profile_get_i32(p, "sensitivity.order", NULL, dims, (const int32_t **)&o) == MOE_OK && dims[0] > 1)
        o[1] = o[0];
}
static void score_shape(struct moe_profile *p) {
    int64_t d[2] = {p->n_layers, p->n_experts + 1};
    double *v = calloc((size_t)(d[0] * d[1]), sizeof *v);
    if (v) moe_profile_put_f64(p, "sensitivity.score", 2, d, v);
    free(v);
}
static void nan_kl(struct moe_profile *p) {
    double *v = NULL;
    if (moe_profile_get_f64(p, "sensitivity.kl", NULL, NULL, (const double **)&v) == MOE_OK) v[0] = NAN;
}
static void no_data(struct moe_profile *p) {
    moe_profile_clear_derived(p);
    double cfg[7] = {16, 0, 1, 0, 0, 4, 1000};
    int64_t n = 7;
    moe_profile_put_f64(p, "config.sensitivity", 1, &n, cfg);
}
static int h_inf_weight(const char *dir) { return edit_profile(dir, "s1.h5", inf_weight); }
static int h_nan_weight(const char *dir) { return edit_profile(dir, "p.h5", nan_weight); }
static int h_layer(const char *dir) { return edit_profile(dir, "p.h5", layer_out_of_range); }
static int h_dup_ranking(const char *dir) { return edit_profile(dir, "s.h5", dup_ranking); }
static int h_score_shape(const char *dir) { return edit_profile(dir, "s.h5", score_shape); }
static int h_nan_kl(const char *dir) { return edit_profile(dir, "s.h5", nan_kl); }
static int h_no_data(const char *dir) { return edit_profile(dir, "s.h5", no_data); }

/* wide_heads: a one-layer Mixtral checkpoint "wide" whose single KV head is
 * 32768 wide: 256 KiB of KV cache per token, so a context the machine cannot
 * hold is within --ctx's range (the row's HUGE_CTX, set by main). */
static int wide_heads(const char *dir) {
    const int H = 8, HD = 32768, V = 16, F = 8, E = 2;
    struct tensor_spec *ts = calloc(32, sizeof *ts);
    if (!ts) return -1;
    int n = 0;
#define SPEC(nm, a, b) (snprintf(ts[n].name, sizeof ts[n].name, "%s", nm), ts[n].n_dims = (b) ? 2 : 1, \
                        ts[n].d[0] = a, ts[n].d[1] = b, n++)
    SPEC("model.embed_tokens.weight", V, H);
    SPEC("model.norm.weight", H, 0);
    SPEC("lm_head.weight", V, H);
    SPEC("model.layers.0.input_layernorm.weight", H, 0);
    SPEC("model.layers.0.post_attention_layernorm.weight", H, 0);
    SPEC("model.layers.0.self_attn.q_proj.weight", HD, H);
    SPEC("model.layers.0.self_attn.k_proj.weight", HD, H);
    SPEC("model.layers.0.self_attn.v_proj.weight", HD, H);
    SPEC("model.layers.0.self_attn.o_proj.weight", H, HD);
    SPEC("model.layers.0.block_sparse_moe.gate.weight", E, H);
    for (int e = 0; e < E; e++) {
        char nm[96];
        snprintf(nm, sizeof nm, "model.layers.0.block_sparse_moe.experts.%d.w1.weight", e);
        SPEC(nm, F, H);
        snprintf(nm, sizeof nm, "model.layers.0.block_sparse_moe.experts.%d.w3.weight", e);
        SPEC(nm, F, H);
        snprintf(nm, sizeof nm, "model.layers.0.block_sparse_moe.experts.%d.w2.weight", e);
        SPEC(nm, H, F);
    }
#undef SPEC
    char path[1024];
    snprintf(path, sizeof path, "%s/wide", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/wide/model.safetensors", dir);
    int rc = moe_test_write_safetensors(path, ts, n, 0);
    free(ts);
    snprintf(path, sizeof path, "%s/wide/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":%d,\"hidden_size\":%d,"
               "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"num_key_value_heads\":1,\"head_dim\":%d,"
               "\"intermediate_size\":%d,\"num_local_experts\":%d,\"num_experts_per_tok\":2}",
            V, H, HD, F, E);
    return fclose(f) == 0 ? rc : -1;
}

static int nan_lm_head(const char *dir) { return poison_f32(dir, "m/model.safetensors", "lm_head.weight"); }
static int nan_norm(const char *dir) { return poison_f32(dir, "m/model.safetensors", "model.norm.weight"); }

/* h_part_rows: the first expert precision of dir/b.moeb claims 2^20 rows for
 * its gate part (type, columns and bytes kept, checksums resealed): a
 * descriptor the container accepts that contradicts the config. */
static int h_part_rows(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/b.moeb", dir);
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    uint8_t *img = n > 0 ? malloc((size_t)n) : NULL;
    int rc = -1;
    if (img && fseek(f, 0, SEEK_SET) == 0 && fread(img, 1, (size_t)n, f) == (size_t)n &&
        moe_test_bundle_set_part_rows(img, (size_t)n, 0, 1u << 20) == 0 && fseek(f, 0, SEEK_SET) == 0 &&
        fwrite(img, 1, (size_t)n, f) == (size_t)n)
        rc = 0;
    free(img);
    return fclose(f) == 0 ? rc : -1;
}

/* h_damaged_experts: one byte flipped in the middle of every expert blob of
 * dir/b.moeb (the directory and its checksums untouched): storage that
 * returns damaged bytes, which the expert store finds by their checksum. */
static int h_damaged_experts(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/b.moeb", dir);
    struct moe_bundle *b = NULL;
    if (moe_bundle_open(path, &b) != MOE_OK) return -1;
    uint32_t nl = 0, ne = 0, np = 0;
    moe_bundle_expert_layout(b, &nl, &ne, &np);
    FILE *f = fopen(path, "r+b");
    int rc = f && nl > 0 ? 0 : -1;
    for (uint32_t l = 0; !rc && l < nl; l++)
        for (uint32_t e = 0; !rc && moe_bundle_layer_has_experts(b, l) && e < ne; e++)
            for (uint32_t p = 0; !rc && p < np; p++) {
                struct moe_bundle_blob bl;
                int c;
                const long at = moe_bundle_expert(b, l, e, p, &bl) == MOE_OK ? (long)(bl.offset + bl.stored_size / 2) : -1;
                rc = at < 0 || fseek(f, at, SEEK_SET) || (c = fgetc(f)) == EOF || fseek(f, at, SEEK_SET) ||
                     fputc(c ^ 0x5a, f) == EOF;
            }
    moe_bundle_free(b);
    if (f && fclose(f)) rc = -1;
    return rc ? -1 : 0;
}

/* A small calibration text: the same sentence mix the demo uses. */
#define TEXT "printf 'the model runs quickly over small machines while the experts rest. %.0s' $(seq 80) > text.txt"
/* A bundle of the tiny Mixtral with two expert precisions. */
#define BUNDLE "$PREP quantize $MODELS/mixtral-f32 -o b.moeb --experts f32,q8_0 --dense f32 2>/dev/null"
/* A profile of it (recorded on the checkpoint, so the bundle's tuning stays as quantize wrote it). */
#define PROFILE TEXT " && $PREP profile $MODELS/mixtral-f32 --dataset text.txt -o p.h5 --ctx 16 >/dev/null 2>&1"
/* A finished sensitivity sweep of the bundle (BUNDLE and TEXT first). */
#define SENS "$PREP sensitivity b.moeb --dataset text.txt -o s.h5 --ctx 16 --max-tokens 64 >/dev/null 2>&1"
/* Two profile shards of the checkpoint (TEXT first). */
#define SHARDS "for i in 1 2; do $PREP profile $MODELS/mixtral-f32 --dataset text.txt -o s$i.h5 --ctx 16 " \
               "--shard $i/2 >/dev/null 2>&1; done"
/* Writes fail with EFBIG past 10 KiB (RLIMIT_FSIZE, SIGXFSZ ignored): a full disk without root. */
#define FULL_DISK "trap '' XFSZ; ulimit -f 20; "
/* The bundle is intact: every checksum matches. */
#define BUNDLE_OK "$PREP inspect b.moeb --verify >/dev/null 2>&1"
/* issue 30: a GGUF input and its copy for checking it was not touched */
#define GGUF "cp $FIX/gguf/mixtral-f32.gguf q.gguf && cp q.gguf q.orig"
#define GGUF_INTACT "cmp -s q.gguf q.orig"
/* device nodes in the row's own directory, never on the system's /dev: made
 * with mknod when allowed (root), else links to the system's devices (so a
 * wrong rename would replace the link, not the device) */
#define DEVICES "{ mknod full c 1 7 2>/dev/null || ln -s /dev/full full; } && " \
                "{ mknod null c 1 3 2>/dev/null || ln -s /dev/null null; }"
#define DEVICES_INTACT "{ test -c full || test -L full; } && { test -c null || test -L null; }"
#define NO_TMP "! ls -a | grep -q '\\.tmp\\.'"
/* a pid that no longer runs: the shell that printed it has exited */
#define DEAD_PID "p=$(sh -c 'echo $$') && "

static const struct row k_rows[] = {
    /* ---- 3: what is not a regular file is refused, never waited on */
    {"dataset is a FIFO (eval)", "mkfifo ds.txt", "$PREP eval $MODELS/mixtral-f32 --dataset ds.txt --ctx 16", 1,
     "ds.txt: is a FIFO", NULL},
    {"dataset is a FIFO (profile)", "mkfifo ds.txt", "$PREP profile $MODELS/mixtral-f32 --dataset ds.txt -o p.h5", 1,
     "ds.txt: is a FIFO", "test ! -e p.h5"},
    {"dataset is a directory (eval)", "mkdir ds", "$PREP eval $MODELS/mixtral-f32 --dataset text:ds --ctx 16", 1,
     "is a directory", NULL},
    {"dataset is a character device (eval)", "", "$PREP eval $MODELS/mixtral-f32 --dataset text:/dev/zero --ctx 16", 1,
     "is a character device", NULL},
    {"config.json is a FIFO (check)", "cp -r $MODELS/mixtral-f32 m && rm m/config.json && mkfifo m/config.json",
     "$PREP check m", 1, "config.json: is a FIFO", NULL},
    {"config.json is a FIFO (moe-run)", "cp -r $MODELS/mixtral-f32 m && rm m/config.json && mkfifo m/config.json",
     "$RUN -m m --tokens 1,2 -n 1", 1, "config.json: is a FIFO", NULL},
    {"generation_config.json is a FIFO (moe-run)",
     "cp -r $MODELS/mixtral-f32 m && rm -f m/generation_config.json && mkfifo m/generation_config.json",
     "$RUN -m m --tokens 1,2 -n 1", 1, "generation_config.json: is a FIFO", NULL},
    {"tokenizer.json is a FIFO (moe-run)",
     "cp -r $MODELS/mixtral-f32 m && rm m/tokenizer.json && mkfifo m/tokenizer.json", "$RUN -m m -p hello -n 1", 1,
     "tokenizer.json: is a FIFO", NULL},
    {"index shard is a FIFO (quantize)",
     "cp -r $MODELS/qwen2_moe-f32 m && rm m/model-00002-of-00003.safetensors && "
     "mkfifo m/model-00002-of-00003.safetensors",
     "$PREP quantize m -o q.moeb --experts q8_0", 1, "model-00002-of-00003.safetensors: is a FIFO",
     "test ! -e q.moeb"},
    {"index shard is a FIFO (check)",
     "cp -r $MODELS/qwen2_moe-f32 m && rm m/model-00002-of-00003.safetensors && "
     "mkfifo m/model-00002-of-00003.safetensors",
     "$PREP check m", 1, "is a FIFO", NULL},
    {"bundle is a FIFO (moe-run)", "mkfifo b.moeb", "$RUN -m b.moeb --tokens 1,2 -n 1", 1, "b.moeb: is a FIFO", NULL},
    {"bundle is a FIFO (inspect)", "mkfifo b.moeb", "$PREP inspect b.moeb --verify", 1, "b.moeb: is a FIFO", NULL},
    {"prompt file is a FIFO (moe-run -f)", "mkfifo prompt.txt", "$RUN -m $MODELS/mixtral-f32 -f prompt.txt -n 1", 1,
     "prompt.txt: is a FIFO", NULL},
    {"profile is a FIFO (report)", "mkfifo p.h5", "$PREP profile report p.h5 -o r.html", 1, "p.h5: is a FIFO",
     "test ! -e r.html"},
    {"profile shard is a FIFO (merge)", "mkfifo p.h5", "$PREP profile merge p.h5 p.h5 -o m.h5", 1, "p.h5: is a FIFO",
     "test ! -e m.h5"},
    /* ---- 6: sampling values out of range are usage errors, not "greedy" */
    {"--temp -1 (moe-run)", "", "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 2 --temp -1", 2, "--temp must be", NULL},
    {"--temp nan (moe-run)", "", "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 2 --temp nan", 2, "expects a number",
     NULL},
    {"--temp inf (moe-run)", "", "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 2 --temp inf", 2, "--temp must be",
     NULL},

    /* ---- 7: an output that is the same file as an input is refused (device + inode) */
    {"--logits-out names the bundle (moe-run)", BUNDLE, "$RUN -m b.moeb --tokens 1,2 -n 1 --logits-out b.moeb", 2,
     "same file as the input", BUNDLE_OK},
    {"--logits-out names a shard (moe-run)", "cp -r $MODELS/mixtral-f32 m",
     "$RUN -m m --tokens 1,2 -n 1 --logits-out m/./model.safetensors", 2, "same file as the input",
     "cmp -s m/model.safetensors $MODELS/mixtral-f32/model.safetensors"},
    {"--logits-out names the prompt file (moe-run)", "cp -r $MODELS/mixtral-f32 m && echo hello > p.txt",
     "$RUN -m m -f p.txt -n 1 --logits-out p.txt", 2, "same file as the input", "grep -q hello p.txt"},
    {"quantize -o MODEL/model.safetensors", "cp -r $MODELS/mixtral-f32 m",
     "$PREP quantize m -o m/model.safetensors --experts f32 --dense f32", 2, "same file as the input",
     "cmp -s m/model.safetensors $MODELS/mixtral-f32/model.safetensors"},
    {"quantize -o a hard link of config.json", "cp -r $MODELS/mixtral-f32 m && ln m/config.json cfg.json",
     "$PREP quantize m -o cfg.json --experts f32 --dense f32", 2, "same file as the input",
     "cmp -s m/config.json $MODELS/mixtral-f32/config.json"},
    {"sensitivity -o names the bundle", BUNDLE " && " TEXT,
     "$PREP sensitivity b.moeb --dataset text.txt -o b.moeb --ctx 16 --max-tokens 32", 2, "same file as the input",
     BUNDLE_OK},
    {"sensitivity --csv names the dataset", BUNDLE " && " TEXT " && cp text.txt text.orig",
     "$PREP sensitivity b.moeb --dataset text.txt -o s.h5 --csv text.txt --ctx 16 --max-tokens 32", 2,
     "same file as the input", "cmp -s text.txt text.orig && test ! -e s.h5"},
    {"profile report P.h5 -o P.h5", PROFILE " && cp p.h5 p.orig", "$PREP profile report p.h5 -o p.h5", 2,
     "same file as the input", "cmp -s p.h5 p.orig"},
    {"profile B.moeb -o B.moeb", BUNDLE " && " TEXT, "$PREP profile b.moeb --dataset text.txt -o b.moeb --ctx 16", 2,
     "same file as the input", BUNDLE_OK},
    {"profile -o names the dataset", TEXT " && cp text.txt text.orig",
     "$PREP profile $MODELS/mixtral-f32 --dataset text.txt -o text.txt --ctx 16", 2, "same file as the input",
     "cmp -s text.txt text.orig"},
    {"profile merge -o names a shard", PROFILE " && cp p.h5 p.orig", "$PREP profile merge p.h5 -o ./p.h5", 2,
     "same file as the input", "cmp -s p.h5 p.orig"},
    {"--stats-json names the bundle (moe-run)", BUNDLE,
     "$RUN -m b.moeb --tokens 1,2 -n 1 --expert-mem 50% --stats-json b.moeb", 2, "same file as the input", BUNDLE_OK},
    {"--trace-out names the bundle (moe-run)", BUNDLE, "$RUN -m b.moeb --tokens 1,2 -n 1 --trace-out ./b.moeb", 2,
     "same file as the input", BUNDLE_OK},
    {"--trace-out names the prompt file (moe-run)", "echo hello > p.txt",
     "$RUN -m $MODELS/mixtral-f32 -f p.txt -n 1 --trace-out p.txt", 2, "same file as the input",
     "grep -q hello p.txt"},
    {"--stats-json and --trace-out name one new file (moe-run)", "",
     "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 1 --stats-json o --trace-out ./o", 2, "named for two outputs",
     "test ! -e o"},
    {"fit-cache --csv names the profile", BUNDLE " && " PROFILE " && cp p.h5 p.orig",
     "$PREP fit-cache b.moeb --profile p.h5 --cache-experts 4,4 --csv p.h5", 2, "same file as the input",
     "cmp -s p.h5 p.orig"},

    /* ---- issue 30: a GGUF input is an input like any other */
    {"quantize -o the GGUF it reads", GGUF, "$PREP quantize q.gguf -o q.gguf --experts q8_0", 2,
     "same file as the input", GGUF_INTACT},
    {"profile -o the GGUF it reads", GGUF " && " TEXT, "$PREP profile q.gguf --dataset text.txt -o q.gguf --ctx 16",
     2, "same file as the input", GGUF_INTACT},
    {"moe-run --logits-out the GGUF it reads", GGUF, "$RUN -m q.gguf --tokens 1,2 -n 1 --logits-out q.gguf", 2,
     "same file as the input", GGUF_INTACT},
    {"moe-run --stats-json the GGUF it reads", GGUF, "$RUN -m q.gguf --tokens 1,2 -n 1 --stats-json q.gguf", 2,
     "same file as the input", GGUF_INTACT},
    {"moe-run --logits-out a hard link of the GGUF", GGUF " && ln q.gguf h.gguf",
     "$RUN -m q.gguf --tokens 1,2 -n 1 --logits-out h.gguf", 2, "same file as the input", GGUF_INTACT},
    {"profile of a GGUF: no tuning section, the profile written, exit 0", GGUF " && " TEXT,
     "$PREP profile q.gguf --dataset text.txt -o n.h5 --ctx 16", 0, "has no tuning section",
     "test -s n.h5 && " GGUF_INTACT},

    /* ---- issue 30: devices, FIFOs and standard output are written in place, never replaced */
    {"quantize -o a character device", DEVICES, "$PREP quantize $MODELS/mixtral-f32 -o full --experts q8_0", 2,
     "needs a regular file", DEVICES_INTACT " && " NO_TMP},
    {"moe-run --stats-json a full device: a clean error", DEVICES,
     "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 1 --stats-json full", 1, "No space left", DEVICES_INTACT},
    {"moe-run --logits-out a null device", DEVICES, "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 1 --logits-out null",
     0, NULL, DEVICES_INTACT " && " NO_TMP},
    {"moe-run --stats-json a FIFO: streamed to its reader", "mkfifo f",
     "cat f > got.json & $RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 1 --stats-json f; r=$?; wait; exit $r", 0, NULL,
     "test -p f && grep -q prompt_tokens got.json"},
    {"moe-run --stats-json - : standard output", "",
     "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 1 --stats-json -", 0, NULL,
     "grep -q prompt_tokens out.txt && test ! -e ./-"},
    {"moe-run --stats-json /dev/fd/1 with standard output a file: appended, the text kept", "",
     "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 2 --ids --stats-json /dev/fd/1", 0, NULL,
     "grep -q prompt_tokens out.txt && grep -q '^[0-9]' out.txt && " NO_TMP},
    {"profile -o - : the profile on standard output", TEXT,
     "$PREP profile $MODELS/mixtral-f32 --dataset text.txt -o - --ctx 16 --json > /dev/null", 0, NULL,
     "test ! -e ./- && " NO_TMP},
    {"fit-cache --csv a null device", BUNDLE " && " PROFILE " && " DEVICES,
     "$PREP fit-cache b.moeb --profile p.h5 --cache-experts 4,4 --no-tuning --csv null", 0, NULL, DEVICES_INTACT},
    {"a directory as the output (moe-run --logits-out)", "mkdir d",
     "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 1 --logits-out d", 2, "is a directory", "test -d d"},

    /* ---- issue 30: the output's directory, checked before the work */
    {"quantize -o into a missing directory", "",
     "$PREP quantize $MODELS/mixtral-f32 -o nodir/x.moeb --experts q8_0", 2, "nodir does not exist", "test ! -e nodir"},
    {"moe-run --stats-json into a missing directory", "",
     "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 1 --stats-json nodir/s.json", 2, "nodir does not exist", NULL},
    {"profile -o into a read-only directory", TEXT " && mkdir ro && chmod 555 ro",
     "if [ $(id -u) -eq 0 ]; then echo 'cannot write in the directory (root)' >&2; exit 2; fi; "
     "$PREP profile $MODELS/mixtral-f32 --dataset text.txt -o ro/p.h5 --ctx 16", 2, "cannot write in the directory",
     "test ! -e ro/p.h5"},

    /* ---- issue 30: no leftovers */
    {"a dead writer's temporary file is removed by the next run", DEAD_PID "echo junk > b.moeb.tmp.$p",
     "$PREP quantize $MODELS/mixtral-f32 -o b.moeb --experts q8_0 --dense f32", 0, "no longer runs",
     NO_TMP " && " BUNDLE_OK},
    {"a live writer's temporary file is kept", "sleep 30 & echo $! > pid && echo mine > b.moeb.tmp.$(cat pid)",
     "$PREP quantize $MODELS/mixtral-f32 -o b.moeb --experts q8_0 --dense f32", 0, NULL,
     "grep -q mine b.moeb.tmp.$(cat pid) && kill $(cat pid)"},
    {"kill -9 of quantize, then a run: no temporary file survives", "",
     "for d in 0.05 0.1 0.2; do $PREP quantize $DEMO -o b.moeb --experts q8_0,q4_k,q2_k & k=$!; sleep $d; "
     "kill -9 $k; wait $k; done 2>/dev/null; $PREP quantize $DEMO -o b.moeb --experts q8_0", 0, NULL,
     NO_TMP " && " BUNDLE_OK},
    /* (a command started with & ignores SIGINT in a shell without job control: the
     * shell execs moe-run in the foreground and a helper started before sends the signal) */
    {"SIGINT during moe-run --logits-out: no temporary file survives", "",
     "n=0; for d in 0.01 0.02 0.03 0.05 0.08; do sh -c 'sh -c \"sleep \\$0; kill -INT \\$1\" $0 $$ & exec $RUN -m $DEMO "
     "-p \"Once upon a time\" -n 900 --ignore-eos --logits-out l.f32 >/dev/null' $d; [ $? -eq 130 ] && n=$((n+1)); "
     "done; echo \"interrupted $n of 5\" >&2; [ $n -ge 1 ]", 0, "interrupted", NO_TMP},
    /* (the profile's temporary file lives for milliseconds, too short to hit: SIGTERM is
     * checked on moe-run's logits file, which lives for the whole run; at least one kill
     * must land mid-run, or the row proves nothing) */
    {"SIGTERM during moe-run --logits-out: no temporary file survives", "",
     "n=0; for d in 0.01 0.02 0.03 0.05 0.08; do $RUN -m $DEMO -p 'Once upon a time' -n 900 --ignore-eos "
     "--logits-out l.f32 >/dev/null 2>&1 & k=$!; sleep $d; kill -TERM $k; wait $k; [ $? -eq 143 ] && n=$((n+1)); "
     "done; echo \"terminated $n of 5\" >&2; [ $n -ge 1 ]", 0, "terminated", NO_TMP},

    /* ---- 8: a symlink planted at the old temporary name is not followed */
    {"--logits-out with a symlink at F.tmp (moe-run)", "echo precious > victim && ln -s victim out.f32.tmp",
     "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 1 --logits-out out.f32", 0, NULL,
     "grep -q precious victim && test $(stat -c %s out.f32) -eq 8192"},
    {"--stats-json with a symlink at F.tmp (moe-run)", "echo precious > victim && ln -s victim s.json.tmp",
     "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 1 --stats-json s.json", 0, NULL,
     "grep -q precious victim && grep -q prompt_tokens s.json && test -L s.json.tmp"},

    /* ---- 9: a full disk is a clean error: no output, the old file intact */
    {"profile on a full disk", PROFILE " && echo old > p.h5",
     FULL_DISK "$PREP profile $MODELS/mixtral-f32 --dataset text.txt -o p.h5 --ctx 16", 1, "did not finish p.h5",
     "grep -q old p.h5 && ! ls | grep -q tmp"},
    {"profile merge on a full disk", TEXT " && for i in 1 2; do $PREP profile $MODELS/mixtral-f32 --dataset text.txt "
     "-o s$i.h5 --ctx 16 --shard $i/2 >/dev/null 2>&1; done",
     FULL_DISK "$PREP profile merge s1.h5 s2.h5 -o m.h5", 1, "File too large", "test ! -e m.h5 && ! ls | grep -q tmp"},
    {"sensitivity on a full disk", BUNDLE " && " TEXT,
     FULL_DISK "$PREP sensitivity b.moeb --dataset text.txt -o s.h5 --ctx 16 --max-tokens 64", 1, "File too large",
     "test ! -e s.h5 && ! ls | grep -q tmp"},
    {"fit-cache's profile update on a full disk", BUNDLE " && " PROFILE " && cp p.h5 p.orig",
     FULL_DISK "$PREP fit-cache b.moeb --profile p.h5 --cache-experts 4,4 --no-tuning", 1, "File too large",
     "cmp -s p.h5 p.orig && ! ls | grep -q tmp"},
    {"moe-run --trace-out on a full disk", "echo old > t.h5",
     FULL_DISK "$RUN -m $MODELS/mixtral-f32 --tokens 1,2 -n 2 --trace-out t.h5", 1, "File too large",
     "grep -q old t.h5 && ! ls | grep -q tmp"},
    {"profile report on a full disk", PROFILE " && echo old > r.html", FULL_DISK "$PREP profile report p.h5 -o r.html",
     1, "File too large", "grep -q old r.html && ! ls | grep -q tmp"},

    /* ---- 5: a config that contradicts its checkpoint, or ids out of range */
    {"config with fewer layers than the checkpoint (quantize)",
     "cp -r $MODELS/mixtral-f32 m && sed -i 's/\"num_hidden_layers\": 2/\"num_hidden_layers\": 1/' m/config.json",
     "$PREP quantize m -o q.moeb --experts f32 --dense f32", 1, "model.layers.1.", "test ! -e q.moeb"},
    {"config with fewer layers than the checkpoint (moe-run)",
     "cp -r $MODELS/mixtral-f32 m && sed -i 's/\"num_hidden_layers\": 2/\"num_hidden_layers\": 1/' m/config.json",
     "$RUN -m m --tokens 1,2 -n 1", 1, "does not account for", NULL},
    {"bos_token_id outside the vocabulary (moe-run)",
     "cp -r $MODELS/mixtral-f32 m && sed -i 's/\"bos_token_id\": 1/\"bos_token_id\": 5000/' m/config.json",
     "$RUN -m m -p hello -n 1", 1, "bos_token_id", NULL},

    /* ---- 10: NaN and infinity: constants checked on load, non-finite logits fail loudly */
    {"negative rms_norm_eps (moe-run)",
     "cp -r $MODELS/mixtral-f32 m && sed -i 's/\"rms_norm_eps\": 1e-05/\"rms_norm_eps\": -1e-05/' m/config.json",
     "$RUN -m m --tokens 1,2 -n 1", 1, "rms_norm_eps must be a positive number", NULL},
    {"rope_theta 0 (eval)",
     TEXT " && cp -r $MODELS/mixtral-f32 m && sed -i 's/\"rope_theta\": 1000000.0/\"rope_theta\": 0/' m/config.json",
     "$PREP eval m --dataset text.txt --ctx 16", 1, "rope_theta must be a positive number", NULL},
    {"NaN in lm_head (moe-run)", "cp -r $MODELS/mixtral-f32 m", "$RUN -m m --tokens 1,2,3 -n 2 --ids", 1,
     "non-finite logit", NULL, nan_lm_head},
    {"NaN in lm_head (eval)", TEXT " && cp -r $MODELS/mixtral-f32 m", "$PREP eval m --dataset text.txt --ctx 16", 1,
     "non-finite logits", NULL, nan_lm_head},
    {"NaN in a norm weight (moe-run)", "cp -r $MODELS/mixtral-f32 m", "$RUN -m m --tokens 1,2,3 -n 2", 1,
     "\"model.norm.weight\" holds a non-finite value", NULL, nan_norm},

    /* ---- 1: an expert precision whose parts contradict the config is refused at load, also when experts
     * are bound lazily and read by the expert store (whose views come from the descriptor) */
    {"precision descriptor contradicts the config (moe-run --expert-mem)", BUNDLE,
     "$RUN -m b.moeb --tokens 1,2 -n 1 --expert-mem 50%", 1, "expert blobs do not hold", NULL, h_part_rows},
    {"precision descriptor contradicts the config (moe-run)", BUNDLE, "$RUN -m b.moeb --tokens 1,2 -n 1", 1,
     "expert blobs do not hold", NULL, h_part_rows},
    /* issue 31 item 6: expert bytes damaged on disk: read twice, then exit 1 naming layer, expert, precision, offset */
    {"damaged expert bytes (moe-run --expert-mem)", BUNDLE, "$RUN -m b.moeb --tokens 1,2 -n 2 --expert-mem 50%", 1,
     "fail their checksum (2 reads", NULL, h_damaged_experts},

    /* ---- 4 (and 10): results files that contradict themselves are refused on read */
    {"profile merge with an infinite gate weight", TEXT " && " SHARDS, "$PREP profile merge s1.h5 s2.h5 -o m.h5", 1,
     "gate weight inf", "test ! -e m.h5", h_inf_weight},
    {"profile report with a layer index out of range", PROFILE, "$PREP profile report p.h5 -o r.html", 1,
     "moe_layer_index", "test ! -e r.html", h_layer},
    {"fit-cache with a NaN gate weight", BUNDLE " && " PROFILE,
     "$PREP fit-cache b.moeb --profile p.h5 --cache-experts 4,4 --no-tuning", 1, "gate weight nan", NULL,
     h_nan_weight},
    {"bitwidth with a duplicate in the ranking", BUNDLE " && " TEXT " && " SENS,
     "$PREP bitwidth b.moeb --sensitivity s.h5 --dataset text.txt --ctx 16 --max-loss 5% --no-tuning", 1,
     "sensitivity.order is not a permutation", BUNDLE_OK, h_dup_ranking},
    {"bitwidth with a sensitivity file without data", BUNDLE " && " TEXT " && " SENS,
     "$PREP bitwidth b.moeb --sensitivity s.h5 --dataset text.txt --ctx 16 --max-loss 5% --no-tuning", 1,
     "no usable sensitivity data", NULL, h_no_data},
    {"profile report with a score matrix of the wrong shape", BUNDLE " && " TEXT " && " SENS,
     "$PREP profile report s.h5 -o r.html", 1, "sensitivity.score has the wrong type or shape", "test ! -e r.html",
     h_score_shape},
    {"profile report with NaN KL values", BUNDLE " && " TEXT " && " SENS, "$PREP profile report s.h5 -o r.html", 1,
     "sensitivity.kl element 0 is nan", "test ! -e r.html", h_nan_kl},
    {"profile report of a sensitivity file without data", BUNDLE " && " TEXT " && " SENS,
     "$PREP profile report s.h5 -o r.html", 1, "no usable sensitivity data", "test ! -e r.html", h_no_data},

    /* ---- 12: memory follows what was asked for */
    {"eval --max-chunks 2 on 60 MB of text in under 600 MB of memory",
     "yes 'the model runs quickly over small machines while the experts rest.' | head -c 60000000 > big.txt",
     "$PREP eval $MODELS/mixtral-f32 --dataset big.txt --ctx 32 --max-chunks 2 -t 1 --json", 0, NULL,
     /* the same figures as the whole of a short prefix gives (--unigram reads it all) */
     "head -c 200000 big.txt > small.txt && $PREP eval $MODELS/mixtral-f32 --dataset small.txt --ctx 32 "
     "--max-chunks 2 -t 1 --unigram --json > o2.txt 2>/dev/null && grep -o '\"ppl\": *{[^}]*}' out.txt > a && "
     "grep -o '\"ppl\": *{[^}]*}' o2.txt > b && test -s a && cmp -s a b", .max_rss_mb = 600},
    {"profile --max-tokens 512 on 60 MB of text in under 600 MB of memory",
     "yes 'the model runs quickly over small machines while the experts rest.' | head -c 60000000 > big.txt",
     "$PREP profile $MODELS/mixtral-f32 --dataset big.txt --ctx 32 --max-tokens 512 -t 1 -o p.h5", 0, NULL,
     "test -s p.h5", .max_rss_mb = 600},
    {"moe-run with a KV cache larger than memory", "", "$RUN -m wide --tokens 1,2 -n 1 --ctx $HUGE_CTX", 1,
     "needs a KV cache of", NULL, wide_heads},

    /* ---- issue 26: chat templates and conversations */
    {"--chat-template is a FIFO", "mkfifo t.jinja", "echo hi | $RUN -m $DEMO --chat --chat-template t.jinja -n 2", 1,
     "t.jinja: is a FIFO", NULL},
    {"--render-chat messages file is a FIFO", "mkfifo m.json", "$RUN --render-chat m.json --chat-template chatml", 1,
     "m.json: is a FIFO", NULL},
    {"an unterminated chat template", "printf '{%% for m in messages %%}{{ m.content' > t.jinja",
     "echo hi | $RUN -m $DEMO --chat --chat-template t.jinja -n 2", 1, "unterminated '{{' expression", NULL},
    {"a chat template nested 100000 deep", "for i in $(seq 100000); do printf '{%% if 1 %%}'; done > t.jinja",
     "echo hi | $RUN -m $DEMO --chat --chat-template t.jinja -n 2", 1, "nested more than 256 deep", NULL},
    {"a chat template with an endless loop",
     "printf '{%% set r = range(99999) %%}{%% for a in r %%}{%% for b in r %%}{%% endfor %%}{%% endfor %%}' > t.jinja",
     "echo hi | $RUN -m $DEMO --chat --chat-template t.jinja -n 2", 1, "more than 50000000 steps", NULL},
    {"a chat template that includes a file", "printf \"{%% include '/etc/passwd' %%}\" > t.jinja",
     "$RUN --render-chat - --chat-template t.jinja", 1, "unsupported tag 'include'", NULL},
    {"--render-chat of messages that are not an array", "printf '{\"role\": \"user\"}' > m.json",
     "$RUN --render-chat m.json --chat-template chatml", 1, "must be a JSON array", NULL},
    {"--chat-template-kwargs that are not JSON", "",
     "echo '[]' | $RUN --render-chat - --chat-template chatml --chat-template-kwargs '{x'", 1,
     "not a JSON object", NULL},
};

/* run_sh: run cmd with /bin/sh in dir, stdout and stderr to files there,
 * killed (with its process group) after limit seconds. Returns the exit
 * status, 128 + signal for a signal, or -2 when it ran out of time; *rss_kb
 * (may be NULL) gets the largest peak resident size of its processes. */
static int run_sh_rss(const char *dir, const char *cmd, int limit, long *rss_kb);
static int run_sh(const char *dir, const char *cmd, int limit) { return run_sh_rss(dir, cmd, limit, NULL); }
static int run_sh_rss(const char *dir, const char *cmd, int limit, long *rss_kb) {
    char full[16384];
    snprintf(full, sizeof full, "cd '%s' && ( %s ) >>out.txt 2>>err.txt </dev/null", dir, cmd);
    if (getenv("MOE_TEST_VERBOSE")) fprintf(stderr, "  $ %s\n", cmd);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int st;
        struct rusage ru;
        pid_t r = wait4(pid, &st, WNOHANG, &ru); /* ru_maxrss: the largest of the shell and what it waited for */
        if (r == pid) {
            if (rss_kb) *rss_kb = ru.ru_maxrss;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        if (r < 0 && errno != EINTR) return -1;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec >= limit) {
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -2;
        }
        usleep(20000);
    }
}

/* slurp: the (truncated) contents of dir/name, NUL-terminated. */
static void slurp(const char *dir, const char *name, char *buf, size_t cap) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    buf[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

/* run_row: one case in a fresh scratch directory. */
static void run_row(int i, const struct row *r) {
    char dir[600], err[8192];
    snprintf(dir, sizeof dir, "%s/row%02d", g_root, i);
    if (mkdir(dir, 0755) != 0) {
        CHECK(0, "%s: cannot create %s", r->name, dir);
        return;
    }
    if ((r->setup && r->setup[0]) || r->hook) {
        int rc = r->setup && r->setup[0] ? run_sh(dir, r->setup, g_limit) : 0;
        if (rc != 0 || (r->hook && r->hook(dir) != 0)) {
            slurp(dir, "err.txt", err, sizeof err);
            CHECK(0, "%s: setup failed (%d): %s", r->name, rc, err);
            return;
        }
        char p[700]; /* keep only the command's messages */
        snprintf(p, sizeof p, "%s/err.txt", dir);
        unlink(p);
    }
    long rss_kb = 0;
    int rc = run_sh_rss(dir, r->cmd, g_limit, &rss_kb);
    slurp(dir, "err.txt", err, sizeof err);
    if (r->max_rss_mb)
        CHECK(rss_kb > 0 && rss_kb < (long)r->max_rss_mb * 1024, "%s: peak memory %ld MB, the limit is %d MB", r->name,
              rss_kb / 1024, r->max_rss_mb);
    if (rc == -2) {
        CHECK(0, "%s: hung (killed after %d s)", r->name, g_limit);
        return;
    }
    if (r->want_rc < 0)
        CHECK(rc >= 1 && rc <= 2, "%s: exit %d, expected a clean failure (1 or 2)\n  stderr: %s", r->name, rc, err);
    else
        CHECK(rc == r->want_rc, "%s: exit %d, expected %d\n  stderr: %s", r->name, rc, r->want_rc, err);
    if (r->want_err)
        CHECK(strstr(err, r->want_err) != NULL, "%s: stderr lacks \"%s\"\n  stderr: %s", r->name, r->want_err, err);
    if (r->after) {
        int ok = run_sh(dir, r->after, g_limit);
        CHECK(ok == 0, "%s: afterwards, \"%s\" does not hold", r->name, r->after);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test-hostile-inputs MOE-PREP MOE-RUN [SCRATCH_DIR]\n");
        return 2;
    }
    (void)moe_test_mixtral_specs; /* moe-test-model.h: only the writer is used here */
    g_prep = realpath(argv[1], NULL); /* rows run in their own directories */
    g_run = realpath(argv[2], NULL);
    if (!g_prep || !g_run) {
        fprintf(stderr, "test-hostile-inputs: cannot find %s or %s\n", argv[1], argv[2]);
        return 2;
    }
    snprintf(g_root, sizeof g_root, "%s/moe-hostile-XXXXXX", argc > 3 ? argv[3] : "/tmp");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    char models[600];
    snprintf(models, sizeof models, "%s/models", MOE_FIXTURES);
    setenv("PREP", g_prep, 1);
    setenv("RUN", g_run, 1);
    setenv("FIX", MOE_FIXTURES, 1);
    setenv("MODELS", models, 1);
    char demo[700];
    snprintf(demo, sizeof demo, "%s/../../datasets/models/tiny-moe-mixtral", MOE_FIXTURES);
    setenv("DEMO", demo, 1);
    if (getenv("MOE_TEST_TIME_LIMIT")) g_limit = atoi(getenv("MOE_TEST_TIME_LIMIT"));
    if (g_limit < 1) g_limit = 60;
    /* a context whose KV cache (256 KiB a token in the "wide" model) is 1.5 x physical memory */
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    double huge = 1.5 * ram / (256.0 * 1024.0) + 1;
    char huge_ctx[32];
    snprintf(huge_ctx, sizeof huge_ctx, "%.0f", huge > (1 << 24) ? (double)(1 << 24) : huge);
    setenv("HUGE_CTX", huge_ctx, 1);
    const char *only = getenv("MOE_TEST_ONLY"); /* a substring of the row names to run */
    int n = (int)(sizeof k_rows / sizeof k_rows[0]);
    for (int i = 0; i < n; i++)
        if (!only || strstr(k_rows[i].name, only)) run_row(i, &k_rows[i]);
    if (!fails) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
        if (system(cmd) != 0) fprintf(stderr, "test-hostile-inputs: could not remove %s\n", g_root);
    } else {
        fprintf(stderr, "test-hostile-inputs: scratch files kept in %s\n", g_root);
    }
    printf("test-hostile-inputs: %d rows, %s\n", n, fails ? "FAILED" : "ok");
    return fails != 0;
}

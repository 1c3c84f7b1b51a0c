/*
 * test-quantize-lib.c - the bundle stages as library calls, and the JSON of
 * their commands parsed back:
 *   - moe_quantize_model on a fixture into a temporary file: progress reports
 *     grow to the total, the result's sizes and bits per weight, the bundle's
 *     recipe and command line; an output naming the model's config.json is
 *     refused (file untouched); a cancel flag set half way returns
 *     MOE_ERR_CANCELLED and leaves no file (final or temporary); bad
 *     parameters are refused;
 *   - moe_inspect_bundle: the layout, precisions, recipe and provenance of
 *     that bundle, verification clean, and a flipped byte in an expert blob
 *     named; moe_inspect_to_json's keys;
 *   - moe_check_model on a sharded fixture, and a missing one;
 *   - moe_bw_run_bundle on a sensitivity file made by the command: the same
 *     choice as `moe-prep bitwidth --json`;
 *   - `moe-prep check|inspect|eval|bitwidth --json` parsed with cJSON: keys,
 *     nesting and values against the library's.
 * argv[1] = the moe-prep binary.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bitwidth.h"
#include "check.h"
#include "inspect.h"
#include "moe-base.h"
#include "moe-bundle.h"
#include "moe-file.h"
#include "moe-mmap.h"
#include "moe-test.h"
#include "quantize.h"

static const char *prep;
static char tmp[256];
static char out[1 << 18];

/* sh: run a shell command, its stdout into out; the exit status. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    out[0] = 0;
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp, name);
    return buf[k];
}

/* n_files: entries of the temporary directory whose name starts with prefix. */
static int n_files(const char *prefix) {
    DIR *d = opendir(tmp);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return n;
}

static const cJSON *item(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }
static double num(const cJSON *o, const char *key) {
    const cJSON *x = item(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}
static const char *str(const cJSON *o, const char *key) {
    const cJSON *x = item(o, key);
    return cJSON_IsString(x) ? x->valuestring : "";
}

/* ---- quantize ---- */

struct progress_log {
    int calls, monotonic;
    uint64_t last, total;
    int n_notes;
    int cancel_at;                  /* set the flag at this call (0: never) */
    volatile sig_atomic_t *flag;
};

static void on_progress(uint64_t done, uint64_t total, void *user) {
    struct progress_log *l = user;
    l->monotonic &= done >= l->last && done <= total;
    l->last = done;
    l->total = total;
    if (++l->calls == l->cancel_at) *l->flag = 1;
}

static void on_fallback(const char *note, void *user) { ((struct progress_log *)user)->n_notes++; }

static const char *k_model = MOE_FIXTURES "/models/mixtral-f32";
static double g_q8_bits; /* moe_quantize_result's bits per weight of the q8_0 experts */

static void test_quantize(void) {
    struct moe_quantize_params p = moe_quantize_default_params();
    CHECK(p.n_experts == 3 && p.experts[0] == MOE_QTYPE_Q8_0 && p.dense == MOE_QTYPE_Q8_0, "defaults");
    p.experts[0] = MOE_QTYPE_F32, p.experts[1] = MOE_QTYPE_Q8_0, p.n_experts = 2;
    p.dense = MOE_QTYPE_F32;
    p.n_threads = 2;
    p.command_line = "test-quantize-lib q.moeb";
    struct progress_log log = {0, 1, 0, 0, 0, 0, NULL};
    p.on_progress = on_progress;
    p.on_fallback = on_fallback;
    p.user = &log;
    struct moe_quantize_result r;
    enum moe_status st = moe_quantize_model(k_model, path("q.moeb"), &p, &r);
    CHECK(st == MOE_OK, "quantize: %s", moe_status_str(st));
    struct stat sb;
    CHECK(stat(path("q.moeb"), &sb) == 0 && (uint64_t)sb.st_size == r.file_bytes, "file bytes %llu",
          (unsigned long long)r.file_bytes);
    CHECK(log.calls > 2 && log.monotonic && log.last == log.total && log.total > r.input_bytes,
          "progress: %d calls, %llu of %llu (input %llu)", log.calls, (unsigned long long)log.last,
          (unsigned long long)log.total, (unsigned long long)r.input_bytes);
    /* q8_0 blocks hold 34 bytes per 32 weights; the fixture's rows of 56 (hidden) fall back to f16 */
    CHECK(r.n_experts == 2 && r.bits_per_weight[0] == 32.0 && r.bits_per_weight[1] > 8.5 &&
              r.bits_per_weight[1] < 16, "bits per weight %g, %g", r.bits_per_weight[0], r.bits_per_weight[1]);
    g_q8_bits = r.bits_per_weight[1];
    CHECK(r.n_fallbacks > 0 && r.n_fallbacks == log.n_notes && !r.refused && r.seconds > 0, "fallbacks %d, notes %d",
          r.n_fallbacks, log.n_notes);
    CHECK(n_files("q.moeb.tmp") == 0, "a temporary file is left");

    /* an output naming the model's config.json is refused, the file untouched */
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/config.json", k_model);
    struct stat before, after;
    stat(cfg, &before);
    st = moe_quantize_model(k_model, cfg, &p, &r);
    stat(cfg, &after);
    CHECK(st == MOE_ERR_INVALID && r.refused && before.st_size == after.st_size && before.st_mtime == after.st_mtime,
          "config.json as the output: %s, refused %d", moe_status_str(st), r.refused);

    /* cancelled half way: nothing left */
    static volatile sig_atomic_t flag;
    struct progress_log clog = {0, 1, 0, 0, 0, 5, &flag};
    p.user = &clog;
    p.cancel = &flag;
    st = moe_quantize_model(k_model, path("c.moeb"), &p, &r);
    CHECK(st == MOE_ERR_CANCELLED && clog.calls == 5 && n_files("c.moeb") == 0,
          "cancel: %s after %d reports, %d files", moe_status_str(st), clog.calls, n_files("c.moeb"));
    p.cancel = NULL;

    /* bad parameters */
    p.experts[1] = MOE_QTYPE_F32;
    CHECK(moe_quantize_model(k_model, path("d.moeb"), &p, &r) == MOE_ERR_INVALID && r.refused &&
              n_files("d.moeb") == 0, "a precision listed twice");
    p.n_experts = 0;
    CHECK(moe_quantize_model(k_model, path("d.moeb"), &p, &r) == MOE_ERR_INVALID && r.refused, "no precision");
    p = moe_quantize_default_params();
    st = moe_quantize_model(MOE_FIXTURES "/models/no-such-model", path("d.moeb"), &p, &r);
    CHECK(st != MOE_OK && !r.refused && n_files("d.moeb") == 0, "a missing model: %s", moe_status_str(st));
}

/* ---- inspect ---- */

static void test_inspect(void) {
    struct moe_inspect r;
    enum moe_status st = moe_inspect_bundle(path("q.moeb"), 1, &r);
    CHECK(st == MOE_OK && r.bundle, "inspect: %s", moe_status_str(st));
    if (st) {
        moe_inspect_clear(&r);
        return;
    }
    CHECK(r.have_config && !strcmp(r.cfg.arch_name, "MixtralForCausalLM"), "config");
    CHECK(r.n_layers == (uint32_t)r.cfg.n_layer && r.n_moe_layers == r.n_layers && r.n_experts == 8 &&
              r.n_precisions == 2, "layout %u layers, %u MoE, %u experts, %u precisions", r.n_layers,
          r.n_moe_layers, r.n_experts, r.n_precisions);
    CHECK(!strcmp(moe_bundle_precision_at(r.bundle, 0)->name, "f32") &&
              !strcmp(moe_bundle_precision_at(r.bundle, 1)->name, "q8_0") &&
              moe_inspect_bits_per_weight(moe_bundle_precision_at(r.bundle, 0)) == 32.0,
          "precisions");
    CHECK(r.dense_type && !strcmp(r.dense_type, "f32") && r.n_tensors > 0 && r.dense_bytes > 0, "dense");
    CHECK(r.command_line && !strcmp(r.command_line, "test-quantize-lib q.moeb") && r.tool && r.created && r.source,
          "provenance: %s", r.command_line ? r.command_line : "(none)");
    CHECK(r.verified && r.n_damaged == 0 && r.n_tuning_keys == 0, "verified clean, no tuning");

    cJSON *j = moe_inspect_to_json(&r);
    static const char *const keys[] = {"path", "format_version", "file_bytes", "architecture", "hidden", "vocab",
                                       "experts_per_token", "layers", "moe_layers", "experts", "precisions",
                                       "dense_tensors", "dense_bytes", "dense_type", "tuning", "tuning_keys",
                                       "reclaimable_bytes", "source", "tool", "created", "command_line",
                                       "verified", "damaged"};
    int i = 0;
    for (const cJSON *x = j ? j->child : NULL; x; x = x->next, i++)
        CHECK(i < (int)(sizeof keys / sizeof keys[0]) && !strcmp(x->string, keys[i]), "key %d: %s", i, x->string);
    CHECK(i == (int)(sizeof keys / sizeof keys[0]), "%d keys", i);
    CHECK(num(j, "file_bytes") == (double)r.info.file_size && cJSON_IsTrue(item(j, "verified")) &&
              cJSON_GetArraySize(item(j, "damaged")) == 0 && cJSON_IsFalse(item(j, "tuning")),
          "values");
    cJSON_Delete(j);

    /* one flipped byte in an expert blob: named */
    struct moe_bundle_blob blob;
    CHECK(moe_bundle_expert(r.bundle, 1, 2, 1, &blob) == MOE_OK, "blob");
    char *bytes = NULL;
    size_t n = 0;
    CHECK(moe_read_file(path("q.moeb"), 1 << 30, &bytes, &n) == MOE_OK, "read");
    if (bytes) {
        bytes[blob.offset + blob.stored_size / 2] ^= 0xff;
        FILE *f = fopen(path("bad.moeb"), "wb");
        fwrite(bytes, 1, n, f);
        fclose(f);
        free(bytes);
    }
    moe_inspect_clear(&r);
    st = moe_inspect_bundle(path("bad.moeb"), 1, &r);
    CHECK(st == MOE_OK && r.n_damaged == 1 && strstr(r.damaged[0].item, "layer 1 expert 2"),
          "damage named: %d items, %s", r.n_damaged, r.n_damaged ? r.damaged[0].item : "");
    moe_inspect_clear(&r);
    CHECK(moe_inspect_bundle(path("no-such.moeb"), 0, &r) != MOE_OK && !r.bundle, "missing bundle");
    moe_inspect_clear(&r);
}

/* ---- check ---- */

static void test_check(void) {
    struct moe_check_info c;
    const char *model = MOE_FIXTURES "/models/qwen2_moe-f32";
    CHECK(moe_check_model(model, &c) == MOE_OK, "check");
    CHECK(!strcmp(c.architecture, "Qwen2MoeForCausalLM") && !strcmp(c.arch, "qwen2_moe") && c.files == 3 &&
              c.tokenizer && c.experts == 6 && c.moe_layers == 2 && c.layers == 3 && !strcmp(c.format, "safetensors") &&
              c.expert_params > 0 && c.expert_params < c.params,
          "summary");
    CHECK(sh("%s check %s --json", prep, model) == 0, "check --json");
    cJSON *j = cJSON_Parse(out), *lib = moe_check_to_json(model, &c);
    CHECK(j && cJSON_Compare(j, lib, 1), "the command's JSON is the library's: %s", out);
    static const char *const keys[] = {"path", "architecture", "arch", "vocab", "hidden", "layers", "moe_layers",
                                       "heads", "kv_heads", "head_dim", "experts", "experts_per_token", "expert_ffn",
                                       "shared_expert_ffn", "params", "expert_params", "format", "files",
                                       "tokenizer"};
    int i = 0;
    for (const cJSON *x = j ? j->child : NULL; x; x = x->next, i++)
        CHECK(i < (int)(sizeof keys / sizeof keys[0]) && !strcmp(x->string, keys[i]), "key %d: %s", i, x->string);
    CHECK(i == 19 && num(j, "files") == 3 && cJSON_IsTrue(item(j, "tokenizer")) && num(j, "experts") == 6 &&
              num(j, "shared_expert_ffn") == c.shared_expert_ffn && !strcmp(str(j, "path"), model),
          "values");
    cJSON_Delete(j);
    cJSON_Delete(lib);
    CHECK(moe_check_model(MOE_FIXTURES "/models/no-such-model", &c) != MOE_OK && c.files == 0, "a missing model");
}

/* ---- the commands' JSON ---- */

static void test_inspect_json(void) {
    CHECK(sh("%s inspect %s --json --verify", prep, path("q.moeb")) == 0, "inspect --json --verify");
    cJSON *j = cJSON_Parse(out);
    struct moe_inspect r;
    CHECK(moe_inspect_bundle(path("q.moeb"), 1, &r) == MOE_OK, "inspect");
    cJSON *lib = moe_inspect_to_json(&r);
    CHECK(j && cJSON_Compare(j, lib, 1), "the command's JSON is the library's");
    const cJSON *p1 = cJSON_GetArrayItem(item(j, "precisions"), 1);
    CHECK(!strcmp(str(p1, "name"), "q8_0") && cJSON_GetArraySize(item(p1, "part_types")) == 3 &&
              num(p1, "total_bytes") == num(p1, "blob_bytes") * r.n_experts * r.n_moe_layers &&
              num(p1, "bits_per_weight") == g_q8_bits,
          "a precision's values");
    moe_inspect_clear(&r);
    cJSON_Delete(lib);
    cJSON_Delete(j);
    CHECK(sh("%s inspect %s --json --verify", prep, path("bad.moeb")) == 1, "a damaged bundle exits 1");
    j = cJSON_Parse(out);
    const cJSON *d = cJSON_GetArrayItem(item(j, "damaged"), 0);
    CHECK(cJSON_IsFalse(item(j, "verified")) && strstr(str(d, "item"), "expert") && str(d, "problem")[0],
          "damaged item in JSON");
    cJSON_Delete(j);
}

static void test_eval_json(void) {
    const char *text = MOE_FIXTURES "/demo/calibration.txt";
    CHECK(sh("%s eval %s --ref %s --dataset %s --ctx 32 --max-chunks 3 --unigram --routing -t 2 --json 2>/dev/null",
             prep, path("q.moeb"), k_model, text) == 0, "eval --json");
    cJSON *j = cJSON_Parse(out);
    CHECK(j != NULL, "eval JSON parses: %.300s", out);
    static const char *const keys[] = {"model", "ref", "dataset", "ctx", "max_chunks", "expert_precision",
                                       "threads", "bos", "dataset_tokens", "chunks", "tokens_scored", "seconds",
                                       "ppl", "nll", "ref_ppl", "ref_nll", "nll_correlation", "ln_ppl_ratio",
                                       "ppl_ratio", "ppl_diff", "kld", "delta_p", "delta_p_rms", "same_top",
                                       "unigram_ppl", "ppl_over_unigram", "routing"};
    int i = 0;
    for (const cJSON *x = j ? j->child : NULL; x; x = x->next, i++)
        CHECK(i < (int)(sizeof keys / sizeof keys[0]) && !strcmp(x->string, keys[i]), "key %d: %s", i, x->string);
    CHECK(i == (int)(sizeof keys / sizeof keys[0]), "%d keys", i);
    CHECK(num(j, "ctx") == 32 && num(j, "max_chunks") == 3 && num(j, "chunks") == 3 && num(j, "threads") == 2 &&
              num(j, "tokens_scored") == 3 * (32 - 1 - 16) && cJSON_IsNull(item(j, "expert_precision")) &&
              !strcmp(str(j, "ref"), k_model),
          "settings");
    const cJSON *kld = item(j, "kld"), *ppl = item(j, "ppl");
    CHECK(cJSON_GetArraySize(kld) == 13 && num(kld, "min") <= num(kld, "median") &&
              num(kld, "median") <= num(kld, "max") && num(kld, "mean") >= 0,
          "kld: mean, stderr and 11 percentiles");
    CHECK(fabs(num(ppl, "value") - exp(num(item(j, "nll"), "mean"))) < 1e-9 * num(ppl, "value") &&
              fabs(num(j, "ppl_over_unigram") - num(ppl, "value") / num(j, "unigram_ppl")) < 1e-12,
          "ppl = exp(nll), the unigram ratio");
    const cJSON *l0 = cJSON_GetArrayItem(item(j, "routing"), 0);
    double sum = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, item(l0, "load")) sum += v->valuedouble;
    CHECK(cJSON_GetArraySize(item(j, "routing")) > 0 && num(l0, "layer") == 0 && cJSON_GetArraySize(item(l0, "load")) == 8 &&
              sum > 0 && num(l0, "load_entropy_ratio") > 0 && num(l0, "load_entropy_ratio") <= 1,
          "routing");
    cJSON_Delete(j);
    /* through the engine: the store's stats object */
    CHECK(sh("%s eval %s --dataset %s --ctx 32 --max-chunks 2 --expert-mem 50%% -b 1 --json 2>/dev/null", prep,
             path("q.moeb"), text) == 0, "eval --json through the engine");
    j = cJSON_Parse(out);
    CHECK(cJSON_IsObject(item(j, "engine")) && cJSON_IsNull(item(j, "ref")) && !item(j, "kld"), "engine object: %.300s",
          out);
    cJSON_Delete(j);
}

/* count_evals: the number of the last evaluation the library reported. */
static void count_evals(int n, double ppl, double loss, double seconds, void *user) { *(int *)user = n; }

static void test_bitwidth(void) {
    const char *text = MOE_FIXTURES "/demo/calibration.txt";
    CHECK(sh("%s quantize %s -o %s --experts q8_0,q4_0 --dense f32 -t 2 2>/dev/null", prep, k_model,
             path("bw.moeb")) == 0, "quantize q8_0,q4_0");
    CHECK(sh("%s sensitivity %s --dataset %s --low q4_0 --base q8_0 --ctx 32 --max-tokens 256 -o %s 2>/dev/null",
             prep, path("bw.moeb"), text, path("sens.h5")) == 0, "sensitivity");
    CHECK(sh("%s bitwidth %s --sensitivity %s --dataset %s --ctx 32 --max-chunks 2 --max-loss 1000%% --no-tuning "
             "-t 2 --json 2>/dev/null", prep, path("bw.moeb"), path("sens.h5"), text) == 0, "bitwidth --json");
    cJSON *j = cJSON_Parse(out);
    CHECK(j != NULL, "bitwidth JSON parses: %.300s", out);
    struct moe_bw_run_params p = moe_bw_run_default_params();
    p.sensitivity = path("sens.h5");
    p.dataset = text;
    p.max_loss = 10;
    p.n_ctx = 32;
    p.max_chunks = 2;
    p.n_threads = 2;
    p.write_tuning = 0;
    int n_evals = 0;
    p.on_eval = count_evals;
    p.user = &n_evals;
    struct moe_bw_run run;
    enum moe_status st = moe_bw_run_bundle(path("bw.moeb"), &p, &run);
    CHECK(st == MOE_OK && run.search_done && !run.wrote_tuning && run.n == 2 * 8 && run.n_prec == 2,
          "library run: %s, %d experts", moe_status_str(st), run.n);
    CHECK(n_evals == run.result.n_cand && n_evals > 0, "%d evaluations reported, %d candidates", n_evals,
          run.result.n_cand);
    const cJSON *budget = item(j, "budget"), *chosen = item(j, "chosen");
    CHECK(num(budget, "max_loss") == 10 && cJSON_IsNull(item(budget, "max_expert_bytes")), "budget");
    CHECK(num(j, "dense_bytes") == (double)run.dense_bytes && cJSON_GetArraySize(item(j, "uniform")) == 2 &&
              !strcmp(str(cJSON_GetArrayItem(item(j, "uniform"), 0), "precision"), "q8_0") &&
              cJSON_GetArraySize(item(j, "candidates")) == run.result.n_cand,
          "uniform and candidates");
    CHECK(num(chosen, "k") == run.result.k && num(chosen, "expert_bytes") == (double)run.result.bytes &&
              num(chosen, "model_bytes") == (double)(run.result.bytes + run.dense_bytes) &&
              cJSON_GetArraySize(item(chosen, "map")) == run.n && cJSON_IsNull(item(chosen, "heldout_loss")) &&
              !item(j, "heldout") && !strcmp(str(chosen, "lower"), run.prec_names[run.result.lower]),
          "chosen: the library's choice");
    cJSON_Delete(j);
    moe_bw_run_clear(&run);
    p.max_bytes = 100; /* two budgets */
    CHECK(moe_bw_run_bundle(path("bw.moeb"), &p, &run) == MOE_ERR_INVALID && !run.search_done, "two budgets");
    moe_bw_run_clear(&run);
    p.max_loss = -1; /* nothing fits in 100 bytes */
    CHECK(moe_bw_run_bundle(path("bw.moeb"), &p, &run) == MOE_ERR_RANGE && !run.search_done, "size out of reach");
    moe_bw_run_clear(&run);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test-quantize-lib MOE-PREP\n");
        return 2;
    }
    prep = argv[1];
    moe_log_set_level((enum moe_log_level)(MOE_LOG_ERROR + 1)); /* the refusals below log errors on purpose */
    snprintf(tmp, sizeof tmp, "/tmp/moe-quantize-lib-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    test_quantize();
    test_inspect();
    test_check();
    test_inspect_json();
    test_eval_json();
    test_bitwidth();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (!fails && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    printf("test-quantize-lib: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    return fails != 0;
}

/*
 * moe-run - run an MoE model: generate text, or compute logits for given tokens.
 *
 * The CLI only parses arguments and prints; the work is in the runtime library.
 * stdout: generated text (or ids / token lists); stderr: progress and speed.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "moe-bundle.h"
#include "moe-base.h"
#include "hw-cmd.h"
#include "moe-file.h"
#include "moe-gguf.h"
#include "moe-gpu.h"
#include "moe-hw.h"
#include "moe-mmap.h"
#include "moe-model.h"
#include "moe-opt.h"
#include "moe-options.h"
#include "moe-sampler.h"
#include "moe-store.h"
#include "moe-tuning.h"
#include "profile-h5.h"
#include "moe-session.h"
#include "moe-tokenizer.h"

/* Option keys: a letter for options with a short form, these for the rest. */
enum {
    O_TOKENS = 256, O_TEMP, O_TOP_K, O_TOP_P, O_SEED, O_IGNORE_EOS, O_NO_SPECIAL, O_IDS, O_TOKENIZE, O_LOGITS_OUT,
    O_EXPERT_PRECISION, O_LITTLE_K, O_GAMMA, O_BL_PREFETCH, O_STATS_JSON, O_TRACE_OUT, O_MEASURE_HW, O_HW, O_NO_PLAN,
    O_NO_REPACK, O_VERSION,
};

/* moe-run's options by help section; the store's and the GPU's tables follow. */
static const struct moe_opt k_input[] = {
    {"prompt", 'p', MOE_OPT_REQUIRED, "TEXT", "prompt text"},
    {"file", 'f', MOE_OPT_REQUIRED, "PATH", "read the prompt from a file (- = standard input)"},
    {"tokens", O_TOKENS, MOE_OPT_REQUIRED, "IDS", "comma-separated token ids instead of text (e.g. 1,415,2)"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct moe_opt k_generation[] = {
    {"n-predict", 'n', MOE_OPT_REQUIRED, "N", "tokens to generate (default 64; 0 = only run the prompt)"},
    {"temp", O_TEMP, MOE_OPT_REQUIRED, "T", "temperature (default 0 = greedy)"},
    {"top-k", O_TOP_K, MOE_OPT_REQUIRED, "K", "keep the K most likely tokens (default 0 = off)"},
    {"top-p", O_TOP_P, MOE_OPT_REQUIRED, "P", "nucleus sampling threshold (default 1.0 = off)"},
    {"seed", O_SEED, MOE_OPT_REQUIRED, "S", "sampling seed (default 42)"},
    {"ignore-eos", O_IGNORE_EOS, MOE_OPT_NONE, NULL, "do not stop at end-of-sequence tokens"},
    {"no-special", O_NO_SPECIAL, MOE_OPT_NONE, NULL, "do not add the tokenizer's special tokens (e.g. BOS)"},
    {"ids", O_IDS, MOE_OPT_NONE, NULL, "print generated token ids (comma-separated) instead of text"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct moe_opt k_checking[] = {
    {"tokenize", O_TOKENIZE, MOE_OPT_NONE, NULL, "print the token ids of the prompt text and exit"},
    {"logits-out", O_LOGITS_OUT, MOE_OPT_REQUIRED, "FILE",
     "write raw little-endian float32 logits, one row of n_vocab\nper processed position: the prompt's positions, then each\n"
     "generated token fed back ([n_prompt + n-1] x vocab)"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct moe_opt k_runtime[] = {
    {"model", 'm', MOE_OPT_REQUIRED, "MODEL", "checkpoint directory, GGUF file or .moeb bundle (required)"},
    {"expert-precision", O_EXPERT_PRECISION, MOE_OPT_REQUIRED, "P",
     "bundles: the stored precision every expert uses (e.g. q4_k;\ndefault: the first stored)"},
    {"threads", 't', MOE_OPT_REQUIRED, "N", "CPU threads (default: all)"},
    {"ctx", 'c', MOE_OPT_REQUIRED, "N", "context length / KV cache size (default: min(model max, 4096))"},
    {"batch", 'b', MOE_OPT_REQUIRED, "N", "prompt tokens per forward chunk (default 256)"},
    {"no-repack", O_NO_REPACK, MOE_OPT_NONE, NULL,
     "CPU: keep q4_k and q8_0 weights in their stored row layout (by\ndefault they are interleaved by 16 rows at load for the AVX2\n"
     "and AVX-512 kernels; costs one copy of those weights in RAM)"},
    {"verbose", 'v', MOE_OPT_NONE, NULL, "more log output"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this help"},
    {"version", O_VERSION, MOE_OPT_NONE, NULL, "print the version and the backends of this build"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct moe_opt k_big_little[] = {
    {"little-k", O_LITTLE_K, MOE_OPT_REQUIRED, "K2",
     "decode each token with K2 experts per MoE layer (the little\nmodel; default K/2 when --gamma is given); when the largest\n"
     "next-token probability is below gamma, run the token again\nwith all K experts, prefetching them from the little pass's\n"
     "router. 0 = off. The prompt always runs with K"},
    {"gamma", O_GAMMA, MOE_OPT_REQUIRED, "G",
     "the confidence threshold in [0, 1] (default: the bundle's\nmobile.gamma from moe-prep profile, else 0.7); 0 = never fall\n"
     "back (the K2 model), 1 = always (the K model's output)"},
    {"bl-prefetch", O_BL_PREFETCH, MOE_OPT_REQUIRED, "D",
     "prefetch the big pass's experts D MoE layers ahead (default 2;\n0 = off; with an expert budget)"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct moe_opt k_statistics[] = {
    {"stats-json", O_STATS_JSON, MOE_OPT_REQUIRED, "FILE",
     "speed, peak memory and (with an expert budget) the expert\nstore's counts as JSON: hit ratios per precision, loads and\n"
     "bytes read per token, I/O stall per token, prefetch precision\nand recall, skipped experts, peak resident expert bytes"},
    {"trace-out", O_TRACE_OUT, MOE_OPT_REQUIRED, "FILE",
     "the run's routing as a profile (HDF5) that moe-prep fit-cache\ncan replay"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct moe_opt k_planning[] = {
    {"measure-hw", O_MEASURE_HW, MOE_OPT_NONE, NULL,
     "measure this machine's numbers for MODEL (storage reads,\nmemory bandwidth, expert and step times on -t threads), keep\n"
     "them in the hardware table for moe-prep plan, print them and\nexit"},
    {"hw", O_HW, MOE_OPT_REQUIRED, "FILE", "the table (default $XDG_CACHE_HOME/moe/hw.json)"},
    {"no-plan", O_NO_PLAN, MOE_OPT_NONE, NULL,
     "ignore the plan moe-prep plan --apply wrote into the bundle; by\ndefault its settings (expert memory, precisions, policy,\n"
     "big-little) are the starting point, and the options given here\noverride them one by one"},
    {NULL, 0, 0, NULL, NULL},
};

static void usage(FILE *f) {
    static const char *const examples =
"examples:\n"
"  moe-run -m tests/fixtures/models/mixtral-f32 -p \"The meaning of life\" -n 32\n"
"  moe-run -m mixtral.moeb --expert-precision q4_k -p \"The meaning of life\" -n 32\n"
"  moe-run -m mixtral-8x7b-q4_k_m.gguf -p \"The meaning of life\" -n 32\n"
"  moe-run -m mixtral.moeb --expert-mem 512M -p \"Once upon a time\" --stats-json stats.json\n"
"  moe-run -m mixtral.moeb --expert-mem 25% --policy lru --dynamic off --prefetch off -p \"Hi\"\n"
"  moe-run -m olmoe.moeb --expert-mem 2G --little-k 4 --gamma 0.7 -p \"Hi\" --stats-json s.json\n"
"  moe-run -m ./Mixtral-8x7B-v0.1 -p \"Once upon a time\" --temp 0.8 --top-p 0.95 --seed 1\n"
"  moe-run -m ./OLMoE-1B-7B --tokenize -p \"Hello world\"\n"
"  moe-run -m ./OLMoE-1B-7B --tokens 13,4,99 -n 0 --logits-out logits.f32\n"
"  moe-run -m mixtral.moeb --device cuda --expert-mem 6G --host-mem 24G -p \"Hi\" (GPU builds)\n";
    static const struct {
        const char *title;
        const struct moe_opt *table;
    } sections[] = {{"input (one of)", k_input}, {"generation", k_generation}, {"checking against references", k_checking},
                    {"runtime", k_runtime}, {"big-little decoding (MoBiLE)", k_big_little},
                    {"statistics", k_statistics}, {"planning (moe-prep plan)", k_planning}};
    fprintf(f,
"usage: moe-run -m MODEL [options]\n"
"\n"
"Run a Mixture-of-Experts model on the CPU (the reference path) or, in builds\n"
"with -DMOE_CUDA=ON, on a GPU (--device cuda; not yet verified on hardware).\n"
"MODEL is a Hugging Face checkpoint directory (config.json, *.safetensors,\n"
"tokenizer.json) of Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, Phi-MoE, DeepSeek-V2/V3\n"
"or gpt-oss, a llama.cpp GGUF file of one of them, or a .moeb bundle written by\n"
"`moe-prep quantize`.\n");
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
        fprintf(f, "\n%s:\n", sections[i].title);
        moe_opt_help(f, sections[i].table);
    }
    fprintf(f, "\n%s\n%s\n%s", moe_store_options_help(), moe_gpu_options_help(), examples);
}

struct args {
    const char *model, *prompt, *prompt_file, *tokens, *logits_out, *expert_precision;
    const char *stats_json, *trace_out;
    struct moe_store_params store;
    int use_store;
    struct moe_gpu_params gpu;
    int n_predict, top_k, n_threads, n_ctx, n_batch;
    float temp, top_p;
    unsigned long long seed;
    int ignore_eos, no_special, print_ids, tokenize, verbose;
    int little_k;       /* -1: not given */
    double gamma;       /* NaN: not given */
    int bl_prefetch;    /* -1: not given */
    int measure_hw, no_plan, no_repack;
    const char *hw;
    /* the engine options as given, applied again on top of a bundle's plan */
    int n_engine;
    const char *engine_name[64], *engine_value[64];
    struct moe_tuning_plan plan; /* the applied plan (strings the store params point to) */
    int have_plan;
};

/* parse_int: strict decimal integer in [lo, hi]. */
static int parse_int(const char *opt, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "moe-run: %s expects an integer in [%ld, %ld], got \"%s\"\n", opt, lo, hi, s);
        return 0;
    }
    *out = (int)v;
    return 1;
}

static int parse_float(const char *opt, const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || end == s || v != v) {
        fprintf(stderr, "moe-run: %s expects a number, got \"%s\"\n", opt, s);
        return 0;
    }
    *out = v;
    return 1;
}

/* engine_option: an expert-store or GPU option; store options are also
 * kept in order, to be applied again over a bundle's plan. */
static int engine_option(struct args *a, const struct moe_opt *o, const char *v) {
    char err[256];
    if (moe_store_option_takes_value(o->name) >= 0) {
        if (moe_store_parse_option(&a->store, o->name, v, err, sizeof err) != MOE_OK) {
            fprintf(stderr, "moe-run: %s\n", err);
            return 2;
        }
        if (a->n_engine == 64) {
            fprintf(stderr, "moe-run: too many engine options\n");
            return 2;
        }
        a->engine_name[a->n_engine] = o->name, a->engine_value[a->n_engine++] = v;
        return 0;
    }
    if (moe_gpu_parse_option(&a->gpu, o->name, v, err, sizeof err) != MOE_OK) {
        fprintf(stderr, "moe-run: %s\n", err);
        return 2;
    }
    return 0;
}

/* sampling_option: --temp, --top-p, --seed (checked values). */
static int sampling_option(struct args *a, int key, const char *v) {
    char opt[16];
    snprintf(opt, sizeof opt, "--%s", key == O_TEMP ? "temp" : key == O_TOP_P ? "top-p" : "seed");
    if (key == O_SEED) {
        char *end;
        a->seed = strtoull(v, &end, 10);
        if (*end || end == v || v[0] == '-') {
            fprintf(stderr, "moe-run: --seed expects a non-negative integer\n");
            return 2;
        }
        return 0;
    }
    float *out = key == O_TEMP ? &a->temp : &a->top_p;
    if (!parse_float(opt, v, out)) return 2;
    if (key == O_TEMP && (!(a->temp >= 0) || isinf(a->temp))) { /* -1 is a mistake, not "greedy" */
        fprintf(stderr, "moe-run: --temp must be a finite number >= 0 (0 = greedy), got \"%s\"\n", v);
        return 2;
    }
    if (key == O_TOP_P && (a->top_p <= 0 || a->top_p > 1)) {
        fprintf(stderr, "moe-run: --top-p must be in (0, 1]\n");
        return 2;
    }
    return 0;
}

/* on_option: one option (moe_opt_parse's handler). */
static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    struct args *a = ctx;
    char opt[64];
    snprintf(opt, sizeof opt, "--%s", o->name);
    switch (o->key) {
    case 'h': usage(stdout); return 1;
    case O_VERSION: {
        printf("moe-run %s; backends:", MOE_VERSION);
        for (int i = 0; i < moe_backend_reg_count(); i++) printf(" %s", moe_backend_reg_get(i)->name);
        printf("\n");
        return 1;
    }
    case 'm': a->model = v; return 0;
    case 'p': a->prompt = v; return 0;
    case 'f': a->prompt_file = v; return 0;
    case O_TOKENS: a->tokens = v; return 0;
    case O_EXPERT_PRECISION: a->expert_precision = v; return 0;
    case O_LOGITS_OUT: a->logits_out = v; return 0;
    case 'n': return parse_int(opt, v, 0, 1 << 24, &a->n_predict) ? 0 : 2;
    case O_TOP_K: return parse_int(opt, v, 0, 1 << 30, &a->top_k) ? 0 : 2;
    case 't': return parse_int(opt, v, 1, 1024, &a->n_threads) ? 0 : 2;
    case 'c': return parse_int(opt, v, 1, 1 << 24, &a->n_ctx) ? 0 : 2;
    case 'b': return parse_int(opt, v, 1, 1 << 16, &a->n_batch) ? 0 : 2;
    case O_TEMP: case O_TOP_P: case O_SEED: return sampling_option(a, o->key, v);
    case O_IGNORE_EOS: a->ignore_eos = 1; return 0;
    case O_NO_SPECIAL: a->no_special = 1; return 0;
    case O_IDS: a->print_ids = 1; return 0;
    case O_TOKENIZE: a->tokenize = 1; return 0;
    case 'v': a->verbose = 1; return 0;
    case O_LITTLE_K: return parse_int(opt, v, 0, 64, &a->little_k) ? 0 : 2;
    case O_GAMMA: {
        float g;
        if (!parse_float(opt, v, &g)) return 2;
        if (!(g >= 0 && g <= 1)) {
            fprintf(stderr, "moe-run: --gamma must be in [0, 1], got %s\n", v);
            return 2;
        }
        a->gamma = atof(v);
        return 0;
    }
    case O_BL_PREFETCH: return parse_int(opt, v, 0, 64, &a->bl_prefetch) ? 0 : 2;
    case O_STATS_JSON: a->stats_json = v; return 0;
    case O_TRACE_OUT: a->trace_out = v; return 0;
    case O_MEASURE_HW: a->measure_hw = 1; return 0;
    case O_NO_PLAN: a->no_plan = 1; return 0;
    case O_NO_REPACK: a->no_repack = 1; return 0;
    case O_HW: a->hw = v; return 0;
    default: return engine_option(a, o, v);
    }
}

/* parse_args: returns 0 ok, 1 help printed, 2 usage error. */
static int parse_args(int argc, char **argv, struct args *a) {
    memset(a, 0, sizeof *a);
    a->store = moe_store_default_params();
    a->gpu = moe_gpu_default_params();
    a->n_predict = 64;
    a->top_p = 1.0f;
    a->seed = 42;
    a->little_k = -1, a->gamma = NAN, a->bl_prefetch = -1;
    const struct moe_opt *tables[] = {k_input,      k_generation, k_checking,         k_runtime,           k_big_little,
                                      k_statistics, k_planning,   moe_store_option_table(), moe_gpu_option_table()};
    int first_pos = argc;
    const int rc = moe_opt_parse("moe-run", argc, argv, 1, tables, (int)(sizeof tables / sizeof tables[0]), on_option, a,
                                 &first_pos);
    if (rc) return rc;
    if (first_pos < argc) {
        fprintf(stderr, "moe-run: unexpected argument \"%s\" (options start with - or --; see moe-run --help)\n",
                argv[first_pos]);
        return 2;
    }
    a->use_store = moe_store_params_active(&a->store);
    if (!moe_device_built("moe-run", a->gpu.device_spec)) return 2;
    if (!a->model) {
        fprintf(stderr, "moe-run: no model given; use -m MODEL_DIR (see moe-run --help)\n");
        return 2;
    }
    if (a->measure_hw) return 0;
    int n_inputs = !!a->prompt + !!a->prompt_file + !!a->tokens;
    if (n_inputs != 1) {
        fprintf(stderr, "moe-run: give exactly one of -p TEXT, -f FILE or --tokens IDS\n");
        return 2;
    }
    if (a->tokenize && a->tokens) {
        fprintf(stderr, "moe-run: --tokenize needs text (-p or -f), not --tokens\n");
        return 2;
    }
    if (a->trace_out && (a->little_k > 0 || (!isnan(a->gamma) && a->little_k != 0))) {
        fprintf(stderr, "moe-run: --trace-out records top-K routing; it cannot be combined with big-little "
                        "decoding (--little-k / --gamma)\n");
        return 2;
    }
    return 0;
}

/* parse_token_list: "1,2,3" -> ids (malloc'd). */
static int parse_token_list(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16, len = 0;
    int32_t *v = malloc(cap * sizeof *v);
    const char *p = s;
    while (v && *p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            fprintf(stderr, "moe-run: --tokens: bad id at \"%.20s\" (expected e.g. 1,415,2)\n", p);
            free(v);
            return 0;
        }
        if (len == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) break;
            v = nv;
        }
        v[len++] = (int32_t)x;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    if (!v || len == 0) {
        fprintf(stderr, "moe-run: --tokens: no token ids given\n");
        free(v);
        return 0;
    }
    *ids = v;
    *n = len;
    return 1;
}

/* memory_budget: bytes this process can hope to use: physical memory, or
 * less under an address-space limit. 0 if unknown. */
static double memory_budget(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double b = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (b == 0 || (double)rl.rlim_cur < b))
        b = (double)rl.rlim_cur;
    return b;
}

/* context_fits: the float32 KV cache of n_ctx tokens (as the CPU backend
 * allocates it: layers x tokens x (K and V rows of kv heads x head_dim, or for
 * multi-head latent attention one row of kv_lora_rank + qk_rope_dim) x 4
 * bytes) fits in memory; else say how large it is and what fits. A cache
 * larger than memory would be reserved lazily and then swap or crawl for
 * hours. */
static int context_fits(const struct moe_config *c, int n_ctx) {
    const double row = c->attn == MOE_ATTN_MLA ? (double)c->kv_lora_rank + c->qk_rope_dim
                                               : 2.0 * c->n_head_kv * (double)c->head_dim;
    double per_token = c->n_layer * row * sizeof(float);
    double need = per_token * n_ctx, have = memory_budget();
    if (have <= 0 || need <= have) return 1;
    fprintf(stderr, "moe-run: a context of %d tokens needs a KV cache of %.1f GiB, more than the %.1f GiB of memory "
                    "this process can use; at most about %.0f tokens fit: use a shorter prompt or a smaller --ctx\n",
            n_ctx, need / (1u << 30), have / (1u << 30), have / per_token);
    return 0;
}

/* write_trace: the session's routing as a profile file fit-cache can replay. */
static int write_trace(const struct moe_session *sess, const struct moe_model *m, const char *model_path,
                       const char *path) {
    struct moe_session_trace tr;
    if (moe_session_trace(sess, &tr) != MOE_OK || tr.n_tokens == 0) {
        fprintf(stderr, "moe-run: no routing was recorded for --trace-out\n");
        return 0;
    }
    const size_t n = (size_t)tr.n_tokens * (size_t)tr.n_layers * (size_t)tr.k;
    int16_t *ex = malloc(sizeof *ex * (n + 1));
    int64_t *ss = malloc(sizeof *ss * ((size_t)tr.n_seq + 1));
    struct moe_profile *p = NULL;
    int ok = ex && ss;
    for (size_t i = 0; ok && i < n; i++) ex[i] = (int16_t)tr.experts[i];
    for (int i = 0; ok && i <= tr.n_seq; i++) ss[i] = tr.seq_start[i];
    struct moe_trace t = {tr.n_layers, m->cfg.n_expert, tr.k, tr.n_seq, ss, ex, tr.weights};
    ok = ok && moe_profile_new(tr.n_layers, m->cfg.n_expert, tr.k, 0, MOE_PROFILE_LOGITS_NONE, &p) == MOE_OK &&
         moe_profile_set_meta(p, moe_arch_name(m->cfg.arch), model_path, "moe-run", MOE_VERSION) == MOE_OK;
    if (ok) {
        int32_t *idx = p->moe_layer_index;
        for (int l = 0, ml = 0; l < m->cfg.n_layer; l++)
            if (m->cfg.layer_moe[l]) idx[ml++] = l;
    }
    ok = ok && moe_profile_add_trace(p, &t, NULL) == MOE_OK && moe_profile_write(p, path) == MOE_OK;
    if (!ok) fprintf(stderr, "moe-run: cannot write the trace to %s\n", path);
    moe_profile_free(p);
    free(ex);
    free(ss);
    return ok;
}

/* write_stats: speed, peak memory and the store's counts as JSON, written to
 * an exclusive temporary file beside path and renamed over it. */
/* big_little_json: big-little's counts, or null when it was off. */
static cJSON *big_little_json(const struct moe_session *sess, const struct moe_session_params *sp) {
    if (sp->little_k <= 0) return cJSON_CreateNull();
    struct moe_big_little_stats b;
    moe_session_big_little_stats(sess, &b);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "little_k", sp->little_k);
    cJSON_AddNumberToObject(o, "k", sp->n_expert_used);
    cJSON_AddNumberToObject(o, "gamma", sp->gamma);
    cJSON_AddNumberToObject(o, "prefetch_layers", sp->bl_prefetch_layers);
    cJSON_AddNumberToObject(o, "tokens", (double)b.tokens);
    cJSON_AddNumberToObject(o, "fallbacks", (double)b.fallbacks);
    if (b.tokens > 0) cJSON_AddNumberToObject(o, "fallback_ratio", (double)b.fallbacks / (double)b.tokens);
    else cJSON_AddNullToObject(o, "fallback_ratio");
    cJSON_AddNumberToObject(o, "little_s", b.little_s);
    cJSON_AddNumberToObject(o, "big_s", b.big_s);
    return o;
}

/* stats_json: speed, peak memory, the store's and big-little's counts. */
static cJSON *stats_json(const struct moe_session *sess, const struct moe_session_params *sp, size_t n_prompt,
                         double t_prompt, int n_gen, double t_gen, size_t repacked) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)n_prompt);
    cJSON_AddNumberToObject(o, "prompt_s", t_prompt);
    cJSON_AddNumberToObject(o, "tokens_per_s_prompt", t_prompt > 0 ? (double)n_prompt / t_prompt : 0.0);
    cJSON_AddNumberToObject(o, "decode_tokens", n_gen);
    cJSON_AddNumberToObject(o, "decode_s", t_gen);
    cJSON_AddNumberToObject(o, "tokens_per_s_decode", n_gen > 0 && t_gen > 0 ? (double)n_gen / t_gen : 0.0);
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)ru.ru_maxrss * 1024);
    cJSON_AddNumberToObject(o, "repacked_bytes", (double)repacked); /* moe_model_repack's copy (0: none) */
    const struct moe_store *st = moe_session_store(sess);
    if (st) {
        struct moe_store_stats ss;
        moe_store_get_stats(st, &ss);
        cJSON_AddItemToObject(o, "store", moe_store_stats_to_json(&ss));
        cJSON_AddNumberToObject(o, "store_overhead_bytes", (double)moe_store_overhead_bytes(st));
    } else {
        cJSON_AddNullToObject(o, "store");
    }
    cJSON_AddItemToObject(o, "big_little", big_little_json(sess, sp));
    cJSON_AddStringToObject(o, "backend", moe_backend_name(moe_session_backend(sess)));
    cJSON *g = moe_backend_stats_json(moe_session_backend(sess)); /* the backend's own counters (a GPU's) */
    if (g) cJSON_AddItemToObject(o, "gpu", g);
    return o;
}

/* write_stats: stats_json written to an exclusive temporary file beside path
 * and renamed over it. */
static int write_stats(const char *path, const struct moe_session *sess, const struct moe_session_params *sp,
                       size_t repacked, size_t n_prompt, double t_prompt, int n_gen, double t_gen) {
    cJSON *o = stats_json(sess, sp, n_prompt, t_prompt, n_gen, t_gen, repacked);
    char *text = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    struct moe_tmp_file t;
    FILE *f = NULL;
    if (!text || moe_tmp_create(path, &t) || !(f = moe_tmp_stream(&t))) {
        if (text) moe_tmp_discard(&t);
        cJSON_free(text);
        fprintf(stderr, "moe-run: cannot write %s (see the message above)\n", path);
        return 0;
    }
    fprintf(f, "%s\n", text);
    cJSON_free(text);
    if (moe_tmp_commit(&t)) { /* flush, fsync, rename; removes the temporary file on failure */
        fprintf(stderr, "moe-run: cannot write %s\n", path);
        return 0;
    }
    return 1;
}

/* check_outputs: no output (--logits-out, --stats-json, --trace-out) is the
 * same file as an input (the model's files, the prompt file), and no two
 * outputs name the same file (one would replace the other). 1 if fine. */
static int check_outputs(const struct moe_model *m, const struct args *a) {
    const char *out[3] = {a->logits_out, a->stats_json, a->trace_out};
    const char *in = a->prompt_file;
    for (int i = 0; i < 3; i++) {
        if (!out[i]) continue;
        if (moe_model_check_output(m, out[i]) || moe_file_check_output(out[i], &in, 1)) return 0;
        for (int j = 0; j < i; j++)
            if (out[j] && moe_file_same_target(out[i], out[j])) {
                fprintf(stderr, "moe-run: %s is named for two outputs; give each output its own file\n", out[i]);
                return 0;
            }
    }
    return 1;
}

/* print_store_stats: a short summary of the expert store on stderr. */
static void print_store_stats(const struct moe_session *sess) {
    const struct moe_store *st = moe_session_store(sess);
    if (!st) return;
    struct moe_store_stats s;
    moe_store_get_stats(st, &s);
    const double tok = s.tokens > 0 ? (double)s.tokens : 1, served = (double)(s.accesses - s.skips);
    const double dtok = s.decode_tokens > 0 ? (double)s.decode_tokens : 1;
    fprintf(stderr,
            "moe-run: experts: %s cache %d high + %d low copies%s; hits %.1f %% (high %lld, low %lld), misses %lld + %lld "
            "low, skipped %lld; %.2f loads and %.2f MB read per token, %.2f ms stalled per token (decode: %.2f, %.2f MB, "
            "%.2f ms); prefetched %lld (used %lld); peak resident %.1f MB\n",
            moe_cache_policy_name((enum moe_cache_policy)s.policy), s.high_cap, s.low_cap,
            s.dynamic ? ", dynamic precision" : "", served > 0 ? 100.0 * (double)(s.hits_high + s.hits_low) / served : 0.0,
            (long long)s.hits_high, (long long)s.hits_low, (long long)s.misses_high, (long long)s.misses_low,
            (long long)s.skips, (double)s.loads / tok, (double)s.load_bytes / tok / 1e6, 1e3 * s.stall_s / tok,
            (double)s.loads_decode / dtok, (double)s.load_bytes_decode / dtok / 1e6, 1e3 * s.stall_s_decode / dtok,
            (long long)s.prefetch_loads, (long long)s.prefetch_used, (double)s.peak_resident_bytes / 1e6);
}

/* big_little_params: --little-k / --gamma (with the bundle's mobile.gamma as
 * the default threshold) into the session params; 0 after a message. */
static int big_little_params(const struct args *a, const struct moe_model *m, struct moe_session_params *sp) {
    const struct moe_config *c = &m->cfg;
    if (a->little_k == 0 || (a->little_k < 0 && isnan(a->gamma))) return 1; /* off */
    const int K = c->n_expert_used;
    int k2 = a->little_k > 0 ? a->little_k : K / 2;
    if (k2 < 1 || k2 >= K) {
        fprintf(stderr, "moe-run: big-little needs a little model with 1 .. %d experts per token (the model routes "
                        "to %d); got %d\n", K - 1, K, k2);
        return 0;
    }
    double g = a->gamma;
    if (isnan(g)) {
        struct moe_tuning t;
        int L = 0;
        for (int l = 0; l < c->n_layer; l++) L += c->layer_moe[l] != 0;
        g = 0.7;
        if (m->bundle && L > 0 && moe_tuning_read(moe_bundle_tuning(m->bundle), L, c->n_expert, &t) == MOE_OK &&
            t.has_gamma)
            g = t.gamma;
        else
            fprintf(stderr, "moe-run: no mobile.gamma in the model's tuning (moe-prep profile writes one); gamma 0.7\n");
    }
    sp->n_expert_used = K;
    sp->little_k = k2;
    sp->gamma = g;
    if (a->bl_prefetch >= 0) sp->bl_prefetch_layers = a->bl_prefetch;
    return 1;
}

static int is_eos(const struct moe_model *m, int32_t id) {
    for (int i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos_ids[i] == id) return 1;
    return m->tok && moe_tokenizer_eos(m->tok) == id;
}

/* print_text_delta: print the bytes of decode(ids[0..n)) beyond what was printed. */
static void print_text_delta(const struct moe_tokenizer *tok, const int32_t *ids, size_t n,
                             size_t *printed) {
    char *text = NULL;
    size_t len = 0;
    if (moe_tokenizer_decode(tok, ids, n, 1, &text, &len) != MOE_OK) return;
    if (len > *printed) {
        fwrite(text + *printed, 1, len - *printed, stdout);
        fflush(stdout);
        *printed = len;
    }
    free(text);
}

/* apply_plan: a bundle's applied plan (moe-prep plan --apply) as the
 * starting point of the engine options, the ones given on the command line
 * applied again on top. 0 after a message. */
static int apply_plan(struct args *a) {
    /* only a bundle has a plan; anything else (a missing file included) the model load reports, once */
    if (a->no_plan || moe_is_dir(a->model) || access(a->model, R_OK) != 0 || moe_gguf_is_gguf_file(a->model)) return 1;
    struct moe_bundle *b = NULL;
    if (moe_bundle_open(a->model, &b) != MOE_OK) return 1; /* the model load reports it */
    uint32_t nl = 0, ne = 0, np = 0;
    moe_bundle_expert_layout(b, &nl, &ne, &np);
    int L = 0;
    for (uint32_t l = 0; l < nl; l++) L += moe_bundle_layer_has_experts(b, l);
    struct moe_tuning t;
    if (L > 0 && ne > 0 && moe_tuning_read(moe_bundle_tuning(b), L, (int)ne, &t) == MOE_OK && t.has_plan) {
        a->plan = t.plan;
        a->have_plan = 1;
    }
    moe_bundle_free(b);
    if (!a->have_plan) return 1;
    struct moe_store_params sp = moe_store_default_params();
    moe_store_params_from_plan(&sp, &a->plan);
    for (int i = 0; i < a->n_engine; i++) {
        char err[256];
        if (moe_store_parse_option(&sp, a->engine_name[i], a->engine_value[i], err, sizeof err) != MOE_OK) {
            fprintf(stderr, "moe-run: %s\n", err);
            return 0;
        }
    }
    a->store = sp;
    a->use_store = moe_store_params_active(&a->store);
    if (a->little_k < 0 && isnan(a->gamma)) {
        if (a->trace_out && a->plan.little_k > 0)
            fprintf(stderr, "moe-run: --trace-out records top-K routing: the plan's big-little decoding is off\n");
        else {
            a->little_k = a->plan.little_k;
            if (a->plan.little_k > 0) a->gamma = a->plan.gamma;
        }
    }
    fprintf(stderr, "moe-run: using the bundle's plan for %.0f MiB (moe-prep plan --apply; %.2f tok/s predicted on %d "
                    "threads): expert memory %.1f MiB%s%s, policy %s%s%s (--no-plan ignores it)\n",
            (double)a->plan.mem / 1048576, a->plan.tok_s, a->plan.threads, (double)a->plan.expert_mem / 1048576,
            a->plan.high[0] ? ", high " : "", a->plan.high, a->plan.policy,
            a->plan.dynamic ? ", dynamic precision" : "", a->plan.little_k ? ", big-little" : "");
    return 1;
}

/* One run's state, freed by run_free. */
struct run {
    struct moe_model *model;
    struct moe_session *sess;
    struct moe_sampler *sampler;
    struct moe_session_params sp;
    int32_t *ids;
    size_t n_ids;
    char *file_text;
    float *logits;         /* [n_ids x V] with --logits-out, else [V] */
    FILE *lf;              /* --logits-out's temporary file */
    struct moe_tmp_file lt;
    double t_prompt, t_gen;
    int n_gen;
    size_t repacked; /* bytes moe_model_repack copied */
};

static void run_free(struct run *r) {
    moe_tmp_discard(&r->lt);
    free(r->logits);
    free(r->ids);
    free(r->file_text);
    moe_sampler_free(r->sampler);
    moe_session_free(r->sess);
    moe_model_free(r->model);
}

/* load_model: the model, its outputs checked against its inputs. 0 ok, else
 * the exit status. */
static int load_model(const struct args *a, struct run *r) {
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = a->expert_precision;
    mp.lazy_experts = a->use_store;
    if (moe_model_load(a->model, &mp, &r->model) != MOE_OK) {
        fprintf(stderr, "moe-run: cannot load model from %s\n", a->model);
        return 1;
    }
    char what[256];
    moe_model_precision_summary(r->model, what, sizeof what);
    if (r->model->bundle) fprintf(stderr, "moe-run: experts: %s\n", what);
    return check_outputs(r->model, a) ? 0 : 2; /* never overwrite the model or the prompt file */
}

/* repack: the backend's fastest weight layouts, where it reads the CPU's
 * interleaved ones (experts too, unless the store holds them: it then
 * repacks its own copies). 1 ok. */
static int repack(const struct args *a, struct run *r) {
    if (a->no_repack || !moe_backend_supports(moe_session_backend(r->sess), MOE_BACKEND_FEAT_CPU_LAYOUTS)) return 1;
    const double t0 = moe_now_s();
    if (moe_model_repack(r->model, !a->use_store, &r->repacked) != MOE_OK) return 0;
    if (r->repacked && a->verbose)
        fprintf(stderr, "moe-run: repacked %.1f MB of weights for the CPU kernels in %.2f s\n",
                (double)r->repacked / 1e6, moe_now_s() - t0);
    return 1;
}

/* read_stdin: all of standard input (-f -), at most 1 GiB, NUL-terminated. 1 ok. */
static int read_stdin(char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    for (size_t got; b && (got = fread(b + n, 1, cap - n, stdin)) > 0;) {
        n += got;
        if (n == cap) {
            char *nb = cap < ((size_t)1 << 30) ? realloc(b, 2 * cap + 1) : NULL;
            if (!nb) {
                fprintf(stderr, "moe-run: the prompt on standard input is over 1 GiB or memory ran out\n");
                free(b);
                return 0;
            }
            b = nb, cap *= 2;
        }
    }
    if (!b || ferror(stdin)) {
        fprintf(stderr, "moe-run: cannot read the prompt from standard input\n");
        free(b);
        return 0;
    }
    b[n] = 0;
    *out = b, *len = n;
    return 1;
}

/* prompt_ids: the prompt as token ids (--tokens, or -p / -f tokenized). 0 ok,
 * else the exit status. */
static int prompt_ids(const struct args *a, struct run *r) {
    if (a->tokens) return parse_token_list(a->tokens, &r->ids, &r->n_ids) ? 0 : 2;
    const char *text = a->prompt;
    size_t text_len = text ? strlen(text) : 0;
    if (a->prompt_file) {
        if (strcmp(a->prompt_file, "-") == 0 ? !read_stdin(&r->file_text, &text_len)
                                              : moe_read_file(a->prompt_file, 1u << 30, &r->file_text, &text_len) != MOE_OK)
            return 1;
        text = r->file_text;
    }
    if (!r->model->tok) {
        fprintf(stderr, "moe-run: %s has no tokenizer.json; pass token ids with --tokens\n", a->model);
        return 1;
    }
    return moe_tokenizer_encode(r->model->tok, text, text_len, !a->no_special, &r->ids, &r->n_ids) == MOE_OK ? 0 : 1;
}

/* make_session: the session (store, backend, big-little, context) and the
 * sampler. 1 ok. */
static int make_session(struct args *a, struct run *r) {
    const struct moe_config *c = &r->model->cfg;
    struct moe_session_params *sp = &r->sp;
    *sp = moe_session_default_params();
    if (a->use_store) sp->store = &a->store;
    a->store.repack = !a->no_repack; /* the store repacks only for a backend that reads the CPU's layouts */
    sp->record_trace = a->trace_out != NULL;
    sp->device = a->gpu.device_spec;
    sp->device_options = &a->gpu;
    if (!big_little_params(a, r->model, sp)) return 0;
    sp->n_threads = a->n_threads;
    sp->n_ctx = a->n_ctx;
    sp->n_batch = a->n_batch;
    if (sp->n_ctx == 0) {
        const int need = (int)r->n_ids + a->n_predict, def = c->max_pos < 4096 ? c->max_pos : 4096;
        sp->n_ctx = need > def ? need : def;
    }
    if (!context_fits(c, sp->n_ctx) || moe_session_create(r->model, sp, &r->sess) != MOE_OK) return 0;
    if ((int)r->n_ids + a->n_predict > moe_session_n_ctx(r->sess)) {
        fprintf(stderr, "moe-run: prompt (%zu tokens) + %d to generate exceed the context of %d; raise --ctx\n",
                r->n_ids, a->n_predict, moe_session_n_ctx(r->sess));
        return 0;
    }
    struct moe_sampler_params smp = {a->temp, a->top_k, a->top_p, a->seed};
    return moe_sampler_create(&smp, c->n_vocab, &r->sampler) == MOE_OK;
}

/* run_prompt: the prompt in one forward call (all rows with --logits-out,
 * written to its temporary file). 1 ok. */
static int run_prompt(const struct args *a, struct run *r) {
    const size_t V = (size_t)r->model->cfg.n_vocab, n = r->n_ids;
    const int all = a->logits_out != NULL;
    if (!(r->logits = malloc(sizeof(float) * V * (all ? n : 1)))) return 0;
    if (a->logits_out && (moe_tmp_create(a->logits_out, &r->lt) || !(r->lf = moe_tmp_stream(&r->lt)))) {
        fprintf(stderr, "moe-run: cannot write %s (see the message above)\n", a->logits_out);
        return 0;
    }
    const double t0 = moe_now_s();
    if (moe_session_forward(r->sess, r->ids, (int)n, r->logits, all) != MOE_OK) return 0;
    const int64_t bad = moe_logits_first_bad(r->logits, V * (all ? n : 1));
    if (bad >= 0) { /* damaged weights or constants: fail loudly, never sample from NaN */
        fprintf(stderr, "moe-run: the model produced a non-finite logit (NaN or infinity) at prompt position %lld, "
                        "token %lld: its weights or config are damaged\n",
                (long long)(all ? bad / (int64_t)V : (int64_t)n - 1), (long long)(bad % (int64_t)V));
        return 0;
    }
    r->t_prompt = moe_now_s() - t0;
    if (r->lf && fwrite(r->logits, sizeof(float), V * n, r->lf) != V * n) {
        fprintf(stderr, "moe-run: write error on %s\n", r->lt.path);
        return 0;
    }
    return 1;
}

/* decode_step: feed token `next` back and check (and log) its logits. 1 ok. */
static int decode_step(struct run *r, int32_t next, int n_gen) {
    const size_t V = (size_t)r->model->cfg.n_vocab;
    float *step = r->logits; /* decode steps reuse the first row */
    if (moe_session_forward(r->sess, &next, 1, step, 0) != MOE_OK) return 0;
    if (moe_logits_first_bad(step, V) >= 0) {
        fprintf(stderr, "\nmoe-run: the model produced a non-finite logit (NaN or infinity) at generated token "
                        "%d: its weights or config are damaged\n", n_gen + 1);
        return 0;
    }
    if (r->lf && fwrite(step, sizeof(float), V, r->lf) != V) {
        fprintf(stderr, "moe-run: write error on %s\n", r->lt.path);
        return 0;
    }
    return 1;
}

/* generate: sample up to n_predict tokens, streaming text (or ids). 1 ok. */
static int generate(const struct args *a, struct run *r) {
    const size_t V = (size_t)r->model->cfg.n_vocab;
    const float *last = r->logits + (a->logits_out ? (r->n_ids - 1) * V : 0);
    int32_t *seq = malloc(sizeof(int32_t) * (r->n_ids + (size_t)a->n_predict + 1));
    if (!seq) return 0;
    memcpy(seq, r->ids, sizeof(int32_t) * r->n_ids);
    size_t n_seq = r->n_ids, printed = 0;
    const struct moe_tokenizer *tok = r->model->tok;
    if (tok && !a->print_ids) print_text_delta(tok, seq, n_seq, &printed); /* echo the prompt, then stream */
    const double t0 = moe_now_s();
    int ok = 1, n_gen = 0;
    for (; n_gen < a->n_predict; n_gen++) {
        const int32_t next = moe_sampler_sample(r->sampler, n_gen == 0 ? last : r->logits);
        seq[n_seq++] = next;
        if (a->print_ids) {
            printf("%s%d", n_gen ? "," : "", next);
            fflush(stdout);
        } else if (tok) {
            print_text_delta(tok, seq, n_seq, &printed);
        }
        if ((!a->ignore_eos && is_eos(r->model, next)) || n_gen + 1 == a->n_predict) {
            n_gen++; /* the last token is not fed back */
            break;
        }
        if (!(ok = decode_step(r, next, n_gen))) break;
    }
    r->t_gen = moe_now_s() - t0;
    r->n_gen = n_gen;
    free(seq);
    return ok;
}

/* finish: commit --logits-out, print speed and counts, write --stats-json
 * and --trace-out. 1 ok. */
static int finish(const struct args *a, struct run *r) {
    printf("\n");
    fflush(stdout);
    if (r->lf) {
        r->lf = NULL;
        if (moe_tmp_commit(&r->lt)) { /* fsync, rename; removes the temporary file on failure */
            fprintf(stderr, "moe-run: cannot write %s\n", a->logits_out);
            return 0;
        }
    }
    const double tp = r->t_prompt, tg = r->t_gen;
    fprintf(stderr, "moe-run: prompt %zu tokens in %.3f s (%.2f tok/s); generated %d tokens in %.3f s (%.2f tok/s)\n",
            r->n_ids, tp, (double)r->n_ids / (tp > 0 ? tp : 1e-9), r->n_gen, tg,
            r->n_gen > 0 ? (double)r->n_gen / (tg > 0 ? tg : 1e-9) : 0.0);
    print_store_stats(r->sess);
    if (r->sp.little_k > 0) {
        struct moe_big_little_stats b;
        moe_session_big_little_stats(r->sess, &b);
        fprintf(stderr, "moe-run: big-little: top-%d little model, gamma %.3g: %lld of %lld tokens fell back to top-%d "
                        "(%.1f %%)\n", r->sp.little_k, r->sp.gamma, (long long)b.fallbacks, (long long)b.tokens,
                r->sp.n_expert_used, b.tokens ? 100.0 * (double)b.fallbacks / (double)b.tokens : 0.0);
    }
    /* decode time counts the steps that fed a generated token back (n_gen - 1 of them) */
    if (a->stats_json && !write_stats(a->stats_json, r->sess, &r->sp, r->repacked, r->n_ids, tp, r->n_gen > 1 ? r->n_gen - 1 : 0, tg))
        return 0;
    return !a->trace_out || write_trace(r->sess, r->model, a->model, a->trace_out);
}

int main(int argc, char **argv) {
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    moe_file_cleanup_on_signals(); /* no temporary output survives Ctrl-C */
    if (!a.verbose) moe_log_set_level(MOE_LOG_WARN);
    if (a.measure_hw) return moe_hw_command(a.model, a.n_threads, a.gpu.device_spec, &a.gpu, a.hw, 0, "moe-run");
    if (!apply_plan(&a)) return 2;
    struct run r = {0};
    r.lt = (struct moe_tmp_file){NULL, NULL, -1, NULL, 0}; /* --logits-out, written beside it and renamed */
    int status = load_model(&a, &r);
    if (!status) status = prompt_ids(&a, &r);
    if (!status && a.tokenize) {
        for (size_t i = 0; i < r.n_ids; i++) printf("%s%d", i ? "," : "", r.ids[i]);
        printf("\n");
    } else if (!status && r.n_ids == 0) {
        fprintf(stderr, "moe-run: the prompt is empty after tokenization\n");
        status = 1;
    } else if (!status) {
        status = make_session(&a, &r) && repack(&a, &r) && run_prompt(&a, &r) && generate(&a, &r) && finish(&a, &r) ? 0 : 1;
    }
    run_free(&r);
    return status;
}

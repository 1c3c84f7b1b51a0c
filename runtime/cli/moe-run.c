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
#include "moe-chat.h"
#include "hw-cmd.h"
#include "moe-file.h"
#include "moe-gguf.h"
#include "moe-gpu.h"
#include "moe-graph.h"
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
    O_NO_REPACK, O_VERSION, O_CHAT, O_SYSTEM, O_CHAT_TEMPLATE, O_CHAT_KWARGS, O_RENDER_CHAT,
};

/* moe-run's options by help section; the store's and the GPU's tables follow. */
static const struct moe_opt k_input[] = {
    {"prompt", 'p', MOE_OPT_REQUIRED, "TEXT", "prompt text"},
    {"file", 'f', MOE_OPT_REQUIRED, "PATH", "read the prompt from a file (- = standard input)"},
    {"tokens", O_TOKENS, MOE_OPT_REQUIRED, "IDS", "comma-separated token ids instead of text (e.g. 1,415,2)"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct moe_opt k_chat[] = {
    {"chat", O_CHAT, MOE_OPT_NONE, NULL,
     "conversation mode (also -cnv): read user turns from standard\ninput, one a line, render the conversation with the model's\n"
     "chat template and stream each answer; the KV cache is kept\nacross turns (only a turn's new tokens are run); end of input\n"
     "ends it. -p TEXT is the first user turn"},
    {"system-prompt", O_SYSTEM, MOE_OPT_REQUIRED, "TEXT", "the conversation's system message (also -sys)"},
    {"reverse-prompt", 'r', MOE_OPT_REQUIRED, "STR",
     "also end the assistant's turn when it writes STR (shown;\nrepeatable). A turn always ends at the template's end-of-turn\n"
     "strings and the end-of-sequence token"},
    {"chat-template", O_CHAT_TEMPLATE, MOE_OPT_REQUIRED, "NAME|FILE",
     "the template to use instead of the model's: a built-in\n(chatml, deepseek, llama3, mistral, phi3, tulu), a Jinja file,\n"
     "or a JSON file with a chat_template member"},
    {"chat-template-kwargs", O_CHAT_KWARGS, MOE_OPT_REQUIRED, "JSON",
     "extra template variables, e.g. '{\"enable_thinking\": false}'"},
    {"render-chat", O_RENDER_CHAT, MOE_OPT_REQUIRED, "FILE",
     "print the prompt the chat template makes of FILE, an OpenAI\n`messages` JSON array (- = standard input), with the assistant's\n"
     "generation prompt, and exit (needs no weights)"},
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
"  moe-run -m qwen3-moe.moeb -cnv -sys \"You are terse.\" -n 256      (a chat in the terminal)\n"
"  printf 'Hi\\nAnd bye\\n' | moe-run -m M --chat --chat-template chatml -n 32\n"
"  moe-run -m ./Qwen3-30B-A3B --render-chat messages.json\n"
"  moe-run -m ./OLMoE-1B-7B --tokens 13,4,99 -n 0 --logits-out logits.f32\n"
"  moe-run -m mixtral.moeb --device cuda --expert-mem 6G --host-mem 24G -p \"Hi\" (GPU builds)\n";
    static const struct {
        const char *title;
        const struct moe_opt *table;
    } sections[] = {{"input (one of)", k_input}, {"conversation", k_chat}, {"generation", k_generation}, {"checking against references", k_checking},
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
    /* conversation */
    int chat;
    const char *system_prompt, *chat_template, *chat_kwargs, *render_chat;
    const char *reverse[16];
    int n_reverse;
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
    case O_CHAT: a->chat = 1; return 0;
    case O_SYSTEM: a->system_prompt = v; return 0;
    case O_CHAT_TEMPLATE: a->chat_template = v; return 0;
    case O_CHAT_KWARGS: a->chat_kwargs = v; return 0;
    case O_RENDER_CHAT: a->render_chat = v; return 0;
    case 'r':
        if (a->n_reverse == 16) {
            fprintf(stderr, "moe-run: at most 16 --reverse-prompt strings\n");
            return 2;
        }
        if (!v[0]) {
            fprintf(stderr, "moe-run: --reverse-prompt needs a non-empty string\n");
            return 2;
        }
        a->reverse[a->n_reverse++] = v;
        return 0;
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

/* takes_value: argv word w is an option that takes the next word as its value
 * (so that a value spelled -cnv or -sys is left alone). */
static int takes_value(const char *w) {
    const struct moe_opt *ts[] = {k_input, k_chat, k_generation, k_checking, k_runtime, k_big_little, k_statistics,
                                  k_planning, moe_store_option_table(), moe_gpu_option_table()};
    if (w[0] != '-' || !w[1] || strchr(w, '=')) return 0;
    for (size_t t = 0; t < sizeof ts / sizeof ts[0]; t++)
        for (const struct moe_opt *o = ts[t]; o->name; o++) {
            if (o->arg != MOE_OPT_REQUIRED) continue;
            if (w[1] == '-' ? !strcmp(w + 2, o->name) : (o->key > 0 && o->key < 128 && w[1] == o->key && !w[2])) return 1;
        }
    return 0;
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
    const struct moe_opt *tables[] = {k_input,      k_chat,     k_generation, k_checking,         k_runtime,           k_big_little,
                                      k_statistics, k_planning, moe_store_option_table(), moe_gpu_option_table()};
    int first_pos = argc;
    /* llama.cpp's spellings -cnv and -sys (getopt would read -cnv as -c nv): the
     * long options they stand for; an option's value is left alone */
    static char chat_opt[] = "--chat", sys_opt[] = "--system-prompt";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "-cnv")) argv[i] = chat_opt;
        else if (!strcmp(argv[i], "-sys")) argv[i] = sys_opt;
        else if (takes_value(argv[i]) && i + 1 < argc) i++;
    }
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
    if (!a->model && !(a->render_chat && a->chat_template)) {
        fprintf(stderr, "moe-run: no model given; use -m MODEL_DIR (see moe-run --help)\n");
        return 2;
    }
    if (a->measure_hw) return 0;
    if (a->render_chat) return 0;
    int n_inputs = !!a->prompt + !!a->prompt_file + !!a->tokens;
    if (a->chat) {
        if (a->prompt_file || a->tokens || a->tokenize || a->logits_out || a->print_ids) {
            fprintf(stderr, "moe-run: --chat reads the user's turns from standard input (-p TEXT may give the first); "
                            "it does not take -f, --tokens, --tokenize, --logits-out or --ids\n");
            return 2;
        }
        return 0;
    }
    if (a->system_prompt || a->n_reverse || a->chat_kwargs) {
        fprintf(stderr, "moe-run: --system-prompt, --reverse-prompt and --chat-template-kwargs belong to --chat (or "
                        "--render-chat for the kwargs)\n");
        return 2;
    }
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
                         double t_prompt, int n_gen, double t_gen, size_t repacked, cJSON *chat) {
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
    { /* decode steps as one device graph (moe-graph.h) */
        struct moe_session_graph_stats gs;
        moe_session_graph_stats(sess, &gs);
        cJSON *gj = cJSON_AddObjectToObject(o, "graphs");
        cJSON_AddNumberToObject(gj, "steps_graph", (double)gs.steps_graph);
        cJSON_AddNumberToObject(gj, "steps_plain", (double)gs.steps_plain);
        cJSON_AddStringToObject(gj, "why_plain", gs.steps_plain ? moe_graph_why_str((enum moe_graph_why)gs.last_why)
                                                                : "none");
        cJSON_AddNumberToObject(gj, "plan_ops", gs.graph_ops);
    }
    cJSON *g = moe_backend_stats_json(moe_session_backend(sess)); /* the backend's own counters (a GPU's) */
    if (g) cJSON_AddItemToObject(o, "gpu", g);
    if (chat) cJSON_AddItemToObject(o, "chat", chat); /* --chat: the turns and what each one ran */
    return o;
}

/* write_stats: stats_json written to an exclusive temporary file beside path
 * and renamed over it. */
static int write_stats(const char *path, const struct moe_session *sess, const struct moe_session_params *sp,
                       size_t repacked, size_t n_prompt, double t_prompt, int n_gen, double t_gen, cJSON *chat) {
    cJSON *o = stats_json(sess, sp, n_prompt, t_prompt, n_gen, t_gen, repacked, chat);
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
 * applied again on top (moe_engine_read_plan), and its big-little decoding
 * unless an option chose. 0 after a message. */
static int apply_plan(struct args *a) {
    const int pl = moe_engine_read_plan("moe-run", a->model, a->no_plan, a->engine_name, a->engine_value, a->n_engine,
                                        &a->store, &a->plan);
    if (pl <= 0) return pl == 0;
    a->have_plan = 1;
    a->use_store = moe_store_params_active(&a->store);
    if (a->little_k < 0 && isnan(a->gamma)) {
        if (a->trace_out && a->plan.little_k > 0)
            fprintf(stderr, "moe-run: --trace-out records top-K routing: the plan's big-little decoding is off\n");
        else {
            a->little_k = a->plan.little_k;
            if (a->plan.little_k > 0) a->gamma = a->plan.gamma;
        }
    }
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
    sp->no_graphs = a->gpu.no_graphs;
    if (!moe_engine_big_little("moe-run", a->little_k, a->gamma, a->bl_prefetch, r->model, sp)) return 0;
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
    if (a->stats_json && !write_stats(a->stats_json, r->sess, &r->sp, r->repacked, r->n_ids, tp, r->n_gen > 1 ? r->n_gen - 1 : 0, tg, NULL))
        return 0;
    return !a->trace_out || write_trace(r->sess, r->model, a->model, a->trace_out);
}

/* ---- conversation: --render-chat and --chat ------------------------------ */

/* render_chat: --render-chat FILE: the prompt the chat template makes of an
 * OpenAI `messages` array, printed as it is (no newline added). */
static int render_chat(const struct args *a) {
    char *text = NULL, *out = NULL, err[1024] = "";
    size_t len = 0;
    if (strcmp(a->render_chat, "-") == 0 ? !read_stdin(&text, &len)
                                         : moe_read_file(a->render_chat, 64u << 20, &text, &len) != MOE_OK)
        return 1;
    struct moe_chat_template *t = NULL;
    if (moe_chat_template_load(a->model, a->chat_template, &t) != MOE_OK) {
        free(text);
        return 1;
    }
    struct moe_chat_render_params p = moe_chat_render_default_params();
    p.add_generation_prompt = 1, p.extra_json = a->chat_kwargs, p.err = err, p.err_size = sizeof err;
    const enum moe_status st = moe_chat_render_json(t, text, &p, &out);
    if (st) fprintf(stderr, "moe-run: --render-chat %s: %s\n", a->render_chat, err);
    else fwrite(out, 1, strlen(out), stdout);
    fflush(stdout);
    free(out);
    free(text);
    moe_chat_template_free(t);
    return st ? 1 : 0;
}

/* One conversation's state. */
struct chat {
    struct moe_chat_template *t;
    cJSON *msgs;                /* the conversation so far (OpenAI messages) */
    int32_t *kv;                /* the tokens in the KV cache, in order */
    size_t n_kv, cap_kv;
    char *kv_text;              /* the text those tokens spell (NULL: unknown) */
    size_t kv_text_n, n_kv_prompt; /* its length; the tokens of the last prompt */
    const char *stops[48];      /* the template's end-of-turn strings, then the reverse prompts */
    int n_stops, n_template_stops;
    cJSON *turns;               /* one object a turn, for --stats-json */
    int n_turns, reprefills, n_decode, n_sampled;
    size_t prefilled, reused;
    double t_prefill, t_decode;
};

static int kv_push(struct chat *c, const int32_t *ids, size_t n) {
    if (c->n_kv + n > c->cap_kv) {
        size_t cap = c->cap_kv ? c->cap_kv : 1024;
        while (cap < c->n_kv + n) cap *= 2;
        int32_t *k = realloc(c->kv, cap * sizeof *k);
        if (!k) return 0;
        c->kv = k, c->cap_kv = cap;
    }
    memcpy(c->kv + c->n_kv, ids, n * sizeof *ids);
    c->n_kv += n;
    return 1;
}

static void add_message(cJSON *msgs, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

/* chat_prefill: the conversation rendered with the generation prompt; only
 * what the KV cache does not hold yet is run: the tokens after the cache when
 * the new rendering's tokens begin with the cache's, else the tokens of the
 * text after the cache's text when the new rendering begins with that text
 * (a turn's answer may tokenize differently once the template closes it),
 * else (a template that rewrites earlier turns) everything, after a reset.
 * The last position's logits end in r->logits. 1 ok. */
static int chat_prefill(const struct args *a, struct run *r, struct chat *c, cJSON *turn) {
    char *msgs = cJSON_PrintUnformatted(c->msgs), *prompt = NULL, err[1024] = "";
    struct moe_chat_render_params p = moe_chat_render_default_params();
    p.add_generation_prompt = 1, p.extra_json = a->chat_kwargs, p.err = err, p.err_size = sizeof err;
    enum moe_status st = msgs ? moe_chat_render_json(c->t, msgs, &p, &prompt) : MOE_ERR_NOMEM;
    free(msgs);
    if (st) {
        fprintf(stderr, "moe-run: the chat template failed: %s\n", err[0] ? err : moe_status_str(st));
        return 0;
    }
    const size_t plen = strlen(prompt);
    const struct moe_tokenizer *tok = r->model->tok;
    int32_t *ids = NULL, *run_ids = NULL;
    size_t n = 0, n_run = 0, same = 0;
    st = moe_tokenizer_encode(tok, prompt, plen, 0, &ids, &n); /* the template writes BOS itself */
    while (!st && same < c->n_kv && same < n && c->kv[same] == ids[same]) same++;
    const char *how = "all of it";
    if (st) {
    } else if (c->n_kv && same == c->n_kv && same < n) {
        run_ids = ids + same, n_run = n - same, how = "its new tokens";
    } else if (c->n_kv && c->kv_text && plen > c->kv_text_n && !memcmp(prompt, c->kv_text, c->kv_text_n)) {
        int32_t *sfx = NULL;
        size_t ns = 0;
        st = moe_tokenizer_encode(tok, prompt + c->kv_text_n, plen - c->kv_text_n, 0, &sfx, &ns);
        free(ids);
        ids = sfx, run_ids = sfx, n_run = ns, same = c->n_kv, how = "the tokens of its new text";
    } else {
        if (a->verbose && c->n_kv) {
            const char *x = same < c->n_kv ? moe_tokenizer_token(tok, c->kv[same]) : NULL;
            const char *y = same < n ? moe_tokenizer_token(tok, ids[same]) : NULL;
            fprintf(stderr, "moe-run: the new rendering leaves the KV cache at token %zu of %zu (cache \"%s\", now \"%s\") "
                            "and its text: running it again from there\n", same, c->n_kv, x ? x : "", y ? y : "");
        }
        if (same >= n) same = n ? n - 1 : 0; /* rerun at least the last token, for its logits */
        if (c->n_kv && same > 0 && moe_session_seq_truncate(r->sess, 0, (int)same) == MOE_OK) {
            c->n_kv = same, run_ids = ids + same, n_run = n - same, how = "from the tokens it shares with the cache";
            c->reprefills++;
        } else {
            if (c->n_kv) {
                moe_session_reset(r->sess);
                c->reprefills++;
            }
            c->n_kv = 0, same = 0, run_ids = ids, n_run = n;
        }
    }
    int ok = !st && n_run > 0;
    if (ok && (int)(same + n_run) + a->n_predict > moe_session_n_ctx(r->sess)) {
        fprintf(stderr, "moe-run: the conversation (%zu tokens) + %d to generate exceed the context of %d; start again "
                        "with a larger --ctx\n", same + n_run, a->n_predict, moe_session_n_ctx(r->sess));
        ok = 0;
    }
    const double t0 = moe_now_s();
    if (ok && moe_session_forward(r->sess, run_ids, (int)n_run, r->logits, 0) != MOE_OK) ok = 0;
    if (ok && moe_logits_first_bad(r->logits, (size_t)r->model->cfg.n_vocab) >= 0) {
        fprintf(stderr, "moe-run: the model produced a non-finite logit (NaN or infinity): its weights or config are damaged\n");
        ok = 0;
    }
    c->t_prefill += moe_now_s() - t0;
    if (ok && !kv_push(c, run_ids, n_run)) ok = 0;
    c->prefilled += n_run, c->reused += same;
    c->n_kv_prompt = c->n_kv;
    free(c->kv_text);
    c->kv_text = prompt, c->kv_text_n = plen;
    cJSON_AddNumberToObject(turn, "prompt_tokens", (double)(same + n_run));
    cJSON_AddNumberToObject(turn, "reused_tokens", (double)same);
    cJSON_AddNumberToObject(turn, "prefilled_tokens", (double)n_run);
    if (a->verbose)
        fprintf(stderr, "moe-run: turn %d: %zu prompt tokens, %zu reused from the KV cache, %zu run (%s)\n", c->n_turns + 1,
                same + n_run, same, n_run, how);
    free(ids);
    return ok;
}

/* chat_kv_text: after a turn, the cache's text: the prompt's, then the text
 * the answer's tokens run into the cache add to it (decoded with what came
 * before, so that a decoder's leading-space rule does not apply to them). */
static void chat_kv_text(const struct run *r, struct chat *c) {
    char *all = NULL, *pre = NULL;
    size_t na = 0, np = 0;
    const struct moe_tokenizer *tok = r->model->tok;
    int known = c->kv_text && moe_tokenizer_decode(tok, c->kv, c->n_kv, 0, &all, &na) == MOE_OK &&
                moe_tokenizer_decode(tok, c->kv, c->n_kv_prompt, 0, &pre, &np) == MOE_OK && np <= na && !memcmp(all, pre, np);
    char *t = known ? realloc(c->kv_text, c->kv_text_n + (na - np) + 1) : NULL;
    if (t) {
        memcpy(t + c->kv_text_n, all + np, na - np);
        c->kv_text_n += na - np;
        t[c->kv_text_n] = 0;
        c->kv_text = t;
    } else {
        free(c->kv_text);
        c->kv_text = NULL, c->kv_text_n = 0;
    }
    free(all);
    free(pre);
}

/* stop_at: the first end-of-turn string in text[0..n): its start (*end: where
 * the shown text ends: before a template stop, after a reverse prompt); -1 if none. */
static long stop_at(const struct chat *c, const char *text, size_t n, size_t *end) {
    long best = -1;
    for (int i = 0; i < c->n_stops; i++) {
        const size_t l = strlen(c->stops[i]);
        for (size_t k = 0; k + l <= n && (best < 0 || (long)k < best); k++)
            if (!memcmp(text + k, c->stops[i], l)) {
                best = (long)k;
                *end = k + (i >= c->n_template_stops ? l : 0);
                break;
            }
    }
    return best;
}

/* held_back: how many bytes at the end of text could begin an end-of-turn string. */
static size_t held_back(const struct chat *c, const char *text, size_t n) {
    size_t hold = 0;
    for (int i = 0; i < c->n_stops; i++) {
        const size_t l = strlen(c->stops[i]);
        for (size_t k = l - 1; k > hold; k--)
            if (k <= n && !memcmp(text + n - k, c->stops[i], k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* chat_generate: sample the assistant's answer, streaming its text, until an
 * end-of-turn token or string, a reverse prompt or -n tokens; the answer is
 * added to the conversation. 1 ok. */
static int chat_generate(const struct args *a, struct run *r, struct chat *c, cJSON *turn) {
    const struct moe_tokenizer *tok = r->model->tok;
    int32_t *gen = malloc(sizeof(int32_t) * ((size_t)a->n_predict + 1));
    char *text = NULL;
    size_t tlen = 0, printed = 0, shown = 0;
    const char *why = "length";
    int ok = gen != NULL, ng = 0, found = 0;
    const double t0 = moe_now_s();
    for (int i = 0; ok && i < a->n_predict; i++) {
        const int32_t next = moe_sampler_sample(r->sampler, r->logits);
        c->n_sampled++;
        const char *piece = moe_tokenizer_token(tok, next);
        int stop_tok = !a->ignore_eos && is_eos(r->model, next);
        for (int k = 0; piece && k < c->n_template_stops && !stop_tok; k++) stop_tok = !strcmp(piece, c->stops[k]);
        if (stop_tok) {
            why = "stop";
            break;
        }
        gen[ng++] = next;
        free(text);
        text = NULL;
        if (moe_tokenizer_decode(tok, gen, (size_t)ng, 0, &text, &tlen) != MOE_OK) {
            ok = 0;
            break;
        }
        size_t end;
        if (stop_at(c, text, tlen, &end) >= 0) {
            shown = end, found = 1, why = "stop";
            break;
        }
        const size_t safe = tlen - held_back(c, text, tlen);
        if (safe > printed) {
            fwrite(text + printed, 1, safe - printed, stdout);
            fflush(stdout);
            printed = safe;
        }
        if (i + 1 == a->n_predict) break; /* the last token is not run */
        if (!(ok = decode_step(r, next, i)) || !(ok = kv_push(c, &next, 1))) break;
        c->n_decode++;
    }
    c->t_decode += moe_now_s() - t0;
    if (!found) shown = tlen;
    if (ok && shown > printed) fwrite(text + printed, 1, shown - printed, stdout);
    printf("\n");
    fflush(stdout);
    if (ok) {
        char *content = malloc(shown + 1);
        if (content) {
            memcpy(content, text ? text : "", shown);
            content[shown] = 0;
            add_message(c->msgs, "assistant", content);
            free(content);
        } else {
            ok = 0;
        }
    }
    cJSON_AddNumberToObject(turn, "generated_tokens", ng);
    cJSON_AddStringToObject(turn, "stop", why);
    free(text);
    free(gen);
    return ok;
}

/* read_turn: the next non-empty line of standard input (newline removed);
 * NULL at the end of input. */
static char *read_turn(char **line, size_t *cap) {
    for (;;) {
        if (isatty(STDIN_FILENO)) {
            printf("> ");
            fflush(stdout);
        }
        ssize_t n = getline(line, cap, stdin);
        if (n < 0) return NULL;
        while (n > 0 && ((*line)[n - 1] == '\n' || (*line)[n - 1] == '\r')) (*line)[--n] = 0;
        for (ssize_t i = 0; i < n; i++)
            if ((*line)[i] != ' ' && (*line)[i] != '\t') return *line;
    }
}

/* chat_setup: the template, its stops and the reverse prompts, the system message. 1 ok. */
static int chat_setup(const struct args *a, struct run *r, struct chat *c) {
    if (!r->model->tok) {
        fprintf(stderr, "moe-run: %s has no tokenizer; --chat needs one\n", a->model);
        return 0;
    }
    if (moe_chat_template_load(a->model, a->chat_template, &c->t) != MOE_OK) return 0;
    for (const char *const *s = moe_chat_template_stops(c->t); *s && c->n_stops < 32; s++) c->stops[c->n_stops++] = *s;
    c->n_template_stops = c->n_stops;
    for (int i = 0; i < a->n_reverse; i++) c->stops[c->n_stops++] = a->reverse[i];
    c->msgs = cJSON_CreateArray();
    c->turns = cJSON_CreateArray();
    if (a->system_prompt) add_message(c->msgs, "system", a->system_prompt);
    if (!(r->logits = malloc(sizeof(float) * (size_t)r->model->cfg.n_vocab))) return 0;
    if (a->verbose) {
        fprintf(stderr, "moe-run: chat: a turn ends at");
        for (int i = 0; i < c->n_stops; i++) fprintf(stderr, " \"%s\"", c->stops[i]);
        fprintf(stderr, " and the end-of-sequence token\n");
    }
    return 1;
}

/* chat_finish: the session's speed and counts, --stats-json with a "chat"
 * object (its turns), --trace-out. 1 ok. */
static int chat_finish(const struct args *a, struct run *r, struct chat *c) {
    fprintf(stderr, "moe-run: chat: %d turns; ran %zu prompt tokens in %.3f s (%zu reused from the KV cache, %d "
                    "re-runs); generated %d tokens in %.3f s (%.2f tok/s)\n",
            c->n_turns, c->prefilled, c->t_prefill, c->reused, c->reprefills, c->n_sampled, c->t_decode,
            c->n_sampled > 0 && c->t_decode > 0 ? c->n_sampled / c->t_decode : 0.0);
    print_store_stats(r->sess);
    if (a->stats_json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "turns", c->n_turns);
        cJSON_AddNumberToObject(o, "prefilled_tokens", (double)c->prefilled);
        cJSON_AddNumberToObject(o, "reused_tokens", (double)c->reused);
        cJSON_AddNumberToObject(o, "reprefills", c->reprefills);
        cJSON_AddItemToObject(o, "turn", c->turns);
        c->turns = NULL;
        if (!write_stats(a->stats_json, r->sess, &r->sp, r->repacked, c->prefilled, c->t_prefill, c->n_decode, c->t_decode, o))
            return 0;
    }
    return !a->trace_out || write_trace(r->sess, r->model, a->model, a->trace_out);
}

/* run_chat: --chat: turns read from standard input until its end. 0 ok, else the exit status. */
static int run_chat(struct args *a, struct run *r) {
    struct chat c;
    memset(&c, 0, sizeof c);
    char *line = NULL;
    size_t cap = 0;
    int ok = chat_setup(a, r, &c);
    const char *user = a->prompt;
    while (ok && (user || (user = read_turn(&line, &cap)))) {
        add_message(c.msgs, "user", user);
        cJSON *turn = cJSON_CreateObject();
        cJSON_AddItemToArray(c.turns, turn);
        ok = chat_prefill(a, r, &c, turn) && chat_generate(a, r, &c, turn);
        if (ok) chat_kv_text(r, &c);
        c.n_turns++;
        user = NULL;
    }
    if (ok) ok = chat_finish(a, r, &c);
    free(line);
    free(c.kv);
    free(c.kv_text);
    cJSON_Delete(c.msgs);
    cJSON_Delete(c.turns);
    moe_chat_template_free(c.t);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    moe_file_cleanup_on_signals(); /* no temporary output survives Ctrl-C */
    if (!a.verbose) moe_log_set_level(MOE_LOG_WARN);
    if (a.measure_hw) return moe_hw_command(a.model, a.n_threads, a.gpu.device_spec, &a.gpu, a.hw, 0, "moe-run");
    if (a.render_chat) return render_chat(&a);
    if (!apply_plan(&a)) return 2;
    struct run r = {0};
    r.lt = (struct moe_tmp_file){NULL, NULL, -1, NULL, 0}; /* --logits-out, written beside it and renamed */
    int status = load_model(&a, &r);
    if (a.chat) {
        if (!status) status = make_session(&a, &r) && repack(&a, &r) ? run_chat(&a, &r) : 1;
        run_free(&r);
        return status;
    }
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

/*
 * moe-run - run an MoE model: generate text, or compute logits for given tokens.
 *
 * The CLI only parses arguments and prints; the work is in the runtime library.
 * stdout: generated text (or ids / token lists); stderr: progress and speed.
 */
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
#include "moe-gpu.h"
#include "moe-hw.h"
#include "moe-mmap.h"
#include "moe-model.h"
#include "moe-sampler.h"
#include "moe-store.h"
#include "moe-tuning.h"
#include "profile-h5.h"
#include "moe-session.h"
#include "moe-tokenizer.h"
#ifdef MOE_HAVE_CUDA
#include "moe-cuda.h"
#endif

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
    fprintf(f,
"usage: moe-run -m MODEL [options]\n"
"\n"
"Run a Mixture-of-Experts model on the CPU (the reference path) or, in builds\n"
"with -DMOE_CUDA=ON, on a GPU (--device cuda; not yet verified on hardware).\n"
"MODEL is a Hugging Face checkpoint directory (config.json, *.safetensors,\n"
"tokenizer.json) of Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, Phi-MoE, DeepSeek-V2/V3\n"
"or gpt-oss, a llama.cpp GGUF file of one of them, or a .moeb bundle written by\n"
"`moe-prep quantize`.\n"
"\n"
"input (one of):\n"
"  -p, --prompt TEXT       prompt text\n"
"  -f, --file PATH         read the prompt from a file\n"
"      --tokens IDS        comma-separated token ids instead of text (e.g. 1,415,2)\n"
"\n"
"generation:\n"
"  -n, --n-predict N       tokens to generate (default 64; 0 = only run the prompt)\n"
"      --temp T            temperature (default 0 = greedy)\n"
"      --top-k K           keep the K most likely tokens (default 0 = off)\n"
"      --top-p P           nucleus sampling threshold (default 1.0 = off)\n"
"      --seed S            sampling seed (default 42)\n"
"      --ignore-eos        do not stop at end-of-sequence tokens\n"
"      --no-special        do not add the tokenizer's special tokens (e.g. BOS)\n"
"      --ids               print generated token ids (comma-separated) instead of text\n"
"\n"
"checking against references:\n"
"      --tokenize          print the token ids of the prompt text and exit\n"
"      --logits-out FILE   write raw little-endian float32 logits, one row of\n"
"                          n_vocab per processed position: the prompt's positions,\n"
"                          then each generated token fed back ([n_prompt + n-1] x vocab)\n"
"\n"
"runtime:\n"
"      --expert-precision P  bundles: the stored precision every expert uses\n"
"                          (e.g. q4_k; default: the first stored)\n"
"  -t, --threads N         CPU threads (default: all)\n"
"  -c, --ctx N             context length / KV cache size (default: min(model max, 4096))\n"
"  -b, --batch N           prompt tokens per forward chunk (default 256)\n"
"  -v, --verbose           more log output\n"
"  -h, --help              this help\n"
"\n"
"big-little decoding (MoBiLE):\n"
"      --little-k K2       decode each token with K2 experts per MoE layer (the little\n"
"                          model; default K/2 when --gamma is given); when the largest\n"
"                          next-token probability is below gamma, run the token again\n"
"                          with all K experts, prefetching them from the little pass's\n"
"                          router. 0 = off. The prompt always runs with K\n"
"      --gamma G           the confidence threshold in [0, 1] (default: the bundle's\n"
"                          mobile.gamma from moe-prep profile, else 0.7); 0 = never fall\n"
"                          back (the K2 model), 1 = always (the K model's output)\n"
"      --bl-prefetch D     prefetch the big pass's experts D MoE layers ahead (default 2;\n"
"                          0 = off; with an expert budget)\n"
"\n"
"statistics:\n"
"      --stats-json FILE   speed, peak memory and (with an expert budget) the expert\n"
"                          store's counts as JSON: hit ratios per precision, loads and\n"
"                          bytes read per token, I/O stall per token, prefetch precision\n"
"                          and recall, skipped experts, peak resident expert bytes\n"
"      --trace-out FILE    the run's routing as a profile (HDF5) that moe-prep fit-cache\n"
"                          can replay\n"
"\n"
"planning (moe-prep plan):\n"
"      --measure-hw        measure this machine's numbers for MODEL (storage reads, memory\n"
"                          bandwidth, expert and step times on -t threads), keep them in the\n"
"                          hardware table for moe-prep plan, print them and exit\n"
"      --hw FILE           the table (default $XDG_CACHE_HOME/moe/hw.json)\n"
"      --no-plan           ignore the plan moe-prep plan --apply wrote into the bundle; by\n"
"                          default its settings (expert memory, precisions, policy,\n"
"                          big-little) are the starting point, and the options given here\n"
"                          override them one by one\n"
"\n");
    fputs(moe_store_options_help(), f);
    fprintf(f, "\n");
    fputs(moe_gpu_options_help(), f);
    fprintf(f, "\n%s", examples);
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
    int measure_hw, no_plan;
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

/* parse_args: returns 0 ok, 1 help printed, 2 usage error. */
static int parse_args(int argc, char **argv, struct args *a) {
    memset(a, 0, sizeof *a);
    a->store = moe_store_default_params();
    a->gpu = moe_gpu_default_params();
    a->n_predict = 64;
    a->top_p = 1.0f;
    a->seed = 42;
    a->little_k = -1, a->gamma = NAN, a->bl_prefetch = -1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
#define IS(s, l) (!strcmp(o, s) || !strcmp(o, l))
#define NEXT()                                                                  \
    (i + 1 < argc ? argv[++i]                                                   \
                  : (fprintf(stderr, "moe-run: %s needs a value\n", o), (char *)NULL))
        const char *v;
        if (IS("-h", "--help")) {
            usage(stdout);
            return 1;
        } else if (IS("-m", "--model")) {
            if (!(a->model = NEXT())) return 2;
        } else if (IS("-p", "--prompt")) {
            if (!(a->prompt = NEXT())) return 2;
        } else if (IS("-f", "--file")) {
            if (!(a->prompt_file = NEXT())) return 2;
        } else if (!strcmp(o, "--tokens")) {
            if (!(a->tokens = NEXT())) return 2;
        } else if (!strcmp(o, "--expert-precision")) {
            if (!(a->expert_precision = NEXT())) return 2;
        } else if (!strcmp(o, "--logits-out")) {
            if (!(a->logits_out = NEXT())) return 2;
        } else if (IS("-n", "--n-predict")) {
            if (!(v = NEXT()) || !parse_int(o, v, 0, 1 << 24, &a->n_predict)) return 2;
        } else if (!strcmp(o, "--top-k")) {
            if (!(v = NEXT()) || !parse_int(o, v, 0, 1 << 30, &a->top_k)) return 2;
        } else if (IS("-t", "--threads")) {
            if (!(v = NEXT()) || !parse_int(o, v, 1, 1024, &a->n_threads)) return 2;
        } else if (IS("-c", "--ctx")) {
            if (!(v = NEXT()) || !parse_int(o, v, 1, 1 << 24, &a->n_ctx)) return 2;
        } else if (IS("-b", "--batch")) {
            if (!(v = NEXT()) || !parse_int(o, v, 1, 1 << 16, &a->n_batch)) return 2;
        } else if (!strcmp(o, "--temp")) {
            if (!(v = NEXT()) || !parse_float(o, v, &a->temp)) return 2;
            if (!(a->temp >= 0) || isinf(a->temp)) { /* -1 is a mistake, not "greedy" */
                fprintf(stderr, "moe-run: --temp must be a finite number >= 0 (0 = greedy), got \"%s\"\n", v);
                return 2;
            }
        } else if (!strcmp(o, "--top-p")) {
            if (!(v = NEXT()) || !parse_float(o, v, &a->top_p)) return 2;
            if (a->top_p <= 0 || a->top_p > 1) {
                fprintf(stderr, "moe-run: --top-p must be in (0, 1]\n");
                return 2;
            }
        } else if (!strcmp(o, "--seed")) {
            char *end;
            if (!(v = NEXT())) return 2;
            a->seed = strtoull(v, &end, 10);
            if (*end || end == v) {
                fprintf(stderr, "moe-run: --seed expects a non-negative integer\n");
                return 2;
            }
        } else if (!strcmp(o, "--ignore-eos")) {
            a->ignore_eos = 1;
        } else if (!strcmp(o, "--no-special")) {
            a->no_special = 1;
        } else if (!strcmp(o, "--ids")) {
            a->print_ids = 1;
        } else if (!strcmp(o, "--tokenize")) {
            a->tokenize = 1;
        } else if (IS("-v", "--verbose")) {
            a->verbose = 1;
        } else if (!strcmp(o, "--little-k")) {
            if (!(v = NEXT()) || !parse_int(o, v, 0, 64, &a->little_k)) return 2;
        } else if (!strcmp(o, "--gamma")) {
            float g;
            if (!(v = NEXT()) || !parse_float(o, v, &g)) return 2;
            if (!(g >= 0 && g <= 1)) {
                fprintf(stderr, "moe-run: --gamma must be in [0, 1], got %s\n", v);
                return 2;
            }
            a->gamma = atof(v);
        } else if (!strcmp(o, "--bl-prefetch")) {
            if (!(v = NEXT()) || !parse_int(o, v, 0, 64, &a->bl_prefetch)) return 2;
        } else if (!strcmp(o, "--stats-json")) {
            if (!(a->stats_json = NEXT())) return 2;
        } else if (!strcmp(o, "--trace-out")) {
            if (!(a->trace_out = NEXT())) return 2;
        } else if (!strcmp(o, "--measure-hw")) {
            a->measure_hw = 1;
        } else if (!strcmp(o, "--no-plan")) {
            a->no_plan = 1;
        } else if (!strcmp(o, "--hw")) {
            if (!(a->hw = NEXT())) return 2;
        } else if (moe_store_option_takes_value(o) >= 0) {
            const int takes = moe_store_option_takes_value(o);
            char err[256];
            if (takes && !(v = NEXT())) return 2;
            if (moe_store_parse_option(&a->store, o, takes ? v : NULL, err, sizeof err) != MOE_OK) {
                fprintf(stderr, "moe-run: %s\n", err);
                return 2;
            }
            if (a->n_engine == 64) {
                fprintf(stderr, "moe-run: too many engine options\n");
                return 2;
            }
            a->engine_name[a->n_engine] = o, a->engine_value[a->n_engine++] = takes ? v : NULL;
        } else if (moe_gpu_option_takes_value(o) >= 0) {
            const int takes = moe_gpu_option_takes_value(o);
            char err[256];
            if (takes && !(v = NEXT())) return 2;
            if (moe_gpu_parse_option(&a->gpu, o, takes ? v : NULL, err, sizeof err) != MOE_OK) {
                fprintf(stderr, "moe-run: %s\n", err);
                return 2;
            }
        } else {
            fprintf(stderr, "moe-run: unknown option \"%s\" (see moe-run --help)\n", o);
            return 2;
        }
#undef IS
#undef NEXT
    }
    a->use_store = moe_store_params_active(&a->store);
#ifndef MOE_HAVE_CUDA
    if (a->gpu.device >= 0) {
        fprintf(stderr, "moe-run: --device cuda needs a build with -DMOE_CUDA=ON\n");
        return 2;
    }
#endif
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
static int write_stats(const char *path, const struct moe_session *sess, const struct moe_session_params *sp,
                       size_t n_prompt, double t_prompt, int n_gen, double t_gen) {
    struct moe_tmp_file t;
    FILE *f = NULL;
    if (moe_tmp_create(path, &t) || !(f = moe_tmp_stream(&t))) {
        moe_tmp_discard(&t);
        fprintf(stderr, "moe-run: cannot write %s (see the message above)\n", path);
        return 0;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(f, "{\"prompt_tokens\": %zu, \"prompt_s\": %.6f, \"tokens_per_s_prompt\": %.6g, "
               "\"decode_tokens\": %d, \"decode_s\": %.6f, \"tokens_per_s_decode\": %.6g, \"peak_rss_bytes\": %lld, "
               "\"store\": ",
            n_prompt, t_prompt, t_prompt > 0 ? (double)n_prompt / t_prompt : 0.0, n_gen, t_gen,
            n_gen > 0 && t_gen > 0 ? (double)n_gen / t_gen : 0.0, (long long)ru.ru_maxrss * 1024);
    const struct moe_store *st = moe_session_store(sess);
    if (st) {
        struct moe_store_stats ss;
        moe_store_get_stats(st, &ss);
        moe_store_stats_json(&ss, f);
        fprintf(f, ", \"store_overhead_bytes\": %lld", (long long)moe_store_overhead_bytes(st));
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ", \"big_little\": ");
    if (sp->little_k > 0) {
        struct moe_big_little_stats b;
        moe_session_big_little_stats(sess, &b);
        fprintf(f, "{\"little_k\": %d, \"k\": %d, \"gamma\": %.9g, \"prefetch_layers\": %d, \"tokens\": %lld, "
                   "\"fallbacks\": %lld, \"fallback_ratio\": ",
                sp->little_k, sp->n_expert_used, sp->gamma, sp->bl_prefetch_layers, (long long)b.tokens,
                (long long)b.fallbacks);
        if (b.tokens > 0) fprintf(f, "%.9g", (double)b.fallbacks / (double)b.tokens);
        else fprintf(f, "null");
        fprintf(f, ", \"little_s\": %.6f, \"big_s\": %.6f}", b.little_s, b.big_s);
    } else {
        fprintf(f, "null");
    }
#ifdef MOE_HAVE_CUDA
    struct moe_cuda_stats cs;
    if (moe_session_backend(sess) && moe_backend_cuda_stats(moe_session_backend(sess), &cs) == MOE_OK) {
        fprintf(f, ", \"gpu\": ");
        moe_cuda_stats_json(&cs, f);
    }
#endif
    fprintf(f, "}\n");
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
    if (a->no_plan || moe_is_dir(a->model)) return 1;
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

int main(int argc, char **argv) {
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    if (!a.verbose) moe_log_set_level(MOE_LOG_WARN);
    if (a.measure_hw) return moe_hw_command(a.model, a.n_threads, a.hw, 0, "moe-run");
    if (!apply_plan(&a)) return 2;

    struct moe_model *model = NULL;
    struct moe_session *sess = NULL;
    struct moe_sampler *sampler = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *file_text = NULL;
    float *logits = NULL;
    FILE *lf = NULL;
    struct moe_tmp_file lt = {NULL, NULL, -1, NULL}; /* --logits-out, written beside it and renamed */
    int status = 1;

    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = a.expert_precision;
    mp.lazy_experts = a.use_store;
    if (moe_model_load(a.model, &mp, &model) != MOE_OK) {
        fprintf(stderr, "moe-run: cannot load model from %s\n", a.model);
        goto done;
    }
    {
        char what[256];
        moe_model_precision_summary(model, what, sizeof what);
        if (model->bundle) fprintf(stderr, "moe-run: experts: %s\n", what);
    }
    const struct moe_config *c = &model->cfg;
    if (!check_outputs(model, &a)) { /* never overwrite the model or the prompt file */
        status = 2;
        goto done;
    }
    if (a.tokens) {
        if (!parse_token_list(a.tokens, &ids, &n_ids)) {
            status = 2;
            goto done;
        }
    } else {
        const char *text = a.prompt;
        size_t text_len = text ? strlen(text) : 0;
        if (a.prompt_file) {
            if (moe_read_file(a.prompt_file, 1u << 30, &file_text, &text_len) != MOE_OK) goto done;
            text = file_text;
        }
        if (!model->tok) {
            fprintf(stderr, "moe-run: %s has no tokenizer.json; pass token ids with --tokens\n", a.model);
            goto done;
        }
        if (moe_tokenizer_encode(model->tok, text, text_len, !a.no_special, &ids, &n_ids) != MOE_OK)
            goto done;
    }
    if (a.tokenize) {
        for (size_t i = 0; i < n_ids; i++) printf("%s%d", i ? "," : "", ids[i]);
        printf("\n");
        status = 0;
        goto done;
    }
    if (n_ids == 0) {
        fprintf(stderr, "moe-run: the prompt is empty after tokenization\n");
        goto done;
    }
    struct moe_session_params sp = moe_session_default_params();
    if (a.use_store) {
        sp.store = &a.store;
    }
    sp.record_trace = a.trace_out != NULL;
#ifdef MOE_HAVE_CUDA
    if (a.gpu.device >= 0) {
        sp.backend_new = moe_backend_cuda_new_fn;
        sp.backend_user = &a.gpu;
    }
#endif
    if (!big_little_params(&a, model, &sp)) goto done;
    sp.n_threads = a.n_threads;
    sp.n_ctx = a.n_ctx;
    sp.n_batch = a.n_batch;
    if (sp.n_ctx == 0) {
        int need = (int)n_ids + a.n_predict;
        int def = c->max_pos < 4096 ? c->max_pos : 4096;
        sp.n_ctx = need > def ? need : def;
    }
    if (!context_fits(c, sp.n_ctx)) goto done;
    if (moe_session_create(model, &sp, &sess) != MOE_OK) goto done;
    if ((int)n_ids + a.n_predict > moe_session_n_ctx(sess)) {
        fprintf(stderr, "moe-run: prompt (%zu tokens) + %d to generate exceed the context of %d; "
                        "raise --ctx\n", n_ids, a.n_predict, moe_session_n_ctx(sess));
        goto done;
    }
    struct moe_sampler_params smp = {a.temp, a.top_k, a.top_p, a.seed};
    if (moe_sampler_create(&smp, c->n_vocab, &sampler) != MOE_OK) goto done;

    const size_t V = (size_t)c->n_vocab;
    int all = a.logits_out != NULL;
    logits = malloc(sizeof(float) * V * (all ? n_ids : 1));
    if (!logits) goto done;
    if (a.logits_out && (moe_tmp_create(a.logits_out, &lt) || !(lf = moe_tmp_stream(&lt)))) {
        fprintf(stderr, "moe-run: cannot write %s (see the message above)\n", a.logits_out);
        goto done;
    }
    double t0 = moe_now_s();
    if (moe_session_forward(sess, ids, (int)n_ids, logits, all) != MOE_OK) goto done;
    int64_t bad = moe_logits_first_bad(logits, V * (all ? n_ids : 1));
    if (bad >= 0) { /* damaged weights or constants: fail loudly, never sample from NaN */
        fprintf(stderr, "moe-run: the model produced a non-finite logit (NaN or infinity) at prompt position %lld, "
                        "token %lld: its weights or config are damaged\n",
                (long long)(all ? bad / (int64_t)V : (int64_t)n_ids - 1), (long long)(bad % (int64_t)V));
        goto done;
    }
    double t1 = moe_now_s();
    const float *last = logits + (all ? (n_ids - 1) * V : 0);
    if (lf && fwrite(logits, sizeof(float), V * n_ids, lf) != V * n_ids) {
        fprintf(stderr, "moe-run: write error on %s\n", lt.path);
        goto done;
    }

    /* generation */
    int32_t *seq = malloc(sizeof(int32_t) * (n_ids + (size_t)a.n_predict + 1));
    if (!seq) goto done;
    memcpy(seq, ids, sizeof(int32_t) * n_ids);
    size_t n_seq = n_ids, printed = 0;
    if (model->tok && !a.print_ids) { /* echo the prompt, then stream the continuation */
        print_text_delta(model->tok, seq, n_seq, &printed);
    }
    int n_gen = 0;
    float *step_logits = logits; /* decode steps reuse the first row */
    for (; n_gen < a.n_predict; n_gen++) {
        int32_t next = moe_sampler_sample(sampler, n_gen == 0 ? last : step_logits);
        seq[n_seq++] = next;
        if (a.print_ids) {
            printf("%s%d", n_gen ? "," : "", next);
            fflush(stdout);
        } else if (model->tok) {
            print_text_delta(model->tok, seq, n_seq, &printed);
        }
        if (!a.ignore_eos && is_eos(model, next)) {
            n_gen++;
            break;
        }
        if (n_gen + 1 == a.n_predict) {
            n_gen++;
            break; /* the last token is not fed back */
        }
        if (moe_session_forward(sess, &next, 1, step_logits, 0) != MOE_OK) {
            free(seq);
            goto done;
        }
        if (moe_logits_first_bad(step_logits, V) >= 0) {
            fprintf(stderr, "\nmoe-run: the model produced a non-finite logit (NaN or infinity) at generated token "
                            "%d: its weights or config are damaged\n", n_gen + 1);
            free(seq);
            goto done;
        }
        if (lf && fwrite(step_logits, sizeof(float), V, lf) != V) {
            fprintf(stderr, "moe-run: write error on %s\n", lt.path);
            free(seq);
            goto done;
        }
    }
    double t2 = moe_now_s();
    free(seq);
    printf("\n");
    fflush(stdout);
    if (lf) {
        lf = NULL;
        if (moe_tmp_commit(&lt)) { /* fsync, rename; removes the temporary file on failure */
            fprintf(stderr, "moe-run: cannot write %s\n", a.logits_out);
            goto done;
        }
    }
    fprintf(stderr, "moe-run: prompt %zu tokens in %.3f s (%.2f tok/s); generated %d tokens in %.3f s (%.2f tok/s)\n",
            n_ids, t1 - t0, (double)n_ids / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_gen, t2 - t1,
            n_gen > 0 ? (double)n_gen / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0);
    print_store_stats(sess);
    /* decode time counts the steps that fed a generated token back (n_gen - 1 of them) */
    if (sp.little_k > 0) {
        struct moe_big_little_stats b;
        moe_session_big_little_stats(sess, &b);
        fprintf(stderr, "moe-run: big-little: top-%d little model, gamma %.3g: %lld of %lld tokens fell back to top-%d "
                        "(%.1f %%)\n", sp.little_k, sp.gamma, (long long)b.fallbacks, (long long)b.tokens,
                sp.n_expert_used, b.tokens ? 100.0 * (double)b.fallbacks / (double)b.tokens : 0.0);
    }
    if (a.stats_json && !write_stats(a.stats_json, sess, &sp, n_ids, t1 - t0, n_gen > 1 ? n_gen - 1 : 0, t2 - t1))
        goto done;
    if (a.trace_out && !write_trace(sess, model, a.model, a.trace_out)) goto done;
    status = 0;
done:
    moe_tmp_discard(&lt);
    free(logits);
    free(ids);
    free(file_text);
    moe_sampler_free(sampler);
    moe_session_free(sess);
    moe_model_free(model);
    return status;
}

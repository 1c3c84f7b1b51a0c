/*
 * quantize-cmd.c - `moe-prep quantize`: parses the options, calls
 * moe_quantize_model (quantize.h) and prints its progress and summary. A
 * signal (INT, TERM, HUP) sets the call's cancel flag: it removes its
 * temporary file and the command then dies of the same signal.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "moe-base.h"
#include "moe-opt.h"
#include "moe-prep.h"
#include "quantize.h"

#define PROG "moe-prep quantize"

static const struct moe_opt k_opts[] = {
    {"output", 'o', MOE_OPT_REQUIRED, "PATH", "the bundle to write (replaced atomically when done)"},
    {"experts", 0, MOE_OPT_REQUIRED, "LIST", "expert precisions, comma-separated (default q8_0,q4_k,q2_k)"},
    {"dense", 0, MOE_OPT_REQUIRED, "TYPE", "type of non-expert matrices (default q8_0); norms,\n"
                                           "biases and routers always stay float32"},
    {"compress", 0, MOE_OPT_OPTIONAL, "LEVEL", "zstd-compress expert blobs (default level 3) where it\n"
                                               "saves at least 3 % of the bytes"},
    {"threads", 't', MOE_OPT_REQUIRED, "N", "quantization threads (default: all CPUs)"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this help"},
    {NULL, 0, 0, NULL, NULL},
};

static void usage(FILE *f) {
    fprintf(f, "usage: moe-prep quantize MODEL -o OUT.moeb [options]\n"
               "\n"
               "Pack a MoE model into a bundle: every routed expert stored at each requested\n"
               "precision side by side (one contiguous, checksummed blob per expert and\n"
               "precision), every other weight stored once. MODEL is a Hugging Face checkpoint\n"
               "directory or a llama.cpp GGUF file (its metadata becomes the bundle's config\n"
               "and tokenizer; see docs/format.md, \"GGUF input\").\n\n");
    moe_opt_help(f, k_opts);
    fprintf(f, "\n"
               "types: f32 f16 bf16 q8_0 q4_0 q4_k q3_k q2_k (also q5_k q6_k mxfp4). A matrix whose\n"
               "rows do not fit a type's block size falls back as llama.cpp does (k-quants ->\n"
               "q4_0 / q8_0, then f16); fallbacks are printed and recorded in the bundle. A\n"
               "matrix already stored in the requested type (gpt-oss's mxfp4 experts, a q4_k\n"
               "GGUF's q4_k experts) is copied block for block; other types are dequantized and\n"
               "quantized again.\n"
               "\n"
               "memory: the checkpoint is read through mmap and each tensor's pages are released\n"
               "after use; resident memory stays below about: the largest non-expert matrix at\n"
               "the dense type + two expert blobs at the largest precision + THREADS x (row of\n"
               "floats), plus the model's norm vectors - independent of the number of layers and\n"
               "experts.\n"
               "\n"
               "examples:\n"
               "  moe-prep quantize ./Mixtral-8x7B-v0.1 -o mixtral.moeb\n"
               "  moe-prep quantize ./OLMoE-1B-7B-0924 -o olmoe.moeb --experts q8_0,q4_k,q2_k --dense q8_0 -t 8\n"
               "  moe-prep quantize tests/fixtures/models/mixtral-f32 -o /tmp/m.moeb --experts f32 --dense f32\n"
               "  moe-prep quantize mixtral-8x7b-q4_k_m.gguf -o mixtral.moeb --experts q4_k,q2_k\n");
}

struct qargs {
    const char *out;
    struct moe_quantize_params p;
};

/* parse_types: "q8_0,q4_k" -> distinct types in p->experts; 0 after a message. */
static int parse_types(const char *list, struct moe_quantize_params *p) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    p->n_experts = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        enum moe_qtype t;
        if (moe_qtype_from_name(tok, &t) != MOE_OK) return 0;
        for (int i = 0; i < p->n_experts; i++)
            if (p->experts[i] == t) {
                fprintf(stderr, PROG ": --experts lists %s twice\n", tok);
                return 0;
            }
        if (p->n_experts == MOE_QUANTIZE_MAX_PRECISIONS) {
            fprintf(stderr, PROG ": at most %d expert precisions\n", MOE_QUANTIZE_MAX_PRECISIONS);
            return 0;
        }
        p->experts[p->n_experts++] = t;
    }
    if (p->n_experts > 0) return 1;
    fprintf(stderr, PROG ": bad --experts list \"%s\"\n", list);
    return 0;
}

/* parse_level: an integer option value in [lo, hi]; 0 after a message. */
static int parse_level(const char *v, long lo, long hi, const char *what, int *out) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || end == v || n < lo || n > hi) {
        fprintf(stderr, PROG ": %s must be %ld..%ld\n", what, lo, hi);
        return 0;
    }
    *out = (int)n;
    return 1;
}

/* on_option: one option into the arguments (moe_opt_fn): 0, 1 = help shown, 2 = usage error. */
static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    struct qargs *a = ctx;
    const char *n = o->name;
    if (!strcmp(n, "help")) {
        usage(stdout);
        return 1;
    }
    if (!strcmp(n, "output")) a->out = v;
    else if (!strcmp(n, "experts")) return parse_types(v, &a->p) ? 0 : 2;
    else if (!strcmp(n, "dense")) return moe_qtype_from_name(v, &a->p.dense) == MOE_OK ? 0 : 2;
    else if (!strcmp(n, "threads")) return parse_level(v, 1, 1024, "--threads", &a->p.n_threads) ? 0 : 2;
    else if (!strcmp(n, "compress")) {
        a->p.zstd_level = 3;
        if (v && !parse_level(v, 1, 22, "--compress level", &a->p.zstd_level)) return 2;
    }
    return 0;
}

/* The progress line: a line on a terminal (rewritten, with ETA), one line per
 * 10 % otherwise. The clock starts at the first report (after the model is
 * loaded and hashed). */
struct progress {
    double t0, last;
    uint64_t done0;
    int tty, last_decile, started;
};

static void on_progress(uint64_t done, uint64_t total, void *user) {
    struct progress *p = user;
    double t = moe_now_s();
    if (!p->started) p->started = 1, p->t0 = t, p->done0 = done;
    double el = t - p->t0, frac = total ? (double)done / (double)total : 1.0;
    double rate = el > 0 ? (double)(done - p->done0) / el : 0;
    double eta = rate > 0 ? (double)(total - done) / rate : 0;
    if (p->tty) {
        if (t - p->last < 0.2 && done < total) return;
        p->last = t;
        fprintf(stderr, "\rquantize: %5.1f%% %.2f/%.2f GB  %.0f MB/s  ETA %d:%02d   ", 100 * frac, (double)done / 1e9,
                (double)total / 1e9, rate / 1e6, (int)eta / 60, (int)eta % 60);
        if (done >= total) fputc('\n', stderr);
    } else if ((int)(frac * 10) > p->last_decile) {
        p->last_decile = (int)(frac * 10);
        fprintf(stderr, "quantize: %3.0f%% (%.2f GB of %.2f GB, %.0f MB/s)\n", 100 * frac, (double)done / 1e9,
                (double)total / 1e9, rate / 1e6);
    }
}

static void on_fallback(const char *note, void *user) { fprintf(stderr, PROG ": note: %s\n", note); }

static volatile sig_atomic_t g_cancel, g_signal;

/* on_signal: ask the running call to stop (it removes its temporary file). */
static void on_signal(int sig) {
    g_signal = sig;
    g_cancel = 1;
}

/* print_summary: what was written, how fast, and each precision's size. */
static void print_summary(const char *out, const struct moe_quantize_params *p, const struct moe_quantize_result *r) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr, PROG ": wrote %s: %.1f MB in %.2f s (%.0f MB/s of input), peak RSS %.0f MB\n", out,
            (double)r->file_bytes / 1e6, r->seconds, r->seconds > 0 ? (double)r->input_bytes / r->seconds / 1e6 : 0,
            (double)ru.ru_maxrss / 1024.0);
    for (int i = 0; i < r->n_experts; i++)
        fprintf(stderr, "  experts %-5s %6.3f bits/weight, %.1f MB per layer\n", moe_qtype_name(p->experts[i]),
                r->bits_per_weight[i], (double)r->layer_bytes[i] / 1e6);
}

int moe_prep_quantize(int argc, char **argv) {
    struct qargs a = {NULL, moe_quantize_default_params()};
    const struct moe_opt *tables[] = {k_opts};
    int first = 0, rc = moe_opt_parse(PROG, argc, argv, 1, tables, 1, on_option, &a, &first);
    if (rc) return rc == 1 ? 0 : 2;
    if (first < argc - 1) {
        fprintf(stderr, PROG ": unexpected argument \"%s\"\n", argv[first + 1]);
        return 2;
    }
    if (first >= argc || !a.out) {
        fprintf(stderr, PROG ": need MODEL and -o OUT.moeb (see --help)\n");
        return 2;
    }
    const char *model = argv[first];
    moe_log_set_level(MOE_LOG_WARN);
    struct moe_buf cmd = {0};
    for (int i = 0; i < argc; i++) moe_buf_printf(&cmd, "%s%s", i ? " " : "moe-prep ", argv[i]);
    struct progress prog = {0, 0, 0, isatty(2), 0, 0};
    a.p.command_line = cmd.data;
    a.p.on_progress = on_progress;
    a.p.on_fallback = on_fallback;
    a.p.user = &prog;
    a.p.cancel = &g_cancel;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    struct moe_quantize_result r;
    enum moe_status st = moe_quantize_model(model, a.out, &a.p, &r);
    moe_buf_free(&cmd);
    if (g_signal) { /* the temporary file is gone: die of the signal as before */
        signal(g_signal, SIG_DFL);
        raise(g_signal);
    }
    if (st == MOE_OK) {
        print_summary(a.out, &a.p, &r);
        return 0;
    }
    if (r.refused) {
        fprintf(stderr, PROG ": refusing to write %s (see the message above)\n", a.out);
        return 2;
    }
    fprintf(stderr, PROG ": failed (%s); nothing written to %s\n", moe_status_str(st), a.out);
    return 1;
}

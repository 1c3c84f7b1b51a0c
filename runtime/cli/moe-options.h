/*
 * moe-options.h - the engine's command-line options, shared by the CLIs
 * (moe-run, and moe-prep's eval, profile, plan, sensitivity, bitwidth, hw):
 * the expert store's options (--expert-mem, --policy, ...), the device's
 * (--device and the GPU backend's), their help text, and the store's
 * counters as JSON for --stats-json / --json. The CLI layer (runtime/cli/,
 * library moe_cli_options): the runtime library itself parses no argv.
 * Tables and help texts are static and thread-safe; the parsers only write
 * the params they are given and log nothing (messages go to err).
 */
#ifndef MOE_OPTIONS_H
#define MOE_OPTIONS_H

#include <stddef.h>
#include <stdio.h>

#include "moe-gpu.h"
#include "moe-model.h"
#include "moe-session.h"
#include "moe-status.h"
#include "moe-store.h"
#include "moe-tuning.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_opt; /* moe-opt.h */
struct cJSON;

/* moe_store_option_table: the engine options as an option table (moe-opt.h;
 * names without "--"), for moe_opt_parse in the CLIs that take them (moe-run,
 * eval, plan). Static: valid for the life of the program. */
const struct moe_opt *moe_store_option_table(void);

/* moe_store_options_help: the help text of the engine options below (a heading
 * and the table's help; static, thread-safe). */
const char *moe_store_options_help(void);

/* moe_store_option_takes_value: 1 if `name` (e.g. "--expert-mem" or
 * "expert-mem") is an engine option with a value, 0 a flag, -1 not an
 * engine option. */
int moe_store_option_takes_value(const char *name);

/* moe_store_parse_option: apply option `name` ("--expert-mem" or
 * "expert-mem") with value v (NULL for a flag) to *p; "--expert-mem" takes bytes ("512M") or a share ("25%").
 * MOE_ERR_NOT_FOUND: not an engine option; MOE_ERR_INVALID: a bad value;
 * both with a message for the user in err. Nothing is logged. */
enum moe_status moe_store_parse_option(struct moe_store_params *p, const char *name, const char *v, char *err,
                                       size_t err_size);

/* moe_store_stats_to_json: s as one cJSON object (counts, ratios, bytes and
 * stall time per token, prefetch precision and recall, peak resident bytes;
 * ratios with nothing to divide by are null). The caller owns it
 * (cJSON_Delete); NULL when out of memory. */
struct cJSON *moe_store_stats_to_json(const struct moe_store_stats *s);

/* moe_store_stats_json: moe_store_stats_to_json printed to f on one line. */
void moe_store_stats_json(const struct moe_store_stats *s, FILE *f);

/* moe_gpu_option_table: the GPU options as a moe_opt table (moe-opt.h),
 * terminated by a NULL name; static, never freed. A CLI passes it to
 * moe_opt_parse next to its own table and hands each option to
 * moe_gpu_parse_option. */
const struct moe_opt *moe_gpu_option_table(void);

/* moe_gpu_options_help: the help text of the options below, made from the
 * table once (thread-safe); static, never freed. */
const char *moe_gpu_options_help(void);

/* moe_gpu_option_takes_value: 1 an option with a value, 0 a flag, -1 not a GPU
 * option (names with or without the leading "--"). */
int moe_gpu_option_takes_value(const char *name);

/* moe_gpu_parse_option: apply option `name` (with or without "--"; value v,
 * NULL for a flag) to *p.
 * MOE_ERR_NOT_FOUND: not a GPU option; MOE_ERR_INVALID: bad value; both with
 * a message in err. Nothing is logged. */
enum moe_status moe_gpu_parse_option(struct moe_gpu_params *p, const char *name, const char *v, char *err,
                                     size_t err_size);

/* moe_device_option: option `name` (with or without "--"; value v) applied
 * to *g when it is a device option (moe_gpu_option_table: --device and the GPU
 * backend's). Returns -1 not a device option, 0 applied, 2 a bad value
 * (printed to stderr as "PROG: message"). */
int moe_device_option(const char *prog, struct moe_gpu_params *g, const char *name, const char *v);

/* moe_device_built: 1 if the device spec ("cpu", "cuda:1", "auto"; NULL =
 * cpu) names a backend this build has (the registry); else prints what to
 * do ("PROG: --device cuda: this build has no cuda backend (rebuild with
 * -DMOE_CUDA=ON)") and returns 0. */
int moe_device_built(const char *prog, const char *spec);

/* ---- the model and how it runs: what every program that serves or runs a
 * model takes (moe-serve; moe-run's own table has the same options) ---- */

/* The options as given, and what they decide. */
struct moe_engine_args {
    const char *model;            /* -m: checkpoint directory, GGUF file or bundle */
    const char *expert_precision; /* bundles: the stored precision every expert uses */
    int n_threads, n_ctx, n_batch; /* 0: the session's defaults */
    int no_repack, no_plan;
    struct moe_store_params store; /* the expert store's options (moe_store_option_table) */
    int use_store;                /* a budget was asked for (set by moe_engine_load) */
    struct moe_gpu_params gpu;    /* --device and the GPU options */
    int n_store_opts;             /* the store options in order, applied again over a bundle's plan */
    const char *store_name[64], *store_value[64];
    struct moe_tuning_plan plan;  /* the bundle's applied plan, when used (store strings point here) */
    int have_plan;
    int little_k;                 /* --little-k; -1: not given (moe_big_little_option_table) */
    double gamma;                 /* --gamma; NaN: not given */
    int bl_prefetch;              /* --bl-prefetch; -1: not given */
};

/* moe_engine_args_init: the defaults (no model). */
void moe_engine_args_init(struct moe_engine_args *e);

/* moe_engine_option_table: -m/--model, --expert-precision, -t/--threads,
 * -c/--ctx, -b/--batch, --no-repack, --no-plan as a moe_opt table (keys
 * 'm', 't', 'c', 'b' and 0); static. */
const struct moe_opt *moe_engine_option_table(void);

/* moe_engine_options_help: its help text under a heading (static, thread-safe). */
const char *moe_engine_options_help(void);

/* moe_big_little_option_table: MoBiLE big-little decoding, --little-k,
 * --gamma and --bl-prefetch (moe-run's own table has the same options) as a
 * moe_opt table (keys 0); static. moe_engine_option applies them and
 * moe_engine_load turns them into the session's little_k / gamma /
 * bl_prefetch_layers (gamma's default: the bundle's mobile.gamma, else 0.7).
 * They hold with several sequences too (moe_session_params.n_seq): a
 * big-little session decodes each row of a batch on its own. */
const struct moe_opt *moe_big_little_option_table(void);

/* moe_big_little_options_help: its help text under a heading (static, thread-safe). */
const char *moe_big_little_options_help(void);

/* moe_engine_option: option o with value v (NULL for a flag) applied to *e
 * when it is one of the engine table's, the big-little table's, the store's
 * or the GPU's options.
 * Returns -1 not one of them, 0 applied, 2 a bad value (printed to stderr as
 * "PROG: message"). */
int moe_engine_option(const char *prog, struct moe_engine_args *e, const struct moe_opt *o, const char *v);

/* moe_engine_read_plan: a bundle's applied plan (moe-prep plan --apply) as
 * the starting point of the store options: *plan read from MODEL's tuning,
 * *store made from it with the n store options given (names[i] = values[i],
 * in command-line order) applied again on top, and a note on stderr naming
 * the plan. 1 used, 0 none (no_plan, not a bundle, no plan in it: *store and
 * *plan untouched; a file that cannot be opened is left for the model load to
 * report), -1 an option that does not apply over the plan (after a message). */
int moe_engine_read_plan(const char *prog, const char *model, int no_plan, const char *const *names,
                         const char *const *values, int n, struct moe_store_params *store, struct moe_tuning_plan *plan);

/* moe_engine_big_little: --little-k / --gamma / --bl-prefetch (-1, NaN, -1:
 * not given) into sp's little_k, gamma, n_expert_used and
 * bl_prefetch_layers; off when neither little_k nor gamma is given or
 * little_k is 0; little_k's default K/2, gamma's the bundle's mobile.gamma,
 * else 0.7 (with a note). 1 ok, 0 after a message (a little model the model
 * cannot run). */
int moe_engine_big_little(const char *prog, int little_k, double gamma, int bl_prefetch, const struct moe_model *m,
                          struct moe_session_params *sp);

/* moe_engine_load: a bundle's applied plan (moe-prep plan --apply) as the
 * starting point of the store options unless --no-plan (the options given
 * applied again on top; a note on stderr says so), then the model (lazy
 * experts with a budget) and the session parameters (store, device, threads,
 * context, batch, big-little: the plan's when no big-little option was
 * given) in *sp, which points into *e (keep e alive
 * while sp is used). 0 ok, else the exit status after a message on stderr
 * (a --little-k the model cannot run: 2). */
int moe_engine_load(const char *prog, struct moe_engine_args *e, struct moe_model **model,
                    struct moe_session_params *sp);

/* moe_engine_repack: the CPU kernels' interleaved layouts (moe_model_repack)
 * when the backend reads them and --no-repack was not given (experts too
 * without a budget: the store repacks its own copies). 1 ok. */
int moe_engine_repack(const char *prog, const struct moe_engine_args *e, struct moe_model *m,
                      const struct moe_backend *be);

#ifdef __cplusplus
}
#endif
#endif

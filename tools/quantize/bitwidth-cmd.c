/*
 * bitwidth-cmd.c - `moe-prep bitwidth`: parses the options, calls
 * moe_bw_run_bundle (bitwidth.h) and prints the candidates, the chosen map
 * and the held-out check as a table or as one JSON object.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bitwidth.h"
#include "moe-opt.h"
#include "moe-options.h"
#include "moe-prep.h"
#include "moe-tuning.h"
#include "tool-util.h"

#define PROG "moe-prep bitwidth"

static const struct moe_opt k_opts[] = {
    {"sensitivity", 0, MOE_OPT_REQUIRED, "FILE", "output of moe-prep sensitivity for this bundle"},
    {"dataset", 0, MOE_OPT_REQUIRED, "SPEC", "text the search evaluates on (file or dataset card)"},
    {"max-loss", 0, MOE_OPT_REQUIRED, "P", "loss budget: 2% or 0.02 (relative perplexity increase)"},
    {"max-size", 0, MOE_OPT_REQUIRED, "SIZE", "instead: expert bytes budget (e.g. 12MiB, 3.5GB, 1048576);\n"
                                              "the smallest loss that fits"},
    {"heldout", 0, MOE_OPT_REQUIRED, "SPEC", "also measure the chosen and the uniform assignments on a\n"
                                             "text the search did not see"},
    {"ctx", 0, MOE_OPT_REQUIRED, "N", "tokens per evaluation chunk (default 256)"},
    {"max-chunks", 0, MOE_OPT_REQUIRED, "N", "evaluate at most N chunks per text (default all)"},
    {"no-tuning", 0, MOE_OPT_NONE, NULL, "do not write the map into the bundle"},
    {"json", 0, MOE_OPT_NONE, NULL, "machine-readable result on stdout"},
    {"threads", 't', MOE_OPT_REQUIRED, "N", "CPU threads (default: all)"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this help"},
    {NULL, 0, 0, NULL, NULL},
};

static void bw_usage(FILE *f) {
    fputs("usage: moe-prep bitwidth MODEL.moeb --sensitivity SENS.h5 --dataset SPEC\n"
          "                         (--max-loss 2% | --max-size SIZE) [options]\n"
          "\n"
          "EdgeMoE's bit-width search: each routed expert gets its own stored precision so\n"
          "the experts are as small as possible within the budget. Loss = relative\n"
          "perplexity increase on --dataset against all experts at the largest stored\n"
          "precision. Uniform assignments give the bounds; then the K least sensitive\n"
          "experts (ranking from `moe-prep sensitivity`) drop to the lower precision, K\n"
          "bisected until the loss is just within the budget. The map is written into the\n"
          "bundle's tuning section; moe-run and eval then load each expert at its own\n"
          "precision by default (--expert-precision still forces one for all).\n"
          "\n"
          "options:\n", f);
    moe_opt_help(f, k_opts);
    fprintf(f, "\n%s", moe_gpu_options_help());
    fputs("\n"
          "example:\n"
          "  moe-prep bitwidth tiny.moeb --sensitivity sens.h5 --dataset wiki.txt --max-loss 2% --heldout c4.txt\n",
          f);
}

struct bw_args {
    const char *model;
    int json;
    struct moe_bw_run_params p;
    struct moe_gpu_params gpu; /* --device and the GPU backend's options */
};

/* parse_loss: "2%" or "0.02" into a fraction; 0 after a message. */
static int parse_loss(const char *v, double *out) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v);
    size_t l = strlen(buf);
    int pct = l > 0 && buf[l - 1] == '%';
    if (pct) buf[l - 1] = 0;
    if (!moe_tool_parse_double("bitwidth", "--max-loss", buf, 0, pct ? 1e4 : 100, out)) return 0;
    if (pct) *out /= 100;
    return 1;
}

/* parse_int: option --NAME's integer value in [lo, hi]; 0 after a message. */
static int parse_int(const char *name, const char *v, long long lo, long long hi, int *out) {
    char opt[64];
    long long n;
    snprintf(opt, sizeof opt, "--%s", name);
    if (!moe_tool_parse_ll("bitwidth", opt, v, lo, hi, &n)) return 0;
    *out = (int)n;
    return 1;
}

/* on_option: one option (moe_opt_fn): 0 go on, 1 help shown, 2 usage error. */
static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    struct bw_args *a = ctx;
    struct moe_bw_run_params *p = &a->p;
    const char *n = o->name;
    long long size;
    if (o < k_opts || o >= k_opts + sizeof k_opts / sizeof k_opts[0]) /* the device table */
        return moe_device_option(PROG, &a->gpu, o->name, v) ? 2 : 0;
    if (o->key == 'h') {
        bw_usage(stdout);
        return 1;
    }
    if (!strcmp(n, "sensitivity")) p->sensitivity = v;
    else if (!strcmp(n, "dataset")) p->dataset = v;
    else if (!strcmp(n, "heldout")) p->heldout = v;
    else if (!strcmp(n, "json")) a->json = 1;
    else if (!strcmp(n, "no-tuning")) p->write_tuning = 0;
    else if (!strcmp(n, "max-loss")) return parse_loss(v, &p->max_loss) ? 0 : 2;
    else if (!strcmp(n, "max-size")) {
        if (!moe_tool_parse_size("bitwidth", "--max-size", v, &size)) return 2;
        p->max_bytes = size;
    } else if (!strcmp(n, "ctx")) return parse_int(n, v, 4, 1 << 20, &p->n_ctx) ? 0 : 2;
    else if (!strcmp(n, "max-chunks")) return parse_int(n, v, 1, 1 << 30, &p->max_chunks) ? 0 : 2;
    else if (!strcmp(n, "threads")) return parse_int(n, v, 0, 4096, &p->n_threads) ? 0 : 2;
    return 0;
}

/* bw_parse: 0 ok, 1 help printed, 2 usage error (reported). */
static int bw_parse(int argc, char **argv, struct bw_args *a) {
    memset(a, 0, sizeof *a);
    a->p = moe_bw_run_default_params();
    a->gpu = moe_gpu_default_params();
    const struct moe_opt *tables[] = {k_opts, moe_gpu_option_table()};
    int first = 0, rc = moe_opt_parse(PROG, argc, argv, 1, tables, 2, on_option, a, &first);
    if (rc) return rc == 1 ? 1 : 2;
    if (!moe_device_built(PROG, a->gpu.device_spec)) return 2;
    a->p.device = a->gpu.device_spec, a->p.device_options = &a->gpu;
    if (first + 1 < argc) {
        fprintf(stderr, PROG ": unexpected argument %s\n", argv[first + 1]);
        return 2;
    }
    a->model = first < argc ? argv[first] : NULL;
    if (!a->model || !a->p.sensitivity || !a->p.dataset) {
        fprintf(stderr, PROG ": needs MODEL.moeb, --sensitivity and --dataset (see --help)\n");
        return 2;
    }
    if ((a->p.max_loss >= 0) == (a->p.max_bytes > 0)) {
        fprintf(stderr, PROG ": give exactly one of --max-loss and --max-size\n");
        return 2;
    }
    return 0;
}

/* on_eval: one line per evaluation of the search, on stderr. */
static void on_eval(int n, double ppl, double loss, double seconds, void *user) {
    fprintf(stderr, "bitwidth: evaluation %d: PPL %.4f, loss %+.3f %% (%.0f s)\n", n, ppl, 100 * loss, seconds);
}

/* ---- JSON ---- */

/* uniform_json: each uniform assignment's precision, bytes and loss. */
static cJSON *uniform_json(const struct moe_bw_run *run) {
    const struct moe_bw_result *r = &run->result;
    cJSON *list = cJSON_CreateArray();
    for (int q = 0; q < r->n_prec; q++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "precision", run->prec_names[q]);
        cJSON_AddNumberToObject(x, "expert_bytes", (double)r->uniform_bytes[q]);
        moe_tool_json_num(x, "loss", r->uniform_loss[q]);
        cJSON_AddItemToArray(list, x);
    }
    return list;
}

/* candidates_json: every evaluation the search made, in order. */
static cJSON *candidates_json(const struct moe_bw_run *run) {
    const struct moe_bw_result *r = &run->result;
    cJSON *list = cJSON_CreateArray();
    for (int i = 0; i < r->n_cand; i++) {
        const struct moe_bw_candidate *c = &r->cand[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "lower", run->prec_names[c->lower]);
        cJSON_AddStringToObject(x, "upper", run->prec_names[c->upper]);
        cJSON_AddNumberToObject(x, "k", c->k);
        cJSON_AddNumberToObject(x, "expert_bytes", (double)c->bytes);
        moe_tool_json_num(x, "loss", c->loss);
        cJSON_AddItemToArray(list, x);
    }
    return list;
}

/* chosen_json: the chosen candidate and its map (one precision name per expert). */
static cJSON *chosen_json(const struct moe_bw_run *run) {
    const struct moe_bw_result *r = &run->result;
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "lower", run->prec_names[r->lower]);
    cJSON_AddStringToObject(x, "upper", run->prec_names[r->upper]);
    cJSON_AddNumberToObject(x, "k", r->k);
    cJSON_AddNumberToObject(x, "expert_bytes", (double)r->bytes);
    cJSON_AddNumberToObject(x, "model_bytes", (double)(r->bytes + run->dense_bytes));
    moe_tool_json_num(x, "loss", r->loss);
    moe_tool_json_num(x, "heldout_loss", run->heldout.done ? run->heldout.chosen : NAN);
    cJSON *map = cJSON_AddArrayToObject(x, "map");
    for (int i = 0; i < run->n; i++) cJSON_AddItemToArray(map, cJSON_CreateString(run->prec_names[r->assign[i]]));
    return x;
}

/* print_json: the whole result as one JSON object on a line. */
static void print_json(const struct bw_args *a, const struct moe_bw_run *run) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", a->model);
    cJSON_AddStringToObject(o, "dataset", a->p.dataset);
    cJSON *budget = cJSON_AddObjectToObject(o, "budget");
    moe_tool_json_num(budget, "max_loss", a->p.max_loss >= 0 ? a->p.max_loss : NAN);
    moe_tool_json_num(budget, "max_expert_bytes", a->p.max_bytes > 0 ? (double)a->p.max_bytes : NAN);
    cJSON_AddNumberToObject(o, "dense_bytes", (double)run->dense_bytes);
    cJSON_AddItemToObject(o, "uniform", uniform_json(run));
    cJSON_AddItemToObject(o, "candidates", candidates_json(run));
    cJSON_AddItemToObject(o, "chosen", chosen_json(run));
    if (run->heldout.done) {
        const struct moe_bw_heldout *h = &run->heldout;
        cJSON *x = cJSON_AddObjectToObject(o, "heldout");
        cJSON_AddStringToObject(x, "dataset", a->p.heldout);
        moe_tool_json_num(x, "ref_ppl", h->ref_ppl);
        moe_tool_json_num(x, "chosen", h->chosen);
        moe_tool_json_num(x, "uniform_upper", h->upper);
        moe_tool_json_num(x, "uniform_lower", h->lower);
    }
    char *s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
}

/* ---- the table ---- */

/* print_candidates: every evaluation, one row each. */
static void print_candidates(const struct bw_args *a, const struct moe_bw_run *run) {
    const double MiB = 1048576.0;
    const struct moe_bw_result *r = &run->result;
    const int64_t dense = run->dense_bytes;
    printf("candidates tried (loss = relative perplexity increase on %s against all experts at %s):\n",
           a->p.dataset, run->prec_names[r->cand[0].upper]);
    printf("  %-22s %5s %12s %12s %9s\n", "assignment", "K", "expert MiB", "model MiB", "loss");
    for (int i = 0; i < r->n_cand; i++) {
        const struct moe_bw_candidate *c = &r->cand[i];
        char what[64];
        if (c->lower == c->upper) snprintf(what, sizeof what, "uniform %s", run->prec_names[c->lower]);
        else snprintf(what, sizeof what, "%s / %s", run->prec_names[c->lower], run->prec_names[c->upper]);
        printf("  %-22s %5d %12.3f %12.3f %8.3f%%\n", what, c->k, c->bytes / MiB, (c->bytes + dense) / MiB,
               100 * c->loss);
    }
}

/* print_chosen: the chosen map, the uniform pair around it, the held-out check. */
static void print_chosen(const struct bw_args *a, const struct moe_bw_run *run) {
    const double MiB = 1048576.0, max_loss = a->p.max_loss;
    const struct moe_bw_result *r = &run->result;
    const struct moe_bw_heldout *h = &run->heldout;
    const char *lo = run->prec_names[r->lower], *up = run->prec_names[r->upper];
    int64_t up_bytes = r->uniform_bytes[r->upper], lo_bytes = r->uniform_bytes[r->lower];
    int count[64] = {0};
    for (int i = 0; i < run->n; i++) count[r->assign[i]]++;
    printf("\nchosen: %d of %d experts at %s, the rest at %s:", r->k, run->n, lo, up);
    for (int q = 0; q < r->n_prec; q++)
        if (count[q]) printf(" %d x %s", count[q], run->prec_names[q]);
    printf("\n  experts %.3f MiB (model %.3f MiB), loss %.3f %%", r->bytes / MiB, (r->bytes + run->dense_bytes) / MiB,
           100 * r->loss);
    if (max_loss >= 0) printf(" (budget %.3f %%)", 100 * max_loss);
    else printf(" (budget %.3f MiB of experts)", a->p.max_bytes / MiB);
    printf("\n");
    if (r->lower != r->upper) {
        printf("  uniform %s: %.3f MiB, loss %.3f %%; uniform %s: %.3f MiB, loss %.3f %%\n", up, up_bytes / MiB,
               100 * r->uniform_loss[r->upper], lo, lo_bytes / MiB, 100 * r->uniform_loss[r->lower]);
        if (max_loss >= 0 && r->k > 0)
            printf("  the mixed map is %.1f %% smaller than uniform %s, the smallest uniform within the budget\n",
                   100.0 * (double)(up_bytes - r->bytes) / (double)up_bytes, up);
        else if (max_loss >= 0)
            printf("  no expert could drop to %s within the budget: the map is uniform %s (the loss of the first "
                   "candidate already exceeded it)\n", lo, up);
    }
    if (h->done) {
        printf("held-out (%s): loss %.3f %%", a->p.heldout, 100 * h->chosen);
        if (max_loss >= 0) printf(" (budget %.3f %%)", 100 * max_loss);
        printf("; uniform %s %.3f %%, uniform %s %.3f %%\n", up, 100 * h->upper, lo, 100 * h->lower);
    }
}

int moe_prep_bitwidth(int argc, char **argv) {
    struct bw_args a;
    int rc = bw_parse(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    moe_log_set_level(MOE_LOG_WARN);
    a.p.on_eval = on_eval;
    struct moe_bw_run run;
    enum moe_status st = moe_bw_run_bundle(a.model, &a.p, &run);
    if (run.search_done) {
        if (a.json) {
            print_json(&a, &run);
        } else {
            print_candidates(&a, &run);
            print_chosen(&a, &run);
        }
    }
    if (run.wrote_tuning)
        fprintf(stderr, "bitwidth: wrote the map (%s) into %s's tuning\n", MOE_TUNING_BITWIDTH_MAP, a.model);
    if (st) fprintf(stderr, PROG ": failed (see the message above)\n");
    moe_bw_run_clear(&run);
    return st ? 1 : 0;
}

/*
 * fit-cache-cmd.c - `moe-prep fit-cache MODEL.moeb --profile PROFILE.h5`: the
 * CLI of fit-cache (fit-cache.h). Parses the options, opens the bundle and
 * the profile, calls moe_fit_cache_model_init, _plan and _sweep, writes the
 * CSV table, the profile's cache.* arrays and the bundle's tuning, and prints
 * the table or its JSON. docs/cache-sim.md describes every output.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fit-cache.h"
#include "fit-cache-route.h"
#include "moe-base.h"
#include "moe-bundle.h"
#include "moe-file.h"
#include "moe-opt.h"
#include "moe-prep.h"
#include "profile-h5.h"
#include "tool-util.h"

#define CMD "fit-cache"
#define HELP_PRINTED 1
#define P MOE_CACHE_N_POLICIES
#define per_tok moe_fit_cache_per_token

struct fc_args {
    const char *bundle, *profile, *csv;
    struct moe_fit_cache_params fp;
    int json, no_tuning, no_profile_update;
    int fit_route;          /* --fit-route: cache-aware routing's margin (fit-cache-route.h) */
    double route_target;    /* --route-target */
};

enum {
    O_PROFILE = 256, O_FAST_MEM, O_CACHE_EXPERTS, O_LOW_SHARE, O_SIZES, O_HELDOUT, O_HIGH, O_LOW, O_LOW_COST, O_T1,
    O_T2, O_PROMPT_LEN, O_PREFETCH, O_PATH_ORDER, O_FIT_ONCE, O_FIT_PER_SIZE, O_PAPER, O_JSON, O_CSV, O_NO_TUNING,
    O_NO_PROFILE_UPDATE, O_OPT_ITERS, O_OPT_SECONDS, O_FIT_ROUTE, O_ROUTE_TARGET
};

static const struct moe_opt k_opts[] = {
    {"profile", O_PROFILE, MOE_OPT_REQUIRED, "FILE", "the profile of MODEL (from moe-prep profile)"},
    {"fast-mem", O_FAST_MEM, MOE_OPT_REQUIRED, "SIZE",
     "fast memory for expert caches: bytes or KiB/MiB/GiB/TiB\n(e.g. 2GiB), split by --low-share using the bundle's\n"
     "real expert sizes at the two precisions"},
    {"cache-experts", O_CACHE_EXPERTS, MOE_OPT_REQUIRED, "H,L",
     "or the capacities directly: H high-, L low-precision experts"},
    {"low-share", O_LOW_SHARE, MOE_OPT_REQUIRED, "X", "share of the --fast-mem bytes for the low cache (default 0.25)"},
    {"sizes", O_SIZES, MOE_OPT_REQUIRED, "A,B,...",
     "high-cache capacities (experts) of the table; the low\ncache scales by the same ratio (default: the given size\n"
     "and 25, 50, 75 % of all experts)"},
    {"heldout", O_HELDOUT, MOE_OPT_REQUIRED, "X",
     "share of the sequences held out for the report, every\nk-th one (default 0.3; 0 = report on the fit part)"},
    {"high", O_HIGH, MOE_OPT_REQUIRED, "NAME", "high precision (default: the stored one with most bytes)"},
    {"low", O_LOW, MOE_OPT_REQUIRED, "NAME", "low precision (default: the one with fewest bytes)"},
    {"low-cost", O_LOW_COST, MOE_OPT_REQUIRED, "X", "penalty of a low miss (default: low / high blob bytes)"},
    {"t1", O_T1, MOE_OPT_REQUIRED, "X", "HOBBIT threshold T1 (default: the profile's, else the bundle's)"},
    {"t2", O_T2, MOE_OPT_REQUIRED, "X", "HOBBIT threshold T2 (default: the profile's, else the bundle's)"},
    {"prompt-len", O_PROMPT_LEN, MOE_OPT_REQUIRED, "N",
     "the first N tokens of each sequence run as one batch\n(default 0: every token decoded one at a time)"},
    {"prefetch", O_PREFETCH, MOE_OPT_REQUIRED, "M",
     "prefetch the M most probable experts of each layer from\nEdgeMoE's path dictionary of the fit part (default 0)"},
    {"path-order", O_PATH_ORDER, MOE_OPT_REQUIRED, "1|2", "key the dictionary on layer l-1 or l-2 and l-1 (default 2)"},
    {"fit-once", O_FIT_ONCE, MOE_OPT_NONE, NULL,
     "fit HOBBIT's weights at the primary size only and use them\nat every size of the table (default: fit again at each\n"
     "size, since the best weights move with the cache size;\nthe tuning always gets the primary size's weights)"},
    {"fit-per-size", O_FIT_PER_SIZE, MOE_OPT_NONE, NULL, "the default, accepted for scripts"},
    {"paper-hobbit", O_PAPER, MOE_OPT_NONE, NULL,
     "fit the paper's HOBBIT only: four weights (w_pop = 0, no\npopularity term) and no admission control"},
    {"opt-iters", O_OPT_ITERS, MOE_OPT_REQUIRED, "N",
     "offline optimum: subgradient iterations per size (default\n5000; 0 = the closed-form bound only)"},
    {"opt-seconds", O_OPT_SECONDS, MOE_OPT_REQUIRED, "S",
     "offline optimum: time limit per size (default 20; 0 = none)"},
    {"fit-route", O_FIT_ROUTE, MOE_OPT_NONE, NULL,
     "also fit cache-aware routing's margin (moe-run --route-margin)\non the profile's router logits (profile --router-logits f16)\n"
     "and write it into the tuning (cache_route.margin)"},
    {"route-target", O_ROUTE_TARGET, MOE_OPT_REQUIRED, "X",
     "router probability given up per expert use that the margin\nmay cost on the calibration text (default 0.001)"},
    {"json", O_JSON, MOE_OPT_NONE, NULL, "everything as JSON on stdout"},
    {"csv", O_CSV, MOE_OPT_REQUIRED, "FILE", "also write the table as CSV"},
    {"no-tuning", O_NO_TUNING, MOE_OPT_NONE, NULL, "do not write the bundle's tuning section"},
    {"no-profile-update", O_NO_PROFILE_UPDATE, MOE_OPT_NONE, NULL, "do not add the cache.* arrays to the profile"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this text"},
    {NULL, 0, 0, NULL, NULL},
};

static void fc_usage(FILE *f) {
    fprintf(f, "usage: moe-prep fit-cache MODEL.moeb --profile PROFILE.h5 (--fast-mem SIZE | --cache-experts H,L)\n"
               "                          [options]\n"
               "\n"
               "Replays the routing traces that `moe-prep profile` recorded through the\n"
               "expert-cache policies (LRU, LFU per sequence and global, LHU, forward layer\n"
               "distance, EdgeMoE, Twiddler's static placement, HOBBIT, Belady's MIN) with a\n"
               "high- and a low-precision cache and HOBBIT's precision rule (T1/T2), fits\n"
               "HOBBIT's priority (the paper's four weights, a popularity weight and admission\n"
               "control) on the fit part of the sequences and prints,\n"
               "for the held-out part at each cache size: hit ratio, miss penalty per token\n"
               "(a high-precision miss costs 1, a low one B_low/B_high), bytes moved per\n"
               "token and the gap to the offline optimum (a proven lower bound on every\n"
               "policy that does not prefetch; exact where the best schedule found meets\n"
               "it). Writes the weights and the cache sizes into\n"
               "the bundle's tuning section (hobbit.cache.*) and the curves into the profile\n"
               "(cache.* arrays, shown by `moe-prep profile report`). See docs/cache-sim.md.\n"
               "\noptions:\n");
    moe_opt_help(f, k_opts);
    fprintf(f, "\nexamples:\n"
               "  moe-prep fit-cache mixtral.moeb --profile p.h5 --fast-mem 24GiB\n"
               "  moe-prep fit-cache tiny.moeb --profile p.h5 --cache-experts 8,4 --sizes 4,8,16,24 --json\n");
}

/* parse_list: comma-separated integers in [lo, hi]; n in [n_min, n_max]. */
static int parse_list(const char *opt, const char *v, long long lo, long long hi, int n_min, int n_max,
                      long long *out, int *n) {
    const char *q = v;
    *n = 0;
    for (;;) {
        char *end;
        errno = 0;
        long long x = strtoll(q, &end, 10);
        if (end == q || errno || x < lo || x > hi || *n >= n_max || (*end && *end != ',')) goto bad;
        out[(*n)++] = x;
        if (!*end) break;
        q = end + 1;
    }
    if (*n >= n_min) return 1;
bad:
    fprintf(stderr, "moe-prep " CMD ": %s wants %d to %d comma-separated integers in [%lld, %lld], not \"%s\"\n",
            opt, n_min, n_max, lo, hi, v);
    return 0;
}

/* num / integer: an option's number in [lo, hi]; 2 after a usage message. */
static int num(const struct moe_opt *o, const char *v, double lo, double hi, double *dst) {
    char name[64];
    snprintf(name, sizeof name, "--%s", o->name);
    return moe_tool_parse_double(CMD, name, v, lo, hi, dst) ? 0 : 2;
}

static int integer(const struct moe_opt *o, const char *v, long long lo, long long hi, int *dst) {
    char name[64];
    long long n;
    snprintf(name, sizeof name, "--%s", o->name);
    if (!moe_tool_parse_ll(CMD, name, v, lo, hi, &n)) return 2;
    *dst = (int)n;
    return 0;
}

/* on_value: the options that take a value. */
static int on_value(struct fc_args *a, const struct moe_opt *o, const char *v) {
    struct moe_fit_cache_params *fp = &a->fp;
    long long pair[2], bytes;
    int np;
    switch (o->key) {
    case O_PROFILE: a->profile = v; return 0;
    case O_CSV: a->csv = v; return 0;
    case O_HIGH: fp->high = v; return 0;
    case O_LOW: fp->low = v; return 0;
    case O_FAST_MEM:
        if (!moe_tool_parse_size(CMD, "--fast-mem", v, &bytes)) return 2;
        fp->fast_mem = (double)bytes;
        return 0;
    case O_CACHE_EXPERTS:
        if (!parse_list("--cache-experts", v, 0, 1 << 30, 2, 2, pair, &np)) return 2;
        fp->cache_high = pair[0], fp->cache_low = pair[1];
        return 0;
    case O_SIZES: return parse_list("--sizes", v, 1, 1 << 30, 1, MOE_FIT_CACHE_MAX_SIZES - 4, fp->sizes, &fp->n_sizes) ? 0 : 2;
    case O_LOW_SHARE: return num(o, v, 0, 0.99, &fp->low_share);
    case O_HELDOUT: return num(o, v, 0, 0.9, &fp->heldout);
    case O_LOW_COST: return num(o, v, 0, 10, &fp->low_cost);
    case O_T1: return num(o, v, 0, 1, &fp->t1);
    case O_T2: return num(o, v, 0, 1, &fp->t2);
    case O_PROMPT_LEN: return integer(o, v, 0, 1 << 24, &fp->prompt_len);
    case O_PREFETCH: return integer(o, v, 0, 4096, &fp->prefetch);
    case O_PATH_ORDER: return integer(o, v, 1, 2, &fp->path_order);
    case O_OPT_ITERS: return integer(o, v, 0, 10000000, &fp->opt_iters);
    case O_OPT_SECONDS: return num(o, v, 0, 1e6, &fp->opt_seconds);
    case O_ROUTE_TARGET: return num(o, v, 0, 1, &a->route_target);
    }
    return 2;
}

/* on_option: one option into a; 2 after a usage message. */
static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    struct fc_args *a = ctx;
    switch (o->key) {
    case 'h': fc_usage(stdout); return HELP_PRINTED;
    case O_JSON: a->json = 1; return 0;
    case O_NO_TUNING: a->no_tuning = 1; return 0;
    case O_NO_PROFILE_UPDATE: a->no_profile_update = 1; return 0;
    case O_FIT_PER_SIZE: a->fp.fit_per_size = 1; return 0;
    case O_FIT_ONCE: a->fp.fit_per_size = 0; return 0;
    case O_PAPER: a->fp.paper = 1; return 0;
    case O_FIT_ROUTE: a->fit_route = 1; return 0;
    }
    return on_value(a, o, v);
}

/* fc_parse: 0 ok, 1 help printed, 2 usage error (reported). */
static int fc_parse(int argc, char **argv, struct fc_args *a) {
    memset(a, 0, sizeof *a);
    a->fp = moe_fit_cache_default_params();
    a->route_target = MOE_FIT_ROUTE_DEFAULT_TARGET;
    const struct moe_opt *tables[] = {k_opts};
    int first = argc;
    int rc = moe_opt_parse("moe-prep " CMD, argc, argv, 1, tables, 1, on_option, a, &first);
    if (rc) return rc;
    if (first < argc) a->bundle = argv[first];
    if (argc - first > 1) {
        fprintf(stderr, "moe-prep " CMD ": one MODEL.moeb only (\"%s\" and \"%s\")\n", a->bundle, argv[first + 1]);
        return 2;
    }
    const struct moe_fit_cache_params *fp = &a->fp;
    const char *why = !a->bundle                                    ? "no MODEL.moeb given"
                      : !a->profile                                 ? "no --profile PROFILE.h5 given"
                      : fp->fast_mem < 0 && fp->cache_high < 0      ? "give --fast-mem SIZE or --cache-experts H,L"
                      : fp->fast_mem >= 0 && fp->cache_high >= 0    ? "--fast-mem and --cache-experts exclude each other"
                      : fp->t1 >= 0 && fp->t2 >= 0 && fp->t1 > fp->t2 ? "--t1 must not exceed --t2"
                                                                    : NULL;
    if (why) {
        fprintf(stderr, "moe-prep " CMD ": %s (see moe-prep " CMD " --help)\n", why);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------ outputs */

/* human: bytes with a binary unit. */
static void human(char *buf, size_t n, double x) {
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (fabs(x) >= 1024 && i < 4) x /= 1024, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", x, u[i]);
}

/* print_size: one size's table. */
static void print_size(const struct fc_args *a, const struct moe_fit_cache_model *m, const struct moe_fit_cache_size *z) {
    char b1[32], b2[32];
    human(b1, sizeof b1, z->hi * m->hi_bytes + z->lo * m->lo_bytes);
    printf("\ncache: %d high + %d low experts (%s, %.0f %% of %d experts at high precision)%s\n", z->hi, z->lo,
           b1, 100.0 * z->hi / m->LE, m->LE, z->primary ? "  [fitted size]" : "");
    if (a->fp.fit_per_size && !z->primary)
        printf("  hobbit weights fitted at this size: w_lru %.4f  w_lfu %.4f  w_lhu %.4f  w_fld %.4f  "
               "w_pop %.4f  admission %s\n", z->w[0], z->w[1], z->w[2], z->w[3], z->w[4], z->admit ? "on" : "off");
    printf("  %-11s %10s %14s %14s %14s\n", "policy", "hit ratio", "penalty/token", "bytes/token", "gap to bound");
    for (int q = 0; q < P; q++) {
        const struct moe_cache_stats *st = &z->st[q];
        double g = moe_fit_cache_gap(z, q);
        char gs[24];
        if (isfinite(g)) snprintf(gs, sizeof gs, "%+.1f %%", g);
        else snprintf(gs, sizeof gs, "-");
        human(b2, sizeof b2, per_tok(st->bytes, st));
        printf("  %-11s %8.2f %% %14.4f %14s %14s\n", moe_cache_policy_name((enum moe_cache_policy)q),
               100 * moe_cache_hit_ratio(st), per_tok(st->penalty, st), b2, gs);
    }
    const struct moe_cache_opt_result *o = &z->opt;
    printf("  %-11s %10s %14.4f %14s %14s\n", o->exact ? "optimum" : "bound", "-", per_tok(o->lower, &z->st[0]), "-",
           "0");
    if (o->exact)
        printf("  offline optimum %.4f per token, exact: a schedule meets the bound (%d iterations, %.1f s)\n",
               per_tok(o->lower, &z->st[0]), o->iters, o->seconds);
    else
        printf("  offline optimum between %.4f (proven bound) and %.4f per token (best schedule found, %+.1f %%); "
               "%d iterations, %.1f s, stopped: %s\n", per_tok(o->lower, &z->st[0]), per_tok(o->upper, &z->st[0]),
               o->lower > 0 ? 100 * (o->upper - o->lower) / o->lower : 0.0, o->iters, o->seconds,
               moe_cache_opt_stop_name(o->stop));
    int b = moe_fit_cache_best_single(z->st);
    double hp = z->st[MOE_CACHE_HOBBIT].penalty, sp = z->st[b].penalty;
    printf("  hobbit against the best other online policy (%s): %+.1f %% penalty\n",
           moe_cache_policy_name((enum moe_cache_policy)b), sp > 0 ? 100 * (hp - sp) / sp : 0.0);
}

/* print_table: the human-readable report. */
static void print_table(const struct fc_args *a, const struct moe_fit_cache_model *m,
                        const struct moe_fit_cache_result *r) {
    char b1[32], b2[32];
    printf("fit-cache: %s with %s: %d MoE layers x %d experts, top-%d\n", a->bundle, a->profile, m->L, m->E, m->K);
    printf("sequences: %d fit (%lld tokens), %d %s (%lld tokens)\n", r->n_fit, (long long)r->fit_tokens, r->n_held,
           r->in_sample ? "reported on, the same (nothing held out)" : "held out", (long long)r->held_tokens);
    human(b1, sizeof b1, m->hi_bytes), human(b2, sizeof b2, m->lo_bytes);
    printf("precisions: high %s (%s per expert), low %s (%s); a low miss costs %.4f of a high one\n", m->hi_name, b1,
           m->lo_name, b2, m->low_cost);
    printf("HOBBIT thresholds (%s): T1 %.4f, T2 %.4f; prompt batch %d tokens; prefetch %d", m->t_source, m->t1, m->t2,
           a->fp.prompt_len, a->fp.prefetch);
    if (a->fp.prefetch) printf(" (order-%d paths)", a->fp.path_order);
    printf("\n");
    const int bs = moe_fit_cache_best_single(r->fit_single);
    printf("fitted weights (fit part, %d replays, %.1f s): w_lru %.4f  w_lfu %.4f  w_lhu %.4f  w_fld %.4f  "
           "w_pop %.4f  admission %s\n", r->evals, r->fit_seconds, r->w[0], r->w[1], r->w[2], r->w[3], r->w[4],
           r->admit ? "on" : "off");
    printf("  fit-part penalty per token: hobbit %.4f, best other online policy %s %.4f\n",
           per_tok(r->fit_best.penalty, &r->fit_best), moe_cache_policy_name((enum moe_cache_policy)bs),
           per_tok(r->fit_single[bs].penalty, &r->fit_single[bs]));
    printf("gap to bound: penalty above the offline optimum's proven lower bound, which no policy without prefetch\n"
           "goes below; belady is a heuristic with two precisions, not a bound%s\n",
           a->fp.prefetch ? "; policies that prefetch (all but twiddler and belady here) may go below" : "");
    for (int s = 0; s < r->n_sizes; s++) print_size(a, m, &r->sizes[s]);
    if (r->n_dyn == 0) return;
    printf("\ndynamic precision (fitted hobbit, %.0f %% of the bytes for low copies) against every byte as high copies "
           "(lru), held out:\n  budget (share of the high bytes)  penalty/token with / without   caches with / without\n",
           100 * a->fp.low_share);
    for (int i = 0; i < r->n_dyn; i++) {
        const struct moe_fit_cache_dyn *d = &r->dyn[i];
        printf("  %5.0f %%   %26.4f / %-10.4f   %d+%d / %d%s\n", 100 * d->share, d->pen_on, d->pen_off, d->hi_on,
               d->lo_on, d->hi_off, d->pen_off <= d->pen_on ? "   high only misses less" : "");
    }
    if (isnan(r->dynamic_until)) printf("  dynamic precision pays at every budget replayed\n");
    else
        printf("  from %.0f %% of the high bytes up, high copies only (lru) miss less: moe-run's --dynamic auto "
               "turns it off there (tuning cache.dynamic_until %.2f)\n", 100 * r->dynamic_until, r->dynamic_until);
}
static const char *const k_wnames[MOE_CACHE_N_WEIGHTS] = {"lru", "lfu", "lhu", "fld", "pop"};

/* jnum: x as a JSON number, null when not finite. */
static cJSON *jnum(double x) { return isfinite(x) ? cJSON_CreateNumber(x) : cJSON_CreateNull(); }

/* jstats: one policy's counts into o. */
static void jstats(cJSON *o, const struct moe_cache_stats *st) {
    cJSON_AddItemToObject(o, "hit_ratio", jnum(moe_cache_hit_ratio(st)));
    cJSON_AddItemToObject(o, "penalty_per_token", jnum(per_tok(st->penalty, st)));
    cJSON_AddItemToObject(o, "bytes_per_token", jnum(per_tok(st->bytes, st)));
    cJSON_AddItemToObject(o, "penalty", jnum(st->penalty));
    const char *const names[] = {"tokens", "accesses", "hits_high", "hits_low", "misses_high", "misses_low", "skips",
                                 "prefetch_loads", "prefetch_hits"};
    const int64_t v[] = {st->tokens, st->accesses, st->hits_high, st->hits_low, st->misses_high, st->misses_low,
                         st->skips, st->prefetch_loads, st->prefetch_hits};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) cJSON_AddNumberToObject(o, names[i], (double)v[i]);
}

/* jweights: HOBBIT's weights by name. */
static cJSON *jweights(const double *w) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; o && i < MOE_CACHE_N_WEIGHTS; i++) cJSON_AddItemToObject(o, k_wnames[i], jnum(w[i]));
    return o;
}

/* jresults: every policy's stats (and gap to Belady at size z, when given). */
static cJSON *jresults(const struct moe_cache_stats *st, const struct moe_fit_cache_size *z) {
    cJSON *a = cJSON_CreateArray();
    for (int q = 0; a && q < P; q++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "policy", moe_cache_policy_name((enum moe_cache_policy)q));
        jstats(o, &st[q]);
        if (z) cJSON_AddItemToObject(o, "gap_to_bound_pct", jnum(moe_fit_cache_gap(z, q)));
        if (z) cJSON_AddItemToObject(o, "gap_to_belady_pct", jnum(moe_fit_cache_gap_belady(z, q)));
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

/* jprecision: one precision's name and sizes. */
static cJSON *jprecision(const char *name, double bytes, double stored) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "bytes", round(bytes));
    cJSON_AddNumberToObject(o, "stored_bytes", round(stored));
    return o;
}

/* jopt: the offline optimum at size z (penalties per token and in all). */
static cJSON *jopt(const struct moe_fit_cache_size *z) {
    const struct moe_cache_opt_result *o = &z->opt;
    const struct moe_cache_stats *t = &z->st[0];
    cJSON *x = cJSON_CreateObject();
    cJSON_AddItemToObject(x, "lower_bound_per_token", jnum(per_tok(o->lower, t)));
    cJSON_AddItemToObject(x, "best_schedule_per_token", jnum(per_tok(o->upper, t)));
    cJSON_AddBoolToObject(x, "exact", o->exact);
    cJSON_AddItemToObject(x, "lower_bound", jnum(o->lower));
    cJSON_AddItemToObject(x, "best_schedule", jnum(o->upper));
    cJSON_AddItemToObject(x, "lagrangian", jnum(o->lagrangian));
    cJSON_AddItemToObject(x, "closed_form", jnum(o->closed_form));
    cJSON_AddNumberToObject(x, "requests", (double)o->requests);
    cJSON_AddNumberToObject(x, "iterations", o->iters);
    cJSON_AddItemToObject(x, "seconds", jnum(o->seconds));
    cJSON_AddStringToObject(x, "stopped", moe_cache_opt_stop_name(o->stop));
    return x;
}

/* json_setup: what the run was given and found (files, shape, split, precisions, settings). */
static void json_setup(cJSON *o, const struct fc_args *a, const struct moe_fit_cache_model *m,
                       const struct moe_fit_cache_result *r) {
    cJSON_AddStringToObject(o, "bundle", a->bundle);
    cJSON_AddStringToObject(o, "profile", a->profile);
    cJSON *x = cJSON_AddObjectToObject(o, "model");
    cJSON_AddNumberToObject(x, "moe_layers", m->L);
    cJSON_AddNumberToObject(x, "experts", m->E);
    cJSON_AddNumberToObject(x, "k", m->K);
    x = cJSON_AddObjectToObject(o, "sequences");
    cJSON_AddNumberToObject(x, "total", r->n_seq);
    cJSON_AddNumberToObject(x, "fit", r->n_fit);
    cJSON_AddNumberToObject(x, "heldout", r->in_sample ? 0 : r->n_held);
    cJSON_AddItemToObject(x, "heldout_share", jnum(a->fp.heldout));
    cJSON_AddStringToObject(x, "reported_on", r->in_sample ? "fit" : "heldout");
    x = cJSON_AddObjectToObject(o, "tokens");
    cJSON_AddNumberToObject(x, "fit", (double)r->fit_tokens);
    cJSON_AddNumberToObject(x, "reported", (double)r->held_tokens);
    x = cJSON_AddObjectToObject(o, "precision");
    cJSON_AddItemToObject(x, "high", jprecision(m->hi_name, m->hi_bytes, m->hi_stored));
    cJSON_AddItemToObject(x, "low", jprecision(m->lo_name, m->lo_bytes, m->lo_stored));
    cJSON_AddItemToObject(x, "low_cost", jnum(m->low_cost));
    x = cJSON_AddObjectToObject(o, "thresholds");
    cJSON_AddItemToObject(x, "t1", jnum(m->t1));
    cJSON_AddItemToObject(x, "t2", jnum(m->t2));
    cJSON_AddStringToObject(x, "source", m->t_source);
    cJSON_AddNumberToObject(o, "prompt_len", a->fp.prompt_len);
    cJSON_AddNumberToObject(o, "prefetch", a->fp.prefetch);
    cJSON_AddNumberToObject(o, "path_order", a->fp.path_order);
    cJSON_AddItemToObject(o, "fast_mem_bytes", a->fp.fast_mem >= 0 ? cJSON_CreateNumber(round(a->fp.fast_mem))
                                                                    : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "low_share", jnum(a->fp.low_share));
}

/* json_tree: the whole result as one object (docs/cache-sim.md lists the keys). */
static cJSON *json_tree(const struct fc_args *a, const struct moe_fit_cache_model *m,
                        const struct moe_fit_cache_result *r, int n_keys, int updated) {
    cJSON *o = cJSON_CreateObject();
    json_setup(o, a, m, r);
    cJSON *x = cJSON_AddObjectToObject(o, "fitted_size");
    cJSON_AddNumberToObject(x, "high_experts", r->H);
    cJSON_AddNumberToObject(x, "low_experts", r->Lc);
    x = cJSON_AddArrayToObject(o, "policies");
    for (int q = 0; q < P; q++) cJSON_AddItemToArray(x, cJSON_CreateString(moe_cache_policy_name((enum moe_cache_policy)q)));
    x = cJSON_AddObjectToObject(o, "fit");
    cJSON_AddItemToObject(x, "weights", jweights(r->w));
    cJSON_AddBoolToObject(x, "admission", r->admit);
    cJSON_AddNumberToObject(x, "replays", r->evals);
    cJSON_AddItemToObject(x, "seconds", jnum(r->fit_seconds));
    cJSON_AddItemToObject(x, "results", jresults(r->fit_single, NULL));
    x = cJSON_AddArrayToObject(o, "sizes");
    for (int s = 0; s < r->n_sizes; s++) {
        const struct moe_fit_cache_size *z = &r->sizes[s];
        cJSON *y = cJSON_CreateObject();
        cJSON_AddNumberToObject(y, "high_experts", z->hi);
        cJSON_AddNumberToObject(y, "low_experts", z->lo);
        cJSON_AddNumberToObject(y, "bytes", round(z->hi * m->hi_bytes + z->lo * m->lo_bytes));
        cJSON_AddBoolToObject(y, "fitted", z->primary);
        cJSON_AddItemToObject(y, "weights", jweights(z->w));
        cJSON_AddBoolToObject(y, "admission", z->admit);
        cJSON_AddItemToObject(y, "offline_optimum", jopt(z));
        cJSON_AddItemToObject(y, "results", jresults(z->st, z));
        cJSON_AddItemToArray(x, y);
    }
    x = cJSON_AddObjectToObject(o, "dynamic_precision");
    cJSON_AddItemToObject(x, "until_share", jnum(r->dynamic_until));
    cJSON *g = cJSON_AddArrayToObject(x, "grid");
    for (int i = 0; i < r->n_dyn; i++) {
        const struct moe_fit_cache_dyn *d = &r->dyn[i];
        cJSON *y = cJSON_CreateObject();
        cJSON_AddNumberToObject(y, "share", d->share);
        cJSON_AddNumberToObject(y, "high_on", d->hi_on);
        cJSON_AddNumberToObject(y, "low_on", d->lo_on);
        cJSON_AddNumberToObject(y, "high_off", d->hi_off);
        cJSON_AddItemToObject(y, "penalty_on", jnum(d->pen_on));
        cJSON_AddItemToObject(y, "penalty_off", jnum(d->pen_off));
        cJSON_AddItemToArray(g, y);
    }
    cJSON_AddNumberToObject(o, "tuning_keys", n_keys);
    cJSON_AddBoolToObject(o, "profile_updated", updated);
    return o;
}

/* print_json: the tree on stdout; 0 when it cannot be built. */
static int print_json(const struct fc_args *a, const struct moe_fit_cache_model *m,
                      const struct moe_fit_cache_result *r, int n_keys, int updated) {
    cJSON *o = json_tree(a, m, r, n_keys, updated);
    char *s = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!s) {
        fprintf(stderr, "moe-prep " CMD ": out of memory\n");
        return 0;
    }
    printf("%s\n", s);
    cJSON_free(s);
    return 1;
}

/* write_csv: the table as CSV, via a temporary file renamed over path. */
static int write_csv(const char *path, const struct moe_fit_cache_result *r) {
    struct moe_tmp_file t = {NULL, NULL, -1, NULL, 0}; /* exclusive, beside path: never through a planted link */
    FILE *f = NULL;
    int ok = 0;
    if (moe_tmp_create(path, &t) || !(f = moe_tmp_stream(&t))) goto done;
    fputs("high_experts,low_experts,fitted,policy,hit_ratio,penalty_per_token,bytes_per_token,gap_to_belady_pct,"
          "accesses,hits_high,hits_low,misses_high,misses_low,skips,prefetch_loads,prefetch_hits,gap_to_bound_pct,"
          "bound_per_token,bound_exact\n", f);
    for (int s = 0; s < r->n_sizes; s++)
        for (int q = 0; q < P; q++) {
            const struct moe_fit_cache_size *z = &r->sizes[s];
            const struct moe_cache_stats *st = &z->st[q];
            double v[4] = {moe_cache_hit_ratio(st), per_tok(st->penalty, st), per_tok(st->bytes, st),
                           moe_fit_cache_gap_belady(z, q)};
            fprintf(f, "%d,%d,%d,%s", z->hi, z->lo, z->primary, moe_cache_policy_name((enum moe_cache_policy)q));
            for (int i = 0; i < 4; i++) {
                if (isfinite(v[i])) fprintf(f, ",%.10g", v[i]);
                else fputs(",", f);
            }
            fprintf(f, ",%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld", (long long)st->accesses, (long long)st->hits_high,
                    (long long)st->hits_low, (long long)st->misses_high, (long long)st->misses_low,
                    (long long)st->skips, (long long)st->prefetch_loads, (long long)st->prefetch_hits);
            const double gb = moe_fit_cache_gap(z, q), bt = per_tok(z->opt.lower, st);
            if (isfinite(gb)) fprintf(f, ",%.10g", gb);
            else fputs(",", f);
            if (isfinite(bt)) fprintf(f, ",%.10g", bt);
            else fputs(",", f);
            fprintf(f, ",%d\n", z->opt.exact);
        }
    ok = moe_tmp_commit(&t) == MOE_OK; /* flush, fsync, rename; removed on failure */
done:
    moe_tmp_discard(&t);
    if (!ok) fprintf(stderr, "moe-prep " CMD ": cannot write %s (see the message above)\n", path);
    return ok;
}


/* Progress of the fit on stderr, at most every 2 seconds. */
static void on_progress(const struct moe_fit_cache_event *ev, void *user) {
    double *last = user, t = moe_now_s();
    if (ev->stage == MOE_FIT_CACHE_FIT_START) {
        fprintf(stderr, "moe-prep " CMD ": fitting HOBBIT's weights on %d sequences (%lld accesses) with %d high + %d "
                        "low experts\n", ev->n_fit, (long long)ev->accesses, ev->hi, ev->lo);
        *last = t;
    } else if (ev->stage == MOE_FIT_CACHE_OPT) {
        fprintf(stderr, "moe-prep " CMD ": bounding the offline optimum for %d high + %d low experts (%lld accesses)\n",
                ev->hi, ev->lo, (long long)ev->accesses);
        *last = t;
    } else if (ev->stage == MOE_FIT_CACHE_FIT_SIZE) {
        fprintf(stderr, "moe-prep " CMD ": fitting HOBBIT's weights for %d high + %d low experts\n", ev->hi, ev->lo);
        *last = t;
    } else if (t - *last >= 2.0) {
        *last = t;
        if (ev->done <= ev->total)
            fprintf(stderr, "moe-prep " CMD ": fitting HOBBIT's weights: grid point %d of %d (%.0f s)\n", ev->done,
                    ev->total, ev->seconds);
        else
            fprintf(stderr, "moe-prep " CMD ": fitting HOBBIT's weights: refining, %d replays (%.0f s)\n", ev->done,
                    ev->seconds);
    }
}

/* compute: model, plan and sweep on the open files; 0, or the exit status. */
static int compute(struct fc_args *a, const struct moe_bundle *b, const struct moe_profile *p,
                   struct moe_fit_cache_model *m, struct moe_fit_cache_result **r) {
    enum moe_status st;
    if (moe_profile_n_tokens(p) == 0) {
        fprintf(stderr, "moe-prep " CMD ": %s holds no tokens: profile more text\n", a->profile);
        return 1;
    }
    if ((st = moe_fit_cache_model_init(b, a->bundle, p, a->profile, &a->fp, m)))
        return st == MOE_ERR_INVALID ? 2 : 1;
    if (moe_fit_cache_result_new(m, r)) {
        fprintf(stderr, "moe-prep " CMD ": out of memory\n");
        return 1;
    }
    if (moe_fit_cache_plan(&a->fp, m, *r)) return 2; /* every planning error is a usage error (logged) */
    if (moe_fit_cache_sweep(&a->fp, p, m, *r)) return 1;
    return 0;
}

/* write_outputs: the CSV, the profile's cache.* arrays, the bundle's tuning, then the report. */
static int write_outputs(const struct fc_args *a, struct moe_profile *p, const struct moe_fit_cache_model *m,
                         const struct moe_fit_cache_result *r) {
    int n_keys = 0, updated = 0;
    enum moe_status st;
    if (a->csv && !write_csv(a->csv, r)) return 1;
    if (!a->no_profile_update) {
        if (moe_fit_cache_update_profile(p, a->profile, &a->fp, m, r)) {
            fprintf(stderr, "moe-prep " CMD ": cannot update %s (see the message above); it is unchanged\n", a->profile);
            return 1;
        }
        updated = 1;
    }
    if (!a->no_tuning && (st = moe_fit_cache_write_tuning(a->bundle, m, r, &n_keys))) {
        fprintf(stderr, "moe-prep " CMD ": cannot write the tuning section of %s: %s (see above)\n", a->bundle,
                moe_status_str(st));
        return 1;
    }
    if (a->json && !print_json(a, m, r, n_keys, updated)) return 1;
    if (!a->json) print_table(a, m, r);
    if (!a->no_tuning)
        fprintf(stderr, "moe-prep " CMD ": wrote the weights and cache sizes into the tuning section of %s (%d keys)\n",
                a->bundle, n_keys);
    if (updated) fprintf(stderr, "moe-prep " CMD ": added the cache.* arrays to %s\n", a->profile);
    return 0;
}

/* fit_route: --fit-route: the margin of cache-aware routing on the
 * profile's sequences at the fitted size, its table (stderr with --json,
 * else stdout) and the tuning key; 0 or the exit status. */
static int fit_route(const struct fc_args *a, const struct moe_profile *p, const struct moe_fit_cache_model *m,
                     const struct moe_fit_cache_result *r) {
    struct moe_fit_route_result res;
    enum moe_status st = moe_fit_cache_route(p, m, r, a->route_target, &res);
    if (st) {
        fprintf(stderr, "moe-prep " CMD ": --fit-route: %s (see the message above)\n", moe_status_str(st));
        return st == MOE_ERR_NOT_FOUND || st == MOE_ERR_INVALID ? 2 : 1;
    }
    FILE *f = a->json ? stderr : stdout;
    fprintf(f, "\ncache-aware routing at %d high + %d low copies (hobbit), %lld tokens decoded:\n", r->H, r->Lc,
            (long long)res.tokens);
    fprintf(f, "  %-8s %12s %14s %12s %14s\n", "margin", "loads/token", "MiB/token", "replaced", "mass/use");
    for (int i = 0; i < res.n_points; i++) {
        const struct moe_fit_route_point *q = &res.pts[i];
        fprintf(f, "  %-8.4g %12.3f %14.3f %11.2f%% %14.5f%s\n", q->margin, q->loads_per_token,
                q->bytes_per_token / 1048576.0, 100.0 * q->subst_share, q->mass_per_use,
                q->margin == res.margin ? "  <- fitted" : "");
    }
    fprintf(f, "  fitted margin %g: the largest with mass/use <= %g\n", res.margin, res.target);
    if (!a->no_tuning) {
        if ((st = moe_fit_cache_route_write(a->bundle, &res))) {
            fprintf(stderr, "moe-prep " CMD ": cannot write cache_route.margin into %s: %s\n", a->bundle,
                    moe_status_str(st));
            return 1;
        }
        fprintf(stderr, "moe-prep " CMD ": wrote cache_route.margin %g into the tuning section of %s\n", res.margin,
                a->bundle);
    }
    return 0;
}

int moe_prep_fit_cache(int argc, char **argv) {
    struct fc_args a;
    int rc = fc_parse(argc, argv, &a);
    if (rc) return rc == HELP_PRINTED ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    const char *inputs[2] = {a.profile, a.bundle};
    if (!moe_tool_output_ok(CMD, a.csv, NULL, NULL, 0, inputs, 2)) return 2; /* --csv naming an input */
    struct moe_profile *p = NULL;
    struct moe_bundle *b = NULL;
    struct moe_fit_cache_result *r = NULL;
    struct moe_fit_cache_model m;
    double last = 0;
    a.fp.progress = on_progress, a.fp.user = &last;
    rc = 1;
    if (moe_profile_read(a.profile, &p) != MOE_OK) {
        fprintf(stderr, "moe-prep " CMD ": cannot read the profile %s (see the message above)\n", a.profile);
        goto done;
    }
    if (moe_bundle_open(a.bundle, &b) != MOE_OK) {
        fprintf(stderr, "moe-prep " CMD ": cannot open the bundle %s (see the message above)\n", a.bundle);
        goto done;
    }
    if ((rc = compute(&a, b, p, &m, &r))) goto done;
    moe_bundle_free(b); /* closed before the tuning is replaced */
    b = NULL;
    rc = write_outputs(&a, p, &m, r);
    if (!rc && a.fit_route) rc = fit_route(&a, p, &m, r);
done:
    moe_profile_free(p);
    moe_bundle_free(b);
    moe_fit_cache_result_free(r);
    return rc;
}

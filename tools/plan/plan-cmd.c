/*
 * plan-cmd.c - `moe-prep plan`: parses, calls moe_plan_bundle (plan-bundle.h),
 * prints the best plans (a table, or JSON) and, with --apply, writes the
 * chosen one into the bundle's tuning (moe_plan_apply).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-opt.h"
#include "moe-options.h"
#include "moe-prep.h"
#include "moe-store.h"
#include "plan-bundle.h"
#include "tool-util.h"

#define CMD "plan"

enum { O_PROFILE = 256, O_MEM, O_QUALITY, O_EVAL_TEXT, O_EVAL_CTX, O_EVAL_CHUNKS, O_MAX_EVALS, O_HW, O_NO_MEASURE,
       O_CTX, O_PROMPT_LEN, O_NO_BL, O_TOP, O_APPLY, O_JSON };

static const struct moe_opt k_opts[] = {
    {"profile", O_PROFILE, MOE_OPT_REQUIRED, "FILE", "the profile of MODEL (moe-prep profile)"},
    {"mem", O_MEM, MOE_OPT_REQUIRED, "SIZE", "memory for the whole run (e.g. 2G, 512MiB)"},
    {"quality-budget", O_QUALITY, MOE_OPT_REQUIRED, "X%", "largest PPL rise allowed (default 2%; needs --eval-text)"},
    {"eval-text", O_EVAL_TEXT, MOE_OPT_REQUIRED, "SPEC", "held-out text for quality (a dataset spec, as eval)"},
    {"eval-ctx", O_EVAL_CTX, MOE_OPT_REQUIRED, "N", "tokens per eval chunk (default 128)"},
    {"eval-chunks", O_EVAL_CHUNKS, MOE_OPT_REQUIRED, "N", "chunks per eval (default 2)"},
    {"max-evals", O_MAX_EVALS, MOE_OPT_REQUIRED, "N", "quality evaluations at most (default 8)"},
    {"hw", O_HW, MOE_OPT_REQUIRED, "FILE", "the hardware table (default $XDG_CACHE_HOME/moe/hw.json)"},
    {"no-measure", O_NO_MEASURE, MOE_OPT_NONE, NULL, "fail instead of measuring when the table has no entry"},
    {"threads", 't', MOE_OPT_REQUIRED, "N", "CPU threads moe-run will use (default: all)"},
    {"ctx", O_CTX, MOE_OPT_REQUIRED, "N", "context the run needs, for the KV cache (default 2048,\nat most the model's)"},
    {"prompt-len", O_PROMPT_LEN, MOE_OPT_REQUIRED, "N", "prompt tokens of each replayed sequence (default 64)"},
    {"no-big-little", O_NO_BL, MOE_OPT_NONE, NULL, "do not search big-little thresholds"},
    {"top", O_TOP, MOE_OPT_REQUIRED, "N", "plans printed (default 8)"},
    {"apply", O_APPLY, MOE_OPT_NONE, NULL,
     "write the chosen plan into MODEL's tuning: moe-run then uses\nit unless --no-plan (its options still override)"},
    {"json", O_JSON, MOE_OPT_NONE, NULL, "the table as JSON on stdout"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this text"},
    {NULL, 0, 0, NULL, NULL},
};

static void plan_usage(FILE *f) {
    fprintf(f,
"usage: moe-prep plan MODEL.moeb --profile PROFILE.h5 --mem SIZE [options]\n"
"\n"
"What to keep where with SIZE bytes of memory, and how fast it will run.\n"
"Searches the engine's choices - each expert's home precision (every stored\n"
"precision, and the bit-width map if the bundle has one), HOBBIT's dynamic\n"
"precision (a low precision, T1/T2 from the profile), the cache policy (LRU,\n"
"or HOBBIT with fit-cache's weights), EdgeMoE's path prefetch, and MoBiLE's\n"
"big-little threshold gamma (fallback ratios of 10, 20, 30 and 50 %% on the\n"
"profile) - for each: the budget left for expert copies after the non-expert\n"
"weights, the KV cache and the store's scratch; the profile's held-out routing\n"
"replayed through the cache core (fit-cache's simulator, with big-little's\n"
"passes); every step timed with this machine's measured numbers (moe-prep hw;\n"
"measured now if the table has none). Prints the fastest plans: predicted\n"
"decode tokens/s, bytes read per token, hit ratio, quality cost, and the\n"
"moe-run options of each.\n"
"\n"
"Quality: with --eval-text, plans faster than the fastest exact one (largest\n"
"precision, no dynamic precision, no big-little: cost 0) are evaluated through\n"
"the engine, fastest first (moe-prep eval MODEL --ref MODEL with the plan's\n"
"options, one token per step), until one is within --quality-budget (a PPL\n"
"rise, default 2 %%). The chosen plan is the fastest one known to be within\n"
"the budget; without --eval-text only exact plans can be chosen.\n"
"\n"
"options:\n");
    moe_opt_help(f, k_opts);
    fprintf(f, "\n%s", moe_gpu_options_help());
    fprintf(f,
"\n"
"examples:\n"
"  moe-prep plan mixtral.moeb --profile p.h5 --mem 24G\n"
"  moe-prep plan tiny.moeb --profile p.h5 --mem 96M --eval-text c4.txt --quality-budget 1%% --apply\n");
}

struct plan_args {
    struct moe_plan_request rq;
    int top, apply, json, have_budget;
    struct moe_gpu_params gpu; /* --device and the GPU backend's options */
};

/* budget: "2%" or "0.02" as a fraction. 1 ok. */
static int budget(const char *v, double *out) {
    char num[64];
    size_t len = strlen(v);
    const int pct = len > 1 && v[len - 1] == '%';
    if (len >= sizeof num) len = sizeof num - 1;
    memcpy(num, v, len - (size_t)pct), num[len - (size_t)pct] = 0;
    if (!moe_tool_parse_double(CMD, "--quality-budget", num, 0, pct ? 1000 : 10, out)) return 0;
    if (pct) *out /= 100;
    return 1;
}

/* on_option: one option (moe_opt_parse's handler). */
static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    struct plan_args *a = ctx;
    struct moe_plan_request *rq = &a->rq;
    char opt[64];
    long long n = 0;
    if (o < k_opts || o >= k_opts + sizeof k_opts / sizeof k_opts[0]) /* the device table */
        return moe_device_option("moe-prep " CMD, &a->gpu, o->name, v) ? 2 : 0;
    snprintf(opt, sizeof opt, "--%s", o->name);
    static const struct { int key; long long lo, hi; } ranges[] = {
        {'t', 1, 4096}, {O_CTX, 1, 1 << 24}, {O_PROMPT_LEN, 0, 1 << 20}, {O_TOP, 1, 1000},
        {O_EVAL_CTX, 8, 1 << 16}, {O_EVAL_CHUNKS, 1, 1 << 16}, {O_MAX_EVALS, 0, 1000}};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (o->key == ranges[i].key && !moe_tool_parse_ll(CMD, opt, v, ranges[i].lo, ranges[i].hi, &n)) return 2;
    switch (o->key) {
    case 'h': plan_usage(stdout); return 1;
    case O_PROFILE: rq->profile = v; return 0;
    case O_HW: rq->hw_table = v; return 0;
    case O_EVAL_TEXT: rq->eval_text = v; return 0;
    case O_MEM: {
        int64_t b;
        if (moe_store_parse_size(v, &b) != MOE_OK || b <= 0) {
            fprintf(stderr, "moe-prep " CMD ": --mem wants a size such as 2G, 512M or 100000000, not \"%s\"\n", v);
            return 2;
        }
        rq->mem = b;
        return 0;
    }
    case O_QUALITY: a->have_budget = 1; return budget(v, &rq->quality_budget) ? 0 : 2;
    case 't': rq->threads = (int)n; return 0;
    case O_CTX: rq->ctx = (int)n; return 0;
    case O_PROMPT_LEN: rq->prompt_len = (int)n; return 0;
    case O_TOP: a->top = (int)n; return 0;
    case O_EVAL_CTX: rq->eval_ctx = (int)n; return 0;
    case O_EVAL_CHUNKS: rq->eval_chunks = (int)n; return 0;
    case O_MAX_EVALS: rq->max_evals = (int)n; return 0;
    case O_APPLY: a->apply = 1; return 0;
    case O_JSON: a->json = 1; return 0;
    case O_NO_MEASURE: rq->no_measure = 1; return 0;
    case O_NO_BL: rq->no_big_little = 1; return 0;
    default: return 2;
    }
}

/* note: the library's progress lines on stderr. */
static void note(const char *line, void *user) {
    (void)user;
    fprintf(stderr, "moe-prep " CMD ": %s\n", line);
}

/* parse_args: 0 ok, 1 help printed, 2 usage error. */
static int parse_args(int argc, char **argv, struct plan_args *a) {
    memset(a, 0, sizeof *a);
    a->rq = moe_plan_request_defaults();
    a->rq.note = note;
    a->top = 8;
    a->gpu = moe_gpu_default_params();
    const struct moe_opt *tables[] = {k_opts, moe_gpu_option_table()};
    int pos = argc;
    int rc = moe_opt_parse("moe-prep " CMD, argc, argv, 1, tables, 2, on_option, a, &pos);
    if (rc) return rc;
    if (!moe_device_built("moe-prep " CMD, a->gpu.device_spec)) return 2;
    a->rq.device = a->gpu.device_spec, a->rq.device_options = &a->gpu;
    if (pos < argc) a->rq.bundle = argv[pos];
    const char *why = !a->rq.bundle ? "no MODEL.moeb given" : pos + 1 < argc ? "one MODEL.moeb only"
                      : !a->rq.profile ? "no --profile PROFILE.h5 given" : a->rq.mem <= 0 ? "no --mem SIZE given"
                      : a->have_budget && !a->rq.eval_text ? "--quality-budget needs --eval-text" : NULL;
    if (why) {
        fprintf(stderr, "moe-prep " CMD ": %s (see moe-prep " CMD " --help)\n", why);
        return 2;
    }
    a->rq.want = a->top < 4 ? a->top : 4;
    return 0;
}

/* plan_json: one plan as a JSON object. */
static cJSON *plan_json(int rank, const struct moe_plan *p, const struct moe_plan_model *pm) {
    char opts[512];
    moe_plan_options(p, pm, opts, sizeof opts);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", rank);
    const struct { const char *k; double v; } nums[] = {
        {"tok_s", p->tok_s}, {"s_per_token", p->s_per_token}, {"bytes_per_token", p->bytes_per_token},
        {"hit_ratio", p->hit_ratio}, {"stall_share", p->stall_share}, {"expert_mem", (double)p->expert_mem},
        {"high_cap", p->high_cap}, {"low_cap", p->low_cap}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) cJSON_AddNumberToObject(o, nums[i].k, nums[i].v);
    cJSON_AddStringToObject(o, "high", p->high >= 0 ? pm->prec_name[p->high] : "map");
    if (p->low >= 0) cJSON_AddStringToObject(o, "low", pm->prec_name[p->low]);
    else cJSON_AddNullToObject(o, "low");
    cJSON_AddStringToObject(o, "policy", moe_cache_policy_name(p->policy));
    cJSON_AddNumberToObject(o, "prefetch_paths", p->prefetch_paths);
    cJSON_AddNumberToObject(o, "little_k", p->little_k);
    cJSON_AddNumberToObject(o, "gamma", p->gamma);
    cJSON_AddNumberToObject(o, "fallback", p->fallback);
    cJSON_AddBoolToObject(o, "neutral", p->neutral);
    cJSON_AddBoolToObject(o, "eligible", p->eligible);
    if (p->has_quality || p->neutral) {
        cJSON *q = cJSON_AddObjectToObject(o, "quality");
        cJSON_AddNumberToObject(q, "ppl_ratio", p->has_quality ? p->q.ppl_ratio : 1);
        cJSON_AddNumberToObject(q, "kld", p->has_quality ? p->q.kld : 0);
        cJSON_AddNumberToObject(q, "same_top", p->has_quality ? p->q.same_top : 1);
    } else {
        cJSON_AddNullToObject(o, "quality");
    }
    cJSON_AddStringToObject(o, "options", opts);
    return o;
}

static void print_json(const struct moe_plan_request *rq, const struct moe_plan_outcome *o) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", rq->bundle);
    cJSON_AddNumberToObject(j, "mem", (double)rq->mem);
    cJSON_AddNumberToObject(j, "fixed_bytes", (double)o->pm.fixed_bytes);
    cJSON_AddNumberToObject(j, "threads", rq->threads);
    cJSON_AddNumberToObject(j, "chosen", o->res.chosen);
    cJSON_AddNumberToObject(j, "evals", o->res.n_evals);
    cJSON *plans = cJSON_AddArrayToObject(j, "plans");
    for (int i = 0; i < o->res.n; i++) cJSON_AddItemToArray(plans, plan_json(i + 1, &o->res.plans[i], &o->pm));
    char *s = cJSON_Print(j);
    if (s) printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
}

static void print_table(const struct moe_plan_request *rq, int top, int applied, const struct moe_plan_outcome *o) {
    const struct moe_plan_model *pm = &o->pm;
    const struct moe_plan_result *r = &o->res;
    printf("plans for %s in %.1f MiB (%.1f MiB outside the expert store: non-expert weights, KV cache for %d "
           "tokens, process), %d threads; %lld held-out tokens replayed per plan, %d plans, %d did not fit\n\n",
           rq->bundle, (double)rq->mem / 1048576, (double)pm->fixed_bytes / 1048576, rq->ctx, rq->threads,
           (long long)r->heldout_tokens, r->n, r->n_infeasible);
    for (int part = 0; part < 2; part++) {
        int shown = 0, last = -1, skipped = 0;
        if (part == 0)
            printf("plans within the quality budget (exact: the reference's computation; measured: an eval through "
                   "the engine), fastest first:\n");
        else
            printf("\nfaster plans that are not (over the budget, or quality not measured):\n");
        printf("  #   tok/s  ms/tok  MB read/tok  hit %%  stall %%  experts MiB  copies H+L  quality (PPL, KL, top)\n");
        for (int i = 0; i < r->n; i++) {
            const struct moe_plan *p = &r->plans[i];
            if (p->eligible != !part || (part && r->chosen >= 0 && i > r->chosen)) continue;
            if (shown >= (part ? 3 : top) || (last >= 0 && moe_plan_same(&r->plans[last], p))) {
                skipped++;
                continue;
            }
            shown++, last = i;
            char q[64];
            if (p->neutral) snprintf(q, sizeof q, "exact (0)");
            else if (p->has_quality)
                snprintf(q, sizeof q, "%+.2f %%, %.4f, %.1f %%", 100 * (p->q.ppl_ratio - 1), p->q.kld,
                         100 * p->q.same_top);
            else snprintf(q, sizeof q, "not measured");
            printf("%s%3d %7.2f %7.2f %12.3f %6.1f %8.1f %12.1f %5d+%-5d  %s\n", i == r->chosen ? "*" : " ", i + 1,
                   p->tok_s, 1e3 * p->s_per_token, p->bytes_per_token / 1e6, 100 * p->hit_ratio, 100 * p->stall_share,
                   (double)p->expert_mem / 1048576, p->high_cap, p->low_cap, q);
            char opts[512];
            moe_plan_options(p, pm, opts, sizeof opts);
            printf("      %s\n", opts);
        }
        if (!shown) printf("  (none)\n");
        if (skipped) printf("  (%d more, or alike)\n", skipped);
    }
    if (r->chosen >= 0)
        printf("\n* chosen: plan %d, %.2f tokens/s predicted%s\n", r->chosen + 1, r->plans[r->chosen].tok_s,
               applied ? " (written to the bundle's tuning)" : "; --apply writes it into the bundle's tuning");
    else
        printf("\nno plan is known to be within the quality budget (measure more: --max-evals, --eval-text)\n");
}

int moe_prep_plan(int argc, char **argv) {
    struct plan_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    struct moe_plan_outcome o;
    enum moe_status st = moe_plan_bundle(&a.rq, &o);
    if (st) {
        fprintf(stderr, "moe-prep " CMD ": no plan for %s (see the message above)\n", a.rq.bundle);
        return st == MOE_ERR_INVALID ? 2 : 1;
    }
    const int chosen = o.res.chosen;
    rc = 0;
    if (a.apply && chosen >= 0 && moe_plan_apply(&a.rq, &o, &o.res.plans[chosen])) rc = 1;
    else if (a.json) print_json(&a.rq, &o);
    else print_table(&a.rq, a.top, a.apply, &o);
    if (!rc && a.apply && chosen < 0) rc = 1;
    moe_plan_outcome_free(&o);
    return rc;
}

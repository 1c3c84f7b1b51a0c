/*
 * plan-cmd.c - `moe-prep plan`: gathers what the search needs (the bundle's
 * expert sizes and tuning, the profile's trace and big-little histogram, the
 * hardware table, an eval through the engine for quality), calls
 * moe_plan_search (plan.h), prints the best plans and, with --apply, writes
 * the chosen one into the bundle's tuning.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval.h"
#include "token-stream.h"
#include "moe-bundle.h"
#include "moe-dataset.h"
#include "moe-hw.h"
#include "moe-prep.h"
#include "moe-session.h"
#include "moe-store.h"
#include "moe-tuning.h"
#include "plan.h"
#include "profile-h5.h"
#include "tool-util.h"

#define CMD "plan"

struct plan_args {
    const char *bundle, *profile, *hw, *eval_text;
    long long mem;
    double quality_budget; /* fraction; NaN: none */
    int threads, ctx, prompt_len, top, apply, json, eval_ctx, eval_chunks, max_evals, no_measure, no_bl;
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
"options:\n"
"  --profile FILE        the profile of MODEL (moe-prep profile)\n"
"  --mem SIZE            memory for the whole run (e.g. 2G, 512MiB)\n"
"  --quality-budget X%%   largest PPL rise allowed (default 2%%; needs --eval-text)\n"
"  --eval-text SPEC      held-out text for quality (a dataset spec, as eval)\n"
"  --eval-ctx N          tokens per eval chunk (default 128)\n"
"  --eval-chunks N       chunks per eval (default 2)\n"
"  --max-evals N         quality evaluations at most (default 8)\n"
"  --hw FILE             the hardware table (default $XDG_CACHE_HOME/moe/hw.json)\n"
"  --no-measure          fail instead of measuring when the table has no entry\n"
"  -t, --threads N       CPU threads moe-run will use (default: all)\n"
"  --ctx N               context the run needs, for the KV cache (default 2048,\n"
"                        at most the model's)\n"
"  --prompt-len N        prompt tokens of each replayed sequence (default 64)\n"
"  --no-big-little       do not search big-little thresholds\n"
"  --top N               plans printed (default 8)\n"
"  --apply               write the chosen plan into MODEL's tuning: moe-run then\n"
"                        uses it unless --no-plan (its options still override)\n"
"  --json                the table as JSON on stdout\n"
"  -h, --help            this text\n"
"\n"
"examples:\n"
"  moe-prep plan mixtral.moeb --profile p.h5 --mem 24G\n"
"  moe-prep plan tiny.moeb --profile p.h5 --mem 96M --eval-text c4.txt --quality-budget 1%% --apply\n");
}

static int parse_args(int argc, char **argv, struct plan_args *a) {
    memset(a, 0, sizeof *a);
    a->mem = -1, a->quality_budget = NAN;
    a->ctx = 2048, a->prompt_len = 64, a->top = 8, a->eval_ctx = 128, a->eval_chunks = 2, a->max_evals = 8;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
        long long n;
#define NEXT() (i + 1 < argc ? argv[++i] : (fprintf(stderr, "moe-prep " CMD ": %s needs a value\n", o), (char *)NULL))
#define INT(lo, hi, dst) \
    if (!(v = NEXT()) || !moe_tool_parse_ll(CMD, o, v, lo, hi, &n)) return 2; \
    dst = (int)n
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            plan_usage(stdout);
            return 1;
        } else if (!strcmp(o, "--profile")) {
            if (!(a->profile = NEXT())) return 2;
        } else if (!strcmp(o, "--hw")) {
            if (!(a->hw = NEXT())) return 2;
        } else if (!strcmp(o, "--eval-text")) {
            if (!(a->eval_text = NEXT())) return 2;
        } else if (!strcmp(o, "--mem")) {
            int64_t b;
            if (!(v = NEXT())) return 2;
            if (moe_store_parse_size(v, &b) != MOE_OK || b <= 0) {
                fprintf(stderr, "moe-prep " CMD ": --mem wants a size such as 2G, 512M or 100000000, not \"%s\"\n", v);
                return 2;
            }
            a->mem = (long long)b;
        } else if (!strcmp(o, "--quality-budget")) {
            char num[64];
            if (!(v = NEXT())) return 2;
            size_t len = strlen(v);
            int pct = len > 1 && v[len - 1] == '%';
            if (len >= sizeof num) len = sizeof num - 1;
            memcpy(num, v, len - (size_t)pct), num[len - (size_t)pct] = 0;
            if (!moe_tool_parse_double(CMD, o, num, 0, pct ? 1000 : 10, &a->quality_budget)) return 2;
            if (pct) a->quality_budget /= 100;
        } else if (!strcmp(o, "-t") || !strcmp(o, "--threads")) {
            INT(1, 4096, a->threads);
        } else if (!strcmp(o, "--ctx")) {
            INT(1, 1 << 24, a->ctx);
        } else if (!strcmp(o, "--prompt-len")) {
            INT(0, 1 << 20, a->prompt_len);
        } else if (!strcmp(o, "--top")) {
            INT(1, 1000, a->top);
        } else if (!strcmp(o, "--eval-ctx")) {
            INT(8, 1 << 16, a->eval_ctx);
        } else if (!strcmp(o, "--eval-chunks")) {
            INT(1, 1 << 16, a->eval_chunks);
        } else if (!strcmp(o, "--max-evals")) {
            INT(0, 1000, a->max_evals);
        } else if (!strcmp(o, "--apply")) {
            a->apply = 1;
        } else if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (!strcmp(o, "--no-measure")) {
            a->no_measure = 1;
        } else if (!strcmp(o, "--no-big-little")) {
            a->no_bl = 1;
        } else if (o[0] == '-') {
            fprintf(stderr, "moe-prep " CMD ": unknown option \"%s\" (see moe-prep " CMD " --help)\n", o);
            return 2;
        } else if (!a->bundle) {
            a->bundle = o;
        } else {
            fprintf(stderr, "moe-prep " CMD ": one MODEL.moeb only (\"%s\" and \"%s\")\n", a->bundle, o);
            return 2;
        }
#undef NEXT
#undef INT
    }
    const char *why = !a->bundle ? "no MODEL.moeb given" : !a->profile ? "no --profile PROFILE.h5 given"
                      : a->mem <= 0 ? "no --mem SIZE given" : NULL;
    if (!why && !isnan(a->quality_budget) && !a->eval_text) why = "--quality-budget needs --eval-text";
    if (why) {
        fprintf(stderr, "moe-prep " CMD ": %s (see moe-prep " CMD " --help)\n", why);
        return 2;
    }
    if (isnan(a->quality_budget) && a->eval_text) a->quality_budget = 0.02;
    if (!a->threads) a->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return 0;
}

/* What the command holds while the search runs. */
struct plan_ctx {
    const struct plan_args *a;
    struct moe_model *model, *ref;     /* the bundle (lazy) and the reference (resident, largest precision) */
    int32_t *ids;
    size_t n_ids;
    struct moe_eval_params ep;
    const struct moe_plan_model *pm;
};

/* quality: an eval through the engine with the plan's options (plan.h's callback). */
static enum moe_status quality(const struct moe_plan *p, void *user, struct moe_plan_quality *q) {
    struct plan_ctx *x = user;
    struct moe_store_params sp = moe_store_default_params();
    sp.expert_mem = p->expert_mem;
    sp.high = p->high >= 0 ? x->pm->prec_name[p->high] : NULL;
    sp.low = p->low >= 0 ? x->pm->prec_name[p->low] : NULL;
    sp.dynamic = p->low >= 0;
    sp.low_share = p->low >= 0 ? p->low_share : 0.25;
    sp.t1 = p->t1, sp.t2 = p->t2;
    sp.policy = (int)p->policy;
    sp.prefetch_paths = p->prefetch_paths;
    struct moe_eval_params ep = x->ep;
    ep.store = &sp;
    ep.n_batch = 1;
    ep.little_k = p->little_k, ep.gamma = p->gamma;
    struct moe_eval_result r;
    char opts[512];
    moe_plan_options(p, x->pm, opts, sizeof opts);
    fprintf(stderr, "moe-prep " CMD ": quality of %s ...", opts);
    fflush(stderr);
    enum moe_status st = moe_eval_run(x->model, x->ref, x->ids, x->n_ids, &ep, &r);
    if (st) return st;
    q->ppl_ratio = r.ppl_ratio.val, q->kld = r.kld.val, q->same_top = r.same_top.val;
    fprintf(stderr, " PPL %+.2f %%, KL %.4f, top agreement %.1f %%\n", 100 * (q->ppl_ratio - 1), q->kld,
            100 * q->same_top);
    moe_eval_result_clear(&r);
    return MOE_OK;
}

/* model_facts: the bundle's expert sizes, map, tuning and memory outside the store. */
static int model_facts(const struct plan_args *a, const struct moe_model *m, const struct moe_tuning *tun,
                       struct moe_plan_model *pm, int64_t **raw, int64_t **stored, int16_t **map, int32_t **order) {
    const struct moe_config *c = &m->cfg;
    const struct moe_bundle *b = m->bundle;
    int layer_of[1024], L = 0;
    for (int l = 0; l < c->n_layer && L < 1024; l++)
        if (c->layer_moe[l]) layer_of[L++] = l;
    memset(pm, 0, sizeof *pm);
    pm->L = L, pm->E = c->n_expert, pm->K = c->n_expert_used, pm->n_prec = m->n_expert_prec;
    if (pm->n_prec > MOE_PLAN_MAX_PREC) pm->n_prec = MOE_PLAN_MAX_PREC;
    const size_t LE = (size_t)L * (size_t)pm->E;
    *raw = malloc(sizeof **raw * LE * (size_t)pm->n_prec);
    *stored = malloc(sizeof **stored * LE * (size_t)pm->n_prec);
    if (!*raw || !*stored) return 0;
    int64_t biggest = -1;
    for (int p = 0; p < pm->n_prec; p++) {
        const struct moe_bundle_precision *d = moe_bundle_precision_at(b, (uint32_t)p);
        snprintf(pm->prec_name[p], sizeof pm->prec_name[p], "%s", d->name);
        if ((int64_t)d->raw_size > biggest) biggest = (int64_t)d->raw_size, pm->ref_prec = p;
        for (int l = 0; l < L; l++)
            for (int e = 0; e < pm->E; e++) {
                struct moe_bundle_blob bl;
                if (moe_bundle_expert(b, (uint32_t)layer_of[l], (uint32_t)e, (uint32_t)p, &bl)) {
                    fprintf(stderr, "moe-prep " CMD ": %s: cannot locate expert %d of layer %d (see above)\n",
                            a->bundle, e, layer_of[l]);
                    return 0;
                }
                (*raw)[(size_t)p * LE + (size_t)l * pm->E + e] = (int64_t)bl.raw_size;
                (*stored)[(size_t)p * LE + (size_t)l * pm->E + e] = (int64_t)bl.stored_size;
            }
    }
    pm->raw = *raw, pm->stored = *stored;
    if (tun->has_bitwidth_map) { /* the precisions the model was bound at: the map */
        if (!(*map = malloc(sizeof **map * LE))) return 0;
        for (int l = 0; l < L; l++)
            for (int e = 0; e < pm->E; e++) {
                int p = moe_model_get_expert_precision(m, layer_of[l], e);
                (*map)[(size_t)l * pm->E + e] = (int16_t)(p >= 0 && p < pm->n_prec ? p : 0);
            }
        pm->map = *map;
    }
    int64_t nonexpert = 0;
    for (size_t i = 0; i < moe_bundle_tensor_count(b); i++) nonexpert += (int64_t)moe_bundle_tensor_at(b, i)->size;
    const int ctx = a->ctx < c->max_pos ? a->ctx : c->max_pos;
    const int64_t kv = 2 * (int64_t)c->n_layer * ctx * (int64_t)c->n_head_kv * c->head_dim * 4;
    pm->fixed_bytes = nonexpert + kv + ((int64_t)16 << 20);
    pm->n_loaders = 2;
    pm->t1 = tun->has_thresholds ? tun->t1 : NAN, pm->t2 = tun->has_thresholds ? tun->t2 : NAN;
    if (tun->has_cache_weights) {
        pm->has_hobbit = 1;
        memcpy(pm->w, tun->cache_w, sizeof pm->w);
        pm->admit = tun->cache_admit;
        if (tun->has_cache_popularity) pm->freq_high = tun->cache_freq_high, pm->freq_low = tun->cache_freq_low;
    }
    if (tun->has_placement_order) {
        if (!(*order = malloc(sizeof **order * LE))) return 0;
        for (size_t i = 0; i < LE; i++) (*order)[i] = (int32_t)tun->placement_order[i];
        pm->order = *order;
    }
    return 1;
}

/* gammas: thresholds for fallback ratios of 10, 20, 30, 50 % from the
 * profile's histogram of the little model's top probability. */
static void gammas(const struct moe_profile *p, struct moe_plan_params *pp) {
    const int64_t *h;
    int nd;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    if (moe_profile_get_i64(p, "sum.big_little_maxprob", &nd, dims, &h) != MOE_OK || nd != 2 || dims[0] != 2 ||
        dims[1] < 2)
        return;
    const int64_t B = dims[1];
    int64_t n = 0;
    for (int64_t b = 0; b < 2 * B; b++) n += h[b] > 0 ? h[b] : 0;
    if (n == 0) return;
    static const double targets[] = {0.1, 0.2, 0.3, 0.5};
    for (int i = 0; i < 4; i++) {
        int64_t below = 0, best_b = 0;
        double best = INFINITY, best_fb = 0;
        for (int64_t b = 0; b <= B; b++) {
            double d = fabs((double)below - targets[i] * (double)n);
            if (d < best - 1e-9) best = d, best_b = b, best_fb = (double)below / (double)n;
            if (b < B) below += (h[b] > 0 ? h[b] : 0) + (h[B + b] > 0 ? h[B + b] : 0);
        }
        const double g = (double)best_b / (double)B;
        if (pp->n_gamma > 0 && pp->gamma[pp->n_gamma - 1] == g) continue;
        pp->gamma[pp->n_gamma] = g, pp->fallback[pp->n_gamma] = best_fb;
        pp->n_gamma++;
    }
}

/* hardware: the table's entries for the bundle, measured when missing. */
static int hardware(const struct plan_args *a, struct moe_hw *hw, const struct moe_hw_model **hm,
                    const struct moe_hw_storage **hs) {
    char path[1024], key[256], dev[32];
    const char *table = a->hw;
    if (!table) {
        if (moe_hw_default_path(path, sizeof path)) {
            fprintf(stderr, "moe-prep " CMD ": neither XDG_CACHE_HOME nor HOME is set; give --hw FILE\n");
            return 0;
        }
        table = path;
    }
    enum moe_status st = moe_hw_load(table, hw);
    if (st && st != MOE_ERR_NOT_FOUND) memset(hw, 0, sizeof *hw);
    if (moe_hw_model_key(a->bundle, key, sizeof key) || moe_hw_storage_key(a->bundle, dev, sizeof dev)) return 0;
    *hm = moe_hw_find_model(hw, key, a->threads);
    *hs = moe_hw_find_storage(hw, dev);
    if (*hm && *hs) return 1;
    if (a->no_measure) {
        fprintf(stderr, "moe-prep " CMD ": %s has no numbers for %s on %d threads (run moe-prep hw %s -t %d)\n", table,
                key, a->threads, a->bundle, a->threads);
        return 0;
    }
    fprintf(stderr, "moe-prep " CMD ": no hardware numbers for %s on %d threads in %s: measuring (moe-prep hw)\n",
            key, a->threads, table);
    if (moe_hw_measure_bundle(a->bundle, a->threads, hw) || moe_hw_save(table, hw)) return 0;
    *hm = moe_hw_find_model(hw, key, a->threads);
    *hs = moe_hw_find_storage(hw, dev);
    return *hm && *hs;
}

static void print_json(const struct plan_args *a, const struct moe_plan_model *pm, const struct moe_plan_result *r) {
    printf("{\"model\": ");
    moe_tool_json_string(stdout, a->bundle);
    printf(", \"mem\": %lld, \"fixed_bytes\": %lld, \"threads\": %d, \"chosen\": %d, \"evals\": %d, \"plans\": [",
           a->mem, (long long)pm->fixed_bytes, a->threads, r->chosen, r->n_evals);
    for (int i = 0; i < r->n; i++) {
        const struct moe_plan *p = &r->plans[i];
        char opts[512];
        moe_plan_options(p, pm, opts, sizeof opts);
        printf("%s\n{\"rank\": %d, \"tok_s\": %.6g, \"s_per_token\": %.6g, \"bytes_per_token\": %.6g, \"hit_ratio\": %.6g, "
               "\"stall_share\": %.4g, \"expert_mem\": %lld, \"high_cap\": %d, \"low_cap\": %d, \"high\": ",
               i ? ", " : "", i + 1, p->tok_s, p->s_per_token, p->bytes_per_token, p->hit_ratio, p->stall_share,
               (long long)p->expert_mem, p->high_cap, p->low_cap);
        moe_tool_json_string(stdout, p->high >= 0 ? pm->prec_name[p->high] : "map");
        printf(", \"low\": ");
        moe_tool_json_string(stdout, p->low >= 0 ? pm->prec_name[p->low] : NULL);
        printf(", \"policy\": \"%s\", \"prefetch_paths\": %d, \"little_k\": %d, \"gamma\": %.6g, \"fallback\": %.6g, "
               "\"neutral\": %s, \"eligible\": %s, \"quality\": ",
               moe_cache_policy_name(p->policy), p->prefetch_paths, p->little_k, p->gamma, p->fallback,
               p->neutral ? "true" : "false", p->eligible ? "true" : "false");
        if (p->has_quality)
            printf("{\"ppl_ratio\": %.6g, \"kld\": %.6g, \"same_top\": %.6g}", p->q.ppl_ratio, p->q.kld, p->q.same_top);
        else
            printf(p->neutral ? "{\"ppl_ratio\": 1, \"kld\": 0, \"same_top\": 1}" : "null");
        printf(", \"options\": ");
        moe_tool_json_string(stdout, opts);
        putchar('}');
    }
    printf("\n]}\n");
}

static void print_table(const struct plan_args *a, const struct moe_plan_model *pm, const struct moe_plan_result *r) {
    printf("plans for %s in %.1f MiB (%.1f MiB outside the expert store: non-expert weights, KV cache for %d "
           "tokens, process), %d threads; %lld held-out tokens replayed per plan, %d plans, %d did not fit\n\n",
           a->bundle, (double)a->mem / 1048576, (double)pm->fixed_bytes / 1048576, a->ctx, a->threads,
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
            if (shown >= (part ? 3 : a->top) || (last >= 0 && moe_plan_same(&r->plans[last], p))) {
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
               a->apply ? " (written to the bundle's tuning)" : "; --apply writes it into the bundle's tuning");
    else
        printf("\nno plan is known to be within the quality budget (measure more: --max-evals, --eval-text)\n");
}

/* apply: the chosen plan into the bundle's tuning (other keys kept). */
static int apply(const struct plan_args *a, const struct moe_plan_model *pm, const struct moe_plan *p) {
    struct moe_tuning_plan t;
    memset(&t, 0, sizeof t);
    t.mem = a->mem, t.expert_mem = p->expert_mem;
    snprintf(t.high, sizeof t.high, "%s", p->high >= 0 ? pm->prec_name[p->high] : "");
    snprintf(t.low, sizeof t.low, "%s", p->low >= 0 ? pm->prec_name[p->low] : "");
    snprintf(t.policy, sizeof t.policy, "%s", moe_cache_policy_name(p->policy));
    t.dynamic = p->low >= 0, t.low_share = p->low >= 0 ? p->low_share : 0.25, t.t1 = p->t1, t.t2 = p->t2;
    t.prefetch_paths = p->prefetch_paths, t.little_k = p->little_k, t.gamma = p->little_k ? p->gamma : 0;
    t.threads = a->threads, t.tok_s = p->tok_s, t.bytes_per_token = p->bytes_per_token;
    t.quality = p->neutral ? 0 : p->has_quality ? p->q.ppl_ratio - 1 : NAN;
    struct moe_bundle *b = NULL;
    struct moe_bundle_kv *kv = NULL;
    enum moe_status st;
    if ((st = moe_bundle_open(a->bundle, &b)) || (st = moe_bundle_kv_new(&kv)) ||
        (st = moe_bundle_kv_copy(kv, moe_bundle_tuning(b))))
        goto done;
    moe_bundle_free(b);
    b = NULL;
    if ((st = moe_tuning_set_plan(kv, &t)) || (st = moe_bundle_replace_tuning(a->bundle, kv))) goto done;
done:
    if (st) fprintf(stderr, "moe-prep " CMD ": cannot write the plan into %s: %s\n", a->bundle, moe_status_str(st));
    moe_bundle_free(b);
    moe_bundle_kv_free(kv);
    return st == MOE_OK;
}

int moe_prep_plan(int argc, char **argv) {
    struct plan_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    struct plan_ctx x;
    memset(&x, 0, sizeof x);
    x.a = &a;
    struct moe_profile *prof = NULL;
    struct moe_hw *hw = calloc(1, sizeof *hw);
    struct moe_tuning tun;
    struct moe_plan_model pm;
    struct moe_plan_result res;
    memset(&res, 0, sizeof res);
    int64_t *raw = NULL, *stored = NULL;
    int16_t *map = NULL;
    int32_t *order = NULL, *fit = NULL;
    unsigned char *held = NULL;
    struct moe_path_dict *dict = NULL;
    char *text = NULL;
    rc = 1;
    struct moe_model_params mp = moe_model_default_params();
    mp.lazy_experts = 1;
    if (!hw) goto done;
    if (moe_model_load(a.bundle, &mp, &x.model) != MOE_OK || !x.model->bundle) {
        fprintf(stderr, "moe-prep " CMD ": %s is not a bundle this tool can load (see above)\n", a.bundle);
        goto done;
    }
    if (moe_profile_read(a.profile, &prof) != MOE_OK) {
        fprintf(stderr, "moe-prep " CMD ": cannot read the profile %s (see above)\n", a.profile);
        goto done;
    }
    struct moe_trace t;
    moe_profile_trace(prof, &t);
    int L = 0;
    for (int l = 0; l < x.model->cfg.n_layer; l++) L += x.model->cfg.layer_moe[l] != 0;
    if (L < 1 || moe_tuning_read(moe_bundle_tuning(x.model->bundle), L, x.model->cfg.n_expert, &tun) != MOE_OK)
        goto done;
    if (!model_facts(&a, x.model, &tun, &pm, &raw, &stored, &map, &order)) goto done;
    x.pm = &pm;
    if (t.n_layers != pm.L || t.n_experts != pm.E || t.k != pm.K) {
        fprintf(stderr, "moe-prep " CMD ": %s was recorded on %d MoE layers x %d experts, top-%d; %s has %d x %d, "
                        "top-%d: profile this bundle (moe-prep profile)\n", a.profile, t.n_layers, t.n_experts, t.k,
                a.bundle, pm.L, pm.E, pm.K);
        rc = 2;
        goto done;
    }
    const struct moe_hw_model *hm = NULL;
    const struct moe_hw_storage *hs = NULL;
    if (!hardware(&a, hw, &hm, &hs)) goto done;
    struct moe_plan_params pp = moe_plan_default_params();
    pp.mem = a.mem;
    pp.prompt_len = a.prompt_len;
    if (!a.no_bl && pm.K >= 2) {
        pp.little_k = pm.K / 2;
        gammas(prof, &pp);
        if (pp.n_gamma == 0) pp.little_k = 0;
    }
    /* EdgeMoE path prefetch: the order-1 dictionary of the sequences not held out (the runtime's default order) */
    held = calloc((size_t)t.n_seq + 1, 1);
    fit = malloc(sizeof *fit * ((size_t)t.n_seq + 1));
    if (!held || !fit) goto done;
    int n_fit = 0;
    moe_cache_split(t.n_seq, pp.heldout, held);
    for (int i = 0; i < t.n_seq; i++)
        if (!held[i]) fit[n_fit++] = i;
    if (n_fit > 0 && pm.L > 1 && moe_cache_path_dict(&t, fit, n_fit, 1, &dict) == MOE_OK) pp.paths = dict;
    if (a.eval_text) {
        size_t len = 0;
        struct moe_model_params rp = moe_model_default_params();
        rp.expert_precision = pm.prec_name[pm.ref_prec];
        if (moe_text_load(a.eval_text, NULL, &text, &len) || moe_model_load(a.bundle, &rp, &x.ref) ||
            moe_text_tokenize(x.model, x.ref, text, len, &x.ids, &x.n_ids)) {
            fprintf(stderr, "moe-prep " CMD ": cannot prepare the eval on %s (see above)\n", a.eval_text);
            goto done;
        }
        x.ep = moe_eval_default_params();
        x.ep.n_ctx = a.eval_ctx, x.ep.max_chunks = a.eval_chunks, x.ep.n_threads = a.threads;
        x.ep.bos = moe_text_bos(x.model->tok);
        if (x.n_ids < 2 * (size_t)a.eval_ctx) {
            fprintf(stderr, "moe-prep " CMD ": %s has %zu tokens; --eval-ctx %d needs %d\n", a.eval_text, x.n_ids,
                    a.eval_ctx, 2 * a.eval_ctx);
            rc = 2;
            goto done;
        }
        pp.quality = quality, pp.user = &x;
        pp.quality_budget = a.quality_budget;
        pp.max_evals = a.max_evals;
        pp.want = a.top < 4 ? a.top : 4;
    }
    if (moe_plan_search(&t, &pm, hm, hs, &pp, &res) != MOE_OK) {
        fprintf(stderr, "moe-prep " CMD ": the search failed (see above)\n");
        goto done;
    }
    {
        int64_t tok = 0;
        for (int i = 0; i < t.n_seq; i++)
            if (held[i]) tok += t.seq_start[i + 1] - t.seq_start[i];
        res.heldout_tokens = tok;
    }
    if (a.apply && res.chosen >= 0 && !apply(&a, &pm, &res.plans[res.chosen])) goto done;
    if (a.json) print_json(&a, &pm, &res);
    else print_table(&a, &pm, &res);
    rc = a.apply && res.chosen < 0 ? 1 : 0;
done:
    moe_plan_result_free(&res);
    moe_path_dict_free(dict);
    free(held);
    free(fit);
    free(raw);
    free(stored);
    free(map);
    free(order);
    free(text);
    free(x.ids);
    free(hw);
    moe_profile_free(prof);
    moe_model_free(x.ref);
    moe_model_free(x.model);
    return rc;
}

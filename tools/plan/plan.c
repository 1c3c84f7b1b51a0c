/*
 * plan.c - the planner's search (plan.h): candidates, the store's sizes for
 * each, a replay of the profile's held-out routing through the cache core
 * timed with the hardware table, and the quality walk.
 */
#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-store.h"

#define ALIGN 4096
#define MAX_LAYERS 1024

struct moe_plan_params moe_plan_default_params(void) {
    struct moe_plan_params p;
    memset(&p, 0, sizeof p);
    p.prompt_len = 64;
    p.heldout = 0.3;
    p.bl_prefetch = 2;
    p.path_prefetch = 2;
    p.low_share = 0.25;
    p.quality_budget = NAN;
    p.max_evals = 8;
    p.want = 4;
    return p;
}

void moe_plan_result_free(struct moe_plan_result *r) {
    if (!r) return;
    free(r->plans);
    r->plans = NULL;
    r->n = 0;
}

static int64_t round4k(int64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* home: the precision of expert g's high copy under plan p. */
static int home(const struct moe_plan_model *m, const struct moe_plan *p, int32_t g) {
    return p->high >= 0 ? p->high : m->map[g];
}

static int64_t copy_raw(const struct moe_plan_model *m, int prec, int32_t g) {
    return m->raw[(size_t)prec * m->L * m->E + (size_t)g];
}

static int64_t copy_stored(const struct moe_plan_model *m, int prec, int32_t g) {
    return m->stored[(size_t)prec * m->L * m->E + (size_t)g];
}

/* slot_bytes: the store's slot size for the high (high != 0) or low cache:
 * the largest copy, raw or stored, rounded to 4096 (store.c's max_copy). */
static int64_t slot_bytes(const struct moe_plan_model *m, const struct moe_plan *p, int high) {
    int64_t best = 0;
    for (int32_t g = 0; g < m->L * m->E; g++) {
        const int prec = high ? home(m, p, g) : p->low;
        int64_t r = copy_raw(m, prec, g), s = copy_stored(m, prec, g);
        r = round4k(r > s ? r : s);
        if (r > best) best = r;
    }
    return best;
}

/* ---- the timed replay ------------------------------------------------ */

/* The state of the timing model during one replay. */
struct timer {
    const struct moe_plan_model *m;
    const struct moe_plan *p;
    const struct moe_hw_storage *hs;
    double a[MOE_PLAN_MAX_PREC], b[MOE_PLAN_MAX_PREC]; /* expert seconds: a + b n, per precision */
    double fixed_step;        /* the model's time outside the routed experts, per MoE layer step */
    double store_step;        /* the store's own work per step */
    int n_srv;                /* loader threads */
    double srv[8];            /* when each loader is free */
    double t;                 /* the compute thread's clock */
    double *ready;            /* [L x E] when the copy a read brought in is ready */
    double start[MAX_LAYERS]; /* start of the current pass's step at each layer */
    double pass_start;
    int last_pass;
    double wait_s;            /* time the compute thread waited for reads */
    int64_t decode_tokens;
    double bytes;             /* bytes read during decode steps */
};

/* read_done: schedule a read of `bytes` issued at `issue` on the loader that
 * frees first; returns when it completes. While another loader is busy the
 * two share the storage's parallel bandwidth. */
static double read_done(struct timer *tm, double issue, double bytes) {
    int k = 0;
    for (int i = 1; i < tm->n_srv; i++)
        if (tm->srv[i] < tm->srv[k]) k = i;
    const double start = tm->srv[k] > issue ? tm->srv[k] : issue;
    int busy = 0;
    for (int i = 0; i < tm->n_srv; i++) busy += i != k && tm->srv[i] > start;
    const double bw = busy && tm->hs->n_par > 1 ? tm->hs->bw_par / tm->hs->n_par : tm->hs->bw;
    const double done = start + tm->hs->lat_s + (double)round4k((int64_t)bytes) / (bw > 0 ? bw : 1e15);
    tm->srv[k] = done;
    return done;
}

static void on_step(const struct moe_cache_step_event *ev, void *user) {
    struct timer *tm = user;
    const struct moe_plan_model *m = tm->m;
    const struct moe_plan *p = tm->p;
    if (ev->batch) { /* prompt batches are not timed: their reads are done by the first decode step */
        for (int i = 0; i < ev->n; i++) tm->ready[ev->g[i]] = 0;
        for (int i = 0; i < ev->n_pf; i++) tm->ready[ev->pf_g[i]] = 0;
        return;
    }
    const int l = ev->layer;
    if (l == 0) {
        tm->pass_start = tm->t;
        if (ev->pass != 2) tm->decode_tokens++;
    }
    tm->t += tm->fixed_step;
    const double step_start = tm->t;
    if (l < MAX_LAYERS) tm->start[l] = step_start;
    /* prefetches: issued `ahead` steps earlier (big-little's hint, or a path prefetch one layer ahead) */
    const int ahead = ev->pass == 2 ? p->bl_prefetch : 1;
    for (int i = 0; i < ev->n_pf; i++) {
        const int32_t g = ev->pf_g[i];
        const double issue = l >= ahead && l - ahead < MAX_LAYERS ? tm->start[l - ahead] : tm->pass_start;
        const double bytes = (double)copy_stored(m, home(m, p, g), g);
        tm->ready[g] = read_done(tm, issue, bytes);
        tm->bytes += bytes;
    }
    /* demand reads start at the plan, in order; experts compute in order */
    double ready[64];
    const int n = ev->n < 64 ? ev->n : 64;
    for (int i = 0; i < n; i++) {
        const int32_t g = ev->g[i];
        const int o = ev->outcome[i];
        ready[i] = step_start;
        if (o == MOE_CACHE_MISS_HIGH || o == MOE_CACHE_MISS_LOW) {
            const int prec = o == MOE_CACHE_MISS_HIGH ? home(m, p, g) : p->low;
            const double bytes = (double)copy_stored(m, prec, g);
            ready[i] = tm->ready[g] = read_done(tm, step_start, bytes);
            tm->bytes += bytes;
        } else if (o == MOE_CACHE_HIT_HIGH && tm->ready[g] > step_start) {
            ready[i] = tm->ready[g]; /* a prefetch still in flight */
        }
    }
    for (int i = 0; i < n; i++) {
        const int o = ev->outcome[i];
        if (o == MOE_CACHE_SKIP) continue;
        const int prec = o == MOE_CACHE_HIT_HIGH || o == MOE_CACHE_MISS_HIGH ? home(m, p, ev->g[i]) : p->low;
        if (ready[i] > tm->t) tm->wait_s += ready[i] - tm->t, tm->t = ready[i];
        tm->t += tm->a[prec] + tm->b[prec];
    }
    tm->t += tm->store_step;
}

/* capacities: the budget and the store's sizes for plan p at memory pp->mem;
 * 0 when the budget cannot hold one layer's top-k. */
static int capacities(const struct moe_plan_model *m, const struct moe_plan_params *pp, struct moe_plan *p) {
    const int all = m->L * m->E, dyn = p->low >= 0;
    p->high_slot = slot_bytes(m, p, 1);
    p->low_slot = dyn ? slot_bytes(m, p, 0) : p->high_slot;
    const int64_t big = p->high_slot > p->low_slot ? p->high_slot : p->low_slot;
    int n_slots = 0;
    for (int it = 0; it < 8; it++) { /* the overhead depends a little on the slot count */
        p->overhead = moe_store_overhead_estimate(big, m->n_loaders, all, n_slots, m->K);
        p->expert_mem = pp->mem - m->fixed_bytes - p->overhead;
        if (p->expert_mem <= 0) return 0;
        moe_store_capacities(p->expert_mem, p->low_share, dyn, p->high_slot, p->low_slot, all, &p->high_cap,
                             &p->low_cap);
        if (p->high_cap + p->low_cap == n_slots) break;
        n_slots = p->high_cap + p->low_cap;
    }
    const int64_t min_bytes = (int64_t)m->K * (dyn ? p->low_slot : p->high_slot);
    return p->high_cap >= (dyn ? 1 : m->K) &&
           (int64_t)p->high_cap * p->high_slot + (int64_t)p->low_cap * p->low_slot >= min_bytes;
}

enum moe_status moe_plan_predict(const struct moe_trace *t, const struct moe_plan_model *m,
                                 const struct moe_hw_model *hm, const struct moe_hw_storage *hs,
                                 const struct moe_plan_params *pp, struct moe_plan *p) {
    if (t->n_layers != m->L || t->n_experts != m->E || t->k != m->K || m->L > MAX_LAYERS || m->n_prec < 1 ||
        m->n_prec > MOE_PLAN_MAX_PREC || p->high >= m->n_prec || p->high < -1 || (p->high < 0 && !m->map) ||
        p->low >= m->n_prec || (p->little_k && (p->little_k >= m->K || !(p->fallback >= 0 && p->fallback <= 1)))) {
        MOE_LOGE("plan: the profile (%d MoE layers x %d experts, top-%d) does not match the model (%d x %d, top-%d), "
                 "or a choice is out of range", t->n_layers, t->n_experts, t->k, m->L, m->E, m->K);
        return MOE_ERR_INVALID;
    }
    struct timer tm;
    memset(&tm, 0, sizeof tm);
    for (int q = 0; q < m->n_prec; q++) {
        const struct moe_hw_expert *e = moe_hw_find_expert(hm, m->prec_name[q]);
        if (!e) {
            MOE_LOGE("plan: the hardware table has no expert time for precision %s (measure again: moe-prep hw)",
                     m->prec_name[q]);
            return MOE_ERR_NOT_FOUND;
        }
        tm.a[q] = e->decode_s > 0 ? e->decode_s : moe_hw_expert_s(e, 1), tm.b[q] = 0; /* one token per expert */
    }
    p->neutral = p->high == m->ref_prec && p->low < 0 && p->little_k == 0;
    if (!capacities(m, pp, p)) return MOE_ERR_RANGE;
    const int LE = m->L * m->E;
    unsigned char *held = calloc((size_t)t->n_seq + 1, 1);
    int32_t *seqs = malloc(sizeof *seqs * ((size_t)t->n_seq + 1));
    tm.ready = calloc((size_t)LE, sizeof *tm.ready);
    struct moe_cache_trace *ct = NULL;
    enum moe_status st = MOE_ERR_NOMEM;
    if (!held || !seqs || !tm.ready) goto done;
    int n_held = moe_cache_split(t->n_seq, pp->heldout, held), ns = 0;
    int64_t longest = 0;
    for (int i = 0; i < t->n_seq; i++)
        if (held[i] || n_held == 0) {
            seqs[ns++] = i;
            const int64_t len = t->seq_start[i + 1] - t->seq_start[i];
            longest = len > longest ? len : longest;
        }
    if (longest <= pp->prompt_len) { /* every token would be a prompt token: no decode speed to predict */
        MOE_LOGE("plan: the profile's sequences are at most %lld tokens, so a prompt of %d leaves none to decode; give "
                 "a smaller --prompt-len or profile with a longer --ctx", (long long)longest, pp->prompt_len);
        st = MOE_ERR_INVALID;
        goto done;
    }
    struct moe_cache_trace_params tp = moe_cache_trace_default_params();
    tp.prompt_len = pp->prompt_len;
    tp.t1 = p->low >= 0 ? p->t1 : 1, tp.t2 = 1; /* the store's default: nothing skipped, past T2 loads low */
    tp.paths = p->prefetch_paths > 0 ? pp->paths : NULL, tp.prefetch = p->prefetch_paths;
    tp.little_k = p->little_k, tp.fallback = p->fallback, tp.bl_prefetch = p->little_k && p->bl_prefetch > 0;
    if ((st = moe_cache_trace_new(t, seqs, ns, &tp, &ct))) goto done;
    struct moe_cache_config c = moe_cache_default_config();
    c.high_cap = p->high_cap, c.low_cap = p->low_cap;
    c.high_bytes = (double)p->high_slot, c.low_bytes = (double)p->low_slot;
    c.low_cost = p->low >= 0 ? (double)p->low_slot / (double)p->high_slot : 0.5;
    if (p->policy == MOE_CACHE_HOBBIT) {
        memcpy(c.w, m->w, sizeof c.w);
        c.admit = m->admit;
        c.freq_high = m->freq_high, c.freq_low = m->freq_low;
    }
    c.order = m->order;
    c.prefetch = tp.prefetch > 0 || tp.bl_prefetch;
    tm.m = m, tm.p = p, tm.hs = hs;
    tm.fixed_step = hm->fixed_s / m->L;
    tm.store_step = hm->store_step_s;
    tm.n_srv = m->n_loaders < 1 ? 1 : m->n_loaders > 8 ? 8 : m->n_loaders;
    struct moe_cache_stats cs;
    if ((st = moe_cache_simulate_steps(ct, p->policy, &c, on_step, &tm, &cs))) goto done;
    p->s_per_token = tm.decode_tokens > 0 ? tm.t / (double)tm.decode_tokens : NAN;
    p->tok_s = tm.t > 0 ? (double)tm.decode_tokens / tm.t : NAN;
    p->bytes_per_token = tm.decode_tokens > 0 ? tm.bytes / (double)tm.decode_tokens : NAN;
    p->hit_ratio = moe_cache_hit_ratio(&cs);
    p->stall_share = tm.t > 0 ? tm.wait_s / tm.t : 0;
    st = MOE_OK;
done:
    moe_cache_trace_free(ct);
    free(held);
    free(seqs);
    free(tm.ready);
    return st;
}

/* ---- the search ------------------------------------------------------- */

static int by_speed(const void *x, const void *y) {
    const struct moe_plan *a = x, *b = y;
    if (a->tok_s != b->tok_s) return a->tok_s > b->tok_s ? -1 : 1;
    return a->expert_mem < b->expert_mem ? -1 : a->expert_mem > b->expert_mem; /* then less memory */
}

/* same_quality: plans a and b compute the same thing, or nearly: the same
 * home precisions, low precision and thresholds, and big-little decisions.
 * With dynamic precision on, which low copies serve also depends on the
 * cache (policy, capacities, prefetch); that difference is small (on the
 * inflated demo model 3.78 against 3.77 % PPL for two policies), so one
 * measurement stands for the family and the quality budget buys distinct
 * computations. */
static int same_quality(const struct moe_plan *a, const struct moe_plan *b) {
    if (a->high != b->high || a->low != b->low || a->little_k != b->little_k || a->gamma != b->gamma) return 0;
    return a->low < 0 || (a->t1 == b->t1 && a->t2 == b->t2 && a->low_share == b->low_share);
}

/* within: the plan is known to be within the quality budget. */
static int within(const struct moe_plan *p, double budget) {
    if (p->neutral) return 1;
    if (!p->has_quality) return 0;
    return isnan(budget) || p->q.ppl_ratio - 1 <= budget;
}

enum moe_status moe_plan_search(const struct moe_trace *t, const struct moe_plan_model *m,
                                const struct moe_hw_model *hm, const struct moe_hw_storage *hs,
                                const struct moe_plan_params *pp, struct moe_plan_result *out) {
    memset(out, 0, sizeof *out);
    out->chosen = -1;
    int highs[MOE_PLAN_MAX_PREC + 1], nh = 0;
    for (int q = 0; q < m->n_prec; q++) highs[nh++] = q;
    if (m->map) highs[nh++] = -1;
    const int n_pol = m->has_hobbit ? 2 : 1, n_pf = pp->paths ? 2 : 1, n_bl = 1 + (pp->little_k ? pp->n_gamma : 0);
    const int cap = nh * (m->n_prec + 1) * n_pol * n_pf * n_bl;
    out->plans = calloc((size_t)cap + 1, sizeof *out->plans);
    if (!out->plans) return MOE_ERR_NOMEM;
    enum moe_status st = MOE_OK;
    for (int ih = 0; ih < nh; ih++)
        for (int lo = -1; lo < m->n_prec; lo++) {
            if (lo >= 0) { /* a low precision smaller than every high copy, with thresholds */
                struct moe_plan probe = {.high = highs[ih], .low = lo};
                if (isnan(m->t1) || slot_bytes(m, &probe, 0) >= slot_bytes(m, &probe, 1)) continue;
            }
            for (int ip = 0; ip < n_pol; ip++)
                for (int ipf = 0; ipf < n_pf; ipf++)
                    for (int ib = 0; ib < n_bl; ib++) {
                        struct moe_plan *p = &out->plans[out->n];
                        memset(p, 0, sizeof *p);
                        p->high = highs[ih], p->low = lo;
                        p->low_share = lo >= 0 ? pp->low_share : 0;
                        p->t1 = lo >= 0 ? m->t1 : 1, p->t2 = lo >= 0 ? m->t2 : 1;
                        p->policy = ip ? MOE_CACHE_HOBBIT : MOE_CACHE_LRU;
                        p->prefetch_paths = ipf ? pp->path_prefetch : 0;
                        p->little_k = ib ? pp->little_k : 0;
                        p->gamma = ib ? pp->gamma[ib - 1] : 0, p->fallback = ib ? pp->fallback[ib - 1] : 0;
                        p->bl_prefetch = ib ? pp->bl_prefetch : 0;
                        st = moe_plan_predict(t, m, hm, hs, pp, p);
                        if (st == MOE_ERR_RANGE) {
                            out->n_infeasible++;
                            continue;
                        }
                        if (st) goto fail;
                        out->n++;
                    }
        }
    if (out->n == 0) {
        MOE_LOGE("plan: %lld bytes hold no plan: every candidate's budget is below one layer's top-%d (the memory "
                 "outside the experts is %lld bytes)", (long long)pp->mem, m->K, (long long)m->fixed_bytes);
        st = MOE_ERR_RANGE;
        goto fail;
    }
    qsort(out->plans, (size_t)out->n, sizeof *out->plans, by_speed);
    int n_eligible = 0;
    for (int i = 0; i < out->n && n_eligible < pp->want; i++) {
        struct moe_plan *p = &out->plans[i];
        if (pp->quality && !p->neutral && !p->has_quality && out->n_evals < pp->max_evals) {
            if ((st = pp->quality(p, pp->user, &p->q))) goto fail;
            p->has_quality = 1;
            out->n_evals++;
            for (int j = i + 1; j < out->n; j++) /* measured once for every plan computing the same */
                if (same_quality(p, &out->plans[j])) out->plans[j].has_quality = 1, out->plans[j].q = p->q;
        }
        n_eligible += within(p, pp->quality_budget);
    }
    for (int i = 0; i < out->n; i++) {
        out->plans[i].eligible = within(&out->plans[i], pp->quality_budget);
        if (out->chosen < 0 && out->plans[i].eligible) out->chosen = i;
    }
    return MOE_OK;
fail:
    moe_plan_result_free(out);
    return st;
}

int moe_plan_same(const struct moe_plan *a, const struct moe_plan *b) {
    return a->tok_s == b->tok_s && a->bytes_per_token == b->bytes_per_token && a->high_cap == b->high_cap &&
           a->low_cap == b->low_cap && a->neutral == b->neutral && same_quality(a, b);
}

void moe_plan_options(const struct moe_plan *p, const struct moe_plan_model *m, char *buf, size_t n) {
    int w = snprintf(buf, n, "--expert-mem %lld", (long long)p->expert_mem);
    if (p->high >= 0 && w >= 0 && (size_t)w < n) w += snprintf(buf + w, n - (size_t)w, " --high %s", m->prec_name[p->high]);
    if (w >= 0 && (size_t)w < n) {
        if (p->low >= 0)
            w += snprintf(buf + w, n - (size_t)w, " --dynamic on --low %s --low-share %g --t1 %.6g --t2 %.6g",
                          m->prec_name[p->low], p->low_share, p->t1, p->t2);
        else
            w += snprintf(buf + w, n - (size_t)w, " --dynamic off");
    }
    if (w >= 0 && (size_t)w < n)
        w += snprintf(buf + w, n - (size_t)w, " --policy %s --prefetch-paths %d", moe_cache_policy_name(p->policy),
                      p->prefetch_paths);
    if (w >= 0 && (size_t)w < n) {
        if (p->little_k)
            snprintf(buf + w, n - (size_t)w, " --little-k %d --gamma %.6g", p->little_k, p->gamma);
        else
            snprintf(buf + w, n - (size_t)w, " --little-k 0");
    }
}

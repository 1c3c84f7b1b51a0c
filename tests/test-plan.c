/*
 * test-plan.c - the planner (tools/plan/plan.h) on hand-made traces and a
 * simulated hardware table, and the hardware table's file (moe-hw.h):
 *   - with storage infinitely fast and every expert fitting, the predicted
 *     time per token is the table's: time outside the experts + L K expert
 *     times + the store's work per step;
 *   - big-little at fallback r: T_little + r T_big (r as realised on the
 *     replayed tokens), the speed-up MoBiLE's formula gives;
 *   - storage-bound (no compute, one loader, every access a miss): L K reads
 *     of latency + bytes / bandwidth per token, their bytes per token;
 *   - more memory is never predicted slower (LRU, exact plans);
 *   - the search: capacities are the store's arithmetic, the chosen plan is
 *     the fastest one within the quality budget, plans that compute the same
 *     are measured once, a memory size that holds nothing is refused;
 *   - the hardware table: save and load give the same numbers, a damaged
 *     file is refused, a missing one is "not found".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe-hw.h"
#include "moe-store.h"
#include "moe-test.h"
#include "plan.h"

enum { L = 3, E = 8, K = 2, NSEQ = 10, NTOK = 40 };

static int16_t experts[NSEQ * NTOK * L * K];
static float weights[NSEQ * NTOK * L * K];
static int64_t seq_start[NSEQ + 1];
static int64_t raw[2 * L * E], stored[2 * L * E];

/* make_trace: NSEQ sequences of NTOK tokens. pattern 0: each token uses
 * experts (t K + j) % E at every layer (no reuse within K copies); 1: a
 * skewed random pattern with reuse. */
static struct moe_trace make_trace(int pattern) {
    uint64_t s = 12345;
    for (int q = 0; q <= NSEQ; q++) seq_start[q] = (int64_t)q * NTOK;
    for (int t = 0; t < NSEQ * NTOK; t++)
        for (int l = 0; l < L; l++) {
            int16_t *ex = experts + ((size_t)t * L + l) * K;
            float *w = weights + ((size_t)t * L + l) * K;
            if (pattern == 0) {
                for (int j = 0; j < K; j++) ex[j] = (int16_t)((t * K + j) % E);
            } else {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                int a = (int)((s >> 33) % 100) < 60 ? (int)((s >> 40) % 3) : (int)((s >> 40) % E);
                int b = (a + 1 + (int)((s >> 50) % (E - 1))) % E;
                ex[0] = (int16_t)a, ex[1] = (int16_t)b;
            }
            w[0] = 0.7f, w[1] = 0.3f;
        }
    struct moe_trace t = {L, E, K, NSEQ, seq_start, experts, weights};
    return t;
}

/* model: precisions "hi" (40000 bytes) and "lo" (12000 bytes). */
static struct moe_plan_model model(void) {
    struct moe_plan_model m;
    memset(&m, 0, sizeof m);
    m.L = L, m.E = E, m.K = K, m.n_prec = 2;
    snprintf(m.prec_name[0], sizeof m.prec_name[0], "hi");
    snprintf(m.prec_name[1], sizeof m.prec_name[1], "lo");
    for (int g = 0; g < L * E; g++) raw[g] = stored[g] = 40000, raw[L * E + g] = stored[L * E + g] = 12000;
    m.raw = raw, m.stored = stored;
    m.ref_prec = 0;
    m.fixed_bytes = 1000000;
    m.n_loaders = 1;
    m.t1 = 0.6, m.t2 = 0.95;
    return m;
}

/* hw: expert times c_hi, c_lo (one token), time outside the experts, store work, storage. */
static void hw(struct moe_hw_model *hm, struct moe_hw_storage *hs, double c_hi, double c_lo, double fixed,
               double store, double lat, double bw) {
    memset(hm, 0, sizeof *hm);
    memset(hs, 0, sizeof *hs);
    hm->threads = 1, hm->k = K, hm->fixed_s = fixed, hm->store_step_s = store, hm->n_prec = 2;
    snprintf(hm->prec[0].precision, sizeof hm->prec[0].precision, "hi");
    snprintf(hm->prec[1].precision, sizeof hm->prec[1].precision, "lo");
    hm->prec[0].decode_s = c_hi, hm->prec[1].decode_s = c_lo; /* one token in a decode step */
    hm->prec[0].a_s = 3 * c_hi, hm->prec[1].a_s = 3 * c_lo;   /* alone: decode steps use decode_s */
    hs->lat_s = lat, hs->bw = bw, hs->bw_par = bw, hs->n_par = 1;
}

static struct moe_plan exact_plan(void) {
    struct moe_plan p;
    memset(&p, 0, sizeof p);
    p.high = 0, p.low = -1, p.t1 = p.t2 = 1, p.policy = MOE_CACHE_LRU;
    return p;
}

static void compute_bound(void) {
    struct moe_trace t = make_trace(1);
    struct moe_plan_model m = model();
    struct moe_hw_model hm;
    struct moe_hw_storage hs;
    const double c = 1e-3, fixed = 2e-3, store = 1e-5;
    hw(&hm, &hs, c, 0.5e-3, fixed, store, 0, 1e18);
    struct moe_plan_params pp = moe_plan_default_params();
    pp.mem = m.fixed_bytes + ((int64_t)64 << 20), pp.prompt_len = 8;
    struct moe_plan p = exact_plan();
    CHECK(moe_plan_predict(&t, &m, &hm, &hs, &pp, &p) == MOE_OK, "predict");
    const double want = fixed + L * (K * c + store);
    CHECK(fabs(p.s_per_token - want) < 1e-9 * want, "all cached, free reads: %.9g s per token, want %.9g",
          p.s_per_token, want);
    CHECK(p.high_cap == L * E && p.neutral, "every expert fits (%d copies), the plan is exact", p.high_cap);
    /* big-little at fallback 0.3: T_little + r T_big */
    struct moe_plan b = exact_plan();
    b.little_k = 1, b.gamma = 0.2, b.fallback = 0.3, b.bl_prefetch = 2;
    CHECK(moe_plan_predict(&t, &m, &hm, &hs, &pp, &b) == MOE_OK, "predict big-little");
    const double tl = fixed + L * (1 * c + store), tb = fixed + L * (K * c + store);
    const double r = (b.s_per_token - tl) / tb;
    const int n_dec = NSEQ * (NTOK - 8);
    CHECK(fabs(r - 0.3) <= 3.0 / n_dec, "big-little: realised fallback %.4f of 0.3 over %d tokens", r, n_dec);
    CHECK(!b.neutral, "big-little is not exact");
    /* the speed-up T / (T_little + r T_big) */
    const double speedup = p.s_per_token / b.s_per_token, formula = want / (tl + r * tb);
    CHECK(fabs(speedup - formula) < 1e-9, "speed-up %.6f = MoBiLE's formula %.6f", speedup, formula);
}

static void storage_bound(void) {
    struct moe_trace t = make_trace(0);
    struct moe_plan_model m = model();
    struct moe_hw_model hm;
    struct moe_hw_storage hs;
    const double lat = 1e-4, bw = 1e8;
    hw(&hm, &hs, 0, 0, 0, 0, lat, bw);
    struct moe_plan_params pp = moe_plan_default_params();
    struct moe_plan p = exact_plan();
    /* a budget of exactly K high copies */
    const int64_t slot = 40960, over = moe_store_overhead_estimate(slot, 1, L * E, K, K);
    pp.mem = m.fixed_bytes + over + K * slot + 100, pp.prompt_len = 0;
    CHECK(moe_plan_predict(&t, &m, &hm, &hs, &pp, &p) == MOE_OK, "predict");
    CHECK(p.high_cap == K && p.high_slot == slot, "capacity %d copies of %lld bytes", p.high_cap, (long long)p.high_slot);
    const double want = L * K * (lat + (double)slot / bw);
    CHECK(fabs(p.s_per_token - want) < 1e-9 * want && p.hit_ratio == 0,
          "every access a miss: %.9g s per token, want %.9g (hit %g)", p.s_per_token, want, p.hit_ratio);
    CHECK(fabs(p.bytes_per_token - L * K * 40000.0) < 1e-6, "bytes per token %g", p.bytes_per_token);
    CHECK(fabs(p.stall_share - 1) < 1e-9, "all of it waiting (%g)", p.stall_share);
    pp.mem = m.fixed_bytes + 1000;
    CHECK(moe_plan_predict(&t, &m, &hm, &hs, &pp, &p) == MOE_ERR_RANGE, "a budget below top-k is refused");
}

static void monotone(void) {
    struct moe_trace t = make_trace(1);
    struct moe_plan_model m = model();
    struct moe_hw_model hm;
    struct moe_hw_storage hs;
    hw(&hm, &hs, 2e-4, 1e-4, 1e-3, 1e-6, 2e-4, 5e8);
    struct moe_plan_params pp = moe_plan_default_params();
    pp.prompt_len = 8;
    double last = INFINITY;
    int last_cap = 0;
    for (int copies = 3; copies <= L * E; copies += 3) {
        struct moe_plan p = exact_plan();
        pp.mem = m.fixed_bytes + moe_store_overhead_estimate(40960, 1, L * E, copies, K) + (int64_t)copies * 40960;
        CHECK(moe_plan_predict(&t, &m, &hm, &hs, &pp, &p) == MOE_OK, "predict %d", copies);
        CHECK(p.high_cap >= last_cap && p.s_per_token <= last * (1 + 1e-12),
              "%d copies: %.6g s per token, not slower than %.6g with fewer", p.high_cap, p.s_per_token, last);
        last = p.s_per_token, last_cap = p.high_cap;
    }
}

/* A made-up quality: low home copies cost 10 %, dynamic precision 1 %,
 * big-little (1 - fallback) x 6 %. Counts the calls. */
static int q_calls;
static struct moe_plan q_seen[64];
static enum moe_status fake_quality(const struct moe_plan *p, void *user, struct moe_plan_quality *q) {
    (void)user;
    if (q_calls < 64) q_seen[q_calls] = *p;
    q_calls++;
    double cost = (p->high == 1 ? 0.10 : 0) + (p->low >= 0 ? 0.01 : 0) + (p->little_k ? 0.06 * (1 - p->fallback) : 0);
    q->ppl_ratio = 1 + cost, q->kld = cost, q->same_top = 1 - cost;
    return MOE_OK;
}

static void search(void) {
    struct moe_trace t = make_trace(1);
    struct moe_plan_model m = model();
    struct moe_hw_model hm;
    struct moe_hw_storage hs;
    hw(&hm, &hs, 2e-4, 1e-4, 1e-3, 1e-6, 2e-4, 5e8);
    struct moe_plan_params pp = moe_plan_default_params();
    pp.mem = m.fixed_bytes + (int64_t)400000, pp.prompt_len = 8;
    pp.little_k = 1, pp.n_gamma = 2;
    pp.gamma[0] = 0.1, pp.fallback[0] = 0.2, pp.gamma[1] = 0.3, pp.fallback[1] = 0.5;
    pp.quality = fake_quality, pp.quality_budget = 0.035, pp.max_evals = 50;
    struct moe_plan_result r;
    q_calls = 0;
    CHECK(moe_plan_search(&t, &m, &hm, &hs, &pp, &r) == MOE_OK && r.n > 0, "search");
    int ok_sorted = 1, best = -1;
    for (int i = 0; i < r.n; i++) {
        const struct moe_plan *p = &r.plans[i];
        if (i && p->tok_s > r.plans[i - 1].tok_s) ok_sorted = 0;
        struct moe_plan_quality q;
        int calls = q_calls;
        fake_quality(p, NULL, &q);
        q_calls = calls;
        if (best < 0 && (p->neutral || q.ppl_ratio - 1 <= pp.quality_budget)) best = i;
        int hc, lc;
        moe_store_capacities(p->expert_mem, p->low_share, p->low >= 0, p->high_slot, p->low_slot, L * E, &hc, &lc);
        CHECK(hc == p->high_cap && lc == p->low_cap &&
                  p->expert_mem == pp.mem - m.fixed_bytes - moe_store_overhead_estimate(
                                                                p->high_slot > p->low_slot ? p->high_slot : p->low_slot,
                                                                m.n_loaders, L * E, hc + lc, K),
              "plan %d: the store's capacities and budget", i);
    }
    CHECK(ok_sorted, "plans sorted fastest first");
    CHECK(r.chosen == best && best >= 0, "chosen %d, the fastest within the budget is %d", r.chosen, best);
    CHECK(r.chosen > 0 && !r.plans[r.chosen].neutral && q_calls > 0,
          "the budget mattered: %d faster plans cost more; the chosen one is measured (%d calls)", r.chosen, q_calls);
    CHECK(r.n_evals == q_calls && q_calls <= pp.max_evals, "%d quality calls for %d evals", q_calls, r.n_evals);
    int dup = 0; /* a family (home, low, thresholds, big-little) measured twice */
    for (int i = 0; i < q_calls && i < 64; i++)
        for (int j = 0; j < i; j++)
            dup += q_seen[i].low == q_seen[j].low && q_seen[i].high == q_seen[j].high &&
                   q_seen[i].little_k == q_seen[j].little_k && q_seen[i].gamma == q_seen[j].gamma;
    CHECK(dup == 0 && q_calls > 1, "each family measured once (%d calls, %d repeated)", q_calls, dup);
    for (int i = 0; i < r.n; i++)
        if (r.plans[i].high == 1 && r.plans[i].low < 0 && r.plans[i].little_k == 0 && r.plans[i].has_quality)
            CHECK(fabs(r.plans[i].q.ppl_ratio - 1.10) < 1e-12, "a low home copy plan carries its measured cost");
    moe_plan_result_free(&r);
    pp.mem = m.fixed_bytes + 100;
    moe_log_set_level((enum moe_log_level)(MOE_LOG_ERROR + 1));
    CHECK(moe_plan_search(&t, &m, &hm, &hs, &pp, &r) == MOE_ERR_RANGE, "no plan fits 100 bytes");
    moe_log_set_level(MOE_LOG_WARN);
    /* without quality only exact plans can be chosen */
    pp.mem = m.fixed_bytes + (int64_t)400000, pp.quality = NULL;
    CHECK(moe_plan_search(&t, &m, &hm, &hs, &pp, &r) == MOE_OK && r.chosen >= 0 && r.plans[r.chosen].neutral,
          "without a quality measurement the chosen plan is exact");
    char opts[512];
    if (r.chosen >= 0) {
        moe_plan_options(&r.plans[r.chosen], &m, opts, sizeof opts);
        CHECK(strstr(opts, "--expert-mem ") && strstr(opts, "--high hi") && strstr(opts, "--dynamic off") &&
                  strstr(opts, "--little-k 0"),
              "moe-run options: %s", opts);
    }
    moe_plan_result_free(&r);
}

static void hw_table(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/test-plan-%d/hw.json", (int)getpid());
    struct moe_hw *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    if (!a || !b) return;
    a->mem_bw = 1.25e10;
    struct moe_hw_storage s;
    struct moe_hw_model m;
    hw(&m, &s, 1.5e-3, 0.75e-3, 2e-3, 3e-6, 1e-4, 2.5e9);
    snprintf(s.device, sizeof s.device, "8:1");
    snprintf(s.path, sizeof s.path, "/data/x.moeb");
    s.direct = 1, s.n_points = 2, s.points[0] = (struct moe_hw_point){65536, 1.3e-4}, s.points[1] = (struct moe_hw_point){1 << 20, 5e-4};
    snprintf(m.key, sizeof m.key, "x.moeb:123");
    m.prec[0].bytes = 40000, m.prec[1].bytes = 12000;
    m.prec[0].n_points = 1, m.prec[0].points[0] = (struct moe_hw_point){1, 1.4e-3};
    moe_hw_put_storage(a, &s);
    moe_hw_put_model(a, &m);
    m.threads = 4;
    moe_hw_put_model(a, &m);
    m.step_s = 9e-3;
    moe_hw_put_model(a, &m); /* replaces the 4-thread entry */
    CHECK(a->n_models == 2 && a->n_storage == 1, "entries: %d models, %d storage", a->n_models, a->n_storage);
    CHECK(moe_hw_load(path, b) == MOE_ERR_NOT_FOUND, "a missing table is not found");
    CHECK(moe_hw_save(path, a) == MOE_OK && moe_hw_load(path, b) == MOE_OK, "save and load");
    const struct moe_hw_model *bm = moe_hw_find_model(b, "x.moeb:123", 4);
    const struct moe_hw_storage *bs = moe_hw_find_storage(b, "8:1");
    CHECK(bm && bs && bm->step_s == 9e-3 && bm->fixed_s == 2e-3 && bm->store_step_s == 3e-6 &&
              bm->prec[1].decode_s == 0.75e-3 && fabs(bm->prec[1].a_s - 2.25e-3) < 1e-15 && bs->lat_s == 1e-4 && bs->bw == 2.5e9 && bs->direct == 1 &&
              bs->points[1].s == 5e-4 && b->mem_bw == 1.25e10 && !moe_hw_find_model(b, "x.moeb:123", 2),
          "the numbers come back");
    CHECK(bm && moe_hw_expert_s(moe_hw_find_expert(bm, "hi"), 1) == 1.4e-3 &&
              fabs(moe_hw_expert_s(moe_hw_find_expert(bm, "lo"), 2) - 2.25e-3) < 1e-15,
          "expert time: the measured point, else the fit");
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("{\"version\": 1, \"mem_bw\": 1, \"storage\": [{\"device\": 3}], \"models\": []}", f);
        fclose(f);
    }
    moe_log_set_level((enum moe_log_level)(MOE_LOG_ERROR + 1));
    CHECK(moe_hw_load(path, b) == MOE_ERR_FORMAT, "a damaged table is refused");
    moe_log_set_level(MOE_LOG_WARN);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf /tmp/test-plan-%d", (int)getpid());
    if (system(cmd)) {}
    free(a);
    free(b);
}

/* no_decode: a prompt as long as every sequence leaves nothing to decode:
 * refused, not a plan of "nan" tokens/s. */
static void no_decode(void) {
    struct moe_trace t = make_trace(1);
    struct moe_plan_model m = model();
    struct moe_hw_model hm;
    struct moe_hw_storage hs;
    hw(&hm, &hs, 2e-4, 1e-4, 1e-3, 1e-6, 2e-4, 5e8);
    struct moe_plan_params pp = moe_plan_default_params();
    pp.mem = m.fixed_bytes + (int64_t)400000;
    struct moe_plan p = exact_plan();
    pp.prompt_len = NTOK;
    CHECK(moe_plan_predict(&t, &m, &hm, &hs, &pp, &p) == MOE_ERR_INVALID, "a prompt of every token (%d) refused", NTOK);
    pp.prompt_len = NTOK - 1;
    p = exact_plan();
    CHECK(moe_plan_predict(&t, &m, &hm, &hs, &pp, &p) == MOE_OK && isfinite(p.tok_s) && p.tok_s > 0,
          "one token left to decode: %g tok/s", p.tok_s);
    struct moe_plan_result r;
    pp.prompt_len = NTOK + 5;
    CHECK(moe_plan_search(&t, &m, &hm, &hs, &pp, &r) == MOE_ERR_INVALID, "the search refuses it too");
}

int main(void) {
    compute_bound();
    no_decode();
    storage_bound();
    monotone();
    search();
    hw_table();
    printf("test-plan: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    return fails != 0;
}

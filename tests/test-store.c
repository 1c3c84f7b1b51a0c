/*
 * test-store.c - the expert store (runtime/offload/store.c) on the trained demo model
 * quantized to q8_0 and q2_k experts:
 *   - a budget that holds every expert, and a budget of a few experts with
 *     dynamic precision off, give logits bit-identical to the run without a
 *     budget (every expert resident, as mapped), under every online policy;
 *   - the same routing replayed through fit-cache's simulator
 *     (moe_cache_simulate, same capacities, policy, thresholds, prompt batch,
 *     prefetch and warm start off) gives the store's hit / miss / skip counts
 *     per precision exactly, with dynamic precision and skipping on;
 *   - a budget too small for one layer's top-k is refused, naming the minimum;
 *   - `moe-prep eval` through the engine: with dynamic precision off the
 *     engine's PPL equals the all-resident reference's (KL 0) while the store
 *     loads experts; with it on, one-token steps use low copies and the KL
 *     becomes positive; engine options on a checkpoint directory are refused;
 *   - peak memory of `moe-run --expert-mem` on an inflated model whose experts
 *     are more than 4x the budget stays within non-expert weights + budget +
 *     the store's overhead + a fixed 32 MiB (process, KV cache, scratch).
 * argv: moe-prep moe-run inflate-moe MODEL_DIR WORK_DIR.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "cache-sim.h"
#include "moe-bundle.h"
#include "moe-mmap.h"
#include "moe-options.h"
#include "moe-session.h"
#include "moe-test.h"
#include "moe-tuning.h"

static const char *prep, *moe_run, *inflate, *model_dir, *work;

#define NP 12 /* prompt tokens */
#define ND 10 /* decode tokens */

/* run: two sequences (prompt batch + one-token steps) through a session with
 * store params sp (NULL: no budget); all logits into out [2 x (NP+ND) x V]. */
static int run(const char *bundle, const struct moe_store_params *sp, float *out, int record,
               struct moe_store_stats *stats, struct moe_session_trace *trace, struct moe_session **keep,
               struct moe_model **keep_m) {
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = "q8_0";
    mp.lazy_experts = sp != NULL;
    struct moe_model *m = NULL;
    struct moe_session *s = NULL;
    if (moe_model_load(bundle, &mp, &m) != MOE_OK) return 0;
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = 2;
    p.store = sp;
    p.record_trace = record;
    int ok = moe_session_create(m, &p, &s) == MOE_OK;
    const size_t V = (size_t)m->cfg.n_vocab;
    for (int q = 0; ok && q < 2; q++) {
        int32_t ids[NP + ND];
        for (int i = 0; i < NP + ND; i++) ids[i] = (int32_t)((37 * i + 101 * q + 5) % m->cfg.n_vocab);
        moe_session_reset(s);
        float *o = out + (size_t)q * (NP + ND) * V;
        ok = moe_session_forward(s, ids, NP, o, 1) == MOE_OK;
        for (int i = NP; ok && i < NP + ND; i++) ok = moe_session_forward(s, ids + i, 1, o + (size_t)i * V, 0) == MOE_OK;
    }
    if (ok && stats && moe_session_store(s)) moe_store_get_stats(moe_session_store(s), stats);
    if (ok && trace) ok = moe_session_trace(s, trace) == MOE_OK;
    if (keep && ok) {
        *keep = s, *keep_m = m;
        return 1;
    }
    moe_session_free(s);
    moe_model_free(m);
    return ok;
}

/* identical: the runs with a budget compute exactly what the run without one does. */
static void identical(const char *bundle) {
    struct moe_model *m = NULL;
    CHECK(moe_model_load(bundle, NULL, &m) == MOE_OK, "load %s", bundle);
    if (!m) return;
    const size_t V = (size_t)m->cfg.n_vocab, n = 2 * (NP + ND) * V;
    moe_model_free(m);
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    CHECK(ref && got && run(bundle, NULL, ref, 0, NULL, NULL, NULL, NULL), "reference run");
    static const char *const pols[] = {"lru", "lfu-seq", "lfu-global", "lhu", "fld", "edgemoe", "hobbit"};
    for (int i = 0; ref && got && i < (int)(sizeof pols / sizeof *pols); i++) {
        struct moe_store_params sp = moe_store_default_params();
        char err[128];
        CHECK(moe_store_parse_option(&sp, "--policy", pols[i], err, sizeof err) == MOE_OK, "%s", err);
        sp.dynamic = 0;
        sp.high_cap = i == 0 ? 32 : 5; /* everything, then a few experts */
        sp.low_cap = 0;
        struct moe_store_stats st;
        memset(&st, 0, sizeof st);
        CHECK(run(bundle, &sp, got, 0, &st, NULL, NULL, NULL), "%s: run with a budget", pols[i]);
        CHECK(!memcmp(ref, got, n * sizeof *ref), "%s, %d copies: logits differ from the run without a budget", pols[i],
              sp.high_cap);
        CHECK(st.accesses > 0 && st.hits_high + st.misses_high == st.accesses, "%s: counts %lld", pols[i],
              (long long)st.accesses);
        if (i > 0) CHECK(st.misses_high > 0 && st.peak_resident_bytes <= 5 * st.high_copy_bytes + 2 * st.high_copy_bytes,
                         "%s: a 5-copy cache misses and stays small (peak %lld)", pols[i], (long long)st.peak_resident_bytes);
    }
    free(ref);
    free(got);
}

/* same_as_simulator: the store's counts equal fit-cache's replay of its own routing. */
static void same_as_simulator(const char *bundle) {
    static const enum moe_cache_policy pols[] = {MOE_CACHE_LRU, MOE_CACHE_LFU_SEQ, MOE_CACHE_LFU_GLOBAL, MOE_CACHE_LHU,
                                                 MOE_CACHE_FLD, MOE_CACHE_HOBBIT};
    float *logits = malloc(sizeof(float) * 2 * (NP + ND) * 4096);
    for (int i = 0; logits && i < (int)(sizeof pols / sizeof *pols); i++) {
        struct moe_store_params sp = moe_store_default_params();
        sp.policy = (int)pols[i];
        sp.high_cap = 6, sp.low_cap = 4;
        sp.dynamic = 1, sp.skip = 1, sp.t1 = 0.55, sp.t2 = 0.8;
        sp.warm = 0, sp.prefetch_layers = 0, sp.prefetch_paths = 0;
        sp.low = "q2_k";
        struct moe_store_stats st;
        struct moe_session_trace tr;
        struct moe_session *s = NULL;
        struct moe_model *m = NULL;
        if (!run(bundle, &sp, logits, 1, &st, &tr, &s, &m)) {
            CHECK(0, "%s: run", moe_cache_policy_name(pols[i]));
            continue;
        }
        const size_t n = (size_t)tr.n_tokens * (size_t)tr.n_layers * (size_t)tr.k;
        int16_t *ex = malloc(sizeof *ex * n);
        int64_t ss[3] = {tr.seq_start[0], tr.seq_start[1], tr.seq_start[2]};
        for (size_t j = 0; ex && j < n; j++) ex[j] = (int16_t)tr.experts[j];
        struct moe_trace t = {tr.n_layers, m->cfg.n_expert, tr.k, tr.n_seq, ss, ex, tr.weights};
        CHECK(tr.n_seq == 2 && tr.n_tokens == 2 * (NP + ND), "trace: %d sequences, %lld tokens", tr.n_seq,
              (long long)tr.n_tokens);
        struct moe_cache_trace_params tp = moe_cache_trace_default_params();
        tp.prompt_len = NP, tp.t1 = sp.t1, tp.t2 = sp.t2;
        struct moe_cache_trace *ct = NULL;
        struct moe_cache_stats cs;
        struct moe_cache_config cc = moe_cache_default_config();
        cc.high_cap = 6, cc.low_cap = 4;
        CHECK(ex && moe_cache_trace_new(&t, NULL, 0, &tp, &ct) == MOE_OK &&
                  moe_cache_simulate(ct, pols[i], &cc, &cs) == MOE_OK,
              "%s: replay", moe_cache_policy_name(pols[i]));
        if (ct)
            CHECK(cs.accesses == st.accesses && cs.hits_high == st.hits_high && cs.hits_low == st.hits_low &&
                      cs.misses_high == st.misses_high && cs.misses_low == st.misses_low && cs.skips == st.skips,
                  "%s: simulator %lld accesses, hits %lld/%lld, misses %lld/%lld, skips %lld; store %lld, %lld/%lld, "
                  "%lld/%lld, %lld",
                  moe_cache_policy_name(pols[i]), (long long)cs.accesses, (long long)cs.hits_high,
                  (long long)cs.hits_low, (long long)cs.misses_high, (long long)cs.misses_low, (long long)cs.skips,
                  (long long)st.accesses, (long long)st.hits_high, (long long)st.hits_low, (long long)st.misses_high,
                  (long long)st.misses_low, (long long)st.skips);
        CHECK(st.misses_low > 0 && st.hits_high > 0, "%s: both precisions were loaded", moe_cache_policy_name(pols[i]));
        moe_cache_trace_free(ct);
        free(ex);
        moe_session_free(s);
        moe_model_free(m);
    }
    free(logits);
}

/* prefetching: on a profiled bundle (path dictionary and placement in the
 * tuning) both prefetchers start reads and some serve demand accesses, and
 * prefetching never changes what is computed (dynamic precision off). */
static void prefetching(const char *bundle, const char *text) {
    CHECK(moe_test_sh("'%s' profile '%s' --dataset '%s' -o '%s/p.h5' --ctx 128 --max-tokens 4096 >/dev/null 2>&1", prep, bundle,
             text, work) == 0,
          "profile the bundle (writes the tuning)");
    struct moe_model *m = NULL;
    CHECK(moe_model_load(bundle, NULL, &m) == MOE_OK, "load");
    if (!m) return;
    const size_t n = 2 * (NP + ND) * (size_t)m->cfg.n_vocab;
    moe_model_free(m);
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    CHECK(ref && got && run(bundle, NULL, ref, 0, NULL, NULL, NULL, NULL), "reference run");
    for (int mode = 0; ref && got && mode < 2; mode++) {
        struct moe_store_params sp = moe_store_default_params();
        sp.dynamic = 0, sp.high_cap = 8, sp.low_cap = 0, sp.policy = MOE_CACHE_LRU;
        sp.prefetch_layers = mode == 0 ? 1 : 0, sp.prefetch_paths = mode == 1 ? 3 : 0;
        struct moe_store_stats st;
        memset(&st, 0, sizeof st);
        CHECK(run(bundle, &sp, got, 0, &st, NULL, NULL, NULL), "%s prefetch run", mode ? "path" : "stacked-gate");
        CHECK(!memcmp(ref, got, n * sizeof *ref), "%s prefetch changed the logits", mode ? "path" : "stacked-gate");
        /* a prefetch never evicts a cached copy: the policy decides exactly as
         * in the same store (same prefetch slot) without prefetching, and
         * every prefetched copy used is a demand read saved */
        struct moe_store_params sp0 = sp;
        sp0.prefetch_layers = sp0.prefetch_paths = 0, sp0.prefetch_slots = 1;
        struct moe_store_stats s0;
        memset(&s0, 0, sizeof s0);
        CHECK(run(bundle, &sp0, got, 0, &s0, NULL, NULL, NULL), "run without prefetch");
        CHECK(s0.hits_high == st.hits_high && s0.misses_high == st.misses_high && s0.accesses == st.accesses &&
                  s0.prefetch_loads == 0,
              "%s prefetch changed the policy's decisions: hits %lld / %lld, misses %lld / %lld",
              mode ? "path" : "stacked-gate", (long long)st.hits_high, (long long)s0.hits_high,
              (long long)st.misses_high, (long long)s0.misses_high);
        /* reads asked for (started + cancelled + queued: what the policy asked, whatever the timing) */
        const long long asked = st.loads + st.reads_cancelled + st.reads_queued,
                        asked0 = s0.loads + s0.reads_cancelled + s0.reads_queued;
        CHECK(asked == asked0 - st.prefetch_used + st.prefetch_loads + st.prefetch_cancelled,
              "%s prefetch: %lld reads asked = %lld without - %lld used + %lld prefetched + %lld cancelled",
              mode ? "path" : "stacked-gate", asked, asked0, (long long)st.prefetch_used, (long long)st.prefetch_loads,
              (long long)st.prefetch_cancelled);
        /* mispredictions are dropped (their slot reused), never kept */
        CHECK(st.prefetch_dropped + st.prefetch_used <= st.prefetch_loads &&
                  (mode == 1 || st.prefetch_dropped + st.prefetch_cancelled > 0),
              "%s prefetch: %lld dropped, %lld used, %lld loads, %lld cancelled", mode ? "path" : "stacked-gate",
              (long long)st.prefetch_dropped, (long long)st.prefetch_used, (long long)st.prefetch_loads,
              (long long)st.prefetch_cancelled);
        CHECK(st.prefetch_loads > 0 && st.prefetch_used > 0 && st.prefetch_used <= st.prefetch_loads,
              "%s prefetch: %lld loads, %lld used", mode ? "path" : "stacked-gate", (long long)st.prefetch_loads,
              (long long)st.prefetch_used);
        /* loads count the reads that started: cancelled ones are apart, and every read is timed */
        CHECK(st.reads_cancelled >= st.prefetch_cancelled && st.loads > 0 && st.queue_depth_max >= 1 &&
                  st.read_s > 0 && st.read_s_max > 0 && st.read_s_max <= st.read_s,
              "%s prefetch: %lld reads, %lld cancelled (%lld prefetches), depth %d, %.4f s reading",
              mode ? "path" : "stacked-gate", (long long)st.loads, (long long)st.reads_cancelled,
              (long long)st.prefetch_cancelled, st.queue_depth_max, st.read_s);
    }
    free(ref);
    free(got);
}

/* served_set: the fake cache of route_pick (served[e]). */
static int served_set(int e, int rank, void *user) {
    (void)rank;
    return ((const int *)user)[e];
}

/* cache_route: the substitution rule (never the top-1, only within the
 * margin, the most probable cached expert), the option off by default and
 * at 0, counted when on, and the tuning key read back. */
static void cache_route(const char *bundle) {
    const float probs[6] = {0.40f, 0.21f, 0.20f, 0.15f, 0.03f, 0.01f};
    int served[6] = {0, 0, 0, 1, 1, 0};
    int32_t sel[2] = {0, 1};
    double mass = -1;
    CHECK(moe_cache_route_pick(probs, 6, sel, 2, 0.05, served_set, served, &mass) == 0 && sel[0] == 0 && sel[1] == 1 &&
              mass == 0,
          "a margin of 0.05 does not reach 0.21 -> 0.15 (%d %d)", sel[0], sel[1]);
    CHECK(moe_cache_route_pick(probs, 6, sel, 2, 0.07, served_set, served, &mass) == 1 && sel[0] == 0 && sel[1] == 3 &&
              fabs(mass - 0.06) < 1e-6,
          "0.07 replaces rank 1 by the most probable cached expert (%d %d, mass %g)", sel[0], sel[1], mass);
    sel[0] = 0, sel[1] = 1;
    CHECK(moe_cache_route_pick(probs, 6, sel, 2, 0, served_set, served, NULL) == 0 && sel[1] == 1, "margin 0 is off");
    served[1] = 1, sel[0] = 0, sel[1] = 1;
    CHECK(moe_cache_route_pick(probs, 6, sel, 2, 1, served_set, served, NULL) == 0 && sel[0] == 0 && sel[1] == 1,
          "the top-1 is never replaced, a served choice stays (%d %d)", sel[0], sel[1]);

    struct moe_model *m = NULL;
    CHECK(moe_model_load(bundle, NULL, &m) == MOE_OK, "load");
    if (!m) return;
    const size_t n = 2 * (NP + ND) * (size_t)m->cfg.n_vocab;
    moe_model_free(m);
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    CHECK(ref && got && run(bundle, NULL, ref, 0, NULL, NULL, NULL, NULL), "reference run");
    for (int on = 0; ref && got && on < 3; on++) { /* default (no tuning key), 0, 0.5 */
        struct moe_store_params sp = moe_store_default_params();
        sp.dynamic = 0, sp.high_cap = 12, sp.low_cap = 0, sp.policy = MOE_CACHE_LRU;
        if (on) sp.route_margin = on == 1 ? 0 : 0.5;
        struct moe_store_stats st;
        memset(&st, 0, sizeof st);
        CHECK(run(bundle, &sp, got, 0, &st, NULL, NULL, NULL), "route run %d", on);
        if (on < 2)
            CHECK(!memcmp(ref, got, n * sizeof *ref) && st.route_substituted == 0 && st.route_margin == 0,
                  "cache-aware routing %s: nothing replaced, logits unchanged", on ? "at 0" : "by default");
        else
            CHECK(st.route_substituted > 0 && st.route_margin == 0.5 && st.route_mass_moved > 0 &&
                      st.route_mass_moved <= 0.5 * (double)st.route_substituted,
                  "cache-aware routing at 0.5: %lld replaced, mass %g", (long long)st.route_substituted,
                  st.route_mass_moved);
    }
    /* the tuning key: written, read back, used by default, overridden by the option */
    struct moe_bundle_kv *kv = NULL;
    struct moe_bundle *b = NULL;
    struct moe_tuning t;
    CHECK(moe_bundle_kv_new(&kv) == MOE_OK && moe_tuning_set_cache_route(kv, 1.5, NAN) == MOE_ERR_INVALID &&
              moe_tuning_set_cache_route(kv, 0.25, 0.001) == MOE_OK && moe_tuning_read(kv, 4, 8, &t) == MOE_OK &&
              t.has_route_margin && t.route_margin == 0.25 && t.route_target == 0.001,
          "cache_route.margin round-trips through the tuning");
    moe_bundle_kv_free(kv);
    kv = NULL;
    CHECK(moe_bundle_open(bundle, &b) == MOE_OK && moe_bundle_kv_new(&kv) == MOE_OK &&
              moe_bundle_kv_copy(kv, moe_bundle_tuning(b)) == MOE_OK && moe_tuning_set_cache_route(kv, 0.25, NAN) == MOE_OK,
          "tuning with a margin");
    moe_bundle_free(b);
    CHECK(kv && moe_bundle_replace_tuning(bundle, kv) == MOE_OK, "write the margin into the bundle");
    moe_bundle_kv_free(kv);
    for (int opt = 0; ref && got && opt < 2; opt++) {
        struct moe_store_params sp = moe_store_default_params();
        sp.dynamic = 0, sp.high_cap = 12, sp.low_cap = 0, sp.policy = MOE_CACHE_LRU;
        if (opt) sp.route_margin = 0;
        struct moe_store_stats st;
        memset(&st, 0, sizeof st);
        CHECK(run(bundle, &sp, got, 0, &st, NULL, NULL, NULL) && st.route_margin == (opt ? 0 : 0.25) &&
                  (opt ? st.route_substituted == 0 : st.route_substituted > 0),
              "the bundle's margin %s (margin %g, %lld replaced)", opt ? "overridden by --route-margin 0" : "used",
              st.route_margin, (long long)st.route_substituted);
    }
    free(ref);
    free(got);
}

/* eval_json: run `moe-prep eval` with extra options, parse its JSON. */
static cJSON *eval_json(const char *bundle, const char *text, const char *opts) {
    char out[1200];
    snprintf(out, sizeof out, "%s/eval.json", work);
    if (moe_test_sh("'%s' eval '%s' --ref '%s' --expert-precision q8_0 --dataset '%s' --ctx 64 --max-chunks 3 --json %s "
           ">'%s' 2>/dev/null", prep, bundle, bundle, text, opts, out) != 0)
        return NULL;
    char *js = NULL;
    size_t len = 0;
    if (moe_read_file(out, 1 << 24, &js, &len) != MOE_OK) return NULL;
    cJSON *j = cJSON_Parse(js);
    free(js);
    return j;
}

static double jnum(const cJSON *o, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

/* through_eval: moe-prep eval takes the engine options (item 7). */
static void through_eval(const char *bundle, const char *text) {
    cJSON *j = eval_json(bundle, text, "--expert-mem 25% --dynamic off --high q8_0 --policy lru");
    CHECK(j != NULL, "eval --expert-mem 25%% --dynamic off runs");
    if (j) {
        CHECK(jnum(j, "kld", "mean") == 0 && jnum(j, "ppl", "value") == jnum(j, "ref_ppl", "value"),
              "dynamic off through the engine equals the all-resident run (KL %g)", jnum(j, "kld", "mean"));
        CHECK(jnum(j, "engine", "loads") > 0 && jnum(j, "engine", "misses_low") == 0 &&
                  jnum(j, "engine", "hits_low") == 0,
              "the engine loaded experts, none low (%g loads)", jnum(j, "engine", "loads"));
        cJSON_Delete(j);
    }
    j = eval_json(bundle, text, "--expert-mem 25% --dynamic on --high q8_0 --low q2_k --t1 0.5 --t2 0.99 --batch 1");
    CHECK(j != NULL, "eval --dynamic on --batch 1 runs");
    if (j) {
        double low = jnum(j, "engine", "hits_low") + jnum(j, "engine", "misses_low");
        CHECK(low > 0 && jnum(j, "engine", "accesses") == jnum(j, "engine", "hits_high") +
                                                                jnum(j, "engine", "misses_high") + low +
                                                                jnum(j, "engine", "skips"),
              "dynamic precision used low copies (%g of %g uses)", low, jnum(j, "engine", "accesses"));
        CHECK(jnum(j, "kld", "mean") > 0 && jnum(j, "kld", "mean") < 0.5,
              "low copies move the distribution a little (KL %g)", jnum(j, "kld", "mean"));
        cJSON_Delete(j);
    }
    CHECK(moe_test_sh("'%s' eval '%s' --dataset '%s' --expert-mem 25%% >/dev/null 2>&1", prep, model_dir, text) == 2,
          "engine options on a checkpoint directory are a usage error");
}

/* too_small: a budget below one layer's top-k is refused with the minimum. */
static void too_small(const char *bundle) {
    struct moe_model_params mp = moe_model_default_params();
    mp.lazy_experts = 1;
    struct moe_model *m = NULL;
    struct moe_session *s = NULL;
    CHECK(moe_model_load(bundle, &mp, &m) == MOE_OK, "load");
    struct moe_store_params sp = moe_store_default_params();
    sp.expert_mem = 100000;
    struct moe_session_params p = moe_session_default_params();
    p.store = &sp;
    CHECK(m && moe_session_create(m, &p, &s) == MOE_ERR_INVALID && !s, "100 kB budget refused");
    moe_session_free(s);
    moe_model_free(m);
    CHECK(moe_test_sh("'%s' -m '%s' --expert-mem 100K -p hi -n 1 2>'%s/err.txt' >/dev/null", moe_run, bundle, work) == 1,
          "moe-run exits 1");
    char *text = NULL;
    size_t len = 0;
    char path[1200];
    snprintf(path, sizeof path, "%s/err.txt", work);
    CHECK(moe_read_file(path, 1 << 20, &text, &len) == MOE_OK && text && strstr(text, "needs at least"),
          "the message names the minimum: %s", text ? text : "");
    free(text);
    /* the minimum named is the true one: one byte less is refused, it is accepted */
    static const char *const opts[] = {"", "--dynamic off", "--dynamic on --low q2_k"};
    for (int i = 0; i < 3; i++) {
        char out[4096] = "";
        long long min = 0;
        moe_test_sh_out(out, sizeof out, "'%s' -m '%s' --expert-mem 100K %s -p hi -n 1 2>&1 >/dev/null", moe_run, bundle,
                        opts[i]);
        const char *at = strstr(out, "needs at least ");
        if (!at || sscanf(at, "needs at least %lld bytes", &min) != 1 || min <= 100000) {
            CHECK(0, "'%s': the minimum named: %s", opts[i], out);
            continue;
        }
        CHECK(moe_test_sh("'%s' -m '%s' --expert-mem %lld %s -p hi -n 1 >/dev/null 2>&1", moe_run, bundle, min - 1,
                          opts[i]) == 1, "'%s': the minimum - 1 (%lld) is refused", opts[i], min - 1);
        CHECK(moe_test_sh("'%s' -m '%s' --expert-mem %lld %s -p hi -n 1 >/dev/null 2>&1", moe_run, bundle, min, opts[i]) == 0,
              "'%s': the minimum (%lld) is accepted", opts[i], min);
    }
}

/* thresholds: T1 > T2 (or outside [0, 1]) would turn dynamic precision off
 * without a word: an error, from the library and from moe-run. */
static void thresholds(const char *bundle) {
    struct moe_model_params mp = moe_model_default_params();
    mp.lazy_experts = 1;
    struct moe_model *m = NULL;
    CHECK(moe_model_load(bundle, &mp, &m) == MOE_OK, "load");
    static const double bad[][2] = {{0.9, 0.5}, {-0.1, 0.5}, {0.5, 1.5}};
    for (int i = 0; m && i < 3; i++) {
        struct moe_store_params sp = moe_store_default_params();
        sp.high_cap = 6, sp.low_cap = 4, sp.dynamic = 1, sp.low = "q2_k";
        sp.t1 = bad[i][0], sp.t2 = bad[i][1];
        struct moe_session_params p = moe_session_default_params();
        p.store = &sp;
        struct moe_session *s = NULL;
        CHECK(moe_session_create(m, &p, &s) == MOE_ERR_INVALID && !s, "T1 %g T2 %g refused", bad[i][0], bad[i][1]);
        moe_session_free(s);
    }
    moe_model_free(m);
    CHECK(moe_test_sh("'%s' -m '%s' --expert-mem 50%% --t1 0.9 --t2 0.5 -p hi -n 1 >/dev/null 2>&1", moe_run, bundle) == 1,
          "moe-run --t1 0.9 --t2 0.5 exits 1");
    CHECK(moe_test_sh("'%s' -m '%s' --expert-mem 50%% --t1 0.5 --t2 0.9 -p hi -n 1 >/dev/null 2>&1", moe_run, bundle) == 0,
          "moe-run --t1 0.5 --t2 0.9 runs");
}

/* mixed_run: one-token steps of a model whose experts are bound at q2_k
 * except expert 0 of every layer (q8_0), as a bit-width map binds them;
 * with store params sp (NULL: none). Logits of every step into out. */
static int mixed_run(const char *bundle, const struct moe_store_params *sp, float *out, int n,
                     struct moe_store_stats *stats, int64_t *home_bytes) {
    struct moe_model_params mp = moe_model_default_params();
    mp.lazy_experts = sp != NULL;
    struct moe_model *m = NULL;
    struct moe_session *s = NULL;
    if (moe_model_load(bundle, &mp, &m) != MOE_OK) return 0;
    struct moe_bundle *b = NULL;
    uint32_t q8 = 0, q2 = 0;
    int ok = moe_bundle_open(bundle, &b) == MOE_OK && moe_bundle_find_precision(b, "q8_0", &q8) == MOE_OK &&
             moe_bundle_find_precision(b, "q2_k", &q2) == MOE_OK;
    *home_bytes = 0;
    for (int l = 0; ok && l < m->cfg.n_layer; l++)
        for (int e = 0; ok && m->cfg.layer_moe[l] && e < m->cfg.n_expert; e++) {
            const uint32_t pr = e == 0 ? q8 : q2;
            struct moe_bundle_blob bl;
            ok = moe_model_set_expert_precision(m, l, e, (int)pr) == MOE_OK &&
                 moe_bundle_expert(b, (uint32_t)l, (uint32_t)e, pr, &bl) == MOE_OK;
            *home_bytes += ok ? (int64_t)((bl.raw_size + 4095) / 4096 * 4096) : 0;
        }
    moe_bundle_free(b);
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = 2;
    p.store = sp;
    ok = ok && moe_session_create(m, &p, &s) == MOE_OK;
    const size_t V = (size_t)m->cfg.n_vocab;
    for (int i = 0; ok && i < n; i++) {
        const int32_t id = (int32_t)((41 * i + 3) % m->cfg.n_vocab);
        ok = moe_session_forward(s, &id, 1, out + (size_t)i * V, 0) == MOE_OK;
    }
    if (ok && stats && moe_session_store(s)) moe_store_get_stats(moe_session_store(s), stats);
    moe_session_free(s);
    moe_model_free(m);
    return ok;
}

/* size_classes: high slots are sized per home precision: with a bit-width
 * map of mostly q2_k copies, a budget of every home copy's bytes holds every
 * expert (slots of the largest copy would hold a third of them), and the
 * logits stay those of the run without a budget. */
static void size_classes(const char *bundle) {
    enum { N = 16 };
    struct moe_model *m = NULL;
    CHECK(moe_model_load(bundle, NULL, &m) == MOE_OK, "load");
    if (!m) return;
    const size_t V = (size_t)m->cfg.n_vocab;
    int all = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) all += m->cfg.layer_moe[l] ? m->cfg.n_expert : 0;
    moe_model_free(m);
    float *ref = malloc(sizeof(float) * N * V), *got = malloc(sizeof(float) * N * V);
    int64_t home = 0;
    CHECK(ref && got && mixed_run(bundle, NULL, ref, N, NULL, &home), "mixed precisions without a budget");
    struct moe_store_params sp = moe_store_default_params();
    sp.expert_mem = home;
    sp.dynamic = 0;
    sp.policy = (int)MOE_CACHE_LRU;
    struct moe_store_stats st;
    memset(&st, 0, sizeof st);
    int64_t h2 = 0;
    CHECK(got && mixed_run(bundle, &sp, got, N, &st, &h2), "mixed precisions with a budget of every home copy");
    CHECK(st.high_cap == all, "the budget of every home copy (%lld bytes) holds all %d experts (cap %d)",
          (long long)home, all, st.high_cap);
    CHECK(st.slot_bytes <= home + 2 * st.high_copy_bytes + 2 * 4096, "slots %lld bytes within the budget + scratch",
          (long long)st.slot_bytes);
    CHECK(ref && got && !memcmp(ref, got, sizeof(float) * N * V), "mixed precisions: logits as without a budget");
    sp.expert_mem = home / 2; /* half: more copies than slots of the largest copy would give */
    CHECK(got && mixed_run(bundle, &sp, got, N, &st, &h2), "mixed precisions at half the bytes");
    CHECK(st.high_cap > (int)(home / 2 / st.high_copy_bytes) && st.misses_high > 0,
          "half the bytes hold %d copies, more than %lld of the largest size", st.high_cap,
          (long long)(home / 2 / st.high_copy_bytes));
    CHECK(ref && got && !memcmp(ref, got, sizeof(float) * N * V), "mixed precisions at half: logits as without a budget");
    free(ref);
    free(got);
}

/* low_not_lower: experts whose home copy is already the lowest precision
 * (bound at q2_k) never load a second, "low" copy of themselves: every use
 * is a high hit or miss, with dynamic precision on. */
static void low_not_lower(const char *bundle) {
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = "q2_k";
    mp.lazy_experts = 1;
    struct moe_model *m = NULL;
    struct moe_session *s = NULL;
    CHECK(moe_model_load(bundle, &mp, &m) == MOE_OK, "load at q2_k");
    struct moe_store_params sp = moe_store_default_params();
    sp.high_cap = 6, sp.low_cap = 4, sp.dynamic = 1, sp.t1 = 0.2, sp.t2 = 0.99, sp.low = "q2_k", sp.warm = 0;
    struct moe_session_params p = moe_session_default_params();
    p.store = &sp;
    CHECK(m && moe_session_create(m, &p, &s) == MOE_OK, "session");
    int ok = s != NULL;
    float *logits = m ? malloc(sizeof(float) * (size_t)m->cfg.n_vocab) : NULL;
    for (int i = 0; ok && logits && i < 24; i++) {
        const int32_t id = (int32_t)((53 * i + 7) % m->cfg.n_vocab);
        ok = moe_session_forward(s, &id, 1, logits, 0) == MOE_OK;
    }
    CHECK(ok, "24 one-token steps");
    struct moe_store_stats st;
    memset(&st, 0, sizeof st);
    if (s) moe_store_get_stats(moe_session_store(s), &st);
    CHECK(st.accesses > 0 && st.hits_low == 0 && st.misses_low == 0 && st.hits_high + st.misses_high == st.accesses,
          "no low copies of experts already at the lowest precision (high %lld + %lld, low %lld + %lld of %lld)",
          (long long)st.hits_high, (long long)st.misses_high, (long long)st.hits_low, (long long)st.misses_low,
          (long long)st.accesses);
    free(logits);
    moe_session_free(s);
    moe_model_free(m);
}

/* peak_memory: an inflated model's experts are >= 4x the budget; moe-run's
 * peak RSS stays within non-expert weights + budget + overhead + 32 MiB. */
static void peak_memory(void) {
    char dir[1200], bundle[1300], stats[1300];
    snprintf(dir, sizeof dir, "%s/inflated", work);
    snprintf(bundle, sizeof bundle, "%s/inflated.moeb", work);
    snprintf(stats, sizeof stats, "%s/stats.json", work);
    CHECK(moe_test_sh("'%s' '%s' '%s' --ffn 4096 >/dev/null 2>&1", inflate, model_dir, dir) == 0, "inflate to 4096");
    CHECK(moe_test_sh("'%s' quantize '%s' -o '%s' --experts q8_0 --dense q8_0 >/dev/null 2>&1", prep, dir, bundle) == 0,
          "quantize the inflated model");
    struct moe_bundle *b = NULL;
    if (moe_bundle_open(bundle, &b) != MOE_OK) {
        CHECK(0, "open %s", bundle);
        return;
    }
    struct moe_bundle_info info;
    moe_bundle_get_info(b, &info);
    int64_t nonexpert = 0;
    for (size_t i = 0; i < moe_bundle_tensor_count(b); i++) nonexpert += (int64_t)moe_bundle_tensor_at(b, i)->size;
    const int64_t experts = (int64_t)info.raw_blob_bytes, budget = experts / 5;
    moe_bundle_free(b);
    static const char *const modes[] = {"direct", "buffered", "mmap"};
    for (int mi = 0; mi < 3; mi++) {
        CHECK(moe_test_sh("'%s' -m '%s' --expert-mem %lld --io %s -p 'Once upon a time there was' -n 32 -t 2 "
                          "--stats-json '%s' >/dev/null 2>&1",
                          moe_run, bundle, (long long)budget, modes[mi], stats) == 0,
              "moe-run --io %s with a budget of a fifth of the experts", modes[mi]);
        char *text = NULL;
        size_t len = 0;
        cJSON *j = moe_read_file(stats, 1 << 20, &text, &len) == MOE_OK ? cJSON_Parse(text) : NULL;
        free(text);
        const cJSON *rss = cJSON_GetObjectItem(j, "peak_rss_bytes"), *store = cJSON_GetObjectItem(j, "store");
        const cJSON *over = cJSON_GetObjectItem(j, "store_overhead_bytes");
        const cJSON *loads = cJSON_GetObjectItem(store, "loads");
        const cJSON *copy = cJSON_GetObjectItem(store, "high_copy_bytes");
        CHECK(rss && store && over && loads && loads->valuedouble > 0, "%s: stats with store counts", modes[mi]);
        CHECK(experts >= 4 * budget, "experts %lld >= 4 x budget %lld", (long long)experts, (long long)budget);
        /* the documented fixed overhead: two scratch copies (4 KiB-rounded) + the loaders' staging of a group
         * of rows (at most MOE_STORE_GROUP_MAX each) + bookkeeping under 1 MiB */
        const double copy_b = copy ? (double)((((int64_t)copy->valuedouble) + 4095) / 4096 * 4096) : 0;
        CHECK(over && copy && over->valuedouble <= 2 * copy_b + 2.0 * (double)MOE_STORE_GROUP_MAX + 1048576.0,
              "%s: store overhead %.2f MB <= 2 high copies (%.2f MB) + 2 x staging + 1 MiB", modes[mi],
              over ? over->valuedouble / 1e6 : 0, copy_b / 1e6);
        const double bound = (double)nonexpert + (double)budget + (over ? over->valuedouble : 0) + 32.0 * 1048576;
#ifndef __SANITIZE_ADDRESS__
        /* (AddressSanitizer's shadow memory and quarantine make RSS meaningless) */
        CHECK(rss && rss->valuedouble <= bound,
              "--io %s: peak RSS %.1f MB within non-expert %.1f + budget %.1f + overhead %.1f + 32 MiB", modes[mi],
              rss ? rss->valuedouble / 1e6 : 0, (double)nonexpert / 1e6, (double)budget / 1e6,
              over ? over->valuedouble / 1e6 : 0);
        CHECK(rss && rss->valuedouble < (double)experts, "--io %s: peak RSS %.1f MB below the experts' %.1f MB",
              modes[mi], rss ? rss->valuedouble / 1e6 : 0, (double)experts / 1e6);
        if (rss) printf("test-store: --io %s peak RSS %.1f MB (bound %.1f MB)\n", modes[mi], rss->valuedouble / 1e6,
                        bound / 1e6);
#endif
        cJSON_Delete(j);
    }
}

/* policy_guard: fitted HOBBIT weights that keep the wrong experts (pure
 * popularity, high for every expert of the first two MoE layers): the shadow
 * LRU misses less, so the store switches to LRU after 16 decode tokens, and
 * the logits stay those of the run without a budget (only which copies are
 * read changes); with the guard off the policy stays; with --policy hobbit
 * given there is no guard. Works on a copy of the bundle. */
static void policy_guard(const char *bundle) {
    char copy[1300];
    snprintf(copy, sizeof copy, "%s.guard.moeb", bundle);
    CHECK(moe_test_sh("cp '%s' '%s'", bundle, copy) == 0, "copy the bundle");
    const int L = 4, E = 8, LE = L * E;
    double fh[32], fl[32];
    for (int g = 0; g < LE; g++) fh[g] = g / E < 2 ? 1.0 : 0.0, fl[g] = 0;
    const double w[MOE_CACHE_N_WEIGHTS] = {0, 0, 0, 0, 1};
    struct moe_bundle *b = NULL;
    struct moe_bundle_kv *kv = NULL;
    CHECK(moe_bundle_open(copy, &b) == MOE_OK && moe_bundle_kv_new(&kv) == MOE_OK &&
              moe_bundle_kv_copy(kv, moe_bundle_tuning(b)) == MOE_OK &&
              moe_tuning_set_cache(kv, w, 0, 12, 0, "q8_0", "q2_k") == MOE_OK &&
              moe_tuning_set_cache_popularity(kv, fh, fl, (size_t)LE, 0.3) == MOE_OK,
          "tuning with bad weights");
    moe_bundle_free(b);
    CHECK(kv && moe_bundle_replace_tuning(copy, kv) == MOE_OK, "write them");
    moe_bundle_kv_free(kv);
    float *ref = malloc(sizeof(float) * 2 * (NP + ND) * 4096), *got = malloc(sizeof(float) * 2 * (NP + ND) * 4096);
    CHECK(ref && got && run(copy, NULL, ref, 0, NULL, NULL, NULL, NULL), "the run without a budget");
    for (int mode = 0; ref && got && mode < 3; mode++) { /* guard on, off, policy given */
        struct moe_store_params sp = moe_store_default_params();
        sp.dynamic = 0, sp.high_cap = 12, sp.low_cap = 0, sp.warm = 0;
        if (mode == 1) sp.guard = 0;
        if (mode == 2) sp.policy = MOE_CACHE_HOBBIT;
        struct moe_store_stats st;
        memset(&st, 0, sizeof st);
        const int ok = run(copy, &sp, got, 0, &st, NULL, NULL, NULL);
        const size_t V = 4096;
        CHECK(ok && !memcmp(ref, got, sizeof(float) * 2 * (NP + ND) * V), "guard mode %d: logits as without a budget",
              mode);
        if (mode == 0)
            CHECK(ok && st.guard_switch_token >= 16 && st.policy == MOE_CACHE_LRU &&
                      st.guard_shadow_penalty < 0.9 * st.guard_penalty,
                  "the guard switched to LRU at decode token %lld (penalty %.1f, shadow %.1f)",
                  (long long)st.guard_switch_token, st.guard_penalty, st.guard_shadow_penalty);
        else
            CHECK(ok && st.guard_switch_token == -1 && st.policy == MOE_CACHE_HOBBIT && st.guard_penalty == 0,
                  "guard mode %d: no guard, HOBBIT throughout (switch %lld)", mode, (long long)st.guard_switch_token);
    }
    free(ref), free(got);
    moe_test_sh("rm -f '%s'", copy);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: test-store moe-prep moe-run inflate-moe MODEL_DIR WORK_DIR\n");
        return 2;
    }
    prep = argv[1], moe_run = argv[2], inflate = argv[3], model_dir = argv[4], work = argv[5];
    char bundle[1200];
    snprintf(bundle, sizeof bundle, "%s/tiny.moeb", work);
    if (moe_test_sh("rm -rf '%s' && mkdir -p '%s'", work, work) != 0 ||
        moe_test_sh("'%s' quantize '%s' -o '%s' --experts q8_0,q2_k --dense q8_0 >/dev/null 2>&1", prep, model_dir, bundle)) {
        fprintf(stderr, "test-store: cannot quantize %s into %s\n", model_dir, work);
        return 1;
    }
    moe_log_set_level(MOE_LOG_ERROR);
    identical(bundle);
    same_as_simulator(bundle);
    too_small(bundle);
    thresholds(bundle);
    low_not_lower(bundle);
    size_classes(bundle);
    policy_guard(bundle);
    char text[1200];
    snprintf(text, sizeof text, "%s/heldout/c4.txt", model_dir);
    struct stat sb;
    if (stat(text, &sb) != 0) snprintf(text, sizeof text, "%s", MOE_FIXTURES "/demo/calibration.txt");
    prefetching(bundle, text);
    through_eval(bundle, text);
    cache_route(bundle); /* last: it writes a margin into the bundle's tuning */
    peak_memory();
    printf("test-store: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    if (!fails) moe_test_sh("rm -rf '%s'", work);
    return fails != 0;
}

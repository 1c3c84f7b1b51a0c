/*
 * test-mobile.c - MoBiLE big-little decoding (moe-session.h: little_k,
 * gamma) on the trained demo model quantized as test-store does (q8_0 and
 * q2_k experts, q8_0 dense):
 *   - gamma = 1 (every token falls back) gives the logits and greedy tokens
 *     of the plain top-K run bit for bit, without and with an expert budget;
 *   - gamma = 0 (never) gives those of the top-K2 run bit for bit: fed one
 *     token at a time from the start, and after a top-K prompt batch;
 *   - with a gamma between, each generated token's logits equal a fresh
 *     session's that replays the decisions (top-K or top-K2 per token, no
 *     rewinding), so the KV cache held exactly the accepted passes' keys and
 *     values; each decision agrees with the little pass's top probability;
 *   - with a budget (dynamic precision off) the same logits, and the big
 *     passes' prefetch from the little pass's router loads experts that are
 *     used (no loads with the prefetch off);
 *   - moe-run --little-k/--gamma: gamma 1 writes the plain run's logits, the
 *     stats JSON counts fallbacks, bad values are refused;
 *   - moe-prep eval --little-k/--gamma: gamma 1 scores the top-K
 *     distribution (KL ~ 0), gamma 0 the top-K2 one (KL > 0, fallback 0).
 * argv: moe-prep moe-run MODEL_DIR WORK_DIR.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "moe-mmap.h"
#include "moe-session.h"
#include "moe-test.h"

static const char *prep, *moe_run, *model_dir, *work;
static char bundle[1200];

#define NP 10 /* prompt tokens */
#define ND 16 /* generated tokens fed back */

/* One way of running the model. */
struct cfg {
    int little_k;            /* 0: plain passes */
    double gamma;
    int bl_prefetch;         /* -1: the default */
    int k_decode;            /* plain passes after the prompt: experts per token (0: K) */
    int one_by_one;          /* the prompt fed one token at a time */
    const struct moe_store_params *store;
};

/* A run's output: rows[i] the logits after the prompt (i = 0) and after fed
 * token i; tok[i] = argmax of row i (fed as token i + 1); fell[i]: row i
 * came from a big pass after a little one. */
struct out {
    float *rows;      /* [(ND + 1) x V] */
    int32_t tok[ND + 1];
    int fell[ND + 1];
    struct moe_big_little_stats bl;
    struct moe_store_stats st;
};

static int V, K;

static int argmax(const float *l) {
    int a = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[a]) a = i;
    return a;
}

/* top_prob: the little pass's confidence, computed as the session's
 * decision describes it (largest softmax probability, in double). */
static double top_prob(const float *l) {
    float mx = l[0];
    for (int i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)l[i] - mx);
    return 1.0 / s;
}

static void prompt_ids(int32_t *ids) {
    for (int i = 0; i < NP; i++) ids[i] = (int32_t)((37 * i + 11) % V);
}

/* load: the bundle at q8_0 (lazy when a store will read the experts). */
static struct moe_model *load(int lazy) {
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = "q8_0";
    mp.lazy_experts = lazy;
    struct moe_model *m = NULL;
    return moe_model_load(bundle, &mp, &m) == MOE_OK ? m : NULL;
}

/* generate: the prompt, then ND greedy tokens fed back, under c. */
static int generate(const struct cfg *c, struct out *o) {
    struct moe_model *m = load(c->store != NULL);
    struct moe_session *s = NULL;
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = 2;
    p.little_k = c->little_k, p.gamma = c->gamma, p.store = c->store;
    if (c->bl_prefetch >= 0) p.bl_prefetch_layers = c->bl_prefetch;
    int ok = m && moe_session_create(m, &p, &s) == MOE_OK;
    int32_t ids[NP];
    prompt_ids(ids);
    memset(o->fell, 0, sizeof o->fell);
    if (ok && c->one_by_one && c->k_decode) ok = moe_session_set_experts(s, c->k_decode) == MOE_OK;
    if (ok && c->one_by_one)
        for (int i = 0; ok && i < NP; i++) ok = moe_session_forward(s, ids + i, 1, o->rows, 0) == MOE_OK;
    else if (ok)
        ok = moe_session_forward(s, ids, NP, o->rows, 0) == MOE_OK;
    if (ok && c->k_decode) ok = moe_session_set_experts(s, c->k_decode) == MOE_OK;
    struct moe_big_little_stats b0, b1;
    for (int i = 0; ok && i <= ND; i++) {
        o->tok[i] = argmax(o->rows + (size_t)i * V);
        if (i == ND) break;
        moe_session_big_little_stats(s, &b0);
        ok = moe_session_forward(s, &o->tok[i], 1, o->rows + (size_t)(i + 1) * V, 0) == MOE_OK;
        moe_session_big_little_stats(s, &b1);
        o->fell[i + 1] = b1.fallbacks > b0.fallbacks;
    }
    if (ok) moe_session_big_little_stats(s, &o->bl);
    if (ok && moe_session_store(s)) moe_store_get_stats(moe_session_store(s), &o->st);
    moe_session_free(s);
    moe_model_free(m);
    return ok;
}

static int same_rows(const struct out *a, const struct out *b) {
    return !memcmp(a->rows, b->rows, sizeof(float) * (size_t)(ND + 1) * V) && !memcmp(a->tok, b->tok, sizeof a->tok);
}

/* small_store: a budget of 5 q8_0 copies, LRU, dynamic precision off (the
 * copies used are those of the run without a budget). */
static struct moe_store_params small_store(void) {
    struct moe_store_params sp = moe_store_default_params();
    sp.policy = MOE_CACHE_LRU, sp.dynamic = 0, sp.high_cap = 5, sp.low_cap = 0;
    return sp;
}

/* gamma_one: every token falls back: the plain top-K run. */
static void gamma_one(struct out *a, struct out *b) {
    struct moe_store_params sp = small_store();
    for (int budget = 0; budget < 2; budget++) {
        struct cfg plain = {0, 0, -1, 0, 0, budget ? &sp : NULL}, bl = {1, 1.0, -1, 0, 0, budget ? &sp : NULL};
        CHECK(generate(&plain, a) && generate(&bl, b), "gamma 1 runs%s", budget ? " (budget)" : "");
        CHECK(same_rows(a, b), "gamma 1 equals the top-K run bit for bit%s", budget ? " (budget)" : "");
        CHECK(b->bl.tokens == ND && b->bl.fallbacks == ND, "every token fell back (%lld of %lld)",
              (long long)b->bl.fallbacks, (long long)b->bl.tokens);
        if (budget) CHECK(b->st.prefetch_loads > 0, "the big passes prefetched (%lld loads)", (long long)b->st.prefetch_loads);
    }
}

/* gamma_zero: no token falls back: the top-K2 run. */
static void gamma_zero(struct out *a, struct out *b) {
    struct moe_store_params sp = small_store();
    for (int budget = 0; budget < 2; budget++)
        for (int obo = 0; obo < 2; obo++) {
            struct cfg k2 = {0, 0, -1, K / 2, obo, budget ? &sp : NULL}, bl = {K / 2, 0.0, -1, 0, obo, budget ? &sp : NULL};
            CHECK(generate(&k2, a) && generate(&bl, b), "gamma 0 runs");
            CHECK(same_rows(a, b), "gamma 0 equals the top-%d run bit for bit (%s prompt%s)", K / 2,
                  obo ? "one-token" : "batched top-K", budget ? ", budget" : "");
            CHECK(b->bl.fallbacks == 0 && b->bl.tokens == ND + (obo ? NP : 0), "no token fell back (%lld of %lld)",
                  (long long)b->bl.fallbacks, (long long)b->bl.tokens);
        }
}

/* replay: a fresh plain session fed the prompt (batch, top-K) and fed tokens
 * 1..i-1 with the experts their accepted pass used, then token i with k
 * experts: its logits into row. */
static int replay(struct moe_session *s, const struct out *o, int i, int k, float *row) {
    int32_t ids[NP];
    prompt_ids(ids);
    moe_session_reset(s);
    int ok = moe_session_set_experts(s, K) == MOE_OK && moe_session_forward(s, ids, NP, row, 0) == MOE_OK;
    for (int j = 1; ok && j < i; j++)
        ok = moe_session_set_experts(s, o->fell[j] ? K : K / 2) == MOE_OK &&
             moe_session_forward(s, &o->tok[j - 1], 1, row, 0) == MOE_OK;
    return ok && moe_session_set_experts(s, k) == MOE_OK && moe_session_forward(s, &o->tok[i - 1], 1, row, 0) == MOE_OK;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* mixed: a gamma with some fallbacks; the accepted logits against a replay
 * of the decisions. Returns the gamma used (the store check reuses it). */
static double mixed(struct out *a, struct out *b) {
    struct cfg little = {K / 2, 0.0, -1, 0, 0, NULL};
    CHECK(generate(&little, a), "gamma 0 probe");
    double p[ND];
    for (int i = 0; i < ND; i++) p[i] = top_prob(a->rows + (size_t)(i + 1) * V);
    qsort(p, ND, sizeof *p, cmp_double);
    static const int at[] = {ND / 2, ND / 3, 2 * ND / 3, ND / 4, 3 * ND / 4};
    double gamma = NAN;
    for (size_t q = 0; q < sizeof at / sizeof *at; q++) { /* midway between two probes: no tie with a token */
        if (p[at[q] - 1] == p[at[q]]) continue;
        gamma = 0.5 * (p[at[q] - 1] + p[at[q]]);
        struct cfg bl = {K / 2, gamma, -1, 0, 0, NULL};
        CHECK(generate(&bl, b), "gamma %g run", gamma);
        if (b->bl.fallbacks > 0 && b->bl.fallbacks < ND) break;
    }
    CHECK(b->bl.fallbacks > 0 && b->bl.fallbacks < ND, "gamma %g: a mix of accepted and fallen-back tokens (%lld of %d)",
          gamma, (long long)b->bl.fallbacks, ND);
    struct moe_model *m = load(0);
    struct moe_session *s = NULL;
    struct moe_session_params sp = moe_session_default_params();
    sp.n_threads = 2;
    CHECK(m && moe_session_create(m, &sp, &s) == MOE_OK, "reference session");
    float *row = malloc(sizeof(float) * (size_t)V);
    int n_little = 0, n_big = 0;
    for (int i = 1; s && row && i <= ND; i++) {
        const float *got = b->rows + (size_t)i * V;
        CHECK(replay(s, b, i, K / 2, row), "replay %d (little)", i);
        const int fall = top_prob(row) < gamma;
        CHECK(fall == b->fell[i], "token %d: little top probability %.6f against gamma %.6f, fell back %d", i,
              top_prob(row), gamma, b->fell[i]);
        if (!b->fell[i]) {
            CHECK(!memcmp(row, got, sizeof(float) * (size_t)V), "token %d: accepted little logits equal the replay", i);
            n_little++;
            continue;
        }
        CHECK(replay(s, b, i, K, row), "replay %d (big)", i);
        CHECK(!memcmp(row, got, sizeof(float) * (size_t)V), "token %d: the big pass's logits equal the replay", i);
        n_big++;
    }
    CHECK(n_little + n_big == ND && n_big == b->bl.fallbacks, "%d little + %d big tokens checked", n_little, n_big);
    CHECK(!memcmp(a->rows, b->rows, sizeof(float) * (size_t)V), "the prompt row is the top-K batch's");
    free(row);
    moe_session_free(s);
    moe_model_free(m);
    return gamma;
}

/* with_store: the mixed run through a budget: the same logits; the big
 * passes' prefetch loads experts that serve them, and nothing is
 * prefetched with it off. */
static void with_store(double gamma, struct out *a, struct out *b) {
    struct moe_store_params sp = small_store();
    struct cfg plain = {K / 2, gamma, -1, 0, 0, NULL}, on = {K / 2, gamma, 2, 0, 0, &sp}, off = {K / 2, gamma, 0, 0, 0, &sp};
    CHECK(generate(&plain, a) && generate(&on, b), "mixed runs with and without a budget");
    CHECK(same_rows(a, b), "a budget does not change big-little's logits");
    CHECK(b->st.prefetch_loads > 0 && b->st.prefetch_used > 0 && b->st.prefetch_used <= b->st.prefetch_loads,
          "big-pass prefetch: %lld loads, %lld used", (long long)b->st.prefetch_loads, (long long)b->st.prefetch_used);
    CHECK(generate(&off, b) && same_rows(a, b) && b->st.prefetch_loads == 0, "prefetch off: %lld loads",
          (long long)b->st.prefetch_loads);
}

static cJSON *read_json(const char *path) {
    char *text = NULL;
    size_t len = 0;
    cJSON *j = moe_read_file(path, 1 << 24, &text, &len) == MOE_OK ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static double jnum(const cJSON *o, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

/* cli: moe-run's options. */
static void cli(void) {
    const char *run = "-p 'The river rose through the night' -n 12 --ignore-eos --ids -t 2";
    CHECK(moe_test_sh("'%s' -m '%s' %s --logits-out '%s/a.f32' >/dev/null 2>&1", moe_run, bundle, run, work) == 0 &&
              moe_test_sh("'%s' -m '%s' %s --little-k %d --gamma 1 --logits-out '%s/b.f32' >/dev/null 2>&1", moe_run, bundle,
                 run, K / 2, work) == 0,
          "moe-run plain and --gamma 1");
    CHECK(moe_test_sh("cmp -s '%s/a.f32' '%s/b.f32'", work, work) == 0, "moe-run --gamma 1 writes the plain run's logits");
    CHECK(moe_test_sh("'%s' -m '%s' %s --gamma 0.05 --expert-mem 25%% --stats-json '%s/s.json' >/dev/null 2>&1", moe_run,
             bundle, run, work) == 0,
          "moe-run --gamma 0.05 --expert-mem 25%%");
    char path[1300];
    snprintf(path, sizeof path, "%s/s.json", work);
    cJSON *j = read_json(path);
    double t = jnum(j, "big_little", "tokens"), f = jnum(j, "big_little", "fallbacks");
    CHECK(t == 11 && f >= 0 && f <= t && fabs(jnum(j, "big_little", "fallback_ratio") - f / t) < 1e-8 &&
              jnum(j, "big_little", "little_k") == K / 2 && jnum(j, "store", "loads") > 0,
          "stats JSON: %g of %g tokens fell back", f, t);
    /* the store's read statistics (issue 31): every read counted once, times ordered */
    const double loads = jnum(j, "store", "loads"), mean = jnum(j, "store", "read_s_mean"),
                 mx = jnum(j, "store", "read_s_max");
    CHECK(jnum(j, "store", "reads_cancelled") >= 0 && jnum(j, "store", "reads_queued") == 0 && mean > 0 && mx >= mean &&
              jnum(j, "store", "read_bytes_per_s") > 0 && jnum(j, "store", "queue_depth_max") >= 1 &&
              jnum(j, "store", "load_bytes") >= loads * 4096,
          "stats JSON: %g reads, mean %g s, max %g s, queue depth %g", loads, mean, mx,
          jnum(j, "store", "queue_depth_max"));
    cJSON_Delete(j);
    CHECK(moe_test_sh("'%s' -m '%s' %s --gamma 1.5 >/dev/null 2>&1", moe_run, bundle, run) == 2, "--gamma 1.5 refused");
    CHECK(moe_test_sh("'%s' -m '%s' %s --little-k %d >/dev/null 2>&1", moe_run, bundle, run, K) == 1,
          "--little-k K refused (no smaller model)");
    CHECK(moe_test_sh("'%s' -m '%s' %s --gamma 0.5 --trace-out '%s/t.h5' >/dev/null 2>&1", moe_run, bundle, run, work) == 2,
          "--trace-out with big-little refused");
}

/* eval_bl: moe-prep eval scores the distribution big-little uses. */
static void eval_bl(const char *text) {
    char out[1300];
    snprintf(out, sizeof out, "%s/eval.json", work);
    cJSON *j[2] = {NULL, NULL};
    for (int g = 0; g < 2; g++) {
        CHECK(moe_test_sh("'%s' eval '%s' --ref '%s' --expert-precision q8_0 --dataset '%s' --ctx 64 --max-chunks 3 --json "
                 "--little-k %d --gamma %d >'%s' 2>/dev/null",
                 prep, bundle, bundle, text, K / 2, g, out) == 0,
              "eval --gamma %d", g);
        j[g] = read_json(out);
    }
    CHECK(jnum(j[1], "big_little", "fallback_ratio") == 1 && jnum(j[1], "kld", "mean") < 1e-6 &&
              jnum(j[1], "same_top", "value") == 1,
          "gamma 1 scores the top-K distribution (KL %g)", jnum(j[1], "kld", "mean"));
    CHECK(jnum(j[0], "big_little", "fallback_ratio") == 0 && jnum(j[0], "kld", "mean") > 1e-3,
          "gamma 0 scores the top-%d distribution (KL %g)", K / 2, jnum(j[0], "kld", "mean"));
    CHECK(jnum(j[0], "big_little", "tokens") == 3 * 63, "every position fed decided (%g; the last of a chunk is only "
          "a target)", jnum(j[0], "big_little", "tokens"));
    cJSON_Delete(j[0]);
    cJSON_Delete(j[1]);
    CHECK(moe_test_sh("'%s' eval '%s' --dataset '%s' --ctx 64 --gamma 0.5 --batch 8 >/dev/null 2>&1", prep, bundle, text) == 2,
          "eval --gamma with --batch 8 refused");
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: test-mobile moe-prep moe-run MODEL_DIR WORK_DIR\n");
        return 2;
    }
    prep = argv[1], moe_run = argv[2], model_dir = argv[3], work = argv[4];
    snprintf(bundle, sizeof bundle, "%s/tiny.moeb", work);
    if (moe_test_sh("rm -rf '%s' && mkdir -p '%s'", work, work) != 0 ||
        moe_test_sh("'%s' quantize '%s' -o '%s' --experts q8_0,q2_k --dense q8_0 >/dev/null 2>&1", prep, model_dir, bundle)) {
        fprintf(stderr, "test-mobile: cannot quantize %s into %s\n", model_dir, work);
        return 1;
    }
    moe_log_set_level(MOE_LOG_ERROR);
    struct moe_model *m = load(0);
    if (!m) {
        fprintf(stderr, "test-mobile: cannot load %s\n", bundle);
        return 1;
    }
    V = m->cfg.n_vocab, K = m->cfg.n_expert_used;
    moe_model_free(m);
    struct out a, b;
    a.rows = malloc(sizeof(float) * (size_t)(ND + 1) * V);
    b.rows = malloc(sizeof(float) * (size_t)(ND + 1) * V);
    if (!a.rows || !b.rows) return 1;
    gamma_one(&a, &b);
    gamma_zero(&a, &b);
    double gamma = mixed(&a, &b);
    with_store(gamma, &a, &b);
    cli();
    char text[1300];
    snprintf(text, sizeof text, "%s/heldout/c4.txt", model_dir);
    eval_bl(text);
    free(a.rows);
    free(b.rows);
    printf("test-mobile: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    if (!fails) moe_test_sh("rm -rf '%s'", work);
    return fails != 0;
}

/*
 * test-multiseq.c - several sequences in one session (moe-session.h: n_seq,
 * moe_session_forward_seq, moe_session_decode_batch) on the trained demo
 * model, resident (its bf16 checkpoint and a q8_0/q2_k bundle) and with an
 * expert budget (the bundle, an LRU store of 5 copies). "Equal" below is
 * bit for bit for the bundle (integer products) and within 1e-4 for the
 * bf16 checkpoint: the CPU backend's float path dots one token against the
 * stored bf16 row (moe_vec_dot) but converts the row to float once for
 * several tokens, a different summation order (prefill and decode of
 * moe_session_forward differ the same way).
 *   - five prompts of different lengths, each run alone through
 *     moe_session_forward (prompt, then greedy steps) are the reference;
 *   - four sequences prefilled with forward_seq and decoded together with
 *     decode_batch (all of them, or a subset, in shuffled row order; one
 *     sequence reset mid-way and given the fifth prompt while the others
 *     continue): every row's logits equal its sequence's reference row bit
 *     for bit and the greedy tokens are the same;
 *   - the same on a backend without attention_multi (the session's row-by-row
 *     fallback through kv_seq), with n_batch 2 (batches of up to 4 rows run
 *     as chunks of 2 and 1), and with big-little decoding (each row's step by
 *     itself); a backend without kv_seq refuses n_seq 2;
 *   - errors (n out of range, a repeated or out-of-range sequence, a bad
 *     token, an overflowing sequence) leave every sequence where it was, and
 *     the decoding continues with the reference's logits;
 *   - record_trace and the observers are refused with n_seq > 1; the KV
 *     cache is n_seq times one sequence's;
 *   - with the budget, the batched steps read fewer experts (store loads)
 *     than the same tokens run one sequence at a time;
 *   - every fixture model (tests/fixtures/models: grouped-query attention
 *     with 1 to 3 query heads per KV head, QK norms, sliding windows and
 *     sinks, DeepSeek's latent attention, Phi-MoE's longrope with a sequence
 *     crossing original_max_position_embeddings mid-batch): three sequences
 *     decoded together against each alone, bit for bit for f32 weights.
 * argv: moe-prep MODEL_DIR WORK_DIR.
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-session.h"
#include "moe-test.h"

#define NS 4    /* sequences of the session */
#define NP 5    /* prompts (the fifth replaces sequence 1 after a reset) */
#define ND 10   /* reference steps per prompt */
#define STEPS 9 /* decode_batch calls */

static const char *prep, *model_dir, *work;
static char bundle[1200];
static int V;

static const int plen[NP] = {7, 3, 12, 5, 9};

static void prompt(int i, int32_t *ids) {
    for (int j = 0; j < plen[i]; j++) ids[j] = (int32_t)((53 * j + 97 * i + 11) % V);
}

static int argmax(const float *l) {
    int a = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[a]) a = i;
    return a;
}

/* How a session is made: the model, an optional store, a test backend. */
struct src {
    const char *name;
    int bundle;                          /* 0: the checkpoint directory */
    const struct moe_store_params *store;
    moe_backend_new_fn backend_new;
    int exact;                           /* rows bit-identical to the runs alone (else within TOL) */
};

#define TOL 1e-4f

static struct moe_model *load(const struct src *c) {
    struct moe_model *m = NULL;
    if (!c->bundle) return moe_model_load_hf(model_dir, &m) == MOE_OK ? m : NULL;
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = "q8_0";
    mp.lazy_experts = c->store != NULL;
    return moe_model_load(bundle, &mp, &m) == MOE_OK ? m : NULL;
}

static int g_n_batch, g_little_k; /* session overrides (0: the defaults) */

static struct moe_session *make(const struct moe_model *m, const struct src *c, int n_seq, int n_ctx) {
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = 2, p.n_seq = n_seq, p.n_ctx = n_ctx, p.store = c->store, p.backend_new = c->backend_new;
    p.n_batch = g_n_batch, p.little_k = g_little_k, p.gamma = 0.5;
    struct moe_session *s = NULL;
    return moe_session_create(m, &p, &s) == MOE_OK ? s : NULL;
}

/* The reference: prompt i alone, then ND greedy steps; ref[i] holds
 * (ND + 1) logits rows (after the prompt, after each fed token) and tok[i]
 * the greedy tokens. */
static float *ref[NP];
static int32_t tok[NP][ND + 1];

static int reference(const struct moe_model *m, const struct src *c) {
    struct moe_session *s = make(m, c, 1, 64);
    int ok = s != NULL;
    for (int i = 0; ok && i < NP; i++) {
        int32_t ids[32];
        prompt(i, ids);
        moe_session_reset(s);
        ok = moe_session_forward(s, ids, plen[i], ref[i], 0) == MOE_OK;
        for (int j = 0; ok && j <= ND; j++) {
            tok[i][j] = argmax(ref[i] + (size_t)j * V);
            if (j < ND) ok = moe_session_forward(s, &tok[i][j], 1, ref[i] + (size_t)(j + 1) * V, 0) == MOE_OK;
        }
    }
    moe_session_free(s);
    return ok;
}

/* diff: max |a - b| over a row, and whether the bits are equal. */
static float diff(const float *a, const float *b, int *same) {
    float d = 0;
    for (int i = 0; i < V; i++) {
        const float e = fabsf(a[i] - b[i]);
        if (!(e <= d)) d = e;
    }
    *same = !memcmp(a, b, sizeof(float) * (size_t)V);
    return d;
}

/* A sequence slot: the prompt it runs and how many reference steps it has done. */
struct slot {
    int p, done;
};

/* prefill: sequence q starts prompt p (forward_seq), checked against the reference's first row. */
static int prefill(struct moe_session *s, int q, int p, struct slot *sl, float *lg, float *err, int *n_diff) {
    int32_t ids[32];
    prompt(p, ids);
    if (moe_session_forward_seq(s, q, ids, plen[p], lg, 0) != MOE_OK) return 0;
    int same;
    const float d = diff(lg, ref[p], &same);
    *err = d > *err ? d : *err, *n_diff += !same;
    sl[q] = (struct slot){p, 0};
    return moe_session_seq_pos(s, q) == plen[p];
}

/* batched: prefill NS sequences (in reverse order), then STEPS decode_batch
 * calls with rows in a rotating order, some steps leaving a sequence out;
 * after step 4 sequence 1 is reset and runs prompt 4. Every row against the
 * reference. Returns 1 when everything ran; *err / *n_diff: the largest
 * difference and the rows not bit-identical. */
static int batched(struct moe_session *s, float *err, int *n_diff, int *tok_diff) {
    struct slot sl[NS];
    float *lg = malloc(sizeof(float) * (size_t)V * NS);
    int ok = lg != NULL;
    *err = 0, *n_diff = 0, *tok_diff = 0;
    for (int q = NS - 1; ok && q >= 0; q--) ok = prefill(s, q, q, sl, lg, err, n_diff);
    for (int step = 0; ok && step < STEPS; step++) {
        if (step == 4) { /* a new request in sequence 1; the others keep their caches */
            moe_session_seq_reset(s, 1);
            ok = moe_session_seq_pos(s, 1) == 0 && moe_session_seq_pos(s, 0) == plen[0] + sl[0].done;
            ok = ok && prefill(s, 1, 4, sl, lg, err, n_diff);
        }
        int seqs[NS], n = 0;
        int32_t toks[NS];
        for (int r = 0; r < NS; r++) {
            const int q = (r + step) % NS;
            if (step % 3 == 2 && q == step % NS) continue; /* this one waits a step */
            if (sl[q].done >= ND) continue;
            seqs[n] = q, toks[n] = tok[sl[q].p][sl[q].done], n++;
        }
        int before[NS];
        for (int q = 0; q < NS; q++) before[q] = moe_session_seq_pos(s, q);
        ok = ok && moe_session_decode_batch(s, seqs, toks, n, lg) == MOE_OK;
        for (int i = 0; ok && i < n; i++) {
            struct slot *t = &sl[seqs[i]];
            t->done++;
            int same;
            const float d = diff(lg + (size_t)i * V, ref[t->p] + (size_t)t->done * V, &same);
            *err = d > *err ? d : *err, *n_diff += !same;
            *tok_diff += argmax(lg + (size_t)i * V) != tok[t->p][t->done];
        }
        for (int q = 0; ok && q < NS; q++) {
            int in = 0;
            for (int i = 0; i < n; i++) in |= seqs[i] == q;
            ok = moe_session_seq_pos(s, q) == before[q] + in;
        }
    }
    free(lg);
    return ok;
}

static void check_batched(const struct moe_model *m, const struct src *c) {
    struct moe_session *s = make(m, c, NS, 64);
    CHECK(s != NULL, "%s: a session of %d sequences", c->name, NS);
    if (!s) return;
    float err;
    int n_diff, tok_diff;
    CHECK(batched(s, &err, &n_diff, &tok_diff), "%s: the batched run", c->name);
    CHECK((c->exact ? n_diff == 0 : err <= TOL) && tok_diff == 0,
          "%s: %d rows differ from the sequences run alone (max |d| %g), %d tokens", c->name, n_diff, err, tok_diff);
    printf("  %-28s %d sequences, %d decode_batch steps: max |d| %.3g vs alone, %d rows not bit-identical, "
           "greedy %s\n", c->name, NS, STEPS, err, n_diff, tok_diff ? "DIFFERENT" : "identical");
    /* moe_session_forward is sequence 0 */
    moe_session_reset(s);
    int32_t ids[32];
    prompt(2, ids);
    float *lg = malloc(sizeof(float) * (size_t)V);
    int same = 0;
    CHECK(moe_session_forward(s, ids, plen[2], lg, 0) == MOE_OK && moe_session_seq_pos(s, 0) == plen[2] &&
              moe_session_pos(s) == plen[2] && moe_session_seq_pos(s, 1) == 0,
          "%s: moe_session_forward runs sequence 0", c->name);
    diff(lg, ref[2], &same); /* the same path as alone: the same bits */
    CHECK(same, "%s: moe_session_forward in a multi-sequence session gives the logits of one alone", c->name);
    free(lg);
    moe_session_free(s);
}

/* ---- error cases: the session is unchanged ---------------------------- */

static void quiet(enum moe_log_level l, const char *msg, void *u) {
    (void)l, (void)msg, (void)u;
}

static void check_errors(const struct moe_model *m, const struct src *c) {
    const int n_ctx = plen[2] + 3; /* sequence 2 (prompt 2) fills it after 3 steps */
    struct moe_session *s = make(m, c, 3, n_ctx);
    CHECK(s != NULL, "errors: session");
    if (!s) return;
    float *lg = malloc(sizeof(float) * (size_t)V * 3);
    struct slot sl[3];
    float err = 0;
    int nd = 0, ok = 1;
    for (int q = 0; q < 3; q++) ok &= prefill(s, q, q, sl, lg, &err, &nd);
    CHECK(ok && nd == 0, "errors: prefill");
    int pos0[3];
    for (int q = 0; q < 3; q++) pos0[q] = moe_session_seq_pos(s, q);
    moe_log_set(quiet, NULL);
    int32_t t3[3] = {tok[0][0], tok[1][0], tok[2][0]};
    const struct {
        int seqs[3], n;
        int32_t bad_tok;
        enum moe_status want;
        const char *what;
    } cases[] = {
        {{0, 1, 0}, 3, -1, MOE_ERR_INVALID, "a repeated sequence"},
        {{0, 3, 1}, 3, -1, MOE_ERR_INVALID, "a sequence past n_seq"},
        {{-1, 1, 2}, 3, -1, MOE_ERR_INVALID, "a negative sequence"},
        {{0, 1, 2}, 0, -1, MOE_ERR_INVALID, "no rows"},
        {{0, 1, 2}, 4, -1, MOE_ERR_INVALID, "more rows than sequences"},
        {{0, 1, 2}, 3, 1, MOE_ERR_INVALID, "an out-of-vocabulary token"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t t[4] = {t3[0], t3[1], t3[2], t3[0]};
        if (cases[i].bad_tok >= 0) t[cases[i].bad_tok] = V;
        int sq[4] = {cases[i].seqs[0], cases[i].seqs[1], cases[i].seqs[2], 0};
        CHECK(moe_session_decode_batch(s, sq, t, cases[i].n, lg) == cases[i].want, "errors: %s refused",
              cases[i].what);
        for (int q = 0; q < 3; q++)
            CHECK(moe_session_seq_pos(s, q) == pos0[q], "errors: %s moved sequence %d", cases[i].what, q);
    }
    CHECK(moe_session_forward_seq(s, 3, t3, 1, lg, 0) == MOE_ERR_INVALID &&
              moe_session_forward_seq(s, -1, t3, 1, lg, 0) == MOE_ERR_INVALID,
          "errors: forward_seq of an out-of-range sequence");
    CHECK(moe_session_seq_pos(s, 3) == -1 && moe_session_seq_pos(s, -1) == -1, "errors: seq_pos out of range");
    moe_session_seq_reset(s, 7); /* logged, ignored */
    moe_log_set(NULL, NULL);
    /* decode all three until sequence 2 is full; then a batch naming it overflows */
    int full = 0;
    for (int step = 0; step < 4 && !full; step++) {
        int sq[3] = {2, 0, 1};
        int32_t t[3];
        for (int i = 0; i < 3; i++) t[i] = tok[sl[sq[i]].p][sl[sq[i]].done];
        if (moe_session_seq_pos(s, 2) == n_ctx) {
            int before[3];
            for (int q = 0; q < 3; q++) before[q] = moe_session_seq_pos(s, q);
            moe_log_set(quiet, NULL);
            CHECK(moe_session_decode_batch(s, sq, t, 3, lg) == MOE_ERR_RANGE, "errors: overflow refused");
            moe_log_set(NULL, NULL);
            for (int q = 0; q < 3; q++)
                CHECK(moe_session_seq_pos(s, q) == before[q], "errors: the overflow moved sequence %d", q);
            full = 1;
            /* the others go on, with the reference's logits */
            CHECK(moe_session_decode_batch(s, sq + 1, t + 1, 2, lg) == MOE_OK, "errors: the others continue");
            for (int i = 0; i < 2; i++) {
                struct slot *x = &sl[sq[1 + i]];
                x->done++;
                int same;
                diff(lg + (size_t)i * V, ref[x->p] + (size_t)x->done * V, &same);
                CHECK(same, "errors: sequence %d after the refusals differs from its run alone", sq[1 + i]);
            }
            break;
        }
        CHECK(moe_session_decode_batch(s, sq, t, 3, lg) == MOE_OK, "errors: step %d", step);
        for (int i = 0; i < 3; i++) {
            struct slot *x = &sl[sq[i]];
            x->done++;
            int same;
            diff(lg + (size_t)i * V, ref[x->p] + (size_t)x->done * V, &same);
            CHECK(same, "errors: sequence %d step %d after the refusals differs from its run alone", sq[i], step);
        }
    }
    CHECK(full, "errors: sequence 2 filled its context");
    free(lg);
    moe_session_free(s);
}

/* ---- test backends: without attention_multi, without kv_seq ------------- */

static struct moe_backend_iface no_multi_iface, no_kv_iface;

static enum moe_status new_no_multi(const struct moe_model *m, const struct moe_backend_params *p, void *u,
                                    struct moe_backend **out) {
    (void)u;
    enum moe_status st = moe_backend_cpu_new(m, p, out);
    if (st) return st;
    no_multi_iface = *(*out)->iface; /* the CPU's members but attention_multi */
    no_multi_iface.attention_multi = NULL;
    (*out)->iface = &no_multi_iface;
    return MOE_OK;
}

static enum moe_status new_v4(const struct moe_model *m, const struct moe_backend_params *p, void *u,
                              struct moe_backend **out) {
    (void)u;
    enum moe_status st = moe_backend_cpu_new(m, p, out);
    if (st) return st;
    no_kv_iface = *(*out)->iface; /* a version-4 backend: one KV cache */
    no_kv_iface.version = 4;
    (*out)->iface = &no_kv_iface;
    return MOE_OK;
}

static void route_fn(const struct moe_route_event *ev, void *u) {
    (void)ev, (void)u;
}

static void check_create(const struct moe_model *m) {
    struct moe_session_params p = moe_session_default_params();
    struct moe_session *s = NULL;
    p.n_threads = 1, p.n_ctx = 32;
    CHECK(moe_session_create(m, &p, &s) == MOE_OK && moe_session_n_seq(s) == 1, "one sequence by default");
    const size_t one = s ? moe_session_kv_bytes(s) : 0;
    moe_session_free(s);
    p.n_seq = NS;
    CHECK(moe_session_create(m, &p, &s) == MOE_OK && moe_session_n_seq(s) == NS &&
              moe_session_kv_bytes(s) == one * NS && one > 0,
          "%d sequences: KV cache %zu bytes, %d x %zu", NS, s ? moe_session_kv_bytes(s) : 0, NS, one);
    moe_session_free(s);
    moe_log_set(quiet, NULL);
    p.record_trace = 1;
    CHECK(moe_session_create(m, &p, &s) == MOE_ERR_INVALID && !s, "record_trace refused with %d sequences", NS);
    p.record_trace = 0, p.on_route = route_fn;
    CHECK(moe_session_create(m, &p, &s) == MOE_ERR_INVALID && !s, "on_route refused with %d sequences", NS);
    p.on_route = NULL, p.n_seq = -1;
    CHECK(moe_session_create(m, &p, &s) == MOE_ERR_INVALID && !s, "n_seq -1 refused");
    p.n_seq = 2, p.backend_new = new_v4;
    CHECK(moe_session_create(m, &p, &s) == MOE_ERR_UNSUPPORTED && !s, "a backend without kv_seq refuses 2 sequences");
    moe_log_set(NULL, NULL);
    p.n_seq = 1;
    CHECK(moe_session_create(m, &p, &s) == MOE_OK, "a backend without kv_seq runs one sequence");
    moe_session_free(s);
}

/* ---- with a budget: fewer expert reads batched than one at a time -------- */

/* decode_loads: prefill NS sequences, then ND - 1 steps of all of them,
 * batched or one sequence at a time (same order); the store's loads and
 * accesses during the decode steps. */
static int decode_loads(const struct moe_model *m, const struct src *c, int batch, int64_t *loads, int64_t *acc) {
    struct moe_session *s = make(m, c, NS, 64);
    float *lg = malloc(sizeof(float) * (size_t)V * NS);
    struct slot sl[NS];
    float err = 0;
    int nd = 0, ok = s && lg;
    for (int q = 0; ok && q < NS; q++) ok = prefill(s, q, q, sl, lg, &err, &nd);
    struct moe_store_stats a, b;
    if (ok) moe_store_get_stats(moe_session_store(s), &a);
    for (int step = 0; ok && step + 1 < ND; step++) {
        int seqs[NS];
        int32_t t[NS];
        for (int q = 0; q < NS; q++) seqs[q] = q, t[q] = tok[q][step];
        if (batch) ok = moe_session_decode_batch(s, seqs, t, NS, lg) == MOE_OK;
        for (int q = 0; !batch && ok && q < NS; q++)
            ok = moe_session_forward_seq(s, q, t + q, 1, lg + (size_t)q * V, 0) == MOE_OK;
        for (int q = 0; ok && q < NS; q++) {
            int same;
            diff(lg + (size_t)q * V, ref[q] + (size_t)(step + 1) * V, &same);
            nd += !same;
        }
    }
    if (ok) moe_store_get_stats(moe_session_store(s), &b);
    if (ok) *loads = b.loads - a.loads, *acc = b.accesses - a.accesses;
    free(lg);
    moe_session_free(s);
    return ok && nd == 0;
}

static void check_loads(const struct moe_model *m, const struct src *c) {
    int64_t lb = 0, ls = 0, ab = 0, as = 0;
    CHECK(decode_loads(m, c, 1, &lb, &ab), "%s: batched decode", c->name);
    CHECK(decode_loads(m, c, 0, &ls, &as), "%s: one sequence at a time", c->name);
    CHECK(lb < ls && ab < as, "%s: batched %lld loads (%lld accesses), one at a time %lld (%lld)", c->name,
          (long long)lb, (long long)ab, (long long)ls, (long long)as);
    printf("  %-28s %d sequences x %d steps: %lld expert loads batched (%lld accesses), %lld one at a time (%lld)\n",
           c->name, NS, ND - 1, (long long)lb, (long long)ab, (long long)ls, (long long)as);
}

/* ---- every fixture architecture ------------------------------------------ */

#define FS 3  /* sequences */
#define FD 8  /* decode steps */

/* check_fixture: FS prompts (lengths 13, 5, 9: with FD steps the first
 * crosses Phi-MoE's original context of 16 and the windows of 6 and 8) run
 * alone, then together; rows compared (exact for f32 weights). */
static void check_fixture(const char *dir, const char *name) {
    struct moe_model *m = NULL;
    if (moe_model_load_hf(dir, &m) != MOE_OK) {
        CHECK(0, "%s: load", name);
        return;
    }
    V = m->cfg.n_vocab;
    const int exact = strstr(name, "-f32") != NULL;
    static const int fl[FS] = {13, 5, 9};
    int32_t ids[FS][32], toks[FS][FD + 1];
    float *alone = malloc(sizeof(float) * (size_t)V * FS * (FD + 1)), *lg = malloc(sizeof(float) * (size_t)V * FS);
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = 2, p.n_ctx = 40;
    struct moe_session *s = NULL;
    int ok = moe_session_create(m, &p, &s) == MOE_OK;
    for (int q = 0; q < FS; q++)
        for (int j = 0; j < fl[q]; j++) ids[q][j] = (int32_t)((31 * j + 7 * q + 3) % V);
    for (int q = 0; ok && q < FS; q++) { /* alone: the prompt, then FD one-token steps */
        float *row = alone + (size_t)q * (FD + 1) * V;
        moe_session_reset(s);
        ok = moe_session_forward(s, ids[q], fl[q], row, 0) == MOE_OK;
        for (int j = 0; ok && j < FD; j++) {
            toks[q][j] = argmax(row + (size_t)j * V);
            ok = moe_session_forward(s, &toks[q][j], 1, row + (size_t)(j + 1) * V, 0) == MOE_OK;
        }
    }
    moe_session_free(s);
    s = NULL;
    p.n_seq = FS;
    ok = ok && moe_session_create(m, &p, &s) == MOE_OK;
    float err = 0;
    int n_diff = 0;
    for (int q = 0; ok && q < FS; q++) {
        ok = moe_session_forward_seq(s, q, ids[q], fl[q], lg, 0) == MOE_OK;
        int same;
        const float d = diff(lg, alone + (size_t)q * (FD + 1) * V, &same);
        err = d > err ? d : err, n_diff += !same;
    }
    for (int j = 0; ok && j < FD; j++) {
        int seqs[FS];
        int32_t t[FS];
        for (int r = 0; r < FS; r++) seqs[r] = (r + j) % FS, t[r] = toks[seqs[r]][j];
        ok = moe_session_decode_batch(s, seqs, t, FS, lg) == MOE_OK;
        for (int r = 0; ok && r < FS; r++) {
            int same;
            const float d = diff(lg + (size_t)r * V, alone + ((size_t)seqs[r] * (FD + 1) + (size_t)j + 1) * V, &same);
            err = d > err ? d : err, n_diff += !same;
        }
    }
    CHECK(ok, "%s: the runs", name);
    CHECK(exact ? n_diff == 0 : err <= TOL, "%s: batched rows against alone: max |d| %g, %d not bit-identical", name,
          err, n_diff);
    printf("  %-28s %d sequences x %d steps: max |d| %.3g, %d of %d rows not bit-identical\n", name, FS, FD, err,
           n_diff, FS * (FD + 1));
    moe_session_free(s);
    free(alone);
    free(lg);
    moe_model_free(m);
}

static void check_fixtures(void) {
    char root[1100];
    snprintf(root, sizeof root, "%s/models", MOE_FIXTURES);
    DIR *d = opendir(root);
    CHECK(d != NULL, "%s: cannot list", root);
    if (!d) return;
    char names[64][256];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 64;)
        if (e->d_name[0] != '.') snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    for (int i = 0; i < n; i++) {
        char dir[1400 + 256];
        snprintf(dir, sizeof dir, "%.1099s/%.255s", root, names[i]);
        check_fixture(dir, names[i]);
    }
}

/* check_truncate: sequence 1 runs prompt 2 and three tokens it will take
 * back; truncated to the prompt, the reference's greedy tokens then give the
 * reference's rows (bit for bit where c->exact), while sequence 0 keeps its
 * own; bad calls are refused and change nothing. */
static void check_truncate(const struct moe_model *m, const struct src *c) {
    struct moe_session *s = make(m, c, 2, 64);
    CHECK(s != NULL, "%s: truncate: session", c->name);
    if (!s) return;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t ids[32], junk[3] = {5, 17, 29};
    prompt(2, ids);
    int ok = moe_session_forward_seq(s, 0, ids, 4, lg, 0) == MOE_OK &&
             moe_session_forward_seq(s, 1, ids, plen[2], lg, 0) == MOE_OK &&
             moe_session_forward_seq(s, 1, junk, 3, lg, 0) == MOE_OK;
    CHECK(ok && moe_session_seq_pos(s, 1) == plen[2] + 3, "%s: truncate: the runs before", c->name);
    CHECK(moe_session_seq_truncate(s, 1, plen[2] + 4) == MOE_ERR_INVALID &&
              moe_session_seq_truncate(s, 1, -1) == MOE_ERR_INVALID &&
              moe_session_seq_truncate(s, 2, 0) == MOE_ERR_INVALID && moe_session_seq_pos(s, 1) == plen[2] + 3,
          "%s: truncate: past the end, negative and out-of-range refused, nothing changed", c->name);
    CHECK(moe_session_seq_truncate(s, 1, plen[2]) == MOE_OK && moe_session_seq_pos(s, 1) == plen[2] &&
              moe_session_seq_pos(s, 0) == 4,
          "%s: truncate: sequence 1 back to its prompt, sequence 0 untouched", c->name);
    float err = 0;
    int n_diff = 0;
    for (int j = 0; ok && j < 4; j++) {
        ok = moe_session_forward_seq(s, 1, &tok[2][j], 1, lg, 0) == MOE_OK;
        int same;
        const float d = diff(lg, ref[2] + (size_t)(j + 1) * V, &same);
        err = d > err ? d : err, n_diff += !same;
    }
    CHECK(ok && (c->exact ? n_diff == 0 : err <= TOL),
          "%s: truncate: the steps after it against the reference: max |d| %g, %d rows not bit-identical", c->name,
          err, n_diff);
    free(lg);
    moe_session_free(s);
}

static void run_src(const struct src *c) {
    struct moe_model *m = load(c);
    CHECK(m != NULL, "%s: load", c->name);
    if (!m) return;
    V = m->cfg.n_vocab;
    for (int i = 0; i < NP; i++) ref[i] = malloc(sizeof(float) * (size_t)(ND + 1) * V);
    /* the reference runs without a store (the store gives the same bits: test-store) */
    struct src plain = *c;
    plain.store = NULL, plain.backend_new = NULL;
    struct moe_model *mr = c->store ? load(&plain) : m;
    CHECK(mr && reference(mr, &plain), "%s: reference runs", c->name);
    if (mr != m) moe_model_free(mr);
    check_batched(m, c);
    if (c->exact && !c->store && !c->backend_new) {
        check_errors(m, c);
        g_n_batch = 2; /* decode batches in chunks of n_batch */
        struct src c2 = *c;
        c2.name = "bundle, n_batch 2";
        check_batched(m, &c2);
        g_n_batch = 0;
    }
    if (c->store) check_loads(m, c);
    if (!c->backend_new) check_truncate(m, c);
    for (int i = 0; i < NP; i++) free(ref[i]);
    moe_model_free(m);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: test-multiseq moe-prep MODEL_DIR WORK_DIR\n");
        return 2;
    }
    prep = argv[1], model_dir = argv[2], work = argv[3];
    snprintf(bundle, sizeof bundle, "%s/tiny.moeb", work);
    if (moe_test_sh("rm -rf '%s' && mkdir -p '%s'", work, work) != 0 ||
        moe_test_sh("'%s' quantize '%s' -o '%s' --experts q8_0,q2_k --dense q8_0 >/dev/null 2>&1", prep, model_dir,
                    bundle)) {
        fprintf(stderr, "test-multiseq: cannot quantize %s into %s\n", model_dir, work);
        return 1;
    }
    moe_log_set_level(MOE_LOG_ERROR);
    struct moe_store_params sp = moe_store_default_params();
    sp.policy = MOE_CACHE_LRU, sp.dynamic = 0, sp.high_cap = 5, sp.low_cap = 0;
    const struct src srcs[] = {
        {"checkpoint (bf16)", 0, NULL, NULL, 0},
        {"bundle (q8_0 experts)", 1, NULL, NULL, 1},
        {"bundle, no attention_multi", 1, NULL, new_no_multi, 1},
        {"bundle, store of 5 copies", 1, &sp, NULL, 1},
    };
    {
        struct src c = srcs[0];
        struct moe_model *m = load(&c);
        CHECK(m != NULL, "load");
        if (m) check_create(m);
        moe_model_free(m);
    }
    for (size_t i = 0; i < sizeof srcs / sizeof srcs[0]; i++) run_src(&srcs[i]);
    g_little_k = 1; /* big-little (gamma 0.5): the reference and the batch both decide per token */
    const struct src bl = {"bundle, big-little", 1, NULL, NULL, 1};
    run_src(&bl);
    g_little_k = 0;
    check_fixtures();
    printf("test-multiseq: %d checks, %d failed\n", checks, fails);
    return fails != 0;
}

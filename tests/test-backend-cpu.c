/*
 * test-backend-cpu.c - the CPU backend's integer path (8-bit activations
 * against quantized weights) on the trained demo model, quantized with
 * --experts q8_0,q4_k --dense q8_0 (every matrix then has integer kernels):
 *   - logits of a 64-token prefill and 8 decoded tokens are bit-identical
 *     with 1 and 2 threads and with prompt chunks of 64 and 7 tokens (each
 *     output row's dot products do not depend on how rows and tokens are
 *     split between threads and tiles);
 *   - a context of 69 positions filled to its end (the attention keeps keys
 *     in blocks of 8 positions: its last block is 5 wide) gives the same
 *     logits as a context of 128;
 *   - the integer path is the one that runs: with MOE_CPU_INT=0 (float
 *     activations, the previous path) the logits differ;
 *   - it stays close: its KL divergence from the unquantized (BF16)
 *     checkpoint's logits is within the bound stated in compare() of the
 *     float path's, and the argmax agrees with the float path at (nearly)
 *     every position;
 *   - moe_model_repack (q4_k interleaved by 16 rows for the VNNI kernels)
 *     keeps all of this: see repacked().
 * argv[1] = moe-prep, argv[2] = the demo model directory.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapt-impl.h"
#include "moe-backend.h"
#include "moe-mmap.h"
#include "moe-quant.h"
#include "moe-session.h"
#include "moe-test.h"
#include "moe-tokenizer.h"

#define N_PROMPT 64
#define N_GEN 8

static char tmpdir[64] = "/tmp/test-backend-cpu-XXXXXX";

/* run: prefill N_PROMPT tokens of `ids` in chunks of `batch`, then feed the
 * next N_GEN one by one through the KV cache (the same tokens for every
 * run, so that rows compare); logits [(N_PROMPT + N_GEN) x V]. */
/* Expert outputs of a run by (layer, expert, position), when g_eo is set
 * (the 8-bit quantization of later products' inputs can hide last-bit
 * changes from the logits; the expert outputs show them). */
static float *g_eo;
static int g_eo_experts, g_eo_embd;
static void capture(const struct moe_expert_event *ev, void *user) {
    (void)user;
    for (int i = 0; i < ev->n; i++) {
        const size_t at = (((size_t)ev->layer * g_eo_experts + ev->expert) * (N_PROMPT + N_GEN) + ev->pos0 + ev->tokens[i]);
        memcpy(g_eo + at * g_eo_embd, ev->outputs + (size_t)i * g_eo_embd, sizeof(float) * g_eo_embd);
    }
}

/* run_ctx: a context of ctx, a prompt of n_prompt, an expert store if
 * `store` is set (NULL: every expert resident). */
static int run_ctx(struct moe_model *m, const int32_t *ids, int threads, int batch, int ctx, int n_prompt,
                   float *logits, struct moe_store_params *store) {
    struct moe_session_params sp = moe_session_default_params();
    sp.store = store;
    if (g_eo) sp.on_expert = capture;
    sp.n_ctx = ctx;
    sp.n_batch = batch;
    sp.n_threads = threads;
    struct moe_session *s = NULL;
    if (moe_session_create(m, &sp, &s) != MOE_OK) return 0;
    const int V = m->cfg.n_vocab;
    int ok = moe_session_forward(s, ids, n_prompt, logits, 1) == MOE_OK;
    for (int i = 0; ok && i < N_GEN; i++)
        ok = moe_session_forward(s, &ids[n_prompt + i], 1, logits + (size_t)(n_prompt + i) * V, 0) == MOE_OK;
    moe_session_free(s);
    return ok;
}
/* run: run_ctx with a context of 128 and a prompt of N_PROMPT, no store. */
static int run(struct moe_model *m, const int32_t *ids, int threads, int batch, float *logits) {
    return run_ctx(m, ids, threads, batch, 128, N_PROMPT, logits, NULL);
}
/* run_store: the same through an expert store with params sp. */
static int run_store(struct moe_model *m, const int32_t *ids, int threads, int batch, float *logits,
                     struct moe_store_params *sp) {
    return run_ctx(m, ids, threads, batch, 128, N_PROMPT, logits, sp);
}

/* mean_kl: mean over rows of KL(softmax(p) || softmax(q)). */
static double mean_kl(const float *p, const float *q, int V) {
    const int rows = N_PROMPT + N_GEN;
    double kl = 0;
    for (int r = 0; r < rows; r++) {
        const float *x = p + (size_t)r * V, *y = q + (size_t)r * V;
        double mx = x[0], my = y[0], zx = 0, zy = 0;
        for (int v = 1; v < V; v++) mx = fmax(mx, x[v]), my = fmax(my, y[v]);
        for (int v = 0; v < V; v++) zx += exp(x[v] - mx), zy += exp(y[v] - my);
        for (int v = 0; v < V; v++) {
            const double lx = x[v] - mx - log(zx), ly = y[v] - my - log(zy);
            kl += exp(lx) * (lx - ly);
        }
    }
    return kl / rows;
}

/* same_argmax: rows whose largest logit is at the same index in a and b. */
static int same_argmax(const float *a, const float *b, int V) {
    int same = 0;
    for (int r = 0; r < N_PROMPT + N_GEN; r++) {
        const float *x = a + (size_t)r * V, *y = b + (size_t)r * V;
        int ax = 0, ay = 0;
        for (int v = 1; v < V; v++) {
            if (x[v] > x[ax]) ax = v;
            if (y[v] > y[ay]) ay = v;
        }
        same += ax == ay;
    }
    return same;
}

/* compare: the integer path (in) and the float path (fl) of one precision
 * against the unquantized checkpoint's logits (ref). */
static void compare(const char *prec, const float *in, const float *fl, const float *ref, int V) {
    const int rows = N_PROMPT + N_GEN;
    const double kl_in = mean_kl(ref, in, V), kl_fl = mean_kl(ref, fl, V), kl_if = mean_kl(fl, in, V);
    const int agree = same_argmax(in, fl, V);
    printf("  %s: mean KL to the BF16 checkpoint: integer path %.3g, float path %.3g; integer vs float %.3g, "
           "same argmax %d/%d\n", prec, kl_in, kl_fl, kl_if, agree, rows);
    CHECK(memcmp(in, fl, (size_t)rows * V * sizeof *in) != 0,
          "%s: MOE_CPU_INT=0 gives the same logits: is the integer path used at all?", prec);
    /* Bound. The 8-bit activations add about 0.6 % (q8_0 blocks) to 0.8 %
     * (q8_k) rms error to each dot product (moe-quant.h), comparable to the
     * weight quantization of q8_0 (0.6 %) and small against q4_k's (7.9 %).
     * Measured here (AVX-512 VNNI, AVX2 and scalar kernels alike): KL to the
     * checkpoint 2.0e-4 (integer) against 6.9e-5 (float) at q8_0, 3.4e-3
     * against 2.7e-3 at q4_k; argmax equal to the float path's at 72/72
     * positions. (llama.cpp quantizes activations the same way.) Bounds: the
     * integer path's KL at most 4 x the float path's + 2e-4, argmax equal at
     * 68 of 72 positions. */
    CHECK(kl_in <= 4 * kl_fl + 2e-4, "%s: integer path KL %.3g against the float path's %.3g", prec, kl_in, kl_fl);
    CHECK(agree >= rows - 4, "%s: argmax differs at %d of %d positions", prec, rows - agree, rows);
}

/* per_expert: run with an expert observer, which makes the session call
 * expert() once per expert instead of expert_batch. */
static int per_expert(struct moe_model *m, const int32_t *ids, int threads, int batch, float *logits) {
    const size_t neo = (size_t)m->cfg.n_layer * m->cfg.n_expert * (N_PROMPT + N_GEN) * m->cfg.n_embd;
    g_eo_experts = m->cfg.n_expert, g_eo_embd = (int)m->cfg.n_embd;
    g_eo = calloc(neo, sizeof *g_eo);
    const int ok = g_eo && run(m, ids, threads, batch, logits);
    free(g_eo);
    g_eo = NULL;
    return ok;
}

/* batched: the CPU backend's expert_batch (a layer's experts in shared
 * parallel loops) gives the bits of expert() per expert: with 1 and 2
 * threads, with chunks of 7 (every expert's rows in the shared loops) and 64
 * (some experts take the token split), and with the experts of one layer at
 * different precisions if `mix` (a batch mixes types and activation
 * formats; not after moe_model_repack, as a switch binds the stored rows).
 * a and b: scratch logits. */
static void batched(struct moe_model *m, const int32_t *ids, float *a, float *b, int mix) {
    const size_t n = (size_t)(N_PROMPT + N_GEN) * m->cfg.n_vocab;
    for (int mixed = 0; mixed <= mix; mixed++) {
        /* (the bundle stores two precisions: odd experts take the other one) */
        for (int l = 0; mixed && l < m->cfg.n_layer; l++)
            for (int e = 1; e < m->cfg.n_expert; e += 2)
                CHECK(moe_model_set_expert_precision(m, l, e, 1 - moe_model_get_expert_precision(m, l, e)) == MOE_OK,
                      "expert %d.%d at the other precision", l, e);
        for (int t = 1; t <= 2; t++)
            for (int batch = 7; batch <= 64; batch += 57) {
                CHECK(run(m, ids, t, batch, a) && per_expert(m, ids, t, batch, b), "batched runs");
                CHECK(memcmp(a, b, n * sizeof *a) == 0,
                      "expert_batch and expert() per expert give different logits (%d threads, chunks of %d%s)", t,
                      batch, mixed ? ", mixed precisions" : "");
            }
        for (int l = 0; mixed && l < m->cfg.n_layer; l++)
            for (int e = 1; e < m->cfg.n_expert; e += 2)
                CHECK(moe_model_set_expert_precision(m, l, e, 1 - moe_model_get_expert_precision(m, l, e)) == MOE_OK,
                      "expert %d.%d back", l, e);
    }
}

/* adapt_state: the decode-mode chooser of a session with `threads` threads
 * after a prompt and n_dec decode steps (logits wanted or not). */
static struct moe_adapt adapt_state(struct moe_model *m, const int32_t *ids, int threads, int n_dec, int logits_wanted) {
    struct moe_adapt a;
    memset(&a, 0, sizeof a);
    a.state = MOE_ADAPT_WARMUP;
    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = 128, sp.n_threads = threads;
    struct moe_session *s = NULL;
    float *lg = malloc(sizeof *lg * (size_t)m->cfg.n_vocab);
    int ok = lg && moe_session_create(m, &sp, &s) == MOE_OK && moe_session_forward(s, ids, 8, lg, 0) == MOE_OK;
    for (int i = 0; ok && i < n_dec; i++) ok = moe_session_forward(s, &ids[8 + i], 1, logits_wanted ? lg : NULL, 0) == MOE_OK;
    CHECK(ok, "adapt runs (%d threads)", threads);
    const struct moe_adapt *p = s ? moe_backend_cpu_adapt(moe_session_backend(s)) : NULL;
    CHECK(p != NULL, "a CPU backend has a decode-mode chooser");
    if (p) a = *p;
    moe_session_free(s);
    free(lg);
    return a;
}

/* adapt_wiring: the CPU backend feeds its decode steps to moe-adapt.h
 * (test-adapt tests the decisions): with 2 threads, 40 decode steps leave
 * the warm-up and report every measured step (embedding to logits), ending
 * in a steady run, or off if the warm-up's step was slow (a loaded machine,
 * a sanitizer build); steps whose logits nobody wants turn it off; 1
 * thread and MOE_CPU_ADAPT=0 never measure. */
static void adapt_wiring(struct moe_model *m, const int32_t *ids) {
    struct moe_adapt a = adapt_state(m, ids, 2, 40, 1);
    CHECK(a.state == MOE_ADAPT_STEADY || (a.state == MOE_ADAPT_OFF && a.choice < 0),
          "2 threads, 40 steps: state %d, choice %d", a.state, a.choice);
    CHECK(a.dropped == 0, "2 threads: %d measured steps never reported", a.dropped);
    a = adapt_state(m, ids, 2, 40, 0);
    CHECK(a.state == MOE_ADAPT_OFF && a.choice < 0 && a.dropped > MOE_ADAPT_SAMPLES,
          "2 threads, no logits: state %d (want off), %d unreported", a.state, a.dropped);
    a = adapt_state(m, ids, 1, 40, 1);
    CHECK(a.state == MOE_ADAPT_OFF && a.choice < 0, "1 thread measures (state %d)", a.state);
    setenv("MOE_CPU_ADAPT", "0", 1);
    a = adapt_state(m, ids, 2, 40, 1);
    unsetenv("MOE_CPU_ADAPT");
    CHECK(a.state == MOE_ADAPT_OFF && a.choice < 0, "MOE_CPU_ADAPT=0 measures (state %d)", a.state);
}

/* repacked: the model after moe_model_repack (the CPU's interleaved
 * layouts, moe-quant.h) against the same model before (li: integer path, lf:
 * float path): split-independent bits again; the float path reads the same
 * weights back (KL below 1e-6: only its one-token products change kernel).
 * The integer path's kernels differ from the stored rows' only in float
 * rounding, but the logits are not smooth in that: a last-bit change can
 * flip the 8-bit rounding of a later product's input, or a near-tie in the
 * router (measured here: layer 3 at 2 of 72 positions, logits up to 1.2
 * apart there). So the bound is on quality, as for the integer path in
 * compare(): KL to the BF16 checkpoint (ref) at most 1.25 x the stored
 * layout's + 1e-4, the argmax the stored layout's at 70 of 72 positions.
 * Where nothing is repacked (the scalar kernels) the logits must be the same
 * bits. */
static void repacked(struct moe_model *m, const char *prec, const char *bundle, const int32_t *ids, const float *li,
                     const float *lf, const float *ref, int V) {
    const int rows = N_PROMPT + N_GEN;
    const size_t n = (size_t)rows * V;
    size_t bytes = 0;
    int ml = 0;
    while (ml < m->cfg.n_layer && !m->cfg.layer_moe[ml]) ml++;
    struct moe_ffn f0;
    CHECK(moe_model_expert(m, ml, 0, -1, &f0) == MOE_OK, "expert view");
    /* whether this CPU's kernels take the experts' type in a layout (q4_k: AVX2
     * or AVX-512; q8_0: AVX-512 VNNI). The dense matrices are q8_0, which only
     * VNNI packs, and VNNI packs both expert types: so nothing at all is
     * repacked exactly when the experts are not. */
    const int packs = moe_repack_type(f0.gate.type, f0.gate.n_out, f0.gate.n_in) != f0.gate.type;
    CHECK(moe_model_repack(m, 1, &bytes) == MOE_OK, "moe_model_repack");
    CHECK(packs ? bytes > 0 : bytes == 0, "%s: repacked %zu bytes under %s", prec, bytes, moe_quant_int_isa_name());
    float *r1 = calloc(n, sizeof *r1), *r2 = calloc(n, sizeof *r2), *r3 = calloc(n, sizeof *r3), *rf = calloc(n, sizeof *rf);
    if (r1 && r2 && r3 && rf) {
        CHECK(run(m, ids, 1, 64, r1) && run(m, ids, 2, 64, r2) && run(m, ids, 2, 7, r3), "repacked runs");
        CHECK(memcmp(r1, r2, n * sizeof *r1) == 0, "repacked: 1 and 2 threads give different logits");
        CHECK(memcmp(r2, r3, n * sizeof *r2) == 0, "repacked: chunks of 64 and 7 give different logits");
        batched(m, ids, r2, r3, 0); /* (loops over 16-row groups) */
        setenv("MOE_CPU_INT", "0", 1);
        CHECK(run(m, ids, 2, 64, rf), "repacked float run");
        unsetenv("MOE_CPU_INT");
        const double kl = mean_kl(li, r1, V), klf = mean_kl(lf, rf, V);
        const int agree = same_argmax(li, r1, V);
        double dmax = 0;
        for (size_t i = 0; i < n; i++) dmax = fmax(dmax, fabs((double)li[i] - r1[i]));
        printf("  %s repacked (%.2f MB): KL to the checkpoint %.3g (stored layout %.3g); to the stored layout's "
               "logits %.3g (largest difference %.3g), same argmax %d/%d; float path KL %.3g\n", prec,
               (double)bytes / 1e6, mean_kl(ref, r1, V), mean_kl(ref, li, V), kl, dmax, agree, rows, klf);
        CHECK(klf < 1e-6, "repacked: the float path reads different weights (KL %.3g)", klf);
        if (bytes == 0) CHECK(memcmp(r1, li, n * sizeof *r1) == 0, "nothing repacked, yet the logits moved");
        /* the expert store repacks the copies it reads (params.repack): with every
         * expert kept, and with 5 copies kept (misses read again), the logits and
         * every expert output are those of the resident repacked model, bit for
         * bit, and (VNNI) the expert outputs differ from the stored layout's */
        const size_t neo = (size_t)m->cfg.n_layer * m->cfg.n_expert * rows * m->cfg.n_embd;
        float *eo[3] = {calloc(neo, 4), calloc(neo, 4), calloc(neo, 4)};
        g_eo_experts = m->cfg.n_expert, g_eo_embd = (int)m->cfg.n_embd;
        g_eo = eo[0];
        CHECK(run(m, ids, 2, 7, r3), "resident run with expert outputs");
        g_eo = NULL;
        struct moe_model_params mp = moe_model_default_params();
        mp.expert_precision = prec;
        mp.lazy_experts = 1;
        struct moe_model *lm = NULL;
        CHECK(moe_model_load(bundle, &mp, &lm) == MOE_OK && moe_model_repack(lm, 1, NULL) == MOE_OK, "lazy load");
        for (int cap = 32; lm && cap >= 5; cap -= 27) {
            struct moe_store_params sp = moe_store_default_params();
            sp.repack = 1, sp.dynamic = 0, sp.high_cap = cap, sp.low_cap = 0, sp.high = prec;
            g_eo = eo[1];
            CHECK(run_store(lm, ids, 2, 7, r2, &sp), "store run, %d copies", cap);
            g_eo = NULL;
            CHECK(memcmp(r1, r2, n * sizeof *r1) == 0, "store with %d repacked copies: logits differ from the resident "
                  "repacked model's", cap);
            CHECK(memcmp(eo[0], eo[1], neo * 4) == 0, "store with %d repacked copies: expert outputs differ", cap);
        }
        /* the store without repack on the same model: the stored rows' kernels */
        struct moe_store_params sp = moe_store_default_params();
        sp.dynamic = 0, sp.high_cap = 32, sp.low_cap = 0, sp.high = prec;
        g_eo = eo[2];
        CHECK(lm && run_store(lm, ids, 2, 7, r2, &sp), "store run without repack");
        g_eo = NULL;
        CHECK(packs == (memcmp(eo[0], eo[2], neo * 4) != 0), "expert outputs %s the stored layout's under %s",
              packs ? "equal" : "differ from", moe_quant_int_isa_name());
        for (int k = 0; k < 3; k++) free(eo[k]);
        moe_model_free(lm);
        const double kr = mean_kl(ref, r1, V), ks = mean_kl(ref, li, V);
        CHECK(kr <= 1.25 * ks + 1e-4 && agree >= rows - 2, "%s repacked: KL to the checkpoint %.3g (stored layout "
              "%.3g), argmax differs at %d positions", prec, kr, ks, rows - agree);
    }
    free(r1), free(r2), free(r3), free(rf);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test-backend-cpu MOE-PREP MODEL_DIR\n");
        return 2;
    }
    if (!mkdtemp(tmpdir)) return 1;
    char bundle[256], cmd[2048];
    snprintf(bundle, sizeof bundle, "%s/demo.moeb", tmpdir);
    snprintf(cmd, sizeof cmd, "%s quantize %s -o %s --experts q8_0,q4_k --dense q8_0 >/dev/null 2>&1", argv[1], argv[2],
             bundle);
    CHECK(system(cmd) == 0, "%s", cmd);

    /* the prompt: the first N_PROMPT tokens of a held-out text */
    char text_path[2048];
    snprintf(text_path, sizeof text_path, "%s/heldout/python_docs.txt", argv[2]);
    char *text = NULL;
    size_t text_len = 0;
    CHECK(moe_read_file(text_path, 1 << 20, &text, &text_len) == MOE_OK, "read %s", text_path);
    /* the reference: the BF16 checkpoint (float path) */
    struct moe_model *ck = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *ref = NULL;
    struct moe_model_params cp = moe_model_default_params();
    CHECK(moe_model_load(argv[2], &cp, &ck) == MOE_OK && ck && ck->tok, "load %s", argv[2]);
    if (ck && ck->tok && text) {
        CHECK(moe_tokenizer_encode(ck->tok, text, text_len, 1, &ids, &n_ids) == MOE_OK &&
                  n_ids >= N_PROMPT + N_GEN,
              "tokenize");
        ref = calloc((size_t)(N_PROMPT + N_GEN) * ck->cfg.n_vocab, sizeof *ref);
        CHECK(ref && n_ids >= N_PROMPT + N_GEN && run(ck, ids, 2, 64, ref), "checkpoint run");
    }
    const char *precs[] = {"q8_0", "q4_k"};
    for (int pi = 0; ref && pi < 2; pi++) {
        struct moe_model_params mp = moe_model_default_params();
        mp.expert_precision = precs[pi];
        struct moe_model *m = NULL;
        CHECK(moe_model_load(bundle, &mp, &m) == MOE_OK && m && m->tok, "load %s at %s", bundle, precs[pi]);
        if (!m) continue;
        const int V = m->cfg.n_vocab;
        const size_t n = (size_t)(N_PROMPT + N_GEN) * V;
        float *l1 = calloc(n, sizeof *l1), *l2 = calloc(n, sizeof *l2), *l3 = calloc(n, sizeof *l3),
              *lf = calloc(n, sizeof *lf);
        if (l1 && l2 && l3 && lf) {
            unsetenv("MOE_CPU_INT");
            CHECK(run(m, ids, 1, 64, l1) && run(m, ids, 2, 64, l2) && run(m, ids, 2, 7, l3), "%s: runs", precs[pi]);
            CHECK(memcmp(l1, l2, n * sizeof *l1) == 0, "%s: 1 and 2 threads give different logits", precs[pi]);
            CHECK(memcmp(l2, l3, n * sizeof *l2) == 0, "%s: chunks of 64 and 7 give different logits", precs[pi]);
            setenv("MOE_CPU_INT", "0", 1);
            CHECK(run(m, ids, 2, 64, lf), "%s: float run", precs[pi]);
            unsetenv("MOE_CPU_INT");
            compare(precs[pi], l1, lf, ref, V);
            /* 61 prompt tokens + 8 decoded = 69 positions, the context's size */
            const size_t n69 = (size_t)(61 + N_GEN) * V;
            CHECK(run_ctx(m, ids, 2, 16, 69, 61, l2, NULL) && run_ctx(m, ids, 2, 16, 128, 61, l3, NULL), "%s: runs",
                  precs[pi]);
            CHECK(memcmp(l2, l3, n69 * sizeof *l2) == 0, "%s: a full context of 69 and one of 128 give different logits",
                  precs[pi]);
            batched(m, ids, l2, l3, 1);
            if (pi == 0) adapt_wiring(m, ids);
            repacked(m, precs[pi], bundle, ids, l1, lf, ref, V);
        }
        free(l1), free(l2), free(l3), free(lf);
        moe_model_free(m);
    }
    free(ids);
    free(ref);
    moe_model_free(ck);
    free(text);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}

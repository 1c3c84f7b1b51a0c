/*
 * bench-cache-sim.c - replay speed of the expert-cache simulator
 * (tools/common/cache-sim.c), in expert accesses per second, single-threaded,
 * for every policy on synthetic traces shaped like real models, and on a
 * real profile when one is given.
 *
 *   bench-cache-sim [PROFILE.h5]
 *
 * Synthetic traces: 32 MoE layers x 8 experts top-2 (Mixtral-like) and
 * 16 layers x 64 experts top-8 (OLMoE-like), 256-token sequences, about 5
 * million accesses each. Per layer the experts follow a Zipf(1) popularity in
 * a random order, and each rank reuses the previous token's expert with
 * probability 0.5, which gives hit ratios in the range real traces show.
 * Caches: 25 % of all experts at high precision and 12.5 % at low precision,
 * T1 0.6, T2 0.9 (top-2: about 60 / 30 / 10 % high / low / skip). Also one
 * HOBBIT replay with a prefetch of 2 experts per layer (order-1 path
 * dictionary from the same trace) and the time of the whole weight fit on
 * the profile given (if any). Results go to docs/benchmarks.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache-sim.h"
#include "profile-h5.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

/* rnd: uniform in [0, 1) (xorshift64*). */
static double rnd(void) {
    g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
    return (double)((g_rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

/* A synthetic trace and its arrays. */
struct synth {
    struct moe_trace t;
    int64_t *seq_start;
    int16_t *experts;
    float *weights;
};

/* make_synth: n_seq sequences of `len` tokens (see the header comment). */
static int make_synth(struct synth *s, int L, int E, int K, int n_seq, int len) {
    const int64_t n_tok = (int64_t)n_seq * len;
    s->seq_start = malloc(sizeof(int64_t) * ((size_t)n_seq + 1));
    s->experts = malloc(sizeof(int16_t) * (size_t)n_tok * L * K);
    s->weights = malloc(sizeof(float) * (size_t)n_tok * L * K);
    double *cdf = malloc(sizeof(double) * (size_t)L * E);
    int *perm = malloc(sizeof(int) * (size_t)L * E);
    if (!s->seq_start || !s->experts || !s->weights || !cdf || !perm) return 0;
    for (int l = 0; l < L; l++) {
        double z = 0;
        for (int e = 0; e < E; e++) z += 1.0 / (e + 1);
        double acc = 0;
        for (int e = 0; e < E; e++) acc += 1.0 / (e + 1) / z, cdf[l * E + e] = acc;
        for (int e = 0; e < E; e++) perm[l * E + e] = e;
        for (int e = E - 1; e > 0; e--) {
            int j = (int)(rnd() * (e + 1)), x = perm[l * E + e];
            perm[l * E + e] = perm[l * E + j], perm[l * E + j] = x;
        }
    }
    for (int q = 0; q <= n_seq; q++) s->seq_start[q] = (int64_t)q * len;
    for (int64_t tok = 0; tok < n_tok; tok++)
        for (int l = 0; l < L; l++) {
            int16_t *x = s->experts + ((size_t)tok * L + l) * K;
            const int16_t *prev = tok % len ? x - (size_t)L * K : NULL;
            float *w = s->weights + ((size_t)tok * L + l) * K;
            for (int j = 0; j < K; j++) {
                int e, dup;
                do {
                    if (prev && rnd() < 0.5) e = prev[j];
                    else {
                        double u = rnd();
                        int r = 0;
                        while (r < E - 1 && cdf[l * E + r] < u) r++;
                        e = perm[l * E + r];
                    }
                    dup = 0;
                    for (int i = 0; i < j; i++) dup |= x[i] == e;
                } while (dup);
                x[j] = (int16_t)e;
            }
            double rest = 1;
            for (int j = 0; j < K; j++) { /* descending gate weights */
                double g = j == K - 1 ? rest : rest * (0.35 + 0.4 * rnd());
                w[j] = (float)g;
                rest -= g;
            }
            for (int j = 1; j < K; j++) /* keep them sorted, largest first */
                for (int i = j; i > 0 && w[i] > w[i - 1]; i--) {
                    float a = w[i];
                    w[i] = w[i - 1], w[i - 1] = a;
                }
        }
    s->t = (struct moe_trace){L, E, K, n_seq, s->seq_start, s->experts, s->weights};
    free(cdf);
    free(perm);
    return 1;
}

/* bench_trace: every policy on trace t; returns 0 on an error. */
static int bench_trace(const char *label, const struct moe_trace *t, int fit) {
    const int L = t->n_layers, E = t->n_experts, LE = L * E;
    struct moe_cache_trace_params pp = moe_cache_trace_default_params();
    pp.t1 = 0.6, pp.t2 = 0.9, pp.prompt_len = 16;
    struct moe_cache_trace *tr = NULL, *trp = NULL;
    struct moe_path_dict *d = NULL;
    double *freq = malloc(sizeof(double) * LE);
    int32_t *order = malloc(sizeof(int32_t) * LE), *all = malloc(sizeof(int32_t) * ((size_t)t->n_seq + 1));
    int ok = 0;
    if (!freq || !order || !all) goto done;
    for (int i = 0; i < t->n_seq; i++) all[i] = i;
    double t0 = now();
    if (moe_cache_trace_new(t, NULL, 0, &pp, &tr)) goto done;
    double t_prep = now() - t0;
    struct moe_cache_trace_info info;
    moe_cache_trace_info(tr, &info);
    if (moe_cache_popularity(t, all, t->n_seq, freq, order)) goto done;
    struct moe_cache_config c = moe_cache_default_config();
    c.high_cap = LE / 4, c.low_cap = LE / 8, c.low_cost = 0.3, c.high_bytes = 1, c.low_bytes = 0.3;
    c.freq = freq, c.order = order;
    c.w[0] = 0.3, c.w[1] = 0.4, c.w[2] = 0.2, c.w[3] = 0.1;
    printf("\n%s: %d layers x %d experts, top-%d; %d sequences, %lld tokens, %lld accesses "
           "(high %.1f %%, low %.1f %%, skip %.1f %%); prepared in %.2f s\n",
           label, L, E, t->k, t->n_seq, (long long)info.tokens, (long long)info.accesses,
           100.0 * info.need[2] / info.accesses, 100.0 * info.need[1] / info.accesses,
           100.0 * info.need[0] / info.accesses, t_prep);
    printf("cache: %d high + %d low experts (25 %% + 12.5 %% of %d)\n", c.high_cap, c.low_cap, LE);
    printf("| policy | hit ratio | penalty / token | M accesses/s |\n|---|---:|---:|---:|\n");
    for (int p = 0; p < MOE_CACHE_N_POLICIES; p++) {
        struct moe_cache_stats st;
        int reps = 0;
        double el = 0;
        t0 = now();
        do { /* at least 0.5 s per policy */
            if (moe_cache_simulate(tr, (enum moe_cache_policy)p, &c, &st)) goto done;
            reps++;
            el = now() - t0;
        } while (el < 0.5);
        printf("| %s | %.4f | %.4f | %.1f |\n", moe_cache_policy_name((enum moe_cache_policy)p),
               moe_cache_hit_ratio(&st), st.penalty / (double)st.tokens, (double)st.accesses * reps / el / 1e6);
    }
    /* prefetch: order-1 dictionary of the same trace, 2 experts per layer */
    if (moe_cache_path_dict(t, all, t->n_seq, 1, &d)) goto done;
    pp.paths = d, pp.prefetch = 2;
    t0 = now();
    if (moe_cache_trace_new(t, NULL, 0, &pp, &trp)) goto done;
    t_prep = now() - t0;
    c.prefetch = 1;
    struct moe_cache_stats st;
    t0 = now();
    if (moe_cache_simulate(trp, MOE_CACHE_HOBBIT, &c, &st)) goto done;
    double el = now() - t0;
    printf("| hobbit + prefetch 2 | %.4f | %.4f | %.1f |\n", moe_cache_hit_ratio(&st),
           st.penalty / (double)st.tokens, (double)st.accesses / el / 1e6);
    printf("(prefetch lists prepared in %.2f s; %lld prefetch loads, %lld used)\n", t_prep,
           (long long)st.prefetch_loads, (long long)st.prefetch_hits);
    if (fit) {
        c.prefetch = 0;
        double w[MOE_CACHE_N_WEIGHTS];
        int evals = 0;
        t0 = now();
        int admit = 0;
        if (moe_cache_fit_hobbit(tr, &c, NULL, w, &admit, &st, &evals)) goto done;
        el = now() - t0;
        printf("HOBBIT weight fit: %d replays in %.2f s (%.1f M accesses/s); w = %.3f %.3f %.3f %.3f %.3f, "
               "admission %s, penalty / token %.4f\n", evals, el, (double)info.accesses * evals / el / 1e6, w[0],
               w[1], w[2], w[3], w[4], admit ? "on" : "off", st.penalty / (double)st.tokens);
    }
    ok = 1;
done:
    if (!ok) fprintf(stderr, "bench-cache-sim: %s failed\n", label);
    moe_cache_trace_free(tr);
    moe_cache_trace_free(trp);
    moe_path_dict_free(d);
    free(freq);
    free(order);
    free(all);
    return ok;
}

int main(int argc, char **argv) {
    int ok = 1;
    struct synth a, b;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    if (!make_synth(&a, 32, 8, 2, 320, 256) || !make_synth(&b, 16, 64, 8, 160, 256)) {
        fprintf(stderr, "bench-cache-sim: out of memory\n");
        return 1;
    }
    ok &= bench_trace("synthetic Mixtral-like", &a.t, 0);
    ok &= bench_trace("synthetic OLMoE-like", &b.t, 0);
    if (argc > 1) {
        struct moe_profile *p = NULL;
        if (moe_profile_read(argv[1], &p)) {
            fprintf(stderr, "bench-cache-sim: cannot read %s\n", argv[1]);
            ok = 0;
        } else {
            struct moe_trace t;
            moe_profile_trace(p, &t);
            ok &= bench_trace(argv[1], &t, 1);
            moe_profile_free(p);
        }
    }
    free(a.seq_start), free(a.experts), free(a.weights);
    free(b.seq_start), free(b.experts), free(b.weights);
    return ok ? 0 : 1;
}

/*
 * bench-cuda.c - the CUDA backend's benchmark table (issue 14), side by side,
 * as markdown for docs/benchmarks.md. First run on an H200 on 2026-11-28
 * (docs/benchmarks.md, "The CUDA backend on an H200").
 *
 *   bench-cuda BUNDLE [--device N] [--threads T] [-n TOKENS] [--prompt P]
 *              [--expert-mem 25%] [--host-mem SIZE]
 *   bench-cuda --gemv-only [--device N]   (rows 1 and 2 alone: no bundle)
 *
 * BUNDLE: ideally the inflated demo model with q8_0 and q2_k experts and a
 * profiled tuning, as tests/bench/bench-offload.sh steps 1-6 make it
 * (--experts q8_0,q4_k,q2_k). Rows:
 *   1. host->device copies: pinned-memcpy peak (256 MiB), pageable, and the
 *      expert copies the engine made (its loaders' bytes / copy time); goal:
 *      expert copies >= 90 % of the pinned peak;
 *   2. the dequantizing GEMV kernel on large matrices (14336 x 4096 and
 *      4096 x 14336) in q4_k and q8_0, GB/s of weights, against the
 *      device-to-device copy bandwidth; goal >= 70 %;
 *   3. decode tokens/s, every expert resident, GPU against the CPU backend;
 *   4. decode tokens/s with --expert-mem (25 %) of the experts on the GPU:
 *      the full engine (HOBBIT policy and dynamic precision from the tuning,
 *      prefetch, host tier, Twiddler auto) against on-demand LRU without
 *      prefetch, dynamic precision, host tier or CPU experts; goal >= 3x;
 *   5. a --prompt-token prompt (256) at 25 % resident: Twiddler's split
 *      against always-transfer (--cpu-experts never) and always-CPU
 *      (--cpu-experts always); goal: faster than both.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe-cuda.h"
#include "moe-gpu.h"
#include "moe-options.h"
#include "moe-session.h"
#include "moe-store.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct opts {
    const char *bundle, *expert_mem;
    int device, threads, n_decode, n_prompt;
    int64_t host_mem;
};

struct result {
    double prompt_s, decode_tps;
    struct moe_store_stats st;
    struct moe_cuda_stats gs;
    int ok;
};

/* bench_run: a prompt of n_prompt tokens then n_decode greedy steps; g NULL = the CPU backend. */
static struct result bench_run(const struct opts *o, const struct moe_gpu_params *g, const struct moe_store_params *sp,
                               int n_prompt, int n_decode) {
    struct result r;
    memset(&r, 0, sizeof r);
    struct moe_model_params mp = moe_model_default_params();
    mp.lazy_experts = sp != NULL;
    struct moe_model *m = NULL;
    struct moe_session *s = NULL;
    if (moe_model_load(o->bundle, &mp, &m) != MOE_OK) return r;
    struct moe_session_params p = moe_session_default_params();
    p.n_threads = o->threads;
    p.n_ctx = n_prompt + n_decode + 1;
    p.store = sp;
    if (g) p.backend_new = moe_backend_cuda_new_fn, p.backend_user = (void *)g;
    const int V = m->cfg.n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
    if (!logits || !ids || moe_session_create(m, &p, &s) != MOE_OK) goto done;
    for (int i = 0; i < n_prompt; i++) ids[i] = (int32_t)((97 * i + 13) % V);
    double t0 = now_s();
    if (moe_session_forward(s, ids, n_prompt, logits, 0) != MOE_OK) goto done;
    double t1 = now_s();
    for (int i = 0; i < n_decode; i++) {
        int32_t best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        if (moe_session_forward(s, &best, 1, logits, 0) != MOE_OK) goto done;
    }
    double t2 = now_s();
    r.prompt_s = t1 - t0;
    r.decode_tps = n_decode > 0 ? n_decode / (t2 - t1) : 0;
    if (moe_session_store(s)) moe_store_get_stats(moe_session_store(s), &r.st);
    if (g) moe_backend_cuda_stats(moe_session_backend(s), &r.gs);
    r.ok = 1;
done:
    if (!r.ok) fprintf(stderr, "bench-cuda: a run failed (%s)\n", g ? "GPU" : "CPU");
    moe_session_free(s);
    moe_model_free(m);
    free(logits);
    free(ids);
    return r;
}

/* store_params: a budget and either the full engine or on-demand LRU. */
static struct moe_store_params store_params(const struct opts *o, int full) {
    struct moe_store_params sp = moe_store_default_params();
    char err[128];
    if (moe_store_parse_option(&sp, "--expert-mem", o->expert_mem, err, sizeof err) != MOE_OK)
        fprintf(stderr, "bench-cuda: %s\n", err);
    if (!full) {
        sp.policy = 0; /* lru */
        sp.dynamic = 0;
        sp.prefetch_layers = sp.prefetch_paths = 0;
        sp.warm = 0;
    } else {
        sp.prefetch_layers = 1; /* the tuned policy and thresholds come from the bundle */
    }
    return sp;
}

int main(int argc, char **argv) {
    struct opts o = {NULL, "25%", 0, 0, 64, 256, (int64_t)8 << 30};
    int gemv_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device") && v) o.device = atoi(v), i++;
        else if (!strcmp(a, "--threads") && v) o.threads = atoi(v), i++;
        else if (!strcmp(a, "-n") && v) o.n_decode = atoi(v), i++;
        else if (!strcmp(a, "--prompt") && v) o.n_prompt = atoi(v), i++;
        else if (!strcmp(a, "--expert-mem") && v) o.expert_mem = v, i++;
        else if (!strcmp(a, "--gemv-only")) gemv_only = 1;
        else if (!strcmp(a, "--host-mem") && v) {
            if (moe_store_parse_size(v, &o.host_mem) != MOE_OK) return 2;
            i++;
        } else if (a[0] != '-' && !o.bundle) o.bundle = a;
        else {
            fprintf(stderr, "usage: bench-cuda BUNDLE [--device N] [--threads T] [-n TOKENS] [--prompt P] "
                            "[--expert-mem 25%%] [--host-mem SIZE]\n"
                            "       bench-cuda --gemv-only [--device N]   (rows 1 and 2: copies and GEMV)\n");
            return 2;
        }
    }
    if (!o.bundle && !gemv_only) {
        fprintf(stderr, "bench-cuda: no bundle given\n");
        return 2;
    }
    if (moe_cuda_device_count() <= o.device) {
        fprintf(stderr, "bench-cuda: no CUDA device %d\n", o.device);
        return 1;
    }
    char desc[256];
    moe_cuda_describe(o.device, desc, sizeof desc);
    printf("device: %s; bundle: %s; decode %d tokens, prompt %d, expert memory %s, host tier %.1f GiB\n\n", desc,
           o.bundle ? o.bundle : "-", o.n_decode, o.n_prompt, o.expert_mem, (double)o.host_mem / 1073741824.0);
    printf("| measure | result | goal |\n|---|---|---|\n");

    /* 1, 2: copies and GEMV bandwidth */
    double pinned = 0, pageable = 0, d2d = 0;
    if (moe_cuda_bench_copy(o.device, (size_t)256 << 20, 10, &pinned, &pageable, &d2d) == MOE_OK)
        printf("| host->device memcpy, 256 MiB | pinned %.1f GB/s, pageable %.1f GB/s | (peak) |\n", pinned, pageable);
    static const enum moe_qtype gt[] = {MOE_QTYPE_Q4_K, MOE_QTYPE_Q8_0};
    for (int k = 0; k < 2; k++)
        for (int shape = 0; shape < 2; shape++) {
            const int64_t n_out = shape ? 4096 : 14336, n_in = shape ? 14336 : 4096;
            double gb = 0;
            if (moe_cuda_bench_gemv(o.device, gt[k], n_out, n_in, 20, &gb) == MOE_OK)
                printf("| GEMV %s %lld x %lld, 1 token | %.1f GB/s = %.0f %% of the %.1f GB/s device copy | >= 70 %% |\n",
                       moe_qtype_name(gt[k]), (long long)n_out, (long long)n_in, gb, d2d > 0 ? 100 * gb / d2d : 0, d2d);
        }
    if (gemv_only) return 0;

    struct moe_gpu_params g = moe_gpu_default_params();
    g.device = o.device;
    /* 3: all resident */
    struct result cpu = bench_run(&o, NULL, NULL, 8, o.n_decode), gpu = bench_run(&o, &g, NULL, 8, o.n_decode);
    if (cpu.ok && gpu.ok)
        printf("| decode, all experts resident | GPU %.1f tok/s, CPU %.1f tok/s (%.1fx) | report |\n", gpu.decode_tps,
               cpu.decode_tps, cpu.decode_tps > 0 ? gpu.decode_tps / cpu.decode_tps : 0);

    /* 4: 25 % on the GPU, full engine against on-demand LRU */
    struct moe_store_params full = store_params(&o, 1), lru = store_params(&o, 0);
    struct moe_gpu_params gf = g, gl = g;
    gf.host_mem = o.host_mem, gf.cpu_experts = MOE_CPU_EXPERTS_AUTO;
    gl.host_mem = 0, gl.cpu_experts = MOE_CPU_EXPERTS_NEVER;
    struct result rf = bench_run(&o, &gf, &full, 8, o.n_decode), rl = bench_run(&o, &gl, &lru, 8, o.n_decode);
    if (rf.ok && rl.ok) {
        printf("| decode, %s of experts on the GPU | full engine %.1f tok/s, on-demand LRU %.1f tok/s (%.1fx) | >= 3x |\n",
               o.expert_mem, rf.decode_tps, rl.decode_tps, rl.decode_tps > 0 ? rf.decode_tps / rl.decode_tps : 0);
        const double ecopy = rl.gs.h2d_s > 0 ? (double)rl.gs.h2d_bytes / rl.gs.h2d_s / 1e9 : 0;
        printf("| host->device expert copies (engine, LRU run) | %.1f GB/s = %.0f %% of the pinned peak | >= 90 %% |\n",
               ecopy, pinned > 0 ? 100 * ecopy / pinned : 0);
        printf("| (full engine: host tier hits %lld / misses %lld, %lld experts on the CPU of %lld placed) | | |\n",
               (long long)rf.gs.tier.hits, (long long)rf.gs.tier.misses, (long long)rf.gs.placed_host,
               (long long)rf.gs.placed);
    }

    /* 5: a long prompt at 25 %: Twiddler's split against always-transfer and always-CPU */
    struct result tw[3];
    static const enum moe_cpu_experts modes[3] = {MOE_CPU_EXPERTS_AUTO, MOE_CPU_EXPERTS_NEVER, MOE_CPU_EXPERTS_ALWAYS};
    for (int i = 0; i < 3; i++) {
        struct moe_gpu_params gm = g;
        gm.cpu_experts = modes[i];
        struct moe_store_params sp = store_params(&o, 0);
        tw[i] = bench_run(&o, &gm, &sp, o.n_prompt, 0);
    }
    if (tw[0].ok && tw[1].ok && tw[2].ok)
        printf("| %d-token prompt, %s on the GPU | split %.3f s, always-transfer %.3f s, always-CPU %.3f s | faster than "
               "both |\n",
               o.n_prompt, o.expert_mem, tw[0].prompt_s, tw[1].prompt_s, tw[2].prompt_s);
    return 0;
}

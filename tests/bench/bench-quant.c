/*
 * bench-quant.c - throughput of the quantization kernels (a benchmark, not a test).
 *
 * Prints three tables, single-threaded:
 *   1. memory bandwidth of this machine: a streaming sum over a large f32 array;
 *   2. matrix-vector products y = W x per type and per ISA, on a weight matrix
 *      larger than the caches (default 128 MB of weight bytes, rows of 4096), in
 *      GB/s of weight bytes and % of the streaming bandwidth: with float
 *      activations (moe_vec_dot) and with activations quantized once
 *      (moe_vec_dot_act per row; moe_mat_dot_act over the matrix), measured
 *      interleaved so that their ratio is robust on a noisy machine; plus
 *      moe_dequantize_row throughput; and a matrix times 8 activations
 *      (moe_vec_dot per row and token against one moe_mat_dot_act);
 *   3. moe_quantize_row in MB/s of f32 input, the scalar reference and the
 *      best ISA here (SIMD kernels for q8_0, q4_k, q5_k; the same bytes).
 *
 * With --threads N, the matvec (float against int) also runs on N threads.
 *
 * Usage: bench-quant [--mb N] [--reps N] [--types q4_k,q8_0,...] [--threads N] [--no-quantize] [--csv]
 * Example: ./build/tests/bench-quant --mb 128 --reps 3
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "moe-quant.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 88172645463325252ull;
static float rnd_normal(void) {
    double u[2];
    for (int k = 0; k < 2; k++) {
        g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
        u[k] = ((double)(g_rng >> 11) + 0.5) * 0x1p-53;
    }
    return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

/* Sum of n floats, read once front to back (SSE2, which every x86-64 has). */
static float stream_sum(const float *a, size_t n) {
#if defined(__SSE2__)
    __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm_add_ps(s0, _mm_load_ps(a + i));
        s1 = _mm_add_ps(s1, _mm_load_ps(a + i + 4));
        s2 = _mm_add_ps(s2, _mm_load_ps(a + i + 8));
        s3 = _mm_add_ps(s3, _mm_load_ps(a + i + 12));
    }
    float t[4];
    _mm_storeu_ps(t, _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
    float s = t[0] + t[1] + t[2] + t[3];
#else
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) s0 += a[i], s1 += a[i + 1], s2 += a[i + 2], s3 += a[i + 3];
    float s = s0 + s1 + s2 + s3;
#endif
    for (; i < n; i++) s += a[i];
    return s;
}

/* ---- multi-threaded runs: rows (or stream elements) split evenly --------- */

struct job {
    int kind; /* 0 stream sum, 1 float dots (moe_vec_dot), 2 moe_mat_dot_act */
    enum moe_qtype t;
    int64_t n, r0, r1;
    const uint8_t *w;
    size_t rb, ab;
    const float *x, *buf;
    const void *xq;
    float *out, res;
};

static void *run_job(void *arg) {
    struct job *j = arg;
    float s = 0;
    if (j->kind == 0) s = stream_sum(j->buf + j->r0, (size_t)(j->r1 - j->r0));
    else if (j->kind == 1)
        for (int64_t r = j->r0; r < j->r1; r++) s += moe_vec_dot(j->t, j->w + j->rb * r, j->x, j->n);
    else
        moe_mat_dot_act(j->t, j->n, j->w + j->rb * j->r0, j->rb, j->r1 - j->r0, j->xq, j->ab, 1, j->out + j->r0, 1, 1);
    j->res = s;
    return NULL;
}

/* Runs `tmpl` over [0, total) split in nt slices (nt - 1 new threads plus this
 * one, created per call); returns the seconds taken. Stream slices stay
 * multiples of 16 floats (aligned loads). */
static double run_split(int nt, const struct job *tmpl, int64_t total, float *sink) {
    struct job jobs[64];
    pthread_t th[64];
    for (int i = 0; i < nt; i++) {
        jobs[i] = *tmpl;
        int64_t a = total * i / nt, b = total * (i + 1) / nt;
        if (tmpl->kind == 0) a &= ~(int64_t)15, b = i == nt - 1 ? total : b & ~(int64_t)15;
        jobs[i].r0 = a, jobs[i].r1 = b;
    }
    double t0 = now();
    for (int i = 1; i < nt; i++) pthread_create(&th[i], NULL, run_job, &jobs[i]);
    run_job(&jobs[0]);
    for (int i = 1; i < nt; i++) pthread_join(th[i], NULL);
    double dt = now() - t0;
    for (int i = 0; i < nt; i++) *sink += jobs[i].res;
    return dt;
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench-quant [--mb N] [--reps N] [--types LIST] [--threads N] [--no-quantize] [--csv]\n"
               "  --mb N        weight bytes per matrix in MiB (default 128; use > the L3 cache)\n"
               "  --reps N      timed repetitions, best kept (default 3)\n"
               "  --types LIST  comma-separated types (default: all)\n"
               "  --threads N   also run matvec with N threads, float against int (default 1: no)\n"
               "  --no-quantize skip the quantize table\n"
               "  --csv         machine-readable output\n"
               "example: bench-quant --mb 128 --reps 3\n");
}

int main(int argc, char **argv) {
    size_t mb = 128;
    int reps = 3, csv = 0, do_quant = 1, threads = 1;
    const char *types = "f32,f16,bf16,q8_0,q6_k,q5_k,q4_k,q4_0,q3_k,q2_k,q8_k";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--types") && i + 1 < argc) types = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-quantize")) do_quant = 0;
        else if (!strcmp(argv[i], "--csv")) csv = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
        else { usage(stderr); return 2; }
    }
    if (mb < 1 || mb > 8192 || reps < 1 || threads < 1 || threads > 64) { usage(stderr); return 2; }
    const int64_t n = 4096;
    const size_t bytes = mb << 20;

    /* 1. streaming read bandwidth over a buffer of the same size as the matrices */
    float *buf = aligned_alloc(64, bytes + 64);
    if (!buf) { fprintf(stderr, "bench-quant: out of memory\n"); return 1; }
    const size_t nf = bytes / 4;
    for (size_t i = 0; i < nf; i++) buf[i] = (float)(i & 1023) * 1e-3f;
    double best = 1e30;
    volatile float sink = 0;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now();
        sink += stream_sum(buf, nf);
        double dt = now() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    const double stream_gbs = (double)bytes / best / 1e9;
    if (csv)
        printf("table,type,bpw,isa,int_isa,ms,gb_per_s,int_gb_per_s,intmat_gb_per_s,ratio,pct_stream,"
               "dequant_gweights_per_s,quantize_mb_per_s\n"
               "stream,f32,32,sse2,,%.3f,%.2f,,,,100,,\n", best * 1e3, stream_gbs);
    else
        printf("memory bandwidth (streaming f32 sum over %zu MiB, 1 thread): %.2f GB/s\n\n", mb, stream_gbs);

    /* 2. matvec per type and ISA: float activations (moe_vec_dot) against
     *    quantized ones (moe_vec_dot_act per row, and moe_mat_dot_act over the
     *    whole matrix), measured interleaved in the same repetitions */
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4), *tmp = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = rnd_normal();
    enum { NTOK = 8 }; /* activations of the matrix-matrix table */
    float *xs = malloc((size_t)(NTOK * n) * 4);
    for (int64_t i = 0; i < NTOK * n; i++) xs[i] = rnd_normal();
    uint8_t *xq = malloc(moe_act_row_bytes(MOE_QTYPE_F32, n) * NTOK);
    const size_t max_out = bytes / 16 + 16; /* rows of the smallest row size (q2_k 1344 bytes) */
    float *out = malloc(max_out * NTOK * 4);
    if (!csv) {
        printf("matvec y = W x, rows of %lld, about %zu MiB of weights, best of %d, 1 thread; GB/s of weight bytes\n"
               "  float: moe_vec_dot with f32 x; int: x quantized once (moe_quantize_act), moe_vec_dot_act per row;\n"
               "  int-mat: moe_mat_dot_act over the matrix (rows in groups); ratio = int-mat / float\n",
               (long long)n, mb, reps);
        printf("%-5s %7s  %-6s %-10s %8s %8s %8s %6s %8s   %s\n", "type", "bits/w", "ISA", "int ISA", "float",
               "int", "int-mat", "ratio", "%stream", "dequant Gw/s");
    }
    char list[256];
    snprintf(list, sizeof list, "%s", types);
    struct { enum moe_qtype t; double ratio[3], mm[3]; } summary[16];
    int nsum = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        enum moe_qtype t;
        if (moe_qtype_from_name(tok, &t) != MOE_OK) return 2;
        const size_t rb = moe_qtype_row_bytes(t, n), ab = moe_act_row_bytes(t, n);
        const int64_t rows = (int64_t)(bytes / rb);
        uint8_t *w = (uint8_t *)buf;
        /* 64 distinct realistic rows, repeated over the matrix */
        enum { TEMPLATES = 64 };
        uint8_t *tpl = malloc(rb * TEMPLATES);
        for (int k = 0; k < TEMPLATES; k++) {
            for (int64_t i = 0; i < n; i++) tmp[i] = rnd_normal() * 0.02f;
            moe_quantize_row(t, tmp, tpl + rb * k, n);
        }
        for (int64_t r = 0; r < rows; r++) memcpy(w + rb * r, tpl + rb * (r % TEMPLATES), rb);
        free(tpl);
        if (nsum < 16) summary[nsum].t = t;
        for (int isa = 0; isa < 3; isa++) {
            if (!moe_quant_isa_supported((enum moe_quant_isa)isa)) continue;
            moe_quant_set_isa((enum moe_quant_isa)isa);
            double bt = 1e30, bi = 1e30, bm = 1e30, bd = 1e30;
            for (int r = 0; r < reps + 1; r++) { /* rep 0 warms up */
                double t0 = now();
                float s = 0;
                for (int64_t row = 0; row < rows; row++) s += moe_vec_dot(t, w + rb * row, x, n);
                double t1 = now();
                moe_quantize_act(t, x, xq, n); /* counted: once per matrix */
                for (int64_t row = 0; row < rows; row++) s += moe_vec_dot_act(t, w + rb * row, xq, n);
                double t2 = now();
                moe_quantize_act(t, x, xq, n);
                moe_mat_dot_act(t, n, w, rb, rows, xq, ab, 1, out, 1, 1);
                double t3 = now();
                sink += s + out[rows / 2];
                if (r > 0) {
                    if (t1 - t0 < bt) bt = t1 - t0;
                    if (t2 - t1 < bi) bi = t2 - t1;
                    if (t3 - t2 < bm) bm = t3 - t2;
                }
            }
            for (int r = 0; r < reps; r++) {
                double t0 = now();
                for (int64_t row = 0; row < rows; row++) moe_dequantize_row(t, w + rb * row, y, n);
                double dt = now() - t0;
                sink += y[7];
                if (dt < bd) bd = dt;
            }
            const double wb = (double)(rb * (size_t)rows), nw = (double)rows * (double)n;
            if (nsum < 16) summary[nsum].ratio[isa] = bt / bm;
            if (csv)
                printf("matvec,%s,%.4f,%s,%s,%.3f,%.2f,%.2f,%.2f,%.3f,%.1f,%.3f,\n", moe_qtype_name(t),
                       moe_qtype_bits_per_weight(t), moe_quant_isa_name(), moe_quant_int_isa_name(), bt * 1e3,
                       wb / bt / 1e9, wb / bi / 1e9, wb / bm / 1e9, bt / bm, 100.0 * wb / bm / 1e9 / stream_gbs,
                       nw / bd / 1e9);
            else
                printf("%-5s %7.4g  %-6s %-10s %8.2f %8.2f %8.2f %5.2fx %7.0f%%   %.3f\n", moe_qtype_name(t),
                       moe_qtype_bits_per_weight(t), moe_quant_isa_name(), moe_quant_int_isa_name(), wb / bt / 1e9,
                       wb / bi / 1e9, wb / bm / 1e9, bt / bm, 100.0 * wb / bm / 1e9 / stream_gbs, nw / bd / 1e9);
        }
        /* matrix x NTOK activations: moe_vec_dot for every (row, token), as the
         * runtime's prompt path does, against one moe_mat_dot_act call */
        const int64_t mrows = rows / 8 > 0 ? rows / 8 : 1; /* 1/8 of the matrix: same work per rep */
        for (int isa = 0; isa < 3; isa++) {
            if (!moe_quant_isa_supported((enum moe_quant_isa)isa) || isa == 0) continue;
            moe_quant_set_isa((enum moe_quant_isa)isa);
            double bt = 1e30, bm = 1e30;
            for (int r = 0; r < reps + 1; r++) {
                double t0 = now();
                float s = 0;
                for (int64_t row = 0; row < mrows; row++)
                    for (int k = 0; k < NTOK; k++) s += moe_vec_dot(t, w + rb * row, xs + k * n, n);
                double t1 = now();
                for (int k = 0; k < NTOK; k++) moe_quantize_act(t, xs + k * n, xq + k * ab, n);
                moe_mat_dot_act(t, n, w, rb, mrows, xq, ab, NTOK, out, NTOK, 1);
                double t2 = now();
                sink += s + out[7];
                if (r > 0) {
                    if (t1 - t0 < bt) bt = t1 - t0;
                    if (t2 - t1 < bm) bm = t2 - t1;
                }
            }
            if (nsum < 16) summary[nsum].mm[isa] = bt / bm;
            const double gw = (double)mrows * (double)n * NTOK / 1e9;
            if (csv)
                printf("matmul%d,%s,%.4f,%s,%s,%.3f,%.3f,,%.3f,%.2f,,,\n", NTOK, moe_qtype_name(t),
                       moe_qtype_bits_per_weight(t), moe_quant_isa_name(), moe_quant_int_isa_name(), bt * 1e3,
                       gw / bt, gw / bm, bt / bm);
            else
                printf("%-5s %7s  %-6s %-10s matmul x%d: float %.2f, int-mat %.2f Gweight-token/s, ratio %.2fx\n",
                       moe_qtype_name(t), "", moe_quant_isa_name(), moe_quant_int_isa_name(), NTOK, gw / bt, gw / bm,
                       bt / bm);
        }
        /* an expert's gate and up (two matrices of rows/2, one activation):
         * moe_gate_up_act reading both in one pass, against two moe_mat_dot_act
         * calls and the SiLU product */
        const int64_t grows = rows / 2;
        for (int isa = 1; isa < 3; isa++) {
            if (!moe_quant_isa_supported((enum moe_quant_isa)isa)) continue;
            moe_quant_set_isa((enum moe_quant_isa)isa);
            const uint8_t *gate = w, *up = w + rb * (size_t)grows;
            double bs = 1e30, bf = 1e30;
            for (int r = 0; r < reps + 1; r++) {
                double t0 = now();
                moe_quantize_act(t, x, xq, n);
                moe_mat_dot_act(t, n, gate, rb, grows, xq, ab, 1, out, 1, 1);
                moe_mat_dot_act(t, n, up, rb, grows, xq, ab, 1, out + grows, 1, 1);
                for (int64_t i = 0; i < grows; i++) out[i] = out[i] / (1.0f + expf(-out[i])) * out[grows + i];
                double t1 = now();
                moe_quantize_act(t, x, xq, n);
                moe_gate_up_act(t, n, gate, up, grows, xq, ab, 1, out, (size_t)grows);
                double t2 = now();
                sink += out[3];
                if (r > 0) {
                    if (t1 - t0 < bs) bs = t1 - t0;
                    if (t2 - t1 < bf) bf = t2 - t1;
                }
            }
            const double wb = (double)(rb * (size_t)(2 * grows));
            if (csv)
                printf("gateup,%s,%.4f,%s,%s,%.3f,%.2f,,%.2f,%.2f,%.1f,,\n", moe_qtype_name(t),
                       moe_qtype_bits_per_weight(t), moe_quant_isa_name(), moe_quant_int_isa_name(), bf * 1e3,
                       wb / bs / 1e9, wb / bf / 1e9, bs / bf, 100.0 * wb / bf / 1e9 / stream_gbs);
            else
                printf("%-5s %7s  %-6s %-10s gate+up: two mat_dot %.2f GB/s, fused moe_gate_up_act %.2f GB/s (%.2fx)\n",
                       moe_qtype_name(t), "", moe_quant_isa_name(), moe_quant_int_isa_name(), wb / bs / 1e9,
                       wb / bf / 1e9, bs / bf);
        }
        /* the runtime's repacked layout (moe_repack) against the stored rows,
         * interleaved: one activation (decode) and NTOK (prompt) */
        for (int isa = 1; isa < 3; isa++) {
            if (!moe_quant_isa_supported((enum moe_quant_isa)isa)) continue;
            moe_quant_set_isa((enum moe_quant_isa)isa);
            const int64_t prow = rows / 16 * 16;
            const enum moe_qtype pt = moe_repack_type(t, prow, n);
            if (pt == t) continue;
            uint8_t *pw = malloc(rb * (size_t)prow);
            if (!pw || moe_repack(t, pt, prow, n, w, pw) != MOE_OK) return 2;
            const int64_t prm = mrows / 16 * 16 > 0 ? mrows / 16 * 16 : 16;
            double b1 = 1e30, b2 = 1e30, b3 = 1e30, b4 = 1e30;
            for (int r = 0; r < reps + 1; r++) {
                double t0 = now();
                moe_quantize_act(t, x, xq, n);
                moe_mat_dot_act(t, n, w, rb, prow, xq, ab, 1, out, 1, 1);
                double t1 = now();
                moe_quantize_act(t, x, xq, n);
                moe_mat_dot_act(pt, n, pw, rb, prow, xq, ab, 1, out, 1, 1);
                double t2 = now();
                for (int k = 0; k < NTOK; k++) moe_quantize_act(t, xs + k * n, xq + k * ab, n);
                moe_mat_dot_act(t, n, w, rb, prm, xq, ab, NTOK, out, NTOK, 1);
                double t3 = now();
                for (int k = 0; k < NTOK; k++) moe_quantize_act(t, xs + k * n, xq + k * ab, n);
                moe_mat_dot_act(pt, n, pw, rb, prm, xq, ab, NTOK, out, NTOK, 1);
                double t4 = now();
                sink += out[5];
                if (r > 0) {
                    if (t1 - t0 < b1) b1 = t1 - t0;
                    if (t2 - t1 < b2) b2 = t2 - t1;
                    if (t3 - t2 < b3) b3 = t3 - t2;
                    if (t4 - t3 < b4) b4 = t4 - t3;
                }
            }
            free(pw);
            const double wb = (double)(rb * (size_t)prow), gw = (double)prm * (double)n * NTOK / 1e9;
            if (csv)
                printf("repack,%s,%.4f,%s,%s,%.3f,%.2f,,%.2f,%.2f,%.1f,,\n", moe_qtype_name(pt),
                       moe_qtype_bits_per_weight(t), moe_quant_isa_name(), moe_quant_int_isa_name(), b2 * 1e3,
                       wb / b1 / 1e9, wb / b2 / 1e9, b1 / b2, 100.0 * wb / b2 / 1e9 / stream_gbs);
            else
                printf("%-5s %7s  %-6s %-10s %s: matvec %.2f -> %.2f GB/s (%.2fx, %.0f%% of stream); "
                       "matmul x%d %.2f -> %.2f Gweight-token/s (%.2fx)\n",
                       moe_qtype_name(t), "", moe_quant_isa_name(), moe_quant_int_isa_name(), moe_qtype_name(pt),
                       wb / b1 / 1e9, wb / b2 / 1e9, b1 / b2, 100.0 * wb / b2 / 1e9 / stream_gbs, NTOK, gw / b3,
                       gw / b4, b3 / b4);
        }
        nsum++;
    }
    if (!csv && nsum > 0) {
        printf("\nsummary, int-mat / float (matvec) and int / float (matmul x%d), per ISA:\n", NTOK);
        for (int i = 0; i < nsum && i < 16; i++) {
            printf("  %-5s", moe_qtype_name(summary[i].t));
            for (int isa = 1; isa < 3; isa++)
                if (moe_quant_isa_supported((enum moe_quant_isa)isa))
                    printf("   %s: matvec %.2fx matmul %.2fx", moe_quant_isa_str((enum moe_quant_isa)isa),
                           summary[i].ratio[isa], summary[i].mm[isa]);
            printf("\n");
        }
    }
    /* 2b. the same matvec on several threads (rows split evenly; threads
     *     created per call, which costs well under 1 % at this matrix size),
     *     against an equally split streaming read */
    if (threads > 1) {
        moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
        struct job sj = {.kind = 0, .buf = buf};
        double bsn = 1e30;
        float fs = 0;
        for (int r = 0; r < reps + 1; r++) {
            const double dt = run_split(threads, &sj, (int64_t)nf, &fs);
            if (r > 0 && dt < bsn) bsn = dt;
        }
        sink += fs;
        const double sgbs = (double)bytes / bsn / 1e9;
        if (csv) printf("stream%d,f32,32,sse2,,%.3f,%.2f,,,,100,,\n", threads, bsn * 1e3, sgbs);
        else
            printf("\n%d threads (%s, int %s): streaming read %.2f GB/s\n%-5s %8s %8s %6s %8s\n", threads,
                   moe_quant_isa_name(), moe_quant_int_isa_name(), sgbs, "type", "float", "int-mat", "ratio",
                   "%stream");
        snprintf(list, sizeof list, "%s", types);
        for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
            enum moe_qtype t;
            moe_qtype_from_name(tok, &t);
            const size_t rb = moe_qtype_row_bytes(t, n), ab = moe_act_row_bytes(t, n);
            const int64_t rows = (int64_t)(bytes / rb);
            uint8_t *w = (uint8_t *)buf;
            for (int64_t i = 0; i < n; i++) tmp[i] = rnd_normal() * 0.02f;
            moe_quantize_row(t, tmp, w, n);
            for (int64_t r = 1; r < rows; r++) memcpy(w + rb * r, w, rb);
            moe_quantize_act(t, x, xq, n);
            struct job fj = {.kind = 1, .t = t, .n = n, .w = w, .rb = rb, .x = x};
            struct job ij = {.kind = 2, .t = t, .n = n, .w = w, .rb = rb, .ab = ab, .xq = xq, .out = out};
            double bf = 1e30, bi = 1e30;
            for (int r = 0; r < reps + 1; r++) {
                float f = 0;
                const double df = run_split(threads, &fj, rows, &f);
                const double di = run_split(threads, &ij, rows, &f);
                sink += f + out[rows - 1];
                if (r > 0) {
                    if (df < bf) bf = df;
                    if (di < bi) bi = di;
                }
            }
            const double wb = (double)(rb * (size_t)rows);
            if (csv)
                printf("matvec%d,%s,%.4f,%s,%s,%.3f,%.2f,,%.2f,%.2f,%.1f,,\n", threads, moe_qtype_name(t),
                       moe_qtype_bits_per_weight(t), moe_quant_isa_name(), moe_quant_int_isa_name(), bi * 1e3,
                       wb / bf / 1e9, wb / bi / 1e9, bf / bi, 100.0 * wb / bi / 1e9 / sgbs);
            else
                printf("%-5s %8.2f %8.2f %5.2fx %7.0f%%\n", moe_qtype_name(t), wb / bf / 1e9, wb / bi / 1e9, bf / bi,
                       100.0 * wb / bi / 1e9 / sgbs);
        }
    }
    moe_quant_set_isa(MOE_QUANT_ISA_AUTO);

    /* 3. quantize throughput: the scalar reference, then the best ISA here */
    if (do_quant) {
        const int64_t qrows = 256; /* 4 MiB of f32 */
        float *src = malloc((size_t)(qrows * n) * 4);
        uint8_t *dst = malloc(moe_qtype_row_bytes(MOE_QTYPE_F32, qrows * n));
        for (int64_t i = 0; i < qrows * n; i++) src[i] = rnd_normal() * 0.02f;
        moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
        const enum moe_quant_isa qbest = moe_quant_get_isa();
        if (!csv)
            printf("\nmoe_quantize_row, %lld rows of %lld f32, best of %d (MB/s in)\n%-5s %10s %10s\n", (long long)qrows,
                   (long long)n, reps, "type", "scalar", moe_quant_isa_str(qbest));
        snprintf(list, sizeof list, "%s", types);
        for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
            enum moe_qtype t;
            moe_qtype_from_name(tok, &t);
            double mbs[2];
            for (int k = 0; k < 2; k++) {
                moe_quant_set_isa(k == 0 ? MOE_QUANT_ISA_SCALAR : qbest);
                double bq = 1e30;
                for (int r = 0; r < reps; r++) {
                    double t0 = now();
                    for (int64_t row = 0; row < qrows; row++)
                        moe_quantize_row(t, src + row * n, dst + moe_qtype_row_bytes(t, n) * row, n);
                    double dt = now() - t0;
                    if (dt < bq) bq = dt;
                }
                mbs[k] = (double)(qrows * n * 4) / bq / 1e6;
                if (csv)
                    printf("quantize,%s,%.4f,%s,,,,,,,,,%.1f\n", moe_qtype_name(t), moe_qtype_bits_per_weight(t),
                           k == 0 ? "scalar" : moe_quant_isa_str(qbest), mbs[k]);
            }
            if (!csv) printf("%-5s %10.1f %10.1f\n", moe_qtype_name(t), mbs[0], mbs[1]);
        }
        moe_quant_set_isa(MOE_QUANT_ISA_AUTO);
        free(src), free(dst);
    }
    free(buf), free(x), free(y), free(tmp), free(xs), free(xq), free(out);
    return sink == 12345.0f ? 3 : 0;
}

// kernel-test.cu - one kernel at a time with host inputs and outputs
// (moe-cuda.h, "kernels one by one"): the parity tests and the benchmarks
// call these. Not fast: everything is copied in and out.
//
// Run on an H200 (test-cuda, bench-cuda), 2026-11-28.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda-impl.h"
#include "moe-cuda.h"

namespace {

// dev_mem: device allocations freed together at the end of an entry point.
struct dev_mem {
    std::vector<void *> ptrs;
    ~dev_mem() {
        for (void *p : ptrs) cudaFree(p);
    }
    // put: a device copy of n host bytes (or zeroed bytes when src is NULL); NULL on failure.
    void *put(const void *src, size_t n) {
        void *d = nullptr;
        if (cudaMalloc(&d, n ? n : 16) != cudaSuccess) {
            cudaGetLastError();
            return nullptr;
        }
        ptrs.push_back(d);
        if (src ? cudaMemcpy(d, src, n, cudaMemcpyHostToDevice) : cudaMemset(d, 0, n ? n : 16)) return nullptr;
        return d;
    }
};

enum moe_status open_dev(int dev) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || dev < 0 || dev >= n) {
        cudaGetLastError();
        return MOE_ERR_UNSUPPORTED;
    }
    CU(cudaSetDevice(dev));
    return MOE_OK;
}

size_t wbytes(enum moe_qtype t, int64_t n_out, int64_t n_in) { return moe_qtype_row_bytes(t, n_in) * (size_t)n_out; }

gemv_job job_of(const uint8_t *w, enum moe_qtype t, int64_t n_out, int64_t n_in, const float *x, int64_t ldx, int n_tok,
                float *y, int64_t ldy, const float *bias, int mode) {
    gemv_job j;
    memset(&j, 0, sizeof j);
    j.w = w, j.type = (int)t, j.n_out = (int)n_out, j.n_in = (int)n_in, j.row_bytes = moe_qtype_row_bytes(t, n_in);
    j.x = x, j.ldx = ldx, j.n_tok = n_tok, j.y = y, j.ldy = ldy, j.bias = bias, j.mode = mode;
    return j;
}

// gemm_bufs: a gemm_ctx with buffers for matrices up to max_in columns and max_tok tokens.
enum moe_status gemm_bufs(dev_mem &m, cublasHandle_t h, int f32, int64_t max_in, int64_t max_out, int max_tok,
                          gemm_ctx *g) {
    g->blas = h;
    g->f32 = f32;
    g->wbuf_bytes = (size_t)16 << 20;
    g->xbuf_bytes = (size_t)max_tok * (size_t)max_in * 4;
    g->obuf_elems = (size_t)max_tok * (size_t)max_out;
    g->wbuf = m.put(nullptr, g->wbuf_bytes);
    g->xbuf = m.put(nullptr, g->xbuf_bytes);
    g->gbuf = (float *)m.put(nullptr, g->obuf_elems * 4);
    g->ubuf = (float *)m.put(nullptr, g->obuf_elems * 4);
    return g->wbuf && g->xbuf && g->gbuf && g->ubuf ? MOE_OK : MOE_ERR_NOMEM;
}

// run_jobs: jobs through the GEMV kernel (path 0) or cuBLAS (g != NULL).
enum moe_status run_jobs(dev_mem &m, const std::vector<gemv_job> &jobs, const gemm_ctx *g) {
    enum moe_status st;
    if (g) {
        for (const gemv_job &j : jobs)
            if ((st = run_gemm(&j, g, 0))) return st;
        return MOE_OK;
    }
    int max_out = 0, max_tok = 0;
    for (const gemv_job &j : jobs) max_out = std::max(max_out, j.n_out), max_tok = std::max(max_tok, j.n_tok);
    const gemv_job *jd = (const gemv_job *)m.put(jobs.data(), jobs.size() * sizeof(gemv_job));
    if (!jd) return MOE_ERR_NOMEM;
    return launch_gemv(jd, (int)jobs.size(), max_out, max_tok, 0);
}

enum moe_status finish(void *dst, const void *src, size_t n) {
    CU(cudaDeviceSynchronize());
    if (n) CU(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
    return MOE_OK;
}

} // namespace

extern "C" enum moe_status moe_cuda_test_dequant(int dev, enum moe_qtype t, const void *w, int64_t n_out, int64_t n_in,
                                                 float *y) {
    enum moe_status st = open_dev(dev);
    if (st) return st;
    dev_mem m;
    const uint8_t *wd = (const uint8_t *)m.put(w, wbytes(t, n_out, n_in));
    float *yd = (float *)m.put(nullptr, sizeof(float) * (size_t)(n_out * n_in));
    if (!wd || !yd) return MOE_ERR_NOMEM;
    if ((st = launch_dequant(wd, (int)t, (int)n_out, (int)n_in, yd, 0))) return st;
    return finish(y, yd, sizeof(float) * (size_t)(n_out * n_in));
}

extern "C" enum moe_status moe_cuda_test_matmul(int dev, enum moe_qtype t, const void *w, int64_t n_out, int64_t n_in,
                                                const float *bias, const float *x, int n_tok, int path, float *y) {
    enum moe_status st = open_dev(dev);
    if (st) return st;
    dev_mem m;
    const uint8_t *wd = (const uint8_t *)m.put(w, wbytes(t, n_out, n_in));
    const float *xd = (const float *)m.put(x, sizeof(float) * (size_t)(n_tok * n_in));
    const float *bd = bias ? (const float *)m.put(bias, sizeof(float) * (size_t)n_out) : nullptr;
    float *yd = (float *)m.put(nullptr, sizeof(float) * (size_t)(n_tok * n_out));
    if (!wd || !xd || !yd || (bias && !bd)) return MOE_ERR_NOMEM;
    cublasHandle_t h = nullptr;
    gemm_ctx g;
    if (path && (moe_blas_create(&h) != CUBLAS_STATUS_SUCCESS || (st = gemm_bufs(m, h, path == 2, n_in, n_out, n_tok, &g)))) {
        if (h) moe_blas_destroy(h);
        return st ? st : MOE_ERR_BACKEND;
    }
    st = run_jobs(m, {job_of(wd, t, n_out, n_in, xd, n_in, n_tok, yd, n_out, bd, Y_STORE)}, path ? &g : nullptr);
    if (!st) st = finish(y, yd, sizeof(float) * (size_t)(n_tok * n_out));
    if (h) moe_blas_destroy(h);
    return st;
}

extern "C" enum moe_status moe_cuda_test_ffn(int dev, const struct moe_ffn *f, const float *x, int n, int path,
                                             float *y) {
    enum moe_status st = open_dev(dev);
    if (st) return st;
    dev_mem m;
    const int64_t F = f->gate.n_out, H = f->gate.n_in;
    const uint8_t *gd = (const uint8_t *)m.put(f->gate.data, wbytes(f->gate.type, F, H));
    const uint8_t *ud = (const uint8_t *)m.put(f->up.data, wbytes(f->up.type, F, H));
    const uint8_t *dd = (const uint8_t *)m.put(f->down.data, wbytes(f->down.type, H, F));
    const float *xd = (const float *)m.put(x, sizeof(float) * (size_t)(n * H));
    float *hd = (float *)m.put(nullptr, sizeof(float) * (size_t)(n * F));
    float *yd = (float *)m.put(nullptr, sizeof(float) * (size_t)(n * H));
    if (!gd || !ud || !dd || !xd || !hd || !yd) return MOE_ERR_NOMEM;
    cublasHandle_t h = nullptr;
    gemm_ctx g;
    if (path && (moe_blas_create(&h) != CUBLAS_STATUS_SUCCESS || (st = gemm_bufs(m, h, path == 2, std::max(F, H), std::max(F, H), n, &g)))) {
        if (h) moe_blas_destroy(h);
        return st ? st : MOE_ERR_BACKEND;
    }
    gemv_job gu = job_of(gd, f->gate.type, F, H, xd, H, n, hd, F, nullptr, Y_SWIGLU);
    gu.w2 = ud;
    st = run_jobs(m, {gu}, path ? &g : nullptr);
    if (!st) st = run_jobs(m, {job_of(dd, f->down.type, H, F, hd, F, n, yd, H, nullptr, Y_STORE)}, path ? &g : nullptr);
    if (!st) st = finish(y, yd, sizeof(float) * (size_t)(n * H));
    if (h) moe_blas_destroy(h);
    return st;
}

extern "C" enum moe_status moe_cuda_test_experts(int dev, const struct moe_expert_work *works, int n_work,
                                                 const float *xn, int n_tok, int64_t n_embd, int n_slots, float *part,
                                                 uint8_t *used) {
    enum moe_status st = open_dev(dev);
    if (st) return st;
    dev_mem m;
    const int64_t H = n_embd;
    const float *xd = (const float *)m.put(xn, sizeof(float) * (size_t)(n_tok * H));
    float *pd = (float *)m.put(nullptr, sizeof(float) * (size_t)(n_tok * n_slots * H));
    uint8_t *ud = (uint8_t *)m.put(nullptr, (size_t)(n_tok * n_slots));
    if (!xd || !pd || !ud) return MOE_ERR_NOMEM;
    std::vector<gemv_job> gu, dn;
    for (int i = 0; i < n_work; i++) {
        const moe_expert_work &w = works[i];
        const int64_t F = w.f.gate.n_out;
        const uint8_t *gd = (const uint8_t *)m.put(w.f.gate.data, wbytes(w.f.gate.type, F, H));
        const uint8_t *upd = (const uint8_t *)m.put(w.f.up.data, wbytes(w.f.up.type, F, H));
        const uint8_t *dd = (const uint8_t *)m.put(w.f.down.data, wbytes(w.f.down.type, H, F));
        const int32_t *rows = (const int32_t *)m.put(w.rows, sizeof(int32_t) * (size_t)w.n_rows);
        const int32_t *slots = (const int32_t *)m.put(w.slots, sizeof(int32_t) * (size_t)w.n_rows);
        const float *wt = (const float *)m.put(w.w, sizeof(float) * (size_t)w.n_rows);
        float *hd = (float *)m.put(nullptr, sizeof(float) * (size_t)(w.n_rows * F));
        if (!gd || !upd || !dd || !rows || !slots || !wt || !hd) return MOE_ERR_NOMEM;
        gemv_job j1 = job_of(gd, w.f.gate.type, F, H, xd, H, w.n_rows, hd, F, nullptr, Y_SWIGLU);
        j1.w2 = upd, j1.xrow = rows;
        gemv_job j2 = job_of(dd, w.f.down.type, H, F, hd, F, w.n_rows, pd, H, nullptr, Y_STORE);
        j2.yrow = rows, j2.yslot = slots, j2.n_slots = n_slots, j2.yw = wt, j2.used = ud;
        gu.push_back(j1);
        dn.push_back(j2);
    }
    if ((st = run_jobs(m, gu, nullptr)) || (st = run_jobs(m, dn, nullptr))) return st;
    if ((st = finish(part, pd, sizeof(float) * (size_t)(n_tok * n_slots * H)))) return st;
    CU(cudaMemcpy(used, ud, (size_t)(n_tok * n_slots), cudaMemcpyDeviceToHost));
    return MOE_OK;
}

extern "C" enum moe_status moe_cuda_test_norm(int dev, int layer, const float *x, const float *w, const float *b,
                                              int n_rows, int64_t n, float eps, float *y) {
    enum moe_status st = open_dev(dev);
    if (st) return st;
    dev_mem m;
    const size_t bytes = sizeof(float) * (size_t)(n_rows * n);
    const float *xd = (const float *)m.put(x, bytes), *wd = (const float *)m.put(w, sizeof(float) * (size_t)n);
    const float *bd = b ? (const float *)m.put(b, sizeof(float) * (size_t)n) : nullptr;
    float *yd = (float *)m.put(nullptr, bytes);
    if (!xd || !wd || !yd || (b && !bd)) return MOE_ERR_NOMEM;
    if ((st = launch_norm(layer, xd, wd, bd, n_rows, (int)n, eps, yd, 0))) return st;
    return finish(y, yd, bytes);
}

extern "C" enum moe_status moe_cuda_test_rope(int dev, float *v, int n_tok, int n_heads, int head_dim, int n_rot,
                                              const float *cs, const float *sn) {
    enum moe_status st = open_dev(dev);
    if (st) return st;
    dev_mem m;
    const size_t bytes = sizeof(float) * (size_t)n_tok * n_heads * head_dim, tb = sizeof(float) * (size_t)n_tok * (n_rot / 2);
    float *vd = (float *)m.put(v, bytes);
    const float *cd = (const float *)m.put(cs, tb), *sd = (const float *)m.put(sn, tb);
    if (!vd || !cd || !sd) return MOE_ERR_NOMEM;
    if ((st = launch_rope(vd, n_tok, n_heads, head_dim, n_rot, cd, sd, 0))) return st;
    return finish(v, vd, bytes);
}

extern "C" enum moe_status moe_cuda_test_attention(int dev, const float *q, const float *kc, const float *vc, int n_tok,
                                                   int pos0, int n_head, int n_head_kv, int hd, int window, int n_split,
                                                   float *out) {
    enum moe_status st = open_dev(dev);
    if (st) return st;
    dev_mem m;
    const int len = pos0 + n_tok;
    const size_t qb = sizeof(float) * (size_t)n_tok * n_head * hd, kb = sizeof(float) * (size_t)len * n_head_kv * hd;
    const size_t pr = (size_t)n_tok * n_head * n_split;
    attn_args a;
    a.q = (const float *)m.put(q, qb);
    a.k_cache = (const float *)m.put(kc, kb);
    a.v_cache = (const float *)m.put(vc, kb);
    a.out = (float *)m.put(nullptr, qb);
    a.pm = (float *)m.put(nullptr, sizeof(float) * pr);
    a.pl = (float *)m.put(nullptr, sizeof(float) * pr);
    a.pacc = (float *)m.put(nullptr, sizeof(float) * pr * hd);
    if (!a.q || !a.k_cache || !a.v_cache || !a.out || !a.pm || !a.pl || !a.pacc) return MOE_ERR_NOMEM;
    a.n_tok = n_tok, a.pos0 = pos0, a.n_head = n_head, a.n_head_kv = n_head_kv, a.hd = hd, a.window = window;
    a.n_split = n_split, a.pos_dev = nullptr;
    if ((st = launch_attention(&a, 0))) return st;
    return finish(out, a.out, qb);
}

extern "C" enum moe_status moe_cuda_test_route(int dev, const float *logits, int n, int E, int k, int sparsemixer,
                                               int norm_topk, float eps, int32_t *sel, float *w) {
    enum moe_status st = open_dev(dev);
    if (st) return st;
    dev_mem m;
    const float *ld = (const float *)m.put(logits, sizeof(float) * (size_t)n * E);
    int32_t *sd = (int32_t *)m.put(nullptr, sizeof(int32_t) * (size_t)n * k);
    float *wd = (float *)m.put(nullptr, sizeof(float) * (size_t)n * k);
    if (!ld || !sd || !wd) return MOE_ERR_NOMEM;
    if ((st = launch_route(ld, n, E, k, sparsemixer, norm_topk, eps, 1.0f, sd, wd, 0))) return st;
    if ((st = finish(sel, sd, sizeof(int32_t) * (size_t)n * k))) return st;
    CU(cudaMemcpy(w, wd, sizeof(float) * (size_t)n * k, cudaMemcpyDeviceToHost));
    return MOE_OK;
}

extern "C" enum moe_status moe_cuda_test_residual(int dev, float *x, const float *acc, const float *part,
                                                  const uint8_t *used, const float *sg, const float *sh, int n_tok,
                                                  int n_slots, int64_t n_embd) {
    enum moe_status st = open_dev(dev);
    if (st) return st;
    dev_mem m;
    const size_t xb = sizeof(float) * (size_t)(n_tok * n_embd);
    float *xd = (float *)m.put(x, xb);
    const float *ad = (const float *)m.put(acc, xb);
    const float *pd = (const float *)m.put(part, xb * (size_t)n_slots);
    const uint8_t *ud = (const uint8_t *)m.put(used, (size_t)(n_tok * n_slots));
    const float *gd = sg ? (const float *)m.put(sg, sizeof(float) * (size_t)n_tok) : nullptr;
    const float *hd = sh ? (const float *)m.put(sh, xb) : nullptr;
    if (!xd || !ad || !pd || !ud || (sg && !gd) || (sh && !hd)) return MOE_ERR_NOMEM;
    if ((st = launch_residual(xd, ad, pd, ud, gd, hd, n_tok, n_slots, (int)n_embd, 0))) return st;
    return finish(x, xd, xb);
}

extern "C" enum moe_status moe_cuda_bench_copy(int dev, size_t bytes, int reps, double *h2d_pinned,
                                               double *h2d_pageable, double *d2d) {
    enum moe_status st = open_dev(dev);
    if (st) return st;
    dev_mem m;
    void *d = m.put(nullptr, bytes), *d2 = m.put(nullptr, bytes);
    void *hp = nullptr;
    void *hq = malloc(bytes);
    if (!d || !d2 || !hq || cudaHostAlloc(&hp, bytes, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        free(hq);
        return MOE_ERR_NOMEM;
    }
    memset(hp, 1, bytes);
    memset(hq, 1, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    double best[3] = {0, 0, 0};
    for (int r = 0; r < reps + 1; r++) { // the first round warms up
        for (int k = 0; k < 3; k++) {
            cudaEventRecord(e0, 0);
            if (k == 0) cudaMemcpyAsync(d, hp, bytes, cudaMemcpyHostToDevice, 0);
            else if (k == 1) cudaMemcpy(d, hq, bytes, cudaMemcpyHostToDevice);
            else cudaMemcpyAsync(d2, d, bytes, cudaMemcpyDeviceToDevice, 0);
            cudaEventRecord(e1, 0);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            // device-to-device copies read and write: count both
            const double gbps = (double)bytes * (k == 2 ? 2 : 1) / (ms * 1e-3) / 1e9;
            if (r && gbps > best[k]) best[k] = gbps;
        }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFreeHost(hp);
    free(hq);
    *h2d_pinned = best[0], *h2d_pageable = best[1];
    if (d2d) *d2d = best[2];
    CU(cudaGetLastError());
    return MOE_OK;
}

extern "C" enum moe_status moe_cuda_bench_gemv(int dev, enum moe_qtype t, int64_t n_out, int64_t n_in, int reps,
                                               double *gbps) {
    enum moe_status st = open_dev(dev);
    if (st) return st;
    dev_mem m;
    const size_t wb = wbytes(t, n_out, n_in);
    if (!wb) return MOE_ERR_INVALID;
    std::vector<uint8_t> w(wb);
    for (size_t i = 0; i < wb; i++) w[i] = (uint8_t)(i * 131 + 7); // arbitrary blocks; only the time matters
    if (t == MOE_QTYPE_F32 || t == MOE_QTYPE_F16 || t == MOE_QTYPE_BF16) std::fill(w.begin(), w.end(), (uint8_t)0x3c);
    std::vector<float> x((size_t)n_in, 0.5f);
    const uint8_t *wd = (const uint8_t *)m.put(w.data(), wb);
    const float *xd = (const float *)m.put(x.data(), sizeof(float) * (size_t)n_in);
    float *yd = (float *)m.put(nullptr, sizeof(float) * (size_t)n_out);
    gemv_job j = job_of(wd, t, n_out, n_in, xd, n_in, 1, yd, n_out, nullptr, Y_STORE);
    const gemv_job *jd = (const gemv_job *)m.put(&j, sizeof j);
    if (!wd || !xd || !yd || !jd) return MOE_ERR_NOMEM;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    double best = 0;
    for (int r = 0; r < reps + 1 && !st; r++) {
        cudaEventRecord(e0, 0);
        st = launch_gemv(jd, 1, (int)n_out, 1, 0);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r && ms > 0 && (double)wb / (ms * 1e-3) / 1e9 > best) best = (double)wb / (ms * 1e-3) / 1e9;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    *gbps = best;
    return st;
}

// backend.cu - the CUDA backend (moe-cuda.h, moe-backend.h version 6).
//
// Written without a GPU; first run on an H200 on 2026-11-28: test-cuda and
// scripts/gpu-check.sh pass (docs/architecture.md, "The CUDA backend", says
// what is verified and what is not).
//
// Streams: every kernel runs on one compute stream in the session's order;
// expert copies into device slots run on a copy stream, issued by the expert
// store's loader threads (stage_end), each slot with two events: `ready`
// (its last copy finished; kernels reading it wait for it) and `read` (the
// last kernel reading it; a copy into it waits for that). The store releases
// a slot only after the session ran the kernels that read it, so the `read`
// event is always recorded before a new copy is issued. Host works
// (Twiddler's CPU side) run on a worker thread over the bundle's mapping
// while the device computes the rest; residual() joins them.
#include <cjson/cJSON.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include "cuda-impl.h"
#include "moe-bundle.h"
#include "moe-cuda.h"
#include "moe-graph.h"

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// A device buffer handed out by buffer_alloc (the store's slots).
struct dev_buf {
    char *base;        // device address
    void *host;        // mapped host address (UMA), or NULL
    size_t size;
    cudaEvent_t ready; // the last copy into it
    cudaEvent_t read;  // the last kernel reading it
    int has_read;
};

// A weight matrix on the device.
struct dmat {
    const uint8_t *w;
    int type;
    int n_out, n_in;
    size_t row_bytes;
    dev_buf *buf; // the slot it lives in, or NULL (a backend-owned copy)
};

// One area of the parameter ring: pinned host bytes copied to the device once per call.
struct param_area {
    char *h, *d;
    size_t used;
    cudaEvent_t copied;
};

constexpr int N_PARAM_AREAS = 4;

// A host work queued for the worker thread.
struct host_job {
    moe_ffn f;
    std::vector<int32_t> rows, slots;
    std::vector<float> w;
    float *out; // unweighted outputs (observers), or NULL
};

struct cuda {
    const moe_model *m;
    const moe_config *c;
    moe_backend_params p;
    moe_gpu_params g;
    int dev;
    cudaDeviceProp prop;
    cudaStream_t cs = nullptr, xs = nullptr; // compute, copy
    cublasHandle_t blas = nullptr;
    moe_gpu_ledger ledger;
    std::mutex mu; // ledger, buffer registry, stats touched by loaders
    std::unordered_map<const void *, void *> wmap;         // host weight bytes -> device copy
    std::unordered_map<const void *, int64_t> wbytes;      // their sizes (to give them back)
    std::map<uintptr_t, dev_buf *> bufs;                   // buffer_alloc'd, by device address
    int64_t H, q_dim, kv_dim, max_ff, max_in, max_rows;
    int S; // expert slots per token
    // device state
    float *k_cache = nullptr, *v_cache = nullptr;
    float *x = nullptr, *xn = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr, *tmp = nullptr;
    float *acc = nullptr, *part = nullptr, *sg = nullptr, *hbuf = nullptr, *eout = nullptr, *hpart = nullptr;
    float *logits = nullptr, *pm = nullptr, *pl = nullptr, *pacc = nullptr, *cos_d = nullptr, *sin_d = nullptr;
    uint8_t *part_used = nullptr;
    int32_t *hidx = nullptr; // [2 x max_rows] rows / slots of host outputs
    int max_split;
    int64_t logits_rows;
    gemm_ctx gemm;
    std::vector<std::pair<void *, int64_t>> dev_allocs; // state allocations (kind STATE)
    // pinned host
    param_area areas[N_PARAM_AREAS];
    int area_next = 0;
    size_t area_size = 0;
    float *logits_h = nullptr, *rope_h = nullptr, *xn_h = nullptr, *hout_h = nullptr;
    int32_t *hidx_h = nullptr;
    cudaEvent_t rope_ev = nullptr, xn_ev = nullptr, hout_ev = nullptr;
    std::vector<float> inv_freq;
    int rope_pos0 = -1, rope_n = -1, rope_len = -1;
    int cur_n = 0;        // tokens of the current chunk (ffn_norm)
    int shared_pending = 0;
    int xn_host_valid = 0;
    // host works (Twiddler's CPU side)
    moe_backend *cpu = nullptr;
    std::thread worker;
    std::mutex wmu;
    std::condition_variable wcv;
    std::deque<host_job> jobs;
    int worker_busy = 0, worker_stop = 0;
    enum moe_status worker_err = MOE_OK;
    int64_t hout_n = 0; // rows written into hout_h this layer
    std::vector<float> wx, wy; // the worker's gathered rows and outputs
    // tiers
    moe_host_tier *tier = nullptr;
    size_t tier_slot = 0;
    // Twiddler
    moe_lat_table lat;
    int lat_state = -1; // -1 none yet, 0 read from the cache, 1 measured
    int lat_failed = 0;
    moe_cuda_stats stats;
    // launches per token
    int64_t own_ops = 0, ops_mark = 0;
    int chunk_n = 0; // tokens of the chunk running now (0: none, or a graph step)
    // decode steps as one graph (moe-graph.h)
    struct graph_state {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        uint64_t gen = 0;
        int k = 0, ready = 0, failed = 0;
        char *step_d = nullptr, *step_h = nullptr; // token, position, RoPE row (device; pinned)
        size_t step_bytes = 0;
        gemv_job *jobs = nullptr;     // device: GRAPH_JOBS per layer + the LM head
        gemv_job *tmpl = nullptr;     // device: [2 x n_layer x n_expert] gate/up, then down templates
        gemv_job *ejobs = nullptr;    // device: [n_moe x 2k] a step's routed jobs
        char *routes_d = nullptr;     // device: [n_moe x k] choices, then [n_moe x k] weights
        char *routes_h = nullptr;     // pinned copy of it
        int32_t *slots = nullptr, *zero = nullptr; // device: [n_moe x k] slots; one 0
        std::vector<int> ff_max;      // per layer: the largest routed-expert n_out
        int cap_k = 0;                // the k the buffers were made for
    } gr;
};

cuda *ctx(moe_backend *be) { return (cuda *)be->ctx; }

// ENQ: a copy or memset this thread enqueues on the compute stream, counted
// with the kernel launches (the launches-per-token statistics).
#define ENQ(call)          \
    do {                   \
        s->own_ops++;      \
        CU(call);          \
    } while (0)

// ops_now: operations this backend's thread has enqueued (kernels, copies, memsets).
int64_t ops_now(const cuda *s) { return launch_count() + s->own_ops; }

// chunk_close: the operations since the last embed or graph step go to the
// one-token steps' count when that chunk was one token (a step counts when
// the next one starts: the statistics hold the steps closed so far).
void chunk_close(cuda *s) {
    const int64_t now = ops_now(s);
    if (s->chunk_n == 1) s->stats.decode_ops += now - s->ops_mark, s->stats.decode_steps++;
    s->ops_mark = now;
    s->chunk_n = 0;
}

// ---- memory -----------------------------------------------------------------

enum moe_status dalloc(cuda *s, moe_gpu_mem_kind kind, size_t bytes, void **out) {
    *out = nullptr;
    char msg[256];
    {
        std::lock_guard<std::mutex> lk(s->mu);
        if (moe_gpu_ledger_take(&s->ledger, kind, (int64_t)bytes, msg, sizeof msg)) {
            MOE_LOGE("CUDA backend: %s", msg);
            return MOE_ERR_NOMEM;
        }
    }
    if (cudaMalloc(out, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError();
        std::lock_guard<std::mutex> lk(s->mu);
        moe_gpu_ledger_give(&s->ledger, kind, (int64_t)bytes);
        MOE_LOGE("CUDA backend: cudaMalloc of %.1f MiB (%s) failed", (double)bytes / 1048576.0, moe_gpu_mem_kind_name(kind));
        *out = nullptr;
        return MOE_ERR_NOMEM;
    }
    return MOE_OK;
}

// state_alloc: a zeroed STATE allocation of n elements of T, remembered for freeing.
template <typename T> enum moe_status state_alloc(cuda *s, T **p, int64_t n) {
    void *d;
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(T);
    enum moe_status st = dalloc(s, MOE_GPU_MEM_STATE, bytes, &d);
    if (st) return st;
    s->dev_allocs.push_back({d, (int64_t)bytes});
    *p = (T *)d;
    CU(cudaMemsetAsync(d, 0, bytes, s->cs)); // on the compute stream: ordered before its kernels
    return MOE_OK;
}

// pinned_alloc: page-locked host memory (mapped into the device's address space for UMA slots).
enum moe_status pinned_alloc(cuda *s, moe_gpu_mem_kind kind, size_t bytes, void **out) {
    char msg[256];
    {
        std::lock_guard<std::mutex> lk(s->mu);
        if (moe_gpu_ledger_take(&s->ledger, kind, (int64_t)bytes, msg, sizeof msg)) {
            MOE_LOGE("CUDA backend: %s", msg);
            return MOE_ERR_NOMEM;
        }
    }
    const unsigned flags = cudaHostAllocPortable | (kind == MOE_GPU_MEM_SLOTS ? cudaHostAllocMapped : 0);
    if (cudaHostAlloc(out, bytes ? bytes : 4096, flags) != cudaSuccess) {
        cudaGetLastError();
        std::lock_guard<std::mutex> lk(s->mu);
        moe_gpu_ledger_give(&s->ledger, kind, (int64_t)bytes);
        MOE_LOGE("CUDA backend: cannot pin %.1f MiB of host memory (%s)", (double)bytes / 1048576.0,
                 moe_gpu_mem_kind_name(kind));
        return MOE_ERR_NOMEM;
    }
    return MOE_OK;
}

size_t weight_bytes(const moe_weight &w) { return moe_qtype_row_bytes(w.type, w.n_in) * (size_t)w.n_out; }

// find_buf: the buffer_alloc'd buffer holding device address p, or NULL (lock held by the caller if needed).
dev_buf *find_buf(cuda *s, const void *p) {
    auto it = s->bufs.upper_bound((uintptr_t)p);
    if (it == s->bufs.begin()) return nullptr;
    --it;
    dev_buf *b = it->second;
    return (uintptr_t)p < (uintptr_t)b->base + b->size ? b : nullptr;
}

// upload: the device copy of `bytes` host bytes at p, made on first use (WEIGHTS).
enum moe_status upload(cuda *s, const void *p, size_t bytes, const void **out) {
    auto it = s->wmap.find(p);
    if (it != s->wmap.end()) {
        *out = it->second;
        return MOE_OK;
    }
    void *d;
    enum moe_status st = dalloc(s, MOE_GPU_MEM_WEIGHTS, bytes, &d);
    if (st) return st;
    // on the compute stream: a copy from pageable memory on the default stream may still be
    // in flight when cudaMemcpy returns, and the compute stream does not wait for that stream
    ENQ(cudaMemcpyAsync(d, p, bytes, cudaMemcpyHostToDevice, s->cs));
    s->wmap[p] = d;
    s->wbytes[p] = (int64_t)bytes;
    s->stats.uploads++;
    s->stats.upload_bytes += (int64_t)bytes;
    *out = d;
    return MOE_OK;
}

// dmat_of: the device view of w: inside a slot of this backend, or an upload of the host view.
enum moe_status dmat_of(cuda *s, const moe_weight &w, dmat *out) {
    if (!w.data) {
        MOE_LOGE("CUDA backend: a missing weight");
        return MOE_ERR_INVALID;
    }
    *out = dmat{nullptr, (int)w.type, (int)w.n_out, (int)w.n_in, moe_qtype_row_bytes(w.type, w.n_in), nullptr};
    if (out->row_bytes == 0) {
        MOE_LOGE("CUDA backend: weights of type %s with %lld columns", moe_qtype_name(w.type), (long long)w.n_in);
        return MOE_ERR_UNSUPPORTED;
    }
    dev_buf *b;
    {
        std::lock_guard<std::mutex> lk(s->mu);
        b = find_buf(s, w.data);
    }
    if (b) {
        out->w = (const uint8_t *)w.data;
        out->buf = b;
        return MOE_OK;
    }
    const void *d = nullptr;
    enum moe_status st = upload(s, w.data, weight_bytes(w), &d);
    out->w = (const uint8_t *)d;
    return st;
}

// dvec: the device copy of n floats (norm weights, biases); NULL stays NULL.
enum moe_status dvec(cuda *s, const float *p, int64_t n, const float **out) {
    *out = nullptr;
    if (!p) return MOE_OK;
    const void *d = nullptr;
    enum moe_status st = upload(s, p, (size_t)n * sizeof(float), &d);
    *out = (const float *)d;
    return st;
}

// ---- the parameter ring -------------------------------------------------------

param_area *area_begin(cuda *s) {
    param_area *a = &s->areas[s->area_next];
    s->area_next = (s->area_next + 1) % N_PARAM_AREAS;
    cudaEventSynchronize(a->copied); // its previous copy has been made (long ago, usually)
    a->used = 0;
    return a;
}

// area_push: n bytes into the area; returns their device address, NULL when full.
void *area_push(cuda *s, param_area *a, const void *src, size_t n) {
    size_t off = round_up(a->used, 16);
    if (off + n > s->area_size) return nullptr;
    memcpy(a->h + off, src, n);
    a->used = off + n;
    return a->d + off;
}

enum moe_status area_commit(cuda *s, param_area *a) {
    if (a->used) ENQ(cudaMemcpyAsync(a->d, a->h, a->used, cudaMemcpyHostToDevice, s->cs));
    CU(cudaEventRecord(a->copied, s->cs));
    return MOE_OK;
}

// ---- matrix products ---------------------------------------------------------

gemv_job make_job(const dmat &m, const float *x, int64_t ldx, int n_tok, float *y, int64_t ldy, const float *bias,
                  int mode) {
    gemv_job j;
    memset(&j, 0, sizeof j);
    j.w = m.w, j.type = m.type, j.n_out = m.n_out, j.n_in = m.n_in, j.row_bytes = m.row_bytes;
    j.x = x, j.ldx = ldx, j.n_tok = n_tok, j.y = y, j.ldy = ldy, j.bias = bias, j.mode = mode;
    return j;
}

// run_phase: jobs that may run together (no one reads another's output): the
// small ones in one GEMV launch (their array pushed into area a), the ones with
// many tokens through cuBLAS. The area is committed here.
enum moe_status run_phase(cuda *s, param_area *a, const std::vector<gemv_job> &jobs) {
    std::vector<gemv_job> small;
    int max_out = 0, max_tok = 0;
    for (const gemv_job &j : jobs)
        if (j.n_tok < MOE_CUDA_GEMM_MIN_TOK) {
            small.push_back(j);
            max_out = std::max(max_out, j.n_out);
            max_tok = std::max(max_tok, j.n_tok);
        }
    const gemv_job *jd = nullptr;
    if (!small.empty() && !(jd = (const gemv_job *)area_push(s, a, small.data(), small.size() * sizeof(gemv_job)))) {
        MOE_LOGE("CUDA backend: parameter area too small (%zu jobs)", small.size());
        return MOE_ERR_NOMEM;
    }
    enum moe_status st = area_commit(s, a);
    if (st) return st;
    if (!small.empty() && (st = launch_gemv(jd, (int)small.size(), max_out, max_tok, s->cs))) return st;
    for (const gemv_job &j : jobs)
        if (j.n_tok >= MOE_CUDA_GEMM_MIN_TOK && (st = run_gemm(&j, &s->gemm, s->cs))) return st;
    return MOE_OK;
}

// matmul: y = W x (+ bias) (mode Y_STORE / Y_ADD) for n rows of x.
enum moe_status matmul(cuda *s, const moe_weight &w, const float *bias_h, const float *x, int64_t ldx, int n, float *y,
                       int64_t ldy, int mode) {
    dmat m;
    const float *bias;
    enum moe_status st;
    if ((st = dmat_of(s, w, &m)) || (st = dvec(s, bias_h, w.n_out, &bias))) return st;
    std::vector<gemv_job> jobs{make_job(m, x, ldx, n, y, ldy, bias, mode)};
    return run_phase(s, area_begin(s), jobs);
}

// wait_buf / read_buf: order kernels after a slot's copy, and its next copy after them.
enum moe_status wait_buf(cuda *s, dev_buf *b) {
    if (b && !b->host) CU(cudaStreamWaitEvent(s->cs, b->ready, 0));
    return MOE_OK;
}
enum moe_status read_buf(cuda *s, dev_buf *b) {
    if (b && !b->host) {
        CU(cudaEventRecord(b->read, s->cs));
        b->has_read = 1;
    }
    return MOE_OK;
}

// ffn_jobs: the gate/up (SwiGLU into hbuf) and down jobs of f for n rows of x
// (ld H) into y; bufs[3] (may be NULL) get the slots its matrices live in.
enum moe_status ffn_jobs(cuda *s, const moe_ffn &f, const float *x, int n, float *y, int mode, gemv_job *gu,
                         gemv_job *dn, dev_buf **bufs) {
    dmat g, u, d;
    enum moe_status st;
    if (f.bias) {
        MOE_LOGE("CUDA backend: feed-forward biases are not supported");
        return MOE_ERR_UNSUPPORTED;
    }
    if ((st = dmat_of(s, f.gate, &g)) || (st = dmat_of(s, f.up, &u)) || (st = dmat_of(s, f.down, &d))) return st;
    if (g.type != u.type || g.n_out != u.n_out || g.n_in != u.n_in) {
        MOE_LOGE("CUDA backend: gate and up matrices differ in type or shape");
        return MOE_ERR_UNSUPPORTED;
    }
    *gu = make_job(g, x, s->H, n, s->hbuf, g.n_out, nullptr, Y_SWIGLU);
    gu->w2 = u.w;
    *dn = make_job(d, s->hbuf, g.n_out, n, y, s->H, nullptr, mode);
    if (bufs) bufs[0] = g.buf, bufs[1] = u.buf, bufs[2] = d.buf;
    return MOE_OK;
}

// ffn_dev: y = down(silu(gate x) * up x) for n rows of x (ld H) on the device, h scratch.
enum moe_status ffn_dev(cuda *s, const moe_ffn &f, const float *x, int n, float *y, int mode) {
    gemv_job gu, dn;
    dev_buf *bufs[3];
    enum moe_status st = ffn_jobs(s, f, x, n, y, mode, &gu, &dn, bufs);
    if (st) return st;
    for (dev_buf *b : bufs)
        if ((st = wait_buf(s, b))) return st;
    param_area *a = area_begin(s);
    if ((st = run_phase(s, a, {gu})) || (st = run_phase(s, area_begin(s), {dn}))) return st;
    for (dev_buf *b : bufs)
        if ((st = read_buf(s, b))) return st;
    return MOE_OK;
}

// ---- RoPE tables (host, the CPU backend's arithmetic) ------------------------------

// rope_fill: cos / sin [n x n_rot/2] for n tokens from pos0 (as backend-cpu.c's rope_tables).
void rope_fill(const cuda *s, int pos0, int n, int seq_len, float *cs, float *sn) {
    const moe_rope *r = &s->c->rope;
    const int half = r->n_rot / 2;
    float scale = 1.0f;
    if (r->kind == MOE_ROPE_LONGROPE)
        scale = r->has_mscale ? (seq_len > r->original_max_pos ? r->long_mscale : r->short_mscale) : r->attention_factor;
    for (int t = 0; t < n; t++) {
        float pp = (float)(pos0 + t);
        for (int i = 0; i < half; i++) {
            float f = pp * s->inv_freq[i];
            cs[(size_t)t * half + i] = (float)cos((double)f) * scale;
            sn[(size_t)t * half + i] = (float)sin((double)f) * scale;
        }
    }
}

// rope_tables: cos / sin for n tokens from pos0 to the device.
enum moe_status rope_tables(cuda *s, int pos0, int n, int seq_len) {
    const int half = s->c->rope.n_rot / 2;
    CU(cudaEventSynchronize(s->rope_ev));
    float *cs = s->rope_h, *sn = s->rope_h + (size_t)n * half;
    rope_fill(s, pos0, n, seq_len, cs, sn);
    const size_t bytes = sizeof(float) * (size_t)n * half;
    ENQ(cudaMemcpyAsync(s->cos_d, cs, bytes, cudaMemcpyHostToDevice, s->cs));
    ENQ(cudaMemcpyAsync(s->sin_d, sn, bytes, cudaMemcpyHostToDevice, s->cs));
    CU(cudaEventRecord(s->rope_ev, s->cs));
    return MOE_OK;
}

// ---- host works (Twiddler's CPU side) --------------------------------------------------

// worker_run: one host job: gather its rows of xn, the CPU backend's FFN, weighted rows into hout.
enum moe_status worker_run(cuda *s, host_job &j) {
    const int64_t H = s->H;
    const int n = (int)j.rows.size();
    if (cudaEventSynchronize(s->xn_ev) != cudaSuccess) return MOE_ERR_BACKEND;
    for (int done = 0; done < n;) {
        const int c = n - done < s->p.n_batch ? n - done : s->p.n_batch;
        for (int i = 0; i < c; i++)
            memcpy(s->wx.data() + (size_t)i * H, s->xn_h + (size_t)j.rows[done + i] * H, sizeof(float) * (size_t)H);
        enum moe_status st = s->cpu->iface->ffn_rows(s->cpu, &j.f, s->wx.data(), s->wy.data(), c);
        if (st) return st;
        int64_t base;
        {
            std::lock_guard<std::mutex> lk(s->wmu);
            base = s->hout_n;
            s->hout_n += c;
        }
        for (int i = 0; i < c; i++) {
            float *dst = s->hout_h + (size_t)(base + i) * H;
            const float *src = s->wy.data() + (size_t)i * H;
            const float wi = j.w[done + i];
            for (int64_t d = 0; d < H; d++) dst[d] = src[d] * wi; // as the CPU backend weights a slot
            s->hidx_h[base + i] = j.rows[done + i];
            s->hidx_h[s->max_rows + base + i] = j.slots[done + i];
        }
        if (j.out) memcpy(j.out + (size_t)done * H, s->wy.data(), sizeof(float) * (size_t)c * (size_t)H);
        done += c;
    }
    return MOE_OK;
}

void worker_main(cuda *s) {
    cudaSetDevice(s->dev);
    std::unique_lock<std::mutex> lk(s->wmu);
    for (;;) {
        s->wcv.wait(lk, [s] { return s->worker_stop || !s->jobs.empty(); });
        if (s->worker_stop) return;
        host_job j = std::move(s->jobs.front());
        s->jobs.pop_front();
        s->worker_busy = 1;
        lk.unlock();
        const double t0 = now_s();
        enum moe_status st = worker_run(s, j);
        const double dt = now_s() - t0;
        lk.lock();
        s->stats.host_s += dt;
        if (st && !s->worker_err) s->worker_err = st;
        s->worker_busy = 0;
        s->wcv.notify_all();
    }
}

// worker_wait: until the queue is empty and the worker idle; its first error.
enum moe_status worker_wait(cuda *s) {
    std::unique_lock<std::mutex> lk(s->wmu);
    s->wcv.wait(lk, [s] { return s->jobs.empty() && !s->worker_busy; });
    enum moe_status st = s->worker_err;
    s->worker_err = MOE_OK;
    return st;
}

// flush_host: the host works' outputs into their slots (before residual reads them).
enum moe_status flush_host(cuda *s) {
    if (!s->cpu) return MOE_OK;
    const double t0 = now_s();
    enum moe_status st = worker_wait(s);
    s->stats.host_wait_s += now_s() - t0;
    if (st) return st;
    const int64_t n = s->hout_n;
    if (n == 0) return MOE_OK;
    ENQ(cudaMemcpyAsync(s->hpart, s->hout_h, sizeof(float) * (size_t)n * (size_t)s->H, cudaMemcpyHostToDevice, s->cs));
    ENQ(cudaMemcpyAsync(s->hidx, s->hidx_h, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice, s->cs));
    ENQ(cudaMemcpyAsync(s->hidx + s->max_rows, s->hidx_h + s->max_rows, sizeof(int32_t) * (size_t)n,
                       cudaMemcpyHostToDevice, s->cs));
    CU(cudaEventRecord(s->hout_ev, s->cs));
    s->hout_n = 0;
    return launch_scatter_slots(s->part, s->part_used, s->hpart, s->hidx, s->hidx + s->max_rows, (int)n, s->S,
                                (int)s->H, s->cs);
}

// queue_host: a host work for the worker; xn goes to the host once per layer.
enum moe_status queue_host(cuda *s, const moe_expert_work &w) {
    if (!s->cpu) {
        MOE_LOGE("CUDA backend: a host expert without the CPU helper");
        return MOE_ERR_UNSUPPORTED;
    }
    if (!s->xn_host_valid) {
        CU(cudaEventSynchronize(s->hout_ev)); // the last layer's host outputs have left hout
        ENQ(cudaMemcpyAsync(s->xn_h, s->xn, sizeof(float) * (size_t)s->cur_n * (size_t)s->H, cudaMemcpyDeviceToHost,
                           s->cs));
        CU(cudaEventRecord(s->xn_ev, s->cs));
        s->xn_host_valid = 1;
    }
    host_job j;
    j.f = w.f;
    j.rows.assign(w.rows, w.rows + w.n_rows);
    j.slots.assign(w.slots, w.slots + w.n_rows);
    j.w.assign(w.w, w.w + w.n_rows);
    j.out = w.out;
    {
        std::lock_guard<std::mutex> lk(s->wmu);
        s->jobs.push_back(std::move(j));
    }
    s->wcv.notify_all();
    s->stats.host_works++;
    return MOE_OK;
}

// ---- the interface ---------------------------------------------------------------

void cu_buffer_free(moe_backend *be, moe_buffer *buf);

enum moe_status cu_buffer_alloc(moe_backend *be, size_t size, moe_buffer *out) {
    cuda *s = ctx(be);
    memset(out, 0, sizeof *out);
    dev_buf *b = new dev_buf();
    b->size = size ? size : 1;
    enum moe_status st;
    if (moe_gpu_ledger_where(&s->ledger, MOE_GPU_MEM_SLOTS) == MOE_GPU_WHERE_MAPPED) {
        if ((st = pinned_alloc(s, MOE_GPU_MEM_SLOTS, round_up(b->size, 4096), &b->host))) {
            delete b;
            return st;
        }
        void *d = nullptr;
        if (cudaHostGetDevicePointer(&d, b->host, 0) != cudaSuccess) {
            cudaGetLastError();
            cudaFreeHost(b->host);
            delete b;
            MOE_LOGE("CUDA backend: mapped host memory has no device address (no unified addressing?)");
            return MOE_ERR_UNSUPPORTED;
        }
        b->base = (char *)d;
    } else {
        void *d;
        if ((st = dalloc(s, MOE_GPU_MEM_SLOTS, b->size, &d))) {
            delete b;
            return st;
        }
        b->base = (char *)d;
    }
    if (cudaEventCreateWithFlags(&b->ready, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&b->read, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        MOE_LOGE("CUDA backend: cannot create events");
        moe_buffer tmp = {b->base, b->host, b->size, b};
        cu_buffer_free(be, &tmp);
        return MOE_ERR_BACKEND;
    }
    CU(cudaEventRecord(b->ready, s->xs));
    {
        std::lock_guard<std::mutex> lk(s->mu);
        s->bufs[(uintptr_t)b->base] = b;
    }
    out->data = b->base;
    out->host = b->host;
    out->size = size;
    out->priv = b;
    return MOE_OK;
}

void cu_buffer_free(moe_backend *be, moe_buffer *buf) {
    cuda *s = ctx(be);
    if (!buf || !buf->priv) return;
    dev_buf *b = (dev_buf *)buf->priv;
    cudaStreamSynchronize(s->xs);
    cudaStreamSynchronize(s->cs);
    {
        std::lock_guard<std::mutex> lk(s->mu);
        s->bufs.erase((uintptr_t)b->base);
        moe_gpu_ledger_give(&s->ledger, MOE_GPU_MEM_SLOTS, (int64_t)(b->host ? round_up(b->size, 4096) : b->size));
    }
    if (b->host) cudaFreeHost(b->host);
    else cudaFree(b->base);
    cudaEventDestroy(b->ready);
    cudaEventDestroy(b->read);
    delete b;
    memset(buf, 0, sizeof *buf);
}

// copy_in: n bytes from host src to slot b at off, on the copy stream after
// the kernels that read its previous content; waits for the copy (the caller
// reuses src next).
enum moe_status copy_in(cuda *s, dev_buf *b, size_t off, const void *src, size_t n) {
    const double t0 = now_s();
    if (b->has_read) CU(cudaStreamWaitEvent(s->xs, b->read, 0));
    CU(cudaMemcpyAsync(b->base + off, src, n, cudaMemcpyHostToDevice, s->xs));
    CU(cudaEventRecord(b->ready, s->xs));
    CU(cudaEventSynchronize(b->ready));
    std::lock_guard<std::mutex> lk(s->mu);
    s->stats.h2d_copies++;
    s->stats.h2d_bytes += (int64_t)n;
    s->stats.h2d_s += now_s() - t0;
    return MOE_OK;
}

enum moe_status cu_buffer_write(moe_backend *be, moe_buffer *dst, size_t off, const void *src, size_t n) {
    cuda *s = ctx(be);
    if (off > dst->size || n > dst->size - off) return MOE_ERR_RANGE;
    dev_buf *b = (dev_buf *)dst->priv;
    if (dst->host) {
        if ((const char *)dst->host + off != src) memcpy((char *)dst->host + off, src, n);
        return MOE_OK;
    }
    return copy_in(s, b, off, src, n);
}

enum moe_status cu_stage_begin(moe_backend *be, uint64_t key, size_t room, void **host, int *ready) {
    cuda *s = ctx(be);
    if (!s->tier) {
        MOE_LOGE("CUDA backend: no staging (the model is not a bundle)");
        return MOE_ERR_UNSUPPORTED;
    }
    return moe_host_tier_acquire(s->tier, key, room, host, ready);
}

enum moe_status cu_stage_end(moe_backend *be, uint64_t key, void *host, int ok, moe_buffer *dst, size_t n) {
    cuda *s = ctx(be);
    (void)key;
    enum moe_status st = MOE_OK;
    if (ok) {
        if (n > dst->size) st = MOE_ERR_RANGE;
        else st = copy_in(s, (dev_buf *)dst->priv, 0, host, n);
    }
    moe_host_tier_release(s->tier, host, ok && st == MOE_OK);
    return st;
}

enum moe_status cu_embed(moe_backend *be, const int32_t *tokens, int n) {
    cuda *s = ctx(be);
    chunk_close(s);
    s->chunk_n = n;
    dmat e;
    enum moe_status st = dmat_of(s, s->m->tok_embd, &e);
    if (st) return st;
    param_area *a = area_begin(s);
    const int32_t *td = (const int32_t *)area_push(s, a, tokens, sizeof(int32_t) * (size_t)n);
    if (!td) return MOE_ERR_NOMEM;
    if ((st = area_commit(s, a))) return st;
    return launch_embed(e.w, e.type, (int)s->H, td, n, s->x, s->cs);
}

enum moe_status cu_set_x(moe_backend *be, const float *x, int n) {
    cuda *s = ctx(be);
    CU(cudaMemcpyAsync(s->x, x, sizeof(float) * (size_t)n * (size_t)s->H, cudaMemcpyHostToDevice, s->cs));
    CU(cudaStreamSynchronize(s->cs));
    return MOE_OK;
}

enum moe_status cu_get_x(moe_backend *be, float *x, int n) {
    cuda *s = ctx(be);
    CU(cudaMemcpyAsync(x, s->x, sizeof(float) * (size_t)n * (size_t)s->H, cudaMemcpyDeviceToHost, s->cs));
    CU(cudaStreamSynchronize(s->cs));
    return MOE_OK;
}

enum moe_status cu_get_xn(moe_backend *be, float *xn, int n) {
    cuda *s = ctx(be);
    CU(cudaMemcpyAsync(xn, s->xn, sizeof(float) * (size_t)n * (size_t)s->H, cudaMemcpyDeviceToHost, s->cs));
    CU(cudaStreamSynchronize(s->cs));
    return MOE_OK;
}

// attn_jobs: layer L's q, k, v products (J[0..2], from xn) and its o
// product (J[3], added into x) for n rows.
enum moe_status attn_jobs(cuda *s, const moe_layer *L, int n, gemv_job J[4]) {
    dmat wq, wk, wv, wo;
    const float *bq, *bk, *bv, *bo;
    enum moe_status st;
    if ((st = dmat_of(s, L->wq, &wq)) || (st = dmat_of(s, L->wk, &wk)) || (st = dmat_of(s, L->wv, &wv)) ||
        (st = dmat_of(s, L->wo, &wo)) || (st = dvec(s, L->bq, s->q_dim, &bq)) || (st = dvec(s, L->bk, s->kv_dim, &bk)) ||
        (st = dvec(s, L->bv, s->kv_dim, &bv)) || (st = dvec(s, L->bo, s->H, &bo)))
        return st;
    J[0] = make_job(wq, s->xn, s->H, n, s->q, s->q_dim, bq, Y_STORE);
    J[1] = make_job(wk, s->xn, s->H, n, s->k, s->kv_dim, bk, Y_STORE);
    J[2] = make_job(wv, s->xn, s->H, n, s->v, s->kv_dim, bv, Y_STORE);
    J[3] = make_job(wo, s->att, s->q_dim, n, s->x, s->H, bo, Y_ADD);
    return MOE_OK;
}

enum moe_status cu_attention(moe_backend *be, int layer, int pos0, int n, int seq_len) {
    cuda *s = ctx(be);
    const moe_config *c = s->c;
    const moe_layer *L = &s->m->layers[layer];
    enum moe_status st;
    if (s->rope_pos0 != pos0 || s->rope_n != n || s->rope_len != seq_len) {
        if ((st = rope_tables(s, pos0, n, seq_len))) return st;
        s->rope_pos0 = pos0, s->rope_n = n, s->rope_len = seq_len;
    }
    const float *nw, *nb;
    if ((st = dvec(s, L->attn_norm, s->H, &nw)) || (st = dvec(s, L->attn_norm_b, s->H, &nb))) return st;
    if ((st = launch_norm(c->norm == MOE_NORM_LAYER, s->x, nw, nb, n, (int)s->H, c->norm_eps, s->xn, s->cs))) return st;
    gemv_job J[4];
    const float *qn = nullptr, *kn = nullptr;
    if ((st = attn_jobs(s, L, n, J))) return st;
    if (c->qk_norm != MOE_QK_NORM_NONE) {
        const int64_t qn_len = c->qk_norm == MOE_QK_NORM_FULL ? s->q_dim : c->head_dim;
        const int64_t kn_len = c->qk_norm == MOE_QK_NORM_FULL ? s->kv_dim : c->head_dim;
        if ((st = dvec(s, L->q_norm, qn_len, &qn)) || (st = dvec(s, L->k_norm, kn_len, &kn))) return st;
    }
    const std::vector<gemv_job> qkv{J[0], J[1], J[2]};
    if ((st = run_phase(s, area_begin(s), qkv))) return st;
    const size_t lcache = (size_t)layer * (size_t)s->p.n_ctx * (size_t)s->kv_dim;
    qkv_post_args pa = {s->q, s->k, s->v, s->k_cache + lcache, s->v_cache + lcache, qn, kn, (int)c->qk_norm,
                        c->norm_eps, c->clip_qkv, s->cos_d, s->sin_d, n, pos0, c->n_head, c->n_head_kv, c->head_dim,
                        c->rope.n_rot, nullptr};
    if ((st = launch_qkv_post(&pa, s->cs))) return st;
    int n_split = 1; // few queries (decode): split the keys, 256 per split, within the partials' room
    if (n * c->n_head < 4 * s->prop.multiProcessorCount) n_split = attn_splits(pos0 + n, s->max_split / n);
    attn_args aa = {s->q, s->k_cache + lcache, s->v_cache + lcache, s->att, s->pm, s->pl, s->pacc, n, pos0,
                    c->n_head, c->n_head_kv, c->head_dim, c->layer_sliding[layer] ? c->sliding_window : 0, n_split,
                    nullptr};
    if ((st = launch_attention(&aa, s->cs))) return st;
    return run_phase(s, area_begin(s), {J[3]});
}

enum moe_status cu_ffn_norm(moe_backend *be, int layer, int n) {
    cuda *s = ctx(be);
    const moe_layer *L = &s->m->layers[layer];
    const float *nw, *nb;
    enum moe_status st;
    if ((st = dvec(s, L->ffn_norm, s->H, &nw)) || (st = dvec(s, L->ffn_norm_b, s->H, &nb))) return st;
    if ((st = launch_norm(s->c->norm == MOE_NORM_LAYER, s->x, nw, nb, n, (int)s->H, s->c->norm_eps, s->xn, s->cs)))
        return st;
    ENQ(cudaMemsetAsync(s->acc, 0, sizeof(float) * (size_t)n * (size_t)s->H, s->cs));
    ENQ(cudaMemsetAsync(s->part_used, 0, (size_t)n * (size_t)s->S, s->cs));
    s->shared_pending = 0;
    s->cur_n = n;
    s->xn_host_valid = 0;
    return MOE_OK;
}

enum moe_status cu_router(moe_backend *be, int layer, int n, float *logits) {
    cuda *s = ctx(be);
    const int E = s->c->n_expert;
    enum moe_status st = matmul(s, s->m->layers[layer].router, nullptr, s->xn, s->H, n, s->logits, E, Y_STORE);
    if (st) return st;
    ENQ(cudaMemcpyAsync(s->logits_h, s->logits, sizeof(float) * (size_t)n * E, cudaMemcpyDeviceToHost, s->cs));
    CU(cudaStreamSynchronize(s->cs));
    memcpy(logits, s->logits_h, sizeof(float) * (size_t)n * E);
    return MOE_OK;
}

enum moe_status cu_expert_batch(moe_backend *be, const moe_expert_work *works, int n) {
    cuda *s = ctx(be);
    enum moe_status st;
    s->stats.batch_calls++;
    int any_out = 0, any_mapped = 0, host_out = 0;
    for (int i = 0; i < n; i++)
        if (works[i].host) {
            if ((st = queue_host(s, works[i]))) return st;
            host_out |= works[i].out != nullptr;
        }
    param_area *a = area_begin(s);
    std::vector<gemv_job> gu, dn;
    std::vector<dev_buf *> used;
    int64_t hoff = 0;
    for (int i = 0; i < n; i++) {
        const moe_expert_work &w = works[i];
        if (w.host || w.n_rows <= 0) continue;
        if (w.f.bias) {
            MOE_LOGE("CUDA backend: expert biases are not supported");
            return MOE_ERR_UNSUPPORTED;
        }
        dmat g, u, d;
        if ((st = dmat_of(s, w.f.gate, &g)) || (st = dmat_of(s, w.f.up, &u)) || (st = dmat_of(s, w.f.down, &d))) return st;
        if (g.type != u.type || g.n_out != u.n_out || g.n_in != u.n_in || d.n_in != g.n_out || d.n_out != s->H) {
            MOE_LOGE("CUDA backend: an expert's matrices do not fit together");
            return MOE_ERR_SHAPE;
        }
        if (hoff + w.n_rows > s->max_rows || (int64_t)g.n_out > s->max_ff) {
            MOE_LOGE("CUDA backend: %lld expert rows in one step (room for %lld)", (long long)(hoff + w.n_rows),
                     (long long)s->max_rows);
            return MOE_ERR_RANGE;
        }
        const int32_t *rows = (const int32_t *)area_push(s, a, w.rows, sizeof(int32_t) * (size_t)w.n_rows);
        const int32_t *slots = (const int32_t *)area_push(s, a, w.slots, sizeof(int32_t) * (size_t)w.n_rows);
        const float *wt = (const float *)area_push(s, a, w.w, sizeof(float) * (size_t)w.n_rows);
        if (!rows || !slots || !wt) {
            MOE_LOGE("CUDA backend: parameter area too small");
            return MOE_ERR_NOMEM;
        }
        float *h = s->hbuf + hoff * s->max_ff;
        gemv_job j1 = make_job(g, s->xn, s->H, w.n_rows, h, g.n_out, nullptr, Y_SWIGLU);
        j1.w2 = u.w, j1.xrow = rows;
        gemv_job j2 = make_job(d, h, g.n_out, w.n_rows, s->part, s->H, nullptr, Y_STORE);
        j2.yrow = rows, j2.yslot = slots, j2.n_slots = s->S, j2.yw = wt, j2.used = s->part_used;
        if (w.out) j2.y2 = s->eout + hoff * s->H, j2.ldy2 = s->H, any_out = 1;
        gu.push_back(j1);
        dn.push_back(j2);
        hoff += w.n_rows;
        for (dev_buf *b : {g.buf, u.buf, d.buf}) {
            if (!b) continue;
            used.push_back(b);
            any_mapped |= b->host != nullptr;
            if ((st = wait_buf(s, b))) return st;
        }
        s->stats.device_works++;
    }
    if (!gu.empty()) {
        // the second phase's array goes into the same area, pushed before the commit
        std::vector<gemv_job> small_dn;
        for (const gemv_job &j : dn)
            if (j.n_tok < MOE_CUDA_GEMM_MIN_TOK) small_dn.push_back(j);
        const gemv_job *dn_d = nullptr;
        if (!small_dn.empty() &&
            !(dn_d = (const gemv_job *)area_push(s, a, small_dn.data(), small_dn.size() * sizeof(gemv_job)))) {
            MOE_LOGE("CUDA backend: parameter area too small");
            return MOE_ERR_NOMEM;
        }
        if ((st = run_phase(s, a, gu))) return st;
        int max_out = 0, max_tok = 0;
        for (const gemv_job &j : small_dn) max_out = std::max(max_out, j.n_out), max_tok = std::max(max_tok, j.n_tok);
        if (!small_dn.empty() && (st = launch_gemv(dn_d, (int)small_dn.size(), max_out, max_tok, s->cs))) return st;
        for (const gemv_job &j : dn)
            if (j.n_tok >= MOE_CUDA_GEMM_MIN_TOK && (st = run_gemm(&j, &s->gemm, s->cs))) return st;
        for (dev_buf *b : used)
            if ((st = read_buf(s, b))) return st;
    } else if ((st = area_commit(s, a))) {
        return st;
    }
    if (any_out) { // observers: the unweighted outputs, in work order
        CU(cudaStreamSynchronize(s->cs));
        int64_t off = 0;
        for (int i = 0; i < n; i++) {
            if (works[i].host || works[i].n_rows <= 0) continue;
            if (works[i].out)
                CU(cudaMemcpy(works[i].out, s->eout + off * s->H, sizeof(float) * (size_t)works[i].n_rows * (size_t)s->H,
                              cudaMemcpyDeviceToHost));
            off += works[i].n_rows;
        }
    }
    // mapped (UMA) slots are written by the store's loaders directly: once the
    // session releases them they may be overwritten, so the kernels must be done
    if (any_mapped) CU(cudaStreamSynchronize(s->cs));
    if (host_out && (st = worker_wait(s))) return st;
    return MOE_OK;
}

enum moe_status cu_expert(moe_backend *be, const moe_ffn *f, const int32_t *rows, const int32_t *slots, const float *w,
                          int n_rows, float *out) {
    moe_expert_work wk = {*f, rows, slots, w, n_rows, 0, out};
    return cu_expert_batch(be, &wk, 1);
}

enum moe_status cu_dense(moe_backend *be, int layer, int n) {
    cuda *s = ctx(be);
    const moe_config *c = s->c;
    const moe_layer *L = &s->m->layers[layer];
    if (!c->layer_moe[layer]) return ffn_dev(s, L->dense, s->xn, n, s->acc, Y_STORE);
    if (c->n_ff_shared <= 0) return MOE_OK;
    enum moe_status st = c->shared_gated ? matmul(s, L->shared_gate, nullptr, s->xn, s->H, n, s->sg, 1, Y_STORE) : MOE_OK;
    if (st || (st = ffn_dev(s, L->shared, s->xn, n, s->tmp, Y_STORE))) return st;
    s->shared_pending = 1;
    return MOE_OK;
}

enum moe_status cu_residual(moe_backend *be, int n) {
    cuda *s = ctx(be);
    enum moe_status st = flush_host(s);
    if (st) return st;
    st = launch_residual(s->x, s->acc, s->part, s->part_used, s->shared_pending && s->c->shared_gated ? s->sg : nullptr,
                         s->shared_pending ? s->tmp : nullptr, n, s->S, (int)s->H, s->cs);
    s->shared_pending = 0;
    return st;
}

// lm_head_dev: logits of n rows of x (device) to host, in chunks of logits_rows.
enum moe_status lm_head_dev(cuda *s, const float *x, int n, float *logits) {
    const moe_model *m = s->m;
    const int V = s->c->n_vocab;
    const float *nw, *nb;
    enum moe_status st;
    if ((st = dvec(s, m->out_norm, s->H, &nw)) || (st = dvec(s, m->out_norm_b, s->H, &nb))) return st;
    if ((st = launch_norm(s->c->norm == MOE_NORM_LAYER, x, nw, nb, n, (int)s->H, s->c->norm_eps, s->xn, s->cs))) return st;
    for (int done = 0; done < n;) {
        const int c = n - done < s->logits_rows ? n - done : (int)s->logits_rows;
        if ((st = matmul(s, m->lm_head, m->lm_head_b, s->xn + (size_t)done * s->H, s->H, c, s->logits, V, Y_STORE)))
            return st;
        ENQ(cudaMemcpyAsync(s->logits_h, s->logits, sizeof(float) * (size_t)c * V, cudaMemcpyDeviceToHost, s->cs));
        CU(cudaStreamSynchronize(s->cs));
        memcpy(logits + (size_t)done * V, s->logits_h, sizeof(float) * (size_t)c * V);
        done += c;
    }
    return MOE_OK;
}

enum moe_status cu_lm_head(moe_backend *be, int row0, int n, float *logits) {
    cuda *s = ctx(be);
    return lm_head_dev(s, s->x + (size_t)row0 * s->H, n, logits);
}

enum moe_status cu_lm_head_rows(moe_backend *be, const float *x, int n, float *logits) {
    cuda *s = ctx(be);
    CU(cudaMemcpyAsync(s->tmp, x, sizeof(float) * (size_t)n * (size_t)s->H, cudaMemcpyHostToDevice, s->cs));
    return lm_head_dev(s, s->tmp, n, logits);
}

enum moe_status cu_ffn_rows(moe_backend *be, const moe_ffn *f, const float *x, float *y, int n) {
    cuda *s = ctx(be);
    const size_t bytes = sizeof(float) * (size_t)n * (size_t)s->H;
    CU(cudaMemcpyAsync(s->tmp, x, bytes, cudaMemcpyHostToDevice, s->cs));
    enum moe_status st = ffn_dev(s, *f, s->tmp, n, s->att /* [B x max(q_dim, H)] */, Y_STORE);
    if (st) return st;
    CU(cudaMemcpyAsync(y, s->att, bytes, cudaMemcpyDeviceToHost, s->cs));
    CU(cudaStreamSynchronize(s->cs));
    return MOE_OK;
}

// ---- Twiddler: the latency table ----------------------------------------------------

// lat_key: what the table is valid for: device, CPU threads, the experts' shapes and types.
std::string lat_key(cuda *s) {
    char buf[MOE_LAT_KEY_MAX];
    int n = snprintf(buf, sizeof buf, "cuda %s sm_%d%d uma %d | cpu %d threads | H %lld F %d |", s->prop.name,
                     s->prop.major, s->prop.minor, s->ledger.uma, s->p.n_threads, (long long)s->H, s->c->n_ff_expert);
    const moe_bundle *b = s->m->bundle;
    for (int p = 0; b && p < s->m->n_expert_prec && n > 0 && n < (int)sizeof buf; p++) {
        const moe_bundle_precision *d = moe_bundle_precision_at(b, (uint32_t)p);
        n += snprintf(buf + n, sizeof buf - (size_t)n, " %s", d ? d->name : "?");
    }
    return std::string(buf);
}

// median of a few timings
double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// measure_prec: one expert's transfer, GPU and CPU times at stored precision p.
enum moe_status measure_prec(cuda *s, int p, moe_lat_entry *e) {
    const moe_config *c = s->c;
    int l0 = 0;
    while (l0 < c->n_layer && !c->layer_moe[l0]) l0++;
    moe_ffn f;
    enum moe_status st = moe_model_expert(s->m, l0, 0, p, &f);
    if (st) return st;
    memset(e, 0, sizeof *e);
    e->prec = p;
    const size_t parts[3] = {weight_bytes(f.gate), weight_bytes(f.up), weight_bytes(f.down)};
    const size_t bytes = parts[0] + parts[1] + parts[2];
    e->bytes = (int64_t)bytes;
    // a device copy of the expert (outside the ledger: freed below)
    char *dbuf = nullptr, *hbuf = nullptr;
    float *xd = nullptr;
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    const int smax = s->p.n_batch < 256 ? s->p.n_batch : 256;
    st = MOE_ERR_BACKEND;
    if (cudaMalloc((void **)&dbuf, bytes) != cudaSuccess || cudaHostAlloc((void **)&hbuf, bytes, cudaHostAllocPortable) ||
        cudaMalloc((void **)&xd, sizeof(float) * (size_t)smax * (size_t)s->H) != cudaSuccess) {
        cudaGetLastError();
        MOE_LOGE("CUDA backend: no memory to measure the latency table");
        goto done;
    }
    {
        size_t off = 0;
        const moe_weight *w3[3] = {&f.gate, &f.up, &f.down};
        moe_ffn fd = f;
        moe_weight *d3[3] = {&fd.gate, &fd.up, &fd.down};
        for (int k = 0; k < 3; k++) {
            memcpy(hbuf + off, w3[k]->data, parts[k]);
            d3[k]->data = dbuf + off;
            off += parts[k];
        }
        // transfer: pinned host -> device, the median of 5 (0 with unified memory: nothing is copied)
        std::vector<double> ts;
        for (int r = 0; r < 6; r++) {
            cudaEventRecord(e0, s->xs);
            cudaMemcpyAsync(dbuf, hbuf, bytes, cudaMemcpyHostToDevice, s->xs);
            cudaEventRecord(e1, s->xs);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (r) ts.push_back(ms * 1e-3);
        }
        e->transfer_s = s->ledger.uma ? 0.0 : median(ts);
        // register the copy as a slot so ffn_dev reads it in place
        dev_buf tb = {};
        tb.base = dbuf, tb.size = bytes;
        cudaEventCreateWithFlags(&tb.ready, cudaEventDisableTiming);
        cudaEventCreateWithFlags(&tb.read, cudaEventDisableTiming);
        cudaEventRecord(tb.ready, s->xs);
        {
            std::lock_guard<std::mutex> lk(s->mu);
            s->bufs[(uintptr_t)tb.base] = &tb;
        }
        std::vector<float> xr((size_t)smax * (size_t)s->H);
        for (size_t i = 0; i < xr.size(); i++) xr[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        cudaMemcpyAsync(xd, xr.data(), sizeof(float) * xr.size(), cudaMemcpyHostToDevice, s->cs);
        st = MOE_OK;
        for (int sn = 1; sn <= smax && !st; sn *= 2) { // GPU: median of 3 after a warm-up
            ts.clear();
            for (int r = 0; r < 4 && !st; r++) {
                cudaEventRecord(e0, s->cs);
                st = ffn_dev(s, fd, xd, sn, s->tmp, Y_STORE);
                cudaEventRecord(e1, s->cs);
                cudaEventSynchronize(e1);
                float ms = 0;
                cudaEventElapsedTime(&ms, e0, e1);
                if (r) ts.push_back(ms * 1e-3);
            }
            if (!st) moe_lat_curve_add(&e->gpu, sn, median(ts) > 1e-9 ? median(ts) : 1e-9);
        }
        cudaStreamSynchronize(s->cs);
        {
            std::lock_guard<std::mutex> lk(s->mu);
            s->bufs.erase((uintptr_t)tb.base);
        }
        cudaEventDestroy(tb.ready);
        cudaEventDestroy(tb.read);
        // CPU: the helper backend over the mapped copy, up to 32 tokens (beyond: extrapolated)
        std::vector<float> yr((size_t)smax * (size_t)s->H);
        for (int sn = 1; sn <= smax && sn <= 32 && !st; sn *= 2) {
            ts.clear();
            for (int r = 0; r < (sn <= 4 ? 4 : 2) && !st; r++) {
                const double t0 = now_s();
                st = s->cpu->iface->ffn_rows(s->cpu, &f, xr.data(), yr.data(), sn);
                if (r || sn > 4) ts.push_back(now_s() - t0);
            }
            if (!st) moe_lat_curve_add(&e->cpu, sn, median(ts) > 1e-9 ? median(ts) : 1e-9);
        }
    }
done:
    if (dbuf) cudaFree(dbuf);
    if (hbuf) cudaFreeHost(hbuf);
    if (xd) cudaFree(xd);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return st;
}

// ensure_lat: the latency table, from the cache file or measured (then cached).
void ensure_lat(cuda *s) {
    if (s->lat_state >= 0 || s->lat_failed) return;
    const std::string key = lat_key(s);
    char path[4096];
    const int have_path = moe_lat_cache_path(key.c_str(), path, sizeof path) == MOE_OK;
    const int n_prec = std::min(s->m->n_expert_prec, MOE_LAT_MAX_PREC);
    if (have_path && !s->g.recalibrate && moe_lat_table_read(path, &s->lat) == MOE_OK && key == s->lat.key &&
        s->lat.n == n_prec) {
        s->lat_state = 0;
        s->stats.lat_measured = 0;
        return;
    }
    memset(&s->lat, 0, sizeof s->lat);
    snprintf(s->lat.key, sizeof s->lat.key, "%s", key.c_str());
    const double t0 = now_s();
    for (int p = 0; p < n_prec; p++) {
        if (measure_prec(s, p, &s->lat.e[p])) {
            MOE_LOGW("CUDA backend: could not measure the latency of precision %d; experts stay on the GPU", p);
            s->lat_failed = 1;
            return;
        }
        s->lat.n = p + 1;
    }
    MOE_LOGI("CUDA backend: latency table measured in %.2f s%s%s", now_s() - t0, have_path ? ", cached in " : "",
             have_path ? path : "");
    if (have_path && moe_lat_table_write(&s->lat, path) != MOE_OK) MOE_LOGW("cannot cache the latency table in %s", path);
    s->lat_state = 1;
    s->stats.lat_measured = 1;
}

void cu_place(moe_backend *be, int layer, int n, const int32_t *tokens, const int32_t *prec, const uint8_t *resident,
              uint8_t *host) {
    cuda *s = ctx(be);
    (void)layer;
    memset(host, 0, (size_t)n);
    s->stats.placed += n;
    if (s->g.cpu_experts == MOE_CPU_EXPERTS_NEVER || !s->cpu) return;
    if (s->g.cpu_experts == MOE_CPU_EXPERTS_AUTO) ensure_lat(s);
    std::vector<moe_twiddler_item> items((size_t)n);
    for (int i = 0; i < n; i++)
        items[(size_t)i] = {tokens[i], resident[i], s->lat_state >= 0 ? moe_lat_table_find(&s->lat, prec[i]) : nullptr};
    moe_twiddler_time t;
    moe_twiddler_plan(s->g.cpu_experts, n, items.data(), host, &t);
    s->stats.model_layer_s += t.layer_s;
    for (int i = 0; i < n; i++) s->stats.placed_host += host[i];
}

size_t cu_kv_cache_bytes(moe_backend *be) {
    cuda *s = ctx(be);
    return 2 * sizeof(float) * (size_t)s->c->n_layer * (size_t)s->p.n_ctx * (size_t)s->kv_dim;
}

// ---- decode steps as one graph (moe-graph.h) --------------------------------------
//
// A one-token step with every expert resident, captured once from the plan's
// operations (moe_graph_plan) and replayed: the step's inputs (token,
// position, RoPE row) are one copy from pinned memory at the graph's start;
// the kernels that depend on the position read it from the device (qkv_post,
// attention: its grid holds the most splits, the kernels use as many as the
// op-by-op path would); the router's logits are routed on the device and each
// routed expert's GEMV jobs are filled from the layer's table of templates
// (expert_jobs_kernel), so a new routing needs neither a new capture nor a
// node update. Same kernels, same jobs, same order as the op-by-op path; only
// the routing runs on the device (its expf may differ from the host's in the
// last bit, so the gate weights, and through them the logits, may differ by
// rounding). Recaptured when the expert table's generation or top-k changes.

constexpr int GRAPH_JOBS = 8; // per layer: q, k, v, o, router, shared gate, MLP gate/up, MLP down

void graph_drop(cuda *s) {
    if (s->gr.exec) cudaGraphExecDestroy(s->gr.exec);
    if (s->gr.graph) cudaGraphDestroy(s->gr.graph);
    s->gr.exec = nullptr, s->gr.graph = nullptr, s->gr.ready = 0;
}

// graph_buffers: the graph's own device and pinned buffers, for top-k up to k (made once per k growth).
enum moe_status graph_buffers(cuda *s, int k) {
    const moe_config *c = s->c;
    if (s->gr.step_d && k <= s->gr.cap_k) return MOE_OK;
    if (s->gr.step_d) {
        MOE_LOGW("CUDA graphs: top-%d after top-%d needs new buffers; decode steps run op by op", k, s->gr.cap_k);
        return MOE_ERR_UNSUPPORTED;
    }
    int n_moe = 0;
    for (int l = 0; l < c->n_layer; l++) n_moe += c->layer_moe[l] != 0;
    const int half = c->rope.n_rot / 2;
    enum moe_status st;
    s->gr.step_bytes = round_up(16 + sizeof(float) * 2 * (size_t)half, 16);
    void *h;
    if ((st = state_alloc(s, &s->gr.step_d, (int64_t)s->gr.step_bytes)) ||
        (st = pinned_alloc(s, MOE_GPU_MEM_STAGING, s->gr.step_bytes, &h)))
        return st;
    s->gr.step_h = (char *)h;
    const int64_t rb = (int64_t)(n_moe ? n_moe : 1) * k * 8;
    if ((st = state_alloc(s, &s->gr.jobs, (int64_t)c->n_layer * GRAPH_JOBS + 1)) ||
        (st = state_alloc(s, &s->gr.tmpl, 2 * (int64_t)c->n_layer * c->n_expert)) ||
        (st = state_alloc(s, &s->gr.ejobs, (int64_t)(n_moe ? n_moe : 1) * 2 * k)) ||
        (st = state_alloc(s, &s->gr.routes_d, rb)) || (st = state_alloc(s, &s->gr.slots, (int64_t)(n_moe ? n_moe : 1) * k)) ||
        (st = state_alloc(s, &s->gr.zero, 1)) || (st = pinned_alloc(s, MOE_GPU_MEM_STAGING, (size_t)rb, &h)))
        return st;
    s->gr.routes_h = (char *)h;
    s->gr.cap_k = k;
    return MOE_OK;
}

// graph_tables: every expert of the table on the device, and the jobs the capture reads (host work; may sync).
enum moe_status graph_tables(cuda *s, const moe_step_desc *d) {
    const moe_model *m = s->m;
    const moe_config *c = s->c;
    const int E = c->n_expert;
    enum moe_status st;
    { // everything the capture looks up is on the device before it starts (an upload there is not allowed)
        dmat e;
        const float *v;
        if ((st = dmat_of(s, m->tok_embd, &e)) || (st = dvec(s, m->out_norm, s->H, &v)) ||
            (st = dvec(s, m->out_norm_b, s->H, &v)))
            return st;
        for (int l = 0; l < c->n_layer; l++) {
            const moe_layer *L = &m->layers[l];
            if ((st = dvec(s, L->attn_norm, s->H, &v)) || (st = dvec(s, L->attn_norm_b, s->H, &v)) ||
                (st = dvec(s, L->ffn_norm, s->H, &v)) || (st = dvec(s, L->ffn_norm_b, s->H, &v)))
                return st;
            if (c->qk_norm != MOE_QK_NORM_NONE &&
                ((st = dvec(s, L->q_norm, c->qk_norm == MOE_QK_NORM_FULL ? s->q_dim : c->head_dim, &v)) ||
                 (st = dvec(s, L->k_norm, c->qk_norm == MOE_QK_NORM_FULL ? s->kv_dim : c->head_dim, &v))))
                return st;
        }
    }
    std::vector<gemv_job> jobs((size_t)c->n_layer * GRAPH_JOBS + 1), tmpl(2 * (size_t)c->n_layer * E);
    s->gr.ff_max.assign((size_t)c->n_layer, 0);
    memset(jobs.data(), 0, jobs.size() * sizeof(gemv_job));
    memset(tmpl.data(), 0, tmpl.size() * sizeof(gemv_job));
    for (int l = 0; l < c->n_layer; l++) {
        const moe_layer *L = &m->layers[l];
        gemv_job *J = &jobs[(size_t)l * GRAPH_JOBS];
        if ((st = attn_jobs(s, L, 1, J))) return st;
        const moe_ffn *mlp = nullptr;
        float *mlp_out = s->acc;
        if (c->layer_moe[l]) {
            dmat r;
            if ((st = dmat_of(s, L->router, &r))) return st;
            J[4] = make_job(r, s->xn, s->H, 1, s->logits, E, nullptr, Y_STORE);
            if (c->n_ff_shared > 0) {
                mlp = &L->shared, mlp_out = s->tmp;
                if (c->shared_gated) {
                    dmat sgw;
                    if ((st = dmat_of(s, L->shared_gate, &sgw))) return st;
                    J[5] = make_job(sgw, s->xn, s->H, 1, s->sg, 1, nullptr, Y_STORE);
                }
            }
            for (int e = 0; e < E; e++) {
                const moe_ffn &f = d->experts[(size_t)l * E + e];
                dmat g, u, dn;
                if (f.bias) {
                    MOE_LOGW("CUDA graphs: expert biases are not supported; decode steps run op by op");
                    return MOE_ERR_UNSUPPORTED;
                }
                if ((st = dmat_of(s, f.gate, &g)) || (st = dmat_of(s, f.up, &u)) || (st = dmat_of(s, f.down, &dn)))
                    return st;
                if (g.buf || u.buf || dn.buf || g.type != u.type || g.n_out != u.n_out || dn.n_in != g.n_out ||
                    dn.n_out != s->H || (int64_t)g.n_out > s->max_ff) {
                    MOE_LOGW("CUDA graphs: expert %d of layer %d is in a store slot or does not fit; decode steps run "
                             "op by op", e, l);
                    return MOE_ERR_UNSUPPORTED;
                }
                gemv_job gu = make_job(g, s->xn, s->H, 1, nullptr, g.n_out, nullptr, Y_SWIGLU);
                gu.w2 = u.w, gu.xrow = s->gr.zero;
                gemv_job dj = make_job(dn, nullptr, g.n_out, 1, s->part, s->H, nullptr, Y_STORE);
                dj.yrow = s->gr.zero, dj.n_slots = s->S, dj.used = s->part_used;
                tmpl[(size_t)l * E + e] = gu;
                tmpl[((size_t)c->n_layer + l) * E + e] = dj;
                s->gr.ff_max[(size_t)l] = std::max(s->gr.ff_max[(size_t)l], g.n_out);
            }
        } else {
            mlp = &L->dense;
        }
        if (mlp && (st = ffn_jobs(s, *mlp, s->xn, 1, mlp_out, Y_STORE, &J[6], &J[7], nullptr))) return st;
    }
    dmat lm;
    const float *lb;
    if ((st = dmat_of(s, m->lm_head, &lm)) || (st = dvec(s, m->lm_head_b, c->n_vocab, &lb))) return st;
    jobs[(size_t)c->n_layer * GRAPH_JOBS] = make_job(lm, s->xn, s->H, 1, s->logits, c->n_vocab, lb, Y_STORE);
    CU(cudaMemcpyAsync(s->gr.jobs, jobs.data(), jobs.size() * sizeof(gemv_job), cudaMemcpyHostToDevice, s->cs));
    CU(cudaMemcpyAsync(s->gr.tmpl, tmpl.data(), tmpl.size() * sizeof(gemv_job), cudaMemcpyHostToDevice, s->cs));
    CU(cudaStreamSynchronize(s->cs)); // the host vectors go away
    return MOE_OK;
}

// graph_emit: the plan's operations on the compute stream (being captured).
enum moe_status graph_emit(cuda *s, int k) {
    const moe_model *m = s->m;
    const moe_config *c = s->c;
    const int E = c->n_expert, half = c->rope.n_rot / 2;
    const int nops = moe_graph_plan(c, nullptr, 0);
    std::vector<moe_graph_op> ops((size_t)nops);
    moe_graph_plan(c, ops.data(), nops);
    const int32_t *tok_d = (const int32_t *)s->gr.step_d, *pos_d = (const int32_t *)(s->gr.step_d + 4);
    const float *cs_d = (const float *)(s->gr.step_d + 16), *sn_d = cs_d + half;
    int32_t *sel_d = (int32_t *)s->gr.routes_d;
    int n_moe = 0;
    for (int l = 0; l < c->n_layer; l++) n_moe += c->layer_moe[l] != 0;
    float *w_d = (float *)(s->gr.routes_d + sizeof(int32_t) * (size_t)n_moe * k);
    const int cap_split = c->n_head < 4 * s->prop.multiProcessorCount ? s->max_split : 1;
    const int is_layer_norm = c->norm == MOE_NORM_LAYER;
    enum moe_status st = MOE_OK;
    int ml = -1;
    for (const moe_graph_op &op : ops) {
        const int l = op.layer;
        const moe_layer *L = l >= 0 ? &m->layers[l] : nullptr;
        const gemv_job *J = l >= 0 ? s->gr.jobs + (size_t)l * GRAPH_JOBS : nullptr;
        const float *nw = nullptr, *nb = nullptr;
        const size_t lcache = l >= 0 ? (size_t)l * (size_t)s->p.n_ctx * (size_t)s->kv_dim : 0;
        switch (op.kind) {
        case MOE_GOP_STEP_IN:
            ENQ(cudaMemcpyAsync(s->gr.step_d, s->gr.step_h, s->gr.step_bytes, cudaMemcpyHostToDevice, s->cs));
            break;
        case MOE_GOP_EMBED: {
            dmat e;
            if (!(st = dmat_of(s, m->tok_embd, &e))) st = launch_embed(e.w, e.type, (int)s->H, tok_d, 1, s->x, s->cs);
            break;
        }
        case MOE_GOP_ATTN_NORM:
            if (!(st = dvec(s, L->attn_norm, s->H, &nw)) && !(st = dvec(s, L->attn_norm_b, s->H, &nb)))
                st = launch_norm(is_layer_norm, s->x, nw, nb, 1, (int)s->H, c->norm_eps, s->xn, s->cs);
            break;
        case MOE_GOP_QKV: st = launch_gemv(J, 3, (int)std::max(s->q_dim, s->kv_dim), 1, s->cs); break;
        case MOE_GOP_QKV_POST: {
            const float *qn = nullptr, *kn = nullptr;
            if (c->qk_norm != MOE_QK_NORM_NONE) {
                const int64_t qn_len = c->qk_norm == MOE_QK_NORM_FULL ? s->q_dim : c->head_dim;
                const int64_t kn_len = c->qk_norm == MOE_QK_NORM_FULL ? s->kv_dim : c->head_dim;
                if ((st = dvec(s, L->q_norm, qn_len, &qn)) || (st = dvec(s, L->k_norm, kn_len, &kn))) break;
            }
            qkv_post_args pa = {s->q, s->k, s->v, s->k_cache + lcache, s->v_cache + lcache, qn, kn, (int)c->qk_norm,
                                c->norm_eps, c->clip_qkv, cs_d, sn_d, 1, 0, c->n_head, c->n_head_kv, c->head_dim,
                                c->rope.n_rot, pos_d};
            st = launch_qkv_post(&pa, s->cs);
            break;
        }
        case MOE_GOP_ATTN: { // the partials and the combine (two nodes; the plan's ATTN_COMBINE is the second)
            attn_args aa = {s->q, s->k_cache + lcache, s->v_cache + lcache, s->att, s->pm, s->pl, s->pacc, 1, 0,
                            c->n_head, c->n_head_kv, c->head_dim, c->layer_sliding[l] ? c->sliding_window : 0,
                            cap_split, pos_d};
            st = launch_attention(&aa, s->cs);
            break;
        }
        case MOE_GOP_ATTN_COMBINE: break;
        case MOE_GOP_O_PROJ: st = launch_gemv(J + 3, 1, (int)s->H, 1, s->cs); break;
        case MOE_GOP_FFN_NORM:
            if (!(st = dvec(s, L->ffn_norm, s->H, &nw)) && !(st = dvec(s, L->ffn_norm_b, s->H, &nb)))
                st = launch_norm(is_layer_norm, s->x, nw, nb, 1, (int)s->H, c->norm_eps, s->xn, s->cs);
            break;
        case MOE_GOP_CLEAR_ACC: ENQ(cudaMemsetAsync(s->acc, 0, sizeof(float) * (size_t)s->H, s->cs)); break;
        case MOE_GOP_CLEAR_USED: ENQ(cudaMemsetAsync(s->part_used, 0, (size_t)s->S, s->cs)); break;
        case MOE_GOP_ROUTER:
            ml++;
            st = launch_gemv(J + 4, 1, E, 1, s->cs);
            break;
        case MOE_GOP_ROUTE:
            st = launch_route(s->logits, 1, E, k, c->router == MOE_ROUTER_SPARSEMIXER, c->norm_topk_prob,
                              c->router_jitter, c->routed_scale, sel_d + (size_t)ml * k, w_d + (size_t)ml * k, s->cs);
            break;
        case MOE_GOP_EXPERT_JOBS: {
            expert_jobs_args ea = {s->gr.tmpl + (size_t)l * E, s->gr.tmpl + ((size_t)c->n_layer + l) * E,
                                   sel_d + (size_t)ml * k, w_d + (size_t)ml * k, s->gr.slots + (size_t)ml * k,
                                   s->gr.ejobs + (size_t)ml * 2 * k, s->gr.ejobs + (size_t)ml * 2 * k + k, s->hbuf,
                                   s->max_ff, k};
            st = launch_expert_jobs(&ea, s->cs);
            break;
        }
        case MOE_GOP_EXPERT_GATE_UP:
            st = launch_gemv(s->gr.ejobs + (size_t)ml * 2 * k, k, s->gr.ff_max[(size_t)l], 1, s->cs);
            break;
        case MOE_GOP_EXPERT_DOWN: st = launch_gemv(s->gr.ejobs + (size_t)ml * 2 * k + k, k, (int)s->H, 1, s->cs); break;
        case MOE_GOP_SHARED_GATE: st = launch_gemv(J + 5, 1, 1, 1, s->cs); break;
        case MOE_GOP_SHARED_GATE_UP:
        case MOE_GOP_DENSE_GATE_UP:
            st = launch_gemv(J + 6, 1, op.kind == MOE_GOP_SHARED_GATE_UP ? c->n_ff_shared : c->n_ff_dense, 1, s->cs);
            break;
        case MOE_GOP_SHARED_DOWN:
        case MOE_GOP_DENSE_DOWN: st = launch_gemv(J + 7, 1, (int)s->H, 1, s->cs); break;
        case MOE_GOP_RESIDUAL: {
            const int sh = c->layer_moe[l] && c->n_ff_shared > 0;
            st = launch_residual(s->x, s->acc, s->part, s->part_used, sh && c->shared_gated ? s->sg : nullptr,
                                 sh ? s->tmp : nullptr, 1, s->S, (int)s->H, s->cs);
            break;
        }
        case MOE_GOP_OUT_NORM:
            if (!(st = dvec(s, m->out_norm, s->H, &nw)) && !(st = dvec(s, m->out_norm_b, s->H, &nb)))
                st = launch_norm(is_layer_norm, s->x, nw, nb, 1, (int)s->H, c->norm_eps, s->xn, s->cs);
            break;
        case MOE_GOP_LM_HEAD:
            st = launch_gemv(s->gr.jobs + (size_t)c->n_layer * GRAPH_JOBS, 1, c->n_vocab, 1, s->cs);
            break;
        case MOE_GOP_LOGITS_OUT:
            ENQ(cudaMemcpyAsync(s->logits_h, s->logits, sizeof(float) * (size_t)c->n_vocab, cudaMemcpyDeviceToHost,
                                s->cs));
            break;
        case MOE_GOP_ROUTES_OUT:
            ENQ(cudaMemcpyAsync(s->gr.routes_h, s->gr.routes_d, (sizeof(int32_t) + sizeof(float)) * (size_t)n_moe * k,
                                cudaMemcpyDeviceToHost, s->cs));
            break;
        default: MOE_LOGE("CUDA graphs: operation %d unknown", (int)op.kind); return MOE_ERR_BACKEND;
        }
        if (st) return st;
    }
    return MOE_OK;
}

// graph_build: tables, capture, instantiation; MOE_ERR_UNSUPPORTED (logged once) when it cannot be done.
enum moe_status graph_build(cuda *s, const moe_step_desc *d) {
    graph_drop(s);
    enum moe_status st = graph_buffers(s, d->k);
    if (!st) st = graph_tables(s, d);
    if (st) { // whatever it was (logged), the op-by-op path still runs
        MOE_LOGW("CUDA graphs: could not prepare the graph (%s); decode steps run op by op", moe_status_str(st));
        cudaGetLastError();
        return MOE_ERR_UNSUPPORTED;
    }
    const int64_t before = ops_now(s);
    cudaError_t e = cudaStreamBeginCapture(s->cs, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        MOE_LOGW("CUDA graphs: cannot capture (%s); decode steps run op by op", cudaGetErrorString(e));
        cudaGetLastError();
        return MOE_ERR_UNSUPPORTED;
    }
    st = graph_emit(s, d->k);
    cudaGraph_t g = nullptr;
    e = cudaStreamEndCapture(s->cs, &g); // always: the stream leaves capture mode
    const int64_t emitted = ops_now(s) - before;
    s->own_ops -= emitted; // captured, not run: they count when the graph is launched
    if (st || e != cudaSuccess || !g) {
        MOE_LOGW("CUDA graphs: capture failed (%s); decode steps run op by op",
                 e != cudaSuccess ? cudaGetErrorString(e) : "an operation was refused");
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        return MOE_ERR_UNSUPPORTED;
    }
    e = cudaGraphInstantiate(&s->gr.exec, g, 0);
    if (e != cudaSuccess) {
        MOE_LOGW("CUDA graphs: instantiation failed (%s); decode steps run op by op", cudaGetErrorString(e));
        cudaGraphDestroy(g);
        s->gr.exec = nullptr;
        cudaGetLastError();
        return MOE_ERR_UNSUPPORTED;
    }
    size_t nodes = 0;
    cudaGraphGetNodes(g, nullptr, &nodes);
    s->gr.graph = g, s->gr.ready = 1, s->gr.gen = d->generation, s->gr.k = d->k;
    s->stats.graph_captures++;
    s->stats.graph_nodes = (int64_t)nodes;
    s->stats.graph_emitted = emitted;
    return MOE_OK;
}

enum moe_status cu_decode_step(moe_backend *be, const moe_step_desc *d, int32_t token, int pos, float *logits,
                               int32_t *sel, float *w) {
    cuda *s = ctx(be);
    const moe_config *c = s->c;
    if (s->gr.failed) return MOE_ERR_UNSUPPORTED;
    chunk_close(s);
    if (!s->gr.ready || s->gr.gen != d->generation || s->gr.k != d->k) {
        enum moe_status st = graph_build(s, d);
        if (st == MOE_ERR_UNSUPPORTED) s->gr.failed = 1, s->stats.graph_failed = 1;
        if (st) return st;
        s->ops_mark = ops_now(s); // the build's uploads are not the step's
    }
    CU(cudaStreamSynchronize(s->cs)); // the previous step's copy of step_h is done (it is, after its logits)
    const int half = c->rope.n_rot / 2;
    int32_t *in = (int32_t *)s->gr.step_h;
    in[0] = token, in[1] = pos;
    float *cs = (float *)(s->gr.step_h + 16);
    rope_fill(s, pos, 1, pos + 1, cs, cs + half);
    CU(cudaGraphLaunch(s->gr.exec, s->cs));
    s->own_ops++; // one launch from the host for the whole step
    CU(cudaStreamSynchronize(s->cs));
    memcpy(logits, s->logits_h, sizeof(float) * (size_t)c->n_vocab);
    int n_moe = 0;
    for (int l = 0; l < c->n_layer; l++) n_moe += c->layer_moe[l] != 0;
    if (sel) memcpy(sel, s->gr.routes_h, sizeof(int32_t) * (size_t)n_moe * d->k);
    if (w) memcpy(w, s->gr.routes_h + sizeof(int32_t) * (size_t)n_moe * d->k, sizeof(float) * (size_t)n_moe * d->k);
    s->stats.decode_steps++;
    s->stats.graph_steps++;
    s->stats.decode_ops += ops_now(s) - s->ops_mark;
    s->ops_mark = ops_now(s);
    s->rope_pos0 = -1; // the op-by-op path's tables are its own; nothing shared, but recompute to be plain
    return MOE_OK;
}

// ---- creation -----------------------------------------------------------------------

void cu_free(moe_backend *be);

// cu_supports: device memory fed by staging, experts placed by Twiddler; the
// CPU's interleaved layouts are not read here (weights stay in stored blocks).
int cu_supports(const moe_backend *be, enum moe_backend_feature f) {
    return f == MOE_BACKEND_FEAT_EXPERT_BATCH || f == MOE_BACKEND_FEAT_PLACE || f == MOE_BACKEND_FEAT_STAGE;
}

// cu_stats_json: moe_backend_cuda_stats as JSON (moe-run's --stats-json "backend").
cJSON *cu_stats_json(const moe_backend *be) {
    moe_cuda_stats cs;
    return moe_backend_cuda_stats(be, &cs) == MOE_OK ? moe_cuda_stats_to_json(&cs) : nullptr;
}

const moe_backend_iface k_cuda_iface = {
    MOE_BACKEND_VERSION, "cuda", cu_free, cu_buffer_alloc, cu_buffer_free, cu_buffer_write, cu_embed, cu_set_x,
    cu_get_x, cu_get_xn, cu_attention, cu_ffn_norm, cu_router, cu_expert, cu_dense, cu_residual, cu_lm_head,
    cu_ffn_rows, cu_lm_head_rows, cu_kv_cache_bytes, cu_expert_batch, cu_place, cu_stage_begin, cu_stage_end,
    cu_supports, cu_stats_json,
    nullptr, nullptr, // kv_seq, attention_multi: one sequence only (a session with n_seq > 1 is refused)
    cu_decode_step,
};

void cu_free(moe_backend *be) {
    if (!be) return;
    cuda *s = ctx(be);
    if (s) {
        if (s->worker.joinable()) {
            {
                std::lock_guard<std::mutex> lk(s->wmu);
                s->worker_stop = 1;
            }
            s->wcv.notify_all();
            s->worker.join();
        }
        if (s->cs) cudaStreamSynchronize(s->cs);
        if (s->xs) cudaStreamSynchronize(s->xs);
        graph_drop(s);
        if (s->gr.step_h) cudaFreeHost(s->gr.step_h);
        if (s->gr.routes_h) cudaFreeHost(s->gr.routes_h);
        moe_backend_free(s->cpu);
        moe_host_tier_free(s->tier);
        for (auto &kv : s->wmap) cudaFree(kv.second);
        for (auto &d : s->dev_allocs) cudaFree(d.first);
        for (int i = 0; i < N_PARAM_AREAS; i++) {
            if (s->areas[i].h) cudaFreeHost(s->areas[i].h);
            if (s->areas[i].copied) cudaEventDestroy(s->areas[i].copied);
        }
        for (void *p : {(void *)s->logits_h, (void *)s->rope_h, (void *)s->xn_h, (void *)s->hout_h, (void *)s->hidx_h})
            if (p) cudaFreeHost(p);
        for (cudaEvent_t e : {s->rope_ev, s->xn_ev, s->hout_ev})
            if (e) cudaEventDestroy(e);
        if (s->blas) moe_blas_destroy(s->blas);
        if (s->cs) cudaStreamDestroy(s->cs);
        if (s->xs) cudaStreamDestroy(s->xs);
        delete s;
    }
    free(be);
}

// supported: the architectures and features this backend runs (logged when not).
enum moe_status supported(const moe_config *c) {
    const char *why = nullptr;
    if ((int)c->arch < MOE_ARCH_MIXTRAL || (int)c->arch > MOE_ARCH_PHIMOE) why = "architecture";
    else if (c->attn != MOE_ATTN_GQA) why = "attention kind";
    else if (c->attn_sinks) why = "attention sinks";
    else if (c->expert_act != MOE_ACT_SWIGLU || c->expert_bias || c->router_bias) why = "expert activation or biases";
    else if ((int)c->rope.kind < MOE_ROPE_DEFAULT || (int)c->rope.kind > MOE_ROPE_LLAMA3 || c->rope.interleave)
        why = "RoPE variant";
    else if (c->head_dim > 256 || c->head_dim <= 0) why = "head size above 256";
    else if (c->rope.n_rot % 2 || c->rope.n_rot > c->head_dim) why = "rotary dimension";
    else if (c->n_head_kv <= 0 || c->n_head % c->n_head_kv) why = "head grouping";
    if (!why) return MOE_OK;
    MOE_LOGE("the CUDA backend does not run this model (%s, %s); use --device cpu", c->arch_name, why);
    return MOE_ERR_UNSUPPORTED;
}

// upload_all: every non-expert weight once, so the first token does not stall and memory errors show at start.
enum moe_status upload_all(cuda *s) {
    const moe_model *m = s->m;
    const moe_config *c = s->c;
    dmat d;
    const float *v;
    enum moe_status st;
    if ((st = dmat_of(s, m->tok_embd, &d)) || (st = dmat_of(s, m->lm_head, &d)) || (st = dvec(s, m->out_norm, s->H, &v)) ||
        (st = dvec(s, m->out_norm_b, s->H, &v)) || (st = dvec(s, m->lm_head_b, c->n_vocab, &v)))
        return st;
    for (int l = 0; l < c->n_layer; l++) {
        const moe_layer *L = &m->layers[l];
        const moe_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo};
        for (const moe_weight *w : ws)
            if ((st = dmat_of(s, *w, &d))) return st;
        if ((st = dvec(s, L->attn_norm, s->H, &v)) || (st = dvec(s, L->attn_norm_b, s->H, &v)) ||
            (st = dvec(s, L->ffn_norm, s->H, &v)) || (st = dvec(s, L->ffn_norm_b, s->H, &v)) ||
            (st = dvec(s, L->bq, s->q_dim, &v)) || (st = dvec(s, L->bk, s->kv_dim, &v)) ||
            (st = dvec(s, L->bv, s->kv_dim, &v)) || (st = dvec(s, L->bo, s->H, &v)))
            return st;
        if (c->layer_moe[l]) {
            if ((st = dmat_of(s, L->router, &d))) return st;
            if (c->n_ff_shared > 0 && ((st = dmat_of(s, L->shared.gate, &d)) || (st = dmat_of(s, L->shared.up, &d)) ||
                                       (st = dmat_of(s, L->shared.down, &d)) ||
                                       (c->shared_gated && (st = dmat_of(s, L->shared_gate, &d)))))
                return st;
        } else if ((st = dmat_of(s, L->dense.gate, &d)) || (st = dmat_of(s, L->dense.up, &d)) ||
                   (st = dmat_of(s, L->dense.down, &d))) {
            return st;
        }
    }
    return MOE_OK;
}

// max_blob_room: the largest room a loader asks for (raw or stored, rounded to 4096).
size_t max_blob_room(const moe_model *m) {
    size_t best = 0;
    for (int l = 0; m->bundle && l < m->cfg.n_layer; l++)
        for (int e = 0; m->cfg.layer_moe[l] && e < m->cfg.n_expert; e++)
            for (int p = 0; p < m->n_expert_prec; p++) {
                moe_bundle_blob b;
                if (moe_bundle_expert(m->bundle, (uint32_t)l, (uint32_t)e, (uint32_t)p, &b)) continue;
                size_t r = round_up((size_t)(b.raw_size > b.stored_size ? b.raw_size : b.stored_size), 4096);
                best = r > best ? r : best;
            }
    return best;
}

void *tier_alloc(void *user, size_t n) {
    (void)user;
    void *p = nullptr;
    if (cudaHostAlloc(&p, n, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    return p;
}
void tier_free(void *user, void *p) {
    (void)user;
    cudaFreeHost(p);
}

enum moe_status create(cuda *s) {
    const moe_config *c = s->c;
    enum moe_status st;
    CU(cudaSetDevice(s->dev));
    CU(cudaGetDeviceProperties(&s->prop, s->dev));
    size_t free_b = 0, total_b = 0;
    CU(cudaMemGetInfo(&free_b, &total_b));
    moe_gpu_mem_info info = {s->prop.integrated, (int64_t)total_b, (int64_t)free_b,
                             (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGESIZE)};
    char msg[256];
    if (moe_gpu_ledger_init(&s->ledger, &info, s->g.uma, &s->g.host_mem, msg, sizeof msg)) {
        MOE_LOGE("CUDA backend: %s", msg);
        return MOE_ERR_INVALID;
    }
    if (msg[0]) MOE_LOGW("CUDA backend: %s", msg);
    s->stats.uma = s->ledger.uma;
    s->stats.lat_measured = -1;
    CU(cudaStreamCreateWithFlags(&s->cs, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&s->xs, cudaStreamNonBlocking));
    CUBLAS(moe_blas_create(&s->blas));
    CUBLAS(moe_blas_set_stream(s->blas, s->cs));
    for (cudaEvent_t *e : {&s->rope_ev, &s->xn_ev, &s->hout_ev}) {
        CU(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
        CU(cudaEventRecord(*e, s->cs));
    }
    s->H = c->n_embd;
    s->S = s->p.n_slots < 1 ? 1 : s->p.n_slots;
    s->q_dim = (int64_t)c->n_head * c->head_dim;
    s->kv_dim = (int64_t)c->n_head_kv * c->head_dim;
    s->max_ff = std::max<int64_t>(std::max<int64_t>(c->n_ff_expert, c->n_ff_dense), c->n_ff_shared);
    s->max_in = std::max<int64_t>(std::max<int64_t>(s->H, s->q_dim), s->max_ff);
    const int64_t B = s->p.n_batch, H = s->H, S = s->S, half = c->rope.n_rot / 2;
    s->max_rows = B * S;
    s->max_split = 32;
    s->logits_rows = std::max<int64_t>(1, std::min<int64_t>(B, ((int64_t)64 << 20) / 4 / c->n_vocab));
    const size_t kv = (size_t)c->n_layer * (size_t)s->p.n_ctx * (size_t)s->kv_dim;
    const int64_t part_rows = std::max<int64_t>((int64_t)s->max_split, B) * c->n_head; // attention partials
    if ((st = state_alloc(s, &s->k_cache, (int64_t)kv)) || (st = state_alloc(s, &s->v_cache, (int64_t)kv)) ||
        (st = state_alloc(s, &s->x, B * H)) || (st = state_alloc(s, &s->xn, B * H)) ||
        (st = state_alloc(s, &s->q, B * s->q_dim)) || (st = state_alloc(s, &s->k, B * s->kv_dim)) ||
        (st = state_alloc(s, &s->v, B * s->kv_dim)) || (st = state_alloc(s, &s->att, B * std::max(s->q_dim, H))) ||
        (st = state_alloc(s, &s->tmp, B * H)) || (st = state_alloc(s, &s->acc, B * H)) ||
        (st = state_alloc(s, &s->part, B * S * H)) || (st = state_alloc(s, &s->part_used, B * S)) ||
        (st = state_alloc(s, &s->sg, B)) || (st = state_alloc(s, &s->hbuf, B * S * s->max_ff)) ||
        (st = state_alloc(s, &s->eout, B * S * H)) || (st = state_alloc(s, &s->hpart, B * S * H)) ||
        (st = state_alloc(s, &s->hidx, 2 * B * S)) || (st = state_alloc(s, &s->logits, s->logits_rows * c->n_vocab + B * c->n_expert)) ||
        (st = state_alloc(s, &s->pm, part_rows)) || (st = state_alloc(s, &s->pl, part_rows)) ||
        (st = state_alloc(s, &s->pacc, part_rows * c->head_dim)) || (st = state_alloc(s, &s->cos_d, B * half)) ||
        (st = state_alloc(s, &s->sin_d, B * half))) {
        MOE_LOGE("CUDA backend: the KV cache (%.1f MiB) and scratch do not fit; try a smaller --ctx or --batch",
                 (double)kv * 8 / 1048576.0);
        return st;
    }
    // GEMM buffers: a 64 MiB weight slab, inputs and products of a whole chunk
    s->gemm.blas = s->blas;
    s->gemm.f32 = s->g.gemm_f32;
    s->gemm.wbuf_bytes = (size_t)64 << 20;
    s->gemm.xbuf_bytes = (size_t)(B * s->max_in) * 4;
    s->gemm.obuf_elems = (size_t)std::max<int64_t>(B * std::max(s->max_in, H), (int64_t)4 << 20);
    {
        float *wb, *xb;
        if ((st = state_alloc(s, &wb, (int64_t)(s->gemm.wbuf_bytes / 4))) ||
            (st = state_alloc(s, &xb, (int64_t)(s->gemm.xbuf_bytes / 4))) ||
            (st = state_alloc(s, &s->gemm.gbuf, (int64_t)s->gemm.obuf_elems)) ||
            (st = state_alloc(s, &s->gemm.ubuf, (int64_t)s->gemm.obuf_elems)))
            return st;
        s->gemm.wbuf = wb, s->gemm.xbuf = xb;
    }
    // pinned: parameter ring, logits, rope tables, host works
    const int max_works = std::max(c->n_expert, s->S) + 4;
    s->area_size = round_up(2 * (size_t)max_works * sizeof(gemv_job) + 3 * sizeof(int32_t) * (size_t)(B * S) +
                                16 * (size_t)max_works * 3 + 4096 + sizeof(int32_t) * (size_t)B,
                            4096);
    for (int i = 0; i < N_PARAM_AREAS; i++) {
        param_area *a = &s->areas[i];
        void *h;
        if ((st = pinned_alloc(s, MOE_GPU_MEM_STAGING, s->area_size, &h))) return st;
        a->h = (char *)h;
        if ((st = state_alloc(s, &a->d, (int64_t)s->area_size))) return st;
        CU(cudaEventCreateWithFlags(&a->copied, cudaEventDisableTiming));
        CU(cudaEventRecord(a->copied, s->cs));
    }
    void *h;
    if ((st = pinned_alloc(s, MOE_GPU_MEM_STAGING, sizeof(float) * (size_t)std::max<int64_t>(s->logits_rows * c->n_vocab, B * c->n_expert), &h)))
        return st;
    s->logits_h = (float *)h;
    if ((st = pinned_alloc(s, MOE_GPU_MEM_STAGING, sizeof(float) * (size_t)(2 * B * half + 2), &h))) return st;
    s->rope_h = (float *)h;
    s->inv_freq.resize((size_t)half + 1);
    moe_rope_inv_freq(c, s->inv_freq.data()); // the CPU backend's frequencies (config.c)
    if ((st = upload_all(s))) return st;
    if (s->m->bundle) {
        // Twiddler's CPU side: a CPU backend for expert FFNs over the mapping, and its worker
        if ((st = pinned_alloc(s, MOE_GPU_MEM_STAGING, sizeof(float) * (size_t)(B * H), &h))) return st;
        s->xn_h = (float *)h;
        if ((st = pinned_alloc(s, MOE_GPU_MEM_STAGING, sizeof(float) * (size_t)(B * S * H), &h))) return st;
        s->hout_h = (float *)h;
        if ((st = pinned_alloc(s, MOE_GPU_MEM_STAGING, sizeof(int32_t) * (size_t)(2 * B * S), &h))) return st;
        s->hidx_h = (int32_t *)h;
        moe_backend_params cp = s->p;
        cp.n_ctx = 1;
        if ((st = moe_backend_cpu_new(s->m, &cp, &s->cpu))) return st;
        s->p.n_threads = moe_backend_cpu_threads(s->cpu);
        s->wx.resize((size_t)(B * H));
        s->wy.resize((size_t)(B * H));
        s->worker = std::thread(worker_main, s);
        // the pinned host tier (and its staging buffers) for the store's loaders
        s->tier_slot = max_blob_room(s->m);
        const int n_tier = s->tier_slot ? (int)(s->g.host_mem / (int64_t)s->tier_slot) : 0;
        const int n_staging = 4;
        if (s->tier_slot) {
            std::lock_guard<std::mutex> lk(s->mu);
            if (moe_gpu_ledger_take(&s->ledger, MOE_GPU_MEM_HOST_TIER, (int64_t)n_tier * (int64_t)s->tier_slot, msg,
                                    sizeof msg) ||
                moe_gpu_ledger_take(&s->ledger, MOE_GPU_MEM_STAGING, (int64_t)n_staging * (int64_t)s->tier_slot, msg,
                                    sizeof msg)) {
                MOE_LOGE("CUDA backend: %s", msg);
                return MOE_ERR_NOMEM;
            }
        }
        moe_host_tier_ops ops = {tier_alloc, tier_free, nullptr};
        if (s->tier_slot && (st = moe_host_tier_new(n_tier, s->tier_slot, n_staging, &ops, &s->tier))) return st;
    }
    CU(cudaStreamSynchronize(s->cs));
    return MOE_OK;
}

} // namespace

extern "C" int moe_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky error of a missing driver
        return 0;
    }
    return n;
}

extern "C" int moe_cuda_describe(int dev, char *buf, unsigned long size) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return -1;
    // make sure cuBLAS can start on this device: the backend depends on it
    cublasHandle_t h;
    if (cudaSetDevice(dev) != cudaSuccess || moe_blas_create(&h) != CUBLAS_STATUS_SUCCESS) return -1;
    moe_blas_destroy(h);
    snprintf(buf, size, "%s, %zu MiB, sm_%d%d%s", prop.name, prop.totalGlobalMem >> 20, prop.major, prop.minor,
             prop.integrated ? ", integrated" : "");
    return 0;
}

extern "C" enum moe_status moe_backend_cuda_new(const moe_model *model, const moe_backend_params *p,
                                                const moe_gpu_params *g, moe_backend **out) {
    *out = nullptr;
    const int n_dev = moe_cuda_device_count();
    if (g->device < 0 || g->device >= n_dev) {
        MOE_LOGE("CUDA device %d requested; %d found", g->device, n_dev);
        return MOE_ERR_BACKEND;
    }
    enum moe_status st = supported(&model->cfg);
    if (st) return st;
    moe_backend *be = (moe_backend *)calloc(1, sizeof *be);
    cuda *s = new (std::nothrow) cuda();
    if (!be || !s) {
        free(be);
        delete s;
        return MOE_ERR_NOMEM;
    }
    s->m = model, s->c = &model->cfg, s->p = *p, s->g = *g, s->dev = g->device;
    if (s->p.n_threads <= 0) s->p.n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    be->iface = &k_cuda_iface;
    be->ctx = s;
    if ((st = create(s))) {
        cu_free(be);
        return st;
    }
    *out = be;
    return MOE_OK;
}

extern "C" enum moe_status moe_backend_cuda_new_fn(const moe_model *model, const moe_backend_params *p, void *user,
                                                   moe_backend **out) {
    return moe_backend_cuda_new(model, p, (const moe_gpu_params *)user, out);
}

// The registry's row (runtime/backend/backend.c): options are a moe_gpu_params
// (NULL: the defaults); the device index comes from the registry's spec.
static int cuda_reg_describe(int index, char *buf, size_t size) { return moe_cuda_describe(index, buf, size); }

static enum moe_status cuda_reg_init(const moe_model *model, const moe_backend_params *p, int index,
                                     const void *options, moe_backend **out) {
    moe_gpu_params g = options ? *(const moe_gpu_params *)options : moe_gpu_default_params();
    g.device = index;
    return moe_backend_cuda_new(model, p, &g, out);
}

extern "C" const moe_backend_reg moe_backend_reg_cuda = {
    "cuda", "NVIDIA GPUs (CUDA, cuBLAS): experts in device memory, pinned host tier, unified memory on Jetson",
    moe_cuda_device_count, cuda_reg_describe, cuda_reg_init,
};

extern "C" enum moe_status moe_backend_cuda_stats(const moe_backend *be, moe_cuda_stats *out) {
    if (!be || be->iface != &k_cuda_iface) return MOE_ERR_INVALID;
    cuda *s = (cuda *)be->ctx;
    std::lock_guard<std::mutex> lk(s->mu);
    *out = s->stats;
    out->device_bytes = s->ledger.device_used, out->pinned_bytes = s->ledger.pinned_used;
    out->peak_device_bytes = s->ledger.peak_device, out->peak_pinned_bytes = s->ledger.peak_pinned;
    if (s->tier) moe_host_tier_get_stats(s->tier, &out->tier);
    return MOE_OK;
}

extern "C" cJSON *moe_cuda_stats_to_json(const moe_cuda_stats *s) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddBoolToObject(o, "uma", s->uma);
    const struct {
        const char *key;
        double v;
    } nums[] = {
        {"device_bytes", (double)s->device_bytes}, {"pinned_bytes", (double)s->pinned_bytes},
        {"peak_device_bytes", (double)s->peak_device_bytes}, {"peak_pinned_bytes", (double)s->peak_pinned_bytes},
        {"uploads", (double)s->uploads}, {"upload_bytes", (double)s->upload_bytes},
        {"h2d_copies", (double)s->h2d_copies}, {"h2d_bytes", (double)s->h2d_bytes}, {"h2d_s", s->h2d_s},
        {"batch_calls", (double)s->batch_calls}, {"device_works", (double)s->device_works},
        {"host_works", (double)s->host_works}, {"host_s", s->host_s}, {"host_wait_s", s->host_wait_s},
        {"placed", (double)s->placed}, {"placed_host", (double)s->placed_host}, {"model_layer_s", s->model_layer_s},
        {"decode_steps", (double)s->decode_steps}, {"decode_ops", (double)s->decode_ops},
        {"launches_per_token", s->decode_steps ? (double)s->decode_ops / (double)s->decode_steps : 0.0},
        {"graph_steps", (double)s->graph_steps}, {"graph_captures", (double)s->graph_captures},
        {"graph_nodes", (double)s->graph_nodes}, {"graph_emitted", (double)s->graph_emitted},
    };
    for (const auto &n : nums) cJSON_AddNumberToObject(o, n.key, n.v);
    cJSON_AddBoolToObject(o, "graph_failed", s->graph_failed);
    cJSON_AddStringToObject(o, "latency_table", s->lat_measured < 0 ? "none" : s->lat_measured ? "measured" : "cached");
    cJSON *t = cJSON_AddObjectToObject(o, "host_tier");
    cJSON_AddNumberToObject(t, "slots", s->tier.n_slots);
    cJSON_AddNumberToObject(t, "slot_bytes", (double)s->tier.slot_bytes);
    cJSON_AddNumberToObject(t, "allocated", s->tier.n_allocated);
    cJSON_AddNumberToObject(t, "hits", (double)s->tier.hits);
    cJSON_AddNumberToObject(t, "misses", (double)s->tier.misses);
    cJSON_AddNumberToObject(t, "inserts", (double)s->tier.inserts);
    cJSON_AddNumberToObject(t, "evictions", (double)s->tier.evictions);
    cJSON_AddNumberToObject(t, "staging_uses", (double)s->tier.staging_uses);
    return o;
}

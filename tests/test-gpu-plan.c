/*
 * test-gpu-plan.c - the GPU engine's host-side parts, without a GPU:
 *   - options: --device, --host-mem, --cpu-experts, --uma, --gemm; bad values;
 *   - the memory ledger (unified-memory bookkeeping): UMA chosen on
 *     integrated GPUs and forced with --uma, where each kind of allocation
 *     goes, one shared pool on an integrated GPU, separate device / pinned
 *     limits on a discrete one, refusals naming what does not fit, the host
 *     tier switched off in UMA mode;
 *   - the pinned host tier: hits after a fill, LRU eviction, buffers in use
 *     never handed out twice, failed fills not kept, staging when the tier is
 *     full or the key is being filled, lazy allocation; four threads hammering
 *     it never read a copy that is not the one asked for.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-gpu.h"
#include "moe-options.h"
#include "moe-host-tier.h"
#include "moe-test.h"

static void options(void) {
    struct moe_gpu_params p = moe_gpu_default_params();
    char err[256];
    CHECK(p.device == -1 && p.uma == -1 && p.host_mem == 0 && p.cpu_experts == MOE_CPU_EXPERTS_AUTO && !p.gemm_f32,
          "defaults: CPU backend, auto UMA, no host tier");
    CHECK(moe_gpu_parse_option(&p, "--device", "cuda:1", err, sizeof err) == MOE_OK && p.device == 1, "cuda:1");
    CHECK(moe_gpu_parse_option(&p, "--device", "cuda", err, sizeof err) == MOE_OK && p.device == 0, "cuda");
    CHECK(moe_gpu_parse_option(&p, "--device", "cpu", err, sizeof err) == MOE_OK && p.device == -1, "cpu");
    CHECK(moe_gpu_parse_option(&p, "--device", "cuda:x", err, sizeof err) == MOE_ERR_INVALID && strstr(err, "--device"),
          "bad device: %s", err);
    CHECK(moe_gpu_parse_option(&p, "--device", "tpu", err, sizeof err) == MOE_ERR_INVALID, "unknown device kind");
    CHECK(moe_gpu_parse_option(&p, "--host-mem", "1.5G", err, sizeof err) == MOE_OK && p.host_mem == 3LL << 29, "1.5G");
    CHECK(moe_gpu_parse_option(&p, "--host-mem", "lots", err, sizeof err) == MOE_ERR_INVALID, "bad size");
    CHECK(moe_gpu_parse_option(&p, "--cpu-experts", "never", err, sizeof err) == MOE_OK &&
              p.cpu_experts == MOE_CPU_EXPERTS_NEVER,
          "never");
    CHECK(moe_gpu_parse_option(&p, "--cpu-experts", "maybe", err, sizeof err) == MOE_ERR_INVALID, "bad mode");
    CHECK(moe_gpu_parse_option(&p, "--uma", NULL, err, sizeof err) == MOE_OK && p.uma == 1, "--uma");
    CHECK(moe_gpu_parse_option(&p, "--gemm", "f32", err, sizeof err) == MOE_OK && p.gemm_f32 == 1, "--gemm f32");
    CHECK(moe_gpu_parse_option(&p, "--gemm", "f8", err, sizeof err) == MOE_ERR_INVALID, "--gemm f8");
    CHECK(moe_gpu_parse_option(&p, "--host-mem", NULL, err, sizeof err) == MOE_ERR_INVALID, "a value is required");
    CHECK(moe_gpu_parse_option(&p, "--expert-mem", "1G", err, sizeof err) == MOE_ERR_NOT_FOUND, "not a GPU option");
    CHECK(moe_gpu_option_takes_value("--uma") == 0 && moe_gpu_option_takes_value("--device") == 1 &&
              moe_gpu_option_takes_value("--policy") == -1,
          "takes_value");
    CHECK(strstr(moe_gpu_options_help(), "--cpu-experts") != NULL, "help names the options");
}

#define MiB (1LL << 20)
#define GiB (1LL << 30)

static void ledger(void) {
    struct moe_gpu_ledger l;
    char msg[256];
    int64_t hm = 8 * GiB;
    /* a discrete 24 GiB card with 20 GiB free on a 64 GiB host */
    struct moe_gpu_mem_info d = {0, 24 * GiB, 20 * GiB, 64 * GiB};
    CHECK(moe_gpu_ledger_init(&l, &d, -1, &hm, msg, sizeof msg) == MOE_OK && !l.uma && !l.shared_pool && hm == 8 * GiB,
          "discrete: no UMA, host tier kept");
    CHECK(l.device_limit == 20 * GiB - l.reserve && l.reserve == 768 * MiB && l.pinned_limit == 32 * GiB,
          "limits: device %lld, reserve %lld, pinned %lld", (long long)l.device_limit, (long long)l.reserve,
          (long long)l.pinned_limit);
    CHECK(moe_gpu_ledger_where(&l, MOE_GPU_MEM_SLOTS) == MOE_GPU_WHERE_DEVICE &&
              moe_gpu_ledger_where(&l, MOE_GPU_MEM_HOST_TIER) == MOE_GPU_WHERE_PINNED &&
              moe_gpu_ledger_where(&l, MOE_GPU_MEM_STAGING) == MOE_GPU_WHERE_PINNED &&
              moe_gpu_ledger_where(&l, MOE_GPU_MEM_WEIGHTS) == MOE_GPU_WHERE_DEVICE,
          "discrete: slots on the device, tier and staging pinned");
    CHECK(moe_gpu_ledger_take(&l, MOE_GPU_MEM_WEIGHTS, 3 * GiB, msg, sizeof msg) == MOE_OK &&
              moe_gpu_ledger_take(&l, MOE_GPU_MEM_STATE, 1 * GiB, msg, sizeof msg) == MOE_OK &&
              moe_gpu_ledger_take(&l, MOE_GPU_MEM_HOST_TIER, 8 * GiB, msg, sizeof msg) == MOE_OK,
          "weights, state, host tier fit");
    CHECK(l.device_used == 4 * GiB && l.pinned_used == 8 * GiB, "separate pools");
    CHECK(moe_gpu_ledger_take(&l, MOE_GPU_MEM_SLOTS, 16 * GiB, msg, sizeof msg) == MOE_ERR_NOMEM &&
              strstr(msg, "expert slots") && strstr(msg, "--expert-mem") && l.used[MOE_GPU_MEM_SLOTS] == 0,
          "slots past the device limit refused: %s", msg);
    CHECK(moe_gpu_ledger_take(&l, MOE_GPU_MEM_SLOTS, 12 * GiB, msg, sizeof msg) == MOE_OK, "slots that fit");
    moe_gpu_ledger_give(&l, MOE_GPU_MEM_SLOTS, 12 * GiB);
    CHECK(l.device_used == 4 * GiB && l.peak_device == 16 * GiB, "give back; the peak stays");
    CHECK(moe_gpu_ledger_take(&l, MOE_GPU_MEM_HOST_TIER, 30 * GiB, msg, sizeof msg) == MOE_ERR_NOMEM &&
              strstr(msg, "pinned"),
          "pinned past half the RAM refused: %s", msg);
    hm = 40 * GiB;
    CHECK(moe_gpu_ledger_init(&l, &d, -1, &hm, msg, sizeof msg) == MOE_ERR_INVALID && strstr(msg, "--host-mem"),
          "a host tier larger than half the RAM: %s", msg);

    /* forced UMA on the discrete card: slots become mapped host memory */
    hm = 2 * GiB;
    CHECK(moe_gpu_ledger_init(&l, &d, 1, &hm, msg, sizeof msg) == MOE_OK && l.uma && !l.shared_pool && hm == 0 &&
              strstr(msg, "no effect"),
          "--uma on a discrete GPU: host tier off (%s)", msg);
    CHECK(moe_gpu_ledger_where(&l, MOE_GPU_MEM_SLOTS) == MOE_GPU_WHERE_MAPPED, "slots mapped");
    CHECK(moe_gpu_ledger_take(&l, MOE_GPU_MEM_SLOTS, 24 * GiB, msg, sizeof msg) == MOE_OK && l.pinned_used == 24 * GiB &&
              l.device_used == 0,
          "mapped slots count as pinned host memory, not device memory");

    /* a Jetson: integrated, 32 GiB shared, 28 free */
    struct moe_gpu_mem_info j = {1, 32 * GiB, 28 * GiB, 32 * GiB};
    hm = 0;
    CHECK(moe_gpu_ledger_init(&l, &j, -1, &hm, msg, sizeof msg) == MOE_OK && l.uma && l.shared_pool && !msg[0],
          "integrated: UMA automatically");
    CHECK(l.device_limit == l.pinned_limit && l.device_limit == 28 * GiB - 1 * GiB, "one pool: %lld",
          (long long)l.device_limit);
    CHECK(moe_gpu_ledger_take(&l, MOE_GPU_MEM_WEIGHTS, 10 * GiB, msg, sizeof msg) == MOE_OK &&
              moe_gpu_ledger_take(&l, MOE_GPU_MEM_SLOTS, 14 * GiB, msg, sizeof msg) == MOE_OK,
          "weights and slots share the pool");
    CHECK(moe_gpu_ledger_take(&l, MOE_GPU_MEM_STATE, 4 * GiB, msg, sizeof msg) == MOE_ERR_NOMEM && strstr(msg, "shared") &&
              strstr(msg, "--ctx"),
          "the shared pool is full: %s", msg);
    CHECK(moe_gpu_ledger_take(&l, MOE_GPU_MEM_STATE, 2 * GiB, msg, sizeof msg) == MOE_OK, "what fits still fits");
}

/* ---- host tier ---------------------------------------------------------- */

struct counts {
    int allocs, frees;
};

static void *t_alloc(void *user, size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, n)) return NULL;
    ((struct counts *)user)->allocs++;
    return p;
}

static void t_free(void *user, void *p) {
    ((struct counts *)user)->frees++;
    free(p);
}

static void tier_basics(void) {
    struct counts c = {0, 0};
    struct moe_host_tier_ops ops = {t_alloc, t_free, &c};
    struct moe_host_tier *t = NULL;
    CHECK(moe_host_tier_new(2, 8192, 0, &ops, &t) == MOE_ERR_INVALID, "staging >= 1");
    CHECK(moe_host_tier_new(2, 8192, 1, &ops, &t) == MOE_OK && c.allocs == 0, "nothing allocated up front");
    void *a, *b, *x;
    int ready;
    CHECK(moe_host_tier_acquire(t, 1, 9000, &a, &ready) == MOE_ERR_RANGE, "room above the buffer size");
    CHECK(moe_host_tier_acquire(t, 1, 8192, &a, &ready) == MOE_OK && !ready && c.allocs == 1, "miss 1");
    memset(a, 1, 8192);
    /* the same key while it is being filled: a staging buffer, not the same one */
    CHECK(moe_host_tier_acquire(t, 1, 100, &x, &ready) == MOE_OK && !ready && x != a, "concurrent fill: staging");
    moe_host_tier_release(t, x, 1);
    moe_host_tier_release(t, a, 1);
    CHECK(moe_host_tier_contains(t, 1), "key 1 kept");
    CHECK(moe_host_tier_acquire(t, 1, 100, &b, &ready) == MOE_OK && ready && b == a && ((unsigned char *)b)[8191] == 1,
          "hit returns the filled buffer");
    moe_host_tier_release(t, b, 0); /* a reader's ok flag does not matter */
    CHECK(moe_host_tier_contains(t, 1), "a hit's release keeps the copy");
    CHECK(moe_host_tier_acquire(t, 2, 100, &b, &ready) == MOE_OK && !ready && b != a, "miss 2");
    moe_host_tier_release(t, b, 1);
    /* touch 1, so 2 is the least recently used */
    CHECK(moe_host_tier_acquire(t, 1, 100, &a, &ready) == MOE_OK && ready, "hit 1");
    moe_host_tier_release(t, a, 1);
    CHECK(moe_host_tier_acquire(t, 3, 100, &x, &ready) == MOE_OK && !ready && x == b, "3 evicts 2 (LRU)");
    moe_host_tier_release(t, x, 0);
    CHECK(!moe_host_tier_contains(t, 3) && !moe_host_tier_contains(t, 2) && moe_host_tier_contains(t, 1),
          "a failed fill is not kept");
    /* hold both tier buffers: a third key goes to staging */
    CHECK(moe_host_tier_acquire(t, 1, 100, &a, &ready) == MOE_OK && ready, "hold 1");
    CHECK(moe_host_tier_acquire(t, 4, 100, &b, &ready) == MOE_OK && !ready, "hold 4");
    CHECK(moe_host_tier_acquire(t, 5, 100, &x, &ready) == MOE_OK && !ready && x != a && x != b, "5 in staging");
    moe_host_tier_release(t, x, 1);
    CHECK(!moe_host_tier_contains(t, 5), "staging copies are not kept");
    moe_host_tier_release(t, a, 1);
    moe_host_tier_release(t, b, 1);
    struct moe_host_tier_stats s;
    moe_host_tier_get_stats(t, &s);
    CHECK(s.hits == 3 && s.misses == 6 && s.inserts == 3 && s.evictions == 1 && s.staging_uses == 2 &&
              s.n_allocated == 2,
          "stats: hits %lld misses %lld inserts %lld evictions %lld staging %lld", (long long)s.hits, (long long)s.misses,
          (long long)s.inserts, (long long)s.evictions, (long long)s.staging_uses);
    moe_host_tier_free(t);
    CHECK(c.frees == c.allocs && c.allocs == 3, "every buffer freed (%d/%d)", c.frees, c.allocs);

    /* a tier of 0 slots: staging only */
    c.allocs = c.frees = 0;
    CHECK(moe_host_tier_new(0, 4096, 2, &ops, &t) == MOE_OK, "no tier");
    CHECK(moe_host_tier_acquire(t, 7, 4096, &a, &ready) == MOE_OK && !ready, "staging");
    moe_host_tier_release(t, a, 1);
    CHECK(!moe_host_tier_contains(t, 7) && moe_host_tier_acquire(t, 7, 4096, &b, &ready) == MOE_OK && !ready,
          "nothing is kept without a tier");
    moe_host_tier_release(t, b, 1);
    moe_host_tier_free(t);
}

struct hammer {
    struct moe_host_tier *t;
    int id, bad;
};

/* hammer_main: random keys; a miss fills the buffer with the key, a hit must see it. */
static void *hammer_main(void *arg) {
    struct hammer *h = arg;
    unsigned st = 77u + (unsigned)h->id;
    for (int i = 0; i < 20000; i++) {
        st = st * 1103515245u + 12345u;
        uint64_t key = (st >> 8) % 12;
        void *b;
        int ready;
        if (moe_host_tier_acquire(h->t, key, 64, &b, &ready) != MOE_OK) {
            h->bad++;
            continue;
        }
        uint64_t *w = b;
        if (ready) {
            for (int j = 0; j < 8; j++) h->bad += w[j] != key * 1000 + (uint64_t)j;
        } else {
            for (int j = 0; j < 8; j++) w[j] = key * 1000 + (uint64_t)j;
        }
        moe_host_tier_release(h->t, b, (st & 16) != 0);
    }
    return NULL;
}

static void tier_threads(void) {
    struct counts c = {0, 0};
    struct moe_host_tier_ops ops = {t_alloc, t_free, &c};
    struct moe_host_tier *t = NULL;
    CHECK(moe_host_tier_new(5, 4096, 2, &ops, &t) == MOE_OK, "tier for threads");
    pthread_t th[4];
    struct hammer h[4];
    for (int i = 0; i < 4; i++) {
        h[i] = (struct hammer){t, i, 0};
        pthread_create(&th[i], NULL, hammer_main, &h[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += h[i].bad;
    }
    struct moe_host_tier_stats s;
    moe_host_tier_get_stats(t, &s);
    CHECK(bad == 0, "%d hits saw another key's content", bad);
    CHECK(s.hits > 0 && s.evictions > 0 && s.hits + s.misses == 80000, "hits %lld, evictions %lld", (long long)s.hits,
          (long long)s.evictions);
    moe_host_tier_free(t);
}

int main(void) {
    moe_log_set_level(MOE_LOG_ERROR);
    options();
    ledger();
    tier_basics();
    tier_threads();
    printf("test-gpu-plan: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    return fails != 0;
}

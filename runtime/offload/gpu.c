/*
 * gpu.c - the GPU backend's options and memory bookkeeping (moe-gpu.h); plain C.
 * Their command-line form is runtime/cli/options.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-base.h"
#include "moe-gpu.h"

struct moe_gpu_params moe_gpu_default_params(void) {
    struct moe_gpu_params p;
    memset(&p, 0, sizeof p);
    p.device = -1;
    strcpy(p.device_spec, "cpu");
    p.uma = -1;
    p.cpu_experts = MOE_CPU_EXPERTS_AUTO;
    return p;
}

/* ---- the ledger --------------------------------------------------------- */

const char *moe_gpu_mem_kind_name(enum moe_gpu_mem_kind kind) {
    static const char *const names[] = {"weights", "state", "expert slots", "host tier", "staging"};
    return (unsigned)kind < MOE_GPU_MEM_KINDS ? names[kind] : "?";
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

enum moe_status moe_gpu_ledger_init(struct moe_gpu_ledger *l, const struct moe_gpu_mem_info *info, int uma_request,
                                    int64_t *host_mem, char *msg, size_t msg_size) {
    memset(l, 0, sizeof *l);
    if (msg_size) msg[0] = 0;
    l->uma = uma_request == 1 || (uma_request < 0 && info->integrated);
    l->shared_pool = info->integrated;
    /* the CUDA context, cuBLAS's workspace and allocator slack: 256 MiB or 3 % */
    l->reserve = max64((int64_t)256 << 20, info->dev_total / 32);
    if (l->shared_pool) {
        l->device_limit = l->pinned_limit = max64(0, info->dev_free - l->reserve);
    } else {
        l->device_limit = max64(0, info->dev_free - l->reserve);
        l->pinned_limit = info->host_total / 2;
    }
    if (l->uma && *host_mem > 0) {
        snprintf(msg, msg_size, "--host-mem has no effect with unified memory: the expert slots are host memory");
        *host_mem = 0;
    }
    if (*host_mem > l->pinned_limit) {
        snprintf(msg, msg_size, "--host-mem %.1f GiB exceeds the %.1f GiB of host memory that may be pinned (half of %.1f GiB)",
                 (double)*host_mem / 1073741824.0, (double)l->pinned_limit / 1073741824.0,
                 (double)info->host_total / 1073741824.0);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

enum moe_gpu_mem_where moe_gpu_ledger_where(const struct moe_gpu_ledger *l, enum moe_gpu_mem_kind kind) {
    switch (kind) {
    case MOE_GPU_MEM_WEIGHTS:
    case MOE_GPU_MEM_STATE: return MOE_GPU_WHERE_DEVICE;
    case MOE_GPU_MEM_SLOTS: return l->uma ? MOE_GPU_WHERE_MAPPED : MOE_GPU_WHERE_DEVICE;
    default: return MOE_GPU_WHERE_PINNED;
    }
}

enum moe_status moe_gpu_ledger_take(struct moe_gpu_ledger *l, enum moe_gpu_mem_kind kind, int64_t bytes, char *msg,
                                    size_t msg_size) {
    if (msg_size) msg[0] = 0;
    if ((unsigned)kind >= MOE_GPU_MEM_KINDS || bytes < 0) {
        snprintf(msg, msg_size, "bad allocation request");
        return MOE_ERR_INVALID;
    }
    const int dev = moe_gpu_ledger_where(l, kind) == MOE_GPU_WHERE_DEVICE;
    const int64_t used = l->shared_pool ? l->device_used + l->pinned_used : dev ? l->device_used : l->pinned_used;
    const int64_t limit = dev ? l->device_limit : l->pinned_limit;
    if (bytes > limit - used) {
        snprintf(msg, msg_size, "%s: %.1f MiB do not fit: %.1f MiB of %s memory in use, limit %.1f MiB%s",
                 moe_gpu_mem_kind_name(kind), (double)bytes / 1048576.0, (double)used / 1048576.0,
                 l->shared_pool ? "shared" : dev ? "device" : "pinned host", (double)limit / 1048576.0,
                 kind == MOE_GPU_MEM_SLOTS ? " (lower --expert-mem)"
                 : kind == MOE_GPU_MEM_WEIGHTS && dev ? " (set --expert-mem to keep only part of the experts on the GPU)"
                 : kind == MOE_GPU_MEM_STATE ? " (lower --ctx or --batch)"
                 : kind == MOE_GPU_MEM_HOST_TIER ? " (lower --host-mem)" : "");
        return MOE_ERR_NOMEM;
    }
    l->used[kind] += bytes;
    if (dev) {
        l->device_used += bytes;
        if (l->device_used > l->peak_device) l->peak_device = l->device_used;
    } else {
        l->pinned_used += bytes;
        if (l->pinned_used > l->peak_pinned) l->peak_pinned = l->pinned_used;
    }
    return MOE_OK;
}

void moe_gpu_ledger_give(struct moe_gpu_ledger *l, enum moe_gpu_mem_kind kind, int64_t bytes) {
    if ((unsigned)kind >= MOE_GPU_MEM_KINDS || bytes < 0) return;
    if (bytes > l->used[kind]) bytes = l->used[kind];
    l->used[kind] -= bytes;
    if (moe_gpu_ledger_where(l, kind) == MOE_GPU_WHERE_DEVICE) l->device_used -= bytes;
    else l->pinned_used -= bytes;
}

/*
 * gpu.c - GPU engine options and memory bookkeeping (moe-gpu.h); plain C.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-base.h"
#include "moe-gpu.h"
#include "moe-opt.h"
#include "moe-store.h"

struct moe_gpu_params moe_gpu_default_params(void) {
    struct moe_gpu_params p;
    memset(&p, 0, sizeof p);
    p.device = -1;
    p.uma = -1;
    p.cpu_experts = MOE_CPU_EXPERTS_AUTO;
    return p;
}

/* The GPU options: one table for the parser (moe_opt_parse) and --help. */
static const struct moe_opt k_gpu_opts[] = {
    {"device", 0, MOE_OPT_REQUIRED, "D", "cpu (default) | cuda | cuda:N: where the model runs"},
    {"host-mem", 0, MOE_OPT_REQUIRED, "SIZE",
     "pinned host tier for expert copies between storage and\n--expert-mem's GPU slots (e.g. 8G; default 0: none)"},
    {"cpu-experts", 0, MOE_OPT_REQUIRED, "M",
     "auto | never | always: run experts that are not on the GPU on\nthe CPU (Twiddler: auto decides per expert from "
     "latencies\nmeasured at start and cached in ~/.cache/moe; default auto)"},
    {"uma", 0, MOE_OPT_NONE, NULL,
     "unified memory: expert slots in mapped host memory, no copies\n(automatic on integrated GPUs such as Jetson)"},
    {"gemm", 0, MOE_OPT_REQUIRED, "P", "f16 (default) | f32: precision of prompt GEMMs"},
    {"recalibrate", 0, MOE_OPT_NONE, NULL, "measure the latency table again"},
    {NULL, 0, MOE_OPT_NONE, NULL, NULL},
};

const struct moe_opt *moe_gpu_option_table(void) { return k_gpu_opts; }

static char *g_gpu_help;
static pthread_once_t g_gpu_help_once = PTHREAD_ONCE_INIT;

/* make_gpu_help: the section title and the table's help, built once. */
static void make_gpu_help(void) {
    struct moe_buf b = {0};
    char *t = moe_opt_help_text(k_gpu_opts);
    if (moe_buf_printf(&b, "GPU (builds with -DMOE_CUDA=ON):\n%s", t ? t : "") == MOE_OK) g_gpu_help = moe_buf_take(&b);
    moe_buf_free(&b);
    free(t);
}

const char *moe_gpu_options_help(void) {
    pthread_once(&g_gpu_help_once, make_gpu_help);
    return g_gpu_help ? g_gpu_help : "";
}

/* bare: an option's name without its leading "--" (both spellings are accepted). */
static const char *bare(const char *name) { return strncmp(name, "--", 2) ? name : name + 2; }

int moe_gpu_option_takes_value(const char *name) {
    for (const struct moe_opt *o = k_gpu_opts; o->name; o++)
        if (!strcmp(bare(name), o->name)) return o->arg != MOE_OPT_NONE;
    return -1;
}

/* parse_device: "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N (0..63). */
static int parse_device(const char *v, int *out) {
    if (!strcmp(v, "cpu")) return *out = -1, 1;
    if (!strcmp(v, "cuda") || !strcmp(v, "gpu")) return *out = 0, 1;
    if (strncmp(v, "cuda:", 5) != 0) return 0;
    char *end;
    errno = 0;
    long n = strtol(v + 5, &end, 10);
    if (errno || end == v + 5 || *end || n < 0 || n > 63) return 0;
    *out = (int)n;
    return 1;
}

enum moe_status moe_gpu_parse_option(struct moe_gpu_params *p, const char *name, const char *v, char *err,
                                     size_t err_size) {
    int ok = 1;
    name = bare(name);
    if (!strcmp(name, "uma")) {
        p->uma = 1;
    } else if (!strcmp(name, "recalibrate")) {
        p->recalibrate = 1;
    } else if (moe_gpu_option_takes_value(name) < 0) {
        snprintf(err, err_size, "unknown option --%s", name);
        return MOE_ERR_NOT_FOUND;
    } else if (!v) {
        ok = 0;
    } else if (!strcmp(name, "device")) {
        ok = parse_device(v, &p->device);
    } else if (!strcmp(name, "host-mem")) {
        int64_t b;
        ok = moe_store_parse_size(v, &b) == MOE_OK;
        if (ok) p->host_mem = b;
    } else if (!strcmp(name, "cpu-experts")) {
        ok = moe_cpu_experts_parse(v, &p->cpu_experts) == MOE_OK;
    } else if (!strcmp(name, "gemm")) {
        if (!strcmp(v, "f16")) p->gemm_f32 = 0;
        else if (!strcmp(v, "f32")) p->gemm_f32 = 1;
        else ok = 0;
    }
    if (!ok) {
        snprintf(err, err_size, "bad value for --%s: \"%s\" (see --help)", name, v ? v : "");
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
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

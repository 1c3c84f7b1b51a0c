/*
 * options.c - the engine's command-line options (moe-options.h): the expert
 * store's and the device's option tables, their help and parsing, and the
 * store's counters as JSON. The CLI layer: moe-run and moe-prep's commands
 * link it; the runtime library holds no argv code.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "moe-backend.h"
#include "moe-base.h"
#include "moe-bundle.h"
#include "moe-gguf.h"
#include "moe-mmap.h"
#include "moe-opt.h"
#include "moe-options.h"

/* bare: an option's name without its leading "--" (both spellings are accepted). */
static const char *bare(const char *name) { return strncmp(name, "--", 2) ? name : name + 2; }

/* ---- command-line options (shared by moe-run and moe-prep eval) ------ */

/* The engine options: one table for the parser (moe_opt_parse) and --help. */
static const struct moe_opt k_store_opts[] = {
    {"expert-mem", 0, MOE_OPT_REQUIRED, "SIZE",
     "keep at most SIZE bytes of expert copies in memory (e.g. 512M,\n2G), or a share of every expert's high copy (e.g. 25%);\na missed expert is read from the bundle straight into its\nslot, 1 MiB chunks in flight at once, each checksummed and\ninterleaved for the CPU kernels while in cache"},
    {"cache-experts", 0, MOE_OPT_REQUIRED, "H,L", "keep H high- and L low-precision copies (as fit-cache)"},
    {"io", 0, MOE_OPT_REQUIRED, "MODE", "how misses are read: direct (O_DIRECT with Linux AIO,\ndefault) | buffered | mmap (pages dropped after the copy)"},
    {"io-timeout", 0, MOE_OPT_REQUIRED, "SECONDS",
     "fail the forward when one expert read has not completed after\nSECONDS (default 30; 0 = wait forever)"},
    {"policy", 0, MOE_OPT_REQUIRED, "NAME",
     "lru | lfu-seq | lfu-global | lhu | fld | edgemoe | twiddler |\nhobbit (default: hobbit with the bundle's fitted weights,\nelse lru)"},
    {"high", 0, MOE_OPT_REQUIRED, "P", "precision of high copies (default: each expert's bit-width-\nmap precision)"},
    {"low", 0, MOE_OPT_REQUIRED, "P", "precision of low copies (default: the smallest stored)"},
    {"dynamic", 0, MOE_OPT_REQUIRED, "on|off|auto",
     "HOBBIT dynamic precision: experts ranked below T1 of the gate\nmass load low copies on a miss (auto: on when the budget\ncannot hold every high copy)"},
    {"skip", 0, MOE_OPT_NONE, NULL, "skip experts past T2 that are not cached (HOBBIT; off by\ndefault)"},
    {"t1", 0, MOE_OPT_REQUIRED, "X", "threshold T1 (default: the bundle's hobbit.t1)"},
    {"t2", 0, MOE_OPT_REQUIRED, "Y", "threshold T2 (default: the bundle's hobbit.t2)"},
    {"low-share", 0, MOE_OPT_REQUIRED, "X", "share of --expert-mem for low copies (default 0.25)"},
    {"prefetch", 0, MOE_OPT_REQUIRED, "on|off",
     "stacked gating 1 layer ahead + path dictionary, 2 experts,\ninto prefetch slots (default off: not faster where measured)"},
    {"prefetch-layers", 0, MOE_OPT_REQUIRED, "P", "stacked gating up to P layers ahead (default 0)"},
    {"prefetch-paths", 0, MOE_OPT_REQUIRED, "M",
     "EdgeMoE: preload the M most probable experts of the next\nlayer from the path dictionary in the tuning (default 0)"},
    {"path-order", 0, MOE_OPT_REQUIRED, "N", "path dictionary keyed on 1 or 2 previous layers (default 1)"},
    {"warm", 0, MOE_OPT_REQUIRED, "on|off", "start with the most popular experts loaded (default on)"},
    {"loaders", 0, MOE_OPT_REQUIRED, "N", "I/O threads (default 2)"},
    {"prefetch-slots", 0, MOE_OPT_REQUIRED, "N",
     "slots for prefetched copies, out of --expert-mem (default 1\nwhen a prefetcher or big-little is on): a prefetch never\n"
     "evicts a cached copy"},
    {"policy-guard", 0, MOE_OPT_REQUIRED, "on|off",
     "with the fitted HOBBIT policy by default: a shadow LRU over\nthe same accesses; switch to LRU once it misses 10 % less\n"
     "(default on)"},
    {"route-margin", 0, MOE_OPT_REQUIRED, "X",
     "cache-aware routing (decode): an expert with no cached copy is\nreplaced by the most probable cached one whose router\n"
     "probability is at most X lower (0 = off; default: the\nbundle's fitted cache_route.margin, else off)"},
    {NULL, 0, 0, NULL, NULL},
};

const struct moe_opt *moe_store_option_table(void) { return k_store_opts; }

static char *g_store_help;
static pthread_once_t g_store_help_once = PTHREAD_ONCE_INIT;

static void make_store_help(void) {
    struct moe_buf b = {0};
    char *t = moe_opt_help_text(k_store_opts);
    if (moe_buf_printf(&b, "expert memory (bundles; default: every expert resident, as mapped):\n%s", t ? t : "") ==
        MOE_OK)
        g_store_help = moe_buf_take(&b);
    moe_buf_free(&b);
    free(t);
}

const char *moe_store_options_help(void) {
    pthread_once(&g_store_help_once, make_store_help);
    return g_store_help ? g_store_help : "";
}

/* opt_int: a strict integer in [lo, hi]. */
static int opt_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int opt_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return 0;
    *out = v;
    return 1;
}

/* opt_onoff: on / off (and auto when allowed: -1). */
static int opt_onoff(const char *s, int allow_auto, int *out) {
    if (!strcmp(s, "on") || !strcmp(s, "1")) return *out = 1, 1;
    if (!strcmp(s, "off") || !strcmp(s, "0")) return *out = 0, 1;
    if (allow_auto && !strcmp(s, "auto")) return *out = -1, 1;
    return 0;
}

int moe_store_option_takes_value(const char *name) {
    for (const struct moe_opt *o = k_store_opts; o->name; o++)
        if (!strcmp(bare(name), o->name)) return o->arg != MOE_OPT_NONE;
    return -1;
}

enum moe_status moe_store_parse_option(struct moe_store_params *p, const char *name, const char *v, char *err,
                                       size_t err_size) {
    const char *o = bare(name);
    int ok = 1, x;
    if (!strcmp(o, "skip")) {
        p->skip = 1;
    } else if (!v) {
        ok = 0;
    } else if (!strcmp(o, "expert-mem")) {
        int64_t b;
        char *end;
        errno = 0;
        const double pct = strtod(v, &end);
        if (end != v && end[0] == '%' && end[1] == 0) { /* a share: "25%" */
            ok = !errno && pct > 0 && pct <= 100;
            if (ok) p->expert_mem_share = pct / 100.0, p->expert_mem = 0, p->high_cap = p->low_cap = 0;
        } else {
            ok = moe_store_parse_size(v, &b) == MOE_OK && b > 0;
            if (ok) p->expert_mem = b, p->expert_mem_share = 0;
        }
    } else if (!strcmp(o, "cache-experts")) {
        int h, l, n = 0;
        ok = sscanf(v, "%d,%d%n", &h, &l, &n) == 2 && v[n] == 0 && h >= 0 && l >= 0 && h + l > 0;
        if (ok) p->high_cap = h, p->low_cap = l, p->expert_mem = 0, p->expert_mem_share = 0;
    } else if (!strcmp(o, "io")) {
        if (!strcmp(v, "direct")) p->io = MOE_IO_DIRECT;
        else if (!strcmp(v, "buffered")) p->io = MOE_IO_BUFFERED;
        else if (!strcmp(v, "mmap")) p->io = MOE_IO_MMAP;
        else ok = 0;
    } else if (!strcmp(o, "io-timeout")) {
        ok = opt_double(v, 0, 1e6, &p->io_timeout);
    } else if (!strcmp(o, "policy")) {
        enum moe_cache_policy pol;
        ok = moe_cache_policy_parse(v, &pol) == MOE_OK && pol != MOE_CACHE_BELADY;
        if (ok) p->policy = (int)pol;
    } else if (!strcmp(o, "high")) {
        p->high = v;
    } else if (!strcmp(o, "low")) {
        p->low = v;
    } else if (!strcmp(o, "dynamic")) {
        ok = opt_onoff(v, 1, &p->dynamic);
    } else if (!strcmp(o, "t1")) {
        ok = opt_double(v, 0, 1, &p->t1);
    } else if (!strcmp(o, "t2")) {
        ok = opt_double(v, 0, 1, &p->t2);
    } else if (!strcmp(o, "low-share")) {
        ok = opt_double(v, 0, 0.95, &p->low_share);
    } else if (!strcmp(o, "prefetch")) {
        ok = opt_onoff(v, 0, &x);
        if (ok && !x) p->prefetch_layers = p->prefetch_paths = 0;
        if (ok && x && !p->prefetch_layers && !p->prefetch_paths) p->prefetch_layers = 1, p->prefetch_paths = 2;
    } else if (!strcmp(o, "prefetch-layers")) {
        ok = opt_int(v, 0, 8, &p->prefetch_layers);
    } else if (!strcmp(o, "prefetch-paths")) {
        ok = opt_int(v, 0, 64, &p->prefetch_paths);
    } else if (!strcmp(o, "path-order")) {
        ok = opt_int(v, 1, 2, &p->path_order);
    } else if (!strcmp(o, "warm")) {
        ok = opt_onoff(v, 0, &p->warm);
    } else if (!strcmp(o, "loaders")) {
        ok = opt_int(v, 1, 64, &p->n_loaders);
    } else if (!strcmp(o, "prefetch-slots")) {
        ok = opt_int(v, 0, 64, &p->prefetch_slots);
    } else if (!strcmp(o, "policy-guard")) {
        ok = opt_onoff(v, 0, &p->guard);
    } else if (!strcmp(o, "route-margin")) {
        ok = opt_double(v, 0, 1, &p->route_margin);
    } else {
        snprintf(err, err_size, "unknown option --%s", o);
        return MOE_ERR_NOT_FOUND;
    }
    if (!ok) {
        snprintf(err, err_size, "bad value for --%s: \"%s\" (see --help)", o, v ? v : "");
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* ---- the device (backend) options ------------------------------------- */

/* The GPU options: one table for the parser (moe_opt_parse) and --help. */
static const struct moe_opt k_gpu_opts[] = {
    {"device", 0, MOE_OPT_REQUIRED, "D",
     "cpu (default) | cuda | cuda:N | auto: the backend the model\nruns on (auto: a GPU when one is present, else the CPU)"},
    {"host-mem", 0, MOE_OPT_REQUIRED, "SIZE",
     "pinned host tier for expert copies between storage and\n--expert-mem's GPU slots (e.g. 8G; default 0: none)"},
    {"cpu-experts", 0, MOE_OPT_REQUIRED, "M",
     "auto | never | always: run experts that are not on the GPU on\nthe CPU (Twiddler: auto decides per expert from "
     "latencies\nmeasured at start and cached in ~/.cache/moe; default auto)"},
    {"uma", 0, MOE_OPT_NONE, NULL,
     "unified memory: expert slots in mapped host memory, no copies\n(automatic on integrated GPUs such as Jetson)"},
    {"gemm", 0, MOE_OPT_REQUIRED, "P", "f16 (default) | f32: precision of prompt GEMMs"},
    {"graphs", 0, MOE_OPT_REQUIRED, "on|off",
     "on (default): a decode step with every expert on the GPU runs\nas one captured CUDA graph (routed on the GPU); off: "
     "op by op"},
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


int moe_gpu_option_takes_value(const char *name) {
    for (const struct moe_opt *o = k_gpu_opts; o->name; o++)
        if (!strcmp(bare(name), o->name)) return o->arg != MOE_OPT_NONE;
    return -1;
}

/* parse_device: a device spec checked against the registry (moe-backend.h):
 * p->device_spec keeps it ("gpu" is read as "cuda"), p->device its index
 * (-1 for the CPU backend). 0 with a message in err when it names none. */
static int parse_device(struct moe_gpu_params *p, const char *v, char *err, size_t err_size) {
    char name[32];
    int index;
    if (!strcmp(v, "gpu")) v = "cuda";
    if (moe_backend_parse_device(v, name, sizeof name, &index, err, err_size) != MOE_OK) return 0;
    if (strlen(v) >= sizeof p->device_spec) return 0;
    strcpy(p->device_spec, v);
    p->device = strcmp(name, "cpu") == 0 ? -1 : index;
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
        if (!parse_device(p, v, err, err_size)) return MOE_ERR_INVALID;
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
    } else if (!strcmp(name, "graphs")) {
        if (!strcmp(v, "on")) p->no_graphs = 0;
        else if (!strcmp(v, "off")) p->no_graphs = 1;
        else ok = 0;
    }
    if (!ok) {
        snprintf(err, err_size, "bad value for --%s: \"%s\" (see --help)", name, v ? v : "");
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* moe_device_option: see moe-options.h. */
int moe_device_option(const char *prog, struct moe_gpu_params *g, const char *name, const char *v) {
    char err[256];
    const enum moe_status st = moe_gpu_parse_option(g, name, v, err, sizeof err);
    if (st == MOE_ERR_NOT_FOUND) return -1;
    if (st != MOE_OK) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 2;
    }
    return 0;
}

int moe_device_built(const char *prog, const char *spec) {
    char name[32], err[200];
    int index;
    if (moe_backend_parse_device(spec ? spec : "cpu", name, sizeof name, &index, err, sizeof err) != MOE_OK) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 0;
    }
    if (strcmp(name, "auto") == 0 || moe_backend_reg_by_name(name)) return 1;
    fprintf(stderr, "%s: --device %s: this build has no %s backend (rebuild with -DMOE_CUDA=ON)\n", prog, spec, name);
    return 0;
}

/* ---- the store's counters as JSON ---------------------------------------- */

/* add_num: a number, or null when not finite (JSON has no NaN). */
static void add_num(cJSON *o, const char *key, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

cJSON *moe_store_stats_to_json(const struct moe_store_stats *s) {
    const double tok = s->tokens > 0 ? (double)s->tokens : NAN, served = (double)(s->accesses - s->skips);
    const double dec = s->decode_tokens > 0 ? (double)s->decode_tokens : NAN;
    static const char *const io[] = {"direct", "buffered", "mmap"};
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "policy", moe_cache_policy_name((enum moe_cache_policy)s->policy));
    cJSON_AddStringToObject(o, "io", io[s->io]);
    cJSON_AddBoolToObject(o, "dynamic", s->dynamic);
    const struct {
        const char *key;
        double v;
    } counts[] = {
        {"high_cap", s->high_cap}, {"low_cap", s->low_cap},
        {"high_copy_bytes", (double)s->high_copy_bytes}, {"low_copy_bytes", (double)s->low_copy_bytes},
        {"t1", s->t1}, {"t2", s->t2},
        {"tokens", (double)s->tokens}, {"decode_tokens", (double)s->decode_tokens},
        {"accesses", (double)s->accesses}, {"hits_high", (double)s->hits_high}, {"hits_low", (double)s->hits_low},
        {"misses_high", (double)s->misses_high}, {"misses_low", (double)s->misses_low}, {"skips", (double)s->skips},
        {"loads", (double)s->loads}, {"load_bytes", (double)s->load_bytes},
        {"prefetch_loads", (double)s->prefetch_loads}, {"prefetch_used", (double)s->prefetch_used},
        {"prefetch_cancelled", (double)s->prefetch_cancelled}, {"scratch_loads", (double)s->scratch_loads},
        {"hit_ratio", served > 0 ? (double)(s->hits_high + s->hits_low) / served : NAN},
        {"hit_ratio_high", s->hits_high + s->misses_high > 0
                               ? (double)s->hits_high / (double)(s->hits_high + s->misses_high) : NAN},
        {"hit_ratio_low", s->hits_low + s->misses_low > 0
                              ? (double)s->hits_low / (double)(s->hits_low + s->misses_low) : NAN},
        {"loads_per_token", (double)s->loads / tok},
        {"bytes_read_per_token", (double)s->load_bytes / tok},
        {"loads_per_decode_token", (double)s->loads_decode / dec},
        {"bytes_read_per_decode_token", (double)s->load_bytes_decode / dec},
        {"stall_s", s->stall_s},
        {"stall_s_per_token", s->stall_s / tok},
        {"stall_s_per_decode_token", s->stall_s_decode / dec},
        {"prefetch_precision", s->prefetch_loads > 0 ? (double)s->prefetch_used / (double)s->prefetch_loads : NAN},
        {"prefetch_recall", s->prefetch_used + s->misses_high + s->misses_low > 0
                                ? (double)s->prefetch_used / (double)(s->prefetch_used + s->misses_high + s->misses_low)
                                : NAN},
        {"peak_resident_bytes", (double)s->peak_resident_bytes}, {"slot_bytes", (double)s->slot_bytes},
        {"host_runs", (double)s->host_runs},
        {"reads_cancelled", (double)s->reads_cancelled}, {"reads_queued", (double)s->reads_queued},
        {"read_s_mean", s->loads > 0 ? s->read_s / (double)s->loads : NAN}, {"read_s_max", s->read_s_max},
        {"read_bytes_per_s", s->read_s > 0 ? (double)s->load_bytes / s->read_s : NAN},
        {"queue_depth_max", (double)s->queue_depth_max},
        {"route_margin", s->route_margin}, {"route_substituted", (double)s->route_substituted},
        {"route_substituted_share", s->accesses > 0 ? (double)s->route_substituted / (double)s->accesses : NAN},
        {"route_mass_moved", s->route_mass_moved}, {"prefetch_dropped", (double)s->prefetch_dropped},
        {"read_retries", (double)s->read_retries}, {"reads_failed", (double)s->reads_failed},
        {"prefetch_failed", (double)s->prefetch_failed},
        {"prefetch_reread", (double)s->prefetch_reread}, {"read_timeouts", (double)s->read_timeouts},
        {"guard_switch_token", (double)s->guard_switch_token}, {"guard_switches", (double)s->guard_switches},
        {"guard_penalty", s->guard_penalty},
        {"guard_shadow_penalty", s->guard_shadow_penalty},
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) add_num(o, counts[i].key, counts[i].v);
    return o;
}

void moe_store_stats_json(const struct moe_store_stats *s, FILE *f) {
    cJSON *o = moe_store_stats_to_json(s);
    char *t = o ? cJSON_PrintUnformatted(o) : NULL;
    fputs(t ? t : "null", f);
    cJSON_free(t);
    cJSON_Delete(o);
}

/* ---- the model and how it runs (moe_engine_*) ------------------------------ */

static const struct moe_opt k_engine_opts[] = {
    {"model", 'm', MOE_OPT_REQUIRED, "MODEL", "checkpoint directory, GGUF file or .moeb bundle (required)"},
    {"expert-precision", 0, MOE_OPT_REQUIRED, "P",
     "bundles: the stored precision every expert uses (e.g. q4_k;\ndefault: the first stored)"},
    {"threads", 't', MOE_OPT_REQUIRED, "N", "CPU threads (default: all)"},
    {"ctx", 'c', MOE_OPT_REQUIRED, "N", "context length / KV cache size (default: min(model max, 4096))"},
    {"batch", 'b', MOE_OPT_REQUIRED, "N", "prompt tokens per forward chunk (default 256)"},
    {"no-repack", 0, MOE_OPT_NONE, NULL, "CPU: keep q4_k and q8_0 weights in their stored row layout"},
    {"no-plan", 0, MOE_OPT_NONE, NULL, "ignore the plan moe-prep plan --apply wrote into the bundle"},
    {NULL, 0, 0, NULL, NULL},
};

const struct moe_opt *moe_engine_option_table(void) { return k_engine_opts; }

static const struct moe_opt k_big_little_opts[] = {
    {"little-k", 0, MOE_OPT_REQUIRED, "K2",
     "decode each token with K2 experts per MoE layer (the little\nmodel; default K/2 when --gamma is given); when the largest\n"
     "next-token probability is below gamma, run the token again\nwith all K experts. 0 = off. Prompts always run with K"},
    {"gamma", 0, MOE_OPT_REQUIRED, "G",
     "the confidence threshold in [0, 1] (default: the bundle's\nmobile.gamma from moe-prep profile, else 0.7); 0 = never fall\n"
     "back (the K2 model), 1 = always (the K model's output)"},
    {"bl-prefetch", 0, MOE_OPT_REQUIRED, "D",
     "prefetch the big pass's experts D MoE layers ahead (default 2;\n0 = off; with an expert budget)"},
    {NULL, 0, 0, NULL, NULL},
};

const struct moe_opt *moe_big_little_option_table(void) { return k_big_little_opts; }

static char *g_bl_help;
static pthread_once_t g_bl_help_once = PTHREAD_ONCE_INIT;

static void make_bl_help(void) {
    struct moe_buf b = {0};
    char *t = moe_opt_help_text(k_big_little_opts);
    if (moe_buf_printf(&b, "big-little decoding (MoBiLE):\n%s", t ? t : "") == MOE_OK) g_bl_help = moe_buf_take(&b);
    moe_buf_free(&b);
    free(t);
}

const char *moe_big_little_options_help(void) {
    pthread_once(&g_bl_help_once, make_bl_help);
    return g_bl_help ? g_bl_help : "";
}

static char *g_engine_help;
static pthread_once_t g_engine_help_once = PTHREAD_ONCE_INIT;

static void make_engine_help(void) {
    struct moe_buf b = {0};
    char *t = moe_opt_help_text(k_engine_opts);
    if (moe_buf_printf(&b, "model and runtime:\n%s", t ? t : "") == MOE_OK) g_engine_help = moe_buf_take(&b);
    moe_buf_free(&b);
    free(t);
}

const char *moe_engine_options_help(void) {
    pthread_once(&g_engine_help_once, make_engine_help);
    return g_engine_help ? g_engine_help : "";
}

void moe_engine_args_init(struct moe_engine_args *e) {
    memset(e, 0, sizeof *e);
    e->store = moe_store_default_params();
    e->gpu = moe_gpu_default_params();
    e->little_k = -1, e->gamma = NAN, e->bl_prefetch = -1;
}

int moe_engine_option(const char *prog, struct moe_engine_args *e, const struct moe_opt *o, const char *v) {
    const char *n = o->name;
    if (!strcmp(n, "model")) return e->model = v, 0;
    if (!strcmp(n, "expert-precision")) return e->expert_precision = v, 0;
    if (!strcmp(n, "no-repack")) return e->no_repack = 1, 0;
    if (!strcmp(n, "no-plan")) return e->no_plan = 1, 0;
    if (!strcmp(n, "little-k") || !strcmp(n, "bl-prefetch")) {
        if (!opt_int(v, 0, 64, !strcmp(n, "little-k") ? &e->little_k : &e->bl_prefetch)) {
            fprintf(stderr, "%s: --%s expects an integer in [0, 64], got \"%s\"\n", prog, n, v);
            return 2;
        }
        return 0;
    }
    if (!strcmp(n, "gamma")) {
        if (!opt_double(v, 0, 1, &e->gamma)) {
            fprintf(stderr, "%s: --gamma expects a number in [0, 1], got \"%s\"\n", prog, v);
            return 2;
        }
        return 0;
    }
    int *ip = !strcmp(n, "threads") ? &e->n_threads : !strcmp(n, "ctx") ? &e->n_ctx : !strcmp(n, "batch") ? &e->n_batch : NULL;
    if (ip) {
        const long hi = ip == &e->n_threads ? 1024 : ip == &e->n_ctx ? 1 << 24 : 1 << 16;
        if (!opt_int(v, 1, hi, ip)) {
            fprintf(stderr, "%s: --%s expects an integer in [1, %ld], got \"%s\"\n", prog, n, hi, v);
            return 2;
        }
        return 0;
    }
    char err[256];
    if (moe_store_option_takes_value(n) >= 0) {
        if (moe_store_parse_option(&e->store, n, v, err, sizeof err) != MOE_OK) {
            fprintf(stderr, "%s: %s\n", prog, err);
            return 2;
        }
        if (e->n_store_opts == 64) {
            fprintf(stderr, "%s: too many expert-store options\n", prog);
            return 2;
        }
        e->store_name[e->n_store_opts] = n, e->store_value[e->n_store_opts++] = v;
        return 0;
    }
    return moe_device_option(prog, &e->gpu, n, v);
}

int moe_engine_read_plan(const char *prog, const char *model, int no_plan, const char *const *names,
                         const char *const *values, int n, struct moe_store_params *store, struct moe_tuning_plan *plan) {
    /* only a bundle has a plan; anything else (a missing file included) the model load reports, once */
    if (no_plan || !model || moe_is_dir(model) || access(model, R_OK) != 0 || moe_gguf_is_gguf_file(model)) return 0;
    struct moe_bundle *b = NULL;
    if (moe_bundle_open(model, &b) != MOE_OK) return 0; /* the model load reports it */
    uint32_t nl = 0, ne = 0, np = 0;
    moe_bundle_expert_layout(b, &nl, &ne, &np);
    int L = 0, have = 0;
    for (uint32_t l = 0; l < nl; l++) L += moe_bundle_layer_has_experts(b, l);
    struct moe_tuning t;
    if (L > 0 && ne > 0 && moe_tuning_read(moe_bundle_tuning(b), L, (int)ne, &t) == MOE_OK && t.has_plan)
        *plan = t.plan, have = 1;
    moe_bundle_free(b);
    if (!have) return 0;
    struct moe_store_params sp = moe_store_default_params();
    moe_store_params_from_plan(&sp, plan);
    for (int i = 0; i < n; i++) {
        char err[256];
        if (moe_store_parse_option(&sp, names[i], values[i], err, sizeof err) != MOE_OK) {
            fprintf(stderr, "%s: %s\n", prog, err);
            return -1;
        }
    }
    *store = sp;
    fprintf(stderr, "%s: using the bundle's plan for %.0f MiB (moe-prep plan --apply; %.2f tok/s predicted on %d "
                    "threads): expert memory %.1f MiB%s%s, policy %s%s%s (--no-plan ignores it)\n",
            prog, (double)plan->mem / 1048576, plan->tok_s, plan->threads, (double)plan->expert_mem / 1048576,
            plan->high[0] ? ", high " : "", plan->high, plan->policy, plan->dynamic ? ", dynamic precision" : "",
            plan->little_k ? ", big-little" : "");
    return 1;
}

int moe_engine_big_little(const char *prog, int little_k, double gamma, int bl_prefetch, const struct moe_model *m,
                          struct moe_session_params *sp) {
    const struct moe_config *c = &m->cfg;
    if (little_k == 0 || (little_k < 0 && isnan(gamma))) return 1; /* off */
    const int K = c->n_expert_used;
    const int k2 = little_k > 0 ? little_k : K / 2;
    if (k2 < 1 || k2 >= K) {
        fprintf(stderr, "%s: big-little needs a little model with 1 .. %d experts per token (the model routes "
                        "to %d); got %d\n", prog, K - 1, K, k2);
        return 0;
    }
    double g = gamma;
    if (isnan(g)) {
        struct moe_tuning t;
        int L = 0;
        for (int l = 0; l < c->n_layer; l++) L += c->layer_moe[l] != 0;
        g = 0.7;
        if (m->bundle && L > 0 && moe_tuning_read(moe_bundle_tuning(m->bundle), L, c->n_expert, &t) == MOE_OK &&
            t.has_gamma)
            g = t.gamma;
        else
            fprintf(stderr, "%s: no mobile.gamma in the model's tuning (moe-prep profile writes one); gamma 0.7\n", prog);
    }
    sp->n_expert_used = K;
    sp->little_k = k2;
    sp->gamma = g;
    if (bl_prefetch >= 0) sp->bl_prefetch_layers = bl_prefetch;
    return 1;
}

int moe_engine_load(const char *prog, struct moe_engine_args *e, struct moe_model **model,
                    struct moe_session_params *sp) {
    *model = NULL;
    if (!e->model) {
        fprintf(stderr, "%s: no model given; use -m MODEL (see %s --help)\n", prog, prog);
        return 2;
    }
    if (!moe_device_built(prog, e->gpu.device_spec)) return 2;
    const int pl = moe_engine_read_plan(prog, e->model, e->no_plan, e->store_name, e->store_value, e->n_store_opts,
                                        &e->store, &e->plan);
    if (pl < 0) return 2;
    e->have_plan = pl;
    if (pl && e->little_k < 0 && isnan(e->gamma)) { /* the plan's big-little, unless the options say otherwise */
        e->little_k = e->plan.little_k;
        if (e->plan.little_k > 0) e->gamma = e->plan.gamma;
    }
    e->use_store = moe_store_params_active(&e->store);
    struct moe_model_params mp = moe_model_default_params();
    mp.expert_precision = e->expert_precision;
    mp.lazy_experts = e->use_store;
    if (moe_model_load(e->model, &mp, model) != MOE_OK) {
        fprintf(stderr, "%s: cannot load model from %s\n", prog, e->model);
        return 1;
    }
    *sp = moe_session_default_params();
    if (e->use_store) sp->store = &e->store;
    e->store.repack = !e->no_repack;
    sp->device = e->gpu.device_spec;
    sp->device_options = &e->gpu;
    sp->no_graphs = e->gpu.no_graphs;
    sp->n_threads = e->n_threads, sp->n_ctx = e->n_ctx, sp->n_batch = e->n_batch;
    if (!moe_engine_big_little(prog, e->little_k, e->gamma, e->bl_prefetch, *model, sp)) {
        moe_model_free(*model);
        *model = NULL;
        return 2;
    }
    return 0;
}

int moe_engine_repack(const char *prog, const struct moe_engine_args *e, struct moe_model *m,
                      const struct moe_backend *be) {
    if (e->no_repack || !moe_backend_supports(be, MOE_BACKEND_FEAT_CPU_LAYOUTS)) return 1;
    size_t bytes = 0;
    if (moe_model_repack(m, !e->use_store, &bytes) != MOE_OK) {
        fprintf(stderr, "%s: cannot repack the weights for the CPU kernels\n", prog);
        return 0;
    }
    return 1;
}

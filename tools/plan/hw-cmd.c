/*
 * hw-cmd.c - `moe-prep hw`: measure this machine's numbers for a bundle
 * (moe-hw.h) and keep them in the hardware table for `moe-prep plan`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hw-cmd.h"
#include "moe-hw.h"
#include "moe-opt.h"
#include "moe-options.h"
#include "moe-prep.h"
#include "tool-util.h"

static const struct moe_opt k_hw_opts[] = {
    {"threads", 't', MOE_OPT_REQUIRED, "N", "CPU threads, as moe-run will use (default: all)"},
    {"hw", 0, MOE_OPT_REQUIRED, "FILE", "the table to update (default above)"},
    {"show", 0, MOE_OPT_NONE, NULL, "print the table's entries for MODEL without measuring"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this text"},
    {NULL, 0, 0, NULL, NULL},
};

static void hw_usage(FILE *f) {
    fprintf(f,
            "usage: moe-prep hw MODEL.moeb [--threads N] [--hw FILE] [--show]\n"
            "\n"
            "Measures what `moe-prep plan` predicts speed from, on this machine, and keeps\n"
            "it in a small JSON table (default $XDG_CACHE_HOME/moe/hw.json, else\n"
            "~/.cache/moe/hw.json; entries for the same file system, model and threads are\n"
            "replaced):\n"
            "  - direct (O_DIRECT) reads of MODEL's file: latency and bandwidth, blocks of\n"
            "    64 KiB, 1 MiB and one expert copy, one reader and 2 (the store's loaders);\n"
            "  - host memory copy bandwidth;\n"
            "  - MODEL's routed-expert FFN at each stored precision for 1..32 routed tokens\n"
            "    (a + b n), one decode step with every expert resident (the time outside\n"
            "    the experts), and the expert store's own work per layer step.\n"
            "Takes seconds to a minute; the machine should be otherwise idle (a loaded\n"
            "machine gives slower, noisier numbers). `moe-run -m MODEL --measure-hw` does\n"
            "the same.\n"
            "\n"
            "options:\n");
    moe_opt_help(f, k_hw_opts);
    fprintf(f, "\n%s", moe_gpu_options_help());
    fprintf(f, "\n"
               "examples:\n"
               "  moe-prep hw mixtral.moeb -t 8\n"
               "  moe-prep hw tiny.moeb --hw /tmp/hw.json --show\n");
}

struct hw_args {
    const char *table;
    int threads, show;
    struct moe_gpu_params gpu; /* --device and the GPU backend's options */
};

/* on_hw_opt: one option (moe_opt handler); 1 after --help. */
static int on_hw_opt(void *ctx, const struct moe_opt *o, const char *v) {
    struct hw_args *a = ctx;
    long long n;
    if (o < k_hw_opts || o >= k_hw_opts + sizeof k_hw_opts / sizeof k_hw_opts[0]) /* the device table */
        return moe_device_option("moe-prep hw", &a->gpu, o->name, v) ? 2 : 0;
    if (o->key == 'h') return hw_usage(stdout), 1;
    if (o->key == 't') {
        if (!moe_tool_parse_ll("hw", "--threads", v, 1, 4096, &n)) return 2;
        a->threads = (int)n;
    } else if (!strcmp(o->name, "hw")) {
        a->table = v;
    } else {
        a->show = 1;
    }
    return 0;
}

int moe_prep_hw(int argc, char **argv) {
    struct hw_args a = {NULL, 0, 0, moe_gpu_default_params()};
    const struct moe_opt *tables[] = {k_hw_opts, moe_gpu_option_table()};
    int pos = argc;
    int rc = moe_opt_parse("moe-prep hw", argc, argv, 1, tables, 2, on_hw_opt, &a, &pos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!moe_device_built("moe-prep hw", a.gpu.device_spec)) return 2;
    if (argc - pos > 1) {
        fprintf(stderr, "moe-prep hw: one MODEL.moeb only\n");
        return 2;
    }
    if (pos >= argc) {
        fprintf(stderr, "moe-prep hw: no MODEL.moeb given (see moe-prep hw --help)\n");
        return 2;
    }
    return moe_hw_command(argv[pos], a.threads, a.gpu.device_spec, &a.gpu, a.table, a.show, "moe-prep hw");
}

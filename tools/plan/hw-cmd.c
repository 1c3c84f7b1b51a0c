/*
 * hw-cmd.c - `moe-prep hw`: measure this machine's numbers for a bundle
 * (moe-hw.h) and keep them in the hardware table for `moe-prep plan`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hw-cmd.h"
#include "moe-hw.h"
#include "moe-prep.h"
#include "tool-util.h"

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
            "options:\n"
            "  -t, --threads N   CPU threads, as moe-run will use (default: all)\n"
            "  --hw FILE         the table to update (default above)\n"
            "  --show            print the table's entries for MODEL without measuring\n"
            "  -h, --help        this text\n"
            "\n"
            "examples:\n"
            "  moe-prep hw mixtral.moeb -t 8\n"
            "  moe-prep hw tiny.moeb --hw /tmp/hw.json --show\n");
}

int moe_prep_hw(int argc, char **argv) {
    const char *model = NULL, *table = NULL;
    int threads = 0, show = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        long long n;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            hw_usage(stdout);
            return 0;
        } else if (!strcmp(o, "-t") || !strcmp(o, "--threads")) {
            if (i + 1 >= argc || !moe_tool_parse_ll("hw", o, argv[++i], 1, 4096, &n)) return 2;
            threads = (int)n;
        } else if (!strcmp(o, "--hw")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "moe-prep hw: --hw needs a file\n");
                return 2;
            }
            table = argv[++i];
        } else if (!strcmp(o, "--show")) {
            show = 1;
        } else if (o[0] == '-') {
            fprintf(stderr, "moe-prep hw: unknown option \"%s\" (see moe-prep hw --help)\n", o);
            return 2;
        } else if (!model) {
            model = o;
        } else {
            fprintf(stderr, "moe-prep hw: one MODEL.moeb only\n");
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "moe-prep hw: no MODEL.moeb given (see moe-prep hw --help)\n");
        return 2;
    }
    return moe_hw_command(model, threads, table, show, "moe-prep hw");
}

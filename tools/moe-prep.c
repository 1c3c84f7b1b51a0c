/*
 * moe-prep - offline preparation of MoE models: one binary, a subcommand table.
 * Each subcommand's CLI half is a *-cmd.c file beside its stage's library
 * (tools/quantize, tools/profile, tools/calibrate, tools/plan); this file only
 * dispatches, two-word names ("profile merge") first.
 */
#include <stdio.h>
#include <string.h>

#include "moe-file.h"
#include "moe-prep.h"

struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

static const struct subcommand k_commands[] = {
    {"quantize", moe_prep_quantize, "pack a checkpoint or GGUF file into a multi-precision bundle (.moeb)"},
    {"inspect", moe_prep_inspect, "what a bundle holds; --verify checks every checksum"},
    {"check", moe_prep_check, "validate a Hugging Face checkpoint or GGUF file and summarise it"},
    {"eval", moe_prep_eval, "perplexity on a text; KL divergence against a reference model"},
    {"profile", moe_prep_profile, "record routing over a text; placement, HOBBIT, prefetch, path statistics"},
    {"profile merge", moe_prep_profile_merge, "join the shards of a profile (profile --shard I/N) into one"},
    {"profile report", moe_prep_profile_report, "a profile (or sensitivity file) as one HTML page"},
    {"sensitivity", moe_prep_sensitivity, "per-expert loss when one expert drops to a low precision (EdgeMoE)"},
    {"sensitivity merge", moe_prep_sensitivity_merge, "join the shards of a sweep (sensitivity --shard I/N) into one"},
    {"bitwidth", moe_prep_bitwidth, "per-expert bit-widths within a loss or size budget (EdgeMoE)"},
    {"fit-cache", moe_prep_fit_cache, "replay traces through expert-cache policies; fit HOBBIT's weights"},
    {"hw", moe_prep_hw, "measure storage, memory and expert compute times for the planner"},
    {"plan", moe_prep_plan, "what to keep where for a memory size, and how fast it will run"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: moe-prep <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-15s %s\n", k_commands[i].name, k_commands[i].summary);
    fprintf(f, "\nRun 'moe-prep <command> --help' for a command's options.\n"
               "example:\n  moe-prep check ./Mixtral-8x7B-v0.1 --json\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("moe-prep %s\n", MOE_VERSION);
        return 0;
    }
    moe_file_cleanup_on_signals(); /* no temporary output survives Ctrl-C (quantize and sensitivity cancel
                                    * on their own handlers) */
    /* a two-word name ("profile merge") is matched before its first word alone */
    for (size_t i = 0; argc > 2 && i < sizeof k_commands / sizeof k_commands[0]; i++) {
        size_t n = strlen(argv[1]);
        if (!strncmp(k_commands[i].name, argv[1], n) && k_commands[i].name[n] == ' ' &&
            !strcmp(k_commands[i].name + n + 1, argv[2]))
            return k_commands[i].run(argc - 2, argv + 2);
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (!strcmp(argv[1], k_commands[i].name)) return k_commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "moe-prep: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}

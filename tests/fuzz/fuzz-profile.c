/*
 * fuzz-profile.c - libFuzzer target for the profile reader (moe_profile_read)
 * and what consumes a profile read from an untrusted file: the derivation
 * (moe_profile_derive, which trusts no sum.* or config.* array), the HTML
 * report, and merging (the input read twice, the second merged into the
 * first, then derived again).
 *
 * HDF5 opens files by name, so each input is written to a temporary file
 * first. The HDF5 library's own parser is fuzzed here too; a crash inside
 * libhdf5 on a hostile file is an HDF5 bug to report upstream (and a reason
 * to keep profiles from untrusted sources out of the tools), not ours to fix.
 * Found so far (libhdf5 1.10, Debian 12), 1000 random byte mutations of the
 * seeds: an overlapping memcpy in H5HG_read when reading a variable-length
 * string attribute from a damaged global heap (the reader now refuses
 * variable-length strings before reading them), and on a few damaged files
 * "infinite loop closing library" with leaked HDF5-internal allocations at
 * exit (no HDF5 ids of ours stay open). A dataset shape claiming more
 * elements than the file can store is refused before anything is allocated.
 *
 * Run the fuzzer (clang with libFuzzer):
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE \
 *       -Iformats -Itools -Itools/profile -I/usr/include/hdf5/serial \
 *       tests/fuzz/fuzz-profile.c tools/profile/profile-h5.c \
 *       tools/profile/routing-stats.c tools/profile/profile-derive.c \
 *       tools/profile/report.c formats/status.c \
 *       -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5 -lm -o /tmp/fuzz-profile
 *   /tmp/fuzz-profile -max_total_time=300 -max_len=200000 /tmp/profile-corpus \
 *       tests/fuzz/corpus/profile
 *
 * The seeds in tests/fuzz/corpus/profile are written by
 * `test-profile-derive --write-seeds tests/fuzz/corpus/profile`; ctest replays
 * them through replay-main.c as fuzz-profile-replay.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "profile-h5.h"
#include "profile-results.h"
#include "report.h"

static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

/* exercise: derive and render a profile that read back successfully. */
static void exercise(struct moe_profile *p) {
    struct moe_profile_targets t = moe_profile_default_targets();
    struct moe_profile_results r;
    if (moe_profile_derive(p, &t, &r) == MOE_OK) moe_profile_results_free(&r);
    FILE *f = fopen("/dev/null", "w");
    if (f) {
        moe_profile_report_render(p, NULL, f);
        fclose(f);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moe_log_set(quiet, NULL);
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz-profile-%ld.h5", (long)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    struct moe_profile *a = NULL, *b = NULL;
    if (moe_profile_read(path, &a) == MOE_OK) {
        exercise(a);
        if (moe_profile_read(path, &b) == MOE_OK) {
            moe_profile_clear_derived(a); /* derive added arrays; b still has the file's */
            if (moe_profile_merge(a, b) == MOE_OK) exercise(a);
        }
    }
    moe_profile_free(a);
    moe_profile_free(b);
    unlink(path);
    return 0;
}

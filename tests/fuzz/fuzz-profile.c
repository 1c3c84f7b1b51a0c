/*
 * fuzz-profile.c - libFuzzer target for the profile reader (moe_profile_read)
 * and what consumes a profile read from an untrusted file: the derivation
 * (moe_profile_derive, which trusts no sum.* or config.* array), the HTML
 * report, and merging (the input read twice, the second merged into the
 * first, then derived again).
 *
 * HDF5 opens files by name, so each input is written to a temporary file
 * first. libhdf5 1.10 itself is not safe on hostile files: a 4-minute run of
 * this target with the reader in-process stopped on 74 inputs, every one
 * inside libhdf5 (heap overflows and a use-after-free in H5O__msg_iterate_real
 * and H5VM_memcpyvv, SEGVs, allocation requests of up to 2^62 bytes from
 * H5C_protect and H5MM_realloc, an overflow in strdup of an unterminated
 * attribute name, internal leaks, "infinite loop closing library"); none in
 * the project's code. moe_profile_read therefore parses the file in a child
 * process and the parent decodes and validates what the child streams back
 * (profile-h5.c, "containment"): whatever libhdf5 does to the child is a
 * "damaged file" error in the parent. One input of each kind is in the corpus
 * (hdf5-*); MOE_PROFILE_READ_INPROCESS=1 reads in-process again, to fuzz or
 * debug libhdf5 itself. docs/fuzzing.md has the runs and counts.
 *
 * Build with -DMOE_BUILD_FUZZ=ON (clang; docs/fuzzing.md), then
 *   build-fuzz/tests/fuzz-profile -max_total_time=600 -jobs=1 -timeout=30 \
 *       -max_len=200000 /tmp/profile-corpus tests/fuzz/corpus/profile
 *
 * The seeds in tests/fuzz/corpus/profile are written by
 * `test-profile-derive --write-seeds tests/fuzz/corpus/profile`, plus the
 * hdf5-* inputs above, and stream-* inputs: an input that starts with the
 * containment stream's magic ("MOEPRPIP") goes to
 * moe_profile_decode instead, the parent's side of the containment. ctest
 * replays them through replay-main.c as fuzz-profile-replay (under
 * MOE_SANITIZE, the hdf5-* ones fail without the containment).
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

/* decode_stream: an input that starts with the stream magic is fed to
 * moe_profile_decode, the parent side of the containment (the trust boundary
 * once libhdf5 runs in a child), through a temporary file. */
static void decode_stream(const uint8_t *data, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz-profile-%ld.bin", (long)getpid());
    FILE *f = fopen(path, "w+b");
    if (!f) return;
    if (size) fwrite(data, 1, size, f);
    fflush(f);
    rewind(f);
    struct moe_profile *p = NULL;
    if (moe_profile_decode(fileno(f), "fuzz", &p) == MOE_OK) exercise(p);
    else if (p) abort(); /* no profile on error */
    moe_profile_free(p);
    fclose(f);
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moe_log_set(quiet, NULL);
    if (size >= 8 && !memcmp(data, "MOEPRPIP", 8)) {
        decode_stream(data, size);
        return 0;
    }
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

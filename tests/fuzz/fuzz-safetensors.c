/*
 * fuzz-safetensors.c - libFuzzer target for the safetensors header parser
 * (moe_safetensors_open_memory). On success it touches every tensor byte (so
 * ASan catches a data pointer outside the input) and checks that find() and
 * at() agree; any inconsistency aborts, which the fuzzer reports as a crash.
 *
 * Run the fuzzer: build with -DMOE_BUILD_FUZZ=ON (clang, libFuzzer;
 * docs/fuzzing.md), then
 *
 *   build-fuzz/tests/fuzz-safetensors -jobs=1 -max_total_time=600 -max_len=4096 \
 *       /tmp/st-corpus tests/fuzz/corpus/safetensors
 *
 * New inputs go to /tmp/st-corpus (the first directory); copy small interesting
 * ones (and any crash-* file, after fixing the bug) into
 * tests/fuzz/corpus/safetensors, which ctest replays through replay-main.c
 * (target fuzz-safetensors-replay) without libFuzzer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe-safetensors.h"

/* Log sink that drops messages: the fuzzer produces millions of errors. */
static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level;
    (void)msg;
    (void)user;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        moe_log_set(quiet, NULL);
        init = 1;
    }
    struct moe_safetensors *st = NULL;
    if (moe_safetensors_open_memory(data, size, "fuzz", &st) != MOE_OK) {
        if (st) abort(); /* the handle must be cleared on error */
        return 0;
    }
    size_t n = moe_safetensors_count(st), covered = 0;
    unsigned sum = 0;
    const uint8_t *prev_end = NULL;
    for (size_t i = 0; i < n; i++) {
        const struct moe_st_tensor *t = moe_safetensors_at(st, i);
        const uint8_t *p = t->data;
        if (p < data || p + t->nbytes > data + size) abort();
        if (prev_end && p != prev_end) abort(); /* offset order, no gap, no overlap */
        for (size_t k = 0; k < t->nbytes; k++) sum += p[k];
        if (moe_safetensors_find(st, t->name) != t) abort();
        if (t->n_dims < 0 || t->n_dims > MOE_ST_MAX_DIMS || t->dtype >= MOE_DTYPE_COUNT) abort();
        int64_t ne = 1;
        for (int d = 0; d < t->n_dims; d++) ne *= t->shape[d];
        if (ne != t->n_elements || (size_t)ne * moe_dtype_size(t->dtype) != t->nbytes) abort();
        prev_end = p + t->nbytes;
        covered += t->nbytes;
    }
    if (n > 0 && prev_end != data + size) abort(); /* data region ends at the end of the input */
    (void)covered;
    moe_safetensors_metadata(st, "format");
    moe_safetensors_free(st);
    return (int)(sum & 0); /* keep sum alive without affecting the result */
}

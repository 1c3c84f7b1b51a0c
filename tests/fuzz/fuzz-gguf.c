/*
 * fuzz-gguf.c - libFuzzer target for the GGUF reader (moe_gguf_open_memory)
 * and the translation of its metadata (moe_gguf_model_open: config.json and
 * tokenizer texts, the transformers-name table). On success it touches every
 * tensor byte and every string value (so ASan catches a pointer outside the
 * input), checks that lookups by key and name agree with the indexed
 * accessors and that tensors lie in the input without overlapping, and loads
 * the translated config and tokenizer texts; any inconsistency aborts, which
 * the fuzzer reports as a crash.
 *
 * Run the fuzzer (clang with libFuzzer; Debian: apt-get install libclang-rt-14-dev):
 *
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DMOE_BUILD_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz-gguf    (docs/fuzzing.md)
 *   mkdir -p /tmp/gguf-corpus
 *   build-fuzz/tests/fuzz-gguf -max_total_time=300 -max_len=16384 /tmp/gguf-corpus tests/fuzz/corpus/gguf
 *
 * Copy small interesting inputs (and any crash-* file, after fixing the bug)
 * into tests/fuzz/corpus/gguf, which ctest replays through replay-main.c
 * (target fuzz-gguf-replay) without libFuzzer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe-gguf-model.h"
#include "moe-gguf.h"
#include "moe-model.h"
#include "moe-tokenizer.h"

/* Log sink that drops messages: the fuzzer produces millions of errors. */
static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level;
    (void)msg;
    (void)user;
}

/* check_reader: every item reachable, consistent, inside the input. */
static unsigned check_reader(const struct moe_gguf *g, const uint8_t *data, size_t size) {
    unsigned sum = 0;
    for (size_t i = 0; i < moe_gguf_n_kv(g); i++) {
        const struct moe_gguf_kv *kv = moe_gguf_kv_at(g, i);
        if (moe_gguf_find_kv(g, kv->key) != kv) abort();
        for (uint64_t k = 0; kv->str && k < kv->n; k++) {
            const uint8_t *p = (const uint8_t *)kv->str[k].p;
            if (p < data || p + kv->str[k].n > data + size) abort();
            for (uint64_t j = 0; j < kv->str[k].n; j++) sum += p[j];
        }
        int64_t x;
        double f;
        for (uint64_t k = 0; kv->data && k < kv->n; k++) sum += (unsigned)moe_gguf_kv_int(kv, k, &x) + (unsigned)moe_gguf_kv_float(kv, k, &f);
    }
    const uint8_t *base = data + moe_gguf_data_offset(g);
    for (size_t i = 0; i < moe_gguf_n_tensors(g); i++) {
        const struct moe_gguf_tensor *t = moe_gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        if (moe_gguf_find_tensor(g, t->name) != t) abort();
        if (p < data || p + t->nbytes > data + size) abort();
        if ((size_t)(p - base) % moe_gguf_alignment(g)) abort();
        if (moe_qtype_row_bytes(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]) != t->nbytes) abort();
        for (size_t k = 0; k < t->nbytes; k++) sum += p[k];
        for (size_t j = 0; j < i; j++) { /* no overlap (quadratic, but fuzz inputs hold few tensors) */
            const struct moe_gguf_tensor *u = moe_gguf_tensor_at(g, j);
            const uint8_t *q = u->data;
            if (t->nbytes && u->nbytes && p < q + u->nbytes && q < p + t->nbytes) abort();
        }
    }
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        moe_log_set(quiet, NULL);
        init = 1;
    }
    struct moe_gguf *g = NULL;
    if (moe_gguf_open_memory(data, size, "fuzz", &g) != MOE_OK) {
        if (g) abort(); /* the handle must be cleared on error */
        return 0;
    }
    unsigned sum = check_reader(g, data, size);
    struct moe_gguf_model *v = NULL;
    if (moe_gguf_model_open(g, &v) == MOE_OK) {
        const char *cj = moe_gguf_model_config_json(v), *tj = moe_gguf_model_tokenizer_json(v);
        struct moe_config cfg;
        if (moe_config_parse(cj, strlen(cj), "fuzz", &cfg) == MOE_OK) moe_config_clear(&cfg);
        struct moe_tokenizer *tok = NULL;
        if (tj) {
            const char *tc = moe_gguf_model_tokenizer_config_json(v);
            if (moe_tokenizer_load_texts(tj, strlen(tj), tc, tc ? strlen(tc) : 0, "fuzz", &tok) == MOE_OK) {
                int32_t *ids = NULL;
                size_t n = 0;
                if (moe_tokenizer_encode(tok, "a b\xe2\x96\x81 c", 8, 1, &ids, &n) == MOE_OK) free(ids);
            }
            moe_tokenizer_free(tok);
        }
        for (size_t i = 0; i < moe_gguf_model_count(v); i++) {
            const struct moe_gguf_hf_tensor *t = moe_gguf_model_at(v, i);
            if (moe_gguf_model_find(v, t->name) != t) abort();
        }
    } else if (v) {
        abort();
    }
    moe_gguf_model_free(v);
    moe_gguf_free(g);
    return (int)(sum & 0);
}

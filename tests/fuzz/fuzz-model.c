/*
 * fuzz-model.c - libFuzzer target from bundle bytes to a bound model
 * (moe_model_load_bundle_memory): the container checks of fuzz-bundle, then
 * the config in the metadata, every tensor bound with its shape, type and
 * stored size, every expert blob at its precision, the bit-width map of the
 * tuning, and a two-token forward pass over whatever bound. The input is
 * copied into a buffer of exactly its size, so a view that reaches past the
 * input is a heap overflow the sanitizer reports, and every matrix view is
 * checked against the bytes its record stores (check_views): the bug of issue
 * 17 item 1, lm_head.weight keeping its shape with 64 bytes of data, aborts.
 * Every expert view at every precision is checked against its blob
 * (check_expert_views), also with experts bound lazily (what the expert store
 * of moe-run --expert-mem loads from).
 *
 * Each input runs twice: as given, and with the checksums a mutation cannot
 * plausibly get right recomputed (header, directory, tensors, tuning slots and
 * their payloads), so mutations of the directory reach the binder.
 *
 * Build with -DMOE_BUILD_FUZZ=ON (clang, libFuzzer; see docs/fuzzing.md), then
 *   build-fuzz/tests/fuzz-model -max_total_time=600 -jobs=1 -timeout=10 \
 *       -rss_limit_mb=2048 /tmp/model-corpus tests/fuzz/corpus/model
 * The seeds in tests/fuzz/corpus/model are tiny synthetic Mixtral bundles made
 * by `fuzz-model-seeds tests/fuzz/corpus/model build/moe-prep`, including
 * short-lm-head.moeb; ctest replays them (fuzz-model-replay).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "moe-bundle.h"
#include "moe-model.h"
#include "moe-quant.h"
#include "moe-session.h"

/* Log sink that drops messages: the fuzzer produces millions of errors. */
static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level;
    (void)msg;
    (void)user;
}

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* reseal_tensors: recompute each tensor record's checksum over the bytes its
 * offset and size name (docs/format.md, "Tensor table"), bounds-checked. */
static void reseal_tensors(uint8_t *img, size_t size, uint8_t *d, uint64_t n) {
    if (n < 32) return;
    uint64_t m = rd64(d + 8), t = rd64(d + 16);
    if (m > n - 32 || t > n - 32 - m || t < 8) return;
    uint8_t *rec = d + 32 + m + 8, *end = d + 32 + m + t;
    uint64_t count = rd64(d + 32 + m);
    for (uint64_t i = 0; i < count && end - rec >= 72; i++) {
        uint32_t len = (uint32_t)rec[0] | (uint32_t)rec[1] << 8 | (uint32_t)rec[2] << 16 | (uint32_t)rec[3] << 24;
        if ((uint64_t)(end - rec) - 72 < len) return;
        uint64_t off = rd64(rec + 48), sz = rd64(rec + 56);
        if (off <= size && sz <= size - off) wr64(rec + 64, XXH3_64bits(img + off, (size_t)sz));
        rec += 72 + len;
    }
}

/* reseal: the checksums a mutation cannot plausibly get right. */
static void reseal(uint8_t *img, size_t n) {
    if (n < 4096) return;
    uint64_t off = rd64(img + 32), size = rd64(img + 40);
    if (off <= n && size <= n - off) {
        reseal_tensors(img, n, img + off, size);
        wr64(img + 48, XXH3_64bits(img + off, (size_t)size));
    }
    wr64(img + 120, XXH3_64bits(img, 120));
    for (int i = 0; i < 2; i++) {
        uint8_t *s = img + (i ? 1024 : 512);
        if (!memcmp(s, "MOEBTUNE", 8)) {
            uint64_t po = rd64(s + 16), ps = rd64(s + 24);
            if (po <= n && ps <= n - po) wr64(s + 32, XXH3_64bits(img + po, (size_t)ps));
            wr64(s + 56, XXH3_64bits(s, 56));
        }
    }
}

/* check_views: the binder's promise, checked independently: every matrix
 * view of a non-expert tensor lies inside the bytes its bundle record stores
 * (and so inside the input). A violation aborts, which the fuzzer reports and
 * the corpus replay turns into a failed test. */
static void check_views(const struct moe_model *m, const uint8_t *data, size_t size) {
    for (int i = 0; i < m->n_refs; i++) {
        const struct moe_tensor_ref *r = &m->refs[i];
        if (r->role == MOE_ROLE_VECTOR) continue; /* float32 copies owned by the model */
        const struct moe_bundle_tensor *t = moe_bundle_find_tensor(m->bundle, r->name);
        if (!t) abort();
        const uint8_t *p = r->w.data, *lo = t->data;
        uint64_t bytes = (uint64_t)moe_qtype_row_bytes(r->w.type, r->w.n_in) * (uint64_t)r->w.n_out;
        if (p < lo || p - lo > (ptrdiff_t)t->size || bytes > t->size - (uint64_t)(p - lo)) abort();
        if (lo < data || t->size > size || (size_t)(lo - data) > size - t->size) abort();
    }
}

/* check_expert_views: every routed expert's three views, at every stored
 * precision (bound now or, with lazy experts, on first use), hold no more
 * bytes than the blob's part for them; an uncompressed blob's views lie
 * inside its stored bytes (and so inside the input). The expert store builds
 * its views from the same descriptors. */
static void check_expert_views(const struct moe_model *m, const uint8_t *data, size_t size) {
    const struct moe_config *c = &m->cfg;
    for (int l = 0; l < c->n_layer; l++)
        for (int e = 0; c->layer_moe[l] && e < c->n_expert; e++)
            for (int p = -1; p < m->n_expert_prec; p++) {
                struct moe_ffn f;
                if (moe_model_expert(m, l, e, p, &f) != MOE_OK) continue; /* a damaged blob: refused */
                const int prec = p < 0 ? moe_model_get_expert_precision(m, l, e) : p;
                struct moe_bundle_blob b;
                if (moe_bundle_expert(m->bundle, (uint32_t)l, (uint32_t)e, (uint32_t)prec, &b) != MOE_OK) abort();
                const struct moe_weight *w[3] = {&f.gate, &f.up, &f.down};
                for (int k = 0; k < 3; k++) {
                    uint64_t bytes = (uint64_t)moe_qtype_row_bytes(w[k]->type, w[k]->n_in) * (uint64_t)w[k]->n_out;
                    if (bytes > b.desc->parts[k].nbytes) abort();
                    if (b.compression != MOE_BUNDLE_COMP_NONE) continue; /* in a buffer the model owns */
                    const uint8_t *q = w[k]->data, *lo = b.stored;
                    if (q < lo || (uint64_t)(q - lo) > b.raw_size || bytes > b.raw_size - (uint64_t)(q - lo)) abort();
                    if (lo < data || b.raw_size > size || (size_t)(lo - data) > size - b.raw_size) abort();
                }
                if (f.bias) { /* gpt-oss: gate | up | down biases, one f32 row */
                    uint64_t bytes = sizeof(float) * (uint64_t)(2 * c->n_ff_expert + c->n_embd);
                    if (b.desc->n_parts < 4 || bytes > b.desc->parts[3].nbytes) abort();
                    const uint8_t *q = (const uint8_t *)f.bias, *lo = b.stored;
                    if (b.compression == MOE_BUNDLE_COMP_NONE &&
                        (q < lo || (uint64_t)(q - lo) > b.raw_size || bytes > b.raw_size - (uint64_t)(q - lo)))
                        abort();
                }
            }
}

/* run: bind the image (all experts at load, then lazily), check the views and
 * run two tokens through what bound. */
static void run(const uint8_t *data, size_t size) {
    struct moe_model *m = NULL;
    struct moe_model_params lazy = moe_model_default_params();
    lazy.lazy_experts = 1;
    if (moe_model_load_bundle_memory(data, size, "fuzz-lazy", &lazy, &m) == MOE_OK) {
        check_expert_views(m, data, size);
        moe_model_free(m);
    } else if (m) {
        abort(); /* the handle must be cleared on error */
    }
    m = NULL;
    if (moe_model_load_bundle_memory(data, size, "fuzz", NULL, &m) != MOE_OK) {
        if (m) abort(); /* the handle must be cleared on error */
        return;
    }
    check_views(m, data, size);
    check_expert_views(m, data, size);
    /* keep the forward pass cheap: the fuzzer is after reads, not arithmetic */
    const struct moe_config *c = &m->cfg;
    if ((int64_t)c->n_vocab * c->n_embd <= (1 << 22) && c->n_layer <= 8) {
        struct moe_session_params sp = moe_session_default_params();
        sp.n_ctx = 4;
        sp.n_threads = 1;
        struct moe_session *s = NULL;
        float *logits = malloc(sizeof(float) * (size_t)c->n_vocab * 2);
        int32_t ids[2] = {0, c->n_vocab - 1};
        if (logits && moe_session_create(m, &sp, &s) == MOE_OK) moe_session_forward(s, ids, 2, logits, 1);
        moe_session_free(s);
        free(logits);
    }
    moe_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        moe_log_set(quiet, NULL);
        init = 1;
    }
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    run(copy, size);
    reseal(copy, size);
    run(copy, size);
    free(copy);
    return 0;
}

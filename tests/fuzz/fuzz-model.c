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
 * An input that starts with the bundle magic is an image and runs twice: as
 * given, and with every checksum a mutation cannot plausibly get right
 * recomputed (fz_reseal: header, directory, tensors, blobs, tuning slots and
 * their payloads), so mutations of the directory reach the binder.
 *
 * Any other input is a recipe (fuzz-bundle-gen.h has the container part): the
 * architecture (all eight families), the shapes, the rope scaling and the
 * family's options of a config.json, edits of that config (a key from the
 * parser's list set to a boundary value, or removed), dense, vector and expert
 * types (f32 to k-quants and mxfp4), zstd blobs, a bit-width map, a
 * generation_config; the tensors are those the parsed config asks for (so an
 * edited config still binds), then edits of tensors (dropped, renamed,
 * reshaped, retyped, shortened, NaN) and of precision descriptors, then edits
 * of the laid-out bytes, resealed unless the recipe says not to. The empty
 * input is a small Mixtral that binds and runs, so a run from an empty corpus
 * starts at the forward pass (issue 30; docs/fuzzing.md has the counts). In
 * the libFuzzer build the structure-aware mutator of fuzz-bundle-gen.h
 * (LLVMFuzzerCustomMutator) also mutates images field by field.
 *
 * Build with -DMOE_BUILD_FUZZ=ON (clang, libFuzzer; see docs/fuzzing.md), then
 *   build-fuzz/tests/fuzz-model -max_total_time=600 -jobs=1 -timeout=10 \
 *       -rss_limit_mb=2048 /tmp/model-corpus tests/fuzz/corpus/model
 * The image seeds in tests/fuzz/corpus/model are tiny synthetic Mixtral
 * bundles made by `fuzz-model-seeds tests/fuzz/corpus/model build/moe-prep`,
 * including short-lm-head.moeb; the recipe-* seeds were found by runs from
 * nothing. ctest replays them (fuzz-model-replay).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-bundle-gen.h"
#include "fuzz-config-gen.h"
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

/* ---- recipes: a model bundle built from the input (fuzz-bundle-gen.h) ---- */

/* The data of one tensor or blob part: up to four distinct rows (values from
 * a small generator, quantized to the type) repeated, cheap even at k-quants. */
static uint64_t g_rng;

static float frand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) & 0xffff) / 65536.0f - 0.5f;
}

/* fill: rows x cols of type t into dst (nbytes, from moe_qtype_row_bytes);
 * kind 0 weights, 1 norm weights (about 1), 2 biases (small). */
static void fill(uint8_t *dst, enum moe_qtype t, int64_t rows, int64_t cols, int kind) {
    const size_t rb = moe_qtype_row_bytes(t, cols);
    float *row = malloc(sizeof(float) * (size_t)(cols ? cols : 1));
    if (!row || !rb) {
        free(row);
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        if (r < 4) {
            for (int64_t c = 0; c < cols; c++)
                row[c] = kind == 1 ? 1.0f + 0.1f * frand() : kind == 2 ? 0.05f * frand() : 0.4f * frand();
            if (moe_quantize_row(t, row, dst + (size_t)r * rb, cols) != MOE_OK) break;
        } else {
            memcpy(dst + (size_t)r * rb, dst + (size_t)(r % 4) * rb, rb);
        }
    }
    free(row);
}

/* fit: t if rows of cols elements are whole blocks of it, else f32. */
static enum moe_qtype fit(enum moe_qtype t, int64_t cols) {
    return cols > 0 && cols % moe_qtype_block_size(t) == 0 ? t : MOE_QTYPE_F32;
}

#define BUDGET (8u << 20) /* bytes of tensors and blobs; past it tensors keep their shape and get 64 bytes */

struct gen {
    struct fz_bundle *b;
    struct fz_arena *a;
    enum moe_qtype dense, vec;
    size_t used;
};

static void tensor(struct gen *g, int kind, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* tensor: a matrix (rows > 0) or vector (rows == 0) named by fmt. */
static void tensor(struct gen *g, int kind, int64_t rows, int64_t cols, const char *fmt, ...) {
    struct fz_bundle *b = g->b;
    if (b->n_tensors == FZ_MAX_TENSORS) return;
    char *name = fz_alloc(g->a, 128);
    if (!name) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, 128, fmt, ap);
    va_end(ap);
    struct fz_tensor *t = &b->t[b->n_tensors++];
    memset(t, 0, sizeof *t);
    t->name = name, t->nlen = (uint32_t)strlen(name);
    const enum moe_qtype type = fit(rows ? (kind ? MOE_QTYPE_F32 : g->dense) : g->vec, cols);
    t->type = type;
    t->ndims = rows ? 2 : 1;
    t->dims[0] = (uint64_t)(rows ? rows : cols), t->dims[1] = rows ? (uint64_t)cols : 0;
    const size_t bytes = moe_qtype_row_bytes(type, cols) * (size_t)(rows ? rows : 1);
    if (rows < 0 || cols < 0 || bytes > BUDGET - g->used) {
        t->size = 64; /* over the budget: the binder refuses the size */
        return;
    }
    uint8_t *d = fz_alloc(g->a, bytes);
    if (!d) return;
    g_rng = 0x9E3779B97F4A7C15ull ^ ((uint64_t)b->n_tensors << 32) ^ g->used;
    fill(d, type, rows ? rows : 1, cols, rows ? 0 : kind);
    g->used += bytes;
    t->data = d, t->size = bytes;
}

/* tensors: every tensor the parsed config c asks the binder for (model.c,
 * bind_all), in the family's spelling; a tied model without lm_head when
 * omit_head. */
static void tensors(struct gen *g, const struct moe_config *c, int omit_head) {
    const int64_t V = c->n_vocab, H = c->n_embd;
    const int ln = c->norm == MOE_NORM_LAYER, mla = c->attn == MOE_ATTN_MLA;
    const int sparse_block = c->arch == MOE_ARCH_MIXTRAL || c->arch == MOE_ARCH_PHIMOE;
    const char *moe = sparse_block ? "block_sparse_moe" : "mlp";
    const char *router = c->arch == MOE_ARCH_GPT_OSS ? "router" : "gate";
    const char *shared = mla ? "mlp.shared_experts" : "mlp.shared_expert";
    tensor(g, 0, V, H, "model.embed_tokens.weight");
    tensor(g, 1, 0, H, "model.norm.weight");
    if (ln) tensor(g, 2, 0, H, "model.norm.bias");
    if (!(c->tie_embeddings && omit_head)) tensor(g, 0, V, H, "lm_head.weight");
    if (c->lm_head_bias) tensor(g, 2, 0, V, "lm_head.bias");
    for (int l = 0; l < c->n_layer && l < 8; l++) {
        const char *p = "model.layers";
        tensor(g, 1, 0, H, "%s.%d.input_layernorm.weight", p, l);
        tensor(g, 1, 0, H, "%s.%d.post_attention_layernorm.weight", p, l);
        if (ln) {
            tensor(g, 2, 0, H, "%s.%d.input_layernorm.bias", p, l);
            tensor(g, 2, 0, H, "%s.%d.post_attention_layernorm.bias", p, l);
        }
        const int64_t nh = c->n_head, q = nh * c->head_dim, kv = (int64_t)c->n_head_kv * c->head_dim;
        if (mla) {
            const int64_t r = c->kv_lora_rank, kva = r + c->qk_rope_dim, qr = c->q_lora_rank;
            if (qr > 0) {
                tensor(g, 0, qr, H, "%s.%d.self_attn.q_a_proj.weight", p, l);
                if (c->attn_qkv_bias) tensor(g, 2, 0, qr, "%s.%d.self_attn.q_a_proj.bias", p, l);
                tensor(g, 1, 0, qr, "%s.%d.self_attn.q_a_layernorm.weight", p, l);
                tensor(g, 0, q, qr, "%s.%d.self_attn.q_b_proj.weight", p, l);
            } else {
                tensor(g, 0, q, H, "%s.%d.self_attn.q_proj.weight", p, l);
            }
            tensor(g, 0, kva, H, "%s.%d.self_attn.kv_a_proj_with_mqa.weight", p, l);
            if (c->attn_qkv_bias) tensor(g, 2, 0, kva, "%s.%d.self_attn.kv_a_proj_with_mqa.bias", p, l);
            tensor(g, 1, 0, r, "%s.%d.self_attn.kv_a_layernorm.weight", p, l);
            tensor(g, 0, nh * (c->qk_nope_dim + c->v_head_dim), r, "%s.%d.self_attn.kv_b_proj.weight", p, l);
            tensor(g, 0, H, nh * c->v_head_dim, "%s.%d.self_attn.o_proj.weight", p, l);
        } else {
            tensor(g, 0, q, H, "%s.%d.self_attn.q_proj.weight", p, l);
            tensor(g, 0, kv, H, "%s.%d.self_attn.k_proj.weight", p, l);
            tensor(g, 0, kv, H, "%s.%d.self_attn.v_proj.weight", p, l);
            tensor(g, 0, H, q, "%s.%d.self_attn.o_proj.weight", p, l);
            if (c->attn_qkv_bias) {
                tensor(g, 2, 0, q, "%s.%d.self_attn.q_proj.bias", p, l);
                tensor(g, 2, 0, kv, "%s.%d.self_attn.k_proj.bias", p, l);
                tensor(g, 2, 0, kv, "%s.%d.self_attn.v_proj.bias", p, l);
            }
            if (c->attn_sinks) tensor(g, 2, 0, nh, "%s.%d.self_attn.sinks", p, l);
            if (c->qk_norm != MOE_QK_NORM_NONE) {
                const int full = c->qk_norm == MOE_QK_NORM_FULL;
                tensor(g, 1, 0, full ? q : c->head_dim, "%s.%d.self_attn.q_norm.weight", p, l);
                tensor(g, 1, 0, full ? kv : c->head_dim, "%s.%d.self_attn.k_norm.weight", p, l);
            }
        }
        if (c->attn_o_bias) tensor(g, 2, 0, H, "%s.%d.self_attn.o_proj.bias", p, l);
        if (!c->layer_moe[l]) {
            const int64_t D = c->n_ff_dense;
            tensor(g, 0, D, H, "%s.%d.mlp.gate_proj.weight", p, l);
            tensor(g, 0, D, H, "%s.%d.mlp.up_proj.weight", p, l);
            tensor(g, 0, H, D, "%s.%d.mlp.down_proj.weight", p, l);
            continue;
        }
        tensor(g, 3, c->n_expert, H, "%s.%d.%s.%s.weight", p, l, moe, router); /* routers stay f32 */
        if (c->router_bias) tensor(g, 2, 0, c->n_expert, "%s.%d.%s.%s.bias", p, l, moe, router);
        if (c->router == MOE_ROUTER_SIGMOID_GROUP)
            tensor(g, 2, 0, c->n_expert, "%s.%d.%s.gate.e_score_correction_bias", p, l, moe);
        if (c->n_ff_shared > 0) {
            const int64_t Sh = c->n_ff_shared;
            tensor(g, 0, Sh, H, "%s.%d.%s.gate_proj.weight", p, l, shared);
            tensor(g, 0, Sh, H, "%s.%d.%s.up_proj.weight", p, l, shared);
            tensor(g, 0, H, Sh, "%s.%d.%s.down_proj.weight", p, l, shared);
            if (c->shared_gated) tensor(g, 3, 1, H, "%s.%d.%s.shared_expert_gate.weight", p, l, moe);
        }
    }
}

/* tensor_edits: the recipe's changes to the tensor list (the container stays
 * valid; the binder must refuse or cope). */
static void tensor_edits(struct fz_src *s, struct gen *g) {
    struct fz_bundle *b = g->b;
    static const uint32_t k_types[] = {MOE_QTYPE_F32, MOE_QTYPE_F16, MOE_QTYPE_Q8_0, MOE_QTYPE_Q4_0,
                                       MOE_QTYPE_BF16, MOE_QTYPE_MXFP4, 99};
    for (unsigned n = fz_pick(s, 4, 0), k = 0; k < n && b->n_tensors; k++) {
        const int i = (int)(fz_byte(s) % (unsigned)b->n_tensors);
        const unsigned kind = fz_pick(s, 10, 0), arg = fz_byte(s);
        struct fz_tensor *t = &b->t[i];
        switch (kind) {
        case 0: /* dropped */
            memmove(t, t + 1, sizeof *t * (size_t)(b->n_tensors - i - 1));
            b->n_tensors--;
            break;
        case 1: t->dims[0] += 1; break;
        case 2: t->dims[t->ndims ? t->ndims - 1 : 0] *= 2; break;
        case 3: {
            uint64_t x = t->dims[0];
            t->dims[0] = t->dims[1], t->dims[1] = x;
            break;
        }
        case 4: t->type = k_types[arg % (sizeof k_types / sizeof k_types[0])]; break;
        case 5: t->size /= 2; break;
        case 6: { /* renamed: the original is missing, the new one unbound */
            char *nm = fz_alloc(g->a, t->nlen + 2);
            if (!nm) break;
            memcpy(nm, t->name, t->nlen);
            nm[t->nlen] = 'x';
            t->name = nm, t->nlen++;
            break;
        }
        case 7: /* an extra tensor nothing binds */
            if (b->n_tensors < FZ_MAX_TENSORS) {
                b->t[b->n_tensors] = *t;
                b->t[b->n_tensors].name = "model.extra.weight";
                b->t[b->n_tensors++].nlen = 18;
            }
            break;
        case 8: /* a NaN, an infinity or a huge value in the first element */
            if (t->data && t->size >= 4) {
                uint8_t *d = (uint8_t *)(uintptr_t)t->data;
                static const uint32_t k_bits[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu};
                if (t->type == MOE_QTYPE_F32) fz_wr32(d, k_bits[arg % 4]);
                else d[0] = d[1] = 0xff; /* f16 / bf16 NaN, a NaN block scale */
            }
            break;
        default: t->ndims = arg % 2 ? 1 : 3; break; /* another rank */
        }
    }
}

/* experts: the expert section for c: P precisions of the recipe's types (gate,
 * up, down and, for gpt-oss, an f32 row of biases), edits of the descriptors,
 * one blob per precision shared by every expert, raw or zstd. */
static int experts(struct fz_src *s, struct gen *g, const struct moe_config *c) {
    static const enum moe_qtype k_types[] = {MOE_QTYPE_F32, MOE_QTYPE_Q8_0, MOE_QTYPE_Q4_0, MOE_QTYPE_F16,
                                             MOE_QTYPE_BF16, MOE_QTYPE_MXFP4, MOE_QTYPE_Q4_K, MOE_QTYPE_Q2_K,
                                             MOE_QTYPE_Q3_K, MOE_QTYPE_Q5_K, MOE_QTYPE_Q6_K};
    struct fz_bundle *b = g->b;
    const int64_t H = c->n_embd, F = c->n_ff_expert;
    b->L = (uint32_t)c->n_layer, b->E = (uint32_t)c->n_expert, b->P = 1 + fz_pick(s, 3, 1);
    const unsigned comp = fz_pick(s, 3, 0);
    char *names = fz_alloc(g->a, 64 * FZ_MAX_PREC);
    if (!names) return 0;
    for (uint32_t p = 0; p < b->P; p++) {
        struct fz_prec *d = &b->prec[p];
        enum moe_qtype t = k_types[fz_pick(s, sizeof k_types / sizeof k_types[0], p)];
        if (fit(t, H) != t || fit(t, F) != t) /* the k-quants need 256-wide rows */
            t = fit(MOE_QTYPE_Q8_0, H) == MOE_QTYPE_Q8_0 && fit(MOE_QTYPE_Q8_0, F) == MOE_QTYPE_Q8_0 ? MOE_QTYPE_Q8_0
                                                                                                   : MOE_QTYPE_F32;
        int dup = 0; /* names are unique: a second precision of one type gets a suffix */
        for (uint32_t q = 0; q < p; q++) dup |= b->prec[q].part[0].type == (uint32_t)t;
        snprintf(names + 64 * p, 64, dup ? "%s-%u" : "%s", moe_qtype_name(t), p);
        d->name = names + 64 * p, d->nlen = (uint32_t)strlen(d->name);
        d->nparts = c->expert_bias ? 4 : 3;
        const int64_t shp[4][2] = {{F, H}, {F, H}, {H, F}, {1, 2 * F + H}};
        for (int k = 0; k < 4; k++) {
            enum moe_qtype pt = k == 3 ? MOE_QTYPE_F32 : t;
            d->part[k] = (struct fz_part){pt, 0, (uint64_t)shp[k][0], (uint64_t)shp[k][1],
                                          moe_qtype_row_bytes(pt, shp[k][1]) * (uint64_t)shp[k][0]};
        }
    }
    for (unsigned n = fz_pick(s, 3, 0), k = 0; k < n; k++) { /* descriptor edits: before the blobs, which follow */
        struct fz_prec *d = &b->prec[fz_byte(s) % b->P];
        struct fz_part *q = &d->part[fz_byte(s) % 4];
        switch (fz_pick(s, 6, 0)) {
        case 0: q->rows += 1, q->nbytes += moe_qtype_row_bytes((enum moe_qtype)q->type, (int64_t)q->cols); break;
        case 1: q->cols *= 2, q->nbytes *= 2; break;
        case 2: q->type = q->type == MOE_QTYPE_F32 ? MOE_QTYPE_Q8_0 : MOE_QTYPE_F32; break;
        case 3: q->nbytes -= 1; break;
        case 4: d->nparts = d->nparts > 1 ? d->nparts - 1 : 1; break;
        default: d->nparts = d->nparts < 4 ? d->nparts + 1 : 4; break;
        }
    }
    const size_t n_blob = (size_t)b->L * b->E * b->P;
    if (n_blob > FZ_MAX_BLOBS * 16) return 0;
    b->blob = fz_alloc(g->a, sizeof *b->blob * (n_blob + 1));
    if (!b->blob) return 0;
    for (uint32_t p = 0; p < b->P; p++) {
        const struct fz_prec *d = &b->prec[p];
        uint64_t raw_size = fz_layout_size(d);
        if (raw_size > BUDGET - g->used) raw_size = 64; /* the reader refuses the mismatch */
        uint8_t *raw = fz_alloc(g->a, (size_t)raw_size);
        if (!raw) return 0;
        g->used += (size_t)raw_size;
        uint64_t off = 0;
        for (uint32_t k = 0; k < d->nparts && raw_size > 64; k++) {
            const struct fz_part *q = &d->part[k];
            if (k) off = (off + 63) & ~(uint64_t)63;
            if (q->nbytes == moe_qtype_row_bytes((enum moe_qtype)q->type, (int64_t)q->cols) * q->rows) {
                g_rng = 0x2545F4914F6CDD1Dull * (p * 4 + k + 1);
                fill(raw + off, (enum moe_qtype)q->type, (int64_t)q->rows, (int64_t)q->cols, k == 3 ? 2 : 0);
            }
            off += q->nbytes;
        }
        for (uint32_t l = 0; l < b->L; l++)
            for (uint32_t e = 0; e < b->E && c->layer_moe[l]; e++) {
                const size_t i = ((size_t)l * b->E + e) * b->P + p;
                b->blob[i] = (struct fz_blob){raw, raw_size, comp == 1 || (comp == 2 && i % 2), (unsigned)(i * 7 + p)};
            }
    }
    return 1;
}

/* build: the model bundle a recipe describes (see the top of the file). */
static int build(struct fz_src *s, struct fz_arena *a, struct fz_bundle *b) {
    static struct jcfg j;
    memset(b, 0, sizeof *b);
    const int arch = config_json(s, &j);
    static const enum moe_qtype k_dense[] = {MOE_QTYPE_F32, MOE_QTYPE_Q8_0, MOE_QTYPE_F16, MOE_QTYPE_BF16,
                                             MOE_QTYPE_Q4_0};
    static const enum moe_qtype k_vec[] = {MOE_QTYPE_F32, MOE_QTYPE_F16, MOE_QTYPE_BF16};
    struct gen g = {b, a, k_dense[fz_pick(s, 5, 0)], k_vec[fz_pick(s, 3, 0)], 0};
    const unsigned gen_cfg = fz_pick(s, 4, 0), bw = fz_pick(s, 4, 0), omit_head = fz_pick(s, 2, 1);
    char *cfg = fz_alloc(a, jtext_size(&j));
    if (!cfg) return 0;
    jtext(&j, cfg);
    fz_kv_str(&b->meta, "general.architecture", k_class[arch]);
    fz_kv_str(&b->meta, "hf.config.json", cfg);
    static const char *const k_gen[] = {NULL, "{\"bos_token_id\":1,\"eos_token_id\":[2,3]}",
                                        "{\"eos_token_id\":[1000000,-1,2]}", "not json"};
    if (k_gen[gen_cfg]) fz_kv_str(&b->meta, "hf.generation_config.json", k_gen[gen_cfg]);
    struct moe_config c;
    if (moe_config_parse(cfg, strlen(cfg), "recipe", &c) != MOE_OK) { /* the load stops at the config */
        b->slot[0] = (struct fz_slot){.state = 2, .seq = 1};
        return 1;
    }
    int ok = 0;
    if (c.n_layer > 64 || c.n_expert > 64) goto done; /* an edit made it huge: not worth the bytes */
    tensors(&g, &c, (int)omit_head);
    tensor_edits(s, &g);
    if (!experts(s, &g, &c)) goto done;
    b->slot[0] = (struct fz_slot){.state = 2, .seq = 1};
    if (bw) { /* a bit-width map: valid, one entry short, or out of range */
        size_t n = (size_t)c.n_layer * (size_t)c.n_expert - (bw == 2);
        int64_t *map = fz_alloc(a, sizeof(int64_t) * (n + 1));
        if (!map) goto done;
        for (size_t i = 0; i < n; i++)
            map[i] = !c.layer_moe[i / (size_t)c.n_expert] ? -1
                     : bw == 3 && i == 0                 ? (int64_t)b->P
                                                         : (int64_t)(i % b->P);
        b->slot[0].state = 1;
        fz_kv_set(&b->slot[0].kv, "edgemoe.bitwidth.map", 20, 6, map, 8 * n);
    }
    ok = 1;
done:
    moe_config_clear(&c);
    return ok;
}

/* expand: the recipe as an image (fz_expand with this target's builder). */
static uint8_t *expand(const uint8_t *data, size_t size, size_t *len) { return fz_expand(build, 8, data, size, len); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        moe_log_set(quiet, NULL);
        init = 1;
    }
    if (size >= 8 && !memcmp(data, "MOEBUNDL", 8)) { /* an image: as given, then resealed */
        uint8_t *copy = malloc(size ? size : 1);
        if (!copy) return 0;
        memcpy(copy, data, size);
        run(copy, size);
        fz_reseal(copy, size);
        run(copy, size);
        free(copy);
        return 0;
    }
    size_t n = 0; /* a recipe: the bundle it describes, in a buffer of exactly its size */
    uint8_t *img = expand(data, size, &n), *copy = img ? malloc(n ? n : 1) : NULL;
    if (copy) {
        memcpy(copy, img, n);
        run(copy, n);
    }
    free(copy);
    free(img);
    return 0;
}

#ifdef MOE_LIBFUZZER
/* The structure-aware mutator (fuzz-bundle-gen.h, fz_mutate). */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    return fz_mutate(data, size, max_size, seed, expand);
}
#endif

/*
 * test-gguf-model.c - GGUF files (tests/fixtures/gguf, written by
 * tests/oracle/make_gguf_fixtures.py from the Hugging Face fixtures) against
 * the Hugging Face path:
 *   - every architecture: the model loaded from the GGUF has the same
 *     config, the same non-expert tensors and the same experts value for value
 *     as the checkpoint directory, its prefill and decode logits equal the
 *     checkpoint path's (F32 / MXFP4: bit for bit; F16: within 1e-5, the
 *     float32 router going through another kernel) and transformers' within
 *     1e-4, the greedy tokens are transformers', and its tokenizer turns the
 *     oracle's prompt text into the oracle's ids;
 *   - q8_0 experts of a GGUF are the bytes moe_quantize_row makes of the
 *     checkpoint's float32 experts;
 *   - the vocabulary-only GGUFs tokenize every case text into the ids
 *     llama.cpp's algorithm gives (as the fixture script re-implements it:
 *     its SentencePiece merge loop, or the tokenizers library set up with
 *     llama.cpp's pre-tokenizer regexes);
 *   - moe-prep quantize writes the same tensors and expert blobs from an F32
 *     GGUF as from its checkpoint directory;
 *   - moe-prep quantize of a q4_k GGUF with --experts q4_k,q2_k keeps every
 *     q4_k expert block and q8_0 matrix byte for byte and makes q2_k from the
 *     dequantized blocks; the bundle's logits equal the GGUF's bit for bit;
 *     an MXFP4 GGUF's experts and biases go into an mxfp4 bundle unchanged;
 *   - moe-prep check and moe-run take a .gguf (moe-run gives the checkpoint
 *     directory's tokens and logits).
 * argv[1] = moe-prep, argv[2] = moe-run.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe-bundle.h"
#include "moe-gguf-model.h"
#include "moe-gguf.h"
#include "moe-mmap.h"
#include "moe-model.h"
#include "moe-sampler.h"
#include "moe-session.h"
#include "moe-test.h"
#include "moe-tokenizer.h"

static const char *prep, *run;
static char tmp[256];

static cJSON *read_json(const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (moe_read_file(path, 64u << 20, &text, &len) != MOE_OK) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    return j;
}

static int read_ids(const cJSON *a, int32_t *out, int max) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) if (n < max) out[n++] = (int32_t)e->valueint;
    return n;
}

static float *read_f32(const char *path, size_t n) {
    char *buf = NULL;
    size_t len = 0;
    if (moe_read_file(path, 1u << 30, &buf, &len) != MOE_OK || len != n * 4) {
        free(buf);
        return NULL;
    }
    return (float *)(void *)buf;
}

static float max_abs_diff(const float *a, const float *b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* same_weight: equal shape and, dequantized, equal values (exact). */
static int same_weight(const struct moe_weight *a, const struct moe_weight *b) {
    if (a->n_out != b->n_out || a->n_in != b->n_in) return 0;
    float *x = malloc(sizeof(float) * (size_t)a->n_in), *y = malloc(sizeof(float) * (size_t)a->n_in);
    size_t ra = moe_qtype_row_bytes(a->type, a->n_in), rb = moe_qtype_row_bytes(b->type, b->n_in);
    int ok = x && y;
    for (int64_t r = 0; ok && r < a->n_out; r++) {
        ok = !moe_dequantize_row(a->type, (const char *)a->data + (size_t)r * ra, x, a->n_in) &&
             !moe_dequantize_row(b->type, (const char *)b->data + (size_t)r * rb, y, b->n_in) &&
             !memcmp(x, y, sizeof(float) * (size_t)a->n_in);
    }
    free(x);
    free(y);
    return ok;
}

/* same_model: configs, every non-expert tensor and every expert agree. */
static void same_model(const struct moe_model *g, const struct moe_model *h, const char *name) {
    const struct moe_config *a = &g->cfg, *b = &h->cfg;
    int same_cfg = a->arch == b->arch && a->n_vocab == b->n_vocab && a->n_embd == b->n_embd && a->n_layer == b->n_layer &&
                   a->n_head == b->n_head && a->n_head_kv == b->n_head_kv && a->head_dim == b->head_dim &&
                   a->n_expert == b->n_expert && a->n_expert_used == b->n_expert_used &&
                   a->n_ff_expert == b->n_ff_expert && a->n_ff_shared == b->n_ff_shared &&
                   a->norm_topk_prob == b->norm_topk_prob && a->router == b->router && a->n_group == b->n_group &&
                   a->topk_group == b->topk_group && a->routed_scale == b->routed_scale && a->norm_eps == b->norm_eps &&
                   a->rope.kind == b->rope.kind && a->rope.theta == b->rope.theta && a->rope.n_rot == b->rope.n_rot &&
                   a->rope.interleave == b->rope.interleave && a->sliding_window == b->sliding_window &&
                   a->attn_scale == b->attn_scale && a->clip_qkv == b->clip_qkv && a->swiglu_limit == b->swiglu_limit &&
                   a->tie_embeddings == b->tie_embeddings && !memcmp(a->layer_moe, b->layer_moe, (size_t)a->n_layer) &&
                   !memcmp(a->layer_sliding, b->layer_sliding, (size_t)a->n_layer);
    CHECK(same_cfg, "%s: the GGUF's config differs from config.json's", name);
    int refs = g->n_refs == h->n_refs, bad = 0;
    for (int i = 0; refs && i < h->n_refs; i++) {
        const struct moe_tensor_ref *x = NULL;
        for (int k = 0; k < g->n_refs && !x; k++)
            if (!strcmp(g->refs[k].name, h->refs[i].name)) x = &g->refs[k];
        if (!x || x->role != h->refs[i].role || !same_weight(&x->w, &h->refs[i].w)) {
            if (!bad++) fprintf(stderr, "%s: tensor %s differs\n", name, h->refs[i].name);
        }
    }
    CHECK(refs && !bad, "%s: %d of %d non-expert tensors differ (%d vs %d bound)", name, bad, h->n_refs, g->n_refs,
          h->n_refs);
    int ex = 0;
    for (int l = 0; l < a->n_layer && same_cfg; l++)
        for (int e = 0; a->layer_moe[l] && e < a->n_expert; e++) {
            struct moe_ffn x, y;
            int ok = !moe_model_expert(g, l, e, -1, &x) && !moe_model_expert(h, l, e, -1, &y) &&
                     same_weight(&x.gate, &y.gate) && same_weight(&x.up, &y.up) && same_weight(&x.down, &y.down) &&
                     !x.bias == !y.bias &&
                     (!x.bias || !memcmp(x.bias, y.bias, sizeof(float) * (size_t)(2 * a->n_ff_expert + a->n_embd)));
            ex += !ok;
        }
    CHECK(ex == 0, "%s: %d experts differ", name, ex);
}

/* run_logits: prefill + greedy decode along the oracle's tokens. */
static float *run_logits(struct moe_model *m, const int32_t *prompt, int np, const int32_t *greedy, int ng, int *same) {
    const int V = m->cfg.n_vocab;
    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = np + ng + 4;
    sp.n_threads = 2;
    struct moe_session *s = NULL;
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)(np + ng));
    *same = 1;
    if (moe_session_create(m, &sp, &s) || moe_session_forward(s, prompt, np, lg, 1)) {
        moe_session_free(s);
        free(lg);
        return NULL;
    }
    *same &= moe_argmax(lg + (size_t)(np - 1) * V, V) == greedy[0];
    for (int i = 0; i + 1 < ng; i++) {
        float *row = lg + (size_t)(np + i) * V;
        if (moe_session_forward(s, &greedy[i], 1, row, 0)) {
            free(lg);
            lg = NULL;
            break;
        }
        *same &= moe_argmax(row, V) == greedy[i + 1];
    }
    moe_session_free(s);
    return lg;
}

/* check_pair: a GGUF against the checkpoint directory it was made from. */
static void check_pair(const char *gguf, const char *hf, float tol_hf, int compare_weights) {
    char gp[1024], hp[1024], path[1200];
    snprintf(gp, sizeof gp, "%s/gguf/%s.gguf", MOE_FIXTURES, gguf);
    snprintf(hp, sizeof hp, "%s/models/%s", MOE_FIXTURES, hf);
    struct moe_model *g = NULL, *h = NULL;
    struct moe_model_params mp = moe_model_default_params();
    CHECK(moe_model_load(gp, &mp, &g) == MOE_OK && g && g->gguf, "%s: GGUF not loaded", gguf);
    CHECK(moe_model_load_hf(hp, &h) == MOE_OK, "%s: checkpoint not loaded", hf);
    snprintf(path, sizeof path, "%s/oracle/oracle.json", hp);
    cJSON *o = read_json(path);
    if (!g || !h || !o) {
        moe_model_free(g);
        moe_model_free(h);
        cJSON_Delete(o);
        return;
    }
    if (compare_weights) same_model(g, h, gguf);
    static int32_t prompt[4096], greedy[256];
    int np = read_ids(cJSON_GetObjectItem(o, "prompt_ids"), prompt, 4096);
    int ng = read_ids(cJSON_GetObjectItem(o, "greedy_ids"), greedy, 256);
    const int V = h->cfg.n_vocab;
    snprintf(path, sizeof path, "%s/oracle/prefill_logits.f32", hp);
    float *pre = read_f32(path, (size_t)np * V);
    snprintf(path, sizeof path, "%s/oracle/decode_logits.f32", hp);
    float *dec = read_f32(path, (size_t)(ng - 1) * V);
    int same_g = 0, same_h = 0;
    float *lg = run_logits(g, prompt, np, greedy, ng, &same_g), *lh = run_logits(h, prompt, np, greedy, ng, &same_h);
    CHECK(lg && lh && pre && dec, "%s: runs", gguf);
    if (lg && lh && pre && dec) {
        const size_t n = (size_t)(np + ng - 1) * V;
        float e_hf = max_abs_diff(lg, lh, n);
        float e_or = fmaxf(max_abs_diff(lg, pre, (size_t)np * V), max_abs_diff(lg + (size_t)np * V, dec, (size_t)(ng - 1) * V));
        CHECK(e_hf <= tol_hf, "%s: logits differ from the checkpoint path's by %g (> %g)", gguf, e_hf, tol_hf);
        CHECK(e_or <= 1e-4f, "%s: logits differ from transformers' by %g", gguf, e_or);
        CHECK(same_g && same_h, "%s: greedy tokens differ from transformers'", gguf);
        printf("  %-18s vs %-18s logits %s (max diff %.1e), transformers %.1e, greedy %s\n", gguf, hf,
               e_hf == 0 ? "bit-identical" : "close", e_hf, e_or, same_g ? "identical" : "DIFFERENT");
    }
    /* the GGUF's tokenizer gives the oracle prompt's ids */
    const cJSON *src = cJSON_GetObjectItem(o, "prompt_source"), *text = cJSON_GetObjectItem(o, "prompt_text");
    if (cJSON_IsString(src) && !strcmp(src->valuestring, "tokenizer") && cJSON_IsString(text)) {
        int32_t *ids = NULL;
        size_t nid = 0;
        CHECK(g->tok && moe_tokenizer_encode(g->tok, text->valuestring, strlen(text->valuestring), 1, &ids, &nid) == MOE_OK &&
                  nid == (size_t)np && !memcmp(ids, prompt, sizeof(int32_t) * nid),
              "%s: the GGUF tokenizer does not give the oracle's prompt ids (%zu ids)", gguf, nid);
        free(ids);
    }
    free(lg);
    free(lh);
    free(pre);
    free(dec);
    cJSON_Delete(o);
    moe_model_free(g);
    moe_model_free(h);
}

/* check_q8_experts: a q8_0 GGUF's expert rows are moe_quantize_row's q8_0 of
 * the checkpoint's float32 rows (the same quantizer as gguf.quants). */
static void check_q8_experts(void) {
    char gp[1024], hp[1024];
    snprintf(gp, sizeof gp, "%s/gguf/gpt_oss-q8_0.gguf", MOE_FIXTURES);
    snprintf(hp, sizeof hp, "%s/models/gpt_oss-f32", MOE_FIXTURES);
    struct moe_model *g = NULL, *h = NULL;
    CHECK(moe_model_load_gguf(gp, &g) == MOE_OK && moe_model_load_hf(hp, &h) == MOE_OK, "gpt_oss q8_0: load");
    int bad = 0, n = 0;
    for (int l = 0; g && h && l < g->cfg.n_layer; l++)
        for (int e = 0; e < g->cfg.n_expert; e++) {
            struct moe_ffn x, y;
            if (moe_model_expert(g, l, e, -1, &x) || moe_model_expert(h, l, e, -1, &y)) {
                bad++;
                continue;
            }
            const struct moe_weight *wx[3] = {&x.gate, &x.up, &x.down}, *wy[3] = {&y.gate, &y.up, &y.down};
            for (int k = 0; k < 3; k++) {
                const int64_t cols = wy[k]->n_in;
                const size_t rb = moe_qtype_row_bytes(MOE_QTYPE_Q8_0, cols);
                char *q = malloc(rb);
                bad += wx[k]->type != MOE_QTYPE_Q8_0;
                for (int64_t r = 0; wx[k]->type == MOE_QTYPE_Q8_0 && r < wy[k]->n_out; r++, n++) {
                    moe_quantize_row(MOE_QTYPE_Q8_0, (const float *)wy[k]->data + r * cols, q, cols);
                    bad += memcmp(q, (const char *)wx[k]->data + (size_t)r * rb, rb) != 0;
                }
                free(q);
            }
        }
    CHECK(n > 0 && bad == 0, "gpt_oss q8_0: %d of %d expert rows differ from moe_quantize_row", bad, n);
    printf("  gpt_oss-q8_0       %d expert rows: the GGUF's q8_0 blocks are moe_quantize_row's\n", n);
    moe_model_free(g);
    moe_model_free(h);
}

/* check_tokenizers: the vocabulary-only GGUFs against llama.cpp's ids. */
static void check_tokenizers(void) {
    static const char *const names[] = {"llama-spbpe", "phi-spbpe", "qwen-bytelevel", "neox-bytelevel"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char gp[1024], jp[1024];
        snprintf(gp, sizeof gp, "%s/gguf/tokenizers/%s.gguf", MOE_FIXTURES, names[i]);
        snprintf(jp, sizeof jp, "%s/gguf/tokenizers/%s.json", MOE_FIXTURES, names[i]);
        struct moe_gguf *g = NULL;
        char *tj = NULL, *tc = NULL;
        struct moe_tokenizer *tok = NULL;
        cJSON *cases = read_json(jp);
        CHECK(cases && moe_gguf_open(gp, &g) == MOE_OK && moe_gguf_vocab_texts(g, &tj, &tc) == MOE_OK &&
                  moe_tokenizer_load_texts(tj, strlen(tj), tc, strlen(tc), gp, &tok) == MOE_OK,
              "%s: tokenizer not loaded", names[i]);
        int n = 0, ok = 0, same_hf = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, cases) {
            const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
            int32_t want[8192], *ids = NULL;
            int nw = read_ids(cJSON_GetObjectItem(c, "ids"), want, 8192);
            size_t nid = 0;
            n++;
            same_hf += cJSON_IsTrue(cJSON_GetObjectItem(c, "same_as_tokenizer_json"));
            if (tok && moe_tokenizer_encode(tok, text, strlen(text), 1, &ids, &nid) == MOE_OK && nid == (size_t)nw &&
                !memcmp(ids, want, sizeof(int32_t) * nid))
                ok++;
            else
                fprintf(stderr, "%s: case %d (%.30s...) differs\n", names[i], n - 1, text);
            free(ids);
        }
        CHECK(n > 40 && ok == n, "%s: %d of %d cases give llama.cpp's ids", names[i], ok, n);
        printf("  tokenizers/%-15s %d/%d cases as llama.cpp tokenizes them (%d of them also as tokenizer.json)\n",
               names[i], ok, n, same_hf);
        moe_tokenizer_free(tok);
        free(tj);
        free(tc);
        moe_gguf_free(g);
        cJSON_Delete(cases);
    }
}

/* check_stored_types: q4_k GGUF -> bundle keeps the blocks; mxfp4 likewise. */
static void check_bundle_blocks(const char *gguf, const char *experts, const char *kept, const char *converted) {
    char gp[1024], bp[600], out[4096];
    snprintf(gp, sizeof gp, "%s/gguf/%s.gguf", MOE_FIXTURES, gguf);
    snprintf(bp, sizeof bp, "%s/%s.moeb", tmp, gguf);
    CHECK(moe_test_sh_out(out, sizeof out, "%s quantize %s -o %s --experts %s --dense q8_0 -t 2 2>&1", prep, gp, bp, experts) == 0,
          "%s: quantize: %s", gguf, out);
    struct moe_model *g = NULL;
    struct moe_bundle *b = NULL;
    uint32_t pk = 0, pc = 0;
    CHECK(moe_model_load_gguf(gp, &g) == MOE_OK && moe_bundle_open(bp, &b) == MOE_OK &&
              moe_bundle_find_precision(b, kept, &pk) == MOE_OK &&
              (!converted || moe_bundle_find_precision(b, converted, &pc) == MOE_OK),
          "%s: open the GGUF and the bundle", gguf);
    int blobs = 0, bad = 0, conv_bad = 0;
    for (int l = 0; g && b && l < g->cfg.n_layer; l++)
        for (int e = 0; g->cfg.layer_moe[l] && e < g->cfg.n_expert; e++) {
            struct moe_ffn f;
            struct moe_bundle_blob blob;
            if (moe_model_expert(g, l, e, -1, &f) ||
                moe_bundle_expert(b, (uint32_t)l, (uint32_t)e, pk, &blob) || blob.compression) {
                bad++;
                continue;
            }
            const struct moe_weight *w[3] = {&f.gate, &f.up, &f.down};
            for (int k = 0; k < 3; k++) {
                const struct moe_bundle_part *pt = &blob.desc->parts[k];
                size_t nb = moe_qtype_row_bytes(w[k]->type, w[k]->n_in) * (size_t)w[k]->n_out;
                bad += pt->type_id != (uint32_t)w[k]->type || pt->nbytes != nb ||
                       memcmp((const char *)blob.stored + pt->offset, w[k]->data, nb) != 0;
            }
            if (f.bias) {
                const struct moe_bundle_part *pt = &blob.desc->parts[3];
                bad += memcmp((const char *)blob.stored + pt->offset, f.bias, pt->nbytes) != 0;
            }
            blobs++;
            if (!converted) continue;
            /* the extra precision: quantized from the dequantized stored rows */
            if (moe_bundle_expert(b, (uint32_t)l, (uint32_t)e, pc, &blob) || blob.compression) {
                conv_bad++;
                continue;
            }
            for (int k = 0; k < 3; k++) {
                const struct moe_bundle_part *pt = &blob.desc->parts[k];
                const int64_t cols = w[k]->n_in;
                float *row = malloc(sizeof(float) * (size_t)cols);
                size_t srb = moe_qtype_row_bytes(w[k]->type, cols), drb = moe_qtype_row_bytes((enum moe_qtype)pt->type_id, cols);
                char *q = malloc(drb);
                for (int64_t r = 0; r < w[k]->n_out; r++) {
                    moe_dequantize_row(w[k]->type, (const char *)w[k]->data + (size_t)r * srb, row, cols);
                    moe_quantize_row((enum moe_qtype)pt->type_id, row, q, cols);
                    conv_bad += memcmp(q, (const char *)blob.stored + pt->offset + (size_t)r * drb, drb) != 0;
                }
                free(row);
                free(q);
            }
        }
    CHECK(blobs > 0 && bad == 0, "%s: %d of %d %s expert blobs are not the GGUF's blocks", gguf, bad, blobs, kept);
    CHECK(conv_bad == 0, "%s: %d %s rows are not quantized from the GGUF's dequantized blocks", gguf, conv_bad,
          converted ? converted : "-");
    /* q8_0 matrices of the GGUF are copied as they are */
    int dense = 0, dense_bad = 0;
    for (int i = 0; g && b && i < g->n_refs; i++) {
        const struct moe_tensor_ref *r = &g->refs[i];
        if (r->role != MOE_ROLE_MATRIX || r->w.type != MOE_QTYPE_Q8_0) continue;
        const struct moe_bundle_tensor *t = moe_bundle_find_tensor(b, r->name);
        size_t nb = moe_qtype_row_bytes(r->w.type, r->w.n_in) * (size_t)r->w.n_out;
        dense++;
        dense_bad += !t || t->type_id != MOE_QTYPE_Q8_0 || t->size != nb || memcmp(t->data, r->w.data, nb) != 0;
    }
    CHECK(dense_bad == 0, "%s: %d of %d q8_0 matrices were not copied", gguf, dense_bad, dense);
    printf("  %-18s -> bundle: %d %s expert blobs byte for byte the GGUF's blocks%s%s, %d q8_0 matrices copied\n",
           gguf, blobs, kept, converted ? ", " : "", converted ? converted : "", dense);
    moe_bundle_free(b);
    moe_model_free(g);
}

/* check_same_bundle: quantize gives the same tensors and expert blobs, byte
 * for byte, from a GGUF as from the checkpoint directory it was made from. */
static void check_same_bundle(const char *gguf, const char *hf) {
    char a[600], b[600], out[4096];
    snprintf(a, sizeof a, "%s/hf-%s.moeb", tmp, hf);
    snprintf(b, sizeof b, "%s/gguf-%s.moeb", tmp, gguf);
    CHECK(moe_test_sh_out(out, sizeof out, "%s quantize %s/models/%s -o %s --experts f32,q8_0,q4_k --dense q8_0 -t 2 2>&1", prep,
             MOE_FIXTURES, hf, a) == 0 &&
              moe_test_sh_out(out, sizeof out, "%s quantize %s/gguf/%s.gguf -o %s --experts f32,q8_0,q4_k --dense q8_0 -t 2 2>&1",
                 prep, MOE_FIXTURES, gguf, b) == 0,
          "%s: quantize: %s", gguf, out);
    struct moe_bundle *x = NULL, *y = NULL;
    CHECK(moe_bundle_open(a, &x) == MOE_OK && moe_bundle_open(b, &y) == MOE_OK, "%s: open the bundles", gguf);
    int tensors = 0, blobs = 0, bad = 0;
    for (size_t i = 0; x && y && i < moe_bundle_tensor_count(x); i++, tensors++) {
        const struct moe_bundle_tensor *t = moe_bundle_tensor_at(x, i), *u = moe_bundle_find_tensor(y, t->name);
        int ok = u && u->type_id == t->type_id && u->size == t->size && !memcmp(u->data, t->data, t->size);
        if (!ok) fprintf(stderr, "%s: tensor %s differs\n", gguf, t->name);
        bad += !ok;
    }
    uint32_t nl = 0, ne = 0, np = 0, nl2 = 0, ne2 = 0, np2 = 0;
    if (x && y) moe_bundle_expert_layout(x, &nl, &ne, &np), moe_bundle_expert_layout(y, &nl2, &ne2, &np2);
    bad += nl != nl2 || ne != ne2 || np != np2 || (x && y && moe_bundle_tensor_count(x) != moe_bundle_tensor_count(y));
    for (uint32_t l = 0; l < nl; l++)
        for (uint32_t e = 0; moe_bundle_layer_has_experts(x, l) && e < ne; e++)
            for (uint32_t p = 0; p < np; p++, blobs++) {
                struct moe_bundle_blob bx, by;
                int ok = !moe_bundle_expert(x, l, e, p, &bx) && !moe_bundle_expert(y, l, e, p, &by) &&
                         bx.stored_size == by.stored_size && !memcmp(bx.stored, by.stored, bx.stored_size);
                bad += !ok;
            }
    CHECK(tensors > 0 && blobs > 0 && bad == 0, "%s: %d of %d tensors and blobs differ between the bundles", gguf, bad,
          tensors + blobs);
    printf("  %-18s bundle = %s's bundle: %d tensors and %d expert blobs byte for byte\n", gguf, hf, tensors, blobs);
    moe_bundle_free(x);
    moe_bundle_free(y);
}

/* check_cli: the bundle of a q4_k GGUF runs with the GGUF's exact logits;
 * moe-run and moe-prep check take .gguf paths. */
static void check_cli(void) {
    char out[8192], out2[8192], a[400], b[400];
    snprintf(a, sizeof a, "%s/a.f32", tmp);
    snprintf(b, sizeof b, "%s/b.f32", tmp);
    const char *ids = "1,472,375,549,781,396";
    CHECK(moe_test_sh_out(out, sizeof out, "%s -m %s/gguf/mixtral-q4_k.gguf --tokens %s -n 6 --ids --ignore-eos --logits-out %s 2>/dev/null",
             run, MOE_FIXTURES, ids, a) == 0, "moe-run on the q4_k GGUF");
    CHECK(moe_test_sh_out(out2, sizeof out2, "%s -m %s/mixtral-q4_k.moeb --expert-precision q4_k --tokens %s -n 6 --ids --ignore-eos "
             "--logits-out %s 2>/dev/null", run, tmp, ids, b) == 0, "moe-run on its bundle");
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int same = moe_read_file(a, 1u << 28, &x, &nx) == MOE_OK && moe_read_file(b, 1u << 28, &y, &ny) == MOE_OK &&
               nx == ny && nx > 0 && !memcmp(x, y, nx);
    free(x), free(y);
    CHECK(same && !strcmp(out, out2), "the q4_k bundle's logits or tokens differ from the GGUF's");
    printf("  mixtral-q4_k       bundle (q4_k experts, q8_0 dense) and GGUF: logits bit-identical\n");

    /* moe-run with text: the same tokens from the GGUF as from the checkpoint directory */
    CHECK(moe_test_sh_out(out, sizeof out, "%s -m %s/gguf/mixtral-f32.gguf -p 'The quick brown fox' -n 8 --ids --ignore-eos 2>/dev/null",
             run, MOE_FIXTURES) == 0, "moe-run -p on a GGUF");
    CHECK(moe_test_sh_out(out2, sizeof out2, "%s -m %s/models/mixtral-f32 -p 'The quick brown fox' -n 8 --ids --ignore-eos 2>/dev/null",
             run, MOE_FIXTURES) == 0, "moe-run -p on the checkpoint");
    CHECK(out[0] && !strcmp(out, out2), "moe-run: GGUF ids \"%s\" vs checkpoint \"%s\"", out, out2);
    CHECK(moe_test_sh_out(out, sizeof out, "%s check %s/gguf/deepseek_v3-f32.gguf --json", prep, MOE_FIXTURES) == 0 &&
              strstr(out, "\"arch\":\"deepseek_v3\"") && strstr(out, "\"format\":\"gguf\"") &&
              strstr(out, "\"tokenizer\":true"),
          "moe-prep check --json on a GGUF: %s", out);
    CHECK(moe_test_sh_out(NULL, 0, "%s check %s/gguf/tokenizers/llama-spbpe.gguf 2>/dev/null", prep, MOE_FIXTURES) == 1,
          "moe-prep check of a vocabulary-only GGUF must fail");
    snprintf(a, sizeof a, "%s/broken.gguf", tmp);
    FILE *f = fopen(a, "wb");
    fputs("GGUF\3\0\0\0", f);
    fclose(f);
    CHECK(moe_test_sh_out(out, sizeof out, "%s check %s 2>&1", prep, a) == 1 && strstr(out, "file ends inside"),
          "a truncated GGUF: %s", out);
    printf("  CLIs: moe-run -p on a GGUF = on the checkpoint; check --json; broken files refused\n");
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test-gguf-model MOE_PREP MOE_RUN\n");
        return 2;
    }
    prep = argv[1];
    run = argv[2];
    snprintf(tmp, sizeof tmp, "/tmp/test-gguf-model-%d", (int)getpid());
    mkdir(tmp, 0755);
    static const struct {
        const char *gguf, *hf;
        float tol;
    } pairs[] = {
        {"mixtral-f32", "mixtral-f32", 0},         {"mixtral-f16", "mixtral-f16", 1e-5f},
        {"qwen2_moe-f32", "qwen2_moe-f32", 0},     {"qwen3_moe-f32", "qwen3_moe-f32", 0},
        {"olmoe-f32", "olmoe-f32", 0},             {"phimoe-norope-f32", "phimoe-norope-f32", 0},
        {"deepseek_v2-f32", "deepseek_v2-f32", 0}, {"deepseek_v3-f32", "deepseek_v3-f32", 0},
        {"gpt_oss-f32", "gpt_oss-f32", 0},         {"gpt_oss-mxfp4", "gpt_oss-mxfp4", 0},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) check_pair(pairs[i].gguf, pairs[i].hf, pairs[i].tol, 1);
    check_q8_experts();
    check_tokenizers();
    check_same_bundle("mixtral-f32", "mixtral-f32");
    check_same_bundle("deepseek_v3-f32", "deepseek_v3-f32");
    check_same_bundle("gpt_oss-f32", "gpt_oss-f32");
    check_bundle_blocks("mixtral-q4_k", "q4_k,q2_k", "q4_k", "q2_k");
    check_bundle_blocks("gpt_oss-mxfp4", "mxfp4", "mxfp4", NULL);
    check_cli();
    moe_test_sh_out(NULL, 0, "rm -rf %s", tmp);
    printf("test-gguf-model: %d checks, %d failed\n", checks, fails);
    return fails != 0;
}

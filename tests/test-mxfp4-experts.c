/*
 * test-mxfp4-experts.c - gpt-oss experts stored as MXFP4 (the released
 * checkpoints' format, fixture gpt_oss-mxfp4) are read as they are:
 *   - every expert the loader binds is mxfp4 and decodes to exactly the values
 *     OpenAI's formula gives for the checkpoint's blocks and scales (decoded
 *     here independently: byte j of a 16-byte block holds elements 2j and
 *     2j+1, value = FP4[code] * 2^(scale - 127); gate rows are the even rows
 *     of gate_up, up rows the odd ones), biases included;
 *   - `moe-prep quantize --experts mxfp4,q8_0` keeps them: the bundle's mxfp4
 *     blobs hold the loader's bytes unchanged (no requantization) and its q8_0
 *     blobs differ; the bundle's logits at mxfp4 equal the checkpoint's.
 * argv[1] = moe-prep, argv[2] = moe-run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe-mmap.h"
#include "moe-model.h"
#include "moe-safetensors.h"
#include "moe-test.h"

#define MODEL MOE_FIXTURES "/models/gpt_oss-mxfp4"

static const float k_fp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

/* openai_value: element k of row r of expert e in a [E, rows, n/32, 16] block
 * tensor with its [E, rows, n/32] scales. */
static float openai_value(const struct moe_st_tensor *blk, const struct moe_st_tensor *sc, int64_t e, int64_t r,
                          int64_t k) {
    const int64_t rows = blk->shape[1], g = blk->shape[2];
    const uint8_t *b = (const uint8_t *)blk->data + (((size_t)e * rows + r) * g + k / 32) * 16;
    const uint8_t s = ((const uint8_t *)sc->data)[((size_t)e * rows + r) * g + k / 32];
    const int j = (int)(k % 32);
    const int code = j % 2 ? b[j / 2] >> 4 : b[j / 2] & 15;
    return ldexpf(k_fp4[code], (int)s - 127);
}

/* check_weight: w (rows of n_in) against the OpenAI decode of rows
 * r0, r0 + step, ... of expert e. */
static int check_weight(const struct moe_weight *w, const struct moe_st_tensor *blk, const struct moe_st_tensor *sc,
                        int64_t e, int64_t r0, int64_t step) {
    float *row = malloc(sizeof(float) * (size_t)w->n_in);
    int bad = w->type != MOE_QTYPE_MXFP4;
    const size_t rb = moe_qtype_row_bytes(w->type, w->n_in);
    for (int64_t o = 0; !bad && o < w->n_out; o++) {
        bad |= moe_dequantize_row(w->type, (const char *)w->data + (size_t)o * rb, row, w->n_in) != MOE_OK;
        for (int64_t k = 0; !bad && k < w->n_in; k++) {
            float v = openai_value(blk, sc, e, r0 + o * step, k);
            bad |= memcmp(&v, &row[k], sizeof v) != 0;
        }
    }
    free(row);
    return !bad;
}

static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test-mxfp4-experts MOE-PREP MOE-RUN\n");
        return 2;
    }
    struct moe_model *m = NULL;
    struct moe_safetensors *st = NULL;
    CHECK(moe_model_load_hf(MODEL, &m) == MOE_OK && moe_safetensors_open(MODEL, &st) == MOE_OK, "load %s", MODEL);
    if (!m || !st) return 1;
    const struct moe_config *c = &m->cfg;
    const int64_t F = c->n_ff_expert, H = c->n_embd;
    int n_checked = 0;
    for (int l = 0; l < c->n_layer; l++) {
        char name[256];
        const struct moe_st_tensor *t[6];
        static const char *const sfx[6] = {"gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks",
                                           "down_proj_scales", "gate_up_proj_bias", "down_proj_bias"};
        for (int i = 0; i < 6; i++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", l, sfx[i]);
            t[i] = moe_safetensors_find(st, name);
            CHECK(t[i] && (i >= 4 || t[i]->dtype == MOE_DTYPE_U8), "%s: missing or not U8", name);
        }
        if (!t[0] || !t[1] || !t[2] || !t[3] || !t[4] || !t[5]) continue;
        float *gub = malloc(sizeof(float) * (size_t)(2 * F)), *dnb = malloc(sizeof(float) * (size_t)H);
        for (int e = 0; e < c->n_expert; e++) {
            struct moe_ffn f;
            CHECK(moe_model_expert(m, l, e, -1, &f) == MOE_OK, "expert %d.%d", l, e);
            CHECK(check_weight(&f.gate, t[0], t[1], e, 0, 2) && check_weight(&f.up, t[0], t[1], e, 1, 2) &&
                      check_weight(&f.down, t[2], t[3], e, 0, 1),
                  "layer %d expert %d: mxfp4 weights differ from the checkpoint's blocks", l, e);
            moe_convert_row_f32(t[4]->dtype, (const char *)t[4]->data + (size_t)e * 2 * F * moe_dtype_size(t[4]->dtype),
                                gub, (size_t)(2 * F));
            moe_convert_row_f32(t[5]->dtype, (const char *)t[5]->data + (size_t)e * H * moe_dtype_size(t[5]->dtype),
                                dnb, (size_t)H);
            int same = f.bias != NULL;
            for (int64_t i = 0; same && i < F; i++) same = f.bias[i] == gub[2 * i] && f.bias[F + i] == gub[2 * i + 1];
            for (int64_t i = 0; same && i < H; i++) same = f.bias[2 * F + i] == dnb[i];
            CHECK(same, "layer %d expert %d: biases (gate/up alternate in gate_up_proj_bias)", l, e);
            n_checked++;
        }
        free(gub);
        free(dnb);
    }
    CHECK(n_checked == c->n_layer * c->n_expert, "%d experts checked", n_checked);

    /* the bundle keeps the mxfp4 bytes; q8_0 is a real requantization */
    char dir[] = "/tmp/test-mxfp4-XXXXXX", cmd[4096], bundle[256];
    if (!mkdtemp(dir)) return 1;
    snprintf(bundle, sizeof bundle, "%s/m.moeb", dir);
    snprintf(cmd, sizeof cmd, "%s quantize %s -o %s --experts mxfp4,q8_0 --dense f32 >/dev/null 2>&1", argv[1], MODEL,
             bundle);
    CHECK(sh(cmd) == 0, "%s", cmd);
    struct moe_model *bm = NULL;
    struct moe_model_params mp = moe_model_default_params();
    CHECK(moe_model_load(bundle, &mp, &bm) == MOE_OK && bm && bm->n_expert_prec == 2, "load the bundle");
    int kept = 1, requant = 0;
    for (int l = 0; bm && l < c->n_layer; l++)
        for (int e = 0; e < c->n_expert; e++) {
            struct moe_ffn a, b, q;
            if (moe_model_expert(m, l, e, -1, &a) || moe_model_expert(bm, l, e, 0, &b) ||
                moe_model_expert(bm, l, e, 1, &q)) {
                kept = 0;
                continue;
            }
            const struct moe_weight *wa[3] = {&a.gate, &a.up, &a.down}, *wb[3] = {&b.gate, &b.up, &b.down};
            for (int k = 0; k < 3; k++)
                kept &= wb[k]->type == MOE_QTYPE_MXFP4 &&
                        !memcmp(wa[k]->data, wb[k]->data, moe_qtype_row_bytes(MOE_QTYPE_MXFP4, wa[k]->n_in) *
                                                              (size_t)wa[k]->n_out);
            kept &= b.bias && !memcmp(a.bias, b.bias, sizeof(float) * (size_t)(2 * F + H));
            requant += q.gate.type == MOE_QTYPE_Q8_0;
        }
    CHECK(kept, "the bundle's mxfp4 experts are not the checkpoint's bytes");
    CHECK(requant == c->n_layer * c->n_expert, "q8_0 experts: %d of %d", requant, c->n_layer * c->n_expert);
    moe_model_free(bm);

    /* and it runs: the same logits from the checkpoint and from the bundle's mxfp4 experts */
    snprintf(cmd, sizeof cmd, "%s -m %s --tokens 5,9,17,33,65 -n 6 --ids --ignore-eos --logits-out %s/a.f32 "
             ">/dev/null 2>&1 && %s -m %s --expert-precision mxfp4 --tokens 5,9,17,33,65 -n 6 --ids --ignore-eos "
             "--logits-out %s/b.f32 >/dev/null 2>&1 && cmp -s %s/a.f32 %s/b.f32",
             argv[2], MODEL, dir, argv[2], bundle, dir, dir, dir);
    CHECK(sh(cmd) == 0, "mxfp4 bundle logits differ from the checkpoint's");
    printf("test-mxfp4-experts: %d experts read as stored and kept in the bundle, %s\n", n_checked,
           fails ? "FAILED" : "ok");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (!fails) sh(cmd);
    moe_safetensors_free(st);
    moe_model_free(m);
    return fails != 0;
}

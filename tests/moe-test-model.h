/* moe-test-model.h - synthetic Mixtral-shaped checkpoints for tests: the tensor
 * list of a given shape and a safetensors writer (zeros or seeded random BF16/F32). */
#ifndef MOE_TEST_MODEL_H
#define MOE_TEST_MODEL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tensor_spec {
    char name[96];
    int n_dims;
    long long d[2];
};

/* moe_test_mixtral_specs: every tensor of a Mixtral model; returns the count
 * (ts must hold 3 + L * (7 + 3 * E) entries). */
static int moe_test_mixtral_specs(struct tensor_spec *ts, int L, int E, int H, int F, int V, int heads, int kv_heads) {
    int n = 0, hd = H / heads;
#define T1(nm, a) (snprintf(ts[n].name, 96, "%s", nm), ts[n].n_dims = 1, ts[n].d[0] = a, n++)
#define T2(nm, a, b) (snprintf(ts[n].name, 96, "%s", nm), ts[n].n_dims = 2, ts[n].d[0] = a, ts[n].d[1] = b, n++)
    T2("model.embed_tokens.weight", V, H);
    T1("model.norm.weight", H);
    T2("lm_head.weight", V, H);
    char nm[96];
    for (int l = 0; l < L; l++) {
        snprintf(nm, 96, "model.layers.%d.input_layernorm.weight", l), T1(nm, H);
        snprintf(nm, 96, "model.layers.%d.post_attention_layernorm.weight", l), T1(nm, H);
        snprintf(nm, 96, "model.layers.%d.self_attn.q_proj.weight", l), T2(nm, heads * hd, H);
        snprintf(nm, 96, "model.layers.%d.self_attn.k_proj.weight", l), T2(nm, kv_heads * hd, H);
        snprintf(nm, 96, "model.layers.%d.self_attn.v_proj.weight", l), T2(nm, kv_heads * hd, H);
        snprintf(nm, 96, "model.layers.%d.self_attn.o_proj.weight", l), T2(nm, H, heads * hd);
        snprintf(nm, 96, "model.layers.%d.block_sparse_moe.gate.weight", l), T2(nm, E, H);
        for (int e = 0; e < E; e++) {
            snprintf(nm, 96, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e), T2(nm, F, H);
            snprintf(nm, 96, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e), T2(nm, H, F);
            snprintf(nm, 96, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e), T2(nm, F, H);
        }
    }
#undef T1
#undef T2
    return n;
}

/* moe_test_write_safetensors: the tensors in order, F32 zeros (seed 0) or, with
 * a seed, BF16 values uniform in [-0.05, 0.05). Returns 0 on success. */
static int moe_test_write_safetensors(const char *path, const struct tensor_spec *ts, int n, uint64_t seed) {
    const size_t es = seed ? 2 : 4;
    size_t cap = 256 + (size_t)n * 192, off = 0, len = 0;
    char *hdr = malloc(cap);
    FILE *f = hdr ? fopen(path, "wb") : NULL;
    if (!f) {
        free(hdr);
        return -1;
    }
    len += (size_t)sprintf(hdr + len, "{");
    for (int i = 0; i < n; i++) {
        long long elems = 1;
        for (int k = 0; k < ts[i].n_dims; k++) elems *= ts[i].d[k];
        len += (size_t)sprintf(hdr + len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", ts[i].name,
                               seed ? "BF16" : "F32");
        for (int k = 0; k < ts[i].n_dims; k++) len += (size_t)sprintf(hdr + len, "%s%lld", k ? "," : "", ts[i].d[k]);
        len += (size_t)sprintf(hdr + len, "],\"data_offsets\":[%zu,%zu]}", off, off + (size_t)elems * es);
        off += (size_t)elems * es;
    }
    len += (size_t)sprintf(hdr + len, "}");
    while (len % 8) hdr[len++] = ' ';
    unsigned char n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((unsigned long long)len >> (8 * i));
    fwrite(n8, 1, 8, f);
    fwrite(hdr, 1, len, f);
    unsigned char buf[8192] = {0};
    uint64_t s = seed;
    while (off > 0) {
        size_t k = off < sizeof buf ? off : sizeof buf;
        for (size_t i = 0; seed && i < k; i += 2) { /* xorshift64 -> bf16 of a small uniform value */
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            float v = ((float)(s >> 40) / 16777216.0f - 0.5f) * 0.1f;
            uint32_t u;
            memcpy(&u, &v, 4);
            buf[i] = (unsigned char)(u >> 16), buf[i + 1] = (unsigned char)(u >> 24);
        }
        fwrite(buf, 1, k, f);
        off -= k;
    }
    int bad = ferror(f);
    bad |= fclose(f);
    free(hdr);
    return bad ? -1 : 0;
}

#endif

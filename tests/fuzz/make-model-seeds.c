/*
 * make-model-seeds.c - writes the seed corpus of fuzz-model: tiny synthetic
 * Mixtral bundles (1 layer, 2 experts, hidden 32) made with the real
 * `moe-prep quantize`, in several flavours:
 *   f32.moeb            every tensor and expert float32
 *   q8.moeb             q8_0 dense matrices, experts at q8_0 and q4_0
 *   zstd.moeb           the same with zstd-compressed expert blobs
 *   tuned.moeb          q8.moeb with a per-expert bit-width map in its tuning
 *   short-lm-head.moeb  f32.moeb whose lm_head.weight record says 64 bytes,
 *                       checksums resealed (issue 17 item 1)
 *   tall-gate.moeb      f32.moeb whose expert precision says its gate part has
 *                       2^20 rows (bytes kept, checksums resealed): refused at
 *                       load, lazily bound or not
 * Usage: fuzz-model-seeds OUT_DIR PATH/TO/moe-prep
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe-bundle.h"
#include "moe-mmap.h"
#include "moe-model.h"
#include "moe-test-bundle-patch.h"
#include "moe-test-model.h"

/* sh: run a command; 0 on success. */
static int sh(const char *cmd) {
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "fuzz-model-seeds: failed (%d): %s\n", rc, cmd);
    return rc != 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: fuzz-model-seeds OUT_DIR PATH/TO/moe-prep\n");
        return 2;
    }
    const char *out = argv[1], *prep = argv[2];
    char dir[] = "/tmp/moe-model-seeds-XXXXXX", path[1024], cmd[4096];
    if (!mkdtemp(dir)) return 1;
    struct tensor_spec *ts = calloc(64, sizeof *ts);
    if (!ts) return 1;
    int n = moe_test_mixtral_specs(ts, 1, 2, 32, 32, 32, 2, 1);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (moe_test_write_safetensors(path, ts, n, 7)) return 1;
    free(ts);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f, "{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":32,\"hidden_size\":32,"
               "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
               "\"intermediate_size\":32,\"num_local_experts\":2,\"num_experts_per_tok\":2,"
               "\"max_position_embeddings\":64,\"bos_token_id\":1,\"eos_token_id\":2}");
    fclose(f);
    static const char *const k_flavours[3][2] = {
        {"f32", "--experts f32 --dense f32"},
        {"q8", "--experts q8_0,q4_0 --dense q8_0"},
        {"zstd", "--experts q8_0,q4_0 --dense q8_0 --compress=19"},
    };
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s quantize %s -o %s/%s.moeb %s -t 1 >/dev/null 2>&1", prep, dir, out,
                 k_flavours[i][0], k_flavours[i][1]);
        if (sh(cmd)) return 1;
    }
    /* tuned: a bit-width map (expert 0 at q4_0, expert 1 at q8_0) */
    snprintf(cmd, sizeof cmd, "cp %s/q8.moeb %s/tuned.moeb", out, out);
    if (sh(cmd)) return 1;
    snprintf(path, sizeof path, "%s/tuned.moeb", out);
    struct moe_bundle_kv *kv = NULL;
    const int64_t map[2] = {1, 0};
    if (moe_bundle_kv_new(&kv) || moe_bundle_kv_set_i64_array(kv, MOE_TUNING_BITWIDTH_MAP, map, 2) ||
        moe_bundle_replace_tuning(path, kv))
        return 1;
    moe_bundle_kv_free(kv);
    /* short-lm-head: the shape kept, 64 stored bytes, every checksum resealed */
    snprintf(path, sizeof path, "%s/f32.moeb", out);
    char *img = NULL;
    size_t len = 0;
    if (moe_read_file(path, 1u << 30, &img, &len) ||
        moe_test_bundle_set_tensor_size((uint8_t *)img, len, "lm_head.weight", 64))
        return 1;
    snprintf(path, sizeof path, "%s/short-lm-head.moeb", out);
    f = fopen(path, "wb");
    if (!f || fwrite(img, 1, len, f) != len || fclose(f)) return 1;
    free(img);
    /* tall-gate: a precision descriptor that contradicts the config */
    snprintf(path, sizeof path, "%s/f32.moeb", out);
    if (moe_read_file(path, 1u << 30, &img, &len) || moe_test_bundle_set_part_rows((uint8_t *)img, len, 0, 1u << 20))
        return 1;
    snprintf(path, sizeof path, "%s/tall-gate.moeb", out);
    f = fopen(path, "wb");
    if (!f || fwrite(img, 1, len, f) != len || fclose(f)) return 1;
    free(img);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd);
    printf("fuzz-model-seeds: wrote f32, q8, zstd, tuned, short-lm-head and tall-gate bundles into %s\n", out);
    return 0;
}

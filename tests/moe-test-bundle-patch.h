/* moe-test-bundle-patch.h - surgery on bundle images for tests and fuzz seeds:
 * change a tensor record of the directory and recompute every checksum that
 * covers it (the tensor's, the directory's, the header's), so the damage is
 * one a checksum cannot see (docs/format.md, "Directory"). */
#ifndef MOE_TEST_BUNDLE_PATCH_H
#define MOE_TEST_BUNDLE_PATCH_H

#include <stdint.h>
#include <string.h>
#include <xxhash.h>

static inline uint64_t patch_rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static inline void patch_wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* moe_test_bundle_set_tensor_size: give tensor `name` a stored size of
 * new_size bytes (its offset and shape kept), its checksum over those bytes,
 * and reseal the directory and header. 0 on success, -1 if not found. */
static inline int moe_test_bundle_set_tensor_size(uint8_t *img, size_t n, const char *name, uint64_t new_size) {
    if (n < 4096) return -1;
    uint64_t doff = patch_rd64(img + 32), dsize = patch_rd64(img + 40);
    if (doff > n || dsize > n - doff || dsize < 32) return -1;
    uint8_t *d = img + doff;
    uint64_t m = patch_rd64(d + 8), t = patch_rd64(d + 16);
    if (32 + m + 8 > dsize || t > dsize - 32 - m) return -1;
    uint8_t *rec = d + 32 + m + 8, *end = d + 32 + m + t;
    uint64_t count = patch_rd64(d + 32 + m);
    for (uint64_t i = 0; i < count && rec + 72 <= end; i++) {
        uint32_t len = (uint32_t)(rec[0] | rec[1] << 8 | rec[2] << 16 | (uint32_t)rec[3] << 24);
        if (rec + 72 + len > end) return -1;
        if (len == strlen(name) && !memcmp(rec + 72, name, len)) {
            uint64_t off = patch_rd64(rec + 48);
            if (off > n || new_size > n - off) return -1;
            patch_wr64(rec + 56, new_size);
            patch_wr64(rec + 64, XXH3_64bits(img + off, (size_t)new_size));
            patch_wr64(img + 48, XXH3_64bits(d, (size_t)dsize));
            patch_wr64(img + 120, XXH3_64bits(img, 120));
            return 0;
        }
        rec += 72 + len;
    }
    return -1;
}

/* moe_test_bundle_set_part_rows: give part `part` of the first expert
 * precision descriptor `rows` rows (its type, columns and byte count kept: the
 * container does not relate them) and reseal the directory and header. 0 on
 * success, -1 if the bundle has no such part. */
static inline int moe_test_bundle_set_part_rows(uint8_t *img, size_t n, uint32_t part, uint64_t rows) {
    if (n < 4096) return -1;
    uint64_t doff = patch_rd64(img + 32), dsize = patch_rd64(img + 40);
    if (doff > n || dsize > n - doff || dsize < 32) return -1;
    uint8_t *d = img + doff;
    uint64_t m = patch_rd64(d + 8), t = patch_rd64(d + 16), x = patch_rd64(d + 24);
    if (m > dsize || t > dsize - m || x > dsize - m - t || 32 + m + t + 16 + 8 > dsize) return -1;
    uint8_t *es = d + 32 + m + t, *desc = es + 16; /* counts, then the first descriptor */
    uint32_t n_parts = (uint32_t)(desc[4] | desc[5] << 8 | desc[6] << 16 | (uint32_t)desc[7] << 24);
    if (part >= n_parts || (uint64_t)(desc - d) + 8 + 32 * (uint64_t)n_parts > dsize) return -1;
    patch_wr64(desc + 8 + 32 * part + 8, rows);
    patch_wr64(img + 48, XXH3_64bits(d, (size_t)dsize));
    patch_wr64(img + 120, XXH3_64bits(img, 120));
    return 0;
}

#endif

/*
 * bench-bundle-load - per expert precision of a bundle: stored vs raw bytes
 * (what --compress saved) and the time to load every blob of that precision
 * (read from the page cache, checksum, decompress when stored as zstd).
 * Compare the load rate with your disk's read rate to see whether compression
 * pays: it helps only if the bytes saved take longer to read than to decode.
 *
 *   bench-bundle-load model.moeb [model-compressed.moeb ...]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "moe-bundle.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench-bundle-load BUNDLE.moeb [...]\n");
        return 2;
    }
    printf("%-28s %-6s %10s %10s %7s %8s %9s\n", "bundle", "prec", "raw MB", "stored MB", "saved", "zstd", "load GB/s");
    for (int a = 1; a < argc; a++) {
        struct moe_bundle *b = NULL;
        if (moe_bundle_open(argv[a], &b) != MOE_OK) return 1;
        uint32_t nl, ne, np;
        moe_bundle_expert_layout(b, &nl, &ne, &np);
        for (uint32_t p = 0; p < np; p++) {
            const struct moe_bundle_precision *d = moe_bundle_precision_at(b, p);
            char *buf = malloc(d->raw_size);
            double raw = 0, stored = 0;
            int n_z = 0, n = 0;
            double best = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                double t0 = now_s();
                for (uint32_t l = 0; l < nl; l++)
                    for (uint32_t e = 0; moe_bundle_layer_has_experts(b, l) && e < ne; e++) {
                        struct moe_bundle_blob blob;
                        if (moe_bundle_expert(b, l, e, p, &blob) || moe_bundle_expert_load(b, l, e, p, buf, d->raw_size))
                            return 1;
                        if (rep == 0) {
                            raw += (double)blob.raw_size;
                            stored += (double)blob.stored_size;
                            n_z += blob.compression != MOE_BUNDLE_COMP_NONE;
                            n++;
                        }
                    }
                double t = now_s() - t0;
                if (t < best) best = t;
            }
            printf("%-28s %-6s %10.1f %10.1f %6.1f%% %4d/%-4d %9.2f\n", argv[a], d->name, raw / 1e6, stored / 1e6,
                   100 * (1 - stored / raw), n_z, n, raw / best / 1e9);
            free(buf);
        }
        moe_bundle_free(b);
    }
    return 0;
}

/* test-cuda.c - the CUDA backend finds a device and can start cuBLAS on it.
 * Exits 77 (skipped) on machines without a GPU. */
#include <stdio.h>

#include "moe-cuda.h"

int main(void) {
    int n = moe_cuda_device_count();
    if (n == 0) {
        printf("test-cuda: no CUDA device, skipped\n");
        return 77;
    }
    char desc[256];
    for (int i = 0; i < n; i++) {
        if (moe_cuda_describe(i, desc, sizeof desc) != 0) {
            fprintf(stderr, "test-cuda: device %d: cannot query it or start cuBLAS\n", i);
            return 1;
        }
        printf("test-cuda: device %d: %s\n", i, desc);
    }
    return 0;
}

// backend.cu - CUDA backend entry points (device probing for now).
#include <cstdio>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "moe-cuda.h"

extern "C" int moe_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky error of a missing driver
        return 0;
    }
    return n;
}

extern "C" int moe_cuda_describe(int dev, char *buf, unsigned long size) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return -1;
    // make sure cuBLAS can start on this device: the backend depends on it
    cublasHandle_t h;
    if (cudaSetDevice(dev) != cudaSuccess || cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return -1;
    cublasDestroy(h);
    snprintf(buf, size, "%s, %zu MiB, sm_%d%d", prop.name, prop.totalGlobalMem >> 20, prop.major,
             prop.minor);
    return 0;
}

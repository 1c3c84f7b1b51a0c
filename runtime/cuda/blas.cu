// blas.cu - cuBLAS, opened with dlopen when a CUDA backend first needs it.
//
// Linking libcublas (and libcublasLt) into every program that links the
// runtime costs ~200 MB of resident memory at start-up (the dynamic loader's
// relocations of those libraries), also for runs that never touch the GPU:
// the CPU path of a CUDA build would then miss its peak-memory bound (checked
// by test-store). So the runtime links the static CUDA runtime only and
// resolves the four cuBLAS functions it uses here, once.
#include <dlfcn.h>

#include <cstdio>
#include <mutex>

#include "cuda-impl.h"

namespace {

// the C entry point (the header also declares a C++ overload taking a cudaDataType compute type)
typedef cublasStatus_t (*gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                                     const void *, cudaDataType, int, const void *, cudaDataType, int, const void *,
                                     void *, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

struct blas_api {
    decltype(&cublasCreate_v2) create = nullptr;
    decltype(&cublasDestroy_v2) destroy = nullptr;
    decltype(&cublasSetStream_v2) set_stream = nullptr;
    gemm_ex_fn gemm_ex = nullptr;
    int ok = 0;
};

blas_api g_api;
std::once_flag g_once;

void load() {
    char name[64];
    snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_VER_MAJOR);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        MOE_LOGE("cannot load cuBLAS (%s): %s", name, dlerror());
        return;
    }
    g_api.create = (decltype(g_api.create))dlsym(h, "cublasCreate_v2");
    g_api.destroy = (decltype(g_api.destroy))dlsym(h, "cublasDestroy_v2");
    g_api.set_stream = (decltype(g_api.set_stream))dlsym(h, "cublasSetStream_v2");
    g_api.gemm_ex = (gemm_ex_fn)dlsym(h, "cublasGemmEx");
    g_api.ok = g_api.create && g_api.destroy && g_api.set_stream && g_api.gemm_ex;
    if (!g_api.ok) MOE_LOGE("%s lacks cublasCreate_v2 / cublasGemmEx", name);
}

const blas_api *api() {
    std::call_once(g_once, load);
    return g_api.ok ? &g_api : nullptr;
}

} // namespace

cublasStatus_t moe_blas_create(cublasHandle_t *h) {
    const blas_api *a = api();
    return a ? a->create(h) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t moe_blas_destroy(cublasHandle_t h) {
    const blas_api *a = api();
    return a ? a->destroy(h) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t moe_blas_set_stream(cublasHandle_t h, cudaStream_t s) {
    const blas_api *a = api();
    return a ? a->set_stream(h, s) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t moe_blas_gemm_ex(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                                cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                                cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    const blas_api *a = api();
    return a ? a->gemm_ex(h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo)
             : CUBLAS_STATUS_NOT_INITIALIZED;
}

/*
 * moe-cuda.h - CUDA backend (built with -DMOE_CUDA=ON). So far it only probes
 * the devices; kernels arrive with the offloading runtime.
 */
#ifndef MOE_CUDA_H
#define MOE_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

/* moe_cuda_device_count: number of usable CUDA devices (0 if none or no driver). */
int moe_cuda_device_count(void);

/* moe_cuda_describe: write "name, N MiB, sm_XY" of device `dev` into buf. Returns 0 on success. */
int moe_cuda_describe(int dev, char *buf, unsigned long size);

#ifdef __cplusplus
}
#endif
#endif

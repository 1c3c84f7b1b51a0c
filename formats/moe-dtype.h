/*
 * moe-dtype.h - element types of stored tensors and scalar conversions.
 *
 * Conversions are exact (f16/bf16 -> f32 loses nothing); f32 -> f16/bf16 round
 * to nearest even, as torch does. All functions are pure and thread-safe.
 */
#ifndef MOE_DTYPE_H
#define MOE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

enum moe_dtype {
    MOE_DTYPE_F32 = 0,
    MOE_DTYPE_F16 = 1,
    MOE_DTYPE_BF16 = 2,
    MOE_DTYPE_U8 = 3, /* raw bytes: packed quantized data (gpt-oss's MXFP4 blocks and scales) */
    MOE_DTYPE_COUNT
};

/* moe_dtype_size: bytes per element. */
size_t moe_dtype_size(enum moe_dtype t);

/* moe_dtype_name: "F32", "F16", "BF16", "U8" (the safetensors spellings). */
const char *moe_dtype_name(enum moe_dtype t);

static inline float moe_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t moe_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* moe_f16_to_f32: IEEE half to float, including subnormals, inf and NaN. */
float moe_f16_to_f32(uint16_t h);

/* moe_f32_to_f16: float to IEEE half, round to nearest even. */
uint16_t moe_f32_to_f16(float f);

/* moe_convert_row_f32: convert n elements of type t at src into dst (float). */
void moe_convert_row_f32(enum moe_dtype t, const void *src, float *dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif

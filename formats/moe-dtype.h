/*
 * moe-dtype.h - element types of stored tensors and scalar conversions.
 *
 * Conversions are exact (f16/bf16/f8_e4m3 -> f32 loses nothing); f32 -> f16/bf16 round
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
    MOE_DTYPE_F8_E4M3 = 4, /* float8 e4m3fn (torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa
                            * bits, no infinities, 0x7f/0xff NaN, largest finite +-448. DeepSeek-V3's
                            * block-scaled FP8 weights (the model binder applies their weight_scale_inv) */
    MOE_DTYPE_COUNT
};

/* moe_dtype_size: bytes per element. */
size_t moe_dtype_size(enum moe_dtype t);

/* moe_dtype_name: "F32", "F16", "BF16", "U8", "F8_E4M3" (the safetensors spellings). */
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

/* moe_f8_e4m3_to_f32: the exact value of a float8 e4m3fn code: (-1)^s * 2^(e-7) * (1 + m/8)
 * for exponent e in 1..15 (except e = 15, m = 7: NaN), (-1)^s * 2^-6 * m/8 for e = 0. */
float moe_f8_e4m3_to_f32(uint8_t c);

/* moe_convert_row_f32: convert n elements of type t at src into dst (float). */
void moe_convert_row_f32(enum moe_dtype t, const void *src, float *dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif

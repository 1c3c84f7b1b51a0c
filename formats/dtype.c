/* dtype.c - element sizes, names and conversions to float32. */
#include "moe-dtype.h"

#include "moe-status.h"

size_t moe_dtype_size(enum moe_dtype t) {
    switch (t) {
    case MOE_DTYPE_F32: return 4;
    case MOE_DTYPE_F16: return 2;
    case MOE_DTYPE_BF16: return 2;
    case MOE_DTYPE_U8: return 1;
    case MOE_DTYPE_F8_E4M3: return 1;
    default: break;
    }
    MOE_ASSERT(!"bad dtype");
    return 0;
}

const char *moe_dtype_name(enum moe_dtype t) {
    switch (t) {
    case MOE_DTYPE_F32: return "F32";
    case MOE_DTYPE_F16: return "F16";
    case MOE_DTYPE_BF16: return "BF16";
    case MOE_DTYPE_U8: return "U8";
    case MOE_DTYPE_F8_E4M3: return "F8_E4M3";
    default: return "?";
    }
}

float moe_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float moe_f8_e4m3_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t exp = (c >> 3) & 0xfu;
    uint32_t man = c & 0x7u;
    uint32_t u;
    if (exp == 15 && man == 7) {
        u = sign | 0x7fc00000u; /* the only NaN codes (0x7f, 0xff); e4m3fn has no infinities */
    } else if (exp == 0) {
        /* zero or subnormal: man * 2^-9, exact in float (man < 8) */
        float f = (float)man * 0x1p-9f;
        return sign ? -f : f;
    } else {
        u = sign | ((exp + 127 - 7) << 23) | (man << 20);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t moe_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (absu < 0x38800000u) { /* result is subnormal or zero */
        if (absu < 0x33000000u) return (uint16_t)sign; /* < half of smallest subnormal */
        uint32_t e = absu >> 23;
        uint32_t m = (absu & 0x7fffffu) | 0x800000u;
        /* value = m * 2^(e-150); subnormal unit = 2^-24 -> q = m * 2^(e-126) */
        uint32_t shift = 126 - e; /* 14..24 here */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = absu - 0x38000000u; /* rebias 127 -> 15 */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

void moe_convert_row_f32(enum moe_dtype t, const void *src, float *dst, size_t n) {
    switch (t) {
    case MOE_DTYPE_F32: memcpy(dst, src, n * 4); return;
    case MOE_DTYPE_U8:
        for (size_t i = 0; i < n; i++) dst[i] = (float)((const unsigned char *)src)[i];
        return;
    case MOE_DTYPE_F8_E4M3:
        for (size_t i = 0; i < n; i++) dst[i] = moe_f8_e4m3_to_f32(((const unsigned char *)src)[i]);
        return;
    /* elements are read through memcpy: tensors in a mapped file may be unaligned */
    case MOE_DTYPE_F16: {
        const unsigned char *s = src;
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = moe_f16_to_f32(h);
        }
        return;
    }
    case MOE_DTYPE_BF16: {
        const unsigned char *s = src;
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = moe_bf16_to_f32(h);
        }
        return;
    }
    default: MOE_ASSERT(!"bad dtype");
    }
}

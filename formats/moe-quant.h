/*
 * moe-quant.h - quantized weight formats: block layouts, reference quantizers and
 * dequantizers, and dot products of a quantized row with float32 activations.
 *
 * The block layouts are bit-compatible with ggml's (and so with GGUF files): a
 * row quantized here can be read by ggml/llama.cpp and the `gguf` Python package,
 * and the other way round. This header is the ONE place where the layouts are
 * defined; CPU code (formats/quant*.c) and CUDA code both include it. It is plain
 * C11 and also compiles as C++ (for nvcc).
 *
 * Which functions are the specification:
 *   - moe_dequantize_row (scalar path): bit-identical to gguf.quants.dequantize
 *     (gguf 0.19) for every type here except q8_k (which gguf cannot read; its
 *     dequantization is d * q in float32, as ggml's).
 *   - moe_quantize_row: bit-identical to gguf.quants.quantize for f16, bf16,
 *     q8_0 and q4_0 (the types gguf 0.19 can quantize), and to ggml's reference
 *     quantizers (quantize_row_*_ref in ggml-quants.c, built without FMA
 *     contraction) for q2_k, q3_k, q4_k, q5_k, q6_k and q8_k. This is an
 *     independent implementation of the same algorithms; tests/test-quant.c checks
 *     both claims against committed fixtures.
 *   - moe_quantize_row's SIMD kernels (q8_0, q4_k, q5_k) give the scalar path's
 *     bytes exactly (tests/test-quant-rows.c).
 *   - moe_vec_dot, scalar path: see its comment; the SIMD paths are tested
 *     against it with the tolerance stated there.
 *
 * Thread-safety: every function is pure and thread-safe, except
 * moe_quant_set_isa(), which must not run concurrently with the kernels.
 * Pointers: rows need no particular alignment (blocks are read byte-wise or with
 * unaligned loads); src and dst must not overlap.
 */
#ifndef MOE_QUANT_H
#define MOE_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#define MOE_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define MOE_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* The small unpacking helpers below are callable from CUDA device code too. */
#ifdef __CUDACC__
#define MOE_HOST_DEVICE __host__ __device__
#else
#define MOE_HOST_DEVICE
#endif

/*
 * Element types of quantized tensors. The numeric values are STABLE: they are
 * written into the bundle file format, and they are equal to ggml's `enum
 * ggml_type` (= gguf's GGMLQuantizationType), so a type id can be copied to or
 * from a GGUF tensor header unchanged. Values not listed are not supported here
 * (ggml's q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_1 = 9, the IQ types, ...); never
 * reuse them for something else.
 *
 *   value  name   block  bytes  bits/weight  layout
 *   0      f32        1      4  32           IEEE binary32
 *   1      f16        1      2  16           IEEE binary16
 *   2      q4_0      32     18  4.5          f16 d; 4-bit q, w = d*(q-8)
 *   8      q8_0      32     34  8.5          f16 d; int8 q, w = d*q
 *   10     q2_k     256     84  2.625        16 sub-blocks of 16, 4-bit scale+min
 *   11     q3_k     256    110  3.4375       16 sub-blocks of 16, 6-bit scales
 *   12     q4_k     256    144  4.5          8 sub-blocks of 32, 6-bit scale+min
 *   13     q5_k     256    176  5.5          as q4_k plus one high bit per weight
 *   14     q6_k     256    210  6.5625       16 sub-blocks of 16, int8 scales
 *   15     q8_k     256    292  9.125        f32 d; int8 q; int16 sums of 16
 *   30     bf16       1      2  16           bfloat16 (upper half of binary32)
 *   39     mxfp4     32     17  4.25         e8m0 e; 4-bit e2m1 q, w = kv[q] * 2^(e-128)
 *   36     q4_k_r16 256    144  4.5          q4_k rows interleaved in groups of 16
 *   37     q8_0_r16  32     34  8.5          q8_0 rows interleaved in groups of 16
 *                                            (both runtime only, see moe_repack)
 *
 * q8_k is ggml's activation-side type for integer k-quant dot products; it is
 * here for that later use and is not meant for weights.
 *
 * q4_k_r16 and q8_0_r16 are layouts, not file types: q4_k / q8_0 matrices
 * whose rows were rearranged in memory by moe_repack for faster integer
 * products. They have their stored type's sizes (moe_qtype_row_bytes etc.
 * answer for them), but moe_qtype_valid() and moe_qtype_from_name() reject
 * them, so no file parser accepts them; only the matrix functions below
 * (moe_mat_dot_act, moe_gate_up_act), moe_unpack_row and moe_dequantize_row_of
 * read them.
 */
enum moe_qtype {
    MOE_QTYPE_F32 = 0,
    MOE_QTYPE_F16 = 1,
    MOE_QTYPE_Q4_0 = 2,
    MOE_QTYPE_Q8_0 = 8,
    MOE_QTYPE_Q2_K = 10,
    MOE_QTYPE_Q3_K = 11,
    MOE_QTYPE_Q4_K = 12,
    MOE_QTYPE_Q5_K = 13,
    MOE_QTYPE_Q6_K = 14,
    MOE_QTYPE_Q8_K = 15,
    MOE_QTYPE_BF16 = 30,
    MOE_QTYPE_Q4_K_R16 = 36, /* runtime layout of q4_k (moe_repack); never in a file */
    MOE_QTYPE_Q8_0_R16 = 37, /* runtime layout of q8_0 (moe_repack); never in a file */
    MOE_QTYPE_MXFP4 = 39,
};
/* One past the largest value: a bound for tables indexed by type. */
#define MOE_QTYPE_LIMIT 40

/* Elements per block. */
#define MOE_QK4_0 32
#define MOE_QK8_0 32
#define MOE_QK_K 256
#define MOE_K_SCALE_SIZE 12

typedef uint16_t moe_f16_bits; /* IEEE binary16, stored as its bit pattern */

/* q4_0: w[j] = d * (q[j] - 8); qs[j] holds q[j] (low nibble) and q[j+16] (high). */
typedef struct moe_block_q4_0 {
    moe_f16_bits d;
    uint8_t qs[MOE_QK4_0 / 2];
} moe_block_q4_0;
MOE_STATIC_ASSERT(sizeof(moe_block_q4_0) == 18, "q4_0 block size");

/* mxfp4 (OCP microscaling FP4, gpt-oss's expert format, ggml's layout): 32
 * e2m1 values sharing the power-of-two scale e (e8m0). kv = {0, 1, 2, 3, 4,
 * 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12} (twice the e2m1 values, so the
 * scale is 2^(e-128): e < 2 are subnormal floats); qs[j] holds q[j] (low
 * nibble) and q[j+16] (high). */
#define MOE_QK_MXFP4 32
typedef struct moe_block_mxfp4 {
    uint8_t e;
    uint8_t qs[MOE_QK_MXFP4 / 2];
} moe_block_mxfp4;
MOE_STATIC_ASSERT(sizeof(moe_block_mxfp4) == 17, "mxfp4 block size");

/* moe_e8m0_to_f32_half: 2^(e-128), ggml's GGML_E8M0_TO_FP32_HALF. */
static inline MOE_HOST_DEVICE float moe_e8m0_to_f32_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    union {
        uint32_t u;
        float f;
    } v = {bits};
    return v.f;
}

/* q8_0: w[j] = d * qs[j]. */
typedef struct moe_block_q8_0 {
    moe_f16_bits d;
    int8_t qs[MOE_QK8_0];
} moe_block_q8_0;
MOE_STATIC_ASSERT(sizeof(moe_block_q8_0) == 34, "q8_0 block size");

/*
 * q2_k: 256 weights in 16 sub-blocks of 16. scales[s] = scale (low nibble) and
 * min (high nibble) of sub-block s. Weight w = 128*h + 32*j + l (h 0..1, j 0..3,
 * l 0..31) has q = (qs[32*h + l] >> 2*j) & 3 and lies in sub-block s = w/16;
 * w = (d*sc[s])*q - dmin*m[s].
 */
typedef struct moe_block_q2_K {
    uint8_t scales[MOE_QK_K / 16];
    uint8_t qs[MOE_QK_K / 4];
    moe_f16_bits d;
    moe_f16_bits dmin;
} moe_block_q2_K;
MOE_STATIC_ASSERT(sizeof(moe_block_q2_K) == 84, "q2_K block size");

/*
 * q3_k: weight w = 128*h + 32*j + l has low bits (qs[32*h + l] >> 2*j) & 3 and
 * high bit (hmask[l] >> (w/32)) & 1; q = low - (high ? 0 : 4), in -4..3. The 16
 * 6-bit scales are packed in scales[12]: scale s has low nibble
 * (s < 8 ? scales[s] & 15 : scales[s-8] >> 4), high two bits
 * (scales[8 + s%4] >> 2*(s/4)) & 3, and value (6-bit - 32);
 * w = (d*scale[w/16])*q.
 */
typedef struct moe_block_q3_K {
    uint8_t hmask[MOE_QK_K / 8];
    uint8_t qs[MOE_QK_K / 4];
    uint8_t scales[12];
    moe_f16_bits d;
} moe_block_q3_K;
MOE_STATIC_ASSERT(sizeof(moe_block_q3_K) == 110, "q3_K block size");

/*
 * q4_k: 8 sub-blocks of 32, each with a 6-bit scale sc and 6-bit min m packed in
 * scales[12] (moe_q4k_scale_min). Chunk c (0..3) of 64 weights uses qs[32c..32c+31]:
 * weight 64c + l is the low nibble (sub-block 2c), 64c + 32 + l the high nibble
 * (sub-block 2c+1); w = (d*sc)*q - dmin*m.
 */
typedef struct moe_block_q4_K {
    moe_f16_bits d;
    moe_f16_bits dmin;
    uint8_t scales[MOE_K_SCALE_SIZE];
    uint8_t qs[MOE_QK_K / 2];
} moe_block_q4_K;
MOE_STATIC_ASSERT(sizeof(moe_block_q4_K) == 144, "q4_K block size");

/* q5_k: as q4_k; weight w additionally gets +16 if qh[w % 32] bit (w/32) is set. */
typedef struct moe_block_q5_K {
    moe_f16_bits d;
    moe_f16_bits dmin;
    uint8_t scales[MOE_K_SCALE_SIZE];
    uint8_t qh[MOE_QK_K / 8];
    uint8_t qs[MOE_QK_K / 2];
} moe_block_q5_K;
MOE_STATIC_ASSERT(sizeof(moe_block_q5_K) == 176, "q5_K block size");

/*
 * q6_k: 16 sub-blocks of 16 with int8 scales. Half h (128 weights) uses
 * ql[64h..64h+63] and qh[32h..32h+31]; for l in 0..31 and k in 0..3, weight
 * 128h + 32k + l has low nibble of ql[64h + 32*(k&1) + l] (>> 4 when k >= 2) and
 * high bits (qh[32h + l] >> 2k) & 3; q = 6-bit - 32; w = (d*scales[w/16])*q.
 */
typedef struct moe_block_q6_K {
    uint8_t ql[MOE_QK_K / 2];
    uint8_t qh[MOE_QK_K / 4];
    int8_t scales[MOE_QK_K / 16];
    moe_f16_bits d;
} moe_block_q6_K;
MOE_STATIC_ASSERT(sizeof(moe_block_q6_K) == 210, "q6_K block size");

/* q8_k: w = d * qs[j] with a float32 d; bsums[s] = sum of qs[16s..16s+15]. */
typedef struct moe_block_q8_K {
    float d;
    int8_t qs[MOE_QK_K];
    int16_t bsums[MOE_QK_K / 16];
} moe_block_q8_K;
MOE_STATIC_ASSERT(sizeof(moe_block_q8_K) == 292, "q8_K block size");

/* moe_q4k_scale_min: unpack the 6-bit scale and min of sub-block j (0..7) from the
 * 12 packed bytes shared by q4_k and q5_k. */
static inline MOE_HOST_DEVICE void moe_q4k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* moe_q3k_scale: the signed scale (-32..31) of sub-block s (0..15) of a q3_k block. */
static inline MOE_HOST_DEVICE int moe_q3k_scale(int s, const uint8_t *scales) {
    int lo = s < 8 ? (scales[s] & 15) : (scales[s - 8] >> 4);
    int hi = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* ---- type table -------------------------------------------------------- */

/* The scalar reference kernels of a type, on nb whole blocks (for f32, f16 and
 * bf16, whose blocks are one element, nb = the number of elements):
 *   moe_dequant_fn  w (nb blocks) -> y (nb * block size floats)
 *   moe_quant_fn    x (nb * block size floats) -> y (nb blocks)
 *   moe_dot_fn      sum of dequantized w times x, as moe_vec_dot defines it */
typedef void (*moe_dequant_fn)(const void *w, float *y, int64_t nb);
typedef void (*moe_quant_fn)(const float *x, void *y, int64_t nb);
typedef float (*moe_dot_fn)(const void *w, const float *x, int64_t nb);

/*
 * struct moe_type_traits: everything the quant layer knows about a type id, in
 * one row per type (formats/quant.c, the one table; ggml's type_traits[]). The
 * functions below (moe_qtype_name, moe_qtype_block_size, moe_qtype_valid,
 * moe_act_type, moe_qtype_group_rows, moe_stored_type, moe_repack_type, ...)
 * read it, and the scalar kernel table is filled from its kernels. The CPU
 * kernels of each ISA (SIMD dot, dequantize, integer tiles) are that ISA's own
 * table, indexed by the same ids (the internal struct moe_quant_kernels).
 *
 * Adding a type: its block struct above (with MOE_STATIC_ASSERT), its id in
 * enum moe_qtype, one row in quant.c with its scalar reference kernels, and
 * the row of expected values in tests/test-quant.c (test_traits); SIMD and
 * integer kernels, where it has them, in the ISA tables.
 */
struct moe_type_traits {
    const char *name;        /* ggml's lower-case name ("q4_k") */
    int block_size;          /* elements per block (1 for f32, f16, bf16) */
    size_t block_bytes;      /* bytes per block (= sizeof its block struct) */
    int file_type;           /* 1: a file may hold it; 0: a runtime-only layout */
    enum moe_qtype act_type; /* activation blocks of its integer dot (moe_act_type):
                                q8_0, q8_k, or MOE_QTYPE_F32 = the float dot */
    int group_rows;          /* rows interleaved per group: 1, or 16 for the _r16 layouts */
    enum moe_qtype stored;   /* a layout: the stored type whose rows it interleaves;
                                a stored type: itself (moe_stored_type) */
    enum moe_qtype repack;   /* a stored type: the layout moe_repack may give it;
                                itself when it has none (and for a layout) */
    moe_dequant_fn dequantize; /* scalar reference (the specification); NULL for a layout */
    moe_quant_fn quantize;     /* scalar reference quantizer; NULL for a layout */
    moe_dot_fn dot;            /* scalar reference dot with float32 x; NULL for a layout */
};

/* moe_type_traits: the table row of t, or NULL for an id that is not a
 * supported type (out of range or unlisted). The row is static, constant data:
 * valid for the life of the program, thread-safe to read. */
const struct moe_type_traits *moe_type_traits(enum moe_qtype t);

/* moe_qtype_valid: 1 if t is one of the enum values above that a file may
 * hold (not a runtime layout: q4_k_r16, q8_0_r16), else 0. */
int moe_qtype_valid(enum moe_qtype t);

/* moe_qtype_name: ggml's lower-case name ("q4_k", "bf16", ...); "?" if invalid. */
const char *moe_qtype_name(enum moe_qtype t);

/* moe_qtype_from_name: parse a name (case-insensitive: "q4_k", "Q4_K"). Returns
 * MOE_ERR_INVALID (and logs) for NULL or unknown names; *out is set only on OK. */
enum moe_status moe_qtype_from_name(const char *name, enum moe_qtype *out);

/* The size functions below also answer for the layouts (q4_k_r16 as q4_k,
 * q8_0_r16 as q8_0). */

/* moe_qtype_block_size: elements per block (1 for f32/f16/bf16); 0 if invalid. */
int moe_qtype_block_size(enum moe_qtype t);

/* moe_qtype_block_bytes: bytes per block; 0 if invalid. */
size_t moe_qtype_block_bytes(enum moe_qtype t);

/* moe_qtype_row_bytes: bytes of a row of n elements. Returns 0 if t is invalid,
 * n < 0, n is not a multiple of the block size, or the size overflows. */
size_t moe_qtype_row_bytes(enum moe_qtype t, int64_t n);

/* moe_qtype_bits_per_weight: 8 * block bytes / block size (q4_k 4.5, q2_k 2.625);
 * 0 if invalid. */
double moe_qtype_bits_per_weight(enum moe_qtype t);

/* ---- conversions ------------------------------------------------------- */

/*
 * moe_quantize_row: quantize n floats at src into moe_qtype_row_bytes(t, n) bytes
 * at dst. The scalar reference code is the specification; q8_0, q4_k and q5_k
 * also have AVX2 and AVX-512 kernels, used under those ISAs, that give the same
 * bytes for every input (tests/test-quant-rows.c; blocks with a NaN in q4_k and
 * q5_k go to the reference itself). Returns
 * MOE_ERR_INVALID (and logs) for an invalid type, NULL pointers, n < 0, or n not
 * a multiple of the block size; dst is untouched then. Non-finite inputs never
 * crash and give a well-formed block, but its values are unspecified (they match
 * gguf/ggml where those are deterministic). n = 0 is OK and writes nothing.
 *
 * Measured error, rms(dequantize(quantize(x)) - x) / rms(x), on N(0,1) data and
 * on real weights (stories260K), and the bound tests/test-quant.c enforces:
 *   q8_0 0.0054 / 0.0053-0.0056 (0.0060)   q4_0 0.086 / 0.084-0.091 (0.095)
 *   q2_k 0.296  / 0.306-0.357   (0.37)     q3_k 0.151 / 0.151-0.190 (0.20)
 *   q4_k 0.071  / 0.070-0.086   (0.090)    q5_k 0.036 / 0.037-0.044 (0.046)
 *   q6_k 0.018  / 0.017-0.022   (0.024)    q8_k 0.0070 / 0.0061-0.0090 (0.0095)
 *   f16 0.00021, bf16 0.0017. The scalar k-quant quantizers are slow (q4_k ~60
 *   MB/s of f32 input per thread; the SIMD q4_k/q5_k about 6x faster); they are
 *   meant for offline packing.
 */
enum moe_status moe_quantize_row(enum moe_qtype t, const float *src, void *dst, int64_t n);

/*
 * moe_dequantize_row: expand a quantized row into n floats. Every ISA path gives
 * the same bits (tested); they equal gguf.quants.dequantize. The one exception is
 * NaN payloads: a signalling NaN in f16 data comes out quiet from the SIMD paths
 * (hardware conversion) and unchanged from the scalar one (as numpy does). Any
 * input bytes are accepted (a NaN scale gives NaNs). Errors as for
 * moe_quantize_row.
 */
enum moe_status moe_dequantize_row(enum moe_qtype t, const void *src, float *dst, int64_t n);

/*
 * moe_vec_dot: dot product of a quantized row w (n elements) with float32 x.
 *
 * Definition (the scalar path, which is the specification): with v = the row as
 * moe_dequantize_row gives it, the result is (float)(sum over i = 0..n-1, in
 * index order, of (double)v[i] * (double)x[i]) accumulated in double. Every
 * product is exact, so this is the real dot product of v and x up to about
 * n * 2^-53 relative, rounded once to float.
 *
 * SIMD paths (AVX2+FMA, AVX-512) dequantize in registers to exactly the same v[i]
 * (AVX-512 partly through per-sub-block lookup tables of those same values) and
 * accumulate with FMA in float lanes. They are tested to satisfy
 *     |simd - scalar| <= (n/32 + 10) * 2^-24 * sum_i |v[i] * x[i]|
 * (at most 8.3e-6 of sum|v x| for n <= 4096), which covers the worst-case
 * rounding of their accumulation order (each lane chain adds at most ceil(n/32)
 * products, then at most 6 levels of pairwise reduction) plus the final rounding
 * of the scalar result. Typical differences are far smaller (about 1e-7 of
 * sum|v x|).
 *
 * Returns NaN (and logs) for an invalid type, NULL pointers, n < 0, or n not a
 * multiple of the block size; 0 for n = 0.
 */
float moe_vec_dot(enum moe_qtype t, const void *w, const float *x, int64_t n);

/* ---- instruction-set selection ---------------------------------------- */

/*
 * Kernels are chosen at run time. On first use the best ISA the CPU (and OS)
 * supports is picked, unless the environment variable MOE_QUANT_ISA names one
 * ("scalar", "avx2", "avx512"). The SIMD code is compiled with per-function target
 * attributes, so the default build needs no -march flags.
 *   avx2   = AVX2 + FMA + F16C
 *   avx512 = AVX-512 F + BW + VL (plus the avx2 set)
 */
enum moe_quant_isa {
    MOE_QUANT_ISA_SCALAR = 0,
    MOE_QUANT_ISA_AVX2 = 1,
    MOE_QUANT_ISA_AVX512 = 2,
    MOE_QUANT_ISA_AUTO = 3, /* for moe_quant_set_isa: the best supported */
};

/* moe_quant_isa_supported: 1 if this build has the ISA's kernels and the CPU can
 * run them (scalar: always 1). */
int moe_quant_isa_supported(enum moe_quant_isa isa);

/* moe_quant_set_isa: force an ISA (for tests and benchmarks). Returns
 * MOE_ERR_UNSUPPORTED (and logs) if it is not supported here; the selection is
 * then unchanged. Not thread-safe against running kernels. */
enum moe_status moe_quant_set_isa(enum moe_quant_isa isa);

/* moe_quant_get_isa: the ISA the kernels use now (never AUTO). */
enum moe_quant_isa moe_quant_get_isa(void);

/* moe_quant_isa_name: name of the ISA in use now: "scalar", "avx2" or "avx512". */
const char *moe_quant_isa_name(void);

/* moe_quant_isa_str: name of a given ISA value ("auto" for AUTO, "?" if invalid). */
const char *moe_quant_isa_str(enum moe_quant_isa isa);

/* ---- integer dot products against quantized activations ---------------- */

/*
 * Matrix-vector work against a quantized weight row goes faster when the float
 * activation row is quantized ONCE (per matrix, or per layer input shared by
 * several matrices) into 8-bit blocks of the weight type's block size, and each
 * weight row is then dotted with it in integer arithmetic (ggml's scheme):
 *
 *   weight type                 activation blocks (moe_act_type)
 *   q8_0, q4_0                  q8_0: f16 d, 32 int8 (bit-identical to gguf's q8_0)
 *   q2_k, q3_k, q4_k, q5_k,     q8_k: f32 d, 256 int8, int16 sums of each 16
 *   q6_k                        (bit-identical to ggml's quantize_row_q8_K_ref)
 *   f32, f16, bf16, q8_k        f32: the activations are copied as they are, and the
 *                               "integer" functions below compute moe_vec_dot
 *
 * so a caller can use these functions for every stored type.
 *
 * Accuracy: against moe_vec_dot with the float activations x, the result
 * differs by the activation quantization error sum_i w[i] * (x[i] - xd[i]) (xd =
 * the dequantized activation); |x[i] - xd[i]| <= B[i] = d_x / 2 + 2^-10 |x[i]| +
 * 2^-18 (q8_0: rounding to the block's grid plus the f16 rounding of d_x) or
 * |d_x| / 2 + 2^-21 |x[i]| (q8_k), and tests/test-quant.c checks that the two
 * dot products differ by at most sum_i |w[i]| B[i] plus their float tolerances.
 * Measured on rows of 4096 with w ~ N(0, 0.02^2), x ~ N(0, 1): the rms
 * error is 0.6 % (q8_0 activations) to 0.8 % (q8_k) of the rms dot product, against
 * a weight quantization error of 0.6 % (q8_0), 1.8 % (q6_k), 7.9 % (q4_k); with
 * 1 % of x scaled by 10 (outlier channels) it is 1 % and 2.4 %. So for q8_0
 * weights the integer path about doubles the error of the dot product, for
 * q4_k it adds little.
 */

/* moe_act_type: the activation block type for weights of type wt (table above).
 * For an invalid wt it returns MOE_QTYPE_F32; the functions below reject it. */
enum moe_qtype moe_act_type(enum moe_qtype wt);

/* moe_act_row_bytes: bytes of a quantized activation row of n elements for
 * weights of type wt (= moe_qtype_row_bytes(moe_act_type(wt), n)); 0 when wt is
 * invalid or n is not a non-negative multiple of wt's block size. */
size_t moe_act_row_bytes(enum moe_qtype wt, int64_t n);

/*
 * moe_quantize_act: quantize n floats x into moe_act_row_bytes(wt, n) bytes at
 * xq, once, for any number of dot products with rows of type wt. Every ISA path
 * gives exactly the bytes of moe_quantize_row(moe_act_type(wt), ...) for finite
 * inputs (tested); non-finite inputs give well-formed blocks with unspecified
 * values. The quants are in -127..127 (never -128), which the SIMD dot kernels
 * rely on. Returns MOE_ERR_INVALID (and logs) for an invalid type, NULL pointers,
 * n < 0, or n not a multiple of wt's block size.
 */
enum moe_status moe_quantize_act(enum moe_qtype wt, const float *x, void *xq, int64_t n);

/*
 * moe_vec_dot_act: dot product of a weight row w (type wt, n elements) with a
 * quantized activation row xq made by moe_quantize_act(wt, ..., n).
 *
 * Definition (the scalar path, the specification): exact integer sums, then the
 * scales in double, rounded once to float at the end:
 *   q8_0, q4_0:  sum over blocks of (double)(d_w * d_x) * isum, isum = sum of
 *                q_w[j] * q_x[j] (q4_0: q_w = nibble - 8); d_w * d_x is exact in
 *                float (two f16 values).
 *   k-quants:    sum over super-blocks of (double)d_x * ((double)d * isc -
 *                (double)dmin * imin), isc = sum over sub-blocks of scale *
 *                sum(q_w * q_x) and imin = sum over sub-blocks of min * (its sum of
 *                q_x from the activation's bsums); q2_k/q4_k/q5_k have mins, q3_k
 *                and q6_k (signed q, signed scales) do not.
 * So it equals the real dot product of the weights (w = d*scale*q - dmin*min,
 * exactly, without the float rounding of moe_dequantize_row) with the
 * dequantized activations, up to a few double roundings.
 *
 * SIMD paths (AVX2 maddubs, AVX-512 VNNI vpdpbusd/vpdpwssd) compute the same
 * integers exactly and scale them in float lanes with FMA. They are tested to
 * satisfy |simd - scalar| <= (n/32 + 10) * 2^-24 * M with M = sum_i (|a_i| +
 * |b_i|) * |xd_i|, where w_i = a_i - b_i splits a weight into its scale part
 * (d*scale*q) and min part (dmin*min; 0 without mins) and xd is the dequantized
 * activation. (Each lane's integer sum is a partial sum of those terms, so
 * its conversion and scaling errors are relative to M; the chain of adds per
 * lane is at most n/32.)
 *
 * Returns NaN (and logs) for an invalid type, NULL pointers, n < 0, or n not a
 * multiple of the block size; 0 for n = 0.
 */
float moe_vec_dot_act(enum moe_qtype wt, const void *w, const void *xq, int64_t n);

/*
 * moe_mat_dot_act: a tile of dot products for matrix-vector and matrix-matrix
 * work: for r < nw and c < nx,
 *     out[r * out_sw + c * out_sx] = moe_vec_dot_act(wt, w + r * w_stride, xq + c * x_stride, n)
 * (strides in bytes for w and xq, in floats for out), with the same results as
 * that loop bit for bit. Faster: with one activation row it walks weight rows
 * in groups (one pass over the activation per group); with several it unpacks
 * each weight block once for up to 4 activations, in row chunks small enough
 * to stay in cache while every activation passes over them.
 * Returns MOE_ERR_INVALID (and logs) for the errors of moe_vec_dot_act or
 * nw < 0, nx < 0 (out is untouched then); nw or nx = 0 is OK and writes nothing.
 * Thread-safe; split the rows between threads for parallel work.
 *
 * For the layout q4_k_r16 (moe_repack): w starts on a group, nw is a multiple
 * of 16 and w_stride = moe_qtype_row_bytes(wt, n) (else MOE_ERR_INVALID);
 * each output is the stored row's moe_vec_dot_act within its SIMD tolerance
 * (bit for bit on the scalar table), whatever the split into groups.
 */
enum moe_status moe_mat_dot_act(enum moe_qtype wt, int64_t n, const void *w, size_t w_stride, int64_t nw,
                                const void *xq, size_t x_stride, int64_t nx, float *out, size_t out_sw,
                                size_t out_sx);

/*
 * moe_gate_up_act: the SwiGLU input of an expert for rows [0, rows) of its gate
 * and up matrices (type wt, rows of n, consecutive rows row_bytes =
 * moe_qtype_row_bytes(wt, n) apart) against nx quantized activation rows:
 *     h[c * ldh + r] = silu(g) * u,  g = dot(gate row r, xq row c),
 *     u = dot(up row r, xq row c), silu(g) = g / (1 + expf(-g))
 * with the dots exactly those of moe_vec_dot_act: one call per expert (or per
 * thread's slice of rows) and no intermediate buffers for the caller. Inside,
 * the gate rows and then the up rows (in chunks, combined as they come) go
 * through moe_mat_dot_act's tiling; reading gate and up rows in the same kernel
 * call was measured slower (more memory streams). Pass gate and up at row r0
 * (and h + r0) to do a slice of rows. Errors as for moe_mat_dot_act.
 */
enum moe_status moe_gate_up_act(enum moe_qtype wt, int64_t n, const void *gate, const void *up, int64_t rows,
                                const void *xq, size_t x_stride, int64_t nx, float *h, size_t ldh);

/*
 * ---- row-interleaved layouts (repacking at load) ----
 *
 * A matrix-vector product reads every weight once, so its speed is the number
 * of instructions per weight byte. In the stored q4_k layout each row is
 * dotted on its own: per super-block the scales are unpacked, the integer
 * lanes scaled and (at the end) summed horizontally, once per row. In
 * q4_k_r16 sixteen rows are interleaved 4 bytes at a time, so one 512-bit
 * vector holds the same 4 weight bytes of 16 rows: one vpdpbusd against 4
 * broadcast activation bytes advances all 16 rows (AVX2: two vpmaddubsw), the scales of 16 rows are
 * unpacked together, and the 16 outputs come out as one vector. The idea is
 * ggml's interleaved "repack" buffers; the layout here is our own:
 *
 *   a group of 16 rows, super-block i (2304 bytes = 16 q4_k blocks), at
 *   (group * n_superblocks + i) * 2304:
 *     0     d[16]     f16, row r's d
 *     32    dmin[16]  f16
 *     64    S0[16]    4 bytes each: row r's scales[0..3]   (moe_block_q4_K)
 *     128   S1[16]    4 bytes each: row r's scales[4..7]
 *     192   S2[16]    4 bytes each: row r's scales[8..11]
 *     256   qs        32 columns x 16 rows x 4 bytes: column c of row r
 *                     (its qs[4c .. 4c+3]) at 256 + 64 c + 4 r
 *
 *   q8_0_r16: a group of 16 rows, block i (544 bytes = 16 q8_0 blocks) at
 *   (group * n_blocks + i) * 544:
 *     0     d[16]     f16, row r's d
 *     32    qs        8 columns x 16 rows x 4 bytes: column c of row r (its
 *                     qs[4c .. 4c+3], each byte XOR 0x80, i.e. q + 128 as an
 *                     unsigned byte) at 32 + 64 c + 4 r
 *   (vpdpbusd multiplies unsigned by signed bytes: the weights go in offset
 *   by 128, and 128 times the activation's sum is taken off again.)
 *
 * So a group occupies exactly the bytes of its 16 rows, and rows r0.. of a
 * repacked matrix start at data + r0 * row_bytes when r0 is a multiple of 16.
 */

/* moe_repack_type: the layout moe_repack gives a matrix of type t with n_out
 * rows of n_in, on this CPU now: q4_k_r16 for q4_k and q8_0_r16 for q8_0,
 * with n_out a multiple of 16, when the kernel table in use has a vector
 * kernel for the layout (q4_k_r16: AVX-512 VNNI vpdpbusd or AVX2
 * vpmaddubsw; q8_0_r16: AVX-512 VNNI only); otherwise t itself (no
 * repacking worth doing). */
enum moe_qtype moe_repack_type(enum moe_qtype t, int64_t n_out, int64_t n_in);

/* moe_qtype_group_rows: rows per interleaved group (16 for the _r16 layouts), 1 for
 * the stored types, 0 if t is neither. Row ranges handed to moe_mat_dot_act
 * and moe_gate_up_act must start and end on a group boundary. */
int moe_qtype_group_rows(enum moe_qtype t);

/* moe_repack: write the n_out x n_in matrix src (type t) to dst in layout
 * `to` (= moe_repack_type(t, ...), or t itself: a plain copy). dst has the
 * same size (n_out * moe_qtype_row_bytes(t, n_in)) and must not overlap src.
 * Returns MOE_ERR_INVALID (and logs) for NULL pointers, a bad shape, or a
 * layout that t cannot take. Thread-safe; any alignment. */
enum moe_status moe_repack(enum moe_qtype t, enum moe_qtype to, int64_t n_out, int64_t n_in, const void *src,
                           void *dst);

/* moe_repack_in_place: moe_repack with dst = src = data: the matrix is
 * rewritten group by group (a group of 16 rows occupies the same bytes in
 * both layouts) through tmp, which must hold one group: 16 *
 * moe_qtype_row_bytes(t, n_in) bytes. The bytes equal moe_repack's. For a
 * copy just read (the expert store's loaders): one pass over memory, no
 * second buffer of the matrix's size. Errors as moe_repack, and for a tmp
 * smaller than a group. Thread-safe for distinct data and tmp. */
enum moe_status moe_repack_in_place(enum moe_qtype t, enum moe_qtype to, int64_t n_out, int64_t n_in, void *data,
                                    void *tmp, size_t tmp_size);

/* moe_unpack_row: row `row` of a matrix of type t (a stored type or a
 * runtime layout) in the stored layout: moe_qtype_row_bytes(t, n_in) bytes at
 * dst, which moe_dequantize_row(moe_stored_type(t), ...) then reads. */
enum moe_status moe_unpack_row(enum moe_qtype t, int64_t n_in, const void *data, int64_t row, void *dst);

/* moe_dequantize_row_of: row `row` of a matrix of type t (a stored type or a
 * runtime layout; n_in elements per row) as n_in floats at dst, exactly as
 * moe_dequantize_row gives the stored row. Errors as moe_unpack_row. */
enum moe_status moe_dequantize_row_of(enum moe_qtype t, int64_t n_in, const void *data, int64_t row, float *dst);

/* moe_stored_type: the file type a layout holds (q4_k for q4_k_r16, q8_0
 * for q8_0_r16), t for the others. */
enum moe_qtype moe_stored_type(enum moe_qtype t);

/* moe_quant_int_isa_name: the integer-dot kernels in use now: "scalar", "avx2"
 * (maddubs), "avx512vnni" (vpdpbusd; the avx512 ISA on CPUs with VNNI) or
 * "avx2" under the avx512 ISA on CPUs without VNNI. */
const char *moe_quant_int_isa_name(void);

/* ---- internal: the per-ISA kernel table (formats/quant*.c only) --------- */
#ifdef MOE_QUANT_INTERNAL
/* Dot and dequantize kernels (moe_dot_fn, moe_dequant_fn above) get whole
 * blocks (nb of them; for f32/f16/bf16 nb = n elements). */
/* Integer dot tile: R weight rows w[r] against C activation rows x[c], nb blocks
 * each; out[r * C + c]. The shapes (R x C) a table holds: */
enum moe_tile { MOE_TILE_1X1, MOE_TILE_1X2, MOE_TILE_1X4, MOE_TILE_4X1, MOE_TILE_COUNT };
typedef void (*moe_dotq_fn)(const uint8_t *const *w, const uint8_t *const *x, int64_t nb, float *out);
/* Activation quantizer: nb blocks of the activation type. */
typedef void (*moe_quant_act_fn)(const float *x, void *y, int64_t nb);
struct moe_quant_kernels {
    moe_dot_fn dot[MOE_QTYPE_LIMIT];
    moe_dequant_fn dequant[MOE_QTYPE_LIMIT];
    moe_dotq_fn dotq[MOE_QTYPE_LIMIT][MOE_TILE_COUNT]; /* by weight type; NULL: no integer kernel */
    moe_quant_act_fn quant_act[MOE_QTYPE_LIMIT];       /* by activation type (q8_0, q8_k) */
    moe_quant_act_fn quant_row[MOE_QTYPE_LIMIT];       /* moe_quantize_row's SIMD kernel, bytes identical
                                                          to the reference (q8_0 q4_k q5_k); NULL: the reference */
    const char *int_name;                              /* "scalar", "avx2", "avx512vnni" */
    unsigned char fast_layout[MOE_QTYPE_LIMIT];        /* by layout: dotq[] is a vector kernel */
};
/* Fill the table entries an ISA implements (leaves others untouched). */
void moe_quant_kernels_avx2(struct moe_quant_kernels *k);
void moe_quant_kernels_avx512(struct moe_quant_kernels *k);
/* Integer kernels (quant-int*.c): scalar reference, AVX2, AVX-512 VNNI. */
void moe_quant_int_kernels_scalar(struct moe_quant_kernels *k);
void moe_quant_int_kernels_avx2(struct moe_quant_kernels *k);
void moe_quant_int_kernels_avx512vnni(struct moe_quant_kernels *k);
/* The table of the ISA in use now (quant.c). */
const struct moe_quant_kernels *moe_quant_kernels_now(void);
/* _r16 layouts: row r's stored block (q4_k or q8_0) from the group block g
 * of layout t (quant-pack.c). */
void moe_r16_unpack_block(enum moe_qtype t, const uint8_t *g, int r, uint8_t *block);
/* The scalar reference quantizer of t (q8_0, q4_k, q5_k: the types with a
 * quant_row kernel), nb blocks. A SIMD quantizer hands it the blocks whose
 * bytes only the reference's own compiled code defines: a NaN's payload can
 * reach a k-quant level, and which NaN an operation returns when both operands
 * are NaNs depends on the operand order the compiler chose. */
void moe_quant_ref_blocks(enum moe_qtype t, const float *x, void *y, int64_t nb);
/* q4_k / q5_k: from the 8 sub-block fits (scales, mins) of a block, its d,
 * dmin and 12 packed 6-bit scale/min bytes at hdr (quant.c; the SIMD
 * quantizers share it, so the header bytes are the reference's). */
void moe_k_asym_header(const float *scales, const float *mins, uint8_t *hdr);
/* Tile shape sizes: rows and activations of each enum moe_tile. */
static inline int moe_tile_rows(enum moe_tile s) { return s == MOE_TILE_4X1 ? 4 : 1; }
static inline int moe_tile_cols(enum moe_tile s) { return s == MOE_TILE_1X2 ? 2 : s == MOE_TILE_1X4 ? 4 : 1; }
#endif

#ifdef __cplusplus
}
#endif
#endif

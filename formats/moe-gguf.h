/*
 * moe-gguf.h - zero-copy, validating reader for GGUF files (llama.cpp / ggml).
 *
 * Opens a GGUF v2 or v3 file (little-endian), maps it read-only and indexes
 * its key-value metadata and its tensors. Every count, length, offset, type
 * and alignment is checked against the file before it is used
 * (formats/gguf.c lists the checks); malformed input is logged with the file
 * name, the byte offset and the problem, and returned as MOE_ERR_FORMAT, a
 * valid file this reader does not handle (GGUF v1, big-endian, a tensor type
 * other than those below) as MOE_ERR_UNSUPPORTED - never a crash.
 *
 * Tensor types read: f32, f16, bf16, q8_0, q4_0, q2_k, q3_k, q4_k, q5_k,
 * q6_k and mxfp4 (the ggml types of formats/moe-quant.h; the type id of a
 * tensor is its enum moe_qtype value). A file holding any other type (q4_1,
 * q5_0, the IQ types, ...) is refused by name.
 *
 * Ownership: the handle owns the map, the key and tensor-name strings and
 * the string tables of string values; every `data` pointer points into the
 * map and stays valid until moe_gguf_free(). moe_gguf_open_memory borrows the
 * caller's buffer, which must outlive the handle.
 *
 * Thread-safety: a handle is immutable after open; lookups may run
 * concurrently.
 */
#ifndef MOE_GGUF_H
#define MOE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "moe-quant.h"
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_GGUF_MAX_DIMS 4
#define MOE_GGUF_MAX_NAME 63          /* ggml's GGML_MAX_NAME - 1: longest tensor name */
#define MOE_GGUF_DEFAULT_ALIGNMENT 32 /* when general.alignment is absent */

/* Value types of the metadata (the numeric values are GGUF's). */
enum moe_gguf_type {
    MOE_GGUF_U8 = 0,
    MOE_GGUF_I8 = 1,
    MOE_GGUF_U16 = 2,
    MOE_GGUF_I16 = 3,
    MOE_GGUF_U32 = 4,
    MOE_GGUF_I32 = 5,
    MOE_GGUF_F32 = 6,
    MOE_GGUF_BOOL = 7,
    MOE_GGUF_STRING = 8,
    MOE_GGUF_ARRAY = 9,
    MOE_GGUF_U64 = 10,
    MOE_GGUF_I64 = 11,
    MOE_GGUF_F64 = 12,
    MOE_GGUF_TYPE_COUNT
};

/* A string value: bytes in the file, not NUL-terminated, not checked to be
 * UTF-8 (keys and tensor names are; values are whatever the writer put). */
struct moe_gguf_str {
    const char *p;
    uint64_t n;
};

/* One metadata item. Scalars have n = 1 and elem = type; arrays have type
 * MOE_GGUF_ARRAY, their element type in elem and their length in n (arrays
 * of arrays are refused). Numeric and bool elements are read from `data`
 * (little-endian, possibly unaligned: use the accessors below); string
 * values and string arrays are in str[0..n). */
struct moe_gguf_kv {
    const char *key; /* NUL-terminated */
    enum moe_gguf_type type;
    enum moe_gguf_type elem;
    uint64_t n;
    const void *data;              /* numeric / bool elements; NULL for strings */
    const struct moe_gguf_str *str; /* string elements; NULL otherwise */
};

/* One tensor. ne[] is in ggml order: ne[0] is the number of elements of a
 * row (contiguous in memory), ne[1] the number of rows, ... A Hugging Face
 * (PyTorch) tensor of shape [a, b] is stored as ne = {b, a}. */
struct moe_gguf_tensor {
    const char *name; /* NUL-terminated, at most MOE_GGUF_MAX_NAME bytes */
    int n_dims;       /* 1 .. MOE_GGUF_MAX_DIMS */
    int64_t ne[MOE_GGUF_MAX_DIMS]; /* unused dims are 1 */
    enum moe_qtype type;
    uint64_t offset;  /* from the start of the data section */
    const void *data; /* in the map; aligned to the file's alignment relative to the data section */
    size_t nbytes;
};

struct moe_gguf;

/* moe_gguf_open: map and validate a .gguf file. MOE_ERR_IO / MOE_ERR_NOT_FOUND
 * when it cannot be read, MOE_ERR_FORMAT when malformed, MOE_ERR_UNSUPPORTED
 * for a valid file we do not read (all logged). *out is NULL on error. */
enum moe_status moe_gguf_open(const char *path, struct moe_gguf **out);

/* moe_gguf_open_memory: validate and index an in-memory image (tests, the
 * fuzz target). The buffer must outlive the handle; `label` names it in
 * messages. */
enum moe_status moe_gguf_open_memory(const void *buf, size_t len, const char *label, struct moe_gguf **out);

/* moe_gguf_free: unmap and free; NULL is a no-op. */
void moe_gguf_free(struct moe_gguf *g);

/* moe_gguf_is_gguf_file: 1 if the file at path starts with the GGUF magic
 * (reads 4 bytes; 0 for directories, unreadable or short files). */
int moe_gguf_is_gguf_file(const char *path);

/* File-level facts: version (2 or 3), alignment of tensor data, the byte
 * offset of the data section, the path (or label) it was opened as. */
uint32_t moe_gguf_version(const struct moe_gguf *g);
uint32_t moe_gguf_alignment(const struct moe_gguf *g);
uint64_t moe_gguf_data_offset(const struct moe_gguf *g);
const char *moe_gguf_path(const struct moe_gguf *g);

/* Metadata: count, i-th item in file order, lookup by key (NULL if absent). */
size_t moe_gguf_n_kv(const struct moe_gguf *g);
const struct moe_gguf_kv *moe_gguf_kv_at(const struct moe_gguf *g, size_t i);
const struct moe_gguf_kv *moe_gguf_find_kv(const struct moe_gguf *g, const char *key);

/* Tensors: count, i-th in file order, lookup by name (NULL if absent). */
size_t moe_gguf_n_tensors(const struct moe_gguf *g);
const struct moe_gguf_tensor *moe_gguf_tensor_at(const struct moe_gguf *g, size_t i);
const struct moe_gguf_tensor *moe_gguf_find_tensor(const struct moe_gguf *g, const char *name);

/* Element accessors for a kv (scalar: i = 0). Each returns 1 and stores the
 * value when element i exists and has a fitting type, else 0:
 *   moe_gguf_kv_int:   any integer type whose value fits an int64 (u64 above
 *                      INT64_MAX does not), and bool (0/1);
 *   moe_gguf_kv_float: f32, f64 and the integer types;
 *   moe_gguf_kv_str:   string elements. */
int moe_gguf_kv_int(const struct moe_gguf_kv *kv, uint64_t i, int64_t *out);
int moe_gguf_kv_float(const struct moe_gguf_kv *kv, uint64_t i, double *out);
int moe_gguf_kv_str(const struct moe_gguf_kv *kv, uint64_t i, struct moe_gguf_str *out);

/* moe_gguf_type_name: "u8", "i32", "string", "array", ... ("?" if unknown). */
const char *moe_gguf_type_name(enum moe_gguf_type t);

/* moe_gguf_ggml_type_name: ggml's name of a tensor type id ("q4_k", "iq2_xs",
 * ...; NULL for ids ggml never used), including the types this reader
 * refuses, so messages can name them. */
const char *moe_gguf_ggml_type_name(uint32_t type_id);

#ifdef __cplusplus
}
#endif
#endif

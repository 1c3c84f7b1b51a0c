/*
 * moe-safetensors.h - zero-copy reader for Hugging Face safetensors checkpoints.
 *
 * Opens a single `.safetensors` file, or a model directory holding either
 * `model.safetensors` or a sharded set described by `model.safetensors.index.json`.
 * Files are mmapped read-only; tensor data pointers point into the maps and stay
 * valid until moe_safetensors_free(). Every header is validated before use
 * (formats/safetensors.c lists the checks); malformed input is logged with the
 * file name and the problem, and MOE_ERR_FORMAT (malformed), MOE_ERR_UNSUPPORTED
 * (a valid dtype other than F32/F16/BF16/U8/F8_E4M3), MOE_ERR_NOT_FOUND (missing file or
 * shard) or MOE_ERR_IO is returned — never a crash.
 *
 * Thread-safety: a handle is immutable after open; concurrent lookups are safe.
 */
#ifndef MOE_SAFETENSORS_H
#define MOE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "moe-dtype.h"
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_ST_MAX_DIMS 8
#define MOE_ST_MAX_HEADER (100u * 1000u * 1000u) /* 100 MB */

struct moe_st_tensor {
    const char *name;          /* owned by the handle */
    enum moe_dtype dtype;
    int n_dims;                /* 0..MOE_ST_MAX_DIMS; 0 = scalar */
    int64_t shape[MOE_ST_MAX_DIMS]; /* row-major, outermost first (as torch) */
    int64_t n_elements;
    const void *data;          /* points into the mmapped file */
    size_t nbytes;
    int file_index;            /* which shard */
};

struct moe_safetensors;

/* moe_safetensors_open: open a .safetensors file or a model directory (single
 * file or sharded via model.safetensors.index.json). Returns MOE_ERR_IO,
 * MOE_ERR_FORMAT or MOE_ERR_NOT_FOUND with a logged message on failure. */
enum moe_status moe_safetensors_open(const char *path, struct moe_safetensors **out);

/* moe_safetensors_open_memory: validate and index an in-memory buffer (used by
 * tests and the fuzz target). The buffer must outlive the handle. `label` names
 * the buffer in error messages. */
enum moe_status moe_safetensors_open_memory(const void *buf, size_t len, const char *label,
                                            struct moe_safetensors **out);

/* moe_safetensors_free: unmap and free; NULL is a no-op. */
void moe_safetensors_free(struct moe_safetensors *st);

/* moe_safetensors_count: number of tensors over all shards. */
size_t moe_safetensors_count(const struct moe_safetensors *st);

/* moe_safetensors_at: the i-th tensor (0 <= i < count), in file then offset order. */
const struct moe_st_tensor *moe_safetensors_at(const struct moe_safetensors *st, size_t i);

/* moe_safetensors_find: look a tensor up by name; NULL if absent. */
const struct moe_st_tensor *moe_safetensors_find(const struct moe_safetensors *st,
                                                 const char *name);

/* moe_safetensors_metadata: value of a "__metadata__" key of the first file, or NULL. */
const char *moe_safetensors_metadata(const struct moe_safetensors *st, const char *key);

/* moe_safetensors_n_files / moe_safetensors_file_path: the shard files opened. */
int moe_safetensors_n_files(const struct moe_safetensors *st);
const char *moe_safetensors_file_path(const struct moe_safetensors *st, int i);

#ifdef __cplusplus
}
#endif
#endif

/*
 * moe-bundle.h - the bundle (.moeb): one packed file holding a quantized MoE
 * model, every routed expert stored at several precisions side by side.
 *
 * docs/format.md is the byte-exact specification; this header is the manual.
 * In short: a 4096-byte header page (magic, version, directory location and
 * checksum, two tuning slots A/B), a data region where every non-expert tensor
 * and every (layer x expert x precision) blob starts on a 4096-byte boundary,
 * a checksummed directory (typed metadata, tensor table, precision descriptors,
 * expert table) written after the data, and tuning payloads appended after
 * the directory. All integers are little-endian; checksums are XXH3-64 (seed 0).
 *
 * The container knows nothing about quantization: tensor and part type ids are
 * opaque u32 values (formats/moe-quant.h defines them), and a blob is just
 * bytes whose layout the precision descriptor names.
 *
 * Errors: every fallible function returns enum moe_status and logs one message
 * through moe_log naming the file (or label), the item (tensor name, "layer 3
 * expert 17 precision q4_k", "directory", "tuning slot B") and the problem.
 * Malformed files give MOE_ERR_FORMAT, files of a newer major version
 * MOE_ERR_UNSUPPORTED, system failures MOE_ERR_IO / MOE_ERR_NOMEM, bad
 * arguments MOE_ERR_INVALID / MOE_ERR_RANGE. Nothing here asserts on file
 * contents. Getters of metadata and tuning values do not log (a missing key is
 * often expected): they return NULL or MOE_ERR_NOT_FOUND (absent) and
 * MOE_ERR_SHAPE (present with another type).
 *
 * Thread-safety: an open struct moe_bundle is immutable (but for the state of
 * moe_bundle_check_file, which keeps it under its own lock); every reader
 * function may be called from any number of threads at once. A struct moe_bundle_kv is
 * not synchronised: build it in one thread, then share it read-only. Writer:
 * see "Writer" below.
 */
#ifndef MOE_BUNDLE_H
#define MOE_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_BUNDLE_VERSION_MAJOR 1
#define MOE_BUNDLE_VERSION_MINOR 0
#define MOE_BUNDLE_ALIGN 4096u          /* start of every tensor, blob, directory, payload */
#define MOE_BUNDLE_PART_ALIGN 64u       /* start of every part inside a blob */
#define MOE_BUNDLE_MAX_DIMS 4
#define MOE_BUNDLE_MAX_PARTS 4
#define MOE_BUNDLE_MAX_PRECISIONS 16
#define MOE_BUNDLE_MAX_NAME 1024        /* tensor name bytes */
#define MOE_BUNDLE_MAX_PRECISION_NAME 63 /* [A-Za-z0-9_.+-] */
#define MOE_BUNDLE_MAX_KEY 256          /* metadata / tuning key bytes */
#define MOE_BUNDLE_MAX_DIR (1ull << 30) /* directory bytes (1 GiB) */
#define MOE_BUNDLE_MAX_TUNING (256ull << 20) /* tuning payload bytes (256 MiB) */
#define MOE_BUNDLE_MIN_SAVING_PCT 3     /* zstd output kept only if it saves >= 3% */

/* ------------------------------------------------------------------------- */
/* Typed key/value sets: the metadata and the tuning payload share this codec. */

enum moe_bundle_kv_type {
    MOE_KV_STRING = 1,    /* UTF-8 text without NUL bytes */
    MOE_KV_I64 = 2,
    MOE_KV_F64 = 3,       /* IEEE binary64, stored bit-exactly (NaN payloads too) */
    MOE_KV_BOOL = 4,
    MOE_KV_BYTES = 5,     /* opaque bytes */
    MOE_KV_I64_ARRAY = 6,
    MOE_KV_F64_ARRAY = 7,
    MOE_KV_STR_ARRAY = 8, /* UTF-8 strings without NUL bytes */
};

/* One key/value as seen by iteration. Only the fields of `type` are set;
 * pointers are borrowed from the set (or bundle) that produced the item and
 * stay valid until it is freed or the key is set again. */
struct moe_bundle_kv_item {
    const char *key;
    enum moe_bundle_kv_type type;
    size_t count;               /* STRING/BYTES: bytes (no NUL); arrays: elements; scalars: 1 */
    const char *str;            /* STRING (NUL-terminated) */
    int64_t i64;                /* I64 */
    double f64;                 /* F64 */
    bool b;                     /* BOOL */
    const void *bytes;          /* BYTES (non-NULL even when count == 0) */
    const int64_t *i64s;        /* I64_ARRAY */
    const double *f64s;         /* F64_ARRAY */
    const char *const *strs;    /* STR_ARRAY */
};

struct moe_bundle_kv; /* opaque; keys are unique and kept in byte order */

/* moe_bundle_kv_new: an empty set. MOE_ERR_NOMEM on failure. */
enum moe_status moe_bundle_kv_new(struct moe_bundle_kv **out);

/* moe_bundle_kv_free: frees the set and every value; NULL is a no-op. */
void moe_bundle_kv_free(struct moe_bundle_kv *kv);

/* Setters: copy key and value into the set, replacing any value the key had
 * (of any type). Keys are 1..MOE_BUNDLE_MAX_KEY bytes of UTF-8 without control
 * characters; strings must be UTF-8 (MOE_ERR_INVALID otherwise, logged). On
 * any error the set is unchanged. Arrays may be empty (n = 0, pointer may be
 * NULL); so may bytes. A NULL string value is stored as "". */
enum moe_status moe_bundle_kv_set_str(struct moe_bundle_kv *kv, const char *key, const char *value);
enum moe_status moe_bundle_kv_set_i64(struct moe_bundle_kv *kv, const char *key, int64_t value);
enum moe_status moe_bundle_kv_set_f64(struct moe_bundle_kv *kv, const char *key, double value);
enum moe_status moe_bundle_kv_set_bool(struct moe_bundle_kv *kv, const char *key, bool value);
enum moe_status moe_bundle_kv_set_bytes(struct moe_bundle_kv *kv, const char *key, const void *data,
                                        size_t n);
enum moe_status moe_bundle_kv_set_i64_array(struct moe_bundle_kv *kv, const char *key,
                                            const int64_t *v, size_t n);
enum moe_status moe_bundle_kv_set_f64_array(struct moe_bundle_kv *kv, const char *key,
                                            const double *v, size_t n);
enum moe_status moe_bundle_kv_set_str_array(struct moe_bundle_kv *kv, const char *key,
                                            const char *const *v, size_t n);

/* moe_bundle_kv_copy: set every item of src into dst (keys of dst that src
 * lacks stay): how a stage rewrites the tuning while keeping other stages' keys. */
enum moe_status moe_bundle_kv_copy(struct moe_bundle_kv *dst, const struct moe_bundle_kv *src);

/* moe_bundle_kv_remove: deletes key; MOE_ERR_NOT_FOUND if it was absent. */
enum moe_status moe_bundle_kv_remove(struct moe_bundle_kv *kv, const char *key);

/* moe_bundle_kv_count / moe_bundle_kv_at: iteration in key byte order (what
 * `inspect` prints). at() returns MOE_ERR_RANGE past the end. NULL kv = empty. */
size_t moe_bundle_kv_count(const struct moe_bundle_kv *kv);
enum moe_status moe_bundle_kv_at(const struct moe_bundle_kv *kv, size_t i,
                                 struct moe_bundle_kv_item *out);

/* moe_bundle_kv_find: the item of `key`; MOE_ERR_NOT_FOUND if absent. */
enum moe_status moe_bundle_kv_find(const struct moe_bundle_kv *kv, const char *key,
                                   struct moe_bundle_kv_item *out);

/* Typed getters. Pointer getters return NULL when the key is absent or of
 * another type, and set *n (if non-NULL) to the element/byte count. Status
 * getters return MOE_ERR_NOT_FOUND (absent) or MOE_ERR_SHAPE (other type). */
const char *moe_bundle_kv_str(const struct moe_bundle_kv *kv, const char *key);
enum moe_status moe_bundle_kv_i64(const struct moe_bundle_kv *kv, const char *key, int64_t *out);
enum moe_status moe_bundle_kv_f64(const struct moe_bundle_kv *kv, const char *key, double *out);
enum moe_status moe_bundle_kv_bool(const struct moe_bundle_kv *kv, const char *key, bool *out);
const void *moe_bundle_kv_bytes(const struct moe_bundle_kv *kv, const char *key, size_t *n);
const int64_t *moe_bundle_kv_i64_array(const struct moe_bundle_kv *kv, const char *key, size_t *n);
const double *moe_bundle_kv_f64_array(const struct moe_bundle_kv *kv, const char *key, size_t *n);
const char *const *moe_bundle_kv_str_array(const struct moe_bundle_kv *kv, const char *key,
                                           size_t *n);

/* ------------------------------------------------------------------------- */
/* Shared descriptions                                                        */

enum moe_bundle_compression {
    MOE_BUNDLE_COMP_NONE = 0,
    MOE_BUNDLE_COMP_ZSTD = 1, /* one zstd frame declaring its content size */
};

/* One part of an expert blob (e.g. the gate, up and down matrices). */
struct moe_bundle_part {
    uint32_t type_id; /* opaque to the container (enum moe_qtype) */
    uint64_t rows, cols;
    uint64_t nbytes;  /* > 0 */
    uint64_t offset;  /* computed by the container: byte offset inside the raw blob,
                       * a multiple of MOE_BUNDLE_PART_ALIGN; ignored on input */
};

/* One stored precision of the experts. A raw blob is its parts concatenated,
 * part i starting at the first multiple of 64 at or after the end of part i-1
 * (zero padding between), part 0 at 0; raw_size = end of the last part. Every
 * expert of every layer has the same parts at a given precision. */
struct moe_bundle_precision {
    const char *name;  /* e.g. "q4_k": 1..63 bytes of [A-Za-z0-9_.+-], unique */
    uint32_t n_parts;  /* 1..MOE_BUNDLE_MAX_PARTS */
    struct moe_bundle_part parts[MOE_BUNDLE_MAX_PARTS];
    uint64_t raw_size; /* computed by the container; ignored on input */
};

/* moe_bundle_precision_layout: fills parts[].offset and raw_size of p from the
 * rule above. MOE_ERR_INVALID (logged) on a bad part count, a zero-byte part or
 * a size overflow. Writers use it to lay out the bytes they pass to add_expert. */
enum moe_status moe_bundle_precision_layout(struct moe_bundle_precision *p);

/* ------------------------------------------------------------------------- */
/* Writer                                                                     */
/*
 * Streaming: each tensor and blob is written to the file when it is added (only
 * the directory, which is small, is kept in memory), so memory stays bounded by
 * the largest single blob (twice that while compressing).
 * Tensors and stored blobs of 256 KiB or more are written with O_DIRECT where
 * the file system allows it (no copy into the page cache, which costs more CPU
 * than quantizing q8_0, and a large bundle does not evict other files); the
 * last partial page is written padded with zeros, the bytes the format has
 * there anyway, so the file is the same. MOE_BUNDLE_DIRECT=0 in the
 * environment (read by moe_bundle_writer_open) keeps every write buffered.
 *
 * Atomicity: the writer writes `<final_path>.tmp.<pid>` in the same directory.
 * Nothing appears at final_path until moe_bundle_writer_finish() succeeds
 * (fsync file, rename, fsync directory). Freeing an unfinished writer (or
 * moe_bundle_writer_abort) unlinks the temp file.
 *
 * Thread-safety: moe_bundle_writer_add_expert and moe_bundle_writer_add_tensor
 * may be called from several threads at once: compression and checksumming run
 * in the caller's thread, file offsets are reserved under an internal mutex and
 * the bytes written with pwrite, so quantize-and-add workers run in parallel.
 * Every other writer function must not overlap any call on the same writer.
 * Concurrent adds make blob placement (not content) depend on timing; for
 * byte-identical output add serially in a fixed order.
 *
 * Errors: an argument error (MOE_ERR_INVALID/RANGE) leaves the writer usable; an
 * I/O error makes it failed: every later call returns MOE_ERR_IO and only
 * free/abort remain useful.
 */
struct moe_bundle_writer;

/* moe_bundle_writer_open: creates the temp file next to final_path (O_EXCL).
 * MOE_ERR_IO (logged) if the directory is not writable or the temp name exists. */
enum moe_status moe_bundle_writer_open(const char *final_path, struct moe_bundle_writer **out);

/* moe_bundle_writer_abort: unlinks the temp file and frees the writer. After a
 * successful finish it only frees. NULL is a no-op. */
void moe_bundle_writer_abort(struct moe_bundle_writer *w);

/* moe_bundle_writer_free: frees the writer; if finish was not called (or
 * failed) this is moe_bundle_writer_abort. NULL is a no-op. */
void moe_bundle_writer_free(struct moe_bundle_writer *w);

/* Metadata setters: as the moe_bundle_kv_set_* functions, into the bundle's
 * metadata (model config text, tokenizer.json text, quantization recipe,
 * provenance, ...). */
enum moe_status moe_bundle_writer_set_meta_str(struct moe_bundle_writer *w, const char *key,
                                               const char *value);
enum moe_status moe_bundle_writer_set_meta_i64(struct moe_bundle_writer *w, const char *key,
                                               int64_t value);
enum moe_status moe_bundle_writer_set_meta_f64(struct moe_bundle_writer *w, const char *key,
                                               double value);
enum moe_status moe_bundle_writer_set_meta_bool(struct moe_bundle_writer *w, const char *key,
                                                bool value);
enum moe_status moe_bundle_writer_set_meta_bytes(struct moe_bundle_writer *w, const char *key,
                                                 const void *data, size_t n);
enum moe_status moe_bundle_writer_set_meta_i64_array(struct moe_bundle_writer *w, const char *key,
                                                     const int64_t *v, size_t n);
enum moe_status moe_bundle_writer_set_meta_f64_array(struct moe_bundle_writer *w, const char *key,
                                                     const double *v, size_t n);
enum moe_status moe_bundle_writer_set_meta_str_array(struct moe_bundle_writer *w, const char *key,
                                                     const char *const *v, size_t n);

/* moe_bundle_writer_add_tensor: writes one non-expert tensor now (stored raw,
 * checksummed). name: 1..MOE_BUNDLE_MAX_NAME bytes of UTF-8 without control
 * characters, unique; n_dims 0..4; the container does not relate shape to
 * nbytes (type ids are opaque). data may be NULL when nbytes == 0. */
enum moe_status moe_bundle_writer_add_tensor(struct moe_bundle_writer *w, const char *name,
                                             uint32_t type_id, uint32_t n_dims,
                                             const uint64_t *shape, const void *data,
                                             size_t nbytes);

/* moe_bundle_writer_set_expert_layout: declares n_layers x n_experts x
 * n_precisions blobs and copies the precision descriptors (raw sizes and part
 * offsets computed as moe_bundle_precision_layout). Call once, before any
 * add_expert. All three counts >= 1; n_precisions <= MOE_BUNDLE_MAX_PRECISIONS. */
enum moe_status moe_bundle_writer_set_expert_layout(struct moe_bundle_writer *w, uint32_t n_layers,
                                                    uint32_t n_experts, uint32_t n_precisions,
                                                    const struct moe_bundle_precision *precisions);

/* moe_bundle_writer_set_layer_has_experts: marks a layer dense (false: no blobs
 * for any expert or precision) or MoE (true, the default). Not allowed once a
 * blob of that layer was added. */
enum moe_status moe_bundle_writer_set_layer_has_experts(struct moe_bundle_writer *w,
                                                        uint32_t layer, bool has_experts);

/* moe_bundle_writer_add_expert: writes the blob of (layer, expert, precision)
 * now, in any order. raw_size must equal the precision's raw_size. zstd_level
 * 0 stores the bytes raw; > 0 (1..22) compresses them with zstd at that level
 * but keeps the raw bytes when compression saves less than
 * MOE_BUNDLE_MIN_SAVING_PCT percent. Adding a blob twice is MOE_ERR_INVALID.
 * Thread-safe against itself and add_tensor (see above). */
enum moe_status moe_bundle_writer_add_expert(struct moe_bundle_writer *w, uint32_t layer,
                                             uint32_t expert, uint32_t precision, const void *raw,
                                             size_t raw_size, int zstd_level);

/* moe_bundle_writer_set_tuning: copies an initial tuning payload (optional;
 * moe_bundle_replace_tuning changes it later without rewriting the file). */
enum moe_status moe_bundle_writer_set_tuning(struct moe_bundle_writer *w,
                                             const struct moe_bundle_kv *tuning);

/* moe_bundle_writer_finish: checks that every blob of every MoE layer was added
 * (MOE_ERR_INVALID naming the first missing one; the writer stays usable),
 * writes directory, tuning and header, fsyncs, renames the temp file to
 * final_path and fsyncs the directory. The writer must still be freed. */
enum moe_status moe_bundle_writer_finish(struct moe_bundle_writer *w);

/* ------------------------------------------------------------------------- */
/* Reader                                                                     */

struct moe_bundle; /* opaque, immutable after open */

/* A non-expert tensor. Pointers are owned by the bundle (valid until free). */
struct moe_bundle_tensor {
    const char *name;
    uint32_t type_id;                       /* opaque (enum moe_qtype) */
    uint32_t n_dims;                        /* 0..4 */
    uint64_t shape[MOE_BUNDLE_MAX_DIMS];    /* outermost first; unused dims 0 */
    uint64_t offset;                        /* file offset, multiple of 4096 */
    uint64_t size;                          /* bytes */
    uint64_t checksum;                      /* XXH3-64 of the bytes */
    const void *data;                       /* into the map (not checksummed at open) */
};

/* One expert blob (moe_bundle_expert). Pointers are owned by the bundle. */
struct moe_bundle_blob {
    uint32_t layer, expert, precision;
    const struct moe_bundle_precision *desc; /* parts and their offsets in the raw blob */
    const void *stored;   /* stored bytes in the map (compressed if compression != NONE) */
    uint64_t offset;      /* file offset of the stored bytes, multiple of 4096 (O_DIRECT) */
    uint64_t stored_size; /* bytes on disk */
    uint64_t raw_size;    /* == desc->raw_size */
    uint32_t compression; /* enum moe_bundle_compression */
    uint64_t checksum;    /* XXH3-64 of the raw (decompressed) bytes */
    uint64_t stored_checksum; /* XXH3-64 of the stored bytes (== checksum when uncompressed) */
};

/* Facts about the file, for `inspect`. */
struct moe_bundle_info {
    uint16_t version_major, version_minor;
    uint64_t file_size;
    uint64_t dir_offset, dir_size;  /* the data region is [4096, dir_offset) */
    uint64_t data_bytes;            /* bytes of tensors and stored blobs (no padding) */
    uint64_t raw_blob_bytes;        /* sum of raw sizes of present blobs */
    char tuning_slot;               /* 'A' or 'B' */
    uint64_t tuning_sequence;
    uint64_t tuning_offset, tuning_size; /* 0, 0 = no tuning payload */
    uint64_t reclaimable_bytes;     /* stale tuning payloads and orphaned tail bytes */
};

/* moe_bundle_open: maps path read-only and validates header, directory and
 * tuning slots (docs/format.md lists every check). Blob and tensor checksums
 * are not computed here (see _verify and _load). MOE_ERR_UNSUPPORTED for a
 * newer major version. The handle keeps one descriptor of the mapped file
 * open (O_CLOEXEC) and notes its size, modification time and header page for
 * moe_bundle_check_file; a file replaced or resized between the map and that
 * open is MOE_ERR_IO (logged). The file must not be truncated or rewritten
 * while open: a read of the mapping past a truncated end raises SIGBUS, and
 * rewritten bytes are read as they are now; moe_bundle_check_file notices
 * both after the fact (moe_bundle_replace_tuning is safe: it only appends). */
enum moe_status moe_bundle_open(const char *path, struct moe_bundle **out);

/* moe_bundle_open_memory: the same checks on a caller's buffer, which must
 * outlive the handle (tests and the fuzz target). label names it in messages. */
enum moe_status moe_bundle_open_memory(const void *buf, size_t len, const char *label,
                                       struct moe_bundle **out);

/* moe_bundle_free: unmaps and frees; NULL is a no-op. */
void moe_bundle_free(struct moe_bundle *b);

/* moe_bundle_open_fd: open the bundle's file again, read-only, for readers
 * that bypass the mapping (the expert store's pread / O_DIRECT loads); the
 * caller closes *fd (O_CLOEXEC, blocking mode). Never blocks: the path must
 * still name the very file that was mapped (same device, inode and size), so a
 * FIFO, directory or other file put in its place since is refused (MOE_ERR_IO,
 * logged). A bundle opened from memory has no file: MOE_ERR_UNSUPPORTED, not
 * logged. */
enum moe_status moe_bundle_open_fd(const struct moe_bundle *b, int *fd);

/* moe_bundle_check_file: whether the file the bundle was opened from still
 * holds the bytes that were mapped, for readers that keep using them (a
 * running model checks every N tokens and before every expert read). Cost:
 * one fstat of the kept descriptor (the mapped file itself, whatever its path
 * names now) and one stat of the path; only when size or modification time
 * (ns) differ from the last accepted state is the header page read (one
 * 4096-byte pread) to tell changes no reader sees from the others:
 *   - accepted (MOE_OK, an info message once; the new size and time become
 *     the reference): a tuning replacement (moe_bundle_replace_tuning: only
 *     the tuning slots and bytes past the directory change), or bytes
 *     appended or dropped past the end of the directory;
 *   - MOE_ERR_IO, logged once as "PATH: changed while the model was running
 *     (size X -> Y bytes; WHY); restart": the file ends before the end of the
 *     directory (truncated: reads of the mapping past the end raise SIGBUS),
 *     the header page outside the tuning slots differs, or the size and the
 *     slots are as they were but the time moved (bytes written in place).
 *     Sticky: every later call returns MOE_ERR_IO without logging again.
 * A path that now names another file, or none (renamed over, removed), is
 * not an error: the mapping and the descriptor still hold the opened file; a
 * warning is logged once. Not seen: a writer that puts back size and time
 * (cp -p of a same-size file), a write within the file system's timestamp
 * granularity of the last accepted state, or bytes written inside the data
 * together with a size change that leaves the header page alone (dd from
 * inside the data past the end). Always MOE_OK for a bundle opened from
 * memory. Thread-safe. */
enum moe_status moe_bundle_check_file(const struct moe_bundle *b);

/* moe_bundle_path: the path (or label) given at open; owned by the bundle. */
const char *moe_bundle_path(const struct moe_bundle *b);

/* moe_bundle_get_info: sizes, version and tuning state. */
void moe_bundle_get_info(const struct moe_bundle *b, struct moe_bundle_info *out);

/* Metadata: the whole set (borrowed, valid until moe_bundle_free; iterate it
 * with moe_bundle_kv_count/at), and typed getters as moe_bundle_kv_*. */
const struct moe_bundle_kv *moe_bundle_meta(const struct moe_bundle *b);
const char *moe_bundle_meta_str(const struct moe_bundle *b, const char *key);
enum moe_status moe_bundle_meta_i64(const struct moe_bundle *b, const char *key, int64_t *out);
enum moe_status moe_bundle_meta_f64(const struct moe_bundle *b, const char *key, double *out);
enum moe_status moe_bundle_meta_bool(const struct moe_bundle *b, const char *key, bool *out);
const void *moe_bundle_meta_bytes(const struct moe_bundle *b, const char *key, size_t *n);
const int64_t *moe_bundle_meta_i64_array(const struct moe_bundle *b, const char *key, size_t *n);
const double *moe_bundle_meta_f64_array(const struct moe_bundle *b, const char *key, size_t *n);
const char *const *moe_bundle_meta_str_array(const struct moe_bundle *b, const char *key,
                                             size_t *n);

/* Tensors: count, i-th in directory order (NULL past the end), lookup by name
 * (NULL if absent; binary search). */
size_t moe_bundle_tensor_count(const struct moe_bundle *b);
const struct moe_bundle_tensor *moe_bundle_tensor_at(const struct moe_bundle *b, size_t i);
const struct moe_bundle_tensor *moe_bundle_find_tensor(const struct moe_bundle *b,
                                                       const char *name);

/* moe_bundle_tensor_verify: recomputes the checksum of t's bytes;
 * MOE_ERR_FORMAT (logged, naming the tensor) on a mismatch. */
enum moe_status moe_bundle_tensor_verify(const struct moe_bundle *b,
                                         const struct moe_bundle_tensor *t);

/* moe_bundle_tensor_load: copies t's bytes into dst (dst_size >= t->size,
 * else MOE_ERR_RANGE; no alignment needed) through the kept descriptor, not
 * the mapping (a truncated file is MOE_ERR_IO, never SIGBUS; from memory:
 * copied from the buffer), and checks the copy's checksum (MOE_ERR_FORMAT).
 * Errors are logged naming the tensor. For owners of an in-memory copy of the
 * non-expert weights (moe_model_params.copy_dense). */
enum moe_status moe_bundle_tensor_load(const struct moe_bundle *b, const struct moe_bundle_tensor *t, void *dst,
                                       size_t dst_size);

/* Expert layout: counts (all 0 when the bundle has no experts), whether a layer
 * has experts (false for dense layers and out-of-range layers), the precision
 * descriptors (NULL past the end) and lookup by name (MOE_ERR_NOT_FOUND). */
void moe_bundle_expert_layout(const struct moe_bundle *b, uint32_t *n_layers, uint32_t *n_experts,
                              uint32_t *n_precisions);
bool moe_bundle_layer_has_experts(const struct moe_bundle *b, uint32_t layer);
const struct moe_bundle_precision *moe_bundle_precision_at(const struct moe_bundle *b, uint32_t i);
enum moe_status moe_bundle_find_precision(const struct moe_bundle *b, const char *name,
                                          uint32_t *index);

/* moe_bundle_expert: where the blob of (layer, expert, precision) is, without
 * reading it. MOE_ERR_RANGE for indices out of range, MOE_ERR_NOT_FOUND for a
 * dense layer (both logged). */
enum moe_status moe_bundle_expert(const struct moe_bundle *b, uint32_t layer, uint32_t expert,
                                  uint32_t precision, struct moe_bundle_blob *out);

/* moe_bundle_expert_load: copies (or decompresses) the raw blob into dst
 * (dst_size >= raw_size, else MOE_ERR_RANGE) and checks its checksum;
 * MOE_ERR_FORMAT with "layer L expert E precision P: checksum mismatch" (or
 * the zstd problem) when the bytes are damaged. dst need no alignment. */
enum moe_status moe_bundle_expert_load(const struct moe_bundle *b, uint32_t layer, uint32_t expert,
                                       uint32_t precision, void *dst, size_t dst_size);

/* moe_bundle_blob_decode: as _load, but from a copy of the stored bytes that
 * the caller read itself (e.g. with O_DIRECT into pinned staging memory at
 * blob->offset); `stored` holds blob->stored_size bytes. */
enum moe_status moe_bundle_blob_decode(const struct moe_bundle *b,
                                       const struct moe_bundle_blob *blob, const void *stored,
                                       void *dst, size_t dst_size);

/* moe_bundle_expert_verify: checks one blob's checksum without a destination
 * buffer (zstd blobs are decompressed in 64 KiB pieces). MOE_ERR_FORMAT
 * (logged, naming the expert) when damaged. */
enum moe_status moe_bundle_expert_verify(const struct moe_bundle *b, uint32_t layer,
                                         uint32_t expert, uint32_t precision);

/* Tuning: the active payload (highest-sequence valid slot) decoded at open;
 * never NULL (empty when the bundle has none). Borrowed until moe_bundle_free:
 * later replacements are seen only by reopening. */
const struct moe_bundle_kv *moe_bundle_tuning(const struct moe_bundle *b);

/* moe_bundle_verify_all: recomputes every checksum (header, directory, active
 * tuning payload, every tensor, every blob) and calls fn(item, problem, user)
 * once per bad item, e.g. ("layer 3 expert 17 precision q4_k", "checksum
 * mismatch"); fn NULL = log each one. Returns MOE_OK when all are good, else
 * MOE_ERR_FORMAT. Also reports a newer tuning slot that open had to skip. */
typedef void (*moe_bundle_failure_fn)(const char *item, const char *problem, void *user);
enum moe_status moe_bundle_verify_all(const struct moe_bundle *b, moe_bundle_failure_fn fn,
                                      void *user);

/* moe_bundle_replace_tuning: crash-safe replacement of the tuning payload of the
 * bundle at path (opened O_RDWR, not mapped; an exclusive flock serialises
 * concurrent replacers). Appends the encoded payload at the end of the file
 * (first dropping orphaned bytes a crashed earlier replacement left past every
 * referenced region), fsyncs, then writes the inactive slot with sequence + 1
 * and fsyncs. A crash at any point leaves the old tuning or the new one.
 * Readers already open keep the tuning they read. tuning NULL or empty clears
 * the tuning. The old payload stays in the file (reclaimable_bytes). */
enum moe_status moe_bundle_replace_tuning(const char *path, const struct moe_bundle_kv *tuning);

#ifdef __cplusplus
}
#endif
#endif

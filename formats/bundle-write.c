/*
 * bundle-write.c - the writer of the bundle container (.moeb): data goes to a
 * temp file next to the final path (tensors and expert blobs may be added from
 * any thread), and moe_bundle_writer_finish writes the directory and the header
 * and renames the file into place. docs/format.md is the byte-exact
 * specification; formats/moe-bundle.h is the manual of the API.
 */
#define _GNU_SOURCE
#include "bundle-impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "moe-file.h"

/* ------------------------------------------------------------------------- */
/* writer                                                                     */

enum { W_OPEN, W_FINISHED, W_FAILED };

struct wtensor {
    char *name;
    uint32_t type_id, n_dims;
    uint64_t shape[MOE_BUNDLE_MAX_DIMS];
    uint64_t offset, size, checksum;
};

struct moe_bundle_writer {
    char *final_path, *tmp_path;
    int fd;
    int dfd;             /* the temp file again with O_DIRECT for large writes; -1: none */
    int direct_off;      /* set (atomically) when a direct write failed: buffered from then on */
    int state;
    pthread_mutex_t mu;  /* guards cursor, state, tensors and entries during adds */
    uint64_t cursor;     /* next free 4096-aligned offset of the data region */
    struct moe_bundle_kv *meta, *tuning;
    struct wtensor *tensors;
    size_t n_tensors, cap_tensors;
    uint32_t n_layers, n_experts, n_precisions;
    struct moe_bundle_precision *precisions;
    uint8_t *layer_has;
    struct bundle_entry *entries;
};

/* Returns MOE_OK if the writer can take calls, else logs and returns why not. */
static enum moe_status w_usable(const struct moe_bundle_writer *w, int state) {
    if (state == W_FAILED) {
        MOE_LOGE("%s: the writer failed earlier (I/O error); abort it", w->final_path);
        return MOE_ERR_IO;
    }
    if (state == W_FINISHED) {
        MOE_LOGE("%s: the writer is already finished", w->final_path);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* Creates the temp file next to final_path. */
enum moe_status moe_bundle_writer_open(const char *final_path, struct moe_bundle_writer **out) {
    enum moe_status rc = MOE_ERR_NOMEM;
    if (!out) return MOE_ERR_INVALID;
    *out = NULL;
    if (!final_path || !final_path[0]) {
        MOE_LOGE("empty output path");
        return MOE_ERR_INVALID;
    }
    /* the output rule (moe-file.h): a bundle is written at offsets and renamed,
     * so it needs a regular file; a symlink to one keeps the link */
    if (moe_output_check(final_path, 0) != MOE_OK) return MOE_ERR_INVALID;
    char *resolved = NULL;
    if (moe_output_resolve(final_path, &resolved) != MOE_OK) return MOE_ERR_INVALID;
    if (resolved) final_path = resolved;
    moe_tmp_sweep(final_path);
    struct moe_bundle_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(final_path);
    if (!w) {
        MOE_LOGE("%s: out of memory", final_path);
        free(resolved);
        return MOE_ERR_NOMEM;
    }
    w->fd = -1;
    w->dfd = -1;
    if (pthread_mutex_init(&w->mu, NULL) != 0) {
        free(w);
        goto nomem;
    }
    w->final_path = bundle_dupn(final_path, n);
    w->tmp_path = malloc(n + 32);
    if (!w->final_path || !w->tmp_path || moe_bundle_kv_new(&w->meta) != MOE_OK) goto fail_nomem;
    snprintf(w->tmp_path, n + 32, "%s.tmp.%ld", final_path, (long)getpid());
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int err = errno;
        MOE_LOGE("%s: cannot create the temp file: %s%s", w->tmp_path, strerror(err),
                 err == EEXIST ? " (another writer of the same path in this process, or a stale "
                                 "file from a crashed run: delete it)"
                               : "");
        rc = MOE_ERR_IO;
        goto fail;
    }
    moe_tmp_track(w->tmp_path); /* removed on a fatal signal (moe_file_cleanup_on_signals) */
    /* Large blobs bypass the page cache (see direct_write); a file system
     * without O_DIRECT just keeps every write buffered. */
    const char *env = getenv("MOE_BUNDLE_DIRECT");
    if (!(env && strcmp(env, "0") == 0)) w->dfd = open(w->tmp_path, O_WRONLY | O_CLOEXEC | O_DIRECT);
    w->cursor = PAGE;
    free(resolved);
    *out = w;
    return MOE_OK;
fail_nomem:
    MOE_LOGE("%s: out of memory", final_path);
fail:
    free(w->tmp_path);
    w->tmp_path = NULL; /* nothing was created: free must not unlink */
    moe_bundle_writer_free(w);
    free(resolved);
    return rc;
nomem:
    MOE_LOGE("%s: out of memory", final_path);
    free(resolved);
    return MOE_ERR_NOMEM;
}

/* Unlinks the temp file (unless finished) and frees. */
void moe_bundle_writer_abort(struct moe_bundle_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->dfd >= 0) close(w->dfd);
    w->fd = w->dfd = -1;
    if (w->state != W_FINISHED && w->tmp_path) unlink(w->tmp_path);
    moe_tmp_untrack(w->tmp_path);
    moe_bundle_kv_free(w->meta);
    moe_bundle_kv_free(w->tuning);
    for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->tensors);
    if (w->precisions)
        for (uint32_t i = 0; i < w->n_precisions; i++) free((char *)w->precisions[i].name);
    free(w->precisions);
    free(w->layer_has);
    free(w->entries);
    free(w->final_path);
    free(w->tmp_path);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* Frees the writer (aborting it when unfinished). */
void moe_bundle_writer_free(struct moe_bundle_writer *w) { moe_bundle_writer_abort(w); }

/* Metadata setters: the writer must be open (not failed or finished). */
#define META_SETTER(setter, ...)                                      \
    do {                                                                  \
        if (!w) return MOE_ERR_INVALID;                                   \
        enum moe_status rc_ = w_usable(w, w->state);                      \
        if (rc_ != MOE_OK) return rc_;                                    \
        return setter(w->meta, __VA_ARGS__);                              \
    } while (0)

enum moe_status moe_bundle_writer_set_meta_str(struct moe_bundle_writer *w, const char *key,
                                               const char *value) {
    META_SETTER(moe_bundle_kv_set_str, key, value);
}
enum moe_status moe_bundle_writer_set_meta_i64(struct moe_bundle_writer *w, const char *key,
                                               int64_t value) {
    META_SETTER(moe_bundle_kv_set_i64, key, value);
}
enum moe_status moe_bundle_writer_set_meta_f64(struct moe_bundle_writer *w, const char *key,
                                               double value) {
    META_SETTER(moe_bundle_kv_set_f64, key, value);
}
enum moe_status moe_bundle_writer_set_meta_bool(struct moe_bundle_writer *w, const char *key,
                                                bool value) {
    META_SETTER(moe_bundle_kv_set_bool, key, value);
}
enum moe_status moe_bundle_writer_set_meta_bytes(struct moe_bundle_writer *w, const char *key,
                                                 const void *data, size_t n) {
    META_SETTER(moe_bundle_kv_set_bytes, key, data, n);
}
enum moe_status moe_bundle_writer_set_meta_i64_array(struct moe_bundle_writer *w, const char *key,
                                                     const int64_t *v, size_t n) {
    META_SETTER(moe_bundle_kv_set_i64_array, key, v, n);
}
enum moe_status moe_bundle_writer_set_meta_f64_array(struct moe_bundle_writer *w, const char *key,
                                                     const double *v, size_t n) {
    META_SETTER(moe_bundle_kv_set_f64_array, key, v, n);
}
enum moe_status moe_bundle_writer_set_meta_str_array(struct moe_bundle_writer *w, const char *key,
                                                     const char *const *v, size_t n) {
    META_SETTER(moe_bundle_kv_set_str_array, key, v, n);
}

/* Reserves an aligned range of `size` bytes of the data region (under mu). */
static enum moe_status reserve_locked(struct moe_bundle_writer *w, uint64_t size, uint64_t *off) {
    uint64_t end = w->cursor + size;
    if (size > (uint64_t)INT64_MAX - w->cursor || align_up(end, PAGE) > (uint64_t)INT64_MAX) {
        MOE_LOGE("%s: file would exceed the largest file offset", w->tmp_path);
        return MOE_ERR_RANGE;
    }
    *off = w->cursor;
    w->cursor = align_up(end, PAGE);
    return MOE_OK;
}

/* Writes at least this many bytes with O_DIRECT (smaller ones are buffered). */
#define DIRECT_MIN (256u << 10)
/* Bytes per write from the aligned bounce buffer. */
#define DIRECT_CHUNK (4u << 20)

/*
 * Writes n bytes at off (a multiple of PAGE) through the O_DIRECT descriptor:
 * the data go from memory to the disk without a page-cache copy, which was
 * measured to cost more CPU than quantizing q8_0 (docs/benchmarks.md, issue
 * 18), and a large bundle does not push other files out of the cache. The
 * last partial page is padded with zeros: the cursor is page-aligned, so the
 * padding lies before the next reservation and reads as zeros either way.
 * Data not page-aligned in memory go through an aligned bounce buffer. 0 or
 * errno (the caller then writes the same range buffered).
 */
static int direct_write(int dfd, const void *data, uint64_t n, uint64_t off) {
    const uint8_t *p = data;
    const uint64_t body = n & ~(uint64_t)(PAGE - 1);
    const int aligned = ((uintptr_t)p & (PAGE - 1)) == 0;
    uint8_t *bounce = NULL;
    const size_t cap = !aligned && body > DIRECT_CHUNK ? DIRECT_CHUNK : !aligned ? (size_t)body : PAGE;
    if (posix_memalign((void **)&bounce, PAGE, cap > PAGE ? cap : PAGE) != 0) return ENOMEM;
    int err = 0;
    if (aligned) {
        err = bundle_pwrite_all(dfd, p, body, off);
    } else {
        for (uint64_t done = 0; !err && done < body; done += cap) {
            const size_t k = body - done < cap ? (size_t)(body - done) : cap;
            memcpy(bounce, p + done, k);
            err = bundle_pwrite_all(dfd, bounce, k, off + done);
        }
    }
    if (!err && n > body) {
        memset(bounce, 0, PAGE);
        memcpy(bounce, p + body, (size_t)(n - body));
        err = bundle_pwrite_all(dfd, bounce, PAGE, off + body);
    }
    free(bounce);
    return err;
}

/* Writes bytes reserved at off; on failure marks the writer failed. */
static enum moe_status write_reserved(struct moe_bundle_writer *w, const void *data, uint64_t n,
                                      uint64_t off, const char *what) {
    int err = 1;
    if (w->dfd >= 0 && n >= DIRECT_MIN && !__atomic_load_n(&w->direct_off, __ATOMIC_RELAXED) &&
        (err = direct_write(w->dfd, data, n, off)) != 0)
        __atomic_store_n(&w->direct_off, 1, __ATOMIC_RELAXED); /* e.g. stricter alignment: buffered */
    if (err) err = bundle_pwrite_all(w->fd, data, n, off);
    if (!err) return MOE_OK;
    pthread_mutex_lock(&w->mu);
    w->state = W_FAILED;
    pthread_mutex_unlock(&w->mu);
    MOE_LOGE("%s: writing %s (%llu bytes at offset %llu): %s", w->tmp_path, what,
             (unsigned long long)n, (unsigned long long)off, strerror(err));
    return MOE_ERR_IO;
}

/* Checks add_tensor's arguments (no lock needed: they are the caller's). */
static enum moe_status check_tensor_args(const struct moe_bundle_writer *w, const char *name,
                                         uint32_t n_dims, const uint64_t *shape, const void *data,
                                         size_t nbytes) {
    char nb[SHOW_CAP];
    if (!name || !bundle_name_ok((const uint8_t *)name, strlen(name), MOE_BUNDLE_MAX_NAME)) {
        MOE_LOGE("%s: tensor name %s: names are 1..%d bytes of UTF-8 without control characters",
                 w->final_path, name ? bundle_show(name, nb, sizeof nb) : "(NULL)", MOE_BUNDLE_MAX_NAME);
        return MOE_ERR_INVALID;
    }
    if (n_dims > MOE_BUNDLE_MAX_DIMS || (n_dims && !shape) || (nbytes && !data)) {
        MOE_LOGE("%s: tensor %s: n_dims %u > 4, or NULL shape or data", w->final_path,
                 bundle_show(name, nb, sizeof nb), n_dims);
        return MOE_ERR_INVALID;
    }
    uint64_t ne = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (shape[d] > INT64_MAX || (shape[d] && ne > INT64_MAX / shape[d])) {
            MOE_LOGE("%s: tensor %s: element count overflows 63 bits", w->final_path,
                     bundle_show(name, nb, sizeof nb));
            return MOE_ERR_INVALID;
        }
        ne *= shape[d];
    }
    return MOE_OK;
}

/* Writes one non-expert tensor. */
enum moe_status moe_bundle_writer_add_tensor(struct moe_bundle_writer *w, const char *name,
                                             uint32_t type_id, uint32_t n_dims,
                                             const uint64_t *shape, const void *data,
                                             size_t nbytes) {
    char nb[SHOW_CAP];
    enum moe_status rc;
    if (!w) return MOE_ERR_INVALID;
    if ((rc = check_tensor_args(w, name, n_dims, shape, data, nbytes)) != MOE_OK) return rc;
    struct wtensor t = {0};
    t.type_id = type_id;
    t.n_dims = n_dims;
    for (uint32_t d = 0; d < n_dims; d++) t.shape[d] = shape[d];
    t.size = nbytes;
    t.checksum = hash(data, nbytes);
    if (!(t.name = bundle_dupn(name, strlen(name)))) {
        MOE_LOGE("%s: out of memory", w->final_path);
        return MOE_ERR_NOMEM;
    }
    pthread_mutex_lock(&w->mu);
    rc = w_usable(w, w->state);
    for (size_t i = 0; rc == MOE_OK && i < w->n_tensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0) {
            MOE_LOGE("%s: duplicate tensor name %s", w->final_path, bundle_show(name, nb, sizeof nb));
            rc = MOE_ERR_INVALID;
        }
    }
    if (rc == MOE_OK && w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        struct wtensor *p = realloc(w->tensors, cap * sizeof *p);
        if (!p) {
            MOE_LOGE("%s: out of memory", w->final_path);
            rc = MOE_ERR_NOMEM;
        } else {
            w->tensors = p;
            w->cap_tensors = cap;
        }
    }
    if (rc == MOE_OK) rc = reserve_locked(w, nbytes, &t.offset);
    if (rc == MOE_OK) w->tensors[w->n_tensors++] = t;
    pthread_mutex_unlock(&w->mu);
    if (rc != MOE_OK) {
        free(t.name);
        return rc;
    }
    snprintf(nb, sizeof nb, "tensor %s", name);
    return write_reserved(w, data, nbytes, t.offset, nb);
}

/* Declares the expert table and copies the precision descriptors. */
enum moe_status moe_bundle_writer_set_expert_layout(struct moe_bundle_writer *w, uint32_t n_layers,
                                                    uint32_t n_experts, uint32_t n_precisions,
                                                    const struct moe_bundle_precision *precisions) {
    enum moe_status rc;
    if (!w) return MOE_ERR_INVALID;
    if ((rc = w_usable(w, w->state)) != MOE_OK) return rc;
    if (w->precisions) {
        MOE_LOGE("%s: the expert layout is already set", w->final_path);
        return MOE_ERR_INVALID;
    }
    if (!precisions || n_layers < 1 || n_experts < 1 || n_precisions < 1 ||
        n_layers > MAX_LAYERS || n_experts > MAX_EXPERTS ||
        n_precisions > MOE_BUNDLE_MAX_PRECISIONS) {
        MOE_LOGE("%s: expert layout %u layers x %u experts x %u precisions: each must be >= 1 "
                 "(at most %u, %u, %d)",
                 w->final_path, n_layers, n_experts, n_precisions, MAX_LAYERS, MAX_EXPERTS,
                 MOE_BUNDLE_MAX_PRECISIONS);
        return MOE_ERR_INVALID;
    }
    uint64_t count = (uint64_t)n_layers * n_experts * n_precisions;
    if (count > (MOE_BUNDLE_MAX_DIR - DIR_FIXED) / ENTRY_BYTES) {
        MOE_LOGE("%s: %llu expert entries would not fit in the directory", w->final_path,
                 (unsigned long long)count);
        return MOE_ERR_INVALID;
    }
    struct moe_bundle_precision *p = calloc(n_precisions, sizeof *p);
    uint8_t *has = malloc(n_layers);
    struct bundle_entry *ent = calloc((size_t)count, sizeof *ent);
    rc = (p && has && ent) ? MOE_OK : MOE_ERR_NOMEM;
    if (rc != MOE_OK) MOE_LOGE("%s: out of memory", w->final_path);
    for (uint32_t i = 0; rc == MOE_OK && i < n_precisions; i++) {
        p[i] = precisions[i];
        const char *name = precisions[i].name;
        const char *why = NULL;
        if (!name || !bundle_precision_name_ok((const uint8_t *)name, strlen(name)))
            why = "name is not 1..63 bytes of [A-Za-z0-9_.+-]";
        p[i].name = NULL;
        if (!why) why = bundle_layout_parts(&p[i]);
        for (uint32_t k = 0; !why && k < i; k++)
            if (strcmp(p[k].name, name) == 0) why = "duplicate name";
        if (why) {
            char nb[SHOW_CAP];
            MOE_LOGE("%s: precision %u (%s): %s", w->final_path, i,
                     name ? bundle_show(name, nb, sizeof nb) : "NULL", why);
            rc = MOE_ERR_INVALID;
        } else if (!(p[i].name = bundle_dupn(name, strlen(name)))) {
            MOE_LOGE("%s: out of memory", w->final_path);
            rc = MOE_ERR_NOMEM;
        }
    }
    if (rc != MOE_OK) {
        if (p)
            for (uint32_t i = 0; i < n_precisions; i++) free((char *)p[i].name);
        free(p);
        free(has);
        free(ent);
        return rc;
    }
    memset(has, 1, n_layers);
    w->precisions = p;
    w->layer_has = has;
    w->entries = ent;
    w->n_layers = n_layers;
    w->n_experts = n_experts;
    w->n_precisions = n_precisions;
    return MOE_OK;
}

/* Index of (l, e, p) in the writer's entry table. */
static size_t w_index(const struct moe_bundle_writer *w, uint32_t l, uint32_t e, uint32_t p) {
    return ((size_t)l * w->n_experts + e) * w->n_precisions + p;
}

/* Marks a layer dense or MoE. */
enum moe_status moe_bundle_writer_set_layer_has_experts(struct moe_bundle_writer *w,
                                                        uint32_t layer, bool has_experts) {
    enum moe_status rc;
    if (!w) return MOE_ERR_INVALID;
    if ((rc = w_usable(w, w->state)) != MOE_OK) return rc;
    if (!w->precisions || layer >= w->n_layers) {
        MOE_LOGE("%s: layer %u: set the expert layout first (layers: %u)", w->final_path, layer,
                 w->n_layers);
        return w->precisions ? MOE_ERR_RANGE : MOE_ERR_INVALID;
    }
    for (uint32_t e = 0; e < w->n_experts; e++)
        for (uint32_t p = 0; p < w->n_precisions; p++)
            if (w->entries[w_index(w, layer, e, p)].flags) {
                MOE_LOGE("%s: layer %u already has blobs; cannot change whether it has experts",
                         w->final_path, layer);
                return MOE_ERR_INVALID;
            }
    w->layer_has[layer] = has_experts;
    return MOE_OK;
}

/* Compresses raw with zstd at level; returns a malloc'd buffer and its size
 * when that saves at least MOE_BUNDLE_MIN_SAVING_PCT percent, else NULL. */
static void *try_compress(const void *raw, size_t n, int level, size_t *out_n, bool *nomem) {
    size_t bound = ZSTD_compressBound(n);
    void *buf = malloc(bound);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    *nomem = !buf || !cc;
    if (*nomem) goto drop;
    ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 1);
    size_t got = ZSTD_compress2(cc, buf, bound, raw, n);
    if (ZSTD_isError(got)) goto drop; /* store raw: always correct */
    uint64_t q = n / 100, rem = n % 100;
    uint64_t need_saving = q * MOE_BUNDLE_MIN_SAVING_PCT + (rem * MOE_BUNDLE_MIN_SAVING_PCT + 99) / 100;
    if (got >= n || n - got < need_saving || n - got == 0) goto drop;
    ZSTD_freeCCtx(cc);
    *out_n = got;
    return buf;
drop:
    ZSTD_freeCCtx(cc);
    free(buf);
    return NULL;
}

/* Checks add_expert's arguments against the layout. */
static enum moe_status check_expert_args(const struct moe_bundle_writer *w, uint32_t layer,
                                         uint32_t expert, uint32_t precision, const void *raw,
                                         size_t raw_size, int zstd_level) {
    if (!w->precisions) {
        MOE_LOGE("%s: set the expert layout before adding experts", w->final_path);
        return MOE_ERR_INVALID;
    }
    if (layer >= w->n_layers || expert >= w->n_experts || precision >= w->n_precisions) {
        MOE_LOGE("%s: layer %u expert %u precision %u is out of range (%u x %u x %u)",
                 w->final_path, layer, expert, precision, w->n_layers, w->n_experts,
                 w->n_precisions);
        return MOE_ERR_RANGE;
    }
    const struct moe_bundle_precision *p = &w->precisions[precision];
    if (!w->layer_has[layer]) {
        MOE_LOGE("%s: layer %u expert %u precision %s: the layer is marked dense", w->final_path,
                 layer, expert, p->name);
        return MOE_ERR_INVALID;
    }
    if (!raw || raw_size != p->raw_size) {
        MOE_LOGE("%s: layer %u expert %u precision %s: %zu bytes given, the precision's parts "
                 "lay out %llu",
                 w->final_path, layer, expert, p->name, raw ? raw_size : 0,
                 (unsigned long long)p->raw_size);
        return MOE_ERR_INVALID;
    }
    if (zstd_level < 0 || zstd_level > ZSTD_maxCLevel()) {
        MOE_LOGE("%s: zstd level %d is outside 0..%d", w->final_path, zstd_level, ZSTD_maxCLevel());
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* Writes one expert blob (thread-safe against itself and add_tensor). */
enum moe_status moe_bundle_writer_add_expert(struct moe_bundle_writer *w, uint32_t layer,
                                             uint32_t expert, uint32_t precision, const void *raw,
                                             size_t raw_size, int zstd_level) {
    enum moe_status rc;
    char bn[SHOW_CAP];
    if (!w) return MOE_ERR_INVALID;
    if ((rc = check_expert_args(w, layer, expert, precision, raw, raw_size, zstd_level)) != MOE_OK)
        return rc;
    const char *pname = w->precisions[precision].name;
    struct bundle_entry x = {0};
    x.raw = raw_size;
    x.checksum = hash(raw, raw_size);
    x.stored_checksum = x.checksum;
    x.flags = ENTRY_PRESENT;
    void *packed = NULL;
    size_t packed_n = 0;
    bool nomem = false;
    if (zstd_level > 0) packed = try_compress(raw, raw_size, zstd_level, &packed_n, &nomem);
    if (nomem) {
        MOE_LOGE("%s: out of memory compressing layer %u expert %u precision %s", w->final_path,
                 layer, expert, pname);
        return MOE_ERR_NOMEM;
    }
    x.compression = packed ? MOE_BUNDLE_COMP_ZSTD : MOE_BUNDLE_COMP_NONE;
    if (packed) x.stored_checksum = hash(packed, packed_n);
    x.stored = packed ? packed_n : raw_size;
    size_t at = w_index(w, layer, expert, precision);
    pthread_mutex_lock(&w->mu);
    rc = w_usable(w, w->state);
    if (rc == MOE_OK && w->entries[at].flags) {
        MOE_LOGE("%s: layer %u expert %u precision %s was already added", w->final_path, layer,
                 expert, pname);
        rc = MOE_ERR_INVALID;
    }
    if (rc == MOE_OK) rc = reserve_locked(w, x.stored, &x.offset);
    if (rc == MOE_OK) w->entries[at] = x;
    pthread_mutex_unlock(&w->mu);
    if (rc == MOE_OK) {
        snprintf(bn, sizeof bn, "layer %u expert %u precision %s", layer, expert, pname);
        rc = write_reserved(w, packed ? packed : raw, x.stored, x.offset, bn);
    }
    free(packed);
    return rc;
}

/* Copies the initial tuning set. */
enum moe_status moe_bundle_writer_set_tuning(struct moe_bundle_writer *w,
                                             const struct moe_bundle_kv *tuning) {
    enum moe_status rc;
    struct wbuf b = {0};
    struct moe_bundle_kv *copy = NULL;
    if (!w) return MOE_ERR_INVALID;
    if ((rc = w_usable(w, w->state)) != MOE_OK) return rc;
    bundle_kv_encode(tuning, &b); /* a round trip through the codec is the deep copy */
    if (b.oom) {
        rc = MOE_ERR_NOMEM;
        MOE_LOGE("%s: out of memory", w->final_path);
    } else {
        rc = bundle_kv_decode(b.p, b.n, 0, w->final_path, "tuning", &copy);
    }
    free(b.p);
    if (rc != MOE_OK) return rc;
    moe_bundle_kv_free(w->tuning);
    w->tuning = copy;
    return MOE_OK;
}

/* Finds the first blob of an MoE layer never added; false if none. */
static bool first_missing(const struct moe_bundle_writer *w, uint32_t *l, uint32_t *e,
                          uint32_t *p, uint64_t *n_missing) {
    bool any = false;
    *n_missing = 0;
    for (uint32_t a = 0; a < w->n_layers; a++) {
        if (!w->layer_has[a]) continue;
        for (uint32_t b = 0; b < w->n_experts; b++)
            for (uint32_t c = 0; c < w->n_precisions; c++)
                if (!w->entries[w_index(w, a, b, c)].flags) {
                    if (!any) *l = a, *e = b, *p = c;
                    any = true;
                    (*n_missing)++;
                }
    }
    return any;
}

/* Encodes the directory (docs/format.md, "Directory"). */
static void encode_directory(const struct moe_bundle_writer *w, struct wbuf *d) {
    struct wbuf m = {0};
    bundle_kv_encode(w->meta, &m);
    uint64_t t_size = 8, x_size = EXPERT_FIXED;
    for (size_t i = 0; i < w->n_tensors; i++) t_size += TENSOR_FIXED + strlen(w->tensors[i].name);
    for (uint32_t i = 0; i < w->n_precisions; i++)
        x_size += PRECISION_FIXED + w->precisions[i].n_parts * PART_BYTES +
                  strlen(w->precisions[i].name);
    x_size += (uint64_t)w->n_layers * w->n_experts * w->n_precisions * ENTRY_BYTES;
    bundle_wb_put(d, DIR_MAGIC, 8);
    wb_u64(d, m.n);
    wb_u64(d, t_size);
    wb_u64(d, x_size);
    bundle_wb_put(d, m.p, m.n);
    d->oom |= m.oom;
    free(m.p);
    wb_u64(d, w->n_tensors);
    for (size_t i = 0; i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        wb_u32(d, (uint32_t)strlen(t->name));
        wb_u32(d, t->type_id);
        wb_u32(d, t->n_dims);
        wb_u32(d, 0);
        for (int k = 0; k < MOE_BUNDLE_MAX_DIMS; k++) wb_u64(d, t->shape[k]);
        wb_u64(d, t->offset);
        wb_u64(d, t->size);
        wb_u64(d, t->checksum);
        bundle_wb_put(d, t->name, strlen(t->name));
    }
    wb_u32(d, w->n_layers);
    wb_u32(d, w->n_experts);
    wb_u32(d, w->n_precisions);
    wb_u32(d, 0);
    for (uint32_t i = 0; i < w->n_precisions; i++) {
        const struct moe_bundle_precision *p = &w->precisions[i];
        wb_u32(d, (uint32_t)strlen(p->name));
        wb_u32(d, p->n_parts);
        for (uint32_t k = 0; k < p->n_parts; k++) {
            wb_u32(d, p->parts[k].type_id);
            wb_u32(d, 0);
            wb_u64(d, p->parts[k].rows);
            wb_u64(d, p->parts[k].cols);
            wb_u64(d, p->parts[k].nbytes);
        }
        bundle_wb_put(d, p->name, strlen(p->name));
    }
    size_t n_entries = (size_t)w->n_layers * w->n_experts * w->n_precisions;
    for (size_t i = 0; i < n_entries; i++) {
        const struct bundle_entry *x = &w->entries[i];
        wb_u64(d, x->offset);
        wb_u64(d, x->stored);
        wb_u64(d, x->raw);
        wb_u64(d, x->checksum);
        wb_u64(d, x->stored_checksum);
        wb_u32(d, x->compression);
        wb_u32(d, x->flags);
    }
}

/* Writes directory, tuning and header page, then commits the file. */
enum moe_status moe_bundle_writer_finish(struct moe_bundle_writer *w) {
    enum moe_status rc;
    uint32_t l = 0, e = 0, p = 0;
    uint64_t missing;
    struct wbuf d = {0}, t = {0};
    uint8_t *page = NULL;
    if (!w) return MOE_ERR_INVALID;
    if ((rc = w_usable(w, w->state)) != MOE_OK) return rc;
    if (w->precisions && first_missing(w, &l, &e, &p, &missing)) {
        MOE_LOGE("%s: layer %u expert %u precision %s was never added (%llu blobs missing); "
                 "nothing was written to the final path",
                 w->final_path, l, e, w->precisions[p].name, (unsigned long long)missing);
        return MOE_ERR_INVALID;
    }
    encode_directory(w, &d);
    if (moe_bundle_kv_count(w->tuning)) bundle_kv_encode(w->tuning, &t);
    page = calloc(1, PAGE);
    if (d.oom || t.oom || !page) {
        MOE_LOGE("%s: out of memory", w->final_path);
        rc = MOE_ERR_NOMEM;
        goto done;
    }
    if (d.n > MOE_BUNDLE_MAX_DIR || t.n > MOE_BUNDLE_MAX_TUNING) {
        MOE_LOGE("%s: directory (%zu bytes) or tuning payload (%zu bytes) exceeds the format's "
                 "limit (%llu / %llu)",
                 w->final_path, d.n, t.n, MOE_BUNDLE_MAX_DIR, MOE_BUNDLE_MAX_TUNING);
        rc = MOE_ERR_RANGE;
        goto done;
    }
    uint64_t dir_off = w->cursor, t_off = t.n ? align_up(dir_off + d.n, PAGE) : 0;
    bundle_header_build(page, dir_off, d.n, hash(d.p, d.n));
    bundle_slot_build(page + slot_offset[0], 1, t_off, t.n, hash(t.p, t.n));
    if ((rc = write_reserved(w, d.p, d.n, dir_off, "the directory")) != MOE_OK) goto done;
    if (t.n && (rc = write_reserved(w, t.p, t.n, t_off, "the tuning payload")) != MOE_OK) goto done;
    if ((rc = write_reserved(w, page, PAGE, 0, "the header page")) != MOE_OK) goto done;
    int err = fsync(w->fd) != 0 ? errno : 0;
    if (!err && close(w->fd) != 0) err = errno;
    w->fd = -1;
    if (!err && rename(w->tmp_path, w->final_path) != 0) err = errno;
    if (!err) moe_tmp_untrack(w->tmp_path);
    if (err) {
        MOE_LOGE("%s: committing the bundle (fsync, close, rename to %s): %s", w->tmp_path,
                 w->final_path, strerror(err));
        w->state = W_FAILED;
        rc = MOE_ERR_IO;
        goto done;
    }
    w->state = W_FINISHED;
    if ((err = moe_fsync_parent(w->final_path)) != 0) {
        MOE_LOGE("%s: written, but syncing its directory failed (%s): the rename may not survive "
                 "a power loss",
                 w->final_path, strerror(err));
        rc = MOE_ERR_IO;
    }
done:
    free(d.p);
    free(t.p);
    free(page);
    return rc;
}

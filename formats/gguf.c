/*
 * gguf.c - zero-copy, strictly validated reader for GGUF files.
 *
 * File layout (ggml's docs/gguf.md; all integers little-endian):
 *   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x      { string key | u32 type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
 *   padding to `alignment` | data section (tensor data at the given offsets)
 * where a string is u64 length + bytes (no NUL), and an array value is
 * u32 element type | u64 count | elements. `alignment` is the u32 value of
 * general.alignment, else 32.
 *
 * Checks made on every file (each failure is logged once as
 * "<func>: <file or label>: <problem>", with the byte offset where it helps,
 * and returned as an error, never a crash):
 *   - the magic is "GGUF"; the version is 2 or 3 (1 used 32-bit counts:
 *     MOE_ERR_UNSUPPORTED; a byte-swapped 2 or 3 is a big-endian file:
 *     MOE_ERR_UNSUPPORTED; anything else MOE_ERR_FORMAT);
 *   - n_kv and n_tensors are at most what the rest of the file could hold
 *     (14 and 33 bytes per item at the least), so no count allocates more
 *     than the file's size justifies;
 *   - every string length lies within the file; keys and tensor names are
 *     non-empty, strict UTF-8 (no overlongs, surrogates or code points above
 *     U+10FFFF) without NUL or other control bytes, keys are unique, tensor
 *     names are unique and at most MOE_GGUF_MAX_NAME bytes (ggml's limit);
 *   - every value type is a known GGUF type; arrays of arrays are refused;
 *     an array's count times its element size lies within the file (strings:
 *     at least 8 bytes each); bools are 0 or 1;
 *   - general.alignment, if present, is a u32 power of two;
 *   - a tensor has 1..4 dims, each in [0, 2^62), the product of the non-zero
 *     ones fits an int64, its type is one this reader supports (others are named:
 *     "q5_0 (ggml type 6)"), ne[0] is a multiple of the type's block size,
 *     and its byte size fits in 64 bits;
 *   - tensor offsets are multiples of the alignment, and [offset, offset +
 *     nbytes) lies inside the data section, which starts at the first
 *     multiple of the alignment after the tensor infos;
 *   - no two tensors' bytes overlap. Gaps (padding) between tensors and
 *     bytes after the last one are allowed, as ggml allows them.
 * String values (as opposed to keys and names) are not required to be UTF-8:
 * the consumer checks what it uses (the tokenizer import checks tokens).
 *
 * Thread-safety: lookups on an open handle are safe; opening is re-entrant.
 * Ownership: see moe-gguf.h.
 */
#include "moe-gguf.h"
#include "moe-base.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe-file.h"
#include "moe-mmap.h"

#define GGUF_MAGIC "GGUF"
#define MIN_KV_BYTES 14     /* u64 key length + 1 byte + u32 type + 1 byte value */
#define MIN_TENSOR_BYTES 33 /* u64 name length + 1 + u32 n_dims + u64 ne + u32 type + u64 offset */
#define DIM_LIMIT (1ll << 62)

struct moe_gguf {
    struct moe_mmap map; /* zeroed for in-memory images */
    char *path;          /* file path or label */
    uint32_t version, alignment;
    uint64_t data_offset;
    struct moe_gguf_kv *kv;
    size_t n_kv;
    struct moe_gguf_tensor *tensors;
    size_t n_tensors;
    const struct moe_gguf_kv **kv_by_key;          /* sorted by key */
    const struct moe_gguf_tensor **tensor_by_name; /* sorted by name */
};

/* The parse position in the image. */
struct cursor {
    const uint8_t *base;
    size_t size, off;
    const char *label;
};

/* ------------------------------------------------------------------------- */
/* type tables                                                                */

/* Sizes in bytes of the scalar value types (0 for string and array). */
static const uint8_t k_type_size[MOE_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static const char *const k_type_names[MOE_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};

/* The GGUF spelling of a value type, "?" when out of range. */
const char *moe_gguf_type_name(enum moe_gguf_type t) {
    return (unsigned)t < MOE_GGUF_TYPE_COUNT ? k_type_names[t] : "?";
}

/* ggml's type names by id, so refusals can name what they refuse. */
static const char *const k_ggml_names[] = {
    "f32",     "f16",    "q4_0",    "q4_1",   "q4_2",   "q4_3",   "q5_0",      "q5_1",      "q8_0",
    "q8_1",    "q2_k",   "q3_k",    "q4_k",   "q5_k",   "q6_k",   "q8_k",      "iq2_xxs",   "iq2_xs",
    "iq3_xxs", "iq1_s",  "iq4_nl",  "iq3_s",  "iq2_s",  "iq4_xs", "i8",        "i16",       "i32",
    "i64",     "f64",    "iq1_m",   "bf16",   "q4_0_4_4", "q4_0_4_8", "q4_0_8_8", "tq1_0", "tq2_0",
    "iq4_nl_4_4", "iq4_nl_4_8", "iq4_nl_8_8", "mxfp4", "nvfp4", "q1_0", "q2_0"};

/* ggml's name of a tensor type id, NULL for ids never used. */
const char *moe_gguf_ggml_type_name(uint32_t id) {
    return id < sizeof k_ggml_names / sizeof k_ggml_names[0] ? k_ggml_names[id] : NULL;
}

/* The tensor types this reader hands out (see moe-gguf.h). */
static int type_supported(uint32_t id) {
    switch (id) {
    case MOE_QTYPE_F32: case MOE_QTYPE_F16: case MOE_QTYPE_BF16: case MOE_QTYPE_Q8_0: case MOE_QTYPE_Q4_0:
    case MOE_QTYPE_Q2_K: case MOE_QTYPE_Q3_K: case MOE_QTYPE_Q4_K: case MOE_QTYPE_Q5_K: case MOE_QTYPE_Q6_K:
    case MOE_QTYPE_MXFP4:
        return 1;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------------- */
/* small helpers                                                              */

/* Copies an untrusted name into buf for a log message: control bytes become
 * '?', long names are cut and marked with "...". */
static const char *show(const char *s, size_t n, char *buf, size_t cap) {
    size_t keep = n < cap - 4 ? n : cap - 4;
    for (size_t i = 0; i < keep; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    memcpy(buf + keep, keep < n ? "..." : "", keep < n ? 4 : 1);
    return buf;
}
#define SHOW_CAP 96

/* Little-endian u32 from possibly unaligned bytes. */
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Little-endian u64 from possibly unaligned bytes. */
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* True if the n bytes are strict UTF-8 with no control characters (C0, DEL).
 * Control characters are single bytes, and no byte of a multi-byte sequence
 * is below 0x80, so a byte scan finds them. */
static int clean_utf8(const uint8_t *s, size_t n) {
    if (moe_utf8_bad_offset(s, n) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] == 0x7f) return 0;
    return 1;
}

/* need: 1 if n more bytes are available at the cursor, else logs what was
 * being read and returns 0. */
static int need(struct cursor *c, uint64_t n, const char *what) {
    if (n <= c->size - c->off) return 1;
    MOE_LOGE("%s: byte %zu: file ends inside %s (needs %llu bytes, %zu left)", c->label, c->off, what,
             (unsigned long long)n, c->size - c->off);
    return 0;
}

/* get_u32 / get_u64: a little-endian integer at the cursor (0, logged, at the end of the file). */
static int get_u32(struct cursor *c, uint32_t *v, const char *what) {
    if (!need(c, 4, what)) return 0;
    *v = le32(c->base + c->off);
    c->off += 4;
    return 1;
}

static int get_u64(struct cursor *c, uint64_t *v, const char *what) {
    if (!need(c, 8, what)) return 0;
    *v = le64(c->base + c->off);
    c->off += 8;
    return 1;
}

/* get_str: a length-prefixed string; the bytes stay in the image. */
static int get_str(struct cursor *c, struct moe_gguf_str *s, const char *what) {
    uint64_t n;
    size_t at = c->off;
    if (!get_u64(c, &n, what)) return 0;
    if (n > c->size - c->off) {
        MOE_LOGE("%s: byte %zu: %s has length %llu, past the end of the file (%zu bytes left)", c->label, at,
                 what, (unsigned long long)n, c->size - c->off);
        return 0;
    }
    s->p = (const char *)c->base + c->off;
    s->n = n;
    c->off += (size_t)n;
    return 1;
}

/* dup_name: a NUL-terminated copy of a key or tensor name, which must be
 * non-empty clean UTF-8 (and, with max > 0, at most max bytes). */
static char *dup_name(const struct cursor *c, size_t at, const struct moe_gguf_str *s, const char *what,
                      size_t max, enum moe_status *st) {
    char sb[SHOW_CAP];
    *st = MOE_ERR_FORMAT;
    if (s->n == 0) {
        MOE_LOGE("%s: byte %zu: empty %s", c->label, at, what);
        return NULL;
    }
    if (!clean_utf8((const uint8_t *)s->p, (size_t)s->n)) {
        MOE_LOGE("%s: byte %zu: %s \"%s\" is not valid UTF-8 or holds control characters", c->label, at, what,
                 show(s->p, (size_t)s->n, sb, sizeof sb));
        return NULL;
    }
    if (max && s->n > max) {
        MOE_LOGE("%s: byte %zu: %s \"%s\" is %llu bytes long (at most %zu)", c->label, at, what,
                 show(s->p, (size_t)s->n, sb, sizeof sb), (unsigned long long)s->n, max);
        return NULL;
    }
    char *d = malloc((size_t)s->n + 1);
    if (!d) {
        *st = MOE_ERR_NOMEM;
        MOE_LOGE("%s: out of memory", c->label);
        return NULL;
    }
    memcpy(d, s->p, (size_t)s->n);
    d[s->n] = 0;
    *st = MOE_OK;
    return d;
}

/* ------------------------------------------------------------------------- */
/* metadata                                                                   */

/* read_value: the value of one key (a scalar or an array of scalars or
 * strings) into kv. */
static enum moe_status read_value(struct cursor *c, struct moe_gguf_kv *kv) {
    char kb[SHOW_CAP];
    const char *key = show(kv->key, strlen(kv->key), kb, sizeof kb);
    uint32_t t;
    size_t at = c->off;
    if (!get_u32(c, &t, "a value type")) return MOE_ERR_FORMAT;
    if (t >= MOE_GGUF_TYPE_COUNT) {
        MOE_LOGE("%s: byte %zu: key %s has unknown value type %u", c->label, at, key, t);
        return MOE_ERR_FORMAT;
    }
    kv->type = kv->elem = (enum moe_gguf_type)t;
    kv->n = 1;
    if (t == MOE_GGUF_ARRAY) {
        uint32_t et;
        at = c->off;
        if (!get_u32(c, &et, "an array element type")) return MOE_ERR_FORMAT;
        if (et >= MOE_GGUF_TYPE_COUNT) {
            MOE_LOGE("%s: byte %zu: key %s: array has unknown element type %u", c->label, at, key, et);
            return MOE_ERR_FORMAT;
        }
        if (et == MOE_GGUF_ARRAY) {
            MOE_LOGE("%s: byte %zu: key %s is an array of arrays, which is not supported", c->label, at, key);
            return MOE_ERR_FORMAT;
        }
        kv->elem = (enum moe_gguf_type)et;
        if (!get_u64(c, &kv->n, "an array length")) return MOE_ERR_FORMAT;
    }
    const uint64_t n = kv->n;
    if (kv->elem == MOE_GGUF_STRING) {
        if (n > (c->size - c->off) / 8) {
            MOE_LOGE("%s: byte %zu: key %s: %llu strings cannot fit in the %zu bytes left", c->label, c->off, key,
                     (unsigned long long)n, c->size - c->off);
            return MOE_ERR_FORMAT;
        }
        struct moe_gguf_str *s = malloc(sizeof *s * (size_t)(n ? n : 1));
        if (!s) {
            MOE_LOGE("%s: out of memory for %llu strings of key %s", c->label, (unsigned long long)n, key);
            return MOE_ERR_NOMEM;
        }
        kv->str = s;
        for (uint64_t i = 0; i < n; i++)
            if (!get_str(c, &s[i], "a string value")) return MOE_ERR_FORMAT;
        return MOE_OK;
    }
    const size_t es = k_type_size[kv->elem];
    if (n > (c->size - c->off) / es) {
        MOE_LOGE("%s: byte %zu: key %s: %llu elements of %s cannot fit in the %zu bytes left", c->label, c->off,
                 key, (unsigned long long)n, moe_gguf_type_name(kv->elem), c->size - c->off);
        return MOE_ERR_FORMAT;
    }
    kv->data = c->base + c->off;
    if (kv->elem == MOE_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (c->base[c->off + i] > 1) {
                MOE_LOGE("%s: byte %llu: key %s: bool value %u is neither 0 nor 1", c->label,
                         (unsigned long long)(c->off + i), key, c->base[c->off + i]);
                return MOE_ERR_FORMAT;
            }
    c->off += (size_t)(n * es);
    return MOE_OK;
}

/* Orders kv pointers by key (qsort / bsearch). */
static int cmp_kv(const void *a, const void *b) {
    return strcmp((*(const struct moe_gguf_kv *const *)a)->key, (*(const struct moe_gguf_kv *const *)b)->key);
}

/* Orders tensor pointers by name. */
static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp((*(const struct moe_gguf_tensor *const *)a)->name, (*(const struct moe_gguf_tensor *const *)b)->name);
}

/* Orders tensor pointers by (offset, size) for the overlap check. */
static int cmp_tensor_offset(const void *a, const void *b) {
    const struct moe_gguf_tensor *x = *(const struct moe_gguf_tensor *const *)a;
    const struct moe_gguf_tensor *y = *(const struct moe_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

/* read_kvs: every metadata item, then the duplicate check and the alignment. */
static enum moe_status read_kvs(struct cursor *c, struct moe_gguf *g) {
    enum moe_status st;
    char kb[SHOW_CAP];
    for (size_t i = 0; i < g->n_kv; i++) {
        struct moe_gguf_kv *kv = &g->kv[i];
        struct moe_gguf_str s;
        size_t at = c->off;
        if (!get_str(c, &s, "a key")) return MOE_ERR_FORMAT;
        if (!(kv->key = dup_name(c, at, &s, "key", 0, &st))) return st;
        if ((st = read_value(c, kv))) return st;
    }
    for (size_t i = 0; i < g->n_kv; i++) g->kv_by_key[i] = &g->kv[i];
    qsort(g->kv_by_key, g->n_kv, sizeof *g->kv_by_key, cmp_kv);
    for (size_t i = 1; i < g->n_kv; i++)
        if (!strcmp(g->kv_by_key[i - 1]->key, g->kv_by_key[i]->key)) {
            MOE_LOGE("%s: key %s appears twice", c->label,
                     show(g->kv_by_key[i]->key, strlen(g->kv_by_key[i]->key), kb, sizeof kb));
            return MOE_ERR_FORMAT;
        }
    g->alignment = MOE_GGUF_DEFAULT_ALIGNMENT;
    const struct moe_gguf_kv *al = moe_gguf_find_kv(g, "general.alignment");
    if (al) {
        uint32_t a = 0;
        if (al->type == MOE_GGUF_U32) a = le32(al->data);
        if (al->type != MOE_GGUF_U32 || a == 0 || (a & (a - 1))) {
            MOE_LOGE("%s: general.alignment must be a u32 power of two (got %s%s%u)", c->label,
                     moe_gguf_type_name(al->type), al->type == MOE_GGUF_U32 ? " " : "", al->type == MOE_GGUF_U32 ? a : 0);
            return MOE_ERR_FORMAT;
        }
        g->alignment = a;
    }
    return MOE_OK;
}

/* ------------------------------------------------------------------------- */
/* tensors                                                                    */

/* read_tensor_info: name, dims, type and offset of one tensor; the byte size
 * is computed and checked here, the placement after the data section is known. */
static enum moe_status read_tensor_info(struct cursor *c, struct moe_gguf_tensor *t) {
    enum moe_status st;
    char nb[SHOW_CAP];
    struct moe_gguf_str s;
    size_t at = c->off;
    if (!get_str(c, &s, "a tensor name")) return MOE_ERR_FORMAT;
    if (!(t->name = dup_name(c, at, &s, "tensor name", MOE_GGUF_MAX_NAME, &st))) return st;
    const char *name = show(t->name, strlen(t->name), nb, sizeof nb);
    uint32_t nd;
    at = c->off;
    if (!get_u32(c, &nd, "a tensor's dimension count")) return MOE_ERR_FORMAT;
    if (nd < 1 || nd > MOE_GGUF_MAX_DIMS) {
        MOE_LOGE("%s: byte %zu: tensor %s has %u dimensions (1 to %d allowed)", c->label, at, name, nd,
                 MOE_GGUF_MAX_DIMS);
        return MOE_ERR_FORMAT;
    }
    t->n_dims = (int)nd;
    int64_t elems = 1, nonzero = 1; /* the product of the non-zero dims must fit too: a zero
                                      * dim must not hide dims whose product overflows */
    for (int d = 0; d < MOE_GGUF_MAX_DIMS; d++) {
        uint64_t v = 1;
        at = c->off;
        if (d < (int)nd && !get_u64(c, &v, "a tensor dimension")) return MOE_ERR_FORMAT;
        if (v >= (uint64_t)DIM_LIMIT) {
            MOE_LOGE("%s: byte %zu: tensor %s: dimension %d is %llu (too large)", c->label, at, name, d,
                     (unsigned long long)v);
            return MOE_ERR_FORMAT;
        }
        t->ne[d] = (int64_t)v;
        if (v && nonzero > INT64_MAX / (int64_t)v) {
            MOE_LOGE("%s: tensor %s: the element count overflows 64 bits", c->label, name);
            return MOE_ERR_FORMAT;
        }
        elems *= (int64_t)v;
        if (v) nonzero *= (int64_t)v;
    }
    uint32_t type;
    at = c->off;
    if (!get_u32(c, &type, "a tensor type")) return MOE_ERR_FORMAT;
    if (!type_supported(type)) {
        const char *tn = moe_gguf_ggml_type_name(type);
        if (tn) {
            MOE_LOGE("%s: tensor %s has type %s (ggml type %u), which is not supported (supported: f32, f16, "
                     "bf16, q8_0, q4_0, q2_k, q3_k, q4_k, q5_k, q6_k, mxfp4); requantize the file with llama.cpp's "
                     "llama-quantize to one of them",
                     c->label, name, tn, type);
            return MOE_ERR_UNSUPPORTED;
        }
        MOE_LOGE("%s: byte %zu: tensor %s has unknown ggml type %u", c->label, at, name, type);
        return MOE_ERR_FORMAT;
    }
    t->type = (enum moe_qtype)type;
    const int64_t bs = moe_qtype_block_size(t->type);
    if (t->ne[0] % bs) {
        MOE_LOGE("%s: tensor %s: rows of %lld elements are not a whole number of %s blocks (%lld)", c->label, name,
                 (long long)t->ne[0], moe_qtype_name(t->type), (long long)bs);
        return MOE_ERR_FORMAT;
    }
    const uint64_t row = (uint64_t)(t->ne[0] / bs) * moe_qtype_block_bytes(t->type);
    const uint64_t rows = t->ne[0] ? (uint64_t)(elems / t->ne[0]) : 0;
    if (rows && row > UINT64_MAX / rows) {
        MOE_LOGE("%s: tensor %s: the byte size overflows 64 bits", c->label, name);
        return MOE_ERR_FORMAT;
    }
    const uint64_t nbytes = row * rows;
    if (nbytes > SIZE_MAX) {
        MOE_LOGE("%s: tensor %s: %llu bytes do not fit in memory", c->label, name, (unsigned long long)nbytes);
        return MOE_ERR_FORMAT;
    }
    t->nbytes = (size_t)nbytes;
    return get_u64(c, &t->offset, "a tensor offset") ? MOE_OK : MOE_ERR_FORMAT;
}

/* place_tensors: the data section and every tensor's place in it. */
static enum moe_status place_tensors(struct cursor *c, struct moe_gguf *g) {
    char nb[SHOW_CAP];
    const uint64_t a = g->alignment, end = c->off;
    const uint64_t start = end + (a - end % a) % a;
    g->data_offset = start;
    const uint64_t data_size = start <= c->size ? c->size - start : 0;
    if (g->n_tensors && start > c->size) {
        MOE_LOGE("%s: the data section would start at byte %llu, past the end of the file (%zu bytes)", c->label,
                 (unsigned long long)start, c->size);
        return MOE_ERR_FORMAT;
    }
    for (size_t i = 0; i < g->n_tensors; i++) {
        struct moe_gguf_tensor *t = &g->tensors[i];
        const char *name = show(t->name, strlen(t->name), nb, sizeof nb);
        if (t->offset % a) {
            MOE_LOGE("%s: tensor %s: offset %llu is not a multiple of the alignment %llu", c->label, name,
                     (unsigned long long)t->offset, (unsigned long long)a);
            return MOE_ERR_FORMAT;
        }
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            MOE_LOGE("%s: tensor %s: bytes [%llu, +%zu) lie outside the data section (%llu bytes)", c->label, name,
                     (unsigned long long)t->offset, t->nbytes, (unsigned long long)data_size);
            return MOE_ERR_FORMAT;
        }
        t->data = c->base + start + t->offset;
    }
    const struct moe_gguf_tensor **by_off = malloc(sizeof *by_off * (g->n_tensors ? g->n_tensors : 1));
    if (!by_off) {
        MOE_LOGE("%s: out of memory", c->label);
        return MOE_ERR_NOMEM;
    }
    for (size_t i = 0; i < g->n_tensors; i++) by_off[i] = &g->tensors[i];
    qsort(by_off, g->n_tensors, sizeof *by_off, cmp_tensor_offset);
    enum moe_status st = MOE_OK;
    /* sorted by offset, non-empty tensors must each begin at or after the end of
     * the previous non-empty one (empty ones overlap nothing and are skipped, so
     * that they cannot hide an overlap between their neighbours) */
    const struct moe_gguf_tensor *p = NULL;
    for (size_t i = 0; i < g->n_tensors && !st; i++) {
        const struct moe_gguf_tensor *t = by_off[i];
        if (!t->nbytes) continue;
        if (p && t->offset < p->offset + p->nbytes) {
            char pb[SHOW_CAP];
            MOE_LOGE("%s: tensors %s and %s overlap (bytes %llu+%zu and %llu+%zu)", c->label,
                     show(p->name, strlen(p->name), pb, sizeof pb), show(t->name, strlen(t->name), nb, sizeof nb),
                     (unsigned long long)p->offset, p->nbytes, (unsigned long long)t->offset, t->nbytes);
            st = MOE_ERR_FORMAT;
        }
        p = t;
    }
    free(by_off);
    return st;
}

/* read_tensors: the tensor infos, name uniqueness, and the placement. */
static enum moe_status read_tensors(struct cursor *c, struct moe_gguf *g) {
    enum moe_status st;
    char nb[SHOW_CAP];
    for (size_t i = 0; i < g->n_tensors; i++)
        if ((st = read_tensor_info(c, &g->tensors[i]))) return st;
    for (size_t i = 0; i < g->n_tensors; i++) g->tensor_by_name[i] = &g->tensors[i];
    qsort(g->tensor_by_name, g->n_tensors, sizeof *g->tensor_by_name, cmp_tensor_name);
    for (size_t i = 1; i < g->n_tensors; i++)
        if (!strcmp(g->tensor_by_name[i - 1]->name, g->tensor_by_name[i]->name)) {
            const char *n = g->tensor_by_name[i]->name;
            MOE_LOGE("%s: tensor %s appears twice", c->label, show(n, strlen(n), nb, sizeof nb));
            return MOE_ERR_FORMAT;
        }
    return place_tensors(c, g);
}

/* read_header: magic, version and the two counts (checked against the size). */
static enum moe_status read_header(struct cursor *c, struct moe_gguf *g) {
    if (c->size < 4 || memcmp(c->base, GGUF_MAGIC, 4) != 0) {
        MOE_LOGE("%s: not a GGUF file (the first 4 bytes are not \"GGUF\")", c->label);
        return MOE_ERR_FORMAT;
    }
    c->off = 4;
    uint64_t nt, nk;
    if (!get_u32(c, &g->version, "the version")) return MOE_ERR_FORMAT;
    if (g->version == 0x02000000u || g->version == 0x03000000u) {
        MOE_LOGE("%s: big-endian GGUF files are not supported", c->label);
        return MOE_ERR_UNSUPPORTED;
    }
    if (g->version == 1) {
        MOE_LOGE("%s: GGUF version 1 is not supported (convert the model again with a current llama.cpp)", c->label);
        return MOE_ERR_UNSUPPORTED;
    }
    if (g->version != 2 && g->version != 3) {
        MOE_LOGE("%s: unknown GGUF version %u (2 and 3 are read)", c->label, g->version);
        return MOE_ERR_FORMAT;
    }
    if (!get_u64(c, &nt, "the tensor count") || !get_u64(c, &nk, "the key count")) return MOE_ERR_FORMAT;
    const size_t left = c->size - c->off;
    if (nk > left / MIN_KV_BYTES || nt > (left - (size_t)nk * MIN_KV_BYTES) / MIN_TENSOR_BYTES) {
        MOE_LOGE("%s: %llu keys and %llu tensors cannot fit in the %zu bytes that follow the header", c->label,
                 (unsigned long long)nk, (unsigned long long)nt, left);
        return MOE_ERR_FORMAT;
    }
    g->n_kv = (size_t)nk;
    g->n_tensors = (size_t)nt;
    g->kv = calloc(g->n_kv + 1, sizeof *g->kv);
    g->kv_by_key = calloc(g->n_kv + 1, sizeof *g->kv_by_key);
    g->tensors = calloc(g->n_tensors + 1, sizeof *g->tensors);
    g->tensor_by_name = calloc(g->n_tensors + 1, sizeof *g->tensor_by_name);
    if (!g->kv || !g->kv_by_key || !g->tensors || !g->tensor_by_name) {
        MOE_LOGE("%s: out of memory", c->label);
        return MOE_ERR_NOMEM;
    }
    return MOE_OK;
}

/* parse: the whole image. */
static enum moe_status parse(struct moe_gguf *g, const void *buf, size_t len) {
    struct cursor c = {buf, len, 0, g->path};
    enum moe_status st;
    if ((st = read_header(&c, g))) return st;
    if ((st = read_kvs(&c, g))) return st;
    return read_tensors(&c, g);
}

/* gguf_new: an empty handle named `path`. */
static struct moe_gguf *gguf_new(const char *path) {
    struct moe_gguf *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    size_t n = strlen(path) + 1;
    if (!(g->path = malloc(n))) {
        free(g);
        return NULL;
    }
    memcpy(g->path, path, n);
    return g;
}

/* Validates a caller-owned image; the handle borrows buf. */
enum moe_status moe_gguf_open_memory(const void *buf, size_t len, const char *label, struct moe_gguf **out) {
    if (!out) return MOE_ERR_INVALID;
    *out = NULL;
    if (!label) label = "<memory>";
    if (!buf && len) {
        MOE_LOGE("%s: NULL buffer of %zu bytes", label, len);
        return MOE_ERR_INVALID;
    }
    struct moe_gguf *g = gguf_new(label);
    if (!g) {
        MOE_LOGE("%s: out of memory", label);
        return MOE_ERR_NOMEM;
    }
    enum moe_status st = parse(g, buf ? buf : "", len);
    if (st) {
        moe_gguf_free(g);
        return st;
    }
    *out = g;
    return MOE_OK;
}

/* Maps the file read-only and validates it. */
enum moe_status moe_gguf_open(const char *path, struct moe_gguf **out) {
    if (!out) return MOE_ERR_INVALID;
    *out = NULL;
    if (!path) {
        MOE_LOGE("path is NULL");
        return MOE_ERR_INVALID;
    }
    struct moe_gguf *g = gguf_new(path);
    if (!g) {
        MOE_LOGE("%s: out of memory", path);
        return MOE_ERR_NOMEM;
    }
    enum moe_status st = moe_mmap_open(path, &g->map);
    if (!st) st = parse(g, g->map.data ? g->map.data : "", g->map.size);
    if (st) {
        moe_gguf_free(g);
        return st;
    }
    *out = g;
    return MOE_OK;
}

/* Sniffs the 4-byte magic; directories, FIFOs, other non-regular files and
 * short files are not GGUF. */
int moe_gguf_is_gguf_file(const char *path) {
    int fd;
    char why[256], m[4];
    if (!path || moe_file_open_regular(path, &fd, why, sizeof why)) return 0; /* never blocks on a FIFO */
    int ok = read(fd, m, 4) == 4 && memcmp(m, GGUF_MAGIC, 4) == 0;
    close(fd);
    return ok;
}

/* Frees the keys, string tables, names and the map. */
void moe_gguf_free(struct moe_gguf *g) {
    if (!g) return;
    for (size_t i = 0; g->kv && i < g->n_kv; i++) {
        free((char *)g->kv[i].key);
        free((void *)g->kv[i].str);
    }
    for (size_t i = 0; g->tensors && i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    free(g->kv);
    free(g->kv_by_key);
    free(g->tensors);
    free(g->tensor_by_name);
    moe_mmap_close(&g->map);
    free(g->path);
    free(g);
}

/* File-level facts and counts (0 / NULL for a NULL handle). */
uint32_t moe_gguf_version(const struct moe_gguf *g) { return g ? g->version : 0; }
uint32_t moe_gguf_alignment(const struct moe_gguf *g) { return g ? g->alignment : 0; }
uint64_t moe_gguf_data_offset(const struct moe_gguf *g) { return g ? g->data_offset : 0; }
const char *moe_gguf_path(const struct moe_gguf *g) { return g ? g->path : NULL; }
size_t moe_gguf_n_kv(const struct moe_gguf *g) { return g ? g->n_kv : 0; }
size_t moe_gguf_n_tensors(const struct moe_gguf *g) { return g ? g->n_tensors : 0; }

/* The i-th metadata item in file order, or NULL. */
const struct moe_gguf_kv *moe_gguf_kv_at(const struct moe_gguf *g, size_t i) {
    return g && i < g->n_kv ? &g->kv[i] : NULL;
}

/* The i-th tensor in file order, or NULL. */
const struct moe_gguf_tensor *moe_gguf_tensor_at(const struct moe_gguf *g, size_t i) {
    return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

/* Binary search over the key-sorted table. */
const struct moe_gguf_kv *moe_gguf_find_kv(const struct moe_gguf *g, const char *key) {
    if (!g || !key || !g->n_kv || !g->kv_by_key[0]) return NULL;
    struct moe_gguf_kv k = {.key = key};
    const struct moe_gguf_kv *kp = &k;
    const struct moe_gguf_kv *const *hit = bsearch(&kp, g->kv_by_key, g->n_kv, sizeof *g->kv_by_key, cmp_kv);
    return hit ? *hit : NULL;
}

/* Binary search over the name-sorted table. */
const struct moe_gguf_tensor *moe_gguf_find_tensor(const struct moe_gguf *g, const char *name) {
    if (!g || !name || !g->n_tensors || !g->tensor_by_name[0]) return NULL;
    struct moe_gguf_tensor k = {.name = name};
    const struct moe_gguf_tensor *kp = &k;
    const struct moe_gguf_tensor *const *hit =
        bsearch(&kp, g->tensor_by_name, g->n_tensors, sizeof *g->tensor_by_name, cmp_tensor_name);
    return hit ? *hit : NULL;
}

/* ------------------------------------------------------------------------- */
/* element accessors                                                          */

/* elem_ptr: the bytes of numeric element i, or NULL. */
static const uint8_t *elem_ptr(const struct moe_gguf_kv *kv, uint64_t i) {
    if (!kv || !kv->data || i >= kv->n) return NULL;
    return (const uint8_t *)kv->data + i * k_type_size[kv->elem];
}

/* Integer element i, sign- or zero-extended by its GGUF type. */
int moe_gguf_kv_int(const struct moe_gguf_kv *kv, uint64_t i, int64_t *out) {
    const uint8_t *p = elem_ptr(kv, i);
    if (!p) return 0;
    switch (kv->elem) {
    case MOE_GGUF_U8: case MOE_GGUF_BOOL: *out = p[0]; return 1;
    case MOE_GGUF_I8: *out = (int8_t)p[0]; return 1;
    case MOE_GGUF_U16: *out = (uint16_t)(p[0] | p[1] << 8); return 1;
    case MOE_GGUF_I16: *out = (int16_t)(uint16_t)(p[0] | p[1] << 8); return 1;
    case MOE_GGUF_U32: *out = le32(p); return 1;
    case MOE_GGUF_I32: *out = (int32_t)le32(p); return 1;
    case MOE_GGUF_I64: *out = (int64_t)le64(p); return 1;
    case MOE_GGUF_U64: {
        uint64_t v = le64(p);
        if (v > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)v;
        return 1;
    }
    default: return 0;
    }
}

/* Float element i (f32, f64, or an integer converted). */
int moe_gguf_kv_float(const struct moe_gguf_kv *kv, uint64_t i, double *out) {
    const uint8_t *p = elem_ptr(kv, i);
    if (!p) return 0;
    if (kv->elem == MOE_GGUF_F32) {
        uint32_t u = le32(p);
        float f;
        memcpy(&f, &u, 4);
        *out = f;
        return 1;
    }
    if (kv->elem == MOE_GGUF_F64) {
        uint64_t u = le64(p);
        memcpy(out, &u, 8);
        return 1;
    }
    if (kv->elem == MOE_GGUF_BOOL) return 0;
    int64_t v;
    if (!moe_gguf_kv_int(kv, i, &v)) return 0;
    *out = (double)v;
    return 1;
}

/* String element i (borrowed bytes). */
int moe_gguf_kv_str(const struct moe_gguf_kv *kv, uint64_t i, struct moe_gguf_str *out) {
    if (!kv || !kv->str || i >= kv->n) return 0;
    *out = kv->str[i];
    return 1;
}

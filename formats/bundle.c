/*
 * bundle.c - writer, validating reader and crash-safe tuning updates for the
 * bundle container (.moeb). docs/format.md is the byte-exact specification;
 * formats/moe-bundle.h is the manual of the API.
 *
 * Checks made by moe_bundle_open / moe_bundle_open_memory (each failure is
 * logged once as "<func>: <file or label>: <item>: <problem>" and returned as
 * an error, never a crash; offsets in messages are file offsets):
 *   header page
 *   - the file holds the whole 4096-byte header page;
 *   - magic "MOEBUNDL" (a page of zeros is reported as an unfinished writer's
 *     temp file);
 *   - major version 1 (a larger one is MOE_ERR_UNSUPPORTED "written by a newer
 *     version"); any minor version is accepted;
 *   - header checksum; no unknown flags; alignment 4096; data region at 4096;
 *   - the directory starts on a 4096 boundary at or after 4096, is 32 bytes to
 *     1 GiB long and lies inside the file;
 *   directory
 *   - its checksum; magic "MOEBDIR\0"; the three section sizes add up to the
 *     directory size exactly;
 *   - metadata: a KV block (see kv_decode) consumed exactly;
 *   - tensor table: the count fits the section before anything is allocated;
 *     names 1..1024 bytes of UTF-8 without control characters, unique; n_dims
 *     <= 4, unused dims and reserved fields zero, the element count fits in 64
 *     bits; data on a 4096 boundary inside the data region [4096, directory);
 *   - expert section: the three counts are all zero or all non-zero, at most 16
 *     precisions, their product fits the section exactly; precision names
 *     [A-Za-z0-9_.+-]{1,63}, unique; 1..4 parts each of 1 or more bytes, the
 *     laid-out size fits in 64 bits; every entry is either absent (all zero) or
 *     present (flags 1, compression 0 or 1, raw size = the precision's laid-out
 *     size, stored size and stored checksum = raw size and raw checksum when
 *     uncompressed, stored size >= 1 when compressed, data on a 4096 boundary
 *     inside the data region); a layer is either all present or all absent
 *     (dense);
 *   - no two tensors or blobs overlap;
 *   tuning slots (A at 512, B at 1024)
 *   - a slot of 64 zero bytes is empty; otherwise magic "MOEBTUNE" and the slot
 *     checksum make it valid (a torn or damaged slot is skipped with a
 *     warning naming the slot used instead, and reported by verify_all);
 *   - of the valid slots, the one with the highest sequence whose payload is
 *     usable wins: payload size 0 (with offset 0) means no tuning; otherwise the
 *     payload starts on a 4096 boundary after the directory, is at most
 *     256 MiB, lies inside the file, matches its checksum and decodes as a KV
 *     block. A newer slot that fails this is skipped with a warning (and
 *     reported again by verify_all). No usable slot at all is an error.
 *
 * Not checked at open: the checksums of tensors and blobs (that would read the
 * whole file); moe_bundle_*_verify, moe_bundle_expert_load and
 * moe_bundle_verify_all do.
 *
 * Crash safety of moe_bundle_replace_tuning rests on one invariant: bytes that
 * a committed slot ever referenced are never modified or removed. New payloads
 * are only appended, and the only truncation drops bytes past every region a
 * valid slot references (the orphan of a replacement that crashed before its
 * slot write). So a reader that is open, or opening, while a replacement runs
 * always sees a consistent (old or new) payload.
 *
 * Ownership: the handle owns its map, metadata, tuning set, tensor records and
 * names, precision descriptors and expert table. moe_bundle_open_memory borrows
 * the caller's buffer.
 */
#define _GNU_SOURCE /* flock */
#include "moe-bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "moe-file.h"
#include "moe-mmap.h"

/* header page layout (docs/format.md, "Header page") */
#define PAGE 4096u
#define HDR_MAGIC "MOEBUNDL"
#define HDR_CHECKED 120u /* bytes covered by the header checksum */
#define SLOT_MAGIC "MOEBTUNE"
#define SLOT_SIZE 64u
#define SLOT_CHECKED 56u
static const uint64_t slot_offset[2] = {512, 1024};
#define DIR_MAGIC "MOEBDIR\0"
#define DIR_FIXED 32u
#define KV_ENTRY_FIXED 16u
#define TENSOR_FIXED 72u
#define PRECISION_FIXED 8u
#define PART_BYTES 32u
#define EXPERT_FIXED 16u
#define ENTRY_BYTES 48u
#define ENTRY_PRESENT 1u
#define MAX_LAYERS (1u << 20)
#define MAX_EXPERTS (1u << 20)
#define VERIFY_CHUNK (64u * 1024u)
#define SHOW_CAP 160

/* ------------------------------------------------------------------------- */
/* small helpers                                                              */

/* Copies an untrusted name into buf for a log message: control bytes become '?'
 * and long names are cut and marked with "...". */
static const char *show(const char *s, char *buf, size_t cap) {
    size_t n = 0, keep = cap - 4;
    while (s[n] && n < keep) n++;
    int cut = s[n] != 0;
    if (cut)
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    memcpy(buf + n, cut ? "..." : "", cut ? 4 : 1);
    return buf;
}

/* Duplicates n bytes as a NUL-terminated string; NULL when out of memory. */
static char *dupn(const void *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* Reads a little-endian u32 from possibly unaligned bytes. */
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reads a little-endian u64 from possibly unaligned bytes. */
static uint64_t get64(const uint8_t *p) {
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* Writes a little-endian u32. */
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes a little-endian u64. */
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Rounds x up to a multiple of a (a power of two); UINT64_MAX on overflow. */
static uint64_t align_up(uint64_t x, uint64_t a) {
    if (x > UINT64_MAX - (a - 1)) return UINT64_MAX;
    return (x + a - 1) & ~(a - 1);
}

/* XXH3-64 of n bytes (n may be 0). */
static uint64_t hash(const void *p, size_t n) { return XXH3_64bits(n ? p : "", n); }

/* True if the n bytes are all zero. */
static bool all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

/* True if s[0..n) is strict UTF-8 (Unicode Table 3-7: no overlongs, no
 * surrogates, nothing above U+10FFFF). */
static bool utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return false;
        }
        if (n - i < len || s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

/* True if s[0..n) is a valid name: 1..max bytes of UTF-8 with no control
 * characters (keys and tensor names). */
static bool name_ok(const uint8_t *s, size_t n, size_t max) {
    if (n == 0 || n > max || !utf8_ok(s, n)) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] == 0x7f) return false;
    return true;
}

/* True if s[0..n) is UTF-8 text without NUL bytes (string values). */
static bool text_ok(const uint8_t *s, size_t n) { return !memchr(s, 0, n) && utf8_ok(s, n); }

/* True if s[0..n) is a precision name: 1..63 bytes of [A-Za-z0-9_.+-]. */
static bool precision_name_ok(const uint8_t *s, size_t n) {
    if (n == 0 || n > MOE_BUNDLE_MAX_PRECISION_NAME) return false;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '+' || c == '-';
        if (!ok) return false;
    }
    return true;
}

/* Writes all n bytes at off, retrying short writes and EINTR. 0 or errno. */
static int pwrite_all(int fd, const void *buf, uint64_t n, uint64_t off) {
    const uint8_t *p = buf;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t k = pwrite(fd, p, chunk, (off_t)off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (k == 0) return EIO;
        p += k;
        n -= (uint64_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* Reads exactly n bytes at off, retrying short reads and EINTR. 0 or errno
 * (EIO for a read that ends early). */
static int pread_all(int fd, void *buf, uint64_t n, uint64_t off) {
    uint8_t *p = buf;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t k = pread(fd, p, chunk, (off_t)off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (k == 0) return EIO;
        p += k;
        n -= (uint64_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* growable output buffer                                                     */

struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
};

/* Appends k bytes (zeros when src is NULL); sets oom instead of failing. */
static void wb_put(struct wbuf *b, const void *src, size_t k) {
    if (b->oom || k == 0) return;
    if (k > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < k) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (src)
        memcpy(b->p + b->n, src, k);
    else
        memset(b->p + b->n, 0, k);
    b->n += k;
}

/* Appends a little-endian u32. */
static void wb_u32(struct wbuf *b, uint32_t v) {
    uint8_t t[4];
    put32(t, v);
    wb_put(b, t, 4);
}

/* Appends a little-endian u64. */
static void wb_u64(struct wbuf *b, uint64_t v) {
    uint8_t t[8];
    put64(t, v);
    wb_put(b, t, 8);
}

/* ------------------------------------------------------------------------- */
/* typed key/value sets                                                       */

struct kv_entry {
    char *key;
    enum moe_bundle_kv_type type;
    size_t count;
    union {
        int64_t i;
        double f;
        bool b;
    } v;
    /* STRING: char[count + 1]; BYTES: uint8_t[]; I64_ARRAY: int64_t[];
     * F64_ARRAY: double[]; STR_ARRAY: char *[] (each string malloc'd).
     * Arrays and bytes are allocated with at least one element so that the
     * getters return non-NULL for empty values. */
    void *data;
};

struct moe_bundle_kv {
    struct kv_entry *e; /* sorted by key (strcmp = byte order) */
    size_t n, cap;
};

/* Frees the key and value of one entry. */
static void entry_free(struct kv_entry *e) {
    if (e->type == MOE_KV_STR_ARRAY && e->data)
        for (size_t i = 0; i < e->count; i++) free(((char **)e->data)[i]);
    free(e->data);
    free(e->key);
    e->data = NULL;
    e->key = NULL;
}

/* Creates an empty set. */
enum moe_status moe_bundle_kv_new(struct moe_bundle_kv **out) {
    if (!out) return MOE_ERR_INVALID;
    *out = calloc(1, sizeof **out);
    if (!*out) {
        MOE_LOGE("out of memory");
        return MOE_ERR_NOMEM;
    }
    return MOE_OK;
}

/* Frees every entry and the set. */
void moe_bundle_kv_free(struct moe_bundle_kv *kv) {
    if (!kv) return;
    for (size_t i = 0; i < kv->n; i++) entry_free(&kv->e[i]);
    free(kv->e);
    free(kv);
}

/* Binary search: index of key, or (with *found false) where it would go. */
static size_t kv_search(const struct moe_bundle_kv *kv, const char *key, bool *found) {
    size_t lo = 0, hi = kv->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(kv->e[mid].key, key);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

/* Makes room for one more entry. */
static enum moe_status kv_reserve(struct moe_bundle_kv *kv, size_t want) {
    if (want <= kv->cap) return MOE_OK;
    size_t cap = kv->cap ? kv->cap : 8;
    while (cap < want) {
        if (cap > SIZE_MAX / 2 / sizeof *kv->e) return MOE_ERR_NOMEM;
        cap *= 2;
    }
    struct kv_entry *p = realloc(kv->e, cap * sizeof *p);
    if (!p) return MOE_ERR_NOMEM;
    kv->e = p;
    kv->cap = cap;
    return MOE_OK;
}

/* Inserts or replaces e (whose key and value the set takes over). On failure
 * e is freed and the set is unchanged. */
static enum moe_status kv_put(struct moe_bundle_kv *kv, struct kv_entry *e) {
    bool found;
    size_t at = kv_search(kv, e->key, &found);
    if (found) {
        entry_free(&kv->e[at]);
        kv->e[at] = *e;
        return MOE_OK;
    }
    if (kv_reserve(kv, kv->n + 1) != MOE_OK) {
        entry_free(e);
        MOE_LOGE("out of memory");
        return MOE_ERR_NOMEM;
    }
    memmove(&kv->e[at + 1], &kv->e[at], (kv->n - at) * sizeof *kv->e);
    kv->e[at] = *e;
    kv->n++;
    return MOE_OK;
}

/* Starts an entry for a setter: checks the set and key and copies the key. */
static enum moe_status entry_begin(const struct moe_bundle_kv *kv, const char *key,
                                   enum moe_bundle_kv_type type, struct kv_entry *e) {
    char kb[SHOW_CAP];
    memset(e, 0, sizeof *e);
    if (!kv || !key) {
        MOE_LOGE("NULL set or key");
        return MOE_ERR_INVALID;
    }
    size_t n = strlen(key);
    if (!name_ok((const uint8_t *)key, n, MOE_BUNDLE_MAX_KEY)) {
        MOE_LOGE("key %s: keys are 1..%d bytes of UTF-8 without control characters",
                 show(key, kb, sizeof kb), MOE_BUNDLE_MAX_KEY);
        return MOE_ERR_INVALID;
    }
    e->key = dupn(key, n);
    if (!e->key) {
        MOE_LOGE("out of memory");
        return MOE_ERR_NOMEM;
    }
    e->type = type;
    return MOE_OK;
}

/* Allocates n elements of size sz (at least one) for an entry's value. */
static enum moe_status entry_alloc(struct kv_entry *e, size_t n, size_t sz) {
    if (n > SIZE_MAX / sz) goto nomem;
    e->data = malloc((n ? n : 1) * sz);
    if (!e->data) goto nomem;
    e->count = n;
    return MOE_OK;
nomem:
    entry_free(e);
    MOE_LOGE("out of memory for a value of %zu elements", n);
    return MOE_ERR_NOMEM;
}

/* Sets a UTF-8 string value. */
enum moe_status moe_bundle_kv_set_str(struct moe_bundle_kv *kv, const char *key, const char *value) {
    struct kv_entry e;
    char kb[SHOW_CAP];
    enum moe_status rc = entry_begin(kv, key, MOE_KV_STRING, &e);
    if (rc != MOE_OK) return rc;
    if (!value) value = "";
    size_t n = strlen(value);
    if (!utf8_ok((const uint8_t *)value, n)) {
        MOE_LOGE("key %s: string value is not valid UTF-8", show(key, kb, sizeof kb));
        entry_free(&e);
        return MOE_ERR_INVALID;
    }
    if ((rc = entry_alloc(&e, n + 1, 1)) != MOE_OK) return rc;
    memcpy(e.data, value, n + 1);
    e.count = n;
    return kv_put(kv, &e);
}

/* Sets a signed 64-bit integer value. */
enum moe_status moe_bundle_kv_set_i64(struct moe_bundle_kv *kv, const char *key, int64_t value) {
    struct kv_entry e;
    enum moe_status rc = entry_begin(kv, key, MOE_KV_I64, &e);
    if (rc != MOE_OK) return rc;
    e.v.i = value;
    e.count = 1;
    return kv_put(kv, &e);
}

/* Sets a float64 value (kept bit-exactly). */
enum moe_status moe_bundle_kv_set_f64(struct moe_bundle_kv *kv, const char *key, double value) {
    struct kv_entry e;
    enum moe_status rc = entry_begin(kv, key, MOE_KV_F64, &e);
    if (rc != MOE_OK) return rc;
    e.v.f = value;
    e.count = 1;
    return kv_put(kv, &e);
}

/* Sets a boolean value. */
enum moe_status moe_bundle_kv_set_bool(struct moe_bundle_kv *kv, const char *key, bool value) {
    struct kv_entry e;
    enum moe_status rc = entry_begin(kv, key, MOE_KV_BOOL, &e);
    if (rc != MOE_OK) return rc;
    e.v.b = value;
    e.count = 1;
    return kv_put(kv, &e);
}

/* Sets an opaque byte string. */
enum moe_status moe_bundle_kv_set_bytes(struct moe_bundle_kv *kv, const char *key, const void *data,
                                        size_t n) {
    struct kv_entry e;
    enum moe_status rc = entry_begin(kv, key, MOE_KV_BYTES, &e);
    if (rc != MOE_OK) return rc;
    if (!data && n) {
        entry_free(&e);
        MOE_LOGE("NULL data of %zu bytes", n);
        return MOE_ERR_INVALID;
    }
    if ((rc = entry_alloc(&e, n, 1)) != MOE_OK) return rc;
    if (n) memcpy(e.data, data, n);
    return kv_put(kv, &e);
}

/* Sets an array of 64-bit integers or doubles (sz = 8 either way). */
static enum moe_status set_array8(struct moe_bundle_kv *kv, const char *key,
                                  enum moe_bundle_kv_type type, const void *v, size_t n) {
    struct kv_entry e;
    enum moe_status rc = entry_begin(kv, key, type, &e);
    if (rc != MOE_OK) return rc;
    if (!v && n) {
        entry_free(&e);
        MOE_LOGE("NULL array of %zu elements", n);
        return MOE_ERR_INVALID;
    }
    if ((rc = entry_alloc(&e, n, 8)) != MOE_OK) return rc;
    if (n) memcpy(e.data, v, n * 8);
    return kv_put(kv, &e);
}

/* Sets an array of int64. */
enum moe_status moe_bundle_kv_set_i64_array(struct moe_bundle_kv *kv, const char *key,
                                            const int64_t *v, size_t n) {
    return set_array8(kv, key, MOE_KV_I64_ARRAY, v, n);
}

/* Sets an array of float64. */
enum moe_status moe_bundle_kv_set_f64_array(struct moe_bundle_kv *kv, const char *key,
                                            const double *v, size_t n) {
    return set_array8(kv, key, MOE_KV_F64_ARRAY, v, n);
}

/* Sets an array of UTF-8 strings. */
enum moe_status moe_bundle_kv_set_str_array(struct moe_bundle_kv *kv, const char *key,
                                            const char *const *v, size_t n) {
    struct kv_entry e;
    char kb[SHOW_CAP];
    enum moe_status rc = entry_begin(kv, key, MOE_KV_STR_ARRAY, &e);
    if (rc != MOE_OK) return rc;
    for (size_t i = 0; i < n; i++) {
        if (!v || !v[i] || !utf8_ok((const uint8_t *)v[i], strlen(v[i]))) {
            MOE_LOGE("key %s: element %zu is NULL or not valid UTF-8", show(key, kb, sizeof kb), i);
            entry_free(&e);
            return MOE_ERR_INVALID;
        }
    }
    if ((rc = entry_alloc(&e, n, sizeof(char *))) != MOE_OK) return rc;
    char **s = e.data;
    for (size_t i = 0; i < n; i++) {
        s[i] = dupn(v[i], strlen(v[i]));
        if (!s[i]) {
            e.count = i; /* free what was copied */
            entry_free(&e);
            MOE_LOGE("out of memory");
            return MOE_ERR_NOMEM;
        }
    }
    return kv_put(kv, &e);
}

/* Deletes a key. */
enum moe_status moe_bundle_kv_copy(struct moe_bundle_kv *dst, const struct moe_bundle_kv *src) {
    enum moe_status st = MOE_OK;
    struct moe_bundle_kv_item it;
    for (size_t i = 0; !st && !moe_bundle_kv_at(src, i, &it); i++) switch (it.type) {
        case MOE_KV_STRING: st = moe_bundle_kv_set_str(dst, it.key, it.str); break;
        case MOE_KV_I64: st = moe_bundle_kv_set_i64(dst, it.key, it.i64); break;
        case MOE_KV_F64: st = moe_bundle_kv_set_f64(dst, it.key, it.f64); break;
        case MOE_KV_BOOL: st = moe_bundle_kv_set_bool(dst, it.key, it.b); break;
        case MOE_KV_BYTES: st = moe_bundle_kv_set_bytes(dst, it.key, it.bytes, it.count); break;
        case MOE_KV_I64_ARRAY: st = moe_bundle_kv_set_i64_array(dst, it.key, it.i64s, it.count); break;
        case MOE_KV_F64_ARRAY: st = moe_bundle_kv_set_f64_array(dst, it.key, it.f64s, it.count); break;
        case MOE_KV_STR_ARRAY: st = moe_bundle_kv_set_str_array(dst, it.key, it.strs, it.count); break;
        }
    return st;
}

enum moe_status moe_bundle_kv_remove(struct moe_bundle_kv *kv, const char *key) {
    bool found;
    if (!kv || !key) return MOE_ERR_INVALID;
    size_t at = kv_search(kv, key, &found);
    if (!found) return MOE_ERR_NOT_FOUND;
    entry_free(&kv->e[at]);
    memmove(&kv->e[at], &kv->e[at + 1], (kv->n - at - 1) * sizeof *kv->e);
    kv->n--;
    return MOE_OK;
}

/* Number of keys (0 for NULL). */
size_t moe_bundle_kv_count(const struct moe_bundle_kv *kv) { return kv ? kv->n : 0; }

/* Fills an item from an entry. */
static void entry_item(const struct kv_entry *e, struct moe_bundle_kv_item *out) {
    memset(out, 0, sizeof *out);
    out->key = e->key;
    out->type = e->type;
    out->count = e->count;
    switch (e->type) {
    case MOE_KV_STRING: out->str = e->data; break;
    case MOE_KV_I64: out->i64 = e->v.i; break;
    case MOE_KV_F64: out->f64 = e->v.f; break;
    case MOE_KV_BOOL: out->b = e->v.b; break;
    case MOE_KV_BYTES: out->bytes = e->data; break;
    case MOE_KV_I64_ARRAY: out->i64s = e->data; break;
    case MOE_KV_F64_ARRAY: out->f64s = e->data; break;
    case MOE_KV_STR_ARRAY: out->strs = (const char *const *)e->data; break;
    }
}

/* The i-th item in key order. */
enum moe_status moe_bundle_kv_at(const struct moe_bundle_kv *kv, size_t i,
                                 struct moe_bundle_kv_item *out) {
    if (!out) return MOE_ERR_INVALID;
    if (!kv || i >= kv->n) return MOE_ERR_RANGE;
    entry_item(&kv->e[i], out);
    return MOE_OK;
}

/* Looks an entry up by key; NULL if absent. */
static const struct kv_entry *kv_get(const struct moe_bundle_kv *kv, const char *key) {
    bool found;
    if (!kv || !key || kv->n == 0) return NULL;
    size_t at = kv_search(kv, key, &found);
    return found ? &kv->e[at] : NULL;
}

/* The item of a key. */
enum moe_status moe_bundle_kv_find(const struct moe_bundle_kv *kv, const char *key,
                                   struct moe_bundle_kv_item *out) {
    const struct kv_entry *e = kv_get(kv, key);
    if (!out) return MOE_ERR_INVALID;
    if (!e) return MOE_ERR_NOT_FOUND;
    entry_item(e, out);
    return MOE_OK;
}

/* The entry of key if it has the given type, with *n set to its count. */
static const struct kv_entry *kv_typed(const struct moe_bundle_kv *kv, const char *key,
                                       enum moe_bundle_kv_type type, size_t *n) {
    const struct kv_entry *e = kv_get(kv, key);
    if (!e || e->type != type) e = NULL;
    if (n) *n = e ? e->count : 0;
    return e;
}

/* Status getters share this: not found, wrong type, or the entry. */
static enum moe_status kv_scalar(const struct moe_bundle_kv *kv, const char *key,
                                 enum moe_bundle_kv_type type, const struct kv_entry **out) {
    const struct kv_entry *e = kv_get(kv, key);
    if (!e) return MOE_ERR_NOT_FOUND;
    if (e->type != type) return MOE_ERR_SHAPE;
    *out = e;
    return MOE_OK;
}

/* String value of key, or NULL. */
const char *moe_bundle_kv_str(const struct moe_bundle_kv *kv, const char *key) {
    const struct kv_entry *e = kv_typed(kv, key, MOE_KV_STRING, NULL);
    return e ? e->data : NULL;
}

/* Integer value of key. */
enum moe_status moe_bundle_kv_i64(const struct moe_bundle_kv *kv, const char *key, int64_t *out) {
    const struct kv_entry *e = NULL;
    enum moe_status rc = kv_scalar(kv, key, MOE_KV_I64, &e);
    if (rc == MOE_OK && out) *out = e->v.i;
    return rc;
}

/* Float value of key. */
enum moe_status moe_bundle_kv_f64(const struct moe_bundle_kv *kv, const char *key, double *out) {
    const struct kv_entry *e = NULL;
    enum moe_status rc = kv_scalar(kv, key, MOE_KV_F64, &e);
    if (rc == MOE_OK && out) *out = e->v.f;
    return rc;
}

/* Boolean value of key. */
enum moe_status moe_bundle_kv_bool(const struct moe_bundle_kv *kv, const char *key, bool *out) {
    const struct kv_entry *e = NULL;
    enum moe_status rc = kv_scalar(kv, key, MOE_KV_BOOL, &e);
    if (rc == MOE_OK && out) *out = e->v.b;
    return rc;
}

/* Byte-string value of key, or NULL. */
const void *moe_bundle_kv_bytes(const struct moe_bundle_kv *kv, const char *key, size_t *n) {
    const struct kv_entry *e = kv_typed(kv, key, MOE_KV_BYTES, n);
    return e ? e->data : NULL;
}

/* Integer-array value of key, or NULL. */
const int64_t *moe_bundle_kv_i64_array(const struct moe_bundle_kv *kv, const char *key, size_t *n) {
    const struct kv_entry *e = kv_typed(kv, key, MOE_KV_I64_ARRAY, n);
    return e ? e->data : NULL;
}

/* Float-array value of key, or NULL. */
const double *moe_bundle_kv_f64_array(const struct moe_bundle_kv *kv, const char *key, size_t *n) {
    const struct kv_entry *e = kv_typed(kv, key, MOE_KV_F64_ARRAY, n);
    return e ? e->data : NULL;
}

/* String-array value of key, or NULL. */
const char *const *moe_bundle_kv_str_array(const struct moe_bundle_kv *kv, const char *key,
                                           size_t *n) {
    const struct kv_entry *e = kv_typed(kv, key, MOE_KV_STR_ARRAY, n);
    return e ? (const char *const *)e->data : NULL;
}

/* ------------------------------------------------------------------------- */
/* KV codec (docs/format.md, "KV block")                                      */

/* Bytes of an entry's encoded value. */
static uint64_t entry_value_len(const struct kv_entry *e) {
    switch (e->type) {
    case MOE_KV_STRING:
    case MOE_KV_BYTES: return e->count;
    case MOE_KV_I64:
    case MOE_KV_F64: return 8;
    case MOE_KV_BOOL: return 1;
    case MOE_KV_I64_ARRAY:
    case MOE_KV_F64_ARRAY: return (uint64_t)e->count * 8;
    case MOE_KV_STR_ARRAY: {
        uint64_t n = 8;
        for (size_t i = 0; i < e->count; i++) n += 8 + strlen(((char **)e->data)[i]);
        return n;
    }
    }
    return 0;
}

/* Appends the KV block encoding of kv (NULL = empty) to b. */
static void kv_encode(const struct moe_bundle_kv *kv, struct wbuf *b) {
    size_t n = kv ? kv->n : 0;
    wb_u64(b, n);
    for (size_t i = 0; i < n; i++) {
        const struct kv_entry *e = &kv->e[i];
        size_t klen = strlen(e->key);
        wb_u32(b, (uint32_t)klen);
        wb_u32(b, (uint32_t)e->type);
        wb_u64(b, entry_value_len(e));
        wb_put(b, e->key, klen);
        switch (e->type) {
        case MOE_KV_STRING:
        case MOE_KV_BYTES: wb_put(b, e->data, e->count); break;
        case MOE_KV_I64: wb_u64(b, (uint64_t)e->v.i); break;
        case MOE_KV_F64: {
            uint64_t bits;
            memcpy(&bits, &e->v.f, 8);
            wb_u64(b, bits);
            break;
        }
        case MOE_KV_BOOL: wb_put(b, &(uint8_t){e->v.b ? 1 : 0}, 1); break;
        case MOE_KV_I64_ARRAY:
        case MOE_KV_F64_ARRAY:
            for (size_t k = 0; k < e->count; k++) {
                uint64_t bits;
                memcpy(&bits, (const uint8_t *)e->data + 8 * k, 8);
                wb_u64(b, bits);
            }
            break;
        case MOE_KV_STR_ARRAY:
            wb_u64(b, e->count);
            for (size_t k = 0; k < e->count; k++) {
                const char *sk = ((char **)e->data)[k];
                size_t sl = strlen(sk);
                wb_u64(b, sl);
                wb_put(b, sk, sl);
            }
            break;
        }
    }
}

/* Decoding context: a byte range of the file and what it is, for messages. */
struct cur {
    const uint8_t *p;
    uint64_t n, pos;
    uint64_t base;     /* file offset of p[0] */
    const char *label; /* file */
    const char *what;  /* "metadata", "tensor table", "tuning payload (slot A)" */
};

/* Checks that k more bytes are available; logs what was being read. */
static enum moe_status need(struct cur *c, uint64_t k, const char *field) {
    if (k <= c->n - c->pos) return MOE_OK;
    MOE_LOGE("%s: %s: %s at file offset %llu needs %llu bytes but only %llu remain in the section",
             c->label, c->what, field, (unsigned long long)(c->base + c->pos),
             (unsigned long long)k, (unsigned long long)(c->n - c->pos));
    return MOE_ERR_FORMAT;
}

/* Reads a u32 (caller checked the room). */
static uint32_t take32(struct cur *c) {
    uint32_t v = get32(c->p + c->pos);
    c->pos += 4;
    return v;
}

/* Reads a u64 (caller checked the room). */
static uint64_t take64(struct cur *c) {
    uint64_t v = get64(c->p + c->pos);
    c->pos += 8;
    return v;
}

/* Decodes one value of type e->type from v[0..vlen) into e. */
static enum moe_status decode_value(struct cur *c, const uint8_t *v, uint64_t vlen,
                                    struct kv_entry *e, uint64_t at) {
    const char *why = NULL;
    char kb[SHOW_CAP];
    switch (e->type) {
    case MOE_KV_STRING:
        if (!text_ok(v, (size_t)vlen)) {
            why = "string value is not UTF-8 or contains a NUL byte";
            break;
        }
        if (entry_alloc(e, (size_t)vlen + 1, 1) != MOE_OK) return MOE_ERR_NOMEM;
        memcpy(e->data, v, (size_t)vlen);
        ((char *)e->data)[vlen] = 0;
        e->count = (size_t)vlen;
        return MOE_OK;
    case MOE_KV_I64:
    case MOE_KV_F64:
        if (vlen != 8) {
            why = "scalar value is not 8 bytes";
            break;
        }
        if (e->type == MOE_KV_I64) {
            e->v.i = (int64_t)get64(v);
        } else {
            uint64_t bits = get64(v);
            memcpy(&e->v.f, &bits, 8);
        }
        e->count = 1;
        return MOE_OK;
    case MOE_KV_BOOL:
        if (vlen != 1 || v[0] > 1) {
            why = "bool value is not one byte of 0 or 1";
            break;
        }
        e->v.b = v[0] == 1;
        e->count = 1;
        return MOE_OK;
    case MOE_KV_BYTES:
        if (entry_alloc(e, (size_t)vlen, 1) != MOE_OK) return MOE_ERR_NOMEM;
        if (vlen) memcpy(e->data, v, (size_t)vlen);
        return MOE_OK;
    case MOE_KV_I64_ARRAY:
    case MOE_KV_F64_ARRAY:
        if (vlen % 8) {
            why = "array length is not a multiple of 8 bytes";
            break;
        }
        if (entry_alloc(e, (size_t)(vlen / 8), 8) != MOE_OK) return MOE_ERR_NOMEM;
        for (uint64_t k = 0; k < vlen / 8; k++) {
            uint64_t bits = get64(v + 8 * k);
            memcpy((uint8_t *)e->data + 8 * k, &bits, 8);
        }
        return MOE_OK;
    case MOE_KV_STR_ARRAY: {
        if (vlen < 8) {
            why = "string array is shorter than its 8-byte count";
            break;
        }
        uint64_t n = get64(v), pos = 8;
        if (n > (vlen - 8) / 8) {
            why = "string array count does not fit its value";
            break;
        }
        if (entry_alloc(e, (size_t)n, sizeof(char *)) != MOE_OK) return MOE_ERR_NOMEM;
        char **s = e->data;
        e->count = 0;
        for (uint64_t k = 0; k < n && !why; k++) {
            if (vlen - pos < 8) {
                why = "string array element runs past the value";
                break;
            }
            uint64_t sl = get64(v + pos);
            pos += 8;
            if (sl > vlen - pos) {
                why = "string array element runs past the value";
            } else if (!text_ok(v + pos, (size_t)sl)) {
                why = "string array element is not UTF-8 or contains a NUL byte";
            } else if (!(s[k] = dupn(v + pos, (size_t)sl))) {
                MOE_LOGE("%s: %s: out of memory", c->label, c->what);
                return MOE_ERR_NOMEM;
            } else {
                e->count = (size_t)k + 1;
                pos += sl;
            }
        }
        if (!why && pos != vlen) why = "string array has bytes after its last element";
        if (!why) return MOE_OK;
        break;
    }
    default: why = "unknown value type"; break;
    }
    MOE_LOGE("%s: %s: key %s (entry at file offset %llu): %s", c->label, c->what,
             show(e->key, kb, sizeof kb), (unsigned long long)at, why);
    return MOE_ERR_FORMAT;
}

/* Decodes a KV block that must fill p[0..n) exactly. Keys must be valid and in
 * strictly increasing byte order (so unique); the count is checked against the
 * room before anything is allocated. */
static enum moe_status kv_decode(const uint8_t *p, uint64_t n, uint64_t base, const char *label,
                                 const char *what, struct moe_bundle_kv **out) {
    struct cur c = {p, n, 0, base, label, what};
    struct moe_bundle_kv *kv = NULL;
    struct kv_entry e = {0};
    enum moe_status rc = MOE_ERR_FORMAT;
    char kb[SHOW_CAP], pb[SHOW_CAP];
    *out = NULL;
    if ((rc = need(&c, 8, "entry count")) != MOE_OK) return rc;
    uint64_t count = take64(&c);
    if (count > (n - 8) / KV_ENTRY_FIXED) {
        MOE_LOGE("%s: %s: entry count %llu cannot fit in %llu bytes", label, what,
                 (unsigned long long)count, (unsigned long long)n);
        return MOE_ERR_FORMAT;
    }
    if ((rc = moe_bundle_kv_new(&kv)) != MOE_OK) return rc;
    if (kv_reserve(kv, (size_t)count) != MOE_OK) {
        rc = MOE_ERR_NOMEM;
        MOE_LOGE("%s: %s: out of memory for %llu entries", label, what, (unsigned long long)count);
        goto fail;
    }
    for (uint64_t i = 0; i < count; i++) {
        uint64_t at = base + c.pos;
        rc = MOE_ERR_FORMAT;
        if (need(&c, KV_ENTRY_FIXED, "entry header") != MOE_OK) goto fail;
        uint32_t klen = take32(&c), type = take32(&c);
        uint64_t vlen = take64(&c);
        if (klen == 0 || klen > MOE_BUNDLE_MAX_KEY) {
            MOE_LOGE("%s: %s: entry at file offset %llu: key length %u is outside 1..%d", label,
                     what, (unsigned long long)at, klen, MOE_BUNDLE_MAX_KEY);
            goto fail;
        }
        if (type < MOE_KV_STRING || type > MOE_KV_STR_ARRAY) {
            MOE_LOGE("%s: %s: entry at file offset %llu: unknown value type %u", label, what,
                     (unsigned long long)at, type);
            goto fail;
        }
        if (need(&c, klen, "key") != MOE_OK) goto fail;
        if (vlen > c.n - c.pos - klen) { /* not klen + vlen: that sum can wrap */
            MOE_LOGE("%s: %s: entry at file offset %llu: value of %llu bytes runs past the "
                     "section (%llu bytes remain)",
                     label, what, (unsigned long long)at, (unsigned long long)vlen,
                     (unsigned long long)(c.n - c.pos - klen));
            goto fail;
        }
        const uint8_t *k = c.p + c.pos;
        if (!name_ok(k, klen, MOE_BUNDLE_MAX_KEY)) {
            MOE_LOGE("%s: %s: entry at file offset %llu: key is not UTF-8 without control "
                     "characters",
                     label, what, (unsigned long long)at);
            goto fail;
        }
        memset(&e, 0, sizeof e);
        e.type = (enum moe_bundle_kv_type)type;
        if (!(e.key = dupn(k, klen))) {
            rc = MOE_ERR_NOMEM;
            MOE_LOGE("%s: %s: out of memory", label, what);
            goto fail;
        }
        if (kv->n > 0 && strcmp(kv->e[kv->n - 1].key, e.key) >= 0) {
            MOE_LOGE("%s: %s: key %s at file offset %llu is %s key %s (keys must be unique and "
                     "in byte order)",
                     label, what, show(e.key, kb, sizeof kb), (unsigned long long)at,
                     strcmp(kv->e[kv->n - 1].key, e.key) == 0 ? "a duplicate of" : "not after",
                     show(kv->e[kv->n - 1].key, pb, sizeof pb));
            goto fail;
        }
        c.pos += klen;
        if ((rc = decode_value(&c, c.p + c.pos, vlen, &e, at)) != MOE_OK) goto fail;
        c.pos += vlen;
        kv->e[kv->n++] = e; /* room was reserved */
        memset(&e, 0, sizeof e);
    }
    if (c.pos != n) {
        MOE_LOGE("%s: %s: %llu bytes after the last entry (at file offset %llu)", label, what,
                 (unsigned long long)(n - c.pos), (unsigned long long)(base + c.pos));
        rc = MOE_ERR_FORMAT;
        goto fail;
    }
    *out = kv;
    return MOE_OK;
fail:
    entry_free(&e);
    moe_bundle_kv_free(kv);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* precision layout                                                           */

/* Computes part offsets and the raw size without logging; NULL or a reason. */
static const char *layout_parts(struct moe_bundle_precision *p) {
    if (p->n_parts < 1 || p->n_parts > MOE_BUNDLE_MAX_PARTS) return "part count is not 1..4";
    uint64_t end = 0;
    for (uint32_t i = 0; i < p->n_parts; i++) {
        struct moe_bundle_part *q = &p->parts[i];
        if (q->nbytes == 0) return "a part has 0 bytes";
        uint64_t off = align_up(end, MOE_BUNDLE_PART_ALIGN);
        if (off == UINT64_MAX || q->nbytes > UINT64_MAX - off) return "part sizes overflow";
        q->offset = off;
        end = off + q->nbytes;
    }
    for (uint32_t i = p->n_parts; i < MOE_BUNDLE_MAX_PARTS; i++)
        memset(&p->parts[i], 0, sizeof p->parts[i]);
    p->raw_size = end;
    return NULL;
}

/* Public form of layout_parts (logs the reason). */
enum moe_status moe_bundle_precision_layout(struct moe_bundle_precision *p) {
    if (!p) return MOE_ERR_INVALID;
    const char *why = layout_parts(p);
    if (why) {
        MOE_LOGE("precision %s: %s", p->name ? p->name : "(unnamed)", why);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* ------------------------------------------------------------------------- */
/* header page                                                                */

struct hdr {
    uint16_t major, minor;
    uint64_t dir_offset, dir_size, dir_checksum, checksum;
};

/* Writes the 128-byte header into page (the rest of the page is the caller's). */
static void header_build(uint8_t *page, uint64_t dir_offset, uint64_t dir_size,
                         uint64_t dir_checksum) {
    memset(page, 0, 128);
    memcpy(page, HDR_MAGIC, 8);
    page[8] = MOE_BUNDLE_VERSION_MAJOR;
    page[10] = MOE_BUNDLE_VERSION_MINOR;
    put32(page + 12, 0); /* flags */
    put64(page + 16, PAGE);
    put64(page + 24, PAGE);
    put64(page + 32, dir_offset);
    put64(page + 40, dir_size);
    put64(page + 48, dir_checksum);
    put64(page + HDR_CHECKED, hash(page, HDR_CHECKED));
}

/* Validates the header of a file of file_size bytes whose first page is `page`. */
static enum moe_status header_parse(const uint8_t *page, uint64_t file_size, const char *label,
                                    struct hdr *h) {
    if (memcmp(page, HDR_MAGIC, 8) != 0) {
        if (all_zero(page, PAGE))
            MOE_LOGE("%s: header page is blank: not a finished bundle (an interrupted writer's "
                     "temp file?)",
                     label);
        else
            MOE_LOGE("%s: not a bundle (bad magic at offset 0; expected \"%s\")", label, HDR_MAGIC);
        return MOE_ERR_FORMAT;
    }
    h->major = (uint16_t)(page[8] | page[9] << 8);
    h->minor = (uint16_t)(page[10] | page[11] << 8);
    if (h->major > MOE_BUNDLE_VERSION_MAJOR) {
        MOE_LOGE("%s: written by a newer version of the bundle format (v%u.%u); this reader "
                 "supports v%d.x",
                 label, h->major, h->minor, MOE_BUNDLE_VERSION_MAJOR);
        return MOE_ERR_UNSUPPORTED;
    }
    if (h->major == 0) {
        MOE_LOGE("%s: version %u.%u at offset 8 is not a bundle version", label, h->major, h->minor);
        return MOE_ERR_FORMAT;
    }
    h->checksum = get64(page + HDR_CHECKED);
    if (hash(page, HDR_CHECKED) != h->checksum) {
        MOE_LOGE("%s: header checksum mismatch (bytes 0..119 of the header page are damaged)",
                 label);
        return MOE_ERR_FORMAT;
    }
    uint32_t flags = get32(page + 12);
    if (flags) {
        MOE_LOGE("%s: header flags 0x%x name features this reader does not know", label, flags);
        return MOE_ERR_UNSUPPORTED;
    }
    if (get64(page + 16) != PAGE || get64(page + 24) != PAGE) {
        MOE_LOGE("%s: header alignment %llu / data offset %llu: both must be 4096", label,
                 (unsigned long long)get64(page + 16), (unsigned long long)get64(page + 24));
        return MOE_ERR_FORMAT;
    }
    h->dir_offset = get64(page + 32);
    h->dir_size = get64(page + 40);
    h->dir_checksum = get64(page + 48);
    if (h->dir_offset < PAGE || h->dir_offset % PAGE) {
        MOE_LOGE("%s: directory offset %llu is not a multiple of 4096 at or after 4096", label,
                 (unsigned long long)h->dir_offset);
        return MOE_ERR_FORMAT;
    }
    if (h->dir_size < DIR_FIXED || h->dir_size > MOE_BUNDLE_MAX_DIR) {
        MOE_LOGE("%s: directory size %llu is outside %u..%llu bytes", label,
                 (unsigned long long)h->dir_size, DIR_FIXED, MOE_BUNDLE_MAX_DIR);
        return MOE_ERR_FORMAT;
    }
    if (h->dir_offset > file_size || h->dir_size > file_size - h->dir_offset) {
        MOE_LOGE("%s: directory (offset %llu, %llu bytes) runs past the end of the file (%llu "
                 "bytes): truncated file?",
                 label, (unsigned long long)h->dir_offset, (unsigned long long)h->dir_size,
                 (unsigned long long)file_size);
        return MOE_ERR_FORMAT;
    }
    return MOE_OK;
}

/* A tuning slot as read from the header page. */
enum { SLOT_EMPTY, SLOT_BAD, SLOT_VALID };
struct slot {
    int state;
    uint64_t seq, offset, size, checksum;
};

/* Writes a valid slot record. */
static void slot_build(uint8_t *s, uint64_t seq, uint64_t offset, uint64_t size, uint64_t checksum) {
    memset(s, 0, SLOT_SIZE);
    memcpy(s, SLOT_MAGIC, 8);
    put64(s + 8, seq);
    put64(s + 16, offset);
    put64(s + 24, size);
    put64(s + 32, checksum);
    put64(s + SLOT_CHECKED, hash(s, SLOT_CHECKED));
}

/* Classifies a 64-byte slot record: empty (all zero), bad (torn or damaged) or valid. */
static struct slot slot_parse(const uint8_t *s) {
    struct slot r = {SLOT_BAD, 0, 0, 0, 0};
    if (all_zero(s, SLOT_SIZE)) {
        r.state = SLOT_EMPTY;
        return r;
    }
    if (memcmp(s, SLOT_MAGIC, 8) != 0 || hash(s, SLOT_CHECKED) != get64(s + SLOT_CHECKED))
        return r;
    r.state = SLOT_VALID;
    r.seq = get64(s + 8);
    r.offset = get64(s + 16);
    r.size = get64(s + 24);
    r.checksum = get64(s + 32);
    return r;
}

/* Checks where a valid slot's payload lies; NULL if usable so far, else why not. */
static const char *slot_bounds(const struct slot *s, uint64_t dir_end, uint64_t file_size) {
    if (s->size == 0) {
        if (s->offset != 0) return "an empty payload must have offset 0";
        if (s->checksum != hash("", 0)) return "payload checksum mismatch";
        return NULL;
    }
    if (s->offset % PAGE || s->offset < dir_end) return "payload offset is not a 4096 boundary after the directory";
    if (s->size > MOE_BUNDLE_MAX_TUNING) return "payload is larger than 256 MiB";
    if (s->offset > file_size || s->size > file_size - s->offset)
        return "payload runs past the end of the file";
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* reader                                                                     */

struct bundle_entry {
    uint64_t offset, stored, raw, checksum, stored_checksum;
    uint32_t compression, flags;
};

struct moe_bundle {
    struct moe_mmap map; /* zeroed for moe_bundle_open_memory */
    const uint8_t *base;
    uint64_t size;
    char *label;
    struct hdr h;
    struct moe_bundle_kv *meta;
    struct moe_bundle_tensor *tensors; /* directory order */
    size_t n_tensors;
    const struct moe_bundle_tensor **by_name;
    uint32_t n_layers, n_experts, n_precisions;
    struct moe_bundle_precision *precisions;
    struct bundle_entry *entries; /* [n_layers][n_experts][n_precisions] */
    uint8_t *layer_has;           /* [n_layers] */
    uint64_t data_bytes, raw_blob_bytes;
    struct moe_bundle_kv *tuning; /* never NULL after open */
    struct slot tslot;            /* the slot in use */
    int tslot_index;              /* 0 = A, 1 = B */
    char slot_bad[2][256];        /* per slot: why it is damaged or unusable ("" if fine or empty) */
};

/* The file offset where the directory ends. */
static uint64_t dir_end(const struct moe_bundle *b) { return b->h.dir_offset + b->h.dir_size; }

/* Index of (layer, expert, precision) in the entry table. */
static size_t entry_index(const struct moe_bundle *b, uint32_t l, uint32_t e, uint32_t p) {
    return ((size_t)l * b->n_experts + e) * b->n_precisions + p;
}

/* Writes "layer L expert E precision NAME" into buf. */
static const char *blob_name(const struct moe_bundle *b, uint32_t l, uint32_t e, uint32_t p,
                             char *buf, size_t cap) {
    snprintf(buf, cap, "layer %u expert %u precision %s", l, e, b->precisions[p].name);
    return buf;
}

/* Compares tensors by name through pointers (qsort, bsearch). */
static int cmp_tensor_name(const void *a, const void *b) {
    const struct moe_bundle_tensor *x = *(const struct moe_bundle_tensor *const *)a;
    const struct moe_bundle_tensor *y = *(const struct moe_bundle_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Checks that [off, off+size) is a 4096-aligned range inside the data region. */
static bool in_data(const struct moe_bundle *b, uint64_t off, uint64_t size) {
    return off % PAGE == 0 && off >= PAGE && off <= b->h.dir_offset &&
           size <= b->h.dir_offset - off;
}

/* Decodes the tensor table t[0..n). */
static enum moe_status parse_tensors(struct moe_bundle *b, const uint8_t *t, uint64_t n,
                                     uint64_t base) {
    struct cur c = {t, n, 0, base, b->label, "tensor table"};
    char nb[SHOW_CAP];
    enum moe_status rc;
    if ((rc = need(&c, 8, "tensor count")) != MOE_OK) return rc;
    uint64_t count = take64(&c);
    if (count > (n - 8) / (TENSOR_FIXED + 1)) {
        MOE_LOGE("%s: tensor table: tensor count %llu cannot fit in %llu bytes", b->label,
                 (unsigned long long)count, (unsigned long long)n);
        return MOE_ERR_FORMAT;
    }
    if (count) {
        b->tensors = calloc((size_t)count, sizeof *b->tensors);
        b->by_name = malloc((size_t)count * sizeof *b->by_name);
        if (!b->tensors || !b->by_name) {
            MOE_LOGE("%s: out of memory for %llu tensors", b->label, (unsigned long long)count);
            return MOE_ERR_NOMEM;
        }
    }
    for (uint64_t i = 0; i < count; i++) {
        uint64_t at = base + c.pos;
        if ((rc = need(&c, TENSOR_FIXED, "tensor record")) != MOE_OK) return rc;
        struct moe_bundle_tensor *x = &b->tensors[i];
        uint32_t nlen = take32(&c);
        x->type_id = take32(&c);
        x->n_dims = take32(&c);
        uint32_t reserved = take32(&c);
        for (int d = 0; d < MOE_BUNDLE_MAX_DIMS; d++) x->shape[d] = take64(&c);
        x->offset = take64(&c);
        x->size = take64(&c);
        x->checksum = take64(&c);
        if (nlen == 0 || nlen > MOE_BUNDLE_MAX_NAME) {
            MOE_LOGE("%s: tensor %llu (record at file offset %llu): name length %u is outside "
                     "1..%d",
                     b->label, (unsigned long long)i, (unsigned long long)at, nlen,
                     MOE_BUNDLE_MAX_NAME);
            return MOE_ERR_FORMAT;
        }
        if ((rc = need(&c, nlen, "tensor name")) != MOE_OK) return rc;
        if (!name_ok(c.p + c.pos, nlen, MOE_BUNDLE_MAX_NAME)) {
            MOE_LOGE("%s: tensor %llu (record at file offset %llu): name is not UTF-8 without "
                     "NUL or control characters",
                     b->label, (unsigned long long)i, (unsigned long long)at);
            return MOE_ERR_FORMAT;
        }
        if (!(x->name = dupn(c.p + c.pos, nlen))) {
            MOE_LOGE("%s: out of memory", b->label);
            return MOE_ERR_NOMEM;
        }
        b->n_tensors = (size_t)i + 1; /* count it so that free() releases the name */
        c.pos += nlen;
        const char *why = NULL;
        uint64_t ne = 1;
        if (reserved) why = "reserved field is not zero";
        if (!why && x->n_dims > MOE_BUNDLE_MAX_DIMS) why = "n_dims is larger than 4";
        for (uint32_t d = 0; !why && d < MOE_BUNDLE_MAX_DIMS; d++) {
            if (d >= x->n_dims) {
                if (x->shape[d]) why = "a dim beyond n_dims is not zero";
            } else if (x->shape[d] > INT64_MAX || (x->shape[d] && ne > INT64_MAX / x->shape[d])) {
                why = "element count overflows 63 bits";
            } else {
                ne *= x->shape[d];
            }
        }
        if (!why && !in_data(b, x->offset, x->size)) {
            MOE_LOGE("%s: tensor %s: data (offset %llu, %llu bytes) is not a 4096-aligned range "
                     "inside the data region [4096, %llu)",
                     b->label, show(x->name, nb, sizeof nb), (unsigned long long)x->offset,
                     (unsigned long long)x->size, (unsigned long long)b->h.dir_offset);
            return MOE_ERR_FORMAT;
        }
        if (why) {
            MOE_LOGE("%s: tensor %s (record at file offset %llu): %s", b->label,
                     show(x->name, nb, sizeof nb), (unsigned long long)at, why);
            return MOE_ERR_FORMAT;
        }
        x->data = b->base + x->offset;
        b->data_bytes += x->size;
        b->by_name[i] = x;
    }
    if (c.pos != n) {
        MOE_LOGE("%s: tensor table: %llu bytes after the last record", b->label,
                 (unsigned long long)(n - c.pos));
        return MOE_ERR_FORMAT;
    }
    if (b->n_tensors > 1) qsort(b->by_name, b->n_tensors, sizeof *b->by_name, cmp_tensor_name);
    for (size_t i = 1; i < b->n_tensors; i++) {
        if (strcmp(b->by_name[i - 1]->name, b->by_name[i]->name) == 0) {
            MOE_LOGE("%s: duplicate tensor name %s", b->label,
                     show(b->by_name[i]->name, nb, sizeof nb));
            return MOE_ERR_FORMAT;
        }
    }
    return MOE_OK;
}

/* Decodes the precision descriptors at the cursor. */
static enum moe_status parse_precisions(struct moe_bundle *b, struct cur *c) {
    enum moe_status rc;
    b->precisions = calloc(b->n_precisions, sizeof *b->precisions);
    if (!b->precisions) {
        MOE_LOGE("%s: out of memory", b->label);
        return MOE_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < b->n_precisions; i++) {
        struct moe_bundle_precision *p = &b->precisions[i];
        uint64_t at = c->base + c->pos;
        if ((rc = need(c, PRECISION_FIXED, "precision descriptor")) != MOE_OK) return rc;
        uint32_t nlen = take32(c);
        p->n_parts = take32(c);
        if (p->n_parts < 1 || p->n_parts > MOE_BUNDLE_MAX_PARTS) {
            MOE_LOGE("%s: precision %u (at file offset %llu): part count %u is outside 1..%d",
                     b->label, i, (unsigned long long)at, p->n_parts, MOE_BUNDLE_MAX_PARTS);
            return MOE_ERR_FORMAT;
        }
        if ((rc = need(c, (uint64_t)p->n_parts * PART_BYTES, "precision parts")) != MOE_OK)
            return rc;
        for (uint32_t k = 0; k < p->n_parts; k++) {
            p->parts[k].type_id = take32(c);
            uint32_t reserved = take32(c);
            p->parts[k].rows = take64(c);
            p->parts[k].cols = take64(c);
            p->parts[k].nbytes = take64(c);
            if (reserved) {
                MOE_LOGE("%s: precision %u part %u: reserved field is not zero", b->label, i, k);
                return MOE_ERR_FORMAT;
            }
        }
        if (nlen == 0 || nlen > MOE_BUNDLE_MAX_PRECISION_NAME ||
            need(c, nlen, "precision name") != MOE_OK || !precision_name_ok(c->p + c->pos, nlen)) {
            MOE_LOGE("%s: precision %u (at file offset %llu): name is not 1..%d bytes of "
                     "[A-Za-z0-9_.+-]",
                     b->label, i, (unsigned long long)at, MOE_BUNDLE_MAX_PRECISION_NAME);
            return MOE_ERR_FORMAT;
        }
        if (!(p->name = dupn(c->p + c->pos, nlen))) {
            MOE_LOGE("%s: out of memory", b->label);
            return MOE_ERR_NOMEM;
        }
        c->pos += nlen;
        const char *why = layout_parts(p);
        if (why) {
            MOE_LOGE("%s: precision %s: %s", b->label, p->name, why);
            return MOE_ERR_FORMAT;
        }
        for (uint32_t k = 0; k < i; k++) {
            if (strcmp(b->precisions[k].name, p->name) == 0) {
                MOE_LOGE("%s: duplicate precision name %s", b->label, p->name);
                return MOE_ERR_FORMAT;
            }
        }
    }
    return MOE_OK;
}

/* Checks one expert-table entry; NULL if fine, else why not. */
static const char *check_entry(const struct moe_bundle *b, const struct bundle_entry *x,
                               const struct moe_bundle_precision *p) {
    if (!(x->flags & ENTRY_PRESENT)) {
        if (x->flags || x->offset || x->stored || x->raw || x->checksum || x->stored_checksum ||
            x->compression)
            return "absent entry is not all zero";
        return NULL;
    }
    if (x->flags != ENTRY_PRESENT) return "unknown entry flags";
    if (x->compression > MOE_BUNDLE_COMP_ZSTD) return "unknown compression";
    if (x->raw != p->raw_size) return "raw size differs from the precision's laid-out size";
    if (x->compression == MOE_BUNDLE_COMP_NONE && x->stored != x->raw)
        return "stored size differs from raw size of an uncompressed blob";
    if (x->compression == MOE_BUNDLE_COMP_NONE && x->stored_checksum != x->checksum)
        return "stored checksum differs from raw checksum of an uncompressed blob";
    if (x->compression == MOE_BUNDLE_COMP_ZSTD && x->stored == 0) return "compressed blob is empty";
    if (!in_data(b, x->offset, x->stored))
        return "data is not a 4096-aligned range inside the data region";
    return NULL;
}

/* Decodes the expert section e[0..n). */
static enum moe_status parse_experts(struct moe_bundle *b, const uint8_t *e, uint64_t n,
                                     uint64_t base) {
    struct cur c = {e, n, 0, base, b->label, "expert section"};
    enum moe_status rc;
    char bn[SHOW_CAP];
    if ((rc = need(&c, EXPERT_FIXED, "expert counts")) != MOE_OK) return rc;
    b->n_layers = take32(&c);
    b->n_experts = take32(&c);
    b->n_precisions = take32(&c);
    uint32_t reserved = take32(&c);
    uint32_t L = b->n_layers, E = b->n_experts, P = b->n_precisions;
    if (reserved || ((L == 0 || E == 0 || P == 0) && (L | E | P)) || L > MAX_LAYERS ||
        E > MAX_EXPERTS || P > MOE_BUNDLE_MAX_PRECISIONS) {
        MOE_LOGE("%s: expert section: counts %u layers x %u experts x %u precisions (reserved "
                 "%u) are invalid: all zero or all non-zero, at most %u, %u and %d",
                 b->label, L, E, P, reserved, MAX_LAYERS, MAX_EXPERTS, MOE_BUNDLE_MAX_PRECISIONS);
        b->n_layers = b->n_experts = b->n_precisions = 0;
        return MOE_ERR_FORMAT;
    }
    if (P && (rc = parse_precisions(b, &c)) != MOE_OK) return rc;
    uint64_t count = (uint64_t)L * E * P; /* < 2^44: the limits above */
    uint64_t room = n - c.pos;
    if (count > room / ENTRY_BYTES || room != count * ENTRY_BYTES) {
        MOE_LOGE("%s: expert section: %u x %u x %u entries need %llu bytes but %llu remain", b->label,
                 L, E, P, (unsigned long long)(count * ENTRY_BYTES), (unsigned long long)room);
        return MOE_ERR_FORMAT;
    }
    if (count == 0) return MOE_OK;
    b->entries = malloc((size_t)count * sizeof *b->entries);
    b->layer_has = calloc(L, 1);
    if (!b->entries || !b->layer_has) {
        MOE_LOGE("%s: out of memory for %llu expert entries", b->label, (unsigned long long)count);
        return MOE_ERR_NOMEM;
    }
    for (uint32_t l = 0; l < L; l++) {
        uint64_t present = 0;
        for (uint32_t x = 0; x < E; x++) {
            for (uint32_t p = 0; p < P; p++) {
                struct bundle_entry *t = &b->entries[entry_index(b, l, x, p)];
                t->offset = take64(&c);
                t->stored = take64(&c);
                t->raw = take64(&c);
                t->checksum = take64(&c);
                t->stored_checksum = take64(&c);
                t->compression = take32(&c);
                t->flags = take32(&c);
                const char *why = check_entry(b, t, &b->precisions[p]);
                if (why) {
                    MOE_LOGE("%s: %s (entry at file offset %llu; offset %llu, stored %llu, raw "
                             "%llu): %s",
                             b->label, blob_name(b, l, x, p, bn, sizeof bn),
                             (unsigned long long)(c.base + c.pos - ENTRY_BYTES),
                             (unsigned long long)t->offset, (unsigned long long)t->stored,
                             (unsigned long long)t->raw, why);
                    return MOE_ERR_FORMAT;
                }
                if (t->flags & ENTRY_PRESENT) {
                    present++;
                    b->data_bytes += t->stored;
                    b->raw_blob_bytes += t->raw;
                }
            }
        }
        if (present != 0 && present != (uint64_t)E * P) {
            /* name the first absent blob of a layer that has experts */
            for (uint32_t x = 0; x < E; x++)
                for (uint32_t p = 0; p < P; p++)
                    if (!(b->entries[entry_index(b, l, x, p)].flags & ENTRY_PRESENT)) {
                        MOE_LOGE("%s: %s is absent but layer %u has %llu of %llu blobs (expert "
                                 "table incomplete)",
                                 b->label, blob_name(b, l, x, p, bn, sizeof bn), l,
                                 (unsigned long long)present, (unsigned long long)E * P);
                        return MOE_ERR_FORMAT;
                    }
        }
        b->layer_has[l] = present != 0;
    }
    return MOE_OK;
}

/* A byte range of the data region and who owns it (for the overlap check). */
struct region {
    uint64_t off, size;
    size_t who; /* < n_tensors: tensor; else entry index + n_tensors */
};

/* Orders regions by (offset, size). */
static int cmp_region(const void *a, const void *b) {
    const struct region *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    if (x->size != y->size) return x->size < y->size ? -1 : 1;
    return 0;
}

/* Names a region's owner into buf. */
static const char *region_name(const struct moe_bundle *b, size_t who, char *buf, size_t cap) {
    if (who < b->n_tensors) {
        char nb[SHOW_CAP];
        snprintf(buf, cap, "tensor %s", show(b->tensors[who].name, nb, sizeof nb));
        return buf;
    }
    size_t i = who - b->n_tensors, per_layer = (size_t)b->n_experts * b->n_precisions;
    uint32_t l = (uint32_t)(i / per_layer), e = (uint32_t)(i % per_layer / b->n_precisions),
             p = (uint32_t)(i % b->n_precisions);
    return blob_name(b, l, e, p, buf, cap);
}

/* Rejects any two tensors or blobs whose bytes overlap. */
static enum moe_status check_overlaps(struct moe_bundle *b) {
    size_t n_entries = (size_t)b->n_layers * b->n_experts * b->n_precisions, n = 0;
    char an[SHOW_CAP + 32], bn[SHOW_CAP + 32];
    enum moe_status rc = MOE_OK;
    if (b->n_tensors + n_entries == 0) return MOE_OK;
    struct region *r = malloc((b->n_tensors + n_entries) * sizeof *r);
    if (!r) {
        MOE_LOGE("%s: out of memory", b->label);
        return MOE_ERR_NOMEM;
    }
    for (size_t i = 0; i < b->n_tensors; i++)
        r[n++] = (struct region){b->tensors[i].offset, b->tensors[i].size, i};
    for (size_t i = 0; i < n_entries; i++)
        if (b->entries[i].flags & ENTRY_PRESENT)
            r[n++] = (struct region){b->entries[i].offset, b->entries[i].stored, b->n_tensors + i};
    qsort(r, n, sizeof *r, cmp_region);
    for (size_t i = 1; i < n; i++) {
        if (r[i - 1].off + r[i - 1].size > r[i].off) {
            MOE_LOGE("%s: %s (offset %llu, %llu bytes) overlaps %s (offset %llu)", b->label,
                     region_name(b, r[i - 1].who, an, sizeof an), (unsigned long long)r[i - 1].off,
                     (unsigned long long)r[i - 1].size, region_name(b, r[i].who, bn, sizeof bn),
                     (unsigned long long)r[i].off);
            rc = MOE_ERR_FORMAT;
            break;
        }
    }
    free(r);
    return rc;
}

/* Validates and decodes the directory. */
static enum moe_status parse_directory(struct moe_bundle *b) {
    const uint8_t *d = b->base + b->h.dir_offset;
    uint64_t n = b->h.dir_size, off = b->h.dir_offset;
    enum moe_status rc;
    if (hash(d, (size_t)n) != b->h.dir_checksum) {
        MOE_LOGE("%s: directory checksum mismatch (directory at offset %llu, %llu bytes, is "
                 "damaged)",
                 b->label, (unsigned long long)off, (unsigned long long)n);
        return MOE_ERR_FORMAT;
    }
    if (memcmp(d, DIR_MAGIC, 8) != 0) {
        MOE_LOGE("%s: directory at offset %llu: bad magic", b->label, (unsigned long long)off);
        return MOE_ERR_FORMAT;
    }
    uint64_t m = get64(d + 8), t = get64(d + 16), x = get64(d + 24), room = n - DIR_FIXED;
    if (m > room || t > room - m || x != room - m - t) {
        MOE_LOGE("%s: directory section sizes %llu + %llu + %llu do not add up to the %llu bytes "
                 "after the directory header",
                 b->label, (unsigned long long)m, (unsigned long long)t, (unsigned long long)x,
                 (unsigned long long)room);
        return MOE_ERR_FORMAT;
    }
    if ((rc = kv_decode(d + DIR_FIXED, m, off + DIR_FIXED, b->label, "metadata", &b->meta)) != MOE_OK)
        return rc;
    if ((rc = parse_tensors(b, d + DIR_FIXED + m, t, off + DIR_FIXED + m)) != MOE_OK) return rc;
    if ((rc = parse_experts(b, d + DIR_FIXED + m + t, x, off + DIR_FIXED + m + t)) != MOE_OK)
        return rc;
    return check_overlaps(b);
}

/* Checks a valid slot's payload completely and decodes it; NULL if usable. */
static const char *load_slot(const uint8_t *base, uint64_t size, uint64_t dend, const char *label,
                             const struct slot *s, char which, struct moe_bundle_kv **out,
                             enum moe_status *rc) {
    char what[48];
    *out = NULL;
    *rc = MOE_ERR_FORMAT;
    const char *why = slot_bounds(s, dend, size);
    if (why) return why;
    if (s->size == 0) {
        *rc = moe_bundle_kv_new(out);
        return *rc == MOE_OK ? NULL : "out of memory";
    }
    const uint8_t *p = base + s->offset;
    if (hash(p, (size_t)s->size) != s->checksum) return "payload checksum mismatch";
    snprintf(what, sizeof what, "tuning payload (slot %c)", which);
    *rc = kv_decode(p, s->size, s->offset, label, what, out);
    return *rc == MOE_OK ? NULL : "payload does not decode";
}

/* Picks the tuning slot readers use: the valid one with the highest sequence
 * (A on a tie) whose payload is usable, falling back to the other. */
static enum moe_status select_tuning(struct moe_bundle *b) {
    struct slot s[2];
    const char *why[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        s[i] = slot_parse(b->base + slot_offset[i]);
        if (s[i].state == SLOT_BAD) {
            why[i] = "slot record checksum mismatch (torn or damaged)";
            snprintf(b->slot_bad[i], sizeof b->slot_bad[i], "%s", why[i]);
        } else if (s[i].state == SLOT_EMPTY) {
            why[i] = "empty";
        }
    }
    int order[2] = {0, 1};
    if (s[1].state == SLOT_VALID && (s[0].state != SLOT_VALID || s[1].seq > s[0].seq)) {
        order[0] = 1;
        order[1] = 0;
    }
    for (int k = 0; k < 2; k++) {
        int i = order[k];
        if (s[i].state != SLOT_VALID) continue;
        enum moe_status rc;
        struct moe_bundle_kv *kv = NULL;
        why[i] = load_slot(b->base, b->size, dir_end(b), b->label, &s[i], (char)('A' + i), &kv, &rc);
        if (!why[i]) {
            b->tuning = kv;
            b->tslot = s[i];
            b->tslot_index = i;
            if (b->slot_bad[1 - i][0]) /* a run must say that it fell back, and to what */
                MOE_LOGW("%s: tuning slot %c is damaged (%s); using slot %c (sequence %llu, %zu tuning key%s) "
                         "instead: settings written by a later tuning update (e.g. a bit-width map) may be "
                         "missing. Run moe-prep inspect --verify, and rerun the tuning step to repair it.",
                         b->label, 'A' + (1 - i), b->slot_bad[1 - i], 'A' + i, (unsigned long long)s[i].seq,
                         moe_bundle_kv_count(kv), moe_bundle_kv_count(kv) == 1 ? "" : "s");
            return MOE_OK;
        }
        if (rc == MOE_ERR_NOMEM) return rc;
        snprintf(b->slot_bad[i], sizeof b->slot_bad[i], "sequence %llu: %s", (unsigned long long)s[i].seq,
                 why[i]);
    }
    MOE_LOGE("%s: no usable tuning slot (slot A: %s; slot B: %s)", b->label, why[0], why[1]);
    return MOE_ERR_FORMAT;
}

/* Validates an image (a map or a caller's buffer) into a new handle. */
static enum moe_status bundle_parse(struct moe_bundle *b) {
    enum moe_status rc;
    if (b->size < PAGE) {
        MOE_LOGE("%s: file is %llu bytes, shorter than the 4096-byte header page: truncated or "
                 "not a bundle",
                 b->label, (unsigned long long)b->size);
        return MOE_ERR_FORMAT;
    }
    if ((rc = header_parse(b->base, b->size, b->label, &b->h)) != MOE_OK) return rc;
    if ((rc = parse_directory(b)) != MOE_OK) return rc;
    return select_tuning(b);
}

/* Allocates a handle labelled `label` over buf[0..len). */
static struct moe_bundle *bundle_new(const char *label) {
    struct moe_bundle *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    if (!(b->label = dupn(label, strlen(label)))) {
        free(b);
        return NULL;
    }
    return b;
}

/* Opens an in-memory image (borrowed). */
enum moe_status moe_bundle_open_memory(const void *buf, size_t len, const char *label,
                                       struct moe_bundle **out) {
    enum moe_status rc;
    if (!out) return MOE_ERR_INVALID;
    *out = NULL;
    if (!label) label = "<memory>";
    if (!buf && len) {
        MOE_LOGE("%s: NULL buffer of %zu bytes", label, len);
        return MOE_ERR_INVALID;
    }
    struct moe_bundle *b = bundle_new(label);
    if (!b) {
        MOE_LOGE("%s: out of memory", label);
        return MOE_ERR_NOMEM;
    }
    b->base = buf;
    b->size = len;
    if ((rc = bundle_parse(b)) != MOE_OK) {
        moe_bundle_free(b);
        return rc;
    }
    *out = b;
    return MOE_OK;
}

/* Maps and opens a file. */
enum moe_status moe_bundle_open(const char *path, struct moe_bundle **out) {
    enum moe_status rc;
    if (!out) return MOE_ERR_INVALID;
    *out = NULL;
    if (!path) {
        MOE_LOGE("path is NULL");
        return MOE_ERR_INVALID;
    }
    struct moe_bundle *b = bundle_new(path);
    if (!b) {
        MOE_LOGE("%s: out of memory", path);
        return MOE_ERR_NOMEM;
    }
    if ((rc = moe_mmap_open(path, &b->map)) != MOE_OK) goto fail;
    b->base = b->map.data;
    b->size = b->map.size;
    if ((rc = bundle_parse(b)) != MOE_OK) goto fail;
    *out = b;
    return MOE_OK;
fail:
    moe_bundle_free(b);
    return rc;
}

/* Unmaps and frees everything the handle owns. */
void moe_bundle_free(struct moe_bundle *b) {
    if (!b) return;
    moe_mmap_close(&b->map);
    moe_bundle_kv_free(b->meta);
    moe_bundle_kv_free(b->tuning);
    for (size_t i = 0; i < b->n_tensors; i++) free((char *)b->tensors[i].name);
    free(b->tensors);
    free(b->by_name);
    if (b->precisions)
        for (uint32_t i = 0; i < b->n_precisions; i++) free((char *)b->precisions[i].name);
    free(b->precisions);
    free(b->entries);
    free(b->layer_has);
    free(b->label);
    free(b);
}

enum moe_status moe_bundle_open_fd(const struct moe_bundle *b, int *fd) {
    *fd = -1;
    if (!b || !b->map.ino) return MOE_ERR_UNSUPPORTED; /* from memory (or an empty file: nothing to read) */
    int d;
    enum moe_status rc = moe_file_open_read(b->label, &d); /* regular files only, never blocks */
    if (rc) return rc == MOE_ERR_NOT_FOUND ? MOE_ERR_IO : rc;
    struct stat st;
    if (fstat(d, &st) != 0 || (unsigned long long)st.st_dev != b->map.dev ||
        (unsigned long long)st.st_ino != b->map.ino || (uint64_t)st.st_size != b->size) {
        MOE_LOGE("%s: no longer the file that was opened (replaced or resized since): refusing to read experts "
                 "from it", b->label);
        close(d);
        return MOE_ERR_IO;
    }
    *fd = d;
    return MOE_OK;
}

/* The path or label given at open. */
const char *moe_bundle_path(const struct moe_bundle *b) { return b ? b->label : NULL; }

/* Sizes, version and tuning state. */
void moe_bundle_get_info(const struct moe_bundle *b, struct moe_bundle_info *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!b) return;
    out->version_major = b->h.major;
    out->version_minor = b->h.minor;
    out->file_size = b->size;
    out->dir_offset = b->h.dir_offset;
    out->dir_size = b->h.dir_size;
    out->data_bytes = b->data_bytes;
    out->raw_blob_bytes = b->raw_blob_bytes;
    out->tuning_slot = (char)('A' + b->tslot_index);
    out->tuning_sequence = b->tslot.seq;
    out->tuning_offset = b->tslot.offset;
    out->tuning_size = b->tslot.size;
    uint64_t live = b->tslot.size ? align_up(dir_end(b), PAGE) + b->tslot.size : dir_end(b);
    out->reclaimable_bytes = b->size > live ? b->size - live : 0;
}

/* The metadata set. */
const struct moe_bundle_kv *moe_bundle_meta(const struct moe_bundle *b) { return b ? b->meta : NULL; }

const char *moe_bundle_meta_str(const struct moe_bundle *b, const char *key) {
    return moe_bundle_kv_str(moe_bundle_meta(b), key);
}
enum moe_status moe_bundle_meta_i64(const struct moe_bundle *b, const char *key, int64_t *out) {
    return moe_bundle_kv_i64(moe_bundle_meta(b), key, out);
}
enum moe_status moe_bundle_meta_f64(const struct moe_bundle *b, const char *key, double *out) {
    return moe_bundle_kv_f64(moe_bundle_meta(b), key, out);
}
enum moe_status moe_bundle_meta_bool(const struct moe_bundle *b, const char *key, bool *out) {
    return moe_bundle_kv_bool(moe_bundle_meta(b), key, out);
}
const void *moe_bundle_meta_bytes(const struct moe_bundle *b, const char *key, size_t *n) {
    return moe_bundle_kv_bytes(moe_bundle_meta(b), key, n);
}
const int64_t *moe_bundle_meta_i64_array(const struct moe_bundle *b, const char *key, size_t *n) {
    return moe_bundle_kv_i64_array(moe_bundle_meta(b), key, n);
}
const double *moe_bundle_meta_f64_array(const struct moe_bundle *b, const char *key, size_t *n) {
    return moe_bundle_kv_f64_array(moe_bundle_meta(b), key, n);
}
const char *const *moe_bundle_meta_str_array(const struct moe_bundle *b, const char *key,
                                             size_t *n) {
    return moe_bundle_kv_str_array(moe_bundle_meta(b), key, n);
}

/* Number of non-expert tensors. */
size_t moe_bundle_tensor_count(const struct moe_bundle *b) { return b ? b->n_tensors : 0; }

/* The i-th tensor in directory order. */
const struct moe_bundle_tensor *moe_bundle_tensor_at(const struct moe_bundle *b, size_t i) {
    return b && i < b->n_tensors ? &b->tensors[i] : NULL;
}

/* Binary search over the name-sorted table. */
const struct moe_bundle_tensor *moe_bundle_find_tensor(const struct moe_bundle *b,
                                                       const char *name) {
    if (!b || !name || b->n_tensors == 0) return NULL;
    struct moe_bundle_tensor key;
    const struct moe_bundle_tensor *kp = &key;
    key.name = name;
    const struct moe_bundle_tensor *const *hit =
        bsearch(&kp, b->by_name, b->n_tensors, sizeof *b->by_name, cmp_tensor_name);
    return hit ? *hit : NULL;
}

/* Rehashes a tensor's bytes. */
enum moe_status moe_bundle_tensor_verify(const struct moe_bundle *b,
                                         const struct moe_bundle_tensor *t) {
    if (!b || !t) return MOE_ERR_INVALID;
    if (hash(t->data, (size_t)t->size) != t->checksum) {
        MOE_LOGE("%s: tensor %s: checksum mismatch (offset %llu, %llu bytes)", b->label, t->name,
                 (unsigned long long)t->offset, (unsigned long long)t->size);
        return MOE_ERR_FORMAT;
    }
    return MOE_OK;
}

/* Counts of the expert table. */
void moe_bundle_expert_layout(const struct moe_bundle *b, uint32_t *n_layers, uint32_t *n_experts,
                              uint32_t *n_precisions) {
    if (n_layers) *n_layers = b ? b->n_layers : 0;
    if (n_experts) *n_experts = b ? b->n_experts : 0;
    if (n_precisions) *n_precisions = b ? b->n_precisions : 0;
}

/* Whether a layer stores experts. */
bool moe_bundle_layer_has_experts(const struct moe_bundle *b, uint32_t layer) {
    return b && layer < b->n_layers && b->layer_has[layer];
}

/* The i-th precision descriptor. */
const struct moe_bundle_precision *moe_bundle_precision_at(const struct moe_bundle *b, uint32_t i) {
    return b && i < b->n_precisions ? &b->precisions[i] : NULL;
}

/* Looks a precision up by name. */
enum moe_status moe_bundle_find_precision(const struct moe_bundle *b, const char *name,
                                          uint32_t *index) {
    if (!b || !name) return MOE_ERR_INVALID;
    for (uint32_t i = 0; i < b->n_precisions; i++) {
        if (strcmp(b->precisions[i].name, name) == 0) {
            if (index) *index = i;
            return MOE_OK;
        }
    }
    return MOE_ERR_NOT_FOUND;
}

/* Describes one blob. */
enum moe_status moe_bundle_expert(const struct moe_bundle *b, uint32_t layer, uint32_t expert,
                                  uint32_t precision, struct moe_bundle_blob *out) {
    if (!b || !out) return MOE_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if (layer >= b->n_layers || expert >= b->n_experts || precision >= b->n_precisions) {
        MOE_LOGE("%s: layer %u expert %u precision %u is out of range (%u x %u x %u)", b->label,
                 layer, expert, precision, b->n_layers, b->n_experts, b->n_precisions);
        return MOE_ERR_RANGE;
    }
    if (!b->layer_has[layer]) {
        MOE_LOGE("%s: layer %u has no experts (dense layer)", b->label, layer);
        return MOE_ERR_NOT_FOUND;
    }
    const struct bundle_entry *x = &b->entries[entry_index(b, layer, expert, precision)];
    out->layer = layer;
    out->expert = expert;
    out->precision = precision;
    out->desc = &b->precisions[precision];
    out->stored = b->base + x->offset;
    out->offset = x->offset;
    out->stored_size = x->stored;
    out->raw_size = x->raw;
    out->compression = x->compression;
    out->checksum = x->checksum;
    out->stored_checksum = x->stored_checksum;
    return MOE_OK;
}

/* Checks a zstd blob's frame: one frame declaring raw_size content bytes and
 * filling the stored bytes exactly. NULL if fine, else why not. */
static const char *zstd_frame_check(const void *src, uint64_t stored, uint64_t raw) {
    unsigned long long fcs = ZSTD_getFrameContentSize(src, (size_t)stored);
    if (fcs == ZSTD_CONTENTSIZE_ERROR) return "not a zstd frame";
    if (fcs == ZSTD_CONTENTSIZE_UNKNOWN) return "zstd frame does not declare its content size";
    if (fcs != raw) return "zstd frame content size differs from the raw size";
    size_t fsz = ZSTD_findFrameCompressedSize(src, (size_t)stored);
    if (ZSTD_isError(fsz)) return "malformed or truncated zstd frame";
    if (fsz != stored) return "bytes after the zstd frame";
    return NULL;
}

/* Hashes the raw bytes of a zstd blob by decompressing 64 KiB at a time (no
 * raw-sized buffer). NULL if it decodes to exactly raw bytes, else why not. */
static const char *zstd_stream_hash(const void *src, uint64_t stored, uint64_t raw,
                                    uint64_t *h, char *why, size_t cap) {
    const char *r = NULL;
    ZSTD_DStream *ds = ZSTD_createDStream();
    XXH3_state_t *st = XXH3_createState();
    uint8_t *buf = malloc(VERIFY_CHUNK);
    if (!ds || !st || !buf) {
        r = "out of memory";
        goto done;
    }
    ZSTD_initDStream(ds);
    XXH3_64bits_reset(st);
    ZSTD_inBuffer in = {src, (size_t)stored, 0};
    uint64_t total = 0;
    for (;;) {
        ZSTD_outBuffer o = {buf, VERIFY_CHUNK, 0};
        size_t ret = ZSTD_decompressStream(ds, &o, &in);
        if (ZSTD_isError(ret)) {
            snprintf(why, cap, "zstd: %s", ZSTD_getErrorName(ret));
            r = why;
            goto done;
        }
        total += o.pos;
        if (total > raw) {
            r = "zstd frame decodes to more than the raw size";
            goto done;
        }
        XXH3_64bits_update(st, buf, o.pos);
        if (ret == 0) break;
        if (in.pos == in.size && o.pos < o.size) {
            r = "truncated zstd frame";
            goto done;
        }
    }
    if (total != raw) r = "zstd frame decodes to fewer bytes than the raw size";
    *h = XXH3_64bits_digest(st);
done:
    free(buf);
    XXH3_freeState(st);
    ZSTD_freeDStream(ds);
    return r;
}

/* Checks (and with dst, decodes) a blob from `stored`; NULL if good, else why
 * not (in `why` or a constant). *rc gets the status. */
static const char *blob_check(const struct moe_bundle_blob *x, const void *stored, void *dst,
                              size_t dst_size, char *why, size_t cap, enum moe_status *rc) {
    uint64_t h = 0;
    const char *r = NULL;
    *rc = MOE_ERR_FORMAT;
    if (dst && dst_size < x->raw_size) {
        snprintf(why, cap, "destination of %zu bytes is smaller than the %llu-byte blob", dst_size,
                 (unsigned long long)x->raw_size);
        *rc = MOE_ERR_RANGE;
        return why;
    }
    if (x->compression == MOE_BUNDLE_COMP_NONE) {
        if (dst) {
            memcpy(dst, stored, (size_t)x->raw_size);
            h = hash(dst, (size_t)x->raw_size);
        } else {
            h = hash(stored, (size_t)x->raw_size);
        }
    } else if (hash(stored, (size_t)x->stored_size) != x->stored_checksum) {
        /* a flipped bit can leave a zstd frame decoding to the same output, so
         * the stored bytes carry their own checksum (checked before decoding) */
        return "checksum mismatch of the stored (compressed) bytes";
    } else if ((r = zstd_frame_check(stored, x->stored_size, x->raw_size)) != NULL) {
        return r;
    } else if (dst) {
        size_t got = ZSTD_decompress(dst, (size_t)x->raw_size, stored, (size_t)x->stored_size);
        if (ZSTD_isError(got)) {
            snprintf(why, cap, "zstd: %s", ZSTD_getErrorName(got));
            return why;
        }
        if (got != x->raw_size) return "zstd frame decodes to fewer bytes than the raw size";
        h = hash(dst, (size_t)x->raw_size);
    } else if ((r = zstd_stream_hash(stored, x->stored_size, x->raw_size, &h, why, cap)) != NULL) {
        if (strcmp(r, "out of memory") == 0) *rc = MOE_ERR_NOMEM;
        return r;
    }
    if (h != x->checksum) return "checksum mismatch";
    *rc = MOE_OK;
    return NULL;
}

/* Decodes a caller-read copy of a blob's stored bytes. */
enum moe_status moe_bundle_blob_decode(const struct moe_bundle *b,
                                       const struct moe_bundle_blob *blob, const void *stored,
                                       void *dst, size_t dst_size) {
    char why[160], bn[SHOW_CAP];
    enum moe_status rc;
    if (!b || !blob || !blob->desc || !stored || !dst) return MOE_ERR_INVALID;
    const char *r = blob_check(blob, stored, dst, dst_size, why, sizeof why, &rc);
    if (r)
        MOE_LOGE("%s: %s: %s", b->label,
                 blob_name(b, blob->layer, blob->expert, blob->precision, bn, sizeof bn), r);
    return rc;
}

/* Copies or decompresses a blob into dst and checks it. */
enum moe_status moe_bundle_expert_load(const struct moe_bundle *b, uint32_t layer, uint32_t expert,
                                       uint32_t precision, void *dst, size_t dst_size) {
    struct moe_bundle_blob x;
    enum moe_status rc = moe_bundle_expert(b, layer, expert, precision, &x);
    if (rc != MOE_OK) return rc;
    return moe_bundle_blob_decode(b, &x, x.stored, dst, dst_size);
}

/* Checks one blob without a destination. */
enum moe_status moe_bundle_expert_verify(const struct moe_bundle *b, uint32_t layer,
                                         uint32_t expert, uint32_t precision) {
    struct moe_bundle_blob x;
    char why[160], bn[SHOW_CAP];
    enum moe_status rc = moe_bundle_expert(b, layer, expert, precision, &x);
    if (rc != MOE_OK) return rc;
    const char *r = blob_check(&x, x.stored, NULL, 0, why, sizeof why, &rc);
    if (r) MOE_LOGE("%s: %s: %s", b->label, blob_name(b, layer, expert, precision, bn, sizeof bn), r);
    return rc;
}

/* The active tuning set. */
const struct moe_bundle_kv *moe_bundle_tuning(const struct moe_bundle *b) {
    return b ? b->tuning : NULL;
}

/* Reports one failure to fn, or logs it. */
static void report(const struct moe_bundle *b, moe_bundle_failure_fn fn, void *user,
                   const char *item, const char *problem, int *n_bad) {
    (*n_bad)++;
    if (fn)
        fn(item, problem, user);
    else
        MOE_LOGE("%s: %s: %s", b->label, item, problem);
}

/* Recomputes every checksum in the file. */
enum moe_status moe_bundle_verify_all(const struct moe_bundle *b, moe_bundle_failure_fn fn,
                                      void *user) {
    char item[SHOW_CAP + 32], why[160], nb[SHOW_CAP];
    int bad = 0;
    if (!b) return MOE_ERR_INVALID;
    if (hash(b->base, HDR_CHECKED) != b->h.checksum)
        report(b, fn, user, "header", "checksum mismatch", &bad);
    if (hash(b->base + b->h.dir_offset, (size_t)b->h.dir_size) != b->h.dir_checksum)
        report(b, fn, user, "directory", "checksum mismatch", &bad);
    snprintf(item, sizeof item, "tuning slot %c", 'A' + b->tslot_index);
    if (b->tslot.size && hash(b->base + b->tslot.offset, (size_t)b->tslot.size) != b->tslot.checksum)
        report(b, fn, user, item, "payload checksum mismatch", &bad);
    for (int i = 0; i < 2; i++) /* a damaged slot is damage, whichever slot readers fell back to */
        if (b->slot_bad[i][0]) {
            snprintf(item, sizeof item, "tuning slot %c", 'A' + i);
            report(b, fn, user, item, b->slot_bad[i], &bad);
        }
    for (size_t i = 0; i < b->n_tensors; i++) {
        const struct moe_bundle_tensor *t = &b->tensors[i];
        if (hash(t->data, (size_t)t->size) != t->checksum) {
            snprintf(item, sizeof item, "tensor %s", show(t->name, nb, sizeof nb));
            report(b, fn, user, item, "checksum mismatch", &bad);
        }
    }
    for (uint32_t l = 0; l < b->n_layers; l++) {
        if (!b->layer_has[l]) continue;
        for (uint32_t e = 0; e < b->n_experts; e++) {
            for (uint32_t p = 0; p < b->n_precisions; p++) {
                struct moe_bundle_blob x;
                enum moe_status rc;
                moe_bundle_expert(b, l, e, p, &x);
                const char *r = blob_check(&x, x.stored, NULL, 0, why, sizeof why, &rc);
                if (r) report(b, fn, user, blob_name(b, l, e, p, item, sizeof item), r, &bad);
            }
        }
    }
    return bad ? MOE_ERR_FORMAT : MOE_OK;
}

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
    struct moe_bundle_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(final_path);
    if (!w) goto nomem;
    w->fd = -1;
    if (pthread_mutex_init(&w->mu, NULL) != 0) {
        free(w);
        goto nomem;
    }
    w->final_path = dupn(final_path, n);
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
    w->cursor = PAGE;
    *out = w;
    return MOE_OK;
fail_nomem:
    MOE_LOGE("%s: out of memory", final_path);
fail:
    free(w->tmp_path);
    w->tmp_path = NULL; /* nothing was created: free must not unlink */
    moe_bundle_writer_free(w);
    return rc;
nomem:
    MOE_LOGE("%s: out of memory", final_path);
    return MOE_ERR_NOMEM;
}

/* Unlinks the temp file (unless finished) and frees. */
void moe_bundle_writer_abort(struct moe_bundle_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    if (w->state != W_FINISHED && w->tmp_path) unlink(w->tmp_path);
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

/* Writes bytes reserved at off; on failure marks the writer failed. */
static enum moe_status write_reserved(struct moe_bundle_writer *w, const void *data, uint64_t n,
                                      uint64_t off, const char *what) {
    int err = pwrite_all(w->fd, data, n, off);
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
    if (!name || !name_ok((const uint8_t *)name, strlen(name), MOE_BUNDLE_MAX_NAME)) {
        MOE_LOGE("%s: tensor name %s: names are 1..%d bytes of UTF-8 without control characters",
                 w->final_path, name ? show(name, nb, sizeof nb) : "(NULL)", MOE_BUNDLE_MAX_NAME);
        return MOE_ERR_INVALID;
    }
    if (n_dims > MOE_BUNDLE_MAX_DIMS || (n_dims && !shape) || (nbytes && !data)) {
        MOE_LOGE("%s: tensor %s: n_dims %u > 4, or NULL shape or data", w->final_path,
                 show(name, nb, sizeof nb), n_dims);
        return MOE_ERR_INVALID;
    }
    uint64_t ne = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (shape[d] > INT64_MAX || (shape[d] && ne > INT64_MAX / shape[d])) {
            MOE_LOGE("%s: tensor %s: element count overflows 63 bits", w->final_path,
                     show(name, nb, sizeof nb));
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
    if (!(t.name = dupn(name, strlen(name)))) {
        MOE_LOGE("%s: out of memory", w->final_path);
        return MOE_ERR_NOMEM;
    }
    pthread_mutex_lock(&w->mu);
    rc = w_usable(w, w->state);
    for (size_t i = 0; rc == MOE_OK && i < w->n_tensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0) {
            MOE_LOGE("%s: duplicate tensor name %s", w->final_path, show(name, nb, sizeof nb));
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
        if (!name || !precision_name_ok((const uint8_t *)name, strlen(name)))
            why = "name is not 1..63 bytes of [A-Za-z0-9_.+-]";
        p[i].name = NULL;
        if (!why) why = layout_parts(&p[i]);
        for (uint32_t k = 0; !why && k < i; k++)
            if (strcmp(p[k].name, name) == 0) why = "duplicate name";
        if (why) {
            char nb[SHOW_CAP];
            MOE_LOGE("%s: precision %u (%s): %s", w->final_path, i,
                     name ? show(name, nb, sizeof nb) : "NULL", why);
            rc = MOE_ERR_INVALID;
        } else if (!(p[i].name = dupn(name, strlen(name)))) {
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
    kv_encode(tuning, &b); /* a round trip through the codec is the deep copy */
    if (b.oom) {
        rc = MOE_ERR_NOMEM;
        MOE_LOGE("%s: out of memory", w->final_path);
    } else {
        rc = kv_decode(b.p, b.n, 0, w->final_path, "tuning", &copy);
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
    kv_encode(w->meta, &m);
    uint64_t t_size = 8, x_size = EXPERT_FIXED;
    for (size_t i = 0; i < w->n_tensors; i++) t_size += TENSOR_FIXED + strlen(w->tensors[i].name);
    for (uint32_t i = 0; i < w->n_precisions; i++)
        x_size += PRECISION_FIXED + w->precisions[i].n_parts * PART_BYTES +
                  strlen(w->precisions[i].name);
    x_size += (uint64_t)w->n_layers * w->n_experts * w->n_precisions * ENTRY_BYTES;
    wb_put(d, DIR_MAGIC, 8);
    wb_u64(d, m.n);
    wb_u64(d, t_size);
    wb_u64(d, x_size);
    wb_put(d, m.p, m.n);
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
        wb_put(d, t->name, strlen(t->name));
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
        wb_put(d, p->name, strlen(p->name));
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

/* fsyncs the directory holding path (after a rename). 0 or errno. */
static int fsync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? dupn(path, slash == path ? 1 : (size_t)(slash - path)) : dupn(".", 1);
    if (!dir) return ENOMEM;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = 0;
    if (fd < 0 || fsync(fd) != 0) err = errno;
    if (err == EINVAL) err = 0; /* file systems that cannot sync directories */
    if (fd >= 0) close(fd);
    free(dir);
    return err;
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
    if (moe_bundle_kv_count(w->tuning)) kv_encode(w->tuning, &t);
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
    header_build(page, dir_off, d.n, hash(d.p, d.n));
    slot_build(page + slot_offset[0], 1, t_off, t.n, hash(t.p, t.n));
    if ((rc = write_reserved(w, d.p, d.n, dir_off, "the directory")) != MOE_OK) goto done;
    if (t.n && (rc = write_reserved(w, t.p, t.n, t_off, "the tuning payload")) != MOE_OK) goto done;
    if ((rc = write_reserved(w, page, PAGE, 0, "the header page")) != MOE_OK) goto done;
    int err = fsync(w->fd) != 0 ? errno : 0;
    if (!err && close(w->fd) != 0) err = errno;
    w->fd = -1;
    if (!err && rename(w->tmp_path, w->final_path) != 0) err = errno;
    if (err) {
        MOE_LOGE("%s: committing the bundle (fsync, close, rename to %s): %s", w->tmp_path,
                 w->final_path, strerror(err));
        w->state = W_FAILED;
        rc = MOE_ERR_IO;
        goto done;
    }
    w->state = W_FINISHED;
    if ((err = fsync_parent(w->final_path)) != 0) {
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

/* ------------------------------------------------------------------------- */
/* crash-safe tuning replacement                                              */

/* Reads and checks one valid slot's payload through fd, as a reader would. */
static bool slot_usable_fd(int fd, const struct slot *s, uint64_t dend, uint64_t size,
                           const char *label, char which) {
    if (slot_bounds(s, dend, size)) return false;
    if (s->size == 0) return true;
    uint8_t *buf = malloc((size_t)s->size);
    struct moe_bundle_kv *kv = NULL;
    enum moe_status rc;
    bool ok = false;
    if (buf && pread_all(fd, buf, s->size, s->offset) == 0 &&
        hash(buf, (size_t)s->size) == s->checksum) {
        char what[48];
        snprintf(what, sizeof what, "tuning payload (slot %c)", which);
        rc = kv_decode(buf, s->size, s->offset, label, what, &kv);
        ok = rc == MOE_OK;
    }
    moe_bundle_kv_free(kv);
    free(buf);
    return ok;
}

/* Decides which slot readers use now, which one to overwrite, the next
 * sequence and the end of everything still referenced. */
static void plan_replace(int fd, const uint8_t *page, const struct hdr *h, uint64_t size,
                         const char *label, int *target, uint64_t *seq, uint64_t *live_end) {
    struct slot s[2];
    bool usable[2];
    uint64_t dend = h->dir_offset + h->dir_size, max_seq = 0;
    *live_end = dend;
    for (int i = 0; i < 2; i++) {
        s[i] = slot_parse(page + slot_offset[i]);
        usable[i] = s[i].state == SLOT_VALID &&
                    slot_usable_fd(fd, &s[i], dend, size, label, (char)('A' + i));
        if (s[i].state == SLOT_VALID) {
            if (s[i].seq > max_seq) max_seq = s[i].seq;
            if (s[i].size && s[i].offset <= size && s[i].size <= size - s[i].offset &&
                s[i].offset + s[i].size > *live_end)
                *live_end = s[i].offset + s[i].size;
        }
    }
    int active = -1;
    if (usable[0] && usable[1])
        active = s[1].seq > s[0].seq ? 1 : 0;
    else if (usable[0] || usable[1])
        active = usable[0] ? 0 : 1;
    if (active >= 0)
        *target = 1 - active;
    else /* nothing usable: overwrite a slot that is not valid, else the older one */
        *target = s[0].state != SLOT_VALID ? 0 : s[1].state != SLOT_VALID ? 1 : (s[0].seq <= s[1].seq ? 0 : 1);
    *seq = max_seq + 1;
}

/* Replaces the tuning payload of the bundle at path, crash-safely. */
enum moe_status moe_bundle_replace_tuning(const char *path, const struct moe_bundle_kv *tuning) {
    enum moe_status rc = MOE_ERR_IO;
    struct wbuf t = {0};
    uint8_t page[PAGE], slot[SLOT_SIZE];
    struct hdr h;
    struct stat st;
    int err = 0;
    if (!path) return MOE_ERR_INVALID;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        err = errno;
        MOE_LOGE("%s: cannot open for update: %s", path, strerror(err));
        return err == ENOENT ? MOE_ERR_NOT_FOUND : MOE_ERR_IO;
    }
    if (flock(fd, LOCK_EX) != 0)
        MOE_LOGW("%s: cannot lock (%s); make sure no other replacement runs", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        MOE_LOGE("%s: not a regular file", path);
        goto done;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < PAGE) {
        MOE_LOGE("%s: file is %llu bytes, shorter than the 4096-byte header page", path,
                 (unsigned long long)size);
        rc = MOE_ERR_FORMAT;
        goto done;
    }
    if ((err = pread_all(fd, page, PAGE, 0)) != 0) {
        MOE_LOGE("%s: reading the header page: %s", path, strerror(err));
        goto done;
    }
    if ((rc = header_parse(page, size, path, &h)) != MOE_OK) goto done;
    rc = MOE_ERR_IO;
    int target;
    uint64_t seq, live_end;
    plan_replace(fd, page, &h, size, path, &target, &seq, &live_end);
    if (moe_bundle_kv_count(tuning)) kv_encode(tuning, &t);
    if (t.oom) {
        MOE_LOGE("%s: out of memory", path);
        rc = MOE_ERR_NOMEM;
        goto done;
    }
    if (t.n > MOE_BUNDLE_MAX_TUNING || seq == 0) {
        MOE_LOGE("%s: tuning payload of %zu bytes exceeds %llu, or the sequence is exhausted", path,
                 t.n, MOE_BUNDLE_MAX_TUNING);
        rc = MOE_ERR_RANGE;
        goto done;
    }
    if (size > live_end) { /* the orphan of a replacement that crashed before its slot write */
        if (ftruncate(fd, (off_t)live_end) != 0) {
            MOE_LOGE("%s: dropping %llu orphaned tail bytes: %s", path,
                     (unsigned long long)(size - live_end), strerror(errno));
            goto done;
        }
        MOE_LOGI("%s: dropped %llu orphaned bytes at the end of the file", path,
                 (unsigned long long)(size - live_end));
    }
    uint64_t off = t.n ? align_up(live_end, PAGE) : 0;
    if (t.n && (err = pwrite_all(fd, t.p, t.n, off)) != 0) {
        MOE_LOGE("%s: appending the tuning payload at offset %llu: %s", path,
                 (unsigned long long)off, strerror(err));
        goto done;
    }
    if (fsync(fd) != 0) {
        MOE_LOGE("%s: fsync after appending the tuning payload: %s", path, strerror(errno));
        goto done;
    }
    slot_build(slot, seq, off, t.n, hash(t.p, t.n));
    if ((err = pwrite_all(fd, slot, SLOT_SIZE, slot_offset[target])) != 0 || fsync(fd) != 0) {
        MOE_LOGE("%s: writing tuning slot %c: %s", path, 'A' + target,
                 strerror(err ? err : errno));
        goto done;
    }
    rc = MOE_OK;
done:
    free(t.p);
    close(fd); /* releases the lock */
    return rc;
}

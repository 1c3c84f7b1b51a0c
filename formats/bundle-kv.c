/*
 * bundle-kv.c - typed key/value sets (metadata and tuning) and their KV block
 * codec for the bundle container (.moeb), plus the pieces every bundle module
 * shares: name checks, whole-buffer I/O, the growable output buffer, the
 * precision layout and the header page and tuning slot records.
 * docs/format.md is the byte-exact specification; formats/moe-bundle.h is the
 * manual of the API; bundle-impl.h declares what the other bundle-*.c use.
 */
#include "bundle-impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe-base.h"

/* ------------------------------------------------------------------------- */
/* small helpers                                                              */

/* Copies an untrusted name into buf for a log message: control bytes become '?'
 * and long names are cut and marked with "...". */
const char *bundle_show(const char *s, char *buf, size_t cap) {
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
char *bundle_dupn(const void *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* True if s[0..n) is strict UTF-8 (Unicode Table 3-7: no overlongs, no
 * surrogates, nothing above U+10FFFF). */
static bool utf8_ok(const uint8_t *s, size_t n) { return moe_utf8_bad_offset(s, n) == n; }

/* True if s[0..n) is a valid name: 1..max bytes of UTF-8 with no control
 * characters (keys and tensor names). */
bool bundle_name_ok(const uint8_t *s, size_t n, size_t max) {
    if (n == 0 || n > max || !utf8_ok(s, n)) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] == 0x7f) return false;
    return true;
}

/* True if s[0..n) is UTF-8 text without NUL bytes (string values). */
static bool text_ok(const uint8_t *s, size_t n) { return !memchr(s, 0, n) && utf8_ok(s, n); }

/* True if s[0..n) is a precision name: 1..63 bytes of [A-Za-z0-9_.+-]. */
bool bundle_precision_name_ok(const uint8_t *s, size_t n) {
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
int bundle_pwrite_all(int fd, const void *buf, uint64_t n, uint64_t off) {
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
int bundle_pread_all(int fd, void *buf, uint64_t n, uint64_t off) {
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

/* Appends k bytes (zeros when src is NULL); sets oom instead of failing. */
void bundle_wb_put(struct wbuf *b, const void *src, size_t k) {
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
    if (!bundle_name_ok((const uint8_t *)key, n, MOE_BUNDLE_MAX_KEY)) {
        MOE_LOGE("key %s: keys are 1..%d bytes of UTF-8 without control characters",
                 bundle_show(key, kb, sizeof kb), MOE_BUNDLE_MAX_KEY);
        return MOE_ERR_INVALID;
    }
    e->key = bundle_dupn(key, n);
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
        MOE_LOGE("key %s: string value is not valid UTF-8", bundle_show(key, kb, sizeof kb));
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
            MOE_LOGE("key %s: element %zu is NULL or not valid UTF-8", bundle_show(key, kb, sizeof kb), i);
            entry_free(&e);
            return MOE_ERR_INVALID;
        }
    }
    if ((rc = entry_alloc(&e, n, sizeof(char *))) != MOE_OK) return rc;
    char **s = e.data;
    for (size_t i = 0; i < n; i++) {
        s[i] = bundle_dupn(v[i], strlen(v[i]));
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
void bundle_kv_encode(const struct moe_bundle_kv *kv, struct wbuf *b) {
    size_t n = kv ? kv->n : 0;
    wb_u64(b, n);
    for (size_t i = 0; i < n; i++) {
        const struct kv_entry *e = &kv->e[i];
        size_t klen = strlen(e->key);
        wb_u32(b, (uint32_t)klen);
        wb_u32(b, (uint32_t)e->type);
        wb_u64(b, entry_value_len(e));
        bundle_wb_put(b, e->key, klen);
        switch (e->type) {
        case MOE_KV_STRING:
        case MOE_KV_BYTES: bundle_wb_put(b, e->data, e->count); break;
        case MOE_KV_I64: wb_u64(b, (uint64_t)e->v.i); break;
        case MOE_KV_F64: {
            uint64_t bits;
            memcpy(&bits, &e->v.f, 8);
            wb_u64(b, bits);
            break;
        }
        case MOE_KV_BOOL: bundle_wb_put(b, &(uint8_t){e->v.b ? 1 : 0}, 1); break;
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
                bundle_wb_put(b, sk, sl);
            }
            break;
        }
    }
}

/* Checks that k more bytes are available; logs what was being read. */
enum moe_status bundle_need(struct cur *c, uint64_t k, const char *field) {
    if (k <= c->n - c->pos) return MOE_OK;
    MOE_LOGE("%s: %s: %s at file offset %llu needs %llu bytes but only %llu remain in the section",
             c->label, c->what, field, (unsigned long long)(c->base + c->pos),
             (unsigned long long)k, (unsigned long long)(c->n - c->pos));
    return MOE_ERR_FORMAT;
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
            } else if (!(s[k] = bundle_dupn(v + pos, (size_t)sl))) {
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
             bundle_show(e->key, kb, sizeof kb), (unsigned long long)at, why);
    return MOE_ERR_FORMAT;
}

/* Decodes a KV block that must fill p[0..n) exactly. Keys must be valid and in
 * strictly increasing byte order (so unique); the count is checked against the
 * room before anything is allocated. */
enum moe_status bundle_kv_decode(const uint8_t *p, uint64_t n, uint64_t base, const char *label,
                                 const char *what, struct moe_bundle_kv **out) {
    struct cur c = {p, n, 0, base, label, what};
    struct moe_bundle_kv *kv = NULL;
    struct kv_entry e = {0};
    enum moe_status rc = MOE_ERR_FORMAT;
    char kb[SHOW_CAP], pb[SHOW_CAP];
    *out = NULL;
    if ((rc = bundle_need(&c, 8, "entry count")) != MOE_OK) return rc;
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
        if (bundle_need(&c, KV_ENTRY_FIXED, "entry header") != MOE_OK) goto fail;
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
        if (bundle_need(&c, klen, "key") != MOE_OK) goto fail;
        if (vlen > c.n - c.pos - klen) { /* not klen + vlen: that sum can wrap */
            MOE_LOGE("%s: %s: entry at file offset %llu: value of %llu bytes runs past the "
                     "section (%llu bytes remain)",
                     label, what, (unsigned long long)at, (unsigned long long)vlen,
                     (unsigned long long)(c.n - c.pos - klen));
            goto fail;
        }
        const uint8_t *k = c.p + c.pos;
        if (!bundle_name_ok(k, klen, MOE_BUNDLE_MAX_KEY)) {
            MOE_LOGE("%s: %s: entry at file offset %llu: key is not UTF-8 without control "
                     "characters",
                     label, what, (unsigned long long)at);
            goto fail;
        }
        memset(&e, 0, sizeof e);
        e.type = (enum moe_bundle_kv_type)type;
        if (!(e.key = bundle_dupn(k, klen))) {
            rc = MOE_ERR_NOMEM;
            MOE_LOGE("%s: %s: out of memory", label, what);
            goto fail;
        }
        if (kv->n > 0 && strcmp(kv->e[kv->n - 1].key, e.key) >= 0) {
            MOE_LOGE("%s: %s: key %s at file offset %llu is %s key %s (keys must be unique and "
                     "in byte order)",
                     label, what, bundle_show(e.key, kb, sizeof kb), (unsigned long long)at,
                     strcmp(kv->e[kv->n - 1].key, e.key) == 0 ? "a duplicate of" : "not after",
                     bundle_show(kv->e[kv->n - 1].key, pb, sizeof pb));
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
const char *bundle_layout_parts(struct moe_bundle_precision *p) {
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
    const char *why = bundle_layout_parts(p);
    if (why) {
        MOE_LOGE("precision %s: %s", p->name ? p->name : "(unnamed)", why);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* ------------------------------------------------------------------------- */
/* header page                                                                */

/* Writes the 128-byte header into page (the rest of the page is the caller's). */
void bundle_header_build(uint8_t *page, uint64_t dir_offset, uint64_t dir_size,
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
enum moe_status bundle_header_parse(const uint8_t *page, uint64_t file_size, const char *label,
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

/* Writes a valid slot record. */
void bundle_slot_build(uint8_t *s, uint64_t seq, uint64_t offset, uint64_t size, uint64_t checksum) {
    memset(s, 0, SLOT_SIZE);
    memcpy(s, SLOT_MAGIC, 8);
    put64(s + 8, seq);
    put64(s + 16, offset);
    put64(s + 24, size);
    put64(s + 32, checksum);
    put64(s + SLOT_CHECKED, hash(s, SLOT_CHECKED));
}

/* Classifies a 64-byte slot record: empty (all zero), bad (torn or damaged) or valid. */
struct slot bundle_slot_parse(const uint8_t *s) {
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
const char *bundle_slot_bounds(const struct slot *s, uint64_t dir_end, uint64_t file_size) {
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

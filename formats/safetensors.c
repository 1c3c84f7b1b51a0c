/*
 * safetensors.c - zero-copy, strictly validated reader for safetensors checkpoints.
 *
 * File layout (https://github.com/huggingface/safetensors):
 *   u64 little-endian N | N bytes of UTF-8 JSON header | data region
 * The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
 * (offsets relative to the start of the data region) plus an optional
 * "__metadata__" object of string -> string. The Python writer pads the header
 * with trailing spaces so the data region starts at a multiple of 8.
 *
 * Checks made on every file (each failure is logged once as
 * "<func>: <file or label>: <problem>" and returned as an error, never a crash):
 *   - the file holds at least the 8-byte header length;
 *   - the header length is at most MOE_ST_MAX_HEADER and lies within the file;
 *   - the header is strict UTF-8 (no overlong forms, surrogates, code points above
 *     U+10FFFF, truncated sequences) with no raw control characters, no non-ASCII
 *     bytes outside strings (so no BOM), only well-formed escapes and no "\u0000"
 *     (which would cut a name short);
 *   - every number in the header is written as a plain integer (no fraction, no
 *     exponent, no leading zeros); shape dims and offsets must also be
 *     non-negative and below 2^53, where doubles (cJSON's representation) stop
 *     being exact;
 *   - the header is one JSON object (trailing spaces allowed, nothing else after);
 *   - "__metadata__" appears at most once and is an object of string -> string
 *     with no duplicate keys;
 *   - each tensor entry is an object with exactly one "dtype" (string), "shape"
 *     (array of at most MOE_ST_MAX_DIMS integers) and "data_offsets" (array of two
 *     integers); other keys are ignored, as the reference reader does;
 *   - dtype is F32, F16, BF16, U8 or F8_E4M3; other safetensors dtypes (I64, F64,
 *     BOOL, F8_E5M2, ...) are rejected as "unsupported dtype X for tensor Y", anything
 *     else as "unknown dtype" (both MOE_ERR_FORMAT);
 *   - the element count times the dtype size fits in 64 bits and in the data region;
 *   - begin <= end <= data region size, and end - begin equals the byte size;
 *   - tensor names are unique within a file and across shards;
 *   - sorted by (begin, end), the tensors tile the data region exactly: the first
 *     begins at 0, each begins where the previous ended (no overlap, no gap) and
 *     the last ends at file size - 8 - N (no trailing bytes). Header order need not
 *     match offset order. Zero-element tensors (a dim of 0) have begin == end.
 *
 * moe_safetensors_open(path): a regular file is opened as one .safetensors file,
 * unless its name ends in ".safetensors.index.json", in which case it is read as
 * the index of a sharded model in its directory. A directory is opened through
 * its model.safetensors.index.json if present, else its model.safetensors, else
 * MOE_ERR_NOT_FOUND ("no safetensors found in the directory").
 *
 * Sharded models (model.safetensors.index.json): the index must be UTF-8 JSON with
 * a non-empty "weight_map" object of tensor name -> shard file name. Shard names
 * must be relative and contain no ".." component, so the index cannot name a file
 * outside the model directory. Symlinks inside the directory are followed
 * wherever they point (the Hugging Face hub cache links snapshot files into
 * ../../blobs). Each distinct shard is opened once.
 * Every tensor named in the weight_map must be in the shard it names (error); a
 * tensor present in a shard but absent from the weight_map only logs a warning.
 *
 * Alignment: data pointers are NOT guaranteed to be aligned, and the reader does
 * not require it. The data region starts at byte 8 + N of the file; the Python
 * and Rust writers pad the header with spaces so that this is a multiple of 8,
 * and since every F16/BF16 size is even, 16-bit tensors are then 2-aligned.
 * But tensors are packed back to back, so an F32 tensor that follows an odd
 * number of F16 elements is only 2-aligned, and a file from another writer
 * (odd N) misaligns everything. Callers that load elements wider than a byte
 * must read through memcpy or check the pointer first.
 *
 * Strictness beyond the reference reader: numbers anywhere in the header
 * (even under keys we ignore) must be plain integers, and a sharded model's
 * shards may not be symlinks leaving the model directory - so a Hugging Face
 * hub cache snapshot (whose files link to ../../blobs) has to be opened by
 * copying or resolving it first.
 *
 * Thread-safety: lookups on an open handle are safe. Opening is re-entrant
 * except that cJSON stores the position of a parse error in a process-wide
 * variable, so two threads rejecting malformed JSON at once race on it
 * (harmless in practice, but a data race in the C sense).
 *
 * Ownership: the handle owns the maps, the tensor array, the name strings, the
 * metadata strings and the file paths. moe_safetensors_open_memory borrows the
 * caller's buffer, which must outlive the handle.
 */
#define _XOPEN_SOURCE 700 /* realpath() */
#include "moe-safetensors.h"
#include "moe-base.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moe-mmap.h"

#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"
#define ST_EXACT_LIMIT 9007199254740992.0 /* 2^53: first double that hides its neighbour */

struct st_file {
    struct moe_mmap map; /* zeroed for in-memory buffers */
    char *path;          /* file path, or the label of an in-memory buffer */
};

struct st_meta {
    char *key;
    char *value;
};

struct moe_safetensors {
    struct st_file *files;
    int n_files;
    struct moe_st_tensor *tensors; /* in (file, offset) order */
    size_t n_tensors, cap_tensors;
    const struct moe_st_tensor **by_name; /* n_tensors pointers sorted by name */
    struct st_meta *meta;                 /* "__metadata__" of the first file */
    size_t n_meta;
};

/* ------------------------------------------------------------------------- */
/* small helpers                                                              */

/* Copies an untrusted name into buf for a log message: control bytes become '?'
 * and long names are cut (at a UTF-8 boundary) and marked with "...". */
static const char *show(const char *s, char *buf, size_t cap) {
    size_t n = 0, keep = cap - 4; /* room for "..." and the NUL */
    while (s[n] && n < keep) n++;
    int cut = s[n] != 0;
    if (cut) /* s[n] is the first byte dropped: drop the rest of its character too */
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    memcpy(buf + n, cut ? "..." : "", cut ? 4 : 1);
    return buf;
}
#define SHOW_CAP 160

/* Duplicates a string; NULL when out of memory. */
static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* Reads a little-endian u64 from possibly unaligned bytes. */
static uint64_t read_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Checks the escape starting at h[i] == '\\': one of \" \\ \/ \b \f \n \r \t, or
 * \u and four hex digits other than 0000 (a NUL would truncate C strings).
 * cJSON alone would read "\u}000" as a NUL character. */
static enum moe_status lex_escape(const char *label, const uint8_t *h, size_t n, size_t i) {
    if (i + 1 < n && h[i + 1] && strchr("\"\\/bfnrt", h[i + 1])) return MOE_OK;
    if (i + 1 < n && h[i + 1] == 'u') {
        unsigned v = 0;
        size_t k = 2;
        for (; k < 6 && i + k < n; k++) {
            uint8_t d = h[i + k];
            int x = d >= '0' && d <= '9'   ? d - '0'
                    : d >= 'a' && d <= 'f' ? d - 'a' + 10
                    : d >= 'A' && d <= 'F' ? d - 'A' + 10
                                           : -1;
            if (x < 0) break;
            v = v * 16 + (unsigned)x;
        }
        if (k == 6 && v == 0) {
            MOE_LOGE("%s: header byte %zu: string contains the NUL escape \\u0000", label, i);
            return MOE_ERR_FORMAT;
        }
        if (k == 6) return MOE_OK;
    }
    MOE_LOGE("%s: header byte %zu: invalid escape sequence in a string", label, i);
    return MOE_ERR_FORMAT;
}

/* Lexical checks cJSON does not make: raw control characters, non-ASCII bytes
 * outside strings (a BOM), malformed escapes and "\u0000" (both would put a NUL
 * into a C string), and numbers that are not plain integers (cJSON stores
 * numbers as doubles, so 1.0, 1e0 and 01 would silently read as 1). An optional leading '-' is let through
 * so that the tree pass can report which dim or offset is negative. */
static enum moe_status lex_check(const char *label, const uint8_t *h, size_t n) {
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = h[i];
        if (in_string) {
            if (c == '"') {
                in_string = 0;
            } else if (c == '\\') {
                enum moe_status rc = lex_escape(label, h, n, i);
                if (rc != MOE_OK) return rc;
                i += h[i + 1] == 'u' ? 5 : 1; /* skip the escape */
            } else if (c < 0x20) {
                MOE_LOGE("%s: header byte %zu: raw control character 0x%02x in a string", label, i, c);
                return MOE_ERR_FORMAT;
            }
            continue;
        }
        if (c == '"') {
            in_string = 1;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            /* JSON whitespace */
        } else if (c < 0x20 || c >= 0x80) {
            MOE_LOGE("%s: header byte %zu: unexpected byte 0x%02x outside a string", label, i, c);
            return MOE_ERR_FORMAT;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t j = i;
            while (j < n && h[j] && strchr("0123456789+-.eE", h[j])) j++;
            size_t d = (h[i] == '-') ? i + 1 : i; /* first digit */
            int ok = d < j;
            for (size_t k = d; k < j && ok; k++) ok = h[k] >= '0' && h[k] <= '9';
            if (ok && h[d] == '0' && j - d > 1) ok = 0; /* leading zero */
            if (!ok) {
                int shown = (int)(j - i > 40 ? 40 : j - i);
                MOE_LOGE("%s: header byte %zu: number '%.*s' is not a plain integer "
                         "(safetensors shapes and offsets are unsigned integers)",
                         label, i, shown, (const char *)h + i);
                return MOE_ERR_FORMAT;
            }
            i = j - 1;
        }
    }
    return MOE_OK;
}

enum { U53_OK, U53_NOT_NUMBER, U53_NEGATIVE, U53_FRACTION, U53_TOO_LARGE };

/* Reads a JSON number that must be an exact non-negative integer below 2^53
 * (beyond which a double cannot tell n from n+1). Returns one of U53_*. */
static int json_u53(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return U53_NOT_NUMBER;
    double d = j->valuedouble;
    if (isnan(d)) return U53_FRACTION;
    if (signbit(d)) return U53_NEGATIVE; /* also catches -0 */
    if (d >= ST_EXACT_LIMIT) return U53_TOO_LARGE;
    uint64_t v = (uint64_t)d;
    if ((double)v != d) return U53_FRACTION;
    *out = v;
    return U53_OK;
}

/* Logs why a shape dim or offset number was rejected. */
static void log_bad_u53(const char *label, const char *tname, const char *what, int idx, int why,
                        const cJSON *j) {
    char nb[SHOW_CAP];
    const char *reason = why == U53_NOT_NUMBER ? "is not a number"
                         : why == U53_NEGATIVE ? "is negative"
                         : why == U53_FRACTION ? "is not an integer"
                                               : "is too large (limit 2^53)";
    if (cJSON_IsNumber(j))
        MOE_LOGE("%s: tensor %s: %s[%d] = %.17g %s", label, show(tname, nb, sizeof nb), what, idx,
                 j->valuedouble, reason);
    else
        MOE_LOGE("%s: tensor %s: %s[%d] %s", label, show(tname, nb, sizeof nb), what, idx, reason);
}

/* Compares two C strings through pointers to them (for qsort). */
static int cmp_strp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Compares tensors by name through pointers to them (for qsort and bsearch). */
static int cmp_tensor_name(const void *a, const void *b) {
    const struct moe_st_tensor *x = *(const struct moe_st_tensor *const *)a;
    const struct moe_st_tensor *y = *(const struct moe_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Orders tensors of one file by (begin, end): data pointers share one buffer. */
static int cmp_tensor_offset(const void *a, const void *b) {
    const struct moe_st_tensor *x = a, *y = b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    if (px != py) return px < py ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* one header                                                                 */

/* Maps a safetensors dtype string to ours. Both known dtypes we cannot handle
 * ("unsupported") and strings that are no safetensors dtype ("unknown") are
 * MOE_ERR_FORMAT, the code moe-safetensors.h documents for bad files. */
static enum moe_status parse_dtype(const char *label, const char *tname, const char *s,
                                   enum moe_dtype *out) {
    static const char *const unsupported[] = {
        "BOOL", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F64", "C64",
        "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F6_E2M3", "F6_E3M2", "F4",
    };
    char nb[SHOW_CAP], db[SHOW_CAP];
    for (int t = 0; t < MOE_DTYPE_COUNT; t++) {
        if (strcmp(s, moe_dtype_name((enum moe_dtype)t)) == 0) {
            *out = (enum moe_dtype)t;
            return MOE_OK;
        }
    }
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        if (strcmp(s, unsupported[i]) == 0) {
            MOE_LOGE("%s: unsupported dtype %s for tensor %s (supported: F32, F16, BF16, U8, F8_E4M3)", label, s,
                     show(tname, nb, sizeof nb));
            return MOE_ERR_UNSUPPORTED;
        }
    }
    MOE_LOGE("%s: unknown dtype \"%s\" for tensor %s", label, show(s, db, sizeof db),
             show(tname, nb, sizeof nb));
    return MOE_ERR_FORMAT;
}

/* Finds the dtype/shape/data_offsets members of a tensor entry, rejecting
 * duplicates (cJSON keeps them; which one wins would be ambiguous). */
static enum moe_status entry_fields(const char *label, const char *tname, const cJSON *e,
                                    const cJSON *f[3]) {
    static const char *const keys[3] = {"dtype", "shape", "data_offsets"};
    char nb[SHOW_CAP];
    f[0] = f[1] = f[2] = NULL;
    for (const cJSON *c = e->child; c; c = c->next) {
        for (int k = 0; k < 3; k++) {
            if (c->string && strcmp(c->string, keys[k]) == 0) {
                if (f[k]) {
                    MOE_LOGE("%s: tensor %s: duplicate key \"%s\"", label,
                             show(tname, nb, sizeof nb), keys[k]);
                    return MOE_ERR_FORMAT;
                }
                f[k] = c;
            }
        }
    }
    for (int k = 0; k < 3; k++) {
        if (!f[k]) {
            MOE_LOGE("%s: tensor %s: missing \"%s\"", label, show(tname, nb, sizeof nb), keys[k]);
            return MOE_ERR_FORMAT;
        }
    }
    if (!cJSON_IsString(f[0])) {
        MOE_LOGE("%s: tensor %s: \"dtype\" is not a string", label, show(tname, nb, sizeof nb));
        return MOE_ERR_FORMAT;
    }
    if (!cJSON_IsArray(f[1])) {
        MOE_LOGE("%s: tensor %s: \"shape\" is not an array", label, show(tname, nb, sizeof nb));
        return MOE_ERR_FORMAT;
    }
    if (!cJSON_IsArray(f[2]) || cJSON_GetArraySize(f[2]) != 2) {
        MOE_LOGE("%s: tensor %s: \"data_offsets\" is not an array of two integers", label,
                 show(tname, nb, sizeof nb));
        return MOE_ERR_FORMAT;
    }
    return MOE_OK;
}

/* Reads the shape of a tensor into t and its byte size into *nbytes, checking
 * the dim count, each dim, and that the size fits in 64 bits and in data_len. */
static enum moe_status parse_shape(const char *label, const char *tname, const cJSON *shape,
                                   size_t data_len, struct moe_st_tensor *t, uint64_t *nbytes) {
    char nb[SHOW_CAP];
    int n = 0;
    for (const cJSON *c = shape->child; c; c = c->next) n++;
    if (n > MOE_ST_MAX_DIMS) {
        MOE_LOGE("%s: tensor %s: %d dims, more than the %d supported", label,
                 show(tname, nb, sizeof nb), n, MOE_ST_MAX_DIMS);
        return MOE_ERR_FORMAT;
    }
    uint64_t prod = moe_dtype_size(t->dtype); /* bytes, over the non-zero dims */
    int has_zero = 0, i = 0;
    for (const cJSON *c = shape->child; c; c = c->next, i++) {
        uint64_t d = 0;
        int why = json_u53(c, &d);
        if (why != U53_OK) {
            log_bad_u53(label, tname, "shape", i, why, c);
            return MOE_ERR_FORMAT;
        }
        t->shape[i] = (int64_t)d;
        if (d == 0) {
            has_zero = 1;
        } else if (__builtin_mul_overflow(prod, d, &prod)) {
            MOE_LOGE("%s: tensor %s: shape overflow (byte size exceeds 64 bits)", label,
                     show(tname, nb, sizeof nb));
            return MOE_ERR_FORMAT;
        }
    }
    t->n_dims = n;
    if (has_zero) prod = 0;
    if (prod > data_len) {
        MOE_LOGE("%s: tensor %s: shape needs %llu bytes, more than the %zu-byte data region "
                 "(shape exceeds the file)",
                 label, show(tname, nb, sizeof nb), (unsigned long long)prod, data_len);
        return MOE_ERR_FORMAT;
    }
    t->n_elements = (int64_t)(prod / moe_dtype_size(t->dtype));
    *nbytes = prod;
    return MOE_OK;
}

/* Builds one tensor from its header entry: dtype, shape and offsets, all checked
 * against the data region [dbase, dbase + data_len). Does not set t->name. */
static enum moe_status parse_entry(const char *label, const char *tname, const cJSON *e,
                                   const uint8_t *dbase, size_t data_len,
                                   struct moe_st_tensor *t) {
    char nb[SHOW_CAP];
    const cJSON *f[3];
    enum moe_status rc;
    memset(t, 0, sizeof *t);
    if (!cJSON_IsObject(e)) {
        MOE_LOGE("%s: tensor %s: entry is not an object", label, show(tname, nb, sizeof nb));
        return MOE_ERR_FORMAT;
    }
    if ((rc = entry_fields(label, tname, e, f)) != MOE_OK) return rc;
    if ((rc = parse_dtype(label, tname, f[0]->valuestring, &t->dtype)) != MOE_OK) return rc;
    uint64_t nbytes = 0, off[2] = {0, 0};
    if ((rc = parse_shape(label, tname, f[1], data_len, t, &nbytes)) != MOE_OK) return rc;
    int i = 0;
    for (const cJSON *c = f[2]->child; c; c = c->next, i++) {
        int why = json_u53(c, &off[i]);
        if (why != U53_OK) {
            log_bad_u53(label, tname, "data_offsets", i, why, c);
            return MOE_ERR_FORMAT;
        }
    }
    show(tname, nb, sizeof nb);
    if (off[0] > off[1]) {
        MOE_LOGE("%s: tensor %s: data_offsets begin %llu > end %llu", label, nb,
                 (unsigned long long)off[0], (unsigned long long)off[1]);
        return MOE_ERR_FORMAT;
    }
    if (off[1] > data_len) {
        MOE_LOGE("%s: tensor %s: data_offsets end %llu is past the end of the %zu-byte data region",
                 label, nb, (unsigned long long)off[1], data_len);
        return MOE_ERR_FORMAT;
    }
    if (off[1] - off[0] != nbytes) {
        MOE_LOGE("%s: tensor %s: data_offsets span %llu bytes but shape x dtype size is %llu bytes",
                 label, nb, (unsigned long long)(off[1] - off[0]), (unsigned long long)nbytes);
        return MOE_ERR_FORMAT;
    }
    t->data = dbase + off[0];
    t->nbytes = (size_t)nbytes;
    return MOE_OK;
}

/* Validates "__metadata__" (object of string -> string, unique keys) and, when
 * keep is set, copies it into the handle. */
static enum moe_status parse_metadata(struct moe_safetensors *st, const char *label,
                                      const cJSON *m, int keep) {
    char nb[SHOW_CAP];
    const char **keys = NULL;
    enum moe_status rc = MOE_ERR_FORMAT;
    size_t n = 0;
    if (!cJSON_IsObject(m)) {
        MOE_LOGE("%s: \"__metadata__\" is not an object", label);
        return MOE_ERR_FORMAT;
    }
    for (const cJSON *c = m->child; c; c = c->next) {
        if (!cJSON_IsString(c)) {
            MOE_LOGE("%s: \"__metadata__\" value of key %s is not a string", label,
                     show(c->string ? c->string : "", nb, sizeof nb));
            return MOE_ERR_FORMAT;
        }
        n++;
    }
    if (n == 0) return MOE_OK;
    keys = malloc(n * sizeof *keys);
    if (!keys) goto nomem;
    n = 0;
    for (const cJSON *c = m->child; c; c = c->next) keys[n++] = c->string;
    qsort(keys, n, sizeof *keys, cmp_strp);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(keys[i - 1], keys[i]) == 0) {
            MOE_LOGE("%s: \"__metadata__\" has duplicate key %s", label, show(keys[i], nb, sizeof nb));
            goto fail;
        }
    }
    if (keep) {
        st->meta = calloc(n, sizeof *st->meta);
        if (!st->meta) goto nomem;
        for (const cJSON *c = m->child; c; c = c->next) {
            struct st_meta *e = &st->meta[st->n_meta];
            e->key = dupstr(c->string);
            e->value = dupstr(c->valuestring);
            st->n_meta++; /* count it first so that free() releases a half-built pair */
            if (!e->key || !e->value) goto nomem;
        }
    }
    rc = MOE_OK;
    goto fail;
nomem:
    MOE_LOGE("%s: out of memory reading \"__metadata__\"", label);
    rc = MOE_ERR_NOMEM;
fail:
    free(keys);
    return rc;
}

/* Makes room for `more` tensors at the end of the handle's array. */
static enum moe_status reserve_tensors(struct moe_safetensors *st, size_t more) {
    if (more <= st->cap_tensors - st->n_tensors) return MOE_OK;
    if (more > SIZE_MAX / sizeof *st->tensors - st->n_tensors) return MOE_ERR_NOMEM;
    size_t cap = st->n_tensors + more;
    struct moe_st_tensor *p = realloc(st->tensors, cap * sizeof *p);
    if (!p) return MOE_ERR_NOMEM;
    st->tensors = p;
    st->cap_tensors = cap;
    return MOE_OK;
}

/* Rejects two tensors of one file with the same name (first..end of the array). */
static enum moe_status check_unique_in_file(struct moe_safetensors *st, size_t first,
                                            const char *label) {
    size_t n = st->n_tensors - first;
    char nb[SHOW_CAP];
    if (n < 2) return MOE_OK;
    const char **names = malloc(n * sizeof *names);
    if (!names) {
        MOE_LOGE("%s: out of memory", label);
        return MOE_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) names[i] = st->tensors[first + i].name;
    qsort(names, n, sizeof *names, cmp_strp);
    enum moe_status rc = MOE_OK;
    for (size_t i = 1; i < n && rc == MOE_OK; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            MOE_LOGE("%s: duplicate tensor name %s", label, show(names[i], nb, sizeof nb));
            rc = MOE_ERR_FORMAT;
        }
    }
    free(names);
    return rc;
}

/* Sorts one file's tensors by offset and checks that they tile the data region
 * exactly: no gap, no overlap, no trailing bytes. */
static enum moe_status check_coverage(struct moe_safetensors *st, size_t first, const char *label,
                                      const uint8_t *dbase, size_t data_len) {
    size_t n = st->n_tensors - first;
    struct moe_st_tensor *t = n ? st->tensors + first : NULL;
    char nb[SHOW_CAP], pb[SHOW_CAP];
    if (n > 1) qsort(t, n, sizeof *t, cmp_tensor_offset);
    size_t cursor = 0;
    for (size_t i = 0; i < n; i++) {
        size_t begin = (size_t)((const uint8_t *)t[i].data - dbase);
        if (begin < cursor) {
            MOE_LOGE("%s: tensor %s (data_offsets begin %zu) overlaps tensor %s (ends at %zu)", label,
                     show(t[i].name, nb, sizeof nb), begin, show(t[i - 1].name, pb, sizeof pb),
                     cursor);
            return MOE_ERR_FORMAT;
        }
        if (begin > cursor) {
            MOE_LOGE("%s: gap of %zu unused bytes in the data region before tensor %s "
                     "(data_offsets begin %zu)",
                     label, begin - cursor, show(t[i].name, nb, sizeof nb), begin);
            return MOE_ERR_FORMAT;
        }
        cursor = begin + t[i].nbytes;
    }
    if (cursor != data_len) {
        MOE_LOGE("%s: %zu trailing bytes after the last tensor (data region is %zu bytes, tensors "
                 "cover %zu)",
                 label, data_len - cursor, data_len, cursor);
        return MOE_ERR_FORMAT;
    }
    return MOE_OK;
}

/* Parses the header JSON text: structure, metadata and every tensor entry,
 * appending the file's tensors to the handle. */
static enum moe_status parse_header_json(struct moe_safetensors *st, const char *label,
                                         const cJSON *root, const uint8_t *dbase, size_t data_len,
                                         int file_index) {
    enum moe_status rc;
    size_t count = 0;
    int n_meta = 0;
    if (!cJSON_IsObject(root)) {
        MOE_LOGE("%s: header is not a JSON object", label);
        return MOE_ERR_FORMAT;
    }
    for (const cJSON *c = root->child; c; c = c->next) count++;
    if ((rc = reserve_tensors(st, count)) != MOE_OK) {
        MOE_LOGE("%s: out of memory for %zu tensors", label, count);
        return rc;
    }
    for (const cJSON *c = root->child; c; c = c->next) {
        if (!c->string) { /* cJSON always names object members; be safe anyway */
            MOE_LOGE("%s: header object member without a name", label);
            return MOE_ERR_FORMAT;
        }
        if (strcmp(c->string, "__metadata__") == 0) {
            if (++n_meta > 1) {
                MOE_LOGE("%s: duplicate \"__metadata__\"", label);
                return MOE_ERR_FORMAT;
            }
            if ((rc = parse_metadata(st, label, c, file_index == 0)) != MOE_OK) return rc;
            continue;
        }
        struct moe_st_tensor *t = &st->tensors[st->n_tensors];
        if ((rc = parse_entry(label, c->string, c, dbase, data_len, t)) != MOE_OK) return rc;
        t->file_index = file_index;
        t->name = dupstr(c->string);
        if (!t->name) {
            MOE_LOGE("%s: out of memory", label);
            return MOE_ERR_NOMEM;
        }
        st->n_tensors++;
    }
    return MOE_OK;
}

/* Validates one safetensors image (a mapped file or a caller's buffer) and
 * appends its tensors, in offset order, to the handle. */
static enum moe_status parse_file(struct moe_safetensors *st, const uint8_t *buf, size_t len,
                                  const char *label, int file_index) {
    enum moe_status rc = MOE_ERR_FORMAT;
    char *text = NULL;
    cJSON *root = NULL;
    size_t first = st->n_tensors;
    if (len < 8) {
        MOE_LOGE("%s: file is %zu bytes, too short for the 8-byte header length", label, len);
        return MOE_ERR_FORMAT;
    }
    uint64_t hlen = read_le64(buf);
    if (hlen > MOE_ST_MAX_HEADER) {
        MOE_LOGE("%s: header length %llu exceeds the %u-byte (100 MB) limit", label,
                 (unsigned long long)hlen, MOE_ST_MAX_HEADER);
        return MOE_ERR_FORMAT;
    }
    if (hlen > len - 8) {
        MOE_LOGE("%s: header length %llu runs past the end of the file (%zu bytes)", label,
                 (unsigned long long)hlen, len);
        return MOE_ERR_FORMAT;
    }
    const uint8_t *h = buf + 8;
    size_t bad = moe_utf8_bad_offset(h, (size_t)hlen);
    if (bad != hlen) {
        MOE_LOGE("%s: header is not valid UTF-8 (byte 0x%02x at header offset %zu)", label, h[bad],
                 bad);
        return MOE_ERR_FORMAT;
    }
    if ((rc = lex_check(label, h, (size_t)hlen)) != MOE_OK) return rc;
    text = malloc((size_t)hlen + 1);
    if (!text) {
        MOE_LOGE("%s: out of memory for a %llu-byte header", label, (unsigned long long)hlen);
        return MOE_ERR_NOMEM;
    }
    memcpy(text, h, (size_t)hlen);
    text[hlen] = 0;
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(text, (size_t)hlen + 1, &end, 1);
    if (!root) {
        size_t at = (end && end >= text && end <= text + hlen) ? (size_t)(end - text) : 0;
        MOE_LOGE("%s: header is not valid JSON (error near header byte %zu)", label, at);
        rc = MOE_ERR_FORMAT;
        goto fail;
    }
    const uint8_t *dbase = h + hlen;
    size_t data_len = len - 8 - (size_t)hlen;
    if ((rc = parse_header_json(st, label, root, dbase, data_len, file_index)) != MOE_OK) goto fail;
    if ((rc = check_unique_in_file(st, first, label)) != MOE_OK) goto fail;
    rc = check_coverage(st, first, label, dbase, data_len);
fail:
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* handle                                                                     */

/* Allocates an empty handle with room for n_files file records. */
static struct moe_safetensors *st_new(int n_files) {
    struct moe_safetensors *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->files = calloc((size_t)(n_files > 0 ? n_files : 1), sizeof *st->files);
    if (!st->files) {
        free(st);
        return NULL;
    }
    return st;
}

/* Builds the by-name lookup table and rejects a name present in two shards. */
static enum moe_status st_finish(struct moe_safetensors *st) {
    char nb[SHOW_CAP];
    if (st->n_tensors == 0) return MOE_OK;
    st->by_name = malloc(st->n_tensors * sizeof *st->by_name);
    if (!st->by_name) {
        MOE_LOGE("out of memory indexing %zu tensors", st->n_tensors);
        return MOE_ERR_NOMEM;
    }
    for (size_t i = 0; i < st->n_tensors; i++) st->by_name[i] = &st->tensors[i];
    qsort(st->by_name, st->n_tensors, sizeof *st->by_name, cmp_tensor_name);
    for (size_t i = 1; i < st->n_tensors; i++) {
        const struct moe_st_tensor *a = st->by_name[i - 1], *b = st->by_name[i];
        if (strcmp(a->name, b->name) == 0) {
            MOE_LOGE("duplicate tensor name %s: in both %s and %s", show(a->name, nb, sizeof nb),
                     st->files[a->file_index].path, st->files[b->file_index].path);
            return MOE_ERR_FORMAT;
        }
    }
    return MOE_OK;
}

/* Maps path (opened as open_path, which may be its resolved form) as file fi of
 * the handle and parses it. */
static enum moe_status st_add_file(struct moe_safetensors *st, int fi, const char *path,
                                   const char *open_path) {
    struct st_file *f = &st->files[fi];
    f->path = dupstr(path);
    if (!f->path) {
        MOE_LOGE("%s: out of memory", path);
        return MOE_ERR_NOMEM;
    }
    st->n_files = fi + 1;
    enum moe_status rc = moe_mmap_open(open_path, &f->map);
    if (rc != MOE_OK) return rc;
    return parse_file(st, f->map.data, f->map.size, path, fi);
}

/* Validates a caller-owned image; the handle borrows buf (no map of its own). */
enum moe_status moe_safetensors_open_memory(const void *buf, size_t len, const char *label,
                                            struct moe_safetensors **out) {
    enum moe_status rc = MOE_ERR_NOMEM;
    struct moe_safetensors *st = NULL;
    if (!out) return MOE_ERR_INVALID;
    *out = NULL;
    if (!label) label = "<memory>";
    if (!buf && len > 0) {
        MOE_LOGE("%s: NULL buffer of %zu bytes", label, len);
        return MOE_ERR_INVALID;
    }
    st = st_new(1);
    if (!st || !(st->files[0].path = dupstr(label))) {
        MOE_LOGE("%s: out of memory", label);
        goto fail;
    }
    st->n_files = 1;
    if ((rc = parse_file(st, buf, len, label, 0)) != MOE_OK) goto fail;
    if ((rc = st_finish(st)) != MOE_OK) goto fail;
    *out = st;
    return MOE_OK;
fail:
    moe_safetensors_free(st);
    return rc;
}

/* Opens one .safetensors file. */
static enum moe_status open_single(const char *path, struct moe_safetensors **out) {
    enum moe_status rc = MOE_ERR_NOMEM;
    struct moe_safetensors *st = st_new(1);
    if (!st) {
        MOE_LOGE("%s: out of memory", path);
        goto fail;
    }
    if ((rc = st_add_file(st, 0, path, path)) != MOE_OK) goto fail;
    if ((rc = st_finish(st)) != MOE_OK) goto fail;
    *out = st;
    return MOE_OK;
fail:
    moe_safetensors_free(st);
    return rc;
}

/* Checks that a shard name from the index is a plain relative path: not empty,
 * not absolute, no ".." component. Symlinks are checked after realpath(). */
static enum moe_status check_shard_name(const char *index_path, const char *name) {
    char nb[SHOW_CAP];
    if (name[0] == 0) {
        MOE_LOGE("%s: weight_map names an empty shard file name", index_path);
        return MOE_ERR_FORMAT;
    }
    if (name[0] == '/') {
        MOE_LOGE("%s: shard %s is an absolute path; shards must be inside the model directory",
                 index_path, show(name, nb, sizeof nb));
        return MOE_ERR_FORMAT;
    }
    for (const char *p = name; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            MOE_LOGE("%s: shard %s has a \"..\" component; shards must be inside the model "
                     "directory",
                     index_path, show(name, nb, sizeof nb));
            return MOE_ERR_FORMAT;
        }
        p += n;
        while (*p == '/') p++;
    }
    return MOE_OK;
}

/* Resolves shard `name` inside the resolved model directory rdir into a malloc'd
 * real path. The name itself must stay inside the directory (check_shard_name);
 * a symlink placed in the directory may point elsewhere: the Hugging Face hub
 * cache stores snapshots as symlinks into ../../blobs. */
static enum moe_status resolve_shard(const char *index_path, const char *rdir, const char *name,
                                     char **out) {
    char nb[SHOW_CAP];
    enum moe_status rc = check_shard_name(index_path, name);
    *out = NULL;
    if (rc != MOE_OK) return rc;
    char *joined = moe_path_join(rdir, name);
    if (!joined) {
        MOE_LOGE("%s: out of memory", index_path);
        return MOE_ERR_NOMEM;
    }
    char *real = realpath(joined, NULL);
    if (!real) {
        int err = errno;
        MOE_LOGE("%s: shard %s named in weight_map: %s", index_path, show(name, nb, sizeof nb),
                 err == ENOENT ? "file does not exist" : strerror(err));
        free(joined);
        return err == ENOENT ? MOE_ERR_NOT_FOUND : MOE_ERR_IO;
    }
    free(joined);
    *out = real;
    return MOE_OK;
}

/* Reads and parses the index file into a cJSON tree and returns its weight_map
 * (a non-empty object whose values are all strings). */
static enum moe_status read_index(const char *index_path, cJSON **root_out, const cJSON **wm_out) {
    char *text = NULL;
    size_t len = 0;
    char nb[SHOW_CAP];
    cJSON *root = NULL;
    enum moe_status rc = moe_read_file(index_path, MOE_ST_MAX_HEADER, &text, &len);
    if (rc != MOE_OK) return rc;
    rc = MOE_ERR_FORMAT;
    size_t bad = moe_utf8_bad_offset(text, len);
    if (bad != len) {
        MOE_LOGE("%s: index is not valid UTF-8 (byte offset %zu)", index_path, bad);
        goto fail;
    }
    if (memchr(text, 0, len)) {
        MOE_LOGE("%s: index contains a NUL byte", index_path);
        goto fail;
    }
    root = cJSON_ParseWithLengthOpts(text, len + 1, NULL, 1);
    if (!cJSON_IsObject(root)) {
        MOE_LOGE("%s: index is not valid JSON (expected a JSON object)", index_path);
        goto fail;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        MOE_LOGE("%s: index lacks a non-empty \"weight_map\" object", index_path);
        goto fail;
    }
    for (const cJSON *c = wm->child; c; c = c->next) {
        if (!cJSON_IsString(c)) {
            MOE_LOGE("%s: weight_map entry %s is not a string", index_path,
                     show(c->string, nb, sizeof nb));
            goto fail;
        }
    }
    *root_out = root;
    *wm_out = wm;
    root = NULL;
    rc = MOE_OK;
fail:
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* Checks the weight_map against what the shards hold: each mapped tensor must be
 * in its shard (error); a tensor the map does not mention is only a warning. */
static enum moe_status check_weight_map(const struct moe_safetensors *st, const char *index_path,
                                        const cJSON *wm, const char **shards, size_t n_shards,
                                        const int *shard_file) {
    char nb[SHOW_CAP], sb[SHOW_CAP];
    enum moe_status rc = MOE_OK;
    unsigned char *seen = calloc(st->n_tensors ? st->n_tensors : 1, 1);
    if (!seen) {
        MOE_LOGE("%s: out of memory", index_path);
        return MOE_ERR_NOMEM;
    }
    for (const cJSON *c = wm->child; c && rc == MOE_OK; c = c->next) {
        const char **s = bsearch(&c->valuestring, shards, n_shards, sizeof *shards, cmp_strp);
        int fi = s ? shard_file[s - shards] : -1;
        const struct moe_st_tensor *t = moe_safetensors_find(st, c->string);
        if (!t || t->file_index != fi) {
            MOE_LOGE("%s: weight_map maps tensor %s to shard %s, which does not contain it%s%s",
                     index_path, show(c->string, nb, sizeof nb),
                     show(c->valuestring, sb, sizeof sb), t ? "; it is in " : "",
                     t ? st->files[t->file_index].path : "");
            rc = MOE_ERR_FORMAT;
        } else {
            seen[t - st->tensors] = 1;
        }
    }
    size_t unmapped = 0, first = 0;
    for (size_t i = 0; i < st->n_tensors && rc == MOE_OK; i++)
        if (!seen[i] && unmapped++ == 0) first = i;
    if (unmapped)
        MOE_LOGW("%s: %zu tensor(s) in the shards are not in weight_map (first: %s in %s)",
                 index_path, unmapped, show(st->tensors[first].name, nb, sizeof nb),
                 st->files[st->tensors[first].file_index].path);
    free(seen);
    return rc;
}

/* Opens a sharded model from dir/model.safetensors.index.json. */
static enum moe_status open_sharded(const char *dir, const char *index_path,
                                    struct moe_safetensors **out) {
    enum moe_status rc;
    cJSON *root = NULL;
    const cJSON *wm = NULL;
    const char **shards = NULL;
    char **real = NULL;
    int *shard_file = NULL;
    size_t n_shards = 0, n_entries = 0;
    struct moe_safetensors *st = NULL;
    char *rdir = realpath(dir, NULL);
    if (!rdir) {
        MOE_LOGE("%s: cannot resolve directory: %s", dir, strerror(errno));
        return MOE_ERR_IO;
    }
    if ((rc = read_index(index_path, &root, &wm)) != MOE_OK) goto fail;
    for (const cJSON *c = wm->child; c; c = c->next) n_entries++;
    rc = MOE_ERR_NOMEM;
    shards = malloc(n_entries * sizeof *shards);
    real = calloc(n_entries, sizeof *real);
    shard_file = malloc(n_entries * sizeof *shard_file);
    if (!shards || !real || !shard_file) {
        MOE_LOGE("%s: out of memory for %zu weight_map entries", index_path, n_entries);
        goto fail;
    }
    for (const cJSON *c = wm->child; c; c = c->next) shards[n_shards++] = c->valuestring;
    qsort(shards, n_shards, sizeof *shards, cmp_strp);
    size_t u = 0; /* keep distinct names only */
    for (size_t i = 0; i < n_shards; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0) shards[u++] = shards[i];
    n_shards = u;
    if (n_shards > INT_MAX || !(st = st_new((int)n_shards))) {
        MOE_LOGE("%s: out of memory for %zu shards", index_path, n_shards);
        goto fail;
    }
    int n_files = 0;
    for (size_t s = 0; s < n_shards; s++) {
        if ((rc = resolve_shard(index_path, rdir, shards[s], &real[s])) != MOE_OK) goto fail;
        shard_file[s] = -1;
        for (size_t k = 0; k < s && shard_file[s] < 0; k++) /* two names, one file */
            if (strcmp(real[k], real[s]) == 0) shard_file[s] = shard_file[k];
        if (shard_file[s] >= 0) continue;
        char *label = moe_path_join(dir, shards[s]);
        if (!label) {
            MOE_LOGE("%s: out of memory", index_path);
            rc = MOE_ERR_NOMEM;
            goto fail;
        }
        rc = st_add_file(st, n_files, label, real[s]);
        free(label);
        if (rc != MOE_OK) goto fail;
        shard_file[s] = n_files++;
    }
    if ((rc = st_finish(st)) != MOE_OK) goto fail;
    if ((rc = check_weight_map(st, index_path, wm, shards, n_shards, shard_file)) != MOE_OK)
        goto fail;
    *out = st;
    st = NULL;
fail:
    moe_safetensors_free(st);
    for (size_t s = 0; real && s < n_shards; s++) free(real[s]);
    free(real);
    free(shard_file);
    free(shards);
    cJSON_Delete(root);
    free(rdir);
    return rc;
}

/* Opens a model directory: the index if present, else model.safetensors. */
static enum moe_status open_dir(const char *dir, struct moe_safetensors **out) {
    enum moe_status rc = MOE_ERR_NOMEM;
    struct stat sb;
    char *index = moe_path_join(dir, ST_INDEX_NAME);
    char *single = moe_path_join(dir, ST_SINGLE_NAME);
    if (!index || !single) {
        MOE_LOGE("%s: out of memory", dir);
        goto fail;
    }
    if (stat(index, &sb) == 0) {
        rc = open_sharded(dir, index, out);
    } else if (stat(single, &sb) == 0) {
        rc = open_single(single, out);
    } else {
        MOE_LOGE("%s: no safetensors found in the directory (expected %s or %s)", dir,
                 ST_INDEX_NAME, ST_SINGLE_NAME);
        rc = MOE_ERR_NOT_FOUND;
    }
fail:
    free(index);
    free(single);
    return rc;
}

/* True if path names a sharded-model index (a name ending in ".safetensors.index.json"). */
static int is_index_name(const char *path) {
    static const char suffix[] = ".safetensors.index.json";
    size_t n = strlen(path), k = sizeof suffix - 1;
    return n >= k && strcmp(path + n - k, suffix) == 0;
}

/* Opens a sharded model given the path of its index file: the shards live in
 * the index's directory. */
static enum moe_status open_index_file(const char *index_path, struct moe_safetensors **out) {
    const char *slash = strrchr(index_path, '/');
    size_t n = slash ? (size_t)(slash - index_path) : 1;
    if (slash && n == 0) n = 1; /* "/x.index.json": the root directory */
    char *dir = malloc(n + 1);
    if (!dir) {
        MOE_LOGE("%s: out of memory", index_path);
        return MOE_ERR_NOMEM;
    }
    memcpy(dir, slash ? index_path : ".", n);
    dir[n] = 0;
    enum moe_status rc = open_sharded(dir, index_path, out);
    free(dir);
    return rc;
}

/* Dispatches on what path is: a directory, an index file, or one .safetensors file. */
enum moe_status moe_safetensors_open(const char *path, struct moe_safetensors **out) {
    struct stat sb;
    if (!out) return MOE_ERR_INVALID;
    *out = NULL;
    if (!path) {
        MOE_LOGE("path is NULL");
        return MOE_ERR_INVALID;
    }
    if (stat(path, &sb) != 0) {
        int err = errno;
        MOE_LOGE("%s: %s", path, strerror(err));
        return err == ENOENT ? MOE_ERR_NOT_FOUND : MOE_ERR_IO;
    }
    if (S_ISDIR(sb.st_mode)) return open_dir(path, out);
    if (!S_ISREG(sb.st_mode)) {
        MOE_LOGE("%s: not a regular file or directory", path);
        return MOE_ERR_IO;
    }
    return is_index_name(path) ? open_index_file(path, out) : open_single(path, out);
}

/* Unmaps every shard and frees everything the handle owns. */
void moe_safetensors_free(struct moe_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) {
        moe_mmap_close(&st->files[i].map);
        free(st->files[i].path);
    }
    free(st->files);
    for (size_t i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    free(st->tensors);
    free(st->by_name);
    for (size_t i = 0; i < st->n_meta; i++) {
        free(st->meta[i].key);
        free(st->meta[i].value);
    }
    free(st->meta);
    free(st);
}

/* Number of tensors over all shards (0 for NULL). */
size_t moe_safetensors_count(const struct moe_safetensors *st) { return st ? st->n_tensors : 0; }

/* The i-th tensor in (file, offset) order, or NULL when out of range. */
const struct moe_st_tensor *moe_safetensors_at(const struct moe_safetensors *st, size_t i) {
    return st && i < st->n_tensors ? &st->tensors[i] : NULL;
}

/* Binary search over the name-sorted table: O(log n) for ~10^4 tensors. */
const struct moe_st_tensor *moe_safetensors_find(const struct moe_safetensors *st,
                                                 const char *name) {
    if (!st || !name || st->n_tensors == 0) return NULL;
    struct moe_st_tensor key;
    const struct moe_st_tensor *kp = &key;
    key.name = name;
    const struct moe_st_tensor *const *hit =
        bsearch(&kp, st->by_name, st->n_tensors, sizeof *st->by_name, cmp_tensor_name);
    return hit ? *hit : NULL;
}

/* Linear scan: metadata holds a handful of keys. */
const char *moe_safetensors_metadata(const struct moe_safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    for (size_t i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
    return NULL;
}

/* Number of shard files opened (1 for a single file or a buffer). */
int moe_safetensors_n_files(const struct moe_safetensors *st) { return st ? st->n_files : 0; }

/* Path (or label) of shard i, or NULL when out of range. */
const char *moe_safetensors_file_path(const struct moe_safetensors *st, int i) {
    return st && i >= 0 && i < st->n_files ? st->files[i].path : NULL;
}

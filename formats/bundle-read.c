/*
 * bundle-read.c - the validating reader of the bundle container (.moeb):
 * open (file or memory), accessors, blob decoding and checksum verification.
 * docs/format.md is the byte-exact specification; formats/moe-bundle.h is the
 * manual of the API.
 *
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
 * Ownership: the handle owns its map, metadata, tuning set, tensor records and
 * names, precision descriptors and expert table. moe_bundle_open_memory borrows
 * the caller's buffer.
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
#include "moe-mmap.h"

/* ------------------------------------------------------------------------- */
/* reader                                                                     */

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
    /* the file as opened, for moe_bundle_check_file (bundles opened from a file only) */
    int fd;                       /* the mapped file, kept open (-1: from memory) */
    uint8_t *page0;               /* [PAGE] the header page at open */
    pthread_mutex_t watch_mu;     /* guards the fields below (check_file may run in any thread) */
    uint64_t seen_size;           /* size and modification time of the last accepted state */
    long long seen_mtime_s, seen_mtime_ns;
    uint8_t seen_slots[2][SLOT_SIZE]; /* the tuning slots then */
    int changed;                  /* a change was found and logged: every later check fails */
    int told_tuning, told_path;   /* the info / warning of check_file given once */
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
    if ((rc = bundle_need(&c, 8, "tensor count")) != MOE_OK) return rc;
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
        if ((rc = bundle_need(&c, TENSOR_FIXED, "tensor record")) != MOE_OK) return rc;
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
        if ((rc = bundle_need(&c, nlen, "tensor name")) != MOE_OK) return rc;
        if (!bundle_name_ok(c.p + c.pos, nlen, MOE_BUNDLE_MAX_NAME)) {
            MOE_LOGE("%s: tensor %llu (record at file offset %llu): name is not UTF-8 without "
                     "NUL or control characters",
                     b->label, (unsigned long long)i, (unsigned long long)at);
            return MOE_ERR_FORMAT;
        }
        if (!(x->name = bundle_dupn(c.p + c.pos, nlen))) {
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
                     b->label, bundle_show(x->name, nb, sizeof nb), (unsigned long long)x->offset,
                     (unsigned long long)x->size, (unsigned long long)b->h.dir_offset);
            return MOE_ERR_FORMAT;
        }
        if (why) {
            MOE_LOGE("%s: tensor %s (record at file offset %llu): %s", b->label,
                     bundle_show(x->name, nb, sizeof nb), (unsigned long long)at, why);
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
                     bundle_show(b->by_name[i]->name, nb, sizeof nb));
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
        if ((rc = bundle_need(c, PRECISION_FIXED, "precision descriptor")) != MOE_OK) return rc;
        uint32_t nlen = take32(c);
        p->n_parts = take32(c);
        if (p->n_parts < 1 || p->n_parts > MOE_BUNDLE_MAX_PARTS) {
            MOE_LOGE("%s: precision %u (at file offset %llu): part count %u is outside 1..%d",
                     b->label, i, (unsigned long long)at, p->n_parts, MOE_BUNDLE_MAX_PARTS);
            return MOE_ERR_FORMAT;
        }
        if ((rc = bundle_need(c, (uint64_t)p->n_parts * PART_BYTES, "precision parts")) != MOE_OK)
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
            bundle_need(c, nlen, "precision name") != MOE_OK || !bundle_precision_name_ok(c->p + c->pos, nlen)) {
            MOE_LOGE("%s: precision %u (at file offset %llu): name is not 1..%d bytes of "
                     "[A-Za-z0-9_.+-]",
                     b->label, i, (unsigned long long)at, MOE_BUNDLE_MAX_PRECISION_NAME);
            return MOE_ERR_FORMAT;
        }
        if (!(p->name = bundle_dupn(c->p + c->pos, nlen))) {
            MOE_LOGE("%s: out of memory", b->label);
            return MOE_ERR_NOMEM;
        }
        c->pos += nlen;
        const char *why = bundle_layout_parts(p);
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
    if ((rc = bundle_need(&c, EXPERT_FIXED, "expert counts")) != MOE_OK) return rc;
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
        snprintf(buf, cap, "tensor %s", bundle_show(b->tensors[who].name, nb, sizeof nb));
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
    if ((rc = bundle_kv_decode(d + DIR_FIXED, m, off + DIR_FIXED, b->label, "metadata", &b->meta)) != MOE_OK)
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
    const char *why = bundle_slot_bounds(s, dend, size);
    if (why) return why;
    if (s->size == 0) {
        *rc = moe_bundle_kv_new(out);
        return *rc == MOE_OK ? NULL : "out of memory";
    }
    const uint8_t *p = base + s->offset;
    if (hash(p, (size_t)s->size) != s->checksum) return "payload checksum mismatch";
    snprintf(what, sizeof what, "tuning payload (slot %c)", which);
    *rc = bundle_kv_decode(p, s->size, s->offset, label, what, out);
    return *rc == MOE_OK ? NULL : "payload does not decode";
}

/* Picks the tuning slot readers use: the valid one with the highest sequence
 * (A on a tie) whose payload is usable, falling back to the other. */
static enum moe_status select_tuning(struct moe_bundle *b) {
    struct slot s[2];
    const char *why[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        s[i] = bundle_slot_parse(b->base + slot_offset[i]);
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
    if ((rc = bundle_header_parse(b->base, b->size, b->label, &b->h)) != MOE_OK) return rc;
    if ((rc = parse_directory(b)) != MOE_OK) return rc;
    return select_tuning(b);
}

/* Allocates a handle labelled `label` over buf[0..len). */
static struct moe_bundle *bundle_new(const char *label) {
    struct moe_bundle *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    if (!(b->label = bundle_dupn(label, strlen(label)))) {
        free(b);
        return NULL;
    }
    b->fd = -1;
    pthread_mutex_init(&b->watch_mu, NULL);
    return b;
}

/* watch_start: keep the mapped file open and note its size, modification
 * time and header page, for moe_bundle_check_file. The descriptor must be
 * the mapped file (device and inode), of the mapped size: a file replaced or
 * resized between the map and this open fails the open. */
static enum moe_status watch_start(struct moe_bundle *b) {
    enum moe_status rc = moe_file_open_read(b->label, &b->fd); /* regular files only, never blocks */
    if (rc) return rc == MOE_ERR_NOT_FOUND ? MOE_ERR_IO : rc;
    struct stat st;
    if (fstat(b->fd, &st) != 0 || (unsigned long long)st.st_dev != b->map.dev ||
        (unsigned long long)st.st_ino != b->map.ino || (uint64_t)st.st_size != b->size) {
        MOE_LOGE("%s: the file changed while it was being opened (replaced or resized); try again", b->label);
        return MOE_ERR_IO;
    }
    if (!(b->page0 = malloc(PAGE))) {
        MOE_LOGE("%s: out of memory", b->label);
        return MOE_ERR_NOMEM;
    }
    memcpy(b->page0, b->base, PAGE); /* bundle_parse checked that the file holds the page */
    for (int i = 0; i < 2; i++) memcpy(b->seen_slots[i], b->page0 + slot_offset[i], SLOT_SIZE);
    b->seen_size = (uint64_t)st.st_size;
    b->seen_mtime_s = (long long)st.st_mtim.tv_sec;
    b->seen_mtime_ns = (long long)st.st_mtim.tv_nsec;
    return MOE_OK;
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
    if ((rc = watch_start(b)) != MOE_OK) goto fail;
    *out = b;
    return MOE_OK;
fail:
    moe_bundle_free(b);
    return rc;
}

/* Unmaps and frees everything the handle owns. */
void moe_bundle_free(struct moe_bundle *b) {
    if (!b) return;
    if (b->fd >= 0) close(b->fd);
    free(b->page0);
    pthread_mutex_destroy(&b->watch_mu);
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

/* watch_verdict: why the file's change since the last accepted state
 * (fstat gave `st`) makes the mapping untrustworthy, or NULL when it is a
 * change no reader sees: a tuning replacement (only the slots of the header
 * page and bytes past the directory change) or bytes appended or dropped
 * past the directory. Lock held. */
static const char *watch_verdict(struct moe_bundle *b, const struct stat *st, uint8_t *page) {
    const uint64_t size = (uint64_t)st->st_size;
    if (size < dir_end(b)) return "truncated: the weights it held are gone";
    if (bundle_pread_all(b->fd, page, PAGE, 0) != 0) return "its header page cannot be read";
    uint64_t at = 0;
    for (int i = 0; i < 2; i++) { /* the header page outside the two slots must be as it was */
        if (memcmp(page + at, b->page0 + at, (size_t)(slot_offset[i] - at)) != 0) return "its header was rewritten";
        at = slot_offset[i] + SLOT_SIZE;
    }
    if (memcmp(page + at, b->page0 + at, (size_t)(PAGE - at)) != 0) return "its header was rewritten";
    const int slots_moved = memcmp(page + slot_offset[0], b->seen_slots[0], SLOT_SIZE) != 0 ||
                            memcmp(page + slot_offset[1], b->seen_slots[1], SLOT_SIZE) != 0;
    if (!slots_moved && size == b->seen_size) return "its bytes were written in place";
    return NULL;
}

/* Checks that the mapped file still holds the bytes that were mapped. */
enum moe_status moe_bundle_check_file(const struct moe_bundle *cb) {
    struct moe_bundle *b = (struct moe_bundle *)cb; /* only the watch fields change, under their lock */
    if (!b || b->fd < 0) return MOE_OK;             /* from memory: no file to change */
    enum moe_status rc = MOE_OK;
    uint8_t page[PAGE];
    struct stat st, ps;
    pthread_mutex_lock(&b->watch_mu);
    if (b->changed) {
        rc = MOE_ERR_IO;
    } else if (fstat(b->fd, &st) != 0) {
        MOE_LOGE("%s: cannot stat the model's file while running: %s; restart", b->label, strerror(errno));
        b->changed = 1, rc = MOE_ERR_IO;
    } else if ((uint64_t)st.st_size != b->seen_size || (long long)st.st_mtim.tv_sec != b->seen_mtime_s ||
               (long long)st.st_mtim.tv_nsec != b->seen_mtime_ns) {
        const char *why = watch_verdict(b, &st, page);
        if (why) {
            MOE_LOGE("%s: changed while the model was running (size %llu -> %llu bytes; %s); restart", b->label,
                     (unsigned long long)b->seen_size, (unsigned long long)st.st_size, why);
            b->changed = 1, rc = MOE_ERR_IO;
        } else {
            if (!b->told_tuning)
                MOE_LOGI("%s: its tuning was replaced (or bytes past the directory changed) while running; this run "
                         "keeps the tuning it read at open", b->label);
            b->told_tuning = 1;
            b->seen_size = (uint64_t)st.st_size;
            b->seen_mtime_s = (long long)st.st_mtim.tv_sec, b->seen_mtime_ns = (long long)st.st_mtim.tv_nsec;
            for (int i = 0; i < 2; i++) memcpy(b->seen_slots[i], page + slot_offset[i], SLOT_SIZE);
        }
    }
    if (!rc && !b->told_path &&
        (stat(b->label, &ps) != 0 || (unsigned long long)ps.st_dev != b->map.dev ||
         (unsigned long long)ps.st_ino != b->map.ino)) {
        MOE_LOGW("%s: the path no longer names the file the model was loaded from (renamed over or removed); this "
                 "run keeps using the file it loaded", b->label);
        b->told_path = 1;
    }
    pthread_mutex_unlock(&b->watch_mu);
    return rc;
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

/* Reads a tensor's bytes through the file (not the mapping) and checks them. */
enum moe_status moe_bundle_tensor_load(const struct moe_bundle *b, const struct moe_bundle_tensor *t, void *dst,
                                       size_t dst_size) {
    if (!b || !t || (!dst && t->size)) return MOE_ERR_INVALID;
    if (dst_size < t->size) {
        MOE_LOGE("%s: tensor %s: destination of %zu bytes is smaller than its %llu bytes", b->label, t->name,
                 dst_size, (unsigned long long)t->size);
        return MOE_ERR_RANGE;
    }
    if (b->fd < 0) {
        if (t->size) memcpy(dst, t->data, (size_t)t->size);
    } else {
        int err = bundle_pread_all(b->fd, dst, t->size, t->offset);
        if (err) {
            MOE_LOGE("%s: tensor %s: reading %llu bytes at offset %llu: %s", b->label, t->name,
                     (unsigned long long)t->size, (unsigned long long)t->offset,
                     err == EIO ? "read error or unexpected end of file" : strerror(err));
            return MOE_ERR_IO;
        }
    }
    if (hash(dst, (size_t)t->size) != t->checksum) {
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
            snprintf(item, sizeof item, "tensor %s", bundle_show(t->name, nb, sizeof nb));
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

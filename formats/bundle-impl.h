/*
 * bundle-impl.h - private to formats/bundle-*.c: the on-disk constants, the
 * little-endian and checksum helpers, and the records and functions the KV
 * codec (bundle-kv.c), the reader (bundle-read.c), the writer
 * (bundle-write.c) and the tuning replacement (bundle-tuning.c) share.
 * Not installed; formats/moe-bundle.h is the public API and docs/format.md
 * the byte-exact specification.
 */
#ifndef MOE_BUNDLE_IMPL_H
#define MOE_BUNDLE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "moe-bundle.h"

/* header page layout (docs/format.md, "Header page") */
#define PAGE 4096u
#define HDR_MAGIC "MOEBUNDL"
#define HDR_CHECKED 120u /* bytes covered by the header checksum */
#define SLOT_MAGIC "MOEBTUNE"
#define SLOT_SIZE 64u
#define SLOT_CHECKED 56u
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

/* file offsets of the tuning slots A and B */
static const uint64_t slot_offset[2] = {512, 1024};

/* Reads a little-endian u32 from possibly unaligned bytes. */
static inline uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reads a little-endian u64 from possibly unaligned bytes. */
static inline uint64_t get64(const uint8_t *p) {
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* Writes a little-endian u32. */
static inline void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes a little-endian u64. */
static inline void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Rounds x up to a multiple of a (a power of two); UINT64_MAX on overflow. */
static inline uint64_t align_up(uint64_t x, uint64_t a) {
    if (x > UINT64_MAX - (a - 1)) return UINT64_MAX;
    return (x + a - 1) & ~(a - 1);
}

/* XXH3-64 of n bytes (n may be 0). */
static inline uint64_t hash(const void *p, size_t n) { return XXH3_64bits(n ? p : "", n); }

/* True if the n bytes are all zero. */
static inline bool all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

/* growable output buffer (the writer's directory, encoded KV blocks) */
struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
};

/* Decoding context: a byte range of the file and what it is, for messages. */
struct cur {
    const uint8_t *p;
    uint64_t n, pos;
    uint64_t base;     /* file offset of p[0] */
    const char *label; /* file */
    const char *what;  /* "metadata", "tensor table", "tuning payload (slot A)" */
};

/* header page and tuning slot records (docs/format.md, "Header page") */
struct hdr {
    uint16_t major, minor;
    uint64_t dir_offset, dir_size, dir_checksum, checksum;
};

/* A tuning slot as read from the header page. */
enum { SLOT_EMPTY, SLOT_BAD, SLOT_VALID };
struct slot {
    int state;
    uint64_t seq, offset, size, checksum;
};

/* one (layer, expert, precision) entry of the expert table, as stored */
struct bundle_entry {
    uint64_t offset, stored, raw, checksum, stored_checksum;
    uint32_t compression, flags;
};

/* ------------------------------------------------------------------------- */
/* shared functions (bundle-kv.c)                                             */

/* Copies an untrusted name into buf for a log message (control bytes become
 * '?', long names are cut and marked with "..."); returns buf. */
const char *bundle_show(const char *s, char *buf, size_t cap);
/* Duplicates n bytes as a NUL-terminated string; NULL when out of memory. */
char *bundle_dupn(const void *s, size_t n);
/* True if s[0..n) is a valid key or tensor name: 1..max bytes of UTF-8 with
 * no control characters. */
bool bundle_name_ok(const uint8_t *s, size_t n, size_t max);
/* True if s[0..n) is a precision name: 1..63 bytes of [A-Za-z0-9_.+-]. */
bool bundle_precision_name_ok(const uint8_t *s, size_t n);
/* Writes / reads exactly n bytes at off, retrying short transfers and EINTR;
 * 0 or an errno value (EIO for a read that ends early). */
int bundle_pwrite_all(int fd, const void *buf, uint64_t n, uint64_t off);
int bundle_pread_all(int fd, void *buf, uint64_t n, uint64_t off);
/* Appends k bytes to b (zeros when src is NULL); sets b->oom instead of failing. */
void bundle_wb_put(struct wbuf *b, const void *src, size_t k);
/* Appends the KV block encoding of kv (NULL = empty) to b. */
void bundle_kv_encode(const struct moe_bundle_kv *kv, struct wbuf *b);
/* Decodes a KV block that must fill p[0..n) exactly; base is p's file offset
 * and label/what name the file and the section in messages. The caller owns
 * *out (moe_bundle_kv_free). */
enum moe_status bundle_kv_decode(const uint8_t *p, uint64_t n, uint64_t base, const char *label,
                                 const char *what, struct moe_bundle_kv **out);
/* Checks that k more bytes are available in c; logs what was being read. */
enum moe_status bundle_need(struct cur *c, uint64_t k, const char *field);
/* Computes a precision's part offsets and raw size; NULL or why not (no log). */
const char *bundle_layout_parts(struct moe_bundle_precision *p);
/* Writes the 128-byte header into page (the rest of the page is the caller's). */
void bundle_header_build(uint8_t *page, uint64_t dir_offset, uint64_t dir_size,
                         uint64_t dir_checksum);
/* Validates the header of a file of file_size bytes whose first page is page. */
enum moe_status bundle_header_parse(const uint8_t *page, uint64_t file_size, const char *label,
                                    struct hdr *h);
/* Writes a valid 64-byte tuning slot record. */
void bundle_slot_build(uint8_t *s, uint64_t seq, uint64_t offset, uint64_t size, uint64_t checksum);
/* Classifies a 64-byte slot record: empty (all zero), bad (torn or damaged) or valid. */
struct slot bundle_slot_parse(const uint8_t *s);
/* Checks where a valid slot's payload lies; NULL if usable so far, else why not. */
const char *bundle_slot_bounds(const struct slot *s, uint64_t dir_end, uint64_t file_size);

/* small inline helpers built on the above */

/* Appends a little-endian u32. */
static inline void wb_u32(struct wbuf *b, uint32_t v) {
    uint8_t t[4];
    put32(t, v);
    bundle_wb_put(b, t, 4);
}

/* Appends a little-endian u64. */
static inline void wb_u64(struct wbuf *b, uint64_t v) {
    uint8_t t[8];
    put64(t, v);
    bundle_wb_put(b, t, 8);
}

/* Reads a u32 (caller checked the room). */
static inline uint32_t take32(struct cur *c) {
    uint32_t v = get32(c->p + c->pos);
    c->pos += 4;
    return v;
}

/* Reads a u64 (caller checked the room). */
static inline uint64_t take64(struct cur *c) {
    uint64_t v = get64(c->p + c->pos);
    c->pos += 8;
    return v;
}

#endif

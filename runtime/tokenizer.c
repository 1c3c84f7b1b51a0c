/*
 * tokenizer.c - Hugging Face tokenizer.json BPE tokenizers: load, encode, decode.
 *
 * The encoder follows the tokenizers library (Rust) step by step, so that ids match it:
 *   1. invalid UTF-8 becomes U+FFFD, as String::from_utf8_lossy does;
 *   2. added tokens that are not `normalized` are cut out of the raw text
 *      (leftmost-longest, with AddedVocabulary's lstrip/rstrip/single_word rules);
 *   3. each remaining piece is normalized, then `normalized` added tokens are cut out;
 *   4. the pre-tokenizer splits what is left into words (regexes run through PCRE2,
 *      iterated with the Oniguruma crate's rules for empty matches);
 *   5. the BPE model merges each word, lowest rank first and leftmost on ties, with a
 *      binary heap exactly like word.rs's merge_all (O(n log n) per word);
 *   6. the post-processor adds BOS/EOS when asked.
 * Decoding maps ids to strings and runs the decoder chain.
 *
 * We keep no offsets, only ids. The one place the library looks at offsets
 * (Metaspace prepend_scheme "first": prepend only to the piece that starts at
 * offset 0 of the original text) is tracked with a `first` flag on each piece.
 *
 * A loaded tokenizer is never written to again; all scratch state of an encode or
 * decode call lives in a per-call context, so calls may run concurrently.
 */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "moe-tokenizer.h"
#include "moe-mmap.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#define TOK_MAX_JSON_BYTES ((size_t)1 << 30) /* 1 GiB: far above any real tokenizer.json */
#define TOK_MAX_ID ((int32_t)1 << 24)        /* ids above this are treated as malformed */
#define TOK_FAST_CP 0x3000                   /* code points below this get a direct id table */

/* ------------------------------------------------------------------------- */
/* Growable buffers. Allocation failure sets a sticky `oom` flag checked once. */

struct buf {
    char *p;
    size_t n, cap;
    int oom;
};

/* buf_reserve: make room for `extra` more bytes plus a NUL; sets oom on failure. */
static int buf_reserve(struct buf *b, size_t extra) {
    if (b->oom) return 0;
    if (extra > SIZE_MAX / 2 - b->n) {
        b->oom = 1;
        return 0;
    }
    size_t need = b->n + extra + 1;
    if (need <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

/* buf_put: append n bytes (NUL-terminated afterwards). */
static void buf_put(struct buf *b, const void *s, size_t n) {
    if (!buf_reserve(b, n)) return;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* buf_putc: append one byte. The decoders append byte by byte, so the common
 * case (room left) takes one comparison, not buf_reserve's six: under the
 * fuzzer's comparison tracing that was a large share of fuzz-tokenizer's time. */
static void buf_putc(struct buf *b, char c) {
    if (b->n + 2 <= b->cap && !b->oom) {
        b->p[b->n++] = c;
        b->p[b->n] = 0;
        return;
    }
    buf_put(b, &c, 1);
}

/* buf_put_cp: append one code point as UTF-8. */
static void buf_put_cp(struct buf *b, int32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    buf_put(b, tmp, k > 0 ? (size_t)k : 0);
}

/* buf_free: release the memory and reset to empty. */
static void buf_free(struct buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

struct ivec {
    int32_t *v;
    size_t n, cap;
    int oom;
};

/* ivec_push: append one id; sets oom on failure. */
static void ivec_push(struct ivec *v, int32_t x) {
    if (v->oom) return;
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->v, cap * sizeof *p);
        if (!p) {
            v->oom = 1;
            return;
        }
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

/* grow: make an array hold at least `need` elements of size `elem`; 0 on OOM. */
static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem) return 0;
        c *= 2;
    }
    void *p = realloc(*arr, c * elem);
    if (!p) return 0;
    *arr = p;
    *cap = c;
    return 1;
}

/* A list of strings (pieces of text, or tokens while decoding) sharing one buffer.
 * `first` marks a piece that starts at offset 0 of the original input. */
struct piece {
    size_t off, len;
    int first;
};

struct plist {
    struct buf text;
    struct piece *v;
    size_t n, cap;
    int oom;
};

/* plist_add: append a copy of s[0..n) as a new piece. */
static void plist_add(struct plist *l, const char *s, size_t n, int first) {
    if (l->oom || l->text.oom) {
        l->oom = 1;
        return;
    }
    if (!grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v)) {
        l->oom = 1;
        return;
    }
    size_t off = l->text.n;
    buf_put(&l->text, s, n);
    if (l->text.oom) {
        l->oom = 1;
        return;
    }
    l->v[l->n++] = (struct piece){off, n, first};
}

/* plist_str: pointer to piece i's bytes (valid until the next add). */
static const char *plist_str(const struct plist *l, size_t i) {
    return l->text.p ? l->text.p + l->v[i].off : "";
}

/* plist_clear: forget all pieces, keep the memory. */
static void plist_clear(struct plist *l) {
    l->n = 0;
    l->text.n = 0;
}

/* plist_free: release everything. */
static void plist_free(struct plist *l) {
    buf_free(&l->text);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------------------- */
/* String arena: every string the tokenizer keeps lives here, freed at once. */

struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    char data[];
};

struct arena {
    struct arena_block *head;
};

/* arena_dup: NUL-terminated copy of s[0..n) in the arena; NULL on OOM. */
static char *arena_dup(struct arena *a, const char *s, size_t n) {
    struct arena_block *b = a->head;
    if (!b || b->cap - b->used < n + 1) {
        size_t cap = n + 1 > 65536 ? n + 1 : 65536;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    char *p = b->data + b->used;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    b->used += n + 1;
    return p;
}

/* arena_free: release all blocks. */
static void arena_free(struct arena *a) {
    struct arena_block *b = a->head;
    while (b) {
        struct arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}

/* ------------------------------------------------------------------------- */
/* Hash maps: byte string -> id (keys borrowed from the arena), pair -> merge. */

/* hash_bytes: FNV-1a, 64-bit. */
static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

struct smap_slot {
    const char *key; /* NULL = empty */
    uint32_t len;
    int32_t val;
};

struct smap {
    struct smap_slot *slots;
    size_t cap, n; /* cap is a power of two */
};

/* smap_find_slot: the slot holding key, or the empty slot where it would go. */
static struct smap_slot *smap_find_slot(const struct smap *m, const char *s, size_t n) {
    size_t mask = m->cap - 1;
    size_t i = (size_t)hash_bytes(s, n) & mask;
    for (;;) {
        struct smap_slot *e = &m->slots[i];
        if (!e->key || (e->len == n && memcmp(e->key, s, n) == 0)) return e;
        i = (i + 1) & mask;
    }
}

/* smap_get: value for key s[0..n), or -1. */
static int32_t smap_get(const struct smap *m, const char *s, size_t n) {
    if (!m->cap) return -1;
    struct smap_slot *e = smap_find_slot(m, s, n);
    return e->key ? e->val : -1;
}

/* smap_put: insert or overwrite; key must outlive the map. 0 on OOM. */
static int smap_put(struct smap *m, const char *key, size_t n, int32_t val) {
    if (n > UINT32_MAX) return 0;
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        struct smap_slot *old = m->slots;
        size_t old_cap = m->cap;
        m->slots = calloc(cap, sizeof *m->slots);
        if (!m->slots) {
            m->slots = old;
            return 0;
        }
        m->cap = cap;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].key) *smap_find_slot(m, old[i].key, old[i].len) = old[i];
        free(old);
    }
    struct smap_slot *e = smap_find_slot(m, key, n);
    if (!e->key) {
        e->key = key;
        e->len = (uint32_t)n;
        m->n++;
    }
    e->val = val;
    return 1;
}

/* smap_free: release the table (not the keys). */
static void smap_free(struct smap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

struct merge_slot {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX = empty */
    uint32_t rank;
    int32_t new_id;
};

struct mmap_pairs {
    struct merge_slot *slots;
    size_t cap, n;
};

/* pair_hash: mix the two ids of a pair. */
static size_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

/* merges_find: the slot of pair (a, b) or the empty slot where it would go. */
static struct merge_slot *merges_find(const struct mmap_pairs *m, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = m->cap - 1, i = pair_hash(key) & mask;
    for (;;) {
        struct merge_slot *e = &m->slots[i];
        if (e->key == key || e->key == UINT64_MAX) return e;
        i = (i + 1) & mask;
    }
}

/* merges_get: the merge of (a, b), or NULL. */
static const struct merge_slot *merges_get(const struct mmap_pairs *m, int32_t a, int32_t b) {
    if (!m->cap) return NULL;
    const struct merge_slot *e = merges_find(m, a, b);
    return e->key == UINT64_MAX ? NULL : e;
}

/* merges_init: table sized for n merges; 0 on OOM. */
static int merges_init(struct mmap_pairs *m, size_t n) {
    size_t cap = 16;
    while (cap < n * 2 + 2) cap *= 2;
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return 0;
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->cap = cap;
    m->n = 0;
    return 1;
}

/* merges_put: insert or overwrite (a later duplicate wins, as a Rust HashMap collect does). */
static void merges_put(struct mmap_pairs *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    struct merge_slot *e = merges_find(m, a, b);
    if (e->key == UINT64_MAX) m->n++;
    e->key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    e->rank = rank;
    e->new_id = new_id;
}

/* ------------------------------------------------------------------------- */
/* UTF-8 and character classes. */

/* utf8_decode: decode one code point from s[0..n) (n >= 1). Returns the number of
 * bytes used. An invalid sequence gives *cp = -1 and the length of its maximal
 * invalid prefix, the unit from_utf8_lossy replaces by one U+FFFD. */
static size_t utf8_decode(const unsigned char *s, size_t n, int32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = (int32_t)c;
        return 1;
    }
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    int32_t v;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *cp = -1;
        return 1;
    }
    size_t i = 1;
    for (; i <= need; i++) {
        if (i >= n) break;
        unsigned d = s[i];
        if (d < lo || d > hi) break;
        lo = 0x80;
        hi = 0xBF;
        v = (v << 6) | (int32_t)(d & 0x3F);
    }
    if (i <= need) {
        *cp = -1;
        return i;
    }
    *cp = v;
    return need + 1;
}

/* utf8_valid: 1 if s[0..n) is valid UTF-8. */
static int utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int32_t cp;
        i += utf8_decode(u + i, n - i, &cp);
        if (cp < 0) return 0;
    }
    return 1;
}

/* char_len: length of the (valid) UTF-8 character starting at s[i]. */
static size_t char_len(const char *s, size_t n, size_t i) {
    int32_t cp;
    return utf8_decode((const unsigned char *)s + i, n - i, &cp);
}

/* cp_is_ws: Rust char::is_whitespace (Unicode White_Space). */
static int cp_is_ws(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* cp_cat: Unicode general category (UTF8PROC_CATEGORY_*); Cn for invalid input. */
static int cp_cat(int32_t c) { return c < 0 ? UTF8PROC_CATEGORY_CN : utf8proc_category(c); }

/* cp_is_word: Rust regex / Oniguruma \w: Alphabetic, marks, Nd, Pc, joiners. */
static int cp_is_word(int32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    int k = cp_cat(c);
    if (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) return 1; /* L*, M* */
    if (k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC) return 1;
    if (c == 0x200C || c == 0x200D) return 1;
    /* Other_Alphabetic symbols: circled and squared Latin letters */
    return (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
           (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189);
}

/* cp_is_numeric: Rust char::is_numeric (Nd, Nl, No). */
static int cp_is_numeric(int32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    int k = cp_cat(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* cp_is_punct: the tokenizers library's is_punc: ASCII punctuation or any P* category. */
static int cp_is_punct(int32_t c) {
    if (c < 0x80)
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
               (c >= 0x7B && c <= 0x7E);
    int k = cp_cat(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* cp_is_mark: combining marks (Mn, Mc, Me), what StripAccents removes. */
static int cp_is_mark(int32_t c) {
    int k = cp_cat(c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

/* The GPT-2 byte <-> character map of ByteLevel: printable Latin-1 bytes map to
 * themselves, the other 68 bytes to U+0100.. in byte order. */
struct bytelevel_map {
    int32_t byte_cp[256];
    int16_t cp_byte[324]; /* inverse: code point -> byte, -1 where none */
    char byte_utf8[256][3];
    uint8_t byte_utf8_len[256];
};

/* bytelevel_map_init: build the byte -> code point table. */
static void bytelevel_map_init(struct bytelevel_map *m) {
    int n = 0;
    for (int cp = 0; cp < 324; cp++) m->cp_byte[cp] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        int32_t cp = keep ? b : 256 + n++;
        m->byte_cp[b] = cp;
        m->cp_byte[cp] = (int16_t)b;
        utf8proc_uint8_t tmp[4];
        utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
        memcpy(m->byte_utf8[b], tmp, (size_t)k);
        m->byte_utf8_len[b] = (uint8_t)k;
    }
}

/* bytelevel_byte_of: the byte a ByteLevel character stands for, or -1. */
static int bytelevel_byte_of(const struct bytelevel_map *m, int32_t cp) {
    return cp >= 0 && cp < 324 ? m->cp_byte[cp] : -1;
}

/* ------------------------------------------------------------------------- */
/* Regexes. Patterns from tokenizer.json are Oniguruma (Ruby syntax) patterns; PCRE2
 * with UTF+UCP agrees on everything these files use once \s, \S, \w, \W and \d are
 * widened to Oniguruma's Unicode classes and ^/$ are made line anchors. String
 * patterns are matched literally without PCRE2. */

struct regex {
    pcre2_code *code; /* NULL for a literal */
    char *lit;        /* literal pattern (arena) */
    size_t lit_len;
};

#define ONIG_SPACE_EXTRA "\\x{85}"
#define ONIG_WORD_CLASS "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}\\x{200D}\\x{24B6}-\\x{24E9}"

/* regex_translate: rewrite an Oniguruma pattern's \s \S \w \W for PCRE2 (see above). */
static void regex_translate(const char *p, size_t n, struct buf *out) {
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            i++;
            if (d == 's' || d == 'S' || d == 'w' || d == 'W') {
                int neg = d == 'S' || d == 'W';
                const char *cls = (d == 's' || d == 'S') ? "\\s" ONIG_SPACE_EXTRA : ONIG_WORD_CLASS;
                if (!in_class) {
                    buf_put(out, neg ? "[^" : "[", neg ? 2 : 1);
                    buf_put(out, cls, strlen(cls));
                    buf_putc(out, ']');
                } else if (!neg) {
                    buf_put(out, cls, strlen(cls));
                } else {
                    buf_putc(out, '\\');
                    buf_putc(out, d);
                }
                continue;
            }
            buf_putc(out, '\\');
            buf_putc(out, d);
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            buf_putc(out, c);
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && p[i + 1] == '^') buf_putc(out, p[++i]);
            if (i + 1 < n && p[i + 1] == ']') buf_putc(out, p[++i]);
            continue;
        }
        if (c == '[' && in_class && i + 1 < n && p[i + 1] == ':') {
            const char *end = memchr(p + i + 2, ']', n - i - 2);
            if (end && end[-1] == ':') {
                size_t k = (size_t)(end - (p + i)) + 1;
                buf_put(out, p + i, k);
                i += k - 1;
                continue;
            }
        }
        if (c == ']' && in_class) in_class = 0;
        buf_putc(out, c);
    }
}

/* regex_compile: compile a {"String": ...} (literal) or {"Regex": ...} pattern. */
static enum moe_status regex_compile(struct arena *a, const char *pat, size_t n, int literal,
                                     const char *what, struct regex *re) {
    memset(re, 0, sizeof *re);
    if (literal) {
        re->lit = arena_dup(a, pat, n);
        re->lit_len = n;
        return re->lit ? MOE_OK : MOE_ERR_NOMEM;
    }
    struct buf t = {0};
    regex_translate(pat, n, &t);
    if (t.oom) {
        buf_free(&t);
        return MOE_ERR_NOMEM;
    }
    int err = 0;
    PCRE2_SIZE erroff = 0;
    re->code = pcre2_compile((PCRE2_SPTR)(t.p ? t.p : ""), t.n,
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &erroff, NULL);
    buf_free(&t);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        MOE_LOGE("%s: cannot compile regex \"%.*s\": %s (at %zu)", what, (int)(n > 200 ? 200 : n),
                 pat, (const char *)msg, (size_t)erroff);
        return MOE_ERR_FORMAT;
    }
    (void)pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE); /* optional speed-up */
    return MOE_OK;
}

/* regex_free: release a compiled pattern (the literal lives in the arena). */
static void regex_free(struct regex *re) {
    if (re->code) pcre2_code_free(re->code);
    re->code = NULL;
}

struct span {
    size_t s, e;
    int m; /* 1 = a match / delimiter */
};

struct spanvec {
    struct span *v;
    size_t n, cap;
    int oom;
};

/* spans_push: append one span. */
static void spans_push(struct spanvec *sv, size_t s, size_t e, int m) {
    if (sv->oom) return;
    if (!grow((void **)&sv->v, &sv->cap, sv->n + 1, sizeof *sv->v)) {
        sv->oom = 1;
        return;
    }
    sv->v[sv->n++] = (struct span){s, e, m};
}

/* regex_search: first match at or after `from` in s[0..n) (valid UTF-8).
 * Returns 1 with the match bounds in ms and me, 0 for no match, -1 on a PCRE2 error. */
static int regex_search(const struct regex *re, pcre2_match_data *md, const char *s, size_t n,
                        size_t from, size_t *ms, size_t *me) {
    if (!s) s = ""; /* an empty buffer that was never allocated */
    if (!re->code) {
        size_t k = re->lit_len;
        if (k == 0) {
            *ms = *me = from;
            return 1;
        }
        for (size_t i = from; i + k <= n; i++) {
            const char *hit = memchr(s + i, re->lit[0], n - i - k + 1);
            if (!hit) return 0;
            i = (size_t)(hit - s);
            if (memcmp(hit, re->lit, k) == 0) {
                *ms = i;
                *me = i + k;
                return 1;
            }
        }
        return 0;
    }
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        MOE_LOGE("regex match failed: %s", (const char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    if (*me < *ms) *me = *ms; /* \K can do this; treat as empty */
    return 1;
}

/* regex_find_all: every match in s[0..n), as the onig crate's find_iter yields them
 * (an empty match right where the previous match ended is skipped). Returns 0 or -1. */
static int regex_find_all(const struct regex *re, pcre2_match_data *md, const char *s, size_t n,
                          struct spanvec *out) {
    size_t last_end = 0, last_match_end = 0;
    int have_last = 0;
    out->n = 0;
    while (last_end <= n) {
        size_t ms, me;
        int r = regex_search(re, md, s, n, last_end, &ms, &me);
        if (r < 0) return -1;
        if (r == 0) break;
        if (ms == me && have_last && last_match_end == me) {
            if (last_end >= n) break;
            last_end += char_len(s, n, last_end);
            continue;
        }
        last_end = me;
        last_match_end = me;
        have_last = 1;
        spans_push(out, ms, me, 1);
    }
    return out->oom ? -1 : 0;
}

/* matches_to_spans: cover s[0..n) with the matches and the gaps between them, as
 * Pattern::find_matches does for regexes. */
static void matches_to_spans(const struct spanvec *m, size_t n, struct spanvec *out) {
    out->n = 0;
    if (n == 0) {
        spans_push(out, 0, 0, 0);
        return;
    }
    size_t prev = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (prev != m->v[i].s) spans_push(out, prev, m->v[i].s, 0);
        spans_push(out, m->v[i].s, m->v[i].e, 1);
        prev = m->v[i].e;
    }
    if (prev != n) spans_push(out, prev, n, 0);
}

/* char_spans: cover s[0..n) with one span per character for which pred() holds and
 * spans for the runs between them, as Pattern::find_matches does for closures. */
static void char_spans(const char *s, size_t n, int (*pred)(int32_t, int32_t), int32_t arg,
                       struct spanvec *out) {
    out->n = 0;
    if (n == 0) {
        spans_push(out, 0, 0, 0);
        return;
    }
    size_t last_off = 0, i = 0;
    while (i < n) {
        int32_t cp;
        size_t k = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (pred(cp, arg)) {
            if (last_off < i) spans_push(out, last_off, i, 0);
            spans_push(out, i, i + k, 1);
            last_off = i + k;
        }
        i += k;
    }
    if (n > last_off) spans_push(out, last_off, n, 0);
}

/* ------------------------------------------------------------------------- */
/* The pipeline's components, parsed from tokenizer.json. */

enum nz_type {
    NZ_NFC, NZ_NFD, NZ_NFKC, NZ_NFKD, NZ_LOWERCASE, NZ_PREPEND, NZ_REPLACE, NZ_STRIP,
    NZ_STRIP_ACCENTS, NZ_BYTELEVEL, NZ_SEQUENCE
};

struct normalizer {
    enum nz_type type;
    const char *str; /* Prepend text, Replace content (arena) */
    size_t str_len;
    struct regex re; /* Replace pattern */
    int left, right; /* Strip */
    struct normalizer **kids;
    size_t n_kids;
};

enum pt_type {
    PT_BYTELEVEL, PT_SPLIT, PT_METASPACE, PT_WHITESPACE, PT_WHITESPACE_SPLIT, PT_DIGITS,
    PT_PUNCTUATION, PT_CHAR_DELIMITER, PT_BERT, PT_SEQUENCE
};

/* SplitDelimiterBehavior */
enum behavior { SB_REMOVED, SB_ISOLATED, SB_MERGED_PREV, SB_MERGED_NEXT, SB_CONTIGUOUS };

enum prepend_scheme { PS_ALWAYS, PS_FIRST, PS_NEVER };

struct pretok {
    enum pt_type type;
    struct regex re;        /* Split pattern; ByteLevel's GPT-2 regex */
    enum behavior behavior; /* Split, Punctuation */
    int invert;             /* Split */
    int add_prefix_space, use_regex; /* ByteLevel */
    int32_t ch;             /* Metaspace replacement, CharDelimiterSplit delimiter */
    char ch_s[5];
    size_t ch_len;
    enum prepend_scheme prepend; /* Metaspace */
    int split;                   /* Metaspace */
    int individual;              /* Digits */
    struct pretok **kids;
    size_t n_kids;
};

enum dec_type {
    DEC_BYTELEVEL, DEC_METASPACE, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_BPE,
    DEC_SEQUENCE
};

struct decoder {
    enum dec_type type;
    struct regex re;   /* Replace pattern */
    const char *str;   /* Replace content, BPEDecoder suffix (arena) */
    size_t str_len;
    int32_t ch;        /* Metaspace replacement, Strip content */
    char ch_s[5];
    size_t ch_len;
    enum prepend_scheme prepend;
    size_t start, stop; /* Strip */
    struct decoder **kids;
    size_t n_kids;
};

/* An added token, as AddedVocabulary keeps it. */
struct added_token {
    const char *content; /* arena */
    size_t len;
    const char *dec;     /* what decoding shows: the normalized content if `normalized` */
    size_t dec_len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
};

/* Patterns for one leftmost-longest matcher, grouped by first byte, longest first. */
struct amatch_pat {
    const char *s;
    size_t len;
    int32_t id;
};

struct amatcher {
    struct amatch_pat *v;
    size_t n;
    uint32_t start[257]; /* patterns starting with byte b are v[start[b] .. start[b+1]) */
};

struct moe_tokenizer {
    struct arena arena;
    char label[128];

    /* model (BPE) */
    struct smap vocab;         /* model vocabulary: string -> id */
    size_t n_model;            /* entries in the model vocab (BPE::get_vocab_size) */
    struct mmap_pairs merges;  /* (left, right) -> (rank, new id) */
    int32_t unk_id;            /* -1: no unk token */
    int unk_missing;           /* unk_token names a string that is not in the vocab */
    const char *unk_str;
    int byte_fallback, fuse_unk, ignore_merges;
    const char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix (NULL = none) */
    size_t prefix_len, suffix_len;
    int32_t byte_id[256];      /* ids of <0xXX> tokens, -1 if absent */
    int32_t *cp_id;            /* ids of single-character tokens for code points < TOK_FAST_CP */

    /* added vocabulary */
    struct smap added_map;     /* content -> id */
    struct added_token *added; /* one per id that has an added token (added_tokens_map_r) */
    size_t n_added;
    struct amatcher raw_match, norm_match;

    /* id tables, n_vocab entries */
    int32_t n_vocab;
    const char **id_str;       /* NULL for ids nothing maps to */
    uint32_t *id_len;
    uint8_t *id_special;       /* a special added token (moe_tokenizer_is_special) */
    uint8_t *id_skip;          /* left out by decode(skip_special): its decoded string is special */
    int32_t *id_added;         /* index into added[] or -1 */

    struct normalizer *normalizer;
    struct pretok *pretok;
    struct decoder *decoder;
    int32_t *post_pre, *post_suf; /* ids the post-processor puts around a single sequence */
    size_t n_post_pre, n_post_suf;

    int32_t bos, eos;
    struct bytelevel_map bl;
};

/* ------------------------------------------------------------------------- */
/* JSON helpers. */

/* jget: member `k` of object `o`, treating JSON null as absent. */
static const cJSON *jget(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

/* jstr: the string value of member `k`, or NULL (absent, null or not a string). */
static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = jget(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* jbool: the boolean member `k`, or dflt when absent or not a boolean. */
static int jbool(const cJSON *o, const char *k, int dflt) {
    const cJSON *v = jget(o, k);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

/* jcount: a non-negative integer member `k` (dflt when absent); -1 if malformed. */
static long long jcount(const cJSON *o, const char *k, long long dflt) {
    const cJSON *v = jget(o, k);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 1e15 ||
        floor(v->valuedouble) != v->valuedouble)
        return -1;
    return (long long)v->valuedouble;
}

/* jchar: member `k` as exactly one character. */
static enum moe_status jchar(const struct moe_tokenizer *tok, const cJSON *o, const char *k,
                             const char *what, int32_t *cp, char s[5], size_t *len) {
    const char *v = jstr(o, k);
    if (!v) {
        MOE_LOGE("%s: %s: \"%s\" is missing or not a string", tok->label, what, k);
        return MOE_ERR_FORMAT;
    }
    size_t n = strlen(v);
    int32_t c = -1;
    size_t used = n ? utf8_decode((const unsigned char *)v, n, &c) : 0;
    if (n == 0 || c < 0 || used != n) {
        MOE_LOGE("%s: %s: \"%s\" must be exactly one character", tok->label, what, k);
        return MOE_ERR_FORMAT;
    }
    *cp = c;
    memcpy(s, v, n);
    s[n] = 0;
    *len = n;
    return MOE_OK;
}

/* jpattern: a {"String": ...} or {"Regex": ...} member `k`, compiled. */
static enum moe_status jpattern(struct moe_tokenizer *tok, const cJSON *o, const char *k,
                                const char *what, struct regex *re) {
    const cJSON *p = jget(o, k);
    const char *lit = jstr(p, "String"), *rx = jstr(p, "Regex");
    if (!lit && !rx) {
        MOE_LOGE("%s: %s: \"%s\" must be {\"String\": ...} or {\"Regex\": ...}", tok->label, what, k);
        return MOE_ERR_FORMAT;
    }
    const char *s = lit ? lit : rx;
    return regex_compile(&tok->arena, s, strlen(s), lit != NULL, what, re);
}

/* jtype: the "type" of a component object, or NULL with a logged error. */
static const char *jtype(const struct moe_tokenizer *tok, const cJSON *o, const char *what) {
    const char *t = jstr(o, "type");
    if (!t) MOE_LOGE("%s: %s has no \"type\"", tok->label, what);
    return t;
}

/* unsupported: log that a component type is not handled. */
static enum moe_status unsupported(const struct moe_tokenizer *tok, const char *what, const char *type) {
    MOE_LOGE("%s: %s type \"%s\" is not supported", tok->label, what, type);
    return MOE_ERR_UNSUPPORTED;
}

#define MAX_DEPTH 32 /* nesting of Sequence components */

/* jkids: the array member `k` of a Sequence component, checked. */
static enum moe_status jkids(const struct moe_tokenizer *tok, const cJSON *o, const char *k,
                             const char *what, const cJSON **arr, size_t *n) {
    *arr = jget(o, k);
    if (!cJSON_IsArray(*arr)) {
        MOE_LOGE("%s: %s Sequence needs an array \"%s\"", tok->label, what, k);
        return MOE_ERR_FORMAT;
    }
    *n = (size_t)cJSON_GetArraySize(*arr);
    return MOE_OK;
}

/* ------------------------------------------------------------------------- */
/* Parsing and freeing the components. */

/* normalizer_free: release a normalizer tree. */
static void normalizer_free(struct normalizer *nz) {
    if (!nz) return;
    for (size_t i = 0; i < nz->n_kids; i++) normalizer_free(nz->kids[i]);
    free(nz->kids);
    regex_free(&nz->re);
    free(nz);
}

/* pretok_free: release a pre-tokenizer tree. */
static void pretok_free(struct pretok *pt) {
    if (!pt) return;
    for (size_t i = 0; i < pt->n_kids; i++) pretok_free(pt->kids[i]);
    free(pt->kids);
    regex_free(&pt->re);
    free(pt);
}

/* decoder_free: release a decoder tree. */
static void decoder_free(struct decoder *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_kids; i++) decoder_free(d->kids[i]);
    free(d->kids);
    regex_free(&d->re);
    free(d);
}

/* parse_normalizer: build a normalizer from its JSON object (recursive for Sequence). */
static enum moe_status parse_normalizer(struct moe_tokenizer *tok, const cJSON *j, int depth,
                                        struct normalizer **out) {
    static const char *what = "normalizer";
    *out = NULL;
    if (depth > MAX_DEPTH) {
        MOE_LOGE("%s: normalizers nested too deeply", tok->label);
        return MOE_ERR_FORMAT;
    }
    const char *type = jtype(tok, j, what);
    if (!type) return MOE_ERR_FORMAT;
    struct normalizer *nz = calloc(1, sizeof *nz);
    if (!nz) return MOE_ERR_NOMEM;
    enum moe_status st = MOE_OK;
    if (!strcmp(type, "NFC")) nz->type = NZ_NFC;
    else if (!strcmp(type, "NFD")) nz->type = NZ_NFD;
    else if (!strcmp(type, "NFKC")) nz->type = NZ_NFKC;
    else if (!strcmp(type, "NFKD")) nz->type = NZ_NFKD;
    else if (!strcmp(type, "Lowercase")) nz->type = NZ_LOWERCASE;
    else if (!strcmp(type, "StripAccents")) nz->type = NZ_STRIP_ACCENTS;
    else if (!strcmp(type, "ByteLevel")) nz->type = NZ_BYTELEVEL;
    else if (!strcmp(type, "Strip")) {
        nz->type = NZ_STRIP;
        nz->left = jbool(j, "strip_left", 1);
        nz->right = jbool(j, "strip_right", 1);
    } else if (!strcmp(type, "Prepend")) {
        nz->type = NZ_PREPEND;
        const char *p = jstr(j, "prepend");
        if (!p) {
            MOE_LOGE("%s: Prepend normalizer needs a string \"prepend\"", tok->label);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        nz->str_len = strlen(p);
        if (!(nz->str = arena_dup(&tok->arena, p, nz->str_len))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
    } else if (!strcmp(type, "Replace")) {
        nz->type = NZ_REPLACE;
        const char *content = jstr(j, "content");
        if (!content) {
            MOE_LOGE("%s: Replace normalizer needs a string \"content\"", tok->label);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        nz->str_len = strlen(content);
        if (!(nz->str = arena_dup(&tok->arena, content, nz->str_len))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
        if ((st = jpattern(tok, j, "pattern", "Replace normalizer", &nz->re)) != MOE_OK) goto fail;
    } else if (!strcmp(type, "Sequence")) {
        nz->type = NZ_SEQUENCE;
        const cJSON *arr;
        size_t n;
        if ((st = jkids(tok, j, "normalizers", what, &arr, &n)) != MOE_OK) goto fail;
        if (n && !(nz->kids = calloc(n, sizeof *nz->kids))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) {
            if ((st = parse_normalizer(tok, e, depth + 1, &nz->kids[nz->n_kids])) != MOE_OK) goto fail;
            nz->n_kids++;
        }
    } else {
        st = unsupported(tok, what, type);
        goto fail;
    }
    *out = nz;
    return MOE_OK;
fail:
    normalizer_free(nz);
    return st;
}

/* parse_behavior: a SplitDelimiterBehavior name ("Isolated", "merged_with_next", ...). */
static enum moe_status parse_behavior(const struct moe_tokenizer *tok, const cJSON *j,
                                      enum behavior dflt, enum behavior *out) {
    const char *b = jstr(j, "behavior");
    *out = dflt;
    if (!b) return MOE_OK;
    char norm[32];
    size_t k = 0;
    for (const char *p = b; *p && k + 1 < sizeof norm; p++)
        if (*p != '_') norm[k++] = (char)((*p >= 'A' && *p <= 'Z') ? *p - 'A' + 'a' : *p);
    norm[k] = 0;
    if (!strcmp(norm, "removed")) *out = SB_REMOVED;
    else if (!strcmp(norm, "isolated")) *out = SB_ISOLATED;
    else if (!strcmp(norm, "mergedwithprevious")) *out = SB_MERGED_PREV;
    else if (!strcmp(norm, "mergedwithnext")) *out = SB_MERGED_NEXT;
    else if (!strcmp(norm, "contiguous")) *out = SB_CONTIGUOUS;
    else {
        MOE_LOGE("%s: unknown split behavior \"%s\"", tok->label, b);
        return MOE_ERR_FORMAT;
    }
    return MOE_OK;
}

/* parse_prepend_scheme: Metaspace's prepend_scheme, or the older add_prefix_space. */
static enum moe_status parse_prepend_scheme(const struct moe_tokenizer *tok, const cJSON *j,
                                            enum prepend_scheme *out) {
    const char *s = jstr(j, "prepend_scheme");
    *out = PS_ALWAYS;
    if (s) {
        if (!strcmp(s, "always")) *out = PS_ALWAYS;
        else if (!strcmp(s, "first")) *out = PS_FIRST;
        else if (!strcmp(s, "never")) *out = PS_NEVER;
        else {
            MOE_LOGE("%s: Metaspace: unknown prepend_scheme \"%s\"", tok->label, s);
            return MOE_ERR_FORMAT;
        }
    }
    if (!jbool(j, "add_prefix_space", 1)) {
        if (s && *out != PS_NEVER) {
            MOE_LOGE("%s: Metaspace: add_prefix_space does not match prepend_scheme", tok->label);
            return MOE_ERR_FORMAT;
        }
        *out = PS_NEVER;
    }
    return MOE_OK;
}

/* The regex GPT-2 splits words with (ByteLevel's use_regex). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* parse_pretok: build a pre-tokenizer from its JSON object (recursive for Sequence). */
static enum moe_status parse_pretok(struct moe_tokenizer *tok, const cJSON *j, int depth,
                                    struct pretok **out) {
    static const char *what = "pre_tokenizer";
    *out = NULL;
    if (depth > MAX_DEPTH) {
        MOE_LOGE("%s: pre-tokenizers nested too deeply", tok->label);
        return MOE_ERR_FORMAT;
    }
    const char *type = jtype(tok, j, what);
    if (!type) return MOE_ERR_FORMAT;
    struct pretok *pt = calloc(1, sizeof *pt);
    if (!pt) return MOE_ERR_NOMEM;
    enum moe_status st = MOE_OK;
    if (!strcmp(type, "ByteLevel")) {
        pt->type = PT_BYTELEVEL;
        pt->add_prefix_space = jbool(j, "add_prefix_space", 1);
        pt->use_regex = jbool(j, "use_regex", 1);
        if (pt->use_regex &&
            (st = regex_compile(&tok->arena, GPT2_PATTERN, strlen(GPT2_PATTERN), 0, "ByteLevel", &pt->re)) != MOE_OK)
            goto fail;
    } else if (!strcmp(type, "Split")) {
        pt->type = PT_SPLIT;
        pt->invert = jbool(j, "invert", 0);
        if ((st = parse_behavior(tok, j, SB_ISOLATED, &pt->behavior)) != MOE_OK) goto fail;
        if (!jstr(j, "behavior")) {
            MOE_LOGE("%s: Split pre-tokenizer needs a \"behavior\"", tok->label);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        if ((st = jpattern(tok, j, "pattern", "Split pre-tokenizer", &pt->re)) != MOE_OK) goto fail;
    } else if (!strcmp(type, "Metaspace")) {
        pt->type = PT_METASPACE;
        if ((st = jchar(tok, j, "replacement", "Metaspace", &pt->ch, pt->ch_s, &pt->ch_len)) != MOE_OK) goto fail;
        if ((st = parse_prepend_scheme(tok, j, &pt->prepend)) != MOE_OK) goto fail;
        pt->split = jbool(j, "split", 1);
    } else if (!strcmp(type, "Whitespace")) {
        pt->type = PT_WHITESPACE;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        pt->type = PT_WHITESPACE_SPLIT;
    } else if (!strcmp(type, "BertPreTokenizer")) {
        pt->type = PT_BERT;
    } else if (!strcmp(type, "Digits")) {
        pt->type = PT_DIGITS;
        pt->individual = jbool(j, "individual_digits", 0);
    } else if (!strcmp(type, "Punctuation")) {
        pt->type = PT_PUNCTUATION;
        if ((st = parse_behavior(tok, j, SB_ISOLATED, &pt->behavior)) != MOE_OK) goto fail;
    } else if (!strcmp(type, "CharDelimiterSplit")) {
        pt->type = PT_CHAR_DELIMITER;
        if ((st = jchar(tok, j, "delimiter", "CharDelimiterSplit", &pt->ch, pt->ch_s, &pt->ch_len)) != MOE_OK)
            goto fail;
    } else if (!strcmp(type, "Sequence")) {
        pt->type = PT_SEQUENCE;
        const cJSON *arr;
        size_t n;
        if ((st = jkids(tok, j, "pretokenizers", what, &arr, &n)) != MOE_OK) goto fail;
        if (n && !(pt->kids = calloc(n, sizeof *pt->kids))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) {
            if ((st = parse_pretok(tok, e, depth + 1, &pt->kids[pt->n_kids])) != MOE_OK) goto fail;
            pt->n_kids++;
        }
    } else {
        st = unsupported(tok, what, type);
        goto fail;
    }
    *out = pt;
    return MOE_OK;
fail:
    pretok_free(pt);
    return st;
}

/* parse_decoder: build a decoder from its JSON object (recursive for Sequence). */
static enum moe_status parse_decoder(struct moe_tokenizer *tok, const cJSON *j, int depth,
                                     struct decoder **out) {
    static const char *what = "decoder";
    *out = NULL;
    if (depth > MAX_DEPTH) {
        MOE_LOGE("%s: decoders nested too deeply", tok->label);
        return MOE_ERR_FORMAT;
    }
    const char *type = jtype(tok, j, what);
    if (!type) return MOE_ERR_FORMAT;
    struct decoder *d = calloc(1, sizeof *d);
    if (!d) return MOE_ERR_NOMEM;
    enum moe_status st = MOE_OK;
    if (!strcmp(type, "ByteLevel")) d->type = DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) d->type = DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) d->type = DEC_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->type = DEC_METASPACE;
        if ((st = jchar(tok, j, "replacement", "Metaspace decoder", &d->ch, d->ch_s, &d->ch_len)) != MOE_OK)
            goto fail;
        if ((st = parse_prepend_scheme(tok, j, &d->prepend)) != MOE_OK) goto fail;
    } else if (!strcmp(type, "Replace")) {
        d->type = DEC_REPLACE;
        const char *content = jstr(j, "content");
        if (!content) {
            MOE_LOGE("%s: Replace decoder needs a string \"content\"", tok->label);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        d->str_len = strlen(content);
        if (!(d->str = arena_dup(&tok->arena, content, d->str_len))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
        if ((st = jpattern(tok, j, "pattern", "Replace decoder", &d->re)) != MOE_OK) goto fail;
    } else if (!strcmp(type, "Strip")) {
        d->type = DEC_STRIP;
        if ((st = jchar(tok, j, "content", "Strip decoder", &d->ch, d->ch_s, &d->ch_len)) != MOE_OK) goto fail;
        long long a = jcount(j, "start", 0), b = jcount(j, "stop", 0);
        if (a < 0 || b < 0) {
            MOE_LOGE("%s: Strip decoder: start/stop must be non-negative integers", tok->label);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        d->start = (size_t)a;
        d->stop = (size_t)b;
    } else if (!strcmp(type, "BPEDecoder")) {
        d->type = DEC_BPE;
        const char *suffix = jstr(j, "suffix");
        if (!suffix) suffix = "</w>";
        d->str_len = strlen(suffix);
        if (!(d->str = arena_dup(&tok->arena, suffix, d->str_len))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
    } else if (!strcmp(type, "Sequence")) {
        d->type = DEC_SEQUENCE;
        const cJSON *arr;
        size_t n;
        if ((st = jkids(tok, j, "decoders", what, &arr, &n)) != MOE_OK) goto fail;
        if (n && !(d->kids = calloc(n, sizeof *d->kids))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) {
            if ((st = parse_decoder(tok, e, depth + 1, &d->kids[d->n_kids])) != MOE_OK) goto fail;
            d->n_kids++;
        }
    } else {
        st = unsupported(tok, what, type);
        goto fail;
    }
    *out = d;
    return MOE_OK;
fail:
    decoder_free(d);
    return st;
}

/* ------------------------------------------------------------------------- */
/* Loading: model, added tokens, post-processor, id tables, BOS/EOS. */

/* json_id: a token id from JSON: an integer in [0, TOK_MAX_ID). -1 if malformed. */
static int32_t json_id(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0) || d >= (double)TOK_MAX_ID || floor(d) != d) return -1;
    return (int32_t)d;
}

/* vocab_lookup: id of a string in the model vocab, or -1. */
static int32_t vocab_lookup(const struct moe_tokenizer *tok, const char *s, size_t n) {
    return smap_get(&tok->vocab, s, n);
}

/* load_merge_pair: split one merges entry ("a b" or ["a", "b"]) into its two halves.
 * An array may carry a third element, the merge's rank (an integer in
 * [0, 2^31)): GGUF SentencePiece vocabularies (gguf-vocab.c) give merges of
 * equal score equal ranks, so that the leftmost of them wins as in
 * SentencePiece; *rank_out is left alone otherwise. */
static enum moe_status load_merge_pair(const struct moe_tokenizer *tok, const cJSON *m, size_t rank,
                                       const char **a, size_t *na, const char **b, size_t *nb, int *skip,
                                       uint32_t *rank_out) {
    *skip = 0;
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring;
        if (!strncmp(s, "#version", 8)) {
            *skip = 1;
            return MOE_OK;
        }
        const char *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) {
            MOE_LOGE("%s: merge %zu (\"%.60s\") is not two tokens separated by one space", tok->label,
                     rank + 1, s);
            return MOE_ERR_FORMAT;
        }
        *a = s;
        *na = (size_t)(sp - s);
        *b = sp + 1;
        *nb = strlen(sp + 1);
        return MOE_OK;
    }
    const int na_ = cJSON_IsArray(m) ? cJSON_GetArraySize(m) : 0;
    if ((na_ == 2 || na_ == 3) && cJSON_IsString(m->child) && cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring;
        *na = strlen(*a);
        *b = m->child->next->valuestring;
        *nb = strlen(*b);
        if (na_ == 2) return MOE_OK;
        const cJSON *r = m->child->next->next;
        if (cJSON_IsNumber(r) && r->valuedouble >= 0 && r->valuedouble < 2147483648.0 &&
            floor(r->valuedouble) == r->valuedouble) {
            *rank_out = (uint32_t)r->valuedouble;
            return MOE_OK;
        }
        MOE_LOGE("%s: merge %zu: the rank (third element) must be an integer in [0, 2^31)", tok->label, rank + 1);
        return MOE_ERR_FORMAT;
    }
    MOE_LOGE("%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"] (or [\"a\", \"b\", rank])", tok->label, rank + 1);
    return MOE_ERR_FORMAT;
}

/* load_merges: build the (left, right) -> (rank, new id) table, as BPE::from_builder does. */
static enum moe_status load_merges(struct moe_tokenizer *tok, const cJSON *merges) {
    size_t n = cJSON_IsArray(merges) ? (size_t)cJSON_GetArraySize(merges) : 0;
    if (merges && !cJSON_IsArray(merges)) {
        MOE_LOGE("%s: model.merges is not an array", tok->label);
        return MOE_ERR_FORMAT;
    }
    if (!merges_init(&tok->merges, n)) return MOE_ERR_NOMEM;
    struct buf joined = {0};
    enum moe_status st = MOE_OK;
    size_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        size_t na, nb;
        int skip;
        uint32_t r = (uint32_t)rank;
        if ((st = load_merge_pair(tok, m, rank, &a, &na, &b, &nb, &skip, &r)) != MOE_OK) goto fail;
        if (skip) continue;
        int32_t ia = vocab_lookup(tok, a, na), ib = vocab_lookup(tok, b, nb);
        if (ia < 0 || ib < 0) {
            MOE_LOGE("%s: merge %zu names a token that is not in the vocab: \"%.*s\"", tok->label, rank + 1,
                     (int)(ia < 0 ? (na > 60 ? 60 : na) : (nb > 60 ? 60 : nb)), ia < 0 ? a : b);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        if (nb < tok->prefix_len) {
            MOE_LOGE("%s: merge %zu: right part is shorter than continuing_subword_prefix", tok->label, rank + 1);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        joined.n = 0;
        buf_put(&joined, a, na);
        buf_put(&joined, b + tok->prefix_len, nb - tok->prefix_len);
        if (joined.oom) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
        int32_t inew = vocab_lookup(tok, joined.p, joined.n);
        if (inew < 0) {
            MOE_LOGE("%s: merge %zu makes \"%.*s\", which is not in the vocab", tok->label, rank + 1,
                     (int)(joined.n > 60 ? 60 : joined.n), joined.p);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        merges_put(&tok->merges, ia, ib, r, inew);
        rank++;
    }
    if (rank == 0 && tok->n_model > 256) {
        MOE_LOGE("%s: BPE model has %zu vocab entries but no merges; the file is truncated or in an "
                 "unknown layout", tok->label, tok->n_model);
        st = MOE_ERR_FORMAT;
    }
fail:
    buf_free(&joined);
    return st;
}

/* opt_string: an optional string member copied to the arena ("" counts as absent). */
static enum moe_status opt_string(struct moe_tokenizer *tok, const cJSON *o, const char *k,
                                  const char **out, size_t *len) {
    const char *s = jstr(o, k);
    *out = NULL;
    *len = 0;
    if (!s || !*s) return MOE_OK;
    *len = strlen(s);
    return (*out = arena_dup(&tok->arena, s, *len)) ? MOE_OK : MOE_ERR_NOMEM;
}

/* load_bpe: the "model" object of type BPE: vocab, merges and options. */
static enum moe_status load_bpe(struct moe_tokenizer *tok, const cJSON *model, int32_t *max_id) {
    enum moe_status st;
    const cJSON *vocab = jget(model, "vocab");
    if (!cJSON_IsObject(vocab)) {
        MOE_LOGE("%s: BPE model has no \"vocab\" object", tok->label);
        return MOE_ERR_FORMAT;
    }
    const cJSON *dropout = jget(model, "dropout");
    if (dropout && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        MOE_LOGW("%s: BPE dropout is set; ignoring it (encoding is deterministic)", tok->label);
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int32_t id = json_id(e);
        if (id < 0 || !e->string) {
            MOE_LOGE("%s: vocab entry \"%.60s\" has an invalid id", tok->label, e->string ? e->string : "");
            return MOE_ERR_FORMAT;
        }
        size_t n = strlen(e->string);
        const char *key = arena_dup(&tok->arena, e->string, n);
        if (!key || !smap_put(&tok->vocab, key, n, id)) return MOE_ERR_NOMEM;
        if (id > *max_id) *max_id = id;
    }
    tok->n_model = tok->vocab.n;
    if ((size_t)*max_id > 4 * tok->n_model + 65536) {
        MOE_LOGE("%s: vocab ids reach %d for only %zu entries", tok->label, *max_id, tok->n_model);
        return MOE_ERR_FORMAT;
    }
    tok->byte_fallback = jbool(model, "byte_fallback", 0);
    tok->fuse_unk = jbool(model, "fuse_unk", 0);
    tok->ignore_merges = jbool(model, "ignore_merges", 0);
    if ((st = opt_string(tok, model, "continuing_subword_prefix", &tok->prefix, &tok->prefix_len)) != MOE_OK)
        return st;
    if ((st = opt_string(tok, model, "end_of_word_suffix", &tok->suffix, &tok->suffix_len)) != MOE_OK)
        return st;
    size_t unk_len;
    if ((st = opt_string(tok, model, "unk_token", &tok->unk_str, &unk_len)) != MOE_OK) return st;
    tok->unk_id = -1;
    if (tok->unk_str) {
        tok->unk_id = vocab_lookup(tok, tok->unk_str, unk_len);
        tok->unk_missing = tok->unk_id < 0;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_id[b] = vocab_lookup(tok, name, 6);
    }
    return load_merges(tok, jget(model, "merges"));
}

/* load_model: dispatch on model.type; only BPE is supported. */
static enum moe_status load_model(struct moe_tokenizer *tok, const cJSON *root, int32_t *max_id) {
    const cJSON *model = jget(root, "model");
    if (!cJSON_IsObject(model)) {
        MOE_LOGE("%s: no \"model\" object", tok->label);
        return MOE_ERR_FORMAT;
    }
    const char *type = jstr(model, "type");
    if (!type) {
        /* files from before "type" was written: BPE is the one with merges */
        if (jget(model, "merges")) type = "BPE";
        else {
            MOE_LOGE("%s: model has no \"type\" and no merges", tok->label);
            return MOE_ERR_UNSUPPORTED;
        }
    }
    if (strcmp(type, "BPE") != 0) {
        MOE_LOGE("%s: model type \"%s\" is not supported (only BPE)", tok->label, type);
        return MOE_ERR_UNSUPPORTED;
    }
    return load_bpe(tok, model, max_id);
}

struct added_src {
    const char *content;
    size_t len;
    uint8_t special, lstrip, rstrip, single_word, normalized;
};

/* same_added: whether two added tokens are equal in every field (AddedToken's PartialEq). */
static int same_added(const struct added_token *a, const struct added_src *b) {
    return a->len == b->len && !memcmp(a->content, b->content, b->len) && a->special == b->special &&
           a->lstrip == b->lstrip && a->rstrip == b->rstrip && a->single_word == b->single_word &&
           a->normalized == b->normalized;
}

/* load_added: read "added_tokens" and give each its id the way the tokenizers library
 * does on load (the ids written in the file are only a hint there): an existing id for
 * the content if the added or model vocab has one, else the next free id. */
static enum moe_status load_added(struct moe_tokenizer *tok, const cJSON *root, int32_t *max_id,
                                  struct smap *special_set) {
    const cJSON *arr = jget(root, "added_tokens");
    if (!arr) return MOE_OK;
    if (!cJSON_IsArray(arr)) {
        MOE_LOGE("%s: \"added_tokens\" is not an array", tok->label);
        return MOE_ERR_FORMAT;
    }
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n > (size_t)TOK_MAX_ID) return MOE_ERR_FORMAT;
    if (n && !(tok->added = calloc(n, sizeof *tok->added))) return MOE_ERR_NOMEM;
    /* slot_of: id -> index in tok->added (added_tokens_map_r), for every id we can give out */
    size_t id_bound = (size_t)(*max_id + 1) > tok->n_model ? (size_t)(*max_id + 1) : tok->n_model;
    id_bound += n + 1;
    int32_t *slot_of = malloc(id_bound * sizeof *slot_of);
    if (!slot_of) return MOE_ERR_NOMEM;
    for (size_t i = 0; i < id_bound; i++) slot_of[i] = -1;
    enum moe_status st = MOE_OK;
    int32_t max_added = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const char *content = jstr(e, "content");
        if (!content || json_id(jget(e, "id")) < 0) {
            MOE_LOGE("%s: an added token lacks a string \"content\" or a valid \"id\"", tok->label);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        struct added_src src = {content, strlen(content), (uint8_t)jbool(e, "special", 0),
                                (uint8_t)jbool(e, "lstrip", 0), (uint8_t)jbool(e, "rstrip", 0),
                                (uint8_t)jbool(e, "single_word", 0), (uint8_t)jbool(e, "normalized", 1)};
        if (src.len == 0) continue;
        if (src.special && smap_get(special_set, src.content, src.len) < 0) {
            const char *k = arena_dup(&tok->arena, src.content, src.len);
            if (!k || !smap_put(special_set, k, src.len, 1)) {
                st = MOE_ERR_NOMEM;
                goto fail;
            }
        }
        /* an identical token already in added_tokens_map_r is ignored; equal content
         * means it sits at the id the content already has */
        int32_t id = smap_get(&tok->added_map, src.content, src.len);
        if (id >= 0 && slot_of[id] >= 0 && same_added(&tok->added[slot_of[id]], &src)) continue;
        if (id < 0) id = vocab_lookup(tok, src.content, src.len);
        if (id < 0) {
            int32_t vs = (int32_t)tok->n_model;
            id = max_added < 0 ? vs : ((max_added >= vs || vs == 0) ? max_added + 1 : vs);
        }
        if ((size_t)id >= id_bound) { /* cannot happen: ids grow by one per token */
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        const char *c = arena_dup(&tok->arena, src.content, src.len);
        if (!c || !smap_put(&tok->added_map, c, src.len, id)) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
        if (id > max_added) max_added = id;
        if (id > *max_id) *max_id = id;
        /* added_tokens_map_r: one entry per id, a later token replaces an earlier one */
        if (slot_of[id] < 0) slot_of[id] = (int32_t)tok->n_added++;
        tok->added[slot_of[id]] = (struct added_token){c, src.len, c, src.len, id, src.special, src.lstrip,
                                                       src.rstrip, src.single_word, src.normalized};
    }
fail:
    free(slot_of);
    return st;
}

/* pat_cmp: order matcher patterns by first byte, then longest first. */
static int pat_cmp(const void *x, const void *y) {
    const struct amatch_pat *a = x, *b = y;
    unsigned ca = (unsigned char)a->s[0], cb = (unsigned char)b->s[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return memcmp(a->s, b->s, a->len);
}

/* build_matcher is defined with the encoder, whose normalizers it runs. */
static enum moe_status build_matcher(struct moe_tokenizer *tok, int normalized, struct amatcher *m);

/* parse_post: the post-processor's ids around a single sequence, appended to pre/suf. */
static enum moe_status parse_post(const struct moe_tokenizer *tok, const cJSON *j, int depth,
                                  struct ivec *pre, struct ivec *suf);

/* check_id: whether a post-processor id exists in this tokenizer. */
static enum moe_status check_id(const struct moe_tokenizer *tok, double d, int32_t *id) {
    if (!(d >= 0) || d >= (double)tok->n_vocab || floor(d) != d) {
        MOE_LOGE("%s: post_processor uses id %g, outside the vocabulary", tok->label, d);
        return MOE_ERR_FORMAT;
    }
    *id = (int32_t)d;
    return MOE_OK;
}

/* post_template: TemplateProcessing's "single" template: SpecialTokens around one $A. */
static enum moe_status post_template(const struct moe_tokenizer *tok, const cJSON *j, struct ivec *pre,
                                     struct ivec *suf) {
    const cJSON *single = jget(j, "single"), *specials = jget(j, "special_tokens"), *it;
    if (!cJSON_IsArray(single)) {
        MOE_LOGE("%s: TemplateProcessing needs a \"single\" array", tok->label);
        return MOE_ERR_FORMAT;
    }
    struct ivec my_pre = {0}, my_suf = {0};
    enum moe_status st = MOE_OK;
    int seen_a = 0;
    cJSON_ArrayForEach(it, single) {
        const cJSON *seq = jget(it, "Sequence"), *sp = jget(it, "SpecialToken");
        if (seq) {
            const char *sid = jstr(seq, "id");
            if (seen_a || !sid || strcmp(sid, "A") != 0) {
                MOE_LOGE("%s: TemplateProcessing: only single templates with one $A are supported", tok->label);
                st = MOE_ERR_UNSUPPORTED;
                goto fail;
            }
            seen_a = 1;
            continue;
        }
        const char *name = jstr(sp, "id");
        const cJSON *def = name ? jget(specials, name) : NULL, *ids = jget(def, "ids"), *x;
        if (!cJSON_IsArray(ids)) {
            MOE_LOGE("%s: TemplateProcessing: special token \"%s\" is not defined", tok->label, name ? name : "?");
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        cJSON_ArrayForEach(x, ids) {
            int32_t id;
            if (!cJSON_IsNumber(x)) {
                st = MOE_ERR_FORMAT;
                goto fail;
            }
            if ((st = check_id(tok, x->valuedouble, &id)) != MOE_OK) goto fail;
            ivec_push(seen_a ? &my_suf : &my_pre, id);
        }
    }
    if (!seen_a) {
        MOE_LOGE("%s: TemplateProcessing: the single template has no $A", tok->label);
        st = MOE_ERR_UNSUPPORTED;
        goto fail;
    }
    /* wrap what earlier processors produced: new prefix first, new suffix last */
    for (size_t i = 0; i < pre->n; i++) ivec_push(&my_pre, pre->v[i]);
    pre->n = 0;
    for (size_t i = 0; i < my_pre.n; i++) ivec_push(pre, my_pre.v[i]);
    for (size_t i = 0; i < my_suf.n; i++) ivec_push(suf, my_suf.v[i]);
    if (my_pre.oom || my_suf.oom || pre->oom || suf->oom) st = MOE_ERR_NOMEM;
fail:
    free(my_pre.v);
    free(my_suf.v);
    return st;
}

/* post_cls_sep: RobertaProcessing / BertProcessing: cls $A sep. */
static enum moe_status post_cls_sep(const struct moe_tokenizer *tok, const cJSON *j, struct ivec *pre,
                                    struct ivec *suf) {
    const cJSON *cls = jget(j, "cls"), *sep = jget(j, "sep");
    int32_t ic, is;
    enum moe_status st;
    if (!cJSON_IsArray(cls) || !cJSON_IsArray(sep) || cJSON_GetArraySize(cls) != 2 ||
        cJSON_GetArraySize(sep) != 2 || !cJSON_IsNumber(cls->child->next) || !cJSON_IsNumber(sep->child->next)) {
        MOE_LOGE("%s: post_processor needs \"cls\" and \"sep\" as [token, id]", tok->label);
        return MOE_ERR_FORMAT;
    }
    if ((st = check_id(tok, cls->child->next->valuedouble, &ic)) != MOE_OK) return st;
    if ((st = check_id(tok, sep->child->next->valuedouble, &is)) != MOE_OK) return st;
    struct ivec np = {0};
    ivec_push(&np, ic);
    for (size_t i = 0; i < pre->n; i++) ivec_push(&np, pre->v[i]);
    free(pre->v);
    *pre = np;
    ivec_push(suf, is);
    return (pre->oom || suf->oom) ? MOE_ERR_NOMEM : MOE_OK;
}

static enum moe_status parse_post(const struct moe_tokenizer *tok, const cJSON *j, int depth,
                                  struct ivec *pre, struct ivec *suf) {
    if (depth > MAX_DEPTH) return MOE_ERR_FORMAT;
    const char *type = jtype(tok, j, "post_processor");
    if (!type) return MOE_ERR_FORMAT;
    if (!strcmp(type, "ByteLevel")) return MOE_OK; /* offsets only */
    if (!strcmp(type, "TemplateProcessing")) return post_template(tok, j, pre, suf);
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing"))
        return post_cls_sep(tok, j, pre, suf);
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr, *e;
        size_t n;
        enum moe_status st = jkids(tok, j, "processors", "post_processor", &arr, &n);
        if (st != MOE_OK) return st;
        cJSON_ArrayForEach(e, arr) {
            if ((st = parse_post(tok, e, depth + 1, pre, suf)) != MOE_OK) return st;
        }
        return MOE_OK;
    }
    return unsupported(tok, "post_processor", type);
}

/* build_id_tables: id -> string, special flag and added-token index, for every id. */
static enum moe_status build_id_tables(struct moe_tokenizer *tok, const struct smap *special_set) {
    size_t n = (size_t)tok->n_vocab;
    tok->id_str = calloc(n ? n : 1, sizeof *tok->id_str);
    tok->id_len = calloc(n ? n : 1, sizeof *tok->id_len);
    tok->id_special = calloc(n ? n : 1, 1);
    tok->id_skip = calloc(n ? n : 1, 1);
    tok->id_added = malloc((n ? n : 1) * sizeof *tok->id_added);
    tok->cp_id = malloc(TOK_FAST_CP * sizeof *tok->cp_id);
    if (!tok->id_str || !tok->id_len || !tok->id_special || !tok->id_skip || !tok->id_added || !tok->cp_id)
        return MOE_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) tok->id_added[i] = -1;
    for (int32_t c = 0; c < TOK_FAST_CP; c++) tok->cp_id[c] = -1;
    for (size_t i = 0; i < tok->vocab.cap; i++) {
        const struct smap_slot *e = &tok->vocab.slots[i];
        if (!e->key) continue;
        tok->id_str[e->val] = e->key;
        tok->id_len[e->val] = e->len;
        int32_t cp;
        if (e->len && utf8_decode((const unsigned char *)e->key, e->len, &cp) == e->len && cp >= 0 &&
            cp < TOK_FAST_CP)
            tok->cp_id[cp] = e->val;
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        const struct added_token *a = &tok->added[i];
        tok->id_str[a->id] = a->content;
        tok->id_len[a->id] = (uint32_t)a->len;
        tok->id_added[a->id] = (int32_t)i;
        tok->id_special[a->id] = a->special;
    }
    return MOE_OK;
}

/* dec_token: the string decoding uses for an id (NULL if nothing maps to it). The
 * library decodes a `normalized` added token as its normalized form. */
static const char *dec_token(const struct moe_tokenizer *tok, int32_t id, size_t *len) {
    if (tok->id_added[id] >= 0) {
        const struct added_token *a = &tok->added[tok->id_added[id]];
        *len = a->dec_len;
        return a->dec;
    }
    *len = tok->id_len[id];
    return tok->id_str[id];
}

/* mark_skipped: decode(skip_special) drops an id when its decoded string is the
 * content of a special added token (AddedVocabulary::is_special_token). */
static void mark_skipped(struct moe_tokenizer *tok, const struct smap *special_set) {
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        size_t len;
        const char *s = dec_token(tok, id, &len);
        tok->id_skip[id] = s && smap_get(special_set, s, len) >= 0;
    }
}

/* find_named: the id of the first of `names` that exists, or -1. */
static int32_t find_named(const struct moe_tokenizer *tok, const char *const *names) {
    for (; *names; names++) {
        int32_t id = moe_tokenizer_find(tok, *names);
        if (id >= 0) return id;
    }
    return -1;
}

/* config_token: bos_token / eos_token from tokenizer_config.json: a string, an
 * AddedToken object, or null. Returns 1 and sets *id (-1 for null) if the config
 * decides, 0 if it has nothing usable. */
static int config_token(const struct moe_tokenizer *tok, const cJSON *cfg, const char *key, int32_t *id) {
    const cJSON *v = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, key) : NULL;
    if (!v) return 0;
    if (cJSON_IsNull(v)) {
        *id = -1;
        return 1;
    }
    const char *s = cJSON_IsString(v) ? v->valuestring : jstr(v, "content");
    if (!s) return 0;
    int32_t found = moe_tokenizer_find(tok, s);
    if (found < 0) return 0;
    *id = found;
    return 1;
}

/* pick_bos_eos: tokenizer_config.json first, then the post-processor, then common names. */
static void pick_bos_eos(struct moe_tokenizer *tok, const cJSON *cfg) {
    static const char *const bos_names[] = {"<s>", "<|begin_of_text|>", "<bos>", NULL};
    static const char *const eos_names[] = {"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", NULL};
    if (!config_token(tok, cfg, "bos_token", &tok->bos))
        tok->bos = tok->n_post_pre ? tok->post_pre[0] : find_named(tok, bos_names);
    if (!config_token(tok, cfg, "eos_token", &tok->eos))
        tok->eos = tok->n_post_suf ? tok->post_suf[tok->n_post_suf - 1] : find_named(tok, eos_names);
}

/* tokenizer_build: parse tokenizer.json text (and optional tokenizer_config.json). */
static enum moe_status tokenizer_build(const char *json, size_t len, const char *label, const char *cfg_text,
                                       size_t cfg_len, struct moe_tokenizer **out) {
    enum moe_status st = MOE_OK;
    cJSON *root = NULL, *cfg = NULL;
    struct smap special_set = {0};
    struct ivec pre = {0}, suf = {0};
    struct moe_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) return MOE_ERR_NOMEM;
    snprintf(tok->label, sizeof tok->label, "%s", label ? label : "tokenizer.json");
    tok->unk_id = -1;
    bytelevel_map_init(&tok->bl);

    if (!utf8_valid(json, len)) {
        MOE_LOGE("%s: not valid UTF-8", tok->label);
        st = MOE_ERR_FORMAT;
        goto fail;
    }
    root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root)) {
        MOE_LOGE("%s: %s", tok->label, root ? "the top level is not a JSON object" : "not valid JSON");
        st = MOE_ERR_FORMAT;
        goto fail;
    }
    int32_t max_id = -1;
    if ((st = load_model(tok, root, &max_id)) != MOE_OK) goto fail;
    if ((st = load_added(tok, root, &max_id, &special_set)) != MOE_OK) goto fail;
    tok->n_vocab = max_id + 1;
    if ((st = build_id_tables(tok, &special_set)) != MOE_OK) goto fail;

    const cJSON *c;
    if ((c = jget(root, "normalizer")) && (st = parse_normalizer(tok, c, 0, &tok->normalizer)) != MOE_OK)
        goto fail;
    if ((c = jget(root, "pre_tokenizer")) && (st = parse_pretok(tok, c, 0, &tok->pretok)) != MOE_OK) goto fail;
    if ((c = jget(root, "decoder")) && (st = parse_decoder(tok, c, 0, &tok->decoder)) != MOE_OK) goto fail;
    if ((c = jget(root, "post_processor")) && (st = parse_post(tok, c, 0, &pre, &suf)) != MOE_OK) goto fail;
    tok->post_pre = pre.v;
    tok->n_post_pre = pre.n;
    tok->post_suf = suf.v;
    tok->n_post_suf = suf.n;
    pre.v = suf.v = NULL;
    if ((st = build_matcher(tok, 0, &tok->raw_match)) != MOE_OK) goto fail;
    if ((st = build_matcher(tok, 1, &tok->norm_match)) != MOE_OK) goto fail;
    mark_skipped(tok, &special_set);

    if (cfg_text) {
        cfg = cJSON_ParseWithLength(cfg_text, cfg_len);
        if (!cJSON_IsObject(cfg)) MOE_LOGW("%s: tokenizer_config.json is not a JSON object; ignored", tok->label);
    }
    pick_bos_eos(tok, cJSON_IsObject(cfg) ? cfg : NULL);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    smap_free(&special_set);
    *out = tok;
    return MOE_OK;
fail:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    smap_free(&special_set);
    free(pre.v);
    free(suf.v);
    moe_tokenizer_free(tok);
    return st;
}

/* Reads an optional file; NULL when it does not exist. */
static char *read_optional(const char *path, size_t *len) {
    struct stat sb;
    char *text = NULL;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return NULL;
    if (moe_read_file(path, 16u << 20, &text, len) != MOE_OK) return NULL;
    return text;
}

/* moe_tokenizer_load: see moe-tokenizer.h. */
enum moe_status moe_tokenizer_load(const char *path, struct moe_tokenizer **out) {
    if (!path || !out) return MOE_ERR_INVALID;
    *out = NULL;
    char *json_path = NULL, *cfg_path = NULL, *json = NULL, *cfg = NULL;
    size_t json_len = 0, cfg_len = 0;
    enum moe_status st = MOE_ERR_NOMEM;
    if (moe_is_dir(path)) {
        json_path = moe_path_join(path, "tokenizer.json");
        cfg_path = moe_path_join(path, "tokenizer_config.json");
    } else {
        json_path = strdup(path);
        const char *slash = strrchr(path, '/');
        char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
        if (dir) cfg_path = moe_path_join(dir, "tokenizer_config.json");
        free(dir);
    }
    if (!json_path || !cfg_path) goto fail;
    if ((st = moe_read_file(json_path, TOK_MAX_JSON_BYTES, &json, &json_len)) != MOE_OK) goto fail;
    cfg = read_optional(cfg_path, &cfg_len);
    st = tokenizer_build(json, json_len, json_path, cfg, cfg_len, out);
fail:
    free(json_path);
    free(cfg_path);
    free(json);
    free(cfg);
    return st;
}

/* moe_tokenizer_load_json: see moe-tokenizer.h. */
enum moe_status moe_tokenizer_load_json(const char *json, size_t len, const char *label,
                                        struct moe_tokenizer **out) {
    if (!out) return MOE_ERR_INVALID;
    *out = NULL;
    if (!json && len) return MOE_ERR_INVALID;
    return tokenizer_build(json ? json : "", len, label, NULL, 0, out);
}

/* moe_tokenizer_load_texts: see moe-tokenizer.h. */
enum moe_status moe_tokenizer_load_texts(const char *json, size_t len, const char *config_json,
                                         size_t config_len, const char *label, struct moe_tokenizer **out) {
    if (!out) return MOE_ERR_INVALID;
    *out = NULL;
    if (!json && len) return MOE_ERR_INVALID;
    return tokenizer_build(json ? json : "", len, label, config_json, config_json ? config_len : 0, out);
}

/* moe_tokenizer_free: see moe-tokenizer.h. */
void moe_tokenizer_free(struct moe_tokenizer *tok) {
    if (!tok) return;
    smap_free(&tok->vocab);
    smap_free(&tok->added_map);
    free(tok->merges.slots);
    free(tok->added);
    free(tok->raw_match.v);
    free(tok->norm_match.v);
    free(tok->id_str);
    free(tok->id_len);
    free(tok->id_special);
    free(tok->id_skip);
    free(tok->id_added);
    free(tok->cp_id);
    normalizer_free(tok->normalizer);
    pretok_free(tok->pretok);
    decoder_free(tok->decoder);
    free(tok->post_pre);
    free(tok->post_suf);
    arena_free(&tok->arena);
    free(tok);
}

/* Accessors: see moe-tokenizer.h. */
int32_t moe_tokenizer_n_vocab(const struct moe_tokenizer *tok) { return tok ? tok->n_vocab : 0; }

const char *moe_tokenizer_token(const struct moe_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_vocab) return NULL;
    return tok->id_str[id];
}

int32_t moe_tokenizer_find(const struct moe_tokenizer *tok, const char *token) {
    if (!tok || !token) return -1;
    size_t n = strlen(token);
    int32_t id = smap_get(&tok->added_map, token, n);
    return id >= 0 ? id : vocab_lookup(tok, token, n);
}

int32_t moe_tokenizer_bos(const struct moe_tokenizer *tok) { return tok ? tok->bos : -1; }

int32_t moe_tokenizer_eos(const struct moe_tokenizer *tok) { return tok ? tok->eos : -1; }

int moe_tokenizer_is_special(const struct moe_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_vocab) return 0;
    return tok->id_special[id];
}

/* ------------------------------------------------------------------------- */
/* Encoding. */

struct sym {
    int32_t id;
    int32_t prev, next;
    int dead;
};

struct heap_ent {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
};

struct seg {
    size_t s, e;
    int32_t id; /* -1: text to tokenize */
};

struct segvec {
    struct seg *v;
    size_t n, cap;
    int oom;
};

/* Per-call scratch state; a tokenizer is shared read-only between threads. */
struct enc_ctx {
    const struct moe_tokenizer *tok;
    pcre2_match_data *md;
    struct spanvec m, sp;
    struct sym *syms;
    size_t syms_cap;
    struct heap_ent *heap;
    size_t heap_cap, heap_n;
    struct buf key;
    struct ivec ids;
    enum moe_status err;
};

/* ctx_init: fresh per-call state (PCRE2 match data; the rest grows on demand). */
static enum moe_status ctx_init(struct enc_ctx *c, const struct moe_tokenizer *tok) {
    memset(c, 0, sizeof *c);
    c->tok = tok;
    c->md = pcre2_match_data_create(16, NULL);
    return c->md ? MOE_OK : MOE_ERR_NOMEM;
}

/* ctx_free: release the per-call state. */
static void ctx_free(struct enc_ctx *c) {
    if (c->md) pcre2_match_data_free(c->md);
    free(c->m.v);
    free(c->sp.v);
    free(c->syms);
    free(c->heap);
    buf_free(&c->key);
    free(c->ids.v);
    memset(c, 0, sizeof *c);
}

/* ctx_fail: remember the first error of a call. */
static void ctx_fail(struct enc_ctx *c, enum moe_status st) {
    if (c->err == MOE_OK) c->err = st;
}

/* segs_push: append one segment. */
static void segs_push(struct segvec *v, size_t s, size_t e, int32_t id) {
    if (v->oom) return;
    if (!grow((void **)&v->v, &v->cap, v->n + 1, sizeof *v->v)) {
        v->oom = 1;
        return;
    }
    v->v[v->n++] = (struct seg){s, e, id};
}

/* ---- normalizers ---- */

/* is_ascii: whether s[0..n) is plain ASCII (which NFC/NFD/NFKC/NFKD leave alone). */
static int is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

/* nz_unicode: one of the four Unicode normalization forms, through utf8proc. */
static void nz_unicode(int options, const char *s, size_t n, struct buf *out) {
    if (is_ascii(s, n)) {
        buf_put(out, s, n);
        return;
    }
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)(options | UTF8PROC_STABLE));
    if (k < 0) buf_put(out, s, n); /* not reached for valid UTF-8; keep the text */
    else buf_put(out, dst, (size_t)k);
    free(dst);
}

/* replace_all: replace every match of re in s[0..n) by content (Replace). */
static int replace_all(struct enc_ctx *c, const struct regex *re, const char *content, size_t clen,
                       const char *s, size_t n, struct buf *out) {
    if (regex_find_all(re, c->md, s, n, &c->m) < 0) {
        ctx_fail(c, c->m.oom ? MOE_ERR_NOMEM : MOE_ERR_FORMAT);
        return -1;
    }
    size_t prev = 0;
    for (size_t i = 0; i < c->m.n; i++) {
        buf_put(out, s + prev, c->m.v[i].s - prev);
        buf_put(out, content, clen);
        prev = c->m.v[i].e;
    }
    buf_put(out, s + prev, n - prev);
    return 0;
}

/* nz_apply: run a normalizer over s[0..n), appending the result to out. 0, or -1 with c->err set. */
static int nz_apply(struct enc_ctx *c, const struct normalizer *nz, const char *s, size_t n, struct buf *out) {
    switch (nz->type) {
    case NZ_NFC: nz_unicode(UTF8PROC_COMPOSE, s, n, out); return 0;
    case NZ_NFD: nz_unicode(UTF8PROC_DECOMPOSE, s, n, out); return 0;
    case NZ_NFKC: nz_unicode(UTF8PROC_COMPOSE | UTF8PROC_COMPAT, s, n, out); return 0;
    case NZ_NFKD: nz_unicode(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, s, n, out); return 0;
    case NZ_PREPEND:
        if (n) buf_put(out, nz->str, nz->str_len);
        buf_put(out, s, n);
        return 0;
    case NZ_REPLACE: return replace_all(c, &nz->re, nz->str, nz->str_len, s, n, out);
    case NZ_BYTELEVEL:
        for (size_t i = 0; i < n; i++) {
            unsigned char b = (unsigned char)s[i];
            buf_put(out, c->tok->bl.byte_utf8[b], c->tok->bl.byte_utf8_len[b]);
        }
        return 0;
    default: break;
    }
    if (nz->type == NZ_SEQUENCE) {
        struct buf a = {0}, b = {0};
        buf_put(&a, s, n);
        int rc = 0;
        for (size_t i = 0; i < nz->n_kids && rc == 0; i++) {
            b.n = 0;
            buf_put(&b, "", 0);
            rc = nz_apply(c, nz->kids[i], a.p ? a.p : "", a.n, &b);
            struct buf t = a;
            a = b;
            b = t;
        }
        if (rc == 0) buf_put(out, a.p ? a.p : "", a.n);
        if (a.oom || b.oom) out->oom = 1;
        buf_free(&a);
        buf_free(&b);
        return rc;
    }
    /* character-wise: Lowercase, Strip, StripAccents */
    size_t lo = 0, hi = n;
    if (nz->type == NZ_STRIP) {
        while (lo < hi) {
            int32_t cp;
            size_t k = utf8_decode((const unsigned char *)s + lo, hi - lo, &cp);
            if (!nz->left || !cp_is_ws(cp)) break;
            lo += k;
        }
        while (hi > lo && nz->right) {
            size_t j = hi - 1;
            while (j > lo && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
            int32_t cp;
            utf8_decode((const unsigned char *)s + j, hi - j, &cp);
            if (!cp_is_ws(cp)) break;
            hi = j;
        }
        buf_put(out, s + lo, hi - lo);
        return 0;
    }
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (nz->type == NZ_STRIP_ACCENTS) {
            if (!cp_is_mark(cp)) buf_put(out, s + i, k);
        } else if (cp == 0x130) { /* the one code point whose lowercase is two */
            buf_put(out, "i\xCC\x87", 3);
        } else if (cp >= 0) {
            buf_put_cp(out, utf8proc_tolower(cp));
        } else {
            buf_put(out, s + i, k);
        }
        i += k;
    }
    return 0;
}

/* ---- added tokens ---- */

/* build_matcher: the leftmost-longest matcher for the non-normalized (raw text) or the
 * normalized added tokens; a normalized token is matched in its normalized form, which
 * is also what decoding shows for it (as the library's normalized cache does). */
static enum moe_status build_matcher(struct moe_tokenizer *tok, int normalized, struct amatcher *m) {
    enum moe_status st = MOE_OK;
    struct enc_ctx c;
    struct buf b = {0};
    memset(m, 0, sizeof *m);
    if (!tok->n_added) return MOE_OK;
    if ((st = ctx_init(&c, tok)) != MOE_OK) return st;
    m->v = calloc(tok->n_added, sizeof *m->v);
    if (!m->v) {
        st = MOE_ERR_NOMEM;
        goto fail;
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        struct added_token *a = &tok->added[i];
        if (!!a->normalized != normalized) continue;
        const char *s = a->content;
        size_t len = a->len;
        if (normalized && tok->normalizer) {
            b.n = 0;
            if (nz_apply(&c, tok->normalizer, a->content, a->len, &b) < 0) {
                st = c.err;
                goto fail;
            }
            if (b.oom) {
                st = MOE_ERR_NOMEM;
                goto fail;
            }
            s = arena_dup(&tok->arena, b.p ? b.p : "", b.n);
            len = b.n;
            if (!s) {
                st = MOE_ERR_NOMEM;
                goto fail;
            }
            a->dec = s;
            a->dec_len = len;
        }
        if (len == 0) continue; /* normalized away: it can never match */
        m->v[m->n++] = (struct amatch_pat){s, len, a->id};
    }
    qsort(m->v, m->n, sizeof *m->v, pat_cmp);
    size_t k = 0;
    for (int byte = 0; byte < 256; byte++) {
        m->start[byte] = (uint32_t)k;
        while (k < m->n && (unsigned char)m->v[k].s[0] == byte) k++;
    }
    m->start[256] = (uint32_t)k;
fail:
    buf_free(&b);
    ctx_free(&c);
    return st;
}

/* amatch_next: the leftmost-longest pattern occurrence at or after `from`. */
static int amatch_next(const struct amatcher *m, const char *s, size_t n, size_t from, size_t *ms,
                       size_t *me, int32_t *id) {
    for (size_t i = from; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        for (uint32_t k = m->start[b]; k < m->start[b + 1]; k++) {
            const struct amatch_pat *p = &m->v[k];
            if (p->len <= n - i && memcmp(s + i, p->s, p->len) == 0) {
                *ms = i;
                *me = i + p->len;
                *id = p->id;
                return 1;
            }
        }
    }
    return 0;
}

/* last_cp_before: the code point that ends at s[i] (i > 0). */
static int32_t last_cp_before(const char *s, size_t i) {
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80 && i - j < 4) j--;
    int32_t cp;
    utf8_decode((const unsigned char *)s + j, i - j, &cp);
    return cp;
}

/* added_split: cut s[0..n) at the added tokens of matcher m, as
 * AddedVocabulary::find_matches does (single_word, lstrip, rstrip). */
static void added_split(const struct moe_tokenizer *tok, const struct amatcher *m, const char *s, size_t n,
                        struct segvec *out) {
    out->n = 0;
    size_t start_offset = 0, pos = 0, ms, me;
    int32_t id;
    while (m->n && amatch_next(m, s, n, pos, &ms, &me, &id)) {
        pos = me;
        const struct added_token *a = &tok->added[tok->id_added[id]];
        size_t start = ms, stop = me;
        if (a->single_word) {
            int32_t cp;
            int start_space = ms == 0 || !cp_is_word(last_cp_before(s, ms));
            int stop_space = me == n || (utf8_decode((const unsigned char *)s + me, n - me, &cp), !cp_is_word(cp));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t p = start;
            while (p > 0 && cp_is_ws(last_cp_before(s, p))) {
                p--;
                while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
            }
            start = p > start_offset ? p : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                int32_t cp;
                size_t k = utf8_decode((const unsigned char *)s + stop, n - stop, &cp);
                if (!cp_is_ws(cp)) break;
                stop += k;
            }
        }
        if (start_offset < start) segs_push(out, start_offset, start, -1);
        segs_push(out, start, stop, id);
        /* a match inside whitespace an earlier rstrip took must not rewind (the
         * library's own split panics on such overlaps) */
        if (stop > start_offset) start_offset = stop;
    }
    if (start_offset != n) segs_push(out, start_offset, n, -1);
}

/* ---- pre-tokenizers ---- */

/* split_apply: turn a span cover of s[0..n) into pieces according to behavior, as
 * NormalizedString::split does, dropping empty pieces. */
static void split_apply(struct spanvec *sp, const char *s, int first, enum behavior behavior, int invert,
                        struct plist *out) {
    size_t n = sp->n, k = 0;
    struct span *v = sp->v;
    if (invert)
        for (size_t i = 0; i < n; i++) v[i].m = !v[i].m;
    switch (behavior) {
    case SB_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!v[i].m) v[k++] = v[i];
        break;
    case SB_ISOLATED: k = n; break;
    case SB_CONTIGUOUS:
    case SB_MERGED_PREV: {
        int prev = 0;
        for (size_t i = 0; i < n; i++) {
            int join = behavior == SB_CONTIGUOUS ? v[i].m == prev : (v[i].m && !prev);
            if (join && k) v[k - 1].e = v[i].e;
            else v[k++] = v[i];
            prev = v[i].m;
        }
        break;
    }
    case SB_MERGED_NEXT: {
        /* fold from the right; pieces stay in place, growing leftwards */
        int prev = 0;
        size_t w = n;
        for (size_t i = n; i-- > 0;) {
            if (v[i].m && !prev && w < n) v[w].s = v[i].s;
            else v[--w] = v[i];
            prev = v[i].m;
        }
        memmove(v, v + w, (n - w) * sizeof *v);
        k = n - w;
        break;
    }
    }
    for (size_t i = 0; i < k; i++)
        if (v[i].e > v[i].s) plist_add(out, s + v[i].s, v[i].e - v[i].s, first && v[i].s == 0);
}

/* Character predicates for char_spans. */
static int pred_ws(int32_t c, int32_t arg) { return (void)arg, cp_is_ws(c); }
static int pred_numeric(int32_t c, int32_t arg) { return (void)arg, cp_is_numeric(c); }
static int pred_punct(int32_t c, int32_t arg) { return (void)arg, cp_is_punct(c); }
static int pred_eq(int32_t c, int32_t arg) { return c == arg; }

/* regex_split: split one piece at the matches of re. */
static void regex_split(struct enc_ctx *c, const struct regex *re, const char *s, size_t n, int first,
                        enum behavior behavior, int invert, struct plist *out) {
    if (regex_find_all(re, c->md, s, n, &c->m) < 0) {
        ctx_fail(c, c->m.oom ? MOE_ERR_NOMEM : MOE_ERR_FORMAT);
        return;
    }
    matches_to_spans(&c->m, n, &c->sp);
    split_apply(&c->sp, s, first, behavior, invert, out);
}

/* whitespace_runs: the Whitespace pre-tokenizer: runs matching \w+|[^\w\s]+. */
static void whitespace_runs(const char *s, size_t n, int first, struct plist *out) {
    size_t i = 0;
    while (i < n) {
        int32_t cp;
        size_t k = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (cp_is_ws(cp)) {
            i += k;
            continue;
        }
        int word = cp_is_word(cp);
        size_t j = i + k;
        while (j < n) {
            size_t k2 = utf8_decode((const unsigned char *)s + j, n - j, &cp);
            if (cp_is_ws(cp) || cp_is_word(cp) != word) break;
            j += k2;
        }
        plist_add(out, s + i, j - i, first && i == 0);
        i = j;
    }
}

/* pretok_piece: run one (non-Sequence) pre-tokenizer over one piece. */
static void pretok_piece(struct enc_ctx *c, const struct pretok *pt, const char *s, size_t n, int first,
                         struct plist *out) {
    const struct moe_tokenizer *tok = c->tok;
    switch (pt->type) {
    case PT_BYTELEVEL: {
        struct buf t = {0};
        struct plist parts = {0};
        if (pt->add_prefix_space && (n == 0 || s[0] != ' ')) buf_putc(&t, ' ');
        buf_put(&t, s, n);
        if (pt->use_regex) regex_split(c, &pt->re, t.p, t.n, first, SB_ISOLATED, 0, &parts);
        else plist_add(&parts, t.p, t.n, first);
        for (size_t i = 0; i < parts.n; i++) {
            const unsigned char *p = (const unsigned char *)plist_str(&parts, i);
            t.n = 0;
            for (size_t j = 0; j < parts.v[i].len; j++)
                buf_put(&t, tok->bl.byte_utf8[p[j]], tok->bl.byte_utf8_len[p[j]]);
            plist_add(out, t.p, t.n, parts.v[i].first);
        }
        if (t.oom || parts.oom) out->oom = 1;
        buf_free(&t);
        plist_free(&parts);
        return;
    }
    case PT_METASPACE: {
        struct buf t = {0}, r = {0};
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') buf_put(&r, pt->ch_s, pt->ch_len);
            else buf_putc(&r, s[i]);
        }
        int starts = r.n >= pt->ch_len && memcmp(r.p, pt->ch_s, pt->ch_len) == 0;
        if (!starts && (pt->prepend == PS_ALWAYS || (pt->prepend == PS_FIRST && first)))
            buf_put(&t, pt->ch_s, pt->ch_len);
        buf_put(&t, r.p ? r.p : "", r.n);
        if (pt->split) {
            char_spans(t.p ? t.p : "", t.n, pred_eq, pt->ch, &c->sp);
            split_apply(&c->sp, t.p, first, SB_MERGED_NEXT, 0, out);
        } else {
            plist_add(out, t.p ? t.p : "", t.n, first);
        }
        if (t.oom || r.oom || c->sp.oom) out->oom = 1;
        buf_free(&t);
        buf_free(&r);
        return;
    }
    case PT_SPLIT: regex_split(c, &pt->re, s, n, first, pt->behavior, pt->invert, out); return;
    case PT_WHITESPACE: whitespace_runs(s, n, first, out); return;
    case PT_WHITESPACE_SPLIT:
        char_spans(s, n, pred_ws, 0, &c->sp);
        split_apply(&c->sp, s, first, SB_REMOVED, 0, out);
        return;
    case PT_DIGITS:
        char_spans(s, n, pred_numeric, 0, &c->sp);
        split_apply(&c->sp, s, first, pt->individual ? SB_ISOLATED : SB_CONTIGUOUS, 0, out);
        return;
    case PT_PUNCTUATION:
        char_spans(s, n, pred_punct, 0, &c->sp);
        split_apply(&c->sp, s, first, pt->behavior, 0, out);
        return;
    case PT_CHAR_DELIMITER:
        char_spans(s, n, pred_eq, pt->ch, &c->sp);
        split_apply(&c->sp, s, first, SB_REMOVED, 0, out);
        return;
    case PT_BERT: {
        struct plist words = {0};
        char_spans(s, n, pred_ws, 0, &c->sp);
        split_apply(&c->sp, s, first, SB_REMOVED, 0, &words);
        for (size_t i = 0; i < words.n; i++) {
            char_spans(plist_str(&words, i), words.v[i].len, pred_punct, 0, &c->sp);
            split_apply(&c->sp, plist_str(&words, i), words.v[i].first, SB_ISOLATED, 0, out);
        }
        if (words.oom) out->oom = 1;
        plist_free(&words);
        return;
    }
    case PT_SEQUENCE: break;
    }
}

/* pretok_apply: run a pre-tokenizer over every piece of `in`, appending to `out`. */
static void pretok_apply(struct enc_ctx *c, const struct pretok *pt, const struct plist *in, struct plist *out) {
    if (pt->type != PT_SEQUENCE) {
        for (size_t i = 0; i < in->n; i++) pretok_piece(c, pt, plist_str(in, i), in->v[i].len, in->v[i].first, out);
        if (c->sp.oom || c->m.oom) out->oom = 1;
        return;
    }
    struct plist a = {0}, b = {0};
    for (size_t i = 0; i < in->n; i++) plist_add(&a, plist_str(in, i), in->v[i].len, in->v[i].first);
    for (size_t k = 0; k < pt->n_kids && c->err == MOE_OK; k++) {
        plist_clear(&b);
        pretok_apply(c, pt->kids[k], &a, &b);
        struct plist t = a;
        a = b;
        b = t;
    }
    for (size_t i = 0; i < a.n; i++) plist_add(out, plist_str(&a, i), a.v[i].len, a.v[i].first);
    if (a.oom || b.oom) out->oom = 1;
    plist_free(&a);
    plist_free(&b);
}

/* ---- BPE ---- */

/* heap_less: the merge order of word.rs's BinaryHeap<Merge>: lower rank, then leftmost. */
static int heap_less(const struct heap_ent *a, const struct heap_ent *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

/* heap_push: add a candidate merge to the min-heap. */
static void heap_push(struct enc_ctx *c, struct heap_ent e) {
    if (!grow((void **)&c->heap, &c->heap_cap, c->heap_n + 1, sizeof *c->heap)) {
        ctx_fail(c, MOE_ERR_NOMEM);
        return;
    }
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &c->heap[p])) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = e;
}

/* heap_pop: remove and return the next merge to try (heap must be non-empty). */
static struct heap_ent heap_pop(struct enc_ctx *c) {
    struct heap_ent top = c->heap[0], last = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct heap_ent *best = &last;
        if (l < n && heap_less(&c->heap[l], best)) {
            m = l;
            best = &c->heap[l];
        }
        if (r < n && heap_less(&c->heap[r], best)) m = r;
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = last;
    return top;
}

/* sym_add: append a symbol to the word being built. */
static void sym_add(struct enc_ctx *c, size_t *n, int32_t id) {
    if (!grow((void **)&c->syms, &c->syms_cap, *n + 1, sizeof *c->syms)) {
        ctx_fail(c, MOE_ERR_NOMEM);
        return;
    }
    c->syms[*n] = (struct sym){id, (int32_t)*n - 1, -1, 0};
    if (*n > 0) c->syms[*n - 1].next = (int32_t)*n;
    (*n)++;
}

/* char_key: one character of a word as the vocab spells it: with the
 * continuing_subword_prefix unless first, the end_of_word_suffix if last. */
static void char_key(struct enc_ctx *c, const char *ch, size_t k, int is_first, int is_last) {
    const struct moe_tokenizer *tok = c->tok;
    c->key.n = 0;
    if (!is_first && tok->prefix) buf_put(&c->key, tok->prefix, tok->prefix_len);
    buf_put(&c->key, ch, k);
    if (is_last && tok->suffix) buf_put(&c->key, tok->suffix, tok->suffix_len);
    if (c->key.oom) ctx_fail(c, MOE_ERR_NOMEM);
}

/* char_id: the vocab id of one character of a word (see char_key), or -1. */
static int32_t char_id(struct enc_ctx *c, const char *ch, size_t k, int32_t cp, int is_first, int is_last) {
    const struct moe_tokenizer *tok = c->tok;
    if ((is_first || !tok->prefix) && (!is_last || !tok->suffix) && cp >= 0 && cp < TOK_FAST_CP)
        return tok->cp_id[cp];
    char_key(c, ch, k, is_first, is_last);
    return c->err ? -1 : vocab_lookup(tok, c->key.p, c->key.n);
}

/* bpe_word: tokenize one pre-tokenized word with the BPE model, as BPE::merge_word
 * and Word::merge_all do, appending the ids to c->ids. */
static void bpe_word(struct enc_ctx *c, const char *w, size_t n) {
    const struct moe_tokenizer *tok = c->tok;
    if (n == 0) return;
    if (tok->ignore_merges) {
        int32_t id = vocab_lookup(tok, w, n);
        if (id >= 0) {
            ivec_push(&c->ids, id);
            return;
        }
    }
    size_t ns = 0;
    int have_unk = 0;
    for (size_t i = 0; i < n && c->err == MOE_OK;) {
        int32_t cp;
        size_t k = utf8_decode((const unsigned char *)w + i, n - i, &cp);
        int32_t id = char_id(c, w + i, k, cp, i == 0, i + k == n);
        if (id < 0 && tok->byte_fallback) char_key(c, w + i, k, i == 0, i + k == n);
        i += k;
        if (id >= 0) {
            if (have_unk) sym_add(c, &ns, tok->unk_id);
            have_unk = 0;
            sym_add(c, &ns, id);
            continue;
        }
        if (tok->byte_fallback) {
            int all = 1;
            for (size_t j = 0; j < c->key.n && all; j++) all = tok->byte_id[(unsigned char)c->key.p[j]] >= 0;
            if (all) {
                for (size_t j = 0; j < c->key.n; j++) sym_add(c, &ns, tok->byte_id[(unsigned char)c->key.p[j]]);
                continue;
            }
        }
        if (!tok->unk_str) continue; /* no unk token: the character is dropped */
        if (tok->unk_missing) {
            MOE_LOGE("%s: unk_token \"%s\" is not in the vocabulary", tok->label, tok->unk_str);
            ctx_fail(c, MOE_ERR_FORMAT);
            return;
        }
        if (have_unk && !tok->fuse_unk) sym_add(c, &ns, tok->unk_id);
        have_unk = 1;
    }
    if (have_unk) sym_add(c, &ns, tok->unk_id);
    if (c->err != MOE_OK) return;

    struct sym *sy = c->syms;
    c->heap_n = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const struct merge_slot *m = merges_get(&tok->merges, sy[i].id, sy[i + 1].id);
        if (m) heap_push(c, (struct heap_ent){m->rank, (uint32_t)i, m->new_id});
    }
    while (c->heap_n && c->err == MOE_OK) {
        struct heap_ent top = heap_pop(c);
        struct sym *cur = &sy[top.pos];
        if (cur->dead || cur->next < 0) continue;
        struct sym *right = &sy[cur->next];
        const struct merge_slot *m = merges_get(&tok->merges, cur->id, right->id);
        if (!m || m->new_id != top.new_id) continue; /* stale entry */
        cur->id = top.new_id;
        cur->next = right->next;
        right->dead = 1;
        if (cur->next >= 0) sy[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            m = merges_get(&tok->merges, sy[cur->prev].id, cur->id);
            if (m) heap_push(c, (struct heap_ent){m->rank, (uint32_t)cur->prev, m->new_id});
        }
        if (cur->next >= 0) {
            m = merges_get(&tok->merges, cur->id, sy[cur->next].id);
            if (m) heap_push(c, (struct heap_ent){m->rank, top.pos, m->new_id});
        }
    }
    for (size_t i = 0; i < ns; i++)
        if (!sy[i].dead) ivec_push(&c->ids, sy[i].id);
}

/* encode_piece: normalize one piece of text between added tokens, cut out the
 * normalized added tokens, pre-tokenize the rest and run the model on each word. */
static void encode_piece(struct enc_ctx *c, const char *s, size_t n, int first) {
    const struct moe_tokenizer *tok = c->tok;
    struct buf norm = {0};
    struct segvec segs = {0};
    struct plist in = {0}, words = {0};
    if (tok->normalizer) {
        if (nz_apply(c, tok->normalizer, s, n, &norm) < 0) goto done;
        if (norm.oom) {
            ctx_fail(c, MOE_ERR_NOMEM);
            goto done;
        }
        s = norm.p ? norm.p : "";
        n = norm.n;
    }
    added_split(tok, &tok->norm_match, s, n, &segs);
    for (size_t i = 0; i < segs.n && c->err == MOE_OK; i++) {
        const struct seg *g = &segs.v[i];
        if (g->id >= 0) {
            ivec_push(&c->ids, g->id);
            continue;
        }
        int f = first && g->s == 0;
        if (!tok->pretok) {
            bpe_word(c, s + g->s, g->e - g->s);
            continue;
        }
        plist_clear(&in);
        plist_clear(&words);
        plist_add(&in, s + g->s, g->e - g->s, f);
        pretok_apply(c, tok->pretok, &in, &words);
        if (words.oom || in.oom) ctx_fail(c, MOE_ERR_NOMEM);
        for (size_t w = 0; w < words.n && c->err == MOE_OK; w++) bpe_word(c, plist_str(&words, w), words.v[w].len);
    }
    if (segs.oom) ctx_fail(c, MOE_ERR_NOMEM);
done:
    buf_free(&norm);
    free(segs.v);
    plist_free(&in);
    plist_free(&words);
}

/* lossy_utf8: a copy of s[0..n) with each invalid sequence replaced by U+FFFD. */
static int lossy_utf8(const char *s, size_t n, struct buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = u[i] < 0x80 ? 1 : utf8_decode(u + i, n - i, &cp);
        if (u[i] >= 0x80 && cp < 0) buf_put(out, "\xEF\xBF\xBD", 3);
        else buf_put(out, s + i, k);
        i += k;
    }
    return out->oom ? -1 : 0;
}

/* moe_tokenizer_encode: see moe-tokenizer.h. */
enum moe_status moe_tokenizer_encode(const struct moe_tokenizer *tok, const char *text, size_t len,
                                     int add_special, int32_t **ids, size_t *n_ids) {
    if (!tok || !ids || !n_ids || (!text && len)) return MOE_ERR_INVALID;
    *ids = NULL;
    *n_ids = 0;
    if (len > (size_t)INT32_MAX / 4) { /* symbol links are 32-bit; UTF-8 repair can triple it */
        MOE_LOGE("%s: %zu bytes is too long to encode at once", tok->label, len);
        return MOE_ERR_RANGE;
    }
    struct enc_ctx c;
    struct buf clean = {0};
    struct segvec segs = {0};
    enum moe_status st = ctx_init(&c, tok);
    if (st != MOE_OK) goto done;
    if (!text) text = "";
    if (!utf8_valid(text, len)) {
        if (lossy_utf8(text, len, &clean) < 0) {
            st = MOE_ERR_NOMEM;
            goto done;
        }
        text = clean.p;
        len = clean.n;
    }
    if (add_special)
        for (size_t i = 0; i < tok->n_post_pre; i++) ivec_push(&c.ids, tok->post_pre[i]);
    added_split(tok, &tok->raw_match, text, len, &segs);
    for (size_t i = 0; i < segs.n && c.err == MOE_OK; i++) {
        const struct seg *g = &segs.v[i];
        if (g->id >= 0) ivec_push(&c.ids, g->id);
        else encode_piece(&c, text + g->s, g->e - g->s, g->s == 0);
    }
    if (add_special)
        for (size_t i = 0; i < tok->n_post_suf; i++) ivec_push(&c.ids, tok->post_suf[i]);
    st = c.err;
    if (st == MOE_OK && (c.ids.oom || segs.oom)) st = MOE_ERR_NOMEM;
    if (st == MOE_OK) {
        *ids = c.ids.v ? c.ids.v : malloc(sizeof(int32_t));
        if (!*ids) st = MOE_ERR_NOMEM;
        *n_ids = c.ids.n;
        c.ids.v = NULL;
    }
done:
    ctx_free(&c);
    buf_free(&clean);
    free(segs.v);
    return st;
}

/* ------------------------------------------------------------------------- */
/* Decoding: id -> token strings -> decoder chain. Tokens may hold any bytes once
 * ByteFallback/ByteLevel ran, so nothing here assumes valid UTF-8. */

/* dec_replace_token: Replace on one token (a literal, or a regex on valid UTF-8 only). */
static int dec_replace_token(struct enc_ctx *c, const struct decoder *d, const char *s, size_t n, struct buf *out) {
    if (d->re.code && !utf8_valid(s, n)) {
        buf_put(out, s, n);
        return 0;
    }
    return replace_all(c, &d->re, d->str, d->str_len, s, n, out);
}

/* hex_byte: the byte of a "<0xXX>" token (u8::from_str_radix accepts a leading '+'). */
static int hex_byte(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char ch = s[i];
        if (i == 3 && ch == '+') continue;
        int d = (ch >= '0' && ch <= '9') ? ch - '0' : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10
              : (ch >= 'A' && ch <= 'F') ? ch - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* dec_step: run one (non-Sequence) decoder over the token list `in` into `out`. */
static int dec_step(struct enc_ctx *c, const struct decoder *d, const struct plist *in, struct plist *out) {
    struct buf t = {0};
    int rc = 0;
    switch (d->type) {
    case DEC_BYTELEVEL:
        /* every token whose characters all come from the byte map becomes those bytes;
         * any other token (an added token, say) stays as it is; all join into one */
        for (size_t i = 0; i < in->n; i++) {
            const char *s = plist_str(in, i);
            size_t n = in->v[i].len, mark = t.n, j = 0;
            while (j < n) {
                int32_t cp;
                size_t k = utf8_decode((const unsigned char *)s + j, n - j, &cp);
                int b = bytelevel_byte_of(&c->tok->bl, cp);
                if (b < 0) break;
                buf_putc(&t, (char)b);
                j += k;
            }
            if (j < n) {
                t.n = mark;
                buf_put(&t, s, n);
            }
        }
        plist_add(out, t.p ? t.p : "", t.n, 0);
        break;
    case DEC_BYTEFALLBACK:
        for (size_t i = 0; i <= in->n; i++) {
            int b = i < in->n ? hex_byte(plist_str(in, i), in->v[i].len) : -1;
            if (b >= 0) {
                buf_putc(&t, (char)b);
                continue;
            }
            if (t.n) {
                plist_add(out, t.p, t.n, 0);
                t.n = 0;
            }
            if (i < in->n) plist_add(out, plist_str(in, i), in->v[i].len, 0);
        }
        break;
    case DEC_FUSE:
        for (size_t i = 0; i < in->n; i++) buf_put(&t, plist_str(in, i), in->v[i].len);
        plist_add(out, t.p ? t.p : "", t.n, 0);
        break;
    default:
        for (size_t i = 0; i < in->n && rc == 0; i++) {
            const char *s = plist_str(in, i);
            size_t n = in->v[i].len;
            t.n = 0;
            if (d->type == DEC_REPLACE) {
                rc = dec_replace_token(c, d, s, n, &t);
            } else if (d->type == DEC_METASPACE) {
                for (size_t j = 0; j < n;) {
                    if (n - j >= d->ch_len && !memcmp(s + j, d->ch_s, d->ch_len)) {
                        if (!(i == 0 && d->prepend != PS_NEVER)) buf_putc(&t, ' ');
                        j += d->ch_len;
                    } else {
                        buf_putc(&t, s[j++]);
                    }
                }
            } else if (d->type == DEC_BPE) {
                const char *rep = i + 1 == in->n ? "" : " ";
                for (size_t j = 0; j < n;) {
                    if (d->str_len && n - j >= d->str_len && !memcmp(s + j, d->str, d->str_len)) {
                        buf_put(&t, rep, strlen(rep));
                        j += d->str_len;
                    } else {
                        buf_putc(&t, s[j++]);
                    }
                }
            } else { /* DEC_STRIP: up to `start` leading and `stop` trailing content chars */
                size_t lo = 0, hi = n;
                for (size_t k = 0; k < d->start && n - lo >= d->ch_len && !memcmp(s + lo, d->ch_s, d->ch_len); k++)
                    lo += d->ch_len;
                for (size_t k = 0; k < d->stop && hi - lo >= d->ch_len && !memcmp(s + hi - d->ch_len, d->ch_s, d->ch_len); k++)
                    hi -= d->ch_len;
                buf_put(&t, s + lo, hi - lo);
            }
            plist_add(out, t.p ? t.p : "", t.n, 0);
        }
        break;
    }
    if (t.oom) out->oom = 1;
    buf_free(&t);
    return rc;
}

/* dec_apply: run a decoder (or a Sequence of them) over the token list `in`,
 * appending the result to `out`. A Sequence passes lists between its decoders
 * in two scratch lists; the first reads `in` and the last appends to `out`
 * directly (no copies in and out: decoding every token several times over was
 * much of what made decode, and fuzz-tokenizer, slow). */
static int dec_apply(struct enc_ctx *c, const struct decoder *d, const struct plist *in, struct plist *out) {
    if (d->type != DEC_SEQUENCE) return dec_step(c, d, in, out);
    if (d->n_kids == 0) {
        for (size_t i = 0; i < in->n; i++) plist_add(out, plist_str(in, i), in->v[i].len, 0);
        return 0;
    }
    struct plist a = {0}, b = {0};
    const struct plist *src = in;
    int rc = 0;
    for (size_t k = 0; k < d->n_kids && rc == 0; k++) {
        struct plist *dst = k + 1 == d->n_kids ? out : src == &a ? &b : &a;
        if (dst != out) plist_clear(dst);
        rc = dec_apply(c, d->kids[k], src, dst);
        if (dst->oom) out->oom = 1;
        src = dst;
    }
    plist_free(&a);
    plist_free(&b);
    return rc;
}

/* moe_tokenizer_decode: see moe-tokenizer.h. */
enum moe_status moe_tokenizer_decode(const struct moe_tokenizer *tok, const int32_t *ids, size_t n,
                                     int skip_special, char **out, size_t *out_len) {
    if (!tok || !out || (!ids && n)) return MOE_ERR_INVALID;
    *out = NULL;
    if (out_len) *out_len = 0;
    struct enc_ctx c;
    struct plist toks = {0}, res = {0};
    struct buf text = {0};
    enum moe_status st = ctx_init(&c, tok);
    if (st != MOE_OK) goto done;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        size_t len;
        const char *s = id >= 0 && id < tok->n_vocab ? dec_token(tok, id, &len) : NULL;
        if (!s) continue; /* unknown ids are dropped */
        if (skip_special && tok->id_skip[id]) continue;
        plist_add(&toks, s, len, 0);
    }
    const struct plist *fin = &toks;
    if (tok->decoder) {
        if (dec_apply(&c, tok->decoder, &toks, &res) < 0) {
            st = c.err ? c.err : MOE_ERR_FORMAT;
            goto done;
        }
        fin = &res;
    }
    for (size_t i = 0; i < fin->n; i++) {
        if (i && !tok->decoder) buf_putc(&text, ' '); /* no decoder: tokens joined by spaces */
        buf_put(&text, plist_str(fin, i), fin->v[i].len);
    }
    buf_put(&text, "", 0);
    if (toks.oom || res.oom || text.oom) {
        st = MOE_ERR_NOMEM;
        goto done;
    }
    *out = text.p;
    if (out_len) *out_len = text.n;
    text.p = NULL;
done:
    ctx_free(&c);
    plist_free(&toks);
    plist_free(&res);
    buf_free(&text);
    return st;
}

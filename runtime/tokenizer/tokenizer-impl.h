/*
 * tokenizer-impl.h - private to runtime/tokenizer/tokenizer-*.c: the tokenizer's data
 * structures (buffers, arena, hash maps, regexes, the pipeline's components,
 * the per-call encode context) and the functions the stages share. Not
 * installed; runtime/tokenizer/moe-tokenizer.h is the public API.
 *
 * Files, in pipeline order:
 *   tokenizer-util.c        growable buffers, string arena, hash maps, UTF-8 and
 *                           character classes, regexes (PCRE2), the per-call context
 *   tokenizer-components.c  tokenizer.json's normalizer, pre-tokenizer and decoder
 *                           objects parsed into the structs below
 *   tokenizer-load.c        loading: model, merges, added tokens, post-processor,
 *                           id tables, BOS/EOS; the public load/lookup calls
 *   tokenizer-normalize.c   the normalizers
 *   tokenizer-pretok.c      added-token splitting and the pre-tokenizers
 *   tokenizer-bpe.c         the BPE merge loop and moe_tokenizer_encode
 *   tokenizer-decode.c      the decoder chain and moe_tokenizer_decode
 *
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
#ifndef MOE_TOKENIZER_IMPL_H
#define MOE_TOKENIZER_IMPL_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif

#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "moe-tokenizer.h"
#include "moe-base.h"


#define TOK_MAX_JSON_BYTES ((size_t)1 << 30) /* 1 GiB: far above any real tokenizer.json */
#define TOK_MAX_ID ((int32_t)1 << 24)        /* ids above this are treated as malformed */
#define TOK_FAST_CP 0x3000                   /* code points below this get a direct id table */

struct buf {
    char *p;
    size_t n, cap;
    int oom;
};

struct ivec {
    int32_t *v;
    size_t n, cap;
    int oom;
};

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

struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    char data[];
};

struct arena {
    struct arena_block *head;
};

struct smap_slot {
    const char *key; /* NULL = empty */
    uint32_t len;
    int32_t val;
};

struct smap {
    struct smap_slot *slots;
    size_t cap, n; /* cap is a power of two */
};

struct merge_slot {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX = empty */
    uint32_t rank;
    int32_t new_id;
};

struct mmap_pairs {
    struct merge_slot *slots;
    size_t cap, n;
};

/* The GPT-2 byte <-> character map of ByteLevel: printable Latin-1 bytes map to
 * themselves, the other 68 bytes to U+0100.. in byte order. */
struct bytelevel_map {
    int32_t byte_cp[256];
    int16_t cp_byte[324]; /* inverse: code point -> byte, -1 where none */
    char byte_utf8[256][3];
    uint8_t byte_utf8_len[256];
};

struct regex {
    pcre2_code *code; /* NULL for a literal */
    char *lit;        /* literal pattern (arena) */
    size_t lit_len;
};

#define ONIG_SPACE_EXTRA "\\x{85}"
#define ONIG_WORD_CLASS "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}\\x{200D}\\x{24B6}-\\x{24E9}"

struct span {
    size_t s, e;
    int m; /* 1 = a match / delimiter */
};

struct spanvec {
    struct span *v;
    size_t n, cap;
    int oom;
};

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

#define MAX_DEPTH 32 /* nesting of Sequence components */

struct added_src {
    const char *content;
    size_t len;
    uint8_t special, lstrip, rstrip, single_word, normalized;
};

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


/* ---- tokenizer-util.c ---- */

/* tok_plist_add: append a copy of s[0..n) as a new piece. */
void tok_plist_add(struct plist *l, const char *s, size_t n, int first);
/* tok_plist_clear: forget all pieces, keep the memory. */
void tok_plist_clear(struct plist *l);
/* tok_plist_free: release everything. */
void tok_plist_free(struct plist *l);
/* tok_arena_dup: NUL-terminated copy of s[0..n) in the arena; NULL on OOM. */
char *tok_arena_dup(struct arena *a, const char *s, size_t n);
/* tok_arena_free: release all blocks. */
void tok_arena_free(struct arena *a);
/* tok_smap_get: value for key s[0..n), or -1. */
int32_t tok_smap_get(const struct smap *m, const char *s, size_t n);
/* tok_smap_put: insert or overwrite; key must outlive the map. 0 on OOM. */
int tok_smap_put(struct smap *m, const char *key, size_t n, int32_t val);
/* tok_smap_free: release the table (not the keys). */
void tok_smap_free(struct smap *m);
/* tok_merges_get: the merge of (a, b), or NULL. */
const struct merge_slot *tok_merges_get(const struct mmap_pairs *m, int32_t a, int32_t b);
/* tok_merges_init: table sized for n merges; 0 on OOM. */
int tok_merges_init(struct mmap_pairs *m, size_t n);
/* tok_merges_put: insert or overwrite (a later duplicate wins, as a Rust HashMap collect does). */
void tok_merges_put(struct mmap_pairs *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id);
/* tok_cp_is_ws: Rust char::is_whitespace (Unicode White_Space). */
int tok_cp_is_ws(int32_t c);
/* tok_cp_is_word: Rust regex / Oniguruma \w: Alphabetic, marks, Nd, Pc, joiners. */
int tok_cp_is_word(int32_t c);
/* tok_cp_is_numeric: Rust char::is_numeric (Nd, Nl, No). */
int tok_cp_is_numeric(int32_t c);
/* tok_cp_is_punct: the tokenizers library's is_punc: ASCII punctuation or any P* category. */
int tok_cp_is_punct(int32_t c);
/* tok_cp_is_mark: combining marks (Mn, Mc, Me), what StripAccents removes. */
int tok_cp_is_mark(int32_t c);
/* tok_bytelevel_map_init: build the byte -> code point table. */
void tok_bytelevel_map_init(struct bytelevel_map *m);
/* tok_bytelevel_byte_of: the byte a ByteLevel character stands for, or -1. */
int tok_bytelevel_byte_of(const struct bytelevel_map *m, int32_t cp);
/* tok_regex_compile: compile a {"String": ...} (literal) or {"Regex": ...} pattern. */
enum moe_status tok_regex_compile(struct arena *a, const char *pat, size_t n, int literal,
                                     const char *what, struct regex *re);
/* tok_regex_free: release a compiled pattern (the literal lives in the arena). */
void tok_regex_free(struct regex *re);
/* tok_regex_find_all: every match in s[0..n), as the onig crate's find_iter yields them
 * (an empty match right where the previous match ended is skipped). Returns 0 or -1. */
int tok_regex_find_all(const struct regex *re, pcre2_match_data *md, const char *s, size_t n,
                          struct spanvec *out);
/* tok_matches_to_spans: cover s[0..n) with the matches and the gaps between them, as
 * Pattern::find_matches does for regexes. */
void tok_matches_to_spans(const struct spanvec *m, size_t n, struct spanvec *out);
/* tok_char_spans: cover s[0..n) with one span per character for which pred() holds and
 * spans for the runs between them, as Pattern::find_matches does for closures. */
void tok_char_spans(const char *s, size_t n, int (*pred)(int32_t, int32_t), int32_t arg,
                       struct spanvec *out);
/* tok_ctx_init: fresh per-call state (PCRE2 match data; the rest grows on demand). */
enum moe_status tok_ctx_init(struct enc_ctx *c, const struct moe_tokenizer *tok);
/* tok_ctx_free: release the per-call state. */
void tok_ctx_free(struct enc_ctx *c);
/* tok_segs_push: append one segment. */
void tok_segs_push(struct segvec *v, size_t s, size_t e, int32_t id);

/* ---- tokenizer-components.c ---- */

/* tok_jget: member `k` of object `o`, treating JSON null as absent. */
const cJSON *tok_jget(const cJSON *o, const char *k);
/* tok_jstr: the string value of member `k`, or NULL (absent, null or not a string). */
const char *tok_jstr(const cJSON *o, const char *k);
/* tok_jbool: the boolean member `k`, or dflt when absent or not a boolean. */
int tok_jbool(const cJSON *o, const char *k, int dflt);
/* tok_jtype: the "type" of a component object, or NULL with a logged error. */
const char *tok_jtype(const struct moe_tokenizer *tok, const cJSON *o, const char *what);
/* tok_unsupported: log that a component type is not handled. */
enum moe_status tok_unsupported(const struct moe_tokenizer *tok, const char *what, const char *type);
/* tok_jkids: the array member `k` of a Sequence component, checked. */
enum moe_status tok_jkids(const struct moe_tokenizer *tok, const cJSON *o, const char *k,
                             const char *what, const cJSON **arr, size_t *n);
/* tok_normalizer_free: release a normalizer tree. */
void tok_normalizer_free(struct normalizer *nz);
/* tok_pretok_free: release a pre-tokenizer tree. */
void tok_pretok_free(struct pretok *pt);
/* tok_decoder_free: release a decoder tree. */
void tok_decoder_free(struct decoder *d);
/* tok_parse_normalizer: build a normalizer from its JSON object (recursive for Sequence). */
enum moe_status tok_parse_normalizer(struct moe_tokenizer *tok, const cJSON *j, int depth,
                                        struct normalizer **out);
/* tok_parse_pretok: build a pre-tokenizer from its JSON object (recursive for Sequence). */
enum moe_status tok_parse_pretok(struct moe_tokenizer *tok, const cJSON *j, int depth,
                                    struct pretok **out);
/* tok_parse_decoder: build a decoder from its JSON object (recursive for Sequence). */
enum moe_status tok_parse_decoder(struct moe_tokenizer *tok, const cJSON *j, int depth,
                                     struct decoder **out);

/* ---- tokenizer-load.c ---- */

/* tok_vocab_lookup: id of a string in the model vocab, or -1. */
int32_t tok_vocab_lookup(const struct moe_tokenizer *tok, const char *s, size_t n);
/* tok_pat_cmp: order matcher patterns by first byte, then longest first. */
int tok_pat_cmp(const void *x, const void *y);
/* tok_dec_token: the string decoding uses for an id (NULL if nothing maps to it). The
 * library decodes a `normalized` added token as its normalized form. */
const char *tok_dec_token(const struct moe_tokenizer *tok, int32_t id, size_t *len);

/* ---- tokenizer-normalize.c ---- */

/* tok_replace_all: replace every match of re in s[0..n) by content (Replace). */
int tok_replace_all(struct enc_ctx *c, const struct regex *re, const char *content, size_t clen,
                       const char *s, size_t n, struct buf *out);
/* tok_nz_apply: run a normalizer over s[0..n), appending the result to out. 0, or -1 with c->err set. */
int tok_nz_apply(struct enc_ctx *c, const struct normalizer *nz, const char *s, size_t n, struct buf *out);

/* ---- tokenizer-pretok.c ---- */

/* tok_build_matcher: the leftmost-longest matcher for the non-normalized (raw text) or the
 * normalized added tokens; a normalized token is matched in its normalized form, which
 * is also what decoding shows for it (as the library's normalized cache does). */
enum moe_status tok_build_matcher(struct moe_tokenizer *tok, int normalized, struct amatcher *m);
/* tok_added_split: cut s[0..n) at the added tokens of matcher m, as
 * AddedVocabulary::find_matches does (single_word, lstrip, rstrip). */
void tok_added_split(const struct moe_tokenizer *tok, const struct amatcher *m, const char *s, size_t n,
                        struct segvec *out);
/* tok_pretok_apply: run a pre-tokenizer over every piece of `in`, appending to `out`. */
void tok_pretok_apply(struct enc_ctx *c, const struct pretok *pt, const struct plist *in, struct plist *out);

/* ---- small helpers, inline for the hot loops ---- */

/* buf_reserve: make room for `extra` more bytes plus a NUL; sets oom on failure. */
static inline int buf_reserve(struct buf *b, size_t extra) {
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
static inline void buf_put(struct buf *b, const void *s, size_t n) {
    if (!buf_reserve(b, n)) return;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* buf_putc: append one byte. The decoders append byte by byte, so the common
 * case (room left) takes one comparison, not buf_reserve's six: under the
 * fuzzer's comparison tracing that was a large share of fuzz-tokenizer's time. */
static inline void buf_putc(struct buf *b, char c) {
    if (b->n + 2 <= b->cap && !b->oom) {
        b->p[b->n++] = c;
        b->p[b->n] = 0;
        return;
    }
    buf_put(b, &c, 1);
}

/* buf_put_cp: append one code point as UTF-8. */
static inline void buf_put_cp(struct buf *b, int32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    buf_put(b, tmp, k > 0 ? (size_t)k : 0);
}

/* buf_free: release the memory and reset to empty. */
static inline void buf_free(struct buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ivec_push: append one id; sets oom on failure. */
static inline void ivec_push(struct ivec *v, int32_t x) {
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
static inline int grow(void **arr, size_t *cap, size_t need, size_t elem) {
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

/* plist_str: pointer to piece i's bytes (valid until the next add). */
static inline const char *plist_str(const struct plist *l, size_t i) {
    return l->text.p ? l->text.p + l->v[i].off : "";
}

/* utf8_decode: decode one code point from s[0..n) (n >= 1). Returns the number of
 * bytes used. An invalid sequence gives *cp = -1 and the length of its maximal
 * invalid prefix, the unit from_utf8_lossy replaces by one U+FFFD. */
static inline size_t utf8_decode(const unsigned char *s, size_t n, int32_t *cp) {
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

/* char_len: length of the (valid) UTF-8 character starting at s[i]. */
static inline size_t char_len(const char *s, size_t n, size_t i) {
    int32_t cp;
    return utf8_decode((const unsigned char *)s + i, n - i, &cp);
}

/* ctx_fail: remember the first error of a call. */
static inline void ctx_fail(struct enc_ctx *c, enum moe_status st) {
    if (c->err == MOE_OK) c->err = st;
}


#endif

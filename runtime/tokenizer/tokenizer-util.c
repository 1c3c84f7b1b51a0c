/*
 * tokenizer-util.c - the tokenizer's shared machinery: growable buffers, the string
 * arena, hash maps (string -> id, pair -> merge), UTF-8 and character classes,
 * regexes (Oniguruma patterns run through PCRE2) and the per-call encode context.
 * tokenizer-impl.h says how the files fit together.
 */
#include "tokenizer-impl.h"

#include <limits.h>

/* ------------------------------------------------------------------------- */
/* Growable buffers. Allocation failure sets a sticky `oom` flag checked once. */

/* tok_plist_add: append a copy of s[0..n) as a new piece. */
void tok_plist_add(struct plist *l, const char *s, size_t n, int first) {
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

/* tok_plist_clear: forget all pieces, keep the memory. */
void tok_plist_clear(struct plist *l) {
    l->n = 0;
    l->text.n = 0;
}

/* tok_plist_free: release everything. */
void tok_plist_free(struct plist *l) {
    buf_free(&l->text);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------------------- */
/* String arena: every string the tokenizer keeps lives here, freed at once. */

/* tok_arena_dup: NUL-terminated copy of s[0..n) in the arena; NULL on OOM. */
char *tok_arena_dup(struct arena *a, const char *s, size_t n) {
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

/* tok_arena_free: release all blocks. */
void tok_arena_free(struct arena *a) {
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

/* tok_smap_get: value for key s[0..n), or -1. */
int32_t tok_smap_get(const struct smap *m, const char *s, size_t n) {
    if (!m->cap) return -1;
    struct smap_slot *e = smap_find_slot(m, s, n);
    return e->key ? e->val : -1;
}

/* tok_smap_put: insert or overwrite; key must outlive the map. 0 on OOM. */
int tok_smap_put(struct smap *m, const char *key, size_t n, int32_t val) {
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

/* tok_smap_free: release the table (not the keys). */
void tok_smap_free(struct smap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

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

/* tok_merges_get: the merge of (a, b), or NULL. */
const struct merge_slot *tok_merges_get(const struct mmap_pairs *m, int32_t a, int32_t b) {
    if (!m->cap) return NULL;
    const struct merge_slot *e = merges_find(m, a, b);
    return e->key == UINT64_MAX ? NULL : e;
}

/* tok_merges_init: table sized for n merges; 0 on OOM. */
int tok_merges_init(struct mmap_pairs *m, size_t n) {
    size_t cap = 16;
    while (cap < n * 2 + 2) cap *= 2;
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return 0;
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->cap = cap;
    m->n = 0;
    return 1;
}

/* tok_merges_put: insert or overwrite (a later duplicate wins, as a Rust HashMap collect does). */
void tok_merges_put(struct mmap_pairs *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    struct merge_slot *e = merges_find(m, a, b);
    if (e->key == UINT64_MAX) m->n++;
    e->key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    e->rank = rank;
    e->new_id = new_id;
}

/* ------------------------------------------------------------------------- */
/* UTF-8 and character classes. */

/* tok_cp_is_ws: Rust char::is_whitespace (Unicode White_Space). */
int tok_cp_is_ws(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* cp_cat: Unicode general category (UTF8PROC_CATEGORY_*); Cn for invalid input. */
static int cp_cat(int32_t c) { return c < 0 ? UTF8PROC_CATEGORY_CN : utf8proc_category(c); }

/* tok_cp_is_word: Rust regex / Oniguruma \w: Alphabetic, marks, Nd, Pc, joiners. */
int tok_cp_is_word(int32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    int k = cp_cat(c);
    if (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) return 1; /* L*, M* */
    if (k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC) return 1;
    if (c == 0x200C || c == 0x200D) return 1;
    /* Other_Alphabetic symbols: circled and squared Latin letters */
    return (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
           (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189);
}

/* tok_cp_is_numeric: Rust char::is_numeric (Nd, Nl, No). */
int tok_cp_is_numeric(int32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    int k = cp_cat(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* tok_cp_is_punct: the tokenizers library's is_punc: ASCII punctuation or any P* category. */
int tok_cp_is_punct(int32_t c) {
    if (c < 0x80)
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
               (c >= 0x7B && c <= 0x7E);
    int k = cp_cat(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* tok_cp_is_mark: combining marks (Mn, Mc, Me), what StripAccents removes. */
int tok_cp_is_mark(int32_t c) {
    int k = cp_cat(c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

/* tok_bytelevel_map_init: build the byte -> code point table. */
void tok_bytelevel_map_init(struct bytelevel_map *m) {
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

/* tok_bytelevel_byte_of: the byte a ByteLevel character stands for, or -1. */
int tok_bytelevel_byte_of(const struct bytelevel_map *m, int32_t cp) {
    return cp >= 0 && cp < 324 ? m->cp_byte[cp] : -1;
}

/* ------------------------------------------------------------------------- */
/* Regexes. Patterns from tokenizer.json are Oniguruma (Ruby syntax) patterns; PCRE2
 * with UTF+UCP agrees on everything these files use once \s, \S, \w, \W and \d are
 * widened to Oniguruma's Unicode classes and ^/$ are made line anchors. String
 * patterns are matched literally without PCRE2. */

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

/* tok_regex_compile: compile a {"String": ...} (literal) or {"Regex": ...} pattern. */
enum moe_status tok_regex_compile(struct arena *a, const char *pat, size_t n, int literal,
                                     const char *what, struct regex *re) {
    memset(re, 0, sizeof *re);
    if (literal) {
        re->lit = tok_arena_dup(a, pat, n);
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

/* tok_regex_free: release a compiled pattern (the literal lives in the arena). */
void tok_regex_free(struct regex *re) {
    if (re->code) pcre2_code_free(re->code);
    re->code = NULL;
}

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

/* tok_regex_find_all: every match in s[0..n), as the onig crate's find_iter yields them
 * (an empty match right where the previous match ended is skipped). Returns 0 or -1. */
int tok_regex_find_all(const struct regex *re, pcre2_match_data *md, const char *s, size_t n,
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

/* tok_matches_to_spans: cover s[0..n) with the matches and the gaps between them, as
 * Pattern::find_matches does for regexes. */
void tok_matches_to_spans(const struct spanvec *m, size_t n, struct spanvec *out) {
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

/* tok_char_spans: cover s[0..n) with one span per character for which pred() holds and
 * spans for the runs between them, as Pattern::find_matches does for closures. */
void tok_char_spans(const char *s, size_t n, int (*pred)(int32_t, int32_t), int32_t arg,
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

/* Encoding. */

/* tok_ctx_init: fresh per-call state (PCRE2 match data; the rest grows on demand). */
enum moe_status tok_ctx_init(struct enc_ctx *c, const struct moe_tokenizer *tok) {
    memset(c, 0, sizeof *c);
    c->tok = tok;
    c->md = pcre2_match_data_create(16, NULL);
    return c->md ? MOE_OK : MOE_ERR_NOMEM;
}

/* tok_ctx_free: release the per-call state. */
void tok_ctx_free(struct enc_ctx *c) {
    if (c->md) pcre2_match_data_free(c->md);
    free(c->m.v);
    free(c->sp.v);
    free(c->syms);
    free(c->heap);
    buf_free(&c->key);
    free(c->ids.v);
    memset(c, 0, sizeof *c);
}

/* tok_segs_push: append one segment. */
void tok_segs_push(struct segvec *v, size_t s, size_t e, int32_t id) {
    if (v->oom) return;
    if (!grow((void **)&v->v, &v->cap, v->n + 1, sizeof *v->v)) {
        v->oom = 1;
        return;
    }
    v->v[v->n++] = (struct seg){s, e, id};
}

/* ---- normalizers ---- */

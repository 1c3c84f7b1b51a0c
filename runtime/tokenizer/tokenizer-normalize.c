/*
 * tokenizer-normalize.c - the normalizers (encode step 3).
 * tokenizer-impl.h says how the files fit together.
 */
#include "tokenizer-impl.h"

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

/* tok_replace_all: replace every match of re in s[0..n) by content (Replace). */
int tok_replace_all(struct enc_ctx *c, const struct regex *re, const char *content, size_t clen,
                       const char *s, size_t n, struct buf *out) {
    if (tok_regex_find_all(re, c->md, s, n, &c->m) < 0) {
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

/* tok_nz_apply: run a normalizer over s[0..n), appending the result to out. 0, or -1 with c->err set. */
int tok_nz_apply(struct enc_ctx *c, const struct normalizer *nz, const char *s, size_t n, struct buf *out) {
    switch (nz->type) {
    case NZ_NFC: nz_unicode(UTF8PROC_COMPOSE, s, n, out); return 0;
    case NZ_NFD: nz_unicode(UTF8PROC_DECOMPOSE, s, n, out); return 0;
    case NZ_NFKC: nz_unicode(UTF8PROC_COMPOSE | UTF8PROC_COMPAT, s, n, out); return 0;
    case NZ_NFKD: nz_unicode(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, s, n, out); return 0;
    case NZ_PREPEND:
        if (n) buf_put(out, nz->str, nz->str_len);
        buf_put(out, s, n);
        return 0;
    case NZ_REPLACE: return tok_replace_all(c, &nz->re, nz->str, nz->str_len, s, n, out);
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
            rc = tok_nz_apply(c, nz->kids[i], a.p ? a.p : "", a.n, &b);
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
            if (!nz->left || !tok_cp_is_ws(cp)) break;
            lo += k;
        }
        while (hi > lo && nz->right) {
            size_t j = hi - 1;
            while (j > lo && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
            int32_t cp;
            utf8_decode((const unsigned char *)s + j, hi - j, &cp);
            if (!tok_cp_is_ws(cp)) break;
            hi = j;
        }
        buf_put(out, s + lo, hi - lo);
        return 0;
    }
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (nz->type == NZ_STRIP_ACCENTS) {
            if (!tok_cp_is_mark(cp)) buf_put(out, s + i, k);
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

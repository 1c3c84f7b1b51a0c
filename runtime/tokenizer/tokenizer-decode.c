/*
 * tokenizer-decode.c - decoding: ids -> token strings -> the decoder chain
 * (moe_tokenizer_decode).
 * tokenizer-impl.h says how the files fit together.
 */
#include "tokenizer-impl.h"

/* Decoding: id -> token strings -> decoder chain. Tokens may hold any bytes once
 * ByteFallback/ByteLevel ran, so nothing here assumes valid UTF-8. */

/* dec_replace_token: Replace on one token (a literal, or a regex on valid UTF-8 only). */
static int dec_replace_token(struct enc_ctx *c, const struct decoder *d, const char *s, size_t n, struct buf *out) {
    if (d->re.code && moe_utf8_bad_offset(s, n) != n) {
        buf_put(out, s, n);
        return 0;
    }
    return tok_replace_all(c, &d->re, d->str, d->str_len, s, n, out);
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
                int b = tok_bytelevel_byte_of(&c->tok->bl, cp);
                if (b < 0) break;
                buf_putc(&t, (char)b);
                j += k;
            }
            if (j < n) {
                t.n = mark;
                buf_put(&t, s, n);
            }
        }
        tok_plist_add(out, t.p ? t.p : "", t.n, 0);
        break;
    case DEC_BYTEFALLBACK:
        for (size_t i = 0; i <= in->n; i++) {
            int b = i < in->n ? hex_byte(plist_str(in, i), in->v[i].len) : -1;
            if (b >= 0) {
                buf_putc(&t, (char)b);
                continue;
            }
            if (t.n) {
                tok_plist_add(out, t.p, t.n, 0);
                t.n = 0;
            }
            if (i < in->n) tok_plist_add(out, plist_str(in, i), in->v[i].len, 0);
        }
        break;
    case DEC_FUSE:
        for (size_t i = 0; i < in->n; i++) buf_put(&t, plist_str(in, i), in->v[i].len);
        tok_plist_add(out, t.p ? t.p : "", t.n, 0);
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
            tok_plist_add(out, t.p ? t.p : "", t.n, 0);
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
        for (size_t i = 0; i < in->n; i++) tok_plist_add(out, plist_str(in, i), in->v[i].len, 0);
        return 0;
    }
    struct plist a = {0}, b = {0};
    const struct plist *src = in;
    int rc = 0;
    for (size_t k = 0; k < d->n_kids && rc == 0; k++) {
        struct plist *dst = k + 1 == d->n_kids ? out : src == &a ? &b : &a;
        if (dst != out) tok_plist_clear(dst);
        rc = dec_apply(c, d->kids[k], src, dst);
        if (dst->oom) out->oom = 1;
        src = dst;
    }
    tok_plist_free(&a);
    tok_plist_free(&b);
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
    enum moe_status st = tok_ctx_init(&c, tok);
    if (st != MOE_OK) goto done;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        size_t len;
        const char *s = id >= 0 && id < tok->n_vocab ? tok_dec_token(tok, id, &len) : NULL;
        if (!s) continue; /* unknown ids are dropped */
        if (skip_special && tok->id_skip[id]) continue;
        tok_plist_add(&toks, s, len, 0);
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
    tok_ctx_free(&c);
    tok_plist_free(&toks);
    tok_plist_free(&res);
    buf_free(&text);
    return st;
}

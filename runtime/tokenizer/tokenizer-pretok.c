/*
 * tokenizer-pretok.c - added-token splitting (encode steps 2 and 3) and the
 * pre-tokenizers (step 4).
 * tokenizer-impl.h says how the files fit together.
 */
#include "tokenizer-impl.h"

/* tok_build_matcher: the leftmost-longest matcher for the non-normalized (raw text) or the
 * normalized added tokens; a normalized token is matched in its normalized form, which
 * is also what decoding shows for it (as the library's normalized cache does). */
enum moe_status tok_build_matcher(struct moe_tokenizer *tok, int normalized, struct amatcher *m) {
    enum moe_status st = MOE_OK;
    struct enc_ctx c;
    struct buf b = {0};
    memset(m, 0, sizeof *m);
    if (!tok->n_added) return MOE_OK;
    if ((st = tok_ctx_init(&c, tok)) != MOE_OK) return st;
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
            if (tok_nz_apply(&c, tok->normalizer, a->content, a->len, &b) < 0) {
                st = c.err;
                goto fail;
            }
            if (b.oom) {
                st = MOE_ERR_NOMEM;
                goto fail;
            }
            s = tok_arena_dup(&tok->arena, b.p ? b.p : "", b.n);
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
    qsort(m->v, m->n, sizeof *m->v, tok_pat_cmp);
    size_t k = 0;
    for (int byte = 0; byte < 256; byte++) {
        m->start[byte] = (uint32_t)k;
        while (k < m->n && (unsigned char)m->v[k].s[0] == byte) k++;
    }
    m->start[256] = (uint32_t)k;
fail:
    buf_free(&b);
    tok_ctx_free(&c);
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

/* tok_added_split: cut s[0..n) at the added tokens of matcher m, as
 * AddedVocabulary::find_matches does (single_word, lstrip, rstrip). */
void tok_added_split(const struct moe_tokenizer *tok, const struct amatcher *m, const char *s, size_t n,
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
            int start_space = ms == 0 || !tok_cp_is_word(last_cp_before(s, ms));
            int stop_space = me == n || (utf8_decode((const unsigned char *)s + me, n - me, &cp), !tok_cp_is_word(cp));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t p = start;
            while (p > 0 && tok_cp_is_ws(last_cp_before(s, p))) {
                p--;
                while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
            }
            start = p > start_offset ? p : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                int32_t cp;
                size_t k = utf8_decode((const unsigned char *)s + stop, n - stop, &cp);
                if (!tok_cp_is_ws(cp)) break;
                stop += k;
            }
        }
        if (start_offset < start) tok_segs_push(out, start_offset, start, -1);
        tok_segs_push(out, start, stop, id);
        /* a match inside whitespace an earlier rstrip took must not rewind (the
         * library's own split panics on such overlaps) */
        if (stop > start_offset) start_offset = stop;
    }
    if (start_offset != n) tok_segs_push(out, start_offset, n, -1);
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
        if (v[i].e > v[i].s) tok_plist_add(out, s + v[i].s, v[i].e - v[i].s, first && v[i].s == 0);
}

/* Character predicates for char_spans. */
static int pred_ws(int32_t c, int32_t arg) { return (void)arg, tok_cp_is_ws(c); }
static int pred_numeric(int32_t c, int32_t arg) { return (void)arg, tok_cp_is_numeric(c); }
static int pred_punct(int32_t c, int32_t arg) { return (void)arg, tok_cp_is_punct(c); }
static int pred_eq(int32_t c, int32_t arg) { return c == arg; }

/* regex_split: split one piece at the matches of re. */
static void regex_split(struct enc_ctx *c, const struct regex *re, const char *s, size_t n, int first,
                        enum behavior behavior, int invert, struct plist *out) {
    if (tok_regex_find_all(re, c->md, s, n, &c->m) < 0) {
        ctx_fail(c, c->m.oom ? MOE_ERR_NOMEM : MOE_ERR_FORMAT);
        return;
    }
    tok_matches_to_spans(&c->m, n, &c->sp);
    split_apply(&c->sp, s, first, behavior, invert, out);
}

/* whitespace_runs: the Whitespace pre-tokenizer: runs matching \w+|[^\w\s]+. */
static void whitespace_runs(const char *s, size_t n, int first, struct plist *out) {
    size_t i = 0;
    while (i < n) {
        int32_t cp;
        size_t k = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (tok_cp_is_ws(cp)) {
            i += k;
            continue;
        }
        int word = tok_cp_is_word(cp);
        size_t j = i + k;
        while (j < n) {
            size_t k2 = utf8_decode((const unsigned char *)s + j, n - j, &cp);
            if (tok_cp_is_ws(cp) || tok_cp_is_word(cp) != word) break;
            j += k2;
        }
        tok_plist_add(out, s + i, j - i, first && i == 0);
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
        else tok_plist_add(&parts, t.p, t.n, first);
        for (size_t i = 0; i < parts.n; i++) {
            const unsigned char *p = (const unsigned char *)plist_str(&parts, i);
            t.n = 0;
            for (size_t j = 0; j < parts.v[i].len; j++)
                buf_put(&t, tok->bl.byte_utf8[p[j]], tok->bl.byte_utf8_len[p[j]]);
            tok_plist_add(out, t.p, t.n, parts.v[i].first);
        }
        if (t.oom || parts.oom) out->oom = 1;
        buf_free(&t);
        tok_plist_free(&parts);
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
            tok_char_spans(t.p ? t.p : "", t.n, pred_eq, pt->ch, &c->sp);
            split_apply(&c->sp, t.p, first, SB_MERGED_NEXT, 0, out);
        } else {
            tok_plist_add(out, t.p ? t.p : "", t.n, first);
        }
        if (t.oom || r.oom || c->sp.oom) out->oom = 1;
        buf_free(&t);
        buf_free(&r);
        return;
    }
    case PT_SPLIT: regex_split(c, &pt->re, s, n, first, pt->behavior, pt->invert, out); return;
    case PT_WHITESPACE: whitespace_runs(s, n, first, out); return;
    case PT_WHITESPACE_SPLIT:
        tok_char_spans(s, n, pred_ws, 0, &c->sp);
        split_apply(&c->sp, s, first, SB_REMOVED, 0, out);
        return;
    case PT_DIGITS:
        tok_char_spans(s, n, pred_numeric, 0, &c->sp);
        split_apply(&c->sp, s, first, pt->individual ? SB_ISOLATED : SB_CONTIGUOUS, 0, out);
        return;
    case PT_PUNCTUATION:
        tok_char_spans(s, n, pred_punct, 0, &c->sp);
        split_apply(&c->sp, s, first, pt->behavior, 0, out);
        return;
    case PT_CHAR_DELIMITER:
        tok_char_spans(s, n, pred_eq, pt->ch, &c->sp);
        split_apply(&c->sp, s, first, SB_REMOVED, 0, out);
        return;
    case PT_BERT: {
        struct plist words = {0};
        tok_char_spans(s, n, pred_ws, 0, &c->sp);
        split_apply(&c->sp, s, first, SB_REMOVED, 0, &words);
        for (size_t i = 0; i < words.n; i++) {
            tok_char_spans(plist_str(&words, i), words.v[i].len, pred_punct, 0, &c->sp);
            split_apply(&c->sp, plist_str(&words, i), words.v[i].first, SB_ISOLATED, 0, out);
        }
        if (words.oom) out->oom = 1;
        tok_plist_free(&words);
        return;
    }
    case PT_SEQUENCE: break;
    }
}

/* tok_pretok_apply: run a pre-tokenizer over every piece of `in`, appending to `out`. */
void tok_pretok_apply(struct enc_ctx *c, const struct pretok *pt, const struct plist *in, struct plist *out) {
    if (pt->type != PT_SEQUENCE) {
        for (size_t i = 0; i < in->n; i++) pretok_piece(c, pt, plist_str(in, i), in->v[i].len, in->v[i].first, out);
        if (c->sp.oom || c->m.oom) out->oom = 1;
        return;
    }
    struct plist a = {0}, b = {0};
    for (size_t i = 0; i < in->n; i++) tok_plist_add(&a, plist_str(in, i), in->v[i].len, in->v[i].first);
    for (size_t k = 0; k < pt->n_kids && c->err == MOE_OK; k++) {
        tok_plist_clear(&b);
        tok_pretok_apply(c, pt->kids[k], &a, &b);
        struct plist t = a;
        a = b;
        b = t;
    }
    for (size_t i = 0; i < a.n; i++) tok_plist_add(out, plist_str(&a, i), a.v[i].len, a.v[i].first);
    if (a.oom || b.oom) out->oom = 1;
    tok_plist_free(&a);
    tok_plist_free(&b);
}

/* ---- BPE ---- */

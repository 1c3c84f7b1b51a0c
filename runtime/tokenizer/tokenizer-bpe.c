/*
 * tokenizer-bpe.c - the BPE merge loop (encode step 5, a binary heap like word.rs's
 * merge_all) and moe_tokenizer_encode, which runs the whole pipeline.
 * tokenizer-impl.h says how the files fit together.
 */
#include "tokenizer-impl.h"

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
    return c->err ? -1 : tok_vocab_lookup(tok, c->key.p, c->key.n);
}

/* bpe_word: tokenize one pre-tokenized word with the BPE model, as BPE::merge_word
 * and Word::merge_all do, appending the ids to c->ids. */
static void bpe_word(struct enc_ctx *c, const char *w, size_t n) {
    const struct moe_tokenizer *tok = c->tok;
    if (n == 0) return;
    if (tok->ignore_merges) {
        int32_t id = tok_vocab_lookup(tok, w, n);
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
        const struct merge_slot *m = tok_merges_get(&tok->merges, sy[i].id, sy[i + 1].id);
        if (m) heap_push(c, (struct heap_ent){m->rank, (uint32_t)i, m->new_id});
    }
    while (c->heap_n && c->err == MOE_OK) {
        struct heap_ent top = heap_pop(c);
        struct sym *cur = &sy[top.pos];
        if (cur->dead || cur->next < 0) continue;
        struct sym *right = &sy[cur->next];
        const struct merge_slot *m = tok_merges_get(&tok->merges, cur->id, right->id);
        if (!m || m->new_id != top.new_id) continue; /* stale entry */
        cur->id = top.new_id;
        cur->next = right->next;
        right->dead = 1;
        if (cur->next >= 0) sy[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            m = tok_merges_get(&tok->merges, sy[cur->prev].id, cur->id);
            if (m) heap_push(c, (struct heap_ent){m->rank, (uint32_t)cur->prev, m->new_id});
        }
        if (cur->next >= 0) {
            m = tok_merges_get(&tok->merges, cur->id, sy[cur->next].id);
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
        if (tok_nz_apply(c, tok->normalizer, s, n, &norm) < 0) goto done;
        if (norm.oom) {
            ctx_fail(c, MOE_ERR_NOMEM);
            goto done;
        }
        s = norm.p ? norm.p : "";
        n = norm.n;
    }
    tok_added_split(tok, &tok->norm_match, s, n, &segs);
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
        tok_plist_clear(&in);
        tok_plist_clear(&words);
        tok_plist_add(&in, s + g->s, g->e - g->s, f);
        tok_pretok_apply(c, tok->pretok, &in, &words);
        if (words.oom || in.oom) ctx_fail(c, MOE_ERR_NOMEM);
        for (size_t w = 0; w < words.n && c->err == MOE_OK; w++) bpe_word(c, plist_str(&words, w), words.v[w].len);
    }
    if (segs.oom) ctx_fail(c, MOE_ERR_NOMEM);
done:
    buf_free(&norm);
    free(segs.v);
    tok_plist_free(&in);
    tok_plist_free(&words);
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
    enum moe_status st = tok_ctx_init(&c, tok);
    if (st != MOE_OK) goto done;
    if (!text) text = "";
    if (moe_utf8_bad_offset(text, len) != len) {
        if (lossy_utf8(text, len, &clean) < 0) {
            st = MOE_ERR_NOMEM;
            goto done;
        }
        text = clean.p;
        len = clean.n;
    }
    if (add_special)
        for (size_t i = 0; i < tok->n_post_pre; i++) ivec_push(&c.ids, tok->post_pre[i]);
    tok_added_split(tok, &tok->raw_match, text, len, &segs);
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
    tok_ctx_free(&c);
    buf_free(&clean);
    free(segs.v);
    return st;
}

/* ------------------------------------------------------------------------- */

/*
 * tokenizer-load.c - loading a tokenizer: the BPE model and merges, added tokens, the
 * post-processor, id tables and BOS/EOS; moe_tokenizer_load* and the lookups.
 * tokenizer-impl.h says how the files fit together.
 */
#include "tokenizer-impl.h"

#include <limits.h>
#include <math.h>
#include <sys/stat.h>

#include "moe-mmap.h"

/* Loading: model, added tokens, post-processor, id tables, BOS/EOS. */

/* json_id: a token id from JSON: an integer in [0, TOK_MAX_ID). -1 if malformed. */
static int32_t json_id(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0) || d >= (double)TOK_MAX_ID || floor(d) != d) return -1;
    return (int32_t)d;
}

/* tok_vocab_lookup: id of a string in the model vocab, or -1. */
int32_t tok_vocab_lookup(const struct moe_tokenizer *tok, const char *s, size_t n) {
    return tok_smap_get(&tok->vocab, s, n);
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
    if (!tok_merges_init(&tok->merges, n)) return MOE_ERR_NOMEM;
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
        int32_t ia = tok_vocab_lookup(tok, a, na), ib = tok_vocab_lookup(tok, b, nb);
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
        int32_t inew = tok_vocab_lookup(tok, joined.p, joined.n);
        if (inew < 0) {
            MOE_LOGE("%s: merge %zu makes \"%.*s\", which is not in the vocab", tok->label, rank + 1,
                     (int)(joined.n > 60 ? 60 : joined.n), joined.p);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        tok_merges_put(&tok->merges, ia, ib, r, inew);
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
    const char *s = tok_jstr(o, k);
    *out = NULL;
    *len = 0;
    if (!s || !*s) return MOE_OK;
    *len = strlen(s);
    return (*out = tok_arena_dup(&tok->arena, s, *len)) ? MOE_OK : MOE_ERR_NOMEM;
}

/* load_bpe: the "model" object of type BPE: vocab, merges and options. */
static enum moe_status load_bpe(struct moe_tokenizer *tok, const cJSON *model, int32_t *max_id) {
    enum moe_status st;
    const cJSON *vocab = tok_jget(model, "vocab");
    if (!cJSON_IsObject(vocab)) {
        MOE_LOGE("%s: BPE model has no \"vocab\" object", tok->label);
        return MOE_ERR_FORMAT;
    }
    const cJSON *dropout = tok_jget(model, "dropout");
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
        const char *key = tok_arena_dup(&tok->arena, e->string, n);
        if (!key || !tok_smap_put(&tok->vocab, key, n, id)) return MOE_ERR_NOMEM;
        if (id > *max_id) *max_id = id;
    }
    tok->n_model = tok->vocab.n;
    if ((size_t)*max_id > 4 * tok->n_model + 65536) {
        MOE_LOGE("%s: vocab ids reach %d for only %zu entries", tok->label, *max_id, tok->n_model);
        return MOE_ERR_FORMAT;
    }
    tok->byte_fallback = tok_jbool(model, "byte_fallback", 0);
    tok->fuse_unk = tok_jbool(model, "fuse_unk", 0);
    tok->ignore_merges = tok_jbool(model, "ignore_merges", 0);
    if ((st = opt_string(tok, model, "continuing_subword_prefix", &tok->prefix, &tok->prefix_len)) != MOE_OK)
        return st;
    if ((st = opt_string(tok, model, "end_of_word_suffix", &tok->suffix, &tok->suffix_len)) != MOE_OK)
        return st;
    size_t unk_len;
    if ((st = opt_string(tok, model, "unk_token", &tok->unk_str, &unk_len)) != MOE_OK) return st;
    tok->unk_id = -1;
    if (tok->unk_str) {
        tok->unk_id = tok_vocab_lookup(tok, tok->unk_str, unk_len);
        tok->unk_missing = tok->unk_id < 0;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_id[b] = tok_vocab_lookup(tok, name, 6);
    }
    return load_merges(tok, tok_jget(model, "merges"));
}

/* load_model: dispatch on model.type; only BPE is supported. */
static enum moe_status load_model(struct moe_tokenizer *tok, const cJSON *root, int32_t *max_id) {
    const cJSON *model = tok_jget(root, "model");
    if (!cJSON_IsObject(model)) {
        MOE_LOGE("%s: no \"model\" object", tok->label);
        return MOE_ERR_FORMAT;
    }
    const char *type = tok_jstr(model, "type");
    if (!type) {
        /* files from before "type" was written: BPE is the one with merges */
        if (tok_jget(model, "merges")) type = "BPE";
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
    const cJSON *arr = tok_jget(root, "added_tokens");
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
        const char *content = tok_jstr(e, "content");
        if (!content || json_id(tok_jget(e, "id")) < 0) {
            MOE_LOGE("%s: an added token lacks a string \"content\" or a valid \"id\"", tok->label);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        struct added_src src = {content, strlen(content), (uint8_t)tok_jbool(e, "special", 0),
                                (uint8_t)tok_jbool(e, "lstrip", 0), (uint8_t)tok_jbool(e, "rstrip", 0),
                                (uint8_t)tok_jbool(e, "single_word", 0), (uint8_t)tok_jbool(e, "normalized", 1)};
        if (src.len == 0) continue;
        if (src.special && tok_smap_get(special_set, src.content, src.len) < 0) {
            const char *k = tok_arena_dup(&tok->arena, src.content, src.len);
            if (!k || !tok_smap_put(special_set, k, src.len, 1)) {
                st = MOE_ERR_NOMEM;
                goto fail;
            }
        }
        /* an identical token already in added_tokens_map_r is ignored; equal content
         * means it sits at the id the content already has */
        int32_t id = tok_smap_get(&tok->added_map, src.content, src.len);
        if (id >= 0 && slot_of[id] >= 0 && same_added(&tok->added[slot_of[id]], &src)) continue;
        if (id < 0) id = tok_vocab_lookup(tok, src.content, src.len);
        if (id < 0) {
            int32_t vs = (int32_t)tok->n_model;
            id = max_added < 0 ? vs : ((max_added >= vs || vs == 0) ? max_added + 1 : vs);
        }
        if ((size_t)id >= id_bound) { /* cannot happen: ids grow by one per token */
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        const char *c = tok_arena_dup(&tok->arena, src.content, src.len);
        if (!c || !tok_smap_put(&tok->added_map, c, src.len, id)) {
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

/* tok_pat_cmp: order matcher patterns by first byte, then longest first. */
int tok_pat_cmp(const void *x, const void *y) {
    const struct amatch_pat *a = x, *b = y;
    unsigned ca = (unsigned char)a->s[0], cb = (unsigned char)b->s[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return memcmp(a->s, b->s, a->len);
}

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
    const cJSON *single = tok_jget(j, "single"), *specials = tok_jget(j, "special_tokens"), *it;
    if (!cJSON_IsArray(single)) {
        MOE_LOGE("%s: TemplateProcessing needs a \"single\" array", tok->label);
        return MOE_ERR_FORMAT;
    }
    struct ivec my_pre = {0}, my_suf = {0};
    enum moe_status st = MOE_OK;
    int seen_a = 0;
    cJSON_ArrayForEach(it, single) {
        const cJSON *seq = tok_jget(it, "Sequence"), *sp = tok_jget(it, "SpecialToken");
        if (seq) {
            const char *sid = tok_jstr(seq, "id");
            if (seen_a || !sid || strcmp(sid, "A") != 0) {
                MOE_LOGE("%s: TemplateProcessing: only single templates with one $A are supported", tok->label);
                st = MOE_ERR_UNSUPPORTED;
                goto fail;
            }
            seen_a = 1;
            continue;
        }
        const char *name = tok_jstr(sp, "id");
        const cJSON *def = name ? tok_jget(specials, name) : NULL, *ids = tok_jget(def, "ids"), *x;
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
    const cJSON *cls = tok_jget(j, "cls"), *sep = tok_jget(j, "sep");
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
    const char *type = tok_jtype(tok, j, "post_processor");
    if (!type) return MOE_ERR_FORMAT;
    if (!strcmp(type, "ByteLevel")) return MOE_OK; /* offsets only */
    if (!strcmp(type, "TemplateProcessing")) return post_template(tok, j, pre, suf);
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing"))
        return post_cls_sep(tok, j, pre, suf);
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr, *e;
        size_t n;
        enum moe_status st = tok_jkids(tok, j, "processors", "post_processor", &arr, &n);
        if (st != MOE_OK) return st;
        cJSON_ArrayForEach(e, arr) {
            if ((st = parse_post(tok, e, depth + 1, pre, suf)) != MOE_OK) return st;
        }
        return MOE_OK;
    }
    return tok_unsupported(tok, "post_processor", type);
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

/* tok_dec_token: the string decoding uses for an id (NULL if nothing maps to it). The
 * library decodes a `normalized` added token as its normalized form. */
const char *tok_dec_token(const struct moe_tokenizer *tok, int32_t id, size_t *len) {
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
        const char *s = tok_dec_token(tok, id, &len);
        tok->id_skip[id] = s && tok_smap_get(special_set, s, len) >= 0;
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
    const char *s = cJSON_IsString(v) ? v->valuestring : tok_jstr(v, "content");
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
    tok_bytelevel_map_init(&tok->bl);

    if (moe_utf8_bad_offset(json, len) != len) {
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
    if ((c = tok_jget(root, "normalizer")) && (st = tok_parse_normalizer(tok, c, 0, &tok->normalizer)) != MOE_OK)
        goto fail;
    if ((c = tok_jget(root, "pre_tokenizer")) && (st = tok_parse_pretok(tok, c, 0, &tok->pretok)) != MOE_OK) goto fail;
    if ((c = tok_jget(root, "decoder")) && (st = tok_parse_decoder(tok, c, 0, &tok->decoder)) != MOE_OK) goto fail;
    if ((c = tok_jget(root, "post_processor")) && (st = parse_post(tok, c, 0, &pre, &suf)) != MOE_OK) goto fail;
    tok->post_pre = pre.v;
    tok->n_post_pre = pre.n;
    tok->post_suf = suf.v;
    tok->n_post_suf = suf.n;
    pre.v = suf.v = NULL;
    if ((st = tok_build_matcher(tok, 0, &tok->raw_match)) != MOE_OK) goto fail;
    if ((st = tok_build_matcher(tok, 1, &tok->norm_match)) != MOE_OK) goto fail;
    mark_skipped(tok, &special_set);

    if (cfg_text) {
        cfg = cJSON_ParseWithLength(cfg_text, cfg_len);
        if (!cJSON_IsObject(cfg)) MOE_LOGW("%s: tokenizer_config.json is not a JSON object; ignored", tok->label);
    }
    pick_bos_eos(tok, cJSON_IsObject(cfg) ? cfg : NULL);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    tok_smap_free(&special_set);
    *out = tok;
    return MOE_OK;
fail:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    tok_smap_free(&special_set);
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
    tok_smap_free(&tok->vocab);
    tok_smap_free(&tok->added_map);
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
    tok_normalizer_free(tok->normalizer);
    tok_pretok_free(tok->pretok);
    tok_decoder_free(tok->decoder);
    free(tok->post_pre);
    free(tok->post_suf);
    tok_arena_free(&tok->arena);
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
    int32_t id = tok_smap_get(&tok->added_map, token, n);
    return id >= 0 ? id : tok_vocab_lookup(tok, token, n);
}

int32_t moe_tokenizer_bos(const struct moe_tokenizer *tok) { return tok ? tok->bos : -1; }

int32_t moe_tokenizer_eos(const struct moe_tokenizer *tok) { return tok ? tok->eos : -1; }

int moe_tokenizer_is_special(const struct moe_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_vocab) return 0;
    return tok->id_special[id];
}

/* ------------------------------------------------------------------------- */

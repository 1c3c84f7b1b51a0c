/*
 * tokenizer-components.c - tokenizer.json's normalizer, pre-tokenizer and decoder objects
 * parsed (and checked) into the component structs of tokenizer-impl.h.
 * tokenizer-impl.h says how the files fit together.
 */
#include "tokenizer-impl.h"

#include <limits.h>
#include <math.h>

/* JSON helpers. */

/* tok_jget: member `k` of object `o`, treating JSON null as absent. */
const cJSON *tok_jget(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

/* tok_jstr: the string value of member `k`, or NULL (absent, null or not a string). */
const char *tok_jstr(const cJSON *o, const char *k) {
    const cJSON *v = tok_jget(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* tok_jbool: the boolean member `k`, or dflt when absent or not a boolean. */
int tok_jbool(const cJSON *o, const char *k, int dflt) {
    const cJSON *v = tok_jget(o, k);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

/* jcount: a non-negative integer member `k` (dflt when absent); -1 if malformed. */
static long long jcount(const cJSON *o, const char *k, long long dflt) {
    const cJSON *v = tok_jget(o, k);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 1e15 ||
        floor(v->valuedouble) != v->valuedouble)
        return -1;
    return (long long)v->valuedouble;
}

/* jchar: member `k` as exactly one character. */
static enum moe_status jchar(const struct moe_tokenizer *tok, const cJSON *o, const char *k,
                             const char *what, int32_t *cp, char s[5], size_t *len) {
    const char *v = tok_jstr(o, k);
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
    const cJSON *p = tok_jget(o, k);
    const char *lit = tok_jstr(p, "String"), *rx = tok_jstr(p, "Regex");
    if (!lit && !rx) {
        MOE_LOGE("%s: %s: \"%s\" must be {\"String\": ...} or {\"Regex\": ...}", tok->label, what, k);
        return MOE_ERR_FORMAT;
    }
    const char *s = lit ? lit : rx;
    return tok_regex_compile(&tok->arena, s, strlen(s), lit != NULL, what, re);
}

/* tok_jtype: the "type" of a component object, or NULL with a logged error. */
const char *tok_jtype(const struct moe_tokenizer *tok, const cJSON *o, const char *what) {
    const char *t = tok_jstr(o, "type");
    if (!t) MOE_LOGE("%s: %s has no \"type\"", tok->label, what);
    return t;
}

/* tok_unsupported: log that a component type is not handled. */
enum moe_status tok_unsupported(const struct moe_tokenizer *tok, const char *what, const char *type) {
    MOE_LOGE("%s: %s type \"%s\" is not supported", tok->label, what, type);
    return MOE_ERR_UNSUPPORTED;
}

/* tok_jkids: the array member `k` of a Sequence component, checked. */
enum moe_status tok_jkids(const struct moe_tokenizer *tok, const cJSON *o, const char *k,
                             const char *what, const cJSON **arr, size_t *n) {
    *arr = tok_jget(o, k);
    if (!cJSON_IsArray(*arr)) {
        MOE_LOGE("%s: %s Sequence needs an array \"%s\"", tok->label, what, k);
        return MOE_ERR_FORMAT;
    }
    *n = (size_t)cJSON_GetArraySize(*arr);
    return MOE_OK;
}

/* ------------------------------------------------------------------------- */
/* Parsing and freeing the components. */

/* tok_normalizer_free: release a normalizer tree. */
void tok_normalizer_free(struct normalizer *nz) {
    if (!nz) return;
    for (size_t i = 0; i < nz->n_kids; i++) tok_normalizer_free(nz->kids[i]);
    free(nz->kids);
    tok_regex_free(&nz->re);
    free(nz);
}

/* tok_pretok_free: release a pre-tokenizer tree. */
void tok_pretok_free(struct pretok *pt) {
    if (!pt) return;
    for (size_t i = 0; i < pt->n_kids; i++) tok_pretok_free(pt->kids[i]);
    free(pt->kids);
    tok_regex_free(&pt->re);
    free(pt);
}

/* tok_decoder_free: release a decoder tree. */
void tok_decoder_free(struct decoder *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_kids; i++) tok_decoder_free(d->kids[i]);
    free(d->kids);
    tok_regex_free(&d->re);
    free(d);
}

/* tok_parse_normalizer: build a normalizer from its JSON object (recursive for Sequence). */
enum moe_status tok_parse_normalizer(struct moe_tokenizer *tok, const cJSON *j, int depth,
                                        struct normalizer **out) {
    static const char *what = "normalizer";
    *out = NULL;
    if (depth > MAX_DEPTH) {
        MOE_LOGE("%s: normalizers nested too deeply", tok->label);
        return MOE_ERR_FORMAT;
    }
    const char *type = tok_jtype(tok, j, what);
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
        nz->left = tok_jbool(j, "strip_left", 1);
        nz->right = tok_jbool(j, "strip_right", 1);
    } else if (!strcmp(type, "Prepend")) {
        nz->type = NZ_PREPEND;
        const char *p = tok_jstr(j, "prepend");
        if (!p) {
            MOE_LOGE("%s: Prepend normalizer needs a string \"prepend\"", tok->label);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        nz->str_len = strlen(p);
        if (!(nz->str = tok_arena_dup(&tok->arena, p, nz->str_len))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
    } else if (!strcmp(type, "Replace")) {
        nz->type = NZ_REPLACE;
        const char *content = tok_jstr(j, "content");
        if (!content) {
            MOE_LOGE("%s: Replace normalizer needs a string \"content\"", tok->label);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        nz->str_len = strlen(content);
        if (!(nz->str = tok_arena_dup(&tok->arena, content, nz->str_len))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
        if ((st = jpattern(tok, j, "pattern", "Replace normalizer", &nz->re)) != MOE_OK) goto fail;
    } else if (!strcmp(type, "Sequence")) {
        nz->type = NZ_SEQUENCE;
        const cJSON *arr;
        size_t n;
        if ((st = tok_jkids(tok, j, "normalizers", what, &arr, &n)) != MOE_OK) goto fail;
        if (n && !(nz->kids = calloc(n, sizeof *nz->kids))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) {
            if ((st = tok_parse_normalizer(tok, e, depth + 1, &nz->kids[nz->n_kids])) != MOE_OK) goto fail;
            nz->n_kids++;
        }
    } else {
        st = tok_unsupported(tok, what, type);
        goto fail;
    }
    *out = nz;
    return MOE_OK;
fail:
    tok_normalizer_free(nz);
    return st;
}

/* parse_behavior: a SplitDelimiterBehavior name ("Isolated", "merged_with_next", ...). */
static enum moe_status parse_behavior(const struct moe_tokenizer *tok, const cJSON *j,
                                      enum behavior dflt, enum behavior *out) {
    const char *b = tok_jstr(j, "behavior");
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
    const char *s = tok_jstr(j, "prepend_scheme");
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
    if (!tok_jbool(j, "add_prefix_space", 1)) {
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

/* tok_parse_pretok: build a pre-tokenizer from its JSON object (recursive for Sequence). */
enum moe_status tok_parse_pretok(struct moe_tokenizer *tok, const cJSON *j, int depth,
                                    struct pretok **out) {
    static const char *what = "pre_tokenizer";
    *out = NULL;
    if (depth > MAX_DEPTH) {
        MOE_LOGE("%s: pre-tokenizers nested too deeply", tok->label);
        return MOE_ERR_FORMAT;
    }
    const char *type = tok_jtype(tok, j, what);
    if (!type) return MOE_ERR_FORMAT;
    struct pretok *pt = calloc(1, sizeof *pt);
    if (!pt) return MOE_ERR_NOMEM;
    enum moe_status st = MOE_OK;
    if (!strcmp(type, "ByteLevel")) {
        pt->type = PT_BYTELEVEL;
        pt->add_prefix_space = tok_jbool(j, "add_prefix_space", 1);
        pt->use_regex = tok_jbool(j, "use_regex", 1);
        if (pt->use_regex &&
            (st = tok_regex_compile(&tok->arena, GPT2_PATTERN, strlen(GPT2_PATTERN), 0, "ByteLevel", &pt->re)) != MOE_OK)
            goto fail;
    } else if (!strcmp(type, "Split")) {
        pt->type = PT_SPLIT;
        pt->invert = tok_jbool(j, "invert", 0);
        if ((st = parse_behavior(tok, j, SB_ISOLATED, &pt->behavior)) != MOE_OK) goto fail;
        if (!tok_jstr(j, "behavior")) {
            MOE_LOGE("%s: Split pre-tokenizer needs a \"behavior\"", tok->label);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        if ((st = jpattern(tok, j, "pattern", "Split pre-tokenizer", &pt->re)) != MOE_OK) goto fail;
    } else if (!strcmp(type, "Metaspace")) {
        pt->type = PT_METASPACE;
        if ((st = jchar(tok, j, "replacement", "Metaspace", &pt->ch, pt->ch_s, &pt->ch_len)) != MOE_OK) goto fail;
        if ((st = parse_prepend_scheme(tok, j, &pt->prepend)) != MOE_OK) goto fail;
        pt->split = tok_jbool(j, "split", 1);
    } else if (!strcmp(type, "Whitespace")) {
        pt->type = PT_WHITESPACE;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        pt->type = PT_WHITESPACE_SPLIT;
    } else if (!strcmp(type, "BertPreTokenizer")) {
        pt->type = PT_BERT;
    } else if (!strcmp(type, "Digits")) {
        pt->type = PT_DIGITS;
        pt->individual = tok_jbool(j, "individual_digits", 0);
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
        if ((st = tok_jkids(tok, j, "pretokenizers", what, &arr, &n)) != MOE_OK) goto fail;
        if (n && !(pt->kids = calloc(n, sizeof *pt->kids))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) {
            if ((st = tok_parse_pretok(tok, e, depth + 1, &pt->kids[pt->n_kids])) != MOE_OK) goto fail;
            pt->n_kids++;
        }
    } else {
        st = tok_unsupported(tok, what, type);
        goto fail;
    }
    *out = pt;
    return MOE_OK;
fail:
    tok_pretok_free(pt);
    return st;
}

/* tok_parse_decoder: build a decoder from its JSON object (recursive for Sequence). */
enum moe_status tok_parse_decoder(struct moe_tokenizer *tok, const cJSON *j, int depth,
                                     struct decoder **out) {
    static const char *what = "decoder";
    *out = NULL;
    if (depth > MAX_DEPTH) {
        MOE_LOGE("%s: decoders nested too deeply", tok->label);
        return MOE_ERR_FORMAT;
    }
    const char *type = tok_jtype(tok, j, what);
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
        const char *content = tok_jstr(j, "content");
        if (!content) {
            MOE_LOGE("%s: Replace decoder needs a string \"content\"", tok->label);
            st = MOE_ERR_FORMAT;
            goto fail;
        }
        d->str_len = strlen(content);
        if (!(d->str = tok_arena_dup(&tok->arena, content, d->str_len))) {
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
        const char *suffix = tok_jstr(j, "suffix");
        if (!suffix) suffix = "</w>";
        d->str_len = strlen(suffix);
        if (!(d->str = tok_arena_dup(&tok->arena, suffix, d->str_len))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
    } else if (!strcmp(type, "Sequence")) {
        d->type = DEC_SEQUENCE;
        const cJSON *arr;
        size_t n;
        if ((st = tok_jkids(tok, j, "decoders", what, &arr, &n)) != MOE_OK) goto fail;
        if (n && !(d->kids = calloc(n, sizeof *d->kids))) {
            st = MOE_ERR_NOMEM;
            goto fail;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) {
            if ((st = tok_parse_decoder(tok, e, depth + 1, &d->kids[d->n_kids])) != MOE_OK) goto fail;
            d->n_kids++;
        }
    } else {
        st = tok_unsupported(tok, what, type);
        goto fail;
    }
    *out = d;
    return MOE_OK;
fail:
    tok_decoder_free(d);
    return st;
}

/* ------------------------------------------------------------------------- */

/*
 * gguf-vocab.c - a GGUF file's tokenizer metadata (tokenizer.ggml.*) as the
 * texts of a tokenizer.json and a tokenizer_config.json, so that the one
 * tokenizer implementation (tokenizer.c) runs it and a bundle can store it.
 *
 * What the texts say is what llama.cpp does with the same metadata
 * (src/llama-vocab.cpp):
 *
 *   "gpt2"  byte-level BPE: the merges as stored; the pre-tokenizer regexes
 *           llama.cpp applies for tokenizer.ggml.pre (one Split per regex,
 *           matches isolated, then the byte-to-unicode map); ignore_merges for
 *           the pre-tokenizers llama.cpp sets it for; no normalizer.
 *   "llama" SentencePiece BPE: llama.cpp repeatedly merges the adjacent pair
 *           whose concatenation is a token with the highest score, leftmost
 *           first among equal scores. As merges: every split of every token
 *           into two tokens, ranked by the token's score, equal scores at one
 *           rank (tokenizer.c takes the third element of a merge as its rank;
 *           equal ranks go leftmost first), so the two agree; spaces become
 *           "▁", a "▁" is prepended to the text and after every special token
 *           when tokenizer.ggml.add_space_prefix (default true); characters
 *           without a token fall back to <0xXX> byte tokens.
 *
 * Tokens of type control and unknown become special added tokens, type
 * user-defined non-special ones: both are matched in the raw text before the
 * model runs, as llama.cpp does when it parses special tokens. BOS / EOS are
 * added by a TemplateProcessing when tokenizer.ggml.add_bos_token /
 * add_eos_token say so (defaults: llama true / false; gpt2 false / false,
 * except BOS for the llama3 family of pre-tokenizers, as in llama.cpp).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-gguf-model.h"
#include "moe-base.h"

enum { TT_UNDEFINED = 0, TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* llama.cpp's regexes (its "adapted" forms: ASCII case classes instead of (?i:)). */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACT "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3 RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN35                                                                                               \
    RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!" \
                "\\S)|\\s+"
#define RE_GPT4O                                                                                                       \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RE_CONTRACT "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])" \
    "([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RE_CONTRACT "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* A pre-tokenizer of llama.cpp: the names it goes by, its regexes (NULL-ended;
 * NULL list = GPT-2's ByteLevel regex), whether merges are skipped for whole
 * words found in the vocabulary, and whether BOS is added by default. */
struct pre {
    const char *names;
    const char *re[8];
    int ignore_merges, add_bos;
};

static const struct pre k_pre[] = {
    {"|gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|mpt|olmo|jais|trillion|"
     "granite-docling|exaone4|jina-v1-en|jina-v2-code|roberta-bpe|",
     {NULL},
     0,
     0},
    {"|default|",
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL},
     0,
     0},
    {"|llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano|", {RE_LLAMA3, NULL}, 1, 1},
    {"|dbrx|smaug-bpe|", {RE_LLAMA3, NULL}, 0, 0},
    {"|chatglm-bpe|", {RE_LLAMA3, NULL}, 0, 0},
    {"|glm4|glm5|", {RE_LLAMA3, NULL}, 1, 0},
    {"|qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|stablelm2|hunyuan|solar-open|grok-2|", {RE_QWEN2, NULL}, 0, 0},
    {"|qwen35|", {RE_QWEN35, NULL}, 0, 0},
    {"|deepseek-llm|",
     {"[\r\n]",
      "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
      "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", "[一-龥ࠀ-一가-퟿]+", "\\p{N}+"},
     0,
     0},
    {"|deepseek-coder|", {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}", NULL}, 0, 0},
    {"|deepseek-v3|hunyuan-dense|joyai-llm|hy_v4|",
     {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
      "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
      NULL},
     0,
     0},
    {"|starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2|",
     {"\\p{N}", RE_GPT2, NULL},
     0,
     0},
    {"|falcon|", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL}, 0, 0},
    {"|gpt-4o|llama4|kanana2|talkie|minimax-m2|", {RE_GPT4O, NULL}, 0, 0},
    {"|seed-coder|",
     {RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL},
     0,
     0},
};

/* find_pre: the entry for a pre-tokenizer name, or NULL. */
static const struct pre *find_pre(const char *name) {
    char key[80];
    if (strlen(name) > 64) return NULL;
    snprintf(key, sizeof key, "|%s|", name);
    for (size_t i = 0; i < sizeof k_pre / sizeof k_pre[0]; i++)
        if (strstr(k_pre[i].names, key)) return &k_pre[i];
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* the vocabulary                                                             */

struct vocab {
    const char *path;
    size_t n;
    char **text;       /* [n] NUL-terminated token texts (owned) */
    size_t *len;
    int32_t *type;     /* [n] */
    float *score;      /* [n] */
    size_t cap;        /* hash table of ids by text */
    int32_t *slot;
};

/* FNV-1a of n bytes (the vocabulary hash table). */
static uint64_t hash_str(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* vocab_find: id of the n bytes at s, or -1. */
static int32_t vocab_find(const struct vocab *v, const char *s, size_t n) {
    for (size_t i = hash_str(s, n) & (v->cap - 1);; i = (i + 1) & (v->cap - 1)) {
        int32_t id = v->slot[i];
        if (id < 0) return -1;
        if (v->len[id] == n && !memcmp(v->text[id], s, n)) return id;
    }
}

/* Frees what vocab_load allocated (safe on a partly loaded vocab). */
static void vocab_free(struct vocab *v) {
    for (size_t i = 0; v->text && i < v->n; i++) free(v->text[i]);
    free(v->text);
    free(v->len);
    free(v->type);
    free(v->score);
    free(v->slot);
}

/* utf8_ok: strict UTF-8 without NUL (a token must survive as a JSON string). */
static int utf8_ok(const unsigned char *s, size_t n) {
    return !memchr(s, 0, n) && moe_utf8_bad_offset(s, n) == n;
}

/* num_array: a numeric array item of at least n elements of one of the two
 * allowed element types (NULL = absent). */
static enum moe_status num_array(const struct moe_gguf *g, const char *key, size_t n, enum moe_gguf_type t1,
                                 enum moe_gguf_type t2, const struct moe_gguf_kv **out) {
    const struct moe_gguf_kv *kv = moe_gguf_find_kv(g, key);
    *out = NULL;
    if (!kv) return MOE_OK;
    if (kv->type != MOE_GGUF_ARRAY || (kv->elem != t1 && kv->elem != t2) || kv->n < n) {
        MOE_LOGE("%s: %s must be an array of at least %zu %s (it is %s of %llu %s)", moe_gguf_path(g), key, n,
                 moe_gguf_type_name(t1), moe_gguf_type_name(kv->type), (unsigned long long)kv->n,
                 moe_gguf_type_name(kv->elem));
        return MOE_ERR_FORMAT;
    }
    *out = kv;
    return MOE_OK;
}

/* vocab_load: tokens, types and scores, checked: UTF-8 texts, unique (empty
 * ones get llama.cpp's "[EMPTY_i]" name), known types. */
static enum moe_status vocab_load(const struct moe_gguf *g, struct vocab *v) {
    const char *path = moe_gguf_path(g);
    const struct moe_gguf_kv *tk = moe_gguf_find_kv(g, "tokenizer.ggml.tokens"), *tt, *sc;
    enum moe_status st;
    if (!tk || tk->type != MOE_GGUF_ARRAY || tk->elem != MOE_GGUF_STRING || tk->n == 0 || tk->n > (1u << 30)) {
        MOE_LOGE("%s: tokenizer.ggml.tokens must be a non-empty array of strings", path);
        return MOE_ERR_FORMAT;
    }
    v->path = path;
    v->n = (size_t)tk->n;
    if ((st = num_array(g, "tokenizer.ggml.token_type", v->n, MOE_GGUF_I32, MOE_GGUF_I32, &tt))) return st;
    if ((st = num_array(g, "tokenizer.ggml.scores", v->n, MOE_GGUF_F32, MOE_GGUF_I32, &sc))) return st;
    v->cap = 16;
    while (v->cap < 2 * v->n) v->cap *= 2;
    v->text = calloc(v->n, sizeof *v->text);
    v->len = calloc(v->n, sizeof *v->len);
    v->type = calloc(v->n, sizeof *v->type);
    v->score = calloc(v->n, sizeof *v->score);
    v->slot = malloc(v->cap * sizeof *v->slot);
    if (!v->text || !v->len || !v->type || !v->score || !v->slot) return MOE_ERR_NOMEM;
    for (size_t i = 0; i < v->cap; i++) v->slot[i] = -1;
    for (size_t i = 0; i < v->n; i++) {
        struct moe_gguf_str s;
        moe_gguf_kv_str(tk, i, &s);
        char empty[32];
        if (s.n == 0) {
            snprintf(empty, sizeof empty, "[EMPTY_%zu]", i);
            s.p = empty, s.n = strlen(empty);
        }
        if (!utf8_ok((const unsigned char *)s.p, (size_t)s.n)) {
            MOE_LOGE("%s: token %zu is not valid UTF-8 (or holds a NUL byte)", path, i);
            return MOE_ERR_FORMAT;
        }
        if (!(v->text[i] = malloc((size_t)s.n + 1))) return MOE_ERR_NOMEM;
        memcpy(v->text[i], s.p, (size_t)s.n);
        v->text[i][s.n] = 0;
        v->len[i] = (size_t)s.n;
        int64_t t = TT_NORMAL;
        double f = 0;
        if (tt) moe_gguf_kv_int(tt, i, &t);
        if (sc) moe_gguf_kv_float(sc, i, &f);
        if (t < 0 || t > TT_BYTE || isnan(f)) {
            MOE_LOGE("%s: token %zu has %s %s", path, i, isnan(f) ? "score" : "type", isnan(f) ? "NaN" : "out of range");
            return MOE_ERR_FORMAT;
        }
        v->type[i] = (int32_t)t;
        v->score[i] = (float)f;
        size_t h = hash_str(v->text[i], v->len[i]) & (v->cap - 1);
        for (; v->slot[h] >= 0; h = (h + 1) & (v->cap - 1))
            if (v->len[v->slot[h]] == v->len[i] && !memcmp(v->text[v->slot[h]], v->text[i], v->len[i])) {
                MOE_LOGE("%s: tokens %d and %zu are both \"%.40s\"", path, v->slot[h], i, v->text[i]);
                return MOE_ERR_FORMAT;
            }
        v->slot[h] = (int32_t)i;
    }
    return MOE_OK;
}

/* ------------------------------------------------------------------------- */
/* merges                                                                     */

/* add_merge: ["a", "b"] or ["a", "b", rank] to the merges array. */
static int add_merge(cJSON *arr, const char *a, size_t na, const char *b, size_t nb, long rank) {
    char *x = malloc(na + 1), *y = malloc(nb + 1);
    cJSON *m = cJSON_CreateArray();
    int ok = x && y && m;
    if (ok) {
        memcpy(x, a, na), x[na] = 0;
        memcpy(y, b, nb), y[nb] = 0;
        cJSON_AddItemToArray(m, cJSON_CreateString(x));
        cJSON_AddItemToArray(m, cJSON_CreateString(y));
        if (rank >= 0) cJSON_AddItemToArray(m, cJSON_CreateNumber((double)rank));
        cJSON_AddItemToArray(arr, m);
    } else {
        cJSON_Delete(m);
    }
    free(x);
    free(y);
    return ok;
}

/* gpt2_merges: tokenizer.ggml.merges ("a b", split at the first space after
 * the first byte, as llama.cpp does). */
static enum moe_status gpt2_merges(const struct moe_gguf *g, cJSON *arr) {
    const char *path = moe_gguf_path(g);
    const struct moe_gguf_kv *kv = moe_gguf_find_kv(g, "tokenizer.ggml.merges");
    if (!kv || kv->type != MOE_GGUF_ARRAY || kv->elem != MOE_GGUF_STRING) {
        MOE_LOGE("%s: a gpt2 tokenizer needs tokenizer.ggml.merges (an array of strings)", path);
        return MOE_ERR_FORMAT;
    }
    for (uint64_t i = 0; i < kv->n; i++) {
        struct moe_gguf_str s;
        moe_gguf_kv_str(kv, i, &s);
        const char *sp = s.n > 1 ? memchr(s.p + 1, ' ', (size_t)s.n - 1) : NULL;
        if (!sp || !utf8_ok((const unsigned char *)s.p, (size_t)s.n)) {
            MOE_LOGE("%s: merge %llu is not two UTF-8 tokens separated by a space", path, (unsigned long long)i);
            return MOE_ERR_FORMAT;
        }
        size_t na = (size_t)(sp - s.p);
        if (!add_merge(arr, s.p, na, sp + 1, (size_t)s.n - na - 1, -1)) return MOE_ERR_NOMEM;
    }
    return MOE_OK;
}

struct cand {
    float score;
    int32_t id, left, right;
};

/* Highest score first; then the token, then the left part (a fixed order). */
static int cmp_cand(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->left < y->left ? -1 : x->left > y->left;
}

/* spm_merges: every split of every token into two tokens, ranked by the
 * score of the token (equal scores share a rank). */
static enum moe_status spm_merges(const struct vocab *v, cJSON *arr) {
    size_t n = 0, cap = v->n + 16;
    struct cand *c = malloc(cap * sizeof *c);
    if (!c) return MOE_ERR_NOMEM;
    for (size_t i = 0; i < v->n; i++) {
        const char *s = v->text[i];
        for (size_t k = 1; k < v->len[i]; k++) {
            if (((unsigned char)s[k] & 0xC0) == 0x80) continue; /* split between characters only */
            int32_t l = vocab_find(v, s, k), r = l >= 0 ? vocab_find(v, s + k, v->len[i] - k) : -1;
            if (r < 0) continue;
            if (n == cap) {
                struct cand *nc = realloc(c, 2 * cap * sizeof *c);
                if (!nc) {
                    free(c);
                    return MOE_ERR_NOMEM;
                }
                c = nc, cap *= 2;
            }
            c[n++] = (struct cand){v->score[i], (int32_t)i, l, r};
        }
    }
    qsort(c, n, sizeof *c, cmp_cand);
    long rank = -1;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || c[i].score != c[i - 1].score) rank++;
        if (!add_merge(arr, v->text[c[i].left], v->len[c[i].left], v->text[c[i].right], v->len[c[i].right], rank)) {
            free(c);
            return MOE_ERR_NOMEM;
        }
    }
    free(c);
    return MOE_OK;
}

/* ------------------------------------------------------------------------- */
/* the tokenizer.json object                                                  */

static cJSON *str_item(const char *type, const char *k1, const char *v1) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    if (k1) cJSON_AddStringToObject(o, k1, v1);
    return o;
}

/* replace_item: a Replace normalizer/decoder of one literal string. */
static cJSON *replace_item(const char *from, const char *to) {
    cJSON *o = str_item("Replace", NULL, NULL);
    cJSON *p = cJSON_AddObjectToObject(o, "pattern");
    cJSON_AddStringToObject(p, "String", from);
    cJSON_AddStringToObject(o, "content", to);
    return o;
}

/* pre_tokenizer: llama.cpp's splits for a gpt2 vocabulary. */
static cJSON *pre_tokenizer(const struct pre *pre) {
    cJSON *bl = str_item("ByteLevel", NULL, NULL);
    cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
    cJSON_AddBoolToObject(bl, "trim_offsets", 1);
    cJSON_AddBoolToObject(bl, "use_regex", pre->re[0] == NULL);
    if (!pre->re[0]) return bl;
    cJSON *seq = str_item("Sequence", NULL, NULL);
    cJSON *list = cJSON_AddArrayToObject(seq, "pretokenizers");
    for (int i = 0; pre->re[i]; i++) {
        cJSON *sp = str_item("Split", NULL, NULL);
        cJSON *pat = cJSON_AddObjectToObject(sp, "pattern");
        cJSON_AddStringToObject(pat, "Regex", pre->re[i]);
        cJSON_AddStringToObject(sp, "behavior", "Isolated");
        cJSON_AddBoolToObject(sp, "invert", 0);
        cJSON_AddItemToArray(list, sp);
    }
    cJSON_AddItemToArray(list, bl);
    return seq;
}

/* special_id: tokenizer.ggml.<key> as a token id inside the vocabulary, or -1. */
static int32_t special_id(const struct moe_gguf *g, const char *key, size_t n) {
    const struct moe_gguf_kv *kv = moe_gguf_find_kv(g, key);
    int64_t x;
    if (!kv || kv->type == MOE_GGUF_ARRAY || kv->type == MOE_GGUF_BOOL || !moe_gguf_kv_int(kv, 0, &x) || x < 0 ||
        (uint64_t)x >= n)
        return -1;
    return (int32_t)x;
}

/* flag: a bool key, or the default; -1 (logged) when it is not a bool. */
static int flag(const struct moe_gguf *g, const char *key, int dflt) {
    const struct moe_gguf_kv *kv = moe_gguf_find_kv(g, key);
    int64_t x;
    if (!kv) return dflt;
    if (kv->type == MOE_GGUF_BOOL && moe_gguf_kv_int(kv, 0, &x)) return (int)x;
    MOE_LOGE("%s: %s must be a bool (it is %s)", moe_gguf_path(g), key, moe_gguf_type_name(kv->type));
    return -1;
}

/* post_processor: BOS / EOS around the text, or NULL when neither is added. */
static cJSON *post_processor(const struct vocab *v, int32_t bos, int32_t eos) {
    if (bos < 0 && eos < 0) return NULL;
    cJSON *pp = str_item("TemplateProcessing", NULL, NULL), *single = cJSON_AddArrayToObject(pp, "single");
    cJSON *pair = cJSON_AddArrayToObject(pp, "pair"), *sp = cJSON_AddObjectToObject(pp, "special_tokens");
    const int32_t ids[2] = {bos, eos};
    for (int k = 0; k < 3; k++) {
        if (k == 1) { /* $A between the BOS and the EOS */
            cJSON *a = cJSON_CreateObject(), *s = cJSON_AddObjectToObject(a, "Sequence");
            cJSON_AddStringToObject(s, "id", "A");
            cJSON_AddNumberToObject(s, "type_id", 0);
            cJSON_AddItemToArray(single, a);
            cJSON_AddItemToArray(pair, cJSON_Duplicate(a, 1));
            continue;
        }
        int32_t id = ids[k ? 1 : 0];
        if (id < 0) continue;
        const char *t = v->text[id];
        cJSON *e = cJSON_CreateObject(), *s = cJSON_AddObjectToObject(e, "SpecialToken");
        cJSON_AddStringToObject(s, "id", t);
        cJSON_AddNumberToObject(s, "type_id", 0);
        cJSON_AddItemToArray(single, e);
        cJSON_AddItemToArray(pair, cJSON_Duplicate(e, 1));
        if (!cJSON_GetObjectItemCaseSensitive(sp, t)) {
            cJSON *d = cJSON_AddObjectToObject(sp, t), *il = cJSON_AddArrayToObject(d, "ids");
            cJSON *tl = cJSON_AddArrayToObject(d, "tokens");
            cJSON_AddStringToObject(d, "id", t);
            cJSON_AddItemToArray(il, cJSON_CreateNumber(id));
            cJSON_AddItemToArray(tl, cJSON_CreateString(t));
        }
    }
    return pp;
}

/* added_tokens: control / unknown (special) and user-defined tokens. */
static cJSON *added_tokens(const struct vocab *v) {
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < v->n; i++) {
        int t = v->type[i];
        if (t != TT_CONTROL && t != TT_UNKNOWN && t != TT_USER) continue;
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", (double)i);
        cJSON_AddStringToObject(a, "content", v->text[i]);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", t != TT_USER);
        cJSON_AddItemToArray(arr, a);
    }
    return arr;
}

/* tokenizer_config: bos_token / eos_token (null when there is none). */
static char *tokenizer_config(const struct vocab *v, int32_t bos, int32_t eos) {
    cJSON *c = cJSON_CreateObject();
    if (bos >= 0)
        cJSON_AddStringToObject(c, "bos_token", v->text[bos]);
    else
        cJSON_AddNullToObject(c, "bos_token");
    if (eos >= 0)
        cJSON_AddStringToObject(c, "eos_token", v->text[eos]);
    else
        cJSON_AddNullToObject(c, "eos_token");
    char *s = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    return s;
}

enum moe_status moe_gguf_vocab_texts(const struct moe_gguf *g, char **tokenizer_json, char **tokenizer_config_json) {
    const char *path = moe_gguf_path(g);
    *tokenizer_json = *tokenizer_config_json = NULL;
    const struct moe_gguf_kv *mk = moe_gguf_find_kv(g, "tokenizer.ggml.model");
    struct moe_gguf_str ms;
    if (!mk) return MOE_ERR_NOT_FOUND;
    if (mk->type != MOE_GGUF_STRING || !moe_gguf_kv_str(mk, 0, &ms)) {
        MOE_LOGE("%s: tokenizer.ggml.model must be a string", path);
        return MOE_ERR_FORMAT;
    }
    const int spm = ms.n == 5 && !memcmp(ms.p, "llama", 5), bpe = ms.n == 4 && !memcmp(ms.p, "gpt2", 4);
    if (ms.n == 4 && !memcmp(ms.p, "none", 4)) return MOE_ERR_NOT_FOUND;
    if (!spm && !bpe) {
        MOE_LOGE("%s: tokenizer model \"%.*s\" is not supported (gpt2 BPE and llama SentencePiece are)", path,
                 (int)(ms.n > 32 ? 32 : ms.n), ms.p);
        return MOE_ERR_UNSUPPORTED;
    }
    const struct pre *pre = NULL;
    if (bpe) {
        char name[80] = "default";
        const struct moe_gguf_kv *pk = moe_gguf_find_kv(g, "tokenizer.ggml.pre");
        struct moe_gguf_str ps;
        int ok = 1;
        if (pk) {
            ok = pk->type == MOE_GGUF_STRING && moe_gguf_kv_str(pk, 0, &ps) && ps.n < sizeof name &&
                 !memchr(ps.p, 0, (size_t)ps.n);
            if (ok) memcpy(name, ps.p, (size_t)ps.n), name[ps.n] = 0;
        }
        if (!ok || !(pre = find_pre(name))) {
            MOE_LOGE("%s: pre-tokenizer \"%.64s\" (tokenizer.ggml.pre) is not supported", path, name);
            return MOE_ERR_UNSUPPORTED;
        }
    }
    struct vocab v = {0};
    cJSON *root = NULL;
    enum moe_status st = vocab_load(g, &v);
    if (st) goto done;
    st = MOE_ERR_NOMEM;
    root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON_AddItemToObject(root, "added_tokens", added_tokens(&v));
    const int space_prefix = spm ? flag(g, "tokenizer.ggml.add_space_prefix", 1) : 0;
    const int add_bos = flag(g, "tokenizer.ggml.add_bos_token", spm ? 1 : pre->add_bos);
    const int add_eos = flag(g, "tokenizer.ggml.add_eos_token", 0);
    if (space_prefix < 0 || add_bos < 0 || add_eos < 0) {
        st = MOE_ERR_FORMAT;
        goto done;
    }
    if (spm) {
        cJSON *nz = replace_item(" ", "\xe2\x96\x81");
        if (space_prefix) {
            cJSON *seq = str_item("Sequence", NULL, NULL), *l = cJSON_AddArrayToObject(seq, "normalizers");
            cJSON_AddItemToArray(l, str_item("Prepend", "prepend", "\xe2\x96\x81"));
            cJSON_AddItemToArray(l, nz);
            nz = seq;
        }
        cJSON_AddItemToObject(root, "normalizer", nz);
        cJSON_AddNullToObject(root, "pre_tokenizer");
    } else {
        cJSON_AddNullToObject(root, "normalizer");
        cJSON_AddItemToObject(root, "pre_tokenizer", pre_tokenizer(pre));
    }
    int32_t bos = special_id(g, "tokenizer.ggml.bos_token_id", v.n), eos = special_id(g, "tokenizer.ggml.eos_token_id", v.n);
    cJSON *pp = post_processor(&v, add_bos ? bos : -1, add_eos ? eos : -1);
    if (pp)
        cJSON_AddItemToObject(root, "post_processor", pp);
    else
        cJSON_AddNullToObject(root, "post_processor");
    cJSON *dec;
    if (spm) {
        dec = str_item("Sequence", NULL, NULL);
        cJSON *l = cJSON_AddArrayToObject(dec, "decoders");
        cJSON_AddItemToArray(l, replace_item("\xe2\x96\x81", " "));
        cJSON_AddItemToArray(l, str_item("ByteFallback", NULL, NULL));
        cJSON_AddItemToArray(l, str_item("Fuse", NULL, NULL));
        if (space_prefix) {
            cJSON *s = str_item("Strip", "content", " ");
            cJSON_AddNumberToObject(s, "start", 1);
            cJSON_AddNumberToObject(s, "stop", 0);
            cJSON_AddItemToArray(l, s);
        }
    } else {
        dec = str_item("ByteLevel", NULL, NULL);
        cJSON_AddBoolToObject(dec, "add_prefix_space", 0);
        cJSON_AddBoolToObject(dec, "trim_offsets", 1);
        cJSON_AddBoolToObject(dec, "use_regex", 1);
    }
    cJSON_AddItemToObject(root, "decoder", dec);
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    int32_t unk = special_id(g, "tokenizer.ggml.unknown_token_id", v.n);
    for (size_t i = 0; spm && unk < 0 && i < v.n; i++)
        if (v.type[i] == TT_UNKNOWN) unk = (int32_t)i;
    if (spm && unk >= 0)
        cJSON_AddStringToObject(model, "unk_token", v.text[unk]);
    else
        cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddBoolToObject(model, "fuse_unk", spm);
    cJSON_AddBoolToObject(model, "byte_fallback", spm);
    cJSON_AddBoolToObject(model, "ignore_merges", bpe && pre->ignore_merges);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (size_t i = 0; vocab && i < v.n; i++) cJSON_AddItemToObject(vocab, v.text[i], cJSON_CreateNumber((double)i));
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    if (!merges || !vocab) goto done;
    if ((st = spm ? spm_merges(&v, merges) : gpt2_merges(g, merges))) goto done;
    st = MOE_ERR_NOMEM;
    if (!(*tokenizer_json = cJSON_PrintUnformatted(root))) goto done;
    if (!(*tokenizer_config_json = tokenizer_config(&v, bos, eos))) goto done;
    st = MOE_OK;
done:
    if (st) {
        free(*tokenizer_json);
        *tokenizer_json = NULL;
        if (st == MOE_ERR_NOMEM) MOE_LOGE("%s: out of memory building the tokenizer", path);
    }
    cJSON_Delete(root);
    vocab_free(&v);
    return st;
}

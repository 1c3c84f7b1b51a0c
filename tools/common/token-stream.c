/* token-stream.c - datasets as token streams (token-stream.h). */
#include "token-stream.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe-status.h"

/* The largest text read at once (the dataset reader's max_bytes cap). */
#define TEXT_MAX_BYTES ((size_t)1 << 31)

/* moe_text_load: see token-stream.h. */
enum moe_status moe_text_load(const char *spec, const struct moe_dataset_params *params, char **text,
                                   size_t *len) {
    struct moe_dataset_params p = params ? *params : moe_dataset_default_params();
    if (p.max_bytes <= 0 || p.max_bytes > (int64_t)TEXT_MAX_BYTES) p.max_bytes = (int64_t)TEXT_MAX_BYTES;
    enum moe_status st = moe_dataset_read_text(spec, &p, text, len);
    if (st) return st;
    if (*len == 0) {
        MOE_LOGE("%s: the dataset is empty", spec);
        free(*text);
        *text = NULL;
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* moe_text_bos: see token-stream.h. Asks the post-processor itself (encode "a" with
 * and without special tokens) rather than trusting bos_token alone: OLMoE
 * names a bos_token that its template never adds. */
int32_t moe_text_bos(const struct moe_tokenizer *tok) {
    int32_t bos = tok ? moe_tokenizer_bos(tok) : -1, *plain = NULL, *special = NULL;
    size_t n_plain = 0, n_special = 0;
    if (bos < 0) return -1;
    int adds = moe_tokenizer_encode(tok, "a", 1, 0, &plain, &n_plain) == MOE_OK &&
               moe_tokenizer_encode(tok, "a", 1, 1, &special, &n_special) == MOE_OK &&
               n_special > n_plain && special[0] == bos;
    free(plain);
    free(special);
    return adds ? bos : -1;
}

/* encode_stream: [BOS] + ids of text without special tokens. */
static enum moe_status encode_stream(const struct moe_tokenizer *tok, const char *text, size_t len,
                                     int32_t **ids, size_t *n_ids) {
    int32_t bos = moe_text_bos(tok), *t = NULL;
    size_t n = 0;
    enum moe_status st = moe_tokenizer_encode(tok, text, len, 0, &t, &n);
    if (st) return st;
    if (bos >= 0) {
        int32_t *b = realloc(t, sizeof(int32_t) * (n + 1));
        if (!b) {
            free(t);
            return MOE_ERR_NOMEM;
        }
        memmove(b + 1, b, sizeof(int32_t) * n);
        b[0] = bos;
        t = b;
        n++;
    }
    *ids = t;
    *n_ids = n;
    return MOE_OK;
}

/* moe_text_tokenize: see token-stream.h. */
enum moe_status moe_text_tokenize(const struct moe_model *model, const struct moe_model *ref,
                                  const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!model->tok) {
        MOE_LOGE("%s has no tokenizer; eval needs one to tokenize the dataset", model->path);
        return MOE_ERR_INVALID;
    }
    if (ref && ref->cfg.n_vocab != model->cfg.n_vocab) {
        MOE_LOGE("vocabulary sizes differ: %s has %d tokens, the reference %s has %d; "
                 "KL divergence needs the same vocabulary", model->path, model->cfg.n_vocab,
                 ref->path, ref->cfg.n_vocab);
        return MOE_ERR_INVALID;
    }
    int32_t *rids = NULL;
    size_t n_rids = 0;
    enum moe_status st = encode_stream(model->tok, text, len, ids, n_ids);
    if (st || !ref || !ref->tok) return st;
    if ((st = encode_stream(ref->tok, text, len, &rids, &n_rids))) goto fail;
    size_t i = 0;
    while (i < n_rids && i < *n_ids && rids[i] == (*ids)[i]) i++;
    if (i < n_rids || i < *n_ids) {
        MOE_LOGE("the tokenizers of %s and the reference %s differ (%zu vs %zu tokens, first "
                 "difference at token %zu)", model->path, ref->path, *n_ids, n_rids, i);
        st = MOE_ERR_INVALID;
        goto fail;
    }
    free(rids);
    return MOE_OK;
fail:
    free(rids);
    free(*ids);
    *ids = NULL;
    *n_ids = 0;
    return st;
}

enum moe_status moe_text_load_tokens(const struct moe_model *model, const struct moe_model *ref, const char *spec,
                                     const struct moe_dataset_params *dp, size_t need, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    struct moe_dataset_params p = dp ? *dp : moe_dataset_default_params();
    const int64_t cap = p.max_bytes; /* a limit the caller set itself, if any */
    int64_t bound = need ? (int64_t)(64 << 10) + 16 * (int64_t)need : 0;
    for (;;) {
        char *text = NULL;
        size_t len = 0;
        p.max_bytes = bound && (!cap || bound < cap) ? bound : cap;
        enum moe_status st = moe_text_load(spec, &p, &text, &len);
        if (!st) st = moe_text_tokenize(model, ref, text, len, ids, n);
        free(text);
        /* done: the whole text (no bound, or it ended before the bound), or enough tokens */
        int whole = !p.max_bytes || (int64_t)len < p.max_bytes || p.max_bytes == cap;
        if (st || whole || *n >= need + MOE_TEXT_TOKEN_MARGIN) return st;
        free(*ids);
        *ids = NULL;
        *n = 0;
        bound = bound > INT64_MAX / 4 ? INT64_MAX : bound * 4;
    }
}

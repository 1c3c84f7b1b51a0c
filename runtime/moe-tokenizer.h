/*
 * moe-tokenizer.h - Hugging Face `tokenizer.json` tokenizers in C.
 *
 * Supports the two BPE families used by MoE checkpoints:
 *   - byte-level BPE (GPT-2 style byte-to-unicode map; Qwen, OLMoE), with the
 *     pre-tokenizer Split regexes run through PCRE2;
 *   - SentencePiece-style BPE with byte fallback (Llama/Mixtral, Phi-MoE):
 *     "▁" space replacement / Metaspace, <0xXX> byte tokens for unknown chars.
 * Added tokens (special or not) are matched before the model runs; the
 * post-processor template decides BOS/EOS. Normalizers NFC/NFKC/NFD, Lowercase,
 * Prepend, Replace and Sequence are applied as the tokenizers library does.
 *
 * Thread-safety: a loaded tokenizer is immutable; encode/decode may run
 * concurrently from several threads.
 */
#ifndef MOE_TOKENIZER_H
#define MOE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_tokenizer;

/* moe_tokenizer_load: load `path`, which is either a tokenizer.json file or a
 * directory containing one. Fails loudly (MOE_ERR_FORMAT) if the model type is
 * unsupported or no merges load. */
enum moe_status moe_tokenizer_load(const char *path, struct moe_tokenizer **out);

/* moe_tokenizer_load_json: same, from a JSON text of `len` bytes in memory. */
enum moe_status moe_tokenizer_load_json(const char *json, size_t len, const char *label,
                                        struct moe_tokenizer **out);

/* moe_tokenizer_free: NULL is a no-op. */
void moe_tokenizer_free(struct moe_tokenizer *tok);

/* moe_tokenizer_encode: tokenize `len` bytes of UTF-8 `text`. With
 * add_special != 0 the post-processor's special tokens (e.g. BOS) are added,
 * as `tokenizer(text)` does in transformers. *ids is malloc'd; caller frees.
 * Invalid UTF-8 is replaced by U+FFFD as Rust's from_utf8_lossy would. */
enum moe_status moe_tokenizer_encode(const struct moe_tokenizer *tok, const char *text, size_t len,
                                     int add_special, int32_t **ids, size_t *n_ids);

/* moe_tokenizer_decode: ids -> UTF-8 text (malloc'd, NUL-terminated). With
 * skip_special != 0 special added tokens are left out. Bytes that do not form
 * valid UTF-8 are kept as they are (the caller prints them). */
enum moe_status moe_tokenizer_decode(const struct moe_tokenizer *tok, const int32_t *ids, size_t n,
                                     int skip_special, char **out, size_t *out_len);

/* moe_tokenizer_n_vocab: number of ids (model vocab plus added tokens). */
int32_t moe_tokenizer_n_vocab(const struct moe_tokenizer *tok);

/* moe_tokenizer_token: the vocabulary string of an id (borrowed), NULL if out of range. */
const char *moe_tokenizer_token(const struct moe_tokenizer *tok, int32_t id);

/* moe_tokenizer_find: id of an exact vocabulary / added-token string, or -1. */
int32_t moe_tokenizer_find(const struct moe_tokenizer *tok, const char *token);

/* moe_tokenizer_bos / eos: ids from the post-processor or well-known names, -1 if none. */
int32_t moe_tokenizer_bos(const struct moe_tokenizer *tok);
int32_t moe_tokenizer_eos(const struct moe_tokenizer *tok);

/* moe_tokenizer_is_special: 1 if id is a special added token. */
int moe_tokenizer_is_special(const struct moe_tokenizer *tok, int32_t id);

#ifdef __cplusplus
}
#endif
#endif

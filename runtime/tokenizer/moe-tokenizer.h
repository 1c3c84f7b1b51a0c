/*
 * moe-tokenizer.h - Hugging Face `tokenizer.json` tokenizers in C.
 *
 * Supports the two BPE families used by MoE checkpoints:
 *   - byte-level BPE (GPT-2 style byte-to-unicode map; Qwen, OLMoE), with the
 *     pre-tokenizer Split regexes run through PCRE2;
 *   - SentencePiece-style BPE with byte fallback (Llama/Mixtral, Phi-MoE):
 *     "▁" space replacement / Metaspace, <0xXX> byte tokens for unknown chars.
 * Added tokens (special or not) are matched before the model runs; the
 * post-processor template decides BOS/EOS. Normalizers NFC/NFKC/NFD/NFKD, Lowercase,
 * Prepend, Replace, Strip, StripAccents and Sequence are applied as the tokenizers
 * library does; so are the pre-tokenizers ByteLevel, Split, Metaspace, Whitespace,
 * WhitespaceSplit, Digits, Punctuation, CharDelimiterSplit, BertPreTokenizer and
 * Sequence, and the decoders ByteLevel, Metaspace, Replace, ByteFallback, Fuse,
 * Strip, BPEDecoder and Sequence. Only the BPE model is supported. One
 * extension: a merge may be written ["a", "b", rank] to give merges equal
 * ranks (equal ranks merge leftmost first), which is how a GGUF SentencePiece
 * vocabulary's scores are expressed (moe_gguf_vocab_texts, moe-gguf-model.h).
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
 * directory containing one. A tokenizer_config.json in the same directory, if any,
 * supplies bos_token/eos_token. Fails loudly, with a logged message naming the
 * problem: MOE_ERR_UNSUPPORTED for a model type other than BPE or a component type
 * we do not implement; MOE_ERR_FORMAT for malformed JSON, merges that name tokens
 * missing from the vocab, or a vocab of more than 256 entries with no merges. */
enum moe_status moe_tokenizer_load(const char *path, struct moe_tokenizer **out);

/* moe_tokenizer_load_json: same, from a JSON text of `len` bytes in memory (no
 * tokenizer_config.json; `label` names it in log messages). */
enum moe_status moe_tokenizer_load_json(const char *json, size_t len, const char *label,
                                        struct moe_tokenizer **out);

/* moe_tokenizer_load_texts: from the texts of tokenizer.json and (optional,
 * NULL) tokenizer_config.json, e.g. as stored in a bundle's metadata. */
enum moe_status moe_tokenizer_load_texts(const char *json, size_t len, const char *config_json,
                                         size_t config_len, const char *label, struct moe_tokenizer **out);

/* moe_tokenizer_free: NULL is a no-op. */
void moe_tokenizer_free(struct moe_tokenizer *tok);

/* moe_tokenizer_encode: tokenize `len` bytes of UTF-8 `text`. With
 * add_special != 0 the post-processor's special tokens (e.g. BOS) are added,
 * as `tokenizer(text)` does in transformers. *ids is malloc'd; caller frees.
 * Invalid UTF-8 is replaced by U+FFFD as Rust's from_utf8_lossy would. */
enum moe_status moe_tokenizer_encode(const struct moe_tokenizer *tok, const char *text, size_t len,
                                     int add_special, int32_t **ids, size_t *n_ids);

/* moe_tokenizer_decode: ids -> UTF-8 text (malloc'd, NUL-terminated). With
 * skip_special != 0 special added tokens are left out; ids outside the vocabulary
 * are skipped, as the tokenizers library does. Bytes that do not form valid UTF-8
 * (a partial character from ByteLevel or <0xXX> tokens) are kept as they are
 * instead of becoming U+FFFD, so that decoding a stream piecewise and joining the
 * pieces gives the whole text; the caller prints them. out_len may be NULL. */
enum moe_status moe_tokenizer_decode(const struct moe_tokenizer *tok, const int32_t *ids, size_t n,
                                     int skip_special, char **out, size_t *out_len);

/* moe_tokenizer_n_vocab: number of ids (model vocab plus added tokens): the largest
 * id + 1, so every id encode returns is below it. */
int32_t moe_tokenizer_n_vocab(const struct moe_tokenizer *tok);

/* moe_tokenizer_token: the vocabulary string of an id (an added token's content as
 * written), borrowed until moe_tokenizer_free; NULL if out of range or unused. */
const char *moe_tokenizer_token(const struct moe_tokenizer *tok, int32_t id);

/* moe_tokenizer_find: id of an exact vocabulary / added-token string, or -1. */
int32_t moe_tokenizer_find(const struct moe_tokenizer *tok, const char *token);

/* moe_tokenizer_bos / eos: ids from tokenizer_config.json's bos_token/eos_token (null
 * there means none), else the post-processor (first id before $A / last after it),
 * else well-known names (<s>, <|begin_of_text|>, <bos> / </s>, <|endoftext|>,
 * <|end_of_text|>, <eos>); -1 if none. */
int32_t moe_tokenizer_bos(const struct moe_tokenizer *tok);
int32_t moe_tokenizer_eos(const struct moe_tokenizer *tok);

/* moe_tokenizer_is_special: 1 if id is a special added token. */
int moe_tokenizer_is_special(const struct moe_tokenizer *tok, int32_t id);

#ifdef __cplusplus
}
#endif
#endif

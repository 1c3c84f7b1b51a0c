/*
 * token-stream.h - a dataset as the token stream the stages score and
 * profile: eval, profile, sensitivity, bitwidth and plan all read text and
 * tokenize it here, so none of them includes another stage's header.
 *
 * The stream is the text tokenized once without special tokens, after a BOS
 * if the tokenizer's post-processor adds one (llama-perplexity tokenizes with
 * BOS, so its stream starts the same way).
 *
 * Models are only read; the functions keep no state (thread-safe).
 */
#ifndef MOE_TOKEN_STREAM_H
#define MOE_TOKEN_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "moe-dataset.h"
#include "moe-model.h"
#include "moe-status.h"
#include "moe-tokenizer.h"

/* moe_text_load: the dataset named by a dataset spec (a card, or a file
 * with a format and fields; see docs/cli.md, "Datasets") as one UTF-8 text, records
 * joined by a blank line. *text is malloc'd and NUL-terminated; caller frees.
 * An empty dataset is an error (MOE_ERR_INVALID); errors are logged. */
enum moe_status moe_text_load(const char *spec, const struct moe_dataset_params *params, char **text,
                                   size_t *len);

/* moe_text_bos: the id the tokenizer's post-processor puts first (its BOS), or
 * -1 if it adds none (e.g. Qwen, OLMoE) or tok is NULL. */
int32_t moe_text_bos(const struct moe_tokenizer *tok);

/* moe_text_tokenize: the token stream of `text` (see above)
 * with model's tokenizer. With ref != NULL, first checks that the vocabulary
 * sizes agree and, if ref has a tokenizer, that its stream is identical; both
 * failures are logged (sizes, or where the streams part) and return
 * MOE_ERR_INVALID. A model without a tokenizer is MOE_ERR_INVALID too.
 * *ids is malloc'd; caller frees. */
enum moe_status moe_text_tokenize(const struct moe_model *model, const struct moe_model *ref,
                                  const char *text, size_t len, int32_t **ids, size_t *n_ids);

/* moe_text_load_tokens: the token stream of dataset `spec` for `model`, as
 * moe_text_tokenize gives it ([BOS] + ids; ref may be NULL, see there), read
 * only as far as `need` tokens require (0 = the whole dataset). The text is
 * read in growing prefixes (64 KiB + 16 bytes per needed token, then x4, each
 * cut by the dataset reader's max_bytes) until it tokenizes to at least
 * need + MOE_TEXT_TOKEN_MARGIN tokens or the dataset ends, so memory follows
 * what was asked for (--max-chunks, --max-tokens), not the file's size. The
 * prefix's seam lies at least the margin after the last needed token, so the
 * first `need` ids are those of the whole text for any tokenizer whose
 * pre-tokenizer splits within that distance (all supported ones, on text).
 * *n may exceed need; *ids is malloc'd (caller frees). Errors are logged. */
#define MOE_TEXT_TOKEN_MARGIN 4096
enum moe_status moe_text_load_tokens(const struct moe_model *model, const struct moe_model *ref, const char *spec,
                                     const struct moe_dataset_params *dp, size_t need, int32_t **ids, size_t *n);

#endif

/*
 * moe-gguf-model.h - a llama.cpp GGUF file seen as a Hugging Face checkpoint.
 *
 * The runtime describes models by transformers' config.json fields and binds
 * weights by transformers' tensor names (model.c). A GGUF file carries the
 * same model under llama.cpp's metadata keys ("{arch}.block_count", ...) and
 * tensor names ("blk.N.attn_q.weight", merged "ffn_*_exps", ...). This module
 * translates, once, at open:
 *
 *   - the metadata into the text of an equivalent config.json, which the one
 *     config parser (moe_config_parse) then validates like any other - so a
 *     bundle written from a GGUF stores that text as its hf.config.json;
 *   - the tokenizer metadata (tokenizer.ggml.*) into the text of an
 *     equivalent tokenizer.json and tokenizer_config.json (moe_gguf_vocab_texts);
 *   - every non-expert tensor into a view under its transformers name and
 *     shape; where llama.cpp's converter changed the layout, it is undone into
 *     a buffer this module owns: the rows of Llama-architecture (Mixtral) q/k
 *     projections are put back from llama.cpp's rope order (the inverse of
 *     convert_hf_to_gguf's permute), and DeepSeek's kv_b_proj is rebuilt from
 *     the split, transposed attn_k_b / attn_v_b;
 *   - routed experts, asked for one at a time: views into the merged
 *     ffn_{gate,up,down}_exps tensors (or the per-expert tensors of older
 *     Mixtral files) in their stored types, without a copy, plus gpt-oss's
 *     expert biases as a float block this module owns.
 *
 * Architectures (general.architecture): llama with experts (Mixtral),
 * qwen2moe, qwen3moe, olmoe, phimoe, deepseek2 (DeepSeek-V2 with softmax
 * gating, V3 with sigmoid gating) and gpt-oss. docs/format.md ("GGUF input")
 * lists the keys read, their defaults where llama.cpp hard-codes a value,
 * and what a GGUF cannot express.
 *
 * Ownership: the view borrows the moe_gguf handle (which must outlive it) and
 * owns the texts, the table and the rebuilt buffers. Thread-safety: open and
 * moe_gguf_model_expert are not thread-safe (the model loader calls them once,
 * on one thread); find may run concurrently.
 */
#ifndef MOE_GGUF_MODEL_H
#define MOE_GGUF_MODEL_H

#include <stdint.h>

#include "moe-gguf.h"
#include "moe-model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor under its transformers name, in transformers' shape order. */
struct moe_gguf_hf_tensor {
    const char *name;     /* e.g. "model.layers.0.self_attn.q_proj.weight" */
    const char *gguf_name; /* where it comes from ("blk.0.attn_q.weight"; for a rebuilt
                            * kv_b_proj the attn_k_b name) */
    const void *data;     /* in the map, or a buffer the view owns */
    enum moe_qtype type;
    int n_dims;
    int64_t shape[4];     /* outermost first, as torch */
    uint64_t nbytes;      /* bytes at data: what the shape and type need (the reader
                           * checked each stored tensor's extent against the file) */
};

struct moe_gguf_model;

/* moe_gguf_model_open: translate an open GGUF. MOE_ERR_UNSUPPORTED (logged)
 * for an architecture or a feature not handled; MOE_ERR_FORMAT /
 * MOE_ERR_NOT_FOUND for missing or malformed keys and tensors. */
enum moe_status moe_gguf_model_open(const struct moe_gguf *g, struct moe_gguf_model **out);

/* moe_gguf_model_free: NULL is a no-op. */
void moe_gguf_model_free(struct moe_gguf_model *v);

/* The texts: config.json (always), tokenizer.json and tokenizer_config.json
 * (NULL when the file has no tokenizer.ggml.tokens). Borrowed. */
const char *moe_gguf_model_config_json(const struct moe_gguf_model *v);
const char *moe_gguf_model_tokenizer_json(const struct moe_gguf_model *v);
const char *moe_gguf_model_tokenizer_config_json(const struct moe_gguf_model *v);

/* moe_gguf_model_find: a non-expert tensor by its transformers name; NULL if
 * the file has none. */
const struct moe_gguf_hf_tensor *moe_gguf_model_find(const struct moe_gguf_model *v, const char *hf_name);

/* moe_gguf_model_count / _at: every tensor of the table, sorted by name. */
size_t moe_gguf_model_count(const struct moe_gguf_model *v);
const struct moe_gguf_hf_tensor *moe_gguf_model_at(const struct moe_gguf_model *v, size_t i);

/* moe_gguf_model_expert: routed expert (layer, expert) as views of its gate,
 * up and down matrices (checked against the config's shapes) and, when
 * c->expert_bias, its biases (gate | up | down floats, owned by the view).
 * MOE_ERR_NOT_FOUND / MOE_ERR_SHAPE (logged) when the tensors are missing or
 * of the wrong shape. */
enum moe_status moe_gguf_model_expert(struct moe_gguf_model *v, const struct moe_config *c, int layer, int expert,
                                      struct moe_ffn *out);

/* moe_gguf_vocab_texts: the tokenizer metadata of a GGUF as the texts of a
 * tokenizer.json and a tokenizer_config.json (malloc'd; caller frees):
 * tokenizer.ggml.model "gpt2" (byte-level BPE with tokenizer.ggml.merges and
 * the pre-tokenizer regexes llama.cpp uses for tokenizer.ggml.pre) or "llama"
 * (SentencePiece BPE: merges derived from tokenizer.ggml.scores, pieces of
 * equal score at equal rank, byte fallback, "▁" for spaces). Control,
 * user-defined and unknown tokens become added tokens. MOE_ERR_NOT_FOUND when
 * the file has no tokenizer, MOE_ERR_UNSUPPORTED for another tokenizer model
 * or an unknown pre-tokenizer, MOE_ERR_FORMAT for malformed arrays (all
 * logged). */
enum moe_status moe_gguf_vocab_texts(const struct moe_gguf *g, char **tokenizer_json, char **tokenizer_config_json);

#ifdef __cplusplus
}
#endif
#endif

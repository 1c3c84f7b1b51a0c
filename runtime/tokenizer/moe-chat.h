/*
 * moe-chat.h - chat templates: a model's Jinja chat template rendered for a
 * list of messages exactly as transformers' `apply_chat_template` renders it
 * (byte for byte), by a small Jinja interpreter of the subset real chat
 * templates use (runtime/tokenizer/chat-jinja-*.c).
 *
 * The environment is transformers': trim_blocks and lstrip_blocks on, a single
 * trailing newline of the template dropped, the globals raise_exception,
 * strftime_now, namespace, dict and range, the loop controls break and
 * continue, `{% generation %}` blocks rendered as their body, and tojson as
 * json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=). The
 * template sees `messages`, `add_generation_prompt`, `bos_token`, `eos_token`
 * (and `tools` / `documents`, none), plus any extra variables the caller
 * gives. Undefined values behave as Jinja's default Undefined: falsy, empty
 * when printed, an error when an attribute of them is taken or they are added
 * to a string.
 *
 * Errors name the construct and its place: a syntax error or an unsupported
 * tag, filter or test is reported by moe_chat_template_parse ("line 3:14:
 * unsupported tag 'include'"); a construct reached at render time that the
 * interpreter cannot run (an unsupported method or filter), raise_exception and
 * exceeded limits are reported by the render call. Every failure is logged
 * (moe_log) unless the caller asked for the message in a buffer.
 *
 * Limits, so that hostile templates end in an error, never a crash or a hang:
 * templates up to 4 MiB, nesting (blocks, expressions, macro calls) up to 256
 * deep, range() up to 100000 items (as Jinja's sandbox), 64 MiB of output and
 * 256 MiB of working memory per render, and 50 million evaluation steps.
 *
 * Thread-safety: a parsed template is immutable; it may be rendered from
 * several threads at once.
 */
#ifndef MOE_CHAT_H
#define MOE_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One message of a conversation. content NULL: the message has no content
 * key (transformers drops keys whose value is None). */
struct moe_chat_message {
    const char *role;
    const char *content;
};

struct moe_chat_template;

/* moe_chat_template_parse: parse a template from its source text. bos_token /
 * eos_token: the tokenizer's special-token strings the template may print (NULL:
 * the tokenizer has none, so the name is undefined in the template, as in
 * transformers: `{{ bos_token }}` prints "", `bos_token + x` is an error). MOE_ERR_FORMAT for a syntax error (unterminated tag, string or block,
 * unexpected token), MOE_ERR_UNSUPPORTED for a tag, filter or test this
 * interpreter does not run, MOE_ERR_RANGE for a template over the limits; each
 * logged with line:col. *out is freed with moe_chat_template_free. */
enum moe_status moe_chat_template_parse(const char *source, const char *bos_token, const char *eos_token,
                                        struct moe_chat_template **out);

/* moe_chat_template_load: the chat template of a model, for a checkpoint
 * directory (chat_template.jinja, else tokenizer_config.json's "chat_template":
 * a string, or a list of {"name", "template"} of which "default" is used, else
 * chat_template.json), a GGUF file (tokenizer.chat_template), or a .moeb bundle
 * (the hf.chat_template.jinja or hf.tokenizer_config.json text moe-prep
 * quantize copied into it). bos/eos strings come from the same source
 * (tokenizer_config.json's bos_token / eos_token, a GGUF's token ids).
 * override: NULL, the name of a built-in template (moe_chat_builtin_names) or
 * the path of a template file (Jinja text, or a JSON object with a
 * "chat_template" member such as a tokenizer_config.json); with an override,
 * model_path may be NULL (then bos/eos are ""). MOE_ERR_NOT_FOUND, logged with
 * the hint to pass --chat-template, when the model has no template and no
 * override is given; the parse errors above otherwise. */
enum moe_status moe_chat_template_load(const char *model_path, const char *override,
                                       struct moe_chat_template **out);

/* moe_chat_render: render the conversation msgs[0..n_msgs). add_generation_prompt
 * as in transformers (append the header of an assistant turn). *out is a
 * malloc'd NUL-terminated string the caller frees. MOE_ERR_INVALID when the
 * template raised an exception (the message is the template's, e.g.
 * "Conversation roles must alternate user/assistant/..."), MOE_ERR_UNSUPPORTED
 * for a construct the interpreter cannot run, MOE_ERR_RANGE for a limit,
 * MOE_ERR_FORMAT for a type error (e.g. a string added to a number). */
enum moe_status moe_chat_render(const struct moe_chat_template *t, const struct moe_chat_message *msgs,
                                size_t n_msgs, int add_generation_prompt, char **out);

/* Options of moe_chat_render_json; moe_chat_render_default_params() gives the
 * defaults (no generation prompt, the current time, no extra variables, errors
 * logged). */
struct moe_chat_render_params {
    int add_generation_prompt;
    int64_t now;            /* seconds since the epoch strftime_now formats (local time); < 0: now */
    const char *extra_json; /* NULL or a JSON object whose members become template variables,
                               e.g. {"enable_thinking": false} or {"tools": [...]} */
    char *err;              /* NULL, or a buffer that receives the error message instead of the log */
    size_t err_size;
};
struct moe_chat_render_params moe_chat_render_default_params(void);

/* moe_chat_render_json: render an OpenAI-style `messages` array given as JSON
 * text (each message an object; every member is visible to the template, e.g.
 * content as a string or a list of parts, tool_calls, reasoning_content;
 * members whose value is null are dropped as transformers drops them).
 * MOE_ERR_FORMAT, with a message, when the text is not a JSON array of objects
 * or extra_json is not a JSON object; the render errors above otherwise. */
enum moe_status moe_chat_render_json(const struct moe_chat_template *t, const char *messages_json,
                                     const struct moe_chat_render_params *p, char **out);

/* moe_chat_template_stops: the strings that end an assistant turn: the eos
 * token and the end-of-turn markers the template writes after a message
 * ("<|im_end|>", "<|end|>", "<|eot_id|>", "<|end_of_text|>", "</s>",
 * "<｜end▁of▁sentence｜>", "<end_of_turn>"; gpt-oss: "<|return|>" and
 * "<|call|>", not its "<|end|>", which also closes the analysis channel before
 * the final answer). A NULL-terminated array owned by t. */
const char *const *moe_chat_template_stops(const struct moe_chat_template *t);

/* moe_chat_template_source: the template's source text, owned by t. */
const char *moe_chat_template_source(const struct moe_chat_template *t);

/* moe_chat_builtin_names: the built-in templates an override may name
 * ("chatml", "llama3", "mistral", "phi3", "tulu", ...), NULL-terminated. */
const char *const *moe_chat_builtin_names(void);

/* moe_chat_template_free: NULL is a no-op. */
void moe_chat_template_free(struct moe_chat_template *t);

#ifdef __cplusplus
}
#endif
#endif

/*
 * chat-template.c - moe-chat.h: a model's chat template found, parsed once
 * and rendered for conversations by the Jinja interpreter
 * (chat-jinja-impl.h), with transformers' variables and environment.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chat-jinja-impl.h"
#include "moe-base.h"
#include "moe-bundle.h"
#include "moe-chat.h"
#include "moe-gguf.h"
#include "moe-mmap.h"

struct moe_chat_template {
    struct jarena ar; /* the parse tree and the strings below */
    struct jnode *root;
    char *source;
    char *bos, *eos;  /* NULL: the tokenizer has none (undefined in the template) */
    const char *stops[16];
};

/* ---- built-in templates ----------------------------------------------------- */

static const struct {
    const char *name, *source;
} k_builtins[] = {
    {"chatml", "{%- for message in messages %}\n"
               "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
               "{%- endfor %}\n"
               "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"},
    {"deepseek", "{{- bos_token }}\n"
                 "{%- for message in messages %}\n"
                 "{%- if message['role'] == 'system' %}{{- message['content'] + '\\n\\n' }}\n"
                 "{%- elif message['role'] == 'user' %}{{- 'User: ' + message['content'] + '\\n\\n' }}\n"
                 "{%- else %}{{- 'Assistant: ' + message['content'] + eos_token }}{%- endif %}\n"
                 "{%- endfor %}\n"
                 "{%- if add_generation_prompt %}{{- 'Assistant:' }}{%- endif %}\n"},
    {"llama3", "{{- bos_token }}\n"
               "{%- for message in messages %}\n"
               "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n"
               "{%- endfor %}\n"
               "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}\n"},
    {"mistral", "{%- if messages and messages[0]['role'] == 'system' %}\n"
                "{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}\n"
                "{%- else %}{%- set loop_messages = messages %}{%- endif %}\n"
                "{{- bos_token }}\n"
                "{%- for message in loop_messages %}\n"
                "{%- if message['role'] == 'user' %}\n"
                "{%- if loop.first and system_message is defined %}"
                "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
                "{%- else %}{{- '[INST] ' + message['content'] + ' [/INST]' }}{%- endif %}\n"
                "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}{%- endif %}\n"
                "{%- endfor %}\n"},
    {"phi3", "{%- for message in messages %}\n"
             "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}\n"
             "{%- endfor %}\n"
             "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}\n"},
    {"tulu", "{{- bos_token }}\n"
             "{%- for message in messages %}\n"
             "{%- if message['role'] == 'assistant' %}{{- '<|assistant|>\\n' + message['content'] + eos_token + '\\n' }}\n"
             "{%- else %}{{- '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}{%- endif %}\n"
             "{%- endfor %}\n"
             "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}\n"},
};
#define N_BUILTINS (sizeof k_builtins / sizeof k_builtins[0])

const char *const *moe_chat_builtin_names(void) {
    static const char *names[N_BUILTINS + 1];
    for (size_t i = 0; i < N_BUILTINS; i++) names[i] = k_builtins[i].name;
    names[N_BUILTINS] = NULL;
    return names;
}

/* ---- parse -------------------------------------------------------------- */

/* set_stops: the eos token and the end-of-turn markers the template writes. */
static void set_stops(struct moe_chat_template *t) {
    static const char *const markers[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|end_of_text|>",
                                          "</s>", "<｜end▁of▁sentence｜>", "<end_of_turn>", "<|END_OF_TURN_TOKEN|>",
                                          "<|return|>", "<|call|>", NULL};
    const int harmony = strstr(t->source, "<|channel|>") != NULL; /* gpt-oss: <|end|> also closes the analysis */
    size_t n = 0;
    if (t->eos && t->eos[0]) t->stops[n++] = t->eos;
    for (int i = 0; markers[i] && n < 15; i++) {
        if (!strstr(t->source, markers[i]) || (harmony && !strcmp(markers[i], "<|end|>"))) continue;
        int dup = 0;
        for (size_t k = 0; k < n; k++) dup |= !strcmp(t->stops[k], markers[i]);
        if (!dup) t->stops[n++] = markers[i];
    }
    t->stops[n] = NULL;
}

enum moe_status moe_chat_template_parse(const char *source, const char *bos_token, const char *eos_token,
                                        struct moe_chat_template **out) {
    *out = NULL;
    if (!source) return MOE_ERR_INVALID;
    struct moe_chat_template *t = calloc(1, sizeof *t);
    if (!t) return MOE_ERR_NOMEM;
    const size_t len = strlen(source);
    t->source = ja_strdup(&t->ar, source, len);
    t->bos = bos_token ? ja_strdup(&t->ar, bos_token, strlen(bos_token)) : NULL;
    t->eos = eos_token ? ja_strdup(&t->ar, eos_token, strlen(eos_token)) : NULL;
    if (!t->source || (bos_token && !t->bos) || (eos_token && !t->eos)) {
        moe_chat_template_free(t);
        return MOE_ERR_NOMEM;
    }
    char err[512];
    int rc = jj_parse(source, len, &t->ar, &t->root, err, sizeof err);
    if (rc) {
        MOE_LOGE("chat template: %s", err[0] ? err : moe_status_str((enum moe_status)rc));
        moe_chat_template_free(t);
        return (enum moe_status)rc;
    }
    set_stops(t);
    *out = t;
    return MOE_OK;
}

void moe_chat_template_free(struct moe_chat_template *t) {
    if (!t) return;
    ja_free(&t->ar);
    free(t);
}

const char *const *moe_chat_template_stops(const struct moe_chat_template *t) { return t->stops; }
const char *moe_chat_template_source(const struct moe_chat_template *t) { return t->source; }

/* ---- render ------------------------------------------------------------- */

struct moe_chat_render_params moe_chat_render_default_params(void) {
    struct moe_chat_render_params p = {0, -1, NULL, NULL, 0};
    return p;
}

static jv cstr(struct jarena *a, const char *s) { return jv_str(a, s, strlen(s)); }

/* render_vars: transformers' variables (messages, tools, documents,
 * add_generation_prompt, the special tokens), then the extra ones. */
static enum moe_status render_with(const struct moe_chat_template *t, jv messages, const struct moe_chat_render_params *p,
                                   struct jarena *ar, char **out) {
    struct jvar vars[64];
    size_t nv = 0;
    char err[512] = "", jmsg[256];
    enum moe_status st = MOE_OK;
    jv none = {JV_NONE, 0, {0}}, agp = {JV_BOOL, 0, {0}};
    agp.u.b = p->add_generation_prompt != 0;
    vars[nv++] = (struct jvar){"messages", messages};
    vars[nv++] = (struct jvar){"tools", none};
    vars[nv++] = (struct jvar){"documents", none};
    vars[nv++] = (struct jvar){"add_generation_prompt", agp};
    if (t->bos) vars[nv++] = (struct jvar){"bos_token", cstr(ar, t->bos)};
    if (t->eos) vars[nv++] = (struct jvar){"eos_token", cstr(ar, t->eos)};
    if (p->extra_json) {
        jv x;
        int rc = jj_from_json(ar, p->extra_json, strlen(p->extra_json), &x, jmsg, sizeof jmsg);
        if (rc == -2) st = MOE_ERR_NOMEM;
        else if (rc || x.t != JV_DICT) {
            snprintf(err, sizeof err, "the extra template variables are not a JSON object%s%s", rc ? ": " : "", rc ? jmsg : "");
            st = MOE_ERR_FORMAT;
        } else {
            for (size_t i = 0; i < x.u.d->n && nv < 64; i++) {
                const jv *k = &x.u.d->k[i];
                vars[nv++] = (struct jvar){ja_strdup(ar, k->u.s.p, k->u.s.n), x.u.d->v[i]};
            }
        }
    }
    if (ar->full && !st) st = MOE_ERR_NOMEM;
    if (!st) {
        size_t len;
        st = (enum moe_status)jj_render(t->root, ar, vars, nv, p->now, out, &len, err, sizeof err);
    }
    if (st) {
        if (!err[0]) snprintf(err, sizeof err, "%s", moe_status_str(st));
        if (p->err && p->err_size) snprintf(p->err, p->err_size, "%s", err);
        else MOE_LOGE("chat template: %s", err);
    }
    return st;
}

enum moe_status moe_chat_render(const struct moe_chat_template *t, const struct moe_chat_message *msgs, size_t n_msgs,
                                int add_generation_prompt, char **out) {
    struct moe_chat_render_params p = moe_chat_render_default_params();
    p.add_generation_prompt = add_generation_prompt;
    struct jarena ar = {0};
    ar.limit = JJ_MAX_ARENA;
    jv list = jv_new_list(&ar);
    for (size_t i = 0; i < n_msgs && list.u.l; i++) {
        jv m = jv_new_dict(&ar);
        if (msgs[i].role) jv_dict_set(&ar, &m, cstr(&ar, "role"), cstr(&ar, msgs[i].role));
        if (msgs[i].content) jv_dict_set(&ar, &m, cstr(&ar, "content"), cstr(&ar, msgs[i].content));
        jv_list_push(&ar, &list, m);
    }
    enum moe_status st = ar.full || !list.u.l ? MOE_ERR_NOMEM : render_with(t, list, &p, &ar, out);
    ja_free(&ar);
    return st;
}

/* alias_reasoning: transformers' _alias_reasoning_fields: a message with
 * reasoning_content, thinking or reasoning gets `thinking` first and
 * `reasoning_content` last (gpt-oss templates read the one, others the other). */
static int alias_reasoning(struct jarena *ar, jv *m) {
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    jv r;
    int found = 0;
    for (int i = 0; i < 3 && !found; i++) found = jv_dict_get(m, fields[i], &r) && r.t != JV_NONE;
    if (!found) return 0;
    jv d = jv_new_dict(ar);
    if (jv_dict_set(ar, &d, cstr(ar, "thinking"), r)) return -1;
    for (size_t i = 0; i < m->u.d->n; i++)
        if (jv_dict_set(ar, &d, m->u.d->k[i], m->u.d->v[i])) return -1;
    if (jv_dict_set(ar, &d, cstr(ar, "reasoning_content"), r)) return -1;
    *m = d;
    return 0;
}

enum moe_status moe_chat_render_json(const struct moe_chat_template *t, const char *messages_json,
                                     const struct moe_chat_render_params *p, char **out) {
    struct moe_chat_render_params dp = moe_chat_render_default_params();
    if (!p) p = &dp;
    struct jarena ar = {0};
    ar.limit = JJ_MAX_ARENA;
    jv msgs;
    char msg[256], err[320];
    enum moe_status st = MOE_OK;
    int rc = jj_from_json(&ar, messages_json, strlen(messages_json), &msgs, msg, sizeof msg);
    if (rc == -2) st = MOE_ERR_NOMEM, snprintf(err, sizeof err, "out of memory reading the messages");
    else if (rc) st = MOE_ERR_FORMAT, snprintf(err, sizeof err, "the messages are not valid JSON: %s", msg);
    else if (msgs.t != JV_LIST) st = MOE_ERR_FORMAT, snprintf(err, sizeof err, "the messages must be a JSON array of objects");
    for (size_t i = 0; !st && i < msgs.u.l->n; i++) {
        jv *m = &msgs.u.l->v[i];
        if (m->t != JV_DICT) {
            st = MOE_ERR_FORMAT;
            snprintf(err, sizeof err, "message %zu is not a JSON object", i);
            break;
        }
        jv d = jv_new_dict(&ar); /* members whose value is null are dropped, as transformers drops them */
        for (size_t k = 0; d.u.d && k < m->u.d->n; k++)
            if (m->u.d->v[k].t != JV_NONE && jv_dict_set(&ar, &d, m->u.d->k[k], m->u.d->v[k])) break;
        *m = d;
        if (ar.full || alias_reasoning(&ar, m)) st = MOE_ERR_NOMEM, snprintf(err, sizeof err, "out of memory");
    }
    if (st) {
        if (p->err && p->err_size) snprintf(p->err, p->err_size, "%s", err);
        else MOE_LOGE("chat template: %s", err);
    } else {
        st = render_with(t, msgs, p, &ar, out);
    }
    ja_free(&ar);
    return st;
}

/* ---- load --------------------------------------------------------------- */

/* what a model gives: the template text and the special-token strings (malloc'd) */
struct found {
    char *source, *bos, *eos;
    char where[320];
};

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) memcpy(p, s, n), p[n] = 0;
    return p;
}

/* token_str: a tokenizer_config.json special token: a string or {"content": ...}. */
static char *token_str(const cJSON *j) {
    if (cJSON_IsString(j)) return dup_n(j->valuestring, strlen(j->valuestring));
    const cJSON *c = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "content") : NULL;
    return cJSON_IsString(c) ? dup_n(c->valuestring, strlen(c->valuestring)) : NULL;
}

/* from_config: tokenizer_config.json (or chat_template.json) text: bos/eos
 * and "chat_template" (a string, or a list of {name, template}: "default"). */
static enum moe_status from_config(const char *text, const char *label, struct found *f, int tokens) {
    cJSON *j = cJSON_Parse(text);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        MOE_LOGE("chat template: %s is not a JSON object", label);
        return MOE_ERR_FORMAT;
    }
    if (tokens) {
        f->bos = token_str(cJSON_GetObjectItemCaseSensitive(j, "bos_token"));
        f->eos = token_str(cJSON_GetObjectItemCaseSensitive(j, "eos_token"));
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    enum moe_status st = MOE_OK;
    if (!f->source && cJSON_IsString(ct)) {
        f->source = dup_n(ct->valuestring, strlen(ct->valuestring));
        snprintf(f->where, sizeof f->where, "%s: chat_template", label);
    } else if (!f->source && cJSON_IsArray(ct)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name"), *tx = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(nm) && cJSON_IsString(tx) && !strcmp(nm->valuestring, "default")) {
                f->source = dup_n(tx->valuestring, strlen(tx->valuestring));
                snprintf(f->where, sizeof f->where, "%s: chat_template \"default\"", label);
            }
        }
        if (!f->source) {
            MOE_LOGE("chat template: %s lists chat templates but none named \"default\"", label);
            st = MOE_ERR_NOT_FOUND;
        }
    } else if (ct && !cJSON_IsNull(ct) && !f->source) {
        MOE_LOGE("chat template: %s: chat_template is neither a string nor a list", label);
        st = MOE_ERR_FORMAT;
    }
    cJSON_Delete(j);
    return st;
}

static enum moe_status read_text(const char *dir, const char *name, char **out) {
    char *path = moe_path_join(dir, name);
    struct stat sb;
    size_t len;
    enum moe_status st = MOE_ERR_NOT_FOUND;
    *out = NULL;
    if (!path) return MOE_ERR_NOMEM;
    if (stat(path, &sb) == 0) st = moe_read_file(path, 64u << 20, out, &len);
    free(path);
    return st;
}

static enum moe_status from_dir(const char *dir, struct found *f) {
    char *text = NULL;
    enum moe_status st;
    if ((st = read_text(dir, "chat_template.jinja", &f->source)) == MOE_OK)
        snprintf(f->where, sizeof f->where, "%s/chat_template.jinja", dir);
    else if (st != MOE_ERR_NOT_FOUND) return st;
    char label[300];
    if ((st = read_text(dir, "tokenizer_config.json", &text)) == MOE_OK) {
        snprintf(label, sizeof label, "%s/tokenizer_config.json", dir);
        st = from_config(text, label, f, 1);
        free(text);
        if (st) return st;
    } else if (st != MOE_ERR_NOT_FOUND) {
        return st;
    }
    if (!f->source && (st = read_text(dir, "chat_template.json", &text)) == MOE_OK) {
        snprintf(label, sizeof label, "%s/chat_template.json", dir);
        st = from_config(text, label, f, 0);
        free(text);
        if (st) return st;
    }
    return MOE_OK;
}

static char *gguf_token(const struct moe_gguf *g, const char *id_key) {
    const struct moe_gguf_kv *id = moe_gguf_find_kv(g, id_key), *toks = moe_gguf_find_kv(g, "tokenizer.ggml.tokens");
    int64_t i;
    struct moe_gguf_str s;
    if (!id || !toks || !moe_gguf_kv_int(id, 0, &i) || i < 0 || !moe_gguf_kv_str(toks, (uint64_t)i, &s)) return NULL;
    return dup_n(s.p, (size_t)s.n);
}

static enum moe_status from_gguf(const char *path, struct found *f) {
    struct moe_gguf *g = NULL;
    enum moe_status st = moe_gguf_open(path, &g);
    if (st) return st;
    const struct moe_gguf_kv *kv = moe_gguf_find_kv(g, "tokenizer.chat_template");
    struct moe_gguf_str s;
    if (kv && moe_gguf_kv_str(kv, 0, &s)) {
        f->source = dup_n(s.p, (size_t)s.n);
        snprintf(f->where, sizeof f->where, "%s: tokenizer.chat_template", path);
    }
    f->bos = gguf_token(g, "tokenizer.ggml.bos_token_id");
    f->eos = gguf_token(g, "tokenizer.ggml.eos_token_id");
    moe_gguf_free(g);
    return MOE_OK;
}

static enum moe_status from_bundle(const char *path, struct found *f) {
    struct moe_bundle *b = NULL;
    enum moe_status st = moe_bundle_open(path, &b);
    if (st) return st;
    const char *jinja = moe_bundle_meta_str(b, "hf.chat_template.jinja"), *cfg = moe_bundle_meta_str(b, "hf.tokenizer_config.json");
    if (jinja) {
        f->source = dup_n(jinja, strlen(jinja));
        snprintf(f->where, sizeof f->where, "%s: hf.chat_template.jinja", path);
    }
    char label[300];
    snprintf(label, sizeof label, "%s: hf.tokenizer_config.json", path);
    if (cfg) st = from_config(cfg, label, f, 1);
    moe_bundle_free(b);
    return st;
}

static enum moe_status from_override(const char *ov, struct found *f) {
    for (size_t i = 0; i < N_BUILTINS; i++)
        if (!strcmp(ov, k_builtins[i].name)) {
            free(f->source);
            f->source = dup_n(k_builtins[i].source, strlen(k_builtins[i].source));
            snprintf(f->where, sizeof f->where, "the built-in template %s", ov);
            return f->source ? MOE_OK : MOE_ERR_NOMEM;
        }
    char *text = NULL;
    size_t len;
    struct stat sb;
    if (stat(ov, &sb) != 0) {
        char names[256] = "";
        for (size_t i = 0; i < N_BUILTINS; i++) {
            strcat(names, i ? ", " : "");
            strcat(names, k_builtins[i].name);
        }
        MOE_LOGE("chat template: %s is neither a built-in template (%s) nor a file", ov, names);
        return MOE_ERR_NOT_FOUND;
    }
    enum moe_status st = moe_read_file(ov, JJ_MAX_SOURCE, &text, &len);
    if (st) return st;
    free(f->source);
    f->source = NULL;
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r')) i++;
    cJSON *j = i < len && text[i] == '{' ? cJSON_Parse(text) : NULL;
    if (j && cJSON_IsObject(j) && cJSON_GetObjectItemCaseSensitive(j, "chat_template")) { /* a tokenizer_config.json */
        cJSON_Delete(j);
        st = from_config(text, ov, f, 0);
        free(text);
        if (!st && !f->source) {
            MOE_LOGE("chat template: %s has no chat_template", ov);
            st = MOE_ERR_NOT_FOUND;
        }
        return st;
    }
    cJSON_Delete(j);
    f->source = text;
    snprintf(f->where, sizeof f->where, "%s", ov);
    return MOE_OK;
}

enum moe_status moe_chat_template_load(const char *model_path, const char *override, struct moe_chat_template **out) {
    struct found f = {NULL, NULL, NULL, ""};
    enum moe_status st = MOE_OK;
    *out = NULL;
    if (!model_path && !override) return MOE_ERR_INVALID;
    if (model_path) {
        if (moe_is_dir(model_path)) st = from_dir(model_path, &f);
        else if (moe_gguf_is_gguf_file(model_path)) st = from_gguf(model_path, &f);
        else st = from_bundle(model_path, &f);
    }
    if (!st && override) st = from_override(override, &f);
    if (!st && !f.source) {
        char names[256] = "";
        for (size_t i = 0; i < N_BUILTINS; i++) {
            strcat(names, i ? ", " : "");
            strcat(names, k_builtins[i].name);
        }
        MOE_LOGE("chat template: %s has no chat template (tokenizer_config.json chat_template, chat_template.jinja, "
                 "a GGUF's tokenizer.chat_template or a bundle's copy of them); pass --chat-template NAME|FILE "
                 "(built-in: %s)", model_path, names);
        st = MOE_ERR_NOT_FOUND;
    }
    if (!st) {
        st = moe_chat_template_parse(f.source, f.bos, f.eos, out);
        if (st) MOE_LOGE("chat template: the template is from %s", f.where);
    }
    free(f.source), free(f.bos), free(f.eos);
    return st;
}

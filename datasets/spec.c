/*
 * spec.c - dataset specs: the one-string grammar users type (docs/cli.md ("Datasets")),
 * dataset cards (datasets/cards/<name>.json) and the field-selection lists.
 * Parsing a spec reads a card when one is named, but never the data file.
 */
#define _DEFAULT_SOURCE /* realpath */
#include "dataset-impl.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe-file.h"
#include "moe-mmap.h"

#define CARD_MAX_BYTES (1u << 20)

static const char *const g_format_names[] = {"text", "jsonl", "json", "csv", "tsv"};

/* The spec keyword of a format, for messages and --json output. */
const char *moe_dataset_format_name(enum moe_dataset_format f) {
    if ((unsigned)f < sizeof g_format_names / sizeof *g_format_names) return g_format_names[f];
    return "?";
}

/* Map the n bytes at s to a format keyword; 0 if they name none. */
static int format_from_name(const char *s, size_t n, enum moe_dataset_format *f) {
    for (size_t i = 0; i < sizeof g_format_names / sizeof *g_format_names; i++) {
        if (strlen(g_format_names[i]) == n && !memcmp(s, g_format_names[i], n)) {
            *f = (enum moe_dataset_format)i;
            return 1;
        }
    }
    return 0;
}

/* malloc'd copy of n bytes + NUL (NULL when out of memory). */
static char *xstrndup(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* Release a spec and everything it points to; NULL is a no-op. */
void moe_dataset_spec_free(struct moe_dataset_spec *s) {
    if (!s) return;
    for (int i = 0; i < s->n_fields; i++) free(s->fields[i]);
    free(s->fields);
    free(s->optional);
    free(s->path);
    free(s->card_path);
    free(s->name);
    free(s->sha256);
    free(s->license);
    free(s->url);
    free(s->description);
    free(s->data_path);
    free(s);
}

/* A zeroed spec with the "absent" markers set. */
static struct moe_dataset_spec *spec_new(void) {
    struct moe_dataset_spec *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->may_commit = -1;
    s->expected_records = -1;
    s->expected_bytes = -1;
    return s;
}

/* Append one field name to the selection. */
static enum moe_status add_field(struct moe_dataset_spec *s, const char *name, size_t n, int optional) {
    if (s->n_fields >= MOE_DATASET_MAX_FIELDS) return MOE_ERR_RANGE;
    char **f = realloc(s->fields, (size_t)(s->n_fields + 1) * sizeof *f);
    if (!f) return MOE_ERR_NOMEM;
    s->fields = f;
    unsigned char *o = realloc(s->optional, (size_t)(s->n_fields + 1));
    if (!o) return MOE_ERR_NOMEM;
    s->optional = o;
    if (!(f[s->n_fields] = xstrndup(name, n))) return MOE_ERR_NOMEM;
    o[s->n_fields++] = (unsigned char)(optional != 0);
    return MOE_OK;
}

/*
 * Parse the SELECT part for s->format: a text mode (chunk, para, line) or a
 * field list "a,b?,c" (spaces around names ignored; "\," "\?" "\\" escape; a
 * trailing unescaped '?' marks a field optional). sel NULL or blank = default.
 * `where` names the spec or card in messages.
 */
static enum moe_status parse_select(struct moe_dataset_spec *s, const char *sel, const char *where) {
    int blank = 1;
    for (const char *q = sel; q && *q; q++)
        if (*q != ' ' && *q != '\t') blank = 0;
    if (s->format == MOE_DATASET_TEXT) {
        if (blank) s->text_mode = MOE_TEXT_CHUNK;
        else if (!strcmp(sel, "chunk")) s->text_mode = MOE_TEXT_CHUNK;
        else if (!strcmp(sel, "para")) s->text_mode = MOE_TEXT_PARA;
        else if (!strcmp(sel, "line")) s->text_mode = MOE_TEXT_LINE;
        else {
            DS_SPEC_LOGE("%s: unknown text mode '%s' (chunk, para or line; a path containing ':' "
                     "needs a final ':', e.g. text:a:b.txt:)", where, sel);
            return MOE_ERR_INVALID;
        }
        return MOE_OK;
    }
    if (blank) {
        s->fields_defaulted = 1;
        return add_field(s, "text", 4, 0);
    }
    size_t cap = strlen(sel) + 1;
    char *buf = malloc(cap);
    if (!buf) return MOE_ERR_NOMEM;
    enum moe_status st = MOE_OK;
    const char *p = sel;
    for (;;) {
        size_t len = 0, keep = 0;
        int q_last = 0;
        while (*p && *p != ',') {
            char c = *p++;
            int esc = 0;
            if (c == '\\' && *p) c = *p++, esc = 1;
            if (!esc && (c == ' ' || c == '\t')) {
                if (len) buf[len++] = c; /* inner spaces kept; leading dropped */
                continue;
            }
            buf[len++] = c;
            keep = len;
            q_last = !esc && c == '?';
        }
        len = keep;
        if (q_last) { /* "name?" and "name ?" */
            len--;
            while (len && (buf[len - 1] == ' ' || buf[len - 1] == '\t')) len--;
        }
        if (len == 0) {
            DS_SPEC_LOGE("%s: empty field name in '%s'", where, sel);
            st = MOE_ERR_INVALID;
            break;
        }
        if ((st = add_field(s, buf, len, q_last))) {
            if (st == MOE_ERR_RANGE) {
                DS_SPEC_LOGE("%s: more than %d fields in '%s'", where, MOE_DATASET_MAX_FIELDS, sel);
                st = MOE_ERR_INVALID;
            }
            break;
        }
        if (!*p) break;
        p++; /* ',' */
    }
    free(buf);
    return st;
}

/* The format for a path's extension, after dropping ".gz": 0 if unknown. */
static int guess_format(const char *path, enum moe_dataset_format *f) {
    size_t n = strlen(path);
    if (n > 3 && !strcasecmp(path + n - 3, ".gz")) n -= 3;
    static const struct {
        const char *ext;
        enum moe_dataset_format f;
    } t[] = {{".txt", MOE_DATASET_TEXT},   {".raw", MOE_DATASET_TEXT},   {".text", MOE_DATASET_TEXT},
             {".tokens", MOE_DATASET_TEXT}, {".md", MOE_DATASET_TEXT},   {".jsonl", MOE_DATASET_JSONL},
             {".ndjson", MOE_DATASET_JSONL}, {".json", MOE_DATASET_JSON}, {".csv", MOE_DATASET_CSV},
             {".tsv", MOE_DATASET_TSV}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        size_t e = strlen(t[i].ext);
        if (n > e && !strncasecmp(path + n - e, t[i].ext, e) && path[n - e - 1] != '/') {
            *f = t[i].f;
            return 1;
        }
    }
    return 0;
}

/* 1 if path names a regular file. */
static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* 1 if s can be a bare card name: [A-Za-z0-9_][A-Za-z0-9_.-]*, at most 128 bytes. */
static int card_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 128 || !(isalnum((unsigned char)s[0]) || s[0] == '_')) return 0;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '.' || s[i] == '-')) return 0;
    return 1;
}

/* Where a card name is looked up: in each directory D of $MOE_DATASET_CARDS
 * (':'-separated), D/<name>.json then D/datasets/cards/<name>.json (so D may be
 * the cards folder or a checkout); then ./datasets/cards/<name>.json. Returns
 * the malloc'd path of the first that exists, or NULL. */
static char *find_card(const char *name) {
    char file[160], nested[180];
    snprintf(file, sizeof file, "%s.json", name);
    snprintf(nested, sizeof nested, "datasets/cards/%s.json", name);
    const char *env = getenv("MOE_DATASET_CARDS");
    while (env && *env) {
        const char *end = strchr(env, ':');
        size_t n = end ? (size_t)(end - env) : strlen(env);
        char *dir = n ? xstrndup(env, n) : NULL;
        for (int k = 0; dir && k < 2; k++) {
            char *p = moe_path_join(dir, k ? nested : file);
            if (p && is_file(p)) {
                free(dir);
                return p;
            }
            free(p);
        }
        free(dir);
        env = end ? end + 1 : NULL;
    }
    char *p = strdup(nested);
    if (p && is_file(p)) return p;
    free(p);
    return NULL;
}

/* 1 if path ends in ".json" and its first non-blank byte (after a BOM) is '{':
 * a card, since a JSON data file must be an array. */
static int looks_like_card(const char *path) {
    size_t n = strlen(path);
    if (n < 5 || strcasecmp(path + n - 5, ".json")) return 0;
    FILE *f = NULL;
    int fd;
    char why[160];
    if (moe_file_open_regular(path, &fd, why, sizeof why) || !(f = fdopen(fd, "rb"))) {
        if (!f && fd >= 0) close(fd);
        return 0; /* not readable as a card: the data reader reports why */
    }
    unsigned char b[4096];
    size_t k = fread(b, 1, sizeof b, f);
    fclose(f);
    size_t i = (k >= 3 && b[0] == 0xef && b[1] == 0xbb && b[2] == 0xbf) ? 3 : 0;
    while (i < k && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r')) i++;
    return i < k && b[i] == '{';
}

/* Copy a card's optional string member into *dst; MOE_ERR_FORMAT if it is not a string. */
static enum moe_status card_str(const cJSON *card, const char *key, const char *path, char **dst,
                                int required) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(card, key);
    if (!v || cJSON_IsNull(v)) {
        if (!required) return MOE_OK;
        DS_SPEC_LOGE("card %s: missing \"%s\"", path, key);
        return MOE_ERR_FORMAT;
    }
    if (!cJSON_IsString(v)) {
        DS_SPEC_LOGE("card %s: \"%s\" must be a string", path, key);
        return MOE_ERR_FORMAT;
    }
    return (*dst = strdup(v->valuestring)) ? MOE_OK : MOE_ERR_NOMEM;
}

/* Copy a card's optional non-negative integer member ("records", "bytes"). */
static enum moe_status card_int(const cJSON *card, const char *key, const char *path, int64_t *dst) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(card, key);
    if (!v) return MOE_OK;
    double x = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!(x >= 0 && x <= 9007199254740992.0) || x != (double)(int64_t)x) {
        DS_SPEC_LOGE("card %s: \"%s\" must be a non-negative integer", path, key);
        return MOE_ERR_FORMAT;
    }
    *dst = (int64_t)x;
    return MOE_OK;
}

/* The card's "fields": a string in the SELECT grammar, or an array of strings
 * (one field each, "name?" optional); rebuilt as one SELECT string. */
static enum moe_status card_fields(const cJSON *card, const char *path, char **sel) {
    *sel = NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(card, "fields");
    if (!v || cJSON_IsNull(v)) return MOE_OK;
    if (cJSON_IsString(v)) return (*sel = strdup(v->valuestring)) ? MOE_OK : MOE_ERR_NOMEM;
    if (!cJSON_IsArray(v)) goto bad;
    struct ds_buf b = {0};
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsString(e)) {
            ds_buf_free(&b);
            goto bad;
        }
        if (b.len && ds_buf_append(&b, ",", 1)) goto nomem;
        for (const char *c = e->valuestring; *c; c++) {
            if ((*c == ',' || *c == '\\') && ds_buf_append(&b, "\\", 1)) goto nomem;
            if (ds_buf_append(&b, c, 1)) goto nomem;
        }
    }
    *sel = b.p ? b.p : strdup(""); /* [] = the default selection */
    return *sel ? MOE_OK : MOE_ERR_NOMEM;
nomem:
    ds_buf_free(&b);
    return MOE_ERR_NOMEM;
bad:
    DS_SPEC_LOGE("card %s: \"fields\" must be a string (\"a,b?,c\") or an array of strings", path);
    return MOE_ERR_FORMAT;
}

/* Where the card's data lives: $MOE_DATA_DIR/<data_path> when that exists, else
 * "file" relative to the card's directory (or absolute). */
static enum moe_status card_resolve(struct moe_dataset_spec *s, const char *file) {
    const char *env = getenv("MOE_DATA_DIR");
    char *from_env = NULL;
    if (env && *env && s->data_path) {
        if (!(from_env = moe_path_join(env, s->data_path))) return MOE_ERR_NOMEM;
        if (is_file(from_env) || !file) {
            s->path = from_env;
            return MOE_OK;
        }
        free(from_env);
    }
    if (!file) {
        DS_SPEC_LOGE("card %s: its data is found only through MOE_DATA_DIR (\"data_path\": \"%s\"), "
                 "which is not set", s->card_path, s->data_path);
        return MOE_ERR_NOT_FOUND;
    }
    char *joined;
    if (file[0] == '/') {
        joined = strdup(file);
    } else {
        const char *slash = strrchr(s->card_path, '/');
        char *dir = slash ? xstrndup(s->card_path, (size_t)(slash - s->card_path)) : strdup(".");
        joined = dir ? moe_path_join(dir, file) : NULL;
        free(dir);
    }
    if (!joined) return MOE_ERR_NOMEM;
    char real[PATH_MAX];
    if (realpath(joined, real)) { /* shorter messages: no "cards/../../../" */
        free(joined);
        joined = strdup(real);
        if (!joined) return MOE_ERR_NOMEM;
    }
    s->path = joined;
    return MOE_OK;
}

/* Read and validate a card file into a spec (see datasets/cards/README.md). */
static enum moe_status load_card(const char *path, struct moe_dataset_spec **out) {
    char *text = NULL, *sel = NULL, *format = NULL, *file = NULL;
    size_t len = 0;
    cJSON *card = NULL;
    struct moe_dataset_spec *s = NULL;
    enum moe_status st = moe_read_file(path, CARD_MAX_BYTES, &text, &len);
    if (st) goto fail;
    st = MOE_ERR_FORMAT;
    const char *end = NULL;
    card = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!card || !cJSON_IsObject(card)) {
        size_t off = card ? 0 : (size_t)(end && end >= text ? end - text : 0);
        DS_SPEC_LOGE("card %s: %s (byte %zu)", path, card ? "not a JSON object" : "invalid JSON", off);
        goto fail;
    }
    st = MOE_ERR_NOMEM;
    if (!(s = spec_new()) || !(s->card_path = strdup(path))) goto fail;
    if ((st = card_str(card, "name", path, &s->name, 1)) || (st = card_str(card, "format", path, &format, 1)) ||
        (st = card_str(card, "file", path, &file, 0)) ||
        (st = card_str(card, "data_path", path, &s->data_path, 0)) ||
        (st = card_str(card, "license", path, &s->license, 0)) ||
        (st = card_str(card, "url", path, &s->url, 0)) ||
        (st = card_str(card, "description", path, &s->description, 0)) ||
        (st = card_str(card, "sha256", path, &s->sha256, 0)) ||
        (st = card_int(card, "records", path, &s->expected_records)) ||
        (st = card_int(card, "bytes", path, &s->expected_bytes)) || (st = card_fields(card, path, &sel)))
        goto fail;
    st = MOE_ERR_FORMAT;
    if (!format_from_name(format, strlen(format), &s->format)) {
        DS_SPEC_LOGE("card %s: unknown \"format\" '%s' (text, jsonl, json, csv, tsv)", path, format);
        goto fail;
    }
    if (!file && !s->data_path) {
        DS_SPEC_LOGE("card %s: needs \"file\" (relative to the card) or \"data_path\" (under $MOE_DATA_DIR)", path);
        goto fail;
    }
    if (s->sha256) {
        size_t n = strlen(s->sha256);
        for (size_t i = 0; i < n; i++) s->sha256[i] = (char)tolower((unsigned char)s->sha256[i]);
        if (n != 64 || strspn(s->sha256, "0123456789abcdef") != 64) {
            DS_SPEC_LOGE("card %s: \"sha256\" must be 64 hex digits", path);
            goto fail;
        }
    } else {
        DS_SPEC_LOGW("card %s has no \"sha256\": its file is not verified", path);
    }
    const cJSON *mc = cJSON_GetObjectItemCaseSensitive(card, "may_commit");
    if (mc) {
        if (!cJSON_IsBool(mc)) {
            DS_SPEC_LOGE("card %s: \"may_commit\" must be true or false", path);
            goto fail;
        }
        s->may_commit = cJSON_IsTrue(mc) ? 1 : 0;
    }
    char where[512];
    snprintf(where, sizeof where, "card %s", path);
    if ((st = parse_select(s, sel, where)) || (st = card_resolve(s, file))) goto fail;
    *out = s;
    s = NULL;
fail:
    if (st == MOE_ERR_NOMEM) DS_SPEC_LOGE("card %s: out of memory", path);
    moe_dataset_spec_free(s);
    cJSON_Delete(card);
    free(text);
    free(sel);
    free(format);
    free(file);
    return st;
}

/* A file spec: path, format, selection. */
static enum moe_status file_spec(const char *path, size_t path_len, enum moe_dataset_format f,
                                 const char *sel, const char *where, struct moe_dataset_spec **out) {
    struct moe_dataset_spec *s = spec_new();
    if (!s || !(s->path = xstrndup(path, path_len))) {
        moe_dataset_spec_free(s);
        return MOE_ERR_NOMEM;
    }
    s->format = f;
    enum moe_status st = parse_select(s, sel, where);
    if (st) {
        moe_dataset_spec_free(s);
        return st;
    }
    *out = s;
    return MOE_OK;
}

/* Parse a spec string; the grammar is in docs/cli.md ("Datasets") and moe_dataset_spec_help(). */
enum moe_status moe_dataset_spec_parse(const char *text, struct moe_dataset_spec **out) {
    *out = NULL;
    if (!text || !*text) {
        DS_SPEC_LOGE("empty dataset spec");
        return MOE_ERR_INVALID;
    }
    char where[600];
    snprintf(where, sizeof where, "dataset spec '%.500s'", text);
    enum moe_dataset_format f;
    if (!strncmp(text, "file:", 5)) {
        const char *path = text + 5;
        if (!*path) {
            DS_SPEC_LOGE("%s: no path after 'file:'", where);
            return MOE_ERR_INVALID;
        }
        if (!guess_format(path, &f)) goto unguessable;
        return file_spec(path, strlen(path), f, NULL, where, out);
    }
    if (!strncmp(text, "card:", 5)) {
        const char *c = text + 5;
        if (card_name_ok(c) && !strstr(c, ".json")) {
            char *p = find_card(c);
            if (!p) {
                DS_SPEC_LOGE("%s: no card named '%s' (looked for %s.json in $MOE_DATASET_CARDS=%s and "
                         "./datasets/cards)", where, c, c,
                         getenv("MOE_DATASET_CARDS") ? getenv("MOE_DATASET_CARDS") : "(unset)");
                return MOE_ERR_NOT_FOUND;
            }
            enum moe_status st = load_card(p, out);
            free(p);
            return st;
        }
        if (!*c) {
            DS_SPEC_LOGE("%s: no card after 'card:'", where);
            return MOE_ERR_INVALID;
        }
        return load_card(c, out);
    }
    const char *colon = strchr(text, ':');
    if (colon && format_from_name(text, (size_t)(colon - text), &f)) {
        const char *path = colon + 1, *last = strrchr(path, ':');
        size_t n = last ? (size_t)(last - path) : strlen(path);
        if (n == 0) {
            DS_SPEC_LOGE("%s: no path after '%.*s:'", where, (int)(colon - text), text);
            return MOE_ERR_INVALID;
        }
        return file_spec(path, n, f, last ? last + 1 : NULL, where, out);
    }
    if (card_name_ok(text)) {
        char *p = find_card(text);
        if (p) {
            enum moe_status st = load_card(p, out);
            free(p);
            return st;
        }
    }
    if (looks_like_card(text)) return load_card(text, out);
    if (guess_format(text, &f)) return file_spec(text, strlen(text), f, NULL, where, out);
unguessable:;
    /* an existing file with no known extension ("notes", "corpus.log") is read as text */
    const char *plain = !strncmp(text, "file:", 5) ? text + 5 : text;
    if (is_file(plain)) return file_spec(plain, strlen(plain), MOE_DATASET_TEXT, NULL, where, out);
    /* "data.csv:a,b" probably meant "csv:data.csv:a,b" */
    const char *last = strrchr(text, ':');
    char *head = last ? xstrndup(text, (size_t)(last - text)) : NULL;
    if (head && strncmp(text, "file:", 5) && guess_format(head, &f))
        DS_SPEC_LOGE("%s: no format prefix; did you mean %s:%s?", where, moe_dataset_format_name(f), text);
    else if (card_name_ok(text))
        DS_SPEC_LOGE("%s: no card named '%s' (looked for %s.json in $MOE_DATASET_CARDS=%s and ./datasets/cards), "
                 "and no file format can be told from the name", where, text, text,
                 getenv("MOE_DATASET_CARDS") ? getenv("MOE_DATASET_CARDS") : "(unset)");
    else
        DS_SPEC_LOGE("%s: not a card name, and the format of the file cannot be told from its extension "
                 "(.txt .raw .md .tokens .jsonl .ndjson .json .csv .tsv, optionally + .gz); write "
                 "FORMAT:PATH[:FIELDS], e.g. jsonl:%s:text", where, !strncmp(text, "file:", 5) ? text + 5 : text);
    free(head);
    return MOE_ERR_INVALID;
}

/* Spec for an in-memory buffer: "FORMAT[:SELECT]" (moe_dataset_open_memory). */
enum moe_status ds_spec_from_format(const char *format, const char *label, struct moe_dataset_spec **out) {
    *out = NULL;
    const char *colon = format ? strchr(format, ':') : NULL;
    size_t n = !format ? 0 : colon ? (size_t)(colon - format) : strlen(format);
    enum moe_dataset_format f;
    if (!format || !format_from_name(format, n, &f)) {
        DS_SPEC_LOGE("%s: unknown format '%s' (text, jsonl, json, csv, tsv)", label, format ? format : "(null)");
        return MOE_ERR_INVALID;
    }
    char where[300];
    snprintf(where, sizeof where, "%.200s (format '%.80s')", label, format);
    return file_spec(label, strlen(label), f, colon ? colon + 1 : NULL, where, out);
}

/* The grammar for --help (kept in step with docs/cli.md). */
const char *moe_dataset_spec_help(void) {
    return "Dataset spec (one argument):\n"
           "  NAME                   a dataset card: NAME.json in a dir of $MOE_DATASET_CARDS (':'-separated;\n"
           "                         a dir may also be a checkout with datasets/cards/) or in\n"
           "                         ./datasets/cards; e.g. gsm8k-test\n"
           "  card:NAME | card:FILE  the same, explicitly; FILE is a card's path\n"
           "  FORMAT:PATH[:SELECT]   FORMAT = text | jsonl | json | csv | tsv; the last ':' starts\n"
           "                         SELECT, so a PATH with ':' needs one more (\"jsonl:a:b.jsonl:\")\n"
           "  PATH                   format from the extension (.txt .raw .md .tokens = text, .jsonl,\n"
           "                         .json = JSON array (a .json whose first byte is '{' is a card),\n"
           "                         .csv, .tsv; each also + .gz; an existing file with another or no\n"
           "                         extension is text); \"file:PATH\" takes PATH literally\n"
           "  SELECT for text        chunk (default: the whole file in ~1 MiB pieces), para (blank-line\n"
           "                         separated paragraphs) or line (non-blank lines)\n"
           "  SELECT otherwise       fields joined with \"\\n\" per record, e.g. question,answer or\n"
           "                         instruction,input?,output ('?' = optional; default: text); CSV/TSV\n"
           "                         select header names; an array of objects (ShareGPT\n"
           "                         \"conversations\") gives each turn's value/content/text\n"
           "  gzip is detected by its magic bytes. Examples:\n"
           "    gsm8k-test   jsonl:test.jsonl:question,answer   csv:TruthfulQA.csv:Question,Best Answer\n"
           "    wiki.test.raw   text:notes.txt:para   json:alpaca.json:instruction,input?,output\n";
}

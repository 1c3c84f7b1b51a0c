/*
 * json.c - a JSON array of objects (Alpaca, ShareGPT), streamed element by
 * element. A small splitter walks the bytes once, tracking strings, escapes and
 * bracket depth, and cuts out each top-level element; only that element is
 * handed to cJSON. So a multi-GB array needs memory for its largest element,
 * never for the whole file.
 *
 * The splitter checks the array's structure (the '[', the commas, the ']');
 * cJSON checks each element. A bad element is one malformed record (skippable);
 * a broken structure (no '[', something other than ',' or ']' between
 * elements, a trailing comma, data after the ']') ends the dataset.
 */
#include "dataset-impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

enum { JS_BEFORE, JS_FIRST, JS_NEXT, JS_IN, JS_AFTER, JS_DONE };
enum { K_CONTAINER, K_STRING, K_LITERAL };

/* JSON whitespace. */
static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A printable rendering of a byte for messages. */
static const char *show(unsigned char c, char buf[8]) {
    if (c >= 0x20 && c < 0x7f) snprintf(buf, 8, "'%c'", c);
    else snprintf(buf, 8, "0x%02x", c);
    return buf;
}

/* Consume whitespace and the opening '['. 0 = ok, -1 = fatal. */
int ds_json_start(struct moe_dataset *d) {
    d->js.phase = JS_BEFORE;
    for (;;) {
        int r = ds_fill(d);
        if (r < 0) return -1;
        if (r == 0)
            return ds_fatal(d, MOE_ERR_FORMAT, d->line, "%s, expected a JSON array ('[')",
                            d->truncated ? "the gzip stream is truncated" : "empty file");
        unsigned char c = d->in[d->in_pos];
        if (is_ws(c)) {
            d->line += c == '\n';
            d->in_pos++;
            continue;
        }
        if (c == '[') {
            d->in_pos++;
            d->js.phase = JS_FIRST;
            return 0;
        }
        char b[8];
        return ds_fatal(d, MOE_ERR_FORMAT, d->line,
                        "expected a JSON array ('['), found %s%s", show(c, b),
                        c == '{' ? " (an object: for one object per line use jsonl:PATH, or a card file "
                                   "with card:PATH)"
                                 : "");
    }
}

/* Append a run of element bytes (or drop them once the element is too big). */
static int elem_bytes(struct moe_dataset *d, const unsigned char *s, size_t n) {
    if (d->js.overflow) return 0;
    if (d->work.len + n > d->p.max_record_bytes) {
        d->js.overflow = 1;
        return 0;
    }
    if (ds_buf_append(&d->work, s, n)) {
        DS_LOGE("%s: out of memory", d->src.label);
        d->err = MOE_ERR_NOMEM;
        return -1;
    }
    return 0;
}

/* Append one byte of the current element. */
static int elem_byte(struct moe_dataset *d, unsigned char c) { return elem_bytes(d, &c, 1); }

/* Parse the element in d->work (starting at line js.elem_line) into d->rec.
 * 1 = a candidate, 0 = malformed and skipped, -1 = error. */
static int element_record(struct moe_dataset *d) {
    int64_t line = d->js.elem_line;
    if (d->js.overflow) return ds_bad(d, line, "array element longer than %zu bytes", d->p.max_record_bytes);
    const char *s = d->work.p, *end = NULL;
    size_t n = d->work.len;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    char why[400];
    why[0] = 0;
    if (!j) {
        size_t off = end && end >= s && end <= s + n ? (size_t)(end - s) : 0;
        int64_t at = line;
        for (size_t i = 0; i < off; i++) at += s[i] == '\n';
        snprintf(why, sizeof why, "invalid JSON in array element %lld (error at line %lld)",
                 (long long)d->n_seen, (long long)at);
    } else if (!cJSON_IsObject(j)) {
        snprintf(why, sizeof why, "array element %lld is a JSON %s, not an object", (long long)d->n_seen,
                 cJSON_IsArray(j) ? "array" : cJSON_IsString(j) ? "string" : "scalar");
    } else {
        ds_record_from_json(d, j, why, sizeof why);
    }
    cJSON_Delete(j);
    if (why[0]) {
        if (!strcmp(why, "out of memory")) {
            DS_LOGE("%s: out of memory", d->src.label);
            d->err = MOE_ERR_NOMEM;
            return -1;
        }
        return ds_bad(d, line, "%s", why);
    }
    d->cand_line = line;
    return 1;
}

/* The data ended before the array's ']'. */
static int json_eof(struct moe_dataset *d) {
    struct ds_json *js = &d->js;
    if (js->phase == JS_DONE) return 0;
    if (js->phase == JS_IN) { /* inside an element */
        js->phase = JS_DONE;
        if (ds_cut_off(d, js->elem_line,
                       d->truncated ? "the gzip stream ends inside this array element"
                                    : "the file ends inside this array element (no closing bracket)") < 0)
            return -1;
        return 0;
    }
    js->phase = JS_DONE;
    if (d->p.skip_bad) {
        moe_log_func(MOE_LOG_WARN, "moe_dataset", "%s:%lld: the JSON array is not closed (no ']')", d->src.label,
                     (long long)d->line);
        return 0;
    }
    return ds_fatal(d, MOE_ERR_FORMAT, d->line, "the JSON array is not closed: the file ends before its ']'");
}

/* Start a new element with its first byte c. */
static int elem_start(struct moe_dataset *d, unsigned char c) {
    struct ds_json *js = &d->js;
    d->n_seen++;
    d->work.len = 0;
    js->overflow = 0;
    js->elem_line = d->line;
    js->in_str = js->esc = 0;
    js->depth = 0;
    js->kind = (c == '{' || c == '[') ? K_CONTAINER : c == '"' ? K_STRING : K_LITERAL;
    if (js->kind == K_CONTAINER) js->depth = 1;
    js->phase = JS_IN;
    return elem_byte(d, c);
}

/* The next array element as a candidate record (see dataset-impl.h). */
int ds_json_next(struct moe_dataset *d) {
    struct ds_json *js = &d->js;
    char b[8];
    for (;;) {
        int r = ds_fill(d);
        if (r < 0) return -1;
        if (r == 0) return json_eof(d);
        unsigned char c = d->in[d->in_pos];
        switch (js->phase) {
        case JS_FIRST:
        case JS_NEXT:
            if (is_ws(c)) break;
            if (c == ']' && js->phase == JS_FIRST) {
                js->phase = JS_DONE;
                break;
            }
            if (c == ']' || c == ',')
                return ds_fatal(d, MOE_ERR_FORMAT, d->line, "%s in the JSON array (an element is missing)",
                                c == ']' ? "trailing comma" : "two commas");
            d->in_pos++;
            if (elem_start(d, c) < 0) return -1;
            continue;
        case JS_IN:
            if ((js->in_str || js->kind == K_STRING) && !js->esc) {
                /* fast path: copy the plain bytes of a string up to the next '"', '\\' or newline */
                const unsigned char *s = d->in + d->in_pos, *end = d->in + d->in_len, *q = s;
                while (q < end && *q != '"' && *q != '\\' && *q != '\n') q++;
                if (q > s) {
                    if (elem_bytes(d, s, (size_t)(q - s)) < 0) return -1;
                    d->in_pos += (size_t)(q - s);
                    continue;
                }
            }
            if (js->kind == K_LITERAL && (is_ws(c) || c == ',' || c == ']')) {
                js->phase = JS_AFTER; /* c is looked at again as a separator */
                r = element_record(d);
                if (r != 0) return r;
                continue;
            }
            if (elem_byte(d, c) < 0) return -1;
            d->in_pos++;
            d->line += c == '\n';
            if (js->in_str || js->kind == K_STRING) {
                if (js->esc) {
                    js->esc = 0;
                } else if (c == '\\') {
                    js->esc = 1;
                } else if (c == '"') {
                    if (js->kind == K_STRING) goto element_end; /* (the opening quote went through elem_start) */
                    js->in_str = 0;
                }
            } else if (js->kind == K_CONTAINER) {
                if (c == '"') {
                    js->in_str = 1;
                } else if (c == '{' || c == '[') {
                    js->depth++;
                } else if ((c == '}' || c == ']') && --js->depth == 0) {
                    goto element_end;
                }
            }
            continue;
        element_end:
            js->phase = JS_AFTER;
            r = element_record(d);
            if (r != 0) return r;
            continue;
        case JS_AFTER:
            if (is_ws(c)) break;
            if (c == ',') {
                js->phase = JS_NEXT;
                break;
            }
            if (c == ']') {
                js->phase = JS_DONE;
                break;
            }
            return ds_fatal(d, MOE_ERR_FORMAT, d->line, "expected ',' or ']' after array element %lld, found %s",
                            (long long)d->n_seen, show(c, b));
        case JS_DONE:
            if (is_ws(c)) break;
            return ds_fatal(d, MOE_ERR_FORMAT, d->line, "unexpected %s after the end of the JSON array",
                            show(c, b));
        default:
            return ds_fatal(d, MOE_ERR_FORMAT, d->line, "JSON array reader in a bad state");
        }
        d->line += c == '\n';
        d->in_pos++;
    }
}

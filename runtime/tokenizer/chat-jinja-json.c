/*
 * chat-jinja-json.c - values and JSON for the chat-template interpreter:
 * tojson as transformers defines it (Python's json.dumps with
 * ensure_ascii=False by default, indent, separators, sort_keys), and a JSON
 * reader that builds values the way Python's json.loads does (key order
 * kept, the last of duplicate keys wins, integers stay integers), for the
 * messages and extra variables given as JSON.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat-jinja-eval.h"

/* ---- tojson ------------------------------------------------------------- */

struct jopts {
    const char *indent; /* NULL: no newlines */
    size_t indent_n;
    const char *item_sep, *key_sep;
    size_t item_n, key_n;
    int sort_keys, ensure_ascii;
};

static int put_json_str(struct jbuf *b, const char *s, size_t n, int ensure_ascii) {
    int bad = jb_put(b, "\"", 1);
    size_t i = 0, run = 0;
    while (i < n && !bad) {
        unsigned char c = (unsigned char)s[i];
        char e[16];
        int el = 0;
        size_t len = 1;
        if (c == '"') el = sprintf(e, "\\\"");
        else if (c == '\\') el = sprintf(e, "\\\\");
        else if (c == '\n') el = sprintf(e, "\\n");
        else if (c == '\r') el = sprintf(e, "\\r");
        else if (c == '\t') el = sprintf(e, "\\t");
        else if (c == '\b') el = sprintf(e, "\\b");
        else if (c == '\f') el = sprintf(e, "\\f");
        else if (c < 0x20) el = sprintf(e, "\\u%04x", c);
        else if (c >= 0x80 && ensure_ascii) {
            uint32_t cp = ju_decode(s + i, n - i, &len);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                el = sprintf(e, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                el = sprintf(e, "\\u%04x", cp);
            }
        }
        if (el) {
            bad |= jb_put(b, s + i - run, run) | jb_put(b, e, (size_t)el);
            run = 0;
        } else {
            run += len;
        }
        i += len;
    }
    bad |= jb_put(b, s + n - run, run);
    return bad | jb_put(b, "\"", 1);
}

static int newline_indent(struct jbuf *b, const struct jopts *o, int level) {
    int bad = jb_put(b, "\n", 1);
    for (int i = 0; i < level && !bad; i++) bad |= jb_put(b, o->indent, o->indent_n);
    return bad;
}

/* key_text: a dict key as json.dumps writes it (str, int, float, bool, None). */
static int key_text(const jv *k, char *buf, const char **s, size_t *n) {
    switch (k->t) {
    case JV_STR: *s = k->u.s.p, *n = k->u.s.n; return 0;
    case JV_INT: *n = (size_t)sprintf(buf, "%lld", (long long)k->u.i), *s = buf; return 0;
    case JV_FLOAT:
        if (isnan(k->u.f)) *s = "NaN", *n = 3;
        else if (isinf(k->u.f)) *s = k->u.f < 0 ? "-Infinity" : "Infinity", *n = strlen(*s);
        else *n = jj_repr_float(k->u.f, buf), *s = buf;
        return 0;
    case JV_BOOL: *s = k->u.b ? "true" : "false", *n = strlen(*s); return 0;
    case JV_NONE: *s = "null", *n = 4; return 0;
    default: return -1;
    }
}

/* dump: json.dumps of v; -1 output full, -3 not serializable (*bad names the type). */
static int dump(struct jbuf *b, const jv *v, const struct jopts *o, int level, const char **bad) {
    char num[48];
    switch (v->t) {
    case JV_NONE: return jb_put(b, "null", 4);
    case JV_BOOL: return v->u.b ? jb_put(b, "true", 4) : jb_put(b, "false", 5);
    case JV_INT: return jb_put(b, num, (size_t)sprintf(num, "%lld", (long long)v->u.i));
    case JV_FLOAT: {
        const char *s;
        size_t n;
        key_text(v, num, &s, &n);
        return jb_put(b, s, n);
    }
    case JV_STR: return put_json_str(b, v->u.s.p, v->u.s.n, o->ensure_ascii);
    case JV_LIST: {
        size_t n = v->u.l ? v->u.l->n : 0;
        if (v->tuple == 2) return *bad = "generator", -3;
        if (!n) return jb_put(b, "[]", 2);
        int r = jb_put(b, "[", 1);
        if (level >= JJ_MAX_DEPTH) return *bad = "a structure nested too deep", -3;
        for (size_t i = 0; i < n && !r; i++) {
            if (i) r |= jb_put(b, o->item_sep, o->item_n);
            if (o->indent) r |= newline_indent(b, o, level + 1);
            if (!r) r = dump(b, &v->u.l->v[i], o, level + 1, bad);
        }
        if (!r && o->indent) r |= newline_indent(b, o, level);
        return r ? r : jb_put(b, "]", 1);
    }
    case JV_DICT: {
        const struct jdict *D = v->u.d;
        size_t n = D ? D->n : 0;
        if (!n) return jb_put(b, "{}", 2);
        if (level >= JJ_MAX_DEPTH) return *bad = "a structure nested too deep", -3;
        size_t *order = malloc(n * sizeof *order);
        if (!order) return -1;
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (o->sort_keys) { /* insertion sort: stable, and dicts in templates are small */
            for (size_t i = 1; i < n; i++) {
                size_t x = order[i], j = i;
                while (j > 0) {
                    int c = jv_cmp(&D->k[order[j - 1]], &D->k[x]);
                    if (c == -2) {
                        free(order);
                        return *bad = "dict keys of mixed types (sort_keys)", -3;
                    }
                    if (c <= 0) break;
                    order[j] = order[j - 1], j--;
                }
                order[j] = x;
            }
        }
        int r = jb_put(b, "{", 1);
        for (size_t i = 0; i < n && !r; i++) {
            const char *ks;
            size_t kn;
            const jv *k = &D->k[order[i]];
            if (key_text(k, num, &ks, &kn)) {
                free(order);
                return *bad = jv_type_name(k), -4;
            }
            if (i) r |= jb_put(b, o->item_sep, o->item_n);
            if (o->indent) r |= newline_indent(b, o, level + 1);
            r |= put_json_str(b, ks, kn, o->ensure_ascii) | jb_put(b, o->key_sep, o->key_n);
            if (!r) r = dump(b, &D->v[order[i]], o, level + 1, bad);
        }
        free(order);
        if (!r && o->indent) r |= newline_indent(b, o, level);
        return r ? r : jb_put(b, "}", 1);
    }
    default: return *bad = jv_type_name(v), -3;
    }
}

int jlib_tojson(struct ctx *C, const struct jnode *n, const jv *v, const jv *ensure_ascii, const jv *indent,
                const jv *separators, const jv *sort_keys, jv *out) {
    struct jopts o = {NULL, 0, ", ", ": ", 2, 2, sort_keys && jv_truthy(sort_keys), ensure_ascii && jv_truthy(ensure_ascii)};
    char spaces[256];
    if (indent && indent->t != JV_NONE && indent->t != JV_UNDEF) {
        if (indent->t == JV_STR) {
            o.indent = indent->u.s.p, o.indent_n = indent->u.s.n;
        } else if (indent->t == JV_INT || indent->t == JV_BOOL) {
            int64_t w = jv_int(indent);
            if (w > 255) return jfail(C, n, MOE_ERR_RANGE, "tojson: indent %lld is too large", (long long)w);
            o.indent_n = w > 0 ? (size_t)w : 0;
            memset(spaces, ' ', o.indent_n);
            o.indent = spaces;
        } else {
            return jfail(C, n, MOE_ERR_INVALID, "tojson: indent must be an integer or a string");
        }
        o.item_sep = ",", o.item_n = 1;
    }
    if (separators && separators->t != JV_NONE && separators->t != JV_UNDEF) {
        if (separators->t != JV_LIST || !separators->u.l || separators->u.l->n != 2 || separators->u.l->v[0].t != JV_STR ||
            separators->u.l->v[1].t != JV_STR)
            return jfail(C, n, MOE_ERR_INVALID, "tojson: separators must be a pair of strings");
        o.item_sep = separators->u.l->v[0].u.s.p, o.item_n = separators->u.l->v[0].u.s.n;
        o.key_sep = separators->u.l->v[1].u.s.p, o.key_n = separators->u.l->v[1].u.s.n;
    }
    struct jbuf b = {0};
    b.limit = JJ_MAX_OUTPUT;
    const char *bad = NULL;
    int r = dump(&b, v, &o, 0, &bad);
    if (r) {
        free(b.p);
        if (r == -4) return jfail(C, n, MOE_ERR_INVALID, "tojson: keys must be str, int, float, bool or None, not %s", bad);
        if (r == -3) return jfail(C, n, MOE_ERR_INVALID, "tojson: Object of type %s is not JSON serializable", bad);
        return jfail(C, n, MOE_ERR_RANGE, "tojson: the result is over %zu MiB", JJ_MAX_OUTPUT >> 20);
    }
    *out = jv_str(C->ar, b.p ? b.p : "", b.n);
    free(b.p);
    return C->ar->full ? jnomem(C, n) : 0;
}

/* ---- JSON -> values ----------------------------------------------------- */

struct jr {
    const char *s;
    size_t n, i;
    struct jarena *a;
    char *msg;
    size_t msg_size;
    int depth;
};

static int jr_fail(struct jr *r, const char *what) {
    int line = 1, col = 1;
    for (size_t k = 0; k < r->i && k < r->n; k++) {
        if (r->s[k] == '\n') line++, col = 1;
        else col++;
    }
    snprintf(r->msg, r->msg_size, "line %d column %d: %s", line, col, what);
    return -1;
}

static void jr_ws(struct jr *r) {
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')) r->i++;
}

static int hex4(struct jr *r, uint32_t *out) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = r->i < r->n ? r->s[r->i++] : 0;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return jr_fail(r, "bad \\u escape");
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

static int jr_string(struct jr *r, jv *out) {
    r->i++; /* the quote */
    size_t start = r->i;
    while (r->i < r->n && r->s[r->i] != '"' && r->s[r->i] != '\\' && (unsigned char)r->s[r->i] >= 0x20) r->i++;
    if (r->i < r->n && r->s[r->i] == '"') { /* no escapes: one copy */
        *out = jv_str(r->a, r->s + start, r->i - start);
        r->i++;
        return r->a->full ? -2 : 0;
    }
    struct jbuf b = {0};
    int bad = jb_put(&b, r->s + start, r->i - start);
    for (;;) {
        if (r->i >= r->n) {
            free(b.p);
            return jr_fail(r, "unterminated string");
        }
        unsigned char c = (unsigned char)r->s[r->i];
        if (c == '"') break;
        if (c < 0x20) {
            free(b.p);
            return jr_fail(r, "control character in a string");
        }
        if (c != '\\') {
            bad |= jb_put(&b, r->s + r->i++, 1);
            continue;
        }
        r->i++;
        char e = r->i < r->n ? r->s[r->i++] : 0, o[4];
        const char *m = strchr("\"\\/bfnrt", e);
        if (m && e) {
            static const char rep[] = "\"\\/\b\f\n\r\t";
            bad |= jb_put(&b, &rep[m - "\"\\/bfnrt"], 1);
        } else if (e == 'u') {
            uint32_t cp, lo;
            if (hex4(r, &cp)) return free(b.p), -1;
            if (cp >= 0xD800 && cp < 0xDC00 && r->i + 6 <= r->n && r->s[r->i] == '\\' && r->s[r->i + 1] == 'u') {
                size_t save = r->i;
                r->i += 2;
                if (hex4(r, &lo)) return free(b.p), -1;
                if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else r->i = save;
            }
            bad |= jb_put(&b, o, ju_encode(cp, o));
        } else {
            free(b.p);
            return jr_fail(r, "bad escape in a string");
        }
    }
    r->i++;
    *out = jv_str(r->a, b.p ? b.p : "", b.n);
    free(b.p);
    return bad || r->a->full ? -2 : 0;
}

static int jr_value(struct jr *r, jv *out);

static int jr_container(struct jr *r, jv *out, int obj) {
    if (++r->depth > JJ_MAX_DEPTH) return jr_fail(r, "nested too deep");
    r->i++;
    *out = obj ? jv_new_dict(r->a) : jv_new_list(r->a);
    if (obj ? !out->u.d : !out->u.l) return -2;
    jr_ws(r);
    if (r->i < r->n && r->s[r->i] == (obj ? '}' : ']')) {
        r->i++;
        r->depth--;
        return 0;
    }
    for (;;) {
        jv k, v;
        int rc;
        jr_ws(r);
        if (obj) {
            if (r->i >= r->n || r->s[r->i] != '"') return jr_fail(r, "expected a string key");
            if ((rc = jr_string(r, &k))) return rc;
            jr_ws(r);
            if (r->i >= r->n || r->s[r->i] != ':') return jr_fail(r, "expected ':'");
            r->i++;
        }
        if ((rc = jr_value(r, &v))) return rc;
        if (obj ? jv_dict_set(r->a, out, k, v) : jv_list_push(r->a, out, v)) return -2;
        jr_ws(r);
        if (r->i < r->n && r->s[r->i] == ',') {
            r->i++;
            continue;
        }
        if (r->i < r->n && r->s[r->i] == (obj ? '}' : ']')) {
            r->i++;
            r->depth--;
            return 0;
        }
        return jr_fail(r, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int jr_value(struct jr *r, jv *out) {
    jr_ws(r);
    memset(out, 0, sizeof *out);
    if (r->i >= r->n) return jr_fail(r, "unexpected end of the JSON text");
    const char c = r->s[r->i];
    if (c == '"') return jr_string(r, out);
    if (c == '{' || c == '[') return jr_container(r, out, c == '{');
    static const struct { const char *w; enum jv_type t; int b; } words[] = {
        {"true", JV_BOOL, 1}, {"false", JV_BOOL, 0}, {"null", JV_NONE, 0}};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(words[k].w);
        if (r->n - r->i >= l && !memcmp(r->s + r->i, words[k].w, l)) {
            out->t = words[k].t, out->u.b = words[k].b;
            r->i += l;
            return 0;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        size_t st = r->i;
        int is_float = 0;
        if (r->s[r->i] == '-') r->i++;
        if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return jr_fail(r, "bad number");
        while (r->i < r->n && ((r->s[r->i] >= '0' && r->s[r->i] <= '9') || strchr(".eE+-", r->s[r->i]))) {
            is_float |= r->s[r->i] == '.' || r->s[r->i] == 'e' || r->s[r->i] == 'E';
            r->i++;
        }
        char buf[64];
        if (r->i - st >= sizeof buf) return jr_fail(r, "number too long");
        memcpy(buf, r->s + st, r->i - st);
        buf[r->i - st] = 0;
        char *end;
        if (!is_float) {
            long long v = strtoll(buf, &end, 10);
            if (!*end && !(v == LLONG_MAX || v == LLONG_MIN)) {
                out->t = JV_INT, out->u.i = v;
                return 0;
            }
        }
        out->t = JV_FLOAT, out->u.f = strtod(buf, &end);
        if (*end) return jr_fail(r, "bad number");
        return 0;
    }
    return jr_fail(r, "unexpected character");
}

int jj_from_json(struct jarena *a, const char *text, size_t len, jv *out, char *msg, size_t msg_size) {
    struct jr r = {text, len, 0, a, msg, msg_size, 0};
    msg[0] = 0;
    int rc = jr_value(&r, out);
    if (rc == -2 || (rc == 0 && a->full)) return -2;
    if (rc) return -1;
    jr_ws(&r);
    if (r.i < r.n) return jr_fail(&r, "extra data after the JSON value");
    return 0;
}

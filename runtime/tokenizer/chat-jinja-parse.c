/*
 * chat-jinja-parse.c - the Jinja lexer and parser of the chat-template
 * interpreter (chat-jinja-impl.h).
 *
 * The lexer follows Jinja's (jinja2/lexer.py) with transformers' settings:
 * newlines (\r\n, \r) become \n and one trailing newline is dropped
 * (keep_trailing_newline off); `{%-` / `{{-` / `{#-` strip all whitespace
 * before the tag and `-%}` / `-}}` / `-#}` all whitespace after it;
 * trim_blocks removes the one newline after `%}` and `#}` (not after `}}`);
 * lstrip_blocks removes the spaces and tabs between the start of a line and a
 * `{%` or `{#` (not `{{`), unless the tag is written `{%+`. The parser is
 * Jinja's grammar (jinja2/parser.py): the same precedence, filters and tests
 * binding tighter than any operator, `if` expressions, tuples, slices, and the
 * statements chat templates use.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat-jinja-impl.h"

/* ---- arena -------------------------------------------------------------- */

struct jchunk {
    struct jchunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char mem[];
};

void *ja_alloc(struct jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    struct jchunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->full || (a->limit && a->total + cap > a->limit)) {
            if (!a->full) a->full = 2; /* over the limit (1: malloc failed) */
            return NULL;
        }
        c = malloc(sizeof *c + cap);
        if (!c) {
            a->full = 1;
            return NULL;
        }
        c->next = a->head, c->used = 0, c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = c->mem + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *ja_strdup(struct jarena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (p) {
        if (n) memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

void ja_free(struct jarena *a) {
    for (struct jchunk *c = a->head, *nx; c; c = nx) {
        nx = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
    a->full = 0;
}

/* ---- names Jinja knows ---------------------------------------------------- */

static int in_list(const char *name, const char *const *list) {
    for (; *list; list++)
        if (strcmp(name, *list) == 0) return 1;
    return 0;
}

int jj_known_filter(const char *name) {
    static const char *const ours[] = {
        "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
        "forceescape", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min",
        "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string",
        "sum", "title", "tojson", "trim", "unique", "upper", "wordcount", NULL};
    static const char *const jinjas[] = {"batch", "center", "filesizeformat", "format", "groupby", "pprint",
                                         "random", "slice", "truncate",
                                         "striptags", "urlencode", "urlize", "wordwrap", "xmlattr", NULL};
    return in_list(name, ours) ? 1 : in_list(name, jinjas) ? 2 : 0;
}

int jj_known_test(const char *name) {
    static const char *const ours[] = {
        "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "float",
        "ge", "gt", "greaterthan", "in", "integer", "iterable", "le", "lower", "lessthan", "lt", "mapping", "ne",
        "none", "number", "odd", "sameas", "sequence", "string", "true", "undefined", "upper", "==", "!=", "<",
        "<=", ">", ">=", NULL};
    static const char *const jinjas[] = {"filter", "test", NULL};
    return in_list(name, ours) ? 1 : in_list(name, jinjas) ? 2 : 0;
}

/* ---- lexer -------------------------------------------------------------- */

enum { TK_EOF, TK_DATA, TK_VBEGIN, TK_VEND, TK_BBEGIN, TK_BEND, TK_NAME, TK_STR, TK_INT, TK_FLOAT, TK_OP };

struct tok {
    int type, line, col;
    const char *s; /* DATA / NAME / STR (unescaped) / OP */
    size_t n;
    int64_t i;
    double f;
};

struct lexer {
    const char *src; /* normalized source */
    size_t len, pos;
    size_t lc_pos; int lc_line, lc_col; /* the line:col cursor (moves forward) */
    struct tok *toks;
    size_t n, cap;
    struct jarena *ar;
    char *err;
    size_t err_size;
    int status;
};

static void linecol(struct lexer *L, size_t pos, int *line, int *col) {
    if (pos < L->lc_pos) L->lc_pos = 0, L->lc_line = 1, L->lc_col = 1;
    for (; L->lc_pos < pos && L->lc_pos < L->len; L->lc_pos++) {
        if (L->src[L->lc_pos] == '\n') L->lc_line++, L->lc_col = 1;
        else if (((unsigned char)L->src[L->lc_pos] & 0xC0) != 0x80) L->lc_col++;
    }
    *line = L->lc_line, *col = L->lc_col;
}

static int lex_fail(struct lexer *L, size_t pos, int status, const char *fmt, ...) {
    int line, col;
    linecol(L, pos, &line, &col);
    int k = snprintf(L->err, L->err_size, "line %d:%d: ", line, col);
    if (k < 0 || (size_t)k >= L->err_size) k = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err + k, L->err_size - (size_t)k, fmt, ap);
    va_end(ap);
    L->status = status;
    return -1;
}

static struct tok *emit(struct lexer *L, int type, size_t pos, const char *s, size_t n) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        struct tok *t = realloc(L->toks, cap * sizeof *t);
        if (!t) {
            lex_fail(L, pos, MOE_ERR_NOMEM, "out of memory");
            return NULL;
        }
        L->toks = t, L->cap = cap;
    }
    struct tok *t = &L->toks[L->n++];
    memset(t, 0, sizeof *t);
    t->type = type, t->s = s, t->n = n;
    linecol(L, pos, &t->line, &t->col);
    return t;
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_name0(unsigned char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* skip_ws: the first position >= p that is not whitespace. */
static size_t skip_ws(const struct lexer *L, size_t p) {
    while (p < L->len && is_ws((unsigned char)L->src[p])) p++;
    return p;
}

/* emit_data: text before a tag, with the tag's whitespace control applied.
 * ctrl: '-', '+' or 0; lstrip: the tag is a block or comment. */
static int emit_data(struct lexer *L, size_t from, size_t to, int ctrl, int lstrip, int line_starting) {
    const char *s = L->src + from;
    size_t n = to - from;
    if (ctrl == '-') {
        while (n && is_ws((unsigned char)s[n - 1])) n--;
    } else if (ctrl != '+' && lstrip) {
        size_t l = n;
        while (l && s[l - 1] != '\n') l--;
        if ((l > 0 || line_starting) && l < n) {
            size_t k = l;
            while (k < n && is_ws((unsigned char)s[k])) k++;
            if (k == n) n = l;
        }
    }
    if (n && !emit(L, TK_DATA, from, s, n)) return -1;
    return 0;
}

/* unescape: a string literal's body with Python's unicode-escape rules (as
 * Jinja decodes it): \n \t \\ \' \" \xHH \uHHHH \UHHHHHHHH \ooo, unknown
 * escapes kept as written. */
static char *unescape(struct lexer *L, size_t pos, const char *s, size_t n, size_t *out_n) {
    char *o = ja_alloc(L->ar, n + 1);
    if (!o) {
        lex_fail(L, pos, MOE_ERR_NOMEM, "out of memory");
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            o[k++] = s[i];
            continue;
        }
        char c = s[++i];
        uint32_t cp = 0;
        int hex = 0;
        switch (c) {
        case '\n': continue;
        case '\\': o[k++] = '\\'; continue;
        case '\'': o[k++] = '\''; continue;
        case '"': o[k++] = '"'; continue;
        case 'a': o[k++] = '\a'; continue;
        case 'b': o[k++] = '\b'; continue;
        case 'f': o[k++] = '\f'; continue;
        case 'n': o[k++] = '\n'; continue;
        case 'r': o[k++] = '\r'; continue;
        case 't': o[k++] = '\t'; continue;
        case 'v': o[k++] = '\v'; continue;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        case 'N':
            lex_fail(L, pos, MOE_ERR_UNSUPPORTED, "unsupported string escape \\N{...}");
            return NULL;
        default:
            if (c >= '0' && c <= '7') {
                int d = 0;
                while (d < 3 && i < n && s[i] >= '0' && s[i] <= '7') cp = cp * 8 + (uint32_t)(s[i++] - '0'), d++;
                i--;
                goto put;
            }
            o[k++] = '\\', o[k++] = c; /* unknown escape: kept */
            continue;
        }
        for (int d = 0; d < hex; d++) {
            char h = i + 1 < n ? s[i + 1] : 0;
            int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (v < 0) {
                lex_fail(L, pos, MOE_ERR_FORMAT, "truncated \\%c escape in a string", c);
                return NULL;
            }
            cp = cp * 16 + (uint32_t)v, i++;
        }
        if (cp > 0x10FFFF) {
            lex_fail(L, pos, MOE_ERR_FORMAT, "illegal Unicode character in a string escape");
            return NULL;
        }
    put: /* UTF-8; n bytes of input always hold the bytes of what they encode */
        if (cp < 0x80) o[k++] = (char)cp;
        else if (cp < 0x800) o[k++] = (char)(0xC0 | cp >> 6), o[k++] = (char)(0x80 | (cp & 63));
        else if (cp < 0x10000)
            o[k++] = (char)(0xE0 | cp >> 12), o[k++] = (char)(0x80 | ((cp >> 6) & 63)), o[k++] = (char)(0x80 | (cp & 63));
        else
            o[k++] = (char)(0xF0 | cp >> 18), o[k++] = (char)(0x80 | ((cp >> 12) & 63)),
            o[k++] = (char)(0x80 | ((cp >> 6) & 63)), o[k++] = (char)(0x80 | (cp & 63));
    }
    o[k] = 0;
    *out_n = k;
    return o;
}

/* lex_number: an integer or float literal at p (underscores allowed between digits). */
static int lex_number(struct lexer *L, size_t *pp, int after_dot) {
    size_t p = *pp, st = p;
    const char *s = L->src;
    char buf[128];
    size_t k = 0;
    int is_float = 0;
    if (s[p] == '0' && p + 1 < L->len && strchr("bBoOxX", s[p + 1])) {
        int base = (s[p + 1] | 32) == 'b' ? 2 : (s[p + 1] | 32) == 'o' ? 8 : 16;
        p += 2;
        while (p < L->len && (isxdigit((unsigned char)s[p]) || s[p] == '_') && k < sizeof buf - 1)
            if (s[p++] != '_') buf[k++] = s[p - 1];
        buf[k] = 0;
        errno = 0;
        char *end;
        long long v = strtoll(buf, &end, base);
        if (!k || *end || errno) return lex_fail(L, st, MOE_ERR_FORMAT, "malformed or too large integer literal");
        struct tok *t = emit(L, TK_INT, st, s + st, p - st);
        if (!t) return -1;
        t->i = v;
        *pp = p;
        return 0;
    }
    while (p < L->len && (is_digit((unsigned char)s[p]) || (s[p] == '_' && p + 1 < L->len && is_digit((unsigned char)s[p + 1]))))
        if (k < sizeof buf - 1 && s[p++] != '_') buf[k++] = s[p - 1];
    if (!after_dot && p + 1 < L->len && s[p] == '.' && is_digit((unsigned char)s[p + 1])) {
        is_float = 1;
        buf[k++] = s[p++];
        while (p < L->len && (is_digit((unsigned char)s[p]) || (s[p] == '_' && p + 1 < L->len && is_digit((unsigned char)s[p + 1]))))
            if (k < sizeof buf - 1 && s[p++] != '_') buf[k++] = s[p - 1];
    }
    if (!after_dot && p < L->len && (s[p] | 32) == 'e') {
        size_t q = p + 1;
        if (q < L->len && (s[q] == '+' || s[q] == '-')) q++;
        if (q < L->len && is_digit((unsigned char)s[q])) {
            is_float = 1;
            if (k < sizeof buf - 1) buf[k++] = 'e';
            for (p++; p < q; p++)
                if (k < sizeof buf - 1) buf[k++] = s[p];
            while (p < L->len && (is_digit((unsigned char)s[p]) || s[p] == '_'))
                if (k < sizeof buf - 1 && s[p++] != '_') buf[k++] = s[p - 1];
        }
    }
    if (k >= sizeof buf - 1) return lex_fail(L, st, MOE_ERR_FORMAT, "number literal too long");
    buf[k] = 0;
    struct tok *t = emit(L, is_float ? TK_FLOAT : TK_INT, st, s + st, p - st);
    if (!t) return -1;
    errno = 0;
    if (is_float) t->f = strtod(buf, NULL);
    else {
        t->i = strtoll(buf, NULL, 10);
        if (errno) return lex_fail(L, st, MOE_ERR_RANGE, "integer literal %s is too large", buf);
    }
    *pp = p;
    return 0;
}

/* lex_tag: the tokens of one {{ }} or {% %} tag starting after its opener at
 * p; returns the position after the closer (and after the whitespace a `-`
 * or trim_blocks removes), or (size_t)-1. */
static size_t lex_tag(struct lexer *L, size_t p, int block, size_t open_pos, int *line_starting) {
    const char *s = L->src;
    char stack[JJ_MAX_DEPTH];
    int depth = 0;
    static const char *const ops2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
    for (;;) {
        p = skip_ws(L, p);
        if (p >= L->len) {
            lex_fail(L, open_pos, MOE_ERR_FORMAT, "unterminated %s: no closing %s", block ? "'{%' tag" : "'{{' expression",
                     block ? "'%}'" : "'}}'");
            return (size_t)-1;
        }
        if (depth == 0) {
            const char *close = block ? "%}" : "}}";
            int minus = s[p] == '-' && p + 2 < L->len + 0 && strncmp(s + p + 1, close, 2) == 0;
            int plus = block && s[p] == '+' && strncmp(s + p + 1, close, 2) == 0;
            if (minus || plus || strncmp(s + p, close, 2) == 0) {
                if (!emit(L, block ? TK_BEND : TK_VEND, p, s + p, 2)) return (size_t)-1;
                size_t q = p + 2 + (size_t)(minus || plus);
                if (minus) q = skip_ws(L, q);
                else if (block && !plus && q < L->len && s[q] == '\n') q++;
                *line_starting = q > 0 && s[q - 1] == '\n' && (minus || (block && !plus));
                return q;
            }
        }
        unsigned char c = (unsigned char)s[p];
        if (is_name0(c)) {
            size_t q = p;
            while (q < L->len && (is_name0((unsigned char)s[q]) || is_digit((unsigned char)s[q]))) q++;
            if (!emit(L, TK_NAME, p, ja_strdup(L->ar, s + p, q - p), q - p)) return (size_t)-1;
            if (!L->toks[L->n - 1].s) {
                lex_fail(L, p, MOE_ERR_NOMEM, "out of memory");
                return (size_t)-1;
            }
            p = q;
        } else if (is_digit(c)) {
            if (lex_number(L, &p, p > 0 && s[p - 1] == '.')) return (size_t)-1;
        } else if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < L->len && s[q] != (char)c) q += s[q] == '\\' ? 2 : 1;
            if (q >= L->len) {
                lex_fail(L, p, MOE_ERR_FORMAT, "unterminated string literal");
                return (size_t)-1;
            }
            size_t n;
            char *v = unescape(L, p, s + p + 1, q - p - 1, &n);
            if (!v || !emit(L, TK_STR, p, v, n)) return (size_t)-1;
            p = q + 1;
        } else {
            size_t n = 0;
            for (int i = 0; ops2[i]; i++)
                if (strncmp(s + p, ops2[i], 2) == 0) n = 2;
            if (!n && strchr("+-/*%~<>()[]{}=.:|,;", c)) n = 1;
            if (!n) {
                lex_fail(L, p, MOE_ERR_FORMAT, "unexpected character '%c' in a tag", c >= 0x20 && c < 0x7f ? c : '?');
                return (size_t)-1;
            }
            if (c == '(' || c == '[' || c == '{') {
                if (depth == JJ_MAX_DEPTH) {
                    lex_fail(L, p, MOE_ERR_RANGE, "brackets nested more than %d deep", JJ_MAX_DEPTH);
                    return (size_t)-1;
                }
                stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
            } else if (c == ')' || c == ']' || c == '}') {
                if (!depth) {
                    lex_fail(L, p, MOE_ERR_FORMAT, "unexpected '%c'", c);
                    return (size_t)-1;
                }
                if (stack[--depth] != (char)c) {
                    lex_fail(L, p, MOE_ERR_FORMAT, "unexpected '%c', expected '%c'", c, stack[depth]);
                    return (size_t)-1;
                }
            }
            if (!emit(L, TK_OP, p, s + p, n)) return (size_t)-1;
            p += n;
        }
    }
}

/* raw_open: `{% raw %}` at p (p at '{'): the position after it, else 0. */
static size_t raw_tag(const struct lexer *L, size_t p, const char *word) {
    const char *s = L->src;
    size_t q = p + 2;
    if (q < L->len && (s[q] == '-' || s[q] == '+')) q++;
    q = skip_ws(L, q);
    size_t wl = strlen(word);
    if (q + wl > L->len || strncmp(s + q, word, wl) != 0) return 0;
    q = skip_ws(L, q + wl);
    if (q < L->len && s[q] == '-' && q + 2 < L->len && strncmp(s + q + 1, "%}", 2) == 0) return skip_ws(L, q + 3);
    if (q < L->len && s[q] == '+' && q + 2 < L->len && strncmp(s + q + 1, "%}", 2) == 0) return q + 3;
    if (q + 2 <= L->len && strncmp(s + q, "%}", 2) == 0) {
        q += 2;
        if (strcmp(word, "endraw") == 0 && q < L->len && s[q] == '\n') q++;
        return q;
    }
    return 0;
}

/* lex: the whole template into L->toks. 0 ok. */
static int lex(struct lexer *L) {
    size_t p = 0;
    int line_starting = 1;
    while (p < L->len) {
        const char *s = L->src;
        size_t t = p;
        while (t + 1 < L->len && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= L->len) {
            if (!emit(L, TK_DATA, p, s + p, L->len - p)) return -1;
            break;
        }
        const char kind = s[t + 1];
        const int ctrl = t + 2 < L->len && (s[t + 2] == '-' || s[t + 2] == '+') ? s[t + 2] : 0;
        if (emit_data(L, p, t, ctrl, kind != '{', line_starting)) return -1;
        size_t body = t + 2 + (ctrl ? 1 : 0), after;
        if (kind == '#') {
            const char *e = NULL;
            for (size_t q = body; q + 1 < L->len && !e; q++)
                if (s[q] == '#' && s[q + 1] == '}') e = s + q;
            if (!e) return lex_fail(L, t, MOE_ERR_FORMAT, "unterminated comment: no closing '#}'");
            size_t q = (size_t)(e - s);
            after = q + 2;
            if (q > body && s[q - 1] == '-') after = skip_ws(L, after);
            else if (!(q > body && s[q - 1] == '+') && after < L->len && s[after] == '\n') after++;
            line_starting = after > 0 && s[after - 1] == '\n';
        } else if (kind == '%' && (after = raw_tag(L, t, "raw")) != 0) {
            size_t q = after, end = 0;
            for (; q + 1 < L->len; q++)
                if (s[q] == '{' && s[q + 1] == '%' && (end = raw_tag(L, q, "endraw")) != 0) break;
            if (!end) return lex_fail(L, t, MOE_ERR_FORMAT, "unterminated raw block: no '{%% endraw %%}'");
            int c2 = s[q + 2] == '-' || s[q + 2] == '+' ? s[q + 2] : 0;
            if (emit_data(L, after, q, c2, 1, 0)) return -1;
            after = end;
            line_starting = after > 0 && s[after - 1] == '\n';
        } else {
            if (!emit(L, kind == '%' ? TK_BBEGIN : TK_VBEGIN, t, s + t, 2)) return -1;
            after = lex_tag(L, body, kind == '%', t, &line_starting);
            if (after == (size_t)-1) return -1;
        }
        p = after;
    }
    return emit(L, TK_EOF, L->len, "", 0) ? 0 : -1;
}

/* ---- parser ------------------------------------------------------------- */

struct parser {
    struct lexer *L;
    struct tok *t;
    size_t i, n;
    int depth;
};

static int perr(struct parser *P, const struct tok *t, int status, const char *fmt, ...) {
    int k = snprintf(P->L->err, P->L->err_size, "line %d:%d: ", t->line, t->col);
    if (k < 0 || (size_t)k >= P->L->err_size) k = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(P->L->err + k, P->L->err_size - (size_t)k, fmt, ap);
    va_end(ap);
    P->L->status = status;
    return -1;
}

static const struct tok *cur(const struct parser *P) { return &P->t[P->i]; }
static const struct tok *peek2(const struct parser *P) { return &P->t[P->i + 1 < P->n ? P->i + 1 : P->i]; }
static const struct tok *adv(struct parser *P) { return &P->t[P->i < P->n - 1 ? P->i++ : P->i]; }
static int is_op(const struct tok *t, const char *op) { return t->type == TK_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n); }
static int is_name(const struct tok *t, const char *w) { return t->type == TK_NAME && strcmp(t->s, w) == 0; }

static const char *tok_desc(const struct tok *t, char *buf, size_t n) {
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_VEND: return "'}}'";
    case TK_BEND: return "'%}'";
    case TK_STR: return "a string";
    case TK_INT: case TK_FLOAT: return "a number";
    default: snprintf(buf, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    }
}

static int expect_op(struct parser *P, const char *op) {
    if (is_op(cur(P), op)) {
        adv(P);
        return 0;
    }
    char b[64];
    return perr(P, cur(P), MOE_ERR_FORMAT, "expected '%s', got %s", op, tok_desc(cur(P), b, sizeof b));
}

static struct jnode *node(struct parser *P, enum jn_kind k, const struct tok *t) {
    struct jnode *n = ja_alloc(P->L->ar, sizeof *n);
    if (!n) {
        perr(P, t, MOE_ERR_NOMEM, "out of memory");
        return NULL;
    }
    n->kind = k, n->line = t->line, n->col = t->col;
    return n;
}

/* a growable array of node pointers in the arena */
struct nvec { struct jnode **v; size_t n, cap; };
static int nv_push(struct parser *P, struct nvec *v, struct jnode *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 4;
        struct jnode **nv = ja_alloc(P->L->ar, cap * sizeof *nv);
        if (!nv) return perr(P, cur(P), MOE_ERR_NOMEM, "out of memory");
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv, v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}

static struct jnode *parse_expression(struct parser *P, int with_cond);
static struct jnode *parse_tuple(struct parser *P, int with_cond, const char *extra_end, int explicit_parens);
static struct jnode *parse_unary(struct parser *P, int with_filter);
static struct jnode *parse_primary(struct parser *P);
static struct jnode *parse_postfix(struct parser *P, struct jnode *n);

static int enter(struct parser *P) {
    if (++P->depth > JJ_MAX_DEPTH) return perr(P, cur(P), MOE_ERR_RANGE, "nested more than %d deep", JJ_MAX_DEPTH);
    return 0;
}

/* parse_call_args: '(' args ')' into n (positional in kids, keywords in names/kids2). */
static int parse_call_args(struct parser *P, struct jnode *n) {
    struct nvec pos = {0}, kwv = {0};
    const char **kw = NULL;
    size_t nkw = 0, capkw = 0;
    if (expect_op(P, "(")) return -1;
    while (!is_op(cur(P), ")")) {
        if (pos.n + nkw && expect_op(P, ",")) return -1;
        if (is_op(cur(P), ")")) break;
        if (is_op(cur(P), "*") || is_op(cur(P), "**"))
            return perr(P, cur(P), MOE_ERR_UNSUPPORTED, "unsupported construct: *args / **kwargs in a call");
        if (cur(P)->type == TK_NAME && is_op(peek2(P), "=")) {
            const char *name = adv(P)->s;
            adv(P);
            struct jnode *v = parse_expression(P, 1);
            if (!v) return -1;
            if (nkw == capkw) {
                capkw = capkw ? 2 * capkw : 4;
                const char **nk = ja_alloc(P->L->ar, capkw * sizeof *nk);
                if (!nk) return perr(P, cur(P), MOE_ERR_NOMEM, "out of memory");
                if (nkw) memcpy(nk, kw, nkw * sizeof *nk);
                kw = nk;
            }
            kw[nkw++] = name;
            if (nv_push(P, &kwv, v)) return -1;
        } else {
            if (nkw) return perr(P, cur(P), MOE_ERR_FORMAT, "a positional argument follows a keyword argument");
            struct jnode *v = parse_expression(P, 1);
            if (!v || nv_push(P, &pos, v)) return -1;
        }
    }
    adv(P);
    n->kids = pos.v, n->n_kids = pos.n, n->kids2 = kwv.v, n->n_kids2 = kwv.n, n->names = kw, n->n_names = nkw;
    return 0;
}

/* dotted_name: name(.name)* as one string (filter and test names). */
static const char *dotted_name(struct parser *P) {
    const struct tok *t = cur(P);
    char b[64];
    if (t->type != TK_NAME) {
        perr(P, t, MOE_ERR_FORMAT, "expected a name, got %s", tok_desc(t, b, sizeof b));
        return NULL;
    }
    adv(P);
    const char *s = t->s;
    while (is_op(cur(P), ".") && peek2(P)->type == TK_NAME) {
        adv(P);
        const char *nx = adv(P)->s;
        size_t a = strlen(s), bl = strlen(nx);
        char *j = ja_alloc(P->L->ar, a + bl + 2);
        if (!j) {
            perr(P, t, MOE_ERR_NOMEM, "out of memory");
            return NULL;
        }
        memcpy(j, s, a), j[a] = '.', memcpy(j + a + 1, nx, bl + 1);
        s = j;
    }
    return s;
}

static struct jnode *parse_filter(struct parser *P, struct jnode *operand, int start_inline) {
    while (is_op(cur(P), "|") || start_inline) {
        if (!start_inline) adv(P);
        start_inline = 0;
        const struct tok *t = cur(P);
        const char *name = dotted_name(P);
        if (!name) return NULL;
        if (!jj_known_filter(name)) {
            perr(P, t, MOE_ERR_UNSUPPORTED, "unknown filter '%s'", name);
            return NULL;
        }
        struct jnode *f = node(P, E_FILTER, t);
        if (!f) return NULL;
        f->a = operand, f->s = name;
        if (is_op(cur(P), "(") && parse_call_args(P, f)) return NULL;
        operand = f;
    }
    return operand;
}

static struct jnode *parse_test(struct parser *P, struct jnode *operand) {
    const struct tok *is = adv(P); /* 'is' */
    struct jnode *n = node(P, E_TEST, is);
    if (!n) return NULL;
    n->a = operand;
    if (is_name(cur(P), "not")) adv(P), n->op = 1;
    const struct tok *t = cur(P);
    const char *name;
    if (t->type == TK_OP && (is_op(t, "==") || is_op(t, "!=") || is_op(t, "<") || is_op(t, "<=") || is_op(t, ">") ||
                             is_op(t, ">="))) {
        name = ja_strdup(P->L->ar, t->s, t->n);
        adv(P);
    } else if (!(name = dotted_name(P))) return NULL;
    if (!name) return NULL;
    if (!jj_known_test(name)) {
        perr(P, t, MOE_ERR_UNSUPPORTED, "unknown test '%s'", name);
        return NULL;
    }
    n->s = name;
    const struct tok *c = cur(P);
    if (is_op(c, "(")) {
        if (parse_call_args(P, n)) return NULL;
    } else if ((c->type == TK_NAME || c->type == TK_STR || c->type == TK_INT || c->type == TK_FLOAT || is_op(c, "[") ||
                is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) {
            perr(P, c, MOE_ERR_FORMAT, "you cannot chain multiple tests with 'is'");
            return NULL;
        }
        struct jnode *arg = parse_primary(P);
        if (!arg || !(arg = parse_postfix(P, arg))) return NULL;
        struct jnode **k = ja_alloc(P->L->ar, sizeof *k);
        if (!k) return NULL;
        k[0] = arg;
        n->kids = k, n->n_kids = 1;
    }
    return n;
}

static struct jnode *parse_subscribed(struct parser *P) {
    const struct tok *t = cur(P);
    struct jnode *args[3] = {NULL, NULL, NULL};
    if (is_op(t, ":")) {
        adv(P);
    } else {
        struct jnode *e = parse_expression(P, 1);
        if (!e) return NULL;
        if (!is_op(cur(P), ":")) return e;
        adv(P);
        args[0] = e;
    }
    if (!is_op(cur(P), ":") && !is_op(cur(P), "]") && !is_op(cur(P), ",")) {
        if (!(args[1] = parse_expression(P, 1))) return NULL;
    }
    if (is_op(cur(P), ":")) {
        adv(P);
        if (!is_op(cur(P), "]") && !is_op(cur(P), ",") && !(args[2] = parse_expression(P, 1))) return NULL;
    }
    struct jnode *s = node(P, E_SLICE, t);
    struct jnode **k = ja_alloc(P->L->ar, 3 * sizeof *k);
    if (!s || !k) return NULL;
    memcpy(k, args, sizeof args);
    s->kids = k, s->n_kids = 3;
    return s;
}

static struct jnode *parse_postfix(struct parser *P, struct jnode *n) {
    for (;;) {
        const struct tok *t = cur(P);
        if (is_op(t, ".")) {
            adv(P);
            const struct tok *a = adv(P);
            struct jnode *x;
            if (a->type == TK_NAME) {
                if (!(x = node(P, E_ATTR, t))) return NULL;
                x->a = n, x->s = a->s;
            } else if (a->type == TK_INT) {
                struct jnode *k = node(P, E_LIT, a);
                if (!k || !(x = node(P, E_ITEM, t))) return NULL;
                k->lit.t = JV_INT, k->lit.u.i = a->i;
                x->a = n, x->b = k;
            } else {
                char b[64];
                perr(P, a, MOE_ERR_FORMAT, "expected a name after '.', got %s", tok_desc(a, b, sizeof b));
                return NULL;
            }
            n = x;
        } else if (is_op(t, "[")) {
            adv(P);
            struct nvec args = {0};
            while (!is_op(cur(P), "]")) {
                if (args.n && expect_op(P, ",")) return NULL;
                if (is_op(cur(P), "]")) break;
                struct jnode *s = parse_subscribed(P);
                if (!s || nv_push(P, &args, s)) return NULL;
            }
            if (expect_op(P, "]")) return NULL;
            if (args.n == 0) {
                perr(P, t, MOE_ERR_FORMAT, "empty subscript");
                return NULL;
            }
            struct jnode *x;
            if (args.n == 1 && args.v[0]->kind == E_SLICE) {
                x = args.v[0];
                x->a = n;
            } else {
                if (!(x = node(P, E_ITEM, t))) return NULL;
                x->a = n;
                if (args.n == 1) x->b = args.v[0];
                else {
                    struct jnode *tu = node(P, E_TUPLE, t);
                    if (!tu) return NULL;
                    tu->kids = args.v, tu->n_kids = args.n;
                    x->b = tu;
                }
            }
            n = x;
        } else if (is_op(t, "(")) {
            struct jnode *c = node(P, E_CALL, t);
            if (!c || parse_call_args(P, c)) return NULL;
            c->a = n, c->line = n->line, c->col = n->col; /* errors point at the callee */
            n = c;
        } else {
            return n;
        }
    }
}

static struct jnode *parse_filter_expr(struct parser *P, struct jnode *n) {
    for (;;) {
        const struct tok *t = cur(P);
        if (is_op(t, "|")) {
            if (!(n = parse_filter(P, n, 0))) return NULL;
        } else if (is_name(t, "is")) {
            if (!(n = parse_test(P, n))) return NULL;
        } else if (is_op(t, "(")) {
            struct jnode *c = node(P, E_CALL, t);
            if (!c || parse_call_args(P, c)) return NULL;
            c->a = n, c->line = n->line, c->col = n->col; /* errors point at the callee */
            n = c;
        } else {
            return n;
        }
    }
}

static struct jnode *parse_seq(struct parser *P, const struct tok *t, int dict) {
    struct nvec keys = {0}, vals = {0};
    const char *close = dict ? "}" : "]";
    while (!is_op(cur(P), close)) {
        if (keys.n && expect_op(P, ",")) return NULL;
        if (is_op(cur(P), close)) break;
        struct jnode *k = parse_expression(P, 1);
        if (!k || nv_push(P, &keys, k)) return NULL;
        if (dict) {
            if (expect_op(P, ":")) return NULL;
            struct jnode *v = parse_expression(P, 1);
            if (!v || nv_push(P, &vals, v)) return NULL;
        }
    }
    if (expect_op(P, close)) return NULL;
    struct jnode *n = node(P, dict ? E_DICT : E_LIST, t);
    if (!n) return NULL;
    n->kids = keys.v, n->n_kids = keys.n, n->kids2 = vals.v, n->n_kids2 = vals.n;
    return n;
}

static struct jnode *parse_primary(struct parser *P) {
    const struct tok *t = cur(P);
    struct jnode *n;
    if (enter(P)) return NULL;
    if (t->type == TK_NAME) {
        adv(P);
        if (!(n = node(P, E_LIT, t))) return NULL;
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) n->lit.t = JV_BOOL, n->lit.u.b = 1;
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) n->lit.t = JV_BOOL, n->lit.u.b = 0;
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) n->lit.t = JV_NONE;
        else n->kind = E_NAME, n->s = t->s;
    } else if (t->type == TK_STR) {
        if (!(n = node(P, E_LIT, t))) return NULL;
        adv(P);
        const char *s = t->s;
        size_t len = t->n;
        while (cur(P)->type == TK_STR) { /* adjacent literals join, as in Python */
            const struct tok *u = adv(P);
            char *j = ja_alloc(P->L->ar, len + u->n + 1);
            if (!j) {
                perr(P, t, MOE_ERR_NOMEM, "out of memory");
                return NULL;
            }
            memcpy(j, s, len), memcpy(j + len, u->s, u->n);
            s = j, len += u->n;
        }
        n->lit.t = JV_STR, n->lit.u.s.p = s, n->lit.u.s.n = len;
    } else if (t->type == TK_INT || t->type == TK_FLOAT) {
        adv(P);
        if (!(n = node(P, E_LIT, t))) return NULL;
        if (t->type == TK_INT) n->lit.t = JV_INT, n->lit.u.i = t->i;
        else n->lit.t = JV_FLOAT, n->lit.u.f = t->f;
    } else if (is_op(t, "(")) {
        adv(P);
        if (!(n = parse_tuple(P, 1, NULL, 1)) || expect_op(P, ")")) return NULL;
    } else if (is_op(t, "[") || is_op(t, "{")) {
        adv(P);
        n = parse_seq(P, t, is_op(t, "{"));
    } else {
        char b[64];
        perr(P, t, MOE_ERR_FORMAT, "unexpected %s", tok_desc(t, b, sizeof b));
        return NULL;
    }
    P->depth--;
    return n;
}

static struct jnode *parse_unary(struct parser *P, int with_filter) {
    const struct tok *t = cur(P);
    struct jnode *n;
    if (enter(P)) return NULL;
    if (is_op(t, "-") || is_op(t, "+")) {
        adv(P);
        if (!(n = node(P, is_op(t, "-") ? E_NEG : E_POS, t)) || !(n->a = parse_unary(P, 0))) return NULL;
    } else if (!(n = parse_primary(P))) {
        return NULL;
    }
    if (!(n = parse_postfix(P, n))) return NULL;
    if (with_filter && !(n = parse_filter_expr(P, n))) return NULL;
    P->depth--;
    return n;
}

static struct jnode *binary(struct parser *P, const struct tok *t, enum jn_kind k, int op, struct jnode *a,
                            struct jnode *b) {
    struct jnode *n = node(P, k, t);
    if (!n) return NULL;
    n->op = op, n->a = a, n->b = b;
    return n;
}

static struct jnode *parse_pow(struct parser *P) {
    struct jnode *l = parse_unary(P, 1);
    while (l && is_op(cur(P), "**")) {
        const struct tok *t = adv(P);
        struct jnode *r = parse_unary(P, 1);
        l = r ? binary(P, t, E_BIN, OP_POW, l, r) : NULL;
    }
    return l;
}

static struct jnode *parse_math2(struct parser *P) {
    struct jnode *l = parse_pow(P);
    for (;;) {
        const struct tok *t = cur(P);
        int op = is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FLOORDIV : is_op(t, "%") ? OP_MOD : -1;
        if (!l || op < 0) return l;
        adv(P);
        struct jnode *r = parse_pow(P);
        l = r ? binary(P, t, E_BIN, op, l, r) : NULL;
    }
}

static struct jnode *parse_concat(struct parser *P) {
    struct jnode *l = parse_math2(P);
    while (l && is_op(cur(P), "~")) {
        const struct tok *t = adv(P);
        struct jnode *r = parse_math2(P);
        l = r ? binary(P, t, E_CONCAT, 0, l, r) : NULL;
    }
    return l;
}

static struct jnode *parse_math1(struct parser *P) {
    struct jnode *l = parse_concat(P);
    for (;;) {
        const struct tok *t = cur(P);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : -1;
        if (!l || op < 0) return l;
        adv(P);
        struct jnode *r = parse_concat(P);
        l = r ? binary(P, t, E_BIN, op, l, r) : NULL;
    }
}

static struct jnode *parse_compare(struct parser *P) {
    struct jnode *first = parse_math1(P);
    if (!first) return NULL;
    struct nvec rest = {0};
    int ops[64], nops = 0;
    const struct tok *t0 = cur(P);
    for (;;) {
        const struct tok *t = cur(P);
        int op = is_op(t, "==") ? OP_EQ : is_op(t, "!=") ? OP_NE : is_op(t, "<") ? OP_LT : is_op(t, "<=") ? OP_LE
               : is_op(t, ">") ? OP_GT : is_op(t, ">=") ? OP_GE : is_name(t, "in") ? OP_IN
               : is_name(t, "not") && is_name(peek2(P), "in") ? OP_NOTIN : -1;
        if (op < 0) break;
        if (nops == 64) {
            perr(P, t, MOE_ERR_RANGE, "more than 64 chained comparisons");
            return NULL;
        }
        adv(P);
        if (op == OP_NOTIN) adv(P);
        struct jnode *r = parse_math1(P);
        if (!r || nv_push(P, &rest, r)) return NULL;
        ops[nops++] = op;
    }
    if (!nops) return first;
    struct jnode *n = node(P, E_CMP, t0);
    int *o = ja_alloc(P->L->ar, sizeof(int) * (size_t)nops);
    if (!n || !o) return NULL;
    memcpy(o, ops, sizeof(int) * (size_t)nops);
    n->a = first, n->kids = rest.v, n->n_kids = rest.n, n->ops = o;
    return n;
}

static struct jnode *parse_not(struct parser *P) {
    const struct tok *t = cur(P);
    if (is_name(t, "not")) {
        adv(P);
        if (enter(P)) return NULL;
        struct jnode *x = parse_not(P);
        P->depth--;
        return x ? binary(P, t, E_NOT, 0, x, NULL) : NULL;
    }
    return parse_compare(P);
}

static struct jnode *parse_and(struct parser *P) {
    struct jnode *l = parse_not(P);
    while (l && is_name(cur(P), "and")) {
        const struct tok *t = adv(P);
        struct jnode *r = parse_not(P);
        l = r ? binary(P, t, E_AND, 0, l, r) : NULL;
    }
    return l;
}

static struct jnode *parse_or(struct parser *P) {
    struct jnode *l = parse_and(P);
    while (l && is_name(cur(P), "or")) {
        const struct tok *t = adv(P);
        struct jnode *r = parse_and(P);
        l = r ? binary(P, t, E_OR, 0, l, r) : NULL;
    }
    return l;
}

static struct jnode *parse_expression(struct parser *P, int with_cond) {
    if (enter(P)) return NULL;
    struct jnode *e = parse_or(P);
    while (with_cond && e && is_name(cur(P), "if")) {
        const struct tok *t = adv(P);
        struct jnode *c = node(P, E_COND, t);
        if (!c || !(c->a = parse_or(P))) return NULL;
        c->b = e;
        if (is_name(cur(P), "else") && (adv(P), !(c->c = parse_expression(P, 1)))) return NULL;
        e = c;
    }
    if (e) P->depth--;
    return e;
}

static int tuple_end(const struct parser *P, const char *extra) {
    const struct tok *t = cur(P);
    return t->type == TK_VEND || t->type == TK_BEND || is_op(t, ")") || t->type == TK_EOF || (extra && is_name(t, extra));
}

static struct jnode *parse_tuple(struct parser *P, int with_cond, const char *extra_end, int explicit_parens) {
    const struct tok *t = cur(P);
    struct nvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n && expect_op(P, ",")) return NULL;
        if (tuple_end(P, extra_end)) break;
        struct jnode *e = parse_expression(P, with_cond);
        if (!e || nv_push(P, &items, e)) return NULL;
        if (is_op(cur(P), ",")) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) {
            char b[64];
            perr(P, cur(P), MOE_ERR_FORMAT, "expected an expression, got %s", tok_desc(cur(P), b, sizeof b));
            return NULL;
        }
    }
    struct jnode *n = node(P, E_TUPLE, t);
    if (!n) return NULL;
    n->kids = items.v, n->n_kids = items.n;
    return n;
}

/* ---- statements --------------------------------------------------------- */

static int parse_body(struct parser *P, const char *const *ends, struct jnode ***kids, size_t *n_kids,
                      const char **which, const struct tok *opener);

static int expect_bend(struct parser *P) {
    if (cur(P)->type == TK_BEND) {
        adv(P);
        return 0;
    }
    char b[64];
    return perr(P, cur(P), MOE_ERR_FORMAT, "expected '%%}', got %s", tok_desc(cur(P), b, sizeof b));
}

/* parse_target: a name, a tuple of names (for, set), or ns.attr (set only). */
static struct jnode *parse_target(struct parser *P, int allow_attr, const char *extra_end) {
    const struct tok *t = cur(P);
    if (allow_attr && t->type == TK_NAME && is_op(peek2(P), ".")) {
        adv(P), adv(P);
        const struct tok *a = adv(P);
        if (a->type != TK_NAME) {
            perr(P, a, MOE_ERR_FORMAT, "expected an attribute name");
            return NULL;
        }
        struct jnode *n = node(P, E_ATTR, t), *o = node(P, E_NAME, t);
        if (!n || !o) return NULL;
        o->s = t->s, n->a = o, n->s = a->s;
        return n;
    }
    struct nvec names = {0};
    int paren = is_op(t, "(");
    if (paren) adv(P);
    for (;;) {
        const struct tok *x = cur(P);
        if (x->type != TK_NAME) {
            char b[64];
            perr(P, x, MOE_ERR_FORMAT, "can't assign to %s", tok_desc(x, b, sizeof b));
            return NULL;
        }
        adv(P);
        struct jnode *nm = node(P, E_NAME, x);
        if (!nm || nv_push(P, &names, nm)) return NULL;
        nm->s = x->s;
        if (!is_op(cur(P), ",")) break;
        adv(P);
        if (tuple_end(P, extra_end) || is_op(cur(P), "=") || is_op(cur(P), ")")) break;
    }
    if (paren && expect_op(P, ")")) return NULL;
    if (names.n == 1 && !paren) return names.v[0];
    struct jnode *tu = node(P, E_TUPLE, t);
    if (!tu) return NULL;
    tu->kids = names.v, tu->n_kids = names.n;
    return tu;
}

static struct jnode *parse_if(struct parser *P, const struct tok *kw) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    struct jnode *n = node(P, N_IF, kw);
    if (!n || !(n->a = parse_tuple(P, 0, NULL, 0)) || expect_bend(P)) return NULL;
    const char *which;
    if (parse_body(P, ends, &n->kids, &n->n_kids, &which, kw)) return NULL;
    if (!strcmp(which, "elif")) {
        const struct tok *t = adv(P);
        struct jnode *e = parse_if(P, t);
        if (!e) return NULL;
        struct jnode **k = ja_alloc(P->L->ar, sizeof *k);
        if (!k) return NULL;
        k[0] = e;
        n->kids2 = k, n->n_kids2 = 1;
        return n; /* the elif consumed the endif */
    }
    if (!strcmp(which, "else")) {
        adv(P);
        static const char *const end2[] = {"endif", NULL};
        if (expect_bend(P) || parse_body(P, end2, &n->kids2, &n->n_kids2, &which, kw)) return NULL;
    }
    adv(P); /* endif */
    return expect_bend(P) ? NULL : n;
}

static struct jnode *parse_for(struct parser *P, const struct tok *kw) {
    static const char *const ends[] = {"else", "endfor", NULL}, *const end2[] = {"endfor", NULL};
    struct jnode *n = node(P, N_FOR, kw), *target;
    if (!n || !(target = parse_target(P, 0, "in"))) return NULL;
    if (!is_name(cur(P), "in")) {
        perr(P, cur(P), MOE_ERR_FORMAT, "expected 'in' in the for tag");
        return NULL;
    }
    adv(P);
    if (target->kind == E_NAME) {
        n->names = ja_alloc(P->L->ar, sizeof *n->names);
        if (!n->names) return NULL;
        n->names[0] = target->s, n->n_names = 1;
    } else {
        n->names = ja_alloc(P->L->ar, target->n_kids * sizeof *n->names);
        if (!n->names) return NULL;
        for (size_t i = 0; i < target->n_kids; i++) n->names[i] = target->kids[i]->s;
        n->n_names = target->n_kids;
    }
    if (!(n->a = parse_tuple(P, 0, "recursive", 0))) return NULL;
    if (is_name(cur(P), "if")) {
        adv(P);
        if (!(n->b = parse_expression(P, 1))) return NULL;
    }
    if (is_name(cur(P), "recursive")) {
        perr(P, cur(P), MOE_ERR_UNSUPPORTED, "unsupported construct: recursive for loops");
        return NULL;
    }
    const char *which;
    if (expect_bend(P) || parse_body(P, ends, &n->kids, &n->n_kids, &which, kw)) return NULL;
    if (!strcmp(which, "else")) {
        adv(P);
        if (expect_bend(P) || parse_body(P, end2, &n->kids2, &n->n_kids2, &which, kw)) return NULL;
    }
    adv(P);
    return expect_bend(P) ? NULL : n;
}

static struct jnode *parse_set(struct parser *P, const struct tok *kw) {
    static const char *const ends[] = {"endset", NULL};
    struct jnode *n = node(P, N_SET, kw);
    if (!n || !(n->a = parse_target(P, 1, NULL))) return NULL;
    if (is_op(cur(P), "=")) {
        adv(P);
        if (!(n->b = parse_tuple(P, 1, NULL, 0))) return NULL;
        return expect_bend(P) ? NULL : n;
    }
    n->kind = N_SETBLOCK;
    if (is_op(cur(P), "|")) {
        perr(P, cur(P), MOE_ERR_UNSUPPORTED, "unsupported construct: a filter on a block set");
        return NULL;
    }
    const char *which;
    if (expect_bend(P) || parse_body(P, ends, &n->kids, &n->n_kids, &which, kw)) return NULL;
    adv(P);
    return expect_bend(P) ? NULL : n;
}

static struct jnode *parse_macro(struct parser *P, const struct tok *kw) {
    static const char *const ends[] = {"endmacro", NULL};
    struct jnode *n = node(P, N_MACRO, kw);
    if (!n) return NULL;
    const struct tok *name = adv(P);
    if (name->type != TK_NAME) {
        perr(P, name, MOE_ERR_FORMAT, "expected the macro's name");
        return NULL;
    }
    n->s = name->s;
    struct nvec defs = {0}, params = {0};
    if (expect_op(P, "(")) return NULL;
    while (!is_op(cur(P), ")")) {
        if (params.n && expect_op(P, ",")) return NULL;
        if (is_op(cur(P), ")")) break;
        const struct tok *p = adv(P);
        if (p->type != TK_NAME) {
            perr(P, p, MOE_ERR_FORMAT, "expected a parameter name");
            return NULL;
        }
        struct jnode *pn = node(P, E_NAME, p), *d = NULL;
        if (!pn) return NULL;
        pn->s = p->s;
        if (is_op(cur(P), "=")) {
            adv(P);
            if (!(d = parse_expression(P, 1))) return NULL;
        }
        if (nv_push(P, &params, pn) || nv_push(P, &defs, d)) return NULL;
    }
    adv(P);
    n->names = ja_alloc(P->L->ar, (params.n + 1) * sizeof *n->names);
    if (!n->names) return NULL;
    for (size_t i = 0; i < params.n; i++) n->names[i] = params.v[i]->s;
    n->n_names = params.n, n->kids2 = defs.v, n->n_kids2 = defs.n;
    const char *which;
    if (expect_bend(P) || parse_body(P, ends, &n->kids, &n->n_kids, &which, kw)) return NULL;
    adv(P);
    if (cur(P)->type == TK_NAME) adv(P); /* {% endmacro name %} */
    return expect_bend(P) ? NULL : n;
}

static struct jnode *parse_statement(struct parser *P) {
    const struct tok *kw = cur(P);
    char b[64];
    if (kw->type != TK_NAME) {
        perr(P, kw, MOE_ERR_FORMAT, "expected a tag name, got %s", tok_desc(kw, b, sizeof b));
        return NULL;
    }
    adv(P);
    if (!strcmp(kw->s, "if")) return parse_if(P, kw);
    if (!strcmp(kw->s, "for")) return parse_for(P, kw);
    if (!strcmp(kw->s, "set")) return parse_set(P, kw);
    if (!strcmp(kw->s, "macro")) return parse_macro(P, kw);
    if (!strcmp(kw->s, "break") || !strcmp(kw->s, "continue")) {
        struct jnode *n = node(P, kw->s[0] == 'b' ? N_BREAK : N_CONTINUE, kw);
        return n && !expect_bend(P) ? n : NULL;
    }
    if (!strcmp(kw->s, "generation")) { /* transformers' AssistantTracker: renders its body */
        static const char *const ends[] = {"endgeneration", NULL};
        struct jnode *n = node(P, N_BODY, kw);
        const char *which;
        if (!n || expect_bend(P) || parse_body(P, ends, &n->kids, &n->n_kids, &which, kw)) return NULL;
        adv(P);
        return expect_bend(P) ? NULL : n;
    }
    if (!strcmp(kw->s, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        struct jnode *n = node(P, N_FILTERBLOCK, kw);
        const char *which;
        if (!n || !(n->b = parse_filter(P, NULL, 1)) || expect_bend(P) ||
            parse_body(P, ends, &n->kids, &n->n_kids, &which, kw))
            return NULL;
        adv(P);
        return expect_bend(P) ? NULL : n;
    }
    static const char *const jinja_tags[] = {"call", "include", "import", "from", "extends", "block", "with",
                                             "autoescape", "do", "trans", "pluralize", NULL};
    if (in_list(kw->s, jinja_tags))
        perr(P, kw, MOE_ERR_UNSUPPORTED, "unsupported tag '%s' (not run by this chat-template interpreter)", kw->s);
    else
        perr(P, kw, MOE_ERR_FORMAT, "unknown tag '%s'", kw->s);
    return NULL;
}

/* parse_body: nodes until a block tag named in ends (left unconsumed after its
 * '{%'; *which names it) or, with ends NULL, the end of the template. */
static int parse_body(struct parser *P, const char *const *ends, struct jnode ***kids, size_t *n_kids,
                      const char **which, const struct tok *opener) {
    struct nvec v = {0};
    if (enter(P)) return -1;
    for (;;) {
        const struct tok *t = cur(P);
        struct jnode *n = NULL;
        if (t->type == TK_EOF) {
            if (ends) {
                return perr(P, opener, MOE_ERR_FORMAT, "unterminated '%s' block: no '{%% %s %%}' before the end of the template",
                            opener->s, ends[ends[1] ? (ends[2] ? 2 : 1) : 0]);
            }
            break;
        }
        if (t->type == TK_DATA) {
            adv(P);
            if (!(n = node(P, N_TEXT, t))) return -1;
            n->s = t->s, n->n = t->n;
        } else if (t->type == TK_VBEGIN) {
            adv(P);
            if (!(n = node(P, N_OUTPUT, t)) || !(n->a = parse_tuple(P, 1, NULL, 0))) return -1;
            if (cur(P)->type != TK_VEND) {
                char b[64];
                return perr(P, cur(P), MOE_ERR_FORMAT, "expected '}}', got %s", tok_desc(cur(P), b, sizeof b));
            }
            adv(P);
        } else if (t->type == TK_BBEGIN) {
            const struct tok *kw = peek2(P);
            if (ends && kw->type == TK_NAME && in_list(kw->s, ends)) {
                adv(P);
                *which = kw->s;
                break;
            }
            if (kw->type == TK_NAME && (!strncmp(kw->s, "end", 3) || !strcmp(kw->s, "else") || !strcmp(kw->s, "elif")))
                return perr(P, kw, MOE_ERR_FORMAT, "unexpected '%s'%s%s", kw->s, ends ? " inside a '" : "",
                            ends ? (opener ? opener->s : "") : "");
            adv(P);
            if (!(n = parse_statement(P))) return -1;
        } else {
            char b[64];
            return perr(P, t, MOE_ERR_FORMAT, "unexpected %s", tok_desc(t, b, sizeof b));
        }
        if (nv_push(P, &v, n)) return -1;
    }
    *kids = v.v, *n_kids = v.n;
    P->depth--;
    return 0;
}

int jj_parse(const char *src, size_t len, struct jarena *a, struct jnode **out, char *err, size_t err_size) {
    struct lexer L = {0};
    L.ar = a, L.err = err, L.err_size = err_size, L.lc_line = 1, L.lc_col = 1;
    err[0] = 0;
    if (len > JJ_MAX_SOURCE) {
        snprintf(err, err_size, "the template is %zu bytes, over the limit of %zu", len, JJ_MAX_SOURCE);
        return MOE_ERR_RANGE;
    }
    /* newlines normalized, one trailing newline dropped (keep_trailing_newline off) */
    char *s = ja_alloc(a, len + 1);
    if (!s) return MOE_ERR_NOMEM;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    L.src = s, L.len = n;
    int rc = 0;
    if (lex(&L)) {
        rc = L.status ? L.status : MOE_ERR_FORMAT;
    } else {
        struct parser P = {&L, L.toks, 0, L.n, 0};
        struct jnode *root = node(&P, N_BODY, &L.toks[0]);
        const char *which = NULL;
        if (!root || parse_body(&P, NULL, &root->kids, &root->n_kids, &which, NULL)) rc = L.status ? L.status : MOE_ERR_FORMAT;
        else *out = root;
    }
    free(L.toks);
    return rc;
}

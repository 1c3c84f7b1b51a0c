/*
 * chat-jinja-eval.c - the evaluator of the chat-template interpreter
 * (chat-jinja-impl.h): values with Python's semantics (truth, equality,
 * ordering, str() and repr()), scopes as Jinja has them (a for block and a
 * macro call open one; if does not; `set` writes the innermost), Jinja's
 * Undefined, and the statements. The filters, tests and methods are in
 * chat-jinja-lib.c.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat-jinja-eval.h"

/* ---- buffers ------------------------------------------------------------ */

int jb_put(struct jbuf *b, const char *s, size_t n) {
    if (b->full) return -1;
    if (b->limit && b->n + n > b->limit) {
        b->full = 1;
        return -1;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->full = 1;
            return -1;
        }
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* ---- errors ------------------------------------------------------------- */

int jfail(struct ctx *C, const struct jnode *n, int status, const char *fmt, ...) {
    if (C->status) return -1; /* the first error stands */
    int k = n ? snprintf(C->err, C->err_size, "line %d:%d: ", n->line, n->col) : 0;
    if (k < 0 || (size_t)k >= C->err_size) k = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(C->err + k, C->err_size - (size_t)k, fmt, ap);
    va_end(ap);
    C->status = status;
    return -1;
}

int jnomem(struct ctx *C, const struct jnode *n) {
    if (C->ar->full == 2)
        return jfail(C, n, MOE_ERR_RANGE, "the render needs more than %zu MiB of memory", JJ_MAX_ARENA >> 20);
    return jfail(C, n, MOE_ERR_NOMEM, "out of memory");
}

/* ---- values ------------------------------------------------------------- */

jv jv_str(struct jarena *a, const char *s, size_t n) {
    jv v = {JV_STR, 0, {0}};
    char *p = ja_strdup(a, s, n);
    v.u.s.p = p ? p : "";
    v.u.s.n = p ? n : 0;
    return v;
}

jv jv_new_list(struct jarena *a) {
    jv v = {JV_LIST, 0, {0}};
    v.u.l = ja_alloc(a, sizeof *v.u.l);
    return v;
}

jv jv_new_dict(struct jarena *a) {
    jv v = {JV_DICT, 0, {0}};
    v.u.d = ja_alloc(a, sizeof *v.u.d);
    return v;
}

int jv_list_push(struct jarena *a, jv *l, jv v) {
    struct jlist *L = l->u.l;
    if (!L) return -1;
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 4;
        jv *nv = ja_alloc(a, cap * sizeof *nv);
        if (!nv) return -1;
        if (L->n) memcpy(nv, L->v, L->n * sizeof *nv);
        L->v = nv, L->cap = cap;
    }
    L->v[L->n++] = v;
    return 0;
}

static int dict_find(const struct jdict *D, const jv *k) {
    for (size_t i = 0; i < D->n; i++)
        if (jv_eq(&D->k[i], k)) return (int)i;
    return -1;
}

int jv_dict_set(struct jarena *a, jv *d, jv k, jv v) {
    struct jdict *D = d->u.d;
    if (!D) return -1;
    int i = dict_find(D, &k);
    if (i >= 0) {
        D->v[i] = v;
        return 0;
    }
    if (D->n == D->cap) {
        size_t cap = D->cap ? 2 * D->cap : 4;
        jv *nk = ja_alloc(a, cap * sizeof *nk), *nv = ja_alloc(a, cap * sizeof *nv);
        if (!nk || !nv) return -1;
        if (D->n) memcpy(nk, D->k, D->n * sizeof *nk), memcpy(nv, D->v, D->n * sizeof *nv);
        D->k = nk, D->v = nv, D->cap = cap;
    }
    D->k[D->n] = k, D->v[D->n++] = v;
    return 0;
}

int jv_dict_get(const jv *d, const char *key, jv *out) {
    if ((d->t != JV_DICT && d->t != JV_NS) || !d->u.d) return 0;
    jv k = {JV_STR, 0, {0}};
    k.u.s.p = key, k.u.s.n = strlen(key);
    int i = dict_find(d->u.d, &k);
    if (i < 0) return 0;
    *out = d->u.d->v[i];
    return 1;
}

jv jv_undef(const char *name, int attr) {
    jv v = {JV_UNDEF, attr, {0}};
    v.u.s.p = name, v.u.s.n = name ? strlen(name) : 0;
    return v;
}

const char *jv_type_name(const jv *v) {
    switch (v->t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v->tuple == 2 ? "generator" : v->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_METHOD: return "builtin_function_or_method";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

int jv_truthy(const jv *v) {
    switch (v->t) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0;
    case JV_STR: return v->u.s.n != 0;
    case JV_LIST: return v->tuple == 2 || (v->u.l && v->u.l->n != 0);
    case JV_DICT: return v->u.d && v->u.d->n != 0;
    default: return 1;
    }
}

int jv_is_num(const jv *v) { return v->t == JV_BOOL || v->t == JV_INT || v->t == JV_FLOAT; }
double jv_num(const jv *v) { return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : v->u.b; }
int64_t jv_int(const jv *v) { return v->t == JV_INT ? v->u.i : v->t == JV_BOOL ? v->u.b : (int64_t)v->u.f; }

int jv_eq(const jv *a, const jv *b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT) return jv_int(a) == jv_int(b);
        return jv_num(a) == jv_num(b);
    }
    if (a->t != b->t) return 0;
    switch (a->t) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case JV_LIST: {
        if (a->tuple != b->tuple) return 0;
        if (a->tuple == 2) return a->u.l == b->u.l;
        size_t n = a->u.l ? a->u.l->n : 0;
        if (n != (b->u.l ? b->u.l->n : 0)) return 0;
        for (size_t i = 0; i < n; i++)
            if (!jv_eq(&a->u.l->v[i], &b->u.l->v[i])) return 0;
        return 1;
    }
    case JV_DICT: {
        size_t n = a->u.d ? a->u.d->n : 0;
        if (n != (b->u.d ? b->u.d->n : 0)) return 0;
        for (size_t i = 0; i < n; i++) {
            int j = dict_find(b->u.d, &a->u.d->k[i]);
            if (j < 0 || !jv_eq(&a->u.d->v[i], &b->u.d->v[j])) return 0;
        }
        return 1;
    }
    case JV_NS: return a->u.d == b->u.d;
    case JV_MACRO: return a->u.mac == b->u.mac;
    case JV_FUNC: return a->u.fn == b->u.fn;
    case JV_LOOP: return a->u.loop == b->u.loop;
    default: return 0;
    }
}

/* jv_cmp: Python's ordering for numbers, strings and sequences; -2 when the
 * types cannot be ordered. */
int jv_cmp(const jv *a, const jv *b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT) {
            int64_t x = jv_int(a), y = jv_int(b);
            return x < y ? -1 : x > y;
        }
        double x = jv_num(a), y = jv_num(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = memcmp(a->u.s.p, b->u.s.p, n);
        if (c) return c < 0 ? -1 : 1;
        return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
    }
    if (a->t == JV_LIST && b->t == JV_LIST && a->tuple == b->tuple && a->tuple != 2) {
        size_t na = a->u.l ? a->u.l->n : 0, nb = b->u.l ? b->u.l->n : 0;
        for (size_t i = 0; i < na && i < nb; i++) {
            if (jv_eq(&a->u.l->v[i], &b->u.l->v[i])) continue;
            return jv_cmp(&a->u.l->v[i], &b->u.l->v[i]);
        }
        return na < nb ? -1 : na > nb;
    }
    return -2;
}

/* ---- str() and repr() --------------------------------------------------- */

size_t jj_repr_float(double f, char *buf) {
    if (isnan(f)) return (size_t)sprintf(buf, "nan");
    if (isinf(f)) return (size_t)sprintf(buf, f < 0 ? "-inf" : "inf");
    char tmp[40];
    int p = 1;
    for (; p <= 17; p++) { /* the shortest digits that read back as f */
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d.ddde[+-]XX -> digits and exponent */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *q = tmp + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int e = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    size_t k = 0;
    if (neg) buf[k++] = '-';
    if (e >= -5 + 1 && e < 16) { /* Python's repr: fixed notation for 1e-4 <= |f| < 1e16 */
        if (e < 0) {
            buf[k++] = '0', buf[k++] = '.';
            for (int i = -1; i > e; i--) buf[k++] = '0';
            for (int i = 0; i < nd; i++) buf[k++] = digits[i];
        } else {
            for (int i = 0; i <= e; i++) buf[k++] = i < nd ? digits[i] : '0';
            buf[k++] = '.';
            if (nd > e + 1)
                for (int i = e + 1; i < nd; i++) buf[k++] = digits[i];
            else
                buf[k++] = '0';
        }
    } else {
        buf[k++] = digits[0];
        if (nd > 1) {
            buf[k++] = '.';
            for (int i = 1; i < nd; i++) buf[k++] = digits[i];
        }
        k += (size_t)sprintf(buf + k, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    buf[k] = 0;
    return k;
}

static int repr_str(struct jbuf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    if (jb_put(b, &q, 1)) return -1;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t cp = ju_decode(s + i, n - i, &len);
        char e[16];
        int el = 0;
        if (cp == (uint32_t)q || cp == '\\') el = sprintf(e, "\\%c", (char)cp);
        else if (cp == '\n') el = sprintf(e, "\\n");
        else if (cp == '\r') el = sprintf(e, "\\r");
        else if (cp == '\t') el = sprintf(e, "\\t");
        else if (cp < 0x20 || cp == 0x7f) el = sprintf(e, "\\x%02x", cp);
        else if (cp >= 0x80 && !ju_printable(cp))
            el = cp < 0x100 ? sprintf(e, "\\x%02x", cp) : cp < 0x10000 ? sprintf(e, "\\u%04x", cp) : sprintf(e, "\\U%08x", cp);
        if (el ? jb_put(b, e, (size_t)el) : jb_put(b, s + i, len)) return -1;
        i += len;
    }
    return jb_put(b, &q, 1);
}

static int put_str(struct jbuf *b, const char *s) { return jb_put(b, s, strlen(s)); }

/* jv_write: str(v) (repr != 0: repr(v), as items of a list or dict print). */
int jv_write(struct jbuf *b, const jv *v, int repr) {
    char num[48];
    switch (v->t) {
    case JV_UNDEF: return repr ? put_str(b, "Undefined") : 0;
    case JV_NONE: return put_str(b, "None");
    case JV_BOOL: return put_str(b, v->u.b ? "True" : "False");
    case JV_INT: return jb_put(b, num, (size_t)sprintf(num, "%lld", (long long)v->u.i));
    case JV_FLOAT: return jb_put(b, num, jj_repr_float(v->u.f, num));
    case JV_STR: return repr ? repr_str(b, v->u.s.p, v->u.s.n) : jb_put(b, v->u.s.p, v->u.s.n);
    case JV_LIST: {
        size_t n = v->u.l ? v->u.l->n : 0;
        if (v->tuple == 2) return put_str(b, "<generator object>");
        if (put_str(b, v->tuple ? "(" : "[")) return -1;
        for (size_t i = 0; i < n; i++)
            if ((i && put_str(b, ", ")) || jv_write(b, &v->u.l->v[i], 1)) return -1;
        if (v->tuple && n == 1 && put_str(b, ",")) return -1;
        return put_str(b, v->tuple ? ")" : "]");
    }
    case JV_DICT: case JV_NS: {
        size_t n = v->u.d ? v->u.d->n : 0;
        if (put_str(b, v->t == JV_NS ? "<Namespace {" : "{")) return -1;
        for (size_t i = 0; i < n; i++)
            if ((i && put_str(b, ", ")) || jv_write(b, &v->u.d->k[i], 1) || put_str(b, ": ") ||
                jv_write(b, &v->u.d->v[i], 1))
                return -1;
        return put_str(b, v->t == JV_NS ? "}>" : "}");
    }
    case JV_MACRO: return put_str(b, "<Macro>");
    case JV_FUNC: return put_str(b, "<function>");
    case JV_METHOD: return put_str(b, "<built-in method>");
    case JV_LOOP: return put_str(b, "<LoopContext>");
    }
    return 0;
}

/* jv_to_str: str(v) as a string value (no copy for strings). */
int jv_to_str(struct ctx *C, const struct jnode *n, const jv *v, jv *out) {
    if (v->t == JV_STR) {
        *out = *v;
        return 0;
    }
    struct jbuf b = {0};
    b.limit = JJ_MAX_OUTPUT;
    if (jv_write(&b, v, 0)) {
        free(b.p);
        return b.full && b.n + 1 > JJ_MAX_OUTPUT ? jfail(C, n, MOE_ERR_RANGE, "a string over %zu MiB", JJ_MAX_OUTPUT >> 20)
                                                  : jnomem(C, n);
    }
    *out = jv_str(C->ar, b.p ? b.p : "", b.n);
    free(b.p);
    return C->ar->full ? jnomem(C, n) : 0;
}

/* ---- UTF-8 -------------------------------------------------------------- */

uint32_t ju_decode(const char *s, size_t n, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) {
        *len = 1;
        return u[0];
    }
    int k = u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 1;
    if (k == 1 || (size_t)k > n) {
        *len = 1;
        return u[0];
    }
    uint32_t cp = u[0] & (0x7F >> k);
    for (int i = 1; i < k; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *len = 1;
            return u[0];
        }
        cp = cp << 6 | (u[i] & 63);
    }
    *len = (size_t)k;
    return cp;
}

size_t ju_encode(uint32_t cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 63)), o[2] = (char)(0x80 | (cp & 63)), 3;
    return o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 63)), o[2] = (char)(0x80 | ((cp >> 6) & 63)),
           o[3] = (char)(0x80 | (cp & 63)), 4;
}

/* ju_count: the number of code points (Python's len). */
size_t ju_count(const char *s, size_t n) {
    size_t c = 0, len;
    for (size_t i = 0; i < n; i += len, c++) ju_decode(s + i, n - i, &len);
    return c;
}

/* ju_offsets: the byte offset of every code point, plus n at the end (arena). */
size_t *ju_offsets(struct jarena *a, const char *s, size_t n, size_t *count) {
    size_t c = ju_count(s, n), len, k = 0;
    size_t *o = ja_alloc(a, (c + 1) * sizeof *o);
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += len) {
        o[k++] = i;
        ju_decode(s + i, n - i, &len);
    }
    o[k] = n;
    *count = c;
    return o;
}

/* ---- scopes ------------------------------------------------------------- */

static struct scope *scope_push(struct ctx *C, struct scope *parent) {
    struct scope *s = ja_alloc(C->ar, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

int scope_set(struct ctx *C, struct scope *s, const char *name, jv v) {
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return 0;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8;
        const char **nn = ja_alloc(C->ar, cap * sizeof *nn);
        jv *nv = ja_alloc(C->ar, cap * sizeof *nv);
        if (!nn || !nv) return -1;
        if (s->n) memcpy(nn, s->names, s->n * sizeof *nn), memcpy(nv, s->vals, s->n * sizeof *nv);
        s->names = nn, s->vals = nv, s->cap = cap;
    }
    s->names[s->n] = name, s->vals[s->n++] = v;
    return 0;
}

static int scope_get(const struct scope *s, const char *name, jv *out) {
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (!strcmp(s->names[i], name)) {
                *out = s->vals[i];
                return 1;
            }
    return 0;
}

/* the global functions */
static const char *const k_funcs[] = {"raise_exception", "strftime_now", "namespace", "dict", "range", NULL};
enum { F_RAISE, F_STRFTIME, F_NAMESPACE, F_DICT, F_RANGE };

/* ---- expressions -------------------------------------------------------- */

int step(struct ctx *C, const struct jnode *n) {
    if (++C->steps > JJ_MAX_STEPS)
        return jfail(C, n, MOE_ERR_RANGE, "the template ran more than %ld steps (an endless or huge loop?)", JJ_MAX_STEPS);
    return 0;
}

static int undefined_error(struct ctx *C, const struct jnode *n, const jv *u) {
    if (u->tuple && u->u.s.p) return jfail(C, n, MOE_ERR_INVALID, "'dict object' has no attribute '%s'", u->u.s.p);
    if (u->u.s.p) return jfail(C, n, MOE_ERR_INVALID, "'%s' is undefined", u->u.s.p);
    return jfail(C, n, MOE_ERR_INVALID, "an undefined value was used");
}

static int eval_args(struct ctx *C, const struct jnode *n, jv **args, jv **kw) {
    *args = n->n_kids ? ja_alloc(C->ar, n->n_kids * sizeof **args) : NULL;
    *kw = n->n_kids2 ? ja_alloc(C->ar, n->n_kids2 * sizeof **kw) : NULL;
    if ((n->n_kids && !*args) || (n->n_kids2 && !*kw)) return jnomem(C, n);
    for (size_t i = 0; i < n->n_kids; i++)
        if (jeval(C, n->kids[i], &(*args)[i])) return -1;
    for (size_t i = 0; i < n->n_kids2; i++)
        if (jeval(C, n->kids2[i], &(*kw)[i])) return -1;
    return 0;
}

static int arith(struct ctx *C, const struct jnode *n, int op, const jv *a, const jv *b, jv *out) {
    if (a->t == JV_UNDEF) return undefined_error(C, n, a);
    if (b->t == JV_UNDEF) return undefined_error(C, n, b);
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (jv_is_num(a) && jv_is_num(b)) {
        int ints = a->t != JV_FLOAT && b->t != JV_FLOAT;
        int64_t x = jv_int(a), y = jv_int(b), r = 0;
        double fx = jv_num(a), fy = jv_num(b);
        if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && (ints ? y == 0 : fy == 0))
            return jfail(C, n, MOE_ERR_INVALID, "division by zero");
        if (op == OP_DIV) {
            out->t = JV_FLOAT, out->u.f = fx / fy;
            return 0;
        }
        if (ints) {
            int ovf = 0;
            switch (op) {
            case OP_ADD: ovf = __builtin_add_overflow(x, y, &r); break;
            case OP_SUB: ovf = __builtin_sub_overflow(x, y, &r); break;
            case OP_MUL: ovf = __builtin_mul_overflow(x, y, &r); break;
            case OP_FLOORDIV:
                if (x == INT64_MIN && y == -1) ovf = 1;
                else r = x / y - ((x % y != 0) && ((x < 0) != (y < 0)));
                break;
            case OP_MOD:
                if (y == -1) r = 0;
                else {
                    r = x % y;
                    if (r != 0 && ((r < 0) != (y < 0))) r += y;
                }
                break;
            case OP_POW:
                if (y < 0) {
                    out->t = JV_FLOAT, out->u.f = pow(fx, fy);
                    return 0;
                }
                r = 1;
                for (int64_t i = 0; i < y && !ovf; i++) {
                    ovf = __builtin_mul_overflow(r, x, &r);
                    if (r == 0 || r == 1) break;
                }
                if (!ovf && r == 1 && x == -1) r = (y % 2) ? -1 : 1;
                break;
            }
            if (ovf) return jfail(C, n, MOE_ERR_RANGE, "integer overflow in '%s'", sym[op]);
            out->t = JV_INT, out->u.i = r;
            return 0;
        }
        double f = 0;
        switch (op) {
        case OP_ADD: f = fx + fy; break;
        case OP_SUB: f = fx - fy; break;
        case OP_MUL: f = fx * fy; break;
        case OP_FLOORDIV: f = floor(fx / fy); break;
        case OP_MOD: f = fmod(fx, fy); if (f != 0 && ((f < 0) != (fy < 0))) f += fy; break;
        case OP_POW: f = pow(fx, fy); break;
        }
        out->t = JV_FLOAT, out->u.f = f, out->tuple = 0;
        return 0;
    }
    if (op == OP_ADD && a->t == JV_STR && b->t == JV_STR && (a->tuple == 1) != (b->tuple == 1)) {
        /* Markup + str: the str is escaped first, the result is Markup */
        jv esc, ma = *a, mb = *b;
        if (jlib_filter(C, n, "escape", a->tuple == 1 ? b : a, NULL, 0, NULL, NULL, 0, &esc)) return -1;
        if (a->tuple == 1) mb = esc;
        else ma = esc;
        ma.tuple = mb.tuple = 0;
        if (arith(C, n, op, &ma, &mb, out)) return -1;
        out->tuple = 1;
        return 0;
    }
    if (op == OP_ADD && a->t == JV_STR && b->t == JV_STR) {
        char *p = ja_alloc(C->ar, a->u.s.n + b->u.s.n + 1);
        if (!p) return jnomem(C, n);
        memcpy(p, a->u.s.p, a->u.s.n), memcpy(p + a->u.s.n, b->u.s.p, b->u.s.n);
        out->t = JV_STR, out->tuple = a->tuple == 1, out->u.s.p = p, out->u.s.n = a->u.s.n + b->u.s.n;
        return 0;
    }
    if (op == OP_ADD && a->t == JV_LIST && b->t == JV_LIST && a->tuple == b->tuple && a->tuple != 2) {
        jv l = jv_new_list(C->ar);
        l.tuple = a->tuple;
        for (size_t i = 0; a->u.l && i < a->u.l->n; i++)
            if (jv_list_push(C->ar, &l, a->u.l->v[i])) return jnomem(C, n);
        for (size_t i = 0; b->u.l && i < b->u.l->n; i++)
            if (jv_list_push(C->ar, &l, b->u.l->v[i])) return jnomem(C, n);
        *out = l;
        return 0;
    }
    if (op == OP_MUL && ((a->t == JV_STR || a->t == JV_LIST) && (b->t == JV_INT || b->t == JV_BOOL))) {
        int64_t k = jv_int(b);
        if (a->t == JV_STR) {
            size_t tot = k > 0 ? a->u.s.n * (size_t)k : 0;
            if (k > 0 && (tot / (size_t)k != a->u.s.n || tot > JJ_MAX_OUTPUT))
                return jfail(C, n, MOE_ERR_RANGE, "a repeated string over %zu MiB", JJ_MAX_OUTPUT >> 20);
            char *p = ja_alloc(C->ar, tot + 1);
            if (!p) return jnomem(C, n);
            for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * a->u.s.n, a->u.s.p, a->u.s.n);
            out->t = JV_STR, out->tuple = 0, out->u.s.p = p, out->u.s.n = tot;
            return 0;
        }
        jv l = jv_new_list(C->ar);
        l.tuple = a->tuple;
        size_t m = a->u.l ? a->u.l->n : 0;
        if (k > 0 && m && (uint64_t)k * m > JJ_MAX_RANGE * 10) return jfail(C, n, MOE_ERR_RANGE, "a repeated list too long");
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < m; j++)
                if (jv_list_push(C->ar, &l, a->u.l->v[j])) return jnomem(C, n);
        *out = l;
        return 0;
    }
    if (op == OP_MUL && (b->t == JV_STR || b->t == JV_LIST) && (a->t == JV_INT || a->t == JV_BOOL))
        return arith(C, n, op, b, a, out);
    if (op == OP_MOD && a->t == JV_STR)
        return jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported construct: printf-style string formatting ('%%')");
    if (op == OP_ADD && a->t == JV_STR)
        return jfail(C, n, MOE_ERR_INVALID, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
    return jfail(C, n, MOE_ERR_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], jv_type_name(a),
                 jv_type_name(b));
}

/* contains: `x in seq`. 1/0, -1 after an error. */
static int contains(struct ctx *C, const struct jnode *n, const jv *x, const jv *seq) {
    switch (seq->t) {
    case JV_UNDEF: return 0;
    case JV_STR:
        if (x->t != JV_STR)
            return jfail(C, n, MOE_ERR_INVALID, "'in <string>' requires string as left operand, not %s", jv_type_name(x));
        if (x->u.s.n == 0) return 1;
        for (size_t i = 0; i + x->u.s.n <= seq->u.s.n; i++)
            if (!memcmp(seq->u.s.p + i, x->u.s.p, x->u.s.n)) return 1;
        return 0;
    case JV_LIST:
        for (size_t i = 0; seq->u.l && i < seq->u.l->n; i++)
            if (jv_eq(x, &seq->u.l->v[i])) return 1;
        return 0;
    case JV_DICT:
        return seq->u.d && dict_find(seq->u.d, x) >= 0;
    default:
        return jfail(C, n, MOE_ERR_INVALID, "argument of type '%s' is not iterable", jv_type_name(seq));
    }
}

int jcompare(struct ctx *C, const struct jnode *n, int op, const jv *a, const jv *b) {
    switch (op) {
    case OP_EQ: return jv_eq(a, b);
    case OP_NE: return !jv_eq(a, b);
    case OP_IN: return contains(C, n, a, b);
    case OP_NOTIN: {
        int r = contains(C, n, a, b);
        return r < 0 ? r : !r;
    }
    }
    if (a->t == JV_UNDEF) return undefined_error(C, n, a);
    if (b->t == JV_UNDEF) return undefined_error(C, n, b);
    int c = jv_cmp(a, b);
    static const char *const sym[] = {"<", "<=", ">", ">="};
    if (c == -2)
        return jfail(C, n, MOE_ERR_INVALID, "'%s' not supported between instances of '%s' and '%s'", sym[op - OP_LT],
                     jv_type_name(a), jv_type_name(b));
    return op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
}

/* jgetattr: obj.name as Jinja's sandbox does it: an attribute (a method),
 * else an item, else undefined. */
int jgetattr(struct ctx *C, const struct jnode *n, const jv *obj, const char *name, int items, jv *out) {
    switch (obj->t) {
    case JV_UNDEF: return undefined_error(C, n, obj);
    case JV_DICT:
        if (jlib_is_method(obj, name)) break;
        if (items && jv_dict_get(obj, name, out)) return 0;
        *out = jv_undef(name, 1);
        return 0;
    case JV_NS:
        if (jv_dict_get(obj, name, out)) return 0;
        *out = jv_undef(name, 0);
        return 0;
    case JV_LOOP: {
        const struct jloop *L = obj->u.loop;
        const size_t i = L->index0, len = L->length;
        out->tuple = 0;
        if (!strcmp(name, "index")) out->t = JV_INT, out->u.i = (int64_t)i + 1;
        else if (!strcmp(name, "index0")) out->t = JV_INT, out->u.i = (int64_t)i;
        else if (!strcmp(name, "revindex")) out->t = JV_INT, out->u.i = (int64_t)(len - i);
        else if (!strcmp(name, "revindex0")) out->t = JV_INT, out->u.i = (int64_t)(len - i - 1);
        else if (!strcmp(name, "first")) out->t = JV_BOOL, out->u.b = i == 0;
        else if (!strcmp(name, "last")) out->t = JV_BOOL, out->u.b = i + 1 == len;
        else if (!strcmp(name, "length")) out->t = JV_INT, out->u.i = (int64_t)len;
        else if (!strcmp(name, "depth")) out->t = JV_INT, out->u.i = 1;
        else if (!strcmp(name, "depth0")) out->t = JV_INT, out->u.i = 0;
        else if (!strcmp(name, "previtem")) *out = i > 0 ? L->items->v[i - 1] : jv_undef("previtem", 0);
        else if (!strcmp(name, "nextitem")) *out = i + 1 < len ? L->items->v[i + 1] : jv_undef("nextitem", 0);
        else if (!strcmp(name, "cycle")) break;
        else if (!strcmp(name, "changed"))
            return jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported construct: loop.changed");
        else *out = jv_undef(name, 0);
        return 0;
    }
    default:
        if (jlib_is_method(obj, name)) break;
        *out = jv_undef(name, 0);
        return 0;
    }
    jv *self = ja_alloc(C->ar, sizeof *self);
    if (!self) return jnomem(C, n);
    *self = *obj;
    out->t = JV_METHOD, out->tuple = 0, out->u.meth.self = self, out->u.meth.name = name;
    return 0;
}

/* norm_index: Python's index i of a sequence of length len; 0 out of range. */
static int norm_index(int64_t i, size_t len, size_t *out) {
    if (i < 0) i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len) return 0;
    *out = (size_t)i;
    return 1;
}

/* jgetitem: obj[key] as Jinja does it: an item, else (a string key) an attribute. */
int jgetitem(struct ctx *C, const struct jnode *n, const jv *obj, const jv *key, jv *out) {
    size_t i;
    switch (obj->t) {
    case JV_UNDEF: return undefined_error(C, n, obj);
    case JV_DICT: {
        int k = obj->u.d ? dict_find(obj->u.d, key) : -1;
        if (k >= 0) {
            *out = obj->u.d->v[k];
            return 0;
        }
        break;
    }
    case JV_LIST:
        if (obj->tuple == 2) return jfail(C, n, MOE_ERR_INVALID, "'generator' object is not subscriptable");
        if ((key->t == JV_INT || key->t == JV_BOOL)) {
            if (norm_index(jv_int(key), obj->u.l ? obj->u.l->n : 0, &i)) *out = obj->u.l->v[i];
            else *out = jv_undef(NULL, 0);
            return 0;
        }
        break;
    case JV_STR:
        if (key->t == JV_INT || key->t == JV_BOOL) {
            size_t cnt, *off = ju_offsets(C->ar, obj->u.s.p, obj->u.s.n, &cnt);
            if (!off) return jnomem(C, n);
            if (norm_index(jv_int(key), cnt, &i)) *out = jv_str(C->ar, obj->u.s.p + off[i], off[i + 1] - off[i]);
            else *out = jv_undef(NULL, 0);
            return 0;
        }
        break;
    default: break;
    }
    if (key->t == JV_STR) return jgetattr(C, n, obj, ja_strdup(C->ar, key->u.s.p, key->u.s.n), obj->t != JV_DICT, out);
    *out = jv_undef(NULL, 0);
    return 0;
}

/* slice_bound: a slice index (None = absent). */
static int slice_arg(struct ctx *C, const struct jnode *n, const jv *v, int *has, int64_t *x) {
    *has = 0;
    if (v->t == JV_NONE || v->t == JV_UNDEF) return 0;
    if (v->t != JV_INT && v->t != JV_BOOL)
        return jfail(C, n, MOE_ERR_INVALID, "slice indices must be integers or None, not %s", jv_type_name(v));
    *has = 1, *x = jv_int(v);
    return 0;
}

/* python_slice: the indices a[start:stop:step] selects, as Python computes them. */
static size_t slice_indices(int64_t len, int hs, int64_t start, int he, int64_t stop, int64_t stepv, int64_t *first) {
    if (stepv > 0) {
        start = !hs ? 0 : start < 0 ? (start + len < 0 ? 0 : start + len) : (start > len ? len : start);
        stop = !he ? len : stop < 0 ? (stop + len < 0 ? 0 : stop + len) : (stop > len ? len : stop);
        *first = start;
        return stop > start ? (size_t)((stop - start + stepv - 1) / stepv) : 0;
    }
    start = !hs ? len - 1 : start < 0 ? (start + len < 0 ? -1 : start + len) : (start >= len ? len - 1 : start);
    stop = !he ? -1 : stop < 0 ? (stop + len < 0 ? -1 : stop + len) : (stop >= len ? len - 1 : stop);
    *first = start;
    return start > stop ? (size_t)((start - stop - stepv - 1) / -stepv) : 0;
}

int jslice(struct ctx *C, const struct jnode *n, const jv *obj, const jv *a, const jv *b, const jv *c, jv *out) {
    int hs, he, hst;
    int64_t s = 0, e = 0, st = 1;
    if (slice_arg(C, n, a, &hs, &s) || slice_arg(C, n, b, &he, &e) || slice_arg(C, n, c, &hst, &st)) return -1;
    if (!hst) st = 1;
    if (st == 0) return jfail(C, n, MOE_ERR_INVALID, "slice step cannot be zero");
    if (obj->t == JV_UNDEF) return undefined_error(C, n, obj);
    if (obj->t == JV_LIST && obj->tuple != 2) {
        int64_t first;
        size_t cnt = slice_indices(obj->u.l ? (int64_t)obj->u.l->n : 0, hs, s, he, e, st, &first);
        jv l = jv_new_list(C->ar);
        l.tuple = obj->tuple;
        if (!l.u.l) return jnomem(C, n);
        for (size_t k = 0; k < cnt; k++)
            if (jv_list_push(C->ar, &l, obj->u.l->v[first + (int64_t)k * st])) return jnomem(C, n);
        *out = l;
        return 0;
    }
    if (obj->t == JV_STR) {
        size_t len, *off = ju_offsets(C->ar, obj->u.s.p, obj->u.s.n, &len);
        if (!off) return jnomem(C, n);
        int64_t first;
        size_t cnt = slice_indices((int64_t)len, hs, s, he, e, st, &first);
        if (st == 1) {
            size_t b0 = cnt ? off[first] : 0, b1 = cnt ? off[first + (int64_t)cnt] : 0;
            *out = jv_str(C->ar, obj->u.s.p + b0, b1 - b0);
            return C->ar->full ? jnomem(C, n) : 0;
        }
        char *p = ja_alloc(C->ar, obj->u.s.n + 1);
        if (!p) return jnomem(C, n);
        size_t k = 0;
        for (size_t j = 0; j < cnt; j++) {
            int64_t idx = first + (int64_t)j * st;
            memcpy(p + k, obj->u.s.p + off[idx], off[idx + 1] - off[idx]);
            k += off[idx + 1] - off[idx];
        }
        out->t = JV_STR, out->tuple = 0, out->u.s.p = p, out->u.s.n = k;
        return 0;
    }
    return jfail(C, n, MOE_ERR_INVALID, "'%s' object is not subscriptable", jv_type_name(obj));
}

/* jiter: the items a for loop or a filter walks: a list's items, a dict's
 * keys, a string's characters; undefined is empty. */
int jiter(struct ctx *C, const struct jnode *n, const jv *v, jv *out) {
    switch (v->t) {
    case JV_LIST: *out = *v; out->tuple = 0; return 0;
    case JV_UNDEF: *out = jv_new_list(C->ar); return out->u.l ? 0 : jnomem(C, n);
    case JV_DICT: {
        jv l = jv_new_list(C->ar);
        if (!l.u.l) return jnomem(C, n);
        for (size_t i = 0; v->u.d && i < v->u.d->n; i++)
            if (jv_list_push(C->ar, &l, v->u.d->k[i])) return jnomem(C, n);
        *out = l;
        return 0;
    }
    case JV_STR: {
        jv l = jv_new_list(C->ar);
        if (!l.u.l) return jnomem(C, n);
        size_t len;
        for (size_t i = 0; i < v->u.s.n; i += len) {
            ju_decode(v->u.s.p + i, v->u.s.n - i, &len);
            if (jv_list_push(C->ar, &l, jv_str(C->ar, v->u.s.p + i, len))) return jnomem(C, n);
        }
        *out = l;
        return 0;
    }
    default: return jfail(C, n, MOE_ERR_INVALID, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* call_macro: a macro's body rendered with its arguments bound. */
static int call_macro(struct ctx *C, const struct jnode *n, const struct jmacro *M, const jv *args, size_t na,
                      const char *const *kwn, const jv *kw, size_t nk, jv *out) {
    const struct jnode *m = M->n;
    if (na > m->n_names)
        return jfail(C, n, MOE_ERR_INVALID, "macro '%s' takes not more than %zu argument(s)", m->s, m->n_names);
    if (C->depth >= JJ_MAX_DEPTH) return jfail(C, n, MOE_ERR_RANGE, "macro calls nested more than %d deep", JJ_MAX_DEPTH);
    struct scope *sc = scope_push(C, M->sc);
    if (!sc) return jnomem(C, n);
    struct scope *saved = C->sc;
    C->sc = sc;
    for (size_t k = 0; k < nk; k++) {
        size_t p = 0;
        while (p < m->n_names && strcmp(m->names[p], kwn[k])) p++;
        if (p == m->n_names) {
            C->sc = saved;
            return jfail(C, n, MOE_ERR_INVALID, "macro '%s' takes no keyword argument '%s'", m->s, kwn[k]);
        }
        if (p < na) {
            C->sc = saved;
            return jfail(C, n, MOE_ERR_INVALID, "macro '%s' got multiple values for argument '%s'", m->s, kwn[k]);
        }
    }
    for (size_t p = 0; p < m->n_names; p++) {
        jv v = jv_undef(m->names[p], 0);
        int given = 0;
        if (p < na) v = args[p], given = 1;
        for (size_t k = 0; k < nk && !given; k++)
            if (!strcmp(kwn[k], m->names[p])) v = kw[k], given = 1;
        if (!given && m->kids2[p] && jeval(C, m->kids2[p], &v)) {
            C->sc = saved;
            return -1;
        }
        if (scope_set(C, sc, m->names[p], v)) {
            C->sc = saved;
            return jnomem(C, n);
        }
    }
    struct jbuf *saved_out = C->out, b = {0};
    b.limit = JJ_MAX_OUTPUT;
    int saved_loops = C->loops;
    C->out = &b, C->depth++, C->loops = 0;
    int rc = jexec(C, m->kids, m->n_kids);
    C->out = saved_out, C->depth--, C->sc = saved, C->loops = saved_loops;
    if (!rc) {
        *out = jv_str(C->ar, b.p ? b.p : "", b.n);
        if (C->ar->full) rc = jnomem(C, n);
    }
    free(b.p);
    return rc;
}

static int call_func(struct ctx *C, const struct jnode *n, int fn, const jv *args, size_t na, const char *const *kwn,
                     const jv *kw, size_t nk, jv *out) {
    switch (fn) {
    case F_RAISE: {
        jv s = jv_undef(NULL, 0);
        if (na && jv_to_str(C, n, &args[0], &s)) return -1;
        return jfail(C, n, MOE_ERR_INVALID, "raise_exception: %.*s", (int)s.u.s.n, s.u.s.p ? s.u.s.p : "");
    }
    case F_STRFTIME: {
        if (na != 1 || args[0].t != JV_STR) return jfail(C, n, MOE_ERR_INVALID, "strftime_now expects one format string");
        time_t t = C->now >= 0 ? (time_t)C->now : time(NULL);
        struct tm tm;
        localtime_r(&t, &tm);
        char fmt[256], buf[512];
        if (args[0].u.s.n >= sizeof fmt) return jfail(C, n, MOE_ERR_RANGE, "strftime_now: format too long");
        memcpy(fmt, args[0].u.s.p, args[0].u.s.n);
        fmt[args[0].u.s.n] = 0;
        size_t len = strftime(buf, sizeof buf, fmt, &tm);
        *out = jv_str(C->ar, buf, len);
        return 0;
    }
    case F_NAMESPACE: case F_DICT: {
        jv d = jv_new_dict(C->ar);
        if (!d.u.d) return jnomem(C, n);
        if (na > 1) return jfail(C, n, MOE_ERR_INVALID, "%s() takes at most one positional argument", k_funcs[fn]);
        if (na == 1) {
            if (args[0].t == JV_DICT || args[0].t == JV_NS) {
                for (size_t i = 0; args[0].u.d && i < args[0].u.d->n; i++)
                    if (jv_dict_set(C->ar, &d, args[0].u.d->k[i], args[0].u.d->v[i])) return jnomem(C, n);
            } else if (args[0].t == JV_LIST) {
                for (size_t i = 0; args[0].u.l && i < args[0].u.l->n; i++) {
                    const jv *p = &args[0].u.l->v[i];
                    if (p->t != JV_LIST || !p->u.l || p->u.l->n != 2)
                        return jfail(C, n, MOE_ERR_INVALID, "%s(): sequence items must be pairs", k_funcs[fn]);
                    if (jv_dict_set(C->ar, &d, p->u.l->v[0], p->u.l->v[1])) return jnomem(C, n);
                }
            } else if (args[0].t != JV_UNDEF) {
                return jfail(C, n, MOE_ERR_INVALID, "%s(): cannot convert '%s' to a mapping", k_funcs[fn], jv_type_name(&args[0]));
            }
        }
        for (size_t k = 0; k < nk; k++)
            if (jv_dict_set(C->ar, &d, jv_str(C->ar, kwn[k], strlen(kwn[k])), kw[k])) return jnomem(C, n);
        if (fn == F_NAMESPACE) {
            for (size_t i = 0; i < d.u.d->n; i++)
                if (d.u.d->k[i].t == JV_STR && d.u.d->k[i].u.s.n && d.u.d->k[i].u.s.p[0] == '_')
                    return jfail(C, n, MOE_ERR_INVALID, "chat templates cannot store underscore-prefixed attributes on a namespace");
            d.t = JV_NS;
        }
        *out = d;
        return 0;
    }
    case F_RANGE: {
        int64_t a[3] = {0, 0, 1};
        if (na < 1 || na > 3 || nk) return jfail(C, n, MOE_ERR_INVALID, "range expects 1 to 3 integer arguments");
        for (size_t i = 0; i < na; i++) {
            if (args[i].t != JV_INT && args[i].t != JV_BOOL)
                return jfail(C, n, MOE_ERR_INVALID, "range: '%s' object cannot be interpreted as an integer", jv_type_name(&args[i]));
            a[na == 1 ? 1 : i] = jv_int(&args[i]);
        }
        if (a[2] == 0) return jfail(C, n, MOE_ERR_INVALID, "range() arg 3 must not be zero");
        int64_t first;
        size_t cnt = 0;
        if (a[2] > 0 && a[1] > a[0]) cnt = (size_t)(((uint64_t)(a[1] - a[0]) + (uint64_t)a[2] - 1) / (uint64_t)a[2]);
        if (a[2] < 0 && a[0] > a[1]) cnt = (size_t)(((uint64_t)(a[0] - a[1]) + (uint64_t)(-a[2]) - 1) / (uint64_t)(-a[2]));
        if (cnt > JJ_MAX_RANGE)
            return jfail(C, n, MOE_ERR_RANGE, "range too big: %zu items, the limit is %d", cnt, JJ_MAX_RANGE);
        first = a[0];
        jv l = jv_new_list(C->ar);
        if (!l.u.l) return jnomem(C, n);
        for (size_t i = 0; i < cnt; i++) {
            jv x = {JV_INT, 0, {0}};
            x.u.i = first + (int64_t)i * a[2];
            if (jv_list_push(C->ar, &l, x)) return jnomem(C, n);
        }
        *out = l;
        return 0;
    }
    }
    return jfail(C, n, MOE_ERR_UNSUPPORTED, "unknown function");
}

int jcall(struct ctx *C, const struct jnode *n, const jv *f, const jv *args, size_t na, const char *const *kwn,
          const jv *kw, size_t nk, jv *out) {
    switch (f->t) {
    case JV_MACRO: return call_macro(C, n, f->u.mac, args, na, kwn, kw, nk, out);
    case JV_FUNC: return call_func(C, n, f->u.fn, args, na, kwn, kw, nk, out);
    case JV_METHOD: return jlib_method(C, n, f->u.meth.self, f->u.meth.name, args, na, kwn, kw, nk, out);
    case JV_UNDEF: return undefined_error(C, n, f);
    default: return jfail(C, n, MOE_ERR_INVALID, "'%s' object is not callable", jv_type_name(f));
    }
}

int jeval(struct ctx *C, const struct jnode *n, jv *out) {
    jv a, b;
    if (step(C, n)) return -1;
    memset(out, 0, sizeof *out);
    switch (n->kind) {
    case E_LIT: *out = n->lit; return 0;
    case E_NAME:
        if (scope_get(C->sc, n->s, out)) return 0;
        for (int i = 0; k_funcs[i]; i++)
            if (!strcmp(k_funcs[i], n->s)) {
                out->t = JV_FUNC, out->u.fn = i;
                return 0;
            }
        *out = jv_undef(n->s, 0);
        return 0;
    case E_LIST: case E_TUPLE: {
        jv l = jv_new_list(C->ar);
        if (!l.u.l) return jnomem(C, n);
        l.tuple = n->kind == E_TUPLE;
        for (size_t i = 0; i < n->n_kids; i++)
            if (jeval(C, n->kids[i], &a) || (jv_list_push(C->ar, &l, a) && jnomem(C, n))) return -1;
        *out = l;
        return 0;
    }
    case E_DICT: {
        jv d = jv_new_dict(C->ar);
        if (!d.u.d) return jnomem(C, n);
        for (size_t i = 0; i < n->n_kids; i++)
            if (jeval(C, n->kids[i], &a) || jeval(C, n->kids2[i], &b) || (jv_dict_set(C->ar, &d, a, b) && jnomem(C, n)))
                return -1;
        *out = d;
        return 0;
    }
    case E_ATTR: return jeval(C, n->a, &a) || jgetattr(C, n, &a, n->s, 1, out) ? -1 : 0;
    case E_ITEM: return jeval(C, n->a, &a) || jeval(C, n->b, &b) || jgetitem(C, n, &a, &b, out) ? -1 : 0;
    case E_SLICE: {
        jv s[3] = {{JV_NONE, 0, {0}}, {JV_NONE, 0, {0}}, {JV_NONE, 0, {0}}};
        if (jeval(C, n->a, &a)) return -1;
        for (int i = 0; i < 3; i++)
            if (n->kids[i] && jeval(C, n->kids[i], &s[i])) return -1;
        return jslice(C, n, &a, &s[0], &s[1], &s[2], out);
    }
    case E_CALL: {
        jv *args, *kw;
        if (jeval(C, n->a, &a) || eval_args(C, n, &args, &kw)) return -1;
        return jcall(C, n, &a, args, n->n_kids, n->names, kw, n->n_kids2, out);
    }
    case E_FILTER: {
        jv *args, *kw;
        if (n->a ? jeval(C, n->a, &a) : (a = C->filter_input, 0)) return -1;
        if (eval_args(C, n, &args, &kw)) return -1;
        return jlib_filter(C, n, n->s, &a, args, n->n_kids, n->names, kw, n->n_kids2, out);
    }
    case E_TEST: {
        jv *args, *kw;
        if (jeval(C, n->a, &a) || eval_args(C, n, &args, &kw)) return -1;
        int r = jlib_test(C, n, n->s, &a, args, n->n_kids);
        if (r < 0) return -1;
        out->t = JV_BOOL, out->u.b = n->op ? !r : r;
        return 0;
    }
    case E_NEG: case E_POS:
        if (jeval(C, n->a, &a)) return -1;
        if (a.t == JV_UNDEF) return undefined_error(C, n, &a);
        if (!jv_is_num(&a)) return jfail(C, n, MOE_ERR_INVALID, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', jv_type_name(&a));
        if (n->kind == E_POS) {
            if (a.t == JV_BOOL) a.t = JV_INT, a.u.i = a.u.b;
            *out = a;
        } else if (a.t == JV_FLOAT) {
            out->t = JV_FLOAT, out->u.f = -a.u.f;
        } else {
            int64_t x = jv_int(&a);
            if (x == INT64_MIN) return jfail(C, n, MOE_ERR_RANGE, "integer overflow in unary -");
            out->t = JV_INT, out->u.i = -x;
        }
        return 0;
    case E_NOT:
        if (jeval(C, n->a, &a)) return -1;
        out->t = JV_BOOL, out->u.b = !jv_truthy(&a);
        return 0;
    case E_AND: case E_OR:
        if (jeval(C, n->a, &a)) return -1;
        if (jv_truthy(&a) == (n->kind == E_OR)) {
            *out = a;
            return 0;
        }
        return jeval(C, n->b, out);
    case E_BIN: return jeval(C, n->a, &a) || jeval(C, n->b, &b) || arith(C, n, n->op, &a, &b, out) ? -1 : 0;
    case E_CONCAT: {
        jv sa, sb;
        if (jeval(C, n->a, &a) || jeval(C, n->b, &b) || jv_to_str(C, n, &a, &sa) || jv_to_str(C, n, &b, &sb)) return -1;
        sa.tuple = sb.tuple = 0; /* `~` joins as str (no autoescape): Markup is not kept */
        return arith(C, n, OP_ADD, &sa, &sb, out);
    }
    case E_CMP: {
        if (jeval(C, n->a, &a)) return -1;
        int r = 1;
        for (size_t i = 0; i < n->n_kids && r; i++) {
            if (jeval(C, n->kids[i], &b)) return -1;
            if ((r = jcompare(C, n, n->ops[i], &a, &b)) < 0) return -1;
            a = b;
        }
        out->t = JV_BOOL, out->u.b = r;
        return 0;
    }
    case E_COND:
        if (jeval(C, n->a, &a)) return -1;
        if (jv_truthy(&a)) return jeval(C, n->b, out);
        if (n->c) return jeval(C, n->c, out);
        *out = jv_undef(NULL, 0);
        return 0;
    default: return jfail(C, n, MOE_ERR_FORMAT, "not an expression");
    }
}

/* ---- statements --------------------------------------------------------- */

static int emit_value(struct ctx *C, const struct jnode *n, const jv *v) {
    if (v->t == JV_UNDEF) return 0;
    if (jv_write(C->out, v, 0)) return jfail(C, n, MOE_ERR_RANGE, "the output is over %zu MiB (or memory ran out)", JJ_MAX_OUTPUT >> 20);
    return 0;
}

static int assign(struct ctx *C, const struct jnode *t, const jv *v) {
    if (t->kind == E_NAME) return scope_set(C, C->sc, t->s, *v) ? jnomem(C, t) : 0;
    if (t->kind == E_ATTR) {
        jv ns;
        if (!scope_get(C->sc, t->a->s, &ns) || ns.t != JV_NS)
            return jfail(C, t, MOE_ERR_INVALID, "cannot assign attribute on non-namespace object '%s'", t->a->s);
        if (t->s[0] == '_')
            return jfail(C, t, MOE_ERR_INVALID, "chat templates cannot store underscore-prefixed attributes on a namespace");
        return jv_dict_set(C->ar, &ns, jv_str(C->ar, t->s, strlen(t->s)), *v) ? jnomem(C, t) : 0;
    }
    /* a tuple of names: unpack */
    jv items;
    if (jiter(C, t, v, &items)) return -1;
    size_t n = items.u.l ? items.u.l->n : 0;
    if (n != t->n_kids)
        return jfail(C, t, MOE_ERR_INVALID, "%s values to unpack (expected %zu, got %zu)", n > t->n_kids ? "too many" : "not enough",
                     t->n_kids, n);
    for (size_t i = 0; i < n; i++)
        if (assign(C, t->kids[i], &items.u.l->v[i])) return -1;
    return 0;
}

static int bind_targets(struct ctx *C, const struct jnode *n, struct scope *sc, const jv *item) {
    if (n->n_names == 1) return scope_set(C, sc, n->names[0], *item) ? jnomem(C, n) : 0;
    jv items;
    if (jiter(C, n, item, &items)) return -1;
    size_t k = items.u.l ? items.u.l->n : 0;
    if (k != n->n_names)
        return jfail(C, n, MOE_ERR_INVALID, "%s values to unpack (expected %zu, got %zu)", k > n->n_names ? "too many" : "not enough",
                     n->n_names, k);
    for (size_t i = 0; i < k; i++)
        if (scope_set(C, sc, n->names[i], items.u.l->v[i])) return jnomem(C, n);
    return 0;
}

static int exec_for(struct ctx *C, const struct jnode *n) {
    jv seq, items;
    if (jeval(C, n->a, &seq)) return -1;
    if (seq.t == JV_NONE) return jfail(C, n->a, MOE_ERR_INVALID, "'NoneType' object is not iterable");
    if (jiter(C, n->a, &seq, &items)) return -1;
    struct scope *sc = scope_push(C, C->sc), *saved = C->sc;
    if (!sc) return jnomem(C, n);
    C->sc = sc;
    if (n->b) { /* {% for x in xs if cond %}: filtered first, so loop.length counts what runs */
        jv kept = jv_new_list(C->ar);
        if (!kept.u.l) return jnomem(C, n);
        for (size_t i = 0; items.u.l && i < items.u.l->n; i++) {
            jv c;
            if (bind_targets(C, n, sc, &items.u.l->v[i]) || jeval(C, n->b, &c)) return C->sc = saved, -1;
            if (jv_truthy(&c) && jv_list_push(C->ar, &kept, items.u.l->v[i])) return C->sc = saved, jnomem(C, n);
        }
        items = kept;
    }
    struct jloop *L = ja_alloc(C->ar, sizeof *L);
    if (!L) return C->sc = saved, jnomem(C, n);
    L->items = items.u.l, L->length = items.u.l ? items.u.l->n : 0;
    jv lv = {JV_LOOP, 0, {0}};
    lv.u.loop = L;
    int rc = 0;
    C->loops++;
    for (size_t i = 0; i < L->length && !rc; i++) {
        L->index0 = i;
        if ((rc = step(C, n))) break;
        sc->n = 0; /* each iteration starts afresh: what the last one set is gone (as in Jinja) */
        if (bind_targets(C, n, sc, &items.u.l->v[i]) || scope_set(C, sc, "loop", lv)) {
            rc = C->status ? -1 : jnomem(C, n);
            break;
        }
        rc = jexec(C, n->kids, n->n_kids);
        if (C->ctl == 1) {
            C->ctl = 0;
            break;
        }
        C->ctl = 0;
    }
    C->loops--;
    C->sc = saved;
    if (!rc && L->length == 0 && n->n_kids2) rc = jexec(C, n->kids2, n->n_kids2);
    return rc;
}

static int render_body(struct ctx *C, const struct jnode *n, jv *out) {
    struct jbuf *saved = C->out, b = {0};
    b.limit = JJ_MAX_OUTPUT;
    C->out = &b;
    int rc = jexec(C, n->kids, n->n_kids);
    C->out = saved;
    if (!rc) {
        *out = jv_str(C->ar, b.p ? b.p : "", b.n);
        if (C->ar->full) rc = jnomem(C, n);
    }
    free(b.p);
    return rc;
}

int jexec(struct ctx *C, struct jnode *const *kids, size_t n_kids) {
    if (C->depth >= JJ_MAX_DEPTH + 64) return jfail(C, n_kids ? kids[0] : NULL, MOE_ERR_RANGE, "nested too deep");
    for (size_t i = 0; i < n_kids && !C->ctl; i++) {
        const struct jnode *n = kids[i];
        jv v;
        if (step(C, n)) return -1;
        switch (n->kind) {
        case N_TEXT:
            if (jb_put(C->out, n->s, n->n)) return jfail(C, n, MOE_ERR_RANGE, "the output is over %zu MiB", JJ_MAX_OUTPUT >> 20);
            break;
        case N_OUTPUT:
            if (jeval(C, n->a, &v) || emit_value(C, n, &v)) return -1;
            break;
        case N_IF:
            if (jeval(C, n->a, &v)) return -1;
            if (jv_truthy(&v) ? jexec(C, n->kids, n->n_kids) : jexec(C, n->kids2, n->n_kids2)) return -1;
            break;
        case N_FOR:
            C->depth++;
            if (exec_for(C, n)) return C->depth--, -1;
            C->depth--;
            break;
        case N_SET:
            if (jeval(C, n->b, &v) || assign(C, n->a, &v)) return -1;
            break;
        case N_SETBLOCK:
            if (render_body(C, n, &v) || assign(C, n->a, &v)) return -1;
            break;
        case N_MACRO: {
            struct jmacro *m = ja_alloc(C->ar, sizeof *m);
            if (!m) return jnomem(C, n);
            m->n = n, m->sc = C->sc;
            jv mv = {JV_MACRO, 0, {0}};
            mv.u.mac = m;
            if (scope_set(C, C->sc, n->s, mv)) return jnomem(C, n);
            break;
        }
        case N_BREAK: case N_CONTINUE:
            if (!C->loops) return jfail(C, n, MOE_ERR_FORMAT, "'%s' outside a for loop", n->kind == N_BREAK ? "break" : "continue");
            C->ctl = n->kind == N_BREAK ? 1 : 2;
            break;
        case N_BODY:
            if (jexec(C, n->kids, n->n_kids)) return -1;
            break;
        case N_FILTERBLOCK: {
            jv saved = C->filter_input;
            if (render_body(C, n, &v)) return -1;
            C->filter_input = v;
            int rc = jeval(C, n->b, &v);
            C->filter_input = saved;
            if (rc || emit_value(C, n, &v)) return -1;
            break;
        }
        default: return jfail(C, n, MOE_ERR_FORMAT, "not a statement");
        }
    }
    return 0;
}

int jj_render(const struct jnode *root, struct jarena *ar, const struct jvar *vars, size_t n_vars, int64_t now,
              char **out, size_t *out_len, char *err, size_t err_size) {
    struct ctx C;
    memset(&C, 0, sizeof C);
    struct jbuf b = {0};
    b.limit = JJ_MAX_OUTPUT;
    C.ar = ar, C.out = &b, C.now = now, C.err = err, C.err_size = err_size;
    err[0] = 0;
    struct scope *g = scope_push(&C, NULL), *root_sc = g ? scope_push(&C, g) : NULL;
    if (!root_sc) return MOE_ERR_NOMEM;
    for (size_t i = 0; i < n_vars; i++)
        if (scope_set(&C, g, vars[i].name, vars[i].v)) return MOE_ERR_NOMEM;
    C.sc = root_sc;
    int rc = jexec(&C, root->kids, root->n_kids);
    if (rc || C.status) {
        free(b.p);
        return C.status ? C.status : MOE_ERR_FORMAT;
    }
    if (!b.p && jb_put(&b, "", 0)) return MOE_ERR_NOMEM;
    *out = b.p, *out_len = b.n;
    return MOE_OK;
}

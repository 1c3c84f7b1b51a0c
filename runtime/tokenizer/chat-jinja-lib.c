/*
 * chat-jinja-lib.c - the filters, tests and methods of the chat-template
 * interpreter, each with the semantics of Jinja's (jinja2/filters.py,
 * tests.py) or Python's str / dict / list method of that name, as
 * transformers' sandboxed environment exposes them (methods that modify a
 * list or dict are refused, as ImmutableSandboxedEnvironment refuses them).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "chat-jinja-eval.h"

/* ---- characters ----------------------------------------------------------- */

/* py_space: Python's str.isspace for one code point. */
static int py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

int ju_printable(uint32_t cp) {
    if (cp == ' ') return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default: return 1;
    }
}

static int is_cased(uint32_t c) {
    int k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static int is_alpha(uint32_t c) {
    int k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

static int is_digitcp(uint32_t c) { return utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_ND; }

/* special_case: Python's full case mappings that are more than one code
 * point (SpecialCasing.txt, the unconditional ones text is likely to hold);
 * mode 0 lower, 1 upper, 2/3 title. Returns the UTF-8 bytes or NULL. */
static const char *special_case(uint32_t c, int mode) {
    static const struct { uint32_t cp; const char *lower, *upper, *title; } k[] = {
        {0x00DF, NULL, "SS", "Ss"},           {0x0130, "i\xCC\x87", NULL, NULL}, {0x0149, NULL, "\xCA\xBCN", "\xCA\xBCN"},
        {0x01F0, NULL, "J\xCC\x8C", "J\xCC\x8C"}, {0xFB00, NULL, "FF", "Ff"},      {0xFB01, NULL, "FI", "Fi"},
        {0xFB02, NULL, "FL", "Fl"},           {0xFB03, NULL, "FFI", "Ffi"},           {0xFB04, NULL, "FFL", "Ffl"},
        {0xFB05, NULL, "ST", "St"},           {0xFB06, NULL, "ST", "St"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].cp == c) return mode == 0 ? k[i].lower : mode == 1 ? k[i].upper : k[i].title;
    return NULL;
}

/* map_case: each code point through f (0 lower, 1 upper, 2 title-case
 * words as Python's str.title, 3 capitalize as str.capitalize). */
static int map_case(struct ctx *C, const struct jnode *n, const jv *s, int mode, jv *out) {
    char *o = ja_alloc(C->ar, s->u.s.n * 3 + 8);
    if (!o) return jnomem(C, n);
    size_t k = 0, len, cap = s->u.s.n * 3 + 8;
    int prev_cased = 0, first = 1;
    for (size_t i = 0; i < s->u.s.n; i += len) {
        uint32_t c = ju_decode(s->u.s.p + i, s->u.s.n - i, &len), m;
        const int prev_cased_before = prev_cased, first_before = first;
        if (mode == 0) m = (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
        else if (mode == 1) m = (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
        else if (mode == 2) m = (uint32_t)(prev_cased ? utf8proc_tolower((utf8proc_int32_t)c) : utf8proc_totitle((utf8proc_int32_t)c));
        else m = (uint32_t)(first ? utf8proc_totitle((utf8proc_int32_t)c) : utf8proc_tolower((utf8proc_int32_t)c));
        prev_cased = is_cased(c);
        first = 0;
        if (len == 1 && c >= 0x80) m = c; /* a stray byte stays */
        const int sm = mode == 0 || mode == 1 ? mode : (mode == 2 ? !prev_cased_before : first_before) ? 2 : 0;
        const char *sp = special_case(c, sm);
        if (k + 8 > cap) return jfail(C, n, MOE_ERR_RANGE, "case mapping grew the string");
        if (sp) memcpy(o + k, sp, strlen(sp)), k += strlen(sp);
        else if (len == 1 && c >= 0x80) o[k++] = s->u.s.p[i];
        else k += ju_encode(m, o + k);
    }
    out->t = JV_STR, out->tuple = 0, out->u.s.p = o, out->u.s.n = k;
    return 0;
}

/* ---- small helpers ------------------------------------------------------ */

static int want_str(struct ctx *C, const struct jnode *n, const jv *v, const char *what) {
    if (v->t == JV_STR) return 0;
    return jfail(C, n, MOE_ERR_INVALID, "%s expects a string, got '%s'", what, jv_type_name(v));
}

static jv jbool(int b) {
    jv v = {JV_BOOL, 0, {0}};
    v.u.b = b != 0;
    return v;
}

static jv jint(int64_t i) {
    jv v = {JV_INT, 0, {0}};
    v.u.i = i;
    return v;
}

/* arg: positional i, else keyword name, else NULL. */
static const jv *arg(const jv *args, size_t na, const char *const *kwn, const jv *kw, size_t nk, size_t i, const char *name) {
    if (i < na) return &args[i];
    for (size_t k = 0; k < nk; k++)
        if (!strcmp(kwn[k], name)) return &kw[k];
    return NULL;
}

static int find_bytes(const char *h, size_t hn, const char *nd, size_t nn, size_t from) {
    if (nn == 0) return from <= hn ? (int)from : -1;
    for (size_t i = from; i + nn <= hn; i++)
        if (!memcmp(h + i, nd, nn)) return (int)i;
    return -1;
}

/* strip: Python's strip / lstrip / rstrip (which: 1 left, 2 right, 3 both);
 * chars NULL or None: whitespace. */
static int do_strip(struct ctx *C, const struct jnode *n, const jv *s, const jv *chars, int which, jv *out) {
    if (chars && chars->t != JV_NONE && chars->t != JV_UNDEF && want_str(C, n, chars, "strip")) return -1;
    const int ws = !chars || chars->t != JV_STR;
    size_t b = 0, e = s->u.s.n, len;
    while ((which & 1) && b < e) {
        uint32_t c = ju_decode(s->u.s.p + b, e - b, &len);
        int hit = 0;
        if (ws) hit = py_space(c);
        else
            for (size_t k = 0, l2; k < chars->u.s.n && !hit; k += l2) hit = ju_decode(chars->u.s.p + k, chars->u.s.n - k, &l2) == c;
        if (!hit) break;
        b += len;
    }
    while ((which & 2) && e > b) {
        size_t p = e - 1;
        while (p > b && ((unsigned char)s->u.s.p[p] & 0xC0) == 0x80) p--;
        uint32_t c = ju_decode(s->u.s.p + p, e - p, &len);
        if (p + len != e) p = e - 1, c = (unsigned char)s->u.s.p[p];
        int hit = 0;
        if (ws) hit = py_space(c);
        else
            for (size_t k = 0, l2; k < chars->u.s.n && !hit; k += l2) hit = ju_decode(chars->u.s.p + k, chars->u.s.n - k, &l2) == c;
        if (!hit) break;
        e = p;
    }
    out->t = JV_STR, out->tuple = 0, out->u.s.p = s->u.s.p + b, out->u.s.n = e - b;
    return 0;
}

/* do_split: Python's str.split / rsplit (sep None: runs of whitespace). */
static int do_split(struct ctx *C, const struct jnode *n, const jv *s, const jv *sep, int64_t maxsplit, int right, jv *out) {
    jv l = jv_new_list(C->ar);
    if (!l.u.l) return jnomem(C, n);
    const char *p = s->u.s.p;
    size_t len = s->u.s.n, cl;
    if (sep && sep->t == JV_STR) {
        if (sep->u.s.n == 0) return jfail(C, n, MOE_ERR_INVALID, "split: empty separator");
        size_t nc = 0;
        if (!right) {
            size_t from = 0;
            int at;
            while ((maxsplit < 0 || (int64_t)nc < maxsplit) && (at = find_bytes(p, len, sep->u.s.p, sep->u.s.n, from)) >= 0) {
                if (jv_list_push(C->ar, &l, jv_str(C->ar, p + from, (size_t)at - from))) return jnomem(C, n);
                from = (size_t)at + sep->u.s.n;
                nc++;
            }
            if (jv_list_push(C->ar, &l, jv_str(C->ar, p + from, len - from))) return jnomem(C, n);
        } else {
            size_t end = len;
            jv rev = jv_new_list(C->ar);
            if (!rev.u.l) return jnomem(C, n);
            while (maxsplit < 0 || (int64_t)nc < maxsplit) {
                int at = -1;
                for (size_t i = end >= sep->u.s.n ? end - sep->u.s.n + 1 : 0; i-- > 0;)
                    if (!memcmp(p + i, sep->u.s.p, sep->u.s.n)) {
                        at = (int)i;
                        break;
                    }
                if (at < 0) break;
                if (jv_list_push(C->ar, &rev, jv_str(C->ar, p + at + sep->u.s.n, end - (size_t)at - sep->u.s.n))) return jnomem(C, n);
                end = (size_t)at;
                nc++;
            }
            if (jv_list_push(C->ar, &l, jv_str(C->ar, p, end))) return jnomem(C, n);
            for (size_t i = rev.u.l->n; i-- > 0;)
                if (jv_list_push(C->ar, &l, rev.u.l->v[i])) return jnomem(C, n);
        }
        *out = l;
        return 0;
    }
    if (right && maxsplit >= 0) return jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported construct: rsplit() on whitespace with maxsplit");
    size_t i = 0;
    int64_t nsplit = 0;
    for (;;) {
        while (i < len && py_space(ju_decode(p + i, len - i, &cl))) i += cl;
        if (i >= len) break;
        if (maxsplit >= 0 && nsplit == maxsplit) {
            if (jv_list_push(C->ar, &l, jv_str(C->ar, p + i, len - i))) return jnomem(C, n);
            break;
        }
        size_t j = i;
        while (j < len && !py_space(ju_decode(p + j, len - j, &cl))) j += cl;
        if (jv_list_push(C->ar, &l, jv_str(C->ar, p + i, j - i))) return jnomem(C, n);
        nsplit++;
        i = j;
    }
    *out = l;
    return 0;
}

static int do_replace(struct ctx *C, const struct jnode *n, const jv *s, const jv *old, const jv *new_, int64_t count, jv *out) {
    if (want_str(C, n, old, "replace") || want_str(C, n, new_, "replace")) return -1;
    struct jbuf b = {0};
    b.limit = JJ_MAX_OUTPUT;
    size_t i = 0;
    int64_t done = 0;
    int bad = 0;
    if (old->u.s.n == 0) { /* Python inserts the new text around every character */
        size_t cl;
        for (; i <= s->u.s.n && !bad; i += cl) {
            if (count < 0 || done < count) bad |= jb_put(&b, new_->u.s.p, new_->u.s.n), done++;
            if (i == s->u.s.n) break;
            ju_decode(s->u.s.p + i, s->u.s.n - i, &cl);
            bad |= jb_put(&b, s->u.s.p + i, cl);
        }
    } else {
        int at;
        while (!bad && (count < 0 || done < count) && (at = find_bytes(s->u.s.p, s->u.s.n, old->u.s.p, old->u.s.n, i)) >= 0) {
            bad |= jb_put(&b, s->u.s.p + i, (size_t)at - i) | jb_put(&b, new_->u.s.p, new_->u.s.n);
            i = (size_t)at + old->u.s.n;
            done++;
        }
        bad |= jb_put(&b, s->u.s.p + i, s->u.s.n - i);
    }
    if (bad) {
        free(b.p);
        return jfail(C, n, MOE_ERR_RANGE, "replace: the result is over %zu MiB", JJ_MAX_OUTPUT >> 20);
    }
    *out = jv_str(C->ar, b.p ? b.p : "", b.n);
    free(b.p);
    return C->ar->full ? jnomem(C, n) : 0;
}

/* affix: startswith / endswith with a string or a tuple of strings. */
static int affix(struct ctx *C, const struct jnode *n, const jv *s, const jv *x, int end) {
    if (x->t == JV_LIST) {
        for (size_t i = 0; x->u.l && i < x->u.l->n; i++) {
            int r = affix(C, n, s, &x->u.l->v[i], end);
            if (r) return r;
        }
        return 0;
    }
    if (want_str(C, n, x, end ? "endswith" : "startswith")) return -1;
    if (x->u.s.n > s->u.s.n) return 0;
    return !memcmp(s->u.s.p + (end ? s->u.s.n - x->u.s.n : 0), x->u.s.p, x->u.s.n);
}

/* str_format: str.format with {} / {0} / {name} fields and no format specs. */
static int str_format(struct ctx *C, const struct jnode *n, const jv *s, const jv *args, size_t na, const char *const *kwn,
                      const jv *kw, size_t nk, jv *out) {
    struct jbuf b = {0};
    b.limit = JJ_MAX_OUTPUT;
    size_t auto_i = 0;
    int rc = 0;
    for (size_t i = 0; i < s->u.s.n && !rc;) {
        char c = s->u.s.p[i];
        if ((c == '{' || c == '}') && i + 1 < s->u.s.n && s->u.s.p[i + 1] == c) {
            rc = jb_put(&b, &c, 1), i += 2;
            continue;
        }
        if (c == '}') {
            rc = jfail(C, n, MOE_ERR_INVALID, "format: single '}' encountered in format string");
            break;
        }
        if (c != '{') {
            rc = jb_put(&b, &c, 1), i++;
            continue;
        }
        size_t j = i + 1;
        while (j < s->u.s.n && s->u.s.p[j] != '}') j++;
        if (j >= s->u.s.n) {
            rc = jfail(C, n, MOE_ERR_INVALID, "format: single '{' encountered in format string");
            break;
        }
        const char *f = s->u.s.p + i + 1;
        size_t fl = j - i - 1;
        if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '.', fl) || memchr(f, '[', fl)) {
            rc = jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported construct: a str.format field with a spec or attribute");
            break;
        }
        const jv *v = NULL;
        if (fl == 0) v = auto_i < na ? &args[auto_i++] : NULL;
        else if (f[0] >= '0' && f[0] <= '9') {
            size_t k = (size_t)atoi(f);
            v = k < na ? &args[k] : NULL;
        } else
            for (size_t k = 0; k < nk && !v; k++)
                if (strlen(kwn[k]) == fl && !memcmp(kwn[k], f, fl)) v = &kw[k];
        if (!v) {
            rc = jfail(C, n, MOE_ERR_INVALID, "format: no argument for field {%.*s}", (int)fl, f);
            break;
        }
        rc = jv_write(&b, v, 0);
        i = j + 1;
    }
    if (!rc && !C->status) {
        *out = jv_str(C->ar, b.p ? b.p : "", b.n);
        if (C->ar->full) rc = jnomem(C, n);
    } else if (!C->status) {
        rc = jfail(C, n, MOE_ERR_RANGE, "format: the result is too large");
    }
    free(b.p);
    return rc ? -1 : 0;
}

/* ---- methods ------------------------------------------------------------ */

static const char *const k_str_methods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower", "title", "capitalize",
    "replace", "find", "rfind", "index", "count", "join", "isdigit", "isalpha", "isspace", "isalnum", "islower",
    "isupper", "format", "splitlines", "swapcase", "casefold", "center", "ljust", "rjust", "zfill", "partition",
    "rpartition", "encode", "expandtabs", "isnumeric", "isdecimal", "istitle", "isidentifier", "isprintable",
    "removeprefix", "removesuffix", "rindex", "translate", "maketrans", "format_map", NULL};
static const char *const k_dict_methods[] = {"get", "items", "keys", "values", "copy", "pop", "popitem", "update",
                                             "setdefault", "clear", "fromkeys", NULL};
static const char *const k_list_methods[] = {"index", "count", "append", "extend", "insert", "pop", "remove", "reverse",
                                             "sort", "clear", "copy", NULL};

static int listed(const char *name, const char *const *l) {
    for (; *l; l++)
        if (!strcmp(*l, name)) return 1;
    return 0;
}

int jlib_is_method(const jv *obj, const char *name) {
    switch (obj->t) {
    case JV_STR: return listed(name, k_str_methods);
    case JV_DICT: return listed(name, k_dict_methods);
    case JV_LIST: return listed(name, obj->tuple ? (const char *const[]){"index", "count", NULL} : k_list_methods);
    case JV_LOOP: return !strcmp(name, "cycle");
    default: return 0;
    }
}

static int str_method(struct ctx *C, const struct jnode *n, const jv *s, const char *m, const jv *args, size_t na,
                      const char *const *kwn, const jv *kw, size_t nk, jv *out) {
    const jv *a0 = arg(args, na, kwn, kw, nk, 0, "chars"), *a1;
    if (!strcmp(m, "strip")) return do_strip(C, n, s, a0, 3, out);
    if (!strcmp(m, "lstrip")) return do_strip(C, n, s, a0, 1, out);
    if (!strcmp(m, "rstrip")) return do_strip(C, n, s, a0, 2, out);
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        a0 = arg(args, na, kwn, kw, nk, 0, "sep"), a1 = arg(args, na, kwn, kw, nk, 1, "maxsplit");
        if (a0 && a0->t != JV_STR && a0->t != JV_NONE) return want_str(C, n, a0, m);
        if (a1 && a1->t != JV_INT) return jfail(C, n, MOE_ERR_INVALID, "%s: maxsplit must be an integer", m);
        return do_split(C, n, s, a0, a1 ? a1->u.i : -1, m[0] == 'r', out);
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        if (na != 1) return jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported construct: %s with start/end arguments", m);
        int r = affix(C, n, s, &args[0], m[0] == 'e');
        if (r < 0) return -1;
        *out = jbool(r);
        return 0;
    }
    if (!strcmp(m, "upper")) return map_case(C, n, s, 1, out);
    if (!strcmp(m, "lower") || !strcmp(m, "casefold")) return map_case(C, n, s, 0, out);
    if (!strcmp(m, "title")) return map_case(C, n, s, 2, out);
    if (!strcmp(m, "capitalize")) return map_case(C, n, s, 3, out);
    if (!strcmp(m, "replace")) {
        const jv *c = arg(args, na, kwn, kw, nk, 2, "count");
        if (na < 2) return jfail(C, n, MOE_ERR_INVALID, "replace expects two arguments");
        return do_replace(C, n, s, &args[0], &args[1], c && c->t == JV_INT ? c->u.i : -1, out);
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex") || !strcmp(m, "count")) {
        if (na != 1 || want_str(C, n, &args[0], m)) return na != 1 ? jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported construct: %s with start/end arguments", m) : -1;
        const jv *x = &args[0];
        int64_t at = -1, cnt = 0;
        for (size_t i = 0; i + x->u.s.n <= s->u.s.n;) {
            int k = find_bytes(s->u.s.p, s->u.s.n, x->u.s.p, x->u.s.n, i);
            if (k < 0) break;
            if (at < 0 || m[0] == 'r') at = k;
            cnt++;
            i = (size_t)k + (x->u.s.n ? x->u.s.n : 1);
            if (m[0] != 'r' && m[0] != 'c') break;
        }
        if (!strcmp(m, "count")) {
            *out = jint(x->u.s.n ? cnt : (int64_t)ju_count(s->u.s.p, s->u.s.n) + 1);
            return 0;
        }
        if (at < 0 && (m[0] == 'i' || m[1] == 'i')) return jfail(C, n, MOE_ERR_INVALID, "substring not found");
        *out = jint(at < 0 ? -1 : (int64_t)ju_count(s->u.s.p, (size_t)at));
        return 0;
    }
    if (!strcmp(m, "join")) {
        if (na != 1) return jfail(C, n, MOE_ERR_INVALID, "join expects one argument");
        jv items;
        if (jiter(C, n, &args[0], &items)) return -1;
        struct jbuf b = {0};
        b.limit = JJ_MAX_OUTPUT;
        int bad = 0;
        for (size_t i = 0; items.u.l && i < items.u.l->n && !bad; i++) {
            const jv *x = &items.u.l->v[i];
            if (x->t != JV_STR) {
                free(b.p);
                return jfail(C, n, MOE_ERR_INVALID, "sequence item %zu: expected str instance, %s found", i, jv_type_name(x));
            }
            bad |= (i && jb_put(&b, s->u.s.p, s->u.s.n)) | jb_put(&b, x->u.s.p, x->u.s.n);
        }
        if (bad) {
            free(b.p);
            return jfail(C, n, MOE_ERR_RANGE, "join: the result is too large");
        }
        *out = jv_str(C->ar, b.p ? b.p : "", b.n);
        free(b.p);
        return 0;
    }
    if (!strncmp(m, "is", 2) && strcmp(m, "istitle") && strcmp(m, "isidentifier") && strcmp(m, "isprintable")) {
        int all = s->u.s.n > 0, any_cased = 0, ok_case = 1;
        size_t cl;
        for (size_t i = 0; i < s->u.s.n; i += cl) {
            uint32_t c = ju_decode(s->u.s.p + i, s->u.s.n - i, &cl);
            if (!strcmp(m, "isdigit") || !strcmp(m, "isnumeric") || !strcmp(m, "isdecimal")) all &= is_digitcp(c);
            else if (!strcmp(m, "isalpha")) all &= is_alpha(c);
            else if (!strcmp(m, "isalnum")) all &= is_alpha(c) || is_digitcp(c);
            else if (!strcmp(m, "isspace")) all &= py_space(c);
            else if (is_cased(c)) {
                any_cased = 1;
                int k = utf8proc_category((utf8proc_int32_t)c);
                if (!strcmp(m, "islower")) ok_case &= k == UTF8PROC_CATEGORY_LL;
                else ok_case &= k != UTF8PROC_CATEGORY_LL;
            }
        }
        *out = jbool(!strcmp(m, "islower") || !strcmp(m, "isupper") ? any_cased && ok_case : all);
        return 0;
    }
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        if (na != 1 || want_str(C, n, &args[0], m)) return na != 1 ? jfail(C, n, MOE_ERR_INVALID, "%s expects one argument", m) : -1;
        int end = m[6] == 's';
        *out = *s;
        if (affix(C, n, s, &args[0], end) == 1) {
            out->u.s.n -= args[0].u.s.n;
            if (!end) out->u.s.p += args[0].u.s.n;
        }
        return 0;
    }
    if (!strcmp(m, "format")) return str_format(C, n, s, args, na, kwn, kw, nk, out);
    return jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported method: str.%s", m);
}

static int dict_method(struct ctx *C, const struct jnode *n, const jv *d, const char *m, const jv *args, size_t na, jv *out) {
    const struct jdict *D = d->u.d;
    size_t cnt = D ? D->n : 0;
    if (!strcmp(m, "get")) {
        if (na < 1 || na > 2) return jfail(C, n, MOE_ERR_INVALID, "get expects 1 or 2 arguments");
        for (size_t i = 0; i < cnt; i++)
            if (jv_eq(&D->k[i], &args[0])) {
                *out = D->v[i];
                return 0;
            }
        if (na == 2) *out = args[1];
        else out->t = JV_NONE;
        return 0;
    }
    if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
        jv l = jv_new_list(C->ar);
        if (!l.u.l) return jnomem(C, n);
        for (size_t i = 0; i < cnt; i++) {
            jv x;
            if (m[0] == 'i') {
                x = jv_new_list(C->ar);
                x.tuple = 1;
                if (!x.u.l || jv_list_push(C->ar, &x, D->k[i]) || jv_list_push(C->ar, &x, D->v[i])) return jnomem(C, n);
            } else {
                x = m[0] == 'k' ? D->k[i] : D->v[i];
            }
            if (jv_list_push(C->ar, &l, x)) return jnomem(C, n);
        }
        *out = l;
        return 0;
    }
    if (!strcmp(m, "copy")) {
        jv c = jv_new_dict(C->ar);
        for (size_t i = 0; i < cnt; i++)
            if (jv_dict_set(C->ar, &c, D->k[i], D->v[i])) return jnomem(C, n);
        *out = c;
        return 0;
    }
    return jfail(C, n, MOE_ERR_INVALID, "access to attribute '%s' of 'dict' object is unsafe.", m);
}

int jlib_method(struct ctx *C, const struct jnode *n, const jv *self, const char *name, const jv *args, size_t na,
                const char *const *kwn, const jv *kw, size_t nk, jv *out) {
    switch (self->t) {
    case JV_STR: return str_method(C, n, self, name, args, na, kwn, kw, nk, out);
    case JV_DICT: return dict_method(C, n, self, name, args, na, out);
    case JV_LIST:
        if (!strcmp(name, "index") || !strcmp(name, "count")) {
            if (na != 1) return jfail(C, n, MOE_ERR_INVALID, "list.%s expects one argument", name);
            int64_t at = -1, cnt = 0;
            for (size_t i = 0; self->u.l && i < self->u.l->n; i++)
                if (jv_eq(&self->u.l->v[i], &args[0])) {
                    if (at < 0) at = (int64_t)i;
                    cnt++;
                }
            if (name[0] == 'i' && at < 0) return jfail(C, n, MOE_ERR_INVALID, "list.index(x): x not in list");
            *out = jint(name[0] == 'i' ? at : cnt);
            return 0;
        }
        return jfail(C, n, MOE_ERR_INVALID, "access to attribute '%s' of 'list' object is unsafe.", name);
    case JV_LOOP:
        if (na == 0) return jfail(C, n, MOE_ERR_INVALID, "no items for cycling given");
        *out = args[self->u.loop->index0 % na];
        return 0;
    default: return jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported method: %s.%s", jv_type_name(self), name);
    }
}

/* ---- tests -------------------------------------------------------------- */

int jlib_test(struct ctx *C, const struct jnode *n, const char *t, const jv *v, const jv *args, size_t na) {
    const jv *a0 = na ? &args[0] : NULL;
    if (!strcmp(t, "defined")) return v->t != JV_UNDEF;
    if (!strcmp(t, "undefined")) return v->t == JV_UNDEF;
    if (!strcmp(t, "none")) return v->t == JV_NONE;
    if (!strcmp(t, "boolean")) return v->t == JV_BOOL;
    if (!strcmp(t, "false")) return v->t == JV_BOOL && !v->u.b;
    if (!strcmp(t, "true")) return v->t == JV_BOOL && v->u.b;
    if (!strcmp(t, "integer")) return v->t == JV_INT;
    if (!strcmp(t, "float")) return v->t == JV_FLOAT;
    if (!strcmp(t, "number")) return jv_is_num(v);
    if (!strcmp(t, "string")) return v->t == JV_STR;
    if (!strcmp(t, "mapping")) return v->t == JV_DICT;
    if (!strcmp(t, "iterable")) return v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT || v->t == JV_UNDEF;
    if (!strcmp(t, "sequence")) return v->t == JV_STR || (v->t == JV_LIST && v->tuple != 2) || v->t == JV_DICT || v->t == JV_UNDEF;
    if (!strcmp(t, "callable")) return v->t == JV_MACRO || v->t == JV_FUNC || v->t == JV_METHOD;
    if (!strcmp(t, "escaped")) return 0;
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        jv s, r;
        if (jv_to_str(C, n, v, &s) || str_method(C, n, &s, t[0] == 'l' ? "islower" : "isupper", NULL, 0, NULL, NULL, 0, &r)) return -1;
        return r.u.b;
    }
    if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        if (v->t != JV_INT && v->t != JV_BOOL) return jfail(C, n, MOE_ERR_INVALID, "test '%s' expects an integer, got '%s'", t, jv_type_name(v));
        int64_t x = jv_int(v);
        if (t[0] == 'o') return x % 2 != 0;
        if (t[0] == 'e') return x % 2 == 0;
        if (!a0 || (a0->t != JV_INT && a0->t != JV_BOOL) || jv_int(a0) == 0)
            return jfail(C, n, MOE_ERR_INVALID, "divisibleby expects a non-zero integer");
        return x % jv_int(a0) == 0;
    }
    if (!a0) return jfail(C, n, MOE_ERR_INVALID, "test '%s' expects an argument", t);
    if (!strcmp(t, "sameas")) return v->t == a0->t && (v->t == JV_NONE || v->t == JV_UNDEF || (v->t == JV_BOOL && v->u.b == a0->u.b) ||
                                                         ((v->t == JV_LIST) && v->u.l == a0->u.l) || ((v->t == JV_DICT || v->t == JV_NS) && v->u.d == a0->u.d));
    if (!strcmp(t, "in")) return jcompare(C, n, OP_IN, v, a0);
    static const struct { const char *name; int op; } cmp[] = {
        {"eq", OP_EQ}, {"equalto", OP_EQ}, {"==", OP_EQ}, {"ne", OP_NE}, {"!=", OP_NE}, {"lt", OP_LT}, {"lessthan", OP_LT},
        {"<", OP_LT}, {"le", OP_LE}, {"<=", OP_LE}, {"gt", OP_GT}, {"greaterthan", OP_GT}, {">", OP_GT}, {"ge", OP_GE},
        {">=", OP_GE}};
    for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++)
        if (!strcmp(t, cmp[i].name)) return jcompare(C, n, cmp[i].op, v, a0);
    return jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported test '%s'", t);
}

/* ---- filters ------------------------------------------------------------ */

/* attr_path: item.a.b as Jinja's make_attrgetter does (getitem per part,
 * integer parts as indexes). */
static int attr_path(struct ctx *C, const struct jnode *n, const jv *item, const jv *path, jv *out) {
    if (path->t == JV_INT) return jgetitem(C, n, item, path, out);
    if (path->t != JV_STR) return jfail(C, n, MOE_ERR_INVALID, "attribute must be a string");
    jv cur = *item;
    const char *p = path->u.s.p, *end = p + path->u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        jv key;
        int digits = dot > p;
        for (const char *q = p; q < dot; q++) digits &= *q >= '0' && *q <= '9';
        if (digits) key = jint(atoll(p));
        else key = jv_str(C->ar, p, (size_t)(dot - p));
        if (jgetitem(C, n, &cur, &key, &cur)) return -1;
        p = dot + 1;
        if (dot == end) break;
    }
    *out = cur;
    return 0;
}

/* sort_key: the value a sort / min / max / unique compares. */
static int sort_key(struct ctx *C, const struct jnode *n, const jv *x, const jv *attr, int case_sensitive, jv *out) {
    jv v = *x;
    if (attr && attr->t != JV_NONE && attr_path(C, n, x, attr, &v)) return -1;
    if (!case_sensitive && v.t == JV_STR) return map_case(C, n, &v, 0, out);
    *out = v;
    return 0;
}

/* msort: a stable merge sort of items by keys; -1 after an error. */
static int msort(struct ctx *C, const struct jnode *n, jv *items, jv *keys, size_t cnt, int reverse) {
    if (cnt < 2) return 0;
    jv *ti = ja_alloc(C->ar, cnt * sizeof *ti), *tk = ja_alloc(C->ar, cnt * sizeof *tk);
    if (!ti || !tk) return jnomem(C, n);
    for (size_t w = 1; w < cnt; w *= 2) {
        for (size_t lo = 0; lo < cnt; lo += 2 * w) {
            size_t mid = lo + w < cnt ? lo + w : cnt, hi = lo + 2 * w < cnt ? lo + 2 * w : cnt, i = lo, j = mid, k = lo;
            while (i < mid || j < hi) {
                int take_right = 0;
                if (i < mid && j < hi) {
                    int c = jv_cmp(&keys[j], &keys[i]);
                    if (c == -2)
                        return jfail(C, n, MOE_ERR_INVALID, "'<' not supported between instances of '%s' and '%s'",
                                     jv_type_name(&keys[j]), jv_type_name(&keys[i]));
                    take_right = reverse ? c > 0 : c < 0;
                } else {
                    take_right = i >= mid;
                }
                if (take_right) ti[k] = items[j], tk[k++] = keys[j++];
                else ti[k] = items[i], tk[k++] = keys[i++];
            }
        }
        memcpy(items, ti, cnt * sizeof *ti), memcpy(keys, tk, cnt * sizeof *tk);
    }
    return 0;
}

static int copy_list(struct ctx *C, const struct jnode *n, const jv *src, jv *out) {
    jv l = jv_new_list(C->ar);
    if (!l.u.l) return jnomem(C, n);
    for (size_t i = 0; src->u.l && i < src->u.l->n; i++)
        if (jv_list_push(C->ar, &l, src->u.l->v[i])) return jnomem(C, n);
    *out = l;
    return 0;
}

static int f_indent(struct ctx *C, const struct jnode *n, const jv *s, const jv *width, const jv *first, const jv *blank, jv *out) {
    struct jbuf ind = {0}, b = {0};
    b.limit = JJ_MAX_OUTPUT;
    int rc = 0;
    if (width && width->t == JV_STR) rc |= jb_put(&ind, width->u.s.p, width->u.s.n);
    else
        for (int64_t i = 0, w = width ? jv_int(width) : 4; i < w && i < 4096; i++) rc |= jb_put(&ind, " ", 1);
    if (!ind.p) rc |= jb_put(&ind, "", 0);
    /* Jinja splits s + "\n" into lines: every segment between line breaks, the
     * last one too (empty after a final break); all but the first are indented */
    const char *p = s->u.s.p;
    size_t len = s->u.s.n, i = 0;
    int line_no = 0, do_blank = blank && jv_truthy(blank);
    if (first && jv_truthy(first)) rc |= jb_put(&b, ind.p, ind.n);
    for (;;) {
        size_t j = i;
        while (j < len && p[j] != '\n' && p[j] != '\r') j++;
        if (line_no++) {
            rc |= jb_put(&b, "\n", 1);
            if (j > i || do_blank) rc |= jb_put(&b, ind.p, ind.n);
        }
        rc |= jb_put(&b, p + i, j - i);
        if (j >= len) break;
        if (p[j] == '\r' && j + 1 < len && p[j + 1] == '\n') j++;
        i = j + 1;
    }
    if (!rc) {
        *out = jv_str(C->ar, b.p ? b.p : "", b.n);
        rc = C->ar->full;
    }
    free(ind.p), free(b.p);
    return rc ? jfail(C, n, MOE_ERR_RANGE, "indent: the result is too large") : 0;
}

/* select / reject / selectattr / rejectattr: items whose (attribute's) test is true (false for reject). */
static int f_select(struct ctx *C, const struct jnode *n, const jv *seq, int reject, int by_attr, const jv *args, size_t na, jv *out) {
    jv items, l = jv_new_list(C->ar);
    if (!l.u.l) return jnomem(C, n);
    l.tuple = 2;
    if (!jv_truthy(seq)) { /* Jinja: `if value:` before iterating (none selects nothing) */
        *out = l;
        return 0;
    }
    if (jiter(C, n, seq, &items)) return -1;
    size_t k = 0;
    const jv *attr = NULL;
    if (by_attr) {
        if (na < 1) return jfail(C, n, MOE_ERR_INVALID, "%s expects an attribute name", reject ? "rejectattr" : "selectattr");
        attr = &args[k++];
    }
    const char *test = NULL;
    if (k < na) {
        if (args[k].t != JV_STR) return jfail(C, n, MOE_ERR_INVALID, "the test name must be a string");
        test = ja_strdup(C->ar, args[k].u.s.p, args[k].u.s.n);
        if (jj_known_test(test) != 1) return jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported test '%s'", test);
        k++;
    }
    for (size_t i = 0; items.u.l && i < items.u.l->n; i++) {
        jv x = items.u.l->v[i];
        if (attr && attr_path(C, n, &items.u.l->v[i], attr, &x)) return -1;
        int r = test ? jlib_test(C, n, test, &x, args + k, na - k) : jv_truthy(&x);
        if (r < 0) return -1;
        if (r != reject && jv_list_push(C->ar, &l, items.u.l->v[i])) return jnomem(C, n);
    }
    l.tuple = 2;
    *out = l;
    return 0;
}

static int f_join(struct ctx *C, const struct jnode *n, const jv *seq, const jv *sep, const jv *attr, jv *out) {
    jv items;
    if (jiter(C, n, seq, &items)) return -1;
    struct jbuf b = {0};
    b.limit = JJ_MAX_OUTPUT;
    int bad = 0;
    jv sp = {JV_STR, 0, {.s = {"", 0}}};
    if (sep && jv_to_str(C, n, sep, &sp)) return -1;
    for (size_t i = 0; items.u.l && i < items.u.l->n && !bad; i++) {
        jv x = items.u.l->v[i];
        if (attr && attr->t != JV_NONE && attr_path(C, n, &items.u.l->v[i], attr, &x)) return free(b.p), -1;
        if (i) bad |= jb_put(&b, sp.u.s.p, sp.u.s.n);
        bad |= jv_write(&b, &x, 0);
    }
    if (bad) {
        free(b.p);
        return jfail(C, n, MOE_ERR_RANGE, "join: the result is too large");
    }
    *out = jv_str(C->ar, b.p ? b.p : "", b.n);
    free(b.p);
    return C->ar->full ? jnomem(C, n) : 0;
}

static int f_minmax(struct ctx *C, const struct jnode *n, const jv *seq, int max, const jv *cs, const jv *attr, jv *out) {
    jv items;
    if (jiter(C, n, seq, &items)) return -1;
    if (!items.u.l || !items.u.l->n) {
        *out = jv_undef(NULL, 0);
        return 0;
    }
    size_t best = 0;
    jv bk;
    if (sort_key(C, n, &items.u.l->v[0], attr, cs && jv_truthy(cs), &bk)) return -1;
    for (size_t i = 1; i < items.u.l->n; i++) {
        jv k;
        if (sort_key(C, n, &items.u.l->v[i], attr, cs && jv_truthy(cs), &k)) return -1;
        int c = jv_cmp(&k, &bk);
        if (c == -2) return jfail(C, n, MOE_ERR_INVALID, "'<' not supported between '%s' and '%s'", jv_type_name(&k), jv_type_name(&bk));
        if (max ? c > 0 : c < 0) best = i, bk = k;
    }
    *out = items.u.l->v[best];
    return 0;
}

/* to_int: Jinja's int filter (default on failure). */
static jv to_int(const jv *v, const jv *def) {
    if (v->t == JV_INT) return *v;
    if (v->t == JV_BOOL) return jint(v->u.b);
    if (v->t == JV_FLOAT && isfinite(v->u.f) && fabs(v->u.f) < 9.2e18) return jint((int64_t)v->u.f);
    if (v->t == JV_STR && v->u.s.n < 64) {
        char buf[64];
        size_t k = 0;
        for (size_t i = 0; i < v->u.s.n; i++)
            if (v->u.s.p[i] != '_') buf[k++] = v->u.s.p[i];
        buf[k] = 0;
        char *end;
        long long x = strtoll(buf, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\n') end++;
        if (end != buf && !*end) return jint(x);
        double f = strtod(buf, &end);
        while (*end == ' ' || *end == '\t' || *end == '\n') end++;
        if (end != buf && !*end && isfinite(f) && fabs(f) < 9.2e18) return jint((int64_t)f);
    }
    return def ? *def : jint(0);
}

int jlib_filter(struct ctx *C, const struct jnode *n, const char *f, const jv *v, const jv *args, size_t na,
                const char *const *kwn, const jv *kw, size_t nk, jv *out) {
#define ARG(i, name) arg(args, na, kwn, kw, nk, i, name)
    jv s;
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        const jv *def = ARG(0, "default_value"), *boolean = ARG(1, "boolean");
        if (v->t == JV_UNDEF || (boolean && jv_truthy(boolean) && !jv_truthy(v)))
            *out = def ? *def : (jv){JV_STR, 0, {.s = {"", 0}}};
        else
            *out = *v;
        return 0;
    }
    if (!strcmp(f, "safe")) { /* Markup: what is added to it gets escaped */
        if (jv_to_str(C, n, v, out)) return -1;
        out->tuple = 1;
        return 0;
    }
    if (!strcmp(f, "string")) return jv_to_str(C, n, v, out);
    if (!strcmp(f, "tojson")) return jlib_tojson(C, n, v, ARG(0, "ensure_ascii"), ARG(1, "indent"), ARG(2, "separators"), ARG(3, "sort_keys"), out);
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        switch (v->t) {
        case JV_UNDEF: *out = jint(0); return 0;
        case JV_STR: *out = jint((int64_t)ju_count(v->u.s.p, v->u.s.n)); return 0;
        case JV_LIST:
            if (v->tuple == 2) return jfail(C, n, MOE_ERR_INVALID, "object of type 'generator' has no len()");
            *out = jint(v->u.l ? (int64_t)v->u.l->n : 0);
            return 0;
        case JV_DICT: *out = jint(v->u.d ? (int64_t)v->u.d->n : 0); return 0;
        default: return jfail(C, n, MOE_ERR_INVALID, "object of type '%s' has no len()", jv_type_name(v));
        }
    }
    if (!strcmp(f, "trim")) return jv_to_str(C, n, v, &s) || do_strip(C, n, &s, ARG(0, "chars"), 3, out) ? -1 : 0;
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize"))
        return jv_to_str(C, n, v, &s) || map_case(C, n, &s, f[0] == 'u' ? 1 : f[0] == 'l' ? 0 : 3, out) ? -1 : 0;
    if (!strcmp(f, "title")) { /* Jinja's own: words begin after -, whitespace or an opening bracket */
        if (jv_to_str(C, n, v, &s)) return -1;
        char *o = ja_alloc(C->ar, s.u.s.n * 4 + 8);
        if (!o) return jnomem(C, n);
        size_t k = 0, cl;
        int start = 1;
        for (size_t i = 0; i < s.u.s.n; i += cl) {
            uint32_t c = ju_decode(s.u.s.p + i, s.u.s.n - i, &cl);
            int sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_space(c);
            uint32_t m = sep ? c : (uint32_t)(start ? utf8proc_toupper((utf8proc_int32_t)c) : utf8proc_tolower((utf8proc_int32_t)c));
            const char *sp = sep ? NULL : special_case(c, start ? 1 : 0);
            if (sp) memcpy(o + k, sp, strlen(sp)), k += strlen(sp);
            else if (cl == 1 && c >= 0x80) o[k++] = s.u.s.p[i];
            else k += ju_encode(m, o + k);
            start = sep;
        }
        out->t = JV_STR, out->tuple = 0, out->u.s.p = o, out->u.s.n = k;
        return 0;
    }
    if (!strcmp(f, "replace")) {
        const jv *old = ARG(0, "old"), *new_ = ARG(1, "new"), *cnt = ARG(2, "count");
        if (!old || !new_) return jfail(C, n, MOE_ERR_INVALID, "replace expects two arguments");
        return jv_to_str(C, n, v, &s) || do_replace(C, n, &s, old, new_, cnt && cnt->t == JV_INT ? cnt->u.i : -1, out) ? -1 : 0;
    }
    if (!strcmp(f, "escape") || !strcmp(f, "e") || !strcmp(f, "forceescape")) {
        if (jv_to_str(C, n, v, &s)) return -1;
        if (s.tuple == 1 && f[0] != 'f') { /* already Markup */
            *out = s;
            return 0;
        }
        struct jbuf b = {0};
        int bad = 0;
        for (size_t i = 0; i < s.u.s.n; i++) {
            const char c = s.u.s.p[i];
            const char *r = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : NULL;
            bad |= r ? jb_put(&b, r, strlen(r)) : jb_put(&b, &c, 1);
        }
        *out = jv_str(C->ar, b.p ? b.p : "", b.n);
        out->tuple = 1;
        free(b.p);
        return bad ? jnomem(C, n) : 0;
    }
    if (!strcmp(f, "indent")) return jv_to_str(C, n, v, &s) || f_indent(C, n, &s, ARG(0, "width"), ARG(1, "first"), ARG(2, "blank"), out) ? -1 : 0;
    if (!strcmp(f, "join")) return f_join(C, n, v, ARG(0, "d"), ARG(1, "attribute"), out);
    if (!strcmp(f, "list")) {
        jv items;
        return jiter(C, n, v, &items) || copy_list(C, n, &items, out) ? -1 : 0;
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        jv items;
        if (f[0] == 'l' && v->t == JV_LIST && v->tuple == 2) return jfail(C, n, MOE_ERR_INVALID, "'generator' object is not reversible");
        if (jiter(C, n, v, &items)) return -1;
        size_t cnt = items.u.l ? items.u.l->n : 0;
        *out = cnt ? items.u.l->v[f[0] == 'f' ? 0 : cnt - 1] : jv_undef(NULL, 0);
        return 0;
    }
    if (!strcmp(f, "reverse")) {
        jv items, l;
        if (v->t == JV_STR) {
            size_t cnt, *off = ju_offsets(C->ar, v->u.s.p, v->u.s.n, &cnt);
            char *o = ja_alloc(C->ar, v->u.s.n + 1);
            if (!off || !o) return jnomem(C, n);
            size_t k = 0;
            for (size_t i = cnt; i-- > 0;) memcpy(o + k, v->u.s.p + off[i], off[i + 1] - off[i]), k += off[i + 1] - off[i];
            out->t = JV_STR, out->tuple = 0, out->u.s.p = o, out->u.s.n = k;
            return 0;
        }
        if (jiter(C, n, v, &items) || copy_list(C, n, &items, &l)) return -1;
        for (size_t i = 0, j = l.u.l->n; i + 1 < j; i++, j--) {
            jv t = l.u.l->v[i];
            l.u.l->v[i] = l.u.l->v[j - 1], l.u.l->v[j - 1] = t;
        }
        if (v->t == JV_LIST && v->tuple != 2) l.tuple = 2; /* reversed(list): an iterator */
        *out = l;
        return 0;
    }
    if (!strcmp(f, "items")) {
        if (v->t == JV_UNDEF) {
            *out = jv_new_list(C->ar);
            return out->u.l ? 0 : jnomem(C, n);
        }
        if (v->t != JV_DICT) return jfail(C, n, MOE_ERR_INVALID, "can only get item pairs from a mapping, not '%s'", jv_type_name(v));
        if (dict_method(C, n, v, "items", NULL, 0, out)) return -1;
        out->tuple = 2;
        return 0;
    }
    if (!strcmp(f, "dictsort")) {
        const jv *cs = ARG(0, "case_sensitive"), *by = ARG(1, "by"), *rev = ARG(2, "reverse");
        if (v->t != JV_DICT) return jfail(C, n, MOE_ERR_INVALID, "dictsort expects a mapping");
        jv items;
        if (dict_method(C, n, v, "items", NULL, 0, &items)) return -1;
        int by_value = by && by->t == JV_STR && by->u.s.n == 5 && !memcmp(by->u.s.p, "value", 5);
        size_t cnt = items.u.l->n;
        jv *keys = ja_alloc(C->ar, (cnt + 1) * sizeof *keys);
        if (!keys) return jnomem(C, n);
        for (size_t i = 0; i < cnt; i++)
            if (sort_key(C, n, &items.u.l->v[i].u.l->v[by_value], NULL, cs && jv_truthy(cs), &keys[i])) return -1;
        if (msort(C, n, items.u.l->v, keys, cnt, rev && jv_truthy(rev))) return -1;
        *out = items;
        return 0;
    }
    if (!strcmp(f, "sort") || !strcmp(f, "unique")) {
        int is_sort = f[0] == 's';
        const jv *rev = is_sort ? ARG(0, "reverse") : NULL, *cs = ARG(is_sort ? 1 : 0, "case_sensitive"),
                 *attr = ARG(is_sort ? 2 : 1, "attribute");
        jv items, l;
        if (jiter(C, n, v, &items) || copy_list(C, n, &items, &l)) return -1;
        size_t cnt = l.u.l->n;
        jv *keys = ja_alloc(C->ar, (cnt + 1) * sizeof *keys);
        if (!keys) return jnomem(C, n);
        for (size_t i = 0; i < cnt; i++)
            if (sort_key(C, n, &l.u.l->v[i], attr, cs && jv_truthy(cs), &keys[i])) return -1;
        if (is_sort) {
            if (msort(C, n, l.u.l->v, keys, cnt, rev && jv_truthy(rev))) return -1;
            *out = l;
            return 0;
        }
        jv u = jv_new_list(C->ar);
        for (size_t i = 0; i < cnt; i++) {
            int seen = 0;
            for (size_t j = 0; j < i && !seen; j++) seen = jv_eq(&keys[i], &keys[j]);
            if (!seen && jv_list_push(C->ar, &u, l.u.l->v[i])) return jnomem(C, n);
        }
        u.tuple = 2;
        *out = u;
        return 0;
    }
    if (!strcmp(f, "min") || !strcmp(f, "max")) return f_minmax(C, n, v, f[1] == 'a', ARG(0, "case_sensitive"), ARG(1, "attribute"), out);
    if (!strcmp(f, "select") || !strcmp(f, "reject")) return f_select(C, n, v, f[0] == 'r', 0, args, na, out);
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) return f_select(C, n, v, f[0] == 'r', 1, args, na, out);
    if (!strcmp(f, "map")) {
        jv items, l = jv_new_list(C->ar);
        if (!l.u.l) return jnomem(C, n);
        l.tuple = 2;
        if (!jv_truthy(v)) { /* Jinja: `if value:` before iterating */
            *out = l;
            return 0;
        }
        if (jiter(C, n, v, &items)) return -1;
        const jv *attr = arg(NULL, 0, kwn, kw, nk, 0, "attribute"), *def = arg(NULL, 0, kwn, kw, nk, 0, "default");
        const char *filt = NULL;
        if (!attr) {
            if (na < 1 || args[0].t != JV_STR) return jfail(C, n, MOE_ERR_INVALID, "map expects a filter name or attribute=");
            filt = ja_strdup(C->ar, args[0].u.s.p, args[0].u.s.n);
            if (jj_known_filter(filt) != 1) return jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported filter '%s'", filt);
        }
        for (size_t i = 0; items.u.l && i < items.u.l->n; i++) {
            jv x;
            if (attr) {
                if (attr_path(C, n, &items.u.l->v[i], attr, &x)) return -1;
                if (x.t == JV_UNDEF && def) x = *def;
            } else if (jlib_filter(C, n, filt, &items.u.l->v[i], args + 1, na - 1, kwn, kw, nk, &x)) {
                return -1;
            }
            if (jv_list_push(C->ar, &l, x)) return jnomem(C, n);
        }
        l.tuple = 2;
        *out = l;
        return 0;
    }
    if (!strcmp(f, "attr")) {
        const jv *name = ARG(0, "name");
        if (!name || name->t != JV_STR) return jfail(C, n, MOE_ERR_INVALID, "attr expects a name");
        return jgetattr(C, n, v, ja_strdup(C->ar, name->u.s.p, name->u.s.n), v->t == JV_NS, out);
    }
    if (!strcmp(f, "int")) {
        *out = to_int(v, ARG(0, "default"));
        return 0;
    }
    if (!strcmp(f, "float")) {
        const jv *def = ARG(0, "default");
        out->t = JV_FLOAT, out->tuple = 0;
        if (jv_is_num(v)) out->u.f = jv_num(v);
        else if (v->t == JV_STR && v->u.s.n < 64) {
            char buf[64], *end;
            memcpy(buf, v->u.s.p, v->u.s.n), buf[v->u.s.n] = 0;
            out->u.f = strtod(buf, &end);
            if (end == buf || *end) {
                if (def) *out = *def;
                else out->u.f = 0;
            }
        } else if (def) *out = *def;
        else out->u.f = 0;
        return 0;
    }
    if (!strcmp(f, "abs")) {
        if (!jv_is_num(v)) return jfail(C, n, MOE_ERR_INVALID, "bad operand type for abs(): '%s'", jv_type_name(v));
        if (v->t == JV_FLOAT) out->t = JV_FLOAT, out->u.f = fabs(v->u.f);
        else *out = jint(jv_int(v) < 0 ? -jv_int(v) : jv_int(v));
        return 0;
    }
    if (!strcmp(f, "round")) {
        const jv *prec = ARG(0, "precision"), *method = ARG(1, "method");
        if (!jv_is_num(v)) return jfail(C, n, MOE_ERR_INVALID, "round expects a number");
        double x = jv_num(v), p = pow(10, prec ? (double)jv_int(prec) : 0), r;
        const char *m = method && method->t == JV_STR ? method->u.s.p : "common";
        if (!strncmp(m, "ceil", 4)) r = ceil(x * p) / p;
        else if (!strncmp(m, "floor", 5)) r = floor(x * p) / p;
        else r = nearbyint(x * p) / p; /* Python's round: half to even */
        out->t = JV_FLOAT, out->tuple = 0, out->u.f = r;
        return 0;
    }
    if (!strcmp(f, "sum")) {
        const jv *attr = ARG(0, "attribute"), *start = ARG(1, "start");
        jv items, acc = start ? *start : jint(0);
        if (jiter(C, n, v, &items)) return -1;
        for (size_t i = 0; items.u.l && i < items.u.l->n; i++) {
            jv x = items.u.l->v[i];
            if (attr && attr->t != JV_NONE && attr_path(C, n, &items.u.l->v[i], attr, &x)) return -1;
            if (!jv_is_num(&x) || !jv_is_num(&acc)) return jfail(C, n, MOE_ERR_INVALID, "sum expects numbers");
            if (acc.t == JV_FLOAT || x.t == JV_FLOAT) acc.t = JV_FLOAT, acc.u.f = jv_num(&acc) + jv_num(&x);
            else if (__builtin_add_overflow(jv_int(&acc), jv_int(&x), &acc.u.i)) return jfail(C, n, MOE_ERR_RANGE, "integer overflow in sum");
            else acc.t = JV_INT;
        }
        *out = acc;
        return 0;
    }
    if (!strcmp(f, "wordcount")) {
        if (jv_to_str(C, n, v, &s)) return -1;
        int64_t words = 0;
        int in = 0;
        size_t cl;
        for (size_t i = 0; i < s.u.s.n; i += cl) {
            uint32_t c = ju_decode(s.u.s.p + i, s.u.s.n - i, &cl);
            int w = is_alpha(c) || is_digitcp(c) || c == '_';
            words += w && !in;
            in = w;
        }
        *out = jint(words);
        return 0;
    }
    return jfail(C, n, MOE_ERR_UNSUPPORTED, "unsupported filter '%s' (a Jinja filter this interpreter does not run)", f);
#undef ARG
}

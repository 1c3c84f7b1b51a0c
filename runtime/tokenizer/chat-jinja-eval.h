/*
 * chat-jinja-eval.h - private to chat-jinja-eval.c and chat-jinja-lib.c: the
 * render context and the value operations the filters, tests and methods
 * share. Not installed.
 */
#ifndef MOE_CHAT_JINJA_EVAL_H
#define MOE_CHAT_JINJA_EVAL_H

#include "chat-jinja-impl.h"

struct scope {
    struct scope *parent;
    const char **names;
    jv *vals;
    size_t n, cap;
};

/* one render's state */
struct ctx {
    struct jarena *ar;
    struct jbuf *out;   /* where text goes (a macro call or a block set swaps it) */
    struct scope *sc;   /* the innermost scope */
    long steps;
    int depth;          /* macro calls and for blocks */
    int loops;          /* for blocks open in the current macro (break / continue allowed) */
    int ctl;            /* 1 break, 2 continue: pending */
    int64_t now;
    jv filter_input;    /* the body of a {% filter %} block */
    char *err;
    size_t err_size;
    int status;         /* the first error's moe_status */
};

/* errors: "line L:C: message" into C->err; return -1 */
int jfail(struct ctx *C, const struct jnode *n, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int jnomem(struct ctx *C, const struct jnode *n);
int step(struct ctx *C, const struct jnode *n);

/* values */
jv jv_undef(const char *name, int attr);
const char *jv_type_name(const jv *v);
int jv_truthy(const jv *v);
int jv_is_num(const jv *v);
double jv_num(const jv *v);
int64_t jv_int(const jv *v);
int jv_eq(const jv *a, const jv *b);
int jv_cmp(const jv *a, const jv *b);               /* -1 0 1, -2 not orderable */
int jv_write(struct jbuf *b, const jv *v, int repr); /* str() / repr() */
int jv_to_str(struct ctx *C, const struct jnode *n, const jv *v, jv *out);

/* UTF-8 */
uint32_t ju_decode(const char *s, size_t n, size_t *len);
size_t ju_encode(uint32_t cp, char *o);
size_t ju_count(const char *s, size_t n);
size_t *ju_offsets(struct jarena *a, const char *s, size_t n, size_t *count);
int ju_printable(uint32_t cp);

/* evaluation */
int jeval(struct ctx *C, const struct jnode *n, jv *out);
int jexec(struct ctx *C, struct jnode *const *kids, size_t n_kids);
int scope_set(struct ctx *C, struct scope *s, const char *name, jv v);
int jgetattr(struct ctx *C, const struct jnode *n, const jv *obj, const char *name, int items, jv *out);
int jgetitem(struct ctx *C, const struct jnode *n, const jv *obj, const jv *key, jv *out);
int jslice(struct ctx *C, const struct jnode *n, const jv *obj, const jv *a, const jv *b, const jv *c, jv *out);
int jiter(struct ctx *C, const struct jnode *n, const jv *v, jv *out);
int jcompare(struct ctx *C, const struct jnode *n, int op, const jv *a, const jv *b);
int jcall(struct ctx *C, const struct jnode *n, const jv *f, const jv *args, size_t na, const char *const *kwn,
          const jv *kw, size_t nk, jv *out);

/* chat-jinja-lib.c: filters, tests, methods */
int jlib_is_method(const jv *obj, const char *name);
int jlib_method(struct ctx *C, const struct jnode *n, const jv *self, const char *name, const jv *args, size_t na,
                const char *const *kwn, const jv *kw, size_t nk, jv *out);
int jlib_filter(struct ctx *C, const struct jnode *n, const char *name, const jv *v, const jv *args, size_t na,
                const char *const *kwn, const jv *kw, size_t nk, jv *out);
/* tojson as transformers defines it: json.dumps(v, ensure_ascii=False, indent=None,
 * separators=None, sort_keys=False) (chat-jinja-json.c) */
int jlib_tojson(struct ctx *C, const struct jnode *n, const jv *v, const jv *ensure_ascii, const jv *indent,
                const jv *separators, const jv *sort_keys, jv *out);
int jlib_test(struct ctx *C, const struct jnode *n, const char *name, const jv *v, const jv *args, size_t na); /* 1/0, -1 */

#endif

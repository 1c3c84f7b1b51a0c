/*
 * chat-jinja-impl.h - private to runtime/tokenizer/chat-*.c: the Jinja
 * interpreter behind moe-chat.h. Not installed.
 *
 *   chat-jinja-parse.c  the lexer (Jinja's whitespace rules with trim_blocks and
 *                       lstrip_blocks) and the recursive-descent parser: source
 *                       -> a tree of jnode in the template's arena
 *   chat-jinja-eval.c   values (jv), scopes, the evaluator, and the filters,
 *                       tests and methods with Python's semantics
 *   chat-jinja-json.c   values <-> JSON: tojson (Python's json.dumps) and the
 *                       messages / extra variables given as JSON
 *   chat-template.c     the public API: parse, load (directory, GGUF, bundle,
 *                       built-ins, override file), render, stops
 *
 * Memory: everything lives in arenas. The parse tree is in the template's
 * arena (freed with the template); every value of a render is in that
 * render's arena (freed when it returns), so values are plain structs with no
 * reference counts, and the template is never written to while rendering.
 */
#ifndef MOE_CHAT_JINJA_IMPL_H
#define MOE_CHAT_JINJA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "moe-chat.h"

#define JJ_MAX_SOURCE ((size_t)4 << 20)   /* template text */
#define JJ_MAX_DEPTH 256                  /* nesting of blocks, expressions and macro calls */
#define JJ_MAX_RANGE 100000               /* range() items, as Jinja's sandbox */
#define JJ_MAX_OUTPUT ((size_t)64 << 20)  /* rendered bytes */
#define JJ_MAX_ARENA ((size_t)256 << 20)  /* working memory of one render */
#define JJ_MAX_STEPS 50000000L            /* evaluation steps of one render */

/* ---- arena -------------------------------------------------------------- */
struct jchunk;
struct jarena {
    struct jchunk *head;
    size_t total, limit; /* bytes allocated, the cap (0 = none) */
    int full;            /* 2: the cap was hit, 1: malloc failed */
};
void *ja_alloc(struct jarena *a, size_t n); /* zeroed; NULL (and a->full) when over the limit */
char *ja_strdup(struct jarena *a, const char *s, size_t n); /* NUL-terminated copy */
void ja_free(struct jarena *a);

/* ---- values ------------------------------------------------------------- */
enum jv_type {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_NS,      /* namespace(): a dict whose attributes can be assigned */
    JV_MACRO,   /* a macro defined by the template */
    JV_FUNC,    /* a global function (raise_exception, range, ...) */
    JV_METHOD,  /* a method bound to a value (s.strip, d.items, loop.cycle) */
    JV_LOOP,    /* the `loop` object of a for block */
};
struct jlist;
struct jdict;
struct jnode;
struct jloop;
struct jmacro;
typedef struct jv {
    enum jv_type t;
    int tuple;  /* JV_LIST: 1 a tuple, 2 a generator or iterator (what map, select, reverse... return:
                   always true, no len(), not subscriptable, not JSON); JV_UNDEF: 1 a missing attribute; JV_STR: 1 Markup (|safe, |escape: a str added to it is escaped) */
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s; /* JV_STR; JV_UNDEF: the name (may be NULL) */
        struct jlist *l;
        struct jdict *d;                       /* JV_DICT, JV_NS */
        struct jmacro *mac;                    /* JV_MACRO */
        int fn;                                /* JV_FUNC */
        struct { struct jv *self; const char *name; } meth;
        struct jloop *loop;
    } u;
} jv;
struct jlist { jv *v; size_t n, cap; };
struct jdict { jv *k, *v; size_t n, cap; };
struct jloop { size_t index0, length; const struct jlist *items; };
struct scope;
struct jmacro { const struct jnode *n; struct scope *sc; }; /* the macro and the scope it was defined in */

/* ---- parse tree --------------------------------------------------------- */
enum jn_kind {
    /* statements */
    N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_FILTERBLOCK, N_BODY,
    /* expressions */
    E_LIT, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST,
    E_NEG, E_POS, E_NOT, E_AND, E_OR, E_BIN, E_CMP, E_COND, E_CONCAT,
};
enum jop { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
           OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

/* One node. Fields by kind:
 *   N_TEXT      s/n: the text
 *   N_OUTPUT    a: the expression
 *   N_IF        a: condition, kids: body, kids2: else body (an elif is an N_IF there)
 *   N_FOR       names/n_names: targets, a: iterable, b: filter (or NULL), kids: body, kids2: else
 *   N_SET       a: target (E_NAME, E_TUPLE of names, or E_ATTR on a name), b: value
 *   N_SETBLOCK  a: target, kids: body
 *   N_MACRO     s: name, names: parameters, kids2: defaults (NULL entries), kids: body
 *   N_FILTERBLOCK  b: the filter chain applied to an E_LIT placeholder, kids: body
 *   N_BODY      kids (the template)
 *   E_LIT       lit
 *   E_NAME      s: the name
 *   E_LIST / E_TUPLE  kids: items;  E_DICT kids: keys, kids2: values
 *   E_ATTR      a: object, s: attribute;  E_ITEM a: object, b: key
 *   E_SLICE     a: object, kids[0..3): start, stop, step (NULL = absent)
 *   E_CALL      a: callee, kids: positional args, kids2: keyword values, names: keywords
 *   E_FILTER / E_TEST  a: operand (NULL inside a filter block), s: name, kids / kids2 / names: args;
 *               E_TEST op: 1 when negated (is not)
 *   E_NEG E_POS E_NOT  a
 *   E_AND E_OR E_CONCAT  a, b;  E_BIN op, a, b
 *   E_CMP       a: first operand, kids: the others, ops: one per other
 *   E_COND      a: condition, b: then, c: else (NULL: undefined)
 */
struct jnode {
    enum jn_kind kind;
    int line, col, op;
    const char *s;
    size_t n;
    struct jnode *a, *b, *c;
    struct jnode **kids, **kids2;
    size_t n_kids, n_kids2;
    const char **names;
    size_t n_names;
    int *ops;
    jv lit;
};

/* jj_parse: source -> tree (in arena). 0 ok; else a moe_status with the
 * message ("line L:C: ...") in err. */
int jj_parse(const char *src, size_t len, struct jarena *a, struct jnode **out, char *err, size_t err_size);

/* jj_known_filter / jj_known_test: 1 if this interpreter runs it, 2 if it is one
 * of Jinja's own we do not (reported when reached), 0 if Jinja has no such one. */
int jj_known_filter(const char *name);
int jj_known_test(const char *name);

/* ---- rendering ---------------------------------------------------------- */
struct jvar { const char *name; jv v; };
/* jj_render: run `root` with the variables vars[0..n); *out malloc'd. 0 ok,
 * else a moe_status with the message in err. */
int jj_render(const struct jnode *root, struct jarena *ar, const struct jvar *vars, size_t n_vars, int64_t now,
              char **out, size_t *out_len, char *err, size_t err_size);

/* value helpers shared with the JSON file */
jv jv_str(struct jarena *a, const char *s, size_t n);
jv jv_new_list(struct jarena *a);
jv jv_new_dict(struct jarena *a);
int jv_list_push(struct jarena *a, jv *l, jv v);           /* 0 ok, -1 no memory */
int jv_dict_set(struct jarena *a, jv *d, jv k, jv v);      /* replaces an equal key */
int jv_dict_get(const jv *d, const char *key, jv *out);    /* 1 found */

/* jj_from_json: a JSON text -> value in the arena (objects keep their key
 * order; integers stay integers, as Python's json.loads reads them). 0 ok;
 * -1 malformed (msg says where), -2 no memory. */
int jj_from_json(struct jarena *a, const char *text, size_t len, jv *out, char *msg, size_t msg_size);
/* a growable output buffer (limit 0: none) */
struct jbuf { char *p; size_t n, cap, limit; int full; };
int jb_put(struct jbuf *b, const char *s, size_t n); /* -1 over the limit / no memory */
/* jj_repr_float: Python's repr of a double into buf (>= 32 bytes); returns length. */
size_t jj_repr_float(double f, char *buf);

#endif

/* opt.c - getopt_long driven by option tables (moe-opt.h). */
#include "moe-opt.h"

#include <ctype.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "moe-base.h"

/* Long-only options get keys from here on: above any letter, and the entry
 * is found again from getopt_long's longindex. */
#define OPT_LONG_BASE 0x1000

static int count(const struct moe_opt *t) {
    int n = 0;
    while (t && t[n].name) n++;
    return n;
}

static int has_short(const struct moe_opt *o) { return o->key > 0 && o->key < 128 && isalnum(o->key); }

int moe_opt_parse(const char *prog, int argc, char **argv, int first, const struct moe_opt *const *tables,
                  int n_tables, moe_opt_fn fn, void *ctx, int *positional) {
    int n = 0;
    for (int t = 0; t < n_tables; t++) n += count(tables[t]);
    struct option *lo = calloc((size_t)n + 1, sizeof *lo);
    const struct moe_opt **by_index = calloc((size_t)n + 1, sizeof *by_index);
    char *shorts = malloc(3 * (size_t)n + 3);
    if (!lo || !by_index || !shorts) {
        free(lo), free(by_index), free(shorts);
        fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
    }
    size_t ns = 0;
    shorts[ns++] = ':'; /* report a missing value as ':' instead of printing */
    int k = 0;
    for (int t = 0; t < n_tables; t++)
        for (const struct moe_opt *o = tables[t]; o && o->name; o++, k++) {
            by_index[k] = o;
            lo[k].name = o->name;
            lo[k].has_arg = o->arg == MOE_OPT_REQUIRED ? required_argument
                            : o->arg == MOE_OPT_OPTIONAL ? optional_argument
                                                         : no_argument;
            lo[k].flag = NULL;
            lo[k].val = OPT_LONG_BASE + k;
            if (has_short(o)) {
                shorts[ns++] = (char)o->key;
                if (o->arg == MOE_OPT_REQUIRED) shorts[ns++] = ':';
                if (o->arg == MOE_OPT_OPTIONAL) shorts[ns++] = ':', shorts[ns++] = ':';
            }
        }
    shorts[ns] = '\0';

    int rc = 0;
    opterr = 0;
    optind = 0; /* 0: GNU getopt starts over (tests parse several argvs in one process) */
    /* getopt_long reads argv[0] as the program: hand it argv from first - 1 */
    const int sub_argc = argc - first + 1;
    char **sub = argv + first - 1;
    for (;;) {
        int li = -1;
        const int c = getopt_long(sub_argc, sub, shorts, lo, &li);
        if (c == -1) break;
        const struct moe_opt *o = NULL;
        if (c >= OPT_LONG_BASE && c < OPT_LONG_BASE + n) {
            o = by_index[c - OPT_LONG_BASE];
        } else if (c != '?' && c != ':') {
            for (int i = 0; i < n && !o; i++)
                if (has_short(by_index[i]) && by_index[i]->key == c) o = by_index[i];
        }
        if (!o) {
            const char *arg = optind > 0 && optind <= sub_argc ? sub[optind - 1] : "?";
            if (c == ':')
                fprintf(stderr, "%s: option %s needs a value (see %s --help)\n", prog, arg, prog);
            else if (optopt && optopt < OPT_LONG_BASE && !(arg[0] == '-' && arg[1] == '-'))
                fprintf(stderr, "%s: unknown option -%c (see %s --help)\n", prog, optopt, prog);
            else if (optopt >= OPT_LONG_BASE)
                fprintf(stderr, "%s: option \"%s\" takes no value (see %s --help)\n", prog, arg, prog);
            else
                fprintf(stderr, "%s: unknown or ambiguous option \"%s\" (see %s --help)\n", prog, arg, prog);
            rc = 2;
            break;
        }
        if ((rc = fn(ctx, o, optarg))) break;
    }
    if (positional) *positional = first - 1 + optind;
    free(lo), free(by_index), free(shorts);
    return rc;
}

/* help_to: the help of one table appended to b. */
static enum moe_status help_to(struct moe_buf *b, const struct moe_opt *table) {
    enum { COL = 28 };
    enum moe_status st = MOE_OK;
    for (const struct moe_opt *o = table; o && o->name && !st; o++) {
        const size_t start = b->len;
        if (has_short(o)) st = moe_buf_printf(b, "  -%c, --%s", o->key, o->name);
        else st = moe_buf_printf(b, "      --%s", o->name);
        if (!st && o->metavar)
            st = moe_buf_printf(b, o->arg == MOE_OPT_OPTIONAL ? "[=%s]" : " %s", o->metavar);
        size_t w = b->len - start;
        const char *h = o->help ? o->help : "";
        if (!st && w + 2 > COL) st = moe_buf_printf(b, "\n"), w = 0;
        while (!st) {
            const char *nl = strchr(h, '\n');
            const int len = nl ? (int)(nl - h) : (int)strlen(h);
            st = moe_buf_printf(b, "%*s%.*s\n", (int)(COL - w), "", len, h);
            w = 0;
            if (!nl) break;
            h = nl + 1;
        }
    }
    return st;
}

char *moe_opt_help_text(const struct moe_opt *table) {
    struct moe_buf b = {0};
    if (help_to(&b, table) || moe_buf_append(&b, "", 0)) {
        moe_buf_free(&b);
        return NULL;
    }
    return moe_buf_take(&b);
}

void moe_opt_help(FILE *f, const struct moe_opt *table) {
    char *s = moe_opt_help_text(table);
    if (s) fputs(s, f);
    free(s);
}

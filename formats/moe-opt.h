/*
 * moe-opt.h - command-line options from one table: each option's name, short
 * letter, argument and help text are written once, and both getopt_long's
 * option array and the --help text are made from it. Every CLI of the
 * project (moe-run and each moe-prep subcommand) parses through this, so
 * they all accept "--opt value", "--opt=value", "-o value", "-ovalue",
 * "--" and options after positional arguments (GNU getopt_long's rules,
 * with unambiguous long-name prefixes), and report mistakes the same way.
 *
 * A command may parse several tables at once (its own and a shared one, as
 * eval and moe-run share the expert store's options): a value's handler gets
 * the table entry that matched.
 *
 * Not thread-safe: getopt_long keeps global state. Call from main's thread.
 */
#ifndef MOE_OPT_H
#define MOE_OPT_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum moe_opt_arg { MOE_OPT_NONE = 0, MOE_OPT_REQUIRED = 1, MOE_OPT_OPTIONAL = 2 };

/* One option. A table is an array ended by an entry whose name is NULL. */
struct moe_opt {
    const char *name;      /* long name without "--" */
    int key;               /* a short letter ('o' for -o), or 0 for long only; the handler
                            * tells options apart by entry (or by key where keys are unique) */
    enum moe_opt_arg arg;  /* MOE_OPT_OPTIONAL values need "--name=value" */
    const char *metavar;   /* the argument's name in the help ("FILE"), NULL without one */
    const char *help;      /* what it does; '\n' starts a new help line */
};

/* Called for each option in command-line order with the entry that matched
 * and its value (NULL when it has none). Return 0 to go on; anything else
 * stops the parse and is returned by moe_opt_parse (print the reason first:
 * by convention 2 for a usage error). */
typedef int (*moe_opt_fn)(void *ctx, const struct moe_opt *opt, const char *value);

/* moe_opt_parse: parse argv[first..argc) against tables[0..n_tables). Options
 * go to fn; the positional arguments are gathered, in order, at the end of
 * argv (getopt_long permutes it), and *positional is set to the index of the
 * first of them (so they are argv[*positional..argc)). `prog` names the
 * command in messages ("moe-prep quantize"). An unknown option, an ambiguous
 * prefix, a missing value or a value given to an option that takes none is
 * reported on stderr as "PROG: ... (see PROG --help)" and returns 2. Returns
 * 0, 2, or the first non-zero value fn returned. */
int moe_opt_parse(const char *prog, int argc, char **argv, int first, const struct moe_opt *const *tables,
                  int n_tables, moe_opt_fn fn, void *ctx, int *positional);

/* moe_opt_help: the options of one table as help text to f, one option per
 * line ("  -o, --output FILE   what it does"), help lines aligned in a column
 * and continued lines indented under it. */
void moe_opt_help(FILE *f, const struct moe_opt *table);

/* moe_opt_help_text: the same text as a malloc'd string (caller frees; NULL
 * when out of memory). */
char *moe_opt_help_text(const struct moe_opt *table);

#ifdef __cplusplus
}
#endif

#endif

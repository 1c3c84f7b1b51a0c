/* tool-util.h - small helpers shared by the moe-prep subcommands. */
#ifndef MOE_TOOL_UTIL_H
#define MOE_TOOL_UTIL_H

#include <stdio.h>

/* moe_tool_json_string: write s as a JSON string literal to f (NULL as null). */
void moe_tool_json_string(FILE *f, const char *s);

/* moe_tool_parse_double / moe_tool_parse_ll: option `opt`'s value v as a
 * number in [lo, hi]; on a bad value print "moe-prep CMD: OPT wants ..." to
 * stderr and return 0 (the caller exits 2), else store it and return 1. */
int moe_tool_parse_double(const char *cmd, const char *opt, const char *v, double lo, double hi, double *out);
int moe_tool_parse_ll(const char *cmd, const char *opt, const char *v, long long lo, long long hi, long long *out);

#endif

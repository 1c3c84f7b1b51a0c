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

/* moe_tool_parse_size: option `opt`'s value v as a byte count: a number
 * with an optional unit B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB,
 * TB (powers of 1000), case-insensitive, e.g. "2GiB", "1.5 GB", "1048576";
 * at least 1 byte. On a bad value print "moe-prep CMD: OPT wants a size ..."
 * and return 0, else store the whole bytes and return 1. */
int moe_tool_parse_size(const char *cmd, const char *opt, const char *v, long long *out);

#endif

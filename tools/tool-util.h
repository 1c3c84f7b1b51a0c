/* tool-util.h - small helpers shared by the moe-prep subcommands. */
#ifndef MOE_TOOL_UTIL_H
#define MOE_TOOL_UTIL_H

#include <stdio.h>

/* moe_tool_json_string: write s as a JSON string literal to f (NULL as null). */
void moe_tool_json_string(FILE *f, const char *s);

#endif

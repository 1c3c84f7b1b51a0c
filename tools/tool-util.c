/* tool-util.c - small helpers shared by the moe-prep subcommands. */
#include "tool-util.h"

#include <stdlib.h>

void moe_tool_json_string(FILE *f, const char *s) {
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

int moe_tool_parse_double(const char *cmd, const char *opt, const char *v, double lo, double hi, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "moe-prep %s: %s wants a number in [%g, %g], not \"%s\"\n", cmd, opt, lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

int moe_tool_parse_ll(const char *cmd, const char *opt, const char *v, long long lo, long long hi, long long *out) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "moe-prep %s: %s wants an integer in [%lld, %lld], not \"%s\"\n", cmd, opt, lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

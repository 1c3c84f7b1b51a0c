/* base.c - monotonic clock, growable buffer, UTF-8 validation, path joins
 * (moe-base.h). */
#include "moe-base.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

double moe_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum moe_status moe_buf_reserve(struct moe_buf *b, size_t extra) {
    if (extra > SIZE_MAX - 1 - b->len) return MOE_ERR_NOMEM;
    const size_t need = b->len + extra + 1;
    if (need <= b->cap) return MOE_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : 2 * cap;
    char *p = realloc(b->data, cap);
    if (!p) return MOE_ERR_NOMEM;
    b->data = p;
    b->cap = cap;
    return MOE_OK;
}

enum moe_status moe_buf_append(struct moe_buf *b, const void *p, size_t n) {
    enum moe_status st = moe_buf_reserve(b, n);
    if (st) return st;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return MOE_OK;
}

enum moe_status moe_buf_vprintf(struct moe_buf *b, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    const int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return MOE_ERR_INVALID;
    enum moe_status st = moe_buf_reserve(b, (size_t)n);
    if (st) return st;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return MOE_OK;
}

enum moe_status moe_buf_printf(struct moe_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    enum moe_status st = moe_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return st;
}

char *moe_buf_take(struct moe_buf *b) {
    char *p = b->data;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

void moe_buf_free(struct moe_buf *b) {
    if (!b) return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

size_t moe_utf8_bad_offset(const void *p, size_t n) {
    const uint8_t *s = p;
    size_t i = 0;
    while (i < n) {
        const uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF; /* the second byte's allowed range */
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0; /* overlong */
            if (c == 0xED) hi = 0x9F; /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90; /* overlong */
            if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
        } else {
            return i; /* a continuation byte, C0/C1 or F5..FF */
        }
        if (n - i < len || s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += len;
    }
    return n;
}

char *moe_path_join(const char *dir, const char *name) {
    const size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a > 0 && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

enum moe_status moe_parse_size(const char *s, int64_t *out) {
    static const struct {
        const char *unit;
        double mult;
    } k_units[] = {{"", 1},          {"b", 1},          {"k", 1024.0},   {"m", 1048576.0},      {"g", 1073741824.0},
                   {"t", 1099511627776.0}, {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0},
                   {"tib", 1099511627776.0}, {"kb", 1e3},     {"mb", 1e6},         {"gb", 1e9},         {"tb", 1e12}};
    if (!s) return MOE_ERR_INVALID;
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0) || *s == '-' || *s == ' ' || *s == '+') return MOE_ERR_INVALID;
    while (*end == ' ') end++;
    for (size_t i = 0; i < sizeof k_units / sizeof k_units[0]; i++)
        if (strcasecmp(end, k_units[i].unit) == 0) {
            const double b = v * k_units[i].mult;
            if (!(b <= 9.0e18)) return MOE_ERR_INVALID;
            *out = (int64_t)b;
            return MOE_OK;
        }
    return MOE_ERR_INVALID;
}

/*
 * moe-base.h - the small helpers every layer needs, in one place: a monotonic
 * clock, a growable byte buffer, strict UTF-8 validation with the offset of
 * the first bad byte, and path joining. Before this module each of them was
 * written again in several files (the clock in a dozen).
 *
 * No global state: every function is thread-safe on distinct objects.
 */
#ifndef MOE_BASE_H
#define MOE_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* moe_now_s: seconds on the monotonic clock (CLOCK_MONOTONIC), for measuring
 * intervals; unaffected by changes of the wall clock. */
double moe_now_s(void);

/* A growable byte buffer. Zero-initialise it ({0}); data is NUL-terminated
 * whenever it is non-NULL (the terminator is not counted in len), so text
 * built with moe_buf_printf is a C string. Free with moe_buf_free. */
struct moe_buf {
    char *data;
    size_t len; /* bytes used */
    size_t cap; /* bytes allocated (including the terminator's) */
};

/* moe_buf_reserve: make room for `extra` more bytes (plus the terminator),
 * growing geometrically. MOE_ERR_NOMEM (buffer unchanged) on failure or
 * overflow. */
enum moe_status moe_buf_reserve(struct moe_buf *b, size_t extra);

/* moe_buf_append: append n bytes (n may be 0; p may then be NULL). */
enum moe_status moe_buf_append(struct moe_buf *b, const void *p, size_t n);

/* moe_buf_printf / moe_buf_vprintf: append formatted text. */
enum moe_status moe_buf_printf(struct moe_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
enum moe_status moe_buf_vprintf(struct moe_buf *b, const char *fmt, va_list ap);

/* moe_buf_take: hand the bytes over (caller frees; NULL if nothing was ever
 * appended) and leave b empty. */
char *moe_buf_take(struct moe_buf *b);

/* moe_buf_free: release the bytes and leave b empty; NULL is a no-op. */
void moe_buf_free(struct moe_buf *b);

/* moe_utf8_bad_offset: the offset of the first byte of s[0..n) that breaks
 * strict UTF-8 (Unicode Table 3-7: no overlong forms, no UTF-16 surrogates,
 * nothing above U+10FFFF, no truncated sequence), or n when all of it is
 * valid. NUL bytes and control characters are valid UTF-8: callers that
 * refuse them check separately. */
size_t moe_utf8_bad_offset(const void *s, size_t n);

/* moe_path_join: "dir/name" as a malloc'd string (caller frees; NULL when
 * out of memory): no slash added when dir is empty or already ends with one. */
char *moe_path_join(const char *dir, const char *name);

/* moe_parse_size: a byte count as every command spells it: a number
 * (fractions allowed) and an optional unit, case-insensitive: none or B
 * (bytes); K, M, G, T and KiB, MiB, GiB, TiB (powers of 1024); KB, MB, GB, TB
 * (powers of 1000, as disks are sold). "512M" = 512 MiB, "2G" = "2GiB" =
 * 2147483648, "2GB" = 2000000000, "1.5G" = 1610612736. A space before the
 * unit is allowed. The result is truncated to whole bytes; MOE_ERR_INVALID
 * for anything else, a negative number or more than 9e18 bytes. */
enum moe_status moe_parse_size(const char *s, int64_t *out);

#ifdef __cplusplus
}
#endif

#endif

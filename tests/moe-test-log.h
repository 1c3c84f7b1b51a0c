/* moe-test-log.h - log capture for tests of parsers: errors and warnings since
 * the last log_reset() are kept (joined by '\n') so a test can check that a
 * malformed input produced exactly the message it names. MOE_TEST_VERBOSE=1
 * also prints every message. Install with moe_log_set(capture, NULL). */
#ifndef MOE_TEST_LOG_H
#define MOE_TEST_LOG_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-status.h"

static char g_err[16384], g_warn[16384];
static int g_n_err, g_n_warn;

/* append: add msg to a capture buffer (truncating when full). */
static void append(char *dst, size_t cap, const char *msg) {
    size_t n = strlen(dst);
    snprintf(dst + n, cap - n, "%s%s", n ? "\n" : "", msg);
}

/* capture: the log callback. */
static void capture(enum moe_log_level level, const char *msg, void *user) {
    (void)user;
    if (getenv("MOE_TEST_VERBOSE")) fprintf(stderr, "  log[%d] %s\n", (int)level, msg);
    if (level >= MOE_LOG_ERROR) {
        g_n_err++;
        append(g_err, sizeof g_err, msg);
    } else if (level == MOE_LOG_WARN) {
        g_n_warn++;
        append(g_warn, sizeof g_warn, msg);
    }
}

/* log_reset: forget the captured messages (before each case). */
static void log_reset(void) {
    g_err[0] = g_warn[0] = 0;
    g_n_err = g_n_warn = 0;
}

#endif

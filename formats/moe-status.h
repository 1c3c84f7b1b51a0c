/*
 * moe-status.h - result codes, logging and assertions shared by every module.
 *
 * Every fallible function in the project returns an enum moe_status (0 = OK,
 * negative = error). Codes are append-only so that numeric values stay stable.
 * Libraries never print directly: they log through moe_log(), which calls the
 * callback installed with moe_log_set() (NULL restores the default: stderr).
 */
#ifndef MOE_STATUS_H
#define MOE_STATUS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

enum moe_status {
    MOE_OK = 0,
    MOE_ERR_IO = -1,          /* open/read/write/mmap failed */
    MOE_ERR_FORMAT = -2,      /* a file's bytes are malformed */
    MOE_ERR_NOMEM = -3,       /* allocation failed */
    MOE_ERR_INVALID = -4,     /* bad argument or value (from argv or a config) */
    MOE_ERR_UNSUPPORTED = -5, /* valid input we do not handle (e.g. unknown architecture) */
    MOE_ERR_NOT_FOUND = -6,   /* a named item (tensor, file, field) is missing */
    MOE_ERR_SHAPE = -7,       /* a tensor has the wrong shape or dtype */
    MOE_ERR_RANGE = -8,       /* an index or size is out of range */
    MOE_ERR_CANCELLED = -9,   /* the caller asked the call to stop (a cancel flag) */
    MOE_ERR_BACKEND = -10,    /* the backend failed: a device, driver or kernel error (a CUDA call) */
};

/* moe_status_str: a short English name for a status code; never NULL. */
const char *moe_status_str(enum moe_status s);

enum moe_log_level { MOE_LOG_DEBUG = 0, MOE_LOG_INFO = 1, MOE_LOG_WARN = 2, MOE_LOG_ERROR = 3 };

typedef void (*moe_log_fn)(enum moe_log_level level, const char *msg, void *user);

/* moe_log_set: install a process-wide log callback (NULL = print to stderr).
 * Not thread-safe against concurrent moe_log() calls; call it at start-up. */
void moe_log_set(moe_log_fn fn, void *user);

/* moe_log_set_level: messages below this level are dropped (default INFO). */
void moe_log_set_level(enum moe_log_level level);

/* moe_log: format and emit one message. Thread-safe. */
void moe_log(enum moe_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Error helper: logs "func: message" at ERROR level. */
#define MOE_LOGE(...) moe_log_func(MOE_LOG_ERROR, __func__, __VA_ARGS__)
#define MOE_LOGW(...) moe_log_func(MOE_LOG_WARN, __func__, __VA_ARGS__)
#define MOE_LOGI(...) moe_log(MOE_LOG_INFO, __VA_ARGS__)
#define MOE_LOGD(...) moe_log_func(MOE_LOG_DEBUG, __func__, __VA_ARGS__)
void moe_log_func(enum moe_log_level level, const char *func, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* MOE_ASSERT: programmer errors only (never for bad input). Stays on in release builds. */
#define MOE_ASSERT(x)                                                                  \
    do {                                                                               \
        if (!(x)) {                                                                    \
            fprintf(stderr, "%s:%d: %s: assertion failed: %s\n", __FILE__, __LINE__,   \
                    __func__, #x);                                                     \
            abort();                                                                   \
        }                                                                              \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif

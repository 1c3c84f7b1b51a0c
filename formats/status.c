/* status.c - result code names and the logging callback. */
#include "moe-status.h"

#include <pthread.h>
#include <string.h>

const char *moe_status_str(enum moe_status s) {
    switch (s) {
    case MOE_OK: return "ok";
    case MOE_ERR_IO: return "I/O error";
    case MOE_ERR_FORMAT: return "malformed file";
    case MOE_ERR_NOMEM: return "out of memory";
    case MOE_ERR_INVALID: return "invalid argument";
    case MOE_ERR_UNSUPPORTED: return "unsupported";
    case MOE_ERR_NOT_FOUND: return "not found";
    case MOE_ERR_SHAPE: return "wrong shape";
    case MOE_ERR_RANGE: return "out of range";
    case MOE_ERR_CANCELLED: return "cancelled";
    case MOE_ERR_BACKEND: return "backend error";
    }
    return "unknown status";
}

static moe_log_fn g_log_fn;
static void *g_log_user;
static enum moe_log_level g_log_level = MOE_LOG_INFO;
static pthread_mutex_t g_log_mutex = PTHREAD_MUTEX_INITIALIZER;

void moe_log_set(moe_log_fn fn, void *user) {
    g_log_fn = fn;
    g_log_user = user;
}

void moe_log_set_level(enum moe_log_level level) { g_log_level = level; }

static void emit(enum moe_log_level level, const char *msg) {
    pthread_mutex_lock(&g_log_mutex);
    if (g_log_fn) {
        g_log_fn(level, msg, g_log_user);
    } else {
        static const char *const names[] = {"debug", "info", "warning", "error"};
        if (level == MOE_LOG_INFO)
            fprintf(stderr, "%s\n", msg);
        else
            fprintf(stderr, "%s: %s\n", names[level], msg);
    }
    pthread_mutex_unlock(&g_log_mutex);
}

void moe_log(enum moe_log_level level, const char *fmt, ...) {
    if (level < g_log_level) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    emit(level, buf);
}

void moe_log_func(enum moe_log_level level, const char *func, const char *fmt, ...) {
    if (level < g_log_level) return;
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%s: ", func);
    if (n < 0 || (size_t)n >= sizeof buf) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    emit(level, buf);
}

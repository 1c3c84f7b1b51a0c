/* moe-test.h - the CHECK macro shared by the C tests: every check is counted
 * (checks); a failed one prints its location, the condition and the message
 * and is counted too (fails); main() returns fails != 0. */
#ifndef MOE_TEST_H
#define MOE_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

static int fails;
static int checks __attribute__((unused));

/* Deterministic random numbers (xorshift64*): the same sequence for the same
 * seed on every machine. A test may set moe_test_rng to its own seed first. */
static uint64_t moe_test_rng __attribute__((unused)) = 0x9e3779b97f4a7c15ull;
static inline uint64_t moe_test_rnd64(void) {
    moe_test_rng ^= moe_test_rng >> 12;
    moe_test_rng ^= moe_test_rng << 25;
    moe_test_rng ^= moe_test_rng >> 27;
    return moe_test_rng * 0x2545f4914f6cdd1dull;
}
/* moe_test_rnd_unit: uniform in [0, 1) with 53 bits. */
static inline double moe_test_rnd_unit(void) { return (double)(moe_test_rnd64() >> 11) * 0x1p-53; }
/* moe_test_rnd_normal: N(0, 1) by Box-Muller (two uniforms a value). */
static inline float moe_test_rnd_normal(void) {
    double u = moe_test_rnd_unit(), v = moe_test_rnd_unit();
    if (u < 1e-300) u = 1e-300;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        checks++;                                                            \
        if (!(cond)) {                                                       \
            fails++;                                                         \
            fprintf(stderr, "FAIL %s:%d: (%s) ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                    \
            fputc('\n', stderr);                                             \
        }                                                                    \
    } while (0)

/* moe_test_sh_out: run a shell command (printf-style) and return its exit
 * status (-1 if it did not exit normally); with out, its stdout (at most
 * cap - 1 bytes, NUL-terminated) is kept there, else it is read and dropped. */
static inline int moe_test_sh_out(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline int moe_test_sh_out(char *out, size_t cap, const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char sink[4096];
    size_t n = out ? fread(out, 1, cap - 1, p) : 0;
    if (out) out[n] = 0;
    while (!out && fread(sink, 1, sizeof sink, p) > 0) {
    }
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* moe_test_sh: run a shell command (printf-style; its output goes where the
 * test's goes) and return its exit status, -1 if it did not exit normally. */
static inline int moe_test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int moe_test_sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    const int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif

/* moe-test.h - the CHECK macro shared by the C tests: every check is counted
 * (checks); a failed one prints its location, the condition and the message
 * and is counted too (fails); main() returns fails != 0. */
#ifndef MOE_TEST_H
#define MOE_TEST_H

#include <stdio.h>

static int fails;
static int checks __attribute__((unused));

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

#endif

/* moe-test.h - the CHECK macro shared by the C tests: a failed check prints
 * its location and message and counts; main() returns fails != 0. */
#ifndef MOE_TEST_H
#define MOE_TEST_H

#include <stdio.h>

static int fails;

#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (!(cond)) {                                           \
            fails++;                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
        }                                                        \
    } while (0)

#endif

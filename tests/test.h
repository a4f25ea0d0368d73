/* Minimal test harness: each test binary counts its checks and ends with
 * "N passed, N failed"; tests/run.sh sums the binaries' lines. */
#ifndef PI2_TEST_H
#define PI2_TEST_H

#include <stdio.h>

static int test_passed, test_failed;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            test_passed++;                                                      \
        } else {                                                                \
            test_failed++;                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

static inline int test_summary(void) {
    printf("%d passed, %d failed\n", test_passed, test_failed);
    return test_failed ? 1 : 0;
}

#endif

/* Minimal test harness: each test binary counts its checks and ends with
 * "N passed, N failed, N skipped"; tests/run.sh sums the binaries' lines. */
#ifndef PI2_TEST_H
#define PI2_TEST_H

#include <stdio.h>

static int test_passed, test_failed, test_skipped;

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

/* A part this machine cannot run (a kernel set its CPU lacks): counted, and
 * named on a line "SKIP what" that tests/run.sh names once for the run. */
#define SKIP(...)                                                               \
    do {                                                                        \
        test_skipped++;                                                         \
        printf("SKIP ");                                                        \
        printf(__VA_ARGS__);                                                    \
        putchar('\n');                                                          \
    } while (0)

static inline int test_summary(void) {
    printf("%d passed, %d failed, %d skipped\n", test_passed, test_failed, test_skipped);
    return test_failed ? 1 : 0;
}

#endif

/* calloc for set-up code that allocates several arrays and checks once:
 * a failure sets *failed instead of each pointer being tested; n == 0 still
 * gives a pointer (free-able, never dereferenced).
 *
 * Errors: a failed allocation sets *failed to 1 and returns NULL; the caller
 * checks *failed once and frees what it got. */
#ifndef PI2_UTIL_CALLOC_FLAGGED_H
#define PI2_UTIL_CALLOC_FLAGGED_H

#include <stdlib.h>

static inline void *calloc_flagged(size_t n, size_t size, int *failed) {
    void *p = calloc(n ? n : 1, size);
    if (!p) *failed = 1;
    return p;
}

#endif

/* qsort's comparison for doubles, ascending: medians of timed passes.
 *
 * Errors: none (a NaN compares equal to every value). */
#ifndef PI2_COMPARE_DOUBLE_H
#define PI2_COMPARE_DOUBLE_H

static inline int compare_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif

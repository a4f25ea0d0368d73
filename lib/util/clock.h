/* CLOCK_MONOTONIC in the units pi2 uses. One clock for every process of a
 * stack: heartbeats and deadlines in the control segment are compared across
 * processes, so they must all read the same one.
 *
 * Errors: none: clock_gettime's result is not checked; with CLOCK_MONOTONIC
 * and a valid pointer it cannot fail. */
#ifndef PI2_CLOCK_H
#define PI2_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Task timings (TaskDone, PrefillDone) travel in microseconds. */
static inline uint64_t clock_us(void) { return clock_ns() / 1000u; }

/* Deadlines, timeouts and heartbeats. */
static inline int64_t clock_ms(void) { return (int64_t)(clock_ns() / 1000000u); }

/* Durations for logs and benchmarks. */
static inline double clock_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif

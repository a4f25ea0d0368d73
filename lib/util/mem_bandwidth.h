/* Memory read bandwidth, measured: a buffer far larger than the caches is
 * summed as 64-bit words, by one thread or split over a pool's, and the
 * fastest of several passes counts (the one least disturbed by other work).
 * The planner's hardware profile and kernel-bench both report it; the decode
 * benchmarks divide by it to show how close a mode comes to the memory.
 *
 * Errors: none: the measurement cannot fail. */
#ifndef PI2_MEM_BANDWIDTH_H
#define PI2_MEM_BANDWIDTH_H

#include <stddef.h>
#include <stdint.h>

#include "util/threadpool.h"

/* Bytes per second of buf[0..bytes) (16-byte aligned; a whole multiple of 64
 * is read) over passes of at least `seconds` in all (and at least two);
 * pool NULL: this thread alone. */
double mem_read_rate(const uint8_t *buf, size_t bytes, threadpool *pool, double seconds);

#endif

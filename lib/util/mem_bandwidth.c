/* Memory read bandwidth (mem_bandwidth.h). */
#include "util/mem_bandwidth.h"

#include <stdatomic.h>

#include "util/clock.h"

#define MIN_PASSES 2

typedef uint64_t u64x2 __attribute__((vector_size(16), may_alias));

/* keeps the sums from being optimised away; relaxed adds: nothing reads it */
static _Atomic uint64_t memory_sink;

/* Sum of bytes as 64-bit words, in four independent vector sums so that the
 * adds keep up with memory (bytes: a multiple of 64, p 16-byte aligned). */
static uint64_t sum_words(const uint8_t *p, size_t bytes) {
    u64x2 a = {0}, b = {0}, c = {0}, d = {0};
    for (size_t i = 0; i < bytes; i += 64) {
        const u64x2 *v = (const u64x2 *)(p + i);
        a += v[0], b += v[1], c += v[2], d += v[3];
    }
    const u64x2 s = a + b + c + d;
    return s[0] + s[1];
}

typedef struct {
    const uint8_t *buf;
    size_t bytes; /* a multiple of 64 */
} span;

static void sum_share(void *ctx, int ith, int nth) {
    const span *s = ctx;
    long begin, end;
    pool_split((long)(s->bytes / 64), ith, nth, &begin, &end);
    /* relaxed: a sink that keeps the sums (and so the reads) from being dropped; it orders nothing */
    atomic_fetch_add_explicit(&memory_sink, sum_words(s->buf + (size_t)begin * 64, (size_t)(end - begin) * 64),
                              memory_order_relaxed);
}

double mem_read_rate(const uint8_t *buf, size_t bytes, threadpool *pool, double seconds) {
    span s = {buf, bytes / 64 * 64};
    double best = 0;
    const double start = clock_seconds();
    for (int i = 0; i < MIN_PASSES || clock_seconds() - start < seconds; i++) {
        const double t0 = clock_seconds();
        if (pool) pool_run(pool, sum_share, &s);
        else sum_share(&s, 0, 1);
        const double t = clock_seconds() - t0;
        if (t > 0 && (double)s.bytes / t > best) best = (double)s.bytes / t;
    }
    return best;
}

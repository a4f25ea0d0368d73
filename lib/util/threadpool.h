/* A fixed pool of threads that run one parallel job at a time. The calling
 * thread takes part as worker 0; idle workers spin briefly, then sleep, so
 * the many small per-layer jobs of a decode step cost microseconds, not a
 * futex round trip each.
 *
 * Errors: pool_new returns NULL when out of memory; a worker thread that
 * cannot be started aborts via PI2_ASSERT. pool_run cannot fail. */
#ifndef PI2_THREADPOOL_H
#define PI2_THREADPOOL_H

typedef void (*pool_fn)(void *ctx, int ith, int nth);
typedef struct threadpool threadpool;

threadpool *pool_new(int n_threads);
void pool_free(threadpool *p);
int pool_size(const threadpool *p);
/* Run fn(ctx, i, n) on every worker i in [0, n) and wait for all of them. */
void pool_run(threadpool *p, pool_fn fn, void *ctx);

/* The [begin, end) share of n items for worker ith of nth. */
static inline void pool_split(long n, int ith, int nth, long *begin, long *end) {
    *begin = n * ith / nth;
    *end = n * (ith + 1) / nth;
}

#endif

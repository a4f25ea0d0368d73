#include "util/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util/cpu_relax.h"
#include "util/pi2_assert.h"

/* Spin this many cpu_relax iterations (tens of microseconds) before sleeping or
 * yielding: long enough to bridge the serial work between two jobs of a
 * decode step, short enough not to steal a shared core from other processes. */
#define SPIN_ITERS 4000

struct threadpool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint generation;   /* bumped once per job */
    atomic_int pending;       /* workers (other than 0) still running the job */
    atomic_int sleepers;
    pool_fn fn;
    void *ctx;
    atomic_bool stop;
};

typedef struct { threadpool *p; int ith; } worker_arg;

static unsigned wait_for_job(threadpool *p, unsigned seen) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        /* acquire: pairs with publish()'s release, so p->fn and p->ctx of the new job are seen */
        unsigned g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    unsigned g;
    while ((g = atomic_load(&p->generation)) == seen) pthread_cond_wait(&p->wake, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *argp) {
    worker_arg *arg = argp;
    threadpool *p = arg->p;
    int ith = arg->ith;
    free(arg);
    unsigned seen = 0;
    for (;;) {
        seen = wait_for_job(p, seen);
        if (atomic_load(&p->stop)) return NULL;
        p->fn(p->ctx, ith, p->n);
        /* release: publishes what fn wrote to pool_run's acquire load of pending */
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

threadpool *pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    threadpool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) { free(p); return NULL; }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        PI2_ASSERT(arg, "out of memory starting thread %d of a pool of %d", i, n_threads);
        arg->p = p;
        arg->ith = i;
        const int rc = pthread_create(&p->threads[i], NULL, worker_main, arg);
        PI2_ASSERT(rc == 0, "starting thread %d of a pool of %d: %s", i, n_threads, strerror(rc));
    }
    return p;
}

static void publish(threadpool *p) {
    pthread_mutex_lock(&p->mu); /* pairs with the sleepers' check-then-wait */
    /* release: the job (fn, ctx, pending) written before it is seen by wait_for_job's acquire load */
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->sleepers)) pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

void pool_run(threadpool *p, pool_fn fn, void *ctx) {
    if (p->n == 1) { fn(ctx, 0, 1); return; }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->n - 1);
    publish(p);
    fn(ctx, 0, p->n);
    /* acquire: pairs with each worker's release decrement, so their results are seen once pending is 0 */
    for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
        if (i < SPIN_ITERS) cpu_relax();
        else sched_yield(); /* a worker was descheduled: give it the core */
    }
}

int pool_size(const threadpool *p) { return p->n; }

void pool_free(threadpool *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    publish(p);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p->threads);
    free(p);
}

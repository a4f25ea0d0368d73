/* The threads engine of read_engine.c (read_threads.h). */
#include "util/read_threads.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/log.h"

/* A read needs little stack: pread and a few locals; the larger of this and the C library's least */
#define THREAD_STACK_BYTES ((size_t)256 << 10)

typedef struct {
    int fd;
    void *dest;
    uint32_t len;
    uint64_t off, tag;
    int32_t result;
} read_req;

/* A ring of request indices, depth long: every request is in at most one ring. */
typedef struct {
    uint32_t *at;
    unsigned head, count;
} index_ring;

struct read_threads {
    unsigned depth;
    read_req *reqs;          /* [depth] */
    /* the preparing thread's alone */
    uint32_t *free_reqs;     /* [depth] */
    unsigned n_free;
    index_ring prepared;
    /* under lock */
    pthread_mutex_t lock;
    pthread_cond_t work;     /* a request queued, or stop */
    pthread_cond_t done;     /* as many finished as the waiter wants */
    index_ring queued, finished;
    unsigned want;           /* the waiter's target; UINT_MAX while nobody waits */
    bool stop;
    pthread_t *threads;
    unsigned n_threads;
};

static void ring_push(index_ring *r, unsigned depth, uint32_t i) {
    r->at[(r->head + r->count++) % depth] = i;
}

static uint32_t ring_pop(index_ring *r, unsigned depth) {
    const uint32_t i = r->at[r->head];
    r->head = (r->head + 1) % depth;
    r->count--;
    return i;
}

static void *reader_main(void *arg) {
    read_threads *t = arg;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (!t->queued.count && !t->stop) pthread_cond_wait(&t->work, &t->lock);
        if (!t->queued.count) break; /* stopping, and nothing left to read */
        const uint32_t i = ring_pop(&t->queued, t->depth);
        pthread_mutex_unlock(&t->lock);
        read_req *q = &t->reqs[i];
        /* one pread, as one io_uring read: a short or interrupted one is the caller's to go on with */
        const ssize_t n = pread(q->fd, q->dest, q->len, (off_t)q->off);
        pthread_mutex_lock(&t->lock);
        q->result = n < 0 ? -errno : (int32_t)n; /* published to the popping thread by the lock */
        ring_push(&t->finished, t->depth, i);
        if (t->finished.count >= t->want) pthread_cond_signal(&t->done);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

/* Starts the threads with every signal blocked: SIGTERM and the like go to the process's own threads,
 * whose waits they must interrupt. */
static unsigned start_threads(read_threads *t, unsigned n) {
    pthread_attr_t attr;
    if (pthread_attr_init(&attr)) return 0;
    const long least = sysconf(_SC_THREAD_STACK_MIN);
    pthread_attr_setstacksize(&attr, least > 0 && (size_t)least > THREAD_STACK_BYTES ? (size_t)least
                                                                                     : THREAD_STACK_BYTES);
    sigset_t all, was;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &was);
    unsigned started = 0;
    while (started < n && pthread_create(&t->threads[started], &attr, reader_main, t) == 0) started++;
    pthread_sigmask(SIG_SETMASK, &was, NULL);
    pthread_attr_destroy(&attr);
    return started;
}

read_threads *read_threads_start(unsigned depth, unsigned n_threads, char *err, size_t errlen) {
    read_threads *t = calloc(1, sizeof *t);
    if (!t || !depth || !n_threads) {
        free(t);
        err_set(err, errlen, depth && n_threads ? "out of memory" : "no reads or no threads asked for");
        return NULL;
    }
    t->depth = depth;
    t->reqs = calloc(depth, sizeof *t->reqs);
    t->free_reqs = calloc(depth, sizeof *t->free_reqs);
    t->prepared.at = calloc(depth, sizeof(uint32_t));
    t->queued.at = calloc(depth, sizeof(uint32_t));
    t->finished.at = calloc(depth, sizeof(uint32_t));
    t->threads = calloc(n_threads, sizeof *t->threads);
    pthread_condattr_t ca;
    bool ok = t->reqs && t->free_reqs && t->prepared.at && t->queued.at && t->finished.at && t->threads &&
              pthread_condattr_init(&ca) == 0;
    if (ok) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* read_threads_wait's deadlines */
        pthread_mutex_init(&t->lock, NULL);
        pthread_cond_init(&t->work, NULL);
        pthread_cond_init(&t->done, &ca);
        pthread_condattr_destroy(&ca);
        for (unsigned i = 0; i < depth; i++) t->free_reqs[i] = depth - 1 - i;
        t->n_free = depth;
        t->want = UINT_MAX;
        t->n_threads = start_threads(t, n_threads);
        if (!t->n_threads) {
            err_set(err, errlen, "cannot start a reading thread: %s", strerror(errno));
            read_threads_stop(t);
            return NULL;
        }
        if (t->n_threads < n_threads) log_warn("read threads: %u of %u started", t->n_threads, n_threads);
        return t;
    }
    err_set(err, errlen, "out of memory");
    free(t->reqs), free(t->free_reqs), free(t->prepared.at), free(t->queued.at), free(t->finished.at);
    free(t->threads), free(t);
    return NULL;
}

void read_threads_stop(read_threads *t) {
    if (!t) return;
    pthread_mutex_lock(&t->lock);
    t->stop = true;
    pthread_cond_broadcast(&t->work);
    pthread_mutex_unlock(&t->lock);
    for (unsigned i = 0; i < t->n_threads; i++) pthread_join(t->threads[i], NULL);
    pthread_cond_destroy(&t->work);
    pthread_cond_destroy(&t->done);
    pthread_mutex_destroy(&t->lock);
    free(t->reqs), free(t->free_reqs), free(t->prepared.at), free(t->queued.at), free(t->finished.at);
    free(t->threads), free(t);
}

bool read_threads_prep(read_threads *t, int fd, void *dest, uint32_t len, uint64_t off, uint64_t tag) {
    if (!t->n_free) return false; /* depth requests prepared, in flight or not popped */
    const uint32_t i = t->free_reqs[--t->n_free];
    t->reqs[i] = (read_req){fd, dest, len, off, tag, 0};
    ring_push(&t->prepared, t->depth, i);
    return true;
}

int read_threads_submit(read_threads *t) {
    const int n = (int)t->prepared.count;
    if (!n) return 0;
    pthread_mutex_lock(&t->lock);
    while (t->prepared.count) ring_push(&t->queued, t->depth, ring_pop(&t->prepared, t->depth));
    if (n == 1) pthread_cond_signal(&t->work);
    else pthread_cond_broadcast(&t->work);
    pthread_mutex_unlock(&t->lock);
    return n;
}

void read_threads_wait(read_threads *t, unsigned want, int timeout_ms) {
    if (!want || !timeout_ms) return;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (timeout_ms > 0) {
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&t->lock);
    t->want = want;
    while (t->finished.count < want) {
        if (timeout_ms < 0) pthread_cond_wait(&t->done, &t->lock);
        else if (pthread_cond_timedwait(&t->done, &t->lock, &deadline) == ETIMEDOUT) break;
    }
    t->want = UINT_MAX;
    pthread_mutex_unlock(&t->lock);
}

bool read_threads_pop(read_threads *t, uint64_t *tag, int32_t *result) {
    pthread_mutex_lock(&t->lock);
    const bool any = t->finished.count > 0;
    const uint32_t i = any ? ring_pop(&t->finished, t->depth) : 0;
    pthread_mutex_unlock(&t->lock);
    if (!any) return false;
    *tag = t->reqs[i].tag;
    *result = t->reqs[i].result;
    t->free_reqs[t->n_free++] = i;
    return true;
}

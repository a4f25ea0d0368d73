/* Reads through io_uring, or a pool of threads where io_uring is refused (read_engine.h). */
#include "util/read_engine.h"

#include <errno.h>
#include <liburing.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "util/read_threads.h"

struct read_engine {
    read_threads *threads; /* NULL: the ring */
    struct io_uring ring;
    unsigned depth;
    unsigned outstanding;  /* prepared, in flight or finished and not popped */
};

/* Whether PI2_IO_ENGINE asks for the threads; an unknown value is named once and ignored. */
static bool threads_asked(void) {
    static atomic_bool told;
    const char *v = getenv("PI2_IO_ENGINE");
    if (!v || !*v || !strcmp(v, "auto") || !strcmp(v, "io_uring")) return false;
    if (!strcmp(v, "threads")) return true;
    if (!atomic_exchange(&told, true)) log_warn("PI2_IO_ENGINE=%s: not auto, io_uring or threads; ignored", v);
    return false;
}

/* 0, or the -errno of the ring that could not be set up. */
static int open_ring(read_engine *e, unsigned depth) {
    /* One thread submits and reaps, and every reap waits in the kernel: completions are handled then,
     * not by interrupting the thread as they come (a reader beside a busy thread on its core, 8 KiB
     * checked reads at depth 128, Intel Xeon: 5.2-5.8 -> 4.0-4.2 us of CPU a read). Kernels before
     * 6.1 refuse the flags: without them. */
    int rc = io_uring_queue_init(depth, &e->ring, IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
    if (rc == -EINVAL) rc = io_uring_queue_init(depth, &e->ring, 0);
    return rc;
}

read_engine *read_engine_open(unsigned depth, char *err, size_t errlen) {
    if (!depth) {
        err_set(err, errlen, "a read engine for no reads");
        return NULL;
    }
    read_engine *e = calloc(1, sizeof *e);
    if (!e) {
        err_set(err, errlen, "out of memory");
        return NULL;
    }
    e->depth = depth;
    const bool forced = threads_asked();
    const int rc = forced ? 0 : open_ring(e, depth);
    if (!forced && rc == 0) return e;
    /* said once a process: every reader it opens falls back alike */
    static atomic_bool told;
    const unsigned n = depth < READ_THREADS_MAX ? depth : READ_THREADS_MAX;
    if (!atomic_exchange(&told, true)) {
        if (forced) log_info("PI2_IO_ENGINE=threads: reading with threads, up to %d reads in flight", READ_THREADS_MAX);
        else log_warn("io_uring refused (io_uring_queue_init: %s): reading with threads instead, up to %d reads in "
                      "flight", strerror(-rc), READ_THREADS_MAX);
    }
    char why[256];
    if (!(e->threads = read_threads_start(depth, n, why, sizeof why))) {
        err_set(err, errlen, "io_uring_queue_init(%u): %s; the threads instead: %s", depth,
                forced ? "not tried (PI2_IO_ENGINE=threads)" : strerror(-rc), why);
        free(e);
        return NULL;
    }
    return e;
}

void read_engine_close(read_engine *e) {
    if (!e) return;
    if (e->threads) read_threads_stop(e->threads);
    else io_uring_queue_exit(&e->ring); /* the kernel ends the reads still in flight */
    free(e);
}

const char *read_engine_name(const read_engine *e) { return e->threads ? "threads" : "io_uring"; }

unsigned read_engine_depth(const read_engine *e) { return e->depth; }

const char *read_engine_probe(void) {
    char err[256];
    read_engine *e = read_engine_open(1, err, sizeof err);
    const char *name = e ? read_engine_name(e) : NULL; /* a string constant: it outlives e */
    read_engine_close(e);
    return name;
}

int read_engine_register_files(read_engine *e, const int *fds, unsigned n) {
    return e->threads ? -EOPNOTSUPP : io_uring_register_files(&e->ring, fds, n);
}

int read_engine_register_buffers(read_engine *e, const struct iovec *iov, unsigned n) {
    return e->threads ? -EOPNOTSUPP : io_uring_register_buffers(&e->ring, iov, n);
}

bool read_engine_prep(read_engine *e, int fd, bool fixed, void *dest, uint32_t len, uint64_t off, int buf_index,
                      uint64_t tag) {
    if (e->outstanding >= e->depth) return false;
    if (e->threads) {
        if (!read_threads_prep(e->threads, fd, dest, len, off, tag)) return false;
    } else {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
        if (!sqe) return false;
        if (buf_index >= 0) io_uring_prep_read_fixed(sqe, fd, dest, len, off, buf_index);
        else io_uring_prep_read(sqe, fd, dest, len, off);
        if (fixed) sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data64(sqe, tag);
    }
    e->outstanding++;
    return true;
}

int read_engine_submit(read_engine *e) {
    return e->threads ? read_threads_submit(e->threads) : io_uring_submit(&e->ring);
}

void read_engine_wait(read_engine *e, unsigned want, int timeout_ms) {
    if (!want || !timeout_ms) return;
    if (e->threads) {
        read_threads_wait(e->threads, want, timeout_ms);
        return;
    }
    struct io_uring_cqe *cqe;
    if (timeout_ms < 0) {
        io_uring_wait_cqes(&e->ring, &cqe, want, NULL, NULL);
        return;
    }
    struct __kernel_timespec wait = {.tv_sec = timeout_ms / 1000, .tv_nsec = (timeout_ms % 1000) * 1000000LL};
    io_uring_wait_cqes(&e->ring, &cqe, want, &wait, NULL); /* -ETIME or -EINTR: fewer finished */
}

int read_engine_submit_wait(read_engine *e, unsigned want, int timeout_ms) {
    if (e->threads || !want || !timeout_ms) {
        const int rc = read_engine_submit(e);
        read_engine_wait(e, want, timeout_ms);
        return rc;
    }
    if (timeout_ms < 0) return io_uring_submit_and_wait(&e->ring, want);
    struct io_uring_cqe *cqe;
    struct __kernel_timespec wait = {.tv_sec = timeout_ms / 1000, .tv_nsec = (timeout_ms % 1000) * 1000000LL};
    const int rc = io_uring_submit_and_wait_timeout(&e->ring, &cqe, want, &wait, NULL);
    return rc == -ETIME ? 0 : rc; /* fewer finished in time: the wait's own outcome, as read_engine_wait's */
}

bool read_engine_pop(read_engine *e, uint64_t *tag, int32_t *result) {
    if (e->threads) {
        if (!read_threads_pop(e->threads, tag, result)) return false;
    } else {
        struct io_uring_cqe *cqe;
        if (io_uring_peek_cqe(&e->ring, &cqe) != 0) return false;
        *tag = io_uring_cqe_get_data64(cqe);
        *result = cqe->res;
        io_uring_cqe_seen(&e->ring, cqe);
    }
    e->outstanding--;
    return true;
}

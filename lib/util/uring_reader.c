/* Reads of one file into memory with io_uring (uring_reader.h). */
#include "util/uring_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

/* O_DIRECT needs block-aligned offsets, lengths and buffers; the page size
 * covers every logical block size we may meet. */
#define DIRECT_ALIGN 4096u
#define MAX_RETRIES 8 /* EINTR/EAGAIN per job before it is reported as failed */

enum { FILE_DIRECT = 0, FILE_BUFFERED = 1 };

struct uring_reader {
    struct io_uring ring;
    int fd[2];          /* [FILE_DIRECT] is -1 when O_DIRECT was refused */
    bool fixed_files;   /* fd[] registered with the ring */
    bool direct;        /* still using O_DIRECT */
    bool told_unaligned;
    unsigned depth;
    uint64_t file_size;
};

uring_reader *uring_reader_open(const char *path, unsigned queue_depth, char *err, size_t errlen) {
    uring_reader *r = calloc(1, sizeof *r);
    if (!r) { snprintf(err, errlen, "out of memory"); return NULL; }
    r->depth = queue_depth;
    r->fd[FILE_BUFFERED] = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd[FILE_BUFFERED] < 0) {
        snprintf(err, errlen, "open %s: %s", path, strerror(errno));
        free(r);
        return NULL;
    }
    struct stat st;
    if (fstat(r->fd[FILE_BUFFERED], &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(r->fd[FILE_BUFFERED]);
        free(r);
        return NULL;
    }
    r->file_size = (uint64_t)st.st_size;
    r->fd[FILE_DIRECT] = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    r->direct = r->fd[FILE_DIRECT] >= 0;
    if (!r->direct) log_info("%s: O_DIRECT refused (%s); using buffered reads", path, strerror(errno));

    int rc = io_uring_queue_init(queue_depth, &r->ring, 0);
    if (rc < 0) {
        snprintf(err, errlen, "io_uring_queue_init(%u): %s", queue_depth, strerror(-rc));
        if (r->direct) close(r->fd[FILE_DIRECT]);
        close(r->fd[FILE_BUFFERED]);
        free(r);
        return NULL;
    }
    int files[2] = {r->direct ? r->fd[FILE_DIRECT] : r->fd[FILE_BUFFERED], r->fd[FILE_BUFFERED]};
    rc = io_uring_register_files(&r->ring, files, 2);
    r->fixed_files = rc == 0;
    if (rc < 0) log_info("io_uring_register_files: %s; using plain descriptors", strerror(-rc));
    return r;
}

void uring_reader_close(uring_reader *r) {
    if (!r) return;
    io_uring_queue_exit(&r->ring);
    if (r->fd[FILE_DIRECT] >= 0) close(r->fd[FILE_DIRECT]);
    close(r->fd[FILE_BUFFERED]);
    free(r);
}

uint64_t uring_reader_file_size(const uring_reader *r) { return r->file_size; }

/* Per-run bookkeeping: how far each job got and which jobs wait for submission. */
typedef struct {
    uint32_t *done;    /* bytes of job i read so far */
    uint8_t *retries;
    size_t *queue;     /* circular queue of job indices to (re)submit */
    size_t head, count, n;
} run_state;

static void enqueue(run_state *s, size_t job) {
    s->queue[(s->head + s->count) % s->n] = job;
    s->count++;
}

static bool aligned(uint64_t off, uint64_t len, const void *dest) {
    return off % DIRECT_ALIGN == 0 && len % DIRECT_ALIGN == 0 && (uintptr_t)dest % DIRECT_ALIGN == 0;
}

/* Prepares the rest of job j; false if the ring has no free entry. */
static bool prep_read(uring_reader *r, run_state *s, io_job *jobs, size_t j) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (!sqe) return false;
    io_job *job = &jobs[j];
    uint64_t off = job->file_offset + s->done[j];
    uint32_t len = job->length - s->done[j];
    uint8_t *dest = job->dest + s->done[j];
    int which = FILE_BUFFERED;
    if (r->direct) {
        /* An unaligned tail (the file's last bytes) is read buffered after the aligned head. */
        if (len > DIRECT_ALIGN && aligned(off, DIRECT_ALIGN, dest)) len &= ~(DIRECT_ALIGN - 1);
        if (aligned(off, len, dest)) which = FILE_DIRECT;
        else if (!r->told_unaligned) {
            log_info("unaligned read (offset %llu, %u bytes): buffered", (unsigned long long)off, len);
            r->told_unaligned = true;
        }
    }
    io_uring_prep_read(sqe, r->fixed_files ? which : r->fd[which], dest, len, off);
    if (r->fixed_files) sqe->flags |= IOSQE_FIXED_FILE;
    /* The low bit remembers whether O_DIRECT was used, to fall back on EINVAL. */
    io_uring_sqe_set_data64(sqe, ((uint64_t)j << 1) | (which == FILE_DIRECT));
    return true;
}

/* Accounts one completion; returns true when job j is finished. */
static bool complete(uring_reader *r, run_state *s, io_job *jobs, size_t j, bool was_direct, int res) {
    io_job *job = &jobs[j];
    if (res > 0) {
        s->done[j] += (uint32_t)res;
        if (s->done[j] < job->length) { enqueue(s, j); return false; } /* short read: the rest */
        job->result = (int32_t)s->done[j];
        return true;
    }
    if (res == 0) { job->result = (int32_t)s->done[j]; return true; } /* end of file */
    if (res == -EINVAL && was_direct && r->direct) {
        log_info("O_DIRECT read refused (%s); using buffered reads from now on", strerror(-res));
        r->direct = false;
        enqueue(s, j);
        return false;
    }
    if ((res == -EINTR || res == -EAGAIN) && s->retries[j]++ < MAX_RETRIES) { enqueue(s, j); return false; }
    job->result = res;
    return true;
}

void uring_reader_run(uring_reader *r, io_job *jobs, size_t n, void (*idle)(void *), void *ctx) {
    if (n == 0) return;
    run_state s = {.done = calloc(n, sizeof *s.done), .retries = calloc(n, 1), .queue = malloc(n * sizeof *s.queue),
                   .n = n};
    if (!s.done || !s.retries || !s.queue) {
        for (size_t i = 0; i < n; i++) jobs[i].result = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (jobs[i].length > IO_JOB_MAX_LENGTH) jobs[i].result = -EINVAL;
        else enqueue(&s, i);
    }
    size_t finished = n - s.count, in_flight = 0;
    int64_t last_idle = clock_ms();
    while (finished < n) {
        while (s.count && in_flight < r->depth && prep_read(r, &s, jobs, s.queue[s.head])) {
            s.head = (s.head + 1) % n;
            s.count--;
            in_flight++;
        }
        int rc = io_uring_submit(&r->ring);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            log_error("io_uring_submit: %s", strerror(-rc));
            /* The prepared entries stay queued in the ring and are retried below. */
        }
        struct io_uring_cqe *cqe;
        struct __kernel_timespec wait = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
        rc = io_uring_wait_cqe_timeout(&r->ring, &cqe, &wait);
        int64_t now = clock_ms();
        if (idle && now - last_idle >= 100) {
            idle(ctx);
            last_idle = now;
        }
        if (rc < 0) continue; /* -ETIME or -EINTR: nothing completed yet */
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&r->ring, head, cqe) {
            uint64_t tag = io_uring_cqe_get_data64(cqe);
            seen++;
            in_flight--;
            if (complete(r, &s, jobs, (size_t)(tag >> 1), tag & 1, cqe->res)) finished++;
        }
        io_uring_cq_advance(&r->ring, seen);
    }
out:
    free(s.done);
    free(s.retries);
    free(s.queue);
}

/* Reads of one file into memory through a read engine (file_reader.h). */
#include "util/file_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/read_engine.h"

/* O_DIRECT needs block-aligned offsets, lengths and buffers; the page size
 * covers every logical block size we may meet. */
#define DIRECT_ALIGN 4096u
#define MAX_RETRIES 8 /* EINTR/EAGAIN per job before it is reported as failed */

enum { FILE_DIRECT = 0, FILE_BUFFERED = 1 };

/* A queued or in-flight job. */
typedef struct {
    io_job *job;
    io_done_fn done;
    void *ctx;
    uint32_t bytes;   /* read so far */
    uint8_t retries;
    int32_t next_free;
} op;

struct file_reader {
    read_engine *engine;
    int fd[2];          /* [FILE_DIRECT] is -1 when O_DIRECT was refused */
    bool fixed_files;   /* fd[] registered with the engine's ring */
    bool direct;        /* still using O_DIRECT */
    bool told_unaligned;
    unsigned depth;
    uint64_t file_size;
    op *ops;            /* records, reused through free_op */
    size_t n_ops;
    int32_t free_op;
    int32_t *queue;     /* circular: ops waiting for room in the engine */
    size_t q_head, q_count, q_cap;
    size_t in_flight, live;
    uint8_t *fixed_base;   /* registered buffers: FIXED_BUFFER_MAX-byte pieces of [fixed_base, +fixed_bytes) */
    uint64_t fixed_bytes;
};

/* The kernel's largest registered buffer. */
#define FIXED_BUFFER_MAX (1ull << 30)
#define FIXED_BUFFERS_MAX 64

file_reader *file_reader_open(const char *path, unsigned queue_depth, char *err, size_t errlen) {
    file_reader *r = calloc(1, sizeof *r);
    if (!r) { snprintf(err, errlen, "out of memory"); return NULL; }
    r->depth = queue_depth;
    r->free_op = -1;
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

    if (!(r->engine = read_engine_open(queue_depth, err, errlen))) {
        if (r->direct) close(r->fd[FILE_DIRECT]);
        close(r->fd[FILE_BUFFERED]);
        free(r);
        return NULL;
    }
    int files[2] = {r->direct ? r->fd[FILE_DIRECT] : r->fd[FILE_BUFFERED], r->fd[FILE_BUFFERED]};
    const int rc = read_engine_register_files(r->engine, files, 2);
    r->fixed_files = rc == 0;
    if (rc < 0 && rc != -EOPNOTSUPP) log_info("io_uring_register_files: %s; using plain descriptors", strerror(-rc));
    return r;
}

int file_reader_register_buffer(file_reader *r, void *base, uint64_t bytes) {
    struct iovec iov[FIXED_BUFFERS_MAX];
    unsigned n = 0;
    for (uint64_t at = 0; at < bytes; at += FIXED_BUFFER_MAX, n++) {
        if (n == FIXED_BUFFERS_MAX) return -E2BIG;
        uint64_t len = bytes - at < FIXED_BUFFER_MAX ? bytes - at : FIXED_BUFFER_MAX;
        iov[n] = (struct iovec){(uint8_t *)base + at, (size_t)len};
    }
    if (!n || r->fixed_base) return -EINVAL;
    int rc = read_engine_register_buffers(r->engine, iov, n);
    if (rc < 0) return rc;
    r->fixed_base = base;
    r->fixed_bytes = bytes;
    return 0;
}

void file_reader_close(file_reader *r) {
    if (!r) return;
    read_engine_close(r->engine);
    free(r->ops);
    free(r->queue);
    if (r->fd[FILE_DIRECT] >= 0) close(r->fd[FILE_DIRECT]);
    close(r->fd[FILE_BUFFERED]);
    free(r);
}

uint64_t file_reader_file_size(const file_reader *r) { return r->file_size; }

const char *file_reader_engine(const file_reader *r) { return read_engine_name(r->engine); }

size_t file_reader_busy(const file_reader *r) { return r->live; }

static int enqueue(file_reader *r, int32_t i) {
    if (r->q_count == r->q_cap) { /* grow, unwrapping the circle */
        size_t cap = r->q_cap ? 2 * r->q_cap : 64;
        int32_t *q = malloc(cap * sizeof *q);
        if (!q) return -ENOMEM;
        for (size_t k = 0; k < r->q_count; k++) q[k] = r->queue[(r->q_head + k) % r->q_cap];
        free(r->queue);
        r->queue = q;
        r->q_cap = cap;
        r->q_head = 0;
    }
    r->queue[(r->q_head + r->q_count) % r->q_cap] = i;
    r->q_count++;
    return 0;
}

static int32_t new_op(file_reader *r) {
    if (r->free_op < 0) {
        size_t n = r->n_ops ? 2 * r->n_ops : 64;
        if (n > INT32_MAX) return -1;
        op *ops = realloc(r->ops, n * sizeof *ops);
        if (!ops) return -1;
        for (size_t k = r->n_ops; k < n; k++) ops[k].next_free = k + 1 < n ? (int32_t)(k + 1) : -1;
        r->ops = ops;
        r->free_op = (int32_t)r->n_ops;
        r->n_ops = n;
    }
    const int32_t i = r->free_op;
    r->free_op = r->ops[i].next_free;
    return i;
}

static void release_op(file_reader *r, int32_t i) {
    r->ops[i].next_free = r->free_op;
    r->free_op = i;
    r->live--;
}

/* Hands the job back; its record is free first, so done may queue more. */
static void finish(file_reader *r, int32_t i, int32_t result) {
    op o = r->ops[i];
    release_op(r, i);
    o.job->result = result;
    o.done(o.ctx, o.job);
}

int file_reader_queue(file_reader *r, io_job *job, io_done_fn done, void *ctx) {
    const int32_t i = new_op(r);
    if (i < 0) return -ENOMEM;
    r->ops[i] = (op){job, done, ctx, 0, 0, -1};
    r->live++;
    if (job->length > IO_JOB_MAX_LENGTH) {
        finish(r, i, -EINVAL);
        return 0;
    }
    if (enqueue(r, i)) {
        release_op(r, i);
        return -ENOMEM;
    }
    return 0;
}

static bool aligned(uint64_t off, uint64_t len, const void *dest) {
    return off % DIRECT_ALIGN == 0 && len % DIRECT_ALIGN == 0 && (uintptr_t)dest % DIRECT_ALIGN == 0;
}

/* The registered piece that holds [dest, dest + len) whole (no pages pinned per read), or -1. */
static int fixed_piece(const file_reader *r, const uint8_t *dest, uint32_t len) {
    if (!r->fixed_base || (uintptr_t)dest < (uintptr_t)r->fixed_base) return -1;
    const uint64_t at = (uint64_t)((uintptr_t)dest - (uintptr_t)r->fixed_base);
    if (at + len > r->fixed_bytes || at / FIXED_BUFFER_MAX != (at + len - 1) / FIXED_BUFFER_MAX) return -1;
    return (int)(at / FIXED_BUFFER_MAX);
}

/* Prepares the rest of op i's read; false if the engine has no room. */
static bool prep_read(file_reader *r, int32_t i) {
    const op *o = &r->ops[i];
    uint64_t off = o->job->file_offset + o->bytes;
    uint32_t len = o->job->length - o->bytes;
    uint8_t *dest = o->job->dest + o->bytes;
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
    const int fd = r->fixed_files ? which : r->fd[which];
    /* The tag's low bit remembers whether O_DIRECT was used, to fall back on EINVAL. */
    return read_engine_prep(r->engine, fd, r->fixed_files, dest, len, off, fixed_piece(r, dest, len),
                            ((uint64_t)i << 1) | (which == FILE_DIRECT));
}

/* Accounts one completion of op i: finished, or queued again for the rest. */
static bool complete(file_reader *r, int32_t i, bool was_direct, int res) {
    op *o = &r->ops[i];
    bool again = false;
    if (res > 0) {
        o->bytes += (uint32_t)res;
        again = o->bytes < o->job->length; /* short read: the rest */
    } else if (res == -EINVAL && was_direct) { /* also a read in flight when an earlier one was refused */
        if (r->direct) log_info("O_DIRECT read refused (%s); using buffered reads from now on", strerror(-res));
        r->direct = false;
        again = true;
    } else if (res == -EINTR || res == -EAGAIN) {
        again = o->retries++ < MAX_RETRIES;
    }
    if (again && enqueue(r, i) == 0) return false;
    finish(r, i, res < 0 ? res : (int32_t)o->bytes); /* res 0: end of file */
    return true;
}

/* Prepares what is queued, as far as the engine has room: whether anything was. */
static bool prep_queued(file_reader *r) {
    bool any = false;
    while (r->q_count && r->in_flight < r->depth && prep_read(r, r->queue[r->q_head])) {
        r->q_head = (r->q_head + 1) % r->q_cap;
        r->q_count--;
        r->in_flight++;
        any = true;
    }
    return any;
}

static void check_submit(const file_reader *r, int rc) {
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
        log_error("%s submit: %s", read_engine_name(r->engine), strerror(-rc)); /* the prepared reads stay prepared */
}

static void fill_engine(file_reader *r) {
    if (prep_queued(r)) check_submit(r, read_engine_submit(r->engine));
}

int file_reader_reap(file_reader *r, int wait_ms) {
    const bool any = prep_queued(r);
    if (wait_ms > 0 && r->in_flight) /* the new reads handed over and the wait: one system call */
        check_submit(r, read_engine_submit_wait(r->engine, r->in_flight / 4 ? (unsigned)(r->in_flight / 4) : 1,
                                                wait_ms));
    else if (any)
        check_submit(r, read_engine_submit(r->engine));
    int finished = 0;
    uint64_t tag;
    int32_t res;
    while (read_engine_pop(r->engine, &tag, &res)) {
        r->in_flight--;
        finished += complete(r, (int32_t)(tag >> 1), tag & 1, res);
    }
    fill_engine(r);
    return finished;
}

static void count_down(void *ctx, io_job *job) {
    (void)job;
    (*(size_t *)ctx)--;
}

void file_reader_run(file_reader *r, io_job *jobs, size_t n, void (*idle)(void *), void *ctx) {
    size_t left = n;
    for (size_t i = 0; i < n; i++)
        if (file_reader_queue(r, &jobs[i], count_down, &left)) {
            jobs[i].result = -ENOMEM;
            left--;
        }
    int64_t last_idle = clock_ms();
    while (left > 0) {
        file_reader_reap(r, 100);
        const int64_t now = clock_ms();
        if (idle && now - last_idle >= 100) {
            idle(ctx);
            last_idle = now;
        }
    }
}

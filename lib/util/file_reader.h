/* Reads byte ranges of one file into memory through one read engine
 * (read_engine.h: an io_uring, or threads where io_uring is refused): O_DIRECT
 * where the file system and the alignment allow it, buffered otherwise; short
 * reads are resubmitted for the rest. Jobs are either run to completion as a
 * batch (file_reader_run) or queued one by one and reaped as they finish, so
 * that several batches share the engine and it never drains between them.
 *
 * Errors: file_reader_open returns NULL with a message in err;
 * file_reader_register_buffer and file_reader_queue return 0 or -errno
 * (liburing style), and each read puts its own -errno in io_job.result. A
 * failed submission is logged (log_error); its reads stay queued. */
#ifndef PI2_FILE_READER_H
#define PI2_FILE_READER_H

#include <stddef.h>
#include <stdint.h>

/* One read; result is set when it finishes. */
typedef struct {
    uint64_t file_offset;
    uint32_t length;
    uint8_t *dest;
    int32_t result; /* bytes read (less than length only at end of file), or -errno */
} io_job;

/* Longest single read: results are int32 byte counts. */
#define IO_JOB_MAX_LENGTH (1u << 30)

typedef struct file_reader file_reader;

/* Opens path read-only and sets up an engine for queue_depth reads in flight. NULL with a message in
 * err. The thread that opens a reader is the one that may queue, run and reap its reads (a
 * single-issuer ring). */
file_reader *file_reader_open(const char *path, unsigned queue_depth, char *err, size_t errlen);
void file_reader_close(file_reader *r);
/* Registers [base, base + bytes) with the engine's ring (once): reads into
 * it then use the registered pages instead of pinning the destination's
 * pages for each read and letting go of them on completion. 0, or -errno
 * (-EOPNOTSUPP on the threads; reads then go on as before). */
int file_reader_register_buffer(file_reader *r, void *base, uint64_t bytes);
uint64_t file_reader_file_size(const file_reader *r);
/* What reads (read_engine_name): "io_uring" or "threads". */
const char *file_reader_engine(const file_reader *r);

/* Runs every job to completion, at most queue_depth in flight. idle(ctx) is
 * called about every 100 ms while waiting, so the caller can keep beating.
 * Queued jobs of others go on meanwhile (and finish through their own done). */
void file_reader_run(file_reader *r, io_job *jobs, size_t n, void (*idle)(void *), void *ctx);

/* A finished job (result set); called from file_reader_reap. */
typedef void (*io_done_fn)(void *ctx, io_job *job);
/* Queues job: it is read as the engine has room, and handed to done(ctx, job)
 * once finished. The job must stay where it is until then. 0, or -ENOMEM;
 * a job longer than IO_JOB_MAX_LENGTH finishes at once with -EINVAL. */
int file_reader_queue(file_reader *r, io_job *job, io_done_fn done, void *ctx);
/* Fills the engine from the queue, waits up to wait_ms (0: not at all) until
 * a quarter of the reads in flight (at least one) have completed, finishes
 * every job whose read completed and refills the engine. Waking per quarter
 * keeps the device's queue deep while sparing a wake-up per read. The number
 * finished. */
int file_reader_reap(file_reader *r, int wait_ms);
/* Jobs queued or in flight. */
size_t file_reader_busy(const file_reader *r);

#endif

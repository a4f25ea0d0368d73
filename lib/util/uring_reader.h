/* Reads byte ranges of one file into memory with a single io_uring: O_DIRECT
 * where the file system and the alignment allow it, buffered otherwise; short
 * reads are resubmitted for the rest. */
#ifndef PI2_IO_URING_READER_H
#define PI2_IO_URING_READER_H

#include <stddef.h>
#include <stdint.h>

/* One read; result is set by uring_reader_run. */
typedef struct {
    uint64_t file_offset;
    uint32_t length;
    uint8_t *dest;
    int32_t result; /* bytes read (less than length only at end of file), or -errno */
} io_job;

/* Longest single read: results are int32 byte counts. */
#define IO_JOB_MAX_LENGTH (1u << 30)

typedef struct uring_reader uring_reader;

/* Opens path read-only and sets up a ring of queue_depth entries. NULL with a message in err. */
uring_reader *uring_reader_open(const char *path, unsigned queue_depth, char *err, size_t errlen);
void uring_reader_close(uring_reader *r);
uint64_t uring_reader_file_size(const uring_reader *r);

/* Runs every job to completion, at most queue_depth in flight. idle(ctx) is
 * called about every 100 ms while waiting, so the caller can keep beating. */
void uring_reader_run(uring_reader *r, io_job *jobs, size_t n, void (*idle)(void *), void *ctx);

#endif

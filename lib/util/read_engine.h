/* Asynchronous reads of files into memory, each tagged by its caller, up to
 * a fixed number in flight: through an io_uring where the kernel gives one,
 * else through a pool of threads doing blocking preads. io_uring is refused
 * in many places a user may run pi2: container seccomp profiles (Docker's
 * default), app sandboxes, the kernel.io_uring_disabled sysctl, kernels
 * built without it, qemu-user (which has no such system calls). There the
 * threads keep several reads in flight, fewer than a ring (READ_THREADS_MAX),
 * each paying a wake-up, but every reader of pi2 works the same.
 *
 * PI2_IO_ENGINE=threads in the environment takes the threads even where
 * io_uring works (the tests run both); io_uring (or unset, or auto) takes
 * io_uring when the kernel allows it.
 *
 * One thread prepares, submits, waits for and pops a given engine's reads
 * (the ring is set up single-issuer); the threads engine's own threads
 * only read.
 *
 * Errors: read_engine_open returns NULL with a message in err (out of
 * memory, or neither engine could start); the register calls return 0 or
 * -errno (-EOPNOTSUPP on the threads); read_engine_submit returns the reads
 * handed over or -errno (those prepared stay prepared); each read's own
 * result is its byte count (short only at the end of the file) or -errno. */
#ifndef PI2_READ_ENGINE_H
#define PI2_READ_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define READ_THREADS_MAX 32 /* the threads engine's threads: reads it keeps in flight at most */

typedef struct read_engine read_engine;

/* An engine for up to depth reads prepared or in flight. */
read_engine *read_engine_open(unsigned depth, char *err, size_t errlen);
/* Waits for the reads in flight (a thread's pread cannot be cancelled), then frees. NULL: nothing. */
void read_engine_close(read_engine *e);
/* "io_uring" or "threads" */
const char *read_engine_name(const read_engine *e);
/* The name of the engine read_engine_open gives this process now, or NULL when neither starts. */
const char *read_engine_probe(void);
unsigned read_engine_depth(const read_engine *e);

/* io_uring only (-EOPNOTSUPP on the threads): descriptors read_engine_prep may then name by their index
 * (fixed), and buffers it may then read into by their index without pinning pages per read. */
int read_engine_register_files(read_engine *e, const int *fds, unsigned n);
int read_engine_register_buffers(read_engine *e, const struct iovec *iov, unsigned n);

/* Prepares a read of len bytes at file offset off of fd (with fixed: of the registered file at that
 * index) into dest (buf_index >= 0: inside that registered buffer), tagged tag. False when depth reads
 * are already prepared or in flight. */
bool read_engine_prep(read_engine *e, int fd, bool fixed, void *dest, uint32_t len, uint64_t off, int buf_index,
                      uint64_t tag);
/* Hands every prepared read over to be read. */
int read_engine_submit(read_engine *e);
/* Waits until at least want reads have finished and not been popped, or timeout_ms passes (< 0: no
 * limit; 0: no wait). A wait cut short by a signal returns early: callers wait in loops. */
void read_engine_wait(read_engine *e, unsigned want, int timeout_ms);
/* read_engine_submit, then read_engine_wait, in one system call on a ring; returns what the submit would. */
int read_engine_submit_wait(read_engine *e, unsigned want, int timeout_ms);
/* One finished read: true with its tag and result (bytes read, or -errno); false when none has. */
bool read_engine_pop(read_engine *e, uint64_t *tag, int32_t *result);

#endif

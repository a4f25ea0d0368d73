/* Private to lib/util/read_engine.c: its threads engine. A pool of threads
 * that take prepared reads from a queue, pread each to its end (or an error),
 * and queue the results for the one thread that prepared them (read_engine.h
 * gives the contract: tags, depth, waiting). All queues hold at most depth
 * entries, the reads prepared or in flight and not popped.
 *
 * Errors: read_threads_start returns NULL with a message in err (out of
 * memory, or no thread could be started). The rest cannot fail. */
#ifndef PI2_READ_THREADS_H
#define PI2_READ_THREADS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct read_threads read_threads;

read_threads *read_threads_start(unsigned depth, unsigned n_threads, char *err, size_t errlen);
void read_threads_stop(read_threads *t); /* waits for the reads in flight */
bool read_threads_prep(read_threads *t, int fd, void *dest, uint32_t len, uint64_t off, uint64_t tag);
int read_threads_submit(read_threads *t);
void read_threads_wait(read_threads *t, unsigned want, int timeout_ms);
bool read_threads_pop(read_threads *t, uint64_t *tag, int32_t *result);

#endif

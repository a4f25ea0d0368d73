/* The io-worker's doorbell: a named pipe in the run's directory that a
 * cpu-worker writes a byte to after queueing bundle loads in its ring
 * (bundle_ring.h) while the io-worker sleeps, so that it wakes in its poll
 * beside its socket. Both sides open it for reading and writing: opening
 * never waits for the other, and a write finds a reader even while the
 * io-worker restarts (its successor drains what was rung meanwhile).
 *
 * Errors: doorbell_open returns -1 with a message naming the path. */
#ifndef PI2_DOORBELL_H
#define PI2_DOORBELL_H

#include <stddef.h>

/* The run's doorbell (made if missing), non-blocking; its descriptor, or -1 with err. */
int doorbell_open(const char *runid, char *err, size_t errlen);
void doorbell_ring(int fd);
/* Reads what was rung, so that the next poll sleeps. */
void doorbell_drain(int fd);

#endif

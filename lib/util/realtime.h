/* Real-time scheduling for the threads that pass a layer's bundle requests
 * and answers between the cpu-workers and the io-worker (docs/offload.md).
 *
 * Those threads share a core with a cpu-worker that computes without pause.
 * At normal priority a wake-up may wait for the computing thread's time
 * slice, and the reads asked ahead of a layer start late; at SCHED_FIFO they
 * run the moment they wake, for the few microseconds they need. Computing
 * threads never get it. Needs CAP_SYS_NICE or an RLIMIT_RTPRIO of at least
 * REALTIME_PRIORITY; without it everything runs at normal priority.
 *
 * Errors: realtime_self returns -1 with the reason in err (errlen bytes);
 * realtime_allowed and realtime_thread_is say false when their call fails. */
#ifndef PI2_REALTIME_H
#define PI2_REALTIME_H

#include <stdbool.h>
#include <stddef.h>

/* The lowest SCHED_FIFO priority: ahead of every normal thread, behind the kernel's own. */
#define REALTIME_PRIORITY 1

/* Whether this process may put threads at REALTIME_PRIORITY now, found by trying it on the calling
 * thread, whose policy is then put back. */
bool realtime_allowed(void);

/* SCHED_FIFO at REALTIME_PRIORITY for the calling thread (threads it starts after inherit it).
 * 0, or -1 with the reason in err. */
int realtime_self(char *err, size_t errlen);

/* Whether thread tid (0: the calling one) runs at SCHED_FIFO. */
bool realtime_thread_is(int tid);

#endif

/* The hardware profile's wake-up round trip (hw_profile.h): a thread asleep
 * in poll() on a named pipe, as the io-worker sleeps on its doorbell
 * (stack/doorbell.h), is rung and answers in shared memory, where the ringer
 * spins, as a cpu-worker waits on its bundle ring. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hw_profile.h"
#include "stack/doorbell.h"
#include "util/clock.h"
#include "util/compare_double.h"
#include "util/log.h"

#define WAKE_ROUNDS 300
#define WAKE_WARMUP 20
#define WAKE_GAP_US 200     /* between rings: the sleeper is back in poll() when rung */
#define WAKE_TIMEOUT_MS 2000

typedef struct {
    int fd;
    _Atomic int answered; /* the last round answered */
    int rounds;
} sleeper_args;

static void *sleeper(void *arg) {
    sleeper_args *s = arg;
    for (int i = 1; i <= s->rounds; i++) {
        struct pollfd p = {.fd = s->fd, .events = POLLIN};
        if (poll(&p, 1, WAKE_TIMEOUT_MS) != 1) break;
        doorbell_drain(s->fd);
        atomic_store(&s->answered, i);
    }
    return NULL;
}

/* Median microseconds from a ring to the answer, over a pipe in a temporary directory (removed after). */
int hw_profile_measure_wake(hw_profile *h, char *err, size_t errlen) {
    char dir[PATH_MAX], path[PATH_MAX + 16];
    if (hw_profile_scratch_dir(dir, "wake", err, errlen)) return -1;
    snprintf(path, sizeof path, "%s/bell", dir);
    int rc = -1;
    sleeper_args s = {.fd = -1, .rounds = WAKE_WARMUP + WAKE_ROUNDS};
    pthread_t t;
    double us[WAKE_ROUNDS];
    if (mkfifo(path, 0600) || (s.fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC)) < 0) {
        err_set(err, errlen, "wake: %s: %s", path, strerror(errno));
        goto out;
    }
    if (pthread_create(&t, NULL, sleeper, &s)) {
        err_set(err, errlen, "wake: cannot start a thread");
        goto out;
    }
    rc = 0;
    for (int i = 1; i <= s.rounds && rc == 0; i++) {
        usleep(WAKE_GAP_US);
        const double t0 = clock_seconds();
        doorbell_ring(s.fd);
        while (atomic_load(&s.answered) != i)
            if (clock_seconds() - t0 > WAKE_TIMEOUT_MS / 1e3) {
                err_set(err, errlen, "wake: round %d not answered in %d ms", i, WAKE_TIMEOUT_MS);
                rc = -1;
                break;
            }
        if (rc == 0 && i > WAKE_WARMUP) us[i - WAKE_WARMUP - 1] = (clock_seconds() - t0) * 1e6;
    }
    if (rc) doorbell_ring(s.fd); /* the sleeper may wait in poll(): its own timeout ends it */
    pthread_join(t, NULL);
    if (rc == 0) {
        qsort(us, WAKE_ROUNDS, sizeof *us, compare_double);
        h->wake_us = us[WAKE_ROUNDS / 2];
    }
out:
    if (s.fd >= 0) close(s.fd);
    unlink(path);
    if (rmdir(dir)) log_warn("wake: cannot remove %s: %s", dir, strerror(errno));
    return rc;
}

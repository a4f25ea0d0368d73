/* Real-time scheduling (realtime.h). */
#include "util/realtime.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

bool realtime_allowed(void) {
    int policy;
    struct sched_param was;
    if (pthread_getschedparam(pthread_self(), &policy, &was)) return false;
    const struct sched_param rt = {.sched_priority = REALTIME_PRIORITY};
    if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &rt)) return false;
    pthread_setschedparam(pthread_self(), policy, &was); /* lowering is always allowed */
    return true;
}

int realtime_self(char *err, size_t errlen) {
    const struct sched_param rt = {.sched_priority = REALTIME_PRIORITY};
    const int rc = pthread_setschedparam(pthread_self(), SCHED_FIFO, &rt);
    if (rc) snprintf(err, errlen, "SCHED_FIFO %d: %s", REALTIME_PRIORITY, strerror(rc));
    return rc ? -1 : 0;
}

bool realtime_thread_is(int tid) { return sched_getscheduler(tid) == SCHED_FIFO; }

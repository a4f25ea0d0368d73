/* The io-worker's state: the model file behind one io_uring, the weights
 * segment its reads land in, its ROUTER socket and its control-block row. */
#ifndef PI2_IO_WORKER_H
#define PI2_IO_WORKER_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "stack/bus.h"
#include "stack/proc_stop.h"
#include "stack/shm.h"
#include "stack/stack.h"
#include "util/uring_reader.h"

typedef struct {
    const char *runid;
    char model_path[PATH_MAX]; /* absolute, as the control block records it */
    uring_reader *reader;
    bus_socket *sock;
    uint64_t seq;              /* of the Envelopes we send */
    int64_t delay_us;          /* PI2_IO_DELAY_US: fault-injection aid, a pause before each batch */

    shm_segment *weights;      /* NULL until attached */
    uint8_t *data;             /* its "data" region */
    uint64_t data_bytes;

    shm_segment *ctl_seg;      /* NULL until the control segment exists */
    stack_ctl *ctl;
    proc_row *row;
    int64_t next_ctl_try_ms;
    bool fatal;                /* the control block belongs to another model */
    enum proc_state state;
} io_worker;

/* One attempt to (re)attach the weights segment; 0 or -1 (reason logged at debug level). */
int iow_attach_weights(io_worker *w);
/* Waits for the weights segment (cachemgr creates it); -1 after timeout_ms or a stop signal. */
int iow_wait_weights(io_worker *w, int timeout_ms);
/* Beats our control-block row, attaching the control segment first when it appears. */
void iow_beat(void *w);
void iow_detach(io_worker *w);

/* Handles one received message: an IoReadBatch is read and answered with IoComplete;
 * anything else is dropped with a WARN. */
void iow_serve(io_worker *w, const struct bus_msg *m);

#endif

/* The io-worker's state: the model file behind one io_uring, the weights
 * segment its reads land in, its ROUTER socket and its control-block row. */
#ifndef PI2_IO_WORKER_H
#define PI2_IO_WORKER_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "bundle_loader.h"
#include "stack/bus.h"
#include "stack/msg.h"
#include "stack/offload.h"
#include "stack/peer_limit.h"
#include "stack/proc_stop.h"
#include "stack/shm.h"
#include "stack/stack.h"
#include "util/file_reader.h"

typedef struct {
    const char *runid;
    char model_path[PATH_MAX]; /* absolute, as the control block records it */
    file_reader *reader;
    bus_socket *sock;
    uint64_t seq;              /* of the Envelopes we send */
    peer_limit drops;          /* per peer: what we drop or refuse, a line (and an Error) a second at most */
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

    /* a stack under a memory budget (the control block names a plan): the
     * bundle file behind a second ring, the neuron cache segment */
    bool budgeted;             /* opened: off, bundle_reader, ffn_seg, hot, cold */
    model m;                   /* the plan's checks need it; metadata only */
    offload off;
    file_reader *bundle_reader;
    shm_segment *ffn_seg;
    uint8_t *hot, *cold;       /* its "hot" and "cold" regions */
    uint64_t hot_bytes, cold_bytes;
    ncache *cache;             /* attached once cachemgr has laid the table out */
    bundle_loader loader;
    int queue_depth;           /* -q: both files' reads in flight; 0: 32 and the plan's */
    bool verify;               /* bundles checked against their checksums as they land */
    uint64_t bundle_fault_left;/* PI2_BUNDLE_FAULT: reads still to spoil (a test-only switch) */
    int bundle_fault_kind;
    int64_t next_offload_try_ms; /* a plan the io-worker has not opened yet: when to try again */
    int bell_fd;               /* the doorbell the cpu-workers ring after queueing loads in their rings; -1 */
    uint32_t ring_ids[BUNDLE_RING_WORDS]; /* one batch taken from a ring */
    uint64_t bus_looked_us;    /* when the socket was last looked at while reads were in flight */
} io_worker;

/* One attempt to (re)attach the weights segment; 0 or -1 (reason logged at debug level). */
int iow_attach_weights(io_worker *w);
/* Waits for the weights segment (cachemgr creates it); -1 after timeout_ms or a stop signal. */
int iow_wait_weights(io_worker *w, int timeout_ms);
/* Beats our control-block row, attaching the control segment first when it appears. */
void iow_beat(void *w);
void iow_detach(io_worker *w);

/* Budgeted stacks: opens the plan, the bundle file and the neuron cache
 * segment when the control block names a plan (again when the segment was
 * replaced). 0 when ready (or not budgeted), -1 (logged) otherwise. */
int iow_open_offload(io_worker *w);
/* The slot table, once cachemgr made it: 0, or -1 when not (yet) there. */
int iow_attach_cache(io_worker *w);
void iow_close_offload(io_worker *w);
/* A cpu-worker's BundleLoad, answered with BundleLoaded. */
void iow_bundle_load(io_worker *w, const struct bus_msg *m, const Pi2__Envelope *req);
/* The batches the cpu-workers queued in their rings, each answered there. */
void iow_take_rings(io_worker *w);
/* Whether a ring holds a batch not taken yet. */
bool iow_rings_pending(const io_worker *w);
void iow_reply(io_worker *w, const struct bus_msg *m, Pi2__Envelope *env);

/* Handles one received message: an IoReadBatch is read and answered with IoComplete;
 * anything else is dropped with a WARN (one a second per peer: w->drops). */
void iow_serve(io_worker *w, const struct bus_msg *m);

#endif

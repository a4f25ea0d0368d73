/* A worker's tie to the rest of the stack: its DEALER socket to the
 * coordinator (Register, Heartbeat, validated receive), its row in the
 * control block (beaten from a thread of its own, so a worker that waits in
 * a barrier or computes a long prefill still shows alive), and the serve
 * loop. Shared by cpu-worker and npu-worker; both stop on proc_stop.
 *
 * Errors: failures are logged where they happen (log_error, or log_warn for a
 * dropped message): worker_link_open returns -1, worker_link_send 0 and
 * worker_link_recv NULL (also for a timeout or a signal). The rest returns
 * nothing to check. */
#ifndef PI2_WORKER_LINK_H
#define PI2_WORKER_LINK_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "stack/bus.h"
#include "stack/msg.h"
#include "stack/proc_stop.h"
#include "stack/stack.h"

#define WORKER_BEAT_MS 100       /* ctl row: well inside the 200 ms the supervisor expects */
#define WORKER_HEARTBEAT_MS 200  /* Heartbeat message to the coordinator */

typedef struct {
    bus_ctx *ctx;
    bus_socket *sock;
    proc_row *row;
    uint32_t worker_id;          /* the coordinator's, from RegisterAck; index + 1 until then */
    uint64_t seq;
    bool send_failing;           /* the last send failed (logged once per outage) */
    struct bus_ticker ticker;
    _Atomic uint32_t state;      /* enum proc_state, published by the beat thread */
    _Atomic bool registered;     /* RegisterAck received: until then the row says STARTING */
    _Atomic bool beat_stop;
    pthread_t beat_thread;
    bool beat_running;
    int hot_wait_us;             /* worker_link_serve: spin this long after a message before sleeping */
    Pi2__ProcessKind kind;       /* what Register says, sent again when a new coordinator asks */
    uint32_t index, threads;
} worker_link;

/* Claims the ctl row `name`, starts beating it, connects DEALER `name` to the
 * coordinator endpoint of runid and sends Register. Returns 0 or -1 (logged). */
int worker_link_open(worker_link *w, stack_ctl *ctl, const char *runid, const char *name, Pi2__ProcessKind kind,
                     uint32_t index, uint32_t threads);
void worker_link_close(worker_link *w);

void worker_link_set_state(worker_link *w, enum proc_state st);
/* Sends env (its version and seq are filled in); returns the seq used, 0 on failure (logged). */
uint64_t worker_link_send(worker_link *w, Pi2__Envelope *env);
/* Sends a Heartbeat if one is due. Cheap; call it often. */
void worker_link_heartbeat(worker_link *w);
/* The next valid message for the caller, or NULL (timeout, signal, or a
 * message dropped with a WARN). RegisterAck and Shutdown are handled here. */
Pi2__Envelope *worker_link_recv(worker_link *w, const msg_limits *lim, int timeout_ms);
/* Until proc_stop: heartbeats, and hands each valid message of kind `takes`
 * to handle(ctx, env); other kinds are dropped with a WARN. For
 * w->hot_wait_us after each message it polls without sleeping (yielding the
 * core between polls): an idle vCPU is halted, and waking it for the next
 * message cost a cpu-worker ~0.3 ms per token, which the other workers
 * waited for at the first barrier. */
void worker_link_serve(worker_link *w, const msg_limits *lim, Pi2__Envelope__BodyCase takes,
                       void (*handle)(void *ctx, const Pi2__Envelope *env), void *ctx);

#endif

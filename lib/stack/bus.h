/* The message bus between the processes of a run: ZeroMQ sockets on ipc://
 * endpoints inside the run directory (see rundir.h), or tcp:// bound to
 * loopback unless allowed otherwise. A message is two frames,
 * [type tag: u32 little-endian][payload bytes]; a ROUTER also sees the
 * sender's identity frame in front. The bus does not know what a payload
 * means (proto/ does). Every frame received is checked (count, tag size,
 * payload size against max_frame, which libzmq also enforces before it
 * allocates); a malformed message is drained and reported, never trusted.
 *
 * The coordinator binds a ROUTER; workers connect DEALERs whose identity is
 * their name ("cpu-worker-0"). Sockets linger 0 so shutdown never hangs.
 * A bus_socket belongs to one thread (ZeroMQ sockets are not thread safe).
 *
 * Errors: functions return NULL, -1 or a negative enum bus_status (named by
 * bus_status_str); after NULL, -1, BUS_ERR, BUS_EPROTO or BUS_ETOOBIG,
 * bus_last_error() (per thread) says why. BUS_TIMEOUT and BUS_EINTR are not
 * faults; the peer table gives -1 when full or for an unknown peer. */
#ifndef PI2_BUS_H
#define PI2_BUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BUS_PEER_MAX 64  /* identity bytes */
#define BUS_ENDPOINT_MAX 128
#define BUS_MAX_PEERS 64 /* per heartbeat table */
#define BUS_POLL_MAX 16

enum bus_status {
    BUS_OK = 0,
    BUS_ERR = -1,     /* see bus_last_error() */
    BUS_TIMEOUT = -2, /* nothing within the timeout (or send queue full) */
    BUS_EINTR = -3,   /* a signal arrived: check the stop flag, then retry */
    BUS_EPROTO = -4,  /* malformed message received and discarded */
    BUS_ETOOBIG = -5, /* payload larger than max_frame */
    BUS_ENOPEER = -6, /* ROUTER: no connected peer with that identity */
};

enum bus_pattern { BUS_ROUTER, BUS_DEALER, BUS_PUSH, BUS_PULL };

struct bus_opts {
    size_t max_frame;        /* largest payload sent or accepted */
    int send_timeout_ms;     /* -1 blocks while the peer's queue is full */
    int hwm;                 /* messages queued per peer, each direction */
    bool allow_remote_tcp;   /* bind tcp:// on non-loopback addresses */
};

typedef struct bus_ctx bus_ctx;
typedef struct bus_socket bus_socket;

/* A received message. data points into the socket's buffer and stays valid
 * until the next bus_recv on that socket (no copy, no allocation by us). */
struct bus_msg {
    uint32_t type;
    const void *data;
    size_t len;
    uint8_t peer[BUS_PEER_MAX]; /* ROUTER: the sender's identity */
    size_t peer_len;
};

const char *bus_last_error(void);
const char *bus_status_str(int status);

/* max_frame 16 MiB, send timeout 1 s, hwm 1000, loopback-only tcp. */
struct bus_opts bus_default_opts(void);

/* One per process, created after any fork(). */
bus_ctx *bus_ctx_new(void);
void bus_ctx_free(bus_ctx *ctx);
/* The context's background threads (libzmq's I/O thread, which moves every
 * message, and its reaper) at SCHED_FIFO (util/realtime.h), for a link whose
 * messages must not wait behind a computing thread on the same core. Before
 * the context's first socket. 0, or -1 (bus_last_error) when the process may
 * not use real-time priority: the threads then run at normal priority. */
int bus_ctx_realtime_io(bus_ctx *ctx);

/* "ipc://<rundir>/<kind>-<index>.sock" (index < 0: "<kind>.sock"); fails if
 * the path would not fit a unix socket address. */
int bus_endpoint_ipc(char *buf, size_t len, const char *rundir, const char *kind, int index);
/* "tcp://<host>:<port>"; host NULL means 127.0.0.1. */
int bus_endpoint_tcp(char *buf, size_t len, const char *host, int port);

/* opts NULL means bus_default_opts(). An ipc endpoint must lie in a safe
 * run directory (rundir_check); a tcp one on loopback unless allowed. */
bus_socket *bus_bind(bus_ctx *ctx, enum bus_pattern pattern, const char *endpoint,
                     const struct bus_opts *opts);
/* identity: NUL-terminated name, required for DEALER, ignored otherwise. */
bus_socket *bus_connect(bus_ctx *ctx, enum bus_pattern pattern, const char *endpoint,
                        const char *identity, const struct bus_opts *opts);
void bus_close(bus_socket *s);

/* DEALER or PUSH. */
int bus_send(bus_socket *s, uint32_t type, const void *data, size_t len);
/* ROUTER: to the peer whose identity is peer[0..peer_len). */
int bus_send_to(bus_socket *s, const void *peer, size_t peer_len, uint32_t type, const void *data,
                size_t len);
/* The same, never waiting: BUS_TIMEOUT at once when the peer's queue is full
 * (nothing of the message queued), for answers to peers that may not read. */
int bus_try_send_to(bus_socket *s, const void *peer, size_t peer_len, uint32_t type, const void *data, size_t len);
/* timeout_ms: -1 waits forever, 0 polls. Returns BUS_OK or a status < 0. */
int bus_recv(bus_socket *s, struct bus_msg *m, int timeout_ms);

/* Waits until one of n sockets is readable; sets bit i of *ready for each.
 * Returns the number ready, 0 on timeout, or BUS_EINTR / BUS_ERR. */
int bus_poll(bus_socket *const *socks, int n, int timeout_ms, uint32_t *ready);
/* bus_poll with a plain descriptor beside the sockets (fd < 0: none): bit n of
 * *ready when it is readable. */
int bus_poll_fd(bus_socket *const *socks, int n, int fd, int timeout_ms, uint32_t *ready);
/* bus_poll_fd for one socket, for a loop that sleeps often: right after a
 * bus_recv found nothing it waits in one plain poll on the socket's ZMQ_FD,
 * and then bit 0 of *ready may be set with no message waiting (look with
 * bus_recv(.., 0)); otherwise it is bus_poll_fd. */
int bus_sleep_fd(bus_socket *s, int fd, int timeout_ms, uint32_t *ready);

/* Heartbeats: a worker sends one every period; the receiver counts any
 * message as a sign of life and declares a peer dead after dead_after_ms. */
struct bus_ticker {
    int64_t period_ms, next_ms;
};
void bus_ticker_init(struct bus_ticker *t, int64_t period_ms, int64_t now_ms);
/* True at most once per period (it then schedules the next one). */
bool bus_ticker_due(struct bus_ticker *t, int64_t now_ms);
/* Sends an empty message of the given type if the ticker is due. */
int bus_heartbeat(bus_socket *s, struct bus_ticker *t, uint32_t type, int64_t now_ms);

struct bus_peer {
    uint8_t id[BUS_PEER_MAX];
    size_t id_len;
    int64_t last_seen_ms;
};
struct bus_peers {
    int n;
    int64_t dead_after_ms;
    struct bus_peer peer[BUS_MAX_PEERS];
};
void bus_peers_init(struct bus_peers *p, int64_t dead_after_ms);
/* Records a sign of life; returns the peer's index, or -1 if the table is full. */
int bus_peers_seen(struct bus_peers *p, const void *id, size_t id_len, int64_t now_ms);
int bus_peers_find(const struct bus_peers *p, const void *id, size_t id_len);
bool bus_peers_alive(const struct bus_peers *p, int i, int64_t now_ms);
/* Drops peer i (indices above it move down by one). */
void bus_peers_remove(struct bus_peers *p, int i);

#endif

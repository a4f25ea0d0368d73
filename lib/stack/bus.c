#include "stack/bus.h"

#include "util/clock.h"
#include "stack/rundir.h"
#include "util/realtime.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

struct bus_ctx {
    void *zmq;
};

struct bus_socket {
    void *zs;
    enum bus_pattern pattern;
    struct bus_opts opts;
    zmq_msg_t payload; /* the last payload received; bus_msg.data points into it */
    /* The last call on zs was a receive that found nothing: libzmq has taken
     * every command queued for the socket, so its ZMQ_FD turns readable when
     * the next message comes (any other call may take that signal first). */
    bool drained;
    int signal_fd; /* its ZMQ_FD (fixed for the socket's life); -1 if libzmq gave none */
    /* The ipc socket file we bound, removed on close (libzmq leaves it). */
    char ipc_path[BUS_ENDPOINT_MAX];
    dev_t ipc_dev;
    ino_t ipc_ino;
};

static _Thread_local char bus_err[256];

__attribute__((format(printf, 1, 2))) static void set_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(bus_err, sizeof bus_err, fmt, ap);
    va_end(ap);
}

const char *bus_last_error(void) { return bus_err; }

const char *bus_status_str(int status) {
    switch (status) {
    case BUS_OK: return "ok";
    case BUS_TIMEOUT: return "timeout";
    case BUS_EINTR: return "interrupted";
    case BUS_EPROTO: return "malformed message";
    case BUS_ETOOBIG: return "payload too large";
    case BUS_ENOPEER: return "no such peer";
    default: return "error";
    }
}

struct bus_opts bus_default_opts(void) {
    return (struct bus_opts){
        .max_frame = 16u << 20, .send_timeout_ms = 1000, .hwm = 1000, .allow_remote_tcp = false};
}

bus_ctx *bus_ctx_new(void) {
    bus_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        set_err("out of memory");
        return NULL;
    }
    c->zmq = zmq_ctx_new();
    if (!c->zmq) {
        set_err("zmq_ctx_new: %s", zmq_strerror(errno));
        free(c);
        return NULL;
    }
    /* Non-blocky: terminating the context never waits for unsent messages. */
    zmq_ctx_set(c->zmq, ZMQ_BLOCKY, 0);
    return c;
}

int bus_ctx_realtime_io(bus_ctx *c) {
    /* libzmq aborts when a thread it starts cannot take the policy it was given: ask first */
    if (!realtime_allowed()) {
        set_err("this process may not use real-time priority (needs CAP_SYS_NICE or RLIMIT_RTPRIO >= %d)",
                REALTIME_PRIORITY);
        return -1;
    }
    if (zmq_ctx_set(c->zmq, ZMQ_THREAD_SCHED_POLICY, SCHED_FIFO) ||
        zmq_ctx_set(c->zmq, ZMQ_THREAD_PRIORITY, REALTIME_PRIORITY)) {
        set_err("zmq_ctx_set: %s", zmq_strerror(errno));
        return -1;
    }
    return 0;
}

void bus_ctx_free(bus_ctx *c) {
    if (!c) return;
    while (zmq_ctx_term(c->zmq) && errno == EINTR) {}
    free(c);
}

int bus_endpoint_ipc(char *buf, size_t len, const char *rundir, const char *kind, int index) {
    char path[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
    int n = index < 0 ? snprintf(path, sizeof path, "%s/%s.sock", rundir, kind)
                      : snprintf(path, sizeof path, "%s/%s-%d.sock", rundir, kind, index);
    if (n < 0 || (size_t)n >= sizeof path - 1) {
        set_err("ipc endpoint %s/%s: longer than a unix socket path allows", rundir, kind);
        return -1;
    }
    n = snprintf(buf, len, "ipc://%s", path);
    if (n < 0 || (size_t)n >= len) {
        set_err("ipc endpoint: buffer too small");
        return -1;
    }
    return 0;
}

int bus_endpoint_tcp(char *buf, size_t len, const char *host, int port) {
    if (port < 0 || port > 65535) {
        set_err("tcp endpoint: port %d out of range", port);
        return -1;
    }
    int n = snprintf(buf, len, "tcp://%s:%d", host ? host : "127.0.0.1", port);
    if (n < 0 || (size_t)n >= len) {
        set_err("tcp endpoint: buffer too small");
        return -1;
    }
    return 0;
}

/* Binding rules: ipc sockets only in a private run directory, tcp only on
 * loopback unless the configuration says otherwise. */
static int check_bind_endpoint(const char *ep, const struct bus_opts *o) {
    if (!strncmp(ep, "ipc://", 6)) {
        const char *path = ep + 6;
        const char *slash = strrchr(path, '/');
        if (path[0] != '/' || !slash || slash == path) {
            set_err("ipc endpoint %s: must be an absolute path inside a run directory", ep);
            return -1;
        }
        char dir[BUS_ENDPOINT_MAX];
        if ((size_t)(slash - path) >= sizeof dir) {
            set_err("ipc endpoint %s: path too long", ep);
            return -1;
        }
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = 0;
        if (rundir_check(dir)) {
            set_err("ipc endpoint %s: %s", ep, rundir_last_error());
            return -1;
        }
        return 0;
    }
    if (!strncmp(ep, "tcp://", 6)) {
        const char *host = ep + 6;
        if (o->allow_remote_tcp || !strncmp(host, "127.", 4) || !strncmp(host, "localhost:", 10) ||
            !strncmp(host, "[::1]:", 6))
            return 0;
        set_err("tcp endpoint %s: not loopback (set allow_remote_tcp to bind elsewhere)", ep);
        return -1;
    }
    if (!strncmp(ep, "inproc://", 9)) return 0;
    set_err("endpoint %s: transport must be ipc://, tcp:// or inproc://", ep);
    return -1;
}

static int set_int(void *zs, int opt, int v, const char *what) {
    if (zmq_setsockopt(zs, opt, &v, sizeof v) == 0) return 0;
    set_err("zmq_setsockopt(%s): %s", what, zmq_strerror(errno));
    return -1;
}

static bus_socket *socket_new(bus_ctx *ctx, enum bus_pattern pattern, const struct bus_opts *opts,
                              const char *identity) {
    static const int zmq_types[] = {[BUS_ROUTER] = ZMQ_ROUTER, [BUS_DEALER] = ZMQ_DEALER,
                                    [BUS_PUSH] = ZMQ_PUSH, [BUS_PULL] = ZMQ_PULL};
    if ((unsigned)pattern > BUS_PULL) {
        set_err("socket pattern %d unknown", (int)pattern);
        return NULL;
    }
    bus_socket *s = calloc(1, sizeof *s);
    if (!s) {
        set_err("out of memory");
        return NULL;
    }
    s->pattern = pattern;
    s->opts = opts ? *opts : bus_default_opts();
    if (s->opts.max_frame == 0 || s->opts.max_frame > INT64_MAX) {
        set_err("max_frame %zu: must be in 1..2^63", s->opts.max_frame);
        free(s);
        return NULL;
    }
    zmq_msg_init(&s->payload);
    s->zs = zmq_socket(ctx->zmq, zmq_types[pattern]);
    if (!s->zs) {
        set_err("zmq_socket: %s", zmq_strerror(errno));
        zmq_msg_close(&s->payload);
        free(s);
        return NULL;
    }
    /* libzmq drops a peer that announces a bigger message before it allocates
     * anything for it; identity and tag frames are always smaller. */
    int64_t max_msg = (int64_t)s->opts.max_frame;
    if (zmq_setsockopt(s->zs, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg)) {
        set_err("zmq_setsockopt(MAXMSGSIZE): %s", zmq_strerror(errno));
        goto fail;
    }
    if (set_int(s->zs, ZMQ_LINGER, 0, "LINGER") ||
        set_int(s->zs, ZMQ_SNDTIMEO, s->opts.send_timeout_ms, "SNDTIMEO") ||
        set_int(s->zs, ZMQ_SNDHWM, s->opts.hwm, "SNDHWM") || set_int(s->zs, ZMQ_RCVHWM, s->opts.hwm, "RCVHWM"))
        goto fail;
    if (pattern == BUS_ROUTER) {
        /* Report unknown peers instead of dropping silently, and let a
         * restarted worker take over its old identity at once. */
        if (set_int(s->zs, ZMQ_ROUTER_MANDATORY, 1, "ROUTER_MANDATORY") ||
            set_int(s->zs, ZMQ_ROUTER_HANDOVER, 1, "ROUTER_HANDOVER"))
            goto fail;
    }
    if (pattern == BUS_DEALER) {
        size_t n = identity ? strlen(identity) : 0;
        if (n == 0 || n > BUS_PEER_MAX) {
            set_err("DEALER identity '%s': must be 1..%d bytes", identity ? identity : "(null)", BUS_PEER_MAX);
            goto fail;
        }
        if (zmq_setsockopt(s->zs, ZMQ_ROUTING_ID, identity, n)) {
            set_err("zmq_setsockopt(ROUTING_ID): %s", zmq_strerror(errno));
            goto fail;
        }
    }
    size_t fd_len = sizeof s->signal_fd;
    if (zmq_getsockopt(s->zs, ZMQ_FD, &s->signal_fd, &fd_len)) s->signal_fd = -1; /* bus_sleep_fd: zmq_poll then */
    return s;
fail:
    bus_close(s);
    return NULL;
}

bus_socket *bus_bind(bus_ctx *ctx, enum bus_pattern pattern, const char *endpoint,
                     const struct bus_opts *opts) {
    struct bus_opts o = opts ? *opts : bus_default_opts();
    if (check_bind_endpoint(endpoint, &o)) return NULL;
    bus_socket *s = socket_new(ctx, pattern, &o, NULL);
    if (!s) return NULL;
    if (zmq_bind(s->zs, endpoint)) {
        set_err("bind %s: %s", endpoint, zmq_strerror(errno));
        bus_close(s);
        return NULL;
    }
    struct stat st;
    if (!strncmp(endpoint, "ipc://", 6) && stat(endpoint + 6, &st) == 0) {
        snprintf(s->ipc_path, sizeof s->ipc_path, "%s", endpoint + 6);
        s->ipc_dev = st.st_dev;
        s->ipc_ino = st.st_ino;
    }
    return s;
}

bus_socket *bus_connect(bus_ctx *ctx, enum bus_pattern pattern, const char *endpoint,
                        const char *identity, const struct bus_opts *opts) {
    bus_socket *s = socket_new(ctx, pattern, opts, identity);
    if (!s) return NULL;
    if (zmq_connect(s->zs, endpoint)) {
        set_err("connect %s: %s", endpoint, zmq_strerror(errno));
        bus_close(s);
        return NULL;
    }
    return s;
}

void bus_close(bus_socket *s) {
    if (!s) return;
    zmq_close(s->zs);
    zmq_msg_close(&s->payload);
    /* Only our own file: a restarted process may have bound the path anew. */
    struct stat st;
    if (s->ipc_path[0] && stat(s->ipc_path, &st) == 0 && st.st_dev == s->ipc_dev && st.st_ino == s->ipc_ino)
        unlink(s->ipc_path);
    free(s);
}

static int status_from_errno(int err, const char *what) {
    switch (err) {
    case EAGAIN: return BUS_TIMEOUT;
    case EINTR: return BUS_EINTR;
    case EHOSTUNREACH: return BUS_ENOPEER;
    default: set_err("%s: %s", what, zmq_strerror(err)); return BUS_ERR;
    }
}

/* Later frames of a message are retried on EINTR: once the first frame is
 * queued the message must be completed, and libzmq accepts them at once. */
static int send_frame(void *zs, const void *data, size_t len, int flags, bool first) {
    for (;;) {
        if (zmq_send(zs, data, len, flags) >= 0) return BUS_OK;
        if (errno == EINTR && !first) continue;
        return status_from_errno(errno, "send");
    }
}

static int check_payload_len(const bus_socket *s, size_t len) {
    if (len <= s->opts.max_frame) return BUS_OK;
    set_err("send: payload of %zu bytes exceeds max_frame %zu", len, s->opts.max_frame);
    return BUS_ETOOBIG;
}

/* [tag][payload]; the caller has checked the payload length. */
static int send_tagged(bus_socket *s, bool first, uint32_t type, const void *data, size_t len) {
    uint8_t tag[4] = {(uint8_t)type, (uint8_t)(type >> 8), (uint8_t)(type >> 16), (uint8_t)(type >> 24)};
    int rc = send_frame(s->zs, tag, sizeof tag, ZMQ_SNDMORE, first);
    if (rc) return rc;
    return send_frame(s->zs, data, len, 0, false);
}

int bus_send(bus_socket *s, uint32_t type, const void *data, size_t len) {
    s->drained = false;
    if (s->pattern != BUS_DEALER && s->pattern != BUS_PUSH) {
        set_err("bus_send: needs a DEALER or PUSH socket");
        return BUS_ERR;
    }
    int rc = check_payload_len(s, len);
    return rc ? rc : send_tagged(s, true, type, data, len);
}

/* first_flags: ZMQ_DONTWAIT makes a full queue fail at once; it is the
 * identity frame that meets it, so nothing of the message is queued. */
static int send_to(bus_socket *s, int first_flags, const void *peer, size_t peer_len, uint32_t type, const void *data,
                   size_t len) {
    s->drained = false;
    if (s->pattern != BUS_ROUTER) {
        set_err("bus_send_to: needs a ROUTER socket");
        return BUS_ERR;
    }
    if (peer_len == 0 || peer_len > BUS_PEER_MAX) {
        set_err("bus_send_to: peer identity of %zu bytes", peer_len);
        return BUS_ENOPEER;
    }
    int rc = check_payload_len(s, len);
    if (rc) return rc;
    rc = send_frame(s->zs, peer, peer_len, ZMQ_SNDMORE | first_flags, true);
    if (rc) return rc;
    return send_tagged(s, false, type, data, len);
}

int bus_send_to(bus_socket *s, const void *peer, size_t peer_len, uint32_t type, const void *data, size_t len) {
    return send_to(s, 0, peer, peer_len, type, data, len);
}

int bus_try_send_to(bus_socket *s, const void *peer, size_t peer_len, uint32_t type, const void *data, size_t len) {
    return send_to(s, ZMQ_DONTWAIT, peer, peer_len, type, data, len);
}

static bool more_frames(void *zs) {
    int more = 0;
    size_t sz = sizeof more;
    return zmq_getsockopt(zs, ZMQ_RCVMORE, &more, &sz) == 0 && more;
}

/* Discards the rest of a malformed message; its frames are all queued. */
static int drop_rest(bus_socket *s, const char *why) {
    int extra = 0;
    while (more_frames(s->zs)) {
        zmq_msg_t junk;
        zmq_msg_init(&junk);
        int rc = zmq_msg_recv(&junk, s->zs, ZMQ_DONTWAIT);
        zmq_msg_close(&junk);
        if (rc < 0 && errno != EINTR) break;
        extra++;
    }
    set_err("recv: malformed message dropped: %s (%d more frames discarded)", why, extra);
    return BUS_EPROTO;
}

/* First frame of the next message, waiting up to timeout_ms. Tries without
 * waiting first, so a busy socket costs no poll call. */
static int recv_first(bus_socket *s, void *buf, size_t cap, int timeout_ms, int *n_out) {
    int64_t deadline = timeout_ms > 0 ? clock_ms() + timeout_ms : 0;
    for (;;) {
        int n = zmq_recv(s->zs, buf, cap, ZMQ_DONTWAIT);
        if (n >= 0) {
            *n_out = n;
            return BUS_OK;
        }
        if (errno != EAGAIN) return status_from_errno(errno, "recv");
        if (timeout_ms == 0) {
            s->drained = true;
            return BUS_TIMEOUT;
        }
        int wait = -1;
        if (timeout_ms > 0) {
            int64_t left = deadline - clock_ms();
            if (left <= 0) return BUS_TIMEOUT;
            wait = (int)left;
        }
        zmq_pollitem_t item = {.socket = s->zs, .events = ZMQ_POLLIN};
        int rc = zmq_poll(&item, 1, wait);
        if (rc < 0) return status_from_errno(errno, "poll");
        if (rc == 0) return BUS_TIMEOUT;
    }
}

int bus_recv(bus_socket *s, struct bus_msg *m, int timeout_ms) {
    if (s->pattern == BUS_PUSH) {
        set_err("bus_recv: a PUSH socket cannot receive");
        return BUS_ERR;
    }
    s->drained = false;
    m->data = NULL;
    m->len = 0;
    m->peer_len = 0;
    uint8_t tag[4];
    int n;
    int rc;
    if (s->pattern == BUS_ROUTER) {
        rc = recv_first(s, m->peer, sizeof m->peer, timeout_ms, &n);
        if (rc) return rc;
        if ((size_t)n > sizeof m->peer) return drop_rest(s, "identity longer than BUS_PEER_MAX");
        m->peer_len = (size_t)n;
        if (!more_frames(s->zs)) return drop_rest(s, "identity without a message");
        do n = zmq_recv(s->zs, tag, sizeof tag, ZMQ_DONTWAIT);
        while (n < 0 && errno == EINTR);
    } else {
        rc = recv_first(s, tag, sizeof tag, timeout_ms, &n);
        if (rc) return rc;
    }
    if (n != (int)sizeof tag) return drop_rest(s, "type tag frame is not 4 bytes");
    if (!more_frames(s->zs)) return drop_rest(s, "no payload frame");
    m->type = (uint32_t)tag[0] | (uint32_t)tag[1] << 8 | (uint32_t)tag[2] << 16 | (uint32_t)tag[3] << 24;

    zmq_msg_close(&s->payload);
    zmq_msg_init(&s->payload);
    do rc = zmq_msg_recv(&s->payload, s->zs, ZMQ_DONTWAIT);
    while (rc < 0 && errno == EINTR);
    if (rc < 0) return drop_rest(s, "payload frame missing");
    if (more_frames(s->zs)) return drop_rest(s, "more than one payload frame");
    size_t len = zmq_msg_size(&s->payload);
    if (len > s->opts.max_frame) return drop_rest(s, "payload larger than max_frame");
    m->data = zmq_msg_data(&s->payload);
    m->len = len;
    return BUS_OK;
}

int bus_poll_fd(bus_socket *const *socks, int n, int fd, int timeout_ms, uint32_t *ready) {
    if (n < 1 || n > BUS_POLL_MAX) {
        set_err("bus_poll: %d sockets, must be 1..%d", n, BUS_POLL_MAX);
        return BUS_ERR;
    }
    zmq_pollitem_t items[BUS_POLL_MAX + 1];
    for (int i = 0; i < n; i++) {
        items[i] = (zmq_pollitem_t){.socket = socks[i]->zs, .events = ZMQ_POLLIN};
        socks[i]->drained = false;
    }
    const int n_items = fd >= 0 ? n + 1 : n;
    if (fd >= 0) items[n] = (zmq_pollitem_t){.fd = fd, .events = ZMQ_POLLIN};
    int rc = zmq_poll(items, n_items, timeout_ms);
    if (rc < 0) return status_from_errno(errno, "poll");
    *ready = 0;
    for (int i = 0; i < n_items; i++)
        if (items[i].revents & ZMQ_POLLIN) *ready |= 1u << i;
    return rc;
}

int bus_sleep_fd(bus_socket *s, int fd, int timeout_ms, uint32_t *ready) {
    if (!s->drained || s->signal_fd < 0) return bus_poll_fd(&s, 1, fd, timeout_ms, ready);
    /* one system call, where zmq_poll makes four or five (a first look, the socket's events before and after
     * the wait, each with libzmq's fork check) */
    struct pollfd p[2] = {{.fd = s->signal_fd, .events = POLLIN}, {.fd = fd, .events = POLLIN}};
    const int rc = poll(p, fd >= 0 ? 2 : 1, timeout_ms);
    if (rc < 0) return status_from_errno(errno, "poll");
    *ready = (p[0].revents & POLLIN ? 1u : 0u) | (fd >= 0 && p[1].revents & POLLIN ? 2u : 0u);
    return rc;
}

int bus_poll(bus_socket *const *socks, int n, int timeout_ms, uint32_t *ready) {
    return bus_poll_fd(socks, n, -1, timeout_ms, ready);
}

void bus_ticker_init(struct bus_ticker *t, int64_t period_ms, int64_t now_ms) {
    t->period_ms = period_ms;
    t->next_ms = now_ms;
}

bool bus_ticker_due(struct bus_ticker *t, int64_t now_ms) {
    if (now_ms < t->next_ms) return false;
    /* Skip missed periods rather than firing a burst after a stall. */
    t->next_ms = now_ms + t->period_ms;
    return true;
}

int bus_heartbeat(bus_socket *s, struct bus_ticker *t, uint32_t type, int64_t now_ms) {
    if (!bus_ticker_due(t, now_ms)) return BUS_OK;
    return bus_send(s, type, NULL, 0);
}

void bus_peers_init(struct bus_peers *p, int64_t dead_after_ms) {
    p->n = 0;
    p->dead_after_ms = dead_after_ms;
}

int bus_peers_find(const struct bus_peers *p, const void *id, size_t id_len) {
    for (int i = 0; i < p->n; i++)
        if (p->peer[i].id_len == id_len && !memcmp(p->peer[i].id, id, id_len)) return i;
    return -1;
}

int bus_peers_seen(struct bus_peers *p, const void *id, size_t id_len, int64_t now_ms) {
    if (id_len == 0 || id_len > BUS_PEER_MAX) return -1;
    int i = bus_peers_find(p, id, id_len);
    if (i < 0) {
        if (p->n == BUS_MAX_PEERS) return -1;
        i = p->n++;
        memcpy(p->peer[i].id, id, id_len);
        p->peer[i].id_len = id_len;
    }
    p->peer[i].last_seen_ms = now_ms;
    return i;
}

bool bus_peers_alive(const struct bus_peers *p, int i, int64_t now_ms) {
    return i >= 0 && i < p->n && now_ms - p->peer[i].last_seen_ms <= p->dead_after_ms;
}

void bus_peers_remove(struct bus_peers *p, int i) {
    if (i < 0 || i >= p->n) return;
    memmove(&p->peer[i], &p->peer[i + 1], (size_t)(p->n - i - 1) * sizeof p->peer[0]);
    p->n--;
}

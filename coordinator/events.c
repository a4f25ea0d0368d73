/* The coordinator's sockets and its event pump: every received frame is
 * unpacked and validated before a handler sees it; garbage is dropped with a
 * WARN, at most one a second per peer. The pump also beats our ctl row and
 * re-checks worker liveness, so any wait built on it keeps the stack's
 * bookkeeping going. */
#include <stdio.h>
#include <stdlib.h>

#include "util/clock.h"
#include "coord.h"
#include "util/log.h"
#include "stack/rundir.h"

static bus_socket *bind_router(coord *c, const char *dir, const char *kind, const struct bus_opts *opts) {
    char ep[BUS_ENDPOINT_MAX];
    if (bus_endpoint_ipc(ep, sizeof ep, dir, kind, 0)) {
        log_error("%s", bus_last_error());
        return NULL;
    }
    bus_socket *s = bus_bind(c->bus, BUS_ROUTER, ep, opts);
    if (!s) log_error("binding %s: %s", ep, bus_last_error());
    return s;
}

int coord_open_bus(coord *c) {
    char dir[RUNDIR_PATH_MAX];
    if (rundir_path(dir, sizeof dir, c->opt.runid) || rundir_create(dir)) {
        log_error("run directory of '%s': %s", c->opt.runid, rundir_last_error());
        return -1;
    }
    if (!(c->bus = bus_ctx_new())) {
        log_error("ZeroMQ: %s", bus_last_error());
        return -1;
    }
    /* Workers are our own processes and read from a thread of their own: the
     * default 1 s send timeout only covers a burst. A client may stop reading
     * at any time, so nothing sent to one may wait (clients.c). */
    struct bus_opts client_opts = bus_default_opts();
    client_opts.send_timeout_ms = 0;
    if (!(c->workers_sock = bind_router(c, dir, "coordinator", NULL)) ||
        !(c->client_sock = bind_router(c, dir, "client", &client_opts)))
        return -1;
    return 0;
}

void coord_close_bus(coord *c) {
    bus_close(c->client_sock);
    bus_close(c->workers_sock);
    bus_ctx_free(c->bus);
    c->client_sock = c->workers_sock = NULL;
    c->bus = NULL;
}

int coord_send(coord *c, bus_socket *s, const void *peer, size_t peer_len, Pi2__Envelope *env) {
    uint8_t stack_buf[1024];
    env->version = PI2_PROTO_VERSION;
    env->seq = ++c->seq;
    size_t len;
    uint8_t *heap = NULL, *buf = stack_buf;
    if (msg_pack(env, stack_buf, sizeof stack_buf, &len)) {
        if (!(buf = heap = msg_pack_alloc(env, &len))) {
            log_error("cannot pack a %s message", msg_body_name(env->body_case));
            return BUS_ERR;
        }
    }
    int rc = bus_send_to(s, peer, peer_len, PI2_BUS_MSG, buf, len);
    free(heap);
    return rc;
}

/* A bad message from s's peer: dropped; a client waits for an answer, a
 * worker's bad message only costs it a re-send. Both limited per peer. */
static void drop_bad(coord *c, bus_socket *s, const struct bus_msg *bm, Pi2__ErrorCode code, const char *why) {
    if (s == c->client_sock) client_refuse(c, bm, code, "%s", why);
    else peer_limit_warn(&c->drop_notes, bm->peer, bm->peer_len, "dropped a message from worker '%.*s': %s", (int)bm->peer_len,
                         (const char *)bm->peer, why);
}

/* One frame from socket s: decoded, validated, handed to its handler. */
static void handle_frame(coord *c, bus_socket *s, const struct bus_msg *bm) {
    char err[256];
    if (bm->type != PI2_BUS_MSG) {
        snprintf(err, sizeof err, "a frame of type %u", bm->type);
        drop_bad(c, s, bm, PI2__ERROR_CODE__MALFORMED, err);
        return;
    }
    Pi2__Envelope *env = msg_unpack(bm->data, bm->len, err, sizeof err);
    if (env && msg_validate(env, &c->lim, err, sizeof err)) {
        msg_free(env);
        env = NULL;
    }
    if (!env) {
        drop_bad(c, s, bm, PI2__ERROR_CODE__INVALID, err);
        return;
    }
    if (s == c->workers_sock) workers_on_message(c, bm, env);
    else clients_on_message(c, bm, env);
    msg_free(env);
}

/* Handles the messages already queued on s, at most DRAIN_MAX: a peer that
 * sends without pause must not keep the pump from beating; the rest wait
 * for the next pump, which finds s readable at once. */
#define DRAIN_MAX 512
static void drain(coord *c, bus_socket *s) {
    struct bus_msg bm;
    for (int n = 0; n < DRAIN_MAX; n++) {
        int rc = bus_recv(s, &bm, 0);
        if (rc == BUS_OK) handle_frame(c, s, &bm);
        else if (rc == BUS_EPROTO || rc == BUS_ETOOBIG) /* bm.peer: the sender, when its identity was read */
            peer_limit_warn(&c->drop_notes, bm.peer, bm.peer_len, "dropped a malformed frame from '%.*s' on the %s socket: %s",
                            (int)bm.peer_len, (const char *)bm.peer, s == c->workers_sock ? "workers'" : "clients'",
                            bus_status_str(rc));
        else break;
    }
}

void coord_pump(coord *c, int timeout_ms) {
    int64_t now = clock_ms();
    if (timeout_ms > c->next_beat_ms - now) timeout_ms = (int)(c->next_beat_ms - now);
    if (timeout_ms < 0) timeout_ms = 0;
    bus_socket *socks[2] = {c->workers_sock, c->client_sock};
    uint32_t ready = 0;
    int n = bus_poll(socks, 2, timeout_ms, &ready);
    if (n == BUS_ERR) log_warn("poll: %s", bus_last_error());
    if (n > 0) {
        /* Workers first: their completions gate the schedule. */
        if (ready & 1) drain(c, c->workers_sock);
        if (ready & 2) drain(c, c->client_sock);
    }
    now = clock_ms();
    if (now >= c->next_beat_ms) {
        ctl_proc_beat(c->sv.row, c->busy ? PROC_BUSY : PROC_READY);
        c->next_beat_ms = now + COORD_BEAT_MS;
        peer_limit_report(&c->refusals, "refusals of client", now);
        peer_limit_report(&c->drop_notes, "dropped messages from", now);
    }
    workers_check_alive(c, now);
    client_check_stall(c, now);
    queue_tick(c, now);
    if (c->prompt.active) client_prompt_progress(c);
}

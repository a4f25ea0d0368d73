/* The coordinator's sockets and its event pump: every received frame is
 * unpacked and validated before a handler sees it; garbage is dropped with a
 * WARN. The pump also beats our ctl row and re-checks worker liveness, so any
 * wait built on it keeps the stack's bookkeeping going. */
#include <stdlib.h>

#include "util/clock.h"
#include "coord.h"
#include "util/log.h"
#include "stack/rundir.h"

static bus_socket *bind_router(coord *c, const char *dir, const char *kind) {
    char ep[BUS_ENDPOINT_MAX];
    if (bus_endpoint_ipc(ep, sizeof ep, dir, kind, 0)) {
        log_error("%s", bus_last_error());
        return NULL;
    }
    bus_socket *s = bus_bind(c->bus, BUS_ROUTER, ep, NULL);
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
    if (!(c->workers_sock = bind_router(c, dir, "coordinator")) || !(c->client_sock = bind_router(c, dir, "client")))
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

/* One frame from socket s: decoded, validated, handed to its handler. */
static void handle_frame(coord *c, bus_socket *s, const struct bus_msg *bm) {
    const char *from = s == c->workers_sock ? "worker" : "client";
    char err[256];
    if (bm->type != PI2_BUS_MSG) {
        log_warn("dropped a frame of type %u from %s '%.*s'", bm->type, from, (int)bm->peer_len, (const char *)bm->peer);
        return;
    }
    Pi2__Envelope *env = msg_unpack(bm->data, bm->len, err, sizeof err);
    if (env && msg_validate(env, &c->lim, err, sizeof err)) {
        msg_free(env);
        env = NULL;
    }
    if (!env) {
        log_warn("dropped a message from %s '%.*s': %s", from, (int)bm->peer_len, (const char *)bm->peer, err);
        /* A client waits for an answer; a worker's bad message only costs it a re-send. */
        if (s == c->client_sock) client_send_error(c, bm->peer, bm->peer_len, PI2__ERROR_CODE__INVALID, "%s", err);
        return;
    }
    if (s == c->workers_sock) workers_on_message(c, bm, env);
    else clients_on_message(c, bm, env);
    msg_free(env);
}

/* Handles every message already queued on s. */
static void drain(coord *c, bus_socket *s) {
    struct bus_msg bm;
    for (;;) {
        int rc = bus_recv(s, &bm, 0);
        if (rc == BUS_OK) handle_frame(c, s, &bm);
        else if (rc == BUS_EPROTO || rc == BUS_ETOOBIG)
            log_warn("dropped a malformed frame on the %s socket: %s", s == c->workers_sock ? "workers'" : "clients'",
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
    }
    workers_check_alive(c, now);
    if (c->prompt.active) client_prompt_progress(c);
}

/* Generations waiting their turn: a client that asks while another
 * generation runs is queued (at most COORD_QUEUE_MAX, in arrival order) and
 * told how many are ahead of it, then told again every second, so it can
 * tell a long queue from a dead stack. It is served when the slot frees,
 * and gets STACK_BUSY only after the wait it asked for (GenerateRequest.
 * max_wait_ms, pi2 run --wait). Nothing here waits on a client: every send
 * goes through the client socket, whose sends never block (clients.c); a
 * client that has gone leaves the queue at its next notice. */
#include <stdio.h>
#include <string.h>

#include "coord.h"
#include "util/clock.h"
#include "util/log.h"

static int send_queued(coord *c, const gen_request *r, uint32_t ahead, int64_t now_ms) {
    Pi2__GenerateQueued q = PI2__GENERATE_QUEUED__INIT;
    q.ahead = ahead;
    q.waited_ms = (double)(now_ms - r->queued_ms);
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, 0);
    env.body_case = PI2__ENVELOPE__BODY_GENERATE_QUEUED;
    env.generate_queued = &q;
    return coord_send(c, c->client_sock, r->client, r->client_len, &env);
}

static bool same_client(const gen_request *r, const struct bus_msg *bm) {
    return r->client_len == bm->peer_len && !memcmp(r->client, bm->peer, bm->peer_len);
}

/* Drops entry i, keeping the order of the rest. */
static void remove_at(coord *c, int i) {
    gen_request_clear(&c->waiting[i]);
    memmove(&c->waiting[i], &c->waiting[i + 1], sizeof *c->waiting * (size_t)(c->n_waiting - i - 1));
    c->n_waiting--;
    memset(&c->waiting[c->n_waiting], 0, sizeof *c->waiting);
}

void queue_offer(coord *c, const struct bus_msg *bm, const Pi2__GenerateRequest *g) {
    if (!g->max_wait_ms) {
        client_refuse(c, bm, PI2__ERROR_CODE__STACK_BUSY, "the stack is serving another generation (and the request may not wait)");
        return;
    }
    bool dup = c->busy && same_client(&c->req, bm);
    for (int i = 0; i < c->n_waiting && !dup; i++) dup = same_client(&c->waiting[i], bm);
    if (dup) {
        client_refuse(c, bm, PI2__ERROR_CODE__INVALID, "this client already has a generation running or waiting");
        return;
    }
    if (c->n_waiting == COORD_QUEUE_MAX) {
        client_refuse(c, bm, PI2__ERROR_CODE__STACK_BUSY, "the stack is serving another generation and %d more wait",
                      COORD_QUEUE_MAX);
        return;
    }
    gen_request *r = &c->waiting[c->n_waiting];
    if (gen_request_fill(r, bm, g)) {
        gen_request_clear(r);
        client_refuse(c, bm, PI2__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    c->n_waiting++;
    r->queued_ms = r->told_ms = clock_ms();
    log_info("client '%.*s' waits its turn: %d ahead", (int)r->client_len, (const char *)r->client, c->n_waiting);
    if (send_queued(c, r, (uint32_t)c->n_waiting, r->queued_ms) == BUS_ENOPEER) remove_at(c, c->n_waiting - 1);
}

void queue_tick(coord *c, int64_t now_ms) {
    for (int i = 0; i < c->n_waiting; i++) {
        gen_request *r = &c->waiting[i];
        if (now_ms - r->queued_ms >= r->max_wait_ms) {
            char why[160];
            snprintf(why, sizeof why, "waited %.1f s for the generations before it (%d ahead), the limit it asked for",
                     (now_ms - r->queued_ms) / 1e3, i + 1);
            log_info("client '%.*s' refused: %s", (int)r->client_len, (const char *)r->client, why);
            client_error_to(c, r->client, r->client_len, 0, PI2__ERROR_CODE__STACK_BUSY, why);
        } else if (now_ms - r->told_ms < COORD_QUEUE_TELL_MS) {
            continue;
        } else {
            r->told_ms = now_ms;
            const int rc = send_queued(c, r, (uint32_t)(i + 1), now_ms);
            if (rc == BUS_OK || rc == BUS_TIMEOUT) continue; /* a full queue: the next notice may fit */
            log_info("client '%.*s' left the queue: %s", (int)r->client_len, (const char *)r->client,
                     bus_status_str(rc));
        }
        remove_at(c, i--);
    }
}

void queue_next(coord *c) {
    if (!c->n_waiting || c->busy || c->req.pending) return;
    c->req = c->waiting[0];
    memset(&c->waiting[0], 0, sizeof *c->waiting); /* the prompt now belongs to c->req */
    remove_at(c, 0);
    c->req.pending = true;
}

void queue_close(coord *c) {
    while (c->n_waiting) {
        client_error_to(c, c->waiting[0].client, c->waiting[0].client_len, 0, PI2__ERROR_CODE__SHUTTING_DOWN,
                        "the stack is shutting down");
        remove_at(c, 0);
    }
}

/* Clients (`pi2 run`): a GenerateRequest while idle becomes the pending
 * generation; while one runs, the newcomer waits its turn (queue.c).
 * No send to a client blocks the loop: the client socket's send timeout is
 * 0, so a peer that does not read costs a dropped reply, not a stalled
 * stack. Refusals are limited per peer (peer_limit.h); the generation's own
 * messages wait their turn in the pump, and a client that left or whose
 * queue stays full for COORD_CLIENT_STALL_MS loses its generation. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "util/clock.h"
#include "util/log.h"

void gen_request_clear(gen_request *r) {
    free(r->prompt);
    memset(r, 0, sizeof *r);
}

/* One non-blocking try (the client socket's send timeout is 0): BUS_OK,
 * BUS_TIMEOUT when the peer's queue is full, BUS_ENOPEER when it left. */
static int try_send(coord *c, const uint8_t *peer, size_t peer_len, Pi2__Envelope *env) {
    return coord_send(c, c->client_sock, peer, peer_len, env);
}

/* The same, and a reply not sent is dropped and counted. */
static int send_or_drop(coord *c, const uint8_t *peer, size_t peer_len, Pi2__Envelope *env) {
    int rc = try_send(c, peer, peer_len, env);
    if (rc != BUS_OK) c->replies_dropped++;
    return rc;
}

static const char *why_unsent(int rc) {
    return rc == BUS_TIMEOUT ? "its queue is full" : rc == BUS_ENOPEER ? "it has gone" : bus_status_str(rc);
}

/* Gives up on the running generation's client, once: the generation ends at its next step. */
static void client_cancel(coord *c, const char *why) {
    if (c->client_lost) return;
    c->client_lost = true;
    log_warn("session %llu: generation cancelled, client '%.*s': %s (%llu replies to clients dropped so far)",
             (unsigned long long)c->session, (int)c->req.client_len, (const char *)c->req.client, why,
             (unsigned long long)c->replies_dropped);
}

void client_check_stall(coord *c, int64_t now_ms) {
    if (c->client_full_ms && now_ms - c->client_full_ms >= COORD_CLIENT_STALL_MS)
        client_cancel(c, "it stopped reading (its queue stayed full)");
}

/* One try to the generation's client; a full queue starts its stall clock, a gone client is cancelled. */
static int try_send_gen(coord *c, Pi2__Envelope *env) {
    int rc = try_send(c, c->req.client, c->req.client_len, env);
    if (rc == BUS_OK) c->client_full_ms = 0;
    else if (rc == BUS_TIMEOUT && !c->client_full_ms) c->client_full_ms = clock_ms();
    else if (rc != BUS_TIMEOUT) client_cancel(c, why_unsent(rc));
    return rc;
}

/* To the generation's client, in order: while its queue is full the loop
 * keeps pumping (beats, other peers) and retries, until it reads or
 * client_check_stall gives up on it. Nothing was queued by a failed try
 * (ROUTER_MANDATORY fails on the identity frame), so a retry never doubles. */
static int send_gen(coord *c, Pi2__Envelope *env) {
    while (!c->client_lost) {
        int rc = try_send_gen(c, env);
        if (rc == BUS_OK) return 0;
        if (rc != BUS_TIMEOUT || *c->stop) break;
        coord_pump(c, 5);
    }
    c->replies_dropped++;
    return -1;
}

int client_error_to(coord *c, const uint8_t *peer, size_t peer_len, uint64_t session, Pi2__ErrorCode code,
                    const char *text) {
    Pi2__Error e;
    Pi2__Envelope env;
    msg_error_init(&env, &e, 0, session, code, text, 0);
    return send_or_drop(c, peer, peer_len, &env);
}

int client_send_error(coord *c, Pi2__ErrorCode code, const char *fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    Pi2__Error e;
    Pi2__Envelope env;
    msg_error_init(&env, &e, 0, c->session, code, text, 0);
    return send_gen(c, &env);
}

void client_refuse(coord *c, const struct bus_msg *bm, Pi2__ErrorCode code, const char *fmt, ...) {
    uint64_t held;
    if (!peer_limit_allow(&c->refusals, bm->peer, bm->peer_len, clock_ms(), &held)) return;
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    const int rc = client_error_to(c, bm->peer, bm->peer_len, c->session, code, text);
    char held_note[64] = "", drop_note[64] = "";
    if (held) snprintf(held_note, sizeof held_note, " (and %llu more held back)", (unsigned long long)held);
    if (rc) snprintf(drop_note, sizeof drop_note, "; Error dropped: %s", why_unsent(rc));
    log_warn("client '%.*s' refused: %s%s%s", (int)bm->peer_len, (const char *)bm->peer, text, held_note, drop_note);
}

int client_send_piece(coord *c, uint32_t index, int32_t token, const char *piece, size_t len) {
    Pi2__TokenPiece tp = PI2__TOKEN_PIECE__INIT;
    tp.index = index;
    tp.token = (uint32_t)token;
    tp.piece.data = (uint8_t *)piece;
    tp.piece.len = len;
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, c->session);
    env.body_case = PI2__ENVELOPE__BODY_TOKEN_PIECE;
    env.token_piece = &tp;
    return send_gen(c, &env);
}

void client_prompt_progress(coord *c) {
    prompt_state *p = &c->prompt;
    int64_t now = clock_ms();
    if (now - p->sent_ms < COORD_PROMPT_PROGRESS_MS) return;
    p->sent_ms = now;
    int n_layer = c->sv.m.n_layer, done = p->n_done;
    if (p->chunk_n && c->step.active && c->step.on_npu)
        done += (int)((int64_t)p->chunk_n * c->step.prefill_layers / (n_layer > 0 ? n_layer : 1));
    Pi2__PromptProgress pp = PI2__PROMPT_PROGRESS__INIT;
    pp.n_done = (uint32_t)(done < p->n_prompt ? done : p->n_prompt);
    pp.n_prompt = (uint32_t)p->n_prompt;
    pp.elapsed_ms = (double)(now - p->t0_ms);
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, c->session);
    env.body_case = PI2__ENVELOPE__BODY_PROMPT_PROGRESS;
    env.prompt_progress = &pp;
    if (try_send_gen(c, &env) != BUS_OK) c->replies_dropped++; /* a later progress says more */
}

int client_send_done(coord *c, uint32_t n_prompt, uint32_t n_generated, double prompt_ms, double decode_ms,
                     Pi2__GenerateStatus status, const offload_tally *offload) {
    Pi2__GenerateDone d = PI2__GENERATE_DONE__INIT;
    Pi2__OffloadStats os;
    if (offload) d.offload = msg_offload_stats(&os, offload);
    d.n_prompt = n_prompt;
    d.n_generated = n_generated;
    d.prompt_ms = prompt_ms;
    d.decode_ms = decode_ms;
    d.status = status;
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, c->session);
    env.body_case = PI2__ENVELOPE__BODY_GENERATE_DONE;
    env.generate_done = &d;
    return send_gen(c, &env);
}

int gen_request_fill(gen_request *r, const struct bus_msg *bm, const Pi2__GenerateRequest *g) {
    memset(r, 0, sizeof *r);
    if (!(r->prompt = malloc(g->prompt.len + 1))) return -1;
    if (g->prompt.len) memcpy(r->prompt, g->prompt.data, g->prompt.len);
    r->prompt[g->prompt.len] = 0; /* validated: no NUL inside */
    memcpy(r->client, bm->peer, bm->peer_len);
    r->client_len = bm->peer_len;
    r->n_predict = g->n_predict;
    r->ignore_eos = g->ignore_eos;
    r->ffn_mode = g->ffn_mode;
    r->max_wait_ms = g->max_wait_ms;
    if (g->sampling) {
        r->temp = g->sampling->temperature;
        r->top_k = g->sampling->top_k;
        r->top_p = g->sampling->top_p;
        r->seed = g->sampling->seed;
    } else {
        r->temp = 0, r->top_k = 0, r->top_p = 1; /* greedy */
    }
    return 0;
}

void clients_on_message(coord *c, const struct bus_msg *bm, Pi2__Envelope *env) {
    if (env->body_case != PI2__ENVELOPE__BODY_GENERATE_REQUEST) {
        client_refuse(c, bm, PI2__ERROR_CODE__UNSUPPORTED, "the coordinator takes GenerateRequest only, not %s",
                      msg_body_name(env->body_case));
        return;
    }
    if (c->busy || c->req.pending) {
        queue_offer(c, bm, env->generate_request);
        return;
    }
    if (gen_request_fill(&c->req, bm, env->generate_request)) {
        gen_request_clear(&c->req);
        client_refuse(c, bm, PI2__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    c->req.pending = true;
}

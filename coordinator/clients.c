/* Clients (`pi2 run`): a GenerateRequest while idle becomes the pending
 * generation; while one runs, the newcomer gets Error STACK_BUSY at once
 * (no queue: a waiting client could not tell a long queue from a hang). */
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

static int send_to_client(coord *c, const uint8_t *peer, size_t peer_len, Pi2__Envelope *env) {
    int rc = coord_send(c, c->client_sock, peer, peer_len, env);
    if (rc != BUS_OK) {
        log_warn("%s to client '%.*s': %s", msg_body_name(env->body_case), (int)peer_len, (const char *)peer,
                 bus_status_str(rc));
        return -1;
    }
    return 0;
}

int client_send_error(coord *c, const uint8_t *peer, size_t peer_len, Pi2__ErrorCode code, const char *fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    Pi2__Error e = PI2__ERROR__INIT;
    e.code = code;
    e.message = text;
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, c->session);
    env.body_case = PI2__ENVELOPE__BODY_ERROR;
    env.error = &e;
    return send_to_client(c, peer, peer_len, &env);
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
    return send_to_client(c, c->req.client, c->req.client_len, &env);
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
    send_to_client(c, c->req.client, c->req.client_len, &env); /* a client that left is seen at its first piece */
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
    return send_to_client(c, c->req.client, c->req.client_len, &env);
}

static void accept_request(coord *c, const struct bus_msg *bm, const Pi2__GenerateRequest *g) {
    gen_request *r = &c->req;
    memset(r, 0, sizeof *r);
    if (!(r->prompt = malloc(g->prompt.len + 1))) {
        client_send_error(c, bm->peer, bm->peer_len, PI2__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    if (g->prompt.len) memcpy(r->prompt, g->prompt.data, g->prompt.len);
    r->prompt[g->prompt.len] = 0; /* validated: no NUL inside */
    memcpy(r->client, bm->peer, bm->peer_len);
    r->client_len = bm->peer_len;
    r->n_predict = g->n_predict;
    r->ignore_eos = g->ignore_eos;
    r->ffn_mode = g->ffn_mode;
    if (g->sampling) {
        r->temp = g->sampling->temperature;
        r->top_k = g->sampling->top_k;
        r->top_p = g->sampling->top_p;
        r->seed = g->sampling->seed;
    } else {
        r->temp = 0, r->top_k = 0, r->top_p = 1; /* greedy */
    }
    r->pending = true;
}

void clients_on_message(coord *c, const struct bus_msg *bm, Pi2__Envelope *env) {
    if (env->body_case != PI2__ENVELOPE__BODY_GENERATE_REQUEST) {
        client_send_error(c, bm->peer, bm->peer_len, PI2__ERROR_CODE__UNSUPPORTED, "the coordinator takes GenerateRequest only, not %s",
                          msg_body_name(env->body_case));
        return;
    }
    if (c->busy || c->req.pending) {
        log_info("client '%.*s' refused: a generation is running", (int)bm->peer_len, (const char *)bm->peer);
        client_send_error(c, bm->peer, bm->peer_len, PI2__ERROR_CODE__STACK_BUSY,
                          "the stack is serving another generation; try again when it is done");
        return;
    }
    accept_request(c, bm, env->generate_request);
}

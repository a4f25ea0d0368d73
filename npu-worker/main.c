/* npu-worker: dense prefill for the coordinator (docs/stack.md, "Prefill"):
 * a PrefillRequest names prompt tokens in act.tokens; the worker runs them
 * through every layer as blocked matrix products, fills the KV cache for
 * their positions and leaves the last token's logits in act.logits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/prompt.h"
#include "stack/exit_codes.h"
#include "util/clock.h"
#include "util/log.h"
#include "lend.h"
#include "prefill.h"
#include "stack/stack_attach.h"
#include "stack/worker_args.h"
#include "stack/worker_link.h"

static void usage(FILE *f) {
    fputs("usage: npu-worker -m MODEL.gguf [-r RUNID] [-t THREADS]\n"
          "Prefill worker of the pi2 stack RUNID: runs whole prompts layer by layer as blocked\n"
          "matrix products and fills the KV cache.\n",
          f);
    worker_args_help(f, 2, "layer of a prefill");
}

typedef struct {
    const worker_args *o;
    stack_view *sv;
    worker_link *link;
    prefiller *pf;
    lender *lend;    /* NULL: the plan lends nothing */
    int32_t *tokens; /* private copy of the request's ids, [max_prefill] */
} worker;

static void send_error(worker *w, const Pi2__Envelope *req, Pi2__ErrorCode code, const char *why) {
    log_warn("PrefillRequest %llu refused: %s", (unsigned long long)req->seq, why);
    Pi2__Error e;
    Pi2__Envelope env;
    msg_error_init(&env, &e, 0, req->session, code, why, req->seq);
    worker_link_send(w->link, &env);
}

/* Copies the ids out of act.tokens (the coordinator may reuse the region) and checks each. */
static int read_tokens(worker *w, const Pi2__PrefillRequest *r, char *why, size_t len) {
    const stack_view *sv = w->sv;
    int max = sv->ctl->params.max_prefill;
    if (r->n_tokens > (uint32_t)max) {
        snprintf(why, len, "n_tokens %u > max_prefill %d", r->n_tokens, max);
        return -1;
    }
    memcpy(w->tokens, sv->act + r->act_offset, (size_t)r->n_tokens * sizeof(int32_t)); /* span validated */
    for (uint32_t i = 0; i < r->n_tokens; i++)
        if (w->tokens[i] < 0 || w->tokens[i] >= sv->m.n_vocab) {
            snprintf(why, len, "token %u = %d is not in [0, n_vocab %d)", i, w->tokens[i], sv->m.n_vocab);
            return -1;
        }
    return 0;
}

/* The request being prefilled, for its PrefillProgress messages. */
typedef struct {
    worker_link *link;
    uint64_t request_seq, session;
    long delay_us;          /* PI2_TASK_DELAY_US: fault tests make each layer this much slower */
} progress_ctx;

/* After each layer: a heartbeat if one is due, and how far the prefill is
 * (the coordinator's evidence that a long prefill is moving). */
static void tick(void *ctx, int layers_done) {
    progress_ctx *pc = ctx;
    if (pc->delay_us) usleep((useconds_t)pc->delay_us);
    worker_link_heartbeat(pc->link);
    Pi2__PrefillProgress p = PI2__PREFILL_PROGRESS__INIT;
    p.request_seq = pc->request_seq;
    p.layers_done = (uint32_t)layers_done;
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, pc->session);
    env.body_case = PI2__ENVELOPE__BODY_PREFILL_PROGRESS;
    env.prefill_progress = &p;
    worker_link_send(pc->link, &env);
}

static void beat(void *ctx) { worker_link_heartbeat(ctx); }

/* The prompt is in: its buffers give their pages back, and under a plan that lends them, decode gets them as
 * bundles (while decode already runs: until they are in, it reads them as misses). */
static void lend_after_prompt(worker *w) {
    if (!w->lend) return;
    prefiller_release(w->pf);
    lender_fill(w->lend, beat, w->link);
}

static void run_prefill(void *ctx, const Pi2__Envelope *req) {
    worker *w = ctx;
    const Pi2__PrefillRequest *r = req->prefill_request;
    const model *m = &w->sv->m;
    uint32_t current = (uint32_t)atomic_load(&w->sv->ctl->epoch);
    if (r->epoch != current) {
        log_info("dropped a prefill of epoch %u (now %u)", r->epoch, current);
        return;
    }
    char why[160];
    if (r->layer_begin != 0 || r->layer_end != (uint32_t)m->n_layer) {
        snprintf(why, sizeof why, "layers [%u, %u): this worker prefills all %d layers at once", r->layer_begin,
                 r->layer_end, m->n_layer);
        send_error(w, req, PI2__ERROR_CODE__UNSUPPORTED, why);
        return;
    }
    if (!prompt_pass_takes(m)) {
        send_error(w, req, PI2__ERROR_CODE__UNSUPPORTED,
                   "the model's down weights are of a type the prompt pass does not take: prefill it with decode tasks");
        return;
    }
    if (read_tokens(w, r, why, sizeof why)) {
        send_error(w, req, PI2__ERROR_CODE__INVALID, why);
        return;
    }
    if (w->lend && lender_reclaim(w->lend)) {
        send_error(w, req, PI2__ERROR_CODE__INTERNAL, "cannot take back the memory lent to decode");
        return;
    }
    worker_link_set_state(w->link, PROC_BUSY);
    uint64_t t0 = clock_us();
    progress_ctx pc = {w->link, req->seq, req->session, w->o->task_delay_us};
    int rc = prefiller_run(w->pf, w->tokens, (int)r->n_tokens, (int)r->first_position, r->epoch, tick, &pc);
    uint64_t took = clock_us() - t0;
    worker_link_set_state(w->link, PROC_READY);
    if (rc == PREFILL_ERROR) {
        send_error(w, req, PI2__ERROR_CODE__STORAGE, prefiller_error(w->pf));
        return;
    }
    if (rc) {
        log_info("prefill of %u tokens abandoned: epoch %u ended", r->n_tokens, r->epoch);
        return;
    }
    log_info("prefilled %u tokens at positions %u.. in %.1f ms (%.1f tok/s)", r->n_tokens, r->first_position,
             took / 1e3, r->n_tokens / (took / 1e6 + 1e-9));
    atomic_fetch_add(&w->link->row->tokens_served, r->n_tokens);
    Pi2__PrefillDone done = PI2__PREFILL_DONE__INIT;
    done.request_seq = req->seq;
    done.layer_end = r->layer_end;
    done.time_us = took;
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, req->session);
    env.body_case = PI2__ENVELOPE__BODY_PREFILL_DONE;
    env.prefill_done = &done;
    worker_link_send(w->link, &env);
    if (r->prompt_end) lend_after_prompt(w);
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    worker_args o;
    if (worker_args_parse(argc, argv, &o, 2, -1, usage)) return PI2_EXIT_USAGE;
    proc_stop_on_signals();
    stack_view sv;
    stack_view_spec spec = {.model_path = o.model_path, .runid = o.runid, .wait_ms = STACK_WAIT_MS, .stop = &proc_stop,
                            .neuron_positions = true}; /* the prompt finds pinned neurons (pinned_rows.h) */
    if (stack_view_open(&sv, &spec)) return proc_stop ? 0 : 1;
    int status = 1;
    worker_link link = {0};
    prefiller *pf = NULL;
    lender *lend = NULL;
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)sv.ctl->params.max_prefill);
    if (!tokens) { log_error("out of memory"); goto out; }
    if (!(pf = prefiller_new(&sv, o.runid, o.n_threads))) goto out;
    bool lend_failed;
    lend = lender_open(&sv, o.runid, &lend_failed);
    if (lend_failed) goto out;
    if (worker_link_open(&link, sv.ctl, o.runid, "npu-worker", PI2__PROCESS_KIND__NPU, 0, (uint32_t)o.n_threads))
        goto out;
    worker_link_set_state(&link, PROC_READY);
    log_info("npu-worker ready: %d thread%s, up to %d tokens per prefill", o.n_threads, o.n_threads == 1 ? "" : "s",
             sv.ctl->params.max_prefill);
    worker w = {&o, &sv, &link, pf, lend, tokens};
    msg_limits lim;
    stack_msg_limits(&sv, &lim);
    worker_link_serve(&link, &lim, PI2__ENVELOPE__BODY_PREFILL_REQUEST, run_prefill, &w);
    log_info("stopping");
    status = 0;
out:
    worker_link_close(&link);
    lender_close(lend);
    prefiller_free(pf);
    free(tokens);
    stack_view_close(&sv);
    return status;
}

/* One generation, the same loop as pi2-ref's (tools/pi2-ref.c) so that the
 * stack's output is byte-identical to it: tokenize (BOS as the tokenizer
 * says), prefill, then sample / stream / decode until n_predict, EOS or a
 * full context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "coord.h"
#include "util/log.h"
#include "engine/prompt.h"
#include "engine/sampler.h"

/* The prompt's positions, always with a dense FFN (as pi2-ref's prompt): on
 * the npu-worker in chunks of max_prefill when it is up, else (or once it is
 * lost for good, or for a model whose down weights the prompt pass does not
 * take) token by token with DecodeTasks. */
static int prefill_steps(coord *c, const int32_t *tokens, int n) {
    bool use_npu = !c->opt.no_npu && npu_ready(c) && prompt_pass_takes(&c->sv.m);
    for (int pos = 0; pos < n; c->prompt.n_done = pos) {
        if (use_npu) {
            int chunk = n - pos < c->params.max_prefill ? n - pos : c->params.max_prefill;
            c->prompt.chunk_n = chunk;
            int rc = step_prefill_npu(c, tokens + pos, chunk, pos, pos + chunk == n);
            c->prompt.chunk_n = 0;
            if (rc == -1) {
                log_warn("the npu-worker did not come back: prefilling the rest with decode tasks");
                use_npu = false;
                continue;
            }
            if (rc) return rc;
            pos += chunk;
        } else {
            int rc = step_decode(c, tokens[pos], pos, pos == n - 1, FFN_DENSE);
            if (rc) return rc;
            pos++;
        }
    }
    return 0;
}

/* The prompt, with PromptProgress to the client while it runs (the pump sends it). */
static int prefill(coord *c, const int32_t *tokens, int n) {
    int64_t now = clock_ms();
    c->prompt = (prompt_state){.active = true, .n_prompt = n, .t0_ms = now, .sent_ms = now};
    int rc = prefill_steps(c, tokens, n);
    c->prompt.active = false;
    return rc;
}

typedef struct {
    int n_gen;
    Pi2__GenerateStatus status;
    bool client_gone;
} decode_result;

static int decode(coord *c, int n_prompt, ffn_mode mode, decode_result *out) {
    const gen_request *r = &c->req;
    int n_vocab = c->sv.m.n_vocab, n_ctx = c->params.n_ctx, eos = tokenizer_eos(c->tok), rc = 0;
    float *logits = malloc(sizeof(float) * (size_t)n_vocab);
    if (!logits) return PI2__ERROR_CODE__INTERNAL;
    sampler smp;
    sampler_init(&smp, r->temp, r->top_k, r->top_p, r->seed);
    out->status = PI2__GENERATE_STATUS__GEN_LENGTH;
    for (int pos = n_prompt; out->n_gen < (int)r->n_predict;) {
        /* the sampler reorders its input: work on a copy of the shared logits */
        memcpy(logits, c->sv.act + c->sv.layout.logits, sizeof(float) * (size_t)n_vocab);
        int next = sampler_sample(&smp, logits, n_vocab);
        if (next == eos && !r->ignore_eos) {
            out->status = PI2__GENERATE_STATUS__GEN_EOS;
            break;
        }
        char piece[MSG_MAX_PIECE];
        size_t len = tokenizer_piece(c->tok, next, piece, sizeof piece);
        if (client_send_piece(c, (uint32_t)out->n_gen, next, piece, len)) {
            out->client_gone = true;
            break;
        }
        out->n_gen++;
        atomic_fetch_add(&c->sv.row->tokens_served, 1);
        if (out->n_gen == (int)r->n_predict) break;
        if (pos >= n_ctx) {
            out->status = PI2__GENERATE_STATUS__GEN_CONTEXT_FULL;
            break;
        }
        if ((rc = step_decode(c, next, pos++, true, mode))) break;
    }
    sampler_free(&smp);
    free(logits);
    return rc;
}

/* Tokenizes the prompt into tokens[0..n_ctx); returns the count, or 0 after answering the client. */
static int tokenize(coord *c, int32_t *tokens) {
    int n_ctx = c->params.n_ctx;
    int n = tokenizer_encode(c->tok, c->req.prompt, tokenizer_adds_bos(c->tok), tokens, n_ctx);
    if (n < 0) {
        client_send_error(c, PI2__ERROR_CODE__PROMPT_TOO_LONG,
                          "the prompt needs more than the stack's context of %d tokens (pi2 up --ctx N)", n_ctx);
        return 0;
    }
    if (n == 0) {
        client_send_error(c, PI2__ERROR_CODE__INVALID,
                          "the prompt is empty and the model adds no BOS: nothing to continue from");
        return 0;
    }
    if ((int64_t)n + c->req.n_predict > (int64_t)n_ctx + 1)
        log_info("%d prompt + %u new tokens exceed the context of %d: generation stops when it is full", n,
                 c->req.n_predict, n_ctx);
    return n;
}

/* The request's FFN mode, or the stack's; 0 and a mode, or -1 after
 * answering the client: the workers hold neuron-major rows and a predictor
 * only for the mode the stack was started with (cachemgr --ffn). */
static int request_mode(coord *c, ffn_mode *mode) {
    const model *m = &c->sv.m;
    ffn_mode stack = (ffn_mode)c->params.ffn_mode;
    *mode = ffn_mode_from_wire(c->req.ffn_mode, stack);
    const char *why = ffn_mode_refusal(m, *mode, true); /* what the model cannot run; then what the stack lacks */
    if (!why && *mode == FFN_GATE_FIRST && stack == FFN_DENSE && !m->layers[0].down_t.data)
        why = "the stack was started dense: its workers hold no neuron-major down rows (pi2 up --ffn gate-first)";
    else if (!why && *mode == FFN_PREDICTOR && stack != FFN_PREDICTOR)
        why = "the stack was started without a predictor (pi2 up --ffn predictor [--predictor FILE])";
    if (!why) return 0;
    client_send_error(c, PI2__ERROR_CODE__INVALID, "ffn mode %s: %s", ffn_mode_name(*mode), why);
    return -1;
}

/* Why the generation stopped with ErrorCode code, for the client and the log. */
static void error_text(const coord *c, int code, char *buf, size_t len) {
    switch (code) {
    case PI2__ERROR_CODE__SHUTTING_DOWN: snprintf(buf, len, "the stack is shutting down"); return;
    case PI2__ERROR_CODE__STORAGE: snprintf(buf, len, "%s", c->step.error); return;
    case PI2__ERROR_CODE__WORKER_LOST: break;
    default: snprintf(buf, len, "a step of the generation kept failing (see the coordinator's log)"); return;
    }
    size_t used = (size_t)snprintf(buf, len, "lost");
    for (int i = 0; i < c->params.n_cpu_workers && used < len; i++)
        if (!c->cpu[i].registered || !c->cpu[i].alive) used += (size_t)snprintf(buf + used, len - used, " %s", c->cpu[i].name);
    if (used < len) snprintf(buf + used, len - used, ", not back within %d ms", c->opt.worker_wait_ms);
}

/* Each cpu-worker's neuron-cache counts now (zeros for a worker without a row yet). */
static void offload_snapshot(const coord *c, offload_tally *each) {
    for (int i = 0; i < c->params.n_cpu_workers; i++) {
        const proc_row *r = ctl_proc_find(c->sv.ctl, c->cpu[i].name);
        each[i] = r ? offload_counters_read(&r->offload) : (offload_tally){0};
    }
}

/* The generation's counts: each worker's since start, merged. Every worker
 * answered its last task after adding its counts, so they are all in. */
static offload_tally offload_since(const coord *c, const offload_tally *start) {
    offload_tally now[STACK_MAX_CPU_WORKERS], sum = {0};
    offload_snapshot(c, now);
    for (int i = 0; i < c->params.n_cpu_workers; i++) {
        const offload_tally d = offload_tally_delta(&now[i], &start[i]);
        offload_tally_merge(&sum, &d);
    }
    return sum;
}

/* Where the decode split stands (a user moving workers between cores sees how they compare). */
static void log_split(const coord *c) {
    char line[STACK_MAX_CPU_WORKERS * 32 + 32];
    if (c->balance.n > 1 && !work_balance_describe(c->sv.ctl, line, sizeof line)) log_info("%s", line);
}

void generate_serve(coord *c) {
    gen_request *r = &c->req;
    r->pending = false;
    c->busy = true;
    c->session++;
    ctl_proc_beat(c->sv.row, PROC_BUSY);
    ffn_mode mode;
    int bad_mode = request_mode(c, &mode);
    log_info("session %llu for '%.*s': %zu-byte prompt, n_predict %u, temp %g, top-k %d, top-p %g, seed %llu, "
             "ffn %s%s", (unsigned long long)c->session, (int)r->client_len, (const char *)r->client, strlen(r->prompt),
             r->n_predict, r->temp, r->top_k, r->top_p, (unsigned long long)r->seed, ffn_mode_name(mode),
             r->ignore_eos ? ", ignore eos" : "");
    int32_t *tokens = bad_mode ? NULL : malloc(sizeof(int32_t) * (size_t)c->params.n_ctx);
    int n_prompt = tokens ? tokenize(c, tokens) : 0;
    if (!tokens && !bad_mode) client_send_error(c, PI2__ERROR_CODE__INTERNAL, "out of memory");
    if (n_prompt > 0) {
        double t0 = clock_seconds() * 1e3;
        decode_result res = {0, PI2__GENERATE_STATUS__GS_UNSPECIFIED, false};
        offload_tally start[STACK_MAX_CPU_WORKERS];
        offload_snapshot(c, start);
        int rc = prefill(c, tokens, n_prompt);
        double t1 = clock_seconds() * 1e3;
        if (!rc) rc = decode(c, n_prompt, mode, &res);
        double t2 = clock_seconds() * 1e3;
        if (rc == COORD_CLIENT_LOST || res.client_gone) {
            log_info("session %llu: ended without its client after %d tokens", (unsigned long long)c->session,
                     res.n_gen);
        } else if (rc) {
            char why[sizeof c->step.error + 64];
            error_text(c, rc, why, sizeof why);
            log_error("session %llu: %s", (unsigned long long)c->session, why);
            client_send_error(c, rc, "%s", why);
        } else {
            const offload_tally gen = offload_since(c, start);
            client_send_done(c, (uint32_t)n_prompt, (uint32_t)res.n_gen, t1 - t0, t2 - t1, res.status,
                             c->sv.budgeted ? &gen : NULL);
            log_info("session %llu: prompt %d tokens in %.1f ms, %d tokens in %.1f ms (%.2f tok/s)",
                     (unsigned long long)c->session, n_prompt, t1 - t0, res.n_gen, t2 - t1,
                     res.n_gen / ((t2 - t1) > 0 ? (t2 - t1) / 1e3 : 1e-9));
            log_split(c);
        }
    }
    free(tokens);
    gen_request_clear(r);
    c->busy = false;
    c->client_lost = false; /* the next client starts afresh */
    c->client_full_ms = 0;
    ctl_proc_beat(c->sv.row, PROC_READY);
}

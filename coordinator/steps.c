/* One step of the schedule: a decoding token (n_layer [+1] DecodeTasks to
 * every cpu-worker at once) or a prefill chunk (one PrefillRequest to the
 * npu-worker). A step is idempotent (layer l reads x_layers[l] and writes
 * x_layers[l+1]; KV at a position is overwritten with the same values), so
 * after a fault it is simply re-sent from layer 0 in a new epoch, once the
 * lost workers are back. Answers of older steps and epochs carry other
 * sequence numbers and are ignored (workers.c). */
#include <string.h>

#include "util/clock.h"
#include "coord.h"
#include "kernels/kernels.h"
#include "util/log.h"

#define PUMP_MS 50

void coord_new_epoch(coord *c) {
    c->epoch = ctl_new_epoch(c->sv.ctl);
    c->faults_at_epoch = coord_faults(c);
    log_debug("epoch %u", c->epoch);
}

static uint64_t cpu_faults(const coord *c) {
    uint64_t n = 0;
    for (int i = 0; i < c->params.n_cpu_workers; i++) n += c->cpu[i].faults;
    return n;
}

static uint64_t step_faults(const coord *c) { return c->step.on_npu ? c->npu.faults : cpu_faults(c); }

static bool step_complete(const coord *c) {
    const step_state *s = &c->step;
    if (s->on_npu) return s->prefill_done;
    for (int i = 0; i < c->params.n_cpu_workers; i++)
        if (s->n_done[i] < s->n_tasks) return false;
    return true;
}

/* Pumps until ready(c), the stop flag, a lost client, or timeout_ms. */
static int wait_until(coord *c, bool (*ready)(const coord *), int timeout_ms) {
    int64_t deadline = clock_ms() + timeout_ms;
    while (!ready(c)) {
        if (*c->stop || c->client_lost || clock_ms() > deadline) return -1;
        coord_pump(c, PUMP_MS);
    }
    return 0;
}

enum { AWAIT_DONE, AWAIT_RETRY, AWAIT_STOP, AWAIT_ERROR, AWAIT_CANCEL };

/* Waits for the step just sent; faults_before: step_faults() when it was sent. */
static int await_step(coord *c, uint64_t faults_before) {
    step_state *s = &c->step;
    for (;;) {
        if (step_complete(c)) return AWAIT_DONE;
        if (*c->stop) return AWAIT_STOP;
        if (c->client_lost) return AWAIT_CANCEL; /* nobody waits for this step any more */
        if (s->error[0]) return AWAIT_ERROR; /* re-sending cannot help */
        if (s->failed) return AWAIT_RETRY;
        if (step_faults(c) != faults_before) return AWAIT_RETRY;
        /* judged by progress, never by the length of the whole step: a
         * prefill's grows with the prompt and the model */
        int limit_ms = s->on_npu ? c->opt.prefill_stall_ms : c->opt.task_timeout_ms;
        if (clock_ms() - s->progress_ms > limit_ms) {
            log_warn("no layer finished for %d ms (%s): re-sending the step", limit_ms,
                     s->on_npu ? "--prefill-stall" : "--task-timeout");
            return AWAIT_RETRY;
        }
        coord_pump(c, PUMP_MS);
    }
}

static void step_begin(coord *c, bool on_npu, int n_tasks) {
    memset(&c->step, 0, sizeof c->step);
    c->step.active = true;
    c->step.on_npu = on_npu;
    c->step.n_tasks = n_tasks;
    c->step.progress_ms = clock_ms();
}

/* DecodeTask l of one token to cpu-worker i, whose share is ws; -1 if the send failed (the worker is marked lost).
 * A chunked FFN names the worker's chunks (c->chunk_ranges). */
static int send_decode_task(coord *c, int i, const work_share *ws, int l, int pos, ffn_mode mode) {
    const model *m = &c->sv.m;
    uint64_t emb = (uint64_t)m->n_embd * sizeof(float);
    worker *w = &c->cpu[i];
    bool chunked = ffn_mode_chunked(m, mode);
    Pi2__NeuronCluster cluster = PI2__NEURON_CLUSTER__INIT, *clusters[1] = {&cluster};
    cluster.n_ranges = (size_t)c->n_chunk_ranges[i], cluster.ranges = c->chunk_ranges[i];
    bool output = l == m->n_layer;
    Pi2__DecodeTask t = PI2__DECODE_TASK__INIT;
    t.layer = (uint32_t)l;
    t.position = (uint32_t)pos;
    t.in_offset = c->sv.layout.x_layers + (uint64_t)l * emb;
    t.in_length = emb;
    t.out_offset = output ? c->sv.layout.logits : c->sv.layout.x_layers + (uint64_t)(l + 1) * emb;
    t.out_length = output ? (uint64_t)m->n_vocab * sizeof(float) : emb;
    t.kv_begin = 0;
    t.kv_end = (uint32_t)pos + 1;
    t.head_begin = output ? 0 : (uint32_t)ws->qh_begin;
    t.head_end = output ? 0 : (uint32_t)ws->qh_end;
    t.share_begin = ws->cut_begin;
    t.share_end = ws->cut_end;
    t.epoch = c->epoch;
    /* one answer per step: each answer wakes this process and the bus threads on the workers' cores */
    t.quiet = l + 1 < c->step.n_tasks;
    if (!output) {
        t.ffn_mode = ffn_mode_to_wire(mode);
        cluster.layer = (uint32_t)l;
        if (chunked && cluster.n_ranges) t.n_clusters = 1, t.clusters = clusters;
    }
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, c->session);
    env.body_case = PI2__ENVELOPE__BODY_DECODE_TASK;
    env.decode_task = &t;
    int rc = coord_send(c, c->workers_sock, w->name, strlen(w->name), &env);
    if (rc != BUS_OK) {
        worker_lost(w, bus_status_str(rc));
        if (rc == BUS_ENOPEER) w->registered = false; /* not connected: only a new Register brings it back */
        return -1;
    }
    if (l == 0) c->step.first_seq[i] = env.seq;
    return 0;
}

/* Before (re-)sending: lost workers back, and a fresh epoch if anything failed since the last one. */
static int prepare_send(coord *c, bool on_npu) {
    bool ready = on_npu ? npu_ready(c) : cpu_workers_ready(c);
    if (!ready) {
        log_info("waiting for the %s to (re-)register", on_npu ? "npu-worker" : "cpu-workers");
        if (wait_until(c, on_npu ? npu_ready : cpu_workers_ready, on_npu ? c->opt.npu_wait_ms : c->opt.worker_wait_ms))
            return *c->stop ? PI2__ERROR_CODE__SHUTTING_DOWN : c->client_lost ? COORD_CLIENT_LOST : -1;
        log_info("%s back: re-sending the step", on_npu ? "npu-worker" : "cpu-workers");
    }
    if (coord_faults(c) != c->faults_at_epoch) coord_new_epoch(c);
    return 0;
}

/* Runs the step set up by send() until it completes; see step_decode for the return value. */
static int run_step(coord *c, bool on_npu, int n_tasks, int (*send)(coord *, const void *), const void *arg) {
    for (int attempt = 0;; attempt++) {
        if (attempt > COORD_MAX_RETRIES) {
            log_error("giving up after %d attempts of one step", attempt);
            coord_new_epoch(c);
            return PI2__ERROR_CODE__INTERNAL;
        }
        if (c->client_lost) return COORD_CLIENT_LOST;
        int rc = prepare_send(c, on_npu);
        if (rc) return rc == -1 && !on_npu ? PI2__ERROR_CODE__WORKER_LOST : rc;
        step_begin(c, on_npu, n_tasks);
        uint64_t faults = step_faults(c);
        int st = send(c, arg) ? AWAIT_RETRY : await_step(c, faults);
        c->step.active = false;
        if (st == AWAIT_DONE) return 0;
        coord_new_epoch(c); /* surviving workers leave their barriers and drop the rest of the step */
        if (st == AWAIT_STOP) return PI2__ERROR_CODE__SHUTTING_DOWN;
        if (st == AWAIT_ERROR) return PI2__ERROR_CODE__STORAGE;
        if (st == AWAIT_CANCEL) return COORD_CLIENT_LOST;
        log_warn("%s step aborted (epoch now %u): it will be re-sent from layer 0", on_npu ? "prefill" : "decode",
                 c->epoch);
    }
}

typedef struct {
    int pos;
    ffn_mode mode;
} decode_arg;

/* Each cpu-worker's busy time so far (its ctl row; 0 for a row not found). */
static void workers_busy_ns(const coord *c, uint64_t *busy) {
    for (int i = 0; i < c->params.n_cpu_workers; i++) {
        const proc_row *row = ctl_proc_find(c->sv.ctl, c->cpu[i].name);
        busy[i] = row ? atomic_load(&row->busy_ns) : 0;
    }
}

/* The split moved by how long each worker computed for the token just decoded (before: the times when it began). */
static void balance_token(coord *c, const uint64_t *before) {
    uint64_t busy[STACK_MAX_CPU_WORKERS];
    workers_busy_ns(c, busy);
    for (int i = 0; i < c->params.n_cpu_workers; i++) busy[i] = busy[i] > before[i] ? busy[i] - before[i] : 0;
    work_balance_update(&c->balance, busy);
    work_balance_publish(&c->balance, c->sv.ctl);
}

/* Layer by layer, every worker's task before the next layer's: the workers
 * meet at a barrier within each layer, so the last to get its layer 0 sets
 * the pace. Worker by worker, the second got its first task after the
 * first's 33 (7B): ~250 us per token of waiting at layer 0's barrier. Nothing
 * else is sent in between, so a worker's tasks are n_cpu_workers sequence
 * numbers apart (on_task_done). */
static int send_decode(coord *c, const void *arg) {
    const decode_arg *a = arg;
    const int n = c->params.n_cpu_workers;
    work_share ws[STACK_MAX_CPU_WORKERS];
    for (int i = 0; i < n; i++) work_share_from_cut(&ws[i], &c->sv.m, c->balance.cut[i], c->balance.cut[i + 1]);
    coord_chunk_ranges_update(c);
    for (int l = 0; l < c->step.n_tasks; l++)
        for (int i = 0; i < n; i++)
            if (send_decode_task(c, i, &ws[i], l, a->pos, a->mode)) return -1;
    return 0;
}

int step_decode(coord *c, int32_t token, int pos, bool want_logits, ffn_mode mode) {
    const model *m = &c->sv.m;
    float *x0 = (float *)(c->sv.act + c->sv.layout.x_layers);
    dequantize_row(m->tok_embd.type, (const char *)m->tok_embd.data + (size_t)token * m->tok_embd.row_bytes, x0,
                   m->n_embd);
    decode_arg a = {pos, mode};
    uint64_t busy[STACK_MAX_CPU_WORKERS];
    workers_busy_ns(c, busy);
    int rc = run_step(c, false, m->n_layer + (want_logits ? 1 : 0), send_decode, &a);
    if (!rc) balance_token(c, busy);
    return rc;
}

typedef struct {
    int n, pos0;
    bool prompt_end;
} prefill_arg;

static int send_prefill(coord *c, const void *arg) {
    const prefill_arg *a = arg;
    Pi2__PrefillRequest r = PI2__PREFILL_REQUEST__INIT;
    r.first_position = (uint32_t)a->pos0;
    r.n_tokens = (uint32_t)a->n;
    r.act_offset = c->sv.layout.tokens;
    r.act_length = (uint64_t)a->n * sizeof(int32_t);
    r.layer_begin = 0;
    r.layer_end = (uint32_t)c->sv.m.n_layer;
    r.epoch = c->epoch;
    r.prompt_end = a->prompt_end;
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, c->session);
    env.body_case = PI2__ENVELOPE__BODY_PREFILL_REQUEST;
    env.prefill_request = &r;
    int rc = coord_send(c, c->workers_sock, c->npu.name, strlen(c->npu.name), &env);
    if (rc != BUS_OK) {
        worker_lost(&c->npu, bus_status_str(rc));
        if (rc == BUS_ENOPEER) c->npu.registered = false;
        return -1;
    }
    c->step.prefill_seq = env.seq;
    return 0;
}

int step_prefill_npu(coord *c, const int32_t *tokens, int n, int pos0, bool prompt_end) {
    memcpy(c->sv.act + c->sv.layout.tokens, tokens, (size_t)n * sizeof(int32_t));
    prefill_arg a = {n, pos0, prompt_end};
    return run_step(c, true, 1, send_prefill, &a);
}

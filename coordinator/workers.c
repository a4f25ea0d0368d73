/* The workers the stack expects (cpu-worker.0 .. n-1 and the optional
 * npu-worker): registration, liveness, fault counting, and routing of their
 * completions to the running step.
 *
 * A worker is alive while it shows a sign of life within COORD_DEAD_MS: a
 * valid message on the bus (bus_peers) or a beat of its ctl row by the pid
 * that registered (workers beat the row from a thread of their own, so a long
 * computation does not look like death). A fault (worker->faults++) is a
 * Register over an existing registration (the process restarted), a ctl row
 * taken over by another pid, a lapse of liveness, or a failed send; the step
 * that worker takes part in is then re-sent in a new epoch. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "util/clock.h"
#include "coord.h"
#include "util/log.h"

#define NPU_NAME "npu-worker"

void workers_init(coord *c) {
    bus_peers_init(&c->peers, COORD_DEAD_MS);
    for (int i = 0; i < c->params.n_cpu_workers; i++) {
        worker *w = &c->cpu[i];
        memset(w, 0, sizeof *w);
        snprintf(w->name, sizeof w->name, "cpu-worker.%d", i);
        w->worker_id = (uint32_t)i + 1; /* what the worker assumes until our RegisterAck */
    }
    memset(&c->npu, 0, sizeof c->npu);
    snprintf(c->npu.name, sizeof c->npu.name, NPU_NAME);
    c->npu.worker_id = STACK_MAX_CPU_WORKERS + 1;
}

static worker *worker_by_identity(coord *c, const uint8_t *id, size_t len) {
    for (int i = 0; i < c->params.n_cpu_workers; i++)
        if (strlen(c->cpu[i].name) == len && !memcmp(c->cpu[i].name, id, len)) return &c->cpu[i];
    if (strlen(NPU_NAME) == len && !memcmp(NPU_NAME, id, len)) return &c->npu;
    return NULL;
}

uint64_t coord_faults(const coord *c) {
    uint64_t n = c->npu.faults;
    for (int i = 0; i < c->params.n_cpu_workers; i++) n += c->cpu[i].faults;
    return n;
}

bool cpu_workers_ready(const coord *c) {
    for (int i = 0; i < c->params.n_cpu_workers; i++)
        if (!c->cpu[i].registered || !c->cpu[i].alive) return false;
    return true;
}

bool npu_ready(const coord *c) { return c->npu.registered && c->npu.alive; }

void worker_lost(worker *w, const char *why) {
    if (w->alive || w->registered) log_warn("%s (pid %u) lost: %s", w->name, w->pid, why);
    w->alive = false;
    w->faults++;
}

/* Same machine (we share memory): a pid that vanished or is a zombie is a
 * death we need not wait COORD_DEAD_MS for. */
static bool process_gone(uint32_t pid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *paren = strrchr(buf, ')'); /* "pid (comm) S ...": comm may contain anything */
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

void workers_check_alive(coord *c, int64_t now_ms) {
    if (now_ms - c->alive_checked_ms < COORD_ALIVE_CHECK_MS) return;
    c->alive_checked_ms = now_ms;
    int n = c->params.n_cpu_workers;
    for (int i = 0; i <= n; i++) {
        worker *w = i < n ? &c->cpu[i] : &c->npu;
        if (!w->registered) continue;
        const proc_row *r = ctl_proc_find(c->sv.ctl, w->name);
        int32_t row_pid = r ? atomic_load(&r->pid) : 0;
        if (row_pid && (uint32_t)row_pid != w->pid) {
            /* A new process took the name: the one that registered is gone. */
            worker_lost(w, "its ctl row was taken by a new process");
            w->registered = false;
            continue;
        }
        if (w->alive && process_gone(w->pid)) {
            worker_lost(w, "its process is gone");
            w->registered = false; /* only a new Register brings the name back */
            continue;
        }
        int p = bus_peers_find(&c->peers, w->name, strlen(w->name));
        bool alive = (p >= 0 && bus_peers_alive(&c->peers, p, now_ms)) ||
                     (r && now_ms - atomic_load(&r->heartbeat_ms) < COORD_DEAD_MS &&
                      atomic_load(&r->state) != PROC_DEAD);
        if (w->alive && !alive) worker_lost(w, "no sign of life for 1 s");
        else if (!w->alive && alive) log_info("%s (pid %u) is alive again", w->name, w->pid);
        w->alive = alive;
    }
}

static void send_register_ack(coord *c, const worker *w) {
    shm_segment *segs[4] = {c->sv.ctl_seg, c->sv.weights_seg, c->sv.kv_seg, c->sv.act_seg};
    Pi2__Segment seg[4], *segp[4];
    for (int i = 0; i < 4; i++) {
        pi2__segment__init(&seg[i]);
        seg[i].name = (char *)shm_name(segs[i]);
        seg[i].generation = shm_generation(segs[i]);
        seg[i].size = shm_size(segs[i]);
        segp[i] = &seg[i];
    }
    Pi2__RegisterAck ack = PI2__REGISTER_ACK__INIT;
    ack.worker_id = w->worker_id;
    ack.n_segments = 4;
    ack.segments = segp;
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, 0);
    env.body_case = PI2__ENVELOPE__BODY_REGISTER_ACK;
    env.register_ack = &ack;
    int rc = coord_send(c, c->workers_sock, w->name, strlen(w->name), &env);
    if (rc != BUS_OK) log_warn("RegisterAck to %s: %s", w->name, bus_status_str(rc));
}

/* A worker that beats but never registered with us (we are a restarted
 * coordinator): Error NOT_REGISTERED makes it send Register again; at most once a second. */
static void ask_to_register(coord *c, worker *w) {
    const int64_t now = clock_ms();
    if (now - w->asked_ms < 1000) return;
    w->asked_ms = now;
    Pi2__Error e;
    Pi2__Envelope env;
    msg_error_init(&env, &e, 0, 0, PI2__ERROR_CODE__NOT_REGISTERED, "this coordinator does not know you: register again",
                   0);
    log_info("%s beats but is not registered with us: asking it to register", w->name);
    const int rc = coord_send(c, c->workers_sock, w->name, strlen(w->name), &env);
    if (rc != BUS_OK) log_warn("NotRegistered to %s: %s", w->name, bus_status_str(rc));
}

static void on_register(coord *c, worker *w, const Pi2__Register *r) {
    bool is_npu = w == &c->npu;
    uint32_t index = is_npu ? 0 : (uint32_t)(w - c->cpu);
    Pi2__ProcessKind want = is_npu ? PI2__PROCESS_KIND__NPU : PI2__PROCESS_KIND__CPU;
    if (r->kind != want || r->worker_index != index) {
        log_warn("%s registered as kind %d index %u: refused", w->name, r->kind, r->worker_index);
        return;
    }
    if (w->registered) {
        log_warn("%s registered again (pid %u, was %u): it restarted", w->name, r->pid, w->pid);
        w->faults++;
    }
    w->registered = true;
    w->alive = true;
    w->pid = r->pid;
    log_info("%s registered: pid %u, %u threads, cpus %s", w->name, r->pid, r->threads,
             r->cpu_list && *r->cpu_list ? r->cpu_list : "any");
    send_register_ack(c, w);
}

/* A completion of the running step from cpu-worker w. Tasks of an earlier
 * step or epoch have other sequence numbers and are ignored. All but a
 * step's last task are quiet: a worker runs its tasks in order, so an OK
 * for layer l means layers up to l are done. */
static void on_task_done(coord *c, worker *w, const Pi2__TaskDone *d) {
    step_state *s = &c->step;
    int i = (int)(w - c->cpu);
    const uint64_t stride = (uint64_t)c->params.n_cpu_workers; /* send_decode goes layer by layer */
    if (!s->active || s->on_npu || d->task_seq < s->first_seq[i] ||
        d->task_seq >= s->first_seq[i] + (uint64_t)s->n_tasks * stride || (d->task_seq - s->first_seq[i]) % stride)
        return; /* an old step's or epoch's answer */
    if ((d->task_seq - s->first_seq[i]) / stride != d->layer || (int)d->layer < s->n_done[i]) {
        log_warn("%s: TaskDone for layer %u (seq %llu) out of order, %d layers done", w->name, d->layer,
                 (unsigned long long)d->task_seq, s->n_done[i]);
        return;
    }
    if (d->status == PI2__TASK_STATUS__TASK_ERROR) {
        log_error("%s cannot run layer %u: %s", w->name, d->layer, d->error);
        snprintf(s->error, sizeof s->error, "%s", d->error && *d->error ? d->error : "a worker failed");
        return;
    }
    if (d->status != PI2__TASK_STATUS__TASK_OK) {
        log_warn("%s failed layer %u", w->name, d->layer);
        s->failed = true;
        return;
    }
    s->n_done[i] = (int)d->layer + 1;
    s->progress_ms = clock_ms();
}

static void on_prefill_done(coord *c, const Pi2__PrefillDone *d) {
    step_state *s = &c->step;
    if (!s->active || !s->on_npu || d->request_seq != s->prefill_seq) return;
    if (d->layer_end != c->lim.n_layer) {
        log_warn("npu-worker finished prefill layers up to %u of %u", d->layer_end, c->lim.n_layer);
        s->failed = true;
        return;
    }
    s->prefill_done = true;
    s->progress_ms = clock_ms();
}

static void on_prefill_progress(coord *c, const Pi2__PrefillProgress *p) {
    step_state *s = &c->step;
    if (!s->active || !s->on_npu || p->request_seq != s->prefill_seq || p->layers_done <= s->prefill_layers) return;
    s->prefill_layers = p->layers_done;
    s->progress_ms = clock_ms();
}

void workers_on_message(coord *c, const struct bus_msg *bm, Pi2__Envelope *env) {
    worker *w = worker_by_identity(c, bm->peer, bm->peer_len);
    if (!w) {
        peer_limit_warn(&c->drop_notes, bm->peer, bm->peer_len, "dropped %s from unknown peer '%.*s'",
                        msg_body_name(env->body_case), (int)bm->peer_len, (const char *)bm->peer);
        return;
    }
    bus_peers_seen(&c->peers, bm->peer, bm->peer_len, clock_ms());
    bool is_npu = w == &c->npu;
    switch (env->body_case) {
    case PI2__ENVELOPE__BODY_REGISTER: on_register(c, w, env->register_); return;
    case PI2__ENVELOPE__BODY_HEARTBEAT:
        if (!w->registered) { ask_to_register(c, w); return; } /* we restarted, or its Register was lost */
        if (env->heartbeat->worker_id != w->worker_id)
            log_debug("%s heartbeat with worker_id %u (ours %u)", w->name, env->heartbeat->worker_id, w->worker_id);
        return;
    case PI2__ENVELOPE__BODY_TASK_DONE:
        if (!is_npu) { on_task_done(c, w, env->task_done); return; }
        break;
    case PI2__ENVELOPE__BODY_PREFILL_DONE:
        if (is_npu) { on_prefill_done(c, env->prefill_done); return; }
        break;
    case PI2__ENVELOPE__BODY_PREFILL_PROGRESS:
        if (is_npu) { on_prefill_progress(c, env->prefill_progress); return; }
        break;
    case PI2__ENVELOPE__BODY_ERROR:
        log_warn("%s reports error %d: %s", w->name, env->error->code, env->error->message);
        if (is_npu && c->step.active && c->step.on_npu && env->error->ref_seq == c->step.prefill_seq)
            snprintf(c->step.error, sizeof c->step.error, "prefill: %s", env->error->message);
        return;
    case PI2__ENVELOPE__BODY_STATS: return;
    default: break;
    }
    log_warn("dropped unexpected %s from %s", msg_body_name(env->body_case), w->name);
}

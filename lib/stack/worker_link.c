#include "stack/worker_link.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"
#include "stack/rundir.h"

#define RUNDIR_WAIT_MS 10000

static void *beat_main(void *arg) {
    worker_link *w = arg;
    const struct timespec period = {0, WORKER_BEAT_MS * 1000000L};
    while (!atomic_load(&w->beat_stop)) {
        enum proc_state st = (enum proc_state)atomic_load(&w->state);
        /* ready only once the coordinator knows it: `pi2 up` waits for ready
         * rows, and a prompt sent before the npu-worker registered ran token
         * by token */
        if (!atomic_load(&w->registered) && (st == PROC_READY || st == PROC_BUSY)) st = PROC_STARTING;
        ctl_proc_beat(w->row, st);
        nanosleep(&period, NULL);
    }
    return NULL;
}

/* "0-1,3": the CPUs this process may run on, for `pi2 status`. */
static void format_cpu_list(char *buf, size_t len) {
    cpu_set_t set;
    buf[0] = 0;
    if (sched_getaffinity(0, sizeof set, &set)) return;
    size_t used = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        int last = c;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) last++;
        int n = last > c ? snprintf(buf + used, len - used, "%s%d-%d", used ? "," : "", c, last)
                         : snprintf(buf + used, len - used, "%s%d", used ? "," : "", c);
        if (n < 0 || (size_t)n >= len - used) { buf[used] = 0; return; }
        used += (size_t)n;
        c = last;
    }
}

static uint64_t rss_bytes(void) {
    unsigned long pages_total, pages_resident;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    int n = fscanf(f, "%lu %lu", &pages_total, &pages_resident);
    fclose(f);
    return n == 2 ? (uint64_t)pages_resident * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

static int connect_coordinator(worker_link *w, const char *runid, const char *name) {
    char dir[RUNDIR_PATH_MAX], ep[BUS_ENDPOINT_MAX];
    if (rundir_path(dir, sizeof dir, runid)) {
        log_error("run directory of '%s': %s", runid, rundir_last_error());
        return -1;
    }
    /* The supervisor creates the run dir; refuse one another user could have planted. */
    int64_t deadline = clock_ms() + RUNDIR_WAIT_MS;
    while (rundir_check(dir)) {
        if (proc_stop || clock_ms() > deadline) {
            if (!proc_stop) log_error("run directory %s: %s", dir, rundir_last_error());
            return -1;
        }
        nanosleep(&(struct timespec){0, 50000000L}, NULL);
    }
    if (bus_endpoint_ipc(ep, sizeof ep, dir, "coordinator", 0)) {
        log_error("%s", bus_last_error());
        return -1;
    }
    if (!(w->ctx = bus_ctx_new()) || !(w->sock = bus_connect(w->ctx, BUS_DEALER, ep, name, NULL))) {
        log_error("connecting to %s: %s", ep, bus_last_error());
        return -1;
    }
    return 0;
}

/* Register: sent at start and again when a coordinator that does not know us asks (it restarted). */
static int send_register(worker_link *w) {
    char cpus[MSG_MAX_NAME + 1];
    format_cpu_list(cpus, sizeof cpus);
    Pi2__Register reg = PI2__REGISTER__INIT;
    reg.kind = w->kind;
    reg.worker_index = w->index;
    reg.pid = (uint32_t)getpid();
    reg.cpu_list = cpus;
    reg.threads = w->threads;
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, 0);
    env.body_case = PI2__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    return worker_link_send(w, &env) ? 0 : -1;
}

int worker_link_open(worker_link *w, stack_ctl *ctl, const char *runid, const char *name, Pi2__ProcessKind kind,
                     uint32_t index, uint32_t threads) {
    memset(w, 0, sizeof *w);
    w->worker_id = index + 1;
    if (!(w->row = ctl_proc_claim(ctl, name, (int32_t)getpid()))) {
        log_error("the control block's process table is full (%d rows)", STACK_MAX_PROCS);
        return -1;
    }
    atomic_store(&w->state, PROC_STARTING);
    if (pthread_create(&w->beat_thread, NULL, beat_main, w)) {
        log_error("cannot start the heartbeat thread");
        return -1;
    }
    w->beat_running = true;
    if (connect_coordinator(w, runid, name)) return -1;
    bus_ticker_init(&w->ticker, WORKER_HEARTBEAT_MS, clock_ms());
    w->kind = kind, w->index = index, w->threads = threads;
    return send_register(w);
}

void worker_link_close(worker_link *w) {
    if (w->beat_running) {
        atomic_store(&w->beat_stop, true);
        pthread_join(w->beat_thread, NULL);
    }
    if (w->row) ctl_proc_beat(w->row, PROC_DEAD);
    bus_close(w->sock);
    bus_ctx_free(w->ctx);
    memset(w, 0, sizeof *w);
}

void worker_link_set_state(worker_link *w, enum proc_state st) { atomic_store(&w->state, (uint32_t)st); }

uint64_t worker_link_send(worker_link *w, Pi2__Envelope *env) {
    env->version = PI2_PROTO_VERSION;
    env->seq = ++w->seq;
    size_t len;
    uint8_t *buf = msg_pack_alloc(env, &len);
    if (!buf) {
        log_error("cannot pack a %s message", msg_body_name(env->body_case));
        return 0;
    }
    int rc = bus_send(w->sock, PI2_BUS_MSG, buf, len);
    free(buf);
    if (rc != BUS_OK) {
        /* Once per outage: with the coordinator gone every heartbeat would fail alike. */
        if (!w->send_failing) log_warn("sending %s to the coordinator: %s", msg_body_name(env->body_case), bus_status_str(rc));
        w->send_failing = true;
        return 0;
    }
    if (w->send_failing) log_info("the coordinator takes messages again");
    w->send_failing = false;
    return env->seq;
}

static Pi2__WorkerState wire_state(enum proc_state st) {
    switch (st) {
    case PROC_STARTING: return PI2__WORKER_STATE__STARTING;
    case PROC_BUSY: return PI2__WORKER_STATE__BUSY;
    case PROC_STOPPING: return PI2__WORKER_STATE__DRAINING;
    default: return PI2__WORKER_STATE__READY;
    }
}

void worker_link_heartbeat(worker_link *w) {
    int64_t now = clock_ms();
    if (!bus_ticker_due(&w->ticker, now)) return;
    Pi2__Heartbeat hb = PI2__HEARTBEAT__INIT;
    hb.worker_id = w->worker_id;
    hb.monotonic_us = (uint64_t)now * 1000;
    hb.state = wire_state((enum proc_state)atomic_load(&w->state));
    hb.tokens_served = atomic_load(&w->row->tokens_served);
    hb.rss_bytes = rss_bytes();
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, 0);
    env.body_case = PI2__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    worker_link_send(w, &env);
}

Pi2__Envelope *worker_link_recv(worker_link *w, const msg_limits *lim, int timeout_ms) {
    struct bus_msg bm;
    int rc = bus_recv(w->sock, &bm, timeout_ms);
    if (rc == BUS_TIMEOUT || rc == BUS_EINTR) return NULL;
    if (rc != BUS_OK) {
        log_warn("receive: %s (%s)", bus_status_str(rc), bus_last_error());
        return NULL;
    }
    if (bm.type != PI2_BUS_MSG) {
        log_warn("dropped a frame with type tag %u", bm.type);
        return NULL;
    }
    char err[256];
    Pi2__Envelope *env = msg_unpack(bm.data, bm.len, err, sizeof err);
    if (!env || msg_validate(env, lim, err, sizeof err)) {
        log_warn("dropped an invalid message: %s", err);
        msg_free(env);
        return NULL;
    }
    switch (env->body_case) {
    case PI2__ENVELOPE__BODY_REGISTER_ACK:
        w->worker_id = env->register_ack->worker_id;
        atomic_store(&w->registered, true);
        log_info("registered with the coordinator as worker %u", w->worker_id);
        break;
    case PI2__ENVELOPE__BODY_SHUTDOWN:
        log_info("shutdown requested by the coordinator: %s", env->shutdown->reason);
        proc_stop = 1;
        break;
    case PI2__ENVELOPE__BODY_ERROR:
        if (env->error->code != PI2__ERROR_CODE__NOT_REGISTERED) return env;
        log_info("the coordinator does not know us (it restarted): registering again");
        atomic_store(&w->registered, false);
        send_register(w);
        break;
    default: return env;
    }
    msg_free(env);
    return NULL;
}

/* Spins until w's socket is readable or hot_until_ns passes; true if readable.
 * zmq_poll with no wait, unlike a non-blocking receive, reads the socket's
 * command mailbox every time, so a message is seen as soon as it is in. */
static bool spin_for_message(worker_link *w, uint64_t hot_until_ns) {
    while (!proc_stop && clock_ns() < hot_until_ns) {
        uint32_t ready = 0;
        if (bus_poll(&w->sock, 1, 0, &ready) > 0 && ready) return true;
        sched_yield(); /* a process sharing the core (the coordinator) runs first */
    }
    return false;
}

void worker_link_serve(worker_link *w, const msg_limits *lim, Pi2__Envelope__BodyCase takes,
                       void (*handle)(void *ctx, const Pi2__Envelope *env), void *ctx) {
    uint64_t hot_until_ns = 0;
    while (!proc_stop) {
        worker_link_heartbeat(w);
        const bool ready = hot_until_ns && spin_for_message(w, hot_until_ns);
        Pi2__Envelope *env = worker_link_recv(w, lim, ready ? 0 : WORKER_HEARTBEAT_MS / 2);
        if (!env) {
            if (!ready) hot_until_ns = 0; /* idle: sleep until the next message */
            continue;
        }
        if (env->body_case == takes) handle(ctx, env);
        else log_warn("ignored a %s message (this worker takes %s)", msg_body_name(env->body_case), msg_body_name(takes));
        msg_free(env);
        if (w->hot_wait_us > 0) hot_until_ns = clock_ns() + (uint64_t)w->hot_wait_us * 1000;
    }
}

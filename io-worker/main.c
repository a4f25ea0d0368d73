/* io-worker: reads byte ranges of the model file into the weights segment
 * with one io_uring, on request of its peers (IoReadBatch -> IoComplete) on
 * the ROUTER endpoint "io" of the run. See docs/stack.md. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io_worker.h"
#include "stack/doorbell.h"
#include "stack/exit_codes.h"
#include "util/cli.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/realtime.h"
#include "stack/msg.h"
#include "stack/rundir.h"

#define WEIGHTS_WAIT_MS (120 * 1000) /* cachemgr prefaults several GB before the segment appears */

static void usage(FILE *f) {
    fprintf(f,
            "usage: io-worker -m MODEL.gguf [-r RUNID] [--queue-depth N] [--no-verify] [--no-realtime]\n"
            "Reads the model file into the run's weights segment with io_uring (O_DIRECT), serving\n"
            "IoReadBatch requests on the run's \"io\" endpoint; under a memory budget also the plan's bundle\n"
            "file into the neuron cache (BundleLoad from the cpu-workers, docs/offload.md).\n"
            "  -m, --model FILE       the model the stack runs\n"
            "  -r, --run RUNID        run id (default: $PI2_RUN, else \"default\")\n"
            "  -q, --queue-depth N    io_uring entries, reads in flight (default: 32 for the model file,\n"
            "                         the plan's times its cpu-workers for the bundle file)\n"
            "      --no-verify        do not check bundles against their checksums as they are read\n"
            "      --no-realtime      run at normal priority (default: SCHED_FIFO when allowed, so that a\n"
            "                         layer's reads start the moment they are asked for, docs/offload.md)\n"
            "  -h, --help             this help\n"
            "Environment: PI2_LOG=debug|info|warn|error; PI2_IO_DELAY_US=N pauses N us before each\n"
            "batch (fault-injection aid for tests)\n");
}

typedef struct {
    const char *model, *runid;
    int queue_depth; /* 0: the defaults */
    bool no_verify, no_realtime;
} options;

static int parse_args(int argc, char **argv, options *o) {
    static const struct option longopts[] = {{"model", required_argument, 0, 'm'},
                                             {"run", required_argument, 0, 'r'},
                                             {"queue-depth", required_argument, 0, 'q'},
                                             {"no-verify", no_argument, 0, 'V'},
                                             {"no-realtime", no_argument, 0, 'R'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    *o = (options){.runid = cli_default_runid()};
    int c;
    while ((c = getopt_long(argc, argv, "m:r:q:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'r': o->runid = optarg; break;
        case 'q': if (cli_parse_int(optarg, "--queue-depth", 1, 4096, &o->queue_depth)) return -1; break;
        case 'V': o->no_verify = true; break;
        case 'R': o->no_realtime = true; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) { log_error("unexpected argument '%s'", argv[optind]); return -1; }
    if (!o->model) { log_error("no model given (-m FILE)"); usage(stderr); return -1; }
    return 0;
}

static bus_socket *bind_endpoint(bus_ctx *ctx, const char *runid) {
    char dir[RUNDIR_PATH_MAX], endpoint[BUS_ENDPOINT_MAX];
    if (rundir_path(dir, sizeof dir, runid) || rundir_create(dir)) {
        log_error("run directory of '%s': %s", runid, rundir_last_error());
        return NULL;
    }
    if (bus_endpoint_ipc(endpoint, sizeof endpoint, dir, "io", -1)) {
        log_error("endpoint: %s", bus_last_error());
        return NULL;
    }
    struct bus_opts opts = bus_default_opts();
    opts.max_frame = MSG_MAX_FRAME;
    bus_socket *s = bus_bind(ctx, BUS_ROUTER, endpoint, &opts);
    if (!s) log_error("bind %s: %s", endpoint, bus_last_error());
    else log_info("serving reads on %s", endpoint);
    return s;
}

/* The messages waiting, a bounded number at a time so the ring is refilled between them. */
static int serve_messages(io_worker *w) {
    for (int k = 0; k < 64; k++) {
        struct bus_msg m;
        const int rc = bus_recv(w->sock, &m, 0);
        if (rc == BUS_OK) iow_serve(w, &m);
        else if (rc == BUS_EPROTO) peer_limit_warn(&w->drops, m.peer, m.peer_len, "dropped a malformed frame: %s", bus_last_error());
        else if (rc == BUS_ERR) { log_error("receive: %s", bus_last_error()); return -1; }
        else break;
    }
    return 0;
}

/* Sleeps until a message, the doorbell or 100 ms; *look: whether the socket
 * may hold a message now. io_sleeping is set before the rings are looked at
 * a last time, and a worker reads it after queueing: either this sees the
 * batch or the worker rings (both sequentially consistent). */
static int sleep_on_socket(io_worker *w, bool *look) {
    const bool rings = w->budgeted && w->ctl;
    *look = false;
    if (rings) {
        atomic_store(&w->ctl->io_sleeping, 1);
        if (iow_rings_pending(w)) {
            atomic_store(&w->ctl->io_sleeping, 0);
            return 0;
        }
    }
    uint32_t ready = 0;
    const int rc = bus_sleep_fd(w->sock, rings ? w->bell_fd : -1, 100, &ready);
    if (rings) {
        atomic_store(&w->ctl->io_sleeping, 0);
        if (ready & 2) doorbell_drain(w->bell_fd);
    }
    if (rc == BUS_ERR) log_error("poll: %s", bus_last_error());
    *look = ready & 1;
    return rc == BUS_ERR ? -1 : 0;
}

/* While reads are in flight, how often the socket is looked at: a look is two
 * system calls (ZeroMQ's poll and its fork check), each a TLB flush on a guest
 * with page-table isolation, and the cpu-workers' loads come through their
 * rings; the socket carries only what did not fit there and the cachemgr's
 * loads. */
#define BUS_LOOK_BUSY_US 500

/* Serves until SIGTERM; returns the exit status. Bundle loads are
 * asynchronous: while reads are in flight the loop waits on the ring (a
 * millisecond at most) and looks at the cpu-workers' rings between waits,
 * at the socket every BUS_LOOK_BUSY_US; idle, it looks at the socket when
 * its sleep says a message may have come. */
static int serve(io_worker *w) {
    w->state = PROC_READY;
    bool look = true;
    while (!proc_stop) {
        iow_beat(w);
        if (w->fatal) return 1;
        iow_take_rings(w);
        const bool busy = w->budgeted && bundle_loader_busy(&w->loader) > 0;
        if (busy) {
            bundle_loader_poll(&w->loader, 1);
        } else if (sleep_on_socket(w, &look)) {
            return 1;
        }
        iow_take_rings(w);
        const uint64_t now = clock_us();
        if (busy ? now - w->bus_looked_us >= BUS_LOOK_BUSY_US : look) {
            w->bus_looked_us = now;
            if (serve_messages(w)) return 1;
        }
        peer_limit_report(&w->drops, "messages from", clock_ms());
        w->state = w->budgeted && bundle_loader_busy(&w->loader) > 0 ? PROC_BUSY : PROC_READY;
    }
    log_info("stopping");
    return 0;
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    options o;
    if (parse_args(argc, argv, &o)) return PI2_EXIT_USAGE;
    proc_stop_on_signals();
    char err[512];
    /* before any thread starts: libzmq's threads inherit the policy */
    if (!o.no_realtime && realtime_self(err, sizeof err)) log_info("running at normal priority: %s", err);

    const char *delay = getenv("PI2_IO_DELAY_US");
    io_worker w = {.runid = o.runid, .state = PROC_STARTING, .bell_fd = -1, .delay_us = delay ? atoll(delay) : 0,
                   .queue_depth = o.queue_depth, .verify = !o.no_verify};
    if (!realpath(o.model, w.model_path)) {
        log_error("model %s: %s", o.model, strerror(errno));
        return 1;
    }
    w.reader = file_reader_open(w.model_path, o.queue_depth ? (unsigned)o.queue_depth : 32, err, sizeof err);
    if (!w.reader) { log_error("%s", err); return 1; }

    int status = 1;
    bus_ctx *ctx = bus_ctx_new();
    if (!ctx) { log_error("bus: %s", bus_last_error()); goto out; }
    w.sock = bind_endpoint(ctx, o.runid);
    if (w.sock && iow_wait_weights(&w, WEIGHTS_WAIT_MS) == 0) status = serve(&w);
    else if (proc_stop) status = 0;
out:
    iow_close_offload(&w); /* its batches in flight are answered first */
    bus_close(w.sock);
    bus_ctx_free(ctx);
    iow_detach(&w);
    file_reader_close(w.reader);
    return status;
}

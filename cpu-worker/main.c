/* cpu-worker: executes its share of every decode layer (docs/stack.md,
 * "Decode") for the coordinator, in arrival order, with the other cpu-workers
 * meeting at barriers in the control segment. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "decode.h"
#include "log.h"
#include "stack_attach.h"
#include "worker_link.h"

typedef struct {
    const char *model_path, *runid;
    int index, n_threads;
    long task_delay_us; /* PI2_TASK_DELAY_US: fault-injection aid */
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: cpu-worker -m MODEL.gguf -i INDEX [-r RUNID] [-t THREADS]\n"
            "Decode worker INDEX (0 .. cpu-workers - 1) of the pi2 stack RUNID: computes its share of\n"
            "every layer's heads, rows and FFN neurons for the coordinator.\n"
            "  -m, --model FILE     the GGUF model the stack runs (as given to cachemgr)\n"
            "  -r, --run ID         run id (default $PI2_RUN or \"default\")\n"
            "  -i, --index N        worker index\n"
            "  -t, --threads N      compute threads (default 1)\n"
            "  -h, --help           this help\n"
            "Waits up to %d s for cachemgr's segments and weights.\n"
            "Environment: PI2_LOG=debug|info|warn|error, PI2_TASK_DELAY_US=N (sleep N us per task)\n",
            STACK_WAIT_MS / 1000);
}

static int parse_long(const char *s, const char *what, long lo, long hi, long *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end || v < lo || v > hi) {
        log_error("%s: '%s' is not an integer in [%ld, %ld]", what, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, options *o) {
    static const struct option longopts[] = {{"model", required_argument, 0, 'm'}, {"run", required_argument, 0, 'r'},
                                             {"index", required_argument, 0, 'i'}, {"threads", required_argument, 0, 't'},
                                             {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    const char *env_run = getenv("PI2_RUN");
    *o = (options){.runid = env_run && *env_run ? env_run : "default", .index = -1, .n_threads = 1};
    long v;
    int c;
    while ((c = getopt_long(argc, argv, "m:r:i:t:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model_path = optarg; break;
        case 'r': o->runid = optarg; break;
        case 'i': if (parse_long(optarg, "-i", 0, STACK_MAX_CPU_WORKERS - 1, &v)) return -1; o->index = (int)v; break;
        case 't': if (parse_long(optarg, "-t", 1, 256, &v)) return -1; o->n_threads = (int)v; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) { log_error("unexpected argument '%s'", argv[optind]); return -1; }
    if (!o->model_path || o->index < 0) { log_error("-m MODEL and -i INDEX are required"); usage(stderr); return -1; }
    const char *delay = getenv("PI2_TASK_DELAY_US");
    if (delay && *delay && parse_long(delay, "PI2_TASK_DELAY_US", 0, 60000000, &o->task_delay_us)) return -1;
    return 0;
}

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

typedef struct {
    const options *o;
    stack_view *sv;
    worker_link *link;
    decoder *dec;
} worker;

static void reply(worker *w, const Pi2__Envelope *req, Pi2__TaskStatus status, uint64_t time_us) {
    const Pi2__DecodeTask *t = req->decode_task;
    Pi2__TaskDone done = PI2__TASK_DONE__INIT;
    done.task_seq = req->seq;
    done.worker_id = w->link->worker_id;
    done.layer = t->layer;
    done.out_offset = t->out_offset;
    done.out_length = t->out_length;
    done.time_us = time_us;
    done.status = status;
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, req->session);
    env.body_case = PI2__ENVELOPE__BODY_TASK_DONE;
    env.task_done = &done;
    worker_link_send(w->link, &env);
}

/* A task of an epoch the coordinator has left behind is dropped unexecuted
 * (TASK_FAILED), as is one whose barrier the coordinator aborted. */
static void run_task(worker *w, const Pi2__Envelope *req) {
    const Pi2__DecodeTask *t = req->decode_task;
    uint32_t current = (uint32_t)atomic_load(&w->sv->ctl->epoch);
    if (t->epoch != current) {
        log_debug("dropped layer %u task of epoch %u (now %u)", t->layer, t->epoch, current);
        reply(w, req, PI2__TASK_STATUS__TASK_FAILED, 0);
        return;
    }
    if (w->o->task_delay_us) usleep((useconds_t)w->o->task_delay_us);
    worker_link_set_state(w->link, PROC_BUSY);
    uint64_t t0 = now_us();
    int rc = decoder_run(w->dec, (int)t->layer, (int)t->position, t->epoch);
    uint64_t took = now_us() - t0;
    worker_link_set_state(w->link, PROC_READY);
    if (rc) {
        log_info("layer %u task at position %u abandoned (epoch %u ended or a barrier timed out)", t->layer,
                 t->position, t->epoch);
        reply(w, req, PI2__TASK_STATUS__TASK_FAILED, took);
        return;
    }
    if ((int)t->layer == w->sv->m.n_layer) atomic_fetch_add(&w->link->row->tokens_served, 1);
    reply(w, req, PI2__TASK_STATUS__TASK_OK, took);
}

static void serve(worker *w) {
    msg_limits lim;
    stack_msg_limits(w->sv, &lim);
    while (!worker_stop) {
        worker_link_heartbeat(w->link);
        Pi2__Envelope *env = worker_link_recv(w->link, &lim, WORKER_HEARTBEAT_MS / 2);
        if (!env) continue;
        if (env->body_case == PI2__ENVELOPE__BODY_DECODE_TASK) run_task(w, env);
        else log_warn("ignored a %s message (a cpu-worker takes DecodeTask)", msg_body_name(env->body_case));
        msg_free(env);
    }
}


int main(int argc, char **argv) {
    log_init(argv[0]);
    options o;
    if (parse_args(argc, argv, &o)) return 2;
    worker_signals_install();
    stack_view sv;
    if (stack_view_open(&sv, o.model_path, o.runid, &worker_stop)) return worker_stop ? 0 : 1;
    int status = 1;
    worker_link link = {0};
    decoder *dec = NULL;
    int n_workers = sv.ctl->params.n_cpu_workers;
    if (o.index >= n_workers) {
        log_error("-i %d: the stack has %d cpu-worker%s (indices 0..%d)", o.index, n_workers, n_workers == 1 ? "" : "s",
                  n_workers - 1);
        goto out;
    }
    if (!(dec = decoder_new(&sv, o.index, o.n_threads))) goto out;
    char name[32];
    snprintf(name, sizeof name, "cpu-worker.%d", o.index);
    if (worker_link_open(&link, sv.ctl, o.runid, name, PI2__PROCESS_KIND__CPU, (uint32_t)o.index,
                         (uint32_t)o.n_threads))
        goto out;
    worker_link_set_state(&link, PROC_READY);
    log_info("%s ready: %d thread%s, model %s", name, o.n_threads, o.n_threads == 1 ? "" : "s", o.model_path);
    worker w = {&o, &sv, &link, dec};
    serve(&w);
    log_info("stopping");
    status = 0;
out:
    worker_link_close(&link);
    decoder_free(dec);
    stack_view_close(&sv);
    return status;
}

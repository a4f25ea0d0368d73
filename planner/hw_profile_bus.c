/* The hardware profile's bus round trip (hw_profile.h): ZeroMQ request-reply
 * over ipc:// between two threads, as the stack's processes talk. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "hw_profile.h"
#include "util/clock.h"
#include "util/compare_double.h"
#include "util/log.h"

#define BUS_ROUNDS 300
#define BUS_WARMUP 20
#define BUS_TIMEOUT_MS 2000

typedef struct {
    void *rep;
    int rounds;
} echo_args;

/* Answers each request with its own byte (a timeout or error ends it). */
static void *echo_requests(void *arg) {
    const echo_args *e = arg;
    char byte;
    for (int i = 0; i < e->rounds; i++)
        if (zmq_recv(e->rep, &byte, 1, 0) < 0 || zmq_send(e->rep, &byte, 1, 0) < 0) break;
    return NULL;
}

static void *bus_socket_new(void *zctx, int type) {
    void *s = zmq_socket(zctx, type);
    const int linger = 0, timeout = BUS_TIMEOUT_MS;
    if (s && (zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) ||
              zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout, sizeof timeout) ||
              zmq_setsockopt(s, ZMQ_SNDTIMEO, &timeout, sizeof timeout))) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* BUS_ROUNDS timed round trips of one byte from a REQ to the REP thread, in
 * microseconds, sorted into us[] (after BUS_WARMUP untimed ones). */
static int time_round_trips(void *req, double *us, char *err, size_t errlen) {
    char byte = 1;
    for (int i = 0; i < BUS_WARMUP + BUS_ROUNDS; i++) {
        const double t0 = clock_seconds();
        if (zmq_send(req, &byte, 1, 0) < 0 || zmq_recv(req, &byte, 1, 0) < 0) {
            err_set(err, errlen, "bus round trip %d: %s", i, zmq_strerror(errno));
            return -1;
        }
        if (i >= BUS_WARMUP) us[i - BUS_WARMUP] = (clock_seconds() - t0) * 1e6;
    }
    qsort(us, BUS_ROUNDS, sizeof *us, compare_double);
    return 0;
}

/* Median microseconds of a ZeroMQ request-reply over ipc:// in a temporary
 * directory (removed afterwards), between two threads. */
int hw_profile_measure_bus(hw_profile *h, char *err, size_t errlen) {
    char dir[PATH_MAX], sock[PATH_MAX + 16], endpoint[PATH_MAX + 32];
    if (hw_profile_scratch_dir(dir, "bus", err, errlen)) return -1;
    snprintf(sock, sizeof sock, "%s/rtt.sock", dir);
    snprintf(endpoint, sizeof endpoint, "ipc://%s", sock);
    int rc = -1;
    void *zctx = zmq_ctx_new(), *rep = NULL, *req = NULL;
    echo_args args = {.rounds = BUS_WARMUP + BUS_ROUNDS};
    pthread_t echo;
    bool echoing = false;
    double us[BUS_ROUNDS];
    if (!zctx || !(rep = bus_socket_new(zctx, ZMQ_REP)) || !(req = bus_socket_new(zctx, ZMQ_REQ)) ||
        zmq_bind(rep, endpoint) || zmq_connect(req, endpoint)) {
        err_set(err, errlen, "bus: %s: %s", endpoint, zmq_strerror(errno));
        goto out;
    }
    args.rep = rep;
    if (pthread_create(&echo, NULL, echo_requests, &args)) { /* rep now belongs to that thread */
        err_set(err, errlen, "bus: cannot start a thread");
        goto out;
    }
    echoing = true;
    if (time_round_trips(req, us, err, errlen) == 0) {
        h->bus_rtt_us = us[BUS_ROUNDS / 2];
        rc = 0;
    }
out:
    if (req) zmq_close(req);
    if (echoing) pthread_join(echo, NULL);
    if (rep) zmq_close(rep);
    if (zctx) zmq_ctx_term(zctx);
    unlink(sock); /* libzmq may have removed it already */
    if (rmdir(dir)) log_warn("bus: cannot remove %s: %s", dir, strerror(errno));
    return rc;
}


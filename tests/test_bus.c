/* The ZeroMQ bus: run directory safety, endpoint rules, ROUTER/DEALER round
 * trips between processes, size limits, garbage frames, timeouts, EINTR,
 * heartbeats, real-time I/O threads; prints the ipc round-trip latency and
 * the per-message cost of 8 KiB batches (measured, not asserted). Leaves
 * nothing in the run dir. */
#include "stack/bus.h"
#include "util/clock.h"
#include "stack/rundir.h"
#include "util/realtime.h"
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

enum { MSG_HELLO = 1, MSG_ECHO = 2, MSG_BATCH = 3, MSG_ACK = 4, MSG_STOP = 5, MSG_HEARTBEAT = 6 };

#define N_ROUND_TRIPS 2000
#define N_BATCHES 2000
#define BATCH_BYTES 8192

static char run_dir[RUNDIR_PATH_MAX];

static void cleanup(void) {
    if (run_dir[0]) rundir_remove(run_dir);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void test_rundir(void) {
    struct stat st;
    CHECK(rundir_create(run_dir) == 0, "create: %s", rundir_last_error());
    CHECK(lstat(run_dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0700 &&
              st.st_uid == geteuid(),
          "mode %o", (unsigned)(st.st_mode & 07777));
    CHECK(rundir_create(run_dir) == 0, "an existing safe directory is reused: %s", rundir_last_error());

    CHECK(chmod(run_dir, 0755) == 0, "chmod");
    CHECK(rundir_create(run_dir) < 0 && strstr(rundir_last_error(), "mode"), "0755 refused: %s",
          rundir_last_error());
    char ep[BUS_ENDPOINT_MAX];
    bus_endpoint_ipc(ep, sizeof ep, run_dir, "coordinator", -1);
    bus_ctx *ctx = bus_ctx_new();
    bus_socket *s = bus_bind(ctx, BUS_ROUTER, ep, NULL);
    CHECK(s == NULL, "bind in an unsafe directory refused");
    bus_close(s);
    bus_ctx_free(ctx);
    CHECK(chmod(run_dir, 0700) == 0, "chmod back");

    if (geteuid() == 0) {
        CHECK(chown(run_dir, 65534, 65534) == 0, "chown");
        CHECK(rundir_create(run_dir) < 0 && strstr(rundir_last_error(), "owned"), "foreign owner refused: %s",
              rundir_last_error());
        CHECK(chown(run_dir, 0, 0) == 0, "chown back");
    }
    char link[RUNDIR_PATH_MAX + 8];
    snprintf(link, sizeof link, "%s-lnk", run_dir);
    CHECK(symlink(run_dir, link) == 0, "symlink");
    CHECK(rundir_create(link) < 0, "a symlink is refused");
    unlink(link);
    CHECK(rundir_create("relative/dir") < 0, "relative path refused");
    char path[RUNDIR_PATH_MAX];
    CHECK(rundir_path(path, sizeof path, "a/b") < 0, "run id with '/' refused");
}

static void test_endpoints(void) {
    char ep[BUS_ENDPOINT_MAX];
    CHECK(bus_endpoint_ipc(ep, sizeof ep, "/run/x", "cpu-worker", 3) == 0 &&
              !strcmp(ep, "ipc:///run/x/cpu-worker-3.sock"),
          "%s", ep);
    CHECK(bus_endpoint_ipc(ep, sizeof ep, "/run/x", "coordinator", -1) == 0 &&
              !strcmp(ep, "ipc:///run/x/coordinator.sock"),
          "%s", ep);
    char longdir[120];
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = 0;
    CHECK(bus_endpoint_ipc(ep, sizeof ep, longdir, "w", 0) < 0, "over-long unix socket path refused");
    CHECK(bus_endpoint_tcp(ep, sizeof ep, NULL, 5555) == 0 && !strcmp(ep, "tcp://127.0.0.1:5555"), "%s", ep);
    CHECK(bus_endpoint_tcp(ep, sizeof ep, NULL, 70000) < 0, "bad port");

    bus_ctx *ctx = bus_ctx_new();
    bus_socket *s = bus_bind(ctx, BUS_PULL, "tcp://0.0.0.0:*", NULL);
    CHECK(s == NULL && strstr(bus_last_error(), "loopback"), "non-loopback tcp refused: %s", bus_last_error());
    s = bus_bind(ctx, BUS_PULL, "tcp://127.0.0.1:*", NULL);
    CHECK(s != NULL, "loopback tcp: %s", bus_last_error());
    bus_close(s);
    s = bus_bind(ctx, BUS_PULL, "ipc://relative.sock", NULL);
    CHECK(s == NULL, "relative ipc path refused");
    s = bus_connect(ctx, BUS_DEALER, "tcp://127.0.0.1:1", NULL, NULL);
    CHECK(s == NULL, "DEALER without identity refused");
    bus_ctx_free(ctx);
}

/* The worker side of the round-trip test, in a forked child. */
static int worker_main(const char *ep) {
    bus_ctx *ctx = bus_ctx_new();
    struct bus_opts o = bus_default_opts();
    o.send_timeout_ms = 5000;
    bus_socket *s = ctx ? bus_connect(ctx, BUS_DEALER, ep, "cpu-worker-0", &o) : NULL;
    if (!s) return 20;
    int rc = 0;
    if (bus_send(s, MSG_HELLO, "hi", 2)) rc = 21;
    uint32_t batches = 0, bad_batches = 0;
    while (!rc) {
        struct bus_msg m;
        int r = bus_recv(s, &m, 10000);
        if (r) {
            rc = 22;
            break;
        }
        if (m.type == MSG_ECHO) {
            if (bus_send(s, MSG_ECHO, m.data, m.len)) rc = 23;
        } else if (m.type == MSG_BATCH) {
            uint32_t seq = UINT32_MAX;
            if (m.len >= sizeof seq) memcpy(&seq, m.data, sizeof seq);
            if (seq != batches || ((const uint8_t *)m.data)[m.len - 1] != (uint8_t)seq) bad_batches++;
            if (++batches == N_BATCHES) {
                uint32_t ack[2] = {batches, bad_batches};
                if (bus_send(s, MSG_ACK, ack, sizeof ack)) rc = 24;
                batches = bad_batches = 0;
            }
        } else if (m.type == MSG_STOP) {
            break;
        } else {
            rc = 25;
        }
    }
    bus_close(s);
    bus_ctx_free(ctx);
    return rc;
}

/* Pipelines N_BATCHES messages of `bytes` to the worker, which checks each
 * and acknowledges the lot: the per-message cost of batched descriptors. */
static void stream_messages(bus_socket *router, const uint8_t *peer, size_t peer_len, size_t bytes) {
    static uint8_t batch[BATCH_BYTES];
    int failures = 0;
    double t0 = clock_seconds() * 1e6;
    for (uint32_t i = 0; i < N_BATCHES && !failures; i++) {
        memcpy(batch, &i, sizeof i);
        batch[bytes - 1] = (uint8_t)i;
        if (bus_send_to(router, peer, peer_len, MSG_BATCH, batch, bytes)) failures++;
    }
    struct bus_msg m;
    int r = failures ? BUS_ERR : bus_recv(router, &m, 20000);
    double elapsed = clock_seconds() * 1e6 - t0;
    uint32_t ack[2] = {0, 0};
    if (r == BUS_OK && m.len == sizeof ack) memcpy(ack, m.data, sizeof ack);
    CHECK(r == BUS_OK && m.type == MSG_ACK && ack[0] == N_BATCHES && ack[1] == 0,
          "%zu-byte stream: %s, %u received, %u corrupt", bytes, bus_status_str(r), ack[0], ack[1]);
    printf("%zu-byte messages streamed to another process: %.2f us per message, %.3f GB/s (n=%d)\n", bytes,
           elapsed / N_BATCHES, (double)N_BATCHES * (double)bytes / elapsed / 1e3, N_BATCHES);
}

static void test_round_trip(void) {
    char ep[BUS_ENDPOINT_MAX];
    bus_endpoint_ipc(ep, sizeof ep, run_dir, "coordinator", -1);
    pid_t pid = fork();
    if (pid == 0) _exit(worker_main(ep));

    bus_ctx *ctx = bus_ctx_new();
    bus_socket *router = bus_bind(ctx, BUS_ROUTER, ep, NULL);
    CHECK(router != NULL, "bind: %s", bus_last_error());
    if (!router) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        bus_ctx_free(ctx);
        return;
    }
    struct bus_msg m;
    int r = bus_recv(router, &m, 10000);
    CHECK(r == BUS_OK && m.type == MSG_HELLO && m.len == 2 && !memcmp(m.data, "hi", 2), "hello: %s",
          bus_status_str(r));
    CHECK(m.peer_len == strlen("cpu-worker-0") && !memcmp(m.peer, "cpu-worker-0", m.peer_len),
          "peer identity is the worker's name");
    uint8_t peer[BUS_PEER_MAX];
    size_t peer_len = m.peer_len;
    memcpy(peer, m.peer, peer_len);

    CHECK(bus_send_to(router, "nobody", 6, MSG_ECHO, "x", 1) == BUS_ENOPEER, "unknown peer reported");
    CHECK(bus_send(router, MSG_ECHO, "x", 1) == BUS_ERR, "bus_send needs a DEALER");

    static double rtt[N_ROUND_TRIPS];
    uint8_t ping[64];
    int mismatches = 0, failures = 0;
    for (int i = 0; i < N_ROUND_TRIPS; i++) {
        for (size_t j = 0; j < sizeof ping; j++) ping[j] = (uint8_t)(i + j);
        double t0 = clock_seconds() * 1e6;
        if (bus_send_to(router, peer, peer_len, MSG_ECHO, ping, sizeof ping) ||
            bus_recv(router, &m, 5000)) {
            failures++;
            break;
        }
        rtt[i] = clock_seconds() * 1e6 - t0;
        mismatches += m.type != MSG_ECHO || m.len != sizeof ping || memcmp(m.data, ping, sizeof ping);
    }
    CHECK(failures == 0 && mismatches == 0, "round trips: %d failures, %d mismatches", failures, mismatches);
    qsort(rtt, N_ROUND_TRIPS, sizeof rtt[0], cmp_double);
    printf("ipc round trip, 64-byte payload, ROUTER<->DEALER between processes: median %.1f us, "
           "p10 %.1f us, p90 %.1f us (n=%d)\n",
           rtt[N_ROUND_TRIPS / 2], rtt[N_ROUND_TRIPS / 10], rtt[N_ROUND_TRIPS * 9 / 10], N_ROUND_TRIPS);

    stream_messages(router, peer, peer_len, BATCH_BYTES);
    stream_messages(router, peer, peer_len, 64);

    CHECK(bus_send_to(router, peer, peer_len, MSG_STOP, NULL, 0) == BUS_OK, "stop");
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "worker exit status %d", status);
    bus_close(router);
    bus_ctx_free(ctx);
}

/* A raw ZeroMQ peer sends malformed messages to the bus socket s. */
static void send_raw(void *raw, const size_t *sizes, int n_parts, uint64_t *seed) {
    uint8_t buf[256];
    for (int p = 0; p < n_parts; p++) {
        for (size_t i = 0; i < sizes[p]; i++) {
            *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
            buf[i] = (uint8_t)(*seed >> 56);
        }
        zmq_send(raw, buf, sizes[p], p + 1 < n_parts ? ZMQ_SNDMORE : 0);
    }
}

static void expect_garbage_refused(bus_socket *s, void *raw, const size_t *sizes, int n_parts, const char *what) {
    uint64_t seed = 42;
    send_raw(raw, sizes, n_parts, &seed);
    struct bus_msg m;
    int r = bus_recv(s, &m, 2000);
    CHECK(r == BUS_EPROTO, "%s: got %s", what, bus_status_str(r));
}

static void test_garbage(void) {
    char ep[BUS_ENDPOINT_MAX];
    bus_endpoint_ipc(ep, sizeof ep, run_dir, "garbage", -1);
    bus_ctx *ctx = bus_ctx_new();
    struct bus_opts o = bus_default_opts();
    o.max_frame = 1024;
    o.send_timeout_ms = 0;
    bus_socket *router = bus_bind(ctx, BUS_ROUTER, ep, &o);
    CHECK(router != NULL, "bind: %s", bus_last_error());
    if (!router) {
        bus_ctx_free(ctx);
        return;
    }
    void *zctx = zmq_ctx_new();
    void *raw = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(raw, ZMQ_ROUTING_ID, "raw", 3);
    zmq_connect(raw, ep);

    /* ROUTER side: [identity] + what the raw DEALER sends. */
    const size_t one_random[] = {10}, only_tag[] = {4}, empty[] = {0}, three[] = {4, 8, 8};
    const size_t empty_tag[] = {0, 8}, long_tag[] = {5, 8};
    size_t many[50];
    for (int i = 0; i < 50; i++) many[i] = (size_t)(i % 7);
    many[0] = 4;
    expect_garbage_refused(router, raw, one_random, 1, "single random frame");
    expect_garbage_refused(router, raw, only_tag, 1, "tag without payload");
    expect_garbage_refused(router, raw, empty, 1, "empty frame");
    expect_garbage_refused(router, raw, three, 3, "two payload frames");
    expect_garbage_refused(router, raw, empty_tag, 2, "empty tag");
    expect_garbage_refused(router, raw, long_tag, 2, "5-byte tag");
    expect_garbage_refused(router, raw, many, 50, "50 frames");

    /* Random shapes: each one either parses (exactly [4-byte tag][payload])
     * or is refused; the stream stays in step. */
    uint64_t seed = 7;
    int wrong = 0;
    for (int iter = 0; iter < 300; iter++) {
        size_t sizes[6];
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int n = 1 + (int)((seed >> 40) % 6);
        for (int p = 0; p < n; p++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            sizes[p] = (seed >> 33) % 3 == 0 ? 4 : (size_t)((seed >> 20) % 200);
        }
        send_raw(raw, sizes, n, &seed);
        struct bus_msg m;
        int r = bus_recv(router, &m, 2000);
        bool well_formed = n == 2 && sizes[0] == 4;
        if (well_formed ? (r != BUS_OK || m.len != sizes[1]) : r != BUS_EPROTO) wrong++;
    }
    CHECK(wrong == 0, "%d random messages misjudged", wrong);

    /* Oversize: refused on send; a raw peer announcing one is cut off by
     * libzmq before anything is allocated, so nothing arrives. */
    static uint8_t big[2048];
    CHECK(bus_send_to(router, "raw", 3, 1, big, sizeof big) == BUS_ETOOBIG, "oversize send refused");
    uint8_t tag[4] = {1, 0, 0, 0};
    zmq_send(raw, tag, 4, ZMQ_SNDMORE);
    zmq_send(raw, big, sizeof big, 0);
    struct bus_msg m;
    int r = bus_recv(router, &m, 300);
    CHECK(r == BUS_TIMEOUT, "oversize frame not delivered: %s", bus_status_str(r));

    /* The socket still works for a well-formed message from a new peer. */
    void *raw2 = zmq_socket(zctx, ZMQ_DEALER);
    zmq_setsockopt(raw2, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(raw2, ZMQ_ROUTING_ID, "raw2", 4);
    zmq_connect(raw2, ep);
    uint8_t tag9[4] = {9, 0, 0, 1};
    zmq_send(raw2, tag9, 4, ZMQ_SNDMORE);
    zmq_send(raw2, "payload", 7, 0);
    r = bus_recv(router, &m, 2000);
    CHECK(r == BUS_OK && m.type == 0x01000009u && m.len == 7 && !memcmp(m.data, "payload", 7) &&
              m.peer_len == 4 && !memcmp(m.peer, "raw2", 4),
          "valid message after garbage: %s", bus_status_str(r));

    /* DEALER and PULL sides get garbage too. */
    void *raw_router = zmq_socket(zctx, ZMQ_ROUTER);
    zmq_setsockopt(raw_router, ZMQ_LINGER, &zero, sizeof zero);
    char ep2[BUS_ENDPOINT_MAX];
    bus_endpoint_ipc(ep2, sizeof ep2, run_dir, "raw-router", -1);
    zmq_bind(raw_router, ep2);
    bus_socket *dealer = bus_connect(ctx, BUS_DEALER, ep2, "dealer-0", &o);
    CHECK(dealer && bus_send(dealer, 1, "x", 1) == BUS_OK, "dealer hello");
    char id[BUS_PEER_MAX];
    int idn = zmq_recv(raw_router, id, sizeof id, 0);
    zmq_msg_t junk;
    while (idn > 0) { /* consume the hello's remaining frames */
        int more = 0;
        size_t sz = sizeof more;
        zmq_getsockopt(raw_router, ZMQ_RCVMORE, &more, &sz);
        if (!more) break;
        zmq_msg_init(&junk);
        zmq_msg_recv(&junk, raw_router, 0);
        zmq_msg_close(&junk);
    }
    CHECK(idn == 8, "raw router saw the dealer");
    if (dealer && idn == 8) {
        zmq_send(raw_router, id, 8, ZMQ_SNDMORE);
        zmq_send(raw_router, "garbage!", 8, 0);
        r = bus_recv(dealer, &m, 2000);
        CHECK(r == BUS_EPROTO, "DEALER: garbage frame: %s", bus_status_str(r));
        zmq_send(raw_router, id, 8, ZMQ_SNDMORE);
        zmq_send(raw_router, tag9, 4, ZMQ_SNDMORE);
        zmq_send(raw_router, "ok", 2, 0);
        r = bus_recv(dealer, &m, 2000);
        CHECK(r == BUS_OK && m.len == 2 && m.type == 0x01000009u, "DEALER: valid after garbage");
    }
    bus_close(dealer);

    char ep3[BUS_ENDPOINT_MAX];
    bus_endpoint_ipc(ep3, sizeof ep3, run_dir, "pull", 0);
    bus_socket *pull = bus_bind(ctx, BUS_PULL, ep3, &o);
    void *raw_push = zmq_socket(zctx, ZMQ_PUSH);
    zmq_setsockopt(raw_push, ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(raw_push, ep3);
    CHECK(pull != NULL, "bind pull: %s", bus_last_error());
    if (pull) {
        expect_garbage_refused(pull, raw_push, one_random, 1, "PULL: single frame");
        expect_garbage_refused(pull, raw_push, many, 50, "PULL: 50 frames");
        CHECK(bus_recv(pull, &m, 0) == BUS_TIMEOUT, "PULL: drained");
        CHECK(bus_send(pull, 1, "x", 1) == BUS_ERR, "PULL cannot send");
    }
    bus_close(pull);

    zmq_close(raw);
    zmq_close(raw2);
    zmq_close(raw_router);
    unlink(ep2 + strlen("ipc://")); /* libzmq leaves the socket file of a raw bind */
    zmq_close(raw_push);
    zmq_ctx_term(zctx);
    bus_close(router);
    bus_ctx_free(ctx);
}

static void on_alarm(int sig) { (void)sig; }

static void test_timeouts_and_signals(void) {
    char ep[BUS_ENDPOINT_MAX];
    bus_endpoint_ipc(ep, sizeof ep, run_dir, "idle", -1);
    bus_ctx *ctx = bus_ctx_new();
    bus_socket *s = bus_bind(ctx, BUS_ROUTER, ep, NULL);
    CHECK(s != NULL, "bind: %s", bus_last_error());
    if (!s) {
        bus_ctx_free(ctx);
        return;
    }
    struct bus_msg m;
    int64_t t0 = clock_ms();
    int r = bus_recv(s, &m, 50);
    int64_t waited = clock_ms() - t0;
    CHECK(r == BUS_TIMEOUT && waited >= 45, "timeout: %s after %lld ms", bus_status_str(r), (long long)waited);
    CHECK(bus_recv(s, &m, 0) == BUS_TIMEOUT, "zero timeout polls");

    /* SIGTERM-style shutdown: a signal ends an indefinite wait. */
    struct sigaction sa = {.sa_handler = on_alarm}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, &old);
    struct itimerval it = {.it_value = {.tv_usec = 50000}};
    setitimer(ITIMER_REAL, &it, NULL);
    r = bus_recv(s, &m, -1);
    CHECK(r == BUS_EINTR, "signal during recv: %s", bus_status_str(r));
    sigaction(SIGALRM, &old, NULL);
    bus_close(s);
    bus_ctx_free(ctx);
}

/* Whether bus_sleep_fd(s, fd, timeout_ms) wakes for a message (bit 0) or
 * fd (bit 1) within the timeout, and how long it took. */
static uint32_t sleep_ready(bus_socket *s, int fd, int timeout_ms, int64_t *waited) {
    uint32_t ready = 0;
    const int64_t t0 = clock_ms();
    if (bus_sleep_fd(s, fd, timeout_ms, &ready) < 0) ready = 0;
    *waited = clock_ms() - t0;
    return ready;
}

/* The io-worker's sleep: one plain poll right after a receive found
 * nothing, zmq_poll after anything else; both wake for the next message,
 * and for the descriptor beside the socket. */
static void test_sleep(void) {
    char ep[BUS_ENDPOINT_MAX];
    bus_endpoint_ipc(ep, sizeof ep, run_dir, "sleep", -1);
    bus_ctx *ctx = bus_ctx_new();
    bus_socket *router = bus_bind(ctx, BUS_ROUTER, ep, NULL);
    bus_socket *dealer = router ? bus_connect(ctx, BUS_DEALER, ep, "sleeper", NULL) : NULL;
    int bell[2] = {-1, -1};
    CHECK(router && dealer && pipe(bell) == 0, "sockets and pipe: %s", bus_last_error());
    if (!router || !dealer || bell[0] < 0) goto out;
    struct bus_msg m;
    int64_t waited;
    CHECK(bus_send(dealer, MSG_HELLO, "hi", 2) == BUS_OK && bus_recv(router, &m, 5000) == BUS_OK, "hello");
    uint8_t peer[BUS_PEER_MAX];
    const size_t peer_len = m.peer_len;
    memcpy(peer, m.peer, peer_len);
    CHECK(bus_recv(router, &m, 0) == BUS_TIMEOUT, "nothing more waiting");
    CHECK(sleep_ready(router, bell[0], 50, &waited) == 0 && waited >= 45, "drained, idle: slept %lld ms",
          (long long)waited);
    for (int round = 0; round < 3; round++) { /* drained: the plain poll on ZMQ_FD */
        CHECK(bus_send(dealer, MSG_ECHO, "a", 1) == BUS_OK, "send");
        const uint32_t ready = sleep_ready(router, bell[0], 5000, &waited);
        CHECK((ready & 1) && waited < 4000, "round %d: a message wakes the drained sleep (ready %u, %lld ms)", round,
              ready, (long long)waited);
        CHECK(bus_recv(router, &m, 0) == BUS_OK && m.type == MSG_ECHO, "round %d: the message is there", round);
        CHECK(bus_recv(router, &m, 0) == BUS_TIMEOUT, "round %d: and no other", round);
    }
    /* a look at the socket after the last receive takes the signal of a message that came meanwhile (it
     * stays unread): ZMQ_FD then stays quiet, and the sleep must look with zmq_poll instead */
    CHECK(bus_send(dealer, MSG_ECHO, "b", 1) == BUS_OK, "send");
    uint32_t ready = 0;
    const int64_t t0 = clock_ms();
    while (bus_poll(&router, 1, 0, &ready) == 0 && clock_ms() - t0 < 5000) usleep(1000);
    CHECK(ready & 1, "the message came");
    CHECK(bus_send_to(router, peer, peer_len, MSG_ACK, NULL, 0) == BUS_OK, "answer");
    ready = sleep_ready(router, bell[0], 2000, &waited);
    CHECK((ready & 1) && waited < 1000, "a message already signalled wakes the sleep (ready %u, %lld ms)", ready,
          (long long)waited);
    CHECK(bus_recv(router, &m, 0) == BUS_OK && m.type == MSG_ECHO, "the message is there");
    CHECK(bus_recv(router, &m, 0) == BUS_TIMEOUT, "drained again");
    CHECK(write(bell[1], "", 1) == 1, "ring");
    ready = sleep_ready(router, bell[0], 5000, &waited);
    CHECK((ready & 2) && waited < 4000, "the descriptor wakes the sleep (ready %u)", ready);
    /* bit 0 beside it is the documented spurious wake (the answer sent above can stir ZMQ_FD): nothing there */
    CHECK(!(ready & 1) || bus_recv(router, &m, 0) == BUS_TIMEOUT, "no message came with the ring");
out:
    if (bell[0] >= 0) close(bell[0]), close(bell[1]);
    bus_close(dealer);
    bus_close(router);
    bus_ctx_free(ctx);
}

static void test_heartbeats(void) {
    struct bus_ticker t;
    bus_ticker_init(&t, 100, 1000);
    CHECK(bus_ticker_due(&t, 1000) && !bus_ticker_due(&t, 1050) && bus_ticker_due(&t, 1100) &&
              !bus_ticker_due(&t, 1199),
          "ticker period");
    CHECK(bus_ticker_due(&t, 5000) && !bus_ticker_due(&t, 5001), "a stall gives one beat, not a burst");

    struct bus_peers peers;
    bus_peers_init(&peers, 500);
    int a = bus_peers_seen(&peers, "cpu-worker-0", 12, 0);
    int b = bus_peers_seen(&peers, "io-worker", 9, 300);
    CHECK(a == 0 && b == 1 && bus_peers_find(&peers, "io-worker", 9) == 1, "peer table");
    CHECK(bus_peers_alive(&peers, a, 500) && !bus_peers_alive(&peers, a, 501), "dead after 500 ms of silence");
    CHECK(bus_peers_seen(&peers, "cpu-worker-0", 12, 600) == 0 && bus_peers_alive(&peers, a, 1000),
          "a message revives the peer");
    bus_peers_remove(&peers, 0);
    CHECK(peers.n == 1 && bus_peers_find(&peers, "io-worker", 9) == 0, "remove");
    CHECK(bus_peers_seen(&peers, "", 0, 0) < 0, "empty identity refused");

    /* A real worker beats every 10 ms for 100 ms, then goes silent. */
    char ep[BUS_ENDPOINT_MAX];
    bus_endpoint_ipc(ep, sizeof ep, run_dir, "heartbeat", -1);
    bus_ctx *ctx = bus_ctx_new();
    bus_socket *router = bus_bind(ctx, BUS_ROUTER, ep, NULL);
    CHECK(router != NULL, "bind: %s", bus_last_error());
    pid_t pid = fork();
    if (pid == 0) {
        bus_ctx *c = bus_ctx_new();
        bus_socket *d = bus_connect(c, BUS_DEALER, ep, "npu-worker", NULL);
        if (!d) _exit(30);
        struct bus_ticker tk;
        int64_t start = clock_ms();
        bus_ticker_init(&tk, 10, start);
        int rc = 0;
        for (int64_t now = start; now < start + 100; now = clock_ms()) {
            if (bus_heartbeat(d, &tk, MSG_HEARTBEAT, now)) rc = 31;
            usleep(1000);
        }
        bus_close(d);
        bus_ctx_free(c);
        _exit(rc);
    }
    bus_peers_init(&peers, 200);
    int beats = 0;
    struct bus_msg m;
    while (router && bus_recv(router, &m, 300) == BUS_OK) {
        if (m.type == MSG_HEARTBEAT && m.len == 0) beats++;
        bus_peers_seen(&peers, m.peer, m.peer_len, clock_ms());
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "heartbeat worker status %d", status);
    CHECK(beats >= 2 && beats <= 11, "%d beats in 100 ms at a 10 ms period", beats);
    int i = bus_peers_find(&peers, "npu-worker", 10);
    CHECK(i == 0 && !bus_peers_alive(&peers, i, clock_ms()), "silent worker declared dead");
    bus_close(router);
    bus_ctx_free(ctx);
}

/* The policies of this process's libzmq I/O threads: how many there are, how many at SCHED_FIFO. */
static void io_thread_policies(int *n, int *fifo) {
    *n = *fifo = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(comm, sizeof comm, f) && !strncmp(comm, "ZMQbg/IO", 8)) {
            (*n)++;
            *fifo += realtime_thread_is(atoi(e->d_name));
        }
        fclose(f);
    }
    closedir(d);
}

/* A joined libzmq thread stays listed in /proc/self/task (with its name and policy) until the kernel
 * has reaped it, a moment after zmq_ctx_term returns: wait until a freed context's threads are gone,
 * so that the next context's count holds its own threads only. False when they stay for 10 s. */
static bool io_threads_gone(void) {
    const int64_t t0 = clock_ms();
    for (;;) {
        int n, fifo;
        io_thread_policies(&n, &fifo);
        if (n == 0) return true;
        if (clock_ms() - t0 > 10000) return false;
        usleep(1000);
    }
}

/* A ROUTER bound at ep and a DEALER connected to it in ctx pass one message, so that libzmq's I/O
 * thread has started, named itself and taken its policy (it does so on its own, after its creation);
 * then the policies of the process's I/O threads. False when the message did not pass. */
static bool io_threads_after_a_message(bus_ctx *ctx, const char *ep, int *n, int *fifo) {
    bus_socket *router = bus_bind(ctx, BUS_ROUTER, ep, NULL);
    bus_socket *dealer = router ? bus_connect(ctx, BUS_DEALER, ep, "t", NULL) : NULL;
    struct bus_msg m;
    const bool passed =
        dealer && bus_send(dealer, MSG_HELLO, "hi", 2) == BUS_OK && bus_recv(router, &m, 10000) == BUS_OK;
    io_thread_policies(n, fifo);
    bus_close(dealer);
    bus_close(router);
    return passed;
}

/* A context's threads at SCHED_FIFO once its first socket starts them, never the caller's; without the
 * permission (or in a process that gave it up) refused with the reason, and the context still works. */
static void check_realtime_ctx(const char *ep, bool expect_allowed, const char *who) {
    bus_ctx *ctx = bus_ctx_new();
    const int rc = bus_ctx_realtime_io(ctx);
    CHECK((rc == 0) == expect_allowed, "%s: bus_ctx_realtime_io %d: %s", who, rc, rc ? bus_last_error() : "");
    if (rc) CHECK(strstr(bus_last_error(), "real-time") != NULL, "%s: the refusal says why: %s", who, bus_last_error());
    int n, fifo;
    CHECK(io_threads_after_a_message(ctx, ep, &n, &fifo), "%s: a message after the priority was asked for: %s", who,
          bus_last_error());
    CHECK(n >= 1 && fifo == (expect_allowed ? n : 0), "%s: %d of %d I/O threads at SCHED_FIFO", who, fifo, n);
    CHECK(!realtime_thread_is(0), "%s: the calling thread keeps its normal priority", who);
    bus_ctx_free(ctx);
    CHECK(io_threads_gone(), "%s: the freed context's I/O threads end", who);
}

static void test_realtime_io(void) {
    char ep[BUS_ENDPOINT_MAX];
    bus_endpoint_ipc(ep, sizeof ep, run_dir, "io", -1);
    const bool allowed = realtime_allowed();
    CHECK(!realtime_thread_is(0), "the permission probe puts the thread's policy back");
    check_realtime_ctx(ep, allowed, allowed ? "allowed" : "not allowed");
    bus_ctx *plain = bus_ctx_new();
    int n, fifo;
    const bool passed = io_threads_after_a_message(plain, ep, &n, &fifo);
    CHECK(passed && n >= 1 && fifo == 0, "a context not asked for it: %d of %d I/O threads at SCHED_FIFO", fifo, n);
    bus_ctx_free(plain);
    if (!allowed || geteuid() != 0) {
        SKIP("a process that gives up its real-time permission (needs root to drop it)");
        return;
    }
    char dir[64], child_ep[BUS_ENDPOINT_MAX];
    snprintf(dir, sizeof dir, "/tmp/pi2-test-bus-rt-%d", (int)getpid());
    if (mkdir(dir, 0700) || chown(dir, 65534, 65534)) {
        CHECK(0, "%s for nobody: %s", dir, strerror(errno));
        rmdir(dir);
        return;
    }
    bus_endpoint_ipc(child_ep, sizeof child_ep, dir, "io", -1);
    fflush(stdout); /* the child must not print the parent's buffered lines again */
    pid_t pid = fork();
    if (pid == 0) { /* nobody, with no real-time limit: the permission is gone */
        test_passed = test_failed = test_skipped = 0; /* its status reports its own checks */
        const int dropped = setrlimit(RLIMIT_RTPRIO, &(struct rlimit){0, 0}) == 0 && setgid(65534) == 0 &&
                            setuid(65534) == 0;
        if (dropped) check_realtime_ctx(child_ep, false, "after setuid(nobody)"); /* closing removes the socket file */
        else printf("FAIL could not become nobody: %s\n", strerror(errno));
        fflush(stdout);
        _exit(!dropped || test_failed ? 1 : 0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a process without the permission: status %d", st);
    CHECK(rmdir(dir) == 0, "%s left empty: %s", dir, strerror(errno));
}

int main(void) {
    char run_id[32];
    snprintf(run_id, sizeof run_id, "tbus%d", (int)getpid());
    if (rundir_path(run_dir, sizeof run_dir, run_id)) {
        fprintf(stderr, "rundir_path: %s\n", rundir_last_error());
        return 1;
    }
    atexit(cleanup);
    test_rundir();
    test_endpoints();
    test_round_trip();
    test_garbage();
    test_timeouts_and_signals();
    test_sleep();
    test_heartbeats();
    test_realtime_io();
    CHECK(count_entries(run_dir) == 0, "%d files left in %s", count_entries(run_dir), run_dir);
    CHECK(rundir_remove(run_dir) == 0 && access(run_dir, F_OK) != 0, "run dir removed: %s",
          rundir_last_error());
    return test_summary();
}

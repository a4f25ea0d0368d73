/* The io-worker process (build/bin/io-worker) on a weights segment this test
 * creates: reads (aligned, unaligned, the file's tail) land byte-for-byte as
 * pread reads them; reads outside the file or the segment are refused with an
 * Error; garbage frames and foreign messages are dropped without a crash; a
 * valid batch still works afterwards; SIGTERM exits 0. */
#include "stack/bus.h"
#include "stack/msg.h"
#include "stack/rundir.h"
#include "stack/shm.h"
#include "stack/stack.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

static char runid[64], run_dir[RUNDIR_PATH_MAX];
static pid_t worker = -1;

static void cleanup(void) {
    if (worker > 0) {
        kill(worker, SIGKILL);
        waitpid(worker, NULL, 0);
    }
    shm_unlink_run(runid);
    if (run_dir[0]) rundir_remove(run_dir);
}

static pid_t start_worker(const char *exe, const char *model) {
    pid_t pid = fork();
    if (pid == 0) {
        setenv("PI2_LOG", "error", 0); /* its WARNs about our garbage are expected */
        execl(exe, exe, "-m", model, "-r", runid, "--queue-depth", "4", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static uint64_t seq;

static int send_batch(bus_socket *s, uint64_t id, const Pi2__IoRead *reads, size_t n) {
    Pi2__IoRead *ptrs[16];
    for (size_t i = 0; i < n; i++) ptrs[i] = (Pi2__IoRead *)&reads[i];
    Pi2__IoReadBatch b = PI2__IO_READ_BATCH__INIT;
    b.batch_id = id;
    b.n_reads = n;
    b.reads = ptrs;
    Pi2__Envelope env;
    msg_envelope_init(&env, ++seq, 0);
    env.body_case = PI2__ENVELOPE__BODY_IO_READ_BATCH;
    env.io_read_batch = &b;
    uint8_t buf[4096];
    size_t len;
    if (msg_pack(&env, buf, sizeof buf, &len)) return -1;
    return bus_send(s, PI2_BUS_MSG, buf, len);
}

/* The next reply (validated), or NULL after timeout_ms. */
static Pi2__Envelope *next_reply(bus_socket *s, int timeout_ms) {
    struct bus_msg m;
    if (bus_recv(s, &m, timeout_ms) != BUS_OK || m.type != PI2_BUS_MSG) return NULL;
    char err[256];
    Pi2__Envelope *env = msg_unpack(m.data, m.len, err, sizeof err);
    msg_limits lim = {0};
    if (env && msg_validate(env, &lim, err, sizeof err)) {
        msg_free(env);
        return NULL;
    }
    return env;
}

static Pi2__IoRead io_read(uint64_t file_offset, uint32_t length, uint64_t slot_offset) {
    Pi2__IoRead r = PI2__IO_READ__INIT;
    r.file_offset = file_offset;
    r.length = length;
    r.slot_offset = slot_offset;
    return r;
}

/* Sends reads, expects IoComplete with every length read and the bytes equal to the file's. */
static void check_reads(bus_socket *s, uint64_t id, const Pi2__IoRead *reads, size_t n, int fd, const uint8_t *data,
                        const char *what) {
    CHECK(send_batch(s, id, reads, n) == BUS_OK, "%s: send", what);
    Pi2__Envelope *env = next_reply(s, 10000);
    CHECK(env && env->body_case == PI2__ENVELOPE__BODY_IO_COMPLETE, "%s: an IoComplete arrives", what);
    if (!env || env->body_case != PI2__ENVELOPE__BODY_IO_COMPLETE) {
        msg_free(env);
        return;
    }
    CHECK(env->io_complete->batch_id == id && env->io_complete->n_results == n, "%s: batch id and result count",
          what);
    for (size_t i = 0; i < n && i < env->io_complete->n_results; i++) {
        CHECK(env->io_complete->results[i] == (int32_t)reads[i].length, "%s: read %zu: result %d, want %u", what, i,
              env->io_complete->results[i], reads[i].length);
        uint8_t *want = malloc(reads[i].length);
        ssize_t got = pread(fd, want, reads[i].length, (off_t)reads[i].file_offset);
        CHECK(got == (ssize_t)reads[i].length && !memcmp(want, data + reads[i].slot_offset, reads[i].length),
              "%s: read %zu: the bytes equal the file's", what, i);
        free(want);
    }
    msg_free(env);
}

static void expect_error(bus_socket *s, const Pi2__IoRead *r, const char *what) {
    CHECK(send_batch(s, 99, r, 1) == BUS_OK, "%s: send", what);
    Pi2__Envelope *env = next_reply(s, 5000);
    CHECK(env && env->body_case == PI2__ENVELOPE__BODY_ERROR && env->error->code == PI2__ERROR_CODE__INVALID,
          "%s: answered with an INVALID Error", what);
    msg_free(env);
}

/* Malformed traffic: the worker must drop all of it and answer nothing. */
static void send_garbage(bus_socket *s, const char *endpoint) {
    uint8_t junk[300];
    srand(7);
    for (int i = 0; i < 50; i++) {
        for (size_t k = 0; k < sizeof junk; k++) junk[k] = (uint8_t)rand();
        bus_send(s, PI2_BUS_MSG, junk, (size_t)(rand() % (int)sizeof junk));
    }
    bus_send(s, 77, "hello", 5); /* an unknown type tag */
    Pi2__Envelope env;
    Pi2__Heartbeat hb = PI2__HEARTBEAT__INIT;
    msg_envelope_init(&env, ++seq, 0);
    env.body_case = PI2__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    uint8_t buf[256];
    size_t len;
    if (msg_pack(&env, buf, sizeof buf, &len) == 0) bus_send(s, PI2_BUS_MSG, buf, len); /* not its business */
    env.version = 9;
    if (msg_pack(&env, buf, sizeof buf, &len) == 0) bus_send(s, PI2_BUS_MSG, buf, len); /* another version */

    /* Frame counts the bus never produces: one frame, three frames. */
    void *zctx = zmq_ctx_new(), *z = zmq_socket(zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(z, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(z, endpoint) == 0) {
        zmq_send(z, "x", 1, 0);
        zmq_send(z, "\1\0\0\0", 4, ZMQ_SNDMORE);
        zmq_send(z, "a", 1, ZMQ_SNDMORE);
        zmq_send(z, "b", 1, 0);
    }
    nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
    zmq_close(z);
    zmq_ctx_term(zctx);
}

int main(int argc, char **argv) {
    (void)argc;
    char exe[PATH_MAX], self[PATH_MAX];
    if (!realpath(argv[0], self)) return 1;
    snprintf(exe, sizeof exe, "%s/../bin/io-worker", dirname(self));
    const char *shared = getenv("PI2_SHARED") ? getenv("PI2_SHARED") : "../shared";
    char model[PATH_MAX];
    snprintf(model, sizeof model, "%s/oracle/synth-q4_0.gguf", shared);
    int fd = open(model, O_RDONLY);
    struct stat st;
    CHECK(access(exe, X_OK) == 0, "%s is built", exe);
    CHECK(fd >= 0 && fstat(fd, &st) == 0, "model %s opens", model);
    if (fd < 0 || access(exe, X_OK)) return test_summary();
    uint64_t size = (uint64_t)st.st_size, region = (size + 4095) & ~(uint64_t)4095;

    snprintf(runid, sizeof runid, "test-io-%d", (int)getpid());
    rundir_path(run_dir, sizeof run_dir, runid);
    atexit(cleanup);
    char name[SHM_NAME_MAX];
    shm_make_name(name, sizeof name, runid, STACK_SEG_WEIGHTS);
    struct shm_region_spec spec = {"data", region, SHM_ALIGN_PAGE, 0};
    shm_segment *seg = shm_create(name, SHM_KIND_WEIGHTS, &spec, 1, 0);
    CHECK(seg != NULL, "create %s: %s", name, shm_last_error());
    if (!seg) return test_summary();
    uint8_t *data = shm_region_ptr(seg, "data", NULL);

    worker = start_worker(exe, model);
    bus_ctx *ctx = bus_ctx_new();
    char endpoint[BUS_ENDPOINT_MAX];
    rundir_create(run_dir);
    bus_endpoint_ipc(endpoint, sizeof endpoint, run_dir, "io", -1);
    bus_socket *s = bus_connect(ctx, BUS_DEALER, endpoint, "tester", NULL);
    CHECK(s != NULL, "connect %s", endpoint);
    if (!s) return test_summary();

    uint32_t tail = (uint32_t)(size % 4096 ? size % 4096 : 4096);
    Pi2__IoRead reads[] = {
        io_read(0, 4096, 0),                            /* aligned page */
        io_read(4096, 65536, 8192),                     /* aligned, several pages */
        io_read(100, 1000, 200000),                     /* unaligned: buffered */
        io_read(size - tail, tail, region - 4096),      /* the file's last bytes */
        io_read(12288, (uint32_t)(size - 12288), 0),    /* aligned head + unaligned tail, as cachemgr asks */
    };
    check_reads(s, 1, reads, 4, fd, data, "mixed reads");
    check_reads(s, 2, &reads[4], 1, fd, data, "whole data section");

    Pi2__IoRead past_file = io_read(size - 10, 20, 0);
    Pi2__IoRead past_seg = io_read(0, 4096, region - 100);
    expect_error(s, &past_file, "a read past the end of the file");
    expect_error(s, &past_seg, "a read past the end of the segment");

    send_garbage(s, endpoint);
    CHECK(waitpid(worker, NULL, WNOHANG) == 0, "the io-worker survives garbage");
    Pi2__IoRead again = io_read(8192, 8192, 16384);
    check_reads(s, 3, &again, 1, fd, data, "a batch after the garbage");
    CHECK(next_reply(s, 300) == NULL, "garbage got no answer");

    kill(worker, SIGTERM);
    int status = -1;
    for (int i = 0; i < 50 && waitpid(worker, &status, WNOHANG) == 0; i++)
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "SIGTERM: exit status 0 (status %d)", status);
    if (WIFEXITED(status) || WIFSIGNALED(status)) worker = -1;

    bus_close(s);
    bus_ctx_free(ctx);
    shm_detach(seg);
    close(fd);
    return test_summary();
}

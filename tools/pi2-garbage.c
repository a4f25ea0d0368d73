/* pi2-garbage: sends malformed and invalid frames to one endpoint of a running
 * stack, as a hostile or broken peer would, for the fault tests: broken
 * framing (missing or short type tags, extra and empty frames), random bytes
 * where an Envelope belongs, Envelopes of another version or without a body,
 * and well-formed Envelopes whose fields fail validation (out-of-range layers,
 * offsets, lengths, ids, enum zeros). Nothing it sends is a valid request, so
 * a correct receiver drops all of it and keeps serving.
 *   pi2-garbage -e ipc://RUN_DIR/coordinator.sock [-n ROUNDS] [-s SEED]
 * With --ring RUN:N it writes into cpu-worker N's bundle ring instead (a
 * budgeted stack, idle: the ring has one writer): batches of a layer and of a
 * bundle outside the model, then counters that no ring can have; the
 * io-worker must refuse the first two in their answers and empty the ring
 * for the third. With --stale-staging it sends the io-worker at ENDPOINT one
 * well-formed read into the cold region (IO_TARGET_STAGING, as a packed hot
 * region's load does), which a stack whose weights are ready must refuse:
 * exit 0 when its answer says so (-ESTALE). */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "util/cli.h"
#include "util/log.h"
#include "stack/doorbell.h"
#include "stack/msg.h"
#include "stack/shm.h"
#include "stack/stack.h"
#include "util/clock.h"

typedef struct {
    void *sock;
    long frames, messages;
} sender;

static uint64_t rng_state;

static uint64_t rng_next(void) { /* xorshift64*: reproducible with -s */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static void fill_random(uint8_t *buf, size_t n) {
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)rng_next();
}

/* One message of nframes frames; returns -1 if the peer's queue stays full. */
static int send_frames(sender *s, const void *const *data, const size_t *len, int nframes) {
    for (int i = 0; i < nframes; i++) {
        int flags = i + 1 < nframes ? ZMQ_SNDMORE : 0;
        if (zmq_send(s->sock, data[i], len[i], flags) < 0) {
            log_error("send: %s", zmq_strerror(zmq_errno()));
            return -1;
        }
        s->frames++;
    }
    s->messages++;
    return 0;
}

static int send_tagged(sender *s, uint32_t tag, const void *payload, size_t len) {
    uint8_t t[4] = {(uint8_t)tag, (uint8_t)(tag >> 8), (uint8_t)(tag >> 16), (uint8_t)(tag >> 24)};
    const void *d[2] = {t, payload};
    size_t l[2] = {sizeof t, len};
    return send_frames(s, d, l, 2);
}

static int send_envelope(sender *s, Pi2__Envelope *env) {
    size_t len;
    uint8_t *buf = msg_pack_alloc(env, &len);
    if (!buf) {
        log_error("msg_pack_alloc failed for %s", msg_body_name(env->body_case));
        return -1;
    }
    int rc = send_tagged(s, PI2_BUS_MSG, buf, len);
    free(buf);
    return rc;
}

/* Broken framing and bytes that do not decode as an Envelope. */
static int send_broken_frames(sender *s) {
    uint8_t buf[512];
    fill_random(buf, sizeof buf);
    size_t n = 1 + rng_next() % sizeof buf;
    const void *one[1] = {buf};
    size_t one_len[1] = {n};
    if (send_frames(s, one, one_len, 1)) return -1;                /* no tag frame */
    const void *short_tag[2] = {buf, buf + 3};
    size_t short_len[2] = {3, 16};
    if (send_frames(s, short_tag, short_len, 2)) return -1;        /* 3-byte tag */
    const void *three[3] = {buf, buf, buf};
    size_t three_len[3] = {4, 8, 8};
    if (send_frames(s, three, three_len, 3)) return -1;            /* an extra frame */
    const void *empty[2] = {buf, buf};
    size_t empty_len[2] = {0, 0};
    if (send_frames(s, empty, empty_len, 2)) return -1;            /* two empty frames */
    if (send_frames(s, empty, empty_len, 1)) return -1;            /* one empty frame */
    if (send_tagged(s, 0xdeadbeefu, buf, n)) return -1;            /* unknown type tag */
    if (send_tagged(s, PI2_BUS_MSG, buf, n)) return -1;            /* random bytes as an Envelope */
    if (send_tagged(s, PI2_BUS_MSG, buf, 0)) return -1;            /* empty Envelope */
    static const uint8_t no_body[] = {0x08, 0x01, 0x10, 0x07};     /* version 1, seq 7, no body */
    if (send_tagged(s, PI2_BUS_MSG, no_body, sizeof no_body)) return -1;
    static const uint8_t truncated[] = {0x08, 0x01, 0x62, 0x40, 0x08}; /* a body cut short */
    return send_tagged(s, PI2_BUS_MSG, truncated, sizeof truncated);
}

/* Well-formed Envelopes that msg_validate (or the receiver's state) must refuse. */
static int send_invalid_envelopes(sender *s) {
    Pi2__Envelope env;
    int rc = 0;

    Pi2__Heartbeat hb = PI2__HEARTBEAT__INIT; /* another protocol version */
    hb.worker_id = 1;
    msg_envelope_init(&env, rng_next(), 0);
    env.version = 99;
    env.body_case = PI2__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    rc |= send_envelope(s, &env);

    Pi2__DecodeTask dt = PI2__DECODE_TASK__INIT; /* layer, offsets and heads far out of range */
    dt.layer = 1000000;
    dt.position = 0xfffffff0u;
    dt.in_offset = UINT64_MAX - 7;
    dt.in_length = 1ull << 40;
    dt.out_offset = 1ull << 62;
    dt.out_length = 1ull << 40;
    dt.kv_end = 0xffffffffu;
    dt.head_begin = 5;
    dt.head_end = 1u << 30;
    msg_envelope_init(&env, rng_next(), 0);
    env.body_case = PI2__ENVELOPE__BODY_DECODE_TASK;
    env.decode_task = &dt;
    rc |= send_envelope(s, &env);

    Pi2__PrefillRequest pr = PI2__PREFILL_REQUEST__INIT; /* tokens far past the act segment */
    pr.n_tokens = 1u << 30;
    pr.act_offset = 1ull << 50;
    pr.act_length = 4ull << 30;
    pr.layer_end = 1u << 20;
    msg_envelope_init(&env, rng_next(), 0);
    env.body_case = PI2__ENVELOPE__BODY_PREFILL_REQUEST;
    env.prefill_request = &pr;
    rc |= send_envelope(s, &env);

    Pi2__TaskDone td = PI2__TASK_DONE__INIT; /* unknown worker, layer out of range, no status */
    td.task_seq = rng_next();
    td.worker_id = 0;
    td.layer = 1u << 20;
    td.out_offset = UINT64_MAX;
    td.out_length = UINT64_MAX;
    msg_envelope_init(&env, rng_next(), 0);
    env.body_case = PI2__ENVELOPE__BODY_TASK_DONE;
    env.task_done = &td;
    rc |= send_envelope(s, &env);

    Pi2__Register reg = PI2__REGISTER__INIT; /* kind unspecified */
    reg.worker_index = 1u << 30;
    reg.threads = 1u << 30;
    msg_envelope_init(&env, rng_next(), 0);
    env.body_case = PI2__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    rc |= send_envelope(s, &env);

    Pi2__IoRead rd = PI2__IO_READ__INIT; /* a read outside the file into outside the segment */
    rd.file_offset = 1ull << 60;
    rd.length = 0x7fffffffu;
    rd.slot_offset = 1ull << 62;
    Pi2__IoRead *rds[1] = {&rd};
    Pi2__IoReadBatch rb = PI2__IO_READ_BATCH__INIT;
    rb.batch_id = rng_next();
    rb.n_reads = 1;
    rb.reads = rds;
    msg_envelope_init(&env, rng_next(), 0);
    env.body_case = PI2__ENVELOPE__BODY_IO_READ_BATCH;
    env.io_read_batch = &rb;
    rc |= send_envelope(s, &env);

    uint32_t ids[2] = {0xfffffff0u, 7};
    Pi2__NeuronCluster nc = PI2__NEURON_CLUSTER__INIT; /* neuron ids past n_ff, layer past n_layer */
    nc.layer = 1u << 20;
    nc.n_neuron_ids = 2;
    nc.neuron_ids = ids;
    Pi2__NeuronCluster *ncs[1] = {&nc};
    Pi2__CacheAcquire ca = PI2__CACHE_ACQUIRE__INIT;
    ca.n_clusters = 1;
    ca.clusters = ncs;
    msg_envelope_init(&env, rng_next(), 0);
    env.body_case = PI2__ENVELOPE__BODY_CACHE_ACQUIRE;
    env.cache_acquire = &ca;
    rc |= send_envelope(s, &env);

    Pi2__GenerateRequest gr = PI2__GENERATE_REQUEST__INIT; /* n_predict over the limit */
    static uint8_t prompt_with_nul[] = {'h', 'i', 0, 'x'};
    gr.n_predict = MSG_MAX_PREDICT + 1;
    msg_envelope_init(&env, rng_next(), 0);
    env.body_case = PI2__ENVELOPE__BODY_GENERATE_REQUEST;
    env.generate_request = &gr;
    rc |= send_envelope(s, &env);
    gr.n_predict = 4; /* a NUL byte in the prompt */
    gr.prompt.data = prompt_with_nul;
    gr.prompt.len = sizeof prompt_with_nul;
    rc |= send_envelope(s, &env);

    size_t big = MSG_MAX_PROMPT + 1; /* a prompt over the limit */
    uint8_t *long_prompt = malloc(big);
    if (!long_prompt) return -1;
    memset(long_prompt, 'a', big);
    gr.prompt.data = long_prompt;
    gr.prompt.len = big;
    rc |= send_envelope(s, &env);
    free(long_prompt);
    return rc ? -1 : 0;
}

/* Last: a frame larger than any receiver's max_frame (libzmq drops the peer). */
static int send_oversized(sender *s) {
    size_t n = (size_t)MSG_MAX_FRAME + 4096;
    uint8_t *buf = calloc(1, n);
    if (!buf) return -1;
    int rc = send_tagged(s, PI2_BUS_MSG, buf, n);
    free(buf);
    return rc;
}

/* ---- --ring ---- */

/* Waits up to 10 s for the io-worker to answer batch id in r (or reset r when resets is not 0). */
static int ring_wait(bundle_ring *r, int bell, uint64_t id, uint64_t resets, const char *what) {
    char why[BUNDLE_RING_ERROR];
    for (int64_t t0 = clock_ms(); clock_ms() - t0 < 10000;) {
        doorbell_ring(bell);
        const int out = bundle_ring_outcome(r, id, resets, why, sizeof why);
        if (out < 0) {
            printf("%s: refused: %s\n", what, why);
            return 0;
        }
        if (out > 0) {
            log_error("%s: answered as if it had been read", what);
            return -1;
        }
        usleep(10000);
    }
    log_error("%s: no answer in 10 s", what);
    return -1;
}

static int hostile_ring(const char *spec) {
    char runid[64];
    int worker;
    if (sscanf(spec, "%63[^:]:%d", runid, &worker) != 2 || worker < 0 || worker >= STACK_MAX_CPU_WORKERS) {
        log_error("--ring %s: not RUN:N with N a cpu-worker index", spec);
        return 2;
    }
    char name[SHM_NAME_MAX], err[512];
    shm_segment *seg = shm_make_name(name, sizeof name, runid, STACK_SEG_CTL) ? NULL
                       : shm_attach(name, SHM_KIND_CONTROL, 0);
    uint64_t bytes = 0;
    stack_ctl *ctl = seg ? shm_region_ptr(seg, "ctl", &bytes) : NULL;
    if (!ctl || bytes < sizeof *ctl || ctl->magic != STACK_CTL_MAGIC) {
        log_error("run '%s': no control block (%s)", runid, shm_last_error());
        return 1;
    }
    const int bell = doorbell_open(runid, err, sizeof err);
    if (bell < 0) {
        log_error("%s", err);
        return 1;
    }
    bundle_ring *r = &ctl->bundle_rings[worker];
    const uint64_t pid = (uint64_t)getpid() << 32;
    const uint32_t ids[2] = {0, 1u << 30};
    int rc = 0;
    if (bundle_ring_push(r, pid | 1, 1u << 30, ids, 1) ||
        ring_wait(r, bell, pid | 1, atomic_load(&r->resets), "a layer outside the model"))
        rc = 1;
    if (rc == 0 && (bundle_ring_push(r, pid | 2, 0, ids, 2) ||
                    ring_wait(r, bell, pid | 2, atomic_load(&r->resets), "a bundle outside the model")))
        rc = 1;
    if (rc == 0) {
        const uint64_t resets = atomic_load(&r->resets);
        atomic_store(&r->tail, atomic_load(&r->head) + BUNDLE_RING_WORDS + 4);
        if (ring_wait(r, bell, pid | 3, resets, "counters apart by more than the ring")) rc = 1;
    }
    close(bell);
    shm_detach(seg);
    return rc;
}

/* A cachemgr's staging read, after the load: the answer must refuse it. */
static int stale_staging(sender *s) {
    Pi2__IoRead rd = PI2__IO_READ__INIT; /* the bundle file's first page into the cold region's first */
    rd.length = 4096;
    Pi2__IoRead *rds[1] = {&rd};
    Pi2__IoReadBatch rb = PI2__IO_READ_BATCH__INIT;
    rb.batch_id = 1;
    rb.target = PI2__IO_TARGET__IO_TARGET_STAGING;
    rb.n_reads = 1;
    rb.reads = rds;
    Pi2__Envelope env;
    msg_envelope_init(&env, 1, 0);
    env.body_case = PI2__ENVELOPE__BODY_IO_READ_BATCH;
    env.io_read_batch = &rb;
    if (send_envelope(s, &env)) return 1;
    int timeout = 30000;
    zmq_setsockopt(s->sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    uint8_t tag[4], buf[4096];
    int more = 0, n = (int)zmq_recv(s->sock, tag, sizeof tag, 0);
    size_t more_len = sizeof more;
    zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &more_len);
    const int len = n == 4 && more ? (int)zmq_recv(s->sock, buf, sizeof buf, 0) : -1;
    char err[256];
    Pi2__Envelope *got = len > 0 && len <= (int)sizeof buf ? msg_unpack(buf, (size_t)len, err, sizeof err) : NULL;
    if (!got || got->body_case != PI2__ENVELOPE__BODY_IO_COMPLETE || got->io_complete->n_results != 1) {
        log_error("no IoComplete for the staging read within %d ms", timeout);
        msg_free(got);
        return 1;
    }
    const int32_t result = got->io_complete->results[0];
    msg_free(got);
    printf("staging read after the load: %s (%d)\n", result == -ESTALE ? "refused" : "served", result);
    return result == -ESTALE ? 0 : 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: pi2-garbage -e ENDPOINT [-n ROUNDS] [-s SEED] [--no-oversized]\n"
            "       pi2-garbage --ring RUN:N\n"
            "       pi2-garbage -e IO_ENDPOINT --stale-staging\n"
            "  -e, --endpoint E    where to send, e.g. ipc:///tmp/pi2-0-default/coordinator.sock\n"
            "  -n, --rounds N      rounds of broken frames and invalid Envelopes (default 20)\n"
            "  -s, --seed S        seed of the random bytes (default 1)\n"
            "      --no-oversized  skip the final frame larger than MSG_MAX_FRAME\n"
            "      --ring RUN:N    hostile batches in cpu-worker N's bundle ring of budgeted run RUN\n"
            "                      (while it is idle); exit 0 when the io-worker refused each\n"
            "      --stale-staging one read into the cold region of a budgeted stack whose weights\n"
            "                      are loaded; exit 0 when the io-worker refused it\n"
            "  -h, --help          this help\n"
            "Connects a DEALER (identity garbage-<pid>) and sends frames that a correct\n"
            "receiver must drop; prints how many it sent.\n");
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    enum { OPT_NO_OVERSIZED = 256, OPT_RING, OPT_STALE_STAGING };
    static const struct option longopts[] = {
        {"endpoint", required_argument, 0, 'e'}, {"rounds", required_argument, 0, 'n'},
        {"seed", required_argument, 0, 's'},     {"no-oversized", no_argument, 0, OPT_NO_OVERSIZED},
        {"ring", required_argument, 0, OPT_RING}, {"stale-staging", no_argument, 0, OPT_STALE_STAGING},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *endpoint = NULL;
    long rounds = 20;
    int oversized = 1, staging = 0;
    rng_state = 1;
    int c;
    char *end;
    while ((c = getopt_long(argc, argv, "e:n:s:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'e': endpoint = optarg; break;
        case 'n':
            if (cli_parse_long(optarg, "-n", 1, 100000, &rounds)) return 2;
            break;
        case 's':
            rng_state = strtoull(optarg, &end, 10);
            if (*optarg == 0 || *end) {
                log_error("-s: '%s' is not an integer", optarg);
                return 2;
            }
            if (rng_state == 0) rng_state = 1; /* xorshift's one fixed point */
            break;
        case OPT_NO_OVERSIZED: oversized = 0; break;
        case OPT_STALE_STAGING: staging = 1; break;
        case OPT_RING: return optind == argc ? hostile_ring(optarg) : (usage(stderr), 2);
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!endpoint || optind != argc) {
        usage(stderr);
        return 2;
    }
    void *ctx = zmq_ctx_new();
    sender s = {.sock = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL};
    if (!s.sock) {
        log_error("zmq socket: %s", zmq_strerror(zmq_errno()));
        return 1;
    }
    char identity[32];
    int idlen = snprintf(identity, sizeof identity, "garbage-%d", (int)getpid());
    int linger = 2000, sndtimeo = 2000;
    zmq_setsockopt(s.sock, ZMQ_ROUTING_ID, identity, (size_t)idlen);
    zmq_setsockopt(s.sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s.sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    int rc = 0;
    if (zmq_connect(s.sock, endpoint)) {
        log_error("connect %s: %s", endpoint, zmq_strerror(zmq_errno()));
        rc = 1;
    }
    if (staging) {
        if (rc == 0) rc = stale_staging(&s);
    } else {
        for (long r = 0; rc == 0 && r < rounds; r++)
            if (send_broken_frames(&s) || send_invalid_envelopes(&s)) rc = 1;
        if (rc == 0 && oversized && send_oversized(&s)) rc = 1;
        if (rc == 0) printf("%s: sent %ld messages (%ld frames)\n", endpoint, s.messages, s.frames);
    }
    zmq_close(s.sock); /* lingers up to 2 s so the frames actually leave */
    zmq_ctx_term(ctx);
    return rc;
}

/* Loading the weights segment through the io-worker: the file range
 * [weights_file_offset, end) as reads of at most 4 MiB, grouped in batches,
 * several batches in flight. A batch not answered in time is sent again (the
 * io-worker may have been restarted); reads are idempotent, so a late or
 * duplicate answer does no harm (a packed hot region's staging buffer that
 * a second send may still read into is retired: hot_staging.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stack/bus.h"
#include "cachemgr.h"
#include "hot_staging.h"
#include "util/clock.h"
#include "util/log.h"
#include "stack/msg.h"
#include "stack/rundir.h"

#define READ_BYTES (4u << 20)  /* one read; a multiple of 4096, so O_DIRECT stays aligned */
#define READS_PER_BATCH 8u
_Static_assert(HOT_STAGING_MAX_BYTES / READ_BYTES <= READS_PER_BATCH, "a staged chunk's reads fit one batch");
#define BATCHES_IN_FLIGHT 4
#define MAX_ATTEMPTS 4         /* a batch whose reads keep failing ends the load */

enum batch_state { BATCH_PENDING, BATCH_SENT, BATCH_DONE };

/* Hot bundles a batch stages (IO_TARGET_STAGING): its reads' slot_offset is within the buffer. */
typedef struct {
    int layer;
    long first, n;
    int buffer;                /* the staging buffer it holds, -1 before its first send */
    bool resent;               /* sent again after a timeout: an earlier send's reads may land later */
} staged;

typedef struct {
    uint64_t id;
    size_t first, n;           /* reads [first, first + n) */
    enum batch_state state;
    int64_t sent_ms;
    int attempts;              /* answers with failed reads */
    staged stage;              /* layer -1: not staged */
} batch;

typedef struct {
    cachemgr *c;
    bus_socket *sock;
    Pi2__IoRead *reads;        /* every read of the load */
    Pi2__IoTarget *targets;    /* [n_reads]: where each read goes */
    size_t *chunk_of;          /* [n_reads]: the span (a staged chunk, or a range) each read belongs to */
    batch *batches;
    size_t n_reads, n_batches, n_done, in_flight;
    hot_staging staging;       /* a packed hot region: its buffers in the cold region */
    uint8_t *hot, *cold;
    staged *chunks;            /* [n spans]: what each staged span holds (layer -1: not staged) */
    uint64_t seq;
    msg_limits lim;
} loader;

static bus_socket *connect_io(const char *runid, bus_ctx *ctx) {
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
    bus_socket *s = bus_connect(ctx, BUS_DEALER, endpoint, "cachemgr", &opts);
    if (!s) log_error("connect %s: %s", endpoint, bus_last_error());
    return s;
}

/* A file range to read into a destination, cut into reads of READ_BYTES. */
typedef struct {
    Pi2__IoTarget target;
    uint64_t file_offset, bytes, dest;
    staged stage;              /* IO_TARGET_STAGING: the hot bundles; dest is 0, the buffer's start */
} span;

static size_t span_reads(const span *s) { return (size_t)((s->bytes + READ_BYTES - 1) / READ_BYTES); }

static const staged NOT_STAGED = {.layer = -1, .buffer = -1};

/* What to read: the model file from weights_file_offset on, or, under a
 * budget, the preloaded ranges and every layer's hot bundles (straight into
 * the hot region, or in chunks through the staging buffers when it is
 * packed). *n spans. */
static span *plan_spans(const loader *L, size_t *n) {
    const cachemgr *c = L->c;
    const model *m = &c->m;
    if (!c->budgeted) {
        span *s = malloc(sizeof *s);
        if (s)
            s[0] = (span){PI2__IO_TARGET__IO_TARGET_WEIGHTS, weights_file_offset(m),
                          m->gguf.size - weights_file_offset(m), 0, NOT_STAGED};
        *n = 1;
        return s;
    }
    const offload *o = &c->off;
    const bool packed = offload_hot_packed(o);
    const long chunk = packed ? hot_staging_chunk_bundles(&L->staging, o) : o->n_bundles;
    size_t max = (size_t)o->n_ranges;
    for (int l = 0; l < m->n_layer; l++) max += (size_t)((o->plan->hot_bundles[l] + chunk - 1) / chunk);
    span *s = malloc(sizeof *s * (max ? max : 1));
    if (!s) return NULL;
    size_t k = 0;
    for (int i = 0; i < o->n_ranges; i++) {
        const preload_range *r = &o->ranges[i];
        uint64_t end = r->file_offset + r->bytes < m->gguf.size ? r->file_offset + r->bytes : m->gguf.size;
        s[k++] = (span){PI2__IO_TARGET__IO_TARGET_WEIGHTS, r->file_offset, end - r->file_offset, r->seg_offset,
                        NOT_STAGED};
    }
    for (int l = 0; l < m->n_layer; l++) {
        uint64_t off, bytes;
        offload_hot_range(o, l, &off, &bytes);
        if (!bytes) continue;
        if (!packed) {
            s[k++] = (span){PI2__IO_TARGET__IO_TARGET_HOT, off, bytes, o->hot_offset[l], NOT_STAGED};
            continue;
        }
        for (long b = 0; b < (long)o->plan->hot_bundles[l]; b += chunk) {
            const long n_b = (long)o->plan->hot_bundles[l] - b < chunk ? (long)o->plan->hot_bundles[l] - b : chunk;
            s[k++] = (span){PI2__IO_TARGET__IO_TARGET_STAGING, bundle_file_offset(&o->bundles, l, b),
                            (uint64_t)n_b * o->stride, 0, {.layer = l, .first = b, .n = n_b, .buffer = -1}};
        }
    }
    *n = k;
    return s;
}

/* Cuts the spans into reads and the reads into batches of one target. */
static int plan_reads(loader *L) {
    size_t n_spans;
    span *spans = plan_spans(L, &n_spans);
    if (!spans) return -1;
    L->n_reads = 0;
    for (size_t i = 0; i < n_spans; i++) L->n_reads += span_reads(&spans[i]);
    L->reads = calloc(L->n_reads ? L->n_reads : 1, sizeof *L->reads);
    L->targets = calloc(L->n_reads ? L->n_reads : 1, sizeof *L->targets);
    L->chunk_of = calloc(L->n_reads ? L->n_reads : 1, sizeof *L->chunk_of);
    L->batches = calloc(L->n_reads ? L->n_reads : 1, sizeof *L->batches); /* at most one per read */
    L->chunks = calloc(n_spans ? n_spans : 1, sizeof *L->chunks);
    if (!L->reads || !L->targets || !L->chunk_of || !L->batches || !L->chunks) {
        free(spans);
        return -1;
    }
    for (size_t i = 0; i < n_spans; i++) L->chunks[i] = spans[i].stage;
    size_t r = 0;
    for (size_t i = 0; i < n_spans; i++)
        for (uint64_t at = 0; at < spans[i].bytes; at += READ_BYTES, r++) {
            pi2__io_read__init(&L->reads[r]);
            L->reads[r].file_offset = spans[i].file_offset + at;
            L->reads[r].length = (uint32_t)(spans[i].bytes - at < READ_BYTES ? spans[i].bytes - at : READ_BYTES);
            L->reads[r].slot_offset = spans[i].dest + at;
            L->targets[r] = spans[i].target;
            L->chunk_of[r] = i;
        }
    free(spans);
    /* Ids carry our pid: answers meant for a previous cachemgr of the run are told apart. */
    uint64_t nonce = (uint64_t)getpid() << 32;
    L->n_batches = 0;
    for (size_t first = 0; first < L->n_reads;) {
        /* a staged chunk is one batch: it lands, and is checked, as one */
        const bool stage = L->targets[first] == PI2__IO_TARGET__IO_TARGET_STAGING;
        size_t n = 1;
        while (n < READS_PER_BATCH && first + n < L->n_reads && L->targets[first + n] == L->targets[first] &&
               (!stage || L->chunk_of[first + n] == L->chunk_of[first]))
            n++;
        L->batches[L->n_batches] = (batch){.id = nonce | (L->n_batches + 1), .first = first, .n = n,
                                           .stage = L->chunks[L->chunk_of[first]]};
        L->n_batches++;
        first += n;
    }
    return 0;
}

static int send_batch(loader *L, batch *b) {
    Pi2__IoRead *ptrs[READS_PER_BATCH], moved[READS_PER_BATCH];
    for (size_t i = 0; i < b->n; i++) ptrs[i] = &L->reads[b->first + i];
    if (b->stage.layer >= 0) { /* into its staging buffer */
        const uint64_t base = (uint64_t)b->stage.buffer * L->staging.buffer_bytes;
        for (size_t i = 0; i < b->n; i++) {
            moved[i] = L->reads[b->first + i];
            moved[i].slot_offset += base;
            ptrs[i] = &moved[i];
        }
    }
    Pi2__IoReadBatch body = PI2__IO_READ_BATCH__INIT;
    body.batch_id = b->id;
    body.target = L->targets[b->first];
    body.n_reads = b->n;
    body.reads = ptrs;
    Pi2__Envelope env;
    msg_envelope_init(&env, ++L->seq, 0);
    env.body_case = PI2__ENVELOPE__BODY_IO_READ_BATCH;
    env.io_read_batch = &body;
    uint8_t buf[4096];
    size_t len;
    if (msg_pack(&env, buf, sizeof buf, &len)) {
        log_error("cannot pack an IoReadBatch");
        return -1;
    }
    int rc = bus_send(L->sock, PI2_BUS_MSG, buf, len);
    if (rc != BUS_OK) return rc == BUS_TIMEOUT ? 0 : -1; /* a full queue: try again later */
    b->state = BATCH_SENT;
    b->sent_ms = clock_ms();
    L->in_flight++;
    return 0;
}

/* Sends pending batches while fewer than BATCHES_IN_FLIGHT are out, and
 * takes back those unanswered for too long. */
static int pump(loader *L) {
    int64_t now = clock_ms();
    for (size_t i = 0; i < L->n_batches; i++) {
        batch *b = &L->batches[i];
        if (b->state == BATCH_SENT && now - b->sent_ms > L->c->io_timeout_ms) {
            log_warn("read batch %zu not answered within %d ms (io-worker restarted?); sending it again", i,
                     L->c->io_timeout_ms);
            b->state = BATCH_PENDING;
            L->in_flight--;
            b->stage.resent = true; /* sent again into the same buffer: the same bytes, whichever lands */
        }
    }
    for (size_t i = 0; i < L->n_batches && L->in_flight < BATCHES_IN_FLIGHT; i++) {
        batch *b = &L->batches[i];
        if (b->state != BATCH_PENDING) continue;
        if (b->stage.layer >= 0 && b->stage.buffer < 0 && (b->stage.buffer = hot_staging_take(&L->staging)) < 0) {
            if (!hot_staging_exhausted(&L->staging)) break; /* the buffers are busy: in order, after them */
            log_error("every staging buffer of the hot region was retired: the io-worker answered %d batches late",
                      L->staging.n_buffers);
            return -1;
        }
        if (send_batch(L, b)) return -1;
    }
    return 0;
}

/* A staged batch's bundles are all in: checked and copied to the hot region, its buffer free again (or
 * retired, when a send of it may still be reading into it). */
static int land_staged(loader *L, batch *b) {
    if (b->stage.layer < 0) return 0;
    const int rc = hot_staging_land(&L->staging, &L->c->off, b->stage.buffer, L->cold, L->hot, b->stage.layer,
                                    b->stage.first, b->stage.n);
    if (b->stage.resent) hot_staging_retire(&L->staging, b->stage.buffer);
    hot_staging_give(&L->staging, b->stage.buffer);
    return rc;
}

static batch *find_batch(loader *L, uint64_t id) {
    uint64_t index = (id & 0xffffffffu) - 1;
    if (id >> 32 != (uint64_t)getpid() || index >= L->n_batches) return NULL;
    return &L->batches[index];
}

/* Checks an IoComplete against its batch; -1 ends the load. */
static int take_completion(loader *L, const Pi2__IoComplete *done) {
    batch *b = find_batch(L, done->batch_id);
    if (!b || b->state == BATCH_DONE) return 0; /* a duplicate or a predecessor's answer */
    if (done->n_results != b->n) {
        log_warn("IoComplete for batch %llu has %zu results, not %zu; ignored", (unsigned long long)done->batch_id,
                 done->n_results, b->n);
        return 0;
    }
    for (size_t i = 0; i < b->n; i++) {
        const Pi2__IoRead *r = &L->reads[b->first + i];
        int32_t got = done->results[i];
        if (got == (int32_t)r->length) continue;
        if (b->state == BATCH_SENT) L->in_flight--;
        b->state = BATCH_PENDING;
        char what[128];
        if (got < 0) snprintf(what, sizeof what, "%s", strerror(-got));
        else snprintf(what, sizeof what, "%d of %u bytes (the file shrank?)", got, r->length);
        if (++b->attempts >= MAX_ATTEMPTS) {
            log_error("reading the %s at offset %llu failed %d times: %s",
                      L->targets[b->first] != PI2__IO_TARGET__IO_TARGET_WEIGHTS ? "bundle file" : "model",
                      (unsigned long long)r->file_offset, b->attempts, what);
            return -1;
        }
        log_warn("read at offset %llu: %s; retrying the batch", (unsigned long long)r->file_offset, what);
        return 0;
    }
    if (b->state == BATCH_SENT) L->in_flight--;
    b->state = BATCH_DONE;
    L->n_done++;
    return land_staged(L, b);
}

/* One message from the io-worker; -1 ends the load. */
static int receive(loader *L, const struct bus_msg *m) {
    char err[512];
    if (m->type != PI2_BUS_MSG) {
        log_warn("dropped a message of type %u from the io-worker", m->type);
        return 0;
    }
    Pi2__Envelope *env = msg_unpack(m->data, m->len, err, sizeof err);
    if (!env) {
        log_warn("dropped a message from the io-worker: %s", err);
        return 0;
    }
    int rc = 0;
    if (msg_validate(env, &L->lim, err, sizeof err)) {
        log_warn("dropped an invalid %s: %s", msg_body_name(env->body_case), err);
    } else if (env->body_case == PI2__ENVELOPE__BODY_IO_COMPLETE) {
        rc = take_completion(L, env->io_complete);
    } else if (env->body_case == PI2__ENVELOPE__BODY_ERROR) {
        log_error("the io-worker refused our reads: %s", env->error->message);
        rc = -1;
    } else {
        log_warn("dropped an unexpected %s from the io-worker", msg_body_name(env->body_case));
    }
    msg_free(env);
    return rc;
}

static int run(loader *L) {
    int64_t last_progress = clock_ms();
    while (L->n_done < L->n_batches) {
        if (proc_stop) return 1;
        cm_beat(L->c, PROC_STARTING);
        if (pump(L)) return -1;
        struct bus_msg m;
        int rc = bus_recv(L->sock, &m, 100);
        if (rc == BUS_OK && receive(L, &m)) return -1;
        if (rc == BUS_ERR) {
            log_error("receive: %s", bus_last_error());
            return -1;
        }
        if (clock_ms() - last_progress > 5000) {
            log_info("loading: %zu of %zu batches done", L->n_done, L->n_batches);
            last_progress = clock_ms();
        }
    }
    return 0;
}

/* A packed hot region's staging buffers, in the cold region. */
static int staging_open(loader *L) {
    uint64_t hot_bytes, cold_bytes;
    L->hot = shm_region_ptr(L->c->seg[SEG_FFN], "hot", &hot_bytes);
    L->cold = shm_region_ptr(L->c->seg[SEG_FFN], "cold", &cold_bytes);
    if (!L->hot || !L->cold || hot_bytes < L->c->off.hot_bytes ||
        hot_staging_init(&L->staging, &L->c->off, cold_bytes)) {
        log_error("the neuron cache segment has no hot region of %llu bytes, or no cold region to stage its load in",
                  (unsigned long long)L->c->off.hot_bytes);
        return -1;
    }
    log_info("hot region packed: %zu of each %zu-byte bundle kept; its load staged in %d buffers of %.1f MiB",
             L->c->off.hot_stride, L->c->off.stride, L->staging.n_buffers, L->staging.buffer_bytes / 1048576.0);
    return 0;
}

int cm_load_weights(cachemgr *c) {
    bus_ctx *ctx = bus_ctx_new();
    if (!ctx) {
        log_error("bus: %s", bus_last_error());
        return -1;
    }
    loader L = {.c = c,
                .lim = {.model_file_size = c->m.gguf.size, .weight_segment_size = c->weights_bytes}};
    int rc = -1;
    if (!(L.sock = connect_io(c->runid, ctx)) || (c->budgeted && offload_hot_packed(&c->off) && staging_open(&L)))
        goto out;
    if (plan_reads(&L)) {
        log_error("out of memory planning %zu reads", L.n_reads);
        goto out;
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < L.n_reads; i++) bytes += L.reads[i].length;
    log_info("loading %.3f GB of weights through the io-worker (%zu reads in %zu batches)", (double)bytes / 1e9,
             L.n_reads, L.n_batches);
    double t0 = clock_seconds();
    rc = run(&L);
    if (rc == 0 && c->budgeted && cm_ready_cache(c)) rc = -1;
    /* under a budget the page cache counts against it: the pages read for the predictor copy and the checks */
    if (rc == 0 && c->budgeted && model_release_file_pages(&c->m, c->model_path))
        log_warn("%s: cannot drop its pages from the page cache: %s", c->model_path, strerror(errno));
    if (rc == 0) {
        double dt = clock_seconds() - t0;
        uint64_t gen = shm_generation(c->seg[SEG_WEIGHTS]);
        atomic_store(&c->ctl->weights_ready, gen);
        log_info("weights loaded: %.3f GB in %.3f s (%.2f GB/s); weights_ready = %llu", (double)bytes / 1e9, dt,
                 dt > 0 ? (double)bytes / 1e9 / dt : 0.0, (unsigned long long)gen);
    }
out:
    hot_staging_free(&L.staging);
    free(L.reads);
    free(L.targets);
    free(L.chunk_of);
    free(L.chunks);
    free(L.batches);
    bus_close(L.sock);
    bus_ctx_free(ctx);
    return rc;
}

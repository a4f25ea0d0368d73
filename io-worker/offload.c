/* The io-worker's part in a stack under a memory budget (docs/offload.md):
 * reading the hot region at start-up (IoReadBatch with IO_TARGET_HOT) and
 * the cpu-workers' misses (BundleLoad) from the plan's bundle file, through
 * a ring of its own, into the neuron cache segment. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io_worker.h"
#include "plan/plan_file.h"
#include "util/clock.h"
#include "util/log.h"
#include "stack/doorbell.h"
#include "stack/msg.h"

enum { FAULT_EIO = 1, FAULT_SHORT, FAULT_CORRUPT };

/* PI2_BUNDLE_FAULT=eio:N|short:N|corrupt:N spoils the next N bundle reads
 * (tests: fewer than BUNDLE_READ_TRIES are retried away, more end the
 * generation with the error). */
static void parse_fault(io_worker *w) {
    const char *v = getenv("PI2_BUNDLE_FAULT");
    if (!v) return;
    static const char *kinds[] = {NULL, "eio:", "short:", "corrupt:"};
    for (int k = FAULT_EIO; k <= FAULT_CORRUPT; k++)
        if (!strncmp(v, kinds[k], strlen(kinds[k]))) {
            w->bundle_fault_kind = k;
            w->bundle_fault_left = strtoull(v + strlen(kinds[k]), NULL, 10);
            log_warn("PI2_BUNDLE_FAULT: the next %llu bundle reads fail (%s)", (unsigned long long)w->bundle_fault_left, v);
            return;
        }
    log_warn("PI2_BUNDLE_FAULT=%s is not eio:N, short:N or corrupt:N; ignored", v);
}

static void spoil_read(void *ctx, const bundle_key *key, io_job *job) {
    (void)key;
    io_worker *w = ctx;
    if (!w->bundle_fault_left || job->result <= 0) return;
    w->bundle_fault_left--;
    if (w->bundle_fault_kind == FAULT_EIO) job->result = -EIO;
    else if (w->bundle_fault_kind == FAULT_SHORT) job->result /= 2;
    else ((uint8_t *)job->dest)[job->length / 2] ^= 0x5a;
}

void iow_close_offload(io_worker *w) {
    bundle_loader_drain(&w->loader); /* reads in flight land in the segment: it stays until they are done */
    const bundle_load_stats *st = &w->loader.stats;
    if (st->batches)
        log_info("bundle loads: %llu batches (%.2f ms each from start to answer), %llu bundles (%.1f MB), "
                 "%llu asked for already cached or being read, %llu read again, %llu bad checksums",
                 (unsigned long long)st->batches, st->batch_us / 1e3 / st->batches, (unsigned long long)st->bundles,
                 st->bytes / 1e6, (unsigned long long)st->already, (unsigned long long)st->retries,
                 (unsigned long long)st->bad_checksums);
    if (w->bell_fd >= 0) close(w->bell_fd);
    w->bell_fd = -1;
    ncache_detach(w->cache);
    shm_detach(w->ffn_seg);
    file_reader_close(w->bundle_reader);
    offload_close(&w->off);
    if (w->budgeted) model_free(&w->m);
    w->cache = NULL;
    w->ffn_seg = NULL;
    w->bundle_reader = NULL;
    w->hot = w->cold = NULL;
    w->budgeted = false;
}

/* The plan's depth (the one its hardware profile found within 10 % of the
 * best rate) for each cpu-worker: every worker's batch of a layer is read at
 * once, none queues behind another's. On the 7B file at 2 GiB, 128 reads in
 * flight for two workers decoded 1.21-1.27x as fast as 64, and 256 no faster
 * than 128 (BENCHMARKS.md). */
static unsigned bundle_queue_depth(const io_worker *w) {
    if (w->queue_depth) return (unsigned)w->queue_depth;
    return plan_reads_in_flight(w->off.plan->queue_depth, w->off.plan->cpu_workers);
}

int iow_open_offload(io_worker *w) {
    if (w->budgeted && !shm_is_stale(w->ffn_seg)) return 0;
    if (w->budgeted) {
        log_info("the neuron cache segment was replaced; re-attaching");
        iow_close_offload(w);
    }
    if (!w->ctl) { /* cachemgr made the control segment before asking for reads: attach it now, not at the next try */
        w->next_ctl_try_ms = 0;
        iow_beat(w);
    }
    if (!w->ctl || !w->ctl->plan_path[0]) return w->ctl ? 0 : -1;
    char err[1024], name[SHM_NAME_MAX];
    if (model_load(&w->m, w->model_path, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    w->budgeted = true; /* from here iow_close_offload frees the model */
    if (offload_open(&w->off, &w->m, w->model_path, w->ctl->plan_path, false, err, sizeof err)) {
        log_error("%s", err);
        goto fail;
    }
    const unsigned depth = bundle_queue_depth(w);
    if (!(w->bundle_reader = file_reader_open(w->off.bundle_path, depth, err, sizeof err))) {
        log_error("%s", err);
        goto fail;
    }
    if (shm_make_name(name, sizeof name, w->runid, STACK_SEG_FFN) ||
        !(w->ffn_seg = shm_attach(name, SHM_KIND_SLOTS, SHM_ATTACH_NO_POPULATE)) ||
        !(w->hot = shm_region_ptr(w->ffn_seg, "hot", &w->hot_bytes)) ||
        !(w->cold = shm_region_ptr(w->ffn_seg, "cold", &w->cold_bytes))) {
        log_error("neuron cache segment %s: %s", name, shm_last_error());
        goto fail;
    }
    w->loader = (bundle_loader){.b = &w->off.bundles, .path = w->off.bundle_path, .reader = w->bundle_reader,
                                .verify = w->verify, .fault = spoil_read, .fault_ctx = w};
    parse_fault(w);
    if ((w->bell_fd = doorbell_open(w->runid, err, sizeof err)) < 0)
        log_warn("doorbell: %s; while idle the cpu-workers' rings are looked at every 100 ms", err);
    log_info("budgeted stack: bundles from %s, %u cold slots of %zu bytes, %u reads in flight by %s%s",
             w->off.bundle_path, w->off.cold_slots, w->off.stride, depth, file_reader_engine(w->bundle_reader),
             w->verify ? "" : ", checksums not checked");
    return 0;
fail:
    iow_close_offload(w);
    return -1;
}

int iow_attach_cache(io_worker *w) {
    if (w->cache) return 0;
    if (!w->ctl || !atomic_load(&w->ctl->weights_ready)) return -1;
    char err[512];
    if (!(w->cache = offload_cache_attach(w->ffn_seg, err, sizeof err))) {
        log_error("slot table: %s", err);
        return -1;
    }
    ncache_writer_restart(w->cache); /* slots a killed predecessor left loading */
    w->loader.cache = w->cache;
    uint64_t cold_bytes;
    uint8_t *cold = shm_region_ptr(w->ffn_seg, "cold", &cold_bytes);
    int rc = cold ? file_reader_register_buffer(w->bundle_reader, cold, cold_bytes) : -EINVAL;
    if (rc == -EOPNOTSUPP) log_debug("cold slots not registered: the %s engine has no ring",
                                     file_reader_engine(w->bundle_reader));
    else if (rc < 0) log_info("cold slots not registered with the ring (%s): reads pin their pages", strerror(-rc));
    return 0;
}

/* Where a batch's answer goes. */
typedef struct {
    io_worker *w;
    struct bus_msg to; /* the peer */
    uint64_t batch_id, session;
} load_request;

static void answer(io_worker *w, const struct bus_msg *to, uint64_t session, Pi2__BundleLoaded *done) {
    Pi2__Envelope env;
    msg_envelope_init(&env, ++w->seq, session);
    env.body_case = PI2__ENVELOPE__BODY_BUNDLE_LOADED;
    env.bundle_loaded = done;
    iow_reply(w, to, &env);
}

static void batch_done(void *ctx, const bundle_batch_result *res) {
    load_request *q = ctx;
    Pi2__BundleLoaded done = PI2__BUNDLE_LOADED__INIT;
    done.batch_id = q->batch_id;
    done.loaded = res->loaded;
    done.bytes = res->bytes;
    done.unplaced = res->unplaced;
    done.time_us = res->time_us;
    if (res->error[0]) done.error = (char *)res->error;
    answer(q->w, &q->to, q->session, &done);
    free(q);
}

/* Starts reading layer's bundles[0..n) for a batch whose answer done(ctx) gives; -1 with err when it
 * cannot start (done not called, ctx still the caller's). */
static int start_batch(io_worker *w, uint32_t layer, const uint32_t *bundles, size_t n, bundle_batch_fn done,
                       void *ctx, char *err, size_t errlen) {
    if (iow_attach_cache(w)) { /* the plan is open: BundleLoad is refused on a stack without one */
        snprintf(err, errlen, "the io-worker has no neuron cache to load into yet");
        return -1;
    }
    bundle_key *keys = malloc(sizeof *keys * (n ? n : 1));
    if (!keys) {
        snprintf(err, errlen, "the io-worker is out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) keys[i] = (bundle_key){layer, bundles[i]};
    const int rc = bundle_loader_start(&w->loader, keys, (int)n, done, ctx, err, errlen);
    if (rc) log_error("%s", err);
    free(keys);
    return rc;
}

void iow_bundle_load(io_worker *w, const struct bus_msg *m, const Pi2__Envelope *req) {
    const Pi2__BundleLoad *r = req->bundle_load;
    char err[1024] = "the io-worker is out of memory";
    load_request *q = malloc(sizeof *q);
    if (q) {
        *q = (load_request){.w = w, .batch_id = r->batch_id, .session = req->session};
        memcpy(q->to.peer, m->peer, m->peer_len);
        q->to.peer_len = m->peer_len;
        if (start_batch(w, r->layer, r->bundles, r->n_bundles, batch_done, q, err, sizeof err) == 0) return;
        free(q);
    }
    Pi2__BundleLoaded refused = PI2__BUNDLE_LOADED__INIT;
    refused.batch_id = r->batch_id;
    refused.error = err;
    answer(w, m, req->session, &refused);
}

/* ---- the cpu-workers' rings (bundle_ring.h) ---- */

typedef struct {
    bundle_ring *ring;
    uint64_t batch_id;
} ring_request;

static void ring_batch_done(void *ctx, const bundle_batch_result *res) {
    ring_request *q = ctx;
    bundle_ring_answer(q->ring, q->batch_id, res->bytes, res->error);
    free(q);
}

static int ring_count(const io_worker *w) {
    const int n = w->ctl ? w->ctl->params.n_cpu_workers : 0;
    return n < 0 ? 0 : n > STACK_MAX_CPU_WORKERS ? STACK_MAX_CPU_WORKERS : n;
}

bool iow_rings_pending(const io_worker *w) {
    if (!w->budgeted) return false;
    for (int i = 0; i < ring_count(w); i++)
        if (bundle_ring_pending(&w->ctl->bundle_rings[i])) return true;
    return false;
}

/* One batch from ring r: checked as a BundleLoad from the bus would be, then read; refusals answered there. */
static void start_ring_batch(io_worker *w, bundle_ring *r, uint64_t id, uint32_t layer, uint32_t n) {
    char err[1024] = "";
    Pi2__BundleLoad body = PI2__BUNDLE_LOAD__INIT;
    body.batch_id = id;
    body.layer = layer;
    body.n_bundles = n;
    body.bundles = w->ring_ids;
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, 0);
    env.body_case = PI2__ENVELOPE__BODY_BUNDLE_LOAD;
    env.bundle_load = &body;
    const msg_limits lim = {.n_layer = (uint32_t)w->m.n_layer, .n_bundles = (uint32_t)w->off.n_bundles};
    if (msg_validate(&env, &lim, err, sizeof err)) {
        bundle_ring_answer(r, id, 0, err);
        return;
    }
    ring_request *q = malloc(sizeof *q);
    if (!q) {
        bundle_ring_answer(r, id, 0, "the io-worker is out of memory");
        return;
    }
    *q = (ring_request){r, id};
    if (start_batch(w, layer, w->ring_ids, n, ring_batch_done, q, err, sizeof err)) {
        bundle_ring_answer(r, id, 0, err);
        free(q);
    }
}

void iow_take_rings(io_worker *w) {
    if (!w->budgeted) { /* a restarted io-worker: the workers' batches may come before any message */
        if (!w->ctl || !w->ctl->plan_path[0] || clock_ms() < w->next_offload_try_ms) return;
        w->next_offload_try_ms = clock_ms() + 1000;
        if (iow_open_offload(w)) return;
    }
    for (int i = 0; i < ring_count(w); i++) {
        bundle_ring *r = &w->ctl->bundle_rings[i];
        char err[256];
        uint64_t id;
        uint32_t layer, n;
        int rc;
        while ((rc = bundle_ring_pop(r, &id, &layer, w->ring_ids, BUNDLE_RING_WORDS, &n, err, sizeof err)) == 1)
            start_ring_batch(w, r, id, layer, n);
        if (rc < 0) log_error("cpu-worker.%d's bundle ring: %s; its batches there are dropped", i, err);
    }
}

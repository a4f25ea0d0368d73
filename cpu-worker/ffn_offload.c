/* The budgeted FFN step (ffn_offload.h). */
#include "ffn_offload.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stack/bundle_ring.h"
#include "stack/bus.h"
#include "stack/doorbell.h"
#include "stack/cache_sim.h"
#include "stack/msg.h"
#include "stack/neuron_cache.h"
#include "stack/proc_stop.h"
#include "stack/rundir.h"
#include "util/calloc_flagged.h"
#include "util/clock.h"
#include "util/log.h"

#define MAX_ROUNDS 16       /* load-and-compute rounds of one layer before giving up (slots kept pinned) */
#define IO_PATIENCE_MS 1000 /* a BundleLoad unanswered this long, with the io-worker's row not beating or
                             * under another pid, is sent again */
#define POLL_MS 1 /* while misses are read: how often the waiting chunks are looked at */

enum { UNSEEN = -3, MISSING = -2 };

struct ffn_offload {
    const stack_view *sv;
    const model *m;
    const offload *off;
    shm_segment *seg;
    const uint8_t *base;         /* the hot region: rows are addressed from it */
    const offload_lend *lend;    /* the plan lends the prompt's memory: whether region "lent" holds its bundles */
    const uint8_t *lent;         /* region "lent" (NULL: nothing lent) */
    uint32_t lent_now;           /* this layer step: its lent bundles there (0 while they are not) */
    ncache *cache;
    bus_ctx *ctx;
    bus_socket *sock;
    bundle_ring *ring;           /* our batches to the io-worker, answered there; NULL: the bus only */
    int bell_fd;                 /* rung after queueing while the io-worker sleeps */
    uint64_t ring_resets;        /* the ring's resets when the last batch was queued */
    uint64_t ring_bytes;         /* the ring's bytes counted into stats so far */
    uint64_t seq, batch_id;      /* the last batch sent */
    bool sent_in_ring;           /* how the last batch went */
    uint32_t bus_unanswered;     /* batches sent over the bus whose answers have not come: while none, the
                                  * socket is not looked at (a look is two system calls) */
    uint64_t awaited;            /* the batch whose answer the FFN step waits for */
    bool awaited_in_ring;
    uint64_t ahead_batch;        /* the batch asked for ahead of this layer, while unanswered; else 0 */
    bool ahead_in_ring;
    msg_limits lim;
    /* one layer's working state */
    int32_t *at;                 /* [n_ff]: the neurons' places (ffn_rows.at) */
    int32_t *sel_idx;            /* [n_ff]: each chunk's selection at its first neuron */
    float *sel_gate;             /* [n_ff] */
    int *sel_n;                  /* [n_chunks]: by chunk id */
    int64_t *bundle_at;          /* [n_bundles]: UNSEEN, MISSING, or the (hot or pinned) bundle's byte offset from base */
    uint32_t *pins;              /* [n_bundles]: this worker's pin log in the segment (offload_pin_log_bytes) */
    uint32_t *touched, *missing; /* [n_bundles] */
    int n_pins, n_touched, n_missing;
    int32_t *ready, *waiting;    /* [n_chunks]: chunk ids */
    /* bundles asked for ahead (ffn_offload_prefetch) for the layer about to run */
    uint8_t *asked;              /* [n_bundles]: 1 if in ahead[] */
    uint32_t *ahead;             /* [n_bundles] */
    int n_ahead;
    ffn_prefetch_tally prefetch;
    ffn_rows rows;               /* how the kernels address the rows found (at[] filled per layer) */
    long compute_delay_us;       /* PI2_CHUNK_DELAY: a sleep after each batch of chunks, pins held (tests) */
    offload_tally stats;
    uint64_t landed_us;          /* computing chunks as their bundles landed, while waiting for a batch */
    FILE *trace;                 /* PI2_BUNDLE_TRACE: the cold bundles each layer step looks up (tools/cache-sim) */
};

/* ---- set-up ---- */

/* Lets go of the pin logged in *entry (slot + 1): the entry is cleared
 * before the unpin, so a kill in between leaks the pin, never unpins twice. */
static void unpin_logged(ffn_offload *o, uint32_t *entry) {
    const uint32_t e = *entry;
    *entry = 0;
    ncache_unpin(o->cache, &(ncache_ref){(int64_t)e - 1});
}

/* Lets go of the pins a killed predecessor left in the log. */
static void reclaim_pins(ffn_offload *o, const char *name) {
    long n = 0;
    for (long i = 0; i < o->off->n_bundles; i++)
        if (o->pins[i]) unpin_logged(o, &o->pins[i]), n++;
    if (n) log_warn("%s: let go of %ld cold slots that the process before it held pinned when it stopped", name, n);
}

/* Layer l's bundles in memory for this step: the hot ones, then the lent ones while they are there. */
static uint32_t resident_bundles(const ffn_offload *o, int l) { return o->off->plan->hot_bundles[l] + o->lent_now; }

/* Whether the lent bundles are there, looked at once a layer step, after the worker's row went busy: the
 * npu-worker takes them back before a prompt, once no step that saw them is left (npu-worker/lend.c). */
static void lent_step(ffn_offload *o, int l) {
    o->lent_now = o->lend && atomic_load(&o->lend->ready) ? offload_lent_bundles(o->off, l) : 0;
}

/* PI2_BUNDLE_TRACE=PREFIX: PREFIX.NAME gets, per layer step, the (layer, bundle) pairs of the cold bundles
 * looked up, then (CACHE_TRACE_STEP_END, 0); appended to, so a restarted worker goes on in the same file. */
static void open_trace(ffn_offload *o, const char *name) {
    const char *prefix = getenv("PI2_BUNDLE_TRACE");
    if (!prefix || !*prefix) return;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s.%s", prefix, name) >= (int)sizeof path || !(o->trace = fopen(path, "ab")))
        log_warn("PI2_BUNDLE_TRACE: cannot write %s.%s; no trace", prefix, name);
    else log_info("tracing cold bundle lookups to %s", path);
}

static void trace_step(ffn_offload *o, int l) {
    const uint32_t hot = resident_bundles(o, l);
    for (int i = 0; i < o->n_touched; i++)
        if (o->touched[i] >= hot) fwrite((uint32_t[2]){(uint32_t)l, o->touched[i]}, sizeof(uint32_t), 2, o->trace);
    fwrite((uint32_t[2]){CACHE_TRACE_STEP_END, 0}, sizeof(uint32_t), 2, o->trace);
}

/* Regions "lend" and "lent" of a plan that lends the prompt's memory; the rows there addressed from base. */
static int attach_lent(ffn_offload *o, const char *seg_name) {
    char err[256];
    offload_lend *flag;
    uint8_t *lent;
    if (offload_lent_regions(o->seg, o->off, &flag, &lent, err, sizeof err)) {
        log_error("%s: %s", seg_name, err);
        return -1;
    }
    o->lend = flag, o->lent = lent;
    if (o->lent < o->base || (uint64_t)(o->lent - o->base) % o->off->unit) {
        log_error("%s: the lent region is not addressable from the hot one", seg_name);
        return -1;
    }
    return 0;
}

ffn_offload *ffn_offload_new(const stack_view *sv, const char *runid, const char *name, int index, bool realtime_io) {
    ffn_offload *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->bell_fd = -1;
    o->sv = sv;
    o->m = &sv->m;
    o->off = &sv->off;
    char seg_name[SHM_NAME_MAX], err[512];
    uint64_t hot_bytes, cold_bytes, pins_bytes;
    if (shm_make_name(seg_name, sizeof seg_name, runid, STACK_SEG_FFN) ||
        !(o->seg = shm_attach(seg_name, SHM_KIND_SLOTS, 0))) {
        log_error("neuron cache segment of run '%s': %s", runid, shm_last_error());
        goto fail;
    }
    o->base = shm_region_ptr(o->seg, "hot", &hot_bytes);
    uint8_t *cold = shm_region_ptr(o->seg, "cold", &cold_bytes);
    uint32_t *pins = shm_region_ptr(o->seg, "pins", &pins_bytes);
    if (!o->base || !cold || !pins || hot_bytes < offload_hot_region_bytes(o->off) ||
        cold_bytes < o->off->cold_bytes || pins_bytes < offload_pin_log_bytes(o->off, index + 1)) {
        log_error("%s: a region is missing or smaller than the plan's", seg_name);
        goto fail;
    }
    if (cold < o->base || (uint64_t)(cold - o->base) % o->off->unit) {
        log_error("%s: the cold region is not addressable from the hot one", seg_name);
        goto fail;
    }
    if (!(o->cache = offload_cache_attach(o->seg, err, sizeof err))) {
        log_error("%s: slot table: %s", seg_name, err);
        goto fail;
    }
    if (o->off->lent_bytes && attach_lent(o, seg_name)) goto fail;
    char dir[RUNDIR_PATH_MAX], endpoint[BUS_ENDPOINT_MAX];
    struct bus_opts opts = bus_default_opts();
    opts.max_frame = MSG_MAX_FRAME;
    if (rundir_path(dir, sizeof dir, runid) || bus_endpoint_ipc(endpoint, sizeof endpoint, dir, "io", -1) ||
        !(o->ctx = bus_ctx_new())) {
        log_error("connecting to the io-worker: %s", bus_last_error());
        goto fail;
    }
    if (realtime_io && bus_ctx_realtime_io(o->ctx))
        log_info("the link to the io-worker at normal priority: %s", bus_last_error());
    if (!(o->sock = bus_connect(o->ctx, BUS_DEALER, endpoint, name, &opts))) {
        log_error("connecting to the io-worker: %s", bus_last_error());
        goto fail;
    }
    if (index >= STACK_MAX_CPU_WORKERS) {
        log_warn("bundle loads over the bus only: no ring for cpu-worker %d", index);
    } else if ((o->bell_fd = doorbell_open(runid, err, sizeof err)) < 0) {
        log_warn("bundle loads over the bus only: %s", err);
    } else {
        o->ring = &sv->ctl->bundle_rings[index];
        o->ring_bytes = atomic_load(&o->ring->bytes);
    }
    const size_t n_ff = (size_t)o->m->n_ff, n_b = (size_t)o->off->n_bundles, n_c = (size_t)ffn_chunk_count(o->m);
    int bad = 0;
    o->at = calloc_flagged(n_ff, sizeof *o->at, &bad);
    o->sel_idx = calloc_flagged(n_ff, sizeof *o->sel_idx, &bad);
    o->sel_gate = calloc_flagged(n_ff, sizeof *o->sel_gate, &bad);
    o->sel_n = calloc_flagged(n_c, sizeof *o->sel_n, &bad);
    o->bundle_at = calloc_flagged(n_b, sizeof *o->bundle_at, &bad);
    o->touched = calloc_flagged(n_b, sizeof *o->touched, &bad);
    o->missing = calloc_flagged(n_b, sizeof *o->missing, &bad);
    o->ready = calloc_flagged(n_c, sizeof *o->ready, &bad);
    o->waiting = calloc_flagged(n_c, sizeof *o->waiting, &bad);
    o->asked = calloc_flagged(n_b, sizeof *o->asked, &bad);
    o->ahead = calloc_flagged(n_b, sizeof *o->ahead, &bad);
    if (bad) {
        log_error("out of memory for the neuron cache's working state");
        goto fail;
    }
    for (size_t b = 0; b < n_b; b++) o->bundle_at[b] = UNSEEN;
    o->pins = pins + (size_t)index * n_b;
    reclaim_pins(o, name);
    o->lim = (msg_limits){.n_layer = (uint32_t)o->m->n_layer, .n_bundles = (uint32_t)n_b};
    o->batch_id = (uint64_t)getpid() << 32;
    const offload *off = o->off;
    o->rows = (ffn_rows){o->base, off->unit, off->gate_bytes, off->gate_bytes + off->up_bytes, o->at,
                         bundle_down_type(o->m), off->down_bytes};
    log_info("budgeted FFN: %.1f MiB hot, %u cold slots, misses read by the io-worker", o->off->hot_bytes / 1048576.0,
             o->off->cold_slots);
    open_trace(o, name);
    return o;
fail:
    ffn_offload_free(o);
    return NULL;
}

void ffn_offload_free(ffn_offload *o) {
    if (!o) return;
    bus_close(o->sock);
    bus_ctx_free(o->ctx);
    if (o->bell_fd >= 0) close(o->bell_fd);
    ncache_detach(o->cache);
    shm_detach(o->seg);
    if (o->trace) fclose(o->trace);
    free(o->at); free(o->sel_idx); free(o->sel_gate); free(o->sel_n); free(o->bundle_at);
    free(o->touched); free(o->missing); free(o->ready); free(o->waiting); free(o->asked); free(o->ahead);
    free(o);
}

const offload_tally *ffn_offload_get_stats(const ffn_offload *o) { return &o->stats; }

const ffn_prefetch_tally *ffn_offload_get_prefetch_stats(const ffn_offload *o) { return &o->prefetch; }

/* ---- selection: every chunk's neurons, the pool's threads splitting the chunks ---- */

typedef struct {
    ffn_offload *o;
    threadpool *pool;
    const ffn_layer *f;
    const int32_t *chunks;
    int n_chunks;
    ffn_scratch *scratch;
    float *partials;
} job;

static void select_worker(void *ctx, int ith, int nth) {
    job *j = ctx;
    long c0, c1;
    pool_split(j->n_chunks, ith, nth, &c0, &c1);
    ffn_chunk_stats st = {0};
    for (long i = c0; i < c1; i++) {
        long n0, n1;
        ffn_chunk_range(j->f->m, j->chunks[i], &n0, &n1);
        j->o->sel_n[j->chunks[i]] = ffn_chunk_select(j->f, j->chunks[i], j->o->sel_idx + n0, j->o->sel_gate + n0,
                                          j->scratch[ith].tmp, &st);
    }
}

/* ---- where each neuron's rows are ---- */

/* The neuron's place in layer l's bundle order: bundle pos / per_bundle, slot pos % per_bundle. */
static int32_t position(const ffn_offload *o, int l, int32_t neuron) {
    return o->off->pos_of[(size_t)l * (size_t)o->m->n_ff + (size_t)neuron];
}

/* The bundle holding the neuron's rows in layer l. */
static uint32_t bundle_of(const ffn_offload *o, int l, int32_t neuron) {
    return (uint32_t)(position(o, l, neuron) / o->off->per_bundle);
}

/* A row's index for the kernels from its byte offset from the base. */
static int32_t place(const ffn_offload *o, uint64_t bytes) { return (int32_t)(bytes / o->off->unit); }

/* Bundle b of layer l: hot, pinned (now, if cached), or missing. Its byte
 * offset from base, or MISSING. count: the first look of this layer (a later
 * round finds again what it counted, or what it read). */
static int64_t find_bundle(ffn_offload *o, int l, uint32_t b, bool count) {
    const offload *off = o->off;
    if (o->bundle_at[b] != UNSEEN) return o->bundle_at[b]; /* a bundle is counted once, not per firing neuron */
    o->touched[o->n_touched++] = b;
    const uint32_t hot = off->plan->hot_bundles[l];
    if (b < hot) {
        o->stats.hot += count;
        return o->bundle_at[b] = (int64_t)(off->hot_offset[l] + (uint64_t)b * off->hot_stride);
    }
    if (b < resident_bundles(o, l)) { /* lent: counted with the hot ones, as the plan predicts */
        o->stats.hot += count;
        return o->bundle_at[b] = (o->lent - o->base) + (int64_t)(off->lent_offset[l] + (uint64_t)(b - hot) * off->stride);
    }
    ncache_ref ref;
    const uint8_t *p = ncache_pin(o->cache, (uint32_t)l, 0, b, &ref);
    if (!p) {
        o->prefetch.late += count && o->asked[b];
        o->stats.read_ahead += count && o->asked[b];
        o->missing[o->n_missing++] = b;
        return o->bundle_at[b] = MISSING;
    }
    o->pins[o->n_pins++] = (uint32_t)ref.slot + 1; /* logged once pinned: a kill before this leaks one pin */
    if (o->asked[b]) { /* read for this step, ahead of it: a read, not a hit */
        o->stats.misses += count;
        o->stats.read_ahead += count;
    } else {
        o->stats.cold_hits += count;
    }
    return o->bundle_at[b] = p - o->base;
}

/* Each selected neuron of the chunk: its place in at[]. False when one of its bundles is missing. */
static bool resolve_chunk(ffn_offload *o, int l, int chunk, bool count) {
    const offload *off = o->off;
    long n0, n1;
    ffn_chunk_range(o->m, chunk, &n0, &n1);
    bool all = true;
    for (int k = 0; k < o->sel_n[chunk]; k++) {
        const int32_t neuron = o->sel_idx[n0 + k], p = position(o, l, neuron);
        const int64_t at = find_bundle(o, l, (uint32_t)(p / off->per_bundle), count);
        if (at == MISSING) all = false;
        else o->at[neuron] = place(o, (uint64_t)at + (uint64_t)(p % off->per_bundle) * off->neuron_bytes);
    }
    return all;
}

/* Unpins this round's cold bundles and forgets what was found (the miss
 * list stays: it is what a lost io-worker is asked for again). */
static void release(ffn_offload *o) {
    for (int i = 0; i < o->n_pins; i++) unpin_logged(o, &o->pins[i]);
    for (int i = 0; i < o->n_touched; i++) o->bundle_at[o->touched[i]] = UNSEEN;
    o->n_pins = o->n_touched = 0;
}

/* ---- computing the chunks whose rows are all found ---- */

static void compute_worker(void *ctx, int ith, int nth) {
    job *j = ctx;
    ffn_offload *o = j->o;
    long c0, c1;
    pool_split(j->n_chunks, ith, nth, &c0, &c1);
    if (c0 == c1) return;
    ffn_scratch *s = &j->scratch[ith];
    int n = 0;
    for (long i = c0; i < c1; i++) { /* the chunks' selections, one after another, as ffn_chunks_compute wants */
        long n0, n1;
        ffn_chunk_range(j->f->m, j->chunks[i], &n0, &n1);
        s->start[i - c0] = n;
        const int cnt = o->sel_n[j->chunks[i]];
        memcpy(s->idx + n, o->sel_idx + n0, sizeof(int32_t) * (size_t)cnt);
        memcpy(s->a + n, o->sel_gate + n0, sizeof(float) * (size_t)cnt);
        n += cnt;
    }
    s->start[c1 - c0] = n;
    ffn_chunks_compute(j->f, j->chunks + c0, (int)(c1 - c0), j->partials, s, NULL, NULL);
}

static void run_job(job *j, pool_fn fn, const int32_t *chunks, int n) {
    j->chunks = chunks;
    j->n_chunks = n;
    if (n > 0) pool_run(j->pool, fn, j);
}

/* Computes chunks[0..n) from the rows pinned for them. */
static void compute(ffn_offload *o, job *j, const int32_t *chunks, int n) {
    run_job(j, compute_worker, chunks, n);
    if (n > 0 && o->compute_delay_us) usleep((useconds_t)o->compute_delay_us);
}

void ffn_offload_set_compute_delay(ffn_offload *o, long us) { o->compute_delay_us = us; }

/* Whether every cold bundle of the chunk's selection is cached now (no pins taken). */
static bool chunk_landed(const ffn_offload *o, int l, int chunk) {
    long n0, n1;
    ffn_chunk_range(o->m, chunk, &n0, &n1);
    for (int k = 0; k < o->sel_n[chunk]; k++) {
        const uint32_t b = bundle_of(o, l, o->sel_idx[n0 + k]);
        if (b >= resident_bundles(o, l) && !ncache_contains(o->cache, (uint32_t)l, 0, b)) return false;
    }
    return true;
}

/* Computes the waiting chunks whose bundles have all landed; the others stay
 * in waiting[0..*n_waiting), in order. */
static void compute_landed(ffn_offload *o, job *j, int32_t *waiting, int *n_waiting) {
    const int l = j->f->layer;
    int n_now = 0, keep = 0;
    for (int i = 0; i < *n_waiting; i++) {
        const int32_t c = waiting[i];
        if (chunk_landed(o, l, c) && resolve_chunk(o, l, c, false)) o->ready[n_now++] = c;
        else waiting[keep++] = c;
    }
    compute(o, j, o->ready, n_now);
    release(o);
    *n_waiting = keep;
}

/* ---- the misses, read by the io-worker ---- */

/* Asks the io-worker for layer l's bundles[0..n) as batch ++batch_id: in
 * the ring when it has room (the doorbell rung if the io-worker sleeps),
 * else over the bus. */
static int send_load(ffn_offload *o, int l, uint32_t *bundles, int n) {
    ++o->batch_id;
    if (o->ring) {
        const uint64_t resets = atomic_load(&o->ring->resets);
        if (bundle_ring_push(o->ring, o->batch_id, (uint32_t)l, bundles, (uint32_t)n) == 0) {
            o->ring_resets = resets;
            o->sent_in_ring = true;
            if (atomic_load(&o->sv->ctl->io_sleeping)) doorbell_ring(o->bell_fd);
            return 0;
        }
    }
    o->sent_in_ring = false;
    Pi2__BundleLoad body = PI2__BUNDLE_LOAD__INIT;
    body.batch_id = o->batch_id;
    body.layer = (uint32_t)l;
    body.n_bundles = (size_t)n;
    body.bundles = bundles;
    Pi2__Envelope env;
    msg_envelope_init(&env, ++o->seq, 0);
    env.body_case = PI2__ENVELOPE__BODY_BUNDLE_LOAD;
    env.bundle_load = &body;
    size_t len;
    uint8_t *bytes = msg_pack_alloc(&env, &len);
    int rc = bytes ? bus_send(o->sock, PI2_BUS_MSG, bytes, len) : BUS_ERR;
    free(bytes);
    if (rc != BUS_OK) return -1;
    o->bus_unanswered++;
    return 0;
}

/* Whether the io-worker looks alive: its row beats, under the pid it had when the batch went out. */
static bool io_worker_alive(stack_ctl *ctl, int32_t *pid) {
    const proc_row *r = ctl_proc_find(ctl, "io-worker");
    if (!r) return false;
    const int32_t now = atomic_load(&r->pid);
    const bool same = *pid == 0 || *pid == now;
    *pid = now;
    return same && clock_ms() - atomic_load(&r->heartbeat_ms) < IO_PATIENCE_MS;
}

enum { REPLY_OTHER = -2 };

/* One message from the io-worker: 0 the answer to batch o->awaited, -1 an
 * error (err), REPLY_OTHER anything else. Every BundleLoaded adds its bytes.
 * The failures of a batch asked for ahead are not reported: a bundle it could
 * not read is missed again, and a batch of the step's own reads it or fails. */
static int take_reply(ffn_offload *o, const struct bus_msg *bm, char *err, size_t errlen) {
    if (bm->type != PI2_BUS_MSG) return REPLY_OTHER;
    char why[256];
    Pi2__Envelope *env = msg_unpack(bm->data, bm->len, why, sizeof why);
    if (!env) return REPLY_OTHER;
    int rc = REPLY_OTHER;
    if (msg_validate(env, &o->lim, why, sizeof why)) {
        log_warn("dropped a message from the io-worker: %s", why);
    } else if (env->body_case == PI2__ENVELOPE__BODY_BUNDLE_LOADED) {
        const Pi2__BundleLoaded *r = env->bundle_loaded;
        if (o->bus_unanswered) o->bus_unanswered--;
        o->stats.bytes_read += r->bytes;
        const bool ahead = r->batch_id == o->ahead_batch;
        if (ahead) o->ahead_batch = 0;
        if (ahead && r->error && *r->error) log_debug("a batch asked for ahead: %s", r->error);
        if (r->batch_id == o->awaited) {
            rc = 0;
            if (r->error && *r->error && !ahead) { /* what the ahead batch failed to read is asked for again */
                snprintf(err, errlen, "%s", r->error);
                rc = -1;
            }
        }
    } else if (env->body_case == PI2__ENVELOPE__BODY_ERROR) {
        if (o->bus_unanswered) o->bus_unanswered--;
        snprintf(err, errlen, "the io-worker refused a BundleLoad: %s", env->error->message);
        rc = -1;
    }
    msg_free(env);
    return rc;
}

/* Counts the answers that came in to batches nobody waits for (asked for ahead), and the bytes read for
 * the batches answered in the ring. */
static void drain_replies(ffn_offload *o) {
    if (o->ring) {
        const uint64_t bytes = atomic_load(&o->ring->bytes);
        o->stats.bytes_read += bytes - o->ring_bytes;
        o->ring_bytes = bytes;
    }
    struct bus_msg bm;
    char err[512];
    while (o->bus_unanswered && bus_recv(o->sock, &bm, 0) == BUS_OK)
        if (take_reply(o, &bm, err, sizeof err) == -1) log_warn("an io-worker reply nobody waited for: %s", err);
}

/* Waits for the answer to batch o->awaited, computing the waiting chunks
 * as their bundles land (the io-worker publishes each as it is read). 0 when
 * answered (bundles that found no slot are missed again next round); 1
 * abandoned (epoch); -1 with err (the io-worker's error). A lost io-worker
 * (killed: the supervisor restarts it) gets the batch again. */
static int await_load(ffn_offload *o, job *j, int32_t *waiting, int *n_waiting, uint32_t epoch, char *err,
                      size_t errlen) {
    const int l = j->f->layer;
    stack_ctl *ctl = o->sv->ctl;
    int32_t pid = 0;
    io_worker_alive(ctl, &pid);
    int64_t sent = clock_ms();
    unsigned spins = 0;
    for (;;) {
        if ((uint32_t)atomic_load(&ctl->epoch) != epoch || proc_stop) return 1;
        if (o->awaited_in_ring) {
            const int out = bundle_ring_outcome(o->ring, o->awaited, o->ring_resets, err, errlen);
            /* what a batch asked for ahead failed to read is asked for again, as over the bus */
            if (out) return out > 0 || o->awaited == o->ahead_batch ? 0 : -1;
        }
        struct bus_msg bm; /* in the ring's case only answers to batches that went over the bus */
        const int rc = o->awaited_in_ring && !o->bus_unanswered ? BUS_TIMEOUT
                       : bus_recv(o->sock, &bm, o->awaited_in_ring ? 0 : *n_waiting ? POLL_MS : 100);
        if (rc == BUS_OK) {
            const int done = take_reply(o, &bm, err, errlen);
            if (done != REPLY_OTHER) return done;
            continue;
        }
        if (*n_waiting) {
            const uint64_t c0 = clock_us();
            const int before = *n_waiting;
            compute_landed(o, j, waiting, n_waiting);
            o->landed_us += clock_us() - c0;
            if (o->awaited_in_ring && *n_waiting == 0) return 0; /* the rest of an ahead batch is not waited for */
            if (*n_waiting < before) spins = 0;
        }
        if (o->awaited_in_ring) ctl_wait_step(spins++); /* the answer comes without a wake-up: look again soon */
        if (clock_ms() - sent > IO_PATIENCE_MS && !io_worker_alive(ctl, &pid)) {
            log_warn("layer %d: the io-worker did not answer %d missing bundles (restarted?); asking again", l,
                     o->n_missing);
            if (send_load(o, l, o->missing, o->n_missing) == 0) {
                sent = clock_ms();
                o->awaited = o->batch_id;
                o->awaited_in_ring = o->sent_in_ring;
            }
        }
    }
}

/* ---- asking ahead ---- */

/* Forgets the bundles asked for ahead and their batch (an answer still to come is only counted). */
static void forget_ahead(ffn_offload *o) {
    for (int i = 0; i < o->n_ahead; i++) o->asked[o->ahead[i]] = 0;
    o->n_ahead = 0;
    o->ahead_batch = 0;
}

bool ffn_offload_ahead_begin(ffn_offload *o, int l) {
    forget_ahead(o);
    o->prefetch.steps++;
    const bool reads = o->off->plan->hot_bundles[l] < (uint32_t)o->off->n_bundles;
    o->prefetch.guessed += reads;
    return reads;
}

void ffn_offload_prefetch(ffn_offload *o, const ffn_layer *f, const int32_t *chunks, int n_chunks, threadpool *pool,
                          ffn_scratch *scratch) {
    const int l = f->layer;
    drain_replies(o);
    lent_step(o, l);
    job j = {.o = o, .pool = pool, .f = f, .scratch = scratch};
    run_job(&j, select_worker, chunks, n_chunks);
    for (int i = 0; i < n_chunks; i++) {
        long n0, n1;
        ffn_chunk_range(o->m, chunks[i], &n0, &n1);
        for (int k = 0; k < o->sel_n[chunks[i]]; k++) {
            const uint32_t b = bundle_of(o, l, o->sel_idx[n0 + k]);
            if (b < resident_bundles(o, l) || o->asked[b] || ncache_contains(o->cache, (uint32_t)l, 0, b)) continue;
            o->asked[b] = 1;
            o->ahead[o->n_ahead++] = b;
        }
    }
    o->prefetch.asked += (uint64_t)o->n_ahead;
    if (o->n_ahead && send_load(o, l, o->ahead, o->n_ahead))
        log_warn("layer %d: cannot ask the io-worker ahead for %d bundles: %s", l, o->n_ahead, bus_last_error());
    else if (o->n_ahead) {
        o->ahead_batch = o->batch_id;
        o->ahead_in_ring = o->sent_in_ring;
    }
}

/* Whether every miss is in the batch asked for ahead, still unanswered (its
 * answer then says when they all landed, or which found no slot). */
static bool all_asked_ahead(const ffn_offload *o) {
    if (!o->ahead_batch) return false;
    char err[8];
    if (o->ahead_in_ring && bundle_ring_outcome(o->ring, o->ahead_batch, o->ring_resets, err, sizeof err))
        return false; /* answered: what is still missing found no slot, or failed */
    for (int i = 0; i < o->n_missing; i++)
        if (!o->asked[o->missing[i]]) return false;
    return true;
}

int ffn_offload_run(ffn_offload *o, ffn_layer *f, const int32_t *chunks, int n_chunks, float *partials,
                    threadpool *pool, ffn_scratch *scratch, uint32_t epoch, char *err, size_t errlen) {
    const int l = f->layer;
    const uint64_t t0 = clock_us();
    f->rows = &o->rows;
    drain_replies(o);
    lent_step(o, l);
    job j = {.o = o, .pool = pool, .f = f, .scratch = scratch, .partials = partials};
    if (l == 0) o->stats.tokens++;
    o->stats.layers++;
    run_job(&j, select_worker, chunks, n_chunks);
    /* every round: find what is in memory, ask for the rest, compute what was found while it is read, then
     * each chunk as its bundles land */
    const int32_t *todo = chunks;
    int n_todo = n_chunks, rc = 0;
    for (int round = 0; n_todo > 0; round++) {
        if (round == MAX_ROUNDS) {
            snprintf(err, errlen, "layer %d: %d chunks still lack bundles after %d reads (every cold slot pinned?)", l,
                     n_todo, MAX_ROUNDS);
            rc = -1;
            break;
        }
        int n_ready = 0, n_waiting = 0;
        o->n_missing = 0;
        for (int i = 0; i < n_todo; i++) { /* todo may be waiting itself: entry i is read before it is written */
            if (resolve_chunk(o, l, todo[i], round == 0)) o->ready[n_ready++] = todo[i];
            else o->waiting[n_waiting++] = todo[i];
        }
        if (round == 0) o->stats.misses += (uint64_t)o->n_missing;
        if (round == 0 && o->trace) trace_step(o, l);
        if (o->n_missing > 0 && all_asked_ahead(o)) {
            o->awaited = o->ahead_batch; /* every miss is in that batch: no message of our own */
            o->awaited_in_ring = o->ahead_in_ring;
        } else if (o->n_missing > 0) {
            if (send_load(o, l, o->missing, o->n_missing)) {
                snprintf(err, errlen, "layer %d: cannot send the io-worker a BundleLoad: %s", l, bus_last_error());
                release(o);
                rc = -1;
                break;
            }
            o->awaited = o->batch_id;
            o->awaited_in_ring = o->sent_in_ring;
        }
        compute(o, &j, o->ready, n_ready);
        release(o);
        if (!o->n_missing) break; /* every chunk was ready */
        const uint64_t w0 = clock_us(), landed0 = o->landed_us;
        rc = await_load(o, &j, o->waiting, &n_waiting, epoch, err, errlen);
        o->stats.wait_us += clock_us() - w0 - (o->landed_us - landed0);
        if (rc) break;
        todo = o->waiting;
        n_todo = n_waiting;
    }
    f->rows = NULL;
    forget_ahead(o);
    o->stats.ffn_us += clock_us() - t0;
    return rc;
}

/* Bundle loads into the neuron cache (bundle_loader.h). */
#include "bundle_loader.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"

typedef struct batch {
    bundle_batch_fn done;
    void *ctx;
    int left;               /* reads still to finish */
    uint64_t t0_us;
    bundle_batch_result res;
} batch;

typedef struct waiter {
    batch *b;
    struct waiter *next;
} waiter;

/* One bundle being read; the first waiter is the batch that asked first. */
typedef struct bundle_read {
    bundle_loader *l;
    bundle_key key;
    int64_t slot;
    uint8_t *dest;
    int tries;
    io_job job;
    waiter *waiters;
} bundle_read;

int bundle_loader_busy(const bundle_loader *l) { return l->open_batches; }

static size_t key_index(const bundle_loader *l, bundle_key k) { return (size_t)k.layer * (size_t)l->b->n_bundles + k.bundle; }

static void batch_finish(bundle_loader *l, batch *b) {
    b->res.time_us = clock_us() - b->t0_us;
    l->stats.batches++;
    l->stats.batch_us += b->res.time_us;
    l->open_batches--;
    b->done(b->ctx, &b->res);
    free(b);
}

/* The read is over (error NULL: published): every batch waiting for it is told. */
static void read_over(bundle_read *rd, const char *error) {
    bundle_loader *l = rd->l;
    l->reading[key_index(l, rd->key)] = NULL;
    for (waiter *w = rd->waiters, *next; w; w = next) {
        next = w->next;
        if (error && !w->b->res.error[0]) snprintf(w->b->res.error, sizeof w->b->res.error, "%s", error);
        if (--w->b->left == 0) batch_finish(l, w->b);
        free(w);
    }
    free(rd);
}

static void read_done(void *ctx, io_job *job);

static void submit(bundle_read *rd) {
    bundle_loader *l = rd->l;
    rd->tries++;
    rd->job = (io_job){bundle_file_offset(l->b, (int)rd->key.layer, (long)rd->key.bundle), (uint32_t)l->b->stride,
                       rd->dest, 0};
    if (file_reader_queue(l->reader, &rd->job, read_done, rd)) {
        rd->job.result = -ENOMEM;
        read_done(rd, &rd->job);
    }
}

/* whether a finished read holds the bundle: whole, and matching its checksum when checked */
static bool read_ok(bundle_loader *l, const bundle_read *rd) {
    if (rd->job.result != (int32_t)l->b->stride) return false;
    if (l->verify && !bundle_check(l->b, (int)rd->key.layer, (long)rd->key.bundle, rd->dest)) {
        l->stats.bad_checksums++;
        return false;
    }
    return true;
}

static void read_done(void *ctx, io_job *job) {
    bundle_read *rd = ctx;
    bundle_loader *l = rd->l;
    if (l->fault) l->fault(l->fault_ctx, &rd->key, job);
    if (read_ok(l, rd)) {
        ncache_publish(l->cache, rd->slot);
        l->stats.bundles++;
        l->stats.bytes += l->b->stride;
        rd->waiters->b->res.loaded++;
        rd->waiters->b->res.bytes += l->b->stride;
        read_over(rd, NULL);
    } else if (rd->tries >= BUNDLE_READ_TRIES) {
        const char *why = job->result < 0 ? strerror(-job->result)
                          : job->result != (int32_t)l->b->stride ? "short read"
                                                                : "bytes do not match the bundle's checksum";
        char error[512];
        snprintf(error, sizeof error, "%s: layer %u bundle %u (file offset %llu, %zu bytes): %s after %d tries",
                 l->path, rd->key.layer, rd->key.bundle, (unsigned long long)job->file_offset, l->b->stride, why,
                 rd->tries);
        log_error("%s", error);
        ncache_abandon(l->cache, rd->slot);
        read_over(rd, error);
    } else {
        l->stats.retries++;
        submit(rd);
    }
}

static bool waits_for(const bundle_read *rd, const batch *b) {
    for (const waiter *w = rd->waiters; w; w = w->next)
        if (w->b == b) return true;
    return false;
}

/* b waits for rd as well: false when out of memory */
static bool add_waiter(bundle_read *rd, batch *b) {
    waiter *w = malloc(sizeof *w);
    if (!w) return false;
    *w = (waiter){b, NULL};
    waiter **tail = &rd->waiters;
    while (*tail) tail = &(*tail)->next;
    *tail = w;
    b->left++;
    return true;
}

/* Key k for batch b: waited for when being read, claimed and read when not cached. */
static bool ask(bundle_loader *l, batch *b, bundle_key k) {
    bundle_read *rd = l->reading[key_index(l, k)];
    if (rd) {
        l->stats.already++;
        return waits_for(rd, b) || add_waiter(rd, b);
    }
    uint8_t *dest;
    const int64_t slot = ncache_claim(l->cache, k.layer, 0, k.bundle, &dest);
    if (slot < 0) {
        if (ncache_contains(l->cache, k.layer, 0, k.bundle)) l->stats.already++;
        else b->res.unplaced++;
        return true;
    }
    rd = calloc(1, sizeof *rd);
    if (!rd || !add_waiter(rd, b)) {
        free(rd);
        ncache_abandon(l->cache, slot);
        return false;
    }
    rd->l = l;
    rd->key = k;
    rd->slot = slot;
    rd->dest = dest;
    l->reading[key_index(l, k)] = rd;
    submit(rd);
    return true;
}

int bundle_loader_start(bundle_loader *l, const bundle_key *keys, int n, bundle_batch_fn done, void *ctx, char *err,
                        size_t errlen) {
    for (int i = 0; i < n; i++)
        if (keys[i].layer >= (uint32_t)l->b->n_layer || keys[i].bundle >= (uint64_t)l->b->n_bundles) {
            err_set(err, errlen, "%s: no layer %u bundle %u (the file has %d layers of %ld bundles)", l->path,
                    keys[i].layer, keys[i].bundle, l->b->n_layer, l->b->n_bundles);
            return -1;
        }
    if (!l->reading) l->reading = calloc((size_t)l->b->n_layer * (size_t)l->b->n_bundles, sizeof *l->reading);
    batch *b = l->reading ? calloc(1, sizeof *b) : NULL;
    if (!b) {
        err_set(err, errlen, "out of memory for a batch of %d bundles", n);
        return -1;
    }
    *b = (batch){.done = done, .ctx = ctx, .t0_us = clock_us()};
    l->open_batches++;
    b->left = 1; /* held while the keys are asked for: a read finishing meanwhile cannot report the batch */
    for (int i = 0; i < n; i++)
        if (!ask(l, b, keys[i]) && !b->res.error[0])
            snprintf(b->res.error, sizeof b->res.error, "the io-worker is out of memory for layer %u bundle %u",
                     keys[i].layer, keys[i].bundle);
    if (--b->left == 0) batch_finish(l, b);
    return 0;
}

void bundle_loader_poll(bundle_loader *l, int wait_ms) { file_reader_reap(l->reader, wait_ms); }

void bundle_loader_drain(bundle_loader *l) {
    while (l->open_batches > 0 && file_reader_busy(l->reader) > 0) file_reader_reap(l->reader, 100);
    free(l->reading);
    l->reading = NULL;
}

/* Bundle loads into the neuron cache (bundle_loader.h). */
#include "bundle_loader.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"

typedef struct {
    bundle_key key;
    int64_t slot;
    uint8_t *dest;
    int tries;
    bool done;
} pending;

/* whether a finished read holds the bundle: whole, and matching its checksum when checked */
static bool read_ok(bundle_loader *l, const pending *p, const io_job *job) {
    if (job->result != (int32_t)l->b->stride) return false;
    if (l->verify && !bundle_check(l->b, (int)p->key.layer, (long)p->key.bundle, p->dest)) {
        l->stats.bad_checksums++;
        return false;
    }
    return true;
}

static int fail(bundle_loader *l, const pending *p, const io_job *job, char *err, size_t errlen) {
    const char *why = job->result < 0 ? strerror(-job->result)
                      : job->result != (int32_t)l->b->stride ? "short read"
                                                            : "bytes do not match the bundle's checksum";
    err_set(err, errlen, "%s: layer %u bundle %u (file offset %llu, %zu bytes): %s after %d tries", l->path,
            p->key.layer, p->key.bundle, (unsigned long long)job->file_offset, l->b->stride, why, p->tries);
    return -1;
}

int bundle_loader_load(bundle_loader *l, const bundle_key *keys, int n, int *unplaced, char *err, size_t errlen) {
    const double t0 = clock_seconds();
    if (unplaced) *unplaced = 0;
    if (n <= 0) return 0;
    for (int i = 0; i < n; i++)
        if (keys[i].layer >= (uint32_t)l->b->n_layer || keys[i].bundle >= (uint64_t)l->b->n_bundles) {
            err_set(err, errlen, "%s: no layer %u bundle %u (the file has %d layers of %ld bundles)", l->path,
                    keys[i].layer, keys[i].bundle, l->b->n_layer, l->b->n_bundles);
            return -1;
        }
    pending *p = calloc((size_t)n, sizeof *p);
    io_job *jobs = calloc((size_t)n, sizeof *jobs);
    int *map = calloc((size_t)n, sizeof *map); /* job j reads p[map[j]] */
    if (!p || !jobs || !map) {
        free(p), free(jobs), free(map);
        err_set(err, errlen, "out of memory for a batch of %d bundles", n);
        return -1;
    }
    int claimed = 0;
    for (int i = 0; i < n; i++) {
        bool repeat = false; /* a key twice in one batch would take two slots */
        for (int j = 0; j < claimed && !repeat; j++)
            repeat = p[j].key.layer == keys[i].layer && p[j].key.bundle == keys[i].bundle;
        if (repeat) {
            l->stats.already++;
            continue;
        }
        p[claimed].key = keys[i];
        p[claimed].slot = ncache_claim(l->cache, keys[i].layer, 0, keys[i].bundle, &p[claimed].dest);
        if (p[claimed].slot >= 0) {
            claimed++;
            continue;
        }
        if (ncache_contains(l->cache, keys[i].layer, 0, keys[i].bundle)) /* nothing to do */
            l->stats.already++;
        else if (unplaced) /* every slot pinned or loading */
            (*unplaced)++;
    }
    int rc = 0, left = claimed;
    while (left > 0) { /* after a failure the others still get their tries */
        int nj = 0;
        for (int i = 0; i < claimed; i++)
            if (!p[i].done) {
                map[nj] = i;
                jobs[nj] = (io_job){bundle_file_offset(l->b, (int)p[i].key.layer, (long)p[i].key.bundle),
                                    (uint32_t)l->b->stride, p[i].dest, 0};
                p[i].tries++;
                nj++;
            }
        uring_reader_run(l->reader, jobs, (size_t)nj, NULL, NULL);
        for (int j = 0; j < nj; j++) {
            pending *q = &p[map[j]];
            if (l->fault) l->fault(l->fault_ctx, &q->key, &jobs[j]);
            if (read_ok(l, q, &jobs[j])) {
                ncache_publish(l->cache, q->slot);
                q->done = true;
                left--;
                l->stats.bundles++;
                l->stats.bytes += l->b->stride;
            } else if (q->tries >= BUNDLE_READ_TRIES) {
                if (rc == 0) rc = fail(l, q, &jobs[j], err, errlen); /* the first failure is reported */
                q->done = true;
                ncache_abandon(l->cache, q->slot);
                left--;
            } else {
                l->stats.retries++;
            }
        }
    }
    l->stats.seconds += clock_seconds() - t0;
    free(p), free(jobs), free(map);
    return rc;
}

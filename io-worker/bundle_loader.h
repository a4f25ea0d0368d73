/* The io-worker's bundle loads (docs/offload.md): a worker's misses for a
 * layer arrive as one batch of (layer, bundle) keys; each gets a cold-cache
 * slot (ncache_claim), all are read with one io_uring (O_DIRECT, the plan's
 * queue depth) straight into their slots, each is checked against its own
 * checksum (bundle_check) and published, so the waiting worker pins it
 * without another message. A read that fails, comes back short or does not
 * match its checksum is read again up to BUNDLE_READ_TRIES times; after that
 * the slot is abandoned and the batch reports an error naming the bundle, its
 * file offset and the file: never wrong weights in a slot. */
#ifndef PI2_IO_BUNDLE_LOADER_H
#define PI2_IO_BUNDLE_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan/bundle.h"
#include "stack/neuron_cache.h"
#include "util/uring_reader.h"

#define BUNDLE_READ_TRIES 3

typedef struct {
    uint32_t layer, bundle;
} bundle_key;

typedef struct {
    uint64_t bundles, bytes;  /* loaded */
    uint64_t already;         /* asked for but cached or loading already */
    uint64_t retries;         /* reads done again */
    uint64_t bad_checksums;   /* reads whose bytes did not match */
    double seconds;           /* in loads */
} bundle_load_stats;

/* A test-only switch: called on each completed read before the check (it may
 * change the bytes or the result, as a failing disk would). */
typedef void (*bundle_fault_fn)(void *ctx, const bundle_key *key, io_job *job);

typedef struct {
    const bundle_file *b;
    const char *path;       /* for messages */
    uring_reader *reader;   /* on the bundle file */
    ncache *cache;
    bool verify;            /* check every bundle's checksum (on by default; its cost is measured) */
    bundle_fault_fn fault;
    void *fault_ctx;
    bundle_load_stats stats;
} bundle_loader;

/* Loads the keys' bundles into the cache. 0, or -1 with err set (what could
 * be loaded is published; the rest abandoned). Keys outside the file's shape
 * are an error. When every slot is pinned or loading, the bundles that found
 * none are left out and counted as *unplaced (may be NULL). */
int bundle_loader_load(bundle_loader *l, const bundle_key *keys, int n, int *unplaced, char *err, size_t errlen);

#endif

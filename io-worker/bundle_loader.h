/* The io-worker's bundle loads (docs/offload.md): a worker's misses for a
 * layer arrive as one batch of (layer, bundle) keys; each gets a cold-cache
 * slot (ncache_claim) and is read through the io_uring (O_DIRECT, the plan's
 * queue depth) straight into its slot, checked against its own checksum
 * (bundle_check) and published as soon as it lands, so the waiting worker can
 * pin it without another message. Batches are asynchronous: several (one per
 * cpu-worker) share the ring, so it stays full while any worker has misses;
 * a bundle already being read for one batch is waited for, not read twice. A
 * read that fails, comes back short or does not match its checksum is read
 * again up to BUNDLE_READ_TRIES times; after that the slot is abandoned and
 * the batch reports an error naming the bundle, its file offset and the file:
 * never wrong weights in a slot. */
#ifndef PI2_IO_BUNDLE_LOADER_H
#define PI2_IO_BUNDLE_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan/bundle.h"
#include "stack/neuron_cache.h"
#include "util/file_reader.h"

#define BUNDLE_READ_TRIES 3

typedef struct {
    uint32_t layer, bundle;
} bundle_key;

typedef struct {
    uint64_t bundles, bytes;  /* loaded */
    uint64_t already;         /* asked for but cached or being read already */
    uint64_t retries;         /* reads done again */
    uint64_t bad_checksums;   /* reads whose bytes did not match */
    uint64_t batches;         /* finished */
    uint64_t batch_us;        /* their time from start to finish, summed */
} bundle_load_stats;

/* What a finished batch reports. */
typedef struct {
    uint32_t loaded;          /* bundles this batch read */
    uint32_t unplaced;        /* bundles that found no slot: every slot pinned or loading */
    uint64_t bytes;
    uint64_t time_us;         /* start to finish */
    char error[512];          /* empty when every bundle asked for is cached (or found no slot) */
} bundle_batch_result;

typedef void (*bundle_batch_fn)(void *ctx, const bundle_batch_result *res);

/* A test-only switch: called on each completed read before the check (it may
 * change the bytes or the result, as a failing disk would). */
typedef void (*bundle_fault_fn)(void *ctx, const bundle_key *key, io_job *job);

struct bundle_read;

typedef struct {
    const bundle_file *b;
    const char *path;       /* for messages */
    file_reader *reader;   /* on the bundle file */
    ncache *cache;
    bool verify;            /* check every bundle's checksum (on by default; its cost is measured) */
    bundle_fault_fn fault;
    void *fault_ctx;
    bundle_load_stats stats;
    struct bundle_read **reading; /* [layer * n_bundles + bundle]: the read in flight, if any */
    int open_batches;
} bundle_loader;

/* Starts loading the keys' bundles; done(ctx, result) is called once every
 * read of the batch has finished (from bundle_loader_poll; at once when there
 * is nothing to read). -1 with err, and done not called, when a key is
 * outside the file's shape or memory ran out. */
int bundle_loader_start(bundle_loader *l, const bundle_key *keys, int n, bundle_batch_fn done, void *ctx, char *err,
                        size_t errlen);
/* Finishes the reads that completed, waiting up to wait_ms for one; batches
 * whose reads are all done are reported. */
void bundle_loader_poll(bundle_loader *l, int wait_ms);
/* Batches started and not reported yet. */
int bundle_loader_busy(const bundle_loader *l);
/* Lets every batch finish (its reads cannot be taken back from the kernel),
 * then frees the loader's state; the loader can start again afterwards. */
void bundle_loader_drain(bundle_loader *l);

#endif

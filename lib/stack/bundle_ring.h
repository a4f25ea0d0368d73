/* A cpu-worker's bundle loads to the io-worker through shared memory
 * (docs/offload.md, "The request ring"): the worker writes a batch of a
 * layer's bundle ids into its ring, and the io-worker answers in the same
 * place (the last batch over, the last one failed and why, the bytes read).
 * Over the bus each batch cost a message there and one back, each waking the
 * ZeroMQ threads of both processes on the cores that compute.
 *
 * One ring per cpu-worker: a single producer (the worker) and a single
 * consumer (the io-worker). The io-worker trusts nothing it takes: a record
 * whose length runs past what was written, or a ring whose counters are apart
 * by more than its size, is reported and the ring emptied; the ids themselves
 * are checked by the caller against the model and the bundle file.
 *
 * Batch ids carry the worker's pid in their top 32 bits, so that a restarted
 * worker's batches are never taken for its predecessor's: an answer counts
 * for a batch only when the pid matches and the id is at least the one
 * awaited.
 *
 * Errors: bundle_ring_push returns -1 when the batch does not fit now (the
 * caller sends it over the bus); bundle_ring_pop returns -1 with a message
 * for a damaged ring. */
#ifndef PI2_BUNDLE_RING_H
#define PI2_BUNDLE_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define BUNDLE_RING_WORDS 4096u /* a power of two; a batch of up to BUNDLE_RING_WORDS - 4 bundles fits */
#define BUNDLE_RING_ERROR 512 /* as a finished batch's error (bundle_loader.h) */

typedef struct {
    _Alignas(64) _Atomic uint64_t tail; /* words written: the worker's */
    _Alignas(64) _Atomic uint64_t head; /* words taken: the io-worker's */
    _Alignas(64) _Atomic uint64_t done; /* the answers: the io-worker's */
    _Atomic uint64_t failed;
    _Atomic uint64_t bytes;             /* read for this worker's batches, a running total */
    _Atomic uint64_t resets;            /* times the io-worker found the ring damaged and emptied it */
    char error[BUNDLE_RING_ERROR];      /* why batch `failed` failed, or the last reset */
    uint32_t words[BUNDLE_RING_WORDS];  /* records: n, layer, id low, id high, n bundle ids */
} bundle_ring;

/* A fresh ring (its words need no clearing). */
void bundle_ring_init(bundle_ring *r);

/* The worker: queues batch id of layer's bundles[0..n). 0, or -1 when there is no room now. */
int bundle_ring_push(bundle_ring *r, uint64_t id, uint32_t layer, const uint32_t *bundles, uint32_t n);

/* The io-worker: the next batch, its bundle ids copied into bundles (room for cap). 1 when one
 * was taken, 0 when the ring is empty, -1 with err when the ring was damaged: it is emptied and
 * `resets` counts it, so that the worker does not wait for batches that were dropped. */
int bundle_ring_pop(bundle_ring *r, uint64_t *id, uint32_t *layer, uint32_t *bundles, uint32_t cap, uint32_t *n,
                    char *err, size_t errlen);
/* Whether the worker has written what the io-worker has not taken. */
int bundle_ring_pending(const bundle_ring *r);

/* The io-worker: batch id is over, with bytes read for it; error NULL or empty when every bundle asked
 * for is cached now or found no slot. */
void bundle_ring_answer(bundle_ring *r, uint64_t id, uint64_t bytes, const char *error);

/* The worker: 1 when batch id is over, -1 when it failed (its error copied into err) or the ring was
 * reset since `resets` was read before it was queued, 0 not yet. */
int bundle_ring_outcome(const bundle_ring *r, uint64_t id, uint64_t resets, char *err, size_t errlen);

#endif

/* The neuron cache's slot table: which FFN bundles (docs/bundle.md) sit in
 * which slots of the cold cache, in shared memory, so a worker finds a
 * bundle without a round trip (docs/offload.md).
 *
 * A bundle is keyed by (layer, expert, bundle); dense models use expert 0,
 * so mixture-of-experts models fit later. The table is an index
 * [layer][expert][bundle] -> slot (or -1) and, per slot, its key and one
 * atomic word: generation (32 bits) | state (2) | pins (30).
 *
 * Readers (the workers, any number, any process) pin a slot: a CAS that adds
 * a pin only while the slot is READY, then a check that the slot still holds
 * the key asked for (the index may be stale). While pinned, a slot is never
 * reused, so its bytes are stable; unpin when done.
 *
 * One writer at a time (the io-worker) reuses slots: CLOCK over the slots,
 * skipping pinned ones and giving referenced ones a second chance; claiming
 * moves a slot to LOADING with the next generation (a CAS that requires no
 * pins), so no reader can pin it until it is published with its new key.
 *
 * A reader killed while it holds pins leaves them held (the stack's
 * cpu-workers log theirs, so the process that takes a killed one's place
 * lets them go: cpu-worker/ffn_offload.c), a writer killed mid-read leaves a
 * slot LOADING, which its successor returns (ncache_writer_restart).
 *
 * Errors: ncache_create and ncache_attach return NULL with a message in err
 * (errlen bytes). NULL from ncache_pin and -1 from ncache_claim are answers
 * (not cached; no slot free), not faults. Publishing or abandoning a slot
 * that is not LOADING logs an error (log_error) and changes nothing. */
#ifndef PI2_NEURON_CACHE_H
#define PI2_NEURON_CACHE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NCACHE_MAGIC 0x31484341434e4950ull /* "PINCACH1" */
#define NCACHE_MAX_LAYERS 4096
#define NCACHE_MAX_EXPERTS 256
#define NCACHE_MAX_BUNDLES (1u << 24)
#define NCACHE_MAX_SLOTS (1u << 26)

typedef struct {
    uint32_t n_layer, n_expert, n_bundles; /* n_bundles per (layer, expert) */
    uint32_t n_slots;
    uint64_t slot_bytes;                   /* a multiple of 4096: slots are O_DIRECT targets */
} ncache_shape;

typedef struct ncache ncache;

/* A pinned slot: what to unpin. */
typedef struct {
    int64_t slot;
} ncache_ref;

typedef struct {
    uint64_t hits, misses, loads, evictions;
} ncache_stats;

/* Bytes of the table for a shape (header, slots, index); 0 if the shape is out of range. */
size_t ncache_table_bytes(const ncache_shape *s);

/* Lays out a fresh table in `table` (ncache_table_bytes(s) bytes, 64-byte
 * aligned): every slot empty. `data` holds the slots' bytes (n_slots *
 * slot_bytes). Returns the handle (malloc'd), or NULL with err set. */
ncache *ncache_create(void *table, size_t table_bytes, uint8_t *data, size_t data_bytes, const ncache_shape *s,
                      char *err, size_t errlen);
/* Attaches a table another process made: validates the header against the
 * sizes given and every index entry and key. NULL with err set. */
ncache *ncache_attach(void *table, size_t table_bytes, uint8_t *data, size_t data_bytes, char *err, size_t errlen);
void ncache_detach(ncache *c); /* frees the handle, not the table */
const ncache_shape *ncache_shape_of(const ncache *c);

/* Readers. The bundle's bytes, pinned (unpin with the ref), or NULL if it is not cached. */
const uint8_t *ncache_pin(ncache *c, uint32_t layer, uint32_t expert, uint32_t bundle, ncache_ref *ref);
void ncache_unpin(ncache *c, const ncache_ref *ref);

/* Whether the bundle is cached (published), without pinning it or counting a hit. */
bool ncache_contains(const ncache *c, uint32_t layer, uint32_t expert, uint32_t bundle);

/* The writer. A slot for the bundle, its previous bundle evicted: LOADING,
 * *dest its bytes to fill. -1 when the bundle is cached already or outside
 * the shape, or no slot could be taken in two sweeps (every slot pinned or
 * loading, or re-referenced by readers as fast as the sweep clears them).
 * The bundle must not be loading already (the writer keeps one claim per
 * bundle). */
int64_t ncache_claim(ncache *c, uint32_t layer, uint32_t expert, uint32_t bundle, uint8_t **dest);
/* The claimed (LOADING) slot's bytes are in place: readers may pin it. */
void ncache_publish(ncache *c, int64_t slot);
/* The read failed: the slot goes back empty. */
void ncache_abandon(ncache *c, int64_t slot);

/* A new writer taking over from one that died (the io-worker restarted):
 * its LOADING slots go back empty, its published but unindexed ones are
 * indexed. Safe while readers run (they never pin a LOADING slot). */
void ncache_writer_restart(ncache *c);
void ncache_get_stats(const ncache *c, ncache_stats *out);
/* A snapshot of the slots: how many are pinned by some reader, and loading (`pi2 status`). */
void ncache_census(const ncache *c, uint32_t *pinned, uint32_t *loading);

#endif

/* The load of a packed hot region (stack/offload.h): a packed hot bundle
 * does not start on a 4096-byte boundary, so O_DIRECT cannot read it in
 * place. Chunks of a layer's hot bundles are read as the file lays them out
 * into staging buffers in the cold region (empty until the slot table is
 * laid out after the load) and copied packed into the hot region; each
 * bundle is then checked as the hot region holds it (its rows, and zeros for
 * the file's padding), so a read that lands in a buffer late cannot slip
 * unchecked bytes in.
 *
 * A batch sent again (its io-worker did not answer in time) goes to the same
 * buffer, so whichever send lands, the bytes are the same; once it is in,
 * the other send may still be reading into that buffer, so it is retired,
 * never handed out again. */
#ifndef PI2_HOT_STAGING_H
#define PI2_HOT_STAGING_H

#include <stdbool.h>
#include <stdint.h>

#include "stack/offload.h"

#define HOT_STAGING_BUFFERS 4
#define HOT_STAGING_MAX_BYTES (16u << 20)

typedef struct {
    int n_buffers;
    uint64_t buffer_bytes;        /* a multiple of the bundle stride */
    bool busy[HOT_STAGING_BUFFERS];
    bool retired[HOT_STAGING_BUFFERS];
    uint8_t *check;               /* [stride]: a landed bundle as the file has it, for its checksum */
} hot_staging;

/* Buffers for o's packed load in a cold region of cold_bytes. -1 when it
 * cannot hold one bundle (the plan's checks refuse such a plan) or out of
 * memory. */
int hot_staging_init(hot_staging *s, const offload *o, uint64_t cold_bytes);
void hot_staging_free(hot_staging *s);

/* Bundles of a chunk: as many as a buffer holds. */
static inline long hot_staging_chunk_bundles(const hot_staging *s, const offload *o) {
    return (long)(s->buffer_bytes / o->stride);
}

/* A free buffer, marked busy, or -1 while every one is busy or retired. */
int hot_staging_take(hot_staging *s);
/* Buffer i is free again; a retired one stays out of use. */
void hot_staging_give(hot_staging *s, int i);
void hot_staging_retire(hot_staging *s, int i);
/* Every buffer retired: the load cannot go on. */
bool hot_staging_exhausted(const hot_staging *s);

/* Layer l's bundles first .. first + n - 1, read into staging buffer i of
 * `cold`: copied packed to their place in `hot` and checked there. -1
 * (logged, naming the bundle file, layer, bundle and offset) when one does
 * not match its checksum. */
int hot_staging_land(const hot_staging *s, const offload *o, int i, const uint8_t *cold, uint8_t *hot, int l,
                     long first, long n);

#endif

/* A cpu-worker's FFN chunks of one decode step, in shared memory, so that a
 * worker that runs out of its own chunks can take the rest of a slower
 * worker's: its threads take from the front, in batches, and the other
 * workers' threads take one chunk at a time from the back. Every chunk is
 * taken exactly once, and a chunk's partial does not depend on who computes
 * it (ffn_chunks.h), so the result's bits do not change.
 *
 * A queue holds one step at a time: entries are valid for the tag they were
 * published with (the step's barrier tag, the same in every worker), and a
 * taker with another tag takes nothing. The cursor packs tag (32 bits),
 * front and back (16 bits each) into one word, changed only by CAS.
 *
 * Errors: none: the calls cannot fail; an empty queue, or one that holds
 * another step, is an answer (0, or -1 from chunk_queue_steal). n <= capacity
 * is the caller's to keep. */
#ifndef PI2_CHUNK_QUEUE_H
#define PI2_CHUNK_QUEUE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define CHUNK_QUEUE_MAX 65535 /* entries: front and back are 16 bits */

typedef struct {
    _Atomic uint64_t cursor;
    int32_t chunks[];
} chunk_queue;

/* Bytes of one queue of up to capacity entries, a multiple of 64 (queues
 * side by side never share a cache line). */
size_t chunk_queue_bytes(int capacity);
/* Queue i of an array of queues of that capacity starting at base. */
chunk_queue *chunk_queue_at(void *base, int capacity, int i);

/* The owner: chunks[0..n) (n <= capacity) become the queue of step tag. */
void chunk_queue_publish(chunk_queue *q, uint32_t tag, const int32_t *chunks, int n);
/* The owner's threads: take about 1/divisor of what is left (at least one;
 * divisor 1 takes all) from the front. Returns how many, 0 when empty or
 * the queue holds another step; *taken points at them, in published order. */
int chunk_queue_take(chunk_queue *q, uint32_t tag, int divisor, const int32_t **taken);
/* Another worker's threads: the last entry. Returns 1 (taken into *chunk),
 * 0 when empty, or -1 when the queue holds another step (its owner has not
 * published this one yet). */
int chunk_queue_steal(chunk_queue *q, uint32_t tag, int32_t *chunk);

#endif

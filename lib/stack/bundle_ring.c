/* The bundle request ring (bundle_ring.h). */
#include "stack/bundle_ring.h"

#include <stdio.h>
#include <string.h>

#define RING_MASK (BUNDLE_RING_WORDS - 1u)
#define HEADER_WORDS 4u

void bundle_ring_init(bundle_ring *r) {
    atomic_store(&r->tail, 0);
    atomic_store(&r->head, 0);
    atomic_store(&r->done, 0);
    atomic_store(&r->failed, 0);
    atomic_store(&r->bytes, 0);
    atomic_store(&r->resets, 0);
    r->error[0] = 0;
}

int bundle_ring_push(bundle_ring *r, uint64_t id, uint32_t layer, const uint32_t *bundles, uint32_t n) {
    const uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    const uint64_t used = tail - atomic_load_explicit(&r->head, memory_order_acquire);
    if (used > BUNDLE_RING_WORDS || (uint64_t)n + HEADER_WORDS > BUNDLE_RING_WORDS - used) return -1;
    const uint32_t header[HEADER_WORDS] = {n, layer, (uint32_t)id, (uint32_t)(id >> 32)};
    for (uint32_t i = 0; i < HEADER_WORDS; i++) r->words[(tail + i) & RING_MASK] = header[i];
    for (uint32_t i = 0; i < n; i++) r->words[(tail + HEADER_WORDS + i) & RING_MASK] = bundles[i];
    /* sequentially consistent: the caller then reads whether the io-worker sleeps, and it sets that before
     * it looks at the rings a last time (io-worker/serve.c) */
    atomic_store(&r->tail, tail + HEADER_WORDS + n);
    return 0;
}

int bundle_ring_pending(const bundle_ring *r) {
    return atomic_load(&r->tail) != atomic_load_explicit(&r->head, memory_order_relaxed);
}

int bundle_ring_pop(bundle_ring *r, uint64_t *id, uint32_t *layer, uint32_t *bundles, uint32_t cap, uint32_t *n,
                    char *err, size_t errlen) {
    const uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    const uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (tail == head) return 0;
    const uint64_t written = tail - head;
    if (written > BUNDLE_RING_WORDS || written < HEADER_WORDS) {
        snprintf(err, errlen, "%llu words written and %llu taken: further apart than a ring of %u words",
                 (unsigned long long)tail, (unsigned long long)head, BUNDLE_RING_WORDS);
        goto damaged;
    }
    const uint32_t count = r->words[head & RING_MASK];
    if (count > written - HEADER_WORDS || count > cap) {
        snprintf(err, errlen, "a record of %u bundles at word %llu where %llu words were written (room for %u)",
                 count, (unsigned long long)head, (unsigned long long)(written - HEADER_WORDS), cap);
        goto damaged;
    }
    *layer = r->words[(head + 1) & RING_MASK];
    *id = (uint64_t)r->words[(head + 2) & RING_MASK] | (uint64_t)r->words[(head + 3) & RING_MASK] << 32;
    for (uint32_t i = 0; i < count; i++) bundles[i] = r->words[(head + HEADER_WORDS + i) & RING_MASK];
    *n = count;
    atomic_store_explicit(&r->head, head + HEADER_WORDS + count, memory_order_release);
    return 1;
damaged:
    snprintf(r->error, sizeof r->error, "the io-worker found the ring damaged: %s", err);
    atomic_store_explicit(&r->head, tail, memory_order_release);
    atomic_fetch_add_explicit(&r->resets, 1, memory_order_release);
    return -1;
}

void bundle_ring_answer(bundle_ring *r, uint64_t id, uint64_t bytes, const char *error) {
    atomic_fetch_add(&r->bytes, bytes);
    if (error && *error) {
        snprintf(r->error, sizeof r->error, "%s", error);
        atomic_store_explicit(&r->failed, id, memory_order_release);
    }
    /* batches may end out of order: done only moves up, except for a new worker's (another pid) */
    const uint64_t done = atomic_load_explicit(&r->done, memory_order_relaxed);
    if (done >> 32 != id >> 32 || id > done) atomic_store_explicit(&r->done, id, memory_order_release);
}

static int copy_error(const bundle_ring *r, char *err, size_t errlen) {
    char text[BUNDLE_RING_ERROR];
    memcpy(text, r->error, sizeof text);
    text[sizeof text - 1] = 0;
    snprintf(err, errlen, "%s", text);
    return -1;
}

int bundle_ring_outcome(const bundle_ring *r, uint64_t id, uint64_t resets, char *err, size_t errlen) {
    if (atomic_load_explicit(&r->resets, memory_order_acquire) != resets) return copy_error(r, err, errlen);
    const uint64_t done = atomic_load_explicit(&r->done, memory_order_acquire);
    if (done >> 32 != id >> 32 || done < id) return 0;
    if (atomic_load_explicit(&r->failed, memory_order_acquire) != id) return 1;
    return copy_error(r, err, errlen);
}

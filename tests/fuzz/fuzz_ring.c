/* libFuzzer harness: a cpu-worker's bundle ring as the io-worker finds it
 * (lib/stack/bundle_ring.c), every byte of its counters and words from the
 * input: bundle_ring_pop takes records until the ring is empty or found
 * damaged, never reading past its words or returning more than it has room for. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stack/bundle_ring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bundle_ring r;
    static uint32_t ids[BUNDLE_RING_WORDS];
    uint64_t head = 0, tail = 0;
    if (size >= 16) {
        memcpy(&head, data, 8);
        memcpy(&tail, data + 8, 8);
        data += 16, size -= 16;
    }
    bundle_ring_init(&r);
    memset(r.words, 0, sizeof r.words);
    memcpy(r.words, data, size < sizeof r.words ? size : sizeof r.words);
    atomic_store(&r.head, head);
    atomic_store(&r.tail, tail);
    const uint32_t cap = 1 + (uint32_t)(head % BUNDLE_RING_WORDS); /* the taker's room varies too */
    char err[256];
    for (int k = 0; k < 2 * (int)BUNDLE_RING_WORDS; k++) {
        uint64_t id;
        uint32_t layer, n;
        const int rc = bundle_ring_pop(&r, &id, &layer, ids, cap, &n, err, sizeof err);
        if (rc == 1 && n > cap) abort();
        if (rc == -1 && bundle_ring_pending(&r)) abort(); /* a damaged ring is emptied */
        if (rc != 1) break;
    }
    return 0;
}

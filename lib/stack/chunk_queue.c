#include "stack/chunk_queue.h"

#define CURSOR(tag, front, back) (((uint64_t)(tag) << 32) | ((uint64_t)(front) << 16) | (uint64_t)(back))
#define C_TAG(c) ((uint32_t)((c) >> 32))
#define C_FRONT(c) ((int)(((c) >> 16) & 0xffff))
#define C_BACK(c) ((int)((c) & 0xffff))

size_t chunk_queue_bytes(int capacity) {
    size_t n = sizeof(chunk_queue) + (size_t)capacity * sizeof(int32_t);
    return (n + 63) & ~(size_t)63;
}

chunk_queue *chunk_queue_at(void *base, int capacity, int i) {
    return (chunk_queue *)((char *)base + (size_t)i * chunk_queue_bytes(capacity));
}

/* The entries are written before the cursor that makes them visible (release). */
void chunk_queue_publish(chunk_queue *q, uint32_t tag, const int32_t *chunks, int n) {
    for (int i = 0; i < n; i++) q->chunks[i] = chunks[i];
    /* release: the chunk ids above are seen by whoever reads this cursor with acquire (take, steal) */
    atomic_store_explicit(&q->cursor, CURSOR(tag, 0, n), memory_order_release);
}

int chunk_queue_take(chunk_queue *q, uint32_t tag, int divisor, const int32_t **taken) {
    /* acquire: pairs with chunk_queue_publish's release (the ids); the CAS's acq_rel orders takers and
     * stealers among themselves */
    uint64_t c = atomic_load_explicit(&q->cursor, memory_order_acquire), next;
    int front, k;
    do {
        front = C_FRONT(c);
        int left = C_BACK(c) - front;
        if (C_TAG(c) != tag || left <= 0) return 0;
        k = (left + divisor - 1) / divisor;
        next = CURSOR(tag, front + k, C_BACK(c));
    } while (!atomic_compare_exchange_weak_explicit(&q->cursor, &c, next, memory_order_acq_rel,
                                                    memory_order_acquire));
    *taken = &q->chunks[front];
    return k;
}

/* The entry is read before the CAS that claims it: until the CAS the owner
 * cannot republish (it would have to pass a barrier this thread has not
 * reached), and a failed CAS discards the read. */
int chunk_queue_steal(chunk_queue *q, uint32_t tag, int32_t *chunk) {
    /* acquire: pairs with chunk_queue_publish's release, so chunks[back - 1] below is the published id */
    uint64_t c = atomic_load_explicit(&q->cursor, memory_order_acquire);
    for (;;) {
        if (C_TAG(c) != tag) return -1;
        int back = C_BACK(c);
        if (back <= C_FRONT(c)) return 0;
        *chunk = q->chunks[back - 1];
        if (atomic_compare_exchange_weak_explicit(&q->cursor, &c, CURSOR(tag, C_FRONT(c), back - 1),
                                                  memory_order_acq_rel, memory_order_acquire))
            return 1;
    }
}

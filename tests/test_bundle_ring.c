/* lib/stack/bundle_ring.c: batches through the ring and back out whole
 * across its wrap, a full ring refusing a batch, damaged counters and
 * records found and reported (the ring emptied, its resets counted), the
 * answers (out of order, a restarted worker's pid, failures with their text),
 * and a producer and a consumer thread passing many batches of every size. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stack/bundle_ring.h"
#include "test.h"

static bundle_ring *new_ring(void) {
    bundle_ring *r = aligned_alloc(64, sizeof *r);
    memset(r, 0xa5, sizeof *r); /* the words are never cleared: garbage where nothing was written */
    bundle_ring_init(r);
    return r;
}

static uint32_t ids[BUNDLE_RING_WORDS];

static int pop(bundle_ring *r, uint64_t *id, uint32_t *layer, uint32_t *n, char *err) {
    return bundle_ring_pop(r, id, layer, ids, BUNDLE_RING_WORDS, n, err, 256);
}

static void test_round_trip(void) {
    bundle_ring *r = new_ring();
    uint32_t b[1000];
    for (uint32_t i = 0; i < 1000; i++) b[i] = i * 7 + 1;
    uint64_t id;
    uint32_t layer, n;
    char err[256] = "";
    CHECK(pop(r, &id, &layer, &n, err) == 0 && !bundle_ring_pending(r), "a fresh ring is empty");
    /* batches of 1000 bundles: the fifth wraps past the end of the words */
    int bad = 0;
    for (int k = 0; k < 12; k++) {
        const uint64_t want = (uint64_t)4242 << 32 | (uint64_t)(k + 1);
        b[0] = (uint32_t)k;
        bad += bundle_ring_push(r, want, (uint32_t)(k % 32), b, 1000) != 0;
        bad += !bundle_ring_pending(r);
        bad += pop(r, &id, &layer, &n, err) != 1;
        bad += id != want || layer != (uint32_t)(k % 32) || n != 1000 || ids[0] != (uint32_t)k || ids[999] != b[999];
    }
    CHECK(bad == 0, "12 batches of 1000 through a ring of %u words: %d wrong", BUNDLE_RING_WORDS, bad);
    /* room for exactly one record of BUNDLE_RING_WORDS - 4 bundles; then none until it is taken */
    static uint32_t big[BUNDLE_RING_WORDS];
    CHECK(bundle_ring_push(r, 1, 0, big, BUNDLE_RING_WORDS - 3) == -1, "a batch longer than the ring is refused");
    CHECK(bundle_ring_push(r, 1, 0, big, BUNDLE_RING_WORDS - 4) == 0, "a batch filling the ring fits");
    CHECK(bundle_ring_push(r, 2, 0, b, 1) == -1, "a full ring refuses the next");
    CHECK(pop(r, &id, &layer, &n, err) == 1 && n == BUNDLE_RING_WORDS - 4, "the big one comes out: %u", n);
    CHECK(bundle_ring_push(r, 2, 0, b, 1) == 0, "then there is room");
    free(r);
}

static void test_damage(void) {
    bundle_ring *r = new_ring();
    uint32_t b[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint64_t id;
    uint32_t layer, n;
    char err[256] = "", why[BUNDLE_RING_ERROR];
    /* a record claiming more bundles than were written */
    bundle_ring_push(r, 9, 1, b, 8);
    r->words[0] = 500;
    CHECK(pop(r, &id, &layer, &n, err) == -1 && strstr(err, "a record of 500 bundles"), "a long record: %s", err);
    CHECK(!bundle_ring_pending(r) && atomic_load(&r->resets) == 1, "the ring emptied, the reset counted");
    CHECK(bundle_ring_outcome(r, 9, 0, why, sizeof why) == -1 && strstr(why, "damaged"),
          "a batch queued before the reset fails with the reason: %s", why);
    /* counters apart by more than the ring */
    atomic_store(&r->tail, atomic_load(&r->head) + BUNDLE_RING_WORDS + 1);
    CHECK(pop(r, &id, &layer, &n, err) == -1 && strstr(err, "further apart"), "counters too far apart: %s", err);
    CHECK(!bundle_ring_pending(r), "emptied again");
    CHECK(bundle_ring_push(r, 10, 1, b, 8) == 0 && pop(r, &id, &layer, &n, err) == 1 && id == 10 && n == 8,
          "the ring works after");
    /* a record longer than the taker's room */
    bundle_ring_push(r, 11, 1, b, 8);
    CHECK(bundle_ring_pop(r, &id, &layer, ids, 4, &n, err, sizeof err) == -1 && strstr(err, "room for 4"),
          "more bundles than the taker has room for: %s", err);
    free(r);
}

static void test_answers(void) {
    bundle_ring *r = new_ring();
    const uint64_t pid = (uint64_t)1234 << 32, other = (uint64_t)99 << 32;
    char why[BUNDLE_RING_ERROR];
    CHECK(bundle_ring_outcome(r, pid | 1, 0, why, sizeof why) == 0, "nothing answered yet");
    bundle_ring_answer(r, pid | 2, 8192, NULL);
    CHECK(bundle_ring_outcome(r, pid | 2, 0, why, sizeof why) == 1, "batch 2 over");
    CHECK(bundle_ring_outcome(r, pid | 3, 0, why, sizeof why) == 0, "batch 3 not yet");
    bundle_ring_answer(r, pid | 1, 8192, ""); /* an older batch ending late */
    CHECK(bundle_ring_outcome(r, pid | 2, 0, why, sizeof why) == 1, "a late older answer does not take batch 2 back");
    CHECK(atomic_load(&r->bytes) == 16384, "bytes add up: %llu", (unsigned long long)atomic_load(&r->bytes));
    CHECK(bundle_ring_outcome(r, other | 1, 0, why, sizeof why) == 0,
          "another pid's batch 1 is not answered by this pid's batch 2");
    bundle_ring_answer(r, other | 1, 0, NULL);
    CHECK(bundle_ring_outcome(r, other | 1, 0, why, sizeof why) == 1, "a restarted worker's first batch over");
    bundle_ring_answer(r, other | 2, 0, "bundles.gguf: layer 3 bundle 7: short read after 3 tries");
    CHECK(bundle_ring_outcome(r, other | 2, 0, why, sizeof why) == -1 && strstr(why, "bundles.gguf: layer 3"),
          "a failed batch with its reason: %s", why);
    bundle_ring_answer(r, other | 3, 0, NULL);
    CHECK(bundle_ring_outcome(r, other | 3, 0, why, sizeof why) == 1, "the next one succeeds");
    free(r);
}

/* A producer pushes batches of 1..2000 bundles (retrying when full); the consumer checks each. */
#define BATCHES 20000

typedef struct {
    bundle_ring *r;
    long bad, taken;
} race;

static uint32_t size_of(uint32_t k) { return 1 + (k * 2654435761u >> 7) % 2000; }

static void *produce(void *arg) {
    race *x = arg;
    static uint32_t b[2000];
    for (uint32_t k = 1; k <= BATCHES; k++) {
        const uint32_t n = size_of(k);
        for (uint32_t i = 0; i < n; i++) b[i] = k ^ i;
        while (bundle_ring_push(x->r, k, k % 80, b, n)) {
        }
    }
    return NULL;
}

static void *consume(void *arg) {
    race *x = arg;
    static uint32_t b[BUNDLE_RING_WORDS];
    char err[256];
    while (x->taken < BATCHES) {
        uint64_t id;
        uint32_t layer, n;
        const int rc = bundle_ring_pop(x->r, &id, &layer, b, BUNDLE_RING_WORDS, &n, err, sizeof err);
        if (rc < 0) {
            x->bad++;
            continue;
        }
        if (rc == 0) continue;
        x->taken++;
        int wrong = id != (uint64_t)x->taken || layer != id % 80 || n != size_of((uint32_t)id);
        for (uint32_t i = 0; !wrong && i < n; i++) wrong = b[i] != ((uint32_t)id ^ i);
        x->bad += wrong;
    }
    return NULL;
}

static void test_race(void) {
    race x = {.r = new_ring()};
    pthread_t p, c;
    pthread_create(&c, NULL, consume, &x);
    pthread_create(&p, NULL, produce, &x);
    pthread_join(p, NULL);
    pthread_join(c, NULL);
    CHECK(x.taken == BATCHES && x.bad == 0, "%ld batches taken of %d, %ld wrong", x.taken, BATCHES, x.bad);
    free(x.r);
}

int main(void) {
    test_round_trip();
    test_damage();
    test_answers();
    test_race();
    return test_summary();
}

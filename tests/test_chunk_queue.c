/* lib/stack/chunk_queue.c: what an owner takes from the front and others steal from
 * the back, tags that keep steps apart, and, under threads racing on one
 * queue for thousands of steps, every chunk taken exactly once. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stack/chunk_queue.h"
#include "test.h"

#define CAP 40

static chunk_queue *new_queue(void) {
    chunk_queue *q = aligned_alloc(64, chunk_queue_bytes(CAP));
    memset(q, 0, chunk_queue_bytes(CAP));
    return q;
}

static void test_layout(void) {
    CHECK(chunk_queue_bytes(CAP) % 64 == 0 && chunk_queue_bytes(CAP) >= 8 + CAP * 4, "%zu bytes",
          chunk_queue_bytes(CAP));
    CHECK(chunk_queue_bytes(14) == 64 && chunk_queue_bytes(15) == 128, "a cursor and 14 entries fill one line");
    char base[256];
    CHECK((char *)chunk_queue_at(base, 14, 3) == base + 192, "queue 3 of capacity 14");
}

static void test_take_and_steal(void) {
    chunk_queue *q = new_queue();
    const int32_t list[11] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20};
    const int32_t *taken;
    int32_t c;
    CHECK(chunk_queue_take(q, 7, 1, &taken) == 0, "nothing published for tag 7");
    CHECK(chunk_queue_steal(q, 7, &c) == -1, "steal before the owner published: pending");
    chunk_queue_publish(q, 7, list, 11);
    CHECK(chunk_queue_take(q, 8, 1, &taken) == 0 && chunk_queue_steal(q, 8, &c) == -1, "another step's tag takes nothing");
    /* divisor 2: ceil(left / 2) each time */
    int k = chunk_queue_take(q, 7, 2, &taken);
    CHECK(k == 6 && taken[0] == 0 && taken[5] == 10, "first take: %d from %d", k, k ? taken[0] : -1);
    CHECK(chunk_queue_steal(q, 7, &c) == 1 && c == 20, "steal the last: %d", c);
    CHECK(chunk_queue_steal(q, 7, &c) == 1 && c == 18, "then the one before: %d", c);
    k = chunk_queue_take(q, 7, 2, &taken); /* 12, 14, 16 left */
    CHECK(k == 2 && taken[0] == 12 && taken[1] == 14, "second take: %d", k);
    k = chunk_queue_take(q, 7, 1, &taken);
    CHECK(k == 1 && taken[0] == 16, "the rest: %d", k);
    CHECK(chunk_queue_take(q, 7, 1, &taken) == 0 && chunk_queue_steal(q, 7, &c) == 0, "empty");
    chunk_queue_publish(q, 9, list, 0);
    CHECK(chunk_queue_steal(q, 9, &c) == 0 && chunk_queue_take(q, 9, 1, &taken) == 0, "an empty step");
    free(q);
}

/* One owner taking from the front (divisor 3) and two thieves from the back,
 * over many steps; every step's chunks are counted by who took them. */
#define STEPS 20000
#define THIEVES 3

typedef struct {
    chunk_queue *q;
    pthread_barrier_t *start, *end;
    _Atomic int *seen; /* [CAP] per step, reset by the owner */
    int is_owner;
    long took;
    int bad_steps; /* owner: steps where some chunk was not taken exactly once */
} racer;

static void *race(void *arg) {
    racer *r = arg;
    int32_t list[CAP];
    for (int i = 0; i < CAP; i++) list[i] = CAP - 1 - i; /* any order */
    for (uint32_t step = 1; step <= STEPS; step++) {
        int n = (int)(step % (CAP + 1));
        if (r->is_owner) {
            for (int i = 0; i < CAP; i++) atomic_store(&r->seen[i], 0);
            chunk_queue_publish(r->q, step, list, n);
        }
        pthread_barrier_wait(r->start);
        if (r->is_owner) {
            const int32_t *taken;
            for (int k; (k = chunk_queue_take(r->q, step, 3, &taken)) > 0; r->took += k)
                for (int i = 0; i < k; i++) atomic_fetch_add(&r->seen[taken[i]], 1);
        } else {
            int32_t c;
            while (chunk_queue_steal(r->q, step, &c) == 1) {
                atomic_fetch_add(&r->seen[c], 1);
                r->took++;
            }
        }
        pthread_barrier_wait(r->end);
        if (r->is_owner) {
            int bad = 0;
            for (int i = 0; i < CAP; i++) bad += atomic_load(&r->seen[list[i]]) != (i < n);
            r->bad_steps += bad != 0;
        }
        pthread_barrier_wait(r->start); /* the check reads seen before the next reset */
    }
    return NULL;
}

static void test_race(void) {
    chunk_queue *q = new_queue();
    pthread_barrier_t start, end;
    pthread_barrier_init(&start, NULL, THIEVES + 1);
    pthread_barrier_init(&end, NULL, THIEVES + 1);
    _Atomic int seen[CAP];
    racer r[THIEVES + 1];
    pthread_t th[THIEVES + 1];
    for (int i = 0; i <= THIEVES; i++) {
        r[i] = (racer){q, &start, &end, seen, i == 0, 0, 0};
        pthread_create(&th[i], NULL, race, &r[i]);
    }
    long total = 0, stolen = 0;
    for (int i = 0; i <= THIEVES; i++) {
        pthread_join(th[i], NULL);
        total += r[i].took;
        if (i) stolen += r[i].took;
    }
    long want = 0;
    for (int s = 1; s <= STEPS; s++) want += s % (CAP + 1);
    CHECK(r[0].bad_steps == 0, "%d of %d steps took some chunk not exactly once", r[0].bad_steps, STEPS);
    CHECK(total == want, "%ld chunks taken of %ld", total, want);
    CHECK(stolen > 0 && r[0].took > 0, "both ends took some: owner %ld, thieves %ld", r[0].took, stolen);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&end);
    free(q);
}

int main(void) {
    test_layout();
    test_take_and_steal();
    test_race();
    return test_summary();
}

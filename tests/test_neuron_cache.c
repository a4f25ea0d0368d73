/* The neuron cache's slot table (lib/stack/neuron_cache.h):
 *  - a bundle is found after it is published, not while loading, and not
 *    after its slot went to another bundle; the index follows the slots;
 *  - CLOCK: a referenced slot survives one sweep, a pinned slot is never
 *    reused, and with every slot pinned a claim fails;
 *  - under concurrency (a writer reusing slots as fast as it can, readers
 *    pinning random bundles in other threads) a pinned slot always holds the
 *    bytes of the bundle asked for, start to end;
 *  - attach refuses a table without its magic, one too small for its shape,
 *    and one whose index or keys point outside it;
 *  - recover clears pins left by a dead reader and slots left loading. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "stack/neuron_cache.h"
#include "test.h"

typedef struct {
    ncache_shape shape;
    void *table;
    size_t table_bytes;
    uint8_t *data;
    size_t data_bytes;
    ncache *c;
} fixture;

static void fixture_make(fixture *f, uint32_t layers, uint32_t bundles, uint32_t slots) {
    f->shape = (ncache_shape){layers, 1, bundles, slots, 4096};
    f->table_bytes = ncache_table_bytes(&f->shape);
    f->table = aligned_alloc(64, (f->table_bytes + 63) / 64 * 64);
    f->data_bytes = (size_t)slots * 4096;
    f->data = aligned_alloc(4096, f->data_bytes);
    char err[256] = "";
    f->c = ncache_create(f->table, f->table_bytes, f->data, f->data_bytes, &f->shape, err, sizeof err);
    CHECK(f->c != NULL, "ncache_create: %s", err);
}

static void fixture_free(fixture *f) {
    ncache_detach(f->c);
    free(f->table), free(f->data);
}

/* a bundle's bytes: its key, repeated */
static void stamp(uint8_t *p, uint32_t layer, uint32_t bundle) {
    const uint32_t v = layer << 20 | bundle;
    for (int i = 0; i < 4096; i += 4) memcpy(p + i, &v, 4);
}
static bool stamped(const uint8_t *p, uint32_t layer, uint32_t bundle) {
    const uint32_t v = layer << 20 | bundle;
    for (int i = 0; i < 4096; i += 4)
        if (memcmp(p + i, &v, 4)) return false;
    return true;
}

static int64_t load(fixture *f, uint32_t layer, uint32_t bundle) {
    uint8_t *dest;
    const int64_t s = ncache_claim(f->c, layer, 0, bundle, &dest);
    if (s < 0) return s;
    stamp(dest, layer, bundle);
    ncache_publish(f->c, s);
    return s;
}

static void test_basics(void) {
    fixture f;
    fixture_make(&f, 2, 10, 3);
    ncache_ref ref;
    CHECK(ncache_pin(f.c, 0, 0, 4, &ref) == NULL && ref.slot == -1, "an empty cache finds nothing");
    uint8_t *dest;
    const int64_t s = ncache_claim(f.c, 0, 0, 4, &dest);
    CHECK(s >= 0, "claim in an empty cache");
    stamp(dest, 0, 4);
    CHECK(ncache_pin(f.c, 0, 0, 4, &ref) == NULL, "a loading bundle is not found");
    ncache_publish(f.c, s);
    const uint8_t *p = ncache_pin(f.c, 0, 0, 4, &ref);
    CHECK(p && stamped(p, 0, 4) && ref.slot == s, "a published bundle is found with its bytes");
    ncache_unpin(f.c, &ref);
    CHECK(ncache_claim(f.c, 0, 0, 4, &dest) == -1, "a cached bundle is not claimed again");
    CHECK(ncache_pin(f.c, 1, 0, 4, &ref) == NULL, "another layer's bundle is another key");
    CHECK(ncache_pin(f.c, 2, 0, 0, &ref) == NULL && ncache_pin(f.c, 0, 1, 0, &ref) == NULL &&
              ncache_pin(f.c, 0, 0, 10, &ref) == NULL,
          "keys outside the shape are misses");
    CHECK(ncache_claim(f.c, 0, 0, 10, &dest) == -1, "keys outside the shape are not claimed");
    /* fill, then one more: the oldest unreferenced goes */
    load(&f, 1, 1);
    load(&f, 1, 2);
    const int64_t s4 = load(&f, 1, 3);
    CHECK(s4 >= 0, "a full cache reuses a slot");
    int found = 0;
    const uint32_t keys[][2] = {{0, 4}, {1, 1}, {1, 2}, {1, 3}};
    for (int i = 0; i < 4; i++) {
        p = ncache_pin(f.c, keys[i][0], 0, keys[i][1], &ref);
        if (p) {
            found++;
            CHECK(stamped(p, keys[i][0], keys[i][1]), "bundle %u/%u has another's bytes", keys[i][0], keys[i][1]);
            ncache_unpin(f.c, &ref);
        }
    }
    CHECK(found == 3, "3 slots hold 3 bundles (found %d)", found);
    ncache_stats st;
    ncache_get_stats(f.c, &st);
    CHECK(st.loads == 4 && st.evictions == 1, "stats: %llu loads, %llu evictions", (unsigned long long)st.loads,
          (unsigned long long)st.evictions);
    fixture_free(&f);
}

static void test_clock_and_pins(void) {
    fixture f;
    fixture_make(&f, 1, 100, 4);
    for (uint32_t b = 0; b < 4; b++) load(&f, 0, b);
    ncache_ref ref, pinned;
    /* bundle 0 referenced (pinned and released), bundle 1 held pinned */
    CHECK(ncache_pin(f.c, 0, 0, 0, &ref) != NULL, "pin 0");
    ncache_unpin(f.c, &ref);
    CHECK(ncache_pin(f.c, 0, 0, 1, &pinned) != NULL, "pin 1");
    for (uint32_t b = 10; b < 13; b++) CHECK(load(&f, 0, b) >= 0, "load %u", b);
    const uint8_t *p = ncache_pin(f.c, 0, 0, 1, &ref);
    CHECK(p && stamped(p, 0, 1), "a pinned bundle is never evicted");
    if (p) ncache_unpin(f.c, &ref);
    ncache_unpin(f.c, &pinned);
    /* pin everything: a claim fails */
    ncache_ref all[4];
    int n = 0;
    for (uint32_t b = 0; b < 100 && n < 4; b++)
        if (ncache_pin(f.c, 0, 0, b, &all[n])) n++;
    CHECK(n == 4, "4 cached bundles pinned (%d)", n);
    uint8_t *dest;
    CHECK(ncache_claim(f.c, 0, 0, 50, &dest) == -1, "with every slot pinned a claim fails");
    /* a dead reader's pins let go (its successor does, from the pin log), then a dead writer's loading slot */
    for (int i = 0; i < n; i++) ncache_unpin(f.c, &all[i]);
    CHECK(ncache_claim(f.c, 0, 0, 50, &dest) >= 0, "once the pins are let go a claim succeeds");
    ncache_writer_restart(f.c);
    CHECK(ncache_pin(f.c, 0, 0, 50, &ref) == NULL, "a slot left loading is empty after a writer restart");
    int kept = 0;
    for (uint32_t b = 0; b < 100; b++) {
        const uint8_t *q = ncache_pin(f.c, 0, 0, b, &ref);
        if (q) {
            kept += stamped(q, 0, b);
            ncache_unpin(f.c, &ref);
        }
    }
    CHECK(kept == 3, "the 3 other published bundles are still found (%d)", kept);
    CHECK(ncache_claim(f.c, 0, 0, 50, &dest) >= 0, "and the bundle can be claimed again");
    fixture_free(&f);
}

typedef struct {
    fixture *f;
    _Atomic int *stop;
    long pins, wrong;
    uint64_t seed;
} reader_args;

static void *reader(void *arg) {
    reader_args *a = arg;
    uint64_t x = a->seed;
    while (!atomic_load(a->stop)) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t layer = (uint32_t)(x >> 60) % 2, bundle = (uint32_t)(x >> 33) % 64;
        ncache_ref ref;
        const uint8_t *p = ncache_pin(a->f->c, layer, 0, bundle, &ref);
        if (!p) continue;
        a->pins++;
        if (!stamped(p, layer, bundle)) a->wrong++;
        ncache_unpin(a->f->c, &ref);
    }
    return NULL;
}

static void test_concurrent(void) {
    fixture f;
    fixture_make(&f, 2, 64, 16);
    _Atomic int stop = 0;
    reader_args r[2] = {{&f, &stop, 0, 0, 1}, {&f, &stop, 0, 0, 2}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, reader, &r[i]);
    long loads = 0, refused = 0;
    rng_seed(5);
    for (int i = 0; i < 200000; i++) {
        const uint32_t layer = rng_u32() % 2, bundle = rng_u32() % 64;
        uint8_t *dest;
        const int64_t s = ncache_claim(f.c, layer, 0, bundle, &dest);
        if (s < 0) {
            refused++;
            continue;
        }
        stamp(dest, layer, bundle);
        if (i % 97 == 0) ncache_abandon(f.c, s); /* a failed read now and then */
        else ncache_publish(f.c, s), loads++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    printf("concurrent: %ld loads, %ld claims refused (cached or all busy), %ld + %ld pins\n", loads, refused,
           r[0].pins, r[1].pins);
    CHECK(r[0].wrong == 0 && r[1].wrong == 0, "pinned slots held another bundle's bytes %ld + %ld times", r[0].wrong,
          r[1].wrong);
    CHECK(r[0].pins + r[1].pins > 1000, "readers pinned too rarely to test anything (%ld)", r[0].pins + r[1].pins);
    fixture_free(&f);
}

static void test_attach(void) {
    fixture f;
    fixture_make(&f, 2, 10, 3);
    load(&f, 1, 7);
    char err[256] = "";
    ncache *c = ncache_attach(f.table, f.table_bytes, f.data, f.data_bytes, err, sizeof err);
    CHECK(c != NULL, "attach: %s", err);
    ncache_ref ref;
    const uint8_t *p = c ? ncache_pin(c, 1, 0, 7, &ref) : NULL;
    CHECK(p && stamped(p, 1, 7), "an attached table finds what the creator loaded");
    if (p) ncache_unpin(c, &ref);
    ncache_detach(c);
    CHECK(ncache_attach(f.table, f.table_bytes - 1, f.data, f.data_bytes, err, sizeof err) == NULL &&
              strstr(err, "needs"),
          "a table too small for its shape: %s", err);
    CHECK(ncache_attach(f.table, f.table_bytes, f.data, f.data_bytes - 1, err, sizeof err) == NULL,
          "data too small for the slots");
    uint8_t *raw = f.table;
    const size_t index_at = f.table_bytes - sizeof(int32_t) * 20;
    int32_t saved, bad = 3;
    memcpy(&saved, raw + index_at, 4);
    memcpy(raw + index_at, &bad, 4);
    CHECK(ncache_attach(f.table, f.table_bytes, f.data, f.data_bytes, err, sizeof err) == NULL &&
              strstr(err, "index entry"),
          "an index entry naming a slot that does not exist: %s", err);
    memcpy(raw + index_at, &saved, 4);
    uint64_t magic;
    memcpy(&magic, raw, 8);
    raw[0] ^= 1;
    CHECK(ncache_attach(f.table, f.table_bytes, f.data, f.data_bytes, err, sizeof err) == NULL && strstr(err, "magic"),
          "no magic: %s", err);
    memcpy(raw, &magic, 8);
    ncache_shape big = {5000, 1, 10, 3, 4096};
    CHECK(ncache_table_bytes(&big) == 0, "a shape over the limits has no size");
    ncache_shape odd = {1, 1, 10, 3, 5000};
    CHECK(ncache_table_bytes(&odd) == 0, "slots that are not whole pages are refused");
    fixture_free(&f);
}

int main(void) {
    test_basics();
    test_clock_and_pins();
    test_concurrent();
    test_attach();
    return test_summary();
}

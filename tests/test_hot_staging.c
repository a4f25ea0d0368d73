/* The packed hot region's staged load (cachemgr/hot_staging.h), on a tiny
 * PWRI model's bundle file (4 neurons a bundle, so a bundle's rows are far
 * from its 4096-byte stride):
 *  - buffers: up to 4 of at most 16 MiB, each a whole number of bundles,
 *    fewer of one bundle each in a small cold region, none below one bundle;
 *    a retired buffer is never handed out again;
 *  - landing a chunk: each neuron's rows at its packed place in the hot
 *    region equal the rows in the mapped bundle file (an oracle the staging
 *    does not read), nothing around the chunk is written, and a chunk with a
 *    changed byte is refused. */
#include <stdlib.h>
#include <string.h>

#include "../cachemgr/hot_staging.h"
#include "engine/model.h"
#include "mkmodel_run.h"
#include "test.h"

static char dir[] = "/tmp/pi2-test-hot-staging-XXXXXX";

#define PER_BUNDLE 4
#define SENTINEL 0xa5

static void test_buffers(const offload *o) {
    hot_staging s;
    const uint64_t stride = o->stride;
    CHECK(hot_staging_init(&s, o, 1ull << 30) == 0 && s.n_buffers == HOT_STAGING_BUFFERS &&
              s.buffer_bytes <= HOT_STAGING_MAX_BYTES && s.buffer_bytes % stride == 0 &&
              s.buffer_bytes > HOT_STAGING_MAX_BYTES - stride,
          "a large cold region: %d buffers of %llu bytes", s.n_buffers, (unsigned long long)s.buffer_bytes);
    hot_staging_free(&s);
    CHECK(hot_staging_init(&s, o, 5 * stride / 2) == 0 && s.n_buffers == 2 && s.buffer_bytes == stride &&
              hot_staging_chunk_bundles(&s, o) == 1,
          "2.5 bundles of cold region: %d buffers of %llu bytes", s.n_buffers, (unsigned long long)s.buffer_bytes);
    hot_staging_free(&s);
    CHECK(hot_staging_init(&s, o, stride - 1) != 0, "a cold region under one bundle is refused");
    hot_staging_free(&s);

    hot_staging_init(&s, o, 1ull << 30);
    int got[HOT_STAGING_BUFFERS];
    bool distinct = true;
    for (int i = 0; i < HOT_STAGING_BUFFERS; i++) {
        got[i] = hot_staging_take(&s);
        for (int k = 0; k < i; k++) distinct = distinct && got[k] != got[i];
    }
    CHECK(distinct && got[0] >= 0 && hot_staging_take(&s) == -1, "four buffers, then none");
    hot_staging_give(&s, got[2]);
    CHECK(hot_staging_take(&s) == got[2], "a buffer given back is taken again");
    for (int i = 0; i < HOT_STAGING_BUFFERS; i++) {
        CHECK(!hot_staging_exhausted(&s), "not exhausted before buffer %d is retired", i);
        hot_staging_retire(&s, got[i]);
        hot_staging_give(&s, got[i]);
    }
    CHECK(hot_staging_exhausted(&s) && hot_staging_take(&s) == -1, "retired buffers are never handed out");
    hot_staging_free(&s);
}

static void test_land(const offload *o, const bundle_file *b) {
    hot_staging s;
    const uint64_t cold_bytes = 4 * 3 * o->stride;
    uint8_t *cold = aligned_alloc(4096, cold_bytes), *hot = malloc(o->hot_bytes);
    if (!cold || !hot || hot_staging_init(&s, o, cold_bytes)) {
        CHECK(0, "out of memory");
        free(cold), free(hot);
        hot_staging_free(&s);
        return;
    }
    memset(hot, SENTINEL, o->hot_bytes);
    const int l = 1, buf = 2;
    const long first = 2, n = hot_staging_chunk_bundles(&s, o);
    uint8_t *staged = cold + (uint64_t)buf * s.buffer_bytes;
    memcpy(staged, b->region[l] + (uint64_t)first * b->stride, (size_t)n * b->stride); /* as a read lands it */
    CHECK(n == 3 && hot_staging_land(&s, o, buf, cold, hot, l, first, n) == 0, "a chunk of %ld bundles lands", n);
    int bad = 0;
    for (long slot = first * PER_BUNDLE; slot < (first + n) * PER_BUNDLE; slot++)
        bad += memcmp(hot + o->hot_offset[l] + (uint64_t)slot * b->neuron_bytes, bundle_slot_rows(b, l, slot),
                      b->neuron_bytes) != 0;
    CHECK(bad == 0, "%d neurons' rows differ from the file's", bad);
    const uint64_t from = o->hot_offset[l] + (uint64_t)first * o->hot_stride, to = from + (uint64_t)n * o->hot_stride;
    long touched = 0;
    for (uint64_t i = 0; i < o->hot_bytes; i++) touched += (i < from || i >= to) && hot[i] != SENTINEL;
    CHECK(touched == 0, "%ld bytes written outside the chunk's packed place", touched);

    staged[b->stride + 100] ^= 1; /* the chunk's second bundle, inside its rows */
    CHECK(hot_staging_land(&s, o, buf, cold, hot, l, first, n) != 0, "a changed byte is refused");
    free(cold), free(hot);
    hot_staging_free(&s);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    char model_path[512], path[600], err[512];
    model m;
    bundle_file b;
    const bool made = mkmodel_run(dir, "m.pwri", "--preset tiny --act relu --pwri --seed 4", model_path,
                                  sizeof model_path) == 0 &&
                      model_load(&m, model_path, err, sizeof err) == 0;
    CHECK(made, "the test model: %s", err);
    if (!made) return test_summary();
    snprintf(path, sizeof path, "%s/bundles.gguf", dir);
    const bool opened = bundle_write(&m, model_path, NULL, PER_BUNDLE, path, NULL, NULL, err, sizeof err) == 0 &&
                        bundle_open(&b, path, &m, model_path, err, sizeof err) == 0;
    CHECK(opened, "the bundle file: %s", err);
    if (opened) {
        /* the layout offload_open makes of a plan pinning 6 bundles a layer, packed */
        offload o;
        memset(&o, 0, sizeof o);
        o.bundles = b, o.stride = b.stride, o.neuron_bytes = b.neuron_bytes, o.per_bundle = b.per_bundle;
        o.hot_stride = (size_t)PER_BUNDLE * b.neuron_bytes;
        snprintf(o.bundle_path, sizeof o.bundle_path, "%s", path);
        uint64_t hot_offset[64];
        for (int l = 0; l < m.n_layer && l < 64; l++) hot_offset[l] = o.hot_bytes, o.hot_bytes += 6 * o.hot_stride;
        o.hot_offset = hot_offset;
        CHECK(m.n_layer >= 2 && m.n_layer <= 64 && b.n_bundles >= 6 && o.hot_stride < o.stride,
              "the model: %d layers, %ld bundles a layer, rows %zu of a %zu stride", m.n_layer, b.n_bundles,
              o.hot_stride, o.stride);
        test_buffers(&o);
        test_land(&o, &b);
        bundle_close(&b);
    }
    model_free(&m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}

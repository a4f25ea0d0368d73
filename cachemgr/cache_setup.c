/* The neuron cache of a budgeted stack (docs/offload.md), once the hot
 * region is read: each hot bundle is checked against its own checksum (the
 * bundle file names a bad one: corrupted storage must not become wrong
 * weights; a packed region's were checked as they landed), then the slot
 * table is laid out fresh over the cold region, and the cpu-workers' shared
 * predictor copy is made. */
#include <stdio.h>

#include "cachemgr.h"
#include "engine/predictor.h"
#include "util/clock.h"
#include "util/log.h"

static int check_hot(const cachemgr *c, const uint8_t *hot) {
    const offload *o = &c->off;
    for (int l = 0; l < c->m.n_layer; l++) {
        const long b = bundle_check_run(&o->bundles, l, 0, (long)o->plan->hot_bundles[l], hot + o->hot_offset[l]);
        if (b >= 0) {
            log_error("%s: layer %d's bundle %ld (file offset %llu) as read does not match its checksum",
                      o->bundle_path, l, b, (unsigned long long)bundle_file_offset(&o->bundles, l, b));
            return -1;
        }
    }
    return 0;
}

int cm_ready_cache(cachemgr *c) {
    uint64_t hot_bytes, cold_bytes, table_bytes;
    uint8_t *hot = shm_region_ptr(c->seg[SEG_FFN], "hot", &hot_bytes);
    uint8_t *cold = shm_region_ptr(c->seg[SEG_FFN], "cold", &cold_bytes);
    void *table = shm_region_ptr(c->seg[SEG_FFN], "table", &table_bytes);
    if (!hot || !cold || !table) {
        log_error("the neuron cache segment lacks a region");
        return -1;
    }
    double t0 = clock_seconds();
    if (!offload_hot_packed(&c->off)) { /* packed: each chunk was checked as it landed (hot_staging.h) */
        if (check_hot(c, hot)) return -1;
        log_info("hot bundles checked: %.1f MiB in %.2f s", c->off.hot_bytes / 1048576.0, clock_seconds() - t0);
    }
    char err[512];
    const ncache_shape shape = offload_cache_shape(&c->off, &c->m);
    ncache *nc = ncache_create(table, table_bytes, cold, cold_bytes, &shape, err, sizeof err);
    if (!nc) {
        log_error("slot table: %s", err);
        return -1;
    }
    ncache_detach(nc);
    /* the one Q8_0 predictor copy the cpu-workers share, from the file's F16 rows */
    const offload *o = &c->off;
    if (!o->predictor_image_bytes) return 0;
    t0 = clock_seconds();
    const bool fits = o->predictor_image_offset + o->predictor_image_bytes <= c->weights_bytes;
    if (!fits || predictor_q8_0_image_write(&c->m, c->weights + o->predictor_image_offset, o->predictor_image_bytes,
                                            err, sizeof err)) {
        log_error("the shared predictor copy: %s", fits ? err : "past the end of the weights segment");
        return -1;
    }
    log_info("predictor converted to Q8_0 once for the cpu-workers: %.1f MiB in %.2f s",
             o->predictor_image_bytes / 1048576.0, clock_seconds() - t0);
    return 0;
}

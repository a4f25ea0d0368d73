/* Staging the load of a packed hot region (hot_staging.h). */
#include "hot_staging.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

int hot_staging_init(hot_staging *s, const offload *o, uint64_t cold_bytes) {
    memset(s, 0, sizeof *s);
    const uint64_t stride = o->stride;
    if (cold_bytes < stride || !(s->check = calloc(1, stride))) return -1; /* its padding stays zero */
    uint64_t per = cold_bytes / HOT_STAGING_BUFFERS;
    if (per > HOT_STAGING_MAX_BYTES) per = HOT_STAGING_MAX_BYTES;
    per -= per % stride;
    if (per == 0) per = stride; /* fewer buffers of one bundle each */
    const uint64_t fit = cold_bytes / per;
    s->n_buffers = fit < HOT_STAGING_BUFFERS ? (int)fit : HOT_STAGING_BUFFERS;
    s->buffer_bytes = per;
    return 0;
}

void hot_staging_free(hot_staging *s) {
    free(s->check);
    s->check = NULL;
}

int hot_staging_take(hot_staging *s) {
    for (int i = 0; i < s->n_buffers; i++)
        if (!s->busy[i] && !s->retired[i]) {
            s->busy[i] = true;
            return i;
        }
    return -1;
}

void hot_staging_give(hot_staging *s, int i) { s->busy[i] = false; }

void hot_staging_retire(hot_staging *s, int i) { s->retired[i] = true; }

bool hot_staging_exhausted(const hot_staging *s) {
    for (int i = 0; i < s->n_buffers; i++)
        if (!s->retired[i]) return false;
    return true;
}

int hot_staging_land(const hot_staging *s, const offload *o, int i, const uint8_t *cold, uint8_t *hot, int l,
                     long first, long n) {
    const uint8_t *buf = cold + (uint64_t)i * s->buffer_bytes;
    uint8_t *to = hot + o->hot_offset[l] + (uint64_t)first * o->hot_stride;
    for (long b = 0; b < n; b++) {
        /* the neurons' rows lead each bundle; the file's zero padding after them is left behind */
        uint8_t *rows = to + (uint64_t)b * o->hot_stride;
        memcpy(rows, buf + (uint64_t)b * o->stride, o->hot_stride);
        memcpy(s->check, rows, o->hot_stride);
        if (!bundle_check(&o->bundles, l, first + b, s->check)) {
            log_error("%s: layer %d's bundle %ld (file offset %llu) as read does not match its checksum",
                      o->bundle_path, l, first + b, (unsigned long long)bundle_file_offset(&o->bundles, l, first + b));
            return -1;
        }
    }
    return 0;
}

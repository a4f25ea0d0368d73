/* dot_f16_tile (kernels.h) one pair at a time through a set's own dot_f16:
 * the form of the sets whose dot gains nothing from sharing a key between
 * queries, and of the lengths a tiled form does not take. Each key is read
 * once from memory and then from L1 for the other queries.
 *
 * Errors: none: the caller's lengths and strides are trusted. */
#ifndef PI2_DOT_F16_TILE_H
#define PI2_DOT_F16_TILE_H

#include <stddef.h>
#include <stdint.h>

static inline void dot_f16_tile_by_pairs(float (*dot)(const uint16_t *, const uint16_t *, int), const uint16_t *k,
                                         size_t k_stride, int n_pos, const uint16_t *q, size_t q_stride, int nq,
                                         int n, float *out, size_t out_stride) {
    for (int s = 0; s < n_pos; s++)
        for (int j = 0; j < nq; j++)
            out[(size_t)j * out_stride + (size_t)s] = dot(k + (size_t)s * k_stride, q + (size_t)j * q_stride, n);
}

/* dot_f16_rows_tile (kernels.h) one query at a time through a set's own dot_f16_rows */
static inline void dot_f16_rows_tile_by_query(void (*rows_fn)(const uint16_t *, size_t, int, const uint16_t *, int,
                                                              float *),
                                              const uint16_t *w, size_t row_stride, int rows, const uint16_t *x,
                                              size_t x_stride, int nx, int n, float *out, size_t out_stride) {
    for (int j = 0; j < nx; j++) rows_fn(w, row_stride, rows, x + (size_t)j * x_stride, n, out + (size_t)j * out_stride);
}

#endif

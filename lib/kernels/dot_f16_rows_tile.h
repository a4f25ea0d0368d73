/* dot_f16_rows_tile (kernels.h) one vector at a time through a set's own
 * dot_f16_rows: the form of the sets without a tiled one, and of the shapes a
 * tiled form does not take.
 *
 * Errors: none: the caller's lengths and strides are trusted. */
#ifndef PI2_DOT_F16_ROWS_TILE_H
#define PI2_DOT_F16_ROWS_TILE_H

#include <stddef.h>
#include <stdint.h>

static inline void dot_f16_rows_tile_by_vector(void (*rows_fn)(const uint16_t *, size_t, int, const uint16_t *, int,
                                                               float *),
                                               const uint16_t *w, size_t row_stride, int rows, const uint16_t *x,
                                               size_t x_stride, int nx, int n, float *out, size_t out_stride) {
    for (int j = 0; j < nx; j++) rows_fn(w, row_stride, rows, x + (size_t)j * x_stride, n, out + (size_t)j * out_stride);
}

#endif

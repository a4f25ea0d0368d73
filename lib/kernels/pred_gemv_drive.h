/* The F16 predictor gemv's loops (pred_gemv.h), shared by the ISA files that
 * include it: PRED_PASS_ROWS rows per pass over x, 16 lanes a row; the last
 * partial group of 16 elements is copied into zero-padded buffers, so its
 * missing elements count as 0 * 0. The includer defines, for its ISA:
 *   lanes16             a row's 16 lanes
 *   zero16()            16 lanes of 0
 *   fma16(w, x, a)      a + w[0..15] * x[0..15] lane by lane, each one fused
 *                       multiply-add (w: F16, x: F32)
 *   reduce16(a)         the 16 lanes summed in pred_gemv.h's order
 * and gets pred_gemv_f16_rows(), which its pred_gemv_f16_ISA calls.
 *
 * Errors: none: loops over the caller's buffers. */
#ifndef PI2_KERNELS_PRED_GEMV_DRIVE_H
#define PI2_KERNELS_PRED_GEMV_DRIVE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PRED_PASS_ROWS 2

static inline __attribute__((always_inline)) void pred_gemv_f16_rows(const void *w, size_t row_stride, int rows,
                                                                     const float *x, int n, float *y) {
    const int full = n & ~15, left = n - full;
    float xt[16] = {0};
    memcpy(xt, x + full, sizeof(float) * (size_t)left);
    for (int r = 0; r < rows; r += PRED_PASS_ROWS) {
        const int nr = rows - r < PRED_PASS_ROWS ? rows - r : PRED_PASS_ROWS;
        const uint16_t *row[PRED_PASS_ROWS];
        lanes16 acc[PRED_PASS_ROWS];
        for (int k = 0; k < nr; k++) {
            row[k] = (const uint16_t *)((const char *)w + (size_t)(r + k) * row_stride);
            acc[k] = zero16();
        }
        for (int i = 0; i < full; i += 16)
            for (int k = 0; k < nr; k++) acc[k] = fma16(row[k] + i, x + i, acc[k]);
        for (int k = 0; k < nr; k++) {
            if (left) {
                uint16_t wt[16] = {0};
                memcpy(wt, row[k] + full, sizeof(uint16_t) * (size_t)left);
                acc[k] = fma16(wt, xt, acc[k]);
            }
            y[r + k] = reduce16(acc[k]);
        }
    }
}

#endif

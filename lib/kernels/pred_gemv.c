/* Scalar reference of the predictor gemv (pred_gemv.h). */
#include "kernels/pred_gemv.h"

#include <math.h>

#include "gguf/f16.h"

#define LANES 16

void pred_gemv_f16_scalar(const void *w, size_t row_stride, int rows, const float *x, int n, float *y) {
    for (int r = 0; r < rows; r++) {
        const uint16_t *row = (const uint16_t *)((const char *)w + (size_t)r * row_stride);
        float lane[LANES] = {0};
        for (int i0 = 0; i0 < n; i0 += LANES)
            for (int j = 0; j < LANES; j++) {
                int i = i0 + j;
                lane[j] = i < n ? fmaf(f16_to_f32(row[i]), x[i], lane[j]) : fmaf(0.0f, 0.0f, lane[j]);
            }
        for (int half = LANES / 2; half >= 1; half /= 2)
            for (int j = 0; j < half; j++) lane[j] = lane[j] + lane[j + half];
        y[r] = lane[0];
    }
}

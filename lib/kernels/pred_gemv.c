/* Scalar reference and run-time choice of the predictor gemv (pred_gemv.h). */
#include "kernels/pred_gemv.h"

#include <math.h>

#include "gguf/f16.h"
#include "kernels/kernels.h"

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

extern void pred_gemv_f16_avx2_impl(const void *w, size_t row_stride, int rows, const float *x, int n, float *y);
extern void pred_gemv_f16_avx512_impl(const void *w, size_t row_stride, int rows, const float *x, int n, float *y);
extern void pred_gemv_q8_0_avx512_impl(const void *w, size_t row_stride, int rows, const void *x, int n, float *y);

/* the same CPU checks as the dense kernel sets; without the x86 ISA files (ARM64) only scalar */
#if defined(__x86_64__)
pred_gemv_f16_fn pred_gemv_f16_avx2(void) { return kernels_avx2() ? pred_gemv_f16_avx2_impl : NULL; }
pred_gemv_f16_fn pred_gemv_f16_avx512(void) { return kernels_avx512() ? pred_gemv_f16_avx512_impl : NULL; }

pred_gemv_q8_0_fn pred_gemv_q8_0_for(const kernels *k) {
    return k && kernels_decode_set(k) == kernels_avx512() ? pred_gemv_q8_0_avx512_impl : NULL; /* q8_row's bits: the default avx512 set */
}
#else
pred_gemv_f16_fn pred_gemv_f16_avx2(void) { return NULL; }
pred_gemv_f16_fn pred_gemv_f16_avx512(void) { return NULL; }
pred_gemv_q8_0_fn pred_gemv_q8_0_for(const kernels *k) {
    (void)k;
    return NULL;
}
#endif

pred_gemv_f16_fn pred_gemv_f16_for(const kernels *k) {
    const kernels *d = kernels_decode_set(k);
    pred_gemv_f16_fn f = NULL;
    if (d && (d == kernels_avx512() || d == kernels_avx512_exact())) f = pred_gemv_f16_avx512();
    else if (d && d == kernels_avx2()) f = pred_gemv_f16_avx2();
    return f ? f : pred_gemv_f16_scalar;
}

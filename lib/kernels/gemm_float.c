/* The float product's scalar reference (gemm.h states the order). */
#include <math.h>

#include "gguf/f16.h"
#include "kernels/gemm.h"
#include "kernels/gemm_float_block.h"

size_t gemm_float_scratch_bytes(int n) {
    (void)n; /* the chunk bounds the activations whatever n is */
    return sizeof(float) * GF_SCRATCH_FLOATS;
}

/* GCC's _mm512_reduce_add_ps: upper 256 bits onto the lower, then 128, then
 * lanes 2,3 onto 0,1, then lane 1 onto lane 0 */
static float reduce16(const float *a) {
    float h8[8], h4[4];
    for (int i = 0; i < 8; i++) h8[i] = a[i + 8] + a[i];
    for (int i = 0; i < 4; i++) h4[i] = h8[i + 4] + h8[i];
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

void gemm_f32_ref(const float *w, size_t row_stride, int nrows, const float *const *x, int n_tok, int n, float *y,
                  size_t y_stride, void *scratch) {
    (void)scratch;
    for (int r = 0; r < nrows; r++) {
        const float *row = (const float *)((const char *)w + (size_t)r * row_stride);
        for (int t = 0; t < n_tok; t++) {
            float acc[16] = {0};
            for (int i = 0; i < n; i++) acc[i % 16] = fmaf(row[i], x[t][i], acc[i % 16]);
            y[(size_t)t * y_stride + (size_t)r] = reduce16(acc);
        }
    }
}

void gemm_f16_ref(const uint16_t *w, size_t row_stride, int nrows, const uint16_t *const *x, int n_tok, int n,
                  float *y, size_t y_stride, void *scratch) {
    (void)scratch;
    for (int r = 0; r < nrows; r++) {
        const uint16_t *row = (const uint16_t *)((const char *)w + (size_t)r * row_stride);
        for (int t = 0; t < n_tok; t++) {
            float acc[16] = {0};
            for (int i = 0; i < n; i++) acc[i % 16] = fmaf(f16_to_f32(row[i]), f16_to_f32(x[t][i]), acc[i % 16]);
            y[(size_t)t * y_stride + (size_t)r] = reduce16(acc);
        }
    }
}

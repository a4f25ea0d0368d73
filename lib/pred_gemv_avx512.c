/* AVX-512 predictor gemv (pred_gemv.h): 4 rows per pass over x, one 16-lane
 * accumulator per row, the last partial group through masked loads (zeros). */
#include "kernels_avx512.h"
#include "pred_gemv.h"

#define ROWS 4

static inline __m512 load_w16(const uint16_t *row, int i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + i));
}

/* s8[j] = l[j] + l[j+8], s4[j] = s8[j] + s8[j+4], s2[j] = s4[j] + s4[j+2], s2[0] + s2[1] */
static inline float reduce16(__m512 l) {
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(l), _mm512_extractf32x8_ps(l, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

void pred_gemv_f16_avx512_impl(const void *w, size_t row_stride, int rows, const float *x, int n, float *y);
void pred_gemv_f16_avx512_impl(const void *w, size_t row_stride, int rows, const float *x, int n, float *y) {
    int r = 0;
    for (; r + ROWS <= rows; r += ROWS) {
        const uint16_t *row[ROWS];
        for (int k = 0; k < ROWS; k++) row[k] = (const uint16_t *)((const char *)w + (size_t)(r + k) * row_stride);
        __m512 acc[ROWS];
        for (int k = 0; k < ROWS; k++) acc[k] = _mm512_setzero_ps();
        for (int i = 0; i < n; i += 16) {
            const __mmask16 m = lanes_from(i, n);
            const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
            for (int k = 0; k < ROWS; k++) acc[k] = _mm512_fmadd_ps(load_w16(row[k], i, m), xv, acc[k]);
        }
        for (int k = 0; k < ROWS; k++) y[r + k] = reduce16(acc[k]);
    }
    for (; r < rows; r++) {
        const uint16_t *row = (const uint16_t *)((const char *)w + (size_t)r * row_stride);
        __m512 acc = _mm512_setzero_ps();
        for (int i = 0; i < n; i += 16) {
            const __mmask16 m = lanes_from(i, n);
            acc = _mm512_fmadd_ps(load_w16(row, i, m), _mm512_maskz_loadu_ps(m, x + i), acc);
        }
        y[r] = reduce16(acc);
    }
}

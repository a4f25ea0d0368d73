/* AVX2 predictor gemv (pred_gemv.h): the 16 lanes as two 8-lane halves, in
 * pred_gemv_drive.h's loops (2 rows per pass over x). */
#include <immintrin.h>

#include "kernels/pred_gemv.h"

typedef struct {
    __m256 lo, hi; /* lanes 0-7 and 8-15 */
} lanes16;

static inline lanes16 fma16(const uint16_t *w, const float *x, lanes16 a) {
    a.lo = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w)), _mm256_loadu_ps(x), a.lo);
    a.hi = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 8))), _mm256_loadu_ps(x + 8), a.hi);
    return a;
}

/* s8 = lo + hi, then the 128-bit halves, then pairs: pred_gemv.h's order */
static inline float reduce16(lanes16 a) {
    const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

static inline lanes16 zero16(void) { return (lanes16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }

#include "kernels/pred_gemv_drive.h"

void pred_gemv_f16_avx2(const void *w, size_t row_stride, int rows, const float *x, int n, float *y) {
    pred_gemv_f16_rows(w, row_stride, rows, x, n, y);
}

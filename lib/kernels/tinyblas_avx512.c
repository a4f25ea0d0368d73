/* tinyBLAS order on AVX-512 (tinyblas.h): what llamafile's tinyBLAS<16, __m512>
 * computes for one output element, bit for bit with tinyblas_scalar(). */
#include <immintrin.h>

#include "kernels/tinyblas.h"

static float dot_f32_avx512(const float *a, const float *b, int k) {
    __m512 acc = _mm512_setzero_ps();
    for (int l = 0; l < k; l += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + l), _mm512_loadu_ps(b + l), acc);
    return _mm512_reduce_add_ps(acc);
}

static __m512 load_f16x16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

static float dot_f16_avx512(const uint16_t *a, const uint16_t *b, int k) {
    __m512 acc = _mm512_setzero_ps();
    for (int l = 0; l < k; l += 16) acc = _mm512_fmadd_ps(load_f16x16(a + l), load_f16x16(b + l), acc);
    return _mm512_reduce_add_ps(acc);
}

const tinyblas_kernels tinyblas_avx512_impl = {"avx512", dot_f32_avx512, dot_f16_avx512};

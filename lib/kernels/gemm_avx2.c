/* The prefill product on AVX2 (gemm.h): a tile of 16 weight rows is re-laid
 * once with raw nibbles (the layout of gemm_relay_avx512.h, read here with
 * 8-lane gathers); per token and block each half of the tile keeps 8 rows in
 * the lanes: vpmaddubsw of a line of row groups by the token's group
 * broadcast (at most 2 * 15 * 128 in 16 bits: no saturation), vpmaddwd to
 * int32, the -8 offset as 8 * sum(x), then the reference's multiply and FMA,
 * so the bits are gemm_q4_0_ref's. */
#include <immintrin.h>

#include "kernels/gemm.h"

enum { LINE = GEMM_TILE * 4 }; /* bytes of one group of every row */

static void relay(const block_q4_0 *w, size_t row_stride, int nrows, int nb, int8_t *quants, float *scales) {
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    for (int h = 0; h < 2; h++) {
        const int live_rows = nrows - 8 * h;
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(live_rows), lane);
        const __m256i row_at = _mm256_mullo_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(8 * h)),
                                                  _mm256_set1_epi32((int)row_stride));
        for (int b = 0; b < nb; b++) {
            const int *block = (const int *)(const void *)(w + b);
            const __m256i d = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), block, row_at, live, 1);
            const __m128i d16 = _mm_packus_epi32(_mm256_castsi256_si128(_mm256_and_si256(d, _mm256_set1_epi32(0xffff))),
                                                 _mm256_extracti128_si256(_mm256_and_si256(d, _mm256_set1_epi32(0xffff)), 1));
            _mm256_storeu_ps(scales + (size_t)b * GEMM_TILE + 8 * h, _mm256_cvtph_ps(d16));
            int8_t *q = quants + (size_t)b * 8 * LINE + 32 * h;
            for (int g = 0; g < 4; g++) {
                const int *at = (const int *)(const void *)((const char *)block + 2 + 4 * g);
                const __m256i v = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), at, row_at, live, 1);
                _mm256_storeu_si256((__m256i *)(q + g * LINE), _mm256_and_si256(v, nibble));
                _mm256_storeu_si256((__m256i *)(q + (4 + g) * LINE), _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble));
            }
        }
    }
}

static inline __m256i block_isum(const int8_t *wq, const int8_t *xq, int32_t xsum) {
    const int32_t *xg = (const int32_t *)(const void *)xq;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a = _mm256_set1_epi32(-8 * xsum), b = _mm256_setzero_si256();
/* unrolled, the chains interleave: 77-83 -> 95-100 GMAC/s (Zen 5, kernel-bench -k avx2) */
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
        const __m256i p = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(wq + k * LINE)), _mm256_set1_epi32(xg[k]));
        const __m256i q = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(wq + (k + 1) * LINE)),
                                               _mm256_set1_epi32(xg[k + 1]));
        a = _mm256_add_epi32(a, _mm256_madd_epi16(p, ones));
        b = _mm256_add_epi32(b, _mm256_madd_epi16(q, ones));
    }
    return _mm256_add_epi32(a, b);
}

void gemm_q4_0_avx2(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                    size_t y_stride, void *scratch) {
    const int nb = x->nb;
    int8_t *wq = scratch;
    float *dw = (float *)(void *)(wq + (size_t)nb * 8 * LINE);
    for (int r0 = 0; r0 < nrows; r0 += GEMM_TILE) {
        const int nr = nrows - r0 < GEMM_TILE ? nrows - r0 : GEMM_TILE;
        relay((const block_q4_0 *)((const char *)w + (size_t)r0 * row_stride), row_stride, nr, nb, wq, dw);
        for (int t = 0; t < x->n_tok; t++) {
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const size_t i = gemm_acts_index(x, t, b);
                const int8_t *wb = wq + (size_t)b * 8 * LINE, *xq = x->qs + i * 32;
                const __m256 dx = _mm256_set1_ps(x->d[i]);
                const __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(dw + (size_t)b * GEMM_TILE), dx);
                const __m256 s1 = _mm256_mul_ps(_mm256_loadu_ps(dw + (size_t)b * GEMM_TILE + 8), dx);
                acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_isum(wb, xq, x->sum[i])), s0, acc0);
                acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_isum(wb + 32, xq, x->sum[i])), s1, acc1);
            }
            float out[GEMM_TILE];
            _mm256_storeu_ps(out, acc0);
            _mm256_storeu_ps(out + 8, acc1);
            for (int r = 0; r < nr; r++) y[(size_t)t * y_stride + (size_t)(r0 + r)] = out[r];
        }
    }
}

/* lanesum64 with AVX2: a stripe is two vectors of four lanes (lanesum.h). */
#include <immintrin.h>

#include "kernels/lanesum.h"

uint64_t lanesum64_avx2(const void *data, size_t n) {
    const uint8_t *p = data;
    __m256i acc0 = _mm256_loadu_si256((const __m256i *)LANESUM_SEED);
    __m256i acc1 = _mm256_loadu_si256((const __m256i *)(LANESUM_SEED + 4));
    __m256i key0 = _mm256_loadu_si256((const __m256i *)LANESUM_KEY);
    __m256i key1 = _mm256_loadu_si256((const __m256i *)(LANESUM_KEY + 4));
    const __m256i step = _mm256_set1_epi64x((long long)LANESUM_STEP);
    for (size_t s = 0; s < n / LANESUM_STRIPE; s++, p += LANESUM_STRIPE) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)p);
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(p + 32));
        const __m256i x0 = _mm256_xor_si256(w0, key0), x1 = _mm256_xor_si256(w1, key1);
        acc0 = _mm256_add_epi64(acc0, _mm256_add_epi64(_mm256_mul_epu32(x0, _mm256_srli_epi64(x0, 32)), w0));
        acc1 = _mm256_add_epi64(acc1, _mm256_add_epi64(_mm256_mul_epu32(x1, _mm256_srli_epi64(x1, 32)), w1));
        key0 = _mm256_add_epi64(key0, step);
        key1 = _mm256_add_epi64(key1, step);
    }
    uint64_t acc[LANESUM_LANES];
    _mm256_storeu_si256((__m256i *)acc, acc0);
    _mm256_storeu_si256((__m256i *)(acc + 4), acc1);
    return lanesum_finish(acc, p, n);
}

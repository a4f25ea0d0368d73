/* lanesum64 with AVX-512: a stripe is one vector of eight lanes (lanesum.h). */
#include <immintrin.h>

#include "kernels/lanesum.h"

uint64_t lanesum64_avx512(const void *data, size_t n) {
    const uint8_t *p = data;
    __m512i acc = _mm512_loadu_si512(LANESUM_SEED);
    __m512i key = _mm512_loadu_si512(LANESUM_KEY);
    const __m512i step = _mm512_set1_epi64((long long)LANESUM_STEP);
    for (size_t s = 0; s < n / LANESUM_STRIPE; s++, p += LANESUM_STRIPE) {
        const __m512i w = _mm512_loadu_si512(p);
        const __m512i x = _mm512_xor_si512(w, key);
        acc = _mm512_add_epi64(acc, _mm512_add_epi64(_mm512_mul_epu32(x, _mm512_srli_epi64(x, 32)), w));
        key = _mm512_add_epi64(key, step);
    }
    uint64_t lanes[LANESUM_LANES];
    _mm512_storeu_si512(lanes, acc);
    return lanesum_finish(lanes, p, n);
}

/* The AVX2 peak loop (int8_peak.h): 8 independent chains of vpmaddubsw (u8 x
 * s8 pairs to s16), vpmaddwd by ones (to s32) and vpaddd, in registers. */
#include <immintrin.h>

#include "kernels/int8_peak.h"

#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define DECLARE(j) __m256i c##j = _mm256_setzero_si256();
/* volatile: eight products of the same operands must not become one */
#define STEP(j)                                                                       \
    {                                                                                 \
        __m256i t;                                                                    \
        __asm__ volatile("vpmaddubsw %2, %1, %0" : "=x"(t) : "x"(a), "x"(b));         \
        c##j = _mm256_add_epi32(c##j, _mm256_madd_epi16(t, ones));                    \
    }
#define FOLD(j) s = _mm256_add_epi32(s, c##j);

uint64_t int8_peak_avx2(uint64_t iters) {
    __m256i a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1),
            s = _mm256_setzero_si256();
    CHAINS(DECLARE)
    for (uint64_t i = 0; i < iters; i++) CHAINS(STEP)
    CHAINS(FOLD)
    volatile int keep = _mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 7);
    (void)keep;
    return iters * 8u * 32u;
}

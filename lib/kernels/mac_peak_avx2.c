/* The AVX2 peak loops (mac_peak.h), in registers, all chains in one asm
 * statement so the compiler cannot move some out of the loop.
 * int8: 8 chains of vpmaddubsw (u8 x s8 pairs to s16), vpmaddwd by ones (to
 * s32) and vpaddd. F32: 12 FMA chains. */
#include <immintrin.h>

#include "kernels/mac_peak.h"

#define EACH8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define EACH12(X) EACH8(X) X(8) X(9) X(10) X(11)
#define INT8_STEP(j) "vpmaddubsw %9, %8, %%ymm15\n\tvpmaddwd %10, %%ymm15, %%ymm15\n\tvpaddd %%ymm15, %" #j ", %" #j "\n\t"

uint64_t int8_peak_avx2(uint64_t iters) {
    const __m256i a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
#define DECLARE(j) __m256i c##j = _mm256_setzero_si256();
    EACH8(DECLARE)
    __m256i s = _mm256_setzero_si256();
    for (uint64_t i = 0; i < iters; i++)
        __asm__ volatile(INT8_STEP(0) INT8_STEP(1) INT8_STEP(2) INT8_STEP(3) INT8_STEP(4) INT8_STEP(5) INT8_STEP(6)
                             INT8_STEP(7)
                         : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5), "+x"(c6),
                           "+x"(c7)
                         : "x"(a), "x"(b), "x"(ones)
                         : "xmm15");
#define FOLD(j) s = _mm256_add_epi32(s, c##j);
    EACH8(FOLD)
    volatile int keep = _mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 7);
    (void)keep;
    return iters * 8u * 32u;
}

#define F32_STEP(j) "vfmadd231ps %13, %12, %" #j "\n\t"

uint64_t f32_peak_avx2(uint64_t iters) {
    const __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(0.5f);
#define DECLARE_F(j) __m256 c##j = _mm256_setzero_ps();
    EACH12(DECLARE_F)
    __m256 s = _mm256_setzero_ps();
    for (uint64_t i = 0; i < iters; i++)
        __asm__ volatile(F32_STEP(0) F32_STEP(1) F32_STEP(2) F32_STEP(3) F32_STEP(4) F32_STEP(5) F32_STEP(6)
                             F32_STEP(7) F32_STEP(8) F32_STEP(9) F32_STEP(10) F32_STEP(11)
                         : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5), "+x"(c6),
                           "+x"(c7), "+x"(c8), "+x"(c9), "+x"(c10), "+x"(c11)
                         : "x"(a), "x"(b));
#define FOLD_F(j) s = _mm256_add_ps(s, c##j);
    EACH12(FOLD_F)
    volatile float keep = _mm256_cvtss_f32(s);
    (void)keep;
    return iters * 12u * 8u;
}

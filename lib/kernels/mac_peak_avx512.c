/* The AVX-512 peak loops (mac_peak.h): 12 independent chains in registers,
 * enough to cover the instruction's latency on two ports. The 12 are one asm
 * statement: as separate volatile statements GCC kept one in the loop and
 * moved the other 11 after it, so the loop timed a single latency-bound chain. */
#include <immintrin.h>

#include "kernels/mac_peak.h"

#define TWELVE(op)                                                                                                     \
    op " %13, %12, %0\n\t" op " %13, %12, %1\n\t" op " %13, %12, %2\n\t" op " %13, %12, %3\n\t" op                    \
       " %13, %12, %4\n\t" op " %13, %12, %5\n\t" op " %13, %12, %6\n\t" op " %13, %12, %7\n\t" op                    \
       " %13, %12, %8\n\t" op " %13, %12, %9\n\t" op " %13, %12, %10\n\t" op " %13, %12, %11"
#define EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define CHAIN_OPERANDS                                                                                                 \
    "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), "+v"(c7), "+v"(c8),        \
        "+v"(c9), "+v"(c10), "+v"(c11)

uint64_t int8_peak_avx512(uint64_t iters) {
    const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(3);
#define DECLARE(j) __m512i c##j = _mm512_setzero_si512();
    EACH(DECLARE)
    __m512i s = _mm512_setzero_si512();
    for (uint64_t i = 0; i < iters; i++) __asm__ volatile(TWELVE("vpdpbusd") : CHAIN_OPERANDS : "v"(a), "v"(b));
#define FOLD(j) s = _mm512_add_epi32(s, c##j);
    EACH(FOLD)
    volatile int keep = _mm512_reduce_add_epi32(s);
    (void)keep;
    return iters * 12u * 64u;
}

uint64_t f32_peak_avx512(uint64_t iters) {
    const __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0.5f);
#define DECLARE_F(j) __m512 c##j = _mm512_setzero_ps();
    EACH(DECLARE_F)
    __m512 s = _mm512_setzero_ps();
    for (uint64_t i = 0; i < iters; i++) __asm__ volatile(TWELVE("vfmadd231ps") : CHAIN_OPERANDS : "v"(a), "v"(b));
#define FOLD_F(j) s = _mm512_add_ps(s, c##j);
    EACH(FOLD_F)
    volatile float keep = _mm512_reduce_add_ps(s);
    (void)keep;
    return iters * 12u * 16u;
}

/* The AVX-512 VNNI peak loop (int8_peak.h): 12 independent vpdpbusd chains in
 * registers, enough to cover the instruction's latency on two ports. */
#include <immintrin.h>

#include "kernels/int8_peak.h"

#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DECLARE(j) __m512i c##j = _mm512_setzero_si512();
/* volatile: twelve chains of equal values must not become one */
#define STEP(j) __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(c##j) : "v"(a), "v"(b));
#define FOLD(j) s = _mm512_add_epi32(s, c##j);

uint64_t int8_peak_avx512(uint64_t iters) {
    __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(3), s = _mm512_setzero_si512();
    CHAINS(DECLARE)
    for (uint64_t i = 0; i < iters; i++) CHAINS(STEP)
    CHAINS(FOLD)
    volatile int keep = _mm512_reduce_add_epi32(s);
    (void)keep;
    return iters * 12u * 64u;
}

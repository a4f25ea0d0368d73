/* Private to lib/kernels/gemm_avx512.c and gemm_amx.c (both built with the
 * AVX-512 flags): one tile of up to GEMM_TILE Q4_0 weight rows re-laid into
 * the caller's scratch, block after block, as the products read them:
 *   quants [nb][8][GEMM_TILE][4]: group k of row n's block = its elements
 *          4k..4k+3 (groups 0-3 the low nibbles, 4-7 the high ones), so one
 *          64-byte line holds group k of every row (an AMX B tile row, or the
 *          lanes of a VNNI register); minus `offset` (8: signed, 0: raw nibbles)
 *   scales [nb][GEMM_TILE] as floats.
 * Rows past nrows are zero with scale 0. The rows are read with gathers: four
 * dwords of quants and one of scale per row and block. */
#ifndef PI2_GEMM_RELAY_AVX512_H
#define PI2_GEMM_RELAY_AVX512_H

#include <immintrin.h>

#include "kernels/gemm.h"

static inline void gemm_relay_q4_0(const block_q4_0 *w, size_t row_stride, int nrows, int nb, int offset,
                                   int8_t *quants, float *scales) {
    const __mmask16 live = (__mmask16)((1u << nrows) - 1u);
    const __m512i row_at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32((int)row_stride));
    const __m512i nibble = _mm512_set1_epi8(0x0f), off = _mm512_set1_epi8((char)offset);
    const __m512i zero = _mm512_setzero_si512();
    for (int b = 0; b < nb; b++) {
        const char *block = (const char *)(w + b);
        const __m512i d = _mm512_mask_i32gather_epi32(zero, live, row_at, block, 1);
        _mm512_store_ps(scales + (size_t)b * GEMM_TILE, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)));
        int8_t *q = quants + (size_t)b * 8 * GEMM_TILE * 4;
        for (int g = 0; g < 4; g++) {
            const __m512i v = _mm512_mask_i32gather_epi32(zero, live, row_at, block + 2 + 4 * g, 1);
            const __m512i lo = _mm512_and_si512(v, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
            _mm512_store_si512(q + g * 64, _mm512_maskz_mov_epi32(live, _mm512_sub_epi8(lo, off)));
            _mm512_store_si512(q + (4 + g) * 64, _mm512_maskz_mov_epi32(live, _mm512_sub_epi8(hi, off)));
        }
    }
}

#endif

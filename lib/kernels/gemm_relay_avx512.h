/* Private to lib/kernels/gemm_avx512.c and gemm_amx.c (both built with the
 * AVX-512 flags): one tile of up to GEMM_TILE Q4_0 weight rows re-laid into
 * the caller's scratch, block after block, as the products read them:
 *   quants [nb][8][GEMM_TILE][4]: group k of row n's block = its elements
 *          4k..4k+3 (groups 0-3 the low nibbles, 4-7 the high ones), so one
 *          64-byte line holds group k of every row (an AMX B tile row, or the
 *          lanes of a VNNI register); minus `offset` (8: signed, 0: raw nibbles)
 *   scales [nb][GEMM_TILE] as floats.
 * Rows past nrows are zero with scale 0. Each row's 16 bytes of quants are
 * read with one plain load and the 16 x 4 dwords transposed in registers
 * (four gathers per block took twice as long); the scales with one gather.
 *
 * Errors: none: the caller sizes the scratch and keeps nrows <= GEMM_TILE. */
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
    const char *row[GEMM_TILE]; /* rows past nrows read row 0 (memory we may read), then masked to zero */
    for (int r = 0; r < GEMM_TILE; r++) row[r] = (const char *)w + (size_t)(r < nrows ? r : 0) * row_stride;
    for (int b = 0; b < nb; b++) {
        const size_t at = (size_t)b * sizeof(block_q4_0);
        const __m512i d = _mm512_mask_i32gather_epi32(zero, live, row_at, (const char *)(w + b), 1);
        _mm512_store_ps(scales + (size_t)b * GEMM_TILE, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)));
        /* z[j]: the quants of rows j, j + 4, j + 8, j + 12 in its four 128-bit lanes */
        __m512i z[4];
        const size_t qs_at = at + offsetof(block_q4_0, qs);
        for (int j = 0; j < 4; j++) {
            __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(row[j] + qs_at)));
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(row[j + 4] + qs_at)), 1);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(row[j + 8] + qs_at)), 2);
            z[j] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(row[j + 12] + qs_at)), 3);
        }
        /* 4 x 4 dword transpose in each lane: g[k] = dword k of rows 0..15, in order */
        const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
        const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
        const __m512i g[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                              _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
        int8_t *q = quants + (size_t)b * 8 * GEMM_TILE * 4;
        for (int k = 0; k < 4; k++) {
            const __m512i lo = _mm512_and_si512(g[k], nibble), hi = _mm512_and_si512(_mm512_srli_epi16(g[k], 4), nibble);
            _mm512_store_si512(q + k * 64, _mm512_maskz_mov_epi32(live, _mm512_sub_epi8(lo, off)));
            _mm512_store_si512(q + (4 + k) * 64, _mm512_maskz_mov_epi32(live, _mm512_sub_epi8(hi, off)));
        }
    }
}

#endif

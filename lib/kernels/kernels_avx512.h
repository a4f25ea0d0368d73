/* Internal to the lib files ending in _avx512.c (built with the AVX-512
 * flags): masks and block loaders shared by the fast and the exact quantized
 * dots, the sparse gathers and the predictor gemv, and the functions each
 * kernels file contributes to the two kernel tables.
 *
 * Errors: none: inline arithmetic; the callers check lengths and types. */
#ifndef PI2_KERNELS_AVX512_H
#define PI2_KERNELS_AVX512_H

#include <immintrin.h>
#include <string.h>

#include "kernels/kernels.h"

static inline float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

/* lanes 0..left-1 of 16 */
static inline __mmask16 tail_mask16(int left) { return (__mmask16)((1u << left) - 1); }

/* the lanes of the 16-element group at i that lie below n */
static inline __mmask16 lanes_from(int i, int n) { return n - i >= 16 ? (__mmask16)0xffff : tail_mask16(n - i); }

static inline __m512 load_f16x16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* the 32 quants of blocks b and b+1 of a row, one block per 256-bit half */
static inline __m512i load_q8_pair(const block_q8_0 *blk) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)blk[0].qs)),
                              _mm256_loadu_si256((const __m256i *)blk[1].qs), 1);
}

/* sum(w*x) over 4-byte groups for signed w: (w+128) is unsigned for vpdpbusd,
 * and 128*sum(x) is subtracted again */
static inline __m512i dot_i8_pair(__m512i wq, __m512i xq) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const __m512i biased = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(wq, bias), xq);
    return _mm512_sub_epi32(biased, _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, xq));
}

/* nibbles of two Q4_0 blocks (load_q4_pair: blocks b and b+1 of a row) as
 * unsigned bytes 0..15 in element order, one block per 256-bit half: the 16
 * packed bytes go to both 128-bit lanes of a block's half, and the upper lane
 * is shifted right by 4 to reach the high nibbles */
static inline __m512i load_q4_two(const block_q4_0 *first, const block_q4_0 *second) {
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)first->qs));
    v = _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128((const __m128i *)second->qs));
    const __m512i shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    return _mm512_and_si512(_mm512_srlv_epi64(v, shift), _mm512_set1_epi8(0x0f));
}

static inline __m512i load_q4_pair(const block_q4_0 *blk) { return load_q4_two(blk, blk + 1); }

/* sum((q-8)*x) over 4-byte groups: vpdpbusd on q in 0..15, minus 8*sum(x) */
static inline __m512i dot_q4_pair(__m512i q, __m512i xq) {
    const __m512i raw = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xq);
    return _mm512_sub_epi32(raw, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), xq));
}

/* one block of each on 256 bits: dot_i8_pair's sums for a Q8_0 weight block */
static inline __m256i dot_q8_block(const block_q8_0 *w, const block_q8_0 *x) {
    const __m256i wq = _mm256_loadu_si256((const __m256i *)w->qs);
    const __m256i xq = _mm256_loadu_si256((const __m256i *)x->qs);
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    return _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_xor_si256(wq, bias), xq),
                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, xq));
}

/* ... and dot_q4_pair's for a Q4_0 one */
static inline __m256i dot_q4_block(const block_q4_0 *w, const block_q8_0 *x) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)w->qs);
    const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0f));
    const __m256i xq = _mm256_loadu_si256((const __m256i *)x->qs);
    return _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xq),
                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), xq));
}

static inline int32_t reduce_i32x8(__m256i s) { return _mm512_reduce_add_epi32(_mm512_zextsi256_si512(s)); }

/* four f16 block scales (blocks 18 or 34 bytes apart) packed in a general register */
static inline uint64_t pack_scales4(const void *first_block, size_t block_bytes) {
    uint64_t packed = 0;
    for (int k = 0; k < 4; k++) {
        uint16_t h;
        memcpy(&h, (const char *)first_block + (size_t)k * block_bytes, sizeof h);
        packed |= (uint64_t)h << (16 * k);
    }
    return packed;
}

/* kernels_avx512.c: everything but the quantized dots, shared by both tables */
void quantize_q8_0_avx512(const float *x, block_q8_0 *y, int n);
void f32_to_f16_row_avx512(const float *x, uint16_t *y, int n);
void axpy_f32_avx512(float *y, float a, const float *w, int n);
float dot_f32_avx512(const float *w, const float *x, int n);
float dot_f16_avx512(const uint16_t *w, const uint16_t *x, int n);
void dot_f16_rows_avx512(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, int n, float *out);
void dot_f16_rows_tile_avx512(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, size_t x_stride,
                              int nx, int n, float *out, size_t out_stride, float *scratch);
double softmax_exp_avx512(float *y, const float *x, float max, int n);
void silu_mul_avx512(float *h, const float *g, const float *u, int n);

/* kernels_fast_avx512.c: quantized dots in the fastest order */
float dot_q8_0_fast_avx512(const block_q8_0 *w, const block_q8_0 *x, int n);
float dot_q4_0_fast_avx512(const block_q4_0 *w, const block_q8_0 *x, int n);
void gemv_q4_0_fast_avx512(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n);
/* the same bits, prefetching the next pass into L1 as one stream (AMD Zen 5: kernels_fast_avx512.c) */
void gemv_q4_0_fast_stream_avx512(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows,
                                  int n);
void gemv_q8_0_fast_avx512(const block_q8_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n);

/* kernels_exact_avx512.c: quantized dots in llama.cpp's order */
float dot_q8_0_exact_avx512(const block_q8_0 *w, const block_q8_0 *x, int n);
float dot_q4_0_exact_avx512(const block_q4_0 *w, const block_q8_0 *x, int n);
void gemv_q4_0_exact_avx512(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n);

#endif

/* Private to lib/kernels/kernels_avx2.c and lib/kernels/sparse_avx2.c (both built with
 * -mavx2 -mfma -mf16c): the avx2 set's F32, F16, Q8_0 and Q4_0 row dots, in
 * one copy, so that a dense dot and a sparse gather of the same row give the
 * same bits (tests/test_sparse_kernels.c holds them to it).
 *
 * Each row dot also prefetches into L2 (T1), at the offset it is reading, the
 * row `next` (NULL: none, the dense dots): the gathers pass the row they read
 * next, which the hardware prefetcher cannot guess. Into L2 as in
 * sparse_avx512.c: prefetches into L1 read slower on Zen 4.
 *
 * Everything is forced inline: GCC 12 judges a small function whose only
 * effect is a prefetch "const" and deletes its calls, and the dense dots'
 * NULL folds the prefetch away. */
#ifndef PI2_KERNELS_AVX2_H
#define PI2_KERNELS_AVX2_H

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/kernels.h"

#define ROW_INLINE static inline __attribute__((always_inline))

ROW_INLINE float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

ROW_INLINE void prefetch_l2(const char *next, size_t off) {
    if (next) _mm_prefetch(next + off, _MM_HINT_T1);
}

/* called as the bytes [off, off+step) of a row are consumed: prefetch each
 * line this step enters in next */
ROW_INLINE void prefetch_l2_step(const char *next, size_t off, size_t step) {
    const size_t last = off + step - 1;
    if (off > 0 && (last >> 6) == ((off - 1) >> 6)) return;
    prefetch_l2(next, last);
}

ROW_INLINE float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

ROW_INLINE __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* 8 elements of a float row at element i: F32, or F16 widened */
ROW_INLINE __m256 load_row8(const void *p, int i, bool f16) {
    return f16 ? load_f16x8((const uint16_t *)p + i) : _mm256_loadu_ps((const float *)p + i);
}
ROW_INLINE float row_elem(const void *p, int i, bool f16) {
    return f16 ? _cvtsh_ss(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* The F32 and F16 dots (f16 a constant after inlining). Four named
 * accumulators hide the FMA latency (an array would live in memory); each
 * 32-element step prefetches the lines it reads in next. */
ROW_INLINE float float_row(const void *w, const void *x, int n, const char *next, bool f16) {
    const size_t esize = f16 ? 2 : 4;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        for (size_t off = 0; off < 32 * esize; off += 64) prefetch_l2(next, (size_t)i * esize + off);
        acc0 = _mm256_fmadd_ps(load_row8(w, i, f16), load_row8(x, i, f16), acc0);
        acc1 = _mm256_fmadd_ps(load_row8(w, i + 8, f16), load_row8(x, i + 8, f16), acc1);
        acc2 = _mm256_fmadd_ps(load_row8(w, i + 16, f16), load_row8(x, i + 16, f16), acc2);
        acc3 = _mm256_fmadd_ps(load_row8(w, i + 24, f16), load_row8(x, i + 24, f16), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_row8(w, i, f16), load_row8(x, i, f16), acc0);
    float sum = hsum256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += row_elem(w, i, f16) * row_elem(x, i, f16);
    return sum;
}

ROW_INLINE float f32_row(const float *w, const float *x, int n, const char *next) {
    return float_row(w, x, n, next, false);
}
ROW_INLINE float f16_row(const uint16_t *w, const uint16_t *x, int n, const char *next) {
    return float_row(w, x, n, next, true);
}

/* sum of a*b over 32 signed bytes, as 8 float lanes (exact: |partials| < 2^24) */
ROW_INLINE __m256 dot_i8x32(__m256i a, __m256i b) {
    /* maddubs wants one unsigned operand: move a's sign onto b */
    const __m256i abs_a = _mm256_sign_epi8(a, a), b_signed = _mm256_sign_epi8(b, a);
    const __m256i pairs = _mm256_maddubs_epi16(abs_a, b_signed);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

ROW_INLINE __m256i load_q8_0(const block_q8_0 *blk) { return _mm256_loadu_si256((const __m256i *)blk->qs); }

/* the 32 quants of a Q4_0 block minus 8, in element order, as signed bytes */
ROW_INLINE __m256i load_q4_0(const block_q4_0 *blk) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)blk->qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0f)), _mm256_set1_epi8(8));
}

/* quantized rows against a Q8_0 activation: two accumulators over alternate
 * blocks, an odd last block into the first */
#define QUANT_ROW(T, BLOCK)                                                                                      \
    ROW_INLINE float T##_row(const BLOCK *w, const block_q8_0 *x, int n, const char *next) {                    \
        const int nb = n / QK8_0;                                                                                \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                                           \
        int b = 0;                                                                                               \
        for (; b + 2 <= nb; b += 2) {                                                                            \
            prefetch_l2_step(next, (size_t)b * sizeof(BLOCK), 2 * sizeof(BLOCK));                                \
            const __m256 d0 = _mm256_set1_ps(load_f16(&w[b].d) * load_f16(&x[b].d));                            \
            const __m256 d1 = _mm256_set1_ps(load_f16(&w[b + 1].d) * load_f16(&x[b + 1].d));                     \
            acc0 = _mm256_fmadd_ps(d0, dot_i8x32(load_##T(&w[b]), load_q8_0(&x[b])), acc0);                      \
            acc1 = _mm256_fmadd_ps(d1, dot_i8x32(load_##T(&w[b + 1]), load_q8_0(&x[b + 1])), acc1);              \
        }                                                                                                        \
        if (b < nb) {                                                                                            \
            const __m256 d = _mm256_set1_ps(load_f16(&w[b].d) * load_f16(&x[b].d));                             \
            acc0 = _mm256_fmadd_ps(d, dot_i8x32(load_##T(&w[b]), load_q8_0(&x[b])), acc0);                      \
        }                                                                                                        \
        return hsum256(_mm256_add_ps(acc0, acc1));                                                              \
    }

QUANT_ROW(q8_0, block_q8_0)
QUANT_ROW(q4_0, block_q4_0)

#undef QUANT_ROW

#endif

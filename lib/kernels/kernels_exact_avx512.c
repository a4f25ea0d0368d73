/* The avx512-exact table's quantized dots: llama.cpp's order (its AMX/VNNI
 * kernels, build 4748): per block the exact integer sum times d_w*d_x,
 * fused-added to one running sum, block after block. That serial chain makes
 * them slower than kernels_fast_avx512.c; they exist to show bit-exact
 * agreement with llama.cpp (tests/test_oracle.c), not for the product. */
#include "kernels/kernels_avx512.h"

/* the 16 block sums of 8 registers that each hold the 8 partial sums of blocks
 * 2k and 2k+1 (halves), in block order: an add-transpose tree */
static __m512i block_sums16(const __m512i s[8]) {
    __m512i e[2];
    for (int h = 0; h < 2; h++) {
        const __m512i *t = s + 4 * h;
        const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(t[0], t[1]), _mm512_unpackhi_epi32(t[0], t[1]));
        const __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(t[2], t[3]), _mm512_unpackhi_epi32(t[2], t[3]));
        const __m512i c = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
        /* 128-bit lane 0: blocks 0,2,4,6 (of this half); lane 2: blocks 1,3,5,7 */
        e[h] = _mm512_add_epi32(c, _mm512_shuffle_i32x4(c, c, _MM_SHUFFLE(2, 3, 0, 1)));
    }
    const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27);
    return _mm512_permutex2var_epi32(e[0], order, e[1]);
}

/* acc + isum[j]*dd[j] for j = 0..15, one fused add after the other */
static float fma_chain16(float acc, __m512i isum, __m512 dd) {
    float is[16], d[16];
    _mm512_storeu_ps(is, _mm512_cvtepi32_ps(isum));
    _mm512_storeu_ps(d, dd);
    for (int j = 0; j < 16; j++) acc = __builtin_fmaf(is[j], d[j], acc);
    return acc;
}

/* the f16 scales of 16 blocks, `stride` bytes apart, as floats */
static __m512 block_scales16(const void *first, size_t stride) {
    const char *p = first;
    const __m256i packed = _mm256_setr_epi64x((long long)pack_scales4(p, stride),
                                              (long long)pack_scales4(p + 4 * stride, stride),
                                              (long long)pack_scales4(p + 8 * stride, stride),
                                              (long long)pack_scales4(p + 12 * stride, stride));
    return _mm512_cvtph_ps(packed);
}

/* d_w*d_x of 16 consecutive blocks */
static __m512 scales16(const void *w, size_t wstride, const void *x, size_t xstride) {
    return _mm512_mul_ps(block_scales16(w, wstride), block_scales16(x, xstride));
}

float dot_q8_0_exact_avx512(const block_q8_0 *w, const block_q8_0 *x, int n) {
    const int nb = n / QK8_0;
    float acc = 0.0f;
    int b = 0;
    for (; b + 16 <= nb; b += 16) {
        __m512i s[8];
        for (int k = 0; k < 8; k++) s[k] = dot_i8_pair(load_q8_pair(w + b + 2 * k), load_q8_pair(x + b + 2 * k));
        acc = fma_chain16(acc, block_sums16(s), scales16(w + b, sizeof *w, x + b, sizeof *x));
    }
    for (; b < nb; b++)
        acc = __builtin_fmaf((float)reduce_i32x8(dot_q8_block(w + b, x + b)), load_f16(&w[b].d) * load_f16(&x[b].d), acc);
    return acc;
}

float dot_q4_0_exact_avx512(const block_q4_0 *w, const block_q8_0 *x, int n) {
    const int nb = n / QK4_0;
    float acc = 0.0f;
    int b = 0;
    for (; b + 16 <= nb; b += 16) {
        __m512i s[8];
        for (int k = 0; k < 8; k++) s[k] = dot_q4_pair(load_q4_pair(w + b + 2 * k), load_q8_pair(x + b + 2 * k));
        acc = fma_chain16(acc, block_sums16(s), scales16(w + b, sizeof *w, x + b, sizeof *x));
    }
    for (; b < nb; b++)
        acc = __builtin_fmaf((float)reduce_i32x8(dot_q4_block(w + b, x + b)), load_f16(&w[b].d) * load_f16(&x[b].d), acc);
    return acc;
}

#define GEMV_ROW_PREFETCH 384 /* bytes ahead in each row (measured with tools/kernel-bench) */

/* 16 rows at a time with one row per lane: every lane runs the block-by-block
 * FMA chain, so each result is dot_q4_0_exact_avx512's, without its scalar chain */
void gemv_q4_0_exact_avx512(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n) {
    const int nb = n / QK4_0;
    int r0 = 0;
    for (; r0 + 16 <= nrows; r0 += 16) {
        const char *base = (const char *)w + (size_t)r0 * row_stride;
        __m512 acc = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const char *col = base + (size_t)b * sizeof(block_q4_0);
            if (b % 4 == 0) /* each row is its own stream: 16 at once are too many for the prefetchers */
                for (int k = 0; k < 16; k++) _mm_prefetch(col + (size_t)k * row_stride + GEMV_ROW_PREFETCH, _MM_HINT_T0);
            const __m512i xq = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[b].qs));
            const __m512i neg_corr =
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), xq));
            __m512i sums[8];
            for (int k = 0; k < 8; k++) { /* block b of rows 2k and 2k+1 */
                const char *pair = col + 2 * (size_t)k * row_stride;
                const __m512i q = load_q4_two((const block_q4_0 *)pair, (const block_q4_0 *)(pair + row_stride));
                sums[k] = _mm512_dpbusd_epi32(neg_corr, q, xq);
            }
            const __m512 dd = _mm512_mul_ps(block_scales16(col, row_stride), _mm512_set1_ps(load_f16(&x[b].d)));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_sums16(sums)), dd, acc);
        }
        _mm512_storeu_ps(y + r0, acc);
    }
    for (; r0 < nrows; r0++)
        y[r0] = dot_q4_0_exact_avx512((const block_q4_0 *)((const char *)w + (size_t)r0 * row_stride), x, n);
}

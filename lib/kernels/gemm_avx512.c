/* The prefill product on AVX-512 VNNI (gemm.h): a tile of 16 weight rows is
 * re-laid once with raw nibbles, then for each token the 16 rows sit in the
 * lanes: per block, 8 vpdpbusd of a line of row groups by the token's group
 * broadcast, the -8 offset taken off as 8 * sum(x), and one multiply and FMA
 * of the block scales. Integer sums are exact in any order, and each lane's
 * float steps are the reference's, so the bits are gemm_q4_0_ref's. */
#include "kernels/gemm_relay_avx512.h"

/* Eight tokens a pass share each block's eight lines of row groups, held in registers; the loops are
 * unrolled so that they stay there and the tokens' chains interleave on the VNNI ports. kernel-bench -k
 * avx512, 11008 x 4096 weights, one thread, Zen 5: 150-157 GMAC/s (four tokens a pass, loops not
 * unrolled: the lines were loaded again for every token and the chains ran one after another) -> 282-306;
 * one chain a token instead of two: 255-286. */
enum { TOKENS = 8 };

/* a block's 8 groups of the tile's rows, loaded once for all the tokens that use them */
typedef struct {
    __m512i g[8];
} block_rows;

static inline block_rows load_block(const int8_t *wq) {
    block_rows r;
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) r.g[k] = _mm512_load_si512(wq + k * 64);
    return r;
}

static inline __m512i block_isum(const block_rows *r, const int8_t *xq, __m512i corr) {
    const int32_t *xg = (const int32_t *)xq;
    __m512i a = corr, b = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
        a = _mm512_dpbusd_epi32(a, r->g[k], _mm512_set1_epi32(xg[k]));
        b = _mm512_dpbusd_epi32(b, r->g[k + 1], _mm512_set1_epi32(xg[k + 1]));
    }
    return _mm512_add_epi32(a, b);
}

void gemm_q4_0_avx512(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                      size_t y_stride, void *scratch) {
    const int nb = x->nb;
    int8_t *wq = scratch;
    float *dw = (float *)(wq + (size_t)nb * 8 * GEMM_TILE * 4);
    for (int r0 = 0; r0 < nrows; r0 += GEMM_TILE) {
        const int nr = nrows - r0 < GEMM_TILE ? nrows - r0 : GEMM_TILE;
        const __mmask16 live = (__mmask16)((1u << nr) - 1u);
        gemm_relay_q4_0((const block_q4_0 *)((const char *)w + (size_t)r0 * row_stride), row_stride, nr, nb, 0, wq,
                        dw);
        int t = 0;
        for (; t + TOKENS <= x->n_tok; t += TOKENS) {
            __m512 acc[TOKENS];
            for (int j = 0; j < TOKENS; j++) acc[j] = _mm512_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const block_rows rows = load_block(wq + (size_t)b * 8 * GEMM_TILE * 4);
                const __m512 dwb = _mm512_load_ps(dw + (size_t)b * GEMM_TILE);
#pragma GCC unroll 8
                for (int j = 0; j < TOKENS; j++) {
                    const size_t i = gemm_acts_index(x, t + j, b);
                    const __m512i corr = _mm512_set1_epi32(-8 * x->sum[i]);
                    const __m512i isum = block_isum(&rows, x->qs + i * 32, corr);
                    const __m512 s = _mm512_mul_ps(dwb, _mm512_set1_ps(x->d[i]));
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc[j]);
                }
            }
            for (int j = 0; j < TOKENS; j++) _mm512_mask_storeu_ps(y + (size_t)(t + j) * y_stride + r0, live, acc[j]);
        }
        for (; t < x->n_tok; t++) {
            __m512 acc = _mm512_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const size_t i = gemm_acts_index(x, t, b);
                const block_rows rows = load_block(wq + (size_t)b * 8 * GEMM_TILE * 4);
                const __m512i isum = block_isum(&rows, x->qs + i * 32, _mm512_set1_epi32(-8 * x->sum[i]));
                const __m512 s = _mm512_mul_ps(_mm512_load_ps(dw + (size_t)b * GEMM_TILE), _mm512_set1_ps(x->d[i]));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc);
            }
            _mm512_mask_storeu_ps(y + (size_t)t * y_stride + r0, live, acc);
        }
    }
}

/* The float product on AVX-512 (gemm.h, blocked as gemm_float_block.h says):
 * register blocks of 4 rows x 6 tokens, one zmm accumulator of 16 column
 * lanes per (row, token), so a weight vector is loaded once for 6 tokens and
 * a token's vector once for 4 rows. Each lane's FMAs run in the reference's
 * order and the lanes are summed as _mm512_reduce_add_ps does, so the bits
 * are gemm_f32/f16_ref's. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/gemm.h"
#include "kernels/gemm_float_block.h"

#define INLINE static inline __attribute__((always_inline))
/* the register block's loops unrolled, so its accumulators stay in registers */
#define UNROLL _Pragma("GCC unroll 8")

enum { MR = 4 }; /* rows per register block */

/* acc[r * GF_ROW_STRIDE + t * 16] += w[r] . xs[t] for r < mr, t < nt over kc
 * columns (w: packed rows GF_CHUNK apart); a last part of kc % 16 under a
 * mask, so the lanes past it keep their value */
INLINE void block(const float *w, const float *xs, int kc, float *acc, int mr, int nt) {
    __m512 a[MR][GF_TOKENS];
    UNROLL
    for (int r = 0; r < mr; r++)
        UNROLL
        for (int t = 0; t < nt; t++) a[r][t] = _mm512_load_ps(acc + r * GF_ROW_STRIDE + t * 16);
    int k = 0;
    for (; k + 16 <= kc; k += 16) {
        __m512 xv[GF_TOKENS];
        UNROLL
        for (int t = 0; t < nt; t++) xv[t] = _mm512_load_ps(xs + t * GF_CHUNK + k);
        UNROLL
        for (int r = 0; r < mr; r++) {
            const __m512 wv = _mm512_load_ps(w + r * GF_CHUNK + k);
            UNROLL
            for (int t = 0; t < nt; t++) a[r][t] = _mm512_fmadd_ps(wv, xv[t], a[r][t]);
        }
    }
    if (k < kc) {
        const __mmask16 m = (__mmask16)((1u << (kc - k)) - 1u);
        __m512 xv[GF_TOKENS];
        UNROLL
        for (int t = 0; t < nt; t++) xv[t] = _mm512_maskz_load_ps(m, xs + t * GF_CHUNK + k);
        UNROLL
        for (int r = 0; r < mr; r++) {
            const __m512 wv = _mm512_maskz_load_ps(m, w + r * GF_CHUNK + k);
            UNROLL
            for (int t = 0; t < nt; t++) a[r][t] = _mm512_mask3_fmadd_ps(wv, xv[t], a[r][t], m);
        }
    }
    UNROLL
    for (int r = 0; r < mr; r++)
        UNROLL
        for (int t = 0; t < nt; t++) _mm512_store_ps(acc + r * GF_ROW_STRIDE + t * 16, a[r][t]);
}

/* kc F16 values widened into dst */
static void widen_f16(float *dst, const uint16_t *h, int kc) {
    int k = 0;
    for (; k + 16 <= kc; k += 16) _mm512_store_ps(dst + k, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + k))));
    if (k < kc) {
        const __mmask16 m = (__mmask16)((1u << (kc - k)) - 1u);
        _mm512_mask_store_ps(dst + k, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + k)));
    }
}

/* the token group's tokens against every row of the block: 4 x 6 register
 * blocks where the counts allow */
INLINE void group(const float *wp, const float *xp, int kc, float *acc, int nr, int nt) {
    int r = 0;
    if (nt == GF_TOKENS) {
        for (; r + MR <= nr; r += MR) block(wp + r * GF_CHUNK, xp, kc, acc + r * GF_ROW_STRIDE, MR, GF_TOKENS);
        for (; r < nr; r++) block(wp + r * GF_CHUNK, xp, kc, acc + r * GF_ROW_STRIDE, 1, GF_TOKENS);
        return;
    }
    for (int t = 0; t < nt; t++) {
        float *at = acc + t * 16;
        const float *xt = xp + t * GF_CHUNK;
        for (r = 0; r + MR <= nr; r += MR) block(wp + r * GF_CHUNK, xt, kc, at + r * GF_ROW_STRIDE, MR, 1);
        for (; r < nr; r++) block(wp + r * GF_CHUNK, xt, kc, at + r * GF_ROW_STRIDE, 1, 1);
    }
}

static float reduce16(const float *acc) { return _mm512_reduce_add_ps(_mm512_load_ps(acc)); }

#include "kernels/gemm_float_drive.h"

GEMM_FLOAT_ENTRIES(avx512)

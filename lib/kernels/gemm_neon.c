/* The prefill product on NEON (gemm.h), for the neon sets: a tile of
 * GEMM_TILE weight rows is re-laid once, each block's quants minus 8 as
 * signed bytes (rows past the matrix: zeros) and its scales as floats; then
 * per token and block, four rows at a time, each row's exact integer sum
 * (SDOT, or widening multiplies: kernels_neon.h) and, with the four rows in
 * the lanes, the reference's multiply of the scales and its fused
 * multiply-add (FMLA, as fmaf): gemm_q4_0_ref's bits. */
#include "kernels/gemm.h"
#include "kernels/kernels_neon.h"

/* scratch (gemm_scratch_bytes): [nb][GEMM_TILE][32] quants, then [nb][GEMM_TILE] scales */
static void relay(const block_q4_0 *w, size_t row_stride, int nrows, int nb, int8_t *quants, float *scales) {
    for (int r = 0; r < GEMM_TILE; r++) {
        const block_q4_0 *row = r < nrows ? (const block_q4_0 *)((const char *)w + (size_t)r * row_stride) : NULL;
        for (int b = 0; b < nb; b++) {
            int8_t *q = quants + ((size_t)b * GEMM_TILE + (size_t)r) * 32;
            int8x16_t lo = vdupq_n_s8(0), hi = lo;
            if (row) q4_0_quants(&row[b], &lo, &hi);
            vst1q_s8(q, lo);
            vst1q_s8(q + 16, hi);
            scales[(size_t)b * GEMM_TILE + (size_t)r] = row ? load_f16(&row[b].d) : 0.0f;
        }
    }
}

/* the integer sums of rows 4g .. 4g+3 (32 quants each, 32 bytes apart) with one token's block, in four lanes */
#define ISUM4(SUFFIX, ATTR)                                                                                    \
    ATTR NEON_INLINE int32x4_t isum4_##SUFFIX(const int8_t *wq, int8x16_t x0, int8x16_t x1) {                  \
        int32x4_t p[4];                                                                                        \
        for (int r = 0; r < 4; r++) p[r] = isum_##SUFFIX(vld1q_s8(wq + 32 * r), vld1q_s8(wq + 32 * r + 16), x0, x1); \
        return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));                                     \
    }

#define GEMM_Q4_0(NAME, SUFFIX, ATTR)                                                                          \
    ISUM4(SUFFIX, ATTR)                                                                                        \
    ATTR void NAME(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,            \
                   size_t y_stride, void *scratch) {                                                           \
        const int nb = x->nb;                                                                                  \
        int8_t *wq = scratch;                                                                                  \
        float *dw = (float *)(void *)(wq + (size_t)nb * GEMM_TILE * 32);                                       \
        for (int r0 = 0; r0 < nrows; r0 += GEMM_TILE) {                                                        \
            const int nr = nrows - r0 < GEMM_TILE ? nrows - r0 : GEMM_TILE;                                    \
            relay((const block_q4_0 *)((const char *)w + (size_t)r0 * row_stride), row_stride, nr, nb, wq, dw); \
            for (int t = 0; t < x->n_tok; t++) {                                                               \
                float32x4_t acc[GEMM_TILE / 4];                                                                \
                for (int g = 0; g < GEMM_TILE / 4; g++) acc[g] = vdupq_n_f32(0.0f);                            \
                for (int b = 0; b < nb; b++) {                                                                 \
                    const size_t i = gemm_acts_index(x, t, b);                                                 \
                    const int8x16_t x0 = vld1q_s8(x->qs + i * 32), x1 = vld1q_s8(x->qs + i * 32 + 16);         \
                    const int8_t *wb = wq + (size_t)b * GEMM_TILE * 32;                                        \
                    for (int g = 0; g < GEMM_TILE / 4; g++) {                                                  \
                        const float32x4_t s = vmulq_n_f32(vld1q_f32(dw + (size_t)b * GEMM_TILE + 4 * g), x->d[i]); \
                        acc[g] = vfmaq_f32(acc[g], vcvtq_f32_s32(isum4_##SUFFIX(wb + 128 * g, x0, x1)), s);    \
                    }                                                                                          \
                }                                                                                              \
                float out[GEMM_TILE];                                                                          \
                for (int g = 0; g < GEMM_TILE / 4; g++) vst1q_f32(out + 4 * g, acc[g]);                        \
                for (int r = 0; r < nr; r++) y[(size_t)t * y_stride + (size_t)(r0 + r)] = out[r];              \
            }                                                                                                  \
        }                                                                                                      \
    }

GEMM_Q4_0(gemm_q4_0_neon, neon, )
GEMM_Q4_0(gemm_q4_0_neon_sdot, sdot, SDOT_TARGET)

/* The float product on NEON (gemm.h, blocked as gemm_float_block.h says): a
 * row against 6 tokens at a time, each (row, token) accumulator the
 * reference's 16 lanes held in four 4-lane vectors, chains of FMLAs (fused,
 * as fmaf), so a weight vector is loaded once for 6 tokens (24 accumulator
 * and 4 weight registers of the 32). The lanes are summed in
 * _mm512_reduce_add_ps's order, so the bits are the reference's; a last
 * part of n % 16 columns is added lane by lane. */
#include <arm_neon.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "gguf/f16.h"
#include "kernels/gemm.h"
#include "kernels/gemm_float_block.h"

#define INLINE static inline __attribute__((always_inline))
/* the register block's loops unrolled, so its accumulators stay in registers */
#define UNROLL _Pragma("GCC unroll 8")

/* acc[t * 16] += w . xs[t] for t < nt over kc columns (xs: packed, GF_CHUNK apart) */
INLINE void block(const float *w, const float *xs, int kc, float *acc, int nt) {
    float32x4_t a[GF_TOKENS][4];
    UNROLL
    for (int t = 0; t < nt; t++)
        for (int q = 0; q < 4; q++) a[t][q] = vld1q_f32(acc + t * 16 + 4 * q);
    int k = 0;
    for (; k + 16 <= kc; k += 16) {
        float32x4_t wv[4];
        for (int q = 0; q < 4; q++) wv[q] = vld1q_f32(w + k + 4 * q);
        UNROLL
        for (int t = 0; t < nt; t++)
            for (int q = 0; q < 4; q++) a[t][q] = vfmaq_f32(a[t][q], wv[q], vld1q_f32(xs + t * GF_CHUNK + k + 4 * q));
    }
    UNROLL
    for (int t = 0; t < nt; t++) {
        for (int q = 0; q < 4; q++) vst1q_f32(acc + t * 16 + 4 * q, a[t][q]);
        for (int i = k; i < kc; i++) acc[t * 16 + (i - k)] = fmaf(w[i], xs[t * GF_CHUNK + i], acc[t * 16 + (i - k)]);
    }
}

/* kc F16 values widened into dst */
static void widen_f16(float *dst, const uint16_t *h, int kc) {
    int k = 0;
    for (; k + 4 <= kc; k += 4) vst1q_f32(dst + k, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + k))));
    for (; k < kc; k++) dst[k] = f16_to_f32(h[k]);
}

/* _mm512_reduce_add_ps's order (gemm.h): lanes 8-15 onto 0-7, then 4-7
 * onto 0-3, then 2,3 onto 0,1, then lane 1 onto lane 0 */
static float reduce16(const float *a) {
    const float32x4_t h8_lo = vaddq_f32(vld1q_f32(a + 8), vld1q_f32(a));
    const float32x4_t h8_hi = vaddq_f32(vld1q_f32(a + 12), vld1q_f32(a + 4));
    const float32x4_t h4 = vaddq_f32(h8_hi, h8_lo);
    const float32x2_t h2 = vadd_f32(vget_high_f32(h4), vget_low_f32(h4)); /* h4[0] + h4[2], h4[1] + h4[3] */
    return vget_lane_f32(h2, 0) + vget_lane_f32(h2, 1);
}

#include "kernels/gemm_float_rows.h"
#include "kernels/gemm_float_drive.h"

GEMM_FLOAT_ENTRIES(neon)

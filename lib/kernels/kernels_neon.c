/* NEON kernels (AArch64 only; NEON is part of its baseline). The quantized
 * dots take each block's integer sum with NEON and do the rest as the scalar
 * reference, in its order: every result is kernels_scalar()'s bit for bit, so
 * the set, a copy of the scalar one, keeps its other families (the scalar
 * sparse gathers, predictor gemv and prefill products) and a stack of ARM64
 * workers agrees with pi2-ref. With the dot-product extension
 * (FEAT_DotProd: HWCAP_ASIMDDP, checked at run time) a block is two SDOTs,
 * else four widening multiplies and pairwise adds. Everything else is the
 * scalar set's. */
#include <arm_neon.h>
#include <stdbool.h>
#include <string.h>
#include <sys/auxv.h>

#include "gguf/f16.h"
#include "kernels/kernels.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif

extern const kernels kernels_scalar_impl;

static float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return f16_to_f32(h);
}

/* sum of a[i] * b[i] over 32 signed bytes: int16 products (|a b| <= 128 * 128
 * fits), added pairwise into int32 lanes; exact */
static inline int32_t isum32_widening(int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1) {
    int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(a0), vget_low_s8(b0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(a0), vget_high_s8(b0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a1), vget_low_s8(b1)));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(a1), vget_high_s8(b1)));
    return vaddvq_s32(acc);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static inline int32_t isum32_sdot(int8x16_t a0, int8x16_t a1, int8x16_t b0,
                                                                      int8x16_t b1) {
    return vaddvq_s32(vdotq_s32(vdotq_s32(vdupq_n_s32(0), a0, b0), a1, b1));
}

/* the 32 quants of a Q4_0 block minus 8, elements 0-15 and 16-31 */
static inline void q4_0_quants(const block_q4_0 *blk, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t q = vld1q_u8(blk->qs);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
}

/* The dots, once per block-sum flavour; the float part is the scalar
 * reference's expression (C11: no contraction into a fused multiply-add). */
#define QUANT_DOTS(SUFFIX, ISUM, ATTR)                                                                          \
    ATTR static float dot_q8_0_##SUFFIX(const block_q8_0 *w, const block_q8_0 *x, int n) {                    \
        float sum = 0.0f;                                                                                      \
        for (int b = 0; b < n / QK8_0; b++) {                                                                  \
            const int32_t isum = ISUM(vld1q_s8(w[b].qs), vld1q_s8(w[b].qs + 16), vld1q_s8(x[b].qs),           \
                                      vld1q_s8(x[b].qs + 16));                                                 \
            sum += load_f16(&w[b].d) * load_f16(&x[b].d) * (float)isum;                                        \
        }                                                                                                      \
        return sum;                                                                                            \
    }                                                                                                          \
    ATTR static float dot_q4_0_##SUFFIX(const block_q4_0 *w, const block_q8_0 *x, int n) {                    \
        float sum = 0.0f;                                                                                      \
        for (int b = 0; b < n / QK4_0; b++) {                                                                  \
            int8x16_t lo, hi;                                                                                  \
            q4_0_quants(&w[b], &lo, &hi);                                                                      \
            const int32_t isum = ISUM(lo, hi, vld1q_s8(x[b].qs), vld1q_s8(x[b].qs + 16));                      \
            sum += load_f16(&w[b].d) * load_f16(&x[b].d) * (float)isum;                                        \
        }                                                                                                      \
        return sum;                                                                                            \
    }                                                                                                          \
    ATTR static void gemv_q4_0_##SUFFIX(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, \
                                        int nrows, int n) {                                                    \
        for (int r = 0; r < nrows; r++)                                                                        \
            y[r] = dot_q4_0_##SUFFIX((const block_q4_0 *)((const char *)w + (size_t)r * row_stride), x, n);    \
    }

QUANT_DOTS(neon, isum32_widening, )
QUANT_DOTS(dotprod, isum32_sdot, __attribute__((target("arch=armv8.2-a+dotprod"))))

#undef QUANT_DOTS

static kernels neon_set, widening_set;

/* the scalar set with the NEON dots: SDOT ones when sdot, else the widening ones */
static void fill(kernels *k, const char *name, bool sdot) {
    *k = kernels_scalar_impl;
    k->name = name;
    k->dot_q8_0 = sdot ? dot_q8_0_dotprod : dot_q8_0_neon;
    k->dot_q4_0 = sdot ? dot_q4_0_dotprod : dot_q4_0_neon;
    k->gemv_q4_0 = sdot ? gemv_q4_0_dotprod : gemv_q4_0_neon;
}

/* kernels.c calls it once: the set this CPU runs fastest, and the one without SDOT */
void kernels_neon_make(const kernels **best, const kernels **without_sdot) {
    fill(&neon_set, "neon", (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0);
    fill(&widening_set, "neon (no SDOT)", false);
    *best = &neon_set;
    *without_sdot = &widening_set;
}

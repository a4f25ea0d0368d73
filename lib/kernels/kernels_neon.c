/* The neon kernel sets (AArch64 only; NEON is part of its baseline): every
 * family with NEON where it can keep the scalar reference's order, so that
 * every result is kernels_scalar()'s bit for bit and a stack of ARM64
 * workers agrees with pi2-ref. How each kernel keeps the order:
 *
 *   quantized dots, gemv_q4_0   each block's integer sum in NEON (exact), the
 *                               float part as the reference, block after block
 *   dot_f16                     the widening and the products in NEON; the
 *                               products added one by one, in order
 *   dot_f16_rows, the F32/F16   four rows side by side, one serial chain per
 *   gathers (sparse_neon.c)     lane (kernels_neon.h float_rows4)
 *   quantize_q8_0, f32_to_f16_row, axpy_f32, the sparse axpys
 *                               element by element, each element's operations
 *                               as the reference's (a multiply then an add, one
 *                               fused multiply-add, FCVTN, rounding to even)
 *   predictor gemv, prefill     their families define lanes (pred_gemv.h,
 *   products                    gemm.h): the lanes are NEON lanes
 *
 * What stays scalar: dot_f32, one serial chain of multiply-then-add with
 * nothing to widen (NEON products would leave the same chain of adds);
 * softmax_exp and silu_mul, libm's expf; gemv_q8_0 and the Q8_0 predictor
 * gemv, absent as in the scalar set (kernels.h says why).
 *
 * With the dot-product extension (FEAT_DotProd: HWCAP_ASIMDDP, checked in
 * kernels.c) the integer block sums are SDOTs, else widening multiplies
 * and pairwise adds (kernels_neon.h): three tables, the SDOT one, the
 * widening one kernels_neon() offers without SDOT, and that one under its
 * own name, which tests run on every CPU. */
#include "kernels/kernels_neon.h"

#include "gguf/f16.h"
#include "kernels/dot_f16_rows_tile.h"
#include "kernels/kernels.h"

/* the products of four elements, added to the sum one by one in order */
static float dot_f16_neon(const uint16_t *w, const uint16_t *x, int n) {
    float sum = 0.0f;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t p = vmulq_f32(load4(w, i, true), load4(x, i, true));
        sum += vgetq_lane_f32(p, 0);
        sum += vgetq_lane_f32(p, 1);
        sum += vgetq_lane_f32(p, 2);
        sum += vgetq_lane_f32(p, 3);
    }
    for (; i < n; i++) sum += load_f16(w + i) * load_f16(x + i);
    return sum;
}

/* four rows at a time, as the F16 gathers (kernels_neon.h float_seq) */
static void dot_f16_rows_neon(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, int n, float *out) {
    const row_seq s = row_seq_dense(w, row_stride * sizeof(uint16_t), rows, out);
    float_seq(&s, x, n, true);
}

static void dot_f16_rows_tile_neon(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, size_t x_stride,
                                  int nx, int n, float *out, size_t out_stride, float *scratch) {
    (void)scratch;
    dot_f16_rows_tile_by_vector(dot_f16_rows_neon, w, row_stride, rows, x, x_stride, nx, n, out, out_stride);
}

/* The gemvs prefetch into L2 the row two ahead as they read (as the AVX2 set's). */
#define GEMV_AHEAD 2

/* The quantized dots and the Q4_0 gemv, once per block-sum flavour. */
#define QUANT_DOTS(SUFFIX, ATTR)                                                                                \
    ATTR static float dot_q8_0_##SUFFIX(const block_q8_0 *w, const block_q8_0 *x, int n) {                    \
        return q8_0_row_##SUFFIX(w, x, n, NULL);                                                               \
    }                                                                                                          \
    ATTR static float dot_q4_0_##SUFFIX(const block_q4_0 *w, const block_q8_0 *x, int n) {                    \
        return q4_0_row_##SUFFIX(w, x, n, NULL);                                                               \
    }                                                                                                          \
    ATTR static void gemv_q4_0_##SUFFIX(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, \
                                        int nrows, int n) {                                                    \
        for (int r = 0; r < nrows; r++)                                                                        \
            y[r] = q4_0_row_##SUFFIX((const block_q4_0 *)((const char *)w + (size_t)r * row_stride), x, n,     \
                                     kernels_row_or_null(w, row_stride, nrows, r + GEMV_AHEAD));               \
    }

QUANT_DOTS(neon, )
QUANT_DOTS(sdot, SDOT_TARGET)

#undef QUANT_DOTS

/* The reference's steps on 32 elements at once: amax by maxNum (as fmaxf,
 * and order-free), the multiply by 127/amax, rounding to nearest even
 * (FCVTNS, as nearbyintf then the conversion), the scale as the reference
 * converts it. */
static void quantize_q8_0_neon(const float *x, block_q8_0 *y, int n) {
    for (int b = 0; b < n / QK8_0; b++) {
        const float *xb = x + b * QK8_0;
        float32x4_t v[8], m = vdupq_n_f32(0.0f);
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(xb + 4 * k);
            m = vmaxnmq_f32(m, vabsq_f32(v[k]));
        }
        const float amax = vmaxnmvq_f32(m);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const uint16_t d = f32_to_f16(amax / 127.0f);
        memcpy(&y[b].d, &d, sizeof d);
        int16x8_t q[4];
        for (int k = 0; k < 4; k++)
            q[k] = vcombine_s16(vmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * k], id))),
                                vmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * k + 1], id))));
        vst1q_s8(y[b].qs, vcombine_s8(vmovn_s16(q[0]), vmovn_s16(q[1])));
        vst1q_s8(y[b].qs + 16, vcombine_s8(vmovn_s16(q[2]), vmovn_s16(q[3])));
    }
}

/* FCVTN rounds to nearest even and keeps NaN payloads as f32_to_f16 does */
static void f32_to_f16_row_neon(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = f32_to_f16(x[i]);
}

/* multiply then add (no fused multiply-add), as the reference */
static void axpy_f32_neon(float *y, float a, const float *w, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_n_f32(vld1q_f32(w + i), a)));
    for (; i < n; i++) y[i] += a * w[i];
}

#define NEON_SET(NAME, SUFFIX, SPARSE, GEMM_Q4_0)                                                             \
    {                                                                                                          \
        .name = NAME, .dot_f32 = dot_f32_ref, .dot_f16 = dot_f16_neon, .dot_f16_rows = dot_f16_rows_neon,     \
        .dot_f16_rows_tile = dot_f16_rows_tile_neon,                                                            \
        .dot_q8_0 = dot_q8_0_##SUFFIX, .dot_q4_0 = dot_q4_0_##SUFFIX, .quantize_q8_0 = quantize_q8_0_neon,     \
        .f32_to_f16_row = f32_to_f16_row_neon, .axpy_f32 = axpy_f32_neon, .gemv_q4_0 = gemv_q4_0_##SUFFIX,    \
        .gemm_q4_0 = GEMM_Q4_0, .gemm_f32 = gemm_f32_neon, .gemm_f16 = gemm_f16_neon,                         \
        .softmax_exp = softmax_exp_ref, .silu_mul = silu_mul_ref, .sparse = SPARSE, .gather = SPARSE,         \
        .pred_gemv_f16 = pred_gemv_f16_neon, .lanesum64 = lanesum64_neon,                                      \
    }

const kernels kernels_neon_sdot_impl = NEON_SET("neon", sdot, &sparse_neon_sdot_impl, gemm_q4_0_neon_sdot);
const kernels kernels_neon_impl = NEON_SET("neon", neon, &sparse_neon_impl, gemm_q4_0_neon);
const kernels kernels_neon_without_sdot_impl = NEON_SET("neon (no SDOT)", neon, &sparse_neon_impl, gemm_q4_0_neon);

/* Private to the *_neon.c kernel files (AArch64 only): the pieces the neon
 * sets' families share, in one copy, so that a dense dot and a sparse gather
 * of the same row give the same bits, the scalar reference's
 * (kernels_neon.c says how each kernel keeps the reference's order).
 *
 * The integer block sums come in two flavours with the same exact result:
 * widening multiplies (`_neon`, any AArch64 CPU) and SDOT (`_sdot`,
 * FEAT_DotProd, only in functions compiled for it: SDOT_TARGET, reached
 * through the table kernels.c offers after checking HWCAP_ASIMDDP). A
 * function that calls an `_sdot` piece carries SDOT_TARGET itself, so the
 * files write each such function once, as a macro over the flavour.
 *
 * Everything is forced inline: a gather's prefetch of its next row folds
 * away in the dense dots (next == NULL), and GCC 12 judges a small function
 * whose only effect is a prefetch "const" and deletes its calls.
 *
 * Errors: none: inline arithmetic; the callers check lengths and types. */
#ifndef PI2_KERNELS_NEON_H
#define PI2_KERNELS_NEON_H

#include <arm_neon.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "gguf/ggml_types.h"
#include "kernels/sparse_rows.h"

#define NEON_INLINE static inline __attribute__((always_inline))
#define SDOT_TARGET __attribute__((target("arch=armv8.2-a+dotprod")))

/* an F16 value widened (FCVT: exact, as f16_to_f32) */
NEON_INLINE float load_f16(const void *p) {
    __fp16 h;
    memcpy(&h, p, sizeof h);
    return h;
}

/* ---- integer block sums ---- */

/* Four int32 lanes whose total is sum a[i] * b[i] over 32 signed bytes (a0,
 * b0: bytes 0-15; a1, b1: 16-31), exact either way. Widening: int16
 * products (|a b| <= 128 * 128 fits), added pairwise into the lanes. */
NEON_INLINE int32x4_t isum_neon(int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1) {
    int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(a0), vget_low_s8(b0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(a0), vget_high_s8(b0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a1), vget_low_s8(b1)));
    return vpadalq_s16(acc, vmull_s8(vget_high_s8(a1), vget_high_s8(b1)));
}

SDOT_TARGET NEON_INLINE int32x4_t isum_sdot(int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), a0, b0), a1, b1);
}

/* the 32 quants of a Q4_0 block minus 8, elements 0-15 and 16-31 */
NEON_INLINE void q4_0_quants(const block_q4_0 *blk, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t q = vld1q_u8(blk->qs);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
}

/* The quantized row dots, kernels_scalar.c's: per block the exact integer
 * sum, then sum += d_w * d_x * (float)isum, block after block (C11: no
 * contraction into a fused multiply-add). `next`: a row to prefetch into L2
 * as this one is read (NULL: none). */
#define NEON_QUANT_ROWS(SUFFIX, ATTR)                                                                          \
    ATTR NEON_INLINE float q8_0_row_##SUFFIX(const block_q8_0 *w, const block_q8_0 *x, int n, const char *next) { \
        float sum = 0.0f;                                                                                      \
        for (int b = 0; b < n / QK8_0; b++) {                                                                  \
            prefetch_next_row(next, (size_t)b * sizeof(block_q8_0), sizeof(block_q8_0));                       \
            const int32_t isum = vaddvq_s32(isum_##SUFFIX(vld1q_s8(w[b].qs), vld1q_s8(w[b].qs + 16),           \
                                                          vld1q_s8(x[b].qs), vld1q_s8(x[b].qs + 16)));         \
            sum += load_f16(&w[b].d) * load_f16(&x[b].d) * (float)isum;                                        \
        }                                                                                                      \
        return sum;                                                                                            \
    }                                                                                                          \
    ATTR NEON_INLINE float q4_0_row_##SUFFIX(const block_q4_0 *w, const block_q8_0 *x, int n, const char *next) { \
        float sum = 0.0f;                                                                                      \
        for (int b = 0; b < n / QK4_0; b++) {                                                                  \
            prefetch_next_row(next, (size_t)b * sizeof(block_q4_0), sizeof(block_q4_0));                       \
            int8x16_t lo, hi;                                                                                  \
            q4_0_quants(&w[b], &lo, &hi);                                                                      \
            const int32_t isum = vaddvq_s32(isum_##SUFFIX(lo, hi, vld1q_s8(x[b].qs), vld1q_s8(x[b].qs + 16))); \
            sum += load_f16(&w[b].d) * load_f16(&x[b].d) * (float)isum;                                        \
        }                                                                                                      \
        return sum;                                                                                            \
    }

NEON_QUANT_ROWS(neon, )
NEON_QUANT_ROWS(sdot, SDOT_TARGET)

#undef NEON_QUANT_ROWS

/* ---- float rows ---- */

/* 4 elements of an F32 row, or of an F16 one widened, from element i */
NEON_INLINE float32x4_t load4(const void *p, int i, bool f16) {
    return f16 ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p + i))) : vld1q_f32((const float *)p + i);
}
NEON_INLINE float elem(const void *p, int i, bool f16) {
    return f16 ? load_f16((const uint16_t *)p + i) : ((const float *)p)[i];
}

/* (a0, a1, b0, b1) and (a2, a3, b2, b3) */
NEON_INLINE float32x4_t low_pairs(float32x4_t a, float32x4_t b) {
    return vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b)));
}
NEON_INLINE float32x4_t high_pairs(float32x4_t a, float32x4_t b) {
    return vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b)));
}

/* out[r] = the scalar dot of row[r] with x (sum += w[i] * x[i], i
 * ascending: each product rounded, then added) for r < 4, F32 or F16. A
 * row's sum is a serial chain, so the rows go side by side, one per lane:
 * per 4 columns the rows' 4 x 4 products are transposed, and each vector
 * add takes the next term of all four chains. next[r]: rows to prefetch
 * into L2 as these are read (NULL: none). */
NEON_INLINE void float_rows4(const void *const row[4], const void *x, int n, bool f16, const char *const next[4],
                             float out[4]) {
    const size_t esize = f16 ? sizeof(uint16_t) : sizeof(float);
    float32x4_t acc = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        axpy_prefetch_next(next, 4, (size_t)i * esize, 4 * esize);
        const float32x4_t xv = load4(x, i, f16);
        const float32x4_t p0 = vmulq_f32(load4(row[0], i, f16), xv), p1 = vmulq_f32(load4(row[1], i, f16), xv);
        const float32x4_t p2 = vmulq_f32(load4(row[2], i, f16), xv), p3 = vmulq_f32(load4(row[3], i, f16), xv);
        /* t01e: p0[0] p1[0] p0[2] p1[2]; t01o: p0[1] p1[1] p0[3] p1[3]; t23: the same of rows 2, 3 */
        const float32x4_t t01e = vtrn1q_f32(p0, p1), t01o = vtrn2q_f32(p0, p1);
        const float32x4_t t23e = vtrn1q_f32(p2, p3), t23o = vtrn2q_f32(p2, p3);
        acc = vaddq_f32(acc, low_pairs(t01e, t23e)); /* column i of the four rows */
        acc = vaddq_f32(acc, low_pairs(t01o, t23o));
        acc = vaddq_f32(acc, high_pairs(t01e, t23e));
        acc = vaddq_f32(acc, high_pairs(t01o, t23o));
    }
    vst1q_f32(out, acc);
    for (; i < n; i++)
        for (int r = 0; r < 4; r++) out[r] += elem(row[r], i, f16) * elem(x, i, f16);
}

/* the F32 or F16 rows of s, four at a time (a last group of fewer repeats
 * its last row), prefetching the four after */
NEON_INLINE void float_seq(const row_seq *s, const void *x, int n, bool f16) {
    const int len = row_seq_len(s);
    for (int i0 = 0; i0 < len; i0 += 4) {
        const int m = len - i0 < 4 ? len - i0 : 4;
        const void *row[4];
        const char *next[4];
        float sums[4];
        for (int r = 0; r < 4; r++) {
            row[r] = row_seq_row(s, i0 + (r < m ? r : m - 1));
            next[r] = row_seq_ahead(s, i0, 4 + r);
        }
        float_rows4(row, x, n, f16, next, sums);
        for (int r = 0; r < m; r++) *row_seq_out(s, i0 + r) = sums[r];
    }
}

#endif

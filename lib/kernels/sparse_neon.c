/* NEON sparse kernels (AArch64 only), reached through the neon kernel sets
 * (kernels_neon.c), whose promise they keep: every result is the scalar
 * reference's bit for bit (sparse_scalar.c).
 *
 * Dots: the neon sets' dense dots are the scalar ones, so the gathers are
 * too. F32 and F16 rows are serial chains, taken four rows side by side
 * (kernels_neon.h float_rows4); Q8_0 and Q4_0 rows one at a time, each
 * block's integer sum in NEON (SDOT in the sdot table). Each prefetches
 * into L2 the rows it reads next: the gather is scattered, which the
 * hardware prefetcher cannot guess.
 *
 * Axpys (the same in both tables): AXPY_ROWS rows per pass over y (the Q4_0
 * one AXPY_Q4_GROUP), y held in registers across them, prefetching the next
 * group's rows (sparse_rows.h). F32, F16 and Q8_0: one fused multiply-add
 * per element and row, k ascending (FMLA, as fmaf); Q4_0: the group's int8
 * coefficients quantized per block as the reference does, the integer sums
 * exact in int16 (|c (q - 8)| <= 127 * 8, 16 rows <= 16256), then one fused
 * multiply-add per element. */
#include <math.h>

#include "kernels/kernels_neon.h"
#include "kernels/sparse_kernels.h"
#include "kernels/sparse_rows.h"

/* ---- dots ---- */

static void f32_seq(const row_seq *s, const void *x, int n) { float_seq(s, x, n, false); }
static void f16_seq(const row_seq *s, const void *x, int n) { float_seq(s, x, n, true); }

/* quantized rows one at a time, prefetching the next */
#define QUANT_SEQ(T, BLOCK, SUFFIX, ATTR)                                                                      \
    ATTR static void T##_seq_##SUFFIX(const row_seq *s, const void *x, int n) {                                \
        for (int i = 0; i < row_seq_len(s); i++)                                                               \
            *row_seq_out(s, i) = T##_row_##SUFFIX((const BLOCK *)row_seq_row(s, i), x, n, row_seq_ahead(s, i, 1)); \
    }

QUANT_SEQ(q8_0, block_q8_0, neon, )
QUANT_SEQ(q4_0, block_q4_0, neon, )
QUANT_SEQ(q8_0, block_q8_0, sdot, SDOT_TARGET)
QUANT_SEQ(q4_0, block_q4_0, sdot, SDOT_TARGET)

#undef QUANT_SEQ

/* the plain and the fused gate+up gather over one row sequence kernel */
#define GATHER_DOTS(NAME, SEQ)                                                                                 \
    static void dot_##NAME(const void *w, size_t stride, const int32_t *idx, int count, const void *x, int n,   \
                           float *out, const sparse_then *then) {                                              \
        const row_seq s = row_seq_one(w, stride, idx, count, out, then);                                       \
        SEQ(&s, x, n);                                                                                         \
    }                                                                                                          \
    static void dot2_##NAME(const void *w_a, const void *w_b, size_t stride, const int32_t *idx, int count,    \
                            const void *x, int n, float *out_a, float *out_b, const sparse_then *then) {       \
        const row_seq s = row_seq_two(w_a, w_b, stride, idx, count, out_a, out_b, then);                       \
        SEQ(&s, x, n);                                                                                         \
    }

GATHER_DOTS(f32, f32_seq)
GATHER_DOTS(f16, f16_seq)
GATHER_DOTS(q8_0_neon, q8_0_seq_neon)
GATHER_DOTS(q4_0_neon, q4_0_seq_neon)
GATHER_DOTS(q8_0_sdot, q8_0_seq_sdot)
GATHER_DOTS(q4_0_sdot, q4_0_seq_sdot)

#undef GATHER_DOTS

/* ---- axpys ---- */

/* F32 and F16 rows: 16 elements per pass in four registers; F16 widened on load */
static void float_axpy(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                       int n, const sparse_then *then, bool f16) {
    const size_t esize = f16 ? sizeof(uint16_t) : sizeof(float);
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, AXPY_ROWS, w, stride, idx, coef, count, k0, then);
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            axpy_prefetch_next(g.next, g.next_m, (size_t)i * esize, 16 * esize);
            float32x4_t y0 = vld1q_f32(y + i), y1 = vld1q_f32(y + i + 4);
            float32x4_t y2 = vld1q_f32(y + i + 8), y3 = vld1q_f32(y + i + 12);
            for (int r = 0; r < g.m; r++) {
                const float c = g.coef[r];
                y0 = vfmaq_n_f32(y0, load4(g.rows[r], i, f16), c);
                y1 = vfmaq_n_f32(y1, load4(g.rows[r], i + 4, f16), c);
                y2 = vfmaq_n_f32(y2, load4(g.rows[r], i + 8, f16), c);
                y3 = vfmaq_n_f32(y3, load4(g.rows[r], i + 12, f16), c);
            }
            vst1q_f32(y + i, y0);
            vst1q_f32(y + i + 4, y1);
            vst1q_f32(y + i + 8, y2);
            vst1q_f32(y + i + 12, y3);
        }
        for (; i < n; i++)
            for (int r = 0; r < g.m; r++) y[i] = fmaf(g.coef[r], elem(g.rows[r], i, f16), y[i]);
    }
}

static void axpy_f32(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y, int n,
                     const sparse_then *then) {
    float_axpy(w, stride, idx, coef, count, y, n, then, false);
}

static void axpy_f16(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y, int n,
                     const sparse_then *then) {
    float_axpy(w, stride, idx, coef, count, y, n, then, true);
}

/* 8 signed bytes widened to two vectors of 4 floats (exact) */
static inline void i8x8_to_f32(int8x8_t q, float32x4_t *lo, float32x4_t *hi) {
    const int16x8_t h = vmovl_s8(q);
    *lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
    *hi = vcvtq_f32_s32(vmovl_s16(vget_high_s16(h)));
}

/* per block cd = coef * d, then y = fma(cd, q, y) element by element */
static void axpy_q8_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n, const sparse_then *then) {
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, AXPY_ROWS, w, stride, idx, coef, count, k0, then);
        for (int b = 0; b < n / QK8_0; b++) {
            const size_t off = (size_t)b * sizeof(block_q8_0);
            axpy_prefetch_next(g.next, g.next_m, off, sizeof(block_q8_0));
            float *yb = y + b * QK8_0;
            float32x4_t acc[8];
            for (int j = 0; j < 8; j++) acc[j] = vld1q_f32(yb + 4 * j);
            for (int r = 0; r < g.m; r++) {
                const block_q8_0 *blk = (const block_q8_0 *)(g.rows[r] + off);
                const float cd = g.coef[r] * load_f16(&blk->d);
                for (int h = 0; h < 4; h++) {
                    float32x4_t lo, hi;
                    i8x8_to_f32(vld1_s8(blk->qs + 8 * h), &lo, &hi);
                    acc[2 * h] = vfmaq_n_f32(acc[2 * h], lo, cd);
                    acc[2 * h + 1] = vfmaq_n_f32(acc[2 * h + 1], hi, cd);
                }
            }
            for (int j = 0; j < 8; j++) vst1q_f32(yb + 4 * j, acc[j]);
        }
    }
}

static void axpy_q4_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n, const sparse_then *then) {
    for (int k0 = 0; k0 < count; k0 += AXPY_Q4_GROUP) {
        axpy_group g;
        axpy_group_at(&g, AXPY_Q4_GROUP, w, stride, idx, coef, count, k0, then);
        for (int b = 0; b < n / QK4_0; b++) {
            const size_t off = (size_t)b * sizeof(block_q4_0);
            axpy_prefetch_next(g.next, g.next_m, off, sizeof(block_q4_0));
            float cd[AXPY_Q4_GROUP];
            int8_t c[AXPY_Q4_GROUP];
            for (int r = 0; r < g.m; r++) cd[r] = g.coef[r] * load_f16(g.rows[r] + off);
            const float scale = q4_axpy_quantize(cd, g.m, c); /* the reference's coefficients */
            /* the exact sums of elements 0-7, 8-15 (low nibbles) and 16-23, 24-31 (high) */
            int16x8_t s[4] = {vdupq_n_s16(0), vdupq_n_s16(0), vdupq_n_s16(0), vdupq_n_s16(0)};
            for (int r = 0; r < g.m; r++) {
                int8x16_t lo, hi;
                q4_0_quants((const block_q4_0 *)(g.rows[r] + off), &lo, &hi);
                const int8x8_t cr = vdup_n_s8(c[r]);
                s[0] = vmlal_s8(s[0], vget_low_s8(lo), cr);
                s[1] = vmlal_s8(s[1], vget_high_s8(lo), cr);
                s[2] = vmlal_s8(s[2], vget_low_s8(hi), cr);
                s[3] = vmlal_s8(s[3], vget_high_s8(hi), cr);
            }
            float *yb = y + b * QK4_0;
            for (int h = 0; h < 4; h++) {
                const float32x4_t lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(s[h])));
                const float32x4_t hi = vcvtq_f32_s32(vmovl_s16(vget_high_s16(s[h])));
                vst1q_f32(yb + 8 * h, vfmaq_n_f32(vld1q_f32(yb + 8 * h), lo, scale));
                vst1q_f32(yb + 8 * h + 4, vfmaq_n_f32(vld1q_f32(yb + 8 * h + 4), hi, scale));
            }
        }
    }
}

const sparse_kernels sparse_neon_impl = {
    .name = "neon",
    .f32 = {dot_f32, dot2_f32, axpy_f32},
    .f16 = {dot_f16, dot2_f16, axpy_f16},
    .q8_0 = {dot_q8_0_neon, dot2_q8_0_neon, axpy_q8_0},
    .q4_0 = {dot_q4_0_neon, dot2_q4_0_neon, axpy_q4_0},
};

const sparse_kernels sparse_neon_sdot_impl = {
    .name = "neon (SDOT)",
    .f32 = {dot_f32, dot2_f32, axpy_f32},
    .f16 = {dot_f16, dot2_f16, axpy_f16},
    .q8_0 = {dot_q8_0_sdot, dot2_q8_0_sdot, axpy_q8_0},
    .q4_0 = {dot_q4_0_sdot, dot2_q4_0_sdot, axpy_q4_0},
};

/* Scalar reference of the sparse kernels: they define the semantics the SIMD
 * files must reproduce. Dots are the scalar dense dots of kernels.h, one row at
 * a time; axpy spells out the fixed per-element order (see sparse_kernels.h). */
#include <math.h>
#include <string.h>

#include "gguf/f16.h"
#include "kernels/kernels.h"
#include "kernels/sparse_kernels.h"
#include "kernels/sparse_rows.h"

static float block_scale(const void *block) {
    uint16_t h;
    memcpy(&h, block, sizeof h);
    return f16_to_f32(h);
}

/* ---- gather dots: the dense scalar dot on each visited row ---- */

typedef float (*row_dot_fn)(const void *row, const void *x, int n);

static float row_dot_f32(const void *row, const void *x, int n) { return kernels_scalar()->dot_f32(row, x, n); }
static float row_dot_f16(const void *row, const void *x, int n) { return kernels_scalar()->dot_f16(row, x, n); }
static float row_dot_q8_0(const void *row, const void *x, int n) { return kernels_scalar()->dot_q8_0(row, x, n); }
static float row_dot_q4_0(const void *row, const void *x, int n) { return kernels_scalar()->dot_q4_0(row, x, n); }

static void dot_seq(const row_seq *s, row_dot_fn dot, const void *x, int n) {
    for (int i = 0; i < row_seq_len(s); i++) *row_seq_out(s, i) = dot(row_seq_row(s, i), x, n);
}

#define SCALAR_GATHER_DOTS(T)                                                                                    \
    static void dot_##T(const void *w, size_t stride, const int32_t *idx, int count, const void *x, int n,       \
                        float *out, const sparse_then *then) {                                                   \
        const row_seq s = row_seq_one(w, stride, idx, count, out, then);                                         \
        dot_seq(&s, row_dot_##T, x, n);                                                                          \
    }                                                                                                            \
    static void dot2_##T(const void *w_a, const void *w_b, size_t stride, const int32_t *idx, int count,         \
                         const void *x, int n, float *out_a, float *out_b, const sparse_then *then) {            \
        const row_seq s = row_seq_two(w_a, w_b, stride, idx, count, out_a, out_b, then);                         \
        dot_seq(&s, row_dot_##T, x, n);                                                                          \
    }

SCALAR_GATHER_DOTS(f32)
SCALAR_GATHER_DOTS(f16)
SCALAR_GATHER_DOTS(q8_0)
SCALAR_GATHER_DOTS(q4_0)

/* ---- gather axpy: k ascending, one fma per element and term ---- */

static void axpy_f32(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y, int n,
                      const sparse_then *then) {
    (void)then; /* a prefetch hint */
    for (int k = 0; k < count; k++) {
        const float *row = (const float *)((const char *)w + (size_t)idx[k] * stride);
        for (int i = 0; i < n; i++) y[i] = fmaf(coef[k], row[i], y[i]);
    }
}

static void axpy_f16(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y, int n,
                      const sparse_then *then) {
    (void)then; /* a prefetch hint */
    for (int k = 0; k < count; k++) {
        const uint16_t *row = (const uint16_t *)((const char *)w + (size_t)idx[k] * stride);
        for (int i = 0; i < n; i++) y[i] = fmaf(coef[k], f16_to_f32(row[i]), y[i]);
    }
}

static void axpy_q8_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n, const sparse_then *then) {
    (void)then; /* a prefetch hint */
    for (int k = 0; k < count; k++) {
        const block_q8_0 *row = (const block_q8_0 *)((const char *)w + (size_t)idx[k] * stride);
        for (int b = 0; b < n / QK8_0; b++) {
            const float cd = coef[k] * block_scale(&row[b]);
            for (int j = 0; j < QK8_0; j++) y[b * QK8_0 + j] = fmaf(cd, (float)row[b].qs[j], y[b * QK8_0 + j]);
        }
    }
}

static void axpy_q4_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n, const sparse_then *then) {
    (void)then; /* a prefetch hint */
    for (int k0 = 0; k0 < count; k0 += AXPY_Q4_GROUP) {
        const int rows = count - k0 < AXPY_Q4_GROUP ? count - k0 : AXPY_Q4_GROUP;
        const block_q4_0 *row[AXPY_Q4_GROUP];
        for (int r = 0; r < rows; r++) row[r] = (const block_q4_0 *)((const char *)w + (size_t)idx[k0 + r] * stride);
        for (int b = 0; b < n / QK4_0; b++) {
            float cd[AXPY_Q4_GROUP];
            int8_t c[AXPY_Q4_GROUP];
            for (int r = 0; r < rows; r++) cd[r] = coef[k0 + r] * block_scale(&row[r][b]);
            const float scale = q4_axpy_quantize(cd, rows, c);
            float *yb = y + b * QK4_0;
            for (int j = 0; j < QK4_0 / 2; j++) {
                int32_t lo = 0, hi = 0;
                for (int r = 0; r < rows; r++) {
                    lo += c[r] * ((row[r][b].qs[j] & 0x0f) - 8);
                    hi += c[r] * ((row[r][b].qs[j] >> 4) - 8);
                }
                yb[j] = fmaf(scale, (float)lo, yb[j]);
                yb[j + QK4_0 / 2] = fmaf(scale, (float)hi, yb[j + QK4_0 / 2]);
            }
        }
    }
}

const sparse_kernels sparse_scalar_impl = {
    .name = "scalar",
    .f32 = {dot_f32, dot2_f32, axpy_f32},
    .f16 = {dot_f16, dot2_f16, axpy_f16},
    .q8_0 = {dot_q8_0, dot2_q8_0, axpy_q8_0},
    .q4_0 = {dot_q4_0, dot2_q4_0, axpy_q4_0},
};

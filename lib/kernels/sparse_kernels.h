/* Sparse-decode kernels: the FFN of one token computed only for a list of
 * neurons, with neuron-major weights (PowerInfer's ffn_down_t). For neuron i the
 * gate row, up row and down row (a column of ffn_down) are each n elements in
 * the model's quantization.
 *
 * Rows are addressed as base + idx[k] * row_stride, which covers every layout:
 *   separate matrices  gate/up/down_t: base = the matrix, row_stride = its row bytes;
 *   bundle file / cache slots: neuron i's gate, up and down side by side at
 *     bundle + i * bundle_stride + {0, row_bytes, 2 * row_bytes}: pass
 *     base = bundle + that sub-offset and row_stride = bundle_stride.
 * Indices may come in any order and must not repeat; every idx[k] must name a
 * row inside the caller's buffer (not checked: this is the hot path). Only the
 * row_bytes of each named row are read. F32 rows must be 4-byte aligned, all
 * others 2-byte aligned.
 *
 * The activation x is converted as for the dense kernels (kernels.h): float for
 * F32 weights, F16 (f32_to_f16_row) for F16, Q8_0 (quantize_q8_0) for Q4_0/Q8_0.
 *
 * Semantics:
 *   dot:   out[k] = the dense dot product (kernels.h dot_*) of row idx[k] with x,
 *          bit for bit, of the kernel set whose table this is (kernels.h: a
 *          set's `gather`; avx512-exact has none, its dots follow another
 *          order than the avx512 table's).
 *   dot2:  the fused gate+up form: out_a[k] and out_b[k] are dot's results for
 *          row idx[k] of w_a and of w_b (same row_stride), in one pass.
 *   axpy:  y[i] += sum_k coef[k] * row idx[k][i]. F32/F16/Q8_0: k ascending,
 *          each term one fused multiply-add in f32: F32/F16 y = fma(coef, w, y);
 *          Q8_0 per block cd = coef * d, then y = fma(cd, q, y). Q4_0 (VNNI's
 *          int8 dot products, as the dense Q4_0 dots quantize x to 8 bits): the
 *          rows go in groups of AXPY_Q4_GROUP (k ascending, the last one
 *          shorter); per group and block, cd_r = coef * d of each row r, m the
 *          largest |cd_r|, c_r = lrintf(cd_r * (127 / m)) (0 when m is 0), an
 *          exact integer sum_r c_r * (q_r - 8) per element, then
 *          y = fma(m * (1 / 127.f), sum, y).
 *          Bit-exact across ISAs, so results do not depend on the machine.
 * n is the row length in elements: any n >= 0 for F32/F16, a multiple of 32 for
 * Q8_0/Q4_0. count may be 0. Each kernel's `then` (NULL: none) names the rows
 * the caller's next call reads first, for prefetching (sparse_then).
 *
 * Errors: none: the kernels check nothing (above); sparse_kernels_for_type
 * returns NULL for a type without kernels. */
#ifndef PI2_SPARSE_KERNELS_H
#define PI2_SPARSE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "gguf/ggml_types.h"

#define AXPY_Q4_GROUP 16 /* rows whose Q4_0 axpy coefficients share a scale per block */

/* The rows a caller's next call starts with (up to AXPY_Q4_GROUP, the
 * largest axpy group): the end of this call prefetches them as it goes, as
 * it does its own next rows, so that calls one after another (one per
 * neuron chunk, each axpy into its own partial) stream like one call.
 * Without it each call's first rows start cold: on one core, 22 axpy calls
 * for a 7B layer's chunks ran at 13 GB/s against 18 for one call
 * (sparse-bench's "axpy by chunk"). A hint only: results do not depend on it. */
typedef struct {
    const char *rows[AXPY_Q4_GROUP];
    int count;
} sparse_then;

/* The rows a gather over neurons idx[0..n) of w reads first (row_stride
 * bytes apart, row 0 being neuron `first`), as a sparse_then. */
static inline void sparse_then_rows(sparse_then *then, const void *w, size_t row_stride, const int32_t *idx, int n,
                                    long first) {
    then->count = n < AXPY_Q4_GROUP ? n : AXPY_Q4_GROUP;
    for (int k = 0; k < then->count; k++) then->rows[k] = (const char *)w + (size_t)(idx[k] - first) * row_stride;
}

typedef void (*sparse_dot_fn)(const void *w, size_t row_stride, const int32_t *idx, int count, const void *x, int n,
                              float *out, const sparse_then *then);
typedef void (*sparse_dot2_fn)(const void *w_a, const void *w_b, size_t row_stride, const int32_t *idx, int count,
                               const void *x, int n, float *out_a, float *out_b, const sparse_then *then);
typedef void (*sparse_axpy_fn)(const void *w, size_t row_stride, const int32_t *idx, const float *coef, int count,
                               float *y, int n, const sparse_then *then);

typedef struct {
    sparse_dot_fn dot;
    sparse_dot2_fn dot2;
    sparse_axpy_fn axpy;
} sparse_type_kernels;

typedef struct sparse_kernels {
    const char *name; /* "scalar", "avx2", "avx512", "neon", "neon (SDOT)" */
    sparse_type_kernels f32, f16, q8_0, q4_0;
} sparse_kernels;

/* One table per ISA file (sparse_scalar.c, sparse_avx2.c, ...). Reach them
 * through a kernel set (kernels.h: k->sparse, k->gather), which is offered
 * only on a CPU that runs it. */
extern const sparse_kernels sparse_scalar_impl;
extern const sparse_kernels sparse_avx2_impl;
extern const sparse_kernels sparse_avx512_impl;
extern const sparse_kernels sparse_neon_impl;      /* the dots' block sums by widening multiplies */
extern const sparse_kernels sparse_neon_sdot_impl; /* by SDOT (FEAT_DotProd) */

/* the kernels for a ggml weight type (F32, F16, Q8_0, Q4_0); NULL for any other */
static inline const sparse_type_kernels *sparse_kernels_for_type(const sparse_kernels *k, uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return &k->f32;
    case GGML_TYPE_F16: return &k->f16;
    case GGML_TYPE_Q8_0: return &k->q8_0;
    case GGML_TYPE_Q4_0: return &k->q4_0;
    default: return NULL;
    }
}

#endif

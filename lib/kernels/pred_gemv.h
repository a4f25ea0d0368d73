/* The predictors' second stage: many short F16 (or Q8_0) rows (the predictor's rank,
 * ~100-1000 elements) against one F32 vector, y[r] = w[r] . x. The dense F16
 * dot reduces each row on its own, which dominates at these lengths; this
 * kernel streams several rows per pass over x.
 *
 * Summation order, the same bits on every ISA: element i goes to lane i % 16,
 * each lane a chain of fused multiply-adds in increasing i (missing elements of
 * the last group count as 0 * 0); the 16 lanes are then summed as
 * s8[j] = l[j] + l[j+8], s4[j] = s8[j] + s8[j+4], s2[j] = s4[j] + s4[j+2],
 * y = s2[0] + s2[1].
 *
 * A kernel set (kernels.h) names its versions, chosen with the dense kernels:
 * every F16 version gives the same bits, so only speed differs.
 *
 * Errors: none: the kernels trust the caller's shapes. */
#ifndef PI2_PRED_GEMV_H
#define PI2_PRED_GEMV_H

#include <stddef.h>
#include <stdint.h>

/* rows of n F16 values, row_stride bytes apart */
typedef void (*pred_gemv_f16_fn)(const void *w, size_t row_stride, int rows, const float *x, int n, float *y);

/* Q8_0 rows of n values (a multiple of 32) against x quantized to Q8_0:
 * y[r] = k->dot_q8_0(row r, x, n) of the set k that names it, bit for bit,
 * several rows per pass. */
typedef void (*pred_gemv_q8_0_fn)(const void *w, size_t row_stride, int rows, const void *x, int n, float *y);

void pred_gemv_f16_scalar(const void *w, size_t row_stride, int rows, const float *x, int n, float *y);
/* per ISA (pred_gemv_avx2.c, pred_gemv_avx512.c, pred_gemv_neon.c), reached
 * through a kernel set after its CPU check */
void pred_gemv_f16_avx2(const void *w, size_t row_stride, int rows, const float *x, int n, float *y);
void pred_gemv_f16_avx512(const void *w, size_t row_stride, int rows, const float *x, int n, float *y);
void pred_gemv_q8_0_avx512(const void *w, size_t row_stride, int rows, const void *x, int n, float *y);
void pred_gemv_f16_neon(const void *w, size_t row_stride, int rows, const float *x, int n, float *y);

#endif

/* AVX-512 predictor gemv (pred_gemv.h): 16 rows per pass, one 16-lane
 * accumulator per row, reduced together by a transposed tree that performs
 * each row's s8/s4/s2/y additions on the same operands and stores 16 results.
 *
 * Within a pass, the rows go through x one after the other (each row's FMA
 * chain is short enough for out-of-order execution to overlap the next rows',
 * and the weights are read in address order, which the hardware prefetcher
 * follows best), or, for rows of LONG_ROW_N elements and more, eight side by
 * side (eight FMA chains in flight; more rows would not keep their pointers
 * in registers nor, for power-of-two strides, their lines in one L1 set's
 * ways). Measured on Zen 4, side by side rows stream from memory about half
 * as fast as one after the other up to 2048 elements, and as fast at 4096,
 * where the single chain leaves the in-cache speed at ~60 %. */
#include "kernels/kernels_q_avx512.h"
#include "kernels/pred_gemv.h"

#define PASS_ROWS 16
/* Q8_0 rows prefetch into L2 the row one pass ahead as they are read. Intel
 * Xeon (AVX-512), from memory: stage 1 (128 x 4096) 6.2 -> 9.6 GB/s, stage 2
 * (512 x 128) 5.7 -> 8.8 GB/s, 90 % of one thread's read bandwidth (two or
 * four passes ahead: the same); in cache 0-8 % slower. Not measured on Zen. */
#define AHEAD_ROWS PASS_ROWS
#define LONG_GROUP 8
#define LONG_ROW_N 4096

/* The tree's input slot 4p+q takes row 4q+p: the tree leaves row 4q+p's sum
 * in lane 4q+p, i.e. the results come out in row order. */
static const int slot_row[PASS_ROWS] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

/* y of 16 rows' accumulators. Each step adds, within one row, the pairs
 * pred_gemv.h names (s8: 256-bit halves, s4: 128-bit quarters of s8, s2 and
 * y: pairs of lanes); the shuffles only bring two rows' operands together. */
static inline __m512 reduce_16_rows(const __m512 acc[PASS_ROWS]) {
    __m512 s8[8], s4[4], s2[2];
    for (int m = 0; m < 8; m++) { /* 128-bit blocks: s8 of slot 2m (lanes 0-3, 4-7), then of slot 2m+1 */
        const __m512 a = acc[slot_row[2 * m]], b = acc[slot_row[2 * m + 1]];
        s8[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    }
    for (int m = 0; m < 4; m++) /* block q: s4 of slot 4m+q */
        s4[m] = _mm512_add_ps(_mm512_shuffle_f32x4(s8[2 * m], s8[2 * m + 1], 0x88),
                              _mm512_shuffle_f32x4(s8[2 * m], s8[2 * m + 1], 0xdd));
    for (int m = 0; m < 2; m++) /* block q: s2 of slot q + 8m (lanes 0-1), of slot q + 8m + 4 (lanes 2-3) */
        s2[m] = _mm512_add_ps(_mm512_shuffle_ps(s4[2 * m], s4[2 * m + 1], 0x44),
                              _mm512_shuffle_ps(s4[2 * m], s4[2 * m + 1], 0xee));
    /* lane 4q+p: y of slot 4p+q */
    return _mm512_add_ps(_mm512_shuffle_ps(s2[0], s2[1], 0x88), _mm512_shuffle_ps(s2[0], s2[1], 0xdd));
}

static inline __m512 fma_w16(const uint16_t *row, __m512 xv, __m512 acc) {
    return _mm512_fmadd_ps(load_f16x16(row), xv, acc);
}

/* acc[k] += row[k] . x lane-wise for `group` (a constant) rows side by side.
 * Each row's 64-byte line is consumed in one iteration, so that it needs to
 * stay in L1 only briefly. */
static inline __attribute__((always_inline)) void accumulate(const uint16_t *const *row, int group, const float *x,
                                                             int n, __m512 *acc) {
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
        for (int k = 0; k < group; k++) acc[k] = fma_w16(row[k] + i + 16, x1, fma_w16(row[k] + i, x0, acc[k]));
    }
    if (i + 16 <= n) {
        const __m512 xv = _mm512_loadu_ps(x + i);
        for (int k = 0; k < group; k++) acc[k] = fma_w16(row[k] + i, xv, acc[k]);
        i += 16;
    }
    if (i < n) { /* the missing elements load as zeros: 0 * 0 leaves each lane's sum as it is */
        const __mmask16 m = tail_mask16(n - i);
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
        for (int k = 0; k < group; k++)
            acc[k] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row[k] + i)), xv, acc[k]);
    }
}

/* y[0..live) for the rows at w, in groups of `group` (a constant dividing
 * `rows`, the pass's constant width); the slots past `live` repeat the last
 * live row (read again from L1, never stored). */
static inline __attribute__((always_inline)) void pass(const char *w, size_t row_stride, int rows, int group, int live,
                                                       const float *x, int n, float *y) {
    const uint16_t *row[PASS_ROWS];
    __m512 acc[PASS_ROWS];
    for (int k = 0; k < PASS_ROWS; k++) {
        row[k] = (const uint16_t *)(w + (size_t)(k < live ? k : live - 1) * row_stride);
        acc[k] = _mm512_setzero_ps();
    }
    for (int k = 0; k < rows; k += group) accumulate(row + k, group, x, n, acc + k);
    _mm512_mask_storeu_ps(y, tail_mask16(live), reduce_16_rows(acc));
}

/* all rows in passes of 16, the last few in the narrowest pass that holds them */
static inline __attribute__((always_inline)) void all_rows(const char *w, size_t row_stride, int rows, int group,
                                                           const float *x, int n, float *y) {
    int r = 0;
    for (; r + PASS_ROWS <= rows; r += PASS_ROWS)
        pass(w + (size_t)r * row_stride, row_stride, PASS_ROWS, group, PASS_ROWS, x, n, y + r);
    const int left = rows - r;
    if (left > 8)
        pass(w + (size_t)r * row_stride, row_stride, PASS_ROWS, group, left, x, n, y + r);
    else if (left > 4)
        pass(w + (size_t)r * row_stride, row_stride, 8, group, left, x, n, y + r);
    else if (left > 0)
        pass(w + (size_t)r * row_stride, row_stride, 4, group < 4 ? group : 4, left, x, n, y + r);
}

void pred_gemv_f16_avx512(const void *w, size_t row_stride, int rows, const float *x, int n, float *y) {
    if (n >= LONG_ROW_N)
        all_rows(w, row_stride, rows, LONG_GROUP, x, n, y);
    else
        all_rows(w, row_stride, rows, 1, x, n, y);
}

/* Q8_0 rows (pred_gemv.h): each row's lanes as the dense avx512 dot_q8_0
 * (q8_row) leaves them, then 16 rows' horizontal sums in one tree, which adds
 * the pairs _mm512_reduce_add_ps adds: the dense dot's bits. */
void pred_gemv_q8_0_avx512(const void *w, size_t row_stride, int rows, const void *x, int n, float *y) {
    const int nb = n / QK8_0;
    for (int r0 = 0; r0 < rows; r0 += PASS_ROWS) {
        const int live = rows - r0 < PASS_ROWS ? rows - r0 : PASS_ROWS;
        __m512 acc[PASS_ROWS];
        for (int k = 0; k < PASS_ROWS; k++) /* slots past live: zeros (a row's sum adds its own lanes only) */
            acc[k] = k < live ? q8_row_lanes((const block_q8_0 *)((const char *)w + (size_t)(r0 + k) * row_stride), x,
                                             nb, kernels_row_or_null(w, row_stride, rows, r0 + k + AHEAD_ROWS))
                              : _mm512_setzero_ps();
        _mm512_mask_storeu_ps(y + r0, tail_mask16(live), reduce_16_rows(acc));
    }
}

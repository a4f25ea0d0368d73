/* Private to the sparse_*.c kernel files, kernels_q_avx512.h and kernels_neon.h: the
 * sequence of rows a gather dot visits, and the groups of rows the SIMD
 * axpys apply together. A plain gather visits row idx[k] of one matrix; the
 * fused gate+up form alternates between two matrices (w_a row idx[0], w_b
 * row idx[0], w_a row idx[1], ...), so one kernel serves both and streams
 * them together; without idx the rows are consecutive (a dense gemv). And
 * the Q4_0 axpy's int8 coefficients as the reference computes them
 * (sparse_scalar.c and sparse_neon.c share them).
 *
 * Errors: none: index arithmetic; the callers check lengths. */
#ifndef PI2_SPARSE_ROWS_H
#define PI2_SPARSE_ROWS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/sparse_kernels.h"

typedef struct {
    const char *w[2];   /* the matrices (w[1] only when nmat == 2) */
    float *out[2];      /* their outputs, indexed by k */
    int nmat;           /* 1 or 2 */
    size_t stride;
    const int32_t *idx; /* NULL: rows 0, 1, ... */
    int count;          /* entries of idx (rows of each matrix) */
    const sparse_then *then; /* the rows after the last, to prefetch (NULL: none) */
} row_seq;

static inline row_seq row_seq_one(const void *w, size_t stride, const int32_t *idx, int count, float *out,
                                  const sparse_then *then) {
    return (row_seq){{(const char *)w, NULL}, {out, NULL}, 1, stride, idx, count, then};
}

static inline row_seq row_seq_two(const void *w_a, const void *w_b, size_t stride, const int32_t *idx, int count,
                                  float *out_a, float *out_b, const sparse_then *then) {
    return (row_seq){{(const char *)w_a, (const char *)w_b}, {out_a, out_b}, 2, stride, idx, count, then};
}

/* rows 0 .. count-1 of w */
static inline row_seq row_seq_dense(const void *w, size_t stride, int count, float *out) {
    return (row_seq){{(const char *)w, NULL}, {out, NULL}, 1, stride, NULL, count, NULL};
}

static inline int row_seq_len(const row_seq *s) { return s->count * s->nmat; }

static inline const char *row_seq_row(const row_seq *s, int i) {
    const int k = i / s->nmat;
    return s->w[i % s->nmat] + (size_t)(s->idx ? s->idx[k] : k) * s->stride;
}

static inline float *row_seq_out(const row_seq *s, int i) { return &s->out[i % s->nmat][i / s->nmat]; }

/* The row `ahead` rows after row i, to prefetch: past the last, the
 * caller's next rows (s->then); NULL when there is none. */
static inline const char *row_seq_ahead(const row_seq *s, int i, int ahead) {
    const int len = row_seq_len(s), j = i + ahead;
    if (j < len) return row_seq_row(s, j);
    return s->then && j - len < s->then->count ? s->then->rows[j - len] : NULL;
}

/* ---- axpy: a group of rows per pass over y, y held in registers across
 * them (AXPY_ROWS for the float and Q8_0 axpys; AXPY_Q4_GROUP, whose rows
 * share their int8 coefficients' scale per block, for Q4_0); each group
 * prefetches the next group's rows into L2 (T1) as it goes (the gather is
 * scattered, which the hardware prefetcher cannot guess); the last group
 * the caller's next call's first rows (sparse_then) ---- */

#define AXPY_ROWS 8 /* 4 and 16 measured slower (AVX-512) */
#define AXPY_GROUP_MAX AXPY_Q4_GROUP

typedef struct {
    const char *rows[AXPY_GROUP_MAX], *next[AXPY_GROUP_MAX]; /* next: the next group's rows (NULL: none) */
    float coef[AXPY_GROUP_MAX];
    int m, next_m; /* rows in this group, in the next */
} axpy_group;

/* the group of rows k0.. of idx, groups of `size` rows (at most
 * AXPY_GROUP_MAX); slots past m repeat row idx[k0] with coefficient 0, so
 * that a SIMD pass may run them as padding */
static inline void axpy_group_at(axpy_group *g, int size, const char *w, size_t stride, const int32_t *idx,
                                 const float *coef, int count, int k0, const sparse_then *then) {
    const int k1 = k0 + size;
    const bool last = count <= k1;
    g->m = count - k0 < size ? count - k0 : size;
    if (!last) g->next_m = count - k1 < size ? count - k1 : size;
    else g->next_m = !then ? 0 : then->count < size ? then->count : size; /* the caller's next call */
    for (int r = 0; r < size; r++) {
        g->rows[r] = w + (size_t)idx[k0 + (r < g->m ? r : 0)] * stride;
        g->coef[r] = r < g->m ? coef[k0 + r] : 0.0f;
        g->next[r] = r >= g->next_m ? NULL : last ? then->rows[r] : w + (size_t)idx[k1 + r] * stride;
    }
}

/* Called as the bytes [off, off+step) of the m rows of a group are consumed:
 * prefetch each line this step enters, in the next group's rows. Always
 * inlined: GCC 12 judges a small function whose only effect is a prefetch
 * "const" and deletes its calls. */
static inline __attribute__((always_inline)) void axpy_prefetch_next(const char *const *next, int m, size_t off,
                                                                     size_t step) {
    const size_t last = off + step - 1;
    if (off > 0 && (last >> 6) == ((off - 1) >> 6)) return;
    for (int r = 0; r < m; r++)
        if (next[r]) __builtin_prefetch(next[r] + last, 0, 2); /* read, T1 on x86 */
}

/* the same for one row, next (NULL: none) */
static inline __attribute__((always_inline)) void prefetch_next_row(const char *next, size_t off, size_t step) {
    axpy_prefetch_next(&next, 1, off, step);
}

/* The int8 coefficients of one (group, block) of a Q4_0 axpy (sparse_kernels.h),
 * from the rows' cd = coef * d: c[r] = lrintf(cd[r] * (127 / m)), m the
 * largest |cd[r]| (0 when m is 0); returns the scale m / 127. */
static inline float q4_axpy_quantize(const float *cd, int rows, int8_t *c) {
    float m = 0.0f;
    for (int r = 0; r < rows; r++) m = fmaxf(m, fabsf(cd[r]));
    const float inv = m > 0.0f ? 127.0f / m : 0.0f;
    for (int r = 0; r < rows; r++) c[r] = (int8_t)lrintf(cd[r] * inv);
    return m * (1.0f / 127.0f);
}

#endif

/* Private to the sparse_*.c kernel files: the sequence of rows a gather dot
 * visits. A plain gather visits row idx[k] of one matrix; the fused gate+up
 * form alternates between two matrices (w_a row idx[0], w_b row idx[0],
 * w_a row idx[1], ...), so one kernel serves both and streams them together. */
#ifndef PI2_SPARSE_ROWS_H
#define PI2_SPARSE_ROWS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *w[2];   /* the matrices (w[1] only when nmat == 2) */
    float *out[2];      /* their outputs, indexed by k */
    int nmat;           /* 1 or 2 */
    size_t stride;
    const int32_t *idx;
    int count;          /* entries of idx */
} row_seq;

static inline row_seq row_seq_one(const void *w, size_t stride, const int32_t *idx, int count, float *out) {
    return (row_seq){{(const char *)w, NULL}, {out, NULL}, 1, stride, idx, count};
}

static inline row_seq row_seq_two(const void *w_a, const void *w_b, size_t stride, const int32_t *idx, int count,
                                  float *out_a, float *out_b) {
    return (row_seq){{(const char *)w_a, (const char *)w_b}, {out_a, out_b}, 2, stride, idx, count};
}

static inline int row_seq_len(const row_seq *s) { return s->count * s->nmat; }

static inline const char *row_seq_row(const row_seq *s, int i) {
    return s->w[i % s->nmat] + (size_t)s->idx[i / s->nmat] * s->stride;
}

static inline float *row_seq_out(const row_seq *s, int i) { return &s->out[i % s->nmat][i / s->nmat]; }

#endif

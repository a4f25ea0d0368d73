/* The default avx512 table's quantized dots (the row arithmetic is in
 * kernels_q_avx512.h, shared with the sparse gathers): two blocks per 512-bit
 * register (or four, for Q4_0), vpdpbusd on unsigned x signed bytes with a
 * correction term for the offset that makes the weights unsigned, several
 * independent accumulators. dot_q4_0 and gemv_q4_0 share one order, so a row
 * gives the same bits through either. */
#include "kernels_q_avx512.h"

#define GEMV_ROW_GROUP 16       /* rows that share one prepared chunk before the next */
#define GEMV_PREFETCH_BYTES 4096 /* software prefetch distance in the weight stream */

float dot_q8_0_fast_avx512(const block_q8_0 *w, const block_q8_0 *x, int n) {
    return q8_row(w, x, n / QK8_0, NULL);
}

/* The single-row Q4_0 dot prepares each activation quad as it goes, so it
 * has its own loop, in q4_row_chunk's order. Its prefetch differs too: one
 * line a quad 4 KiB ahead into L1 measured ~17 GB/s from memory on one core
 * (tools/kernel-bench), where q4_row_chunk's into L2 gave ~16 and the same
 * one line a quad into L2 ~10. */
static float q4_row_direct(const block_q4_0 *w, const block_q8_0 *x, int cb) {
    const int nquads = cb / 4;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    int k = 0;
    for (; k + 2 <= nquads; k += 2) {
        const q4_xquad q0 = q4_prepare_xquad(x + 4 * k), q1 = q4_prepare_xquad(x + 4 * k + 4);
        _mm_prefetch((const char *)(w + 4 * k) + GEMV_PREFETCH_BYTES, _MM_HINT_T0);
        acc0 = q4_quad(acc0, w + 4 * k, q0);
        _mm_prefetch((const char *)(w + 4 * k + 4) + GEMV_PREFETCH_BYTES, _MM_HINT_T0);
        acc1 = q4_quad(acc1, w + 4 * k + 4, q1);
    }
    if (k < nquads) acc0 = q4_quad(acc0, w + 4 * k, q4_prepare_xquad(x + 4 * k));
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (int b = 4 * nquads; b < cb; b++) sum += q4_block(&w[b], &x[b]);
    return sum;
}

float dot_q4_0_fast_avx512(const block_q4_0 *w, const block_q8_0 *x, int n) {
    const int nb = n / QK4_0;
    float total = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += Q4_CHUNK_BLOCKS) {
        const float sum = q4_row_direct(w + b0, x + b0, q4_chunk_blocks(nb, b0));
        total = b0 == 0 ? sum : total + sum;
    }
    return total;
}

/* Prefetching into L2 here, as the gathers do: with both cores decoding, a
 * 7B Q4_0 model streamed 22-27 GB/s (bench/ref-decode, mostly 25-26) where
 * one line a quad into L1, as the single dot, gave 15-25 (mostly 20-22), the
 * same lines as now into L1 21-22, no software prefetch 19-20, and 8 KiB
 * ahead instead of 4 no more. */
void gemv_q4_0_fast_avx512(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n) {
    const int nb = n / QK4_0;
    q4_xquad quads[Q4_CHUNK_BLOCKS / 4];
    for (int r0 = 0; r0 < nrows; r0 += GEMV_ROW_GROUP) {
        const int r1 = r0 + GEMV_ROW_GROUP < nrows ? r0 + GEMV_ROW_GROUP : nrows;
        for (int b0 = 0; b0 < nb; b0 += Q4_CHUNK_BLOCKS) {
            const int cb = q4_chunk_blocks(nb, b0);
            q4_prepare_chunk(quads, x + b0, cb / 4);
            for (int r = r0; r < r1; r++) {
                const block_q4_0 *row = (const block_q4_0 *)((const char *)w + (size_t)r * row_stride) + b0;
                const float sum = q4_row_chunk(row, quads, x + b0, cb, (const char *)row + GEMV_PREFETCH_BYTES);
                y[r] = b0 == 0 ? sum : y[r] + sum;
            }
        }
    }
}

/* The default avx512 table's quantized dots (the row arithmetic is in
 * kernels_q_avx512.h, shared with the sparse gathers): two blocks per 512-bit
 * register (or four, for Q4_0), vpdpbusd on unsigned x signed bytes with a
 * correction term for the offset that makes the weights unsigned, several
 * independent accumulators. dot_q4_0 and gemv_q4_0 share one order, so a row
 * gives the same bits through either. */
#include "kernels/kernels_q_avx512.h"

#define GEMV_ROW_GROUP 64       /* rows of more than one chunk that share a prepared chunk before the next */
#define GEMV_PREFETCH_BYTES 4096 /* software prefetch distance in the weight stream */

float dot_q8_0_fast_avx512(const block_q8_0 *w, const block_q8_0 *x, int n) {
    return q8_row(w, x, n / QK8_0, NULL);
}

/* Row after row, each prefetching into L2 the row two ahead as it reads: on
 * an Intel Xeon, from memory, one dot call a row streamed 5.6 GB/s, about
 * 57 % of one thread's read bandwidth, this 9.5-9.7 (95 % or more). The same
 * bits as the dot. Not measured on Zen, where the dense Q4_0 dot had measured
 * slower with software prefetch. */
void gemv_q8_0_fast_avx512(const block_q8_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n) {
    for (int r = 0; r < nrows; r++)
        y[r] = q8_row((const block_q8_0 *)((const char *)w + (size_t)r * row_stride), x, n / QK8_0,
                      kernels_row_or_null(w, row_stride, nrows, r + 2));
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

/* The gathers' row loop (dot_rows_q4_0) over consecutive rows:
 * GEMV_PASS_ROWS rows a pass, each activation quad loaded once for all of
 * them, each row prefetching the row a pass further down; the activation's
 * quads are prepared once per GEMV_ROW_GROUP rows and chunk (once for the
 * whole matrix when the rows are one chunk long). Against one row at a time
 * with a prefetch 4 KiB ahead, eight rows a pass, in three interleaved runs
 * of tools/kernel-bench -k avx512 on one core (Zen): 25.7-25.9 -> 32.9-33.2
 * GB/s in cache, 18.3-19.4 -> 23.4-28.6 from memory. On the Intel Xeon (2 MiB
 * pages, one thread reading 18.3 GB/s), four rows a pass against eight, three
 * interleaved runs: 14.9-15.8 against 13.4-14.1 GB/s from memory, the same
 * 33-34 in cache: eight rows and their eight prefetched ones are more lines
 * in flight than its L1 keeps apart.
 *
 * How the next pass is prefetched is the CPU's (kernels.c picks): on that
 * Intel Xeon and on AMD Zen 4 each row its own next row, into L2 (Zen 4, one
 * thread from memory, in turns: 82 % of the read against 65 % as one stream
 * into L1; both threads 29 against 19 GB/s); on AMD Zen 5 into L1,
 * and the next pass's rows as one stream (dot_rows_q4_0's `stream`). There,
 * 7B rows of 4096 on 2 MiB pages, five interleaved passes over 1 GiB, each
 * row's next row into L1 instead of L2 streamed 25 -> 29 GB/s on one thread
 * and 40-46 -> 48-51 on both at once (the stack's two cpu-workers: each a
 * half of each 2048-row group); as one stream 31 and 52. Two passes ahead,
 * eight, six, three or two rows a pass, NTA, or no software prefetch were
 * no faster (35-50 on both). */
#define GEMV_PASS_ROWS 4

static inline __attribute__((always_inline)) void gemv_q4_0_rows(const block_q4_0 *w, size_t row_stride,
                                                                  const block_q8_0 *x, float *y, int nrows, int n,
                                                                  prefetch_level level, bool stream) {
    const int group = n / QK4_0 <= Q4_CHUNK_BLOCKS ? nrows : GEMV_ROW_GROUP;
    for (int g0 = 0; g0 < nrows; g0 += group) {
        const row_seq s = row_seq_dense((const char *)w + (size_t)g0 * row_stride, row_stride,
                                        nrows - g0 < group ? nrows - g0 : group, y + g0);
        dot_rows_q4_0(&s, x, n, GEMV_PASS_ROWS, level, stream);
    }
}

void gemv_q4_0_fast_avx512(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n) {
    gemv_q4_0_rows(w, row_stride, x, y, nrows, n, PREFETCH_TO_L2, false);
}

void gemv_q4_0_fast_stream_avx512(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows,
                                  int n) {
    gemv_q4_0_rows(w, row_stride, x, y, nrows, n, PREFETCH_TO_L1, true);
}

/* AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c; only reached
 * through kernels_avx2() after a CPU check). Quantization and f16/axpy results
 * are bit-exact with the scalar reference; dot products differ only in float
 * summation order. */
#include "gguf/f16.h"
#include "kernels/dot_f16_rows_tile.h"
#include "kernels/kernels_avx2.h"

/* the rows are kernels_avx2.h's, which the sparse gathers share */
static float dot_f32_avx2(const float *w, const float *x, int n) { return f32_row(w, x, n, NULL); }
static float dot_f16_avx2(const uint16_t *w, const uint16_t *x, int n) { return f16_row(w, x, n, NULL); }
/* one row after the other: f16_row's leftovers (n % 8) are too few to be
 * worth interleaving, and attention's n is a multiple of 32 */
static void dot_f16_rows_avx2(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, int n, float *out) {
    for (int r = 0; r < rows; r++) out[r] = f16_row(w + (size_t)r * row_stride, x, n, NULL);
}
/* dot_f16_rows_tile: each row's 32-element steps widened once and multiplied
 * into the four accumulators of each of two vectors (widened once a call into
 * scratch, [2][n]), float_row's order for each pair (the row is its w; a
 * product's operands swap without changing its bits): 8 accumulators and a
 * step's 4 row vectors of the 16 registers. Each row prefetches into L2 the
 * row ROWS_TILE_AHEAD further. Lengths that are not a multiple of 32 (float_row's
 * 8-element steps and float tail), and a last odd vector, go through f16_row. */
enum { ROWS_TILE_VECTORS = 2, ROWS_TILE_AHEAD = 4 };

static void dot_f16_rows_tile_avx2(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, size_t x_stride,
                                   int nx, int n, float *out, size_t out_stride, float *scratch) {
    const int tiled = n % 32 || n == 0 ? 0 : nx / ROWS_TILE_VECTORS * ROWS_TILE_VECTORS;
    for (int j0 = 0; j0 < tiled; j0 += ROWS_TILE_VECTORS) {
        for (int j = 0; j < ROWS_TILE_VECTORS; j++)
            for (int i = 0; i < n; i += 8)
                _mm256_storeu_ps(scratch + (size_t)j * n + i, load_f16x8(x + (size_t)(j0 + j) * x_stride + i));
        for (int r = 0; r < rows; r++) {
            const uint16_t *wr = w + (size_t)r * row_stride;
            const char *ahead = r + ROWS_TILE_AHEAD < rows ? (const char *)(wr + ROWS_TILE_AHEAD * row_stride) : NULL;
            __m256 acc[ROWS_TILE_VECTORS][4];
#pragma GCC unroll 8
            for (int j = 0; j < ROWS_TILE_VECTORS * 4; j++) acc[j / 4][j % 4] = _mm256_setzero_ps();
            for (int i = 0; i < n; i += 32) {
                prefetch_l2(ahead, (size_t)i * 2);
                __m256 wv[4];
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) wv[c] = load_f16x8(wr + i + 8 * c);
#pragma GCC unroll 8
                for (int j = 0; j < ROWS_TILE_VECTORS * 4; j++)
                    acc[j / 4][j % 4] = _mm256_fmadd_ps(
                        wv[j % 4], _mm256_loadu_ps(scratch + (size_t)(j / 4) * n + i + 8 * (j % 4)), acc[j / 4][j % 4]);
            }
#pragma GCC unroll 2
            for (int j = 0; j < ROWS_TILE_VECTORS; j++)
                out[(size_t)(j0 + j) * out_stride + (size_t)r] =
                    hsum256(_mm256_add_ps(_mm256_add_ps(acc[j][0], acc[j][1]), _mm256_add_ps(acc[j][2], acc[j][3])));
        }
    }
    dot_f16_rows_tile_by_vector(dot_f16_rows_avx2, w, row_stride, rows, x + (size_t)tiled * x_stride, x_stride,
                                nx - tiled, n, out + (size_t)tiled * out_stride, out_stride);
}
static float dot_q8_0_avx2(const block_q8_0 *w, const block_q8_0 *x, int n) { return q8_0_row(w, x, n, NULL); }
static float dot_q4_0_avx2(const block_q4_0 *w, const block_q8_0 *x, int n) { return q4_0_row(w, x, n, NULL); }

/* The gemvs prefetch into L2 the rows two ahead as they read. With the
 * hardware prefetcher alone, on an Intel Xeon (AVX-512 machine, this set
 * forced), from memory on 4 KiB pages: Q4_0 2.2 GB/s, 24 % of one thread's
 * read bandwidth, Q8_0 6.1; with it 7.9 (1, 3, 4 or 8 rows ahead: the same
 * within 3 %) and 9.4. A prefetch changes no sum: the same bits as the dots. */
#define GEMV_AHEAD 2

/* Q4_ROWS rows a pass (kernels_avx2.h: q4_rows). The next pass's rows are
 * asked for as one stream: each step reads 144 bytes (a pair of blocks of
 * four rows) and prefetches the next 144 bytes of the following four rows,
 * which lie right after these (with a padded row_stride, the start of them
 * only: a hint, never a result), row r the 36 at r * 36. On the Intel Xeon,
 * 2 MiB pages, one thread reading 18.3 GB/s, from memory: a row's own line
 * ahead 13.4-14.2 GB/s, the stream 14.6-15.3; in cache 22 either way (blocks
 * one at a time, four rows a pass: 13.6 in cache, 11.0 from memory). The
 * activation's pairs come from a table filled once a call (kernels_avx2.h:
 * q4_xpairs_fill) unless there are fewer than Q4_ROWS rows or the row is too
 * long for it. */
ROW_INLINE void gemv_q4_0_passes(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x,
                                 const q4_xpair *xpairs, float *y, int nrows, int n) {
    const size_t pair_bytes = 2 * sizeof(block_q4_0);
    int r = 0;
    for (; r + Q4_ROWS <= nrows; r += Q4_ROWS) {
        const char *rows = (const char *)w + (size_t)r * row_stride;
        /* the last pass asks for its own rows, already on their way */
        const char *next = r + 2 * Q4_ROWS <= nrows ? rows + (size_t)Q4_ROWS * row_stride : rows;
        const char *pass[Q4_ROWS], *ahead[Q4_ROWS];
        for (int k = 0; k < Q4_ROWS; k++) {
            pass[k] = rows + (size_t)k * row_stride;
            ahead[k] = next + (size_t)k * pair_bytes;
        }
        q4_rows(pass, ahead, Q4_ROWS * pair_bytes, x, xpairs, n / QK4_0, y + r);
    }
    for (; r < nrows; r++)
        y[r] = q4_0_row((const block_q4_0 *)((const char *)w + (size_t)r * row_stride), x, n,
                        kernels_row_or_null(w, row_stride, nrows, r + GEMV_AHEAD));
}

static void gemv_q4_0_avx2(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n) {
    q4_xpair xpairs[Q4_XPAIRS_MAX];
    if (q4_xpairs_fill(xpairs, x, n / QK4_0, nrows))
        gemv_q4_0_passes(w, row_stride, x, xpairs, y, nrows, n);
    else
        gemv_q4_0_passes(w, row_stride, x, NULL, y, nrows, n);
}

/* Q8_ROWS rows a pass, each with q8_0_row's arithmetic (its q8_block_step, two
 * accumulators over alternate blocks, an odd last block into the first), the
 * activation's blocks loaded once for all of them, and the next pass's rows
 * asked for as one stream as in the Q4_0 gemv: each step reads a pair of
 * blocks (68 bytes) of each row and row r prefetches the 68 at r * 68 of the
 * stream's step. On a Zen 4, one thread from memory: one row at a time, each
 * prefetching the row two ahead, 37 % of the read; this 61-66 %, each row's
 * own successor prefetched instead of the stream 63-66 %. */
#define Q8_ROWS 4

static void q8_rows(const char *const *w, const char *ahead, const block_q8_0 *x, int nb, float *out) {
    const size_t pair_bytes = 2 * sizeof(block_q8_0);
    __m256 acc0[Q8_ROWS], acc1[Q8_ROWS];
    for (int r = 0; r < Q8_ROWS; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        const __m256i x0 = load_q8_0(&x[b]), x1 = load_q8_0(&x[b + 1]);
        const float xd0 = load_f16(&x[b].d), xd1 = load_f16(&x[b + 1].d);
        const char *step_ahead = ahead + (size_t)b / 2 * Q8_ROWS * pair_bytes;
#pragma GCC unroll 4 /* the accumulators stay in registers only if every row is its own code */
        for (int r = 0; r < Q8_ROWS; r++) {
            _mm_prefetch(step_ahead + (size_t)r * pair_bytes, _MM_HINT_T1);
            const block_q8_0 *wr = (const block_q8_0 *)w[r];
            acc0[r] = q8_block_step(acc0[r], &wr[b], x0, xd0);
            acc1[r] = q8_block_step(acc1[r], &wr[b + 1], x1, xd1);
        }
    }
    if (b < nb) {
        const __m256i x0 = load_q8_0(&x[b]);
        const float xd0 = load_f16(&x[b].d);
#pragma GCC unroll 4
        for (int r = 0; r < Q8_ROWS; r++) acc0[r] = q8_block_step(acc0[r], (const block_q8_0 *)w[r] + b, x0, xd0);
    }
    for (int r = 0; r < Q8_ROWS; r++) out[r] = hsum256(_mm256_add_ps(acc0[r], acc1[r]));
}

static void gemv_q8_0_avx2(const block_q8_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n) {
    int r = 0;
    for (; r + Q8_ROWS <= nrows; r += Q8_ROWS) {
        const char *rows = (const char *)w + (size_t)r * row_stride;
        /* the last pass asks for its own rows, already on their way */
        const char *next = r + 2 * Q8_ROWS <= nrows ? rows + (size_t)Q8_ROWS * row_stride : rows;
        const char *pass[Q8_ROWS];
        for (int k = 0; k < Q8_ROWS; k++) pass[k] = rows + (size_t)k * row_stride;
        q8_rows(pass, next, x, n / QK8_0, y + r);
    }
    for (; r < nrows; r++)
        y[r] = q8_0_row((const block_q8_0 *)((const char *)w + (size_t)r * row_stride), x, n,
                        kernels_row_or_null(w, row_stride, nrows, r + GEMV_AHEAD));
}

static void quantize_q8_0_avx2(const float *x, block_q8_0 *y, int n) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int b = 0; b < n / QK8_0; b++) {
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + b * QK8_0 + 8 * k);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                                 _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f; /* as ggml's quantize_row_q8_0 */
        const uint16_t dh = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(&y[b].d, &dh, sizeof dh);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], _mm256_set1_ps(id)),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        /* packs interleave 128-bit lanes; the permute restores element order */
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[b].qs, ordered);
    }
}

static void f32_to_f16_row_avx2(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = f32_to_f16(x[i]);
}

/* multiply then add (no FMA) so the result is bit-exact with the reference */
static void axpy_f32_avx2(float *y, float a, const float *w, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(va, _mm256_loadu_ps(w + i))));
    for (; i < n; i++) y[i] += a * w[i];
}

const kernels kernels_avx2_impl = {
    .name = "avx2",
    .dot_f32 = dot_f32_avx2,
    .dot_f16 = dot_f16_avx2,
    .dot_f16_rows = dot_f16_rows_avx2,
    .dot_f16_rows_tile = dot_f16_rows_tile_avx2,
    .dot_q8_0 = dot_q8_0_avx2,
    .dot_q4_0 = dot_q4_0_avx2,
    .quantize_q8_0 = quantize_q8_0_avx2,
    .f32_to_f16_row = f32_to_f16_row_avx2,
    .axpy_f32 = axpy_f32_avx2,
    .gemv_q4_0 = gemv_q4_0_avx2,
    .gemv_q8_0 = gemv_q8_0_avx2,
    .gemm_q4_0 = gemm_q4_0_avx2,
    .gemm_f32 = gemm_f32_avx2,
    .gemm_f16 = gemm_f16_avx2,
    .softmax_exp = softmax_exp_ref,
    .silu_mul = silu_mul_ref,
    .sparse = &sparse_avx2_impl,
    .gather = &sparse_avx2_impl,
    .pred_gemv_f16 = pred_gemv_f16_avx2,
    .lanesum64 = lanesum64_avx2,
};

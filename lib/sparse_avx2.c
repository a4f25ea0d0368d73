/* AVX2 + FMA + F16C sparse kernels; reached only through sparse_kernels_avx2()
 * after the CPU check. Dots are kernels_avx2.c's rows (kernels_avx2.h), one
 * row at a time (AVX2 has no cheaper multi-row form: the per-block work is
 * weight-side); axpy follows the scalar definition exactly.
 *
 * The weights are a gather of scattered rows, which the hardware prefetcher
 * cannot guess, so each kernel prefetches into L2, at the offset it is
 * reading, the rows it reads next: a dot the next row, an axpy the next
 * group's rows. */
#include "kernels_avx2.h"
#include "sparse_kernels.h"
#include "sparse_rows.h"

/* ---- dots: the dense set's rows (kernels_avx2.h), prefetching the next row ---- */

#define GATHER_DOTS(T, RT, XT)                                                                                       \
    static void dot_seq_##T(const row_seq *s, const XT *x, int n) {                                                  \
        const int len = row_seq_len(s);                                                                              \
        for (int i = 0; i < len; i++) {                                                                              \
            const char *next = i + 1 < len ? row_seq_row(s, i + 1) : NULL;                                           \
            *row_seq_out(s, i) = T##_row((const RT *)row_seq_row(s, i), x, n, next);                                 \
        }                                                                                                            \
    }                                                                                                                \
    static void dot_##T(const void *w, size_t stride, const int32_t *idx, int count, const void *x, int n,           \
                        float *out) {                                                                                \
        const row_seq s = row_seq_one(w, stride, idx, count, out);                                                   \
        dot_seq_##T(&s, x, n);                                                                                       \
    }                                                                                                                \
    static void dot2_##T(const void *w_a, const void *w_b, size_t stride, const int32_t *idx, int count,             \
                         const void *x, int n, float *out_a, float *out_b) {                                         \
        const row_seq s = row_seq_two(w_a, w_b, stride, idx, count, out_a, out_b);                                   \
        dot_seq_##T(&s, x, n);                                                                                       \
    }

GATHER_DOTS(f32, float, float)
GATHER_DOTS(f16, uint16_t, uint16_t)
GATHER_DOTS(q8_0, block_q8_0, block_q8_0)
GATHER_DOTS(q4_0, block_q4_0, block_q8_0)

/* ---- axpy: AXPY_ROWS rows per pass over y, y held in registers across them ---- */

/* float rows: 32 elements per pass in four registers; F16 widened on load */
#define FLOAT_AXPY(T, ELEM, LOAD8, LOAD1)                                                                        \
    static void axpy_##T(const void *w, size_t stride, const int32_t *idx, const float *coef, int count,        \
                         float *y, int n) {                                                                      \
        for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {                                                          \
            axpy_group g;                                                                                        \
            axpy_group_at(&g, w, stride, idx, coef, count, k0);                                                  \
            int i = 0;                                                                                           \
            for (; i + 32 <= n; i += 32) {                                                                       \
                axpy_prefetch_next(g.next, g.m, (size_t)i * sizeof(ELEM), 32 * sizeof(ELEM));                    \
                __m256 y0 = _mm256_loadu_ps(y + i), y1 = _mm256_loadu_ps(y + i + 8);                             \
                __m256 y2 = _mm256_loadu_ps(y + i + 16), y3 = _mm256_loadu_ps(y + i + 24);                       \
                for (int r = 0; r < g.m; r++) {                                                                  \
                    const ELEM *wr = (const ELEM *)g.rows[r] + i;                                                \
                    const __m256 c = _mm256_set1_ps(g.coef[r]);                                                  \
                    y0 = _mm256_fmadd_ps(c, LOAD8(wr), y0);                                                      \
                    y1 = _mm256_fmadd_ps(c, LOAD8(wr + 8), y1);                                                  \
                    y2 = _mm256_fmadd_ps(c, LOAD8(wr + 16), y2);                                                 \
                    y3 = _mm256_fmadd_ps(c, LOAD8(wr + 24), y3);                                                 \
                }                                                                                                \
                _mm256_storeu_ps(y + i, y0);                                                                     \
                _mm256_storeu_ps(y + i + 8, y1);                                                                 \
                _mm256_storeu_ps(y + i + 16, y2);                                                                \
                _mm256_storeu_ps(y + i + 24, y3);                                                                \
            }                                                                                                    \
            for (; i < n; i++)                                                                                   \
                for (int r = 0; r < g.m; r++)                                                                    \
                    y[i] = __builtin_fmaf(g.coef[r], LOAD1((const ELEM *)g.rows[r] + i), y[i]);                  \
        }                                                                                                        \
    }

static float load_f32_1(const float *p) { return *p; }
static float load_f16_1(const uint16_t *p) { return _cvtsh_ss(*p); }

FLOAT_AXPY(f32, float, _mm256_loadu_ps, load_f32_1)
FLOAT_AXPY(f16, uint16_t, load_f16x8, load_f16_1)

/* 8 signed bytes to floats */
static __m256 i8x8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

static void axpy_q8_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n) {
    const int nb = n / QK8_0;
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, w, stride, idx, coef, count, k0);
        for (int b = 0; b < nb; b++) {
            const size_t off = (size_t)b * sizeof(block_q8_0);
            axpy_prefetch_next(g.next, g.m, off, sizeof(block_q8_0));
            float *yb = y + b * QK8_0;
            __m256 y0 = _mm256_loadu_ps(yb), y1 = _mm256_loadu_ps(yb + 8);
            __m256 y2 = _mm256_loadu_ps(yb + 16), y3 = _mm256_loadu_ps(yb + 24);
            for (int r = 0; r < g.m; r++) {
                const block_q8_0 *blk = (const block_q8_0 *)(g.rows[r] + off);
                const __m256 cd = _mm256_set1_ps(g.coef[r] * load_f16(&blk->d));
                const __m128i q0 = _mm_loadu_si128((const __m128i *)blk->qs);
                const __m128i q1 = _mm_loadu_si128((const __m128i *)(blk->qs + 16));
                y0 = _mm256_fmadd_ps(cd, i8x8_to_ps(q0), y0);
                y1 = _mm256_fmadd_ps(cd, i8x8_to_ps(_mm_unpackhi_epi64(q0, q0)), y1);
                y2 = _mm256_fmadd_ps(cd, i8x8_to_ps(q1), y2);
                y3 = _mm256_fmadd_ps(cd, i8x8_to_ps(_mm_unpackhi_epi64(q1, q1)), y3);
            }
            _mm256_storeu_ps(yb, y0);
            _mm256_storeu_ps(yb + 8, y1);
            _mm256_storeu_ps(yb + 16, y2);
            _mm256_storeu_ps(yb + 24, y3);
        }
    }
}

static void axpy_q4_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n) {
    const int nb = n / QK4_0;
    const __m128i low4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, w, stride, idx, coef, count, k0);
        for (int b = 0; b < nb; b++) {
            const size_t off = (size_t)b * sizeof(block_q4_0);
            axpy_prefetch_next(g.next, g.m, off, sizeof(block_q4_0));
            float *yb = y + b * QK4_0;
            __m256 y0 = _mm256_loadu_ps(yb), y1 = _mm256_loadu_ps(yb + 8);
            __m256 y2 = _mm256_loadu_ps(yb + 16), y3 = _mm256_loadu_ps(yb + 24);
            for (int r = 0; r < g.m; r++) {
                const block_q4_0 *blk = (const block_q4_0 *)(g.rows[r] + off);
                const __m256 cd = _mm256_set1_ps(g.coef[r] * load_f16(&blk->d));
                const __m128i packed = _mm_loadu_si128((const __m128i *)blk->qs);
                const __m128i lo = _mm_sub_epi8(_mm_and_si128(packed, low4), eight);
                const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low4), eight);
                y0 = _mm256_fmadd_ps(cd, i8x8_to_ps(lo), y0);
                y1 = _mm256_fmadd_ps(cd, i8x8_to_ps(_mm_unpackhi_epi64(lo, lo)), y1);
                y2 = _mm256_fmadd_ps(cd, i8x8_to_ps(hi), y2);
                y3 = _mm256_fmadd_ps(cd, i8x8_to_ps(_mm_unpackhi_epi64(hi, hi)), y3);
            }
            _mm256_storeu_ps(yb, y0);
            _mm256_storeu_ps(yb + 8, y1);
            _mm256_storeu_ps(yb + 16, y2);
            _mm256_storeu_ps(yb + 24, y3);
        }
    }
}

const sparse_kernels sparse_avx2_impl = {
    .name = "avx2",
    .f32 = {dot_f32, dot2_f32, axpy_f32},
    .f16 = {dot_f16, dot2_f16, axpy_f16},
    .q8_0 = {dot_q8_0, dot2_q8_0, axpy_q8_0},
    .q4_0 = {dot_q4_0, dot2_q4_0, axpy_q4_0},
};

/* AVX2 + FMA + F16C sparse kernels; reached only through sparse_kernels_avx2()
 * after the CPU check. Dots reproduce kernels_avx2.c bit for bit, one row at a
 * time (AVX2 has no cheaper multi-row form: the per-block work is weight-side);
 * axpy follows the scalar definition exactly.
 *
 * The weights are a gather of scattered rows, which the hardware prefetcher
 * cannot guess, so each kernel prefetches, at the offset it is reading, the
 * rows it reads next: a dot the next row, an axpy the next group's rows. Into
 * L2 (T1), as in sparse_avx512.c: prefetches into L1 read slower on Zen 4. */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"
#include "sparse_kernels.h"
#include "sparse_rows.h"

#define AXPY_ROWS 8 /* rows applied per pass over y */

static float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

/* always inlined: GCC 12 judges a small function whose only effect is a
 * prefetch "const" and deletes its calls */
#define HOT static inline __attribute__((always_inline))

HOT void prefetch_l2(const char *next, size_t off) {
    if (next) _mm_prefetch(next + off, _MM_HINT_T1);
}

/* Called as the bytes [off, off+step) of m rows are consumed: prefetch each
 * line this step enters in the rows read next (NULL: none). */
HOT void prefetch_step(const char *const *next, int m, size_t off, size_t step) {
    const size_t last = off + step - 1;
    if (off > 0 && (last >> 6) == ((off - 1) >> 6)) return;
    for (int r = 0; r < m; r++) prefetch_l2(next[r], last);
}

static float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- dots: kernels_avx2.c's arithmetic with the prefetch woven in ---- */

static float dot_row_f32(const char *row, const char *next, const float *x, int n) {
    const float *w = (const float *)row;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        prefetch_l2(next, (size_t)i * 4);
        prefetch_l2(next, (size_t)i * 4 + 64);
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc0);
    float sum = hsum256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += w[i] * x[i];
    return sum;
}

static __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static float dot_row_f16(const char *row, const char *next, const uint16_t *x, int n) {
    const uint16_t *w = (const uint16_t *)row;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        prefetch_l2(next, (size_t)i * 2);
        acc0 = _mm256_fmadd_ps(load_f16x8(w + i), load_f16x8(x + i), acc0);
        acc1 = _mm256_fmadd_ps(load_f16x8(w + i + 8), load_f16x8(x + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(load_f16x8(w + i + 16), load_f16x8(x + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(load_f16x8(w + i + 24), load_f16x8(x + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_f16x8(w + i), load_f16x8(x + i), acc0);
    float sum = hsum256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += _cvtsh_ss(w[i]) * _cvtsh_ss(x[i]);
    return sum;
}

/* sum of a*b over 32 signed bytes, as 8 float lanes (exact: |partials| < 2^24) */
static __m256 dot_i8x32(__m256i a, __m256i b) {
    const __m256i abs_a = _mm256_sign_epi8(a, a), b_signed = _mm256_sign_epi8(b, a);
    const __m256i pairs = _mm256_maddubs_epi16(abs_a, b_signed);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

static __m256i load_q8_0(const block_q8_0 *blk) { return _mm256_loadu_si256((const __m256i *)blk->qs); }

/* the 32 quants of a Q4_0 block minus 8, in element order, as signed bytes */
static __m256i load_q4_0(const block_q4_0 *blk) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)blk->qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0f)), _mm256_set1_epi8(8));
}

/* two accumulators over alternate blocks, an odd last block into the first */
#define QUANT_ROW_DOT(T, BLOCK)                                                                                  \
    static float dot_row_##T(const char *row, const char *next, const block_q8_0 *x, int n) {                   \
        const BLOCK *w = (const BLOCK *)row;                                                                     \
        const int nb = n / QK8_0;                                                                                \
        const char *const nexts[1] = {next};                                                                     \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                                           \
        int b = 0;                                                                                               \
        for (; b + 2 <= nb; b += 2) {                                                                            \
            prefetch_step(nexts, 1, (size_t)b * sizeof(BLOCK), 2 * sizeof(BLOCK));                                \
            const __m256 d0 = _mm256_set1_ps(load_f16(&w[b].d) * load_f16(&x[b].d));                            \
            const __m256 d1 = _mm256_set1_ps(load_f16(&w[b + 1].d) * load_f16(&x[b + 1].d));                     \
            acc0 = _mm256_fmadd_ps(d0, dot_i8x32(load_##T(&w[b]), _mm256_loadu_si256((const __m256i *)x[b].qs)), \
                                   acc0);                                                                        \
            acc1 = _mm256_fmadd_ps(                                                                              \
                d1, dot_i8x32(load_##T(&w[b + 1]), _mm256_loadu_si256((const __m256i *)x[b + 1].qs)), acc1);     \
        }                                                                                                        \
        if (b < nb) {                                                                                            \
            const __m256 d = _mm256_set1_ps(load_f16(&w[b].d) * load_f16(&x[b].d));                             \
            acc0 = _mm256_fmadd_ps(d, dot_i8x32(load_##T(&w[b]), _mm256_loadu_si256((const __m256i *)x[b].qs)), \
                                   acc0);                                                                        \
        }                                                                                                        \
        return hsum256(_mm256_add_ps(acc0, acc1));                                                              \
    }

QUANT_ROW_DOT(q8_0, block_q8_0)
QUANT_ROW_DOT(q4_0, block_q4_0)

#define GATHER_DOTS(T, XT)                                                                                       \
    static void dot_seq_##T(const row_seq *s, const XT *x, int n) {                                              \
        const int len = row_seq_len(s);                                                                          \
        for (int i = 0; i < len; i++)                                                                            \
            *row_seq_out(s, i) = dot_row_##T(row_seq_row(s, i), i + 1 < len ? row_seq_row(s, i + 1) : NULL, x, n); \
    }                                                                                                            \
    static void dot_##T(const void *w, size_t stride, const int32_t *idx, int count, const void *x, int n,       \
                        float *out) {                                                                            \
        const row_seq s = row_seq_one(w, stride, idx, count, out);                                               \
        dot_seq_##T(&s, x, n);                                                                                   \
    }                                                                                                            \
    static void dot2_##T(const void *w_a, const void *w_b, size_t stride, const int32_t *idx, int count,         \
                         const void *x, int n, float *out_a, float *out_b) {                                     \
        const row_seq s = row_seq_two(w_a, w_b, stride, idx, count, out_a, out_b);                               \
        dot_seq_##T(&s, x, n);                                                                                   \
    }

GATHER_DOTS(f32, float)
GATHER_DOTS(f16, uint16_t)
GATHER_DOTS(q8_0, block_q8_0)
GATHER_DOTS(q4_0, block_q8_0)

/* ---- axpy: AXPY_ROWS rows per pass over y, y held in registers across them ---- */

typedef struct {
    const char *rows[AXPY_ROWS], *next[AXPY_ROWS];
    float coef[AXPY_ROWS];
    int m; /* rows in this group */
} axpy_group;

static void axpy_group_at(axpy_group *g, const char *w, size_t stride, const int32_t *idx, const float *coef,
                          int count, int k0) {
    g->m = count - k0 < AXPY_ROWS ? count - k0 : AXPY_ROWS;
    for (int r = 0; r < AXPY_ROWS; r++) {
        g->rows[r] = r < g->m ? w + (size_t)idx[k0 + r] * stride : NULL;
        g->coef[r] = r < g->m ? coef[k0 + r] : 0.0f;
        g->next[r] = k0 + AXPY_ROWS + r < count ? w + (size_t)idx[k0 + AXPY_ROWS + r] * stride : NULL;
    }
}

/* float rows: 32 elements per pass in four registers; F16 widened on load */
#define FLOAT_AXPY(T, ELEM, LOAD8, LOAD1)                                                                        \
    static void axpy_##T(const void *w, size_t stride, const int32_t *idx, const float *coef, int count,        \
                         float *y, int n) {                                                                      \
        for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {                                                          \
            axpy_group g;                                                                                        \
            axpy_group_at(&g, w, stride, idx, coef, count, k0);                                                  \
            int i = 0;                                                                                           \
            for (; i + 32 <= n; i += 32) {                                                                       \
                prefetch_step(g.next, g.m, (size_t)i * sizeof(ELEM), 32 * sizeof(ELEM));                         \
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
            prefetch_step(g.next, g.m, off, sizeof(block_q8_0));
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
            prefetch_step(g.next, g.m, off, sizeof(block_q4_0));
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

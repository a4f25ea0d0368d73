/* AVX2 + FMA + F16C sparse kernels; reached only through the avx2 kernel set
 * after the CPU check. Dots are kernels_avx2.c's rows (kernels_avx2.h), one
 * row at a time but for Q4_0, whose activation-side work (the regrouped
 * block pairs) is done once a call and shared by four rows a pass; axpy
 * follows the scalar definition exactly.
 *
 * The weights are a gather of scattered rows, which the hardware prefetcher
 * cannot guess, so each kernel prefetches into L2, at the offset it is
 * reading, the rows it reads next: a dot the next row, an axpy the next
 * group's rows. */
#include <stddef.h>
#include <string.h>

#include "kernels/kernels_avx2.h"
#include "kernels/sparse_kernels.h"
#include "kernels/sparse_rows.h"

/* ---- dots: the dense set's rows (kernels_avx2.h), prefetching the next row ---- */

/* one row after the other, each prefetching the next */
#define ROW_BY_ROW(T, RT, XT)                                                                                        \
    static void dot_seq_##T(const row_seq *s, const XT *x, int n) {                                                  \
        const int len = row_seq_len(s);                                                                              \
        for (int i = 0; i < len; i++) {                                                                              \
            const char *next = row_seq_ahead(s, i, 1);                                                               \
            *row_seq_out(s, i) = T##_row((const RT *)row_seq_row(s, i), x, n, next);                                 \
        }                                                                                                            \
    }

/* the plain and the fused gate+up gather over dot_seq_T */
#define GATHER_DOTS(T)                                                                                               \
    static void dot_##T(const void *w, size_t stride, const int32_t *idx, int count, const void *x, int n,           \
                        float *out, const sparse_then *then) {                                                       \
        const row_seq s = row_seq_one(w, stride, idx, count, out, then);                                             \
        dot_seq_##T(&s, x, n);                                                                                       \
    }                                                                                                                \
    static void dot2_##T(const void *w_a, const void *w_b, size_t stride, const int32_t *idx, int count,             \
                         const void *x, int n, float *out_a, float *out_b, const sparse_then *then) {                \
        const row_seq s = row_seq_two(w_a, w_b, stride, idx, count, out_a, out_b, then);                             \
        dot_seq_##T(&s, x, n);                                                                                       \
    }

ROW_BY_ROW(f32, float, float)
ROW_BY_ROW(f16, uint16_t, uint16_t)
ROW_BY_ROW(q8_0, block_q8_0, block_q8_0)

/* Q4_0: Q4_ROWS rows a pass (q4_rows, the dense dot's bits) over the
 * activation's pairs regrouped once (xpairs, NULL: in every pass), each row
 * prefetching the row a pass later; the last len % Q4_ROWS one at a time */
ROW_INLINE void dot_seq_q4_0_passes(const row_seq *s, const block_q8_0 *x, const q4_xpair *xpairs, int n) {
    const int len = row_seq_len(s);
    int i = 0;
    for (; i + Q4_ROWS <= len; i += Q4_ROWS) {
        const char *rows[Q4_ROWS], *ahead[Q4_ROWS];
        float out[Q4_ROWS];
        for (int r = 0; r < Q4_ROWS; r++) {
            rows[r] = row_seq_row(s, i + r);
            const char *later = row_seq_ahead(s, i + r, Q4_ROWS);
            ahead[r] = (later ? later : rows[r]) + 2 * sizeof(block_q4_0) - 1;
        }
        q4_rows(rows, ahead, 2 * sizeof(block_q4_0), x, xpairs, n / QK4_0, out);
        for (int r = 0; r < Q4_ROWS; r++) *row_seq_out(s, i + r) = out[r];
    }
    for (; i < len; i++)
        *row_seq_out(s, i) = q4_0_row((const block_q4_0 *)row_seq_row(s, i), x, n, row_seq_ahead(s, i, 1));
}

static void dot_seq_q4_0(const row_seq *s, const block_q8_0 *x, int n) {
    q4_xpair xpairs[Q4_XPAIRS_MAX];
    if (q4_xpairs_fill(xpairs, x, n / QK4_0, row_seq_len(s)))
        dot_seq_q4_0_passes(s, x, xpairs, n);
    else
        dot_seq_q4_0_passes(s, x, NULL, n);
}

GATHER_DOTS(f32)
GATHER_DOTS(f16)
GATHER_DOTS(q8_0)
GATHER_DOTS(q4_0)

/* ---- axpy: AXPY_ROWS rows per pass over y, y held in registers across them ---- */

/* float rows: 32 elements per pass in four registers; F16 widened on load */
#define FLOAT_AXPY(T, ELEM, LOAD8, LOAD1)                                                                        \
    static void axpy_##T(const void *w, size_t stride, const int32_t *idx, const float *coef, int count,         \
                         float *y, int n, const sparse_then *then) {                                             \
        for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {                                                          \
            axpy_group g;                                                                                        \
            axpy_group_at(&g, AXPY_ROWS, w, stride, idx, coef, count, k0, then);                                 \
            int i = 0;                                                                                           \
            for (; i + 32 <= n; i += 32) {                                                                       \
                axpy_prefetch_next(g.next, g.next_m, (size_t)i * sizeof(ELEM), 32 * sizeof(ELEM));               \
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
                      int n, const sparse_then *then) {
    const int nb = n / QK8_0;
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, AXPY_ROWS, w, stride, idx, coef, count, k0, then);
        for (int b = 0; b < nb; b++) {
            const size_t off = (size_t)b * sizeof(block_q8_0);
            axpy_prefetch_next(g.next, g.next_m, off, sizeof(block_q8_0));
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

/* Q4_0 (sparse_kernels.h: int8 coefficients per group of AXPY_Q4_GROUP rows
 * and block): two rows' packed bytes interleaved (byte 2i from the first
 * row, 2i+1 from the second), then their low nibbles (elements 0-15) and
 * high nibbles (16-31) masked out of that, so that PMADDUBSW multiplies each
 * element of the two rows by their int8 coefficients and adds the pair; the
 * int16 sums stay exact (|c * q| <= 127 * 15, 8 pairs <= 30480). Interleaving
 * the packed bytes before the nibbles are split takes half the shuffles of
 * splitting each row first. With the scales gathered in a register
 * (q4_scales), tools/sparse-bench -t q4_0 -i avx2 on the Intel Xeon: 9.2 ->
 * 15.1 GB/s in cache (-f 1024 -p 0.25 -m 2), 8.7 -> 14.2-14.6 from memory
 * (-P thp). */

#define Q4_AXPY_RUN 8 /* blocks whose coefficients are quantized in one pass */

/* A run's quantized coefficients: per block j, pair p's two int8 in the low
 * 16 bits of c2[p][j] (even row low), the -8's integer term, the scale. */
typedef struct {
    int32_t c2[AXPY_Q4_GROUP / 2][Q4_AXPY_RUN] __attribute__((aligned(32)));
    int32_t bias[Q4_AXPY_RUN] __attribute__((aligned(32)));
    float scale[Q4_AXPY_RUN] __attribute__((aligned(32)));
} q4_run_coefs;

static inline int q4_scale_bits(const char *p, int j) {
    uint16_t d;
    memcpy(&d, p + j * sizeof(block_q4_0), sizeof d);
    return d;
}

/* the F16 scales of blocks 0..run-1 of a row from its block at p (lanes past
 * run: 0), gathered in a register: stored to memory one by one and loaded as
 * a vector they stalled on store forwarding, a third of the axpy's time */
static __m256 q4_scales(const char *p, int run) {
    __m128i h = _mm_setzero_si128();
    switch (run) { /* each case falls through to the lower blocks */
    default: h = _mm_insert_epi16(h, q4_scale_bits(p, 7), 7); /* fall through */
    case 7: h = _mm_insert_epi16(h, q4_scale_bits(p, 6), 6); /* fall through */
    case 6: h = _mm_insert_epi16(h, q4_scale_bits(p, 5), 5); /* fall through */
    case 5: h = _mm_insert_epi16(h, q4_scale_bits(p, 4), 4); /* fall through */
    case 4: h = _mm_insert_epi16(h, q4_scale_bits(p, 3), 3); /* fall through */
    case 3: h = _mm_insert_epi16(h, q4_scale_bits(p, 2), 2); /* fall through */
    case 2: h = _mm_insert_epi16(h, q4_scale_bits(p, 1), 1); /* fall through */
    case 1: h = _mm_insert_epi16(h, q4_scale_bits(p, 0), 0);
    }
    return _mm256_cvtph_ps(h);
}

static void q4_quantize_run(const axpy_group *g, size_t off, int run, q4_run_coefs *q) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const int pairs = (g->m + 1) / 2; /* the last one padded */
    __m256 cd[AXPY_Q4_GROUP], m = _mm256_setzero_ps();
    for (int r = 0; r < 2 * pairs; r++) {
        cd[r] = _mm256_mul_ps(_mm256_set1_ps(g->coef[r]), q4_scales(g->rows[r] + off, run));
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, cd[r]));
    }
    const __m256 inv = _mm256_and_ps(_mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_GT_OQ),
                                     _mm256_div_ps(_mm256_set1_ps(127.0f), m));
    _mm256_store_ps(q->scale, _mm256_mul_ps(m, _mm256_set1_ps(1.0f / 127.0f)));
    const __m256i byte = _mm256_set1_epi32(0xff);
    __m256i sum = _mm256_setzero_si256();
    for (int p = 0; p < pairs; p++) {
        const __m256i c0 = _mm256_cvtps_epi32(_mm256_mul_ps(cd[2 * p], inv)); /* nearest-even, as lrintf */
        const __m256i c1 = _mm256_cvtps_epi32(_mm256_mul_ps(cd[2 * p + 1], inv));
        sum = _mm256_add_epi32(sum, _mm256_add_epi32(c0, c1));
        _mm256_store_si256((__m256i *)q->c2[p],
                           _mm256_or_si256(_mm256_and_si256(c0, byte), _mm256_slli_epi32(_mm256_and_si256(c1, byte), 8)));
    }
    _mm256_store_si256((__m256i *)q->bias, _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 3)));
}

/* a block's 16 packed bytes of two rows, interleaved by byte */
static inline __m256i q4_interleave2(const char *a, const char *b) {
    const __m128i va = _mm_loadu_si128((const __m128i *)a), vb = _mm_loadu_si128((const __m128i *)b);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(va, vb)), _mm_unpackhi_epi8(va, vb), 1);
}

/* y[0..31] += scale * (bias + the int16 sums: lo = elements 0-15, hi = 16-31) */
static inline void q4_add_block(float *y, __m256i lo, __m256i hi, int32_t bias, float scale) {
    const __m256i b = _mm256_set1_epi32(bias);
    const __m256 sc = _mm256_set1_ps(scale);
    const __m256i parts[2] = {lo, hi};
    for (int i = 0; i < 4; i++) { /* elements 8i.. */
        const __m128i half = i % 2 == 0 ? _mm256_castsi256_si128(parts[i / 2]) : _mm256_extracti128_si256(parts[i / 2], 1);
        const __m256 v = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_cvtepi16_epi32(half), b));
        _mm256_storeu_ps(y + 8 * i, _mm256_fmadd_ps(sc, v, _mm256_loadu_ps(y + 8 * i)));
    }
}

static void axpy_q4_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n, const sparse_then *then) {
    const int nb = n / QK4_0;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    for (int k0 = 0; k0 < count; k0 += AXPY_Q4_GROUP) {
        axpy_group g;
        axpy_group_at(&g, AXPY_Q4_GROUP, w, stride, idx, coef, count, k0, then);
        const int pairs = (g.m + 1) / 2;
        for (int b0 = 0; b0 < nb; b0 += Q4_AXPY_RUN) {
            const int run = nb - b0 < Q4_AXPY_RUN ? nb - b0 : Q4_AXPY_RUN;
            q4_run_coefs q;
            q4_quantize_run(&g, (size_t)b0 * sizeof(block_q4_0), run, &q);
            for (int j = 0; j < run; j++) {
                const size_t off = (size_t)(b0 + j) * sizeof(block_q4_0);
                axpy_prefetch_next(g.next, g.next_m, off, sizeof(block_q4_0));
                const size_t qs = off + offsetof(block_q4_0, qs);
                __m256i lo = _mm256_setzero_si256(), hi = lo;
                for (int p = 0; p < pairs; p++) {
                    const __m256i v = q4_interleave2(g.rows[2 * p] + qs, g.rows[2 * p + 1] + qs);
                    const __m256i c = _mm256_set1_epi16((short)q.c2[p][j]);
                    lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_and_si256(v, low4), c));
                    hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), c));
                }
                q4_add_block(y + (size_t)(b0 + j) * QK4_0, lo, hi, q.bias[j], q.scale[j]);
            }
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

/* AVX-512 (F/BW/VL/DQ + VNNI) sparse kernels; reached only through
 * the avx512 kernel sets (kernels.h) after the CPU check. Dots reproduce the default
 * avx512 dense set bit for bit (same arithmetic in the same order: the
 * quantized rows are kernels_q_avx512.h's, which the dense set uses too);
 * axpy follows the scalar definition exactly.
 *
 * The weights are a gather of scattered rows, which the hardware prefetcher
 * cannot guess, so every kernel prefetches into L2 the rows it will read
 * next: a dot the row GATHER_AHEAD_ROWS further down the list (Q4_0,
 * dot_seq_q4_0 in kernels_q_avx512.h: Q4_GATHER_ROWS), at the offset it is
 * reading; an axpy the next group's rows (kernels_q_avx512.h says why L2). */
#include <stddef.h>

#include "kernels/kernels_q_avx512.h"
#include "kernels/sparse_kernels.h"

/* Measured on the Q4_0 dot when it still read one row at a time: 9 KiB
 * ahead for a 4096-wide Q4_0 row (dot2: 2 neurons). Against 2 rows, in
 * interleaved runs of tools/sparse-bench -t q4_0, dot2 read 11.1-15.8 GB/s
 * vs 11.1-14.2 with the weights on 4 KiB shm pages (faster in every round,
 * by 2-10%) and 15.5-17.8 vs 15.2-16.7 on huge pages; 6 rows was no faster
 * on huge pages and slower on 4 KiB ones, and touching a row's pages
 * earlier (a prefetch of its first and last line 6-10 rows ahead) slower. */
#define GATHER_AHEAD_ROWS 4

/* ---- dots: the dense set's rows (kernels_q_avx512.h), prefetching a row ahead ---- */

static void dot_seq_f32(const row_seq *s, const float *x, int n) {
    const int len = row_seq_len(s);
    for (int i = 0; i < len; i++)
        *row_seq_out(s, i) = f32_row((const float *)row_seq_row(s, i), x, n, gather_ahead(s, i, GATHER_AHEAD_ROWS));
}

static void dot_seq_f16(const row_seq *s, const uint16_t *x, int n) {
    const int len = row_seq_len(s);
    for (int i = 0; i < len; i++)
        *row_seq_out(s, i) = f16_row((const uint16_t *)row_seq_row(s, i), x, n, gather_ahead(s, i, GATHER_AHEAD_ROWS));
}

static void dot_seq_q8_0(const row_seq *s, const block_q8_0 *x, int n) {
    const int len = row_seq_len(s), nb = n / QK8_0;
    for (int i = 0; i < len; i++)
        *row_seq_out(s, i) =
            q8_row((const block_q8_0 *)row_seq_row(s, i), x, nb, gather_ahead(s, i, GATHER_AHEAD_ROWS));
}

#define GATHER_DOTS(T, XT)                                                                                       \
    static void dot_##T(const void *w, size_t stride, const int32_t *idx, int count, const void *x, int n,       \
                        float *out, const sparse_then *then) {                                                   \
        const row_seq s = row_seq_one(w, stride, idx, count, out, then);                                         \
        dot_seq_##T(&s, (const XT *)x, n);                                                                       \
    }                                                                                                            \
    static void dot2_##T(const void *w_a, const void *w_b, size_t stride, const int32_t *idx, int count,         \
                         const void *x, int n, float *out_a, float *out_b, const sparse_then *then) {            \
        const row_seq s = row_seq_two(w_a, w_b, stride, idx, count, out_a, out_b, then);                         \
        dot_seq_##T(&s, (const XT *)x, n);                                                                       \
    }

GATHER_DOTS(f32, float)
GATHER_DOTS(f16, uint16_t)
GATHER_DOTS(q8_0, void)
GATHER_DOTS(q4_0, void)

/* ---- axpy: AXPY_ROWS rows per pass over y, y held in registers across them ---- */

/* Element loads of one row at element i (full 16 lanes, or masked for the tail). */
static inline __m512 load16_f32(const void *row, int i) { return _mm512_loadu_ps((const float *)row + i); }
static inline __m512 load16_f16(const void *row, int i) { return load_f16x16((const uint16_t *)row + i); }
static inline __m512 load16m_f32(const void *row, int i, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, (const float *)row + i);
}
static inline __m512 load16m_f16(const void *row, int i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i));
}

/* The float axpys differ only in how an element is loaded: one body, two types. */
#define AXPY_FLOAT(T, ESIZE)                                                                                      \
    static void axpy_##T(const void *w, size_t stride, const int32_t *idx, const float *coef, int count,          \
                         float *y, int n, const sparse_then *then) {                                              \
        for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {                                                           \
            axpy_group g;                                                                                         \
            axpy_group_at(&g, AXPY_ROWS, w, stride, idx, coef, count, k0, then);                                  \
            int i = 0;                                                                                            \
            for (; i + 64 <= n; i += 64) {                                                                        \
                axpy_prefetch_next(g.next, g.next_m, (size_t)i * (ESIZE), 64 * (ESIZE));                          \
                __m512 y0 = _mm512_loadu_ps(y + i), y1 = _mm512_loadu_ps(y + i + 16);                             \
                __m512 y2 = _mm512_loadu_ps(y + i + 32), y3 = _mm512_loadu_ps(y + i + 48);                        \
                for (int r = 0; r < g.m; r++) {                                                                   \
                    const __m512 c = _mm512_set1_ps(g.coef[r]);                                                   \
                    y0 = _mm512_fmadd_ps(c, load16_##T(g.rows[r], i), y0);                                        \
                    y1 = _mm512_fmadd_ps(c, load16_##T(g.rows[r], i + 16), y1);                                   \
                    y2 = _mm512_fmadd_ps(c, load16_##T(g.rows[r], i + 32), y2);                                   \
                    y3 = _mm512_fmadd_ps(c, load16_##T(g.rows[r], i + 48), y3);                                   \
                }                                                                                                 \
                _mm512_storeu_ps(y + i, y0);                                                                      \
                _mm512_storeu_ps(y + i + 16, y1);                                                                 \
                _mm512_storeu_ps(y + i + 32, y2);                                                                 \
                _mm512_storeu_ps(y + i + 48, y3);                                                                 \
            }                                                                                                     \
            for (; i < n; i += 16) {                                                                              \
                const __mmask16 mask = lanes_from(i, n);                                                          \
                __m512 acc = _mm512_maskz_loadu_ps(mask, y + i);                                                  \
                for (int r = 0; r < g.m; r++)                                                                     \
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(g.coef[r]), load16m_##T(g.rows[r], i, mask), acc);       \
                _mm512_mask_storeu_ps(y + i, mask, acc);                                                          \
            }                                                                                                     \
        }                                                                                                         \
    }

AXPY_FLOAT(f32, sizeof(float))
AXPY_FLOAT(f16, sizeof(uint16_t))

/* 16 signed bytes to floats */
static __m512 i8x16_to_ps(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }

static void axpy_q8_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n, const sparse_then *then) {
    const int nb = n / QK8_0;
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, AXPY_ROWS, w, stride, idx, coef, count, k0, then);
        for (int b = 0; b < nb; b++) {
            const size_t off = (size_t)b * sizeof(block_q8_0);
            axpy_prefetch_next(g.next, g.next_m, off, sizeof(block_q8_0));
            __m512 y0 = _mm512_loadu_ps(y + b * QK8_0), y1 = _mm512_loadu_ps(y + b * QK8_0 + 16);
            for (int r = 0; r < g.m; r++) {
                const block_q8_0 *blk = (const block_q8_0 *)(g.rows[r] + off);
                const __m512 cd = _mm512_set1_ps(g.coef[r] * load_f16(&blk->d));
                y0 = _mm512_fmadd_ps(cd, i8x16_to_ps(_mm_loadu_si128((const __m128i *)blk->qs)), y0);
                y1 = _mm512_fmadd_ps(cd, i8x16_to_ps(_mm_loadu_si128((const __m128i *)(blk->qs + 16))), y1);
            }
            _mm512_storeu_ps(y + b * QK8_0, y0);
            _mm512_storeu_ps(y + b * QK8_0 + 16, y1);
        }
    }
}

/* Q4_0 (sparse_kernels.h: int8 coefficients per group of AXPY_Q4_GROUP rows
 * and block). The float form needed 7 vector ops per row and block (nibbles
 * to floats, the -8, two FMAs) and was bound by execution on Zen 4. Here four
 * rows' nibbles of a block are interleaved so that each 32-bit lane holds one
 * element of the four rows, and VPDPBUSD multiplies them by the rows' four
 * int8 coefficients and sums them in one op per 16 elements; the -8 is one
 * integer bias per block. tools/sparse-bench -t q4_0 -i avx512, three
 * interleaved rounds: in cache (-f 1024 -p 0.25 -m 2) 12.8-13.7 -> 22.8 GB/s,
 * from memory (-P thp) 11.8-12.0 -> 17.4-17.8; groups of 8 rows gave
 * 18.7-20.0 and 15.0-16.2. */

#define Q4_AXPY_RUN 16 /* blocks whose coefficients are quantized in one pass */

/* lane L: [dword L of a's low half, of a's high half, of b's low, of b's high] */
static inline __m512i dwords_by_lane(__m256i a, __m256i b) {
    const __m512i sel = _mm512_setr_epi32(0, 4, 16, 20, 1, 5, 17, 21, 2, 6, 18, 22, 3, 7, 19, 23);
    return _mm512_permutex2var_epi32(_mm512_castsi256_si512(a), sel, _mm512_castsi256_si512(b));
}

/* within each 16-byte lane, byte 4i + r <- byte 4r + i */
static inline __m512i transpose_4x4_bytes(__m512i v) {
    const __m512i t = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    return _mm512_shuffle_epi8(v, t);
}

static inline __m256i pair128(__m128i lo, __m128i hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* 16 bytes of four rows, interleaved: dword e = [a[e], b[e], c[e], d[e]] */
static inline __m512i interleave4(__m128i a, __m128i b, __m128i c, __m128i d) {
    return transpose_4x4_bytes(dwords_by_lane(pair128(a, b), pair128(c, d)));
}

static inline __m128i load16(const char *p) { return _mm_loadu_si128((const __m128i *)p); }

/* the f16 scales of blocks 0..7 from blk: the words 9j of its first 128 bytes */
static inline __m128i q4_scales8(const char *blk) {
    const __m512i words = _mm512_setr_epi32(9 << 16, 27 << 16 | 18, 45 << 16 | 36, 63 << 16 | 54, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si128(
        _mm512_permutex2var_epi16(_mm512_loadu_si512(blk), words, _mm512_loadu_si512(blk + 64)));
}

/* the scales of blocks 0..run-1 of a row from its block at p (lanes past run: 0) */
static inline __m512 q4_scales16(const char *p, int run) {
    if (run == Q4_AXPY_RUN)
        return _mm512_cvtph_ps(pair128(q4_scales8(p), q4_scales8(p + 8 * sizeof(block_q4_0))));
    float d[Q4_AXPY_RUN] = {0};
    for (int j = 0; j < run; j++) d[j] = load_f16(p + j * sizeof(block_q4_0));
    return _mm512_loadu_ps(d);
}

/* A run's quantized coefficients: per block j, set h's four int8 in c4[h][j],
 * the -8's integer term in bias[j], the scale in scale[j]. */
typedef struct {
    int32_t c4[AXPY_Q4_GROUP / 4][Q4_AXPY_RUN] __attribute__((aligned(64)));
    int32_t bias[Q4_AXPY_RUN] __attribute__((aligned(64)));
    float scale[Q4_AXPY_RUN] __attribute__((aligned(64)));
} q4_run_coefs;

static inline __attribute__((always_inline)) void q4_quantize_run(const axpy_group *g, size_t off, int run,
                                                                  q4_run_coefs *q) {
    const int sets = (g->m + 3) / 4; /* of 4 rows, the last one padded */
    __m512 cd[AXPY_Q4_GROUP], m = _mm512_setzero_ps();
    for (int r = 0; r < 4 * sets; r++) {
        cd[r] = _mm512_mul_ps(_mm512_set1_ps(g->coef[r]), q4_scales16(g->rows[r] + off, run));
        m = _mm512_max_ps(m, _mm512_abs_ps(cd[r]));
    }
    const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ),
                                           _mm512_set1_ps(127.0f), m);
    _mm512_store_ps(q->scale, _mm512_mul_ps(m, _mm512_set1_ps(1.0f / 127.0f)));
    __m512i sum = _mm512_setzero_si512();
    __m128i c8[AXPY_Q4_GROUP];
    for (int r = 0; r < 4 * sets; r++) {
        const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(cd[r], inv)); /* MXCSR's nearest-even, as lrintf */
        sum = _mm512_add_epi32(sum, c);
        c8[r] = _mm512_cvtepi32_epi8(c);
    }
    _mm512_store_si512(q->bias, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 3)));
    for (int h = 0; h < sets; h++)
        _mm512_store_si512(q->c4[h], interleave4(c8[4 * h], c8[4 * h + 1], c8[4 * h + 2], c8[4 * h + 3]));
}

static void axpy_q4_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n, const sparse_then *then) {
    const int nb = n / QK4_0;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    for (int k0 = 0; k0 < count; k0 += AXPY_Q4_GROUP) {
        axpy_group g;
        axpy_group_at(&g, AXPY_Q4_GROUP, w, stride, idx, coef, count, k0, then);
        const int sets = (g.m + 3) / 4;
        for (int b0 = 0; b0 < nb; b0 += Q4_AXPY_RUN) {
            const int run = nb - b0 < Q4_AXPY_RUN ? nb - b0 : Q4_AXPY_RUN;
            q4_run_coefs q;
            q4_quantize_run(&g, (size_t)b0 * sizeof(block_q4_0), run, &q);
            for (int j = 0; j < run; j++) {
                const size_t off = (size_t)(b0 + j) * sizeof(block_q4_0);
                axpy_prefetch_next(g.next, g.next_m, off, sizeof(block_q4_0));
                const size_t qs = off + offsetof(block_q4_0, qs);
                __m512i lo = _mm512_set1_epi32(q.bias[j]), hi = lo;
                for (int h = 0; h < sets; h++) {
                    const char *const *r = &g.rows[4 * h];
                    const __m512i v = interleave4(load16(r[0] + qs), load16(r[1] + qs), load16(r[2] + qs),
                                                  load16(r[3] + qs));
                    const __m512i c = _mm512_set1_epi32(q.c4[h][j]);
                    lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(v, low4), c);
                    hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), c);
                }
                float *yb = y + (size_t)(b0 + j) * QK4_0;
                const __m512 scale = _mm512_set1_ps(q.scale[j]);
                _mm512_storeu_ps(yb, _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(lo), _mm512_loadu_ps(yb)));
                _mm512_storeu_ps(yb + 16, _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(hi), _mm512_loadu_ps(yb + 16)));
            }
        }
    }
}

const sparse_kernels sparse_avx512_impl = {
    .name = "avx512",
    .f32 = {dot_f32, dot2_f32, axpy_f32},
    .f16 = {dot_f16, dot2_f16, axpy_f16},
    .q8_0 = {dot_q8_0, dot2_q8_0, axpy_q8_0},
    .q4_0 = {dot_q4_0, dot2_q4_0, axpy_q4_0},
};

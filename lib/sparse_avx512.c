/* AVX-512 (F/BW/VL/DQ + VNNI) sparse kernels; reached only through
 * sparse_kernels_avx512() after the CPU check. Dots reproduce the default
 * avx512 dense set bit for bit (same arithmetic in the same order: the
 * quantized rows are kernels_q_avx512.h's, which the dense set uses too);
 * axpy follows the scalar definition exactly.
 *
 * The weights are a gather of scattered rows, which the hardware prefetcher
 * cannot guess, so every kernel prefetches into L2 the rows it will read
 * next: a dot the row GATHER_AHEAD_ROWS further down the list (Q4_0,
 * dot_seq_q4_0 in kernels_q_avx512.h: Q4_GATHER_ROWS), at the offset it is
 * reading; an axpy the next group's rows (kernels_q_avx512.h says why L2). */
#include "kernels_q_avx512.h"
#include "sparse_kernels.h"

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
                        float *out) {                                                                            \
        const row_seq s = row_seq_one(w, stride, idx, count, out);                                               \
        dot_seq_##T(&s, (const XT *)x, n);                                                                       \
    }                                                                                                            \
    static void dot2_##T(const void *w_a, const void *w_b, size_t stride, const int32_t *idx, int count,         \
                         const void *x, int n, float *out_a, float *out_b) {                                     \
        const row_seq s = row_seq_two(w_a, w_b, stride, idx, count, out_a, out_b);                               \
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
#define AXPY_FLOAT(T, ESIZE)                                                                                     \
    static void axpy_##T(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y, \
                         int n) {                                                                                 \
        for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {                                                           \
            axpy_group g;                                                                                         \
            axpy_group_at(&g, w, stride, idx, coef, count, k0);                                                   \
            int i = 0;                                                                                            \
            for (; i + 64 <= n; i += 64) {                                                                        \
                axpy_prefetch_next(g.next, g.m, (size_t)i * (ESIZE), 64 * (ESIZE));                              \
                __m512 y0 = _mm512_loadu_ps(y + i), y1 = _mm512_loadu_ps(y + i + 16);                            \
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
                      int n) {
    const int nb = n / QK8_0;
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, w, stride, idx, coef, count, k0);
        for (int b = 0; b < nb; b++) {
            const size_t off = (size_t)b * sizeof(block_q8_0);
            axpy_prefetch_next(g.next, g.m, off, sizeof(block_q8_0));
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

/* Q4_0: on Zen 4 this axpy is bound by vector execution, not by memory or by
 * its 8-deep FMA chains (2 and 4 blocks per pass measured slower). With
 * vpermps lookups the q - 8 conversions queue on the shuffle pipes next to the
 * FMAs, and a scalar cd per (row, block) costs about as much as its two
 * FMAs. So the nibbles become floats by integer ops and a subtraction, which
 * run on the pipes the FMAs leave idle, and the cds of 8 blocks of a row come
 * from one vector multiply (the same single rounding of coef * d as the
 * scalar one). tools/sparse-bench -t q4_0 with its rows in cache
 * (-f 1024 -p 0.25 -m 2): 12.1 -> 13.3 GB/s; from memory alone no measurable
 * change (10 GB/s), but in the stack, where both cores share the bus, the
 * 7B predictor-mode axpy took 6 % less time (timers around it, three
 * interleaved runs). The same changes made the Q8_0 axpy slower (its
 * cvtdq2ps conversion is cheaper than the magic-number one). */

#define Q4_CD_BLOCKS 8 /* q4_scales8 picks 8 */

/* float(q - bias) for the integer q = v & mask in each lane, q below bit k - 23
 * of an f32 of exponent k: OR-ing q into the mantissa of magic = 2^k gives
 * 2^k + q exactly, and subtracting 2^k + bias is exact too */
static inline __m512 lanes_minus(__m512i v, int mask, int magic_bits, float magic_plus_bias) {
    const __m512i magic_q = _mm512_ternarylogic_epi32(v, _mm512_set1_epi32(mask), _mm512_set1_epi32(magic_bits), 0xea);
    return _mm512_sub_ps(_mm512_castsi512_ps(magic_q), _mm512_set1_ps(magic_plus_bias));
}

/* q - 8 for the low nibbles (as 2^23 + q) and the high ones (their bits 4-7
 * are units of 2^19) of the block's bytes, one byte per lane */
static inline __m512 q4_low_centred(__m512i bytes) { return lanes_minus(bytes, 0x0f, 0x4b000000, 0x1p23f + 8); }
static inline __m512 q4_high_centred(__m512i bytes) { return lanes_minus(bytes, 0xf0, 0x49000000, 0x1p19f + 8); }

/* the f16 scales of blocks 0..7 from blk: the words 9j of its first 128 bytes */
static inline __m128i q4_scales8(const char *blk) {
    const __m512i words = _mm512_setr_epi32(9 << 16, 27 << 16 | 18, 45 << 16 | 36, 63 << 16 | 54, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si128(
        _mm512_permutex2var_epi16(_mm512_loadu_si512(blk), words, _mm512_loadu_si512(blk + 64)));
}

/* y[0..31] += the group's terms for its block at off, row r's cd at cd[r * cd_step] */
static inline __attribute__((always_inline)) void q4_axpy_block(const axpy_group *g, size_t off, const float *cd,
                                                                 int cd_step, float *y) {
    axpy_prefetch_next(g->next, g->m, off, sizeof(block_q4_0));
    __m512 y0 = _mm512_loadu_ps(y), y1 = _mm512_loadu_ps(y + 16);
    for (int r = 0; r < g->m; r++) {
        const __m512 c = _mm512_set1_ps(cd[r * cd_step]);
        const block_q4_0 *blk = (const block_q4_0 *)(g->rows[r] + off);
        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)blk->qs));
        y0 = _mm512_fmadd_ps(c, q4_low_centred(bytes), y0);
        y1 = _mm512_fmadd_ps(c, q4_high_centred(bytes), y1);
    }
    _mm512_storeu_ps(y, y0);
    _mm512_storeu_ps(y + 16, y1);
}

static void axpy_q4_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n) {
    const int nb = n / QK4_0;
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, w, stride, idx, coef, count, k0);
        int b = 0;
        for (; b + Q4_CD_BLOCKS <= nb; b += Q4_CD_BLOCKS) {
            const size_t off = (size_t)b * sizeof(block_q4_0);
            float cd[AXPY_ROWS][Q4_CD_BLOCKS] __attribute__((aligned(32)));
            for (int r = 0; r < g.m; r++)
                _mm256_store_ps(cd[r], _mm256_mul_ps(_mm256_set1_ps(g.coef[r]),
                                                     _mm256_cvtph_ps(q4_scales8(g.rows[r] + off))));
            for (int j = 0; j < Q4_CD_BLOCKS; j++)
                q4_axpy_block(&g, off + j * sizeof(block_q4_0), &cd[0][j], Q4_CD_BLOCKS, y + (b + j) * QK4_0);
        }
        for (; b < nb; b++) { /* the last nb % 8 blocks */
            const size_t off = (size_t)b * sizeof(block_q4_0);
            float cd[AXPY_ROWS];
            for (int r = 0; r < g.m; r++) cd[r] = g.coef[r] * load_f16(g.rows[r] + off);
            q4_axpy_block(&g, off, cd, 1, y + b * QK4_0);
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

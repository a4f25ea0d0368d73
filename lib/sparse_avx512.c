/* AVX-512 (F/BW/VL/DQ + VNNI) sparse kernels; reached only through
 * sparse_kernels_avx512() after the CPU check. Dots reproduce the avx512-exact
 * dense set (llama.cpp's order) bit for bit; axpy follows the scalar
 * definition exactly.
 *
 * The weights are a gather of scattered rows, so each kernel prefetches along
 * the concatenation of its current rows and the next ones: near the end of a
 * row the lines ahead are the next row's first lines, which the hardware
 * prefetcher cannot guess. */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"
#include "sparse_kernels.h"
#include "sparse_rows.h"

/* bytes ahead in each stream: one stream gets a long lead, 16 concurrent ones
 * a short lead each (tools/sparse-bench saw no difference between 256 and
 * 1024 for the lanes: the hardware prefetcher follows each row once started) */
#define PREFETCH_ROW 1024
#define PREFETCH_LANES 256
#define PREFETCH_AXPY 512

#define LANES 16     /* rows per quantized dot pass, one per float lane */
#define AXPY_ROWS 8  /* rows applied per pass over y */

static float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

static __mmask16 tail_mask16(int left) { return (__mmask16)((1u << left) - 1); }

static void prefetch_ahead(const char *row, const char *next, size_t off, size_t row_bytes) {
    if (off < row_bytes) _mm_prefetch(row + off, _MM_HINT_T0);
    else if (next && off - row_bytes < row_bytes) _mm_prefetch(next + (off - row_bytes), _MM_HINT_T0);
}

/* Called as the bytes [off, off+step) of m rows are consumed: prefetch, at
 * `lead` bytes ahead, each cache line that this step enters. */
static void prefetch_step(const char *const *rows, const char *const *next, int m, size_t off, size_t step,
                          size_t lead, size_t row_bytes) {
    const size_t ahead = off + lead + step - 1;
    if ((ahead >> 6) == ((ahead - step) >> 6)) return;
    for (int r = 0; r < m; r++) prefetch_ahead(rows[r], next[r], ahead, row_bytes);
}

/* ---- F32 / F16 dots: ggml_vec_dot_f32/f16's order (kernels_avx512.c), one row at a time ---- */

static float dot_row_f32(const char *row, const char *next, const float *x, int n) {
    const float *w = (const float *)row;
    const size_t row_bytes = (size_t)n * sizeof(float);
    const int np = n & ~63;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int i = 0; i < np; i += 64) {
        for (size_t line = 0; line < 256; line += 64)
            prefetch_ahead(row, next, (size_t)i * 4 + line + PREFETCH_ROW, row_bytes);
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), s3);
    }
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3)));
    for (int i = np; i < n; i++) sum = __builtin_fmaf(w[i], x[i], sum);
    return sum;
}

static __m512 load_f16x16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

static float dot_row_f16(const char *row, const char *next, const uint16_t *x, int n) {
    const uint16_t *w = (const uint16_t *)row;
    const size_t row_bytes = (size_t)n * sizeof(uint16_t);
    const int np = n & ~63;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int i = 0; i < np; i += 64) {
        prefetch_ahead(row, next, (size_t)i * 2 + PREFETCH_ROW, row_bytes);
        prefetch_ahead(row, next, (size_t)i * 2 + 64 + PREFETCH_ROW, row_bytes);
        s0 = _mm512_fmadd_ps(load_f16x16(w + i), load_f16x16(x + i), s0);
        s1 = _mm512_fmadd_ps(load_f16x16(w + i + 16), load_f16x16(x + i + 16), s1);
        s2 = _mm512_fmadd_ps(load_f16x16(w + i + 32), load_f16x16(x + i + 32), s2);
        s3 = _mm512_fmadd_ps(load_f16x16(w + i + 48), load_f16x16(x + i + 48), s3);
    }
    double sum = np ? _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3))) : 0.0;
    for (int i = np; i < n; i++) sum += (double)(_cvtsh_ss(w[i]) * _cvtsh_ss(x[i]));
    return (float)sum;
}

static void dot_seq_f32(const row_seq *s, const float *x, int n) {
    const int len = row_seq_len(s);
    for (int i = 0; i < len; i++)
        *row_seq_out(s, i) = dot_row_f32(row_seq_row(s, i), i + 1 < len ? row_seq_row(s, i + 1) : NULL, x, n);
}

static void dot_seq_f16(const row_seq *s, const uint16_t *x, int n) {
    const int len = row_seq_len(s);
    for (int i = 0; i < len; i++)
        *row_seq_out(s, i) = dot_row_f16(row_seq_row(s, i), i + 1 < len ? row_seq_row(s, i + 1) : NULL, x, n);
}

/* ---- Q8_0 / Q4_0 dots: 16 rows at once, one per float lane ----
 * Each lane runs ggml's block-by-block chain acc = fma(isum_b, d_w * d_x, acc),
 * the arithmetic of dot_q8_0_ggml/dot_q4_0_ggml, so results match them exactly.
 * Integer partial sums come from vpdpbusd with four rows per register: 128-bit
 * lane j of register g holds row 4j+g, so the add-transpose below lands row r
 * in float lane r. */

/* 16 bytes at offset off of rows g, 4+g, 8+g, 12+g */
static __m512i load_rows4x16(const char *const rows[LANES], int g, size_t off) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rows[g] + off)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rows[4 + g] + off)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rows[8 + g] + off)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rows[12 + g] + off)), 3);
}

/* s[g]: four partial sums per 128-bit lane; returns the sum of each lane's four, row r in lane r */
static __m512i row_sums16(const __m512i s[4]) {
    const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s[1]), _mm512_unpackhi_epi32(s[0], s[1]));
    const __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2], s[3]), _mm512_unpackhi_epi32(s[2], s[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

/* the f16 scales at offset off of the 16 rows, as floats in row order: one
 * gather per 8 rows (ptrs: their addresses) beats 16 scalar loads packed in
 * registers by ~20% here */
static __m512 row_scales16(const __m512i ptrs[2], size_t off) {
    const __m512i o = _mm512_set1_epi64((long long)off);
    const __m128i lo = _mm512_cvtepi64_epi16(_mm512_i64gather_epi64(_mm512_add_epi64(ptrs[0], o), NULL, 1));
    const __m128i hi = _mm512_cvtepi64_epi16(_mm512_i64gather_epi64(_mm512_add_epi64(ptrs[1], o), NULL, 1));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

/* the 16 row addresses as two vectors of 8 */
static void row_ptrs16(const char *const rows[LANES], __m512i ptrs[2]) {
    ptrs[0] = _mm512_loadu_si512(rows);
    ptrs[1] = _mm512_loadu_si512(rows + 8);
}

static __m512 dot16_q8_0(const char *const rows[LANES], const char *const next[LANES], const block_q8_0 *x, int nb) {
    const size_t row_bytes = (size_t)nb * sizeof(block_q8_0);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i ptrs[2];
    row_ptrs16(rows, ptrs);
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t off = (size_t)b * sizeof(block_q8_0);
        prefetch_step(rows, next, LANES, off, sizeof(block_q8_0), PREFETCH_LANES, row_bytes);
        const __m512i x0 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)x[b].qs));
        const __m512i x1 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x[b].qs + 16)));
        /* w + 128 is unsigned for vpdpbusd; start each sum at -128 * sum(x), spread over the lanes */
        const __m512i start = _mm512_sub_epi32(
            _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, x0), bias, x1));
        __m512i s[4];
        for (int g = 0; g < 4; g++) {
            const __m512i w0 = _mm512_xor_si512(load_rows4x16(rows, g, off + 2), bias);
            const __m512i w1 = _mm512_xor_si512(load_rows4x16(rows, g, off + 18), bias);
            s[g] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, w0, x0), w1, x1);
        }
        const __m512 dd = _mm512_mul_ps(row_scales16(ptrs, off), _mm512_set1_ps(load_f16(&x[b].d)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(row_sums16(s)), dd, acc);
    }
    return acc;
}

static __m512 dot16_q4_0(const char *const rows[LANES], const char *const next[LANES], const block_q8_0 *x, int nb) {
    const size_t row_bytes = (size_t)nb * sizeof(block_q4_0);
    const __m512i low4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
    __m512i ptrs[2];
    row_ptrs16(rows, ptrs);
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t off = (size_t)b * sizeof(block_q4_0);
        prefetch_step(rows, next, LANES, off, sizeof(block_q4_0), PREFETCH_LANES, row_bytes);
        /* low nibbles are elements 0-15, high nibbles 16-31 */
        const __m512i x0 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)x[b].qs));
        const __m512i x1 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x[b].qs + 16)));
        /* nibbles q are unsigned for vpdpbusd; start each sum at -8 * sum(x), spread over the lanes */
        const __m512i start = _mm512_sub_epi32(
            _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, x0), eight, x1));
        __m512i s[4];
        for (int g = 0; g < 4; g++) {
            const __m512i packed = load_rows4x16(rows, g, off + 2);
            const __m512i lo = _mm512_and_si512(packed, low4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
            s[g] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, lo, x0), hi, x1);
        }
        const __m512 dd = _mm512_mul_ps(row_scales16(ptrs, off), _mm512_set1_ps(load_f16(&x[b].d)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(row_sums16(s)), dd, acc);
    }
    return acc;
}

typedef __m512 (*dot16_fn)(const char *const rows[LANES], const char *const next[LANES], const block_q8_0 *x, int nb);

/* rows start .. start+15 of the sequence; past its end the last row repeats
 * (a cached re-read, its lanes discarded), or NULL when pad is 0 */
static void seq_rows16(const row_seq *s, int start, int pad, const char *rows[LANES]) {
    const int len = row_seq_len(s);
    for (int k = 0; k < LANES; k++)
        rows[k] = start + k < len ? row_seq_row(s, start + k) : pad && len ? row_seq_row(s, len - 1) : NULL;
}

static void dot_seq_lanes(const row_seq *s, dot16_fn dot16, const block_q8_0 *x, int n) {
    const int len = row_seq_len(s);
    const char *rows[LANES], *next[LANES];
    seq_rows16(s, 0, 1, rows);
    for (int i0 = 0; i0 < len; i0 += LANES) {
        seq_rows16(s, i0 + LANES, 0, next);
        float res[LANES];
        _mm512_storeu_ps(res, dot16(rows, next, x, n / QK8_0));
        for (int k = 0; k < LANES && i0 + k < len; k++) *row_seq_out(s, i0 + k) = res[k];
        seq_rows16(s, i0 + LANES, 1, rows);
    }
}

static void dot_seq_q8_0(const row_seq *s, const void *x, int n) { dot_seq_lanes(s, dot16_q8_0, x, n); }
static void dot_seq_q4_0(const row_seq *s, const void *x, int n) { dot_seq_lanes(s, dot16_q4_0, x, n); }

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

static void axpy_f32(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y, int n) {
    const size_t row_bytes = (size_t)n * sizeof(float);
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, w, stride, idx, coef, count, k0);
        int i = 0;
        for (; i + 64 <= n; i += 64) {
            prefetch_step(g.rows, g.next, g.m, (size_t)i * 4, 256, PREFETCH_AXPY, row_bytes);
            __m512 y0 = _mm512_loadu_ps(y + i), y1 = _mm512_loadu_ps(y + i + 16);
            __m512 y2 = _mm512_loadu_ps(y + i + 32), y3 = _mm512_loadu_ps(y + i + 48);
            for (int r = 0; r < g.m; r++) {
                const float *wr = (const float *)g.rows[r] + i;
                const __m512 c = _mm512_set1_ps(g.coef[r]);
                y0 = _mm512_fmadd_ps(c, _mm512_loadu_ps(wr), y0);
                y1 = _mm512_fmadd_ps(c, _mm512_loadu_ps(wr + 16), y1);
                y2 = _mm512_fmadd_ps(c, _mm512_loadu_ps(wr + 32), y2);
                y3 = _mm512_fmadd_ps(c, _mm512_loadu_ps(wr + 48), y3);
            }
            _mm512_storeu_ps(y + i, y0);
            _mm512_storeu_ps(y + i + 16, y1);
            _mm512_storeu_ps(y + i + 32, y2);
            _mm512_storeu_ps(y + i + 48, y3);
        }
        for (; i < n; i += 16) {
            const __mmask16 mask = n - i >= 16 ? (__mmask16)0xffff : tail_mask16(n - i);
            __m512 acc = _mm512_maskz_loadu_ps(mask, y + i);
            for (int r = 0; r < g.m; r++)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(g.coef[r]),
                                      _mm512_maskz_loadu_ps(mask, (const float *)g.rows[r] + i), acc);
            _mm512_mask_storeu_ps(y + i, mask, acc);
        }
    }
}

static void axpy_f16(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y, int n) {
    const size_t row_bytes = (size_t)n * sizeof(uint16_t);
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, w, stride, idx, coef, count, k0);
        int i = 0;
        for (; i + 64 <= n; i += 64) {
            prefetch_step(g.rows, g.next, g.m, (size_t)i * 2, 128, PREFETCH_AXPY, row_bytes);
            __m512 y0 = _mm512_loadu_ps(y + i), y1 = _mm512_loadu_ps(y + i + 16);
            __m512 y2 = _mm512_loadu_ps(y + i + 32), y3 = _mm512_loadu_ps(y + i + 48);
            for (int r = 0; r < g.m; r++) {
                const uint16_t *wr = (const uint16_t *)g.rows[r] + i;
                const __m512 c = _mm512_set1_ps(g.coef[r]);
                y0 = _mm512_fmadd_ps(c, load_f16x16(wr), y0);
                y1 = _mm512_fmadd_ps(c, load_f16x16(wr + 16), y1);
                y2 = _mm512_fmadd_ps(c, load_f16x16(wr + 32), y2);
                y3 = _mm512_fmadd_ps(c, load_f16x16(wr + 48), y3);
            }
            _mm512_storeu_ps(y + i, y0);
            _mm512_storeu_ps(y + i + 16, y1);
            _mm512_storeu_ps(y + i + 32, y2);
            _mm512_storeu_ps(y + i + 48, y3);
        }
        for (; i < n; i += 16) {
            const __mmask16 mask = n - i >= 16 ? (__mmask16)0xffff : tail_mask16(n - i);
            __m512 acc = _mm512_maskz_loadu_ps(mask, y + i);
            for (int r = 0; r < g.m; r++) {
                const __m512 wr = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)g.rows[r] + i));
                acc = _mm512_fmadd_ps(_mm512_set1_ps(g.coef[r]), wr, acc);
            }
            _mm512_mask_storeu_ps(y + i, mask, acc);
        }
    }
}

/* 16 signed bytes to floats */
static __m512 i8x16_to_ps(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }

static void axpy_q8_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n) {
    const int nb = n / QK8_0;
    const size_t row_bytes = (size_t)nb * sizeof(block_q8_0);
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, w, stride, idx, coef, count, k0);
        for (int b = 0; b < nb; b++) {
            const size_t off = (size_t)b * sizeof(block_q8_0);
            prefetch_step(g.rows, g.next, g.m, off, sizeof(block_q8_0), PREFETCH_AXPY, row_bytes);
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

static void axpy_q4_0(const void *w, size_t stride, const int32_t *idx, const float *coef, int count, float *y,
                      int n) {
    const int nb = n / QK4_0;
    const size_t row_bytes = (size_t)nb * sizeof(block_q4_0);
    /* q - 8 for each nibble value q: vpermps reads only the low 4 bits of an index */
    const __m512 centred = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    for (int k0 = 0; k0 < count; k0 += AXPY_ROWS) {
        axpy_group g;
        axpy_group_at(&g, w, stride, idx, coef, count, k0);
        for (int b = 0; b < nb; b++) {
            const size_t off = (size_t)b * sizeof(block_q4_0);
            prefetch_step(g.rows, g.next, g.m, off, sizeof(block_q4_0), PREFETCH_AXPY, row_bytes);
            __m512 y0 = _mm512_loadu_ps(y + b * QK4_0), y1 = _mm512_loadu_ps(y + b * QK4_0 + 16);
            for (int r = 0; r < g.m; r++) {
                const block_q4_0 *blk = (const block_q4_0 *)(g.rows[r] + off);
                const __m512 cd = _mm512_set1_ps(g.coef[r] * load_f16(&blk->d));
                const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)blk->qs));
                y0 = _mm512_fmadd_ps(cd, _mm512_permutexvar_ps(bytes, centred), y0);
                y1 = _mm512_fmadd_ps(cd, _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), centred), y1);
            }
            _mm512_storeu_ps(y + b * QK4_0, y0);
            _mm512_storeu_ps(y + b * QK4_0 + 16, y1);
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

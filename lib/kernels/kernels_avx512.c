/* AVX-512 (F/BW/VL/DQ + VNNI) kernels; only reached through kernels_avx512()
 * or kernels_avx512_exact() after a CPU check. This file holds what both
 * tables share, all in llama.cpp's (build 4748, the oracle's) arithmetic at no
 * cost in speed: quantize_row_q8_0's x86 rounding, ggml_vec_dot_f32/f16's
 * summation order, and ggml_v_expf for softmax and SiLU. The tables differ
 * only in the quantized dots (kernels_fast_avx512.c, kernels_exact_avx512.c)
 * and in what must match them (the sparse gathers, the Q8_0 predictor gemv).
 * Quantization and f16/axpy results are bit-exact with the scalar reference. */
#include <math.h>

#include "kernels/dot_f16_rows_tile.h"
#include "kernels/kernels_q_avx512.h"

/* quantize_row_q8_0's x86 path: multiplier 127/amax, rounding to nearest even */
void quantize_q8_0_avx512(const float *x, block_q8_0 *y, int n) {
    for (int b = 0; b < n / QK8_0; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + b * QK8_0), v1 = _mm512_loadu_ps(x + b * QK8_0 + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const uint16_t dh = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(&y[b].d, &dh, sizeof dh);
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v0, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v1, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm_storeu_si128((__m128i *)y[b].qs, _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[b].qs + 16), _mm512_cvtsepi32_epi8(q1));
    }
}

void f32_to_f16_row_avx512(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        const __mmask16 m = tail_mask16(n - i);
        _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT));
    }
}

/* multiply then add (no FMA) so the result is bit-exact with the reference */
void axpy_f32_avx512(float *y, float a, const float *w, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_mul_ps(va, _mm512_loadu_ps(w + i))));
    if (i < n) {
        const __mmask16 m = tail_mask16(n - i);
        const __m512 sum = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, w + i)));
        _mm512_mask_storeu_ps(y + i, m, sum);
    }
}

/* ggml_vec_dot_f32/f16 (kernels_q_avx512.h: the sparse gathers share the rows) */
float dot_f32_avx512(const float *w, const float *x, int n) { return f32_row(w, x, n, NULL); }

float dot_f16_avx512(const uint16_t *w, const uint16_t *x, int n) { return f16_row(w, x, n, NULL); }

/* c[j][r] = p[r][j]: an 8x8 transpose in three rounds of shuffles (the
 * loops are unrolled so that the arrays stay in registers) */
static inline void transpose8_pd(const __m512d p[8], __m512d c[8]) {
    __m512d t[8], u[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k += 2) { /* rows k, k+1: 128-bit lane L holds column 2L (t[k]), 2L+1 (t[k+1]) */
        t[k] = _mm512_unpacklo_pd(p[k], p[k + 1]);
        t[k + 1] = _mm512_unpackhi_pd(p[k], p[k + 1]);
    }
#pragma GCC unroll 8
    for (int m = 0; m < 4; m++) { /* rows k..k+3: u[k+j] holds columns j and j+4, u[k+2+j] j+2 and j+6 */
        const int k = m / 2 * 4, j = m % 2;
        u[k + j] = _mm512_shuffle_f64x2(t[k + j], t[k + 2 + j], _MM_SHUFFLE(2, 0, 2, 0));
        u[k + 2 + j] = _mm512_shuffle_f64x2(t[k + j], t[k + 2 + j], _MM_SHUFFLE(3, 1, 3, 1));
    }
#pragma GCC unroll 8
    for (int j = 0; j < 4; j++) {
        c[j] = _mm512_shuffle_f64x2(u[j], u[4 + j], _MM_SHUFFLE(2, 0, 2, 0));
        c[j + 4] = _mm512_shuffle_f64x2(u[j], u[4 + j], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* f16_row for each row: its 64-element steps, then its leftovers' products
 * (f16_row's float products, widened exactly to double) added one by one in
 * order. At attention's n = 32 (and 96, 160...) f16_row alone is a chain of
 * dependent double adds a row; here 8 rows' chains are the lanes of one
 * vector: the products of 8 rows by 8 columns are transposed so that lane r
 * of column c holds row r's product c. Each row prefetches into L2 the one
 * F16_ROWS_AHEAD rows further (gather_ahead): attention's V rows are read
 * once per token, from memory, and only their first n of n_ctx values. */
#define F16_ROWS_AHEAD 4

void dot_f16_rows_avx512(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, int n, float *out) {
    const row_seq seq = row_seq_dense(w, row_stride * sizeof(uint16_t), rows, out);
    const int np = n & ~63, left = n - np;
    __m256 xt[8]; /* x's leftovers, 8 at a time (masked: lanes past n are 0) */
    for (int i = 0; i < left; i += 8)
        xt[i / 8] = _mm256_cvtph_ps(_mm_maskz_loadu_epi16((__mmask8)lanes_from(i, left), x + np + i));
    int r0 = 0;
    for (; left && r0 + 8 <= rows; r0 += 8) { /* no leftovers: no chains, f16_row below */
        double head[8];
        for (int r = 0; r < 8; r++)
            head[r] = f16_steps(w + (size_t)(r0 + r) * row_stride, x, np, gather_ahead(&seq, r0 + r, F16_ROWS_AHEAD));
        __m512d sum = _mm512_loadu_pd(head);
        for (int i = 0; i < left; i += 8) {
            const __mmask8 m = (__mmask8)lanes_from(i, left);
            __m512d p[8], c[8];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) {
                const uint16_t *wr = w + (size_t)(r0 + r) * row_stride + np + i;
                p[r] = _mm512_cvtps_pd(_mm256_mul_ps(_mm256_cvtph_ps(_mm_maskz_loadu_epi16(m, wr)), xt[i / 8]));
            }
            transpose8_pd(p, c);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) /* the row's own columns only, as f16_row */
                if (i + j < left) sum = _mm512_add_pd(sum, c[j]);
        }
        _mm256_storeu_ps(out + r0, _mm512_cvtpd_ps(sum));
    }
    for (; r0 < rows; r0++) out[r0] = f16_row(w + (size_t)r0 * row_stride, x, n, gather_ahead(&seq, r0, F16_ROWS_AHEAD));
}

/* dot_f16_rows_tile: each row's 64-element steps widened once and multiplied
 * into the four accumulators of each of four vectors (widened once a call
 * into scratch, [4][np]; the row is f16_steps' w, and a product's operands
 * swap without changing its bits), f16_steps' order for each pair; then each
 * row's leftovers (f16_row's float products, widened exactly to double, added
 * one by one in order) with the four vectors' chains side by side in the
 * lanes of one vector, their values transposed once a call. The 16
 * accumulators and a step's 4 row vectors fit the 32 registers (six vectors
 * a pass measured 0.82x). Rows prefetch into L2 as dot_f16_rows' do. Vectors
 * past the last group of four, and lengths under 64 (nothing to share), go
 * through dot_f16_rows. */
enum { ROWS_TILE_VECTORS = 4 };

void dot_f16_rows_tile_avx512(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, size_t x_stride,
                              int nx, int n, float *out, size_t out_stride, float *scratch) {
    const int np = n & ~63, left = n - np;
    const int tiled = np ? nx / ROWS_TILE_VECTORS * ROWS_TILE_VECTORS : 0;
    const row_seq seq = row_seq_dense(w, row_stride * sizeof(uint16_t), rows, out);
    float xt[64][ROWS_TILE_VECTORS]; /* the leftovers, column by column: [i][j] vector j's x[np + i] */
    for (int j0 = 0; j0 < tiled; j0 += ROWS_TILE_VECTORS) {
        for (int j = 0; j < ROWS_TILE_VECTORS; j++) {
            const uint16_t *xj = x + (size_t)(j0 + j) * x_stride;
            for (int i = 0; i < np; i += 16) _mm512_storeu_ps(scratch + (size_t)j * np + i, load_f16x16(xj + i));
            for (int i = 0; i < left; i++) xt[i][j] = _cvtsh_ss(xj[np + i]);
        }
        for (int r = 0; r < rows; r++) {
            const uint16_t *wr = w + (size_t)r * row_stride;
            const char *ahead = gather_ahead(&seq, r, F16_ROWS_AHEAD);
            __m512 acc[ROWS_TILE_VECTORS][4];
#pragma GCC unroll 16
            for (int j = 0; j < ROWS_TILE_VECTORS * 4; j++) acc[j / 4][j % 4] = _mm512_setzero_ps();
            for (int i = 0; i < np; i += 64) {
                prefetch_l2(ahead + (size_t)i * 2);
                prefetch_l2(ahead + (size_t)i * 2 + 64);
                __m512 wv[4];
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) wv[c] = load_f16x16(wr + i + 16 * c);
#pragma GCC unroll 16
                for (int j = 0; j < ROWS_TILE_VECTORS * 4; j++)
                    acc[j / 4][j % 4] = _mm512_fmadd_ps(
                        wv[j % 4], _mm512_loadu_ps(scratch + (size_t)(j / 4) * np + i + 16 * (j % 4)), acc[j / 4][j % 4]);
            }
            double head[ROWS_TILE_VECTORS];
#pragma GCC unroll 4
            for (int j = 0; j < ROWS_TILE_VECTORS; j++)
                head[j] = _mm512_reduce_add_ps(
                    _mm512_add_ps(_mm512_add_ps(acc[j][0], acc[j][2]), _mm512_add_ps(acc[j][1], acc[j][3])));
            __m256d sum = _mm256_loadu_pd(head);
            for (int i = 0; i < left; i++)
                sum = _mm256_add_pd(sum, _mm256_cvtps_pd(_mm_mul_ps(_mm_set1_ps(_cvtsh_ss(wr[np + i])),
                                                                    _mm_loadu_ps(xt[i]))));
            const __m128 got = _mm256_cvtpd_ps(sum);
#pragma GCC unroll 4
            for (int j = 0; j < ROWS_TILE_VECTORS; j++) out[(size_t)(j0 + j) * out_stride + (size_t)r] = got[j];
        }
    }
    dot_f16_rows_tile_by_vector(dot_f16_rows_avx512, w, row_stride, rows, x + (size_t)tiled * x_stride, x_stride,
                               nx - tiled, n, out + (size_t)tiled * out_stride, out_stride);
}

/* ggml's ggml_v_expf (AVX-512): exp to ~1.5 ulp, reproduced bit for bit */
static __m512 ggml_expf16(__m512 x) {
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 nn = _mm512_sub_ps(z, r);
    const __m512 b = _mm512_fnmadd_ps(nn, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(nn, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 d = _mm512_cmp_ps_mask(_mm512_abs_ps(nn), _mm512_set1_ps(192), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 res = _mm512_scalef_ps(j, nn);
    if (_mm512_kortestz(d, d)) return res;
    const __m512 zero = _mm512_setzero_ps();
    const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(nn, zero, _CMP_LE_OQ), _mm512_set1_ps(INFINITY), zero);
    return _mm512_mask_blend_ps(d, res, alt);
}

double softmax_exp_avx512(float *y, const float *x, float max, int n) {
    double sum = 0;
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = lanes_from(i, n);
        const __m512 v = _mm512_maskz_mov_ps(m, ggml_expf16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_set1_ps(max))));
        _mm512_mask_storeu_ps(y + i, m, v);
        sum += (double)_mm512_reduce_add_ps(v);
    }
    return sum;
}

/* the tail is masked, not left to libm: every element goes through the same
 * exp, so a neuron's value does not depend on where a thread's range starts */
void silu_mul_avx512(float *h, const float *g, const float *u, int n) {
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = lanes_from(i, n);
        const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 e = ggml_expf16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        const __m512 s = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

#define SHARED_AVX512_KERNELS                   \
    .dot_f32 = dot_f32_avx512,                  \
    .dot_f16 = dot_f16_avx512,                  \
    .dot_f16_rows = dot_f16_rows_avx512,        \
    .dot_f16_rows_tile = dot_f16_rows_tile_avx512, \
    .quantize_q8_0 = quantize_q8_0_avx512,      \
    .f32_to_f16_row = f32_to_f16_row_avx512,    \
    .axpy_f32 = axpy_f32_avx512,                \
    .softmax_exp = softmax_exp_avx512,          \
    .silu_mul = silu_mul_avx512,                \
    .sparse = &sparse_avx512_impl,              \
    .pred_gemv_f16 = pred_gemv_f16_avx512,      \
    .lanesum64 = lanesum64_avx512

/* the default order; gemv_q4_0 prefetching into L2 or as one stream into L1 (kernels.c picks by CPU) */
#define FAST_AVX512_KERNELS(gemv_q4)                                                 \
    .name = "avx512", SHARED_AVX512_KERNELS, .dot_q8_0 = dot_q8_0_fast_avx512,      \
    .dot_q4_0 = dot_q4_0_fast_avx512, .gemv_q4_0 = gemv_q4, .gemv_q8_0 = gemv_q8_0_fast_avx512, \
    .gemm_q4_0 = gemm_q4_0_avx512, .gemm_f32 = gemm_f32_avx512, .gemm_f16 = gemm_f16_avx512, \
    .gather = &sparse_avx512_impl, /* its dots are the fast order's (kernels_q_avx512.h) */ \
    .pred_gemv_q8_0 = pred_gemv_q8_0_avx512

const kernels kernels_avx512_impl = {FAST_AVX512_KERNELS(gemv_q4_0_fast_avx512)};
const kernels kernels_avx512_stream_impl = {FAST_AVX512_KERNELS(gemv_q4_0_fast_stream_avx512)};

const kernels kernels_avx512_exact_impl = {
    .name = "avx512-exact",
    SHARED_AVX512_KERNELS,
    .dot_q8_0 = dot_q8_0_exact_avx512,
    .dot_q4_0 = dot_q4_0_exact_avx512,
    .gemv_q4_0 = gemv_q4_0_exact_avx512,
    .gemm_q4_0 = gemm_q4_0_avx512,
    .gemm_f32 = gemm_f32_avx512,
    .gemm_f16 = gemm_f16_avx512,
    /* no gather: the sparse dots follow the fast order; no Q8_0 predictor
     * gemv: it gives the fast dot_q8_0's bits */
};

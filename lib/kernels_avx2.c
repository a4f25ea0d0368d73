/* AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c; only reached
 * through kernels_avx2() after a CPU check). Quantization and f16/axpy results
 * are bit-exact with the scalar reference; dot products differ only in float
 * summation order. */
#include <immintrin.h>
#include <string.h>

#include "f16.h"
#include "kernels.h"

static float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

static float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float dot_f32_avx2(const float *w, const float *x, int n) {
    /* four named accumulators hide the FMA latency (an array would live in memory) */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc0);
    float sum = hsum256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += w[i] * x[i];
    return sum;
}

static __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static float dot_f16_avx2(const uint16_t *w, const uint16_t *x, int n) {
    /* four named accumulators hide the FMA latency (an array would live in memory) */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
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
    /* maddubs wants one unsigned operand: move a's sign onto b */
    const __m256i abs_a = _mm256_sign_epi8(a, a), b_signed = _mm256_sign_epi8(b, a);
    const __m256i pairs = _mm256_maddubs_epi16(abs_a, b_signed);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

static float dot_q8_0_avx2(const block_q8_0 *w, const block_q8_0 *x, int n) {
    const int nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        const __m256 d0 = _mm256_set1_ps(load_f16(&w[b].d) * load_f16(&x[b].d));
        const __m256 d1 = _mm256_set1_ps(load_f16(&w[b + 1].d) * load_f16(&x[b + 1].d));
        acc0 = _mm256_fmadd_ps(d0, dot_i8x32(_mm256_loadu_si256((const __m256i *)w[b].qs),
                                             _mm256_loadu_si256((const __m256i *)x[b].qs)), acc0);
        acc1 = _mm256_fmadd_ps(d1, dot_i8x32(_mm256_loadu_si256((const __m256i *)w[b + 1].qs),
                                             _mm256_loadu_si256((const __m256i *)x[b + 1].qs)), acc1);
    }
    if (b < nb) {
        const __m256 d = _mm256_set1_ps(load_f16(&w[b].d) * load_f16(&x[b].d));
        acc0 = _mm256_fmadd_ps(d, dot_i8x32(_mm256_loadu_si256((const __m256i *)w[b].qs),
                                            _mm256_loadu_si256((const __m256i *)x[b].qs)), acc0);
    }
    return hsum256(_mm256_add_ps(acc0, acc1));
}

/* the 32 quants of a Q4_0 block minus 8, in element order, as signed bytes */
static __m256i unpack_q4_0(const uint8_t *qs) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0f)), _mm256_set1_epi8(8));
}

static float dot_q4_0_avx2(const block_q4_0 *w, const block_q8_0 *x, int n) {
    const int nb = n / QK4_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        const __m256 d0 = _mm256_set1_ps(load_f16(&w[b].d) * load_f16(&x[b].d));
        const __m256 d1 = _mm256_set1_ps(load_f16(&w[b + 1].d) * load_f16(&x[b + 1].d));
        acc0 = _mm256_fmadd_ps(d0, dot_i8x32(unpack_q4_0(w[b].qs), _mm256_loadu_si256((const __m256i *)x[b].qs)), acc0);
        acc1 = _mm256_fmadd_ps(d1, dot_i8x32(unpack_q4_0(w[b + 1].qs),
                                             _mm256_loadu_si256((const __m256i *)x[b + 1].qs)), acc1);
    }
    if (b < nb) {
        const __m256 d = _mm256_set1_ps(load_f16(&w[b].d) * load_f16(&x[b].d));
        acc0 = _mm256_fmadd_ps(d, dot_i8x32(unpack_q4_0(w[b].qs), _mm256_loadu_si256((const __m256i *)x[b].qs)), acc0);
    }
    return hsum256(_mm256_add_ps(acc0, acc1));
}

/* AVX2 has no cheaper multi-row form: the per-block work is all weight-side */
static void gemv_q4_0_avx2(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n) {
    for (int r = 0; r < nrows; r++)
        y[r] = dot_q4_0_avx2((const block_q4_0 *)((const char *)w + (size_t)r * row_stride), x, n);
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
    .dot_q8_0 = dot_q8_0_avx2,
    .dot_q4_0 = dot_q4_0_avx2,
    .quantize_q8_0 = quantize_q8_0_avx2,
    .f32_to_f16_row = f32_to_f16_row_avx2,
    .axpy_f32 = axpy_f32_avx2,
    .gemv_q4_0 = gemv_q4_0_avx2,
    .softmax_exp = softmax_exp_ref,
    .silu_mul = silu_mul_ref,
};

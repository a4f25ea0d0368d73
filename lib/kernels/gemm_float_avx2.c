/* The float product on AVX2 (gemm.h, blocked as gemm_float_block.h says): a
 * row against 6 tokens at a time, each (row, token) accumulator the
 * reference's 16 lanes held in two ymm halves, so a weight vector is loaded
 * once for 6 tokens. The lanes are summed in _mm512_reduce_add_ps's order,
 * so the bits are the reference's; a last part of n % 16 columns is added
 * lane by lane. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "gguf/f16.h"
#include "kernels/gemm.h"
#include "kernels/gemm_float_block.h"

#define INLINE static inline __attribute__((always_inline))
/* the register block's loops unrolled, so its accumulators stay in registers */
#define UNROLL _Pragma("GCC unroll 8")

/* acc[t * 16] += w . xs[t] for t < nt over kc columns (xs: packed, GF_CHUNK apart) */
INLINE void block(const float *w, const float *xs, int kc, float *acc, int nt) {
    __m256 lo[GF_TOKENS], hi[GF_TOKENS];
    UNROLL
    for (int t = 0; t < nt; t++) {
        lo[t] = _mm256_load_ps(acc + t * 16);
        hi[t] = _mm256_load_ps(acc + t * 16 + 8);
    }
    int k = 0;
    for (; k + 16 <= kc; k += 16) {
        const __m256 w0 = _mm256_load_ps(w + k), w1 = _mm256_load_ps(w + k + 8);
        UNROLL
        for (int t = 0; t < nt; t++) {
            lo[t] = _mm256_fmadd_ps(w0, _mm256_load_ps(xs + t * GF_CHUNK + k), lo[t]);
            hi[t] = _mm256_fmadd_ps(w1, _mm256_load_ps(xs + t * GF_CHUNK + k + 8), hi[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++) {
        _mm256_store_ps(acc + t * 16, lo[t]);
        _mm256_store_ps(acc + t * 16 + 8, hi[t]);
        for (int i = k; i < kc; i++) acc[t * 16 + (i - k)] = fmaf(w[i], xs[t * GF_CHUNK + i], acc[t * 16 + (i - k)]);
    }
}

/* kc F16 values widened into dst */
static void widen_f16(float *dst, const uint16_t *h, int kc) {
    int k = 0;
    for (; k + 8 <= kc; k += 8) _mm256_store_ps(dst + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + k))));
    for (; k < kc; k++) dst[k] = f16_to_f32(h[k]);
}

/* _mm512_reduce_add_ps's order (gemm.h) on the two halves */
static float reduce16(const float *a) {
    const __m256 h8 = _mm256_add_ps(_mm256_load_ps(a + 8), _mm256_load_ps(a));
    const __m128 h4 = _mm_add_ps(_mm256_extractf128_ps(h8, 1), _mm256_castps256_ps128(h8));
    const __m128 h2 = _mm_add_ps(_mm_movehl_ps(h4, h4), h4); /* h4[0] + h4[2], h4[1] + h4[3] */
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}

#include "kernels/gemm_float_rows.h"
#include "kernels/gemm_float_drive.h"

GEMM_FLOAT_ENTRIES(avx2)

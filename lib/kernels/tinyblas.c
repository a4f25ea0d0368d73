/* tinyBLAS order, scalar reference (baseline x86-64: fmaf is libm's, exact),
 * and the run-time choice. */
#include "kernels/tinyblas.h"

#include <math.h>

#include "gguf/f16.h"
#include "kernels/kernels.h"

/* defined in tinyblas_avx512.c */
extern const tinyblas_kernels tinyblas_avx512_impl;

/* GCC's _mm512_reduce_add_ps: upper 256 bits onto the lower, then 128, then
 * lanes 2,3 onto 0,1, then lane 1 onto lane 0 */
static float reduce16(const float *a) {
    float h8[8], h4[4];
    for (int i = 0; i < 8; i++) h8[i] = a[i + 8] + a[i];
    for (int i = 0; i < 4; i++) h4[i] = h8[i + 4] + h8[i];
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

static float dot_f32_scalar(const float *a, const float *b, int k) {
    float acc[16] = {0};
    for (int l = 0; l < k; l += 16)
        for (int i = 0; i < 16; i++) acc[i] = fmaf(a[l + i], b[l + i], acc[i]);
    return reduce16(acc);
}

static float dot_f16_scalar(const uint16_t *a, const uint16_t *b, int k) {
    float acc[16] = {0};
    for (int l = 0; l < k; l += 16)
        for (int i = 0; i < 16; i++) acc[i] = fmaf(f16_to_f32(a[l + i]), f16_to_f32(b[l + i]), acc[i]);
    return reduce16(acc);
}

static const tinyblas_kernels tinyblas_scalar_impl = {"scalar", dot_f32_scalar, dot_f16_scalar};

const tinyblas_kernels *tinyblas_scalar(void) { return &tinyblas_scalar_impl; }

/* the AVX-512 file is compiled with kernels_avx512()'s flags, so it needs that CPU
 * check (and exists only on x86-64) */
#if defined(__x86_64__)
const tinyblas_kernels *tinyblas_avx512(void) { return kernels_avx512() ? &tinyblas_avx512_impl : NULL; }
#else
const tinyblas_kernels *tinyblas_avx512(void) { return NULL; }
#endif

const tinyblas_kernels *tinyblas_best(void) {
    const tinyblas_kernels *t = tinyblas_avx512();
    return t ? t : tinyblas_scalar();
}

bool tinyblas_takes(long m, long n, long k) { return n >= 2 && k % 16 == 0 && m % 4 == 0; }

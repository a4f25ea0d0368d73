/* llamafile's tinyBLAS summation order: llama.cpp (build 4748) runs the F32
 * and F16 matrix products of a prompt batch through it (ggml-cpu/llamafile/
 * sgemm.cpp) instead of ggml's vec_dot. Each output element is one 16-lane
 * accumulator fused-multiply-added over k in steps of 16 (F16 operands
 * widened to F32), then summed across lanes as GCC's _mm512_reduce_add_ps
 * does. pi2 uses it only to show agreement with llama.cpp (engine.h's llama
 * compatibility); the product's own order is the kernels' (kernels.h).
 *
 * Errors: none: tinyblas_avx512 is NULL where the CPU cannot run it, and the
 * dots trust k to be a multiple of 16. */
#ifndef PI2_TINYBLAS_H
#define PI2_TINYBLAS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *name; /* "scalar", "avx512" */
    /* k: a multiple of 16 */
    float (*dot_f32)(const float *a, const float *b, int k);
    float (*dot_f16)(const uint16_t *a, const uint16_t *b, int k);
} tinyblas_kernels;

const tinyblas_kernels *tinyblas_scalar(void); /* the reference */
const tinyblas_kernels *tinyblas_avx512(void); /* NULL if this CPU cannot run kernels_avx512() */
const tinyblas_kernels *tinyblas_best(void);

/* Whether llama.cpp hands an m x k (weight rows x columns) by n (tokens)
 * product to tinyBLAS on AVX-512: only for batches (n >= 2), and tinyBLAS
 * refuses k % 16 != 0 and m % 4 != 0; otherwise ggml's vec_dot runs. */
bool tinyblas_takes(long m, long n, long k);

#endif

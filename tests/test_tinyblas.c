/* tinyBLAS order (lib/kernels/tinyblas.h): the AVX-512 dots equal the scalar
 * reference bit for bit, the reference is a dot product (against a double
 * sum), and its summation order is tinyBLAS's, not ggml's vec_dot one. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gguf/f16.h"
#include "kernels/kernels.h"
#include "rng.h"
#include "kernels/tinyblas.h"
#include "test.h"

static int bits_equal(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

int main(void) {
    enum { MAX_K = 1024 };
    static float a[MAX_K], b[MAX_K];
    static uint16_t ah[MAX_K], bh[MAX_K];
    const tinyblas_kernels *ref = tinyblas_scalar(), *simd = tinyblas_avx512();
    CHECK(tinyblas_best() == (simd ? simd : ref), "tinyblas_best is not the fastest this CPU runs");
    if (!simd) SKIP("kernel set avx512 (this CPU lacks it)");
    int same32 = 1, same16 = 1, close = 1;
    rng_seed(12345);
    for (int k = 16; k <= MAX_K; k += 16) {
        for (int i = 0; i < k; i++) {
            a[i] = rng_uniform() * (i % 7 ? 1.0f : 100.0f); /* mixed magnitudes, so the order shows */
            b[i] = rng_uniform();
            ah[i] = f32_to_f16(a[i]);
            bh[i] = f32_to_f16(b[i]);
        }
        const float r32 = ref->dot_f32(a, b, k), r16 = ref->dot_f16(ah, bh, k);
        double want = 0, want16 = 0, mag = 0;
        for (int i = 0; i < k; i++) {
            want += (double)a[i] * b[i];
            want16 += (double)f16_to_f32(ah[i]) * f16_to_f32(bh[i]);
            mag += fabs((double)a[i] * b[i]);
        }
        close &= fabs(r32 - want) <= 1e-6 * mag && fabs(r16 - want16) <= 1e-6 * mag;
        if (simd) {
            same32 &= bits_equal(simd->dot_f32(a, b, k), r32);
            same16 &= bits_equal(simd->dot_f16(ah, bh, k), r16);
        }
    }
    CHECK(close, "the reference dots are not dot products");
    CHECK(same32, "tinyblas avx512 dot_f32 differs from the reference");
    CHECK(same16, "tinyblas avx512 dot_f16 differs from the reference");

    /* the order itself: lane 0 sums elements 0, 16, 32, 48 one after the
     * other, so 1e8 (float spacing 8 there) absorbs each 3 in turn; ggml's
     * vec_dot adds 3 + 3 in another accumulator first, and 1e8 + 6 rounds up. */
    float big[64] = {0}, ones[64];
    for (int i = 0; i < 64; i++) ones[i] = 1.0f;
    big[0] = 1e8f, big[16] = big[32] = big[48] = 3.0f;
    CHECK(ref->dot_f32(big, ones, 64) == 1e8f, "tinyBLAS order: %.1f", ref->dot_f32(big, ones, 64));
    const kernels *ggml = kernels_avx512_exact();
    if (ggml) CHECK(ggml->dot_f32(big, ones, 64) == 1e8f + 8.0f, "ggml order: %.1f", ggml->dot_f32(big, ones, 64));

    CHECK(tinyblas_takes(64, 2, 64) && !tinyblas_takes(64, 1, 64), "tinyBLAS takes batches only");
    CHECK(!tinyblas_takes(64, 8, 172) && !tinyblas_takes(6, 8, 64), "tinyBLAS refuses k %% 16 or m %% 4");
    return test_summary();
}

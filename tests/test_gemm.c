/* The prefill product (lib/kernels/gemm.h): the scalar reference against a
 * hand-computed block and against the dequantized product in double; every
 * kernel set's gemm_q4_0 (the neon ones with and without SDOT too) against
 * the reference bit for bit on odd shapes
 * (token counts 1-33 around the 16-token tiles, row counts around the
 * 16-row tiles, 1 to 130 blocks), cells outside the output untouched; and a
 * token's bits the same whatever tile or call it is packed in. The float
 * products (F32, F16) likewise, their reference against tinyBLAS's
 * (lib/kernels/tinyblas.h, the order llama.cpp's prompt batches take) and
 * against the product in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/f16.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/tinyblas.h"
#include "rng.h"
#include "test.h"

#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))
#define UNTOUCHED 12345.0f

typedef struct {
    int nrows, nb, n_tok;
    size_t row_stride;
    uint8_t *w;
    block_q8_0 *x8;
    const block_q8_0 **xs;
    gemm_acts acts;
    void *scratch;
} problem;

static void problem_make(problem *p, int nrows, int nb, int n_tok) {
    const int n = nb * 32;
    p->nrows = nrows, p->nb = nb, p->n_tok = n_tok;
    p->row_stride = (size_t)(nb + 1) * sizeof(block_q4_0); /* rows apart by more than their length */
    p->w = malloc(p->row_stride * (size_t)nrows);
    p->x8 = malloc(sizeof(block_q8_0) * (size_t)nb * (size_t)n_tok);
    p->xs = malloc(sizeof *p->xs * (size_t)n_tok);
    float *row = malloc(sizeof(float) * (size_t)n);
    for (int r = 0; r < nrows; r++) {
        rng_fill(row, n);
        quantize_row_q4_0_ref(row, (block_q4_0 *)(p->w + (size_t)r * p->row_stride), n);
    }
    for (int t = 0; t < n_tok; t++) {
        rng_fill(row, n);
        quantize_row_q8_0_ref(row, p->x8 + (size_t)t * nb, n);
        p->xs[t] = p->x8 + (size_t)t * nb;
    }
    free(row);
    if (gemm_acts_init(&p->acts, n_tok, n)) abort();
    gemm_acts_pack(&p->acts, p->xs, n_tok, n);
    p->scratch = aligned_alloc(64, (gemm_scratch_bytes(nb) + 63) / 64 * 64);
}

static void problem_free(problem *p) {
    gemm_acts_free(&p->acts);
    free(p->w);
    free(p->x8);
    free(p->xs);
    free(p->scratch);
}

static const block_q4_0 *weights(const problem *p) { return (const block_q4_0 *)p->w; }

/* a 1-row, 1-block, 1-token product worked by hand: weights q = 0..15, 15..0
 * (w = d*(q-8)), activations x_i = i - 16, scales 0.5 and 0.75: the block's
 * integer sum is sum_{i<16} (i - 8)(i - 16) + sum_{j<16} (7 - j) j
 * = 408 - 400 = 8, times 0.375 = 3 */
static void test_known_block(void) {
    block_q4_0 w;
    w.d = f32_to_f16(0.5f);
    for (int i = 0; i < 16; i++) w.qs[i] = (uint8_t)(i | ((15 - i) << 4));
    block_q8_0 x;
    x.d = f32_to_f16(0.75f);
    for (int i = 0; i < 32; i++) x.qs[i] = (int8_t)(i - 16);
    const block_q8_0 *xs[1] = {&x};
    gemm_acts a;
    CHECK(gemm_acts_init(&a, 1, 32) == 0, "gemm_acts_init failed");
    gemm_acts_pack(&a, xs, 1, 32);
    float y = 0;
    gemm_q4_0_ref(&w, sizeof w, 1, &a, &y, 1, NULL);
    CHECK(y == 3.0f, "hand-worked block: got %g, want 3", y);
    gemm_acts_free(&a);
}

/* the reference is the product of the dequantized values: within a few float
 * roundings of the sum in double */
static void test_reference_vs_double(void) {
    problem p;
    problem_make(&p, 5, 130, 7);
    float *y = malloc(sizeof(float) * 5 * 7), *wd = malloc(sizeof(float) * 130 * 32),
          *xd = malloc(sizeof(float) * 130 * 32);
    gemm_q4_0_ref(weights(&p), p.row_stride, 5, &p.acts, y, 5, NULL);
    double worst = 0;
    for (int r = 0; r < 5; r++) {
        dequantize_row(GGML_TYPE_Q4_0, p.w + (size_t)r * p.row_stride, wd, 130 * 32);
        for (int t = 0; t < 7; t++) {
            dequantize_row(GGML_TYPE_Q8_0, p.xs[t], xd, 130 * 32);
            double want = 0, scale = 0;
            for (int i = 0; i < 130 * 32; i++) want += (double)wd[i] * xd[i], scale += fabs((double)wd[i] * xd[i]);
            const double err = fabs(y[t * 5 + r] - want) / (scale + 1e-30);
            if (err > worst) worst = err;
        }
    }
    CHECK(worst < 1e-5, "reference vs dequantized product in double: relative error %g", worst);
    free(y), free(wd), free(xd);
    problem_free(&p);
}

/* set k's gemm_q4_0 equals the reference on every cell, and writes nothing else */
static void test_set(const kernels *k) {
    const int row_counts[] = {1, 3, 15, 16, 17, 33, 40};
    const int block_counts[] = {1, 2, 3, 5, 130};
    const int max_tok = 33;
    for (int ri = 0; ri < COUNT(row_counts); ri++)
        for (int bi = 0; bi < COUNT(block_counts); bi++) {
            const int nrows = row_counts[ri], nb = block_counts[bi];
            problem p;
            problem_make(&p, nrows, nb, max_tok);
            const size_t y_stride = (size_t)nrows + 3;
            float *want = malloc(sizeof(float) * y_stride * max_tok), *got = malloc(sizeof(float) * y_stride * max_tok);
            int bad_tokens = 0, touched = 0, differ = 0;
            for (int n_tok = 1; n_tok <= max_tok; n_tok++) {
                gemm_acts_pack(&p.acts, p.xs, n_tok, nb * 32);
                for (size_t i = 0; i < y_stride * max_tok; i++) want[i] = got[i] = UNTOUCHED;
                gemm_q4_0_ref(weights(&p), p.row_stride, nrows, &p.acts, want, y_stride, NULL);
                k->gemm_q4_0(weights(&p), p.row_stride, nrows, &p.acts, got, y_stride, p.scratch);
                int d = 0;
                for (int t = 0; t < max_tok; t++)
                    for (size_t r = 0; r < y_stride; r++) {
                        const size_t i = (size_t)t * y_stride + r;
                        if (t >= n_tok || r >= (size_t)nrows) touched += got[i] != UNTOUCHED;
                        else d += memcmp(&got[i], &want[i], sizeof(float)) != 0;
                    }
                differ += d;
                bad_tokens += d != 0;
            }
            CHECK(differ == 0, "%s gemm_q4_0 rows=%d blocks=%d: %d cells differ from the reference (%d token counts)",
                  k->name, nrows, nb, differ, bad_tokens);
            CHECK(touched == 0, "%s gemm_q4_0 rows=%d blocks=%d: %d cells written outside the output", k->name, nrows,
                  nb, touched);
            free(want), free(got);
            problem_free(&p);
        }
}

/* a token's values do not depend on the call it comes in: tokens 5..24 packed
 * alone (other tiles, other slots in them) give the bits they have among 0..24 */
static void test_token_independence(const kernels *k) {
    problem p;
    problem_make(&p, 37, 9, 25);
    float *all = malloc(sizeof(float) * 37 * 25), *part = malloc(sizeof(float) * 37 * 20);
    k->gemm_q4_0(weights(&p), p.row_stride, 37, &p.acts, all, 37, p.scratch);
    gemm_acts_pack(&p.acts, p.xs + 5, 20, 9 * 32);
    k->gemm_q4_0(weights(&p), p.row_stride, 37, &p.acts, part, 37, p.scratch);
    CHECK(memcmp(all + 5 * 37, part, sizeof(float) * 37 * 20) == 0,
          "%s gemm_q4_0: tokens 5..24 alone differ from the same tokens in a call of 25", k->name);
    free(all), free(part);
    problem_free(&p);
}

/* ---- F32 / F16 weights ---- */

typedef struct {
    int nrows, n, n_tok;
    size_t row_stride; /* bytes */
    float *w32, *x32;  /* F16 problems: the same values rounded to F16 */
    uint16_t *w16, *x16;
    const float **xs32;
    const uint16_t **xs16;
    void *scratch;
} float_problem;

static void float_problem_make(float_problem *p, int nrows, int n, int n_tok) {
    p->nrows = nrows, p->n = n, p->n_tok = n_tok;
    const size_t stride = (size_t)n + 5; /* rows apart by more than their length, not 64-byte aligned */
    p->row_stride = stride;
    p->w32 = malloc(sizeof(float) * stride * (size_t)nrows);
    p->w16 = malloc(sizeof(uint16_t) * stride * (size_t)nrows);
    p->x32 = malloc(sizeof(float) * (size_t)n * (size_t)n_tok);
    p->x16 = malloc(sizeof(uint16_t) * (size_t)n * (size_t)n_tok);
    p->xs32 = malloc(sizeof *p->xs32 * (size_t)n_tok);
    p->xs16 = malloc(sizeof *p->xs16 * (size_t)n_tok);
    rng_fill(p->w32, (int)(stride * (size_t)nrows));
    rng_fill(p->x32, n * n_tok);
    for (size_t i = 0; i < stride * (size_t)nrows; i++) p->w16[i] = f32_to_f16(p->w32[i]);
    for (size_t i = 0; i < (size_t)n * (size_t)n_tok; i++) p->x16[i] = f32_to_f16(p->x32[i]);
    for (int t = 0; t < n_tok; t++) {
        p->xs32[t] = p->x32 + (size_t)t * (size_t)n;
        p->xs16[t] = p->x16 + (size_t)t * (size_t)n;
    }
    p->scratch = aligned_alloc(64, (gemm_float_scratch_bytes(n) + 63) / 64 * 64);
}

static void float_problem_free(float_problem *p) {
    free(p->w32), free(p->w16), free(p->x32), free(p->x16), free(p->xs32), free(p->xs16), free(p->scratch);
}

static void float_product(const float_problem *p, bool f16, gemm_f32_fn f32_fn, gemm_f16_fn f16_fn, int n_tok,
                          float *y, size_t y_stride) {
    if (f16) f16_fn(p->w16, p->row_stride * sizeof(uint16_t), p->nrows, p->xs16, n_tok, p->n, y, y_stride, p->scratch);
    else f32_fn(p->w32, p->row_stride * sizeof(float), p->nrows, p->xs32, n_tok, p->n, y, y_stride, p->scratch);
}

/* the reference is tinyBLAS's dot where tinyBLAS takes the shape (n % 16 == 0),
 * and within a few roundings of the product in double everywhere */
static void test_float_reference(void) {
    const int ns[] = {16, 48, 1040, 7, 100};
    for (int f16 = 0; f16 < 2; f16++)
        for (int ni = 0; ni < COUNT(ns); ni++) {
            float_problem p;
            float_problem_make(&p, 3, ns[ni], 4);
            float y[12];
            float_product(&p, f16, gemm_f32_ref, gemm_f16_ref, 4, y, 3);
            int differ = 0;
            double worst = 0;
            for (int r = 0; r < 3; r++)
                for (int t = 0; t < 4; t++) {
                    const size_t w0 = (size_t)r * p.row_stride, x0 = (size_t)t * (size_t)p.n;
                    if (p.n % 16 == 0) {
                        const float tb = f16 ? tinyblas_scalar()->dot_f16(p.w16 + w0, p.x16 + x0, p.n)
                                             : tinyblas_scalar()->dot_f32(p.w32 + w0, p.x32 + x0, p.n);
                        differ += memcmp(&tb, &y[t * 3 + r], sizeof tb) != 0;
                    }
                    double want = 0, scale = 0;
                    for (int i = 0; i < p.n; i++) {
                        const double a = f16 ? f16_to_f32(p.w16[w0 + i]) : p.w32[w0 + i];
                        const double b = f16 ? f16_to_f32(p.x16[x0 + i]) : p.x32[x0 + i];
                        want += a * b, scale += fabs(a * b);
                    }
                    const double err = fabs(y[t * 3 + r] - want) / (scale + 1e-30);
                    if (err > worst) worst = err;
                }
            CHECK(differ == 0, "gemm_%s_ref n=%d: %d values differ from tinyBLAS's dot", f16 ? "f16" : "f32", p.n,
                  differ);
            CHECK(worst < 1e-5, "gemm_%s_ref n=%d vs the product in double: relative error %g", f16 ? "f16" : "f32",
                  p.n, worst);
            float_problem_free(&p);
        }
}

/* set k's float products equal the reference on every cell for every token
 * count (a token's values are its own, so the reference for max_tok tokens
 * holds for each prefix), and write nothing else */
static void test_float_set(const kernels *k) {
    const int row_counts[] = {1, 3, 4, 5, 31, 32, 33, 70};
    const int col_counts[] = {1, 15, 16, 17, 100, 512, 513, 1040};
    const int max_tok = 33;
    for (int f16 = 0; f16 < 2; f16++)
        for (int ri = 0; ri < COUNT(row_counts); ri++)
            for (int ci = 0; ci < COUNT(col_counts); ci++) {
                const int nrows = row_counts[ri], n = col_counts[ci];
                float_problem p;
                float_problem_make(&p, nrows, n, max_tok);
                const size_t y_stride = (size_t)nrows + 3, cells = y_stride * max_tok;
                float *want = malloc(sizeof(float) * cells), *got = malloc(sizeof(float) * cells);
                float_product(&p, f16, gemm_f32_ref, gemm_f16_ref, max_tok, want, y_stride);
                int differ = 0, touched = 0;
                for (int n_tok = 1; n_tok <= max_tok; n_tok += n_tok < 14 ? 1 : 19) {
                    for (size_t i = 0; i < cells; i++) got[i] = UNTOUCHED;
                    float_product(&p, f16, k->gemm_f32, k->gemm_f16, n_tok, got, y_stride);
                    for (int t = 0; t < max_tok; t++)
                        for (size_t r = 0; r < y_stride; r++) {
                            const size_t i = (size_t)t * y_stride + r;
                            if (t >= n_tok || r >= (size_t)nrows) touched += got[i] != UNTOUCHED;
                            else differ += memcmp(&got[i], &want[i], sizeof(float)) != 0;
                        }
                }
                CHECK(differ == 0, "%s gemm_%s rows=%d cols=%d: %d cells differ from the reference", k->name,
                      f16 ? "f16" : "f32", nrows, n, differ);
                CHECK(touched == 0, "%s gemm_%s rows=%d cols=%d: %d cells written outside the output", k->name,
                      f16 ? "f16" : "f32", nrows, n, touched);
                free(want), free(got);
                float_problem_free(&p);
            }
}

int main(void) {
    rng_seed(0x9e3779b97f4a7c15ull);
    test_known_block();
    test_reference_vs_double();
    test_float_reference();
    const kernels *sets[] = {kernels_scalar(), kernels_avx2(), kernels_avx512(),
                             kernels_amx(),    kernels_neon(), kernels_neon_without_sdot()};
    const char *names[] = {"scalar", "avx2", "avx512", "amx", "neon", "neon without SDOT"};
    for (int i = 0; i < COUNT(sets); i++) {
        const kernels *k = sets[i];
        if (!k) {
            SKIP("kernel set %s (this CPU lacks it)", names[i]);
            continue;
        }
        test_set(k);
        test_token_independence(k);
        test_float_set(k);
    }
    return test_summary();
}

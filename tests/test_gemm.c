/* The prefill product (lib/kernels/gemm.h): the scalar reference against a
 * hand-computed block and against the dequantized product in double; every
 * kernel set's gemm_q4_0 against the reference bit for bit on odd shapes
 * (token counts 1-33 around the 16-token tiles, row counts around the
 * 16-row tiles, 1 to 130 blocks), cells outside the output untouched; and a
 * token's bits the same whatever tile or call it is packed in. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/f16.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
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

int main(void) {
    rng_seed(0x9e3779b97f4a7c15ull);
    test_known_block();
    test_reference_vs_double();
    const char *names[] = {"scalar", "avx2", "avx512", "amx"};
    for (int i = 0; i < COUNT(names); i++) {
        const kernels *k = kernels_by_name(names[i]);
        if (!k) {
            printf("kernel set %s: this CPU cannot run it, skipped\n", names[i]);
            continue;
        }
        test_set(k);
        test_token_independence(k);
    }
    return test_summary();
}

/* Kernel tests: the scalar reference is checked against hand-computed values
 * and double-precision arithmetic; every SIMD kernel set this CPU can run is
 * checked against the scalar reference on random data of many lengths. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ops.h"
#include "gguf/f16.h"
#include "kernels/kernels.h"
#include "rng.h"
#include "test.h"

static uint16_t block_d(const void *block) { /* the f16 scale at the start of a block */
    uint16_t h;
    memcpy(&h, block, sizeof h);
    return h;
}

/* ---- the reference itself, against independent values ---- */

static void test_f16_known_values(void) {
    CHECK(f32_to_f16(1.0f) == 0x3c00, "1.0 -> %#x", f32_to_f16(1.0f));
    CHECK(f32_to_f16(-2.0f) == 0xc000, "-2.0 -> %#x", f32_to_f16(-2.0f));
    CHECK(f32_to_f16(65504.0f) == 0x7bff, "65504 -> %#x", f32_to_f16(65504.0f));
    CHECK(f32_to_f16(65520.0f) == 0x7c00, "65520 (halfway to 2^16) rounds to inf, got %#x", f32_to_f16(65520.0f));
    CHECK(f32_to_f16(ldexpf(1.0f, -24)) == 0x0001, "2^-24 is the smallest subnormal");
    CHECK(f32_to_f16(ldexpf(1.0f, -25)) == 0x0000, "2^-25 ties to even 0");
    CHECK(f32_to_f16(ldexpf(3.0f, -25)) == 0x0002, "1.5 * 2^-24 ties to even 2");
    CHECK(f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00, "1 + half an ulp ties to even 1.0");
    CHECK(f32_to_f16(1.0f + ldexpf(3.0f, -11)) == 0x3c02, "1 + 1.5 ulp ties to even 1 + 2 ulp");
    CHECK(f16_to_f32(0x0001) == ldexpf(1.0f, -24), "0x0001 -> 2^-24");
    CHECK(f16_to_f32(0x7bff) == 65504.0f, "0x7bff -> 65504");
    CHECK(f16_to_f32(0xb800) == -0.5f, "0xb800 -> -0.5");
}

static void test_dequantize_known_blocks(void) {
    /* Q4_0, d = 0.5: qs[j] holds element j in the low nibble and element j+16 in the high one */
    block_q4_0 b4;
    b4.d = 0x3800; /* 0.5 */
    for (int j = 0; j < 16; j++) b4.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float out[32];
    dequantize_row(GGML_TYPE_Q4_0, &b4, out, 32);
    int bad = 0;
    for (int j = 0; j < 16; j++) {
        bad += out[j] != 0.5f * (j - 8);       /* -4.0, -3.5, ..., 3.5 */
        bad += out[j + 16] != 0.5f * (7 - j);  /* 3.5, 3.0, ..., -4.0 */
    }
    CHECK(bad == 0 && out[0] == -4.0f && out[16] == 3.5f, "Q4_0 hand block: %d wrong (out[0]=%g)", bad, out[0]);

    block_q8_0 b8;
    b8.d = 0x3400; /* 0.25 */
    for (int j = 0; j < 32; j++) b8.qs[j] = (int8_t)(j - 16);
    dequantize_row(GGML_TYPE_Q8_0, &b8, out, 32);
    bad = 0;
    for (int j = 0; j < 32; j++) bad += out[j] != 0.25f * (j - 16);
    CHECK(bad == 0 && out[0] == -4.0f, "Q8_0 hand block: %d wrong", bad);
}

static void test_quantize_known_blocks(void) {
    /* x_j = j - 16: the largest magnitude is -16, so d = -16 / -8 = 2 and
     * q_j = min(15, trunc((j - 16) / 2 + 8.5)) = min(15, (j + 1) / 2) */
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    block_q4_0 b4;
    quantize_row_q4_0_ref(x, &b4, 32);
    CHECK(block_d(&b4) == 0x4000, "Q4_0 d = 2.0, got %#x", block_d(&b4));
    int bad = 0;
    for (int j = 0; j < 16; j++) {
        const int lo = (j + 1) / 2, hi = (j + 17) / 2 > 15 ? 15 : (j + 17) / 2;
        bad += b4.qs[j] != (lo | (hi << 4));
    }
    CHECK(bad == 0, "Q4_0 hand quantization: %d bytes wrong", bad);

    /* Q8_0 with amax 127: d = 1 and quantization is roundf, halves away from zero */
    const float vals[8] = {127.0f, 2.5f, -3.5f, 0.5f, -0.5f, 0.49999997f, 126.5f, -1.2f};
    const int8_t want[8] = {127, 3, -4, 1, -1, 0, 127, -1};
    for (int j = 0; j < 32; j++) x[j] = vals[j % 8];
    block_q8_0 b8;
    quantize_row_q8_0_ref(x, &b8, 32);
    bad = 0;
    for (int j = 0; j < 32; j++) bad += b8.qs[j] != want[j % 8];
    CHECK(block_d(&b8) == 0x3c00 && bad == 0, "Q8_0 hand quantization: d %#x, %d wrong", block_d(&b8), bad);

    for (int j = 0; j < 32; j++) x[j] = 0.0f;
    quantize_row_q8_0_ref(x, &b8, 32);
    quantize_row_q4_0_ref(x, &b4, 32);
    /* Q4_0's d = 0 / -8 is -0.0, as in ggml */
    CHECK(block_d(&b8) == 0 && b8.qs[5] == 0 && (block_d(&b4) & 0x7fff) == 0 && b4.qs[5] == 0x88, "zero blocks");
}

/* quantize then dequantize: each element within half a step (d/2) of its input,
 * plus the f16 rounding of d (up to 2^-11 relative, times |q| <= 127); Q4_0
 * clamps the top code to 15, which can cost up to one full step */
static void test_quantize_roundtrip(void) {
    enum { N = 32 * 64 };
    static float x[N], y[N];
    static block_q4_0 q4[N / 32];
    static block_q8_0 q8[N / 32];
    rng_fill(x, N);
    quantize_row(GGML_TYPE_Q4_0, x, q4, N);
    dequantize_row(GGML_TYPE_Q4_0, q4, y, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const float d = fabsf(f16_to_f32(block_d(&q4[i / 32])));
        const int q = i % 32 < 16 ? q4[i / 32].qs[i % 16] & 15 : q4[i / 32].qs[i % 16] >> 4;
        const float slack = d * (8.0f / 2048.0f) + 1e-6f * d;
        bad += fabsf(x[i] - y[i]) > (q == 15 ? d : d * 0.5f) + slack;
    }
    CHECK(bad == 0, "Q4_0 roundtrip: %d elements off by more than d/2 (d when clamped to 15)", bad);

    quantize_row(GGML_TYPE_Q8_0, x, q8, N);
    dequantize_row(GGML_TYPE_Q8_0, q8, y, N);
    bad = 0;
    for (int i = 0; i < N; i++) {
        const float d = f16_to_f32(block_d(&q8[i / 32]));
        bad += fabsf(x[i] - y[i]) > d * 0.5f + d * (127.0f / 2048.0f) + 1e-6f * d;
    }
    CHECK(bad == 0, "Q8_0 roundtrip: %d elements off by more than d/2", bad);

    static uint16_t h[N];
    quantize_row(GGML_TYPE_F16, x, h, N);
    dequantize_row(GGML_TYPE_F16, h, y, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += fabsf(x[i] - y[i]) > fabsf(x[i]) * ldexpf(1.0f, -11) + ldexpf(1.0f, -25);
    CHECK(bad == 0, "F16 roundtrip: %d elements off by more than half an ulp", bad);
}

/* float dots sum n products in some order: each order is within about
 * n * FLT_EPSILON * sum|products| of the exact value (integer block sums are exact) */
static double dot_tolerance(double abs_sum, int terms) { return 2.0 * (terms + 2) * FLT_EPSILON * abs_sum + 1e-30; }

static double abs_products_sum(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += fabs((double)a[i] * b[i]);
    return s;
}

/* got, a kernel's dot of rows whose values are wd and xd, is within the
 * rounding bound of the double-precision dot */
static void check_dot_vs_double(const char *name, float got, const float *wd, const float *xd, int n) {
    double exact = 0;
    for (int i = 0; i < n; i++) exact += (double)wd[i] * xd[i];
    CHECK(fabs(got - exact) <= dot_tolerance(abs_products_sum(wd, xd, n), n), "%s %g vs double %g", name, got, exact);
}

static void test_reference_dots_vs_double(void) {
    const kernels *k = kernels_scalar();
    enum { N = 32 * 129 };
    static float w[N], x[N], wd[N], xd[N];
    static block_q4_0 w4[N / 32];
    static block_q8_0 w8[N / 32], x8[N / 32];
    static uint16_t w16[N], x16[N];
    rng_fill(w, N);
    rng_fill(x, N);
    quantize_row(GGML_TYPE_Q8_0, x, x8, N);

    check_dot_vs_double("dot_f32", k->dot_f32(w, x, N), w, x, N);

    quantize_row(GGML_TYPE_F16, w, w16, N);
    quantize_row(GGML_TYPE_F16, x, x16, N);
    dequantize_row(GGML_TYPE_F16, w16, wd, N);
    dequantize_row(GGML_TYPE_F16, x16, xd, N);
    check_dot_vs_double("dot_f16", k->dot_f16(w16, x16, N), wd, xd, N);

    dequantize_row(GGML_TYPE_Q8_0, x8, xd, N);
    quantize_row(GGML_TYPE_Q8_0, w, w8, N);
    dequantize_row(GGML_TYPE_Q8_0, w8, wd, N);
    check_dot_vs_double("dot_q8_0", k->dot_q8_0(w8, x8, N), wd, xd, N);

    quantize_row(GGML_TYPE_Q4_0, w, w4, N);
    dequantize_row(GGML_TYPE_Q4_0, w4, wd, N);
    check_dot_vs_double("dot_q4_0", k->dot_q4_0(w4, x8, N), wd, xd, N);
}

/* ---- SIMD kernel sets against the reference ---- */

static const int float_lengths[] = {1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 1000, 4096, 4097};
static const int block_counts[] = {1, 2, 3, 4, 5, 7, 8, 9, 127, 128, 129, 300, 344};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MAX_N 12000

/* Integer sums inside a block are exact, but SIMD code may scale partial
 * sums (lanes) before adding them up, so the float error is bounded by the
 * element-wise sum of |w_i * x_i| over about nb + 16 additions. */
static double q_tolerance(const float *wd, const float *xd, int n) {
    return dot_tolerance(abs_products_sum(wd, xd, n), n / 32 + 16);
}

static void test_float_kernels(const kernels *k) {
    const kernels *ref = kernels_scalar();
    static float w[MAX_N], x[MAX_N], y_ref[MAX_N], y_simd[MAX_N];
    static uint16_t w16[MAX_N], x16[MAX_N], h_ref[MAX_N], h_simd[MAX_N];
    for (int li = 0; li < COUNT(float_lengths); li++) {
        const int n = float_lengths[li];
        rng_fill(w, n);
        rng_fill(x, n);
        double abs_sum = abs_products_sum(w, x, n);
        float a = ref->dot_f32(w, x, n), b = k->dot_f32(w, x, n);
        CHECK(fabs(a - b) <= dot_tolerance(abs_sum, n), "%s dot_f32 n=%d: %.9g vs %.9g", k->name, n, b, a);

        ref->f32_to_f16_row(w, w16, n);
        ref->f32_to_f16_row(x, x16, n);
        abs_sum = 0;
        for (int i = 0; i < n; i++) abs_sum += fabs((double)f16_to_f32(w16[i]) * f16_to_f32(x16[i]));
        a = ref->dot_f16(w16, x16, n), b = k->dot_f16(w16, x16, n);
        CHECK(fabs(a - b) <= dot_tolerance(abs_sum, n), "%s dot_f16 n=%d: %.9g vs %.9g", k->name, n, b, a);

        /* f16 conversion over all magnitudes incl. subnormals, ties, inf and NaN payloads */
        for (int i = 0; i < n; i++) {
            const uint32_t r = rng_u32();
            float f;
            switch (r % 4) {
            case 0: f = ldexpf(rng_uniform(), (int)(r >> 8) % 50 - 30); break;
            case 1: f = ldexpf((float)(1 + 2 * (r >> 8 & 0x3ff)), (int)(r >> 20) % 40 - 38); break; /* ties */
            case 2: {
                uint32_t bits = rng_u32();
                memcpy(&f, &bits, sizeof f);
                break;
            }
            default: f = rng_value();
            }
            w[i] = f;
        }
        memset(h_ref, 0, sizeof(uint16_t) * (size_t)(n + 1));
        memset(h_simd, 0, sizeof(uint16_t) * (size_t)(n + 1));
        for (int i = 0; i < n; i++) h_ref[i] = f32_to_f16(w[i]);
        k->f32_to_f16_row(w, h_simd, n);
        CHECK(memcmp(h_ref, h_simd, sizeof(uint16_t) * (size_t)(n + 1)) == 0,
              "%s f32_to_f16_row n=%d differs from f32_to_f16 (or wrote past n)", k->name, n);

        rng_fill(w, n);
        rng_fill(y_ref, n + 1);
        memcpy(y_simd, y_ref, sizeof(float) * (size_t)(n + 1));
        ref->axpy_f32(y_ref, 0.37f, w, n);
        k->axpy_f32(y_simd, 0.37f, w, n);
        CHECK(memcmp(y_ref, y_simd, sizeof(float) * (size_t)(n + 1)) == 0,
              "%s axpy_f32 n=%d not bit-exact (or wrote past n)", k->name, n);
    }
}

static void test_quantized_kernels(const kernels *k) {
    const kernels *ref = kernels_scalar();
    static float w[MAX_N], x[MAX_N], wd[MAX_N], xd[MAX_N];
    static block_q4_0 w4[MAX_N / 32];
    static block_q8_0 w8[MAX_N / 32], x8_ref[MAX_N / 32 + 1], x8_simd[MAX_N / 32 + 1];
    for (int bi = 0; bi < COUNT(block_counts); bi++) {
        const int n = block_counts[bi] * 32;
        rng_fill(w, n);
        rng_fill(x, n);
        if (bi % 3 == 0) /* exact .5 ties: amax 127 makes d = 1 */
            for (int i = 0; i < n; i++) x[i] = i % 32 == 0 ? 127.0f : (float)(int)(rng_uniform() * 120) + 0.5f;
        if (bi % 3 == 1) memset(x, 0, sizeof(float) * 32); /* an all-zero block */

        memset(x8_ref, 0x5a, sizeof x8_ref);
        memset(x8_simd, 0x5a, sizeof x8_simd);
        ref->quantize_q8_0(x, x8_ref, n);
        k->quantize_q8_0(x, x8_simd, n);
        CHECK(memcmp(x8_ref, x8_simd, sizeof x8_ref) == 0, "%s quantize_q8_0 n=%d not bit-exact", k->name, n);

        dequantize_row(GGML_TYPE_Q8_0, x8_ref, xd, n);
        quantize_row(GGML_TYPE_Q8_0, w, w8, n);
        dequantize_row(GGML_TYPE_Q8_0, w8, wd, n);
        float a = ref->dot_q8_0(w8, x8_ref, n), b = k->dot_q8_0(w8, x8_ref, n);
        CHECK(fabs(a - b) <= q_tolerance(wd, xd, n), "%s dot_q8_0 blocks=%d: %.9g vs %.9g",
              k->name, n / 32, b, a);

        quantize_row(GGML_TYPE_Q4_0, w, w4, n);
        dequantize_row(GGML_TYPE_Q4_0, w4, wd, n);
        const double tol = q_tolerance(wd, xd, n);
        a = ref->dot_q4_0(w4, x8_ref, n), b = k->dot_q4_0(w4, x8_ref, n);
        CHECK(fabs(a - b) <= tol, "%s dot_q4_0 blocks=%d: %.9g vs %.9g", k->name, n / 32, b, a);
    }
}

/* A gemv over rows with padding between them equals one reference dot per
 * row, and the same set's dot bit for bit (ops.c mixes the two): Q4_0, and
 * Q8_0 where the set has a gemv_q8_0. */
static void test_gemv_type(const kernels *k, enum ggml_type type) {
    const bool q4 = type == GGML_TYPE_Q4_0;
    const char *what = q4 ? "gemv_q4_0" : "gemv_q8_0";
    const size_t block = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const int row_counts[] = {1, 3, 17, 40, 70}; /* 70: more than one row group of a multi-chunk matrix */
    /* 511: the avx2 Q4_0 gemv's whole table of regrouped pairs, its last pair single; 600: more than
     * one activation chunk, and past that table */
    const int nbs[] = {1, 3, 5, 127, 129, 300, 511, 600};
    for (int ri = 0; ri < COUNT(row_counts); ri++) {
        for (int bi = 0; bi < COUNT(nbs); bi++) {
            const int nrows = row_counts[ri], nb = nbs[bi], n = nb * 32;
            /* every other row count unpadded: the avx512 gemv on AMD prefetches such rows as one stream */
            const size_t stride = (size_t)(nb + ri % 2) * block;
            uint8_t *w = malloc(stride * (size_t)nrows);
            float *row = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)(nrows + 1));
            float *wd = malloc(sizeof(float) * (size_t)n), *xd = malloc(sizeof(float) * (size_t)n);
            block_q8_0 *x8 = malloc(sizeof(block_q8_0) * (size_t)nb);
            if (!w || !row || !y || !x8 || !wd || !xd) {
                CHECK(0, "out of memory");
                return;
            }
            memset(w, 0xee, stride * (size_t)nrows);
            for (int r = 0; r < nrows; r++) {
                rng_fill(row, n);
                if (q4) quantize_row_q4_0_ref(row, (block_q4_0 *)(w + (size_t)r * stride), n);
                else quantize_row_q8_0_ref(row, (block_q8_0 *)(w + (size_t)r * stride), n);
            }
            rng_fill(row, n);
            quantize_row_q8_0_ref(row, x8, n);
            y[nrows] = 12345.0f;
            if (q4) k->gemv_q4_0((const block_q4_0 *)w, stride, x8, y, nrows, n);
            else k->gemv_q8_0((const block_q8_0 *)w, stride, x8, y, nrows, n);
            int bad = 0, not_dot = 0;
            for (int r = 0; r < nrows; r++) {
                const void *wr = w + (size_t)r * stride;
                dequantize_row(type, wr, wd, n);
                dequantize_row(GGML_TYPE_Q8_0, x8, xd, n);
                const float want = q4 ? kernels_scalar()->dot_q4_0(wr, x8, n) : kernels_scalar()->dot_q8_0(wr, x8, n);
                const float same = q4 ? k->dot_q4_0(wr, x8, n) : k->dot_q8_0(wr, x8, n);
                bad += !(fabs(y[r] - want) <= q_tolerance(wd, xd, n));
                not_dot += memcmp(&y[r], &same, sizeof same) != 0;
            }
            CHECK(bad == 0 && y[nrows] == 12345.0f, "%s %s rows=%d blocks=%d: %d rows differ", k->name, what, nrows,
                  nb, bad);
            CHECK(not_dot == 0, "%s %s rows=%d blocks=%d: %d rows not bit-identical to the dot", k->name, what,
                  nrows, nb, not_dot);
            free(x8);
            free(xd);
            free(wd);
            free(y);
            free(row);
            free(w);
        }
    }
}

static void test_gemv(const kernels *k) {
    test_gemv_type(k, GGML_TYPE_Q4_0);
    if (k->gemv_q8_0) test_gemv_type(k, GGML_TYPE_Q8_0);
}

static int bits_differ(float a, float b) { return memcmp(&a, &b, sizeof a) != 0; }

/* 1 when rows outputs are not want's bits, or the one after them (set to
 * 12345) was written */
static int rows_not_bits(const float *got, const float *want, int rows) {
    return memcmp(got, want, sizeof(float) * (size_t)rows) != 0 || got[rows] != 12345.0f;
}

/* A set that promises the scalar set's bits (neon: an ARM64 stack then
 * agrees with pi2-ref) gives the scalar quantized dots' bits exactly, and
 * its gemv each row's. Quants over the whole int8 range (-128 included). */
static void test_scalar_bits(const kernels *k) {
    const kernels *ref = kernels_scalar();
    enum { MAX_BLOCKS = 130, GEMV_ROWS = 7 };
    static block_q8_0 w8[MAX_BLOCKS], x8[MAX_BLOCKS];
    static block_q4_0 w4[GEMV_ROWS * (MAX_BLOCKS + 1)];
    int bad8 = 0, bad4 = 0, badg = 0, cases = 0;
    for (int nb = 1; nb <= MAX_BLOCKS; nb++, cases++) {
        for (int b = 0; b < GEMV_ROWS * (nb + 1); b++) { /* rows nb + 1 blocks apart */
            const uint16_t dw = f32_to_f16(ldexpf(rng_value(), -(int)(rng_u32() % 8))), dx = f32_to_f16(rng_value());
            memcpy(&w4[b].d, &dw, sizeof dw);
            for (int j = 0; j < QK4_0 / 2; j++) w4[b].qs[j] = (uint8_t)rng_u32();
            if (b >= nb) continue;
            memcpy(&w8[b].d, &dw, sizeof dw), memcpy(&x8[b].d, &dx, sizeof dx);
            for (int j = 0; j < QK8_0; j++) w8[b].qs[j] = (int8_t)rng_u32(), x8[b].qs[j] = (int8_t)rng_u32();
        }
        const int n = nb * 32;
        bad8 += bits_differ(ref->dot_q8_0(w8, x8, n), k->dot_q8_0(w8, x8, n));
        bad4 += bits_differ(ref->dot_q4_0(w4, x8, n), k->dot_q4_0(w4, x8, n));
        float y[GEMV_ROWS + 1], want[GEMV_ROWS];
        y[GEMV_ROWS] = 12345.0f;
        k->gemv_q4_0(w4, (size_t)(nb + 1) * sizeof(block_q4_0), x8, y, GEMV_ROWS, n);
        for (int r = 0; r < GEMV_ROWS; r++) want[r] = ref->dot_q4_0(w4 + r * (nb + 1), x8, n);
        badg += rows_not_bits(y, want, GEMV_ROWS);
    }
    CHECK(bad8 == 0, "%s dot_q8_0: %d of %d lengths not scalar's bits", k->name, bad8, cases);
    CHECK(bad4 == 0, "%s dot_q4_0: %d of %d lengths not scalar's bits", k->name, bad4, cases);
    CHECK(badg == 0, "%s gemv_q4_0: %d of %d lengths not scalar's bits (or wrote past its rows)", k->name, badg,
          cases);
}

/* n F16 values from subnormal to large, so that sums of them round and cancel */
static void fill_wide_f16(uint16_t *v, size_t n) {
    for (size_t i = 0; i < n; i++) v[i] = f32_to_f16(ldexpf(rng_value(), (int)(rng_u32() % 24) - 16));
}

/* The same promise for the float dots: dot_f32, dot_f16 and dot_f16_rows
 * give the scalar dots' bits, every length from 1 to 200 and a few long
 * ones, magnitudes from subnormal F16 to large, so that sums round and
 * cancel, and 1 to 9 rows (dot_f16_rows: groups and a remainder). */
static void test_scalar_float_bits(const kernels *k) {
    const kernels *ref = kernels_scalar();
    enum { MAX_LEN = 4097, MAX_ROWS = 9, LONG = 200 };
    static float w[MAX_LEN], x[MAX_LEN];
    static uint16_t w16[MAX_ROWS * (MAX_LEN + 3)], x16[MAX_LEN];
    int bad32 = 0, bad16 = 0, bad_rows = 0, cases = 0;
    for (int n = 1; n <= LONG + 2; n++, cases++) {
        const int len = n <= LONG ? n : n == LONG + 1 ? 1000 : MAX_LEN;
        const int rows = 1 + n % MAX_ROWS;
        const size_t stride = (size_t)len + (size_t)(n % 4);
        for (int i = 0; i < len; i++) {
            w[i] = ldexpf(rng_value(), (int)(rng_u32() % 24) - 16);
            x[i] = ldexpf(rng_value(), (int)(rng_u32() % 24) - 16);
            x16[i] = f32_to_f16(x[i]);
        }
        fill_wide_f16(w16, stride * (size_t)rows);
        bad32 += bits_differ(ref->dot_f32(w, x, len), k->dot_f32(w, x, len));
        bad16 += bits_differ(ref->dot_f16(w16, x16, len), k->dot_f16(w16, x16, len));
        float out[MAX_ROWS + 1], want[MAX_ROWS];
        out[rows] = 12345.0f;
        k->dot_f16_rows(w16, stride, rows, x16, len, out);
        for (int r = 0; r < rows; r++) want[r] = ref->dot_f16(w16 + (size_t)r * stride, x16, len);
        bad_rows += rows_not_bits(out, want, rows);
    }
    CHECK(bad32 == 0, "%s dot_f32: %d of %d lengths not scalar's bits", k->name, bad32, cases);
    CHECK(bad16 == 0, "%s dot_f16: %d of %d lengths not scalar's bits", k->name, bad16, cases);
    CHECK(bad_rows == 0, "%s dot_f16_rows: %d of %d lengths not scalar's bits (or wrote past its rows)", k->name,
          bad_rows, cases);
}

/* dot_f16_rows equals the set's own dot_f16 on every row, bit for bit
 * (attention's V . p uses the one, other F16 dots the other), for rows and
 * lengths around its groups of 8 rows and the 64-element steps */
static void test_dot_f16_rows(const kernels *k) {
    const int lengths[] = {1, 31, 32, 33, 63, 64, 96, 127, 160};
    enum { MAX_ROWS = 9, MAX_LEN = 160, MAX_STRIDE = MAX_LEN + 7 };
    static uint16_t w[MAX_ROWS * MAX_STRIDE], x[MAX_LEN];
    float out[MAX_ROWS + 1], want;
    for (int li = 0; li < COUNT(lengths); li++)
        for (int rows = 1; rows <= MAX_ROWS; rows++) {
            const int n = lengths[li];
            const size_t stride = (size_t)n + 1 + rng_u32() % 7;
            fill_wide_f16(w, stride * (size_t)rows);
            fill_wide_f16(x, (size_t)n);
            out[rows] = 12345.0f;
            k->dot_f16_rows(w, stride, rows, x, n, out);
            int bad = 0;
            for (int r = 0; r < rows; r++) {
                want = k->dot_f16(w + (size_t)r * stride, x, n);
                bad += memcmp(&out[r], &want, sizeof want) != 0;
            }
            CHECK(bad == 0 && out[rows] == 12345.0f, "%s dot_f16_rows n=%d rows=%d: %d rows differ from dot_f16 (or wrote past rows)",
                  k->name, n, rows, bad);
        }
}

/* dot_f16_rows_tile equals the set's own dot_f16_rows for every vector, bit
 * for bit (a prompt's K . q and V . p use the one, a decode token's the
 * other), for lengths around the sets' steps (32 and 64 elements) and the
 * double leftovers, vector counts around the groups of two and four and row
 * counts around dot_f16_rows' groups of eight; nothing written past the rows
 * and vectors asked for */
static void test_dot_f16_rows_tile(const kernels *k) {
    const int lengths[] = {1, 8, 32, 63, 64, 96, 127, 128, 160, 256, 1000};
    const int vector_counts[] = {1, 2, 3, 4, 5, 8, 9};
    enum { MAX_LEN = 1000, MAX_ROWS = 17, MAX_Q = 9, OUT_STRIDE = MAX_ROWS + 2 };
    static uint16_t w[MAX_ROWS * (MAX_LEN + 6)], x[MAX_Q * (MAX_LEN + 4)];
    static float out[(MAX_Q + 1) * OUT_STRIDE], scratch[MAX_Q * MAX_LEN];
    for (int li = 0; li < COUNT(lengths); li++)
        for (int qi = 0; qi < COUNT(vector_counts); qi++) {
            const int n = lengths[li], nx = vector_counts[qi], rows = 1 + (int)(rng_u32() % MAX_ROWS);
            const size_t w_stride = (size_t)n + rng_u32() % 6, x_stride = (size_t)n + rng_u32() % 4;
            fill_wide_f16(w, w_stride * (size_t)rows);
            fill_wide_f16(x, x_stride * (size_t)nx);
            for (int i = 0; i < COUNT(out); i++) out[i] = 12345.0f;
            k->dot_f16_rows_tile(w, w_stride, rows, x, x_stride, nx, n, out, OUT_STRIDE, scratch);
            int bad = 0, past = 0;
            for (int j = 0; j <= MAX_Q; j++) {
                float want[MAX_ROWS];
                if (j < nx) k->dot_f16_rows(w, w_stride, rows, x + (size_t)j * x_stride, n, want);
                for (int r = 0; r < OUT_STRIDE; r++) {
                    const float got = out[j * OUT_STRIDE + r];
                    if (j >= nx || r >= rows) past += got != 12345.0f;
                    else bad += memcmp(&got, &want[r], sizeof got) != 0;
                }
            }
            CHECK(bad == 0 && past == 0, "%s dot_f16_rows_tile n=%d vectors=%d rows=%d: %d values differ from "
                  "dot_f16_rows, %d written past them", k->name, n, nx, rows, bad, past);
        }
}

/* softmax exponentials and SwiGLU against libm within a few ulp (ggml's vector
 * exp is within 1.5 ulp of exp), and exp(-inf) = 0 for masked scores */
static void test_activation_kernels(const kernels *k) {
    enum { N = 77 };
    float x[N], y[N], g[N], u[N], h[N];
    rng_fill(u, N);
    for (int i = 0; i < N; i++) x[i] = 20.0f * sinf(1.7f * (float)i), g[i] = 12.0f * cosf(0.9f * (float)i);
    x[5] = -INFINITY;
    float max = -INFINITY;
    for (int i = 0; i < N; i++) max = fmaxf(max, x[i]);
    const double sum = k->softmax_exp(y, x, max, N);
    double want_sum = 0;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const double want = exp((double)(x[i] - max)); /* the kernel subtracts in float */
        want_sum += want;
        bad += !(fabs(y[i] - want) <= 4 * FLT_EPSILON * want);
    }
    CHECK(bad == 0 && y[5] == 0.0f, "%s softmax_exp: %d values off by more than 4 ulp (exp(-inf) = %g)", k->name, bad, y[5]);
    CHECK(fabs(sum - want_sum) <= 1e-5 * want_sum, "%s softmax_exp sum %.9g vs %.9g", k->name, sum, want_sum);
    k->silu_mul(h, g, u, N);
    bad = 0;
    for (int i = 0; i < N; i++) {
        const double want = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        bad += !(fabs(h[i] - want) <= 8 * FLT_EPSILON * fabs(want) + 1e-30);
    }
    CHECK(bad == 0, "%s silu_mul: %d values off by more than 8 ulp", k->name, bad);
}

/* silu_mul over a range gives every element the bits it gets over any
 * sub-range: threads and workers split the neurons at arbitrary points */
static void test_silu_mul_split(const kernels *k) {
    enum { N = 83 };
    float g[N], u[N], whole[N], part[N];
    rng_fill(u, N);
    for (int i = 0; i < N; i++) g[i] = 9.0f * sinf(0.37f * (float)i + 0.1f);
    k->silu_mul(whole, g, u, N);
    int bad = 0;
    for (int i0 = 0; i0 < N; i0++)
        for (int i1 = i0 + 1; i1 <= N; i1 += 1 + (i1 - i0) / 5) {
            for (int i = 0; i < N; i++) part[i] = NAN;
            k->silu_mul(part + i0, g + i0, u + i0, i1 - i0);
            for (int i = i0; i < i1; i++) bad += memcmp(&part[i], &whole[i], sizeof(float)) != 0;
        }
    CHECK(bad == 0, "%s silu_mul: %d elements differ between a range and its sub-ranges", k->name, bad);
}

/* kv_store (engine/ops.h) through this set's conversion: position pos's K row and V column hold each
 * value's f32_to_f16, and no other cell of the cache changes. */
static void test_kv_store(const kernels *k) {
    const int dims[] = {1, 7, 255, 256, 257, 600}, n_ctx = 37, positions[] = {0, 5, 36};
    for (int di = 0; di < COUNT(dims); di++)
        for (int pi = 0; pi < COUNT(positions); pi++) {
            const int kv_dim = dims[di], pos = positions[pi];
            const size_t cells = (size_t)kv_dim * n_ctx;
            uint16_t *kc = malloc(cells * 2), *vc = malloc(cells * 2);
            float *kvec = malloc((size_t)kv_dim * 4), *vvec = malloc((size_t)kv_dim * 4);
            for (size_t c = 0; c < cells; c++) kc[c] = (uint16_t)(0x1234 + c), vc[c] = (uint16_t)(0x4321 + c);
            rng_fill(kvec, kv_dim);
            rng_fill(vvec, kv_dim);
            kv_layer kv = {kc, vc, n_ctx, kv_dim};
            kv_store(k, &kv, pos, kvec, vvec);
            int bad = 0;
            for (int d = 0; d < kv_dim; d++)
                for (int t = 0; t < n_ctx; t++) {
                    size_t kcell = (size_t)t * kv_dim + d, vcell = (size_t)d * n_ctx + t;
                    bad += kc[kcell] != (t == pos ? f32_to_f16(kvec[d]) : (uint16_t)(0x1234 + kcell));
                    bad += vc[vcell] != (t == pos ? f32_to_f16(vvec[d]) : (uint16_t)(0x4321 + vcell));
                }
            CHECK(bad == 0, "%s kv_store, kv_dim %d, position %d: %d cells wrong", k->name, kv_dim, pos, bad);
            free(kc), free(vc), free(kvec), free(vvec);
        }
}

int main(void) {
    rng_seed(0x853c49e6748fea9bull);
    /* the override is read once, at the first kernels_best() call */
    setenv("PI2_KERNELS", "scalar", 1);
    CHECK(strcmp(kernels_best()->name, "scalar") == 0, "PI2_KERNELS=scalar gave %s", kernels_best()->name);
    const char *names[] = {"scalar", "avx2", "avx512", "avx512-exact", "amx", "neon"};
    for (int i = 0; i < COUNT(names); i++) {
        const kernels *k = kernels_by_name(names[i]);
        CHECK(!k || strcmp(k->name, names[i]) == 0, "kernels_by_name(%s) gave %s", names[i], k->name);
    }
    CHECK(kernels_by_name("avx512-fast") == NULL, "kernels_by_name accepts an unknown name");

    test_f16_known_values();
    test_dequantize_known_blocks();
    test_quantize_known_blocks();
    test_quantize_roundtrip();
    test_reference_dots_vs_double();

    const kernels *sets[] = {kernels_scalar(), kernels_avx2(),   kernels_avx512(),
                             kernels_avx512_exact(), kernels_neon(), kernels_neon_without_sdot()};
    const char *set_names[] = {"scalar", "avx2", "avx512", "avx512-exact", "neon", "neon without SDOT"};
    for (int i = 0; i < COUNT(sets); i++) {
        if (!sets[i]) {
            SKIP("kernel set %s (this CPU lacks it)", set_names[i]);
            continue;
        }
        test_float_kernels(sets[i]);
        test_quantized_kernels(sets[i]);
        test_gemv(sets[i]);
        if (sets[i] == kernels_neon() || sets[i] == kernels_neon_without_sdot()) {
            test_scalar_bits(sets[i]);
            test_scalar_float_bits(sets[i]);
        }
        test_dot_f16_rows(sets[i]);
        test_dot_f16_rows_tile(sets[i]);
        test_activation_kernels(sets[i]);
        test_silu_mul_split(sets[i]);
        test_kv_store(sets[i]);
    }
    /* the avx512 gemv with the other prefetch: only its prefetches differ */
    if (kernels_avx512_other_prefetch()) {
        CHECK(kernels_avx512_other_prefetch()->gemv_q4_0 != kernels_avx512()->gemv_q4_0,
              "the other prefetch's avx512 table has its own gemv_q4_0");
        test_gemv(kernels_avx512_other_prefetch());
    } else {
        SKIP("kernel set avx512 with the other prefetch (this CPU lacks AVX-512)");
    }
    return test_summary();
}

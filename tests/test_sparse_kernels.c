/* Sparse kernel tests. For every kernel set this CPU can run (the sparse
 * kernels its table names: kernels.h), on random rows of every weight type
 * and many lengths, with index sets that are empty, one row
 * (the last one, ending exactly at the end of its allocation, so ASan sees any
 * read past a row), all rows in order, all rows shuffled, random subsets and 3 and 5 rows:
 *   - gather dot equals the dense dot of its kernel set bit for bit,
 *     and the fused gate+up form equals two plain gathers; in the neon sets,
 *     which promise the scalar set's bits, it equals the scalar gather too;
 *   - every ISA's dot is within the summation-order bound of the scalar one,
 *     and the scalar one within the rounding bound of a double reference;
 *   - gather axpy is bit-exact with the scalar one (a fixed fma order; Q4_0's
 *     int8 coefficients quantized alike), and the scalar one is within the
 *     rounding (and Q4_0's quantization) bound of a double reference of y + W^T h.
 * Rows sit at unaligned addresses, and with a padded stride the padding holds
 * NaN bytes, so a kernel that reads outside its rows changes the results. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/f16.h"
#include "kernels/kernels.h"
#include "rng.h"
#include "kernels/sparse_kernels.h"
#include "test.h"

#define UNIT_ROUNDOFF 0x1p-24 /* float's unit roundoff */

/* A matrix of `rows` rows in an allocation that ends exactly where its last row ends. */
typedef struct {
    uint32_t type;
    int n, rows;
    size_t row_bytes, stride;
    unsigned char *alloc;
    const char *base;  /* alloc + an unaligned lead */
    double *dequant;   /* rows x n, the weights as the kernels see them */
} matrix;

static matrix make_matrix(uint32_t type, int n, int rows, size_t pad) {
    matrix m = {.type = type, .n = n, .rows = rows, .row_bytes = ggml_row_bytes(type, (uint64_t)n)};
    m.stride = m.row_bytes + pad;
    const size_t lead = type == GGML_TYPE_F32 ? 4 : 2; /* off 16-byte alignment, legal for the type */
    m.alloc = malloc(lead + (size_t)(rows - 1) * m.stride + m.row_bytes);
    m.dequant = malloc((size_t)rows * (size_t)(n ? n : 1) * sizeof(double));
    m.base = (const char *)m.alloc + lead;
    memset(m.alloc, 0xff, lead + (size_t)(rows - 1) * m.stride + m.row_bytes); /* NaN in any padding */
    float *src = malloc((size_t)(n ? n : 1) * sizeof *src), *back = malloc((size_t)(n ? n : 1) * sizeof *back);
    for (int r = 0; r < rows; r++) {
        rng_fill(src, n);
        void *row = m.alloc + lead + (size_t)r * m.stride;
        quantize_row(type, src, row, n);
        dequantize_row(type, row, back, n);
        for (int i = 0; i < n; i++) m.dequant[(size_t)r * (size_t)n + (size_t)i] = back[i];
    }
    free(src);
    free(back);
    return m;
}

static void free_matrix(matrix *m) {
    free(m->alloc);
    free(m->dequant);
}

static const void *row_ptr(const matrix *m, int r) { return m->base + (size_t)r * m->stride; }

/* The activation converted for the weight type, and its values as the dots see them. */
typedef struct {
    void *conv;
    double *values;
} activation;

static activation make_activation(uint32_t type, int n) {
    activation a = {malloc((size_t)(n ? n : 1) * sizeof(float)), malloc((size_t)(n ? n : 1) * sizeof(double))};
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x), *back = malloc((size_t)(n ? n : 1) * sizeof *back);
    rng_fill(x, n);
    if (type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q8_0) {
        kernels_scalar()->quantize_q8_0(x, a.conv, n);
        dequantize_row(GGML_TYPE_Q8_0, a.conv, back, n);
    } else {
        const uint32_t xtype = type == GGML_TYPE_F16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
        quantize_row(xtype, x, a.conv, n);
        dequantize_row(xtype, a.conv, back, n);
    }
    for (int i = 0; i < n; i++) a.values[i] = back[i];
    free(x);
    free(back);
    return a;
}

static void free_activation(activation *a) {
    free(a->conv);
    free(a->values);
}

static float dense_dot(const kernels *k, uint32_t type, const void *row, const void *x, int n) {
    switch (type) {
    case GGML_TYPE_F32: return k->dot_f32(row, x, n);
    case GGML_TYPE_F16: return k->dot_f16(row, x, n);
    case GGML_TYPE_Q8_0: return k->dot_q8_0(row, x, n);
    default: return k->dot_q4_0(row, x, n);
    }
}

/* terms a float summation of the dot adds up: one per element, or one per block */
static int dot_terms(uint32_t type, int n) { return type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q8_0 ? n / 32 : n; }

/* ---- index sets ---- */

/* 3 and 5 rows: fewer than one pass of the avx512 Q4_0 gather, and (fused gate+up) one and a remainder */
enum { SET_EMPTY, SET_LAST, SET_ALL, SET_SHUFFLED, SET_SUBSET, SET_THREE, SET_FIVE, SET_KINDS };
static const char *const set_names[SET_KINDS] = {"empty",         "last row", "all",   "all shuffled",
                                                 "random subset", "3 rows",   "5 rows"};

/* fills idx, returns the count; indices never repeat */
static int make_index_set(int kind, int rows, int32_t *idx) {
    for (int r = 0; r < rows; r++) idx[r] = r;
    switch (kind) {
    case SET_EMPTY: return 0;
    case SET_LAST: idx[0] = rows - 1; return 1;
    case SET_ALL: return rows;
    default:
        for (int r = rows - 1; r > 0; r--) {
            const int j = (int)(rng_u32() % (uint32_t)(r + 1));
            const int32_t t = idx[r];
            idx[r] = idx[j];
            idx[j] = t;
        }
        return kind == SET_SHUFFLED ? rows
               : kind == SET_THREE  ? 3
               : kind == SET_FIVE   ? 5
                                    : 1 + (int)(rng_u32() % (uint32_t)rows);
    }
}

/* ---- checks ---- */

/* the kernel sets this CPU runs, each with its sparse kernels */
static const kernels *sets[5];
static int nsets;

static bool promises_scalar_bits(const kernels *k) { return k == kernels_neon() || k == kernels_neon_without_sdot(); }

static void check_dots(const matrix *a, const matrix *b, const activation *x, const int32_t *idx, int count,
                       const char *what) {
    const int n = a->n;
    float *ref = malloc(((size_t)count + 1) * sizeof *ref);
    sparse_kernels_for_type(kernels_scalar()->sparse, a->type)
        ->dot(a->base, a->stride, idx, count, x->conv, n, ref, NULL);

    /* the scalar reference against double arithmetic; magnitude[k]: sum |w x| of row idx[k] */
    double *magnitude = malloc(((size_t)count + 1) * sizeof *magnitude);
    int bad_scalar = 0;
    for (int k = 0; k < count; k++) {
        double exact = 0;
        magnitude[k] = 0;
        for (int i = 0; i < n; i++) {
            const double t = a->dequant[(size_t)idx[k] * (size_t)n + (size_t)i] * x->values[i];
            exact += t;
            magnitude[k] += fabs(t);
        }
        bad_scalar += !(fabs(ref[k] - exact) <= (dot_terms(a->type, n) + 2) * UNIT_ROUNDOFF * magnitude[k] + 1e-30);
    }
    CHECK(bad_scalar == 0, "%s: %d scalar gather dots off the double reference", what, bad_scalar);

    for (int s = 0; s < nsets; s++) {
        const kernels *dense = sets[s];
        if (!dense->gather) continue;
        const sparse_type_kernels *sk = sparse_kernels_for_type(dense->gather, a->type);
        float *out = malloc(((size_t)count + 1) * sizeof *out), *out_a = malloc(((size_t)count + 1) * sizeof *out);
        float *out_b = malloc(((size_t)count + 1) * sizeof *out);
        out[count] = out_a[count] = out_b[count] = 12345.0f; /* must stay untouched */
        /* the plain dot with a prefetch hint for the next call (b's last rows), the
         * fused one without: they must still agree bit for bit */
        sparse_then then = {.count = AXPY_Q4_GROUP};
        for (int r = 0; r < then.count; r++) then.rows[r] = b->base + (size_t)(b->rows - 1 - r) * b->stride;
        sk->dot(a->base, a->stride, idx, count, x->conv, n, out, &then);
        sk->dot2(a->base, b->base, a->stride, idx, count, x->conv, n, out_a, out_b, NULL);

        int not_dense = 0, not_fused = 0, off_scalar = 0, not_scalar = 0;
        for (int k = 0; k < count; k++) {
            not_scalar += memcmp(&out[k], &ref[k], sizeof *out) != 0;
            not_dense += out[k] != dense_dot(dense, a->type, row_ptr(a, idx[k]), x->conv, n);
            not_fused += out_a[k] != out[k] ||
                         out_b[k] != dense_dot(dense, b->type, row_ptr(b, idx[k]), x->conv, n);
            /* both sums are within (terms + 2) u sum|w x| of the exact value */
            off_scalar += !(fabs((double)out[k] - ref[k]) <=
                            2 * (dot_terms(a->type, n) + 2) * UNIT_ROUNDOFF * magnitude[k] + 1e-30);
        }
        CHECK(not_dense == 0, "%s %s: %d of %d gather dots differ from the dense dot", what, sets[s]->name,
              not_dense, count);
        CHECK(not_fused == 0, "%s %s: %d of %d fused gate/up dots differ", what, sets[s]->name, not_fused, count);
        CHECK(off_scalar == 0, "%s %s: %d of %d dots off the scalar ones", what, sets[s]->name, off_scalar, count);
        if (promises_scalar_bits(dense))
            CHECK(not_scalar == 0, "%s %s: %d of %d dots not the scalar ones' bits", what, sets[s]->name, not_scalar,
                  count);
        CHECK(out[count] == 12345.0f && out_a[count] == 12345.0f && out_b[count] == 12345.0f,
              "%s %s: wrote past count outputs", what, sets[s]->name);
        free(out);
        free(out_a);
        free(out_b);
    }
    free(magnitude);
    free(ref);
}

/* the scale d of block b of Q4_0 row r */
static double q4_block_scale(const matrix *m, int r, int b) {
    uint16_t h;
    memcpy(&h, m->base + (size_t)r * m->stride + (size_t)b * sizeof(block_q4_0), sizeof h);
    return f16_to_f32(h);
}

static void check_axpy(const matrix *m, const int32_t *idx, int count, const char *what) {
    const int n = m->n;
    float *coef = malloc(((size_t)count + 1) * sizeof *coef), *y0 = malloc(((size_t)n + 1) * sizeof *y0);
    rng_fill(coef, count);
    rng_fill(y0, n);
    float *ref = malloc(((size_t)n + 1) * sizeof *ref);
    memcpy(ref, y0, (size_t)n * sizeof *ref);
    sparse_kernels_for_type(kernels_scalar()->sparse, m->type)
        ->axpy(m->base, m->stride, idx, coef, count, ref, n, NULL);

    /* the scalar reference against y0 + W^T coef in double: each term carries
     * the rounding of its coef * d (for blocks) and of its fma; Q4_0 also its
     * int8 coefficient's, at most half a step m / 127 (m: its group's largest
     * |coef * d| in the block) per unit of |q - 8| */
    int bad_scalar = 0;
    for (int i = 0; i < n; i++) {
        double exact = y0[i], magnitude = fabs(y0[i]), quantized = 0;
        for (int k = 0; k < count; k++) {
            const double t = (double)coef[k] * m->dequant[(size_t)idx[k] * (size_t)n + (size_t)i];
            exact += t;
            magnitude += fabs(t);
        }
        if (m->type == GGML_TYPE_Q4_0)
            for (int k0 = 0; k0 < count; k0 += AXPY_Q4_GROUP) {
                const int k1 = count - k0 < AXPY_Q4_GROUP ? count : k0 + AXPY_Q4_GROUP;
                double largest = 0, units = 0;
                for (int k = k0; k < k1; k++) {
                    const double d = q4_block_scale(m, idx[k], i / QK4_0);
                    largest = fmax(largest, fabs(coef[k] * d));
                    if (d != 0) units += fabs(m->dequant[(size_t)idx[k] * (size_t)n + (size_t)i] / d);
                }
                quantized += largest / 254 * (1 + 0x1p-16) * units;
            }
        bad_scalar += !(fabs(ref[i] - exact) <= quantized + 4 * (count + 2) * UNIT_ROUNDOFF * (magnitude + quantized) + 1e-30);
    }
    CHECK(bad_scalar == 0, "%s: %d of %d scalar axpy outputs off the double reference", what, bad_scalar, n);
    if (count == 0) CHECK(memcmp(ref, y0, (size_t)n * sizeof *ref) == 0, "%s: empty axpy changed y", what);

    /* a prefetch hint for the next call (the matrix's last rows) changes nothing */
    sparse_then then = {.count = AXPY_Q4_GROUP};
    for (int r = 0; r < then.count; r++) then.rows[r] = m->base + (size_t)(m->rows - 1 - r) * m->stride;
    for (int s = 0; s < 2 * nsets; s++) {
        const char *hinted = s % 2 ? ", with a next-call hint" : "";
        float *y = malloc(((size_t)n + 1) * sizeof *y);
        memcpy(y, y0, (size_t)n * sizeof *y);
        y[n] = 12345.0f;
        sparse_kernels_for_type(sets[s / 2]->sparse, m->type)
            ->axpy(m->base, m->stride, idx, coef, count, y, n, s % 2 ? &then : NULL);
        int differ = 0;
        for (int i = 0; i < n; i++) differ += memcmp(&y[i], &ref[i], sizeof *y) != 0;
        CHECK(differ == 0, "%s %s%s: %d of %d axpy outputs differ from the scalar ones", what, sets[s / 2]->name,
              hinted, differ, n);
        CHECK(y[n] == 12345.0f, "%s %s%s: axpy wrote past y[n-1]", what, sets[s / 2]->name, hinted);
        free(y);
    }
    free(coef);
    free(y0);
    free(ref);
}

static void test_type(uint32_t type, const int *lengths, int nlengths) {
    const int rows = 37; /* passes of the avx512 Q4_0 gather (8 rows) and a remainder, also fused (74 rows) */
    for (int li = 0; li < nlengths; li++) {
        const int n = lengths[li];
        for (int padded = 0; padded < 2; padded++) {
            const size_t pad = padded ? (type == GGML_TYPE_F32 ? 12 : 46) : 0;
            matrix a = make_matrix(type, n, rows, pad), b = make_matrix(type, n, rows, pad);
            activation x = make_activation(type, n);
            int32_t idx[37];
            for (int kind = 0; kind < SET_KINDS; kind++) {
                const int count = make_index_set(kind, rows, idx);
                char what[128];
                snprintf(what, sizeof what, "%s n=%d %s, %s (%d rows)", ggml_type_name(type), n,
                         padded ? "padded stride" : "packed rows", set_names[kind], count);
                check_dots(&a, &b, &x, idx, count, what);
                check_axpy(&a, idx, count, what);
            }
            free_activation(&x);
            free_matrix(&a);
            free_matrix(&b);
        }
    }
}

/* every set names its sparse kernels, and its gathers are those or none */
static void test_dispatch(void) {
    CHECK(kernels_best()->sparse == kernels_scalar()->sparse, "PI2_KERNELS=scalar chose the %s sparse kernels",
          kernels_best()->sparse->name);
    CHECK(sparse_kernels_for_type(kernels_scalar()->sparse, 6) == NULL, "a Q5_0 table");
    const char *names[] = {"scalar", "avx2", "avx512", "avx512-exact", "amx", "neon"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const kernels *k = kernels_by_name(names[i]);
        if (k)
            CHECK(k->sparse && (!k->gather || k->gather == k->sparse),
                  "%s: no sparse kernels, or gathers that are not its sparse kernels", k->name);
    }
    const kernels *avx512 = kernels_avx512(), *exact = kernels_avx512_exact(), *amx = kernels_amx();
    CHECK(!avx512 || avx512->gather, "avx512: gathers with its dots' bits");
    CHECK(!exact || (exact->sparse == avx512->sparse && !exact->gather),
          "avx512-exact: avx512's axpys and no gathers (its dots follow another order)");
    CHECK(!amx || (amx->sparse == avx512->sparse && amx->gather == avx512->gather), "amx: avx512's sparse kernels");
}

int main(void) {
    rng_seed(0x2545f4914f6cdd1dull);
    setenv("PI2_KERNELS", "scalar", 1); /* before any kernel table is chosen */
    test_dispatch();

    /* the sets with sparse kernels of their own (amx and avx512-exact name avx512's) */
    const kernels *own[] = {kernels_scalar(), kernels_avx2(), kernels_avx512(), kernels_neon(),
                            kernels_neon_without_sdot()};
    const char *names[] = {"scalar", "avx2", "avx512", "neon", "neon without SDOT"};
    for (size_t i = 0; i < sizeof own / sizeof *own; i++) {
        if (own[i]) sets[nsets++] = own[i];
        else SKIP("kernel set %s (this CPU lacks it)", names[i]);
    }

    /* 4128 and 16416: whole runs of 8 blocks (the avx512 Q4_0 axpy's vector scales) and a
     * remainder; 16416: past the 16384 elements the fast Q4_0 dot sums in one chunk */
    const int quant_lengths[] = {32, 64, 96, 160, 512, 544, 4096, 4128, 16416};
    const int float_lengths[] = {0, 1, 7, 31, 33, 63, 64, 65, 127, 257, 1000, 4097};
    const int nq = (int)(sizeof quant_lengths / sizeof *quant_lengths);
    const int nf = (int)(sizeof float_lengths / sizeof *float_lengths);
    test_type(GGML_TYPE_F32, float_lengths, nf);
    test_type(GGML_TYPE_F16, float_lengths, nf);
    test_type(GGML_TYPE_Q8_0, quant_lengths, nq);
    test_type(GGML_TYPE_Q4_0, quant_lengths, nq);
    return test_summary();
}

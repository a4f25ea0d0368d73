/* The predictor gemv (lib/kernels/pred_gemv.h): the AVX2, AVX-512 and NEON versions give
 * the scalar reference's bits, for row counts around their row blocking (1 to
 * 40 rows: full and partial passes), lengths around the 16- and 32-element
 * steps up to and past the first stage's 4096 (where AVX-512 changes its
 * row grouping), and contiguous, padded and odd row strides; they write no
 * result past the last row; and the scalar reference is a dot product
 * (checked against a double-precision sum). The Q8_0 version gives the dense
 * dot_q8_0's bits of the kernel set it is offered for, row by row. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/f16.h"
#include "kernels/kernels.h"
#include "kernels/pred_gemv.h"
#include "util/synth_rng.h"
#include "test.h"

#define MAX_ROWS 40
#define MAX_N 4113
#define MAX_PAD 8 /* elements between rows */

static void fill(uint16_t *w, size_t count, float *x, int n, uint64_t seed) {
    synth_rng rng = synth_stream(seed, 0);
    for (size_t i = 0; i < count; i++) w[i] = f32_to_f16((float)synth_normal(&rng));
    for (int i = 0; i < n; i++) x[i] = (float)synth_normal(&rng);
}

/* Q8_0 rows of 32 to 4096 values (a predictor's padded rank up to a first
 * stage's width), 1 to MAX_ROWS rows, contiguous and padded strides. */
static void test_q8_0(void) {
    static const int lengths[] = {32, 64, 96, 128, 160, 192, 256, 4096};
    const kernels *k = kernels_avx512();
    pred_gemv_q8_0_fn fn = k ? k->pred_gemv_q8_0 : NULL;
    CHECK((fn != NULL) == (k != NULL), "a Q8_0 pass kernel iff the avx512 set runs here");
    CHECK(kernels_scalar()->pred_gemv_q8_0 == NULL, "no Q8_0 pass kernel for the scalar set");
    /* predictor.c makes Q8_0 copies where one runs: the neon sets would no longer predict as scalar does */
    CHECK(!kernels_neon() || (!kernels_neon()->pred_gemv_q8_0 && !kernels_neon_without_sdot()->pred_gemv_q8_0),
          "no Q8_0 pass kernel for the neon sets");
    if (!fn) {
        SKIP("kernel set avx512 (this CPU lacks it)");
        return;
    }
    const int max_blocks = 4096 / QK8_0 + 1; /* + a padding block between rows */
    block_q8_0 *w = malloc(sizeof *w * (size_t)max_blocks * MAX_ROWS), *xq = malloc(sizeof *xq * (size_t)max_blocks);
    float *v = malloc(sizeof(float) * (size_t)max_blocks * QK8_0), ref[MAX_ROWS], got[MAX_ROWS + 1];
    for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++)
        for (int pad = 0; pad < 2; pad++) {
            const int n = lengths[l], nb = n / QK8_0;
            const size_t stride = sizeof(block_q8_0) * (size_t)(nb + pad);
            synth_rng rng = synth_stream(0x9b + (uint64_t)l, (uint64_t)pad);
            for (int r = 0; r < MAX_ROWS; r++) {
                for (int i = 0; i < n; i++) v[i] = (float)synth_normal(&rng);
                k->quantize_q8_0(v, (block_q8_0 *)((char *)w + (size_t)r * stride), n);
            }
            for (int i = 0; i < n; i++) v[i] = (float)synth_normal(&rng);
            k->quantize_q8_0(v, xq, n);
            for (int r = 0; r < MAX_ROWS; r++) ref[r] = k->dot_q8_0((const block_q8_0 *)((char *)w + (size_t)r * stride), xq, n);
            for (int rows = 1; rows <= MAX_ROWS; rows++) {
                memset(got, 0xff, sizeof got);
                fn(w, stride, rows, xq, n, got);
                CHECK(!memcmp(got, ref, sizeof(float) * (size_t)rows), "q8_0 n=%d stride=%zu rows=%d: not dot_q8_0's bits",
                      n, stride, rows);
                uint32_t past;
                memcpy(&past, &got[rows], sizeof past);
                CHECK(past == 0xffffffffu, "q8_0 n=%d rows=%d: wrote past the last row", n, rows);
            }
        }
    free(w);
    free(xq);
    free(v);
}

int main(void) {
    test_q8_0();
    static const int lengths[] = {1, 7, 15, 16, 17, 31, 32, 33, 47, 48, 128, 130, 1024, 1031, 4096, 4113};
    static const int pads[] = {0, 1, MAX_PAD}; /* contiguous, odd and padded strides */
    const kernels *avx2 = kernels_avx2(), *avx512 = kernels_avx512(), *neon = kernels_neon();
    const struct {
        const char *name;
        pred_gemv_f16_fn fn;
    } isas[] = {{"avx2", avx2 ? avx2->pred_gemv_f16 : NULL},
                {"avx512", avx512 ? avx512->pred_gemv_f16 : NULL},
                {"neon", neon ? neon->pred_gemv_f16 : NULL}};
    const size_t max_stride = (MAX_N + MAX_PAD) * sizeof(uint16_t);
    uint16_t *w = malloc(max_stride * MAX_ROWS);
    float *x = malloc(sizeof(float) * MAX_N), ref[MAX_ROWS], got[MAX_ROWS + 1];
    int tested_isas = 0;
    for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++)
        for (size_t p = 0; p < sizeof pads / sizeof *pads; p++) {
            const int n = lengths[l];
            const size_t stride = (size_t)(n + pads[p]) * sizeof(uint16_t);
            fill(w, stride / sizeof(uint16_t) * MAX_ROWS, x, n, 100 + (uint64_t)n + 7919 * p);
            pred_gemv_f16_scalar(w, stride, MAX_ROWS, x, n, ref);
            double worst = 0;
            for (int r = 0; r < MAX_ROWS; r++) {
                const uint16_t *row = (const uint16_t *)((const char *)w + (size_t)r * stride);
                double exact = 0, mag = 0;
                for (int i = 0; i < n; i++) {
                    exact += (double)f16_to_f32(row[i]) * x[i];
                    mag += fabs((double)f16_to_f32(row[i]) * x[i]);
                }
                worst = fmax(worst, fabs(ref[r] - exact) / (mag + 1e-30));
            }
            CHECK(worst < 1e-5, "scalar n=%d stride=%zu: relative error %.3g against a double sum", n, stride, worst);
            /* each row's result depends on that row alone: the first `rows` of ref are the expected bits */
            for (int rows = 1; rows <= MAX_ROWS; rows++)
                for (size_t k = 0; k < sizeof isas / sizeof *isas; k++) {
                    if (!isas[k].fn) continue;
                    tested_isas |= 1 << k;
                    memset(got, 0xff, sizeof got);
                    isas[k].fn(w, stride, rows, x, n, got);
                    CHECK(!memcmp(got, ref, sizeof(float) * (size_t)rows),
                          "%s n=%d stride=%zu rows=%d: not the scalar bits", isas[k].name, n, stride, rows);
                    uint32_t past;
                    memcpy(&past, &got[rows], sizeof past);
                    CHECK(past == 0xffffffffu, "%s n=%d rows=%d: wrote past the last row", isas[k].name, n, rows);
                }
        }
    for (size_t k = 0; k < sizeof isas / sizeof *isas; k++)
        if (!(tested_isas & 1 << k)) SKIP("kernel set %s (this CPU lacks it)", isas[k].name);
    CHECK(kernels_best()->pred_gemv_f16 != NULL, "a version for the chosen set");
    CHECK(kernels_scalar()->pred_gemv_f16 == pred_gemv_f16_scalar, "the scalar set: the scalar version");
    /* (the ISA versions by the table only: an ARM64 build has no x86 symbols) */
    CHECK(!avx2 || avx2->pred_gemv_f16 != pred_gemv_f16_scalar, "the avx2 set: avx2's");
    CHECK(!avx512 || avx512->pred_gemv_f16 != pred_gemv_f16_scalar, "the avx512 set: avx512's");
    CHECK(!kernels_amx() || kernels_amx()->pred_gemv_f16 == avx512->pred_gemv_f16, "the amx set: avx512's");
    CHECK(!kernels_avx512_exact() || kernels_avx512_exact()->pred_gemv_f16 == avx512->pred_gemv_f16,
          "the avx512-exact set: avx512's");
    CHECK(!neon || neon->pred_gemv_f16 != pred_gemv_f16_scalar, "the neon set: neon's");
    CHECK(!neon || kernels_neon_without_sdot()->pred_gemv_f16 == neon->pred_gemv_f16, "the neon sets: the same");
    free(w);
    free(x);
    return test_summary();
}

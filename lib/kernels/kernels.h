/* Hot kernels: quantization, dequantization and dot products for the
 * weight types pi2 supports, with the other kernel families of the same set.
 * Each has a scalar reference; AVX2 and AVX-512 versions (NEON on AArch64)
 * are picked at run time (PI2_KERNELS=scalar|avx2|avx512|avx512-exact|amx|neon
 * forces one; amx is avx512 with the prefill product on AMX tiles). avx512-exact is avx512 with llama.cpp's (slower) summation
 * order in the quantized dots: it exists to show agreement with llama.cpp
 * bit for bit (tests/test_oracle.c), the default avx512 is for speed.
 *
 * Activation handling follows llama.cpp: for Q4_0/Q8_0 weights the activation
 * vector is first quantized to Q8_0 (quantize_q8_0), for F16 weights it is
 * converted to F16; dot products then take weight row + converted activation.
 *
 * How a set is chosen, for every family at once: a set is one table (struct
 * kernels) that names its dense kernels, its sparse gathers and axpys, its
 * predictor gemvs, its prefill products and its bundle checksum. Each ISA
 * file defines its tables (kernels_scalar.c, kernels_avx2.c, kernels_avx512.c,
 * kernels_neon.c; amx is made from avx512's in kernels.c) and is compiled
 * only for its architecture, with its flags. kernels.c alone asks the CPU what it runs
 * (CPUID on x86-64, HWCAP on AArch64) and offers a table only where it
 * runs; kernels_best() takes the fastest offered, or PI2_KERNELS's. Callers
 * take every family from that one table, so the families cannot disagree.
 *
 * Errors: none: the kernels trust the caller's lengths, alignment and types
 * (the caller checks shapes); dequantize_row and quantize_row skip an
 * unsupported type. A getter returns NULL for a set this CPU cannot run; a
 * bad PI2_KERNELS gets a warning (log_warn). */
#ifndef PI2_KERNELS_H
#define PI2_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "gguf/ggml_types.h"
#include "kernels/gemm.h"
#include "kernels/lanesum.h"
#include "kernels/pred_gemv.h"
#include "kernels/sparse_kernels.h"

typedef struct {
    const char *name; /* "scalar", "avx2", "avx512", "avx512-exact", "amx", "neon", "neon (no SDOT)" */
    /* n: any length */
    float (*dot_f32)(const float *w, const float *x, int n);
    float (*dot_f16)(const uint16_t *w, const uint16_t *x, int n);
    /* out[r] = dot_f16(w + r * row_stride, x, n) for r < rows (row_stride in
     * elements), bit for bit: attention's V . p over V stored transposed.
     * Faster than one call a row where dot_f16 ends in a serial chain (the
     * avx512 sets' double leftovers): the rows' chains run side by side. */
    void (*dot_f16_rows)(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, int n, float *out);
    /* out[j * out_stride + r] = dot_f16(w + r * row_stride, x + j * x_stride, n)
     * for r < rows and j < nx (strides in elements), bit for bit: attention's
     * K . q and V . p for several of a prompt's tokens at once, each row
     * widened once for all of them where the set has a tiled form
     * (dot_f16_rows_tile.h otherwise). scratch: nx * n floats it may overwrite. */
    void (*dot_f16_rows_tile)(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, size_t x_stride,
                              int nx, int n, float *out, size_t out_stride, float *scratch);
    /* n: a multiple of 32 */
    float (*dot_q8_0)(const block_q8_0 *w, const block_q8_0 *x, int n);
    float (*dot_q4_0)(const block_q4_0 *w, const block_q8_0 *x, int n);
    /* activation conversion */
    void (*quantize_q8_0)(const float *x, block_q8_0 *y, int n); /* n: multiple of 32 */
    void (*f32_to_f16_row)(const float *x, uint16_t *y, int n);
    /* y[i] += a * dequant(w)[i], for the down projection of sparse decode */
    void (*axpy_f32)(float *y, float a, const float *w, int n);
    /* y[r] = dot_q4_0(row r, x, n) for r < nrows, row r starting row_stride bytes
     * after row r-1, bit for bit. Faster than nrows dot calls: the activation-side
     * work (regrouping, offset correction, scales) is done once for all rows. */
    void (*gemv_q4_0)(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n);
    /* the same for Q8_0 rows, bit for bit dot_q8_0's; NULL in a set where one
     * dot_q8_0 call a row is as fast (ops.c then calls it row by row) */
    void (*gemv_q8_0)(const block_q8_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n);
    /* the prefill's Q4_0 weights x tokens product (gemm.h: its own summation
     * order, the same bits in every set) */
    gemm_q4_0_fn gemm_q4_0;
    /* and of F32 / F16 weights, in tinyBLAS order (gemm.h), the same bits in every set */
    gemm_f32_fn gemm_f32;
    gemm_f16_fn gemm_f16;
    /* y[i] = exp(x[i] - max) for i < n; returns their sum (in double, as ggml) */
    double (*softmax_exp)(float *y, const float *x, float max, int n);
    /* h[i] = silu(g[i]) * u[i]; each h[i] depends on g[i] and u[i] alone, not on
     * n or on where the range starts (threads and workers split neuron ranges) */
    void (*silu_mul)(float *h, const float *g, const float *u, int n);

    /* ---- the set's other families ---- */
    /* sparse gathers and axpys (sparse_kernels.h); the axpys give the same
     * bits in every set */
    const sparse_kernels *sparse;
    /* sparse, where its gather dots are this set's dense dots bit for bit
     * (the gate-first FFN mixes the two); NULL in avx512-exact, whose dots
     * follow llama.cpp's order: one dense dot a row there */
    const sparse_kernels *gather;
    /* the predictors' F16 gemv (pred_gemv.h), the same bits in every set */
    pred_gemv_f16_fn pred_gemv_f16;
    /* their Q8_0 gemv, dot_q8_0's bits; NULL where none is faster than a
     * dot a row. Where it runs, predictor.c keeps float predictors as Q8_0
     * copies, which changes their output: so the scalar set has none, nor
     * the neon sets, which promise the scalar set's bits. */
    pred_gemv_q8_0_fn pred_gemv_q8_0;
    /* the bundle checksum (lanesum.h), the same bits in every set */
    lanesum_fn lanesum64;
} kernels;

/* Row r of a matrix of nrows rows row_stride bytes apart, or NULL past its
 * end: the row a gemv prefetches as it reads an earlier one. */
static inline const char *kernels_row_or_null(const void *w, size_t row_stride, int nrows, int r) {
    return r < nrows ? (const char *)w + (size_t)r * row_stride : NULL;
}

const kernels *kernels_best(void);        /* chosen once; honours PI2_KERNELS */
const kernels *kernels_scalar(void);
const kernels *kernels_avx2(void);        /* NULL if this CPU lacks AVX2+FMA+F16C */
const kernels *kernels_avx512(void);      /* NULL if this CPU lacks AVX-512F/BW/VL/DQ/VNNI */
/* avx512 with the other prefetch of the dense Q4_0 gemv (each row's next row
 * into L2 where Zen 5 takes the next pass as one stream into L1, or the
 * reverse): the same bits, for the tests and kernel-bench */
const kernels *kernels_avx512_other_prefetch(void);
const kernels *kernels_avx512_exact(void); /* likewise */
/* AArch64 (NULL elsewhere): NEON kernels that give the scalar set's bits
 * exactly, in every family (kernels_neon.c says which stay scalar); the
 * integer block sums by SDOT where the CPU has the dot-product extension */
const kernels *kernels_neon(void);
const kernels *kernels_neon_without_sdot(void); /* the same without SDOT, which a CPU may lack (tests) */
/* avx512 with the prefill product on AMX tiles; NULL without AMX-INT8 or the
 * kernel's leave to use it */
const kernels *kernels_amx(void);
/* "scalar", "avx2", "avx512", "avx512-exact", "amx" or "neon"; NULL if unknown or this CPU cannot run it */
const kernels *kernels_by_name(const char *name);

/* Reference (scalar) conversions; also used for writing weights. */
void quantize_row_q8_0_ref(const float *x, block_q8_0 *y, int64_t n);
void quantize_row_q4_0_ref(const float *x, block_q4_0 *y, int64_t n);
/* Reference F32 dot, softmax exponentials and SwiGLU (libm expf), for the kernel tables. */
float dot_f32_ref(const float *w, const float *x, int n);
double softmax_exp_ref(float *y, const float *x, float max, int n);
void silu_mul_ref(float *h, const float *g, const float *u, int n);
/* Dequantize n elements of a row of any supported type to float. */
void dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);
/* Quantize n floats to `type` (F32 copy, F16, Q8_0, Q4_0); n a multiple of the block size. */
void quantize_row(uint32_t type, const float *src, void *dst, int64_t n);

#endif

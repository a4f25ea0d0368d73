/* The float product's loops over blocks, token runs, column chunks and token
 * groups (gemm_float_block.h), shared by the ISA files that include it. The
 * includer defines, for its ISA:
 *   widen_f16(dst, h, kc)             kc F16 values of a row or token, widened to F32
 *   group(wp, xp, kc, acc, nr, nt)    acc[r * GF_ROW_STRIDE + t * 16] += wp[r] . xp[t]
 *                                     for r < nr, t < nt (packed rows GF_CHUNK apart;
 *                                     gemm_float_rows.h has one, row by row)
 *   reduce16(acc)                     one accumulator's lanes summed as gemm.h says
 * and gets gemm_float(), and GEMM_FLOAT_ENTRIES(ISA) to define gemm_f32_ISA
 * and gemm_f16_ISA over it.
 *
 * Errors: none: loops over the caller's buffers, scratch sized by
 * gemm_float_scratch_bytes. */
#ifndef PI2_KERNELS_GEMM_FLOAT_DRIVE_H
#define PI2_KERNELS_GEMM_FLOAT_DRIVE_H

#include <stdbool.h>
#include <string.h>

#include "kernels/gemm_float_block.h"

static const void *column(const void *row, bool f16, int k) {
    return (const char *)row + (size_t)k * (f16 ? sizeof(uint16_t) : sizeof(float));
}

/* kc values of a row or token as F32 into dst */
static void copy_widened(float *dst, const void *src, bool f16, int kc) {
    if (f16) widen_f16(dst, src, kc);
    else memcpy(dst, src, sizeof(float) * (size_t)kc);
}

static inline __attribute__((always_inline)) void gemm_float(const char *w, size_t rs, int nrows,
                                                             const void *const *x, bool f16, int n_tok, int n,
                                                             float *y, size_t ys, void *scratch) {
    float *acc = gf_accumulators(scratch), *wp = gf_weights(scratch), *xp = gf_activations(scratch);
    for (int rb = 0; rb < nrows; rb += GF_ROWS) {
        const int nr = nrows - rb < GF_ROWS ? nrows - rb : GF_ROWS;
        const char *wb = w + (size_t)rb * rs;
        for (int tr = 0; tr < n_tok; tr += GF_TOKEN_RUN) {
            const int ntr = n_tok - tr < GF_TOKEN_RUN ? n_tok - tr : GF_TOKEN_RUN;
            for (int r = 0; r < nr; r++) memset(acc + r * GF_ROW_STRIDE, 0, sizeof(float) * 16 * (size_t)ntr);
            for (int k0 = 0; k0 < n; k0 += GF_CHUNK) {
                const int kc = n - k0 < GF_CHUNK ? n - k0 : GF_CHUNK;
                for (int r = 0; r < nr; r++)
                    copy_widened(wp + r * GF_CHUNK, column(wb + (size_t)r * rs, f16, k0), f16, kc);
                for (int t0 = 0; t0 < ntr; t0 += GF_TOKENS) {
                    const int nt = ntr - t0 < GF_TOKENS ? ntr - t0 : GF_TOKENS;
                    for (int t = 0; t < nt; t++)
                        copy_widened(xp + t * GF_CHUNK, column(x[tr + t0 + t], f16, k0), f16, kc);
                    group(wp, xp, kc, acc + t0 * 16, nr, nt);
                }
            }
            for (int r = 0; r < nr; r++)
                for (int t = 0; t < ntr; t++)
                    y[(size_t)(tr + t) * ys + (size_t)(rb + r)] = reduce16(acc + r * GF_ROW_STRIDE + t * 16);
        }
    }
}

#define GEMM_FLOAT_ENTRIES(ISA)                                                                                   \
    void gemm_f32_##ISA(const float *w, size_t row_stride, int nrows, const float *const *x, int n_tok, int n,    \
                        float *y, size_t y_stride, void *scratch) {                                               \
        gemm_float((const char *)w, row_stride, nrows, (const void *const *)x, false, n_tok, n, y, y_stride,      \
                   scratch);                                                                                      \
    }                                                                                                             \
    void gemm_f16_##ISA(const uint16_t *w, size_t row_stride, int nrows, const uint16_t *const *x, int n_tok,     \
                        int n, float *y, size_t y_stride, void *scratch) {                                        \
        gemm_float((const char *)w, row_stride, nrows, (const void *const *)x, true, n_tok, n, y, y_stride,       \
                   scratch);                                                                                      \
    }

#endif

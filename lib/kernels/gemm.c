/* The prefill product's packing of activations and its scalar reference
 * (gemm.h states the semantics every ISA version follows). */
#include "kernels/gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/f16.h"
#include "util/pages.h"

static size_t tiles_of(int n_tok) { return (size_t)(n_tok + GEMM_TILE - 1) / GEMM_TILE; }

/* the three arrays' bytes for a capacity */
static void acts_sizes(int max_tok, int max_cols, size_t *qs, size_t *d, size_t *sum) {
    const size_t cells = tiles_of(max_tok) * (size_t)(max_cols / QK8_0) * GEMM_TILE;
    *qs = (cells * 32 + 63) / 64 * 64 + 64;
    *d = (cells * sizeof(float) + 63) / 64 * 64 + 64;
    *sum = (cells * sizeof(int32_t) + 63) / 64 * 64 + 64;
}

size_t gemm_acts_bytes(int max_tok, int max_cols) {
    size_t qs, d, sum;
    acts_sizes(max_tok, max_cols, &qs, &d, &sum);
    return qs + d + sum;
}

int gemm_acts_init(gemm_acts *a, int max_tok, int max_cols) {
    memset(a, 0, sizeof *a);
    size_t qs, d, sum;
    acts_sizes(max_tok, max_cols, &qs, &d, &sum);
    a->qs = aligned_alloc(64, qs);
    a->d = aligned_alloc(64, d);
    a->sum = aligned_alloc(64, sum);
    if (!a->qs || !a->d || !a->sum) {
        gemm_acts_free(a);
        return -1;
    }
    a->max_tok = max_tok;
    a->max_nb = max_cols / QK8_0;
    return 0;
}

void gemm_acts_free(gemm_acts *a) {
    free(a->qs);
    free(a->d);
    free(a->sum);
    memset(a, 0, sizeof *a);
}

void gemm_acts_release(gemm_acts *a) {
    size_t qs, d, sum;
    acts_sizes(a->max_tok, a->max_nb * QK8_0, &qs, &d, &sum);
    pages_release(a->qs, qs);
    pages_release(a->d, d);
    pages_release(a->sum, sum);
}

void gemm_acts_begin(gemm_acts *a, int n_tok, int n) {
    a->n_tok = n_tok;
    a->nb = n / QK8_0;
    const int padded = (int)tiles_of(n_tok) * GEMM_TILE;
    for (int t = n_tok; t < padded; t++)
        for (int b = 0; b < a->nb; b++) {
            const size_t i = gemm_acts_index(a, t, b);
            memset(a->qs + i * 32, 0, 32);
            a->d[i] = 0.0f;
            a->sum[i] = 0;
        }
}

void gemm_acts_put(gemm_acts *a, int t, const block_q8_0 *x) {
    for (int b = 0; b < a->nb; b++) {
        const size_t i = gemm_acts_index(a, t, b);
        int8_t *q = a->qs + i * 32;
        memcpy(q, x[b].qs, 32);
        a->d[i] = f16_to_f32(x[b].d);
        int32_t s = 0;
        for (int k = 0; k < 32; k++) s += q[k];
        a->sum[i] = s;
    }
}

void gemm_acts_pack(gemm_acts *a, const block_q8_0 *const *x, int n_tok, int n) {
    gemm_acts_begin(a, n_tok, n);
    for (int t = 0; t < n_tok; t++) gemm_acts_put(a, t, x[t]);
}

/* weights re-laid for one tile of GEMM_TILE rows: [nb][8][GEMM_TILE][4] quants, then [nb][GEMM_TILE] scales */
size_t gemm_scratch_bytes(int nb) { return (size_t)nb * (8 * GEMM_TILE * 4 + GEMM_TILE * sizeof(float)); }

void gemm_q4_0_ref(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                   size_t y_stride, void *scratch) {
    (void)scratch;
    for (int r = 0; r < nrows; r++) {
        const block_q4_0 *row = (const block_q4_0 *)((const char *)w + (size_t)r * row_stride);
        for (int t = 0; t < x->n_tok; t++) {
            float acc = 0.0f;
            for (int b = 0; b < x->nb; b++) {
                const int8_t *xq = gemm_acts_quants(x, t, b);
                int32_t isum = 0;
                for (int i = 0; i < 16; i++) {
                    isum += ((row[b].qs[i] & 0x0f) - 8) * xq[i];
                    isum += ((row[b].qs[i] >> 4) - 8) * xq[i + 16];
                }
                const float s = f16_to_f32(row[b].d) * x->d[gemm_acts_index(x, t, b)];
                acc = fmaf((float)isum, s, acc);
            }
            y[(size_t)t * y_stride + (size_t)r] = acc;
        }
    }
}

/* Compiled for baseline x86-64 with -std=c11 (GCC: -ffp-contract=off), so
 * the products and sums below are never fused, as in ggml's scalar loops. */
#include "engine/ops_llama.h"

#include <math.h>

float llama_dot_f32(const kernels *k, const float *w, const float *x, int n) {
    const int np = n & ~63;
    float sum = k->dot_f32(w, x, np); /* ggml's 64-wide steps and their reduction */
    for (int i = np; i < n; i++) sum += w[i] * x[i];
    return sum;
}

/* out[r - r0] = W[r] . in */
static void matvec_rows_packed_llama(const kernels *k, const weight *w, const act_vec *in, float *out, long r0,
                                     long r1) {
    if (w->type != GGML_TYPE_F32) {
        matvec_rows_packed(k, w, in, out, r0, r1);
        return;
    }
    for (long r = r0; r < r1; r++)
        out[r - r0] = llama_dot_f32(k, (const float *)((const char *)w->data + (size_t)r * w->row_bytes), in->f32,
                                    (int)w->cols);
}

void llama_matvec_rows(const kernels *k, const weight *w, const act_vec *in, float *out, long r0, long r1) {
    matvec_rows_packed_llama(k, w, in, out + r0, r0, r1);
}

void llama_silu_mul(const kernels *k, float *h, const float *g, const float *u, long i0, long i1, long n) {
    k->silu_mul(h, g, u, (int)(i1 - i0));
    const long tail = n & ~15L;
    for (long i = i0 > tail ? i0 : tail; i < i1; i++) {
        const float x = g[i - i0], silu = x / (1.0f + expf(-x)); /* ggml_silu_f32, then ggml's separate mul */
        h[i - i0] = silu * u[i - i0];
    }
}

void llama_ffn_act_rows(const kernels *k, const model *m, const layer_weights *w, const act_vec *in, float *hb,
                        long i0, long i1, uint32_t *counts) {
    ffn_act_rows_with(k, m, w, in, hb, i0, i1, counts, matvec_rows_packed_llama, llama_silu_mul);
}

#include "gemm.h"

long gemm_tile_rows(const weight *w) {
    long rows = (long)(GEMM_TILE_BYTES / (w->row_bytes ? w->row_bytes : 1));
    return rows > 0 ? rows : 1;
}

void gemm_rows(const kernels *k, const weight *w, const act_vec *in, int n_tok, float *out, size_t stride, long r0,
               long r1) {
    long tile = gemm_tile_rows(w);
    for (long t0 = r0; t0 < r1; t0 += tile) {
        long t1 = t0 + tile < r1 ? t0 + tile : r1;
        for (int t = 0; t < n_tok; t++) matvec_rows(k, w, &in[t], out + (size_t)t * stride, t0, t1);
    }
}

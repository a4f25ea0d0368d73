/* Weights x tokens, blocked so each weight row is fetched from memory once
 * per prompt instead of once per token: a tile of rows small enough to stay
 * in L2 is dotted with every token's activation before the next tile is
 * read. Each (row, token) value is the same matvec_rows call decode makes,
 * so prefill and token-by-token decode agree bit for bit. */
#ifndef PI2_GEMM_H
#define PI2_GEMM_H

#include <stddef.h>

#include "engine/ops.h"

/* Bytes of weights per tile: a quarter of a 1 MiB L2, leaving room for activations. */
#define GEMM_TILE_BYTES (256u << 10)

/* Rows per tile for w (at least 1). */
long gemm_tile_rows(const weight *w);

/* out[t * stride + r] = W[r] . in[t] for rows [r0, r1) and tokens [0, n_tok). */
void gemm_rows(const kernels *k, const weight *w, const act_vec *in, int n_tok, float *out, size_t stride, long r0,
               long r1);

#endif

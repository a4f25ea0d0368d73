/* The float product's group (gemm_float_drive.h) for an ISA file that
 * blocks one weight row at a time: its block(w, xs, kc, acc, nt) adds one
 * packed row against nt tokens (up to GF_TOKENS, packed GF_CHUNK apart) into
 * acc[t * 16]. Each row of the block meets the group's tokens all at once,
 * or, in a last group of fewer, one token at a time. Include it after
 * block() and before gemm_float_drive.h.
 *
 * Errors: none: arithmetic on the caller's packed buffers. */
#ifndef PI2_KERNELS_GEMM_FLOAT_ROWS_H
#define PI2_KERNELS_GEMM_FLOAT_ROWS_H

#include "kernels/gemm_float_block.h"

static inline __attribute__((always_inline)) void group(const float *wp, const float *xp, int kc, float *acc, int nr,
                                                        int nt) {
    for (int r = 0; r < nr; r++) {
        float *a = acc + r * GF_ROW_STRIDE;
        if (nt == GF_TOKENS) block(wp + r * GF_CHUNK, xp, kc, a, GF_TOKENS);
        else
            for (int t = 0; t < nt; t++) block(wp + r * GF_CHUNK, xp + t * GF_CHUNK, kc, a + t * 16, 1);
    }
}

#endif

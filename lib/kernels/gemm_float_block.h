/* How the ISA versions of the float product (gemm.h) block their work, and
 * the scratch that takes. A block of GF_ROWS weight rows stays in L2 while up
 * to GF_TOKEN_RUN tokens pass over it. The columns go in chunks of GF_CHUNK:
 * the block's chunk of weights is copied (widened to F32) side by side into
 * scratch, where it stays in L1 while every group of GF_TOKENS tokens passes
 * over it, each group's chunk of activations copied (widened) next to it.
 * The copies matter: rows of a 4096-column F32 matrix lie 16 KiB apart, so
 * read in place they all fall in the same few L1 sets and evict each other
 * (measured: 45 GMAC/s in place, on 7B shapes). The 16-lane accumulators of
 * the rows x tokens live in scratch between chunks (storing a float is exact,
 * so the order is untouched).
 *
 * Errors: none: constants and pointer arithmetic on the caller's scratch. */
#ifndef PI2_KERNELS_GEMM_FLOAT_BLOCK_H
#define PI2_KERNELS_GEMM_FLOAT_BLOCK_H

#include <stddef.h>

enum {
    GF_ROWS = 32,      /* weight rows per block: 32 x 4096 F32 = 512 KiB */
    GF_TOKEN_RUN = 64, /* tokens per pass over a block: their accumulators, 32 x 64 x 64 B = 128 KiB */
    GF_TOKENS = 6,     /* tokens per group: 4 rows x 6 tokens = 24 of the 32 zmm registers */
    GF_CHUNK = 256,    /* columns per chunk (a multiple of 16): 32 rows x 256 F32 = 32 KiB */
};

/* scratch: [GF_ROWS][GF_TOKEN_RUN][16] accumulators, [GF_ROWS][GF_CHUNK]
 * weights, [GF_TOKENS][GF_CHUNK] activations, all F32 */
#define GF_ROW_STRIDE (GF_TOKEN_RUN * 16) /* floats from a row's accumulators to the next row's */
#define GF_SCRATCH_FLOATS (GF_ROWS * GF_ROW_STRIDE + GF_ROWS * GF_CHUNK + GF_TOKENS * GF_CHUNK)
static inline float *gf_accumulators(void *scratch) { return scratch; }
static inline float *gf_weights(void *scratch) { return (float *)scratch + GF_ROWS * GF_ROW_STRIDE; }
static inline float *gf_activations(void *scratch) { return gf_weights(scratch) + GF_ROWS * GF_CHUNK; }

#endif

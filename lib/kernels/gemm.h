/* The prefill's matrix product: Q4_0 weights x a block of Q8_0 tokens.
 *
 * Semantics (gemm_q4_0_ref, which every ISA version equals bit for bit):
 *
 *     y[t][r] = 0
 *     for each block b of 32 columns, in order:
 *         isum = sum_i (q[r][b][i] - 8) * x[t][b][i]        exact, int32
 *         s    = f16(d_w[r][b]) * f16(d_x[t][b])              one float multiply
 *         y[t][r] = fmaf((float)isum, s, y[t][r])            one rounding
 *
 * Every (row, token) value is computed alone, so it does not depend on how
 * many tokens share the call, on the tile a row falls in, or on the thread
 * that takes it: a prompt gives the same bits in one call or in chunks. The
 * order differs from decode's dot_q4_0 (which sums 4-element partials of 4
 * blocks side by side), so a prompt token's values differ from the same
 * token decoded alone in the last bits (docs/prefill.md bounds it).
 *
 * The layout makes the product a matrix engine's: tokens are packed once per
 * input into tiles of GEMM_TILE tokens (gemm_acts_pack), zero-padded, and each
 * ISA version re-lays a tile of GEMM_TILE weight rows once (into the caller's
 * scratch) for every token tile. AMX multiplies the 16x32 tiles in hardware;
 * AVX-512 VNNI and AVX2 keep 16 (8) rows in the lanes of a register.
 *
 * Errors: only gemm_acts_init can fail (-1 when out of memory); packing and
 * the products trust the caller's shapes, capacity and scratch. */
#ifndef PI2_KERNELS_GEMM_H
#define PI2_KERNELS_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "gguf/ggml_types.h"

#define GEMM_TILE 16 /* tokens per packed tile and weight rows per re-laid tile */

/* A block of tokens' Q8_0 activations, packed by tiles of GEMM_TILE tokens. */
typedef struct {
    int n_tok, nb;      /* tokens; Q8_0 blocks per token (columns / 32) */
    int8_t *qs;         /* [tile][nb][GEMM_TILE][32] quants, padding tokens zero */
    float *d;           /* [tile][nb][GEMM_TILE] scales (padding 0) */
    int32_t *sum;       /* [tile][nb][GEMM_TILE] sum of the block's 32 quants */
    int max_tok, max_nb; /* capacity */
} gemm_acts;

/* Capacity for up to max_tok tokens of up to max_cols columns (a multiple of 32).
 * 0, or -1 when out of memory (then a is left empty). */
int gemm_acts_init(gemm_acts *a, int max_tok, int max_cols);
size_t gemm_acts_bytes(int max_tok, int max_cols); /* what gemm_acts_init allocates */
void gemm_acts_free(gemm_acts *a);
/* Gives the buffers' pages back (pages_release); gemm_acts_begin refills what it uses. */
void gemm_acts_release(gemm_acts *a);
/* Pack n_tok tokens of n columns (x[t]: token t's n / 32 Q8_0 blocks); within capacity. */
void gemm_acts_pack(gemm_acts *a, const block_q8_0 *const *x, int n_tok, int n);
/* The same in steps, so threads can pack tokens side by side: begin sets the
 * shape and zeroes the padding, then put packs each token t < n_tok. */
void gemm_acts_begin(gemm_acts *a, int n_tok, int n);
void gemm_acts_put(gemm_acts *a, int t, const block_q8_0 *x);

/* y[t * y_stride + r] for r < nrows and t < x->n_tok, by the semantics above;
 * row r of w starts r * row_stride bytes in and has x->nb blocks. scratch:
 * gemm_scratch_bytes(x->nb) bytes, 64-byte aligned, one per thread. */
typedef void (*gemm_q4_0_fn)(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                             size_t y_stride, void *scratch);

size_t gemm_scratch_bytes(int nb);

void gemm_q4_0_ref(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                   size_t y_stride, void *scratch);
/* per ISA (gemm_avx2.c, gemm_avx512.c, gemm_amx.c, gemm_neon.c), reached through a kernel set after its
 * CPU check (neon_sdot: with the integer sums by SDOT) */
void gemm_q4_0_avx2(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                    size_t y_stride, void *scratch);
void gemm_q4_0_avx512(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                      size_t y_stride, void *scratch);
void gemm_q4_0_amx(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                   size_t y_stride, void *scratch);
void gemm_q4_0_neon(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                    size_t y_stride, void *scratch);
void gemm_q4_0_neon_sdot(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                         size_t y_stride, void *scratch);

/* ---- F32 and F16 weights ----
 *
 * The product of float weights takes llamafile's tinyBLAS order
 * (kernels/tinyblas.h), the one llama.cpp's CPU backend gives its own prompt
 * batches of F32 and F16 weights:
 *
 *     acc[0..15] = 0
 *     for i < n, in order:  acc[i % 16] = fmaf(w[r][i], x[t][i], acc[i % 16])
 *     y[t][r] = reduce16(acc)       GCC's _mm512_reduce_add_ps
 *
 * with F16 operands widened exactly. x[t] is token t's activations as the
 * weight type takes them (F32, or F16 for F16 weights, the conversion decode
 * makes too). n need not be a multiple of 16: past the end a lane keeps its
 * value. Each value is computed alone, as above, so chunks give the same bits.
 *
 * Every accumulator is one vector of 16 lanes along the columns; the ISA
 * versions hold a block of rows x tokens of them in registers, so a weight
 * vector loaded once serves several tokens and a token's vector several rows.
 * row_stride is in bytes. scratch: gemm_float_scratch_bytes(n), 64-byte aligned. */
typedef void (*gemm_f32_fn)(const float *w, size_t row_stride, int nrows, const float *const *x, int n_tok, int n,
                            float *y, size_t y_stride, void *scratch);
typedef void (*gemm_f16_fn)(const uint16_t *w, size_t row_stride, int nrows, const uint16_t *const *x, int n_tok,
                            int n, float *y, size_t y_stride, void *scratch);

size_t gemm_float_scratch_bytes(int n);

void gemm_f32_ref(const float *w, size_t row_stride, int nrows, const float *const *x, int n_tok, int n, float *y,
                  size_t y_stride, void *scratch);
void gemm_f16_ref(const uint16_t *w, size_t row_stride, int nrows, const uint16_t *const *x, int n_tok, int n,
                  float *y, size_t y_stride, void *scratch);
void gemm_f32_avx2(const float *w, size_t row_stride, int nrows, const float *const *x, int n_tok, int n, float *y,
                   size_t y_stride, void *scratch);
void gemm_f16_avx2(const uint16_t *w, size_t row_stride, int nrows, const uint16_t *const *x, int n_tok, int n,
                   float *y, size_t y_stride, void *scratch);
void gemm_f32_avx512(const float *w, size_t row_stride, int nrows, const float *const *x, int n_tok, int n, float *y,
                     size_t y_stride, void *scratch);
void gemm_f16_avx512(const uint16_t *w, size_t row_stride, int nrows, const uint16_t *const *x, int n_tok, int n,
                     float *y, size_t y_stride, void *scratch);
void gemm_f32_neon(const float *w, size_t row_stride, int nrows, const float *const *x, int n_tok, int n, float *y,
                   size_t y_stride, void *scratch);
void gemm_f16_neon(const uint16_t *w, size_t row_stride, int nrows, const uint16_t *const *x, int n_tok, int n,
                   float *y, size_t y_stride, void *scratch);

/* The packed quants and scale of token t's block b (any tile). */
static inline const int8_t *gemm_acts_quants(const gemm_acts *a, int t, int b) {
    return a->qs + (((size_t)(t / GEMM_TILE) * (size_t)a->nb + (size_t)b) * GEMM_TILE + (size_t)(t % GEMM_TILE)) * 32;
}
static inline size_t gemm_acts_index(const gemm_acts *a, int t, int b) {
    return ((size_t)(t / GEMM_TILE) * (size_t)a->nb + (size_t)b) * GEMM_TILE + (size_t)(t % GEMM_TILE);
}

#endif

/* The prefill product on AMX tiles (gemm.h), for the "amx" kernel set: a tile
 * of 16 weight rows is re-laid once as signed quants (q - 8); then per token
 * tile and block one TDPBSSD multiplies the 16 tokens' 32 quants (A: 16 rows
 * of 32 bytes, straight from the packed activations) by the 16 rows' (B: 8
 * groups of 4 bytes per row), giving the exact int32 block sums of all 256
 * pairs. They are stored to a line buffer and scaled into 16 accumulators
 * (one per token, the rows in the lanes) by the reference's multiply and FMA,
 * so the bits are gemm_q4_0_ref's.
 *
 * The scaling, not the tile multiply, bounds the speed (kernel-bench: the
 * multiplies alone run 2x faster), so the tile unit must never wait for it:
 * blocks go in pairs through four C tiles, one pair multiplied while the
 * previous pair is stored and scaled. Tokens go in chunks of TOKEN_CHUNK so
 * a chunk's packed activations stay in L2 across all the row tiles. */
#include "kernels/gemm_relay_avx512.h"

/* tile registers (macros: the tile intrinsics paste the number into the instruction) */
#define C0 0
#define C1 1
#define C2 2
#define C3 3
#define A_EVEN 4
#define B_EVEN 5
#define A_ODD 6
#define B_ODD 7

#define TOKEN_CHUNK 128 /* 512 KiB of packed activations at 4096 columns */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

static void load_tile_config(void) {
    tile_config c = {.palette = 1};
    for (int t = C0; t <= C3; t++) c.rows[t] = GEMM_TILE, c.colsb[t] = GEMM_TILE * 4; /* int32 sums */
    for (int t = A_EVEN; t <= A_ODD; t += 2) c.rows[t] = GEMM_TILE, c.colsb[t] = 32;    /* a block's quants */
    for (int t = B_EVEN; t <= B_ODD; t += 2) c.rows[t] = 8, c.colsb[t] = GEMM_TILE * 4; /* 8 groups x rows */
    _tile_loadconfig(&c);
}

/* acc[i] += int sums of token i (a line of c) times the block's scales.
 * Always inlined with constant indices, so acc[] lives in registers. */
static inline __attribute__((always_inline)) void scale_block(__m512 acc[GEMM_TILE], const int32_t *c, __m512 dwb,
                                                              const float *dx) {
#pragma GCC unroll 16
    for (int i = 0; i < GEMM_TILE; i++) {
        const __m512 s = _mm512_mul_ps(dwb, _mm512_set1_ps(dx[i]));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + i * GEMM_TILE)), s, acc[i]);
    }
}

/* block b's sums into tile C, through tiles A and B */
#define BLOCK_PRODUCT(C, A, B, b)                                                                                      \
    do {                                                                                                               \
        _tile_zero(C);                                                                                                 \
        _tile_loadd(A, xq + (size_t)(b) * GEMM_TILE * 32, 32);                                                         \
        _tile_loadd(B, wq + (size_t)(b) * BLOCK_BYTES, GEMM_TILE * 4);                                                 \
        _tile_dpbssd(C, A, B);                                                                                         \
    } while (0)

/* the pair of tiles CA, CB (blocks b, b + 1) stored and scaled into acc */
#define STORE_AND_SCALE(CA, CB, b)                                                                                     \
    do {                                                                                                               \
        _tile_stored(CA, c[0], GEMM_TILE * 4);                                                                         \
        _tile_stored(CB, c[1], GEMM_TILE * 4);                                                                         \
        scale_block(acc, c[0], _mm512_load_ps(dw + (size_t)(b) * GEMM_TILE), dx + (size_t)(b) * GEMM_TILE);            \
        scale_block(acc, c[1], _mm512_load_ps(dw + (size_t)((b) + 1) * GEMM_TILE), dx + (size_t)((b) + 1) * GEMM_TILE); \
    } while (0)

enum { BLOCK_BYTES = 8 * GEMM_TILE * 4 }; /* a re-laid block of the weight tile */

/* acc[i] = token i's sums over all nb blocks, for one token tile (xq, dx)
 * and the re-laid weight tile (wq, dw) */
static inline __attribute__((always_inline)) void token_tile(__m512 acc[GEMM_TILE], const int8_t *xq, const float *dx,
                                                             const int8_t *wq, const float *dw, int nb) {
    _Alignas(64) int32_t c[2][GEMM_TILE * GEMM_TILE];
#pragma GCC unroll 16
    for (int i = 0; i < GEMM_TILE; i++) acc[i] = _mm512_setzero_ps();
    int b = 0;
    if (nb >= 2) {
        BLOCK_PRODUCT(C0, A_EVEN, B_EVEN, 0);
        BLOCK_PRODUCT(C1, A_ODD, B_ODD, 1);
        b = 2;
    }
    /* steady state: pair b in C2/C3 (or C0/C1) while pair b - 2 is scaled */
    for (; b + 4 <= nb; b += 4) {
        BLOCK_PRODUCT(C2, A_EVEN, B_EVEN, b);
        BLOCK_PRODUCT(C3, A_ODD, B_ODD, b + 1);
        STORE_AND_SCALE(C0, C1, b - 2);
        BLOCK_PRODUCT(C0, A_EVEN, B_EVEN, b + 2);
        BLOCK_PRODUCT(C1, A_ODD, B_ODD, b + 3);
        STORE_AND_SCALE(C2, C3, b);
    }
    if (b + 2 <= nb) {
        BLOCK_PRODUCT(C2, A_EVEN, B_EVEN, b);
        BLOCK_PRODUCT(C3, A_ODD, B_ODD, b + 1);
        STORE_AND_SCALE(C0, C1, b - 2);
        STORE_AND_SCALE(C2, C3, b);
        b += 2;
    } else if (b >= 2) {
        STORE_AND_SCALE(C0, C1, b - 2);
    }
    if (b < nb) { /* an odd last block */
        BLOCK_PRODUCT(C0, A_EVEN, B_EVEN, b);
        _tile_stored(C0, c[0], GEMM_TILE * 4);
        scale_block(acc, c[0], _mm512_load_ps(dw + (size_t)b * GEMM_TILE), dx + (size_t)b * GEMM_TILE);
    }
}

void gemm_q4_0_amx(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                   size_t y_stride, void *scratch) {
    const int nb = x->nb;
    int8_t *wq = scratch;
    float *dw = (float *)(wq + (size_t)nb * BLOCK_BYTES);
    load_tile_config();
    for (int c0 = 0; c0 < x->n_tok; c0 += TOKEN_CHUNK) {
        const int c1 = x->n_tok - c0 < TOKEN_CHUNK ? x->n_tok : c0 + TOKEN_CHUNK;
        for (int r0 = 0; r0 < nrows; r0 += GEMM_TILE) {
            const int nr = nrows - r0 < GEMM_TILE ? nrows - r0 : GEMM_TILE;
            const __mmask16 live = (__mmask16)((1u << nr) - 1u);
            gemm_relay_q4_0((const block_q4_0 *)((const char *)w + (size_t)r0 * row_stride), row_stride, nr, nb, 8,
                            wq, dw);
            for (int t0 = c0; t0 < c1; t0 += GEMM_TILE) {
                const size_t tile = (size_t)(t0 / GEMM_TILE) * (size_t)nb * GEMM_TILE;
                __m512 acc[GEMM_TILE];
                token_tile(acc, x->qs + tile * 32, x->d + tile, wq, dw, nb);
                const int nt = c1 - t0 < GEMM_TILE ? c1 - t0 : GEMM_TILE;
#pragma GCC unroll 16
                for (int i = 0; i < GEMM_TILE; i++) /* a constant index keeps acc[] in registers */
                    if (i < nt) _mm512_mask_storeu_ps(y + (size_t)(t0 + i) * y_stride + r0, live, acc[i]);
            }
        }
    }
    _tile_release();
}

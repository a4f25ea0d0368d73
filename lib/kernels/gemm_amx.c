/* The prefill product on AMX tiles (gemm.h), for the "amx" kernel set: a tile
 * of 16 weight rows is re-laid once as signed quants (q - 8); then per token
 * tile and block one TDPBSSD multiplies the 16 tokens' 32 quants (A: 16 rows
 * of 32 bytes, straight from the packed activations) by the 16 rows' (B: 8
 * groups of 4 bytes per row), giving the exact int32 block sums of all 256
 * pairs. They are stored to a line buffer and scaled into 16 accumulators
 * (one per token, the rows in the lanes) by the reference's multiply and FMA,
 * so the bits are gemm_q4_0_ref's. Blocks alternate between two C tiles so
 * one block's product runs while the previous one is scaled. */
#include "kernels/gemm_relay_avx512.h"

/* tile registers (macros: the tile intrinsics paste the number into the instruction) */
#define C_EVEN 0
#define C_ODD 1
#define A_EVEN 2
#define B_EVEN 3
#define A_ODD 4
#define B_ODD 5

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

static void load_tile_config(void) {
    tile_config c = {.palette = 1};
    for (int t = C_EVEN; t <= C_ODD; t++) c.rows[t] = GEMM_TILE, c.colsb[t] = GEMM_TILE * 4; /* int32 sums */
    for (int t = A_EVEN; t <= A_ODD; t += 2) c.rows[t] = GEMM_TILE, c.colsb[t] = 32;      /* a block's quants */
    for (int t = B_EVEN; t <= B_ODD; t += 2) c.rows[t] = 8, c.colsb[t] = GEMM_TILE * 4;   /* 8 groups x rows */
    _tile_loadconfig(&c);
}

/* acc[i] += int sums of token i (a line of c) times the block's scales */
static inline void scale_block(__m512 acc[GEMM_TILE], const int32_t *c, __m512 dwb, const float *dx) {
#pragma GCC unroll 16
    for (int i = 0; i < GEMM_TILE; i++) {
        const __m512 s = _mm512_mul_ps(dwb, _mm512_set1_ps(dx[i]));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + i * GEMM_TILE)), s, acc[i]);
    }
}

void gemm_q4_0_amx(const block_q4_0 *w, size_t row_stride, int nrows, const gemm_acts *x, float *y,
                   size_t y_stride, void *scratch) {
    const int nb = x->nb, bstride = 8 * GEMM_TILE * 4;
    int8_t *wq = scratch;
    float *dw = (float *)(wq + (size_t)nb * bstride);
    _Alignas(64) int32_t c[2][GEMM_TILE * GEMM_TILE];
    load_tile_config();
    for (int r0 = 0; r0 < nrows; r0 += GEMM_TILE) {
        const int nr = nrows - r0 < GEMM_TILE ? nrows - r0 : GEMM_TILE;
        const __mmask16 live = (__mmask16)((1u << nr) - 1u);
        gemm_relay_q4_0((const block_q4_0 *)((const char *)w + (size_t)r0 * row_stride), row_stride, nr, nb, 8, wq,
                        dw);
        for (int t0 = 0; t0 < x->n_tok; t0 += GEMM_TILE) {
            const size_t tile = (size_t)(t0 / GEMM_TILE) * (size_t)nb * GEMM_TILE;
            const int8_t *xq = x->qs + tile * 32;
            const float *dx = x->d + tile;
            __m512 acc[GEMM_TILE];
            for (int i = 0; i < GEMM_TILE; i++) acc[i] = _mm512_setzero_ps();
            int b = 0;
            for (; b + 2 <= nb; b += 2) {
                _tile_zero(C_EVEN);
                _tile_loadd(A_EVEN, xq + (size_t)b * GEMM_TILE * 32, 32);
                _tile_loadd(B_EVEN, wq + (size_t)b * bstride, GEMM_TILE * 4);
                _tile_dpbssd(C_EVEN, A_EVEN, B_EVEN);
                _tile_zero(C_ODD);
                _tile_loadd(A_ODD, xq + (size_t)(b + 1) * GEMM_TILE * 32, 32);
                _tile_loadd(B_ODD, wq + (size_t)(b + 1) * bstride, GEMM_TILE * 4);
                _tile_dpbssd(C_ODD, A_ODD, B_ODD);
                _tile_stored(C_EVEN, c[0], GEMM_TILE * 4);
                scale_block(acc, c[0], _mm512_load_ps(dw + (size_t)b * GEMM_TILE), dx + (size_t)b * GEMM_TILE);
                _tile_stored(C_ODD, c[1], GEMM_TILE * 4);
                scale_block(acc, c[1], _mm512_load_ps(dw + (size_t)(b + 1) * GEMM_TILE),
                            dx + (size_t)(b + 1) * GEMM_TILE);
            }
            if (b < nb) {
                _tile_zero(C_EVEN);
                _tile_loadd(A_EVEN, xq + (size_t)b * GEMM_TILE * 32, 32);
                _tile_loadd(B_EVEN, wq + (size_t)b * bstride, GEMM_TILE * 4);
                _tile_dpbssd(C_EVEN, A_EVEN, B_EVEN);
                _tile_stored(C_EVEN, c[0], GEMM_TILE * 4);
                scale_block(acc, c[0], _mm512_load_ps(dw + (size_t)b * GEMM_TILE), dx + (size_t)b * GEMM_TILE);
            }
            const int nt = x->n_tok - t0 < GEMM_TILE ? x->n_tok - t0 : GEMM_TILE;
            for (int i = 0; i < nt; i++) _mm512_mask_storeu_ps(y + (size_t)(t0 + i) * y_stride + r0, live, acc[i]);
        }
    }
    _tile_release();
}

/* Private to lib/kernels/kernels_avx2.c and lib/kernels/sparse_avx2.c (both built with
 * -mavx2 -mfma -mf16c): the avx2 set's F32, F16, Q8_0 and Q4_0 row dots, in
 * one copy, so that a dense dot and a sparse gather of the same row give the
 * same bits (tests/test_sparse_kernels.c holds them to it).
 *
 * Each row dot also prefetches into L2 (T1), at the offset it is reading, the
 * row `next` (NULL: none, the dense dots): the gathers pass the row they read
 * next, which the hardware prefetcher cannot guess. Into L2 as in
 * sparse_avx512.c: prefetches into L1 read slower on Zen 4.
 *
 * Everything is forced inline: GCC 12 judges a small function whose only
 * effect is a prefetch "const" and deletes its calls, and the dense dots'
 * NULL folds the prefetch away.
 *
 * Errors: none: inline arithmetic; the callers check lengths and types. */
#ifndef PI2_KERNELS_AVX2_H
#define PI2_KERNELS_AVX2_H

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/kernels.h"

#define ROW_INLINE static inline __attribute__((always_inline))

ROW_INLINE float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

ROW_INLINE void prefetch_l2(const char *next, size_t off) {
    if (next) _mm_prefetch(next + off, _MM_HINT_T1);
}

/* called as the bytes [off, off+step) of a row are consumed: prefetch each
 * line this step enters in next */
ROW_INLINE void prefetch_l2_step(const char *next, size_t off, size_t step) {
    const size_t last = off + step - 1;
    if (off > 0 && (last >> 6) == ((off - 1) >> 6)) return;
    prefetch_l2(next, last);
}

/* the same for steps of at most 64 bytes, without the test: the step's last
 * byte always lies in the line it enters (a line already asked for again
 * costs a load slot, less than the test) */
ROW_INLINE void prefetch_l2_short_step(const char *next, size_t off, size_t step) { prefetch_l2(next, off + step - 1); }

ROW_INLINE float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

ROW_INLINE __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* 8 elements of a float row at element i: F32, or F16 widened */
ROW_INLINE __m256 load_row8(const void *p, int i, bool f16) {
    return f16 ? load_f16x8((const uint16_t *)p + i) : _mm256_loadu_ps((const float *)p + i);
}
ROW_INLINE float row_elem(const void *p, int i, bool f16) {
    return f16 ? _cvtsh_ss(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* The F32 and F16 dots (f16 a constant after inlining). Four named
 * accumulators hide the FMA latency (an array would live in memory); each
 * 32-element step prefetches the lines it reads in next. */
ROW_INLINE float float_row(const void *w, const void *x, int n, const char *next, bool f16) {
    const size_t esize = f16 ? 2 : 4;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        for (size_t off = 0; off < 32 * esize; off += 64) prefetch_l2(next, (size_t)i * esize + off);
        acc0 = _mm256_fmadd_ps(load_row8(w, i, f16), load_row8(x, i, f16), acc0);
        acc1 = _mm256_fmadd_ps(load_row8(w, i + 8, f16), load_row8(x, i + 8, f16), acc1);
        acc2 = _mm256_fmadd_ps(load_row8(w, i + 16, f16), load_row8(x, i + 16, f16), acc2);
        acc3 = _mm256_fmadd_ps(load_row8(w, i + 24, f16), load_row8(x, i + 24, f16), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_row8(w, i, f16), load_row8(x, i, f16), acc0);
    float sum = hsum256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += row_elem(w, i, f16) * row_elem(x, i, f16);
    return sum;
}

ROW_INLINE float f32_row(const float *w, const float *x, int n, const char *next) {
    return float_row(w, x, n, next, false);
}
ROW_INLINE float f16_row(const uint16_t *w, const uint16_t *x, int n, const char *next) {
    return float_row(w, x, n, next, true);
}

/* sum of a*b over 32 signed bytes, as 8 float lanes (exact: |partials| < 2^24) */
ROW_INLINE __m256 dot_i8x32(__m256i a, __m256i b) {
    /* maddubs wants one unsigned operand: move a's sign onto b */
    const __m256i abs_a = _mm256_sign_epi8(a, a), b_signed = _mm256_sign_epi8(b, a);
    const __m256i pairs = _mm256_maddubs_epi16(abs_a, b_signed);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

ROW_INLINE __m256i load_q8_0(const block_q8_0 *blk) { return _mm256_loadu_si256((const __m256i *)blk->qs); }

/* acc + one Q8_0 block of a row against the activation block's values xq
 * and scale xd: the step of q8_0_row and of the gemv's rows (kernels_avx2.c),
 * so that both give the same bits */
ROW_INLINE __m256 q8_block_step(__m256 acc, const block_q8_0 *w, __m256i xq, float xd) {
    const __m256 d = _mm256_set1_ps(load_f16(&w->d) * xd);
    return _mm256_fmadd_ps(d, dot_i8x32(load_q8_0(w), xq), acc);
}

/* Q8_0 rows against a Q8_0 activation: two accumulators over alternate
 * blocks, an odd last block into the first */
ROW_INLINE float q8_0_row(const block_q8_0 *w, const block_q8_0 *x, int n, const char *next) {
    const int nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        prefetch_l2_step(next, (size_t)b * sizeof(block_q8_0), 2 * sizeof(block_q8_0));
        acc0 = q8_block_step(acc0, &w[b], load_q8_0(&x[b]), load_f16(&x[b].d));
        acc1 = q8_block_step(acc1, &w[b + 1], load_q8_0(&x[b + 1]), load_f16(&x[b + 1].d));
    }
    if (b < nb) acc0 = q8_block_step(acc0, &w[b], load_q8_0(&x[b]), load_f16(&x[b].d));
    return hsum256(_mm256_add_ps(acc0, acc1));
}

/* ---- Q4_0 x Q8_0 by block pairs. Blocks 2p and 2p+1 share the registers:
 * one vector holds the low nibbles (elements 0-15) of both, another the high
 * nibbles (16-31), each multiplied unsigned (maddubs) by the activation
 * regrouped to match; lanes 0-3 then hold block 2p's integer sums (lane i:
 * elements 4i..4i+3 and 16+4i..16+4i+3), lanes 4-7 block 2p+1's. The +8
 * offset of the nibbles comes off in integers (sum (q-8) x = sum q x -
 * 8 sum x), so every lane is exact; then one conversion and one FMA with the
 * pair's scales d_w*d_x per pair, into one accumulator per row, summed by
 * hsum256 at the end. An odd last block is a pair whose second block is
 * zero. Per pair that is about half the instructions of a block at a time;
 * the activation's part (q4_xpair) is done once for all rows of a pass. ---- */

typedef struct {
    __m256i lo, hi; /* activation elements 0-15 and 16-31 of blocks 2p | 2p+1 */
    __m256i corr;   /* 8 x the sum of each lane's 8 activation elements */
    __m256 xd;      /* activation scale of block 2p in lanes 0-3, 2p+1 in 4-7 (0: no block) */
} q4_xpair;

/* lanes 0-3 from the low half of v, 4-7 from the next element */
ROW_INLINE __m256 q4_spread_pair(__m128 v) {
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

/* the two F16 scales at p and p + stride (the second 0 when single) as floats in lanes 0-3 and 4-7 */
ROW_INLINE __m256 q4_pair_scales(const char *p, size_t stride, bool single) {
    uint16_t d0, d1 = 0;
    memcpy(&d0, p, sizeof d0);
    if (!single) memcpy(&d1, p + stride, sizeof d1);
    return q4_spread_pair(_mm_cvtph_ps(_mm_cvtsi32_si128((int)(d0 | (uint32_t)d1 << 16))));
}

/* blocks 2p and 2p+1 of x (only 2p when single) */
ROW_INLINE q4_xpair q4_xpair_at(const block_q8_0 *x, bool single) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const __m256i a = load_q8_0(x), b = single ? _mm256_setzero_si256() : load_q8_0(x + 1);
    q4_xpair p;
    p.lo = _mm256_permute2x128_si256(a, b, 0x20);
    p.hi = _mm256_permute2x128_si256(a, b, 0x31);
    const __m256i sums = _mm256_add_epi16(_mm256_maddubs_epi16(ones8, p.lo), _mm256_maddubs_epi16(ones8, p.hi));
    p.corr = _mm256_slli_epi32(_mm256_madd_epi16(sums, ones16), 3);
    p.xd = q4_pair_scales((const char *)&x->d, sizeof *x, single);
    return p;
}

/* acc + blocks 2p and 2p+1 of a row (w: block 2p) against their activation pair */
ROW_INLINE __m256 q4_pair_step(__m256 acc, const block_q4_0 *w, const q4_xpair *x, bool single) {
    const __m128i first = _mm_loadu_si128((const __m128i *)w[0].qs);
    const __m256i packed = single ? _mm256_zextsi128_si256(first)
                                  : _mm256_inserti128_si256(_mm256_castsi128_si256(first),
                                                            _mm_loadu_si128((const __m128i *)w[1].qs), 1);
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(packed, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
    const __m256i prods = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x->lo), _mm256_maddubs_epi16(hi, x->hi));
    const __m256i isum = _mm256_sub_epi32(_mm256_madd_epi16(prods, _mm256_set1_epi16(1)), x->corr);
    const __m256 d = _mm256_mul_ps(q4_pair_scales((const char *)&w->d, sizeof *w, single), x->xd);
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
}

/* Q4_ROWS rows are read a pass (q4_rows below). */
#define Q4_ROWS 4

/* The activation's pairs regrouped once for every row of a call: the
 * gemv and the gathers fill xpairs[p] for pair p (q4_xpairs_fill) when at
 * least one pass of Q4_ROWS rows will read them and the row has at most
 * Q4_XPAIRS_MAX pairs (16384 columns, 32 KiB on the stack), and q4_rows
 * loads them; otherwise each pass regroups them as it goes. The same values
 * either way, so the same bits. On a Zen 4 with this set forced, the gemv
 * in cache: 22.2-23.0 GB/s regrouped in every pass, 23.4-25.4 from the
 * table. */
#define Q4_XPAIRS_MAX 256

/* false (nothing filled) when the table does not pay or does not fit */
ROW_INLINE bool q4_xpairs_fill(q4_xpair *xpairs, const block_q8_0 *x, int nb, int rows) {
    if (rows < Q4_ROWS || (nb + 1) / 2 > Q4_XPAIRS_MAX) return false;
    for (int b = 0; b < nb; b += 2) xpairs[b / 2] = q4_xpair_at(&x[b], b + 1 == nb);
    return true;
}

/* Q4_ROWS rows at once, each with q4_0_row's arithmetic (so its bits). Per
 * step (a pair of blocks, 36 bytes of each row) row r prefetches ahead[r] +
 * p * ahead_step for pair p: a gather passes each row's successor a pass
 * later and 36 (the step's last byte always lies in the line it enters),
 * the dense gemv the next pass's rows as one stream (kernels_avx2.c). */

/* xpairs: x's pairs from q4_xpairs_fill, or NULL to regroup each here */
ROW_INLINE void q4_rows_step(const char *const *w, const char *const *ahead, size_t ahead_step,
                             const q4_xpair *xpairs, const block_q8_0 *x, int b, bool single, __m256 *acc) {
    const q4_xpair xp = xpairs ? xpairs[b / 2] : q4_xpair_at(&x[b], single);
    const size_t off = (size_t)b * sizeof(block_q4_0);
#pragma GCC unroll 4 /* the accumulators stay in registers only if every row is its own code */
    for (int r = 0; r < Q4_ROWS; r++) {
        _mm_prefetch(ahead[r] + (size_t)b / 2 * ahead_step, _MM_HINT_T1);
        acc[r] = q4_pair_step(acc[r], (const block_q4_0 *)(w[r] + off), &xp, single);
    }
}

ROW_INLINE void q4_rows(const char *const *w, const char *const *ahead, size_t ahead_step, const block_q8_0 *x,
                        const q4_xpair *xpairs, int nb, float *out) {
    __m256 acc[Q4_ROWS];
    for (int r = 0; r < Q4_ROWS; r++) acc[r] = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) q4_rows_step(w, ahead, ahead_step, xpairs, x, b, false, acc);
    if (b < nb) q4_rows_step(w, ahead, ahead_step, xpairs, x, b, true, acc);
    for (int r = 0; r < Q4_ROWS; r++) out[r] = hsum256(acc[r]);
}

/* blocks b and b+1 of a row (only b when single), prefetching next's lines */
ROW_INLINE __m256 q4_row_pair(__m256 acc, const block_q4_0 *w, const block_q8_0 *x, int b, bool single,
                              const char *next) {
    prefetch_l2_short_step(next, (size_t)b * sizeof(block_q4_0), (single ? 1 : 2) * sizeof(block_q4_0));
    const q4_xpair xp = q4_xpair_at(&x[b], single);
    return q4_pair_step(acc, &w[b], &xp, single);
}

ROW_INLINE float q4_0_row(const block_q4_0 *w, const block_q8_0 *x, int n, const char *next) {
    const int nb = n / QK4_0;
    __m256 acc = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) acc = q4_row_pair(acc, w, x, b, false, next);
    if (b < nb) acc = q4_row_pair(acc, w, x, b, true, next);
    return hsum256(acc);
}

#endif

/* Private to lib/kernels/kernels_avx512.c, lib/kernels/kernels_fast_avx512.c and
 * lib/kernels/sparse_avx512.c (all built with the AVX-512 flags): the default avx512
 * set's F32, F16, Q8_0 and Q4_0 row arithmetic, in one copy, so that a dense
 * dot and a sparse gather of the same row give the same bits
 * (tests/test_sparse_kernels.c holds them to it). The quantized rows' summation
 * order is not llama.cpp's (kernels_exact_avx512.c has that).
 *
 * Each row function also prefetches into L2 the lines at `ahead` that match
 * the ones it reads: the same offset in a row further down the list, which
 * for the gathers the hardware prefetcher cannot guess (the dense gemv uses
 * them too, a pass ahead). Into L2 (T1): on this machine (Zen 4) prefetches
 * into L1 are held up by its few L1 miss buffers; a gather then reads ~7 GB/s
 * where into L2 it reads 11-16 (tools/sparse-bench).
 *
 * Everything is forced inline: GCC 12 judges a small function whose only
 * effect is a prefetch "const" and deletes its calls, and a call per quad
 * costs ~15% in cache.
 *
 * Errors: none: inline arithmetic; the callers check lengths and types. */
#ifndef PI2_KERNELS_Q_AVX512_H
#define PI2_KERNELS_Q_AVX512_H

#include "kernels/kernels_avx512.h"
#include "kernels/sparse_rows.h"

#define QROW_INLINE static inline __attribute__((always_inline))

QROW_INLINE void prefetch_l2(const void *p) { _mm_prefetch(p, _MM_HINT_T1); }

/* Where the Q4_0 rows' prefetches put the lines ahead: L2 (the gathers, and
 * the dense gemv on Intel) or L1 (the dense gemv on AMD Zen:
 * kernels_fast_avx512.c). A constant once inlined. */
typedef enum { PREFETCH_TO_L2, PREFETCH_TO_L1 } prefetch_level;

QROW_INLINE void prefetch_to(const void *p, prefetch_level level) {
    if (level == PREFETCH_TO_L1) _mm_prefetch(p, _MM_HINT_T0);
    else prefetch_l2(p);
}

/* ---- F32 / F16: ggml_vec_dot_f32/f16's order. Four 16-lane FMA accumulators
 * over 64-element steps, added (0+2)+(1+3), a horizontal sum, then the
 * leftovers. ahead may be NULL: no prefetch (the dense dots). ---- */

/* the leftovers fused-added one by one */
QROW_INLINE float f32_row(const float *w, const float *x, int n, const char *ahead) {
    const int np = n & ~63;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int i = 0; i < np; i += 64) {
        if (ahead)
            for (int line = 0; line < 256; line += 64) prefetch_l2(ahead + (size_t)i * 4 + line);
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), s3);
    }
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3)));
    for (int i = np; i < n; i++) sum = __builtin_fmaf(w[i], x[i], sum);
    return sum;
}

/* the sum over the first np elements (np a multiple of 64), as f16_row starts it */
QROW_INLINE double f16_steps(const uint16_t *w, const uint16_t *x, int np, const char *ahead) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int i = 0; i < np; i += 64) {
        if (ahead) {
            prefetch_l2(ahead + (size_t)i * 2);
            prefetch_l2(ahead + (size_t)i * 2 + 64);
        }
        s0 = _mm512_fmadd_ps(load_f16x16(w + i), load_f16x16(x + i), s0);
        s1 = _mm512_fmadd_ps(load_f16x16(w + i + 16), load_f16x16(x + i + 16), s1);
        s2 = _mm512_fmadd_ps(load_f16x16(w + i + 32), load_f16x16(x + i + 32), s2);
        s3 = _mm512_fmadd_ps(load_f16x16(w + i + 48), load_f16x16(x + i + 48), s3);
    }
    return np ? _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3))) : 0.0;
}

/* the leftovers (all of a head of 32) summed in double, each float product
 * widened (dot_f16_rows_avx512 relies on this order) */
QROW_INLINE float f16_row(const uint16_t *w, const uint16_t *x, int n, const char *ahead) {
    const int np = n & ~63;
    double sum = f16_steps(w, x, np, ahead);
    for (int i = np; i < n; i++) sum += (double)(_cvtsh_ss(w[i]) * _cvtsh_ss(x[i]));
    return (float)sum;
}

/* ---- Q8_0 x Q8_0: per 4 blocks, vpdpbusd pairs into two accumulators
 * scaled per block; the 0-3 leftover blocks on 256 bits into the first ---- */

/* block scales d_w*d_x of blocks 0 and 1 of w and x, broadcast to lanes 0-7 and 8-15 */
QROW_INLINE __m512 q8_pair_scale(const block_q8_0 *w, const block_q8_0 *x) {
    const __m512 lo = _mm512_set1_ps(load_f16(&w[0].d) * load_f16(&x[0].d));
    return _mm512_insertf32x8(lo, _mm256_set1_ps(load_f16(&w[1].d) * load_f16(&x[1].d)), 1);
}

/* q8_row before its horizontal sum (pred_gemv_q8_0 sums 16 rows' at once,
 * in the same order). ahead may be NULL: no prefetch (the dense dot, where
 * every software prefetch measured slower than the hardware prefetcher alone) */
QROW_INLINE __m512 q8_row_lanes(const block_q8_0 *w, const block_q8_0 *x, int nb, const char *ahead) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        if (ahead) { /* 136 bytes a step: lines 64 bytes apart from its start cover every line */
            const char *pf = ahead + (size_t)b * sizeof(block_q8_0);
            prefetch_l2(pf);
            prefetch_l2(pf + 64);
            prefetch_l2(pf + 128);
        }
        const __m512i s0 = dot_i8_pair(load_q8_pair(w + b), load_q8_pair(x + b));
        const __m512i s1 = dot_i8_pair(load_q8_pair(w + b + 2), load_q8_pair(x + b + 2));
        acc0 = _mm512_fmadd_ps(q8_pair_scale(w + b, x + b), _mm512_cvtepi32_ps(s0), acc0);
        acc1 = _mm512_fmadd_ps(q8_pair_scale(w + b + 2, x + b + 2), _mm512_cvtepi32_ps(s1), acc1);
    }
    for (; b < nb; b++) {
        if (ahead) prefetch_l2(ahead + (size_t)b * sizeof(block_q8_0));
        const __m256 d = _mm256_set1_ps(load_f16(&w[b].d) * load_f16(&x[b].d));
        const __m256 s = _mm256_cvtepi32_ps(dot_q8_block(w + b, x + b));
        acc0 = _mm512_add_ps(acc0, _mm512_castps256_ps512(_mm256_mul_ps(d, s)));
    }
    return _mm512_add_ps(acc0, acc1);
}

QROW_INLINE float q8_row(const block_q8_0 *w, const block_q8_0 *x, int nb, const char *ahead) {
    return _mm512_reduce_add_ps(q8_row_lanes(w, x, nb, ahead));
}

/* ---- Q4_0 x Q8_0: the activation is regrouped so that four weight blocks
 * ("a quad") fill one register, block k in 128-bit lane k, with its
 * correction term and scales; per quad that leaves two vpdpbusd. Per chunk of
 * Q4_CHUNK_BLOCKS blocks, quads alternate between two accumulators, which are
 * added and reduced; the 0-3 leftover blocks are added one by one; chunk sums
 * are added in order. ---- */

/* activation blocks prepared at once (32 KiB of stack): rows up to 16384
 * elements are then streamed start to end, which the prefetchers need */
#define Q4_CHUNK_BLOCKS 512

/* 4 activation blocks, regrouped */
typedef struct {
    __m512i x_lo, x_hi; /* elements 0-15 and 16-31 of the 4 blocks */
    __m512i neg_corr;   /* -8*sum(x) per 4-byte group: removes the +8 nibble offset */
    __m512 dx;          /* activation scale of each lane's block */
} q4_xquad;

QROW_INLINE q4_xquad q4_prepare_xquad(const block_q8_0 *xb) {
    const __m512i eight = _mm512_set1_epi8(8);
    const __m512i x01 = load_q8_pair(xb), x23 = load_q8_pair(xb + 2); /* lanes: 0lo 0hi 1lo 1hi */
    q4_xquad q;
    q.x_lo = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(2, 0, 2, 0));
    q.x_hi = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i corr = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, q.x_lo), eight, q.x_hi);
    q.neg_corr = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
    const __m128 d4 = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)pack_scales4(xb, sizeof *xb)));
    q.dx = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                 _mm512_castps128_ps512(d4));
    return q;
}

/* the chunk's quads, prepared once for all the rows that use them */
QROW_INLINE void q4_prepare_chunk(q4_xquad *quads, const block_q8_0 *x, int nquads) {
    for (int k = 0; k < nquads; k++) quads[k] = q4_prepare_xquad(x + 4 * k);
}

/* acc + 4 weight blocks times a prepared quad, scaled by d_w*d_x. The quad's
 * 72 bytes are read as two overlapping 64-byte loads (bytes 0-63 and 8-71)
 * sorted by word permutes (block starts are 18 bytes apart, always even):
 * fewer instructions than 8 scalar and 128-bit loads, which is what keeps up
 * with memory once two cores share it. */
QROW_INLINE __m512 q4_quad(__m512 acc, const block_q4_0 *wb, q4_xquad q) {
    /* block k's 8 words of quants: words 9k+1.. of head; block 3's start at byte 56 = word 24 of tail */
    static const uint16_t quants[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12, 13, 14, 15, 16, 17,
                                        19, 20, 21, 22, 23, 24, 25, 26, 56, 57, 58, 59, 60, 61, 62, 63};
    /* the block scales: words 0, 9, 18 and 27 of head */
    static const uint16_t scales[32] = {0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27};
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    const __m512i head = _mm512_loadu_si512(wb), tail = _mm512_loadu_si512((const char *)wb + 8);
    const __m512i v = _mm512_permutex2var_epi16(head, _mm512_loadu_si512(quants), tail);
    __m512i isum = _mm512_dpbusd_epi32(q.neg_corr, _mm512_and_si512(v, nibble), q.x_lo);
    isum = _mm512_dpbusd_epi32(isum, _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble), q.x_hi);
    const __m256i dw_f16 = _mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_loadu_si512(scales), head));
    const __m512 dw = _mm512_cvtph_ps(dw_f16);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, q.dx), acc);
}

/* one leftover block with 256-bit registers */
QROW_INLINE float q4_block(const block_q4_0 *w, const block_q8_0 *x) {
    return load_f16(&w->d) * load_f16(&x->d) * (float)reduce_i32x8(dot_q4_block(w, x));
}

/* one row's chunk of cb blocks against activation x (its quads prepared in
 * quads), ahead the lines to prefetch as w's are consumed */
QROW_INLINE float q4_row_chunk(const block_q4_0 *w, const q4_xquad *quads, const block_q8_0 *x, int cb,
                               const char *ahead, prefetch_level level) {
    const size_t quad_bytes = 4 * sizeof(block_q4_0);
    const int nquads = cb / 4;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    int k = 0;
    for (; k + 2 <= nquads; k += 2) {
        /* 144 bytes a step: lines 64 bytes apart from its start cover every line */
        const char *pf = ahead + (size_t)k * quad_bytes;
        prefetch_to(pf, level);
        prefetch_to(pf + 64, level);
        prefetch_to(pf + 128, level);
        acc0 = q4_quad(acc0, w + 4 * k, quads[k]);
        acc1 = q4_quad(acc1, w + 4 * k + 4, quads[k + 1]);
    }
    if (k < nquads) {
        prefetch_to(ahead + (size_t)k * quad_bytes, level);
        prefetch_to(ahead + (size_t)k * quad_bytes + 64, level);
        acc0 = q4_quad(acc0, w + 4 * k, quads[k]);
    }
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (int b = 4 * nquads; b < cb; b++) {
        prefetch_to(ahead + (size_t)b * sizeof(block_q4_0), level);
        sum += q4_block(&w[b], &x[b]);
    }
    return sum;
}

/* rows one q4_rows_chunk pass reads at most: the 16 accumulators and a
 * step's two quads fit the 32 registers */
enum { Q4_GATHER_ROWS = 8 };

/* `rows` rows' chunks (rows <= Q4_GATHER_ROWS, a constant once inlined) of
 * cb blocks against activation x (its quads prepared in quads) into sum[],
 * ahead[r] the lines to prefetch as w[r]'s are consumed, moving ahead_step
 * bytes a step of two quads (2 * 72: the same offsets as w[r]'s), and far
 * bytes past those the same lines into L2 (0: none). Each row
 * keeps q4_row_chunk's accumulators and summation order,
 * so gives its bits (tests/test_sparse_kernels.c, tests/test_kernels.c); their quads are
 * interleaved and each activation quad is loaded once for all of them. */
QROW_INLINE void q4_rows_chunk(const block_q4_0 *const *w, int rows, const q4_xquad *quads, const block_q8_0 *x,
                               int cb, const char *const *ahead, size_t ahead_step, float *sum,
                               prefetch_level level, size_t far) {
    const int nquads = cb / 4;
    __m512 acc0[Q4_GATHER_ROWS], acc1[Q4_GATHER_ROWS];
#pragma GCC unroll Q4_GATHER_ROWS
    for (int r = 0; r < rows; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 2 <= nquads; k += 2) {
        const q4_xquad q0 = quads[k], q1 = quads[k + 1];
#pragma GCC unroll Q4_GATHER_ROWS
        for (int r = 0; r < rows; r++) {
            const char *pf = ahead[r] + (size_t)(k / 2) * ahead_step; /* 144 bytes a step: 3 lines cover them */
            prefetch_to(pf, level);
            prefetch_to(pf + 64, level);
            prefetch_to(pf + 128, level);
            if (far) { /* a second stream further ahead, into L2 */
                prefetch_l2(pf + far);
                prefetch_l2(pf + far + 64);
                prefetch_l2(pf + far + 128);
            }
            acc0[r] = q4_quad(acc0[r], w[r] + 4 * k, q0);
            acc1[r] = q4_quad(acc1[r], w[r] + 4 * k + 4, q1);
        }
    }
#pragma GCC unroll Q4_GATHER_ROWS
    for (int r = 0; r < rows; r++) {
        if (k < nquads) { /* k is even here: the step's offset in ahead[r], as the loop's */
            prefetch_to(ahead[r] + (size_t)(k / 2) * ahead_step, level);
            prefetch_to(ahead[r] + (size_t)(k / 2) * ahead_step + 64, level);
            acc0[r] = q4_quad(acc0[r], w[r] + 4 * k, quads[k]);
        }
        sum[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
        for (int b = 4 * nquads; b < cb; b++) {
            prefetch_to(ahead[r] + (size_t)b * sizeof(block_q4_0), level);
            sum[r] += q4_block(&w[r][b], &x[b]);
        }
    }
}

/* blocks in the chunk that starts at block b0 of nb */
static inline int q4_chunk_blocks(int nb, int b0) { return nb - b0 < Q4_CHUNK_BLOCKS ? nb - b0 : Q4_CHUNK_BLOCKS; }

/* the row whose lines a dot prefetches while it reads row i of s: `ahead`
 * rows further (past the last, the caller's next rows), or the last row
 * (never NULL, which lets the rows drop their no-prefetch test) */
__attribute__((returns_nonnull)) static inline const char *gather_ahead(const row_seq *s, int i, int ahead) {
    const char *row = row_seq_ahead(s, i, ahead);
    return row ? row : row_seq_row(s, row_seq_len(s) - 1);
}

/* Q4_0 reads Q4_GATHER_ROWS rows in one pass and prefetches the next pass's
 * rows (a whole pass ahead: 8 rows prefetching 4 ahead were 20% slower than
 * one row at a time). Against one row at a time 4 ahead, in three interleaved
 * rounds of tools/sparse-bench -t q4_0 -i avx512, on huge pages dot read
 * 21.1-22.3 GB/s vs 15.2-17.6, dot2 18.9-20.7 vs 14.1-16.5, dot2 + axpy
 * 15.9-16.7 vs 13.2-14.6; on 4 KiB shm pages dot2 13.7-16.5 vs 10.3-11.3.
 * 4 rows gained about two thirds of that, 2 rows lost 5%. The rows' 16
 * accumulators and a step's two quads still fit the 32 registers. The dense
 * gemv (kernels_fast_avx512.c) runs it over consecutive rows, fewer a pass. */

/* The stream's second prefetch distance, past the next pass: on the Zen 5,
 * kernel-bench -k avx512 -m 1024, two threads at once, two runs each in
 * turns, 52.7-53.6 GB/s against 45.6-49.9 without it (8 KiB 51.8-54.7,
 * 32 KiB 34.7-49.8); one thread within the noise (72-81 % of its read). In
 * the stack (bench/ab-stacks, both orders) dense 5-8 % faster, predictor
 * -2 to +5 %. */
#define Q4_STREAM_FAR_BYTES 16384

/* per chunk, the activation quads are prepared once for all the rows; the
 * rows go `pass` at a time (at most Q4_GATHER_ROWS, a constant once inlined),
 * the last len % pass one by one. Each row prefetches the row a pass further
 * at the offsets it reads; or, with `stream` where the rows are consecutive,
 * unpadded and one chunk long (so the next pass's rows lie right after
 * this pass's), the pass prefetches the next pass's rows as one stream,
 * each step the next pass * 144 bytes of it, and the same lines
 * Q4_STREAM_FAR_BYTES further into L2 (kernels_fast_avx512.c). */
QROW_INLINE void dot_rows_q4_0(const row_seq *s, const block_q8_0 *x, int n, int pass, prefetch_level level,
                               bool stream) {
    const int nb = n / QK4_0, len = row_seq_len(s);
    const size_t step_bytes = 8 * sizeof(block_q4_0); /* two quads */
    const bool as_stream = stream && nb <= Q4_CHUNK_BLOCKS && !s->idx && s->nmat == 1 &&
                           s->stride == (size_t)nb * sizeof(block_q4_0);
    q4_xquad quads[Q4_CHUNK_BLOCKS / 4]; /* 32 KiB */
    for (int b0 = 0; b0 < nb; b0 += Q4_CHUNK_BLOCKS) {
        const int cb = q4_chunk_blocks(nb, b0);
        const size_t chunk_off = (size_t)b0 * sizeof(block_q4_0);
        q4_prepare_chunk(quads, x + b0, cb / 4);
        int i = 0;
        for (; i + pass <= len; i += pass) {
            const block_q4_0 *w[Q4_GATHER_ROWS];
            const char *ahead[Q4_GATHER_ROWS];
            float sum[Q4_GATHER_ROWS];
            for (int r = 0; r < pass; r++) {
                w[r] = (const block_q4_0 *)(row_seq_row(s, i + r) + chunk_off);
                ahead[r] = as_stream ? gather_ahead(s, i, pass) + r * step_bytes
                                     : gather_ahead(s, i + r, pass) + chunk_off;
            }
            q4_rows_chunk(w, pass, quads, x + b0, cb, ahead, as_stream ? pass * step_bytes : step_bytes, sum, level,
                          as_stream ? Q4_STREAM_FAR_BYTES : 0);
            for (int r = 0; r < pass; r++) {
                float *out = row_seq_out(s, i + r);
                *out = b0 == 0 ? sum[r] : *out + sum[r];
            }
        }
        for (; i < len; i++) {
            const float row_sum = q4_row_chunk((const block_q4_0 *)(row_seq_row(s, i) + chunk_off), quads, x + b0,
                                               cb, gather_ahead(s, i, pass) + chunk_off, level);
            float *out = row_seq_out(s, i);
            *out = b0 == 0 ? row_sum : *out + row_sum;
        }
    }
}

/* the gathers prefetch into L2 on every CPU: into L1 they measured 5-10 % faster in
 * tools/sparse-bench on the Zen 5, one thread, but no faster in the stack (bench/ab-stacks 1.002) */
QROW_INLINE void dot_seq_q4_0(const row_seq *s, const block_q8_0 *x, int n) {
    dot_rows_q4_0(s, x, n, Q4_GATHER_ROWS, PREFETCH_TO_L2, false);
}

#endif

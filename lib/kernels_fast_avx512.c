/* The default avx512 table's quantized dots: two blocks per 512-bit register
 * (or four, in the Q4_0 gemv), vpdpbusd on unsigned x signed bytes with a
 * correction term for the offset that makes the weights unsigned, several
 * independent accumulators. Their summation order is not llama.cpp's
 * (kernels_exact_avx512.c has that); dot_q4_0 and gemv_q4_0 share one order,
 * so a row gives the same bits through either. */
#include "kernels_avx512.h"

/* block scales d_w*d_x of blocks b and b+1, broadcast to lanes 0-7 and 8-15 */
static __m512 pair_scale(const void *w_d0, const void *x_d0, const void *w_d1, const void *x_d1) {
    const __m512 lo = _mm512_set1_ps(load_f16(w_d0) * load_f16(x_d0));
    return _mm512_insertf32x8(lo, _mm256_set1_ps(load_f16(w_d1) * load_f16(x_d1)), 1);
}

/* pf: NULL, or a row whose lines are prefetched as w's are consumed (the next
 * row of a sparse gather, which the hardware prefetcher cannot guess) */
float dot_q8_0_fast_pf_avx512(const block_q8_0 *w, const block_q8_0 *x, int n, const char *pf) {
    const int nb = n / QK8_0;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        if (pf) { /* 136 bytes a step: 3 lines, some twice */
            const char *p = pf + (size_t)b * sizeof(block_q8_0);
            _mm_prefetch(p, _MM_HINT_T0);
            _mm_prefetch(p + 64, _MM_HINT_T0);
            _mm_prefetch(p + 128, _MM_HINT_T0);
        }
        const __m512i s0 = dot_i8_pair(load_q8_pair(w + b), load_q8_pair(x + b));
        const __m512i s1 = dot_i8_pair(load_q8_pair(w + b + 2), load_q8_pair(x + b + 2));
        acc0 = _mm512_fmadd_ps(pair_scale(&w[b].d, &x[b].d, &w[b + 1].d, &x[b + 1].d), _mm512_cvtepi32_ps(s0), acc0);
        acc1 = _mm512_fmadd_ps(pair_scale(&w[b + 2].d, &x[b + 2].d, &w[b + 3].d, &x[b + 3].d),
                               _mm512_cvtepi32_ps(s1), acc1);
    }
    for (; b < nb; b++) { /* 0-3 leftover blocks, one per 256 bits */
        const __m256i wq = _mm256_loadu_si256((const __m256i *)w[b].qs);
        const __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs);
        const __m256i bias = _mm256_set1_epi8((char)0x80);
        const __m256i s = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_xor_si256(wq, bias), xq),
                                           _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, xq));
        const __m256 d = _mm256_set1_ps(load_f16(&w[b].d) * load_f16(&x[b].d));
        acc0 = _mm512_add_ps(acc0, _mm512_castps256_ps512(_mm256_mul_ps(d, _mm256_cvtepi32_ps(s))));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

float dot_q8_0_fast_avx512(const block_q8_0 *w, const block_q8_0 *x, int n) {
    return dot_q8_0_fast_pf_avx512(w, x, n, NULL);
}

/* ---- Q4_0 x Q8_0: the activation is regrouped so that four weight blocks
 * fill one register (block k in 128-bit lane k, low nibbles and high nibbles
 * in two registers), with its correction term and scales; per row that leaves
 * two vpdpbusd per 4 blocks. The gemv prepares a chunk of the activation once
 * for many rows; the single dot prepares each quad as it goes. */
/* activation blocks prepared at once (32 KiB of stack): rows up to 16384
 * elements are then streamed start to end, which the prefetchers need */
#define CHUNK_BLOCKS 512
#define HOT static inline __attribute__((always_inline)) /* a call per quad costs ~15% in cache */
#define GEMV_ROW_GROUP 16     /* rows that share one prepared chunk before the next */
#define GEMV_PREFETCH_BYTES 4096 /* software prefetch distance in the weight stream */
#define GATHER_PREFETCH_ROWS 2   /* the same for a list of scattered rows, in rows */

/* 4 activation blocks, regrouped */
typedef struct {
    __m512i x_lo;     /* elements 0-15 of the 4 blocks */
    __m512i x_hi;     /* elements 16-31 */
    __m512i neg_corr; /* -8*sum(x) per 4-byte group: removes the +8 nibble offset */
    __m512 dx;        /* activation scale of each lane's block */
} q4_xquad;

/* each of 4 f16 scales (blocks block_bytes apart) repeated over its 128-bit lane */
HOT __m512 scales_x4(const void *first_block, size_t block_bytes) {
    const __m128 d4 = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)pack_scales4(first_block, block_bytes)));
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
}

HOT q4_xquad prepare_xquad(const block_q8_0 *xb) {
    const __m512i eight = _mm512_set1_epi8(8);
    const __m512i x01 = load_q8_pair(xb), x23 = load_q8_pair(xb + 2); /* lanes: 0lo 0hi 1lo 1hi */
    q4_xquad q;
    q.x_lo = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(2, 0, 2, 0));
    q.x_hi = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i corr = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, q.x_lo), eight, q.x_hi);
    q.neg_corr = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
    q.dx = scales_x4(xb, sizeof *xb);
    return q;
}

/* A quad's 72 bytes as two overlapping 64-byte loads (bytes 0-63 and 8-71),
 * sorted by word permutes (block starts are 18 bytes apart, always even):
 * fewer instructions than 8 scalar and 128-bit loads, which is what keeps up
 * with memory once two cores share it. */
HOT __m512i quad_nibbles(__m512i head, __m512i tail) {
    /* block k's 8 words of quants: words 9k+1.. of head; block 3's start at byte 56 = word 24 of tail */
    static const uint16_t idx[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10,      11,      12,      13,      14,      15,      16,      17,
                                     19, 20, 21, 22, 23, 24, 25, 26, 32 + 24, 32 + 25, 32 + 26, 32 + 27, 32 + 28, 32 + 29, 32 + 30, 32 + 31};
    return _mm512_permutex2var_epi16(head, _mm512_loadu_si512(idx), tail);
}

/* the 4 f16 block scales (words 0, 9, 18, 27 of head), each over its 128-bit lane */
HOT __m512 quad_scales(__m512i head) {
    static const uint16_t idx[32] = {0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27};
    return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_loadu_si512(idx), head)));
}

/* acc + the products of 4 weight blocks with an activation quad, scaled by
 * d_w*d_x; prefetches the line at pf (dense: GEMV_PREFETCH_BYTES ahead in the
 * weight stream; gather: the same place in a row further down the list) */
HOT __m512 q4_quad(__m512 acc, const block_q4_0 *wb, const q4_xquad *q, const char *pf) {
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    /* measured (tools/kernel-bench, 4096-wide rows): ~16 GB/s from memory
     * with this prefetch, ~12.5 GB/s without */
    _mm_prefetch(pf, _MM_HINT_T0);
    const __m512i head = _mm512_loadu_si512(wb), tail = _mm512_loadu_si512((const char *)wb + 8);
    const __m512i v = quad_nibbles(head, tail);
    __m512i isum = _mm512_dpbusd_epi32(q->neg_corr, _mm512_and_si512(v, nibble), q->x_lo);
    isum = _mm512_dpbusd_epi32(isum, _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble), q->x_hi);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(quad_scales(head), q->dx), acc);
}

/* one block with 256-bit registers, for the blocks left over by the quads */
static float dot_q4_0_block(const block_q4_0 *w, const block_q8_0 *x) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)w->qs);
    const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0f));
    const __m256i xq = _mm256_loadu_si256((const __m256i *)x->qs);
    const __m256i s = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xq),
                                       _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), xq));
    return load_f16(&w->d) * load_f16(&x->d) * (float)_mm512_reduce_add_epi32(_mm512_zextsi256_si512(s));
}

/* The order both share, per chunk of CHUNK_BLOCKS blocks: quads alternate
 * between two accumulators, which are added and reduced; the 0-3 blocks left
 * over are added one by one; chunk sums are added in order. */
static float q4_chunk_tail(float sum, const block_q4_0 *w, const block_q8_0 *x, int from, int cb) {
    for (int b = from; b < cb; b++) sum += dot_q4_0_block(&w[b], &x[b]);
    return sum;
}

/* pf: where to prefetch along with w's first quad (one line per quad) */
static float q4_row_prepared(const block_q4_0 *w, const q4_xquad *quads, int nquads, const char *pf) {
    const size_t quad_bytes = 4 * sizeof(block_q4_0);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    int k = 0;
    for (; k + 2 <= nquads; k += 2) {
        acc0 = q4_quad(acc0, w + 4 * k, &quads[k], pf + k * quad_bytes);
        acc1 = q4_quad(acc1, w + 4 * k + 4, &quads[k + 1], pf + (k + 1) * quad_bytes);
    }
    if (k < nquads) acc0 = q4_quad(acc0, w + 4 * k, &quads[k], pf + k * quad_bytes);
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static float q4_row_direct(const block_q4_0 *w, const block_q8_0 *x, int nquads) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    int k = 0;
    for (; k + 2 <= nquads; k += 2) {
        const q4_xquad q0 = prepare_xquad(x + 4 * k), q1 = prepare_xquad(x + 4 * k + 4);
        acc0 = q4_quad(acc0, w + 4 * k, &q0, (const char *)(w + 4 * k) + GEMV_PREFETCH_BYTES);
        acc1 = q4_quad(acc1, w + 4 * k + 4, &q1, (const char *)(w + 4 * k + 4) + GEMV_PREFETCH_BYTES);
    }
    if (k < nquads) {
        const q4_xquad q = prepare_xquad(x + 4 * k);
        acc0 = q4_quad(acc0, w + 4 * k, &q, (const char *)(w + 4 * k) + GEMV_PREFETCH_BYTES);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

float dot_q4_0_fast_avx512(const block_q4_0 *w, const block_q8_0 *x, int n) {
    const int nb = n / QK4_0;
    float total = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += CHUNK_BLOCKS) {
        const int cb = nb - b0 < CHUNK_BLOCKS ? nb - b0 : CHUNK_BLOCKS, nquads = cb / 4;
        const float sum = q4_chunk_tail(q4_row_direct(w + b0, x + b0, nquads), w + b0, x + b0, 4 * nquads, cb);
        total = b0 == 0 ? sum : total + sum;
    }
    return total;
}

void gemv_q4_0_fast_avx512(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n) {
    const int nb = n / QK4_0;
    q4_xquad chunk[CHUNK_BLOCKS / 4];
    for (int r0 = 0; r0 < nrows; r0 += GEMV_ROW_GROUP) {
        const int r1 = r0 + GEMV_ROW_GROUP < nrows ? r0 + GEMV_ROW_GROUP : nrows;
        for (int b0 = 0; b0 < nb; b0 += CHUNK_BLOCKS) {
            const int cb = nb - b0 < CHUNK_BLOCKS ? nb - b0 : CHUNK_BLOCKS, nquads = cb / 4;
            for (int k = 0; k < nquads; k++) chunk[k] = prepare_xquad(x + b0 + 4 * k);
            for (int r = r0; r < r1; r++) {
                const block_q4_0 *row = (const block_q4_0 *)((const char *)w + (size_t)r * row_stride) + b0;
                const float sum = q4_chunk_tail(q4_row_prepared(row, chunk, nquads, (const char *)row + GEMV_PREFETCH_BYTES),
                                                row, x + b0, 4 * nquads, cb);
                y[r] = b0 == 0 ? sum : y[r] + sum;
            }
        }
    }
}

/* The gemv's order for rows at arbitrary addresses (a sparse gather): each
 * chunk of the activation is prepared once for all the rows, and each row
 * prefetches the row GATHER_PREFETCH_ROWS further down the list, which the
 * hardware prefetcher cannot guess (the dense stride prefetch would fetch
 * unrelated memory). */
void dot_rows_q4_0_fast_avx512(const block_q4_0 *const *rows, int nrows, const block_q8_0 *x, float *y, int n) {
    const int nb = n / QK4_0;
    q4_xquad chunk[CHUNK_BLOCKS / 4];
    for (int b0 = 0; b0 < nb; b0 += CHUNK_BLOCKS) {
        const int cb = nb - b0 < CHUNK_BLOCKS ? nb - b0 : CHUNK_BLOCKS, nquads = cb / 4;
        for (int k = 0; k < nquads; k++) chunk[k] = prepare_xquad(x + b0 + 4 * k);
        for (int r = 0; r < nrows; r++) {
            const int ahead = r + GATHER_PREFETCH_ROWS < nrows ? r + GATHER_PREFETCH_ROWS : nrows - 1;
            const block_q4_0 *row = rows[r] + b0;
            const float sum = q4_chunk_tail(q4_row_prepared(row, chunk, nquads, (const char *)(rows[ahead] + b0)), row,
                                            x + b0, 4 * nquads, cb);
            y[r] = b0 == 0 ? sum : y[r] + sum;
        }
    }
}

/* AVX-512 (F/BW/VL/DQ + VNNI) kernels; only reached through kernels_avx512()
 * after a CPU check. Quantized dots hold two blocks per 512-bit register and
 * use vpdpbusd (unsigned x signed bytes) with a correction term for the
 * offset that makes the weights unsigned. Quantization and f16/axpy results
 * are bit-exact with the scalar reference; dots differ in summation order. */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"

static float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

static __mmask16 tail_mask16(int left) { return (__mmask16)((1u << left) - 1); }

static float dot_f32_avx512(const float *w, const float *x, int n) {
    /* four named accumulators hide the FMA latency (an array would live in memory) */
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), acc1);
        acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), acc2);
        acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), acc3);
    }
    for (; i + 16 <= n; i += 16)
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), acc0);
    if (i < n) {
        const __mmask16 m = tail_mask16(n - i);
        acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, x + i), acc1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

static __m512 load_f16x16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

static float dot_f16_avx512(const uint16_t *w, const uint16_t *x, int n) {
    /* four named accumulators hide the FMA latency (an array would live in memory) */
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        acc0 = _mm512_fmadd_ps(load_f16x16(w + i), load_f16x16(x + i), acc0);
        acc1 = _mm512_fmadd_ps(load_f16x16(w + i + 16), load_f16x16(x + i + 16), acc1);
        acc2 = _mm512_fmadd_ps(load_f16x16(w + i + 32), load_f16x16(x + i + 32), acc2);
        acc3 = _mm512_fmadd_ps(load_f16x16(w + i + 48), load_f16x16(x + i + 48), acc3);
    }
    for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(load_f16x16(w + i), load_f16x16(x + i), acc0);
    if (i < n) {
        const __mmask16 m = tail_mask16(n - i);
        const __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i));
        const __m512 xv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
        acc1 = _mm512_fmadd_ps(wv, xv, acc1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

/* block scales d_w*d_x of blocks b and b+1, broadcast to lanes 0-7 and 8-15 */
static __m512 pair_scale(const void *w_d0, const void *x_d0, const void *w_d1, const void *x_d1) {
    const __m512 lo = _mm512_set1_ps(load_f16(w_d0) * load_f16(x_d0));
    return _mm512_insertf32x8(lo, _mm256_set1_ps(load_f16(w_d1) * load_f16(x_d1)), 1);
}

/* the 32 quants of blocks b and b+1 of a row, one block per 256-bit half */
static __m512i load_q8_pair(const block_q8_0 *blk) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)blk[0].qs)),
                              _mm256_loadu_si256((const __m256i *)blk[1].qs), 1);
}

/* sum(w*x) over 4-byte groups for signed w: (w+128) is unsigned for vpdpbusd,
 * and 128*sum(x) is subtracted again */
static __m512i dot_i8_pair(__m512i wq, __m512i xq) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const __m512i biased = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(wq, bias), xq);
    return _mm512_sub_epi32(biased, _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, xq));
}

static float dot_q8_0_avx512(const block_q8_0 *w, const block_q8_0 *x, int n) {
    const int nb = n / QK8_0;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
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

/* nibbles of Q4_0 blocks b and b+1 as unsigned bytes 0..15 in element order:
 * the 16 packed bytes go to both 128-bit lanes of a block's half, and the
 * upper lane is shifted right by 4 to reach the high nibbles */
static __m512i load_q4_pair(const block_q4_0 *blk) {
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)blk[0].qs));
    v = _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128((const __m128i *)blk[1].qs));
    const __m512i shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    return _mm512_and_si512(_mm512_srlv_epi64(v, shift), _mm512_set1_epi8(0x0f));
}

/* sum((q-8)*x) over 4-byte groups: vpdpbusd on q in 0..15, minus 8*sum(x) */
static __m512i dot_q4_pair(__m512i q, __m512i xq) {
    const __m512i raw = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xq);
    return _mm512_sub_epi32(raw, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), xq));
}

/* one block with 256-bit registers, for the blocks left over by the wide loops */
static float dot_q4_0_block(const block_q4_0 *w, const block_q8_0 *x) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)w->qs);
    const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0f));
    const __m256i xq = _mm256_loadu_si256((const __m256i *)x->qs);
    const __m256i s = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xq),
                                       _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), xq));
    return load_f16(&w->d) * load_f16(&x->d) * (float)_mm512_reduce_add_epi32(_mm512_zextsi256_si512(s));
}

/* four f16 block scales (blocks 18 or 34 bytes apart) packed in a general register */
static uint64_t pack_scales4(const void *first_block, size_t block_bytes) {
    uint64_t packed = 0;
    for (int k = 0; k < 4; k++) {
        uint16_t h;
        memcpy(&h, (const char *)first_block + (size_t)k * block_bytes, sizeof h);
        packed |= (uint64_t)h << (16 * k);
    }
    return packed;
}

/* d_w*d_x of 8 consecutive blocks: the halves are gathered in general
 * registers so two vcvtph2ps replace sixteen scalar conversions */
static __m256 q4_scales_x8(const block_q4_0 *w, const block_q8_0 *x) {
    const __m128i wd = _mm_set_epi64x((long long)pack_scales4(w + 4, sizeof *w), (long long)pack_scales4(w, sizeof *w));
    const __m128i xd = _mm_set_epi64x((long long)pack_scales4(x + 4, sizeof *x), (long long)pack_scales4(x, sizeof *x));
    return _mm256_mul_ps(_mm256_cvtph_ps(wd), _mm256_cvtph_ps(xd));
}

static float dot_q4_0_avx512(const block_q4_0 *w, const block_q8_0 *x, int n) {
    const int nb = n / QK4_0;
    /* pair p of the 8 blocks takes scale 2p in lanes 0-7 and 2p+1 in lanes 8-15 */
    const __m512i pair0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i two = _mm512_set1_epi32(2);
    const __m512i pair1 = _mm512_add_epi32(pair0, two), pair2 = _mm512_add_epi32(pair1, two),
                  pair3 = _mm512_add_epi32(pair2, two);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        const __m512 s8 = _mm512_castps256_ps512(q4_scales_x8(w + b, x + b));
        const __m512i s0 = dot_q4_pair(load_q4_pair(w + b), load_q8_pair(x + b));
        const __m512i s1 = dot_q4_pair(load_q4_pair(w + b + 2), load_q8_pair(x + b + 2));
        const __m512i s2 = dot_q4_pair(load_q4_pair(w + b + 4), load_q8_pair(x + b + 4));
        const __m512i s3 = dot_q4_pair(load_q4_pair(w + b + 6), load_q8_pair(x + b + 6));
        acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(pair0, s8), _mm512_cvtepi32_ps(s0), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(pair1, s8), _mm512_cvtepi32_ps(s1), acc1);
        acc2 = _mm512_fmadd_ps(_mm512_permutexvar_ps(pair2, s8), _mm512_cvtepi32_ps(s2), acc2);
        acc3 = _mm512_fmadd_ps(_mm512_permutexvar_ps(pair3, s8), _mm512_cvtepi32_ps(s3), acc3);
    }
    for (; b + 2 <= nb; b += 2) {
        const __m512i s = dot_q4_pair(load_q4_pair(w + b), load_q8_pair(x + b));
        acc0 = _mm512_fmadd_ps(pair_scale(&w[b].d, &x[b].d, &w[b + 1].d, &x[b + 1].d), _mm512_cvtepi32_ps(s), acc0);
    }
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
    if (b < nb) sum += dot_q4_0_block(&w[b], &x[b]);
    return sum;
}

/* ---- multi-row Q4_0 x Q8_0: the activation is regrouped once per chunk so
 * that four weight blocks fill one register (block k in 128-bit lane k, low
 * nibbles and high nibbles in two registers), and its correction term and
 * scales are precomputed; per row that leaves two vpdpbusd per 4 blocks. */
/* activation blocks prepared at once (32 KiB of stack): rows up to 16384
 * elements are then streamed start to end, which the prefetchers need */
#define GEMV_CHUNK_BLOCKS 512
#define GEMV_ROW_GROUP 16     /* rows that share one prepared chunk before the next */
#define GEMV_PREFETCH_BYTES 4096 /* software prefetch distance in the weight stream */

typedef struct {
    __m512i x_lo[GEMV_CHUNK_BLOCKS / 4]; /* elements 0-15 of 4 activation blocks */
    __m512i x_hi[GEMV_CHUNK_BLOCKS / 4]; /* elements 16-31 */
    __m512i neg_corr[GEMV_CHUNK_BLOCKS / 4]; /* -8*sum(x) per 4-byte group: removes the +8 nibble offset */
    __m512 dx[GEMV_CHUNK_BLOCKS / 4];       /* activation scale of each lane's block */
} q4_gemv_chunk;

static void prepare_q4_chunk(const block_q8_0 *x, int nquads, q4_gemv_chunk *c) {
    const __m512i eight = _mm512_set1_epi8(8);
    for (int k = 0; k < nquads; k++) {
        const block_q8_0 *xb = x + 4 * k;
        const __m512i x01 = load_q8_pair(xb), x23 = load_q8_pair(xb + 2); /* lanes: 0lo 0hi 1lo 1hi */
        c->x_lo[k] = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(2, 0, 2, 0));
        c->x_hi[k] = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(3, 1, 3, 1));
        const __m512i corr = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, c->x_lo[k]),
                                                 eight, c->x_hi[k]);
        c->neg_corr[k] = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
        c->dx[k] = _mm512_setr_ps(load_f16(&xb[0].d), load_f16(&xb[0].d), load_f16(&xb[0].d), load_f16(&xb[0].d),
                                  load_f16(&xb[1].d), load_f16(&xb[1].d), load_f16(&xb[1].d), load_f16(&xb[1].d),
                                  load_f16(&xb[2].d), load_f16(&xb[2].d), load_f16(&xb[2].d), load_f16(&xb[2].d),
                                  load_f16(&xb[3].d), load_f16(&xb[3].d), load_f16(&xb[3].d), load_f16(&xb[3].d));
    }
}

/* scales of 4 weight blocks, each repeated over its 128-bit lane; the four
 * halves are packed in a general register so one vcvtph2ps converts them */
static __m512 q4_scales_x4(const block_q4_0 *w) {
    const __m128 d4 = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)pack_scales4(w, sizeof *w)));
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
}

/* acc + the products of 4 weight blocks with the prepared activation quad k, scaled by d_w*d_x */
static __m512 q4_quad(__m512 acc, const block_q4_0 *wb, __m512i x_lo, __m512i x_hi, __m512i neg_corr, __m512 dx) {
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    /* measured (tools/kernel-bench, 4096-wide rows): ~16 GB/s from memory
     * with this prefetch, ~12.5 GB/s without */
    _mm_prefetch((const char *)wb + GEMV_PREFETCH_BYTES, _MM_HINT_T0);
    const __m256i v01 = _mm256_loadu2_m128i((const __m128i *)wb[1].qs, (const __m128i *)wb[0].qs);
    const __m256i v23 = _mm256_loadu2_m128i((const __m128i *)wb[3].qs, (const __m128i *)wb[2].qs);
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(v01), v23, 1);
    __m512i isum = _mm512_dpbusd_epi32(neg_corr, _mm512_and_si512(v, nibble), x_lo);
    isum = _mm512_dpbusd_epi32(isum, _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble), x_hi);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(q4_scales_x4(wb), dx), acc);
}

/* sum over the quads of one row chunk (measured: interleaving two rows to share
 * the activation loads is faster in cache but slower from memory) */
static float q4_row_quads(const block_q4_0 *w, const q4_gemv_chunk *c, int nquads) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    int k = 0;
    for (; k + 2 <= nquads; k += 2) {
        acc0 = q4_quad(acc0, w + 4 * k, c->x_lo[k], c->x_hi[k], c->neg_corr[k], c->dx[k]);
        acc1 = q4_quad(acc1, w + 4 * k + 4, c->x_lo[k + 1], c->x_hi[k + 1], c->neg_corr[k + 1], c->dx[k + 1]);
    }
    if (k < nquads) acc0 = q4_quad(acc0, w + 4 * k, c->x_lo[k], c->x_hi[k], c->neg_corr[k], c->dx[k]);
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static void gemv_q4_0_avx512(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows, int n) {
    const int nb = n / QK4_0;
    q4_gemv_chunk chunk;
    for (int r0 = 0; r0 < nrows; r0 += GEMV_ROW_GROUP) {
        const int r1 = r0 + GEMV_ROW_GROUP < nrows ? r0 + GEMV_ROW_GROUP : nrows;
        for (int b0 = 0; b0 < nb; b0 += GEMV_CHUNK_BLOCKS) {
            const int cb = nb - b0 < GEMV_CHUNK_BLOCKS ? nb - b0 : GEMV_CHUNK_BLOCKS, nquads = cb / 4;
            prepare_q4_chunk(x + b0, nquads, &chunk);
            for (int r = r0; r < r1; r++) {
                const block_q4_0 *row = (const block_q4_0 *)((const char *)w + (size_t)r * row_stride) + b0;
                float sum = q4_row_quads(row, &chunk, nquads);
                for (int b = 4 * nquads; b < cb; b++) sum += dot_q4_0_block(&row[b], &x[b0 + b]);
                y[r] = b0 == 0 ? sum : y[r] + sum;
            }
        }
    }
}

/* roundf() on 16 lanes: round half away from zero, exactly (adding 0.5 then
 * truncating would misround 0.49999997) */
static __m512 round_half_away(__m512 v) {
    const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 step = _mm512_or_ps(_mm512_and_ps(v, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
    return _mm512_mask_add_ps(t, up, t, step);
}

static void quantize_q8_0_avx512(const float *x, block_q8_0 *y, int n) {
    for (int b = 0; b < n / QK8_0; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + b * QK8_0), v1 = _mm512_loadu_ps(x + b * QK8_0 + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(&y[b].d, &dh, sizeof dh);
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q0 = _mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(v0, vid)));
        const __m512i q1 = _mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(v1, vid)));
        _mm_storeu_si128((__m128i *)y[b].qs, _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[b].qs + 16), _mm512_cvtsepi32_epi8(q1));
    }
}

static void f32_to_f16_row_avx512(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        const __mmask16 m = tail_mask16(n - i);
        _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT));
    }
}

/* multiply then add (no FMA) so the result is bit-exact with the reference */
static void axpy_f32_avx512(float *y, float a, const float *w, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_mul_ps(va, _mm512_loadu_ps(w + i))));
    if (i < n) {
        const __mmask16 m = tail_mask16(n - i);
        const __m512 sum = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, w + i)));
        _mm512_mask_storeu_ps(y + i, m, sum);
    }
}

const kernels kernels_avx512_impl = {
    .name = "avx512",
    .dot_f32 = dot_f32_avx512,
    .dot_f16 = dot_f16_avx512,
    .dot_q8_0 = dot_q8_0_avx512,
    .dot_q4_0 = dot_q4_0_avx512,
    .quantize_q8_0 = quantize_q8_0_avx512,
    .f32_to_f16_row = f32_to_f16_row_avx512,
    .axpy_f32 = axpy_f32_avx512,
    .gemv_q4_0 = gemv_q4_0_avx512,
};

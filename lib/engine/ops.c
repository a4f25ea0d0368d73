#include "engine/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/f16.h"
#include "util/pi2_assert.h"

void act_convert_for(const kernels *k, act_vec *a, const float *x, int n, const weight *const *ws, int nw) {
    bool f16 = false, q8 = false;
    for (int i = 0; i < nw; i++) {
        f16 |= ws[i]->type == GGML_TYPE_F16;
        q8 |= ws[i]->type == GGML_TYPE_Q4_0 || ws[i]->type == GGML_TYPE_Q8_0;
    }
    a->f32 = x;
    if (f16) k->f32_to_f16_row(x, a->f16, n);
    if (q8) k->quantize_q8_0(x, a->q8, n);
}

float row_dot(const kernels *k, const weight *w, int64_t r, const act_vec *in) {
    const void *row = (const char *)w->data + (size_t)r * w->row_bytes;
    int n = (int)w->cols;
    switch (w->type) {
    case GGML_TYPE_F32: return k->dot_f32(row, in->f32, n);
    case GGML_TYPE_F16: return k->dot_f16(row, in->f16, n);
    case GGML_TYPE_Q8_0: return k->dot_q8_0(row, in->q8, n);
    case GGML_TYPE_Q4_0: return k->dot_q4_0(row, in->q8, n);
    }
    PI2_ASSERT(0, "weight type %d: model_load admits only F32, F16, Q8_0 and Q4_0", (int)w->type);
}

/* out[i] = W[r0 + i] . in for i < r1 - r0; Q4_0 (and, where the set has
 * one, Q8_0) rows through the gemv, which gives row_dot's bits faster */
void matvec_rows_packed(const kernels *k, const weight *w, const act_vec *in, float *out, long r0, long r1) {
    const void *first = (const char *)w->data + (size_t)r0 * w->row_bytes;
    if (w->type == GGML_TYPE_Q4_0) {
        k->gemv_q4_0(first, w->row_bytes, in->q8, out, (int)(r1 - r0), (int)w->cols);
        return;
    }
    if (w->type == GGML_TYPE_Q8_0 && k->gemv_q8_0) {
        k->gemv_q8_0(first, w->row_bytes, in->q8, out, (int)(r1 - r0), (int)w->cols);
        return;
    }
    for (long r = r0; r < r1; r++) out[r - r0] = row_dot(k, w, r, in);
}

void matvec_rows(const kernels *k, const weight *w, const act_vec *in, float *out, long r0, long r1) {
    matvec_rows_packed(k, w, in, out + r0, r0, r1);
}

void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

void rope_angles(float *cs, int head_dim, int pos, float base) {
    float theta_scale = powf(base, -2.0f / (float)head_dim), theta = (float)pos;
    for (int i = 0; i < head_dim; i += 2) {
        cs[i] = cosf(theta);
        cs[i + 1] = sinf(theta);
        theta *= theta_scale;
    }
}

void rope_apply(float *v, int n_heads, int head_dim, const float *cs) {
    for (int h = 0; h < n_heads; h++) {
        float *p = v + (size_t)h * head_dim;
        for (int i = 0; i < head_dim; i += 2) {
            float c = cs[i], s = cs[i + 1], a = p[i], b = p[i + 1];
            /* as ggml compiles it: gcc contracts the first product of each line into an FMA */
            p[i] = fmaf(a, c, -(b * s));
            p[i + 1] = fmaf(a, s, b * c);
        }
    }
}

void kv_store_keys(const kernels *k, const kv_layer *kv, int pos, const float *kvec) {
    k->f32_to_f16_row(kvec, kv->k + (size_t)pos * kv->kv_dim, kv->kv_dim);
}

void kv_store_values(const kv_layer *kv, int pos, int n, const float *v, size_t stride, int d0, int d1) {
    for (int d = d0; d < d1; d++) {
        uint16_t *row = kv->v + (size_t)d * kv->n_ctx + pos;
        for (int t = 0; t < n; t++) row[t] = f32_to_f16(v[(size_t)t * stride + (size_t)d]);
    }
}

/* One position's values, as kv_store_values(kv, pos, 1, ...) stores them:
 * converted a block at a time by the kernels, then written down the column.
 * Each row's entry is a cache line of its own, and a plain loop's stores
 * waited for their lines a few at a time; each line is asked for AHEAD rows
 * early. */
static void kv_store_column(const kernels *k, const kv_layer *kv, int pos, const float *vvec) {
    enum { BLOCK = 256, AHEAD = 16 };
    uint16_t half[BLOCK];
    uint16_t *col = kv->v + pos;
    const size_t stride = (size_t)kv->n_ctx;
    for (int d0 = 0; d0 < kv->kv_dim; d0 += BLOCK) {
        const int n = kv->kv_dim - d0 < BLOCK ? kv->kv_dim - d0 : BLOCK;
        k->f32_to_f16_row(vvec + d0, half, n);
        for (int i = 0; i < n; i++) {
            const size_t d = (size_t)(d0 + i);
            if (d + AHEAD < (size_t)kv->kv_dim) __builtin_prefetch(col + (d + AHEAD) * stride, 1);
            col[d * stride] = half[i];
        }
    }
}

void kv_store(const kernels *k, const kv_layer *kv, int pos, const float *kvec, const float *vvec) {
    PI2_DEBUG_ASSERT(pos >= 0 && pos < kv->n_ctx, "KV position %d outside the cache's %d", pos, kv->n_ctx);
    kv_store_keys(k, kv, pos, kvec);
    kv_store_column(k, kv, pos, vvec);
}

/* llama.cpp's KV length: the used cells padded to a multiple of 32 (its
 * kv cache padding without flash attention); the padding has probability 0
 * but sets how ggml's F16 dot groups the V . p sums. */
static int padded_kv_len(int T, int n_ctx) {
    int n = (T + 31) / 32 * 32;
    return n < n_ctx ? n : n_ctx;
}

#define KQ_AHEAD 2 /* positions: how far ahead attention requests the keys */

/* Requests into L2 `bytes` of position t's keys from element `first` on:
 * without it, each head's dot at a position waits for its first line. */
static void prefetch_keys(const kv_layer *kv, int t, size_t first, size_t bytes) {
    const char *p = (const char *)(kv->k + (size_t)t * kv->kv_dim + first);
    for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
}

/* A head's softmax over its T scores sc (scaled), the probabilities rounded
 * to F16 in p16 and padded with zeros to n_kv. */
static void head_probs(const kernels *k, int T, int n_kv, float *sc, uint16_t *p16) {
    float mx = -INFINITY;
    for (int t = 0; t < T; t++)
        if (sc[t] > mx) mx = sc[t];
    double sum = k->softmax_exp(sc, sc, mx, T);
    float inv = (float)(1.0 / sum);
    for (int t = 0; t < T; t++) sc[t] *= inv;
    k->f32_to_f16_row(sc, p16, T);
    memset(p16 + T, 0, sizeof(uint16_t) * (size_t)(n_kv - T));
}

/* the KV head query head h reads (grouped-query attention) */
static long kv_head(const model *m, long h) { return h / (m->n_head / m->n_head_kv); }

/* head h's values: row d of V (transposed), dimension d over time */
static const uint16_t *head_value_rows(const model *m, const kv_layer *kv, long h) {
    return kv->v + (size_t)kv_head(m, h) * (size_t)m->head_dim * (size_t)kv->n_ctx;
}

/* Head h's probabilities (head_probs) and out[d] = V . p over n_kv (in
 * tinyBLAS order when tb is given). */
static void head_values(const kernels *k, const tinyblas_kernels *tb, const model *m, const kv_layer *kv, long h,
                        int T, int n_kv, float *sc, uint16_t *p16, float *out) {
    const int hd = m->head_dim;
    head_probs(k, T, n_kv, sc, p16);
    const uint16_t *vh = head_value_rows(m, kv, h);
    if (tb)
        for (int d = 0; d < hd; d++) out[d] = tb->dot_f16(vh + (size_t)d * kv->n_ctx, p16, n_kv);
    else
        k->dot_f16_rows(vh, (size_t)kv->n_ctx, hd, p16, n_kv, out);
}

/* llama.cpp (no flash attention): scores = K . q16, softmax in f32 with a
 * double sum, probabilities rounded to F16, output = V^T . p16. In a batch its
 * KV length is the batch's, and the K . q and V . p products are matrix
 * products that llamafile's sgemm takes where it can (tinyblas.h). */
void attention_heads_batch(const kernels *k, const tinyblas_kernels *tb, int n_batch, const model *m,
                           const kv_layer *kv, const uint16_t *q16, int pos, float *scores, uint16_t *probs16,
                           float *out, long h0, long h1) {
    int hd = m->head_dim, T = pos + 1;
    int n_kv = padded_kv_len(n_batch > T ? n_batch : T, kv->n_ctx);
    /* K . q: n_kv x head_dim by n_batch; V . p: head_dim x n_kv by n_batch */
    typedef float (*dot_f16_fn)(const uint16_t *, const uint16_t *, int);
    const dot_f16_fn kq_dot = tinyblas_takes(n_kv, n_batch, hd) ? tb->dot_f16 : k->dot_f16;
    const bool vp_tinyblas = tinyblas_takes(hd, n_batch, n_kv);
    float scale = 1.0f / sqrtf((float)hd);
    /* Every head's scores, position by position: a position's keys of all
     * the heads are one contiguous read, where a head's keys alone are
     * head_dim values every kv_dim, which streams from memory 2-4x slower
     * (tools/kernel-bench's attention section). */
    const size_t key_first = (size_t)kv_head(m, h0) * hd; /* the heads' keys within a position's row */
    const size_t key_bytes = h0 < h1 ? ((size_t)(kv_head(m, h1 - 1) + 1) * hd - key_first) * sizeof(uint16_t) : 0;
    for (int t = 0; t < T; t++) {
        if (t + KQ_AHEAD < T) prefetch_keys(kv, t + KQ_AHEAD, key_first, key_bytes);
        const uint16_t *keys = kv->k + (size_t)t * kv->kv_dim;
        for (long h = h0; h < h1; h++)
            scores[(size_t)h * kv->n_ctx + (size_t)t] =
                kq_dot(keys + (size_t)kv_head(m, h) * hd, q16 + (size_t)h * hd, hd) * scale;
    }
    for (long h = h0; h < h1; h++)
        head_values(k, vp_tinyblas ? tb : NULL, m, kv, h, T, n_kv, scores + (size_t)h * kv->n_ctx,
                    probs16 + (size_t)h * kv->n_ctx, out + h * hd);
}

void attention_head_tokens(const kernels *k, const model *m, const kv_layer *kv, long h, const uint16_t *q16,
                           int pos0, int n_tok, float *scores, uint16_t *probs16, float *widened, float *out) {
    const int hd = m->head_dim, D = m->n_head * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const uint16_t *keys = kv->k + (size_t)kv_head(m, h) * hd;
    /* every token's scores over the last one's positions: the few past a
     * token's own are left unread */
    k->dot_f16_rows_tile(keys, (size_t)kv->kv_dim, pos0 + n_tok, q16 + (size_t)h * hd, (size_t)D, n_tok, hd, scores,
                         (size_t)kv->n_ctx, widened);
    for (int j = 0; j < n_tok; j++) {
        const int T = pos0 + j + 1;
        float *sc = scores + (size_t)j * kv->n_ctx;
        for (int t = 0; t < T; t++) sc[t] *= scale;
        head_probs(k, T, padded_kv_len(T, kv->n_ctx), sc, probs16 + (size_t)j * kv->n_ctx);
    }
    /* the values of tokens with the same KV length at once, the scores' rows as the kernel's scratch */
    const uint16_t *vh = head_value_rows(m, kv, h);
    for (int j0 = 0, j1; j0 < n_tok; j0 = j1) {
        const int n_kv = padded_kv_len(pos0 + j0 + 1, kv->n_ctx);
        for (j1 = j0 + 1; j1 < n_tok && padded_kv_len(pos0 + j1 + 1, kv->n_ctx) == n_kv; j1++) {}
        k->dot_f16_rows_tile(vh, (size_t)kv->n_ctx, hd, probs16 + (size_t)j0 * kv->n_ctx, (size_t)kv->n_ctx, j1 - j0,
                             n_kv, out + (size_t)j0 * D + (size_t)h * hd, (size_t)D, scores);
    }
}

void attention_heads(const kernels *k, const model *m, const kv_layer *kv, const uint16_t *q16, int pos,
                     float *scores, uint16_t *probs16, float *out, long h0, long h1) {
    attention_heads_batch(k, NULL, 1, m, kv, q16, pos, scores, probs16, out, h0, h1);
}

#define FFN_CHUNK 64 /* neurons whose gate and up dots are buffered for one activation call */

static void silu_mul_rows(const kernels *k, float *h, const float *g, const float *u, long i0, long i1, long n_ff) {
    (void)n_ff;
    k->silu_mul(h, g, u, (int)(i1 - i0));
}

void ffn_act_rows_with(const kernels *k, const model *m, const layer_weights *w, const act_vec *in, float *hb,
                       long i0, long i1, uint32_t *counts, ffn_rows_fn rows, ffn_silu_fn silu) {
    float g[FFN_CHUNK], u[FFN_CHUNK];
    for (long c = i0; c < i1; c += FFN_CHUNK) {
        const long e = c + FFN_CHUNK < i1 ? c + FFN_CHUNK : i1;
        rows(k, &w->gate, in, g, c, e);
        rows(k, &w->up, in, u, c, e);
        if (m->act == FFN_SILU) silu(k, hb + c, g, u, c, e, m->n_ff);
        else
            for (long i = c; i < e; i++) hb[i] = ffn_act_relu(m->act, g[i - c], u[i - c]);
        if (counts)
            for (long i = c; i < e; i++) counts[i] += hb[i] != 0.0f;
    }
}

void ffn_act_rows(const kernels *k, const model *m, const layer_weights *w, const act_vec *in, float *hb,
                  long i0, long i1, uint32_t *counts) {
    ffn_act_rows_with(k, m, w, in, hb, i0, i1, counts, matvec_rows_packed, silu_mul_rows);
}

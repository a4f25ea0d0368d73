#include "ops.h"

#include <math.h>
#include <stdlib.h>

#include "f16.h"

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
    abort(); /* model_load admits only the four types */
}

void matvec_rows(const kernels *k, const weight *w, const act_vec *in, float *out, long r0, long r1) {
    for (long r = r0; r < r1; r++) out[r] = row_dot(k, w, r, in);
}

void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

void rope(float *v, int n_heads, int head_dim, int pos, float base) {
    float theta_scale = powf(base, -2.0f / (float)head_dim);
    for (int h = 0; h < n_heads; h++) {
        float *p = v + (size_t)h * head_dim;
        float theta = (float)pos;
        for (int i = 0; i < head_dim; i += 2) {
            float c = cosf(theta), s = sinf(theta), a = p[i], b = p[i + 1];
            p[i] = a * c - b * s;
            p[i + 1] = a * s + b * c;
            theta *= theta_scale;
        }
    }
}

void kv_store(const kernels *k, const kv_layer *kv, int pos, const float *kvec, const float *vvec) {
    k->f32_to_f16_row(kvec, kv->k + (size_t)pos * kv->kv_dim, kv->kv_dim);
    for (int d = 0; d < kv->kv_dim; d++) kv->v[(size_t)d * kv->n_ctx + pos] = f32_to_f16(vvec[d]);
}

/* llama.cpp (no flash attention): scores = K . q16, softmax in f32 with a
 * double sum, probabilities rounded to F16, output = V^T . p16. */
void attention_heads(const kernels *k, const model *m, const kv_layer *kv, const uint16_t *q16, int pos,
                     float *scores, uint16_t *probs16, float *out, long h0, long h1) {
    int hd = m->head_dim, group = m->n_head / m->n_head_kv, T = pos + 1;
    float scale = 1.0f / sqrtf((float)hd);
    for (long h = h0; h < h1; h++) {
        int kvh = (int)h / group;
        float *sc = scores + (size_t)h * kv->n_ctx;
        uint16_t *p16 = probs16 + (size_t)h * kv->n_ctx;
        const uint16_t *qh = q16 + (size_t)h * hd;
        float mx = -INFINITY;
        for (int t = 0; t < T; t++) {
            sc[t] = k->dot_f16(kv->k + (size_t)t * kv->kv_dim + (size_t)kvh * hd, qh, hd) * scale;
            if (sc[t] > mx) mx = sc[t];
        }
        double sum = 0;
        for (int t = 0; t < T; t++) {
            sc[t] = expf(sc[t] - mx);
            sum += sc[t];
        }
        float inv = (float)(1.0 / sum);
        for (int t = 0; t < T; t++) sc[t] *= inv;
        k->f32_to_f16_row(sc, p16, T);
        for (int d = 0; d < hd; d++)
            out[h * hd + d] = k->dot_f16(kv->v + ((size_t)kvh * hd + d) * kv->n_ctx, p16, T);
    }
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

void ffn_act_rows(const kernels *k, const model *m, const layer_weights *w, const act_vec *in, float *hb,
                  long i0, long i1, uint32_t *counts) {
    for (long i = i0; i < i1; i++) {
        float g = row_dot(k, &w->gate, i, in), u = row_dot(k, &w->up, i, in), h;
        switch (m->act) {
        case FFN_SILU: h = silu(g) * u; break;
        case FFN_RELU: h = g > 0 ? g * u : 0.0f; break;
        default: h = g > 0 && u > 0 ? g * u : 0.0f; break;
        }
        hb[i] = h;
        if (counts && h != 0.0f) counts[i]++;
    }
}

/* Reference forward pass of the llama architecture, one token at a time,
 * split over a thread pool. The arithmetic lives in ops.c (shared with the
 * stack's workers); this file owns the buffers and the order of the steps. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"
#include "threadpool.h"

struct engine {
    const model *m;
    const kernels *k;
    threadpool *pool;
    int n_ctx, kv_dim;
    uint16_t *k_cache;   /* [layer][pos][kv_dim] */
    uint16_t *v_cache;   /* [layer][kv_dim][n_ctx]: transposed so attention's weighted sum is a dot product */
    float *x, *xb, *q, *kv_k, *kv_v, *att_out, *hb, *logits;
    float *scores;       /* [n_head][n_ctx] */
    uint16_t *probs16;   /* [n_head][n_ctx] */
    uint16_t *q16;       /* [n_embd] */
    float *down_partial; /* [n_threads][n_embd], for neuron-major down_t */
    act_vec in;          /* conversion buffers sized for max(n_embd, n_ff) */
    uint32_t *fire_counts;
    ffn_observer observer;
    void *observer_ctx;
    float *gate_pre;     /* [n_ff], allocated when an observer is set */
};

static void *xcalloc(size_t n, size_t size, int *failed) {
    void *p = calloc(n ? n : 1, size);
    if (!p) *failed = 1;
    return p;
}

engine *engine_new(const model *m, int n_threads, int n_ctx, char *err, size_t errlen) {
    return engine_new_with_kernels(m, kernels_best(), n_threads, n_ctx, err, errlen);
}

engine *engine_new_with_kernels(const model *m, const kernels *k, int n_threads, int n_ctx, char *err,
                                size_t errlen) {
    if (n_ctx <= 0) n_ctx = m->n_ctx_train;
    if (n_ctx > (1 << 22)) n_ctx = 1 << 22;
    engine *e = calloc(1, sizeof *e);
    if (!e) { snprintf(err, errlen, "out of memory"); return NULL; }
    e->m = m;
    e->k = k;
    e->n_ctx = n_ctx;
    e->kv_dim = m->n_head_kv * m->head_dim;
    e->pool = pool_new(n_threads);
    int bad = !e->pool;
    size_t cache = (size_t)m->n_layer * (size_t)n_ctx * (size_t)e->kv_dim;
    int wide = m->n_ff > m->n_embd ? m->n_ff : m->n_embd;
    e->k_cache = xcalloc(cache, sizeof(uint16_t), &bad);
    e->v_cache = xcalloc(cache, sizeof(uint16_t), &bad);
    e->x = xcalloc((size_t)m->n_embd, sizeof(float), &bad);
    e->xb = xcalloc((size_t)wide, sizeof(float), &bad);
    e->q = xcalloc((size_t)m->n_embd, sizeof(float), &bad);
    e->kv_k = xcalloc((size_t)e->kv_dim, sizeof(float), &bad);
    e->kv_v = xcalloc((size_t)e->kv_dim, sizeof(float), &bad);
    e->att_out = xcalloc((size_t)m->n_embd, sizeof(float), &bad);
    e->hb = xcalloc((size_t)m->n_ff, sizeof(float), &bad);
    e->logits = xcalloc((size_t)m->n_vocab, sizeof(float), &bad);
    e->scores = xcalloc((size_t)m->n_head * (size_t)n_ctx, sizeof(float), &bad);
    e->probs16 = xcalloc((size_t)m->n_head * (size_t)n_ctx, sizeof(uint16_t), &bad);
    e->q16 = xcalloc((size_t)m->n_embd, sizeof(uint16_t), &bad);
    e->down_partial = xcalloc((size_t)(e->pool ? pool_size(e->pool) : 1) * (size_t)m->n_embd, sizeof(float), &bad);
    e->in.f16 = xcalloc((size_t)wide, sizeof(uint16_t), &bad);
    e->in.q8 = xcalloc((size_t)wide / QK8_0 + 1, sizeof(block_q8_0), &bad);
    if (bad) {
        snprintf(err, errlen, "out of memory allocating the engine (KV cache %zu MiB)", cache * 4 >> 20);
        engine_free(e);
        return NULL;
    }
    return e;
}

void engine_free(engine *e) {
    if (!e) return;
    pool_free(e->pool);
    free(e->k_cache); free(e->v_cache);
    free(e->x); free(e->xb); free(e->q); free(e->kv_k); free(e->kv_v); free(e->att_out);
    free(e->hb); free(e->logits); free(e->scores); free(e->probs16); free(e->q16);
    free(e->down_partial); free(e->gate_pre); free(e->in.f16); free(e->in.q8);
    free(e);
}

int engine_n_ctx(const engine *e) { return e->n_ctx; }
void engine_count_firing(engine *e, uint32_t *counts) { e->fire_counts = counts; }

void engine_observe_ffn(engine *e, ffn_observer fn, void *ctx) {
    if (fn && !e->gate_pre) e->gate_pre = malloc(sizeof(float) * (size_t)e->m->n_ff);
    e->observer = e->gate_pre ? fn : NULL;
    e->observer_ctx = ctx;
}

static kv_layer layer_cache(const engine *e, int l) {
    size_t off = (size_t)l * (size_t)e->n_ctx * (size_t)e->kv_dim;
    return (kv_layer){e->k_cache + off, e->v_cache + off, e->n_ctx, e->kv_dim};
}

/* ---- parallel jobs ---- */

/* Up to three matrix-vector products over one input, rows shared out as one range. */
typedef struct {
    engine *e;
    int n;
    const weight *w[3];
    float *out[3];
} matvec_job;

static void matvec_worker(void *ctx, int ith, int nth) {
    matvec_job *j = ctx;
    long total = 0;
    for (int i = 0; i < j->n; i++) total += j->w[i]->rows;
    long begin, end;
    pool_split(total, ith, nth, &begin, &end);
    long base = 0;
    for (int i = 0; i < j->n; i++) {
        long rows = j->w[i]->rows;
        long lo = begin > base ? begin - base : 0, hi = end - base < rows ? end - base : rows;
        if (lo < hi) matvec_rows(j->e->k, j->w[i], &j->e->in, j->out[i], lo, hi);
        base += rows;
    }
}

static void matvec(engine *e, const float *x, int n, int count, const weight *w0, float *o0,
                   const weight *w1, float *o1, const weight *w2, float *o2) {
    matvec_job j = {e, count, {w0, w1, w2}, {o0, o1, o2}};
    act_convert_for(e->k, &e->in, x, n, j.w, count);
    pool_run(e->pool, matvec_worker, &j);
}

typedef struct {
    engine *e;
    int layer, pos;
} layer_job;

static void attention_worker(void *ctx, int ith, int nth) {
    layer_job *j = ctx;
    engine *e = j->e;
    kv_layer kv = layer_cache(e, j->layer);
    long h0, h1;
    pool_split(e->m->n_head, ith, nth, &h0, &h1);
    attention_heads(e->k, e->m, &kv, e->q16, j->pos, e->scores, e->probs16, e->att_out, h0, h1);
}

static void ffn_up_worker(void *ctx, int ith, int nth) {
    layer_job *j = ctx;
    engine *e = j->e;
    const model *m = e->m;
    uint32_t *counts = e->fire_counts ? e->fire_counts + (size_t)j->layer * m->n_ff : NULL;
    long i0, i1;
    pool_split(m->n_ff, ith, nth, &i0, &i1);
    ffn_act_rows(e->k, m, &m->layers[j->layer], &e->in, e->hb, i0, i1, counts);
}

#define DOWN_T_CHUNK 1024 /* a multiple of every block size */

/* down projection from neuron-major rows (PWRI ffn_down_t): per-thread partial sums */
static void ffn_down_t_worker(void *ctx, int ith, int nth) {
    layer_job *j = ctx;
    engine *e = j->e;
    const model *m = e->m;
    const weight *wt = &m->layers[j->layer].down_t;
    float *acc = e->down_partial + (size_t)ith * m->n_embd;
    float tmp[DOWN_T_CHUNK];
    memset(acc, 0, sizeof(float) * (size_t)m->n_embd);
    long i0, i1;
    pool_split(m->n_ff, ith, nth, &i0, &i1);
    for (long i = i0; i < i1; i++) {
        if (e->hb[i] == 0.0f) continue;
        const char *src = (const char *)wt->data + (size_t)i * wt->row_bytes;
        for (int c = 0; c < m->n_embd; c += DOWN_T_CHUNK) {
            int len = m->n_embd - c < DOWN_T_CHUNK ? m->n_embd - c : DOWN_T_CHUNK;
            dequantize_row(wt->type, src + ggml_row_bytes(wt->type, (uint64_t)c), tmp, len);
            e->k->axpy_f32(acc + c, e->hb[i], tmp, len);
        }
    }
}

static void reduce_down_partials(engine *e, float *out) {
    int n = e->m->n_embd, nth = pool_size(e->pool);
    for (int i = 0; i < n; i++) {
        float s = 0;
        for (int t = 0; t < nth; t++) s += e->down_partial[(size_t)t * n + i]; /* fixed order */
        out[i] = s;
    }
}

/* ---- the forward pass ---- */

static void attention_block(engine *e, int l, int pos) {
    const model *m = e->m;
    const layer_weights *w = &m->layers[l];
    rmsnorm(e->xb, e->x, w->attn_norm, m->n_embd, m->rms_eps);
    matvec(e, e->xb, m->n_embd, 3, &w->wq, e->q, &w->wk, e->kv_k, &w->wv, e->kv_v);
    rope(e->q, m->n_head, m->head_dim, pos, m->rope_base);
    rope(e->kv_k, m->n_head_kv, m->head_dim, pos, m->rope_base);
    kv_layer kv = layer_cache(e, l);
    kv_store(e->k, &kv, pos, e->kv_k, e->kv_v);
    e->k->f32_to_f16_row(e->q, e->q16, m->n_embd);
    layer_job j = {e, l, pos};
    pool_run(e->pool, attention_worker, &j);
    matvec(e, e->att_out, m->n_embd, 1, &w->wo, e->xb, NULL, NULL, NULL, NULL);
    for (int i = 0; i < m->n_embd; i++) e->x[i] += e->xb[i];
}

static void ffn_block(engine *e, int l, int pos) {
    const model *m = e->m;
    const layer_weights *w = &m->layers[l];
    rmsnorm(e->xb, e->x, w->ffn_norm, m->n_embd, m->rms_eps);
    const weight *gu[2] = {&w->gate, &w->up};
    act_convert_for(e->k, &e->in, e->xb, m->n_embd, gu, 2);
    layer_job j = {e, l, pos};
    pool_run(e->pool, ffn_up_worker, &j);
    if (e->observer) {
        matvec(e, e->xb, m->n_embd, 1, &w->gate, e->gate_pre, NULL, NULL, NULL, NULL);
        e->observer(e->observer_ctx, l, e->x, e->xb, e->gate_pre);
    }
    if (w->down.data) {
        matvec(e, e->hb, m->n_ff, 1, &w->down, e->xb, NULL, NULL, NULL, NULL);
    } else {
        pool_run(e->pool, ffn_down_t_worker, &j);
        reduce_down_partials(e, e->xb);
    }
    for (int i = 0; i < m->n_embd; i++) e->x[i] += e->xb[i];
}

float *engine_forward(engine *e, int token, int pos) {
    const model *m = e->m;
    if (token < 0 || token >= m->n_vocab || pos < 0 || pos >= e->n_ctx) return NULL;
    dequantize_row(m->tok_embd.type, (const char *)m->tok_embd.data + (size_t)token * m->tok_embd.row_bytes, e->x,
                   m->n_embd);
    for (int l = 0; l < m->n_layer; l++) {
        attention_block(e, l, pos);
        ffn_block(e, l, pos);
    }
    rmsnorm(e->xb, e->x, m->output_norm, m->n_embd, m->rms_eps);
    matvec(e, e->xb, m->n_embd, 1, &m->output, e->logits, NULL, NULL, NULL, NULL);
    return e->logits;
}

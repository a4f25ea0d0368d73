/* Reference forward pass of the llama architecture, one token at a time,
 * split over a thread pool. The arithmetic lives in ops.c and ffn_chunks.c
 * (shared with the stack's workers); this file owns the buffers and the order
 * of the steps. llama.cpp's prompt batch is in engine_prefill.c. */
#include "engine/engine.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "engine/ops.h"
#include "engine/ops_llama.h"
#include "engine/predictor.h"
#include "kernels/sparse_kernels.h"
#include "util/threadpool.h"

#include "engine/engine_impl.h"

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
    e->k_cache = calloc_flagged(cache, sizeof(uint16_t), &bad);
    e->v_cache = calloc_flagged(cache, sizeof(uint16_t), &bad);
    e->x = calloc_flagged((size_t)m->n_embd, sizeof(float), &bad);
    e->xb = calloc_flagged((size_t)wide, sizeof(float), &bad);
    e->q = calloc_flagged((size_t)m->n_embd, sizeof(float), &bad);
    e->kv_k = calloc_flagged((size_t)e->kv_dim, sizeof(float), &bad);
    e->kv_v = calloc_flagged((size_t)e->kv_dim, sizeof(float), &bad);
    e->att_out = calloc_flagged((size_t)m->n_embd, sizeof(float), &bad);
    e->hb = calloc_flagged((size_t)m->n_ff, sizeof(float), &bad);
    e->logits = calloc_flagged((size_t)m->n_vocab, sizeof(float), &bad);
    e->scores = calloc_flagged((size_t)m->n_head * (size_t)n_ctx, sizeof(float), &bad);
    e->probs16 = calloc_flagged((size_t)m->n_head * (size_t)n_ctx, sizeof(uint16_t), &bad);
    e->q16 = calloc_flagged((size_t)m->n_embd, sizeof(uint16_t), &bad);
    e->rope_cs = calloc_flagged((size_t)m->head_dim, sizeof(float), &bad);
    int nth = e->n_threads = e->pool ? pool_size(e->pool) : 1;
    e->partials = calloc_flagged((size_t)ffn_chunk_count(m) * (size_t)m->n_embd, sizeof(float), &bad);
    e->scratch = calloc_flagged((size_t)nth, sizeof *e->scratch, &bad);
    e->chunk_stats = calloc_flagged((size_t)nth, sizeof *e->chunk_stats, &bad);
    for (int t = 0; t < nth && e->scratch; t++) bad |= ffn_scratch_init(&e->scratch[t], m) != 0;
    e->gather = k->gather;
    e->axpy = k->sparse;
    e->tb = tinyblas_best();
    e->in.f16 = calloc_flagged((size_t)wide, sizeof(uint16_t), &bad);
    e->in.q8 = calloc_flagged((size_t)wide / QK8_0 + 1, sizeof(block_q8_0), &bad);
    if (bad) {
        snprintf(err, errlen, "out of memory allocating the engine (KV cache %zu MiB)", cache * 4 >> 20);
        engine_free(e);
        return NULL;
    }
    return e;
}

static void down_t_free(engine *e) {
    if (e->down_t_built)
        for (int l = 0; l < e->m->n_layer; l++) free(e->down_t_built[l]);
    free(e->down_t_built); free(e->down_t);
    e->down_t_built = NULL, e->down_t = NULL;
}

static void predictor_buffers_free(engine *e) {
    free(e->pred_hidden); free(e->pred_conv.f16); free(e->pred_conv.q8);
    e->pred_hidden = NULL, e->pred_conv.f16 = NULL, e->pred_conv.q8 = NULL;
}

void engine_free(engine *e) {
    if (!e) return;
    pool_free(e->pool);
    free(e->k_cache); free(e->v_cache);
    free(e->x); free(e->xb); free(e->q); free(e->kv_k); free(e->kv_v); free(e->att_out);
    free(e->hb); free(e->logits); free(e->scores); free(e->probs16); free(e->q16); free(e->rope_cs);
    free(e->gate_pre); free(e->layer_in); free(e->in.f16); free(e->in.q8);
    if (e->scratch)
        for (int t = 0; t < e->n_threads; t++) ffn_scratch_free(&e->scratch[t]);
    free(e->scratch); free(e->chunk_stats); free(e->partials);
    down_t_free(e);
    predictor_buffers_free(e);
    prompt_pass_free(e->prompt);
    free(e);
}

int engine_n_ctx(const engine *e) { return e->n_ctx; }
void engine_count_firing(engine *e, uint32_t *counts) { e->fire_counts = counts; }

void engine_observe_ffn(engine *e, ffn_observer fn, void *ctx) {
    if (fn && !e->gate_pre) e->gate_pre = malloc(sizeof(float) * (size_t)e->m->n_ff);
    if (fn && !e->layer_in) e->layer_in = malloc(sizeof(float) * (size_t)e->m->n_embd);
    e->observer = e->gate_pre && e->layer_in ? fn : NULL;
    e->observer_ctx = ctx;
}

static int down_t_alloc(engine *e, char *err, size_t errlen) {
    const model *m = e->m;
    int bad = 0;
    e->down_t = calloc_flagged((size_t)m->n_layer, sizeof *e->down_t, &bad);
    e->down_t_built = calloc_flagged((size_t)m->n_layer, sizeof *e->down_t_built, &bad);
    for (int l = 0; l < m->n_layer && !bad; l++) {
        long first;
        if (ffn_down_t_for(&m->layers[l], 0, m->n_ff, &e->down_t[l], &first, &e->down_t_built[l])) {
            snprintf(err, errlen, "cannot build layer %d's neuron-major down_t (out of memory?)", l);
            down_t_free(e);
            return -1;
        }
    }
    if (bad) {
        snprintf(err, errlen, "out of memory allocating the neuron-major down rows");
        down_t_free(e);
        return -1;
    }
    return 0;
}

static int predictor_buffers_alloc(engine *e, const predictor *p) {
    int rank = predictor_max_rank(p), wide = rank > e->m->n_embd ? rank : e->m->n_embd, bad = 0;
    predictor_buffers_free(e);
    e->pred_hidden = calloc_flagged((size_t)rank, sizeof(float), &bad);
    e->pred_conv.f16 = calloc_flagged((size_t)wide, sizeof(uint16_t), &bad);
    e->pred_conv.q8 = calloc_flagged((size_t)wide / QK8_0 + 1, sizeof(block_q8_0), &bad);
    return bad ? -1 : 0;
}

int engine_set_ffn_mode(engine *e, ffn_mode mode, const predictor *p, char *err, size_t errlen) {
    const char *why = ffn_mode_refusal(e->m, mode, p != NULL);
    if (why) {
        snprintf(err, errlen, "%s", why);
        return -1;
    }
    if (mode == FFN_PREDICTOR && predictor_buffers_alloc(e, p)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (mode != FFN_DENSE && e->llama) {
        snprintf(err, errlen, "llama.cpp compatibility computes the dense FFN only");
        return -1;
    }
    if (mode != FFN_DENSE && !e->down_t && down_t_alloc(e, err, errlen)) return -1;
    e->pred = mode == FFN_PREDICTOR ? p : NULL;
    e->ffn_mode = mode;
    return 0;
}

void engine_ffn_stats(const engine *e, engine_ffn_stats_t *st) { *st = e->stats; }

kv_layer engine_layer_cache(const engine *e, int l) {
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
        if (lo < hi) (j->e->llama ? llama_matvec_rows : matvec_rows)(j->e->k, j->w[i], &j->e->in, j->out[i], lo, hi);
        base += rows;
    }
}

void engine_matvec(engine *e, const float *x, int n, int count, const weight *w0, float *o0,
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
    kv_layer kv = engine_layer_cache(e, j->layer);
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
    if (e->llama) llama_ffn_act_rows(e->k, m, &m->layers[j->layer], &e->in, e->hb, i0, i1, counts);
    else ffn_act_rows(e->k, m, &m->layers[j->layer], &e->in, e->hb, i0, i1, counts);
}

/* The chunked FFN: threads take chunks in turn; the result does not depend on who took which. */
typedef struct {
    engine *e;
    ffn_layer f;
    _Atomic int next;
} chunks_job;

static void chunks_worker(void *ctx, int ith, int nth) {
    chunks_job *j = ctx;
    engine *e = j->e;
    const model *m = e->m;
    uint32_t *counts = e->fire_counts ? e->fire_counts + (size_t)j->f.layer * m->n_ff : NULL;
    ffn_chunks_take(&j->f, &j->next, NULL, ffn_chunk_count(m), nth, e->partials, &e->scratch[ith],
                    &e->chunk_stats[ith], counts);
}

/* ---- the forward pass ---- */

static void attention_block(engine *e, int l, int pos) {
    const model *m = e->m;
    const layer_weights *w = &m->layers[l];
    rmsnorm(e->xb, e->x, w->attn_norm, m->n_embd, m->rms_eps);
    engine_matvec(e, e->xb, m->n_embd, 3, &w->wq, e->q, &w->wk, e->kv_k, &w->wv, e->kv_v);
    rope_apply(e->q, m->n_head, m->head_dim, e->rope_cs);
    rope_apply(e->kv_k, m->n_head_kv, m->head_dim, e->rope_cs);
    kv_layer kv = engine_layer_cache(e, l);
    kv_store(e->k, &kv, pos, e->kv_k, e->kv_v);
    e->k->f32_to_f16_row(e->q, e->q16, m->n_embd);
    layer_job j = {e, l, pos};
    pool_run(e->pool, attention_worker, &j);
    engine_matvec(e, e->att_out, m->n_embd, 1, &w->wo, e->xb, NULL, NULL, NULL, NULL);
    for (int i = 0; i < m->n_embd; i++) e->x[i] += e->xb[i];
}

/* x += FFN(xb) by chunks (ffn_chunks.h); xb holds the FFN input, converted in e->in. */
static void ffn_chunked(engine *e, int l) {
    const model *m = e->m;
    ffn_mode mode = e->ffn_mode;
    chunks_job j = {.e = e,
                    .f = {.m = m, .k = e->k, .gather = e->gather, .axpy = e->axpy, .layer = l, .mode = mode,
                          .in = &e->in, .pred = e->pred, .pred_hidden = &e->pred_conv}};
    j.f.down_t = e->down_t ? &e->down_t[l] : &m->layers[l].down_t;
    if (mode == FFN_PREDICTOR) {
        predictor_prepare(e->pred, l, e->x, e->xb, e->pred_hidden, &e->pred_conv);
        e->stats.bytes += predictor_stage1_bytes(e->pred, l);
    }
    memset(e->chunk_stats, 0, sizeof *e->chunk_stats * (size_t)e->n_threads);
    pool_run(e->pool, chunks_worker, &j);
    for (int t = 0; t < e->n_threads; t++) {
        e->stats.computed += e->chunk_stats[t].computed;
        e->stats.active += e->chunk_stats[t].fired;
        e->stats.bytes += e->chunk_stats[t].bytes;
    }
    ffn_reduce_rows(m, e->partials, e->x, e->x, 0, m->n_embd);
}

void engine_ffn_block(engine *e, int l, int pos) {
    const model *m = e->m;
    const layer_weights *w = &m->layers[l];
    rmsnorm(e->xb, e->x, w->ffn_norm, m->n_embd, m->rms_eps);
    const weight *gu[2] = {&w->gate, &w->up};
    act_convert_for(e->k, &e->in, e->xb, m->n_embd, gu, 2);
    if (e->observer) {
        matvec_job gj = {e, 1, {&w->gate}, {e->gate_pre}};
        pool_run(e->pool, matvec_worker, &gj);
        e->observer(e->observer_ctx, &(ffn_observation){l, e->layer_in, e->x, e->xb, e->gate_pre});
    }
    if (ffn_mode_chunked(m, e->ffn_mode)) {
        ffn_chunked(e, l);
        return;
    }
    e->stats.computed += (uint64_t)m->n_ff;
    e->stats.active += (uint64_t)m->n_ff;
    e->stats.bytes += weight_bytes(&w->gate) + weight_bytes(&w->up) + weight_bytes(&w->down);
    layer_job j = {e, l, pos};
    pool_run(e->pool, ffn_up_worker, &j);
    engine_matvec(e, e->hb, m->n_ff, 1, &w->down, e->xb, NULL, NULL, NULL, NULL);
    for (int i = 0; i < m->n_embd; i++) e->x[i] += e->xb[i];
}

float *engine_forward(engine *e, int token, int pos) {
    const model *m = e->m;
    if (token < 0 || token >= m->n_vocab || pos < 0 || pos >= e->n_ctx) return NULL;
    dequantize_row(m->tok_embd.type, (const char *)m->tok_embd.data + (size_t)token * m->tok_embd.row_bytes, e->x,
                   m->n_embd);
    memset(&e->stats, 0, sizeof e->stats);
    rope_angles(e->rope_cs, m->head_dim, pos, m->rope_base);
    for (int l = 0; l < m->n_layer; l++) {
        if (e->observer) memcpy(e->layer_in, e->x, sizeof(float) * (size_t)m->n_embd);
        attention_block(e, l, pos);
        engine_ffn_block(e, l, pos);
    }
    rmsnorm(e->xb, e->x, m->output_norm, m->n_embd, m->rms_eps);
    engine_matvec(e, e->xb, m->n_embd, 1, &m->output, e->logits, NULL, NULL, NULL, NULL);
    return e->logits;
}

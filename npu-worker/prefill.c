#include "prefill.h"

#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "kernels/kernels.h"
#include "util/log.h"
#include "util/threadpool.h"

struct prefiller {
    const stack_view *sv;
    const model *m;
    const kernels *k;
    threadpool *pool;
    int max_tok, kv_dim, wide;
    /* per token t, row t of each [max_tok][width] buffer */
    float *x;        /* residual, [n_embd] */
    float *xb;       /* normalized residual, [n_embd] */
    float *q;        /* [n_embd] */
    float *kk, *vv;  /* [kv_dim] */
    uint16_t *q16;   /* [n_embd] */
    float *rope_cs;  /* [head_dim]: rope_angles at the token's position, the same in every layer */
    float *att;      /* attention output, [n_embd] */
    float *hb;       /* FFN activations, [n_ff] */
    float *proj;     /* Wo / down result before the residual add, [n_embd] */
    act_vec *in;     /* [max_tok] conversions, each up to `wide` elements */
    uint16_t *in_f16;
    block_q8_0 *in_q8;
    float *scores;   /* [n_threads][n_head][n_ctx] */
    uint16_t *probs16;
};

static float *row_of(float *buf, int t, int width) { return buf + (size_t)t * (size_t)width; }

/* ---- parallel jobs ---- */

/* Rows of up to three weights over all tokens, shared out as one range of rows. */
typedef struct {
    prefiller *p;
    int n_tok, n;
    const weight *w[3];
    float *out[3];
    int width[3];   /* out row stride per token */
} gemm_job;

static void gemm_worker(void *ctx, int ith, int nth) {
    gemm_job *j = ctx;
    long total = 0;
    for (int i = 0; i < j->n; i++) total += j->w[i]->rows;
    long begin, end, base = 0;
    pool_split(total, ith, nth, &begin, &end);
    for (int i = 0; i < j->n; i++) {
        long rows = j->w[i]->rows;
        long lo = begin > base ? begin - base : 0, hi = end - base < rows ? end - base : rows;
        if (lo < hi) gemm_rows(j->p->k, j->w[i], j->p->in, j->n_tok, j->out[i], (size_t)j->width[i], lo, hi);
        base += rows;
    }
}

static void gemm(prefiller *p, int n_tok, int n, const weight *w0, float *o0, int s0, const weight *w1, float *o1,
                 int s1, const weight *w2, float *o2, int s2) {
    gemm_job j = {p, n_tok, n, {w0, w1, w2}, {o0, o1, o2}, {s0, s1, s2}};
    pool_run(p->pool, gemm_worker, &j);
}

static void gemm_one(prefiller *p, int n_tok, const weight *w, float *out, int stride) {
    gemm(p, n_tok, 1, w, out, stride, NULL, NULL, 0, NULL, NULL, 0);
}

typedef enum {
    TOK_ATTN_IN,    /* rmsnorm + convert for Q/K/V */
    TOK_ROPE_STORE, /* RoPE, KV store, Q to F16 */
    TOK_WO_IN,      /* convert attention output for Wo */
    TOK_ATTN_ADD,   /* x += Wo . att */
    TOK_FFN_IN,     /* rmsnorm + convert for gate/up */
    TOK_DOWN_IN,    /* convert hb for down */
    TOK_FFN_ADD,    /* x += down . hb */
} token_step;

typedef struct {
    prefiller *p;
    token_step step;
    int layer, n_tok, first;
} token_job;

static void token_one(const token_job *j, int t) {
    prefiller *p = j->p;
    const model *m = p->m;
    const layer_weights *w = &m->layers[j->layer];
    int ne = m->n_embd;
    float *x = row_of(p->x, t, ne), *xb = row_of(p->xb, t, ne);
    act_vec *in = &p->in[t];
    switch (j->step) {
    case TOK_ATTN_IN: {
        rmsnorm(xb, x, w->attn_norm, ne, m->rms_eps);
        const weight *ws[3] = {&w->wq, &w->wk, &w->wv};
        act_convert_for(p->k, in, xb, ne, ws, 3);
        break;
    }
    case TOK_ROPE_STORE: {
        int pos = j->first + t;
        float *q = row_of(p->q, t, ne), *kk = row_of(p->kk, t, p->kv_dim);
        const float *cs = row_of(p->rope_cs, t, m->head_dim);
        rope_apply(q, m->n_head, m->head_dim, cs);
        rope_apply(kk, m->n_head_kv, m->head_dim, cs);
        kv_layer kv = stack_kv_layer(p->sv, j->layer);
        kv_store(p->k, &kv, pos, kk, row_of(p->vv, t, p->kv_dim));
        p->k->f32_to_f16_row(q, p->q16 + (size_t)t * ne, ne);
        break;
    }
    case TOK_WO_IN: {
        const weight *ws[1] = {&w->wo};
        act_convert_for(p->k, in, row_of(p->att, t, ne), ne, ws, 1);
        break;
    }
    case TOK_ATTN_ADD:
    case TOK_FFN_ADD: {
        const float *proj = row_of(p->proj, t, ne);
        for (int i = 0; i < ne; i++) x[i] += proj[i];
        break;
    }
    case TOK_FFN_IN: {
        rmsnorm(xb, x, w->ffn_norm, ne, m->rms_eps);
        const weight *ws[2] = {&w->gate, &w->up};
        act_convert_for(p->k, in, xb, ne, ws, 2);
        break;
    }
    case TOK_DOWN_IN: {
        const weight *ws[1] = {&w->down};
        act_convert_for(p->k, in, row_of(p->hb, t, m->n_ff), m->n_ff, ws, 1);
        break;
    }
    }
}

static void token_worker(void *ctx, int ith, int nth) {
    token_job *j = ctx;
    long t0, t1;
    pool_split(j->n_tok, ith, nth, &t0, &t1);
    for (long t = t0; t < t1; t++) token_one(j, (int)t);
}

static void per_token(prefiller *p, token_step step, int layer, int n_tok, int first) {
    token_job j = {p, step, layer, n_tok, first};
    pool_run(p->pool, token_worker, &j);
}

/* Causal attention: token t attends to positions 0 .. first + t, all stored
 * before this runs. (token, head) pairs are dealt round-robin because later
 * tokens cost more. */
static void attention_worker(void *ctx, int ith, int nth) {
    token_job *j = ctx;
    prefiller *p = j->p;
    const model *m = p->m;
    size_t per_thread = (size_t)m->n_head * (size_t)p->sv->ctl->params.n_ctx;
    float *scores = p->scores + (size_t)ith * per_thread;
    uint16_t *probs16 = p->probs16 + (size_t)ith * per_thread;
    kv_layer kv = stack_kv_layer(p->sv, j->layer);
    long pairs = (long)j->n_tok * m->n_head;
    for (long i = ith; i < pairs; i += nth) {
        int t = (int)(i / m->n_head);
        long h = i % m->n_head;
        attention_heads(p->k, m, &kv, p->q16 + (size_t)t * m->n_embd, j->first + t, scores, probs16,
                        row_of(p->att, t, m->n_embd), h, h + 1);
    }
}

/* Gate/up rows by L2-sized tiles of neurons, each tile used for every token. */
static void ffn_worker(void *ctx, int ith, int nth) {
    token_job *j = ctx;
    prefiller *p = j->p;
    const model *m = p->m;
    const layer_weights *w = &m->layers[j->layer];
    long i0, i1, tile = gemm_tile_rows(&w->gate) / 2; /* gate and up rows share the tile */
    if (tile < 1) tile = 1;
    pool_split(m->n_ff, ith, nth, &i0, &i1);
    for (long a = i0; a < i1; a += tile) {
        long b = a + tile < i1 ? a + tile : i1;
        for (int t = 0; t < j->n_tok; t++) ffn_act_rows(p->k, m, w, &p->in[t], row_of(p->hb, t, m->n_ff), a, b, NULL);
    }
}

/* ---- the pass ---- */

static void layer_pass(prefiller *p, int l, int n, int first) {
    const model *m = p->m;
    const layer_weights *w = &m->layers[l];
    int ne = m->n_embd, kvd = p->kv_dim;
    per_token(p, TOK_ATTN_IN, l, n, first);
    gemm(p, n, 3, &w->wq, p->q, ne, &w->wk, p->kk, kvd, &w->wv, p->vv, kvd);
    per_token(p, TOK_ROPE_STORE, l, n, first);
    token_job j = {p, TOK_ROPE_STORE, l, n, first};
    pool_run(p->pool, attention_worker, &j);
    per_token(p, TOK_WO_IN, l, n, first);
    gemm_one(p, n, &w->wo, p->proj, ne);
    per_token(p, TOK_ATTN_ADD, l, n, first);
    per_token(p, TOK_FFN_IN, l, n, first);
    pool_run(p->pool, ffn_worker, &j);
    per_token(p, TOK_DOWN_IN, l, n, first);
    gemm_one(p, n, &w->down, p->proj, ne);
    per_token(p, TOK_FFN_ADD, l, n, first);
}

/* The last token's residual to x_layers[n_layer] and its logits, as the decode output task would. */
static void finish(prefiller *p, int n) {
    const model *m = p->m;
    const stack_view *sv = p->sv;
    int ne = m->n_embd;
    float *last = row_of(p->x, n - 1, ne);
    memcpy(stack_act_f32(sv, sv->layout.x_layers) + (size_t)m->n_layer * ne, last, sizeof(float) * (size_t)ne);
    rmsnorm(p->xb, last, m->output_norm, ne, m->rms_eps);
    const weight *ws[1] = {&m->output};
    act_convert_for(p->k, &p->in[0], p->xb, ne, ws, 1);
    gemm_one(p, 1, &m->output, stack_act_f32(sv, sv->layout.logits), m->n_vocab);
}

int prefiller_run(prefiller *p, const int32_t *tokens, int n, int first, uint32_t epoch, prefill_tick tick,
                  void *tick_ctx) {
    const model *m = p->m;
    for (int t = 0; t < n; t++) {
        dequantize_row(m->tok_embd.type, (const char *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes,
                       row_of(p->x, t, m->n_embd), m->n_embd);
        rope_angles(row_of(p->rope_cs, t, m->head_dim), m->head_dim, first + t, m->rope_base);
    }
    for (int l = 0; l < m->n_layer; l++) {
        if ((uint32_t)atomic_load(&p->sv->ctl->epoch) != epoch) return -1;
        layer_pass(p, l, n, first);
        if (tick) tick(tick_ctx, l + 1);
    }
    if ((uint32_t)atomic_load(&p->sv->ctl->epoch) != epoch) return -1;
    finish(p, n);
    return 0;
}

/* ---- set-up ---- */

static void *alloc_zero(size_t n, size_t size, int *failed) {
    void *ptr = calloc(n ? n : 1, size);
    if (!ptr) *failed = 1;
    return ptr;
}

prefiller *prefiller_new(const stack_view *sv, int n_threads) {
    prefiller *p = calloc(1, sizeof *p);
    if (!p) { log_error("out of memory"); return NULL; }
    const model *m = &sv->m;
    p->sv = sv;
    p->m = m;
    p->k = kernels_best();
    p->max_tok = sv->ctl->params.max_prefill;
    p->kv_dim = m->n_head_kv * m->head_dim;
    p->wide = m->n_ff > m->n_embd ? m->n_ff : m->n_embd;
    p->pool = pool_new(n_threads);
    int bad = !p->pool;
    size_t T = (size_t)p->max_tok, ne = (size_t)m->n_embd, kvd = (size_t)p->kv_dim, wide = (size_t)p->wide;
    size_t q8_blocks = wide / QK8_0 + 1, att_scratch = (size_t)m->n_head * (size_t)sv->ctl->params.n_ctx;
    p->x = alloc_zero(T * ne, sizeof(float), &bad);
    p->xb = alloc_zero(T * ne, sizeof(float), &bad);
    p->q = alloc_zero(T * ne, sizeof(float), &bad);
    p->kk = alloc_zero(T * kvd, sizeof(float), &bad);
    p->vv = alloc_zero(T * kvd, sizeof(float), &bad);
    p->q16 = alloc_zero(T * ne, sizeof(uint16_t), &bad);
    p->rope_cs = alloc_zero(T * (size_t)m->head_dim, sizeof(float), &bad);
    p->att = alloc_zero(T * ne, sizeof(float), &bad);
    p->hb = alloc_zero(T * (size_t)m->n_ff, sizeof(float), &bad);
    p->proj = alloc_zero(T * ne, sizeof(float), &bad);
    p->in = alloc_zero(T, sizeof(act_vec), &bad);
    p->in_f16 = alloc_zero(T * wide, sizeof(uint16_t), &bad);
    p->in_q8 = alloc_zero(T * q8_blocks, sizeof(block_q8_0), &bad);
    size_t nth = (size_t)(p->pool ? pool_size(p->pool) : 1);
    p->scores = alloc_zero(nth * att_scratch, sizeof(float), &bad);
    p->probs16 = alloc_zero(nth * att_scratch, sizeof(uint16_t), &bad);
    if (bad) {
        log_error("out of memory allocating prefill buffers for %d tokens", p->max_tok);
        prefiller_free(p);
        return NULL;
    }
    for (size_t t = 0; t < T; t++) p->in[t] = (act_vec){NULL, p->in_f16 + t * wide, p->in_q8 + t * q8_blocks};
    return p;
}

void prefiller_free(prefiller *p) {
    if (!p) return;
    pool_free(p->pool);
    free(p->x); free(p->xb); free(p->q); free(p->kk); free(p->vv); free(p->q16); free(p->rope_cs); free(p->att);
    free(p->hb); free(p->proj); free(p->in); free(p->in_f16); free(p->in_q8); free(p->scores); free(p->probs16);
    free(p);
}

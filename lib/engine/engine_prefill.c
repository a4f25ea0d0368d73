/* The reference engine's prompt: by the prompt pass (prompt.h), token by
 * token, or — in llama.cpp compatibility mode (engine_set_llama_compat) — as
 * llama.cpp's CPU backend runs a prompt batch: F32 weight products and attention in tinyBLAS order
 * where llama.cpp takes it (lib/kernels/tinyblas.h), so pi2 can be checked against
 * llama.cpp's outputs to their printed digits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "engine/ops_llama.h"

/* ---- llama.cpp compatibility: its prompt batch ---- */

int engine_set_llama_compat(engine *e, bool on, char *err, size_t errlen) {
    const model *m = e->m;
    if (on && m->act != FFN_SILU) {
        snprintf(err, errlen, "llama.cpp compatibility covers the llama architecture's SiLU FFN only");
        return -1;
    }
    if (on && e->ffn_mode != FFN_DENSE) {
        snprintf(err, errlen, "llama.cpp compatibility computes the dense FFN only");
        return -1;
    }
    for (int l = 0; on && l < m->n_layer; l++)
        if (!m->layers[l].down.data) {
            snprintf(err, errlen, "llama.cpp compatibility needs ffn_down (layer %d has only ffn_down_t)", l);
            return -1;
        }
    e->llama = on;
    return 0;
}

/* A prompt's activations, token after token ([n][width] each). */
typedef struct {
    float *x, *xb, *q, *k, *v, *att, *gate, *up, *hb;
    float *rope_cs;  /* [n][head_dim]: rope_angles at each position, the same in every layer */
    uint16_t *q16;
    uint16_t *f16;   /* [n][wide]: activations converted for F16 weights */
    block_q8_0 *q8;  /* [n][q8_stride] and for quantized ones */
    int wide, q8_stride;
} batch;

static void batch_free(batch *b) {
    free(b->x); free(b->xb); free(b->q); free(b->k); free(b->v); free(b->att);
    free(b->gate); free(b->up); free(b->hb); free(b->rope_cs); free(b->q16); free(b->f16); free(b->q8);
}

static int batch_alloc(batch *b, const engine *e, int n) {
    const model *m = e->m;
    const size_t N = (size_t)n, D = (size_t)m->n_embd, F = (size_t)m->n_ff, KV = (size_t)e->kv_dim;
    int bad = 0;
    memset(b, 0, sizeof *b);
    b->wide = m->n_ff > m->n_embd ? m->n_ff : m->n_embd;
    b->q8_stride = b->wide / QK8_0 + 1;
    b->x = calloc_flagged(N * D, sizeof(float), &bad);
    b->xb = calloc_flagged(N * D, sizeof(float), &bad);
    b->q = calloc_flagged(N * D, sizeof(float), &bad);
    b->k = calloc_flagged(N * KV, sizeof(float), &bad);
    b->v = calloc_flagged(N * KV, sizeof(float), &bad);
    b->att = calloc_flagged(N * D, sizeof(float), &bad);
    b->gate = calloc_flagged(N * F, sizeof(float), &bad);
    b->up = calloc_flagged(N * F, sizeof(float), &bad);
    b->hb = calloc_flagged(N * F, sizeof(float), &bad);
    b->rope_cs = calloc_flagged(N * (size_t)m->head_dim, sizeof(float), &bad);
    b->q16 = calloc_flagged(N * D, sizeof(uint16_t), &bad);
    b->f16 = calloc_flagged(N * (size_t)b->wide, sizeof(uint16_t), &bad);
    b->q8 = calloc_flagged(N * (size_t)b->q8_stride, sizeof(block_q8_0), &bad);
    if (bad) {
        batch_free(b);
        return -1;
    }
    for (int t = 0; t < n; t++) rope_angles(b->rope_cs + (size_t)t * m->head_dim, m->head_dim, t, m->rope_base);
    return 0;
}

/* out[t][r] = W[r] . in[t] for the n tokens; rows shared out */
typedef struct {
    engine *e;
    batch *b;
    const weight *w;
    const float *in;
    float *out;
    int n, in_stride, out_stride;
} batch_matmul_job;

static bool batch_takes_tinyblas(const weight *w, int n) {
    return w->type == GGML_TYPE_F32 && tinyblas_takes(w->rows, n, w->cols);
}

static void batch_matmul_worker(void *ctx, int ith, int nth) {
    const batch_matmul_job *j = ctx;
    const weight *w = j->w;
    long r0, r1;
    pool_split(w->rows, ith, nth, &r0, &r1);
    const bool tinyblas = batch_takes_tinyblas(w, j->n);
    for (int t = 0; t < j->n; t++) {
        const float *x = j->in + (size_t)t * j->in_stride;
        float *out = j->out + (size_t)t * j->out_stride;
        if (tinyblas) {
            for (long r = r0; r < r1; r++)
                out[r] = j->e->tb->dot_f32((const float *)((const char *)w->data + (size_t)r * w->row_bytes), x,
                                           (int)w->cols);
        } else {
            act_vec in = {x, j->b->f16 + (size_t)t * j->b->wide, j->b->q8 + (size_t)t * j->b->q8_stride};
            llama_matvec_rows(j->e->k, w, &in, out, r0, r1);
        }
    }
}

/* Convert the n tokens' inputs (in_stride apart) once for all the weights ws
 * that read them (the F16 and / or Q8_0 forms their types need; a weight that
 * tinyBLAS takes reads the F32 input). nw <= 3. */
static void batch_convert(engine *e, batch *b, const float *in, int in_stride, int n, const weight *const *ws,
                          int nw) {
    const weight *need[3];
    int n_need = 0;
    for (int i = 0; i < nw; i++)
        if (!batch_takes_tinyblas(ws[i], n)) need[n_need++] = ws[i];
    if (!n_need) return;
    for (int t = 0; t < n; t++) {
        act_vec a = {NULL, b->f16 + (size_t)t * b->wide, b->q8 + (size_t)t * b->q8_stride};
        act_convert_for(e->k, &a, in + (size_t)t * in_stride, (int)need[0]->cols, need, n_need);
    }
}

/* llama.cpp's matrix product of a batch whose input batch_convert has
 * converted for w: tinyBLAS where its sgemm takes it (F32 weights; its F16
 * and quantized products are not copied), else ggml's dots */
static void batch_matmul(engine *e, batch *b, const weight *w, const float *in, int in_stride, int n, float *out,
                         int out_stride) {
    batch_matmul_job j = {e, b, w, in, out, n, in_stride, out_stride};
    pool_run(e->pool, batch_matmul_worker, &j);
}

/* batch_convert for w alone, then batch_matmul */
static void batch_matmul_one(engine *e, batch *b, const weight *w, const float *in, int in_stride, int n,
                             float *out, int out_stride) {
    batch_convert(e, b, in, in_stride, n, &w, 1);
    batch_matmul(e, b, w, in, in_stride, n, out, out_stride);
}

typedef struct {
    engine *e;
    const batch *b;
    int layer, n;
} batch_attention_job;

/* Every token's attention for a share of the heads: a head costs the same
 * over the batch whatever thread takes it, and e->scores / e->probs16 are
 * indexed by head, so threads with disjoint heads share them. */
static void batch_attention_worker(void *ctx, int ith, int nth) {
    const batch_attention_job *j = ctx;
    engine *e = j->e;
    const size_t D = (size_t)e->m->n_embd;
    kv_layer kv = engine_layer_cache(e, j->layer);
    long h0, h1;
    pool_split(e->m->n_head, ith, nth, &h0, &h1);
    for (int t = 0; t < j->n; t++)
        attention_heads_batch(e->k, e->tb, j->n, e->m, &kv, j->b->q16 + (size_t)t * D, t, e->scores, e->probs16,
                              j->b->att + (size_t)t * D, h0, h1);
}

static void add_rows(float *x, const float *y, size_t count) {
    for (size_t i = 0; i < count; i++) x[i] += y[i];
}

/* One layer's attention for the n tokens of the batch; x += its output. */
static void batch_attention(engine *e, batch *b, int l, int n) {
    const model *m = e->m;
    const layer_weights *w = &m->layers[l];
    const int D = m->n_embd, KV = e->kv_dim;
    for (int t = 0; t < n; t++) rmsnorm(b->xb + (size_t)t * D, b->x + (size_t)t * D, w->attn_norm, D, m->rms_eps);
    const weight *qkv[3] = {&w->wq, &w->wk, &w->wv};
    batch_convert(e, b, b->xb, D, n, qkv, 3);
    batch_matmul(e, b, &w->wq, b->xb, D, n, b->q, D);
    batch_matmul(e, b, &w->wk, b->xb, D, n, b->k, KV);
    batch_matmul(e, b, &w->wv, b->xb, D, n, b->v, KV);
    kv_layer kv = engine_layer_cache(e, l);
    for (int t = 0; t < n; t++) {
        const float *cs = b->rope_cs + (size_t)t * m->head_dim;
        rope_apply(b->q + (size_t)t * D, m->n_head, m->head_dim, cs);
        rope_apply(b->k + (size_t)t * KV, m->n_head_kv, m->head_dim, cs);
        kv_store(e->k, &kv, t, b->k + (size_t)t * KV, b->v + (size_t)t * KV);
        e->k->f32_to_f16_row(b->q + (size_t)t * D, b->q16 + (size_t)t * D, D);
    }
    batch_attention_job j = {e, b, l, n};
    pool_run(e->pool, batch_attention_worker, &j);
    batch_matmul_one(e, b, &w->wo, b->att, D, n, b->xb, D);
    add_rows(b->x, b->xb, (size_t)n * D);
}

static void batch_ffn(engine *e, batch *b, int l, int n) {
    const model *m = e->m;
    const layer_weights *w = &m->layers[l];
    const int D = m->n_embd, F = m->n_ff;
    for (int t = 0; t < n; t++) rmsnorm(b->xb + (size_t)t * D, b->x + (size_t)t * D, w->ffn_norm, D, m->rms_eps);
    const weight *gate_up[2] = {&w->gate, &w->up};
    batch_convert(e, b, b->xb, D, n, gate_up, 2);
    batch_matmul(e, b, &w->gate, b->xb, D, n, b->gate, F);
    batch_matmul(e, b, &w->up, b->xb, D, n, b->up, F);
    for (int t = 0; t < n; t++) {
        const size_t o = (size_t)t * F;
        llama_silu_mul(e->k, b->hb + o, b->gate + o, b->up + o, 0, F, F);
    }
    batch_matmul_one(e, b, &w->down, b->hb, F, n, b->xb, D);
    add_rows(b->x, b->xb, (size_t)n * D);
}

/* llama.cpp's prompt batch: every layer for all tokens, except that after the
 * last layer's attention only the last token goes on (its "skip computing
 * output for unused tokens"), as a single token. */
static float *prefill_batch(engine *e, const int *tokens, int n) {
    const model *m = e->m;
    const int D = m->n_embd, last = m->n_layer - 1;
    batch b;
    if (batch_alloc(&b, e, n)) return NULL;
    for (int t = 0; t < n; t++)
        dequantize_row(m->tok_embd.type, (const char *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes,
                       b.x + (size_t)t * D, D);
    memset(&e->stats, 0, sizeof e->stats);
    for (int l = 0; l < last; l++) {
        batch_attention(e, &b, l, n);
        batch_ffn(e, &b, l, n);
    }
    batch_attention(e, &b, last, n);
    memcpy(e->x, b.x + (size_t)(n - 1) * D, sizeof(float) * (size_t)D);
    batch_free(&b);
    engine_ffn_block(e, last, n - 1);
    rmsnorm(e->xb, e->x, m->output_norm, D, m->rms_eps);
    engine_matvec(e, e->xb, D, 1, &m->output, e->logits, NULL, NULL, NULL, NULL);
    return e->logits;
}

/* ---- the prompt pass (prompt.h), the stack's npu-worker's arithmetic ---- */

void engine_set_token_prompt(engine *e, bool on) { e->token_prompt = on; }

_Static_assert(sizeof(int) == sizeof(int32_t), "prompt tokens are passed on as int32_t");

static kv_layer engine_kv(void *ctx, int layer) { return engine_layer_cache(ctx, layer); }

static float *prefill_blocks(engine *e, const int *tokens, int n) {
    if (!e->prompt) {
        char err[160];
        const int block = e->n_ctx < ENGINE_PROMPT_BLOCK ? e->n_ctx : ENGINE_PROMPT_BLOCK;
        if (!(e->prompt = prompt_pass_new(e->m, e->k, e->pool, block, e->n_ctx, err, sizeof err))) return NULL;
    }
    for (int first = 0; first < n; first += ENGINE_PROMPT_BLOCK) {
        const int count = n - first < ENGINE_PROMPT_BLOCK ? n - first : ENGINE_PROMPT_BLOCK;
        prompt_pass_run(e->prompt, (const int32_t *)tokens + first, count, first, engine_kv, e, NULL, NULL, NULL);
        if (first + count == n) prompt_pass_logits(e->prompt, count, e->logits);
    }
    return e->logits;
}

float *engine_prefill(engine *e, const int *tokens, int n) {
    if (n <= 0 || n > e->n_ctx) return NULL;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= e->m->n_vocab) return NULL;
    if (e->llama && n >= 2 && !e->observer) return prefill_batch(e, tokens, n); /* an observer sees every layer */
    if (!e->llama && !e->token_prompt && !e->observer && !e->fire_counts && prompt_pass_takes(e->m))
        return prefill_blocks(e, tokens, n);
    float *logits = NULL;
    for (int t = 0; t < n; t++) logits = engine_forward(e, tokens[t], t);
    return logits;
}

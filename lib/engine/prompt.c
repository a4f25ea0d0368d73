/* The dense prompt pass (prompt.h). */
#include "engine/prompt.h"
#include "util/calloc_flagged.h"
#include "util/pages.h"
#include "kernels/sparse_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATTN_TOKENS 8 /* prompt tokens whose attention to one head runs at once */

struct prompt_pass {
    const model *m;
    const kernels *k;
    const sparse_kernels *sk; /* down_t's axpy */
    threadpool *pool;
    int max_tok, n_ctx, kv_dim, wide, n_threads;
    /* per token t, row t of each [max_tok][width] buffer */
    float *x;        /* residual, [n_embd] */
    float *xb;       /* normalized residual, [n_embd] */
    float *q;        /* [n_embd] */
    float *kk, *vv;  /* [kv_dim] */
    uint16_t *q16;   /* [n_embd] */
    float *rope_cs;  /* [head_dim]: rope_angles at the token's position, the same in every layer */
    float *att;      /* attention output, [n_embd] */
    float *gate, *up; /* [n_ff]; the activation is written over gate */
    float *proj;     /* Wo / down result before the residual add, [n_embd] */
    act_vec *in;     /* [max_tok] conversions, each up to `wide` elements */
    uint16_t *in_f16;
    block_q8_0 *in_q8;
    gemm_acts acts;  /* the current input packed for the prefill product */
    const float **x32;      /* [max_tok]: each token's input as F32 weights take it */
    const uint16_t **x16;   /* [max_tok]: and as F16 weights take it */
    void **scratch;  /* [n_threads] gemm_scratch_bytes(wide / 32) each */
    int32_t *fired;  /* [n_threads][n_ff]: a token's firing neurons in a down_t chunk */
    float *fired_h;  /* [n_threads][n_ff]: their activations */
    float *scores;   /* [n_threads][n_head][n_ctx] */
    uint16_t *probs16;
    float *widened;  /* [n_threads][ATTN_TOKENS][head_dim]: a run's queries, widened for K . q */
    float *logits_in; /* [n_embd]: the last token normalized for the output matrix */
};

static float *row_of(float *buf, int t, int width) { return buf + (size_t)t * (size_t)width; }

bool prompt_pass_takes(const model *m) {
    for (int l = 0; l < m->n_layer; l++) {
        const layer_weights *w = &m->layers[l];
        if (!w->down.data && !(w->down_t.data && sparse_kernels_for_type(kernels_scalar()->sparse, w->down_t.type)))
            return false;
    }
    return true;
}

static bool packed_product(const kernels *k, const weight *w) {
    return w->type == GGML_TYPE_Q4_0 && k->gemm_q4_0;
}

static bool float_product(const kernels *k, const weight *w) {
    return (w->type == GGML_TYPE_F32 && k->gemm_f32) || (w->type == GGML_TYPE_F16 && k->gemm_f16);
}

/* ---- weights x tokens ---- */

/* Rows per tile of the per-(row, token) path: a quarter of a 1 MiB L2, so a
 * tile is fetched from memory once and dotted with every token in cache. */
#define ROW_TILE_BYTES (256u << 10)

/* out[t * stride + r] = W[r] . in[t] for rows [r0, r1) and every token */
static void product_rows(prompt_pass *p, const weight *w, int n_tok, float *out, size_t stride, long r0, long r1,
                         void *scratch) {
    if (packed_product(p->k, w)) {
        const block_q4_0 *rows = (const block_q4_0 *)((const char *)w->data + (size_t)r0 * w->row_bytes);
        p->k->gemm_q4_0(rows, w->row_bytes, (int)(r1 - r0), &p->acts, out + r0, stride, scratch);
        return;
    }
    if (float_product(p->k, w)) {
        const char *rows = (const char *)w->data + (size_t)r0 * w->row_bytes;
        if (w->type == GGML_TYPE_F32)
            p->k->gemm_f32((const float *)rows, w->row_bytes, (int)(r1 - r0), p->x32, n_tok, (int)w->cols, out + r0,
                           stride, scratch);
        else
            p->k->gemm_f16((const uint16_t *)rows, w->row_bytes, (int)(r1 - r0), p->x16, n_tok, (int)w->cols,
                           out + r0, stride, scratch);
        return;
    }
    long tile = (long)(ROW_TILE_BYTES / (w->row_bytes ? w->row_bytes : 1));
    if (tile < 1) tile = 1;
    for (long t0 = r0; t0 < r1; t0 += tile) {
        const long t1 = t0 + tile < r1 ? t0 + tile : r1;
        for (int t = 0; t < n_tok; t++) matvec_rows(p->k, w, &p->in[t], out + (size_t)t * stride, t0, t1);
    }
}

/* Rows of up to three weights over all tokens, shared out as one range of rows
 * (in whole tiles of GEMM_TILE, so no thread re-lays a tile another has). */
typedef struct {
    prompt_pass *p;
    int n_tok, n;
    const weight *w[3];
    float *out[3];
    int width[3]; /* out row stride per token */
} product_job;

static void product_worker(void *ctx, int ith, int nth) {
    product_job *j = ctx;
    long tiles = 0;
    for (int i = 0; i < j->n; i++) tiles += (j->w[i]->rows + GEMM_TILE - 1) / GEMM_TILE;
    long begin, end, base = 0;
    pool_split(tiles, ith, nth, &begin, &end);
    for (int i = 0; i < j->n; i++) {
        const long rows = j->w[i]->rows, n_tiles = (rows + GEMM_TILE - 1) / GEMM_TILE;
        const long lo = begin > base ? begin - base : 0, hi = end - base < n_tiles ? end - base : n_tiles;
        if (lo < hi) {
            const long r0 = lo * GEMM_TILE, r1 = hi * GEMM_TILE < rows ? hi * GEMM_TILE : rows;
            product_rows(j->p, j->w[i], j->n_tok, j->out[i], (size_t)j->width[i], r0, r1, j->p->scratch[ith]);
        }
        base += n_tiles;
    }
}

static void product(prompt_pass *p, int n_tok, int n, const weight *w0, float *o0, int s0, const weight *w1, float *o1,
                    int s1, const weight *w2, float *o2, int s2) {
    product_job j = {p, n_tok, n, {w0, w1, w2}, {o0, o1, o2}, {s0, s1, s2}};
    for (int t = 0; t < n_tok; t++) {
        p->x32[t] = p->in[t].f32;
        p->x16[t] = p->in[t].f16;
    }
    pool_run(p->pool, product_worker, &j);
}

static void product_one(prompt_pass *p, int n_tok, const weight *w, float *out, int stride) {
    product(p, n_tok, 1, w, out, stride, NULL, NULL, 0, NULL, NULL, 0);
}

/* ---- down_t: the down projection from neuron-major rows (PowerInfer's PWRI files) ---- */

/* down_t bytes one pass over a thread's tokens reads: they stay in a 2 MiB
 * L2 while every token's firing neurons among them are summed. */
#define DOWN_T_CHUNK_BYTES (512u << 10)

/* neurons per down_t chunk: a whole number of GEMM_TILE, so that a piece of
 * neurons starting at a chunk also starts at a re-laid tile of gate and up */
static long down_t_chunk(const weight *dt) {
    const long tiles = (long)(DOWN_T_CHUNK_BYTES / dt->row_bytes) / GEMM_TILE;
    return (tiles > 0 ? tiles : 1) * GEMM_TILE;
}

long prompt_pass_neuron_step(const model *m) {
    if (m->act == FFN_SILU) return m->n_ff; /* pieces are for ReLU files, whose activation is plain arithmetic */
    long step = 0;
    for (int l = 0; l < m->n_layer; l++) {
        const layer_weights *w = &m->layers[l];
        if (w->down.data || !w->down_t.data) return m->n_ff; /* ffn_down's rows are not neurons */
        const long chunk = down_t_chunk(&w->down_t);
        if (step && chunk != step) return m->n_ff;
        step = chunk;
    }
    return step > 0 && step < m->n_ff ? step : m->n_ff;
}

typedef struct {
    prompt_pass *p;
    const weight *dt; /* down_t rows of neurons [n0, n1): row 0 is neuron n0 */
    long n0, n1;
    int n_tok;
} down_t_job;

/* proj[t] += sum over neurons i in [n0, n1) with h[t][i] != 0 of h[t][i] *
 * down_t row i (h: the activations, in p->gate): the sparse axpy of decode,
 * each token's neurons in ascending order, chunk after chunk, the chunks
 * counted from neuron 0 whatever piece holds them. A ReLU token's zero
 * activations cost nothing; the tokens are shared out, so every token's bits
 * are the same for any thread count. The first piece (n0 = 0) starts proj. */
static void down_t_worker(void *ctx, int ith, int nth) {
    const down_t_job *j = ctx;
    prompt_pass *p = j->p;
    const weight *dt = j->dt;
    const int ne = p->m->n_embd, nf = p->m->n_ff;
    const sparse_axpy_fn axpy = sparse_kernels_for_type(p->sk, dt->type)->axpy;
    int32_t *idx = p->fired + (size_t)ith * (size_t)nf;
    float *h = p->fired_h + (size_t)ith * (size_t)nf;
    long t0, t1;
    pool_split(j->n_tok, ith, nth, &t0, &t1);
    if (j->n0 == 0)
        for (long t = t0; t < t1; t++) memset(row_of(p->proj, (int)t, ne), 0, sizeof(float) * (size_t)ne);
    const long chunk = down_t_chunk(dt);
    for (long c0 = j->n0; c0 < j->n1; c0 += chunk) {
        const long c1 = c0 + chunk < j->n1 ? c0 + chunk : j->n1;
        const char *rows = (const char *)dt->data + (size_t)(c0 - j->n0) * dt->row_bytes;
        for (long t = t0; t < t1; t++) {
            const float *act = row_of(p->gate, (int)t, nf);
            int n = 0;
            for (long i = c0; i < c1; i++)
                if (act[i] != 0.0f) idx[n] = (int32_t)(i - c0), h[n++] = act[i];
            axpy(rows, dt->row_bytes, idx, h, n, row_of(p->proj, (int)t, ne), ne, NULL);
        }
    }
}

/* ---- per-token steps ---- */

typedef enum {
    TOK_ATTN_IN,    /* rmsnorm + convert for Q/K/V */
    TOK_ROPE_STORE, /* RoPE, keys stored, Q to F16 */
    TOK_WO_IN,      /* convert attention output for Wo */
    TOK_ATTN_ADD,   /* x += Wo . att */
    TOK_FFN_IN,     /* rmsnorm + convert for gate/up */
    TOK_FFN_ACT,    /* gate = act(gate) * up, for neurons [n0, n1) */
    TOK_DOWN_IN,    /* convert the activations for down */
    TOK_FFN_ADD,    /* x += down . activations */
} token_step;

typedef struct {
    prompt_pass *p;
    token_step step;
    int layer, n_tok, first;
    kv_layer kv;
    long n0, n1; /* TOK_FFN_ACT's neurons */
} token_job;

/* convert x for the weights ws; a token packed for the prefill product too when one of them takes it */
static void convert(prompt_pass *p, int t, const float *x, int n, const weight *const *ws, int nw) {
    act_convert_for(p->k, &p->in[t], x, n, ws, nw);
    for (int i = 0; i < nw; i++)
        if (packed_product(p->k, ws[i])) {
            gemm_acts_put(&p->acts, t, p->in[t].q8);
            return;
        }
}

static void token_one(const token_job *j, int t) {
    prompt_pass *p = j->p;
    const model *m = p->m;
    const layer_weights *w = &m->layers[j->layer];
    const int ne = m->n_embd;
    float *x = row_of(p->x, t, ne), *xb = row_of(p->xb, t, ne);
    switch (j->step) {
    case TOK_ATTN_IN: {
        rmsnorm(xb, x, w->attn_norm, ne, m->rms_eps);
        const weight *ws[3] = {&w->wq, &w->wk, &w->wv};
        convert(p, t, xb, ne, ws, 3);
        break;
    }
    case TOK_ROPE_STORE: {
        float *q = row_of(p->q, t, ne), *kk = row_of(p->kk, t, p->kv_dim);
        const float *cs = row_of(p->rope_cs, t, m->head_dim);
        rope_apply(q, m->n_head, m->head_dim, cs);
        rope_apply(kk, m->n_head_kv, m->head_dim, cs);
        kv_store_keys(p->k, &j->kv, j->first + t, kk);
        p->k->f32_to_f16_row(q, p->q16 + (size_t)t * ne, ne);
        break;
    }
    case TOK_WO_IN: {
        const weight *ws[1] = {&w->wo};
        convert(p, t, row_of(p->att, t, ne), ne, ws, 1);
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
        convert(p, t, xb, ne, ws, 2);
        break;
    }
    case TOK_FFN_ACT: { /* element by element, so in place */
        float *g = row_of(p->gate, t, m->n_ff) + j->n0;
        const float *u = row_of(p->up, t, m->n_ff) + j->n0;
        const int count = (int)(j->n1 - j->n0);
        if (m->act == FFN_SILU) p->k->silu_mul(g, g, u, count);
        else
            for (int i = 0; i < count; i++) g[i] = ffn_act_relu(m->act, g[i], u[i]);
        break;
    }
    case TOK_DOWN_IN: {
        const weight *ws[1] = {&w->down};
        convert(p, t, row_of(p->gate, t, m->n_ff), m->n_ff, ws, 1);
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

/* step for every token; an input step first shapes the packed activations (n columns) */
static void per_token(prompt_pass *p, token_step step, const token_job *base, int n_cols) {
    token_job j = *base;
    j.step = step;
    if (n_cols) gemm_acts_begin(&p->acts, j.n_tok, n_cols);
    pool_run(p->pool, token_worker, &j);
}

/* Every token's values into the transposed V cache, elements shared out */
static void values_worker(void *ctx, int ith, int nth) {
    const token_job *j = ctx;
    long d0, d1;
    pool_split(j->p->kv_dim, ith, nth, &d0, &d1);
    kv_store_values(&j->kv, j->first, j->n_tok, j->p->vv, (size_t)j->p->kv_dim, (int)d0, (int)d1);
}

/* Causal attention: token t attends to positions 0 .. first + t, all stored
 * before this runs. Work goes out as (head, run of ATTN_TOKENS tokens): a
 * run reads each key and value row once for all its tokens
 * (attention_head_tokens). Runs are dealt round-robin because later tokens
 * cost more. */
static void attention_worker(void *ctx, int ith, int nth) {
    token_job *j = ctx;
    prompt_pass *p = j->p;
    const model *m = p->m;
    const size_t per_thread = (size_t)m->n_head * (size_t)p->n_ctx;
    float *scores = p->scores + (size_t)ith * per_thread;
    uint16_t *probs16 = p->probs16 + (size_t)ith * per_thread;
    float *widened = p->widened + (size_t)ith * ATTN_TOKENS * (size_t)m->head_dim;
    const int run = m->n_head < ATTN_TOKENS ? m->n_head : ATTN_TOKENS; /* the scratch holds n_head rows */
    const long runs = (j->n_tok + run - 1) / run, units = runs * m->n_head;
    for (long i = ith; i < units; i += nth) {
        const int t = (int)(i / m->n_head) * run, n = j->n_tok - t < run ? j->n_tok - t : run;
        attention_head_tokens(p->k, m, &j->kv, i % m->n_head, p->q16 + (size_t)t * m->n_embd, j->first + t, n,
                              scores, probs16, widened, row_of(p->att, t, m->n_embd));
    }
}

/* ---- the pass ---- */

/* Neurons [n0, *n1) of layer l's FFN as rows from neuron n0: from the
 * caller's source, else the model's whole layer. Nonzero: abandon the run. */
static int ffn_piece(const model *m, int l, long n0, const prompt_ffn_source *src, layer_weights *piece, long *n1) {
    if (src) return src->piece(src->ctx, l, n0, piece, n1);
    *piece = m->layers[l];
    *n1 = m->n_ff;
    return 0;
}

/* The FFN: gate and up, the activation, then down, a piece of neurons at a
 * time; the pieces do not change the bits (prompt_pass_neuron_step). */
static int ffn_pass(prompt_pass *p, const token_job *j, const prompt_ffn_source *src) {
    const model *m = p->m;
    const int l = j->layer, n = j->n_tok, ne = m->n_embd, nf = m->n_ff;
    per_token(p, TOK_FFN_IN, j, ne);
    long n1 = 0;
    for (long n0 = 0; n0 < nf; n0 = n1) {
        layer_weights w;
        if (ffn_piece(m, l, n0, src, &w, &n1)) return -1;
        product(p, n, 2, &w.gate, p->gate + n0, nf, &w.up, p->up + n0, nf, NULL, NULL, 0);
        token_job act = *j;
        act.n0 = n0, act.n1 = n1;
        per_token(p, TOK_FFN_ACT, &act, 0);
        if (w.down.data) { /* a whole layer (prompt_pass_neuron_step) */
            per_token(p, TOK_DOWN_IN, j, nf);
            product_one(p, n, &w.down, p->proj, ne);
        } else {
            down_t_job dj = {p, &w.down_t, n0, n1, n};
            pool_run(p->pool, down_t_worker, &dj);
        }
    }
    per_token(p, TOK_FFN_ADD, j, 0);
    return 0;
}

static int layer_pass(prompt_pass *p, int l, int n, int first, kv_layer kv, const prompt_ffn_source *src) {
    const model *m = p->m;
    const layer_weights *w = &m->layers[l];
    const int ne = m->n_embd, kvd = p->kv_dim;
    const token_job j = {p, TOK_ATTN_IN, l, n, first, kv, 0, 0};
    per_token(p, TOK_ATTN_IN, &j, ne);
    product(p, n, 3, &w->wq, p->q, ne, &w->wk, p->kk, kvd, &w->wv, p->vv, kvd);
    per_token(p, TOK_ROPE_STORE, &j, 0);
    pool_run(p->pool, values_worker, (void *)&j);
    pool_run(p->pool, attention_worker, (void *)&j);
    per_token(p, TOK_WO_IN, &j, ne);
    product_one(p, n, &w->wo, p->proj, ne);
    per_token(p, TOK_ATTN_ADD, &j, 0);
    return ffn_pass(p, &j, src);
}

int prompt_pass_run(prompt_pass *p, const int32_t *tokens, int n, int first, prompt_kv_fn kv, void *kv_ctx,
                    prompt_step_fn step, void *step_ctx, const prompt_ffn_source *ffn) {
    const model *m = p->m;
    for (int t = 0; t < n; t++) {
        dequantize_row(m->tok_embd.type, (const char *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes,
                       row_of(p->x, t, m->n_embd), m->n_embd);
        rope_angles(row_of(p->rope_cs, t, m->head_dim), m->head_dim, first + t, m->rope_base);
    }
    for (int l = 0; l < m->n_layer; l++) {
        if (step && step(step_ctx, l)) return -1;
        if (layer_pass(p, l, n, first, kv(kv_ctx, l), ffn)) return -1;
    }
    return step && step(step_ctx, m->n_layer) ? -1 : 0;
}

const float *prompt_pass_last_residual(const prompt_pass *p, int n) { return p->x + (size_t)(n - 1) * p->m->n_embd; }

void prompt_pass_logits(prompt_pass *p, int n, float *out) {
    const model *m = p->m;
    rmsnorm(p->logits_in, prompt_pass_last_residual(p, n), m->output_norm, m->n_embd, m->rms_eps);
    const weight *ws[1] = {&m->output};
    gemm_acts_begin(&p->acts, 1, m->n_embd);
    convert(p, 0, p->logits_in, m->n_embd, ws, 1);
    product_one(p, 1, &m->output, out, m->n_vocab);
}

/* ---- set-up ---- */

/* The sizes every buffer is made from. */
typedef struct {
    size_t T, ne, kvd, wide, nf, hd, q8_blocks, att, nth, scratch;
} pass_dims;

static pass_dims dims_of(const model *m, int max_tok, int n_ctx, int n_threads) {
    pass_dims d;
    d.T = (size_t)max_tok, d.ne = (size_t)m->n_embd, d.kvd = (size_t)(m->n_head_kv * m->head_dim);
    d.nf = (size_t)m->n_ff, d.hd = (size_t)m->head_dim, d.wide = d.nf > d.ne ? d.nf : d.ne;
    d.q8_blocks = d.wide / QK8_0 + 1, d.att = (size_t)m->n_head * (size_t)n_ctx, d.nth = (size_t)n_threads;
    const size_t q4 = gemm_scratch_bytes((int)(d.wide / QK8_0)), fl = gemm_float_scratch_bytes((int)d.wide);
    d.scratch = ((q4 > fl ? q4 : fl) + 63) / 64 * 64; /* per thread */
    return d;
}

/* Every buffer of a pass and its element count, in one list: prompt_pass_new
 * allocates them, prompt_pass_free frees them, prompt_pass_bytes adds them up. */
#define PASS_BUFFERS(X)                                                                                                \
    X(x, d.T * d.ne) X(xb, d.T * d.ne) X(q, d.T * d.ne) X(kk, d.T * d.kvd) X(vv, d.T * d.kvd) X(q16, d.T * d.ne)     \
    X(rope_cs, d.T * d.hd) X(att, d.T * d.ne) X(gate, d.T * d.nf) X(up, d.T * d.nf)                \
    X(proj, d.T * d.ne) X(in, d.T) X(in_f16, d.T * d.wide) X(in_q8, d.T * d.q8_blocks) X(scores, d.nth * d.att)     \
    X(probs16, d.nth * d.att) X(logits_in, d.ne) X(scratch, d.nth) X(fired, d.nth * d.nf)                         \
    X(fired_h, d.nth * d.nf) X(x32, d.T) X(x16, d.T) X(widened, d.nth * ATTN_TOKENS * d.hd)

size_t prompt_pass_bytes(const model *m, int max_tok, int n_ctx, int n_threads) {
    const pass_dims d = dims_of(m, max_tok, n_ctx, n_threads);
    size_t total = sizeof(prompt_pass) + d.nth * d.scratch + gemm_acts_bytes(max_tok, (int)(d.wide / QK8_0 * QK8_0));
#define ADD(field, count) total += (count) * sizeof *((prompt_pass *)0)->field;
    PASS_BUFFERS(ADD)
#undef ADD
    return total;
}

prompt_pass *prompt_pass_new(const model *m, const kernels *k, threadpool *pool, int max_tok, int n_ctx, char *err,
                             size_t errlen) {
    prompt_pass *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    p->m = m;
    p->k = k;
    p->sk = k->sparse;
    p->pool = pool;
    p->max_tok = max_tok;
    p->n_ctx = n_ctx;
    p->kv_dim = m->n_head_kv * m->head_dim;
    p->wide = m->n_ff > m->n_embd ? m->n_ff : m->n_embd;
    p->n_threads = pool_size(pool);
    const pass_dims d = dims_of(m, max_tok, n_ctx, p->n_threads);
    int bad = 0;
#define ALLOC(field, count) p->field = calloc_flagged(count, sizeof *p->field, &bad);
    PASS_BUFFERS(ALLOC)
#undef ALLOC
    for (size_t i = 0; !bad && i < d.nth; i++)
        if (!(p->scratch[i] = aligned_alloc(64, d.scratch))) bad = 1;
    if (!bad && gemm_acts_init(&p->acts, max_tok, p->wide / QK8_0 * QK8_0)) bad = 1;
    if (bad) {
        snprintf(err, errlen, "out of memory allocating prompt buffers for %d tokens", max_tok);
        prompt_pass_free(p);
        return NULL;
    }
    for (size_t t = 0; t < d.T; t++) p->in[t] = (act_vec){NULL, p->in_f16 + t * d.wide, p->in_q8 + t * d.q8_blocks};
    return p;
}

void prompt_pass_release(prompt_pass *p) {
    const pass_dims d = dims_of(p->m, p->max_tok, p->n_ctx, p->n_threads);
    for (size_t i = 0; i < d.nth; i++) pages_release(p->scratch[i], d.scratch);
    gemm_acts_release(&p->acts);
    /* `in` only points into in_f16 and in_q8: kept, it is one entry a token */
#define RELEASE(field, count) if ((void *)p->field != (void *)p->in) pages_release(p->field, (count) * sizeof *p->field);
    PASS_BUFFERS(RELEASE)
#undef RELEASE
}

void prompt_pass_free(prompt_pass *p) {
    if (!p) return;
    if (p->scratch)
        for (int i = 0; i < p->n_threads; i++) free(p->scratch[i]);
    gemm_acts_free(&p->acts);
#define FREE(field, count) free(p->field);
    PASS_BUFFERS(FREE)
#undef FREE
    free(p);
}

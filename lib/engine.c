/* Reference forward pass of the llama architecture, one token at a time,
 * split over a thread pool. The arithmetic lives in ops.c (shared with the
 * stack's workers); this file owns the buffers and the order of the steps. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"
#include "sparse_kernels.h"
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
    ffn_mode ffn_mode;
    /* gate-first state, allocated by engine_set_ffn_mode */
    const sparse_kernels *sparse;     /* the down_t axpy (bit-exact on every ISA) */
    int32_t *active;                  /* [n_ff] firing neurons, each thread's in its own neuron range */
    float *coef;                      /* [n_ff] their activations */
    const sparse_kernels *sparse_up;  /* a gather dot with k's bits, or NULL: row_dot per neuron */
    weight *down_t;                   /* [n_layer]: the file's ffn_down_t or a built copy */
    void **down_t_built;              /* [n_layer]: the built copies, to free */
    float *gate;                      /* [n_ff] gate values of the current layer */
    long *fired;                      /* [n_threads] firing neurons of each thread's slice */
    uint64_t stat_active, stat_bytes; /* engine_ffn_stats */
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
    e->active = xcalloc((size_t)m->n_ff, sizeof(int32_t), &bad);
    e->coef = xcalloc((size_t)m->n_ff, sizeof(float), &bad);
    e->sparse = sparse_kernels_best();
    e->in.f16 = xcalloc((size_t)wide, sizeof(uint16_t), &bad);
    e->in.q8 = xcalloc((size_t)wide / QK8_0 + 1, sizeof(block_q8_0), &bad);
    if (bad) {
        snprintf(err, errlen, "out of memory allocating the engine (KV cache %zu MiB)", cache * 4 >> 20);
        engine_free(e);
        return NULL;
    }
    return e;
}

static void gate_first_free(engine *e) {
    if (e->down_t_built)
        for (int l = 0; l < e->m->n_layer; l++) free(e->down_t_built[l]);
    free(e->down_t_built); free(e->down_t); free(e->gate); free(e->fired);
    e->down_t_built = NULL, e->down_t = NULL, e->gate = NULL, e->fired = NULL;
}

void engine_free(engine *e) {
    if (!e) return;
    pool_free(e->pool);
    free(e->k_cache); free(e->v_cache);
    free(e->x); free(e->xb); free(e->q); free(e->kv_k); free(e->kv_v); free(e->att_out);
    free(e->hb); free(e->logits); free(e->scores); free(e->probs16); free(e->q16);
    free(e->down_partial); free(e->gate_pre); free(e->in.f16); free(e->in.q8);
    gate_first_free(e);
    free(e->active); free(e->coef);
    free(e);
}

int engine_n_ctx(const engine *e) { return e->n_ctx; }
void engine_count_firing(engine *e, uint32_t *counts) { e->fire_counts = counts; }

void engine_observe_ffn(engine *e, ffn_observer fn, void *ctx) {
    if (fn && !e->gate_pre) e->gate_pre = malloc(sizeof(float) * (size_t)e->m->n_ff);
    e->observer = e->gate_pre ? fn : NULL;
    e->observer_ctx = ctx;
}

/* The gather dot set whose results equal k's dense dots, if any. */
static const sparse_kernels *sparse_matching(const kernels *k) {
    const sparse_kernels *sets[] = {sparse_kernels_avx512(), sparse_kernels_avx2(), sparse_kernels_scalar()};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        if (sets[i] && sparse_kernels_dense_match(sets[i]) == k) return sets[i];
    return NULL;
}

static int gate_first_alloc(engine *e, char *err, size_t errlen) {
    const model *m = e->m;
    int bad = 0;
    e->down_t = xcalloc((size_t)m->n_layer, sizeof *e->down_t, &bad);
    e->down_t_built = xcalloc((size_t)m->n_layer, sizeof *e->down_t_built, &bad);
    e->gate = xcalloc((size_t)m->n_ff, sizeof(float), &bad);
    e->fired = xcalloc((size_t)pool_size(e->pool), sizeof(long), &bad);
    for (int l = 0; l < m->n_layer && !bad; l++) {
        const layer_weights *w = &m->layers[l];
        if (w->down_t.data) {
            e->down_t[l] = w->down_t;
            continue;
        }
        uint32_t type = w->down.type == GGML_TYPE_F32 || w->down.type == GGML_TYPE_F16 ? GGML_TYPE_F32 : GGML_TYPE_Q8_0;
        if (weight_transpose(&w->down, type, &e->down_t[l])) {
            snprintf(err, errlen, "cannot build layer %d's neuron-major down_t (out of memory?)", l);
            gate_first_free(e);
            return -1;
        }
        e->down_t_built[l] = (void *)e->down_t[l].data;
    }
    if (bad) {
        snprintf(err, errlen, "out of memory allocating the gate-first buffers");
        gate_first_free(e);
        return -1;
    }
    return 0;
}

int engine_set_ffn_mode(engine *e, ffn_mode mode, char *err, size_t errlen) {
    if (mode == FFN_GATE_FIRST) {
        if (e->m->act == FFN_SILU) {
            snprintf(err, errlen, "gate-first FFN needs a ReLU model; this one uses silu (every neuron fires)");
            return -1;
        }
        if (!e->gate && gate_first_alloc(e, err, errlen)) return -1;
        e->sparse_up = sparse_matching(e->k);
    }
    e->ffn_mode = mode;
    return 0;
}

void engine_ffn_stats(const engine *e, uint64_t *active_neurons, uint64_t *ffn_bytes_touched) {
    *active_neurons = e->stat_active;
    *ffn_bytes_touched = e->stat_bytes;
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

/* acc = sum of the n neurons' down_t rows times coef, ascending; the dense and
 * gate-first paths both end here, over the same neuron ranges per thread, so on
 * a file with ffn_down_t the two give the same bits. */
static void down_t_axpy(engine *e, const weight *dt, int ith, const int32_t *idx, const float *coef, int n) {
    float *acc = e->down_partial + (size_t)ith * e->m->n_embd;
    memset(acc, 0, sizeof(float) * (size_t)e->m->n_embd);
    sparse_kernels_for_type(e->sparse, dt->type)->axpy(dt->data, dt->row_bytes, idx, coef, n, acc, e->m->n_embd);
}

/* down projection from neuron-major rows (PWRI ffn_down_t): per-thread partial sums */
static void ffn_down_t_worker(void *ctx, int ith, int nth) {
    layer_job *j = ctx;
    engine *e = j->e;
    long i0, i1;
    pool_split(e->m->n_ff, ith, nth, &i0, &i1);
    int n = 0;
    for (long i = i0; i < i1; i++) {
        if (e->hb[i] == 0.0f) continue;
        e->active[i0 + n] = (int32_t)i;
        e->coef[i0 + n++] = e->hb[i];
    }
    down_t_axpy(e, &e->m->layers[j->layer].down_t, ith, e->active + i0, e->coef + i0, n);
}

static void reduce_down_partials(engine *e, float *out) {
    int n = e->m->n_embd, nth = pool_size(e->pool);
    for (int i = 0; i < n; i++) {
        float s = 0;
        for (int t = 0; t < nth; t++) s += e->down_partial[(size_t)t * n + i]; /* fixed order */
        out[i] = s;
    }
}

/* Gate-first: each thread takes the neurons with gate > 0 of the neuron range
 * the dense down_t path gives it (so both sum the same terms in the same order;
 * the hot neurons are spread over the layer, so the ranges hold about as many
 * active ones each), computes up and the activation, keeps the firing ones (in
 * place, in order) and adds their down_t rows into its own partial. */
typedef struct {
    engine *e;
    int layer;
    long n_active;
} gate_first_job;

/* The first k with a[k] >= v in the ascending a[0..n). */
static long lower_bound(const int32_t *a, long n, long v) {
    long lo = 0, hi = n;
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (a[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static const void *act_for_type(const act_vec *a, uint32_t type) {
    if (type == GGML_TYPE_F32) return a->f32;
    return type == GGML_TYPE_F16 ? (const void *)a->f16 : (const void *)a->q8;
}

static void gate_first_worker(void *ctx, int ith, int nth) {
    gate_first_job *j = ctx;
    engine *e = j->e;
    const model *m = e->m;
    const weight *up = &m->layers[j->layer].up, *dt = &e->down_t[j->layer];
    long i0, i1;
    pool_split(m->n_ff, ith, nth, &i0, &i1);
    long k0 = lower_bound(e->active, j->n_active, i0), k1 = lower_bound(e->active, j->n_active, i1);
    int32_t *idx = e->active + k0;
    float *coef = e->coef + k0;
    int n = (int)(k1 - k0);
    if (e->sparse_up)
        sparse_kernels_for_type(e->sparse_up, up->type)
            ->dot(up->data, up->row_bytes, idx, n, act_for_type(&e->in, up->type), (int)up->cols, coef);
    else
        for (int k = 0; k < n; k++) coef[k] = row_dot(e->k, up, idx[k], &e->in);
    uint32_t *counts = e->fire_counts ? e->fire_counts + (size_t)j->layer * m->n_ff : NULL;
    int fired = 0;
    for (int k = 0; k < n; k++) {
        float g = e->gate[idx[k]], u = coef[k];
        float h = m->act == FFN_RELU2 && !(u > 0) ? 0.0f : g * u; /* as ffn_act_rows, given g > 0 */
        if (h == 0.0f) continue;
        if (counts) counts[idx[k]]++;
        idx[fired] = idx[k];
        coef[fired++] = h;
    }
    down_t_axpy(e, dt, ith, idx, coef, fired);
    e->fired[ith] = fired;
}

static uint64_t weight_bytes(const weight *w) { return (uint64_t)w->rows * w->row_bytes; }

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

/* The FFN's output into e->xb, from the gate rows first. */
static void ffn_gate_first(engine *e, int l) {
    const model *m = e->m;
    const layer_weights *w = &m->layers[l];
    matvec_job gj = {e, 1, {&w->gate}, {e->gate}};
    pool_run(e->pool, matvec_worker, &gj);
    if (e->observer) e->observer(e->observer_ctx, l, e->x, e->xb, e->gate);
    long n_active = 0;
    for (int i = 0; i < m->n_ff; i++)
        if (e->gate[i] > 0) e->active[n_active++] = i;
    gate_first_job j = {e, l, n_active};
    pool_run(e->pool, gate_first_worker, &j);
    reduce_down_partials(e, e->xb);
    long fired = 0;
    for (int t = 0; t < pool_size(e->pool); t++) fired += e->fired[t];
    e->stat_active += (uint64_t)fired;
    e->stat_bytes += weight_bytes(&w->gate) + (uint64_t)n_active * w->up.row_bytes +
                     (uint64_t)fired * e->down_t[l].row_bytes;
}

static void ffn_block(engine *e, int l, int pos) {
    const model *m = e->m;
    const layer_weights *w = &m->layers[l];
    rmsnorm(e->xb, e->x, w->ffn_norm, m->n_embd, m->rms_eps);
    const weight *gu[2] = {&w->gate, &w->up};
    act_convert_for(e->k, &e->in, e->xb, m->n_embd, gu, 2);
    if (e->ffn_mode == FFN_GATE_FIRST) {
        ffn_gate_first(e, l);
        for (int i = 0; i < m->n_embd; i++) e->x[i] += e->xb[i];
        return;
    }
    e->stat_active += (uint64_t)m->n_ff;
    e->stat_bytes += weight_bytes(&w->gate) + weight_bytes(&w->up) +
                     (w->down.data ? weight_bytes(&w->down) : weight_bytes(&w->down_t));
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
    e->stat_active = e->stat_bytes = 0;
    for (int l = 0; l < m->n_layer; l++) {
        attention_block(e, l, pos);
        ffn_block(e, l, pos);
    }
    rmsnorm(e->xb, e->x, m->output_norm, m->n_embd, m->rms_eps);
    matvec(e, e->xb, m->n_embd, 1, &m->output, e->logits, NULL, NULL, NULL, NULL);
    return e->logits;
}

/* The chunked sparse FFN: see ffn_chunks.h for the contract. */
#include "ffn_chunks.h"

#include <stdlib.h>
#include <string.h>

#include "predictor.h"

#define CHUNK_TARGET 16  /* chunks per layer on small models: enough to spread over threads and workers */
#define CHUNK_MAX 512    /* neurons per chunk on large ones: few partials to reduce */

const char *ffn_mode_name(ffn_mode mode) {
    switch (mode) {
    case FFN_GATE_FIRST: return "gate-first";
    case FFN_PREDICTOR: return "predictor";
    default: return "dense";
    }
}

bool ffn_mode_chunked(const model *m, ffn_mode mode) { return mode != FFN_DENSE || !m->layers[0].down.data; }

int ffn_mode_parse(const char *s, ffn_mode *mode) {
    const ffn_mode all[] = {FFN_DENSE, FFN_GATE_FIRST, FFN_PREDICTOR};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(s, ffn_mode_name(all[i]))) {
            *mode = all[i];
            return 0;
        }
    return -1;
}

/* A multiple of 32, so a chunk boundary is a Q8_0/Q4_0 block boundary of ffn_down's rows. */
int ffn_chunk_neurons(const model *m) {
    long n = (m->n_ff + CHUNK_TARGET - 1) / CHUNK_TARGET;
    if (n > CHUNK_MAX) n = CHUNK_MAX;
    return (int)((n + 31) / 32 * 32);
}

int ffn_chunk_count(const model *m) {
    int size = ffn_chunk_neurons(m);
    return (m->n_ff + size - 1) / size;
}

void ffn_chunk_range(const model *m, int chunk, long *n0, long *n1) {
    long size = ffn_chunk_neurons(m);
    *n0 = chunk * size;
    *n1 = *n0 + size < m->n_ff ? *n0 + size : m->n_ff;
}

int ffn_scratch_init(ffn_scratch *s, const model *m) {
    size_t n = (size_t)ffn_chunk_neurons(m);
    s->idx = malloc(n * sizeof(int32_t));
    s->a = malloc(n * sizeof(float));
    s->b = malloc(n * sizeof(float));
    if (s->idx && s->a && s->b) return 0;
    ffn_scratch_free(s);
    return -1;
}

void ffn_scratch_free(ffn_scratch *s) {
    free(s->idx); free(s->a); free(s->b);
    s->idx = NULL, s->a = s->b = NULL;
}

const sparse_kernels *ffn_gather_for(const kernels *k) {
    const sparse_kernels *sets[] = {sparse_kernels_avx512(), sparse_kernels_avx2(), sparse_kernels_scalar()};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        if (sets[i] && sparse_kernels_dense_match(sets[i]) == k) return sets[i];
    return NULL;
}

static const void *act_for_type(const act_vec *a, uint32_t type) {
    if (type == GGML_TYPE_F32) return a->f32;
    return type == GGML_TYPE_F16 ? (const void *)a->f16 : (const void *)a->q8;
}

/* A weight's rows from neuron n0 on, as the base of a gather with chunk-local indices. */
static const char *rows_from(const weight *w, long n0) { return (const char *)w->data + (size_t)n0 * w->row_bytes; }

/* out[k] = w row (n0 + idx[k]) . in, the dense dot's bits. */
static void gather_dot(const ffn_layer *f, const weight *w, long n0, const int32_t *idx, int n, float *out) {
    if (f->gather) {
        sparse_kernels_for_type(f->gather, w->type)
            ->dot(rows_from(w, n0), w->row_bytes, idx, n, act_for_type(f->in, w->type), (int)w->cols, out);
        return;
    }
    for (int k = 0; k < n; k++) out[k] = row_dot(f->k, w, n0 + idx[k], f->in);
}

/* The same for gate and up together (one pass over both rows of each neuron). */
static void gather_dot2(const ffn_layer *f, const layer_weights *w, long n0, const int32_t *idx, int n, float *g,
                        float *u) {
    if (f->gather && w->gate.type == w->up.type && w->gate.row_bytes == w->up.row_bytes) {
        sparse_kernels_for_type(f->gather, w->gate.type)
            ->dot2(rows_from(&w->gate, n0), rows_from(&w->up, n0), w->gate.row_bytes, idx, n,
                   act_for_type(f->in, w->gate.type), (int)w->gate.cols, g, u);
        return;
    }
    gather_dot(f, &w->gate, n0, idx, n, g);
    gather_dot(f, &w->up, n0, idx, n, u);
}

/* h[k] = act(g[k], u[k]) with ffn_act_rows' formulas, then keeps (in place, in
 * order) the neurons with a non-zero activation. Returns how many. */
static int activate_and_keep(const ffn_layer *f, int32_t *idx, float *g, const float *u, int n) {
    const model *m = f->m;
    if (m->act == FFN_SILU) f->k->silu_mul(g, g, u, n);
    int kept = 0;
    for (int k = 0; k < n; k++) {
        float h;
        if (m->act == FFN_SILU) h = g[k];
        else if (m->act == FFN_RELU) h = g[k] > 0 ? g[k] * u[k] : 0.0f;
        else h = g[k] > 0 && u[k] > 0 ? g[k] * u[k] : 0.0f;
        if (h == 0.0f) continue;
        idx[kept] = idx[k];
        g[kept++] = h;
    }
    return kept;
}

/* The chunk's neurons to compute, chunk-local, in idx; gate values in s->a
 * where the mode computed them already (gate-first). Returns how many. */
static int select_neurons(const ffn_layer *f, long n0, long n1, ffn_scratch *s, ffn_chunk_stats *st, int *gate_done) {
    const layer_weights *w = &f->m->layers[f->layer];
    int len = (int)(n1 - n0), n = 0;
    *gate_done = 0;
    if (f->mode == FFN_DENSE) {
        for (int i = 0; i < len; i++) s->idx[i] = i;
        return len;
    }
    if (f->mode == FFN_GATE_FIRST) {
        matvec_rows_packed(f->k, &w->gate, f->in, s->a, n0, n1);
        st->bytes += (uint64_t)len * w->gate.row_bytes;
        for (int i = 0; i < len; i++)
            if (s->a[i] > 0) {
                s->idx[n] = i;
                s->a[n++] = s->a[i];
            }
        *gate_done = 1;
        return n;
    }
    predictor_rows(f->pred, f->layer, f->pred_hidden, n0, n1, s->b);
    st->bytes += predictor_row_bytes(f->pred, f->layer) * (uint64_t)len;
    const float tau = predictor_threshold(f->pred, f->layer);
    for (int i = 0; i < len; i++)
        if (s->b[i] >= tau) s->idx[n++] = i;
    return n;
}

void ffn_chunk_run(const ffn_layer *f, int chunk, float *partial, ffn_scratch *s, ffn_chunk_stats *stats,
                   uint32_t *counts) {
    ffn_chunk_stats local = {0}, *st = stats ? stats : &local;
    const model *m = f->m;
    const layer_weights *w = &m->layers[f->layer];
    long n0, n1;
    ffn_chunk_range(m, chunk, &n0, &n1);
    int gate_done, n = select_neurons(f, n0, n1, s, st, &gate_done);
    if (gate_done) {
        gather_dot(f, &w->up, n0, s->idx, n, s->b);
        st->bytes += (uint64_t)n * w->up.row_bytes;
    } else {
        gather_dot2(f, w, n0, s->idx, n, s->a, s->b);
        st->bytes += (uint64_t)n * (w->gate.row_bytes + w->up.row_bytes);
    }
    st->computed += (uint64_t)n;
    int fired = activate_and_keep(f, s->idx, s->a, s->b, n);
    if (counts)
        for (int k = 0; k < fired; k++) counts[n0 + s->idx[k]]++;
    memset(partial, 0, sizeof(float) * (size_t)m->n_embd);
    const weight *dt = f->down_t_chunks ? &f->down_t_chunks[chunk] : f->down_t;
    const long dt_row = f->down_t_chunks ? 0 : n0 - f->down_t_first;
    sparse_kernels_for_type(f->axpy, dt->type)
        ->axpy(rows_from(dt, dt_row), dt->row_bytes, s->idx, s->a, fired, partial, m->n_embd);
    st->fired += (uint64_t)fired;
    st->bytes += (uint64_t)fired * dt->row_bytes;
}

void ffn_chunks_take(const ffn_layer *f, _Atomic int *next, const int32_t *list, int n, float *partials,
                     ffn_scratch *s, ffn_chunk_stats *st, uint32_t *counts) {
    for (int i; (i = atomic_fetch_add(next, 1)) < n;) {
        int c = list ? list[i] : i;
        ffn_chunk_run(f, c, partials + (size_t)c * f->m->n_embd, s, st, counts);
    }
}

#define REDUCE_BLOCK 256 /* rows summed at once: the chunk loop runs outside, over contiguous rows */

void ffn_reduce_rows(const model *m, const float *partials, const float *residual, float *out, long r0, long r1) {
    const int n_chunks = ffn_chunk_count(m);
    const size_t n = (size_t)m->n_embd;
    float acc[REDUCE_BLOCK];
    for (long b0 = r0; b0 < r1; b0 += REDUCE_BLOCK) {
        const long len = r1 - b0 < REDUCE_BLOCK ? r1 - b0 : REDUCE_BLOCK;
        memset(acc, 0, sizeof acc);
        for (int c = 0; c < n_chunks; c++) { /* chunk order: the result's bits */
            const float *p = partials + (size_t)c * n + (size_t)b0;
            for (long j = 0; j < len; j++) acc[j] += p[j];
        }
        for (long j = 0; j < len; j++) out[b0 + j] = residual[b0 + j] + acc[j]; /* out may be residual */
    }
}

int ffn_down_t_for(const layer_weights *w, long n0, long n1, weight *out, long *first, void **built) {
    *built = NULL;
    if (w->down_t.data) {
        *out = w->down_t;
        *first = 0;
        return 0;
    }
    /* F32 and F16 values transpose exactly in their own type; quantized blocks
     * run along rows, so the columns are requantized (Q8_0 loses least) */
    uint32_t type = w->down.type == GGML_TYPE_F32 || w->down.type == GGML_TYPE_F16 ? w->down.type : GGML_TYPE_Q8_0;
    if (weight_transpose_cols(&w->down, n0, n1, type, out)) return -1;
    *built = (void *)out->data;
    *first = n0;
    return 0;
}

/* The chunked sparse FFN: see ffn_chunks.h for the contract. */
#include "engine/ffn_chunks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/predictor.h"

#define CHUNK_TARGET 16  /* chunks per layer on small models: enough to spread over threads and workers */
#define CHUNK_MAX 512    /* neurons per chunk on large ones: few partials to reduce */

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
    size_t n = (size_t)m->n_ff, c = (size_t)ffn_chunk_count(m) + 1;
    s->idx = malloc(n * sizeof(int32_t));
    s->a = malloc(n * sizeof(float));
    s->b = malloc(n * sizeof(float));
    s->tmp = malloc((size_t)ffn_chunk_neurons(m) * sizeof(float));
    s->start = malloc(c * sizeof(int));
    s->fired = malloc(c * sizeof(int));
    s->rows = malloc(n * sizeof(int32_t));
    if (s->idx && s->a && s->b && s->tmp && s->start && s->fired && s->rows) return 0;
    ffn_scratch_free(s);
    return -1;
}

void ffn_scratch_free(ffn_scratch *s) {
    free(s->idx); free(s->a); free(s->b); free(s->tmp); free(s->start); free(s->fired); free(s->rows);
    *s = (ffn_scratch){0};
}

static const void *act_for_type(const act_vec *a, uint32_t type) {
    if (type == GGML_TYPE_F32) return a->f32;
    return type == GGML_TYPE_F16 ? (const void *)a->f16 : (const void *)a->q8;
}

enum { ROW_GATE, ROW_UP, ROW_DOWN };

/* The view of one of a layer's row sets in f->rows' layout: a weight whose
 * rows are `unit` bytes apart, indexed by the neurons' places (rows_at). */
static weight rows_view(const ffn_layer *f, int which) {
    const ffn_rows *r = f->rows;
    const layer_weights *w = &f->m->layers[f->layer];
    weight v = which == ROW_GATE ? w->gate : w->up;
    if (which == ROW_DOWN) v = (weight){NULL, r->down_type, f->m->n_ff, f->m->n_embd, 0};
    v.data = r->base + (which == ROW_GATE ? 0 : which == ROW_UP ? r->up : r->down);
    v.row_bytes = r->unit;
    return v;
}

/* The neurons idx[0..n)'s places in f->rows, into out. */
static const int32_t *rows_at(const ffn_layer *f, const int32_t *idx, int n, int32_t *out) {
    for (int k = 0; k < n; k++) out[k] = f->rows->at[idx[k]];
    return out;
}

/* Chunk `chunk`'s down_t rows (view: storage for the neuron cache's) and
 * the neuron of its row 0 (f->rows: unused, down_row maps through at[]). */
static const weight *chunk_down_t(const ffn_layer *f, int chunk, weight *view, long *first) {
    long n0, n1;
    ffn_chunk_range(f->m, chunk, &n0, &n1);
    *first = f->down_t_chunks ? n0 : f->down_t_first;
    if (f->rows) return *view = rows_view(f, ROW_DOWN), view;
    return f->down_t_chunks ? &f->down_t_chunks[chunk] : f->down_t;
}

/* The row of `neuron` in chunk_down_t's weight. */
static int32_t down_row(const ffn_layer *f, long first, int32_t neuron) {
    return f->rows ? f->rows->at[neuron] : neuron - (int32_t)first;
}

/* The first rows chunk_down will read for a chunk's firing neurons idx[0..fired). */
static void chunk_then(const ffn_layer *f, int chunk, const int32_t *idx, int fired, sparse_then *then) {
    long first;
    weight view;
    const weight *dt = chunk_down_t(f, chunk, &view, &first);
    then->count = fired < AXPY_Q4_GROUP ? fired : AXPY_Q4_GROUP;
    for (int k = 0; k < then->count; k++)
        then->rows[k] = (const char *)dt->data + (size_t)down_row(f, first, idx[k]) * dt->row_bytes;
}

/* out[k] = w row idx[k] . in, the dense dot's bits; `then` as sparse_then. */
static void gather_dot(const ffn_layer *f, const weight *w, const int32_t *idx, int n, float *out,
                       const sparse_then *then) {
    if (f->gather) {
        sparse_kernels_for_type(f->gather, w->type)
            ->dot(w->data, w->row_bytes, idx, n, act_for_type(f->in, w->type), (int)w->cols, out, then);
        return;
    }
    for (int k = 0; k < n; k++) out[k] = row_dot(f->k, w, idx[k], f->in);
}

/* The same for gate and up together (one pass over both rows of each neuron). */
static void gather_dot2(const ffn_layer *f, const layer_weights *w, const int32_t *idx, int n, float *g, float *u,
                        const sparse_then *then) {
    if (f->gather && w->gate.type == w->up.type && w->gate.row_bytes == w->up.row_bytes) {
        sparse_kernels_for_type(f->gather, w->gate.type)
            ->dot2(w->gate.data, w->up.data, w->gate.row_bytes, idx, n,
                   act_for_type(f->in, w->gate.type), (int)w->gate.cols, g, u, then);
        return;
    }
    sparse_then up_rows;
    sparse_then_rows(&up_rows, w->up.data, w->up.row_bytes, idx, n, 0);
    gather_dot(f, &w->gate, idx, n, g, &up_rows);
    gather_dot(f, &w->up, idx, n, u, then);
}

/* h[k] = act(g[k], u[k]) with ffn_act_rows' formulas, then keeps (in place, in
 * order) the neurons with a non-zero activation. Returns how many. */
static int activate_and_keep(const ffn_layer *f, int32_t *idx, float *g, const float *u, int n) {
    const model *m = f->m;
    if (m->act == FFN_SILU) f->k->silu_mul(g, g, u, n);
    int kept = 0;
    for (int k = 0; k < n; k++) {
        const float h = m->act == FFN_SILU ? g[k] : ffn_act_relu(m->act, g[k], u[k]);
        if (h == 0.0f) continue;
        idx[kept] = idx[k];
        g[kept++] = h;
    }
    return kept;
}

int ffn_chunk_select(const ffn_layer *f, int chunk, int32_t *idx, float *gate, float *tmp, ffn_chunk_stats *st) {
    const layer_weights *w = &f->m->layers[f->layer];
    long n0, n1;
    ffn_chunk_range(f->m, chunk, &n0, &n1);
    int len = (int)(n1 - n0), n = 0;
    if (f->mode == FFN_DENSE) {
        for (int i = 0; i < len; i++) idx[i] = (int32_t)(n0 + i);
        return len;
    }
    if (f->mode == FFN_GATE_FIRST) { /* every gate row: resident even under a budget */
        matvec_rows_packed(f->k, &w->gate, f->in, tmp, n0, n1);
        st->bytes += (uint64_t)len * w->gate.row_bytes;
        for (int i = 0; i < len; i++)
            if (tmp[i] > 0) {
                idx[n] = (int32_t)(n0 + i);
                gate[n++] = tmp[i];
            }
        return n;
    }
    predictor_rows(f->pred, f->layer, f->pred_hidden, n0, n1, tmp);
    st->bytes += predictor_row_bytes(f->pred, f->layer) * (uint64_t)len;
    const float tau = predictor_threshold(f->pred, f->layer);
    for (int i = 0; i < len; i++)
        if (tmp[i] >= tau) idx[n++] = (int32_t)(n0 + i);
    return n;
}

/* Keeps (in place, in order, chunk by chunk) the batch's neurons whose gate
 * value in s->a is positive; updates s->start. Returns how many are left. */
static int keep_positive_gates(ffn_scratch *s, int n_chunks) {
    int kept = 0;
    for (int c = 0; c < n_chunks; c++) {
        const int at = s->start[c], end = s->start[c + 1];
        s->start[c] = kept;
        for (int k = at; k < end; k++)
            if (s->a[k] > 0) {
                s->idx[kept] = s->idx[k];
                s->a[kept++] = s->a[k];
            }
    }
    s->start[n_chunks] = kept;
    return kept;
}

/* The gate and up values of the batch's selected neurons (s->idx, chunk c's
 * from s->start[c]). On a ReLU model a neuron whose gate is not positive does
 * not fire whatever its up value, so the predictor's picks have their gate
 * rows read first and their up rows only where the gate is positive, as
 * gate-first does for every neuron: ~6 % of the predictor's picks do not
 * fire on the 7B bench model (its precision), and their up rows are not
 * read. SiLU models and the dense mode read both rows in one pass. */
static void gather_gate_up(const ffn_layer *f, const int32_t *chunks, ffn_scratch *s, int n_chunks,
                           ffn_chunk_stats *st) {
    const layer_weights *w = &f->m->layers[f->layer];
    int n = s->start[n_chunks];
    st->computed += (uint64_t)n;
    const bool gate_pass = f->mode == FFN_PREDICTOR && f->m->act != FFN_SILU;
    /* under a budget the rows are the neuron cache's (ffn_rows), addressed by the neurons' places */
    const weight gate = f->rows ? rows_view(f, ROW_GATE) : w->gate, up = f->rows ? rows_view(f, ROW_UP) : w->up;
    /* each pass prefetches the next pass's first rows, before knowing which of those neurons prove zero */
    sparse_then then = {0};
    if (gate_pass) {
        const int32_t *rows = f->rows ? rows_at(f, s->idx, n, s->rows) : s->idx;
        sparse_then_rows(&then, up.data, up.row_bytes, rows, n, 0);
        gather_dot(f, &gate, rows, n, s->a, &then);
        st->bytes += (uint64_t)n * w->gate.row_bytes;
        n = keep_positive_gates(s, n_chunks);
    }
    const int32_t *rows = f->rows ? rows_at(f, s->idx, n, s->rows) : s->idx;
    if (n_chunks > 0) chunk_then(f, chunks[0], s->idx, s->start[1], &then);
    if (gate_pass || f->mode == FFN_GATE_FIRST) { /* the gates are known: up rows only */
        gather_dot(f, &up, rows, n, s->b, &then);
        st->bytes += (uint64_t)n * w->up.row_bytes;
        return;
    }
    layer_weights v = *w;
    v.gate = gate;
    v.up = up;
    gather_dot2(f, &v, rows, n, s->a, s->b, &then);
    st->bytes += (uint64_t)n * (w->gate.row_bytes + w->up.row_bytes);
}

/* The chunk's firing neurons idx[0..fired) (layer indices; made dt's row
 * numbers here), activations h, summed into partial from zero along their
 * down_t rows; `then` names the next chunk's first rows (NULL: none). */
static void chunk_down(const ffn_layer *f, int chunk, int32_t *idx, const float *h, int fired, float *partial,
                       const sparse_then *then, ffn_chunk_stats *st) {
    const model *m = f->m;
    long first;
    weight view;
    const weight *dt = chunk_down_t(f, chunk, &view, &first);
    for (int k = 0; k < fired; k++) idx[k] = down_row(f, first, idx[k]);
    memset(partial, 0, sizeof(float) * (size_t)m->n_embd);
    sparse_kernels_for_type(f->axpy, dt->type)
        ->axpy(dt->data, dt->row_bytes, idx, h, fired, partial, m->n_embd, then);
    st->fired += (uint64_t)fired;
    st->bytes += (uint64_t)fired * (f->rows ? f->rows->down_row_bytes : dt->row_bytes);
}

void ffn_chunks_run(const ffn_layer *f, const int32_t *chunks, int n_chunks, float *partials, ffn_scratch *s,
                    ffn_chunk_stats *stats, uint32_t *counts) {
    ffn_chunk_stats local = {0}, *st = stats ? stats : &local;
    int n = 0;
    for (int c = 0; c < n_chunks; c++) {
        s->start[c] = n;
        n += ffn_chunk_select(f, chunks[c], s->idx + n, s->a + n, s->tmp, st);
    }
    s->start[n_chunks] = n;
    ffn_chunks_compute(f, chunks, n_chunks, partials, s, st, counts);
}

void ffn_chunks_compute(const ffn_layer *f, const int32_t *chunks, int n_chunks, float *partials, ffn_scratch *s,
                        ffn_chunk_stats *stats, uint32_t *counts) {
    ffn_chunk_stats local = {0}, *st = stats ? stats : &local;
    const size_t n_embd = (size_t)f->m->n_embd;
    gather_gate_up(f, chunks, s, n_chunks, st);
    for (int c = 0; c < n_chunks; c++) { /* every chunk's firing neurons first: each axpy prefetches the next's */
        const int at = s->start[c];
        s->fired[c] = activate_and_keep(f, s->idx + at, s->a + at, s->b + at, s->start[c + 1] - at);
        if (counts)
            for (int k = 0; k < s->fired[c]; k++) counts[s->idx[at + k]]++;
    }
    for (int c = 0; c < n_chunks; c++) {
        sparse_then then = {0};
        if (c + 1 < n_chunks) chunk_then(f, chunks[c + 1], s->idx + s->start[c + 1], s->fired[c + 1], &then);
        chunk_down(f, chunks[c], s->idx + s->start[c], s->a + s->start[c], s->fired[c],
                   partials + (size_t)chunks[c] * n_embd, &then, st);
    }
}

#define TAKE_MAX 64 /* chunks one take may hold */

/* How many chunks a thread takes at once (ffn_chunks_take). */
static int chunks_per_take(int n, int nth) {
    int k = nth <= 1 ? n : n / (2 * nth);
    return k < 1 ? 1 : k > TAKE_MAX ? TAKE_MAX : k;
}

void ffn_chunks_take(const ffn_layer *f, _Atomic int *next, const int32_t *list, int n, int nth, float *partials,
                     ffn_scratch *s, ffn_chunk_stats *st, uint32_t *counts) {
    int32_t batch[TAKE_MAX];
    const int per_take = chunks_per_take(n, nth);
    for (int i; (i = atomic_fetch_add(next, per_take)) < n;) {
        const int k = n - i < per_take ? n - i : per_take;
        for (int j = 0; j < k; j++) batch[j] = list ? list[i + j] : i + j;
        ffn_chunks_run(f, batch, k, partials, s, st, counts);
    }
}

/* Rows summed at once: the chunk loop runs outside, over contiguous rows. A
 * 7B worker's 2048 rows in one block read each partial as one 8 KiB stream
 * (written by the other workers' cores): 0.51-0.56 ms per token in the
 * stack's reduce step against 0.78-0.86 with blocks of 256. */
#define REDUCE_BLOCK 2048
#define REDUCE_LANES 16

void ffn_reduce_rows(const model *m, const float *partials, const float *residual, float *out, long r0, long r1) {
    const int n_chunks = ffn_chunk_count(m);
    const size_t n = (size_t)m->n_embd;
    float acc[REDUCE_BLOCK];
    for (long b0 = r0; b0 < r1; b0 += REDUCE_BLOCK) {
        const long len = r1 - b0 < REDUCE_BLOCK ? r1 - b0 : REDUCE_BLOCK;
        memset(acc, 0, sizeof acc);
        for (int c = 0; c < n_chunks; c++) { /* chunk order: the result's bits */
            const float *p = partials + (size_t)c * n + (size_t)b0;
            long j = 0;
            for (; j + REDUCE_LANES <= len; j += REDUCE_LANES) /* a fixed count: GCC -O2 vectorizes it */
                for (int k = 0; k < REDUCE_LANES; k++) acc[j + k] += p[j + k];
            for (; j < len; j++) acc[j] += p[j];
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

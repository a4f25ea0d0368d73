/* The sparse FFN, cut into fixed neuron chunks so that any thread
 * of any process may compute any chunk without changing a bit of the result.
 *
 * Chunk c holds neurons [c * ffn_chunk_neurons(m), min(n_ff, (c + 1) * ...)):
 * the boundaries depend on the model only. A chunk's contribution to the layer
 * output, the sum over its firing neurons i (ascending) of act_i * down_t row i,
 * is accumulated from zero into the chunk's own partial[n_embd] (a sparse axpy,
 * bit-exact on every ISA). The layer output is residual + (partial_0 + partial_1
 * + ...) in chunk order (ffn_reduce_rows). So pi2-ref with any thread count and
 * the stack with any number of workers give the same bits.
 *
 * Which neurons of a chunk are computed:
 *   FFN_DENSE       every neuron (gate and up by the dense dots, as ffn_act_rows),
 *                   the non-zero activations summed: the dense path of a model
 *                   that has only PowerInfer's ffn_down_t, no ffn_down matrix;
 *   FFN_GATE_FIRST  ReLU models: every gate row, up only where gate > 0. The
 *                   activations are the dense ones, so on a model with ffn_down_t
 *                   this equals FFN_DENSE bit for bit: exact, no predictor;
 *   FFN_PREDICTOR   gate and up only for the neurons the predictor names (its
 *                   logit >= its threshold). ReLU models: differs from exact only
 *                   by missed neurons; SiLU models: the approximate mode, which
 *                   skips neurons the predictor expects to have a small |silu(gate)|.
 * Gate and up of the computed neurons are the dense dots' bits in every mode.
 *
 * Errors: ffn_scratch_init and ffn_down_t_for return -1, with no message,
 * when out of memory (ffn_down_t_for also for a range it cannot transpose).
 * The chunk computations cannot fail: they trust the caller's layer, chunk
 * list and scratch. */
#ifndef PI2_FFN_CHUNKS_H
#define PI2_FFN_CHUNKS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "engine/model.h"
#include "engine/ffn_mode.h"
#include "engine/ops.h"
#include "kernels/sparse_kernels.h"

typedef struct predictor predictor;

/* Rows that are not in the model's tensors: a neuron cache (stack/offload.h)
 * holds neuron i's gate, up and down_t rows side by side at
 * base + at[i] * unit + {0, up, down}. at[] needs entries only for the
 * neurons a chunk computes. */
typedef struct {
    const uint8_t *base;
    size_t unit, up, down;
    const int32_t *at;        /* [n_ff] */
    uint32_t down_type;       /* the down_t rows' type (bundle_down_type) */
    size_t down_row_bytes;
} ffn_rows;

int ffn_chunk_neurons(const model *m);
int ffn_chunk_count(const model *m);
/* The neurons [*n0, *n1) of chunk c. */
void ffn_chunk_range(const model *m, int chunk, long *n0, long *n1);

/* One layer's inputs, shared read-only by every thread computing its chunks. */
typedef struct {
    const model *m;
    const kernels *k;             /* the dense dots */
    const sparse_kernels *gather; /* gather dots with k's bits (k->gather), or NULL: one dense dot per row */
    const sparse_kernels *axpy;   /* the down_t axpy */
    int layer;
    ffn_mode mode;
    const act_vec *in;            /* rmsnorm(x) * ffn_norm, converted for the gate and up types */
    /* neuron-major down rows: neuron i is row (i - down_t_first) of down_t; a
     * worker may hold only its own neurons' rows */
    const weight *down_t;
    long down_t_first;
    /* or, when not NULL, one weight per chunk ([ffn_chunk_count]): chunk c's
     * row 0 is its first neuron (a worker holding only its own chunks' rows) */
    const weight *down_t_chunks;
    const predictor *pred;        /* FFN_PREDICTOR */
    const act_vec *pred_hidden;   /* FFN_PREDICTOR: this layer's hidden vector as predictor_prepare (or
                                   * predictor_hidden_done) converted it */
    const ffn_rows *rows;         /* not NULL: gate (but for gate-first's selection), up and down_t are there */
} ffn_layer;

/* One thread's scratch: idx, a, b hold up to n_ff neurons (a batch of
 * chunks), tmp one chunk, start one entry per chunk of a batch plus one,
 * fired one per chunk (its firing neurons, at start[c]). */
typedef struct {
    int32_t *idx;
    float *a, *b, *tmp;
    int *start, *fired;
    int32_t *rows;  /* idx's rows in an ffn_rows layout */
} ffn_scratch;

int ffn_scratch_init(ffn_scratch *s, const model *m); /* 0, or -1 out of memory */
void ffn_scratch_free(ffn_scratch *s);

typedef struct {
    uint64_t computed; /* neurons whose gate and up were computed */
    uint64_t fired;    /* neurons with a non-zero activation (summed into the partial) */
    uint64_t bytes;    /* weight bytes read (gate, up, down_t rows and predictor rows) */
} ffn_chunk_stats;

/* Computes the chunks chunks[0..n_chunks) (distinct, ascending for the
 * fastest gathers) into partials[chunk][n_embd]; adds to *st (may be NULL);
 * counts[i]++ (indexed by neuron, may be NULL) for every firing neuron. The
 * gate and up rows of all of them are read in one gather, which streams
 * better than a gather per chunk; each chunk's partial is what it would be
 * alone. */
void ffn_chunks_run(const ffn_layer *f, const int32_t *chunks, int n_chunks, float *partials, ffn_scratch *s,
                    ffn_chunk_stats *st, uint32_t *counts);

/* ffn_chunks_run in two halves, for a caller that must fetch the chosen
 * neurons' rows in between (stack/offload.h). First: the neurons of chunk
 * `chunk` the mode computes (layer indices, ascending) into idx, their gate
 * values into gate where the mode computed them (gate-first), tmp one chunk
 * of floats. Returns how many. */
int ffn_chunk_select(const ffn_layer *f, int chunk, int32_t *idx, float *gate, float *tmp, ffn_chunk_stats *st);
/* Then: with s->idx, s->a and s->start[0..n_chunks] holding the chunks'
 * selections one after another, the rest of ffn_chunks_run. */
void ffn_chunks_compute(const ffn_layer *f, const int32_t *chunks, int n_chunks, float *partials, ffn_scratch *s,
                        ffn_chunk_stats *st, uint32_t *counts);

/* The loop each of the nth threads of a pool runs: takes the next entries of
 * list (list NULL: chunks 0 .. n-1) from the shared counter until none is
 * left, and runs them into partials[chunk][n_embd]. A thread alone takes
 * them all at once; several take about half a share at a time: long
 * gathers that still leave the threads something to balance. */
void ffn_chunks_take(const ffn_layer *f, _Atomic int *next, const int32_t *list, int n, int nth, float *partials,
                     ffn_scratch *s, ffn_chunk_stats *st, uint32_t *counts);

/* out[r] = residual[r] + (partials[0][r] + partials[1][r] + ...), chunk order,
 * for rows [r0, r1); partials is [ffn_chunk_count(m)][n_embd]. */
void ffn_reduce_rows(const model *m, const float *partials, const float *residual, float *out, long r0, long r1);

/* A neuron-major down_t for neurons [n0, n1) of a layer, when the file has no
 * ffn_down_t: F32 / F16 from F32 / F16 (exact values), Q8_0 from quantized
 * weights (a requantization). The file's ffn_down_t, when present, is used as it is
 * (*built stays NULL, *first = 0). Returns 0, or -1 (out of memory, or a range or
 * shape weight_transpose_cols cannot transpose); free(*built). */
int ffn_down_t_for(const layer_weights *w, long n0, long n1, weight *out, long *first, void **built);

#endif

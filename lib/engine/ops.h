/* The forward pass's building blocks, shared by the reference engine and the
 * stack's workers so that both compute bit-identical results: a row computed
 * by any process or thread is the same dot product in the same order.
 *
 * Errors: none: the building blocks compute on buffers the caller has sized
 * (the caller checks shapes). A weight type model_load does not admit aborts
 * via PI2_ASSERT; a KV position outside the cache is caught by
 * PI2_DEBUG_ASSERT (make asan only). */
#ifndef PI2_OPS_H
#define PI2_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "engine/model.h"
#include "kernels/tinyblas.h"

/* An activation vector converted for every weight type that may read it. */
typedef struct {
    const float *f32;
    uint16_t *f16;       /* capacity >= n */
    block_q8_0 *q8;      /* capacity >= n / 32 blocks */
} act_vec;

/* Convert x[0..n) for the weights ws[0..nw) (to F16 and/or Q8_0 as their types need). */
void act_convert_for(const kernels *k, act_vec *a, const float *x, int n, const weight *const *ws, int nw);

float row_dot(const kernels *k, const weight *w, int64_t r, const act_vec *in);
/* out[r] = W[r] . in for r in [r0, r1) */
void matvec_rows(const kernels *k, const weight *w, const act_vec *in, float *out, long r0, long r1);
/* the same into out[r - r0] */
void matvec_rows_packed(const kernels *k, const weight *w, const act_vec *in, float *out, long r0, long r1);

/* llama.cpp's RMSNorm: sum of squares in double, then scale, then the norm weight. */
void rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* GGUF llama RoPE: adjacent pairs, angles by repeated multiplication as ggml
 * does. In two steps, since the angles depend on the position only:
 * cs[head_dim] = cos, sin of each pair's angle at pos (the same for every head
 * and layer), then the rotation of n_heads heads by them. */
void rope_angles(float *cs, int head_dim, int pos, float base);
void rope_apply(float *v, int n_heads, int head_dim, const float *cs);

/* One layer's F16 KV cache: K as [n_ctx][kv_dim], V transposed as [kv_dim][n_ctx]. */
typedef struct {
    uint16_t *k;
    uint16_t *v;
    int n_ctx, kv_dim;
} kv_layer;

void kv_store(const kernels *k, const kv_layer *kv, int pos, const float *kvec, const float *vvec);
/* The two halves of kv_store for a run of positions, so a prompt writes V's
 * transposed rows position after position (one scattered store per element
 * otherwise): keys of position pos; values of positions pos .. pos + n - 1
 * (v[t * stride + d]) for elements [d0, d1). */
void kv_store_keys(const kernels *k, const kv_layer *kv, int pos, const float *kvec);
void kv_store_values(const kv_layer *kv, int pos, int n, const float *v, size_t stride, int d0, int d1);

/* Attention for heads [h0, h1) at position pos (attending to 0..pos).
 * q16: the query heads in F16 [n_head * head_dim]; scores / probs16: scratch of
 * n_ctx per head (indexed by absolute head); out: [n_head * head_dim]. */
void attention_heads(const kernels *k, const model *m, const kv_layer *kv, const uint16_t *q16, int pos,
                     float *scores, uint16_t *probs16, float *out, long h0, long h1);

/* attention_heads' bits for head h of the n_tok prompt tokens at positions
 * pos0 .. pos0 + n_tok - 1 (each attending to 0 .. its own; every key up to
 * the last stored), each key and value row read once for all of them
 * (kernels' dot_f16_rows_tile). q16 / out: the first token's query heads /
 * output [n_head * head_dim], each next token's right after; scores /
 * probs16: scratch of n_tok * n_ctx; widened: of n_tok * head_dim. */
void attention_head_tokens(const kernels *k, const model *m, const kv_layer *kv, long h, const uint16_t *q16,
                           int pos0, int n_tok, float *scores, uint16_t *probs16, float *widened, float *out);

/* The same for the token at pos of a prompt batch at positions 0..n_batch-1
 * (all in kv), as llama.cpp computes it: over the batch's KV length, with the
 * K . q and V . p products in tinyBLAS order (tb) where llamafile's sgemm
 * takes them. n_batch 1 (tb may be NULL): attention_heads. */
void attention_heads_batch(const kernels *k, const tinyblas_kernels *tb, int n_batch, const model *m,
                           const kv_layer *kv, const uint16_t *q16, int pos, float *scores, uint16_t *probs16,
                           float *out, long h0, long h1);

/* hb[i] = act(gate_i . x) * (up_i . x) for neurons [i0, i1); counts[i]++ where hb[i] != 0 (counts may be NULL). */
void ffn_act_rows(const kernels *k, const model *m, const layer_weights *w, const act_vec *in, float *hb,
                  long i0, long i1, uint32_t *counts);
/* The same with other arithmetic (ops_llama.c): rows gives out[r - r0] = W[r] . in;
 * silu gives h[i - i0] = silu(g) * u for neurons [i0, i1) of a layer of n_ff. */
typedef void (*ffn_rows_fn)(const kernels *k, const weight *w, const act_vec *in, float *out, long r0, long r1);
typedef void (*ffn_silu_fn)(const kernels *k, float *h, const float *g, const float *u, long i0, long i1, long n_ff);
void ffn_act_rows_with(const kernels *k, const model *m, const layer_weights *w, const act_vec *in, float *hb,
                       long i0, long i1, uint32_t *counts, ffn_rows_fn rows, ffn_silu_fn silu);

#endif

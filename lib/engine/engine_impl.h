/* Private to the reference engine's files (engine.c: the token-by-token
 * forward pass; engine_prefill.c: llama.cpp's prompt batch): the engine's
 * state and the pieces they use.
 *
 * Errors: none: these helpers cannot fail; the buffers they use are
 * allocated, and checked, by engine_new and engine_set_ffn_mode. */
#ifndef PI2_ENGINE_IMPL_H
#define PI2_ENGINE_IMPL_H

#include <stdbool.h>

#include "engine/engine.h"
#include "kernels/kernels.h"
#include "engine/ops.h"
#include "engine/prompt.h"
#include "kernels/sparse_kernels.h"
#include "util/calloc_flagged.h"
#include "util/threadpool.h"
#include "kernels/tinyblas.h"

struct engine {
    const model *m;
    const kernels *k;
    threadpool *pool;
    int n_ctx, kv_dim, n_threads;
    uint16_t *k_cache;   /* [layer][pos][kv_dim] */
    uint16_t *v_cache;   /* [layer][kv_dim][n_ctx]: transposed so attention's weighted sum is a dot product */
    float *x;            /* [n_embd]: the residual stream, the token's state between layers */
    float *xb;           /* [max(n_embd, n_ff)]: x normed (attention's or the FFN's input); scratch */
    float *q;            /* [n_embd]: the query, all heads */
    float *kv_k, *kv_v;  /* [kv_dim]: this position's key and value, before they go into the caches */
    float *att_out;      /* [n_embd]: the heads' weighted values, before wo */
    float *hb;           /* [n_ff]: the FFN's hidden activations (dense FFN) */
    float *logits;       /* [n_vocab] */
    float *scores;       /* [n_head][n_ctx] */
    uint16_t *probs16;   /* [n_head][n_ctx] */
    uint16_t *q16;       /* [n_embd] */
    float *rope_cs;      /* [head_dim]: rope_angles at the position being decoded (every layer's) */
    act_vec in;          /* conversion buffers sized for max(n_embd, n_ff) */
    uint32_t *fire_counts; /* [n_layer][n_ff]: the caller's firing counters (engine_count_firing), or NULL */
    ffn_observer observer;
    void *observer_ctx;
    float *gate_pre;     /* [n_ff], allocated when an observer is set */
    float *layer_in;     /* [n_embd]: the layer's input, kept for the observer */
    ffn_mode ffn_mode;
    /* the chunked FFN (ffn_chunks.h) */
    const sparse_kernels *gather, *axpy;
    float *partials;                  /* [n_chunks][n_embd] */
    ffn_scratch *scratch;             /* [n_threads] */
    ffn_chunk_stats *chunk_stats;     /* [n_threads] */
    weight *down_t;                   /* [n_layer], set up by engine_set_ffn_mode (or NULL) */
    void **down_t_built;              /* [n_layer]: the built copies, to free */
    const predictor *pred;
    float *pred_hidden;               /* [max rank] */
    act_vec pred_conv;                /* for max(n_embd, max rank) */
    engine_ffn_stats_t stats;
    bool llama;                       /* llama.cpp compatibility (engine_set_llama_compat) */
    bool token_prompt;                /* engine_set_token_prompt */
    prompt_pass *prompt;              /* made at the first engine_prefill that runs it */
    const tinyblas_kernels *tb;
};

kv_layer engine_layer_cache(const engine *e, int l);
/* o_i = W_i . x for count (1..3) weights over one input, rows shared out over the pool */
void engine_matvec(engine *e, const float *x, int n, int count, const weight *w0, float *o0, const weight *w1,
                   float *o1, const weight *w2, float *o2);
/* layer l's FFN on e->x, in the engine's mode */
void engine_ffn_block(engine *e, int l, int pos);

#endif

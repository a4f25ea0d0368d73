/* The reference forward pass: one token at a time through all layers, with
 * a KV cache, split over a pool of threads. The oracle for the whole stack. */
#ifndef PI2_ENGINE_H
#define PI2_ENGINE_H

#include <stdint.h>

#include "kernels.h"
#include "model.h"

typedef struct engine engine;

/* n_ctx <= 0: the model's training context. Kernels: kernels_best(). */
engine *engine_new(const model *m, int n_threads, int n_ctx, char *err, size_t errlen);
/* The same with a given kernel table (e.g. kernels_by_name("avx512-exact")). */
engine *engine_new_with_kernels(const model *m, const kernels *k, int n_threads, int n_ctx, char *err,
                                size_t errlen);
void engine_free(engine *e);
int engine_n_ctx(const engine *e);

/* Run token at position pos (0-based; positions must be fed in order) and
 * return the logits [n_vocab], valid until the next call. */
float *engine_forward(engine *e, int token, int pos);

/* FFN firing statistics: while counts is non-NULL, counts[l * n_ff + i] is
 * incremented whenever neuron i of layer l has a non-zero activation
 * (act(gate) != 0 for ReLU models; |silu(gate)*up| > 0 is always true for SiLU). */
void engine_count_firing(engine *e, uint32_t *counts);

/* Offline tools (predictor builder, statistics) observe each layer's FFN:
 * called from the calling thread once per layer per token with the residual
 * before the FFN norm, the FFN input rmsnorm(x)*ffn_norm ([n_embd] each) and
 * the gate pre-activations [n_ff]. Costs an extra gate product; fn NULL stops. */
typedef void (*ffn_observer)(void *ctx, int layer, const float *residual, const float *ffn_in, const float *gate);
void engine_observe_ffn(engine *e, ffn_observer fn, void *ctx);

#endif

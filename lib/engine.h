/* The reference forward pass: one token at a time through all layers, with
 * a KV cache, split over a pool of threads. The oracle for the whole stack. */
#ifndef PI2_ENGINE_H
#define PI2_ENGINE_H

#include <stddef.h>
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
/* How the FFN is computed (issue 4). FFN_GATE_FIRST, for ReLU models only:
 * every gate row (the dense kernels, so gate values are the dense bits), then
 * up only for neurons with gate > 0 (the dense dot's bits), then the down
 * projection as an axpy of the firing neurons' neuron-major down_t rows in
 * ascending order. The activations are dense's bit for bit; the down sums:
 *   - with the file's ffn_down_t (PowerInfer PWRI): the dense path sums the
 *     same rows in the same order per thread, so the logits are dense's bits
 *     (for the same thread count);
 *   - otherwise engine_set_ffn_mode builds a down_t (weight_transpose): F32 for
 *     F32/F16 models, exact values, only the summation order differs from the
 *     dense row dots (rounding); Q8_0 for quantized models, a requantization,
 *     and dense quantizes hb to Q8_0 where the axpy keeps it in F32: ~1% of the
 *     logits' scale, so greedy tokens can differ from dense at near ties. Its
 *     memory: n_ff * n_embd * 4 bytes (F32) or * 34/32 bytes (Q8_0) per layer,
 *     1.5 GB for a 7B Q4_0 model;
 *   - the threads take the neuron ranges dense gives them, each summing into
 *     its own buffer, reduced in thread order: deterministic for a thread
 *     count, but the dense ffn_down path does not depend on the thread count
 *     and this one can, by rounding. */
typedef enum { FFN_DENSE, FFN_GATE_FIRST } ffn_mode;

/* Returns 0, or -1 with a message (SiLU model, out of memory). */
int engine_set_ffn_mode(engine *e, ffn_mode mode, char *err, size_t errlen);
/* The last engine_forward's FFN work over all layers: neurons whose activation
 * was non-zero (dense mode: all of them) and weight bytes the FFN read. */
void engine_ffn_stats(const engine *e, uint64_t *active_neurons, uint64_t *ffn_bytes_touched);

typedef void (*ffn_observer)(void *ctx, int layer, const float *residual, const float *ffn_in, const float *gate);
void engine_observe_ffn(engine *e, ffn_observer fn, void *ctx);

#endif

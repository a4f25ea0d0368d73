/* The reference forward pass: one token at a time through all layers, with
 * a KV cache, split over a pool of threads. The oracle for the whole stack.
 *
 * Errors: engine_new and the setters that take err return NULL or -1 with a
 * message in err. engine_forward and engine_prefill return NULL, with no
 * message, for a token or position out of range (engine_prefill also when out
 * of memory); engine_observe_ffn, out of memory, observes nothing. */
#ifndef PI2_ENGINE_H
#define PI2_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "engine/ffn_chunks.h"
#include "engine/model.h"

typedef struct engine engine;

/* n_ctx <= 0: the model's training context. Kernels: kernels_best(). */
engine *engine_new(const model *m, int n_threads, int n_ctx, char *err, size_t errlen);
/* The same with a given kernel table (e.g. kernels_by_name("avx512-exact")). */
engine *engine_new_with_kernels(const model *m, const kernels *k, int n_threads, int n_ctx, char *err,
                                size_t errlen);
void engine_free(engine *e);
int engine_n_ctx(const engine *e);

/* Run token at position pos (0-based; positions must be fed in order) and
 * return the logits [n_vocab], valid until the next call; NULL for a token
 * outside the vocabulary or a position outside the context. */
float *engine_forward(engine *e, int token, int pos);

/* Run the prompt tokens[0..n) at positions 0..n-1 (a fresh sequence) and
 * return the last one's logits, as engine_forward; NULL on a bad token or n
 * (or out of memory). By the prompt pass the stack's npu-worker runs
 * (engine/prompt.h), in blocks of ENGINE_PROMPT_BLOCK tokens, so the two
 * agree bit for bit; token by token with engine_forward when
 * engine_set_token_prompt is on, while an FFN observer or firing counts
 * watch every token, or on a model the pass does not take (prompt_pass_takes);
 * as llama.cpp when its compatibility is on (below). */
float *engine_prefill(engine *e, const int *tokens, int n);
#define ENGINE_PROMPT_BLOCK 256

/* Prompt token by token (as the stack does without an npu-worker). */
void engine_set_token_prompt(engine *e, bool on);

/* llama.cpp compatibility, to show agreement with its outputs (build 4748, CPU
 * backend: ../shared/oracle) to the last printed digit with the avx512-exact
 * kernels (tests/test_oracle.c). On: F32 dot products and SiLU as ggml computes
 * them (lib/engine/ops_llama.h), and engine_prefill runs the prompt as llama.cpp runs
 * one batch: F32 matrix products and attention's K.q and V.p in llamafile's
 * tinyBLAS order where its sgemm takes them (lib/kernels/tinyblas.h), and after the
 * last layer's attention only the last token. The FFN observer and firing
 * counts then see only what runs as a single token. Not the product's order
 * (a token must get the same bits alone or in a batch: docs/stack.md); off by
 * default. SiLU models with the dense FFN only. Returns 0, or -1 with a message. */
int engine_set_llama_compat(engine *e, bool on, char *err, size_t errlen);

/* FFN firing statistics: while counts is non-NULL, counts[l * n_ff + i] is
 * incremented whenever neuron i of layer l has a non-zero activation
 * (act(gate) != 0 for ReLU models; |silu(gate)*up| > 0 is always true for SiLU). */
void engine_count_firing(engine *e, uint32_t *counts);

/* How the FFN is computed (lib/engine/ffn_mode.h, ffn_chunks.h). FFN_DENSE on a model
 * with an ffn_down matrix: the dense matrix-vector products. Every other case
 * (gate-first, predictor, or dense on a PWRI file that has only ffn_down_t)
 * runs the chunked sparse FFN, whose result does not depend on the thread count.
 * Gate-first and predictor need neuron-major down rows: the file's ffn_down_t
 * or, built here once, a transpose of ffn_down (F32 / F16 for F32 / F16 models,
 * exact values; Q8_0 for quantized ones, a requantization that moves the logits by
 * ~1% of their scale, so greedy tokens can differ from dense at near ties; 1.5
 * GB for a 7B Q4_0 model). Gate-first: ReLU models only. Predictor: p (owned
 * by the caller, for this model); on a SiLU model it is the approximate mode.
 * Returns 0, or -1 with a message. */
int engine_set_ffn_mode(engine *e, ffn_mode mode, const predictor *p, char *err, size_t errlen);
/* The last engine_forward's FFN work over all layers: neurons whose gate and
 * up were computed, neurons with a non-zero activation (dense: all computed),
 * and weight bytes the FFN read (predictor included). */
typedef struct {
    uint64_t computed, active, bytes;
} engine_ffn_stats_t;
void engine_ffn_stats(const engine *e, engine_ffn_stats_t *st);

/* Offline tools (predictor builder, statistics) observe each layer's FFN:
 * called from the calling thread once per layer per token (engine_forward's
 * token-by-token path; a prompt then goes token by token). Costs an extra
 * gate product; fn NULL stops. */
typedef struct {
    int layer;
    const float *layer_in; /* [n_embd]: the layer's input, before attention */
    const float *residual; /* [n_embd]: x before the FFN norm */
    const float *ffn_in;   /* [n_embd]: rmsnorm(x) * ffn_norm */
    const float *gate;     /* [n_ff]: the gate pre-activations */
} ffn_observation;
typedef void (*ffn_observer)(void *ctx, const ffn_observation *o);
void engine_observe_ffn(engine *e, ffn_observer fn, void *ctx);

#endif

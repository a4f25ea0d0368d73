/* The dense prompt pass: a block of prompt tokens through every layer at
 * once, each weight matrix times all the tokens as one product. The
 * stack's npu-worker and pi2-ref's engine_prefill both run it, so a prompt
 * gives the same bits in either (docs/prefill.md).
 *
 * Q4_0 weights go through the kernel set's prefill product (kernels/gemm.h):
 * tokens packed once per input, each weight tile re-laid once for all of
 * them, on AMX tiles where the CPU has them. Other types take each (row,
 * token) value as decode's row dot. A token's values do not depend on the
 * other tokens of its block, so a prompt cut into blocks of any size gives
 * the same bits; they differ from the same token decoded alone only where
 * the prefill product's summation order does (Q4_0).
 *
 * A PowerInfer file's neuron-major ffn_down_t (no ffn_down) is summed as
 * decode's sparse axpy sums it, over each token's firing neurons only (ReLU
 * zeros cost nothing), in L2-sized chunks of neurons for all tokens at once;
 * decode adds its chunks' partials in another order, so those bits differ
 * from token by token in the last place. Under a memory budget the FFN
 * weights arrive in pieces of neurons (prompt_ffn_source) with the same bits.
 *
 * Per layer: RMSNorm, Q/K/V for all tokens, RoPE, the KV cache written for
 * every position, causal attention by (token, head), Wo, then the FFN's gate
 * and up for all tokens, the activation, down. The hidden states of the block
 * stay in this object's memory; only the KV cache is shared.
 *
 * Errors: prompt_pass_new returns NULL with a message in err when out of
 * memory; prompt_pass_run returns -1, with no message, only when the caller's
 * step or ffn callback abandoned the run. The rest cannot fail and trusts the
 * caller's token ids and counts. */
#ifndef PI2_PROMPT_H
#define PI2_PROMPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "engine/ops.h"
#include "kernels/kernels.h"
#include "util/threadpool.h"

typedef struct prompt_pass prompt_pass;

/* Layer l's KV cache, wherever the caller keeps it. */
typedef kv_layer (*prompt_kv_fn)(void *ctx, int layer);
/* Called before layer `layers_done` starts and after the last one: nonzero
 * abandons the run (the stack's epoch ended); also the caller's progress report. */
typedef int (*prompt_step_fn)(void *ctx, int layers_done);

/* Where the pass gets a layer's FFN weights when they are not all in memory
 * (a budgeted stack streams them from storage): neurons [n0, *n1) of layer l,
 * as a layer whose gate, up and down_t rows start at neuron n0 (`rows` =
 * *n1 - n0; ffn_down, whose rows are not neurons, only with n0 = 0 and *n1 =
 * n_ff). The pass asks for every layer's pieces in order, from n0 = 0 to
 * n_ff, and reads a piece only until it asks for the next one. *n1 must be
 * n_ff or n0 plus a multiple of prompt_pass_neuron_step(m), so the pieces
 * give the bits of the whole layer. Nonzero abandons the run. */
typedef int (*prompt_ffn_piece_fn)(void *ctx, int layer, long n0, layer_weights *piece, long *n1);
typedef struct {
    prompt_ffn_piece_fn piece;
    void *ctx;
} prompt_ffn_source;

/* True when every layer has ffn_down, or an ffn_down_t of a type the sparse
 * axpy takes (F32, F16, Q8_0, Q4_0). */
bool prompt_pass_takes(const model *m);

/* The neurons an FFN piece may hold are a multiple of this (prompt_ffn_source):
 * the pass's down_t chunk, a whole number of re-laid gate/up tiles, when every
 * layer has a down_t of one row size and a ReLU-family activation; else n_ff
 * (whole layers: ffn_down's columns are its neurons). */
long prompt_pass_neuron_step(const model *m);

/* Buffers for blocks of up to max_tok tokens in a context of n_ctx, threads
 * from pool (not owned; the pass may outlive it, but runs only while it lives). NULL with err set when out of memory. */
prompt_pass *prompt_pass_new(const model *m, const kernels *k, threadpool *pool, int max_tok, int n_ctx, char *err,
                             size_t errlen);
void prompt_pass_free(prompt_pass *p);
/* Gives the buffers' pages back between prompts (pages_release: they are
 * allocated again, zeroed, as the next run touches them). */
void prompt_pass_release(prompt_pass *p);
/* The bytes prompt_pass_new allocates for these sizes with n_threads threads. */
size_t prompt_pass_bytes(const model *m, int max_tok, int n_ctx, int n_threads);

/* tokens[0..n) (ids < n_vocab, 1 <= n <= max_tok) at positions first, first+1, ...
 * (the earlier positions already in the KV cache). step may be NULL; ffn NULL
 * takes the FFN weights from the model. Returns 0, or -1 when step or ffn
 * abandoned it. */
int prompt_pass_run(prompt_pass *p, const int32_t *tokens, int n, int first, prompt_kv_fn kv, void *kv_ctx,
                    prompt_step_fn step, void *step_ctx, const prompt_ffn_source *ffn);

/* After a run of n tokens: the last token's residual after the last layer
 * ([n_embd]), and its logits into out ([n_vocab]). */
const float *prompt_pass_last_residual(const prompt_pass *p, int n);
void prompt_pass_logits(prompt_pass *p, int n, float *out);

#endif

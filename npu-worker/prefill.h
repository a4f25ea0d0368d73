/* Dense prefill of a prompt (docs/stack.md, "Prefill"): the prompt pass
 * (engine/prompt.h, the one pi2-ref runs) over the stack's weights, the KV
 * cache written for every prompt position in shared memory, and the last
 * token's residual and logits left in the act region for the coordinator to
 * sample from. The batch's hidden states stay in this process's memory. */
#ifndef PI2_PREFILL_H
#define PI2_PREFILL_H

#include <stdint.h>

#include "stack/stack_attach.h"

typedef struct prefiller prefiller;

/* Scratch for up to the stack's max_prefill tokens, allocated once; under
 * a memory budget also the staging the FFN weights stream through
 * (engine/ffn_stream.h), the rows of the plan's pinned bundles copied from
 * run runid's neuron cache instead of read (pinned_rows.h). NULL on failure
 * (logged). */
prefiller *prefiller_new(stack_view *sv, const char *runid, int n_threads);
void prefiller_free(prefiller *p);
/* After a prompt: the scratch's and the staging's pages go back to the
 * system (allocated again as the next prompt touches them). */
void prefiller_release(prefiller *p);

/* Called after each layer with the layers done so far (the caller's heartbeat
 * and progress report); may be NULL. */
typedef void (*prefill_tick)(void *ctx, int layers_done);

/* tokens[0..n) (ids < n_vocab, n <= max_prefill) at positions first, first+1, ...
 * Returns 0, -1 if the control block's epoch left `epoch` (abandoned), or
 * PREFILL_ERROR when the weights could not be read (prefiller_error says why). */
#define PREFILL_ERROR (-2)
const char *prefiller_error(const prefiller *p);
int prefiller_run(prefiller *p, const int32_t *tokens, int n, int first, uint32_t epoch, prefill_tick tick,
                  void *tick_ctx);

#endif

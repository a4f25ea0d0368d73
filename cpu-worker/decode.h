/* One cpu-worker's share of a decode step (docs/stack.md, "Decode"): for a
 * layer, steps A-D with a cross-worker barrier after each; for the output
 * task, the final norm and this worker's logits rows. Every value is computed
 * by the same ops.h call the reference engine makes for it, so the stack's
 * logits are bit-identical to pi2-ref's. */
#ifndef PI2_DECODE_H
#define PI2_DECODE_H

#include <stdint.h>

#include "stack_attach.h"

/* Longest a worker waits at a barrier for the others. A dead peer normally
 * releases it sooner: the coordinator starts a new epoch. */
#define DECODE_BARRIER_TIMEOUT_MS 30000

typedef struct decoder decoder;

/* Worker `index` of the stack's n_cpu_workers, computing with n_threads.
 * Private scratch is allocated here, once. NULL on allocation failure (logged). */
decoder *decoder_new(const stack_view *sv, int index, int n_threads);
void decoder_free(decoder *d);

/* layer < n_layer: that layer for the token at pos; layer == n_layer: the
 * output rows. Returns 0 when done, -1 when abandoned (epoch changed or a
 * barrier timed out). */
int decoder_run(decoder *d, int layer, int pos, uint32_t epoch);

#endif

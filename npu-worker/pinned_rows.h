/* Under a budget, the plan's pinned bundles as FFN rows the prompt pass need
 * not read from storage (ffn_stream_resident): neuron n of layer l is pinned
 * when its place in the layer's bundle order falls in the layer's first
 * plan.hot_bundles[l] bundles, which cachemgr keeps in the neuron cache
 * segment's "hot" region for the stack's life. Lent bundles are not offered:
 * a prompt takes their memory back.
 *
 * The rows are offered only when a bundle holds every streamed row in the
 * model's own type and size (a PWRI file's ffn_down_t; a GGUF file's bundles
 * hold ffn_down transposed, which the pass does not read). How much a prompt
 * saves depends on where the pinned neurons lie in the file: the reads are
 * runs of file rows, so a model ordered hottest-first (pi2-reorder) saves
 * about the pinned share, one with its hot neurons scattered about nothing.
 *
 * Errors: pinned_rows_open returns NULL (the prompt then reads every row),
 * logging why unless the stack has no plan. */
#ifndef PI2_PINNED_ROWS_H
#define PI2_PINNED_ROWS_H

#include "engine/ffn_stream.h"
#include "stack/stack_attach.h"

typedef struct pinned_rows pinned_rows;

/* sv must be attached with neuron_positions (off.pos_of) and outlive it. */
pinned_rows *pinned_rows_open(const stack_view *sv, const char *runid);
/* Before a prompt: the source over the segment as it is now (attached again
 * if cachemgr made it anew), or NULL when it cannot be attached (logged). */
const ffn_stream_resident *pinned_rows_source(pinned_rows *p);
void pinned_rows_close(pinned_rows *p);

#endif

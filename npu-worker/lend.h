/* Lending the prompt's memory to decode (docs/offload.md, "Lending"). Under
 * a plan with lent bundles, the npu-worker's prompt buffers and staging are
 * idle between prompts; meanwhile their pages hold each layer's next bundles
 * after the hot ones, in the neuron cache segment's sparse region "lent".
 * Before a prompt the lender clears the region's flag and punches its pages
 * out, so the prompt's buffers fit the budget; after the prompt the buffers
 * give their pages back and the lender reads the bundles again (large
 * O_DIRECT reads, each bundle's checksum verified) and sets the flag. While
 * the flag is clear, the cpu-workers find those bundles through the cold
 * cache, so the tokens do not depend on it. */
#ifndef PI2_NPU_LEND_H
#define PI2_NPU_LEND_H

#include <stdbool.h>

#include "stack/stack_attach.h"

typedef struct lender lender;

/* NULL and no error when the stack's plan lends nothing (or PI2_LEND=0,
 * which keeps the region empty to measure what lending gains); NULL with
 * *failed set on an error (logged). */
lender *lender_open(stack_view *sv, const char *runid, bool *failed);
void lender_close(lender *L);

/* Before a prompt's chunk: the bundles are taken back (flag cleared first,
 * then the pages punched out). 0, or -1 (logged): the prompt must not run,
 * as its buffers would not fit. */
int lender_reclaim(lender *L);

/* After the prompt, its buffers released: reads the lent bundles into the
 * region and sets the flag; beat(ctx) about every 100 ms. A read or checksum
 * that fails leaves the flag clear (logged): decode reads those bundles as
 * misses, which report their own errors. */
void lender_fill(lender *L, void (*beat)(void *), void *ctx);

#endif

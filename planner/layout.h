/* From a memory budget to a layout: what is preloaded, what the processes
 * and the prefill's staging take, and how the rest is split between pinned
 * hot bundles and the cold cache's slots (docs/planner.md). */
#ifndef PI2_PLANNER_LAYOUT_H
#define PI2_PLANNER_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/ffn_mode.h"
#include "engine/model.h"
#include "stack/stack.h"
#include "bundle_order.h"
#include "cost_model.h"

/* The processes' own memory, each: anonymous RSS 6.4-9.1 MiB and page
 * tables 1.2-1.4 MiB, measured on a running 7B stack under a plan (the
 * npu-worker's prompt buffers and staging counted apart; docs/planner.md);
 * the supervisor counts as one more process. Plus, once for the stack,
 * STACK_SHARED_BYTES: the kernel's own memory for it beyond the page tables
 * (13-15 MiB of kmem in all) and the file pages the processes keep touching
 * (programs, libraries, the model file's metadata): a cgroup charges both,
 * and a plan that left them out was killed at 2 GiB. Plus the npu-worker's
 * prompt buffers, which grow with the model and the stack's max-prefill (the
 * stack config's max-prefill=N, else the one of PREFILL_TOKENS, 1/2 and 1/4
 * of it the planner chooses): prompt_pass_bytes. */
#define PROCESS_BYTES_EACH (10ull << 20)
#define STACK_SHARED_BYTES (32ull << 20)
#define PREFILL_TOKENS STACK_DEFAULT_MAX_PREFILL
/* The share of the cache that is cold slots (LRU) rather than pinned hot bundles is the one of 10, 5, 2
 * and 0 % (at least two layers' needed bundles) predicted fastest, a smaller one only when predicted this
 * much faster than the larger: the cost model counts no reuse between tokens (docs/planner.md). */
#define SMALLER_COLD_MARGIN 0.005

typedef struct {
    const model *m;
    ffn_mode mode;
    int ctx;
    int n_processes;   /* in the stack */
    int threads;       /* decode compute threads in all */
    int cpu_workers;   /* the processes they are in */
    int max_prefill;   /* prompt tokens per prefill step */
    uint64_t side_predictor_bytes; /* a pi2-predictor side file's size, 0: the model's own fc1/fc2 */
    bool io_shares_compute;        /* the io-worker's reads take a compute core's time (stack_conf) */
    bool checksums;                /* bundles checked as they are read */
    const hw_profile *hw;
} layout_inputs;

/* What does not depend on the budget. */
typedef struct {
    uint64_t preload;       /* attention, norms, output, predictors (gate rows in gate-first), KV at ctx */
    uint64_t process;
    uint64_t staging;       /* the prefill's staging slots (ffn_stream_bytes) */
    uint64_t lendable;      /* the npu-worker's prompt buffers and staging: idle between prompts, they hold
                             * more hot bundles meanwhile (docs/offload.md, "Lending") */
    double dense_bytes;     /* weights read densely per token */
    /* the predictor's, read again to ask for a layer's misses ahead (predictor mode): by every
     * cpu-worker (its first stage), and split between them (its second) */
    double guess_whole_bytes, guess_split_bytes;
    size_t gate_row, up_row, down_row, neuron_bytes;
} layout_fixed;

typedef struct {
    const bundle_order *order;
    uint64_t stride;
    uint64_t hot_stride;    /* a hot bundle in memory: its neurons' rows packed, or (every bundle resident,
                             * loaded in place) the stride */
    uint64_t floor;         /* the least budget for this order */
    uint64_t budget;
    bool all_resident;      /* every bundle fits: no cold cache, no staging */
    long *hot_bundles;      /* [n_layer] */
    long *lent_bundles;     /* [n_layer]: after each layer's hot ones, in the lendable memory between prompts */
    long cold_slots;
    int queue_depth;
    int max_prefill;        /* the inputs' prompt tokens per prefill step */
    uint64_t process;       /* the fixed part's processes' memory at that step */
    cost_prediction pred;   /* of decode: the hot and the lent bundles resident */
} layout;

void layout_fixed_of(const layout_inputs *in, layout_fixed *f);
uint64_t layout_stride(const layout_fixed *f, int per_bundle);

/* The layout of `order` under budget (hot_bundles allocated, n_layer longs).
 * Returns 0, or -1 when the budget is under this order's floor (lay->floor
 * says what it is). */
int layout_make(const layout_inputs *in, const layout_fixed *f, const bundle_order *order, uint64_t budget,
                layout *lay);
void layout_free(layout *lay);

#endif

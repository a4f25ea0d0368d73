/* A stack under a memory budget (docs/offload.md): the layout every process
 * of the stack computes alike from the model, the plan (lib/plan/plan_file.h)
 * and the plan's bundle file (lib/plan/bundle.h).
 *
 * Weights segment ("data" region): only the preloaded tensors (attention,
 * the output matrix, the predictor or, in gate-first, every gate row), each
 * file range rounded out to pages and packed, so one O_DIRECT read lands
 * each; then, where the kernels convert an F16 PowerInfer predictor to Q8_0,
 * that copy, made once by cachemgr for every cpu-worker. The FFN rows and
 * the token embedding are not in it: tensors that are not preloaded keep
 * pointing into the model file's mapping (the coordinator reads one
 * embedding row per token from it; nothing else
 * touches them).
 *
 * Neuron cache segment (STACK_SEG_FFN): region "hot" holds each layer's
 * first plan.hot_bundles[l] bundles (the hottest, one sequential range of
 * the bundle file per layer), hot_stride bytes each: the file's stride, or
 * packed (the neurons' rows without the padding that keeps the file's
 * bundles 4096-aligned; their load is staged in the cold region and checked
 * there, cachemgr/loader.c); region "cold" plan.cold_slots bundle-sized
 * slots and region "table" their slot table (stack/neuron_cache.h). Under a
 * plan that lends the prefill's memory, sparse region "lent" holds each
 * layer's next plan.lent_bundles[l] bundles between prompts, and region
 * "lend" the flag that says they are there (offload_lend).
 *
 * A neuron's rows are addressed for the sparse kernels as
 * base + idx * unit (+ gate/up/down sub-offset), base the hot region and unit
 * the largest power of two dividing a page and every row size, so a neuron
 * anywhere in the hot or cold region is one int32 index.
 *
 * Errors: offload_open, offload_cache_attach and offload_lent_regions return
 * -1 or NULL with a message in err (errlen bytes); offload_rebase returns -1
 * with none (out of memory, or a tensor outside the image). The layout
 * accessors cannot fail. */
#ifndef PI2_OFFLOAD_H
#define PI2_OFFLOAD_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/ffn_mode.h"
#include "engine/model.h"
#include "plan.pb-c.h"
#include "plan/bundle.h"
#include "stack/neuron_cache.h"
#include "stack/shm.h"

#define STACK_SEG_FFN "ffn" /* regions "hot", "cold", "table", "pins" [, "lend", "lent"] */

/* Region "lend": whether region "lent" holds its bundles. The npu-worker
 * clears it and gives the pages back before a prompt, and sets it once it
 * has read them again after the prompt; a cpu-worker reads it once a layer
 * step and, while it is clear, finds those bundles through the cold cache. */
typedef struct {
    _Atomic uint32_t ready;
} offload_lend;

/* One page-aligned file range of preloaded tensors, and where it lands. */
typedef struct {
    uint64_t file_offset, bytes; /* multiples of 4096 (the last may end past the file: read short) */
    uint64_t seg_offset;         /* in the weights segment's "data" region */
} preload_range;

typedef struct {
    Pi2__Plan *plan;
    bundle_file bundles;
    char plan_path[PATH_MAX], bundle_path[PATH_MAX];
    ffn_mode mode;                 /* the plan's: FFN_PREDICTOR or FFN_GATE_FIRST */
    bool side_predictor;           /* the plan names a pi2-predictor side file: fc1/fc2 stay unloaded */
    int n_ranges;
    preload_range *ranges;
    uint64_t preload_bytes;        /* the weights segment's "data" region: the ranges, then the predictor copy */
    uint64_t predictor_image_offset, predictor_image_bytes; /* in it: the one Q8_0 copy of an F16 PowerInfer
                                    * predictor every cpu-worker reads (predictor_q8_0_image_bytes; 0: none) */
    uint64_t *hot_offset;          /* [n_layer]: layer l's hot bundles in the hot region */
    uint64_t *lent_offset;         /* [n_layer]: layer l's lent bundles in the lent region */
    uint64_t lent_bytes;           /* 0: the plan lends nothing */
    uint64_t hot_bytes, cold_bytes, table_bytes;
    uint32_t cold_slots;
    size_t stride, gate_bytes, up_bytes, down_bytes, neuron_bytes;
    size_t hot_stride;             /* a hot bundle's bytes in region "hot" (plan_hot_bundle_bytes) */
    int per_bundle;
    long n_bundles;                /* per layer */
    int32_t *pos_of;               /* [n_layer][n_ff]: a neuron's place in its layer's bundle order; NULL
                                    * unless asked for */
    size_t unit;
} offload;

/* Loads and validates the plan at plan_path against m (model_path names it)
 * and the bundle file it names, and computes the layout. positions: also
 * pos_of (the cpu-workers). 0, or -1 with err naming the file and field. */
int offload_open(offload *o, const model *m, const char *model_path, const char *plan_path, bool positions,
                 char *err, size_t errlen);
void offload_close(offload *o);

/* Points every preloaded tensor of m into image (the weights segment's data
 * region, preload_bytes long); the others keep pointing into the file. */
int offload_rebase(const offload *o, model *m, const uint8_t *image, uint64_t image_bytes);

/* The hot region is packed: its bundles are not laid out as the file's. */
static inline bool offload_hot_packed(const offload *o) { return o->hot_stride != o->stride; }

/* Region sizes as the segment is created (a region is never empty). */
static inline uint64_t offload_hot_region_bytes(const offload *o) { return o->hot_bytes ? o->hot_bytes : 4096; }
/* cold_bytes is at least one slot's, for the same reason. */
/* Bytes of the cpu-workers' pin logs (region "pins" of the neuron cache
 * segment): per worker one uint32 per bundle of a layer, each the slot it
 * holds pinned + 1 (0: none), so the process that takes a killed worker's
 * place lets its pins go. */
uint64_t offload_pin_log_bytes(const offload *o, int n_workers);

/* The slot table of neuron cache segment seg (its regions "table" and "cold"), attached (ncache_attach).
 * NULL with err set. */
ncache *offload_cache_attach(shm_segment *seg, char *err, size_t errlen);

/* Regions "lend" and "lent" of neuron cache segment seg under a plan that lends (o->lent_bytes > 0), each
 * checked to hold what o says. 0, or -1 with err set. */
int offload_lent_regions(shm_segment *seg, const offload *o, offload_lend **flag, uint8_t **lent, char *err,
                         size_t errlen);

/* The slot table's shape: (layer, expert 0, bundle) keys, cold-region slots of a bundle's stride. */
ncache_shape offload_cache_shape(const offload *o, const model *m);

/* Layer l's hot bundles in the bundle file: [*file_offset, + *bytes). */
void offload_hot_range(const offload *o, int l, uint64_t *file_offset, uint64_t *bytes);
/* Layer l's lent bundles (those after its hot ones) in the bundle file. */
void offload_lent_range(const offload *o, int l, uint64_t *file_offset, uint64_t *bytes);
/* Bundles of layer l lent between prompts (0 when the plan lends none). */
static inline uint32_t offload_lent_bundles(const offload *o, int l) {
    return o->plan->n_lent_bundles ? o->plan->lent_bundles[l] : 0;
}

#endif

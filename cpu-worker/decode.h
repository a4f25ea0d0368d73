/* One cpu-worker's share of a decode step (docs/stack.md, "Decode"): for a
 * layer, steps A-D with a cross-worker barrier after each; for the output
 * task, the final norm and this worker's logits rows. Every value is computed
 * by the same ops.h call the reference engine makes for it, and a sparse FFN
 * by the same ffn_chunks.h chunks, so the stack's logits are bit-identical to
 * pi2-ref's in the same FFN mode. */
#ifndef PI2_DECODE_H
#define PI2_DECODE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/ffn_chunks.h"

#include "stack/stack_attach.h"

/* Longest a worker waits at a barrier for the others. A dead peer normally
 * releases it sooner: the coordinator starts a new epoch. */
#define DECODE_BARRIER_TIMEOUT_MS 30000

typedef struct decoder decoder;

/* Worker `index` of the stack's n_cpu_workers, computing with n_threads.
 * Private scratch is allocated here, once. NULL on allocation failure (logged). */
/* name: this worker's ("cpu-worker.<index>"), its identity to the io-worker under a budget;
 * realtime_io: its link to the io-worker there at real-time priority (ffn_offload_new). */
decoder *decoder_new(const stack_view *sv, const char *runid, const char *name, int index, int n_threads,
                     bool realtime_io);
void decoder_free(decoder *d);

/* One task. The FFN is chunked (ffn_chunks.h) unless mode is FFN_DENSE on a
 * model with an ffn_down matrix; then chunks[0..n_chunks) are the neuron
 * chunks this worker computes (each once; any order). */
typedef struct {
    int layer, pos;
    uint32_t epoch;
    ffn_mode mode;
    const int32_t *chunks;
    int n_chunks;
    uint32_t share_begin, share_end; /* this worker's cut of the split (stack.h, work_share) */
} decode_step;

/* Whether a task's FFN is chunked. */
bool decoder_ffn_chunked(const decoder *d, ffn_mode mode);
/* Whether this worker can run mode on chunk c (its neuron-major rows are
 * here, the predictor is loaded, gate-first on a ReLU model). */
bool decoder_can_run(const decoder *d, ffn_mode mode, int chunk);

/* layer < n_layer: that layer for the token at pos; layer == n_layer: the
 * output rows. Returns 0 when done, -1 when abandoned (epoch changed or a
 * barrier timed out), DECODE_ERROR when it cannot be done at all (under a
 * budget, weights that could not be read): decoder_error says why. */
#define DECODE_ERROR (-2)
int decoder_run(decoder *d, const decode_step *s);
const char *decoder_error(const decoder *d);

/* Sleep us after each batch of this worker's own FFN chunks: a slow core,
 * for experiments and tests of the chunk stealing (PI2_CHUNK_DELAY). */
void decoder_set_chunk_delay(decoder *d, long us);

/* Adds what happened since the last call to row (this worker's ctl row):
 * the time decoder_run computed, its barrier waits left out (what the
 * coordinator balances the split by, work_balance.h), and under a budget the
 * neuron cache's counts (`pi2 status`, the coordinator). Called after each
 * task, before its answer. */
void decoder_publish_stats(decoder *d, proc_row *row);

/* Logs how many chunks this worker took from others, the neuron cache's
 * counts under a budget, and where the decode time went when
 * PI2_PHASE_TIMES=1 (phase_clock.h). */
void decoder_log_stats(const decoder *d, const char *who);

#endif

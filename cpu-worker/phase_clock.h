/* Where a cpu-worker's decode time goes: the steps of a layer (decode.h) and
 * the barrier waits after them, summed over the worker's life and logged per
 * token when it stops. Off unless PI2_PHASE_TIMES=1 is in the environment
 * (the supervisor passes it on), so the hot path pays one branch per step. */
#ifndef PI2_PHASE_CLOCK_H
#define PI2_PHASE_CLOCK_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    PHASE_PREFETCH,       /* under a budget: the predictor on the layer's input, its misses asked for ahead */
    PHASE_ATTENTION,      /* A: Q/K/V rows, RoPE, KV store, attention */
    PHASE_WAIT_ATTENTION,
    PHASE_ATTN_OUT,       /* B: output projection + residual */
    PHASE_WAIT_ATTN_OUT,
    PHASE_PRED_HIDDEN,    /* predictor mode: this worker's share of the first stage */
    PHASE_WAIT_PRED_HIDDEN,
    PHASE_FFN,            /* C: the FFN (chunks, or dense activations) */
    PHASE_WAIT_FFN,
    PHASE_FFN_OUT,        /* D: chunk reduce, or dense down rows */
    PHASE_WAIT_FFN_OUT,
    PHASE_OUTPUT,         /* the output norm and logits rows */
    PHASE_COUNT
} decode_phase;

typedef struct {
    bool on;
    uint64_t mark_ns;             /* end of the last lap */
    uint64_t ns[PHASE_COUNT];
    uint64_t tokens;              /* output steps run */
} phase_clock;

void phase_clock_init(phase_clock *c);
/* Starts timing a task (its first lap starts now). */
void phase_clock_start(phase_clock *c);
/* Adds the time since the last mark to phase p; marks now. */
void phase_clock_lap(phase_clock *c, decode_phase p);
/* One INFO line: ms per token of every phase, and their sum. */
void phase_clock_log(const phase_clock *c, const char *who);

#endif

/* cachemgr: owner of the run's shared-memory segments (weights, kv, act,
 * ctl). It creates them, or re-attaches them after a restart, and loads the
 * weights through the io-worker. See docs/stack.md. */
#ifndef PI2_CACHEMGR_H
#define PI2_CACHEMGR_H

#include <limits.h>
#include <signal.h>
#include <stdint.h>

#include "engine/model.h"
#include "stack/proc_stop.h"
#include "stack/neuron_cache.h"
#include "stack/offload.h"
#include "stack/shm.h"
#include "stack/stack.h"

/* SEG_FFN exists only under a memory budget; the control segment comes last. */
enum { SEG_WEIGHTS, SEG_KV, SEG_ACT, SEG_FFN, SEG_CTL, SEG_COUNT };

typedef struct {
    const char *runid;
    char model_path[PATH_MAX]; /* absolute: the control block compares it */
    char predictor_path[PATH_MAX]; /* absolute, or empty */
    bool budgeted;             /* --plan: the model under the plan's memory budget (stack/offload.h) */
    offload off;               /* its layout, when budgeted */
    model m;
    stack_params params;       /* asked for on the command line; a kept control block's win */
    int io_timeout_ms;         /* re-send a read batch not answered within this */
    bool small_pages;          /* --small-pages: new segments stay on 4 KiB pages */

    shm_segment *seg[SEG_COUNT];
    uint8_t *weights;          /* the weights segment's "data" region */
    uint64_t weights_bytes;
    stack_ctl *ctl;
    proc_row *row;
} cachemgr;

/* Creates the four segments (prefaulted), or keeps existing ones whose control
 * block matches the model. 0, or -1 with the reason logged. */
int cm_open_segments(cachemgr *c);
void cm_close_segments(cachemgr *c);
/* Bytes the four segments take for c's model and parameters (before page
 * rounding), with the weights' and the KV cache's shares. */
uint64_t cm_segments_bytes(const cachemgr *c, uint64_t *weights, uint64_t *kv);

/* cachemgr --check: the model's tokenizer loads and the segments fit in the
 * memory limit (util/mem_limit.h). Prints "NEED LIMIT SOURCE" and returns 0,
 * or logs one error line and returns 1. */
int cm_preflight(const cachemgr *c);

/* Budgeted, after the load: every hot bundle checked against its checksum,
 * and a fresh slot table over the cold region. 0, or -1 (logged). */
int cm_ready_cache(cachemgr *c);

/* Beats our control-block row with state st. */
void cm_beat(cachemgr *c, enum proc_state st);

/* Reads the model file from weights_file_offset on into the weights region
 * through the io-worker (budgeted: the preloaded tensors, then each layer's
 * hot bundles from the bundle file into the hot region, checked against
 * their checksums, and a fresh slot table), then sets ctl->weights_ready.
 * 0 when loaded, 1 when stopped by a signal, -1 on an error (logged). */
int cm_load_weights(cachemgr *c);

#endif

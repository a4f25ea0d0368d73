/* A compute process's view of a running stack: the model (its tensors
 * pointing into the weights segment), the control block, the KV cache and
 * the activation region, each attached after waiting for cachemgr to create
 * it and checked against the sizes this process computes from the model and
 * the stack parameters.
 * Shared by the coordinator, cpu-worker and npu-worker.
 *
 * Errors: stack_view_open logs why (log_error) and returns -1, silently when
 * *stop ended the wait; the accessors cannot fail. */
#ifndef PI2_STACK_ATTACH_H
#define PI2_STACK_ATTACH_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/model.h"
#include "stack/msg.h"
#include "stack/offload.h"
#include "engine/ops.h"
#include "stack/shm.h"
#include "stack/stack.h"

/* How long a worker waits for cachemgr's segments and for the weights. */
#define STACK_WAIT_MS 120000

typedef struct {
    const char *model_path, *runid;
    int wait_ms;              /* for the segments, then for the weights */
    /* NULL, or the ctl row to claim as soon as the control block is valid and
     * beat PROC_STARTING while the weights load, so `pi2 status` shows the
     * process waiting (workers claim theirs later, in worker_link_open) */
    const char *early_row;
    const volatile sig_atomic_t *stop;
    bool neuron_positions;    /* under a budget, offload.pos_of too: the cpu-workers look neurons up */
} stack_view_spec;

typedef struct {
    model m;
    bool model_loaded;
    shm_segment *ctl_seg, *weights_seg, *kv_seg, *act_seg;
    stack_ctl *ctl;
    proc_row *row;            /* spec.early_row's row, beaten PROC_DEAD on close */
    const uint8_t *weights;   /* the weights segment's "data" region */
    uint64_t weights_bytes;
    uint16_t *k, *v;       /* KV regions, kv_region_bytes(m, n_ctx) each */
    uint64_t kv_bytes;
    uint8_t *act;          /* the "act" region */
    uint64_t act_bytes;
    act_layout layout;
    bool budgeted;            /* the control block names a plan: only the preloaded tensors are in the
                               * weights segment (stack/offload.h) */
    offload off;
} stack_view;

/* Loads the model, waits (polling until wait_ms, or until *stop) for the
 * segments of runid and for weights_ready, and rebases the model into the
 * weights segment (under a budget, its preloaded tensors; s->off then holds
 * the plan's layout). Returns 0, or -1 after logging why (nothing when stopped). */
int stack_view_open(stack_view *s, const stack_view_spec *spec);
void stack_view_close(stack_view *s);

/* Layer l's slice of the shared KV cache. */
kv_layer stack_kv_layer(const stack_view *s, int l);
/* The float array at a byte offset of the act region (offsets come from s->layout
 * or from a validated message). */
float *stack_act_f32(const stack_view *s, uint64_t offset);
/* The limits msg_validate checks this process's messages against. */
void stack_msg_limits(const stack_view *s, msg_limits *lim);

#endif

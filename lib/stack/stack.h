/* The shared-memory contract of the pi2 stack: segment names, the layout of
 * the activation and control segments, the decode work split, and the
 * cross-process barrier. Every process of the stack computes the same layout
 * from the same model and stack parameters, so nothing but offsets and
 * descriptors need travel on the bus. See docs/stack.md.
 *
 * Errors: ctl_check returns -1 with a message in err; model_rebase returns -1
 * with none (a tensor outside the image). NULL from the row lookups (no such
 * row, table full) and -1 from ctl_barrier_wait (epoch changed, timeout) are
 * answers, not faults; the layout arithmetic cannot fail. */
#ifndef PI2_STACK_H
#define PI2_STACK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/ffn_chunks.h"
#include "engine/model.h"
#include "stack/bundle_ring.h"
#include "stack/offload_stats.h"

#define STACK_MAX_PROCS 32
#define STACK_MAX_CPU_WORKERS 16
#define STACK_CTL_MAGIC 0x50493243544c3037ull /* "PI2CTL07" */

/* Segment "what" names: shm name is /pi2-<runid>-<what> (shm_make_name). */
#define STACK_SEG_WEIGHTS "weights" /* region "data": the model file from weights_file_offset on */
#define STACK_SEG_KV "kv"           /* regions "k" and "v" */
#define STACK_SEG_ACT "act"         /* region "act" */
#define STACK_SEG_CTL "ctl"         /* region "ctl": a stack_ctl */

/* max_prefill when neither the stack config nor a plan sets it */
#define STACK_DEFAULT_MAX_PREFILL 512

/* Fixed for the lifetime of a stack (pi2 up ... pi2 down). */
typedef struct {
    int32_t n_ctx;          /* KV cache positions */
    int32_t n_cpu_workers;  /* decode workers sharing each layer */
    int32_t max_prefill;    /* most prompt tokens one PrefillRequest may carry */
    int32_t ffn_mode;       /* enum ffn_mode (ffn_chunks.h) of a generation that does not ask for one */
} stack_params;

/* Byte offsets inside the "act" region (each 64-byte aligned). */
typedef struct {
    uint64_t x_layers;  /* float [n_layer + 1][n_embd]: residual entering layer l; [n_layer] leaves the last */
    uint64_t x_mid;     /* float [n_embd]: residual after the current layer's attention */
    uint64_t att_out;   /* float [n_embd]: attention output, all heads */
    uint64_t hb;        /* float [n_ff]: FFN activations (dense FFN) */
    uint64_t ffn_partials; /* float [ffn_chunk_count][n_embd]: each neuron chunk's FFN output (sparse FFN) */
    uint64_t chunk_queues; /* chunk_queue [n_cpu_workers], ffn_chunk_count entries each (chunk_queue.h) */
    uint64_t logits;    /* float [n_vocab] */
    uint64_t tokens;    /* int32 [max_prefill]: prompt token ids for the npu-worker */
    uint64_t total;     /* bytes of the region */
} act_layout;

void act_layout_compute(act_layout *L, const model *m, const stack_params *p);

/* Bytes of each of the "k" and "v" regions: n_layer * n_ctx * kv_dim F16 values.
 * K is [layer][pos][kv_dim]; V is [layer][kv_dim][n_ctx] (transposed), as in ops.h. */
uint64_t kv_region_bytes(const model *m, int n_ctx);

/* The weights segment holds the model file's bytes from this offset (the data
 * section start rounded down to 4096, so O_DIRECT reads land aligned) to the
 * end of the file, rounded up to 4096. */
uint64_t weights_file_offset(const model *m);
uint64_t weights_region_bytes(const model *m);
/* Point every weight of m (loaded by model_load from the same file) into the
 * segment image instead of the file mapping. Returns 0, or -1 if a tensor
 * falls outside the image. Norm vectors are already private copies. */
int model_rebase(model *m, const void *image, uint64_t image_bytes);

/* ---- the decode work split (deterministic; every process computes the same) ---- */
/* A worker's part of a decode step is one cut [begin, end) of every dimension
 * alike, in units of 1/WORK_SHARE_ONE of each: dimension N gives it items
 * [N * begin / ONE, N * end / ONE), rounded. Neighbours' cuts meet, so the workers'
 * parts cover each dimension once whatever the cuts (work_balance.h moves
 * them), and each item is computed as alone: no split changes a bit. */
#define WORK_SHARE_ONE 65536u
typedef struct {
    uint32_t cut_begin, cut_end;/* the cut all the ranges below come from */
    long kvh_begin, kvh_end;    /* KV heads this worker owns */
    long qh_begin, qh_end;      /* their query heads (GQA groups) */
    long row_begin, row_end;    /* rows of attn_output and ffn_down (n_embd rows) */
    long ff_begin, ff_end;      /* FFN neurons (gate/up rows) */
    long vocab_begin, vocab_end;/* output rows */
} work_share; /* the sparse FFN's chunks: chunk_split.h */

/* The item of a dimension of n where a cut falls: n * cut / WORK_SHARE_ONE
 * rounded to the nearest, so that a cut moving a little around a boundary of
 * coarse items (32 heads: 1/32 of the step each) does not flip one across. */
static inline long work_share_at(long n, uint32_t cut) {
    return (long)(((uint64_t)n * cut + WORK_SHARE_ONE / 2) / WORK_SHARE_ONE);
}
/* Worker `worker`'s cut of the even split: [ONE * worker / n_workers, ...). */
void work_share_even_cut(int worker, int n_workers, uint32_t *begin, uint32_t *end);
void work_share_from_cut(work_share *s, const model *m, uint32_t begin, uint32_t end);
/* the even split's share (work_share_even_cut) */
void work_share_compute(work_share *s, const model *m, int worker, int n_workers);

/* ---- the control segment ---- */
enum proc_state { PROC_EMPTY = 0, PROC_STARTING, PROC_READY, PROC_BUSY, PROC_STOPPING, PROC_DEAD };

typedef struct {
    char name[32];                  /* "coordinator", "cpu-worker.1", ... ; empty = free row */
    _Atomic int32_t pid;
    _Atomic uint32_t state;         /* enum proc_state */
    _Atomic int64_t heartbeat_ms;   /* CLOCK_MONOTONIC ms of the last beat */
    _Atomic uint64_t tokens_served;
    _Atomic uint32_t starts;        /* how many times a process took this row (restarts = starts - 1) */
    offload_counters offload;       /* a cpu-worker's neuron cache under a budget; zero otherwise */
    _Atomic uint64_t busy_ns;       /* a cpu-worker's decode tasks, their barrier waits left out (work_balance.h) */
} proc_row;

typedef struct {
    uint64_t magic;                 /* STACK_CTL_MAGIC */
    stack_params params;
    char model_path[1024];
    uint64_t model_size;            /* of the model file, to refuse attaching with another model */
    char predictor_path[1024];      /* lowrank side file of FFN_PREDICTOR; empty: the model's PWRI fc1/fc2 */
    char plan_path[1024];           /* a stack under a memory budget: its plan file (stack/offload.h); empty:
                                     * the whole model in memory */
    _Atomic uint64_t weights_ready; /* 0 while loading; else the load generation */
    _Atomic uint64_t epoch;         /* decode epoch: bumped by the coordinator to abort in-flight work */
    _Atomic uint64_t barrier;       /* epoch (32) | arrived (16) | phase (16), see ctl_barrier_wait */
    proc_row procs[STACK_MAX_PROCS];
    /* the decode split as the coordinator last set it, for `pi2 status` (work_balance_publish) */
    _Atomic uint32_t split_mode;    /* 0: not set yet; 1: fixed; 2: balanced */
    _Atomic uint32_t split_cut[STACK_MAX_CPU_WORKERS + 1];
    /* under a budget: 1 while the io-worker sleeps on its socket and doorbell, so a worker that queued a
     * batch rings the doorbell (docs/offload.md, "The request ring") */
    _Atomic uint32_t io_sleeping;
    bundle_ring bundle_rings[STACK_MAX_CPU_WORKERS]; /* each cpu-worker's bundle loads; last: left unwritten */
} stack_ctl;

/* Initialise a fresh control block (cachemgr, at creation). */
void ctl_init(stack_ctl *c, const stack_params *p, const char *model_path, uint64_t model_size,
              const char *predictor_path, const char *plan_path);
/* Validate an attached control block against the model this process loaded
 * (model_path is canonicalised, as cachemgr stores it). */
int ctl_check(const stack_ctl *c, const char *model_path, uint64_t model_size, char *err, size_t errlen);

/* The row named name; NULL if none has it. */
proc_row *ctl_proc_find(stack_ctl *c, const char *name);
/* Find the row named name, or claim a free one; bumps starts, sets pid and state. NULL if the table is full. */
proc_row *ctl_proc_claim(stack_ctl *c, const char *name, int32_t pid);
void ctl_proc_beat(proc_row *r, enum proc_state st);   /* heartbeat_ms = now, state = st */

/* Barrier of n decode workers for epoch. Returns 0 when all n arrived, -1 if
 * the epoch changed (work aborted by the coordinator) or timeout_ms passed.
 * Spins briefly, then yields: both cores may be shared. */
int ctl_barrier_wait(stack_ctl *c, uint32_t epoch, int n, int timeout_ms);
/* The i-th wait of a loop polling for another worker: a pause for the first
 * CTL_SPINS, then sched_yield (both cores may be shared). */
#define CTL_SPINS 2000u
void ctl_wait_step(unsigned i);
/* The current step's tag: the same in every worker between two barriers of
 * an epoch, different for the next step (it names the barrier's phase). */
uint32_t ctl_barrier_tag(const stack_ctl *c);
/* Coordinator: start a new epoch (aborts every waiter) with an empty barrier. Returns the new epoch. */
uint32_t ctl_new_epoch(stack_ctl *c);

#endif

/* The coordinator of a pi2 stack (docs/stack.md): it owns the tokenizer, the
 * sampler and the schedule. Workers (DEALERs "cpu-worker.<i>", "npu-worker")
 * reach it on ROUTER "coordinator", clients (`pi2 run`) on ROUTER "client".
 * One generation runs at a time; a client arriving meanwhile waits its turn
 * in a bounded queue, told how many are ahead (queue.c). The process is single-threaded: every wait goes through
 * coord_pump, which serves both sockets, beats the ctl row and checks that
 * the workers are alive. Nothing sent to a client waits: a reply that does
 * not fit the client's queue is dropped, and the generation of a client that
 * left or stopped reading is cancelled (clients.c). */
#ifndef PI2_COORD_H
#define PI2_COORD_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "stack/peer_limit.h"
#include "stack/bus.h"
#include "engine/model.h"
#include "stack/msg.h"
#include "stack/shm.h"
#include "stack/stack.h"
#include "stack/stack_attach.h"
#include "stack/work_balance.h"
#include "engine/tokenizer.h"

#define COORD_DEAD_MS 1000        /* a worker silent on the bus and in its ctl row for this long is lost */
#define COORD_BEAT_MS 100         /* our ctl row */
#define COORD_ALIVE_CHECK_MS 20   /* how often the pump re-checks worker liveness */
#define COORD_MAX_RETRIES 8       /* re-sends of one step before the generation fails */
#define COORD_PROMPT_PROGRESS_MS 250 /* PromptProgress to the client at most this often while the prompt runs */
#define COORD_CLIENT_STALL_MS 500 /* the generation's client queue full this long: it stopped reading */
#define COORD_CLIENT_LOST (-2)    /* a step's or the decode's result: the client left or stopped reading */
#define COORD_QUEUE_MAX 16        /* generations waiting their turn; one more is refused STACK_BUSY */
#define COORD_QUEUE_TELL_MS 1000  /* GenerateQueued to each waiting client this often */

typedef struct {
    const char *model_path, *runid;
    bool no_npu;
    int task_timeout_ms;    /* no TaskDone of a running decode step for this long: re-send it */
    int prefill_stall_ms;   /* no layer of a running prefill finished for this long: re-send it */
    int worker_wait_ms;     /* how long a generation waits for lost cpu-workers to come back */
    int npu_wait_ms;        /* ... for a lost npu-worker, before prefilling with decode tasks */
    int startup_wait_ms;    /* for cachemgr's segments and the weights */
    const char *split;      /* the decode work split: auto, even or weights (work_balance_parse) */
} coord_options;

/* One worker the stack expects: cpu-worker.<i>, or the npu-worker. */
typedef struct {
    char name[32];          /* its DEALER identity and ctl row name */
    uint32_t worker_id;     /* ours, sent in RegisterAck (never 0) */
    bool registered;        /* a Register from the process now behind this name */
    uint32_t pid;           /* from Register */
    bool alive;             /* last liveness verdict (bus or ctl row within COORD_DEAD_MS) */
    uint64_t faults;        /* restarts and losses seen: a step it takes part in is re-sent */
    int64_t asked_ms;       /* when we last asked it to register (it beat unregistered) */
} worker;

/* What the running step waits for. */
typedef struct {
    bool active;
    bool on_npu;                                 /* a PrefillRequest, else DecodeTasks */
    int n_tasks;                                 /* DecodeTasks per cpu-worker */
    uint64_t first_seq[STACK_MAX_CPU_WORKERS];   /* Envelope.seq of each worker's layer-0 task */
    int n_done[STACK_MAX_CPU_WORKERS];           /* TaskDones so far, in layer order */
    uint64_t prefill_seq;
    bool prefill_done;
    uint32_t prefill_layers;                     /* layers the npu-worker reported done (PrefillProgress) */
    bool failed;                                 /* a worker answered TASK_FAILED */
    char error[1024];                            /* a worker's TASK_ERROR (or the npu-worker's error): why
                                                  * the step cannot be done; ends the generation */
    int64_t progress_ms;                         /* last completion or progress report */
} step_state;

/* The prompt of the running generation, for the client's PromptProgress. */
typedef struct {
    bool active;
    int n_prompt;           /* tokens in all */
    int n_done;             /* tokens through every layer, before the running step */
    int chunk_n;            /* tokens of the running prefill step on the npu-worker (0: none) */
    int64_t t0_ms, sent_ms;
} prompt_state;

/* A GenerateRequest accepted while idle, copied out of its message. */
typedef struct {
    bool pending;
    uint8_t client[BUS_PEER_MAX];
    size_t client_len;
    char *prompt;           /* NUL-terminated, malloc'ed */
    uint32_t n_predict;
    float temp, top_p;
    int top_k;
    uint64_t seed;
    bool ignore_eos;
    Pi2__FfnMode ffn_mode;  /* the request's (unspecified: the stack's) */
    uint32_t max_wait_ms;   /* how long it may wait its turn (0: not at all) */
    int64_t queued_ms, told_ms; /* waiting: since when, and when it was last told so */
} gen_request;

typedef struct {
    coord_options opt;
    /* the stack */
    stack_view sv;            /* the model, the segments and our ctl row */
    tokenizer *tok;
    stack_params params;      /* as the control block had them when we attached */
    msg_limits lim;
    /* the decode work split (work_balance.h), and each cpu-worker's FFN chunks (chunk_split.h) as one
     * (first neuron, count) pair, or none (n_chunk_ranges 0): a chunked FFN's DecodeTask cluster, made
     * for the split's cuts when any worker can run any chunk, else once for the even split */
    work_balance balance;
    double *chunk_cost;       /* chunk_costs of the model */
    bool chunks_follow_split; /* every worker has every chunk's rows (the file's, or the neuron cache's) */
    uint32_t chunk_cuts[STACK_MAX_CPU_WORKERS + 1]; /* the cuts chunk_ranges were made for */
    uint32_t chunk_ranges[STACK_MAX_CPU_WORKERS][2];
    int n_chunk_ranges[STACK_MAX_CPU_WORKERS];
    /* the bus */
    bus_ctx *bus;
    bus_socket *workers_sock, *client_sock;
    struct bus_peers peers;   /* last message from each worker identity */
    worker cpu[STACK_MAX_CPU_WORKERS];
    worker npu;
    /* the schedule */
    uint32_t epoch;
    uint64_t faults_at_epoch; /* coord_faults() when epoch was started */
    uint64_t seq, session;
    step_state step;
    prompt_state prompt;
    gen_request req;
    gen_request waiting[COORD_QUEUE_MAX]; /* in arrival order */
    int n_waiting;
    bool busy;
    bool client_lost;         /* the running generation's client left or stopped reading: cancel it */
    int64_t client_full_ms;   /* since when its queue has been full (0: it is not) */
    uint64_t replies_dropped; /* to any client, because its queue was full or it had left */
    peer_limit refusals;      /* per client: Errors for its bad requests, with their WARN lines */
    peer_limit drop_notes;    /* per peer: WARN lines about what we dropped without an answer */
    int64_t next_beat_ms, alive_checked_ms;
    const volatile sig_atomic_t *stop;
} coord;

/* segments.c: waits for cachemgr's segments and the weights (lib/stack/stack_attach.h), loads the tokenizer. */
int coord_attach(coord *c);
/* c->chunk_ranges for the split's cuts now, if they moved and the chunks follow the split. */
void coord_chunk_ranges_update(coord *c);
void coord_detach(coord *c);

/* events.c (the event pump): waits up to timeout_ms for messages on both sockets and handles them. */
int coord_open_bus(coord *c);
void coord_close_bus(coord *c);
void coord_pump(coord *c, int timeout_ms);
/* Packs and sends env to a worker or client identity; fills in version and seq. Returns BUS_OK or < 0. */
int coord_send(coord *c, bus_socket *s, const void *peer, size_t peer_len, Pi2__Envelope *env);

/* workers.c */
void workers_init(coord *c);
void workers_on_message(coord *c, const struct bus_msg *bm, Pi2__Envelope *env);
void workers_check_alive(coord *c, int64_t now_ms);
uint64_t coord_faults(const coord *c);
bool cpu_workers_ready(const coord *c);
bool npu_ready(const coord *c);
/* Marks w lost (a send to it failed, or it stalled). */
void worker_lost(worker *w, const char *why);

/* clients.c */
void clients_on_message(coord *c, const struct bus_msg *bm, Pi2__Envelope *env);
/* Refuses a client's message: an Error and a WARN line, both at most one a
 * second per peer (the line counts what was held back meanwhile). */
void client_refuse(coord *c, const struct bus_msg *bm, Pi2__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* An Error to any client, without waiting: BUS_OK, or the reason it was dropped (and counted). */
int client_error_to(coord *c, const uint8_t *peer, size_t peer_len, uint64_t session, Pi2__ErrorCode code,
                    const char *text);
/* To the client of the running generation. They wait (pumping) while its
 * queue is full, until it reads or is given up on; 0, or -1 once c->client_lost. */
int client_send_error(coord *c, Pi2__ErrorCode code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int client_send_piece(coord *c, uint32_t index, int32_t token, const char *piece, size_t len);
/* offload: the generation's neuron-cache counts under a budget, else NULL. */
int client_send_done(coord *c, uint32_t n_prompt, uint32_t n_generated, double prompt_ms, double decode_ms,
                     Pi2__GenerateStatus status, const offload_tally *offload);
/* PromptProgress to the client of the running generation, unless one went
 * out less than COORD_PROMPT_PROGRESS_MS ago (dropped if its queue is full);
 * called from the pump. */
void client_prompt_progress(coord *c);
/* Called from the pump: gives up on a client whose queue stayed full for COORD_CLIENT_STALL_MS. */
void client_check_stall(coord *c, int64_t now_ms);
void gen_request_clear(gen_request *r);
/* The request's fields copied out of its message (the prompt malloc'ed); -1 when out of memory. */
int gen_request_fill(gen_request *r, const struct bus_msg *bm, const Pi2__GenerateRequest *g);

/* queue.c: generations waiting their turn. queue_offer takes a GenerateRequest that arrived while one
 * runs (refused STACK_BUSY if it may not wait, the queue is full, or its client already has one);
 * queue_tick, from the pump, tells each waiting client how many are ahead and gives up on those past
 * their wait or gone; queue_next makes the first, if any, the pending generation once the slot is free;
 * queue_close answers every waiting client SHUTTING_DOWN. */
void queue_offer(coord *c, const struct bus_msg *bm, const Pi2__GenerateRequest *g);
void queue_tick(coord *c, int64_t now_ms);
void queue_next(coord *c);
void queue_close(coord *c);

/* steps.c: one step of the schedule, re-sent after worker faults until it completes.
 * Return 0, the ErrorCode to give the client (SHUTTING_DOWN, WORKER_LOST, INTERNAL),
 * or COORD_CLIENT_LOST (the workers' part of the step is then aborted). */
int step_decode(coord *c, int32_t token, int pos, bool want_logits, ffn_mode mode);
/* Prefill tokens[0..n) at positions [pos0, pos0 + n) on the npu-worker (n <= max_prefill); prompt_end: the
 * prompt's last chunk, after which the npu-worker lends its buffers to decode.
 * Returns 0, an ErrorCode, COORD_CLIENT_LOST, or -1 when the npu-worker did not come back (prefill otherwise). */
int step_prefill_npu(coord *c, const int32_t *tokens, int n, int pos0, bool prompt_end);
/* Aborts whatever the workers still do for the current epoch. */
void coord_new_epoch(coord *c);

/* generate.c: serves c->req from tokenization to GenerateDone. */
void generate_serve(coord *c);

#endif

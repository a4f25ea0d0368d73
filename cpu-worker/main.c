/* cpu-worker: executes its share of every decode layer (docs/stack.md,
 * "Decode") for the coordinator, in arrival order, with the other cpu-workers
 * meeting at barriers in the control segment. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stack/exit_codes.h"
#include "util/cli.h"
#include "util/clock.h"
#include "decode.h"
#include "util/log.h"
#include "stack/stack_attach.h"
#include "stack/worker_args.h"
#include "stack/worker_link.h"

/* After a task, how long to poll for the next one before sleeping: it
 * covers the coordinator's turn between two tokens (0.7-1.2 ms measured). */
#define HOT_WAIT_US 3000

static void usage(FILE *f) {
    fputs("usage: cpu-worker -m MODEL.gguf -i INDEX [-r RUNID] [-t THREADS]\n"
          "Decode worker INDEX (0 .. cpu-workers - 1) of the pi2 stack RUNID: computes its share of\n"
          "every layer's heads, rows and FFN neurons for the coordinator.\n"
          "  -i, --index N        worker index\n"
          "      --no-realtime    under a memory budget, leave the thread that carries the bundle requests\n"
          "                       to the io-worker at normal priority (default: SCHED_FIFO when allowed)\n",
          f);
    worker_args_help(f, 1, "task");
    fputs("  PI2_CHUNK_DELAY=I:N  worker I sleeps N us after each batch of its own FFN chunks (a slow core:\n"
          "                       the others take its remaining chunks)\n"
          "  PI2_PHASE_TIMES=1    log the decode time per step and barrier at exit\n"
          "  PI2_PREFETCH=0       under a memory budget, do not ask for a layer's predicted misses before\n"
          "                       its attention (they are then asked for when its FFN step selects them)\n",
          f);
}

/* PI2_CHUNK_DELAY=INDEX:US: the delay for this worker (0 if it names another). */
static int chunk_delay_for(int index, long *us) {
    *us = 0;
    const char *env = getenv("PI2_CHUNK_DELAY");
    if (!env || !*env) return 0;
    char *colon = strchr(env, ':');
    if (!colon) {
        log_error("PI2_CHUNK_DELAY='%s': expected INDEX:MICROSECONDS", env);
        return -1;
    }
    char which[16];
    int len = (int)(colon - env);
    snprintf(which, sizeof which, "%.*s", len < 15 ? len : 15, env);
    int i;
    if (cli_parse_int(which, "PI2_CHUNK_DELAY's index", 0, STACK_MAX_CPU_WORKERS - 1, &i) ||
        cli_parse_long(colon + 1, "PI2_CHUNK_DELAY's microseconds", 0, 1000000, us))
        return -1;
    if (i != index) *us = 0;
    return 0;
}

typedef struct {
    const worker_args *o;
    stack_view *sv;
    worker_link *link;
    decoder *dec;
    int32_t *chunks; /* [ffn_chunk_count]: a task's chunk list */
} worker;

static void reply(worker *w, const Pi2__Envelope *req, Pi2__TaskStatus status, uint64_t time_us, const char *error) {
    const Pi2__DecodeTask *t = req->decode_task;
    Pi2__TaskDone done = PI2__TASK_DONE__INIT;
    done.task_seq = req->seq;
    done.worker_id = w->link->worker_id;
    done.layer = t->layer;
    done.out_offset = t->out_offset;
    done.out_length = t->out_length;
    done.time_us = time_us;
    done.status = status;
    done.error = (char *)(error ? error : "");
    Pi2__Envelope env;
    msg_envelope_init(&env, 0, req->session);
    env.body_case = PI2__ENVELOPE__BODY_TASK_DONE;
    env.task_done = &done;
    worker_link_send(w->link, &env);
}

/* The task as a decode_step: its clusters' ranges must be whole neuron chunks,
 * each named once, that this worker can run. -1 (logged) otherwise. */
static int task_step(worker *w, const Pi2__DecodeTask *t, decode_step *s) {
    const model *m = &w->sv->m;
    *s = (decode_step){(int)t->layer, (int)t->position, t->epoch, FFN_DENSE, w->chunks, 0, t->share_begin,
                       t->share_end};
    if (!t->share_end) work_share_even_cut(w->o->index, w->sv->ctl->params.n_cpu_workers, &s->share_begin, &s->share_end);
    if ((int)t->layer == m->n_layer) return 0;
    work_share share;
    work_share_from_cut(&share, m, s->share_begin, s->share_end);
    if (t->head_begin != share.qh_begin || t->head_end != share.qh_end) {
        log_error("layer %u task: heads [%u, %u) are not those of its share [%u, %u) (heads [%ld, %ld))", t->layer,
                  t->head_begin, t->head_end, s->share_begin, s->share_end, share.qh_begin, share.qh_end);
        return -1;
    }
    s->mode = ffn_mode_from_wire(t->ffn_mode, FFN_DENSE); /* msg_validate refused 0 and values past the modes */
    if (!decoder_ffn_chunked(w->dec, s->mode)) return 0;
    const long size = ffn_chunk_neurons(m), n_chunks = ffn_chunk_count(m);
    for (size_t c = 0; c < t->n_clusters; c++) {
        const Pi2__NeuronCluster *cl = t->clusters[c];
        if (cl->n_neuron_ids || cl->n_slot_offsets) {
            log_error("layer %u task: cluster %zu names neurons one by one; a %s FFN takes whole chunks", t->layer, c,
                      ffn_mode_name(s->mode));
            return -1;
        }
        for (size_t r = 0; r + 1 < cl->n_ranges; r += 2) { /* msg_validate: pairs inside n_ff */
            long begin = cl->ranges[r], end = begin + (long)cl->ranges[r + 1];
            if (begin % size || (end % size && end != m->n_ff)) {
                log_error("layer %u task: neurons [%ld, %ld) are not whole chunks of %ld", t->layer, begin, end, size);
                return -1;
            }
            for (long ch = begin / size; ch < (end + size - 1) / size; ch++) {
                if (s->n_chunks == n_chunks) {
                    log_error("layer %u task names more than the %ld chunks", t->layer, n_chunks);
                    return -1;
                }
                for (int k = 0; k < s->n_chunks; k++)
                    if (w->chunks[k] == ch) {
                        log_error("layer %u task names chunk %ld twice", t->layer, ch);
                        return -1;
                    }
                if (!decoder_can_run(w->dec, s->mode, (int)ch)) {
                    log_error("layer %u task: cannot run chunk %ld in %s mode here (no neuron-major rows or no "
                              "predictor: the stack was started with another --ffn)", t->layer, ch,
                              ffn_mode_name(s->mode));
                    return -1;
                }
                w->chunks[s->n_chunks++] = (int32_t)ch;
            }
        }
    }
    return 0;
}

/* A task of an epoch the coordinator has left behind is dropped unexecuted
 * (TASK_FAILED), as is one whose barrier the coordinator aborted. */
static void run_task(void *ctx, const Pi2__Envelope *req) {
    worker *w = ctx;
    const Pi2__DecodeTask *t = req->decode_task;
    uint32_t current = (uint32_t)atomic_load(&w->sv->ctl->epoch);
    if (t->epoch != current) {
        log_debug("dropped layer %u task of epoch %u (now %u)", t->layer, t->epoch, current);
        reply(w, req, PI2__TASK_STATUS__TASK_FAILED, 0, NULL);
        return;
    }
    decode_step step;
    if (task_step(w, t, &step)) {
        reply(w, req, PI2__TASK_STATUS__TASK_FAILED, 0, NULL);
        return;
    }
    if (w->o->task_delay_us) usleep((useconds_t)w->o->task_delay_us);
    worker_link_set_state(w->link, PROC_BUSY);
    uint64_t t0 = clock_us();
    int rc = decoder_run(w->dec, &step);
    uint64_t took = clock_us() - t0;
    decoder_publish_stats(w->dec, w->link->row);
    worker_link_set_state(w->link, PROC_READY);
    if (rc == DECODE_ERROR) {
        log_error("layer %u task at position %u: %s", t->layer, t->position, decoder_error(w->dec));
        reply(w, req, PI2__TASK_STATUS__TASK_ERROR, took, decoder_error(w->dec));
        return;
    }
    if (rc) {
        log_info("layer %u task at position %u abandoned (epoch %u ended or a barrier timed out)", t->layer,
                 t->position, t->epoch);
        reply(w, req, PI2__TASK_STATUS__TASK_FAILED, took, NULL);
        return;
    }
    if ((int)t->layer == w->sv->m.n_layer) atomic_fetch_add(&w->link->row->tokens_served, 1);
    if (!t->quiet) reply(w, req, PI2__TASK_STATUS__TASK_OK, took, NULL);
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    worker_args o;
    if (worker_args_parse(argc, argv, &o, 1, STACK_MAX_CPU_WORKERS - 1, usage)) return PI2_EXIT_USAGE;
    proc_stop_on_signals();
    stack_view sv;
    stack_view_spec spec = {.model_path = o.model_path, .runid = o.runid, .wait_ms = STACK_WAIT_MS, .stop = &proc_stop,
                            .neuron_positions = true};
    if (stack_view_open(&sv, &spec)) return proc_stop ? 0 : 1;
    int status = 1;
    worker_link link = {0};
    decoder *dec = NULL;
    int n_workers = sv.ctl->params.n_cpu_workers;
    if (o.index >= n_workers) {
        log_error("-i %d: the stack has %d cpu-worker%s (indices 0..%d)", o.index, n_workers, n_workers == 1 ? "" : "s",
                  n_workers - 1);
        goto out;
    }
    long chunk_delay_us;
    if (chunk_delay_for(o.index, &chunk_delay_us)) goto out;
    char name[32];
    snprintf(name, sizeof name, "cpu-worker.%d", o.index);
    if (!(dec = decoder_new(&sv, o.runid, name, o.index, o.n_threads, o.realtime_io))) goto out;
    decoder_set_chunk_delay(dec, chunk_delay_us);
    if (worker_link_open(&link, sv.ctl, o.runid, name, PI2__PROCESS_KIND__CPU, (uint32_t)o.index,
                         (uint32_t)o.n_threads))
        goto out;
    link.hot_wait_us = HOT_WAIT_US;
    worker_link_set_state(&link, PROC_READY);
    log_info("%s ready: %d thread%s, model %s", name, o.n_threads, o.n_threads == 1 ? "" : "s", o.model_path);
    worker w = {&o, &sv, &link, dec, calloc((size_t)ffn_chunk_count(&sv.m), sizeof(int32_t))};
    if (!w.chunks) {
        log_error("out of memory");
        goto out;
    }
    msg_limits lim;
    stack_msg_limits(&sv, &lim);
    worker_link_serve(&link, &lim, PI2__ENVELOPE__BODY_DECODE_TASK, run_task, &w);
    log_info("stopping");
    decoder_log_stats(dec, name);
    free(w.chunks);
    status = 0;
out:
    worker_link_close(&link);
    decoder_free(dec);
    stack_view_close(&sv);
    return status;
}

#include "decode.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stack/chunk_queue.h"
#include "engine/chunk_split.h"
#include "util/calloc_flagged.h"
#include "util/clock.h"
#include "kernels/kernels.h"
#include "util/log.h"
#include "phase_clock.h"
#include "engine/predictor.h"
#include "ffn_offload.h"
#include "kernels/sparse_kernels.h"
#include "stack/worker_link.h"
#include "util/threadpool.h"

struct decoder {
    const stack_view *sv;
    const model *m;
    const kernels *k;
    stack_ctl *ctl;
    threadpool *pool;
    work_share share;
    int n_workers, kv_dim;
    /* the shared activations (act region) */
    float *x_layers, *x_mid, *att_out, *hb, *logits;
    /* private scratch */
    float *xb;                    /* normalized input, [n_embd] */
    float *q, *kv_k, *kv_v;       /* [n_embd], [kv_dim], [kv_dim]: only own rows are written */
    float *proj;                  /* [n_embd]: own rows of Wo / down before the residual add */
    uint16_t *q16;                /* [n_embd] */
    float *rope_cs;               /* [head_dim]: rope_angles at rope_pos (-1: none yet) */
    int rope_pos;
    float *scores;                /* [n_head][n_ctx], indexed by absolute head as attention_heads wants */
    uint16_t *probs16;            /* [n_head][n_ctx] */
    act_vec in;                   /* conversions of the current input, up to max(n_embd, n_ff) */
    /* the chunked FFN (ffn_chunks.h) */
    float *partials;              /* act region: [n_chunks][n_embd] */
    const sparse_kernels *gather, *axpy;
    ffn_scratch *scratch;         /* [n_threads] */
    int n_threads;
    weight *down_t;               /* [n_layer][n_chunks]: built rows of own chunks (rows 0 elsewhere), or NULL */
    int n_chunks;
    void *queues;                 /* act region: every worker's chunk_queue */
    bool steal;                   /* the chunks' rows are in the shared segment: take other workers' chunks */
    _Atomic uint64_t stolen;      /* chunks taken from other workers' queues */
    long chunk_delay_us;          /* PI2_CHUNK_DELAY: sleep after each batch of own chunks (a slow core) */
    predictor *pred;              /* loaded when the stack's mode is FFN_PREDICTOR */
    act_vec pred_conv;
    int index;                    /* this worker's number: its share of the predictor's first stage */
    ffn_offload *offload;         /* under a memory budget: the FFN rows come from the neuron cache */
    float *ahead_hidden;          /* [predictor max rank]: the predictor's first stage on a layer's input, when
                                   * the offloaded FFN asks for its bundles ahead (NULL: it does not) */
    offload_tally published;      /* its counts as last added to the ctl row */
    char error[1024];             /* why the last decoder_run returned DECODE_ERROR */
    phase_clock clock;
    uint64_t busy_ns;             /* decoder_run's time without its barrier waits, not yet published */
    uint64_t wait_ns;             /* at the barriers, in all */
};

/* ---- parallel jobs ---- */

/* Rows [r0, r1) of up to three weights over one converted input, split as one range over the pool. */
typedef struct {
    const weight *w;
    float *out;
    long r0, r1;
} row_span;

typedef struct {
    decoder *d;
    int n;
    row_span s[3];
} rows_job;

/* The thread's share of the spans' rows, taken as one range over them. */
static void rows_worker(void *ctx, int ith, int nth) {
    rows_job *j = ctx;
    long total = 0;
    for (int i = 0; i < j->n; i++) total += j->s[i].r1 - j->s[i].r0;
    long begin, end, base = 0;
    pool_split(total, ith, nth, &begin, &end);
    for (int i = 0; i < j->n; i++) {
        const row_span *s = &j->s[i];
        const long rows = s->r1 - s->r0;
        const long lo = begin > base ? begin - base : 0, hi = end - base < rows ? end - base : rows;
        if (lo < hi) matvec_rows(j->d->k, s->w, &j->d->in, s->out, s->r0 + lo, s->r0 + hi);
        base += rows;
    }
}

static void run_rows(decoder *d, int n, row_span a, row_span b, row_span c) {
    rows_job j = {d, n, {a, b, c}};
    pool_run(d->pool, rows_worker, &j);
}

typedef struct {
    decoder *d;
    int layer, pos;
} layer_job;

static void attention_worker(void *ctx, int ith, int nth) {
    layer_job *j = ctx;
    decoder *d = j->d;
    kv_layer kv = stack_kv_layer(d->sv, j->layer);
    long h0, h1;
    pool_split(d->share.qh_end - d->share.qh_begin, ith, nth, &h0, &h1);
    attention_heads(d->k, d->m, &kv, d->q16, j->pos, d->scores, d->probs16, d->att_out, d->share.qh_begin + h0,
                    d->share.qh_begin + h1);
}

static void ffn_worker(void *ctx, int ith, int nth) {
    layer_job *j = ctx;
    decoder *d = j->d;
    long i0, i1;
    pool_split(d->share.ff_end - d->share.ff_begin, ith, nth, &i0, &i1);
    ffn_act_rows(d->k, d->m, &d->m->layers[j->layer], &d->in, d->hb, d->share.ff_begin + i0,
                 d->share.ff_begin + i1, NULL);
}

/* A task's chunks: this worker's queue, taken by its threads, then (when
 * the rows are shared) what is left in the other workers' queues. */
typedef struct {
    decoder *d;
    ffn_layer f;
    uint32_t tag, epoch;
} chunks_job;

/* How much of what is left in its queue a thread takes at once: all, for a
 * thread alone that nobody takes from (one gather over its chunks); else
 * about half a share, which leaves something to balance at the end. */
static int take_divisor(const decoder *d, int nth) { return nth == 1 && !d->steal ? 1 : 2 * nth; }

/* Takes and runs other workers' chunks, one at a time, until every queue of
 * this step is empty; waits for a worker that has not published its queue
 * yet (it passed the same barrier, so it is about to). */
static void steal_chunks(chunks_job *j, float *partials, ffn_scratch *scratch) {
    decoder *d = j->d;
    for (unsigned spins = 0;;) {
        bool took = false, pending = false;
        for (int v = 1; v < d->n_workers && !took; v++) {
            const int victim = (d->index + v) % d->n_workers;
            int32_t chunk;
            int r = chunk_queue_steal(chunk_queue_at(d->queues, d->n_chunks, victim), j->tag, &chunk);
            if (r == 1) {
                ffn_chunks_run(&j->f, &chunk, 1, partials, scratch, NULL, NULL);
                if (atomic_fetch_add(&d->stolen, 1) == 0)
                    log_info("took layer %d's chunk %d from cpu-worker.%d (the first; the count is logged at exit)",
                             j->f.layer, chunk, victim);
                took = true;
            }
            pending |= r < 0;
        }
        if (!took && !pending) return;
        if (!took) {
            if ((uint32_t)atomic_load(&d->ctl->epoch) != j->epoch) return; /* abandoned: the barrier reports it */
            ctl_wait_step(spins++);
        }
    }
}

static void chunks_worker(void *ctx, int ith, int nth) {
    chunks_job *j = ctx;
    decoder *d = j->d;
    chunk_queue *own = chunk_queue_at(d->queues, d->n_chunks, d->index);
    const int32_t *taken;
    for (int k; (k = chunk_queue_take(own, j->tag, take_divisor(d, nth), &taken)) > 0;) {
        ffn_chunks_run(&j->f, taken, k, d->partials, &d->scratch[ith], NULL, NULL);
        if (d->chunk_delay_us) usleep((useconds_t)d->chunk_delay_us);
    }
    if (d->steal) steal_chunks(j, d->partials, &d->scratch[ith]);
}

/* ---- the steps ---- */

static void convert(decoder *d, const float *x, int n, const weight *w0, const weight *w1, const weight *w2) {
    const weight *ws[3] = {w0, w1, w2};
    act_convert_for(d->k, &d->in, x, n, ws, w2 ? 3 : w1 ? 2 : 1);
}

/* Ends step `step` (timed), then waits for the other workers: the wait is
 * timed as the phase after it (phase_clock.h lists each step's wait next). */
static int barrier(decoder *d, uint32_t epoch, decode_phase step) {
    phase_clock_lap(&d->clock, step);
    uint64_t t0 = clock_ns();
    int rc = ctl_barrier_wait(d->ctl, epoch, d->n_workers, DECODE_BARRIER_TIMEOUT_MS);
    d->wait_ns += clock_ns() - t0;
    phase_clock_lap(&d->clock, step + 1);
    return rc;
}

/* Stores this worker's KV heads at pos. kv_store writes a whole kv_dim
 * vector, so it gets a view of the cache narrowed to our heads: K row pos
 * starts at our first head, V columns start at our first head's rows. */
static void store_own_kv(decoder *d, const kv_layer *kv, int pos) {
    long hd = d->m->head_dim, c0 = d->share.kvh_begin * hd, c1 = d->share.kvh_end * hd;
    kv_layer own = {kv->k + (size_t)pos * kv->kv_dim + c0, kv->v + (size_t)c0 * kv->n_ctx + pos, kv->n_ctx,
                    (int)(c1 - c0)};
    kv_store(d->k, &own, 0, d->kv_k + c0, d->kv_v + c0);
}

/* The entries of the predictor's hidden vector this worker computes. */
static void own_hidden_rows(const decoder *d, int l, long *r0, long *r1) {
    long rank = predictor_rank(d->pred, l);
    *r0 = work_share_at(rank, d->share.cut_begin), *r1 = work_share_at(rank, d->share.cut_end);
}

/* Under a budget, before attention: the predictor on the layer's input
 * (x before attention, which attention changes little) names the neurons
 * likely to fire, and their missing bundles are read while attention runs
 * (ffn_offload_prefetch); not for a layer the plan pins whole. Private
 * buffers only: the other workers are in their own attention. d->xb and
 * d->pred_conv are overwritten later. */
static void step_prefetch(decoder *d, const decode_step *s) {
    const model *m = d->m;
    const int l = s->layer;
    if (!ffn_offload_ahead_begin(d->offload, l)) return;
    const float *x = d->x_layers + (size_t)l * m->n_embd;
    predictor_prepare(d->pred, l, x, predictor_guess_ffn_in(d->pred, l, x, d->xb), d->ahead_hidden, &d->pred_conv);
    const ffn_layer f = {.m = m, .k = d->k, .layer = l, .mode = FFN_PREDICTOR, .pred = d->pred,
                         .pred_hidden = &d->pred_conv};
    ffn_offload_prefetch(d->offload, &f, s->chunks, s->n_chunks, d->pool, d->scratch);
}

/* A: own Q/K/V rows, RoPE, KV store, attention for own query heads -> att_out. */
static void step_attention(decoder *d, const decode_step *st) {
    const int l = st->layer, pos = st->pos;
    const model *m = d->m;
    const layer_weights *w = &m->layers[l];
    long hd = m->head_dim, q0 = d->share.qh_begin * hd, q1 = d->share.qh_end * hd;
    long c0 = d->share.kvh_begin * hd, c1 = d->share.kvh_end * hd;
    rmsnorm(d->xb, d->x_layers + (size_t)l * m->n_embd, w->attn_norm, m->n_embd, m->rms_eps);
    convert(d, d->xb, m->n_embd, &w->wq, &w->wk, &w->wv);
    run_rows(d, 3, (row_span){&w->wq, d->q, q0, q1}, (row_span){&w->wk, d->kv_k, c0, c1},
             (row_span){&w->wv, d->kv_v, c0, c1});
    if (pos != d->rope_pos) { /* every layer of a token rotates by the same angles */
        rope_angles(d->rope_cs, (int)hd, pos, m->rope_base);
        d->rope_pos = pos;
    }
    rope_apply(d->q + q0, (int)(d->share.qh_end - d->share.qh_begin), (int)hd, d->rope_cs);
    rope_apply(d->kv_k + c0, (int)(d->share.kvh_end - d->share.kvh_begin), (int)hd, d->rope_cs);
    kv_layer kv = stack_kv_layer(d->sv, l);
    store_own_kv(d, &kv, pos);
    d->k->f32_to_f16_row(d->q + q0, d->q16 + q0, (int)(q1 - q0));
    layer_job j = {d, l, pos};
    pool_run(d->pool, attention_worker, &j);
}

/* out[r] = residual[r] + proj[r] over own rows: the reference's x += W.in, element by element. */
static void add_residual(const decoder *d, float *out, const float *residual) {
    for (long r = d->share.row_begin; r < d->share.row_end; r++) out[r] = residual[r] + d->proj[r];
}

/* B: x_mid = x_layers[l] + Wo . att_out, own rows. */
static void step_attn_output(decoder *d, int l) {
    const model *m = d->m;
    const weight *wo = &m->layers[l].wo;
    convert(d, d->att_out, m->n_embd, wo, NULL, NULL);
    run_rows(d, 1, (row_span){wo, d->proj, d->share.row_begin, d->share.row_end}, (row_span){0}, (row_span){0});
    add_residual(d, d->x_mid, d->x_layers + (size_t)l * m->n_embd);
}

/* C: FFN activations of own neurons -> hb. */
static void step_ffn_act(decoder *d, int l) {
    const model *m = d->m;
    const layer_weights *w = &m->layers[l];
    rmsnorm(d->xb, d->x_mid, w->ffn_norm, m->n_embd, m->rms_eps);
    convert(d, d->xb, m->n_embd, &w->gate, &w->up, NULL);
    layer_job j = {d, l, 0};
    pool_run(d->pool, ffn_worker, &j);
}

/* The predictor's first stage, shared: this worker's entries of the hidden
 * vector into act.hb (which a chunked FFN does not use otherwise), then,
 * once every worker's are in, the whole vector converted for the second
 * stage. Each worker reads 1/n of the first stage's weights, not all. */
static int share_predictor_hidden(decoder *d, const decode_step *s) {
    const int l = s->layer;
    long r0, r1;
    own_hidden_rows(d, l, &r0, &r1);
    predictor_hidden_rows(d->pred, l, d->x_mid, d->xb, r0, r1, d->hb, &d->pred_conv);
    if (barrier(d, s->epoch, PHASE_PRED_HIDDEN)) return -1;
    predictor_hidden_done(d->pred, l, d->hb, &d->pred_conv);
    return 0;
}

/* C, chunked: the task's neuron chunks -> their partials in act. 0, -1 or DECODE_ERROR. */
static int step_ffn_chunks(decoder *d, const decode_step *s) {
    const model *m = d->m;
    const int l = s->layer;
    const layer_weights *w = &m->layers[l];
    rmsnorm(d->xb, d->x_mid, w->ffn_norm, m->n_embd, m->rms_eps);
    convert(d, d->xb, m->n_embd, &w->gate, &w->up, NULL);
    chunks_job j = {.d = d,
                    .f = {.m = m, .k = d->k, .gather = d->gather, .axpy = d->axpy, .layer = l, .mode = s->mode,
                          .in = &d->in, .down_t = &w->down_t, .pred = d->pred, .pred_hidden = &d->pred_conv},
                    .epoch = s->epoch};
    if (d->down_t) j.f.down_t_chunks = &d->down_t[(size_t)l * d->n_chunks];
    if (s->mode == FFN_PREDICTOR && share_predictor_hidden(d, s)) return -1;
    if (d->offload)
        return ffn_offload_run(d->offload, &j.f, s->chunks, s->n_chunks, d->partials, d->pool, d->scratch, s->epoch,
                               d->error, sizeof d->error) < 0 ? DECODE_ERROR : 0;
    j.tag = ctl_barrier_tag(d->ctl); /* after the step's last barrier: the same in every worker */
    chunk_queue_publish(chunk_queue_at(d->queues, d->n_chunks, d->index), j.tag, s->chunks, s->n_chunks);
    pool_run(d->pool, chunks_worker, &j);
    return 0;
}

/* D, chunked: x_layers[l + 1] = x_mid + the chunks' partials in chunk order, own rows. */
static void step_ffn_reduce(decoder *d, int l) {
    const model *m = d->m;
    ffn_reduce_rows(m, d->partials, d->x_mid, d->x_layers + (size_t)(l + 1) * m->n_embd, d->share.row_begin,
                    d->share.row_end);
}

/* D: x_layers[l + 1] = x_mid + down . hb, own rows. */
static void step_ffn_down(decoder *d, int l) {
    const model *m = d->m;
    const weight *down = &m->layers[l].down;
    convert(d, d->hb, m->n_ff, down, NULL, NULL);
    run_rows(d, 1, (row_span){down, d->proj, d->share.row_begin, d->share.row_end}, (row_span){0}, (row_span){0});
    add_residual(d, d->x_layers + (size_t)(l + 1) * m->n_embd, d->x_mid);
}

static void step_output(decoder *d) {
    const model *m = d->m;
    rmsnorm(d->xb, d->x_layers + (size_t)m->n_layer * m->n_embd, m->output_norm, m->n_embd, m->rms_eps);
    convert(d, d->xb, m->n_embd, &m->output, NULL, NULL);
    run_rows(d, 1, (row_span){&m->output, d->logits, d->share.vocab_begin, d->share.vocab_end}, (row_span){0},
             (row_span){0});
}

bool decoder_ffn_chunked(const decoder *d, ffn_mode mode) { return ffn_mode_chunked(d->m, mode); }

bool decoder_can_run(const decoder *d, ffn_mode mode, int chunk) {
    if (d->offload) return mode == d->sv->off.mode; /* the plan's mode: the FFN rows are not all here */
    if (!decoder_ffn_chunked(d, mode)) return true;
    if (ffn_mode_refusal(d->m, mode, d->pred != NULL)) return false;
    if (d->m->layers[0].down_t.data) return true;
    return d->down_t && d->down_t[chunk].data; /* built here (for every layer alike) */
}

static int run_step(decoder *d, const decode_step *s) {
    const int layer = s->layer;
    if (layer == d->m->n_layer) {
        step_output(d);
        phase_clock_lap(&d->clock, PHASE_OUTPUT);
        return 0;
    }
    bool chunked = decoder_ffn_chunked(d, s->mode);
    if (d->ahead_hidden && s->mode == FFN_PREDICTOR) step_prefetch(d, s);
    phase_clock_lap(&d->clock, PHASE_PREFETCH);
    step_attention(d, s);
    if (barrier(d, s->epoch, PHASE_ATTENTION)) return -1;
    step_attn_output(d, layer);
    if (barrier(d, s->epoch, PHASE_ATTN_OUT)) return -1;
    if (chunked) {
        int rc = step_ffn_chunks(d, s);
        if (rc) return rc;
    } else {
        step_ffn_act(d, layer);
    }
    if (barrier(d, s->epoch, PHASE_FFN)) return -1;
    if (chunked) step_ffn_reduce(d, layer);
    else step_ffn_down(d, layer);
    return barrier(d, s->epoch, PHASE_FFN_OUT); /* the next layer reads every row of x_layers[layer + 1] */
}

int decoder_run(decoder *d, const decode_step *s) {
    phase_clock_start(&d->clock);
    if (s->share_begin != d->share.cut_begin || s->share_end != d->share.cut_end) /* work_balance.h moved it */
        work_share_from_cut(&d->share, d->m, s->share_begin, s->share_end);
    uint64_t t0 = clock_ns(), waited = d->wait_ns;
    int rc = run_step(d, s);
    uint64_t took = clock_ns() - t0, wait = d->wait_ns - waited;
    d->busy_ns += took > wait ? took - wait : 0;
    return rc;
}

void decoder_set_chunk_delay(decoder *d, long us) {
    d->chunk_delay_us = us;
    if (d->offload) ffn_offload_set_compute_delay(d->offload, us);
}

const char *decoder_error(const decoder *d) { return d->error; }

void decoder_publish_stats(decoder *d, proc_row *row) {
    atomic_fetch_add(&row->busy_ns, d->busy_ns);
    d->busy_ns = 0;
    if (!d->offload) return;
    const offload_tally now = *ffn_offload_get_stats(d->offload);
    if (now.layers == d->published.layers) return; /* no FFN step since the last time */
    const offload_tally step = offload_tally_delta(&now, &d->published);
    offload_counters_add(&row->offload, &step);
    d->published = now;
}

static void log_offload_stats(const decoder *d, const char *who) {
    const offload_tally t = *ffn_offload_get_stats(d->offload);
    const ffn_prefetch_tally a = *ffn_offload_get_prefetch_stats(d->offload);
    if (a.steps)
        log_info("%s guessed its misses ahead on %llu of %llu layer steps (not on a layer the plan pins whole)", who,
                 (unsigned long long)a.guessed, (unsigned long long)a.steps);
    if (a.asked)
        log_info("%s asked ahead for %llu bundles: %.1f%% of them needed and there in time, %.1f%% needed and "
                 "still being read, %.1f%% not needed; %.1f%% of the misses asked for ahead",
                 who, (unsigned long long)a.asked, 100.0 * (double)(t.read_ahead - a.late) / a.asked,
                 100.0 * a.late / a.asked, 100.0 * (double)(a.asked - t.read_ahead) / a.asked,
                 t.misses ? 100.0 * t.read_ahead / t.misses : 0.0);
    const offload_rates r = offload_tally_rates(&t);
    log_info("%s neuron cache over %llu tokens: %.1f%% hot, %.1f%% cold hits, %.1f%% read (%.1f bundles, %.3f MB "
             "per token); FFN %.3f ms per layer, %.1f%% of it waiting for reads",
             who, (unsigned long long)t.tokens, 100 * r.hot, 100 * r.cold, 100 * r.read, r.bundles_per_token,
             r.bytes_per_token / 1e6, r.ms_per_layer, 100 * r.wait_share);
}

void decoder_log_stats(const decoder *d, const char *who) {
    phase_clock_log(&d->clock, who);
    if (d->offload) log_offload_stats(d, who);
    if (d->steal) log_info("%s took %llu chunks from other workers", who, (unsigned long long)atomic_load(&d->stolen));
}

/* ---- set-up ---- */

/* The neuron-major down rows of this worker's chunks, when the file has no
 * ffn_down_t and the stack runs a sparse mode: each worker transposes only its
 * own chunks (memory and time split over the workers). */
static int build_down_t(decoder *d) {
    const model *m = d->m;
    int bounds[STACK_MAX_CPU_WORKERS + 1] = {0}, bad = chunk_split_model(m, d->n_workers, bounds) != 0;
    const int first = bounds[d->index], end = bounds[d->index + 1];
    d->down_t = calloc_flagged((size_t)m->n_layer * (size_t)d->n_chunks, sizeof *d->down_t, &bad);
    uint64_t t0 = clock_us(), bytes = 0;
    for (int l = 0; l < m->n_layer && !bad; l++)
        for (int ch = first; ch < end && !bad; ch++) {
            long n0, n1, row0;
            void *built;
            weight *dt = &d->down_t[(size_t)l * d->n_chunks + (size_t)ch];
            ffn_chunk_range(m, ch, &n0, &n1);
            if (ffn_down_t_for(&m->layers[l], n0, n1, dt, &row0, &built)) bad = 1;
            else bytes += (uint64_t)dt->rows * dt->row_bytes;
        }
    if (bad) {
        log_error("out of memory building the neuron-major down rows of this worker's chunks");
        return -1;
    }
    log_info("built neuron-major down rows of chunks %d-%d of %d: %.1f MB in %.2f s", first, end - 1, d->n_chunks,
             bytes / 1e6, (clock_us() - t0) / 1e6);
    return 0;
}

/* PI2_PREFETCH=0 turns off asking for a layer's bundles before its attention (to measure what it gains). */
static bool ahead_wanted(void) {
    const char *env = getenv("PI2_PREFETCH");
    return !env || strcmp(env, "0") != 0;
}

static int sparse_setup(decoder *d, const char *runid, const char *name, bool realtime_io) {
    const model *m = d->m;
    const stack_ctl *ctl = d->sv->ctl;
    ffn_mode mode = (ffn_mode)ctl->params.ffn_mode;
    d->n_chunks = ffn_chunk_count(m);
    /* under a budget a worker computes its own chunks: their rows are pinned by the worker that asked for them */
    d->steal = !d->sv->budgeted && d->n_workers > 1 && m->layers[0].down_t.data && d->n_chunks <= CHUNK_QUEUE_MAX;
    if (d->sv->budgeted && !(d->offload = ffn_offload_new(d->sv, runid, name, d->index, realtime_io))) return -1;
    if (mode != FFN_DENSE && !d->sv->budgeted && !m->layers[0].down_t.data && build_down_t(d)) return -1;
    if (mode != FFN_PREDICTOR) return 0;
    char err[512];
    const offload *o = &d->sv->off;
    d->pred = d->sv->budgeted && o->predictor_image_bytes
                  ? predictor_load_shared(m, d->sv->weights + o->predictor_image_offset, o->predictor_image_bytes,
                                          err, sizeof err)
                  : predictor_load(m, ctl->predictor_path[0] ? ctl->predictor_path : NULL, err, sizeof err);
    if (!d->pred) {
        log_error("%s", err);
        return -1;
    }
    int rank = predictor_max_rank(d->pred), wide = rank > m->n_embd ? rank : m->n_embd, bad = 0;
    if (rank > m->n_ff) { /* its hidden vector lives in act.hb; such a predictor would cost more than the FFN */
        log_error("predictor rank %d exceeds the FFN's %ld neurons", rank, (long)m->n_ff);
        return -1;
    }
    d->pred_conv.f16 = calloc_flagged((size_t)wide, sizeof(uint16_t), &bad);
    d->pred_conv.q8 = calloc_flagged((size_t)wide / QK8_0 + 1, sizeof(block_q8_0), &bad);
    if (d->offload && ahead_wanted()) d->ahead_hidden = calloc_flagged((size_t)rank, sizeof(float), &bad);
    if (bad) log_error("out of memory allocating the predictor's buffers");
    return bad ? -1 : 0;
}

decoder *decoder_new(const stack_view *sv, const char *runid, const char *name, int index, int n_threads,
                     bool realtime_io) {
    decoder *d = calloc(1, sizeof *d);
    if (!d) { log_error("out of memory"); return NULL; }
    const model *m = &sv->m;
    d->sv = sv;
    d->m = m;
    d->k = kernels_best();
    d->ctl = sv->ctl;
    d->n_workers = sv->ctl->params.n_cpu_workers;
    d->kv_dim = m->n_head_kv * m->head_dim;
    d->index = index;
    phase_clock_init(&d->clock);
    work_share_compute(&d->share, m, index, d->n_workers); /* until a task names another */

    const act_layout *L = &sv->layout;
    d->x_layers = stack_act_f32(sv, L->x_layers);
    d->x_mid = stack_act_f32(sv, L->x_mid);
    d->att_out = stack_act_f32(sv, L->att_out);
    d->hb = stack_act_f32(sv, L->hb);
    d->logits = stack_act_f32(sv, L->logits);

    int bad = 0;
    size_t n_ctx = (size_t)sv->ctl->params.n_ctx, wide = (size_t)(m->n_ff > m->n_embd ? m->n_ff : m->n_embd);
    d->pool = pool_new(n_threads);
    bad |= !d->pool;
    d->xb = calloc_flagged((size_t)m->n_embd, sizeof(float), &bad);
    d->q = calloc_flagged((size_t)m->n_embd, sizeof(float), &bad);
    d->kv_k = calloc_flagged((size_t)d->kv_dim, sizeof(float), &bad);
    d->kv_v = calloc_flagged((size_t)d->kv_dim, sizeof(float), &bad);
    d->proj = calloc_flagged((size_t)m->n_embd, sizeof(float), &bad);
    d->q16 = calloc_flagged((size_t)m->n_embd, sizeof(uint16_t), &bad);
    d->rope_cs = calloc_flagged((size_t)m->head_dim, sizeof(float), &bad);
    d->rope_pos = -1;
    d->scores = calloc_flagged((size_t)m->n_head * n_ctx, sizeof(float), &bad);
    d->probs16 = calloc_flagged((size_t)m->n_head * n_ctx, sizeof(uint16_t), &bad);
    d->in.f16 = calloc_flagged(wide, sizeof(uint16_t), &bad);
    d->in.q8 = calloc_flagged(wide / QK8_0 + 1, sizeof(block_q8_0), &bad);
    d->partials = stack_act_f32(sv, L->ffn_partials);
    d->queues = stack_act_f32(sv, L->chunk_queues);
    d->gather = d->k->gather;
    d->axpy = d->k->sparse;
    d->n_threads = d->pool ? pool_size(d->pool) : 0;
    d->scratch = calloc_flagged((size_t)d->n_threads, sizeof *d->scratch, &bad);
    for (int t = 0; t < d->n_threads && d->scratch; t++) bad |= ffn_scratch_init(&d->scratch[t], m) != 0;
    if (bad) {
        log_error("out of memory allocating the decoder's scratch");
        decoder_free(d);
        return NULL;
    }
    if (sparse_setup(d, runid, name, realtime_io)) {
        decoder_free(d);
        return NULL;
    }
    return d;
}

void decoder_free(decoder *d) {
    if (!d) return;
    if (d->down_t)
        for (size_t i = 0; i < (size_t)d->m->n_layer * (size_t)d->n_chunks; i++) free((void *)d->down_t[i].data);
    free(d->down_t);
    predictor_free(d->pred);
    ffn_offload_free(d->offload);
    free(d->pred_conv.f16); free(d->pred_conv.q8); free(d->ahead_hidden);
    if (d->scratch)
        for (int t = 0; t < d->n_threads; t++) ffn_scratch_free(&d->scratch[t]);
    free(d->scratch);
    pool_free(d->pool);
    free(d->xb); free(d->q); free(d->kv_k); free(d->kv_v); free(d->proj); free(d->q16); free(d->rope_cs);
    free(d->scores); free(d->probs16); free(d->in.f16); free(d->in.q8);
    free(d);
}

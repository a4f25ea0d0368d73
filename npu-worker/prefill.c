#include "prefill.h"

#include <stdlib.h>
#include <string.h>

#include "engine/ffn_stream.h"
#include "engine/prompt.h"
#include "pinned_rows.h"
#include "util/log.h"
#include "util/threadpool.h"

struct prefiller {
    stack_view *sv;
    threadpool *pool;
    prompt_pass *pass;
    ffn_stream *stream;    /* under a budget: the FFN weights, a piece of neurons at a time */
    pinned_rows *pinned;   /* ... whose pinned neurons' rows are copied, not read; NULL: all read */
    uint64_t streamed, copied; /* its totals at the end of the last run */
    double waited_s, read_s;
    char error[512];
};

typedef struct {
    prefiller *p;
    uint32_t epoch;
    prefill_tick tick;
    void *tick_ctx;
} run_ctx;

static kv_layer stack_kv(void *ctx, int layer) { return stack_kv_layer(((run_ctx *)ctx)->p->sv, layer); }

/* A piece of layer l's FFN from the staging area (the pass's prompt_ffn_source);
 * the read of the next piece starts. */
static int stage_piece(void *ctx, int l, long n0, layer_weights *piece, long *n1) {
    prefiller *p = ctx;
    return ffn_stream_piece(p->stream, l, n0, piece, n1, p->error, sizeof p->error);
}

/* before each layer: abandoned when the epoch moved on; after each: the progress report */
static int step(void *ctx, int layers_done) {
    run_ctx *r = ctx;
    prefiller *p = r->p;
    if ((uint32_t)atomic_load(&p->sv->ctl->epoch) != r->epoch) return -1;
    if (layers_done > 0 && r->tick) r->tick(r->tick_ctx, layers_done);
    return 0;
}

const char *prefiller_error(const prefiller *p) { return p->error; }

/* what the last run streamed: whether the reads kept ahead of the pass */
static void log_streamed(prefiller *p) {
    uint64_t bytes, copied;
    double waited_s, read_s;
    ffn_stream_stats(p->stream, &bytes, &copied, &waited_s, &read_s);
    const double mb = (double)(bytes - p->streamed) / 1e6, busy_s = read_s - p->read_s;
    log_info("FFN rows streamed: %.0f MB read and %.0f MB copied from pinned bundles in %.3f s (%.0f MB/s read); "
             "the pass waited %.3f s for them", mb, (double)(copied - p->copied) / 1e6, busy_s,
             busy_s > 0 ? mb / busy_s : 0, waited_s - p->waited_s);
    p->streamed = bytes, p->copied = copied, p->waited_s = waited_s, p->read_s = read_s;
}

int prefiller_run(prefiller *p, const int32_t *tokens, int n, int first, uint32_t epoch, prefill_tick tick,
                  void *tick_ctx) {
    const stack_view *sv = p->sv;
    const model *m = &sv->m;
    run_ctx r = {p, epoch, tick, tick_ctx};
    const prompt_ffn_source staged = {stage_piece, p};
    p->error[0] = 0;
    if (p->stream) { /* no read ahead still copying from a segment pinned_rows_source may let go */
        ffn_stream_set_resident(p->stream, NULL);
        ffn_stream_set_resident(p->stream, pinned_rows_source(p->pinned));
    }
    const int rc = prompt_pass_run(p->pass, tokens, n, first, stack_kv, &r, step, &r, p->stream ? &staged : NULL);
    if (p->stream) log_streamed(p);
    if (rc) return p->error[0] ? PREFILL_ERROR : -1;
    /* the last token's residual and logits, as the decode output task leaves them */
    memcpy(stack_act_f32(sv, sv->layout.x_layers) + (size_t)m->n_layer * m->n_embd,
           prompt_pass_last_residual(p->pass, n), sizeof(float) * (size_t)m->n_embd);
    prompt_pass_logits(p->pass, n, stack_act_f32(sv, sv->layout.logits));
    return 0;
}

prefiller *prefiller_new(stack_view *sv, const char *runid, int n_threads) {
    prefiller *p = calloc(1, sizeof *p);
    if (!p || !(p->pool = pool_new(n_threads))) {
        log_error("out of memory");
        prefiller_free(p);
        return NULL;
    }
    p->sv = sv;
    char err[160];
    p->pass = prompt_pass_new(&sv->m, kernels_best(), p->pool, sv->ctl->params.max_prefill, sv->ctl->params.n_ctx,
                              err, sizeof err);
    if (!p->pass) {
        log_error("%s", err);
        prefiller_free(p);
        return NULL;
    }
    if (sv->budgeted) { /* gate-first keeps every gate row in memory */
        const unsigned which = ffn_stream_prefill_which(sv->off.mode);
        const long step = prompt_pass_neuron_step(&sv->m);
        if (!(p->stream = ffn_stream_open(&sv->m, sv->ctl->model_path, which, step, p->error, sizeof p->error))) {
            log_error("%s", p->error);
            prefiller_free(p);
            return NULL;
        }
        log_info("under the plan's budget: the prompt's FFN weights stream through %.1f MiB of staging, %ld neurons "
                 "at a time", ffn_stream_bytes(&sv->m, which, step) / 1048576.0,
                 ffn_stream_piece_neurons(&sv->m, which, step));
        p->pinned = pinned_rows_open(sv, runid);
    }
    return p;
}

void prefiller_release(prefiller *p) {
    prompt_pass_release(p->pass);
    if (p->stream) ffn_stream_release(p->stream);
}

void prefiller_free(prefiller *p) {
    if (!p) return;
    ffn_stream_close(p->stream);
    pinned_rows_close(p->pinned);
    prompt_pass_free(p->pass);
    pool_free(p->pool);
    free(p);
}

#include "prefill.h"

#include <stdlib.h>
#include <string.h>

#include "engine/ffn_stream.h"
#include "engine/prompt.h"
#include "util/log.h"
#include "util/threadpool.h"

struct prefiller {
    stack_view *sv;
    threadpool *pool;
    prompt_pass *pass;
    ffn_stream *stream;    /* under a budget: the FFN weights, a layer at a time */
    char error[512];
};

typedef struct {
    prefiller *p;
    uint32_t epoch;
    prefill_tick tick;
    void *tick_ctx;
} run_ctx;

static kv_layer stack_kv(void *ctx, int layer) { return stack_kv_layer(((run_ctx *)ctx)->p->sv, layer); }

/* Layer l's FFN weights from the staging area; the read of the next layer
 * starts (after the last one, layer 0's: the next block of a long prompt
 * starts there). */
static int stage_layer(prefiller *p, int l) {
    model *m = &p->sv->m;
    layer_weights lw;
    if (ffn_stream_layer(p->stream, l, l + 1 < m->n_layer ? l + 1 : 0, &lw, p->error, sizeof p->error)) return -1;
    m->layers[l] = lw; /* the layer as it is, its streamed tensors pointing into the staging slot */
    return 0;
}

/* before each layer: abandoned when the epoch moved on (or its weights could
 * not be read); after each: the progress report */
static int step(void *ctx, int layers_done) {
    run_ctx *r = ctx;
    prefiller *p = r->p;
    if ((uint32_t)atomic_load(&p->sv->ctl->epoch) != r->epoch) return -1;
    if (layers_done > 0 && r->tick) r->tick(r->tick_ctx, layers_done);
    if (p->stream && layers_done < p->sv->m.n_layer && stage_layer(p, layers_done)) return -1;
    return 0;
}

const char *prefiller_error(const prefiller *p) { return p->error; }

int prefiller_run(prefiller *p, const int32_t *tokens, int n, int first, uint32_t epoch, prefill_tick tick,
                  void *tick_ctx) {
    const stack_view *sv = p->sv;
    const model *m = &sv->m;
    run_ctx r = {p, epoch, tick, tick_ctx};
    p->error[0] = 0;
    if (prompt_pass_run(p->pass, tokens, n, first, stack_kv, &r, step, &r)) return p->error[0] ? PREFILL_ERROR : -1;
    /* the last token's residual and logits, as the decode output task leaves them */
    memcpy(stack_act_f32(sv, sv->layout.x_layers) + (size_t)m->n_layer * m->n_embd,
           prompt_pass_last_residual(p->pass, n), sizeof(float) * (size_t)m->n_embd);
    prompt_pass_logits(p->pass, n, stack_act_f32(sv, sv->layout.logits));
    return 0;
}

prefiller *prefiller_new(stack_view *sv, int n_threads) {
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
        unsigned which = FFN_STREAM_UP | FFN_STREAM_DOWN | (sv->off.mode == FFN_GATE_FIRST ? 0 : FFN_STREAM_GATE);
        if (!(p->stream = ffn_stream_open(&sv->m, sv->ctl->model_path, which, p->error, sizeof p->error))) {
            log_error("%s", p->error);
            prefiller_free(p);
            return NULL;
        }
        log_info("under the plan's budget: the prompt's FFN weights stream through %.1f MiB of staging",
                 ffn_stream_bytes(&sv->m, which) / 1048576.0);
    }
    return p;
}

void prefiller_free(prefiller *p) {
    if (!p) return;
    ffn_stream_close(p->stream);
    prompt_pass_free(p->pass);
    pool_free(p->pool);
    free(p);
}

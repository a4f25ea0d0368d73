#include "prefill.h"

#include <stdlib.h>
#include <string.h>

#include "engine/prompt.h"
#include "util/log.h"
#include "util/threadpool.h"

struct prefiller {
    const stack_view *sv;
    threadpool *pool;
    prompt_pass *pass;
};

typedef struct {
    const stack_view *sv;
    uint32_t epoch;
    prefill_tick tick;
    void *tick_ctx;
} run_ctx;

static kv_layer stack_kv(void *ctx, int layer) { return stack_kv_layer(((run_ctx *)ctx)->sv, layer); }

/* before each layer: abandoned when the epoch moved on; after each: the progress report */
static int step(void *ctx, int layers_done) {
    run_ctx *r = ctx;
    if ((uint32_t)atomic_load(&r->sv->ctl->epoch) != r->epoch) return -1;
    if (layers_done > 0 && r->tick) r->tick(r->tick_ctx, layers_done);
    return 0;
}

int prefiller_run(prefiller *p, const int32_t *tokens, int n, int first, uint32_t epoch, prefill_tick tick,
                  void *tick_ctx) {
    const stack_view *sv = p->sv;
    const model *m = &sv->m;
    run_ctx r = {sv, epoch, tick, tick_ctx};
    if (prompt_pass_run(p->pass, tokens, n, first, stack_kv, &r, step, &r)) return -1;
    /* the last token's residual and logits, as the decode output task leaves them */
    memcpy(stack_act_f32(sv, sv->layout.x_layers) + (size_t)m->n_layer * m->n_embd,
           prompt_pass_last_residual(p->pass, n), sizeof(float) * (size_t)m->n_embd);
    prompt_pass_logits(p->pass, n, stack_act_f32(sv, sv->layout.logits));
    return 0;
}

prefiller *prefiller_new(const stack_view *sv, int n_threads) {
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
    return p;
}

void prefiller_free(prefiller *p) {
    if (!p) return;
    prompt_pass_free(p->pass);
    pool_free(p->pool);
    free(p);
}

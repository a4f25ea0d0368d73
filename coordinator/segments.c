/* The coordinator's view of the stack: lib/stack/stack_attach.h's (segments, model
 * rebased into the weights, our ctl row claimed while the weights load) plus
 * the tokenizer and the limits of the workers' messages. */
#include <stdlib.h>
#include <string.h>

#include "engine/chunk_split.h"
#include "coord.h"
#include "util/log.h"

/* c->chunk_ranges from chunk bounds[0..n_workers]. */
static void chunk_ranges_set(coord *c, const int *bounds) {
    const model *m = &c->sv.m;
    for (int i = 0; i < c->params.n_cpu_workers; i++) {
        c->n_chunk_ranges[i] = 0;
        if (bounds[i] == bounds[i + 1]) continue;
        long n0, n1, last0;
        ffn_chunk_range(m, bounds[i], &n0, &last0);
        ffn_chunk_range(m, bounds[i + 1] - 1, &last0, &n1);
        c->chunk_ranges[i][0] = (uint32_t)n0, c->chunk_ranges[i][1] = (uint32_t)(n1 - n0);
        c->n_chunk_ranges[i] = 2;
    }
}

void coord_chunk_ranges_update(coord *c) {
    const int n = c->params.n_cpu_workers;
    if (!c->chunks_follow_split || !memcmp(c->chunk_cuts, c->balance.cut, sizeof(uint32_t) * (size_t)(n + 1)))
        return;
    double at[STACK_MAX_CPU_WORKERS + 1];
    int bounds[STACK_MAX_CPU_WORKERS + 1];
    for (int k = 0; k <= n; k++) at[k] = (double)c->balance.cut[k] / WORK_SHARE_ONE;
    chunk_split_at(c->chunk_cost, ffn_chunk_count(&c->sv.m), n, at, bounds);
    chunk_ranges_set(c, bounds);
    memcpy(c->chunk_cuts, c->balance.cut, sizeof(uint32_t) * (size_t)(n + 1));
}

/* The split and the chunks' costs; the even split's chunk ranges. A worker
 * that builds its chunks' neuron-major down rows itself (a GGUF file without
 * them) has only its even share's: the chunks then stay where they are. */
static int split_make(coord *c) {
    const model *m = &c->sv.m;
    const int n_workers = c->params.n_cpu_workers;
    char err[256];
    if (work_balance_parse(&c->balance, c->opt.split, n_workers, err, sizeof err)) {
        log_error("--split: %s", err);
        return -1;
    }
    work_balance_publish(&c->balance, c->sv.ctl);
    int bounds[STACK_MAX_CPU_WORKERS + 1];
    if (!(c->chunk_cost = malloc(sizeof(double) * (size_t)ffn_chunk_count(m)))) {
        log_error("out of memory");
        return -1;
    }
    chunk_costs(m, c->chunk_cost);
    chunk_split(c->chunk_cost, ffn_chunk_count(m), n_workers, bounds);
    chunk_ranges_set(c, bounds);
    for (int i = 0; i < n_workers; i++)
        if (c->n_chunk_ranges[i])
            log_info("cpu-worker.%d: FFN chunks %d-%d of %d (neurons %u-%u) in the even split", i, bounds[i],
                     bounds[i + 1] - 1, ffn_chunk_count(m), c->chunk_ranges[i][0],
                     c->chunk_ranges[i][0] + c->chunk_ranges[i][1] - 1);
    memset(c->chunk_cuts, 0, sizeof c->chunk_cuts); /* no cuts yet: the first update makes the ranges */
    c->chunks_follow_split = c->sv.budgeted || m->layers[0].down_t.data;
    coord_chunk_ranges_update(c);
    return 0;
}

int coord_attach(coord *c) {
    stack_view_spec spec = {.model_path = c->opt.model_path, .runid = c->opt.runid,
                            .wait_ms = c->opt.startup_wait_ms, .early_row = "coordinator", .stop = c->stop};
    if (stack_view_open(&c->sv, &spec)) return -1;
    char err[512];
    if (!(c->tok = tokenizer_from_gguf(&c->sv.m.gguf, err, sizeof err))) {
        log_error("%s: %s", c->opt.model_path, err);
        return -1;
    }
    if (tokenizer_n_vocab(c->tok) != c->sv.m.n_vocab)
        log_warn("tokenizer has %d tokens, the model %d", tokenizer_n_vocab(c->tok), c->sv.m.n_vocab);
    c->params = c->sv.ctl->params;
    stack_msg_limits(&c->sv, &c->lim);
    return split_make(c);
}

void coord_detach(coord *c) {
    free(c->chunk_cost);
    c->chunk_cost = NULL;
    tokenizer_free(c->tok);
    c->tok = NULL;
    stack_view_close(&c->sv);
}

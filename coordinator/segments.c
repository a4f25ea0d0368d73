/* The coordinator's view of the stack: lib/stack_attach's (segments, model
 * rebased into the weights, our ctl row claimed while the weights load) plus
 * the tokenizer and the limits of the workers' messages. */
#include "engine/chunk_split.h"
#include "coord.h"
#include "util/log.h"

/* c->chunk_ranges: what a chunked FFN's DecodeTasks name for each worker,
 * its chunks as one range of neurons (start, length); none when it has none. */
static int chunk_ranges_make(coord *c) {
    const model *m = &c->sv.m;
    const int n_workers = c->params.n_cpu_workers;
    int bounds[STACK_MAX_CPU_WORKERS + 1];
    if (chunk_split_model(m, n_workers, bounds)) {
        log_error("out of memory");
        return -1;
    }
    for (int i = 0; i < n_workers; i++) {
        c->n_chunk_ranges[i] = 0;
        if (bounds[i] == bounds[i + 1]) continue;
        long n0, n1, last0;
        ffn_chunk_range(m, bounds[i], &n0, &last0);
        ffn_chunk_range(m, bounds[i + 1] - 1, &last0, &n1);
        c->chunk_ranges[i][0] = (uint32_t)n0, c->chunk_ranges[i][1] = (uint32_t)(n1 - n0);
        c->n_chunk_ranges[i] = 2;
        log_info("cpu-worker.%d: FFN chunks %d-%d of %d (neurons %ld-%ld)", i, bounds[i], bounds[i + 1] - 1,
                 ffn_chunk_count(m), n0, n1 - 1);
    }
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
    return chunk_ranges_make(c);
}

void coord_detach(coord *c) {
    tokenizer_free(c->tok);
    c->tok = NULL;
    stack_view_close(&c->sv);
}

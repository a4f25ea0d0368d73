/* The coordinator's view of the stack: lib/stack_attach's (segments, model
 * rebased into the weights, our ctl row claimed while the weights load) plus
 * the tokenizer and the limits of the workers' messages. */
#include "chunk_split.h"
#include "coord.h"
#include "log.h"

#include <stdlib.h>

/* c->chunk_ranges: what a chunked FFN's DecodeTasks name for each worker,
 * neighbouring chunks as one range (start, length). */
static int chunk_ranges_make(coord *c) {
    const model *m = &c->sv.m;
    const int n_chunks = ffn_chunk_count(m);
    int32_t *own = malloc(sizeof(int32_t) * (size_t)n_chunks);
    for (int i = 0; own && i < c->params.n_cpu_workers; i++) {
        int n_own = chunk_split_worker(m, i, c->params.n_cpu_workers, own), n = 0;
        if (n_own < 0 || !(c->chunk_ranges[i] = malloc(sizeof(uint32_t) * 2 * (size_t)(n_own + 1)))) break;
        uint32_t *r = c->chunk_ranges[i];
        for (int k = 0; k < n_own; k++) {
            long n0, n1;
            ffn_chunk_range(m, own[k], &n0, &n1);
            if (n > 0 && r[n - 2] + r[n - 1] == (uint32_t)n0) r[n - 1] += (uint32_t)(n1 - n0);
            else r[n] = (uint32_t)n0, r[n + 1] = (uint32_t)(n1 - n0), n += 2;
        }
        c->n_chunk_ranges[i] = n;
        if (n_own > 0)
            log_info("cpu-worker.%d: FFN chunks %d-%d of %d (neurons %u-%u)", i, own[0], own[n_own - 1], n_chunks, r[0],
                     r[n - 2] + r[n - 1] - 1);
    }
    bool ok = own && (c->params.n_cpu_workers == 0 || c->chunk_ranges[c->params.n_cpu_workers - 1]);
    free(own);
    if (!ok) log_error("out of memory");
    return ok ? 0 : -1;
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
    for (int i = 0; i < STACK_MAX_CPU_WORKERS; i++) {
        free(c->chunk_ranges[i]);
        c->chunk_ranges[i] = NULL;
    }
    tokenizer_free(c->tok);
    c->tok = NULL;
    stack_view_close(&c->sv);
}

/* cachemgr --check: what `pi2 up` asks before it starts any process. The
 * model is opened and validated as the stack will open it (GGUF layout,
 * architecture, tensor types, tokenizer, FFN mode and predictor: main.c did
 * those), and the segments this model and these parameters need are held
 * against the memory this process may use: a stack whose shared memory
 * cannot fit would be killed for memory while it loads, over and over. */
#include <stdio.h>

#include "cachemgr.h"
#include "engine/tokenizer.h"
#include "util/log.h"
#include "util/mem_limit.h"

/* "3.62 GiB" or "18.4 MiB": the unit a memory cap is given in. */
static const char *human(uint64_t bytes, char buf[32]) {
    if (bytes >= (1ull << 30)) snprintf(buf, 32, "%.2f GiB", (double)bytes / (1ull << 30));
    else snprintf(buf, 32, "%.1f MiB", (double)bytes / (1ull << 20));
    return buf;
}

int cm_preflight(const cachemgr *c) {
    char err[512];
    tokenizer *tok = tokenizer_from_gguf(&c->m.gguf, err, sizeof err);
    if (!tok) {
        log_error("%s: %s", c->model_path, err);
        return 1;
    }
    tokenizer_free(tok);

    uint64_t weights, kv, need = cm_segments_bytes(c, &weights, &kv);
    mem_limit lim;
    if (mem_limit_read("", &lim)) {
        log_error("cannot tell how much memory may be used: %s", lim.source);
        return 1;
    }
    if (need > lim.bytes) {
        char b[5][32];
        log_error("%s: the stack needs %s of shared memory (weights %s, KV cache %s at ctx %d, the rest %s) but "
                  "may use %s (%s)",
                  c->model_path, human(need, b[0]), human(weights, b[1]), human(kv, b[2]), c->params.n_ctx,
                  human(need - weights - kv, b[3]), human(lim.bytes, b[4]), lim.source);
        return 1;
    }
    /* for `pi2 up`: the figures a crash-loop message quotes */
    printf("%llu %llu %s\n", (unsigned long long)need, (unsigned long long)lim.bytes, lim.source);
    return 0;
}

/* The coordinator's view of the stack: lib/stack_attach's (segments, model
 * rebased into the weights, our ctl row claimed while the weights load) plus
 * the tokenizer and the limits of the workers' messages. */
#include "coord.h"
#include "log.h"

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
    return 0;
}

void coord_detach(coord *c) {
    tokenizer_free(c->tok);
    c->tok = NULL;
    stack_view_close(&c->sv);
}

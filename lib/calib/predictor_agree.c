/* Dense vs predictor-mode engines on the same prompts (predictor_agree.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "util/log.h"
#include "calib/predictor_agree.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

#define MAX_PROMPT 512

static void compare_logits(const float *ld, const float *ls, int n_vocab, predictor_agreement *a) {
    int td = argmax(ld, n_vocab), ts = argmax(ls, n_vocab), beaten_by = 0;
    float scale = 0, diff = 0;
    for (int v = 0; v < n_vocab; v++) {
        beaten_by += ld[v] > ld[ts];
        scale = fmaxf(scale, fabsf(ld[v]));
        diff = fmaxf(diff, fabsf(ld[v] - ls[v]));
    }
    double rel = scale > 0 ? (double)diff / scale : diff > 0 ? INFINITY : 0;
    a->steps++;
    a->top1_same += td == ts;
    a->top1_in_top5 += beaten_by < 5;
    a->rel_diff_sum += rel;
    if (rel > a->rel_diff_max) a->rel_diff_max = rel;
}

static void add_stats(const engine *dense, const engine *sparse, predictor_agreement *a) {
    engine_ffn_stats_t d, s;
    engine_ffn_stats(dense, &d);
    engine_ffn_stats(sparse, &s);
    a->computed += s.computed;
    a->active += s.active;
    a->bytes += s.bytes;
    a->dense_computed += d.computed;
    a->dense_bytes += d.bytes;
}

typedef struct {
    const model *m;
    engine *dense, *sparse;
    float *ld, *ls; /* copies: each engine's logits are overwritten by its next token */
    char *err;
    size_t errlen;
} pair;

/* Feed token at pos to both engines; keeps copies of both logits. */
static int step(pair *p, int token, int pos) {
    const float *ld = engine_forward(p->dense, token, pos), *ls = engine_forward(p->sparse, token, pos);
    if (!ld || !ls) {
        snprintf(p->err, p->errlen, "the engine refused token %d at position %d", token, pos);
        return -1;
    }
    memcpy(p->ld, ld, sizeof(float) * (size_t)p->m->n_vocab);
    memcpy(p->ls, ls, sizeof(float) * (size_t)p->m->n_vocab);
    return 0;
}

/* Teacher-forced over one prompt's n tokens and then dense's greedy tokens,
 * until *done reaches the budget. */
static int teacher_forced(pair *p, const int32_t *tokens, int n, int n_ctx, const predictor_run_opts *o, int *done,
                          predictor_agreement *a) {
    int pos = 0;
    for (; pos < n + o->gen_per_prompt && pos < n_ctx && *done < o->n_tokens; pos++, (*done)++) {
        int token = pos < n ? tokens[pos] : argmax(p->ld, p->m->n_vocab);
        if (step(p, token, pos)) return -1;
        compare_logits(p->ld, p->ls, p->m->n_vocab, a);
        add_stats(p->dense, p->sparse, a);
    }
    return 0;
}

/* Both engines generate after the prompt; counts their tokens' common prefix. */
static int free_running(pair *p, const int32_t *tokens, int n, int n_ctx, int gen, predictor_agreement *a) {
    for (int pos = 0; pos < n; pos++)
        if (step(p, tokens[pos], pos)) return -1;
    /* the g-th generated token comes from position n - 1 + g's logits */
    int possible = gen < n_ctx - n + 1 ? gen : n_ctx - n + 1, prefix = 0;
    for (; prefix < possible; prefix++) {
        int td = argmax(p->ld, p->m->n_vocab);
        if (td != argmax(p->ls, p->m->n_vocab)) break;
        if (prefix + 1 < possible && step(p, td, n + prefix)) return -1;
    }
    a->free_prompts++;
    a->free_possible += (uint64_t)possible;
    a->prefix_sum += (uint64_t)prefix;
    return 0;
}

int predictor_agree(const model *m, const predictor *pred, const predictor_agree_opts *o, predictor_agreement *a,
                    char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    tokenizer *tok = tokenizer_from_gguf(&m->gguf, err, errlen);
    if (!tok) return -1;
    int extra = o->run.gen_per_prompt > o->free_gen ? o->run.gen_per_prompt : o->free_gen;
    int n_ctx = MAX_PROMPT + extra < m->n_ctx_train ? MAX_PROMPT + extra : m->n_ctx_train;
    pair p = {m, engine_new(m, o->run.threads, n_ctx, err, errlen), NULL, malloc(sizeof(float) * (size_t)m->n_vocab),
              malloc(sizeof(float) * (size_t)m->n_vocab), err, errlen};
    if (p.dense) p.sparse = engine_new(m, o->run.threads, n_ctx, err, errlen);
    int32_t *tokens = malloc(sizeof(int32_t) * MAX_PROMPT);
    int done = -1;
    if (!p.dense || !p.sparse) goto out; /* err is engine_new's */
    if (!p.ld || !p.ls || !tokens) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (engine_set_ffn_mode(p.sparse, FFN_PREDICTOR, pred, err, errlen)) goto out;
    done = 0;
    for (int i = 0; i < o->run.n_prompts; i++) {
        int n = tokenizer_encode(tok, o->run.prompts[i], tokenizer_adds_bos(tok), tokens, MAX_PROMPT);
        if (n <= 0 || n >= n_ctx) {
            log_warn("prompt %d is empty or longer than %d tokens: skipped", i, n_ctx - 1);
            continue;
        }
        if ((done < o->run.n_tokens && teacher_forced(&p, tokens, n, n_ctx, &o->run, &done, a)) ||
            (o->free_gen > 0 && free_running(&p, tokens, n, n_ctx, o->free_gen, a))) {
            done = -1;
            break;
        }
    }
out:
    engine_free(p.dense);
    engine_free(p.sparse);
    free(p.ld);
    free(p.ls);
    free(tokens);
    tokenizer_free(tok);
    return done;
}

/* Observing the true FFN firing: prompts through the reference engine with
 * its FFN observer, and scoring a predictor against what it saw. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "util/log.h"
#include "calib/predictor_build.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

/* Disjoint sets: thresholds are calibrated on one and measured on the other. */
const char *const predictor_calib_prompts[] = {
    "Once upon a time, the quick brown fox jumps over the lazy dog.",
    "The history of the city begins with a small village on the river, where farmers traded grain and wool.",
    "To install the package, run the command below and then restart the server.",
    "In mathematics, a prime number is a natural number greater than one that has no divisors other than one and itself.",
    "She opened the window and looked at the rain falling on the old stone street.",
    "The committee will meet on Monday to discuss the budget for the next year.",
    "Water boils at one hundred degrees at sea level, but at a lower temperature in the mountains.",
    "He said that the train was late again, so they walked home through the park.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "The company reported strong growth in the third quarter, driven by new products and services.",
    "Photosynthesis converts light energy into chemical energy that plants store as sugar.",
    "Dear team, thank you for your hard work this week. Please send me your reports by Friday.",
};
const int predictor_n_calib_prompts = sizeof predictor_calib_prompts / sizeof predictor_calib_prompts[0];

const char *const predictor_eval_prompts[] = {
    "The little girl found a golden key under the tree and wondered which door it could open.",
    "Scientists have discovered a new species of frog in the tropical forests of South America.",
    "The recipe calls for two cups of flour, one egg, and a pinch of salt.",
    "When the market opened, prices rose quickly and then fell back by the end of the day.",
    "for i in range(10):\n    print(i * i)",
    "The museum is open every day except Monday, from nine in the morning until six in the evening.",
    "Our solar system has eight planets, and the largest of them is Jupiter.",
    "After the game, the players thanked the fans and walked slowly back to the bus.",
};
const int predictor_n_eval_prompts = sizeof predictor_eval_prompts / sizeof predictor_eval_prompts[0];

int predictor_run_prompts(const model *m, const predictor_run_opts *o, ffn_observer fn, void *ctx, char *err,
                          size_t errlen) {
    int max_prompt = 512;
    tokenizer *tok = tokenizer_from_gguf(&m->gguf, err, errlen);
    if (!tok) return -1;
    int n_ctx = max_prompt + o->gen_per_prompt;
    if (n_ctx > m->n_ctx_train) n_ctx = m->n_ctx_train;
    engine *e = engine_new(m, o->threads, n_ctx, err, errlen);
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)max_prompt);
    int done = 0;
    if (!e || !tokens) {
        if (e) snprintf(err, errlen, "out of memory");
        done = -1;
        goto out;
    }
    engine_observe_ffn(e, fn, ctx);
    for (int p = 0; p < o->n_prompts && done < o->n_tokens; p++) {
        int n = tokenizer_encode(tok, o->prompts[p], tokenizer_adds_bos(tok), tokens, max_prompt);
        if (n < 0 || n >= n_ctx) {
            log_warn("prompt %d is longer than %d tokens: skipped", p, n_ctx - 1);
            continue;
        }
        const float *logits = NULL;
        int pos = 0;
        for (; pos < n && done < o->n_tokens; pos++, done++) logits = engine_forward(e, tokens[pos], pos);
        for (int g = 0; g < o->gen_per_prompt && pos < n_ctx && done < o->n_tokens && logits; g++, pos++, done++)
            logits = engine_forward(e, argmax(logits, m->n_vocab), pos);
        if (!logits) {
            snprintf(err, errlen, "the engine refused a token of prompt %d", p);
            done = -1;
            goto out;
        }
    }
    engine_observe_ffn(e, NULL, NULL);
out:
    engine_free(e);
    tokenizer_free(tok);
    free(tokens);
    return done;
}

/* The activation's magnitude for one gate value: what a skipped neuron loses (up aside). */
static double act_magnitude(ffn_act act, float g) {
    if (act == FFN_SILU) return fabs((double)g / (1.0 + exp(-(double)g)));
    return g > 0 ? g : 0;
}

typedef struct {
    const model *m;
    predictor *p;
    predictor_layer_stats *stats;
    float *logits;
} eval_ctx;

static void eval_observer(void *ctx, const ffn_observation *o) {
    eval_ctx *c = ctx;
    const int layer = o->layer;
    const float *gate = o->gate;
    predictor_layer_stats *s = &c->stats[layer];
    predictor_logits(c->p, layer, o->residual, o->ffn_in, c->logits);
    const float tau = predictor_threshold(c->p, layer), cut = predictor_gate_cut(c->p, layer);
    s->tokens++;
    for (int i = 0; i < c->m->n_ff; i++) {
        const bool truth = gate[i] > cut, pred = c->logits[i] >= tau;
        const double mag = act_magnitude(c->m->act, gate[i]);
        s->true_active += truth;
        s->predicted += pred;
        s->hits += truth && pred;
        s->mass_total += mag;
        s->mass_kept += pred ? mag : 0;
    }
}

int predictor_eval(const model *m, predictor *p, const predictor_run_opts *o, predictor_layer_stats *stats, char *err,
                   size_t errlen) {
    memset(stats, 0, sizeof *stats * (size_t)m->n_layer);
    eval_ctx c = {m, p, stats, malloc(sizeof(float) * (size_t)m->n_ff)};
    if (!c.logits) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int n = predictor_run_prompts(m, o, eval_observer, &c, err, errlen);
    free(c.logits);
    return n;
}

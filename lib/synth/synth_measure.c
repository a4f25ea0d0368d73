#include "synth/synth_measure.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kernels/kernels.h"
#include "util/log.h"
#include "engine/model.h"
#include "util/synth_rng.h"
#include "engine/tokenizer.h"

static const char prompt[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
    "with her friends. One day, the sun was shining and the birds were singing in the trees.";

typedef struct {
    uint64_t tp, fp, fn;
} confusion;

/* Token sequence: BOS + prompt, then uniform random non-special tokens. */
static int make_tokens(const model *m, const tokenizer *tok, int n, uint64_t seed, int32_t *out) {
    int32_t buf[512];
    int np = tokenizer_encode(tok, prompt, 1, buf, (int)(sizeof buf / sizeof *buf));
    if (np < 0) return -1;
    if (np > n) np = n;
    memcpy(out, buf, (size_t)np * sizeof *out);
    synth_rng rng = synth_stream(synth_key(seed, 0x6d656173ull /* "meas" */, 0, 0), 0);
    for (int i = np; i < n; i++) out[i] = 3 + (int32_t)(synth_next(&rng) % (uint64_t)(m->n_vocab - 3));
    return np;
}

/* The predictor's view of layer l for input x (the FFN-input residual before
 * RMSNorm): active[i] = fc2_i . relu(fc1 x) >= threshold. */
static void predict(const model *m, int l, const float *x, float *hidden, float *row, uint8_t *active) {
    const layer_weights *w = &m->layers[l];
    for (int64_t k = 0; k < w->fc1.rows; k++) {
        dequantize_row(w->fc1.type, (const char *)w->fc1.data + (size_t)k * w->fc1.row_bytes, row, w->fc1.cols);
        double s = 0;
        for (int64_t j = 0; j < w->fc1.cols; j++) s += (double)row[j] * x[j];
        hidden[k] = s > 0 ? (float)s : 0.0f;
    }
    for (int64_t i = 0; i < w->fc2.rows; i++) {
        dequantize_row(w->fc2.type, (const char *)w->fc2.data + (size_t)i * w->fc2.row_bytes, row, w->fc2.cols);
        double s = 0;
        for (int64_t k = 0; k < w->fc2.cols; k++) s += (double)row[k] * hidden[k];
        active[i] = s >= m->sparse_threshold;
    }
}

static int cmp_desc_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x < y) - (x > y);
}

/* Share of all firings taken by the hottest hot_frac of the neurons. */
static double hot_share(const uint32_t *counts, int n, double hot_frac, uint32_t *sorted) {
    memcpy(sorted, counts, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_desc_u32);
    long n_hot = lround(hot_frac * n);
    if (n_hot < 1) n_hot = 1;
    double hot = 0, total = 0;
    for (int i = 0; i < n; i++) total += sorted[i], hot += i < n_hot ? sorted[i] : 0;
    return total > 0 ? hot / total : 0;
}

typedef struct {
    model m;
    tokenizer *tok;
    engine *e;
    int32_t *tokens;
    uint32_t *counts, *prev, *sorted;
    float *x, *hidden, *row;
    uint8_t *active;
    confusion *conf; /* per layer */
} measure_state;

static void free_state(measure_state *s) {
    engine_free(s->e);
    tokenizer_free(s->tok);
    free(s->tokens);
    free(s->counts);
    free(s->prev);
    free(s->sorted);
    free(s->x);
    free(s->hidden);
    free(s->row);
    free(s->active);
    free(s->conf);
    model_free(&s->m);
}

/* Compares the predictor with the neurons that fired for this token (the
 * difference of the firing counters). The predictor is fed the token's
 * embedding, which approximates the residual before each FFN: the attention
 * and FFN outputs added to it are small by construction. */
static void score_predictor(measure_state *s, int32_t token) {
    const model *m = &s->m;
    dequantize_row(m->tok_embd.type, (const char *)m->tok_embd.data + (size_t)token * m->tok_embd.row_bytes, s->x,
                   m->n_embd);
    for (int l = 0; l < m->n_layer; l++) {
        predict(m, l, s->x, s->hidden, s->row, s->active);
        const uint32_t *c = s->counts + (size_t)l * m->n_ff, *p = s->prev + (size_t)l * m->n_ff;
        for (int i = 0; i < m->n_ff; i++) {
            bool fired = c[i] != p[i];
            s->conf[l].tp += fired && s->active[i];
            s->conf[l].fp += !fired && s->active[i];
            s->conf[l].fn += fired && !s->active[i];
        }
    }
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0; }

static void report(const measure_opts *o, measure_state *s, int n, int n_prompt, bool pred) {
    const model *m = &s->m;
    printf("measured %s: %d tokens (%d prompt, %d random), %d layers x %d neurons, activation %s\n", o->path, n,
           n_prompt, n - n_prompt, m->n_layer, m->n_ff, ffn_act_name(m->act));
    printf("layer  fire    hot%02.0f-share%s\n", 100 * o->hot_frac, pred ? "  pred-recall  pred-precision" : "");
    double fire_sum = 0, hot_sum = 0;
    confusion all = {0, 0, 0};
    for (int l = 0; l < m->n_layer; l++) {
        const uint32_t *c = s->counts + (size_t)l * m->n_ff;
        double fired = 0;
        for (int i = 0; i < m->n_ff; i++) fired += c[i];
        double fire = fired / ((double)n * m->n_ff), hot = hot_share(c, m->n_ff, o->hot_frac, s->sorted);
        fire_sum += fire, hot_sum += hot;
        printf("%5d  %.4f  %.4f", l, fire, hot);
        if (pred) {
            confusion k = s->conf[l];
            all.tp += k.tp, all.fp += k.fp, all.fn += k.fn;
            printf("     %.4f       %.4f", ratio(k.tp, k.tp + k.fn), ratio(k.tp, k.tp + k.fp));
        }
        printf("\n");
    }
    printf("summary: tokens=%d fire=%.4f hot_share=%.4f", n, fire_sum / m->n_layer, hot_sum / m->n_layer);
    if (o->relu) printf(" target_fire=%.4f target_hot_share=%.4f", o->fire, o->hot_share);
    if (pred) printf(" pred_recall=%.4f pred_precision=%.4f", ratio(all.tp, all.tp + all.fn), ratio(all.tp, all.tp + all.fp));
    printf("\n");
}

int synth_measure(const measure_opts *o) {
    measure_state s;
    memset(&s, 0, sizeof s);
    char err[512];
    int rc = -1;
    if (model_load(&s.m, o->path, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    const model *m = &s.m;
    int n = o->n_tokens;
    if (n > m->n_ctx_train) {
        log_warn("measuring %d tokens, the context length, instead of %d", m->n_ctx_train, n);
        n = m->n_ctx_train;
    }
    bool pred = m->layers[0].fc1.data != NULL;
    size_t cells = (size_t)m->n_layer * m->n_ff;
    int64_t pred_rank = pred ? m->layers[0].fc1.rows : 0;
    s.tok = tokenizer_from_gguf(&m->gguf, err, sizeof err);
    if (!s.tok) goto fail_msg;
    s.e = engine_new(m, o->n_threads, n, err, sizeof err);
    if (!s.e) goto fail_msg;
    s.tokens = malloc((size_t)n * sizeof *s.tokens);
    s.counts = calloc(cells, sizeof *s.counts);
    s.prev = calloc(cells, sizeof *s.prev);
    s.sorted = malloc((size_t)m->n_ff * sizeof *s.sorted);
    s.x = malloc((size_t)m->n_embd * sizeof *s.x);
    s.hidden = malloc((size_t)(pred_rank + 1) * sizeof *s.hidden);
    s.row = malloc((size_t)(m->n_embd > m->n_ff ? m->n_embd : m->n_ff) * sizeof *s.row);
    s.active = malloc((size_t)m->n_ff);
    s.conf = calloc((size_t)m->n_layer, sizeof *s.conf);
    if (!s.tokens || !s.counts || !s.prev || !s.sorted || !s.x || !s.hidden || !s.row || !s.active || !s.conf) {
        log_error("out of memory");
        goto done;
    }
    int n_prompt = make_tokens(m, s.tok, n, o->seed, s.tokens);
    if (n_prompt < 0) {
        log_error("the measurement prompt does not fit in 512 tokens");
        goto done;
    }
    engine_count_firing(s.e, s.counts);
    for (int pos = 0; pos < n; pos++) {
        if (pred) memcpy(s.prev, s.counts, cells * sizeof *s.counts);
        const float *logits = engine_forward(s.e, s.tokens[pos], pos);
        if (!logits) {
            log_error("engine_forward failed at position %d", pos);
            goto done;
        }
        for (int v = 0; v < m->n_vocab; v++)
            if (!isfinite(logits[v])) {
                log_error("non-finite logit %g for token %d at position %d", logits[v], v, pos);
                goto done;
            }
        if (pred) score_predictor(&s, s.tokens[pos]);
    }
    report(o, &s, n, n_prompt, pred);
    rc = 0;
    goto done;
fail_msg:
    log_error("%s", err);
done:
    free_state(&s);
    return rc;
}

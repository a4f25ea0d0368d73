/* The model profile (model_profile.h): running the calibration prompts with an
 * FFN observer that records which neurons fired on which token. */
#include "calib/model_profile.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "calib/predictor_build.h"
#include "engine/predictor.h"
#include "util/checksum.h"
#include "util/log.h"

typedef struct {
    model_profile *p;
    const model_profile_opts *o;
    predictor *pred; /* FFN_PREDICTOR */
    float *logits;   /* [n_ff], FFN_PREDICTOR */
    float *guess;    /* [n_ff], FFN_PREDICTOR: the logits from the layer's input */
    float *guess_in; /* [n_embd], FFN_PREDICTOR: rmsnorm(layer input) * ffn_norm */
    int token;       /* the token the layers are seeing: layer 0 advances it */
} run_ctx;

static uint64_t *fired_row(const model_profile *p, int l, int i) {
    return p->fired + ((size_t)l * (size_t)p->n_ff + (size_t)i) * (size_t)p->words;
}

static void record(run_ctx *c, int layer, int i) {
    const uint64_t bit = 1ull << (c->token % 64);
    fired_row(c->p, layer, i)[c->token / 64] |= bit;
}

/* The cpu-workers' guess (cpu-worker/decode.c, step_prefetch): the layer's predictor on its input. */
static void guess_logits(run_ctx *c, const ffn_observation *o) {
    const float *ffn_in = predictor_guess_ffn_in(c->pred, o->layer, o->layer_in, c->guess_in);
    predictor_logits(c->pred, o->layer, o->layer_in, ffn_in, c->guess);
}

/* Called once per layer per token, from the thread that runs the engine. */
static void profile_observer(void *ctx, const ffn_observation *o) {
    run_ctx *c = ctx;
    model_profile *p = c->p;
    const int layer = o->layer;
    if (layer == 0) c->token++;
    if (c->pred) {
        /* the engine's selection (ffn_chunks.c select_neurons): logit >= the layer's threshold */
        guess_logits(c, o);
        predictor_logits(c->pred, layer, o->residual, o->ffn_in, c->logits);
        const float tau = predictor_threshold(c->pred, layer);
        uint32_t *missed = p->guess_missed + (size_t)layer * (size_t)p->n_ff;
        for (int i = 0; i < p->n_ff; i++)
            if (c->logits[i] >= tau) {
                record(c, layer, i);
                missed[i] += c->guess[i] < tau;
            }
    } else {
        for (int i = 0; i < p->n_ff; i++)
            if (o->gate[i] > 0) record(c, layer, i);
    }
    if (layer == p->n_layer - 1 && c->o->progress) c->o->progress(c->o->progress_ctx, c->token + 1, c->o->n_tokens);
}

static bool has_own_predictor(const model *m) {
    for (int l = 0; l < m->n_layer; l++)
        if (!m->layers[l].fc1.data || !m->layers[l].fc2.data) return false;
    return true;
}

static int check_opts(const model *m, const model_profile_opts *o, const char *name, char *err, size_t errlen) {
    if (o->mode != FFN_GATE_FIRST && o->mode != FFN_PREDICTOR) {
        err_set(err, errlen, "%s: a profile is of gate-first or predictor mode, not %s", name, ffn_mode_name(o->mode));
        return -1;
    }
    if (o->n_tokens < 1 || o->n_tokens > MODEL_PROFILE_MAX_TOKENS || o->n_prompts < 1 || o->gen_per_prompt < 0) {
        err_set(err, errlen, "%s: need 1..%d tokens (asked %d), at least one prompt (%d) and gen_per_prompt >= 0 (%d)",
                name, MODEL_PROFILE_MAX_TOKENS, o->n_tokens, o->n_prompts, o->gen_per_prompt);
        return -1;
    }
    const char *why = ffn_mode_refusal(m, o->mode, o->predictor_path || has_own_predictor(m));
    if (why) {
        err_set(err, errlen, "%s: %s%s", name, why,
                o->mode == FFN_PREDICTOR ? " (PowerInfer's blk.N.fc1/fc2, as a PWRI file has); this model has none"
                                         : "");
        return -1;
    }
    return 0;
}

uint64_t model_profile_run_hash(const model_profile_opts *o) {
    uint64_t h = 0;
    for (int i = 0; i < o->n_prompts; i++) h = checksum_mix(h, checksum64(o->prompts[i], strlen(o->prompts[i])));
    h = checksum_mix(h, (uint64_t)o->n_prompts);
    h = checksum_mix(h, (uint64_t)o->n_tokens);
    h = checksum_mix(h, (uint64_t)o->gen_per_prompt);
    h = checksum_mix(h, (uint64_t)o->mode);
    if (o->mode == FFN_PREDICTOR && o->predictor_path) {
        struct stat st;
        h = checksum_mix(h, checksum64(o->predictor_path, strlen(o->predictor_path)));
        h = checksum_mix(h, stat(o->predictor_path, &st) ? 0 : (uint64_t)st.st_size);
    }
    return h;
}

/* The rows were laid out for `from` words; a shorter run needs fewer: moved
 * down in place (row r's new start is never after its old one). */
static void repack_rows(model_profile *p, int from) {
    if (from == p->words) return;
    const size_t rows = (size_t)p->n_layer * (size_t)p->n_ff;
    for (size_t r = 0; r < rows; r++)
        memmove(p->fired + r * (size_t)p->words, p->fired + r * (size_t)from, sizeof(uint64_t) * (size_t)p->words);
}

static void count_fired(model_profile *p) {
    const size_t rows = (size_t)p->n_layer * (size_t)p->n_ff;
    for (size_t r = 0; r < rows; r++) {
        uint32_t n = 0;
        for (int w = 0; w < p->words; w++) n += (uint32_t)__builtin_popcountll(p->fired[r * (size_t)p->words + w]);
        p->counts[r] = n;
    }
}

int model_profile_run(model_profile *p, const model *m, const model_profile_opts *o, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    const char *name = o->model_name ? o->model_name : "the model";
    if (check_opts(m, o, name, err, errlen)) return -1;
    *p = (model_profile){.n_layer = m->n_layer, .n_ff = m->n_ff, .mode = o->mode,
                         .source_size = (uint64_t)m->gguf.size, .source_fingerprint = model_fingerprint(m),
                         .run_hash = model_profile_run_hash(o), .words = (o->n_tokens + 63) / 64};
    const size_t rows = (size_t)m->n_layer * (size_t)m->n_ff;
    p->fired = calloc(rows * (size_t)p->words, sizeof *p->fired);
    p->counts = calloc(rows, sizeof *p->counts);
    run_ctx c = {.p = p, .o = o, .token = -1};
    if (o->mode == FFN_PREDICTOR) {
        c.logits = malloc(sizeof(float) * (size_t)m->n_ff);
        c.guess = malloc(sizeof(float) * (size_t)m->n_ff);
        c.guess_in = malloc(sizeof(float) * (size_t)m->n_embd);
        p->guess_missed = calloc(rows, sizeof *p->guess_missed);
    }
    if (!p->fired || !p->counts ||
        (o->mode == FFN_PREDICTOR && (!c.logits || !c.guess || !c.guess_in || !p->guess_missed))) {
        err_set(err, errlen, "out of memory for the profile of %s (%zu neurons x %d tokens)", name, rows, o->n_tokens);
        goto fail;
    }
    if (o->mode == FFN_PREDICTOR && !(c.pred = predictor_load(m, o->predictor_path, err, errlen))) goto fail;
    predictor_run_opts run = {.prompts = o->prompts, .n_prompts = o->n_prompts, .n_tokens = o->n_tokens,
                              .gen_per_prompt = o->gen_per_prompt, .threads = o->threads};
    const int tokens = predictor_run_prompts(m, &run, profile_observer, &c, err, errlen);
    if (tokens < 0) goto fail;
    if (tokens == 0) {
        err_set(err, errlen, "%s: no calibration token ran (every prompt empty or too long?)", name);
        goto fail;
    }
    p->n_tokens = tokens;
    const int allocated = p->words;
    p->words = (tokens + 63) / 64;
    repack_rows(p, allocated);
    count_fired(p);
    predictor_free(c.pred);
    free(c.logits), free(c.guess), free(c.guess_in);
    return 0;
fail:
    predictor_free(c.pred);
    free(c.logits), free(c.guess), free(c.guess_in);
    model_profile_free(p);
    return -1;
}

void model_profile_free(model_profile *p) {
    free(p->counts);
    free(p->guess_missed);
    free(p->fired);
    memset(p, 0, sizeof *p);
}

uint32_t model_profile_cofired(const model_profile *p, int l, int i, int j) {
    const uint64_t *a = fired_row(p, l, i), *b = fired_row(p, l, j);
    uint32_t n = 0;
    for (int w = 0; w < p->words; w++) n += (uint32_t)__builtin_popcountll(a[w] & b[w]);
    return n;
}

/* ---- Spearman ---- */

typedef struct {
    double v;
    int i;
} indexed;

static int by_value(const void *a, const void *b) {
    const indexed *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* rank[i] of v[i] among v[0..n), 1-based; ties share the mean of their ranks. */
static int average_ranks(const double *v, int n, double *rank) {
    indexed *s = malloc(sizeof *s * (size_t)n);
    if (!s) return -1;
    for (int i = 0; i < n; i++) s[i] = (indexed){v[i], i};
    qsort(s, (size_t)n, sizeof *s, by_value);
    for (int lo = 0, hi; lo < n; lo = hi) {
        for (hi = lo + 1; hi < n && s[hi].v == s[lo].v; hi++) {}
        const double mean = 0.5 * (lo + 1 + hi); /* ranks lo+1 .. hi */
        for (int k = lo; k < hi; k++) rank[s[k].i] = mean;
    }
    free(s);
    return 0;
}

static double pearson(const double *x, const double *y, int n) {
    double mx = 0, my = 0;
    for (int i = 0; i < n; i++) mx += x[i], my += y[i];
    mx /= n, my /= n;
    double sxy = 0, sxx = 0, syy = 0;
    for (int i = 0; i < n; i++) {
        sxy += (x[i] - mx) * (y[i] - my);
        sxx += (x[i] - mx) * (x[i] - mx);
        syy += (y[i] - my) * (y[i] - my);
    }
    return sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : 0;
}

double rank_correlation(const double *a, const double *b, int n) {
    if (n < 2) return 0;
    double *ra = malloc(sizeof *ra * (size_t)n), *rb = malloc(sizeof *rb * (size_t)n), r = NAN;
    if (ra && rb && !average_ranks(a, n, ra) && !average_ranks(b, n, rb)) r = pearson(ra, rb, n);
    free(ra), free(rb);
    return r;
}

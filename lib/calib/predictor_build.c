/* Building a lowrank predictor: factor each layer's gate matrix, write the
 * side file, then calibrate the per-layer thresholds on sample prompts with
 * the predictor as stored (quantized) and write the file again with them. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "kernels/kernels.h"
#include "util/log.h"
#include "calib/predictor_build.h"
#include "util/synth_rng.h"

/* Above this gate value |silu(gate)| exceeds |silu| anywhere below zero
 * (min silu = -0.2785 at -1.2785), so "|silu(gate)| >= silu(cut)" is "gate >= cut". */
#define SILU_ONE_SIDED_CUT 0.456f
/* Calibration keeps at most this many (gate, logit) samples per layer. */
#define CALIB_SAMPLES_PER_LAYER (1 << 19)

int predictor_default_rank(const model *m) {
    int limit = m->n_embd < m->n_ff ? m->n_embd : m->n_ff;
    int r = limit / 2 / 32 * 32;
    if (r > 128) r = 128;
    return r >= 32 ? r : (limit < 32 ? limit : 32);
}

typedef struct {
    const model *m;
    int rank;
    uint32_t type;
    void **a, **b;              /* per layer, quantized rows */
    size_t a_bytes, b_bytes;    /* per layer */
    float *threshold, *gate_cut;
    double target_recall;
    int calib_tokens;
} side_data;

static int write_side(const side_data *d, const char *path, char *err, size_t errlen) {
    const model *m = d->m;
    gguf_writer *w = gguf_writer_new("GGUF", GGUF_DEFAULT_ALIGNMENT);
    if (!w) { err_set(err, errlen, "out of memory"); return -1; }
    gguf_w_str(w, "general.architecture", "pi2-predictor");
    gguf_w_str(w, PRED_KEY_KIND, "lowrank");
    gguf_w_u32(w, PRED_KEY_RANK, (uint32_t)d->rank);
    gguf_w_f32(w, PRED_KEY_RECALL, (float)d->target_recall);
    gguf_w_str(w, PRED_KEY_INPUT, "ffn_norm_out");
    gguf_w_str(w, PRED_KEY_ACT, ffn_act_name(m->act));
    gguf_w_u32(w, PRED_KEY_N_LAYER, (uint32_t)m->n_layer);
    gguf_w_u32(w, PRED_KEY_N_EMBD, (uint32_t)m->n_embd);
    gguf_w_u32(w, PRED_KEY_N_FF, (uint32_t)m->n_ff);
    gguf_w_u64(w, PRED_KEY_MODEL_SIZE, (uint64_t)m->gguf.size);
    gguf_w_u64(w, PRED_KEY_FINGERPRINT, model_fingerprint(m));
    gguf_w_u32(w, PRED_KEY_CALIB_TOKENS, (uint32_t)d->calib_tokens);
    gguf_w_arr(w, PRED_KEY_THRESHOLDS, GGUF_FLOAT32, (uint64_t)m->n_layer, d->threshold);
    gguf_w_arr(w, PRED_KEY_GATE_CUT, GGUF_FLOAT32, (uint64_t)m->n_layer, d->gate_cut);
    for (int l = 0; l < m->n_layer; l++) {
        char name[64];
        uint64_t ne_a[2] = {(uint64_t)m->n_embd, (uint64_t)d->rank}, ne_b[2] = {(uint64_t)d->rank, (uint64_t)m->n_ff};
        snprintf(name, sizeof name, "blk.%d.pred_a.weight", l);
        gguf_w_tensor(w, name, d->type, 2, ne_a);
        snprintf(name, sizeof name, "blk.%d.pred_b.weight", l);
        gguf_w_tensor(w, name, d->type, 2, ne_b);
    }
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        err_set(err, errlen, "cannot create %s", path);
        gguf_writer_free(w);
        return -1;
    }
    gguf_w_begin(w, fp);
    for (int l = 0; l < m->n_layer; l++) {
        gguf_w_data(w, d->a[l], d->a_bytes);
        gguf_w_data(w, d->b[l], d->b_bytes);
    }
    gguf_w_finish(w);
    int rc = 0;
    if (gguf_writer_error(w)) {
        err_set(err, errlen, "%s: %s", path, gguf_writer_error(w));
        rc = -1;
    }
    if (fclose(fp) && !rc) {
        err_set(err, errlen, "%s: write failed", path);
        rc = -1;
    }
    gguf_writer_free(w);
    return rc;
}

/* Factor layer l's gate and store A, B quantized; logs the share of the gate's energy kept. */
static int factor_layer(side_data *d, int l, int power_iters, int threads, float *G, float *A, float *B) {
    const model *m = d->m;
    const weight *g = &m->layers[l].gate;
    double energy = 0, kept = 0;
    for (int i = 0; i < m->n_ff; i++) {
        float *row = G + (size_t)i * m->n_embd;
        dequantize_row(g->type, (const char *)g->data + (size_t)i * g->row_bytes, row, m->n_embd);
        for (int c = 0; c < m->n_embd; c++) energy += (double)row[c] * row[c];
    }
    if (lowrank_factor(G, m->n_ff, m->n_embd, d->rank, power_iters, (uint64_t)l, threads, A, B)) return -1;
    for (int t = 0; t < d->rank; t++) { /* |A_t|^2 = sigma_t, so sigma_t^2 = |A_t|^4 */
        double s = 0;
        for (int c = 0; c < m->n_embd; c++) s += (double)A[(size_t)t * m->n_embd + c] * A[(size_t)t * m->n_embd + c];
        kept += s * s;
    }
    log_info("layer %d: rank %d keeps %.1f%% of the gate's energy", l, d->rank, energy > 0 ? 100 * kept / energy : 0);
    size_t ra = ggml_row_bytes(d->type, (uint64_t)m->n_embd), rb = ggml_row_bytes(d->type, (uint64_t)d->rank);
    for (int t = 0; t < d->rank; t++)
        quantize_row(d->type, A + (size_t)t * m->n_embd, (char *)d->a[l] + (size_t)t * ra, m->n_embd);
    for (int i = 0; i < m->n_ff; i++)
        quantize_row(d->type, B + (size_t)i * d->rank, (char *)d->b[l] + (size_t)i * rb, d->rank);
    return 0;
}

/* ---- calibration ---- */

typedef struct {
    float gate, logit;
} sample;

typedef struct {
    const model *m;
    predictor *p;
    float *logits;
    sample **s;                 /* per layer */
    size_t *n, *cap;
    uint64_t keep_below;        /* a (token, layer, neuron) is sampled iff its hash < keep_below */
    uint64_t token;             /* tokens seen by layer 0 */
    int failed;
} calib_ctx;

static void calib_observer(void *ctx, const ffn_observation *o) {
    calib_ctx *c = ctx;
    const int layer = o->layer;
    const float *gate = o->gate;
    if (c->failed) return;
    if (layer == 0) c->token++;
    predictor_logits(c->p, layer, o->residual, o->ffn_in, c->logits);
    uint64_t key = synth_key(0xca1b, c->token, (uint64_t)layer, 0);
    for (int i = 0; i < c->m->n_ff; i++) {
        if (synth_mix(key + (uint64_t)i) >= c->keep_below) continue;
        if (c->n[layer] == c->cap[layer]) {
            size_t cap = c->cap[layer] ? 2 * c->cap[layer] : 4096;
            sample *s = realloc(c->s[layer], cap * sizeof *s);
            if (!s) { c->failed = 1; return; }
            c->s[layer] = s;
            c->cap[layer] = cap;
        }
        c->s[layer][c->n[layer]++] = (sample){gate[i], c->logits[i]};
    }
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* cut: 0 for ReLU; for SiLU the gate value above which silu_keep of the samples lie (one-sided).
 * tau: the largest threshold whose recall of {gate > cut} on the samples is >= target. */
static int layer_thresholds(const model *m, const sample *s, size_t n, double recall, double silu_keep, float *cut,
                            float *tau) {
    float *v = malloc(sizeof(float) * (n ? n : 1));
    if (!v) return -1;
    *cut = 0;
    if (m->act == FFN_SILU && n) {
        for (size_t i = 0; i < n; i++) v[i] = s[i].gate;
        qsort(v, n, sizeof *v, cmp_float);
        size_t k = (size_t)((1.0 - silu_keep) * (double)n);
        *cut = v[k < n ? k : n - 1];
        if (*cut < SILU_ONE_SIDED_CUT) *cut = SILU_ONE_SIDED_CUT;
    }
    size_t pos = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i].gate > *cut) v[pos++] = s[i].logit;
    if (!pos) {
        *tau = FLT_MAX; /* nothing fired: predict nothing */
    } else {
        qsort(v, pos, sizeof *v, cmp_float);
        size_t miss = (size_t)floor((1.0 - recall) * (double)pos);
        *tau = v[miss < pos ? miss : pos - 1];
    }
    free(v);
    return 0;
}

static int calibrate(side_data *d, const predictor_build_opts *o, char *err, size_t errlen) {
    const model *m = d->m;
    predictor *p = predictor_load(m, o->out_path, err, errlen);
    if (!p) return -1;
    calib_ctx c = {.m = m, .p = p};
    c.logits = malloc(sizeof(float) * (size_t)m->n_ff);
    c.s = calloc((size_t)m->n_layer, sizeof *c.s);
    c.n = calloc((size_t)m->n_layer, sizeof *c.n);
    c.cap = calloc((size_t)m->n_layer, sizeof *c.cap);
    double share = (double)CALIB_SAMPLES_PER_LAYER / ((double)o->calib.n_tokens * m->n_ff);
    c.keep_below = share >= 1 ? UINT64_MAX : (uint64_t)(share * 18446744073709551615.0);
    int rc = -1;
    if (!c.logits || !c.s || !c.n || !c.cap) {
        err_set(err, errlen, "out of memory");
        goto done;
    }
    int tokens = predictor_run_prompts(m, &o->calib, calib_observer, &c, err, errlen);
    if (tokens < 0) goto done;
    if (c.failed) { err_set(err, errlen, "out of memory collecting calibration samples"); goto done; }
    if (tokens == 0) { err_set(err, errlen, "no calibration tokens (empty prompts?)"); goto done; }
    d->calib_tokens = tokens;
    for (int l = 0; l < m->n_layer; l++) {
        if (layer_thresholds(m, c.s[l], c.n[l], o->target_recall, o->silu_keep, &d->gate_cut[l], &d->threshold[l])) {
            err_set(err, errlen, "out of memory");
            goto done;
        }
        log_info("layer %d: threshold %.4g (truth: gate > %.3g), %zu samples", l, d->threshold[l], d->gate_cut[l],
                 c.n[l]);
    }
    log_info("calibrated on %d tokens", tokens);
    rc = 0;
done:
    for (int l = 0; c.s && l < m->n_layer; l++) free(c.s[l]);
    free(c.s); free(c.n); free(c.cap); free(c.logits);
    predictor_free(p);
    return rc;
}

static int check_opts(const model *m, const predictor_build_opts *o, int rank, char *err, size_t errlen) {
    int limit = m->n_embd < m->n_ff ? m->n_embd : m->n_ff;
    if (rank < 1 || rank > limit) {
        err_set(err, errlen, "rank %d outside [1, %d] (min of n_embd and n_ff)", rank, limit);
        return -1;
    }
    if (o->weight_type != GGML_TYPE_F32 && o->weight_type != GGML_TYPE_F16 && o->weight_type != GGML_TYPE_Q8_0) {
        err_set(err, errlen, "predictor weights must be f32, f16 or q8_0");
        return -1;
    }
    if (o->weight_type == GGML_TYPE_Q8_0 && (rank % QK8_0 || m->n_embd % QK8_0)) {
        err_set(err, errlen, "q8_0 predictor weights need rank and n_embd multiples of 32 (rank %d)", rank);
        return -1;
    }
    if (!(o->target_recall > 0 && o->target_recall <= 1) || !(o->silu_keep > 0 && o->silu_keep < 1)) {
        err_set(err, errlen, "target recall must be in (0, 1] and the SiLU keep fraction in (0, 1)");
        return -1;
    }
    if (o->calib.n_tokens < 1) {
        err_set(err, errlen, "need at least one calibration token");
        return -1;
    }
    return 0;
}

int predictor_build(const model *m, const predictor_build_opts *o, char *err, size_t errlen) {
    side_data d = {.m = m, .rank = o->rank > 0 ? o->rank : predictor_default_rank(m), .type = o->weight_type,
                   .target_recall = o->target_recall};
    if (check_opts(m, o, d.rank, err, errlen)) return -1;
    d.a_bytes = (size_t)d.rank * ggml_row_bytes(d.type, (uint64_t)m->n_embd);
    d.b_bytes = (size_t)m->n_ff * ggml_row_bytes(d.type, (uint64_t)d.rank);
    d.a = calloc((size_t)m->n_layer, sizeof *d.a);
    d.b = calloc((size_t)m->n_layer, sizeof *d.b);
    d.threshold = calloc((size_t)m->n_layer, sizeof(float));
    d.gate_cut = calloc((size_t)m->n_layer, sizeof(float));
    float *G = malloc(sizeof(float) * (size_t)m->n_ff * m->n_embd);
    float *A = malloc(sizeof(float) * (size_t)d.rank * m->n_embd), *B = malloc(sizeof(float) * (size_t)m->n_ff * d.rank);
    int rc = -1;
    bool written = false;
    if (!d.a || !d.b || !d.threshold || !d.gate_cut || !G || !A || !B) goto oom;
    double t0 = clock_seconds();
    for (int l = 0; l < m->n_layer; l++) {
        d.a[l] = malloc(d.a_bytes);
        d.b[l] = malloc(d.b_bytes);
        if (!d.a[l] || !d.b[l] || factor_layer(&d, l, o->power_iters, o->calib.threads, G, A, B)) goto oom;
    }
    free(G); free(A); free(B);
    G = A = B = NULL;
    double t1 = clock_seconds();
    log_info("factorized %d layers to rank %d in %.1f s", m->n_layer, d.rank, t1 - t0);
    /* written once without thresholds so that calibration runs the stored (quantized) weights */
    if (write_side(&d, o->out_path, err, errlen)) goto done;
    written = true;
    if (calibrate(&d, o, err, errlen) || write_side(&d, o->out_path, err, errlen)) goto done;
    log_info("calibrated in %.1f s; wrote %s (%.2f MiB)", clock_seconds() - t1, o->out_path,
             (double)(d.a_bytes + d.b_bytes) * m->n_layer / 1048576.0);
    rc = 0;
    goto done;
oom:
    err_set(err, errlen, "out of memory (the factorization holds one dequantized gate matrix)");
done:
    if (rc && written) remove(o->out_path);
    for (int l = 0; d.a && l < m->n_layer; l++) free(d.a[l]);
    for (int l = 0; d.b && l < m->n_layer; l++) free(d.b[l]);
    free(d.a); free(d.b); free(d.threshold); free(d.gate_cut);
    free(G); free(A); free(B);
    return rc;
}

/* Hot-neuron layout (lib/calib/reorder.h) on mkmodel's planted ReLU models: the
 * order itself on hand-made counts, the copy's tensors against the original's
 * (every gate/up/down_t/fc2 row and down column where the order says, the rest
 * untouched), the same greedy tokens and logits within rounding in dense and
 * gate-first decode, firing frequency measured on the copy non-increasing
 * along the new order, the PWRI predictor naming the same (renumbered)
 * neurons, and refusals. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kernels/kernels.h"
#include "engine/model.h"
#include "calib/predictor_build.h"
#include "calib/reorder.h"
#include "util/synth_rng.h"
#include "mkmodel_run.h"
#include "test.h"
#include "engine/sampler.h"

static char tmpdir[256];

static void test_layer_perm(void) {
    /* 8 neurons, counts chosen so the expected orders can be read off by hand */
    const uint32_t counts[8] = {1, 9, 4, 9, 0, 7, 2, 3};
    const int32_t free_order[8] = {1, 3, 5, 2, 7, 6, 0, 4}; /* ties: lower index first */
    /* blocks of 4: {0..3} sum 23, {4..7} sum 12; inside: 1,3,2,0 and 5,7,6,4 */
    const int32_t block_order[8] = {1, 3, 2, 0, 5, 7, 6, 4};
    int32_t perm[8];
    CHECK(reorder_layer_perm(counts, 8, 1, perm) == 0 && !memcmp(perm, free_order, sizeof perm), "free order");
    CHECK(reorder_layer_perm(counts, 8, 4, perm) == 0 && !memcmp(perm, block_order, sizeof perm), "block order");
    CHECK(reorder_layer_perm(counts, 8, 3, perm) == -1, "8 neurons do not split into blocks of 3");

    CHECK(reorder_check_perm(free_order, 8, 1) == 0, "a permutation");
    CHECK(reorder_check_perm(free_order, 8, 4) == -1, "free order mixes blocks of 4");
    CHECK(reorder_check_perm(block_order, 8, 4) == 0, "block order keeps blocks of 4");
    const int32_t dup[4] = {0, 1, 1, 3}, out_of_range[4] = {0, 1, 2, 4}, negative[4] = {0, -1, 2, 3};
    CHECK(reorder_check_perm(dup, 4, 1) == -1, "repeated neuron");
    CHECK(reorder_check_perm(out_of_range, 4, 1) == -1, "neuron out of range");
    CHECK(reorder_check_perm(negative, 4, 1) == -1, "negative neuron");
}

static int is_permutation(const int32_t *p, int n) {
    char *seen = calloc((size_t)n, 1);
    int ok = seen != NULL;
    for (int j = 0; ok && j < n; j++) {
        ok = p[j] >= 0 && p[j] < n && !seen[p[j]];
        if (ok) seen[p[j]] = 1;
    }
    free(seen);
    return ok;
}

static void row_f32(const weight *w, int64_t r, float *out) {
    dequantize_row(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, out, w->cols);
}

/* Row j of b equals row perm[j] of a, value for value (the rows' bytes for quantized types). */
static int rows_moved(const weight *a, const weight *b, const int32_t *perm) {
    for (int64_t j = 0; j < b->rows; j++)
        if (memcmp((const uint8_t *)b->data + (size_t)j * b->row_bytes,
                   (const uint8_t *)a->data + (size_t)perm[j] * a->row_bytes, a->row_bytes))
            return 0;
    return 1;
}

/* Column j of b equals column perm[j] of a, compared after dequantizing. */
static int columns_moved(const weight *a, const weight *b, const int32_t *perm) {
    float *ra = malloc(sizeof *ra * (size_t)a->cols), *rb = malloc(sizeof *rb * (size_t)b->cols);
    int ok = ra && rb;
    for (int64_t r = 0; ok && r < a->rows; r++) {
        row_f32(a, r, ra);
        row_f32(b, r, rb);
        for (int64_t j = 0; ok && j < b->cols; j++) ok = ra[perm[j]] == rb[j];
    }
    free(ra);
    free(rb);
    return ok;
}

static int same_bytes(const weight *a, const weight *b) {
    return a->rows == b->rows && a->row_bytes == b->row_bytes &&
           !memcmp(a->data, b->data, (size_t)a->rows * a->row_bytes);
}

static void check_tensors(const char *tag, const model *m, const model *r, const int32_t *perm) {
    int rows_ok = 1, down_ok = 1, rest_ok = 1, pred_ok = 1;
    for (int l = 0; l < m->n_layer; l++) {
        const layer_weights *a = &m->layers[l], *b = &r->layers[l];
        const int32_t *p = perm + (size_t)l * m->n_ff;
        rows_ok &= rows_moved(&a->gate, &b->gate, p) && rows_moved(&a->up, &b->up, p);
        if (a->down.data) down_ok &= b->down.data && columns_moved(&a->down, &b->down, p);
        if (a->down_t.data) down_ok &= b->down_t.data && rows_moved(&a->down_t, &b->down_t, p);
        if (a->fc2.data) pred_ok &= rows_moved(&a->fc2, &b->fc2, p) && same_bytes(&a->fc1, &b->fc1);
        rest_ok &= same_bytes(&a->wq, &b->wq) && same_bytes(&a->wk, &b->wk) && same_bytes(&a->wv, &b->wv) &&
                   same_bytes(&a->wo, &b->wo) && !memcmp(a->ffn_norm, b->ffn_norm, sizeof(float) * m->n_embd);
    }
    rest_ok &= same_bytes(&m->tok_embd, &r->tok_embd) && same_bytes(&m->output, &r->output);
    CHECK(rows_ok, "%s: gate and up rows are the original rows in the new order", tag);
    CHECK(down_ok, "%s: ffn_down columns / ffn_down_t rows are the originals in the new order", tag);
    CHECK(pred_ok, "%s: fc2 rows moved, fc1 unchanged", tag);
    CHECK(rest_ok, "%s: attention, norms, embeddings unchanged", tag);
}

/* Whether m's sparse FFN sums Q4_0 down_t rows: its axpy quantizes each group
 * of AXPY_Q4_GROUP neurons' coefficients to int8 on a shared scale
 * (sparse_kernels.h), and a reorder regroups the neurons. */
static bool q4_axpy(const model *m) { return m->layers[0].down_t.data && m->layers[0].down_t.type == GGML_TYPE_Q4_0; }

/* the largest logit less the runner-up */
static double top_gap(const float *l, int n) {
    const int t = argmax(l, n);
    double second = -INFINITY;
    for (int v = 0; v < n; v++)
        if (v != t) second = fmax(second, l[v]);
    return l[t] - second;
}

/* Greedy decode of both models side by side (the first model's tokens fed to
 * both): same tokens, logits within rounding; with the Q4_0 axpy, within its
 * 8-bit quantization, and a different token only where the first model's top
 * two logits are closer than that. */
static void check_same_function(const char *tag, const model *m, const model *r, ffn_mode mode) {
    static const int prompts[3][5] = {{1, 50, 120, 300, 7}, {1, 400, 401, 12, 99}, {1, 3, 3, 250, 510}};
    char err[256];
    engine *ea = engine_new(m, 2, 128, err, sizeof err), *eb = engine_new(r, 2, 128, err, sizeof err);
    float *la = malloc(sizeof *la * (size_t)m->n_vocab);
    CHECK(ea && eb && la, "%s: engines: %s", tag, err);
    if (!ea || !eb || !la) goto out;
    CHECK(engine_set_ffn_mode(ea, mode, NULL, err, sizeof err) == 0 &&
              engine_set_ffn_mode(eb, mode, NULL, err, sizeof err) == 0,
          "%s: %s mode: %s", tag, ffn_mode_name(mode), err);
    /* F16 and quantized products round their activations to F16 / Q8_0 first: a
     * rounding-level change can move an element across a rounding boundary, so
     * an element of a product input may move by one step of its rounding */
    const double tol = q4_axpy(m) ? 3e-2 : m->layers[0].gate.type == GGML_TYPE_F32 ? 1e-4 : 5e-3;
    int same_tokens = 1;
    double worst = 0;
    for (int p = 0; p < 3; p++) {
        const float *a = engine_prefill(ea, prompts[p], 5);
        memcpy(la, a, sizeof *la * (size_t)m->n_vocab);
        const float *b = engine_prefill(eb, prompts[p], 5);
        for (int pos = 5; pos < 24; pos++) {
            double scale = 0, diff = 0;
            for (int v = 0; v < m->n_vocab; v++) {
                scale = fmax(scale, fabs(la[v]));
                diff = fmax(diff, fabs(la[v] - b[v]));
            }
            worst = fmax(worst, diff / scale);
            int ta = argmax(la, m->n_vocab), tb = argmax(b, m->n_vocab);
            same_tokens &= ta == tb || (q4_axpy(m) && top_gap(la, m->n_vocab) <= 2 * tol * scale);
            a = engine_forward(ea, ta, pos);
            memcpy(la, a, sizeof *la * (size_t)m->n_vocab);
            b = engine_forward(eb, ta, pos);
        }
    }
    CHECK(same_tokens, "%s %s: the same greedy tokens", tag, ffn_mode_name(mode));
    CHECK(worst < tol, "%s %s: logits differ by %.3g of their scale (allowed %.g)", tag, ffn_mode_name(mode), worst,
          tol);
out:
    engine_free(ea);
    engine_free(eb);
    free(la);
}

/* Firing measured on the copy follows the new order: non-increasing (in whole
 * blocks, and inside each, for granularity > 1) but for neurons whose gate is a
 * rounding away from zero on some token. */
static void check_firing_order(const char *tag, const model *r, const uint32_t *old_counts, const int32_t *perm,
                               const predictor_run_opts *run, int granularity) {
    size_t cells = (size_t)r->n_layer * r->n_ff;
    uint32_t *c = malloc(sizeof *c * cells);
    char err[256];
    if (!c || reorder_count_firing(r, run, c, err, sizeof err) != run->n_tokens) {
        CHECK(0, "%s: counting firing on the copy: %s", tag, err);
        free(c);
        return;
    }
    long moved = 0, rises = 0;
    for (size_t k = 0; k < cells; k++) moved += c[k] != old_counts[k / r->n_ff * r->n_ff + (size_t)perm[k]];
    const int n_ff = r->n_ff, g = granularity;
    double head_share = 0;
    for (int l = 0; l < r->n_layer; l++) {
        const uint32_t *x = c + (size_t)l * n_ff;
        long prev = -1, total = 0, head = 0;
        for (int b = 0; b < n_ff / g; b++) {
            long sum = 0;
            for (int k = 0; k < g; k++) {
                sum += x[b * g + k];
                if (k > 0) rises += x[b * g + k] > x[b * g + k - 1] + 1;
            }
            rises += prev >= 0 && sum > prev + g;
            prev = sum;
        }
        for (int j = 0; j < n_ff; j++) total += x[j], head += j < n_ff / 5 ? x[j] : 0;
        head_share += (double)head / (double)total / r->n_layer;
    }
    /* the Q4_0 axpy's quantization moves the residual more than rounding does (check_same_function) */
    const long allowed = (long)cells / (q4_axpy(r) ? 25 : 100);
    CHECK(moved <= allowed, "%s: %ld of %zu neurons changed firing count on the copy (allowed %ld)", tag, moved, cells,
          allowed);
    CHECK(rises == 0, "%s: %ld rises along the new order", tag, rises);
    /* mkmodel plants 20 % of neurons taking 80 % of firings */
    if (g == 1) CHECK(head_share > 0.7, "%s: the first 20%% of neurons take %.2f of firings", tag, head_share);
    else CHECK(head_share > 0.25, "%s: the first 20%% of neurons (whole blocks) take %.2f of firings", tag, head_share);
    free(c);
}

/* The copy's predictor names neuron j iff the original's names neuron perm[j]. */
static void check_predictor(const char *tag, const model *m, const model *r, const int32_t *perm) {
    char err[256];
    predictor *pa = predictor_load(m, NULL, err, sizeof err), *pb = predictor_load(r, NULL, err, sizeof err);
    CHECK(pa && pb, "%s: predictors: %s", tag, err);
    int32_t *sa = malloc(sizeof *sa * (size_t)m->n_ff), *sb = malloc(sizeof *sb * (size_t)m->n_ff);
    char *in_a = malloc((size_t)m->n_ff);
    float *x = malloc(sizeof *x * (size_t)m->n_embd);
    int ok = pa && pb && sa && sb && in_a && x, tested = 0;
    synth_rng rng = synth_stream(5, 0);
    for (int t = 0; ok && t < 8; t++)
        for (int l = 0; ok && l < m->n_layer; l++) {
            for (int i = 0; i < m->n_embd; i++) x[i] = (float)synth_normal(&rng);
            int na = predictor_predict(pa, l, x, NULL, sa, m->n_ff), nb = predictor_predict(pb, l, x, NULL, sb, m->n_ff);
            ok = na == nb;
            memset(in_a, 0, (size_t)m->n_ff);
            for (int k = 0; k < na; k++) in_a[sa[k]] = 1;
            for (int k = 0; ok && k < nb; k++) ok = in_a[perm[(size_t)l * m->n_ff + sb[k]]];
            tested += na > 0;
        }
    CHECK(ok && tested > 0, "%s: the predicted sets correspond through the order (%d non-empty)", tag, tested);
    predictor_free(pa);
    predictor_free(pb);
    free(sa);
    free(sb);
    free(in_a);
    free(x);
}

static void test_model(const char *name, const char *flags) {
    char path[512], out[600], err[256];
    if (mkmodel_run(tmpdir, name, flags, path, sizeof path)) {
        CHECK(0, "mkmodel %s", flags);
        return;
    }
    snprintf(out, sizeof out, "%s.hot", path);
    model m, r;
    if (model_load(&m, path, err, sizeof err)) {
        CHECK(0, "%s: %s", name, err);
        return;
    }
    size_t cells = (size_t)m.n_layer * m.n_ff;
    uint32_t *counts = malloc(sizeof *counts * cells);
    int32_t *perm = malloc(sizeof *perm * cells);
    predictor_run_opts run = {predictor_calib_prompts, predictor_n_calib_prompts, 192, 16, 2};
    int tokens = counts && perm ? reorder_count_firing(&m, &run, counts, err, sizeof err) : -1;
    CHECK(tokens == run.n_tokens, "%s: %d calibration tokens: %s", name, tokens, err);
    int g = reorder_granularity(&m);
    bool quantized_down = (strstr(flags, "q4_0") || strstr(flags, "q8_0")) && !strstr(flags, "--pwri");
    CHECK(g == (quantized_down ? 32 : 1), "%s: granularity %d", name, g);
    int ok = tokens > 0;
    for (int l = 0; ok && l < m.n_layer; l++)
        ok = reorder_layer_perm(counts + (size_t)l * m.n_ff, m.n_ff, g, perm + (size_t)l * m.n_ff) == 0;
    reorder_plan plan = {perm, counts, tokens, g};
    ok = ok && reorder_write(&m, &plan, out, err, sizeof err) == 0;
    CHECK(ok, "%s: reorder: %s", name, err);
    if (!ok || model_load(&r, out, err, sizeof err)) {
        CHECK(0, "%s: loading the copy: %s", name, err);
        goto out;
    }
    uint64_t n = 0, tok = 0, gran = 0;
    const void *stored = NULL, *fired = NULL;
    CHECK(gguf_get_arr(&r.gguf, REORDER_KEY_PERMUTATION, GGUF_INT32, &n, &stored) && n == cells &&
              !memcmp(stored, perm, sizeof *perm * cells),
          "%s: the order is stored", name);
    int perms = 1;
    for (int l = 0; l < m.n_layer; l++) perms &= is_permutation(perm + (size_t)l * m.n_ff, m.n_ff);
    CHECK(perms, "%s: every layer's order is a permutation", name);
    CHECK(gguf_get_uint(&r.gguf, REORDER_KEY_CALIB_TOKENS, &tok) && tok == (uint64_t)tokens &&
              gguf_get_uint(&r.gguf, REORDER_KEY_GRANULARITY, &gran) && gran == (uint64_t)g,
          "%s: calibration tokens and granularity stored", name);
    int counts_ok = gguf_get_arr(&r.gguf, REORDER_KEY_FIRING, GGUF_UINT32, &n, &fired) && n == cells;
    for (size_t k = 0; counts_ok && k < cells; k++) {
        uint32_t c; /* metadata arrays are not aligned in the file */
        memcpy(&c, (const uint8_t *)fired + k * sizeof c, sizeof c);
        counts_ok = c == counts[k / m.n_ff * m.n_ff + (size_t)perm[k]];
    }
    CHECK(counts_ok, "%s: firing counts stored in the new order", name);
    CHECK(!strcmp(m.gguf.magic, r.gguf.magic) && m.gguf.n_tensors == r.gguf.n_tensors && m.act == r.act,
          "%s: same magic, tensors, activation", name);
    check_tensors(name, &m, &r, perm);
    check_same_function(name, &m, &r, FFN_DENSE);
    check_same_function(name, &m, &r, FFN_GATE_FIRST);
    check_firing_order(name, &r, counts, perm, &run, g);
    if (m.layers[0].fc2.data) check_predictor(name, &m, &r, perm);

    /* refusals: a broken order, single neurons where blocks must stay whole */
    char bad_out[640];
    snprintf(bad_out, sizeof bad_out, "%s.bad", path);
    int32_t saved = perm[1];
    perm[1] = perm[0];
    CHECK(reorder_write(&m, &plan, bad_out, err, sizeof err) == -1 && access(bad_out, F_OK) != 0,
          "%s: a repeated neuron is refused, nothing written", name);
    perm[1] = saved;
    if (g > 1) {
        reorder_plan single = {perm, counts, tokens, 1};
        CHECK(reorder_write(&m, &single, bad_out, err, sizeof err) == -1 && access(bad_out, F_OK) != 0,
              "%s: granularity 1 on a quantized ffn_down is refused: %s", name, err);
    }
    model_free(&r);
out:
    remove(out);
    remove(path);
    model_free(&m);
    free(counts);
    free(perm);
}

static void test_silu_refused(void) {
    char path[512], err[256] = "";
    if (mkmodel_run(tmpdir, "silu.gguf", "--preset tiny --act silu --type f32", path, sizeof path)) {
        CHECK(0, "mkmodel silu");
        return;
    }
    model m;
    if (model_load(&m, path, err, sizeof err)) {
        CHECK(0, "%s", err);
        return;
    }
    uint32_t *c = malloc(sizeof *c * (size_t)m.n_layer * m.n_ff);
    predictor_run_opts run = {predictor_calib_prompts, predictor_n_calib_prompts, 16, 0, 1};
    CHECK(c && reorder_count_firing(&m, &run, c, err, sizeof err) == -1 && strstr(err, "SiLU"),
          "a SiLU model is refused: %s", err);
    free(c);
    model_free(&m);
    remove(path);
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/pi2-reorder-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_layer_perm();
    test_model("f32.gguf", "--preset tiny --act relu --type f32");
    test_model("f16.gguf", "--preset tiny --act relu --type f16 --seed 3");
    test_model("q4_0.gguf", "--preset tiny --act relu --type q4_0");
    test_model("q8_0.gguf", "--preset tiny --act relu --type q8_0 --seed 5");
    test_model("q4_0.pwri", "--preset tiny --act relu --type q4_0 --pwri");
    test_model("f32.pwri", "--preset tiny --act relu --type f32 --pwri --seed 2");
    test_silu_refused();
    rmdir(tmpdir);
    return test_summary();
}

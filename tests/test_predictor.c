/* Activation predictors: the randomized SVD against matrices of known
 * spectrum, the side file (round trip, refusal for another model), the
 * calibrated recall on held-out prompts of a planted ReLU model, PowerInfer's
 * fc1/fc2 against a direct f64 evaluation, and degenerate inputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "engine/model.h"
#include "calib/predictor_build.h"
#include "util/synth_rng.h"
#include "mkmodel_run.h"
#include "test.h"

static char tmpdir[256];

static int mkmodel(const char *name, const char *flags, char *path, size_t cap) {
    return mkmodel_run(tmpdir, name, flags, path, cap);
}

static double frob_error(const float *G, const float *A, const float *B, int rows, int cols, int r) {
    double err = 0;
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < cols; c++) {
            double s = 0;
            for (int t = 0; t < r; t++) s += (double)B[(size_t)i * r + t] * A[(size_t)t * cols + c];
            double d = G[(size_t)i * cols + c] - s;
            err += d * d;
        }
    return sqrt(err);
}

/* n orthonormal vectors of length len (row-major), by Gram-Schmidt of Gaussians. */
static void random_orthonormal(double *Q, int n, int len, uint64_t key) {
    synth_rng rng = synth_stream(key, 0);
    for (int t = 0; t < n; t++) {
        double *v = Q + (size_t)t * len;
        for (int i = 0; i < len; i++) v[i] = synth_normal(&rng);
        for (int pass = 0; pass < 2; pass++)
            for (int s = 0; s < t; s++) {
                double d = 0;
                for (int i = 0; i < len; i++) d += Q[(size_t)s * len + i] * v[i];
                for (int i = 0; i < len; i++) v[i] -= d * Q[(size_t)s * len + i];
            }
        double nn = 0;
        for (int i = 0; i < len; i++) nn += v[i] * v[i];
        for (int i = 0; i < len; i++) v[i] /= sqrt(nn);
    }
}

static void test_factor(void) {
    enum { ROWS = 160, COLS = 96, R0 = 8 };
    float *G = malloc(sizeof(float) * ROWS * COLS), *A = malloc(sizeof(float) * 64 * COLS),
          *B = malloc(sizeof(float) * ROWS * 64);
    /* exactly rank 8: G = U V */
    synth_rng rng = synth_stream(7, 0);
    double U[ROWS * R0], V[R0 * COLS];
    for (int i = 0; i < ROWS * R0; i++) U[i] = synth_normal(&rng);
    for (int i = 0; i < R0 * COLS; i++) V[i] = synth_normal(&rng);
    double norm = 0;
    for (int i = 0; i < ROWS; i++)
        for (int c = 0; c < COLS; c++) {
            double s = 0;
            for (int t = 0; t < R0; t++) s += U[i * R0 + t] * V[t * COLS + c];
            G[i * COLS + c] = (float)s;
            norm += s * s;
        }
    norm = sqrt(norm);
    for (int r = R0; r <= R0 + 4; r += 4) {
        CHECK(lowrank_factor(G, ROWS, COLS, r, 1, 3, 2, A, B) == 0, "factor rank %d", r);
        double e = frob_error(G, A, B, ROWS, COLS, r) / norm;
        CHECK(e < 1e-5, "rank-%d matrix at rank %d: relative error %.3g", R0, r, e);
    }

    /* known spectrum sigma_i = 0.9^i: the optimal rank-r error is sqrt(sum_{i>=r} sigma_i^2) */
    double *P = malloc(sizeof(double) * COLS * ROWS), *Qm = malloc(sizeof(double) * COLS * COLS);
    random_orthonormal(P, COLS, ROWS, 11);
    random_orthonormal(Qm, COLS, COLS, 12);
    for (int i = 0; i < ROWS; i++)
        for (int c = 0; c < COLS; c++) {
            double s = 0;
            for (int t = 0; t < COLS; t++) s += P[(size_t)t * ROWS + i] * pow(0.9, t) * Qm[(size_t)t * COLS + c];
            G[i * COLS + c] = (float)s;
        }
    double prev = INFINITY;
    const int ranks[] = {4, 16, 32, 64};
    for (int k = 0; k < 4; k++) {
        int r = ranks[k];
        double opt = 0;
        for (int t = r; t < COLS; t++) opt += pow(0.81, t);
        opt = sqrt(opt);
        CHECK(lowrank_factor(G, ROWS, COLS, r, 2, 5, 1, A, B) == 0, "factor rank %d", r);
        double e = frob_error(G, A, B, ROWS, COLS, r);
        CHECK(e < prev, "error falls with rank: rank %d error %.4g, previous %.4g", r, e, prev);
        CHECK(e >= opt * (1 - 1e-4) && e <= opt * 1.01, "rank %d: error %.5g vs optimal %.5g", r, e, opt);
        prev = e;
    }
    CHECK(lowrank_factor(G, ROWS, COLS, COLS + 1, 2, 5, 1, A, B) != 0, "rank above min(rows, cols) is refused");
    free(G); free(A); free(B); free(P); free(Qm);
}

/* Round trip: what the loader computes equals an f64 evaluation of the stored tensors. */
static void test_side_file(const model *m, const char *pred_path, const model *other, const model *other_shape) {
    char err[512];
    predictor *p = predictor_load(m, pred_path, err, sizeof err);
    CHECK(p != NULL, "load side file: %s", err);
    if (!p) return;
    CHECK(predictor_get_kind(p) == PREDICTOR_LOWRANK && predictor_get_input(p) == PREDICTOR_INPUT_FFN_NORM_OUT,
          "kind and input");
    gguf_file g;
    CHECK(gguf_open(&g, pred_path, err, sizeof err) == 0, "open side file: %s", err);
    uint64_t n_thr = 0, rank = 0;
    const void *thr = NULL;
    gguf_get_uint(&g, PRED_KEY_RANK, &rank);
    CHECK(gguf_get_arr(&g, PRED_KEY_THRESHOLDS, GGUF_FLOAT32, &n_thr, &thr) && n_thr == (uint64_t)m->n_layer,
          "thresholds array");
    CHECK((int)rank == predictor_max_rank(p), "rank %llu vs %d", (unsigned long long)rank, predictor_max_rank(p));
    for (int l = 0; thr && l < m->n_layer; l++) {
        float t; /* metadata arrays are not aligned */
        memcpy(&t, (const char *)thr + sizeof t * (size_t)l, sizeof t);
        CHECK(t == predictor_threshold(p, l), "threshold of layer %d", l);
    }

    int n = m->n_embd, ff = m->n_ff, r = (int)rank;
    float *x = malloc(sizeof(float) * n), *logits = malloc(sizeof(float) * ff);
    float *arow = malloc(sizeof(float) * n), *brow = malloc(sizeof(float) * r);
    double *h = malloc(sizeof(double) * r);
    synth_rng rng = synth_stream(99, 0);
    for (int i = 0; i < n; i++) x[i] = (float)synth_normal(&rng);
    for (int l = 0; l < m->n_layer; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.pred_a.weight", l);
        const gguf_tensor *ta = gguf_find_tensor(&g, name);
        snprintf(name, sizeof name, "blk.%d.pred_b.weight", l);
        const gguf_tensor *tb = gguf_find_tensor(&g, name);
        CHECK(ta && tb, "layer %d tensors present", l);
        if (!ta || !tb) break;
        predictor_logits(p, l, NULL, x, logits);
        size_t ra = ggml_row_bytes(ta->type, (uint64_t)n), rb = ggml_row_bytes(tb->type, (uint64_t)r);
        double hnorm = 0;
        for (int t = 0; t < r; t++) {
            dequantize_row(ta->type, (const char *)ta->data + t * ra, arow, n);
            h[t] = 0;
            for (int i = 0; i < n; i++) h[t] += (double)arow[i] * x[i];
            hnorm += h[t] * h[t];
        }
        int bad = 0;
        for (int i = 0; i < ff; i++) {
            dequantize_row(tb->type, (const char *)tb->data + i * rb, brow, r);
            double s = 0, bn = 0;
            for (int t = 0; t < r; t++) s += (double)brow[t] * h[t], bn += (double)brow[t] * brow[t];
            /* activations go through F16 (or Q8_0) like the model's: allow that rounding */
            bad += fabs(logits[i] - s) > 2e-2 * sqrt(bn * hnorm) + 1e-6;
        }
        CHECK(bad == 0, "layer %d: %d of %d logits differ from the f64 evaluation", l, bad, ff);
    }
    gguf_close(&g);
    predictor_free(p);

    /* another model of the same shape (other seed) and one of another shape are refused */
    p = predictor_load(other, pred_path, err, sizeof err);
    CHECK(p == NULL && strstr(err, "another model file"), "other seed refused: %s", p ? "(loaded)" : err);
    predictor_free(p);
    p = predictor_load(other_shape, pred_path, err, sizeof err);
    CHECK(p == NULL && strstr(err, "n_ff"), "other shape refused: %s", p ? "(loaded)" : err);
    predictor_free(p);
    p = predictor_load(m, NULL, err, sizeof err);
    CHECK(p == NULL && strstr(err, "no PowerInfer predictor"), "no fc1/fc2 and no side file: %s", p ? "(loaded)" : err);
    predictor_free(p);

    /* a truncated side file is refused, not read past its end */
    char cut_path[512], cmd[1200];
    snprintf(cut_path, sizeof cut_path, "%s/cut.gguf", tmpdir);
    snprintf(cmd, sizeof cmd, "head -c 3000 %s > %s", pred_path, cut_path);
    CHECK(system(cmd) == 0, "truncate");
    p = predictor_load(m, cut_path, err, sizeof err);
    CHECK(p == NULL, "truncated side file refused");
    predictor_free(p);
    free(x); free(logits); free(arow); free(brow); free(h);
}

static void test_degenerate_inputs(predictor *p, const model *m) {
    int n = m->n_embd;
    float *zero = calloc((size_t)n, sizeof(float)), *huge = malloc(sizeof(float) * n);
    int32_t *active = malloc(sizeof(int32_t) * m->n_ff);
    for (int i = 0; i < n; i++) huge[i] = (i % 2 ? -1 : 1) * 3e38f;
    for (int l = 0; l < m->n_layer; l++) {
        int a = predictor_predict(p, l, zero, zero, active, m->n_ff);
        int b = predictor_predict(p, l, huge, huge, active, m->n_ff);
        CHECK(a >= 0 && a <= m->n_ff && b >= 0 && b <= m->n_ff, "layer %d: counts %d, %d", l, a, b);
        int c = predictor_predict(p, l, zero, zero, active, 3);
        CHECK(c == a, "a small cap still returns the count (%d vs %d)", c, a);
    }
    free(zero); free(huge); free(active);
}

/* PowerInfer: fc2 . relu(fc1 . x) >= threshold, against f64 with the weights dequantized. */
static void test_powerinfer(const model *m) {
    char err[512];
    predictor *p = predictor_load(m, NULL, err, sizeof err);
    CHECK(p != NULL, "load PWRI predictor: %s", err);
    if (!p) return;
    CHECK(predictor_get_kind(p) == PREDICTOR_POWERINFER && predictor_get_input(p) == PREDICTOR_INPUT_RESIDUAL,
          "kind and input");
    int n = m->n_embd, ff = m->n_ff;
    float *x = malloc(sizeof(float) * n), *row = malloc(sizeof(float) * (n > ff ? n : ff));
    int32_t *active = malloc(sizeof(int32_t) * ff);
    uint8_t *want = malloc((size_t)ff);
    double *h = NULL, *logit = malloc(sizeof(double) * ff), *tol = malloc(sizeof(double) * ff);
    float *got_logits = malloc(sizeof(float) * ff);
    synth_rng rng = synth_stream(5, 0);
    int total_near = 0, total_cells = 0;
    for (int trial = 0; trial < 4; trial++) {
        /* token embeddings (the residual's distribution) and plain Gaussians */
        int tok = trial * 37 + 5;
        if (trial % 2 == 0)
            dequantize_row(m->tok_embd.type, (const char *)m->tok_embd.data + (size_t)tok * m->tok_embd.row_bytes, x, n);
        else
            for (int i = 0; i < n; i++) x[i] = (float)synth_normal(&rng);
        for (int l = 0; l < m->n_layer; l++) {
            const weight *f1 = &m->layers[l].fc1, *f2 = &m->layers[l].fc2;
            h = realloc(h, sizeof(double) * (size_t)f1->rows);
            double hn = 0;
            for (int64_t t = 0; t < f1->rows; t++) {
                dequantize_row(f1->type, (const char *)f1->data + t * f1->row_bytes, row, n);
                double s = 0;
                for (int i = 0; i < n; i++) s += (double)row[i] * x[i];
                h[t] = s > 0 ? s : 0;
                hn += h[t] * h[t];
            }
            for (int i = 0; i < ff; i++) {
                dequantize_row(f2->type, (const char *)f2->data + (size_t)i * f2->row_bytes, row, (int)f2->cols);
                double s = 0, bn = 0;
                for (int64_t t = 0; t < f2->cols; t++) s += (double)row[t] * h[t], bn += (double)row[t] * row[t];
                logit[i] = s;
                tol[i] = 1e-2 * sqrt(bn * hn) + 1e-6; /* the activations are rounded to F16, as in ggml */
                want[i] = s >= m->sparse_threshold;
                if (fabs(s - m->sparse_threshold) < tol[i]) want[i] = 2; /* either answer is right */
            }
            int cnt = predictor_predict(p, l, x, NULL, active, ff), wrong = 0, ascending = 1;
            uint8_t *got = calloc((size_t)ff, 1);
            for (int k = 0; k < cnt && k < ff; k++) {
                got[active[k]] = 1;
                if (k && active[k] <= active[k - 1]) ascending = 0;
            }
            for (int i = 0; i < ff; i++) {
                if (want[i] == 2) total_near++;
                else wrong += got[i] != want[i];
            }
            total_cells += ff;
            predictor_logits(p, l, x, NULL, got_logits);
            int off = 0;
            for (int i = 0; i < ff; i++) off += fabs(got_logits[i] - logit[i]) > tol[i];
            CHECK(off == 0, "trial %d layer %d: %d logits differ from f64", trial, l, off);
            CHECK(ascending, "indices ascending");
            CHECK(wrong == 0, "trial %d layer %d: %d neurons disagree with f64", trial, l, wrong);
            free(got);
        }
    }
    CHECK(total_near < total_cells / 20, "few neurons near the threshold (%d of %d): the check has teeth", total_near,
          total_cells);
    test_degenerate_inputs(p, m);
    free(x); free(row); free(active); free(want); free(h); free(logit); free(tol); free(got_logits);
    predictor_free(p);
}

/* One Q8_0 copy made for every process (predictor_q8_0_image_write) gives the
 * logits a predictor converting for itself gives, bit for bit, and is read in place. */
static void test_shared_copy(const model *m) {
    char err[512];
    const uint64_t bytes = predictor_q8_0_image_bytes(m);
    predictor *own = predictor_load(m, NULL, err, sizeof err), *shared = NULL;
    uint8_t *image = malloc(bytes ? bytes : 1);
    CHECK(own && image, "load the PWRI predictor: %s", err);
    if (!own || !image) goto out;
    CHECK(predictor_q8_0_image_write(m, image, bytes + 1, err, sizeof err) != 0 &&
              !predictor_load_shared(m, image, bytes + 1, err, sizeof err),
          "a copy of the wrong size is refused");
    CHECK(predictor_q8_0_image_write(m, image, bytes, err, sizeof err) == 0, "write the shared copy: %s", err);
    shared = predictor_load_shared(m, image, bytes, err, sizeof err);
    CHECK(shared != NULL, "load over the shared copy: %s", err);
    if (!shared) goto out;
    if (!bytes) printf("the shared predictor copy: none on this CPU's kernels (the predictor stays F16)\n");
    const int n = m->n_embd, ff = m->n_ff;
    float *x = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * ff), *b = malloc(sizeof(float) * ff);
    synth_rng rng = synth_stream(11, 0);
    for (int i = 0; i < n; i++) x[i] = (float)synth_normal(&rng);
    int same = 1;
    for (int l = 0; l < m->n_layer; l++) {
        predictor_logits(own, l, x, NULL, a);
        predictor_logits(shared, l, x, NULL, b);
        same &= memcmp(a, b, sizeof(float) * ff) == 0;
    }
    CHECK(same, "the shared copy's logits equal a worker's own copy's, bit for bit");
    if (bytes) { /* read in place: spoiling the image's last layer changes its logits */
        memset(image + bytes / 2, 0x7f, bytes - bytes / 2);
        predictor_logits(shared, m->n_layer - 1, x, NULL, b);
        predictor_logits(own, m->n_layer - 1, x, NULL, a);
        CHECK(memcmp(a, b, sizeof(float) * ff) != 0, "the predictor reads the shared copy in place");
    }
    free(x); free(a); free(b);
out:
    predictor_free(own);
    predictor_free(shared);
    free(image);
}

static void overall(const model *m, const predictor_layer_stats *s, double *recall, double *precision, double *frac,
                    double *truth) {
    uint64_t hits = 0, pred = 0, tru = 0, tokens = 0;
    for (int l = 0; l < m->n_layer; l++) hits += s[l].hits, pred += s[l].predicted, tru += s[l].true_active,
                                          tokens += s[l].tokens;
    *recall = tru ? (double)hits / tru : 0;
    *precision = pred ? (double)hits / pred : 0;
    *frac = (double)pred / ((double)tokens * m->n_ff);
    *truth = (double)tru / ((double)tokens * m->n_ff);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pi2-test-predictor-%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", tmpdir, tmpdir);
    if (system(cmd)) return fprintf(stderr, "cannot create %s\n", tmpdir), 1;

    test_factor();

    const char *shape = "--dim 256 --layers 3 --heads 4 --kv-heads 2 --ff 1024 --vocab 1024 --ctx 256 --act relu "
                        "--type q8_0";
    char relu_path[300], other_path[300], shape_path[300], pwri_path[300], pred_path[300], flags[400];
    snprintf(flags, sizeof flags, "%s --seed 1", shape);
    int gen = mkmodel("relu.gguf", flags, relu_path, sizeof relu_path);
    snprintf(flags, sizeof flags, "%s --seed 2", shape);
    gen |= mkmodel("other.gguf", flags, other_path, sizeof other_path);
    gen |= mkmodel("shape.gguf", "--preset tiny --act relu --type q8_0 --layers 3 --dim 256 --ff 512", shape_path,
                   sizeof shape_path);
    gen |= mkmodel("pwri.gguf", "--preset tiny --act relu --type q8_0 --pwri --layers 3", pwri_path, sizeof pwri_path);
    CHECK(gen == 0, "mkmodel generates the test models (%s/bin/mkmodel)", test_build_dir());
    snprintf(pred_path, sizeof pred_path, "%s/relu.pred.gguf", tmpdir);

    model m, other, other_shape, pwri;
    char err[512];
    bool ok = gen == 0 && model_load(&m, relu_path, err, sizeof err) == 0;
    ok = ok && model_load(&other, other_path, err, sizeof err) == 0;
    ok = ok && model_load(&other_shape, shape_path, err, sizeof err) == 0;
    ok = ok && model_load(&pwri, pwri_path, err, sizeof err) == 0;
    CHECK(ok, "load the test models: %s", err);
    if (ok) {
        predictor_build_opts b = {pred_path, 0, 0.99, 0.2, GGML_TYPE_F16, 2,
                                  {predictor_calib_prompts, predictor_n_calib_prompts, 192, 16, 2}};
        CHECK(predictor_build(&m, &b, err, sizeof err) == 0, "build: %s", err);
        test_side_file(&m, pred_path, &other, &other_shape);

        /* held-out prompts: recall at the target, and a useful predicted fraction */
        predictor *p = predictor_load(&m, pred_path, err, sizeof err);
        CHECK(p != NULL, "reload: %s", err);
        if (p) {
            predictor_layer_stats *st = calloc((size_t)m.n_layer, sizeof *st);
            predictor_run_opts ev = {predictor_eval_prompts, predictor_n_eval_prompts, 192, 16, 2};
            int tokens = predictor_eval(&m, p, &ev, st, err, sizeof err);
            CHECK(tokens == 192, "eval ran %d tokens: %s", tokens, err);
            double recall, precision, frac, truth;
            overall(&m, st, &recall, &precision, &frac, &truth);
            printf("planted ReLU (dim 256, ff 1024, rank %d): held-out recall %.4f precision %.4f predicted %.4f "
                   "true %.4f\n",
                   predictor_max_rank(p), recall, precision, frac, truth);
            CHECK(fabs(recall - 0.99) <= 0.02, "held-out recall %.4f within 0.02 of 0.99", recall);
            CHECK(precision > 0.5 && frac < 2.5 * truth, "precision %.3f, predicted %.3f vs true %.3f", precision, frac,
                  truth);
            CHECK(truth > 0.05 && truth < 0.2, "the planted firing rate (%.3f) is ~0.1", truth);
            test_degenerate_inputs(p, &m);
            free(st);
            predictor_free(p);
        }
        test_powerinfer(&pwri);
        test_shared_copy(&pwri);
        model_free(&m); model_free(&other); model_free(&other_shape); model_free(&pwri);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_summary();
}

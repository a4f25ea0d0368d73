/* lib/engine/chunk_split.c: the FFN chunks dealt to the workers in contiguous
 * ranges balanced by cost. The split is checked against an exhaustive
 * search for each boundary (the chunk boundary nearest the worker's share),
 * the costs against sums made here from the counts the test writes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chunk_split.h"
#include "engine/ffn_chunks.h"
#include "gguf/gguf.h"
#include "calib/reorder.h"
#include "test.h"

/* The smallest b whose prefix cost is nearest target. */
static int nearest_boundary(const double *cost, int n, double target) {
    int best = 0;
    double prefix = 0, best_gap = fabs(target);
    for (int b = 1; b <= n; b++) {
        prefix += cost[b - 1];
        if (fabs(prefix - target) < best_gap) best = b, best_gap = fabs(prefix - target);
    }
    return best;
}

/* Ranges cover [0, n) in order, each ending at the boundary nearest its
 * share: an even one, or with at[] (chunk_split_at) worker w's from at[w]. */
static void check_split_at(const char *what, const double *cost, int n, int nw, const double *at) {
    double total = 0;
    for (int c = 0; c < n; c++) total += cost[c];
    int expect_first = 0, ok = 1, bounds[6];
    if (at) chunk_split_at(cost, n, nw, at, bounds);
    else chunk_split(cost, n, nw, bounds);
    for (int w = 0; w < nw; w++) {
        const int first = bounds[w], count = bounds[w + 1] - bounds[w];
        const double share_end = at ? at[w + 1] : (double)(w + 1) / nw;
        const int end = w == nw - 1 ? n : nearest_boundary(cost, n, total * share_end);
        ok &= first == expect_first && count >= 0 && first + count == end;
        expect_first = first + count;
    }
    CHECK(ok && expect_first == n, "%s, %d chunks over %d workers: not the nearest contiguous ranges", what, n, nw);
}

static void check_split(const char *what, const double *cost, int n, int nw) { check_split_at(what, cost, n, nw, NULL); }

static void test_split(void) {
    double cost[64];
    srand(7);
    for (int n = 1; n <= 64; n += 7)
        for (int nw = 1; nw <= 5; nw++) {
            for (int c = 0; c < n; c++) cost[c] = 1.0;
            check_split("equal costs", cost, n, nw);
            for (int c = 0; c < n; c++) cost[c] = c < n / 5 ? 8.0 : 1.0; /* hot-first */
            check_split("hot first", cost, n, nw);
            for (int c = 0; c < n; c++) cost[c] = 0.5 + rand() % 100;
            check_split("random costs", cost, n, nw);
            double at[6] = {0}; /* uneven shares, as a balanced decode split moves them */
            for (int w = 1; w < nw; w++) at[w] = at[w - 1] + (1 - at[w - 1]) * (0.1 + 0.8 * (rand() % 100) / 100.0) / 2;
            at[nw] = 1;
            check_split_at("random costs, uneven shares", cost, n, nw, at);
        }
    /* two workers, four hot chunks of 10 and 18 of 1: half the total (29) is
     * nearest the boundary after three hot chunks */
    for (int c = 0; c < 22; c++) cost[c] = c < 4 ? 10.0 : 1.0;
    int bounds[3];
    chunk_split(cost, 22, 2, bounds);
    const int first = bounds[0], count = bounds[1] - bounds[0];
    CHECK(first == 0 && count == 3, "hot first: worker 0 got chunks %d+%d, not 0+3", first, count);
}

/* A model with only what chunk_costs reads: its shape and, when counts is
 * given, a GGUF image holding the firing counts of tokens tokens. */
typedef struct {
    model m;
    char *image;
    size_t size;
} counted_model;

static int counted_model_make(counted_model *cm, int n_layer, int n_ff, const uint32_t *counts, uint64_t cells,
                              uint32_t tokens) {
    memset(cm, 0, sizeof *cm);
    cm->m.n_layer = n_layer;
    cm->m.n_ff = n_ff;
    if (!counts) return 0;
    FILE *fp = open_memstream(&cm->image, &cm->size);
    gguf_writer *w = gguf_writer_new("GGUF", 32);
    gguf_w_u32(w, REORDER_KEY_CALIB_TOKENS, tokens);
    gguf_w_arr(w, REORDER_KEY_FIRING, GGUF_UINT32, cells, counts);
    int rc = gguf_w_begin(w, fp) || gguf_w_finish(w);
    gguf_writer_free(w);
    fclose(fp);
    char err[256];
    if (rc || gguf_parse(&cm->m.gguf, cm->image, cm->size, "counts", err, sizeof err)) {
        CHECK(0, "writing the counts image failed");
        return -1;
    }
    return 0;
}

static void counted_model_free(counted_model *cm) {
    if (cm->image) gguf_close(&cm->m.gguf);
    free(cm->image);
}

/* Costs are proportional to neurons + (firings per token) x the ratio of
 * a firing neuron's cost to a predictor row's; checked as ratios between
 * chunks, with the per-token firings summed here. */
static void test_costs(void) {
    enum { LAYERS = 2, NFF = 2048, TOKENS = 4 };
    static uint32_t counts[LAYERS * NFF];
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < NFF; i++) counts[l * NFF + i] = i < 256 ? TOKENS : i % 16 == 0 ? 1 : 0;
    counted_model cm;
    if (counted_model_make(&cm, LAYERS, NFF, counts, LAYERS * NFF, TOKENS)) return;
    const int n = ffn_chunk_count(&cm.m);
    double cost[64], firings[64] = {0}, neurons[64] = {0};
    chunk_costs(&cm.m, cost);
    for (int c = 0; c < n; c++) {
        long n0, n1;
        ffn_chunk_range(&cm.m, c, &n0, &n1);
        neurons[c] = (double)(n1 - n0) * LAYERS;
        for (int l = 0; l < LAYERS; l++)
            for (long i = n0; i < n1; i++) firings[c] += counts[l * NFF + i] / (double)TOKENS;
    }
    /* cost = a * neurons + b * firings: solve a, b from chunks 0 (hot) and n-1 (cold), check every chunk */
    const double det = neurons[0] * firings[n - 1] - neurons[n - 1] * firings[0];
    const double a = (cost[0] * firings[n - 1] - cost[n - 1] * firings[0]) / det;
    const double b = (neurons[0] * cost[n - 1] - neurons[n - 1] * cost[0]) / det;
    int fits = a > 0 && b > a; /* a firing neuron costs more than a predictor row */
    for (int c = 0; c < n; c++) fits &= fabs(cost[c] - (a * neurons[c] + b * firings[c])) <= 1e-9 * cost[c];
    CHECK(n > 2 && fits, "chunk costs are not a * neurons + b * firings (a %g, b %g)", a, b);
    CHECK(cost[0] > 4 * cost[n - 1], "the hot chunk (%g) does not cost several cold ones (%g)", cost[0], cost[n - 1]);
    counted_model_free(&cm);

    /* without counts, or with counts of the wrong shape: cost follows the neurons */
    double plain[64], wrong[64];
    counted_model_make(&cm, LAYERS, NFF, NULL, 0, 0);
    chunk_costs(&cm.m, plain);
    counted_model_free(&cm);
    if (counted_model_make(&cm, LAYERS, NFF, counts, LAYERS * NFF - 1, TOKENS)) return;
    chunk_costs(&cm.m, wrong);
    counted_model_free(&cm);
    int even = 1;
    for (int c = 0; c < n; c++) {
        long n0, n1;
        ffn_chunk_range(&cm.m, c, &n0, &n1);
        even &= fabs(plain[c] / plain[0] - (double)(n1 - n0) / (double)ffn_chunk_neurons(&cm.m)) < 1e-12;
        even &= plain[c] == wrong[c];
    }
    CHECK(even, "without counts (or with counts of the wrong shape) the costs do not follow the neurons");
}

/* chunk_split_model on a model without counts: equal ranges, in order. */
static void test_worker_chunks(void) {
    counted_model cm;
    counted_model_make(&cm, 4, 11008, NULL, 0, 0);
    const int n = ffn_chunk_count(&cm.m);
    int bounds[3], next = 0, ok = n == 22 && chunk_split_model(&cm.m, 2, bounds) == 0;
    for (int w = 0; ok && w < 2; w++) {
        const int k = bounds[w + 1] - bounds[w];
        ok &= k == 11;
        for (int i = 0; i < k; i++) ok &= bounds[w] + i == next++;
    }
    CHECK(ok && next == n, "7B shape, two workers: not chunks 0-10 and 11-21");
}

int main(void) {
    test_split();
    test_costs();
    test_worker_chunks();
    return test_summary();
}

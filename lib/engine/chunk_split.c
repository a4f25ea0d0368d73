#include "engine/chunk_split.h"

#include <stdlib.h>
#include <string.h>

#include "engine/ffn_chunks.h"

/* Per decode token on the 7B bench model (Q4_0, two workers; timers in a
 * scratch build of ffn_chunks_run, 2026-11-22): ~15 ns per predictor
 * row, ~700 ns per firing neuron (gate ~200, up ~200, down ~280). Only
 * their ratio matters. */
#define PREDICTOR_ROW_NS 15.0
#define FIRING_NEURON_NS 700.0
#define DEFAULT_FIRING 0.10 /* share of neurons firing per token without counts */

void chunk_costs(const model *m, double *cost) {
    const int n = ffn_chunk_count(m);
    uint64_t cells = 0, tokens = 0;
    const void *data = NULL;
    const bool counted = gguf_get_arr(&m->gguf, REORDER_KEY_FIRING, GGUF_UINT32, &cells, &data) &&
                         cells == (uint64_t)m->n_layer * (uint64_t)m->n_ff &&
                         gguf_get_uint(&m->gguf, REORDER_KEY_CALIB_TOKENS, &tokens) && tokens > 0;
    const uint8_t *counts = data; /* u32s at any alignment in the file: read by memcpy */
    for (int c = 0; c < n; c++) {
        long n0, n1;
        ffn_chunk_range(m, c, &n0, &n1);
        double firings = 0; /* per token, over the layers */
        if (counted) {
            for (int l = 0; l < m->n_layer; l++)
                for (long i = n0; i < n1; i++) {
                    uint32_t count;
                    memcpy(&count, counts + sizeof count * ((size_t)l * (size_t)m->n_ff + (size_t)i), sizeof count);
                    firings += count;
                }
            firings /= (double)tokens;
        } else {
            firings = DEFAULT_FIRING * (double)(n1 - n0) * m->n_layer;
        }
        cost[c] = PREDICTOR_ROW_NS * (double)(n1 - n0) * m->n_layer + FIRING_NEURON_NS * firings;
    }
}

void chunk_split_at(const double *cost, int n, int n_workers, const double *at, int *bounds) {
    double total = 0;
    for (int c = 0; c < n; c++) total += cost[c];
    double prefix = 0; /* of chunks [0, b) */
    int b = 0;
    bounds[0] = 0;
    for (int k = 1; k < n_workers; k++) { /* past each chunk whose middle is short of at[k] of the total */
        const double target = at ? total * at[k] : total * k / n_workers;
        while (b < n && prefix + cost[b] / 2 < target) prefix += cost[b++];
        bounds[k] = b;
    }
    bounds[n_workers] = n;
}

void chunk_split(const double *cost, int n, int n_workers, int *bounds) { chunk_split_at(cost, n, n_workers, NULL, bounds); }

int chunk_split_model(const model *m, int n_workers, int *bounds) {
    const int n = ffn_chunk_count(m);
    double *cost = malloc(sizeof(double) * (size_t)n);
    if (!cost) return -1;
    chunk_costs(m, cost);
    chunk_split(cost, n, n_workers, bounds);
    free(cost);
    return 0;
}

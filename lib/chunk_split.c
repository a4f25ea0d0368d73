#include "chunk_split.h"

#include <stdlib.h>
#include <string.h>

#include "ffn_chunks.h"
#include "reorder.h"

/* Per decode token on the 7B bench model (Q4_0, two workers; timers in a
 * scratch build of ffn_chunks_run, ninth session): ~15 ns per predictor
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

/* The boundary before worker k: the chunk boundary whose prefix cost is
 * nearest k / n_workers of the total. Monotonic in k, 0 for k = 0 and n for
 * k = n_workers. */
static int boundary(const double *cost, int n, int k, int n_workers) {
    double total = 0;
    for (int c = 0; c < n; c++) total += cost[c];
    const double target = total * k / n_workers;
    double prefix = 0;
    int b = 0;
    while (b < n && prefix + cost[b] / 2 < target) prefix += cost[b++];
    return k == n_workers ? n : b;
}

void chunk_split(const double *cost, int n, int worker, int n_workers, int *first, int *count) {
    const int b0 = boundary(cost, n, worker, n_workers), b1 = boundary(cost, n, worker + 1, n_workers);
    *first = b0;
    *count = b1 - b0;
}

int chunk_split_worker(const model *m, int worker, int n_workers, int32_t *out) {
    const int n = ffn_chunk_count(m);
    double *cost = malloc(sizeof(double) * (size_t)n);
    if (!cost) return -1;
    chunk_costs(m, cost);
    int first, count;
    chunk_split(cost, n, worker, n_workers, &first, &count);
    free(cost);
    for (int k = 0; k < count; k++) out[k] = first + k;
    return count;
}

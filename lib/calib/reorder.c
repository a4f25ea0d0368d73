/* Hot-neuron layout: measuring firing frequency and choosing each layer's order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/ggml_types.h"
#include "calib/reorder.h"

typedef struct {
    int n_ff;
    uint32_t *counts;
} count_ctx;

static void count_observer(void *ctx, const ffn_observation *o) {
    count_ctx *c = ctx;
    uint32_t *row = c->counts + (size_t)o->layer * c->n_ff;
    for (int i = 0; i < c->n_ff; i++) row[i] += o->gate[i] > 0;
}

int reorder_count_firing(const model *m, const predictor_run_opts *o, uint32_t *counts, char *err, size_t errlen) {
    if (m->act == FFN_SILU) {
        snprintf(err, errlen, "the model's FFN is SiLU: every neuron fires, there is no hot set to lay out");
        return -1;
    }
    memset(counts, 0, sizeof *counts * (size_t)m->n_layer * (size_t)m->n_ff);
    count_ctx c = {m->n_ff, counts};
    return predictor_run_prompts(m, o, count_observer, &c, err, errlen);
}

int reorder_granularity(const model *m) {
    for (int l = 0; l < m->n_layer; l++) {
        const weight *d = &m->layers[l].down;
        if (d->data && ggml_block_elems(d->type) > 1) return (int)ggml_block_elems(d->type);
    }
    return 1;
}

typedef struct {
    uint64_t count;
    int32_t index;
} ranked;

/* Descending count, then ascending index: a deterministic order. */
static int by_count_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

int reorder_layer_perm(const uint32_t *counts, int n_ff, int granularity, int32_t *perm) {
    if (granularity < 1 || n_ff < 1 || n_ff % granularity) return -1;
    int n_blocks = n_ff / granularity;
    ranked *r = malloc(sizeof *r * (size_t)(n_blocks > granularity ? n_blocks : granularity));
    if (!r) return -1;
    for (int b = 0; b < n_blocks; b++) {
        r[b].count = 0, r[b].index = b;
        for (int k = 0; k < granularity; k++) r[b].count += counts[b * granularity + k];
    }
    qsort(r, (size_t)n_blocks, sizeof *r, by_count_desc);
    for (int b = 0; b < n_blocks; b++) perm[b * granularity] = r[b].index * granularity;
    for (int b = 0; b < n_blocks; b++) {
        int32_t first = perm[b * granularity];
        for (int k = 0; k < granularity; k++) r[k].count = counts[first + k], r[k].index = first + k;
        qsort(r, (size_t)granularity, sizeof *r, by_count_desc);
        for (int k = 0; k < granularity; k++) perm[b * granularity + k] = r[k].index;
    }
    free(r);
    return 0;
}

int reorder_check_perm(const int32_t *perm, int n, int granularity) {
    if (granularity < 1 || n % granularity) return -1;
    unsigned char *seen = calloc((size_t)n, 1);
    if (!seen) return -1;
    int rc = 0;
    for (int j = 0; j < n && !rc; j++) {
        int32_t i = perm[j];
        if (i < 0 || i >= n || seen[i] || i / granularity != perm[j / granularity * granularity] / granularity)
            rc = -1;
        else
            seen[i] = 1;
    }
    free(seen);
    return rc;
}

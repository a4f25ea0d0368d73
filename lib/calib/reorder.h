/* Hot-neuron layout: a copy of a ReLU model whose FFN neurons are
 * renumbered, per layer, by descending firing frequency on calibration prompts,
 * so the neurons that fire most often sit together at the start of every
 * neuron-major matrix (PowerInfer-2's offline layout). Sparse decode then
 * gathers its rows from a few dense runs instead of the whole matrix.
 *
 * Renumbering hidden units leaves the function unchanged: new neuron j is old
 * neuron perm[j], so the rows of ffn_gate, ffn_up, ffn_down_t and fc2 (the
 * PWRI predictor's per-neuron rows) move to new positions, the columns of
 * ffn_down likewise; fc1 and everything else are copied. Every element keeps
 * its bits: only the order of the FFN's sums changes (logits move by rounding).
 *
 * Exactness decides the granularity. Rows move intact in any type, and F32 /
 * F16 ffn_down columns are single elements, so PWRI files and F32 / F16 GGUF
 * files get the full order. A Q4_0 / Q8_0 ffn_down stores 32 neurons per
 * block with one scale: moving a column alone would mean requantizing. There
 * the neurons move as whole 32-neuron blocks (blocks sorted by their summed
 * firing, then the neurons inside each block, whose quants share the block's
 * scale and can be reordered exactly).
 *
 * Errors: reorder_count_firing and reorder_write return -1 with a message in
 * err (errlen bytes); reorder_layer_perm and reorder_check_perm return -1
 * without one (bad arguments, a rejected permutation, or out of memory).
 * reorder_granularity cannot fail. */
#ifndef PI2_REORDER_H
#define PI2_REORDER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "calib/predictor_build.h"

/* Firing counts of the reference engine over the calibration tokens:
 * counts[l * n_ff + i] = tokens on which neuron i of layer l had gate > 0
 * (a non-zero ReLU activation). ReLU / ReLU² models only. Returns the number
 * of tokens run, or -1 with a message in err. */
int reorder_count_firing(const model *m, const predictor_run_opts *o, uint32_t *counts, char *err, size_t errlen);

/* The neuron granularity the file allows exactly: 32 when a layer has a
 * quantized ffn_down matrix, else 1. */
int reorder_granularity(const model *m);

/* One layer's order: perm[j] = the old neuron placed at j, by descending
 * count (ties: ascending index). granularity 32: whole blocks of 32 neurons by
 * descending summed count, then each block's neurons by descending count;
 * n_ff must be a multiple of 32. Returns 0, or -1 (bad granularity / n_ff, out
 * of memory). */
int reorder_layer_perm(const uint32_t *counts, int n_ff, int granularity, int32_t *perm);

/* 0 if perm[0..n) is a permutation of 0..n-1 that moves whole blocks of
 * `granularity` neurons, else -1 (also when out of memory). */
int reorder_check_perm(const int32_t *perm, int n, int granularity);

typedef struct {
    const int32_t *perm;         /* [n_layer * n_ff], each layer a permutation (reorder_check_perm) */
    const uint32_t *counts;      /* [n_layer * n_ff] firing counts of the OLD neurons, or NULL */
    int calib_tokens;
    int granularity;             /* reorder_granularity(m) or a multiple of it */
} reorder_plan;

/* Write a copy of m's file (same magic, metadata, tensor order and types)
 * with the plan's order and the pi2.reorder.* keys (replacing any from an
 * earlier reordering). Streams tensor by tensor through a buffer of a few
 * MiB: memory does not grow with the model. Refuses (before writing) files
 * with other per-neuron tensors it does not know. On error removes out_path
 * and returns -1 with a message in err. */
int reorder_write(const model *m, const reorder_plan *plan, const char *out_path, char *err, size_t errlen);

#endif

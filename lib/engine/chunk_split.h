/* How the FFN neuron chunks (ffn_chunks.h) are dealt to the cpu-workers:
 * one contiguous range each, balanced by the work each chunk is expected
 * to cost. One range, not round-robin: each worker's predictor rows are
 * then one stream and the workers read apart (7B predictor mode, two
 * workers: the FFN step 2-4 % shorter; end to end within noise). A
 * hot-first file (pi2-reorder) carries its neurons' firing counts, and its
 * hot first chunks cost ~5x the cold ones: weighting by them keeps the
 * ranges even in time, not in neurons.
 *
 * Errors: only chunk_split_model can fail: it returns -1 when out of memory.
 * The rest is arithmetic on the caller's arrays. */
#ifndef PI2_CHUNK_SPLIT_H
#define PI2_CHUNK_SPLIT_H

#include "engine/model.h"

/* cost[c] for each of m's ffn_chunk_count chunks, in nanoseconds of a decode
 * token summed over the layers: per neuron the predictor's row, per firing
 * neuron its gate, up and down rows, firing taken from the file's
 * pi2.reorder.firing_counts (reorder.h); without them (or with counts of the
 * wrong shape) every neuron fires alike. */
void chunk_costs(const model *m, double *cost);

/* bounds[0..n_workers]: worker w gets chunks [bounds[w], bounds[w + 1]) of
 * the n chunks of cost[]. Contiguous, in order, covering [0, n) once; each
 * range ends at the chunk boundary nearest its share of the total. */
void chunk_split(const double *cost, int n, int n_workers, int *bounds);
/* The same with uneven shares: worker k's range starts at the chunk boundary
 * nearest at[k] of the total (at[1..n_workers-1] ascending in [0, 1]; at
 * NULL: k / n_workers, chunk_split). */
void chunk_split_at(const double *cost, int n, int n_workers, const double *at, int *bounds);

/* chunk_split of m's chunks by chunk_costs into bounds[0..n_workers]; 0, or
 * -1 out of memory. Every process computes the same deal from the same file. */
int chunk_split_model(const model *m, int n_workers, int *bounds);

#endif

/* A cpu-worker's FFN under a memory budget (docs/offload.md): the cluster-
 * level pipeline. Per layer the worker selects its chunks' neurons (the
 * predictor, or the resident gate rows in gate-first), finds each one's
 * bundle in the hot region or pins it in the cold cache, sends the misses to
 * the io-worker as one BundleLoad, computes the chunks whose rows are all in
 * memory while the misses are read, then each of the rest as soon as its
 * bundles land (the io-worker publishes each one as it is read). The rows are
 * the bundle file's copies of the model's bytes and each chunk sums in the
 * same order, so the result is the unbudgeted run's, bit for bit. */
#ifndef PI2_CPU_FFN_OFFLOAD_H
#define PI2_CPU_FFN_OFFLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/ffn_chunks.h"
#include "stack/offload_stats.h"
#include "stack/stack_attach.h"
#include "util/threadpool.h"

typedef struct ffn_offload ffn_offload;

/* Attaches runid's neuron cache segment and its slot table, takes over the
 * pin log of cpu-worker `index` (letting go of what a killed predecessor
 * held), and connects to the io-worker as `name`; realtime_io: the thread
 * that carries the link's messages at real-time priority when the process may
 * (util/realtime.h: a layer's requests then leave at once, not when this
 * core's computing thread yields). NULL (logged) on failure. */
ffn_offload *ffn_offload_new(const stack_view *sv, const char *runid, const char *name, int index, bool realtime_io);
void ffn_offload_free(ffn_offload *o);

/* Layer f->layer's chunks[0..n_chunks) into partials[chunk][n_embd], with
 * the pool's threads, scratch[i] for thread i. 0 done; 1 abandoned (the
 * epoch changed); -1 an error that ends the generation, told in err (a
 * bundle that could not be read). */
int ffn_offload_run(ffn_offload *o, ffn_layer *f, const int32_t *chunks, int n_chunks, float *partials,
                    threadpool *pool, ffn_scratch *scratch, uint32_t epoch, char *err, size_t errlen);

/* Before layer f->layer's attention (predictor mode): f's predictor, run on
 * the layer's input as f->pred_hidden holds it, names the neurons of
 * chunks[0..n_chunks) likely to fire, and the io-worker is asked for their
 * bundles that are neither hot nor cached, without waiting: the disk reads
 * them while attention runs. The FFN step still selects from its own input,
 * so the tokens do not depend on this guess; a bundle it asked for counts as
 * read in the step's statistics, not as a hit. Called once
 * ffn_offload_ahead_begin(o, f->layer) said the layer can miss (it forgot the
 * previous layer's asks). */
void ffn_offload_prefetch(ffn_offload *o, const ffn_layer *f, const int32_t *chunks, int n_chunks, threadpool *pool,
                          ffn_scratch *scratch);

/* Before layer l's guess: forgets the previous layer's bundles asked for
 * ahead, and says whether asking ahead can find anything to read: false when
 * the plan pins every bundle of the layer, where the guess (a predictor pass
 * over the layer's input) would only cost time. */
bool ffn_offload_ahead_begin(ffn_offload *o, int l);

/* Beside offload_tally.read_ahead (bundles asked ahead that the FFN step needed). */
typedef struct {
    uint64_t asked; /* bundles asked for ahead */
    uint64_t late;  /* needed, and still being read when the FFN step looked */
    uint64_t guessed, steps; /* layer steps whose misses were guessed ahead, of all before which it was asked */
} ffn_prefetch_tally;

/* This worker's running counts. */
const offload_tally *ffn_offload_get_stats(const ffn_offload *o);
const ffn_prefetch_tally *ffn_offload_get_prefetch_stats(const ffn_offload *o);

/* PI2_CHUNK_DELAY (a slow core, for tests): a sleep after each batch of chunks, their pins held. */
void ffn_offload_set_compute_delay(ffn_offload *o, long us);

#endif

/* The planner's cost model: decode tokens per second predicted from the
 * hardware profile (what this machine does per second) and the model profile
 * (which bundles a token needs), for a given memory layout (docs/planner.md).
 *
 * Per token and layer: dense work (attention, and the predictor or every gate
 * row) and the sparse FFN (gathered gate / up rows, down_t axpys) at the
 * measured kernel rates on the compute threads, capped by memory bandwidth;
 * the bundles the token needs that are neither pinned hot nor in the cold
 * cache are read as one batch per layer (one read's latency, then the rest at
 * the measured IOPS of as many reads in flight as the batch has, up to the
 * io-worker's depth). The cold cache is LRU under Che's
 * approximation: bundle i, asked for with probability p_i per token, is found
 * with probability 1 - exp(-p_i T), T such that the expected occupancy fills
 * the slots. Plus a bus round trip per layer.
 *
 * The reads overlap computing: in predictor mode from the start of the layer
 * (the cpu-workers ask for the predicted misses before attention, running
 * the predictor a second time and putting the batch in its ring: guess_*_bytes,
 * half the doorbell's round trip; not on a layer the layout pins whole,
 * where nothing can miss), in gate-first from the FFN step
 * (the gate rows decide); the chunks whose bundles were read compute as
 * they land. A miss the guess did not name is asked for at the FFN step and
 * waited for: a read at depth 1 and the doorbell's round trip, in every layer
 * where a token meets one (1 - exp(-expected such misses) of the layers).
 * Every read also takes the io-worker's CPU time (io_cpu_us), and
 * every batch its wake-ups (io_batch_us; two batches a layer when asking
 * ahead, the guess's and the step's for what the guess missed, one in
 * gate-first): where the io-worker
 * shares a core with a cpu-worker, that worker's layer is longer by them, and
 * the others wait for it at the layer's barriers. */
#ifndef PI2_PLANNER_COST_MODEL_H
#define PI2_PLANNER_COST_MODEL_H

#include <stddef.h>

#include "engine/ffn_mode.h"
#include "hw_profile.h"

typedef struct {
    int n_layer, n_ff;
    ffn_mode mode;                 /* FFN_PREDICTOR or FFN_GATE_FIRST; FFN_DENSE for the dense
                                      reference (every row, everything resident) */
    double dense_bytes;            /* weights read densely per token: attention, output, predictors */
    size_t gate_row, up_row, down_row; /* bytes of one neuron's rows */
    const double *active;          /* [n_layer] mean neurons fired per token */
    /* bundles, each layer in slot order (the bundle file's order): probability a token needs it */
    long n_bundles;                /* per layer */
    size_t stride;                 /* bytes per bundle */
    const double *p_bundle;        /* [n_layer][n_bundles] */
    const double *p_unasked;       /* [n_layer][n_bundles] or NULL: probability a token needs the bundle for a
                                      neuron that the guess (asking ahead) did not name (bundle_order.h) */
    /* predictor weights read again per token to ask for the misses ahead (predictor mode; 0: no
     * guess): by every compute thread's worker whole (the first stage), and split between them */
    double guess_whole_bytes, guess_split_bytes;
} cost_inputs;

typedef struct {
    const long *hot_bundles;       /* [n_layer] pinned, the first of each layer's slots; NULL: all resident */
    long cold_slots;
    int queue_depth;               /* reads the io-worker keeps in flight at most (plan_reads_in_flight) */
    int threads;                   /* decode compute threads in all */
    double io_cpu_us;              /* a compute core's time per bundle read (the io-worker's, on the core
                                      it shares); 0 when the io-worker has a core of its own */
    double io_batch_us;            /* the same per batch of a layer that reads: waking for each cpu-worker's
                                      batch of misses and for its completions (0 likewise) */
} cost_layout;

typedef struct {
    double tok_s, hit_rate, misses_per_token, compute_ms, io_ms, exposed_io_ms;
} cost_prediction;

void cost_predict(const cost_inputs *in, const hw_profile *hw, const cost_layout *lay, cost_prediction *out);

#endif

/* The cost model (cost_model.h). */
#include "cost_model.h"

#include <math.h>
#include <stdlib.h>

/* seconds to stream `rows` rows of `bytes` each at `rows_s` per thread on `threads` threads, or at the
 * machine's bandwidth, whichever is slower */
static double stream_s(double rows, double bytes, double rows_s, int threads, double mem_gbs) {
    if (rows <= 0) return 0;
    const double by_kernel = rows / (rows_s * threads), by_memory = rows * bytes / (mem_gbs * 1e9);
    return by_kernel > by_memory ? by_kernel : by_memory;
}

/* Che's characteristic time T for an LRU cache of `slots` over items asked
 * with probabilities p (n of them): sum(1 - exp(-p T)) = slots */
static double che_time(const double *p, long n, long slots) {
    if (slots <= 0) return 0;
    double lo = 0, hi = 1;
    long nonzero = 0;
    for (long i = 0; i < n; i++) nonzero += p[i] > 0;
    if (slots >= nonzero) return INFINITY;
    for (;;) { /* grow until the occupancy passes the slots */
        double occ = 0;
        for (long i = 0; i < n; i++) occ += 1 - exp(-p[i] * hi);
        if (occ >= (double)slots || hi > 1e12) break;
        lo = hi, hi *= 4;
    }
    for (int it = 0; it < 60; it++) {
        const double mid = 0.5 * (lo + hi);
        double occ = 0;
        for (long i = 0; i < n; i++) occ += 1 - exp(-p[i] * mid);
        if (occ < (double)slots) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* A layer's bundles: the probability mass needed (need) and missed (the return), given Che's time tc;
 * *unasked: of the misses, those for a neuron the guess did not name (0 without p_unasked) */
static double layer_misses(const cost_inputs *in, const cost_layout *lay, int l, double tc, double *need,
                           double *unasked) {
    const long hot = lay->hot_bundles ? lay->hot_bundles[l] : in->n_bundles;
    double miss = 0;
    *need = *unasked = 0;
    for (long b = 0; b < in->n_bundles; b++) {
        const size_t at = (size_t)l * in->n_bundles + b;
        const double p = in->p_bundle[at];
        *need += p;
        if (b < hot) continue;
        const double not_cached = isinf(tc) ? 0 : exp(-p * tc);
        miss += p * not_cached;
        if (in->p_unasked) *unasked += in->p_unasked[at] * not_cached;
    }
    return miss;
}

/* a layer's sparse (or dense) FFN compute */
static double layer_ffn_s(const cost_inputs *in, const hw_profile *hw, int T, double mem, int l) {
    const double act = in->active[l];
    double ffn_s;
    if (in->mode == FFN_DENSE) /* every gate, up and down row: n_ff rows of each, the down ones as long */
        return stream_s(3.0 * in->n_ff, (double)in->gate_row, hw->dense_rows_s, T, mem);
    if (in->mode == FFN_GATE_FIRST)
        ffn_s = stream_s(in->n_ff, (double)in->gate_row, hw->dense_rows_s, T, mem) +
                stream_s(act, (double)in->up_row, hw->sparse_rows_s, T, mem);
    else
        ffn_s = stream_s(2 * act, 0.5 * (double)(in->gate_row + in->up_row), hw->sparse_rows_s, T, mem);
    return ffn_s + stream_s(act, (double)in->down_row, hw->axpy_rows_s, T, mem);
}

void cost_predict(const cost_inputs *in, const hw_profile *hw, const cost_layout *lay, cost_prediction *out) {
    const int T = lay->threads > 0 ? lay->threads : 1;
    const double mem = T > 1 ? hw->mem_gbs_all : hw->mem_gbs_one;
    /* dense weights: at the dense kernel's rate, in row-equivalents of the FFN row size */
    const double dense_s = stream_s(in->dense_bytes / (double)in->gate_row, (double)in->gate_row, hw->dense_rows_s, T, mem);

    /* the cold bundles of every layer, asked for per token, for the LRU approximation */
    double *cold_p = malloc(sizeof(double) * (size_t)in->n_layer * (size_t)in->n_bundles);
    long n_cold = 0;
    for (int l = 0; l < in->n_layer; l++) {
        const long hot = lay->hot_bundles ? lay->hot_bundles[l] : in->n_bundles;
        for (long b = hot; b < in->n_bundles && cold_p; b++) cold_p[n_cold++] = in->p_bundle[(size_t)l * in->n_bundles + b];
    }
    const double tc = cold_p ? che_time(cold_p, n_cold, lay->cold_slots) : 0;
    free(cold_p);

    double needed = 0, misses = 0, io_s = 0, compute_s = 0, total_s = 0;
    for (int l = 0; l < in->n_layer; l++) {
        double need, unasked;
        misses += layer_misses(in, lay, l, tc, &need, &unasked);
        needed += need;
    }
    /* asking ahead runs the predictor again, under a budget only */
    const bool ahead = in->mode == FFN_PREDICTOR && misses > 0;
    const double guess_s =
        ahead ? stream_s(in->guess_whole_bytes / (double)in->gate_row, (double)in->gate_row, hw->dense_rows_s, 1, mem) +
                    stream_s(in->guess_split_bytes / (double)in->gate_row, (double)in->gate_row, hw->dense_rows_s, T, mem) +
                    in->n_layer * hw->wake_us * 0.5e-6 /* the batch into the ring, the doorbell rung */
              : 0;
    /* a miss the guess did not name is asked for at the FFN step, which waits for it: a read at depth 1
     * and the doorbell's round trip, once a layer in which any worker meets one (it waits at the barrier
     * for it) */
    const double round_trip_s = 1 / hw_io_iops(hw, in->stride, 1) + hw->wake_us * 1e-6;
    for (int l = 0; l < in->n_layer; l++) {
        double need, unasked;
        const double miss = layer_misses(in, lay, l, tc, &need, &unasked), ffn_s = layer_ffn_s(in, hw, T, mem, l);
        /* a layer's misses go out as one batch: about one read's latency, then the rest at the throughput
         * of as many reads in flight as the batch has, up to the io-worker's depth (a device's IOPS grows
         * slower than its depth, so fewer misses never predict slower reads) */
        double io_l = 0;
        if (miss > 0)
            io_l = fmin(miss, 1.0) / hw_io_iops(hw, in->stride, 1) +
                   fmax(miss - 1, 0.0) / hw_io_iops(hw, in->stride, (int)fmin(ceil(miss), lay->queue_depth));
        /* asking ahead, each worker sends a layer two batches: the guess's, and the step's for what it missed */
        const double io_cpu_l = miss > 0 ? (miss * lay->io_cpu_us + (ahead ? 2 : 1) * lay->io_batch_us) * 1e-6 : 0;
        /* no guess on a layer pinned whole: nothing of it can miss (cpu-worker/ffn_offload.h) */
        const bool guessed = ahead && (!lay->hot_bundles || lay->hot_bundles[l] < in->n_bundles);
        const double dense_l = (dense_s + (guessed ? guess_s : 0)) / in->n_layer;
        /* what arrives computes as it lands: the missed share of the FFN comes after the reads */
        const double after_reads = io_l + ffn_s * (need > 0 ? miss / need : 0);
        /* summed as layer_s sums it, so that reads hidden behind compute expose exactly 0, never a
         * rounding's negative (the plan file refuses one) */
        const double ffn_work = ffn_s + io_cpu_l, layer_compute = dense_l + ffn_work;
        const double layer_s = ahead ? fmax(layer_compute, after_reads) + (1 - exp(-unasked)) * round_trip_s
                                     : dense_l + fmax(ffn_work, after_reads);
        compute_s += layer_compute;
        total_s += layer_s;
        io_s += io_l;
    }
    const double bus_s = in->n_layer * hw->bus_rtt_us * 1e-6;
    out->exposed_io_ms = (total_s - compute_s) * 1e3;
    total_s += bus_s;
    out->tok_s = total_s > 0 ? 1 / total_s : 0;
    out->hit_rate = needed > 0 ? 1 - misses / needed : 1;
    out->misses_per_token = misses;
    out->compute_ms = compute_s * 1e3;
    out->io_ms = io_s * 1e3;
}

/* The planner's cost model (planner/cost_model.h) on a two-layer model small
 * enough to work out by hand, every rate a round number:
 *  - everything resident: the dense weights and each layer's sparse FFN at
 *    the kernels' rates, nothing else (no guess, no reads);
 *  - every bundle missed, predictor mode: the reads start with the layer
 *    (asked for ahead), so a layer lasts the longer of its compute (the
 *    guess pass and the io-worker's CPU per read included) and its reads
 *    plus the share of the FFN that waits for them;
 *  - the same in gate-first: no guess, and the reads start at the FFN step,
 *    after the layer's dense work;
 *  - reads that cost nothing but CPU: the io-worker's time on the shared
 *    core is the whole difference, misses x its time per read, plus its
 *    time for the workers' batches, two a layer asking ahead and one in
 *    gate-first (none when nothing is read);
 *  - a layer the plan pins whole runs no guess;
 *  - on two threads, the guess's first stage is not shared (every
 *    cpu-worker runs it whole), the rest is;
 *  - the io-worker on a core of its own (io_cpu_us 0) and a faster disk
 *    never predict slower;
 *  - on a disk whose IOPS grows with the reads in flight, a layer's batch
 *    runs at the IOPS of as many as it holds, up to the io-worker's depth;
 *  - layout_make's cold share: the least when pinning more is predicted
 *    faster, the 10 % when every share predicts alike;
 *  - reads hidden behind compute expose no I/O time, never a rounding's
 *    negative (the plan file refuses a negative figure), whatever the rates. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../planner/cost_model.h"
#include "../planner/layout.h"
#include "rng.h"
#include "test.h"

#define N_LAYER 2
#define N_BUNDLES 8

static const double active[N_LAYER] = {2, 2};
static double p_bundle[N_LAYER * N_BUNDLES];

/* rows of 1000 bytes at 1e6 rows/s: 1 us a row; reads 1e4/s: 100 us each */
static hw_profile machine(double iops) {
    hw_profile hw;
    memset(&hw, 0, sizeof hw);
    hw.mem_gbs_one = hw.mem_gbs_all = 1e6; /* never the bound here */
    hw.dense_rows_s = hw.sparse_rows_s = hw.axpy_rows_s = 1e6;
    for (int s = 0; s < HW_IO_SIZES; s++)
        for (int d = 0; d < HW_IO_DEPTHS; d++) hw.iops[s][d] = iops;
    hw.bus_rtt_us = 0;
    return hw;
}

static cost_inputs inputs(ffn_mode mode, double dense_bytes, double guess_whole, double guess_split) {
    for (int i = 0; i < N_LAYER * N_BUNDLES; i++) p_bundle[i] = 0.25; /* 2 of the 8 a token, as active */
    return (cost_inputs){.n_layer = N_LAYER,
                         .n_ff = N_BUNDLES,
                         .mode = mode,
                         .dense_bytes = dense_bytes,
                         .gate_row = 1000,
                         .up_row = 1000,
                         .down_row = 1000,
                         .active = active,
                         .n_bundles = N_BUNDLES,
                         .stride = 8192,
                         .p_bundle = p_bundle,
                         .guess_whole_bytes = guess_whole,
                         .guess_split_bytes = guess_split};
}

static const long none_hot[N_LAYER] = {0, 0};

static double predict_in_flight(const cost_inputs *in, const hw_profile *hw, const long *hot, double io_cpu_us,
                                double io_batch_us, int threads, int queue_depth) {
    const cost_layout lay = {.hot_bundles = hot,
                             .cold_slots = 0,
                             .queue_depth = queue_depth,
                             .threads = threads,
                             .io_cpu_us = io_cpu_us,
                             .io_batch_us = io_batch_us};
    cost_prediction p;
    cost_predict(in, hw, &lay, &p);
    return 1e6 / p.tok_s;
}

static double predict_on(const cost_inputs *in, const hw_profile *hw, const long *hot, double io_cpu_us,
                         double io_batch_us, int threads) {
    return predict_in_flight(in, hw, hot, io_cpu_us, io_batch_us, threads, 4);
}

static double predict_batch_us(const cost_inputs *in, const hw_profile *hw, const long *hot, double io_cpu_us,
                               double io_batch_us) {
    return predict_on(in, hw, hot, io_cpu_us, io_batch_us, 1);
}

static double predict_us(const cost_inputs *in, const hw_profile *hw, const long *hot, double io_cpu_us) {
    return predict_batch_us(in, hw, hot, io_cpu_us, 0);
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)); }

/* 2 layers of 1000 one-neuron bundles, a token needing bundle b with probability 0.05 x 0.99^b (5 a
 * layer), so the least cold cache is 2 x 5 + 1 = 11 slots. */
enum { LAYERS = 2, BUNDLES = 1000, SLOTS = 400 };
static double decay_p[LAYERS * BUNDLES];
static int32_t decay_order[LAYERS * BUNDLES];
static double decay_active[LAYERS];

static bundle_order decay_bundles(model *m) {
    for (int l = 0; l < LAYERS; l++) {
        decay_active[l] = 0;
        for (int b = 0; b < BUNDLES; b++) {
            decay_p[l * BUNDLES + b] = 0.05 * pow(0.99, b);
            decay_active[l] += decay_p[l * BUNDLES + b];
            decay_order[l * BUNDLES + b] = b;
        }
    }
    bundle_order o = {.per_bundle = 1, .n_bundles = BUNDLES, .n_whole = BUNDLES, .order = decay_order,
                      .p_bundle = decay_p, .active = decay_active};
    CHECK(bundle_order_sort_needs(&o, LAYERS) == 0, "out of memory");
    memset(m, 0, sizeof *m);
    m->n_layer = LAYERS, m->n_ff = BUNDLES;
    return o;
}

/* layout_make's cold share (planner/layout.h), neurons of a whole stride (nothing to pack), a budget of
 * 400 slots: 10 % is 40. On a slow disk, pinning the next 29 bundles instead of caching the tail is
 * predicted faster (every read counts) and wins; where reads cost nothing every share predicts alike and
 * the 10 % stays. */
static void test_cold_share(void) {
    model m;
    bundle_order o = decay_bundles(&m);
    const layout_fixed f = {.dense_bytes = 100 * 1000.0, .gate_row = 1000, .up_row = 1000, .down_row = 2096,
                            .neuron_bytes = 4096};
    const uint64_t stride = layout_stride(&f, 1), budget = SLOTS * stride;
    const hw_profile disks[2] = {machine(1e4), machine(1e12)};
    const long want[2] = {11, 40};
    for (int d = 0; d < 2; d++) {
        const layout_inputs in = {.m = &m, .mode = FFN_PREDICTOR, .threads = 1, .cpu_workers = 1, .hw = &disks[d]};
        layout lay;
        CHECK(layout_make(&in, &f, &o, budget, &lay) == 0, "layout_make failed");
        CHECK(lay.cold_slots == want[d] && lay.hot_bundles[0] + lay.hot_bundles[1] == SLOTS - want[d],
              "%s disk: %ld cold slots and %ld hot bundles, want %ld and %ld", d ? "a free" : "a slow",
              lay.cold_slots, lay.hot_bundles[0] + lay.hot_bundles[1], want[d], SLOTS - want[d]);
        layout_free(&lay);
    }
    free(o.p_desc);
}

/* Neurons of 3000 bytes in bundles of a 4096 stride: the hot ones are packed, the room the cold slots
 * leave holding 4096 / 3000 times more of them; with every bundle resident they stay as the file has
 * them (loaded in place). */
static void test_packed_hot(void) {
    model m;
    bundle_order o = decay_bundles(&m);
    const layout_fixed f = {.dense_bytes = 100 * 1000.0, .gate_row = 1000, .up_row = 1000, .down_row = 1000,
                            .neuron_bytes = 3000};
    const uint64_t stride = layout_stride(&f, 1);
    const hw_profile disk = machine(1e12);
    const layout_inputs in = {.m = &m, .mode = FFN_PREDICTOR, .threads = 1, .cpu_workers = 1, .hw = &disk};
    layout lay;
    CHECK(stride == 4096 && layout_make(&in, &f, &o, SLOTS * stride, &lay) == 0, "layout_make failed");
    const long hot = lay.hot_bundles[0] + lay.hot_bundles[1];
    const long want = (long)((SLOTS - lay.cold_slots) * stride / 3000);
    CHECK(lay.hot_stride == 3000 && lay.cold_slots == 40 && hot == want,
          "packed: %llu bytes a hot bundle, %ld cold slots, %ld hot bundles (want 3000, 40, %ld)",
          (unsigned long long)lay.hot_stride, lay.cold_slots, hot, want);
    layout_free(&lay);
    CHECK(layout_make(&in, &f, &o, (uint64_t)LAYERS * BUNDLES * stride, &lay) == 0 && lay.all_resident &&
              lay.hot_stride == stride && lay.hot_bundles[0] + lay.hot_bundles[1] == LAYERS * BUNDLES,
          "every bundle resident: %llu bytes a hot bundle, %ld hot", (unsigned long long)lay.hot_stride,
          lay.hot_bundles[0] + lay.hot_bundles[1]);
    layout_free(&lay);
    free(o.p_desc);
}

/* Odd rates, a disk fast enough that every layer's reads hide behind its compute: the exposed I/O is
 * 0 or more in every mode, as plan_file.c's check of the prediction wants (the FFN and the io-worker's
 * CPU summed in another order than the layer's once made it -1e-19 and the plan unreadable). */
static void test_hidden_reads_expose_nothing(void) {
    rng_seed(20);
    const ffn_mode modes[3] = {FFN_PREDICTOR, FFN_GATE_FIRST, FFN_DENSE};
    int negative = 0;
    for (int trial = 0; trial < 3000; trial++) {
        hw_profile hw = machine(1e9 * (1.5 + rng_uniform()));
        hw.dense_rows_s = 3e5 * (1.5 + rng_uniform()), hw.sparse_rows_s = 2e5 * (1.5 + rng_uniform());
        hw.axpy_rows_s = 4e5 * (1.5 + rng_uniform());
        cost_inputs in = inputs(modes[trial % 3], 1e5 * (1.5 + rng_uniform()), 0, 0);
        const cost_layout lay = {.hot_bundles = none_hot, .queue_depth = 64, .threads = 1 + trial % 2,
                                 .io_cpu_us = 3 * (1.5 + rng_uniform()), .io_batch_us = 7 * (1.5 + rng_uniform())};
        cost_prediction p;
        cost_predict(&in, &hw, &lay, &p);
        if (!(p.exposed_io_ms >= 0 && isfinite(p.tok_s) && p.hit_rate >= 0 && p.hit_rate <= 1)) negative++;
    }
    CHECK(negative == 0, "%d of 3000 predictions with reads hidden have exposed I/O below 0 or a figure out of range",
          negative);
}

int main(void) {
    const hw_profile slow_disk = machine(1e4), free_disk = machine(1e12);

    /* resident: dense 100 rows (100 us) + per layer 2 x 2 gathered rows and 2 axpy rows (6 us) */
    cost_inputs in = inputs(FFN_PREDICTOR, 100 * 1000.0, 4 * 1000.0, 6 * 1000.0);
    double us = predict_us(&in, &slow_disk, NULL, 5);
    CHECK(near(us, 112), "resident predictor: %.6f us, want 112 (no guess, no reads)", us);

    /* every bundle missed: per layer dense (100 + guess 10) / 2 = 55, FFN 6, io CPU 2 x 5 = 10: 71 us of
     * compute; reads 100 (the first) + 100 (the second) = 200, then the missed FFN share (all of it) 6 */
    us = predict_us(&in, &slow_disk, none_hot, 5);
    CHECK(near(us, 2 * 206.0), "predictor, all missed, slow disk: %.6f us, want 412", us);

    /* gate-first: FFN = 8 gate rows + 2 up + 2 down = 12 us; no guess; dense 50 a layer, then
     * max(12 + 10, 200 + 12) */
    cost_inputs gf = inputs(FFN_GATE_FIRST, 100 * 1000.0, 0, 0);
    us = predict_us(&gf, &slow_disk, none_hot, 5);
    CHECK(near(us, 2 * (50 + 212.0)), "gate-first, all missed, slow disk: %.6f us, want 524", us);

    /* reads free but for the io-worker's CPU: compute-bound, 2 x (55 + 6 + 2 x 50) */
    const double cpu_bound = predict_us(&in, &free_disk, none_hot, 50);
    CHECK(fabs(cpu_bound - 2 * 161.0) < 1e-3, "predictor, free reads, 50 us of CPU each: %.6f us, want 322", cpu_bound);
    const double own_core = predict_us(&in, &free_disk, none_hot, 0);
    CHECK(fabs(cpu_bound - own_core - 4 * 50.0) < 1e-3,
          "the io-worker's CPU adds misses x its time per read: %.6f us more, want 200", cpu_bound - own_core);

    /* and each layer that reads, its batches' handling: 2 layers x 2 batches (the guess's and the
     * step's) x 30 us; in gate-first one batch a layer */
    const double batches = predict_batch_us(&in, &free_disk, none_hot, 50, 30);
    CHECK(fabs(batches - cpu_bound - 2 * 2 * 30.0) < 1e-3, "a layer's batches add their time: %.6f us more, want 120",
          batches - cpu_bound);
    const double gf_batches = predict_batch_us(&gf, &free_disk, none_hot, 50, 30) - predict_us(&gf, &free_disk, none_hot, 50);
    CHECK(fabs(gf_batches - 2 * 30.0) < 1e-3, "gate-first: one batch a layer, %.6f us more, want 60", gf_batches);
    CHECK(near(predict_batch_us(&in, &slow_disk, NULL, 5, 30), 112), "resident: no batches");

    /* two threads: the dense work and the FFN halve, the guess's first stage does not (every worker
     * runs it whole): per layer (50 + 4 + 6 / 2) / 2 + (4 + 2) / 2 = 31.5 us, the reads free */
    us = predict_on(&in, &free_disk, none_hot, 0, 0, 2);
    CHECK(fabs(us - 2 * 31.5) < 1e-3, "predictor, two threads, free reads: %.6f us, want 63", us);

    /* orderings that must hold whatever the figures */
    CHECK(predict_us(&in, &slow_disk, none_hot, 0) <= predict_us(&in, &slow_disk, none_hot, 5),
          "an io-worker with its own core is never predicted slower");
    CHECK(predict_us(&in, &free_disk, none_hot, 5) <= predict_us(&in, &slow_disk, none_hot, 5),
          "a faster disk is never predicted slower");
    /* a layer pinned whole runs no guess: layer 0 dense 50 + FFN 6; layer 1 as all missed above, 206 */
    const long first_hot[N_LAYER] = {N_BUNDLES, 0};
    us = predict_us(&in, &slow_disk, first_hot, 5);
    CHECK(near(us, 56 + 206.0), "layer 0 pinned whole: %.6f us, want 262 (its guess not charged)", us);

    const long some_hot[N_LAYER] = {4, 4};
    CHECK(predict_us(&in, &slow_disk, some_hot, 5) <= predict_us(&in, &slow_disk, none_hot, 5),
          "more pinned bundles are never predicted slower");

    /* the guess misses each bundle with probability 0.05 a token: 0.4 unnamed misses a layer, met in
     * 1 - e^-0.4 of the layers, each a read at depth 1 (100 us) and the doorbell's round trip (20 us) more */
    static double p_unasked[N_LAYER * N_BUNDLES];
    for (int i = 0; i < N_LAYER * N_BUNDLES; i++) p_unasked[i] = 0.05;
    hw_profile slow_bus = slow_disk;
    slow_bus.bus_rtt_us = slow_bus.wake_us = 20;
    const double named = predict_us(&in, &slow_bus, none_hot, 5);
    in.p_unasked = p_unasked;
    us = predict_us(&in, &slow_bus, none_hot, 5);
    CHECK(near(us - named, 2 * (1 - exp(-0.4)) * 120), "unnamed misses: %.6f us more, want %.6f", us - named,
          2 * (1 - exp(-0.4)) * 120);
    us = predict_us(&in, &slow_bus, NULL, 5);
    CHECK(near(us, 112 + 2 * 20.0), "resident: %.6f us, want 152 (no reads, named or not; a bus round trip a layer)",
          us);
    gf.p_unasked = p_unasked;
    CHECK(near(predict_us(&gf, &slow_disk, none_hot, 5), 2 * (50 + 212.0)), "gate-first asks at the FFN step anyway");
    /* IOPS 1e4 x the reads in flight: a layer's 2 misses are the first read (100 us), then one more at
     * depth 2 (50 us), however deep the io-worker's ring; then the FFN (6): 156 us a layer. At depth 1:
     * 100 + 100 + 6. */
    hw_profile deep = slow_disk;
    for (int s = 0; s < HW_IO_SIZES; s++)
        for (int d = 0; d < HW_IO_DEPTHS; d++) deep.iops[s][d] = 1e4 * hw_io_depth[d];
    in.p_unasked = NULL;
    us = predict_in_flight(&in, &deep, none_hot, 5, 0, 1, 128);
    CHECK(near(us, 2 * 156.0), "a batch of 2 with 128 in flight allowed: %.6f us, want 312 (its 2 at once)", us);
    us = predict_in_flight(&in, &deep, none_hot, 5, 0, 1, 1);
    CHECK(near(us, 2 * 206.0), "one read in flight at a time: %.6f us, want 412", us);
    test_cold_share();
    test_packed_hot();
    test_hidden_reads_expose_nothing();
    return test_summary();
}

/* The neuron cache's counts (lib/stack/offload_stats.h): adding to and
 * reading the shared counters, a generation's difference (also when a read
 * was torn), merging the workers' tallies, and the rates shown. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "stack/offload_stats.h"
#include "test.h"

static bool near(double a, double b) { return fabs(a - b) < 1e-9; }

static bool same(const offload_tally *a, const offload_tally *b) { return !memcmp(a, b, sizeof *a); }

static void test_counters(void) {
    offload_counters c;
    memset(&c, 0, sizeof c);
    const offload_tally a = {1, 16, 100, 20, 8, 4, 8 * 4096, 300, 900}, b = {2, 32, 150, 40, 2, 1, 2 * 4096, 100, 1500};
    offload_counters_add(&c, &a);
    offload_tally t = offload_counters_read(&c);
    CHECK(same(&t, &a), "one add reads back");
    offload_counters_add(&c, &b);
    t = offload_counters_read(&c);
    const offload_tally sum = {3, 48, 250, 60, 10, 5, 10 * 4096, 400, 2400};
    CHECK(same(&t, &sum), "two adds sum field by field");
}

static void test_delta(void) {
    const offload_tally start = {10, 160, 1000, 200, 50, 25, 50 * 4096, 3000, 9000};
    const offload_tally end = {34, 544, 3000, 700, 150, 75, 150 * 4096, 7000, 20000};
    offload_tally d = offload_tally_delta(&end, &start);
    const offload_tally want = {24, 384, 2000, 500, 100, 50, 100 * 4096, 4000, 11000};
    CHECK(same(&d, &want), "a generation's difference");
    d = offload_tally_delta(&start, &start);
    CHECK(same(&d, &(offload_tally){0}), "no step: all zero");
    /* torn reads: a field that went down gives 0; waiting is never more than the FFN time, nor tokens than layers */
    offload_tally torn = end;
    torn.hot = start.hot - 1, torn.ffn_us = start.ffn_us + 10, torn.layers = start.layers + 2;
    torn.misses = start.misses + 3;
    d = offload_tally_delta(&torn, &start);
    CHECK(d.hot == 0 && d.cold_hits == 500, "a count that went down gives 0, the others their difference");
    CHECK(d.ffn_us == 10 && d.wait_us == 10, "waiting capped at the FFN time (%llu of %llu)",
          (unsigned long long)d.wait_us, (unsigned long long)d.ffn_us);
    CHECK(d.layers == 2 && d.tokens == 2, "tokens capped at the layers (%llu of %llu)", (unsigned long long)d.tokens,
          (unsigned long long)d.layers);
    CHECK(d.misses == 3 && d.read_ahead == 3, "reads asked ahead capped at the reads (%llu of %llu)",
          (unsigned long long)d.read_ahead, (unsigned long long)d.misses);
}

static void test_merge(void) {
    offload_tally sum = {0};
    const offload_tally w0 = {24, 384, 2000, 500, 100, 50, 100 * 4096, 4000, 11000};
    const offload_tally w1 = {23, 368, 1900, 550, 120, 60, 120 * 4096, 5000, 12000}; /* restarted: missed one step */
    offload_tally_merge(&sum, &w0);
    offload_tally_merge(&sum, &w1);
    const offload_tally want = {24, 384, 3900, 1050, 220, 110, 220 * 4096, 9000, 23000};
    CHECK(same(&sum, &want), "counts and times summed, tokens and layers the most any worker took part in");
}

static void test_rates(void) {
    const offload_tally t = {10, 160, 600, 300, 100, 50, 100 * 8192, 2500, 10000};
    const offload_rates r = offload_tally_rates(&t);
    CHECK(near(r.hot, 0.6) && near(r.cold, 0.3) && near(r.read, 0.1), "shares %g %g %g", r.hot, r.cold, r.read);
    CHECK(near(r.bundles_per_token, 10) && near(r.bytes_per_token, 10 * 8192.0), "per token %g bundles, %g bytes",
          r.bundles_per_token, r.bytes_per_token);
    CHECK(near(r.ahead, 0.5), "share of the reads asked for ahead %g", r.ahead);
    CHECK(near(r.wait_share, 0.25), "wait share %g", r.wait_share);
    CHECK(near(r.ms_per_layer, 10.0 / 160), "ms per layer %g", r.ms_per_layer);
    const offload_rates z = offload_tally_rates(&(offload_tally){0});
    CHECK(z.hot == 0 && z.cold == 0 && z.read == 0 && z.ahead == 0 && z.bundles_per_token == 0 && z.bytes_per_token == 0 &&
              z.wait_share == 0 && z.ms_per_layer == 0,
          "nothing counted: zeros, no division by zero");
    const offload_rates all_hot = offload_tally_rates(&(offload_tally){.tokens = 2, .layers = 32, .hot = 64});
    CHECK(all_hot.hot == 1 && all_hot.read == 0 && all_hot.bytes_per_token == 0, "every bundle hot");
}

int main(void) {
    test_counters();
    test_delta();
    test_merge();
    test_rates();
    return test_summary();
}

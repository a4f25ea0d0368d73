/* The planner's bundle needs (planner/bundle_order.h), one neuron a bundle,
 * in the profile's order, on profiles drawn from known firing rates:
 *  - neurons that all fire at 10 %: the hottest-first order's needs stay
 *    near 10 % at every place, where counting them on the tokens that
 *    ranked them makes the first places look hotter (the winner of 1024
 *    draws over 512 tokens shows ~14 %);
 *  - a hot tenth at 50 % and the rest at 2 %: the needs find both levels;
 *  - in both, the needs descend and add up to about the neurons a token
 *    fires (the layer's `active`), and the order is a permutation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../planner/bundle_order.h"
#include "test.h"

#define N_FF 1024
#define N_TOKENS 512

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uniform(void) { /* xorshift64*, [0, 1) */
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

/* A one-layer profile whose neuron i fires on each token with probability rate(i). */
static void draw_profile(model_profile *p, double (*rate)(int)) {
    memset(p, 0, sizeof *p);
    p->n_layer = 1, p->n_ff = N_FF, p->n_tokens = N_TOKENS, p->mode = FFN_PREDICTOR;
    p->words = (N_TOKENS + 63) / 64;
    p->counts = calloc(N_FF, sizeof *p->counts);
    p->fired = calloc((size_t)N_FF * (size_t)p->words, sizeof *p->fired);
    for (int i = 0; i < N_FF; i++)
        for (int t = 0; t < N_TOKENS; t++)
            if (uniform() < rate(i)) {
                p->fired[(size_t)i * (size_t)p->words + (size_t)(t / 64)] |= 1ull << (t % 64);
                p->counts[i]++;
            }
}

static void free_profile(model_profile *p) {
    free(p->counts);
    free(p->fired);
}

static double all_tenth(int i) { return (void)i, 0.10; }
static double hot_tenth(int i) { return i % 10 == 3 ? 0.50 : 0.02; }

/* descending, a permutation, and summing to about `active` */
static void check_shape(const bundle_order *o, const char *what) {
    bool descending = true, seen[N_FF] = {false}, perm = true;
    double sum = 0;
    for (int b = 0; b < N_FF; b++) {
        if (b && o->p_bundle[b] > o->p_bundle[b - 1] + 1e-12) descending = false;
        sum += o->p_bundle[b];
        const int32_t n = o->order[b];
        if (n < 0 || n >= N_FF || seen[n]) perm = false;
        else seen[n] = true;
    }
    CHECK(descending, "%s: needs descend", what);
    CHECK(perm, "%s: the order is a permutation", what);
    CHECK(fabs(sum - o->active[0]) < 0.02 * o->active[0], "%s: needs add up to %.2f, active %.2f", what, sum,
          o->active[0]);
}

int main(void) {
    model_profile p;
    bundle_order o;

    draw_profile(&p, all_tenth);
    CHECK(bundle_order_make(&o, &p, 1, ORDER_PROFILE) == 0, "bundle_order_make, all at 10 %%");
    check_shape(&o, "all at 10 %");
    uint32_t most = 0;
    for (int i = 0; i < N_FF; i++) most = p.counts[i] > most ? p.counts[i] : most;
    CHECK((double)most / N_TOKENS > 0.13, "the in-sample winner looks hot (%.3f): the case tests something",
          (double)most / N_TOKENS);
    CHECK(o.p_bundle[0] < 0.12, "the first place's need %.3f is held to ~0.10", o.p_bundle[0]);
    CHECK(o.p_bundle[N_FF / 2] > 0.085 && o.p_bundle[N_FF / 2] < 0.115, "the middle place's need %.3f",
          o.p_bundle[N_FF / 2]);
    bundle_order_free(&o);
    free_profile(&p);

    draw_profile(&p, hot_tenth);
    CHECK(bundle_order_make(&o, &p, 1, ORDER_PROFILE) == 0, "bundle_order_make, a hot tenth");
    check_shape(&o, "a hot tenth");
    int hot_first = 0;
    for (int b = 0; b < N_FF / 10 - 2; b++) hot_first += o.order[b] % 10 == 3;
    CHECK(hot_first == N_FF / 10 - 2, "the hot neurons come first (%d)", hot_first);
    CHECK(fabs(o.p_bundle[10] - 0.5) < 0.06, "a hot place's need %.3f is ~0.50", o.p_bundle[10]);
    CHECK(fabs(o.p_bundle[N_FF / 2] - 0.02) < 0.01, "a cold place's need %.3f is ~0.02", o.p_bundle[N_FF / 2]);
    bundle_order_free(&o);
    free_profile(&p);
    return test_summary();
}

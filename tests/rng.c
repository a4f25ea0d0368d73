#include "rng.h"

#include <math.h>

static uint64_t rng_state = 1;

void rng_seed(uint64_t seed) { rng_state = seed; }

uint32_t rng_u32(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

float rng_uniform(void) { return (float)(rng_u32() >> 8) / (float)(1u << 24) * 2.0f - 1.0f; }

float rng_value(void) { return rng_uniform() * ldexpf(1.0f, (int)(rng_u32() % 8) - 4); }

void rng_fill(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = rng_value();
}

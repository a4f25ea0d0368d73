/* Counter-based random numbers, first made for the synthetic model generator
 * (hence synth_) and used by the predictor builder's random projections too.
 *
 * Every tensor element is a pure function of (seed, tensor key, flat index),
 * so any thread can generate any row, a transposed copy of a matrix holds the
 * same numbers, and the output never depends on the thread count.
 * splitmix64 is both the stream generator and the hash (it passes BigCrush).
 *
 * Errors: none: pure arithmetic (synth_uniform never returns 0, so
 * synth_normal's log is safe). */
#ifndef PI2_SYNTH_RNG_H
#define PI2_SYNTH_RNG_H

#include <math.h>
#include <stdint.h>

#define SYNTH_GOLDEN 0x9E3779B97F4A7C15ull

static inline uint64_t synth_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A stream: state advances by the golden ratio, output is the mixed state,
 * so element k of stream s is synth_mix(s + (k + 1) * SYNTH_GOLDEN). */
typedef struct {
    uint64_t s;
} synth_rng;

static inline synth_rng synth_stream(uint64_t key, uint64_t start_index) {
    synth_rng r = {key + start_index * SYNTH_GOLDEN};
    return r;
}

/* A key for a named purpose: independent streams for different (a, b, c). */
static inline uint64_t synth_key(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
    return synth_mix(synth_mix(synth_mix(seed ^ 0x6A09E667F3BCC909ull) + a) + b) + c * 0x3C6EF372FE94F82Bull;
}

static inline uint64_t synth_next(synth_rng *r) {
    r->s += SYNTH_GOLDEN;
    return synth_mix(r->s);
}

/* Uniform in (0, 1), never 0 (safe for log). */
static inline double synth_uniform(synth_rng *r) {
    return ((double)(synth_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Approximately N(0,1) from one 64-bit draw: the sum of four 16-bit uniforms
 * (Irwin-Hall, |x| <= 3.46). Cheap enough for billions of weights. */
static inline float synth_fast_normal_bits(uint64_t u) {
    uint64_t s = (u & 0xffff) + ((u >> 16) & 0xffff) + ((u >> 32) & 0xffff) + (u >> 48);
    /* mean 4 * 32767.5, sd sqrt(4 * (65536^2 - 1) / 12) */
    return (float)(((double)s - 131070.0) * (1.0 / 37837.2267));
}

static inline float synth_fast_normal(synth_rng *r) { return synth_fast_normal_bits(synth_next(r)); }

/* Exact N(0,1) (Box-Muller, cosine branch) where the tails matter. */
static inline double synth_normal(synth_rng *r) {
    double u1 = synth_uniform(r), u2 = synth_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif

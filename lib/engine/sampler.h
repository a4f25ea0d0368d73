/* Next-token sampling: greedy, temperature, top-k, top-p, with a seeded PRNG.
 *
 * Errors: sampler_sample returns -1 only for n <= 0; out of memory for its
 * scratch, it logs a warning and picks greedily. The rest cannot fail. */
#ifndef PI2_SAMPLER_H
#define PI2_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temp;     /* <= 0: greedy (argmax, lowest id on ties) */
    int top_k;      /* <= 0 or >= n: no top-k cut */
    float top_p;    /* >= 1: no nucleus cut */
    uint64_t rng;   /* xorshift state */
    struct sampler_scratch { int cap; int *idx; float *prob; } s;
} sampler;

void sampler_init(sampler *s, float temp, int top_k, float top_p, uint64_t seed);
void sampler_free(sampler *s);
/* Picks a token from logits[0..n). logits may be modified. Order: top-k cut, softmax at
 * temperature, top-p cut on that distribution, draw. Returns -1 only if n <= 0. */
int sampler_sample(sampler *s, float *logits, int n);
int argmax(const float *x, int n);

#endif

/* Test helper: a small reproducible random source (xorshift64*) for kernel
 * test data. Each test seeds it once, so its data never depends on others. */
#ifndef PI2_TEST_RNG_H
#define PI2_TEST_RNG_H

#include <stdint.h>

void rng_seed(uint64_t seed); /* seed != 0 */
uint32_t rng_u32(void);
float rng_uniform(void); /* in [-1, 1) */
/* uniform values spread over several orders of magnitude, like real weights
 * and activations */
float rng_value(void);
void rng_fill(float *x, int n); /* n rng_value()s */

#endif

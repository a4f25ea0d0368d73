/* llama.cpp's (build 4748) arithmetic where pi2's kernels choose otherwise,
 * for the engine's llama compatibility (engine.h): ggml_vec_dot_f32 adds its
 * leftovers (n % 64 elements) with a separate multiply and add, where pi2's
 * dot_f32 fuses them; ggml_vec_silu_f32 takes libm's expf for the last
 * n % 16 elements of a row, where pi2's silu_mul uses its vector exp for all,
 * so that a neuron's value does not depend on where a thread's range starts.
 * With the avx512 kernel sets these give llama.cpp's bits.
 *
 * Errors: none: plain arithmetic; the caller checks shapes. */
#ifndef PI2_OPS_LLAMA_H
#define PI2_OPS_LLAMA_H

#include "engine/ops.h"

float llama_dot_f32(const kernels *k, const float *w, const float *x, int n);
/* matvec_rows with F32 rows through llama_dot_f32 */
void llama_matvec_rows(const kernels *k, const weight *w, const act_vec *in, float *out, long r0, long r1);
/* h[i - i0] = silu(g[i - i0]) * u[i - i0] for elements [i0, i1) of a row of n */
void llama_silu_mul(const kernels *k, float *h, const float *g, const float *u, long i0, long i1, long n);
/* ffn_act_rows of a SiLU model with the two above */
void llama_ffn_act_rows(const kernels *k, const model *m, const layer_weights *w, const act_vec *in, float *hb,
                        long i0, long i1, uint32_t *counts);

#endif

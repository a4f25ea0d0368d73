/* Run-time choice of the sparse kernel set. Each SIMD set reproduces the dots of
 * one kernels.h set (sparse_kernels_dense_match), so it is offered exactly when
 * that set is (same CPU checks), and the choice follows kernels_best().
 * Baseline x86-64 file; without the x86 ISA files (ARM64) only scalar exists. */
#include <string.h>

#include "gguf/ggml_types.h"
#include "kernels/kernels.h"
#include "kernels/sparse_kernels.h"

/* defined in sparse_scalar.c, sparse_avx2.c, sparse_avx512.c */
extern const sparse_kernels sparse_scalar_impl;
extern const sparse_kernels sparse_avx2_impl;
extern const sparse_kernels sparse_avx512_impl;

const sparse_kernels *sparse_kernels_scalar(void) { return &sparse_scalar_impl; }
#if defined(__x86_64__)
const sparse_kernels *sparse_kernels_avx2(void) { return kernels_avx2() ? &sparse_avx2_impl : NULL; }
const sparse_kernels *sparse_kernels_avx512(void) { return kernels_avx512() ? &sparse_avx512_impl : NULL; }
#else
const sparse_kernels *sparse_kernels_avx2(void) { return NULL; }
const sparse_kernels *sparse_kernels_avx512(void) { return NULL; }
#endif

const kernels *sparse_kernels_dense_match(const sparse_kernels *k) {
    if (k && k == sparse_kernels_avx512()) return kernels_avx512();
    if (k && k == sparse_kernels_avx2()) return kernels_avx2();
    return kernels_scalar();
}

/* kernels_best() already applied PI2_KERNELS (and warned about bad values) */
const sparse_kernels *sparse_kernels_best(void) {
    const char *dense = kernels_decode_set(kernels_best())->name;
    /* "avx512" or "avx512-exact": the dots then match only the default order, and
     * the engine's gate-first FFN falls back to dense row dots under -exact */
    if (strncmp(dense, "avx512", 6) == 0) return sparse_kernels_avx512();
    if (strcmp(dense, "avx2") == 0) return sparse_kernels_avx2();
    return sparse_kernels_scalar();
}

const sparse_type_kernels *sparse_kernels_for_type(const sparse_kernels *k, uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return &k->f32;
    case GGML_TYPE_F16: return &k->f16;
    case GGML_TYPE_Q8_0: return &k->q8_0;
    case GGML_TYPE_Q4_0: return &k->q4_0;
    default: return NULL;
    }
}

/* ggml tensor types that pi2 reads and writes, and their block geometry.
 *
 * Errors: none: an unknown or unsupported type gives 0 (sizes), -1
 * (ggml_type_from_name), false or a "type N" name. */
#ifndef PI2_GGML_TYPES_H
#define PI2_GGML_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_I8 = 24,  /* raw bytes: pi2's side files (bundles, profiles), never a weight */
    GGML_TYPE_I32 = 26, /* 32-bit integers: pi2's side files (profile counts), never a weight */
};

#define QK4_0 32
#define QK8_0 32

/* ggml block layouts: one f16 scale then the quants */
typedef struct {
    uint16_t d;          /* f16 scale */
    uint8_t qs[QK4_0 / 2]; /* element i in low nibble of qs[i], element i+16 in the high nibble */
} block_q4_0;            /* w = d * (q - 8) */

typedef struct {
    uint16_t d;          /* f16 scale */
    int8_t qs[QK8_0];
} block_q8_0;            /* w = d * q */

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");

/* true for F32, F16, Q4_0, Q8_0: the weight types */
bool ggml_type_supported(uint32_t type);
/* the weight types, I8 and I32: what the GGUF reader and writer take */
bool ggml_type_known(uint32_t type);
/* "f32", "f16", "q4_0", "q8_0"; for others a ggml name if known ("q4_1", "q5_k", ...) or "type N" */
const char *ggml_type_name(uint32_t type);
/* parse "f32", "F16", "q4_0", "q8_0" (any case); returns -1 for any other name,
 * including known-but-unsupported ggml types */
int ggml_type_from_name(const char *name);
/* elements per block (1 for float types, I8 and I32) and bytes per block; 0 if not known */
uint32_t ggml_block_elems(uint32_t type);
uint32_t ggml_block_bytes(uint32_t type);
/* bytes of a row of n elements; 0 if n is not a multiple of the block size
 * or the type is unsupported */
size_t ggml_row_bytes(uint32_t type, uint64_t n);

#endif

/* ggml tensor type table: block geometry of the types pi2 supports, and the
 * names of every ggml type so errors can say what an unsupported file holds. */
#include "gguf/ggml_types.h"

#include <stdio.h>
#include <strings.h>

/* ggml's own spellings (ggml.c type_traits), indexed by type id; NULL = unused id */
static const char *const ggml_names[] = {
    [0] = "f32",      [1] = "f16",      [2] = "q4_0",     [3] = "q4_1",
    [6] = "q5_0",     [7] = "q5_1",     [8] = "q8_0",     [9] = "q8_1",
    [10] = "q2_K",    [11] = "q3_K",    [12] = "q4_K",    [13] = "q5_K",
    [14] = "q6_K",    [15] = "q8_K",    [16] = "iq2_xxs", [17] = "iq2_xs",
    [18] = "iq3_xxs", [19] = "iq1_s",   [20] = "iq4_nl",  [21] = "iq3_s",
    [22] = "iq2_s",   [23] = "iq4_xs",  [24] = "i8",      [25] = "i16",
    [26] = "i32",     [27] = "i64",     [28] = "f64",     [29] = "iq1_m",
    [30] = "bf16",    [34] = "tq1_0",   [35] = "tq2_0",   [39] = "mxfp4",
};
#define N_GGML_NAMES (sizeof ggml_names / sizeof ggml_names[0])

bool ggml_type_supported(uint32_t type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_Q4_0 ||
           type == GGML_TYPE_Q8_0;
}

bool ggml_type_known(uint32_t type) {
    return ggml_type_supported(type) || type == GGML_TYPE_I8 || type == GGML_TYPE_I32;
}

const char *ggml_type_name(uint32_t type) {
    if (type < N_GGML_NAMES && ggml_names[type]) return ggml_names[type];
    static _Thread_local char buf[24];
    snprintf(buf, sizeof buf, "type %u", type);
    return buf;
}

int ggml_type_from_name(const char *name) {
    /* only the supported types: callers use this to choose what to write or compute */
    static const uint32_t supported[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0,
                                         GGML_TYPE_Q8_0};
    for (size_t i = 0; i < sizeof supported / sizeof supported[0]; i++)
        if (!strcasecmp(name, ggml_names[supported[i]])) return (int)supported[i];
    return -1;
}

uint32_t ggml_block_elems(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32:
    case GGML_TYPE_F16:
    case GGML_TYPE_I8:
    case GGML_TYPE_I32: return 1;
    case GGML_TYPE_Q4_0: return QK4_0;
    case GGML_TYPE_Q8_0: return QK8_0;
    default: return 0;
    }
}

uint32_t ggml_block_bytes(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return 4;
    case GGML_TYPE_F16: return 2;
    case GGML_TYPE_I8: return 1;
    case GGML_TYPE_I32: return 4;
    case GGML_TYPE_Q4_0: return sizeof(block_q4_0);
    case GGML_TYPE_Q8_0: return sizeof(block_q8_0);
    default: return 0;
    }
}

size_t ggml_row_bytes(uint32_t type, uint64_t n) {
    uint32_t be = ggml_block_elems(type);
    if (!be || n % be) return 0;
    size_t bytes;
    if (__builtin_mul_overflow(n / be, (uint64_t)ggml_block_bytes(type), &bytes)) return 0;
    return bytes;
}

/* A llama-architecture model mapped from a GGUF file: hyperparameters from
 * metadata, weights as typed views into the mapping (nothing is copied,
 * except norm vectors, which are converted to F32).
 *
 * Errors: model_load and model_load_resident return -1 with a message in err
 * (errlen bytes) naming the file; model_release_file_pages returns -1 with
 * errno set; weight_transpose and weight_transpose_cols return -1 with no
 * message (bad shape, out of memory). The rest cannot fail. */
#ifndef PI2_MODEL_H
#define PI2_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"

/* FFN activation. Metadata key "pi2.ffn_activation" = "silu" | "relu" | "relu2";
 * PWRI files default to relu, arch "bamboo" to relu2, everything else to silu. */
typedef enum {
    FFN_SILU,      /* silu(gate) * up      (SwiGLU) */
    FFN_RELU,      /* relu(gate) * up      (ReluLLaMA, ProSparse) */
    FFN_RELU2,     /* relu(gate) * relu(up) (Bamboo) */
} ffn_act;

#define PI2_KEY_FFN_ACT "pi2.ffn_activation"

/* Metadata of a hot-first copy written by pi2-reorder (calib/reorder.h); the
 * engine reads the firing counts to balance work (chunk_split.h). */
#define REORDER_KEY_CALIB_TOKENS "pi2.reorder.calibration_tokens" /* u32 */
#define REORDER_KEY_GRANULARITY "pi2.reorder.granularity"         /* u32: 1, or 32 (whole blocks) */
#define REORDER_KEY_PERMUTATION "pi2.reorder.permutation"         /* i32[n_layer * n_ff]: new j = old perm[j] */
#define REORDER_KEY_FIRING "pi2.reorder.firing_counts"            /* u32[n_layer * n_ff], in the new order */
#define REORDER_KEY_SOURCE "pi2.reorder.source_fingerprint"       /* u64: model_fingerprint of the input */

const char *ffn_act_name(ffn_act a);

/* The activation of a ReLU-family FFN (FFN_RELU, FFN_RELU2) from a neuron's gate and up values. */
static inline float ffn_act_relu(ffn_act a, float g, float u) {
    if (a == FFN_RELU) return g > 0 ? g * u : 0.0f;
    return g > 0 && u > 0 ? g * u : 0.0f;
}

/* A 2-D weight: `rows` rows of `cols` elements, each row `row_bytes` long. */
typedef struct {
    const void *data;
    uint32_t type;
    int64_t rows, cols;
    size_t row_bytes;
} weight;

uint64_t weight_bytes(const weight *w); /* rows * row_bytes; 0 for an absent weight */

typedef struct {
    float *attn_norm, *ffn_norm;             /* [n_embd], F32 copies */
    weight wq, wk, wv, wo;
    weight gate, up, down;                    /* gate/up: [n_ff rows][n_embd]; down: [n_embd rows][n_ff] */
    weight down_t;                            /* PWRI: down transposed, [n_ff rows][n_embd]; data NULL if absent */
    weight fc1, fc2;                          /* PWRI predictor; data NULL if absent */
} layer_weights;

typedef struct {
    gguf_file gguf;
    char arch[32];
    int n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    float rms_eps, rope_base;
    ffn_act act;
    bool tied_output;                         /* output == token_embd */
    float sparse_threshold;                   /* powerinfer.sparse_threshold, if any */
    weight tok_embd;                          /* [n_vocab rows][n_embd] */
    float *output_norm;                       /* [n_embd] */
    weight output;                            /* [n_vocab rows][n_embd] */
    layer_weights *layers;
    void *resident;                           /* model_load_resident's copy of the file, else NULL */
    size_t resident_bytes;
} model;

/* Map and validate a model. On error returns -1 with a message naming the
 * file and the missing/ill-shaped tensor or key. */
int model_load(model *m, const char *path, char *err, size_t errlen);
/* As model_load, but reads the whole file into anonymous memory on 2 MiB
 * pages (transparent huge pages, where enabled) instead of mapping it: a
 * dense decode then walks ~1.9k TLB entries per token, not ~950k. Needs RAM
 * for the whole file; takes about as long as reading it. */
int model_load_resident(model *m, const char *path, char *err, size_t errlen);
void model_free(model *m);
/* Lets go of the file pages this process read through m's mapping (the
 * mapping stays valid: a later read faults its page in again) and asks the
 * kernel to drop the file's cached pages that no process maps: under a memory
 * cgroup they count against the budget, and a cgroup kept at its limit by
 * clean pages reclaims on every allocation. path: the file m was loaded
 * from. Returns 0, or -1 with errno when the file cannot be opened or
 * advised (nothing is undone: a failure only leaves pages cached). */
int model_release_file_pages(const model *m, const char *path);
/* w viewing neurons [n0, n1) of its layer: gate, up and down_t (those
 * present) start at neuron n0's row and have n1 - n0 rows; ffn_down (its
 * rows are not neurons) and the rest stay as they are. */
void layer_weights_neurons(layer_weights *w, long n0, long n1);
/* Total bytes of the weights read by one dense decode token. */
uint64_t model_bytes_per_token(const model *m);
/* The FFN's share of it: every layer's gate, up and down (or down_t) rows. */
uint64_t model_ffn_bytes_per_token(const model *m);

/* A neuron-major copy of a weight (out row c = column c of w, dequantized and
 * stored as `type`), for sparse decode of files without PowerInfer's ffn_down_t.
 * F32 from F32/F16 is exact; Q8_0 from a quantized weight is a requantization,
 * not bit-exact. Costs w->cols * row bytes of heap (ffn_down of a 7B layer:
 * 180 MB as F32, 48 MB as Q8_0). Q8_0 needs w->rows % 32 == 0. Returns 0, or
 * -1 (out of memory / bad shape); the caller free()s out->data. */
int weight_transpose(const weight *w, uint32_t type, weight *out);
/* The same for columns [c_begin, c_end) only (out row j = column c_begin + j);
 * c_begin a multiple of 32 for quantized weights. */
int weight_transpose_cols(const weight *w, long c_begin, long c_end, uint32_t type, weight *out);

#endif

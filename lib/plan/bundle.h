/* The bundle file: a model's FFN neurons laid out for O_DIRECT reads, the
 * storage a model larger than memory decodes from (docs/bundle.md).
 *
 * A GGUF file (alignment 4096, so the strict reader validates it). Per layer
 * one I8 tensor blk.L.ffn_bundles of shape [stride, n_bundles]: bundle b
 * holds the neurons in slots b * per_bundle .. b * per_bundle + per_bundle - 1
 * of the layer's order, each as its gate row, up row and down_t row (the
 * neuron's column of ffn_down, neuron-major, in the type the engine's sparse
 * decode uses: the file's ffn_down_t, or ffn_down transposed exactly (F32,
 * F16) or requantized to Q8_0), zero padding up to stride, a multiple of 4096.
 * Every bundle therefore starts on a 4096-byte file offset and is read whole
 * by one O_DIRECT read. The order puts the hottest neurons first, so the hot
 * region of a layer is one sequential range.
 *
 * Metadata (pi2.bundle.*): version, the source model's size and fingerprint
 * (model_fingerprint) and file name, the shape and row types, per_bundle and
 * stride, the order of every layer (one INT32 array, layer after layer), and
 * a checksum of every layer's region; after the layers, one tensor of every
 * bundle's own checksum, so a bundle read alone is checked alone.
 *
 * Errors: the functions that take err return -1 with a message in err (errlen
 * bytes) naming the file and the field or layer. bundle_check and
 * bundle_check_run report a corrupt bundle by their result (false, or its
 * index); the rest cannot fail. */
#ifndef PI2_BUNDLE_H
#define PI2_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "gguf/gguf.h"

#define BUNDLE_ALIGN 4096
#define BUNDLE_VERSION 3 /* 3: bundles summed by lanesum64 */
#define BUNDLE_SUMS_TENSOR "bundle_checksums" /* i8 [8 * n_bundles, n_layer]: each bundle's bundle_sum */
#define BUNDLE_MAX_PER_BUNDLE 64

typedef struct {
    gguf_file g;
    int n_layer, n_ff, n_embd;
    uint32_t gate_type, up_type, down_type;
    size_t gate_bytes, up_bytes, down_bytes; /* one row of each */
    size_t neuron_bytes;                     /* their sum */
    int per_bundle;                          /* neurons per bundle */
    size_t stride;                           /* bytes per bundle, a multiple of BUNDLE_ALIGN */
    long n_bundles;                          /* per layer */
    uint64_t source_size, source_fingerprint;
    const int32_t *order;     /* [n_layer][n_ff]: the neuron in each slot (owned copy) */
    const uint64_t *checksum; /* [n_layer] (owned copy) */
    const uint64_t *bundle_checksum; /* [n_layer][n_bundles]: bundle_sum of each bundle's stride bytes (owned) */
    const uint8_t **region;   /* [n_layer]: the layer's bundles */
    uint64_t *region_offset;  /* [n_layer]: their file offsets */
} bundle_file;

/* Called after each layer written (and once with 0 before the first). */
typedef void (*bundle_progress_fn)(void *ctx, int layers_done, int n_layer);

/* Writes m's bundle file to path (through path.tmp, renamed at the end).
 * order: [n_layer][n_ff] neuron per slot, each layer a permutation (NULL:
 * every layer in neuron order); per_bundle in 1..BUNDLE_MAX_PER_BUNDLE.
 * 0, or -1 with err set (nothing left at path). */
int bundle_write(const model *m, const char *model_path, const int32_t *order, int per_bundle, const char *path,
                 bundle_progress_fn progress, void *progress_ctx, char *err, size_t errlen);

/* Maps and validates path: every field, the order's permutations, the
 * tensors' shapes against the metadata. With m (may be NULL) also that it
 * was written from m's file: size, fingerprint, shape and row types; the
 * error names both files. Does not read the regions (bundle_verify does). */
int bundle_open(bundle_file *b, const char *path, const model *m, const char *model_path, char *err, size_t errlen);
/* The same checks on an image in memory (not copied: it must outlive b), without a model. */
int bundle_parse(bundle_file *b, const void *buf, size_t size, const char *name, char *err, size_t errlen);
void bundle_close(bundle_file *b);
/* A bundle's checksum: lanesum64 (kernels/lanesum.h) of its bytes, by the
 * fastest kernel set; _cold for bytes a device just wrote, in no cache of
 * this core. */
uint64_t bundle_sum(const void *bytes, size_t n);
uint64_t bundle_sum_cold(const void *bytes, size_t n);
/* Whether `bytes` (stride of them, read from anywhere) are bundle `bundle`
 * of layer l as written: a reader of one bundle checks it alone. */
bool bundle_check(const bundle_file *b, int l, long bundle, const uint8_t *bytes);
/* Layer l's bundles first .. first + n - 1, laid one stride after another
 * from `bytes`: the first that does not match its checksum, or -1. */
long bundle_check_run(const bundle_file *b, int l, long first, long n, const uint8_t *bytes);
/* Checks every layer's checksum; the error names the first bad layer. */
int bundle_verify(const bundle_file *b, char *err, size_t errlen);

/* The neuron in `slot` of layer l, and where its rows are in the mapping
 * (gate, then up, then down_t, neuron_bytes in all). */
static inline const uint8_t *bundle_slot_rows(const bundle_file *b, int l, long slot) {
    return b->region[l] + (size_t)(slot / b->per_bundle) * b->stride +
           (size_t)(slot % b->per_bundle) * b->neuron_bytes;
}
/* File offset of bundle `bundle` of layer l: a multiple of BUNDLE_ALIGN. */
static inline uint64_t bundle_file_offset(const bundle_file *b, int l, long bundle) {
    return b->region_offset[l] + (uint64_t)bundle * b->stride;
}

/* The down_t row type bundle_write uses for m (and the engine's sparse decode). */
uint32_t bundle_down_type(const model *m);

#endif

/* Activation predictors for sparse decode: per layer, which FFN neurons will
 * fire for this token, before the gate rows are read.
 *
 * Two kinds:
 *  - "powerinfer": PowerInfer's MLP predictor stored in PWRI model files,
 *    logit = fc2 . relu(fc1 . residual), residual = x before the FFN RMSNorm;
 *  - "lowrank": ours, built offline from the weights alone (pi2-predictor
 *    build): B . (A . ffn_in) approximates the gate pre-activation
 *    gate . ffn_in, ffn_in = rmsnorm(x) * ffn_norm. Stored in a GGUF side file.
 * A neuron is predicted active iff its logit >= the layer's threshold.
 *
 * Errors: predictor_load and predictor_load_shared return NULL, and
 * predictor_q8_0_image_write -1, with a message in err (errlen bytes).
 * Evaluation and the accessors cannot fail: they trust the caller's layer,
 * ranges and buffers. */
#ifndef PI2_PREDICTOR_H
#define PI2_PREDICTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "engine/ops.h"

typedef enum { PREDICTOR_POWERINFER, PREDICTOR_LOWRANK } predictor_kind;
typedef enum { PREDICTOR_INPUT_RESIDUAL, PREDICTOR_INPUT_FFN_NORM_OUT } predictor_input;

typedef struct predictor predictor;

/* Side-file metadata keys. */
#define PRED_KEY_KIND "pi2.predictor.kind"                   /* "lowrank" */
#define PRED_KEY_RANK "pi2.predictor.rank"                   /* u32 */
#define PRED_KEY_RECALL "pi2.predictor.target_recall"        /* f32 */
#define PRED_KEY_INPUT "pi2.predictor.input"                 /* "ffn_norm_out" */
#define PRED_KEY_THRESHOLDS "pi2.predictor.thresholds"       /* f32[n_layer]: tau_l */
#define PRED_KEY_GATE_CUT "pi2.predictor.gate_cut"           /* f32[n_layer]: truth is gate > cut_l */
#define PRED_KEY_ACT "pi2.predictor.activation"              /* the model's ffn activation */
#define PRED_KEY_N_LAYER "pi2.predictor.model.n_layer"       /* u32 */
#define PRED_KEY_N_EMBD "pi2.predictor.model.n_embd"         /* u32 */
#define PRED_KEY_N_FF "pi2.predictor.model.n_ff"             /* u32 */
#define PRED_KEY_MODEL_SIZE "pi2.predictor.model.file_size"  /* u64 */
#define PRED_KEY_FINGERPRINT "pi2.predictor.model.fingerprint" /* u64, model_fingerprint() */
#define PRED_KEY_CALIB_TOKENS "pi2.predictor.calibration_tokens" /* u32 */

/* side_file NULL: PowerInfer's fc1/fc2 from the model (error if it has none).
 * Otherwise a lowrank side file, refused unless built for this model file. */
predictor *predictor_load(const model *m, const char *side_file, char *err, size_t errlen);
void predictor_free(predictor *p);

/* One Q8_0 copy of PowerInfer's F16/F32 fc1/fc2 for every process of a stack
 * (a budgeted stack keeps it in the weights segment): its bytes, 0 when this
 * machine's kernels keep the predictor as it is in the file;
 * predictor_q8_0_image_write makes it in image (exactly that many bytes);
 * predictor_load_shared loads the model's predictor over it, bit for bit the
 * predictor predictor_load(m, NULL) converts for itself. */
uint64_t predictor_q8_0_image_bytes(const model *m);
int predictor_q8_0_image_write(const model *m, void *image, uint64_t image_bytes, char *err, size_t errlen);
predictor *predictor_load_shared(const model *m, const void *image, uint64_t image_bytes, char *err, size_t errlen);

predictor_kind predictor_get_kind(const predictor *p);
predictor_input predictor_get_input(const predictor *p);
int predictor_max_rank(const predictor *p);
float predictor_threshold(const predictor *p, int layer);
/* Override a layer's threshold (tools sweep it to trade recall for precision). */
void predictor_set_threshold(predictor *p, int layer, float tau);
/* Truth the predictor was calibrated against: neuron fires iff gate > cut
 * (0 for ReLU models; the calibrated SiLU magnitude cut otherwise). */
float predictor_gate_cut(const predictor *p, int layer);
/* Bytes of predictor weights read per token (all layers). */
uint64_t predictor_bytes_per_token(const predictor *p);

/* logits[0..n_ff) of layer `layer`; neuron i is predicted active iff
 * logits[i] >= predictor_threshold(p, layer). residual: x before the FFN
 * RMSNorm; ffn_in: rmsnorm(x) * ffn_norm; only the one the predictor reads
 * (predictor_get_input) may be NULL-checked, the other may be NULL.
 * Uses p's scratch buffers: one thread at a time per predictor. */
void predictor_logits(predictor *p, int layer, const float *residual, const float *ffn_in, float *logits);

/* The same in two thread-safe steps, for the decode paths (lib/engine/ffn_chunks.h),
 * with the caller's buffers. predictor_prepare, once per layer: hidden
 * [predictor_max_rank], conv with room for max(n_embd, max_rank) values; on
 * return conv holds the hidden vector converted for the second stage. Then any
 * thread: predictor_rows gives logits[i - i0] for neurons [i0, i1), the same
 * bits as predictor_logits. */
void predictor_prepare(const predictor *p, int layer, const float *residual, const float *ffn_in, float *hidden,
                       act_vec *conv);
void predictor_rows(const predictor *p, int layer, const act_vec *conv, long i0, long i1, float *logits);
/* predictor_prepare in parts, for processes that share the first stage: the
 * layer's hidden vector has predictor_rank entries; predictor_hidden_rows
 * computes entries [r0, r1) of it (each entry's bits do not depend on the
 * split; conv is scratch), and once every entry is in place
 * predictor_hidden_done converts it for predictor_rows (conv may then point
 * into hidden). */
long predictor_rank(const predictor *p, int layer);
/* The FFN input predictor_prepare takes with a layer's input x as the residual, for the cpu-workers'
 * early guess of a layer's neurons before its attention (and the model profile, which counts its
 * misses): rmsnorm(x) * the layer's ffn_norm into scratch [n_embd] when the predictor reads the FFN's
 * input; NULL when it reads the residual. */
const float *predictor_guess_ffn_in(const predictor *p, int layer, const float *x, float *scratch);
void predictor_hidden_rows(const predictor *p, int layer, const float *residual, const float *ffn_in, long r0,
                           long r1, float *hidden, act_vec *conv);
void predictor_hidden_done(const predictor *p, int layer, const float *hidden, act_vec *conv);
/* Weight bytes of one neuron's second-stage row, and of a layer's first stage. */
uint64_t predictor_row_bytes(const predictor *p, int layer);
uint64_t predictor_stage1_bytes(const predictor *p, int layer);

/* Indices (ascending) of the neurons predicted active, written to
 * active[0..min(count, cap)); returns the count (may exceed cap). */
int predictor_predict(predictor *p, int layer, const float *residual, const float *ffn_in, int32_t *active, int cap);

/* Identity of a model file for side files: a hash of its size, header and
 * metadata and the first KiB of every tensor. */
uint64_t model_fingerprint(const model *m);

#endif

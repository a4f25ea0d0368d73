/* Weights of a synthetic llama model, generated row by row on demand, with
 * planted FFN activation sparsity for ReLU models (see docs/mkmodel.md).
 *
 * Construction (ReLU): the residual stream lives near a low-rank subspace,
 *   embedding e_t = k * (a*u + B z_t + s_n * noise),   z_t ~ N(0, I_r),
 * u a persistent unit direction, B an orthonormal basis orthogonal to u;
 * attention and FFN outputs are small, so every layer's FFN input stays close
 * to the embedding. Gate row i = gamma * (B w_i + s_g*noise + t_i*u) / ffn_norm,
 * so the pre-activation over tokens is ~ N(a*t_i, var_i): t_i is set from the
 * normal quantile so that P(fire) equals the neuron's target p_i. The p_i
 * follow a capped log-normal over neurons, calibrated to the mean firing rate
 * and the share of firings taken by the hottest neurons.
 *
 * ReLU² (bamboo) uses the same gate; relu(up) then zeroes about half of the
 * firing neurons (up is independent of the gate), see docs/mkmodel.md.
 *
 * Every element is a pure function of (seed, tensor, layer, index): rows can
 * be generated in any order by any thread.
 *
 * Errors: synth_model_new returns NULL with a message in err (errlen bytes);
 * generation cannot fail (the caller keeps layer and row in range). */
#ifndef PI2_SYNTH_MODEL_H
#define PI2_SYNTH_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab;
    bool relu;              /* plant firing statistics (ReLU) or plain random weights (SiLU) */
    bool relu_up;           /* ReLU²: the FFN also clamps up (relu(gate) * relu(up), bamboo);
                               only ffn_down's scale follows it, the planting targets relu(gate) */
    uint64_t seed;
    double fire;            /* target mean fraction of FFN neurons firing per token */
    double hot_frac;        /* the hottest hot_frac of the neurons ... */
    double hot_share;       /* ... take hot_share of all firings */
    double gate_quant_err;  /* relative error energy of the gate's weight type, ||dq||^2/||w||^2 */
} synth_params;

typedef enum {
    SYN_TOKEN_EMBD,   /* [n_vocab rows][n_embd] */
    SYN_OUTPUT_NORM,  /* 1 row of n_embd */
    SYN_OUTPUT,       /* [n_vocab][n_embd] */
    SYN_ATTN_NORM,    /* 1 row of n_embd, per layer */
    SYN_FFN_NORM,
    SYN_ATTN_Q,       /* [n_embd][n_embd] */
    SYN_ATTN_K,       /* [kv_dim][n_embd] */
    SYN_ATTN_V,
    SYN_ATTN_OUT,     /* [n_embd][n_embd] */
    SYN_FFN_GATE,     /* [n_ff][n_embd] */
    SYN_FFN_UP,
    SYN_FFN_DOWN,     /* [n_embd][n_ff] */
    SYN_FFN_DOWN_T,   /* [n_ff][n_embd]: ffn_down transposed, the same numbers */
    SYN_PRED_FC1,     /* [pred_rank][n_embd]: PowerInfer predictor, first layer */
    SYN_PRED_FC2,     /* [n_ff][pred_rank] */
    SYN_KIND_COUNT
} synth_kind;

typedef struct synth_model synth_model;

/* Validates the shape and targets (fire in (0, 0.9), hot_frac < hot_share
 * reachable, ...). Returns NULL with a message in err. */
synth_model *synth_model_new(const synth_params *p, char *err, size_t errlen);
void synth_model_free(synth_model *m);

void synth_shape(const synth_model *m, synth_kind k, int64_t *rows, int64_t *cols);
/* Row `row` of tensor k of layer `layer` (ignored for global tensors) into out[cols]. */
void synth_row(const synth_model *m, synth_kind k, int layer, int64_t row, float *out);

int synth_rank(const synth_model *m);       /* r: dimension of the token subspace B */
int synth_pred_rank(const synth_model *m);  /* 2 * (r + 1) */
/* Target firing probability of neuron i of layer l (ReLU models). */
double synth_target_p(const synth_model *m, int layer, int neuron);
/* Log-normal shape of the p_i and the expected hot share it gives. */
double synth_lognormal_sigma(const synth_model *m);
double synth_expected_hot_share(const synth_model *m);

/* Inverse standard normal CDF (|error| < 1e-12 after refinement). */
double synth_normal_quantile(double p);

#endif

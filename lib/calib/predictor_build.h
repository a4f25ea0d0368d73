/* Predictors offline: run calibration prompts through the reference engine,
 * build a lowrank predictor from a model's weights (pi2-predictor build), and
 * score a predictor against the true firing (pi2-predictor eval). The run-time
 * side, loading and evaluating a predictor in decode, is engine/predictor.h.
 *
 * Errors: predictor_run_prompts, predictor_build and predictor_eval return -1
 * with a message in err (errlen bytes); lowrank_factor, which has no err,
 * returns -1 for a rank outside [1, min(rows, cols)] or when out of memory.
 * predictor_default_rank cannot fail. */
#ifndef PI2_PREDICTOR_BUILD_H
#define PI2_PREDICTOR_BUILD_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "engine/predictor.h"

/* Randomized SVD of G (rows x cols, row-major) to rank r: A (r x cols) and
 * B (rows x r), both row-major, with B . A ~ G (singular values split evenly
 * between them). power_iters rounds of subspace iteration, oversampling of 8
 * columns; threads > 1 splits the products. Returns 0, or -1 for r outside
 * [1, min(rows, cols)] or when out of memory. */
int lowrank_factor(const float *G, int rows, int cols, int r, int power_iters, uint64_t seed, int threads, float *A,
                   float *B);

/* Which tokens to run through the reference engine: each prompt (with BOS)
 * from position 0, then gen_per_prompt greedy tokens, until n_tokens in all. */
typedef struct {
    const char *const *prompts;
    int n_prompts;
    int n_tokens;
    int gen_per_prompt;
    int threads;
} predictor_run_opts;

/* Run the tokens with fn observing every layer's FFN; returns the number of
 * tokens run, or -1 with a message in err. */
int predictor_run_prompts(const model *m, const predictor_run_opts *o, ffn_observer fn, void *ctx, char *err,
                          size_t errlen);

typedef struct {
    const char *out_path;
    int rank;                   /* <= 0: predictor_default_rank */
    double target_recall;       /* of the true firing set, on the calibration tokens */
    double silu_keep;           /* SiLU models: fraction of neurons counted as firing (largest silu(gate)) */
    uint32_t weight_type;       /* GGML_TYPE_F16, F32 or Q8_0 (Q8_0 needs rank % 32 == 0) */
    int power_iters;
    predictor_run_opts calib;   /* calibration tokens; calib.threads also for the factorization */
} predictor_build_opts;

int predictor_default_rank(const model *m);
/* Factor every layer's gate, calibrate thresholds on the prompts, write the
 * side file. Logs progress; returns 0, or -1 with a message in err. */
int predictor_build(const model *m, const predictor_build_opts *o, char *err, size_t errlen);

/* ---- evaluation ---- */

typedef struct {
    uint64_t tokens, true_active, predicted, hits; /* summed over tokens */
    double mass_total, mass_kept;                  /* sum |act(gate)| over all / over predicted neurons */
} predictor_layer_stats;

/* Run the prompts through the reference engine and score p against the true
 * firing (gate > predictor_gate_cut) per layer. stats: [n_layer]. Returns
 * the number of tokens run, or -1 with a message in err. */
int predictor_eval(const model *m, predictor *p, const predictor_run_opts *o, predictor_layer_stats *stats, char *err,
                   size_t errlen);

/* Built-in English prompts for calibration and (a disjoint set) evaluation. */
extern const char *const predictor_calib_prompts[];
extern const int predictor_n_calib_prompts;
extern const char *const predictor_eval_prompts[];
extern const int predictor_n_eval_prompts;

#endif

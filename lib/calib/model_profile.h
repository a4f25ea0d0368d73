/* The planner's model profile: how a model's FFN neurons fire on calibration
 * prompts, in the mode the stack will run. For every layer and neuron, which
 * of the calibration tokens it fired on (a bitset), hence its firing count,
 * each layer's sparsity, and the co-activation of any two neurons (tokens on
 * which both fired). Deterministic for a fixed prompt set: the engine runs
 * with one thread-count-independent order and greedy continuations.
 *
 * "Fired" means what the stack will load: in gate-first mode the neurons
 * whose gate is positive; in predictor mode the neurons the predictor names
 * (its logit >= its threshold, as the engine selects them), evaluated on the
 * reference engine's dense residual stream.
 *
 * In predictor mode the profile also counts, per neuron, the tokens on which
 * the stack's early guess missed it: the predictor run on the layer's input
 * (before attention, as the cpu-workers run it to ask for the layer's missing
 * bundles ahead) did not name a neuron that the FFN step's own selection then
 * named. Under a budget such a neuron, when not resident, is read at the FFN
 * step in a round trip of its own (docs/planner.md, cost model).
 *
 * Errors: functions returning int give 0, or -1 with a message in err that
 * names the file or model concerned. */
#ifndef PI2_CALIB_MODEL_PROFILE_H
#define PI2_CALIB_MODEL_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/ffn_mode.h"
#include "engine/model.h"

#define MODEL_PROFILE_VERSION 2
#define MODEL_PROFILE_MAX_TOKENS (1 << 24) /* of a run, and of a file the reader accepts */

typedef struct {
    int n_layer, n_ff;
    int n_tokens;                /* calibration tokens run */
    ffn_mode mode;               /* FFN_GATE_FIRST or FFN_PREDICTOR */
    uint64_t source_size, source_fingerprint; /* model_fingerprint of the profiled model */
    uint64_t run_hash;           /* model_profile_run_hash of the run: a profile names what it saw */
    uint32_t *counts;            /* [n_layer][n_ff]: tokens on which the neuron fired */
    uint32_t *guess_missed;      /* [n_layer][n_ff], predictor mode (else NULL): of those tokens, the ones on
                                  * which the guess from the layer's input did not name it */
    uint64_t *fired;             /* [n_layer][n_ff][words]: bit t of a neuron's row = fired on token t */
    int words;                   /* (n_tokens + 63) / 64 */
} model_profile;

/* The built-in calibration prompts: varied text (stories, instructions, code,
 * lists, dialogue, facts). */
extern const char *const model_profile_builtin_prompts[];
extern const int model_profile_n_builtin;

/* Called after each calibration token with (tokens done, o->n_tokens); a run
 * whose prompts run out first ends short of the total. */
typedef void (*model_profile_progress_fn)(void *ctx, int done, int total);

typedef struct {
    const char *const *prompts; /* run in order, each from position 0 with BOS, then greedy tokens */
    int n_prompts;
    int n_tokens;               /* tokens in all (prompt + greedy), e.g. 1024 */
    int gen_per_prompt;         /* greedy tokens after each prompt */
    ffn_mode mode;              /* FFN_GATE_FIRST, or FFN_PREDICTOR */
    const char *predictor_path; /* FFN_PREDICTOR: a pi2-predictor side file; NULL: the model's own
                                   fc1/fc2 (as a PWRI file has) */
    int threads;                /* the engine's; the profile's bits do not depend on it */
    const char *model_name;     /* named in errors (the model's path); NULL: "the model" */
    model_profile_progress_fn progress;
    void *progress_ctx;
} model_profile_opts;

/* What a run's profile depends on besides the model: the prompts in order,
 * the tokens asked for, the greedy tokens per prompt, the mode and the
 * predictor (its path and size). A saved
 * profile with the same run_hash (and model) is what the run would make, so
 * it can be reused (the tokens run may be fewer than asked, when the prompts
 * run out: the hash holds what was asked). */
uint64_t model_profile_run_hash(const model_profile_opts *o);

/* Runs the prompts through m and fills p. p->n_tokens is the number of
 * tokens run: fewer than o->n_tokens when the prompts and their greedy
 * continuations run out first. 0, or -1 with err set. */
int model_profile_run(model_profile *p, const model *m, const model_profile_opts *o, char *err, size_t errlen);
void model_profile_free(model_profile *p);

/* Tokens on which neurons i and j of layer l both fired. */
uint32_t model_profile_cofired(const model_profile *p, int l, int i, int j);

/* Saved as a GGUF file (general.type "pi2.profile"): keys pi2.profile.*
 * (version, mode, n_tokens, n_layer, n_ff, source size / fingerprint / name,
 * run hash), per layer the I8 tensor blk.L.fired [words * 8, n_ff] (each
 * neuron's bitset as little-endian words), the I32 tensor blk.L.counts
 * [n_ff] and, in predictor mode, the I32 tensor blk.L.guess_missed [n_ff]
 * (each at most the neuron's count). save refuses a p that was not made from m (model_path gives the
 * source name). load validates every key and tensor (counts against the
 * bitsets, no bit past n_tokens) and, with m (may be NULL), that the profile
 * was made from m's file, naming both files otherwise. 0, or -1 with err set. */
int model_profile_save(const model_profile *p, const model *m, const char *model_path, const char *path, char *err,
                       size_t errlen);
int model_profile_load(model_profile *p, const char *path, const model *m, const char *model_path, char *err,
                       size_t errlen);
/* The same checks on an image in memory (name for messages), without a model. */
int model_profile_parse(model_profile *p, const void *buf, size_t size, const char *name, char *err,
                        size_t errlen);

/* Spearman rank correlation of a and b (n values, ties averaged); 0 when
 * n < 2 or either side is constant (no order to compare), NAN when out of memory. */
double rank_correlation(const double *a, const double *b, int n);

#endif

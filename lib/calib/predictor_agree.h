/* How far a predictor-mode engine's output strays from the dense engine's:
 * the same prompts through both, side by side (greedy-token agreement
 * with dense, next to predictor_eval's recall and precision).
 *
 * Errors: predictor_agree returns -1 with a message in err (errlen bytes); an
 * empty or overlong prompt is skipped with a warning (log_warn). */
#ifndef PI2_PREDICTOR_AGREE_H
#define PI2_PREDICTOR_AGREE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "calib/predictor_build.h"

typedef struct {
    /* Teacher-forced: each prompt then run.gen_per_prompt of dense's greedy
     * tokens, run.n_tokens in all; both engines are fed the same tokens and
     * their logits compared after every token (prompt tokens included). */
    predictor_run_opts run;
    /* Free-running: after each prompt, each engine continues with its own
     * greedy tokens, up to free_gen of them (0: skipped). */
    int free_gen;
} predictor_agree_opts;

typedef struct {
    /* teacher-forced, summed over steps */
    uint64_t steps;
    uint64_t top1_same;     /* argmax(predictor) == argmax(dense) */
    uint64_t top1_in_top5;  /* fewer than 5 dense logits beat dense's logit of argmax(predictor) */
    double rel_diff_max;    /* of max_v |dense_v - predictor_v| / max_v |dense_v| per step */
    double rel_diff_sum;
    /* FFN work (engine_ffn_stats, all layers), summed over the steps */
    uint64_t computed, active, bytes;    /* predictor mode; bytes include the predictor */
    uint64_t dense_computed, dense_bytes;
    /* free-running */
    uint64_t free_prompts;
    uint64_t free_possible; /* sum over prompts of the tokens either could generate (<= free_gen each) */
    uint64_t prefix_sum;    /* sum over prompts of the common prefix of the two continuations */
} predictor_agreement;

/* Runs dense and FFN_PREDICTOR (with p, for this model) engines side by side.
 * Returns the teacher-forced step count, or -1 with a message in err. */
int predictor_agree(const model *m, const predictor *p, const predictor_agree_opts *o, predictor_agreement *a,
                    char *err, size_t errlen);

#endif

/* Measures the realized FFN firing statistics of a model by running tokens
 * through the reference engine (mkmodel --measure).
 *
 * Errors: synth_measure logs the cause (log_error) and returns -1. */
#ifndef PI2_SYNTH_MEASURE_H
#define PI2_SYNTH_MEASURE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *path;
    int n_tokens;            /* a fixed English prompt, then random tokens */
    int n_threads;
    uint64_t seed;           /* for the random tokens */
    bool relu;               /* targets below apply */
    double fire, hot_frac, hot_share;
} measure_opts;

/* Prints per layer: the mean fraction of FFN neurons firing per token, the
 * share of firings taken by the hottest hot_frac of neurons and, for a model
 * with a predictor (PWRI fc1/fc2), its recall and precision; then a
 * "summary:" line of key=value pairs. Returns 0, or -1 after logging an error
 * (unloadable model, non-finite logits). */
int synth_measure(const measure_opts *o);

#endif

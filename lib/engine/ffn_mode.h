/* The FFN modes a decode can run in (dense, gate-first, predictor): their
 * names on the command line and in logs, and which models can run which. How
 * each mode computes is ffn_chunks.h's concern.
 *
 * Errors: ffn_mode_parse returns -1 for an unknown name; ffn_mode_parse_flag
 * also logs it (log_error). ffn_mode_refusal returns its reason as a string
 * (NULL: none); the rest cannot fail. */
#ifndef PI2_FFN_MODE_H
#define PI2_FFN_MODE_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/model.h"

typedef enum { FFN_DENSE, FFN_GATE_FIRST, FFN_PREDICTOR } ffn_mode;

const char *ffn_mode_name(ffn_mode mode); /* "dense", "gate-first", "predictor" */
/* "dense", "gate-first", or "predictor, predictor PATH" ("... fc1/fc2 of the
 * model" when path is NULL or empty) into buf, as logs and `pi2 status` show
 * the stack's mode. At most path_max bytes of path are read: it may come from
 * a shared segment, unterminated. */
void ffn_mode_describe(char *buf, size_t len, ffn_mode mode, const char *path, size_t path_max);
/* Whether mode runs by chunks on m: every mode but a dense FFN over an
 * ffn_down matrix (a PWRI file has only ffn_down_t, so even dense is chunked). */
bool ffn_mode_chunked(const model *m, ffn_mode mode);
int ffn_mode_parse(const char *s, ffn_mode *mode); /* 0, or -1 for an unknown name */
/* Why m cannot run mode, or NULL: gate-first needs a ReLU model, predictor
 * mode a predictor (have_predictor). Whether neuron-major down rows exist is
 * the caller's to check: the engine builds them, a stack's workers hold them
 * only for the stack's mode. */
const char *ffn_mode_refusal(const model *m, ffn_mode mode, bool have_predictor);

/* ffn_mode_parse for a command-line flag, or, where is_auto is not NULL,
 * "auto": then *is_auto says which, and *mode is set only for a mode. On
 * failure it logs "<flag> '<s>': expected ..." naming the accepted values,
 * and returns -1. */
int ffn_mode_parse_flag(const char *s, const char *flag, ffn_mode *mode, bool *is_auto);

#endif

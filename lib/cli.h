/* Pieces of command-line parsing shared by the programs: whole-string
 * number parsing with a range check (logging what was wrong with which
 * flag), the --ffn MODE names, and the default run id. */
#ifndef PI2_CLI_H
#define PI2_CLI_H

#include <stdbool.h>

#include "ffn_chunks.h"

/* Each parses all of s or fails: on failure it logs "<flag>: '<s>' is not
 * ..." and returns -1, leaving *out unchanged. */
int cli_parse_long(const char *s, const char *flag, long lo, long hi, long *out);
int cli_parse_int(const char *s, const char *flag, int lo, int hi, int *out);
/* Any number but NaN. */
int cli_parse_float(const char *s, const char *flag, float *out);
int cli_parse_double(const char *s, const char *flag, double lo, double hi, double *out);

/* An FFN mode name (ffn_mode_parse) or, where is_auto is not NULL, "auto":
 * then *is_auto says which, and *mode is set only for a mode. On failure it
 * logs "<flag> '<s>': expected ..." naming the accepted values, and returns -1. */
int cli_parse_ffn_mode(const char *s, const char *flag, ffn_mode *mode, bool *is_auto);

/* The stack to join when no -r is given: $PI2_RUN, else "default". */
const char *cli_default_runid(void);

#endif

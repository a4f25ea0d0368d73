/* Pieces of command-line parsing shared by the programs: whole-string
 * number parsing with a range check (logging what was wrong with which
 * flag), and the default run id.
 *
 * Errors: the parsers log what is wrong (log_error) and return -1, leaving
 * *out unchanged; cli_default_runid cannot fail. */
#ifndef PI2_CLI_H
#define PI2_CLI_H

/* Each parses all of s or fails: on failure it logs "<flag>: '<s>' is not
 * ..." and returns -1, leaving *out unchanged. */
int cli_parse_long(const char *s, const char *flag, long lo, long hi, long *out);
int cli_parse_int(const char *s, const char *flag, int lo, int hi, int *out);
/* Any number but NaN. */
int cli_parse_float(const char *s, const char *flag, float *out);
int cli_parse_double(const char *s, const char *flag, double lo, double hi, double *out);

/* The stack to join when no -r is given: $PI2_RUN, else "default". */
const char *cli_default_runid(void);

#endif

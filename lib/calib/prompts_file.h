/* Calibration prompts from a file: one prompt per non-empty line (CR/LF
 * stripped), as pi2-predictor --prompts and pi2 plan -f read them.
 *
 * Errors: calib_read_prompts returns -1 with a message in err (errlen bytes)
 * naming the file; *out is then NULL. */
#ifndef PI2_CALIB_PROMPTS_FILE_H
#define PI2_CALIB_PROMPTS_FILE_H

#include <stddef.h>

/* The prompts in *out (free with calib_free_prompts); returns their count
 * (0 for a file without any), or -1 with err set. */
int calib_read_prompts(const char *path, char ***out, char *err, size_t errlen);
void calib_free_prompts(char **prompts, int n);

#endif

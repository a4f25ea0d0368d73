/* The report of a failed assertion (pi2_assert.h). */
#include "util/pi2_assert.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/log.h"

void pi2_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    log_error("%s:%d: assertion `%s' failed: %s", file, line, cond, why);
    abort();
}

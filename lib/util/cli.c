#include "util/cli.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

int cli_parse_long(const char *s, const char *flag, long lo, long hi, long *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end || v < lo || v > hi) {
        log_error("%s: '%s' is not an integer in [%ld, %ld]", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_int(const char *s, const char *flag, int lo, int hi, int *out) {
    long v;
    if (cli_parse_long(s, flag, lo, hi, &v)) return -1;
    *out = (int)v;
    return 0;
}

int cli_parse_float(const char *s, const char *flag, float *out) {
    char *end;
    float v = strtof(s, &end);
    if (*s == 0 || *end || v != v) {
        log_error("%s: '%s' is not a number", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_double(const char *s, const char *flag, double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (*s == 0 || *end || !(v >= lo && v <= hi)) {
        log_error("%s: '%s' is not a number in [%g, %g]", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

const char *cli_default_runid(void) {
    const char *run = getenv("PI2_RUN");
    return run && *run ? run : "default";
}

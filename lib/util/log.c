#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *log_prog = "pi2";
static enum log_level log_min = LOG_INFO;

void log_init(const char *progname) {
    const char *slash = strrchr(progname, '/');
    log_prog = slash ? slash + 1 : progname;
    const char *env = getenv("PI2_LOG");
    if (!env) return;
    if (!strcmp(env, "debug")) log_min = LOG_DEBUG;
    else if (!strcmp(env, "info")) log_min = LOG_INFO;
    else if (!strcmp(env, "warn")) log_min = LOG_WARN;
    else if (!strcmp(env, "error")) log_min = LOG_ERROR;
}

void log_msg(enum log_level lvl, const char *fmt, ...) {
    static const char *names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
    if (lvl < log_min) return;
    char line[2048];
    int n = snprintf(line, sizeof line, "%s[%d] %s ", log_prog, (int)getpid(), names[lvl]);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line); /* one write per line keeps lines from interleaving */
}

void err_set(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

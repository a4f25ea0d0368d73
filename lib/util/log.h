/* Levelled logging to stderr: "pi2-ref[123] INFO  message". PI2_LOG=debug|info|warn|error.
 *
 * Errors: logging cannot fail: a line longer than 2 KiB is cut short, and an unknown PI2_LOG
 * keeps the info level. err_set fills the err buffer of functions that report to their caller
 * instead of logging. */
#ifndef PI2_LOG_H
#define PI2_LOG_H

#include <stddef.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

void log_init(const char *progname);
void log_msg(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Formats an error message into a caller's buffer (the err/errlen convention
 * of functions that report to their caller instead of logging). */
void err_set(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif

/* The exit statuses that scripts/pi2.sh, the supervisor, acts on. The script
 * keeps its own copies (EXIT_USAGE, EXIT_CONFIG); tests/test_shared_constants.sh
 * holds them equal to these.
 *
 * Errors: none: this header only defines constants. */
#ifndef PI2_EXIT_CODES_H
#define PI2_EXIT_CODES_H

/* A stack process that exits with one of these is not restarted (the same arguments would meet the same
 * refusal): the supervisor stops the stack with the process's last log line. */
#define PI2_EXIT_USAGE 2   /* bad arguments (every program) */
#define PI2_EXIT_CONFIG 78 /* a configuration it cannot run (sysexits.h EX_CONFIG) */

#endif

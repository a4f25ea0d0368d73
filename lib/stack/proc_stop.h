/* The stop flag of a stack process: SIGTERM (the supervisor) and SIGINT set
 * it, and every wait loop checks it.
 *
 * Errors: none: proc_stop_on_signals does not check sigaction, which fails
 * only for bad arguments. */
#ifndef PI2_PROC_STOP_H
#define PI2_PROC_STOP_H

#include <signal.h>

extern volatile sig_atomic_t proc_stop;

/* Installs the SIGTERM/SIGINT handlers that set proc_stop. */
void proc_stop_on_signals(void);

#endif

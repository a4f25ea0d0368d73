/* The command line of the stack's workers: -m MODEL, -r RUNID, -t THREADS,
 * -i INDEX and --no-realtime (cpu-workers only), and the PI2_TASK_DELAY_US fault-injection
 * aid. Shared by cpu-worker and npu-worker.
 *
 * Errors: worker_args_parse logs why (log_error) and returns -1; -h prints
 * the usage and exits 0. */
#ifndef PI2_WORKER_ARGS_H
#define PI2_WORKER_ARGS_H

#include <stdbool.h>
#include <stdio.h>

typedef struct {
    const char *model_path, *runid;
    int index;            /* -i; -1 for a worker that takes none */
    int n_threads;
    long task_delay_us;   /* PI2_TASK_DELAY_US: sleep this long before each task */
    bool realtime_io;     /* cpu-workers: the link to the io-worker at real-time priority (--no-realtime: not) */
} worker_args;

/* Parses argv into a. max_index >= 0 makes -i INDEX in [0, max_index]
 * required and takes --no-realtime; max_index < 0 refuses both. -h prints usage to stdout and exits 0.
 * Returns 0, or -1 after logging why (and printing usage to stderr). */
int worker_args_parse(int argc, char **argv, worker_args *a, int default_threads, int max_index,
                      void (*usage)(FILE *f));

/* Prints the help lines of the options above but -i (usage() prints its own
 * first), and the environment; unit names what PI2_TASK_DELAY_US delays. */
void worker_args_help(FILE *f, int default_threads, const char *unit);

#endif

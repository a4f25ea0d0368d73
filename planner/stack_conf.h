/* What the planner needs from a stack config (docs/supervisor.md: one
 * process per line, "NAME cpus=LIST [threads=N]"): how many processes, the
 * cpu-workers and their threads, and the workers' lines for the plan's
 * placement. */
#ifndef PI2_PLANNER_STACK_CONF_H
#define PI2_PLANNER_STACK_CONF_H

#include <stddef.h>

typedef struct {
    int n_processes;
    int cpu_workers;
    int threads;          /* decode threads of all cpu-workers */
    int max_prefill;      /* prompt tokens per prefill step: max-prefill=N, else the stack's default */
    char placement[1024]; /* the npu-worker and cpu-worker lines */
} stack_conf;

/* path NULL: the default stack (configs/default.conf's shape: 6 processes,
 * 2 cpu-workers of 1 thread). 0, or -1 with err naming the file and line. */
int stack_conf_read(const char *path, stack_conf *c, char *err, size_t errlen);

#endif

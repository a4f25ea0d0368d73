/* What the planner needs from a stack config (README.md, "Stack config": one
 * process per line, "NAME cpus=LIST [threads=N]"): how many processes, the
 * cpu-workers and their threads, and the workers' lines for the plan's
 * placement. */
#ifndef PI2_PLANNER_STACK_CONF_H
#define PI2_PLANNER_STACK_CONF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    int n_processes;
    int cpu_workers;
    int threads;          /* decode threads of all cpu-workers */
    int max_prefill;      /* prompt tokens per prefill step: max-prefill=N, else the stack's default */
    bool max_prefill_set; /* by the config: the planner keeps it rather than choosing one */
    bool checksums;       /* bundles checked as they are read (bundle-checksums=off: not) */
    /* the io-worker runs on a core that a cpu-worker computes on: both pinned to lists that meet,
     * or either unpinned on a machine whose every CPU computes */
    bool io_shares_compute;
    char placement[1024]; /* the npu-worker and cpu-worker lines */
} stack_conf;

/* path NULL: the default stack (configs/default.conf's shape: 6 processes,
 * 2 cpu-workers of 1 thread on CPUs 0 and 1, the io-worker on CPU 0). n_cpus:
 * the machine's, for unpinned processes. 0, or -1 with err naming the file
 * and line. */
int stack_conf_read(const char *path, int n_cpus, stack_conf *c, char *err, size_t errlen);

#endif

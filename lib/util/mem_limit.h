/* The memory this process (and the children it starts) may use, the way the
 * kernel will enforce it: the memory cgroup's limit (cgroup v1
 * hierarchical_memory_limit, else memory.limit_in_bytes; cgroup v2 the
 * smallest memory.max from this cgroup up to the root), capped by the
 * machine's MemAvailable (there is no swap to spill to). A phone's budget is
 * such a cap: a stack that needs more is killed for memory, not slowed.
 *
 * Errors: mem_limit_read returns -1 with the reason in out->source when
 * MemAvailable cannot be read; a missing or unreadable cgroup file only means
 * no limit there. */
#ifndef PI2_MEM_LIMIT_H
#define PI2_MEM_LIMIT_H

#include <stdint.h>

typedef struct {
    uint64_t bytes;    /* what may be used */
    char source[320];  /* which figure binds, e.g. "cgroup v1 /sys/fs/cgroup/memory/x: memory.limit_in_bytes" */
} mem_limit;

/* Reads the files under root ("" for this system; tests pass a directory
 * that mimics /proc and /sys). Every number is checked; a cgroup file that
 * is missing or unreadable counts as no limit there. Returns 0, or -1 when
 * not even MemAvailable can be read (a message in out->source). */
int mem_limit_read(const char *root, mem_limit *out);

#endif

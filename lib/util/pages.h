/* Giving memory back to the kernel without freeing it: the buffers of work
 * that comes and goes (a prompt's) hold no pages between times, so a memory
 * budget can lend those pages to something else meanwhile.
 *
 * Errors: none: pages_release is advice; if madvise fails the pages stay,
 * which costs memory, not correctness. */
#ifndef PI2_PAGES_H
#define PI2_PAGES_H

#include <stddef.h>

/* Drops the whole pages inside [p, p + bytes) of private memory this process
 * allocated (MADV_DONTNEED): they read as zeros when next touched, as calloc
 * gave them. The partial pages at the ends are kept. */
void pages_release(void *p, size_t bytes);

#endif

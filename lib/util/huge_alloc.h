/* Private anonymous memory on 2 MiB pages where the kernel can give them
 * (transparent huge pages in "madvise" mode): for large read-mostly copies
 * that decode streams every token, where 4 KiB pages cost a dTLB miss and a
 * page walk every 4 KiB.
 *
 * Errors: huge_alloc returns NULL when the mapping fails (errno from mmap); a
 * refused huge-page hint is ignored and the memory stays on 4 KiB pages. */
#ifndef PI2_HUGE_ALLOC_H
#define PI2_HUGE_ALLOC_H

#include <stddef.h>

#define HUGE_PAGE_BYTES ((size_t)2 << 20)

/* size bytes (zeroed), aligned to and rounded up to HUGE_PAGE_BYTES, so
 * that all of it can be backed by huge pages; *mapped gets the length to
 * pass to huge_free. NULL on failure. Without THP it still works, on 4 KiB
 * pages. */
void *huge_alloc(size_t size, size_t *mapped);
void huge_free(void *p, size_t mapped);

#endif

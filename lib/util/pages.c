#include "util/pages.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

void pages_release(void *p, size_t bytes) {
    if (!p || !bytes) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t begin = ((uintptr_t)p + page - 1) & ~(page - 1), end = ((uintptr_t)p + bytes) & ~(page - 1);
    if (end > begin) (void)madvise((void *)begin, end - begin, MADV_DONTNEED); /* advice: a failure keeps the pages */
}

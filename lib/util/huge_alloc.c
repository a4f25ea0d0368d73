#include "util/huge_alloc.h"

#include <stdint.h>
#include <sys/mman.h>

void *huge_alloc(size_t size, size_t *mapped) {
    const size_t len = (size + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    uint8_t *raw = mmap(NULL, len + HUGE_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *aligned = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE_BYTES - 1) & ~(uintptr_t)(HUGE_PAGE_BYTES - 1));
    if (aligned > raw) munmap(raw, (size_t)(aligned - raw));
    uint8_t *end = aligned + len, *raw_end = raw + len + HUGE_PAGE_BYTES;
    if (end < raw_end) munmap(end, (size_t)(raw_end - end));
    madvise(aligned, len, MADV_HUGEPAGE); /* advisory */
    *mapped = len;
    return aligned;
}

void huge_free(void *p, size_t mapped) {
    if (p) munmap(p, mapped);
}

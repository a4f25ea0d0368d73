/* Weight bytes a process will read soon, brought into the cache a little at
 * a time while it runs compute-bound work. The Q4_0 projections of
 * attention keep a core busy at ~18 GB/s while the memory bus could deliver
 * more; the sparse FFN that follows reads the predictor's rows, which are
 * known before attention starts (unlike the neurons it will pick). Fetching
 * them alongside the projections moves that time off the FFN's path. */
#ifndef PI2_PREFETCH_STREAM_H
#define PI2_PREFETCH_STREAM_H

#include <stddef.h>

#define PREFETCH_STREAM_MAX 64 /* regions; more are ignored (prefetching is only a hint) */

typedef struct {
    const char *at[PREFETCH_STREAM_MAX];
    size_t len[PREFETCH_STREAM_MAX];
    int n;
    size_t total; /* bytes of all regions */
} prefetch_stream;

void prefetch_stream_clear(prefetch_stream *s);
void prefetch_stream_add(prefetch_stream *s, const void *at, size_t len);
/* Prefetches into L2 the lines of bytes [from, to) of the regions taken one
 * after the other. */
void prefetch_stream_range(const prefetch_stream *s, size_t from, size_t to);

#endif

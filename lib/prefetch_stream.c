/* See prefetch_stream.h. */
#include "prefetch_stream.h"

#include <xmmintrin.h>

void prefetch_stream_clear(prefetch_stream *s) {
    s->n = 0;
    s->total = 0;
}

void prefetch_stream_add(prefetch_stream *s, const void *at, size_t len) {
    if (s->n == PREFETCH_STREAM_MAX || !len) return;
    s->at[s->n] = at;
    s->len[s->n++] = len;
    s->total += len;
}

void prefetch_stream_range(const prefetch_stream *s, size_t from, size_t to) {
    size_t base = 0;
    for (int i = 0; i < s->n && base < to; base += s->len[i++]) {
        if (base + s->len[i] <= from) continue;
        size_t lo = from > base ? from - base : 0, hi = to - base < s->len[i] ? to - base : s->len[i];
        for (size_t off = lo & ~(size_t)63; off < hi; off += 64) _mm_prefetch(s->at[i] + off, _MM_HINT_T1);
    }
}

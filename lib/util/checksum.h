/* A fast 64-bit checksum of a byte range, for detecting corrupted regions of
 * pi2's own files (not a cryptographic hash): four independent multiply-xor
 * lanes over 8-byte words, so it runs at several GB/s, then the tail and the
 * length folded in. The value depends on the bytes and their count only.
 *
 * Errors: none: defined for any byte range, an empty one included. */
#ifndef PI2_CHECKSUM_H
#define PI2_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t checksum_mix(uint64_t h, uint64_t v) {
    h = (h ^ v) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

static inline uint64_t checksum64(const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t lane[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            uint64_t v;
            memcpy(&v, p + i + 8 * (size_t)k, 8);
            lane[k] = checksum_mix(lane[k], v);
        }
    uint64_t h = checksum_mix(checksum_mix(lane[0], lane[1]), checksum_mix(lane[2], lane[3]));
    for (; i < n; i++) h = checksum_mix(h, p[i]);
    return checksum_mix(h, (uint64_t)n);
}

#endif

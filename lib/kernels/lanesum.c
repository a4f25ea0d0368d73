/* lanesum64's reference and the end every version shares (lanesum.h). */
#include "kernels/lanesum.h"

#include <string.h>

#include "util/checksum.h"

const uint64_t LANESUM_KEY[LANESUM_LANES] = {
    0xb7e151628aed2a6bull, 0x9216d5d98979fb1bull, 0xd1310ba698dfb5acull, 0x2ffd72dbd01adfb7ull,
    0xb8e1afed6a267e96ull, 0xba7c9045f12c7f99ull, 0x24a19947b3916cf7ull, 0x0801f2e2858efc16ull,
};
const uint64_t LANESUM_SEED[LANESUM_LANES] = {
    0x636920d871574e69ull, 0xa458fea3f4933d7eull, 0x0d95748f728eb658ull, 0x718bcd5882154aeeull,
    0x7b54a41dc25a59b5ull, 0x9c30d5392af26013ull, 0xc5d1b023286085f0ull, 0xca417918b8db38efull,
};

uint64_t lanesum_finish(const uint64_t acc[LANESUM_LANES], const uint8_t *tail, size_t n) {
    uint64_t h = 0;
    for (int k = 0; k < LANESUM_LANES; k++) h = checksum_mix(h, acc[k]);
    for (size_t i = 0; i < n % LANESUM_STRIPE; i++) h = checksum_mix(h, tail[i]);
    return checksum_mix(h, (uint64_t)n);
}

uint64_t lanesum64_scalar(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t acc[LANESUM_LANES], key[LANESUM_LANES];
    memcpy(acc, LANESUM_SEED, sizeof acc);
    memcpy(key, LANESUM_KEY, sizeof key);
    const size_t stripes = n / LANESUM_STRIPE;
    for (size_t s = 0; s < stripes; s++, p += LANESUM_STRIPE)
        for (int k = 0; k < LANESUM_LANES; k++) {
            uint64_t w;
            memcpy(&w, p + 8 * k, 8); /* little-endian: pi2 runs on x86-64 and AArch64 */
            const uint64_t x = w ^ key[k];
            acc[k] += (x & 0xffffffffu) * (x >> 32) + w;
            key[k] += LANESUM_STEP;
        }
    return lanesum_finish(acc, p, n);
}

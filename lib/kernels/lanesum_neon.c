/* lanesum64 with NEON: a stripe is four vectors of two lanes; the low and
 * high halves of x narrow into two 32-bit vectors that UMLAL multiplies
 * into the lanes (lanesum.h). */
#include <arm_neon.h>

#include "kernels/lanesum.h"

uint64_t lanesum64_neon(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64x2_t acc[4], key[4];
    for (int v = 0; v < 4; v++) {
        acc[v] = vld1q_u64(LANESUM_SEED + 2 * v);
        key[v] = vld1q_u64(LANESUM_KEY + 2 * v);
    }
    const uint64x2_t step = vdupq_n_u64(LANESUM_STEP);
    for (size_t s = 0; s < n / LANESUM_STRIPE; s++, p += LANESUM_STRIPE)
        for (int v = 0; v < 4; v++) {
            const uint64x2_t w = vreinterpretq_u64_u8(vld1q_u8(p + 16 * v));
            const uint64x2_t x = veorq_u64(w, key[v]);
            acc[v] = vmlal_u32(vaddq_u64(acc[v], w), vmovn_u64(x), vshrn_n_u64(x, 32));
            key[v] = vaddq_u64(key[v], step);
        }
    uint64_t lanes[LANESUM_LANES];
    for (int v = 0; v < 4; v++) vst1q_u64(lanes + 2 * v, acc[v]);
    return lanesum_finish(lanes, p, n);
}

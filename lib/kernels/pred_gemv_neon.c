/* NEON predictor gemv (pred_gemv.h): a row's 16 lanes as four 4-lane
 * vectors (lanes 0-3, 4-7, 8-11, 12-15), each a chain of FMLAs (fused, as
 * fmaf), in pred_gemv_drive.h's loops (2 rows per pass over x). */
#include <arm_neon.h>

#include "kernels/pred_gemv.h"

typedef struct {
    float32x4_t q[4]; /* lanes 4k .. 4k+3 */
} lanes16;

static inline lanes16 fma16(const uint16_t *w, const float *x, lanes16 a) {
    for (int k = 0; k < 4; k++)
        a.q[k] = vfmaq_f32(a.q[k], vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(w + 4 * k))), vld1q_f32(x + 4 * k));
    return a;
}

/* s8 = lanes 0-7 + lanes 8-15, s4 = its halves added, s2 = s4's halves
 * added, y = s2[0] + s2[1]: pred_gemv.h's order */
static inline float reduce16(lanes16 a) {
    const float32x4_t s8_lo = vaddq_f32(a.q[0], a.q[2]), s8_hi = vaddq_f32(a.q[1], a.q[3]);
    const float32x4_t s4 = vaddq_f32(s8_lo, s8_hi);
    const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
    return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}

static inline lanes16 zero16(void) {
    const float32x4_t z = vdupq_n_f32(0.0f);
    return (lanes16){{z, z, z, z}};
}

#include "kernels/pred_gemv_drive.h"

void pred_gemv_f16_neon(const void *w, size_t row_stride, int rows, const float *x, int n, float *y) {
    pred_gemv_f16_rows(w, row_stride, rows, x, n, y);
}

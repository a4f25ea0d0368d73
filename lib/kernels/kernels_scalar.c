/* Scalar reference kernels and the reference row conversions. These define the
 * semantics (ggml's quantize_row_*_ref and vec_dot); the SIMD files must agree.
 * Block scales are read with memcpy so a row at any address is defined behaviour. */
#include <math.h>
#include <string.h>

#include "gguf/f16.h"
#include "kernels/dot_f16_rows_tile.h"
#include "kernels/kernels.h"

static float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return f16_to_f32(h);
}

static void store_f16(void *p, float f) {
    uint16_t h = f32_to_f16(f);
    memcpy(p, &h, sizeof h);
}

float dot_f32_ref(const float *w, const float *x, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += w[i] * x[i];
    return sum;
}

static float dot_f16_scalar(const uint16_t *w, const uint16_t *x, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += f16_to_f32(w[i]) * f16_to_f32(x[i]);
    return sum;
}

static void dot_f16_rows_scalar(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, int n,
                                float *out) {
    for (int r = 0; r < rows; r++) out[r] = dot_f16_scalar(w + (size_t)r * row_stride, x, n);
}

static void dot_f16_rows_tile_scalar(const uint16_t *w, size_t row_stride, int rows, const uint16_t *x, size_t x_stride,
                                  int nx, int n, float *out, size_t out_stride, float *scratch) {
    (void)scratch;
    dot_f16_rows_tile_by_vector(dot_f16_rows_scalar, w, row_stride, rows, x, x_stride, nx, n, out, out_stride);
}

static float dot_q8_0_scalar(const block_q8_0 *w, const block_q8_0 *x, int n) {
    float sum = 0.0f;
    for (int b = 0; b < n / QK8_0; b++) {
        int32_t isum = 0;
        for (int j = 0; j < QK8_0; j++) isum += w[b].qs[j] * x[b].qs[j];
        sum += load_f16(&w[b].d) * load_f16(&x[b].d) * (float)isum;
    }
    return sum;
}

static float dot_q4_0_scalar(const block_q4_0 *w, const block_q8_0 *x, int n) {
    float sum = 0.0f;
    for (int b = 0; b < n / QK4_0; b++) {
        int32_t isum = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            isum += ((w[b].qs[j] & 0x0f) - 8) * x[b].qs[j];
            isum += ((w[b].qs[j] >> 4) - 8) * x[b].qs[j + QK4_0 / 2];
        }
        sum += load_f16(&w[b].d) * load_f16(&x[b].d) * (float)isum;
    }
    return sum;
}

static void gemv_q4_0_scalar(const block_q4_0 *w, size_t row_stride, const block_q8_0 *x, float *y, int nrows,
                             int n) {
    for (int r = 0; r < nrows; r++)
        y[r] = dot_q4_0_scalar((const block_q4_0 *)((const char *)w + (size_t)r * row_stride), x, n);
}

static void f32_to_f16_row_scalar(const float *x, uint16_t *y, int n) {
    for (int i = 0; i < n; i++) y[i] = f32_to_f16(x[i]);
}

static void axpy_f32_scalar(float *y, float a, const float *w, int n) {
    for (int i = 0; i < n; i++) y[i] += a * w[i];
}

double softmax_exp_ref(float *y, const float *x, float max, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) {
        y[i] = expf(x[i] - max);
        sum += y[i];
    }
    return sum;
}

void silu_mul_ref(float *h, const float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* Activations are quantized as ggml's quantize_row_q8_0 does on x86 (its SIMD
 * path, not the _ref one used for weights): multiplier 127/amax, round to even. */
static void quantize_q8_0_scalar(const float *x, block_q8_0 *y, int n) {
    for (int b = 0; b < n / QK8_0; b++) {
        const float *xb = x + b * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        store_f16(&y[b].d, amax / 127.0f);
        for (int j = 0; j < QK8_0; j++) y[b].qs[j] = (int8_t)nearbyintf(xb[j] * id);
    }
}

void quantize_row_q8_0_ref(const float *x, block_q8_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / QK8_0; b++) {
        const float *xb = x + b * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(&y[b].d, d);
        for (int j = 0; j < QK8_0; j++) y[b].qs[j] = (int8_t)roundf(xb[j] * id);
    }
}

void quantize_row_q4_0_ref(const float *x, block_q4_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / QK4_0; b++) {
        const float *xb = x + b * QK4_0;
        /* the signed value of largest magnitude maps to -8, so the full 4-bit range is used */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(&y[b].d, d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            int lo = (int8_t)(xb[j] * id + 8.5f), hi = (int8_t)(xb[j + QK4_0 / 2] * id + 8.5f);
            if (lo > 15) lo = 15;
            if (hi > 15) hi = 15;
            y[b].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = load_f16((const uint16_t *)src + i);
        break;
    case GGML_TYPE_Q8_0:
        for (int64_t b = 0; b < n / QK8_0; b++) {
            const block_q8_0 *blk = (const block_q8_0 *)src + b;
            const float d = load_f16(&blk->d);
            for (int j = 0; j < QK8_0; j++) dst[b * QK8_0 + j] = d * blk->qs[j];
        }
        break;
    case GGML_TYPE_Q4_0:
        for (int64_t b = 0; b < n / QK4_0; b++) {
            const block_q4_0 *blk = (const block_q4_0 *)src + b;
            const float d = load_f16(&blk->d);
            for (int j = 0; j < QK4_0 / 2; j++) {
                dst[b * QK4_0 + j] = d * ((blk->qs[j] & 0x0f) - 8);
                dst[b * QK4_0 + j + QK4_0 / 2] = d * ((blk->qs[j] >> 4) - 8);
            }
        }
        break;
    default: /* callers check ggml_type_supported(); nothing sensible to write */
        break;
    }
}

void quantize_row(uint32_t type, const float *src, void *dst, int64_t n) {
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) store_f16((uint16_t *)dst + i, src[i]);
        break;
    case GGML_TYPE_Q8_0:
        quantize_row_q8_0_ref(src, dst, n);
        break;
    case GGML_TYPE_Q4_0:
        quantize_row_q4_0_ref(src, dst, n);
        break;
    default:
        break;
    }
}

const kernels kernels_scalar_impl = {
    .name = "scalar",
    .dot_f32 = dot_f32_ref,
    .dot_f16 = dot_f16_scalar,
    .dot_f16_rows = dot_f16_rows_scalar,
    .dot_f16_rows_tile = dot_f16_rows_tile_scalar,
    .dot_q8_0 = dot_q8_0_scalar,
    .dot_q4_0 = dot_q4_0_scalar,
    .quantize_q8_0 = quantize_q8_0_scalar,
    .f32_to_f16_row = f32_to_f16_row_scalar,
    .axpy_f32 = axpy_f32_scalar,
    .gemv_q4_0 = gemv_q4_0_scalar,
    .gemm_q4_0 = gemm_q4_0_ref,
    .gemm_f32 = gemm_f32_ref,
    .gemm_f16 = gemm_f16_ref,
    .softmax_exp = softmax_exp_ref,
    .silu_mul = silu_mul_ref,
    .sparse = &sparse_scalar_impl,
    .gather = &sparse_scalar_impl,
    .pred_gemv_f16 = pred_gemv_f16_scalar,
    .lanesum64 = lanesum64_scalar,
};

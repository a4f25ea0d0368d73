/* kernel-bench: weight bandwidth of the dot-product kernels, one thread.
 * For each ISA and weight type it dots every row of a matrix with one
 * activation vector and reports GB/s of weight bytes streamed, once for a
 * matrix that fits in L2 (compute bound) and once for one far larger than
 * the caches (memory bound), and the gemvs from memory against the read
 * timed in turns (the share of the read a gemv keeps). Then the same for the predictor gemv
 * (pred_gemv.h, F16 and Q8_0 rows) on the predictors' two shapes, and decode attention's K . q
 * scores read head by head against position by position. Last, the
 * machine's int8 multiply-add peak (mac_peak.h) on one thread and on every
 * CPU at once: the limit the quantized matrix products are judged against;
 * and the prefill product (gemm.h) of each set against it; then the F32 FMA
 * peak likewise, and the float products (F16, F32) against it. */
#include <getopt.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/checksum.h"
#include "util/clock.h"
#include "util/compare_double.h"
#include "gguf/f16.h"
#include "engine/ops.h"
#include "kernels/kernels.h"
#include "util/log.h"
#include "util/mem_bandwidth.h"
#include "util/threadpool.h"
#include "kernels/pred_gemv.h"
#include "util/huge_alloc.h"
#include "kernels/mac_peak.h"

typedef struct {
    const char *name;
    size_t row_bytes;       /* bytes of one weight row of n elements */
} weight_kind;

/* the gemv kinds time gemv_q4_0 / gemv_q8_0 (all rows in one call; a set
 * without gemv_q8_0 dots row by row, as ops.c does) */
enum { KIND_F32, KIND_F16, KIND_Q8_0, KIND_Q4_0, KIND_Q8_0_GEMV, KIND_Q4_0_GEMV, KIND_COUNT };

static volatile float sink; /* keeps the dot products from being optimised away */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static float rng_float(void) { return (float)(rng_next() >> 40) / (float)(1u << 24) * 2.0f - 1.0f; }

/* random but valid weights: blocks get small scales, floats stay in [-1, 1) */
static void fill_weights(int kind, uint8_t *dst, size_t bytes, size_t row_bytes, int n) {
    for (size_t off = 0; off < bytes; off += row_bytes) {
        uint8_t *row = dst + off;
        switch (kind) {
        case KIND_F32:
            for (int i = 0; i < n; i++) ((float *)row)[i] = rng_float();
            break;
        case KIND_F16:
            for (int i = 0; i < n; i++) ((uint16_t *)row)[i] = f32_to_f16(rng_float());
            break;
        case KIND_Q8_0:
        case KIND_Q4_0:
        case KIND_Q8_0_GEMV:
        case KIND_Q4_0_GEMV: {
            const size_t block_bytes =
                kind == KIND_Q8_0 || kind == KIND_Q8_0_GEMV ? sizeof(block_q8_0) : sizeof(block_q4_0);
            for (size_t i = 0; i < row_bytes; i++) row[i] = (uint8_t)rng_next();
            const uint16_t d = f32_to_f16(0.01f);
            for (size_t b = 0; b < row_bytes / block_bytes; b++) memcpy(row + b * block_bytes, &d, sizeof d);
            break;
        }
        }
    }
}

static float *gemv_out; /* one float per row of the largest matrix */

#define MAX_SETS 8 /* kernel sets one run times */

/* The sets a kernel is timed in: those asked for, and for the Q4_0 gemv
 * (q4_gemv) avx512 with the other prefetch beside avx512 (kernels.h), so one
 * run shows which prefetch suits this CPU. out: 2 * MAX_SETS. Returns how many. */
static int sets_to_time(const kernels *const *isas, int n_isas, bool q4_gemv, const kernels **out) {
    int n = 0;
    for (int i = 0; i < n_isas; i++) {
        out[n++] = isas[i];
        if (q4_gemv && isas[i] && isas[i] == kernels_avx512()) out[n++] = kernels_avx512_other_prefetch();
    }
    return n;
}

/* a set's name in the tables; avx512 with the other prefetch is "avx512-alt" */
static const char *set_label(const kernels *k) {
    return k == kernels_avx512_other_prefetch() ? "avx512-alt" : k->name;
}

/* one pass: every row dotted with the activation converted for its type */
static void dot_all_rows(const kernels *k, int kind, const uint8_t *w, size_t rows, size_t row_bytes,
                         const float *x32, const uint16_t *x16, const block_q8_0 *x8, int n) {
    float acc = 0.0f;
    if (kind == KIND_Q4_0_GEMV || (kind == KIND_Q8_0_GEMV && k->gemv_q8_0)) {
        if (kind == KIND_Q4_0_GEMV) k->gemv_q4_0((const block_q4_0 *)w, row_bytes, x8, gemv_out, (int)rows, n);
        else k->gemv_q8_0((const block_q8_0 *)w, row_bytes, x8, gemv_out, (int)rows, n);
        sink = gemv_out[rows - 1];
        return;
    }
    for (size_t r = 0; r < rows; r++) {
        const void *row = w + r * row_bytes;
        switch (kind) {
        case KIND_F32: acc += k->dot_f32(row, x32, n); break;
        case KIND_F16: acc += k->dot_f16(row, x16, n); break;
        case KIND_Q8_0:
        case KIND_Q8_0_GEMV: acc += k->dot_q8_0(row, x8, n); break;
        case KIND_Q4_0: acc += k->dot_q4_0(row, x8, n); break;
        }
    }
    sink = acc;
}

/* GB/s of weight bytes in the fastest of the passes run during min_seconds
 * (at least 3): the fastest pass is the one least disturbed by other work on
 * the machine */
static double measure(const kernels *k, int kind, const uint8_t *w, size_t rows, size_t row_bytes,
                      const float *x32, const uint16_t *x16, const block_q8_0 *x8, int n, double min_seconds) {
    dot_all_rows(k, kind, w, rows, row_bytes, x32, x16, x8, n); /* warm-up */
    double best = 1e30;
    const double start = clock_seconds();
    for (int pass = 0; pass < 3 || clock_seconds() - start < min_seconds; pass++) {
        const double t0 = clock_seconds();
        dot_all_rows(k, kind, w, rows, row_bytes, x32, x16, x8, n);
        const double t = clock_seconds() - t0;
        if (t < best) best = t;
    }
    return (double)rows * (double)row_bytes / best / 1e9;
}

/* A predictor gemv and its input: F16 rows against F32 x, or Q8_0 rows against Q8_0 x. */
typedef struct {
    const char *isa;
    pred_gemv_f16_fn f16;
    pred_gemv_q8_0_fn q8_0;
} pred_kernel;

static void pred_call(const pred_kernel *pk, const uint8_t *w, size_t row_stride, int rows, const void *x, int n,
                      float *y) {
    if (pk->f16) pk->f16(w, row_stride, rows, x, n, y);
    else pk->q8_0(w, row_stride, rows, x, n, y);
}

/* the predictor gemv on one shape: GB/s of weights in the fastest pass over
 * `bytes` of w, one call per rows * row_stride bytes */
static double measure_pred_gemv(const pred_kernel *pk, const uint8_t *w, size_t bytes, int rows, size_t row_stride,
                                const void *x, int n, float *y, double min_seconds) {
    const size_t call_bytes = (size_t)rows * row_stride, calls = bytes / call_bytes ? bytes / call_bytes : 1;
    pred_call(pk, w, row_stride, rows, x, n, y); /* warm-up */
    double best = 1e30;
    const double start = clock_seconds();
    for (int pass = 0; pass < 3 || clock_seconds() - start < min_seconds; pass++) {
        const double t0 = clock_seconds();
        for (size_t c = 0; c < calls; c++) pred_call(pk, w + c * call_bytes, row_stride, rows, x, n, y);
        const double t = clock_seconds() - t0;
        if (t < best) best = t;
    }
    sink = y[rows - 1];
    return (double)(calls * call_bytes) / best / 1e9;
}

static size_t pred_row_bytes(int kind, int n) {
    return kind == KIND_F16 ? (size_t)n * sizeof(uint16_t) : (size_t)n / QK8_0 * sizeof(block_q8_0);
}

/* the predictors' first stage (rank rows of the hidden size) and second
 * stage (many rows of the rank): F16 rows, and Q8_0 rows where their pass
 * kernel runs (PWRI predictors run in Q8_0 there) */
static void bench_pred_gemv(uint8_t *w, size_t big_bytes, size_t cache_bytes, double min_seconds) {
    enum { HIDDEN = 4096, RANK = 128 };
    const struct {
        const char *name;
        int rows, n;
    } shapes[] = {{"stage 1", RANK, HIDDEN}, {"stage 2", 512, RANK}};
    static float x[HIDDEN], y[512];
    static block_q8_0 x8[HIDDEN / QK8_0];
    for (int i = 0; i < HIDDEN; i++) x[i] = rng_float();
    kernels_scalar()->quantize_q8_0(x, x8, HIDDEN);
    /* the sets whose gemvs differ (avx512-exact and amx have avx512's) */
    const kernels *sets[] = {kernels_avx2(), kernels_avx512(), kernels_neon()};
    const int kinds[] = {KIND_F16, KIND_Q8_0};
    printf("\npredictor gemv (rows contiguous; scalar: too slow to stream)\n%-22s %-7s %-12s %12s %14s\n", "shape",
           "type", "isa", "cache GB/s", "memory GB/s");
    int filled = -1;
    for (size_t t = 0; t < sizeof kinds / sizeof *kinds; t++) {
        const bool f16 = kinds[t] == KIND_F16;
        for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
            if (!sets[i]) continue;
            const pred_kernel kernel = {sets[i]->name, f16 ? sets[i]->pred_gemv_f16 : NULL,
                                        f16 ? NULL : sets[i]->pred_gemv_q8_0};
            if (!kernel.f16 && !kernel.q8_0) continue;
            if (filled != kinds[t]) {
                const size_t big_row = pred_row_bytes(kinds[t], HIDDEN);
                fill_weights(kinds[t], w, big_bytes / big_row * big_row, big_row, HIDDEN);
                filled = kinds[t];
            }
            for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
                char name[32];
                snprintf(name, sizeof name, "%s %dx%d", shapes[s].name, shapes[s].rows, shapes[s].n);
                const size_t stride = pred_row_bytes(kinds[t], shapes[s].n);
                const void *in = f16 ? (const void *)x : (const void *)x8;
                const double in_cache =
                    measure_pred_gemv(&kernel, w, cache_bytes, shapes[s].rows, stride, in, shapes[s].n, y, min_seconds);
                const double in_memory =
                    measure_pred_gemv(&kernel, w, big_bytes, shapes[s].rows, stride, in, shapes[s].n, y, min_seconds);
                printf("%-22s %-7s %-12s %12.2f %14.2f\n", name, f16 ? "f16" : "q8_0", kernel.isa, in_cache, in_memory);
                fflush(stdout);
            }
        }
    }
}

/* GB/s of the fastest pass of `sum` over [w, w + bytes) in 8 KiB pieces (a bundle each). */
static double measure_sum(lanesum_fn sum, const uint8_t *w, size_t bytes, double min_seconds) {
    enum { PIECE = 8192 };
    double best = 1e30, spent = 0;
    uint64_t acc = 0;
    do {
        const double t0 = clock_seconds();
        for (size_t at = 0; at + PIECE <= bytes; at += PIECE) acc += sum(w + at, PIECE);
        const double t = clock_seconds() - t0;
        best = t < best ? t : best;
        spent += t;
    } while (spent < min_seconds);
    sink = (float)acc;
    return (double)(bytes / PIECE * PIECE) / best / 1e9;
}

/* The bundle checksum the io-worker runs on every read (kernels/lanesum.h),
 * beside util/checksum.h's checksum64 that bundle files had before it; each
 * version once (avx512-exact and amx have avx512's). */
static void bench_bundle_sum(const kernels *const *isas, int n_isas, const uint8_t *w, size_t big_bytes,
                             size_t cache_bytes, double min_seconds) {
    printf("\nbundle checksum, 8 KiB pieces\n%-22s %-12s %12s %14s\n", "sum", "isa", "cache GB/s", "memory GB/s");
    printf("%-22s %-12s %12.2f %14.2f\n", "checksum64", "scalar", measure_sum(checksum64, w, cache_bytes, min_seconds),
           measure_sum(checksum64, w, big_bytes, min_seconds));
    for (int i = 0; i < n_isas; i++) {
        bool seen = !isas[i];
        for (int j = 0; j < i && !seen; j++) seen = isas[j] && isas[j]->lanesum64 == isas[i]->lanesum64;
        if (!seen)
            printf("%-22s %-12s %12.2f %14.2f\n", "lanesum64", isas[i]->name,
                   measure_sum(isas[i]->lanesum64, w, cache_bytes, min_seconds),
                   measure_sum(isas[i]->lanesum64, w, big_bytes, min_seconds));
    }
    fflush(stdout);
}

/* Decode attention's K . q scores on a 7B layer: 32 heads of 128, the keys
 * of a position one row of kv_dim F16 values (the stack's KV layout). */
enum { ATT_HEADS = 32, ATT_HEAD_DIM = 128, ATT_KV_DIM = ATT_HEADS * ATT_HEAD_DIM };

/* How the scores are read: head by head (each head's keys are head_dim
 * values every kv_dim) or position by position (each position's keys of all
 * heads are one contiguous row; what attention runs). */
enum { BY_HEAD, BY_POSITION, SCORE_ORDERS };

/* All heads' scores over positions [0, T) of one layer's keys, in `order`. */
static void attention_scores(const kernels *k, int order, const uint16_t *keys, const uint16_t *q, int T,
                             float *scores) {
    const int outer = order == BY_HEAD ? ATT_HEADS : T, inner = order == BY_HEAD ? T : ATT_HEADS;
    for (int i = 0; i < outer; i++)
        for (int j = 0; j < inner; j++) {
            const int h = order == BY_HEAD ? i : j, t = order == BY_HEAD ? j : i;
            scores[(size_t)h * T + t] =
                k->dot_f16(keys + (size_t)t * ATT_KV_DIM + h * ATT_HEAD_DIM, q + h * ATT_HEAD_DIM, ATT_HEAD_DIM);
        }
    sink = scores[(size_t)ATT_HEADS * T - 1];
}

/* microseconds per layer of the fastest pass over n_layers layers' keys
 * (enough of them that they come from memory, as in decode) */
static double measure_scores(const kernels *k, int order, const uint16_t *keys, int n_layers, const uint16_t *q,
                             int T, float *scores, double min_seconds) {
    const size_t layer = (size_t)T * ATT_KV_DIM;
    double best = 1e30;
    const double start = clock_seconds();
    for (int pass = 0; pass < 4 || clock_seconds() - start < min_seconds; pass++) {
        const double t0 = clock_seconds();
        for (int l = 0; l < n_layers; l++) attention_scores(k, order, keys + (size_t)l * layer, q, T, scores);
        const double t = clock_seconds() - t0;
        if (pass > 0 && t < best) best = t; /* pass 0: warm-up */
    }
    return best * 1e6 / n_layers;
}

static void bench_attention(const kernels *const *isas, int n_isas, uint8_t *w, size_t big_bytes,
                            double min_seconds) {
    const int lengths[] = {64, 256, 1024, 2048};
    static uint16_t q[ATT_KV_DIM];
    static float scores[ATT_HEADS * 2048];
    for (int i = 0; i < ATT_KV_DIM; i++) q[i] = f32_to_f16(rng_float());
    printf("\ndecode attention's K . q scores, 7B layer (%d heads of %d), us per layer, keys from memory\n"
           "%-10s %-12s %13s %12s %8s\n",
           ATT_HEADS, ATT_HEAD_DIM, "positions", "isa", "head by head", "by position", "ratio");
    for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++) {
        const size_t layer_bytes = (size_t)lengths[l] * ATT_KV_DIM * 2;
        const int n_layers = (int)(big_bytes / layer_bytes);
        if (n_layers < 1) continue;
        fill_weights(KIND_F16, w, (size_t)n_layers * layer_bytes, ATT_KV_DIM * 2, ATT_KV_DIM);
        for (int i = 0; i < n_isas; i++) {
            if (!isas[i] || isas[i] == kernels_scalar()) continue; /* too slow to stream */
            double us[SCORE_ORDERS];
            for (int order = 0; order < SCORE_ORDERS; order++)
                us[order] = measure_scores(isas[i], order, (const uint16_t *)w, n_layers, q, lengths[l], scores,
                                           min_seconds);
            printf("%-10d %-12s %13.1f %12.1f %8.2f\n", lengths[l], isas[i]->name, us[BY_HEAD], us[BY_POSITION],
                   us[BY_HEAD] / us[BY_POSITION]);
            fflush(stdout);
        }
    }
}

typedef struct {
    double (*peak)(double seconds, const char **isa);
    double seconds, macs;
    const char *isa;
} peak_job;

static void *peak_thread(void *arg) {
    peak_job *j = arg;
    j->macs = j->peak(j->seconds, &j->isa);
    return NULL;
}

/* GMAC/s of multiply-adds (int8_peak_macs or f32_peak_macs) on 1 thread, then
 * on n_threads at once (their sum); returns the 1-thread figure (per second). */
static double bench_peak(double (*peak)(double, const char **), const char *what, int n_threads, double seconds) {
    peak_job one = {peak, seconds, 0, NULL}, all[64];
    peak_thread(&one);
    if (n_threads > 64) n_threads = 64;
    pthread_t tid[64];
    int started = 0;
    for (int i = 0; i < n_threads; i++) {
        all[i] = (peak_job){peak, seconds, 0, NULL};
        if (pthread_create(&tid[i], NULL, peak_thread, &all[i])) break;
        started++;
    }
    double sum = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
        sum += all[i].macs;
    }
    printf("\n%s multiply-add peak (%s, no memory traffic): 1 thread %.1f GMAC/s, %d threads %.1f GMAC/s\n", what,
           one.isa, one.macs / 1e9, started, sum / 1e9);
    return one.macs;
}

/* The prefill product (gemm.h) on one thread: a 7B layer's gate matrix (11008
 * rows of 4096 Q4_0 columns, 24 MiB: read from memory once per call) times
 * 128 and 512 tokens, in GMAC/s and as a share of the 1-thread int8 peak
 * (AMX's tiles are not in that peak: they can pass it). */
static void bench_gemm(const kernels *const *isas, int n_isas, uint8_t *w, size_t big_bytes, double seconds,
                       double peak) {
    const int rows = 11008, n = 4096, nb = n / QK4_0, token_counts[] = {128, 512};
    const size_t row_bytes = (size_t)nb * sizeof(block_q4_0);
    if ((size_t)rows * row_bytes > big_bytes) return;
    fill_weights(KIND_Q4_0, w, (size_t)rows * row_bytes, row_bytes, n);
    float *x = malloc(sizeof(float) * (size_t)n);
    block_q8_0 *x8 = malloc(sizeof(block_q8_0) * (size_t)nb * 512);
    const block_q8_0 **xs = malloc(sizeof *xs * 512);
    float *y = malloc(sizeof(float) * (size_t)rows * 512);
    void *scratch = aligned_alloc(64, (gemm_scratch_bytes(nb) + 63) / 64 * 64);
    gemm_acts acts;
    if (!x || !x8 || !xs || !y || !scratch || gemm_acts_init(&acts, 512, n)) {
        log_error("out of memory for the GEMM table");
        exit(1);
    }
    for (int t = 0; t < 512; t++) {
        for (int i = 0; i < n; i++) x[i] = rng_float();
        quantize_row(GGML_TYPE_Q8_0, x, x8 + (size_t)t * nb, n);
        xs[t] = x8 + (size_t)t * nb;
    }
    printf("\nprefill product (gemm_q4_0), %d x %d Q4_0 weights, 1 thread\n", rows, n);
    printf("%-12s %8s %12s %10s\n", "isa", "tokens", "GMAC/s", "of peak");
    for (int i = 0; i < n_isas; i++) {
        if (!isas[i] || !isas[i]->gemm_q4_0 || isas[i]->gemm_q4_0 == gemm_q4_0_ref) continue;
        for (size_t c = 0; c < sizeof token_counts / sizeof *token_counts; c++) {
            const int n_tok = token_counts[c];
            gemm_acts_pack(&acts, xs, n_tok, n);
            long calls = 0;
            const uint64_t t0 = clock_us();
            uint64_t took;
            do {
                isas[i]->gemm_q4_0((const block_q4_0 *)w, row_bytes, rows, &acts, y, (size_t)rows, scratch);
                calls++;
                took = clock_us() - t0;
            } while (took < seconds * 1e6);
            sink = y[rows - 1];
            const double macs = (double)calls * rows * (double)n * n_tok / (took / 1e6);
            printf("%-12s %8d %12.1f %9.0f%%\n", isas[i]->name, n_tok, macs / 1e9, peak > 0 ? 100 * macs / peak : 0);
            fflush(stdout);
        }
    }
    gemm_acts_free(&acts);
    free(scratch), free(y), free(xs), free(x8), free(x);
}

/* The float product (gemm.h) on one thread: the same 7B gate shape in F16 and
 * F32 times 128 tokens, in GMAC/s and as a share of the 1-thread F32 FMA
 * peak, beside what the prompt pass did before it: decode's dot per (row,
 * token), rows in 256 KiB tiles each dotted with every token. */
static void bench_gemm_float(const kernels *const *isas, int n_isas, uint8_t *w, size_t big_bytes, double seconds,
                             double peak) {
    const int rows = 11008, n = 4096, n_tok = 128;
    float *x32 = malloc(sizeof(float) * (size_t)n * n_tok), *y = malloc(sizeof(float) * (size_t)rows * n_tok);
    uint16_t *x16 = malloc(sizeof(uint16_t) * (size_t)n * n_tok);
    const float **xs32 = malloc(sizeof *xs32 * n_tok);
    const uint16_t **xs16 = malloc(sizeof *xs16 * n_tok);
    void *scratch = aligned_alloc(64, (gemm_float_scratch_bytes(n) + 63) / 64 * 64);
    if (!x32 || !y || !x16 || !xs32 || !xs16 || !scratch) {
        log_error("out of memory for the float GEMM table");
        exit(1);
    }
    for (int i = 0; i < n * n_tok; i++) x32[i] = rng_float();
    quantize_row(GGML_TYPE_F16, x32, x16, (int64_t)n * n_tok);
    for (int t = 0; t < n_tok; t++) xs32[t] = x32 + (size_t)t * n, xs16[t] = x16 + (size_t)t * n;
    printf("\nprefill product of float weights (gemm_f16, gemm_f32), %d x %d, %d tokens, 1 thread\n", rows, n, n_tok);
    printf("%-6s %-12s %-12s %10s %10s\n", "type", "isa", "path", "GMAC/s", "of peak");
    for (int f16 = 1; f16 >= 0; f16--) {
        const size_t row_bytes = (size_t)n * (f16 ? 2 : 4);
        if ((size_t)rows * row_bytes > big_bytes) continue;
        fill_weights(f16 ? KIND_F16 : KIND_F32, w, (size_t)rows * row_bytes, row_bytes, n);
        for (int i = 0; i < n_isas; i++) {
            const kernels *k = isas[i];
            if (!k || k == kernels_scalar()) continue; /* too slow to stream */
            for (int per_token = 0; per_token < 2; per_token++) {
                long calls = 0;
                const uint64_t t0 = clock_us();
                uint64_t took;
                do {
                    if (!per_token && f16) k->gemm_f16((const uint16_t *)w, row_bytes, rows, xs16, n_tok, n, y, rows, scratch);
                    else if (!per_token) k->gemm_f32((const float *)w, row_bytes, rows, xs32, n_tok, n, y, rows, scratch);
                    else {
                        const int tile = (int)((256u << 10) / row_bytes);
                        for (int r0 = 0; r0 < rows; r0 += tile)
                            for (int t = 0; t < n_tok; t++)
                                for (int r = r0; r < r0 + tile && r < rows; r++)
                                    y[(size_t)t * rows + r] =
                                        f16 ? k->dot_f16((const uint16_t *)(w + (size_t)r * row_bytes), xs16[t], n)
                                            : k->dot_f32((const float *)(w + (size_t)r * row_bytes), xs32[t], n);
                    }
                    calls++;
                    took = clock_us() - t0;
                } while (took < seconds * 1e6);
                sink = y[rows - 1];
                const double macs = (double)calls * rows * (double)n * n_tok / (took / 1e6);
                printf("%-6s %-12s %-12s %10.1f %9.0f%%\n", f16 ? "f16" : "f32", k->name,
                       per_token ? "decode dots" : "gemm", macs / 1e9, peak > 0 ? 100 * macs / peak : 0);
                fflush(stdout);
            }
        }
    }
    free(scratch), free(xs16), free(xs32), free(x16), free(y), free(x32);
}

/* A gemv on every thread at once, as the stack's cpu-workers run a layer:
 * the matrix in groups of GEMV_GROUP_ROWS rows (a 7B projection), each
 * group's rows split between the threads, one pool job (and its barrier) a
 * group. GB/s of weight bytes in the fastest and the median pass, the
 * median against the memory's read rate on all threads: what one thread's figure above does not show, the kernels
 * sharing the memory bus. */
#define GEMV_GROUP_ROWS 4096
#define MAX_PASSES 64

typedef struct {
    const kernels *k;
    weight w; /* the group */
    act_vec in;
} gemv_job;

/* the thread's rows of the group, as the stack's cpu-workers run theirs */
static void gemv_share(void *ctx, int ith, int nth) {
    const gemv_job *j = ctx;
    long r0, r1;
    pool_split(j->w.rows, ith, nth, &r0, &r1);
    matvec_rows(j->k, &j->w, &j->in, gemv_out, r0, r1);
}

/* bytes of a row of n weights in Q4_0 (q4) or Q8_0 */
static size_t gemv_row_bytes(bool q4, int n) {
    return (size_t)n / QK8_0 * (q4 ? sizeof(block_q4_0) : sizeof(block_q8_0));
}

static void bench_gemv_threads(const kernels *const *isas, int n_isas, uint8_t *w, size_t bytes, const block_q8_0 *x8,
                               int n, threadpool *pool, double all_gbs, double min_seconds) {
    printf("\ngemv on %d threads at once, groups of %d rows split between them, from memory\n", pool_size(pool),
           GEMV_GROUP_ROWS);
    printf("%-9s %-12s %12s %12s %10s\n", "type", "isa", "best GB/s", "median GB/s", "of read");
    for (int q4 = 1; q4 >= 0; q4--) {
        const kernels *sets[2 * MAX_SETS];
        const int n_sets = sets_to_time(isas, n_isas, q4, sets);
        const size_t row_bytes = gemv_row_bytes(q4, n);
        const size_t rows = bytes / row_bytes / GEMV_GROUP_ROWS * GEMV_GROUP_ROWS;
        if (rows == 0) return;
        fill_weights(q4 ? KIND_Q4_0 : KIND_Q8_0, w, rows * row_bytes, row_bytes, n);
        for (int i = 0; i < n_sets; i++) {
            if (!sets[i] || sets[i] == kernels_scalar()) continue;
            double t[MAX_PASSES];
            int passes = 0;
            const double start = clock_seconds();
            while (passes < MAX_PASSES && (passes < 5 || clock_seconds() - start < min_seconds)) {
                const double t0 = clock_seconds();
                for (size_t g = 0; g < rows; g += GEMV_GROUP_ROWS) {
                    gemv_job j = {sets[i],
                                  {w + g * row_bytes, q4 ? GGML_TYPE_Q4_0 : GGML_TYPE_Q8_0, GEMV_GROUP_ROWS, n, row_bytes},
                                  {.q8 = (block_q8_0 *)x8}};
                    pool_run(pool, gemv_share, &j);
                }
                t[passes++] = clock_seconds() - t0;
            }
            qsort(t, (size_t)passes, sizeof *t, compare_double);
            const double best = (double)(rows * row_bytes) / t[0] / 1e9;
            const double median = (double)(rows * row_bytes) / t[passes / 2] / 1e9;
            printf("%-9s %-12s %12.2f %12.2f %9.0f%%\n", q4 ? "q4_0" : "q8_0", set_label(sets[i]), best, median,
                   all_gbs > 0 ? 100 * median / all_gbs : 0);
            fflush(stdout);
        }
    }
}

#define SHARE_ROUNDS 9

/* One thread's gemv from memory as a share of one thread's read of the same
 * buffer, the two timed in turns (read, gemv, read, gemv ...) and the median
 * round's ratio kept: the host's memory rate moves within seconds, so a read
 * timed at start-up against a gemv timed a minute later compares two
 * different machines (the same Zen 5 gave 66 % and 78 % that way). */
static void bench_gemv_share(const kernels *const *isas, int n_isas, uint8_t *w, size_t bytes, const block_q8_0 *x8,
                             int n) {
    printf("\ngemv against the read, one thread, from memory, timed in turns (%d rounds)\n", SHARE_ROUNDS);
    printf("%-9s %-12s %12s %12s %14s\n", "type", "isa", "read GB/s", "gemv GB/s", "of read");
    for (int q4 = 1; q4 >= 0; q4--) {
        const int kind = q4 ? KIND_Q4_0_GEMV : KIND_Q8_0_GEMV;
        const kernels *sets[2 * MAX_SETS];
        const int n_sets = sets_to_time(isas, n_isas, q4, sets);
        const size_t row_bytes = gemv_row_bytes(q4, n), rows = bytes / row_bytes;
        if (rows == 0) return;
        fill_weights(kind, w, rows * row_bytes, row_bytes, n);
        for (int i = 0; i < n_sets; i++) {
            if (!sets[i] || sets[i] == kernels_scalar() || (!q4 && !sets[i]->gemv_q8_0)) continue;
            double read[SHARE_ROUNDS], gemv[SHARE_ROUNDS], share[SHARE_ROUNDS];
            for (int r = 0; r < SHARE_ROUNDS; r++) {
                read[r] = mem_read_rate(w, rows * row_bytes, NULL, 0) / 1e9;
                gemv[r] = measure(sets[i], kind, w, rows, row_bytes, NULL, NULL, x8, n, 0);
                share[r] = gemv[r] / read[r];
            }
            qsort(read, SHARE_ROUNDS, sizeof *read, compare_double);
            qsort(gemv, SHARE_ROUNDS, sizeof *gemv, compare_double);
            qsort(share, SHARE_ROUNDS, sizeof *share, compare_double);
            printf("%-9s %-12s %12.2f %12.2f %5.0f%% (%.0f-%.0f)\n", q4 ? "q4_0" : "q8_0", set_label(sets[i]),
                   read[SHARE_ROUNDS / 2], gemv[SHARE_ROUNDS / 2], 100 * share[SHARE_ROUNDS / 2], 100 * share[0],
                   100 * share[SHARE_ROUNDS - 1]);
            fflush(stdout);
        }
    }
}

static void usage(FILE *out, const char *prog) {
    fprintf(out,
            "usage: %s [-n COLS] [-c KIB] [-m MIB] [-s SECONDS] [-k SETS] [-b]\n"
            "  GB/s of weight bytes streamed by each dot kernel (one thread), after the memory's\n"
            "  read bandwidth (one thread and all) as the ceiling they are measured against.\n"
            "  -n COLS     row length, a multiple of 32 (default 4096)\n"
            "  -c KIB      in-cache matrix size (default 512 KiB, fits in L2)\n"
            "  -m MIB      out-of-cache matrix size (default 512 MiB, far above L3)\n"
            "  -s SECONDS  minimum time per measurement (default 0.5)\n"
            "  -k SETS     kernel sets to time, comma-separated (default: every set this\n"
            "              CPU runs of scalar,avx2,avx512,avx512-exact,amx)\n"
            "  -b          the memory's read bandwidth only\n",
            prog);
}

static long parse_positive(const char *s, const char *what) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v <= 0) {
        log_error("%s must be a positive integer, got '%s'", what, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    int n = 4096;
    long cache_kib = 512, big_mib = 512;
    double min_seconds = 0.5;
    char *set_names = NULL;
    bool bandwidth_only = false;
    int opt;
    while ((opt = getopt(argc, argv, "n:c:m:s:k:bh")) != -1) {
        switch (opt) {
        case 'n': n = (int)parse_positive(optarg, "-n"); break;
        case 'c': cache_kib = parse_positive(optarg, "-c"); break;
        case 'm': big_mib = parse_positive(optarg, "-m"); break;
        case 's': min_seconds = atof(optarg); break;
        case 'k': set_names = optarg; break;
        case 'b': bandwidth_only = true; break;
        case 'h': usage(stdout, argv[0]); return 0;
        default: usage(stderr, argv[0]); return 2;
        }
    }
    if (n % QK8_0 != 0 || n > (1 << 24)) {
        log_error("-n %d: must be a multiple of %d and at most 2^24", n, QK8_0);
        return 2;
    }
    const weight_kind kinds[KIND_COUNT] = {
        {"f32", (size_t)n * 4},
        {"f16", (size_t)n * 2},
        {"q8_0", (size_t)n / QK8_0 * sizeof(block_q8_0)},
        {"q4_0", (size_t)n / QK4_0 * sizeof(block_q4_0)},
        {"q8_0 gemv", (size_t)n / QK8_0 * sizeof(block_q8_0)},
        {"q4_0 gemv", (size_t)n / QK4_0 * sizeof(block_q4_0)},
    };
    const kernels *isas[MAX_SETS];
    int n_isas = 0;
    if (!set_names) {
        const kernels *all[] = {kernels_scalar(), kernels_avx2(), kernels_avx512(), kernels_avx512_exact(), kernels_amx(),
                                kernels_neon()};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) isas[n_isas++] = all[i];
    } else {
        for (char *save = NULL, *name = strtok_r(set_names, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
            const kernels *k = kernels_by_name(name);
            if (!k) {
                log_error("-k %s: not a kernel set this CPU runs (scalar, avx2, avx512, avx512-exact, amx, neon)", name);
                return 2;
            }
            if (n_isas == (int)(sizeof isas / sizeof *isas)) {
                log_error("-k: at most %d sets", n_isas);
                return 2;
            }
            isas[n_isas++] = k;
        }
    }

    float *x32 = malloc((size_t)n * sizeof *x32);
    uint16_t *x16 = malloc((size_t)n * sizeof *x16);
    block_q8_0 *x8 = malloc((size_t)n / QK8_0 * sizeof *x8);
    const size_t big_bytes = (size_t)big_mib << 20;
    size_t w_mapped = 0; /* on 2 MiB pages, as the stack's weights */
    uint8_t *w = huge_alloc(big_bytes + kinds[KIND_F32].row_bytes, &w_mapped);
    gemv_out = malloc(big_bytes / kinds[KIND_Q4_0].row_bytes * sizeof *gemv_out + sizeof *gemv_out);
    if (!x32 || !x16 || !x8 || !w || !gemv_out) {
        log_error("out of memory for a %ld MiB matrix", big_mib);
        return 1;
    }
    const int n_cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    memset(w, 1, big_bytes); /* every page backed before it is timed */
    threadpool *pool = pool_new(n_cpus);
    const double one_gbs = mem_read_rate(w, big_bytes, NULL, min_seconds) / 1e9;
    const double all_gbs = pool ? mem_read_rate(w, big_bytes, pool, min_seconds) / 1e9 : 0;
    printf("memory read: %.2f GB/s one thread, %.2f GB/s %d threads (%ld MiB)\n", one_gbs, all_gbs, n_cpus, big_mib);
    if (bandwidth_only) goto out;
    for (int i = 0; i < n; i++) x32[i] = rng_float();
    quantize_row(GGML_TYPE_F16, x32, x16, n);
    quantize_row(GGML_TYPE_Q8_0, x32, x8, n);

    printf("row length %d, in-cache matrix %ld KiB, out-of-cache matrix %ld MiB, 1 thread\n", n, cache_kib, big_mib);
    printf("%-9s %-12s %12s %14s\n", "type", "isa", "cache GB/s", "memory GB/s");
    for (int kind = 0; kind < KIND_COUNT; kind++) {
        const size_t row_bytes = kinds[kind].row_bytes;
        size_t small_rows = ((size_t)cache_kib << 10) / row_bytes, big_rows = big_bytes / row_bytes;
        if (small_rows == 0) small_rows = 1;
        if (big_rows == 0) big_rows = 1;
        fill_weights(kind, w, big_rows * row_bytes, row_bytes, n);
        const kernels *sets[2 * MAX_SETS];
        const int n_sets = sets_to_time(isas, n_isas, kind == KIND_Q4_0_GEMV, sets);
        for (int i = 0; i < n_sets; i++) {
            if (!sets[i]) continue;
            const double in_cache = measure(sets[i], kind, w, small_rows, row_bytes, x32, x16, x8, n, min_seconds);
            const double in_memory = measure(sets[i], kind, w, big_rows, row_bytes, x32, x16, x8, n, min_seconds);
            printf("%-9s %-12s %12.2f %14.2f\n", kinds[kind].name, set_label(sets[i]), in_cache, in_memory);
            fflush(stdout);
        }
    }
    bench_gemv_share(isas, n_isas, w, big_bytes, x8, n);
    if (pool) bench_gemv_threads(isas, n_isas, w, big_bytes, x8, n, pool, all_gbs, min_seconds);
    bench_pred_gemv(w, big_bytes, (size_t)cache_kib << 10, min_seconds);
    bench_bundle_sum(isas, n_isas, w, big_bytes, (size_t)cache_kib << 10, min_seconds);
    bench_attention(isas, n_isas, w, big_bytes, min_seconds);
    const double peak = bench_peak(int8_peak_macs, "int8", n_cpus, min_seconds);
    bench_gemm(isas, n_isas, w, big_bytes, min_seconds, peak);
    const double f32_peak = bench_peak(f32_peak_macs, "f32", n_cpus, min_seconds);
    bench_gemm_float(isas, n_isas, w, big_bytes, min_seconds, f32_peak);
out:
    pool_free(pool);
    free(gemv_out);
    huge_free(w, w_mapped);
    free(x8);
    free(x16);
    free(x32);
    return 0;
}

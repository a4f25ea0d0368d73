/* The hardware profile's measurements (hw_profile.h): memory bandwidth, the
 * FFN's kernels on rows streamed from memory, and the order of the whole.
 * Storage is measured in hw_profile_io.c, the bus in hw_profile_bus.c; the
 * file and the interpolation are in hw_profile_file.c. */
#include "hw_profile.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/ops.h"
#include "gguf/f16.h"
#include "kernels/kernels.h"
#include "kernels/sparse_kernels.h"
#include "util/read_engine.h"
#include "plan/bundle.h"
#include "util/clock.h"
#include "util/compare_double.h"
#include "util/huge_alloc.h"
#include "util/log.h"
#include "util/mem_bandwidth.h"
#include "util/mem_limit.h"
#include "util/synth_rng.h"
#include "util/threadpool.h"

#define DEFAULT_SECONDS_PER_POINT 0.2
#define MEMORY_BYTES ((size_t)256 << 20) /* or twice the L3 if more: far larger than the caches */
#define MEMORY_MIN_BYTES ((size_t)16 << 20)
#define MIN_PASSES 2
#define MATVEC_CHUNK_ROWS 1024           /* dense rows per matvec call: the output stays in L1 */
#define SPARSE_SHARE 10                  /* a gather reads one row in SPARSE_SHARE */

/* ---- progress: one point is about seconds_per_point of work ---- */

typedef struct {
    const hw_profile_opts *o;
    int done, total; /* points */
} progress;

static void progress_step(void *ctx, const char *step) {
    progress *p = ctx;
    if (p->o->progress) p->o->progress(p->o->progress_ctx, step, (double)p->done / p->total);
    p->done++;
}

/* ---- memory read bandwidth ---- */

static void measure_memory(hw_profile *h, const uint8_t *buf, size_t bytes, threadpool *pool, double seconds,
                           progress *p) {
    progress_step(p, "memory bandwidth, 1 thread");
    h->mem_gbs_one = mem_read_rate(buf, bytes, NULL, seconds) / 1e9;
    progress_step(p, "memory bandwidth, all threads");
    h->mem_gbs_all = mem_read_rate(buf, bytes, pool, seconds) / 1e9;
}

/* ---- the FFN's kernels ---- */

/* Random valid rows of `type` over bytes (a multiple of 8): floats below 2
 * in magnitude and above 2^-15 (F32) or 2^-3 (F16), so no denormals,
 * infinities or NaNs; quantized blocks of random quants under the scale 0.01. */
static void fill_rows(uint8_t *buf, size_t bytes, uint32_t type, uint64_t seed) {
    synth_rng r = synth_stream(synth_key(seed, type, 0, 0), 0);
    for (size_t off = 0; off < bytes; off += 8) {
        uint64_t v = synth_next(&r);
        if (type == GGML_TYPE_F32) v = (v & ~0x4000000040000000ull) | 0x3800000038000000ull; /* exponent 112..127 */
        if (type == GGML_TYPE_F16) v = (v & ~0x4000400040004000ull) | 0x3000300030003000ull; /* exponent 12..15 */
        memcpy(buf + off, &v, sizeof v);
    }
    if (type != GGML_TYPE_Q8_0 && type != GGML_TYPE_Q4_0) return;
    const size_t block = ggml_block_bytes(type);
    const uint16_t d = f32_to_f16(0.01f);
    for (size_t off = 0; off + block <= bytes; off += block) memcpy(buf + off, &d, sizeof d);
}

typedef struct {
    const kernels *k;
    const sparse_type_kernels *sk; /* for w's type */
    weight w;                      /* the synthetic matrix, filling the buffer */
    act_vec in;                    /* a random activation, converted for every type */
    int threads;                   /* the pool's: every pass runs on all of them at once */
    float *x, *y;                  /* x [row_len]; y [threads][row_len], each thread's axpy output */
    float *out, *coef;             /* [max(MATVEC_CHUNK_ROWS * threads, largest class)] */
    int32_t *rows_by_class;        /* [w.rows]: class 0's rows ascending, then class 1's, ... */
    long class_start[SPARSE_SHARE + 1];
    int pass_class;                /* the class the pass under way reads */
} kernel_bench;

static int row_class(long row) { return (int)(synth_mix((uint64_t)row * SYNTH_GOLDEN) % SPARSE_SHARE); }

/* Deals the rows at random into SPARSE_SHARE classes, each ascending (as a
 * predictor names neurons). Pass k gathers class k % SPARSE_SHARE, so a row
 * is read again only after all the others: the caches hold none of it by
 * then. Returns the largest class's size. */
static long deal_rows(kernel_bench *b) {
    long count[SPARSE_SHARE] = {0}, next[SPARSE_SHARE], largest = 0;
    for (long r = 0; r < b->w.rows; r++) count[row_class(r)]++;
    for (int c = 0; c < SPARSE_SHARE; c++) {
        next[c] = b->class_start[c];
        b->class_start[c + 1] = b->class_start[c] + count[c];
        largest = count[c] > largest ? count[c] : largest;
    }
    for (long r = 0; r < b->w.rows; r++) b->rows_by_class[next[row_class(r)]++] = (int32_t)r;
    return largest;
}

static const void *activation_for(const kernel_bench *b) {
    if (b->w.type == GGML_TYPE_F32) return b->in.f32;
    return b->w.type == GGML_TYPE_F16 ? (const void *)b->in.f16 : (const void *)b->in.q8;
}

/* Passes run on every thread at once, each on its share, as the stack's
 * cpu-workers share a layer: the dense dot each thread's range of rows, a
 * gather or an axpy each thread's part of the pass's class (the axpy into
 * its own y). */
typedef void (*share_fn)(void *ctx, int ith, int nth);

static void dense_share(void *ctx, int ith, int nth) {
    const kernel_bench *b = ctx;
    long begin, end;
    pool_split(b->w.rows, ith, nth, &begin, &end);
    float *out = b->out + (size_t)ith * MATVEC_CHUNK_ROWS;
    for (long r0 = begin; r0 < end; r0 += MATVEC_CHUNK_ROWS)
        matvec_rows_packed(b->k, &b->w, &b->in, out, r0, r0 + MATVEC_CHUNK_ROWS < end ? r0 + MATVEC_CHUNK_ROWS : end);
}

/* this thread's part of the pass's class: its rows' indices, their count, their first index */
static const int32_t *class_share(const kernel_bench *b, int ith, int nth, int *count, long *first) {
    const long c0 = b->class_start[b->pass_class], n = b->class_start[b->pass_class + 1] - c0;
    long begin, end;
    pool_split(n, ith, nth, &begin, &end);
    *count = (int)(end - begin);
    *first = begin;
    return b->rows_by_class + c0 + begin;
}

static void gather_share(void *ctx, int ith, int nth) {
    const kernel_bench *b = ctx;
    int count;
    long first;
    const int32_t *idx = class_share(b, ith, nth, &count, &first);
    b->sk->dot(b->w.data, b->w.row_bytes, idx, count, activation_for(b), (int)b->w.cols, b->out + first, NULL);
}

static void axpy_share(void *ctx, int ith, int nth) {
    const kernel_bench *b = ctx;
    int count;
    long first;
    const int32_t *idx = class_share(b, ith, nth, &count, &first);
    float *y = b->y + (size_t)ith * (size_t)b->w.cols;
    memset(y, 0, sizeof(float) * (size_t)b->w.cols);
    b->sk->axpy(b->w.data, b->w.row_bytes, idx, b->coef + first, count, y, (int)b->w.cols, NULL);
}

/* Rows per second of each thread, in the median of the passes run during
 * `seconds` (at least MIN_PASSES), the pool running `share` on every thread
 * at once: what a thread keeps up while the others stream beside it, in a
 * typical pass of a shared machine (not the best: the stack does not get
 * its best passes either). A gather or axpy pass reads one class (the next
 * each time); a dense pass every row. */
static double rows_per_thread_s(threadpool *pool, share_fn share, kernel_bench *b, bool by_class, double seconds) {
    enum { MAX_PASSES = 256 };
    double rate[MAX_PASSES];
    int n = 0;
    const double start = clock_seconds();
    while (n < MAX_PASSES && (n < MIN_PASSES || clock_seconds() - start < seconds)) {
        const double rows = by_class ? (double)(b->class_start[b->pass_class + 1] - b->class_start[b->pass_class])
                                     : (double)b->w.rows;
        const double t0 = clock_seconds();
        pool_run(pool, share, b);
        const double t = clock_seconds() - t0;
        if (by_class) b->pass_class = (b->pass_class + 1) % SPARSE_SHARE;
        if (t > 0) rate[n++] = rows / t;
    }
    if (n == 0) return 0;
    qsort(rate, (size_t)n, sizeof *rate, compare_double);
    return rate[n / 2] / pool_size(pool);
}

/* The matrix: random rows of `type` filling buf (bytes: a multiple of 8),
 * dealt into classes for the gathers. */
static int kernel_bench_init(kernel_bench *b, uint8_t *buf, size_t bytes, uint32_t type, int row_len) {
    const size_t row_bytes = ggml_row_bytes(type, (uint64_t)row_len);
    b->sk = sparse_kernels_for_type(kernels_best()->sparse, type);
    if (!b->sk || row_bytes == 0 || bytes / row_bytes < SPARSE_SHARE || bytes / row_bytes > INT32_MAX) return -1;
    fill_rows(buf, bytes, type, 1);
    b->w = (weight){.data = buf, .type = type, .rows = (int64_t)(bytes / row_bytes), .cols = row_len,
                    .row_bytes = row_bytes};
    free(b->rows_by_class), free(b->out), free(b->coef);
    b->rows_by_class = malloc(sizeof(int32_t) * (size_t)b->w.rows);
    if (!b->rows_by_class) return -1;
    const long largest = deal_rows(b), chunks = (long)MATVEC_CHUNK_ROWS * b->threads;
    const size_t per_row = (size_t)(largest > chunks ? largest : chunks);
    b->out = malloc(sizeof(float) * per_row);
    b->coef = malloc(sizeof(float) * per_row);
    if (!b->out || !b->coef) return -1;
    synth_rng r = synth_stream(synth_key(2, type, (uint64_t)row_len, 0), 0);
    for (size_t i = 0; i < per_row; i++) b->coef[i] = (float)(2 * synth_uniform(&r) - 1);
    return 0;
}

static void kernel_bench_free(kernel_bench *b) {
    free(b->x), free(b->y), free(b->in.f16), free(b->in.q8);
    free(b->out), free(b->coef), free(b->rows_by_class);
}

/* The activation x, converted once for every weight type. */
static int kernel_bench_activation(kernel_bench *b, int row_len, int threads) {
    b->k = kernels_best();
    b->threads = threads;
    b->x = malloc(sizeof(float) * (size_t)row_len);
    b->y = malloc(sizeof(float) * (size_t)row_len * (size_t)threads);
    b->in.f16 = malloc(sizeof(uint16_t) * (size_t)row_len);
    b->in.q8 = malloc(sizeof(block_q8_0) * (size_t)(row_len / QK8_0 + 1));
    if (!b->x || !b->y || !b->in.f16 || !b->in.q8) return -1;
    synth_rng r = synth_stream(synth_key(3, (uint64_t)row_len, 0, 0), 0);
    for (int i = 0; i < row_len; i++) b->x[i] = (float)(2 * synth_uniform(&r) - 1);
    b->in.f32 = b->x;
    b->k->f32_to_f16_row(b->x, b->in.f16, row_len);
    if (row_len % QK8_0 == 0) b->k->quantize_q8_0(b->x, b->in.q8, row_len);
    return 0;
}

/* MEMORY_BYTES or twice the L3 cache, at most a quarter of the memory that
 * may be used, whole huge pages. */
static size_t memory_bench_bytes(void) {
    mem_limit lim;
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t bytes = l3 > 0 && 2 * (size_t)l3 > MEMORY_BYTES ? 2 * (size_t)l3 : MEMORY_BYTES;
    if (mem_limit_read("", &lim) == 0 && lim.bytes / 4 < bytes) bytes = (size_t)(lim.bytes / 4);
    bytes = bytes / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    return bytes > MEMORY_MIN_BYTES ? bytes : MEMORY_MIN_BYTES;
}

/* Memory and kernels share one buffer, filled with the FFN's gate rows
 * before the bandwidth is read (so that every page is backed), then with
 * down_t rows for the axpy where their type differs. */
static int measure_memory_and_kernels(hw_profile *h, uint32_t down_type, double seconds, progress *p, char *err,
                                      size_t errlen) {
    size_t mapped = 0, bytes = memory_bench_bytes();
    uint8_t *buf = huge_alloc(bytes, &mapped);
    threadpool *pool = pool_new(h->n_cpus);
    kernel_bench b = {0};
    int rc = -1;
    if (!pool) {
        err_set(err, errlen, "memory and kernels: cannot start %d threads", h->n_cpus);
        goto out;
    }
    if (!buf || kernel_bench_activation(&b, h->row_len, h->n_cpus)) {
        err_set(err, errlen, "out of memory for a %zu MiB buffer to measure memory and kernels", bytes >> 20);
        goto out;
    }
    if (kernel_bench_init(&b, buf, bytes, h->weight_type, h->row_len)) {
        err_set(err, errlen, "kernels: no sparse kernels for %s rows of %d, or out of memory",
                ggml_type_name(h->weight_type), h->row_len);
        goto out;
    }
    measure_memory(h, buf, bytes, pool, seconds, p);
    progress_step(p, "dense dot");
    h->dense_rows_s = rows_per_thread_s(pool, dense_share, &b, false, seconds);
    progress_step(p, "sparse gather");
    h->sparse_rows_s = rows_per_thread_s(pool, gather_share, &b, true, seconds);
    if (down_type != h->weight_type && kernel_bench_init(&b, buf, bytes, down_type, h->row_len)) {
        err_set(err, errlen, "kernels: no sparse kernels for %s down_t rows of %d, or out of memory",
                ggml_type_name(down_type), h->row_len);
        goto out;
    }
    progress_step(p, "sparse axpy");
    h->axpy_rows_s = rows_per_thread_s(pool, axpy_share, &b, true, seconds);
    rc = 0;
out:
    kernel_bench_free(&b);
    pool_free(pool);
    huge_free(buf, mapped);
    return rc;
}

/* ---- the whole ---- */

/* /proc/cpuinfo's first "model name" (x86), else "unknown". */
static void cpu_model_name(char *out, size_t outlen) {
    snprintf(out, outlen, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        const char *v = colon + 1 + strspn(colon + 1, " \t");
        const size_t len = strcspn(v, "\n");
        if (len) snprintf(out, outlen, "%.*s", (int)len, v);
        break;
    }
    fclose(f);
}

int hw_profile_scratch_dir(char *dir, const char *what, char *err, size_t errlen) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, PATH_MAX, "%s/pi2-hw-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", what);
    if (mkdtemp(dir)) return 0;
    err_set(err, errlen, "%s: mkdtemp %s: %s", what, dir, strerror(errno));
    return -1;
}

void hw_profile_identify(hw_profile *h) {
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    h->n_cpus = cpus > 0 ? (int)cpus : 1;
    cpu_model_name(h->cpu, sizeof h->cpu);
    snprintf(h->kernels, sizeof h->kernels, "%s", kernels_best()->name);
    const char *engine = read_engine_probe();
    snprintf(h->io_engine, sizeof h->io_engine, "%s", engine ? engine : "none");
}

int hw_profile_measure(hw_profile *h, const model *m, const hw_profile_opts *o, char *err, size_t errlen) {
    const double start = clock_seconds();
    const double seconds = o->seconds_per_point > 0 ? o->seconds_per_point : DEFAULT_SECONDS_PER_POINT;
    *h = (hw_profile){.version = HW_PROFILE_VERSION, .weight_type = m->layers[0].gate.type, .row_len = m->n_embd};
    hw_profile_identify(h);
    struct stat st;
    if (stat(o->model_path, &st)) {
        err_set(err, errlen, "%s: %s", o->model_path, strerror(errno));
        return -1;
    }
    h->fs_dev = (uint64_t)st.st_dev;
    progress p = {.o = o, .total = MEMORY_KERNEL_POINTS + HW_IO_POINTS + BUS_POINTS};
    h->down_type = bundle_down_type(m);
    if (measure_memory_and_kernels(h, h->down_type, seconds, &p, err, errlen) ||
        hw_profile_measure_io(h, o->model_path, seconds, progress_step, &p, err, errlen))
        return -1;
    progress_step(&p, "bus and doorbell round trips");
    if (hw_profile_measure_bus(h, err, errlen) || hw_profile_measure_wake(h, err, errlen)) return -1;
    h->seconds = clock_seconds() - start;
    if (o->progress) o->progress(o->progress_ctx, "done", 1.0);
    return 0;
}

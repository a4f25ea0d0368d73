/* sparse-bench: speed of the sparse-decode kernels on a 7B-shaped FFN, one thread.
 * Each layer holds gate, up and down_t (n_ff rows of n_embd elements); a fixed
 * fraction of neurons is active, at random. The layers together are far larger
 * than the caches and the active sets rotate, so the rows come from memory.
 * Reported: GB/s of the weight bytes each kernel actually touches, per ISA, next
 * to the dense kernel of the same ISA streaming a whole matrix, and to a
 * read ceiling measured in the same run (the whole layers streamed by the
 * fastest dense kernel, the F16 dot). The same memory is
 * also read as a bundle file (neuron i's gate, up and down side by side).
 * The axpy also runs as the stack's chunked FFN calls it, one call per neuron
 * chunk into its own partial, with and without each call naming the next
 * chunk's first rows for prefetching (sparse_then).
 *
 * Where the weights live matters: every gathered row sits on its own page, so
 * on 4 KiB pages each row costs a dTLB miss and a page walk, which 2 MiB pages
 * spare (Q4_0 gathers read ~10-45% faster on them here). By default the
 * weights are a shared-memory object mapped MAP_SHARED on 4 KiB pages (shmem
 * THP is off on the target machine), as the stack's segments were until they
 * moved to 2 MiB pages (lib/stack/shm.c, MADV_COLLAPSE); -P thp is what the stack
 * gets now, -P 4k private 4 KiB pages; the share of the weights actually on
 * huge pages is printed. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gguf/f16.h"
#include "util/cli.h"
#include "util/clock.h"
#include "engine/ffn_chunks.h"
#include "kernels/kernels.h"
#include "util/log.h"
#include "kernels/sparse_kernels.h"

#define DESIGN_READ_GBPS 16.5 /* one core's read bandwidth, DESIGN.md */
#define ACTIVE_SETS 8 /* random active sets per layer, cycled so no set is still cached when it returns */

enum placement { PLACE_SHM, PLACE_4K, PLACE_THP, PLACE_COUNT };
static const char *const placement_names[PLACE_COUNT] = {"shm", "4k", "thp"};

typedef struct {
    int n_embd, n_ff, active;  /* active neurons per layer */
    int chunk;                 /* neurons per chunk of the stack's FFN (ffn_chunk_neurons) */
    int layers;
    uint32_t type;
    size_t row_bytes, layer_bytes;
    uint8_t *weights;          /* layers x (gate | up | down_t), or read as bundles */
    void *mapping;             /* the mapping that holds weights */
    size_t mapping_bytes;
    int32_t *sets;             /* layers x ACTIVE_SETS x active indices */
    float *x32, *coef, *y, *out_a, *out_b;
    void *xconv;               /* x converted for the weight type */
    uint16_t *x16;             /* x as F16, for the read-ceiling stream */
} bench;

static volatile float sink; /* keeps results from being optimised away */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static float rng_float(void) { return (float)(rng_next() >> 40) / (float)(1u << 24) * 2.0f - 1.0f; }

static int compare_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* random valid weights: halves below 1 in magnitude, blocks with a small scale.
 * Rows start at multiples of row_bytes in both layouts, so block starts agree. */
static void fill_weights(bench *b) {
    const size_t total = b->layer_bytes * (size_t)b->layers;
    for (size_t off = 0; off + 8 <= total; off += 8) {
        uint64_t v = rng_next();
        if (b->type == GGML_TYPE_F16) v &= 0xbbffbbffbbffbbffull; /* exponent <= 14 */
        memcpy(b->weights + off, &v, 8);
    }
    const size_t block = ggml_block_bytes(b->type);
    if (b->type == GGML_TYPE_F16) return;
    const uint16_t d = f32_to_f16(0.01f);
    for (size_t off = 0; off + block <= total; off += block) memcpy(b->weights + off, &d, sizeof d);
}

/* each set: `active` distinct neurons, ascending (a predictor scans neurons in order) */
static void make_sets(bench *b, int sorted) {
    int32_t *perm = malloc((size_t)b->n_ff * sizeof *perm);
    for (int s = 0; s < b->layers * ACTIVE_SETS; s++) {
        for (int i = 0; i < b->n_ff; i++) perm[i] = i;
        for (int i = 0; i < b->active; i++) { /* partial Fisher-Yates */
            const int j = i + (int)(rng_next() % (uint64_t)(b->n_ff - i));
            const int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        if (sorted) qsort(perm, (size_t)b->active, sizeof *perm, compare_i32);
        memcpy(b->sets + (size_t)s * (size_t)b->active, perm, (size_t)b->active * sizeof *perm);
    }
    free(perm);
}

enum op { OP_STREAM, OP_DENSE, OP_DOT, OP_DOT2, OP_AXPY, OP_AXPY_CHUNKS, OP_AXPY_CHUNKS_THEN, OP_FFN, OP_FFN_BUNDLE, OP_COUNT };
static const char *const op_names[OP_COUNT] = {
    "read ceiling (f16 dot stream)", "dense dot (whole gate matrix)", "gather dot (gate)", "gather dot2 (gate+up fused)", "gather axpy (down_t)",
    "axpy by chunk, no hint", "axpy by chunk, next hinted", "sparse FFN: dot2 + axpy", "sparse FFN, bundle layout"};

/* The axpy as the stack's chunked FFN runs it: one call per neuron chunk
 * (ffn_chunk_neurons), each into its own zeroed partial; `hint`: each call
 * names the next chunk's first rows (sparse_then), as ffn_chunks_run does. */
static void axpy_by_chunk(const bench *b, const sparse_type_kernels *sk, const uint8_t *w, const int32_t *idx,
                          bool hint) {
    const size_t rb = b->row_bytes;
    for (int k0 = 0, k1; k0 < b->active; k0 = k1) {
        for (k1 = k0; k1 < b->active && idx[k1] / b->chunk == idx[k0] / b->chunk; k1++) continue;
        sparse_then then = {0};
        if (hint) sparse_then_rows(&then, w, rb, idx + k1, b->active - k1, 0);
        memset(b->y, 0, sizeof(float) * (size_t)b->n_embd);
        sk->axpy(w, rb, idx + k0, b->coef + k0, k1 - k0, b->y, b->n_embd, &then);
    }
}

static float dense_dot(const kernels *k, uint32_t type, const void *row, const void *x, int n) {
    switch (type) {
    case GGML_TYPE_F16: return k->dot_f16(row, x, n);
    case GGML_TYPE_Q8_0: return k->dot_q8_0(row, x, n);
    default: return k->dot_q4_0(row, x, n);
    }
}

/* one layer's work for op; returns the weight bytes it touched */
static double run_layer(const bench *b, const kernels *dk, const sparse_type_kernels *sk, int op, int layer,
                        int set) {
    const uint8_t *base = b->weights + (size_t)layer * b->layer_bytes;
    const size_t rb = b->row_bytes, matrix = (size_t)b->n_ff * rb;
    const int32_t *idx = b->sets + ((size_t)layer * ACTIVE_SETS + (size_t)set) * (size_t)b->active;
    const int n = b->n_embd, m = b->active;
    switch (op) {
    case OP_STREAM: /* the whole layer read as F16 rows: the fastest dense stream */
        for (size_t off = 0; off + 2 * (size_t)n <= b->layer_bytes; off += 2 * (size_t)n)
            b->out_a[0] += dk->dot_f16((const uint16_t *)(base + off), b->x16, n);
        return (double)(b->layer_bytes / (2 * (size_t)n) * 2 * (size_t)n);
    case OP_DENSE:
        if (b->type == GGML_TYPE_Q4_0) {
            dk->gemv_q4_0((const block_q4_0 *)base, rb, b->xconv, b->out_a, b->n_ff, n);
        } else {
            for (int r = 0; r < b->n_ff; r++) b->out_a[r] = dense_dot(dk, b->type, base + (size_t)r * rb, b->xconv, n);
        }
        return (double)matrix;
    case OP_DOT:
        sk->dot(base, rb, idx, m, b->xconv, n, b->out_a, NULL);
        return (double)m * (double)rb;
    case OP_DOT2:
        sk->dot2(base, base + matrix, rb, idx, m, b->xconv, n, b->out_a, b->out_b, NULL);
        return 2.0 * m * (double)rb;
    case OP_AXPY:
        sk->axpy(base + 2 * matrix, rb, idx, b->coef, m, b->y, n, NULL);
        return (double)m * (double)rb;
    case OP_AXPY_CHUNKS:
    case OP_AXPY_CHUNKS_THEN:
        axpy_by_chunk(b, sk, base + 2 * matrix, idx, op == OP_AXPY_CHUNKS_THEN);
        return (double)m * (double)rb;
    case OP_FFN:
        sk->dot2(base, base + matrix, rb, idx, m, b->xconv, n, b->out_a, b->out_b, NULL);
        sk->axpy(base + 2 * matrix, rb, idx, b->coef, m, b->y, n, NULL);
        return 3.0 * m * (double)rb;
    default: /* OP_FFN_BUNDLE: neuron i at base + i * 3 rb: gate, up, down */
        sk->dot2(base, base + rb, 3 * rb, idx, m, b->xconv, n, b->out_a, b->out_b, NULL);
        sk->axpy(base + 2 * rb, 3 * rb, idx, b->coef, m, b->y, n, NULL);
        return 3.0 * m * (double)rb;
    }
}

#define MAX_PASSES 4096

typedef struct {
    double seconds, bytes; /* a pass's time and the bytes its active sets touched */
} pass_time;

static int compare_pass_time(const void *a, const void *b) {
    const double x = ((const pass_time *)a)->seconds, y = ((const pass_time *)b)->seconds;
    return (x > y) - (x < y);
}

/* GB/s of touched weight bytes in the fastest pass over all layers (each pass
 * uses the next active set) during min_seconds, at least 3 passes; also the
 * microseconds per layer of that pass and of the median pass. On a shared
 * machine the median is what a long run sees: here it was 15-35 % above the
 * best for the gathers and the axpy. */
static double measure(const bench *b, const kernels *dk, const sparse_type_kernels *sk, int op, double min_seconds,
                      double *us_per_layer, double *median_us_per_layer) {
    static pass_time times[MAX_PASSES];
    int n = 0;
    const double start = clock_seconds();
    for (int pass = 0; n < MAX_PASSES && (pass < 4 || clock_seconds() - start < min_seconds); pass++) {
        const double t0 = clock_seconds();
        double bytes = 0;
        for (int l = 0; l < b->layers; l++) bytes += run_layer(b, dk, sk, op, l, pass % ACTIVE_SETS);
        if (pass > 0) times[n++] = (pass_time){clock_seconds() - t0, bytes}; /* pass 0 warms up */
    }
    sink = b->out_a[0] + b->out_b[0] + b->y[0];
    qsort(times, (size_t)n, sizeof *times, compare_pass_time);
    *us_per_layer = times[0].seconds / b->layers * 1e6;
    *median_us_per_layer = times[n / 2].seconds / b->layers * 1e6;
    return times[0].bytes / times[0].seconds / 1e9;
}

static void usage(FILE *out, const char *prog) {
    fprintf(out,
            "usage: %s [-e N_EMBD] [-f N_FF] [-p FRACTION] [-m MIB] [-s SECONDS] [-t TYPE] [-u] [-P PLACE] [-i ISA]\n"
            "  GB/s of weight bytes touched by the sparse-decode kernels (one thread), against the\n"
            "  dense kernels and the fastest dense stream of the run.\n"
            "  -e N_EMBD    row length, a multiple of 32 (default 4096)\n"
            "  -f N_FF      neurons per layer (default 11008)\n"
            "  -p FRACTION  active fraction of the neurons (default 0.10)\n"
            "  -m MIB       weights per type, as whole layers, at least 2 (default 1024)\n"
            "  -s SECONDS   minimum time per measurement (default 0.5)\n"
            "  -t TYPE      only this weight type: f16, q8_0 or q4_0 (default all three)\n"
            "  -u           active sets in random order instead of ascending\n"
            "  -P PLACE     where the weights live: shm (a shared-memory object, MAP_SHARED, on\n"
            "               4 KiB pages while shmem THP is off), 4k (private anonymous,\n"
            "               MADV_NOHUGEPAGE) or thp (private anonymous, MADV_HUGEPAGE: 2 MiB pages,\n"
            "               as the stack's segments where the kernel can move them); default shm\n"
            "  -i ISA       only this kernel set: scalar, avx2, avx512 or neon (default all)\n",
            prog);
}

#define HUGE_PAGE ((size_t)2 << 20)

/* maps `bytes` of weights as `place` says; NULL (logged) on failure */
static uint8_t *map_weights(bench *b, enum placement place, size_t bytes) {
    void *p;
    if (place == PLACE_SHM) {
        /* like the stack's shm_open segment: shmem pages, MAP_SHARED */
        const int fd = memfd_create("sparse-bench", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
            log_error("memfd of %zu MiB: %s", bytes >> 20, strerror(errno));
            if (fd >= 0) close(fd);
            return NULL;
        }
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        b->mapping_bytes = bytes;
    } else { /* private anonymous, 2 MiB-aligned so that huge pages can back all of it */
        b->mapping_bytes = bytes + HUGE_PAGE;
        p = mmap(NULL, b->mapping_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (p == MAP_FAILED) {
        log_error("mmap of %zu MiB: %s", bytes >> 20, strerror(errno));
        return NULL;
    }
    b->mapping = p;
    if (place == PLACE_SHM) return p;
    uint8_t *aligned = (uint8_t *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (madvise(aligned, bytes, place == PLACE_THP ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0)
        log_error("madvise(%s): %s (the pages may not be what -P asks)",
                  place == PLACE_THP ? "MADV_HUGEPAGE" : "MADV_NOHUGEPAGE", strerror(errno));
    return aligned;
}

/* KiB of the mapping at `start` on huge pages (smaps AnonHugePages plus
 * ShmemPmdMapped), or -1 if /proc/self/smaps cannot say */
static long huge_kib(const void *start) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0;
    long kib = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) { /* a mapping's header; its fields follow */
            if (inside) break;
            inside = (uintptr_t)start >= lo && (uintptr_t)start < hi;
            continue;
        }
        long v;
        if (inside &&
            (sscanf(line, "AnonHugePages: %ld kB", &v) == 1 || sscanf(line, "ShmemPmdMapped: %ld kB", &v) == 1))
            kib = (kib < 0 ? 0 : kib) + v;
    }
    fclose(f);
    return kib;
}

/* allocates and fills the layers of one type; 0 on success */
static int bench_init(bench *b, uint32_t type, int n_embd, int n_ff, double fraction, long mib, int sorted,
                      enum placement place) {
    memset(b, 0, sizeof *b);
    b->type = type;
    b->n_embd = n_embd;
    b->n_ff = n_ff;
    b->chunk = ffn_chunk_neurons(&(model){.n_ff = n_ff});
    b->active = (int)(fraction * n_ff + 0.5);
    if (b->active < 1) b->active = 1;
    b->row_bytes = ggml_row_bytes(type, (uint64_t)n_embd);
    b->layer_bytes = 3 * (size_t)n_ff * b->row_bytes;
    b->layers = (int)(((size_t)mib << 20) / b->layer_bytes);
    if (b->layers < 2) b->layers = 2;
    b->weights = map_weights(b, place, b->layer_bytes * (size_t)b->layers);
    b->sets = malloc((size_t)b->layers * ACTIVE_SETS * (size_t)b->active * sizeof *b->sets);
    b->x32 = malloc((size_t)n_embd * sizeof *b->x32);
    b->xconv = malloc((size_t)n_embd * sizeof(float));
    b->coef = malloc((size_t)b->active * sizeof *b->coef);
    b->y = calloc((size_t)n_embd, sizeof *b->y);
    b->out_a = malloc((size_t)n_ff * sizeof *b->out_a);
    b->out_b = malloc((size_t)n_ff * sizeof *b->out_b);
    b->x16 = malloc((size_t)n_embd * sizeof *b->x16);
    if (!b->weights || !b->sets || !b->x32 || !b->xconv || !b->coef || !b->y || !b->out_a || !b->out_b || !b->x16) {
        log_error("out of memory for %d layers of %zu MiB", b->layers, b->layer_bytes >> 20);
        return -1;
    }
    fill_weights(b);
    make_sets(b, sorted);
    for (int i = 0; i < n_embd; i++) b->x32[i] = rng_float();
    for (int k = 0; k < b->active; k++) b->coef[k] = rng_float() * 0.01f;
    quantize_row(type == GGML_TYPE_F16 ? GGML_TYPE_F16 : GGML_TYPE_Q8_0, b->x32, b->xconv, n_embd);
    /* the read-ceiling stream dots F16 rows with an F16 x of the same length */
    quantize_row(GGML_TYPE_F16, b->x32, b->x16, n_embd);
    return 0;
}

static void bench_free(bench *b) {
    if (b->mapping) munmap(b->mapping, b->mapping_bytes);
    free(b->sets);
    free(b->x32);
    free(b->xconv);
    free(b->x16);
    free(b->coef);
    free(b->y);
    free(b->out_a);
    free(b->out_b);
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    int n_embd = 4096, n_ff = 11008, sorted = 1;
    double fraction = 0.10, min_seconds = 0.5;
    long mib = 1024;
    const char *only = NULL, *only_isa = NULL;
    enum placement place = PLACE_SHM;
    int opt;
    while ((opt = getopt(argc, argv, "e:f:p:m:s:t:uP:i:h")) != -1) {
        switch (opt) {
        case 'e': if (cli_parse_int(optarg, "-e", 1, 1 << 30, &n_embd)) return 2; break;
        case 'f': if (cli_parse_int(optarg, "-f", 1, 1 << 30, &n_ff)) return 2; break;
        case 'p': fraction = atof(optarg); break;
        case 'm': if (cli_parse_long(optarg, "-m", 1, 1L << 30, &mib)) return 2; break;
        case 's': min_seconds = atof(optarg); break;
        case 't': only = optarg; break;
        case 'u': sorted = 0; break;
        case 'i': only_isa = optarg; break;
        case 'P':
            for (place = 0; place < PLACE_COUNT && strcmp(optarg, placement_names[place]) != 0; place++) continue;
            if (place == PLACE_COUNT) {
                log_error("-P %s: expected shm, 4k or thp", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout, argv[0]); return 0;
        default: usage(stderr, argv[0]); return 2;
        }
    }
    if (n_embd % QK8_0 != 0 || n_embd > (1 << 24)) {
        log_error("-e %d: must be a multiple of %d and at most 2^24", n_embd, QK8_0);
        return 2;
    }
    if (!(fraction > 0.0 && fraction <= 1.0)) {
        log_error("-p must be in (0, 1]");
        return 2;
    }
    const uint32_t types[3] = {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_F16};
    const int only_type = only ? ggml_type_from_name(only) : -1;
    if (only && only_type != GGML_TYPE_F16 && only_type != GGML_TYPE_Q8_0 && only_type != GGML_TYPE_Q4_0) {
        log_error("-t %s: expected f16, q8_0 or q4_0", only);
        return 2;
    }
    /* the default dense sets (avx512: its fast order), as the dense decode runs them,
     * each with its sparse kernels */
    enum { SETS = 4 };
    const kernels *dense[SETS] = {kernels_scalar(), kernels_avx2(), kernels_avx512(), kernels_neon()};
    /* the scalar stream is far below the memory: run it only when it is the sole ceiling */
    const int skip_scalar_stream = only_isa == NULL;
    if (only_isa) {
        int found = 0;
        for (int i = 0; i < SETS; i++) {
            if (dense[i] && strcmp(dense[i]->name, only_isa) == 0) found = 1;
            else dense[i] = NULL;
        }
        if (!found) {
            log_error("-i %s: not a kernel set this CPU runs (scalar, avx2, avx512, neon)", only_isa);
            return 2;
        }
    }

    printf("n_embd %d, n_ff %d, %.0f%% active (%s), 1 thread, weights in %s memory\n", n_embd, n_ff,
           fraction * 100, sorted ? "ascending" : "random order", placement_names[place]);
    for (int t = 0; t < 3; t++) {
        if (only && only_type != (int)types[t]) continue;
        bench b;
        if (bench_init(&b, types[t], n_embd, n_ff, fraction, mib, sorted, place) != 0) return 1;
        const long huge = huge_kib(b.weights);
        printf("\n%s: %d layers of %zu MiB, %d active neurons per layer (%.2f MiB of rows touched per layer)\n",
               ggml_type_name(types[t]), b.layers, b.layer_bytes >> 20, b.active,
               3.0 * b.active * (double)b.row_bytes / (1 << 20));
        if (huge >= 0)
            printf("weights on huge pages: %.0f%%\n",
                   100.0 * (double)huge * 1024 / (double)(b.layer_bytes * (size_t)b.layers));
        else
            printf("weights on huge pages: unknown (no /proc/self/smaps)\n");
        double results[SETS][OP_COUNT] = {{0}}, us[SETS][OP_COUNT] = {{0}}, median_us[SETS][OP_COUNT] = {{0}};
        double ceiling = 0;
        for (int i = 0; i < SETS; i++) {
            if (!dense[i]) continue;
            const sparse_type_kernels *sk = sparse_kernels_for_type(dense[i]->sparse, types[t]);
            for (int op = 0; op < OP_COUNT; op++) {
                if (op == OP_STREAM && dense[i] == kernels_scalar() && skip_scalar_stream) continue;
                results[i][op] = measure(&b, dense[i], sk, op, min_seconds, &us[i][op], &median_us[i][op]);
                if (op == OP_STREAM && results[i][op] > ceiling) ceiling = results[i][op];
            }
        }
        printf("%-30s %-7s %9s %10s %10s %9s %9s\n", "kernel", "isa", "GB/s", "% ceiling", "% of 16.5", "us/layer",
               "median");
        for (int op = 0; op < OP_COUNT; op++)
            for (int i = 0; i < SETS; i++) {
                if (!dense[i] || (op == OP_STREAM && dense[i] == kernels_scalar() && skip_scalar_stream)) continue;
                printf("%-30s %-7s %9.2f %9.0f%% %9.0f%% %9.0f %9.0f\n", op_names[op], dense[i]->name, results[i][op],
                       100.0 * results[i][op] / ceiling, 100.0 * results[i][op] / DESIGN_READ_GBPS, us[i][op],
                       median_us[i][op]);
            }
        printf("(GB/s and %% from each kernel's fastest pass; %% ceiling: of the fastest read stream above,\n"
               " %.2f GB/s; %% of 16.5: of one core's read bandwidth in DESIGN.md, for runs on a busy machine\n"
               " where the stream above varies; us/layer: the fastest pass, median: the median pass)\n", ceiling);
        fflush(stdout);
        bench_free(&b);
    }
    return 0;
}

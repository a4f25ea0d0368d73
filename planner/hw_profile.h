/* The planner's hardware profile: what this machine does per second, measured
 * once and cached (pi2 plan --reprofile measures again). The cost model
 * (planner/cost_model.h) predicts decode speed from it and the model profile.
 *
 * Kernel figures are for one weight type and row length (the model's FFN),
 * weights streamed from memory (not cache), per thread while every thread
 * streams its share at once (as the stack's cpu-workers do), in a median
 * pass. I/O figures are
 * O_DIRECT random reads with io_uring on the model's own file system, at each
 * candidate bundle size and queue depth. */
#ifndef PI2_PLANNER_HW_PROFILE_H
#define PI2_PLANNER_HW_PROFILE_H

#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"

#define HW_PROFILE_VERSION 8 /* 6: wake_us; 7: io_engine; 8: the I/O grid timed in turns */
#define HW_IO_SIZES 5  /* read sizes: 4, 8, 12, 16, 32 KiB */
#define HW_IO_DEPTHS 9 /* queue depths: 1, 2, 4, ... 256 (a disk that still speeds up past 64: bench/offload) */
#define HW_IO_CPU_DEPTH 64 /* the depth whose reads' CPU time the profile keeps */

extern const int hw_io_size_kib[HW_IO_SIZES];
extern const int hw_io_depth[HW_IO_DEPTHS];

typedef struct {
    int version;
    char cpu[96];             /* /proc/cpuinfo model name */
    int n_cpus;               /* online CPUs */
    char kernels[24];         /* kernel set measured (kernels_best()->name) */
    /* memory read bandwidth, GB/s (1e9 bytes), large buffer, 1 thread and n_cpus threads */
    double mem_gbs_one, mem_gbs_all;
    /* kernels for this FFN weight type and row length, one thread, rows from memory */
    uint32_t weight_type;     /* GGML_TYPE_* of ffn_gate */
    uint32_t down_type;       /* GGML_TYPE_* of the down_t rows the axpy reads (bundle_down_type) */
    int row_len;              /* n_embd */
    double dense_rows_s;      /* dense dot (matvec) rows per second, per thread, all threads at once */
    double sparse_rows_s;     /* gathered rows (sparse_kernels: a 10 % random subset, in index order) per second,
                                 likewise */
    double axpy_rows_s;       /* down_t rows accumulated by the sparse axpy per second, likewise */
    /* storage, on the file system holding the model */
    uint64_t fs_dev;          /* st_dev of the model file: the cache key */
    bool o_direct;            /* false when O_DIRECT was refused (then reads went through the page cache) */
    char io_engine[16];       /* what reads here (read_engine.h): "io_uring", or "threads" where it is refused */
    double iops[HW_IO_SIZES][HW_IO_DEPTHS]; /* random aligned reads per second */
    /* CPU time of the reading thread per random read at depth HW_IO_CPU_DEPTH, microseconds, with a
     * busy thread on its core (as the io-worker beside a cpu-worker): queueing and reaping it
     * (io_cpu_us), and the same with the bytes that just landed checked against a checksum, as the
     * io-worker checks bundles (checked_cpu_us) */
    double io_cpu_us[HW_IO_SIZES], checked_cpu_us[HW_IO_SIZES];
    double seq_mbs;           /* sequential 1 MiB reads (4 in flight), MB/s (1e6 bytes) */
    double bus_rtt_us;        /* ZeroMQ request-reply round trip over ipc, microseconds (median) */
    double wake_us;           /* a thread asleep on a named pipe rung until it answers in shared memory, as the
                                 io-worker's doorbell and a cpu-worker's bundle ring: microseconds (median) */
    double seconds;           /* how long the measurement took */
} hw_profile;

/* Steps report progress as (what, fraction of the whole profile done);
 * step is valid during the call only. */
typedef void (*hw_progress_fn)(void *ctx, const char *step, double done);

typedef struct {
    const char *model_path;   /* the I/O is measured on its file system */
    double seconds_per_point; /* time per measured point (default 0.2 when <= 0); tests use less */
    hw_progress_fn progress;
    void *progress_ctx;
} hw_profile_opts;

/* The machine's identity (cpu, n_cpus, kernels), as a profile records it. */
void hw_profile_identify(hw_profile *h);

/* Measures everything (under a minute on a default run). The storage figures
 * come from the model file when it has 64 MiB or more, else from a scratch
 * file of up to 256 MiB written beside it (unlinked as soon as created, so
 * never left behind). 0, or -1 with err set. */
int hw_profile_measure(hw_profile *h, const model *m, const hw_profile_opts *o, char *err, size_t errlen);

/* The cache file for this machine and the model's file system and FFN type:
 * $XDG_CACHE_HOME/pi2 (else ~/.cache/pi2)/hw-<dev>-<type name>-<row_len>.txt,
 * e.g. hw-2049-q4_0-4096.txt. Only names it (save creates the directory). */
int hw_profile_cache_path(const model *m, const char *model_path, char *out, size_t outlen, char *err, size_t errlen);

/* A text file of "key value" lines, one per field (iops as iops.<KiB>.<depth>,
 * o_direct as 0 or 1, numbers exact: save then load gives the same bits).
 * save writes path.tmp and renames it, creating path's directory if missing.
 * load refuses a file of another version, a missing, repeated or
 * out-of-range field, an unknown key or a line cut short, naming the file,
 * line and key. 0, or -1 with err set (load then leaves h as it was). */
int hw_profile_save(const hw_profile *h, const char *path, char *err, size_t errlen);
int hw_profile_load(hw_profile *h, const char *path, char *err, size_t errlen);
/* The same from an open stream (path names it in messages). */
int hw_profile_read(hw_profile *h, FILE *f, const char *path, char *err, size_t errlen);

/* Random reads per second of `bytes` at queue depth `depth`, interpolated
 * between the measured sizes and depths: the time per read linear in bytes,
 * the reads per second linear in log(depth). A size is credited with the
 * best rate of the sizes from it up (a read can be done as a larger one), so
 * a smaller read is never priced slower than a larger. Otherwise exact at the
 * grid's points; clamped outside it, except that reads above 32 KiB take
 * 32 KiB reads' time times bytes / 32 KiB. */
double hw_io_iops(const hw_profile *h, size_t bytes, int depth);

/* CPU microseconds of the reading thread per random read of `bytes`
 * (checked against its checksum when verify), linear in bytes between the
 * measured sizes (each the least measured from it up, as hw_io_iops),
 * clamped below the smallest and proportional above the largest. */
double hw_io_cpu_us(const hw_profile *h, size_t bytes, bool verify);

/* The storage part of hw_profile_measure (hw_profile_io.c): fills o_direct,
 * iops, io_cpu_us, checked_cpu_us and seq_mbs, calling step(ctx, name) before each of its
 * HW_IO_POINTS points. 0, or -1 with err set. */
/* scratch file or probe, the grid, each size's reads plain and checked beside a busy thread, sequential */
#define HW_IO_GRID_ROUNDS 3 /* the grid's sizes timed in turns this many times, each point its median */
#define HW_IO_POINTS (1 + HW_IO_GRID_ROUNDS * HW_IO_SIZES * HW_IO_DEPTHS + 2 * HW_IO_SIZES + 1)
#define MEMORY_KERNEL_POINTS 5 /* bandwidth on one thread and on all, three kernels */
#define BUS_POINTS 1
typedef void (*hw_step_fn)(void *ctx, const char *step);
int hw_profile_measure_io(hw_profile *h, const char *model_path, double seconds_per_point, hw_step_fn step,
                          void *step_ctx, char *err, size_t errlen);
/* A fresh directory for a measurement's named files, $TMPDIR/pi2-hw-WHAT-XXXXXX (else /tmp), into dir
 * (PATH_MAX bytes); the caller removes it. 0, or -1 with err set. */
int hw_profile_scratch_dir(char *dir, const char *what, char *err, size_t errlen);
/* The wake-up part (hw_profile_wake.c): fills wake_us. 0, or -1 with err set. */
int hw_profile_measure_wake(hw_profile *h, char *err, size_t errlen);
/* The bus part (hw_profile_bus.c): fills bus_rtt_us. 0, or -1 with err set. */
int hw_profile_measure_bus(hw_profile *h, char *err, size_t errlen);

#endif

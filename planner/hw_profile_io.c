/* The hardware profile's storage figures (hw_profile_measure_io): random
 * reads of each bundle size at each queue depth, and sequential reads,
 * through the read engine the stack's readers get (read_engine.h: io_uring,
 * or threads where it is refused), with O_DIRECT, on the file system that
 * holds the model. On the model file itself when it is large enough that its
 * reads do not all sit in the device's cache; else on a scratch file beside
 * it. */
#include "hw_profile.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "plan/bundle.h"
#include "util/clock.h"
#include "util/compare_double.h"
#include "util/log.h"
#include "util/mem_limit.h"
#include "util/read_engine.h"
#include "util/synth_rng.h"

const int hw_io_size_kib[HW_IO_SIZES] = {4, 8, 12, 16, 32};
const int hw_io_depth[HW_IO_DEPTHS] = {1, 2, 4, 8, 16, 32, 64, 128, 256};

#define IO_ALIGN 4096u /* O_DIRECT offsets, lengths and buffers */
#define IO_MAX_DEPTH 256 /* the deepest of hw_io_depth: the engine's depth */
#define SEQ_READ_BYTES ((size_t)1 << 20)
#define SEQ_DEPTH 4
#define IO_BUFFER_BYTES ((size_t)IO_MAX_DEPTH << 15) /* IO_MAX_DEPTH reads of 32 KiB (and SEQ_DEPTH of 1 MiB) */
#define MODEL_MIN_BYTES ((uint64_t)64 << 20)     /* smaller model files: a scratch file instead */
#define SCRATCH_BYTES ((uint64_t)256 << 20)
#define SCRATCH_MIN_BYTES ((uint64_t)16 << 20)

typedef struct {
    read_engine *engine;
    int fd;
    bool direct;       /* fd has O_DIRECT */
    uint64_t span;     /* reads fall in [0, span), a multiple of SEQ_READ_BYTES */
    uint8_t *buffers;  /* IO_BUFFER_BYTES, IO_ALIGN-aligned */
    synth_rng rng;
    uint64_t next_seq; /* offset of the next sequential read */
} io_bench;

static int set_direct(int fd, bool on) {
    const int flags = fcntl(fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(fd, F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT);
}

/* Turns O_DIRECT off after the file system refused an O_DIRECT transfer (EINVAL). */
static void fall_back_to_buffered(io_bench *b, const char *where) {
    log_warn("%s: O_DIRECT refused; the storage figures are for buffered reads (page cache)", where);
    set_direct(b->fd, false);
    b->direct = false;
}

/* One aligned read at offset 0, to learn whether O_DIRECT reads work. */
static int probe_read(io_bench *b, const char *where, char *err, size_t errlen) {
    ssize_t n = pread(b->fd, b->buffers, IO_ALIGN, 0);
    if (n < 0 && errno == EINVAL && b->direct) {
        fall_back_to_buffered(b, where);
        n = pread(b->fd, b->buffers, IO_ALIGN, 0);
    }
    if (n < 0) {
        err_set(err, errlen, "read %s: %s", where, strerror(errno));
        return -1;
    }
    return 0;
}

static int open_model(io_bench *b, const char *path, uint64_t size, char *err, size_t errlen) {
    b->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (b->fd < 0) {
        err_set(err, errlen, "open %s: %s", path, strerror(errno));
        return -1;
    }
    b->direct = set_direct(b->fd, true) == 0;
    if (!b->direct) fall_back_to_buffered(b, path);
    b->span = size / SEQ_READ_BYTES * SEQ_READ_BYTES;
    return probe_read(b, path, err, errlen);
}

/* A quarter of the free space, and when the file lives in the page cache
 * (no O_DIRECT) a quarter of the memory, at most SCRATCH_BYTES, whole MiB. */
static uint64_t scratch_bytes(const char *dir, bool direct) {
    uint64_t bytes = SCRATCH_BYTES;
    struct statvfs vfs;
    if (statvfs(dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize / 4 < bytes)
        bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize / 4;
    mem_limit lim;
    if (!direct && mem_limit_read("", &lim) == 0 && lim.bytes / 4 < bytes) bytes = lim.bytes / 4;
    return bytes / SEQ_READ_BYTES * SEQ_READ_BYTES;
}

/* bytes of random data through fd from offset 0, as O_DIRECT allows (whole
 * aligned buffers); falls back to buffered writes if the first is refused. */
static int write_scratch(io_bench *b, uint64_t bytes, const char *where, char *err, size_t errlen) {
    for (uint64_t off = 0; off < bytes;) {
        const size_t len = bytes - off < IO_BUFFER_BYTES ? (size_t)(bytes - off) : IO_BUFFER_BYTES;
        for (size_t i = 0; i + 8 <= len; i += 8) { /* fresh data: a device that dedups must still store it */
            const uint64_t v = synth_next(&b->rng);
            memcpy(b->buffers + i, &v, sizeof v);
        }
        ssize_t n = pwrite(b->fd, b->buffers, len, (off_t)off);
        if (n < 0 && errno == EINVAL && b->direct && off == 0) {
            fall_back_to_buffered(b, where);
            continue;
        }
        if (n <= 0) {
            err_set(err, errlen, "write %s: %s", where, n < 0 ? strerror(errno) : "nothing written");
            return -1;
        }
        off += (uint64_t)n;
    }
    if (fdatasync(b->fd)) {
        err_set(err, errlen, "fdatasync %s: %s", where, strerror(errno));
        return -1;
    }
    return 0;
}

/* A scratch file of random bytes in dir (so on the model's file system). It
 * is unlinked as soon as it is created: fd keeps it until closed, and nothing
 * is left behind on any return or if the process dies. */
static int open_scratch(io_bench *b, const char *dir, char *err, size_t errlen) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/.pi2-hw-scratch-XXXXXX", dir);
    b->fd = mkostemp(path, O_CLOEXEC);
    if (b->fd < 0) {
        err_set(err, errlen, "create a scratch file in %s: %s", dir, strerror(errno));
        return -1;
    }
    unlink(path);
    b->direct = set_direct(b->fd, true) == 0;
    if (!b->direct) fall_back_to_buffered(b, path);
    /* the first write settles O_DIRECT before the size, which depends on it */
    if (write_scratch(b, IO_ALIGN, path, err, errlen)) return -1;
    b->span = scratch_bytes(dir, b->direct);
    if (b->span < SCRATCH_MIN_BYTES) {
        err_set(err, errlen, "%s: too little free space or memory for a %llu MiB scratch file", dir,
                (unsigned long long)(SCRATCH_MIN_BYTES >> 20));
        return -1;
    }
    log_debug("storage: %llu MiB scratch file in %s, O_DIRECT %s", (unsigned long long)(b->span >> 20), dir,
              b->direct ? "on" : "off");
    if (write_scratch(b, b->span, path, err, errlen)) return -1;
    return probe_read(b, path, err, errlen);
}

/* The model file when it is large enough, else a scratch file in its directory. */
static int open_target(io_bench *b, const char *model_path, char *err, size_t errlen) {
    struct stat st;
    if (stat(model_path, &st)) {
        err_set(err, errlen, "%s: %s", model_path, strerror(errno));
        return -1;
    }
    if ((uint64_t)st.st_size >= MODEL_MIN_BYTES) return open_model(b, model_path, (uint64_t)st.st_size, err, errlen);
    char dir[PATH_MAX];
    const char *slash = strrchr(model_path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", slash == model_path ? 1 : (int)(slash - model_path), model_path);
    return open_scratch(b, dir, err, errlen);
}

enum read_pattern { READ_RANDOM, READ_SEQUENTIAL };

static uint64_t next_offset(io_bench *b, enum read_pattern pattern, size_t bytes) {
    if (pattern == READ_SEQUENTIAL) {
        const uint64_t off = b->next_seq;
        b->next_seq = (off + bytes) % b->span;
        return off;
    }
    const uint64_t slots = (b->span - bytes) / IO_ALIGN + 1;
    return synth_next(&b->rng) % slots * IO_ALIGN;
}

/* Prepares a read of bytes into the buffer of `slot` (the engine has room: at
 * most IO_MAX_DEPTH reads are in flight). */
static void queue_read(io_bench *b, enum read_pattern pattern, size_t bytes, int slot) {
    read_engine_prep(b->engine, b->fd, false, b->buffers + (size_t)slot * bytes, (uint32_t)bytes,
                     next_offset(b, pattern, bytes), -1, (uint64_t)slot);
}

static double thread_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t checked_sink; /* keeps the checksums from being optimised away */

/* Reads per second with `depth` reads of `bytes` kept in flight for about
 * `seconds` (the reads then in flight complete and count); when check, each
 * read's bytes are checksummed as they land, as the io-worker checks a
 * bundle. *cpu_us (if not NULL): this thread's CPU time per read. 0 with
 * err set if a read fails. */
static double reads_per_second(io_bench *b, enum read_pattern pattern, size_t bytes, int depth, double seconds,
                               bool check, double *cpu_us, char *err, size_t errlen) {
    if (depth > IO_MAX_DEPTH || (size_t)depth * bytes > IO_BUFFER_BYTES) {
        err_set(err, errlen, "%d reads of %zu bytes do not fit the engine and buffers", depth, bytes);
        return 0;
    }
    long reads = 0;
    int in_flight = 0, failed = 0;
    const double cpu_start = thread_cpu_seconds();
    const double start = clock_seconds();
    double now = start;
    for (; in_flight < depth; in_flight++) queue_read(b, pattern, bytes, in_flight);
    while (in_flight > 0) {
        const int rc = read_engine_submit(b->engine);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            err_set(err, errlen, "%s submit: %s", read_engine_name(b->engine), strerror(-rc));
            return 0; /* the reads in flight end with the engine */
        }
        read_engine_wait(b->engine, 1, -1);
        now = clock_seconds();
        uint64_t slot;
        int32_t res;
        while (read_engine_pop(b->engine, &slot, &res)) {
            in_flight--;
            if (res < 0 && res != -EAGAIN && res != -EINTR) failed = failed ? failed : res;
            if (res > 0) reads++;
            if (res > 0 && check) checked_sink += bundle_sum_cold(b->buffers + slot * bytes, (size_t)res);
            if (failed || now - start >= seconds) continue;
            queue_read(b, pattern, bytes, (int)slot);
            in_flight++;
        }
    }
    if (failed || reads == 0 || now <= start) {
        err_set(err, errlen, "%zu-byte reads: %s", bytes, failed ? strerror(-failed) : "none completed");
        return 0;
    }
    if (cpu_us) *cpu_us = (thread_cpu_seconds() - cpu_start) * 1e6 / (double)reads;
    return (double)reads / (now - start);
}

/* ---- the reading thread's CPU per read, beside a busy thread on its core ---- */

#define CPU_ROUNDS 3

static atomic_bool spin_stop;

/* a compute worker's stand-in: busy until told to stop */
static void *spin(void *arg) {
    (void)arg;
    volatile uint64_t x = 1;
    while (!atomic_load_explicit(&spin_stop, memory_order_relaxed))
        for (int i = 0; i < 4096; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
    return NULL;
}

/* The stack's io-worker shares a core with a cpu-worker that computes or
 * polls (configs/default.conf): its wake-ups preempt that worker, and its
 * reads then cost about twice the CPU they cost on an idle core (2.8 against
 * 1.3 us, 8 KiB reads at depth 128, Intel Xeon). So the reads are timed with
 * this thread and a busy one pinned to the CPU it runs on; without the leave
 * to pin (a restricted cpuset), on an idle core. Plain, then checked as the
 * io-worker checks bundles, each size's figure the median of CPU_ROUNDS. */
static int measure_read_cpu(hw_profile *h, io_bench *b, double seconds, hw_step_fn step, void *step_ctx, char *err,
                            size_t errlen) {
    cpu_set_t was, one;
    const bool pinned = sched_getaffinity(0, sizeof was, &was) == 0 && sched_getcpu() >= 0;
    CPU_ZERO(&one);
    if (pinned) CPU_SET(sched_getcpu(), &one);
    const bool shared = pinned && sched_setaffinity(0, sizeof one, &one) == 0;
    pthread_t spinner;
    atomic_store(&spin_stop, false);
    const bool spinning = shared && pthread_create(&spinner, NULL, spin, NULL) == 0;
    if (spinning) pthread_setaffinity_np(spinner, sizeof one, &one);
    if (!spinning) log_warn("storage: the reads' CPU time is measured on an idle core (no busy thread beside them)");
    int rc = 0;
    for (int s = 0; s < HW_IO_SIZES && rc == 0; s++)
        for (int check = 0; check < 2 && rc == 0; check++) {
            char name[80];
            snprintf(name, sizeof name, "storage: %d KiB random reads%s beside a busy thread, %d in flight",
                     hw_io_size_kib[s], check ? " checked" : "", HW_IO_CPU_DEPTH);
            step(step_ctx, name);
            /* the median of three: a spell of the shared host once made one size's reads cost 35 times the
             * others' (106 against 3 us) and the planner's prediction at the floor half the measured speed */
            double us[CPU_ROUNDS];
            for (int r = 0; r < CPU_ROUNDS && rc == 0; r++)
                if (reads_per_second(b, READ_RANDOM, (size_t)hw_io_size_kib[s] << 10, HW_IO_CPU_DEPTH,
                                     seconds / 2, check, &us[r], err, errlen) == 0)
                    rc = -1;
            if (rc == 0) {
                qsort(us, CPU_ROUNDS, sizeof *us, compare_double);
                *(check ? &h->checked_cpu_us[s] : &h->io_cpu_us[s]) = us[CPU_ROUNDS / 2];
            }
        }
    if (spinning) {
        atomic_store(&spin_stop, true);
        pthread_join(spinner, NULL);
    }
    if (shared) sched_setaffinity(0, sizeof was, &was);
    return rc;
}

static int measure_grid(hw_profile *h, io_bench *b, double seconds, hw_step_fn step, void *step_ctx, char *err,
                        size_t errlen) {
    /* not kept: the first point of a run was the slowest in some runs (a device or host waking up) */
    if (reads_per_second(b, READ_RANDOM, IO_ALIGN, 1, seconds / 2, false, NULL, err, errlen) == 0) return -1;
    /* The planner weighs bundle sizes against each other, so the sizes at one depth are timed in turns,
     * HW_IO_GRID_ROUNDS times (each starting from another size), and each point keeps its median: a slow
     * spell of the shared disk then slows every size of a round alike instead of one size's only point. */
    double measured[HW_IO_SIZES][HW_IO_DEPTHS][HW_IO_GRID_ROUNDS];
    for (int r = 0; r < HW_IO_GRID_ROUNDS; r++)
        for (int d = 0; d < HW_IO_DEPTHS; d++)
            for (int i = 0; i < HW_IO_SIZES; i++) {
                const int s = (i + r) % HW_IO_SIZES;
                char name[80];
                snprintf(name, sizeof name, "storage: %d KiB random reads, %d in flight (round %d of %d)",
                         hw_io_size_kib[s], hw_io_depth[d], r + 1, HW_IO_GRID_ROUNDS);
                step(step_ctx, name);
                measured[s][d][r] = reads_per_second(b, READ_RANDOM, (size_t)hw_io_size_kib[s] << 10, hw_io_depth[d],
                                                     seconds / HW_IO_GRID_ROUNDS, false, NULL, err, errlen);
                if (measured[s][d][r] == 0) return -1;
            }
    for (int s = 0; s < HW_IO_SIZES; s++)
        for (int d = 0; d < HW_IO_DEPTHS; d++) {
            qsort(measured[s][d], HW_IO_GRID_ROUNDS, sizeof measured[s][d][0], compare_double);
            h->iops[s][d] = measured[s][d][HW_IO_GRID_ROUNDS / 2];
        }
    if (measure_read_cpu(h, b, seconds, step, step_ctx, err, errlen)) return -1;
    step(step_ctx, "storage: sequential 1 MiB reads");
    const double rate = reads_per_second(b, READ_SEQUENTIAL, SEQ_READ_BYTES, SEQ_DEPTH, seconds, false, NULL, err, errlen);
    h->seq_mbs = rate * (double)SEQ_READ_BYTES / 1e6;
    return rate > 0 ? 0 : -1;
}

int hw_profile_measure_io(hw_profile *h, const char *model_path, double seconds_per_point, hw_step_fn step,
                          void *step_ctx, char *err, size_t errlen) {
    io_bench b = {.fd = -1, .rng = synth_stream(synth_key(4, (uint64_t)clock_ns(), 0, 0), 0)};
    int rc = -1;
    step(step_ctx, "storage: preparing");
    if (posix_memalign((void **)&b.buffers, IO_ALIGN, IO_BUFFER_BYTES)) {
        b.buffers = NULL;
        err_set(err, errlen, "storage: out of memory");
        goto out;
    }
    if (!(b.engine = read_engine_open(IO_MAX_DEPTH, err, errlen))) goto out;
    snprintf(h->io_engine, sizeof h->io_engine, "%s", read_engine_name(b.engine));
    if (open_target(&b, model_path, err, errlen)) goto out;
    if (measure_grid(h, &b, seconds_per_point, step, step_ctx, err, errlen)) {
        char why[400];
        snprintf(why, sizeof why, "%s", err);
        err_set(err, errlen, "storage, on %s's file system: %s", model_path, why);
        goto out;
    }
    h->o_direct = b.direct;
    rc = 0;
out:
    read_engine_close(b.engine); /* before the buffers: it ends or waits for any read still in flight */
    if (b.fd >= 0) close(b.fd);
    free(b.buffers);
    return rc;
}

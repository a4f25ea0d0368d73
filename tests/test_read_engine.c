/* The read engines (lib/util/read_engine.h) and the file reader on top of
 * them (lib/util/file_reader.h), each run on both engines: io_uring (where
 * this kernel allows it; counted as skipped where it does not) and the
 * threads (PI2_IO_ENGINE=threads). Checked against the file's bytes as
 * written, not against another read:
 *  - reads land whole at their offsets, each finished once with its own tag;
 *    no more than depth are taken; a read past the end comes back short, one
 *    at the end with 0, one of a closed descriptor with -EBADF;
 *  - waiting for more than are in flight returns at its timeout;
 *  - registered files and buffers work on io_uring, and are refused with
 *    -EOPNOTSUPP on the threads;
 *  - the file reader's jobs (O_DIRECT where aligned, buffered where not, the
 *    unaligned tail of the file) land whole through either engine, queued
 *    and reaped or run as a batch. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/file_reader.h"
#include "util/read_engine.h"
#include "rng.h"
#include "test.h"

#define FILE_BYTES ((size_t)(4 << 20) + 1234) /* an unaligned tail */

static char path[] = "/tmp/pi2-test-read-engine-XXXXXX";
static uint8_t *content; /* what the file holds */

static int write_file(void) {
    const int fd = mkstemp(path);
    if (fd < 0) return -1;
    content = malloc(FILE_BYTES);
    rng_seed(7);
    for (size_t i = 0; i < FILE_BYTES; i++) content[i] = (uint8_t)rng_u32();
    const ssize_t n = write(fd, content, FILE_BYTES);
    close(fd);
    return n == (ssize_t)FILE_BYTES ? 0 : -1;
}

/* [off, off + len) of the file against buf, and the length the read should give */
static bool same_bytes(const uint8_t *buf, uint64_t off, int32_t got, uint32_t len) {
    const uint64_t want = off >= FILE_BYTES ? 0 : off + len > FILE_BYTES ? FILE_BYTES - off : len;
    return got == (int32_t)want && memcmp(buf, content + off, want) == 0;
}

static void test_engine(const char *engine) {
    char err[256];
    const unsigned depth = 8;
    read_engine *e = read_engine_open(depth, err, sizeof err);
    CHECK(e, "%s: open: %s", engine, err);
    if (!e) return;
    CHECK(!strcmp(read_engine_name(e), engine), "asked for %s, got %s", engine, read_engine_name(e));
    const int fd = open(path, O_RDONLY);
    enum { READS = 64, LEN = 20000 };
    uint8_t *bufs = malloc((size_t)READS * LEN);
    uint64_t offs[READS];
    int32_t results[READS];
    int finished_twice = 0, wrong_tags = 0, taken_past_depth = 0, submit_failed = 0;
    bool finished[READS] = {false};
    rng_seed(11);
    int next = 0, done = 0;
    while (done < READS) {
        while (next < READS) {
            offs[next] = rng_u32() % FILE_BYTES;
            if (!read_engine_prep(e, fd, false, bufs + (size_t)next * LEN, LEN, offs[next], -1, (uint64_t)next + 100))
                break;
            next++;
        }
        /* the loop stopped at a full engine: one more is refused too */
        if (next < READS && read_engine_prep(e, fd, false, bufs, 1, 0, -1, 0)) taken_past_depth++;
        submit_failed += read_engine_submit(e) < 0;
        read_engine_wait(e, 1, -1);
        uint64_t tag;
        int32_t res;
        while (read_engine_pop(e, &tag, &res)) {
            const uint64_t i = tag - 100;
            if (tag < 100 || i >= READS) { wrong_tags++; continue; }
            finished_twice += finished[i];
            finished[i] = true;
            results[i] = res;
            done++;
        }
    }
    CHECK(!wrong_tags && !finished_twice && !taken_past_depth && !submit_failed,
          "%s: %d wrong tags, %d finished twice, %d taken past depth %u, %d submissions failed", engine, wrong_tags,
          finished_twice, taken_past_depth, depth, submit_failed);
    int wrong = 0;
    for (int i = 0; i < READS; i++) wrong += !same_bytes(bufs + (size_t)i * LEN, offs[i], results[i], LEN);
    CHECK(wrong == 0, "%s: %d of %d reads differ from the file", engine, wrong, READS);

    /* at the end of the file, and past it; a closed descriptor */
    const uint64_t tail = FILE_BYTES - 100;
    const int closed = dup(fd);
    close(closed);
    read_engine_prep(e, fd, false, bufs, LEN, tail, -1, 1);
    read_engine_prep(e, fd, false, bufs + LEN, LEN, FILE_BYTES, -1, 2);
    read_engine_prep(e, closed, false, bufs + 2 * LEN, LEN, 0, -1, 3);
    read_engine_submit(e);
    int32_t res3[4] = {0};
    for (int got = 0; got < 3;) {
        read_engine_wait(e, 3, 1000);
        uint64_t tag;
        int32_t res;
        while (read_engine_pop(e, &tag, &res))
            if (tag >= 1 && tag <= 3) res3[tag] = res, got++;
    }
    CHECK(same_bytes(bufs, tail, res3[1], LEN) && res3[1] == 100, "%s: the last 100 bytes: %d", engine, res3[1]);
    CHECK(res3[2] == 0, "%s: a read at the end gave %d", engine, res3[2]);
    CHECK(res3[3] == -EBADF, "%s: a closed descriptor gave %d", engine, res3[3]);

    /* nothing in flight: a wait for one ends at its timeout */
    const int64_t t0 = clock_ms();
    read_engine_wait(e, 1, 50);
    const int64_t waited = clock_ms() - t0;
    uint64_t tag;
    int32_t res;
    CHECK(waited >= 40 && !read_engine_pop(e, &tag, &res), "%s: waited %lld ms for nothing", engine,
          (long long)waited);

    /* registered files and buffers */
    const int rf = read_engine_register_files(e, &fd, 1);
    uint8_t *reg = aligned_alloc(4096, 1 << 16);
    const struct iovec iov = {reg, 1 << 16};
    const int rb = read_engine_register_buffers(e, &iov, 1);
    if (!strcmp(engine, "threads")) {
        CHECK(rf == -EOPNOTSUPP && rb == -EOPNOTSUPP, "threads: registering gave %d and %d", rf, rb);
    } else {
        CHECK(rf == 0 && rb == 0, "io_uring: registering gave %d and %d", rf, rb);
        read_engine_prep(e, 0, true, reg + 4096, 8192, 40960, 0, 9); /* file 0, buffer 0 */
        read_engine_submit(e);
        read_engine_wait(e, 1, -1);
        CHECK(read_engine_pop(e, &tag, &res) && tag == 9 && same_bytes(reg + 4096, 40960, res, 8192),
              "io_uring: a read of a registered file into a registered buffer gave %d", res);
    }
    read_engine_close(e);
    close(fd);
    free(reg);
    free(bufs);
}

typedef struct {
    int done;
} count;

static void job_done(void *ctx, io_job *job) {
    (void)job;
    ((count *)ctx)->done++;
}

static void test_file_reader(const char *engine) {
    char err[256];
    file_reader *fr = file_reader_open(path, 8, err, sizeof err);
    CHECK(fr, "%s: file_reader_open: %s", engine, err);
    if (!fr) return;
    CHECK(file_reader_file_size(fr) == FILE_BYTES, "%s: file size %llu", engine,
          (unsigned long long)file_reader_file_size(fr));
    enum { JOBS = 100, MAX_LEN = 3 << 12 };
    uint8_t *bufs = aligned_alloc(4096, (size_t)JOBS * MAX_LEN);
    io_job jobs[JOBS];
    rng_seed(3);
    for (int i = 0; i < JOBS; i++) {
        /* a third aligned (O_DIRECT), a third unaligned (buffered), the rest the file's unaligned tail */
        const int kind = i % 3;
        uint64_t off = kind == 0 ? rng_u32() % (FILE_BYTES / 4096) * 4096 : rng_u32() % FILE_BYTES;
        uint32_t len = kind == 0 ? 4096 * (1 + (uint32_t)(rng_u32() % 3)) : 1 + (uint32_t)(rng_u32() % MAX_LEN);
        if (kind == 2) off = FILE_BYTES / 4096 * 4096, len = MAX_LEN;
        jobs[i] = (io_job){off, len, bufs + (size_t)i * MAX_LEN, 0};
    }
    count c = {0};
    for (int i = 0; i < JOBS / 2; i++) CHECK(file_reader_queue(fr, &jobs[i], job_done, &c) == 0, "queue %d", i);
    while (file_reader_busy(fr)) file_reader_reap(fr, 100);
    CHECK(c.done == JOBS / 2, "%s: %d of %d queued jobs finished", engine, c.done, JOBS / 2);
    file_reader_run(fr, jobs + JOBS / 2, JOBS - JOBS / 2, NULL, NULL);
    int wrong = 0;
    for (int i = 0; i < JOBS; i++)
        wrong += !same_bytes(jobs[i].dest, jobs[i].file_offset, jobs[i].result, jobs[i].length);
    CHECK(wrong == 0, "%s: %d of %d jobs differ from the file", engine, wrong, JOBS);
    file_reader_close(fr);
    free(bufs);
}

int main(void) {
    if (write_file()) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    unsetenv("PI2_IO_ENGINE");
    const char *native = read_engine_probe();
    if (native && !strcmp(native, "io_uring")) {
        test_engine("io_uring");
        test_file_reader("io_uring");
    } else {
        SKIP("io_uring: refused here (the threads engine is tested alone)");
    }
    setenv("PI2_IO_ENGINE", "threads", 1);
    CHECK(read_engine_probe() && !strcmp(read_engine_probe(), "threads"), "PI2_IO_ENGINE=threads is not taken");
    test_engine("threads");
    test_file_reader("threads");
    unlink(path);
    free(content);
    return test_summary();
}

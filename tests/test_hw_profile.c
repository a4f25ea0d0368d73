/* The planner's hardware profile (planner/hw_profile.h):
 *  - a short measurement on a tiny model: every figure positive and finite,
 *    plausible relations between them (loose: the machine is shared), progress
 *    reported in order, the scratch file gone afterwards; no model file, an error;
 *  - save then load gives the same fields, bit for bit;
 *  - load refuses a missing, repeated or unknown key, a non-number, an
 *    out-of-range value, another version, an empty and a truncated file,
 *    each naming the file and the key, and leaves the profile untouched;
 *  - hw_io_iops: exact at the grid's points, in between between them, clamped
 *    outside, larger reads scaled from 32 KiB; a smaller read never priced
 *    slower (rate or CPU) than a larger one measured in a slow spell;
 *  - the cache path under XDG_CACHE_HOME, whose directory save creates.
 * The planner's files belong to a program, not to libpi2: the test compiles them in. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../planner/hw_profile.h"
#include "kernels/kernels.h"
#include "util/read_engine.h"
#include "util/log.h"

#include <dirent.h>
#include <math.h>

#include "mkmodel_run.h"
#include "test.h"

static char dir[] = "/tmp/pi2-test-hw-XXXXXX";

/* ---- measuring ---- */

typedef struct {
    int calls;
    double last;
    bool in_order;
} progress_log;

static void record_progress(void *ctx, const char *step, double done) {
    progress_log *p = ctx;
    p->in_order &= done >= p->last && done <= 1 && step && *step;
    p->last = done;
    p->calls++;
}

/* The names in d, sorted and joined by '/'. */
static void list_dir(const char *d, char *out, size_t outlen) {
    struct dirent **names;
    const int n = scandir(d, &names, NULL, alphasort);
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        snprintf(out + strlen(out), outlen - strlen(out), "%s/", names[i]->d_name);
        free(names[i]);
    }
    if (n >= 0) free(names);
}

static bool positive(double v) { return isfinite(v) && v > 0; }

static void check_measured(const hw_profile *h, const model *m, const char *model_path) {
    struct stat st;
    CHECK(stat(model_path, &st) == 0 && h->fs_dev == (uint64_t)st.st_dev, "fs_dev %llu",
          (unsigned long long)h->fs_dev);
    CHECK(h->version == HW_PROFILE_VERSION && h->n_cpus >= 1 && h->cpu[0], "version %d, %d cpus, cpu '%s'",
          h->version, h->n_cpus, h->cpu);
    CHECK(!strcmp(h->kernels, kernels_best()->name), "kernels %s", h->kernels);
    const char *engine = read_engine_probe();
    CHECK(engine && !strcmp(h->io_engine, engine), "reads by %s where this process reads by %s", h->io_engine,
          engine ? engine : "nothing");
    CHECK(h->weight_type == m->layers[0].gate.type && h->row_len == m->n_embd, "type %u, row %d", h->weight_type,
          h->row_len);
    CHECK(positive(h->mem_gbs_one) && positive(h->mem_gbs_all), "memory %g, %g GB/s", h->mem_gbs_one, h->mem_gbs_all);
    CHECK(h->mem_gbs_all >= 0.5 * h->mem_gbs_one, "all threads %g GB/s against one %g", h->mem_gbs_all,
          h->mem_gbs_one);
    CHECK(positive(h->dense_rows_s) && positive(h->sparse_rows_s) && positive(h->axpy_rows_s),
          "rows/s dense %g, gather %g, axpy %g", h->dense_rows_s, h->sparse_rows_s, h->axpy_rows_s);
    int bad_iops = 0, slower_deep = 0;
    for (int s = 0; s < HW_IO_SIZES; s++) {
        for (int d = 0; d < HW_IO_DEPTHS; d++) bad_iops += !positive(h->iops[s][d]);
        /* depth 32 and deeper at their best against depth 1: one point can be a moment the shared disk
         * stalled (CI once saw one size's depth-32 point under half its depth-1 one) */
        double deep = 0;
        for (int d = 5; d < HW_IO_DEPTHS; d++) deep = fmax(deep, h->iops[s][d]);
        slower_deep += deep < 0.5 * h->iops[s][0];
    }
    CHECK(bad_iops == 0, "%d iops figures not positive", bad_iops);
    CHECK(slower_deep == 0, "%d sizes where depths 32 and more read at under half the rate of depth 1", slower_deep);
    /* small reads are not slower than large ones, each size at its best depth: one depth's figure can be
     * a moment the shared disk stalled (4 KiB at depth 1 once read 3009/s against 32 KiB's 12017) */
    double best4 = 0, best32 = 0;
    for (int d = 0; d < HW_IO_DEPTHS; d++) best4 = fmax(best4, h->iops[0][d]), best32 = fmax(best32, h->iops[4][d]);
    CHECK(best4 >= 0.5 * best32, "4 KiB %g reads/s against 32 KiB %g at their best depths", best4, best32);
    CHECK(positive(h->seq_mbs) && positive(h->bus_rtt_us) && positive(h->wake_us), "seq %g MB/s, bus %g us, wake %g us",
          h->seq_mbs, h->bus_rtt_us, h->wake_us);
    int bad_cpu = 0;
    for (int s = 0; s < HW_IO_SIZES; s++)
        bad_cpu += !positive(h->io_cpu_us[s]) || !positive(h->checked_cpu_us[s]) || h->io_cpu_us[s] > 1e4;
    CHECK(bad_cpu == 0, "%d CPU-per-read figures not positive or over 10 ms (8 KiB: %g, checked %g us)", bad_cpu,
          h->io_cpu_us[1], h->checked_cpu_us[1]);
    CHECK(positive(h->seconds) && h->seconds < 60, "%g s", h->seconds);
}

static void test_measure(const model *m, const char *model_path, hw_profile *h) {
    char before[4096], after[4096], err[512] = "";
    list_dir(dir, before, sizeof before);
    progress_log log = {.in_order = true};
    const hw_profile_opts o = {.model_path = model_path, .seconds_per_point = 0.02, .progress = record_progress,
                               .progress_ctx = &log};
    CHECK(hw_profile_measure(h, m, &o, err, sizeof err) == 0, "measure: %s", err);
    check_measured(h, m, model_path);
    CHECK(log.in_order && log.last == 1.0, "progress out of order or not ending at 1 (%g)", log.last);
    CHECK(log.calls == MEMORY_KERNEL_POINTS + HW_IO_POINTS + BUS_POINTS + 1, "%d progress calls", log.calls);
    list_dir(dir, after, sizeof after);
    CHECK(!strcmp(before, after), "directory was '%s', now '%s'", before, after);
    hw_profile none;
    const hw_profile_opts absent = {.model_path = "/nonexistent/model.gguf", .seconds_per_point = 0.02};
    CHECK(hw_profile_measure(&none, m, &absent, err, sizeof err) == -1 && strstr(err, absent.model_path),
          "measure without a model file: %s", err);
    printf("measured: %s, %s, %g s, memory %.1f / %.1f GB/s, rows/s %.3g / %.3g / %.3g, 4 KiB x1 %.0f, x32 %.0f "
           "reads/s, seq %.0f MB/s, bus %.1f us, wake %.1f us, O_DIRECT %d, reads by %s\n",
           h->cpu, h->kernels, h->seconds, h->mem_gbs_one, h->mem_gbs_all, h->dense_rows_s, h->sparse_rows_s,
           h->axpy_rows_s, h->iops[0][0], h->iops[0][5], h->seq_mbs, h->bus_rtt_us, h->wake_us, h->o_direct,
           h->io_engine);
}

/* ---- the file ---- */

static bool same_profile(const hw_profile *a, const hw_profile *b) {
    return a->version == b->version && !strcmp(a->cpu, b->cpu) && a->n_cpus == b->n_cpus &&
           !strcmp(a->kernels, b->kernels) && a->mem_gbs_one == b->mem_gbs_one && a->mem_gbs_all == b->mem_gbs_all &&
           a->weight_type == b->weight_type && a->row_len == b->row_len && a->dense_rows_s == b->dense_rows_s &&
           a->sparse_rows_s == b->sparse_rows_s && a->axpy_rows_s == b->axpy_rows_s && a->fs_dev == b->fs_dev &&
           a->o_direct == b->o_direct && !strcmp(a->io_engine, b->io_engine) &&
           !memcmp(a->iops, b->iops, sizeof a->iops) &&
           !memcmp(a->io_cpu_us, b->io_cpu_us, sizeof a->io_cpu_us) &&
           !memcmp(a->checked_cpu_us, b->checked_cpu_us, sizeof a->checked_cpu_us) && a->seq_mbs == b->seq_mbs &&
           a->bus_rtt_us == b->bus_rtt_us && a->wake_us == b->wake_us && a->seconds == b->seconds;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "r");
    static char text[16384];
    const size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    return text;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

/* text with the line of `key` replaced by `with` (which ends in '\n', or is "" to drop the line) */
static void replace_line(char *out, size_t outlen, const char *text, const char *key, const char *with) {
    char needle[64];
    snprintf(needle, sizeof needle, "\n%s ", key);
    const char *at = strncmp(text, needle + 1, strlen(needle + 1)) ? strstr(text, needle) + 1 : text;
    const char *end = strchr(at, '\n') + 1;
    snprintf(out, outlen, "%.*s%s%s", (int)(at - text), text, with, end);
}

/* 1-based line of key in text */
static int line_of(const char *text, const char *key) {
    int line = 1;
    for (const char *p = text; *p; p = strchr(p, '\n') + 1, line++)
        if (!strncmp(p, key, strlen(key)) && p[strlen(key)] == ' ') return line;
    return 0;
}

/* load of text must fail with an error holding each of want[] */
static void check_refused(const char *what, const char *text, const char *const *want, int n_want) {
    char path[256], err[512] = "";
    snprintf(path, sizeof path, "%s/bad.txt", dir);
    write_text(path, text);
    hw_profile h = {.n_cpus = 12345};
    CHECK(hw_profile_load(&h, path, err, sizeof err) == -1, "%s: loaded", what);
    CHECK(h.n_cpus == 12345, "%s: profile changed", what);
    for (int i = 0; i < n_want; i++) CHECK(strstr(err, want[i]), "%s: '%s' not in '%s'", what, want[i], err);
    CHECK(strstr(err, path), "%s: no file in '%s'", what, err);
}

static void test_file(const hw_profile *h) {
    char path[256], err[512] = "", bad[20000], at[64];
    snprintf(path, sizeof path, "%s/hw.txt", dir);
    CHECK(hw_profile_save(h, path, err, sizeof err) == 0, "save: %s", err);
    hw_profile loaded;
    CHECK(hw_profile_load(&loaded, path, err, sizeof err) == 0, "load: %s", err);
    CHECK(same_profile(h, &loaded), "loaded profile differs from the saved one");
    const char *text = read_text(path);
    const int n_lines = line_of(text, "seconds");
    /* version cpu n_cpus kernels mem_gbs_one mem_gbs_all weight_type down_type row_len dense_rows_s
     * sparse_rows_s axpy_rows_s fs_dev o_direct io_engine seq_mbs bus_rtt_us wake_us seconds, the IOPS grid and
     * the CPU per read of each size, plain and checked */
    CHECK(n_lines == 19 + HW_IO_SIZES * HW_IO_DEPTHS + 2 * HW_IO_SIZES, "%d lines", n_lines);

    replace_line(bad, sizeof bad, text, "mem_gbs_all", "");
    check_refused("missing", bad, (const char *[]){"mem_gbs_all", "missing"}, 2);

    snprintf(bad, sizeof bad, "%sn_cpus 3\n", text);
    snprintf(at, sizeof at, ":%d: n_cpus: repeated (first at line %d)", n_lines + 1, line_of(text, "n_cpus"));
    check_refused("repeated", bad, (const char *[]){at}, 1);

    snprintf(bad, sizeof bad, "%scolour blue\n", text);
    snprintf(at, sizeof at, ":%d: colour: unknown key", n_lines + 1);
    check_refused("unknown", bad, (const char *[]){at}, 1);

    replace_line(bad, sizeof bad, text, "iops.8.4", "iops.8.4 fast\n");
    snprintf(at, sizeof at, ":%d: iops.8.4: not a number", line_of(text, "iops.8.4"));
    check_refused("not a number", bad, (const char *[]){at}, 1);

    replace_line(bad, sizeof bad, text, "mem_gbs_one", "mem_gbs_one -3\n");
    check_refused("negative", bad, (const char *[]){"mem_gbs_one: out of range"}, 1);
    replace_line(bad, sizeof bad, text, "n_cpus", "n_cpus 0\n");
    check_refused("no cpus", bad, (const char *[]){"n_cpus: out of range"}, 1);
    replace_line(bad, sizeof bad, text, "o_direct", "o_direct yes\n");
    check_refused("not a bool", bad, (const char *[]){"o_direct: not 0 or 1"}, 1);
    replace_line(bad, sizeof bad, text, "weight_type", "weight_type q5_k\n");
    check_refused("not a weight type", bad, (const char *[]){"weight_type: not a weight type"}, 1);
    replace_line(bad, sizeof bad, text, "seq_mbs", "seq_mbs 12x\n");
    check_refused("trailing junk", bad, (const char *[]){"seq_mbs: not a number"}, 1);

    char other[32], said[96];
    snprintf(other, sizeof other, "version %d\n", HW_PROFILE_VERSION + 1);
    snprintf(said, sizeof said, ":1: version: %d, this program reads version %d", HW_PROFILE_VERSION + 1,
             HW_PROFILE_VERSION);
    replace_line(bad, sizeof bad, text, "version", other);
    check_refused("version", bad, (const char *[]){said}, 1);
    snprintf(bad, sizeof bad, "%s", strchr(text, '\n') + 1);
    check_refused("no version", bad, (const char *[]){":1: cpu: the first line must be the version"}, 1);

    check_refused("empty", "", (const char *[]){"version: missing (empty file)"}, 1);

    snprintf(bad, sizeof bad, "%.*s", (int)(strstr(text, "\niops.16.1 ") + 8 - text), text); /* "iops.16" */
    check_refused("cut in a key", bad, (const char *[]){"iops.16: line cut short"}, 1);
    snprintf(bad, sizeof bad, "%.*s", (int)(strstr(text, "\nseq_mbs ") + 1 - text), text);
    check_refused("cut between lines", bad, (const char *[]){"seq_mbs: missing"}, 1);

    snprintf(path, sizeof path, "%s/none.txt", dir);
    CHECK(hw_profile_load(&loaded, path, err, sizeof err) == -1 && strstr(err, path), "absent file: %s", err);
    hw_profile nan_profile = *h;
    nan_profile.seq_mbs = NAN;
    CHECK(hw_profile_save(&nan_profile, path, err, sizeof err) == -1 && strstr(err, "seq_mbs"), "saved NaN: %s", err);
    CHECK(access(path, F_OK) != 0, "a refused save left %s", path);
}

/* ---- the cache path ---- */

static void test_cache_path(const model *m, const char *model_path, const hw_profile *h) {
    char cache[256], path[512], want[512], err[512] = "";
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("XDG_CACHE_HOME", cache, 1);
    struct stat st;
    stat(model_path, &st);
    /* a GGUF Q4_0 model: its quantized ffn_down becomes Q8_0 down_t rows (bundle_down_type) */
    snprintf(want, sizeof want, "%s/pi2/hw-%llu-q4_0-q8_0-%d.txt", cache, (unsigned long long)st.st_dev, m->n_embd);
    CHECK(hw_profile_cache_path(m, model_path, path, sizeof path, err, sizeof err) == 0, "cache path: %s", err);
    CHECK(!strcmp(path, want), "cache path %s, want %s", path, want);
    CHECK(hw_profile_save(h, path, err, sizeof err) == 0, "save into a new directory: %s", err);
    hw_profile loaded;
    CHECK(hw_profile_load(&loaded, path, err, sizeof err) == 0 && same_profile(h, &loaded), "cached: %s", err);
    CHECK(hw_profile_cache_path(m, "/nonexistent/model.gguf", path, sizeof path, err, sizeof err) == -1 &&
              strstr(err, "/nonexistent/model.gguf"),
          "cache path of no file: %s", err);
}

/* ---- interpolation ---- */

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * fabs(b); }

static void test_interpolation(void) {
    hw_profile h = {0};
    for (int s = 0; s < HW_IO_SIZES; s++)
        for (int d = 0; d < HW_IO_DEPTHS; d++) h.iops[s][d] = 1000.0 * (d + 1) / (s + 1);
    int off_grid = 0;
    for (int s = 0; s < HW_IO_SIZES; s++)
        for (int d = 0; d < HW_IO_DEPTHS; d++)
            off_grid += hw_io_iops(&h, (size_t)hw_io_size_kib[s] << 10, hw_io_depth[d]) != h.iops[s][d];
    CHECK(off_grid == 0, "%d grid points not exact", off_grid);
    /* depth 3 between 2 and 4, linear in log(depth) */
    const double d3 = hw_io_iops(&h, 4096, 3), t = log(1.5) / log(2);
    CHECK(d3 > h.iops[0][1] && d3 < h.iops[0][2] && near(d3, h.iops[0][1] + t * (h.iops[0][2] - h.iops[0][1])),
          "depth 3: %g", d3);
    /* 6 KiB between 4 and 8: the time per read halfway */
    const double k6 = hw_io_iops(&h, 6 << 10, 1);
    CHECK(k6 < h.iops[0][0] && k6 > h.iops[1][0] && near(k6, 1 / (0.5 / h.iops[0][0] + 0.5 / h.iops[1][0])),
          "6 KiB: %g", k6);
    const double both = hw_io_iops(&h, 10 << 10, 24);
    CHECK(both < hw_io_iops(&h, 8 << 10, 24) && both > hw_io_iops(&h, 12 << 10, 24), "10 KiB at 24: %g", both);
    CHECK(hw_io_iops(&h, 512, 0) == h.iops[0][0], "below the grid: %g", hw_io_iops(&h, 512, 0));
    CHECK(hw_io_iops(&h, 4096, 1000) == h.iops[0][HW_IO_DEPTHS - 1], "deeper than the grid");
    CHECK(near(hw_io_iops(&h, 64 << 10, 64), h.iops[4][6] / 2), "64 KiB: %g", hw_io_iops(&h, 64 << 10, 64));
    CHECK(near(hw_io_iops(&h, 96 << 10, 2), h.iops[4][1] / 3), "96 KiB: %g", hw_io_iops(&h, 96 << 10, 2));

    /* CPU per read: linear in bytes between the sizes, the checked figures when asked */
    for (int s = 0; s < HW_IO_SIZES; s++) h.io_cpu_us[s] = 1 + s, h.checked_cpu_us[s] = 10 * (1 + s);
    CHECK(hw_io_cpu_us(&h, 8 << 10, false) == 2 && hw_io_cpu_us(&h, 8 << 10, true) == 20, "8 KiB: %g, checked %g",
          hw_io_cpu_us(&h, 8 << 10, false), hw_io_cpu_us(&h, 8 << 10, true));
    CHECK(near(hw_io_cpu_us(&h, 6 << 10, false), 1.5), "6 KiB: %g", hw_io_cpu_us(&h, 6 << 10, false));
    CHECK(hw_io_cpu_us(&h, 512, true) == 10, "below the grid: %g", hw_io_cpu_us(&h, 512, true));
    CHECK(near(hw_io_cpu_us(&h, 64 << 10, false), 10), "64 KiB: %g", hw_io_cpu_us(&h, 64 << 10, false));
}

/* a smaller read measured slower than a larger one (a slow spell) is priced as the larger: never slower */
static void test_smaller_never_slower(void) {
    hw_profile h = {0};
    for (int s = 0; s < HW_IO_SIZES; s++)
        for (int d = 0; d < HW_IO_DEPTHS; d++) h.iops[s][d] = 1000.0 * (d + 1) / (s + 1);
    for (int s = 0; s < HW_IO_SIZES; s++) h.io_cpu_us[s] = h.checked_cpu_us[s] = 1 + s;
    h.iops[1][3] = h.iops[3][3] / 2; /* 8 KiB at depth 8 caught at half the 16 KiB rate */
    h.io_cpu_us[1] = 100;            /* and its CPU per read in a spike */
    CHECK(hw_io_iops(&h, 8 << 10, 8) == h.iops[2][3], "8 KiB at 8: %g, want 12 KiB's %g", hw_io_iops(&h, 8 << 10, 8),
          h.iops[2][3]);
    CHECK(hw_io_iops(&h, 4 << 10, 8) == h.iops[0][3], "4 KiB keeps its own: %g", hw_io_iops(&h, 4 << 10, 8));
    CHECK(hw_io_iops(&h, 8 << 10, 16) == h.iops[1][4], "another depth keeps its own: %g",
          hw_io_iops(&h, 8 << 10, 16));
    const double k6 = hw_io_iops(&h, 6 << 10, 8);
    CHECK(near(k6, 1 / (0.5 / h.iops[0][3] + 0.5 / h.iops[2][3])), "6 KiB between 4 and the credited 8: %g", k6);
    int slower = 0;
    for (int d = 0; d < HW_IO_DEPTHS; d++)
        for (int kib = 4; kib < 32; kib++)
            slower += hw_io_iops(&h, (size_t)kib << 10, hw_io_depth[d]) <
                      hw_io_iops(&h, (size_t)(kib + 1) << 10, hw_io_depth[d]);
    CHECK(slower == 0, "%d sizes priced slower than the next KiB up", slower);
    CHECK(hw_io_cpu_us(&h, 8 << 10, false) == 3 && hw_io_cpu_us(&h, 8 << 10, true) == 2,
          "8 KiB's CPU: %g (12 KiB's 3), checked %g (its own 2)", hw_io_cpu_us(&h, 8 << 10, false),
          hw_io_cpu_us(&h, 8 << 10, true));
    CHECK(hw_io_cpu_us(&h, 4 << 10, false) == 1, "4 KiB's CPU: %g", hw_io_cpu_us(&h, 4 << 10, false));
}

int main(void) {
    log_init("test_hw_profile");
    test_interpolation();
    test_smaller_never_slower();
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return test_summary();
    }
    char model_path[256], err[512] = "";
    CHECK(mkmodel_run(dir, "tiny.gguf", "--preset tiny --type q4_0", model_path, sizeof model_path) == 0, "mkmodel");
    model m;
    if (model_load(&m, model_path, err, sizeof err) == 0) {
        hw_profile h;
        test_measure(&m, model_path, &h);
        test_file(&h);
        test_cache_path(&m, model_path, &h);
        /* the storage through the threads, as where io_uring is refused: measured, and said so */
        setenv("PI2_IO_ENGINE", "threads", 1);
        hw_profile t;
        test_measure(&m, model_path, &t);
        CHECK(!strcmp(t.io_engine, "threads"), "PI2_IO_ENGINE=threads: the profile says reads by %s", t.io_engine);
        unsetenv("PI2_IO_ENGINE");
        model_free(&m);
    } else {
        CHECK(0, "model_load: %s", err);
    }
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "removing %s", dir);
    return test_summary();
}

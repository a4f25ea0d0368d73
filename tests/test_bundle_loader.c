/* The io-worker's bundle loads (io-worker/bundle_loader.h), on a tiny PWRI
 * model's bundle file read into a neuron cache, through io_uring (where this
 * kernel allows it; else counted as skipped) and again through the threads
 * engine (lib/util/read_engine.h: PI2_IO_ENGINE=threads):
 *  - loaded bundles are pinned with exactly the file's bytes (compared with
 *    the mapped file, not with what the loader read), asked-for-again ones
 *    are not read again, keys outside the file are refused;
 *  - a corrupted read, a short read and an I/O error are read again and end
 *    right; when they persist the batch fails naming the bundle, its offset
 *    and the file, that bundle is not cached and the rest of the batch is;
 *  - with checking off a corruption is not caught (the switch is real);
 *  - with every slot pinned, bundles that find no slot are counted. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../io-worker/bundle_loader.h"
#include "engine/model.h"
#include "mkmodel_run.h"
#include "util/read_engine.h"
#include "test.h"

static char dir[] = "/tmp/pi2-test-loader-XXXXXX";

typedef struct {
    bundle_file b;
    char path[600];
    file_reader *reader;
    void *table;
    uint8_t *data;
    ncache *cache;
    bundle_loader l;
} fixture;

static int fixture_make(fixture *f, uint32_t slots) {
    char model_path[512], err[512];
    memset(f, 0, sizeof *f);
    if (mkmodel_run(dir, "m.pwri", "--preset tiny --act relu --pwri --seed 9", model_path, sizeof model_path)) return -1;
    model m;
    if (model_load(&m, model_path, err, sizeof err)) return -1;
    snprintf(f->path, sizeof f->path, "%s/bundles.gguf", dir);
    int rc = bundle_write(&m, model_path, NULL, 2, f->path, NULL, NULL, err, sizeof err) ||
             bundle_open(&f->b, f->path, &m, model_path, err, sizeof err);
    model_free(&m);
    if (rc) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    f->reader = file_reader_open(f->path, 8, err, sizeof err);
    const char *asked = getenv("PI2_IO_ENGINE");
    if (f->reader && strcmp(file_reader_engine(f->reader), asked ? asked : "io_uring"))
        CHECK(0, "the bundle file is read by %s, not %s", file_reader_engine(f->reader), asked ? asked : "io_uring");
    const ncache_shape s = {(uint32_t)f->b.n_layer, 1, (uint32_t)f->b.n_bundles, slots, f->b.stride};
    const size_t tb = ncache_table_bytes(&s);
    f->table = aligned_alloc(64, (tb + 63) / 64 * 64);
    f->data = aligned_alloc(4096, slots * f->b.stride);
    f->cache = f->reader && f->table && f->data
                   ? ncache_create(f->table, tb, f->data, slots * f->b.stride, &s, err, sizeof err)
                   : NULL;
    if (!f->cache) return -1;
    f->l = (bundle_loader){.b = &f->b, .path = f->path, .reader = f->reader, .cache = f->cache, .verify = true};
    return 0;
}

static void fixture_free(fixture *f) {
    bundle_loader_drain(&f->l);
    ncache_detach(f->cache);
    file_reader_close(f->reader);
    bundle_close(&f->b);
    free(f->table), free(f->data);
}

/* the cached bundle equals the file's bytes */
static bool cached_right(fixture *f, bundle_key k) {
    ncache_ref ref;
    const uint8_t *p = ncache_pin(f->cache, k.layer, 0, k.bundle, &ref);
    if (!p) return false;
    const bool same = memcmp(p, f->b.region[k.layer] + (size_t)k.bundle * f->b.stride, f->b.stride) == 0;
    ncache_unpin(f->cache, &ref);
    return same;
}

/* A batch's answer, with whether its keys were all cached right when it came. */
typedef struct {
    fixture *f;
    const bundle_key *keys;
    int n;
    bool done, all_cached;
    bundle_batch_result res;
} watched;

static void on_watched(void *ctx, const bundle_batch_result *r) {
    watched *w = ctx;
    w->done = true;
    w->res = *r;
    w->all_cached = true;
    for (int i = 0; i < w->n; i++) w->all_cached &= cached_right(w->f, w->keys[i]);
}

/* One batch, waited for: 0, or -1 with its error */
static int load(fixture *f, const bundle_key *keys, int n, int *unplaced, char *err, size_t errlen) {
    watched w = {f, keys, 0, false, false, {0}}; /* n 0: nothing looked at when it is answered */
    if (bundle_loader_start(&f->l, keys, n, on_watched, &w, err, errlen)) return -1;
    while (!w.done) bundle_loader_poll(&f->l, 100);
    if (unplaced) *unplaced = (int)w.res.unplaced;
    if (!w.res.error[0]) return 0;
    snprintf(err, errlen, "%s", w.res.error);
    return -1;
}

typedef struct {
    bundle_key target;
    int times;  /* how many reads of the target to break; -1: all */
    int kind;   /* 0 corrupt, 1 short, 2 EIO */
    int broken;
} fault_plan;

static void inject(void *ctx, const bundle_key *key, io_job *job) {
    fault_plan *fp = ctx;
    if (key->layer != fp->target.layer || key->bundle != fp->target.bundle) return;
    if (fp->times >= 0 && fp->broken >= fp->times) return;
    fp->broken++;
    if (fp->kind == 0) job->dest[100] ^= 0x40;
    else if (fp->kind == 1) job->result -= 4096;
    else job->result = -EIO;
}

static void test_loads(void) {
    fixture f;
    if (fixture_make(&f, 16)) {
        CHECK(0, "fixture");
        return;
    }
    bundle_key keys[10];
    for (int i = 0; i < 10; i++) keys[i] = (bundle_key){(uint32_t)(i % f.b.n_layer), (uint32_t)(3 * i + 1)};
    char err[512] = "";
    int unplaced = -1;
    CHECK(load(&f, keys, 10, &unplaced, err, sizeof err) == 0 && unplaced == 0, "load: %s", err);
    int right = 0;
    for (int i = 0; i < 10; i++) right += cached_right(&f, keys[i]);
    CHECK(right == 10, "%d of 10 loaded bundles hold the file's bytes", right);
    CHECK(f.l.stats.bundles == 10 && f.l.stats.bytes == 10 * f.b.stride, "stats: %llu bundles",
          (unsigned long long)f.l.stats.bundles);
    CHECK(load(&f, keys, 3, NULL, err, sizeof err) == 0 && f.l.stats.already == 3 &&
              f.l.stats.bundles == 10,
          "bundles asked for again are not read again");
    bundle_key twice[3] = {{0, 40}, {1, 41}, {0, 40}};
    const uint64_t before = f.l.stats.bundles, already = f.l.stats.already;
    CHECK(load(&f, twice, 3, NULL, err, sizeof err) == 0 && f.l.stats.bundles == before + 2 &&
              f.l.stats.already == already + 1 && cached_right(&f, twice[0]),
          "a key twice in a batch is read once");
    bundle_key bad = {(uint32_t)f.b.n_layer, 0};
    CHECK(load(&f, &bad, 1, NULL, err, sizeof err) != 0 && strstr(err, "no layer"),
          "a key outside the file: %s", err);
    fixture_free(&f);
}

static void test_faults(void) {
    const char *kinds[] = {"a corrupted read", "a short read", "an I/O error"};
    const char *says[] = {"checksum", "short read", "Input/output error"};
    for (int kind = 0; kind < 3; kind++) {
        fixture f;
        if (fixture_make(&f, 16)) {
            CHECK(0, "fixture");
            return;
        }
        bundle_key keys[4] = {{0, 1}, {1, 2}, {0, 5}, {1, 7}};
        fault_plan fp = {keys[2], 1, kind, 0};
        f.l.fault = inject, f.l.fault_ctx = &fp;
        char err[512] = "";
        CHECK(load(&f, keys, 4, NULL, err, sizeof err) == 0 && cached_right(&f, keys[2]) &&
                  f.l.stats.retries == 1,
              "%s once is read again and ends right (%s, %llu retries)", kinds[kind], err,
              (unsigned long long)f.l.stats.retries);
        fixture_free(&f);

        if (fixture_make(&f, 16)) return;
        fault_plan always = {keys[1], -1, kind, 0};
        f.l.fault = inject, f.l.fault_ctx = &always;
        const int rc = load(&f, keys, 4, NULL, err, sizeof err);
        char offset[64];
        snprintf(offset, sizeof offset, "file offset %llu", (unsigned long long)bundle_file_offset(&f.b, 1, 2));
        CHECK(rc != 0 && strstr(err, f.path) && strstr(err, "layer 1 bundle 2") && strstr(err, offset) &&
                  strstr(err, says[kind]),
              "%s that persists fails the batch naming bundle, offset, file and cause: %s", kinds[kind], err);
        ncache_ref ref;
        CHECK(ncache_pin(f.cache, 1, 0, 2, &ref) == NULL && always.broken == BUNDLE_READ_TRIES,
              "the failed bundle is not cached (%d reads)", always.broken);
        CHECK(cached_right(&f, keys[0]) && cached_right(&f, keys[2]) && cached_right(&f, keys[3]),
              "the rest of the batch is cached right");
        fixture_free(&f);
    }
    fixture f;
    if (fixture_make(&f, 16)) return;
    f.l.verify = false;
    bundle_key k = {0, 3};
    fault_plan fp = {k, 1, 0, 0};
    f.l.fault = inject, f.l.fault_ctx = &fp;
    char err[512];
    CHECK(load(&f, &k, 1, NULL, err, sizeof err) == 0 && !cached_right(&f, k),
          "with checking off a corrupted read is published (the switch is real)");
    fixture_free(&f);
}

static void test_full(void) {
    fixture f;
    if (fixture_make(&f, 4)) return;
    bundle_key keys[4] = {{0, 0}, {0, 1}, {0, 2}, {0, 3}};
    char err[512];
    CHECK(load(&f, keys, 4, NULL, err, sizeof err) == 0, "fill: %s", err);
    ncache_ref refs[4];
    for (int i = 0; i < 4; i++) ncache_pin(f.cache, 0, 0, (uint32_t)i, &refs[i]);
    bundle_key more[2] = {{1, 0}, {1, 1}};
    int unplaced = 0;
    CHECK(load(&f, more, 2, &unplaced, err, sizeof err) == 0 && unplaced == 2,
          "with every slot pinned, 2 bundles find no slot (%d)", unplaced);
    for (int i = 0; i < 4; i++) ncache_unpin(f.cache, &refs[i]);
    CHECK(load(&f, more, 2, &unplaced, err, sizeof err) == 0 && unplaced == 0 &&
              cached_right(&f, more[0]) && cached_right(&f, more[1]),
          "unpinned, they load");
    fixture_free(&f);
}

static void test_concurrent(void) {
    fixture f;
    if (fixture_make(&f, 16)) {
        CHECK(0, "fixture");
        return;
    }
    const bundle_key a[3] = {{0, 1}, {0, 2}, {1, 3}}, b[2] = {{1, 3}, {0, 4}};
    watched wa = {&f, a, 3, false, false, {0}}, wb = {&f, b, 2, false, false, {0}};
    char err[512] = "";
    CHECK(bundle_loader_start(&f.l, a, 3, on_watched, &wa, err, sizeof err) == 0 &&
              bundle_loader_start(&f.l, b, 2, on_watched, &wb, err, sizeof err) == 0 && bundle_loader_busy(&f.l) == 2,
          "two batches in flight: %s", err);
    while (!wa.done || !wb.done) bundle_loader_poll(&f.l, 100);
    CHECK(wa.all_cached && wb.all_cached && !wa.res.error[0] && !wb.res.error[0],
          "each batch is answered once all its bundles are cached, the shared one too");
    CHECK(f.l.stats.bundles == 4 && wa.res.loaded == 3 && wb.res.loaded == 1 && bundle_loader_busy(&f.l) == 0,
          "the bundle both asked for is read once (%llu reads; %u + %u)", (unsigned long long)f.l.stats.bundles,
          wa.res.loaded, wb.res.loaded);
    const bundle_key c[1] = {{1, 5}}, d[2] = {{1, 5}, {0, 6}};
    fault_plan always = {c[0], -1, 2, 0};
    f.l.fault = inject, f.l.fault_ctx = &always;
    watched wc = {&f, c, 1, false, false, {0}}, wd = {&f, d, 2, false, false, {0}};
    bundle_loader_start(&f.l, c, 1, on_watched, &wc, err, sizeof err);
    bundle_loader_start(&f.l, d, 2, on_watched, &wd, err, sizeof err);
    while (!wc.done || !wd.done) bundle_loader_poll(&f.l, 100);
    CHECK(strstr(wc.res.error, "layer 1 bundle 5") && strstr(wd.res.error, "layer 1 bundle 5") &&
              cached_right(&f, d[1]) && always.broken == BUNDLE_READ_TRIES,
          "a shared read that keeps failing fails both batches, once read %d times: %s", always.broken, wd.res.error);
    fixture_free(&f);
}

static void test_all(void) {
    test_loads();
    test_concurrent();
    test_faults();
    test_full();
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    unsetenv("PI2_IO_ENGINE");
    const char *native = read_engine_probe();
    if (native && !strcmp(native, "io_uring")) test_all();
    else SKIP("io_uring: refused here (the loads are tested through the threads engine alone)");
    setenv("PI2_IO_ENGINE", "threads", 1);
    test_all();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}

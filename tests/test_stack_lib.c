/* lib/stack/stack.c: the activation layout, KV and weight region sizes, rebasing a
 * model into a segment image, the decode work split, the control block and
 * the cross-process barrier. Expected values come from the oracle README,
 * the file's size (stat) and the model file's own bytes, not from stack.c. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "oracle.h"
#include "stack/stack.h"
#include "test.h"

static void oracle_path(char *buf, size_t len, const char *file) { snprintf(buf, len, "%s/oracle/%s", shared_dir(), file); }

static int load(model *m, const char *file) {
    char path[1024], err[512];
    oracle_path(path, sizeof path, file);
    if (model_load(m, path, err, sizeof err)) {
        CHECK(0, "%s", err);
        return -1;
    }
    return 0;
}

/* ---- act layout ---- */

typedef struct {
    const char *name;
    uint64_t off, bytes;
} span;

static int by_offset(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static void test_act_layout(const model *m, int max_prefill) {
    stack_params p = {512, 2, max_prefill, FFN_DENSE};
    act_layout L;
    act_layout_compute(&L, m, &p);
    uint64_t f = sizeof(float);
    span s[] = {{"x_layers", L.x_layers, (uint64_t)(m->n_layer + 1) * m->n_embd * f},
                {"x_mid", L.x_mid, (uint64_t)m->n_embd * f},
                {"att_out", L.att_out, (uint64_t)m->n_embd * f},
                {"hb", L.hb, (uint64_t)m->n_ff * f},
                {"ffn_partials", L.ffn_partials, (uint64_t)ffn_chunk_count(m) * m->n_embd * f},
                /* one queue per worker: a cursor word, then an entry per chunk */
                {"chunk_queues", L.chunk_queues, 2 * (8 + (uint64_t)ffn_chunk_count(m) * 4)},
                {"logits", L.logits, (uint64_t)m->n_vocab * f},
                {"tokens", L.tokens, (uint64_t)max_prefill * sizeof(int32_t)}};
    int n = (int)(sizeof s / sizeof *s);
    for (int i = 0; i < n; i++) CHECK(s[i].off % 64 == 0, "%s at %llu is not 64-byte aligned", s[i].name, (unsigned long long)s[i].off);
    qsort(s, (size_t)n, sizeof *s, by_offset);
    for (int i = 0; i + 1 < n; i++)
        CHECK(s[i].off + s[i].bytes <= s[i + 1].off, "%s overlaps %s", s[i].name, s[i + 1].name);
    uint64_t end = s[n - 1].off + s[n - 1].bytes;
    CHECK(L.total >= end && L.total - end < 64 && L.total % 64 == 0, "total %llu for data ending at %llu",
          (unsigned long long)L.total, (unsigned long long)end);
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) sum += s[i].bytes;
    CHECK(L.total < sum + 64u * (uint64_t)n, "total %llu wastes more than alignment over %llu", (unsigned long long)L.total,
          (unsigned long long)sum);
}

/* ---- weights and KV regions ---- */

static void test_regions(const model *m, const char *file) {
    char path[1024];
    oracle_path(path, sizeof path, file);
    struct stat st;
    CHECK(stat(path, &st) == 0, "stat %s", path);
    uint64_t off = weights_file_offset(m), bytes = weights_region_bytes(m), size = (uint64_t)st.st_size;
    CHECK(off % 4096 == 0 && off <= m->gguf.data_offset && m->gguf.data_offset - off < 4096,
          "%s: offset %llu for data at %llu", file, (unsigned long long)off, (unsigned long long)m->gguf.data_offset);
    CHECK(bytes % 4096 == 0 && off + bytes >= size && off + bytes - size < 4096, "%s: region %llu from %llu for a %llu-byte file",
          file, (unsigned long long)bytes, (unsigned long long)off, (unsigned long long)size);
    /* the data section starts where the last tensor-info ends, padded to general.alignment (32) */
    CHECK(m->gguf.data_offset % 32 == 0, "%s: data offset %llu not aligned", file, (unsigned long long)m->gguf.data_offset);
}

static void test_kv_bytes(const model *m) {
    /* stories260K (oracle README): 5 layers, dim 64, 8 heads, 4 KV heads -> kv_dim 32; F16 */
    CHECK(kv_region_bytes(m, 512) == 5ull * 512 * 32 * 2, "stories260K kv bytes %llu",
          (unsigned long long)kv_region_bytes(m, 512));
    CHECK(kv_region_bytes(m, 1) == 5ull * 32 * 2, "one position");
}

/* ---- rebase ---- */

static void check_tensor(const char *what, const weight *rebased, const weight *orig, const uint8_t *image, uint64_t image_bytes,
                         uint64_t file_off, const model *om) {
    if (!orig->data) return;
    uint64_t bytes = (uint64_t)orig->rows * orig->row_bytes;
    const uint8_t *p = rebased->data;
    CHECK(p >= image && (uint64_t)(p - image) + bytes <= image_bytes, "%s outside the image", what);
    CHECK((uint64_t)(p - image) + file_off == (uint64_t)((const uint8_t *)orig->data - om->gguf.base), "%s at the wrong offset",
          what);
    CHECK(!memcmp(p, orig->data, bytes), "%s bytes differ from the file's", what);
}

static uint64_t tensor_end(const weight *w, const model *m, uint64_t so_far) {
    if (!w->data) return so_far;
    uint64_t end = (uint64_t)((const uint8_t *)w->data - m->gguf.base) + (uint64_t)w->rows * w->row_bytes;
    return end > so_far ? end : so_far;
}

static void test_rebase(const char *file) {
    model a, b;
    if (load(&a, file) || load(&b, file)) return;
    uint64_t off = weights_file_offset(&a), bytes = weights_region_bytes(&a);
    uint8_t *image = aligned_alloc(4096, bytes);
    memset(image, 0xA5, bytes);
    memcpy(image, a.gguf.base + off, a.gguf.size - off);
    CHECK(model_rebase(&b, image, bytes) == 0, "%s: rebase", file);
    check_tensor("token_embd", &b.tok_embd, &a.tok_embd, image, bytes, off, &a);
    check_tensor("output", &b.output, &a.output, image, bytes, off, &a);
    for (int l = 0; l < a.n_layer; l++) {
        const layer_weights *x = &a.layers[l], *y = &b.layers[l];
        check_tensor("wq", &y->wq, &x->wq, image, bytes, off, &a);
        check_tensor("wk", &y->wk, &x->wk, image, bytes, off, &a);
        check_tensor("wv", &y->wv, &x->wv, image, bytes, off, &a);
        check_tensor("wo", &y->wo, &x->wo, image, bytes, off, &a);
        check_tensor("gate", &y->gate, &x->gate, image, bytes, off, &a);
        check_tensor("up", &y->up, &x->up, image, bytes, off, &a);
        check_tensor("down", &y->down, &x->down, image, bytes, off, &a);
    }
    /* where the last weight ends: an image one byte shorter cannot hold it */
    uint64_t last_end = 0;
    const weight *all[] = {&a.tok_embd, &a.output};
    for (int i = 0; i < 2; i++) last_end = tensor_end(all[i], &a, last_end);
    for (int l = 0; l < a.n_layer; l++) {
        const layer_weights *x = &a.layers[l];
        const weight *lw[] = {&x->wq, &x->wk, &x->wv, &x->wo, &x->gate, &x->up, &x->down};
        for (int i = 0; i < 7; i++) last_end = tensor_end(lw[i], &a, last_end);
    }
    model c;
    if (!load(&c, file)) {
        /* an image that ends where the data section begins holds no tensor */
        CHECK(model_rebase(&c, image, a.gguf.data_offset - off) == -1, "%s: a too-small image was accepted", file);
        model_free(&c);
    }
    if (!load(&c, file)) {
        CHECK(model_rebase(&c, image, last_end - off - 1) == -1, "%s: an image one byte short was accepted", file);
        model_free(&c);
    }
    free(image);
    model_free(&a);
    model_free(&b);
}

/* ---- work split ---- */

static void check_cover(const char *what, long n, const work_share *s, int nw, size_t begin_off, size_t end_off) {
    int *seen = calloc((size_t)n + 1, sizeof(int));
    for (int w = 0; w < nw; w++) {
        long b = *(const long *)((const char *)&s[w] + begin_off), e = *(const long *)((const char *)&s[w] + end_off);
        CHECK(0 <= b && b <= e && e <= n, "%s of worker %d/%d = [%ld, %ld) outside [0, %ld)", what, w, nw, b, e, n);
        for (long i = b < 0 ? 0 : b; i < e && i < n; i++) seen[i]++;
    }
    int bad = 0;
    for (long i = 0; i < n; i++) bad += seen[i] != 1;
    CHECK(bad == 0, "%s with %d workers: %d items not covered exactly once", what, nw, bad);
    free(seen);
}

static void test_work_share(void) {
    model m = {0};
    m.n_head_kv = 4;
    m.n_embd = 100;
    m.n_ff = 343;
    m.n_vocab = 517;
    for (int nw = 1; nw <= 5; nw++) {
        work_share s[5];
        for (int w = 0; w < nw; w++) work_share_compute(&s[w], &m, w, nw);
        check_cover("KV heads", m.n_head_kv, s, nw, offsetof(work_share, kvh_begin), offsetof(work_share, kvh_end));
        check_cover("rows", m.n_embd, s, nw, offsetof(work_share, row_begin), offsetof(work_share, row_end));
        check_cover("neurons", m.n_ff, s, nw, offsetof(work_share, ff_begin), offsetof(work_share, ff_end));
        check_cover("vocab", m.n_vocab, s, nw, offsetof(work_share, vocab_begin), offsetof(work_share, vocab_end));
        /* every process computes the same split */
        work_share again;
        work_share_compute(&again, &m, nw - 1, nw);
        CHECK(!memcmp(&again, &s[nw - 1], sizeof again), "split not deterministic");
    }
}

/* The neuron chunks of ffn_chunks.h: whole Q8_0 blocks, covering [0, n_ff) in order. */
static void test_ffn_chunks(void) {
    const int sizes[] = {1, 31, 32, 172, 343, 1376, 5632, 11008, 13824, 28672};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        model m = {0};
        m.n_ff = sizes[i];
        int size = ffn_chunk_neurons(&m), n = ffn_chunk_count(&m);
        long expect = 0, n0, n1;
        int ok = size % 32 == 0 && size <= 512 && n >= 1;
        for (int c = 0; c < n; c++) {
            ffn_chunk_range(&m, c, &n0, &n1);
            ok &= n0 == expect && n1 > n0 && n1 - n0 <= size && n0 % 32 == 0;
            expect = n1;
        }
        CHECK(ok && expect == m.n_ff, "n_ff %d: chunks of %d x %d do not tile [0, n_ff) on block boundaries", m.n_ff,
              n, size);
    }
}

/* ---- control block ---- */

static void test_ctl(void) {
    stack_ctl *c = calloc(1, sizeof *c);
    stack_params p = {2048, 2, 512, FFN_DENSE};
    char err[512];
    ctl_init(c, &p, "/models/a.gguf", 12345, NULL, NULL);
    CHECK(ctl_check(c, "/models/a.gguf", 12345, err, sizeof err) == 0, "matching model refused: %s", err);
    CHECK(ctl_check(c, "/models/b.gguf", 12345, err, sizeof err) == -1, "another path accepted");
    CHECK(ctl_check(c, "/models/a.gguf", 12346, err, sizeof err) == -1, "another size accepted");
    CHECK(atomic_load(&c->epoch) != 0 && atomic_load(&c->weights_ready) == 0, "fresh epoch/weights_ready");
    c->params.n_cpu_workers = 0;
    CHECK(ctl_check(c, "/models/a.gguf", 12345, err, sizeof err) == -1, "0 cpu workers accepted");
    c->params.n_cpu_workers = 2;
    c->magic ^= 1;
    CHECK(ctl_check(c, "/models/a.gguf", 12345, err, sizeof err) == -1, "bad magic accepted");
    c->magic ^= 1;

    int64_t before = clock_ms();
    proc_row *r = ctl_proc_claim(c, "cpu-worker.0", 100);
    CHECK(r && r->starts == 1 && r->pid == 100 && r->state == PROC_STARTING && r->heartbeat_ms >= before, "first claim");
    proc_row *again = ctl_proc_claim(c, "cpu-worker.0", 200);
    CHECK(again == r && r->starts == 2 && r->pid == 200, "a restart reuses the row and counts the start");
    ctl_proc_beat(r, PROC_READY);
    CHECK(r->state == PROC_READY, "beat sets the state");
    char name[32];
    for (int i = 1; i < STACK_MAX_PROCS; i++) {
        snprintf(name, sizeof name, "p%d", i);
        CHECK(ctl_proc_claim(c, name, i) != NULL, "row %d", i);
    }
    CHECK(ctl_proc_claim(c, "one-too-many", 1) == NULL, "a full table gave a row");
    CHECK(ctl_proc_claim(c, "p5", 55) != NULL, "a full table still finds an existing name");
    free(c);
}

/* ---- barrier across processes ---- */

#define PROCS 3
#define PHASES 1000

typedef struct {
    stack_ctl ctl;
    _Atomic int phase_of[PROCS];
} shared_area;

/* Each child publishes its phase, meets the others, checks they all published the same phase, meets again. */
static int barrier_child(shared_area *s, int me, uint32_t epoch) {
    int bad = 0;
    for (int i = 0; i < PHASES; i++) {
        atomic_store(&s->phase_of[me], i);
        if (ctl_barrier_wait(&s->ctl, epoch, PROCS, 10000)) return 100;
        for (int j = 0; j < PROCS; j++) bad += atomic_load(&s->phase_of[j]) != i;
        if (ctl_barrier_wait(&s->ctl, epoch, PROCS, 10000)) return 100;
    }
    return bad > 99 ? 99 : bad;
}

static void test_barrier(void) {
    shared_area *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(s != MAP_FAILED, "mmap");
    if (s == MAP_FAILED) return;
    stack_params p = {16, PROCS, 1, FFN_DENSE};
    ctl_init(&s->ctl, &p, "m", 1, NULL, NULL);
    uint32_t epoch = (uint32_t)atomic_load(&s->ctl.epoch);
    pid_t kids[PROCS];
    for (int i = 0; i < PROCS; i++)
        if ((kids[i] = fork()) == 0) _exit(barrier_child(s, i, epoch));
    for (int i = 0; i < PROCS; i++) {
        int st = 0;
        waitpid(kids[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status %d (100 = barrier failed, else lock-step violations)", i,
              WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }

    /* a new epoch releases a waiter whose peer never comes */
    pid_t kid = fork();
    if (kid == 0) {
        int64_t t0 = clock_ms();
        int rc = ctl_barrier_wait(&s->ctl, epoch, 2, 20000);
        _exit(rc == -1 && clock_ms() - t0 < 10000 ? 0 : 1);
    }
    nanosleep(&(struct timespec){0, 100000000L}, NULL);
    uint32_t next = ctl_new_epoch(&s->ctl);
    CHECK(next == epoch + 1 && atomic_load(&s->ctl.epoch) == next, "new epoch %u after %u", next, epoch);
    int st = 0;
    waitpid(kid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "an epoch change did not abort the waiter");
    CHECK(ctl_barrier_wait(&s->ctl, epoch, 1, 1000) == -1, "a stale epoch passes the barrier");
    CHECK(ctl_barrier_wait(&s->ctl, next, 1, 1000) == 0, "a lone worker of the new epoch waits");

    /* with nobody else coming, the wait ends at the timeout */
    int64_t t0 = clock_ms();
    int rc = ctl_barrier_wait(&s->ctl, next, 2, 150);
    int64_t took = clock_ms() - t0;
    CHECK(rc == -1 && took >= 150 && took < 5000, "timeout: rc %d after %lld ms", rc, (long long)took);
    munmap(s, sizeof *s);
}

/* ---- the stack's FFN mode as logs and `pi2 status` show it ---- */

static void test_ffn_describe(void) {
    char buf[128];
    ffn_mode_describe(buf, sizeof buf, FFN_GATE_FIRST, "/ignored", 8);
    CHECK(!strcmp(buf, "gate-first"), "%s", buf);
    ffn_mode_describe(buf, sizeof buf, FFN_PREDICTOR, NULL, 0);
    CHECK(!strcmp(buf, "predictor, predictor fc1/fc2 of the model"), "%s", buf);
    ffn_mode_describe(buf, sizeof buf, FFN_PREDICTOR, "", 16);
    CHECK(!strcmp(buf, "predictor, predictor fc1/fc2 of the model"), "empty path: %s", buf);
    const char unterminated[4] = {'/', 'a', '.', 'g'}; /* a segment's bytes need not end in NUL */
    ffn_mode_describe(buf, sizeof buf, FFN_PREDICTOR, unterminated, sizeof unterminated);
    CHECK(!strcmp(buf, "predictor, predictor /a.g"), "bounded path: %s", buf);
    ffn_mode_describe(buf, 12, FFN_PREDICTOR, "/x", 2);
    CHECK(!strcmp(buf, "predictor, "), "truncated to the buffer: %s", buf);
}

int main(void) {
    model m;
    test_ffn_describe();
    if (!load(&m, "stories260K.gguf")) {
        test_act_layout(&m, 512);
        test_act_layout(&m, 1);
        test_regions(&m, "stories260K.gguf");
        test_kv_bytes(&m);
        model_free(&m);
    }
    if (!load(&m, "synth-q4_0.gguf")) {
        test_act_layout(&m, 77);
        test_regions(&m, "synth-q4_0.gguf");
        model_free(&m);
    }
    test_rebase("stories260K.gguf");
    test_rebase("synth-q4_0.gguf");
    test_work_share();
    test_ffn_chunks();
    test_ctl();
    test_barrier();
    return test_summary();
}

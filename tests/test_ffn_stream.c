/* The FFN stream (lib/engine/ffn_stream.h):
 *  - every selection of gate / up / down, on a GGUF file (ffn_down) and a PWRI
 *    file (ffn_down_t), Q4_0 and F16: each streamed tensor's bytes equal the
 *    mapped file's, at the right offset inside its 4096-aligned range, with the
 *    shape and type kept; unselected weights and the rest of the layer as in m;
 *  - two passes over the layers (next = l + 1, then 0 again), and out of order
 *    with wrong prefetches; layer l's bytes stay intact while l + 1 is read,
 *    and after a call that prefetches nothing;
 *  - tensors larger than one read (8 MiB), and the buffered fallback;
 *  - refused with a clear error: no selection, bad layer numbers, a missing
 *    file, a truncated copy (at open), a file cut short under an open stream
 *    (short read naming the tensor, and the stream still usable), reads failing
 *    with EIO beyond the retries (and recovered within them). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/ffn_stream.h"
#include "engine/model.h"
#include "mkmodel_run.h"
#include "test.h"
#include "file_util.h"

static char dir[] = "/tmp/pi2-test-ffn-stream-XXXXXX";

/* the weights a selection streams: gate, up, and down_t on PWRI files, else down */
static bool streams(const layer_weights *w, unsigned which, size_t field) {
    if (field == offsetof(layer_weights, gate)) return which & FFN_STREAM_GATE;
    if (field == offsetof(layer_weights, up)) return which & FFN_STREAM_UP;
    if (field == offsetof(layer_weights, down_t)) return (which & FFN_STREAM_DOWN) && w->down_t.data;
    if (field == offsetof(layer_weights, down)) return (which & FFN_STREAM_DOWN) && !w->down_t.data;
    return false;
}

static const weight *at(const layer_weights *w, size_t field) { return (const weight *)((const char *)w + field); }

static bool same_shape(const weight *a, const weight *b) {
    return a->type == b->type && a->rows == b->rows && a->cols == b->cols && a->row_bytes == b->row_bytes;
}

/* out against layer l of m: 0 if every weight is right, else the number of wrong ones (named on stderr) */
static int layer_errors(const model *m, int l, unsigned which, const layer_weights *out) {
    static const size_t fields[] = {offsetof(layer_weights, gate), offsetof(layer_weights, up),
                                    offsetof(layer_weights, down), offsetof(layer_weights, down_t),
                                    offsetof(layer_weights, wq), offsetof(layer_weights, fc1)};
    const layer_weights *w = &m->layers[l];
    int bad = 0;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const weight *want = at(w, fields[i]), *got = at(out, fields[i]);
        bool ok = same_shape(want, got);
        if (streams(w, which, fields[i])) {
            const uintptr_t off = (uintptr_t)want->data - (uintptr_t)m->gguf.base;
            ok = ok && got->data != want->data && (uintptr_t)got->data % 4096 == off % 4096 &&
                 memcmp(got->data, want->data, weight_bytes(want)) == 0;
        } else {
            ok = ok && got->data == want->data;
        }
        if (!ok) fprintf(stderr, "layer %d which %u: weight at offset %zu differs\n", l, which, fields[i]), bad++;
    }
    if (out->attn_norm != w->attn_norm || out->ffn_norm != w->ffn_norm) bad++;
    return bad;
}

static bool disjoint(const weight *a, const weight *b) {
    const char *pa = a->data, *pb = b->data;
    return pa + weight_bytes(a) <= pb || pb + weight_bytes(b) <= pa;
}

/* the selected bytes of one pass over the layers */
static uint64_t pass_bytes(const model *m, unsigned which) {
    uint64_t n = 0;
    for (int l = 0; l < m->n_layer; l++) {
        const layer_weights *w = &m->layers[l];
        if (which & FFN_STREAM_GATE) n += weight_bytes(&w->gate);
        if (which & FFN_STREAM_UP) n += weight_bytes(&w->up);
        if (which & FFN_STREAM_DOWN) n += weight_bytes(w->down_t.data ? &w->down_t : &w->down);
    }
    return n;
}

/* two passes, next = l + 1 and 0 after the last layer of the first pass */
static void walk(const char *name, const model *m, ffn_stream *s, unsigned which) {
    char err[512];
    int bad = 0, failed = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int l = 0; l < m->n_layer; l++) {
            const int next = l + 1 < m->n_layer ? l + 1 : pass == 0 ? 0 : -1;
            layer_weights out;
            if (ffn_stream_layer(s, l, next, &out, err, sizeof err)) {
                fprintf(stderr, "%s: %s\n", name, err), failed++;
                continue;
            }
            bad += layer_errors(m, l, which, &out); /* while the reader fills the other slot */
        }
    CHECK(failed == 0 && bad == 0, "%s which %u: %d calls failed, %d weights wrong", name, which, failed, bad);
}

/* layer l is intact after the call for l + 1 with next = -1; the two sit in different slots */
static void check_kept(const char *name, const model *m, ffn_stream *s, unsigned which) {
    char err[512];
    int bad = 0;
    for (int l = 0; l + 1 < m->n_layer; l++) {
        layer_weights a, b;
        if (ffn_stream_layer(s, l, l + 1, &a, err, sizeof err) || ffn_stream_layer(s, l + 1, -1, &b, err, sizeof err)) {
            bad++;
            continue;
        }
        bad += layer_errors(m, l, which, &a) + layer_errors(m, l + 1, which, &b);
        const weight *wa = which & FFN_STREAM_GATE ? &a.gate : which & FFN_STREAM_UP ? &a.up : a.down_t.data ? &a.down_t : &a.down;
        const weight *wb = which & FFN_STREAM_GATE ? &b.gate : which & FFN_STREAM_UP ? &b.up : b.down_t.data ? &b.down_t : &b.down;
        if (!disjoint(wa, wb)) bad++;
    }
    CHECK(bad == 0, "%s which %u: a layer was overwritten by the next one's read (%d)", name, which, bad);
}

/* out of order, with prefetches the caller does not follow */
static void check_random(const char *name, const model *m, ffn_stream *s, unsigned which) {
    static const int seq[][2] = {{2, 0}, {1, 2}, {1, -1}, {0, 1}, {2, 1}, {0, 0}, {0, 2}, {1, 0}, {2, -1}, {2, 2}};
    char err[512];
    int bad = 0;
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        const int l = seq[i][0] % m->n_layer, next = seq[i][1] < 0 ? -1 : seq[i][1] % m->n_layer;
        layer_weights out;
        if (ffn_stream_layer(s, l, next, &out, err, sizeof err)) bad++;
        else bad += layer_errors(m, l, which, &out);
    }
    CHECK(bad == 0, "%s which %u: out of order: %d wrong", name, which, bad);
}

static void check_model(const char *name, const char *flags, bool every_selection) {
    char path[512], err[512];
    CHECK(mkmodel_run(dir, name, flags, path, sizeof path) == 0, "mkmodel %s", flags);
    model m;
    if (model_load(&m, path, err, sizeof err)) {
        CHECK(0, "model_load: %s", err);
        return;
    }
    for (unsigned which = every_selection ? 1 : FFN_STREAM_ALL; which <= FFN_STREAM_ALL; which++) {
        ffn_stream *s = ffn_stream_open(&m, path, which, err, sizeof err);
        CHECK(s != NULL, "%s which %u: ffn_stream_open: %s", name, which, err);
        if (!s) continue;
        const size_t bytes = ffn_stream_bytes(&m, which);
        CHECK(bytes % 8192 == 0 && bytes / 2 >= pass_bytes(&m, which) / (uint64_t)m.n_layer,
              "%s which %u: ffn_stream_bytes %zu", name, which, bytes);
        walk(name, &m, s, which);
        uint64_t read;
        double wait_s, read_s;
        ffn_stream_stats(s, &read, &wait_s, &read_s);
        CHECK(read >= pass_bytes(&m, which) && wait_s >= 0 && read_s > 0,
              "%s which %u: stats: %llu bytes read (a pass is %llu), waited %.3f s, read %.3f s", name, which,
              (unsigned long long)read, (unsigned long long)pass_bytes(&m, which), wait_s, read_s);
        check_kept(name, &m, s, which);
        check_random(name, &m, s, which);
        ffn_stream_close(s);
    }
    model_free(&m);
}


/* the file cut inside the last layer's gate under an open stream: the layers
 * past the cut fail with a short read naming the tensor, the others still stream */
static void check_cut(const model *m, const char *path) {
    char cut[600], err[512];
    snprintf(cut, sizeof cut, "%s.cut", path);
    test_copy_file(path, cut, test_file_size(path));
    ffn_stream *s = ffn_stream_open(m, cut, FFN_STREAM_ALL, err, sizeof err);
    CHECK(s != NULL, "open a copy: %s", err);
    if (!s) return;
    const layer_weights *last = &m->layers[m->n_layer - 1];
    const uint64_t at = (uint64_t)((const uint8_t *)last->gate.data - m->gguf.base) + 100;
    CHECK(truncate(cut, (off_t)at) == 0, "truncate %s", cut);
    int bad = 0;
    for (int l = 0; l < m->n_layer; l++) {
        const layer_weights *w = &m->layers[l];
        bool fits = true;
        const weight *ws[] = {&w->gate, &w->up, w->down_t.data ? &w->down_t : &w->down};
        for (int k = 0; k < 3; k++)
            fits = fits && (uint64_t)((const uint8_t *)ws[k]->data - m->gguf.base) + weight_bytes(ws[k]) <= at;
        layer_weights out;
        const int rc = ffn_stream_layer(s, l, l + 1 < m->n_layer ? l + 1 : -1, &out, err, sizeof err);
        char tensor[64];
        snprintf(tensor, sizeof tensor, "blk.%d.ffn_", l);
        if (fits) bad += rc != 0 || layer_errors(m, l, FFN_STREAM_ALL, &out);
        else bad += !(rc != 0 && strstr(err, cut) && strstr(err, "short read") && strstr(err, tensor));
        if (rc) fprintf(stderr, "(expected) %s\n", err);
    }
    CHECK(bad == 0, "a file cut at %llu under the stream: %d layers wrong", (unsigned long long)at, bad);
    layer_weights out;
    CHECK(ffn_stream_layer(s, 0, -1, &out, err, sizeof err) == 0 && layer_errors(m, 0, FFN_STREAM_ALL, &out) == 0,
          "after a failed read, layer 0 streams again: %s", err);
    ffn_stream_close(s);
}

/* PI2_STREAM_FAIL_READS: FFN_STREAM_RETRIES failures are absorbed, one more is reported */
static void check_retries(const model *m, const char *path) {
    char err[512] = "";
    layer_weights out;
    setenv("PI2_STREAM_FAIL_READS", "3", 1);
    ffn_stream *s = ffn_stream_open(m, path, FFN_STREAM_ALL, err, sizeof err);
    CHECK(s && ffn_stream_layer(s, 0, -1, &out, err, sizeof err) == 0 && layer_errors(m, 0, FFN_STREAM_ALL, &out) == 0,
          "3 failed reads are retried: %s", err);
    ffn_stream_close(s);
    setenv("PI2_STREAM_FAIL_READS", "4", 1);
    s = ffn_stream_open(m, path, FFN_STREAM_ALL, err, sizeof err);
    CHECK(s && ffn_stream_layer(s, 0, 1, &out, err, sizeof err) != 0 && strstr(err, path) &&
              strstr(err, "blk.0.ffn_gate.weight") && strstr(err, "offset") && strstr(err, "Input/output error"),
          "the 4th failure is reported with file, tensor, offset and cause: %s", err);
    if (s) fprintf(stderr, "(expected) %s\n", err);
    CHECK(s && ffn_stream_layer(s, 0, -1, &out, err, sizeof err) == 0 && layer_errors(m, 0, FFN_STREAM_ALL, &out) == 0,
          "the stream recovers: %s", err);
    ffn_stream_close(s);
    unsetenv("PI2_STREAM_FAIL_READS");
}

static void check_buffered(const model *m, const char *path) {
    char err[512];
    int fd = open(path, O_RDONLY | O_DIRECT);
    const bool can_direct = fd >= 0;
    if (fd >= 0) close(fd);
    ffn_stream *s = ffn_stream_open(m, path, FFN_STREAM_ALL, err, sizeof err);
    CHECK(s && ffn_stream_direct(s) == can_direct, "O_DIRECT where the file system takes it: %s", s ? "" : err);
    ffn_stream_close(s);
    setenv("PI2_STREAM_BUFFERED", "1", 1);
    s = ffn_stream_open(m, path, FFN_STREAM_GATE | FFN_STREAM_DOWN, err, sizeof err);
    unsetenv("PI2_STREAM_BUFFERED");
    CHECK(s && !ffn_stream_direct(s), "the buffered fallback: %s", s ? "" : err);
    if (s) walk("buffered", m, s, FFN_STREAM_GATE | FFN_STREAM_DOWN);
    ffn_stream_close(s);
}

static void check_refusals(void) {
    char path[512], err[512], bad[600];
    CHECK(mkmodel_run(dir, "refuse.gguf", "--preset tiny --act relu --layers 3 --seed 9", path, sizeof path) == 0,
          "mkmodel");
    model m;
    if (model_load(&m, path, err, sizeof err)) {
        CHECK(0, "model_load: %s", err);
        return;
    }
    CHECK(ffn_stream_open(&m, path, 0, err, sizeof err) == NULL && strstr(err, "selects no FFN tensor"),
          "which = 0 is refused (%s)", err);
    CHECK(ffn_stream_open(&m, path, 8, err, sizeof err) == NULL && strstr(err, "selects no FFN tensor"),
          "which = 8 is refused (%s)", err);
    CHECK(ffn_stream_bytes(&m, 0) == 0, "no selection, no bytes");
    snprintf(bad, sizeof bad, "%s/missing.gguf", dir);
    CHECK(ffn_stream_open(&m, bad, FFN_STREAM_ALL, err, sizeof err) == NULL && strstr(err, bad),
          "a missing file is refused (%s)", err);
    snprintf(bad, sizeof bad, "%s.truncated", path);
    test_copy_file(path, bad, test_file_size(path) - 5000);
    CHECK(ffn_stream_open(&m, bad, FFN_STREAM_ALL, err, sizeof err) == NULL && strstr(err, bad) &&
              strstr(err, "not its file"),
          "a truncated copy is refused (%s)", err);

    ffn_stream *s = ffn_stream_open(&m, path, FFN_STREAM_ALL, err, sizeof err);
    layer_weights out;
    CHECK(s && ffn_stream_layer(s, 3, -1, &out, err, sizeof err) != 0 && strstr(err, "outside"),
          "layer 3 of 3 is refused (%s)", err);
    CHECK(s && ffn_stream_layer(s, 0, 3, &out, err, sizeof err) != 0 && strstr(err, "outside"),
          "next 3 of 3 is refused (%s)", err);
    CHECK(s && ffn_stream_layer(s, -1, 0, &out, err, sizeof err) != 0, "layer -1 is refused");
    ffn_stream_close(s);
    ffn_stream_close(NULL);

    check_cut(&m, path);
    check_retries(&m, path);
    check_buffered(&m, path);
    model_free(&m);
}

int main(void) {
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return test_summary();
    }
    check_model("gguf-q4_0.gguf", "--preset tiny --act relu --layers 3 --type q4_0 --seed 3", true);
    check_model("pwri-f16.gguf", "--preset tiny --act relu --type f16 --seed 4 --pwri", true);
    check_model("gguf-mixed.gguf", "--preset tiny --act relu --layers 3 --type q8_0 --type-ffn f32 --seed 5", true);
    /* FFN tensors of 9.4 MB: more than one read each */
    check_model("gguf-big.gguf", "--preset tiny --act relu --dim 512 --ff 4608 --type f32 --seed 6", false);
    check_refusals();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "removing %s", dir);
    return test_summary();
}

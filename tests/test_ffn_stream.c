/* The FFN stream (lib/engine/ffn_stream.h):
 *  - every selection of gate / up / down, on a GGUF file (ffn_down: whole
 *    layers) and PWRI files (ffn_down_t: pieces of neurons, several per layer
 *    on the big file and with small steps), Q4_0, F16 and F32: each streamed
 *    piece's rows equal the mapped file's, at the right offset inside their
 *    4096-aligned range, with the shape kept (rows = the piece's neurons); an
 *    unselected neuron-row tensor views the model's rows of the piece; the
 *    rest of the layer as in m;
 *  - two passes over every piece in order, and out of order (with fewer
 *    pieces than slots too); consecutive pieces in different slots; the
 *    pieces' sizes (ffn_stream_piece_neurons) whole steps within
 *    FFN_STREAM_PIECE_BYTES;
 *  - tensors larger than one read (8 MiB), and the buffered fallback;
 *  - rows held in memory (ffn_stream_set_resident), all, none, a prefix of
 *    each layer or every third neuron: the pieces are the file's all the
 *    same; held rows are copied, not read (all held: nothing read; a prefix:
 *    about the rest read), and a held copy that differs from the file shows
 *    in its piece (it came from memory), while short held gaps are read
 *    through;
 *  - refused with a clear error: no selection, a bad step, bad layer or neuron
 *    numbers, a missing file, a truncated copy (at open), a file cut short
 *    under an open stream (short read naming the tensor, and the stream still
 *    usable), reads failing with EIO beyond the retries (and recovered within
 *    them). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/ffn_stream.h"
#include "engine/model.h"
#include "engine/prompt.h"
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

static bool neuron_rows(size_t field) {
    return field == offsetof(layer_weights, gate) || field == offsetof(layer_weights, up) ||
           field == offsetof(layer_weights, down_t);
}

/* out against neurons [n0, n1) of layer l of m: 0 if every weight is right, else the number of wrong ones
 * (named on stderr) */
static int piece_errors(const model *m, int l, long n0, long n1, unsigned which, const layer_weights *out) {
    static const size_t fields[] = {offsetof(layer_weights, gate), offsetof(layer_weights, up),
                                    offsetof(layer_weights, down), offsetof(layer_weights, down_t),
                                    offsetof(layer_weights, wq), offsetof(layer_weights, fc1)};
    const layer_weights *w = &m->layers[l];
    int bad = 0;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        weight want = *at(w, fields[i]);
        const weight *got = at(out, fields[i]);
        if (want.data && neuron_rows(fields[i])) {
            want.data = (const char *)want.data + (size_t)n0 * want.row_bytes;
            want.rows = n1 - n0;
        }
        bool ok = want.type == got->type && want.rows == got->rows && want.cols == got->cols &&
                  want.row_bytes == got->row_bytes;
        if (streams(w, which, fields[i])) {
            const uintptr_t off = (uintptr_t)want.data - (uintptr_t)m->gguf.base;
            ok = ok && got->data != want.data && (uintptr_t)got->data % 4096 == off % 4096 &&
                 memcmp(got->data, want.data, weight_bytes(&want)) == 0;
        } else {
            ok = ok && got->data == want.data;
        }
        if (!ok)
            fprintf(stderr, "layer %d neurons %ld-%ld which %u: weight at offset %zu differs\n", l, n0, n1, which,
                    fields[i]), bad++;
    }
    if (out->attn_norm != w->attn_norm || out->ffn_norm != w->ffn_norm) bad++;
    return bad;
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

/* the first streamed tensor of a piece, for telling slots apart */
static const weight *first_streamed(const layer_weights *w, unsigned which) {
    return which & FFN_STREAM_GATE ? &w->gate : which & FFN_STREAM_UP ? &w->up : w->down_t.data ? &w->down_t : &w->down;
}

/* two passes over every piece in order, each checked while the reader fills the other slot; consecutive
 * pieces in different slots; every piece piece_neurons long but a layer's last */
static void walk(const char *name, const model *m, ffn_stream *s, unsigned which, long piece_neurons) {
    char err[512];
    int bad = 0, failed = 0;
    long pieces = 0;
    const void *last = NULL;
    for (int pass = 0; pass < 2; pass++)
        for (int l = 0; l < m->n_layer; l++) {
            long n1 = 0;
            for (long n0 = 0; n0 < m->n_ff; n0 = n1, pieces++) {
                layer_weights out;
                if (ffn_stream_piece(s, l, n0, &out, &n1, err, sizeof err)) {
                    fprintf(stderr, "%s: %s\n", name, err), failed++;
                    break;
                }
                const long want_n1 = n0 + piece_neurons < m->n_ff ? n0 + piece_neurons : m->n_ff;
                bad += n1 != want_n1;
                bad += piece_errors(m, l, n0, n1, which, &out);
                const void *here = first_streamed(&out, which)->data;
                if (last && here == last) bad++; /* the same slot twice in a row */
                last = here;
            }
        }
    const long per_layer = (m->n_ff + piece_neurons - 1) / piece_neurons;
    CHECK(failed == 0 && bad == 0 && pieces == 2 * per_layer * m->n_layer,
          "%s which %u: %d calls failed, %d pieces wrong, %ld pieces (%ld a layer)", name, which, failed, bad, pieces,
          per_layer);
}

/* out of order: pieces the stream did not prefetch */
static void check_random(const char *name, const model *m, ffn_stream *s, unsigned which, long piece_neurons) {
    static const int seq[][2] = {{2, 0}, {1, 2}, {1, 1}, {0, 1}, {2, 1}, {0, 0}, {0, 2}, {1, 0}, {2, 2}, {2, 2}};
    const long per_layer = (m->n_ff + piece_neurons - 1) / piece_neurons;
    char err[512];
    int bad = 0;
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        const int l = seq[i][0] % m->n_layer;
        const long n0 = (seq[i][1] % per_layer) * piece_neurons;
        layer_weights out;
        long n1;
        if (ffn_stream_piece(s, l, n0, &out, &n1, err, sizeof err)) bad++;
        else bad += piece_errors(m, l, n0, n1, which, &out);
    }
    CHECK(bad == 0, "%s which %u: out of order: %d wrong", name, which, bad);
}

/* the pieces of `which` with step: whole steps within FFN_STREAM_PIECE_BYTES (or one step), whole layers with
 * ffn_down; FFN_STREAM_SLOTS slots for pieces, 2 for whole layers, each holding the largest piece */
static long check_piece_size(const char *name, const model *m, unsigned which, long step) {
    const long piece = ffn_stream_piece_neurons(m, which, step);
    const bool has_down = (which & FFN_STREAM_DOWN) && !m->layers[0].down_t.data;
    uint64_t row = 0;
    if (which & FFN_STREAM_GATE) row += m->layers[0].gate.row_bytes;
    if (which & FFN_STREAM_UP) row += m->layers[0].up.row_bytes;
    if ((which & FFN_STREAM_DOWN) && !has_down) row += m->layers[0].down_t.row_bytes;
    const uint64_t most = FFN_STREAM_PIECE_BYTES;
    const bool ok = has_down || step >= m->n_ff
                        ? piece == m->n_ff
                        : (piece == m->n_ff || piece % step == 0) &&                    /* whole steps */
                              (piece == step || (uint64_t)piece * row <= most + (uint64_t)step * row) && /* fits */
                              (piece == m->n_ff || (uint64_t)(piece + step) * row > most); /* the most that fit */
    const size_t bytes = ffn_stream_bytes(m, which, step);
    const uint64_t piece_rows = has_down ? pass_bytes(m, which) / (uint64_t)m->n_layer : (uint64_t)piece * row;
    const int slots = ffn_stream_slots(m, which, step);
    const size_t slot = bytes / (size_t)slots;
    CHECK(ok && slots == (piece < m->n_ff ? FFN_STREAM_SLOTS : 2) && bytes % (size_t)slots == 0 && slot % 4096 == 0 &&
              slot >= piece_rows && slot < piece_rows + 3 * 8192,
          "%s which %u step %ld: %ld neurons a piece, ffn_stream_bytes %zu", name, which, step, piece, bytes);
    return piece;
}

/* A copy of every neuron's rows as a bundle would hold them (gate, up, down_t side by side), offered per
 * `pattern`. */
enum { HELD_NONE, HELD_ALL, HELD_PREFIX, HELD_EVERY_THIRD };
typedef struct {
    const model *m;
    uint8_t *rows;
    size_t neuron_bytes, up_off, down_off;
    int pattern;
} held_rows;

static const uint8_t *held_at(void *ctx, int l, long n) {
    const held_rows *h = ctx;
    const long nf = h->m->n_ff;
    const bool held = h->pattern == HELD_ALL || (h->pattern == HELD_PREFIX && n < nf * 6 / 10) ||
                      (h->pattern == HELD_EVERY_THIRD && n % 3 == 0);
    return held ? h->rows + ((size_t)l * (size_t)nf + (size_t)n) * h->neuron_bytes : NULL;
}

static bool held_make(held_rows *h, const model *m) {
    const layer_weights *w0 = &m->layers[0];
    *h = (held_rows){.m = m, .up_off = w0->gate.row_bytes, .down_off = w0->gate.row_bytes + w0->up.row_bytes};
    h->neuron_bytes = h->down_off + w0->down_t.row_bytes;
    if (!(h->rows = malloc(h->neuron_bytes * (size_t)m->n_ff * (size_t)m->n_layer))) return false;
    for (int l = 0; l < m->n_layer; l++)
        for (long n = 0; n < m->n_ff; n++) {
            const layer_weights *w = &m->layers[l];
            uint8_t *at = h->rows + ((size_t)l * (size_t)m->n_ff + (size_t)n) * h->neuron_bytes;
            memcpy(at, (const char *)w->gate.data + (size_t)n * w->gate.row_bytes, w->gate.row_bytes);
            memcpy(at + h->up_off, (const char *)w->up.data + (size_t)n * w->up.row_bytes, w->up.row_bytes);
            memcpy(at + h->down_off, (const char *)w->down_t.data + (size_t)n * w->down_t.row_bytes,
                   w->down_t.row_bytes);
        }
    return true;
}

/* Bytes read and copied by two walks over every piece with the rows of `pattern` held. */
static void walk_held(const char *name, const model *m, ffn_stream *s, held_rows *h, int pattern, long piece,
                      uint64_t *read, uint64_t *copied) {
    uint64_t r0, c0, r1, c1;
    h->pattern = pattern;
    const ffn_stream_resident src = {held_at, h, 0, h->up_off, h->down_off};
    ffn_stream_set_resident(s, &src);
    ffn_stream_release(s); /* nothing read before stays in a slot */
    ffn_stream_stats(s, &r0, &c0, NULL, NULL);
    walk(name, m, s, FFN_STREAM_ALL, piece);
    ffn_stream_wait_reads(s); /* the read-ahead past the walk's end is counted whatever the timing */
    ffn_stream_stats(s, &r1, &c1, NULL, NULL);
    *read = r1 - r0, *copied = c1 - c0;
}

/* PWRI files: every piece equals the file whatever is held; what is held is copied, not read */
static void check_resident(const char *name, const model *m, const char *path, long step) {
    char err[512];
    held_rows h;
    ffn_stream *s = ffn_stream_open(m, path, FFN_STREAM_ALL, step, err, sizeof err);
    CHECK(s && held_make(&h, m), "%s: a stream and the held rows: %s", name, s ? "out of memory" : err);
    if (!s) return;
    const long piece = ffn_stream_piece_neurons(m, FFN_STREAM_ALL, step);
    uint64_t none, read, copied; /* a walk reads a few pieces ahead of its end: compare with none held */
    walk_held(name, m, s, &h, HELD_NONE, piece, &none, &copied);
    CHECK(none >= pass_bytes(m, FFN_STREAM_ALL) && copied == 0, "%s: none held: %llu bytes read, %llu copied", name,
          (unsigned long long)none, (unsigned long long)copied);
    walk_held(name, m, s, &h, HELD_ALL, piece, &read, &copied);
    CHECK(read == 0 && copied >= pass_bytes(m, FFN_STREAM_ALL), "%s: all held: %llu bytes read, %llu copied", name,
          (unsigned long long)read, (unsigned long long)copied);
    walk_held(name, m, s, &h, HELD_PREFIX, piece, &read, &copied);
    CHECK(read <= none * 55 / 100 && copied >= none / 2,
          "%s: 60 %% of each layer held: %llu bytes read, %llu copied (none held: %llu read)", name,
          (unsigned long long)read, (unsigned long long)copied, (unsigned long long)none);
    walk_held(name, m, s, &h, HELD_EVERY_THIRD, piece, &read, &copied);
    CHECK(read >= none * 9 / 10 && copied <= none / 100,
          "%s: every third held: read through (%llu bytes read, %llu copied; none held: %llu read)", name,
          (unsigned long long)read, (unsigned long long)copied, (unsigned long long)none);

    /* a held row that differs from the file lands in its piece: it was copied */
    h.pattern = HELD_PREFIX;
    uint8_t *up1 = h.rows + ((size_t)m->n_ff + 1) * h.neuron_bytes + h.up_off; /* layer 1, neuron 1's up row */
    up1[3] ^= 0x5a;
    ffn_stream_release(s);
    layer_weights out;
    long n1;
    const bool got = ffn_stream_piece(s, 1, 0, &out, &n1, err, sizeof err) == 0;
    const weight *up = &m->layers[1].up;
    CHECK(got && memcmp((const char *)out.up.data + up->row_bytes, up1, up->row_bytes) == 0 &&
              memcmp((const char *)out.up.data + up->row_bytes, (const char *)up->data + up->row_bytes,
                     up->row_bytes) != 0,
          "%s: a held row is copied into its piece: %s", name, got ? "" : err);
    up1[3] ^= 0x5a;
    ffn_stream_set_resident(s, NULL);
    ffn_stream_release(s);
    walk(name, m, s, FFN_STREAM_ALL, piece);
    free(h.rows);
    ffn_stream_close(s);
}

/* steps: prompt_pass_neuron_step's, and (when `small`) two small ones that cut a layer in several pieces */
static void check_model(const char *name, const char *flags, bool every_selection, bool small) {
    char path[512], err[512];
    CHECK(mkmodel_run(dir, name, flags, path, sizeof path) == 0, "mkmodel %s", flags);
    model m;
    if (model_load(&m, path, err, sizeof err)) {
        CHECK(0, "model_load: %s", err);
        return;
    }
    const long steps[] = {prompt_pass_neuron_step(&m), 1000, 16};
    for (int i = 0; i < (small ? 3 : 1); i++)
        for (unsigned which = every_selection ? 1 : FFN_STREAM_ALL; which <= FFN_STREAM_ALL; which++) {
            const long piece = check_piece_size(name, &m, which, steps[i]);
            ffn_stream *s = ffn_stream_open(&m, path, which, steps[i], err, sizeof err);
            CHECK(s != NULL, "%s which %u: ffn_stream_open: %s", name, which, err);
            if (!s) continue;
            walk(name, &m, s, which, piece);
            uint64_t read;
            double wait_s, read_s;
            ffn_stream_stats(s, &read, NULL, &wait_s, &read_s);
            CHECK(read >= pass_bytes(&m, which) && wait_s >= 0 && read_s > 0,
                  "%s which %u: stats: %llu bytes read (a pass is %llu), waited %.3f s, read %.3f s", name, which,
                  (unsigned long long)read, (unsigned long long)pass_bytes(&m, which), wait_s, read_s);
            check_random(name, &m, s, which, piece);
            layer_weights out;
            long n1;
            CHECK(ffn_stream_piece(s, 0, piece / 2, &out, &n1, err, sizeof err) != 0 && strstr(err, "not at a piece"),
                  "%s: neuron %ld is not a piece's first (%s)", name, piece / 2, err);
            ffn_stream_close(s);
        }
    if (m.layers[0].down_t.data) check_resident(name, &m, path, small ? 16 : prompt_pass_neuron_step(&m));
    model_free(&m);
}

/* the file cut inside the last layer's gate under an open stream: the layers
 * past the cut fail with a short read naming the tensor, the others still stream */
static void check_cut(const model *m, const char *path) {
    char cut[600], err[512];
    snprintf(cut, sizeof cut, "%s.cut", path);
    test_copy_file(path, cut, test_file_size(path));
    ffn_stream *s = ffn_stream_open(m, cut, FFN_STREAM_ALL, m->n_ff, err, sizeof err);
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
        long n1;
        const int rc = ffn_stream_piece(s, l, 0, &out, &n1, err, sizeof err);
        char tensor[64];
        snprintf(tensor, sizeof tensor, "blk.%d.ffn_", l);
        if (fits) bad += rc != 0 || piece_errors(m, l, 0, m->n_ff, FFN_STREAM_ALL, &out);
        else bad += !(rc != 0 && strstr(err, cut) && strstr(err, "short read") && strstr(err, tensor));
        if (rc) fprintf(stderr, "(expected) %s\n", err);
    }
    CHECK(bad == 0, "a file cut at %llu under the stream: %d layers wrong", (unsigned long long)at, bad);
    layer_weights out;
    long n1;
    CHECK(ffn_stream_piece(s, 0, 0, &out, &n1, err, sizeof err) == 0 &&
              piece_errors(m, 0, 0, m->n_ff, FFN_STREAM_ALL, &out) == 0,
          "after a failed read, layer 0 streams again: %s", err);
    ffn_stream_close(s);
}

/* PI2_STREAM_FAIL_READS: FFN_STREAM_RETRIES failures are absorbed, one more is reported */
static void check_retries(const model *m, const char *path) {
    char err[512] = "";
    layer_weights out;
    long n1;
    setenv("PI2_STREAM_FAIL_READS", "3", 1);
    ffn_stream *s = ffn_stream_open(m, path, FFN_STREAM_ALL, m->n_ff, err, sizeof err);
    CHECK(s && ffn_stream_piece(s, 0, 0, &out, &n1, err, sizeof err) == 0 &&
              piece_errors(m, 0, 0, m->n_ff, FFN_STREAM_ALL, &out) == 0,
          "3 failed reads are retried: %s", err);
    ffn_stream_close(s);
    setenv("PI2_STREAM_FAIL_READS", "4", 1);
    s = ffn_stream_open(m, path, FFN_STREAM_ALL, m->n_ff, err, sizeof err);
    CHECK(s && ffn_stream_piece(s, 0, 0, &out, &n1, err, sizeof err) != 0 && strstr(err, path) &&
              strstr(err, "blk.0.ffn_gate.weight") && strstr(err, "offset") && strstr(err, "Input/output error"),
          "the 4th failure is reported with file, tensor, offset and cause: %s", err);
    if (s) fprintf(stderr, "(expected) %s\n", err);
    CHECK(s && ffn_stream_piece(s, 0, 0, &out, &n1, err, sizeof err) == 0 &&
              piece_errors(m, 0, 0, m->n_ff, FFN_STREAM_ALL, &out) == 0,
          "the stream recovers: %s", err);
    ffn_stream_close(s);
    unsetenv("PI2_STREAM_FAIL_READS");
}

static void check_buffered(const model *m, const char *path) {
    char err[512];
    int fd = open(path, O_RDONLY | O_DIRECT);
    const bool can_direct = fd >= 0;
    if (fd >= 0) close(fd);
    ffn_stream *s = ffn_stream_open(m, path, FFN_STREAM_ALL, m->n_ff, err, sizeof err);
    CHECK(s && ffn_stream_direct(s) == can_direct, "O_DIRECT where the file system takes it: %s", s ? "" : err);
    ffn_stream_close(s);
    setenv("PI2_STREAM_BUFFERED", "1", 1);
    s = ffn_stream_open(m, path, FFN_STREAM_GATE | FFN_STREAM_DOWN, m->n_ff, err, sizeof err);
    unsetenv("PI2_STREAM_BUFFERED");
    CHECK(s && !ffn_stream_direct(s), "the buffered fallback: %s", s ? "" : err);
    if (s) walk("buffered", m, s, FFN_STREAM_GATE | FFN_STREAM_DOWN, m->n_ff);
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
    CHECK(ffn_stream_open(&m, path, 0, 1, err, sizeof err) == NULL && strstr(err, "selects no FFN tensor"),
          "which = 0 is refused (%s)", err);
    CHECK(ffn_stream_open(&m, path, 8, 1, err, sizeof err) == NULL && strstr(err, "selects no FFN tensor"),
          "which = 8 is refused (%s)", err);
    CHECK(ffn_stream_open(&m, path, FFN_STREAM_ALL, 0, err, sizeof err) == NULL && strstr(err, "step"),
          "step 0 is refused (%s)", err);
    CHECK(ffn_stream_bytes(&m, 0, 1) == 0 && ffn_stream_bytes(&m, FFN_STREAM_ALL, 0) == 0,
          "no selection or no step, no bytes");
    snprintf(bad, sizeof bad, "%s/missing.gguf", dir);
    CHECK(ffn_stream_open(&m, bad, FFN_STREAM_ALL, 1, err, sizeof err) == NULL && strstr(err, bad),
          "a missing file is refused (%s)", err);
    snprintf(bad, sizeof bad, "%s.truncated", path);
    test_copy_file(path, bad, test_file_size(path) - 5000);
    CHECK(ffn_stream_open(&m, bad, FFN_STREAM_ALL, 1, err, sizeof err) == NULL && strstr(err, bad) &&
              strstr(err, "not its file"),
          "a truncated copy is refused (%s)", err);

    ffn_stream *s = ffn_stream_open(&m, path, FFN_STREAM_GATE | FFN_STREAM_UP, 16, err, sizeof err);
    layer_weights out;
    long n1;
    CHECK(s && ffn_stream_piece(s, 3, 0, &out, &n1, err, sizeof err) != 0 && strstr(err, "outside"),
          "layer 3 of 3 is refused (%s)", err);
    CHECK(s && ffn_stream_piece(s, -1, 0, &out, &n1, err, sizeof err) != 0, "layer -1 is refused");
    CHECK(s && ffn_stream_piece(s, 0, 1, &out, &n1, err, sizeof err) != 0 && strstr(err, "not at a piece"),
          "neuron 1 is not a piece's first (%s)", err);
    CHECK(s && ffn_stream_piece(s, 0, m.n_ff, &out, &n1, err, sizeof err) != 0 && strstr(err, "outside"),
          "neuron n_ff is refused (%s)", err);
    CHECK(s && ffn_stream_piece(s, 0, -16, &out, &n1, err, sizeof err) != 0, "neuron -16 is refused");
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
    check_model("gguf-q4_0.gguf", "--preset tiny --act relu --layers 3 --type q4_0 --seed 3", true, false);
    check_model("pwri-f16.gguf", "--preset tiny --act relu --type f16 --seed 4 --pwri", true, true);
    check_model("pwri-q4_0.gguf", "--preset tiny --act relu --layers 3 --type q4_0 --seed 7 --pwri", true, true);
    check_model("gguf-mixed.gguf", "--preset tiny --act relu --layers 3 --type q8_0 --type-ffn f32 --seed 5", true,
                false);
    /* FFN tensors of 9.4 MB: more than one read each; as PWRI, more than one piece a layer */
    check_model("gguf-big.gguf", "--preset tiny --act relu --dim 512 --ff 4608 --type f32 --seed 6", false, false);
    check_model("pwri-big.gguf", "--preset tiny --act relu --dim 512 --ff 4608 --type f32 --seed 6 --pwri", false,
                true);
    check_refusals();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "removing %s", dir);
    return test_summary();
}

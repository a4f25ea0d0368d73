/* The bundle file (lib/plan/bundle.h):
 *  - every neuron's bytes in the bundle equal its source rows: gate and up
 *    rows of the model, the down row of the file's ffn_down_t (PWRI) or of
 *    ffn_down's columns (GGUF: checked against the dequantized column, not
 *    against the writer's own transposition); padding is zero;
 *  - every bundle starts on a 4096-byte file offset, slots follow the order;
 *  - one and several neurons per bundle, a shuffled order, identity order;
 *  - refused with a clear error: another model (both files named), a
 *    truncated file, a corrupted region (bundle_verify names the layer, and
 *    bundle_check fails that bundle alone), a corrupted bundle checksum, an
 *    order that is not a permutation, a bad per_bundle. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/model.h"
#include "kernels/kernels.h"
#include "mkmodel_run.h"
#include "plan/bundle.h"
#include "test.h"
#include "file_util.h"

static char dir[] = "/tmp/pi2-test-bundle-XXXXXX";

static void make(const char *name, const char *flags, char *path, size_t cap) {
    CHECK(mkmodel_run(dir, name, flags, path, cap) == 0, "mkmodel %s", flags);
}

/* n values of neuron n's down row in the bundle, against column n of
 * ffn_down (or row n of ffn_down_t), both dequantized */
static float down_error(const model *m, const bundle_file *b, int l, const uint8_t *row, int n) {
    const layer_weights *w = &m->layers[l];
    float *got = malloc(sizeof(float) * (size_t)m->n_embd), *want = malloc(sizeof(float) * (size_t)m->n_embd);
    float *full = malloc(sizeof(float) * (size_t)m->n_ff);
    dequantize_row(b->down_type, row, got, m->n_embd);
    if (w->down_t.data) {
        dequantize_row(w->down_t.type, (const char *)w->down_t.data + (size_t)n * w->down_t.row_bytes, want, m->n_embd);
    } else {
        for (int r = 0; r < m->n_embd; r++) {
            dequantize_row(w->down.type, (const char *)w->down.data + (size_t)r * w->down.row_bytes, full, m->n_ff);
            want[r] = full[n];
        }
    }
    float worst = 0, top = 0;
    for (int i = 0; i < m->n_embd; i++) {
        const float d = got[i] - want[i];
        worst = d > worst ? d : -d > worst ? -d : worst;
        top = want[i] > top ? want[i] : -want[i] > top ? -want[i] : top;
    }
    free(got), free(want), free(full);
    return top > 0 ? worst / top : worst;
}

/* every slot's rows against the model's; padding zero; offsets aligned */
static void check_contents(const char *name, const model *m, const bundle_file *b, const int32_t *order,
                           float down_tol) {
    int bad_gate = 0, bad_up = 0, bad_down = 0, bad_order = 0, bad_pad = 0, bad_align = 0;
    for (int l = 0; l < m->n_layer; l++) {
        const layer_weights *w = &m->layers[l];
        for (long s = 0; s < m->n_ff; s++) {
            const int n = b->order[(size_t)l * (size_t)m->n_ff + (size_t)s];
            if (order && n != order[(size_t)l * (size_t)m->n_ff + (size_t)s]) bad_order++;
            if (!order && n != s) bad_order++;
            const uint8_t *rows = bundle_slot_rows(b, l, s);
            if (memcmp(rows, (const char *)w->gate.data + (size_t)n * w->gate.row_bytes, w->gate.row_bytes)) bad_gate++;
            if (memcmp(rows + b->gate_bytes, (const char *)w->up.data + (size_t)n * w->up.row_bytes, w->up.row_bytes))
                bad_up++;
            const uint8_t *down = rows + b->gate_bytes + b->up_bytes;
            if (w->down_t.data) {
                if (memcmp(down, (const char *)w->down_t.data + (size_t)n * w->down_t.row_bytes, w->down_t.row_bytes))
                    bad_down++;
            } else if (down_error(m, b, l, down, n) > down_tol) {
                bad_down++;
            }
        }
        for (long k = 0; k < b->n_bundles; k++) {
            if (bundle_file_offset(b, l, k) % BUNDLE_ALIGN) bad_align++;
            const long used = m->n_ff - k * b->per_bundle < b->per_bundle ? m->n_ff - k * b->per_bundle : b->per_bundle;
            const uint8_t *p = b->region[l] + (size_t)k * b->stride;
            for (size_t i = (size_t)used * b->neuron_bytes; i < b->stride; i++)
                if (p[i]) {
                    bad_pad++;
                    break;
                }
        }
    }
    CHECK(!bad_order, "%s: %d slots hold another neuron than the order", name, bad_order);
    CHECK(!bad_gate && !bad_up, "%s: %d gate rows, %d up rows differ from the model's", name, bad_gate, bad_up);
    CHECK(!bad_down, "%s: %d down rows differ from the model's", name, bad_down);
    CHECK(!bad_pad && !bad_align, "%s: %d bundles with non-zero padding, %d not 4096-aligned", name, bad_pad,
          bad_align);
}

/* order: layer l's slot s holds neuron (s * step + l) % n_ff, step odd and coprime to n_ff */
static int32_t *shuffled(const model *m) {
    int32_t *o = malloc(sizeof(int32_t) * (size_t)m->n_layer * (size_t)m->n_ff);
    for (int l = 0; l < m->n_layer; l++)
        for (long s = 0; s < m->n_ff; s++) o[(size_t)l * (size_t)m->n_ff + (size_t)s] = (int32_t)((s * 7 + l) % m->n_ff);
    return o;
}

static void check_model(const char *name, const char *flags, float down_tol) {
    char path[512], out[600], err[1024];
    make(name, flags, path, sizeof path);
    model m;
    if (model_load(&m, path, err, sizeof err)) {
        CHECK(0, "%s: %s", path, err);
        return;
    }
    int32_t *order = shuffled(&m);
    const int per[] = {1, 3};
    for (int i = 0; i < 2; i++) {
        snprintf(out, sizeof out, "%s/%s.%d.bundle", dir, name, per[i]);
        const int32_t *o = i ? order : NULL;
        CHECK(bundle_write(&m, path, o, per[i], out, NULL, NULL, err, sizeof err) == 0, "%s: bundle_write: %s", name, err);
        bundle_file b;
        if (bundle_open(&b, out, &m, path, err, sizeof err)) {
            CHECK(0, "%s: bundle_open: %s", name, err);
            continue;
        }
        CHECK(b.per_bundle == per[i] && b.stride % BUNDLE_ALIGN == 0 &&
                  b.stride >= (size_t)per[i] * b.neuron_bytes && b.stride < (size_t)per[i] * b.neuron_bytes + BUNDLE_ALIGN,
              "%s: stride %zu for %d neurons of %zu bytes", name, b.stride, per[i], b.neuron_bytes);
        CHECK(bundle_verify(&b, err, sizeof err) == 0, "%s: bundle_verify: %s", name, err);
        long unchecked = 0;
        for (int l = 0; l < b.n_layer; l++)
            for (long k = 0; k < b.n_bundles; k++) unchecked += !bundle_check(&b, l, k, b.region[l] + (size_t)k * b.stride);
        CHECK(unchecked == 0, "%s: %ld bundles fail their own checksum", name, unchecked);
        char what[64];
        snprintf(what, sizeof what, "%s, %d per bundle", name, per[i]);
        check_contents(what, &m, &b, o, down_tol);
        bundle_close(&b);
    }
    free(order);
    model_free(&m);
}


static void flip_byte(const char *p, long at) {
    FILE *f = fopen(p, "r+b");
    if (!f) return;
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

/* Rewrites the file's pi2.bundle.version (a u32 after its key and type). */
static bool set_version(const char *p, uint32_t v) {
    static const char key[] = "pi2.bundle.version";
    FILE *f = fopen(p, "r+b");
    if (!f) return false;
    char head[4096];
    const size_t n = fread(head, 1, sizeof head, f);
    const char *k = memmem(head, n, key, sizeof key - 1);
    const bool ok = k && fseek(f, (long)(k - head) + (long)sizeof key - 1 + 4, SEEK_SET) == 0 &&
                    fwrite(&v, sizeof v, 1, f) == 1;
    fclose(f);
    return ok;
}

static void check_refusals(void) {
    char a[512], other[512], out[600], bad[640], err[1024];
    make("refuse-a.gguf", "--preset tiny --act relu --type q4_0 --seed 21", a, sizeof a);
    make("refuse-b.gguf", "--preset tiny --act relu --type q4_0 --seed 22", other, sizeof other);
    model m, mo;
    if (model_load(&m, a, err, sizeof err) || model_load(&mo, other, err, sizeof err)) {
        CHECK(0, "model_load: %s", err);
        return;
    }
    snprintf(out, sizeof out, "%s/refuse.bundle", dir);
    CHECK(bundle_write(&m, a, NULL, 2, out, NULL, NULL, err, sizeof err) == 0, "bundle_write: %s", err);
    bundle_file b;

    CHECK(bundle_open(&b, out, &mo, other, err, sizeof err) != 0 && strstr(err, out) && strstr(err, other),
          "another model's bundle is refused naming both files (got: %s)", err);

    snprintf(bad, sizeof bad, "%s.truncated", out);
    test_copy_file(out, bad, test_file_size(out) - 5000);
    CHECK(bundle_open(&b, bad, &m, a, err, sizeof err) != 0 && strstr(err, bad), "a truncated bundle is refused (%s)",
          err);

    snprintf(bad, sizeof bad, "%s.corrupt", out);
    test_copy_file(out, bad, test_file_size(out));
    if (bundle_open(&b, out, &m, a, err, sizeof err) == 0) {
        const long at = (long)bundle_file_offset(&b, 1, 3) + 100; /* layer 1, a neuron's row */
        bundle_close(&b);
        flip_byte(bad, at);
        CHECK(bundle_open(&b, bad, &m, a, err, sizeof err) == 0, "a corrupted region still opens (%s)", err);
        CHECK(bundle_verify(&b, err, sizeof err) != 0 && strstr(err, "layer 1"), "the corrupted layer is named (%s)",
              err);
        /* a bundle read alone is checked alone: the corrupted one fails, its neighbours pass */
        const bool bad3 = bundle_check(&b, 1, 3, b.region[1] + 3 * b.stride);
        const bool ok2 = bundle_check(&b, 1, 2, b.region[1] + 2 * b.stride);
        const bool ok_l0 = bundle_check(&b, 0, 3, b.region[0] + 3 * b.stride);
        CHECK(!bad3 && ok2 && ok_l0, "bundle_check: the corrupted bundle %s, its neighbours %s / %s",
              bad3 ? "passes" : "fails", ok2 ? "pass" : "fail", ok_l0 ? "pass" : "fail");
        bundle_close(&b);
    }
    snprintf(bad, sizeof bad, "%s.badsums", out);
    test_copy_file(out, bad, test_file_size(out));
    if (bundle_open(&b, out, &m, a, err, sizeof err) == 0) {
        const gguf_tensor *t = gguf_find_tensor(&b.g, BUNDLE_SUMS_TENSOR);
        const long at = t ? (long)((const uint8_t *)t->data - b.g.base) + 8 * 3 : -1; /* layer 0, bundle 3's sum */
        bundle_close(&b);
        if (at >= 0) flip_byte(bad, at);
        CHECK(at >= 0 && bundle_open(&b, bad, &m, a, err, sizeof err) != 0 && strstr(err, "layer 0") &&
                  strstr(err, bad),
              "a corrupted bundle checksum is refused at open, naming the layer (%s)", err);
    }

    /* an older file (its bundles summed another way): named, with what to do */
    snprintf(bad, sizeof bad, "%s.v2", out);
    test_copy_file(out, bad, test_file_size(out));
    CHECK(set_version(bad, 2) && bundle_open(&b, bad, &m, a, err, sizeof err) != 0 && strstr(err, bad) &&
              strstr(err, "version 2") && strstr(err, "pi2 plan"),
          "a version 2 bundle file is refused, saying to plan again (%s)", err);

    int32_t *o = shuffled(&m);
    o[5] = o[6]; /* neuron listed twice */
    snprintf(bad, sizeof bad, "%s.badorder", out);
    CHECK(bundle_write(&m, a, o, 1, bad, NULL, NULL, err, sizeof err) != 0 && strstr(err, "twice") && access(bad, F_OK),
          "an order with a repeated neuron is refused, nothing written (%s)", err);
    CHECK(bundle_write(&m, a, NULL, 0, bad, NULL, NULL, err, sizeof err) != 0 &&
              bundle_write(&m, a, NULL, BUNDLE_MAX_PER_BUNDLE + 1, bad, NULL, NULL, err, sizeof err) != 0,
          "per_bundle outside 1..%d is refused", BUNDLE_MAX_PER_BUNDLE);
    free(o);

    CHECK(bundle_open(&b, a, NULL, NULL, err, sizeof err) != 0 && strstr(err, "not a pi2 bundle"),
          "a model file is not a bundle file (%s)", err);
    model_free(&m), model_free(&mo);
}

int main(void) {
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return test_summary();
    }
    /* GGUF Q4_0: ffn_down's columns requantized to Q8_0 (within 1 % of the column's largest value) */
    check_model("gguf-q4_0.gguf", "--preset tiny --act relu --type q4_0 --seed 5", 1e-2f);
    check_model("gguf-f16.gguf", "--preset tiny --act relu --type f16 --seed 5", 0.0f);
    check_model("pwri-q4_0.gguf", "--preset tiny --act relu --type q4_0 --seed 5 --pwri", 0.0f);
    check_refusals();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "removing %s", dir);
    return test_summary();
}

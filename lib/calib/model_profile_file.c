/* The model profile's file (model_profile.h): written through the GGUF
 * writer, read by the strict reader and then checked field by field, since
 * every length and count in it sizes what the reader allocates. */
#include "calib/model_profile.h"

#include <stdbool.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/predictor.h" /* model_fingerprint */
#include "gguf/gguf.h"
#include "util/log.h"

#define KEY(name) "pi2.profile." name
#define PROFILE_TYPE "pi2.profile"
#define PROFILE_MAX_LAYERS 4096
#define PROFILE_MAX_FF (1 << 24)

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static size_t layer_fired_bytes(const model_profile *p) {
    return sizeof(uint64_t) * (size_t)p->n_ff * (size_t)p->words;
}

static void declare(gguf_writer *w, const model_profile *p, const char *model_path) {
    gguf_w_str(w, "general.type", PROFILE_TYPE);
    gguf_w_u32(w, KEY("version"), MODEL_PROFILE_VERSION);
    gguf_w_str(w, KEY("mode"), ffn_mode_name(p->mode));
    gguf_w_u32(w, KEY("n_tokens"), (uint32_t)p->n_tokens);
    gguf_w_u32(w, KEY("n_layer"), (uint32_t)p->n_layer);
    gguf_w_u32(w, KEY("n_ff"), (uint32_t)p->n_ff);
    gguf_w_str(w, KEY("source.name"), base_name(model_path));
    gguf_w_u64(w, KEY("source.size"), p->source_size);
    gguf_w_u64(w, KEY("source.fingerprint"), p->source_fingerprint);
    gguf_w_u64(w, KEY("run_hash"), p->run_hash);
    for (int l = 0; l < p->n_layer; l++) {
        char name[64];
        const uint64_t fired_ne[2] = {(uint64_t)p->words * 8, (uint64_t)p->n_ff}, counts_ne[1] = {(uint64_t)p->n_ff};
        snprintf(name, sizeof name, "blk.%d.fired", l);
        gguf_w_tensor(w, name, GGML_TYPE_I8, 2, fired_ne);
        snprintf(name, sizeof name, "blk.%d.counts", l);
        gguf_w_tensor(w, name, GGML_TYPE_I32, 1, counts_ne);
        if (p->guess_missed) {
            snprintf(name, sizeof name, "blk.%d.guess_missed", l);
            gguf_w_tensor(w, name, GGML_TYPE_I32, 1, counts_ne);
        }
    }
}

/* Streams the tensors into fp in declaration order. */
static int write_data(gguf_writer *w, const model_profile *p, FILE *fp) {
    if (gguf_w_begin(w, fp)) return -1;
    for (int l = 0; l < p->n_layer; l++) {
        const size_t at = (size_t)l * (size_t)p->n_ff;
        /* counts below 2^31: their uint32 bytes are the int32 ones */
        if (gguf_w_data(w, p->fired + at * (size_t)p->words, layer_fired_bytes(p)) ||
            gguf_w_data(w, p->counts + at, sizeof(uint32_t) * (size_t)p->n_ff) ||
            (p->guess_missed && gguf_w_data(w, p->guess_missed + at, sizeof(uint32_t) * (size_t)p->n_ff)))
            return -1;
    }
    return gguf_w_finish(w);
}

int model_profile_save(const model_profile *p, const model *m, const char *model_path, const char *path, char *err,
                       size_t errlen) {
    const char *model_name = model_path ? model_path : "the model";
    const uint64_t fp_m = model_fingerprint(m);
    if (p->source_size != (uint64_t)m->gguf.size || p->source_fingerprint != fp_m || p->n_layer != m->n_layer ||
        p->n_ff != m->n_ff) {
        err_set(err, errlen, "%s: the profile was made from another model file (size %llu, fingerprint %016llx), not %s",
                path, (unsigned long long)p->source_size, (unsigned long long)p->source_fingerprint, model_name);
        return -1;
    }
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        err_set(err, errlen, "%s: path too long", path);
        return -1;
    }
    gguf_writer *w = gguf_writer_new("GGUF", GGUF_DEFAULT_ALIGNMENT);
    if (!w) {
        err_set(err, errlen, "out of memory");
        return -1;
    }
    declare(w, p, model_name);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        err_set(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        gguf_writer_free(w);
        return -1;
    }
    const int written = write_data(w, p, fp), closed = fclose(fp);
    int rc = -1;
    if (written)
        err_set(err, errlen, "%s: %s", tmp, gguf_writer_error(w) ? gguf_writer_error(w) : "write failed");
    else if (closed)
        err_set(err, errlen, "%s: write failed", tmp);
    else if (rename(tmp, path))
        err_set(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    else
        rc = 0;
    if (rc) unlink(tmp);
    gguf_writer_free(w);
    return rc;
}

/* ---- reading ---- */

typedef struct {
    gguf_file g;
    const char *path;
    char *err;
    size_t errlen;
} reader;

/* An unsigned key of exactly type `type`, within lo..hi. */
static int get_uint(reader *r, const char *key, uint32_t type, uint64_t lo, uint64_t hi, uint64_t *out) {
    const gguf_kv *kv = gguf_find_kv(&r->g, key);
    if (!kv || kv->type != type) {
        err_set(r->err, r->errlen, "%s: '%s' is %s, expected %s", r->path, key,
                kv ? gguf_value_type_name(kv->type) : "missing", gguf_value_type_name(type));
        return -1;
    }
    *out = kv->v.u64;
    if (*out < lo || *out > hi) {
        err_set(r->err, r->errlen, "%s: '%s' = %llu is not in %llu..%llu", r->path, key, (unsigned long long)*out,
                (unsigned long long)lo, (unsigned long long)hi);
        return -1;
    }
    return 0;
}

static int get_str(reader *r, const char *key, gguf_str *out) {
    if (!gguf_get_str(&r->g, key, out)) {
        err_set(r->err, r->errlen, "%s: '%s' is missing or not a string", r->path, key);
        return -1;
    }
    return 0;
}

static int read_mode(reader *r, ffn_mode *mode) {
    gguf_str s;
    if (get_str(r, KEY("mode"), &s)) return -1;
    const ffn_mode modes[] = {FFN_GATE_FIRST, FFN_PREDICTOR};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (gguf_str_eq(s, ffn_mode_name(modes[i]))) {
            *mode = modes[i];
            return 0;
        }
    err_set(r->err, r->errlen, "%s: '%s' = \"%.*s\", expected \"%s\" or \"%s\"", r->path, KEY("mode"),
            (int)(s.len < 64 ? s.len : 64), s.ptr, ffn_mode_name(FFN_GATE_FIRST), ffn_mode_name(FFN_PREDICTOR));
    return -1;
}

static int read_keys(reader *r, model_profile *p, gguf_str *source_name) {
    gguf_str s;
    if (!gguf_get_str(&r->g, "general.type", &s) || !gguf_str_eq(s, PROFILE_TYPE)) {
        err_set(r->err, r->errlen, "%s: not a pi2 model profile (general.type is not \"%s\")", r->path, PROFILE_TYPE);
        return -1;
    }
    uint64_t v, n_tokens, n_layer, n_ff;
    if (get_uint(r, KEY("version"), GGUF_UINT32, MODEL_PROFILE_VERSION, MODEL_PROFILE_VERSION, &v) ||
        read_mode(r, &p->mode) ||
        get_uint(r, KEY("n_tokens"), GGUF_UINT32, 1, MODEL_PROFILE_MAX_TOKENS, &n_tokens) ||
        get_uint(r, KEY("n_layer"), GGUF_UINT32, 1, PROFILE_MAX_LAYERS, &n_layer) ||
        get_uint(r, KEY("n_ff"), GGUF_UINT32, 1, PROFILE_MAX_FF, &n_ff) || get_str(r, KEY("source.name"), source_name) ||
        get_uint(r, KEY("source.size"), GGUF_UINT64, 0, UINT64_MAX, &p->source_size) ||
        get_uint(r, KEY("source.fingerprint"), GGUF_UINT64, 0, UINT64_MAX, &p->source_fingerprint) ||
        get_uint(r, KEY("run_hash"), GGUF_UINT64, 0, UINT64_MAX, &p->run_hash))
        return -1;
    p->n_tokens = (int)n_tokens, p->n_layer = (int)n_layer, p->n_ff = (int)n_ff;
    p->words = (p->n_tokens + 63) / 64;
    return 0;
}

/* Layer l's tensor `what` ("fired", "counts" or "guess_missed") of the given type and shape, or NULL with err set. */
static const gguf_tensor *layer_tensor(reader *r, int l, const char *what, uint32_t type, uint32_t n_dims,
                                       const uint64_t *ne) {
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s", l, what);
    const gguf_tensor *t = gguf_find_tensor(&r->g, name);
    bool ok = t && t->type == type && t->n_dims == n_dims;
    for (uint32_t d = 0; ok && d < n_dims; d++) ok = t->ne[d] == ne[d];
    if (ok) return t;
    char shape[64];
    if (n_dims == 1) snprintf(shape, sizeof shape, "[%llu]", (unsigned long long)ne[0]);
    else snprintf(shape, sizeof shape, "[%llu, %llu]", (unsigned long long)ne[0], (unsigned long long)ne[1]);
    err_set(r->err, r->errlen, "%s: tensor '%s' must be %s of shape %s%s", r->path, name, ggml_type_name(type), shape,
            t ? "" : " (it is missing)");
    return NULL;
}

/* Every tensor is checked before anything is allocated: the sizes then come from a valid file. */
static int check_tensors(reader *r, const model_profile *p) {
    const int per_layer = p->mode == FFN_PREDICTOR ? 3 : 2; /* fired, counts, and the guess's misses */
    if (r->g.n_tensors != (uint64_t)per_layer * (uint64_t)p->n_layer) {
        err_set(r->err, r->errlen, "%s: %llu tensors, a %s profile of %d layers has %d", r->path,
                (unsigned long long)r->g.n_tensors, ffn_mode_name(p->mode), p->n_layer, per_layer * p->n_layer);
        return -1;
    }
    const uint64_t fired_ne[2] = {(uint64_t)p->words * 8, (uint64_t)p->n_ff}, counts_ne[1] = {(uint64_t)p->n_ff};
    for (int l = 0; l < p->n_layer; l++)
        if (!layer_tensor(r, l, "fired", GGML_TYPE_I8, 2, fired_ne) ||
            !layer_tensor(r, l, "counts", GGML_TYPE_I32, 1, counts_ne) ||
            (per_layer == 3 && !layer_tensor(r, l, "guess_missed", GGML_TYPE_I32, 1, counts_ne)))
            return -1;
    return 0;
}

static int copy_tensors(reader *r, model_profile *p) {
    const size_t rows = (size_t)p->n_layer * (size_t)p->n_ff;
    p->fired = malloc(sizeof *p->fired * rows * (size_t)p->words);
    p->counts = malloc(sizeof *p->counts * rows);
    if (p->mode == FFN_PREDICTOR) p->guess_missed = malloc(sizeof *p->guess_missed * rows);
    if (!p->fired || !p->counts || (p->mode == FFN_PREDICTOR && !p->guess_missed)) {
        err_set(r->err, r->errlen, "%s: out of memory", r->path);
        return -1;
    }
    for (int l = 0; l < p->n_layer; l++) {
        char name[64];
        const size_t at = (size_t)l * (size_t)p->n_ff;
        snprintf(name, sizeof name, "blk.%d.fired", l);
        memcpy(p->fired + at * (size_t)p->words, gguf_find_tensor(&r->g, name)->data, layer_fired_bytes(p));
        snprintf(name, sizeof name, "blk.%d.counts", l);
        memcpy(p->counts + at, gguf_find_tensor(&r->g, name)->data, sizeof *p->counts * (size_t)p->n_ff);
        if (p->guess_missed) {
            snprintf(name, sizeof name, "blk.%d.guess_missed", l);
            memcpy(p->guess_missed + at, gguf_find_tensor(&r->g, name)->data, sizeof *p->counts * (size_t)p->n_ff);
        }
    }
    return 0;
}

/* Each count is its bitset's popcount, and no bit lies past the last token. */
static int check_counts(reader *r, const model_profile *p) {
    const int tail = p->n_tokens % 64;
    const uint64_t beyond = tail ? ~0ull << tail : 0;
    for (int l = 0; l < p->n_layer; l++)
        for (int i = 0; i < p->n_ff; i++) {
            const size_t row = (size_t)l * (size_t)p->n_ff + (size_t)i;
            const uint64_t *bits = p->fired + row * (size_t)p->words;
            uint32_t n = 0;
            for (int w = 0; w < p->words; w++) n += (uint32_t)__builtin_popcountll(bits[w]);
            if (bits[p->words - 1] & beyond) {
                err_set(r->err, r->errlen, "%s: layer %d neuron %d fired on a token past n_tokens = %d", r->path, l,
                        i, p->n_tokens);
                return -1;
            }
            if (n != p->counts[row]) {
                err_set(r->err, r->errlen, "%s: layer %d neuron %d: count %u, but its bitset holds %u tokens", r->path,
                        l, i, p->counts[row], n);
                return -1;
            }
            if (p->guess_missed && p->guess_missed[row] > n) {
                err_set(r->err, r->errlen, "%s: layer %d neuron %d: the guess missed it on %u tokens, more than the %u "
                        "it fired on", r->path, l, i, p->guess_missed[row], n);
                return -1;
            }
        }
    return 0;
}

/* Made from m's file: the error names both. */
static int match_model(reader *r, const model_profile *p, gguf_str source_name, const model *m,
                       const char *model_path) {
    const uint64_t fp = model_fingerprint(m);
    if (p->source_size == (uint64_t)m->gguf.size && p->source_fingerprint == fp && p->n_layer == m->n_layer &&
        p->n_ff == m->n_ff)
        return 0;
    err_set(r->err, r->errlen,
            "profile %s was made from another model file (%.*s: size %llu, fingerprint %016llx, %d layers of %d "
            "neurons), not %s (size %llu, fingerprint %016llx, %d layers of %d neurons): profile it again",
            r->path, (int)(source_name.len < 256 ? source_name.len : 256), source_name.ptr,
            (unsigned long long)p->source_size, (unsigned long long)p->source_fingerprint, p->n_layer, p->n_ff,
            model_path, (unsigned long long)m->gguf.size, (unsigned long long)fp, m->n_layer, m->n_ff);
    return -1;
}

/* Validates r's parsed file into p (and against m when given); closes it. */
static int from_gguf(reader r, model_profile *p, const model *m, const char *model_path) {
    gguf_str source_name;
    const int rc = read_keys(&r, p, &source_name) || check_tensors(&r, p) || copy_tensors(&r, p) ||
                           check_counts(&r, p) ||
                           (m && match_model(&r, p, source_name, m, model_path ? model_path : "the model"))
                       ? -1
                       : 0;
    gguf_close(&r.g);
    if (rc) model_profile_free(p);
    return rc;
}

int model_profile_load(model_profile *p, const char *path, const model *m, const char *model_path, char *err,
                       size_t errlen) {
    memset(p, 0, sizeof *p);
    reader r = {.path = path, .err = err, .errlen = errlen};
    if (gguf_open(&r.g, path, err, errlen)) return -1;
    return from_gguf(r, p, m, model_path);
}

int model_profile_parse(model_profile *p, const void *buf, size_t size, const char *name, char *err,
                        size_t errlen) {
    memset(p, 0, sizeof *p);
    reader r = {.path = name, .err = err, .errlen = errlen};
    if (gguf_parse(&r.g, buf, size, name, err, errlen)) return -1;
    return from_gguf(r, p, NULL, NULL);
}

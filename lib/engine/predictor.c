/* Run-time side of the activation predictors: loading (PWRI fc1/fc2 or a
 * lowrank side file, validated against the model) and prediction. */
#include "util/log.h"
#include "engine/predictor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/huge_alloc.h"
#include "kernels/kernels.h"
#include "engine/ops.h"
#include "kernels/pred_gemv.h"

struct predictor {
    const model *m;
    predictor_kind kind;
    const kernels *k;
    pred_gemv_f16_fn gemv_f16;  /* both stages of F16 predictors */
    pred_gemv_q8_0_fn gemv_q8_0; /* the second stage of Q8_0 ones, or NULL: a dense dot per row */
    void *owned;            /* PowerInfer's fc1/fc2 as Q8_0 (to_q8_0), every layer's, on huge pages */
    size_t owned_mapped;
    weight *a, *b;          /* per layer: rows = rank x n_embd, n_ff x rank (fc1/fc2 or pred_a/pred_b) */
    float *threshold, *gate_cut;
    int max_rank;
    gguf_file side;         /* lowrank: the mapped side file the weights point into */
    bool has_side;
    float *hidden;          /* [max_rank] */
    float *logits;          /* [n_ff] */
    act_vec conv;           /* conversion buffers for max(n_embd, max_rank) */
};

void predictor_free(predictor *p) {
    if (!p) return;
    if (p->has_side) gguf_close(&p->side);
    huge_free(p->owned, p->owned_mapped);
    free(p->a); free(p->b); free(p->threshold); free(p->gate_cut);
    free(p->hidden); free(p->logits); free(p->conv.f16); free(p->conv.q8);
    free(p);
}

static predictor *alloc_predictor(const model *m, predictor_kind kind) {
    predictor *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->m = m;
    p->kind = kind;
    p->k = kernels_best();
    p->gemv_f16 = p->k->pred_gemv_f16;
    p->gemv_q8_0 = p->k->pred_gemv_q8_0;
    p->a = calloc((size_t)m->n_layer, sizeof *p->a);
    p->b = calloc((size_t)m->n_layer, sizeof *p->b);
    p->threshold = calloc((size_t)m->n_layer, sizeof(float));
    p->gate_cut = calloc((size_t)m->n_layer, sizeof(float));
    if (!p->a || !p->b || !p->threshold || !p->gate_cut) {
        predictor_free(p);
        return NULL;
    }
    return p;
}

/* Scratch sized once the ranks are known. */
static int alloc_scratch(predictor *p) {
    int wide = p->m->n_embd > p->max_rank ? p->m->n_embd : p->max_rank;
    p->hidden = calloc((size_t)p->max_rank, sizeof(float));
    p->logits = calloc((size_t)p->m->n_ff, sizeof(float));
    p->conv.f16 = calloc((size_t)wide, sizeof(uint16_t));
    p->conv.q8 = calloc((size_t)wide / QK8_0 + 1, sizeof(block_q8_0));
    return p->hidden && p->logits && p->conv.f16 && p->conv.q8 ? 0 : -1;
}

/* w's columns padded with zeros to whole Q8_0 blocks */
static int64_t q8_0_cols(const weight *w) { return (w->cols + QK8_0 - 1) / QK8_0 * QK8_0; }

/* w's rows requantized into Q8_0 rows at dst; w becomes that copy. Returns its bytes. */
static size_t requantize_q8_0(const kernels *k, weight *w, char *dst, float *row) {
    const int64_t cols = q8_0_cols(w);
    const size_t row_bytes = ggml_row_bytes(GGML_TYPE_Q8_0, (uint64_t)cols);
    for (int64_t r = 0; r < w->rows; r++) {
        dequantize_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes, row, w->cols);
        memset(row + w->cols, 0, sizeof(float) * (size_t)(cols - w->cols));
        k->quantize_q8_0(row, (block_q8_0 *)(dst + (size_t)r * row_bytes), (int)cols);
    }
    *w = (weight){dst, GGML_TYPE_Q8_0, w->rows, cols, row_bytes};
    return row_bytes * (size_t)w->rows;
}

static bool is_float(const weight *w) { return w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_F32; }

/* PowerInfer's fc1/fc2 (F16 in its files; quantized ones stay as they are)
 * as Q8_0 copies: the dense Q8_0 dot and the Q8_0 pass kernel read 170 bytes
 * for a rank-130 fc2 row against 260, and on the 7B bench model recall and
 * precision moved by 1e-4 (BENCHMARKS.md). fc2's rows are padded to whole
 * blocks with zero weights; the hidden vector is padded with zeros to match
 * (convert_hidden). Only where the pass kernel runs: row by row, Q8_0 rows of
 * the rank are slower than F16 passes. The copy is an image of every layer's
 * converted fc1 then fc2, in that order, so one process can make it for all
 * (predictor_q8_0_image_write). */
/* w's bytes as a Q8_0 copy, or 0 when it stays as it is */
static uint64_t q8_0_copy_bytes(const weight *w) {
    return is_float(w) ? ggml_row_bytes(GGML_TYPE_Q8_0, (uint64_t)q8_0_cols(w)) * (uint64_t)w->rows : 0;
}

uint64_t predictor_q8_0_image_bytes(const model *m) {
    if (!kernels_best()->pred_gemv_q8_0) return 0;
    uint64_t total = 0;
    for (int l = 0; l < m->n_layer; l++) {
        if (!m->layers[l].fc1.data || !m->layers[l].fc2.data) return 0;
        total += q8_0_copy_bytes(&m->layers[l].fc1) + q8_0_copy_bytes(&m->layers[l].fc2);
    }
    return total;
}

/* Points w, if float, at its Q8_0 copy at image (converting it there when
 * convert); returns the copy's bytes (0: w stays as it is). */
static uint64_t place_q8_0(const kernels *k, weight *w, uint8_t *image, bool convert, float *row) {
    const uint64_t bytes = q8_0_copy_bytes(w);
    if (bytes && convert) requantize_q8_0(k, w, (char *)image, row);
    else if (bytes) *w = (weight){image, GGML_TYPE_Q8_0, w->rows, q8_0_cols(w), ggml_row_bytes(GGML_TYPE_Q8_0, (uint64_t)q8_0_cols(w))};
    return bytes;
}

/* every layer's fc1 then fc2 of p placed in (or converted into) image */
static int place_all(predictor *p, uint8_t *image, bool convert) {
    float *row = NULL;
    if (convert) {
        int64_t widest = 0;
        for (int l = 0; l < p->m->n_layer; l++) {
            if (q8_0_cols(&p->a[l]) > widest) widest = q8_0_cols(&p->a[l]);
            if (q8_0_cols(&p->b[l]) > widest) widest = q8_0_cols(&p->b[l]);
        }
        if (!(row = malloc(sizeof(float) * (size_t)widest))) return -1;
    }
    for (int l = 0; l < p->m->n_layer; l++) {
        image += place_q8_0(p->k, &p->a[l], image, convert, row);
        image += place_q8_0(p->k, &p->b[l], image, convert, row);
    }
    free(row);
    return 0;
}

static int to_q8_0(predictor *p) {
    const uint64_t total = predictor_q8_0_image_bytes(p->m);
    if (!total) return 0;
    /* on 2 MiB pages: every token streams all of it, and on 4 KiB pages the
     * worker sharing its core with the coordinator took ~30 % longer per row */
    if (!(p->owned = huge_alloc(total, &p->owned_mapped))) return -1;
    return place_all(p, p->owned, true);
}

/* PowerInfer's fc1/fc2 from the model; their Q8_0 copies converted into memory
 * of our own (image NULL) or found in image, predictor_q8_0_image_bytes long. */
static predictor *load_powerinfer(const model *m, const uint8_t *image, char *err, size_t errlen) {
    for (int l = 0; l < m->n_layer; l++)
        if (!m->layers[l].fc1.data || !m->layers[l].fc2.data) {
            err_set(err, errlen, "the model has no PowerInfer predictor (blk.%d.fc1/fc2); build one with pi2-predictor build",
                    l);
            return NULL;
        }
    predictor *p = alloc_predictor(m, PREDICTOR_POWERINFER);
    if (!p) { err_set(err, errlen, "out of memory"); return NULL; }
    for (int l = 0; l < m->n_layer; l++) {
        p->a[l] = m->layers[l].fc1;
        p->b[l] = m->layers[l].fc2;
        p->threshold[l] = m->sparse_threshold;
        if (p->a[l].rows > p->max_rank) p->max_rank = (int)p->a[l].rows;
    }
    if ((predictor_q8_0_image_bytes(m) && (image ? place_all(p, (uint8_t *)image, false) : to_q8_0(p))) || alloc_scratch(p)) {
        err_set(err, errlen, "out of memory");
        predictor_free(p);
        return NULL;
    }
    return p;
}

predictor *predictor_load_shared(const model *m, const void *image, uint64_t image_bytes, char *err, size_t errlen) {
    if (image_bytes != predictor_q8_0_image_bytes(m)) {
        err_set(err, errlen, "the shared predictor copy has %llu bytes, this model's is %llu",
                (unsigned long long)image_bytes, (unsigned long long)predictor_q8_0_image_bytes(m));
        return NULL;
    }
    return load_powerinfer(m, image_bytes ? image : NULL, err, errlen);
}

int predictor_q8_0_image_write(const model *m, void *image, uint64_t image_bytes, char *err, size_t errlen) {
    if (image_bytes != predictor_q8_0_image_bytes(m)) {
        err_set(err, errlen, "a predictor copy of %llu bytes asked for, this model's has %llu",
                (unsigned long long)image_bytes, (unsigned long long)predictor_q8_0_image_bytes(m));
        return -1;
    }
    if (!image_bytes) return 0;
    predictor *p = alloc_predictor(m, PREDICTOR_POWERINFER); /* a and b only: where the copies come from */
    if (!p) { err_set(err, errlen, "out of memory"); return -1; }
    for (int l = 0; l < m->n_layer; l++) p->a[l] = m->layers[l].fc1, p->b[l] = m->layers[l].fc2;
    const int rc = place_all(p, image, true);
    predictor_free(p);
    if (rc) err_set(err, errlen, "out of memory");
    return rc;
}

static bool get_u32_eq(const gguf_file *g, const char *key, uint64_t want, uint64_t *got) {
    return gguf_get_uint(g, key, got) && *got == want;
}

/* A tensor of the side file as a weight of the expected shape and a predictor type. */
static int side_weight(const gguf_file *g, const char *path, const char *name, int64_t rows, int64_t cols, weight *w,
                       char *err, size_t errlen) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) { err_set(err, errlen, "%s: missing tensor '%s'", path, name); return -1; }
    if (t->n_dims != 2 || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows) {
        err_set(err, errlen, "%s: tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", path, name,
                (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)cols, (long long)rows);
        return -1;
    }
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_Q8_0) {
        err_set(err, errlen, "%s: tensor '%s' has type %s (expected f32, f16 or q8_0)", path, name, ggml_type_name(t->type));
        return -1;
    }
    *w = (weight){t->data, t->type, rows, cols, ggml_row_bytes(t->type, (uint64_t)cols)};
    return 0;
}

static int side_floats(const gguf_file *g, const char *path, const char *key, int n, float *out, char *err,
                       size_t errlen) {
    uint64_t len;
    const void *data;
    if (!gguf_get_arr(g, key, GGUF_FLOAT32, &len, &data) || len != (uint64_t)n) {
        err_set(err, errlen, "%s: '%s' must be an f32 array of %d (one per layer)", path, key, n);
        return -1;
    }
    memcpy(out, data, sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++)
        if (!isfinite(out[i])) {
            err_set(err, errlen, "%s: '%s'[%d] is not finite", path, key, i);
            return -1;
        }
    return 0;
}

/* Identity checks: a side file for another model (or another quantization of it) is refused. */
static int check_identity(const model *m, const gguf_file *g, const char *path, char *err, size_t errlen) {
    uint64_t v;
    const struct { const char *key, *what; uint64_t want; } dims[] = {
        {PRED_KEY_N_LAYER, "layers", (uint64_t)m->n_layer},
        {PRED_KEY_N_EMBD, "n_embd", (uint64_t)m->n_embd},
        {PRED_KEY_N_FF, "n_ff", (uint64_t)m->n_ff},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (!get_u32_eq(g, dims[i].key, dims[i].want, &v)) {
            err_set(err, errlen, "%s: predictor built for a model with %s %llu, this model has %llu", path, dims[i].what,
                    (unsigned long long)v, (unsigned long long)dims[i].want);
            return -1;
        }
    uint64_t size = 0, fp = 0, want_fp = model_fingerprint(m);
    if (!gguf_get_uint(g, PRED_KEY_MODEL_SIZE, &size) || !gguf_get_uint(g, PRED_KEY_FINGERPRINT, &fp) ||
        size != (uint64_t)m->gguf.size || fp != want_fp) {
        err_set(err, errlen,
                "%s: predictor built for another model file (size %llu, fingerprint %016llx); this model: size %llu, "
                "fingerprint %016llx. Rebuild it with pi2-predictor build",
                path, (unsigned long long)size, (unsigned long long)fp, (unsigned long long)m->gguf.size,
                (unsigned long long)want_fp);
        return -1;
    }
    return 0;
}

static predictor *load_lowrank(const model *m, const char *path, char *err, size_t errlen) {
    predictor *p = alloc_predictor(m, PREDICTOR_LOWRANK);
    if (!p) { err_set(err, errlen, "out of memory"); return NULL; }
    if (gguf_open(&p->side, path, err, errlen)) goto fail;
    p->has_side = true;
    const gguf_file *g = &p->side;
    gguf_str s;
    if (!gguf_get_str(g, PRED_KEY_KIND, &s) || !gguf_str_eq(s, "lowrank")) {
        err_set(err, errlen, "%s: not a pi2 predictor ('%s' is not \"lowrank\")", path, PRED_KEY_KIND);
        goto fail;
    }
    if (!gguf_get_str(g, PRED_KEY_INPUT, &s) || !gguf_str_eq(s, "ffn_norm_out")) {
        err_set(err, errlen, "%s: '%s' must be \"ffn_norm_out\"", path, PRED_KEY_INPUT);
        goto fail;
    }
    if (check_identity(m, g, path, err, errlen)) goto fail;
    uint64_t rank;
    int limit = m->n_embd < m->n_ff ? m->n_embd : m->n_ff;
    if (!gguf_get_uint(g, PRED_KEY_RANK, &rank) || rank < 1 || rank > (uint64_t)limit) {
        err_set(err, errlen, "%s: '%s' missing or outside [1, %d]", path, PRED_KEY_RANK, limit);
        goto fail;
    }
    p->max_rank = (int)rank;
    if (side_floats(g, path, PRED_KEY_THRESHOLDS, m->n_layer, p->threshold, err, errlen) ||
        side_floats(g, path, PRED_KEY_GATE_CUT, m->n_layer, p->gate_cut, err, errlen))
        goto fail;
    for (int l = 0; l < m->n_layer; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.pred_a.weight", l);
        if (side_weight(g, path, name, p->max_rank, m->n_embd, &p->a[l], err, errlen)) goto fail;
        snprintf(name, sizeof name, "blk.%d.pred_b.weight", l);
        if (side_weight(g, path, name, m->n_ff, p->max_rank, &p->b[l], err, errlen)) goto fail;
    }
    if (alloc_scratch(p)) { err_set(err, errlen, "out of memory"); goto fail; }
    return p;
fail:
    predictor_free(p);
    return NULL;
}

predictor *predictor_load(const model *m, const char *side_file, char *err, size_t errlen) {
    return side_file ? load_lowrank(m, side_file, err, errlen) : load_powerinfer(m, NULL, err, errlen);
}

predictor_kind predictor_get_kind(const predictor *p) { return p->kind; }
predictor_input predictor_get_input(const predictor *p) {
    return p->kind == PREDICTOR_POWERINFER ? PREDICTOR_INPUT_RESIDUAL : PREDICTOR_INPUT_FFN_NORM_OUT;
}
int predictor_max_rank(const predictor *p) { return p->max_rank; }
float predictor_threshold(const predictor *p, int layer) { return p->threshold[layer]; }
void predictor_set_threshold(predictor *p, int layer, float tau) { p->threshold[layer] = tau; }
float predictor_gate_cut(const predictor *p, int layer) { return p->gate_cut[layer]; }

uint64_t predictor_bytes_per_token(const predictor *p) {
    uint64_t total = 0;
    for (int l = 0; l < p->m->n_layer; l++)
        total += weight_bytes(&p->a[l]) + weight_bytes(&p->b[l]);
    return total;
}

uint64_t predictor_row_bytes(const predictor *p, int layer) { return p->b[layer].row_bytes; }
uint64_t predictor_stage1_bytes(const predictor *p, int layer) { return weight_bytes(&p->a[layer]); }

/* conv = x converted as w's type needs. */
static void convert_for(const predictor *p, const weight *w, const float *x, act_vec *conv) {
    const weight *ws[1] = {w};
    act_convert_for(p->k, conv, x, (int)w->cols, ws, 1);
}

/* out[r - r0] = row r of w . conv over rows [r0, r1) of a quantized or F32 w */
static void predictor_gemv(const predictor *p, const weight *w, const act_vec *conv, long r0, long r1, float *out) {
    if (w->type == GGML_TYPE_Q8_0 && p->gemv_q8_0)
        p->gemv_q8_0((const char *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes, (int)(r1 - r0), conv->q8,
                     (int)w->cols, out);
    else
        matvec_rows_packed(p->k, w, conv, out, r0, r1);
}

long predictor_rank(const predictor *p, int layer) { return (long)p->a[layer].rows; }

const float *predictor_guess_ffn_in(const predictor *p, int layer, const float *x, float *scratch) {
    if (predictor_get_input(p) != PREDICTOR_INPUT_FFN_NORM_OUT) return NULL;
    const model *m = p->m;
    rmsnorm(scratch, x, m->layers[layer].ffn_norm, m->n_embd, m->rms_eps);
    return scratch;
}

void predictor_hidden_rows(const predictor *p, int layer, const float *residual, const float *ffn_in, long r0,
                           long r1, float *hidden, act_vec *conv) {
    const weight *a = &p->a[layer];
    const float *in = p->kind == PREDICTOR_POWERINFER ? residual : ffn_in;
    if (a->type == GGML_TYPE_F16) {
        p->gemv_f16((const char *)a->data + (size_t)r0 * a->row_bytes, a->row_bytes, (int)(r1 - r0), in,
                    (int)a->cols, hidden + r0);
    } else {
        convert_for(p, a, in, conv);
        predictor_gemv(p, a, conv, r0, r1, hidden + r0);
    }
    if (p->kind == PREDICTOR_POWERINFER)
        for (long r = r0; r < r1; r++) hidden[r] = hidden[r] > 0 ? hidden[r] : 0.0f;
}

/* conv = the rank entries of hidden converted for b, whose rows may be
 * padded past the rank to a whole Q8_0 block with zero weights (to_q8_0):
 * the padding converts as zeros. */
static void convert_hidden(const predictor *p, const weight *b, long rank, const float *hidden, act_vec *conv) {
    if (b->cols == rank) {
        convert_for(p, b, hidden, conv);
        return;
    }
    const long whole = rank / QK8_0 * QK8_0;
    float tail[QK8_0] = {0};
    memcpy(tail, hidden + whole, sizeof(float) * (size_t)(rank - whole));
    if (whole) p->k->quantize_q8_0(hidden, conv->q8, (int)whole);
    p->k->quantize_q8_0(tail, conv->q8 + whole / QK8_0, QK8_0);
}

void predictor_hidden_done(const predictor *p, int layer, const float *hidden, act_vec *conv) {
    const weight *b = &p->b[layer];
    if (b->type == GGML_TYPE_F16)
        conv->f32 = hidden; /* predictor_rows' F16 gemv reads the F32 vector: nothing to convert */
    else
        convert_hidden(p, b, predictor_rank(p, layer), hidden, conv);
}

void predictor_prepare(const predictor *p, int layer, const float *residual, const float *ffn_in, float *hidden,
                       act_vec *conv) {
    predictor_hidden_rows(p, layer, residual, ffn_in, 0, predictor_rank(p, layer), hidden, conv);
    predictor_hidden_done(p, layer, hidden, conv);
}

void predictor_rows(const predictor *p, int layer, const act_vec *conv, long i0, long i1, float *logits) {
    const weight *b = &p->b[layer];
    if (b->type == GGML_TYPE_F16) { /* rows of the rank's length: several per pass (pred_gemv.h) */
        p->gemv_f16((const char *)b->data + (size_t)i0 * b->row_bytes, b->row_bytes, (int)(i1 - i0), conv->f32,
                    (int)b->cols, logits);
        return;
    }
    predictor_gemv(p, b, conv, i0, i1, logits);
}

void predictor_logits(predictor *p, int layer, const float *residual, const float *ffn_in, float *logits) {
    predictor_prepare(p, layer, residual, ffn_in, p->hidden, &p->conv);
    predictor_rows(p, layer, &p->conv, 0, (long)p->m->n_ff, logits);
}

int predictor_predict(predictor *p, int layer, const float *residual, const float *ffn_in, int32_t *active, int cap) {
    predictor_logits(p, layer, residual, ffn_in, p->logits);
    const float tau = p->threshold[layer];
    int n = 0;
    for (int i = 0; i < p->m->n_ff; i++)
        if (p->logits[i] >= tau) {
            if (n < cap) active[n] = i;
            n++;
        }
    return n;
}

/* FNV-1a, 64 bit: cheap, and the inputs are small. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *s = data;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

uint64_t model_fingerprint(const model *m) {
    const gguf_file *g = &m->gguf;
    uint64_t size = g->size, h = 0xcbf29ce484222325ull;
    h = fnv1a(h, &size, sizeof size);
    h = fnv1a(h, g->base, g->data_offset < g->size ? g->data_offset : g->size);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        h = fnv1a(h, t->data, t->nbytes < 1024 ? t->nbytes : 1024);
    }
    return h;
}

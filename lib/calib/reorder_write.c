/* Hot-neuron layout: writing the renumbered copy of a model file, tensor by
 * tensor, with the per-neuron tensors gathered through a bounded buffer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf.h"
#include "calib/reorder.h"

#define STREAM_BYTES (8u << 20) /* gathered bytes per write */
#define REORDER_PREFIX "pi2.reorder."

typedef enum { ROLE_COPY, ROLE_ROWS, ROLE_COLUMNS } tensor_role;

/* NUL-terminated copy of a string from the mapping, or NULL (out of memory,
 * or an embedded NUL the writer could not reproduce). */
static char *cstr(gguf_str s) {
    if (memchr(s.ptr, 0, s.len)) return NULL;
    char *c = malloc(s.len + 1);
    if (c) memcpy(c, s.ptr, s.len), c[s.len] = 0;
    return c;
}

/* Which neuron-indexed dimension a tensor has, and of which layer. Per-neuron
 * tensors we do not know are refused: copying them unpermuted would break the model. */
static int classify(const model *m, const gguf_tensor *t, tensor_role *role, int *layer, char *err, size_t errlen) {
    *role = ROLE_COPY, *layer = -1;
    char name[128];
    if (t->name.len >= sizeof name) return 0;
    memcpy(name, t->name.ptr, t->name.len);
    name[t->name.len] = 0;
    int l, at = 0;
    if (sscanf(name, "blk.%d.%n", &l, &at) != 1 || at == 0 || l < 0 || l >= m->n_layer) return 0;
    const char *rest = name + at;
    bool rows = !strcmp(rest, "ffn_gate.weight") || !strcmp(rest, "ffn_up.weight") ||
                !strcmp(rest, "ffn_down_t.weight") || !strcmp(rest, "fc2.weight");
    bool cols = !strcmp(rest, "ffn_down.weight");
    bool same = !strcmp(rest, "ffn_norm.weight") || !strcmp(rest, "fc1.weight");
    if (!rows && !cols && !same && !strncmp(rest, "ffn_", 4)) {
        err_set(err, errlen, "tensor '%s': unknown FFN tensor, cannot tell how its neurons move", name);
        return -1;
    }
    if ((rows && (t->n_dims != 2 || t->ne[1] != (uint64_t)m->n_ff)) ||
        (cols && (t->n_dims != 2 || t->ne[0] != (uint64_t)m->n_ff))) {
        err_set(err, errlen, "tensor '%s' is not indexed by the %d neurons where expected", name, m->n_ff);
        return -1;
    }
    *role = rows ? ROLE_ROWS : cols ? ROLE_COLUMNS : ROLE_COPY;
    *layer = l;
    return 0;
}

static int copy_kv(gguf_writer *w, const gguf_kv *kv) {
    char *key = cstr(kv->key);
    if (!key) return -1;
    int rc = 0;
    if (!strncmp(key, REORDER_PREFIX, strlen(REORDER_PREFIX))) goto done; /* replaced below */
    switch (kv->type) {
    case GGUF_UINT8: gguf_w_u8(w, key, (uint8_t)kv->v.u64); break;
    case GGUF_INT8: gguf_w_i8(w, key, (int8_t)kv->v.i64); break;
    case GGUF_UINT16: gguf_w_u16(w, key, (uint16_t)kv->v.u64); break;
    case GGUF_INT16: gguf_w_i16(w, key, (int16_t)kv->v.i64); break;
    case GGUF_UINT32: gguf_w_u32(w, key, (uint32_t)kv->v.u64); break;
    case GGUF_INT32: gguf_w_i32(w, key, (int32_t)kv->v.i64); break;
    case GGUF_UINT64: gguf_w_u64(w, key, kv->v.u64); break;
    case GGUF_INT64: gguf_w_i64(w, key, kv->v.i64); break;
    case GGUF_FLOAT32: gguf_w_f32(w, key, (float)kv->v.f64); break;
    case GGUF_FLOAT64: gguf_w_f64(w, key, kv->v.f64); break;
    case GGUF_BOOL: gguf_w_bool(w, key, kv->v.b); break;
    case GGUF_STRING: {
        char *v = cstr(kv->v.str);
        if (!v) rc = -1;
        else gguf_w_str(w, key, v);
        free(v);
        break;
    }
    case GGUF_ARRAY:
        if (kv->arr_type != GGUF_STRING) {
            gguf_w_arr(w, key, kv->arr_type, kv->arr_n, kv->arr_data);
            break;
        }
        const char **strs = malloc(sizeof *strs * (kv->arr_n ? kv->arr_n : 1));
        uint64_t *lens = malloc(sizeof *lens * (kv->arr_n ? kv->arr_n : 1));
        if (strs && lens) {
            for (uint64_t i = 0; i < kv->arr_n; i++) strs[i] = kv->arr_strs[i].ptr, lens[i] = kv->arr_strs[i].len;
            gguf_w_str_arr(w, key, kv->arr_n, strs, lens);
        } else {
            rc = -1;
        }
        free(strs);
        free(lens);
        break;
    default: rc = -1;
    }
done:
    free(key);
    return rc;
}

/* One quantized element of a Q4_0 block (its 4-bit code) and setting it. */
static unsigned q4_get(const block_q4_0 *b, int e) { return e < 16 ? b->qs[e] & 15u : (unsigned)b->qs[e - 16] >> 4; }
static void q4_set(block_q4_0 *b, int e, unsigned q) {
    if (e < 16) b->qs[e] = (uint8_t)((b->qs[e] & 0xf0) | q);
    else b->qs[e - 16] = (uint8_t)((b->qs[e - 16] & 0x0f) | q << 4);
}

/* dst column j = src column perm[j] of one row. Quantized rows: perm moves
 * whole blocks (reorder_check_perm), so each destination block takes one
 * source block's scale and reorders its quants: no value changes. */
static void permute_columns(uint32_t type, const void *src, void *dst, const int32_t *perm, int n) {
    switch (type) {
    case GGML_TYPE_F32:
        for (int j = 0; j < n; j++) ((float *)dst)[j] = ((const float *)src)[perm[j]];
        break;
    case GGML_TYPE_F16:
        for (int j = 0; j < n; j++) ((uint16_t *)dst)[j] = ((const uint16_t *)src)[perm[j]];
        break;
    case GGML_TYPE_Q8_0:
        for (int b = 0; b < n / QK8_0; b++) {
            const block_q8_0 *s = (const block_q8_0 *)src + perm[b * QK8_0] / QK8_0;
            block_q8_0 *d = (block_q8_0 *)dst + b;
            d->d = s->d;
            for (int k = 0; k < QK8_0; k++) d->qs[k] = s->qs[perm[b * QK8_0 + k] % QK8_0];
        }
        break;
    case GGML_TYPE_Q4_0:
        for (int b = 0; b < n / QK4_0; b++) {
            const block_q4_0 *s = (const block_q4_0 *)src + perm[b * QK4_0] / QK4_0;
            block_q4_0 *d = (block_q4_0 *)dst + b;
            d->d = s->d;
            for (int k = 0; k < QK4_0; k++) q4_set(d, k, q4_get(s, perm[b * QK4_0 + k] % QK4_0));
        }
        break;
    }
}

/* Streams one tensor's data, in its role's order, through buf[STREAM_BYTES]. */
static int write_tensor(gguf_writer *w, const gguf_tensor *t, tensor_role role, const int32_t *perm, int n_ff,
                        uint8_t *buf) {
    if (role == ROLE_COPY) return gguf_w_data(w, t->data, (size_t)t->nbytes);
    const uint8_t *src = t->data;
    size_t row_bytes = ggml_row_bytes(t->type, t->ne[0]);
    uint64_t rows = t->ne[1];
    size_t per_write = STREAM_BYTES / row_bytes ? STREAM_BYTES / row_bytes : 1;
    for (uint64_t r0 = 0; r0 < rows; r0 += per_write) {
        size_t n = rows - r0 < per_write ? (size_t)(rows - r0) : per_write;
        for (size_t k = 0; k < n; k++) {
            uint64_t r = r0 + k;
            if (role == ROLE_ROWS) memcpy(buf + k * row_bytes, src + (size_t)perm[r] * row_bytes, row_bytes);
            else permute_columns(t->type, src + r * row_bytes, buf + k * row_bytes, perm, n_ff);
        }
        if (gguf_w_data(w, buf, n * row_bytes)) return -1;
    }
    return 0;
}

static int check_plan(const model *m, const reorder_plan *p, char *err, size_t errlen) {
    int need = reorder_granularity(m);
    if (p->granularity < 1 || p->granularity % need) {
        err_set(err, errlen, "granularity %d: this file's quantized ffn_down needs whole blocks of %d neurons",
                p->granularity, need);
        return -1;
    }
    for (int l = 0; l < m->n_layer; l++)
        if (reorder_check_perm(p->perm + (size_t)l * m->n_ff, m->n_ff, p->granularity)) {
            err_set(err, errlen, "layer %d: the order is not a permutation of whole %d-neuron groups", l,
                    p->granularity);
            return -1;
        }
    return 0;
}

static void write_metadata(gguf_writer *w, const model *m, const reorder_plan *p, uint32_t *new_counts) {
    size_t cells = (size_t)m->n_layer * m->n_ff;
    gguf_w_u32(w, REORDER_KEY_CALIB_TOKENS, (uint32_t)p->calib_tokens);
    gguf_w_u32(w, REORDER_KEY_GRANULARITY, (uint32_t)p->granularity);
    gguf_w_u64(w, REORDER_KEY_SOURCE, model_fingerprint(m));
    gguf_w_arr(w, REORDER_KEY_PERMUTATION, GGUF_INT32, cells, p->perm);
    if (p->counts) {
        for (size_t c = 0; c < cells; c++) new_counts[c] = p->counts[c / m->n_ff * m->n_ff + (size_t)p->perm[c]];
        gguf_w_arr(w, REORDER_KEY_FIRING, GGUF_UINT32, cells, new_counts);
    }
}

int reorder_write(const model *m, const reorder_plan *p, const char *out_path, char *err, size_t errlen) {
    const gguf_file *g = &m->gguf;
    if (check_plan(m, p, err, errlen)) return -1;
    /* a temporary name, renamed at the end: out_path may even be the (mapped) input */
    size_t tmp_len = strlen(out_path) + 5;
    char *tmp = malloc(tmp_len);
    tensor_role *roles = malloc(sizeof *roles * (g->n_tensors ? g->n_tensors : 1));
    int *layers = malloc(sizeof *layers * (g->n_tensors ? g->n_tensors : 1));
    uint32_t *new_counts = malloc(sizeof *new_counts * (size_t)m->n_layer * m->n_ff);
    uint8_t *buf = NULL;
    gguf_writer *w = gguf_writer_new(g->magic, g->alignment);
    FILE *fp = NULL;
    int rc = -1;
    if (!tmp || !roles || !layers || !new_counts || !w) {
        err_set(err, errlen, "out of memory");
        goto out;
    }
    snprintf(tmp, tmp_len, "%s.tmp", out_path);
    size_t buf_bytes = STREAM_BYTES;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (classify(m, &g->tensors[i], &roles[i], &layers[i], err, errlen)) goto out;
        size_t row_bytes = ggml_row_bytes(g->tensors[i].type, g->tensors[i].ne[0]);
        if (roles[i] != ROLE_COPY && row_bytes > buf_bytes) buf_bytes = row_bytes;
    }
    if (!(buf = malloc(buf_bytes))) {
        err_set(err, errlen, "out of memory");
        goto out;
    }
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (copy_kv(w, &g->kv[i])) {
            err_set(err, errlen, "metadata '%.*s' cannot be copied", (int)g->kv[i].key.len, g->kv[i].key.ptr);
            goto out;
        }
    write_metadata(w, m, p, new_counts);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        char *name = cstr(t->name);
        int idx = name ? gguf_w_tensor(w, name, t->type, t->n_dims, t->ne) : -1;
        free(name);
        if (idx < 0) {
            err_set(err, errlen, "tensor '%.*s': %s", (int)t->name.len, t->name.ptr,
                    gguf_writer_error(w) ? gguf_writer_error(w) : "bad name");
            goto out;
        }
    }
    if (!(fp = fopen(tmp, "wb"))) {
        err_set(err, errlen, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    if (gguf_w_begin(w, fp)) goto write_error;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const int32_t *perm = layers[i] >= 0 ? p->perm + (size_t)layers[i] * m->n_ff : NULL;
        if (write_tensor(w, &g->tensors[i], roles[i], perm, m->n_ff, buf)) goto write_error;
    }
    if (gguf_w_finish(w)) goto write_error;
    int closed = fclose(fp);
    fp = NULL;
    if (closed || rename(tmp, out_path)) {
        err_set(err, errlen, "%s: %s", closed ? tmp : out_path, strerror(errno));
        goto out;
    }
    rc = 0;
    goto out;
write_error:
    err_set(err, errlen, "%s: %s", tmp, gguf_writer_error(w) ? gguf_writer_error(w) : strerror(errno));
out:
    if (fp) fclose(fp);
    if (rc && tmp) remove(tmp);
    gguf_writer_free(w);
    free(buf);
    free(new_counts);
    free(layers);
    free(roles);
    free(tmp);
    return rc;
}

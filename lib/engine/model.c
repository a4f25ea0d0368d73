#include "engine/model.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/huge_alloc.h"
#include "kernels/kernels.h"

const char *ffn_act_name(ffn_act a) {
    switch (a) {
    case FFN_SILU: return "silu";
    case FFN_RELU: return "relu";
    case FFN_RELU2: return "relu2";
    }
    return "?";
}

typedef struct {
    model *m;
    const char *path;
    char *err;
    size_t errlen;
} loader;

static int fail(loader *L, const char *fmt, ...) {
    int n = snprintf(L->err, L->errlen, "%s: ", L->path);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < L->errlen) vsnprintf(L->err + n, L->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static bool arch_key(loader *L, const char *suffix, uint64_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->m->arch, suffix);
    return gguf_get_uint(&L->m->gguf, key, out);
}

static bool arch_float(loader *L, const char *suffix, double *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->m->arch, suffix);
    return gguf_get_float(&L->m->gguf, key, out);
}

static int required_dim(loader *L, const char *suffix, int *out) {
    uint64_t v;
    if (!arch_key(L, suffix, &v)) return fail(L, "missing metadata key '%s.%s'", L->m->arch, suffix);
    if (v == 0 || v > (1u << 24)) return fail(L, "metadata '%s.%s' = %llu is out of range", L->m->arch, suffix, (unsigned long long)v);
    *out = (int)v;
    return 0;
}

/* Find a 2-D tensor with ne = [cols, rows]; optional tensors may be absent. */
static int get_weight(loader *L, weight *w, const char *name, int64_t rows, int64_t cols, bool optional) {
    memset(w, 0, sizeof *w);
    const gguf_tensor *t = gguf_find_tensor(&L->m->gguf, name);
    if (!t) return optional ? 0 : fail(L, "missing tensor '%s'", name);
    if (!ggml_type_supported(t->type))
        return fail(L, "tensor '%s' has type %s, not a weight type (f32, f16, q4_0, q8_0)", name,
                    ggml_type_name(t->type));
    if (t->n_dims > 2 || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows)
        return fail(L, "tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", name,
                    (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)cols, (long long)rows);
    w->data = t->data;
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = ggml_row_bytes(t->type, (uint64_t)cols);
    return 0;
}

/* Norm vectors are used as F32 everywhere; convert whatever is stored. */
static int get_norm(loader *L, float **out, const char *name, int n) {
    const gguf_tensor *t = gguf_find_tensor(&L->m->gguf, name);
    if (!t) return fail(L, "missing tensor '%s'", name);
    if (!ggml_type_supported(t->type))
        return fail(L, "tensor '%s' has type %s, not a weight type (f32, f16, q4_0, q8_0)", name,
                    ggml_type_name(t->type));
    if (t->n_dims != 1 || t->ne[0] != (uint64_t)n)
        return fail(L, "tensor '%s' has %u dims / %llu elements, expected a vector of %d", name, t->n_dims,
                    (unsigned long long)t->ne[0], n);
    *out = malloc(sizeof(float) * (size_t)n);
    if (!*out) return fail(L, "out of memory");
    dequantize_row(t->type, t->data, *out, n);
    return 0;
}

static int read_hparams(loader *L) {
    model *m = L->m;
    gguf_str arch;
    if (!gguf_get_str(&m->gguf, "general.architecture", &arch)) return fail(L, "missing metadata key 'general.architecture'");
    if (arch.len >= sizeof m->arch) return fail(L, "general.architecture is too long");
    memcpy(m->arch, arch.ptr, arch.len);
    m->arch[arch.len] = 0;
    if (strcmp(m->arch, "llama") && strcmp(m->arch, "bamboo"))
        return fail(L, "architecture '%s' is not supported (pi2 runs llama and bamboo)", m->arch);

    if (required_dim(L, "embedding_length", &m->n_embd) || required_dim(L, "block_count", &m->n_layer) ||
        required_dim(L, "feed_forward_length", &m->n_ff) || required_dim(L, "attention.head_count", &m->n_head))
        return -1;
    uint64_t v;
    m->n_head_kv = arch_key(L, "attention.head_count_kv", &v) ? (int)v : m->n_head;
    m->n_ctx_train = arch_key(L, "context_length", &v) ? (int)v : 2048;
    if (m->n_head_kv <= 0 || m->n_head % m->n_head_kv || m->n_embd % m->n_head)
        return fail(L, "head counts do not divide: n_embd %d, heads %d, kv heads %d", m->n_embd, m->n_head, m->n_head_kv);
    m->head_dim = m->n_embd / m->n_head;
    if (m->head_dim % 2) return fail(L, "head size %d is odd: RoPE needs pairs", m->head_dim);
    if (arch_key(L, "rope.dimension_count", &v) && v != (uint64_t)m->head_dim)
        return fail(L, "rope.dimension_count %llu != head size %d: partial RoPE is not supported", (unsigned long long)v, m->head_dim);
    if (m->n_ctx_train <= 0 || m->n_ctx_train > (1 << 22)) return fail(L, "context_length %d out of range", m->n_ctx_train);

    double f;
    m->rope_base = arch_float(L, "rope.freq_base", &f) ? (float)f : 10000.0f;
    m->rms_eps = arch_float(L, "attention.layer_norm_rms_epsilon", &f) ? (float)f : 1e-5f;
    if (!(m->rms_eps > 0) || !(m->rope_base > 0)) return fail(L, "rms epsilon and rope base must be positive");

    gguf_str act;
    bool pwri = !strcmp(m->gguf.magic, "PWRI");
    if (gguf_get_str(&m->gguf, PI2_KEY_FFN_ACT, &act)) {
        if (gguf_str_eq(act, "silu")) m->act = FFN_SILU;
        else if (gguf_str_eq(act, "relu")) m->act = FFN_RELU;
        else if (gguf_str_eq(act, "relu2")) m->act = FFN_RELU2;
        else return fail(L, "metadata '%s' = '%.*s' (expected silu, relu or relu2)", PI2_KEY_FFN_ACT, (int)act.len, act.ptr);
    } else {
        m->act = !strcmp(m->arch, "bamboo") ? FFN_RELU2 : pwri ? FFN_RELU : FFN_SILU;
    }
    m->sparse_threshold = gguf_get_float(&m->gguf, "powerinfer.sparse_threshold", &f) ? (float)f : 0.0f;
    return 0;
}

static int read_weights(loader *L) {
    model *m = L->m;
    const gguf_tensor *emb = gguf_find_tensor(&m->gguf, "token_embd.weight");
    if (!emb) return fail(L, "missing tensor 'token_embd.weight'");
    if (emb->ne[1] == 0 || emb->ne[1] > (1u << 24)) return fail(L, "token_embd.weight: vocabulary size %llu out of range", (unsigned long long)emb->ne[1]);
    m->n_vocab = (int)emb->ne[1];
    int64_t kv_dim = (int64_t)m->n_head_kv * m->head_dim;
    if (get_weight(L, &m->tok_embd, "token_embd.weight", m->n_vocab, m->n_embd, false)) return -1;
    if (get_norm(L, &m->output_norm, "output_norm.weight", m->n_embd)) return -1;
    if (get_weight(L, &m->output, "output.weight", m->n_vocab, m->n_embd, true)) return -1;
    m->tied_output = m->output.data == NULL;
    if (m->tied_output) m->output = m->tok_embd;

    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    if (!m->layers) return fail(L, "out of memory");
    for (int l = 0; l < m->n_layer; l++) {
        layer_weights *w = &m->layers[l];
        char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
        if (get_norm(L, &w->attn_norm, NAME("attn_norm.weight"), m->n_embd) ||
            get_norm(L, &w->ffn_norm, NAME("ffn_norm.weight"), m->n_embd) ||
            get_weight(L, &w->wq, NAME("attn_q.weight"), m->n_embd, m->n_embd, false) ||
            get_weight(L, &w->wk, NAME("attn_k.weight"), kv_dim, m->n_embd, false) ||
            get_weight(L, &w->wv, NAME("attn_v.weight"), kv_dim, m->n_embd, false) ||
            get_weight(L, &w->wo, NAME("attn_output.weight"), m->n_embd, m->n_embd, false) ||
            get_weight(L, &w->gate, NAME("ffn_gate.weight"), m->n_ff, m->n_embd, false) ||
            get_weight(L, &w->up, NAME("ffn_up.weight"), m->n_ff, m->n_embd, false) ||
            get_weight(L, &w->down, NAME("ffn_down.weight"), m->n_embd, m->n_ff, true) ||
            get_weight(L, &w->down_t, NAME("ffn_down_t.weight"), m->n_ff, m->n_embd, true))
            return -1;
        if (!w->down.data && !w->down_t.data) return fail(L, "layer %d has neither ffn_down nor ffn_down_t", l);
        const gguf_tensor *fc1 = gguf_find_tensor(&m->gguf, NAME("fc1.weight"));
        if (fc1) {
            int64_t rank = (int64_t)fc1->ne[1];
            if (get_weight(L, &w->fc1, NAME("fc1.weight"), rank, m->n_embd, false) ||
                get_weight(L, &w->fc2, NAME("fc2.weight"), m->n_ff, rank, false))
                return -1;
        }
#undef NAME
    }
    return 0;
}

static int read_model(model *m, loader *L) {
    if (read_hparams(L) || read_weights(L)) {
        model_free(m);
        return -1;
    }
    return 0;
}

int model_load(model *m, const char *path, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    loader L = {m, path, err, errlen};
    if (gguf_open(&m->gguf, path, err, errlen)) return -1;
    return read_model(m, &L);
}

static int read_all(int fd, uint8_t *buf, size_t size) {
    for (size_t done = 0; done < size;) {
        ssize_t n = pread(fd, buf + done, size - done < (1u << 30) ? size - done : (1u << 30), (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        done += (size_t)n;
    }
    return 0;
}

int model_load_resident(model *m, const char *path, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    loader L = {m, path, err, errlen};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size, mapped = 0;
    uint8_t *buf = S_ISREG(st.st_mode) ? huge_alloc(size ? size : 1, &mapped) : NULL;
    if (!buf || read_all(fd, buf, size)) {
        snprintf(err, errlen, "%s: %s", path, !S_ISREG(st.st_mode) ? "not a regular file"
                                              : buf ? "read failed or the file shrank" : "out of memory");
        huge_free(buf, mapped);
        close(fd);
        return -1;
    }
    close(fd);
    if (gguf_parse(&m->gguf, buf, size, path, err, errlen)) {
        huge_free(buf, mapped);
        return -1;
    }
    m->resident = buf;
    m->resident_bytes = mapped;
    return read_model(m, &L);
}

void layer_weights_neurons(layer_weights *w, long n0, long n1) {
    weight *rows[3] = {&w->gate, &w->up, &w->down_t};
    for (int i = 0; i < 3; i++)
        if (rows[i]->data) {
            rows[i]->data = (const char *)rows[i]->data + (size_t)n0 * rows[i]->row_bytes;
            rows[i]->rows = n1 - n0;
        }
}

int model_release_file_pages(const model *m, const char *path) {
    if (m->gguf.mapped) madvise((void *)m->gguf.base, m->gguf.size, MADV_DONTNEED);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    const int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    if (rc) errno = rc;
    return rc ? -1 : 0;
}

void model_free(model *m) {
    if (m->layers) {
        for (int l = 0; l < m->n_layer; l++) {
            free(m->layers[l].attn_norm);
            free(m->layers[l].ffn_norm);
        }
    }
    free(m->layers);
    free(m->output_norm);
    gguf_close(&m->gguf);
    huge_free(m->resident, m->resident_bytes);
    memset(m, 0, sizeof *m);
}

uint64_t weight_bytes(const weight *w) { return w->data ? (uint64_t)w->rows * w->row_bytes : 0; }

uint64_t model_ffn_bytes_per_token(const model *m) {
    uint64_t total = 0;
    for (int l = 0; l < m->n_layer; l++) {
        const layer_weights *w = &m->layers[l];
        total += weight_bytes(&w->gate) + weight_bytes(&w->up) +
                 (w->down.data ? weight_bytes(&w->down) : weight_bytes(&w->down_t));
    }
    return total;
}

uint64_t model_bytes_per_token(const model *m) {
    uint64_t total = weight_bytes(&m->output) + (uint64_t)m->tok_embd.row_bytes + model_ffn_bytes_per_token(m);
    for (int l = 0; l < m->n_layer; l++) {
        const layer_weights *w = &m->layers[l];
        total += weight_bytes(&w->wq) + weight_bytes(&w->wk) + weight_bytes(&w->wv) + weight_bytes(&w->wo);
    }
    return total;
}

#define TRANSPOSE_CHUNK 256 /* columns dequantized at a time: a multiple of every block size */

int weight_transpose(const weight *w, uint32_t type, weight *out) {
    return weight_transpose_cols(w, 0, (long)w->cols, type, out);
}

int weight_transpose_cols(const weight *w, long c_begin, long c_end, uint32_t type, weight *out) {
    memset(out, 0, sizeof *out);
    if ((type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0) && w->rows % QK8_0) return -1;
    if (c_begin < 0 || c_end > w->cols || c_begin > c_end || (w->type != GGML_TYPE_F32 && w->type != GGML_TYPE_F16 && c_begin % QK8_0))
        return -1;
    size_t row_bytes = ggml_row_bytes(type, (uint64_t)w->rows);
    char *data = malloc((size_t)(c_end - c_begin) * row_bytes + 1);
    float *tile = malloc(sizeof(float) * TRANSPOSE_CHUNK * (size_t)w->rows); /* [rows][chunk] */
    float *column = malloc(sizeof(float) * (size_t)w->rows);
    if (!data || !tile || !column) {
        free(data); free(tile); free(column);
        return -1;
    }
    for (int64_t c0 = c_begin; c0 < c_end; c0 += TRANSPOSE_CHUNK) {
        int64_t len = c_end - c0 < TRANSPOSE_CHUNK ? c_end - c0 : TRANSPOSE_CHUNK;
        for (int64_t r = 0; r < w->rows; r++)
            dequantize_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes + ggml_row_bytes(w->type, (uint64_t)c0),
                           tile + (size_t)r * TRANSPOSE_CHUNK, len);
        for (int64_t j = 0; j < len; j++) {
            for (int64_t r = 0; r < w->rows; r++) column[r] = tile[(size_t)r * TRANSPOSE_CHUNK + (size_t)j];
            quantize_row(type, column, data + (size_t)(c0 - c_begin + j) * row_bytes, w->rows);
        }
    }
    free(tile);
    free(column);
    *out = (weight){data, type, c_end - c_begin, w->rows, row_bytes};
    return 0;
}

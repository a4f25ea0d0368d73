/* GGUF v3 writer. Metadata and tensor infos are collected in memory (they are
 * small); tensor data is streamed straight to the FILE, so writing a file of
 * any size needs memory only for its metadata. The first error sticks: every
 * later call is a no-op, and gguf_writer_error() tells what went wrong. */
#include "gguf/gguf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes, offset;
} declared_tensor;

struct gguf_writer {
    char magic[4];
    uint64_t alignment;
    bool alignment_key; /* general.alignment is among the kvs already */

    uint8_t *kv_buf; /* the encoded key/value pairs */
    size_t kv_len, kv_cap;
    char **keys;     /* for duplicate detection */
    size_t n_kv, keys_cap;

    declared_tensor *tensors;
    size_t n_tensors, tensors_cap;
    uint64_t data_size; /* end of the declared data, padded */

    FILE *fp;
    bool begun;
    uint64_t pos;       /* bytes written to fp */
    size_t cur;         /* tensor being streamed */
    uint64_t cur_done;  /* its bytes written so far */

    char err[256];
};

static void werr(gguf_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void werr(gguf_writer *w, const char *fmt, ...) {
    if (w->err[0]) return; /* the first error is the one worth reporting */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
}

static bool grow(gguf_writer *w, void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2 / elem) {
            werr(w, "out of memory");
            return false;
        }
        n *= 2;
    }
    void *p = realloc(*buf, n * elem);
    if (!p) {
        werr(w, "out of memory");
        return false;
    }
    *buf = p;
    *cap = n;
    return true;
}

static void put(gguf_writer *w, const void *p, size_t n) {
    if (w->err[0]) return;
    if (n > SIZE_MAX - w->kv_len) {
        werr(w, "metadata too large");
        return;
    }
    if (!grow(w, (void **)&w->kv_buf, &w->kv_cap, w->kv_len + n, 1)) return;
    if (n) memcpy(w->kv_buf + w->kv_len, p, n);
    w->kv_len += n;
}

static void put_u32(gguf_writer *w, uint32_t v) { put(w, &v, 4); }
static void put_u64(gguf_writer *w, uint64_t v) { put(w, &v, 8); }

static void put_str(gguf_writer *w, const char *s, uint64_t len) {
    put_u64(w, len);
    put(w, s, (size_t)len);
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* Checks and records the key, then encodes key and value type. */
static bool begin_kv(gguf_writer *w, const char *key, uint32_t type) {
    if (w->err[0]) return false;
    if (w->begun) {
        werr(w, "kv '%s' added after gguf_w_begin", key);
        return false;
    }
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) {
            werr(w, "duplicate key '%s'", key);
            return false;
        }
    if (!strcmp(key, "general.alignment") && type != GGUF_UINT32) {
        werr(w, "general.alignment must be uint32, not %s", gguf_value_type_name(type));
        return false;
    }
    char *copy = strdup(key);
    if (!copy || !grow(w, (void **)&w->keys, &w->keys_cap, w->n_kv + 1, sizeof *w->keys)) {
        free(copy);
        werr(w, "out of memory");
        return false;
    }
    w->keys[w->n_kv++] = copy;
    put_str(w, key, strlen(key));
    put_u32(w, type);
    return !w->err[0];
}

static void w_scalar(gguf_writer *w, const char *key, uint32_t type, const void *v) {
    if (begin_kv(w, key, type)) put(w, v, scalar_size(type));
}

void gguf_w_u8(gguf_writer *w, const char *key, uint8_t v) { w_scalar(w, key, GGUF_UINT8, &v); }
void gguf_w_i8(gguf_writer *w, const char *key, int8_t v) { w_scalar(w, key, GGUF_INT8, &v); }
void gguf_w_u16(gguf_writer *w, const char *key, uint16_t v) { w_scalar(w, key, GGUF_UINT16, &v); }
void gguf_w_i16(gguf_writer *w, const char *key, int16_t v) { w_scalar(w, key, GGUF_INT16, &v); }
void gguf_w_i32(gguf_writer *w, const char *key, int32_t v) { w_scalar(w, key, GGUF_INT32, &v); }
void gguf_w_u64(gguf_writer *w, const char *key, uint64_t v) { w_scalar(w, key, GGUF_UINT64, &v); }
void gguf_w_i64(gguf_writer *w, const char *key, int64_t v) { w_scalar(w, key, GGUF_INT64, &v); }
void gguf_w_f32(gguf_writer *w, const char *key, float v) { w_scalar(w, key, GGUF_FLOAT32, &v); }
void gguf_w_f64(gguf_writer *w, const char *key, double v) { w_scalar(w, key, GGUF_FLOAT64, &v); }

void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v) {
    /* an explicit general.alignment (e.g. copied from another file) must agree with the layout */
    if (!strcmp(key, "general.alignment")) {
        if (v != w->alignment) {
            werr(w, "general.alignment %u differs from the writer's alignment %llu", v,
                 (unsigned long long)w->alignment);
            return;
        }
        w->alignment_key = true;
    }
    w_scalar(w, key, GGUF_UINT32, &v);
}

void gguf_w_bool(gguf_writer *w, const char *key, bool v) {
    uint8_t b = v;
    w_scalar(w, key, GGUF_BOOL, &b);
}

void gguf_w_str(gguf_writer *w, const char *key, const char *v) {
    if (begin_kv(w, key, GGUF_STRING)) put_str(w, v, strlen(v));
}

void gguf_w_arr(gguf_writer *w, const char *key, uint32_t elem_type, uint64_t n, const void *data) {
    size_t elem = scalar_size(elem_type);
    if (!elem) {
        werr(w, "kv '%s': array element type %s is not a scalar type", key,
             gguf_value_type_name(elem_type));
        return;
    }
    size_t bytes;
    if (__builtin_mul_overflow(n, (uint64_t)elem, &bytes)) {
        werr(w, "kv '%s': array of %llu elements is too large", key, (unsigned long long)n);
        return;
    }
    if (elem_type == GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1) {
                werr(w, "kv '%s': bool [%llu] is not 0 or 1", key, (unsigned long long)i);
                return;
            }
    if (!begin_kv(w, key, GGUF_ARRAY)) return;
    put_u32(w, elem_type);
    put_u64(w, n);
    put(w, data, bytes);
}

void gguf_w_str_arr(gguf_writer *w, const char *key, uint64_t n, const char *const *strs,
                    const uint64_t *lens) {
    if (!begin_kv(w, key, GGUF_ARRAY)) return;
    put_u32(w, GGUF_STRING);
    put_u64(w, n);
    for (uint64_t i = 0; i < n && !w->err[0]; i++) put_str(w, strs[i], lens ? lens[i] : strlen(strs[i]));
}

static uint64_t pad_to(uint64_t x, uint64_t alignment) { return (alignment - x % alignment) % alignment; }

int gguf_w_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                  const uint64_t *ne) {
    if (w->err[0]) return -1;
    if (w->begun) {
        werr(w, "tensor '%s' declared after gguf_w_begin", name);
        return -1;
    }
    for (size_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name)) {
            werr(w, "duplicate tensor name '%s'", name);
            return -1;
        }
    if (!ggml_type_known(type)) {
        werr(w, "tensor '%s': type %s (%u) is not supported", name, ggml_type_name(type), type);
        return -1;
    }
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
        werr(w, "tensor '%s': n_dims %u is not in 1..%d", name, n_dims, GGUF_MAX_DIMS);
        return -1;
    }
    declared_tensor t = {.type = type, .n_dims = n_dims, .offset = w->data_size};
    uint64_t rows = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || (d > 0 && __builtin_mul_overflow(rows, t.ne[d], &rows))) {
            werr(w, "tensor '%s': bad shape (a dimension is 0 or the size overflows)", name);
            return -1;
        }
    }
    size_t row = ggml_row_bytes(type, t.ne[0]);
    uint64_t end;
    if (!row || __builtin_mul_overflow((uint64_t)row, rows, &t.nbytes) ||
        __builtin_add_overflow(t.offset, t.nbytes, &end) ||
        __builtin_add_overflow(end, pad_to(end, w->alignment), &end)) {
        werr(w, "tensor '%s': row length %llu does not fit %s blocks of %u, or the size overflows", name,
             (unsigned long long)t.ne[0], ggml_type_name(type), ggml_block_elems(type));
        return -1;
    }
    t.name = strdup(name);
    if (!t.name || !grow(w, (void **)&w->tensors, &w->tensors_cap, w->n_tensors + 1, sizeof t)) {
        free(t.name);
        werr(w, "out of memory");
        return -1;
    }
    w->tensors[w->n_tensors] = t;
    w->data_size = end;
    return (int)w->n_tensors++;
}

static void out(gguf_writer *w, const void *p, size_t n) {
    if (w->err[0] || !n) return;
    if (fwrite(p, 1, n, w->fp) != n) {
        werr(w, "write failed at byte %llu: %s", (unsigned long long)w->pos, strerror(errno));
        return;
    }
    w->pos += n;
}

static void out_padding(gguf_writer *w) {
    static const uint8_t zeros[4096];
    for (uint64_t pad = pad_to(w->pos, w->alignment); pad && !w->err[0];) {
        size_t n = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        out(w, zeros, n);
        pad -= n;
    }
}

static void out_u32(gguf_writer *w, uint32_t v) { out(w, &v, 4); }
static void out_u64(gguf_writer *w, uint64_t v) { out(w, &v, 8); }

int gguf_w_begin(gguf_writer *w, FILE *fp) {
    if (w->err[0]) return -1;
    if (w->begun) {
        werr(w, "gguf_w_begin called twice");
        return -1;
    }
    if (w->alignment != GGUF_DEFAULT_ALIGNMENT && !w->alignment_key)
        gguf_w_u32(w, "general.alignment", (uint32_t)w->alignment);
    w->begun = true;
    w->fp = fp;
    out(w, w->magic, 4);
    out_u32(w, 3);
    out_u64(w, w->n_tensors);
    out_u64(w, w->n_kv);
    out(w, w->kv_buf, w->kv_len);
    for (size_t i = 0; i < w->n_tensors; i++) {
        const declared_tensor *t = &w->tensors[i];
        uint64_t len = strlen(t->name);
        out_u64(w, len);
        out(w, t->name, (size_t)len);
        out_u32(w, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) out_u64(w, t->ne[d]);
        out_u32(w, t->type);
        out_u64(w, t->offset);
    }
    out_padding(w);
    return w->err[0] ? -1 : 0;
}

int gguf_w_data(gguf_writer *w, const void *data, size_t n) {
    if (w->err[0]) return -1;
    if (!w->begun) {
        werr(w, "gguf_w_data called before gguf_w_begin");
        return -1;
    }
    const uint8_t *p = data;
    while (n && !w->err[0]) {
        if (w->cur >= w->n_tensors) {
            werr(w, "%zu bytes of data beyond the declared tensors", n);
            break;
        }
        const declared_tensor *t = &w->tensors[w->cur];
        uint64_t room = t->nbytes - w->cur_done;
        size_t chunk = n < room ? n : (size_t)room;
        out(w, p, chunk);
        p += chunk;
        n -= chunk;
        w->cur_done += chunk;
        if (w->cur_done == t->nbytes) {
            out_padding(w);
            w->cur++;
            w->cur_done = 0;
        }
    }
    return w->err[0] ? -1 : 0;
}

int gguf_w_finish(gguf_writer *w) {
    if (w->err[0]) return -1;
    if (!w->begun) {
        werr(w, "gguf_w_finish called before gguf_w_begin");
        return -1;
    }
    if (w->cur < w->n_tensors) {
        const declared_tensor *t = &w->tensors[w->cur];
        werr(w, "tensor '%s' has %llu of its %llu bytes (%zu of %zu tensors complete)", t->name,
             (unsigned long long)w->cur_done, (unsigned long long)t->nbytes, w->cur, w->n_tensors);
        return -1;
    }
    if (fflush(w->fp) || ferror(w->fp)) werr(w, "write failed: %s", strerror(errno));
    return w->err[0] ? -1 : 0;
}

gguf_writer *gguf_writer_new(const char *magic, uint64_t alignment) {
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!magic || (strcmp(magic, "GGUF") && strcmp(magic, "PWRI")))
        werr(w, "magic must be \"GGUF\" or \"PWRI\"");
    else
        memcpy(w->magic, magic, 4);
    if (alignment == 0 || (alignment & (alignment - 1)) || alignment > UINT32_MAX)
        werr(w, "alignment %llu is not a power of two that fits in uint32", (unsigned long long)alignment);
    else
        w->alignment = alignment;
    return w;
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->keys);
    free(w->tensors);
    free(w->kv_buf);
    free(w);
}

const char *gguf_writer_error(const gguf_writer *w) { return w->err[0] ? w->err : NULL; }

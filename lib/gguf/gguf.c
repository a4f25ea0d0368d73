/* GGUF v2/v3 reader. Every count, length and offset read from the file is
 * checked against the bytes that remain (and for overflow) before it is used,
 * so a hostile file yields an error message, never a huge allocation or an
 * out-of-bounds read. */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF values are read in place");

/* Smallest possible encodings, used to bound counts by the bytes left. */
#define KV_MIN_BYTES 13          /* key length (8) + value type (4) + a 1-byte value */
#define TENSOR_INFO_MIN_BYTES 32 /* name length (8) + n_dims (4) + ne[0] (8) + type (4) + offset (8) */
#define STR_MIN_BYTES 8          /* a gguf string's length */

typedef struct {
    const uint8_t *base;
    size_t size, pos;
    const char *name;
    char *err;
    size_t errlen;
    char field[256]; /* what is being read, for messages */
} cursor;

static void set_field(cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_field(cursor *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->field, sizeof c->field, fmt, ap);
    va_end(ap);
}

/* "NAME: FIELD at offset OFF: DETAIL"; always returns -1 */
static int fail(cursor *c, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(cursor *c, size_t off, const char *fmt, ...) {
    if (!c->err || !c->errlen) return -1;
    int n = snprintf(c->err, c->errlen, "%s: %s at offset %zu: ", c->name, c->field, off);
    if (n >= 0 && (size_t)n < c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* A printable, bounded rendering of a string from the file, for messages. */
static const char *printable(gguf_str s, char *buf, size_t cap) {
    size_t n = 0;
    for (; n < s.len && n + 4 < cap; n++) {
        unsigned char ch = (unsigned char)s.ptr[n];
        buf[n] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (n < s.len) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = 0;
    return buf;
}

static size_t left(const cursor *c) { return c->size - c->pos; }

/* The next n bytes, or NULL (with the error set) if the file ends first. */
static const uint8_t *take(cursor *c, size_t n) {
    if (left(c) < n) {
        fail(c, c->pos, "truncated: needs %zu bytes, %zu left", n, left(c));
        return NULL;
    }
    const uint8_t *p = c->base + c->pos;
    c->pos += n;
    return p;
}

static int read_u32(cursor *c, uint32_t *v) {
    const uint8_t *p = take(c, 4);
    if (!p) return -1;
    memcpy(v, p, 4);
    return 0;
}

static int read_u64(cursor *c, uint64_t *v) {
    const uint8_t *p = take(c, 8);
    if (!p) return -1;
    memcpy(v, p, 8);
    return 0;
}

static int read_str(cursor *c, gguf_str *s) {
    size_t at = c->pos;
    uint64_t len;
    if (read_u64(c, &len)) return -1;
    if (len > left(c))
        return fail(c, at, "string length %llu exceeds the %zu bytes left",
                    (unsigned long long)len, left(c));
    s->len = len;
    s->ptr = (const char *)c->base + c->pos;
    c->pos += (size_t)len;
    return 0;
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

/* Reads one scalar of type t into kv's widened value. */
static int read_scalar(cursor *c, uint32_t t, gguf_kv *kv) {
    size_t at = c->pos;
    const uint8_t *p = take(c, scalar_size(t));
    if (!p) return -1;
    switch (t) {
    case GGUF_UINT8: kv->v.u64 = p[0]; break;
    case GGUF_INT8: kv->v.i64 = (int8_t)p[0]; break;
    case GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u64 = x; break; }
    case GGUF_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i64 = x; break; }
    case GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u64 = x; break; }
    case GGUF_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i64 = x; break; }
    case GGUF_UINT64: memcpy(&kv->v.u64, p, 8); break;
    case GGUF_INT64: memcpy(&kv->v.i64, p, 8); break;
    case GGUF_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f64 = x; break; }
    case GGUF_FLOAT64: memcpy(&kv->v.f64, p, 8); break;
    case GGUF_BOOL:
        if (p[0] > 1) return fail(c, at, "bool value %u is not 0 or 1", p[0]);
        kv->v.b = p[0];
        break;
    }
    return 0;
}

static bool known_type(uint32_t t) { return t <= GGUF_FLOAT64; }

static int read_array(cursor *c, gguf_kv *kv, const char *where) {
    size_t at = c->pos;
    set_field(c, "%s array type", where);
    if (read_u32(c, &kv->arr_type)) return -1;
    if (kv->arr_type == GGUF_ARRAY) return fail(c, at, "nested arrays are not supported");
    if (!known_type(kv->arr_type)) return fail(c, at, "unknown value type %u", kv->arr_type);

    at = c->pos;
    set_field(c, "%s array length", where);
    if (read_u64(c, &kv->arr_n)) return -1;
    size_t elem = kv->arr_type == GGUF_STRING ? STR_MIN_BYTES : scalar_size(kv->arr_type);
    if (kv->arr_n > left(c) / elem)
        return fail(c, at, "%llu elements of %s cannot fit in the %zu bytes left",
                    (unsigned long long)kv->arr_n, gguf_value_type_name(kv->arr_type), left(c));
    kv->arr_data = c->base + c->pos;

    if (kv->arr_type != GGUF_STRING) {
        set_field(c, "%s array data", where);
        const uint8_t *p = take(c, (size_t)kv->arr_n * elem);
        if (!p) return -1;
        if (kv->arr_type == GGUF_BOOL)
            for (uint64_t i = 0; i < kv->arr_n; i++)
                if (p[i] > 1) return fail(c, (size_t)(p + i - c->base), "bool [%llu] is %u, not 0 or 1",
                                          (unsigned long long)i, p[i]);
        return 0;
    }
    if (kv->arr_n == 0) return 0;
    kv->arr_strs = malloc((size_t)kv->arr_n * sizeof *kv->arr_strs); /* bounded by the file size */
    if (!kv->arr_strs) return fail(c, at, "out of memory for %llu strings", (unsigned long long)kv->arr_n);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        set_field(c, "%s [%llu]", where, (unsigned long long)i);
        if (read_str(c, &kv->arr_strs[i])) return -1;
    }
    return 0;
}

static int check_alignment(cursor *c, const gguf_kv *kv, size_t at, uint64_t *alignment) {
    if (kv->type != GGUF_UINT32)
        return fail(c, at, "must be uint32, is %s", gguf_value_type_name(kv->type));
    uint64_t a = kv->v.u64;
    if (a == 0 || (a & (a - 1)))
        return fail(c, at, "alignment %llu is not a non-zero power of two", (unsigned long long)a);
    *alignment = a;
    return 0;
}

static int read_kv(cursor *c, uint64_t i, gguf_kv *kv, uint64_t *alignment) {
    set_field(c, "kv[%llu].key", (unsigned long long)i);
    if (read_str(c, &kv->key)) return -1;
    char key[80], where[128];
    snprintf(where, sizeof where, "kv[%llu] '%s'", (unsigned long long)i,
             printable(kv->key, key, sizeof key));

    size_t at = c->pos;
    set_field(c, "%s type", where);
    if (read_u32(c, &kv->type)) return -1;
    if (!known_type(kv->type)) return fail(c, at, "unknown value type %u", kv->type);

    at = c->pos;
    set_field(c, "%s value", where);
    int rc = kv->type == GGUF_ARRAY    ? read_array(c, kv, where)
             : kv->type == GGUF_STRING ? read_str(c, &kv->v.str)
                                       : read_scalar(c, kv->type, kv);
    if (rc) return -1;
    if (gguf_str_eq(kv->key, "general.alignment")) {
        set_field(c, "%s value", where);
        return check_alignment(c, kv, at, alignment);
    }
    return 0;
}

static int str_cmp(gguf_str a, gguf_str b) {
    int r = memcmp(a.ptr, b.ptr, a.len < b.len ? (size_t)a.len : (size_t)b.len);
    if (r) return r;
    return a.len < b.len ? -1 : a.len > b.len;
}

typedef struct {
    gguf_str s;
    uint64_t idx;
} named;

static int named_cmp(const void *a, const void *b) {
    const named *x = a, *y = b;
    int r = str_cmp(x->s, y->s);
    if (r) return r;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Sorting finds duplicates in n log n; a file may hold millions of names. */
static int check_unique(cursor *c, named *v, uint64_t n, const char *what) {
    qsort(v, (size_t)n, sizeof *v, named_cmp);
    for (uint64_t i = 1; i < n; i++) {
        if (str_cmp(v[i - 1].s, v[i].s)) continue;
        char buf[80];
        set_field(c, "%s[%llu]", what, (unsigned long long)v[i].idx);
        /* the string's length field sits just before its bytes */
        size_t at = (size_t)((const uint8_t *)v[i].s.ptr - c->base) - 8;
        return fail(c, at, "duplicate name '%s' (also %s[%llu])", printable(v[i].s, buf, sizeof buf),
                    what, (unsigned long long)v[i - 1].idx);
    }
    return 0;
}

static int read_header(cursor *c, gguf_file *g) {
    set_field(c, "header.magic");
    const uint8_t *p = take(c, 4);
    if (!p) return -1;
    if (memcmp(p, "GGUF", 4) && memcmp(p, "PWRI", 4))
        return fail(c, 0, "bad magic %02x %02x %02x %02x (expected \"GGUF\" or \"PWRI\")", p[0], p[1],
                    p[2], p[3]);
    memcpy(g->magic, p, 4);
    g->magic[4] = 0;

    set_field(c, "header.version");
    if (read_u32(c, &g->version)) return -1;
    if (g->version != 2 && g->version != 3)
        return fail(c, 4, "unsupported version %u (pi2 reads versions 2 and 3)", g->version);
    set_field(c, "header.n_tensors");
    if (read_u64(c, &g->n_tensors)) return -1;
    set_field(c, "header.n_kv");
    if (read_u64(c, &g->n_kv)) return -1;
    if (g->n_kv > left(c) / KV_MIN_BYTES)
        return fail(c, 16, "%llu key/value pairs cannot fit in the %zu bytes left",
                    (unsigned long long)g->n_kv, left(c));
    return 0;
}

static int read_kvs(cursor *c, gguf_file *g) {
    g->kv = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kv);
    named *names = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *names);
    if (!g->kv || !names) {
        free(names);
        set_field(c, "header.n_kv");
        return fail(c, 16, "out of memory for %llu key/value pairs", (unsigned long long)g->n_kv);
    }
    int rc = 0;
    for (uint64_t i = 0; i < g->n_kv && !rc; i++) {
        rc = read_kv(c, i, &g->kv[i], &g->alignment);
        names[i] = (named){g->kv[i].key, i};
    }
    if (!rc) rc = check_unique(c, names, g->n_kv, "kv");
    free(names);
    return rc;
}

static int read_tensor_info(cursor *c, uint64_t i, gguf_tensor *t, size_t *offset_at) {
    unsigned long long ui = (unsigned long long)i;
    set_field(c, "tensor_info[%llu].name", ui);
    if (read_str(c, &t->name)) return -1;
    char name[80];
    printable(t->name, name, sizeof name);

    size_t at = c->pos;
    set_field(c, "tensor_info[%llu].n_dims", ui);
    if (read_u32(c, &t->n_dims)) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return fail(c, at, "tensor '%s': %u is not in 1..%d", name, t->n_dims, GGUF_MAX_DIMS);

    uint64_t nelems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        at = c->pos;
        set_field(c, "tensor_info[%llu].ne[%u]", ui, d);
        if (read_u64(c, &t->ne[d])) return -1;
        if (t->ne[d] == 0) return fail(c, at, "tensor '%s': dimension is 0", name);
        if (__builtin_mul_overflow(nelems, t->ne[d], &nelems) || nelems > INT64_MAX)
            return fail(c, at, "tensor '%s': element count overflows", name);
    }

    at = c->pos;
    set_field(c, "tensor_info[%llu].type", ui);
    if (read_u32(c, &t->type)) return -1;
    if (!ggml_type_known(t->type)) {
        const char *tn = ggml_type_name(t->type);
        return fail(c, at, "tensor '%s': type %s (%u) is not supported (pi2 reads f32, f16, q4_0, q8_0, i8)",
                    name, strncmp(tn, "type ", 5) ? tn : "unknown", t->type);
    }
    size_t row = ggml_row_bytes(t->type, t->ne[0]);
    if (!row && t->ne[0] % ggml_block_elems(t->type) == 0)
        return fail(c, at, "tensor '%s': byte size overflows", name);
    if (!row)
        return fail(c, at, "tensor '%s': row length %llu is not a multiple of the %s block size %u",
                    name, (unsigned long long)t->ne[0], ggml_type_name(t->type),
                    ggml_block_elems(t->type));
    if (__builtin_mul_overflow((uint64_t)row, nelems / t->ne[0], &t->nbytes))
        return fail(c, at, "tensor '%s': byte size overflows", name);

    *offset_at = c->pos;
    set_field(c, "tensor_info[%llu].offset", ui);
    if (read_u64(c, &t->offset)) return -1;
    return 0;
}

/* Offsets are checked once the data section's start is known. */
static int place_tensor(cursor *c, const gguf_file *g, uint64_t i, gguf_tensor *t, size_t offset_at) {
    char name[80];
    printable(t->name, name, sizeof name);
    set_field(c, "tensor_info[%llu].offset", (unsigned long long)i);
    if (t->offset % g->alignment)
        return fail(c, offset_at, "tensor '%s': %llu is not a multiple of the alignment %llu", name,
                    (unsigned long long)t->offset, (unsigned long long)g->alignment);
    uint64_t avail = c->size - g->data_offset;
    if (t->offset > avail || t->nbytes > avail - t->offset)
        return fail(c, offset_at,
                    "tensor '%s': %llu bytes at data offset %llu run past the end of the file "
                    "(the data section has %llu bytes)",
                    name, (unsigned long long)t->nbytes, (unsigned long long)t->offset,
                    (unsigned long long)avail);
    t->data = c->base + g->data_offset + t->offset;
    return 0;
}

static int read_tensors(cursor *c, gguf_file *g) {
    if (g->n_tensors > left(c) / TENSOR_INFO_MIN_BYTES) {
        set_field(c, "header.n_tensors");
        return fail(c, 8, "%llu tensor infos cannot fit in the %zu bytes left",
                    (unsigned long long)g->n_tensors, left(c));
    }
    size_t n = g->n_tensors ? (size_t)g->n_tensors : 1;
    g->tensors = calloc(n, sizeof *g->tensors);
    size_t *offset_at = calloc(n, sizeof *offset_at);
    named *names = calloc(n, sizeof *names);
    int rc = 0;
    if (!g->tensors || !offset_at || !names) {
        set_field(c, "header.n_tensors");
        rc = fail(c, 8, "out of memory for %llu tensor infos", (unsigned long long)g->n_tensors);
    }
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        rc = read_tensor_info(c, i, &g->tensors[i], &offset_at[i]);
        names[i] = (named){g->tensors[i].name, i};
    }
    if (!rc) rc = check_unique(c, names, g->n_tensors, "tensor_info");
    if (!rc) {
        uint64_t pad = (g->alignment - c->pos % g->alignment) % g->alignment;
        if (pad > left(c)) {
            set_field(c, "data section");
            rc = fail(c, c->pos, "padding to the alignment %llu runs past the end of the file",
                      (unsigned long long)g->alignment);
        } else {
            g->data_offset = c->pos + pad;
        }
    }
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++)
        rc = place_tensor(c, g, i, &g->tensors[i], offset_at[i]);
    free(offset_at);
    free(names);
    return rc;
}

int gguf_parse(gguf_file *g, const void *buf, size_t size, const char *name, char *err,
               size_t errlen) {
    memset(g, 0, sizeof *g);
    if (err && errlen) err[0] = 0;
    cursor c = {.base = buf, .size = size, .name = name ? name : "gguf", .err = err, .errlen = errlen};
    g->base = buf;
    g->size = size;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (read_header(&c, g) || read_kvs(&c, g) || read_tensors(&c, g)) {
        gguf_close(g);
        return -1;
    }
    return 0;
}

int gguf_open(gguf_file *g, const char *path, char *err, size_t errlen) {
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    if (size == 0) { /* mmap refuses 0 bytes; the parser words the error */
        close(fd);
        return gguf_parse(g, "", 0, path, err, errlen);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "%s: mmap: %s", path, strerror(map_errno));
        return -1;
    }
    if (gguf_parse(g, map, size, path, err, errlen)) {
        munmap(map, size);
        return -1;
    }
    g->mapped = true;
    return 0;
}

void gguf_close(gguf_file *g) {
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].arr_strs);
    free(g->kv);
    free(g->tensors);
    if (g->mapped) munmap((void *)g->base, g->size);
    memset(g, 0, sizeof *g);
}

bool gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && !memcmp(s.ptr, c, n);
}

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (gguf_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static bool is_unsigned(uint32_t t) {
    return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64;
}

static bool is_signed(uint32_t t) {
    return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64;
}

bool gguf_get_uint(const gguf_file *g, const char *key, uint64_t *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return false;
    if (is_unsigned(kv->type)) {
        *out = kv->v.u64;
        return true;
    }
    if (is_signed(kv->type) && kv->v.i64 >= 0) {
        *out = (uint64_t)kv->v.i64;
        return true;
    }
    return false;
}

bool gguf_get_float(const gguf_file *g, const char *key, double *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return false;
    if (kv->type == GGUF_FLOAT32 || kv->type == GGUF_FLOAT64) *out = kv->v.f64;
    else if (is_unsigned(kv->type)) *out = (double)kv->v.u64;
    else if (is_signed(kv->type)) *out = (double)kv->v.i64;
    else return false;
    return true;
}

bool gguf_get_bool(const gguf_file *g, const char *key, bool *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv || kv->type != GGUF_BOOL) return false;
    *out = kv->v.b;
    return true;
}

bool gguf_get_str(const gguf_file *g, const char *key, gguf_str *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv || kv->type != GGUF_STRING) return false;
    *out = kv->v.str;
    return true;
}

bool gguf_get_arr(const gguf_file *g, const char *key, uint32_t elem_type, uint64_t *n,
                  const void **data) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv || kv->type != GGUF_ARRAY || kv->arr_type != elem_type || elem_type == GGUF_STRING)
        return false;
    *n = kv->arr_n;
    *data = kv->arr_data;
    return true;
}

bool gguf_get_str_arr(const gguf_file *g, const char *key, uint64_t *n, const gguf_str **strs) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv || kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING) return false;
    *n = kv->arr_n;
    *strs = kv->arr_strs;
    return true;
}

const char *gguf_value_type_name(uint32_t t) {
    static const char *const names[] = {"uint8", "int8",   "uint16", "int16",  "uint32",
                                        "int32", "float32", "bool",  "string", "array",
                                        "uint64", "int64",  "float64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* GGUF v3 reader and writer (also PowerInfer's "PWRI" magic, same layout).
 *
 * The reader maps the file read-only and validates every count, length,
 * offset and size against the file size (with overflow checks) before use.
 * On failure it fills `err` with a message naming the field and its byte
 * offset, e.g. "model.gguf: tensor_info[3].n_dims at offset 1234: 7 > 4".
 * Strings returned by the reader point into the mapping (not NUL-terminated).
 *
 * Errors: gguf_open and gguf_parse return -1 with a message in err; lookups
 * return NULL or false for a missing or mistyped key. The writer keeps its
 * first error (gguf_writer_error), after which its calls do nothing (-1 where
 * they return int); gguf_writer_new returns NULL only when out of memory. */
#ifndef PI2_GGUF_H
#define PI2_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gguf/ggml_types.h"

enum gguf_value_type {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3,
    GGUF_UINT32 = 4, GGUF_INT32 = 5, GGUF_FLOAT32 = 6, GGUF_BOOL = 7,
    GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_UINT64 = 10, GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
};

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

typedef struct {
    uint64_t len;
    const char *ptr;            /* into the mapping; not NUL-terminated */
} gguf_str;

typedef struct {
    gguf_str key;
    uint32_t type;              /* enum gguf_value_type */
    union {
        uint64_t u64;           /* any unsigned integer type, widened */
        int64_t i64;            /* any signed integer type, widened */
        double f64;             /* FLOAT32 or FLOAT64, widened */
        bool b;
        gguf_str str;
    } v;
    /* type == GGUF_ARRAY */
    uint32_t arr_type;          /* element type (never ARRAY: nested arrays are refused) */
    uint64_t arr_n;
    const void *arr_data;       /* raw little-endian elements (non-string arrays) */
    gguf_str *arr_strs;         /* arr_type == GGUF_STRING: arr_n parsed strings */
} gguf_kv;

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the row length (contiguous); unused dims are 1 */
    uint32_t type;              /* enum ggml_type, one of the supported ones */
    uint64_t offset;            /* relative to the data section */
    uint64_t nbytes;
    const void *data;           /* into the mapping */
} gguf_tensor;

typedef struct {
    char magic[5];              /* "GGUF" or "PWRI", NUL-terminated */
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;       /* file offset of the data section */
    const uint8_t *base;        /* the whole file */
    size_t size;
    bool mapped;                /* base came from mmap (gguf_open) */
} gguf_file;

/* Map and parse `path`. Returns 0, or -1 with a message in err. */
int gguf_open(gguf_file *g, const char *path, char *err, size_t errlen);
/* Parse an in-memory image (not copied; must outlive g). `name` is used in messages. */
int gguf_parse(gguf_file *g, const void *buf, size_t size, const char *name,
               char *err, size_t errlen);
void gguf_close(gguf_file *g);

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name);
bool gguf_str_eq(gguf_str s, const char *c);

/* Typed lookups. Return false if the key is missing or of an incompatible
 * type (any integer type converts to uint64 if non-negative / to int64 if it fits). */
bool gguf_get_uint(const gguf_file *g, const char *key, uint64_t *out);
bool gguf_get_float(const gguf_file *g, const char *key, double *out);
bool gguf_get_bool(const gguf_file *g, const char *key, bool *out);
bool gguf_get_str(const gguf_file *g, const char *key, gguf_str *out);
/* Array of the given element type; returns false on mismatch. */
bool gguf_get_arr(const gguf_file *g, const char *key, uint32_t elem_type,
                  uint64_t *n, const void **data);
bool gguf_get_str_arr(const gguf_file *g, const char *key, uint64_t *n,
                      const gguf_str **strs);

const char *gguf_value_type_name(uint32_t t);

/* ---- writer: metadata and tensor infos first, then tensor data streamed in order ---- */
typedef struct gguf_writer gguf_writer;

/* NULL only when out of memory; a bad magic or alignment (not a power of two
 * that fits uint32) is reported as the writer's first error. general.alignment
 * is written automatically when alignment != 32. */
gguf_writer *gguf_writer_new(const char *magic /* "GGUF" or "PWRI" */, uint64_t alignment);
void gguf_writer_free(gguf_writer *w);
/* The first error (it sticks: later calls do nothing and return -1), or NULL. */
const char *gguf_writer_error(const gguf_writer *w);

void gguf_w_u8(gguf_writer *w, const char *key, uint8_t v);
void gguf_w_i8(gguf_writer *w, const char *key, int8_t v);
void gguf_w_u16(gguf_writer *w, const char *key, uint16_t v);
void gguf_w_i16(gguf_writer *w, const char *key, int16_t v);
void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_w_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_w_u64(gguf_writer *w, const char *key, uint64_t v);
void gguf_w_i64(gguf_writer *w, const char *key, int64_t v);
void gguf_w_f32(gguf_writer *w, const char *key, float v);
void gguf_w_f64(gguf_writer *w, const char *key, double v);
void gguf_w_bool(gguf_writer *w, const char *key, bool v);
void gguf_w_str(gguf_writer *w, const char *key, const char *v);
/* elements are copied; elem_type is a scalar type (not STRING/ARRAY) */
void gguf_w_arr(gguf_writer *w, const char *key, uint32_t elem_type, uint64_t n, const void *data);
/* strs[i] has length lens[i] (may contain any bytes); lens NULL = NUL-terminated */
void gguf_w_str_arr(gguf_writer *w, const char *key, uint64_t n, const char *const *strs,
                    const uint64_t *lens);

/* Declare a tensor; returns its index or -1 (unsupported type, bad shape). */
int gguf_w_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                  const uint64_t *ne);
/* Write header, metadata and tensor infos to fp, padded to the data section. */
int gguf_w_begin(gguf_writer *w, FILE *fp);
/* Append tensor data, in declaration order, in chunks of any size; padding
 * between tensors is inserted automatically. */
int gguf_w_data(gguf_writer *w, const void *data, size_t n);
/* Check every tensor was fully written; flush. Does not close fp. */
int gguf_w_finish(gguf_writer *w);

#endif

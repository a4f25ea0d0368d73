/* GGUF writer -> reader round trips, the type table, a >4 GiB layout, and the
 * real oracle files (checked against the llama2.c originals they came from). */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "test.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint8_t rand_byte(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint8_t)(rng_state >> 24);
}

static const char *shared_dir(void) {
    const char *s = getenv("PI2_SHARED");
    return s ? s : "../shared";
}

/* Reads a whole file; NULL if it cannot. */
static uint8_t *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void test_type_table(void) {
    CHECK(ggml_type_supported(GGML_TYPE_F32) && ggml_type_supported(GGML_TYPE_F16) &&
              ggml_type_supported(GGML_TYPE_Q4_0) && ggml_type_supported(GGML_TYPE_Q8_0),
          "the four pi2 types are supported");
    CHECK(!ggml_type_supported(3) && !ggml_type_supported(12) && !ggml_type_supported(30),
          "q4_1, q4_K, bf16 are not");
    /* ggml's enum ids and spellings */
    static const struct { uint32_t id; const char *name; } names[] = {
        {0, "f32"},  {1, "f16"},  {2, "q4_0"},  {3, "q4_1"},  {6, "q5_0"},  {7, "q5_1"},
        {8, "q8_0"}, {9, "q8_1"}, {10, "q2_K"}, {11, "q3_K"}, {12, "q4_K"}, {13, "q5_K"},
        {14, "q6_K"}, {15, "q8_K"}, {30, "bf16"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECK(!strcmp(ggml_type_name(names[i].id), names[i].name), "type %u is %s, got %s", names[i].id,
              names[i].name, ggml_type_name(names[i].id));
    CHECK(!strcmp(ggml_type_name(1000), "type 1000"), "unknown type: %s", ggml_type_name(1000));
    CHECK(ggml_type_from_name("f32") == 0 && ggml_type_from_name("F16") == 1 &&
              ggml_type_from_name("Q4_0") == 2 && ggml_type_from_name("q8_0") == 8,
          "names parse");
    CHECK(ggml_type_from_name("q4_K") == -1 && ggml_type_from_name("") == -1, "unsupported names refused");
    CHECK(ggml_block_elems(GGML_TYPE_F32) == 1 && ggml_block_bytes(GGML_TYPE_F32) == 4, "f32 geometry");
    CHECK(ggml_block_elems(GGML_TYPE_F16) == 1 && ggml_block_bytes(GGML_TYPE_F16) == 2, "f16 geometry");
    CHECK(ggml_block_elems(GGML_TYPE_Q4_0) == 32 && ggml_block_bytes(GGML_TYPE_Q4_0) == 18, "q4_0 geometry");
    CHECK(ggml_block_elems(GGML_TYPE_Q8_0) == 32 && ggml_block_bytes(GGML_TYPE_Q8_0) == 34, "q8_0 geometry");
    CHECK(ggml_block_elems(12) == 0 && ggml_block_bytes(12) == 0, "unsupported geometry is 0");
    CHECK(ggml_row_bytes(GGML_TYPE_Q4_0, 4096) == 128 * 18, "q4_0 row");
    CHECK(ggml_row_bytes(GGML_TYPE_Q8_0, 96) == 3 * 34, "q8_0 row");
    CHECK(ggml_row_bytes(GGML_TYPE_F16, 7) == 14, "f16 row");
    CHECK(ggml_row_bytes(GGML_TYPE_Q4_0, 33) == 0, "partial block");
    CHECK(ggml_row_bytes(GGML_TYPE_F32, 1ull << 62) == 0, "overflow gives 0");
}

/* ---- round trip ---- */

typedef struct {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
    size_t nbytes;
    uint8_t *data;
} test_tensor;

static test_tensor rt_tensors[] = {
    {"f32.matrix", GGML_TYPE_F32, 2, {5, 3, 1, 1}, 5 * 3 * 4, NULL},
    {"f16.vector", GGML_TYPE_F16, 1, {7, 1, 1, 1}, 7 * 2, NULL},
    {"blk.0.q4_0", GGML_TYPE_Q4_0, 2, {64, 3, 1, 1}, 2 * 3 * 18, NULL},
    {"blk.0.q8_0.4d", GGML_TYPE_Q8_0, 4, {32, 2, 3, 2}, 12 * 34, NULL},
};
#define N_RT (sizeof rt_tensors / sizeof rt_tensors[0])

static const uint8_t arr_u8[] = {0, 1, 255};
static const int8_t arr_i8[] = {-128, 0, 127};
static const uint16_t arr_u16[] = {0, 1, 65535};
static const int16_t arr_i16[] = {-32768, 5, 32767};
static const uint32_t arr_u32[] = {0, 123456789, 4294967295u};
static const int32_t arr_i32[] = {INT32_MIN, -1, INT32_MAX};
static const float arr_f32[] = {-1.5f, 0.0f, 3.25e-5f};
static const uint8_t arr_bool[] = {1, 0, 1};
static const uint64_t arr_u64[] = {0, 1ull << 40, UINT64_MAX};
static const int64_t arr_i64[] = {INT64_MIN, -2, INT64_MAX};
static const double arr_f64[] = {-1e300, 0.1, 2.5};

static const struct { uint32_t type; const void *data; size_t elem; } arrays[] = {
    {GGUF_UINT8, arr_u8, 1},   {GGUF_INT8, arr_i8, 1},    {GGUF_UINT16, arr_u16, 2},
    {GGUF_INT16, arr_i16, 2},  {GGUF_UINT32, arr_u32, 4}, {GGUF_INT32, arr_i32, 4},
    {GGUF_FLOAT32, arr_f32, 4}, {GGUF_BOOL, arr_bool, 1}, {GGUF_UINT64, arr_u64, 8},
    {GGUF_INT64, arr_i64, 8},  {GGUF_FLOAT64, arr_f64, 8},
};
#define N_ARRAYS (sizeof arrays / sizeof arrays[0])

/* 256 one-byte strings (every byte value, NUL included), an empty one and a multibyte one */
static char byte_strs[256][1];
static const char *str_ptrs[258];
static uint64_t str_lens[258];

static void build_str_array(void) {
    for (int i = 0; i < 256; i++) {
        byte_strs[i][0] = (char)i;
        str_ptrs[i] = byte_strs[i];
        str_lens[i] = 1;
    }
    str_ptrs[256] = "";
    str_lens[256] = 0;
    str_ptrs[257] = "\xe2\x96\x81the\xff";
    str_lens[257] = 7;
}

static void fill_tensor_data(void) {
    for (size_t i = 0; i < N_RT; i++) {
        rt_tensors[i].data = malloc(rt_tensors[i].nbytes);
        for (size_t j = 0; j < rt_tensors[i].nbytes; j++) rt_tensors[i].data[j] = rand_byte();
    }
}

/* Writes the round-trip file into a memory buffer; chunks of varied sizes cross tensor boundaries. */
static uint8_t *write_rt(const char *magic, uint64_t alignment, size_t *size) {
    gguf_writer *w = gguf_writer_new(magic, alignment);
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u8(w, "v.u8", 200);
    gguf_w_i8(w, "v.i8", -100);
    gguf_w_u16(w, "v.u16", 60000);
    gguf_w_i16(w, "v.i16", -30000);
    gguf_w_u32(w, "v.u32", 4000000000u);
    gguf_w_i32(w, "v.i32", -2000000000);
    gguf_w_u64(w, "v.u64", UINT64_MAX);
    gguf_w_i64(w, "v.i64", INT64_MIN);
    gguf_w_f32(w, "v.f32", 1e-5f);
    gguf_w_f64(w, "v.f64", 3.141592653589793);
    gguf_w_bool(w, "v.bool", true);
    gguf_w_str(w, "v.empty", "");
    for (size_t i = 0; i < N_ARRAYS; i++) {
        char key[32];
        snprintf(key, sizeof key, "arr.%s", gguf_value_type_name(arrays[i].type));
        gguf_w_arr(w, key, arrays[i].type, 3, arrays[i].data);
    }
    gguf_w_arr(w, "arr.empty", GGUF_UINT32, 0, NULL);
    gguf_w_str_arr(w, "arr.strings", 258, str_ptrs, str_lens);
    const char *plain[] = {"a", "bc"};
    gguf_w_str_arr(w, "arr.plain", 2, plain, NULL);
    for (size_t i = 0; i < N_RT; i++)
        CHECK(gguf_w_tensor(w, rt_tensors[i].name, rt_tensors[i].type, rt_tensors[i].n_dims,
                            rt_tensors[i].ne) == (int)i,
              "declare %s: %s", rt_tensors[i].name, gguf_writer_error(w));

    char *buf = NULL;
    FILE *fp = open_memstream(&buf, size);
    CHECK(gguf_w_begin(w, fp) == 0, "begin: %s", gguf_writer_error(w));
    size_t chunk = 1, failed_writes = 0;
    for (size_t i = 0; i < N_RT; i++) {
        for (size_t off = 0; off < rt_tensors[i].nbytes;) {
            size_t n = rt_tensors[i].nbytes - off < chunk ? rt_tensors[i].nbytes - off : chunk;
            failed_writes += gguf_w_data(w, rt_tensors[i].data + off, n) != 0;
            off += n;
            chunk = chunk * 3 % 97 + 1;
        }
    }
    CHECK(failed_writes == 0, "data: %s", gguf_writer_error(w));
    CHECK(gguf_w_finish(w) == 0, "finish: %s", gguf_writer_error(w));
    CHECK(gguf_writer_error(w) == NULL, "no error");
    gguf_writer_free(w);
    fclose(fp);
    return (uint8_t *)buf;
}

static bool has_int(const gguf_file *g, const char *key, uint32_t type, int64_t want) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    return kv && kv->type == type && kv->v.i64 == want;
}

static void check_rt(const gguf_file *g, const char *magic, uint64_t alignment) {
    CHECK(!strcmp(g->magic, magic) && g->version == 3, "magic %s version %u", g->magic, g->version);
    CHECK(g->alignment == alignment, "alignment %llu", (unsigned long long)g->alignment);
    CHECK(g->data_offset % alignment == 0, "data section aligned");
    uint64_t u;
    double f;
    bool b;
    gguf_str s;
    CHECK(gguf_get_str(g, "general.architecture", &s) && gguf_str_eq(s, "llama"), "architecture");
    CHECK(gguf_get_uint(g, "v.u8", &u) && u == 200, "u8");
    CHECK(has_int(g, "v.i8", GGUF_INT8, -100), "i8");
    CHECK(gguf_get_uint(g, "v.u16", &u) && u == 60000, "u16");
    CHECK(has_int(g, "v.i16", GGUF_INT16, -30000), "i16");
    CHECK(gguf_get_uint(g, "v.u32", &u) && u == 4000000000u, "u32");
    CHECK(has_int(g, "v.i32", GGUF_INT32, -2000000000), "i32");
    CHECK(!gguf_get_uint(g, "v.i32", &u), "negative int is not a uint");
    CHECK(gguf_get_uint(g, "v.u64", &u) && u == UINT64_MAX, "u64");
    CHECK(has_int(g, "v.i64", GGUF_INT64, INT64_MIN), "i64");
    CHECK(gguf_get_float(g, "v.f32", &f) && f == (double)1e-5f, "f32");
    CHECK(gguf_get_float(g, "v.f64", &f) && f == 3.141592653589793, "f64");
    CHECK(gguf_get_float(g, "v.u8", &f) && f == 200.0, "int as float");
    CHECK(gguf_get_bool(g, "v.bool", &b) && b, "bool");
    CHECK(gguf_get_str(g, "v.empty", &s) && s.len == 0, "empty string");
    CHECK(!gguf_get_str(g, "v.u8", &s) && !gguf_get_bool(g, "v.u8", &b), "type mismatch refused");
    CHECK(!gguf_find_kv(g, "missing") && !gguf_get_uint(g, "missing", &u), "missing key");
    for (size_t i = 0; i < N_ARRAYS; i++) {
        char key[32];
        snprintf(key, sizeof key, "arr.%s", gguf_value_type_name(arrays[i].type));
        uint64_t n = 0;
        const void *data = NULL;
        CHECK(gguf_get_arr(g, key, arrays[i].type, &n, &data) && n == 3 &&
                  !memcmp(data, arrays[i].data, 3 * arrays[i].elem),
              "array %s", key);
        CHECK(!gguf_get_arr(g, key, arrays[i].type == GGUF_UINT8 ? GGUF_INT8 : GGUF_UINT8, &n, &data),
              "array %s with the wrong element type refused", key);
    }
    uint64_t n = 99;
    const void *data;
    CHECK(gguf_get_arr(g, "arr.empty", GGUF_UINT32, &n, &data) && n == 0, "empty array");
    const gguf_str *strs = NULL;
    CHECK(gguf_get_str_arr(g, "arr.strings", &n, &strs) && n == 258, "string array: n=%llu",
          (unsigned long long)n);
    bool same = strs != NULL;
    for (size_t i = 0; same && i < 258; i++)
        same = strs[i].len == str_lens[i] && !memcmp(strs[i].ptr, str_ptrs[i], str_lens[i]);
    CHECK(same, "string array holds every byte value");
    CHECK(gguf_get_str_arr(g, "arr.plain", &n, &strs) && n == 2 && gguf_str_eq(strs[0], "a") &&
              gguf_str_eq(strs[1], "bc"),
          "NUL-terminated string array");

    CHECK(g->n_tensors == N_RT, "tensor count");
    for (size_t i = 0; i < N_RT && i < g->n_tensors; i++) {
        const gguf_tensor *t = gguf_find_tensor(g, rt_tensors[i].name);
        CHECK(t == &g->tensors[i], "tensor %s found in order", rt_tensors[i].name);
        if (!t) continue;
        CHECK(t->type == rt_tensors[i].type && t->n_dims == rt_tensors[i].n_dims &&
                  !memcmp(t->ne, rt_tensors[i].ne, sizeof t->ne),
              "tensor %s type and shape", rt_tensors[i].name);
        CHECK(t->nbytes == rt_tensors[i].nbytes, "tensor %s bytes", rt_tensors[i].name);
        CHECK(t->offset % alignment == 0 && ((const uint8_t *)t->data - g->base) % alignment == 0,
              "tensor %s aligned", rt_tensors[i].name);
        CHECK(!memcmp(t->data, rt_tensors[i].data, t->nbytes), "tensor %s data", rt_tensors[i].name);
    }
    CHECK(!gguf_find_tensor(g, "nope"), "missing tensor");
}

static void test_round_trip(const char *magic, uint64_t alignment) {
    size_t size;
    uint8_t *buf = write_rt(magic, alignment, &size);
    /* the fixed header, checked by hand rather than through the reader */
    CHECK(!memcmp(buf, magic, 4), "magic bytes");
    uint32_t version;
    memcpy(&version, buf + 4, 4);
    CHECK(version == 3, "version field");
    CHECK(le64(buf + 8) == N_RT, "n_tensors field");
    uint64_t n_kv = 13 + N_ARRAYS + 3 + (alignment != GGUF_DEFAULT_ALIGNMENT);
    CHECK(le64(buf + 16) == n_kv, "n_kv field %llu, expected %llu", (unsigned long long)le64(buf + 16),
          (unsigned long long)n_kv);
    CHECK(size % alignment == 0, "file ends padded: %zu", size);

    gguf_file g;
    char err[256];
    int rc = gguf_parse(&g, buf, size, "rt.gguf", err, sizeof err);
    CHECK(rc == 0, "parse %s/%llu: %s", magic, (unsigned long long)alignment, err);
    if (rc == 0) {
        check_rt(&g, magic, alignment);
        uint64_t a;
        CHECK((alignment == GGUF_DEFAULT_ALIGNMENT) ==
                  !gguf_get_uint(&g, "general.alignment", &a),
              "general.alignment written only when not the default");
        const gguf_kv *kv = gguf_find_kv(&g, "general.alignment");
        if (alignment != GGUF_DEFAULT_ALIGNMENT)
            CHECK(kv && kv->type == GGUF_UINT32 && kv->v.u64 == alignment, "general.alignment is a uint32");
        uint64_t last_end = g.tensors[N_RT - 1].offset + g.tensors[N_RT - 1].nbytes;
        CHECK(g.data_offset + last_end + (alignment - last_end % alignment) % alignment == size,
              "data section holds the tensors and their padding only");
        gguf_close(&g);
    }

    /* the same bytes through a file and mmap */
    char path[] = "/tmp/pi2-test-gguf-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, buf, size) == (ssize_t)size, "temp file");
    if (fd >= 0) close(fd);
    rc = gguf_open(&g, path, err, sizeof err);
    CHECK(rc == 0 && g.mapped, "open: %s", err);
    if (rc == 0) {
        check_rt(&g, magic, alignment);
        gguf_close(&g);
    }
    unlink(path);
    free(buf);
}

static void test_writer_errors(void) {
    static const uint64_t ne[] = {32, 2};
    gguf_writer *w = gguf_writer_new("GGUF", 32);
    gguf_w_u32(w, "a", 1);
    gguf_w_u32(w, "a", 2);
    const char *e = gguf_writer_error(w);
    CHECK(e && strstr(e, "duplicate key 'a'"), "duplicate key: %s", e ? e : "(none)");
    gguf_w_u32(w, "b", 1);
    CHECK(gguf_w_tensor(w, "t", GGML_TYPE_F32, 2, ne) == -1, "sticky error");
    CHECK(gguf_writer_error(w) == e && strstr(e, "duplicate key"), "first error kept");
    gguf_writer_free(w);

    w = gguf_writer_new("GGUF", 32);
    CHECK(gguf_w_tensor(w, "t", GGML_TYPE_F32, 2, ne) == 0, "declare");
    CHECK(gguf_w_tensor(w, "t", GGML_TYPE_F32, 2, ne) == -1 &&
              strstr(gguf_writer_error(w), "duplicate tensor name 't'"),
          "duplicate tensor");
    gguf_writer_free(w);

    w = gguf_writer_new("GGUF", 32);
    CHECK(gguf_w_tensor(w, "k", 12, 2, ne) == -1 && strstr(gguf_writer_error(w), "q4_K (12)"),
          "unsupported type: %s", gguf_writer_error(w));
    gguf_writer_free(w);

    static const uint64_t odd[] = {33, 2};
    w = gguf_writer_new("GGUF", 32);
    CHECK(gguf_w_tensor(w, "q", GGML_TYPE_Q4_0, 2, odd) == -1 && gguf_writer_error(w),
          "row not a multiple of the block");
    gguf_writer_free(w);

    static const uint64_t zero[] = {32, 0};
    w = gguf_writer_new("GGUF", 32);
    CHECK(gguf_w_tensor(w, "z", GGML_TYPE_F32, 2, zero) == -1, "zero dimension");
    gguf_writer_free(w);
    w = gguf_writer_new("GGUF", 32);
    CHECK(gguf_w_tensor(w, "d", GGML_TYPE_F32, 5, ne) == -1, "5 dims");
    gguf_writer_free(w);

    w = gguf_writer_new("GGUF", 3);
    CHECK(gguf_writer_error(w) && strstr(gguf_writer_error(w), "alignment 3"), "alignment 3");
    gguf_writer_free(w);
    w = gguf_writer_new("GGUX", 32);
    CHECK(gguf_writer_error(w) != NULL, "bad magic");
    gguf_writer_free(w);
    w = gguf_writer_new("GGUF", 64);
    gguf_w_u32(w, "general.alignment", 32);
    CHECK(gguf_writer_error(w) && strstr(gguf_writer_error(w), "general.alignment"),
          "general.alignment must agree");
    gguf_writer_free(w);
    w = gguf_writer_new("GGUF", 32);
    gguf_w_u64(w, "general.alignment", 32);
    CHECK(gguf_writer_error(w) != NULL, "general.alignment must be uint32");
    gguf_writer_free(w);
    static const uint8_t bad_bools[] = {0, 2};
    w = gguf_writer_new("GGUF", 32);
    gguf_w_arr(w, "b", GGUF_BOOL, 2, bad_bools);
    CHECK(gguf_writer_error(w) != NULL, "bool array holds only 0 and 1");
    gguf_writer_free(w);
    w = gguf_writer_new("GGUF", 32);
    gguf_w_arr(w, "s", GGUF_STRING, 0, NULL);
    CHECK(gguf_writer_error(w) != NULL, "gguf_w_arr takes scalars only");
    gguf_writer_free(w);

    /* streaming: incomplete, excess, out of order */
    uint8_t zeros[300] = {0};
    char *buf = NULL;
    size_t size;
    FILE *fp = open_memstream(&buf, &size);
    w = gguf_writer_new("GGUF", 32);
    gguf_w_tensor(w, "t", GGML_TYPE_F32, 2, ne); /* 256 bytes */
    CHECK(gguf_w_data(w, zeros, 4) == -1, "data before begin");
    gguf_writer_free(w);
    w = gguf_writer_new("GGUF", 32);
    gguf_w_tensor(w, "t", GGML_TYPE_F32, 2, ne);
    gguf_w_begin(w, fp);
    gguf_w_u32(w, "late", 1);
    CHECK(gguf_writer_error(w) && strstr(gguf_writer_error(w), "after gguf_w_begin"), "kv after begin");
    gguf_writer_free(w);
    w = gguf_writer_new("GGUF", 32);
    gguf_w_tensor(w, "t", GGML_TYPE_F32, 2, ne);
    gguf_w_begin(w, fp);
    CHECK(gguf_w_data(w, zeros, 100) == 0, "partial data");
    CHECK(gguf_w_finish(w) == -1 && strstr(gguf_writer_error(w), "tensor 't' has 100 of its 256 bytes"),
          "incomplete: %s", gguf_writer_error(w));
    gguf_writer_free(w);
    w = gguf_writer_new("GGUF", 32);
    gguf_w_tensor(w, "t", GGML_TYPE_F32, 2, ne);
    gguf_w_begin(w, fp);
    CHECK(gguf_w_data(w, zeros, 257) == -1 && strstr(gguf_writer_error(w), "beyond"), "excess data");
    gguf_writer_free(w);
    fclose(fp);
    free(buf);
}

/* ---- a file larger than 4 GiB: the writer counts in 64 bits, the reader maps it ---- */

typedef struct {
    uint8_t head[4096]; /* header, metadata and infos */
    uint64_t total;
} sink;

static ssize_t sink_write(void *cookie, const char *p, size_t n) {
    sink *s = cookie;
    for (size_t i = 0; i < n && s->total + i < sizeof s->head; i++) s->head[s->total + i] = (uint8_t)p[i];
    s->total += n;
    return (ssize_t)n;
}

static void test_large_file(void) {
    const uint64_t big_ne = (1ull << 30) + 2; /* f32: 4 GiB + 8 bytes */
    const uint64_t big_bytes = big_ne * 4, small_off = (big_bytes + 31) / 32 * 32;
    sink s = {.total = 0};
    FILE *fp = fopencookie(&s, "w", (cookie_io_functions_t){.write = sink_write});
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    gguf_writer *w = gguf_writer_new("GGUF", 32);
    gguf_w_str(w, "general.architecture", "llama");
    uint64_t ne_big[] = {big_ne}, ne_small[] = {8};
    gguf_w_tensor(w, "big", GGML_TYPE_F32, 1, ne_big);
    gguf_w_tensor(w, "small", GGML_TYPE_F32, 1, ne_small);
    CHECK(gguf_w_begin(w, fp) == 0, "begin");
    fflush(fp);
    uint64_t data_offset = s.total;
    static uint8_t chunk[1 << 20];
    uint64_t left = big_bytes + 32;
    while (left) {
        size_t n = left < sizeof chunk ? (size_t)left : sizeof chunk;
        if (gguf_w_data(w, chunk, n)) break;
        left -= n;
    }
    CHECK(gguf_w_finish(w) == 0, "finish: %s", gguf_writer_error(w));
    gguf_writer_free(w);
    fclose(fp);
    CHECK(s.total == data_offset + small_off + 32, "file size %llu", (unsigned long long)s.total);
    /* the second tensor's offset field is the last 8 bytes before the padding */
    CHECK(data_offset <= sizeof s.head, "header captured");

    /* read it back from a sparse file of the same size (no data pages are touched) */
    char path[] = "/tmp/pi2-test-gguf-big-XXXXXX";
    int fd = mkstemp(path);
    bool made = fd >= 0 && write(fd, s.head, (size_t)data_offset) == (ssize_t)data_offset &&
                ftruncate(fd, (off_t)s.total) == 0;
    CHECK(made, "sparse file");
    if (fd >= 0) close(fd);
    gguf_file g;
    char err[256];
    int rc = made ? gguf_open(&g, path, err, sizeof err) : -1;
    CHECK(rc == 0, "open large: %s", err);
    if (rc == 0) {
        const gguf_tensor *t = gguf_find_tensor(&g, "small");
        CHECK(t && t->offset == small_off && t->nbytes == 32, "offset past 4 GiB");
        t = gguf_find_tensor(&g, "big");
        CHECK(t && t->nbytes == big_bytes && t->ne[0] == big_ne, "4 GiB tensor");
        gguf_close(&g);
    }
    unlink(path);
}

/* ---- the oracle files ---- */

static void check_same_floats(const gguf_file *g, const char *name, const uint8_t *src, size_t n) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    CHECK(t && t->type == GGML_TYPE_F32 && t->nbytes == n * 4 && !memcmp(t->data, src, n * 4),
          "%s matches llama2.c's checkpoint", name);
}

static void test_stories260k(void) {
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/oracle/stories260K.gguf", shared_dir());
    gguf_file g;
    int rc = gguf_open(&g, path, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", path, err);
    if (rc) return;
    gguf_str s;
    uint64_t u;
    CHECK(!strcmp(g.magic, "GGUF") && g.version == 3, "stories260K header");
    CHECK(gguf_get_str(&g, "general.architecture", &s) && gguf_str_eq(s, "llama"), "architecture llama");
    /* llama2.c header (oracle/README.md, models/README.md): dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads */
    CHECK(gguf_get_uint(&g, "llama.embedding_length", &u) && u == 64, "dim 64");
    CHECK(gguf_get_uint(&g, "llama.feed_forward_length", &u) && u == 172, "ffn 172");
    CHECK(gguf_get_uint(&g, "llama.block_count", &u) && u == 5, "5 layers");
    CHECK(gguf_get_uint(&g, "llama.attention.head_count", &u) && u == 8, "8 heads");
    CHECK(gguf_get_uint(&g, "llama.attention.head_count_kv", &u) && u == 4, "4 kv heads");
    const gguf_tensor *t = gguf_find_tensor(&g, "token_embd.weight");
    CHECK(t && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512 && t->type == GGML_TYPE_F32,
          "token_embd.weight is f32 64x512");
    t = gguf_find_tensor(&g, "blk.4.ffn_down.weight");
    CHECK(t && t->ne[0] == 172 && t->ne[1] == 64, "ffn_down is 172x64");
    CHECK(g.n_tensors == 3 + 5 * 9, "48 tensors (embd, norm, output + 9 per layer): %llu",
          (unsigned long long)g.n_tensors);

    /* weights and vocabulary against the llama2.c files they were converted from */
    size_t bin_size = 0, tok_size = 0;
    snprintf(path, sizeof path, "%s/models/stories260K.bin", shared_dir());
    uint8_t *bin = slurp(path, &bin_size);
    snprintf(path, sizeof path, "%s/models/tok512.bin", shared_dir());
    uint8_t *tok = slurp(path, &tok_size);
    const size_t dim = 64, hidden = 172, layers = 5, vocab = 512, kv_dim = 32;
    const size_t embd = 28, rms_att = embd + vocab * dim * 4, wq = rms_att + layers * dim * 4;
    const size_t rms_ffn = wq + layers * (2 * dim * dim + 2 * kv_dim * dim) * 4;
    const size_t rms_final = rms_ffn + layers * dim * 4 + layers * 3 * hidden * dim * 4;
    CHECK(bin && bin_size >= rms_final + dim * 4, "stories260K.bin readable (%zu bytes)", bin_size);
    if (bin && bin_size >= rms_final + dim * 4) {
        check_same_floats(&g, "token_embd.weight", bin + embd, vocab * dim);
        check_same_floats(&g, "output_norm.weight", bin + rms_final, dim);
        for (size_t l = 0; l < layers; l++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%zu.attn_norm.weight", l);
            check_same_floats(&g, name, bin + rms_att + l * dim * 4, dim);
            snprintf(name, sizeof name, "blk.%zu.ffn_norm.weight", l);
            check_same_floats(&g, name, bin + rms_ffn + l * dim * 4, dim);
        }
    }
    const gguf_str *toks;
    uint64_t n_tok = 0, n_scores = 0;
    const void *scores = NULL;
    CHECK(gguf_get_str_arr(&g, "tokenizer.ggml.tokens", &n_tok, &toks) && n_tok == 512, "512 tokens");
    CHECK(gguf_get_arr(&g, "tokenizer.ggml.scores", GGUF_FLOAT32, &n_scores, &scores) && n_scores == 512,
          "512 scores");
    CHECK(tok != NULL, "tok512.bin readable");
    if (tok && n_tok == 512 && n_scores == 512) {
        /* tok512.bin: int32 max_len, then per token f32 score, int32 len, bytes; GGUF spells ' ' as U+2581 */
        size_t p = 4, mismatched_text = 0, mismatched_score = 0;
        for (size_t i = 0; i < 512 && p + 8 <= tok_size; i++) {
            float score, gscore;
            int32_t len;
            memcpy(&score, tok + p, 4);
            memcpy(&len, tok + p + 4, 4);
            p += 8;
            if (len < 0 || (size_t)len > tok_size - p) break;
            memcpy(&gscore, (const uint8_t *)scores + 4 * i, 4);
            mismatched_score += gscore != score;
            char want[256];
            size_t wn = 0;
            if (i >= 3 && i < 259) {
                wn = (size_t)snprintf(want, sizeof want, "<0x%02X>", (unsigned)(i - 3));
            } else {
                for (int32_t j = 0; j < len && wn + 3 < sizeof want; j++) {
                    if (tok[p + j] == ' ') {
                        memcpy(want + wn, "\xe2\x96\x81", 3);
                        wn += 3;
                    } else {
                        want[wn++] = (char)tok[p + j];
                    }
                }
            }
            if (i >= 3 && (toks[i].len != wn || memcmp(toks[i].ptr, want, wn))) mismatched_text++;
            p += (size_t)len;
        }
        CHECK(mismatched_score == 0, "%zu scores differ from tok512.bin", mismatched_score);
        CHECK(mismatched_text == 0, "%zu token texts differ from tok512.bin", mismatched_text);
        CHECK(gguf_str_eq(toks[0], "<unk>") && gguf_str_eq(toks[1], "<s>") && gguf_str_eq(toks[2], "</s>"),
              "special tokens");
    }
    free(bin);
    free(tok);
    gguf_close(&g);
}

/* synth-*.gguf: dim 256, 4 layers, FFN 768, vocab 512, untied output; 2-D tensors in the file's type */
static void test_synth(const char *file, uint32_t matrix_type, const gguf_file *ref_tokens) {
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/oracle/%s", shared_dir(), file);
    gguf_file g;
    int rc = gguf_open(&g, path, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", path, err);
    if (rc) return;
    gguf_str s;
    uint64_t u;
    CHECK(gguf_get_str(&g, "general.architecture", &s) && gguf_str_eq(s, "llama"), "%s arch", file);
    CHECK(gguf_get_uint(&g, "llama.block_count", &u) && u == 4, "%s layers", file);
    CHECK(g.n_tensors == 3 + 4 * 9, "%s tensor count %llu", file, (unsigned long long)g.n_tensors);
    const gguf_tensor *t = gguf_find_tensor(&g, "token_embd.weight");
    CHECK(t && t->ne[0] == 256 && t->ne[1] == 512 && t->type == matrix_type, "%s token_embd", file);
    t = gguf_find_tensor(&g, "output.weight");
    CHECK(t && t->ne[0] == 256 && t->ne[1] == 512 && t->type == matrix_type, "%s output", file);
    t = gguf_find_tensor(&g, "blk.3.ffn_gate.weight");
    CHECK(t && t->ne[0] == 256 && t->ne[1] == 768 && t->type == matrix_type, "%s ffn_gate", file);
    t = gguf_find_tensor(&g, "blk.3.ffn_down.weight");
    CHECK(t && t->ne[0] == 768 && t->ne[1] == 256, "%s ffn_down", file);
    t = gguf_find_tensor(&g, "blk.0.attn_norm.weight");
    CHECK(t && t->n_dims == 1 && t->ne[0] == 256 && t->type == GGML_TYPE_F32, "%s norms stay f32", file);
    /* the tokenizer was copied from stories260K */
    uint64_t n = 0, n_ref = 0;
    const gguf_str *toks, *ref;
    bool same = gguf_get_str_arr(&g, "tokenizer.ggml.tokens", &n, &toks) &&
                gguf_get_str_arr(ref_tokens, "tokenizer.ggml.tokens", &n_ref, &ref) && n == n_ref;
    for (uint64_t i = 0; same && i < n; i++)
        same = toks[i].len == ref[i].len && !memcmp(toks[i].ptr, ref[i].ptr, ref[i].len);
    CHECK(same, "%s tokens equal stories260K's", file);
    gguf_close(&g);
}

static void test_oracles(void) {
    test_stories260k();
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/oracle/stories260K.gguf", shared_dir());
    gguf_file ref;
    if (gguf_open(&ref, path, err, sizeof err)) return; /* reported by test_stories260k */
    test_synth("synth-f32.gguf", GGML_TYPE_F32, &ref);
    test_synth("synth-f16.gguf", GGML_TYPE_F16, &ref);
    test_synth("synth-q8_0.gguf", GGML_TYPE_Q8_0, &ref);
    test_synth("synth-q4_0.gguf", GGML_TYPE_Q4_0, &ref);
    gguf_close(&ref);
}

int main(void) {
    test_type_table();
    build_str_array();
    fill_tensor_data();
    test_round_trip("GGUF", 32);
    test_round_trip("GGUF", 64);
    test_round_trip("GGUF", 4096);
    test_round_trip("PWRI", 32);
    test_round_trip("PWRI", 128);
    test_writer_errors();
    test_large_file();
    test_oracles();
    for (size_t i = 0; i < N_RT; i++) free(rt_tensors[i].data);
    return test_summary();
}

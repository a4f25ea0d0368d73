/* Malformed GGUF files: every one must be refused with a message that names
 * the field, and none may crash or read out of bounds (run under ASan too).
 * Each image is copied into a buffer of exactly its size so ASan sees any overread. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "test.h"

typedef struct {
    uint8_t *p;
    size_t n, cap;
} bytes;

static void b_raw(bytes *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b_u8(bytes *b, uint8_t v) { b_raw(b, &v, 1); }
static void b_u32(bytes *b, uint32_t v) { b_raw(b, &v, 4); }
static void b_u64(bytes *b, uint64_t v) { b_raw(b, &v, 8); }
static void b_str(bytes *b, const char *s) {
    b_u64(b, strlen(s));
    b_raw(b, s, strlen(s));
}
static void b_header(bytes *b, const char *magic, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b->n = 0;
    b_raw(b, magic, 4);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}
static void b_kv_u32(bytes *b, const char *key, uint32_t v) {
    b_str(b, key);
    b_u32(b, GGUF_UINT32);
    b_u32(b, v);
}
static void b_tinfo(bytes *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                    uint64_t offset) {
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) b_u64(b, ne[d]);
    b_u32(b, type);
    b_u64(b, offset);
}
static void b_pad_data(bytes *b, size_t align, size_t data_bytes) {
    while (b->n % align) b_u8(b, 0);
    for (size_t i = 0; i < data_bytes; i++) b_u8(b, (uint8_t)i);
}

static int parse_exact(const uint8_t *p, size_t n, gguf_file *g, char *err, size_t errlen) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, p, n);
    int rc = gguf_parse(g, copy, n, "bad.gguf", err, errlen);
    if (rc == 0) gguf_close(g);
    free(copy);
    return rc;
}

/* Expects an error whose message starts with the file name and contains want1 and want2. */
static void expect_error(const char *what, const bytes *b, const char *want1, const char *want2) {
    gguf_file g;
    char err[512] = "";
    int rc = parse_exact(b->p, b->n, &g, err, sizeof err);
    CHECK(rc == -1, "%s: accepted", what);
    CHECK(!strncmp(err, "bad.gguf: ", 10), "%s: message names the file: %s", what, err);
    CHECK(strstr(err, want1) != NULL, "%s: '%s' not in: %s", what, want1, err);
    if (want2) CHECK(strstr(err, want2) != NULL, "%s: '%s' not in: %s", what, want2, err);
}

static void expect_ok(const char *what, const bytes *b) {
    gguf_file g;
    char err[512] = "";
    CHECK(parse_exact(b->p, b->n, &g, err, sizeof err) == 0, "%s: %s", what, err);
}

static const uint64_t ne_32x2[] = {32, 2};

/* A well-formed file with one f32 tensor, for cases that change one thing. */
static void b_minimal_tensor(bytes *b, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset,
                             size_t data) {
    b_header(b, "GGUF", 3, 1, 1);
    b_kv_u32(b, "k", 7);
    b_tinfo(b, "blk.0.attn_q.weight", n_dims, ne, type, offset);
    b_pad_data(b, 32, data);
}

static void test_header(void) {
    bytes b = {0};
    b_minimal_tensor(&b, 2, ne_32x2, GGML_TYPE_F32, 0, 256);
    expect_ok("minimal file", &b);
    b.p[3] = 'X';
    expect_error("bad magic", &b, "header.magic at offset 0", "bad magic");
    b_minimal_tensor(&b, 2, ne_32x2, GGML_TYPE_F32, 0, 256);
    memcpy(b.p, "PWRI", 4);
    expect_ok("PWRI magic", &b);
    b.p[4] = 1;
    expect_error("version 1", &b, "header.version at offset 4", "unsupported version 1");
    b.p[4] = 4;
    expect_error("version 4", &b, "header.version", "unsupported version 4");
    b.p[4] = 2;
    expect_ok("version 2", &b);

    b.n = 0;
    expect_error("empty file", &b, "header.magic", "truncated");
    b_header(&b, "GGUF", 3, 0, 1ull << 63);
    b_kv_u32(&b, "k", 1);
    expect_error("huge n_kv", &b, "header.n_kv at offset 16", "cannot fit");
    b_header(&b, "GGUF", 3, 1ull << 63, 0);
    b_tinfo(&b, "t", 2, ne_32x2, GGML_TYPE_F32, 0);
    expect_error("huge n_tensors", &b, "header.n_tensors at offset 8", "cannot fit");
    b_header(&b, "GGUF", 3, 0, 0);
    b_u8(&b, 0); /* 25 bytes: padding to 32 runs past the end */
    expect_error("missing padding", &b, "data section", "padding");
    free(b.p);
}

static void test_kv(void) {
    bytes b = {0};
    b_header(&b, "GGUF", 3, 0, 1);
    b_u64(&b, 1ull << 62);
    b_raw(&b, "key and some more bytes", 23);
    expect_error("huge key length", &b, "kv[0].key at offset 24", "string length 4611686018427387904");

    b_header(&b, "GGUF", 3, 0, 1);
    b_str(&b, "general.name");
    b_u32(&b, GGUF_STRING);
    b_u64(&b, 1ull << 63);
    b_raw(&b, "abc", 3);
    expect_error("huge string length", &b, "kv[0] 'general.name' value", "string length");

    b_header(&b, "GGUF", 3, 0, 1);
    b_str(&b, "x");
    b_u32(&b, 13);
    b_u32(&b, 0);
    expect_error("unknown value type", &b, "kv[0] 'x' type at offset 33", "unknown value type 13");

    b_header(&b, "GGUF", 3, 0, 1);
    b_str(&b, "b");
    b_u32(&b, GGUF_BOOL);
    b_u8(&b, 2);
    expect_error("bool 2", &b, "kv[0] 'b' value", "not 0 or 1");

    static const struct { uint32_t type; uint64_t n; } huge[] = {
        {GGUF_UINT8, 1ull << 62},
        {GGUF_UINT64, (1ull << 61) + 1}, /* n * 8 wraps to 8 in 64 bits */
        {GGUF_FLOAT32, UINT64_MAX},
        {GGUF_STRING, 1ull << 60},
    };
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        b_header(&b, "GGUF", 3, 0, 1);
        b_str(&b, "tokenizer.ggml.tokens");
        b_u32(&b, GGUF_ARRAY);
        b_u32(&b, huge[i].type);
        b_u64(&b, huge[i].n);
        b_u64(&b, 0);
        b_u64(&b, 0);
        expect_error("huge array length", &b, "kv[0] 'tokenizer.ggml.tokens' array length", "cannot fit");
    }

    b_header(&b, "GGUF", 3, 0, 1);
    b_str(&b, "tokenizer.ggml.tokens");
    b_u32(&b, GGUF_ARRAY);
    b_u32(&b, GGUF_STRING);
    b_u64(&b, 2);
    b_str(&b, "ok");
    b_u64(&b, 1000);
    b_raw(&b, "short", 5);
    expect_error("huge string in array", &b, "kv[0] 'tokenizer.ggml.tokens' [1]", "string length 1000");

    b_header(&b, "GGUF", 3, 0, 1);
    b_str(&b, "nest");
    b_u32(&b, GGUF_ARRAY);
    b_u32(&b, GGUF_ARRAY);
    b_u64(&b, 1);
    b_u32(&b, GGUF_UINT8);
    b_u64(&b, 1);
    b_u8(&b, 0);
    expect_error("nested array", &b, "kv[0] 'nest' array type", "nested arrays");

    b_header(&b, "GGUF", 3, 0, 1);
    b_str(&b, "a");
    b_u32(&b, GGUF_ARRAY);
    b_u32(&b, 200);
    b_u64(&b, 0);
    expect_error("unknown array element type", &b, "kv[0] 'a' array type", "unknown value type 200");

    b_header(&b, "GGUF", 3, 0, 3);
    b_kv_u32(&b, "k", 1);
    b_kv_u32(&b, "other", 1);
    size_t second_k = b.n;
    b_kv_u32(&b, "k", 2);
    char where[64];
    snprintf(where, sizeof where, "kv[2] at offset %zu", second_k);
    expect_error("duplicate key", &b, where, "duplicate name 'k' (also kv[0])");

    b_header(&b, "GGUF", 3, 0, 1);
    b_str(&b, "\x01\xff\n");
    b_u32(&b, 99);
    expect_error("unprintable key", &b, "kv[0] '?\?\?' type", "unknown value type 99");
    free(b.p);
}

static void test_alignment(void) {
    bytes b = {0};
    const uint32_t bad[] = {0, 3, 48, 0x80000001u};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b_header(&b, "GGUF", 3, 0, 1);
        b_kv_u32(&b, "general.alignment", bad[i]);
        b_pad_data(&b, 64, 0);
        expect_error("bad general.alignment", &b, "kv[0] 'general.alignment' value", "power of two");
    }
    b_header(&b, "GGUF", 3, 0, 1);
    b_str(&b, "general.alignment");
    b_u32(&b, GGUF_UINT64);
    b_u64(&b, 32);
    b_pad_data(&b, 32, 0);
    expect_error("alignment as u64", &b, "general.alignment", "must be uint32");

    b_header(&b, "GGUF", 3, 0, 1);
    b_str(&b, "general.alignment");
    b_u32(&b, GGUF_STRING);
    b_str(&b, "32");
    b_pad_data(&b, 32, 0);
    expect_error("alignment as string", &b, "general.alignment", "must be uint32");

    /* 4096: tensor at 4096 within the data section, data section itself 4096-aligned */
    b_header(&b, "GGUF", 3, 2, 1);
    b_kv_u32(&b, "general.alignment", 4096);
    b_tinfo(&b, "a", 2, ne_32x2, GGML_TYPE_F32, 0);
    b_tinfo(&b, "b", 2, ne_32x2, GGML_TYPE_F32, 4096);
    b_pad_data(&b, 4096, 4096 + 256);
    gguf_file g;
    char err[256];
    int rc = gguf_parse(&g, b.p, b.n, "ok.gguf", err, sizeof err);
    CHECK(rc == 0, "4096 alignment: %s", err);
    if (rc == 0) {
        CHECK(g.alignment == 4096 && g.data_offset == 4096, "data offset %llu",
              (unsigned long long)g.data_offset);
        CHECK((const uint8_t *)g.tensors[1].data == b.p + 8192, "second tensor at 8192");
        gguf_close(&g);
    }
    b_header(&b, "GGUF", 3, 1, 1);
    b_kv_u32(&b, "general.alignment", 64);
    b_tinfo(&b, "t", 2, ne_32x2, GGML_TYPE_F32, 32);
    b_pad_data(&b, 64, 512);
    expect_error("offset not a multiple of 64", &b, "tensor_info[0].offset", "not a multiple of the alignment 64");
    free(b.p);
}

static void test_tensor_infos(void) {
    bytes b = {0};
    uint64_t ne5[] = {32, 1, 1, 1, 1};
    b_minimal_tensor(&b, 5, ne5, GGML_TYPE_F32, 0, 128);
    /* header 24 + kv "k" (8 + 1 + 4 + 4) + name (8 + 19) */
    expect_error("n_dims 5", &b, "tensor_info[0].n_dims at offset 68", "5 is not in 1..4");
    b_minimal_tensor(&b, 0, ne5, GGML_TYPE_F32, 0, 128);
    expect_error("n_dims 0", &b, "tensor_info[0].n_dims", "0 is not in 1..4");

    uint64_t zero[] = {32, 0};
    b_minimal_tensor(&b, 2, zero, GGML_TYPE_F32, 0, 128);
    expect_error("zero dimension", &b, "tensor_info[0].ne[1] at offset 80", "dimension is 0");

    uint64_t wrap[] = {1ull << 32, 1ull << 32};
    b_minimal_tensor(&b, 2, wrap, GGML_TYPE_F32, 0, 128);
    expect_error("element count overflow", &b, "tensor_info[0].ne[1]", "overflows");
    uint64_t over_int64[] = {1ull << 62, 2};
    b_minimal_tensor(&b, 2, over_int64, GGML_TYPE_F32, 0, 128);
    expect_error("element count above INT64_MAX", &b, "tensor_info[0].ne[1]", "overflows");
    uint64_t bytes_wrap[] = {1ull << 62};
    b_minimal_tensor(&b, 1, bytes_wrap, GGML_TYPE_F32, 0, 128);
    expect_error("byte size overflow", &b, "tensor_info[0].type", "byte size overflows");

    b_minimal_tensor(&b, 2, ne_32x2, 12, 0, 256);
    expect_error("q4_K", &b, "tensor_info[0].type",
                 "tensor 'blk.0.attn_q.weight': type q4_K (12) is not supported (pi2 reads f32, f16, q4_0, q8_0, i8)");
    b_minimal_tensor(&b, 2, ne_32x2, 30, 0, 256);
    expect_error("bf16", &b, "tensor_info[0].type", "bf16 (30)");
    b_minimal_tensor(&b, 2, ne_32x2, 777, 0, 256);
    expect_error("unknown tensor type", &b, "tensor_info[0].type", "unknown (777)");

    uint64_t ne48[] = {48, 2};
    b_minimal_tensor(&b, 2, ne48, GGML_TYPE_Q4_0, 0, 256);
    expect_error("partial block", &b, "tensor_info[0].type", "not a multiple of the q4_0 block size 32");
    b_minimal_tensor(&b, 2, ne48, GGML_TYPE_Q8_0, 0, 256);
    expect_error("partial q8_0 block", &b, "tensor_info[0]", "q8_0 block size");

    b_minimal_tensor(&b, 2, ne_32x2, GGML_TYPE_F32, 4, 256);
    expect_error("misaligned offset", &b, "tensor_info[0].offset at offset 92", "not a multiple of the alignment 32");
    b_minimal_tensor(&b, 2, ne_32x2, GGML_TYPE_F32, 32, 256);
    expect_error("data past the end", &b, "tensor_info[0].offset", "run past the end");
    b_minimal_tensor(&b, 2, ne_32x2, GGML_TYPE_F32, UINT64_MAX - 31, 256);
    expect_error("offset near 2^64", &b, "tensor_info[0].offset", "run past the end");
    b_minimal_tensor(&b, 2, ne_32x2, GGML_TYPE_F32, 0, 255);
    expect_error("data truncated", &b, "tensor_info[0].offset", "run past the end");

    b_header(&b, "GGUF", 3, 2, 0);
    b_tinfo(&b, "w", 2, ne_32x2, GGML_TYPE_F32, 0);
    b_tinfo(&b, "w", 2, ne_32x2, GGML_TYPE_F32, 256);
    b_pad_data(&b, 32, 512);
    expect_error("duplicate tensor", &b, "tensor_info[1]", "duplicate name 'w' (also tensor_info[0])");

    b_header(&b, "GGUF", 3, 1, 0);
    b_u64(&b, 1ull << 40);
    b_raw(&b, "name", 4);
    b_pad_data(&b, 32, 64);
    expect_error("huge tensor name", &b, "tensor_info[0].name", "string length");
    free(b.p);
}

/* A writer-made file with several value types, cut at every length and corrupted at every header byte. */
static void test_truncation_and_corruption(void) {
    char *buf = NULL;
    size_t size = 0;
    FILE *fp = open_memstream(&buf, &size);
    gguf_writer *w = gguf_writer_new("GGUF", 32);
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u32(w, "llama.block_count", 1);
    gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_w_bool(w, "flag", true);
    const char *toks[] = {"<unk>", "a", "\xe2\x96\x81the"};
    gguf_w_str_arr(w, "tokenizer.ggml.tokens", 3, toks, NULL);
    static const float scores[] = {0, -1, -2};
    gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, 3, scores);
    static const uint64_t ne_q[] = {32, 2}, ne_v[] = {5};
    gguf_w_tensor(w, "q", GGML_TYPE_Q8_0, 2, ne_q);
    gguf_w_tensor(w, "v", GGML_TYPE_F32, 1, ne_v);
    gguf_w_begin(w, fp);
    uint8_t data[68 + 20];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7);
    gguf_w_data(w, data, sizeof data);
    CHECK(gguf_w_finish(w) == 0, "writer: %s", gguf_writer_error(w));
    gguf_writer_free(w);
    fclose(fp);

    gguf_file g;
    char err[512];
    int rc = gguf_parse(&g, buf, size, "whole.gguf", err, sizeof err);
    CHECK(rc == 0 && g.n_tensors == 2, "whole file parses: %s", err);
    if (rc || g.n_tensors != 2) {
        free(buf);
        return;
    }
    size_t data_offset = (size_t)g.data_offset;
    size_t end = data_offset + (size_t)(g.tensors[1].offset + g.tensors[1].nbytes);
    gguf_close(&g);

    size_t accepted = 0, unnamed = 0;
    for (size_t n = 0; n < end; n++) {
        err[0] = 0;
        accepted += parse_exact((const uint8_t *)buf, n, &g, err, sizeof err) == 0;
        unnamed += strncmp(err, "bad.gguf: ", 10) != 0 || !strstr(err, " at offset ");
    }
    CHECK(accepted == 0, "%zu truncated prefixes accepted", accepted);
    CHECK(unnamed == 0, "%zu messages without file, field and offset", unnamed);
    CHECK(parse_exact((const uint8_t *)buf, end, &g, err, sizeof err) == 0,
          "the final padding is optional: %s", err);

    /* every header byte set to a few hostile values: any outcome but a crash or overread */
    static const uint8_t values[] = {0x00, 0xff, 0x80, 0x7f, 0x01};
    size_t refused = 0;
    for (size_t pos = 0; pos < data_offset; pos++) {
        for (size_t v = 0; v < sizeof values; v++) {
            uint8_t saved = (uint8_t)buf[pos];
            buf[pos] = (char)values[v];
            refused += parse_exact((const uint8_t *)buf, size, &g, err, sizeof err) != 0;
            buf[pos] = (char)saved;
        }
    }
    CHECK(refused > 0, "corruptions refused: %zu", refused);
    free(buf);
}

static void test_open_errors(void) {
    gguf_file g;
    char err[512];
    CHECK(gguf_open(&g, "/nonexistent/x.gguf", err, sizeof err) == -1 && strstr(err, "/nonexistent/x.gguf") &&
              strstr(err, "No such file"),
          "missing file: %s", err);
    CHECK(gguf_open(&g, "/tmp", err, sizeof err) == -1 && strstr(err, "not a regular file"), "directory: %s", err);
    char path[] = "/tmp/pi2-test-gguf-empty-XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK(gguf_open(&g, path, err, sizeof err) == -1 && strstr(err, path) && strstr(err, "header.magic"),
          "empty file: %s", err);
    unlink(path);
}

int main(void) {
    test_header();
    test_kv();
    test_alignment();
    test_tensor_infos();
    test_truncation_and_corruption();
    test_open_errors();
    return test_summary();
}

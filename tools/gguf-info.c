/* gguf-info: print a GGUF file's header, metadata and tensor table. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "gguf/gguf.h"
#include "util/log.h"

#define ARRAY_PREVIEW 8   /* array elements shown without --all */
#define STRING_PREVIEW 96 /* string bytes shown without --all */

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s [-h] FILE [--all]\n"
            "Print a GGUF file's magic, version, alignment, metadata and tensor table.\n"
            "  --all  print every array element and whole strings (default: the first %d\n"
            "         elements and %d bytes)\n",
            prog, ARRAY_PREVIEW, STRING_PREVIEW);
}

/* Quoted, with bytes outside printable ASCII escaped (tokens hold arbitrary bytes). */
static void print_str(gguf_str s, bool all) {
    uint64_t n = all || s.len <= STRING_PREVIEW ? s.len : STRING_PREVIEW;
    putchar('"');
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c >= 0x20 && c < 0x7f) putchar(c);
        else printf("\\x%02x", c);
    }
    putchar('"');
    if (n < s.len) printf("...(%" PRIu64 " bytes)", s.len);
}

static void print_scalar(uint32_t type, const void *p) {
    switch (type) {
    case GGUF_UINT8: printf("%u", *(const uint8_t *)p); break;
    case GGUF_INT8: printf("%d", *(const int8_t *)p); break;
    case GGUF_BOOL: fputs(*(const uint8_t *)p ? "true" : "false", stdout); break;
    case GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); printf("%u", v); break; }
    case GGUF_INT16: { int16_t v; memcpy(&v, p, 2); printf("%d", v); break; }
    case GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); printf("%" PRIu32, v); break; }
    case GGUF_INT32: { int32_t v; memcpy(&v, p, 4); printf("%" PRId32, v); break; }
    case GGUF_FLOAT32: { float v; memcpy(&v, p, 4); printf("%.9g", v); break; }
    case GGUF_UINT64: { uint64_t v; memcpy(&v, p, 8); printf("%" PRIu64, v); break; }
    case GGUF_INT64: { int64_t v; memcpy(&v, p, 8); printf("%" PRId64, v); break; }
    case GGUF_FLOAT64: { double v; memcpy(&v, p, 8); printf("%.17g", v); break; }
    }
}

static size_t scalar_bytes(uint32_t type) {
    switch (type) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    default: return 8;
    }
}

static void print_kv(const gguf_kv *kv, bool all) {
    fputs("  ", stdout);
    fwrite(kv->key.ptr, 1, (size_t)kv->key.len, stdout);
    if (kv->type == GGUF_ARRAY) {
        printf(" = %s[%" PRIu64 "] [", gguf_value_type_name(kv->arr_type), kv->arr_n);
        uint64_t n = all || kv->arr_n <= ARRAY_PREVIEW ? kv->arr_n : ARRAY_PREVIEW;
        for (uint64_t i = 0; i < n; i++) {
            if (i) fputs(", ", stdout);
            if (kv->arr_type == GGUF_STRING) print_str(kv->arr_strs[i], all);
            else print_scalar(kv->arr_type, (const uint8_t *)kv->arr_data + i * scalar_bytes(kv->arr_type));
        }
        if (n < kv->arr_n) printf(", ... %" PRIu64 " more", kv->arr_n - n);
        puts("]");
        return;
    }
    printf(" = %s ", gguf_value_type_name(kv->type));
    switch (kv->type) {
    case GGUF_STRING: print_str(kv->v.str, all); break;
    case GGUF_BOOL: fputs(kv->v.b ? "true" : "false", stdout); break;
    case GGUF_FLOAT32: printf("%.9g", kv->v.f64); break;
    case GGUF_FLOAT64: printf("%.17g", kv->v.f64); break;
    case GGUF_INT8: case GGUF_INT16: case GGUF_INT32: case GGUF_INT64:
        printf("%" PRId64, kv->v.i64);
        break;
    default: printf("%" PRIu64, kv->v.u64); break;
    }
    putchar('\n');
}

static void print_tensors(const gguf_file *g) {
    printf("tensors    %" PRIu64 "\n", g->n_tensors);
    printf("  %-5s %-32s %-5s %-24s %12s %12s\n", "#", "name", "type", "shape", "offset", "bytes");
    uint64_t elems = 0, bytes = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        char shape[96];
        int n = 0;
        uint64_t te = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%" PRIu64, d ? " x " : "", t->ne[d]);
            te *= t->ne[d];
        }
        printf("  %-5" PRIu64 " %-32.*s %-5s %-24s %12" PRIu64 " %12" PRIu64 "\n", i, (int)t->name.len,
               t->name.ptr, ggml_type_name(t->type), shape, t->offset, t->nbytes);
        elems += te;
        bytes += t->nbytes;
    }
    printf("total      %" PRIu64 " tensors, %" PRIu64 " elements, %" PRIu64 " bytes (%.2f MiB)\n",
           g->n_tensors, elems, bytes, (double)bytes / (1024.0 * 1024.0));
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    const char *path = NULL;
    bool all = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout, argv[0]);
            return 0;
        }
        if (!strcmp(argv[i], "--all")) all = true;
        else if (argv[i][0] == '-' && argv[i][1]) {
            log_error("unknown option '%s' (see -h)", argv[i]);
            return 2;
        } else if (path) {
            log_error("more than one FILE given (see -h)");
            return 2;
        } else path = argv[i];
    }
    if (!path) {
        usage(stderr, argv[0]);
        return 2;
    }

    gguf_file g;
    char err[512];
    if (gguf_open(&g, path, err, sizeof err)) {
        log_error("%s", err);
        return 1;
    }
    printf("file       %s (%zu bytes)\n", path, g.size);
    printf("magic      %s\nversion    %u\nalignment  %" PRIu64 "\n", g.magic, g.version, g.alignment);
    printf("data       at offset %" PRIu64 ", %" PRIu64 " bytes\n", g.data_offset,
           (uint64_t)g.size - g.data_offset);
    printf("metadata   %" PRIu64 " keys\n", g.n_kv);
    for (uint64_t i = 0; i < g.n_kv; i++) print_kv(&g.kv[i], all);
    print_tensors(&g);
    gguf_close(&g);
    if (fflush(stdout) || ferror(stdout)) {
        log_error("writing output failed");
        return 1;
    }
    return 0;
}

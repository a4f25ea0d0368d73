/* The hardware profile's file (hw_profile_cache_path, _save, _load) and the
 * interpolation of its I/O grid (hw_io_iops). Save and load walk one table
 * of the fields, so that what one writes the other reads, and save refuses
 * to write what load would refuse. */
#include "hw_profile.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf/ggml_types.h"
#include "plan/bundle.h"
#include "util/mkdirs.h"
#include "util/log.h"

enum field_kind { FIELD_INT, FIELD_U64, FIELD_BOOL, FIELD_DOUBLE, FIELD_TEXT, FIELD_WEIGHT_TYPE };

typedef struct {
    char key[24];
    enum field_kind kind;
    void *value;
    double lo, hi; /* INT: the range; DOUBLE: (lo, hi] */
    size_t cap;    /* TEXT: the buffer's size */
} field;

#define N_FIELDS (19 + HW_IO_SIZES * HW_IO_DEPTHS + 2 * HW_IO_SIZES) /* what profile_fields fills (the test \
                                                                        counts the lines) */

/* f[*n], then *n + 1. A field added to profile_fields without growing
 * N_FIELDS stops the program here rather than writing past the table. */
static field *next_field(field *f, int *n) {
    if (*n >= N_FIELDS) {
        fprintf(stderr, "hw_profile_file.c: more than N_FIELDS (%d) profile fields: grow N_FIELDS\n", N_FIELDS);
        abort();
    }
    return &f[(*n)++];
}

/* The fields of h in file order (version first); returns their count. */
static int profile_fields(hw_profile *h, field *f) {
    int n = 0;
#define INT_FIELD(name, lo_, hi_) *next_field(f, &n) = (field){#name, FIELD_INT, &h->name, lo_, hi_, 0}
#define DOUBLE_FIELD(name, hi_) *next_field(f, &n) = (field){#name, FIELD_DOUBLE, &h->name, 0, hi_, 0}
    INT_FIELD(version, 0, INT_MAX);
    *next_field(f, &n) = (field){"cpu", FIELD_TEXT, h->cpu, 0, 0, sizeof h->cpu};
    INT_FIELD(n_cpus, 1, 1 << 20);
    *next_field(f, &n) = (field){"kernels", FIELD_TEXT, h->kernels, 0, 0, sizeof h->kernels};
    DOUBLE_FIELD(mem_gbs_one, 1e5);
    DOUBLE_FIELD(mem_gbs_all, 1e5);
    *next_field(f, &n) = (field){"weight_type", FIELD_WEIGHT_TYPE, &h->weight_type, 0, 0, 0};
    *next_field(f, &n) = (field){"down_type", FIELD_WEIGHT_TYPE, &h->down_type, 0, 0, 0};
    INT_FIELD(row_len, 1, 1 << 24);
    DOUBLE_FIELD(dense_rows_s, 1e13);
    DOUBLE_FIELD(sparse_rows_s, 1e13);
    DOUBLE_FIELD(axpy_rows_s, 1e13);
    *next_field(f, &n) = (field){"fs_dev", FIELD_U64, &h->fs_dev, 0, 0, 0};
    *next_field(f, &n) = (field){"o_direct", FIELD_BOOL, &h->o_direct, 0, 0, 0};
    *next_field(f, &n) = (field){"io_engine", FIELD_TEXT, h->io_engine, 0, 0, sizeof h->io_engine};
    for (int s = 0; s < HW_IO_SIZES; s++)
        for (int d = 0; d < HW_IO_DEPTHS; d++) {
            field *x = next_field(f, &n);
            *x = (field){"", FIELD_DOUBLE, &h->iops[s][d], 0, 1e9, 0};
            snprintf(x->key, sizeof x->key, "iops.%d.%d", hw_io_size_kib[s], hw_io_depth[d]);
        }
    for (int s = 0; s < HW_IO_SIZES; s++) {
        field *x = next_field(f, &n);
        *x = (field){"", FIELD_DOUBLE, &h->io_cpu_us[s], 0, 1e6, 0};
        snprintf(x->key, sizeof x->key, "io_cpu_us.%d", hw_io_size_kib[s]);
        x = next_field(f, &n);
        *x = (field){"", FIELD_DOUBLE, &h->checked_cpu_us[s], 0, 1e6, 0};
        snprintf(x->key, sizeof x->key, "checked_cpu_us.%d", hw_io_size_kib[s]);
    }
    DOUBLE_FIELD(seq_mbs, 1e7);
    DOUBLE_FIELD(bus_rtt_us, 1e7);
    DOUBLE_FIELD(wake_us, 1e7);
    DOUBLE_FIELD(seconds, 1e6);
#undef INT_FIELD
#undef DOUBLE_FIELD
    return n;
}

/* The field's value as text (numbers exact: %.17g). */
static void format_value(const field *f, char *out, size_t outlen) {
    switch (f->kind) {
    case FIELD_INT: snprintf(out, outlen, "%d", *(const int *)f->value); break;
    case FIELD_U64: snprintf(out, outlen, "%llu", (unsigned long long)*(const uint64_t *)f->value); break;
    case FIELD_BOOL: snprintf(out, outlen, "%d", *(const bool *)f->value ? 1 : 0); break;
    case FIELD_DOUBLE: snprintf(out, outlen, "%.17g", *(const double *)f->value); break;
    case FIELD_TEXT: snprintf(out, outlen, "%s", (const char *)f->value); break;
    case FIELD_WEIGHT_TYPE: snprintf(out, outlen, "%s", ggml_type_name(*(const uint32_t *)f->value)); break;
    }
}

/* Whole-string numbers: no leading space or sign where none belongs. */
static bool parse_long(const char *s, long long *out) {
    char *end;
    errno = 0;
    *out = strtoll(s, &end, 10);
    return *s && *s != ' ' && *s != '+' && !errno && !*end;
}

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    *out = strtoull(s, &end, 10);
    return *s >= '0' && *s <= '9' && !errno && !*end;
}

static bool parse_finite(const char *s, double *out) {
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return *s && *s != ' ' && !errno && !*end && isfinite(*out);
}

/* Parses text into f's value; on error returns what is wrong with it. */
static const char *parse_value(const field *f, const char *text) {
    long long i;
    double d;
    int type;
    switch (f->kind) {
    case FIELD_INT:
        if (!parse_long(text, &i)) return "not a whole number";
        if (i < f->lo || i > f->hi) return "out of range";
        *(int *)f->value = (int)i;
        return NULL;
    case FIELD_U64: return parse_u64(text, f->value) ? NULL : "not a whole number";
    case FIELD_BOOL:
        if (strcmp(text, "0") && strcmp(text, "1")) return "not 0 or 1";
        *(bool *)f->value = text[0] == '1';
        return NULL;
    case FIELD_DOUBLE:
        if (!parse_finite(text, &d)) return "not a number";
        if (!(d > f->lo && d <= f->hi)) return "out of range";
        *(double *)f->value = d;
        return NULL;
    case FIELD_TEXT:
        if (!*text) return "empty";
        if (strlen(text) >= f->cap) return "too long";
        snprintf(f->value, f->cap, "%s", text);
        return NULL;
    case FIELD_WEIGHT_TYPE:
        type = ggml_type_from_name(text);
        if (type < 0) return "not a weight type (f32, f16, q8_0, q4_0)";
        *(uint32_t *)f->value = (uint32_t)type;
        return NULL;
    }
    return "unknown kind";
}

int hw_profile_save(const hw_profile *h, const char *path, char *err, size_t errlen) {
    field fields[N_FIELDS];
    hw_profile copy = *h; /* the table's pointers are writable; parse_value checks into this copy */
    const int n = profile_fields(&copy, fields);
    char tmp[PATH_MAX + 8], text[128];
    for (int i = 0; i < n; i++) {
        format_value(&fields[i], text, sizeof text);
        const char *bad = strchr(text, '\n') ? "holds a newline" : parse_value(&fields[i], text);
        if (bad) {
            err_set(err, errlen, "%s: %s: %s ('%s'), not saved", path, fields[i].key, bad, text);
            return -1;
        }
    }
    char dir[PATH_MAX], failed[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = '\0';
    if (slash && slash != dir && mkdirs(dir, failed, sizeof failed)) {
        err_set(err, errlen, "mkdir %s: %s", failed, strerror(errno));
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        err_set(err, errlen, "create %s: %s", tmp, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        format_value(&fields[i], text, sizeof text);
        fprintf(f, "%s %s\n", fields[i].key, text);
    }
    if (ferror(f) | fclose(f) || rename(tmp, path)) { /* | : fclose runs in any case */
        err_set(err, errlen, "write %s: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

typedef struct {
    const char *path;
    field fields[N_FIELDS];
    int n_fields;
    int line_of[N_FIELDS]; /* where each field was read; 0: not yet */
} profile_reader;

/* One "key value\n" line; 0, or -1 with err naming the file, line and key. */
static int read_line(profile_reader *r, int lineno, char *line, size_t len, char *err, size_t errlen) {
    const size_t key_len = strcspn(line, " \n");
    if (line[len - 1] != '\n') {
        err_set(err, errlen, "%s:%d: %.*s: line cut short (no newline)", r->path, lineno, (int)key_len, line);
        return -1;
    }
    line[len - 1] = 0;
    if (key_len == 0) {
        err_set(err, errlen, "%s:%d: empty line or no key", r->path, lineno);
        return -1;
    }
    if (line[key_len] != ' ') {
        err_set(err, errlen, "%s:%d: %s: no value", r->path, lineno, line);
        return -1;
    }
    line[key_len] = 0;
    const char *key = line, *value = line + key_len + 1;
    int i = 0;
    while (i < r->n_fields && strcmp(r->fields[i].key, key)) i++;
    if (i == r->n_fields) {
        err_set(err, errlen, "%s:%d: %s: unknown key", r->path, lineno, key);
        return -1;
    }
    if ((lineno == 1) != (i == 0)) { /* the version first, so another version is refused before its keys */
        err_set(err, errlen, "%s:%d: %s: %s", r->path, lineno, key,
                lineno == 1 ? "the first line must be the version" : "repeated (first at line 1)");
        return -1;
    }
    if (r->line_of[i]) {
        err_set(err, errlen, "%s:%d: %s: repeated (first at line %d)", r->path, lineno, key, r->line_of[i]);
        return -1;
    }
    r->line_of[i] = lineno;
    const char *bad = parse_value(&r->fields[i], value);
    if (bad) {
        err_set(err, errlen, "%s:%d: %s: %s ('%s')", r->path, lineno, key, bad, value);
        return -1;
    }
    if (i == 0 && *(const int *)r->fields[0].value != HW_PROFILE_VERSION) {
        err_set(err, errlen, "%s:%d: %s: %s, this program reads version %d", r->path, lineno, key, value,
                HW_PROFILE_VERSION);
        return -1;
    }
    return 0;
}

int hw_profile_load(hw_profile *h, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        err_set(err, errlen, "open %s: %s", path, strerror(errno));
        return -1;
    }
    const int rc = hw_profile_read(h, f, path, err, errlen);
    fclose(f);
    return rc;
}

int hw_profile_read(hw_profile *h, FILE *f, const char *path, char *err, size_t errlen) {
    hw_profile loaded = {0};
    profile_reader r = {.path = path};
    r.n_fields = profile_fields(&loaded, r.fields);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) > 0) rc = read_line(&r, ++lineno, line, (size_t)len, err, errlen);
    if (rc == 0 && ferror(f)) {
        err_set(err, errlen, "read %s: %s", path, strerror(errno));
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < r.n_fields; i++)
        if (!r.line_of[i]) {
            err_set(err, errlen, "%s: %s: missing%s", path, r.fields[i].key, lineno ? "" : " (empty file)");
            rc = -1;
        }
    free(line);
    if (rc == 0) *h = loaded;
    return rc;
}

int hw_profile_cache_path(const model *m, const char *model_path, char *out, size_t outlen, char *err,
                          size_t errlen) {
    struct stat st;
    if (stat(model_path, &st)) {
        err_set(err, errlen, "%s: %s", model_path, strerror(errno));
        return -1;
    }
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[PATH_MAX];
    if (xdg && xdg[0] == '/') snprintf(base, sizeof base, "%s/pi2", xdg); /* the XDG spec: relative paths ignored */
    else if (home && *home) snprintf(base, sizeof base, "%s/.cache/pi2", home);
    else {
        err_set(err, errlen, "no cache directory: neither XDG_CACHE_HOME nor HOME is set");
        return -1;
    }
    const int n = snprintf(out, outlen, "%s/hw-%llu-%s-%s-%d.txt", base, (unsigned long long)st.st_dev,
                           ggml_type_name(m->layers[0].gate.type), ggml_type_name(bundle_down_type(m)), m->n_embd);
    if (n < 0 || (size_t)n >= outlen) {
        err_set(err, errlen, "cache path under %s too long", base);
        return -1;
    }
    return 0;
}

/* Reads per second measured at size column s, linear in log(depth) between the depths measured. */
static double measured_iops_at_depth(const hw_profile *h, int s, int depth) {
    if (depth <= hw_io_depth[0]) return h->iops[s][0];
    for (int d = 1; d < HW_IO_DEPTHS; d++) {
        if (depth == hw_io_depth[d]) return h->iops[s][d];
        if (depth < hw_io_depth[d]) {
            const double t = log((double)depth / hw_io_depth[d - 1]) / log((double)hw_io_depth[d] / hw_io_depth[d - 1]);
            return h->iops[s][d - 1] + t * (h->iops[s][d] - h->iops[s][d - 1]);
        }
    }
    return h->iops[s][HW_IO_DEPTHS - 1];
}

/* A read can always be done as a larger one, so a size is credited with the best rate of the sizes from
 * it up: a smaller read measured slower than a larger one is the measurement's noise, and once chose
 * 16 KiB bundles on the 7B file for 8 KiB reads caught in a slow spell (10.4 MB read a token against 6.7). */
static double iops_at_depth(const hw_profile *h, int s, int depth) {
    double best = measured_iops_at_depth(h, s, depth);
    for (int larger = s + 1; larger < HW_IO_SIZES; larger++)
        best = fmax(best, measured_iops_at_depth(h, larger, depth));
    return best;
}

double hw_io_iops(const hw_profile *h, size_t bytes, int depth) {
    const size_t largest = (size_t)hw_io_size_kib[HW_IO_SIZES - 1] << 10;
    if (bytes >= largest) return iops_at_depth(h, HW_IO_SIZES - 1, depth) * (double)largest / (double)bytes;
    if (bytes <= (size_t)hw_io_size_kib[0] << 10) return iops_at_depth(h, 0, depth);
    int s = 1;
    while (bytes > (size_t)hw_io_size_kib[s] << 10) s++;
    if (bytes == (size_t)hw_io_size_kib[s] << 10) return iops_at_depth(h, s, depth);
    /* the time per read is about latency + bytes / bandwidth: linear in bytes */
    const double lo = (double)((size_t)hw_io_size_kib[s - 1] << 10), hi = (double)((size_t)hw_io_size_kib[s] << 10);
    const double t = ((double)bytes - lo) / (hi - lo);
    return 1 / ((1 - t) / iops_at_depth(h, s - 1, depth) + t / iops_at_depth(h, s, depth));
}

/* a per-read cost at size column s: the least measured from s up (as iops_at_depth, for the same reason) */
static double cost_at_size(const double *value, int s) {
    double least = value[s];
    for (int larger = s + 1; larger < HW_IO_SIZES; larger++) least = fmin(least, value[larger]);
    return least;
}

/* a per-read cost, value[s] at size column s (cost_at_size), linear in bytes between the sizes measured */
static double per_size(const double *value, size_t bytes) {
    const size_t smallest = (size_t)hw_io_size_kib[0] << 10, largest = (size_t)hw_io_size_kib[HW_IO_SIZES - 1] << 10;
    if (bytes <= smallest) return cost_at_size(value, 0);
    if (bytes >= largest) return value[HW_IO_SIZES - 1] * (double)bytes / (double)largest;
    int s = 1;
    while (bytes > (size_t)hw_io_size_kib[s] << 10) s++;
    const double lo = (double)((size_t)hw_io_size_kib[s - 1] << 10), hi = (double)((size_t)hw_io_size_kib[s] << 10);
    const double t = ((double)bytes - lo) / (hi - lo);
    return (1 - t) * cost_at_size(value, s - 1) + t * cost_at_size(value, s);
}

double hw_io_cpu_us(const hw_profile *h, size_t bytes, bool verify) {
    return per_size(verify ? h->checked_cpu_us : h->io_cpu_us, bytes);
}

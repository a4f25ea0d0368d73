/* Plan files (plan_file.h). */
#include "plan/plan_file.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/predictor.h" /* model_fingerprint */
#include "plan/bundle.h"     /* BUNDLE_ALIGN, BUNDLE_MAX_PER_BUNDLE */
#include "util/checksum.h"
#include "util/log.h"

#define MAGIC_BYTES 8
#define TRAILER_BYTES 8

#define MAX_QUEUE_DEPTH 4096
#define MAX_WORKERS 256

static int bad(char *err, size_t errlen, const char *path, const char *field, const char *why) {
    err_set(err, errlen, "%s: plan field '%s' %s", path, field, why);
    return -1;
}

static bool finite_nonneg(double v) { return isfinite(v) && v >= 0; }

/* a relative path inside the plan's directory: no '/'-rooted path, no "..", no empty name */
static bool plain_relative(const char *s) {
    if (!s || !*s || s[0] == '/') return false;
    for (const char *c = s; *c; c = strchr(c, '/') ? strchr(c, '/') + 1 : c + strlen(c))
        if (strncmp(c, "..", 2) == 0 && (c[2] == '/' || c[2] == '\0')) return false;
    return true;
}

/* The bundles lent between prompts: after each layer's hot ones, in the prefill's memory. */
static int check_lent(const Pi2__Plan *p, const char *path, long n_bundles, char *err, size_t errlen) {
    if (p->n_lent_bundles != 0 && p->n_lent_bundles != p->n_layer) {
        err_set(err, errlen, "%s: plan field 'lent_bundles' has %zu layers, the plan's n_layer is %u", path,
                p->n_lent_bundles, p->n_layer);
        return -1;
    }
    uint64_t lent = 0;
    for (size_t l = 0; l < p->n_lent_bundles; l++) {
        if (p->lent_bundles[l] > (uint64_t)n_bundles - p->hot_bundles[l]) {
            err_set(err, errlen, "%s: plan field 'lent_bundles' of layer %zu is %u, above the layer's %ld bundles "
                    "after its %u hot ones", path, l, p->lent_bundles[l], n_bundles - (long)p->hot_bundles[l],
                    p->hot_bundles[l]);
            return -1;
        }
        lent += p->lent_bundles[l];
    }
    if (lent * p->bundle_stride != p->lent_bytes)
        return bad(err, errlen, path, "lent_bytes", "is not the lent bundles times bundle_stride");
    if (p->lent_bytes > p->process_bytes + p->staging_bytes)
        return bad(err, errlen, path, "lent_bytes", "is more than the processes' memory and the staging");
    return 0;
}

static int check_memory(const Pi2__Plan *p, const char *path, char *err, size_t errlen) {
    const uint64_t parts[] = {p->preload_bytes, p->process_bytes, p->staging_bytes, p->hot_bytes, p->cold_bytes};
    uint64_t sum = 0;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        if (parts[i] > UINT64_MAX - sum) return bad(err, errlen, path, "budget_bytes", "is exceeded by its parts");
        sum += parts[i];
    }
    if (sum > p->budget_bytes) {
        err_set(err, errlen,
                "%s: plan parts (preload %llu, processes %llu, staging %llu, hot %llu, cold %llu bytes) exceed "
                "its budget_bytes %llu",
                path, (unsigned long long)p->preload_bytes, (unsigned long long)p->process_bytes,
                (unsigned long long)p->staging_bytes, (unsigned long long)p->hot_bytes,
                (unsigned long long)p->cold_bytes, (unsigned long long)p->budget_bytes);
        return -1;
    }
    if (p->floor_bytes == 0 || p->floor_bytes > p->budget_bytes)
        return bad(err, errlen, path, "floor_bytes", "is 0 or above budget_bytes");
    if (p->max_prefill > PLAN_MAX_PREFILL) return bad(err, errlen, path, "max_prefill", "is above 65536");
    const long n_bundles = plan_bundles_per_layer(p->n_ff, p->per_bundle);
    uint64_t hot = 0;
    for (size_t l = 0; l < p->n_hot_bundles; l++) {
        if (p->hot_bundles[l] > (uint64_t)n_bundles) {
            err_set(err, errlen, "%s: plan field 'hot_bundles' of layer %zu is %u, above the layer's %ld bundles",
                    path, l, p->hot_bundles[l], n_bundles);
            return -1;
        }
        hot += p->hot_bundles[l];
    }
    const uint64_t hot_bundle = plan_hot_bundle_bytes(p);
    if (hot_bundle > p->bundle_stride)
        return bad(err, errlen, path, "hot_bundle_bytes", "is more than bundle_stride");
    if (hot > UINT64_MAX / hot_bundle || hot * hot_bundle != p->hot_bytes)
        return bad(err, errlen, path, "hot_bytes", "is not the hot bundles times hot_bundle_bytes");
    if (hot_bundle < p->bundle_stride && hot && p->cold_slots == 0)
        return bad(err, errlen, path, "cold_slots",
                   "is 0 with packed hot bundles: their load is staged in the cold region");
    if ((uint64_t)p->cold_slots > UINT64_MAX / p->bundle_stride ||
        (uint64_t)p->cold_slots * p->bundle_stride != p->cold_bytes)
        return bad(err, errlen, path, "cold_bytes", "is not cold_slots times bundle_stride");
    return check_lent(p, path, n_bundles, err, errlen);
}

static int check_prediction(const Pi2__Plan *p, const char *path, char *err, size_t errlen) {
    const Pi2__PlanPrediction *q = p->prediction;
    if (!q) return bad(err, errlen, path, "prediction", "is missing");
    if (!finite_nonneg(q->tok_s) || !finite_nonneg(q->misses_per_token) || !finite_nonneg(q->compute_ms) ||
        !finite_nonneg(q->io_ms) || !finite_nonneg(q->exposed_io_ms) || !(q->hit_rate >= 0 && q->hit_rate <= 1))
        return bad(err, errlen, path, "prediction", "has a negative, non-finite or out-of-range figure");
    if (!finite_nonneg(p->target_tok_s)) return bad(err, errlen, path, "target_tok_s", "is negative or not finite");
    if (!finite_nonneg(p->resident_tok_s) || !finite_nonneg(p->dense_tok_s))
        return bad(err, errlen, path, "resident_tok_s", "or dense_tok_s is negative or not finite");
    uint64_t last = 0;
    for (size_t i = 0; i < p->n_curve; i++) {
        const Pi2__PlanCurvePoint *c = p->curve[i];
        if (!c || c->budget_bytes <= last || !finite_nonneg(c->tok_s) || !(c->hit_rate >= 0 && c->hit_rate <= 1)) {
            err_set(err, errlen, "%s: plan field 'curve' point %zu: budgets must rise and figures be in range", path,
                    i);
            return -1;
        }
        last = c->budget_bytes;
    }
    return 0;
}

int plan_validate(const Pi2__Plan *p, const char *path, char *err, size_t errlen) {
    if (p->version != PLAN_VERSION) {
        err_set(err, errlen, "%s: plan version %u, this build reads version %d: write the plan again with pi2 plan",
                path, p->version, PLAN_VERSION);
        return -1;
    }
    if (p->mode != PI2__PLAN_MODE__PLAN_MODE_PREDICTOR && p->mode != PI2__PLAN_MODE__PLAN_MODE_GATE_FIRST)
        return bad(err, errlen, path, "mode", "is not predictor or gate-first");
    if (p->n_layer < 1 || p->n_layer > 4096) return bad(err, errlen, path, "n_layer", "is not in 1..4096");
    if (p->n_ff < 1 || p->n_ff > (1u << 24)) return bad(err, errlen, path, "n_ff", "is not in 1..2^24");
    if (p->n_embd < 1 || p->n_embd > (1u << 20)) return bad(err, errlen, path, "n_embd", "is not in 1..2^20");
    if (p->ctx < 1 || p->ctx > (1u << 24)) return bad(err, errlen, path, "ctx", "is not in 1..2^24");
    if (p->per_bundle < 1 || p->per_bundle > BUNDLE_MAX_PER_BUNDLE)
        return bad(err, errlen, path, "per_bundle", "is not in 1..64");
    if (p->bundle_stride == 0 || p->bundle_stride % BUNDLE_ALIGN || p->bundle_stride > (64u << 20))
        return bad(err, errlen, path, "bundle_stride", "is not a multiple of 4096 up to 64 MiB");
    if (p->n_hot_bundles != p->n_layer) {
        err_set(err, errlen, "%s: plan field 'hot_bundles' has %zu layers, the plan's n_layer is %u", path,
                p->n_hot_bundles, p->n_layer);
        return -1;
    }
    if (p->queue_depth < 1 || p->queue_depth > MAX_QUEUE_DEPTH)
        return bad(err, errlen, path, "queue_depth", "is not in 1..4096");
    if (p->cpu_workers < 1 || p->cpu_workers > MAX_WORKERS)
        return bad(err, errlen, path, "cpu_workers", "is not in 1..256");
    if (p->threads_per_worker < 1 || p->threads_per_worker > 1024)
        return bad(err, errlen, path, "threads_per_worker", "is not in 1..1024");
    if (p->n_cluster_neurons != p->cpu_workers)
        return bad(err, errlen, path, "cluster_neurons", "does not have one entry per cpu-worker");
    for (size_t i = 0; i < p->n_cluster_neurons; i++)
        if (p->cluster_neurons[i] < 1 || p->cluster_neurons[i] > p->n_ff)
            return bad(err, errlen, path, "cluster_neurons", "has an entry outside 1..n_ff");
    if (!plain_relative(p->bundle_file))
        return bad(err, errlen, path, "bundle_file", "is not a relative path inside the plan's directory");
    if (p->model_profile[0] && !plain_relative(p->model_profile))
        return bad(err, errlen, path, "model_profile", "is not a relative path inside the plan's directory");
    if (!p->model_name[0]) return bad(err, errlen, path, "model_name", "is empty");
    return check_memory(p, path, err, errlen) || check_prediction(p, path, err, errlen) ? -1 : 0;
}

static int check_model(const Pi2__Plan *p, const char *path, const model *m, const char *model_path, char *err,
                       size_t errlen) {
    const uint64_t fp = model_fingerprint(m);
    if (p->model_size != (uint64_t)m->gguf.size || p->model_fingerprint != fp) {
        err_set(err, errlen,
                "%s was made for another model file (%s: size %llu, fingerprint %016llx), not %s (size %llu, "
                "fingerprint %016llx): make the plan again with pi2 plan",
                path, p->model_name, (unsigned long long)p->model_size, (unsigned long long)p->model_fingerprint,
                model_path, (unsigned long long)m->gguf.size, (unsigned long long)fp);
        return -1;
    }
    if (p->n_layer != (uint32_t)m->n_layer || p->n_ff != (uint32_t)m->n_ff || p->n_embd != (uint32_t)m->n_embd) {
        err_set(err, errlen, "%s: shape %ux%ux%u differs from %s's though the fingerprint matches", path, p->n_layer,
                p->n_ff, p->n_embd, model_path);
        return -1;
    }
    return 0;
}

int plan_check_bundle(const Pi2__Plan *p, const char *plan_path, const bundle_file *b, const char *bundle_path,
                      char *err, size_t errlen) {
    if (b->source_size != p->model_size || b->source_fingerprint != p->model_fingerprint ||
        b->n_layer != (int)p->n_layer || b->n_ff != (int)p->n_ff || b->n_embd != (int)p->n_embd ||
        b->per_bundle != (int)p->per_bundle || b->stride != p->bundle_stride) {
        err_set(err, errlen,
                "%s does not match the plan %s: bundles of %d neurons, %zu bytes, for a model of size %llu "
                "(fingerprint %016llx); the plan has %u neurons, %llu bytes, size %llu (fingerprint %016llx): make "
                "the plan and the bundle file again with pi2 plan",
                bundle_path, plan_path, b->per_bundle, b->stride, (unsigned long long)b->source_size,
                (unsigned long long)b->source_fingerprint, p->per_bundle, (unsigned long long)p->bundle_stride,
                (unsigned long long)p->model_size, (unsigned long long)p->model_fingerprint);
        return -1;
    }
    const uint64_t packed = (uint64_t)b->per_bundle * b->neuron_bytes;
    if (p->hot_bundle_bytes && p->hot_bundle_bytes != p->bundle_stride && p->hot_bundle_bytes != packed) {
        err_set(err, errlen,
                "%s: plan field 'hot_bundle_bytes' is %llu; with the bundles of %s it is 0, their stride %zu or "
                "their %d neurons' rows packed, %llu",
                plan_path, (unsigned long long)p->hot_bundle_bytes, bundle_path, b->stride, b->per_bundle,
                (unsigned long long)packed);
        return -1;
    }
    return 0;
}

Pi2__Plan *plan_load(const char *path, const model *m, const char *model_path, char *err, size_t errlen) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err_set(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size > (off_t)PLAN_MAX_FILE_BYTES) {
        err_set(err, errlen, "%s: not a plan file (empty, not a regular file, or over %u bytes)", path,
                PLAN_MAX_FILE_BYTES);
        close(fd);
        return NULL;
    }
    const size_t size = (size_t)st.st_size;
    uint8_t *buf = malloc(size);
    size_t got = 0;
    while (buf && got < size) {
        const ssize_t n = read(fd, buf + got, size - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    if (!buf || got != size) {
        err_set(err, errlen, "%s: %s", path, buf ? "short read" : "out of memory");
        free(buf);
        return NULL;
    }
    Pi2__Plan *p = plan_parse(buf, size, path, err, errlen);
    free(buf);
    if (p && m && check_model(p, path, m, model_path, err, errlen)) {
        plan_free(p);
        return NULL;
    }
    return p;
}

Pi2__Plan *plan_parse(const uint8_t *buf, size_t size, const char *path, char *err, size_t errlen) {
    if (size < MAGIC_BYTES + TRAILER_BYTES || memcmp(buf, PLAN_MAGIC, MAGIC_BYTES) != 0) {
        err_set(err, errlen, "%s: not a plan file (no %s header)", path, PLAN_MAGIC);
        return NULL;
    }
    const size_t body = size - MAGIC_BYTES - TRAILER_BYTES;
    uint64_t stored = 0;
    for (int i = 0; i < TRAILER_BYTES; i++) stored |= (uint64_t)buf[MAGIC_BYTES + body + (size_t)i] << (8 * i);
    if (checksum64(buf + MAGIC_BYTES, body) != stored) {
        err_set(err, errlen, "%s: the plan's checksum does not match its contents (truncated or corrupted): write "
                             "it again with pi2 plan", path);
        return NULL;
    }
    Pi2__Plan *p = pi2__plan__unpack(NULL, body, buf + MAGIC_BYTES);
    if (!p) {
        err_set(err, errlen, "%s: the plan message does not decode", path);
        return NULL;
    }
    if (plan_validate(p, path, err, errlen)) {
        plan_free(p);
        return NULL;
    }
    return p;
}

void plan_free(Pi2__Plan *p) {
    if (p) pi2__plan__free_unpacked(p, NULL);
}

int plan_save(const Pi2__Plan *p, const char *path, char *err, size_t errlen) {
    if (plan_validate(p, path, err, errlen)) return -1;
    const size_t body = pi2__plan__get_packed_size(p), size = MAGIC_BYTES + body + TRAILER_BYTES;
    uint8_t *buf = malloc(size);
    if (!buf) {
        err_set(err, errlen, "%s: out of memory", path);
        return -1;
    }
    memcpy(buf, PLAN_MAGIC, MAGIC_BYTES);
    pi2__plan__pack(p, buf + MAGIC_BYTES);
    const uint64_t sum = checksum64(buf + MAGIC_BYTES, body);
    for (int i = 0; i < TRAILER_BYTES; i++) buf[MAGIC_BYTES + body + (size_t)i] = (uint8_t)(sum >> (8 * i));
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(buf);
        err_set(err, errlen, "%s: path too long", path);
        return -1;
    }
    FILE *f = fopen(tmp, "wb");
    const bool ok = f && fwrite(buf, 1, size, f) == size;
    const bool closed = f && fclose(f) == 0;
    free(buf);
    if (!ok || !closed || rename(tmp, path)) {
        err_set(err, errlen, "%s: %s", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

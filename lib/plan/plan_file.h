/* The plan file: one protobuf Plan message (proto/plan.proto) that pi2 plan
 * writes and the stack reads, framed as the magic "PI2PLAN1", the message,
 * and the checksum64 of the message (8 bytes, little-endian), so a corrupted
 * file is refused rather than read as another valid plan (protobuf decodes
 * most flipped bytes into other values). Loading validates every field, alone and
 * against the others (the parts fit in the budget, one hot count per layer,
 * each within the layer's bundles, ...), and with a model, that the plan was
 * made for that model's file; the errors name the file and the field.
 *
 * Errors: plan_load and plan_parse return NULL, the other functions that take
 * err -1, with a message in err (errlen bytes). */
#ifndef PI2_PLAN_FILE_H
#define PI2_PLAN_FILE_H

#include <stddef.h>

#include "engine/model.h"
#include "plan.pb-c.h"
#include "plan/bundle.h"

#define PLAN_VERSION 1
#define PLAN_MAGIC "PI2PLAN1"
#define PLAN_MAX_FILE_BYTES (16u << 20) /* a plan is a few KiB; refuse anything absurd before reading it */
#define PLAN_MAX_PREFILL 65536          /* max_prefill at most (the stack config's max-prefill range) */

/* Reads and validates path; with m (may be NULL) also that it was made for
 * m's file (model_path names it in messages). The plan is freed with
 * plan_free. NULL with err set. */
Pi2__Plan *plan_load(const char *path, const model *m, const char *model_path, char *err, size_t errlen);
void plan_free(Pi2__Plan *p);
/* The same checks on a file's bytes in memory (path names them), without a model. */
Pi2__Plan *plan_parse(const uint8_t *buf, size_t size, const char *path, char *err, size_t errlen);

/* The checks plan_load makes on a message (path names it in messages). 0, or -1 with err set. */
int plan_validate(const Pi2__Plan *p, const char *path, char *err, size_t errlen);

/* Validates p, then writes it through path.tmp, renamed at the end. 0, or -1 with err set. */
int plan_save(const Pi2__Plan *p, const char *path, char *err, size_t errlen);

/* The bundle file the plan names is the one it was made with: the same
 * model file (size, fingerprint), shape, neurons per bundle and stride, and
 * hot_bundle_bytes is one its bundles allow. The error names both files. 0,
 * or -1 with err set. */
int plan_check_bundle(const Pi2__Plan *p, const char *plan_path, const bundle_file *b, const char *bundle_path,
                      char *err, size_t errlen);

/* Bytes a hot bundle takes in memory: packed (the per_bundle neurons' rows without the file's padding to
 * a 4096-byte stride) or, when the plan says 0, bundle_stride. */
static inline uint64_t plan_hot_bundle_bytes(const Pi2__Plan *p) {
    return p->hot_bundle_bytes ? p->hot_bundle_bytes : p->bundle_stride;
}

/* Bundles of a layer of n_ff neurons at per_bundle neurons each. */
static inline long plan_bundles_per_layer(long n_ff, long per_bundle) { return (n_ff + per_bundle - 1) / per_bundle; }

/* Reads the io-worker keeps in flight: the plan's queue depth for each cpu-worker, so that every worker's
 * batch of a layer is read at once (io-worker/offload.c); at most PLAN_MAX_READS_IN_FLIGHT. */
#define PLAN_MAX_READS_IN_FLIGHT 4096
static inline unsigned plan_reads_in_flight(unsigned queue_depth, unsigned cpu_workers) {
    const unsigned long long n = (unsigned long long)queue_depth * (cpu_workers ? cpu_workers : 1);
    return n < PLAN_MAX_READS_IN_FLIGHT ? (unsigned)n : PLAN_MAX_READS_IN_FLIGHT;
}

#endif

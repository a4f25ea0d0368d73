/* Envelope packing, unpacking and validation; see msg.h. */
#include "stack/msg.h"
#include "stack/stack.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- pack / unpack ---------------------------------------------------------------------- */

void msg_envelope_init(Pi2__Envelope *env, uint64_t seq, uint64_t session) {
    pi2__envelope__init(env);
    env->version = PI2_PROTO_VERSION;
    env->seq = seq;
    env->session = session;
}

void msg_error_init(Pi2__Envelope *env, Pi2__Error *e, uint64_t seq, uint64_t session, Pi2__ErrorCode code,
                    const char *text, uint64_t ref_seq) {
    pi2__error__init(e);
    e->code = code;
    e->message = (char *)text;
    e->ref_seq = ref_seq;
    msg_envelope_init(env, seq, session);
    env->body_case = PI2__ENVELOPE__BODY_ERROR;
    env->error = e;
}

/* The body pointer of the oneof member that is set; NULL if none. All members share the union. */
static const void *body_ptr(const Pi2__Envelope *env) {
    return env->body_case == PI2__ENVELOPE__BODY__NOT_SET ? NULL : (const void *)env->register_;
}

static size_t packable_size(const Pi2__Envelope *env) {
    if (!body_ptr(env)) return 0;
    size_t n = protobuf_c_message_get_packed_size(&env->base);
    return n <= MSG_MAX_FRAME ? n : 0;
}

int msg_pack(const Pi2__Envelope *env, uint8_t *buf, size_t cap, size_t *len) {
    size_t n = packable_size(env);
    if (n == 0 || n > cap) return -1;
    *len = protobuf_c_message_pack(&env->base, buf);
    return 0;
}

uint8_t *msg_pack_alloc(const Pi2__Envelope *env, size_t *len) {
    size_t n = packable_size(env);
    uint8_t *buf = n ? malloc(n) : NULL;
    if (buf) *len = protobuf_c_message_pack(&env->base, buf);
    return buf;
}

Pi2__Envelope *msg_unpack(const uint8_t *buf, size_t len, char *err, size_t errlen) {
    if (len > MSG_MAX_FRAME) {
        snprintf(err, errlen, "frame of %zu bytes exceeds %u", len, MSG_MAX_FRAME);
        return NULL;
    }
    if (!buf && len) {
        snprintf(err, errlen, "no buffer");
        return NULL;
    }
    Pi2__Envelope *env = pi2__envelope__unpack(NULL, len, buf);
    if (!env) {
        snprintf(err, errlen, "malformed Envelope (%zu bytes do not decode)", len);
        return NULL;
    }
    if (env->version != PI2_PROTO_VERSION) {
        snprintf(err, errlen, "Envelope.version = %" PRIu32 ", expected %u", env->version,
                 PI2_PROTO_VERSION);
    } else if (!body_ptr(env)) {
        snprintf(err, errlen, "Envelope has no body");
    } else {
        return env;
    }
    msg_free(env);
    return NULL;
}

void msg_free(Pi2__Envelope *env) {
    if (env) pi2__envelope__free_unpacked(env, NULL);
}

const char *msg_body_name(Pi2__Envelope__BodyCase body) {
    if (body == PI2__ENVELOPE__BODY__NOT_SET) return "none";
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(&pi2__envelope__descriptor, (unsigned)body);
    if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE) return "unknown";
    return ((const ProtobufCMessageDescriptor *)f->descriptor)->short_name;
}

Pi2__OffloadStats *msg_offload_stats(Pi2__OffloadStats *out, const offload_tally *t) {
    pi2__offload_stats__init(out);
    out->tokens = t->tokens, out->layers = t->layers;
    out->hot = t->hot, out->cold_hits = t->cold_hits, out->misses = t->misses, out->read_ahead = t->read_ahead;
    out->bytes_read = t->bytes_read, out->wait_us = t->wait_us, out->ffn_us = t->ffn_us;
    return out;
}

offload_tally msg_offload_tally(const Pi2__OffloadStats *s) {
    return (offload_tally){.tokens = s->tokens, .layers = s->layers, .hot = s->hot, .cold_hits = s->cold_hits,
                           .misses = s->misses, .read_ahead = s->read_ahead, .bytes_read = s->bytes_read,
                           .wait_us = s->wait_us, .ffn_us = s->ffn_us};
}

uint64_t msg_cluster_neurons(const Pi2__NeuronCluster *c) {
    if (c->n_ranges % 2) return UINT64_MAX;
    uint64_t n = c->n_neuron_ids;
    for (size_t i = 1; i < c->n_ranges; i += 2) n += c->ranges[i];
    return n;
}

/* ---- validation helpers: each returns 0, or -1 after writing the reason ------------------- */

typedef struct {
    const msg_limits *lim;
    char *err;
    size_t errlen;
} vctx;

__attribute__((format(printf, 2, 3))) static int fail(const vctx *v, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->err, v->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* value < limit, for an index into something of `limit` elements. */
static int check_index(const vctx *v, const char *path, const char *field, uint64_t value,
                       const char *limit_name, uint64_t limit) {
    if (value < limit) return 0;
    return fail(v, "%s.%s = %" PRIu64 " >= %s %" PRIu64, path, field, value, limit_name, limit);
}

/* [offset, offset + length) inside a region of `size` bytes, without overflowing. */
static int check_span(const vctx *v, const char *path, const char *field, uint64_t offset,
                      uint64_t length, const char *size_name, uint64_t size) {
    if (length <= size && offset <= size - length) return 0;
    return fail(v, "%s.%s = [%" PRIu64 ", +%" PRIu64 ") exceeds %s %" PRIu64, path, field, offset,
                length, size_name, size);
}

/* Activations are float arrays: a non-empty, float-aligned span of the activation segment. */
static int check_act_span(const vctx *v, const char *path, const char *field, uint64_t offset,
                          uint64_t length) {
    if (length == 0 || offset % sizeof(float) || length % sizeof(float))
        return fail(v, "%s.%s = [%" PRIu64 ", +%" PRIu64 ") is empty or not float-aligned", path,
                    field, offset, length);
    return check_span(v, path, field, offset, length, "act_segment_size",
                      v->lim->act_segment_size);
}

/* begin <= end <= limit for a half-open range [begin, end). */
static int check_range(const vctx *v, const char *path, const char *field, uint64_t begin,
                       uint64_t end, const char *limit_name, uint64_t limit) {
    if (begin <= end && end <= limit) return 0;
    return fail(v, "%s.%s = [%" PRIu64 ", %" PRIu64 ") is not within [0, %s %" PRIu64 ")", path,
                field, begin, end, limit_name, limit);
}

static int check_nonzero(const vctx *v, const char *path, const char *field, uint64_t value) {
    return value ? 0 : fail(v, "%s.%s must not be 0", path, field);
}

static int check_count(const vctx *v, const char *path, const char *field, size_t n, uint64_t max) {
    if (n <= max) return 0;
    return fail(v, "%s.%s has %zu entries, more than %" PRIu64, path, field, n, max);
}

static int check_string(const vctx *v, const char *path, const char *field, const char *s,
                        size_t max, int required) {
    size_t n = s ? strnlen(s, max + 1) : 0;
    if (n > max) return fail(v, "%s.%s is longer than %zu bytes", path, field, max);
    if (required && n == 0) return fail(v, "%s.%s is empty", path, field);
    return 0;
}

/* A known, non-UNSPECIFIED value of the enum. */
static int check_enum(const vctx *v, const char *path, const char *field, int value,
                      const ProtobufCEnumDescriptor *desc) {
    if (value != 0 && protobuf_c_enum_descriptor_get_value(desc, value)) return 0;
    return fail(v, "%s.%s = %d is not a valid %s", path, field, value, desc->short_name);
}

static int check_session(const vctx *v, const Pi2__Envelope *env, const char *path) {
    return env->session ? 0 : fail(v, "%s needs a session but Envelope.session = 0", path);
}

/* ---- neuron clusters -------------------------------------------------------------------- */

enum slot_rule { SLOTS_NONE, SLOTS_OPTIONAL, SLOTS_REQUIRED };

static int check_neuron_ids(const vctx *v, const char *path, const Pi2__NeuronCluster *c) {
    uint32_t n_ff = v->lim->n_ff;
    if (check_count(v, path, "neuron_ids", c->n_neuron_ids, n_ff)) return -1;
    for (size_t i = 0; i < c->n_neuron_ids; i++)
        if (c->neuron_ids[i] >= n_ff)
            return fail(v, "%s.neuron_ids[%zu] = %" PRIu32 " >= n_ff %" PRIu32, path, i,
                        c->neuron_ids[i], n_ff);
    return 0;
}

static int check_ranges(const vctx *v, const char *path, const Pi2__NeuronCluster *c) {
    uint32_t n_ff = v->lim->n_ff;
    if (c->n_ranges % 2)
        return fail(v, "%s.ranges has %zu values, not (begin, count) pairs", path, c->n_ranges);
    if (check_count(v, path, "ranges", c->n_ranges / 2, n_ff)) return -1;
    uint64_t total = 0;
    for (size_t i = 0; i < c->n_ranges; i += 2) {
        uint64_t begin = c->ranges[i], count = c->ranges[i + 1];
        if (count == 0) return fail(v, "%s.ranges[%zu] has count 0", path, i / 2);
        if (begin + count > n_ff)
            return fail(v, "%s.ranges[%zu] = (%" PRIu64 ", %" PRIu64 ") ends past n_ff %" PRIu32,
                        path, i / 2, begin, count, n_ff);
        total += count;
    }
    if (total > n_ff)
        return fail(v, "%s.ranges name %" PRIu64 " neurons, more than n_ff %" PRIu32, path, total,
                    n_ff);
    return 0;
}

static int check_slots(const vctx *v, const char *path, const Pi2__NeuronCluster *c,
                       enum slot_rule rule) {
    uint64_t neurons = msg_cluster_neurons(c);
    if (rule == SLOTS_NONE && c->n_slot_offsets)
        return fail(v, "%s.slot_offsets must be empty here", path);
    if ((rule == SLOTS_REQUIRED || c->n_slot_offsets) && c->n_slot_offsets != neurons)
        return fail(v, "%s.slot_offsets has %zu entries for %" PRIu64 " neurons", path,
                    c->n_slot_offsets, neurons);
    uint64_t size = v->lim->weight_segment_size, slot = v->lim->slot_size;
    for (size_t i = 0; i < c->n_slot_offsets; i++) {
        uint64_t off = c->slot_offsets[i];
        if (off >= size || slot > size || off > size - slot)
            return fail(v, "%s.slot_offsets[%zu] = %" PRIu64 " + slot_size %" PRIu64
                        " exceeds weight_segment_size %" PRIu64, path, i, off, slot, size);
    }
    return 0;
}

/* One cluster; expect_layer < 0 accepts any valid layer. Adds its neuron count to *total. */
static int check_cluster(const vctx *v, const char *path, const Pi2__NeuronCluster *c,
                         int64_t expect_layer, enum slot_rule rule, uint64_t *total) {
    if (check_index(v, path, "layer", c->layer, "n_layer", v->lim->n_layer)) return -1;
    if (expect_layer >= 0 && c->layer != expect_layer)
        return fail(v, "%s.layer = %" PRIu32 " differs from the task's layer %" PRId64, path,
                    c->layer, expect_layer);
    if (c->n_neuron_ids && c->n_ranges)
        return fail(v, "%s has both neuron_ids and ranges", path);
    if (!c->n_neuron_ids && !c->n_ranges) return fail(v, "%s names no neuron", path);
    if (check_neuron_ids(v, path, c) || check_ranges(v, path, c) || check_slots(v, path, c, rule))
        return -1;
    *total += msg_cluster_neurons(c);
    return 0;
}

/* A list of clusters naming at most max_neurons neurons in total. */
static int check_clusters(const vctx *v, const char *path, const char *field,
                          Pi2__NeuronCluster *const *cs, size_t n, int64_t expect_layer,
                          enum slot_rule rule, uint64_t max_neurons) {
    if (check_count(v, path, field, n, max_neurons)) return -1;
    uint64_t total = 0;
    char sub[96];
    for (size_t i = 0; i < n; i++) {
        snprintf(sub, sizeof sub, "%s.%s[%zu]", path, field, i);
        if (check_cluster(v, sub, cs[i], expect_layer, rule, &total)) return -1;
    }
    if (total > max_neurons)
        return fail(v, "%s.%s name %" PRIu64 " neurons, more than %" PRIu64, path, field, total,
                    max_neurons);
    return 0;
}

/* ---- per message type ------------------------------------------------------------------- */

static int check_cpu_list(const vctx *v, const char *s) {
    if (check_string(v, "Register", "cpu_list", s, MSG_MAX_NAME, 0)) return -1;
    for (const char *p = s; p && *p; p++)
        if (!strchr("0123456789,-", *p))
            return fail(v, "Register.cpu_list has character 0x%02x outside [0-9,-]",
                        (unsigned char)*p);
    return 0;
}

static int v_register(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__Register *m = env->register_;
    if (check_enum(v, "Register", "kind", m->kind, &pi2__process_kind__descriptor) ||
        check_nonzero(v, "Register", "pid", m->pid) || check_cpu_list(v, m->cpu_list))
        return -1;
    if (m->threads == 0 || m->threads > MSG_MAX_THREADS)
        return fail(v, "Register.threads = %" PRIu32 " is not in [1, %u]", m->threads,
                    MSG_MAX_THREADS);
    return 0;
}

static int v_register_ack(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__RegisterAck *m = env->register_ack;
    if (check_nonzero(v, "RegisterAck", "worker_id", m->worker_id) ||
        check_count(v, "RegisterAck", "segments", m->n_segments, MSG_MAX_SEGMENTS))
        return -1;
    char path[64];
    for (size_t i = 0; i < m->n_segments; i++) {
        const Pi2__Segment *s = m->segments[i];
        snprintf(path, sizeof path, "RegisterAck.segments[%zu]", i);
        if (check_string(v, path, "name", s->name, MSG_MAX_NAME, 1) ||
            check_nonzero(v, path, "size", s->size))
            return -1;
        /* POSIX shm names: one leading slash and no other. */
        if (s->name[0] != '/' || !s->name[1] || strchr(s->name + 1, '/'))
            return fail(v, "%s.name = \"%s\" is not a shm name \"/name\"", path, s->name);
    }
    return 0;
}

static int v_heartbeat(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__Heartbeat *m = env->heartbeat;
    return check_nonzero(v, "Heartbeat", "worker_id", m->worker_id) ||
                   check_enum(v, "Heartbeat", "state", m->state, &pi2__worker_state__descriptor)
               ? -1
               : 0;
}

static int v_shutdown(const vctx *v, const Pi2__Envelope *env) {
    return check_string(v, "Shutdown", "reason", env->shutdown->reason, MSG_MAX_STRING, 0);
}

/* Optional sampling parameters: the floats must be finite (NaN would poison every comparison). */
static int check_sampling(const vctx *v, const char *path, const Pi2__SamplingParams *s) {
    if (s && !isfinite(s->temperature))
        return fail(v, "%s.sampling.temperature = %g is not finite", path, s->temperature);
    if (s && !isfinite(s->top_p))
        return fail(v, "%s.sampling.top_p = %g is not finite", path, s->top_p);
    return 0;
}

static int v_session_start(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__SessionStart *m = env->session_start;
    if (check_session(v, env, "SessionStart") ||
        check_string(v, "SessionStart", "model_path", m->model_path, MSG_MAX_STRING, 1))
        return -1;
    if (m->n_ctx == 0 || m->n_ctx > v->lim->n_ctx)
        return fail(v, "SessionStart.n_ctx = %" PRIu32 " is not in [1, n_ctx %" PRIu32 "]",
                    m->n_ctx, v->lim->n_ctx);
    return check_sampling(v, "SessionStart", m->sampling);
}

static int v_session_stop(const vctx *v, const Pi2__Envelope *env) {
    return check_session(v, env, "SessionStop") ||
                   check_string(v, "SessionStop", "reason", env->session_stop->reason,
                                MSG_MAX_STRING, 0)
               ? -1
               : 0;
}

static int v_error(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__Error *m = env->error;
    return check_enum(v, "Error", "code", m->code, &pi2__error_code__descriptor) ||
                   check_string(v, "Error", "message", m->message, MSG_MAX_STRING, 0)
               ? -1
               : 0;
}

static int v_prefill_request(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__PrefillRequest *m = env->prefill_request;
    const msg_limits *lim = v->lim;
    const char *p = "PrefillRequest";
    if (check_session(v, env, p) || check_nonzero(v, p, "epoch", m->epoch) ||
        check_nonzero(v, p, "n_tokens", m->n_tokens) ||
        check_range(v, p, "positions", m->first_position,
                    (uint64_t)m->first_position + m->n_tokens, "n_ctx", lim->n_ctx) ||
        check_act_span(v, p, "act_offset/act_length", m->act_offset, m->act_length))
        return -1;
    if (m->layer_begin >= m->layer_end || m->layer_end > lim->n_layer)
        return fail(v, "%s.layers = [%" PRIu32 ", %" PRIu32 ") is empty or exceeds n_layer %" PRIu32,
                    p, m->layer_begin, m->layer_end, lim->n_layer);
    /* The ids travel in the activation segment; the span names exactly them (int32 each). */
    if (m->act_length != (uint64_t)m->n_tokens * sizeof(int32_t))
        return fail(v, "%s.act_length = %" PRIu64 " is not 4 * n_tokens %" PRIu32, p,
                    m->act_length, m->n_tokens);
    if (m->n_token_ids)
        return fail(v, "%s.token_ids has %zu entries, expected 0 (ids are in act.tokens)", p,
                    m->n_token_ids);
    return 0;
}

static int v_prefill_done(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__PrefillDone *m = env->prefill_done;
    return check_session(v, env, "PrefillDone") ||
                   check_range(v, "PrefillDone", "layer_end", 0, m->layer_end, "n_layer",
                               v->lim->n_layer)
               ? -1
               : 0;
}

static int v_prefill_progress(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__PrefillProgress *m = env->prefill_progress;
    const char *p = "PrefillProgress";
    return check_session(v, env, p) || check_nonzero(v, p, "request_seq", m->request_seq) ||
                   check_range(v, p, "layers_done", 0, m->layers_done, "n_layer", v->lim->n_layer)
               ? -1
               : 0;
}

/* Layer n_layer of a DecodeTask or TaskDone is the output task (final norm + output rows). */
static int check_task_layer(const vctx *v, const char *path, uint32_t layer) {
    if (layer <= v->lim->n_layer) return 0;
    return fail(v, "%s.layer = %" PRIu32 " > n_layer %" PRIu32, path, layer, v->lim->n_layer);
}

static int v_decode_task(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__DecodeTask *m = env->decode_task;
    const msg_limits *lim = v->lim;
    const char *p = "DecodeTask";
    if (check_session(v, env, p) || check_nonzero(v, p, "epoch", m->epoch) ||
        check_task_layer(v, p, m->layer) ||
        check_index(v, p, "position", m->position, "n_ctx", lim->n_ctx) ||
        check_act_span(v, p, "in_offset/in_length", m->in_offset, m->in_length) ||
        check_act_span(v, p, "out_offset/out_length", m->out_offset, m->out_length) ||
        check_range(v, p, "kv", m->kv_begin, m->kv_end, "position + 1",
                    (uint64_t)m->position + 1) ||
        check_range(v, p, "heads", m->head_begin, m->head_end, "n_head", lim->n_head) ||
        check_range(v, p, "share", m->share_begin, m->share_end, "the whole", WORK_SHARE_ONE))
        return -1;
    if (m->share_begin == m->share_end && m->share_end)
        return fail(v, "%s.share = [%" PRIu32 ", %" PRIu32 ") is empty (0, 0: the even split)", p, m->share_begin,
                    m->share_end);
    if (m->layer == lim->n_layer) {
        if (m->head_begin != m->head_end || m->n_clusters || m->ffn_mode)
            return fail(v, "%s.layer = n_layer (the output task) has heads, clusters or an ffn_mode", p);
        return 0;
    }
    if (m->ffn_mode < PI2__FFN_MODE__FFN_MODE_DENSE || m->ffn_mode > PI2__FFN_MODE__FFN_MODE_PREDICTOR)
        return fail(v, "%s.ffn_mode = %d is not a mode", p, (int)m->ffn_mode);
    return check_clusters(v, p, "clusters", m->clusters, m->n_clusters, m->layer, SLOTS_OPTIONAL,
                          lim->n_ff);
}

static int v_task_done(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__TaskDone *m = env->task_done;
    const char *p = "TaskDone";
    return check_session(v, env, p) || check_nonzero(v, p, "worker_id", m->worker_id) ||
                   check_task_layer(v, p, m->layer) ||
                   check_act_span(v, p, "out_offset/out_length", m->out_offset, m->out_length) ||
                   check_enum(v, p, "status", m->status, &pi2__task_status__descriptor) ||
                   check_string(v, p, "error", m->error, MSG_MAX_STRING, 0)
               ? -1
               : 0;
}

/* Cache messages may span layers (prefetch): at most every neuron of the model. */
static uint64_t model_neurons(const msg_limits *lim) { return (uint64_t)lim->n_layer * lim->n_ff; }

static int v_cache_acquire(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__CacheAcquire *m = env->cache_acquire;
    return check_clusters(v, "CacheAcquire", "clusters", m->clusters, m->n_clusters, -1,
                          SLOTS_NONE, model_neurons(v->lim));
}

static int v_cache_acquire_reply(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__CacheAcquireReply *m = env->cache_acquire_reply;
    const char *p = "CacheAcquireReply";
    return check_clusters(v, p, "hits", m->hits, m->n_hits, -1, SLOTS_REQUIRED,
                          model_neurons(v->lim)) ||
                   check_clusters(v, p, "misses", m->misses, m->n_misses, -1, SLOTS_OPTIONAL,
                                  model_neurons(v->lim))
               ? -1
               : 0;
}

static int v_cache_release(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__CacheRelease *m = env->cache_release;
    return check_clusters(v, "CacheRelease", "clusters", m->clusters, m->n_clusters, -1,
                          SLOTS_OPTIONAL, model_neurons(v->lim));
}

static int v_cache_miss(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__CacheMiss *m = env->cache_miss;
    return check_clusters(v, "CacheMiss", "clusters", m->clusters, m->n_clusters, -1, SLOTS_NONE,
                          model_neurons(v->lim));
}

static int v_io_read_batch(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__IoReadBatch *m = env->io_read_batch;
    if (check_count(v, "IoReadBatch", "reads", m->n_reads, MSG_MAX_IO_READS)) return -1;
    if (m->n_reads == 0) return fail(v, "IoReadBatch.reads is empty");
    const bool hot = m->target == PI2__IO_TARGET__IO_TARGET_HOT;
    const bool staging = m->target == PI2__IO_TARGET__IO_TARGET_STAGING;
    if (!hot && !staging && m->target != PI2__IO_TARGET__IO_TARGET_WEIGHTS)
        return fail(v, "IoReadBatch.target = %d is not a valid IoTarget", (int)m->target);
    const uint64_t file_size = hot || staging ? v->lim->bundle_file_size : v->lim->model_file_size;
    const uint64_t dest_size = hot       ? v->lim->hot_region_size
                               : staging ? v->lim->cold_region_size
                                         : v->lim->weight_segment_size;
    const char *file_name = hot || staging ? "bundle_file_size" : "model_file_size";
    const char *dest_name = hot ? "hot_region_size" : staging ? "cold_region_size" : "weight_segment_size";
    char path[64];
    for (size_t i = 0; i < m->n_reads; i++) {
        const Pi2__IoRead *r = m->reads[i];
        snprintf(path, sizeof path, "IoReadBatch.reads[%zu]", i);
        if (check_nonzero(v, path, "length", r->length) ||
            check_span(v, path, "file_offset", r->file_offset, r->length, file_name, file_size) ||
            check_span(v, path, "slot_offset", r->slot_offset, r->length, dest_name, dest_size))
            return -1;
    }
    return 0;
}

static int v_bundle_load(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__BundleLoad *m = env->bundle_load;
    const char *p = "BundleLoad";
    if (check_index(v, p, "layer", m->layer, "n_layer", v->lim->n_layer) ||
        check_count(v, p, "bundles", m->n_bundles, v->lim->n_bundles))
        return -1;
    if (m->n_bundles == 0) return fail(v, "BundleLoad.bundles is empty");
    char path[64];
    for (size_t i = 0; i < m->n_bundles; i++) {
        snprintf(path, sizeof path, "BundleLoad.bundles[%zu]", i);
        if (check_index(v, path, "bundle", m->bundles[i], "n_bundles", v->lim->n_bundles)) return -1;
    }
    return 0;
}

static int v_bundle_loaded(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__BundleLoaded *m = env->bundle_loaded;
    if (m->loaded > v->lim->n_bundles || m->unplaced > v->lim->n_bundles)
        return fail(v, "BundleLoaded.loaded/unplaced = %u/%u exceed n_bundles %u", m->loaded, m->unplaced,
                    v->lim->n_bundles);
    return check_string(v, "BundleLoaded", "error", m->error, MSG_MAX_STRING, 0);
}

static int v_io_complete(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__IoComplete *m = env->io_complete;
    if (check_count(v, "IoComplete", "results", m->n_results, MSG_MAX_IO_READS)) return -1;
    for (size_t i = 0; i < m->n_results; i++)
        if (m->results[i] < -4095) /* the kernel's errno range */
            return fail(v, "IoComplete.results[%zu] = %" PRId32 " is not a byte count or -errno",
                        i, m->results[i]);
    return 0;
}

static int v_stats(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__Stats *m = env->stats;
    if (check_count(v, "Stats", "stats", m->n_stats, MSG_MAX_STATS)) return -1;
    char path[64];
    for (size_t i = 0; i < m->n_stats; i++) {
        snprintf(path, sizeof path, "Stats.stats[%zu]", i);
        if (check_string(v, path, "name", m->stats[i]->name, MSG_MAX_NAME, 1)) return -1;
    }
    return 0;
}

static int v_nothing(const vctx *v, const Pi2__Envelope *env) {
    (void)v, (void)env;
    return 0;
}

/* ---- clients ---------------------------------------------------------------------------- */

static int v_generate_request(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__GenerateRequest *m = env->generate_request;
    const char *p = "GenerateRequest";
    if (m->prompt.len > MSG_MAX_PROMPT)
        return fail(v, "%s.prompt has %zu bytes, more than %u", p, m->prompt.len, MSG_MAX_PROMPT);
    /* The tokenizer takes a C string: an embedded NUL would silently cut the prompt. */
    if (m->prompt.len && memchr(m->prompt.data, 0, m->prompt.len))
        return fail(v, "%s.prompt contains a NUL byte", p);
    if (m->n_predict > MSG_MAX_PREDICT)
        return fail(v, "%s.n_predict = %" PRIu32 " > %u", p, m->n_predict, MSG_MAX_PREDICT);
    if ((int)m->ffn_mode < 0 || m->ffn_mode > PI2__FFN_MODE__FFN_MODE_PREDICTOR)
        return fail(v, "%s.ffn_mode = %d is not a mode", p, (int)m->ffn_mode);
    if (m->max_wait_ms > MSG_MAX_WAIT_MS)
        return fail(v, "%s.max_wait_ms = %" PRIu32 " > %u", p, m->max_wait_ms, MSG_MAX_WAIT_MS);
    return check_sampling(v, p, m->sampling);
}

static int v_token_piece(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__TokenPiece *m = env->token_piece;
    const char *p = "TokenPiece";
    if (check_session(v, env, p) || check_index(v, p, "token", m->token, "n_vocab", v->lim->n_vocab))
        return -1;
    if (m->piece.len > MSG_MAX_PIECE)
        return fail(v, "%s.piece has %zu bytes, more than %u", p, m->piece.len, MSG_MAX_PIECE);
    return 0;
}

static int check_ms(const vctx *v, const char *path, const char *field, double ms) {
    if (isfinite(ms) && ms >= 0) return 0;
    return fail(v, "%s.%s = %g is not a finite duration >= 0", path, field, ms);
}

/* The counts of one tally: what offload_tally_delta guarantees (bytes_read may be anything). */
static int check_offload(const vctx *v, const Pi2__OffloadStats *o) {
    const char *p = "GenerateDone.offload";
    if (o->tokens > o->layers)
        return fail(v, "%s.tokens = %" PRIu64 " > layers %" PRIu64, p, o->tokens, o->layers);
    if (o->wait_us > o->ffn_us)
        return fail(v, "%s.wait_us = %" PRIu64 " > ffn_us %" PRIu64, p, o->wait_us, o->ffn_us);
    if (o->cold_hits > UINT64_MAX - o->hot || o->misses > UINT64_MAX - o->hot - o->cold_hits)
        return fail(v, "%s: hot + cold_hits + misses overflows", p);
    if (o->read_ahead > o->misses)
        return fail(v, "%s.read_ahead = %" PRIu64 " > misses %" PRIu64, p, o->read_ahead, o->misses);
    return 0;
}

static int v_generate_done(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__GenerateDone *m = env->generate_done;
    const char *p = "GenerateDone";
    if (check_session(v, env, p) || check_ms(v, p, "prompt_ms", m->prompt_ms) ||
        check_ms(v, p, "decode_ms", m->decode_ms) ||
        check_enum(v, p, "status", m->status, &pi2__generate_status__descriptor) ||
        (m->offload && check_offload(v, m->offload)))
        return -1;
    if (m->n_prompt > v->lim->n_ctx)
        return fail(v, "%s.n_prompt = %" PRIu32 " > n_ctx %" PRIu32, p, m->n_prompt, v->lim->n_ctx);
    return 0;
}

static int v_prompt_progress(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__PromptProgress *m = env->prompt_progress;
    const char *p = "PromptProgress";
    if (check_session(v, env, p) || check_ms(v, p, "elapsed_ms", m->elapsed_ms)) return -1;
    if (m->n_prompt > v->lim->n_ctx)
        return fail(v, "%s.n_prompt = %" PRIu32 " > n_ctx %" PRIu32, p, m->n_prompt, v->lim->n_ctx);
    if (m->n_done > m->n_prompt)
        return fail(v, "%s.n_done = %" PRIu32 " > n_prompt %" PRIu32, p, m->n_done, m->n_prompt);
    return 0;
}

static int v_generate_queued(const vctx *v, const Pi2__Envelope *env) {
    const Pi2__GenerateQueued *m = env->generate_queued;
    const char *p = "GenerateQueued";
    if (check_ms(v, p, "waited_ms", m->waited_ms)) return -1;
    if (m->ahead < 1 || m->ahead > MSG_MAX_AHEAD)
        return fail(v, "%s.ahead = %" PRIu32 " is not in 1..%u", p, m->ahead, MSG_MAX_AHEAD);
    return 0;
}

int msg_validate(const Pi2__Envelope *env, const msg_limits *lim, char *err, size_t errlen) {
    const vctx v = {lim, err, errlen};
    if (env->version != PI2_PROTO_VERSION)
        return fail(&v, "Envelope.version = %" PRIu32 ", expected %u", env->version,
                    PI2_PROTO_VERSION);
    if (!body_ptr(env)) return fail(&v, "Envelope has no body");
    int (*check)(const vctx *, const Pi2__Envelope *) = NULL;
    switch (env->body_case) {
    case PI2__ENVELOPE__BODY_REGISTER: check = v_register; break;
    case PI2__ENVELOPE__BODY_REGISTER_ACK: check = v_register_ack; break;
    case PI2__ENVELOPE__BODY_HEARTBEAT: check = v_heartbeat; break;
    case PI2__ENVELOPE__BODY_SHUTDOWN: check = v_shutdown; break;
    case PI2__ENVELOPE__BODY_SESSION_START: check = v_session_start; break;
    case PI2__ENVELOPE__BODY_SESSION_STOP: check = v_session_stop; break;
    case PI2__ENVELOPE__BODY_ERROR: check = v_error; break;
    case PI2__ENVELOPE__BODY_PREFILL_REQUEST: check = v_prefill_request; break;
    case PI2__ENVELOPE__BODY_PREFILL_DONE: check = v_prefill_done; break;
    case PI2__ENVELOPE__BODY_PREFILL_PROGRESS: check = v_prefill_progress; break;
    case PI2__ENVELOPE__BODY_DECODE_TASK: check = v_decode_task; break;
    case PI2__ENVELOPE__BODY_TASK_DONE: check = v_task_done; break;
    case PI2__ENVELOPE__BODY_CACHE_ACQUIRE: check = v_cache_acquire; break;
    case PI2__ENVELOPE__BODY_CACHE_ACQUIRE_REPLY: check = v_cache_acquire_reply; break;
    case PI2__ENVELOPE__BODY_CACHE_RELEASE: check = v_cache_release; break;
    case PI2__ENVELOPE__BODY_CACHE_MISS: check = v_cache_miss; break;
    case PI2__ENVELOPE__BODY_IO_READ_BATCH: check = v_io_read_batch; break;
    case PI2__ENVELOPE__BODY_IO_COMPLETE: check = v_io_complete; break;
    case PI2__ENVELOPE__BODY_BUNDLE_LOAD: check = v_bundle_load; break;
    case PI2__ENVELOPE__BODY_BUNDLE_LOADED: check = v_bundle_loaded; break;
    case PI2__ENVELOPE__BODY_STATS: check = v_stats; break;
    case PI2__ENVELOPE__BODY_STATS_REQUEST: check = v_nothing; break;
    case PI2__ENVELOPE__BODY_GENERATE_REQUEST: check = v_generate_request; break;
    case PI2__ENVELOPE__BODY_TOKEN_PIECE: check = v_token_piece; break;
    case PI2__ENVELOPE__BODY_GENERATE_DONE: check = v_generate_done; break;
    case PI2__ENVELOPE__BODY_PROMPT_PROGRESS: check = v_prompt_progress; break;
    case PI2__ENVELOPE__BODY_GENERATE_QUEUED: check = v_generate_queued; break;
    default: return fail(&v, "Envelope body %d is unknown", (int)env->body_case);
    }
    return check(&v, env);
}

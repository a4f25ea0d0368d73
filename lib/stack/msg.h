/* The pi2 wire protocol (proto/pi2.proto): packing, unpacking and validation of Envelopes.
 *
 * Every received message goes through msg_unpack (refuses garbage, other versions, a missing body)
 * and then msg_validate against the receiver's own limits, so no index, offset or length taken from
 * the wire is used before it has been checked against the segment or model it addresses.
 *
 * Errors: msg_unpack returns NULL and msg_validate -1 with a message in err (errlen bytes);
 * msg_pack returns -1 and msg_pack_alloc NULL with no message (no body, no room, out of memory).
 * msg_cluster_neurons gives UINT64_MAX for malformed ranges; the rest cannot fail. */
#ifndef PI2_MSG_H
#define PI2_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "engine/ffn_chunks.h"
#include "pi2.pb-c.h"
#include "stack/offload_stats.h"

#define PI2_PROTO_VERSION 1u
/* bus type tag (lib/stack/bus.h) of a frame that carries a packed Envelope */
#define PI2_BUS_MSG 1u

/* Bounds that do not follow from the model or the segments. */
#define MSG_MAX_FRAME (64u << 20)   /* bytes of one encoded Envelope */
#define MSG_MAX_STRING 4096u        /* any string field, e.g. a model path */
#define MSG_MAX_NAME 255u           /* segment and stat names, cpu lists */
#define MSG_MAX_SEGMENTS 16u
#define MSG_MAX_THREADS 1024u
#define MSG_MAX_IO_READS 65536u     /* reads per IoReadBatch */
#define MSG_MAX_STATS 1024u
#define MSG_MAX_PROMPT (64u << 10)  /* GenerateRequest.prompt bytes */
#define MSG_MAX_PREDICT (1u << 24)  /* GenerateRequest.n_predict */
#define MSG_MAX_WAIT_MS (86400u * 1000) /* GenerateRequest.max_wait_ms: a day */
#define MSG_MAX_AHEAD 4096u          /* GenerateQueued.ahead */
#define MSG_MAX_PIECE 256u          /* TokenPiece.piece bytes */

/* The receiver's limits. Every field must be set: a zero limit rejects anything indexed by it. */
typedef struct {
    uint32_t n_layer, n_ff, n_head, n_ctx;
    uint32_t n_vocab;                 /* token ids (TokenPiece) */
    uint64_t act_segment_size, weight_segment_size, kv_segment_size;
    uint64_t model_file_size;         /* the file IoRead.file_offset addresses */
    uint64_t slot_size;               /* bytes of one neuron's cache slot (bundle) */
    /* a stack under a memory budget (docs/offload.md); zero otherwise, which refuses every
     * IO_TARGET_HOT or IO_TARGET_STAGING read and BundleLoad */
    uint64_t bundle_file_size;        /* the file IO_TARGET_HOT and _STAGING reads address */
    uint64_t hot_region_size;         /* the neuron cache's hot region, their destination */
    uint64_t cold_region_size;        /* its cold region, IO_TARGET_STAGING reads' destination */
    uint32_t n_bundles;               /* bundles per layer of the bundle file */
} msg_limits;

/* FfnMode on the wire is enum ffn_mode + 1: 0 (unspecified) leaves a
 * GenerateRequest's mode to the stack, and msg_validate refuses it in a DecodeTask. */
_Static_assert(PI2__FFN_MODE__FFN_MODE_DENSE == FFN_DENSE + 1 &&
                   PI2__FFN_MODE__FFN_MODE_GATE_FIRST == FFN_GATE_FIRST + 1 &&
                   PI2__FFN_MODE__FFN_MODE_PREDICTOR == FFN_PREDICTOR + 1,
               "FfnMode (proto/pi2.proto) and enum ffn_mode (ffn_chunks.h) disagree");
static inline Pi2__FfnMode ffn_mode_to_wire(ffn_mode mode) { return (Pi2__FfnMode)(mode + 1); }
/* A validated wire value (msg_validate); if_unspecified for 0. */
static inline ffn_mode ffn_mode_from_wire(Pi2__FfnMode wire, ffn_mode if_unspecified) {
    return wire == PI2__FFN_MODE__FFN_MODE_UNSPECIFIED ? if_unspecified : (ffn_mode)(wire - 1);
}

/* Initialises an Envelope with the current version; the caller sets body_case and the body. */
void msg_envelope_init(Pi2__Envelope *env, uint64_t seq, uint64_t session);
/* env an Error (e, filled here) with code and text, answering the message
 * whose seq is ref_seq (0: none); text must outlive env. */
void msg_error_init(Pi2__Envelope *env, Pi2__Error *e, uint64_t seq, uint64_t session, Pi2__ErrorCode code,
                    const char *text, uint64_t ref_seq);

/* Packs env into buf[0..cap). Returns 0 and sets *len, or -1 if the Envelope has no body or
 * does not fit. */
int msg_pack(const Pi2__Envelope *env, uint8_t *buf, size_t cap, size_t *len);
/* Packs env into a malloc'ed buffer (free() it). Returns NULL if env has no body or on ENOMEM. */
uint8_t *msg_pack_alloc(const Pi2__Envelope *env, size_t *len);

/* Decodes one Envelope. Returns NULL, with a reason in err, for bytes that do not decode, a
 * version other than PI2_PROTO_VERSION, or no body. Free the result with msg_free. The result is
 * NOT yet validated: call msg_validate before using any field. */
Pi2__Envelope *msg_unpack(const uint8_t *buf, size_t len, char *err, size_t errlen);
void msg_free(Pi2__Envelope *env);

/* Checks every field of env against lim. Returns 0 if valid, else -1 with a message naming the
 * message type and field, e.g. "DecodeTask.clusters[2].neuron_ids[17] = 90000 >= n_ff 11008". */
int msg_validate(const Pi2__Envelope *env, const msg_limits *lim, char *err, size_t errlen);

/* Number of neurons a cluster names (ids, or the ranges' counts summed); UINT64_MAX if the ranges
 * are malformed (odd length). Meaningful for any cluster; bounded by n_ff once validated. */
uint64_t msg_cluster_neurons(const Pi2__NeuronCluster *c);

/* A tally on the wire and back: out filled from t (returns out); a validated message's counts. */
Pi2__OffloadStats *msg_offload_stats(Pi2__OffloadStats *out, const offload_tally *t);
offload_tally msg_offload_tally(const Pi2__OffloadStats *s);

/* Message type of the body for logs, e.g. "DecodeTask"; "none" / "unknown" otherwise. */
const char *msg_body_name(Pi2__Envelope__BodyCase body);

#endif

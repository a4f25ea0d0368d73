/* The wire protocol: round trip of every message kind, one rejection per validation rule (the
 * error text must name the field), garbage and truncated input, version refusal, and the size and
 * speed of a batched DecodeTask. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "stack/msg.h"
#include "test.h"

/* A 7B-shaped receiver. */
static const msg_limits LIM = {
    .n_layer = 32, .n_ff = 11008, .n_head = 32, .n_ctx = 4096, .n_vocab = 32000,
    .act_segment_size = 1 << 20, .weight_segment_size = 1ull << 30, .kv_segment_size = 1ull << 28,
    .model_file_size = 4ull << 30, .slot_size = 12288,
};

/* Storage for one valid message of every kind; fixture_set picks which one env carries. */
typedef struct {
    Pi2__Envelope env;
    Pi2__Register reg;
    Pi2__RegisterAck ack;
    Pi2__Segment seg[2];
    Pi2__Segment *segp[2];
    Pi2__Heartbeat hb;
    Pi2__Shutdown sd;
    Pi2__SessionStart ss;
    Pi2__SamplingParams sp;
    Pi2__SessionStop st;
    Pi2__Error er;
    Pi2__PrefillRequest pr;
    uint32_t tokens[8];
    Pi2__PrefillDone pd;
    Pi2__PrefillProgress pp;
    Pi2__DecodeTask dt;
    Pi2__NeuronCluster cl[3];
    Pi2__NeuronCluster *clp[3];
    uint32_t ids[4], ranges[4], ids2[2];
    uint64_t slots[3][4];
    Pi2__TaskDone td;
    Pi2__CacheAcquire ca;
    Pi2__CacheAcquireReply car;
    Pi2__CacheRelease cr;
    Pi2__CacheMiss cm;
    Pi2__IoReadBatch iob;
    Pi2__IoRead rd[2];
    Pi2__IoRead *rdp[2];
    Pi2__IoComplete ioc;
    int32_t results[2];
    Pi2__Stats stats;
    Pi2__Stat stat[2];
    Pi2__Stat *statp[2];
    Pi2__StatsRequest sr;
    Pi2__GenerateRequest gr;
    Pi2__TokenPiece tp;
    Pi2__GenerateDone gd;
    Pi2__OffloadStats os;
    Pi2__PromptProgress pgp;
    Pi2__GenerateQueued gq;
} fixture;

static const Pi2__Envelope__BodyCase ALL_BODIES[] = {
    PI2__ENVELOPE__BODY_REGISTER, PI2__ENVELOPE__BODY_REGISTER_ACK,
    PI2__ENVELOPE__BODY_HEARTBEAT, PI2__ENVELOPE__BODY_SHUTDOWN,
    PI2__ENVELOPE__BODY_SESSION_START, PI2__ENVELOPE__BODY_SESSION_STOP,
    PI2__ENVELOPE__BODY_ERROR, PI2__ENVELOPE__BODY_PREFILL_REQUEST,
    PI2__ENVELOPE__BODY_PREFILL_DONE, PI2__ENVELOPE__BODY_DECODE_TASK,
    PI2__ENVELOPE__BODY_TASK_DONE, PI2__ENVELOPE__BODY_CACHE_ACQUIRE,
    PI2__ENVELOPE__BODY_CACHE_ACQUIRE_REPLY, PI2__ENVELOPE__BODY_CACHE_RELEASE,
    PI2__ENVELOPE__BODY_CACHE_MISS, PI2__ENVELOPE__BODY_IO_READ_BATCH,
    PI2__ENVELOPE__BODY_IO_COMPLETE, PI2__ENVELOPE__BODY_STATS,
    PI2__ENVELOPE__BODY_STATS_REQUEST, PI2__ENVELOPE__BODY_GENERATE_REQUEST,
    PI2__ENVELOPE__BODY_TOKEN_PIECE, PI2__ENVELOPE__BODY_GENERATE_DONE,
    PI2__ENVELOPE__BODY_PREFILL_PROGRESS, PI2__ENVELOPE__BODY_PROMPT_PROGRESS,
    PI2__ENVELOPE__BODY_GENERATE_QUEUED,
};
#define N_BODIES (sizeof ALL_BODIES / sizeof ALL_BODIES[0])

static void fixture_clusters(fixture *f, int with_slots) {
    static const uint32_t ids[4] = {5, 100, 11007, 42};
    static const uint32_t ranges[4] = {0, 2, 200, 2}; /* neurons 0, 1, 200, 201 */
    memcpy(f->ids, ids, sizeof ids);
    memcpy(f->ranges, ranges, sizeof ranges);
    for (int c = 0; c < 3; c++) {
        Pi2__NeuronCluster *cl = &f->cl[c];
        pi2__neuron_cluster__init(cl);
        cl->layer = 3;
        for (int i = 0; i < 4; i++) f->slots[c][i] = (uint64_t)(c * 4 + i) * LIM.slot_size;
        cl->n_slot_offsets = with_slots ? 4 : 0;
        cl->slot_offsets = f->slots[c];
        f->clp[c] = cl;
    }
    f->cl[0].n_neuron_ids = 4, f->cl[0].neuron_ids = f->ids;
    f->cl[1].n_ranges = 4, f->cl[1].ranges = f->ranges;
    f->ids2[0] = 7, f->ids2[1] = 8;
    f->cl[2].n_neuron_ids = 2, f->cl[2].neuron_ids = f->ids2, f->cl[2].n_slot_offsets = 0;
}

/* Resets f to a valid message of kind `body` in f->env. */
static void fixture_set(fixture *f, Pi2__Envelope__BodyCase body) {
    memset(f, 0, sizeof *f);
    msg_envelope_init(&f->env, 7, 99);
    f->env.body_case = body;
    switch (body) {
    case PI2__ENVELOPE__BODY_REGISTER:
        pi2__register__init(&f->reg);
        f->reg.kind = PI2__PROCESS_KIND__CPU, f->reg.worker_index = 1, f->reg.pid = 4242;
        f->reg.cpu_list = "0-1,3", f->reg.threads = 2;
        f->env.register_ = &f->reg;
        break;
    case PI2__ENVELOPE__BODY_REGISTER_ACK:
        pi2__register_ack__init(&f->ack);
        for (int i = 0; i < 2; i++) {
            pi2__segment__init(&f->seg[i]);
            f->seg[i].name = i ? "/pi2-1-act" : "/pi2-1-weights";
            f->seg[i].generation = 3 + i, f->seg[i].size = 1 << 20;
            f->segp[i] = &f->seg[i];
        }
        f->ack.worker_id = 5, f->ack.n_segments = 2, f->ack.segments = f->segp;
        f->env.register_ack = &f->ack;
        break;
    case PI2__ENVELOPE__BODY_HEARTBEAT:
        pi2__heartbeat__init(&f->hb);
        f->hb.worker_id = 5, f->hb.monotonic_us = 123456789, f->hb.state = PI2__WORKER_STATE__BUSY;
        f->hb.tokens_served = 17, f->hb.rss_bytes = 1 << 30;
        f->env.heartbeat = &f->hb;
        break;
    case PI2__ENVELOPE__BODY_SHUTDOWN:
        pi2__shutdown__init(&f->sd);
        f->sd.reason = "pi2 down";
        f->env.shutdown = &f->sd;
        break;
    case PI2__ENVELOPE__BODY_SESSION_START:
        pi2__session_start__init(&f->ss);
        pi2__sampling_params__init(&f->sp);
        f->sp.temperature = 0.8f, f->sp.top_k = 40, f->sp.top_p = 0.95f, f->sp.seed = 1234;
        f->ss.model_path = "models/x.gguf", f->ss.n_ctx = 2048, f->ss.sampling = &f->sp;
        f->env.session_start = &f->ss;
        break;
    case PI2__ENVELOPE__BODY_SESSION_STOP:
        pi2__session_stop__init(&f->st);
        f->st.reason = "client left";
        f->env.session_stop = &f->st;
        break;
    case PI2__ENVELOPE__BODY_ERROR:
        pi2__error__init(&f->er);
        f->er.code = PI2__ERROR_CODE__INVALID, f->er.message = "bad", f->er.ref_seq = 6;
        f->env.error = &f->er;
        break;
    case PI2__ENVELOPE__BODY_PREFILL_REQUEST:
        pi2__prefill_request__init(&f->pr);
        for (int i = 0; i < 8; i++) f->tokens[i] = 1000u * i + 1;
        f->pr.first_position = 10, f->pr.n_tokens = 8, f->pr.act_offset = 4096;
        f->pr.act_length = 8 * 4, f->pr.token_ids = f->tokens; /* n_token_ids 0: ids are in act */
        f->pr.layer_begin = 0, f->pr.layer_end = 32, f->pr.epoch = 3;
        f->env.prefill_request = &f->pr;
        break;
    case PI2__ENVELOPE__BODY_PREFILL_DONE:
        pi2__prefill_done__init(&f->pd);
        f->pd.request_seq = 6, f->pd.layer_end = 32, f->pd.time_us = 5000;
        f->env.prefill_done = &f->pd;
        break;
    case PI2__ENVELOPE__BODY_PREFILL_PROGRESS:
        pi2__prefill_progress__init(&f->pp);
        f->pp.request_seq = 6, f->pp.layers_done = 17;
        f->env.prefill_progress = &f->pp;
        break;
    case PI2__ENVELOPE__BODY_DECODE_TASK:
        pi2__decode_task__init(&f->dt);
        fixture_clusters(f, 1);
        f->dt.layer = 3, f->dt.position = 100, f->dt.in_offset = 0, f->dt.in_length = 16384;
        f->dt.out_offset = 16384, f->dt.out_length = 16384, f->dt.kv_begin = 0, f->dt.kv_end = 101;
        f->dt.head_begin = 0, f->dt.head_end = 16, f->dt.share_end = 32768, f->dt.n_clusters = 3, f->dt.clusters = f->clp;
        f->dt.epoch = 3, f->dt.ffn_mode = PI2__FFN_MODE__FFN_MODE_GATE_FIRST;
        f->env.decode_task = &f->dt;
        break;
    case PI2__ENVELOPE__BODY_TASK_DONE:
        pi2__task_done__init(&f->td);
        f->td.task_seq = 6, f->td.worker_id = 2, f->td.layer = 3, f->td.out_offset = 16384;
        f->td.out_length = 16384, f->td.time_us = 250, f->td.status = PI2__TASK_STATUS__TASK_OK;
        f->env.task_done = &f->td;
        break;
    case PI2__ENVELOPE__BODY_CACHE_ACQUIRE:
        pi2__cache_acquire__init(&f->ca);
        fixture_clusters(f, 0);
        f->ca.n_clusters = 3, f->ca.clusters = f->clp;
        f->env.cache_acquire = &f->ca;
        break;
    case PI2__ENVELOPE__BODY_CACHE_ACQUIRE_REPLY:
        pi2__cache_acquire_reply__init(&f->car);
        fixture_clusters(f, 1);
        f->car.acquire_seq = 6, f->car.n_hits = 2, f->car.hits = f->clp;
        f->car.n_misses = 1, f->car.misses = f->clp + 2, f->car.io_batch_id = 77;
        f->env.cache_acquire_reply = &f->car;
        break;
    case PI2__ENVELOPE__BODY_CACHE_RELEASE:
        pi2__cache_release__init(&f->cr);
        fixture_clusters(f, 1);
        f->cr.n_clusters = 3, f->cr.clusters = f->clp;
        f->env.cache_release = &f->cr;
        break;
    case PI2__ENVELOPE__BODY_CACHE_MISS:
        pi2__cache_miss__init(&f->cm);
        fixture_clusters(f, 0);
        f->cm.n_clusters = 3, f->cm.clusters = f->clp;
        f->env.cache_miss = &f->cm;
        break;
    case PI2__ENVELOPE__BODY_IO_READ_BATCH:
        pi2__io_read_batch__init(&f->iob);
        for (int i = 0; i < 2; i++) {
            pi2__io_read__init(&f->rd[i]);
            f->rd[i].file_offset = (uint64_t)i << 31, f->rd[i].length = 12288;
            f->rd[i].slot_offset = (uint64_t)i * 12288;
            f->rdp[i] = &f->rd[i];
        }
        f->iob.batch_id = 77, f->iob.n_reads = 2, f->iob.reads = f->rdp;
        f->env.io_read_batch = &f->iob;
        break;
    case PI2__ENVELOPE__BODY_IO_COMPLETE:
        pi2__io_complete__init(&f->ioc);
        f->results[0] = 12288, f->results[1] = -5; /* -EIO */
        f->ioc.batch_id = 77, f->ioc.n_results = 2, f->ioc.results = f->results, f->ioc.time_us = 90;
        f->env.io_complete = &f->ioc;
        break;
    case PI2__ENVELOPE__BODY_STATS:
        pi2__stats__init(&f->stats);
        for (int i = 0; i < 2; i++) {
            pi2__stat__init(&f->stat[i]);
            f->stat[i].name = i ? "io.bytes" : "cache.hits", f->stat[i].value = 1.5 + i;
            f->statp[i] = &f->stat[i];
        }
        f->stats.worker_id = 2, f->stats.n_stats = 2, f->stats.stats = f->statp;
        f->env.stats = &f->stats;
        break;
    case PI2__ENVELOPE__BODY_STATS_REQUEST:
        pi2__stats_request__init(&f->sr);
        f->sr.reset = 1;
        f->env.stats_request = &f->sr;
        break;
    case PI2__ENVELOPE__BODY_GENERATE_REQUEST:
        pi2__generate_request__init(&f->gr);
        pi2__sampling_params__init(&f->sp);
        f->sp.temperature = 0.8f, f->sp.top_k = 40, f->sp.top_p = 0.95f, f->sp.seed = 1234;
        f->gr.prompt.data = (uint8_t *)"Once upon a time", f->gr.prompt.len = 16;
        f->gr.n_predict = 48, f->gr.sampling = &f->sp, f->gr.ignore_eos = 1;
        f->env.session = 0; /* the client has no session yet: the coordinator assigns one */
        f->env.generate_request = &f->gr;
        break;
    case PI2__ENVELOPE__BODY_TOKEN_PIECE:
        pi2__token_piece__init(&f->tp);
        f->tp.index = 3, f->tp.token = 31999, f->tp.piece.data = (uint8_t *)" time", f->tp.piece.len = 5;
        f->env.token_piece = &f->tp;
        break;
    case PI2__ENVELOPE__BODY_GENERATE_DONE:
        pi2__generate_done__init(&f->gd);
        f->gd.n_prompt = 5, f->gd.n_generated = 48, f->gd.prompt_ms = 1.5, f->gd.decode_ms = 80.25;
        f->gd.status = PI2__GENERATE_STATUS__GEN_LENGTH;
        f->gd.offload = msg_offload_stats(&f->os, &(offload_tally){47, 47 * 32, 9000, 3000, 1040, 900,
                                                                   1040 * 12288, 20000, 70000});
        f->env.generate_done = &f->gd;
        break;
    case PI2__ENVELOPE__BODY_PROMPT_PROGRESS:
        pi2__prompt_progress__init(&f->pgp);
        f->pgp.n_done = 100, f->pgp.n_prompt = 512, f->pgp.elapsed_ms = 2500.5;
        f->env.prompt_progress = &f->pgp;
        break;
    case PI2__ENVELOPE__BODY_GENERATE_QUEUED:
        pi2__generate_queued__init(&f->gq);
        f->gq.ahead = 2, f->gq.waited_ms = 1250.0;
        f->env.generate_queued = &f->gq;
        f->env.session = 0; /* no generation yet */
        break;
    default: break;
    }
}

/* ---- round trip ------------------------------------------------------------------------- */

static void test_round_trip(void) {
    static fixture f;
    uint8_t buf[4096], again[4096];
    char err[256];
    for (size_t b = 0; b < N_BODIES; b++) {
        fixture_set(&f, ALL_BODIES[b]);
        const char *name = msg_body_name(ALL_BODIES[b]);
        CHECK(strcmp(name, "unknown") && strcmp(name, "none"), "body %d has no name", ALL_BODIES[b]);
        CHECK(msg_validate(&f.env, &LIM, err, sizeof err) == 0, "%s fixture invalid: %s", name, err);
        size_t len = 0, len2 = 0;
        CHECK(msg_pack(&f.env, buf, sizeof buf, &len) == 0 && len > 0, "%s pack", name);
        Pi2__Envelope *e = msg_unpack(buf, len, err, sizeof err);
        CHECK(e != NULL, "%s unpack: %s", name, err);
        if (!e) continue;
        CHECK(e->body_case == ALL_BODIES[b] && e->seq == 7 && e->session == f.env.session,
              "%s header", name);
        CHECK(msg_validate(e, &LIM, err, sizeof err) == 0, "%s after round trip: %s", name, err);
        /* Re-encoding the decoded message must give the same bytes: no field was lost. */
        CHECK(msg_pack(e, again, sizeof again, &len2) == 0 && len2 == len && !memcmp(buf, again, len),
              "%s re-encodes differently (%zu vs %zu bytes)", name, len, len2);
        size_t alen = 0;
        uint8_t *alloc = msg_pack_alloc(e, &alen);
        CHECK(alloc && alen == len && !memcmp(alloc, buf, len), "%s msg_pack_alloc differs", name);
        free(alloc);
        msg_free(e);
    }
    /* Spot-check decoded values against the fixture, field by field, for the richest messages. */
    size_t len;
    fixture_set(&f, PI2__ENVELOPE__BODY_DECODE_TASK);
    msg_pack(&f.env, buf, sizeof buf, &len);
    Pi2__Envelope *e = msg_unpack(buf, len, err, sizeof err);
    Pi2__DecodeTask *t = e ? e->decode_task : NULL;
    CHECK(t && t->layer == 3 && t->position == 100 && t->out_offset == 16384 && t->kv_end == 101 &&
              t->head_end == 16 && t->n_clusters == 3, "DecodeTask fields");
    CHECK(t && t->clusters[0]->n_neuron_ids == 4 && t->clusters[0]->neuron_ids[2] == 11007 &&
              t->clusters[1]->n_ranges == 4 && t->clusters[1]->ranges[2] == 200 &&
              t->clusters[1]->slot_offsets[3] == 7 * LIM.slot_size && t->clusters[2]->n_slot_offsets == 0,
          "DecodeTask clusters");
    CHECK(t && msg_cluster_neurons(t->clusters[1]) == 4, "range cluster counts 4 neurons");
    msg_free(e);
    fixture_set(&f, PI2__ENVELOPE__BODY_IO_COMPLETE);
    msg_pack(&f.env, buf, sizeof buf, &len);
    e = msg_unpack(buf, len, err, sizeof err);
    CHECK(e && e->io_complete->n_results == 2 && e->io_complete->results[1] == -5, "IoComplete results");
    msg_free(e);
    fixture_set(&f, PI2__ENVELOPE__BODY_SESSION_START);
    msg_pack(&f.env, buf, sizeof buf, &len);
    e = msg_unpack(buf, len, err, sizeof err);
    CHECK(e && !strcmp(e->session_start->model_path, "models/x.gguf") &&
              e->session_start->sampling->top_k == 40 && e->session_start->sampling->top_p == 0.95f,
          "SessionStart fields");
    msg_free(e);
    fixture_set(&f, PI2__ENVELOPE__BODY_GENERATE_REQUEST);
    msg_pack(&f.env, buf, sizeof buf, &len);
    e = msg_unpack(buf, len, err, sizeof err);
    Pi2__GenerateRequest *g = e ? e->generate_request : NULL;
    CHECK(g && g->prompt.len == 16 && !memcmp(g->prompt.data, "Once upon a time", 16) &&
              g->n_predict == 48 && g->ignore_eos && g->sampling && g->sampling->seed == 1234,
          "GenerateRequest fields");
    msg_free(e);
    fixture_set(&f, PI2__ENVELOPE__BODY_GENERATE_DONE);
    msg_pack(&f.env, buf, sizeof buf, &len);
    e = msg_unpack(buf, len, err, sizeof err);
    CHECK(e && e->generate_done->n_generated == 48 && e->generate_done->decode_ms == 80.25 &&
              e->generate_done->status == PI2__GENERATE_STATUS__GEN_LENGTH,
          "GenerateDone fields");
    const offload_tally ot = e && e->generate_done->offload ? msg_offload_tally(e->generate_done->offload)
                                                            : (offload_tally){0};
    CHECK(ot.tokens == 47 && ot.layers == 47 * 32 && ot.hot == 9000 && ot.cold_hits == 3000 && ot.misses == 1040 &&
              ot.read_ahead == 900 && ot.bytes_read == 1040 * 12288 && ot.wait_us == 20000 && ot.ffn_us == 70000,
          "GenerateDone.offload fields");
    msg_free(e);
    CHECK(!strcmp(msg_body_name(PI2__ENVELOPE__BODY_DECODE_TASK), "DecodeTask"), "body name");
    CHECK(!strcmp(msg_body_name(PI2__ENVELOPE__BODY__NOT_SET), "none"), "no body name");
    CHECK(!strcmp(msg_body_name((Pi2__Envelope__BodyCase)999), "unknown"), "unknown body name");
}

/* ---- validation: one broken field per rule ---------------------------------------------- */

static uint32_t many_ids[11009];
static uint64_t many_slots[11009];
static char long_string[MSG_MAX_STRING + 2];
static char long_prompt[MSG_MAX_PROMPT + 1];
static uint32_t bad_ranges[6];
static Pi2__IoRead *many_reads[MSG_MAX_IO_READS + 1];

#define SET(body) fixture_set(f, PI2__ENVELOPE__BODY_##body)

/* Breaks one rule in f->env; returns the text the error must contain, NULL past the last case. */
static const char *break_rule(int i, fixture *f) {
    Pi2__NeuronCluster *c0 = &f->cl[0], *c1 = &f->cl[1];
    switch (i) {
    case 0: SET(HEARTBEAT); f->env.version = 2; return "Envelope.version = 2";
    case 1: SET(HEARTBEAT); f->env.body_case = PI2__ENVELOPE__BODY__NOT_SET; return "no body";
    case 2: SET(REGISTER); f->reg.kind = 0; return "Register.kind = 0";
    case 3: SET(REGISTER); f->reg.kind = 99; return "Register.kind = 99";
    case 4: SET(REGISTER); f->reg.pid = 0; return "Register.pid";
    case 5: SET(REGISTER); f->reg.cpu_list = "0;rm"; return "Register.cpu_list has character";
    case 6: SET(REGISTER); f->reg.cpu_list = long_string; return "Register.cpu_list is longer";
    case 7: SET(REGISTER); f->reg.threads = 0; return "Register.threads = 0";
    case 8: SET(REGISTER_ACK); f->ack.worker_id = 0; return "RegisterAck.worker_id";
    case 9: SET(REGISTER_ACK); f->seg[1].name = "pi2-act"; return "RegisterAck.segments[1].name";
    case 10: SET(REGISTER_ACK); f->seg[1].name = "/a/b"; return "RegisterAck.segments[1].name";
    case 11: SET(REGISTER_ACK); f->seg[0].size = 0; return "RegisterAck.segments[0].size";
    case 12: SET(REGISTER_ACK); f->ack.n_segments = 17; return "RegisterAck.segments has 17";
    case 13: SET(HEARTBEAT); f->hb.worker_id = 0; return "Heartbeat.worker_id";
    case 14: SET(HEARTBEAT); f->hb.state = 9; return "Heartbeat.state = 9";
    case 15: SET(SHUTDOWN); f->sd.reason = long_string; return "Shutdown.reason is longer";
    case 16: SET(SESSION_START); f->env.session = 0; return "SessionStart needs a session";
    case 17: SET(SESSION_START); f->ss.model_path = ""; return "SessionStart.model_path is empty";
    case 18: SET(SESSION_START); f->ss.n_ctx = 5000; return "SessionStart.n_ctx = 5000";
    case 19: SET(SESSION_START); f->ss.n_ctx = 0; return "SessionStart.n_ctx = 0";
    case 20: SET(SESSION_START); f->sp.temperature = NAN; return "sampling.temperature";
    case 21: SET(SESSION_START); f->sp.top_p = INFINITY; return "sampling.top_p";
    case 22: SET(SESSION_STOP); f->env.session = 0; return "SessionStop needs a session";
    case 23: SET(ERROR); f->er.code = 0; return "Error.code = 0";
    case 24: SET(PREFILL_REQUEST); f->pr.n_tokens = 0; return "PrefillRequest.n_tokens";
    case 25: SET(PREFILL_REQUEST); f->pr.first_position = 4090; return "PrefillRequest.positions = [4090, 4098)";
    case 26: SET(PREFILL_REQUEST); f->pr.first_position = UINT32_MAX; return "PrefillRequest.positions";
    case 27: SET(PREFILL_REQUEST); f->pr.act_offset = LIM.act_segment_size - 16; return "PrefillRequest.act_offset/act_length";
    case 28: SET(PREFILL_REQUEST); f->pr.act_offset = UINT64_MAX - 3; return "PrefillRequest.act_offset/act_length";
    case 29: SET(PREFILL_REQUEST); f->pr.act_length = 0; return "PrefillRequest.act_offset/act_length";
    case 30: SET(PREFILL_REQUEST); f->pr.act_offset = 2; return "not float-aligned";
    case 31: SET(PREFILL_REQUEST); f->pr.layer_end = 33; return "PrefillRequest.layers";
    case 32: SET(PREFILL_REQUEST); f->pr.layer_begin = 5, f->pr.layer_end = 5; return "PrefillRequest.layers";
    case 33: SET(PREFILL_REQUEST); f->pr.n_token_ids = 8; return "PrefillRequest.token_ids has 8 entries, expected 0";
    case 34: SET(PREFILL_REQUEST); f->pr.act_length = 36; return "PrefillRequest.act_length = 36 is not 4 * n_tokens 8";
    case 35: SET(PREFILL_REQUEST); f->pr.epoch = 0; return "PrefillRequest.epoch must not be 0";
    case 36: SET(PREFILL_DONE); f->pd.layer_end = 33; return "PrefillDone.layer_end";
    case 37: SET(DECODE_TASK); f->dt.layer = 33; return "DecodeTask.layer = 33 > n_layer 32";
    case 38: SET(DECODE_TASK); f->dt.position = 4096; return "DecodeTask.position = 4096 >= n_ctx 4096";
    case 39: SET(DECODE_TASK); f->dt.in_offset = LIM.act_segment_size; return "DecodeTask.in_offset";
    case 40: SET(DECODE_TASK); f->dt.out_offset = UINT64_MAX - 15; return "DecodeTask.out_offset";
    case 41: SET(DECODE_TASK); f->dt.kv_end = 102; return "DecodeTask.kv = [0, 102)";
    case 42: SET(DECODE_TASK); f->dt.kv_begin = 50, f->dt.kv_end = 40; return "DecodeTask.kv";
    case 43: SET(DECODE_TASK); f->dt.head_end = 33; return "DecodeTask.heads";
    case 44: SET(DECODE_TASK); f->dt.head_begin = 20; return "DecodeTask.heads = [20, 16)";
    case 45: SET(DECODE_TASK); c1->layer = 4; return "DecodeTask.clusters[1].layer = 4 differs";
    case 46: SET(DECODE_TASK); c1->layer = 40; return "DecodeTask.clusters[1].layer = 40 >= n_layer";
    case 47: SET(DECODE_TASK); f->ids[2] = 90000; return "DecodeTask.clusters[0].neuron_ids[2] = 90000 >= n_ff 11008";
    case 48: SET(DECODE_TASK); c0->n_ranges = 2, c0->ranges = f->ranges; return "clusters[0] has both";
    case 49: SET(DECODE_TASK); c0->n_neuron_ids = 0; return "DecodeTask.clusters[0] names no neuron";
    case 50: SET(DECODE_TASK); c1->n_ranges = 3; return "DecodeTask.clusters[1].ranges has 3 values";
    case 51: SET(DECODE_TASK); f->ranges[3] = 0; return "DecodeTask.clusters[1].ranges[1] has count 0";
    case 52: SET(DECODE_TASK); f->ranges[0] = UINT32_MAX; return "clusters[1].ranges[0] = (4294967295, 2) ends past n_ff";
    case 53: SET(DECODE_TASK); f->ranges[2] = 11000, f->ranges[3] = 9; return "clusters[1].ranges[1] = (11000, 9)";
    case 54: SET(DECODE_TASK); c0->n_neuron_ids = 11009, c0->neuron_ids = many_ids, c0->n_slot_offsets = 0;
        return "DecodeTask.clusters[0].neuron_ids has 11009 entries";
    case 55: SET(DECODE_TASK); bad_ranges[1] = bad_ranges[3] = 11008; c1->ranges = bad_ranges, c1->n_ranges = 4, c1->n_slot_offsets = 0;
        return "DecodeTask.clusters[1].ranges name 22016 neurons";
    case 56: SET(DECODE_TASK); c0->n_neuron_ids = 11004, c0->neuron_ids = many_ids, c0->n_slot_offsets = 0;
        return "DecodeTask.clusters name 11010 neurons";
    case 57: SET(DECODE_TASK); c0->n_slot_offsets = 3; return "clusters[0].slot_offsets has 3 entries for 4 neurons";
    case 58: SET(DECODE_TASK); f->slots[0][1] = LIM.weight_segment_size - LIM.slot_size + 1; return "DecodeTask.clusters[0].slot_offsets[1]";
    case 59: SET(DECODE_TASK); f->slots[1][2] = UINT64_MAX; return "DecodeTask.clusters[1].slot_offsets[2]";
    case 60: SET(TASK_DONE); f->td.worker_id = 0; return "TaskDone.worker_id";
    case 61: SET(TASK_DONE); f->td.status = 0; return "TaskDone.status = 0";
    case 62: SET(TASK_DONE); f->td.status = 7; return "TaskDone.status = 7";
    case 63: SET(TASK_DONE); f->td.layer = 33; return "TaskDone.layer = 33 > n_layer 32";
    case 64: SET(TASK_DONE); f->td.out_length = LIM.act_segment_size; return "TaskDone.out_offset/out_length";
    case 65: SET(CACHE_ACQUIRE); c0->n_slot_offsets = 4; return "CacheAcquire.clusters[0].slot_offsets must be empty";
    case 66: SET(CACHE_ACQUIRE); c1->layer = 32; return "CacheAcquire.clusters[1].layer = 32";
    case 67: SET(CACHE_ACQUIRE_REPLY); c0->n_slot_offsets = 0; return "CacheAcquireReply.hits[0].slot_offsets has 0 entries for 4 neurons";
    case 68: SET(CACHE_ACQUIRE_REPLY); f->ids2[1] = 11008; return "CacheAcquireReply.misses[0].neuron_ids[1] = 11008";
    case 69: SET(CACHE_RELEASE); f->ids[0] = 20000; return "CacheRelease.clusters[0].neuron_ids[0] = 20000";
    case 70: SET(CACHE_MISS); c1->n_slot_offsets = 4; return "CacheMiss.clusters[1].slot_offsets must be empty";
    case 71: SET(IO_READ_BATCH); f->iob.n_reads = 0; return "IoReadBatch.reads is empty";
    case 72: SET(IO_READ_BATCH); f->rd[1].length = 0; return "IoReadBatch.reads[1].length";
    case 73: SET(IO_READ_BATCH); f->rd[1].file_offset = LIM.model_file_size - 100; return "IoReadBatch.reads[1].file_offset";
    case 74: SET(IO_READ_BATCH); f->rd[0].file_offset = UINT64_MAX - 100; return "IoReadBatch.reads[0].file_offset";
    case 75: SET(IO_READ_BATCH); f->rd[0].slot_offset = LIM.weight_segment_size - 4096; return "IoReadBatch.reads[0].slot_offset";
    case 76: SET(IO_READ_BATCH); f->iob.n_reads = MSG_MAX_IO_READS + 1, f->iob.reads = many_reads; return "IoReadBatch.reads has 65537";
    case 77: SET(IO_COMPLETE); f->results[1] = -5000; return "IoComplete.results[1] = -5000";
    case 78: SET(STATS); f->stat[1].name = ""; return "Stats.stats[1].name is empty";
    case 79: SET(STATS); f->stats.n_stats = MSG_MAX_STATS + 1; return "Stats.stats has 1025";
    case 80: SET(DECODE_TASK); f->env.session = 0; return "DecodeTask needs a session";
    case 81: SET(DECODE_TASK); f->dt.epoch = 0; return "DecodeTask.epoch must not be 0";
    case 82: SET(DECODE_TASK); f->dt.layer = 32, f->dt.n_clusters = 0; return "the output task) has heads";
    case 83: SET(DECODE_TASK); f->dt.layer = 32, f->dt.head_end = 0; return "the output task) has heads, clusters";
    case 98: SET(DECODE_TASK); f->dt.ffn_mode = 0; return "DecodeTask.ffn_mode = 0 is not a mode";
    case 99: SET(DECODE_TASK); f->dt.ffn_mode = 4; return "DecodeTask.ffn_mode = 4 is not a mode";
    case 100: SET(DECODE_TASK); f->dt.layer = 32, f->dt.head_end = 0, f->dt.n_clusters = 0;
        return "has heads, clusters or an ffn_mode";
    case 101: SET(GENERATE_REQUEST); f->gr.ffn_mode = 9; return "GenerateRequest.ffn_mode = 9 is not a mode";
    case 84: SET(GENERATE_REQUEST); f->gr.prompt.len = MSG_MAX_PROMPT + 1, f->gr.prompt.data = (uint8_t *)long_prompt;
        return "GenerateRequest.prompt has 65537 bytes";
    case 85: SET(GENERATE_REQUEST); f->gr.prompt.data = (uint8_t *)"Once\0upon"; f->gr.prompt.len = 9;
        return "GenerateRequest.prompt contains a NUL";
    case 86: SET(GENERATE_REQUEST); f->gr.n_predict = MSG_MAX_PREDICT + 1; return "GenerateRequest.n_predict = 16777217";
    case 87: SET(GENERATE_REQUEST); f->sp.temperature = -INFINITY; return "GenerateRequest.sampling.temperature";
    case 88: SET(GENERATE_REQUEST); f->sp.top_p = NAN; return "GenerateRequest.sampling.top_p";
    case 89: SET(TOKEN_PIECE); f->tp.token = 32000; return "TokenPiece.token = 32000 >= n_vocab 32000";
    case 90: SET(TOKEN_PIECE); f->tp.piece.len = MSG_MAX_PIECE + 1, f->tp.piece.data = (uint8_t *)long_prompt;
        return "TokenPiece.piece has 257 bytes";
    case 91: SET(TOKEN_PIECE); f->env.session = 0; return "TokenPiece needs a session";
    case 92: SET(GENERATE_DONE); f->gd.status = 0; return "GenerateDone.status = 0";
    case 93: SET(GENERATE_DONE); f->gd.status = 4; return "GenerateDone.status = 4";
    case 94: SET(GENERATE_DONE); f->gd.prompt_ms = NAN; return "GenerateDone.prompt_ms";
    case 95: SET(GENERATE_DONE); f->gd.decode_ms = -1; return "GenerateDone.decode_ms = -1";
    case 96: SET(GENERATE_DONE); f->gd.n_prompt = 4097; return "GenerateDone.n_prompt = 4097 > n_ctx 4096";
    case 97: SET(GENERATE_DONE); f->env.session = 0; return "GenerateDone needs a session";
    case 102: SET(PREFILL_PROGRESS); f->pp.layers_done = 33; return "PrefillProgress.layers_done";
    case 103: SET(PREFILL_PROGRESS); f->pp.request_seq = 0; return "PrefillProgress.request_seq";
    case 104: SET(PREFILL_PROGRESS); f->env.session = 0; return "PrefillProgress needs a session";
    case 105: SET(PROMPT_PROGRESS); f->pgp.n_done = 513; return "PromptProgress.n_done = 513 > n_prompt 512";
    case 106: SET(PROMPT_PROGRESS); f->pgp.n_prompt = 4097, f->pgp.n_done = 1;
        return "PromptProgress.n_prompt = 4097 > n_ctx 4096";
    case 107: SET(PROMPT_PROGRESS); f->pgp.elapsed_ms = NAN; return "PromptProgress.elapsed_ms";
    case 108: SET(PROMPT_PROGRESS); f->env.session = 0; return "PromptProgress needs a session";
    case 109: SET(GENERATE_DONE); f->os.tokens = f->os.layers + 1; return "GenerateDone.offload.tokens = 1505 > layers";
    case 110: SET(GENERATE_DONE); f->os.wait_us = 70001; return "GenerateDone.offload.wait_us = 70001 > ffn_us";
    case 111: SET(GENERATE_DONE); f->os.misses = UINT64_MAX - 11999; return "GenerateDone.offload: hot + cold_hits";
    case 112: SET(GENERATE_REQUEST); f->gr.max_wait_ms = MSG_MAX_WAIT_MS + 1; return "GenerateRequest.max_wait_ms = 86400001";
    case 113: SET(GENERATE_QUEUED); f->gq.ahead = 0; return "GenerateQueued.ahead = 0 is not in 1..4096";
    case 114: SET(GENERATE_QUEUED); f->gq.ahead = MSG_MAX_AHEAD + 1; return "GenerateQueued.ahead = 4097";
    case 115: SET(GENERATE_QUEUED); f->gq.waited_ms = -1; return "GenerateQueued.waited_ms = -1";
    case 116: SET(GENERATE_DONE); f->os.read_ahead = 1041; return "GenerateDone.offload.read_ahead = 1041 > misses 1040";
    case 117: SET(DECODE_TASK); f->dt.share_end = 65537; return "DecodeTask.share = [0, 65537) is not within [0, the whole 65536)";
    case 118: SET(DECODE_TASK); f->dt.share_begin = 40000, f->dt.share_end = 30000; return "DecodeTask.share = [40000, 30000)";
    case 119: SET(DECODE_TASK); f->dt.share_begin = f->dt.share_end = 30000; return "DecodeTask.share = [30000, 30000) is empty";
    default: return NULL;
    }
}

static void test_validation(void) {
    static fixture f;
    char err[256];
    for (uint32_t i = 0; i < 11009; i++) many_ids[i] = i, many_slots[i] = 0;
    memset(long_string, '1', sizeof long_string - 1);
    memset(long_prompt, 'a', sizeof long_prompt);
    int n = 0;
    for (const char *want; (want = break_rule(n, &f)); n++) {
        err[0] = 0;
        int rc = msg_validate(&f.env, &LIM, err, sizeof err);
        CHECK(rc == -1, "rule %d: accepted a message breaking \"%s\"", n, want);
        CHECK(strstr(err, want) != NULL, "rule %d: error \"%s\" does not say \"%s\"", n, err, want);
    }
    printf("validation: %d rules checked\n", n);
    /* Boundaries that are valid: the last neurons, a slot ending exactly at the segment end. */
    fixture_set(&f, PI2__ENVELOPE__BODY_DECODE_TASK);
    f.ranges[2] = 11006, f.ranges[3] = 2;
    f.slots[0][0] = LIM.weight_segment_size - LIM.slot_size;
    f.dt.out_offset = LIM.act_segment_size - f.dt.out_length;
    CHECK(msg_validate(&f.env, &LIM, err, sizeof err) == 0, "boundary DecodeTask rejected: %s", err);
    /* 11000 + 4 + 2 neurons: just under n_ff in total. */
    fixture_set(&f, PI2__ENVELOPE__BODY_DECODE_TASK);
    f.cl[0].n_neuron_ids = 11000, f.cl[0].neuron_ids = many_ids, f.cl[0].n_slot_offsets = 0;
    CHECK(msg_validate(&f.env, &LIM, err, sizeof err) == 0, "11006 neurons rejected: %s", err);
    /* The output task: layer n_layer, no heads, no clusters, logits-sized output. */
    fixture_set(&f, PI2__ENVELOPE__BODY_DECODE_TASK);
    f.dt.layer = LIM.n_layer, f.dt.head_end = 0, f.dt.n_clusters = 0, f.dt.out_length = 32000 * 4;
    f.dt.ffn_mode = 0;
    CHECK(msg_validate(&f.env, &LIM, err, sizeof err) == 0, "output task rejected: %s", err);
    fixture_set(&f, PI2__ENVELOPE__BODY_TASK_DONE);
    f.td.layer = LIM.n_layer;
    CHECK(msg_validate(&f.env, &LIM, err, sizeof err) == 0, "output TaskDone rejected: %s", err);
    /* The longest prompt, an empty prompt, the last token id, the longest piece. */
    fixture_set(&f, PI2__ENVELOPE__BODY_GENERATE_REQUEST);
    f.gr.prompt.len = MSG_MAX_PROMPT, f.gr.prompt.data = (uint8_t *)long_prompt;
    CHECK(msg_validate(&f.env, &LIM, err, sizeof err) == 0, "64 KiB prompt rejected: %s", err);
    f.gr.prompt.len = 0, f.gr.sampling = NULL;
    CHECK(msg_validate(&f.env, &LIM, err, sizeof err) == 0, "empty prompt rejected: %s", err);
    fixture_set(&f, PI2__ENVELOPE__BODY_TOKEN_PIECE);
    f.tp.token = LIM.n_vocab - 1, f.tp.piece.len = MSG_MAX_PIECE, f.tp.piece.data = (uint8_t *)long_prompt;
    CHECK(msg_validate(&f.env, &LIM, err, sizeof err) == 0, "boundary TokenPiece rejected: %s", err);
}

/* ---- garbage ---------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}

static int garbage_accepted, garbage_valid;

/* Whatever the bytes, unpack gives NULL or a versioned Envelope with a body that validation can
 * judge without crashing. */
static void feed(const uint8_t *buf, size_t len) {
    char err[256];
    Pi2__Envelope *e = msg_unpack(buf, len, err, sizeof err);
    if (!e) {
        CHECK(err[0] != 0, "NULL without a reason for %zu bytes", len);
        return;
    }
    garbage_accepted++;
    CHECK(e->version == PI2_PROTO_VERSION && e->body_case != PI2__ENVELOPE__BODY__NOT_SET,
          "unpack returned an unversioned or empty envelope");
    if (msg_validate(e, &LIM, err, sizeof err) == 0) garbage_valid++;
    msg_free(e);
}

static void test_garbage(void) {
    static uint8_t buf[4096];
    static fixture f;
    int before = test_failed;
    for (int round = 0; round < 4000; round++) {
        size_t len = round < 300 ? (size_t)round : rng() % sizeof buf;
        for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)rng();
        /* Some rounds start like an Envelope (version 1, then a body tag) to get past the header. */
        if (round % 2 && len >= 3) buf[0] = 0x08, buf[1] = 0x01, buf[2] = (uint8_t)(0x52 + 8 * (rng() % 20));
        feed(buf, len);
    }
    for (size_t b = 0; b < N_BODIES; b++) {
        fixture_set(&f, ALL_BODIES[b]);
        size_t len;
        msg_pack(&f.env, buf, sizeof buf, &len);
        for (size_t cut = 0; cut < len; cut++) feed(buf, cut);
        for (size_t i = 0; i < len; i++)
            for (int m = 0; m < 3; m++) {
                static const uint8_t masks[3] = {0x01, 0x80, 0xff};
                buf[i] ^= masks[m];
                feed(buf, len);
                buf[i] ^= masks[m];
            }
    }
    CHECK(test_failed == before, "garbage handling failed");
    printf("garbage: %d inputs decoded, %d of them valid\n", garbage_accepted, garbage_valid);
}

static void test_refusals(void) {
    static fixture f;
    uint8_t buf[512];
    char err[256];
    size_t len;
    fixture_set(&f, PI2__ENVELOPE__BODY_HEARTBEAT);
    for (uint32_t version = 0; version <= 2; version += 2) {
        f.env.version = version;
        CHECK(msg_pack(&f.env, buf, sizeof buf, &len) == 0, "pack version %u", version);
        Pi2__Envelope *e = msg_unpack(buf, len, err, sizeof err);
        char want[64];
        snprintf(want, sizeof want, "Envelope.version = %u, expected 1", version);
        CHECK(!e && strstr(err, want), "version %u not refused (%s)", version, err);
        msg_free(e);
    }
    const uint8_t header_only[] = {0x08, 0x01, 0x10, 0x05}; /* version 1, seq 5, no body */
    CHECK(!msg_unpack(header_only, sizeof header_only, err, sizeof err) && strstr(err, "no body"),
          "missing body not refused (%s)", err);
    CHECK(!msg_unpack(buf, (size_t)MSG_MAX_FRAME + 1, err, sizeof err) && strstr(err, "exceeds"),
          "oversized frame not refused (%s)", err);
    const uint8_t bad_wire[] = {0x08, 0x01, 0x52, 0x7f}; /* Heartbeat claims 127 bytes, has 0 */
    CHECK(!msg_unpack(bad_wire, sizeof bad_wire, err, sizeof err) && strstr(err, "malformed"),
          "truncated body not refused (%s)", err);
    f.env.version = PI2_PROTO_VERSION;
    CHECK(msg_pack(&f.env, buf, 4, &len) == -1, "pack into a too small buffer");
    f.env.body_case = PI2__ENVELOPE__BODY__NOT_SET;
    CHECK(msg_pack(&f.env, buf, sizeof buf, &len) == -1 && !msg_pack_alloc(&f.env, &len),
          "pack without body");
}

/* ---- batched DecodeTask: size and speed -------------------------------------------------- */

static void test_batched_task(void) {
    enum { N_CL = 32, PER = 128 };
    static uint32_t ids[N_CL][PER];
    static uint64_t slots[N_CL][PER];
    static Pi2__NeuronCluster cl[N_CL];
    static Pi2__NeuronCluster *clp[N_CL];
    static fixture f;
    fixture_set(&f, PI2__ENVELOPE__BODY_DECODE_TASK);
    for (int c = 0; c < N_CL; c++) {
        pi2__neuron_cluster__init(&cl[c]);
        for (int i = 0; i < PER; i++) {
            ids[c][i] = (uint32_t)(rng() % LIM.n_ff);
            slots[c][i] = (rng() % (LIM.weight_segment_size / LIM.slot_size)) * LIM.slot_size;
        }
        cl[c].layer = 3, cl[c].n_neuron_ids = PER, cl[c].neuron_ids = ids[c];
        cl[c].n_slot_offsets = PER, cl[c].slot_offsets = slots[c];
        clp[c] = &cl[c];
    }
    f.dt.n_clusters = N_CL, f.dt.clusters = clp;
    static uint8_t buf[1 << 16];
    char err[256];
    size_t len = 0;
    CHECK(msg_pack(&f.env, buf, sizeof buf, &len) == 0, "pack batched task");
    /* Packed fixed-width arrays: 4 + 8 bytes per neuron and a few bytes per cluster (unpacked
     * encoding would add a tag byte per value). */
    size_t bound = (size_t)N_CL * PER * 12 + N_CL * 16 + 64;
    CHECK(len <= bound, "batched DecodeTask is %zu bytes, more than %zu", len, bound);
    Pi2__Envelope *e = msg_unpack(buf, len, err, sizeof err);
    int same = e && e->decode_task->n_clusters == N_CL;
    for (int c = 0; same && c < N_CL; c++)
        same = e->decode_task->clusters[c]->n_neuron_ids == PER &&
               !memcmp(e->decode_task->clusters[c]->neuron_ids, ids[c], sizeof ids[c]) &&
               !memcmp(e->decode_task->clusters[c]->slot_offsets, slots[c], sizeof slots[c]);
    CHECK(same, "batched task round trip");
    CHECK(e && msg_validate(e, &LIM, err, sizeof err) == 0, "batched task valid: %s", err);
    msg_free(e);

    const int reps = 2000;
    double t0 = clock_seconds() * 1e6;
    for (int r = 0; r < reps; r++) {
        msg_pack(&f.env, buf, sizeof buf, &len);
        e = msg_unpack(buf, len, err, sizeof err);
        if (e) msg_validate(e, &LIM, err, sizeof err);
        msg_free(e);
    }
    double per = (clock_seconds() * 1e6 - t0) / reps;
    printf("batched DecodeTask (%d clusters x %d neurons): %zu bytes (%.2f B/neuron), "
           "pack+unpack+validate %.1f us\n", N_CL, PER, len, (double)len / (N_CL * PER), per);
}

/* An IoReadBatch's destination is its target's region: the hot region for IO_TARGET_HOT, the cold one
 * for IO_TARGET_STAGING (a packed hot region's load), each read from the bundle file. */
static void test_read_targets(void) {
    static fixture f;
    char err[256];
    msg_limits lim = LIM;
    lim.bundle_file_size = 8ull << 30, lim.hot_region_size = 16u << 20, lim.cold_region_size = 8u << 20;
    const struct {
        Pi2__IoTarget target;
        uint64_t slot_offset;
        const char *refused; /* NULL: accepted */
    } cases[] = {
        {PI2__IO_TARGET__IO_TARGET_HOT, (12u << 20), NULL},
        {PI2__IO_TARGET__IO_TARGET_STAGING, (8u << 20) - 2 * 12288, NULL},
        {PI2__IO_TARGET__IO_TARGET_STAGING, (12u << 20), "cold_region_size"},
        {PI2__IO_TARGET__IO_TARGET_HOT, (16u << 20) - 12288, "hot_region_size"},
        {(Pi2__IoTarget)3, 0, "not a valid IoTarget"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fixture_set(&f, PI2__ENVELOPE__BODY_IO_READ_BATCH);
        f.iob.target = cases[i].target;
        f.rd[0].slot_offset = cases[i].slot_offset, f.rd[1].slot_offset = cases[i].slot_offset + 12288;
        err[0] = 0;
        const int rc = msg_validate(&f.env, &lim, err, sizeof err);
        CHECK(cases[i].refused ? rc == -1 && strstr(err, cases[i].refused) : rc == 0,
              "target %d at slot_offset %llu: %s", (int)cases[i].target,
              (unsigned long long)cases[i].slot_offset, rc ? err : "accepted");
    }
}

int main(void) {
    test_round_trip();
    test_validation();
    test_garbage();
    test_refusals();
    test_batched_task();
    test_read_targets();
    return test_summary();
}

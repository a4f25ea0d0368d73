/* One request: validate an IoReadBatch against the model file and the
 * weights segment, read it, answer IoComplete. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "io_worker.h"
#include "util/log.h"
#include "stack/msg.h"

/* wait: a reply its peer waits for; else an Error that is dropped rather than wait for a peer that does not read */
static void reply(io_worker *w, const struct bus_msg *m, Pi2__Envelope *env, bool wait) {
    size_t len;
    uint8_t *bytes = msg_pack_alloc(env, &len);
    if (!bytes) {
        log_error("cannot pack the %s reply", msg_body_name(env->body_case));
        return;
    }
    int rc = wait ? bus_send_to(w->sock, m->peer, m->peer_len, PI2_BUS_MSG, bytes, len)
                  : bus_try_send_to(w->sock, m->peer, m->peer_len, PI2_BUS_MSG, bytes, len);
    if (rc != BUS_OK)
        peer_limit_warn(&w->drops, m->peer, m->peer_len, "reply to '%.*s' not sent: %s", (int)m->peer_len,
                      (const char *)m->peer, bus_status_str(rc));
    free(bytes);
}

void iow_reply(io_worker *w, const struct bus_msg *m, Pi2__Envelope *env) { reply(w, m, env, true); }

static void reply_error(io_worker *w, const struct bus_msg *m, const Pi2__Envelope *req, Pi2__ErrorCode code,
                        const char *text) {
    Pi2__Envelope env;
    Pi2__Error e;
    msg_error_init(&env, &e, ++w->seq, req->session, code, text, req->seq);
    reply(w, m, &env, false);
}

/* Lets a test kill the io-worker while a batch is in its hands; beats meanwhile. */
static void pause_for_tests(io_worker *w) {
    for (int64_t left = w->delay_us; left > 0 && !proc_stop; left -= 50000) {
        nanosleep(&(struct timespec){.tv_nsec = (left < 50000 ? left : 50000) * 1000}, NULL);
        iow_beat(w);
    }
}

/* The segment was replaced (cachemgr restarted with a fresh one) or removed. */
static int ensure_fresh_weights(io_worker *w) {
    if (!shm_is_stale(w->weights)) return 0;
    log_info("the weights segment was replaced or removed; re-attaching");
    return iow_attach_weights(w);
}

static void read_batch(io_worker *w, const struct bus_msg *m, const Pi2__Envelope *req, bool have_weights) {
    const Pi2__IoReadBatch *b = req->io_read_batch;
    size_t n = b->n_reads;
    io_job *jobs = calloc(n, sizeof *jobs);
    int32_t *results = calloc(n, sizeof *results);
    if (!jobs || !results) {
        log_error("out of memory for a batch of %zu reads", n);
        free(jobs);
        free(results);
        return;
    }
    uint64_t t0 = clock_us(), bytes = 0;
    /* once the weights are ready the cold region holds slots: a staging read then is a stale cachemgr's */
    const bool stale_staging = b->target == PI2__IO_TARGET__IO_TARGET_STAGING && w->ctl &&
                               atomic_load(&w->ctl->weights_ready);
    if (stale_staging) log_warn("refused a staging batch: the weights are loaded and the cold region holds slots");
    if (!have_weights || stale_staging) {
        for (size_t i = 0; i < n; i++) results[i] = -ESTALE;
    } else {
        const bool hot = b->target == PI2__IO_TARGET__IO_TARGET_HOT;
        const bool staging = b->target == PI2__IO_TARGET__IO_TARGET_STAGING;
        uint8_t *dest = hot ? w->hot : staging ? w->cold : w->data;
        for (size_t i = 0; i < n; i++)
            jobs[i] = (io_job){.file_offset = b->reads[i]->file_offset, .length = b->reads[i]->length,
                               .dest = dest + b->reads[i]->slot_offset};
        w->state = PROC_BUSY;
        pause_for_tests(w);
        file_reader_run(hot || staging ? w->bundle_reader : w->reader, jobs, n, iow_beat, w);
        w->state = PROC_READY;
        for (size_t i = 0; i < n; i++) {
            results[i] = jobs[i].result;
            if (results[i] > 0) bytes += (uint64_t)results[i];
        }
    }
    uint64_t us = clock_us() - t0;
    log_debug("batch %llu: %zu reads, %llu bytes in %llu us", (unsigned long long)b->batch_id, n,
              (unsigned long long)bytes, (unsigned long long)us);

    Pi2__Envelope env;
    Pi2__IoComplete done = PI2__IO_COMPLETE__INIT;
    msg_envelope_init(&env, ++w->seq, req->session);
    done.batch_id = b->batch_id;
    done.n_results = n;
    done.results = results;
    done.time_us = us;
    env.body_case = PI2__ENVELOPE__BODY_IO_COMPLETE;
    env.io_complete = &done;
    iow_reply(w, m, &env);
    free(jobs);
    free(results);
}

void iow_serve(io_worker *w, const struct bus_msg *m) {
    int peer_len = (int)m->peer_len;
    const char *peer = (const char *)m->peer;
    if (m->type != PI2_BUS_MSG) {
        peer_limit_warn(&w->drops, m->peer, m->peer_len, "dropped a message of type %u from '%.*s'", m->type, peer_len, peer);
        return;
    }
    char err[512];
    Pi2__Envelope *env = msg_unpack(m->data, m->len, err, sizeof err);
    if (!env) {
        peer_limit_warn(&w->drops, m->peer, m->peer_len, "dropped a message from '%.*s': %s", peer_len, peer, err);
        return;
    }
    if (env->body_case != PI2__ENVELOPE__BODY_IO_READ_BATCH && env->body_case != PI2__ENVELOPE__BODY_BUNDLE_LOAD) {
        peer_limit_warn(&w->drops, m->peer, m->peer_len, "dropped a %s from '%.*s': the io-worker serves IoReadBatch and BundleLoad",
                      msg_body_name(env->body_case), peer_len, peer);
        msg_free(env);
        return;
    }
    bool have_weights = ensure_fresh_weights(w) == 0;
    iow_open_offload(w); /* under a budget: the bundle file and the neuron cache */
    /* Every read must lie inside its file and its destination; bundles inside the bundle file. */
    msg_limits lim = {.model_file_size = file_reader_file_size(w->reader), .weight_segment_size = w->data_bytes};
    if (w->budgeted) {
        lim.n_layer = (uint32_t)w->m.n_layer;
        lim.n_bundles = (uint32_t)w->off.n_bundles;
        lim.bundle_file_size = file_reader_file_size(w->bundle_reader);
        lim.hot_region_size = w->hot_bytes;
        lim.cold_region_size = w->cold_bytes;
    }
    if (msg_validate(env, &lim, err, sizeof err)) {
        peer_limit_warn(&w->drops, m->peer, m->peer_len, "refused a %s from '%.*s': %s", msg_body_name(env->body_case), peer_len,
                      peer, err);
        reply_error(w, m, env, PI2__ERROR_CODE__INVALID, err);
    } else if (env->body_case == PI2__ENVELOPE__BODY_BUNDLE_LOAD) {
        iow_bundle_load(w, m, env);
    } else {
        read_batch(w, m, env, have_weights);
    }
    msg_free(env);
}

/* The coordinator's view of the stack: cachemgr's four segments (waited
 * for, then checked against the sizes this model and the stack parameters
 * need), the model rebased into the weights segment, the tokenizer. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coord.h"
#include "log.h"

#define POLL_MS 50

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool waited_too_long(const coord *c, int64_t deadline) { return *c->stop || ctl_now_ms() > deadline; }

/* Attaches /pi2-<runid>-<what>, retrying while cachemgr has not created it yet. */
static shm_segment *attach_waiting(coord *c, const char *what, enum shm_kind kind, int64_t deadline) {
    char name[SHM_NAME_MAX];
    if (shm_make_name(name, sizeof name, c->opt.runid, what)) {
        log_error("run id '%s': %s", c->opt.runid, shm_last_error());
        return NULL;
    }
    for (;;) {
        shm_segment *seg = shm_attach(name, kind, 0);
        if (seg) return seg;
        if (waited_too_long(c, deadline)) {
            if (!*c->stop)
                log_error("segment %s not available after %d s (is cachemgr running for run '%s'?): %s", name,
                          c->opt.startup_wait_ms / 1000, c->opt.runid, shm_last_error());
            return NULL;
        }
        sleep_ms(POLL_MS);
    }
}

/* The named region, at least need bytes long. */
static void *region(shm_segment *seg, const char *name, uint64_t need, uint64_t *size) {
    uint64_t have = 0;
    void *p = shm_region_ptr(seg, name, &have);
    if (!p || have < need) {
        log_error("segment %s: region '%s' %s (%llu bytes, need %llu)", shm_name(seg), name,
                  p ? "is too small" : "is missing", (unsigned long long)have, (unsigned long long)need);
        return NULL;
    }
    if (size) *size = have;
    return p;
}

/* cachemgr writes the control block's magic last, then loads the weights. We
 * claim our row as soon as the block is valid so `pi2 status` shows us waiting. */
static int wait_ctl(coord *c, int64_t deadline) {
    while (__atomic_load_n(&c->ctl->magic, __ATOMIC_ACQUIRE) != STACK_CTL_MAGIC) {
        if (waited_too_long(c, deadline)) {
            if (!*c->stop) log_error("the control block was never initialised by cachemgr");
            return -1;
        }
        sleep_ms(POLL_MS);
    }
    char err[512];
    if (ctl_check(c->ctl, c->opt.model_path, c->m.gguf.size, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    if (!(c->row = ctl_proc_claim(c->ctl, "coordinator", (int32_t)getpid()))) {
        log_error("the control block's process table is full (%d rows)", STACK_MAX_PROCS);
        return -1;
    }
    while (!atomic_load(&c->ctl->weights_ready)) {
        if (waited_too_long(c, deadline)) {
            if (!*c->stop) log_error("weights not ready after %d s (cachemgr still loading?)", c->opt.startup_wait_ms / 1000);
            return -1;
        }
        ctl_proc_beat(c->row, PROC_STARTING);
        sleep_ms(POLL_MS);
    }
    return 0;
}

static void fill_limits(coord *c, uint64_t act_bytes, uint64_t weights_bytes) {
    const model *m = &c->m;
    c->lim = (msg_limits){
        .n_layer = (uint32_t)m->n_layer,
        .n_ff = (uint32_t)m->n_ff,
        .n_head = (uint32_t)m->n_head,
        .n_ctx = (uint32_t)c->params.n_ctx,
        .n_vocab = (uint32_t)m->n_vocab,
        .act_segment_size = act_bytes,
        .weight_segment_size = weights_bytes,
        .kv_segment_size = shm_size(c->kv_seg),
        .model_file_size = m->gguf.size,
        .slot_size = weights_bytes, /* dense mode: weights are addressed by the static layout, never by slot */
    };
}

int coord_attach(coord *c) {
    char err[512];
    if (model_load(&c->m, c->opt.model_path, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    c->model_loaded = true;
    if (!(c->tok = tokenizer_from_gguf(&c->m.gguf, err, sizeof err))) {
        log_error("%s: %s", c->opt.model_path, err);
        return -1;
    }
    if (tokenizer_n_vocab(c->tok) != c->m.n_vocab)
        log_warn("tokenizer has %d tokens, the model %d", tokenizer_n_vocab(c->tok), c->m.n_vocab);
    int64_t deadline = ctl_now_ms() + c->opt.startup_wait_ms;
    if (!(c->ctl_seg = attach_waiting(c, STACK_SEG_CTL, SHM_KIND_CONTROL, deadline)) ||
        !(c->ctl = region(c->ctl_seg, "ctl", sizeof(stack_ctl), NULL)) || wait_ctl(c, deadline))
        return -1;
    c->params = c->ctl->params;
    act_layout_compute(&c->L, &c->m, &c->params);
    uint64_t kv_need = kv_region_bytes(&c->m, c->params.n_ctx), act_bytes, weights_bytes;
    if (!(c->weights_seg = attach_waiting(c, STACK_SEG_WEIGHTS, SHM_KIND_WEIGHTS, deadline)) ||
        !(c->kv_seg = attach_waiting(c, STACK_SEG_KV, SHM_KIND_KV, deadline)) ||
        !(c->act_seg = attach_waiting(c, STACK_SEG_ACT, SHM_KIND_ACTIVATIONS, deadline)))
        return -1;
    void *data = region(c->weights_seg, "data", weights_region_bytes(&c->m), &weights_bytes);
    c->act = region(c->act_seg, "act", c->L.total, &act_bytes);
    if (!data || !c->act || !region(c->kv_seg, "k", kv_need, NULL) || !region(c->kv_seg, "v", kv_need, NULL))
        return -1;
    if (model_rebase(&c->m, data, weights_bytes)) {
        log_error("a tensor of %s lies outside the weights segment", c->opt.model_path);
        return -1;
    }
    fill_limits(c, act_bytes, weights_bytes);
    return 0;
}

void coord_detach(coord *c) {
    if (c->row) ctl_proc_beat(c->row, PROC_DEAD);
    shm_detach(c->act_seg);
    shm_detach(c->kv_seg);
    shm_detach(c->weights_seg);
    shm_detach(c->ctl_seg);
    c->act_seg = c->kv_seg = c->weights_seg = c->ctl_seg = NULL;
    c->ctl = NULL, c->row = NULL, c->act = NULL;
    tokenizer_free(c->tok);
    c->tok = NULL;
    if (c->model_loaded) model_free(&c->m);
    c->model_loaded = false;
}

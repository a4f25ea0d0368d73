#include "stack/stack_attach.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

#define POLL_MS 50

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Attaches /pi2-<runid>-<what>, retrying while it does not exist yet (cachemgr starts first). */
static shm_segment *attach_waiting(const stack_view_spec *spec, const char *what, enum shm_kind kind, int64_t deadline) {
    const char *runid = spec->runid;
    char name[SHM_NAME_MAX];
    if (shm_make_name(name, sizeof name, runid, what)) {
        log_error("run id '%s': %s", runid, shm_last_error());
        return NULL;
    }
    for (;;) {
        shm_segment *seg = shm_attach(name, kind, 0);
        if (seg) return seg;
        if (*spec->stop) return NULL;
        if (clock_ms() > deadline) {
            log_error("segment %s not available after %d s (is cachemgr running for run '%s'?): %s", name,
                      spec->wait_ms / 1000, runid, shm_last_error());
            return NULL;
        }
        sleep_ms(POLL_MS);
    }
}

/* The named region, at least `need` bytes long. */
static void *region(shm_segment *seg, const char *name, uint64_t need, uint64_t *size) {
    uint64_t have = 0;
    void *p = shm_region_ptr(seg, name, &have);
    if (!p) {
        log_error("segment %s has no region '%s'", shm_name(seg), name);
        return NULL;
    }
    if (have < need) {
        log_error("segment %s: region '%s' has %llu bytes, this model and stack need %llu", shm_name(seg), name,
                  (unsigned long long)have, (unsigned long long)need);
        return NULL;
    }
    if (size) *size = have;
    return p;
}

static bool waited_too_long(const stack_view_spec *spec, int64_t deadline) {
    return *spec->stop || clock_ms() > deadline;
}

/* cachemgr writes the control block's magic last; wait for it, then for the weights. */
static int wait_ctl_ready(stack_view *s, const stack_view_spec *spec, int64_t deadline) {
    const stack_ctl *c = s->ctl;
    while (__atomic_load_n(&c->magic, __ATOMIC_ACQUIRE) != STACK_CTL_MAGIC) {
        if (waited_too_long(spec, deadline)) {
            if (!*spec->stop) log_error("the control block was never initialised by cachemgr");
            return -1;
        }
        sleep_ms(POLL_MS);
    }
    char err[512];
    if (ctl_check(c, spec->model_path, s->m.gguf.size, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    if (spec->early_row && !(s->row = ctl_proc_claim(s->ctl, spec->early_row, (int32_t)getpid()))) {
        log_error("the control block's process table is full (%d rows)", STACK_MAX_PROCS);
        return -1;
    }
    while (!atomic_load(&s->ctl->weights_ready)) {
        if (waited_too_long(spec, deadline)) {
            if (!*spec->stop)
                log_error("weights not ready after %d s (cachemgr still loading, or stuck?)", spec->wait_ms / 1000);
            return -1;
        }
        if (s->row) ctl_proc_beat(s->row, PROC_STARTING);
        sleep_ms(POLL_MS);
    }
    return 0;
}

int stack_view_open(stack_view *s, const stack_view_spec *spec) {
    memset(s, 0, sizeof *s);
    const char *model_path = spec->model_path;
    char err[512];
    if (model_load(&s->m, model_path, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    s->model_loaded = true;
    int64_t deadline = clock_ms() + spec->wait_ms;
    if (!(s->ctl_seg = attach_waiting(spec, STACK_SEG_CTL, SHM_KIND_CONTROL, deadline))) goto fail;
    if (!(s->ctl = region(s->ctl_seg, "ctl", sizeof(stack_ctl), NULL))) goto fail;
    if (wait_ctl_ready(s, spec, deadline)) goto fail;

    const stack_params *p = &s->ctl->params;
    act_layout_compute(&s->layout, &s->m, p);
    uint64_t kv_need = kv_region_bytes(&s->m, p->n_ctx);
    if (!(s->weights_seg = attach_waiting(spec, STACK_SEG_WEIGHTS, SHM_KIND_WEIGHTS, deadline)) ||
        !(s->kv_seg = attach_waiting(spec, STACK_SEG_KV, SHM_KIND_KV, deadline)) ||
        !(s->act_seg = attach_waiting(spec, STACK_SEG_ACT, SHM_KIND_ACTIVATIONS, deadline)))
        goto fail;
    if (s->ctl->plan_path[0]) {
        if (offload_open(&s->off, &s->m, model_path, s->ctl->plan_path, spec->neuron_positions, err, sizeof err)) {
            log_error("%s", err);
            goto fail;
        }
        s->budgeted = true;
    }
    void *data = region(s->weights_seg, "data", s->budgeted ? s->off.preload_bytes : weights_region_bytes(&s->m),
                        &s->weights_bytes);
    s->k = region(s->kv_seg, "k", kv_need, &s->kv_bytes);
    s->v = region(s->kv_seg, "v", kv_need, NULL);
    s->act = region(s->act_seg, "act", s->layout.total, &s->act_bytes);
    if (!data || !s->k || !s->v || !s->act) goto fail;
    s->weights = data;
    if (s->budgeted ? offload_rebase(&s->off, &s->m, data, s->weights_bytes)
                    : model_rebase(&s->m, data, s->weights_bytes)) {
        log_error("a tensor of %s lies outside the weights segment", model_path);
        goto fail;
    }
    /* under a budget the page cache counts against it: what opening read of the file (the plan's checks) */
    if (s->budgeted && model_release_file_pages(&s->m, model_path))
        log_warn("%s: cannot drop its pages from the page cache: %s", model_path, strerror(errno));
    return 0;
fail:
    stack_view_close(s);
    return -1;
}

void stack_view_close(stack_view *s) {
    if (s->row) ctl_proc_beat(s->row, PROC_DEAD);
    shm_detach(s->act_seg);
    shm_detach(s->kv_seg);
    shm_detach(s->weights_seg);
    shm_detach(s->ctl_seg);
    offload_close(&s->off);
    if (s->model_loaded) model_free(&s->m);
    memset(s, 0, sizeof *s);
}

kv_layer stack_kv_layer(const stack_view *s, int l) {
    int n_ctx = s->ctl->params.n_ctx, kv_dim = s->m.n_head_kv * s->m.head_dim;
    size_t off = (size_t)l * (size_t)n_ctx * (size_t)kv_dim;
    return (kv_layer){s->k + off, s->v + off, n_ctx, kv_dim};
}

float *stack_act_f32(const stack_view *s, uint64_t offset) { return (float *)(s->act + offset); }

void stack_msg_limits(const stack_view *s, msg_limits *lim) {
    const model *m = &s->m;
    *lim = (msg_limits){
        .n_layer = (uint32_t)m->n_layer,
        .n_ff = (uint32_t)m->n_ff,
        .n_head = (uint32_t)m->n_head,
        .n_ctx = (uint32_t)s->ctl->params.n_ctx,
        .n_vocab = (uint32_t)m->n_vocab,
        .act_segment_size = s->act_bytes,
        .weight_segment_size = s->weights_bytes,
        .kv_segment_size = s->kv_bytes,
        .model_file_size = m->gguf.size,
        .slot_size = s->weights_bytes, /* dense mode addresses weights by the static layout, never by slot */
    };
}

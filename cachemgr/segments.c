/* The four segments of a run: created fresh, or, when a previous cachemgr
 * of the same run left them, re-attached and kept. kv, act and ctl are
 * prefaulted (the token path touches them); weights are only reserved, since
 * the io-worker's reads overwrite every page anyway and prefaulting them
 * costs more than the load. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cachemgr.h"
#include "util/clock.h"
#include "util/log.h"

typedef struct {
    const char *what;
    enum shm_kind kind;
    unsigned create_flags;
    int n;
    struct shm_region_spec regions[6];
} segment_spec;

/* What every segment must hold for this model and these parameters. */
static void segment_specs(const cachemgr *c, const stack_params *p, segment_spec out[SEG_COUNT]) {
    act_layout act;
    act_layout_compute(&act, &c->m, p);
    uint64_t kv = kv_region_bytes(&c->m, p->n_ctx);
    out[SEG_WEIGHTS] = (segment_spec){STACK_SEG_WEIGHTS, SHM_KIND_WEIGHTS, SHM_CREATE_NO_PREFAULT, 1,
                                      {{"data", weights_region_bytes(&c->m), SHM_ALIGN_PAGE, 0}}};
    out[SEG_KV] = (segment_spec){STACK_SEG_KV, SHM_KIND_KV, 0, 2,
                                 {{"k", kv, SHM_ALIGN_PAGE, 0}, {"v", kv, SHM_ALIGN_PAGE, 0}}};
    out[SEG_ACT] = (segment_spec){STACK_SEG_ACT, SHM_KIND_ACTIVATIONS, 0, 1, {{"act", act.total, SHM_ALIGN_PAGE, 0}}};
    out[SEG_CTL] = (segment_spec){STACK_SEG_CTL, SHM_KIND_CONTROL, 0, 1,
                                  {{"ctl", sizeof(stack_ctl), SHM_ALIGN_CACHELINE, 0}}};
    out[SEG_FFN] = (segment_spec){STACK_SEG_FFN, SHM_KIND_SLOTS, 0, 0, {{0}}};
    if (c->budgeted) {
        const offload *o = &c->off;
        out[SEG_WEIGHTS].regions[0].size = o->preload_bytes;
        /* prefaulted: cold slots are filled on the token path, where a first touch costs most */
        out[SEG_FFN] = (segment_spec){STACK_SEG_FFN, SHM_KIND_SLOTS, 0, 4,
                                      {{"hot", offload_hot_region_bytes(o), SHM_ALIGN_PAGE, 0},
                                       {"cold", o->cold_bytes, SHM_ALIGN_PAGE, 0},
                                       {"table", o->table_bytes, SHM_ALIGN_CACHELINE, 0},
                                       {"pins", offload_pin_log_bytes(o, p->n_cpu_workers), SHM_ALIGN_CACHELINE, 0}}};
        if (o->lent_bytes) { /* empty until the npu-worker lends its memory after the first prompt */
            out[SEG_FFN].regions[out[SEG_FFN].n++] = (struct shm_region_spec){"lend", sizeof(offload_lend), SHM_ALIGN_CACHELINE, 0};
            out[SEG_FFN].regions[out[SEG_FFN].n++] =
                (struct shm_region_spec){"lent", o->lent_bytes, SHM_ALIGN_PAGE, SHM_REGION_SPARSE};
        }
    }
    for (int i = 0; i < SEG_COUNT && c->small_pages; i++) out[i].create_flags |= SHM_CREATE_SMALL_PAGES;
}

uint64_t cm_segments_bytes(const cachemgr *c, uint64_t *weights, uint64_t *kv) {
    segment_spec specs[SEG_COUNT];
    segment_specs(c, &c->params, specs);
    uint64_t total = 0;
    for (int i = 0; i < SEG_COUNT; i++)
        for (int r = 0; r < specs[i].n; r++) total += specs[i].regions[r].size;
    *weights = specs[SEG_WEIGHTS].regions[0].size;
    *kv = specs[SEG_KV].regions[0].size + specs[SEG_KV].regions[1].size;
    return total;
}

static int seg_name(const cachemgr *c, const char *what, char *buf, size_t len) {
    if (shm_make_name(buf, len, c->runid, what)) {
        log_error("segment name for run '%s': %s", c->runid, shm_last_error());
        return -1;
    }
    return 0;
}

/* Attaches an existing segment if every region has the expected size. */
static shm_segment *attach_matching(const char *name, const segment_spec *s) {
    shm_segment *seg = shm_attach(name, s->kind, 0);
    if (!seg) {
        log_info("%s: cannot keep it (%s)", name, shm_last_error());
        return NULL;
    }
    for (int i = 0; i < s->n; i++) {
        uint64_t bytes = 0;
        if (!shm_region_ptr(seg, s->regions[i].name, &bytes) || bytes != s->regions[i].size) {
            log_warn("%s: region \"%s\" is missing or has %llu bytes, not %llu; replacing the segment", name,
                     s->regions[i].name, (unsigned long long)bytes, (unsigned long long)s->regions[i].size);
            shm_detach(seg);
            return NULL;
        }
    }
    return seg;
}

/* Whether the segment is on 2 MiB pages (shm.h): decode reads scattered
 * weight rows, and 4 KiB pages make most of them a TLB miss. */
static void log_huge_pages(const char *name, const shm_segment *seg) {
    double seconds;
    int err = shm_huge_pages(seg, &seconds);
    if (!err) log_info("%s: on 2 MiB pages (moved in %.2f s)", name, seconds);
    else if (err == ECANCELED) log_info("%s: on 4 KiB pages (--small-pages)", name);
    else if (shm_size(seg) >= (2u << 20))
        log_warn("%s: %s on 4 KiB pages (MADV_COLLAPSE: %s, %.2f s): scattered reads will be slower", name,
                 err == EINVAL ? "all" : "partly", strerror(err), seconds);
}

static shm_segment *create(const char *name, const segment_spec *s, double *prefault_s, uint64_t *bytes) {
    double t0 = clock_seconds();
    shm_segment *seg = shm_create(name, s->kind, s->regions, s->n, SHM_CREATE_REPLACE | s->create_flags);
    if (!seg) {
        log_error("create %s: %s", name, shm_last_error());
        return NULL;
    }
    log_huge_pages(name, seg);
    if (s->create_flags & SHM_CREATE_NO_PREFAULT) {
        log_info("%s: %.3f GB reserved, not prefaulted, in %.3f s", name, (double)shm_size(seg) / 1e9,
                 clock_seconds() - t0);
        return seg;
    }
    *prefault_s += shm_prefault_seconds(seg);
    *bytes += shm_size(seg);
    return seg;
}

/* The control block left by a previous cachemgr of this run, if it is usable. */
static shm_segment *attach_ctl(const char *name, stack_ctl **ctl) {
    shm_segment *seg = shm_attach(name, SHM_KIND_CONTROL, 0);
    if (!seg) return NULL;
    uint64_t bytes = 0;
    *ctl = shm_region_ptr(seg, "ctl", &bytes);
    if (!*ctl || bytes != sizeof(stack_ctl) || (*ctl)->magic != STACK_CTL_MAGIC) {
        log_warn("%s is incomplete (a crash while it was made?); starting afresh", name);
        shm_detach(seg);
        return NULL;
    }
    return seg;
}

static void log_prefault(int created, uint64_t bytes, double seconds) {
    if (!created) return;
    log_info("created %d segment(s), %.3f GB prefaulted in %.3f s (%.2f GB/s)", created, (double)bytes / 1e9,
             seconds, seconds > 0 ? (double)bytes / 1e9 / seconds : 0.0);
}

int cm_open_segments(cachemgr *c) {
    char names[SEG_COUNT][SHM_NAME_MAX], err[512];
    segment_spec specs[SEG_COUNT];
    const char *whats[SEG_COUNT] = {STACK_SEG_WEIGHTS, STACK_SEG_KV, STACK_SEG_ACT, STACK_SEG_FFN, STACK_SEG_CTL};
    for (int i = 0; i < SEG_COUNT; i++)
        if (seg_name(c, whats[i], names[i], sizeof names[i])) return -1;

    double prefault_s = 0;
    uint64_t prefault_bytes = 0;
    int created = 0;
    stack_ctl *ctl = NULL;
    shm_segment *ctl_seg = attach_ctl(names[SEG_CTL], &ctl);
    if (ctl_seg) {
        if (ctl_check(ctl, c->model_path, c->m.gguf.size, err, sizeof err)) {
            log_error("run '%s' exists and cannot be kept: %s (stop it with `pi2 down` first)", c->runid, err);
            shm_detach(ctl_seg);
            return -1;
        }
        const char *plan = c->budgeted ? c->off.plan_path : "";
        if (strncmp(ctl->plan_path, plan, sizeof ctl->plan_path)) {
            log_error("run '%s' exists with plan '%s', not '%s' (stop it with `pi2 down` first)", c->runid,
                      ctl->plan_path, plan);
            shm_detach(ctl_seg);
            return -1;
        }
        if (memcmp(&ctl->params, &c->params, sizeof c->params))
            log_warn("keeping the run's parameters (n_ctx %d, %d cpu-workers, max prefill %d) over the command line's",
                     ctl->params.n_ctx, ctl->params.n_cpu_workers, ctl->params.max_prefill);
        c->params = ctl->params;
        segment_specs(c, &c->params, specs);
        for (int i = 0; i < SEG_CTL; i++) {
            if (specs[i].n == 0) continue;
            c->seg[i] = attach_matching(names[i], &specs[i]);
            if (c->seg[i]) continue;
            if (!(c->seg[i] = create(names[i], &specs[i], &prefault_s, &prefault_bytes))) goto fail;
            created++;
            if (i == SEG_WEIGHTS || i == SEG_FFN) atomic_store(&ctl->weights_ready, 0);
        }
        log_info("re-attached run '%s' (weights_ready %llu)", c->runid,
                 (unsigned long long)atomic_load(&ctl->weights_ready));
    } else {
        segment_specs(c, &c->params, specs);
        /* The control segment last: its presence tells the others the set is complete. */
        for (int i = 0; i < SEG_COUNT; i++) {
            if (specs[i].n == 0) continue;
            if (!(c->seg[i] = create(names[i], &specs[i], &prefault_s, &prefault_bytes))) goto fail;
            created++;
        }
        ctl_seg = c->seg[SEG_CTL];
        c->seg[SEG_CTL] = NULL;
        ctl = shm_region_ptr(ctl_seg, "ctl", NULL);
        ctl_init(ctl, &c->params, c->model_path, c->m.gguf.size, c->predictor_path,
                 c->budgeted ? c->off.plan_path : NULL);
    }
    c->seg[SEG_CTL] = ctl_seg;
    c->ctl = ctl;
    c->weights = shm_region_ptr(c->seg[SEG_WEIGHTS], "data", &c->weights_bytes);
    log_prefault(created, prefault_bytes, prefault_s);
    return 0;
fail:
    shm_detach(ctl_seg);
    cm_close_segments(c);
    return -1;
}

void cm_close_segments(cachemgr *c) {
    for (int i = 0; i < SEG_COUNT; i++) {
        shm_detach(c->seg[i]);
        c->seg[i] = NULL;
    }
    c->ctl = NULL;
    c->row = NULL;
    c->weights = NULL;
}

void cm_beat(cachemgr *c, enum proc_state st) {
    if (c->row) ctl_proc_beat(c->row, st);
}

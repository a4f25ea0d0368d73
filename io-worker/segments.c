/* The io-worker's view of the stack's segments: the weights segment it reads
 * into, and the control segment where it beats its row. Both are created by
 * cachemgr and may appear after us, or be replaced while we run. */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "io_worker.h"
#include "util/log.h"

#define CTL_RETRY_MS 200

int iow_attach_weights(io_worker *w) {
    char name[SHM_NAME_MAX];
    if (shm_make_name(name, sizeof name, w->runid, STACK_SEG_WEIGHTS)) return -1;
    shm_segment *seg = shm_attach(name, SHM_KIND_WEIGHTS, SHM_ATTACH_NO_POPULATE); /* written once, by our reads */
    if (!seg) {
        log_debug("attach %s: %s", name, shm_last_error());
        return -1;
    }
    uint64_t bytes = 0;
    uint8_t *data = shm_region_ptr(seg, "data", &bytes);
    if (!data || bytes == 0) {
        log_warn("%s has no \"data\" region", name);
        shm_detach(seg);
        return -1;
    }
    shm_detach(w->weights);
    w->weights = seg;
    w->data = data;
    w->data_bytes = bytes;
    log_info("attached %s: %llu bytes of weights, generation %llu", name, (unsigned long long)bytes,
             (unsigned long long)shm_generation(seg));
    return 0;
}

int iow_wait_weights(io_worker *w, int timeout_ms) {
    int64_t deadline = clock_ms() + timeout_ms;
    bool told = false;
    while (!proc_stop) {
        if (iow_attach_weights(w) == 0) return 0;
        if (clock_ms() > deadline) {
            log_error("the weights segment of run '%s' did not appear within %d s (is cachemgr running?): %s",
                      w->runid, timeout_ms / 1000, shm_last_error());
            return -1;
        }
        if (!told) log_info("waiting for cachemgr to create the weights segment of run '%s'", w->runid);
        told = true;
        iow_beat(w);
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    }
    return -1;
}

static void detach_ctl(io_worker *w) {
    shm_detach(w->ctl_seg);
    w->ctl_seg = NULL;
    w->ctl = NULL;
    w->row = NULL;
}

static void attach_ctl(io_worker *w) {
    char name[SHM_NAME_MAX], err[512];
    if (shm_make_name(name, sizeof name, w->runid, STACK_SEG_CTL)) return;
    shm_segment *seg = shm_attach(name, SHM_KIND_CONTROL, 0);
    if (!seg) return;
    uint64_t bytes = 0;
    stack_ctl *ctl = shm_region_ptr(seg, "ctl", &bytes);
    if (!ctl || bytes < sizeof *ctl || ctl->magic != STACK_CTL_MAGIC) {
        shm_detach(seg); /* not initialised yet: try again later */
        return;
    }
    if (ctl_check(ctl, w->model_path, file_reader_file_size(w->reader), err, sizeof err)) {
        log_error("%s: %s", name, err);
        w->fatal = true;
        shm_detach(seg);
        return;
    }
    w->ctl_seg = seg;
    w->ctl = ctl;
    w->row = ctl_proc_claim(ctl, "io-worker", (int32_t)getpid());
    if (!w->row) log_warn("%s: the process table is full; not beating", name);
    else log_info("claimed the io-worker row of %s (start %u)", name, (unsigned)atomic_load(&w->row->starts));
}

void iow_beat(void *arg) {
    io_worker *w = arg;
    if (w->ctl_seg && shm_is_stale(w->ctl_seg)) {
        log_info("the control segment was replaced or removed; re-attaching");
        detach_ctl(w);
    }
    if (!w->ctl_seg) {
        int64_t now = clock_ms();
        if (now < w->next_ctl_try_ms) return;
        w->next_ctl_try_ms = now + CTL_RETRY_MS;
        attach_ctl(w);
    }
    if (w->row) ctl_proc_beat(w->row, w->state);
}

void iow_detach(io_worker *w) {
    if (w->row) ctl_proc_beat(w->row, PROC_DEAD); /* a clean exit: the row is free to be re-claimed */
    detach_ctl(w);
    shm_detach(w->weights);
    w->weights = NULL;
    w->data = NULL;
}

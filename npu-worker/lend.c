#include "lend.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/file_reader.h"

#define IDLE_WAIT_MS 2000           /* a cpu-worker still in a step this long after the flag cleared is stuck */
#define FILL_READ_BYTES (1u << 20) /* large reads: each layer's lent bundles are one range of the bundle file */
#define FILL_DEPTH 8

struct lender {
    stack_view *sv;
    const offload *off;
    char seg_name[SHM_NAME_MAX];
    shm_segment *seg;
    offload_lend *flag;
    uint8_t *lent;
    file_reader *reader;
    io_job *jobs;          /* the fill's reads, destinations set as the region is mapped */
    uint64_t *dest_offset; /* [n_jobs]: each read's place in the region */
    size_t n_jobs;
};

/* The neuron cache segment as it is now: a cachemgr that made it afresh left ours stale. */
static int attach(lender *L) {
    if (L->seg && !shm_is_stale(L->seg)) return 0;
    shm_detach(L->seg);
    L->seg = NULL;
    char err[256];
    if (!(L->seg = shm_attach(L->seg_name, SHM_KIND_SLOTS, SHM_ATTACH_NO_POPULATE)) ||
        offload_lent_regions(L->seg, L->off, &L->flag, &L->lent, err, sizeof err)) {
        log_error("neuron cache segment %s: %s", L->seg_name, L->seg ? err : shm_last_error());
        shm_detach(L->seg);
        L->seg = NULL;
        return -1;
    }
    return 0;
}

/* Each layer's lent range cut into reads of FILL_READ_BYTES. */
static int plan_reads(lender *L) {
    const offload *o = L->off;
    const size_t most = (size_t)(o->lent_bytes / FILL_READ_BYTES) + (size_t)L->sv->m.n_layer; /* a short read a layer */
    if (!(L->jobs = calloc(most, sizeof *L->jobs)) || !(L->dest_offset = calloc(most, sizeof *L->dest_offset)))
        return -1;
    for (int l = 0; l < L->sv->m.n_layer; l++) {
        uint64_t file_offset, bytes;
        offload_lent_range(o, l, &file_offset, &bytes);
        for (uint64_t at = 0; at < bytes; at += FILL_READ_BYTES, L->n_jobs++) {
            const uint64_t len = bytes - at < FILL_READ_BYTES ? bytes - at : FILL_READ_BYTES;
            L->jobs[L->n_jobs] = (io_job){.file_offset = file_offset + at, .length = (uint32_t)len};
            L->dest_offset[L->n_jobs] = o->lent_offset[l] + at;
        }
    }
    return 0;
}

lender *lender_open(stack_view *sv, const char *runid, bool *failed) {
    *failed = false;
    const char *env = getenv("PI2_LEND");
    if (!sv->budgeted || !sv->off.lent_bytes) return NULL;
    if (env && !strcmp(env, "0")) {
        log_info("PI2_LEND=0: the prompt's memory is not lent to decode between prompts");
        return NULL;
    }
    lender *L = calloc(1, sizeof *L);
    char err[512];
    if (!L) goto oom;
    L->sv = sv;
    L->off = &sv->off;
    if (shm_make_name(L->seg_name, sizeof L->seg_name, runid, STACK_SEG_FFN)) {
        log_error("neuron cache segment of run '%s': %s", runid, shm_last_error());
        goto fail;
    }
    if (!(L->reader = file_reader_open(sv->off.bundle_path, FILL_DEPTH, err, sizeof err))) {
        log_error("%s", err);
        goto fail;
    }
    if (plan_reads(L)) goto oom;
    log_info("between prompts the prompt's memory holds %.1f MiB of lent bundles", sv->off.lent_bytes / 1048576.0);
    return L;
oom:
    log_error("out of memory");
fail:
    lender_close(L);
    *failed = true;
    return NULL;
}

void lender_close(lender *L) {
    if (!L) return;
    file_reader_close(L->reader);
    shm_detach(L->seg);
    free(L->jobs);
    free(L->dest_offset);
    free(L);
}

/* Whether a cpu-worker that beats is inside a decode step (its row busy). */
static bool decode_busy(stack_ctl *ctl) {
    const int64_t now = clock_ms();
    for (int i = 0; i < STACK_MAX_PROCS; i++) {
        const proc_row *r = &ctl->procs[i];
        if (!strncmp(r->name, "cpu-worker", 10) && atomic_load(&r->state) == PROC_BUSY &&
            now - atomic_load(&r->heartbeat_ms) < IDLE_WAIT_MS)
            return true;
    }
    return false;
}

int lender_reclaim(lender *L) {
    if (attach(L)) return -1;
    /* A prompt follows the last decode step, but one the coordinator abandoned may still be finishing. A
     * worker marks its row busy before it looks at the flag once a step, and this looks at the rows after
     * clearing it (both sequentially consistent): so a step that saw it set has ended before the punch,
     * whose pages would otherwise come back, zeroed, as that step touched them. */
    atomic_store(&L->flag->ready, 0);
    const int64_t t0 = clock_ms();
    while (decode_busy(L->sv->ctl) && clock_ms() - t0 < IDLE_WAIT_MS) usleep(200);
    if (shm_region_punch(L->seg, "lent")) {
        log_error("cannot take the lent bundles' memory back: %s", shm_last_error());
        return -1;
    }
    return 0;
}

/* Whether every read of the fill got its length and every bundle its checksum; else logs the first fault. */
static bool fill_good(const lender *L) {
    const offload *o = L->off;
    for (size_t i = 0; i < L->n_jobs; i++)
        if (L->jobs[i].result != (int32_t)L->jobs[i].length) {
            log_warn("lent bundles: %s offset %llu: read %d of %u bytes; decode reads them as misses instead",
                     o->bundle_path, (unsigned long long)L->jobs[i].file_offset, L->jobs[i].result, L->jobs[i].length);
            return false;
        }
    for (int l = 0; l < L->sv->m.n_layer; l++) {
        const long b = bundle_check_run(&o->bundles, l, (long)o->plan->hot_bundles[l],
                                        (long)offload_lent_bundles(o, l), L->lent + o->lent_offset[l]);
        if (b >= 0) {
            log_warn("lent bundles: %s layer %d bundle %ld: bad checksum; decode reads it as a miss instead",
                     o->bundle_path, l, b);
            return false;
        }
    }
    return true;
}

void lender_fill(lender *L, void (*beat)(void *), void *ctx) {
    if (attach(L) || atomic_load(&L->flag->ready)) return;
    const uint64_t t0 = clock_us();
    for (size_t i = 0; i < L->n_jobs; i++) L->jobs[i].dest = L->lent + L->dest_offset[i], L->jobs[i].result = 0;
    file_reader_run(L->reader, L->jobs, L->n_jobs, beat, ctx);
    if (!fill_good(L)) {
        shm_region_punch(L->seg, "lent"); /* nothing half-read stays charged */
        return;
    }
    atomic_store(&L->flag->ready, 1); /* after every byte: a worker that sees it set reads whole bundles */
    log_info("lent bundles read back: %.1f MiB in %.1f ms", L->off->lent_bytes / 1048576.0, (clock_us() - t0) / 1e3);
}
